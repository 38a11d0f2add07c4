"""The random-feature GP output layer (tfbnn.layers.gp): the Laplace covariance against NumPy's closed forms."""

import math
import os

import keras
import numpy as np
import pytest

from tfbnn import testing
from tfbnn.layers import RandomFeatureGaussianProcess


def _x(n, d=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype("float32")


def _features(layer, x):
    """The random features, computed in NumPy from the layer's fixed weights."""
    w, b = layer.feature_kernel.numpy().astype(np.float64), layer.feature_bias.numpy().astype(np.float64)
    phi = np.cos(x.astype(np.float64) @ w / math.sqrt(layer.gp_kernel_scale) + b)
    return phi * math.sqrt(2.0 / layer.num_inducing)


def _logits(layer, phi):
    return phi @ layer.kernel.numpy().astype(np.float64) + layer.bias.numpy()


def _softmax(f):
    e = np.exp(f - f.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_gp_layer_basics():
    testing.run_layer_test(RandomFeatureGaussianProcess, {"units": 3, "num_inducing": 8, "activation": "softmax",
                                                          "normalize_input": True, "seed": 0}, (4, 5), (4, 3),
                           expected_num_losses=0, expected_num_seed_generators=0)


def test_random_features_approximate_the_rbf_kernel():
    layer = RandomFeatureGaussianProcess(1, num_inducing=8192, gp_kernel_scale=2.0, seed=0)
    x = _x(6, d=3) * 0.7
    layer.build(x.shape)
    phi = layer.features(x).numpy().astype(np.float64)
    np.testing.assert_allclose(phi, _features(layer, x), rtol=1e-4, atol=1e-5)
    squared = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    # Rahimi & Recht: the error of D features is O(1 / sqrt(D)) (about 0.016 here).
    np.testing.assert_allclose(phi @ phi.T, np.exp(-squared / (2 * 2.0)), atol=0.06)


def test_regression_posterior_covariance_is_the_closed_form():
    ridge = 0.5
    layer = RandomFeatureGaussianProcess(2, num_inducing=16, gp_cov_ridge_penalty=ridge, gp_cov_likelihood="gaussian",
                                         seed=1)
    batches = [_x(10, seed=1), _x(7, seed=2)]
    for batch in batches:  # the exact sum over an "epoch" of two batches
        layer(batch, training=True)
    phi = _features(layer, np.concatenate(batches))
    sigma = np.linalg.inv(ridge * np.eye(16) + phi.T @ phi)
    np.testing.assert_allclose(layer.covariance().numpy(), sigma, rtol=1e-3, atol=1e-5)
    test = _x(5, seed=3)
    phi_test = _features(layer, test)
    expected = phi_test @ sigma @ phi_test.T
    np.testing.assert_allclose(layer.posterior_covariance(test).numpy(), expected, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(layer.predictive_variance(test).numpy(), np.diag(expected), rtol=1e-3, atol=1e-6)
    # A Gaussian likelihood: the outputs are the posterior mean, no adjustment.
    np.testing.assert_allclose(layer(test).numpy(), _logits(layer, phi_test), rtol=1e-4, atol=1e-5)
    layer.reset_covariance()
    np.testing.assert_array_equal(layer.precision.numpy(), ridge * np.eye(16))


def _assert_mean_field_outputs(layer, precision):
    """The layer's inference outputs are softmax(logits / sqrt(1 + pi / 8 var)) with ``var`` from ``precision``
    (Liu et al. 2020, eq. 10); returns the test inputs' features."""
    test = _x(4, seed=5) * 3.0
    phi_test = _features(layer, test)
    var = np.einsum("bi,ij,bj->b", phi_test, np.linalg.inv(precision), phi_test)
    expected = _softmax(_logits(layer, phi_test) / np.sqrt(1 + math.pi / 8 * var)[:, None])
    np.testing.assert_allclose(layer(test).numpy(), expected, rtol=1e-4, atol=1e-6)
    return test, phi_test


def test_the_default_precision_weights_are_gaussian_for_a_classifier_too_as_in_edward2():
    layer = RandomFeatureGaussianProcess(3, num_inducing=12, activation="softmax", seed=2)
    x = _x(20, seed=4)
    layer(x, training=True)
    assert layer.gp_cov_likelihood == "gaussian" and layer.is_classifier and not layer.logistic_weights
    phi = _features(layer, x)
    precision = np.eye(12) + phi.T @ phi  # w_i = 1
    np.testing.assert_allclose(layer.precision.numpy(), precision, rtol=1e-4, atol=1e-5)
    _assert_mean_field_outputs(layer, precision)  # whatever the weights


@pytest.mark.parametrize("likelihood", ["logistic", "auto"])
def test_classification_laplace_precision_and_mean_field_outputs(likelihood):
    layer = RandomFeatureGaussianProcess(3, num_inducing=12, activation="softmax", gp_cov_likelihood=likelihood,
                                         seed=2)
    x = _x(20, seed=4)
    layer(x, training=True)
    assert layer.is_classifier and layer.logistic_weights
    phi = _features(layer, x)
    p = _softmax(_logits(layer, phi)).max(axis=1)  # the largest class probability
    precision = np.eye(12) + (phi * (p * (1 - p))[:, None]).T @ phi
    np.testing.assert_allclose(layer.precision.numpy(), precision, rtol=1e-4, atol=1e-6)
    test, phi_test = _assert_mean_field_outputs(layer, precision)
    # Training outputs are the unadjusted softmax.
    np.testing.assert_allclose(layer(test, training=True).numpy(), _softmax(_logits(layer, phi_test)),
                               rtol=1e-4, atol=1e-6)


def test_one_unit_uses_the_sigmoid_and_the_moving_average():
    m = 0.9
    layer = RandomFeatureGaussianProcess(1, num_inducing=8, activation="sigmoid", gp_cov_momentum=m,
                                         gp_cov_likelihood="logistic", seed=3)
    batches = [_x(6, seed=6), _x(9, seed=7)]
    layer.build(batches[0].shape)
    expected = np.eye(8)
    for batch in batches:
        phi = _features(layer, batch)
        p = 1 / (1 + np.exp(-_logits(layer, phi)[:, 0]))
        expected = m * expected + (1 - m) * (phi * (p * (1 - p))[:, None]).T @ phi / len(batch)
        layer(batch, training=True)
    np.testing.assert_allclose(layer.precision.numpy(), expected, rtol=1e-4, atol=1e-7)


def test_seeded_features_reproduce():
    x = _x(3)
    a, b, c = (RandomFeatureGaussianProcess(2, num_inducing=8, seed=s) for s in (4, 4, 5))
    for layer in (a, b, c):
        layer.build(x.shape)
    np.testing.assert_array_equal(a.features(x).numpy(), b.features(x).numpy())
    assert not np.allclose(a.feature_kernel.numpy(), c.feature_kernel.numpy())
    assert not np.allclose(a.feature_bias.numpy(), c.feature_bias.numpy())


def test_keras_round_trip_keeps_the_covariance(tmp_path):
    inputs = keras.Input((4,))
    outputs = RandomFeatureGaussianProcess(3, num_inducing=16, normalize_input=True, activation="softmax", seed=0)(
        keras.layers.Dense(4)(inputs))
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy")
    x = _x(12)
    model.fit(x, np.arange(12) % 3, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "gp.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.layers[-1].get_config() == model.layers[-1].get_config()
    np.testing.assert_array_equal(loaded.layers[-1].precision.numpy(), model.layers[-1].precision.numpy())
    assert not np.allclose(model.layers[-1].precision.numpy(), np.eye(16))
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


def test_extreme_inputs_stay_finite():
    layer = RandomFeatureGaussianProcess(3, num_inducing=8, activation="softmax", gp_cov_ridge_penalty=1e-6, seed=0)
    x = np.full((2, 4), 1e6, "float32")
    layer(x, training=True)
    assert np.all(np.isfinite(layer(x).numpy())) and np.all(np.isfinite(layer.predictive_variance(x).numpy()))


@pytest.mark.parametrize("kwargs, message", [
    ({"units": 0}, "units=0"),
    ({"num_inducing": 0}, "num_inducing=0"),
    ({"gp_kernel_scale": -1.0}, "gp_kernel_scale=-1.0"),
    ({"gp_cov_momentum": 1.0}, "gp_cov_momentum=1.0"),
    ({"gp_cov_ridge_penalty": 0.0}, "gp_cov_ridge_penalty=0.0"),
    ({"gp_cov_likelihood": "poisson"}, "gp_cov_likelihood='poisson'"),
    ({"mean_field_factor": -0.1}, "mean_field_factor=-0.1"),
])
def test_bad_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandomFeatureGaussianProcess(**{"units": 2, **kwargs})


def test_inputs_of_rank_other_than_two_are_an_error():
    with pytest.raises(ValueError, match=r"Expected inputs of shape \(batch, features\)"):
        RandomFeatureGaussianProcess(2)(np.ones((2, 3, 4), "float32"))
