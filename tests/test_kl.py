"""KL numbers against closed forms, tfd.kl_divergence and a numerical integral."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import kl as kl_lib
from tfbnn import priors

tfd = tfp.distributions


def _normal_kl_by_hand(mu, sigma, m, s):
    return np.sum(np.log(s / sigma) + (sigma**2 + (mu - m) ** 2) / (2 * s**2) - 0.5)


def test_closed_form_kl_matches_tfd_and_hand_formula():
    rng = np.random.default_rng(0)
    mu = rng.normal(size=(7, 5)).astype("float32")
    sigma = rng.uniform(0.01, 2.0, size=(7, 5)).astype("float32")
    prior = priors.Normal(0.3, 0.7)
    got = float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), prior))
    via_tfd = float(tf.reduce_sum(tfd.kl_divergence(tfd.Normal(mu, sigma), tfd.Normal(0.3, 0.7))))
    np.testing.assert_allclose(got, via_tfd, rtol=1e-5)
    np.testing.assert_allclose(got, _normal_kl_by_hand(mu, sigma, 0.3, 0.7), rtol=1e-5)


def _layer(cls, prior, units=6, input_dim=5):
    layer = cls(units, kernel_prior=prior, bias_prior=prior, kl_weight=1.0, seed=3)
    layer.build((None, input_dim))
    return layer


def test_layer_kl_divergence_is_closed_form_for_normal_prior():
    for cls in (tfbnn.DenseReparameterization, tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization):
        layer = _layer(cls, priors.Normal(0.0, 0.5))
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -1.0, "float32"))
        mu_k, s_k = layer.kernel_loc.numpy(), layer.kernel_scale().numpy()
        mu_b, s_b = layer.bias_loc.numpy(), layer.bias_scale().numpy()
        np.testing.assert_allclose(s_k, np.log1p(np.exp(-1.0)) + 1e-6, rtol=1e-6)
        expected = _normal_kl_by_hand(mu_k, s_k, 0, 0.5) + _normal_kl_by_hand(mu_b, s_b, 0, 0.5)
        np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
        # The loss the layer adds is kl_weight * KL with the same KL.
        layer.set_kl_weight(0.25)
        layer(np.ones((2, 5), "float32"))
        np.testing.assert_allclose(float(layer.losses[0]), 0.25 * expected, rtol=1e-5)


def _mixture_kl_by_quadrature(mu, sigma, prior):
    """Per-weight KL(N(mu, sigma^2) || mixture) by numerical integration on a grid."""
    w = np.linspace(mu - 12 * sigma, mu + 12 * sigma, 200001)
    log_q = -0.5 * ((w - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)
    comp = [
        np.log(p) - 0.5 * (w / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)
        for p, s in ((prior.pi, prior.sigma1), (1 - prior.pi, prior.sigma2))
    ]
    log_p = np.logaddexp(*comp)
    return np.trapezoid(np.exp(log_q) * (log_q - log_p), w)


def test_monte_carlo_kl_of_scale_mixture_agrees_with_large_sample_estimate():
    prior = priors.ScaleMixture(0.25, 1.0, np.exp(-6))
    layer = tfbnn.DenseReparameterization(200, kernel_prior=prior, bias_prior=None, kl_weight=1.0, seed=3)
    layer.build((None, 100))  # a point-estimate bias: kl_divergence() is the kernel's alone
    mu, rho = 0.05, -3.0
    layer.kernel_loc.assign(np.full((100, 200), mu, "float32"))
    layer.kernel_rho.assign(np.full((100, 200), rho, "float32"))
    sigma = float(layer.kernel_scale().numpy()[0, 0])
    per_weight = _mixture_kl_by_quadrature(mu, sigma, prior)
    kernel_kl = [float(layer.kl_divergence()) for _ in range(5)]
    estimate = np.mean(kernel_kl) / (100 * 200)
    # 100k one-sample terms: the standard error is far below 1% of the KL.
    np.testing.assert_allclose(estimate, per_weight, rtol=0.01)
    assert np.std(kernel_kl) > 0, "the Monte Carlo KL must use fresh samples"


def test_monte_carlo_kl_from_noise_matches_log_prob_difference():
    prior = priors.ScaleMixture(0.5, 1.0, 0.1)
    loc = tf.constant([[0.1, -0.2], [0.3, 0.0]])
    scale = tf.constant([[0.5, 0.2], [0.1, 1.0]])
    eps = tf.constant([[0.3, -1.0], [2.0, 0.5]])
    w = loc + scale * eps
    expected = tf.reduce_sum(tfd.Normal(loc, scale).log_prob(w) - prior.distribution().log_prob(w))
    np.testing.assert_allclose(float(kl_lib.monte_carlo_kl(w, eps, scale, prior)), float(expected), rtol=1e-5)


def _check_fused_op(fused, reference_scale, rho, jit_compile, rtol=1e-4, atol=1e-5):
    """A fused scale/KL op against ``reference_scale(rho)`` and tfd.kl_divergence, values and autodiff gradients
    (eager, or in the one-reduction form the op takes inside an XLA-compiled function). Returns the op's gradients."""
    rng = np.random.default_rng(3)
    loc = tf.constant(rng.normal(0.2, 0.5, rho.shape), tf.float32)
    g_sigma = tf.constant(rng.normal(size=rho.shape), tf.float32)  # an arbitrary upstream gradient of sigma
    prior = priors.Normal(0.3, 1.7)
    contexts = []

    def loss(use_fused):
        with tf.GradientTape() as tape:
            tape.watch([loc, rho])
            if use_fused:
                contexts.append(kl_lib.in_xla_context())
                scale, kl = fused(loc, rho, prior)
            else:
                scale = reference_scale(rho)
                kl = tf.reduce_sum(tfd.kl_divergence(tfd.Normal(loc, scale), tfd.Normal(0.3, 1.7)))
            value = tf.reduce_sum(scale * g_sigma) + 0.37 * kl
        return (scale, kl), tape.gradient(value, [loc, rho])

    (scale, kl), grads = tf.function(lambda: loss(True), jit_compile=True)() if jit_compile else loss(True)
    assert contexts == [jit_compile]
    (scale_ref, kl_ref), grads_ref = loss(False)
    np.testing.assert_allclose(scale, scale_ref, rtol=1e-6)
    np.testing.assert_allclose(kl, kl_ref, rtol=1e-5)
    for got, want in zip(grads, grads_ref):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return grads


@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager", "xla"])
def test_fused_softplus_scale_and_kl_matches_tfd_values_and_autodiff_gradients(jit_compile):
    """The hand-written gradient of the fused sigma/KL op equals autodiff through tfd.kl_divergence."""
    # rho from -30 (sigma at the 1e-6 floor) to 30 (softplus ~ identity).
    rho = tf.constant(np.linspace(-30.0, 30.0, 35).reshape(7, 5), tf.float32)
    _check_fused_op(kl_lib.softplus_scale_and_normal_kl, lambda r: tf.nn.softplus(r) + 1e-6, rho, jit_compile)
    loc, prior = tf.zeros_like(rho), priors.Normal(0.3, 1.7)
    # sigma unused downstream (the KL alone): the gradient still flows.
    with tf.GradientTape() as tape:
        tape.watch(rho)
        kl_only = kl_lib.softplus_scale_and_normal_kl(loc, rho, prior)[1]
    assert np.all(np.isfinite(tape.gradient(kl_only, rho)))


@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager", "xla"])
def test_fused_log_variance_scale_and_kl_matches_tfd_values_and_autodiff_gradients(jit_compile):
    """The log-variance twin of the fused op: values of exp(clip(rho) / 2) and tfd.kl_divergence, and
    autodiff's gradient through both, the clip's zero gradient included."""
    low, high = kl_lib.LOG_VARIANCE_RANGE

    def reference(r):
        return tf.exp(0.5 * tf.clip_by_value(r, low, high))

    # rho from -90 to 45: both ends of the clip [-80, 40] are active at the extremes.
    rho = tf.constant(np.linspace(-90.0, 45.0, 35).reshape(7, 5), tf.float32)
    grads = _check_fused_op(kl_lib.log_variance_scale_and_normal_kl, reference, rho, jit_compile)
    clipped = (rho.numpy() < low) | (rho.numpy() > high)
    assert clipped.sum() >= 4 and np.all(grads[1].numpy()[clipped] == 0.0)
    # Moderate rho, where the values are O(1): a tight match of the gradient.
    moderate = tf.constant(np.linspace(-12.0, 3.0, 35).reshape(7, 5), tf.float32)
    _check_fused_op(kl_lib.log_variance_scale_and_normal_kl, reference, moderate, jit_compile, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cls", [tfbnn.DenseReparameterization, tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization])
def test_log_variance_layers_with_a_normal_prior_keep_the_closed_form_kl(cls):
    """The log-variance layers with a Normal prior take the fused op: the layer's KL is tfd's, and
    finite at extreme rho."""
    layer = cls(3, scale_parameterization="log_variance", bias_prior="normal", kernel_prior=priors.Normal(0.1, 0.5),
                kl_weight=1.0, seed=2)
    layer.build((None, 4))
    rng = np.random.default_rng(5)
    layer.kernel_loc.assign(rng.normal(size=(4, 3)).astype("float32"))
    layer.kernel_rho.assign(rng.uniform(-12.0, 2.0, (4, 3)).astype("float32"))
    expected = 0.0
    for loc, rho, prior in ((layer.kernel_loc, layer.kernel_rho, (0.1, 0.5)), (layer.bias_loc, layer.bias_rho, (0.0, 1.0))):
        q = tfd.Normal(loc, tf.exp(0.5 * rho))
        expected += float(tf.reduce_sum(tfd.kl_divergence(q, tfd.Normal(*prior))))
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
    for rho in (-1e4, 1e4):
        layer.kernel_rho.assign(np.full((4, 3), rho, "float32"))
        assert np.isfinite(float(layer.kl_divergence()))
