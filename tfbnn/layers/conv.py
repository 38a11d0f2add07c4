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
those of every tfbnn convolution (:class:`tfbnn.layers.ConvArguments`); the posterior
and the estimators are :class:`tfbnn.layers.MeanFieldGaussian`'s and
:class:`tfbnn.layers.mean_field.MeanFieldFlipout`'s, so a convolution of another rank is
``class Conv3DFlipout(ConvArguments, MeanFieldFlipout): rank = 3``.
"""

import keras

from tfbnn.layers.arguments import ConvArguments
from tfbnn.layers.mean_field import MeanFieldFlipout, MeanFieldGaussian

__all__ = ["Conv1DReparameterization", "Conv1DFlipout", "Conv2DReparameterization", "Conv2DFlipout"]


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
class Conv1DReparameterization(ConvArguments, MeanFieldGaussian):
    __doc__ = _doc(1, "Reparameterization")
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DReparameterization(ConvArguments, MeanFieldGaussian):
    __doc__ = _doc(2, "Reparameterization")
    rank = 2


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv1DFlipout(ConvArguments, MeanFieldFlipout):
    __doc__ = _doc(1, "Flipout")
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DFlipout(ConvArguments, MeanFieldFlipout):
    __doc__ = _doc(2, "Flipout")
    rank = 2
