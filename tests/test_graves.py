"""Graves (2011): the log-variance posterior on the core dense layers and the fitted Gaussian prior."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import kl as kl_lib
from tfbnn import priors, testing

tfd = tfp.distributions


def test_graves_dense_basics():
    testing.run_layer_test(
        tfbnn.layers.GravesDense,
        {"units": 3, "activation": "relu", "seed": 7},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_trainable_weights=3,
    )


@pytest.mark.parametrize("cls", [tfbnn.DenseReparameterization, tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization])
def test_core_dense_layers_take_the_log_variance_parameterization(cls):
    layer = testing.run_layer_test(
        cls,
        {"units": 3, "kernel_prior": "graves", "posterior_parameterization": "log_variance", "seed": 7},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_trainable_weights=4,
        run_save_load=cls is tfbnn.DenseFlipout,
        run_training=cls is tfbnn.DenseFlipout,
    )
    # sigma^2 = exp(rho); the default rho gives the softplus default's sigma.
    np.testing.assert_allclose(layer.kernel_scale().numpy(), np.exp(-5.0), rtol=1e-5)
    np.testing.assert_allclose(np.exp(-5.0), np.log1p(np.exp(-5.0)), rtol=0.01)
    layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, 1.5, "float32"))
    np.testing.assert_allclose(layer.kernel_scale().numpy() ** 2, np.exp(1.5), rtol=1e-5)


def test_log_variance_scale_is_finite_at_extreme_rho():
    layer = tfbnn.layers.GravesDense(2, kl_weight=1.0)
    layer.build((None, 3))
    for rho in (-1e4, 1e4):
        layer.kernel_rho.assign(np.full((3, 2), rho, "float32"))
        assert np.all(np.isfinite(layer.kernel_scale().numpy())) and np.all(layer.kernel_scale().numpy() > 0)
        assert np.isfinite(float(layer.kl_divergence()))


def _graves_kl_by_hand(mu, sigma):
    mu_p = mu.mean()
    var_p = np.mean(sigma**2 + (mu - mu_p) ** 2)
    return np.sum(np.log(np.sqrt(var_p) / sigma) + (sigma**2 + (mu - mu_p) ** 2) / (2 * var_p) - 0.5), mu_p, var_p


def test_graves_prior_is_the_closed_form_optimum():
    rng = np.random.default_rng(0)
    mu = rng.normal(0.3, 0.5, size=(6, 4))
    sigma = rng.uniform(0.05, 0.4, size=(6, 4))
    prior = priors.get("graves")
    assert isinstance(prior, priors.Graves) and prior.adaptive
    got = float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), prior))
    expected, mu_p, var_p = _graves_kl_by_hand(mu, sigma)
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    # = n log sigma_p - sum log sigma_i, and = tfd's KL against the fitted Normal.
    np.testing.assert_allclose(got, mu.size * 0.5 * np.log(var_p) - np.log(sigma).sum(), rtol=1e-10)
    via_tfd = tf.reduce_sum(tfd.kl_divergence(tfd.Normal(mu, sigma), tfd.Normal(mu_p, np.sqrt(var_p))))
    np.testing.assert_allclose(got, float(via_tfd), rtol=1e-10)
    # The fitted prior beats any fixed Gaussian prior.
    for loc, scale in ((0.0, 1.0), (0.3, 0.5), (float(mu_p), float(np.sqrt(var_p)) * 1.1)):
        fixed = float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), priors.Graves(loc, scale)))
        assert fixed > got
    # Fixed parameters give the plain Normal prior's KL.
    np.testing.assert_allclose(
        float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), priors.Graves(0.1, 0.7))),
        float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), priors.Normal(0.1, 0.7))),
        rtol=1e-10,
    )


def test_graves_dense_layer_kl_and_loss():
    layer = tfbnn.layers.GravesDense(4, kl_weight=0.25, seed=1)
    layer.build((None, 3))
    layer.kernel_rho.assign(np.random.default_rng(1).uniform(-6, -1, size=(3, 4)).astype("float32"))
    mu, sigma = layer.kernel_loc.numpy().astype(np.float64), layer.kernel_scale().numpy().astype(np.float64)
    np.testing.assert_allclose(sigma**2, np.exp(layer.kernel_rho.numpy()), rtol=1e-5)
    expected = _graves_kl_by_hand(mu, sigma)[0]
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-4)
    layer(np.ones((2, 3), "float32"))
    np.testing.assert_allclose(float(layer.losses[0]), 0.25 * expected, rtol=1e-4)


def test_graves_prior_serializes_and_rejects_bad_values():
    for prior in (priors.Graves(), priors.Graves(0.0, 0.2)):
        assert priors.deserialize(priors.serialize(prior)) == prior
    with pytest.raises(ValueError, match="scale=-1.0"):
        priors.Graves(0.0, -1.0)
    with pytest.raises(ValueError, match="loc=nan"):
        priors.Graves(float("nan"))
    with pytest.raises(ValueError, match="depends on the posterior"):
        priors.Graves().distribution()
    with pytest.raises(ValueError, match="posterior_parameterization='exp'"):
        tfbnn.DenseFlipout(3, posterior_parameterization="exp")
