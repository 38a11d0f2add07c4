"""The forward-convolution input gradient (``tfbnn.layers.set_conv_input_gradient("forward")``).

Every tfbnn convolution built on ConvArguments (enumerated from ``tfbnn.layers``), each
shape family (kernel 2 and 3, dilation 1 and 2, "valid" and "same", channels_first): the
gradients of a loss with respect to the inputs and to every weight equal TensorFlow's to
float32 rounding, in a compiled function and eagerly, the same draws either way; the
compiled gradient holds one more forward convolution per layer (the input gradient) and
strided convolutions keep TensorFlow's gradient.
"""

import inspect
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn.layers.arguments import ConvArguments, ConvTransposeArguments
from tfbnn.layers.conv_gradient import CONV_INPUT_GRADIENTS

CLASSES = sorted(
    name for name in tfbnn.layers.__all__
    if inspect.isclass(getattr(tfbnn.layers, name)) and issubclass(getattr(tfbnn.layers, name), ConvArguments)
    and not issubclass(getattr(tfbnn.layers, name), ConvTransposeArguments)
    and getattr(tfbnn.layers, name) is not ConvArguments)
FAMILIES = list(itertools.product([2, 3], [1, 2], ["valid", "same"], ["channels_last", "channels_first"]))


@pytest.fixture
def mode():
    """Restores the input-gradient mode whatever the test does."""
    previous = tfbnn.layers.conv_input_gradient()
    yield
    tfbnn.layers.set_conv_input_gradient(previous)


def _layer(name, kernel, dilation, padding, data_format, strides=1):
    cls = getattr(tfbnn.layers, name)
    keras.utils.set_random_seed(0)
    scale = {"kl_weight": 0.1} if issubclass(cls, tfbnn.layers.BayesianLayer) else {}
    return cls(3, kernel, strides=strides, padding=padding, dilation_rate=dilation, data_format=data_format,
               seed=0, **scale)


def _inputs(layer, data_format, batch=4):
    spatial = (7,) * layer.rank
    shape = (batch, *spatial, 2) if data_format == "channels_last" else (batch, 2, *spatial)
    return tf.constant(np.random.default_rng(0).normal(size=shape), tf.float32)


def _upstream(layer):
    """Which of ``[input, *trainable variables]`` the input gradient reaches: the input and the variables applied
    before the convolution (node noise and its flow), not the convolution's own kernel and bias."""
    return [True] + [not v.name.startswith(("kernel", "bias")) for v in layer.trainable_variables]


def _gradients(layers, inputs, compiled):
    """The gradients of each layer's loss with respect to its inputs and weights, in one function."""
    def gradients(inputs):
        results = []
        for layer, x in zip(layers, inputs):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(y * tf.cos(y)) + sum(layer.losses)
            results.append(tape.gradient(loss, [x, *layer.trainable_variables]))
        return results

    fn = tf.function(gradients) if compiled else gradients
    return [[g.numpy() for g in case] for case in fn(inputs)]


def _compare(cases, compiled, strides=1):
    """``cases``: (class name, (kernel, dilation, padding, data_format)); TensorFlow's gradients and the
    forward ones, each mode's layers made from the same seeds and traced in one function."""
    results = []
    for mode in CONV_INPUT_GRADIENTS:
        tfbnn.layers.set_conv_input_gradient(mode)
        layers = [_layer(name, *family, strides=strides) for name, family in cases]
        inputs = [_inputs(layer, family[3]) for layer, (_, family) in zip(layers, cases)]
        for layer, x in zip(layers, inputs):
            layer(x)  # built outside the gradient's function
        results.append(_gradients(layers, inputs, compiled))
    for case, layer, reference, forward in zip(cases, layers, *results):
        assert len(reference) == len(forward), case
        # The two input gradients differ by float32 rounding, and every gradient upstream of the convolution
        # inherits that rounding in absolute terms: a node-noise flow's output bias (gradient 0.08) takes it from
        # the node means' gradient (6.2). Each upstream array's tolerance therefore scales with the largest
        # upstream gradient entry; the kernel's and bias's, which the input gradient does not reach, with their own.
        upstream = _upstream(layer)
        largest = max(float(np.max(np.abs(a))) for a, up in zip(reference, upstream) if up and a.size)
        for a, b, up in zip(reference, forward, upstream):
            assert a.shape == b.shape, case
            scale = max(1.0, float(np.max(np.abs(a))) if a.size else 0.0, largest if up else 0.0)
            np.testing.assert_allclose(b, a, rtol=0, atol=2e-6 * scale, err_msg=str(case))


def _cases():
    """Every family for Conv2DReparameterization, one family in turn for each other convolution."""
    cases = [("Conv2DReparameterization", family) for family in FAMILIES]
    usable = [f for f in FAMILIES if f[1] == 1]  # TensorFlow's CPU Conv3D has no dilation: rank 3 takes these
    for i, name in enumerate(n for n in CLASSES if n != "Conv2DReparameterization"):
        families = usable if getattr(tfbnn.layers, name).rank == 3 else FAMILIES
        cases.append((name, families[(5 * i) % len(families)]))
    return cases


def test_every_convolution_takes_the_same_gradient_both_ways(mode):
    cases = _cases()
    assert {name for name, _ in cases} == set(CLASSES)
    assert {family for _, family in cases} == set(FAMILIES)
    _compare(cases, compiled=True)


def test_eager_gradients_and_strided_convolutions_keep_tensorflow_s(mode):
    _compare([("Conv2DFlipout", (3, 1, "same", "channels_last"))], compiled=False)
    _compare([("Conv2DReparameterization", (3, 1, "same", "channels_first"))], compiled=True, strides=2)


def _conv_ops(mode_name, strides):
    tfbnn.layers.set_conv_input_gradient(mode_name)
    layer = _layer("Conv2DReparameterization", 3, 1, "same", "channels_last", strides)
    x = _inputs(layer, "channels_last")
    layer(x)

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
        return tape.gradient(y, x)

    ops = [op.type for op in gradient.get_concrete_function(x).graph.get_operations()]
    return ops.count("Conv2D")


def test_the_forward_gradient_is_a_forward_convolution_at_stride_one_only(mode):
    # Two more: the input gradient, and the kernel gradient's own forward call, whose output no op
    # reads (TensorFlow's pruning drops it and TensorFlow's unused input gradient when the function runs).
    assert _conv_ops("forward", 1) == _conv_ops("tensorflow", 1) + 2
    assert _conv_ops("forward", 2) == _conv_ops("tensorflow", 2)


def test_a_mode_that_is_not_one_is_refused(mode):
    with pytest.raises(ValueError, match=r"`mode`.*'fast'"):
        tfbnn.layers.set_conv_input_gradient("fast")
    assert tfbnn.layers.set_conv_input_gradient("forward") == "tensorflow"
    assert tfbnn.layers.conv_input_gradient() == "forward"
