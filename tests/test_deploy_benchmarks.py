"""benchmarks/quantization.py and benchmarks/serving_latency.py compute their numbers (not timed here)."""

import os
import sys

import keras
import numpy as np
import pytest

import tfbnn

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import quantization  # noqa: E402
import serving_latency  # noqa: E402

sys.path.pop(0)


def test_scores_are_accuracy_nll_and_ece_of_the_probabilities():
    probs = np.array([[0.9, 0.1], [0.4, 0.6], [0.7, 0.3], [0.2, 0.8]], "float32")
    labels = np.array([0, 0, 0, 1])
    got = quantization.scores(probs, labels)
    assert got["accuracy"] == pytest.approx(0.75)
    assert got["nll"] == pytest.approx(-np.mean(np.log([0.9, 0.4, 0.7, 0.8])), rel=1e-5)
    # 15 equal bins of the confidence: 0.9, 0.6, 0.7 and 0.8 each alone in a bin.
    conf, correct = np.array([0.9, 0.6, 0.7, 0.8]), np.array([1, 0, 1, 1])
    assert got["ece"] == pytest.approx(np.mean(np.abs(conf - correct)), rel=1e-5)


@pytest.mark.heavy
def test_quantization_rows_are_measured(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((40,)),
                              tfbnn.DenseLocalReparameterization(64, activation="relu", kl_weight=1e-3, seed=1),
                              tfbnn.DenseLocalReparameterization(3, activation="softmax", kl_weight=1e-3, seed=2)])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 40)).astype("float32"), rng.integers(0, 3, 30)
    rows = quantization.measure(model, x, y, str(tmp_path), num_samples=20)
    assert [(r["format"], r["weights"]) for r in rows] == [
        ("tflite", "float32"), ("tflite", "float32 (another draw)"), ("tflite", "float16"), ("tflite", "int8"),
        ("onnx", "float32")]
    sizes = {r["weights"]: r["bytes"] for r in rows if r["format"] == "tflite"}
    assert sizes["float16"] < sizes["float32"] and sizes["int8"] < sizes["float32"]  # the 40 x 64 kernel shrinks
    with tfbnn.posterior_mean(model):
        mean_probs = model(x).numpy()
    for r in rows:
        assert np.isfinite([r[k] for k in ("accuracy", "nll", "ece", "epistemic")]).all() and r["epistemic"] > 0
        if r["weights"].startswith("float32"):  # the posterior-mean endpoint is the model's posterior mean
            assert r["mean_accuracy"] == pytest.approx(float(np.mean(mean_probs.argmax(-1) == y)))
            assert r["mean_nll"] == pytest.approx(-np.mean(np.log(mean_probs[np.arange(30), y])), rel=1e-4)
    assert "| tflite | int8 |" in quantization.table(rows, 20)


def test_latency_table_marks_the_goal():
    rows = [{"model": "m", "format": f, "T": t, "batch": b, "p50_ms": p, "p99_ms": 2 * p, "load_s": 1.0}
            for f, p in (("tflite", 1.0), ("onnx", 40.0)) for t in (10, 30) for b in (1, 32)]
    lines = serving_latency.table(rows, 1.0, 2.0).splitlines()
    assert "| m | tflite | 30 | 1.0 | 1.00 / **2.00** | 1.00 / 2.00 |" in lines
    assert "| m | onnx | 30 | 1.0 | 40.00 / 80.00 | 40.00 / 80.00 |" in lines  # p99 over the goal: not bold
    assert len([line for line in lines if line.startswith("| m |")]) == 4
