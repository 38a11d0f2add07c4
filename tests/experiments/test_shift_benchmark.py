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
])
def test_bad_settings(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        shift_benchmark.run_experiment(output_dir=str(tmp_path / "x"), quick=True, verbose=False, **overrides)
    assert not os.path.exists(tmp_path / "x")
