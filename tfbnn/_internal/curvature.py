"""Per-layer curvature terms: a layer's pre-activation, and probes that record each layer's inputs and the
outputs' sensitivity to its pre-activation (KFAC over every layer in :mod:`tfbnn.laplace`, Laplace-LoRA's
factors in :mod:`tfbnn.lora`)."""

import keras
import tensorflow as tf

from tfbnn._internal import keras_private

__all__ = ["pre_activation", "activate", "Probes"]


def pre_activation(layer, inputs, kernel):
    """The layer's pre-activation ``inputs (*) kernel + bias`` with the given kernel: a matmul (``Dense``),
    an einsum (``EinsumDense``) or a convolution (``Conv2D``)."""
    kernel = tf.cast(kernel, inputs.dtype)
    if isinstance(layer, keras.layers.EinsumDense):
        outputs = tf.einsum(layer.equation, inputs, kernel)
    elif isinstance(layer, keras.layers.Conv2D):
        outputs = keras.ops.conv(inputs, kernel, strides=layer.strides, padding=layer.padding,
                                 data_format=layer.data_format, dilation_rate=layer.dilation_rate)
    else:
        outputs = keras.ops.matmul(inputs, kernel)
    return outputs if layer.bias is None else outputs + tf.cast(layer.bias, outputs.dtype)


def activate(layer, outputs):
    return outputs if layer.activation is None else layer.activation(outputs)


class Probes:
    """While active, each of ``layers`` records its input and adds a watched zero "probe" to its
    pre-activation, so that ``d f / d probe`` is the sensitivity of the outputs to it (the layers' own
    ``call`` is restored on exit)."""

    def __init__(self, layers, tape):
        self.layers, self.tape, self.inputs, self.probes = layers, tape, {}, {}

    def attach(self, layer, inputs, outputs):
        """``outputs + probe`` (the layer's pre-activation), recording ``inputs`` and the probe."""
        probe = tf.zeros_like(outputs)
        self.tape.watch(probe)
        self.inputs[id(layer)], self.probes[id(layer)] = inputs, probe
        return outputs + probe

    def _call(self, layer):
        def call(inputs, *args, **kwargs):
            return activate(layer, self.attach(layer, inputs, pre_activation(layer, inputs, layer.kernel)))

        return call

    def __enter__(self):
        for layer in self.layers:
            keras_private.override_call(layer, self._call(layer))
        return self

    def __exit__(self, *exc):
        for layer in self.layers:
            keras_private.restore_call(layer)
