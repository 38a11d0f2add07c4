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


def _very_overconfident_classifier(n, classes=10, seed=7):
    """A float32 'model' right 93% of the time that puts nearly all its mass on its top class (softmax(12 z)
    in float32: 1.0 exactly for a fifth of the examples), as a network trained to high accuracy does: the
    cumulative masses of its classes tie at 1 (the non-randomized APS covers 0.965 with 5.9 classes a set on
    the digits, issue 37)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=1.5, size=(n, classes))
    labels = np.where(rng.uniform(size=n) < 0.93, z.argmax(1), rng.integers(0, classes, n))
    logits = (12 * z - (12 * z).max(1, keepdims=True)).astype("float32")
    return np.exp(logits) / np.exp(logits).sum(1, keepdims=True), labels


@pytest.mark.parametrize("score", ["aps", "raps"])
def test_randomized_sets_cover_one_minus_alpha_on_both_sides_where_the_nonrandomized_rule_over_covers(score):
    probs, labels = _very_overconfident_classifier(700)
    alpha, n = 0.1, 150
    got = {True: [], False: []}
    for i, (cal, test) in enumerate(_splits(len(labels), n, seed=8)):
        for randomized in got:
            cc = conformal.ConformalClassifier(alpha, score=score, lam=0.05, k_reg=2, randomized=randomized,
                                               seed=i).fit(probs[cal], labels[cal])
            got[randomized].append(conformal.coverage(labels[test], cc.predict(probs[test])))
    _assert_valid(got[True], alpha, n, len(labels) - n)  # within [1 - alpha, 1 - alpha + 1/(n+1)] both sides
    upper = 1 - alpha + 1 / (n + 1) + _margin(alpha, n, len(labels) - n)
    assert np.mean(got[False]) > upper, (np.mean(got[False]), upper)  # ties at mass ~1: the sets swell


def test_randomized_scores_are_the_mass_ranked_above_plus_u_times_their_own():
    p = np.array([[0.5, 0.1, 0.4], [0.2, 0.3, 0.5]])
    u = np.array([0.3, 0.9])
    aps = conformal.ConformalClassifier(score="aps").scores(p, u)
    # row 0: ranks 0 > 2 > 1; row 1: ranks 2 > 1 > 0
    np.testing.assert_allclose(aps, [[0.3 * 0.5, 0.9 + 0.3 * 0.1, 0.5 + 0.3 * 0.4],
                                     [0.8 + 0.9 * 0.2, 0.5 + 0.9 * 0.3, 0.9 * 0.5]])
    raps = conformal.ConformalClassifier(score="raps", lam=0.2, k_reg=1).scores(p, u)
    np.testing.assert_allclose(raps, aps + 0.2 * np.array([[0, 2, 1], [2, 1, 0]]))
    np.testing.assert_allclose(conformal.ConformalClassifier(score="aps").scores(p, np.ones(2)),
                               conformal.ConformalClassifier(score="aps").scores(p))


def test_randomized_sets_are_seeded_and_allow_empty_false_keeps_the_top_class():
    probs, labels = _very_overconfident_classifier(400)
    make = lambda **kw: conformal.ConformalClassifier(0.1, **kw).fit(probs[:200], labels[:200])  # noqa: E731
    a, b, c = make(seed=1), make(seed=1), make(seed=2)
    assert a.quantile == b.quantile != c.quantile
    np.testing.assert_array_equal(a.predict(probs[200:]), b.predict(probs[200:]))
    np.testing.assert_array_equal(a.predict(probs[200:]), a.predict(probs[200:]))  # one predict, one draw
    # By hand: the fit's uniforms are stream (seed, 0), predict's (seed, 1).
    u_fit = np.random.default_rng([1, 0]).uniform(size=200)
    scores = conformal.ConformalClassifier(0.1).scores(probs[:200], u_fit)[np.arange(200), labels[:200]]
    assert a.quantile == conformal.conformal_quantile(scores, 0.1)
    u_test = np.random.default_rng([1, 1]).uniform(size=200)
    np.testing.assert_array_equal(a.predict(probs[200:]),
                                  conformal.ConformalClassifier(0.1).scores(probs[200:], u_test) <= a.quantile)
    empty = conformal.set_sizes(a.predict(probs[200:])) == 0
    kept = make(seed=1, allow_empty=False).predict(probs[200:])
    assert empty.any() and conformal.set_sizes(kept).min() == 1
    assert kept[np.arange(200), probs[200:].argmax(1)].all()
    np.testing.assert_array_equal(kept[~empty], a.predict(probs[200:])[~empty])


def _one_hard_class(n, classes=4, seed=9):
    """A 'model' that points at the true class 90% of the time for classes 1-3 but only 50% for class 0, with the
    same confidence everywhere (softmax of 2.5 on the class it points at, plus noise): marginal sets under-cover
    class 0 while they over-cover the others."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    right = rng.uniform(size=n) < np.where(labels == 0, 0.5, 0.9)
    shown = np.where(right, labels, (labels + rng.integers(1, classes, n)) % classes)
    logits = rng.normal(scale=0.5, size=(n, classes))
    logits[np.arange(n), shown] += 2.5
    e = np.exp(logits)
    return e / e.sum(1, keepdims=True), labels


@pytest.mark.parametrize("randomized", [True, False])
def test_class_conditional_sets_cover_every_class_where_marginal_sets_miss_one(randomized):
    probs, labels = _one_hard_class(2000)
    alpha, n = 0.1, 800
    marginal, mondrian = [], []
    for i, (cal, test) in enumerate(_splits(len(labels), n, seed=10)):
        for out, conditional in ((marginal, False), (mondrian, True)):
            cc = conformal.ConformalClassifier(alpha, "aps", randomized=randomized, seed=i,
                                               class_conditional=conditional).fit(probs[cal], labels[cal])
            sets = cc.predict(probs[test])
            y_test = labels[test]
            out.append([conformal.coverage(y_test[y_test == c], sets[y_test == c]) for c in range(4)])
    marginal, mondrian = np.array(marginal), np.array(mondrian)
    n_c, m_c = n // 4, (len(labels) - n) // 4  # about n / 4 calibration and m / 4 test examples per class
    margin = _margin(alpha, n_c, m_c)
    assert np.all(mondrian.mean(0) >= 1 - alpha - margin), mondrian.mean(0)  # every class
    assert marginal.mean(0)[0] < 1 - alpha - margin, marginal.mean(0)  # class 0 under-covered without Mondrian
    if randomized:  # and not over-covered either: within the two-sided bound per class
        assert np.all(mondrian.mean(0) <= 1 - alpha + 1 / (n_c * 0.9 + 1) + margin), mondrian.mean(0)


def test_class_and_group_quantiles_are_each_group_s_conformal_quantile():
    probs, labels = _one_hard_class(300)
    cc = conformal.ConformalClassifier(0.1, "lac", class_conditional=True).fit(probs, labels)
    true = 1 - probs[np.arange(300), labels]
    np.testing.assert_array_equal(cc.class_quantiles,
                                  [conformal.conformal_quantile(true[labels == c], 0.1) for c in range(4)])
    assert cc.quantile == conformal.conformal_quantile(true, 0.1)
    np.testing.assert_array_equal(cc.predict(probs), (1 - probs) <= cc.class_quantiles)
    # a class with too few calibration examples for alpha gets q = inf: always in the set
    one_of_class_3 = np.r_[[0] * 10, [1] * 10, [2] * 9, [3]]  # k = ceil(2 * 0.9) = 2 > 1 example
    few = conformal.ConformalClassifier(0.1, "lac", class_conditional=True).fit(probs[:30], one_of_class_3)
    assert few.class_quantiles[3] == np.inf and np.isfinite(few.class_quantiles[:3]).all()
    assert few.predict(probs)[:, 3].all()
    mu, sigma, y = _heteroscedastic(400)
    groups = np.where(np.abs(np.linspace(-2, 2, 400)) < 1, "inner", "outer")
    cp = conformal.SplitConformalRegressor(0.1, "absolute").fit(mu, y, groups=groups)
    for g in ("inner", "outer"):
        assert cp.group_quantiles[g] == conformal.conformal_quantile(np.abs(y - mu)[groups == g], 0.1)
    lower, upper = cp.predict(mu[:3], groups=["outer", "inner", "outer"])
    np.testing.assert_allclose(upper - mu[:3], [cp.group_quantiles[g] for g in ("outer", "inner", "outer")])


def test_regression_by_group_covers_each_group_where_marginal_intervals_miss_the_noisy_one():
    rng = np.random.default_rng(11)
    groups = rng.integers(0, 2, 1500)
    y = rng.normal(scale=np.where(groups == 1, 3.0, 0.5))  # group 1 is noisy; the model predicts 0 everywhere
    mu, alpha, n = np.zeros(1500), 0.1, 600
    marginal, mondrian = [], []
    for cal, test in _splits(len(y), n, seed=12):
        a = conformal.SplitConformalRegressor(alpha).fit(mu[cal], y[cal])
        b = conformal.SplitConformalRegressor(alpha).fit(mu[cal], y[cal], groups=groups[cal])
        lo_a, hi_a = a.predict(mu[test])
        lo_b, hi_b = b.predict(mu[test], groups=groups[test])
        g = groups[test]
        marginal.append([conformal.coverage(y[test][g == k], lo_a[g == k], hi_a[g == k]) for k in (0, 1)])
        mondrian.append([conformal.coverage(y[test][g == k], lo_b[g == k], hi_b[g == k]) for k in (0, 1)])
    margin = _margin(alpha, n // 2, (len(y) - n) // 2)
    for k in (0, 1):
        _assert_valid(np.array(mondrian)[:, k], alpha, int(n / 2 * 0.9), (len(y) - n) // 2)
    assert np.mean(np.array(marginal)[:, 1]) < 1 - alpha - margin  # the noisy group under-covered marginally


@pytest.mark.parametrize("call,match", [
    (lambda cp: cp.predict(np.zeros(2)), r"Expected `groups` \(the test inputs' groups\)"),
    (lambda cp: cp.predict(np.zeros(2), groups=[0, 7]), r"groups without calibration examples: \[7\]"),
    (lambda cp: cp.predict(np.zeros(2), groups=[0]), r"`groups` of shape \(2,\)"),
    (lambda cp: cp.predict(np.zeros(2), groups=[0.5, 1.0]), r"group labels \(ints or strings\)"),
    (lambda cp: conformal.SplitConformalRegressor().fit(np.zeros(3), np.ones(3)).predict(np.zeros(1), groups=[0]),
     r"Expected `groups` only when fit\(\) was given groups"),
    (lambda cp: conformal.ConformalClassifier(class_conditional="yes"), r"`class_conditional` to be True or False"),
])
def test_bad_groups_are_named(call, match):
    cp = conformal.SplitConformalRegressor(0.2).fit(np.zeros(10), np.arange(10.0), groups=np.arange(10) % 2)
    with pytest.raises(ValueError, match=match):
        call(cp)


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
    (lambda: conformal.ConformalClassifier(randomized="yes"), r"Expected `randomized` to be True or False"),
    (lambda: conformal.ConformalClassifier(allow_empty=1), r"Expected `allow_empty` to be True or False"),
    (lambda: conformal.ConformalClassifier(seed=-1), r"`seed`.*\[0, 2\^31\)"),
    (lambda: conformal.ConformalClassifier().scores([[0.9, 0.1]], u=[0.1, 0.2]), r"`u` of length 1"),
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


# -- adaptive conformal inference (Gibbs & Candes 2021) ----------------------------------------------------------


def _drifting_stream(m, seed=13):
    """Regression: calibration noise N(0, 1); a stream whose noise scale grows from 1 to 3, then drops to 0.5."""
    rng = np.random.default_rng(seed)
    scale = np.r_[np.linspace(1, 3, m // 2), np.full(m - m // 2, 0.5)]
    return rng.normal(size=300), rng.normal(scale=scale)


def _assert_within_aci_bound(aci):
    """Proposition 4.1 at every prefix T of the stream: |mean(err_1..T) - alpha| <= (max(a, 1-a) + g) / (g T)."""
    t = np.arange(1, len(aci.errors) + 1)
    gap = np.abs(np.cumsum(aci.errors) / t - aci.alpha)
    bound = (max(aci.alpha, 1 - aci.alpha) + aci.gamma) / (aci.gamma * t)
    assert np.all(gap <= bound + 1e-12), (gap - bound).max()
    assert aci.bound() == pytest.approx(bound[-1])


@pytest.mark.parametrize("gamma", [0.005, 0.05])
def test_aci_keeps_the_long_run_miscoverage_within_its_deterministic_bound_where_split_conformal_breaks(gamma):
    cal, stream = _drifting_stream(6000)
    cp = conformal.SplitConformalRegressor(0.1).fit(np.zeros(300), cal)
    aci = conformal.AdaptiveConformal(cp, gamma=gamma)
    lower, upper = aci.run(np.zeros(3000), stream[:3000])
    lower2, upper2 = aci.run(np.zeros(3000), stream[3000:])  # the stream continues across calls
    _assert_within_aci_bound(aci)
    assert abs(aci.errors.mean() - 0.1) < 0.02
    covered = np.r_[(lower <= stream[:3000]) & (stream[:3000] <= upper),
                    (lower2 <= stream[3000:]) & (stream[3000:] <= upper2)]
    np.testing.assert_array_equal(~covered, aci.errors)
    split_lower, split_upper = cp.predict(np.zeros(3000))  # split conformal misses the first half's growing noise
    assert np.mean((stream[:3000] < split_lower) | (stream[:3000] > split_upper)) > 0.25


def test_aci_is_the_recursion_written_out_by_hand():
    cal, stream = _drifting_stream(400, seed=14)
    cp = conformal.SplitConformalRegressor(0.2, "normalized").fit(np.zeros(300), cal, std=np.ones(300))
    std = np.full(400, 1.5)
    aci = conformal.AdaptiveConformal(cp, gamma=0.03)
    lower, upper = aci.run(np.zeros(400), stream, std=std)
    scores, n, a = np.sort(np.abs(cal)), 300, 0.2
    for t, y in enumerate(stream):
        assert aci.alphas[t] == pytest.approx(a, abs=1e-12)
        k = math.ceil((n + 1) * (1 - a) - 1e-12)
        q = np.inf if k > n else -np.inf if k < 1 else scores[k - 1]
        assert upper[t] == q * 1.5 and lower[t] == -q * 1.5
        err = not (-q * 1.5 <= y <= q * 1.5)
        assert aci.errors[t] == err
        a += 0.03 * (0.2 - err)
    assert aci.alpha_t == pytest.approx(a)
    aci.reset()
    assert (aci.alpha_t, len(aci.errors)) == (0.2, 0)


def test_aci_sets_of_a_classifier_on_a_corrupted_stream():
    probs, labels = _overconfident_classifier(3000)
    cc = conformal.ConformalClassifier(0.1, "aps", seed=3).fit(probs[:500], labels[:500])
    rng = np.random.default_rng(15)
    flipped = np.where(rng.uniform(size=2500) < 0.3, rng.integers(0, 10, 2500), labels[500:])  # a label shift
    aci = conformal.AdaptiveConformal(cc, gamma=0.01)
    sets = aci.run(probs[500:], flipped)
    _assert_within_aci_bound(aci)
    np.testing.assert_array_equal(~sets[np.arange(2500), flipped], aci.errors)
    assert conformal.coverage(flipped, cc.predict(probs[500:])) < 0.85 and abs(aci.errors.mean() - 0.1) < 0.03


@pytest.mark.parametrize("make,match", [
    (lambda: conformal.AdaptiveConformal(conformal.SplitConformalRegressor()), r"Expected `predictor` to be a fitted"),
    (lambda: conformal.AdaptiveConformal(conformal.ConformalClassifier(class_conditional=True).fit(
        [[0.9, 0.1]] * 20, [0] * 20)), r"calibrated marginally"),
    (lambda: conformal.AdaptiveConformal(conformal.SplitConformalRegressor().fit([0.0] * 9, [1.0] * 9), gamma=0.0),
     r"`gamma`"),
    (lambda: conformal.AdaptiveConformal(conformal.ConformalClassifier().fit([[0.9, 0.1]] * 9, [0] * 9)).run(
        [[0.2, 0.3, 0.5]], [0]), r"over the 2 classes"),
])
def test_aci_bad_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- jackknife+ and CV+ (Barber et al. 2021) --------------------------------------------------------------------


def _least_squares(x_train, y_train):
    w = np.linalg.lstsq(np.c_[x_train, np.ones(len(x_train))], y_train, rcond=None)[0]
    return lambda x_new: np.c_[x_new, np.ones(len(x_new))] @ w


def _misspecified(n, seed):
    """y = sin(3x) + heavy-tailed noise, fitted by a straight line: a wrong model, so that only the method covers."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 1))
    return x, np.sin(3 * x[:, 0]) + 0.3 * rng.standard_t(3, size=n)


def test_jackknife_plus_is_the_leave_one_out_written_out_by_hand():
    x, y = _misspecified(25, seed=16)
    x_test = np.linspace(-1, 1, 7)[:, None]
    lower, upper = conformal.JackknifePlusRegressor(0.1).fit(x, y, _least_squares).predict(x_test)
    n, alpha = 25, 0.1
    lo_vals, hi_vals = [], []
    for i in range(n):
        keep = np.arange(n) != i
        f = _least_squares(x[keep], y[keep])
        r = abs(y[i] - f(x[i:i + 1])[0])
        lo_vals.append(f(x_test) - r)
        hi_vals.append(f(x_test) + r)
    lo_vals, hi_vals = np.sort(lo_vals, axis=0), np.sort(hi_vals, axis=0)
    np.testing.assert_allclose(upper, hi_vals[math.ceil((1 - alpha) * (n + 1)) - 1], rtol=1e-12)
    np.testing.assert_allclose(lower, lo_vals[math.floor(alpha * (n + 1)) - 1], rtol=1e-12)
    # CV+ with one example per fold is the jackknife+, whatever the order of the folds
    cv = conformal.JackknifePlusRegressor(0.1, folds=25, seed=3).fit(x, y, _least_squares).predict(x_test)
    np.testing.assert_allclose(cv, (lower, upper), rtol=1e-12)
    # too few examples for alpha: unbounded
    lo, hi = conformal.JackknifePlusRegressor(0.1).fit(x[:5], y[:5], _least_squares).predict(x_test)
    assert np.all(np.isinf(lo)) and np.all(np.isinf(hi))


@pytest.mark.parametrize("folds", [None, 5])
def test_jackknife_plus_and_cv_plus_cover_at_least_their_finite_sample_guarantee(folds):
    alpha, n, repeats = 0.1, 20, 400
    hits = []
    for r in range(repeats):
        x, y = _misspecified(n + 50, seed=100 + r)
        jp = conformal.JackknifePlusRegressor(alpha, folds=folds, seed=r).fit(x[:n], y[:n], _least_squares)
        hits.append(conformal.coverage(y[n:], *jp.predict(x[n:])))
    k = folds or n
    guarantee = 1 - 2 * alpha - (0 if folds is None else min(2 * (1 - 1 / k) / (n / k + 1), (1 - k / n) / (k + 1)))
    mean = float(np.mean(hits))
    assert mean >= guarantee - 4 * np.std(hits) / np.sqrt(repeats), (mean, guarantee)
    assert mean >= 1 - alpha - 0.03  # in practice near 1 - alpha (Barber et al. 2021, sec. 6)


@pytest.mark.parametrize("make,match", [
    (lambda: conformal.JackknifePlusRegressor(folds=1), r"`folds`"),
    (lambda: conformal.JackknifePlusRegressor(folds=30).fit(np.zeros((5, 1)), np.zeros(5), _least_squares),
     r"`folds` <= the 5 examples"),
    (lambda: conformal.JackknifePlusRegressor().fit(np.zeros((5, 1)), np.zeros(5), "ols"), r"`fit_predict`"),
    (lambda: conformal.JackknifePlusRegressor().fit(np.zeros((4, 1)), np.zeros(5), _least_squares),
     r"`x` with one row"),
    (lambda: conformal.JackknifePlusRegressor().predict(np.zeros((1, 1))), r"fitted"),
])
def test_jackknife_plus_bad_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()
