"""Spectral normalization (tfbnn.layers.spectral): sigma against NumPy's SVD, the bound c, save/load, seeds."""

import os

import keras
import numpy as np
import pytest

from tfbnn import testing
from tfbnn.layers import SpectralConv2D, SpectralDense, SpectralNormalization


def _largest_singular_value(matrix):
    return np.linalg.svd(matrix, compute_uv=False)[0]


def test_spectral_dense_and_conv2d_basics():
    testing.run_layer_test(SpectralDense, {"units": 3, "activation": "relu", "seed": 0}, (4, 5), (4, 3),
                           expected_num_losses=0, expected_num_seed_generators=0)
    testing.run_layer_test(SpectralConv2D, {"filters": 2, "kernel_size": 3, "padding": "same", "seed": 0},
                           (2, 5, 5, 1), (2, 5, 5, 2), expected_num_losses=0, expected_num_seed_generators=0)


@pytest.mark.parametrize("make_inner, x_shape", [
    (lambda init: keras.layers.Dense(5, kernel_initializer=init), (3, 7)),
    (lambda init: keras.layers.Conv2D(4, 3, kernel_initializer=init), (2, 6, 6, 3)),  # the (3 * 3 * 3, 4) kernel
])
def test_power_iteration_converges_to_numpy_s_largest_singular_value(make_inner, x_shape):
    # A seeded kernel: the error after k steps shrinks as (s2 / s1)^(2k), and an unseeded draw (which depends on the
    # tests run before in the worker) can have s2 / s1 = 0.96, too close for 60 steps; this one has 0.85 / 0.83.
    inner = make_inner(keras.initializers.GlorotUniform(seed=3))
    layer = SpectralNormalization(inner, norm_multiplier=100.0, power_iterations=3, seed=1)
    x = np.random.default_rng(0).normal(size=x_shape).astype("float32")
    for _ in range(20):  # 60 power-iteration steps in training calls
        layer(x, training=True)
    kernel = inner.kernel.numpy().reshape(-1, inner.kernel.shape[-1])
    expected = _largest_singular_value(kernel)
    assert layer.spectral_norm() == pytest.approx(expected, rel=1e-4)
    # v^T W u: the stored vectors are the top singular pair (up to sign).
    u, v = layer.u.numpy(), layer.v.numpy()
    assert float(v @ kernel @ u) == pytest.approx(expected, rel=1e-4)
    left, _, right = np.linalg.svd(kernel)
    assert abs(float(u @ right[0])) == pytest.approx(1.0, abs=1e-3)
    assert abs(float(v @ left[:, 0])) == pytest.approx(1.0, abs=1e-3)


def test_the_kernel_is_rescaled_to_c_only_when_sigma_exceeds_it():
    c = 0.8
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    layer = SpectralNormalization(keras.layers.Dense(3, activation="tanh"), norm_multiplier=c, power_iterations=50,
                                  seed=0)
    layer.build((None, 6))
    big = np.random.default_rng(2).normal(size=(6, 3)).astype("float32") * 5.0
    layer.layer.kernel.assign(big)
    y = layer(x, training=True).numpy()
    normalized = layer.normalized_kernel().numpy()
    assert _largest_singular_value(normalized) == pytest.approx(c, rel=1e-4)
    np.testing.assert_allclose(normalized, big * c / _largest_singular_value(big), rtol=1e-4)
    # The output is the Dense map with the normalized kernel, computed independently.
    np.testing.assert_allclose(y, np.tanh(x @ normalized + layer.layer.bias.numpy()), rtol=1e-5, atol=1e-6)
    small = big / (4.0 * _largest_singular_value(big))  # sigma = 0.25 < c: unchanged
    layer.layer.kernel.assign(small)
    layer(x, training=True)
    np.testing.assert_allclose(layer.normalized_kernel().numpy(), small, rtol=1e-6)


def test_conv2d_output_is_the_convolution_with_the_normalized_kernel():
    x = np.random.default_rng(3).normal(size=(2, 6, 6, 2)).astype("float32")
    layer = SpectralConv2D(3, 3, strides=2, padding="same", norm_multiplier=0.5, power_iterations=30, seed=0)
    y = layer(x, training=True).numpy()
    reference = keras.layers.Conv2D(3, 3, strides=2, padding="same")
    reference.build(x.shape)
    reference.set_weights([layer.normalized_kernel().numpy(), layer.layer.bias.numpy()])
    np.testing.assert_allclose(y, reference(x).numpy(), rtol=1e-5, atol=1e-6)
    assert layer.spectral_norm(normalized=True) <= 0.5 + 1e-6


def test_inference_keeps_the_vectors_and_training_moves_them():
    layer = SpectralDense(4, seed=3)
    x = np.ones((2, 5), "float32")
    layer(x)
    u = layer.u.numpy().copy()
    layer(x, training=False)
    np.testing.assert_array_equal(layer.u.numpy(), u)
    layer(x, training=True)
    assert not np.allclose(layer.u.numpy(), u)


def test_seeded_initial_vector_reproduces():
    a, b, c = (SpectralDense(4, seed=s) for s in (5, 5, 6))
    for layer in (a, b, c):
        layer.build((None, 3))
    np.testing.assert_array_equal(a.u.numpy(), b.u.numpy())
    assert not np.allclose(a.u.numpy(), c.u.numpy())


def test_wrapper_keras_round_trip_gives_equal_outputs(tmp_path):
    x = np.random.default_rng(4).normal(size=(3, 8, 8, 1)).astype("float32")
    inputs = keras.Input((8, 8, 1))
    h = SpectralNormalization(keras.layers.Conv2D(2, 3, activation="relu"), norm_multiplier=0.9, seed=0)(inputs)
    h = keras.layers.Flatten()(h)
    outputs = SpectralNormalization(keras.layers.Dense(3), norm_multiplier=0.9, power_iterations=2, seed=1)(h)
    model = keras.Model(inputs, outputs)
    model.compile("sgd", "mse")
    model.fit(x, np.zeros((3, 3), "float32"), epochs=2, verbose=0)  # moves u and v
    path = os.path.join(tmp_path, "sn.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    config, loaded_config = model.layers[-1].get_config(), loaded.layers[-1].get_config()
    assert loaded_config["layer"]["config"] == config["layer"]["config"]  # (build_config: a tuple becomes a list)
    assert {k: v for k, v in loaded_config.items() if k != "layer"} == {k: v for k, v in config.items() if k != "layer"}
    for w, v in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(w.numpy(), v.numpy())
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


def test_extreme_kernels_stay_finite():
    layer = SpectralDense(3, norm_multiplier=0.95, seed=0)
    x = np.ones((2, 4), "float32")
    layer(x)
    layer.layer.kernel.assign(np.zeros((4, 3), "float32"))
    assert np.all(np.isfinite(layer(x, training=True).numpy()))
    layer.layer.kernel.assign(np.full((4, 3), 1e15, "float32"))
    y = layer(x, training=True).numpy()
    assert np.all(np.isfinite(y)) and layer.spectral_norm(normalized=True) == pytest.approx(0.95, rel=1e-4)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="Expected `layer` to be a keras.layers.Dense or keras.layers.Conv2D"):
        SpectralNormalization(keras.layers.LSTM(3))
    with pytest.raises(ValueError, match="groups=2"):
        SpectralNormalization(keras.layers.Conv2D(4, 3, groups=2))
    with pytest.raises(ValueError, match="norm_multiplier=0"):
        SpectralNormalization(keras.layers.Dense(3), norm_multiplier=0)
    with pytest.raises(ValueError, match="power_iterations=0"):
        SpectralDense(3, power_iterations=0)
    with pytest.raises(ValueError, match="kl_weight=0.1"):
        SpectralDense(3, kl_weight=0.1)


def test_zoo_spectral_layers_give_their_inner_layer_their_dtype_policy():
    for layer in (SpectralDense(3, dtype="mixed_bfloat16"), SpectralConv2D(2, 3, dtype="mixed_bfloat16")):
        for copy in (layer, type(layer).from_config(layer.get_config())):
            assert copy.layer.dtype_policy.name == copy.dtype_policy.name == "mixed_bfloat16"
