"""tfbnn.laplace against independent computations (issue 22, part 1).

The references are NumPy: the closed-form Bayesian linear-regression posterior and
evidence on the last layer's features, the GGN from finite-difference Jacobians of
a NumPy forward pass, TensorFlow's own Hessian of the cross-entropy, and finite
differences of the evidence. The models are tiny and untrained where training does
not matter (the formulas hold at any weights; only the evidence's exactness needs
the MAP, which the regression test sets in closed form).
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import laplace
from tfbnn.testing import run_layer_test

D_IN, HIDDEN = 3, 5


def _mlp(units, activation=None, seed=0, d_in=D_IN, hidden=HIDDEN):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((d_in,)), keras.layers.Dense(hidden, activation="tanh"),
                             keras.layers.Dense(units, activation=activation)])


def _data(n, units, classification, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D_IN)).astype("float32")
    y = rng.integers(0, units, n) if classification else rng.normal(size=(n, units))
    return x, y


# -- NumPy references --------------------------------------------------------------
def _np_outputs(params, shapes, x):
    """The MLP's pre-activation outputs in float64 from the flat ``params`` (trainable_variables order)."""
    weights, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        weights.append(params[start:start + size].reshape(shape))
        start += size
    w1, b1, w2, b2 = weights
    return np.tanh(x.astype(np.float64) @ w1 + b1) @ w2 + b2


def _np_features(model, x):
    w1, b1 = (np.asarray(v, np.float64) for v in model.layers[0].get_weights())
    phi = np.tanh(x.astype(np.float64) @ w1 + b1)
    return np.concatenate([phi, np.ones((len(x), 1))], axis=1)


def _np_jacobian(model, x, eps=1e-6):
    """Central finite differences of the float64 forward pass: ``(N, K, P)``."""
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    theta = np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in model.trainable_variables])
    columns = []
    for p in range(theta.size):
        step = np.zeros_like(theta)
        step[p] = eps
        columns.append((_np_outputs(theta + step, shapes, x) - _np_outputs(theta - step, shapes, x)) / (2 * eps))
    return np.stack(columns, axis=-1), _np_outputs(theta, shapes, x)


def _softmax(f):
    e = np.exp(f - f.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_ggn(jac, f):
    p = _softmax(f)
    lam = np.einsum("nk,kl->nkl", p, np.eye(p.shape[1])) - np.einsum("nk,nl->nkl", p, p)
    return np.einsum("nkp,nkl,nlq->pq", jac, lam, jac)


def _blr_model(delta, sigma, n=40, units=2):
    """A regression MLP whose last layer is set to the Bayesian linear-regression posterior mean
    on its features (so ``theta*`` is the exact MAP), with the NumPy posterior."""
    model = _mlp(units)
    x, y = _data(n, units, classification=False)
    phi = _np_features(model, x)
    precision = phi.T @ phi / sigma**2 + delta * np.eye(phi.shape[1])
    mean = np.linalg.solve(precision, phi.T @ y / sigma**2)
    model.layers[-1].set_weights([mean[:-1].astype("float32"), mean[-1].astype("float32")])
    return model, x, y, phi, precision, mean


def _blr_log_evidence(phi, y, delta, sigma):
    """``sum_k log N(y_k | 0, sigma^2 I + phi phi^T / delta)``: the exact evidence."""
    cov = sigma**2 * np.eye(len(phi)) + phi @ phi.T / delta
    _, logdet = np.linalg.slogdet(cov)
    quad = np.einsum("nk,nk->", y, np.linalg.solve(cov, y))
    return -0.5 * (y.shape[1] * (logdet + len(phi) * np.log(2 * np.pi)) + quad)


# -- the closed-form Bayesian linear regression ---------------------------------------
@pytest.mark.parametrize("hessian", laplace.HESSIANS)
def test_last_layer_regression_is_bayesian_linear_regression(hessian):
    delta, sigma, units = 0.7, 0.3, 2
    model, x, y, phi, precision, mean = _blr_model(delta, sigma, units=units)
    la = laplace.fit(model, x, y, likelihood="regression", hessian=hessian, prior_precision=delta, sigma_noise=sigma)
    np.testing.assert_allclose(la.mean, mean.ravel(), rtol=1e-5, atol=1e-6)
    expected_precision = np.kron(precision, np.eye(units))  # parameters [(i, k)], row-major over [W; b]
    if hessian == "diag":
        np.testing.assert_allclose(la.posterior_precision, np.diag(expected_precision), rtol=1e-5)
        return
    # KFAC is exact here: Lambda_n = I / sigma^2 for every example.
    np.testing.assert_allclose(la.posterior_precision, expected_precision, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(la.posterior_covariance, np.linalg.inv(expected_precision), rtol=1e-4, atol=1e-8)
    # The Laplace evidence of a linear-Gaussian model at its MAP is the exact evidence.
    np.testing.assert_allclose(la.log_marginal_likelihood(), _blr_log_evidence(phi, y, delta, sigma), rtol=1e-6)
    # The GLM predictive: phi^T Sigma_w phi per output, outputs independent.
    x_test = np.random.default_rng(1).normal(size=(4, D_IN)).astype("float32")
    phi_test = _np_features(model, x_test)
    f_mu, f_var = la.function_moments(x_test)
    np.testing.assert_allclose(f_mu, phi_test @ mean, rtol=1e-5, atol=1e-5)
    var = np.einsum("ni,ij,nj->n", phi_test, np.linalg.inv(precision), phi_test)
    np.testing.assert_allclose(f_var, var[:, None, None] * np.eye(units), rtol=1e-4, atol=1e-9)
    pred = la.predict(x_test)
    np.testing.assert_allclose(pred.total_std ** 2, np.tile(var[:, None] + sigma**2, (1, units)), rtol=1e-4)


# -- KFAC against the full GGN ---------------------------------------------------------
def test_kron_equals_full_for_one_example_and_approximates_it_for_many():
    model = _mlp(3, "softmax")
    x, y = _data(200, 3, classification=True)
    one = [laplace.fit(model, x[:1], y[:1], hessian=h).posterior_precision for h in ("full", "kron")]
    np.testing.assert_allclose(one[0], one[1], rtol=1e-6, atol=1e-9)  # N = 1: A kron G is the GGN
    full, kron = (laplace.fit(model, x, y, hessian=h, prior_precision=1.0) for h in ("full", "kron"))
    h_full, (a, g) = full.hessian_factors, kron.hessian_factors
    error = np.linalg.norm(np.kron(a, g) - h_full) / np.linalg.norm(h_full)
    # (sum phi phi^T) kron (mean Lambda) approximates the GGN, 14.5% off here (Frobenius, relative) ...
    assert 0.05 < error < 0.2, error
    # ... but with the prior added the function-space covariances (the predictive) are within 5%,
    x_test = np.random.default_rng(3).normal(size=(20, D_IN)).astype("float32")
    f_var_full, f_var_kron = full.function_moments(x_test)[1], kron.function_moments(x_test)[1]
    assert np.max(np.abs(f_var_kron - f_var_full)) < 0.05 * np.max(np.abs(f_var_full))
    assert np.max(np.abs(full.predict(x_test) - kron.predict(x_test))) < 0.005
    # and the log evidence within 0.5 nats (of about -244).
    assert abs(full.log_marginal_likelihood() - kron.log_marginal_likelihood()) < 0.5


def test_last_layer_ggn_is_the_hessian_of_the_cross_entropy():
    model = _mlp(3, "softmax")
    x, y = _data(30, 3, classification=True)
    la = laplace.fit(model, x, y, hessian="full")
    phi = tf.constant(_np_features(model, x))
    theta = tf.Variable(la.mean)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            logits = phi @ tf.reshape(theta, (HIDDEN + 1, 3))
            nll = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        grad = inner.gradient(nll, theta)
    hessian = outer.jacobian(grad, theta).numpy()
    np.testing.assert_allclose(la.hessian_factors, hessian, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(laplace.fit(model, x, y, hessian="diag").hessian_factors, np.diag(hessian),
                               rtol=1e-5, atol=1e-6)


# -- all weights against finite-difference Jacobians ---------------------------------------
def test_all_weights_ggn_and_glm_variance_against_numpy_jacobians():
    model = _mlp(3, "softmax")
    x, y = _data(12, 3, classification=True)
    x_test = np.random.default_rng(2).normal(size=(5, D_IN)).astype("float32")
    jac, f = _np_jacobian(model, x)
    ggn = _np_ggn(jac, f)
    jac_test, f_test = _np_jacobian(model, x_test)
    delta = 2.0
    for hessian, covariance in (("full", np.linalg.inv(ggn + delta * np.eye(len(ggn)))),
                                ("diag", np.diag(1.0 / (np.diag(ggn) + delta)))):
        la = laplace.fit(model, x, y, subset="all", hessian=hessian, prior_precision=delta)
        np.testing.assert_allclose(la.hessian_factors, ggn if hessian == "full" else np.diag(ggn), rtol=2e-4,
                                   atol=1e-6)
        f_mu, f_var = la.function_moments(x_test)
        expected = np.einsum("nkp,pq,nlq->nkl", jac_test, covariance, jac_test)
        np.testing.assert_allclose(f_mu, f_test, atol=1e-5)
        np.testing.assert_allclose(f_var, expected, rtol=2e-4, atol=1e-7)
        kappa = 1 / np.sqrt(1 + np.pi / 8 * np.diagonal(expected, axis1=1, axis2=2))
        np.testing.assert_allclose(la.predict(x_test), _softmax(kappa * f_test), atol=1e-5)  # the probit


# -- the marginal likelihood and its tuning -----------------------------------------------
@pytest.mark.parametrize("likelihood,subset,hessian", [("classification", "last_layer", "kron"),
                                                       ("regression", "last_layer", "full"),
                                                       ("regression", "all", "diag")])
def test_marglik_gradient_matches_finite_differences(likelihood, subset, hessian):
    units = 3 if likelihood == "classification" else 2
    model = _mlp(units, "softmax" if likelihood == "classification" else None)
    x, y = _data(40, units, likelihood == "classification")
    sigma = 1.0 if likelihood == "classification" else 0.8
    la = laplace.fit(model, x, y, likelihood=likelihood, subset=subset, hessian=hessian, sigma_noise=sigma)
    log_delta, log_sigma, h = np.log(0.5), np.log(sigma), 1e-5

    def evidence(a, b):
        return la.log_marginal_likelihood(np.exp(a), np.exp(b))

    grad = la.log_marginal_likelihood_gradient(0.5, sigma)
    fd_delta = (evidence(log_delta + h, log_sigma) - evidence(log_delta - h, log_sigma)) / (2 * h)
    np.testing.assert_allclose(grad[0], fd_delta, rtol=1e-5, atol=1e-6)
    if likelihood == "regression":
        fd_sigma = (evidence(log_delta, log_sigma + h) - evidence(log_delta, log_sigma - h)) / (2 * h)
        np.testing.assert_allclose(grad[1], fd_sigma, rtol=1e-5, atol=1e-6)
    else:
        assert grad[1] == 0.0


def test_marglik_finds_the_evidence_maximum():
    model, x, y, *_ = _blr_model(0.7, 0.3)
    la = laplace.fit(model, x, y, likelihood="regression", hessian="kron", sigma_noise=1.0)
    assert la.optimize_prior_precision(method="marglik") is la
    delta, sigma = la.prior_precision, la.sigma_noise
    assert sigma < 1.0  # the residuals are much smaller than the starting sigma
    np.testing.assert_allclose(la.log_marginal_likelihood_gradient(), (0.0, 0.0), atol=1e-3)
    best = la.log_marginal_likelihood()
    for factor in (0.9, 1.1):
        assert best > la.log_marginal_likelihood(delta * factor, sigma)
        assert best > la.log_marginal_likelihood(delta, sigma * factor)


def test_val_nll_picks_the_grid_point_with_the_lowest_validation_nll():
    model = _mlp(3, "softmax")
    x, y = _data(60, 3, classification=True)
    x_val, y_val = _data(30, 3, classification=True, seed=5)
    la = laplace.fit(model, x, y, hessian="full")
    grid = [0.01, 0.3, 10.0, 300.0]
    nll = []
    for delta in grid:
        la.prior_precision = delta
        nll.append(-np.log(la.predict(x_val)[np.arange(30), y_val]).sum())
    la.optimize_prior_precision(method="val_nll", x_val=x_val, y_val=y_val, grid=grid)
    assert la.prior_precision == grid[int(np.argmin(nll))]
    assert la.sigma_noise == 1.0


# -- the sampling model and tfbnn.predict --------------------------------------------------
@pytest.mark.parametrize("hessian", laplace.HESSIANS)
def test_to_model_samples_the_glm_predictive(hessian):
    model = _mlp(2)
    x, y = _data(30, 2, classification=False)
    la = laplace.fit(model, x, y, likelihood="regression", hessian=hessian, prior_precision=0.5, sigma_noise=0.4)
    x_test = np.random.default_rng(4).normal(size=(4, D_IN)).astype("float32")
    f_mu, f_var = la.function_moments(x_test)
    std = np.sqrt(np.diagonal(f_var, axis1=1, axis2=2))
    sampler = la.to_model(seed=3)
    for joint in (False, True):
        res = tfbnn.predict(sampler, x_test, num_samples=4000, joint=joint)
        np.testing.assert_allclose(res.aleatoric_std, 0.4, rtol=1e-6)  # sigma_noise, through the GaussianHead
        np.testing.assert_allclose(res.epistemic_std, std, rtol=0.06)
        assert np.all(np.abs(res.mean - f_mu) < 5 * std / np.sqrt(4000))
    with tfbnn.posterior_mean(sampler):
        np.testing.assert_allclose(sampler.predict(x_test, verbose=0)[:, :2], f_mu, atol=1e-5)


def test_classifier_to_model_and_nn_predictive_agree_with_the_glm_monte_carlo():
    model = _mlp(3, "softmax")
    x, y = _data(30, 3, classification=True)
    la = laplace.fit(model, x, y, hessian="kron", prior_precision=0.2)
    x_test = np.random.default_rng(4).normal(size=(5, D_IN)).astype("float32")
    glm = la.predict(x_test, link_approx="mc", num_samples=20000, seed=0)
    res = tfbnn.predict(la.to_model(seed=1), x_test, num_samples=4000)
    np.testing.assert_allclose(res.mean_probs, glm, atol=0.015)
    assert np.all(res.mutual_information > 0)
    # For the last layer the network is linear in the weights: "nn" is the same predictive.
    np.testing.assert_allclose(la.predict(x_test, pred_type="nn", num_samples=20000, seed=0), glm, atol=0.015)


@pytest.mark.parametrize("structure", laplace.STRUCTURES)
def test_laplace_dense_basics(structure):
    run_layer_test(laplace.LaplaceDense, {"units": 3, "structure": structure, "seed": 1}, input_shape=(4, 5),
                   expected_output_shape=(4, 3), expected_num_losses=0, run_training=False)


def test_to_model_saves_and_loads(tmp_path):
    model = _mlp(3, "softmax")
    x, y = _data(30, 3, classification=True)
    sampler = laplace.fit(model, x, y, hessian="kron").to_model(seed=7)
    path = os.path.join(tmp_path, "laplace.keras")
    sampler.save(path)
    loaded = keras.saving.load_model(path)
    for a, b in zip(sampler.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(loaded(x[:4]), sampler(x[:4]), atol=1e-6)  # the same seed state: the same draw
    with tfbnn.posterior_mean(sampler), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(loaded(x[:4]), model(x[:4]), atol=1e-6)  # the MAP network


def test_to_model_exports_a_saved_model(tmp_path):
    model = _mlp(3, "softmax")
    x, y = _data(30, 3, classification=True)
    la = laplace.fit(model, x, y, hessian="kron")
    path = tfbnn.export.export_saved_model(la.to_model(seed=0), os.path.join(tmp_path, "laplace"), num_samples=2000)
    served = tf.saved_model.load(path)
    summary = served.summary(tf.constant(x[:4]))
    np.testing.assert_allclose(summary["mean_probs"], la.predict(x[:4], link_approx="mc", num_samples=20000, seed=0),
                               atol=0.03)
    assert np.all(summary["epistemic"].numpy() > 0)
    np.testing.assert_allclose(served.mean(tf.constant(x[:4])), model(x[:4]), atol=1e-6)


def test_seeded_sampling_repeats():
    model = _mlp(3, "softmax")
    x, y = _data(30, 3, classification=True)
    la = laplace.fit(model, x, y, hessian="full")
    np.testing.assert_array_equal(la.sample(5, seed=2), la.sample(5, seed=2))
    assert not np.allclose(la.sample(5, seed=2), la.sample(5, seed=3))
    for kwargs in ({"pred_type": "nn"}, {"link_approx": "mc"}):
        np.testing.assert_array_equal(la.predict(x[:4], seed=4, **kwargs), la.predict(x[:4], seed=4, **kwargs))
    runs = [tfbnn.predict(la.to_model(seed=5), x[:4], num_samples=8, return_samples=True).samples for _ in range(2)]
    np.testing.assert_array_equal(*runs)
    assert np.std(runs[0], axis=0).max() > 0


def test_dataset_input_and_saved_state(tmp_path):
    model = _mlp(2)
    x, y = _data(30, 2, classification=False)
    la = laplace.fit(model, x, y, likelihood="regression", hessian="kron", sigma_noise=0.5)
    from_data = laplace.fit(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(7), likelihood="regression",
                            hessian="kron", sigma_noise=0.5)
    np.testing.assert_allclose(from_data.log_marginal_likelihood(), la.log_marginal_likelihood(), rtol=1e-9)
    path = os.path.join(tmp_path, "la.npz")
    la.save(path)
    loaded = laplace.load(path, model)
    np.testing.assert_allclose(loaded.predict(x[:3]).total_std, la.predict(x[:3]).total_std)
    assert loaded.log_marginal_likelihood() == la.log_marginal_likelihood()


def test_one_hot_targets_and_default_structures():
    model = _mlp(3, "softmax")
    x, y = _data(20, 3, classification=True)
    la = laplace.fit(model, x, y)
    assert (la.hessian, laplace.fit(model, x, y, subset="all").hessian) == ("kron", "diag")
    one_hot = laplace.fit(model, x, np.eye(3, dtype="int32")[y])
    np.testing.assert_allclose(one_hot.log_marginal_likelihood(), la.log_marginal_likelihood(), rtol=1e-12)


# -- bad arguments -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"likelihood": "poisson"}, "likelihood='poisson'"),
    ({"subset": "first_layer"}, "subset='first_layer'"),
    ({"hessian": "lowrank"}, "hessian='lowrank'"),
    ({"subset": "subnetwork", "subnetwork": 3, "hessian": "kron"}, "hessian='kron'"),
    ({"prior_precision": -1.0}, "prior_precision=-1.0"),
    ({"prior_precision": float("nan")}, "prior_precision=nan"),
    ({"sigma_noise": 2.0}, "sigma_noise=2.0"),  # classification has no noise
    ({"batch_size": 0}, "batch_size=0"),
])
def test_bad_arguments_of_fit(kwargs, match):
    model = _mlp(3, "softmax")
    x, y = _data(8, 3, classification=True)
    with pytest.raises(ValueError, match=match):
        laplace.fit(model, x, y, **kwargs)


def test_bad_models_and_data():
    x, y = _data(8, 3, classification=True)
    with pytest.raises(ValueError, match="activation='relu'"):
        laplace.fit(_mlp(3, "relu"), x, y)
    with pytest.raises(ValueError, match="activation='softmax'"):
        laplace.fit(_mlp(3, "softmax"), x, y, likelihood="regression")
    with pytest.raises(ValueError, match="units=1"):
        laplace.fit(_mlp(1), x, y)
    dropout_last = keras.Sequential([keras.Input((D_IN,)), keras.layers.Dense(3), keras.layers.Dropout(0.1)])
    with pytest.raises(ValueError, match="type Dropout"):
        laplace.fit(dropout_last, x, y)
    with pytest.raises(ValueError, match=r"integer labels in \[0, 3\)"):
        laplace.fit(_mlp(3, "softmax"), x, y + 3)
    with pytest.raises(ValueError, match="y=None"):
        laplace.fit(_mlp(3, "softmax"), x)
    with pytest.raises(ValueError, match="at most 10000 weights"):
        laplace.fit(_mlp(3, "softmax", hidden=3000), x, y, subset="all", hessian="full")


def test_bad_arguments_after_fit():
    model = _mlp(3, "softmax")
    x, y = _data(8, 3, classification=True)
    with pytest.raises(ValueError, match="call `fit"):
        laplace.Laplace(model).predict(x)
    la = laplace.fit(model, x, y)
    for kwargs, match in (({"pred_type": "laplace"}, "pred_type='laplace'"),
                          ({"link_approx": "bridge"}, "link_approx='bridge'"),
                          ({"num_samples": 0}, "num_samples=0")):
        with pytest.raises(ValueError, match=match):
            la.predict(x, **kwargs)
    with pytest.raises(ValueError, match="method='cv'"):
        la.optimize_prior_precision(method="cv")
    with pytest.raises(ValueError, match="x_val=None"):
        la.optimize_prior_precision(method="val_nll")
    with pytest.raises(ValueError, match="tune_sigma_noise"):
        la.optimize_prior_precision(tune_sigma_noise=True)
    with pytest.raises(ValueError, match="grid"):
        la.optimize_prior_precision(method="val_nll", x_val=x, y_val=y, grid=[1.0, -2.0])
    with pytest.raises(ValueError, match="subset='all'"):
        laplace.fit(model, x, y, subset="all", hessian="diag").to_model()
    with pytest.raises(ValueError, match="structure='tril'"):
        laplace.LaplaceDense(3, structure="tril")


def test_nan_inputs_and_negative_seeds_are_refused():
    """Issue 36 (8): predict returned NaN for NaN inputs; to_model took seed=-1 (NumPy ints are seeds)."""
    model = _mlp(3, "softmax")
    x, y = _data(8, 3, classification=True)
    la = laplace.fit(model, x, y)
    bad = x[:3].copy()
    bad[1, 2] = np.nan
    for kwargs in ({}, {"link_approx": "mc"}, {"pred_type": "nn"}):
        with pytest.raises(ValueError, match=r"Expected `x` to hold finite numbers. Received: x with 1 NaN"):
            la.predict(bad, **kwargs)
    with pytest.raises(ValueError, match="Received: x with 1 NaN"):
        la.predict(tf.data.Dataset.from_tensor_slices(bad).batch(2))
    with pytest.raises(ValueError, match="Received: x with 1 NaN"):
        la.function_moments(bad)
    with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\).*Received: seed=-1"):
        la.to_model(seed=-1)
    assert la.to_model(seed=np.int64(3)).layers[-1].seed == 3


def test_laplace_lora_to_model_refuses_a_negative_seed():
    """Issue 36 (8): LoRALaplace.to_model(seed=-1) was accepted."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((D_IN,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    model.layers[0].enable_lora(1)
    x, y = _data(10, 2, classification=True)
    la = tfbnn.lora.fit_laplace(model, x, y, hessian="diag")
    with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\).*Received: seed=-1"):
        la.to_model(seed=-1)
    la.to_model(seed=np.int32(1))
