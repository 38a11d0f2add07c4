"""tfbnn.evidential: NLLs and regularizers against SciPy / NumPy / tfd.kl_divergence, NIG moments against a
Monte Carlo of the NIG, predict's split, annealing, save/load, a fit, and what the "epistemic" number does."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from scipy import special, stats

import tfbnn
from tfbnn import evidential

tfd = tfp.distributions
RNG = np.random.default_rng(0)  # restarted at every test (tests/conftest.py)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _raw(*shape):
    return RNG.normal(size=shape).astype("float32")


# -- regression ---------------------------------------------------------------------------


def _nig(raw, floor=1e-3):
    g, n, a, b = np.split(raw.astype(np.float64), 4, axis=-1)
    return g, _softplus(n) + floor, 1 + _softplus(a) + floor, _softplus(b) + floor


def test_regression_head_constrains_and_its_loss_is_the_student_t_nll_plus_the_regularizer():
    head = evidential.EvidentialRegressionHead()
    raw = _raw(6, 8)  # d = 2
    out = head(raw).numpy().astype(np.float64)
    gamma, nu, alpha, beta = _nig(raw)
    np.testing.assert_allclose(out, np.concatenate([gamma, nu, alpha, beta], axis=-1), rtol=1e-5)
    y = _raw(6, 2).astype(np.float64)
    student = stats.t.logpdf(y, df=2 * alpha, loc=gamma, scale=np.sqrt(beta * (1 + nu) / (nu * alpha)))
    np.testing.assert_allclose(head.log_prob(y, out).numpy(), student.sum(axis=1), rtol=1e-5)
    lam = 0.3
    loss = evidential.EvidentialRegressionLoss(head, lam=lam, reduction=None)
    expected = -student.sum(axis=1) + lam * (np.abs(y - gamma) * (2 * nu + alpha)).sum(axis=1)
    np.testing.assert_allclose(loss(y, out).numpy(), expected, rtol=1e-5)


def test_regression_moments_match_a_monte_carlo_of_the_normal_inverse_gamma():
    head = evidential.EvidentialRegressionHead()
    out = np.array([[0.7, 2.0, 3.5, 1.5]])  # gamma, nu, alpha, beta
    mean, aleatoric = head.moments(out)
    epistemic = head.epistemic_variance(out)
    rng = np.random.default_rng(1)
    sigma2 = stats.invgamma.rvs(3.5, scale=1.5, size=400_000, random_state=rng)
    mu = rng.normal(0.7, np.sqrt(sigma2 / 2.0))
    assert float(mean[0, 0]) == 0.7
    assert float(aleatoric[0, 0]) == pytest.approx(stats.invgamma.mean(3.5, scale=1.5), rel=1e-6)
    assert float(aleatoric[0, 0]) == pytest.approx(sigma2.mean(), rel=0.02)
    assert float(epistemic[0, 0]) == pytest.approx(mu.var(), rel=0.02)
    y = rng.normal(mu, np.sqrt(sigma2))  # the marginal's variance is the sum of the two parts
    assert float(head.distribution(out).variance()[0, 0]) == pytest.approx(y.var(), rel=0.03)
    assert float(head.distribution(out).variance()[0, 0]) == pytest.approx(
        float(aleatoric[0, 0] + epistemic[0, 0]), rel=1e-6)


def test_predict_reports_the_heads_aleatoric_and_epistemic_parts():
    head = evidential.EvidentialRegressionHead()
    deterministic = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4), head])
    x = _raw(5, 2)
    res = tfbnn.predict(deterministic, x, num_samples=3)
    out = deterministic(x).numpy().astype(np.float64)
    gamma, nu, alpha, beta = np.split(out, 4, axis=-1)
    np.testing.assert_allclose(res.mean, gamma, rtol=1e-5)
    np.testing.assert_allclose(res.aleatoric_std, np.sqrt(beta / (alpha - 1)), rtol=1e-5)
    np.testing.assert_allclose(res.epistemic_std, np.sqrt(beta / (nu * (alpha - 1))), rtol=1e-5)
    bayesian = keras.Sequential([keras.Input((2,)), tfbnn.DenseFlipout(4, seed=3), evidential.EvidentialRegressionHead()])
    for num_samples in (20, tfbnn.inference.AdaptiveSampling(tolerance=0.05, chunk_size=8, max_samples=16)):
        res = tfbnn.predict(bayesian, x, num_samples=num_samples, return_samples=True)
        s = res.samples.astype(np.float64)
        g, n, a, b = np.split(s, 4, axis=-1)
        np.testing.assert_allclose(res.epistemic_std, np.sqrt(g.var(axis=0) + (b / (n * (a - 1))).mean(axis=0)),
                                   rtol=1e-4)
        np.testing.assert_allclose(res.aleatoric_std, np.sqrt((b / (a - 1)).mean(axis=0)), rtol=1e-5)


def test_the_exported_summary_adds_the_heads_epistemic_variance_as_predict_does():
    from tfbnn import export

    head = evidential.EvidentialRegressionHead()
    samples = head(_raw(7, 3, 4)).numpy().astype(np.float64)  # T = 7 samples of 3 examples
    summary = export._regression_summary(tf.constant(samples), head)
    expected = tfbnn.inference.summarize_regression(samples, head=head)
    np.testing.assert_allclose(summary["epistemic_std"], expected.epistemic_std, rtol=1e-5)
    np.testing.assert_allclose(summary["aleatoric_std"], expected.aleatoric_std, rtol=1e-5)
    g, n, a, b = np.split(samples, 4, axis=-1)
    np.testing.assert_allclose(summary["epistemic_std"], np.sqrt(g.var(0) + (b / (n * (a - 1))).mean(0)), rtol=1e-6)


def _fit_constant(y, lam, steps=300):
    """Full-batch Adam on an evidential head whose four raw parameters are free (a constant input's bias):
    the loss of each step, and the fitted "epistemic" variance Var[mu]."""
    head = evidential.EvidentialRegressionHead()
    loss = evidential.EvidentialRegressionLoss(head, lam=lam)
    raw = tf.Variable(tf.zeros(4))
    optimizer = keras.optimizers.Adam(0.05)
    targets = tf.constant(y[:, None])

    @tf.function
    def fit():
        losses = tf.TensorArray(tf.float32, steps)
        for i in tf.range(steps):
            with tf.GradientTape() as tape:
                value = loss(targets, head(tf.tile(raw[None], [len(y), 1])))
            optimizer.apply_gradients([(tape.gradient(value, raw), raw)])
            losses = losses.write(i, value)
        return losses.stack()

    losses = fit().numpy()
    return losses, float(head.epistemic_variance(head(raw[None]))[0, 0])


def test_a_fit_lowers_the_loss_and_the_epistemic_variance_does_not_shrink_with_data():
    y = np.random.default_rng(2).normal(1.0, 0.5, size=400).astype("float32")
    losses, small = _fit_constant(y[:20], lam=0.01)
    assert losses[-1] < losses[0] - 0.5
    _, large = _fit_constant(y, lam=0.01)
    # A Bayesian posterior of the mean (known noise 0.5^2, flat prior) has variance 0.25 / N: 20x smaller.
    bayes_small, bayes_large = 0.25 / 20, 0.25 / 400
    assert bayes_large / bayes_small == pytest.approx(0.05)
    assert large / small > 0.3, (small, large)  # the evidential "epistemic" variance stays of the same size
    _, strong = _fit_constant(y, lam=1.0)
    assert strong > 2 * large  # the regularizer, not the data, sets its scale


# -- classification -----------------------------------------------------------------------


@pytest.mark.parametrize("evidence", evidential.EVIDENCE_FUNCTIONS)
def test_dirichlet_head_probabilities_uncertainty_and_predictive_nll(evidence):
    head = evidential.DirichletHead(evidence=evidence)
    raw = _raw(5, 3) * 4
    expected = {"softplus": _softplus(raw), "relu": np.maximum(raw, 0), "exp": np.exp(np.clip(raw, -10, 10))}[evidence]
    alpha = head(raw).numpy().astype(np.float64)
    np.testing.assert_allclose(alpha, expected + 1, rtol=1e-5)
    s = alpha.sum(axis=1)
    np.testing.assert_allclose(head.class_probabilities(alpha), alpha / s[:, None], rtol=1e-6)
    np.testing.assert_allclose(head.uncertainty(alpha), 3 / s, rtol=1e-6)
    labels = RNG.integers(0, 3, 5)
    nll = tfbnn.DistributionNLL(head, reduction=None)
    np.testing.assert_allclose(nll(labels, alpha), np.log(s) - np.log(alpha[np.arange(5), labels]), rtol=1e-5)
    np.testing.assert_allclose(nll(np.eye(3)[labels], alpha), nll(labels, alpha), rtol=1e-6)
    assert np.all(np.isfinite(head(np.full((1, 3), 1e4, "float32"))))


@pytest.mark.parametrize("loss_type", evidential.CLASSIFICATION_LOSSES)
def test_classification_loss_is_sensoys_with_the_kl_of_tfd(loss_type):
    alpha = 1 + 3 * RNG.random((6, 4))
    labels = RNG.integers(0, 4, 6)
    y = np.eye(4)[labels]
    s = alpha.sum(axis=1, keepdims=True)
    p = alpha / s
    data = {"mse": ((y - p) ** 2 + p * (1 - p) / (s + 1)).sum(axis=1),
            "digamma": (y * (special.digamma(s) - special.digamma(alpha))).sum(axis=1),
            "log": (y * (np.log(s) - np.log(alpha))).sum(axis=1)}[loss_type]
    tilde = y + (1 - y) * alpha
    kl = tfd.kl_divergence(tfd.Dirichlet(tilde), tfd.Dirichlet(np.ones(4))).numpy()
    loss = evidential.EvidentialClassificationLoss(loss_type, kl_coefficient=0.4, reduction=None)
    np.testing.assert_allclose(loss(labels, alpha.astype("float32")), data + 0.4 * kl, rtol=1e-4)
    np.testing.assert_allclose(loss(y, alpha.astype("float32")), data + 0.4 * kl, rtol=1e-4)
    np.testing.assert_allclose(evidential.dirichlet_kl_to_uniform(alpha), tfd.kl_divergence(
        tfd.Dirichlet(alpha), tfd.Dirichlet(np.ones(4))), rtol=1e-6)


def test_annealing_drives_the_compiled_coefficient_and_the_models_save_and_load(tmp_path):
    keras.utils.set_random_seed(0)
    x = _raw(32, 2)
    labels = (x[:, 0] > 0).astype("int32")
    head = evidential.DirichletHead()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2), head])
    loss = evidential.EvidentialClassificationLoss("digamma")
    model.compile(keras.optimizers.Adam(0.05), loss=loss)
    history = model.fit(x, labels, batch_size=32, epochs=4, verbose=0,
                        callbacks=[evidential.EvidentialAnnealing(annealing_epochs=2)])
    assert history.history["evidential_kl_coefficient"] == [0.0, 0.5, 1.0, 1.0]
    alpha = model(x).numpy()
    y = np.eye(2)[labels]
    tilde = y + (1 - y) * alpha
    expected = (y * (special.digamma(alpha.sum(1, keepdims=True)) - special.digamma(alpha))).sum(1) + tfd.kl_divergence(
        tfd.Dirichlet(tilde), tfd.Dirichlet(np.ones(2))).numpy()
    assert model.evaluate(x, labels, verbose=0) == pytest.approx(expected.mean(), rel=1e-4)  # coefficient 1 in the step
    path = str(tmp_path / "dirichlet.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded(x), model(x))
    assert loaded.layers[-1].get_config() == head.get_config() and loaded.loss.loss == "digamma"
    res = tfbnn.predict(loaded, x[:4], num_samples=2)
    np.testing.assert_allclose(res.mean_probs, alpha[:4] / alpha[:4].sum(1, keepdims=True), rtol=1e-5)

    reg_head = evidential.EvidentialRegressionHead(min_evidence=0.01)
    reg = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4), reg_head])
    reg.compile("sgd", loss=evidential.EvidentialRegressionLoss(reg_head, lam=0.2))
    y_reg = _raw(32)
    before = reg.evaluate(x, y_reg, verbose=0)
    reg.save(str(tmp_path / "nig.keras"))
    back = keras.saving.load_model(str(tmp_path / "nig.keras"))
    np.testing.assert_array_equal(back(x), reg(x))
    assert json.dumps(back.loss.get_config(), sort_keys=True) == json.dumps(reg.loss.get_config(), sort_keys=True)
    assert back.evaluate(x, y_reg, verbose=0) == pytest.approx(before, rel=1e-6)


def test_extreme_raw_outputs_stay_finite():
    head = evidential.EvidentialRegressionHead()
    out = head(np.array([[0.0, -1e4, -1e4, -1e4], [0.0, 1e4, 1e4, 1e4]], "float32"))
    loss = evidential.EvidentialRegressionLoss(head, reduction=None)(np.array([[3.0], [3.0]]), out)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(loss))
    assert np.all(np.isfinite(head.epistemic_variance(out))) and np.all(np.isfinite(head.moments(out)[1]))


@pytest.mark.parametrize("make, match", [
    (lambda: evidential.EvidentialRegressionHead(min_evidence=0), "min_evidence=0"),
    (lambda: evidential.EvidentialRegressionLoss(evidential.EvidentialRegressionHead(), lam=-1), "lam=-1"),
    (lambda: evidential.EvidentialRegressionLoss(tfbnn.GaussianHead()), "Received: head=<GaussianHead"),
    (lambda: evidential.DirichletHead(evidence="square"), "evidence='square'"),
    (lambda: evidential.EvidentialClassificationLoss("hinge"), "loss='hinge'"),
    (lambda: evidential.EvidentialClassificationLoss(kl_coefficient=-0.1), "kl_coefficient=-0.1"),
    (lambda: evidential.EvidentialAnnealing(annealing_epochs=0), "annealing_epochs=0"),
    (lambda: evidential.EvidentialRegressionHead()(np.zeros((2, 3), "float32")), "Received: input_shape=\\(2, 3\\)"),
])
def test_bad_input_raises_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_the_annealed_kl_coefficient_is_saved_with_the_model(tmp_path):
    keras.utils.set_random_seed(0)
    x = _raw(16, 2)
    labels = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), evidential.DirichletHead()])
    model.compile(keras.optimizers.SGD(0.1), loss=evidential.EvidentialClassificationLoss(), run_eagerly=True)
    model.fit(x, labels, epochs=3, verbose=0, callbacks=[evidential.EvidentialAnnealing(annealing_epochs=4)])
    assert float(model.loss.kl_coefficient) == 0.5  # moved from the constructor's 1 by the annealing
    before = model.evaluate(x, labels, verbose=0)
    model.save(str(tmp_path / "annealed.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "annealed.keras"))
    assert float(loaded.loss.kl_coefficient) == 0.5
    assert loaded.evaluate(x, labels, verbose=0) == pytest.approx(before, rel=1e-6)


def test_classification_loss_refuses_labels_out_of_range():
    alpha = np.ones((2, 3), "float32")
    loss = evidential.EvidentialClassificationLoss()
    with pytest.raises(ValueError, match=r"Expected integer labels in \[0, 3\).*Received: y_true with labels \[-1, 5\]"):
        loss(np.array([5, -1]), alpha)
    traced = tf.function(lambda y, a: loss(y, a), input_signature=[tf.TensorSpec((None,), tf.int32),
                                                                     tf.TensorSpec((None, 3))])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Expected integer labels in \[0, 3\)"):
        traced(np.array([0, 5], "int32"), alpha)
    assert np.isfinite(float(traced(np.array([0, 2], "int32"), alpha)))
