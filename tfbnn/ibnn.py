"""Implicit Bayesian neural networks (iBNN): training, prediction and the pretrained start.

The layers are :class:`tfbnn.layers.NodeDense`, :class:`tfbnn.layers.NodeConv2D` and
:class:`tfbnn.layers.NodeNoise` (see :mod:`tfbnn.layers.node` for the model: deterministic
weights, per-node multiplicative noise with a K-component mixture posterior). This
module holds what goes around them, following Trinh et al. (2022), Algorithm 1:

* Training. Each minibatch is split across the K components (example ``i`` uses
  component ``i mod K``), each example draws ``S`` noise samples, and the loss is the
  per-example negative ELBO of :mod:`tfbnn.callbacks`::

      loss = (1 / (S B)) sum_{i, s} NLL(y_i | x_i, z_is)  +  beta * KL / N

  with ``beta`` annealed 0 -> 1 by :class:`tfbnn.KLAnnealing`. ``S = 1`` needs nothing
  special; for ``S > 1`` wrap the model in :class:`IBNNModel`, which tiles each batch
  ``S`` times (inputs, targets and sample weights alike) inside its train step.
  :func:`node_optimizer` gives the variational parameters a large constant learning
  rate and the deterministic weights the usual (decaying) one.
* Prediction. ``n`` samples from every component, ``K * n`` in all
  (:func:`ibnn_num_samples`), through the common Monte Carlo API
  (:func:`tfbnn.predict`, which averages probabilities and splits the uncertainty
  into aleatoric and epistemic parts), or :func:`predict_per_component`; :func:`predictive_nll`
  gives the test NLL by log-mean-exp over the samples, as the paper does.
* Pretrained start. :func:`add_node_noise` copies a trained deterministic model,
  inserting :class:`tfbnn.layers.NodeNoise` in front of every ``Dense`` / ``Conv2D``,
  optionally freezing the copied weights so that only the noise is trained.

Example:
    >>> import keras, numpy as np, tfbnn
    >>> x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> net = keras.Sequential([keras.Input((8,)),
    ...                         tfbnn.layers.NodeDense(32, "relu", num_components=4, seed=1),
    ...                         tfbnn.layers.NodeDense(2, "softmax", num_components=4, seed=2)])
    >>> model = tfbnn.ibnn.IBNNModel(net, num_train_samples=2)
    >>> model.compile(tfbnn.ibnn.node_optimizer(variational_learning_rate=0.01),
    ...               "sparse_categorical_crossentropy", metrics=["accuracy"])
    >>> _ = model.fit(x, y, epochs=2, batch_size=32, verbose=0,
    ...               callbacks=[tfbnn.KLAnnealing(num_examples=len(x))])
    >>> res = tfbnn.predict(model, x[:10], num_samples=tfbnn.ibnn.ibnn_num_samples(model, n=5))
    >>> res.mean_probs.shape, res.num_samples
    ((10, 2), 20)

Reference:
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022 (eqs. 19-27, Algorithm 1).
"""

import contextlib
import inspect
import math

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import deprecation
from tfbnn import inference
from tfbnn.layers.base import FLOAT_PRIOR_ARGUMENTS
from tfbnn.layers.node import VARIATIONAL_WEIGHT_NAMES, NodeNoise, NodeLayer
from tfbnn.utils import NetworkWrapper, tile_rows, bayesian_layers, weight_samples

__all__ = [
    "IBNNModel",
    "VARIATIONAL_PATTERN",
    "add_node_noise",
    "deterministic_weights",
    "ibnn_num_samples",
    "node_layers",
    "node_optimizer",
    "num_components",
    "predict_per_component",
    "predictive_nll",
    "sample_outputs",
    "variational_weights",
]

#: Regex (``re.fullmatch`` on ``variable.path``) selecting the variational parameters
#: ``node_loc`` / ``node_rho`` of every node layer, at any nesting depth.
VARIATIONAL_PATTERN = r"(?:.*/)?(?:" + "|".join(VARIATIONAL_WEIGHT_NAMES) + r")"
DEFAULT_PREDICTION_SAMPLES_PER_COMPONENT = 5
_DEFAULT_WEIGHT_LEARNING_RATE = 1e-3
_DEFAULT_VARIATIONAL_LEARNING_RATE = 1e-2


# -- finding things ----------------------------------------------------------------


def node_layers(model):
    """The iBNN node layers (``NodeDense``, ``NodeConv2D``, ``NodeNoise``) of ``model``, nested ones included."""
    return [layer for layer in bayesian_layers(model) if isinstance(layer, NodeLayer)]


def _require_node_layers(model):
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(f"Expected a Keras model. Received: model={type(model).__name__}")
    layers = node_layers(model)
    if not layers:
        raise ValueError(
            "Expected a model with iBNN node layers (tfbnn.layers.NodeDense, NodeConv2D, NodeNoise). "
            f"Received: model={model.name!r} without any"
        )
    return layers


def num_components(model):
    """K of the model: the number of mixture components of its node layers.

    Layers with different K are allowed; the least common multiple is returned, so
    that ``K * n`` Monte Carlo samples cover every component of every layer ``n``
    times or more.
    """
    return math.lcm(*(layer.num_components for layer in _require_node_layers(model)))


def ibnn_num_samples(model, n=DEFAULT_PREDICTION_SAMPLES_PER_COMPONENT):
    """``K * n``: the Monte Carlo sample count that draws ``n`` samples from each component.

    Args:
        model: a model with node layers.
        n: int >= 1, samples per component (default 5, the paper's choice).

    Example:
        >>> import keras, tfbnn
        >>> net = keras.Sequential([keras.Input((8,)), tfbnn.layers.NodeDense(2, num_components=4, seed=0)])
        >>> tfbnn.ibnn.ibnn_num_samples(net, n=5)             # K = 4 components, 5 samples each
        20
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"Expected `n` (samples per component) to be a positive integer. Received: n={n!r}")
    return num_components(model) * n


def variational_weights(model):
    """The variational parameters (``node_loc``, ``node_rho``) of every node layer."""
    return [w for layer in node_layers(model) for w in (layer.node_loc, layer.node_rho)]


def deterministic_weights(model):
    """The trainable weights of ``model`` that are not variational parameters."""
    variational = {id(w) for w in variational_weights(model)}
    return [w for w in model.trainable_weights if id(w) not in variational]


# -- training with S samples per example ------------------------------------------------


@contextlib.contextmanager
def _train_samples(model, num_samples):
    layers = node_layers(model)
    previous = [layer.set_train_samples(num_samples) for layer in layers]
    try:
        yield
    finally:
        for layer, value in zip(layers, previous):
            layer.set_train_samples(value)


@keras.saving.register_keras_serializable(package="tfbnn")
class IBNNModel(NetworkWrapper):
    """Trains a node-layer model with ``S`` noise samples per example (Algorithm 1).

    In its train step each batch ``(x, y, sample_weight)`` of ``B`` examples is tiled
    sample-major to ``S * B`` rows (rows ``s * B .. s * B + B - 1`` are sample ``s``),
    and the node layers are told so: row ``s * B + i`` uses component ``i mod K``, the
    component of example ``i``, with its own noise draw. Keras' mean over the rows is
    then the expected NLL averaged over the ``S`` draws, and the KL is added once, so
    the loss is ``mean_{i,s} NLL + beta * KL / N`` with ``N`` the number of training
    examples (not ``S * N``). Evaluation and prediction run the wrapped model
    unchanged (one draw per example; Monte Carlo prediction through
    :func:`tfbnn.predict`). With ``S = 1`` it is the wrapped model.

    Args:
        model: a Keras model (or layer) with node layers.
        num_train_samples: int >= 1, ``S``, noise samples per example in training.
        **kwargs: passed to ``keras.Model`` (``name``, ...).

    Saves and loads as ``.keras`` (``IBNNModel`` is registered).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> net = keras.Sequential([keras.Input((8,)),
        ...                         tfbnn.layers.NodeDense(2, "softmax", num_components=4, seed=0)])
        >>> model = tfbnn.ibnn.IBNNModel(net, num_train_samples=4)
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> history = model.fit(x, y, callbacks=[tfbnn.KLAnnealing(num_examples=len(x))], verbose=0)
        >>> model.predict(x[:3], verbose=0).shape             # one draw per example
        (3, 2)
    """

    def __init__(self, model, num_train_samples=1, **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_train_samples, bool) or not isinstance(num_train_samples, int) or num_train_samples < 1:
            raise ValueError(
                "Expected `num_train_samples` (S, noise samples per example) to be a positive integer. "
                f"Received: num_train_samples={num_train_samples!r}"
            )
        _require_node_layers(model)
        self.network = model
        self.num_train_samples = num_train_samples

    def train_step(self, data):
        samples = self.num_train_samples
        if samples == 1:
            return super().train_step(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        data = keras.utils.pack_x_y_sample_weight(
            tile_rows(x, samples), tile_rows(y, samples), tile_rows(sample_weight, samples)
        )
        # Read by the node layers while the step is traced.
        with _train_samples(self, samples):
            return super().train_step(data)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"model": keras.saving.serialize_keras_object(self.network), "num_train_samples": self.num_train_samples}
        )
        return config


# -- per-group learning rates ---------------------------------------------------------------


def _as_optimizer(value, name):
    if isinstance(value, keras.optimizers.Optimizer):
        return value
    if isinstance(value, str):
        try:
            return keras.optimizers.get(value)
        except ValueError:
            pass
    raise ValueError(f"Expected `{name}` to be a Keras optimizer or its name. Received: {name}={value!r}")


def node_optimizer(weight_optimizer=None, variational_learning_rate=None, variational_optimizer=None):
    """One optimizer with a separate learning rate for the iBNN variational parameters.

    The paper trains the variational parameters (``node_loc``, ``node_rho``) with a
    large constant learning rate and the deterministic weights with the usual,
    decaying one. This returns ``keras.optimizers.MultiOptimizer`` routing every
    variable whose path matches :data:`VARIATIONAL_PATTERN` to the variational
    optimizer and everything else to ``weight_optimizer``; no regex to write. It
    works with ``fit``, XLA and ``.keras`` save/load.

    Learning-rate callbacks that set ``optimizer.learning_rate`` do not work on a
    ``MultiOptimizer``: give ``weight_optimizer`` a
    ``keras.optimizers.schedules.LearningRateSchedule`` instead (e.g.
    ``CosineDecay``). Scaling gradients is no substitute under Adam, which is
    invariant to gradient scale.

    Args:
        weight_optimizer: Keras optimizer (or name) for the deterministic weights.
            Default ``Adam(1e-3)``.
        variational_learning_rate: float > 0, the constant learning rate of the
            variational parameters when ``variational_optimizer`` is None. Default
            1e-2 (10x Adam's usual rate).
        variational_optimizer: Keras optimizer (or name) for the variational
            parameters. Default: the class and settings of ``weight_optimizer``
            with ``learning_rate=variational_learning_rate`` and no weight decay.

    Returns:
        A ``keras.optimizers.MultiOptimizer``.

    Example:
        >>> import keras, tfbnn
        >>> schedule = keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=10_000)
        >>> opt = tfbnn.ibnn.node_optimizer(keras.optimizers.Adam(schedule), variational_learning_rate=0.01)
        >>> net = keras.Sequential([keras.Input((8,)), tfbnn.layers.NodeDense(2, "softmax", seed=0)])
        >>> net.compile(opt, "sparse_categorical_crossentropy")
        >>> type(opt).__name__
        'MultiOptimizer'
    """
    if weight_optimizer is None:
        weight_optimizer = keras.optimizers.Adam(_DEFAULT_WEIGHT_LEARNING_RATE)
    weight_optimizer = _as_optimizer(weight_optimizer, "weight_optimizer")
    if variational_optimizer is not None:
        if variational_learning_rate is not None:
            raise ValueError(
                "Pass either `variational_optimizer` or `variational_learning_rate`, not both. "
                f"Received: variational_learning_rate={variational_learning_rate!r}"
            )
        variational_optimizer = _as_optimizer(variational_optimizer, "variational_optimizer")
    else:
        rate = _DEFAULT_VARIATIONAL_LEARNING_RATE if variational_learning_rate is None else variational_learning_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (math.isfinite(rate) and rate > 0):
            raise ValueError(
                "Expected `variational_learning_rate` to be a positive float. "
                f"Received: variational_learning_rate={variational_learning_rate!r}"
            )
        config = weight_optimizer.get_config()
        config.update(learning_rate=float(rate), weight_decay=None, name=f"{weight_optimizer.name}_variational")
        variational_optimizer = type(weight_optimizer).from_config(config)
    if variational_optimizer is weight_optimizer:
        raise ValueError("Expected two distinct optimizer objects. Received: the same object twice")
    return keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            default_optimizer=weight_optimizer, optimizer_map={VARIATIONAL_PATTERN: variational_optimizer}
        )
    )


# -- the pretrained start --------------------------------------------------------------------


# What add_node_noise passes on to its NodeNoise layers (it sets their seeds and axes itself),
# and the deprecated floats of node_prior.
_NODE_ARGUMENTS = tuple(p for p in inspect.signature(NodeLayer.__init__).parameters
                        if p not in ("self", "seed", "kwargs")) + FLOAT_PRIOR_ARGUMENTS[0]


def _channel_axis(layer):
    return 1 if getattr(layer, "data_format", "channels_last") == "channels_first" else -1


class _NoiseFactory:
    """Makes the NodeNoise layers of :func:`add_node_noise`, numbering their seeds."""

    def __init__(self, seed, node_kwargs):
        self.seed, self.node_kwargs, self.count = seed, node_kwargs, 0

    def __call__(self, target):
        seed = None if self.seed is None else self.seed + self.count
        self.count += 1
        return NodeNoise(axis=_channel_axis(target), seed=seed, name=f"{target.name}_node_noise", **self.node_kwargs)


def _copy_layer(layer, copies):
    new = layer.__class__.from_config(layer.get_config())
    copies.append((layer, new))
    return new


def _is_model(layer):
    return isinstance(layer, keras.Model)


def _sequential_with_noise(model, layer_types, make_noise, copies, convert):
    stack = [keras.Input(shape=tuple(model.input_shape[1:]), dtype=model.inputs[0].dtype)]
    for layer in model.layers:
        if isinstance(layer, layer_types):
            stack.append(make_noise(layer))
        stack.append(convert(layer) if _is_model(layer) else _copy_layer(layer, copies))
    return keras.Sequential(stack, name=model.name)


def _functional_with_noise(model, layer_types, make_noise, copies, convert):
    def clone_function(layer):
        return convert(layer) if _is_model(layer) else _copy_layer(layer, copies)

    def call_function(layer, *args, **kwargs):
        if isinstance(layer, layer_types) and args:
            args = (make_noise(layer)(args[0]),) + tuple(args[1:])
        return layer(*args, **kwargs)

    return keras.models.clone_model(model, clone_function=clone_function, call_function=call_function)


def add_node_noise(model, freeze_weights=False, layer_types=None, seed=None, init_stddev=0.0, **node_arguments):
    """A copy of a trained model with iBNN node noise in front of every Dense / Conv2D.

    The pretrained start of the paper (a trained ResNet-50 made into an iBNN): each
    matching layer gets a :class:`tfbnn.layers.NodeNoise` on its input (channel axis
    per the layer's ``data_format``), all trained weights and statistics (e.g.
    BatchNormalization moving averages) are copied, and the original model is left
    untouched. Train the result like any iBNN (``KLAnnealing``, :func:`node_optimizer`
    with a small or zero weight learning rate), or with ``freeze_weights=True`` train
    the variational parameters only.

    Args:
        model: a built ``keras.Sequential`` or functional model (nested ones are
            handled recursively); subclassed models cannot be rebuilt.
        freeze_weights: bool. True makes every copied layer non-trainable, leaving
            only the variational parameters to train (BatchNormalization then also
            stays in inference mode).
        layer_types: tuple of layer classes to put noise in front of. Default
            ``(keras.layers.Dense, keras.layers.Conv2D)``.
        seed: int or None; the i-th noise layer gets ``seed + i``.
        init_stddev: float >= 0, sigma0 of the initial component means. Default 0 (not
            the node layers' 0.5): every ``mu_k`` starts at ``init_mean`` (default 1), so
            the copy starts as the trained network plus small noise (``sigma ~ 0.05``),
            rather than a perturbed one.
        **node_arguments: the other arguments of the node layers, with their defaults
            (``num_components``, ``node_prior``, ``init_mean``,
            ``init_scale_mean``, ``init_scale_stddev``, ``kl_estimator``, ``num_kl_samples``,
            ``kl_weight``, ``inference_mode``; see :class:`tfbnn.layers.node.NodeLayer`).

    Returns:
        A new model of the same kind with the node layers added (``kl_weight`` not
        set: use :class:`tfbnn.KLAnnealing` or :func:`tfbnn.set_kl_weight`).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> trained = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
        ...                             keras.layers.Dense(2, "softmax")])
        >>> ibnn = tfbnn.ibnn.add_node_noise(trained, num_components=4, freeze_weights=True, seed=0)
        >>> [type(layer).__name__ for layer in ibnn.layers]
        ['NodeNoise', 'Dense', 'NodeNoise', 'Dense']
        >>> ibnn.compile(tfbnn.ibnn.node_optimizer(), "sparse_categorical_crossentropy")
        >>> _ = ibnn.fit(x, y, epochs=1, callbacks=[tfbnn.KLAnnealing(num_examples=len(x))], verbose=0)
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected a Keras model. Received: model={type(model).__name__}")
    if not model.built or not getattr(model, "inputs", None):
        raise ValueError(
            "Expected a built Sequential or functional model (one with known inputs; subclassed models "
            f"cannot be rebuilt). Received: model={model.name!r} of type {type(model).__name__}"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"Expected `seed` to be an int or None. Received: seed={seed!r}")
    layer_types = tuple(layer_types) if layer_types is not None else (keras.layers.Dense, keras.layers.Conv2D)
    if not layer_types or not all(isinstance(t, type) and issubclass(t, keras.layers.Layer) for t in layer_types):
        raise ValueError(f"Expected `layer_types` to be Keras layer classes. Received: layer_types={layer_types!r}")
    unknown = sorted(set(node_arguments) - set(_NODE_ARGUMENTS))
    if unknown:
        raise ValueError(f"Expected node layer arguments ({', '.join(_NODE_ARGUMENTS)}). "
                         f"Received: {', '.join(f'{k}={node_arguments[k]!r}' for k in unknown)}")
    # The deprecated prior floats fold into node_prior here, once (one warning, not one per layer).
    node_kwargs = NodeNoise.rename_arguments({"init_stddev": init_stddev, **node_arguments}, warn=True)
    NodeNoise(**node_kwargs)  # validates the arguments before any copying
    make_noise = _NoiseFactory(seed, node_kwargs)
    copies = []

    def convert(inner):
        if getattr(inner, "inputs", None):
            build = _sequential_with_noise if isinstance(inner, keras.Sequential) else _functional_with_noise
            return build(inner, layer_types, make_noise, copies, convert)
        return _copy_layer(inner, copies)

    new_model = convert(model)
    for old, new in copies:
        new.set_weights(old.get_weights())
        if freeze_weights:
            new.trainable = False
    if not node_layers(new_model):
        raise ValueError(
            f"The model has no layer of the types {[t.__name__ for t in layer_types]} to put node noise in "
            f"front of. Received: model={model.name!r}"
        )
    return new_model


# -- prediction --------------------------------------------------------------------------------


def predict_per_component(model, x, n=DEFAULT_PREDICTION_SAMPLES_PER_COMPONENT, **kwargs):
    """:func:`tfbnn.predict` with ``n`` samples from each mixture component (``K * n`` in all).

    Args:
        model: a model with node layers.
        x: inputs, as for :func:`tfbnn.predict`.
        n: int >= 1, samples per component (default 5, as in the paper).
        **kwargs: passed to :func:`tfbnn.predict` (``batch_size``, ``task``,
            ``from_logits``, ``return_samples``, ``joint``).

    Returns:
        A :class:`tfbnn.ClassificationPrediction` (mean of the ``K * n`` probability
        vectors; predictive entropy, expected entropy (aleatoric) and mutual
        information (epistemic), eqs. 26-27) or a :class:`tfbnn.RegressionPrediction`.
    """
    if "num_samples" in kwargs:
        raise ValueError(
            "tfbnn.ibnn.predict_per_component takes `n` (samples per component); for a total count use tfbnn.predict. "
            f"Received: num_samples={kwargs['num_samples']!r}"
        )
    return inference.predict(model, x, num_samples=ibnn_num_samples(model, n), **kwargs)


def sample_outputs(model, x, num_samples, batch_size=None):
    """The model's raw outputs for ``num_samples`` Monte Carlo samples, ``(T, N, ...)``.

    One vectorized call per batch: the batch is tiled sample-major inside
    :func:`tfbnn.weight_samples`, so sample ``t`` of a node model uses component
    ``t mod K``. Unlike :func:`tfbnn.predict` nothing is summarised or converted
    (logits stay logits).

    Args:
        model: a Keras model with one output.
        x: array ``(N, ...)``.
        num_samples: int >= 1, T.
        batch_size: examples per call (default 32).

    Returns:
        float32 NumPy array ``(T, N, ...)``.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"Expected `num_samples` to be a positive integer. Received: num_samples={num_samples!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"Expected `batch_size` to be a positive integer or None. Received: batch_size={batch_size!r}")
    x = np.asarray(x)
    if x.ndim < 1 or len(x) == 0:
        raise ValueError(f"Expected inputs with at least one example. Received: x of shape {x.shape}")
    x = x.astype(keras.config.floatx()) if np.issubdtype(x.dtype, np.floating) else x
    size = batch_size or 32
    if not model.built:
        model(x[:1], training=False)
    parts = []
    # One trace for every batch size (the last batch is smaller).
    spec = tf.TensorSpec((None,) + x.shape[1:], tf.as_dtype(x.dtype))
    with weight_samples(model, num_samples):
        run = tf.function(lambda v: model(tile_rows(v, num_samples), training=False), input_signature=[spec])
        for start in range(0, len(x), size):
            out = run(tf.convert_to_tensor(x[start : start + size])).numpy()
            parts.append(out.reshape((num_samples, -1) + out.shape[1:]))
    return np.concatenate(parts, axis=1).astype(np.float32)


def _log_probs(samples, from_logits):
    s = np.asarray(samples, dtype=np.float64)
    if s.shape[-1] == 1:  # one sigmoid unit: classes [1 - p, p]
        if from_logits:
            return np.concatenate([-np.logaddexp(0.0, s), -np.logaddexp(0.0, -s)], axis=-1)
        s = np.concatenate([1.0 - s, s], axis=-1)
    if from_logits:
        shifted = s - s.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return np.log(np.maximum(s, np.finfo(np.float64).tiny))


def predictive_nll(model, x, y, n=DEFAULT_PREDICTION_SAMPLES_PER_COMPONENT, num_samples=None, from_logits=False,
                   batch_size=None):
    """Test NLL of the Monte Carlo predictive by log-mean-exp, as Trinh et al. evaluate it.

    ``NLL = -(1/N) sum_i log (1/T) sum_t p(y_i | x_i, z_t)``, computed as
    ``-(logsumexp_t log p_t(y_i) - log T)`` in float64 from the raw outputs, which
    stays finite where a sample assigns (numerically) zero probability.

    Args:
        model: a classifier (softmax or sigmoid outputs, or logits with ``from_logits``).
        x: inputs ``(N, ...)``.
        y: integer labels ``(N,)``.
        n: samples per component (``T = K * n``); ignored when ``num_samples`` is given.
        num_samples: int or None, T directly (any model, e.g. an MC dropout one
            through a sampling layer).
        from_logits: bool.
        batch_size: examples per vectorized call.

    Returns:
        float, the mean NLL in nats.
    """
    total = num_samples if num_samples is not None else ibnn_num_samples(model, n)
    labels = np.asarray(y).astype(np.int64).reshape(-1)
    samples = sample_outputs(model, x, total, batch_size=batch_size)
    if samples.ndim != 3 or samples.shape[1] != len(labels):
        raise ValueError(
            f"Expected outputs (T, N, C) with N = len(y). Received: outputs of shape {samples.shape}, len(y)={len(labels)}"
        )
    log_p = _log_probs(samples, from_logits)  # (T, N, C)
    picked = np.take_along_axis(log_p, labels[None, :, None], axis=-1)[..., 0]  # (T, N)
    peak = picked.max(axis=0)
    log_mean = peak + np.log(np.mean(np.exp(picked - peak), axis=0))
    return float(-np.mean(log_mean))


__getattr__ = deprecation.renamed(__name__, {"make_optimizer": "node_optimizer", "predict": "predict_per_component"})
