"""tfbnn.conformal: the conformal quantile by hand, coverage over random splits against its bounds.

Split conformal guarantees ``1 - alpha <= E[coverage] <= 1 - alpha + 1 / (n + 1)`` over random
calibration / test splits of exchangeable data, for any predictive. Each coverage test averages
R random splits of one pool (a split of an exchangeable pool is exchangeable) and allows four
standard deviations of that average: a conformal quantile one order statistic too low (the
naive empirical quantile) fails it.
"""

import math

import numpy as np
import pytest

from tfbnn import conformal
from tfbnn.inference import ClassificationPrediction, RegressionPrediction

R = 300  # random splits per coverage check


def _margin(alpha, n, m):
    """Four standard deviations of the mean coverage over R splits (the split's coverage is
    Beta-binomial: variance about alpha (1 - alpha) (1 / (n + 2) + 1 / m))."""
    return 4 * math.sqrt(alpha * (1 - alpha) * (1 / (n + 2) + 1 / m) / R)


def _splits(n_pool, n_cal, seed):
    rng = np.random.default_rng(seed)
    for _ in range(R):
        order = rng.permutation(n_pool)
        yield order[:n_cal], order[n_cal:]


def _assert_valid(coverages, alpha, n, m):
    mean, margin = float(np.mean(coverages)), _margin(alpha, n, m)
    assert 1 - alpha - margin <= mean <= 1 - alpha + 1 / (n + 1) + margin, (mean, 1 - alpha, margin)


@pytest.mark.parametrize("n,alpha", [(5, 0.4), (19, 0.1), (99, 0.05), (200, 0.1), (9, 0.1), (8, 0.1)])
def test_the_quantile_is_the_kth_order_statistic(n, alpha):
    scores = np.random.default_rng(n).normal(size=n)
    k = math.ceil((n + 1) * (1 - alpha))
    expected = np.inf if k > n else np.sort(scores)[k - 1]
    assert conformal.conformal_quantile(scores, alpha) == expected


def _heteroscedastic(n, seed=0):
    """y = sin(3x) + noise whose scale grows with |x|; the 'model' misses the sine's amplitude."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=n)
    sigma = 0.1 + 0.5 * np.abs(x)
    y = np.sin(3 * x) + rng.normal(scale=sigma)
    return 0.7 * np.sin(3 * x), 0.8 * sigma + 0.05, y  # a biased mean, a misjudged spread


@pytest.mark.parametrize("score", conformal.REGRESSION_SCORES)
def test_regression_intervals_cover_at_least_one_minus_alpha_over_random_splits(score):
    mu, sigma, y = _heteroscedastic(600)
    alpha, n = 0.1, 100
    coverages, widths = [], []
    for cal, test in _splits(len(y), n, seed=1):
        cp = conformal.SplitConformalRegressor(alpha, score=score).fit(mu[cal], y[cal], std=sigma[cal])
        lower, upper = cp.predict(mu[test], std=sigma[test])
        coverages.append(conformal.coverage(y[test], lower, upper))
        widths.append(np.mean(upper - lower))
    _assert_valid(coverages, alpha, n, len(y) - n)
    assert 0 < np.mean(widths) < 4


def test_the_normalized_score_adapts_the_width_and_the_naive_quantile_undercovers():
    mu, sigma, y = _heteroscedastic(600)
    cal, test = np.arange(300), np.arange(300, 600)
    cp = conformal.SplitConformalRegressor(0.1, "normalized").fit(mu[cal], y[cal], std=sigma[cal])
    lower, upper = cp.predict(mu[test], std=sigma[test])
    wide, narrow = sigma[test] > np.median(sigma), sigma[test] <= np.median(sigma)
    assert np.mean((upper - lower)[wide]) > 2 * np.mean((upper - lower)[narrow])
    # The check has power: the empirical quantile s_(ceil(n (1 - alpha))), one order statistic short
    # of the conformal one at n = 20 (the 18th against the 19th), covers 18/21 = 0.857 on average,
    # below 1 - alpha by more than the margin (0.015).
    alpha, n, naive = 0.1, 20, []
    for c, t in _splits(len(y), n, seed=2):
        q = np.sort(np.abs(y[c] - mu[c]))[math.ceil(n * (1 - alpha)) - 1]
        naive.append(np.mean(np.abs(y[t] - mu[t]) <= q))
    with pytest.raises(AssertionError):
        _assert_valid(naive, alpha, n, len(y) - n)


def test_conformalized_quantile_regression_covers_over_random_splits():
    mu, sigma, y = _heteroscedastic(600, seed=3)
    lo, hi = mu - 0.5 * sigma, mu + 0.5 * sigma  # a band far too narrow: CQR widens it
    alpha, n = 0.2, 80
    coverages = []
    for cal, test in _splits(len(y), n, seed=4):
        cqr = conformal.ConformalizedQuantileRegressor(alpha).fit(lo[cal], hi[cal], y[cal])
        coverages.append(conformal.coverage(y[test], *cqr.predict(lo[test], hi[test])))
    _assert_valid(coverages, alpha, n, len(y) - n)
    assert cqr.quantile > 0


def _overconfident_classifier(n, classes=10, seed=5):
    """Labels from softmax(z); the 'model' reports softmax(3 z): overconfident."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=1.5, size=(n, classes))
    true = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    labels = np.array([rng.choice(classes, p=p) for p in true])
    model = np.exp(3 * z) / np.exp(3 * z).sum(1, keepdims=True)
    return model, labels


@pytest.mark.parametrize("score", conformal.CLASSIFICATION_SCORES)
def test_classification_sets_cover_at_least_one_minus_alpha_over_random_splits(score):
    probs, labels = _overconfident_classifier(700)
    alpha, n = 0.1, 150
    coverages, sizes = [], []
    for cal, test in _splits(len(labels), n, seed=6):
        cc = conformal.ConformalClassifier(alpha, score=score, lam=0.05, k_reg=2).fit(probs[cal], labels[cal])
        sets = cc.predict(probs[test])
        coverages.append(conformal.coverage(labels[test], sets))
        sizes.append(conformal.set_sizes(sets).mean())
    _assert_valid(coverages, alpha, n, len(labels) - n)
    # The top-1 prediction alone covers far less: the sets had to grow.
    assert np.mean(probs.argmax(1) == labels) < 0.8 and 1 < np.mean(sizes) < 10


def test_aps_scores_are_the_mass_ranked_at_or_above_and_raps_adds_its_penalty():
    p = np.array([[0.5, 0.1, 0.4]])
    aps = conformal.ConformalClassifier(score="aps").scores(p)
    np.testing.assert_allclose(aps, [[0.5, 1.0, 0.9]])
    raps = conformal.ConformalClassifier(score="raps", lam=0.2, k_reg=1).scores(p)
    np.testing.assert_allclose(raps, [[0.5, 1.0 + 0.4, 0.9 + 0.2]])
    np.testing.assert_allclose(conformal.ConformalClassifier(score="lac").scores(p), 1 - p)


def test_tfbnn_predictions_plug_in():
    mu, sigma, y = _heteroscedastic(200)
    res = RegressionPrediction(mean=mu[:, None], epistemic_std=sigma[:, None], num_samples=10)
    a = conformal.SplitConformalRegressor(0.1, "normalized").fit(res, y)
    b = conformal.SplitConformalRegressor(0.1, "normalized").fit(mu, y, std=sigma)
    assert a.quantile == b.quantile
    probs, labels = _overconfident_classifier(100)
    cls = ClassificationPrediction(mean_probs=probs, predictive_entropy=None, expected_entropy=None,
                                   mutual_information=None)
    assert conformal.ConformalClassifier(0.1).fit(cls, labels).quantile == \
        conformal.ConformalClassifier(0.1).fit(probs, labels).quantile


@pytest.mark.parametrize("make,match", [
    (lambda: conformal.SplitConformalRegressor(alpha=1.0), r"Expected `alpha` to be a miscoverage level in \(0, 1\)"),
    (lambda: conformal.SplitConformalRegressor(score="cqr"), r"Expected `score` in .*score='cqr'"),
    (lambda: conformal.SplitConformalRegressor(0.1, "normalized").fit([0.0, 1.0], [0.0, 1.0]), r"`std`.*std=None"),
    (lambda: conformal.SplitConformalRegressor().fit([0.0, 1.0], [0.0]), r"`y` of length 2"),
    (lambda: conformal.SplitConformalRegressor().fit([0.0, np.nan], [0.0, 1.0]), r"mean"),
    (lambda: conformal.SplitConformalRegressor().predict([0.0]), r"fitted"),
    (lambda: conformal.ConformalClassifier(score="top1"), r"score='top1'"),
    (lambda: conformal.ConformalClassifier().fit([[0.9, 0.3]], [0]), r"probabilities"),
    (lambda: conformal.ConformalClassifier().fit([[0.9, 0.1]], [2]), r"`labels`.*ints in \[0, 2\)"),
    (lambda: conformal.ConformalClassifier(lam=-1.0), r"`lam`"),
])
def test_bad_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_model_ending_in_a_quantile_head_covers_about_its_level_and_cqr_makes_it_valid():
    import keras

    import tfbnn

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(11)
    x = rng.uniform(-2, 2, size=(1200, 1)).astype("float32")
    y = (np.sin(3 * x[:, 0]) + rng.normal(scale=0.1 + 0.5 * np.abs(x[:, 0]))).astype("float32")
    head = tfbnn.likelihoods.QuantileHead((0.1, 0.9))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2),
                              head])
    model.compile(keras.optimizers.Adam(0.02), loss=tfbnn.likelihoods.PinballLoss(head.quantiles))
    train, pool = slice(0, 600), slice(600, None)
    # 400 full-batch steps as one epoch of the repeated training set (no per-epoch overhead)
    model.fit(np.tile(x[train], (400, 1)), np.tile(y[train], 400), batch_size=600, epochs=1, verbose=0)
    band = model.predict(x[pool], verbose=0)
    assert np.all(band[:, 1] > band[:, 0])
    raw = conformal.coverage(y[pool], band[:, 0], band[:, 1])
    assert 0.72 <= raw <= 0.88, raw  # about 1 - 0.2 (3 standard errors of 600 draws: 0.05)
    alpha, n = 0.1, 100
    cqr = conformal.ConformalizedQuantileRegressor(alpha).fit_model(model, x[pool][:n], y[pool][:n])
    direct = conformal.ConformalizedQuantileRegressor(alpha).fit(band[:n, 0], band[:n, 1], y[pool][:n])
    assert cqr.quantile == pytest.approx(direct.quantile, abs=1e-6)
    np.testing.assert_allclose(cqr.predict_model(model, x[pool][n:]), direct.predict(band[n:, 0], band[n:, 1]),
                               atol=1e-5)
    lo, hi, target = band[:, 0].astype(np.float64), band[:, 1].astype(np.float64), y[pool].astype(np.float64)
    coverages = []
    for cal, test in _splits(len(target), n, seed=12):
        split = conformal.ConformalizedQuantileRegressor(alpha).fit(lo[cal], hi[cal], target[cal])
        coverages.append(conformal.coverage(target[test], *split.predict(lo[test], hi[test])))
    _assert_valid(coverages, alpha, n, len(target) - n)
    with pytest.raises(ValueError, match=r"outputs \(n, 2\).*Received: outputs of shape \(5, 1\)"):
        conformal.ConformalizedQuantileRegressor(alpha).fit_model(
            keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]), x[:5], y[:5])
