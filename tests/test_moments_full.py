"""tfbnn.moments with covariance="full" (Wu et al. 2019): against adaptive quadrature, a numerical double
integral and an exact Monte Carlo of the same posterior (NumPy weight draws, never tfbnn's own sampling).

The Monte Carlo references allow five standard errors: the mean's ``sqrt(s^2 / T)`` and a covariance
entry's ``sqrt(Var[(a - E a)(b - E b)] / T)``.
"""

import math

import keras
import numpy as np
import pytest
import scipy.integrate
import scipy.stats
import tensorflow as tf

import tfbnn
from tfbnn import export, moments

T = 100_000
CHUNK = 10_000


def _const(value):
    return keras.initializers.Constant(value)


def _plackett(h, k, rho):
    """Phi_2(h, k; rho) = Phi(h) Phi(k) + int_0^rho phi_2(h, k; t) dt, by adaptive quadrature in t."""
    def density(t):
        return math.exp(-(h * h - 2 * t * h * k + k * k) / (2 * (1 - t * t))) / (2 * math.pi * math.sqrt(1 - t * t))
    return (scipy.stats.norm.cdf(h) * scipy.stats.norm.cdf(k)
            + scipy.integrate.quad(density, 0.0, rho, epsabs=1e-14, epsrel=1e-12, limit=200)[0])


def test_bivariate_normal_cdf_equals_adaptive_quadrature_up_to_perfect_correlation():
    rng = np.random.default_rng(0)
    n = 240
    h, k = rng.normal(size=n) * 2, rng.normal(size=n) * 2
    k[:60] = h[:60] + np.sign(rng.normal(size=60)) * 10 ** rng.uniform(-7, -1, 60)  # the boundary layer at h ~ k
    rho = np.concatenate([rng.uniform(-1, 1, n - 80), 1 - 10 ** rng.uniform(-7, -1, 40),
                          -1 + 10 ** rng.uniform(-7, -1, 40)])
    want = np.array([_plackett(a, b, r) for a, b, r in zip(h, k, rho)])
    got = moments.bivariate_normal_cdf(h, k, rho).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    # The limits rho = +-1 and scipy's own (Genz's) routine at a few points.
    limits = moments.bivariate_normal_cdf(np.float64([0.3, 1.0, -0.4, -0.4]), np.float64([-0.5, 0.2, 0.6, 0.3]),
                                          np.float64([1.0, -1.0, -1.0, -1.0])).numpy()
    phi = scipy.stats.norm.cdf  # rho = 1: Phi(min(h, k)); rho = -1: max(0, Phi(h) - Phi(-k))
    np.testing.assert_allclose(limits, [phi(-0.5), phi(1.0) - phi(-0.2), phi(-0.4) - phi(-0.6), 0.0], atol=1e-12)
    for a, b, r in [(0.5, -0.2, 0.3), (-1.0, 1.5, -0.8), (2.0, 2.1, 0.95)]:
        genz = scipy.stats.multivariate_normal(cov=[[1, r], [r, 1]]).cdf([a, b])
        assert float(moments.bivariate_normal_cdf(a, b, r)) == pytest.approx(genz, abs=1e-5)
    with pytest.raises(ValueError, match="Expected `rho` to hold correlations in \\[-1, 1\\]. Received: rho with min"):
        moments.bivariate_normal_cdf(0.0, 0.0, 1.5)


def _relu_pair_covariance(m, c):
    """Cov(relu(a), relu(b)) for (a, b) ~ N(m, c), by a numerical double integral over the positive quadrant."""
    s = np.sqrt(np.diag(c))
    pdf = scipy.stats.multivariate_normal(m, c).pdf
    second = scipy.integrate.dblquad(lambda y, x: x * y * pdf([x, y]), 0, max(m[0] + 10 * s[0], 1e-9),
                                     0, max(m[1] + 10 * s[1], 1e-9), epsabs=1e-11)[0]
    means = [si * (mi / si * scipy.stats.norm.cdf(mi / si) + scipy.stats.norm.pdf(mi / si)) for mi, si in zip(m, s)]
    return second - means[0] * means[1]


@pytest.mark.parametrize("m, c", [
    ([0.3, -0.5], [[1.0, 0.6], [0.6, 2.0]]),
    ([1.5, 2.0], [[0.5, -0.3], [-0.3, 0.4]]),
    ([-1.0, 0.2], [[2.0, 1.99], [1.99, 2.0]]),
    ([4.0, 3.0], [[1.0, 0.9], [0.9, 1.0]]),
])
def test_relu_covariance_equals_a_numerical_double_integral(m, c):
    want = _relu_pair_covariance(np.array(m), np.array(c))
    for dtype, tol in (("float64", 1e-7), ("float32", 2e-6)):
        mean, cov = moments.relu_covariance(np.array([m], dtype), np.array([c], dtype))
        assert float(cov[0, 0, 1]) == pytest.approx(want, abs=tol), dtype
        assert float(cov[0, 1, 0]) == float(cov[0, 0, 1])
        relu_mean, relu_var = moments.relu_moments(np.array(m, dtype), np.diag(c).astype(dtype))
        np.testing.assert_allclose(np.diag(cov[0]), relu_var, rtol=1e-6)
        np.testing.assert_allclose(mean[0], relu_mean, rtol=1e-6)


def test_relu_covariance_of_independent_or_constant_units_is_zero_and_perfect_correlation_is_the_variance():
    mean = np.float32([[0.5, -0.2, 3.0]])
    cov = np.float32([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]])
    out = moments.relu_covariance(mean, cov)[1].numpy()[0]
    np.testing.assert_array_equal(out[~np.eye(3, dtype=bool)], 0.0)
    same = moments.relu_covariance(np.zeros((1, 2), "float64"), np.ones((1, 2, 2)))[1].numpy()[0]
    np.testing.assert_allclose(same, 0.5 - 1 / (2 * np.pi), rtol=1e-7)  # a_1 = a_2: Cov = Var[relu(a)]
    with pytest.raises(ValueError, match=r"Expected `covariance` of shape \(\.\.\., d, d\) for `mean` of shape"):
        moments.relu_covariance(np.zeros((1, 2), "float32"), np.ones((1, 3, 3), "float32"))


# -- networks against an exact Monte Carlo ----------------------------------------------------------------
class _Moments:
    """Running mean and covariance of T draws ``(T, B, d)``, with the standard errors of both."""

    def __init__(self):
        self.parts = []

    def add(self, draws):
        self.parts.append(draws)

    def finish(self):
        draws = np.concatenate(self.parts)
        self.mean = draws.mean(0)
        self.se_mean = np.sqrt(draws.var(0) / len(draws))
        first = second = 0.0
        for part in np.split(draws - self.mean, len(draws) // CHUNK):  # (CHUNK, B, d, d) at a time
            products = part[..., :, None] * part[..., None, :]
            first, second = first + products.sum(0), second + np.square(products).sum(0)
        self.cov = first / len(draws)
        self.se_cov = np.sqrt((second / len(draws) - np.square(self.cov)) / len(draws))
        return self


def _kernel_draws(layer, rng, num):
    loc, scale = layer.kernel_loc.numpy(), layer.kernel_scale().numpy()
    bias_loc, bias_scale = layer.bias_loc.numpy(), layer.bias_scale().numpy()
    return (loc + scale * rng.standard_normal((num, *loc.shape)),
            bias_loc + bias_scale * rng.standard_normal((num, *bias_loc.shape)))


def _two_hidden_layers():
    """x -> DenseFlipout(16, relu) -> DenseFlipout(16) -> ReLU -> DenseFlipout(3): the second and third kernels'
    means are positive, so the hidden units move together, as in a trained network, and the diagonal rule
    understates the output variance."""
    def dense(units, seed, activation=None, positive=True):
        init = keras.initializers.RandomUniform(0.0, 1.0, seed=seed) if positive else \
            keras.initializers.GlorotUniform(seed=seed)
        return tfbnn.layers.DenseFlipout(units, activation=activation, kernel_initializer=init,
                                         kernel_scale_initializer=_const(-2.0), bias_scale_initializer=_const(-2.0),
                                         seed=seed)
    return keras.Sequential([keras.Input((4,)), dense(16, 0, "relu", positive=False), dense(16, 1),
                             keras.layers.ReLU(), dense(3, 2)])


def test_full_covariance_two_hidden_layers_against_an_exact_monte_carlo():
    model = _two_hidden_layers()
    x = np.random.default_rng(3).normal(size=(3, 4)).astype("float32")
    model(x)
    dense_layers = [model.layers[0], model.layers[1], model.layers[3]]
    rng = np.random.default_rng(0)
    stages = [_Moments() for _ in range(4)]  # relu(layer 1), layer 2 (pre-activation), relu(layer 2), logits
    for _ in range(T // CHUNK):
        (k1, b1), (k2, b2), (k3, b3) = (_kernel_draws(layer, rng, CHUNK) for layer in dense_layers)
        h1 = np.maximum(np.einsum("bi,tio->tbo", x, k1) + b1[:, None], 0)
        a2 = np.einsum("tbi,tio->tbo", h1, k2) + b2[:, None]
        h2 = np.maximum(a2, 0)
        for stage, draws in zip(stages, (h1, a2, h2, np.einsum("tbi,tio->tbo", h2, k3) + b3[:, None])):
            stage.add(draws)
    stages = [stage.finish() for stage in stages]
    outputs = [moments.propagate(keras.Sequential(model.layers[:n]), x, covariance="full") for n in (1, 2, 3, 4)]
    diagonal = moments.propagate(model, x)

    # The first two layers' outputs (the second before its ReLU): exact, mean and every covariance entry.
    for out, mc in zip(outputs[:2], stages[:2]):
        np.testing.assert_array_less(np.abs(out.mean.numpy() - mc.mean), 5 * mc.se_mean + 1e-6)
        np.testing.assert_array_less(np.abs(out.covariance.numpy() - mc.cov), 5 * mc.se_cov + 1e-6)
    # The second layer's units are correlated (the diagonal rule drops this): many correlations above 0.5.
    correlation = stages[1].cov / np.sqrt(np.einsum("bii,bjj->bij", stages[1].cov, stages[1].cov))
    assert np.mean(correlation[:, ~np.eye(16, dtype=bool)] > 0.5) > 0.5
    # After the second ReLU the pre-activations are taken as Gaussian (they are sums of products): the
    # stated error. Measured: logit variances within 2% of the exact ones with the full covariance, the
    # diagonal rule's at 0.18-0.24 of them; means within 1% of the logits' spread.
    exact_var = np.diagonal(stages[3].cov, axis1=-2, axis2=-1)
    full_ratio = outputs[3].variance.numpy() / exact_var
    diagonal_ratio = diagonal.variance.numpy() / exact_var
    assert np.all(np.abs(full_ratio - 1) < 0.04), full_ratio
    assert np.all(diagonal_ratio < 0.35), diagonal_ratio
    np.testing.assert_array_less(np.abs(outputs[3].mean.numpy() - stages[3].mean), 0.05 * np.sqrt(exact_var))
    exact_corr = stages[3].cov / np.sqrt(np.einsum("bii,bjj->bij", stages[3].cov, stages[3].cov))
    full_cov = outputs[3].covariance.numpy()
    full_corr = full_cov / np.sqrt(np.einsum("bii,bjj->bij", full_cov, full_cov))
    np.testing.assert_allclose(full_corr, exact_corr, atol=0.03)


def test_mc_dropout_and_linear_layers_are_exact_with_the_full_covariance():
    """Deterministic Dense layers mix MC dropout's independent units: no ReLU, so every moment is exact."""
    model = keras.Sequential([
        keras.Input((5,)), tfbnn.layers.MCDropout(0.3, seed=0),
        keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
        tfbnn.layers.MCDropout(0.2, seed=2),
        keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=3), bias_initializer="ones"),
    ])
    x = np.random.default_rng(4).normal(size=(2, 5)).astype("float32")
    model(x)
    w1, c1 = (v.numpy() for v in model.layers[1].weights)
    w2, c2 = (v.numpy() for v in model.layers[3].weights)
    rng = np.random.default_rng(1)
    mc = _Moments()
    for _ in range(T // CHUNK):
        first = (x * (rng.random((CHUNK, 2, 5)) >= 0.3) / 0.7) @ w1 + c1
        mc.add((first * (rng.random((CHUNK, 2, 4)) >= 0.2) / 0.8) @ w2 + c2)
    mc.finish()
    out = moments.propagate(model, x, covariance="full")
    np.testing.assert_array_less(np.abs(out.mean.numpy() - mc.mean), 5 * mc.se_mean + 1e-6)
    np.testing.assert_array_less(np.abs(out.covariance.numpy() - mc.cov), 5 * mc.se_cov + 1e-6)


def test_the_gp_layer_takes_a_correlated_gaussian_input():
    """DenseReparameterization on constants, then a linear keras Dense: an exactly Gaussian, correlated input to
    the GP layer, whose logits' mean and covariance (its Laplace posterior included) equal Monte Carlo."""
    gp = tfbnn.layers.RandomFeatureGaussianProcess(2, num_inducing=16, seed=0)
    model = keras.Sequential([
        keras.Input((3,)),
        tfbnn.layers.DenseReparameterization(4, kernel_scale_initializer=_const(-1.5), bias_prior=None, seed=1),
        keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=2)),
        gp,
    ])
    x = np.float32([[0.4, -0.3, 1.0], [-1.0, 0.5, 0.2]])
    model(x)
    model.layers[2].kernel.assign(model.layers[2].kernel.numpy() * 0.5)
    out = moments.propagate(model, x, covariance="full")
    layer1, layer2 = model.layers[0], model.layers[1]
    w = gp.feature_kernel.numpy() / math.sqrt(gp.gp_kernel_scale)
    c = math.sqrt(2.0 / gp.num_inducing)
    beta_cov = gp.covariance().numpy()
    rng = np.random.default_rng(2)
    mc = _Moments()
    for _ in range(T // CHUNK):
        kernels = layer1.kernel_loc.numpy() + layer1.kernel_scale().numpy() * rng.standard_normal((CHUNK, 3, 4))
        hidden = np.einsum("bi,tio->tbo", x, kernels) + layer1.bias_loc.numpy()
        h = hidden @ layer2.kernel.numpy() + layer2.bias.numpy()
        features = c * np.cos(h @ w + gp.feature_bias.numpy())                        # (T, B, D)
        betas = gp.kernel.numpy() + np.einsum("ij,tju->tiu", np.linalg.cholesky(beta_cov),
                                              rng.standard_normal((CHUNK, gp.num_inducing, 2)))
        mc.add(np.einsum("tbd,tdu->tbu", features, betas) + gp.bias.numpy())
    mc.finish()
    np.testing.assert_array_less(np.abs(out.mean.numpy() - mc.mean), 5 * mc.se_mean + 1e-6)
    np.testing.assert_array_less(np.abs(out.covariance.numpy() - mc.cov), 5 * mc.se_cov + 1e-6)


def test_full_and_diagonal_agree_where_the_units_stay_independent():
    """A deterministic convolution of constants, then one Bayesian dense layer: the covariance is diagonal, equal
    to the diagonal rule's, and the convolution is allowed (its input is a point)."""
    model = keras.Sequential([
        keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, activation="relu"), keras.layers.Flatten(),
        tfbnn.layers.DenseFlipout(3, activation="softmax", seed=0),
    ])
    x = np.random.default_rng(5).normal(size=(2, 4, 4, 1)).astype("float32")
    model(x)
    full, diagonal = moments.propagate(model, x, covariance="full"), moments.propagate(model, x)
    np.testing.assert_allclose(full.mean.numpy(), diagonal.mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(full.covariance.numpy(), tf.linalg.diag(diagonal.variance).numpy(), rtol=1e-6)
    assert full.link == "softmax"
    np.testing.assert_allclose(full.probabilities().numpy(), diagonal.probabilities().numpy(), rtol=1e-6)


def test_predict_and_export_take_the_full_covariance(tmp_path):
    model = keras.Sequential([keras.Input((4,)), *_two_hidden_layers().layers[:3],
                              tfbnn.layers.DenseFlipout(2, kernel_initializer=keras.initializers.RandomUniform(
                                  0.0, 1.0, seed=5), seed=5), tfbnn.GaussianHead()])
    x = np.random.default_rng(6).normal(size=(5, 4)).astype("float32")
    model(x)
    out = moments.propagate(model, x, covariance="full")
    res = tfbnn.predict(model, x, method="moments", moments_covariance="full", batch_size=2)
    np.testing.assert_allclose(res.epistemic_std[:, 0], np.sqrt(out.covariance.numpy()[:, 0, 0]), rtol=1e-5)
    diagonal = tfbnn.predict(model, x, method="moments")
    assert np.all(res.epistemic_std > 1.5 * diagonal.epistemic_std)  # the positive correlations the diagonal drops
    path = export.export(model, str(tmp_path / "full"), mode="moments", moments_covariance="full")
    loaded = tf.saved_model.load(path)
    served = loaded.moments(tf.constant(x))
    np.testing.assert_allclose(served["covariance"], out.covariance.numpy(), rtol=1e-4, atol=1e-6)
    summary = loaded.summary(tf.constant(x))
    np.testing.assert_allclose(summary["epistemic_std"], res.epistemic_std, rtol=1e-4)


def test_full_covariance_refusals_name_the_layer_and_the_argument():
    conv = keras.Sequential([keras.Input((4, 4, 1)), tfbnn.layers.Conv2DFlipout(2, 3, seed=0), keras.layers.Flatten(),
                             keras.layers.Dense(2)])
    x = np.zeros((1, 4, 4, 1), "float32")
    conv(x)
    with pytest.raises(ValueError, match=r"covariance='full'\) does not support layer 'conv2d_flipout\w*' "
                                         r"\(class Conv2DFlipout\)"):
        moments.propagate(conv, x, covariance="full")
    moments.propagate(conv, x)  # the diagonal rule takes it
    with pytest.raises(ValueError, match=r"Expected `covariance` in \('diagonal', 'full'\). Received: covariance='dense'"):
        moments.propagate(conv, x, covariance="dense")
    with pytest.raises(ValueError, match="`moments_covariance` is for method='moments'. Received: "
                                         "moments_covariance='full', method='monte_carlo'"):
        tfbnn.predict(conv, x, moments_covariance="full")
    with pytest.raises(ValueError, match="`moments_covariance` is for mode='moments'"):
        export.export(conv, "unused", mode="frozen", moments_covariance="full")
