"""Convolution arguments and shape arithmetic shared by the convolutional layer families."""

import keras
import tensorflow as tf

from tfbnn._internal import checks

__all__ = ["conv_output_length", "conv_output_shape", "positive_ints", "pair", "ConvArguments"]


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
    values = (value,) * rank if checks.is_integer(value) else value
    if (
        not isinstance(values, (tuple, list))
        or len(values) != rank
        or not all(checks.is_integer(v) and v > 0 for v in values)
    ):
        what = "a positive int or a pair of them" if rank == 2 else f"a positive int or {rank} positive ints"
        raise ValueError(f"Expected `{name}` to be {what}. Received: {name}={value!r}")
    return tuple(int(v) for v in values)


def pair(name, value):
    """``value`` as a pair of positive ints (an int ``n`` gives ``(n, n)``); else a ValueError naming ``name``."""
    return positive_ints(name, value, 2)


PADDINGS = ("valid", "same")
DATA_FORMATS = ("channels_last", "channels_first")


class ConvArguments:
    """The convolution arguments every conv family shares (mixed into a Keras layer).

    ``filters``, ``kernel_size``, ``strides``, ``padding``, ``data_format`` and
    ``dilation_rate`` as in ``keras.layers.Conv{rank}D``: their validation, the input
    rank and channel check, the output shape, the convolution and the per-channel
    bias, for the Bayes-by-Backprop, variational-dropout and node convolutions.
    A subclass sets ``rank`` (the number of spatial axes) and calls
    :meth:`init_conv_arguments` in its constructor.
    """

    rank = 2

    def init_conv_arguments(self, filters, kernel_size, strides=1, padding="valid", data_format="channels_last",
                            dilation_rate=1):
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

    def conv_input_spec(self, channels):
        return keras.layers.InputSpec(ndim=self.rank + 2, axes={self.channel_axis: channels})

    def convolution(self, inputs, kernel):
        """``conv(inputs, kernel)`` with the layer's arguments (kernel ``kernel_size + (in, filters)``)."""
        self.compute_output_shape(inputs.shape)  # rejects inputs smaller than the kernel
        return keras.ops.conv(inputs, kernel, strides=self.strides, padding=self.padding,
                              dilation_rate=self.dilation_rate, data_format=self.data_format)

    def channel_shape(self, leading=()):
        """The shape that broadcasts a per-channel vector over the outputs' positions."""
        ones = [1] * self.rank
        if self.data_format == "channels_last":
            return [*leading, *ones, self.filters]
        return [*leading, self.filters, *ones]

    def add_channel_bias(self, outputs, bias):
        """``outputs`` plus a per-filter ``bias`` of shape ``(filters,)``."""
        if self.data_format == "channels_last":
            return outputs + bias
        return outputs + tf.reshape(bias, self.channel_shape())

    def compute_output_shape(self, input_shape):
        return conv_output_shape(input_shape, self.filters, self.kernel_size, self.strides, self.padding,
                                 self.dilation_rate, self.data_format)

    def conv_config(self):
        return {"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
                "padding": self.padding, "data_format": self.data_format, "dilation_rate": self.dilation_rate}
