import json

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import testing
from tfbnn.layers.conv import Conv1DFlipout, Conv1DReparameterization, Conv2DFlipout, Conv2DReparameterization

CONV2D = [Conv2DReparameterization, Conv2DFlipout]


@pytest.mark.parametrize("cls", CONV2D)
@pytest.mark.parametrize("prior", ["normal", "scale_mixture"])
def test_conv2d_basics(cls, prior):
    testing.run_layer_test(cls, {"filters": 3, "kernel_size": 3, "padding": "same", "activation": "relu",
                                 "kernel_prior": prior, "seed": 5},
                           input_shape=(2, 6, 6, 2), expected_output_shape=(2, 6, 6, 3),
                           expected_num_trainable_weights=4)


@pytest.mark.parametrize("cls", [Conv1DReparameterization, Conv1DFlipout])
def test_conv1d_basics(cls):
    testing.run_layer_test(cls, {"filters": 4, "kernel_size": 3, "strides": 2, "seed": 1},
                           input_shape=(2, 9, 3), expected_output_shape=(2, 4, 4))


@pytest.mark.parametrize("cls", CONV2D)
def test_posterior_mean_is_the_keras_convolution_and_kl_is_closed_form(cls):
    x = np.random.default_rng(0).normal(size=(3, 7, 7, 2)).astype("float32")
    layer = cls(4, (3, 2), strides=(2, 1), padding="valid", kernel_prior=tfbnn.priors.Normal(0, 0.5), seed=1,
                kernel_scale_initializer=keras.initializers.Constant(-1.0))
    layer.set_kl_weight(1.0)
    layer.build(x.shape)
    ref = keras.layers.Conv2D(4, (3, 2), strides=(2, 1), padding="valid")
    ref.build(x.shape)
    ref.set_weights([layer.kernel_loc.numpy(), layer.bias_loc.numpy()])
    with tfbnn.posterior_mean(keras.Sequential([keras.Input(x.shape[1:]), layer])):
        np.testing.assert_allclose(layer(x).numpy(), ref(x).numpy(), rtol=1e-5, atol=1e-5)
    mu, s = layer.kernel_loc.numpy(), np.log1p(np.exp(-1.0)) + 1e-6
    mu_b, s_b = layer.bias_loc.numpy(), layer.bias_scale().numpy()
    expected = np.sum(np.log(0.5 / s) + (s**2 + mu**2) / (2 * 0.25) - 0.5)
    expected += np.sum(np.log(1 / s_b) + (s_b**2 + mu_b**2) / 2 - 0.5)
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
    assert not np.allclose(layer(x).numpy(), ref(x).numpy())  # sampling mode samples


@pytest.mark.parametrize("cls", CONV2D)
def test_mc_protocol_draws_one_independent_kernel_per_block(cls):
    t, b = 3, 2
    x = np.random.default_rng(0).normal(size=(b, 5, 5, 2)).astype("float32")
    model = keras.Sequential([keras.Input((5, 5, 2)), cls(3, 3, seed=1, kernel_scale_initializer=keras.initializers.Constant(-1.0))])
    with tfbnn.weight_samples(model, t):
        y = model(np.tile(x, (t, 1, 1, 1))).numpy().reshape(t, b, 3, 3, 3)
    assert all(not np.allclose(y[i], y[j]) for i in range(t) for j in range(i + 1, t))
    layer = model.layers[0]
    layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -30.0, "float32"))
    layer.bias_rho.assign(np.full(layer.bias_rho.shape, -30.0, "float32"))
    with tfbnn.posterior_mean(model):
        mean = model(x).numpy()
    with tfbnn.weight_samples(model, t):
        y = model(np.tile(x, (t, 1, 1, 1))).numpy().reshape(t, b, 3, 3, 3)
    np.testing.assert_allclose(y, np.broadcast_to(mean, y.shape), atol=1e-4)
    res = tfbnn.predict(keras.Sequential([keras.Input((5, 5, 2)), keras.layers.Flatten(),
                                          tfbnn.DenseFlipout(3, activation="softmax", seed=2)]), x, num_samples=4)
    assert res.mean_probs.shape == (b, 3)


def test_flipout_decorrelates_identical_examples():
    x = np.ones((16, 4, 4, 2), "float32")
    y = Conv2DFlipout(2, 3, seed=1, kernel_scale_initializer=keras.initializers.Constant(0.0))(x).numpy()
    assert np.std(y[:, 0, 0, 0]) > 0.1
    y = Conv2DReparameterization(2, 3, seed=1, kernel_scale_initializer=keras.initializers.Constant(0.0))(x).numpy()
    np.testing.assert_allclose(y, np.broadcast_to(y[:1], y.shape), rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"filters": 0, "kernel_size": 3}, "filters=0"), ({"filters": 2, "kernel_size": 0}, "kernel_size=0"),
     ({"filters": 2, "kernel_size": (3, 3, 3)}, "kernel_size="), ({"filters": 2, "kernel_size": 3, "padding": "full"}, "padding='full'"),
     ({"filters": 2, "kernel_size": 3, "strides": -1}, "strides=-1"), ({"filters": 2, "kernel_size": 3, "kernel_prior": "x"}, "prior='x'")],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Conv2DFlipout(**kwargs)


@pytest.mark.parametrize(
    "cls", [Conv2DFlipout, Conv2DReparameterization, tfbnn.Conv2DVariationalDropout, tfbnn.NodeConv2D]
)
def test_numpy_scalars_are_accepted_as_keras_accepts_them(cls):
    layer = cls(np.int64(2), np.int32(3), strides=(np.int64(1), 1), seed=np.uint8(1), kl_weight=0.1)
    assert layer.filters == 2 and layer.kernel_size == (3, 3) and layer.strides == (1, 1)
    assert all(type(v) is int for v in (layer.filters, *layer.kernel_size, *layer.strides, layer.seed))
    json.dumps(layer.get_config())
    assert layer(np.ones((1, 5, 5, 1), "float32")).shape == (1, 3, 3, 2)
    with pytest.raises(ValueError, match="filters=True"):
        cls(True, 3)
    with pytest.raises(ValueError, match="kernel_size=True"):
        cls(2, True)


CONV_FAMILIES = [Conv1DReparameterization, Conv1DFlipout, Conv2DReparameterization, Conv2DFlipout,
                 tfbnn.Conv2DVariationalDropout, tfbnn.NodeConv2D]


def _image(cls, side):
    return np.ones((2, side, 1) if cls.__name__.startswith("Conv1D") else (2, side, side, 1), "float32")


@pytest.mark.parametrize("cls", CONV_FAMILIES)
def test_inputs_smaller_than_the_kernel_are_rejected_as_keras_does(cls):
    keras_cls = keras.layers.Conv1D if cls.__name__.startswith("Conv1D") else keras.layers.Conv2D
    with pytest.raises(ValueError):
        keras_cls(2, 3)(_image(cls, 2))
    for side, kwargs in [(2, {}), (3, {"dilation_rate": 2}), (2, {"strides": 2})]:
        x = _image(cls, side)
        with pytest.raises(ValueError, match=rf"dilated kernel.*input_shape=\(2, {side}"):
            cls(2, 3, kl_weight=0.1, seed=0, **kwargs)(x)  # returned a (2, 2) map before
        with pytest.raises(ValueError, match=rf"dilated kernel.*input_shape=\(None, {side}"):
            cls(2, 3, **kwargs)(keras.Input(x.shape[1:]))  # building a functional model
    # The smallest valid input, 'same' padding, and layers built for any size still work.
    assert cls(2, 3, kl_weight=0.1, seed=0)(_image(cls, 3)).shape[1] == 1
    assert cls(2, 3, padding="same", kl_weight=0.1, seed=0)(_image(cls, 2)).shape[1] == 2
    layer = cls(2, 3, kl_weight=0.1, seed=0)
    layer.build((None,) * (len(_image(cls, 3).shape) - 1) + (1,))
    assert layer(_image(cls, 4)).shape[1] == 2
    with pytest.raises(ValueError, match="dilated kernel"):
        layer(_image(cls, 2))


def test_wrong_input_rank():
    with pytest.raises(ValueError, match=r"rank 4 .*input_shape=\(2, 5, 3\)"):
        Conv2DReparameterization(2, 3, kl_weight=0.1)(np.ones((2, 5, 3), "float32"))


ALL_CONV = [Conv1DReparameterization, Conv1DFlipout, Conv2DReparameterization, Conv2DFlipout]


@pytest.mark.parametrize("cls", ALL_CONV)
def test_channels_first_basics(cls):
    rank = 1 if cls.__name__.startswith("Conv1D") else 2
    testing.run_layer_test(cls, {"filters": 3, "kernel_size": 3, "padding": "same", "seed": 2,
                                 "data_format": "channels_first"},
                           input_shape=(2, 2) + (6,) * rank, expected_output_shape=(2, 3) + (6,) * rank,
                           expected_num_trainable_weights=4)


@pytest.mark.parametrize("cls", ALL_CONV)
@pytest.mark.parametrize("num_samples", [1, 3])
def test_channels_first_equals_channels_last_on_transposed_inputs(cls, num_samples):
    """Same seed, same weights: the same samples (in sampling mode, and in the T-sample protocol)."""
    rank = 1 if cls.__name__.startswith("Conv1D") else 2
    x = np.random.default_rng(0).normal(size=(2 * num_samples,) + (7,) * rank + (2,)).astype("float32")
    outputs = {}
    for data_format, inputs in testing.data_formats(x):
        layer = cls(3, 3, strides=2, data_format=data_format, seed=4, kl_weight=1.0,
                    kernel_initializer=keras.initializers.GlorotUniform(seed=3),
                    kernel_scale_initializer=keras.initializers.Constant(-1.0),
                    bias_scale_initializer=keras.initializers.Constant(-1.0))
        model = keras.Sequential([keras.Input(inputs.shape[1:]), layer])
        with tfbnn.weight_samples(model, num_samples, joint=True, with_kl=True):
            y = model(inputs).numpy()
        outputs[data_format] = (y, float(layer.kl_divergence()), [w.numpy() for w in layer.trainable_weights])
    (y_last, kl_last, w_last), (y_first, kl_first, w_first) = outputs["channels_last"], outputs["channels_first"]
    for a, b in zip(w_last, w_first):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(testing.to_channels_last(y_first), y_last, rtol=1e-5, atol=1e-5)
    assert kl_first == kl_last


def test_conv_arguments_are_validated():
    with pytest.raises(ValueError, match="Expected `data_format` in \\('channels_last', 'channels_first'\\). "
                                         "Received: data_format='NCHW'"):
        Conv2DFlipout(3, 3, data_format="NCHW")
    with pytest.raises(ValueError, match="expects inputs of rank 4 \\(batch, channels, spatial, spatial\\)"):
        Conv2DFlipout(3, 3, data_format="channels_first").build((2, 3, 6))


def channels_first_outputs():
    """Every tfbnn convolution, channels_first, on one seeded input: a sampled call, the posterior
    mean, the gradient norms of a sampled loss, and the posterior mean of a channels_last twin with
    the same weights on the transposed input. Run by the test below in fresh processes."""
    import inspect

    import tensorflow as tf

    results = {}
    for name in sorted(dir(tfbnn.layers)):
        cls = getattr(tfbnn.layers, name)
        if not (inspect.isclass(cls) and issubclass(cls, tfbnn.layers.ConvArguments)
                and "Arguments" not in name and cls.__module__.startswith("tfbnn.layers.")):
            continue
        keras.utils.set_random_seed(0)
        x = np.random.default_rng(0).normal(size=(4, 2) + (5,) * cls.rank).astype("float32")
        x_last = testing.to_channels_last(x)
        layer, twin = (cls(3, 3, strides=2 if "Transpose" in name else 1, padding="same", data_format=fmt, seed=3)
                       for fmt in ("channels_first", "channels_last"))
        sample = layer(x)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(x))) + sum(layer.losses)
        grads = tape.gradient(loss, layer.trainable_weights)
        twin.build(x_last.shape)
        twin.set_weights(layer.get_weights())
        with tfbnn.posterior_mean(layer), tfbnn.posterior_mean(twin):
            mean, twin_mean = layer(x), twin(x_last)
        results[name] = {"sample": np.asarray(sample).tolist(), "mean": np.asarray(mean).tolist(),
                         "twin_mean": np.moveaxis(np.asarray(twin_mean), -1, 1).tolist(),
                         "grad_norms": [float(tf.norm(g)) for g in grads]}
    return results


_KERNEL_PATH = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_conv import channels_first_outputs
print("RESULT", json.dumps(channels_first_outputs()))
"""


def test_every_convolution_runs_channels_first_on_the_eigen_kernels_as_on_onednn():
    """TensorFlow's Eigen CPU kernels (AMD and ARM CPUs, ``TF_ENABLE_ONEDNN_OPTS=0``) have no NCHW
    convolution; every tfbnn convolution computes channels_last inside. In fresh processes with
    oneDNN off and on, whatever this process has: each family and estimator (Bayes by Backprop,
    Flipout, transposed, 3-D, variational dropout's local reparameterization, node, flow, rank-1,
    BatchEnsemble) runs channels_first, its seeded samples, posterior mean and gradients agree
    between the two kernel paths, and its posterior mean equals its channels_last twin's."""
    import os
    import subprocess
    import sys

    runs = {}
    for flag in ("0", "1"):
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": flag, "TF_CPP_MIN_LOG_LEVEL": "3"}
        out = subprocess.run([sys.executable, "-c", _KERNEL_PATH, os.path.dirname(__file__)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[flag] = json.loads(out.stdout.split("RESULT ", 1)[1])
    eigen, onednn_path = runs["0"], runs["1"]
    assert {"Conv1DFlipout", "Conv2DReparameterization", "Conv3DFlipout", "Conv2DTransposeFlipout",
            "Conv3DTransposeReparameterization", "Conv2DVariationalDropout", "NodeConv2D", "NodeConv1D",
            "NodeConv2DFlow", "Conv2DRank1", "Conv2DBatchEnsemble"} <= set(eigen), sorted(eigen)
    assert set(eigen) == set(onednn_path)
    for name, got in eigen.items():
        want = onednn_path[name]
        for key in ("sample", "mean", "grad_norms"):
            assert np.all(np.isfinite(got[key])), (name, key)
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5, err_msg=f"{name} {key}")
        np.testing.assert_allclose(got["mean"], got["twin_mean"], rtol=1e-5, atol=1e-5, err_msg=name)
