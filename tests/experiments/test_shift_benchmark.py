import json
import os

import numpy as np
import pytest

from tfbnn import conformal, metrics
from tfbnn.experiments import STUDIES, shift_benchmark
from tfbnn.inference import entropy

@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("shift")
    return out, shift_benchmark.run_experiment(output_dir=str(out), quick=True, verbose=False)


@pytest.mark.heavy
def test_quick_run_writes_the_table_and_it_matches_the_stored_predictions(quick):
    out, result = quick
    assert STUDIES["shift-benchmark"][0] == "tfbnn.experiments.shift_benchmark"
    for name in ("table.csv", "table.json", "table.md", "by_corruption.csv", "by_severity.csv",
                 "accuracy_vs_severity.png", "ece_vs_severity.png", "predictions.npz"):
        assert os.path.getsize(out / name) > 0
    table = {r["method"]: r for r in result["table"]}
    assert len(table) == len(shift_benchmark.DEFAULT_METHODS)
    stored = np.load(out / "predictions.npz")
    y, y_cal = stored["y_test"], stored["y_cal"]
    saved = json.loads((out / "table.json").read_text())
    corruptions = saved["settings"]["corruptions"]
    for method, label in (("bbb", "BbB"), ("laplace", "Laplace (last layer)"), ("ddu", "DDU"),
                          ("evidential", "evidential"), ("dvi", "DVI (BbB, moments)")):
        probs = stored[f"{method}|clean"].astype(np.float64)
        row = table[label]
        # independent recomputation: NumPy accuracy, NLL and a 15-bin ECE, scikit-learn's AUROC
        assert row["clean_accuracy"] == pytest.approx(np.mean(probs.argmax(1) == y), abs=1e-9)
        assert row["clean_nll"] == pytest.approx(-np.mean(np.log(np.maximum(probs[np.arange(len(y)), y], 1e-7))),
                                                 rel=1e-3)
        conf, right = probs.max(1), probs.argmax(1) == y
        bins = np.minimum((conf * 15).astype(int), 14)
        ece = sum(abs(conf[bins == b].mean() - right[bins == b].mean()) * np.mean(bins == b)
                  for b in range(15) if np.any(bins == b))
        assert row["clean_ece"] == pytest.approx(ece, abs=1e-4)
        corrupted = [stored[f"{method}|{c}/{k}"] for c in corruptions for k in range(1, 6)]
        assert row["corrupted_accuracy"] == pytest.approx(np.mean([np.mean(p.argmax(1) == y) for p in corrupted]),
                                                          abs=1e-6)
        from sklearn.metrics import roc_auc_score

        h_in, h_out = entropy(probs), entropy(stored[f"{method}|ood_classes"].astype(np.float64))
        expected = roc_auc_score(np.r_[np.zeros(len(h_in)), np.ones(len(h_out))], np.r_[h_in, h_out])
        assert row["ood_auroc_classes"] == pytest.approx(expected, abs=1e-3)
        cal = stored[f"{method}|calibration"].astype(np.float64)
        sets = conformal.ConformalClassifier(alpha=0.1, score="aps").fit(
            cal / cal.sum(1, keepdims=True), y_cal).predict(probs / probs.sum(1, keepdims=True))
        assert row["coverage_clean"] == pytest.approx(np.mean(sets[np.arange(len(y)), y]))
        # ACI over the corrupted images as one stream of growing severity: within Gibbs & Candes' bound
        stream = [stored[f"{method}|{c}/{k}"].astype(np.float64) for k in range(1, 6) for c in corruptions]
        aci = conformal.AdaptiveConformal(conformal.ConformalClassifier(alpha=0.1, score="aps").fit(
            cal / cal.sum(1, keepdims=True), y_cal), gamma=saved["settings"]["aci_gamma"])
        aci.run(np.concatenate([p / p.sum(1, keepdims=True) for p in stream]), np.tile(y, len(stream)))
        assert row["coverage_corrupted_aci"] == pytest.approx(1 - aci.errors.mean())
        assert abs(aci.errors.mean() - 0.1) <= aci.bound()
    from sklearn.metrics import roc_auc_score

    for method, label in (("sngp", "SNGP"), ("ddu", "DDU"), ("evidential", "evidential")):
        # the own score's AUROC: scikit-learn's on the stored scores
        s_in = stored[f"score|{method}|clean"]
        for kind in ("classes", "synthetic"):
            s_out = stored[f"score|{method}|ood_{kind}"]
            expected = roc_auc_score(np.r_[np.zeros(len(s_in)), np.ones(len(s_out))], np.r_[s_in, s_out])
            assert table[label][f"ood_auroc_own_{kind}"] == pytest.approx(expected, abs=1e-9)
    # evidential: p = alpha / S and u = K / S, so alpha = p K / u, each >= 1 (evidence + 1), u in (0, 1]
    u, p = stored["score|evidential|clean"], stored["evidential|clean"]
    assert np.all((u > 0) & (u <= 1)) and np.all(p * 8 / u[:, None] >= 1 - 1e-4)
    # DVI predicts the network of the bbb row (one cached training run) by moments, not by sampling
    runs = os.listdir(out / "runs")
    assert "bbb" in runs and "dvi" not in runs
    # every network trained through tfbnn.training.run, the single-pass ones too (without its figure)
    assert {"ddu", "evidential", "heteroscedastic", "sngp"} <= set(runs)
    assert "results.json" in os.listdir(out / "runs" / "ddu") and "learning_curves.png" not in os.listdir(
        out / "runs" / "ddu")
    assert not np.allclose(stored["dvi|clean"], stored["bbb|clean"], atol=1e-6)
    own = {"SNGP", "DDU", "evidential"}
    assert "own scores: SNGP: GP variance; DDU: -log feature density; evidential: u = K / S" in (
        out / "table.md").read_text()
    for r in result["table"]:
        for key, value in r.items():
            if key.startswith("ood_auroc_own") and r["method"] not in own:
                assert value is None
            elif key != "method":
                assert np.isfinite(value) and (value >= 0)
        assert 0 <= r["clean_accuracy"] <= 1 and 0 <= r["ood_auroc_synthetic"] <= 1
    assert metrics.accuracy(stored["bbb|clean"], y) == pytest.approx(table["BbB"]["clean_accuracy"])


@pytest.mark.heavy
def test_seeded_reproducibility_and_methods_independent_of_each_other(quick, tmp_path):
    """A second run of some methods alone gives their rows of the full run exactly: each method is seeded on
    its own (Laplace trains its own deterministic network here, after the same seed); DDU's own score too."""
    _, result = quick
    alone = shift_benchmark.run_experiment(output_dir=str(tmp_path / "a"), quick=True, verbose=False,
                                           methods=("laplace", "ddu"))["table"]
    assert alone == [r for r in result["table"] if r["method"] in ("Laplace (last layer)", "DDU")]


@pytest.mark.parametrize("overrides, match", [
    ({"methods": ("deterministic", "gp")}, r"Expected names from \['deterministic'.*methods=\['deterministic', 'gp'\]"),
    ({"num_inducing": 0}, "num_inducing=0"),
    ({"corruptions": ("fog",)}, "corruptions"),
    ({"in_classes": 1}, "in_classes=1"),
    ({"alpha": 1.5}, "alpha=1.5"),
    ({"dataset": "svhn"}, r"'digits', 'mnist', 'fashion_mnist', 'cifar10', 'cifar100'.*svhn"),
    ({"dataset": "cifar10", "in_classes": 10}, r"below the 10 classes of cifar10.*Received: in_classes=10"),
    ({"dataset": "cifar100", "in_classes": 100}, r"below the 100 classes of cifar100.*Received: in_classes=100"),
])
def test_bad_settings(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        shift_benchmark.run_experiment(output_dir=str(tmp_path / "x"), quick=True, verbose=False, **overrides)
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.heavy
def test_quick_run_on_mocked_rgb_cifar10(tmp_path, monkeypatch):
    """CIFAR-10 (mocked tfds) reaches every method as 32x32x3 images; the corrupted sets stay RGB, in [0, 1],
    and differ from the clean images; the table is written with a row per method."""
    import tensorflow_datasets as tfds

    from tfbnn.experiments import _shift_benchmark

    seen, captured = {}, {}
    evaluation_sets = _shift_benchmark.evaluation_sets

    def spy_sets(data, s, verbose=False):
        captured.update(evaluation_sets(data, s, verbose))
        return captured

    def fit_probe(context):  # a method that records what it is given (after deterministic: its cached run)
        seen.update(x=context.x.shape, y=context.y, classes=context.num_classes,
                    model=context.train("deterministic").model.input_shape)

        def predict(x):
            seen["predicted"] = x.shape
            return np.full((len(x), context.num_classes), 1 / context.num_classes)

        return predict

    monkeypatch.setattr(_shift_benchmark, "evaluation_sets", spy_sets)
    monkeypatch.setitem(_shift_benchmark.METHODS, "probe", _shift_benchmark.BenchmarkMethod("probe", fit_probe))
    with tfds.testing.mock_data(num_examples=40):
        result = shift_benchmark.run_experiment(
            output_dir=str(tmp_path), dataset="cifar10", quick=True, verbose=False, corruptions=("gaussian_noise",
                                                                                                 "contrast"),
            methods=("deterministic", "laplace", "probe"))
    # 40 mocked images, those of classes 0-7 in, 20% of them calibration
    assert seen["x"][1:] == (32, 32, 3) and seen["model"] == (None, 32, 32, 3) and seen["classes"] == 8
    assert seen["y"].max() < 8 and seen["predicted"][1:] == (32, 32, 3)
    clean = captured["clean"]
    assert clean.shape[1:] == (32, 32, 3) and not np.array_equal(clean[..., 0], clean[..., 2])
    assert set(captured) == {"clean", "calibration", "ood_classes", "ood_synthetic",
                             *(f"{c}/{k}" for c in ("gaussian_noise", "contrast") for k in range(1, 6))}
    for c in ("gaussian_noise", "contrast"):
        for k in range(1, 6):
            shifted = captured[f"{c}/{k}"]
            assert shifted.shape == clean.shape and 0 <= shifted.min() and shifted.max() <= 1
            assert np.abs(shifted - clean).mean() > 1e-3
    # contrast at severity 5 in NumPy, per image and channel: (x - m) 0.15 + m, m the channel's mean (CIFAR-10-C)
    mean = clean.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(captured["contrast/5"], (clean - mean) * 0.15 + mean, atol=1e-5)
    assert captured["ood_synthetic"].shape[1:] == (32, 32, 3)
    assert [r["method"] for r in result["table"]] == ["deterministic", "Laplace (last layer)", "probe"]
    assert "Shift benchmark on cifar10" in (tmp_path / "table.md").read_text()
    settings = json.loads((tmp_path / "table.json").read_text())["settings"]
    assert (settings["max_examples"], settings["max_test_examples"]) == (2000, 1000)  # a quick run's read caps
    probs = np.load(tmp_path / "predictions.npz")
    assert probs["laplace|contrast/3"].shape == (len(clean), 8)
    assert result["table"][2]["clean_accuracy"] == pytest.approx(np.mean(probs["y_test"] == 0))  # argmax of a tie: 0
