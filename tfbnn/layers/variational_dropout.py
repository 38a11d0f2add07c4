"""Variational dropout layers: dense and 2-D convolution, sparse (Molchanov) or Gaussian (Kingma).

Every weight has the posterior ``q(w) = N(theta, alpha theta^2)`` (Gaussian
multiplicative noise with per-weight dropout rate ``alpha / (1 + alpha)``) and the
log-uniform prior ``p(|w|) ~ 1 / |w|``. The KL has no closed form; each
parameterization uses the approximation fitted by its authors
(:func:`tfbnn.kl.molchanov_kl`, :func:`tfbnn.kl.kingma_kl`):

===================  ============================================  ===========================================
parameterization     learned                                       KL approximation (per weight)
===================  ============================================  ===========================================
``"additive"``       ``theta`` and ``log sigma^2``;                ``-KL = k1 sigmoid(k2 + k3 log alpha)
(Molchanov 2017)     ``log alpha = log sigma^2 - log theta^2``      - 0.5 log(1 + 1/alpha) - k1`` (eq. 14),
                     (additive noise reparameterization, eq. 15)   accurate at every alpha: sparsifies
``"multiplicative"`` ``theta`` and ``log alpha``                   ``-KL = C + 0.5 log alpha + c1 alpha
(Kingma 2015)        (variational dropout B, per weight)           + c2 alpha^2 + c3 alpha^3`` (eq. 7,
                                                                   appendix C), valid for ``alpha <= 1``
===================  ============================================  ===========================================

Both forms reach the same posterior: with ``log sigma^2 = log alpha + log theta^2``
they give the same ``alpha``, the same pre-activation distribution and, at
``alpha <= 1``, KLs within about 0.04 nats per weight of each other.

Clipping ``log alpha`` (documented, as in the authors' code): ``log alpha`` is
clipped to ``[min_log_alpha, max_log_alpha]``, by default ``[-8, 8]`` for the
additive form (Molchanov et al.'s code) and ``[-8, 0]`` for the multiplicative
form (``alpha <= 1``, where Kingma's approximation holds). The clipped value is
used everywhere: in the KL, in the noise variance ``alpha theta^2`` and in
:func:`log_alpha` (hence in pruning). It keeps every quantity finite whatever
the raw parameters (``theta = 0``, ``log sigma^2 = +-1e4``): the KL per weight lies
between ``kl(max_log_alpha)`` (about 0) and ``kl(min_log_alpha)`` (about 4.6), and a
weight with ``theta = 0`` contributes exactly nothing to the output. The clip also
stops the gradient of ``log alpha`` beyond the bounds. Note that the
multiplicative form, with ``alpha <= 1``, never reaches Molchanov's pruning threshold
``log alpha > 3``: it regularizes but does not sparsify (Molchanov et al.'s reason for
the additive form).

Training samples pre-activations by local reparameterization (Kingma et al. 2015,
eq. 6; Molchanov et al. 2017, eq. 17)::

    b = x theta + bias,   s = x^2 (alpha theta^2),   y = activation(b + sqrt(s) * eps)

so each example (and, for the convolution, each output position) gets its own
noise, with no weight-sized random draw. At inference the layers sample too,
unless ``inference_mode="mean"``: then ``W = theta``, the deterministic net that
sparse (pruned) predictions use (:mod:`tfbnn.pruning` sets pruned ``theta`` to 0).

Monte Carlo prediction (:func:`tfbnn.weight_samples`): per row (the default), the
local reparameterization above is exact for the dense layer. In joint mode the
dense layer draws T weight matrices ``W_t = theta + sqrt(alpha) |theta| eps_t``
shared by each block of rows (one batched matmul); the convolution stays per
output element in both modes (Molchanov et al.'s approximation: exact marginals,
no correlation across positions).
"""

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn import kl as kl_lib
from tfbnn.layers.arguments import ConvArguments, DenseArguments
from tfbnn.layers.base import BayesianLayer, KernelArguments

__all__ = [
    "DenseVariationalDropout",
    "Conv1DVariationalDropout",
    "Conv2DVariationalDropout",
    "PARAMETERIZATIONS",
    "DEFAULT_LOG_ALPHA_BOUNDS",
]

#: Names accepted for ``parameterization`` (aliases map to the first two).
PARAMETERIZATIONS = ("additive", "multiplicative")
_ALIASES = {
    "additive": "additive",
    "molchanov": "additive",
    "multiplicative": "multiplicative",
    "kingma": "multiplicative",
}
#: Default ``(min_log_alpha, max_log_alpha)`` per parameterization.
DEFAULT_LOG_ALPHA_BOUNDS = {"additive": (-8.0, 8.0), "multiplicative": (-8.0, 0.0)}
# log(theta^2 + eps) in the additive form: finite at theta = 0 (Molchanov et al. use 1e-8).
_THETA2_EPS = 1e-8
# The floor keeps d sqrt(v)/dv finite where v = 0 (a pruned row, a ReLU-zeroed input).
_VARIANCE_EPS = 1e-12


def resolve_parameterization(value):
    name = _ALIASES.get(value) if isinstance(value, str) else None
    if name is None:
        raise ValueError(
            f"Expected `parameterization` in {sorted(_ALIASES)}. Received: parameterization={value!r}"
        )
    return name


class VariationalDropoutLayer(KernelArguments, BayesianLayer):
    """Shared arguments, posterior, KL and noise of the variational-dropout layers.

    Args:
        parameterization: ``"additive"`` (alias ``"molchanov"``, default) or
            ``"multiplicative"`` (alias ``"kingma"``); see the module docstring.
        activation: activation name or callable.
        use_bias: bool. The bias is a point estimate (no noise, no KL).
        kernel_initializer: initializer of ``theta`` (``kernel_loc``).
        bias_initializer: initializer of the bias (``bias_loc``).
        kernel_scale_initializer: initializer of the kernel's untransformed
            scale, whose meaning follows ``parameterization``: ``log sigma^2``
            (``kernel_log_sigma2``) in the additive form, default ``Constant(-10)``
            (Molchanov et al.); ``log alpha`` (``kernel_log_alpha``) in the
            multiplicative form, default ``Constant(-8)`` (alpha ~ 3e-4, nearly
            deterministic).
        min_log_alpha: float, lower clip of ``log alpha``. Default -8.
        max_log_alpha: float or None, upper clip; None gives 8 (additive) or 0
            (multiplicative, ``alpha <= 1``; larger values are rejected there).
        kl_weight, inference_mode, seed: see :class:`BayesianLayer`.

    Renamed in tfbnn 0.2 (the old names still load and, with a
    ``DeprecationWarning``, construct): ``log_sigma2_initializer`` (additive) and
    ``log_alpha_initializer`` (multiplicative) -> ``kernel_scale_initializer``;
    the point-estimate bias weight ``bias`` -> ``bias_loc``.
    """


    def __init__(
        self,
        parameterization="additive",
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_scale_initializer=None,
        min_log_alpha=-8.0,
        max_log_alpha=None,
        kl_weight=None,
        inference_mode="sample",
        seed=None,
        **kwargs,
    ):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        self.parameterization = resolve_parameterization(parameterization)
        self.init_kernel_arguments(activation, use_bias, kernel_initializer, bias_initializer)
        default_scale = -10.0 if self.parameterization == "additive" else -8.0
        self.kernel_scale_initializer = checks.initializer(
            "kernel_scale_initializer",
            keras.initializers.Constant(default_scale) if kernel_scale_initializer is None else kernel_scale_initializer,
        )
        default_low, default_high = DEFAULT_LOG_ALPHA_BOUNDS[self.parameterization]
        self.min_log_alpha = checks.number("min_log_alpha", min_log_alpha)
        self.max_log_alpha = default_high if max_log_alpha is None else checks.number("max_log_alpha", max_log_alpha)
        self._max_log_alpha_arg = max_log_alpha
        if self.min_log_alpha >= self.max_log_alpha:
            raise ValueError(
                "Expected `min_log_alpha` < `max_log_alpha`. "
                f"Received: min_log_alpha={self.min_log_alpha}, max_log_alpha={self.max_log_alpha}"
            )
        if self.parameterization == "multiplicative" and self.max_log_alpha > 0.0:
            raise ValueError(
                "Expected `max_log_alpha` <= 0 with the multiplicative parameterization: Kingma et "
                "al.'s KL approximation holds for alpha <= 1 only (use parameterization='additive' "
                f"for larger alpha). Received: max_log_alpha={max_log_alpha}"
            )

    @classmethod
    def renamed_argument_names(cls, arguments):
        """As :meth:`StochasticLayer.renamed_argument_names`; of the two 0.1 scale
        initializers the one the ``parameterization`` used becomes
        ``kernel_scale_initializer``, the other (it had no effect) is dropped."""
        additive = resolve_parameterization(arguments.get("parameterization", "additive")) == "additive"
        used, unused = ("log_sigma2_initializer", "log_alpha_initializer")[:: 1 if additive else -1]
        return {**super().renamed_argument_names(arguments), used: "kernel_scale_initializer", unused: None}

    # -- weights ---------------------------------------------------------------
    def build_posterior(self, kernel_shape, bias_shape):
        """Makes ``kernel_loc`` (theta), the kernel's scale (``kernel_log_sigma2`` or
        ``kernel_log_alpha``), the point-estimate ``bias_loc`` and the KL weight."""
        self.kernel_loc = self.add_weight(name="kernel_loc", shape=kernel_shape, initializer=self.kernel_initializer)
        if self.parameterization == "additive":
            self.kernel_log_sigma2 = self.add_weight(
                name="kernel_log_sigma2", shape=kernel_shape, initializer=self.kernel_scale_initializer
            )
            self.kernel_log_alpha = None
        else:
            self.kernel_log_alpha = self.add_weight(
                name="kernel_log_alpha", shape=kernel_shape, initializer=self.kernel_scale_initializer
            )
            self.kernel_log_sigma2 = None
        self.bias_loc = None
        if self.use_bias:
            self.bias_loc = self.add_weight(name="bias_loc", shape=bias_shape, initializer=self.bias_initializer)
        self._build_kl_weight()

    # -- posterior ---------------------------------------------------------------
    def log_alpha(self):
        """``log alpha`` per kernel weight, clipped to ``[min_log_alpha, max_log_alpha]``."""
        if self.parameterization == "additive":
            raw = self.kernel_log_sigma2 - tf.math.log(tf.square(self.kernel_loc) + _THETA2_EPS)
        else:
            raw = self.kernel_log_alpha
        return tf.clip_by_value(raw, self.min_log_alpha, self.max_log_alpha)

    def kernel_variance(self):
        """The posterior variance ``alpha theta^2`` per kernel weight (clipped alpha)."""
        return tf.exp(self.log_alpha()) * tf.square(self.kernel_loc)

    def kernel_scale(self):
        """The posterior standard deviation ``sqrt(alpha) |theta|``."""
        return tf.sqrt(self.kernel_variance())

    def kl_divergence(self):
        """The approximate ``KL(q || p)`` summed over the kernel, unscaled."""
        kl_fn = kl_lib.molchanov_kl if self.parameterization == "additive" else kl_lib.kingma_kl
        return tf.reduce_sum(kl_fn(self.log_alpha()))

    # -- forward pass ------------------------------------------------------------
    def _local_reparameterization(self, inputs):
        mean = self.forward(inputs, self.kernel_loc)
        # The variance in float32 (the variables' dtype), also under mixed precision:
        # alpha theta^2 of 1e-8 is 0 in float16.
        variance_of_weights = self.kernel_variance()
        variance = self.forward(tf.square(tf.cast(inputs, variance_of_weights.dtype)), variance_of_weights)
        eps = self._normal(tf.shape(variance), variance.dtype)
        return mean + tf.cast(tf.sqrt(variance + _VARIANCE_EPS) * eps, mean.dtype)

    def _joint_sample_outputs(self, inputs):
        return None  # layers that support joint weight samples override this

    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        outputs = None
        if sampling and self._mc_prediction and self._joint_samples:
            outputs = self._joint_sample_outputs(inputs)
        if outputs is None:
            if sampling:
                outputs = self._local_reparameterization(inputs)
            else:
                outputs = self.forward(inputs, self.kernel_loc)
        return self._finish(outputs, self.bias_loc, training)

    def get_config(self):
        config = super().get_config()
        config.update(self.kernel_config())
        config.update(
            {
                "parameterization": self.parameterization,
                "kernel_scale_initializer": keras.initializers.serialize(self.kernel_scale_initializer),
                "min_log_alpha": self.min_log_alpha,
                "max_log_alpha": self._max_log_alpha_arg,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseVariationalDropout(DenseArguments, VariationalDropoutLayer):
    """Dense layer with variational dropout: sparse VD (Molchanov 2017) or Gaussian VD (Kingma 2015).

    Posterior ``q(w_ij) = N(theta_ij, alpha_ij theta_ij^2)``, log-uniform prior,
    approximate KL (Molchanov et al. 2017, eq. 14, or Kingma et al. 2015, eq. 7),
    trained by local reparameterization (Molchanov et al. 2017, eq. 17)::

        y = activation(x theta + bias + sqrt(x^2 (alpha theta^2)) * eps),   eps ~ N(0, I)

    Weights with ``log alpha > 3`` (dropout rate above 95%) carry almost no signal
    and can be removed: :func:`tfbnn.pruning.log_alpha_mask`. The layer adds
    ``kl_weight * KL`` to ``layer.losses`` (``kl_weight = beta / N``).

    Args:
        units: int > 0, output dimension.
        **kwargs: ``parameterization``, ``activation``, ``use_bias``, initializers,
            ``min_log_alpha``, ``max_log_alpha``, ``kl_weight``, ``inference_mode``,
            ``seed``: see :class:`VariationalDropoutLayer` and the module docstring.

    Call arguments:
        inputs: ``(batch, ..., input_dim)``.
        training: bool. Training always samples; inference samples unless
            ``inference_mode == "mean"`` (``W = theta``).

    Input shape: ``(batch, ..., input_dim)``, rank >= 2.
    Output shape: ``(batch, ..., units)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((784,)),
        ...     tfbnn.layers.DenseVariationalDropout(300, activation="relu", seed=1),
        ...     tfbnn.layers.DenseVariationalDropout(10, activation="softmax", seed=2),
        ... ])
        >>> tfbnn.set_kl_weight(model, 1 / 60000)
        2
        >>> model(np.zeros((2, 784), "float32")).shape
        TensorShape([2, 10])

    References:
        Molchanov, Ashukha, Vetrov. Variational Dropout Sparsifies Deep Neural
        Networks. ICML 2017 (eq. 14, 15, 17).
        Kingma, Salimans, Welling. Variational Dropout and the Local
        Reparameterization Trick. NeurIPS 2015 (eq. 6, 7, appendix C).
    """

    def _joint_sample_outputs(self, inputs):
        """One weight sample per block of rows, T in all: ``W_t = theta + sqrt(alpha theta^2) eps_t``."""
        num_samples = self._weight_samples
        loc = self.kernel_loc
        eps = self._normal(tf.concat([[num_samples], tf.shape(loc)], axis=0), loc.dtype)
        kernels = tf.cast(loc + self.kernel_scale() * eps, inputs.dtype)
        shape = tf.shape(inputs)
        x = tf.reshape(inputs, tf.stack([num_samples, -1, shape[-1]]))
        return tf.reshape(tf.matmul(x, kernels), tf.concat([shape[:-1], [self.units]], axis=0))


_CONV_DOC = """{rank}-D convolution with variational dropout (Molchanov 2017 sparse VD, or Kingma 2015).

    Posterior ``q(w) = N(theta, alpha theta^2)`` per kernel weight, log-uniform
    prior, approximate KL as :class:`DenseVariationalDropout`. Pre-activations are
    sampled per output element (local reparameterization for convolutions,
    Molchanov et al. 2017, sec. 4.4)::

        y = activation(conv(x, theta) + bias + sqrt(conv(x^2, alpha theta^2)) * eps)

    Args:
        filters: int > 0, output channels.
        kernel_size: int or tuple of {rank} ints.
        strides: int or tuple. Default 1.
        padding: ``"valid"`` (default) or ``"same"``.
        data_format: ``"channels_last"`` (default) or ``"channels_first"``.
        dilation_rate: int or tuple. Default 1.
        **kwargs: ``parameterization``, ``kernel_initializer``,
            ``kernel_scale_initializer``, ``bias_initializer`` and the other
            arguments of :class:`VariationalDropoutLayer`.

    Input shape: ``(batch, {spatial}, channels)`` (channels_first: ``(batch, channels, {spatial})``).
    Output shape: ``(batch, {spatial}, filters)`` (channels_first: ``(batch, filters, {spatial})``).

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.Conv{rank}DVariationalDropout(4, 3, padding="same", seed=1, kl_weight=1e-3)
        >>> layer(np.zeros((2, {example}1), "float32")).shape
        TensorShape([2, {example}4])

    Reference:
        Molchanov, Ashukha, Vetrov. Variational Dropout Sparsifies Deep Neural
        Networks. ICML 2017.
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv1DVariationalDropout(ConvArguments, VariationalDropoutLayer):
    __doc__ = _CONV_DOC.format(rank=1, spatial="length", example="8, ")
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DVariationalDropout(ConvArguments, VariationalDropoutLayer):
    __doc__ = _CONV_DOC.format(rank=2, spatial="rows, cols", example="8, 8, ")
    rank = 2
