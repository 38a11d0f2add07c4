"""The input gradient of a stride-1 convolution as a forward convolution (opt-in).

With Eigen's CPU kernels (AMD and ARM CPUs, ``TF_ENABLE_ONEDNN_OPTS=0``) TensorFlow's input
gradient of a convolution (``Conv2DBackpropInput``) is several times slower than a forward
convolution of the same size on small maps with many channels; oneDNN's is not. For a
stride-1 convolution the input gradient *is* a forward convolution, of the zero-padded
output gradient with the kernel flipped along its spatial axes and its channel axes swapped:

    y = conv(x, W)  (stride 1, dilation d, padding p_lo / p_hi per axis)
    dL/dx = conv(pad(dL/dy, (k' - 1 - p_lo, k' - 1 - p_hi)), flip(W)^T)  ("valid", dilation d)

with ``k' = (k - 1) d + 1`` (Dumoulin & Visin 2016, "A guide to convolution arithmetic",
sec. 4.1-4.3: the transposed convolution of a stride-1 convolution).
:func:`set_conv_input_gradient` ``("forward")`` makes every tfbnn convolution
(Bayes-by-Backprop, variational dropout, node noise, BatchEnsemble, rank-1: the layers built on
:class:`tfbnn.layers.ConvArguments`) take that gradient in compiled functions; the kernel
gradient stays TensorFlow's. It is opt-in because it changes a trained model's numbers at
float32 rounding (the two gradients sum in different orders): the studies pinned in
``tests/fixtures/study_pins.json`` were pinned with TensorFlow's gradient. Measured by
``python benchmarks/conv_gradient.py`` (benchmarks/README.md, "The input gradient of a
convolution").
"""

import keras
import tensorflow as tf

#: The ways a tfbnn convolution takes its input gradient: ``"tensorflow"`` (TensorFlow's
#: registered gradient, the default) and ``"forward"`` (a forward convolution, stride 1 only).
CONV_INPUT_GRADIENTS = ("tensorflow", "forward")

_mode = "tensorflow"


def set_conv_input_gradient(mode):
    """Chooses how tfbnn's convolutions take their input gradient, in every function traced from now on.

    The mode is read when a function is traced: a model whose train step was traced before the
    call keeps the gradient it was traced with (compile it again to retrace).

    ``"forward"``: a stride-1 convolution's input gradient is the forward convolution of the
    padded output gradient with the flipped, channel-swapped kernel (module docstring), in
    compiled functions (``model.fit``, ``tf.function``, XLA); eager gradients, strided
    convolutions and transposed convolutions keep TensorFlow's. ``"tensorflow"`` (the
    default): TensorFlow's registered gradient everywhere. The forward pass and the KL are
    the same either way; the gradients agree to float32 rounding.

    Args:
        mode: one of :data:`CONV_INPUT_GRADIENTS`.

    Returns:
        The mode before the call (to restore it).

    Example:
        >>> import numpy as np, tensorflow as tf, tfbnn
        >>> layer = tfbnn.layers.Conv2DReparameterization(4, 3, padding="same", inference_mode="mean", seed=0)
        >>> x = tf.constant(np.random.default_rng(0).normal(size=(2, 5, 5, 3)), tf.float32)
        >>> @tf.function
        ... def input_gradient(x):
        ...     with tf.GradientTape() as tape:
        ...         tape.watch(x)
        ...         y = layer(x)
        ...     return tape.gradient(y, x)
        >>> reference = input_gradient(x)
        >>> previous = tfbnn.layers.set_conv_input_gradient("forward")
        >>> bool(np.allclose(tf.function(input_gradient.python_function)(x), reference, atol=1e-5))
        True
        >>> _ = tfbnn.layers.set_conv_input_gradient(previous)
    """
    global _mode
    if not isinstance(mode, str) or mode not in CONV_INPUT_GRADIENTS:
        raise ValueError(f"Expected `mode` in {CONV_INPUT_GRADIENTS}. Received: mode={mode!r}")
    previous, _mode = _mode, mode
    return previous


def conv_input_gradient():
    """The mode :func:`set_conv_input_gradient` set last (``"tensorflow"`` unless changed)."""
    return _mode


def _same_pads(kernel, dilation):
    """TensorFlow's "same" padding of one stride-1 axis: ``(before, after)``, the larger part after."""
    total = (kernel - 1) * dilation
    return total // 2, total - total // 2


def convolve(inputs, kernel, strides, padding, dilation_rate, data_format="channels_last"):
    """``keras.ops.conv`` of channels_last ``inputs``, with the forward input gradient where it is chosen
    and applies: a stride-1 convolution called in a function being traced (an eager call's gradient is
    taken eagerly, where no graph prunes the input gradient TensorFlow's kernel gradient computes too)."""
    if data_format != "channels_last":
        raise ValueError(f"Expected `data_format='channels_last'`. Received: data_format={data_format!r}")
    arguments = dict(strides=strides, padding=padding, dilation_rate=dilation_rate, data_format=data_format)
    if _mode != "forward" or any(s != 1 for s in strides) or tf.executing_eagerly():
        return keras.ops.conv(inputs, kernel, **arguments)
    rank = len(strides)

    @tf.custom_gradient
    def conv(x, w):
        y = keras.ops.conv(x, w, **arguments)

        def grad(dy):
            # The kernel gradient: TensorFlow's pair, whose input half (and this second forward call)
            # no op reads, so the graph drops them when the function runs.
            with tf.GradientTape() as tape:
                tape.watch(w)
                out = keras.ops.conv(tf.stop_gradient(x), w, **arguments)
            dw = tape.gradient(out, w, output_gradients=dy)
            pads = [[0, 0]]
            for axis in range(rank):
                k, d = w.shape[axis], dilation_rate[axis]
                before, after = _same_pads(k, d) if padding == "same" else (0, 0)
                pads.append([(k - 1) * d - before, (k - 1) * d - after])
            pads.append([0, 0])
            flipped = tf.transpose(tf.reverse(w, list(range(rank))), [*range(rank), rank + 1, rank])
            dx = keras.ops.conv(tf.pad(dy, pads), flipped, strides=1, padding="valid",
                                dilation_rate=dilation_rate, data_format=data_format)
            return dx, dw

        return y, grad

    return conv(inputs, kernel)
