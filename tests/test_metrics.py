import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import calibration, metrics

# Four examples, three classes: confidences 0.7, 0.5, 0.9, 0.4; correct: yes, no, yes, no.
PROBS = np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.05, 0.05, 0.9], [0.3, 0.4, 0.3]])
LABELS = np.array([0, 1, 2, 0])


def _random_probs(n, c, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(n, c))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return probs.astype("float32"), rng.integers(0, c, size=n)


def test_plain_metrics_by_hand():
    assert metrics.accuracy(PROBS, LABELS) == 0.5
    nll = -(np.log(0.7) + np.log(0.3) + np.log(0.9) + np.log(0.3)) / 4
    assert metrics.negative_log_likelihood(PROBS, LABELS) == pytest.approx(nll, rel=1e-12)
    brier = (
        (0.3**2 + 0.2**2 + 0.1**2)
        + (0.5**2 + 0.7**2 + 0.2**2)
        + (0.05**2 + 0.05**2 + 0.1**2)
        + (0.7**2 + 0.4**2 + 0.3**2)
    ) / 4
    assert metrics.brier_score(PROBS, LABELS) == pytest.approx(brier, rel=1e-12)
    # 5 bins ((m-1)/5, m/5]: 0.4 -> bin 1, 0.5 -> bin 2, 0.7 -> bin 3, 0.9 -> bin 4.
    ece = (abs(0 - 0.4) + abs(0 - 0.5) + abs(1 - 0.7) + abs(1 - 0.9)) / 4
    assert metrics.expected_calibration_error(PROBS, LABELS, num_bins=5) == pytest.approx(ece, rel=1e-12)
    # Two bins: (0, 0.5] holds 0.4, 0.5 (acc 0, conf 0.45); (0.5, 1] holds 0.7, 0.9 (acc 1, conf 0.8).
    assert metrics.expected_calibration_error(PROBS, LABELS, num_bins=2) == pytest.approx(
        0.5 * 0.45 + 0.5 * 0.2, rel=1e-12
    )
    # One-hot labels give the same numbers; a confident mistake is clipped, not infinite.
    onehot = np.eye(3)[LABELS]
    for fn in (metrics.accuracy, metrics.negative_log_likelihood, metrics.brier_score, metrics.expected_calibration_error):
        assert fn(PROBS, onehot) == fn(PROBS, LABELS)
    assert metrics.negative_log_likelihood([[1.0, 0.0]], [1]) == pytest.approx(-np.log(1e-7))


def test_reliability_diagram():
    d = metrics.reliability_diagram(PROBS, LABELS, num_bins=5)
    np.testing.assert_array_equal(d.count, [0, 1, 1, 1, 1])
    np.testing.assert_allclose(d.confidence[1:], [0.4, 0.5, 0.7, 0.9])
    np.testing.assert_array_equal(d.accuracy[1:], [0, 0, 1, 1])
    assert np.isnan(d.confidence[0]) and np.isnan(d.accuracy[0])
    np.testing.assert_allclose(d.edges, [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert d.ece == metrics.expected_calibration_error(PROBS, LABELS, num_bins=5)
    # Right-closed bins: a confidence of exactly 0.6 is in (0.4, 0.6], not [0.6, 0.8).
    edge = metrics.reliability_diagram([[0.6, 0.4]], [0], num_bins=5)
    np.testing.assert_array_equal(edge.count, [0, 0, 1, 0, 0])
    # float32 stores 0.8 as 0.80000001: still on the edge, in (0.7, 0.8], for both versions.
    f32 = np.array([[0.8, 0.2], [0.9, 0.1]], "float32")
    assert metrics.reliability_diagram(f32, [1, 0], num_bins=10).count[7] == 1
    metric = tfbnn.ExpectedCalibrationError(num_bins=10)
    metric.update_state([1, 0], f32)
    assert float(metric.result()) == pytest.approx(metrics.expected_calibration_error(f32, [1, 0], 10), abs=1e-7)
    assert float(metric.result()) == pytest.approx((0.8 + 0.1) / 2, abs=1e-6)


def test_ece_matches_tfp():
    for num_bins in (15, 10, 7):
        probs, labels = _random_probs(600, 4, seed=num_bins)
        ours = metrics.expected_calibration_error(probs, labels, num_bins=num_bins)
        theirs = tfp.stats.expected_calibration_error(
            num_bins, logits=np.log(probs), labels_true=labels.astype("int32")
        ).numpy()
        assert ours == pytest.approx(float(theirs), abs=1e-5), num_bins


def test_selective_prediction():
    curve = metrics.selective_prediction(PROBS, LABELS)
    # Sorted by 1 - confidence: 0.9 (right), 0.7 (right), 0.5 (wrong), 0.4 (wrong).
    np.testing.assert_allclose(curve.coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(curve.accuracy, [1, 1, 2 / 3, 0.5])
    assert curve.area == pytest.approx((1 + 1 + 2 / 3 + 0.5) / 4)
    assert curve.accuracy_at(0.5) == 1.0 and curve.accuracy_at(1.0) == 0.5
    # A custom (here: adversarial) uncertainty defers the correct examples first.
    worst = metrics.selective_prediction(PROBS, LABELS, uncertainty=[3.0, 0.0, 2.0, 1.0])
    np.testing.assert_allclose(worst.accuracy, [0, 0, 1 / 3, 0.5])
    assert worst.area < curve.area
    with pytest.raises(ValueError, match=r"uncertainty.shape=\(3,\)"):
        metrics.selective_prediction(PROBS, LABELS, uncertainty=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="coverage=0"):
        curve.accuracy_at(0)


def test_keras_metrics_equal_plain_functions_over_batches():
    probs, labels = _random_probs(97, 5, seed=1)
    formats = {"sparse": lambda y: y, "column": lambda y: y[:, None], "onehot": lambda y: np.eye(5)[y]}
    pairs = [
        (tfbnn.ExpectedCalibrationError(num_bins=15), metrics.expected_calibration_error),
        (tfbnn.NegativeLogLikelihood(), metrics.negative_log_likelihood),
        (tfbnn.BrierScore(), metrics.brier_score),
    ]
    for label_format, fmt in formats.items():
        for metric, fn in pairs:
            for start in range(0, 97, 25):  # batches of 25, 25, 25, 22
                metric.update_state(fmt(labels[start : start + 25]), probs[start : start + 25])
            assert float(metric.result()) == pytest.approx(fn(probs, labels), abs=1e-6), (label_format, metric.name)
            metric.reset_state()
            assert float(metric.result()) == 0.0


def test_keras_metrics_sample_weight_and_logits():
    probs, labels = _random_probs(40, 3, seed=2)
    weights = np.random.default_rng(0).integers(0, 3, size=40)
    repeated = np.repeat(np.arange(40), weights)  # integer weights == repeated examples
    for metric, fn in [
        (tfbnn.ExpectedCalibrationError(num_bins=10), lambda p, y: metrics.expected_calibration_error(p, y, 10)),
        (tfbnn.NegativeLogLikelihood(), metrics.negative_log_likelihood),
        (tfbnn.BrierScore(), metrics.brier_score),
    ]:
        expected = fn(probs[repeated], labels[repeated])
        metric.update_state(labels, probs, sample_weight=weights.astype("float32"))
        assert float(metric.result()) == pytest.approx(expected, abs=1e-6)
        metric.reset_state()
        metric.update_state(labels[:, None], probs, sample_weight=weights[:, None].astype("float32"))
        assert float(metric.result()) == pytest.approx(expected, abs=1e-6)
        logits_metric = type(metric).from_config({**metric.get_config(), "from_logits": True})
        logits_metric.update_state(labels, np.log(probs))
        assert float(logits_metric.result()) == pytest.approx(fn(probs, labels), abs=1e-5)


def test_metrics_in_compile_evaluate_and_save():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4)).astype("float32")
    y = rng.integers(0, 3, size=50)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, activation="softmax", kernel_initializer=keras.initializers.GlorotUniform(0))]
    )
    model.compile(
        "adam",
        "sparse_categorical_crossentropy",
        metrics=[tfbnn.ExpectedCalibrationError(num_bins=15), tfbnn.NegativeLogLikelihood(), tfbnn.BrierScore()],
    )
    logs = model.evaluate(x, y, batch_size=16, return_dict=True, verbose=0)
    probs = model.predict(x, verbose=0)
    assert logs["ece"] == pytest.approx(metrics.expected_calibration_error(probs, y), abs=1e-5)
    assert logs["nll"] == pytest.approx(metrics.negative_log_likelihood(probs, y), abs=1e-5)
    assert logs["brier"] == pytest.approx(metrics.brier_score(probs, y), abs=1e-5)
    assert logs["nll"] == pytest.approx(logs["loss"], abs=1e-5)
    model.fit(x, y, epochs=1, batch_size=50, verbose=0)  # builds the optimizer state that is saved
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    again = loaded.evaluate(x, y, batch_size=16, return_dict=True, verbose=0)
    assert set(again) == set(logs)
    for metric in (tfbnn.ExpectedCalibrationError(num_bins=7, name="e7"), tfbnn.BrierScore(from_logits=True)):
        assert type(metric).from_config(metric.get_config()).get_config() == metric.get_config()


BAD_CALLS = [
    (lambda: metrics.expected_calibration_error(PROBS, LABELS, num_bins=0), "num_bins=0"),
    (lambda: metrics.reliability_diagram(PROBS, LABELS, num_bins=-3), "num_bins=-3"),
    (lambda: tfbnn.ExpectedCalibrationError(num_bins=0), "num_bins=0"),
    (lambda: tfbnn.ExpectedCalibrationError(num_bins=2.5), "num_bins=2.5"),
    (lambda: metrics.brier_score(PROBS, LABELS[:3]), r"probs.shape=\(4, 3\), labels.shape=\(3,\)"),
    (lambda: metrics.negative_log_likelihood(PROBS[:2], LABELS), r"probs.shape=\(2, 3\), labels.shape=\(4,\)"),
    (lambda: metrics.accuracy(PROBS * 0.5, LABELS), "summing to 0.5"),
    (lambda: metrics.accuracy(PROBS * 2, LABELS), "max=1.8"),
    (lambda: metrics.accuracy(PROBS, [0, 1, 2, 3]), "max=3"),
    (lambda: metrics.accuracy(PROBS[:, 0], LABELS), r"probs.shape=\(4,\)"),
]


KERAS_METRICS = [tfbnn.ExpectedCalibrationError, tfbnn.NegativeLogLikelihood, tfbnn.BrierScore]


@pytest.mark.parametrize("cls", KERAS_METRICS)
def test_keras_metrics_check_their_inputs_as_the_plain_functions_do(cls):
    nan_probs = PROBS.copy()
    nan_probs[1, 0] = np.nan
    for y_true, y_pred, kwargs, match in [
        ([5, 0, 2, 0], PROBS, {}, r"labels in \[0, 3\).*max=5"),  # was scored as a wrong answer
        ([-1, 0, 2, 0], PROBS, {}, r"labels in \[0, 3\).*min=-1"),
        ([0.5, 0, 2, 0], PROBS, {}, "integer class labels"),
        (LABELS[:3], PROBS, {}, r"same number of examples.*y_true.shape=\(3,\), y_pred.shape=\(4, 3\)"),
        (LABELS, nan_probs, {}, "probabilities in \\[0, 1\\].*NaN"),  # the metric was NaN
        (LABELS, PROBS * 2, {}, "probabilities in \\[0, 1\\].*max=1.8"),
        (LABELS, PROBS * 0.5, {}, "sum to 1.*summing to 0.5"),
        (LABELS, PROBS, {"sample_weight": np.ones(3)}, r"one `sample_weight` per example.*shape=\(3,\)"),
        (LABELS, PROBS[:, :1], {}, r"C >= 2 classes.*y_pred.shape=\(4, 1\)"),
    ]:
        metric = cls()
        with pytest.raises(ValueError, match=match):
            metric.update_state(y_true, y_pred, **kwargs)
        assert float(metric.result()) == 0.0  # nothing was accumulated
    with pytest.raises(ValueError, match="finite logits"):
        cls(from_logits=True).update_state(LABELS, nan_probs)


@pytest.mark.parametrize("cls", KERAS_METRICS)
def test_keras_metrics_check_their_inputs_in_a_compiled_step(cls):
    metric = cls()
    update = tf.function(metric.update_state, input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None, 3])])
    update(LABELS.astype("float32"), PROBS.astype("float32"))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"labels in \[0, 3\)"):
        update(np.array([0, 1, 2, 5], "float32"), PROBS.astype("float32"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="same number of examples"):
        update(LABELS[:3].astype("float32"), PROBS.astype("float32"))


@pytest.mark.parametrize("call, match", BAD_CALLS, ids=[match for _, match in BAD_CALLS])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_temperature_scaling_recovers_the_overconfidence_factor():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(scale=1.5, size=(3000, 5))
    p = np.exp(true_logits) / np.exp(true_logits).sum(1, keepdims=True)
    labels = np.array([rng.choice(5, p=row) for row in p])  # calibrated by construction
    overconfident = 3.0 * true_logits
    ts = calibration.TemperatureScaling()
    assert ts.temperature == 1.0
    ts.fit(overconfident, labels)
    assert ts.fitted and ts.temperature == pytest.approx(3.0, rel=0.1)
    calibrated = ts.transform(overconfident)
    np.testing.assert_allclose(calibrated.sum(1), 1.0)
    np.testing.assert_array_equal(calibrated.argmax(1), overconfident.argmax(1))
    before = metrics.negative_log_likelihood(np.exp(overconfident) / np.exp(overconfident).sum(1, keepdims=True), labels)
    after = metrics.negative_log_likelihood(calibrated, labels)
    assert after < before - 0.1
    assert ts.nll(overconfident, labels, ts.temperature) == pytest.approx(after, rel=1e-6)
    assert metrics.expected_calibration_error(calibrated, labels) < 0.05
    # From probabilities of a softmax model: log p are valid logits, same T.
    probs = np.exp(overconfident - overconfident.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    from_probs = calibration.TemperatureScaling().fit(calibration.logits_from_probs(probs), labels)
    assert from_probs.temperature == pytest.approx(ts.temperature, rel=1e-3)
    assert tfbnn.TemperatureScaling.from_config(ts.get_config()).temperature == ts.temperature


def test_temperature_scaling_errors():
    with pytest.raises(ValueError, match="temperature=0"):
        calibration.TemperatureScaling(temperature=0)
    with pytest.raises(ValueError, match="max_iterations=0"):
        calibration.TemperatureScaling(max_iterations=0)
    with pytest.raises(ValueError, match=r"logits.shape=\(4,\)"):
        calibration.TemperatureScaling().fit(np.zeros(4), [0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"labels.shape=\(3,\)"):
        calibration.TemperatureScaling().fit(np.zeros((4, 2)), [0, 1, 0])
    with pytest.raises(ValueError, match="min_prob"):
        calibration.logits_from_probs([[0.5, 0.5]], min_prob=0)


def test_numpy_scalars_are_accepted_as_keras_accepts_them():
    ts = calibration.TemperatureScaling(np.float32(1.5), max_iterations=np.int64(5))
    assert ts.temperature == 1.5 and ts.max_iterations == 5 and type(ts.max_iterations) is int
    np.testing.assert_allclose(ts.scale([[3.0, 0.0]]), [[2.0, 0.0]])
    assert metrics.ExpectedCalibrationError(num_bins=np.int64(10)).num_bins == 10
    assert calibration.logits_from_probs([[1.0, 0.0]], min_prob=np.float32(1e-3))[0, 1] == pytest.approx(np.log(1e-3))
    with pytest.raises(ValueError, match="temperature=True"):
        calibration.TemperatureScaling(True)



def test_interval_coverage_counts_targets_inside_the_central_gaussian_intervals():
    import scipy.stats

    rng = np.random.default_rng(0)
    mean, std = rng.normal(size=500), rng.uniform(0.5, 2.0, 500)
    y = mean + std * rng.standard_normal(500)
    got = tfbnn.metrics.interval_coverage(y, mean, std, levels=(0.5, 0.9))
    lo, hi = scipy.stats.norm.interval(0.9, loc=mean, scale=std)
    assert got[1] == np.mean((y >= lo) & (y <= hi))
    lo, hi = scipy.stats.norm.interval(0.5, loc=mean, scale=std)
    assert got[0] == np.mean((y >= lo) & (y <= hi))
    assert abs(got[1] - 0.9) < 0.05  # calibrated draws cover about the nominal fraction
    with pytest.raises(ValueError, match="std"):
        tfbnn.metrics.interval_coverage([0.0], [0.0], [0.0])
    with pytest.raises(ValueError, match="levels"):
        tfbnn.metrics.interval_coverage([0.0], [0.0], [1.0], levels=(1.5,))
