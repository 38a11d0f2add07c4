"""posterior="low_rank" of the Bayes-by-Backprop layers: N(mu, diag(sigma^2) + L L^T) over the kernel.

Checked against dense multivariate normals built independently (tfd.MultivariateNormalTriL
from the full covariance, TFP's registered KL), sample moments, and the mean-field KL.
"""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import testing
from tfbnn.layers import conv

tfd = tfp.distributions
LOW_RANK = {"posterior": "low_rank", "posterior_rank": 2}


@pytest.mark.parametrize("cls, kwargs, shape, out", [
    (tfbnn.DenseReparameterization, {"units": 3}, (4, 5), (4, 3)),
    (tfbnn.DenseLocalReparameterization, {"units": 3, "kernel_prior": "scale_mixture"}, (4, 5), (4, 3)),
    (conv.Conv2DReparameterization, {"filters": 2, "kernel_size": 3}, (2, 5, 5, 2), (2, 3, 3, 2)),
    (conv.Conv1DTransposeReparameterization, {"filters": 2, "kernel_size": 3, "strides": 2}, (2, 4, 2), (2, 9, 2)),
])
def test_low_rank_basics(cls, kwargs, shape, out):
    layer = testing.run_layer_test(cls, {**kwargs, **LOW_RANK, "seed": 3}, input_shape=shape,
                                   expected_output_shape=out, expected_num_trainable_weights=5)
    assert layer.kernel_factor.shape == tuple(layer.kernel_loc.shape) + (2,)
    assert layer.get_config()["posterior"] == "low_rank"


def _layer(cls=tfbnn.DenseReparameterization, args=(3,), build_shape=(None, 4), prior=None, rank=2, **kwargs):
    layer = cls(*args, posterior="low_rank", posterior_rank=rank, seed=1, kl_weight=1.0,
                kernel_prior=prior or tfbnn.priors.Normal(0.1, 0.5),
                kernel_scale_initializer=keras.initializers.Constant(-1.5),
                kernel_factor_initializer=keras.initializers.RandomNormal(stddev=0.3, seed=2), **kwargs)
    layer.build(build_shape)
    return layer


def _dense_posterior(layer):
    """The kernel posterior as a dense MultivariateNormalTriL (float64) built from the variables."""
    mu = layer.kernel_loc.numpy().ravel().astype("float64")
    sigma = layer.kernel_scale().numpy().ravel().astype("float64")
    factor = layer.kernel_factor.numpy().reshape(mu.size, -1).astype("float64")
    covariance = factor @ factor.T + np.diag(sigma**2)
    return mu, covariance, tfd.MultivariateNormalTriL(mu, np.linalg.cholesky(covariance))


def _bias_kl(layer):
    return float(tf.reduce_sum(tfd.kl_divergence(tfd.Normal(layer.bias_loc, layer.bias_scale()), tfd.Normal(0.0, 1.0))))


@pytest.mark.parametrize("cls, args, build_shape", [
    (tfbnn.DenseReparameterization, (3,), (None, 4)),
    (conv.Conv2DReparameterization, (2, 2), (None, 4, 4, 2)),
    (conv.Conv3DTransposeReparameterization, (2, 2), (None, 2, 2, 2, 1)),
])
def test_kl_is_tfd_kl_between_the_dense_multivariate_normals(cls, args, build_shape):
    layer = _layer(cls, args, build_shape, rank=3)
    mu, _, q = _dense_posterior(layer)
    p = tfd.MultivariateNormalDiag(np.full(mu.size, 0.1), np.full(mu.size, 0.5))
    expected = float(tfd.kl_divergence(q, p)) + _bias_kl(layer)
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
    x = np.ones((2,) + build_shape[1:], "float32")
    layer(x)
    np.testing.assert_allclose(float(layer.losses[0]), expected, rtol=1e-5)


def test_kl_to_a_per_weight_prior_is_tfd_kl():
    rng = np.random.default_rng(0)
    prior = tfbnn.priors.Posterior(rng.normal(size=(4, 3)), rng.uniform(0.2, 1.0, size=(4, 3)))
    layer = _layer(prior=prior)
    mu, _, q = _dense_posterior(layer)
    p = tfd.MultivariateNormalDiag(prior.loc.ravel().astype("float64"), prior.scale.ravel().astype("float64"))
    np.testing.assert_allclose(float(layer.kl_divergence()), float(tfd.kl_divergence(q, p)) + _bias_kl(layer),
                               rtol=1e-5)


def test_the_layer_and_dense_variational_share_one_low_rank_kl():
    """The layer's kernel posterior and the TFP-registered KL are one LowRankGaussian."""
    layer = tfbnn.layers.DenseReparameterization(3, posterior="low_rank", posterior_rank=2, bias_prior=None,
                                                 kernel_prior=tfbnn.priors.Normal(0.1, 0.6), seed=1)
    layer.build((None, 4))
    layer.kernel_factor.assign(np.random.default_rng(0).normal(scale=0.3, size=(4, 3, 2)).astype("float32"))
    mu, scale = tf.reshape(layer.kernel_loc, [-1]), tf.reshape(layer.kernel_scale(), [-1])
    q = tfd.MultivariateNormalDiagPlusLowRankCovariance(mu, cov_diag_factor=tf.square(scale),
                                                        cov_perturb_factor=tf.reshape(layer.kernel_factor, [12, 2]))
    p = tfd.MultivariateNormalDiag(tf.fill([12], 0.1), tf.fill([12], 0.6))
    np.testing.assert_allclose(float(layer.kl_divergence()), float(tfd.kl_divergence(q, p)), rtol=1e-6)
    low_rank = tfbnn.kl.LowRankGaussian.from_kernel(layer.kernel_loc, layer.kernel_scale(), layer.kernel_factor)
    np.testing.assert_allclose(low_rank.covariance().numpy(), q.covariance().numpy(), rtol=1e-6, atol=1e-7)
    assert float(low_rank.kl_to_diagonal(0.1, 0.6)) == float(layer.kl_divergence())


def test_the_log_density_is_the_dense_multivariate_normal_log_prob():
    layer = _layer()
    mu, _, q = _dense_posterior(layer)
    delta = np.random.default_rng(1).normal(scale=0.3, size=(5, mu.size))
    log_q = tfbnn.kl.low_rank_log_prob(tf.constant(delta.reshape(5, 4, 3), tf.float32), layer.kernel_scale(),
                                       layer.kernel_factor)
    np.testing.assert_allclose(log_q.numpy(), q.log_prob(mu + delta).numpy(), rtol=1e-5)
    np.testing.assert_allclose(
        float(tfbnn.kl.low_rank_log_det(tf.square(tf.reshape(layer.kernel_scale(), [-1])),
                                        tf.reshape(layer.kernel_factor, [12, 2]))),
        np.linalg.slogdet(_dense_posterior(layer)[1])[1], rtol=1e-5)


def test_kernel_samples_have_the_low_rank_covariance():
    layer = _layer(rank=2)
    mu, covariance, _ = _dense_posterior(layer)
    samples, _ = layer._sample_kernel(layer.kernel_scale(), num_samples=20000, kl=tf.constant(0.0))
    flat = samples.numpy().reshape(20000, -1)
    np.testing.assert_allclose(flat.mean(0), mu, atol=0.02)
    np.testing.assert_allclose(np.cov(flat.T), covariance, atol=0.01)


def test_local_reparameterization_samples_have_the_exact_preactivation_covariance():
    layer = _layer(tfbnn.DenseLocalReparameterization, bias_prior=None)
    x = np.array([[0.5, -1.0, 2.0, 1.0]], "float32")
    y = layer(np.tile(x, (20000, 1))).numpy()
    mu, covariance, _ = _dense_posterior(layer)
    # y = x W + b with vec(W) ~ N(mu, Sigma): y = A vec(W) + b, A = x (kron) I_units.
    a = np.kron(x.astype("float64"), np.eye(3))
    np.testing.assert_allclose(y.mean(0), a @ mu + layer.bias_loc.numpy(), atol=0.03)
    np.testing.assert_allclose(np.cov(y.T), a @ covariance @ a.T, atol=0.04, rtol=0.05)
    _, variance = layer.preactivation_moments(x)
    np.testing.assert_allclose(variance.numpy()[0], np.diag(a @ covariance @ a.T), rtol=1e-5)


@pytest.mark.parametrize("joint", [True, False])
def test_predict_draws_distinct_samples(joint):
    layer = _layer()
    model = keras.Sequential([keras.Input((4,)), layer])
    x = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    with tfbnn.weight_samples(model, 3, joint=joint):
        y = model(np.tile(x, (3, 1))).numpy().reshape(3, 2, 3)
    assert all(not np.allclose(y[i], y[j]) for i in range(3) for j in range(i + 1, 3))
    res = tfbnn.predict(keras.Sequential([keras.Input((4,)), _layer(), keras.layers.Softmax()]), x, num_samples=5)
    assert res.mean_probs.shape == (2, 3) and np.all(res.epistemic > 0)


def test_monte_carlo_kl_for_the_scale_mixture_averages_to_the_sampled_reference():
    prior = tfbnn.priors.get("scale_mixture")
    layer = _layer(prior=prior, bias_prior=None)
    mu, _, q = _dense_posterior(layer)
    w = q.sample(20000, seed=3).numpy()
    reference = np.mean(q.log_prob(w).numpy() - np.sum(prior.log_prob(w.astype("float32")).numpy(), -1))
    kl = tf.function(layer.kl_divergence)
    estimates = [float(kl()) for _ in range(200)]
    assert abs(np.mean(estimates) - reference) < 4 * np.std(estimates) / np.sqrt(200) + 0.05


def test_zero_factor_gives_the_mean_field_kl_at_1200_by_1200():
    """The scale case: a 1200 x 1200 kernel (1.44M weights), rank 8, never an n x n matrix."""
    layer = tfbnn.DenseReparameterization(1200, posterior="low_rank", posterior_rank=8, bias_prior=None,
                                          kernel_factor_initializer="zeros", kl_weight=1.0, seed=0)
    mean_field = tfbnn.DenseReparameterization(1200, bias_prior=None, kl_weight=1.0, seed=0)
    x = np.random.default_rng(0).normal(size=(4, 1200)).astype("float32")
    layer(x), mean_field(x)
    mean_field.kernel_loc.assign(layer.kernel_loc)
    start = time.perf_counter()
    kl = float(layer.kl_divergence())
    assert time.perf_counter() - start < 5.0
    np.testing.assert_allclose(kl, float(mean_field.kl_divergence()), rtol=1e-4)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x, training=True)) + layer.losses[0]
    grads = tape.gradient(loss, layer.trainable_weights)
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)


@pytest.mark.parametrize("cls", [tfbnn.DenseFlipout, conv.Conv2DFlipout, conv.Conv2DTransposeFlipout])
def test_flipout_rejects_a_low_rank_posterior(cls):
    args = (3,) if cls is tfbnn.DenseFlipout else (3, 3)
    with pytest.raises(ValueError, match="posterior='low_rank'"):
        cls(*args, posterior="low_rank")


def test_bad_low_rank_arguments():
    with pytest.raises(ValueError, match="posterior='full'"):
        tfbnn.DenseReparameterization(3, posterior="full")
    with pytest.raises(ValueError, match="posterior_rank=0"):
        tfbnn.DenseReparameterization(3, posterior="low_rank", posterior_rank=0)
    with pytest.raises(ValueError, match="posterior_rank=7"):
        tfbnn.DenseReparameterization(3, posterior="low_rank", posterior_rank=7).build((None, 2))
    with pytest.raises(ValueError, match="kernel_prior=Graves"):
        tfbnn.layers.GravesDense(3, kernel_prior="graves", posterior="low_rank").build((None, 2))
    layer = _layer()
    with pytest.raises(ValueError, match="Received: posterior='low_rank'"):
        layer.posterior_as_prior()


def test_mixed_precision_keeps_the_factor_and_the_kl_in_float32():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = tfbnn.DenseReparameterization(3, posterior="low_rank", kl_weight=1.0, seed=0)
        y = layer(np.ones((2, 4), "float32"))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert y.dtype == "float16" and layer.kernel_factor.dtype == "float32"
    assert layer.losses[0].dtype == "float32"
    # The float32 KL from the float32 variables, recomputed outside the mixed policy.
    np.testing.assert_allclose(float(layer.losses[0]), float(layer.kl_divergence()), rtol=1e-3)
