"""Spectral normalization of a ``Dense`` or ``Conv2D`` kernel, with a bound (Miyato et al. 2018; SNGP).

A network whose hidden maps are bi-Lipschitz keeps distances between inputs in its
features, which is what a distance-aware output layer (:class:`RandomFeatureGaussianProcess`,
DDU's density) needs (Liu et al. 2020, sec. 3.2). Spectral normalization bounds each
layer's Lipschitz constant by bounding the largest singular value ``sigma(W)`` of its kernel:

    W_sn = W * min(1, c / sigma(W))                      (Liu et al. 2020, eq. 8)

with ``c`` = ``norm_multiplier``: the kernel is rescaled only when ``sigma(W) > c``
(Miyato's original ``W / sigma(W)`` is ``c = 1`` without the ``min``). ``sigma(W)`` is
estimated by power iteration (Miyato et al. 2018, Algorithm 1) on the kernel as a matrix
``W_mat`` of shape ``(prod(kernel.shape[:-1]), kernel.shape[-1])``::

    u <- W_mat^T v / ||W_mat^T v||,   v <- W_mat u / ||W_mat u||,   sigma = v^T W_mat u = ||W_mat u||

For a ``Conv2D`` this is the reshaped kernel ``(kh * kw * c_in, c_out)`` (as in Miyato
et al. and ``keras.layers.SpectralNormalization``), not the convolution operator of
Edward2's ``SpectralNormalizationConv2D``: the operator's norm can exceed the reshaped
kernel's by up to ``sqrt(kh * kw)`` (Gouk et al. 2021), so for convolutions ``c`` bounds
the reshaped kernel, a proxy of the layer's Lipschitz constant.

The vectors ``u`` and ``v`` are non-trainable weights (``u`` seeded normal at build) that
move ``power_iterations`` steps at every training call; at inference they stay, so the
layer is deterministic (``sigma = ||W_mat u||``, the same estimate as in training, also
before the first training step). Gradients flow through ``sigma`` with ``u`` held fixed.
"""

import math

import keras
import tensorflow as tf

from tfbnn._internal import checks

__all__ = ["SpectralNormalization", "SpectralDense", "SpectralConv2D"]


def _normalize(x, fallback):
    """``x / ||x||``, or ``fallback`` where ``x`` is zero (a zero kernel must not zero ``u`` for good)."""
    norm = tf.norm(x)
    return tf.where(norm > 1e-30, x / tf.maximum(norm, 1e-30), fallback)


def power_iteration(w_mat, u, iterations):
    """``(u, v)`` after ``iterations`` steps of power iteration on ``w_mat`` (rows, cols) from ``u`` (cols,);
    each step ends with ``v = W u / ||W u||``, so that ``v^T W u = ||W u||``."""
    zeros = tf.zeros_like(w_mat[:, 0])
    v = _normalize(tf.linalg.matvec(w_mat, u), zeros)
    for _ in range(iterations):
        u = _normalize(tf.linalg.matvec(w_mat, v, transpose_a=True), u)
        v = _normalize(tf.linalg.matvec(w_mat, u), zeros)
    return u, v


@keras.saving.register_keras_serializable(package="tfbnn")
class SpectralNormalization(keras.layers.Layer):
    """Spectral normalization with a bound: ``W <- W * min(1, c / sigma(W))`` on a ``Dense`` or ``Conv2D``.

    The wrapped layer keeps its kernel (the trained parameter); the wrapper computes the
    layer's output with the normalized kernel (see the module docstring for the math and
    what ``sigma`` is for a convolution).

    Args:
        layer: a ``keras.layers.Dense`` or ``keras.layers.Conv2D`` (ungrouped).
        norm_multiplier: float > 0, the bound ``c`` on the spectral norm. Default 0.95 (SNGP).
        power_iterations: int >= 1, power-iteration steps per training call. Default 1.
        seed: int or None, seeds the initial ``u`` (normal).

    Input and output shape: those of ``layer``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> sn = tfbnn.layers.SpectralNormalization(keras.layers.Dense(4), norm_multiplier=0.5, seed=0)
        >>> y = sn(np.ones((2, 3), "float32"), training=True)
        >>> bool(sn.spectral_norm(normalized=True) <= 0.5 + 1e-6)
        True

    References:
        Miyato, Kataoka, Koyama, Yoshida. Spectral Normalization for Generative Adversarial
        Networks. ICLR 2018 (Algorithm 1). Liu, Lin, Padhy, Tran, Bedrax-Weiss, Lakshminarayanan.
        Simple and Principled Uncertainty Estimation with Deterministic Deep Learning via
        Distance Awareness. NeurIPS 2020 (eq. 8).
    """

    def __init__(self, layer, norm_multiplier=0.95, power_iterations=1, seed=None, **kwargs):
        super().__init__(**kwargs)
        if type(layer) not in (keras.layers.Dense, keras.layers.Conv2D):
            raise ValueError("Expected `layer` to be a keras.layers.Dense or keras.layers.Conv2D. "
                             f"Received: layer={layer!r}")
        if isinstance(layer, keras.layers.Conv2D) and layer.groups != 1:
            raise ValueError(f"Expected an ungrouped Conv2D (groups=1). Received: groups={layer.groups!r}")
        self.layer = layer
        self.norm_multiplier = checks.number("norm_multiplier", norm_multiplier, low=0, low_open=True)
        self.power_iterations = checks.integer("power_iterations", power_iterations, 1)
        self.seed = checks.seed(seed)

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        shape = tuple(self.layer.kernel.shape)
        self._matrix_shape = (math.prod(shape[:-1]), shape[-1])
        init = keras.initializers.RandomNormal(stddev=1.0, seed=self.seed)
        # Not autocast: the power iteration runs in float32 under a mixed policy too.
        self.u = self.add_weight(name="u", shape=(shape[-1],), initializer=init, trainable=False, autocast=False)
        self.v = self.add_weight(name="v", shape=(self._matrix_shape[0],), initializer="zeros", trainable=False,
                                 autocast=False)
        self.built = True

    def _kernel_matrix(self):
        """The kernel as a float32 ``(rows, cols)`` matrix (float32 also where a mixed policy reads it in float16)."""
        return tf.cast(tf.reshape(tf.convert_to_tensor(self.layer.kernel), self._matrix_shape), tf.float32)

    def spectral_norm(self, normalized=False):
        """The estimate ``sigma = v^T W_mat u`` from the current vectors, of the kernel or (``normalized``)
        of the kernel the layer uses, ``W * min(1, c / sigma)``; a float."""
        sigma = self._sigma(self._kernel_matrix(), self.u)
        if normalized:
            sigma = sigma * tf.minimum(1.0, self.norm_multiplier / sigma)
        return float(sigma)

    @staticmethod
    def _sigma(w_mat, u):
        return tf.norm(tf.linalg.matvec(w_mat, tf.stop_gradient(u)))

    def normalized_kernel(self, training=False):
        """The kernel the layer uses; with ``training``, after updating ``u`` and ``v``."""
        w_mat = self._kernel_matrix()
        u = tf.convert_to_tensor(self.u)
        if training:
            u, v = power_iteration(tf.stop_gradient(w_mat), u, self.power_iterations)
            self.u.assign(u)
            self.v.assign(v)
        sigma = self._sigma(w_mat, u)
        # sigma <= c (a zero kernel included) leaves the kernel as it is; no division by a tiny sigma.
        scale = tf.where(sigma > self.norm_multiplier, self.norm_multiplier / tf.maximum(sigma, 1e-12), 1.0)
        kernel = tf.convert_to_tensor(self.layer.kernel)
        return kernel * tf.cast(scale, kernel.dtype)

    def call(self, inputs, training=False):
        kernel = self.normalized_kernel(bool(training))
        layer = self.layer
        if isinstance(layer, keras.layers.Conv2D):
            outputs = keras.ops.conv(inputs, kernel, strides=layer.strides, padding=layer.padding,
                                     data_format=layer.data_format, dilation_rate=layer.dilation_rate)
            if layer.use_bias:
                bias_shape = (1, -1, 1, 1) if layer.data_format == "channels_first" else (-1,)
                outputs = outputs + keras.ops.reshape(layer.bias, bias_shape)
        else:
            outputs = keras.ops.matmul(inputs, kernel)
            if layer.use_bias:
                outputs = outputs + layer.bias
        return outputs if layer.activation is None else layer.activation(outputs)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        return {**super().get_config(), "layer": keras.saving.serialize_keras_object(self.layer),
                "norm_multiplier": self.norm_multiplier, "power_iterations": self.power_iterations,
                "seed": self.seed}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layer"] = keras.saving.deserialize_keras_object(config["layer"])
        return cls(**config)


class _ZooSpectral(SpectralNormalization):
    """A spectrally normalized layer made from its Keras layer's arguments (the zoo's ``sngp`` layers)."""

    _ARGS = ()

    def __init__(self, inner, norm_multiplier, power_iterations, seed, kl_weight, kwargs):
        if kl_weight is not None:
            raise ValueError(f"A spectrally normalized layer has no KL term. Received: kl_weight={kl_weight!r}")
        super().__init__(inner, norm_multiplier=norm_multiplier, power_iterations=power_iterations, seed=seed,
                         **kwargs)

    def get_config(self):
        config = super().get_config()
        del config["layer"]
        inner = self.layer.get_config()
        return {**config, **{k: inner[k] for k in self._ARGS}}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="tfbnn")
class SpectralDense(_ZooSpectral):
    """``SpectralNormalization(keras.layers.Dense(units, activation, use_bias))``: the ``sngp`` method's dense layer.

    Args:
        units, activation, use_bias: those of ``keras.layers.Dense``.
        norm_multiplier, power_iterations, seed: those of :class:`SpectralNormalization`.
        kl_weight: None (the zoo passes it to every layer; this one has no KL term).

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.SpectralDense(3, activation="relu", seed=0)
        >>> tuple(layer(np.ones((2, 5), "float32")).shape)
        (2, 3)
    """

    _ARGS = ("units", "activation", "use_bias")

    def __init__(self, units, activation=None, use_bias=True, norm_multiplier=0.95, power_iterations=1, seed=None,
                 kl_weight=None, **kwargs):
        inner = keras.layers.Dense(units, activation=activation, use_bias=use_bias, dtype=kwargs.get("dtype"))
        super().__init__(inner, norm_multiplier, power_iterations, seed, kl_weight, kwargs)


@keras.saving.register_keras_serializable(package="tfbnn")
class SpectralConv2D(_ZooSpectral):
    """``SpectralNormalization(keras.layers.Conv2D(...))``: the ``sngp`` method's convolution.

    Args:
        filters, kernel_size, strides, padding, activation, use_bias: those of ``keras.layers.Conv2D``
            (channels last).
        norm_multiplier, power_iterations, seed: those of :class:`SpectralNormalization`.
        kl_weight: None (the zoo passes it to every layer; this one has no KL term).

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.SpectralConv2D(2, 3, padding="same", seed=0)
        >>> tuple(layer(np.ones((1, 5, 5, 1), "float32")).shape)
        (1, 5, 5, 2)
    """

    _ARGS = ("filters", "kernel_size", "strides", "padding", "activation", "use_bias")

    def __init__(self, filters, kernel_size, strides=1, padding="valid", activation=None, use_bias=True,
                 norm_multiplier=0.95, power_iterations=1, seed=None, kl_weight=None, **kwargs):
        inner = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding=padding, activation=activation,
                                    use_bias=use_bias, dtype=kwargs.get("dtype"))
        super().__init__(inner, norm_multiplier, power_iterations, seed, kl_weight, kwargs)
