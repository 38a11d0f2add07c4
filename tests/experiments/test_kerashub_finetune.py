"""tfbnn kerashub-finetune: the quick run's table against an independent recomputation from its stored
predictions (NumPy accuracy / NLL / ECE, scikit-learn's AUROC), seeded reproducibility, bad settings."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("keras_hub")

from sklearn.metrics import roc_auc_score  # noqa: E402

from tfbnn.experiments import STUDIES, kerashub_finetune  # noqa: E402

LABELS = {"map": "MAP (fine-tuning)", "laplace": "last-layer Laplace", "bbb_head": "BbB head",
          "laplace_lora": "Laplace-LoRA", "blob": "BLoB (variational LoRA)", "mc_dropout": "MC dropout",
          "ensemble": "ensemble of heads"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("kerashub")
    return out, kerashub_finetune.run_experiment(output_dir=str(out), quick=True, verbose=False)


def _entropy(p):
    return -np.sum(p * np.log(np.clip(p, 1e-12, None)), axis=1)


def _ece(p, y, bins=15):
    conf, right = p.max(1), p.argmax(1) == y
    index = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)  # bins ((m-1)/M, m/M]
    return sum(abs(conf[index == b].mean() - right[index == b].mean()) * np.mean(index == b)
               for b in range(bins) if np.any(index == b))


@pytest.mark.heavy
def test_quick_run_writes_the_table_and_it_matches_the_stored_predictions(quick):
    out, result = quick
    assert STUDIES["kerashub-finetune"][0] == "tfbnn.experiments.kerashub_finetune"
    for name in ("table.csv", "table.json", "table.md", "reliability.png", "predictions.npz"):
        assert os.path.getsize(out / name) > 0
    assert [(r["model"], r["method"]) for r in result["table"]] == [
        (model, LABELS[m]) for model in kerashub_finetune.MODELS for m in kerashub_finetune.DEFAULT_METHODS]
    assert json.loads((out / "table.json").read_text())["table"] == result["table"]
    stored = np.load(out / "predictions.npz")
    for row in result["table"]:
        method = next(m for m, label in LABELS.items() if label == row["method"])
        y = stored[f"{row['model']}|y_test"]
        p = stored[f"{row['model']}|{method}|test"].astype(np.float64)
        q = stored[f"{row['model']}|{method}|ood"].astype(np.float64)
        np.testing.assert_allclose(p.sum(1), 1, atol=1e-5)
        assert row["accuracy"] == pytest.approx(np.mean(p.argmax(1) == y), abs=1e-12)
        assert row["nll"] == pytest.approx(-np.mean(np.log(np.maximum(p[np.arange(len(y)), y], 1e-7))), rel=1e-4)
        assert row["ece"] == pytest.approx(_ece(p, y), abs=1e-6)
        scores = np.r_[_entropy(p), _entropy(q)]
        expected = roc_auc_score(np.r_[np.zeros(len(p)), np.ones(len(q))], scores)
        assert row["ood_auroc"] == pytest.approx(expected, abs=1e-3)
        assert row["ood"] == ("held-out digits 8-9" if row["model"] == "image" else "random-token reviews (synthetic)")
    assert stored["image|map|test"].shape[1] == 8 and stored["text|map|test"].shape[1] == 2
    # the Bayesian predictives differ from MAP's softmax (they are not a relabelled copy of it)
    for method in ("laplace", "bbb_head", "blob", "mc_dropout", "ensemble"):
        assert np.abs(stored[f"image|{method}|test"] - stored["image|map|test"]).max() > 1e-4, method


@pytest.mark.heavy
def test_seeded_reproducibility_and_methods_independent_of_each_other(quick, tmp_path):
    """One model and three methods alone give exactly their rows of the full quick run."""
    _, result = quick
    methods = ("laplace", "blob", "mc_dropout")
    alone = kerashub_finetune.run_experiment(output_dir=str(tmp_path / "a"), quick=True, verbose=False,
                                             models=("image",), methods=methods)["table"]
    assert alone == [r for r in result["table"] if r["model"] == "image" and r["method"] in
                     {LABELS[m] for m in methods}]


@pytest.mark.parametrize("overrides, match", [
    ({"methods": ("map", "sngp")}, r"Expected `methods` to be names from \['map'.*methods=\('map', 'sngp'\)"),
    ({"models": ("audio",)}, "models"),
    ({"lora_rank": 0}, "lora_rank=0"),
    ({"dropout_rate": 1.0}, "dropout_rate=1.0"),
])
def test_bad_settings(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        kerashub_finetune.run_experiment(output_dir=str(tmp_path / "x"), quick=True, verbose=False, **overrides)
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.heavy
def test_bayesian_head_kerashub_classifier_exports_its_predictive_summary(tmp_path):
    """The served ``summary`` of the ViT with a BbB head (the model benchmarks/lora_serving.py times) against
    ``tfbnn.predict`` of the same model in process, and its entropy decomposition recomputed in NumPy."""
    import tensorflow as tf

    import tfbnn
    from tfbnn.experiments import _kerashub_finetune as kh

    task = kh.build_task("image", {"num_classes": 8}, {"seed": 0, "dropout_rate": 0.1})
    model = kh.bayesian_head_task(task, num_examples=100, seed=0, init_scale=0.5)
    x = np.random.default_rng(0).random((3, 8, 8, 1), dtype=np.float32)
    served = tf.saved_model.load(tfbnn.export.export(model, str(tmp_path / "sm"), num_samples=400))
    s = {k: v.numpy().astype(np.float64) for k, v in served.summary_seeded(tf.constant(x), tf.constant(1)).items()}
    reference = tfbnn.predict(model, x, num_samples=4000)
    assert np.std(tfbnn.predict(model, x, num_samples=8, return_samples=True).samples, axis=0).max() > 1e-2
    # Monte Carlo means of 400 and 4000 draws: the standard error of a probability is below 0.5 / sqrt(400)
    np.testing.assert_allclose(s["mean_probs"], reference.mean_probs, atol=0.05)
    np.testing.assert_allclose(s["predictive_entropy"], _entropy(s["mean_probs"]), rtol=1e-4)
    np.testing.assert_allclose(s["epistemic"], s["predictive_entropy"] - s["aleatoric"], atol=1e-5)
    np.testing.assert_allclose(s["epistemic"], reference.mutual_information, atol=0.05)
    with tfbnn.posterior_mean(model):
        np.testing.assert_allclose(served.mean(tf.constant(x)), model(x), rtol=1e-5, atol=1e-6)
