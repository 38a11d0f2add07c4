"""Laplace for a whole network: KFAC over every Dense/Conv2D layer, per-layer prior precisions,
subnetwork Laplace, and the online marginal likelihood (issue 38).

Every number is checked against an independent computation: the exact GGN of
``subset="all", hessian="full"`` (the Jacobian by autodiff), the closed form of Bayesian
linear regression (its posterior, predictive and evidence), finite differences, and the
evidence maximiser found by a derivative-free search of the closed-form evidence."""

import os

import keras
import numpy as np
import pytest
import scipy.optimize

import tfbnn
from tfbnn.laplace import _kfac_inputs

RNG = np.random.default_rng(0)


def _mlp(seed=0, hidden=8, inputs=3, outputs=2):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(hidden, activation="tanh"),
                             keras.layers.Dense(outputs, activation="softmax")])


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x[:, 0] - x[:, 1] > 0).astype("int32")
    model = _mlp()
    model.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64, epochs=30, verbose=0)
    return model, x, y


def _blocks(la):
    """KFAC's dense precision's diagonal blocks, one per layer."""
    dense = la._matrix(la._basis.values)
    ends = np.cumsum([len(a) * len(g) for a, g in zip(la.hessian_factors[::2], la.hessian_factors[1::2])])
    return [dense[s:e, s:e] for s, e in zip(np.concatenate([[0], ends[:-1]]), ends)], ends


# -- KFAC over every layer ------------------------------------------------------------------
def test_kfac_of_one_dense_layer_and_one_example_is_the_exact_ggn():
    x, y = RNG.normal(size=(1, 3)).astype("float32"), np.array([1])
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="softmax")])
    kfac = tfbnn.laplace.fit(model, x, y, subset="all", hessian="kron")
    full = tfbnn.laplace.fit(model, x, y, subset="all", hessian="full")
    np.testing.assert_allclose(kfac.posterior_precision, full.posterior_precision, atol=1e-10)
    assert kfac.log_marginal_likelihood() == pytest.approx(full.log_marginal_likelihood(), abs=1e-8)


def test_kfac_blocks_of_a_conv_net_on_one_example_are_the_ggn_blocks():
    """For one example and a convolution applied at one position, each layer's GGN block is ``A kron G``
    exactly (the cross-layer blocks are what KFAC drops)."""
    x, y = RNG.normal(size=(1, 3, 3, 2)).astype("float32"), np.array([0])
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3, 3, 2)), keras.layers.Conv2D(3, 3, activation="tanh"),
                              keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")])
    kfac = tfbnn.laplace.fit(model, x, y, subset="all", hessian="kron")
    ggn = tfbnn.laplace.fit(model, x, y, subset="all", hessian="full").hessian_factors
    blocks, ends = _blocks(kfac)
    assert list(ends) == [(3 * 3 * 2 + 1) * 3, (3 * 3 * 2 + 1) * 3 + 4 * 2]
    start = 0
    for block, end in zip(blocks, ends):
        exact = ggn[start:end, start:end]
        np.testing.assert_allclose(block, exact, atol=1e-7 * np.abs(exact).max())
        start = end


@pytest.mark.parametrize("options", [{"strides": 2, "padding": "same"}, {"dilation_rate": 2, "padding": "same"},
                                     {"strides": (1, 2)}, {"use_bias": False}])
def test_kfac_patches_reproduce_the_convolution(options):
    """The inputs KFAC sums for a Conv2D (its patches, in the kernel's (kh, kw, in) order) times the
    flattened kernel are the layer's output, for strides, dilations and both paddings."""
    layer = keras.layers.Conv2D(4, (3, 2), **options)
    x = RNG.normal(size=(2, 7, 6, 3)).astype("float32")
    out = layer(x).numpy()
    a = _kfac_inputs(layer, x.astype(np.float64))
    w = layer.kernel.numpy().reshape(-1, 4)
    if layer.use_bias:
        w = np.concatenate([w, layer.bias.numpy()[None]])
    np.testing.assert_allclose(a @ w, out.reshape(-1, 4), atol=1e-5)


def _linear_regression(n=40, outputs=2, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype("float32")
    y = (x @ rng.normal(size=(3, outputs)) + 0.4 * rng.normal(size=(n, outputs))).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(outputs)])
    return model, x, y


def test_kfac_glm_predictive_and_evidence_on_bayesian_linear_regression_are_the_closed_form():
    delta, sigma = 2.0, 0.5
    model, x, y = _linear_regression()
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64)
    precision = design.T @ design / sigma**2 + delta * np.eye(4)
    mean = np.linalg.solve(precision, design.T @ y.astype(np.float64)) / sigma**2  # the MAP, (4, K)
    model.layers[0].kernel.assign(mean[:3].astype("float32"))
    model.layers[0].bias.assign(mean[3].astype("float32"))
    la = tfbnn.laplace.fit(model, x, y, likelihood="regression", subset="all", hessian="kron",
                           prior_precision=delta, sigma_noise=sigma)
    x_new = RNG.normal(size=(5, 3)).astype("float32")
    d_new = np.concatenate([x_new, np.ones((5, 1))], axis=1)
    exact_var = np.einsum("ni,ij,nj->n", d_new, np.linalg.inv(precision), d_new)
    pred = la.predict(x_new)
    np.testing.assert_allclose(pred.epistemic_std**2, np.repeat(exact_var[:, None], 2, axis=1), rtol=2e-5)
    np.testing.assert_allclose(pred.mean, d_new @ mean, atol=1e-5)
    cov = sigma**2 * np.eye(len(x)) + design @ design.T / delta  # each output independently
    evidence = sum(-0.5 * (np.linalg.slogdet(2 * np.pi * cov)[1] + t @ np.linalg.solve(cov, t))
                   for t in y.astype(np.float64).T)
    assert la.log_marginal_likelihood() == pytest.approx(evidence, abs=1e-4)


def test_kfac_predictive_variance_follows_the_full_ggn_on_a_small_mlp(trained):
    """KFAC's function variances track the full GGN's, closer than the diagonal GGN's (Ritter et al. 2018)."""
    model, x, y = trained

    def variances(hessian):
        la = tfbnn.laplace.fit(model, x, y, subset="all", hessian=hessian)
        return la, np.diagonal(la.function_moments(x)[1], axis1=1, axis2=2).ravel()

    kfac, a = variances("kron")
    _, b = variances("full")
    _, c = variances("diag")
    assert np.corrcoef(a, b)[0, 1] > 0.85 and 0.7 < np.median(a / b) < 1.4
    assert np.mean(np.abs(np.log(a / b))) < np.mean(np.abs(np.log(c / b)))
    assert np.corrcoef(a, b)[0, 1] > np.corrcoef(c, b)[0, 1]
    probs = tfbnn.predict(kfac, x[:6], num_samples=8, seed=0).mean_probs  # the nn predictive runs
    assert probs.shape == (6, 2) and np.all(np.isfinite(probs))


def test_kfac_names_a_layer_it_has_no_factors_for():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="hidden"),
                              keras.layers.BatchNormalization(name="bn"),
                              keras.layers.Dense(2, activation="softmax", name="out")])
    with pytest.raises(ValueError, match="hessian='diag'.*'bn' of type BatchNormalization"):
        tfbnn.laplace.Laplace(model, subset="all", hessian="kron")
    model.get_layer("bn").trainable = False  # frozen, it is no longer part of theta
    assert tfbnn.laplace.Laplace(model, subset="all", hessian="kron").prior_groups == ["hidden", "out"]


# -- per-layer prior precisions -------------------------------------------------------------
@pytest.mark.parametrize("hessian", ["kron", "diag"])
def test_per_layer_prior_gradient_is_the_evidence_derivative_and_zero_at_the_optimum(trained, hessian, tmp_path):
    model, x, y = trained
    la = tfbnn.laplace.fit(model, x, y, subset="all", hessian=hessian)
    assert len(la.prior_groups) == 2
    delta = np.array([0.5, 2.0])
    grad, _ = la.log_marginal_likelihood_gradient(delta)
    for i in range(2):
        step = np.exp(1e-5 * (np.arange(2) == i))
        numeric = (la.log_marginal_likelihood(delta * step) - la.log_marginal_likelihood(delta / step)) / 2e-5
        assert grad[i] == pytest.approx(numeric, rel=1e-5, abs=1e-7)
    shared = tfbnn.laplace.fit(model, x, y, subset="all", hessian=hessian).optimize_prior_precision()
    la.optimize_prior_precision(per_layer=True)
    assert la.prior_precision.shape == (2,)
    np.testing.assert_allclose(la.log_marginal_likelihood_gradient()[0], 0.0, atol=1e-3)
    assert la.log_marginal_likelihood() >= shared.log_marginal_likelihood() - 1e-9
    # the scalar case is the per-layer one with equal values
    assert shared.log_marginal_likelihood() == pytest.approx(
        la.log_marginal_likelihood(np.full(2, shared.prior_precision)), rel=1e-12)
    la.save(str(tmp_path / "la.npz"))
    back = tfbnn.inference.load_posterior(str(tmp_path / "la.npz"), model)
    np.testing.assert_array_equal(back.prior_precision, la.prior_precision)
    np.testing.assert_allclose(back.predict(x), la.predict(x), rtol=1e-12)


def test_per_layer_prior_refusals_name_the_argument(trained):
    model, x, y = trained
    full = tfbnn.laplace.fit(model, x, y, subset="all", hessian="full")
    with pytest.raises(ValueError, match="per-layer `prior_precision` takes hessian='kron' or 'diag'"):
        full.optimize_prior_precision(per_layer=True)
    diag = tfbnn.laplace.fit(model, x, y, subset="all", hessian="diag")
    with pytest.raises(ValueError, match="`per_layer=True` tunes by the marginal likelihood"):
        diag.optimize_prior_precision(method="val_nll", x_val=x, y_val=y, per_layer=True)
    with pytest.raises(ValueError, match=r"one value per layer, 2 for \['dense', 'dense_1'\]"):
        diag.log_marginal_likelihood([1.0, 2.0, 3.0])


# -- subnetwork Laplace --------------------------------------------------------------------
def test_a_subnetwork_of_every_weight_is_the_full_laplace(trained):
    model, x, y = trained
    full = tfbnn.laplace.fit(model, x, y, subset="all", hessian="full", prior_precision=3.0)
    every = tfbnn.laplace.fit(model, x, y, subset="subnetwork", subnetwork=np.ones(full.num_parameters, bool),
                              prior_precision=3.0)
    np.testing.assert_allclose(every.posterior_precision, full.posterior_precision, rtol=1e-12)
    assert every.log_marginal_likelihood() == pytest.approx(full.log_marginal_likelihood(), rel=1e-12)
    np.testing.assert_allclose(every.predict(x), full.predict(x), rtol=1e-10)


def test_a_subnetwork_ggn_is_the_submatrix_of_the_full_one(trained):
    model, x, y = trained
    ggn = tfbnn.laplace.fit(model, x, y, subset="all", hessian="full").hessian_factors
    per_weight = [RNG.random(v.shape) < 0.4 for v in model.trainable_variables]  # one mask per weight
    sub = tfbnn.laplace.fit(model, x, y, subset="subnetwork", subnetwork=per_weight)
    idx = np.flatnonzero(np.concatenate([m.ravel() for m in per_weight]))
    np.testing.assert_array_equal(sub.subnetwork_indices, idx)
    np.testing.assert_allclose(sub.hessian_factors, ggn[np.ix_(idx, idx)], rtol=1e-10, atol=1e-12)
    draws = sub.weight_draws(5, seed=0)  # every weight; those outside the subnetwork at theta*
    theta = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    outside = np.setdiff1d(np.arange(len(theta)), idx)
    np.testing.assert_allclose(draws[:, outside], np.broadcast_to(theta[outside], (5, len(outside))), rtol=1e-7)
    assert np.all(draws[:, idx].std(axis=0) > 0)


def test_a_subnetwork_count_takes_the_largest_diagonal_laplace_variances(trained, tmp_path):
    model, x, y = trained
    sub = tfbnn.laplace.fit(model, x, y, subset="subnetwork", subnetwork=12, prior_precision=2.0)
    variance = tfbnn.laplace.fit(model, x, y, subset="all", hessian="diag", prior_precision=2.0).posterior_covariance
    np.testing.assert_array_equal(sub.subnetwork_indices, np.sort(np.argsort(-variance)[:12]))
    assert sub.num_parameters == 12 and sub.hessian == "full"
    mc = tfbnn.predict(sub, x[:8], num_samples=400, seed=1).mean_probs
    nn = sub.predict(x[:8], pred_type="nn", num_samples=400, seed=1)
    np.testing.assert_allclose(mc, nn, atol=0.03)
    sub.save(str(tmp_path / "sub.npz"))
    back = tfbnn.inference.load_posterior(str(tmp_path / "sub.npz"), model)
    np.testing.assert_array_equal(back.subnetwork_indices, sub.subnetwork_indices)
    np.testing.assert_allclose(back.predict(x), sub.predict(x), rtol=1e-12)
    np.testing.assert_allclose(back.weight_draws(3, seed=4), sub.weight_draws(3, seed=4), rtol=1e-12)


@pytest.mark.parametrize("kwargs, named", [
    ({"subset": "subnetwork"}, "`subnetwork`"),
    ({"subset": "all", "subnetwork": 3}, "`subnetwork`"),
    ({"subset": "subnetwork", "subnetwork": 3, "hessian": "diag"}, "hessian='diag'"),
    ({"subset": "subnetwork", "subnetwork": 0}, "subnetwork"),
    ({"subset": "subnetwork", "subnetwork": np.ones(5, bool)}, "subnetwork of shape \\(5,\\)"),
    ({"subset": "subnetwork", "subnetwork": np.array([-1, 2])}, "subnetwork"),
])
def test_subnetwork_arguments_are_checked(trained, kwargs, named):
    with pytest.raises(ValueError, match=named):
        tfbnn.laplace.Laplace(trained[0], **kwargs)


# -- online marginal likelihood -------------------------------------------------------------
def _closed_form_evidence_maximiser(x, y):
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64)

    def negative(z):
        delta, sigma = np.exp(z)
        cov = sigma**2 * np.eye(len(x)) + design @ design.T / delta
        return 0.5 * (np.linalg.slogdet(cov)[1] + y @ np.linalg.solve(cov, y))

    result = scipy.optimize.minimize(negative, [0.0, 0.0], method="Nelder-Mead",
                                     options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000})
    return np.exp(result.x)


def test_online_marginal_likelihood_converges_to_the_evidence_maximiser():
    """Immer et al. (2021): training to the MAP of the current prior and updating the prior and the noise by
    the Laplace evidence reaches the type-II maximum likelihood of Bayesian linear regression (within 1%)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(100, 3)).astype("float32")
    y = (x @ [1.0, -2.0, 0.5] + 0.3 + 0.5 * rng.normal(size=100)).astype("float32")[:, None]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.3), "mse")
    online = tfbnn.laplace.OnlineMarginalLikelihood(x, y, "regression", every=10)
    model.fit(x, y, batch_size=100, epochs=60, verbose=0, callbacks=[online])
    delta, sigma = _closed_form_evidence_maximiser(x, y[:, 0])
    assert len(online.history) == 6 and [h["epoch"] for h in online.history] == [10, 20, 30, 40, 50, 60]
    assert float(online.prior_precision[0]) == pytest.approx(delta, rel=0.01)
    assert online.sigma_noise == pytest.approx(sigma, rel=0.01)
    assert online.laplace.sigma_noise == online.sigma_noise
    assert all(v.regularizer is None for v in model.trainable_variables)  # removed at the end of fit


def test_online_marginal_likelihood_puts_the_prior_in_the_loss_per_layer(trained):
    _, x, y = trained
    model = _mlp(seed=2)
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    online = tfbnn.laplace.OnlineMarginalLikelihood(x, y, every=2, burnin=1, prior_precision=[0.5, 4.0])
    seen = []

    class Penalty(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            delta = np.broadcast_to(np.asarray(online.prior_precision), (2,))
            layers = [layer for layer in model.layers if layer.weights]
            expected = sum(d / (2 * len(x)) * sum(float(np.sum(v.numpy() ** 2)) for v in layer.trainable_weights)
                           for d, layer in zip(delta, layers))
            seen.append((float(sum(keras.ops.convert_to_numpy(loss) for loss in model.losses)), expected))

    history = model.fit(x, y, batch_size=32, epochs=5, verbose=0, callbacks=[online, Penalty()])
    assert [h["epoch"] for h in online.history] == [3, 5]
    assert online.prior_precision.shape == (2,) and np.all(np.isfinite(history.history["loss"]))
    for got, expected in seen:
        assert got == pytest.approx(expected, rel=1e-5)
    assert seen[3][1] != pytest.approx(seen[0][1])  # the prior moved after the first update
    assert not model.losses


def test_online_marginal_likelihood_refuses_a_model_with_its_own_regularizer(trained):
    _, x, y = trained
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax",
                                                                     kernel_regularizer="l2")])
    model.compile("adam", "sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="must have no regularizer.*kernel"):
        model.fit(x, y, epochs=1, verbose=0,
                  callbacks=[tfbnn.laplace.OnlineMarginalLikelihood(x, y, hessian="diag")])
    with pytest.raises(ValueError, match="`every`"):
        tfbnn.laplace.OnlineMarginalLikelihood(x, y, every=0)


def test_the_cli_takes_kfac_per_layer_priors_and_a_subnetwork(trained, tmp_path, capsys):
    import json

    from tfbnn import cli

    model, x, y = trained
    path, data = str(tmp_path / "m.keras"), str(tmp_path / "d.npz")
    model.save(path)
    np.savez(data, x_train=x[:48], y_train=y[:48], x_test=x[48:], y_test=y[48:])
    loaded = keras.saving.load_model(path)
    for extra, direct in [
        (["--subset", "all", "--hessian", "kron", "--per-layer-prior"],
         lambda: tfbnn.laplace.fit(loaded, x[:48], y[:48], subset="all", hessian="kron").optimize_prior_precision(
             per_layer=True)),
        (["--subset", "subnetwork", "--subnetwork", "10"],
         lambda: tfbnn.laplace.fit(loaded, x[:48], y[:48], subset="subnetwork", subnetwork=10)
         .optimize_prior_precision()),
    ]:
        prefix = str(tmp_path / extra[1])
        assert cli.main(["laplace", path, "--data", data, "--output", prefix, "--verbose", "0", *extra]) == 0
        capsys.readouterr()
        with open(prefix + ".json") as f:
            report = json.load(f)
        la = direct()
        np.testing.assert_allclose(report["prior_precision"], la.prior_precision, rtol=1e-6)
        assert report["num_parameters"] == la.num_parameters and report["subset"] == la.subset
    assert os.path.exists(prefix + ".npz")
