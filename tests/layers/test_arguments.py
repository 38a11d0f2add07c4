"""tfbnn.layers.arguments: the shape families (Dense, Conv of any rank, transposed Conv) and their helpers.

Checked against Keras' own layers (output shapes, the forward operation) and against
``tf.nn.convolution`` (the a-trous kernel).
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn.layers import arguments


@pytest.mark.parametrize("padding,stride,dilation,length", [  # (Keras refuses strides > 1 with dilation > 1)
    case for case in itertools.product(("valid", "same"), (1, 2, 3), (1, 2), (7, 8, 11)) if case[1] == 1 or case[2] == 1
])
def test_conv_output_shape_is_keras_conv_output_shape(padding, stride, dilation, length):
    keras_shape = keras.layers.Conv2D(5, (3, 2), strides=stride, padding=padding,
                                      dilation_rate=dilation).compute_output_shape((4, length, length + 1, 2))
    ours = arguments.conv_output_shape((4, length, length + 1, 2), 5, (3, 2), (stride, stride), padding,
                                       (dilation, dilation))
    assert ours == tuple(keras_shape)
    first = arguments.conv_output_shape((4, 2, length, length + 1), 5, (3, 2), (stride, stride), padding,
                                        (dilation, dilation), data_format="channels_first")
    assert first == (4, 5, *ours[1:3])


def test_an_input_smaller_than_the_dilated_kernel_is_refused_as_keras_does():
    with pytest.raises(ValueError, match=r"at least as large as the dilated kernel.*dilation_rate=\(3,\)"):
        arguments.conv_output_shape((1, 4, 2), 3, (3,), (1,), "valid", (3,))


@pytest.mark.parametrize("value", [0, -1, (2,), (2, 0), 1.5, "2", None])
def test_positive_ints_names_the_argument(value):
    with pytest.raises(ValueError, match=r"Expected `kernel_size` to be a positive int or a pair of them\. "
                                         r"Received: kernel_size="):
        arguments.positive_ints("kernel_size", value, 2)
    assert arguments.positive_ints("strides", 3, 2) == (3, 3)
    assert arguments.positive_ints("strides", [1, 2, 3], 3) == (1, 2, 3)


@pytest.mark.parametrize("rate", [(1, 1), (2, 1), (2, 3)])
def test_the_atrous_kernel_at_dilation_1_is_the_dilated_convolution(rate):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 12, 13, 3)).astype("float32")
    kernel = rng.normal(size=(3, 2, 3, 4)).astype("float32")
    dilated = tf.nn.convolution(x, kernel, padding="VALID", dilations=rate)
    atrous = arguments.dilate(tf.constant(kernel), rate)
    assert tuple(atrous.shape) == ((3 - 1) * rate[0] + 1, (2 - 1) * rate[1] + 1, 3, 4)
    np.testing.assert_allclose(tf.nn.convolution(x, atrous, padding="VALID"), dilated, rtol=1e-5, atol=1e-5)


def test_the_dense_family_is_keras_dense_on_any_leading_axes():
    """DenseArguments' forward pass (posterior mean) is keras.layers.Dense's on a rank-3 input."""
    layer = tfbnn.layers.DenseReparameterization(4, activation="tanh", seed=1)
    dense = keras.layers.Dense(4, activation="tanh")
    x = np.random.default_rng(1).normal(size=(2, 5, 3)).astype("float32")
    layer(x), dense(x)
    dense.set_weights([np.asarray(layer.kernel_loc), np.asarray(layer.bias_loc)])
    with tfbnn.posterior_mean(layer):
        np.testing.assert_allclose(layer(x), dense(x), rtol=1e-5, atol=1e-6)
    assert tuple(layer.compute_output_shape((2, 5, 3))) == tuple(dense.compute_output_shape((2, 5, 3)))


def test_channels_last_runs_a_channels_first_layer_as_its_channels_last_twin():
    """ConvArguments.channels_last: the channels move last, the op runs, they move back."""
    rng = np.random.default_rng(2)
    x_first = rng.normal(size=(2, 3, 6, 7)).astype("float32")
    layer = tfbnn.layers.Conv2DReparameterization(4, 3, data_format="channels_first", seed=1)
    twin = tfbnn.layers.Conv2DReparameterization(4, 3, seed=1)
    layer(x_first), twin(np.moveaxis(x_first, 1, -1))
    twin.set_weights(layer.get_weights())
    with tfbnn.posterior_mean(layer), tfbnn.posterior_mean(twin):
        np.testing.assert_allclose(layer(x_first), np.moveaxis(np.asarray(twin(np.moveaxis(x_first, 1, -1))), -1, 1),
                                   rtol=1e-5, atol=1e-5)
    assert layer.channel_axis == 1 and twin.channel_axis == -1
