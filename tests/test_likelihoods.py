"""Distribution heads (tfbnn.likelihoods): NLLs against scipy / NumPy, moments, predict's split, save/load."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from scipy import special, stats

import tfbnn
from tfbnn import cli, likelihoods, posteriors
from tfbnn.cli.export import model_task

tfd = tfp.distributions
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "heads")
RNG = np.random.default_rng(0)  # restarted at every test (tests/conftest.py)


@keras.saving.register_keras_serializable(package="tests_likelihoods")
def laplace(t):
    """A Laplace per target: ``t = [loc (1), raw scale (1)]``."""
    return tfd.Independent(tfd.Laplace(t[..., :1], 1e-3 + tf.nn.softplus(t[..., 1:])), 1)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _raw(*shape):
    return RNG.normal(size=shape).astype("float32")


# -- each NLL against an independent computation ------------------------------------------


def test_gaussian_nll_is_scipy_and_equals_gaussian_nll():
    head = tfbnn.GaussianHead(min_scale=0.01)
    raw, y = _raw(6, 4), _raw(6, 2)
    out = head(raw).numpy()
    scale = _softplus(raw[:, 2:].astype(np.float64)) + 0.01
    np.testing.assert_allclose(out[:, 2:], scale, rtol=1e-6)
    expected = -stats.norm.logpdf(y, raw[:, :2], scale).sum(axis=1)
    nll = -head.log_prob(y, out).numpy()
    np.testing.assert_allclose(nll, expected, rtol=1e-5)
    np.testing.assert_allclose(tfbnn.gaussian_nll(y, out).numpy(), expected, rtol=1e-5)
    assert float(likelihoods.DistributionNLL(head)(y, out)) == pytest.approx(expected.mean(), rel=1e-5)


@pytest.mark.parametrize("df", [None, 3.5])
def test_student_t_nll_and_moments_are_scipy(df):
    head = tfbnn.StudentTHead(df=df, min_scale=0.01, min_df=2.0)
    raw = _raw(5, 6 if df is None else 4).astype(np.float64)
    out = head(raw.astype("float32")).numpy()
    loc, scale = raw[:, :2], _softplus(raw[:, 2:4]) + 0.01
    nu = _softplus(raw[:, 4:]) + 2.0 if df is None else np.full((5, 2), df)
    np.testing.assert_allclose(out, np.concatenate([loc, scale, nu], axis=1), rtol=1e-5)
    y = _raw(5, 2)
    np.testing.assert_allclose(-head.log_prob(y, out).numpy(), -stats.t.logpdf(y, nu, loc, scale).sum(axis=1),
                               rtol=1e-4)
    mean, var = head.moments(out.astype(np.float64))
    np.testing.assert_allclose(mean, loc, rtol=1e-6)
    np.testing.assert_allclose(var, stats.t.var(nu, loc, scale), rtol=1e-4)


def _numpy_mixture(out, k, d):
    """(log w (B, K), loc (B, K, d), scale (B, K, d)) from a MixtureNormalHead output."""
    blocks = out[:, k:].reshape(len(out), k, 2 * d)
    return out[:, :k], blocks[..., :d], blocks[..., d:]


def test_mixture_nll_and_moments_are_numpy():
    k, d = 3, 2
    head = tfbnn.MixtureNormalHead(k, min_scale=0.01)
    raw = _raw(7, head.params_size(k, d)).astype(np.float64)
    out = head(raw.astype("float32")).numpy().astype(np.float64)
    _, raw_loc, raw_scale = _numpy_mixture(raw, k, d)
    log_w, loc, scale = _numpy_mixture(out, k, d)
    np.testing.assert_allclose(log_w, special.log_softmax(raw[:, :k], axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loc, raw_loc, rtol=1e-6)
    np.testing.assert_allclose(scale, _softplus(raw_scale) + 0.01, rtol=1e-5)
    y = _raw(7, d).astype(np.float64)
    components = stats.norm.logpdf(y[:, None, :], loc, scale).sum(axis=-1)  # (B, K)
    expected = -special.logsumexp(log_w + components, axis=1)
    np.testing.assert_allclose(-head.log_prob(y, out).numpy(), expected, rtol=1e-6)
    w = special.softmax(log_w, axis=1)[..., None]  # Categorical(logits=log w)
    mean = (w * loc).sum(axis=1)
    var = (w * (scale ** 2 + loc ** 2)).sum(axis=1) - mean ** 2
    got_mean, got_var = head.moments(out)
    np.testing.assert_allclose(got_mean, mean, rtol=1e-10)
    np.testing.assert_allclose(got_var, var, rtol=1e-10)
    dist = likelihoods.to_distribution(head, out)
    assert isinstance(dist, tfd.MixtureSameFamily) and dist.event_shape == (d,) and dist.batch_shape == (7,)


def test_bernoulli_nll_and_probabilities_are_numpy():
    head = tfbnn.BernoulliHead()
    logits = _raw(6, 3).astype(np.float64)
    y = (RNG.random((6, 3)) < 0.5).astype("float32")
    p = special.expit(logits)
    expected = -(y * np.log(p) + (1 - y) * np.log1p(-p)).sum(axis=1)
    np.testing.assert_allclose(-head.log_prob(y, logits).numpy(), expected, rtol=1e-10)
    probs = head.class_probabilities(logits).numpy()
    np.testing.assert_allclose(probs, np.stack([1 - p, p], axis=-1), rtol=1e-10)
    one = tfbnn.BernoulliHead()
    np.testing.assert_allclose(-one.log_prob(y[:, 0], logits[:, :1]).numpy(),  # (B,) targets for d = 1
                               -(y[:, 0] * np.log(p[:, 0]) + (1 - y[:, 0]) * np.log1p(-p[:, 0])), rtol=1e-10)


def test_categorical_nll_takes_one_hot_and_integer_labels():
    head = tfbnn.CategoricalHead()
    raw = _raw(5, 4).astype(np.float64)
    out = head(raw.astype("float32")).numpy()
    np.testing.assert_allclose(np.exp(out).sum(axis=1), 1.0, rtol=1e-6)  # normalized logits
    labels = np.array([0, 3, 1, 2, 3])
    expected = -special.log_softmax(raw, axis=1)[np.arange(5), labels]
    loss = likelihoods.DistributionNLL(head, reduction=None)
    np.testing.assert_allclose(loss(labels, out), expected, rtol=1e-5)
    np.testing.assert_allclose(loss(labels[:, None], out), expected, rtol=1e-5)
    np.testing.assert_allclose(loss(np.eye(4)[labels], out), expected, rtol=1e-5)
    np.testing.assert_allclose(head.class_probabilities(out), special.softmax(raw, axis=1), rtol=1e-5)


def test_distribution_lambda_head_uses_the_registered_function():
    head = tfbnn.DistributionLambdaHead(laplace)
    raw, y = _raw(6, 2).astype(np.float64), _raw(6).astype(np.float64)
    np.testing.assert_array_equal(head(raw.astype("float32")), raw.astype("float32"))
    scale = 1e-3 + _softplus(raw[:, 1])
    np.testing.assert_allclose(-head.log_prob(y, raw).numpy(), -stats.laplace.logpdf(y, raw[:, 0], scale),
                               rtol=1e-5)
    mean, var = head.moments(raw)
    np.testing.assert_allclose(mean[:, 0], raw[:, 0], rtol=1e-6)
    np.testing.assert_allclose(var[:, 0], 2 * scale ** 2, rtol=1e-5)
    config = head.get_config()
    assert config["make_distribution"]["config"] == "tests_likelihoods>laplace"
    assert tfbnn.DistributionLambdaHead.from_config(config).make_distribution is laplace


# -- predict's split against NumPy from the returned samples ------------------------------


def _bayesian_model(head, units, seed=0):
    return keras.Sequential([
        keras.Input((2,)),
        tfbnn.DenseFlipout(8, activation="tanh", seed=seed + 1),
        tfbnn.DenseFlipout(units, seed=seed + 2),
        head,
    ])


REGRESSION_HEADS = {
    "student_t": (lambda: tfbnn.StudentTHead(), 3),
    "mixture": (lambda: tfbnn.MixtureNormalHead(2), 6),
    "lambda": (lambda: tfbnn.DistributionLambdaHead(laplace), 2),
}


@pytest.mark.parametrize("name", sorted(REGRESSION_HEADS))
def test_predict_splits_the_variance_of_regression_heads(name):
    make, units = REGRESSION_HEADS[name]
    model = _bayesian_model(make(), units)
    x = _raw(5, 2)
    res = tfbnn.predict(model, x, num_samples=40, return_samples=True)
    samples = res.samples.astype(np.float64)  # (T, B, P): the head's outputs
    dist = model.layers[-1].distribution(samples)
    means, variances = dist.mean().numpy(), dist.variance().numpy()
    np.testing.assert_allclose(res.mean, means.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.epistemic_std, means.std(axis=0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res.aleatoric_std, np.sqrt(variances.mean(axis=0)), rtol=1e-5)
    np.testing.assert_allclose(res.variance, means.var(axis=0) + variances.mean(axis=0), rtol=1e-4)
    assert np.all(res.epistemic_std > 0)


def test_adaptive_predict_with_a_mixture_head_matches_its_samples():
    model = _bayesian_model(tfbnn.MixtureNormalHead(2), 6)
    rule = tfbnn.inference.AdaptiveSampling(tolerance=0.05, chunk_size=8, max_samples=32, per="batch")
    res = tfbnn.predict(model, _raw(4, 2), num_samples=rule, return_samples=True)
    means, variances = model.layers[-1].moments(res.samples.astype(np.float64))
    np.testing.assert_allclose(res.mean, np.mean(means, axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.aleatoric_std, np.sqrt(np.mean(variances, axis=0)), rtol=1e-5)
    np.testing.assert_allclose(res.epistemic_std, np.std(means, axis=0), rtol=1e-4, atol=1e-6)


def _entropy(p):
    return -np.sum(p * np.log(p), axis=-1)


@pytest.mark.parametrize("head, units, probs_shape", [
    (tfbnn.CategoricalHead, 3, (5, 3)),
    (tfbnn.BernoulliHead, 2, (5, 2, 2)),  # two labels, each a binary classification
])
def test_predict_entropy_split_of_classification_heads(head, units, probs_shape):
    model = _bayesian_model(head(), units)
    res = tfbnn.predict(model, _raw(5, 2), num_samples=30, return_samples=True)
    assert isinstance(res, tfbnn.ClassificationPrediction) and res.mean_probs.shape == probs_shape
    outputs = model.layers[-1]  # the per-sample probabilities are the head's, from its outputs
    probs = res.samples.astype(np.float64)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-6)
    mean = probs.mean(axis=0)
    np.testing.assert_allclose(res.mean_probs, mean, rtol=1e-5)
    np.testing.assert_allclose(res.predictive_entropy, _entropy(mean), rtol=1e-5)
    np.testing.assert_allclose(res.expected_entropy, _entropy(probs).mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(res.mutual_information, _entropy(mean) - _entropy(probs).mean(axis=0),
                               rtol=1e-3, atol=1e-6)
    assert np.all(res.mutual_information > 0) and outputs.task == "classification"


def test_predict_with_head_argument_and_bad_combinations():
    model = _bayesian_model(tfbnn.MixtureNormalHead(2), 6)
    x = _raw(3, 2)
    with pytest.raises(ValueError, match="Received: task='classification'"):
        tfbnn.predict(model, x, num_samples=2, task="classification")
    with pytest.raises(ValueError, match="Received: from_logits=True"):
        tfbnn.predict(model, x, num_samples=2, from_logits=True, task="auto")
    with pytest.raises(ValueError, match="Received: head=3"):
        tfbnn.predict(model, x, num_samples=2, head=3)
    with pytest.raises(ValueError, match=r"parameters of its MixtureNormalHead .*Received: head="):
        tfbnn.predict(model, x, num_samples=2, head=tfbnn.MixtureNormalHead(4))  # 6 outputs are not 4 (1 + 2 d)
    raw = tfbnn.predict(model, x, num_samples=4, gaussian_head=False)  # the outputs as plain numbers
    assert raw.aleatoric_std is None and raw.mean.shape == (3, 6)


# -- serialization ------------------------------------------------------------------------


HEADS = {
    "gaussian": (lambda: tfbnn.GaussianHead(min_scale=0.02), 4, lambda n: _raw(n, 2)),
    "student_t": (lambda: tfbnn.StudentTHead(df=4.0), 4, lambda n: _raw(n, 2)),
    "mixture": (lambda: tfbnn.MixtureNormalHead(3, min_scale=0.05), 9, lambda n: _raw(n, 1)),
    "bernoulli": (lambda: tfbnn.BernoulliHead(), 2, lambda n: (RNG.random((n, 2)) < 0.5).astype("float32")),
    "categorical": (lambda: tfbnn.CategoricalHead(), 3, lambda n: RNG.integers(0, 3, n)),
    "lambda": (lambda: tfbnn.DistributionLambdaHead(laplace), 2, lambda n: _raw(n)),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_heads_save_and_load_with_their_loss(name, tmp_path):
    make, units, targets = HEADS[name]
    head = make()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), head])
    model.compile("sgd", loss=likelihoods.DistributionNLL(head))
    x, y = _raw(8, 3), targets(8)
    loss = model.evaluate(x, y, verbose=0)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded(x), model(x))
    assert type(loaded.layers[-1]) is type(head) and loaded.layers[-1].get_config() == head.get_config()
    assert json.dumps(loaded.loss.get_config(), sort_keys=True) == json.dumps(model.loss.get_config(), sort_keys=True)
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(loss, rel=1e-6)
    assert np.isfinite(loss)
    dist = likelihoods.to_distribution(loaded, loaded(x))
    events = np.eye(3, dtype="float32")[y] if name == "categorical" else np.reshape(y, (8, -1))
    np.testing.assert_allclose(-tf.reduce_mean(dist.log_prob(events)), loss, rtol=1e-5)


def test_gaussian_head_file_saved_before_the_family_loads():
    model = keras.saving.load_model(os.path.join(FIXTURES, "gaussian_head_main.keras"))
    saved = np.load(os.path.join(FIXTURES, "gaussian_head_main.npz"))
    head = model.layers[-1]
    assert isinstance(head, likelihoods.DistributionHead) and head.min_scale == 0.05
    np.testing.assert_allclose(model(saved["x"]), saved["y"], rtol=1e-6)
    y = np.zeros((5, 2), "float32")
    assert float(np.mean(model.loss(y, saved["y"]))) == pytest.approx(
        -stats.norm.logpdf(y, saved["y"][:, :2], saved["y"][:, 2:]).sum(axis=1).mean(), rel=1e-5)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("make, match", [
    (lambda: tfbnn.MixtureNormalHead(0), "Received: num_components=0"),
    (lambda: tfbnn.StudentTHead(df=-1.0), "Received: df=-1.0"),
    (lambda: tfbnn.StudentTHead(min_df=-1), "Received: min_df=-1"),
    (lambda: tfbnn.DistributionLambdaHead(lambda t: tfd.Normal(t, 1.0)), "Received: make_distribution=<function"),
    (lambda: tfbnn.DistributionLambdaHead("nope"), "Received: make_distribution='nope'"),
    (lambda: tfbnn.DistributionLambdaHead(laplace, task="ranking"), "Received: task='ranking'"),
    (lambda: likelihoods.DistributionNLL("gaussian"), "Received: head='gaussian'"),
    (lambda: tfbnn.MixtureNormalHead(2)(np.zeros((1, 5), "float32")), r"Received: input_shape=\(1, 5\)"),
    (lambda: tfbnn.GaussianHead().log_prob(np.zeros((4, 2)), np.ones((4, 2))), r"Received: y_true.shape=\(4, 2\)"),
    (lambda: tfbnn.CategoricalHead().distribution(np.zeros((2, 1))), r"Received: y_pred=\(2, 1\)"),
    (lambda: likelihoods.to_distribution(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]), np.zeros((1, 2))),
     "Received: head=model"),
    (lambda: tfbnn.MixtureNormalHead.params_size(2, 0), "Received: event_size=0"),
])
def test_bad_input_raises_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- the done-when ----------------------------------------------------------------


@pytest.mark.heavy
def test_full_covariance_dense_variational_with_a_normal_head_fits_saves_loads_and_predicts(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, size=(48, 2)).astype("float32")
    noise = 0.05 + 0.3 * np.abs(x[:, :1])  # heteroscedastic
    y = (np.sin(2 * x[:, :1]) + 0.5 * x[:, 1:] + noise * rng.normal(size=(48, 1))).astype("float32")
    head = tfbnn.GaussianHead()
    model = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(8, activation="tanh"),
        tfbnn.layers.DenseVariational(head.params_size(1), posteriors.FullCovarianceNormal(init_scale=0.05),
                                      "normal", seed=1),
        head,
    ])
    nll = likelihoods.DistributionNLL(head)
    model.compile(keras.optimizers.Adam(0.03), loss=nll)

    def mean_nll():  # the data term at the posterior mean: the ELBO's noise-free part
        with tfbnn.posterior_mean(model):
            return float(nll(y, model(x)))

    def elbo():  # the negative ELBO per example, averaged over 20 Monte Carlo estimates (one was a coin flip):
        # one evaluate over 20 copies of the data, a batch (a fresh weight draw) per copy, averages the 20 batch losses
        return model.evaluate(np.tile(x, (20, 1)), np.tile(y, (20, 1)), batch_size=len(x), verbose=0)

    annealing = tfbnn.KLAnnealing(num_examples=len(x), schedule="constant")
    model.fit(x, y, epochs=0, verbose=0, callbacks=[annealing])  # sets the KL weight
    before, elbo_before = mean_nll(), elbo()
    history = model.fit(x, y, epochs=12, batch_size=16, verbose=0, callbacks=[annealing])
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and elbo() < elbo_before
    assert mean_nll() < before - 0.3
    path = str(tmp_path / "full_cov.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.layers[1].posterior, posteriors.FullCovarianceNormalWeights)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(model.predict(x, verbose=0), loaded.predict(x, verbose=0), rtol=1e-6)
    res = tfbnn.predict(loaded, x[:8], num_samples=64, return_samples=True)
    mean, scale = np.split(res.samples.astype(np.float64), 2, axis=-1)
    np.testing.assert_allclose(res.mean, mean.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.epistemic_std, mean.std(axis=0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res.aleatoric_std, np.sqrt(np.square(scale).mean(axis=0)), rtol=1e-5)
    assert np.all(res.epistemic_std > 0) and np.all(res.aleatoric_std > 0)
    dist = likelihoods.to_distribution(loaded, res.samples[0])
    assert isinstance(dist.distribution, tfd.Normal) and dist.event_shape == (1,)


# -- SavedModel export ----------------------------------------------------------------------


@pytest.mark.heavy
def test_exported_summary_of_a_mixture_head_is_its_law_of_total_variance(tmp_path, capsys):
    head = tfbnn.MixtureNormalHead(2)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(6), head])  # deterministic: epistemic 0
    path = tfbnn.export.export_saved_model(model, str(tmp_path / "mdn"), num_samples=3, task="regression")
    x = _raw(4, 2)
    served = tf.saved_model.load(path)
    summary = served.summary_seeded(x, tf.constant(0, tf.int64))
    log_w, loc, scale = _numpy_mixture(model(x).numpy().astype(np.float64), 2, 1)
    w = special.softmax(log_w, axis=1)[..., None]
    mean = (w * loc).sum(axis=1)
    np.testing.assert_allclose(summary["mean"], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(summary["aleatoric_std"], np.sqrt((w * (scale ** 2 + loc ** 2)).sum(axis=1) - mean ** 2),
                               rtol=1e-5)
    np.testing.assert_allclose(summary["epistemic_std"], 0.0, atol=1e-6)
    with pytest.raises(ValueError, match="Received: task='classification'"):
        tfbnn.export.export_saved_model(model, str(tmp_path / "bad"), task="classification")
    classifier = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), tfbnn.CategoricalHead()])
    assert model_task(model) == "regression" and model_task(classifier) == "classification"
    model.save(str(tmp_path / "mdn.keras"))
    assert cli.main(["export", str(tmp_path / "mdn.keras"), "--task", "classification"]) == 2
    err = capsys.readouterr().err
    assert "ends in a MixtureNormalHead" in err and "--task=classification" in err


# -- the quantile head and the pinball loss -----------------------------------------------


def test_pinball_loss_is_numpy_and_the_quantile_head_never_crosses(tmp_path):
    head = likelihoods.QuantileHead((0.2, 0.7), min_width=0.01)
    raw = _raw(9, 2) * 3
    band = head(raw).numpy().astype(np.float64)
    np.testing.assert_allclose(band, np.stack([raw[:, 0], raw[:, 0] + _softplus(raw[:, 1]) + 0.01], 1), rtol=1e-5)
    assert np.all(band[:, 1] > band[:, 0])
    y = _raw(9).astype(np.float64)

    def rho(q, u):
        return np.where(u >= 0, q * u, (q - 1) * u)

    loss = likelihoods.PinballLoss(head.quantiles, reduction=None)
    np.testing.assert_allclose(loss(y, band), rho(0.2, y - band[:, 0]) + rho(0.7, y - band[:, 1]), rtol=1e-5)
    np.testing.assert_allclose(loss(y[:, None], band), loss(y, band), rtol=1e-6)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), head])
    model.compile("sgd", loss=likelihoods.PinballLoss(head.quantiles))
    x = _raw(9, 3)
    model.save(str(tmp_path / "q.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "q.keras"))
    np.testing.assert_array_equal(loaded(x), model(x))
    assert loaded.layers[-1].get_config() == head.get_config() and loaded.loss.quantiles == (0.2, 0.7)
    for make, match in ((lambda: likelihoods.QuantileHead((0.9, 0.1)), r"quantiles=\(0.9, 0.1\)"),
                        (lambda: likelihoods.PinballLoss((0.1, 1.0)), r"quantiles=\(0.1, 1.0\)"),
                        (lambda: likelihoods.QuantileHead(min_width=-1), "min_width=-1"),
                        (lambda: likelihoods.QuantileHead()(np.zeros((2, 3), "float32")), r"input_shape=\(2, 3\)")):
        with pytest.raises(ValueError, match=match):
            make()


# -- the metric check: read afresh at each compile, from public state ---------------------------


def _gaussian_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), tfbnn.GaussianHead()])


def _xy():
    x = RNG.normal(size=(16, 3)).astype("float32")
    return x, (2 * x[:, :1]).astype("float32")


def test_a_refused_metric_does_not_stick_to_the_model_or_its_clone():
    x, y = _xy()
    model = _gaussian_model()
    model.compile("sgd", likelihoods.DistributionNLL(model.layers[-1]), metrics=["mae"])
    for run in (lambda: model.fit(x, y, epochs=1, verbose=0), lambda: model.predict(x, verbose=0)):
        with pytest.raises(ValueError, match=r"predictive mean of the model's GaussianHead.*Received: metrics=\['mae'\]"):
            run()
    clone = keras.models.clone_model(model)
    # (eager steps from here on: the compiled step's check ran above, and tracing costs seconds)
    model.compile("sgd", likelihoods.DistributionNLL(model.layers[-1]), run_eagerly=True)  # again, no metric
    assert np.isfinite(model.fit(x, y, epochs=1, verbose=0).history["loss"][0])
    clone.compile("sgd", likelihoods.DistributionNLL(clone.layers[-1]), run_eagerly=True)
    assert np.isfinite(clone.evaluate(x, y, verbose=0, return_dict=True)["loss"])
    # A correct metric after the refused one: the RMSE of the predictive mean, as computed here.
    head = model.layers[-1]
    model.compile("sgd", likelihoods.DistributionNLL(head), run_eagerly=True,
                  metrics=[tfbnn.metrics.HeadMean(keras.metrics.RootMeanSquaredError(), head)])
    rmse = model.evaluate(x, y, verbose=0, return_dict=True)["root_mean_squared_error"]
    mean = model(x).numpy()[:, :1]
    np.testing.assert_allclose(rmse, np.sqrt(np.mean((mean - y) ** 2)), rtol=1e-5)


def test_the_metric_check_walks_no_stack_and_reads_no_private_compile_state():
    source = open(likelihoods.__file__).read()
    for private in ("inspect", "_getframe", "f_back", "_compile_metrics", "_user_metrics"):
        assert private not in source


# -- bad input --------------------------------------------------------------------------------------


def test_distribution_lambda_head_names_a_bad_task_first():
    with pytest.raises(ValueError, match=r"Expected `task` in \('regression', 'classification'\). Received: task='bogus'"):
        likelihoods.DistributionLambdaHead(lambda t: t, task="bogus")


def test_pinball_loss_refuses_mismatched_shapes_and_non_finite_values():
    loss = likelihoods.PinballLoss((0.1, 0.9))
    pred = np.zeros((4, 2), "float32")
    with pytest.raises(ValueError, match=r"Expected predictions \(batch, 2\).*Received: y_true.shape=\(4, 2\)"):
        loss(np.zeros((4, 2)), pred)
    with pytest.raises(ValueError, match=r"Expected predictions \(batch, 2\).*y_pred.shape=\(4, 3\)"):
        loss(np.zeros(4), np.zeros((4, 3), "float32"))
    with pytest.raises(ValueError, match=r"as many targets as predictions. Received: y_true.shape=\(3,\)"):
        loss(np.zeros(3), pred)
    with pytest.raises(ValueError, match=r"Expected finite targets and predictions.*Received: 1 non-finite targets"):
        loss(np.array([np.nan, 0.0, 0.0, 0.0]), pred)
    # (B, 1) targets are (B,) targets: 0.9 * 1 + 0.1 * 2 per example
    np.testing.assert_allclose(float(loss(np.zeros((2, 1)), np.array([[1.0, 2.0]] * 2, "float32"))), 1.1, rtol=1e-6)
    traced = tf.function(lambda y, p: loss(y, p), input_signature=[tf.TensorSpec((None,)), tf.TensorSpec((None, 2))])
    with pytest.raises(tf.errors.InvalidArgumentError, match="as many targets as predictions"):
        traced(np.zeros(3, "float32"), pred)


def test_quantile_head_takes_an_array_of_levels():
    head = likelihoods.QuantileHead(quantiles=np.array([0.1, 0.9]))
    assert head.quantiles == (0.1, 0.9) and head.get_config()["quantiles"] == [0.1, 0.9]
    assert likelihoods.PinballLoss(np.array([0.2, 0.8], "float32")).quantiles == pytest.approx((0.2, 0.8))
    with pytest.raises(ValueError, match=r"Received: quantiles=array"):
        likelihoods.QuantileHead(quantiles=np.array([[0.1, 0.9]]))


def test_categorical_nll_refuses_labels_out_of_range():
    head = likelihoods.CategoricalHead()
    out = head(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"Expected integer labels in \[0, 3\).*Received: y_true with labels \[5\]"):
        likelihoods.DistributionNLL(head)(np.array([0, 5]), out)
