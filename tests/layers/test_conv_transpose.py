"""3-D and transposed Bayes-by-Backprop convolutions: against Keras' layers, tfd.kl_divergence and the MC protocol."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import testing
from tfbnn.layers import conv

tfd = tfp.distributions

TRANSPOSE = {(rank, name): getattr(conv, f"Conv{rank}DTranspose{name}")
             for rank in (1, 2, 3) for name in ("Reparameterization", "Flipout")}
CONV3D = [conv.Conv3DReparameterization, conv.Conv3DFlipout]


def _rank(cls):
    return int(cls.__name__[4])


@pytest.mark.parametrize("cls", CONV3D)
def test_conv3d_basics(cls):
    testing.run_layer_test(cls, {"filters": 2, "kernel_size": 2, "strides": (1, 2, 1), "seed": 3},
                           input_shape=(2, 3, 4, 3, 2), expected_output_shape=(2, 2, 2, 2, 2),
                           expected_num_trainable_weights=4)


@pytest.mark.parametrize("key", sorted(TRANSPOSE))
def test_transpose_basics(key):
    rank, _ = key
    data_format = "channels_first" if rank == 2 else "channels_last"
    spatial_in, spatial_out = (3,) * rank, (6,) * rank  # (3 - 1) * 2 + 3 - 2 * 1 + 1 with "same"
    shape_in = (2, 2, *spatial_in) if data_format == "channels_first" else (2, *spatial_in, 2)
    shape_out = (2, 3, *spatial_out) if data_format == "channels_first" else (2, *spatial_out, 3)
    testing.run_layer_test(TRANSPOSE[key], {"filters": 3, "kernel_size": 3, "strides": 2, "padding": "same",
                                            "output_padding": 1, "data_format": data_format, "seed": 1},
                           input_shape=shape_in, expected_output_shape=shape_out, expected_num_trainable_weights=4)


def _keras_twin(cls, **kwargs):
    rank = _rank(cls)
    keras_cls = getattr(keras.layers, f"Conv{rank}DTranspose" if "Transpose" in cls.__name__ else f"Conv{rank}D")
    return keras_cls(**kwargs)


CASES = [
    (conv.Conv3DReparameterization, dict(strides=(2, 1, 1), padding="valid"), (2, 5, 4, 4, 2)),
    (conv.Conv1DTransposeReparameterization, dict(strides=3, padding="valid", output_padding=2), (2, 4, 2)),
    (conv.Conv2DTransposeFlipout, dict(strides=(2, 1), padding="same"), (2, 3, 4, 2)),
    (conv.Conv2DTransposeReparameterization, dict(dilation_rate=2, padding="valid"), (2, 3, 4, 2)),
    (conv.Conv3DTransposeFlipout, dict(strides=2, padding="same", output_padding=(1, 1, 1),
                                       data_format="channels_first"), (2, 2, 2, 3, 2)),
]


def _a_trous(kernel, dilation_rate):
    """``kernel`` with ``rate - 1`` zeros between its taps on each spatial axis (NumPy)."""
    rates = (dilation_rate,) * (kernel.ndim - 2) if isinstance(dilation_rate, int) else dilation_rate
    spread = np.zeros([(k - 1) * r + 1 for k, r in zip(kernel.shape, rates)] + list(kernel.shape[-2:]), kernel.dtype)
    spread[tuple(slice(None, None, r) for r in rates)] = kernel
    return spread


@pytest.mark.parametrize("cls, kwargs, shape", CASES, ids=[c[0].__name__ for c in CASES])
def test_posterior_mean_is_the_keras_layer_and_kl_is_tfd(cls, kwargs, shape):
    x = np.random.default_rng(0).normal(size=shape).astype("float32")
    layer = cls(3, 2, kernel_prior=tfbnn.priors.Normal(0.2, 0.5), seed=1, kl_weight=1.0,
                kernel_scale_initializer=keras.initializers.Constant(-1.0),
                bias_initializer=keras.initializers.RandomNormal(seed=4), **kwargs)
    layer.build(x.shape)
    # The reference is Keras' channels_last layer on the channels-last inputs, and a dilated kernel
    # is given to it written out with zeros between its taps (dilation 1): TensorFlow's Eigen CPU
    # kernels (AMD/ARM, TF_ENABLE_ONEDNN_OPTS=0) have neither an NCDHW transposed convolution nor a
    # dilated one, so Keras' own layer fails there with those arguments.
    channels_first = kwargs.get("data_format") == "channels_first"
    dilation = kwargs.get("dilation_rate", 1)
    twin_kwargs = {k: v for k, v in kwargs.items() if k not in ("data_format", "dilation_rate")}
    kernel = layer.kernel_loc.numpy()
    kernel_size = kernel.shape[:-2] if dilation == 1 else _a_trous(kernel, dilation).shape[:-2]
    ref = _keras_twin(cls, filters=3, kernel_size=kernel_size, **twin_kwargs)
    x_last = testing.to_channels_last(x) if channels_first else x
    ref.build(x_last.shape)
    assert layer.kernel_loc.shape == kernel.shape == (2,) * _rank(cls) + ref.kernel.shape[-2:]
    ref.set_weights([kernel if dilation == 1 else _a_trous(kernel, dilation), layer.bias_loc.numpy()])
    expected = ref(x_last).numpy()
    if channels_first:
        expected = np.moveaxis(expected, -1, 1)
    assert layer.compute_output_shape(x.shape) == expected.shape
    with tfbnn.posterior_mean(layer):
        np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-5, atol=1e-5)
    expected = tf.reduce_sum(tfd.kl_divergence(tfd.Normal(layer.kernel_loc, layer.kernel_scale()), tfd.Normal(0.2, 0.5)))
    expected += tf.reduce_sum(tfd.kl_divergence(tfd.Normal(layer.bias_loc, layer.bias_scale()), tfd.Normal(0.0, 1.0)))
    np.testing.assert_allclose(float(layer.kl_divergence()), float(expected), rtol=1e-5)
    y = layer(x)
    np.testing.assert_allclose(float(layer.losses[0]), float(expected), rtol=1e-5)
    assert not np.allclose(y.numpy(), expected, atol=1e-3)  # sampling mode samples


def test_a_dilated_transposed_convolution_is_the_adjoint_of_the_dilated_convolution():
    """An independent check of dilation: ``<conv(z, W; d), x> = <z, conv_transpose(x, W; d)>`` for all z,
    with the forward convolution's own dilation (``tf.nn.convolution``, which runs on every CPU)."""
    rng = np.random.default_rng(0)
    layer = conv.Conv2DTransposeReparameterization(3, (3, 2), dilation_rate=(2, 3), padding="valid", seed=1,
                                                   bias_initializer="zeros")
    x = rng.normal(size=(2, 4, 5, 2)).astype("float32")
    with tfbnn.posterior_mean(layer):
        y = layer(x).numpy()
    z = rng.normal(size=y.shape).astype("float32")
    # The transposed kernel (kh, kw, filters, channels) is the forward kernel (kh, kw, in=filters, out=channels).
    forward = tf.nn.convolution(z, layer.kernel_loc, padding="VALID", dilations=(2, 3)).numpy()
    assert forward.shape == x.shape
    # Float32 sums of O(1) products that cancel to O(0.1): the rounding bound scales with sum |z y|.
    np.testing.assert_allclose(np.sum(forward * x), np.sum(z * y), rtol=1e-5, atol=1e-5 * np.sum(np.abs(z * y)))


@pytest.mark.parametrize("cls", [conv.Conv2DTransposeReparameterization, conv.Conv1DTransposeFlipout,
                                 conv.Conv3DReparameterization])
def test_mc_protocol_draws_one_kernel_per_block_and_predict_works(cls):
    rank, t, b = _rank(cls), 3, 2
    x = np.random.default_rng(0).normal(size=(b,) + (3,) * rank + (2,)).astype("float32")
    kwargs = {"kernel_size": 2, "seed": 1, "kernel_scale_initializer": keras.initializers.Constant(-1.0)}
    model = keras.Sequential([keras.Input(x.shape[1:]), cls(2, **kwargs)])
    with tfbnn.weight_samples(model, t):
        y = model(np.tile(x, (t,) + (1,) * (rank + 1))).numpy().reshape((t, b, -1))
    assert all(not np.allclose(y[i], y[j]) for i in range(t) for j in range(i + 1, t))
    layer = model.layers[0]
    layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -30.0, "float32"))
    layer.bias_rho.assign(np.full(layer.bias_rho.shape, -30.0, "float32"))
    with tfbnn.posterior_mean(model):
        mean = model(x).numpy().reshape((1, b, -1))
    with tfbnn.weight_samples(model, t):
        y = model(np.tile(x, (t,) + (1,) * (rank + 1))).numpy().reshape((t, b, -1))
    np.testing.assert_allclose(y, np.broadcast_to(mean, y.shape), atol=1e-4)
    classifier = keras.Sequential([keras.Input(x.shape[1:]), cls(2, **kwargs), keras.layers.Flatten(),
                                   keras.layers.Dense(3, activation="softmax")])
    res = tfbnn.predict(classifier, x, num_samples=4)
    assert res.mean_probs.shape == (b, 3) and np.all(np.isfinite(res.epistemic))


def test_transposed_flipout_decorrelates_identical_examples():
    x = np.ones((16, 3, 3, 2), "float32")
    big = keras.initializers.Constant(0.0)
    y = conv.Conv2DTransposeFlipout(2, 3, seed=1, kernel_scale_initializer=big)(x).numpy()
    assert np.std(y[:, 2, 2, 0]) > 0.1
    y = conv.Conv2DTransposeReparameterization(2, 3, seed=1, kernel_scale_initializer=big)(x).numpy()
    np.testing.assert_allclose(y, np.broadcast_to(y[:1], y.shape), rtol=1e-5)


@pytest.mark.parametrize("cls", [conv.Conv2DTransposeFlipout, conv.Conv3DTransposeReparameterization])
@pytest.mark.parametrize("num_samples", [1, 2])
def test_channels_first_equals_channels_last_on_transposed_inputs(cls, num_samples):
    rank = _rank(cls)
    x = np.random.default_rng(0).normal(size=(2 * num_samples,) + (3,) * rank + (2,)).astype("float32")
    outputs = []
    for data_format, inputs in testing.data_formats(x):
        layer = cls(3, 2, strides=2, output_padding=1, data_format=data_format, seed=4, kl_weight=1.0,
                    kernel_initializer=keras.initializers.GlorotUniform(seed=3),
                    kernel_scale_initializer=keras.initializers.Constant(-1.0))
        model = keras.Sequential([keras.Input(inputs.shape[1:]), layer])
        with tfbnn.weight_samples(model, num_samples, joint=True, with_kl=True):
            y = model(inputs).numpy()
        outputs.append(testing.to_channels_last(y) if data_format == "channels_first" else y)
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("output_padding", [None, 0, 1])
@pytest.mark.parametrize("strides, dilation", [(1, 1), (2, 1), (3, 1), (1, 2)])
def test_output_lengths_match_keras(padding, output_padding, strides, dilation):
    if output_padding is not None and output_padding >= strides:
        return
    layer = conv.Conv1DTransposeReparameterization(2, 3, strides=strides, padding=padding,
                                                   output_padding=output_padding, dilation_rate=dilation)
    ref = keras.layers.Conv1DTranspose(2, 3, strides=strides, padding=padding, output_padding=output_padding,
                                       dilation_rate=dilation)
    for length in (1, 4, 5):
        expected = tuple(ref.compute_output_shape((1, length, 1)))
        assert layer.compute_output_shape((1, length, 1)) == expected
        assert tuple(layer(np.ones((1, length, 1), "float32")).shape) == expected


@pytest.mark.parametrize("kwargs, match", [
    ({"strides": 2, "output_padding": 2}, r"output_padding=\(2, 2\), strides=\(2, 2\)"),
    ({"output_padding": -1}, "output_padding=-1"),
    ({"output_padding": (0, 0, 0)}, r"output_padding=\(0, 0, 0\)"),
    ({"strides": 2, "dilation_rate": 2}, r"strides=\(2, 2\), dilation_rate=\(2, 2\)"),
    ({"padding": "causal"}, "padding='causal'"),
])
def test_bad_transpose_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        conv.Conv2DTransposeReparameterization(2, 3, **kwargs)


def test_wrong_input_rank_names_the_layout():
    with pytest.raises(ValueError, match=r"rank 5 \(batch, spatial, spatial, spatial, channels\).*\(2, 4, 4, 1\)"):
        conv.Conv3DFlipout(2, 3, kl_weight=0.1)(np.ones((2, 4, 4, 1), "float32"))
