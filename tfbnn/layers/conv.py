"""Bayes-by-Backprop convolutions: reparameterization and Flipout, 1-D and 2-D.

Same model as the dense layers (:mod:`tfbnn.layers.dense`): an independent
Gaussian posterior per kernel weight, ``q(w) = N(mu, sigma^2)`` with
``sigma = softplus(rho)`` (or the log-variance parameterization), priors by name or
object, the KL closed form for a Normal prior and Monte Carlo for the scale mixture,
added as ``kl_weight * KL``; the same sampling switch, seeds and serialization.

* ``Conv{1,2}DReparameterization``: one kernel sample ``W = mu + sigma * eps`` per
  call, shared by the batch; ``y = conv(x, W) + b``.
* ``Conv{1,2}DFlipout``: ``y = conv(x, mu) + conv(x * s_in, sigma * eps) * s_out``
  with random signs per example and channel (Wen et al. 2018, sec. 3), so the
  examples of a batch see pseudo-independent kernels; two convolutions per call.

Monte Carlo prediction (:func:`tfbnn.weight_samples`): a convolution kernel is
shared across positions, so per-row local reparameterization would not be exact;
both layers always draw T independent kernels, one per block of B rows
(``joint`` and per-row modes coincide), and convolve block by block.

Channels-last inputs: ``(batch, length, channels)`` or ``(batch, height, width, channels)``.
"""

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn import kl as kl_lib
from tfbnn.layers._conv_utils import conv_output_shape, positive_ints
from tfbnn.layers.dense import DenseBayesian

__all__ = ["Conv1DReparameterization", "Conv1DFlipout", "Conv2DReparameterization", "Conv2DFlipout"]

_PADDINGS = ("valid", "same")


class _ConvBayesian(DenseBayesian):
    """Shared by the Bayesian convolutions: shapes, the convolution, config.

    Args:
        filters: int > 0, output channels.
        kernel_size: int or tuple of ``rank`` ints.
        strides: int or tuple. Default 1.
        padding: ``"valid"`` (default) or ``"same"``.
        dilation_rate: int or tuple. Default 1.
        activation, use_bias, kernel_prior, bias_prior, initializers, kl_weight,
        inference_mode, seed, parameterization: as the dense layers.
    """

    rank = 2

    def __init__(self, filters, kernel_size, strides=1, padding="valid", dilation_rate=1, **kwargs):
        filters = checks.integer("filters", filters, 1)
        super().__init__(units=filters, **kwargs)
        self.filters = filters
        self.kernel_size = positive_ints("kernel_size", kernel_size, self.rank)
        self.strides = positive_ints("strides", strides, self.rank)
        self.dilation_rate = positive_ints("dilation_rate", dilation_rate, self.rank)
        if padding not in _PADDINGS:
            raise ValueError(f"Expected `padding` in {_PADDINGS}. Received: padding={padding!r}")
        self.padding = padding

    def build(self, input_shape):
        if len(input_shape) != self.rank + 2:
            raise ValueError(
                f"Layer '{self.name}' expects inputs of rank {self.rank + 2} "
                f"(batch, {'spatial, ' * self.rank}channels). Received: input_shape={tuple(input_shape)}"
            )
        super().build(input_shape)
        self.input_spec = keras.layers.InputSpec(ndim=self.rank + 2, axes={-1: input_shape[-1]})

    def _kernel_shape(self, input_dim):
        return self.kernel_size + (input_dim, self.filters)

    def _conv(self, inputs, kernel):
        self.compute_output_shape(inputs.shape)  # rejects inputs smaller than the kernel
        return keras.ops.conv(inputs, kernel, strides=self.strides, padding=self.padding,
                              dilation_rate=self.dilation_rate, data_format="channels_last")

    def _convolve(self, inputs, kernel):
        """``conv(inputs, kernel)``; a kernel with a leading T axis is applied per block of rows."""
        if kernel.shape.rank == self.rank + 2:
            return self._conv(inputs, kernel)
        num = tf.shape(kernel)[0]
        blocks = tf.reshape(inputs, tf.concat([[num, -1], tf.shape(inputs)[1:]], axis=0))
        outputs = tf.map_fn(lambda pair: self._conv(pair[0], pair[1]), (blocks, kernel),
                            fn_output_signature=inputs.dtype)
        return tf.reshape(outputs, tf.concat([[-1], tf.shape(outputs)[2:]], axis=0))

    def _kernel_noise_shape(self, num_samples):
        shape = tf.shape(self.kernel_loc)
        return shape if num_samples == 1 else tf.concat([[num_samples], shape], axis=0)

    def compute_output_shape(self, input_shape):
        return conv_output_shape(input_shape, self.filters, self.kernel_size, self.strides, self.padding,
                                 self.dilation_rate)

    def get_config(self):
        config = super().get_config()
        config.pop("units")
        config.update({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
                       "padding": self.padding, "dilation_rate": self.dilation_rate})
        return config


class _ConvReparameterization(_ConvBayesian):
    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        if sampling:
            kernel, kl = self._sample(loc, scale, self.kernel_prior, self._num_samples(sampling), kl)
        else:
            kernel, kl = loc, self._kl(loc, scale, self.kernel_prior, kl)
        bias, bias_kl = self._bias(sampling)
        return self._finish(self._convolve(inputs, kernel), bias, kl + bias_kl, training)


class _ConvFlipout(_ConvBayesian):
    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        outputs = self._conv(inputs, loc)
        if sampling:
            num_samples = self._num_samples(sampling)
            eps = self._normal(self._kernel_noise_shape(num_samples), loc.dtype)
            delta = scale * eps
            s_in, s_out = self._signs(inputs)
            outputs = outputs + self._convolve(inputs * s_in, delta) * s_out
            if kl is None:
                kl = kl_lib.monte_carlo_kl(loc + delta, eps, scale, self.kernel_prior) / num_samples
        else:
            kl = self._kl(loc, scale, self.kernel_prior, kl)
        bias, bias_kl = self._bias(sampling)
        return self._finish(outputs, bias, kl + bias_kl, training)

    def _signs(self, inputs):
        """Random signs per example and channel, broadcast over positions (as TFP does)."""
        batch = tf.shape(inputs)[:1]
        ones = tf.ones([self.rank], tf.int32)
        seeds = tf.random.experimental.stateless_split(self._next_seed(), 2)
        s_in = self._rademacher(tf.concat([batch, ones, tf.shape(inputs)[-1:]], 0), inputs.dtype, seeds[0])
        s_out = self._rademacher(tf.concat([batch, ones, [self.filters]], 0), inputs.dtype, seeds[1])
        return s_in, s_out


_DOC = """Bayes-by-Backprop {rank}-D convolution, {estimator} estimator.

    {math}

    Args: ``filters``, ``kernel_size``, ``strides``, ``padding``, ``dilation_rate`` as
    ``keras.layers.Conv{rank}D``; priors, initializers, ``kl_weight``, ``inference_mode``,
    ``seed``, ``parameterization`` as :class:`tfbnn.layers.DenseReparameterization`.

    Input shape: ``(batch, {spatial}channels)``; output ``(batch, {spatial}filters)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.Conv{rank}D{name}(4, 3, padding="same", kl_weight=1e-3, seed=1)
        >>> layer(np.ones((2, {example}3), "float32")).shape[-1]
        4

    Reference:
        {reference}
"""
_REPARAM = dict(estimator="reparameterization", name="Reparameterization",
                math="One kernel sample ``W = mu + sigma * eps`` per call; ``y = activation(conv(x, W) + b)``.",
                reference="Blundell et al. Weight Uncertainty in Neural Networks. ICML 2015.")
_FLIPOUT = dict(estimator="Flipout", name="Flipout",
                math="``y = activation(conv(x, mu) + conv(x * s_in, sigma * eps) * s_out + b)`` with random "
                     "signs ``s_in``, ``s_out`` per example and channel.",
                reference="Wen et al. Flipout: Efficient Pseudo-Independent Weight Perturbations on "
                          "Mini-Batches. ICLR 2018.")


def _make(base, rank, doc):
    name = f"Conv{rank}D{doc['name']}"
    spatial = "length, " if rank == 1 else "height, width, "
    example = "8, " if rank == 1 else "8, 8, "
    cls = type(name, (base,), {
        "rank": rank,
        "__doc__": _DOC.format(rank=rank, spatial=spatial, example=example, **doc),
        "__module__": __name__,
    })
    return keras.saving.register_keras_serializable(package="tfbnn")(cls)


Conv1DReparameterization = _make(_ConvReparameterization, 1, _REPARAM)
Conv2DReparameterization = _make(_ConvReparameterization, 2, _REPARAM)
Conv1DFlipout = _make(_ConvFlipout, 1, _FLIPOUT)
Conv2DFlipout = _make(_ConvFlipout, 2, _FLIPOUT)
