"""tfbnn.moments and tfbnn.predict(method="moments"): against closed forms, quadrature and Monte Carlo.

The Monte Carlo references draw T = 10^5 weight samples in NumPy (vectorized, tiny widths) and
allow five Monte Carlo standard errors: the mean's ``sqrt(s^2 / T)``, the variance's
``sqrt((m4 - s^4) / T)`` (``m4`` the fourth central moment). The networks are those where
diagonal propagation is exact: inputs of each Bayesian layer independent (a deterministic
input, hidden units of a mean-field layer on a deterministic input, MC dropout's
independent masks).
"""

import math

import keras
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

import tfbnn
from tfbnn import moments

T = 100_000
RNG_SEED = 0


def _const(value):
    return keras.initializers.Constant(value)


def _within_mc_error(estimate, samples, z=5.0):
    """The propagated mean and variance lie within ``z`` Monte Carlo standard errors of ``samples`` (T, ...)."""
    mean, variance = estimate
    mc_mean, mc_var = samples.mean(0), samples.var(0)
    se_mean = np.sqrt(mc_var / len(samples))
    m4 = np.mean((samples - mc_mean) ** 4, axis=0)
    se_var = np.sqrt(np.maximum(m4 - mc_var**2, 0) / len(samples))
    np.testing.assert_array_less(np.abs(np.asarray(mean) - mc_mean), z * se_mean + 1e-6)
    np.testing.assert_array_less(np.abs(np.asarray(variance) - mc_var), z * se_var + 1e-6)


def _weights(layer, rng, num=T):
    """``num`` NumPy samples of a Bayes-by-Backprop (or variational dropout) layer's kernel and bias."""
    loc = layer.kernel_loc.numpy()
    if isinstance(layer, tfbnn.layers.DenseVariationalDropout):
        scale = np.sqrt(layer.kernel_variance().numpy())
    else:
        scale = layer.kernel_scale().numpy()
    kernels = loc + scale * rng.standard_normal((num, *loc.shape))
    bias = layer.bias_loc.numpy()
    if getattr(layer, "bayesian_bias", False):
        return kernels, bias + layer.bias_scale().numpy() * rng.standard_normal((num, *bias.shape))
    return kernels, np.broadcast_to(bias, (num, *bias.shape))


# -- the elementwise rules ------------------------------------------------------------------------
def test_relu_moments_equal_numerical_integration():
    means = np.array([-3.0, -0.5, 0.0, 0.7, 4.0, 2.0])
    variances = np.array([0.5, 2.0, 1.0, 0.3, 9.0, 1e-4])
    got_mean, got_var = (t.numpy() for t in moments.relu_moments(means.astype("float32"), variances.astype("float32")))
    for i, (m, v) in enumerate(zip(means, variances)):
        pdf = scipy.stats.norm(m, math.sqrt(v)).pdf
        low, high = max(0.0, m - 12 * math.sqrt(v)), max(0.0, m + 12 * math.sqrt(v))  # where the mass is
        first = scipy.integrate.quad(lambda a: a * pdf(a), low, high, epsabs=1e-12)[0]
        second = scipy.integrate.quad(lambda a: a * a * pdf(a), low, high, epsabs=1e-12)[0]
        assert got_mean[i] == pytest.approx(first, rel=1e-5, abs=1e-6)
        assert got_var[i] == pytest.approx(second - first**2, rel=1e-4, abs=1e-6)


def test_relu_moments_agree_with_scipy_truncated_normal_and_stay_finite_at_extremes():
    # E[relu(a)] = P(a > 0) E[a | a > 0]: scipy's truncated normal, another closed form.
    m, s = 0.8, 1.7
    truncated = scipy.stats.truncnorm((0 - m) / s, np.inf, loc=m, scale=s)
    p = scipy.stats.norm.sf(0, m, s)
    got_mean, got_var = (float(t) for t in moments.relu_moments(np.float32(m), np.float32(s * s)))
    assert got_mean == pytest.approx(p * truncated.mean(), rel=1e-5)
    second = p * (truncated.var() + truncated.mean() ** 2)
    assert got_var == pytest.approx(second - (p * truncated.mean()) ** 2, rel=1e-4)
    extreme_m = np.float32([1e4, -1e4, 1e4, 0.0, -3.0, 5.0, 0.0])
    extreme_v = np.float32([1e-30, 1e-30, 1e8, 0.0, 0.0, 0.0, 1e30])
    mean, var = (t.numpy() for t in moments.relu_moments(extreme_m, extreme_v))
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(var)) and np.all(var >= 0)
    np.testing.assert_allclose(mean[[0, 1, 3, 4, 5]], [1e4, 0.0, 0.0, 0.0, 5.0], rtol=1e-6)
    np.testing.assert_allclose(var[[3, 4, 5]], 0.0)
    assert mean[2] == pytest.approx(1e4 * scipy.stats.norm.cdf(1.0) + 1e4 * scipy.stats.norm.pdf(1.0), rel=1e-5)


def test_probit_softmax_and_sigmoid_are_the_scaled_logits_and_quadrature_matches_scipy():
    m = np.float32([[1.0, -2.0, 0.5]])
    v = np.float32([[0.0, 3.0, 10.0]])
    scaled = m / np.sqrt(1 + np.pi / 8 * v)
    expected = np.exp(scaled) / np.exp(scaled).sum(-1, keepdims=True)
    np.testing.assert_allclose(moments.probit_softmax(m, v).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(moments.probit_sigmoid(m, v).numpy(), 1 / (1 + np.exp(-scaled)), rtol=1e-6)
    # MacKay's approximation is close to the exact E[sigmoid(a)] (within 0.02 here).
    exact = scipy.integrate.quad(lambda a: scipy.special.expit(a) * scipy.stats.norm(1.0, 2.0).pdf(a), -40, 40)[0]
    assert float(moments.probit_sigmoid(np.float32(1.0), np.float32(4.0))) == pytest.approx(exact, abs=0.02)
    import tensorflow as tf

    def squared_scale(r):
        return tf.square(tf.nn.softplus(r) + 1e-3)

    got = moments.gaussian_expectation(squared_scale, np.float64([0.3]), np.float64([2.5])).numpy()[0]
    want = scipy.integrate.quad(lambda r: (np.logaddexp(0, r) + 1e-3) ** 2 * scipy.stats.norm(0.3, math.sqrt(2.5)).pdf(r),
                                -60, 60)[0]
    assert got == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="points=0"):
        moments.gaussian_expectation(squared_scale, np.float32([0.0]), np.float32([1.0]), points=0)


# -- networks against Monte Carlo -----------------------------------------------------------------
def _mlp(second):
    return keras.Sequential([
        keras.Input((3,)),
        tfbnn.layers.DenseFlipout(4, activation="relu", kernel_scale_initializer=_const(-0.5),
                                  bias_scale_initializer=_const(-1.0), seed=0),
        second,
    ])


@pytest.mark.parametrize("second", ["reparameterization", "variational_dropout"])
def test_one_hidden_layer_mlp_moments_equal_monte_carlo(second):
    layer = (tfbnn.layers.DenseReparameterization(2, kernel_scale_initializer=_const(-1.0), seed=1)
             if second == "reparameterization" else
             tfbnn.layers.DenseVariationalDropout(2, kernel_scale_initializer=_const(-1.0), seed=1))
    model = _mlp(layer)
    x = np.float32([[0.5, -1.0, 2.0], [1.0, 0.3, -0.2]])
    out = moments.propagate(model, x)
    assert out.link is None
    rng = np.random.default_rng(RNG_SEED)
    k1, b1 = _weights(model.layers[0], rng)
    k2, b2 = _weights(model.layers[1], rng)
    hidden = np.maximum(np.einsum("bi,tio->tbo", x, k1) + b1[:, None], 0)
    y = np.einsum("tbi,tio->tbo", hidden, k2) + b2[:, None]
    _within_mc_error((out.mean.numpy(), out.variance.numpy()), y)


def _im2col(images, size):
    """``(N, H, W, C)`` -> ``(N, H', W', size * size * C)`` valid patches, the order of a ``(size, size, C, F)`` kernel."""
    n, h, w, c = images.shape
    rows = [images[:, i:i + h - size + 1, j:j + w - size + 1, :] for i in range(size) for j in range(size)]
    return np.stack(rows, axis=3).reshape(n, h - size + 1, w - size + 1, size * size * c)


def test_conv_net_moments_equal_monte_carlo_per_unit():
    model = keras.Sequential([
        keras.Input((4, 4, 1)),
        tfbnn.layers.Conv2DFlipout(2, 3, activation="relu", kernel_scale_initializer=_const(-0.5),
                                   bias_scale_initializer=_const(-1.0), seed=0),
        keras.layers.Flatten(),
    ])
    x = np.random.default_rng(1).normal(size=(1, 4, 4, 1)).astype("float32")
    out = moments.propagate(model, x)
    kernels, biases = _weights(model.layers[0], np.random.default_rng(RNG_SEED))
    patches = _im2col(x, 3)[0]  # (2, 2, 9)
    y = np.maximum(np.einsum("hwk,tkf->thwf", patches, kernels.reshape(T, 9, 2)) + biases[:, None, None], 0)
    _within_mc_error((out.mean.numpy()[0], out.variance.numpy()[0]), y.reshape(T, -1))


def test_random_inputs_through_mc_dropout_then_a_bayesian_convolution_or_a_dense_layer():
    """MC dropout makes the inputs independent random variables: the convolution's rule
    ``conv(v, mu^2 + s^2) + conv(m^2, s^2)`` is then exact per unit, and so is keras Dense's ``v K^2``."""
    x = np.random.default_rng(2).normal(size=(1, 4, 4, 1)).astype("float32")
    conv_model = keras.Sequential([
        keras.Input((4, 4, 1)),
        tfbnn.layers.MCDropout(0.3, seed=0),
        tfbnn.layers.Conv2DReparameterization(1, 3, kernel_scale_initializer=_const(-0.5), bias_prior=None, seed=1),
        keras.layers.Flatten(),
    ])
    dense_model = keras.Sequential([keras.Input((16,)), tfbnn.layers.MCDropout(0.3, seed=0), keras.layers.Dense(2)])
    rng = np.random.default_rng(RNG_SEED)
    masks = (rng.random((T, 4, 4, 1)) >= 0.3) / 0.7
    kernels, biases = _weights(conv_model.layers[1], rng)
    conv = np.einsum("thwk,tkf->thwf", _im2col(x * masks, 3), kernels.reshape(T, 9, 1)) + biases[:, None, None]
    out = moments.propagate(conv_model, x)
    _within_mc_error((out.mean.numpy()[0], out.variance.numpy()[0]), conv.reshape(T, 4))
    dense = dense_model.layers[1]
    y = (x.reshape(1, 16) * masks.reshape(T, 16)) @ dense.kernel.numpy() + dense.bias.numpy()
    out = moments.propagate(dense_model, x.reshape(1, 16))
    _within_mc_error((out.mean.numpy()[0], out.variance.numpy()[0]), y)


def test_keras_dropout_and_noise_layers_are_identities_as_at_inference():
    model = _mlp(tfbnn.layers.DenseFlipout(2, seed=1))
    noisy = keras.Sequential([keras.Input((3,)), keras.layers.GaussianNoise(1.0), model.layers[0],
                              keras.layers.Dropout(0.5), model.layers[1]])
    x = np.float32([[0.5, -1.0, 2.0]])
    plain, with_noise = moments.propagate(model, x), moments.propagate(noisy, x)
    np.testing.assert_array_equal(plain.mean.numpy(), with_noise.mean.numpy())
    np.testing.assert_array_equal(plain.variance.numpy(), with_noise.variance.numpy())


def test_posterior_mean_mode_has_zero_variance_and_the_mean_network():
    model = _mlp(tfbnn.layers.DenseFlipout(2, seed=1))
    x = np.float32([[0.5, -1.0, 2.0]])
    with tfbnn.posterior_mean(model):
        out = moments.propagate(model, x)
        expected = model(x).numpy()
    np.testing.assert_allclose(out.variance.numpy(), 0.0)
    np.testing.assert_allclose(out.mean.numpy(), expected, rtol=1e-5, atol=1e-6)


# -- tfbnn.predict(method="moments") --------------------------------------------------------------
def test_predict_moments_regression_with_a_gaussian_head_equals_monte_carlo():
    model = keras.Sequential([
        keras.Input((3,)),
        # Seeded means: the Gaussian assumption's error checked at the end depends on the weights.
        tfbnn.layers.DenseFlipout(4, activation="relu", kernel_scale_initializer=_const(-0.5), seed=0,
                                  kernel_initializer=keras.initializers.GlorotUniform(seed=0)),
        tfbnn.layers.DenseReparameterization(2, kernel_scale_initializer=_const(-1.0), seed=1,
                                             kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
        tfbnn.GaussianHead(),
    ])
    x = np.float32([[0.5, -1.0, 2.0], [1.0, 0.3, -0.2]])
    res = tfbnn.predict(model, x, method="moments")
    assert isinstance(res, tfbnn.RegressionPrediction) and res.samples is None and res.num_samples == 0
    rng = np.random.default_rng(RNG_SEED)
    k1, b1 = _weights(model.layers[0], rng)
    k2, b2 = _weights(model.layers[1], rng)
    raw = np.einsum("tbi,tio->tbo", np.maximum(np.einsum("bi,tio->tbo", x, k1) + b1[:, None], 0), k2) + b2[:, None]
    mu, scale2 = raw[..., :1], (np.logaddexp(0, raw[..., 1:]) + 1e-3) ** 2
    _within_mc_error((res.mean, res.epistemic_std**2), mu)
    # The head's raw scale r is a sum of rectified terms, not Gaussian: DVI takes it as Gaussian with
    # its (exact) moments. So the reference is E[(softplus(r) + 1e-3)^2] for r ~ N(MC mean, MC variance).
    for b in range(2):
        r = scipy.stats.norm(raw[:, b, 1].mean(), raw[:, b, 1].std())
        want = scipy.integrate.quad(lambda a: (np.logaddexp(0, a) + 1e-3) ** 2 * r.pdf(a), r.mean() - 15 * r.std(),
                                    r.mean() + 15 * r.std())[0]
        assert res.aleatoric_std[b, 0] ** 2 == pytest.approx(want, rel=5e-3)  # MC moments: ~1e-3 off
    # ... and it is close to, but not, the true E[scale^2] (the Gaussian assumption's error).
    np.testing.assert_allclose(res.aleatoric_std**2, scale2.mean(0), rtol=0.1)


def test_predict_moments_classification_is_the_probit_predictive_without_the_entropy_split():
    model = _mlp(tfbnn.layers.DenseReparameterization(3, activation="softmax", kernel_scale_initializer=_const(-1.0),
                                                      seed=1))
    x = np.float32([[0.5, -1.0, 2.0], [1.0, 0.3, -0.2], [0.0, 0.0, 0.0]])
    res = tfbnn.predict(model, x, method="moments", batch_size=2)
    rng = np.random.default_rng(RNG_SEED)
    k1, b1 = _weights(model.layers[0], rng)
    k2, b2 = _weights(model.layers[1], rng)
    logits = np.einsum("tbi,tio->tbo", np.maximum(np.einsum("bi,tio->tbo", x, k1) + b1[:, None], 0), k2) + b2[:, None]
    scaled = logits.mean(0) / np.sqrt(1 + np.pi / 8 * logits.var(0))
    probit = scipy.special.softmax(scaled, axis=-1)
    np.testing.assert_allclose(res.mean_probs, probit, atol=3e-3)  # MC moments of the logits: ~1e-3 off
    np.testing.assert_allclose(res.predictive_entropy, scipy.stats.entropy(res.mean_probs, axis=-1), rtol=1e-5)
    assert np.all(np.isnan(res.expected_entropy)) and np.all(np.isnan(res.mutual_information))
    assert res.mean_probs.shape == (3, 3) and list(res.samples_used) == [0, 0, 0]


# -- refusals ---------------------------------------------------------------------------------------
def test_bad_method_lists_the_choices():
    model = _mlp(tfbnn.layers.DenseFlipout(2, seed=1))
    with pytest.raises(ValueError, match=r"Expected `method` in \('monte_carlo', 'moments'\). Received: method='mc'"):
        tfbnn.predict(model, np.zeros((1, 3), "float32"), method="mc")
    with pytest.raises(ValueError, match="return_samples=True"):
        tfbnn.predict(model, np.zeros((1, 3), "float32"), method="moments", return_samples=True)


@pytest.mark.parametrize("layer, match", [
    (lambda: tfbnn.layers.NodeDense(2, seed=0), r"layer 'node_dense\w*' \(class NodeDense\): the iBNN node noise"),
    (lambda: keras.layers.Dense(2, activation="tanh"), r"\(class Dense\): its activation 'tanh'"),
    (lambda: tfbnn.layers.DenseReparameterization(2, posterior="low_rank", seed=0), r"\(class DenseReparameterization\).*low"),
    (lambda: keras.layers.BatchNormalization(), r"\(class BatchNormalization\): it has no moment rule"),
])
def test_unsupported_layers_are_refused_by_name_and_class(layer, match):
    model = keras.Sequential([keras.Input((3,)), layer(), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=match):
        moments.propagate(model, np.zeros((1, 3), "float32"))


def test_a_branching_model_is_refused():
    inputs = keras.Input((3,))
    outputs = keras.layers.Add()([keras.layers.Dense(2)(inputs), keras.layers.Dense(2)(inputs)])
    model = keras.Model(inputs, outputs, name="branches")
    with pytest.raises(ValueError, match="form a chain.*model 'branches'"):
        moments.propagate(model, np.zeros((1, 3), "float32"))


def test_a_transposed_convolution_is_refused_by_name_and_class():
    model = keras.Sequential([keras.Input((3, 3, 1)), tfbnn.layers.Conv2DTransposeReparameterization(1, 2, seed=0)])
    with pytest.raises(ValueError, match=r"\(class Conv2DTransposeReparameterization\).*transposed"):
        moments.propagate(model, np.zeros((1, 3, 3, 1), "float32"))
