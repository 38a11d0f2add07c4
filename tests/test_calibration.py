"""Temperature scaling of the Monte Carlo predictive and shift-detection AUROC, each against an
independent computation: scipy.optimize on a NumPy NLL, NumPy formulas, sklearn's roc_auc_score."""

import keras
import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, logsumexp, softmax
from sklearn.metrics import roc_auc_score

import tfbnn
from tfbnn import calibration, evaluation, metrics


def _np_entropy(p):
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def _under_confident_samples(seed=0, num_samples=8, n=600, classes=4):
    """S disagreeing, individually soft samples around logits that generated the labels."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=2.0, size=(n, classes))
    labels = np.array([rng.choice(classes, p=row) for row in softmax(z, axis=1)])
    noisy = 0.5 * z[None] + rng.normal(scale=1.0, size=(num_samples, n, classes))
    return softmax(noisy, axis=-1), labels


def _np_nll(log_t, samples, labels, method):
    """Mean NLL of the tempered predictive, written out in NumPy (float64)."""
    t = np.exp(log_t)
    rows = np.arange(len(labels))
    log_p = np.log(np.maximum(samples, 1e-12))
    if method == "pooled":
        z = np.log(np.maximum(samples.mean(axis=0), 1e-12)) / t
        return -np.mean(log_softmax(z, axis=1)[rows, labels])
    per_sample = log_softmax(log_p / t, axis=-1)[:, rows, labels]  # (S, N)
    return -np.mean(logsumexp(per_sample, axis=0) - np.log(samples.shape[0]))


@pytest.mark.parametrize("method", ["pooled", "samples"])
def test_fitted_temperature_is_scipys_minimum_of_the_numpy_nll(method):
    samples, labels = _under_confident_samples()
    prediction = tfbnn.inference.summarize_classification(samples)
    ts = tfbnn.TemperatureScaling(method=method).fit_prediction(prediction, labels)
    ref = minimize_scalar(_np_nll, bounds=(-4, 4), method="bounded", args=(samples, labels, method),
                          options={"xatol": 1e-10})
    assert ts.fitted and ts.temperature == pytest.approx(np.exp(ref.x), rel=1e-4)
    assert ts.temperature < 1  # the predictive is under-confident: T sharpens it
    tempered = ts.transform_prediction(prediction)
    nll_after = metrics.negative_log_likelihood(tempered.mean_probs, labels)
    assert nll_after == pytest.approx(ref.fun, rel=1e-4)
    assert nll_after < _np_nll(0.0, samples, labels, method) - 0.01
    changed = np.mean(tempered.predicted_class != prediction.predicted_class)
    if method == "pooled":
        assert changed == 0  # softmax(log p_bar / T) keeps the argmax
    else:
        assert 0 < changed < 0.1  # a mixture of tempered samples can change it (documented)
    # An (S, N, C) array is the same prediction.
    assert tfbnn.TemperatureScaling(method=method).fit_prediction(samples, labels).temperature == \
        pytest.approx(ts.temperature, rel=1e-6)


def test_pooled_scaling_is_softmax_of_the_log_predictive_over_t_with_the_split_in_proportion():
    samples, _ = _under_confident_samples(n=50)
    prediction = tfbnn.inference.summarize_classification(samples)
    t = 0.6
    out = calibration.scale_prediction(prediction, t)
    p_bar = samples.mean(axis=0)
    expected = softmax(np.log(p_bar) / t, axis=1)
    np.testing.assert_allclose(out.mean_probs, expected, rtol=1e-5)
    total = _np_entropy(expected)
    share = (_np_entropy(p_bar) - _np_entropy(samples).mean(axis=0)) / _np_entropy(p_bar)
    np.testing.assert_allclose(out.predictive_entropy, total, rtol=1e-5)
    np.testing.assert_allclose(out.mutual_information, share * total, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(out.expected_entropy, (1 - share) * total, rtol=1e-4, atol=1e-7)
    assert out.samples is None and out.num_samples == samples.shape[0]
    # T = 1 changes nothing.
    same = calibration.scale_prediction(prediction, 1.0)
    np.testing.assert_allclose(same.mean_probs, prediction.mean_probs, atol=1e-6)
    np.testing.assert_allclose(same.mutual_information, prediction.mutual_information, atol=1e-6)


def test_samples_scaling_averages_the_tempered_samples_with_the_exact_split():
    samples, _ = _under_confident_samples(n=50)
    prediction = tfbnn.inference.summarize_classification(samples)
    out = calibration.scale_prediction(prediction, 0.5, method="samples")
    tempered = softmax(np.log(samples) / 0.5, axis=-1)
    np.testing.assert_allclose(out.mean_probs, tempered.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(out.expected_entropy, _np_entropy(tempered).mean(axis=0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.mutual_information,
                               _np_entropy(tempered.mean(axis=0)) - _np_entropy(tempered).mean(axis=0),
                               rtol=1e-4, atol=1e-6)


def test_temperature_scaling_of_a_prediction_errors():
    samples, labels = _under_confident_samples(n=10)
    prediction = tfbnn.inference.summarize_classification(samples, keep_samples=False)
    with pytest.raises(ValueError, match="method='samples'.*return_samples=True"):
        calibration.scale_prediction(prediction, 0.5, method="samples")
    with pytest.raises(ValueError, match="method='cold'"):
        tfbnn.TemperatureScaling(method="cold")
    with pytest.raises(ValueError, match="temperature=0"):
        calibration.scale_prediction(prediction, 0)
    with pytest.raises(ValueError, match=r"prediction.shape=\(10, 4\)"):
        calibration.scale_prediction(samples[0], 1.0)
    with pytest.raises(ValueError, match=r"labels.shape=\(3,\)"):
        tfbnn.TemperatureScaling().fit_prediction(prediction, labels[:3])
    ts = tfbnn.TemperatureScaling(0.5, method="samples")
    assert tfbnn.TemperatureScaling.from_config(ts.get_config()).method == "samples"


def test_a_fit_without_a_finite_minimum_stops_at_the_bound_with_a_warning():
    wrong = np.array([[5.0, 0.0], [0.0, 5.0]] * 4)  # confidently wrong: the NLL falls all the way to T = inf
    with pytest.warns(UserWarning, match="no better than uniform"):
        ts = tfbnn.TemperatureScaling().fit(wrong, [1, 0] * 4)
    assert ts.temperature == pytest.approx(calibration.MAX_TEMPERATURE)


def test_auroc_is_sklearns_roc_auc_with_ties():
    rng = np.random.default_rng(3)
    for n_in, n_out, levels in ((50, 30, 5), (7, 200, 3), (1, 1, 2), (300, 300, 1000)):
        clean = rng.integers(0, levels, n_in).astype(float)
        shifted = rng.integers(0, levels + 2, n_out).astype(float)
        expected = roc_auc_score(np.r_[np.zeros(n_in), np.ones(n_out)], np.r_[clean, shifted]) \
            if levels > 1 or n_in > 1 else 0.5
        assert metrics.auroc(clean, shifted) == pytest.approx(expected, abs=1e-12)
    assert metrics.auroc(np.zeros(10), np.zeros(4)) == 0.5  # a score blind to the shift
    assert metrics.auroc([1.0, 2.0], [3.0]) == 1.0 and metrics.auroc([3.0], [1.0, 2.0]) == 0.0
    with pytest.raises(ValueError, match=r"in_scores.shape=\(0,\)"):
        metrics.auroc([], [1.0])
    with pytest.raises(ValueError, match="out_scores"):
        metrics.auroc([1.0], [np.nan])


def _models():
    bayes = keras.Sequential([keras.Input((6,)), tfbnn.DenseFlipout(8, activation="relu", seed=1),
                              tfbnn.DenseLocalReparameterization(3, activation="softmax", seed=2)])
    det = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(3, activation="softmax")])
    return bayes, det


def test_evaluate_classifier_reports_shift_detection_and_the_tempered_predictive():
    x = np.random.default_rng(0).normal(size=(40, 6)).astype("float32")
    y = np.arange(40) % 3
    bayes, det = _models()
    res = evaluation.evaluate_classifier(bayes, x, y, num_samples=6, sweep_levels=(), temperature=0.7)
    numbers, labels = res.numbers, np.r_[np.zeros(40), np.ones(40)]
    for key, field in (("auroc_entropy", "predictive_entropy"), ("auroc_epistemic", "mutual_information")):
        scores = np.r_[getattr(res.clean, field), getattr(res.shifted, field)]
        assert numbers["shift_detection"][key] == pytest.approx(roc_auc_score(labels, scores))
    scaled = numbers["temperature_scaled"]
    assert scaled["temperature"] == 0.7 and scaled["method"] == "pooled"
    expected = softmax(np.log(np.maximum(res.clean.mean_probs.astype(np.float64), 1e-12)) / 0.7, axis=1)
    assert scaled["clean"]["nll"] == pytest.approx(-np.mean(np.log(expected[np.arange(40), y])), rel=1e-4)
    assert scaled["clean"]["accuracy"] == numbers["clean"]["accuracy"]
    # A deterministic model has no epistemic uncertainty: exactly 0, so its AUROC is chance.
    det_numbers = evaluation.evaluate_classifier(det, x, y, num_samples=4, sweep_levels=()).numbers
    assert det_numbers["clean"]["epistemic"] == 0.0 and det_numbers["shift_detection"]["auroc_epistemic"] == 0.5
