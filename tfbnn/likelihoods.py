"""Distribution heads: a network's last layer as the parameters of a TFP distribution.

TFP's distribution layers (``tfp.layers.IndependentNormal``, ``IndependentBernoulli``,
``OneHotCategorical``, ``MixtureNormal``, ``DistributionLambda``) return a
``tfd.Distribution`` from ``call``; they subclass ``tf_keras``, and a Keras 3 layer
must return tensors. A tfbnn **head** is the Keras 3 form: a weightless layer that
returns the distribution's parameters as one tensor, and the distribution, the loss
and the predictive summary are made from that tensor::

    head = tfbnn.likelihoods.MixtureNormalHead(num_components=3)
    model = keras.Sequential([..., keras.layers.Dense(head.params_size(3, 1)), head])
    model.compile("adam", loss=tfbnn.likelihoods.DistributionNLL(head))   # -log p(y | params)
    dist = head.distribution(model(x))            # a tfd.MixtureSameFamily, batch shape (B,)
    res = tfbnn.predict(model, x, num_samples=100) # mean, aleatoric / epistemic split

**The parameter convention** (every head): the head's *input* has TFP's layout (the
same ``params_size`` as the TFP layer it replaces, so ``Dense(params_size)`` before it
stays as it was); its *output* has the same layout with every constrained parameter
constrained, so each part is a valid argument of the TFP constructor as it stands:
locations unchanged, scales ``softplus(raw) + min_scale`` (> 0), degrees of freedom
``softplus(raw) + min_df``, and probabilities as *normalized* logits (log-probabilities,
``log_softmax(raw)``) for categorical and mixture weights, log-odds for Bernoulli.
:meth:`DistributionHead.distribution` turns an output (``model(x)``,
``model.predict(x)``, a NumPy array) into the ``tfd.Distribution``, without weights or
state: a loss or a loaded model rebuilds it from the head's config.

=========================  ===================================  ==========================================
head                       output ``(..., P)``                  distribution (event shape)
=========================  ===================================  ==========================================
:class:`GaussianHead`      ``[loc (d), scale (d)]``             ``Independent(Normal)``  ``(d,)``
:class:`StudentTHead`      ``[loc, scale, df]`` (``3 d``)       ``Independent(StudentT)``  ``(d,)``
:class:`MixtureNormalHead`  ``[log w (K), K x (loc, scale)]``    ``MixtureSameFamily(Categorical,
                                                                Independent(Normal))``  ``(d,)``
:class:`BernoulliHead`     ``[logits (d)]``                     ``Independent(Bernoulli)``  ``(d,)``
:class:`CategoricalHead`   ``[log p (C)]``                      ``OneHotCategorical``  ``(C,)``
:class:`DistributionLambdaHead`  your raw parameters            ``make_distribution(params)``
=========================  ===================================  ==========================================

**Monte Carlo prediction.** :func:`tfbnn.predict` reads the head off the model's output
layer. With ``theta_t`` the head's output for weight sample ``t`` (T samples), a
regression head gives the law of total variance::

    mean      = mean_t E[y | theta_t]
    aleatoric = mean_t Var[y | theta_t]          (expected variance; RegressionPrediction.aleatoric_std^2)
    epistemic = var_t  E[y | theta_t]            (variance of the means; epistemic_std^2)

where ``E`` and ``Var`` are the distribution's own mean and variance (for the mixture,
``sum_k w_k mu_k`` and ``sum_k w_k (sigma_k^2 + mu_k^2) - mean^2``; for Student-t,
``scale^2 df / (df - 2)``). A classification head gives class probabilities per sample
and the entropy split of :func:`tfbnn.inference.summarize_classification` (Depeweg et
al. 2018): ``C`` classes for :class:`CategoricalHead`, and for :class:`BernoulliHead`
one binary classification per label (probabilities ``(..., d, 2)``).

References:
    Nix, Weigend. Estimating the Mean and Variance of the Target Probability
    Distribution. ICNN 1994.
    Bishop. Mixture Density Networks. Aston University NCRG/94/004, 1994 (eq. 22-26).
    Kendall, Gal. What Uncertainties Do We Need in Bayesian Deep Learning for
    Computer Vision? NeurIPS 2017 (eq. 5).
    Depeweg, Hernandez-Lobato, Doshi-Velez, Udluft. Decomposition of Uncertainty in
    Bayesian Deep Learning for Efficient and Risk-sensitive Learning. ICML 2018 (eq. 5).
    TensorFlow Probability, ``tfp.layers`` (``distribution_layer.py``).
"""

import math
import types

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn._internal import checks, keras_private

tfd = tfp.distributions

__all__ = [
    "DistributionHead",
    "GaussianHead",
    "StudentTHead",
    "MixtureNormalHead",
    "BernoulliHead",
    "CategoricalHead",
    "DistributionLambdaHead",
    "DistributionNLL",
    "to_distribution",
    "output_layer",
    "gaussian_nll",
    "split_gaussian",
    "QuantileHead",
    "PinballLoss",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
TASKS = ("regression", "classification")


def split_gaussian(outputs, name="outputs"):
    """Splits the output of a :class:`GaussianHead` into ``(mean, scale)``.

    Args:
        outputs: tensor or array ``(..., 2 d)``: the means, then the scales.
        name: the argument errors name. Default ``"outputs"``.

    Returns:
        ``(mean, scale)``, each ``(..., d)``.
    """
    outputs = checks.float_tensor(name, outputs)
    dim = outputs.shape[-1] if outputs.shape.rank else None
    if dim is None or dim % 2:
        raise ValueError(
            f"Expected the last dimension of `{name}`, a Gaussian head's output, to be even (means, then "
            f"scales). Received: {name}.shape={tuple(outputs.shape)}"
        )
    return outputs[..., : dim // 2], outputs[..., dim // 2 :]


def _last_dim(name, tensor):
    shape = tensor.shape
    if shape.rank is None or shape.rank < 1 or shape[-1] is None:
        raise ValueError(f"Expected `{name}` with a known last dimension (the head's parameters). "
                         f"Received: {name}.shape={tuple(shape) if shape.rank is not None else None}")
    return int(shape[-1])


def _positive(raw, floor):
    """``softplus(raw) + floor``, the constraint of every scale-like parameter."""
    return tf.nn.softplus(raw) + tf.cast(floor, raw.dtype)


class DistributionHead(keras.layers.Layer):
    """Base of the distribution heads: a weightless layer whose output parameterizes a TFP distribution.

    A subclass sets ``task`` (``"regression"`` or ``"classification"``) and implements
    ``_event_size(dim, name, shape, inputs)`` (the event size ``d`` read from a last
    dimension, or a ValueError naming ``name``), ``call`` (raw -> constrained
    parameters) and :meth:`distribution`. The rest follows:

    - :meth:`log_prob` ``(y_true, y_pred)``: ``distribution(y_pred).log_prob(y_true)``
      with the targets shaped like the event (``(B,)`` targets for ``d = 1`` get their
      event axis); :class:`DistributionNLL` is its negative as a Keras loss.
    - :meth:`moments` (regression): the distribution's mean and variance per sample.
    - :meth:`class_probabilities` (classification): class probabilities per sample.

    The module docstring has the parameter convention and the table of heads.
    """

    task = "regression"

    def __call__(self, *args, **kwargs):
        if self.task == "regression":
            _refuse_plain_metrics(self, keras_private.calling_model())
        return super().__call__(*args, **kwargs)

    def build(self, input_shape):
        self._event_size(input_shape[-1], "input_shape", tuple(input_shape), inputs=True)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def _params(self, y_pred):
        """``y_pred`` as a float tensor whose last dimension fits the head (else a ValueError)."""
        y_pred = checks.float_tensor("y_pred", y_pred)
        self._event_size(_last_dim("y_pred", y_pred), "y_pred", tuple(y_pred.shape))
        return y_pred

    def distribution(self, y_pred):
        """The TFP distribution of the head's output ``y_pred`` ``(B, ..., P)``: batch shape ``(B, ...)``."""
        raise NotImplementedError

    def log_prob(self, y_true, y_pred):
        """``log p(y_true | y_pred)`` per example, ``(B, ...)``.

        Args:
            y_true: targets shaped like the event, ``(B, ..., d)``; ``(B, ...)`` when ``d = 1``.
            y_pred: the head's output ``(B, ..., P)``.
        """
        dist = self.distribution(y_pred)
        return dist.log_prob(_event_targets(y_true, dist, y_pred))

    def moments(self, y_pred):
        """``(mean, variance)`` of ``distribution(y_pred)``, each ``(B, ..., d)``."""
        dist = self.distribution(y_pred)
        return dist.mean(), dist.variance()

    def class_probabilities(self, y_pred):
        """Class probabilities of each prediction ``(B, ..., C)``: classification heads only."""
        raise ValueError(f"Expected a classification head. Received: {type(self).__name__} (task={self.task!r})")


def _metric_entries(metrics):
    """The metrics of a compile config's ``metrics`` (a list, or a dict per output), each a name or a config."""
    if metrics is None:
        return []
    if isinstance(metrics, (list, tuple)):
        return [m for item in metrics for m in _metric_entries(item)]
    if isinstance(metrics, dict) and "class_name" not in metrics:
        return [m for item in metrics.values() for m in _metric_entries(item)]
    return [metrics]


def _reads_distribution_head(metric):
    """Whether a serialized metric sees the predictive mean (``reads_distribution_head``, e.g. HeadMean)."""
    if not isinstance(metric, dict):
        return False  # a name: a Keras metric
    registered = metric.get("registered_name")
    cls = keras.saving.get_registered_object(registered) if isinstance(registered, str) else None
    return bool(getattr(cls, "reads_distribution_head", False))


def _metric_name(metric):
    if isinstance(metric, dict):
        config = metric.get("config")
        return config.get("name", metric.get("class_name")) if isinstance(config, dict) else metric.get("class_name")
    return metric


def _refuse_plain_metrics(head, model):
    """A ValueError when ``model``, calling ``head`` as its single output, is compiled with a metric that
    would read the head's parameters as predictions (every Keras metric; :class:`tfbnn.metrics.HeadMean`
    and other metrics with ``reads_distribution_head`` see the predictive mean).

    The metrics are read from the model's public compile config, as compiled last: compiling again
    (without metrics, or with HeadMean) or compiling a clone is checked afresh.
    """
    if not isinstance(model, keras.Model) or not getattr(model, "compiled", False):
        return
    if len(getattr(model, "outputs", None) or ()) != 1 or output_layer(model) is not head:
        return  # not the single output (the metrics of several outputs name theirs)
    with tf.init_scope():  # out of a traced step: the config reads the optimizer's variables as numbers
        config = model.get_compile_config() or {}
    plain = [m for m in _metric_entries([config.get("metrics"), config.get("weighted_metrics")])
             if not _reads_distribution_head(m)]
    if plain:
        raise ValueError(
            f"Expected metrics that read the predictive mean of the model's {type(head).__name__}: its outputs "
            f"are the parameters of a distribution (for a GaussianHead [loc, scale], twice the targets' size), "
            "so a plain metric would compare the targets with them and report a wrong number. Wrap each metric, "
            "e.g. `metrics=[tfbnn.metrics.HeadMean(keras.metrics.RootMeanSquaredError(), model.layers[-1])]`, "
            "or compile again without it (a saved model: `keras.saving.load_model(path, compile=False)`). "
            f"Received: metrics={[_metric_name(m) for m in plain]}")


def _event_targets(y_true, dist, y_pred):
    """``y_true`` shaped like ``dist``'s batch + event shape (a missing size-1 event axis added), in its dtype."""
    y_true = tf.convert_to_tensor(y_true)
    expected = dist.batch_shape.concatenate(dist.event_shape)
    if expected.rank is not None and y_true.shape.rank == expected.rank - 1 and expected[-1] == 1:
        y_true = y_true[..., None]
    if not y_true.shape.is_compatible_with(expected):
        raise ValueError(
            f"Expected `y_true` shaped like the head's event, {tuple(expected)} for these predictions. "
            f"Received: y_true.shape={tuple(y_true.shape)}, y_pred.shape={tuple(y_pred.shape)}"
        )
    return tf.cast(y_true, dist.dtype)


@keras.saving.register_keras_serializable(package="tfbnn")
class GaussianHead(DistributionHead):
    """Heteroscedastic Normal head: ``2 d`` raw outputs -> ``[loc, scale]`` of a Gaussian.

    TFP's ``IndependentNormal(d)`` in Keras 3. The layer has no weights: put it
    after any projection to ``GaussianHead.params_size(d) = 2 d`` units
    (``keras.layers.Dense`` or a Bayesian dense layer). With raw inputs ``[m, r]``
    (each ``d`` wide) it returns ``[m, softplus(r) + min_scale]``::

        p(y | x) = prod_j N(y_j; m_j, (softplus(r_j) + min_scale)^2)

    The floor ``min_scale`` keeps the negative log-likelihood bounded when the
    net fits a training point exactly (TFP's layer has none).
    :meth:`distribution` gives ``tfd.Independent(tfd.Normal(loc, scale), 1)``; train
    with :func:`gaussian_nll` or ``DistributionNLL(head)`` (the same number).

    Args:
        min_scale: float > 0, the smallest scale the head outputs. Default 1e-3
            (in the units of the targets: rescale it for tiny targets).

    Input shape: ``(batch, ..., 2 d)``.
    Output shape: ``(batch, ..., 2 d)``, means in ``[..., :d]`` and scales in
    ``[..., d:]`` (see :func:`split_gaussian`).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((1,)),
        ...     keras.layers.Dense(16, activation="relu"),
        ...     tfbnn.layers.DenseFlipout(2, kl_weight=1 / 200, seed=0),  # d = 1
        ...     tfbnn.GaussianHead(),
        ... ])
        >>> model.compile("adam", loss=tfbnn.gaussian_nll)
        >>> mean, scale = tfbnn.likelihoods.split_gaussian(model(np.zeros((3, 1), "float32")))
        >>> bool(np.all(scale.numpy() > 0))
        True
        >>> model.layers[-1].distribution(model(np.zeros((3, 1), "float32"))).event_shape
        TensorShape([1])

    Reference:
        Kendall, Gal. What Uncertainties Do We Need in Bayesian Deep Learning for
        Computer Vision? NeurIPS 2017 (eq. 5: the heteroscedastic likelihood).
    """

    def __init__(self, min_scale=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.min_scale = checks.number("min_scale", min_scale, low=0, low_open=True)

    @staticmethod
    def params_size(event_size):
        """``2 d``: the units of the layer before the head (TFP's ``IndependentNormal.params_size``)."""
        return 2 * checks.integer("event_size", event_size, 1)

    def _event_size(self, dim, name, shape, inputs=False):
        if dim is None or dim % 2 or dim < 2:
            raise ValueError(
                f"Layer '{self.name}' expects an even last dimension (2 d: d means, d raw scales). "
                f"Received: {name}={shape}"
            )
        return dim // 2

    def call(self, inputs):
        mean, raw = split_gaussian(inputs)
        return tf.concat([mean, _positive(raw, self.min_scale)], axis=-1)

    def distribution(self, y_pred):
        loc, scale = split_gaussian(self._params(y_pred), name="y_pred")
        return tfd.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=1)

    def moments(self, y_pred):
        loc, scale = split_gaussian(self._params(y_pred), name="y_pred")
        return loc, tf.square(scale)

    def get_config(self):
        config = super().get_config()
        config.update({"min_scale": self.min_scale})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class StudentTHead(DistributionHead):
    """Heteroscedastic Student-t head: ``[loc, scale, df]`` of a Student-t per target.

    Heavier tails than :class:`GaussianHead` (robust regression). With raw inputs
    ``[m, r, s]`` (each ``d`` wide; ``[m, r]`` when ``df`` is fixed) it returns
    ``[m, softplus(r) + min_scale, nu]``, ``nu = softplus(s) + min_df`` (learned) or
    ``nu = df`` (fixed)::

        p(y | x) = prod_j StudentT(y_j; nu_j, m_j, sigma_j),
        E[y_j] = m_j,   Var[y_j] = sigma_j^2 nu_j / (nu_j - 2)   (nu_j > 2)

    The default ``min_df = 2`` keeps the variance finite, which the aleatoric part of
    :func:`tfbnn.predict` needs (``nu <= 2`` gives an infinite variance, ``nu <= 1`` an
    undefined mean, as in TFP). :meth:`distribution` gives
    ``tfd.Independent(tfd.StudentT(df, loc, scale), 1)``; train with
    ``DistributionNLL(head)``.

    Args:
        df: float > 0 or None. None (default): the degrees of freedom are learned
            (the input has ``3 d`` units); a number fixes them (``2 d`` units).
        min_scale: float > 0, the smallest scale. Default 1e-3.
        min_df: float >= 0, the smallest learned ``nu``. Default 2.

    Input shape: ``(batch, ..., 3 d)`` (``2 d`` with a fixed ``df``).
    Output shape: ``(batch, ..., 3 d)``: locations, scales, degrees of freedom.

    Example:
        >>> import numpy as np, tfbnn
        >>> head = tfbnn.likelihoods.StudentTHead(df=5.0)
        >>> out = head(np.zeros((2, 2), "float32"))       # d = 1: [loc, raw scale]
        >>> out.shape, float(out[0, 2])
        (TensorShape([2, 3]), 5.0)
        >>> round(float(head.moments(out)[1][0, 0]), 4)  # (softplus(0) + 1e-3)^2 * 5 / 3
        0.8031

    Reference:
        Lange, Little, Taylor. Robust Statistical Modeling Using the t
        Distribution. JASA 84, 1989.
    """

    def __init__(self, df=None, min_scale=1e-3, min_df=2.0, **kwargs):
        super().__init__(**kwargs)
        self.df = checks.number("df", df, low=0, low_open=True, allow_none=True)
        self.min_scale = checks.number("min_scale", min_scale, low=0, low_open=True)
        self.min_df = checks.number("min_df", min_df, low=0)

    @staticmethod
    def params_size(event_size, learn_df=True):
        """The units of the layer before the head: ``3 d``, or ``2 d`` with a fixed ``df``."""
        return (3 if learn_df else 2) * checks.integer("event_size", event_size, 1)

    def _event_size(self, dim, name, shape, inputs=False):
        parts = 2 if inputs and self.df is not None else 3
        if dim is None or dim % parts or dim < parts:
            raise ValueError(
                f"Layer '{self.name}' expects a last dimension divisible by {parts} (locations, raw scales"
                f"{', raw degrees of freedom' if parts == 3 else ''}). Received: {name}={shape}"
            )
        return dim // parts

    def call(self, inputs):
        d = self._event_size(_last_dim("inputs", inputs), "inputs", tuple(inputs.shape), inputs=True)
        loc, raw_scale = inputs[..., :d], inputs[..., d:2 * d]
        if self.df is None:
            df = _positive(inputs[..., 2 * d:], self.min_df)
        else:
            df = tf.fill(tf.shape(loc), tf.cast(self.df, loc.dtype))
        return tf.concat([loc, _positive(raw_scale, self.min_scale), df], axis=-1)

    def compute_output_shape(self, input_shape):
        d = self._event_size(input_shape[-1], "input_shape", tuple(input_shape), inputs=True)
        return (*input_shape[:-1], 3 * d)

    def distribution(self, y_pred):
        y_pred = self._params(y_pred)
        loc, scale, df = tf.split(y_pred, 3, axis=-1)
        return tfd.Independent(tfd.StudentT(df, loc, scale), reinterpreted_batch_ndims=1)

    def get_config(self):
        config = super().get_config()
        config.update({"df": self.df, "min_scale": self.min_scale, "min_df": self.min_df})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class MixtureNormalHead(DistributionHead):
    """Mixture density network head: a mixture of ``K`` diagonal Gaussians over ``d`` targets.

    TFP's ``MixtureNormal(K, d)`` (a ``MixtureSameFamily`` of ``IndependentNormal``)
    in Keras 3, with TFP's parameter layout: ``K`` mixture logits, then ``K``
    blocks of ``[loc (d), raw scale (d)]`` (``params_size(K, d) = K (1 + 2 d)``).
    The output has the same layout with ``log w = log_softmax(logits)`` (normalized)
    and ``sigma = softplus(raw) + min_scale`` (Bishop 1994, eq. 22-26)::

        p(y | x) = sum_k w_k prod_j N(y_j; mu_kj, sigma_kj^2)
        E[y]   = sum_k w_k mu_k
        Var[y] = sum_k w_k (sigma_k^2 + mu_k^2) - E[y]^2        (per target)

    :meth:`distribution` gives ``tfd.MixtureSameFamily(tfd.Categorical(logits=log w),
    tfd.Independent(tfd.Normal(mu, sigma), 1))``; :meth:`moments` its mean and
    variance above. Train with ``DistributionNLL(head)``.

    Args:
        num_components: int >= 1, ``K``.
        min_scale: float > 0, the smallest component scale. Default 1e-3.

    Input shape: ``(batch, ..., K (1 + 2 d))``.
    Output shape: the same.

    Example:
        >>> import numpy as np, tfbnn
        >>> head = tfbnn.likelihoods.MixtureNormalHead(2)
        >>> head.params_size(2, 1)
        6
        >>> out = head(np.array([[0.0, 0.0, -1.0, 0.5, 1.0, 0.5]], "float32"))  # w = (1/2, 1/2)
        >>> mean, var = head.moments(out)
        >>> float(mean[0, 0]), round(float(var[0, 0]), 3)                      # 0, sigma^2 + 1
        (0.0, 1.951)

    Reference:
        Bishop. Mixture Density Networks. Aston University NCRG/94/004, 1994.
    """

    def __init__(self, num_components, min_scale=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.num_components = checks.integer("num_components", num_components, 1)
        self.min_scale = checks.number("min_scale", min_scale, low=0, low_open=True)

    @staticmethod
    def params_size(num_components, event_size):
        """``K (1 + 2 d)``: the units of the layer before the head (TFP's ``MixtureNormal.params_size``)."""
        k = checks.integer("num_components", num_components, 1)
        return k * (1 + 2 * checks.integer("event_size", event_size, 1))

    def _event_size(self, dim, name, shape, inputs=False):
        k = self.num_components
        if dim is None or dim % k or (dim // k - 1) % 2 or dim // k < 3:
            raise ValueError(
                f"Layer '{self.name}' expects a last dimension of num_components * (1 + 2 d) = {k} * (1 + 2 d) "
                f"(logits, then per component d locations and d raw scales). Received: {name}={shape}"
            )
        return (dim // k - 1) // 2

    def _split(self, params, d):
        """``(logits (..., K), loc (..., K, d), raw or scale (..., K, d))`` of a ``(..., P)`` tensor."""
        k = self.num_components
        blocks = tf.reshape(params[..., k:], tf.concat([tf.shape(params)[:-1], [k, 2 * d]], axis=0))
        return params[..., :k], blocks[..., :d], blocks[..., d:]

    def call(self, inputs):
        d = self._event_size(_last_dim("inputs", inputs), "inputs", tuple(inputs.shape), inputs=True)
        logits, loc, raw = self._split(inputs, d)
        blocks = tf.concat([loc, _positive(raw, self.min_scale)], axis=-1)
        flat = tf.reshape(blocks, tf.concat([tf.shape(inputs)[:-1], [-1]], axis=0))
        out = tf.concat([tf.nn.log_softmax(logits, axis=-1), flat], axis=-1)
        return tf.ensure_shape(out, inputs.shape)

    def distribution(self, y_pred):
        y_pred = self._params(y_pred)
        log_w, loc, scale = self._split(y_pred, self._event_size(y_pred.shape[-1], "y_pred", y_pred.shape))
        return tfd.MixtureSameFamily(tfd.Categorical(logits=log_w),
                                     tfd.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=1))

    def get_config(self):
        config = super().get_config()
        config.update({"num_components": self.num_components, "min_scale": self.min_scale})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class BernoulliHead(DistributionHead):
    """Independent Bernoulli head (multi-label or binary classification): ``d`` logits.

    TFP's ``IndependentBernoulli(d)`` in Keras 3: the input is ``d`` log-odds and the
    output is the same (logits are already a valid parameter)::

        p(y | x) = prod_j Bernoulli(y_j; sigmoid(l_j)),   y_j in {0, 1}

    :meth:`distribution` gives ``tfd.Independent(tfd.Bernoulli(logits=l,
    dtype=l.dtype), 1)`` (float samples, float targets welcome; TFP's layer samples
    ints). ``DistributionNLL(head)`` is the summed binary cross-entropy from logits.
    :func:`tfbnn.predict` treats each label as a binary classification: class
    probabilities ``(..., d, 2)`` = ``[1 - p, p]`` and entropies per label ``(N, d)``.

    Input shape: ``(batch, ..., d)``.
    Output shape: the same.

    Example:
        >>> import numpy as np, tfbnn
        >>> head = tfbnn.likelihoods.BernoulliHead()
        >>> out = head(np.array([[0.0, 2.0]], "float32"))
        >>> np.round(head.class_probabilities(out).numpy(), 3)
        array([[[0.5  , 0.5  ],
                [0.119, 0.881]]], dtype=float32)
    """

    task = "classification"

    @staticmethod
    def params_size(event_size):
        """``d`` (TFP's ``IndependentBernoulli.params_size``)."""
        return checks.integer("event_size", event_size, 1)

    def _event_size(self, dim, name, shape, inputs=False):
        if dim is None or dim < 1:
            raise ValueError(f"Layer '{self.name}' expects a last dimension >= 1 (the logits). Received: {name}={shape}")
        return dim

    def call(self, inputs):
        return tf.identity(inputs)

    def distribution(self, y_pred):
        y_pred = self._params(y_pred)
        return tfd.Independent(tfd.Bernoulli(logits=y_pred, dtype=y_pred.dtype), reinterpreted_batch_ndims=1)

    def class_probabilities(self, y_pred):
        p = tf.math.sigmoid(self._params(y_pred))
        return tf.stack([1.0 - p, p], axis=-1)


@keras.saving.register_keras_serializable(package="tfbnn")
class CategoricalHead(DistributionHead):
    """Categorical head: ``C`` raw scores -> ``C`` log-probabilities of a one-hot categorical.

    TFP's ``OneHotCategorical(C)`` in Keras 3: the output is ``log_softmax(raw)``
    (normalized logits, ``exp`` of it the class probabilities)::

        p(y = c | x) = softmax(raw)_c

    :meth:`distribution` gives ``tfd.OneHotCategorical(logits=log p, dtype=log_p.dtype)``.
    ``DistributionNLL(head)`` is the categorical cross-entropy and takes one-hot
    targets ``(B, C)`` (TFP's convention) or integer labels ``(B,)`` / ``(B, 1)``.

    Input shape: ``(batch, ..., C)``, ``C >= 2``.
    Output shape: the same.

    Example:
        >>> import numpy as np, tfbnn
        >>> head = tfbnn.likelihoods.CategoricalHead()
        >>> out = head(np.log(np.array([[0.2, 0.8]], "float32")))
        >>> loss = tfbnn.likelihoods.DistributionNLL(head)
        >>> round(float(loss(np.array([1]), out)), 4), round(float(loss(np.array([[0.0, 1.0]]), out)), 4)  # -log 0.8
        (0.2231, 0.2231)
    """

    task = "classification"

    @staticmethod
    def params_size(num_classes):
        """``C`` (TFP's ``OneHotCategorical.params_size``)."""
        return checks.integer("num_classes", num_classes, 2)

    def _event_size(self, dim, name, shape, inputs=False):
        if dim is None or dim < 2:
            raise ValueError(f"Layer '{self.name}' expects a last dimension >= 2 (one score per class). "
                             f"Received: {name}={shape}")
        return dim

    def call(self, inputs):
        return tf.nn.log_softmax(inputs, axis=-1)

    def distribution(self, y_pred):
        y_pred = self._params(y_pred)
        return tfd.OneHotCategorical(logits=y_pred, dtype=y_pred.dtype)

    def log_prob(self, y_true, y_pred):
        """One-hot targets ``(B, ..., C)`` or integer labels ``(B, ...)`` / ``(B, ..., 1)``."""
        y_pred = self._params(y_pred)
        y_true = tf.convert_to_tensor(y_true)
        if y_true.shape.rank == y_pred.shape.rank and y_true.shape[-1] == 1:
            y_true = y_true[..., 0]
        if y_true.shape.rank == y_pred.shape.rank - 1:
            if not y_true.shape.is_compatible_with(y_pred.shape[:-1]):
                raise ValueError(f"Expected integer labels shaped like `y_pred` without its class axis. Received: "
                                 f"y_true.shape={tuple(y_true.shape)}, y_pred.shape={tuple(y_pred.shape)}")
            return tfd.Categorical(logits=y_pred).log_prob(checked_labels(y_true, y_pred.shape[-1]))
        return super().log_prob(y_true, y_pred)

    def class_probabilities(self, y_pred):
        return tf.math.softmax(self._params(y_pred), axis=-1)


def checked_labels(y_true, num_classes):
    """Integer labels ``y_true`` as int32, each in ``[0, num_classes)``: an out-of-range label would be scored
    as no class at all (a one-hot row of zeros) or fail deep in TensorFlow. A ValueError eagerly; inside a
    compiled step a runtime assertion with the same message."""
    labels = tf.cast(y_true, tf.int32)
    return checks.checked(
        labels, lambda: tf.reduce_all((labels >= 0) & (labels < num_classes)),
        f"Expected integer labels in [0, {num_classes}) (`y_pred` has one entry per class, {num_classes}).",
        lambda: f"y_true with labels {sorted(set(labels.numpy().ravel().tolist()) - set(range(num_classes)))} "
                "out of range")


def _probabilities_of(dist):
    """Class probabilities ``(..., C)`` of a (possibly Independent) Bernoulli, Categorical or OneHotCategorical."""
    base = dist.distribution if isinstance(dist, tfd.Independent) else dist
    if isinstance(base, tfd.Bernoulli):
        p = base.probs_parameter()
        return tf.stack([1.0 - p, p], axis=-1)
    if isinstance(base, (tfd.Categorical, tfd.OneHotCategorical)):
        return base.probs_parameter()
    raise ValueError("Expected `make_distribution` to return a Bernoulli, Categorical or OneHotCategorical "
                     f"(optionally in tfd.Independent) for task='classification'. Received: {type(dist).__name__}")


@keras.saving.register_keras_serializable(package="tfbnn")
class DistributionLambdaHead(DistributionHead):
    """Your own distribution of the raw parameters: TFP's ``DistributionLambda`` in Keras 3.

    The layer passes its input through unchanged; ``make_distribution(params)``
    (a function you register with ``keras.saving.register_keras_serializable``, so a
    saved model finds it by name) turns the output into a ``tfd.Distribution``,
    applying any constraint itself. ``DistributionNLL(head)`` is
    ``-make_distribution(y_pred).log_prob(y_true)``. :func:`tfbnn.predict` uses the
    distribution's ``mean()`` and ``variance()`` (``task="regression"``), or, with
    ``task="classification"``, the class probabilities of a Bernoulli, Categorical or
    OneHotCategorical (in ``tfd.Independent`` or not).

    Before (TFP, ``tf_keras``)::

        tfp.layers.DistributionLambda(lambda t: tfd.Independent(
            tfd.Laplace(t[..., :1], 1e-3 + tf.nn.softplus(t[..., 1:])), 1))

    After (tfbnn, Keras 3)::

        @keras.saving.register_keras_serializable(package="my_project")
        def laplace(t):
            return tfd.Independent(tfd.Laplace(t[..., :1], 1e-3 + tf.nn.softplus(t[..., 1:])), 1)

        head = tfbnn.likelihoods.DistributionLambdaHead(laplace)

    Args:
        make_distribution: registered function ``params (..., P) -> tfd.Distribution``
            (or a registered serializable object with ``get_config``). Lambdas and
            unregistered functions are refused: a saved model could not load.
        task: ``"regression"`` (default) or ``"classification"``.

    Input shape: ``(batch, ..., P)``.
    Output shape: the same.

    Example:
        >>> import keras, numpy as np, tensorflow as tf, tensorflow_probability as tfp, tfbnn
        >>> @keras.saving.register_keras_serializable(package="doctest")
        ... def poisson(t):
        ...     return tfp.distributions.Independent(tfp.distributions.Poisson(log_rate=t), 1)
        >>> head = tfbnn.likelihoods.DistributionLambdaHead(poisson)
        >>> loss = tfbnn.likelihoods.DistributionNLL(head)
        >>> round(float(loss(np.array([[2.0]]), np.zeros((1, 1)))), 4)   # -log(e^-1 / 2!)
        1.6931
        >>> head.get_config()["make_distribution"]["config"]
        'doctest>poisson'
    """

    def __init__(self, make_distribution, task="regression", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(task, str) or task not in TASKS:
            raise ValueError(f"Expected `task` in {TASKS}. Received: task={task!r}")
        if isinstance(make_distribution, dict):
            make_distribution = keras.saving.deserialize_keras_object(make_distribution)
        if not callable(make_distribution) or isinstance(make_distribution, type):
            raise ValueError("Expected `make_distribution` to be a function params -> tfd.Distribution. "
                             f"Received: make_distribution={make_distribution!r}")
        if not isinstance(make_distribution, types.FunctionType) and not hasattr(make_distribution, "get_config"):
            raise ValueError("Expected `make_distribution` to be a registered function or a serializable object "
                             f"with get_config. Received: make_distribution={make_distribution!r}")
        checks.registered("make_distribution", make_distribution, "a serializable object")
        self.make_distribution = make_distribution
        self.task = task

    def _event_size(self, dim, name, shape, inputs=False):
        if dim is None or dim < 1:
            raise ValueError(f"Layer '{self.name}' expects a last dimension >= 1. Received: {name}={shape}")
        return dim

    def call(self, inputs):
        return tf.identity(inputs)

    def distribution(self, y_pred):
        dist = self.make_distribution(tf.cast(self._params(y_pred), self.compute_dtype))
        if not isinstance(dist, tfd.Distribution):
            raise ValueError("Expected `make_distribution` to return a tfd.Distribution. "
                             f"Received: make_distribution={self.make_distribution!r} returning {type(dist).__name__}")
        return dist

    def class_probabilities(self, y_pred):
        if self.task != "classification":
            return super().class_probabilities(y_pred)
        return _probabilities_of(self.distribution(y_pred))

    def get_config(self):
        config = super().get_config()
        make_distribution = checks.registered("make_distribution", self.make_distribution, "a serializable object")
        config.update({"make_distribution": make_distribution,
                       "task": self.task})
        return config


def distribution_head(head, name="head"):
    """``head`` as a :class:`DistributionHead` (an instance, or its config); else a ValueError naming ``name``."""
    if isinstance(head, dict):
        head = keras.saving.deserialize_keras_object(head)
    if not isinstance(head, DistributionHead):
        raise ValueError(f"Expected `{name}` to be a tfbnn distribution head (e.g. tfbnn.GaussianHead()). "
                         f"Received: {name}={head!r}")
    return head


@keras.saving.register_keras_serializable(package="tfbnn")
class DistributionNLL(keras.losses.Loss):
    """Negative log-likelihood of the targets under a head's distribution, as a Keras loss.

    Per example, ``-log p(y_true | y_pred) = -head.distribution(y_pred).log_prob(y_true)``
    (summed over the event: the ``NLL`` of the ELBO convention; Keras averages over
    the batch). Serializable with its head (the head's config is saved with the
    compiled model).

    Args:
        head: a :class:`DistributionHead` (the model's output layer, or an equal one).
        reduction: Keras loss reduction. Default ``"sum_over_batch_size"``.
        name: Default ``"distribution_nll"``.

    Example:
        >>> import numpy as np, tfbnn
        >>> loss = tfbnn.likelihoods.DistributionNLL(tfbnn.GaussianHead())
        >>> round(float(loss(np.array([[0.0]]), np.array([[0.0, 1.0]]))), 4)   # log(2 pi) / 2
        0.9189
        >>> # model.compile("adam", loss=tfbnn.likelihoods.DistributionNLL(model.layers[-1]))
    """

    def __init__(self, head, reduction="sum_over_batch_size", name="distribution_nll", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.head = distribution_head(head)

    def call(self, y_true, y_pred):
        return -self.head.log_prob(y_true, y_pred)

    def get_config(self):
        config = super().get_config()
        config.update({"head": keras.saving.serialize_keras_object(self.head)})
        return config


def output_layer(model):
    """The layer that makes a Sequential or functional model's (first) output; None for a subclassed model.

    A nested model's own output layer is followed.
    """
    outputs = getattr(model, "outputs", None)
    if not outputs:
        return None
    layer = keras_private.output_layer(model)
    if isinstance(layer, keras.Model) and layer is not model:
        return output_layer(layer) or layer
    return layer


def to_distribution(head, y_pred):
    """The TFP distribution of a prediction: ``head.distribution(y_pred)``.

    Args:
        head: a :class:`DistributionHead`, or a Sequential / functional model ending
            in one.
        y_pred: the head's output ``(B, ..., P)`` (``model(x)``, ``model.predict(x)``).

    Returns:
        A ``tfd.Distribution`` of batch shape ``(B, ...)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), tfbnn.likelihoods.CategoricalHead()])
        >>> dist = tfbnn.likelihoods.to_distribution(model, model(np.zeros((5, 3), "float32")))
        >>> dist.batch_shape, dist.event_shape
        (TensorShape([5]), TensorShape([4]))
    """
    if isinstance(head, keras.Model):
        layer = output_layer(head)
        if not isinstance(layer, DistributionHead):
            raise ValueError("Expected `head` to be a distribution head or a model ending in one. "
                             f"Received: head=model {head.name!r} ending in {type(layer).__name__}")
        head = layer
    return distribution_head(head).distribution(y_pred)


def _checked_targets(y_true, mean, y_pred):
    """``y_true`` shaped like the means: broadcasting would score the wrong targets."""
    message = (f"Expected `y_true` shaped like the head's means (`y_pred` holds {mean.shape[-1]} means, then as "
               "many scales).")
    received = f"y_true.shape={tuple(y_true.shape)}, y_pred.shape={tuple(y_pred.shape)}"
    if not y_true.shape.is_compatible_with(mean.shape):
        raise ValueError(f"{message} Received: {received}")
    if y_true.shape.rank is None or y_true.shape.is_fully_defined():
        return y_true
    # Unknown sizes (a retraced step): compared when the step runs.
    return checks.checked(y_true, lambda: tf.reduce_all(tf.equal(tf.shape(y_true), tf.shape(mean))), message,
                           lambda: received)


def _checked_scales(scale):
    """``scale`` > 0: a raw (not GaussianHead) output would give a NaN loss."""
    return checks.checked(
        scale, lambda: tf.reduce_all(scale > 0),
        "Expected positive scales in the second half of `y_pred` (the output of a GaussianHead).",
        lambda: f"y_pred with min scale={float(tf.reduce_min(scale)):.4g}",
    )


@keras.saving.register_keras_serializable(package="tfbnn")
def gaussian_nll(y_true, y_pred):
    """Gaussian negative log-likelihood of ``y_true`` under a :class:`GaussianHead` output.

    Per example, summed over the ``d`` target dimensions (the log-likelihood of
    the example, so it is the ``NLL`` of the ELBO convention; Keras then averages
    over the batch)::

        nll = sum_j [ log sigma_j + (y_j - mu_j)^2 / (2 sigma_j^2) + log(2 pi) / 2 ]

    Args:
        y_true: targets ``(batch, ..., d)``; ``(batch,)`` when ``d = 1``.
        y_pred: head outputs ``(batch, ..., 2 d)``: means then scales.

    Returns:
        Tensor ``(batch, ...)``: the NLL of every example.

    Example:
        >>> import tfbnn
        >>> round(float(tfbnn.gaussian_nll([[0.0]], [[0.0, 1.0]])[0]), 4)  # log(2 pi) / 2
        0.9189
        >>> # model.compile(optimizer="adam", loss=tfbnn.gaussian_nll)
    """
    y_pred = checks.float_tensor("y_pred", y_pred)
    mean, scale = split_gaussian(y_pred, name="y_pred")
    y_true = tf.cast(checks.float_tensor("y_true", y_true), mean.dtype)
    if y_true.shape.rank == mean.shape.rank - 1:
        y_true = y_true[..., None]
    z = (_checked_targets(y_true, mean, y_pred) - mean) / _checked_scales(scale)
    return tf.reduce_sum(tf.math.log(scale) + 0.5 * tf.square(z) + _HALF_LOG_2PI, axis=-1)


@keras.saving.register_keras_serializable(package="tfbnn")
class QuantileHead(keras.layers.Layer):
    """Quantile regression head: 2 raw outputs -> a lower and an upper quantile that never cross.

    For conformalized quantile regression (Romano et al. 2019): the model predicts the
    ``quantiles = (alpha / 2, 1 - alpha / 2)`` quantiles of ``y | x``, trained with
    :class:`PinballLoss`, and :class:`tfbnn.conformal.ConformalizedQuantileRegressor`
    (:meth:`~tfbnn.conformal.ConformalizedQuantileRegressor.fit_model`) widens the band
    to a guaranteed coverage. With raw inputs ``[a, b]`` it returns::

        lower = a,   upper = a + softplus(b) + min_width

    so ``upper > lower`` for any weights (no crossing quantiles). The head is weightless
    and is not a :class:`DistributionHead`: its outputs are quantiles, not a distribution's
    parameters (``tfbnn.predict`` reads them as two plain regression outputs).

    Args:
        quantiles: two floats ``0 < lower < upper < 1``, the levels (stored for the loss
            and the conformal step). Default ``(0.05, 0.95)``.
        min_width: float >= 0, the smallest band. Default 0.

    Input shape: ``(batch, 2)``.
    Output shape: ``(batch, 2)``: ``[lower, upper]``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> head = tfbnn.likelihoods.QuantileHead((0.1, 0.9))
        >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2), head])
        >>> model.compile("adam", loss=tfbnn.likelihoods.PinballLoss(head.quantiles))
        >>> band = head(np.array([[1.0, 0.0]], "float32"))
        >>> [round(float(v), 4) for v in band[0]]                      # [1, 1 + log 2]
        [1.0, 1.6931]

    Reference:
        Romano, Patterson, Candes. Conformalized Quantile Regression. NeurIPS 2019 (sec. 3-4).
    """

    def __init__(self, quantiles=(0.05, 0.95), min_width=0.0, **kwargs):
        super().__init__(**kwargs)
        self.quantiles = _quantile_levels(quantiles)
        self.min_width = checks.number("min_width", min_width, low=0)

    def build(self, input_shape):
        if input_shape[-1] != 2:
            raise ValueError(f"Layer '{self.name}' expects a last dimension of 2 (raw lower, raw width). "
                             f"Received: input_shape={tuple(input_shape)}")

    def call(self, inputs):
        lower = inputs[..., :1]
        return tf.concat([lower, lower + _positive(inputs[..., 1:], self.min_width)], axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"quantiles": list(self.quantiles), "min_width": self.min_width})
        return config


def _quantile_levels(quantiles):
    if isinstance(quantiles, np.ndarray) and quantiles.ndim == 1:
        quantiles = quantiles.tolist()
    levels = tuple(quantiles) if isinstance(quantiles, (list, tuple)) else None
    if (levels is None or len(levels) != 2 or not all(checks.is_number(q) for q in levels)
            or not 0 < levels[0] < levels[1] < 1):
        raise ValueError(f"Expected `quantiles` to be two levels 0 < lower < upper < 1. Received: quantiles={quantiles!r}")
    return tuple(float(q) for q in levels)


@keras.saving.register_keras_serializable(package="tfbnn")
class PinballLoss(keras.losses.Loss):
    """Pinball (quantile) loss of a lower and an upper quantile, summed (Koenker & Bassett 1978; Romano et al. 2019, eq. 3).

    For level ``q`` and prediction ``f``, ``rho_q(y - f) = max(q (y - f), (q - 1)(y - f))``;
    per example the loss is ``rho_{q_lo}(y - lower) + rho_{q_hi}(y - upper)``, minimized in
    expectation by the true ``q_lo`` and ``q_hi`` quantiles.

    Args:
        quantiles: the two levels, as :class:`QuantileHead`'s. Default ``(0.05, 0.95)``.
        reduction, name, dtype: as for a Keras loss.

    Targets ``(B,)`` or ``(B, 1)``; predictions ``(B, 2)`` ``[lower, upper]``.

    Example:
        >>> import numpy as np, tfbnn
        >>> loss = tfbnn.likelihoods.PinballLoss((0.1, 0.9), reduction=None)
        >>> loss(np.array([0.0]), np.array([[1.0, 2.0]], "float32")).numpy()   # 0.9 * 1 + 0.1 * 2
        array([1.1], dtype=float32)
    """

    def __init__(self, quantiles=(0.05, 0.95), reduction="sum_over_batch_size", name="pinball_loss", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.quantiles = _quantile_levels(quantiles)

    def call(self, y_true, y_pred):
        y_pred = checks.float_tensor("y_pred", y_pred)
        y = tf.cast(tf.convert_to_tensor(y_true), y_pred.dtype)
        if y.shape.rank == 2 and y.shape[-1] == 1:
            y = y[:, 0]
        received = f"y_true.shape={tuple(y.shape)}, y_pred.shape={tuple(y_pred.shape)}"
        if y_pred.shape.rank != 2 or y_pred.shape[-1] not in (None, 2) or y.shape.rank != 1:
            raise ValueError("Expected predictions (batch, 2) [lower, upper] and targets (batch,) or (batch, 1). "
                             f"Received: {received}")
        if not y.shape.is_compatible_with(y_pred.shape[:1]):
            raise ValueError(f"Expected as many targets as predictions. Received: {received}")
        y = checks.checked(y, lambda: tf.equal(tf.shape(y)[0], tf.shape(y_pred)[0]),
                           "Expected as many targets as predictions.", lambda: received)
        y = checks.checked(
            y, lambda: tf.reduce_all(tf.math.is_finite(y)) & tf.reduce_all(tf.math.is_finite(y_pred)),
            "Expected finite targets and predictions (a NaN or inf would make the loss NaN).",
            lambda: f"{int(tf.reduce_sum(tf.cast(~tf.math.is_finite(y), tf.int32)))} non-finite targets, "
                    f"{int(tf.reduce_sum(tf.cast(~tf.math.is_finite(y_pred), tf.int32)))} non-finite predictions")
        y = y[:, None]
        q = tf.constant(self.quantiles, y_pred.dtype)
        error = y - y_pred
        return tf.reduce_sum(tf.maximum(q * error, (q - 1.0) * error), axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update({"quantiles": list(self.quantiles)})
        return config
