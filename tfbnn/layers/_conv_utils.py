"""Shape arithmetic shared by the convolutional layer families."""

from tfbnn._internal import checks

__all__ = ["conv_output_length", "conv_output_shape", "positive_ints", "pair"]


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
