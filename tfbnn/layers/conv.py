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

Inputs are channels-last, ``(batch, length, channels)`` or ``(batch, height,
width, channels)``, or with ``data_format="channels_first"`` ``(batch, channels,
length)`` / ``(batch, channels, height, width)``. The convolution arguments are
those of every tfbnn convolution (:class:`tfbnn.layers._conv_utils.ConvArguments`).
"""

import keras
import tensorflow as tf

from tfbnn import kl as kl_lib
from tfbnn.layers._conv_utils import ConvArguments
from tfbnn.layers.dense import MeanFieldGaussian

__all__ = ["Conv1DReparameterization", "Conv1DFlipout", "Conv2DReparameterization", "Conv2DFlipout"]


class _ConvBayesian(ConvArguments, MeanFieldGaussian):
    """Shared by the Bayesian convolutions: shapes, the convolution, config.

    Args:
        filters: int > 0, output channels.
        kernel_size: int or tuple of ``rank`` ints.
        strides: int or tuple. Default 1.
        padding: ``"valid"`` (default) or ``"same"``.
        data_format: ``"channels_last"`` (default) or ``"channels_first"``.
        dilation_rate: int or tuple. Default 1.
        activation, use_bias, kernel_prior, bias_prior, initializers, kl_weight,
        inference_mode, seed, parameterization: as the dense layers.
    """

    def __init__(self, filters, kernel_size, strides=1, padding="valid", data_format="channels_last",
                 dilation_rate=1, **kwargs):
        super().__init__(**kwargs)
        self.init_conv_arguments(filters, kernel_size, strides, padding, data_format, dilation_rate)

    def build(self, input_shape):
        channels = self.input_channels(input_shape)
        self._build_posterior(self._kernel_shape(channels), (self.filters,))
        self.input_spec = self.conv_input_spec(channels)

    def _kernel_shape(self, input_dim):
        return self.kernel_size + (input_dim, self.filters)

    def _convolve(self, inputs, kernel):
        """``conv(inputs, kernel)``; a kernel with a leading T axis is applied per block of rows."""
        if kernel.shape.rank == self.rank + 2:
            return self.convolution(inputs, kernel)
        num = tf.shape(kernel)[0]
        blocks = tf.reshape(inputs, tf.concat([[num, -1], tf.shape(inputs)[1:]], axis=0))
        outputs = tf.map_fn(lambda pair: self.convolution(pair[0], pair[1]), (blocks, kernel),
                            fn_output_signature=inputs.dtype)
        return tf.reshape(outputs, tf.concat([[-1], tf.shape(outputs)[2:]], axis=0))

    def _add_bias(self, outputs, bias):
        if bias.shape.rank == 1:
            return self.add_channel_bias(outputs, bias)
        # One bias per Monte Carlo sample (T, filters), for each block of rows.
        shape = tf.shape(outputs)
        per_sample = tf.reshape(outputs, tf.concat([tf.shape(bias)[:1], [-1], shape[1:]], 0))
        return tf.reshape(per_sample + tf.reshape(bias, self.channel_shape([-1, 1])), shape)

    def _kernel_noise_shape(self, num_samples):
        shape = tf.shape(self.kernel_loc)
        return shape if num_samples == 1 else tf.concat([[num_samples], shape], axis=0)

    def get_config(self):
        config = super().get_config()
        config.update(self.conv_config())
        return config


class _ConvReparameterizationCall:
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


class _ConvFlipoutCall:
    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        outputs = self.convolution(inputs, loc)
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
        channels = tf.shape(inputs)[self.channel_axis:][:1]
        seeds = tf.random.experimental.stateless_split(self._next_seed(), 2)
        if self.data_format == "channels_last":
            in_shape, out_shape = [batch, ones, channels], [batch, ones, [self.filters]]
        else:
            in_shape, out_shape = [batch, channels, ones], [batch, [self.filters], ones]
        s_in = self._rademacher(tf.concat(in_shape, 0), inputs.dtype, seeds[0])
        s_out = self._rademacher(tf.concat(out_shape, 0), inputs.dtype, seeds[1])
        return s_in, s_out


_ESTIMATORS = {
    "Reparameterization": (
        "reparameterization",
        "One kernel sample ``W = mu + sigma * eps`` per call, shared by the batch;\n"
        "    ``y = activation(conv(x, W) + b)`` (Blundell et al. 2015, sec. 3.2, eq. 3-4).",
        "Blundell et al. Weight Uncertainty in Neural Networks. ICML 2015.",
    ),
    "Flipout": (
        "Flipout",
        "``y = activation(conv(x, mu) + conv(x * s_in, sigma * eps) * s_out + b)`` with\n"
        "    random signs ``s_in``, ``s_out`` per example and channel (Wen et al. 2018,\n"
        "    eq. 3): the examples of a batch see pseudo-independent kernels; two\n"
        "    convolutions per call.",
        "Wen et al. Flipout: Efficient Pseudo-Independent Weight Perturbations on\n"
        "        Mini-Batches. ICLR 2018.",
    ),
}


def _doc(rank, name):
    """The docstring of ``Conv{rank}D{name}``."""
    estimator, math, reference = _ESTIMATORS[name]
    spatial = "length" if rank == 1 else "height, width"
    example = "8, " * rank
    return f"""Bayes-by-Backprop {rank}-D convolution, {estimator} estimator.

    {math}

    Args:
        filters, kernel_size, strides, padding, data_format, dilation_rate: as
            ``keras.layers.Conv{rank}D`` (``data_format`` ``"channels_last"``, the
            default, or ``"channels_first"``).
        activation, use_bias, kernel_prior, bias_prior, kernel_initializer,
            kernel_scale_initializer, bias_initializer, bias_scale_initializer,
            parameterization, kl_weight, inference_mode, seed: as
            :class:`tfbnn.layers.DenseReparameterization`.

    Input shape: ``(batch, {spatial}, channels)`` (channels_first: ``(batch, channels, {spatial})``).
    Output shape: ``(batch, {spatial}, filters)`` (channels_first: ``(batch, filters, {spatial})``).

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.Conv{rank}D{name}(4, 3, padding="same", kl_weight=1e-3, seed=1)
        >>> layer(np.ones((2, {example}3), "float32")).shape
        TensorShape([2, {example}4])
        >>> tfbnn.layers.Conv{rank}D{name}(4, 3, data_format="channels_first", seed=1)(
        ...     np.ones((2, 3, {example[:-2]}), "float32")).shape[1]
        4

    Reference:
        {reference}
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv1DReparameterization(_ConvReparameterizationCall, _ConvBayesian):
    __doc__ = _doc(1, "Reparameterization")
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DReparameterization(_ConvReparameterizationCall, _ConvBayesian):
    __doc__ = _doc(2, "Reparameterization")
    rank = 2


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv1DFlipout(_ConvFlipoutCall, _ConvBayesian):
    __doc__ = _doc(1, "Flipout")
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DFlipout(_ConvFlipoutCall, _ConvBayesian):
    __doc__ = _doc(2, "Flipout")
    rank = 2
