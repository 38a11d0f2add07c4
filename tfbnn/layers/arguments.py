"""The shape families' arguments: what makes a posterior a dense layer or a convolution.

A tfbnn weight layer is a posterior family (:class:`tfbnn.layers.MeanFieldGaussian`,
the variational-dropout posterior, the iBNN node noise) combined with a shape family,
a mixin listed first among the bases:

* :class:`DenseArguments`: ``units``; kernel ``(input_dim, units)``, ``y = x W``.
* :class:`ConvArguments`: ``filters``, ``kernel_size``, ``strides``, ``padding``,
  ``data_format``, ``dilation_rate`` of ``keras.layers.Conv{rank}D``, for any ``rank``
  the Keras convolution takes (1, 2, 3); kernel ``kernel_size + (channels, filters)``.
* :class:`ConvTransposeArguments`: those and ``output_padding``, of
  ``keras.layers.Conv{rank}DTranspose``; kernel ``kernel_size + (filters, channels)``.

The mixin takes its arguments in ``__init__`` (before the posterior's), checks the
input in ``build`` and asks the posterior for its weights (``build_posterior(kernel_shape,
bias_shape)``), and gives the posterior its operation (``forward(inputs, kernel)``) and
its bias (``add_bias(outputs, bias)``), the output shape and its part of the config.
"""

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.layers import conv_gradient
from tfbnn.layers.base import input_features

__all__ = ["DenseArguments", "ConvArguments", "ConvTransposeArguments", "conv_output_length", "conv_output_shape",
           "conv_transpose_output_length", "dilate", "positive_ints"]


def conv_output_length(length, kernel, stride, padding, dilation):
    """Output length of one spatial axis (None stays None), as ``keras.layers.Conv*``."""
    if length is None:
        return None
    if padding == "same":
        return (length + stride - 1) // stride
    return (length - ((kernel - 1) * dilation + 1)) // stride + 1


def conv_output_shape(input_shape, filters, kernel_size, strides, padding, dilation_rate,
                      data_format="channels_last"):
    """Output shape of a convolution over ``len(kernel_size)`` spatial axes."""
    rank = len(kernel_size)
    first = 1 if data_format == "channels_last" else 2
    sizes = [
        conv_output_length(input_shape[first + i], kernel_size[i], strides[i], padding, dilation_rate[i])
        for i in range(rank)
    ]
    if any(size is not None and size < 1 for size in sizes):
        # As keras.layers.Conv*D. TensorFlow's CPU convolution itself returns a wrong
        # output instead of failing for such inputs.
        raise ValueError(
            "Expected inputs at least as large as the dilated kernel ((kernel_size - 1) * dilation_rate + 1) "
            f"with padding='valid': the output would be empty. Received: input_shape={tuple(input_shape)}, "
            f"kernel_size={tuple(kernel_size)}, dilation_rate={tuple(dilation_rate)}, padding={padding!r}"
        )
    if data_format == "channels_last":
        return (input_shape[0], *sizes, filters)
    return (input_shape[0], filters, *sizes)


def positive_ints(name, value, rank):
    """``value`` as ``rank`` positive ints (an int ``n`` gives ``(n,) * rank``); else a ValueError naming ``name``."""
    what = "a positive int or a pair of them" if rank == 2 else f"a positive int or {rank} positive ints"
    return _ints(name, value, rank, 1, what)


def _ints(name, value, rank, minimum, what):
    """``value`` as ``rank`` ints >= ``minimum`` (an int ``n`` gives ``(n,) * rank``); else a ValueError."""
    values = (value,) * rank if checks.is_integer(value) else value
    if (
        not isinstance(values, (tuple, list))
        or len(values) != rank
        or not all(checks.is_integer(v) and v >= minimum for v in values)
    ):
        raise ValueError(f"Expected `{name}` to be {what}. Received: {name}={value!r}")
    return tuple(int(v) for v in values)


PADDINGS = ("valid", "same")
DATA_FORMATS = ("channels_last", "channels_first")


class DenseArguments:
    """The dense shape family: ``units``, kernel ``(input_dim, units)``, ``y = x W + b``.

    Listed first among the bases of a layer whose posterior class provides
    ``build_posterior(kernel_shape, bias_shape)`` (:class:`tfbnn.layers.MeanFieldGaussian`
    does). It takes ``units`` in front of the posterior's arguments, checks the inputs
    (rank >= 2, a known last axis), makes the posterior's weights of shapes
    ``(input_dim, units)`` and ``(units,)`` and applies the kernel to the last axis.

    Args:
        units: int > 0, output dimension.
        *args: the posterior's arguments, in its order, after ``units``.
        **kwargs: the posterior's arguments by name.

    Input shape: ``(batch, ..., input_dim)``. Output shape: ``(batch, ..., units)``.

    Example:
        A Bayes-by-Backprop dense layer (reparameterization; tfbnn's own
        :class:`tfbnn.layers.DenseReparameterization` adds exact per-example samples
        in Monte Carlo prediction):

        >>> import numpy as np, tfbnn
        >>> class BayesianDense(tfbnn.layers.DenseArguments, tfbnn.layers.MeanFieldGaussian):
        ...     pass
        >>> layer = BayesianDense(3, activation="relu", kl_weight=1e-3, seed=0)
        >>> layer(np.ones((2, 4), "float32")).shape, tuple(layer.kernel_loc.shape)
        (TensorShape([2, 3]), (4, 3))
    """

    #: The axis of the inputs that the kernel contracts (the features).
    channel_axis = -1

    def __init__(self, units, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.units = checks.integer("units", units, 1)

    def build(self, input_shape):
        input_dim = input_features(self, input_shape)
        self.build_posterior((input_dim, self.units), (self.units,))
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})

    def forward(self, inputs, kernel):
        """``inputs @ kernel``, in the dtype of the inputs (the compute dtype under mixed precision)."""
        return keras.ops.matmul(inputs, tf.cast(kernel, inputs.dtype))

    def add_bias(self, outputs, bias):
        """``outputs + bias``, a bias of shape ``(units,)``, in the dtype of the outputs."""
        return outputs + tf.cast(bias, outputs.dtype)

    def _flipout_signs(self, inputs):
        """Flipout's random signs: one per input element and one per output unit of each row."""
        in_shape = tf.shape(inputs)
        out_shape = tf.concat([in_shape[:-1], [self.units]], axis=0)
        return self._rademacher_pair(in_shape, out_shape, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config["units"] = self.units
        return config


class ConvArguments:
    """The convolution shape family: the arguments of ``keras.layers.Conv{rank}D``.

    Listed first among the bases of a layer whose posterior class provides
    ``build_posterior(kernel_shape, bias_shape)``; the subclass sets ``rank`` (the number
    of spatial axes: 1, 2 or 3; default 2). It takes ``filters``, ``kernel_size``,
    ``strides``, ``padding``, ``data_format`` and ``dilation_rate`` in front of the
    posterior's arguments and checks them, checks the input's rank and channels, makes
    the posterior's weights of shapes ``kernel_size + (channels, filters)`` and
    ``(filters,)``, and gives the convolution (:meth:`forward`), the per-channel bias
    (:meth:`add_bias`), the output shape and the config. The Bayes-by-Backprop,
    variational-dropout and node convolutions are built this way.

    Args:
        filters: int > 0, output channels.
        kernel_size: int or tuple of ``rank`` ints.
        strides: int or tuple. Default 1.
        padding: ``"valid"`` (default) or ``"same"``.
        data_format: ``"channels_last"`` (default) or ``"channels_first"``.
        dilation_rate: int or tuple. Default 1.
        **kwargs: the posterior's arguments.

    Input shape: ``(batch, *spatial, channels)`` (channels_first: ``(batch, channels, *spatial)``).

    Example:
        A Bayes-by-Backprop 3-D convolution, as :class:`tfbnn.layers.Conv3DReparameterization`
        is made (register a class of your own with
        ``keras.saving.register_keras_serializable`` to save it in ``.keras`` files):

        >>> import numpy as np, tfbnn
        >>> class Conv3DReparameterization(tfbnn.layers.ConvArguments, tfbnn.layers.MeanFieldGaussian):
        ...     rank = 3
        >>> layer = Conv3DReparameterization(2, 3, padding="same", kl_weight=1e-3, seed=0)
        >>> layer(np.ones((1, 4, 4, 4, 1), "float32")).shape
        TensorShape([1, 4, 4, 4, 2])
    """

    rank = 2

    def __init__(self, filters, kernel_size, strides=1, padding="valid", data_format="channels_last",
                 dilation_rate=1, **kwargs):
        super().__init__(**kwargs)
        self.filters = checks.integer("filters", filters, 1)
        self.kernel_size = positive_ints("kernel_size", kernel_size, self.rank)
        self.strides = positive_ints("strides", strides, self.rank)
        self.dilation_rate = positive_ints("dilation_rate", dilation_rate, self.rank)
        if padding not in PADDINGS:
            raise ValueError(f"Expected `padding` in {PADDINGS}. Received: padding={padding!r}")
        if data_format not in DATA_FORMATS:
            raise ValueError(f"Expected `data_format` in {DATA_FORMATS}. Received: data_format={data_format!r}")
        self.padding, self.data_format = padding, data_format

    @property
    def channel_axis(self):
        return -1 if self.data_format == "channels_last" else 1

    def input_channels(self, input_shape):
        """The number of input channels; a ValueError for a wrong rank or unknown channels."""
        if len(input_shape) != self.rank + 2:
            spatial = "spatial, " * self.rank
            layout = f"(batch, {spatial}channels)" if self.data_format == "channels_last" else (
                f"(batch, channels, {spatial[:-2]})")
            raise ValueError(
                f"Layer '{self.name}' expects inputs of rank {self.rank + 2} {layout}. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        channels = input_shape[self.channel_axis]
        if channels is None:
            raise ValueError(
                f"The channel dimension of the inputs of '{self.name}' must be known. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        return channels

    def build(self, input_shape):
        channels = self.input_channels(input_shape)
        self.build_posterior(self.kernel_size + (channels, self.filters), (self.filters,))
        self.input_spec = keras.layers.InputSpec(ndim=self.rank + 2, axes={self.channel_axis: channels})

    def forward(self, inputs, kernel):
        """``conv(inputs, kernel)`` with the layer's arguments (kernel ``kernel_size + (in, filters)``)."""
        self.compute_output_shape(inputs.shape)  # rejects inputs smaller than the kernel
        return self.channels_last(conv_gradient.convolve, inputs, tf.cast(kernel, inputs.dtype),
                                  strides=self.strides, padding=self.padding, dilation_rate=self.dilation_rate)

    def channels_last(self, op, inputs, kernel, **arguments):
        """``op(inputs, kernel, data_format="channels_last", **arguments)`` in the layer's layout.

        TensorFlow's CPU convolutions (Eigen's kernels) take only NHWC: where oneDNN
        does not take over (AMD and ARM CPUs, or ``TF_ENABLE_ONEDNN_OPTS=0``) an NCHW
        convolution fails with ``UnimplementedError``. So a channels_first layer moves the
        channels last, convolves, and moves them back, as Keras' TensorFlow backend pools
        channels_first inputs. It does so on every device, so a layer computes the same
        numbers on every CPU and draws its noise (in its own layout, outside this op)
        from the same seeds either way.
        """
        if self.data_format == "channels_last":
            return op(inputs, kernel, data_format="channels_last", **arguments)
        outputs = op(tf.transpose(inputs, [0, *range(2, self.rank + 2), 1]), kernel, data_format="channels_last",
                     **arguments)
        return tf.transpose(outputs, [0, self.rank + 1, *range(1, self.rank + 1)])

    def channel_shape(self, leading=()):
        """The shape that broadcasts a per-channel vector over the outputs' positions."""
        ones = [1] * self.rank
        if self.data_format == "channels_last":
            return [*leading, *ones, self.filters]
        return [*leading, self.filters, *ones]

    def add_bias(self, outputs, bias):
        """``outputs`` plus a per-filter ``bias`` of shape ``(filters,)``, in the dtype of the outputs."""
        bias = tf.cast(bias, outputs.dtype)
        if self.data_format == "channels_last":
            return outputs + bias
        return outputs + tf.reshape(bias, self.channel_shape())

    def _flipout_signs(self, inputs):
        """Flipout's random signs per example and channel, broadcast over positions (as TFP does)."""
        batch = tf.shape(inputs)[:1]
        ones = tf.ones([self.rank], tf.int32)
        channels = tf.shape(inputs)[self.channel_axis:][:1]
        if self.data_format == "channels_last":
            in_shape, out_shape = [batch, ones, channels], [batch, ones, [self.filters]]
        else:
            in_shape, out_shape = [batch, channels, ones], [batch, [self.filters], ones]
        return self._rademacher_pair(tf.concat(in_shape, 0), tf.concat(out_shape, 0), inputs.dtype)

    def compute_output_shape(self, input_shape):
        return conv_output_shape(input_shape, self.filters, self.kernel_size, self.strides, self.padding,
                                 self.dilation_rate, self.data_format)

    def get_config(self):
        config = super().get_config()
        config.update({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
                       "padding": self.padding, "data_format": self.data_format,
                       "dilation_rate": self.dilation_rate})
        return config


def conv_transpose_output_length(length, kernel, stride, padding, output_padding, dilation):
    """Output length of one spatial axis of a transposed convolution (None stays None), as
    ``keras.layers.Conv*DTranspose``: with ``k = (kernel - 1) * dilation + 1``,
    ``length * stride + max(k - stride, 0)`` ("valid") or ``length * stride`` ("same");
    with an ``output_padding`` ``p``, ``(length - 1) * stride + k - 2 pad + p``, ``pad``
    ``k // 2`` ("same") or 0 ("valid")."""
    if length is None:
        return None
    dilated = (kernel - 1) * dilation + 1
    if output_padding is None:
        return length * stride + (max(dilated - stride, 0) if padding == "valid" else 0)
    pad = dilated // 2 if padding == "same" else 0
    return (length - 1) * stride + dilated - 2 * pad + output_padding


def dilate(kernel, dilation_rate):
    """``kernel`` (spatial axes first) with ``dilation - 1`` zeros between its taps on each spatial axis.

    A convolution with kernel ``W`` and dilation ``d`` is the convolution with this kernel of
    length ``(k - 1) d + 1`` and dilation 1 (the "a trous" kernel), for the transposed
    convolution too. TensorFlow's Eigen CPU kernels (AMD and ARM CPUs,
    ``TF_ENABLE_ONEDNN_OPTS=0``) have no dilated transposed convolution
    (``Conv2DBackpropInput``: "Current CPU implementations do not yet support dilation rates
    larger than 1"), so the transposed layers convolve with the dilated kernel on every
    device. Gradients flow to ``kernel``; a rate of 1 returns ``kernel`` itself.

    Args:
        kernel: a tensor of shape ``kernel_size + (a, b)``, the spatial axes first.
        dilation_rate: one positive int per spatial axis.

    Returns:
        The kernel of shape ``((k_i - 1) d_i + 1 for each axis) + (a, b)``, its taps at
        multiples of ``d_i``.

    Example:
        >>> import numpy as np
        >>> from tfbnn.layers.arguments import dilate
        >>> dilate(np.ones((2, 1, 1), "float32"), (3,))[:, 0, 0].numpy()
        array([1., 0., 0., 1.], dtype=float32)
    """
    for axis, rate in enumerate(dilation_rate):
        if rate == 1:
            continue
        shape = tf.shape(kernel)
        taps = kernel.shape[axis]
        spread = tf.pad(tf.expand_dims(kernel, axis + 1),
                        [[0, 0]] * (axis + 1) + [[0, rate - 1]] + [[0, 0]] * (len(kernel.shape) - axis - 1))
        spread = tf.reshape(spread, tf.concat([shape[:axis], [taps * rate], shape[axis + 1:]], 0))
        kernel = spread[(slice(None),) * axis + (slice(0, (taps - 1) * rate + 1),)]
    return kernel


class ConvTransposeArguments(ConvArguments):
    """The transposed-convolution shape family: the arguments of ``keras.layers.Conv{rank}DTranspose``.

    :class:`ConvArguments` with ``output_padding`` (None, an int or ``rank`` ints, each
    smaller than its stride, as Keras requires), the kernel shape of Keras' transposed
    convolutions, ``kernel_size + (filters, channels)``, and the transposed convolution
    (``keras.ops.conv_transpose``, the gradient of a convolution with respect to its
    input) as the operation. Each output position ``o`` gathers ``x[i] W[k]`` over
    ``o = i * stride + k * dilation - pad``: a convolution run backwards, the
    upsampling layer of decoders and segmentation nets. ``dilation_rate`` above 1 with
    ``strides`` above 1 is rejected, as TensorFlow's op rejects it.

    Args:
        filters, kernel_size, strides, padding, data_format, dilation_rate: as
            :class:`ConvArguments`.
        output_padding: None (default: the output length is ``input * stride`` for
            ``"same"``) or ints in ``[0, stride)``: extra length on one side.
        **kwargs: the posterior's arguments.

    Input shape: ``(batch, *spatial, channels)`` (channels_first: ``(batch, channels, *spatial)``).

    Example:
        >>> import numpy as np, tfbnn
        >>> class Deconv(tfbnn.layers.ConvTransposeArguments, tfbnn.layers.MeanFieldGaussian):
        ...     rank = 1
        >>> layer = Deconv(2, 3, strides=2, output_padding=1, kl_weight=1e-3, seed=0)
        >>> layer(np.ones((1, 5, 4), "float32")).shape, tuple(layer.kernel_loc.shape)
        (TensorShape([1, 12, 2]), (3, 2, 4))
    """

    def __init__(self, filters, kernel_size, strides=1, padding="valid", output_padding=None,
                 data_format="channels_last", dilation_rate=1, **kwargs):
        super().__init__(filters, kernel_size, strides=strides, padding=padding, data_format=data_format,
                         dilation_rate=dilation_rate, **kwargs)
        if output_padding is not None:
            output_padding = _ints("output_padding", output_padding, self.rank, 0, f"None, an int >= 0 or {self.rank} of them")
            if any(p >= s for p, s in zip(output_padding, self.strides)):
                raise ValueError(
                    "Expected each `output_padding` smaller than its stride. "
                    f"Received: output_padding={output_padding}, strides={self.strides}"
                )
        if max(self.strides) > 1 and max(self.dilation_rate) > 1:
            raise ValueError(
                "Expected `strides` or `dilation_rate` to be 1 in a transposed convolution (TensorFlow "
                f"supports no other). Received: strides={self.strides}, dilation_rate={self.dilation_rate}"
            )
        self.output_padding = output_padding

    def build(self, input_shape):
        channels = self.input_channels(input_shape)
        self.build_posterior(self.kernel_size + (self.filters, channels), (self.filters,))
        self.input_spec = keras.layers.InputSpec(ndim=self.rank + 2, axes={self.channel_axis: channels})

    def forward(self, inputs, kernel):
        """``conv_transpose(inputs, kernel)`` with the layer's arguments (kernel ``kernel_size + (filters, in)``)."""
        return self.channels_last(keras.ops.conv_transpose, inputs, dilate(kernel, self.dilation_rate),
                                  strides=self.strides, padding=self.padding, output_padding=self.output_padding)

    def compute_output_shape(self, input_shape):
        first = 1 if self.data_format == "channels_last" else 2
        padding = self.output_padding or (None,) * self.rank
        sizes = [
            conv_transpose_output_length(input_shape[first + i], self.kernel_size[i], self.strides[i],
                                         self.padding, padding[i], self.dilation_rate[i])
            for i in range(self.rank)
        ]
        if self.data_format == "channels_last":
            return (input_shape[0], *sizes, self.filters)
        return (input_shape[0], self.filters, *sizes)

    def get_config(self):
        config = super().get_config()
        config["output_padding"] = self.output_padding
        return config

