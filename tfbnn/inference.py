"""Monte Carlo prediction and the predictive summary (mean, entropy, aleatoric, epistemic).

:func:`predict` draws T samples of the posterior predictive in one vectorized
computation per batch and summarises them. For classification, with
``p_t = p(y | x, w_t)`` the class probabilities of weight sample ``t`` and
``p_bar = (1 / T) sum_t p_t`` (Depeweg et al. 2018, sec. 3; Trinh et al. 2022,
eq. 26-27), in nats::

    total      H[p_bar]                       = -sum_c p_bar_c log p_bar_c   (predictive entropy)
    aleatoric  E_w H[p(y | x, w)] ~ mean_t H[p_t]                          (expected entropy)
    epistemic  I[y; w | x]        = total - aleatoric                     (mutual information)

For regression, with per-sample means ``mu_t`` and (for a :class:`GaussianHead`)
scales ``sigma_t``, the law of total variance splits the predictive variance::

    var[y] = var_t mu_t  +  mean_t sigma_t^2
             (epistemic)     (aleatoric)

How the T samples are drawn: the batch ``(B, ...)`` is tiled sample-major to
``(T * B, ...)`` and the model runs once inside :func:`tfbnn.utils.weight_samples`,
so every row gets its own independent weight sample (``joint=False``, the default:
exact per-row sampling by local reparameterization for the mean-field Gaussian
layers, no weight-sized draw), or each block of B rows shares one of T weight
samples (``joint=True``: coherent function draws, one batched matmul). Dropout is
independent per row anyway. Tiling without that context, or ``tf.vectorized_map``,
silently gives T identical samples for the weight-sampling layers.

References:
    Depeweg, Hernandez-Lobato, Doshi-Velez, Udluft. Decomposition of Uncertainty in
    Bayesian Deep Learning for Efficient and Risk-sensitive Learning. ICML 2018.
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022 (eq. 26-27).
    Gal, Ghahramani. Dropout as a Bayesian Approximation. ICML 2016 (MC dropout).
"""

import dataclasses
import statistics
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.ensembles import DeepEnsemble
from tfbnn.likelihoods import GaussianHead, gaussian_nll, split_gaussian
from tfbnn.utils import stochastic_layers, weight_samples

__all__ = [
    "predict",
    "AdaptiveSampling",
    "SAMPLING_PER",
    "ClassificationPrediction",
    "RegressionPrediction",
    "summarize_classification",
    "summarize_regression",
    "entropy",
    "GaussianHead",
    "gaussian_nll",
    "TASKS",
]

TASKS = ("auto", "classification", "regression")
_DEFAULT_BATCH_SIZE = 32
# H[mean_t p_t] - mean_t H[p_t] of identical samples is not exactly 0 in float64
# (about 1e-15): below this it is round-off, not disagreement between samples.
_ROUNDOFF_NATS = 1e-9
# Layers that MC dropout keeps on at inference. GaussianNoise is left out on
# purpose: it is an input-noise regularizer, not a dropout posterior.
_DROPOUT_TYPES = (keras.layers.Dropout, keras.layers.GaussianDropout, keras.layers.AlphaDropout)
# Compiled per-batch functions, keyed weakly by model: a cache only (dropping it
# changes nothing but speed), so it holds no reference that keeps a model alive.
_COMPILED = weakref.WeakKeyDictionary()


# -- summaries -----------------------------------------------------------------
def entropy(probs, axis=-1):
    """Shannon entropy in nats, ``-sum_c p_c log p_c`` with ``0 log 0 = 0``.

    Args:
        probs: array ``(..., C)`` of probabilities.
        axis: the class axis.

    Returns:
        float64 array ``(...)``.
    """
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -np.sum(terms, axis=axis)


def _concat(parts, strata=1):
    """Concatenates per-batch predictions (examples on axis 0, samples on axis 1).

    Samples of different lengths (adaptive sampling) are NaN-padded per stratum
    (ensemble member): the samples axis stays member-major.
    """
    first = parts[0]
    values = {}
    for field in dataclasses.fields(first):
        items = [getattr(p, field.name) for p in parts]
        if field.name == "num_samples":
            values[field.name] = max(items)
        elif items[0] is None:
            values[field.name] = None
        elif field.name == "samples":
            values[field.name] = np.concatenate(_pad_samples(items, strata), axis=1)
        else:
            values[field.name] = np.concatenate(items, axis=0)
    return type(first)(**values)


def _pad_samples(items, strata):
    """Per-batch ``(S * T_i, B_i, ...)`` samples NaN-padded to the longest ``T`` in each of ``S`` strata."""
    longest = max(item.shape[0] for item in items) // strata

    def pad(item):
        per = item.reshape(strata, item.shape[0] // strata, *item.shape[1:])
        filler = np.full((strata, longest - per.shape[1], *per.shape[2:]), np.nan, item.dtype)
        return np.concatenate([per, filler], axis=1).reshape(strata * longest, *item.shape[1:])

    return [item if item.shape[0] == longest * strata else pad(item) for item in items]


@dataclasses.dataclass(frozen=True)
class ClassificationPrediction:
    """Monte Carlo predictive summary of a classifier (entropies in nats).

    Attributes:
        mean_probs: ``(B, C)``, ``p_bar = mean_t p_t``, the predictive distribution.
        predictive_entropy: ``(B,)``, total uncertainty ``H[p_bar]``.
        expected_entropy: ``(B,)``, aleatoric uncertainty ``mean_t H[p_t]``.
        mutual_information: ``(B,)``, epistemic uncertainty
            ``H[p_bar] - mean_t H[p_t]`` (Depeweg et al. 2018; Trinh et al. 2022,
            eq. 26-27), >= 0: differences below ``1e-9`` nats are float round-off
            and set to 0, so identical samples (a deterministic model) give exactly 0.
        samples: ``(T, B, C)`` per-sample probabilities, or None when
            ``return_samples=False``. With adaptive sampling (``num_samples="auto"``)
            ``T`` is the most samples any example got and example ``b``'s rows past its
            ``samples_used[b]`` are NaN (see :func:`predict` for the order).
        num_samples: T, the length of the samples axis.
        samples_used: ``(B,)`` int, the samples averaged for each example (all ``T``
            with a fixed ``num_samples``).
        standard_error: ``(B,)``, with adaptive sampling: the Monte Carlo standard
            error of ``mean_probs`` (its largest component) that the stopping rule
            compared with ``tolerance``; None with a fixed ``num_samples``.

    Properties: ``predicted_class`` ``(B,)`` (argmax of ``mean_probs``),
    ``confidence`` ``(B,)`` (max of ``mean_probs``), and the aliases ``total``,
    ``aleatoric``, ``epistemic``. (Leading axes other than one batch axis are kept:
    ``B`` can stand for ``B, L`` for per-token outputs.)
    """

    mean_probs: np.ndarray
    predictive_entropy: np.ndarray
    expected_entropy: np.ndarray
    mutual_information: np.ndarray
    samples: np.ndarray = None
    num_samples: int = 1
    samples_used: np.ndarray = None
    standard_error: np.ndarray = None

    @property
    def predicted_class(self):
        return np.argmax(self.mean_probs, axis=-1)

    @property
    def confidence(self):
        return np.max(self.mean_probs, axis=-1)

    @property
    def total(self):
        return self.predictive_entropy

    @property
    def aleatoric(self):
        return self.expected_entropy

    @property
    def epistemic(self):
        return self.mutual_information


@dataclasses.dataclass(frozen=True)
class RegressionPrediction:
    """Monte Carlo predictive summary of a regressor.

    Attributes:
        mean: ``(B, ..., d)``, the predictive mean ``mean_t mu_t``.
        epistemic_std: ``(B, ..., d)``, ``std_t mu_t`` (population std over samples).
        aleatoric_std: ``(B, ..., d)``, ``sqrt(mean_t sigma_t^2)`` when the model
            ends in a :class:`GaussianHead`, else None.
        samples: ``(T, B, ...)`` the model's outputs per sample (for a Gaussian
            head: means then scales on the last axis), or None. NaN-padded with
            adaptive sampling, as for :class:`ClassificationPrediction`.
        num_samples: T, the length of the samples axis.
        samples_used: ``(B,)`` int, the samples averaged for each example.
        standard_error: ``(B,)`` or None: with adaptive sampling, the Monte Carlo
            standard error of ``mean`` (its largest component).

    Properties: ``total_std = sqrt(epistemic_std^2 + aleatoric_std^2)`` (the
    variance of the mixture of the T predictive distributions); ``variance``.
    """

    mean: np.ndarray
    epistemic_std: np.ndarray
    aleatoric_std: np.ndarray = None
    samples: np.ndarray = None
    num_samples: int = 1
    samples_used: np.ndarray = None
    standard_error: np.ndarray = None

    @property
    def total_std(self):
        if self.aleatoric_std is None:
            return self.epistemic_std
        return np.sqrt(np.square(self.epistemic_std) + np.square(self.aleatoric_std))

    @property
    def variance(self):
        return np.square(self.total_std)

    def interval(self, level=0.95):
        """Central predictive interval ``mean -/+ z total_std``, ``z = Phi^-1((1 + level) / 2)``.

        The predictive is a mixture of T Gaussians (or of T point masses without a
        Gaussian head); the interval is that of the Gaussian with the mixture's
        mean and variance (moment matching), exact for T -> inf only when the
        mixture is itself Gaussian. Skewed or multi-modal predictives get a
        symmetric interval.

        Args:
            level: float in (0, 1), the nominal coverage. Default 0.95.

        Returns:
            ``(lower, upper)``, each shaped like ``mean``.
        """
        level = checks.number("level", level, low=0, high=1, low_open=True, high_open=True)
        z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
        half = z * self.total_std
        return self.mean - half, self.mean + half


def _as_probs(samples, from_logits):
    x = np.asarray(samples, dtype=np.float64)
    if x.shape[-1] == 1:  # one sigmoid unit: p(class 1); expand to two classes
        p = 1.0 / (1.0 + np.exp(-x)) if from_logits else x
        return np.concatenate([1.0 - p, p], axis=-1)
    if from_logits:
        z = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return z / np.sum(z, axis=-1, keepdims=True)
    return x


def summarize_classification(samples, from_logits=False, keep_samples=True):
    """Predictive entropy, expected entropy and mutual information of T samples.

    With ``p_t`` the class probabilities of sample ``t`` and ``p_bar = mean_t p_t``
    (Depeweg et al. 2018; Trinh et al. 2022, eq. 26-27)::

        predictive_entropy = H[p_bar]
        expected_entropy   = (1 / T) sum_t H[p_t]
        mutual_information = predictive_entropy - expected_entropy

    Args:
        samples: array ``(T, B, C)`` of probabilities (or logits with
            ``from_logits=True``). ``C = 1`` is one sigmoid unit, expanded to the
            two classes ``[1 - p, p]``.
        from_logits: bool, apply a softmax (sigmoid for ``C = 1``) per sample first.
        keep_samples: bool, keep the per-sample probabilities in the result.

    Returns:
        A :class:`ClassificationPrediction`.

    Example:
        >>> import numpy as np, tfbnn
        >>> p = np.array([[[0.9, 0.1]], [[0.1, 0.9]]])  # T=2 confident, disagreeing samples
        >>> s = tfbnn.inference.summarize_classification(p)
        >>> round(float(s.mutual_information[0]), 4)  # log 2 - H(0.9, 0.1)
        0.3681
    """
    probs = _as_probs(samples, from_logits)
    if probs.ndim < 3:
        raise ValueError(f"Expected samples of shape (T, B, C). Received: samples.shape={probs.shape}")
    mean_probs = probs.mean(axis=0)
    total = entropy(mean_probs)
    aleatoric = entropy(probs).mean(axis=0)
    gap = total - aleatoric
    epistemic = np.where(gap > _ROUNDOFF_NATS, gap, 0.0)
    return ClassificationPrediction(
        mean_probs=mean_probs.astype(np.float32),
        predictive_entropy=total.astype(np.float32),
        expected_entropy=aleatoric.astype(np.float32),
        mutual_information=epistemic.astype(np.float32),
        samples=probs.astype(np.float32) if keep_samples else None,
        num_samples=probs.shape[0],
        samples_used=np.full(probs.shape[1], probs.shape[0]),
    )


def summarize_regression(samples, gaussian_head=False, keep_samples=True):
    """Predictive mean and the epistemic / aleatoric split of T regression samples.

    ``mean = mean_t mu_t``, ``epistemic_std = std_t mu_t`` and, with a Gaussian
    head, ``aleatoric_std = sqrt(mean_t sigma_t^2)`` (the law of total variance;
    Depeweg et al. 2018, eq. 5 for the variance form).

    Args:
        samples: array ``(T, B, ...)`` of outputs; with ``gaussian_head=True`` the
            last axis holds ``d`` means then ``d`` scales (see
            :class:`GaussianHead`).
        gaussian_head: bool, whether the outputs are a Gaussian head's.
        keep_samples: bool, keep the raw samples in the result.

    Returns:
        A :class:`RegressionPrediction`.

    Example:
        >>> import numpy as np, tfbnn
        >>> s = tfbnn.inference.summarize_regression(np.array([[[1.0, 0.5]], [[3.0, 0.5]]]),
        ...                                          gaussian_head=True)
        >>> s.mean, s.epistemic_std, s.aleatoric_std
        (array([[2.]], dtype=float32), array([[1.]], dtype=float32), array([[0.5]], dtype=float32))
    """
    raw = np.asarray(samples, dtype=np.float64)
    if raw.ndim < 2:
        raise ValueError(f"Expected samples of shape (T, B, ...). Received: samples.shape={raw.shape}")
    aleatoric = None
    means = raw
    if gaussian_head:
        means, scales = (np.asarray(v) for v in split_gaussian(raw))
        aleatoric = np.sqrt(np.mean(np.square(scales), axis=0)).astype(np.float32)
    return RegressionPrediction(
        mean=means.mean(axis=0).astype(np.float32),
        epistemic_std=means.std(axis=0).astype(np.float32),
        aleatoric_std=aleatoric,
        samples=raw.astype(np.float32) if keep_samples else None,
        num_samples=raw.shape[0],
        samples_used=np.full(raw.shape[1], raw.shape[0]),
    )


# -- the vectorized sampler ------------------------------------------------------------
class _AlwaysOnDropout(keras.layers.Layer):
    """Runs a Keras dropout layer's math with ``training=True`` (the MC dropout view).

    It shares the source layer (rate, noise shape and seed generator), so it adds
    no state; it exists only inside the clone :func:`_mc_dropout_view` makes.
    """

    def __init__(self, source):
        super().__init__(name=f"{source.name}_mc", dtype=source.dtype_policy)
        self.source = source

    def call(self, inputs):
        return self.source.call(inputs, training=True)

    def compute_output_shape(self, input_shape):
        return input_shape


def _dropout_layers(model):
    return [l for l in model._flatten_layers(include_self=False, recursive=True) if isinstance(l, _DROPOUT_TYPES)]


def _mc_dropout_view(model):
    """A model sharing every layer of ``model`` but with its dropout layers always on.

    Only the dropout layers change, so BatchNormalization keeps its inference
    statistics and Bayesian layers stay in inference (no KL scale needed), unlike
    calling the model with ``training=True``.
    """
    replaced = []

    def swap(layer):
        if isinstance(layer, _DROPOUT_TYPES):
            replaced.append(layer)
            return _AlwaysOnDropout(layer)
        return layer

    try:
        view = keras.models.clone_model(model, clone_function=swap, recursive=True)
    except ValueError as e:
        raise ValueError(
            "`mc_dropout=True` rebuilds the model with its dropout layers kept on, which needs a "
            "Sequential or functional model (a subclassed model cannot be rebuilt). Build the model "
            "functionally, or use a dropout layer that stays on at inference. "
            f"Received: model of type {type(model).__name__}"
        ) from e
    missing = [l.name for l in _dropout_layers(model) if not any(l is r for r in replaced)]
    if missing:
        raise ValueError(
            "`mc_dropout=True` could not reach the dropout layers inside a subclassed layer or "
            f"model: {missing}. Received: model={model.name!r}"
        )
    return view


def _tile(x, num_samples):
    return tf.tile(x, tf.concat([[num_samples], tf.ones([tf.rank(x) - 1], tf.int32)], axis=0))


def _signature(batch):
    """Input specs with an unknown batch axis: one trace serves every batch size."""
    return tf.nest.map_structure(lambda v: tf.TensorSpec([None] + v.shape[1:].as_list(), v.dtype), batch)


def _compiled_sampler(model, num_samples, joint, mc_dropout, signature):
    """The per-batch ``tf.function`` ``x (B, ...) -> outputs (T, B, ...)``, cached.

    The key holds everything read when tracing: T and ``joint`` (read by the layers
    through :func:`weight_samples`), the dropout switch, the layers' inference
    modes and the input specs. It is only ever called inside that context.
    """
    entry = _COMPILED.setdefault(model, {})
    modes = tuple(layer.inference_mode for layer in stochastic_layers(model))  # MC dropout's too
    specs = tuple((tuple(s.shape.as_list()), s.dtype.name) for s in tf.nest.flatten(signature))
    key = (num_samples, bool(joint), bool(mc_dropout), modes, repr(tf.nest.map_structure(lambda _: None, signature)), specs)
    if key in entry:
        return entry[key]
    if mc_dropout:
        if "mc_view" not in entry:
            entry["mc_view"] = _mc_dropout_view(model)
        target = weakref.ref(entry["mc_view"])
    else:
        target = weakref.ref(model)

    @tf.function(input_signature=[signature])
    def sample(x):
        tiled = tf.nest.map_structure(lambda v: _tile(v, num_samples), x)
        net = target()
        if isinstance(net, DeepEnsemble):  # (M, T * B, ...) -> (M * T, B, ...), member-major
            outputs = net.call_members(tiled, training=False)
            return tf.reshape(outputs, tf.concat([[net.num_members * num_samples, -1], tf.shape(outputs)[2:]], 0))
        outputs = net(tiled, training=False)
        if not isinstance(outputs, tf.Tensor):
            raise ValueError(
                "`tfbnn.inference.predict` needs a model with one output tensor. "
                f"Received: outputs of type {type(outputs).__name__}"
            )
        return tf.reshape(outputs, tf.concat([[num_samples, -1], tf.shape(outputs)[1:]], axis=0))

    entry[key] = sample
    return sample


# -- inputs ------------------------------------------------------------------------
def _to_tensor(v):
    if isinstance(v, tf.Tensor):
        return v
    try:
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.floating):
            v = v.astype(keras.config.floatx())
        return tf.convert_to_tensor(v)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"Expected `x` to be arrays or tensors ({e}). Received: x with a value of type {type(v).__name__}"
        ) from None


def _check_input_shapes(model, batch):
    """``x`` against the model's declared inputs (Sequential / functional): a clear error
    here instead of one from inside the traced Monte Carlo function."""
    try:
        inputs = _reference_model(model).inputs
    except (AttributeError, ValueError):  # a subclassed model declares none
        return
    leaves = tf.nest.flatten(batch)
    if not inputs or len(inputs) > 1:  # several inputs: Keras matches them by name or order
        return
    expected = tf.TensorShape(inputs[0].shape)
    if len(leaves) != 1 or not leaves[0].shape[1:].is_compatible_with(expected[1:]):
        raise ValueError(
            f"Expected `x` shaped like the model's input {tuple(expected)}. "
            f"Received: x with shapes {[tuple(v.shape) for v in leaves]}"
        )


def _batches(x, batch_size):
    if isinstance(x, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError(
                "A tf.data.Dataset is already batched: do not pass `batch_size`. "
                f"Received: batch_size={batch_size}"
            )
        for element in x:
            yield element[0] if isinstance(element, tuple) else element
        return
    x = tf.nest.map_structure(_to_tensor, x)
    leaves = tf.nest.flatten(x)
    if not leaves or any(v.shape.rank == 0 for v in leaves):
        raise ValueError(f"Expected inputs with a batch axis. Received: x of shape {getattr(x, 'shape', None)}")
    num = int(leaves[0].shape[0])
    if num == 0:
        raise ValueError("Expected at least one example. Received: x with 0 examples")
    if any(int(v.shape[0]) != num for v in leaves):
        raise ValueError(
            f"Expected every input in `x` to have the same number of examples. Received: x with shapes "
            f"{[tuple(v.shape) for v in leaves]}"
        )
    size = batch_size or _DEFAULT_BATCH_SIZE
    for start in range(0, num, size):
        yield tf.nest.map_structure(lambda v, s=start: v[s : s + size], x)


# -- task resolution -------------------------------------------------------------------
def _reference_model(model):
    """The model whose inputs and output layer describe ``model`` (an ensemble's first member)."""
    return model.members[0] if isinstance(model, DeepEnsemble) else model


def _output_layer(model):
    model = _reference_model(model)
    outputs = getattr(model, "outputs", None)
    if not outputs:
        return None
    layer = outputs[0]._keras_history.operation
    if isinstance(layer, keras.Model) and layer is not model:
        return _output_layer(layer) or layer
    return layer


def _ends_in_softmax(layer):
    if isinstance(layer, keras.layers.Softmax):
        return True
    activation = getattr(layer, "activation", None)
    return activation is not None and getattr(activation, "__name__", None) == "softmax"


def _looks_like_probabilities(samples):
    if samples.ndim < 3 or samples.shape[-1] < 2:
        return False
    return bool(np.all(samples >= -1e-6) and np.allclose(samples.sum(axis=-1), 1.0, atol=1e-3))


def _task_from_model(task, model, from_logits, gaussian_head):
    """The task ``"auto"`` stands for, read from the model; None if it cannot tell."""
    if task != "auto":
        return task
    if gaussian_head:
        return "regression"
    if from_logits:
        return "classification"
    layer = _output_layer(model)
    if layer is None:  # a subclassed model: no output layer to read
        return None
    return "classification" if _ends_in_softmax(layer) else "regression"


def _task_from_outputs(samples):
    """Last resort for a model without a readable output layer (a subclassed model)."""
    return "classification" if _looks_like_probabilities(samples) else "regression"


def _check_finite(batch, offset):
    """Rejects NaN / infinite inputs: they would give NaN summaries."""
    for v in tf.nest.flatten(batch):
        if v.dtype.is_floating and not bool(tf.reduce_all(tf.math.is_finite(v))):
            flat = tf.reshape(tf.math.is_finite(v), [tf.shape(v)[0], -1])
            rows = (np.flatnonzero(~tf.reduce_all(flat, axis=1).numpy()) + offset).tolist()
            raise ValueError(
                "Expected finite inputs (NaN or infinite values give NaN predictions). "
                f"Received: x with NaN or infinite values in rows {rows[:10]}{' ...' if len(rows) > 10 else ''}"
            )


def _check_args(model, batch_size, task, from_logits, gaussian_head):
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(f"Expected a Keras model. Received: model={type(model).__name__}")
    batch_size = checks.integer("batch_size", batch_size, 1, allow_none=True)
    if task not in TASKS:
        raise ValueError(f"Expected `task` in {TASKS}. Received: task={task!r}")
    if from_logits and (task == "regression" or gaussian_head):
        raise ValueError(
            "`from_logits=True` applies a softmax: it is for classification, not regression. "
            f"Received: task={task!r}, from_logits=True, gaussian_head={gaussian_head}"
        )
    if gaussian_head and task == "classification":
        raise ValueError(
            "A Gaussian head is a regression likelihood. Received: task='classification', gaussian_head=True"
        )
    return batch_size


def _check_dropout(model, mc_dropout):
    dropouts = _dropout_layers(model)
    if mc_dropout and not dropouts:
        raise ValueError(
            "`mc_dropout=True` but the model has no Keras dropout layer "
            f"({', '.join(t.__name__ for t in _DROPOUT_TYPES)}). Received: model={model.name!r}"
        )
    # Any stochastic layer that samples (Bayesian, MC dropout, iBNN node noise) makes the samples differ.
    sampling = any(layer.inference_mode == "sample" for layer in stochastic_layers(model))
    if dropouts and not mc_dropout and not sampling:
        warnings.warn(
            f"Model {model.name!r} has dropout layers, which Keras turns off at inference, and no "
            "stochastic layer that samples: all Monte Carlo samples will be identical. Pass "
            "`mc_dropout=True` for MC dropout."
        )


# -- adaptive sampling ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AdaptiveSampling:
    """The stopping rule of ``tfbnn.predict(..., num_samples="auto")`` (see :func:`predict`).

    Attributes:
        tolerance: float > 0, the largest Monte Carlo standard error allowed on any
            component of the predictive mean (a probability for classification, an
            output value for regression).
        max_samples: int, the most samples per example (per member of an ensemble).
        min_samples: int >= 2, the fewest (a sample variance needs two).
        chunk_size: int >= 1, the smallest chunk of samples per vectorized call.
        per: ``"example"`` (stop each example when it meets the rule) or ``"batch"``
            (sample a batch until all its examples meet it).
    """

    tolerance: float = 1e-2
    max_samples: int = 1000
    min_samples: int = 16
    chunk_size: int = 16
    per: str = "example"


SAMPLING_PER = ("example", "batch")


def _check_sampling(num_samples, tolerance, max_samples, min_samples, chunk_size, per):
    """``(T, None)`` for a fixed number of samples, ``(None, AdaptiveSampling)`` for ``"auto"``."""
    if not (isinstance(num_samples, str) and num_samples == "auto"):
        if isinstance(num_samples, str):
            raise ValueError(f"Expected `num_samples` to be a positive integer or 'auto'. "
                             f"Received: num_samples={num_samples!r}")
        given = {k: v for k, v in (("tolerance", tolerance), ("max_samples", max_samples),
                                   ("min_samples", min_samples), ("chunk_size", chunk_size), ("per", per))
                 if v is not None}
        if given:
            name, value = next(iter(given.items()))
            raise ValueError(f"`{name}` applies to num_samples='auto' (adaptive sampling). "
                             f"Received: num_samples={num_samples!r}, {name}={value!r}")
        return checks.integer("num_samples", num_samples, 1), None
    default = AdaptiveSampling()
    tolerance = checks.number("tolerance", default.tolerance if tolerance is None else tolerance, low=0,
                              low_open=True)
    chunk_size = checks.integer("chunk_size", default.chunk_size if chunk_size is None else chunk_size, 1)
    if min_samples is None:
        min_samples = max(chunk_size, 2)
    min_samples = checks.integer("min_samples", min_samples, 2, what="an integer >= 2 (a variance needs two samples)")
    if max_samples is None:
        max_samples = max(default.max_samples, min_samples)
    max_samples = checks.integer("max_samples", max_samples, min_samples,
                                 what=f"an integer >= min_samples={min_samples}")
    per = "example" if per is None else per
    if per not in SAMPLING_PER:
        raise ValueError(f"Expected `per` in {SAMPLING_PER}. Received: per={per!r}")
    return None, AdaptiveSampling(tolerance, max_samples, min_samples, chunk_size, per)


def _expand(values, ndim):
    """``(B,)`` values broadcastable against ``(B, ...)`` arrays of ``ndim`` axes."""
    return values.reshape(values.shape + (1,) * (ndim - 1))


class _RunningMoments:
    """Per-stratum running means and sums of squared deviations of ``(B, ...)`` samples, float64.

    Chunks merge by the pairwise update of Chan, Golub and LeVeque (1979): with
    ``delta = mean_b - mean_a`` and ``n = n_a + n_b``, ``mean = mean_a + delta n_b / n`` and
    ``M2 = M2_a + M2_b + delta^2 n_a n_b / n`` (no cancellation, unlike sums of squares).
    """

    def __init__(self, strata, shape):
        self.count = np.zeros(shape[0], np.int64)
        self.mean = np.zeros((strata, *shape))
        self.m2 = np.zeros((strata, *shape))

    def add(self, rows, chunk):
        """Adds ``chunk`` ``(S, k, b, ...)``, the samples of the examples ``rows`` ``(b,)``."""
        k = chunk.shape[1]
        n_a = self.count[rows].astype(np.float64)
        n = n_a + k
        mean_b = chunk.mean(axis=1)
        m2_b = np.square(chunk - mean_b[:, None]).sum(axis=1)
        delta = mean_b - self.mean[:, rows]
        self.mean[:, rows] += delta * _expand(k / n, mean_b.ndim - 1)
        self.m2[:, rows] += m2_b + np.square(delta) * _expand(n_a * k / n, mean_b.ndim - 1)
        self.count[rows] += k

    def standard_error(self, rows, floor=0.0):
        """``(b,)``: the largest component of ``sqrt((sum_s var_s / S + floor / n) / (S n))``, the
        standard error of the equally weighted mean of the S strata means, each sample variance
        raised by ``floor / n`` (Chow and Robbins 1965; inf below 2 samples)."""
        n = self.count[rows].astype(np.float64)
        strata = self.mean.shape[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            variance = self.m2[:, rows] / _expand(n - 1, self.m2.ndim - 1)
            se2 = (variance.sum(axis=0) / strata + _expand(floor / n, self.m2.ndim - 1)) / _expand(
                strata * n, self.m2.ndim - 1)
        se = np.sqrt(np.max(se2.reshape(len(rows), -1), axis=1))
        return np.where(n >= 2, se, np.inf)

    def pooled(self):
        """The mean over all strata and the population variance of all ``S * n`` samples."""
        grand = self.mean.mean(axis=0)
        n = _expand(self.count.astype(np.float64), self.m2.ndim - 1)
        within = (self.m2 / n).mean(axis=0)
        between = np.square(self.mean - grand).mean(axis=0)
        return grand, within + between


def _split_strata(samples, strata):
    return samples.reshape(strata, samples.shape[0] // strata, *samples.shape[1:])


class _AdaptiveBatch:
    """The running summary of one batch under adaptive sampling (classification or regression)."""

    def __init__(self, task, strata, batch_size, from_logits, gaussian_head, keep_samples):
        self.task, self.strata, self.size = task, strata, batch_size
        self.from_logits, self.gaussian_head, self.keep = from_logits, gaussian_head, keep_samples
        self.moments = None
        self.extra = None  # classification: summed sample entropies; Gaussian head: summed variances
        # Probabilities lie in [0, 1]: a variance floor 1 / n keeps a run of identical samples (a rare class
        # not drawn yet) from stopping early. Regression outputs have no known range: no floor.
        self.variance_floor = 1.0 if task == "classification" else 0.0
        self.chunks = []

    def add(self, rows, samples):
        """``samples`` ``(S * k, b, ...)`` of the examples ``rows``."""
        if self.task == "classification":
            values = _as_probs(samples, self.from_logits)
            extra = entropy(values)
        else:
            values = np.asarray(samples, dtype=np.float64)
            extra = None
            if self.gaussian_head:
                means, scales = (np.asarray(v, dtype=np.float64) for v in split_gaussian(values))
                values, extra = means, np.square(scales)
        chunk = _split_strata(values, self.strata)
        if self.moments is None:
            self.moments = _RunningMoments(self.strata, (self.size, *chunk.shape[3:]))
        if extra is not None:
            total = _split_strata(extra, self.strata).sum(axis=(0, 1))
            if self.extra is None:
                self.extra = np.zeros((self.size, *total.shape[1:]))
            self.extra[rows] += total
        if self.keep:
            kept = _split_strata(np.asarray(samples if self.task == "regression" else values), self.strata)
            self.chunks.append((rows, self.moments.count[rows[0]], kept))
        self.moments.add(rows, chunk)

    def _samples(self):
        """The kept samples, ``(S * T_max, B, ...)`` member-major, NaN where an example stopped."""
        longest = int(self.moments.count.max())
        trailing = self.chunks[0][2].shape[3:]
        out = np.full((self.strata, longest, self.size, *trailing), np.nan, np.float32)
        for rows, start, chunk in self.chunks:
            out[:, start:start + chunk.shape[1], rows] = chunk
        return out.reshape(self.strata * longest, self.size, *trailing)

    def result(self):
        m = self.moments
        used = m.count * self.strata
        common = {
            "samples": self._samples() if self.keep else None,
            "num_samples": int(used.max()),
            "samples_used": used,
            "standard_error": m.standard_error(np.arange(self.size), self.variance_floor).astype(np.float32),
        }
        if self.task == "classification":
            mean_probs, _ = m.pooled()
            total = entropy(mean_probs)
            aleatoric = self.extra / _expand(used.astype(np.float64), self.extra.ndim)
            gap = total - aleatoric
            epistemic = np.where(gap > _ROUNDOFF_NATS, gap, 0.0)  # as summarize_classification
            return ClassificationPrediction(
                mean_probs=mean_probs.astype(np.float32), predictive_entropy=total.astype(np.float32),
                expected_entropy=aleatoric.astype(np.float32), mutual_information=epistemic.astype(np.float32),
                **common)
        mean, variance = m.pooled()
        aleatoric = None
        if self.gaussian_head:
            aleatoric = np.sqrt(self.extra / _expand(used.astype(np.float64), self.extra.ndim)).astype(np.float32)
        return RegressionPrediction(mean=mean.astype(np.float32), epistemic_std=np.sqrt(variance).astype(np.float32),
                                    aleatoric_std=aleatoric, **common)


def _next_chunk(rule, done, errors):
    """Samples per example of the next call: enough for the median active example to meet the
    rule if its variance estimate holds (``se^2`` falls as ``1 / n``; Stein's two-stage idea,
    iterated), at least ``chunk_size``, at most doubling ``n``, as ``chunk_size * 2^j`` (few traces)."""
    if done == 0:
        return min(max(rule.chunk_size, rule.min_samples), rule.max_samples)
    needed = done * np.square(np.median(errors) / rule.tolerance) - done
    wanted = int(np.clip(needed, rule.chunk_size, max(rule.chunk_size, done)))
    k = rule.chunk_size * 2 ** int(np.ceil(np.log2(wanted / rule.chunk_size)))
    return int(min(k, rule.max_samples - done))


def _sample_adaptively(draw, batch, rule, resolve, make_batch):
    """Draws chunks for the examples of ``batch`` that have not met ``rule``; returns the summary.

    ``draw(sub_batch, k)`` returns ``(S * k, b, ...)`` samples; ``resolve(samples)`` the
    task (called once); ``make_batch(task)`` an empty :class:`_AdaptiveBatch`.
    """
    size = int(tf.nest.flatten(batch)[0].shape[0])
    active, errors, summary = np.arange(size), None, None
    while active.size:
        done = 0 if summary is None else int(summary.moments.count[active[0]])
        sub = batch if active.size == size else tf.nest.map_structure(lambda v: tf.gather(v, active), batch)
        samples = draw(sub, _next_chunk(rule, done, errors))
        if summary is None:
            summary = make_batch(resolve(samples))
        summary.add(active, samples)
        count = summary.moments.count[active]
        errors = summary.moments.standard_error(active, summary.variance_floor)
        converged = (count >= rule.min_samples) & (errors <= rule.tolerance)
        if rule.per == "batch":
            converged = np.full(active.shape, bool(converged.all()))
        keep = ~converged & (count < rule.max_samples)
        active, errors = active[keep], errors[keep]
    return summary.result()


def predict(
    model,
    x,
    num_samples=100,
    batch_size=None,
    return_samples=False,
    task="auto",
    from_logits=False,
    gaussian_head=None,
    mc_dropout=False,
    joint=False,
    tolerance=None,
    max_samples=None,
    min_samples=None,
    chunk_size=None,
    per=None,
):
    """Monte Carlo prediction: T posterior predictive samples per example, summarised.

    Each batch ``(B, ...)`` is tiled sample-major to ``(T * B, ...)`` and run once,
    inside :func:`tfbnn.utils.weight_samples`, through a ``tf.function`` cached per
    model, T and inference modes (``training=False``; the Bayesian layers keep
    their inference modes, so a model in ``"mean"`` mode gives T identical samples
    and zero mutual information). Classification returns
    ``predictive_entropy = H[mean_t p_t]`` (total), ``expected_entropy =
    mean_t H[p_t]`` (aleatoric) and ``mutual_information`` (epistemic, their
    difference; Depeweg et al. 2018, Trinh et al. 2022 eq. 26-27). Regression
    returns the mean, ``epistemic_std = std_t mu_t`` and, for a model ending in a
    :class:`GaussianHead`, ``aleatoric_std = sqrt(mean_t sigma_t^2)``.

    **Deep ensembles.** For a :class:`tfbnn.DeepEnsemble` of M members the members
    are posterior samples: every member is run with T samples in the same vectorized
    call, ``M * T`` samples in all, member-major (``samples[m * T + t]``), each member
    weighted ``1 / M``. ``num_samples`` (and ``chunk_size``, ``min_samples``,
    ``max_samples``) count samples *per member*; the result's ``num_samples`` and
    ``samples_used`` count all ``M * T``. An ensemble without stochastic layers (the
    usual deep ensemble of deterministic networks) is run with ``T = 1``: its
    predictive is exact with M samples, whatever ``num_samples`` says.

    **Adaptive sampling** (``num_samples="auto"``). Samples are added in vectorized chunks
    until the Monte Carlo standard error of the predictive mean is at most ``tolerance``.
    With ``n`` samples per member, ``S`` members (1 for an ordinary model) and
    ``s_{m,c}^2`` the sample variance (``n - 1`` in the denominator) of component ``c``
    of member ``m``'s outputs (class probabilities, or regression means), the estimate
    ``p_bar_c = (1/S) sum_m mean_t p_{m,t,c}`` has the standard error (stratified
    sampling, members as strata)::

        se_c = sqrt( (sum_m s_{m,c}^2 / S  +  f / n) / (S n) )

    with ``f = 1`` for class probabilities and ``f = 0`` for regression. For ``S = 1``
    and ``f = 0`` it is the usual ``s_c / sqrt(n)``. The ``f / n`` term is Chow and
    Robbins' (1965) ``s_n^2 + 1/n`` in their fixed-width sequential rule: a probability
    whose samples so far are all equal (a class that a few percent of the posterior
    favours, not drawn yet) has ``s = 0``, and stopping then would miss it; the term
    asks for at least ``1 / tolerance`` samples before such an example stops, so a class
    with probability ``q`` is drawn with probability ``1 - exp(-q / tolerance)``. An
    example stops at the end of the first chunk with ``n >= min_samples`` and ``max_c
    se_c <= tolerance``, or at ``max_samples``; by the central limit theorem every
    component of the returned predictive mean is then within ``1.96 * tolerance`` with
    probability about 95% (asymptotically, as ``tolerance -> 0``). The variance between
    members is not Monte Carlo error (the members are fixed) and does not count. Chunk
    sizes follow Stein's two-stage idea, iterated: after each chunk the number of
    samples the median unfinished example still needs, ``n (se / tolerance)^2 - n``, as
    ``chunk_size * 2^j``, at least ``chunk_size`` and at most doubling ``n`` (few calls,
    few traces). ``per="example"`` (default) stops sampling each example when it meets
    the rule, so confident inputs use few samples and ambiguous ones many;
    ``per="batch"`` samples a whole batch until all its examples meet it. The result's
    ``samples_used`` ``(N,)`` and ``standard_error`` ``(N,)`` report each example's
    count and final ``max_c se_c``; the summaries are computed from running moments (no
    ``(T, N, C)`` array is kept unless ``return_samples``). A model without stochastic
    layers has no Monte Carlo error: it is run once with ``min_samples`` (a deep
    ensemble of such models with one sample per member) and reports
    ``standard_error = 0``.

    Args:
        model: a Keras model with one output, or a :class:`tfbnn.DeepEnsemble`.
        x: inputs: an array or tensor ``(N, ...)``, a list/dict of them (multi-input
            models), or a batched ``tf.data.Dataset`` yielding ``x`` or
            ``(x, y, ...)``. Floating-point inputs must be finite (NaN or
            infinite values raise a ValueError naming the rows).
        num_samples: int >= 1, T, or ``"auto"`` (adaptive, above). Default 100.
            Memory grows as ``T * batch_size`` (``chunk_size * batch_size`` for "auto").
        batch_size: int or None, examples per vectorized call (default 32; must be
            None for a dataset).
        return_samples: bool, keep the ``(T, N, ...)`` samples in the result (NaN-padded
            past each example's ``samples_used`` with ``"auto"``).
        task: ``"auto"`` (default), ``"classification"`` or ``"regression"``.
            ``"auto"`` reads the model, not the data: classification when
            ``from_logits=True`` or when the output layer ends in a softmax
            (a ``softmax`` activation or a ``keras.layers.Softmax``), regression
            for a Gaussian head or any other output layer. Only a model without a
            readable output layer (a subclassed model) falls back to its first
            batch's outputs (probability vectors: classification). A single
            sigmoid unit needs ``task="classification"`` (it is expanded to two
            classes).
        from_logits: bool, the outputs are logits: a softmax (sigmoid for one
            unit) is applied per sample before averaging.
        gaussian_head: bool or None. Whether the outputs are ``(mean, scale)`` of a
            :class:`GaussianHead`; None detects a ``GaussianHead`` output layer of a
            Sequential or functional model.
        mc_dropout: bool. MC dropout (Gal & Ghahramani 2016): keep the Keras
            ``Dropout`` / ``GaussianDropout`` / ``AlphaDropout`` layers on. The model
            is run through a cached view sharing all its layers with only those
            dropout layers switched on, so ``BatchNormalization`` keeps its moving
            statistics (calling the model with ``training=True`` would not, and
            would make Bayesian layers demand a KL scale). Needs a Sequential or
            functional model; dropout masks come from each dropout layer's seed
            generator.
        joint: bool. False (default): every example gets its own independent
            weight sample (per-example summaries need no more, and it is the
            cheapest). True: the examples of a batch share each of the T weight
            samples, so ``samples[t]`` is one function draw over the batch (see
            :func:`tfbnn.utils.weight_samples`). The summaries have the same
            distribution either way.
        tolerance: float > 0, ``"auto"`` only: the target standard error. Default 0.01.
        max_samples: int >= min_samples, ``"auto"`` only: the most samples. Default 1000.
        min_samples: int >= 2, ``"auto"`` only: the fewest samples. Default ``chunk_size``.
        chunk_size: int >= 1, ``"auto"`` only: the smallest chunk (samples per example and
            vectorized call). Default 16.
        per: ``"example"`` (default) or ``"batch"``, ``"auto"`` only: see above.

    Returns:
        A :class:`ClassificationPrediction` (``mean_probs (N, C)``, entropies
        ``(N,)``, ``samples (T, N, C)``, ``samples_used (N,)``) or a
        :class:`RegressionPrediction` (``mean (N, ...)``, stds, ``interval(level)``).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((4,)),
        ...     tfbnn.layers.DenseFlipout(16, activation="relu", seed=1),
        ...     tfbnn.layers.DenseFlipout(3, activation="softmax", seed=2),
        ... ])
        >>> x = np.random.default_rng(0).random((10, 4)).astype("float32")
        >>> res = tfbnn.predict(model, x, num_samples=50)
        >>> res.mean_probs.shape, res.mutual_information.shape
        ((10, 3), (10,))
        >>> auto = tfbnn.predict(model, x, num_samples="auto", tolerance=0.01, max_samples=400)
        >>> bool(np.all((auto.standard_error <= 0.01) | (auto.samples_used == 400)))
        True

    References:
        Chow, Robbins. On the Asymptotic Theory of Fixed-Width Sequential Confidence
        Intervals for the Mean. Ann. Math. Statist. 36, 1965.
        Stein. A Two-Sample Test for a Linear Hypothesis Whose Power is Independent
        of the Variance. Ann. Math. Statist. 16, 1945.
        Chan, Golub, LeVeque. Updating Formulae and a Pairwise Algorithm for
        Computing Sample Variances. Stanford CS report STAN-CS-79-773, 1979.
    """
    batch_size = _check_args(model, batch_size, task, from_logits, gaussian_head)
    num_samples, rule = _check_sampling(num_samples, tolerance, max_samples, min_samples, chunk_size, per)
    adaptive = rule is not None
    if gaussian_head is None:
        gaussian_head = isinstance(_output_layer(model), GaussianHead)
    _check_dropout(model, mc_dropout)
    batches = iter(_batches(x, batch_size))
    first = next(batches, None)
    if first is None:
        raise ValueError("Expected at least one batch of inputs. Received: an empty dataset")
    _check_input_shapes(model, first)
    if not model.built:  # build outside the tf.function, with one sample per row
        _check_finite(first, 0)
        model(first, training=False)
    strata = model.num_members if isinstance(model, DeepEnsemble) else 1
    exact = not stochastic_layers(model) and not mc_dropout
    if exact and (strata > 1 or adaptive):  # no noise: one sample per member is the exact predictive
        num_samples, rule = (1 if strata > 1 else rule.min_samples), None
    signature = _signature(first)
    resolved = _task_from_model(task, model, from_logits, gaussian_head)

    def resolve(samples):
        nonlocal resolved
        if resolved is None:
            resolved = _task_from_outputs(samples)
        if gaussian_head and samples.shape[-1] % 2:
            raise ValueError(
                "Expected an even last output dimension (means, then scales) with `gaussian_head`. "
                f"Received: gaussian_head={gaussian_head!r}, outputs of shape {samples.shape[1:]}"
            )
        return resolved

    parts, seen = [], 0
    if rule is not None:
        def draw(batch, k):
            with weight_samples(model, k, joint=joint):
                return _compiled_sampler(model, k, joint, mc_dropout, signature)(batch).numpy()

        def make_batch(size):
            return lambda task_: _AdaptiveBatch(task_, strata, size, from_logits, gaussian_head, return_samples)

        for batch in _chain(first, batches):
            _check_finite(batch, seen)
            size = int(tf.nest.flatten(batch)[0].shape[0])
            seen += size
            parts.append(_sample_adaptively(draw, batch, rule, resolve, make_batch(size)))
        return _concat(parts, strata)
    sampler = _compiled_sampler(model, num_samples, joint, mc_dropout, signature)
    with weight_samples(model, num_samples, joint=joint):
        for batch in _chain(first, batches):
            _check_finite(batch, seen)
            seen += int(tf.nest.flatten(batch)[0].shape[0])
            samples = sampler(batch).numpy()
            if resolve(samples) == "classification":
                parts.append(summarize_classification(samples, from_logits, keep_samples=return_samples))
            else:
                parts.append(summarize_regression(samples, gaussian_head, keep_samples=return_samples))
    result = _concat(parts, strata)
    if exact and adaptive:  # no Monte Carlo error to report
        result = dataclasses.replace(result, standard_error=np.zeros(len(result.samples_used), np.float32))
    return result


def _chain(first, rest):
    yield first
    yield from rest
