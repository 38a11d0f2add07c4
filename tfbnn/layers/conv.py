"""Bayes-by-Backprop convolutions and transposed convolutions: reparameterization and Flipout, 1-D to 3-D.

Same model as the dense layers (:mod:`tfbnn.layers.dense`): an independent
Gaussian posterior per kernel weight, ``q(w) = N(mu, sigma^2)`` with
``sigma = softplus(rho)`` (or ``scale_parameterization="log_variance"``), priors by name or
object, the KL closed form for a Normal prior and Monte Carlo for the scale mixture,
added as ``kl_weight * KL``; the same sampling switch, seeds and serialization.

* ``Conv{1,2,3}DReparameterization``: one kernel sample ``W = mu + sigma * eps`` per
  call, shared by the batch; ``y = conv(x, W) + b``.
* ``Conv{1,2,3}DFlipout``: ``y = conv(x, mu) + conv(x * s_in, sigma * eps) * s_out``
  with random signs per example and channel (Wen et al. 2018, sec. 3), so the
  examples of a batch see pseudo-independent kernels; two convolutions per call.
* ``Conv{1,2,3}DTranspose{Reparameterization,Flipout}``: the same two estimators on
  the transposed convolution of ``keras.layers.Conv{1,2,3}DTranspose`` (with its
  ``output_padding``; :class:`tfbnn.layers.ConvTransposeArguments`).

The reparameterization layers also take ``posterior="low_rank"`` (a low-rank plus
diagonal covariance over the kernel, see :class:`tfbnn.layers.MeanFieldGaussian`).

Monte Carlo prediction (:func:`tfbnn.weight_samples`): a convolution kernel is
shared across positions, so per-row local reparameterization would not be exact;
both layers always draw T independent kernels, one per block of B rows
(``joint`` and per-row modes coincide), and convolve block by block.

Inputs are channels-last, ``(batch, length, channels)``, ``(batch, height,
width, channels)`` or ``(batch, depth, height, width, channels)``, or with
``data_format="channels_first"`` the channels on axis 1. The convolution arguments are
those of every tfbnn convolution (:class:`tfbnn.layers.ConvArguments`); the posterior
and the estimators are :class:`tfbnn.layers.MeanFieldGaussian`'s and
:class:`tfbnn.layers.mean_field.MeanFieldFlipout`'s, so a convolution of another rank is
``class Conv3DFlipout(ConvArguments, MeanFieldFlipout): rank = 3``.
"""

import keras

from tfbnn.layers.arguments import ConvArguments, ConvTransposeArguments
from tfbnn.layers.mean_field import MeanFieldFlipout, MeanFieldGaussian

__all__ = [
    "Conv1DReparameterization", "Conv1DFlipout", "Conv2DReparameterization", "Conv2DFlipout",
    "Conv3DReparameterization", "Conv3DFlipout",
    "Conv1DTransposeReparameterization", "Conv1DTransposeFlipout", "Conv2DTransposeReparameterization",
    "Conv2DTransposeFlipout", "Conv3DTransposeReparameterization", "Conv3DTransposeFlipout",
]

_SPATIAL = {1: "length", 2: "height, width", 3: "depth, height, width"}


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


def _doc(rank, name, transpose=False):
    """The docstring of ``Conv{rank}D{name}`` (``Conv{rank}DTranspose{name}`` with ``transpose``)."""
    estimator, math, reference = _ESTIMATORS[name]
    spatial = _SPATIAL[rank]
    example = "4, " * rank
    keras_name = f"Conv{rank}DTranspose" if transpose else f"Conv{rank}D"
    cls = f"Conv{rank}DTranspose{name}" if transpose else f"Conv{rank}D{name}"
    kind = "transposed convolution" if transpose else "convolution"
    arguments = "filters, kernel_size, strides, padding, output_padding, data_format, dilation_rate" if transpose \
        else "filters, kernel_size, strides, padding, data_format, dilation_rate"
    if transpose:
        math = math.replace("conv(", "conv_transpose(")
        size, out = "8, " * rank, "16, " * rank
        strides = ", strides=2"
    else:
        size = out = example
        strides = ""
    low_rank = ("\n        posterior, posterior_rank, kernel_factor_initializer: the kernel's posterior,\n"
                "            ``\"mean_field\"`` (default) or ``\"low_rank\"``, see\n"
                "            :class:`tfbnn.layers.MeanFieldGaussian`.") if name == "Reparameterization" else ""
    return f"""Bayes-by-Backprop {rank}-D {kind}, {estimator} estimator.

    {math}

    Args:
        {arguments}: as
            ``keras.layers.{keras_name}`` (``data_format`` ``"channels_last"``, the
            default, or ``"channels_first"``).
        activation, use_bias, kernel_prior, bias_prior, kernel_initializer,
            kernel_scale_initializer, bias_initializer, bias_scale_initializer,
            scale_parameterization, kl_weight, inference_mode, seed: as
            :class:`tfbnn.layers.DenseReparameterization`.{low_rank}

    Input shape: ``(batch, {spatial}, channels)`` (channels_first: ``(batch, channels, {spatial})``).
    Output shape: ``(batch, {spatial}, filters)`` (channels_first: ``(batch, filters, {spatial})``).

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.{cls}(4, 3{strides}, padding="same", kl_weight=1e-3, seed=1)
        >>> layer(np.ones((2, {size}3), "float32")).shape
        TensorShape([2, {out}4])
        >>> tfbnn.layers.{cls}(4, 3, data_format="channels_first", seed=1)(
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


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv3DReparameterization(ConvArguments, MeanFieldGaussian):
    __doc__ = _doc(3, "Reparameterization")
    rank = 3


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv3DFlipout(ConvArguments, MeanFieldFlipout):
    __doc__ = _doc(3, "Flipout")
    rank = 3


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv1DTransposeReparameterization(ConvTransposeArguments, MeanFieldGaussian):
    __doc__ = _doc(1, "Reparameterization", transpose=True)
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv1DTransposeFlipout(ConvTransposeArguments, MeanFieldFlipout):
    __doc__ = _doc(1, "Flipout", transpose=True)
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DTransposeReparameterization(ConvTransposeArguments, MeanFieldGaussian):
    __doc__ = _doc(2, "Reparameterization", transpose=True)
    rank = 2


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DTransposeFlipout(ConvTransposeArguments, MeanFieldFlipout):
    __doc__ = _doc(2, "Flipout", transpose=True)
    rank = 2


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv3DTransposeReparameterization(ConvTransposeArguments, MeanFieldGaussian):
    __doc__ = _doc(3, "Reparameterization", transpose=True)
    rank = 3


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv3DTransposeFlipout(ConvTransposeArguments, MeanFieldFlipout):
    __doc__ = _doc(3, "Flipout", transpose=True)
    rank = 3
