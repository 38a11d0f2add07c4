"""The runnable studies: sparsity (offline digits, mock MNIST), 1-D regression, Transformer on mock IMDB,
their command lines and their errors. Settings are tiny: these check the plumbing, not the numbers
(tests/test_pruning.py checks principled vs random pruning)."""

import csv
import json
import os

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfbnn
from tfbnn.datasets import regression, text
from tfbnn.experiments import vd_regression, vd_sparsity, vd_transformer
from tfbnn.training.run import convert_model

TINY_SPARSITY = {"model": "mlp", "hidden_units": (16,), "pretrain_epochs": 1, "epochs": 2, "warmup_epochs": 0.5,
                 "anneal_epochs": 1.0, "sample_counts": (1, 2), "num_samples": 2, "repeats": 2, "batch_size": 128}


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.heavy
def test_sparsity_study_on_mnist_through_tfds_mock_writes_its_numbers_and_plot(tmp_path):
    with tfds.testing.mock_data(num_examples=64):
        result = vd_sparsity.run_experiment(output_dir=str(tmp_path), verbose=False, dataset="mnist", method="vd",
                                            **TINY_SPARSITY)
    assert result["dataset"]["num_examples"] == 64
    names = {os.path.basename(f) for f in result["files"]}
    assert {"study.png", "accuracy_vs_samples.csv", "sparsity_per_epoch.csv", "sparsity.csv", "threshold_sweep.csv",
            "storage.csv", "results.json", "pruned.npz", "pruned.keras", "pruning_curve.csv", "pruning_curve.json",
            "pruning_curve.png"} <= names
    assert all(os.path.getsize(f) > 0 for f in result["files"])
    summary = _csv(tmp_path / "accuracy_vs_samples.csv")
    assert [(r["variant"], r["num_samples"]) for r in summary] == [
        (v, t) for v in ("none", "principled", "random") for t in ("1", "2")]
    assert all(0.0 <= float(r["mean"]) <= 1.0 and float(r["std"]) >= 0.0 for r in summary)
    epochs = _csv(tmp_path / "sparsity_per_epoch.csv")
    assert len(epochs) == 2 and {"dense_1", "predictions", "sparsity", "kl_beta"} <= set(epochs[0])
    per_layer = _csv(tmp_path / "sparsity.csv")
    assert [r["name"] for r in per_layer] == ["dense_1", "predictions"] and per_layer[0]["num_weights"] == str(784 * 16)
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["settings"]["method"] == "vd" and set(stored["accuracy"]) == {"none", "principled", "random"}
    sweep = _csv(tmp_path / "threshold_sweep.csv")
    sparsities = [float(r["sparsity"]) for r in sweep]
    assert sparsities == sorted(sparsities, reverse=True)  # higher log-alpha threshold, fewer pruned
    sizes = [int(r["sparse_npz_bytes"]) for r in sweep]
    assert sizes == sorted(sizes)
    curve = _csv(tmp_path / "pruning_curve.csv")  # Blundell's fractions by default, global ranking
    assert [float(r["fraction"]) for r in curve] == list(tfbnn.pruning.BLUNDELL_FRACTIONS) == [0, 0.5, 0.75, 0.95, 0.98]
    weights = 784 * 16 + 16 * 10
    assert [int(r["num_pruned"]) for r in curve] == [round(f * weights) for f in tfbnn.pruning.BLUNDELL_FRACTIONS]
    assert all(0.0 <= float(r[k]) <= 1.0 for r in curve for k in ("accuracy", "random_accuracy"))
    assert stored["pruning_curve"][1]["fraction"] == 0.5
    storage = {(r["format"], r["pruned"]): int(r["bytes"]) for r in _csv(tmp_path / "storage.csv")}
    assert storage[("sparse .npz (means)", "True")] <= storage[("sparse .npz (means)", "False")]
    # The pruned model file restores into a freshly converted model of the same architecture.
    restored = tfbnn.convert.to_bayesian(vd_sparsity.build_model((784,), 10, (16,)), method="vd")
    tfbnn.pruning.restore_sparse(restored, str(tmp_path / "pruned.npz"))
    assert tfbnn.pruning.sparsity_report(restored).sparsity == pytest.approx(result["sparsity"])


def test_sparsity_study_command_line_errors(capsys):
    cases = [
        (["--method", "dropout"], "invalid choice: 'dropout'"),
        (["--method", "graves", "--threshold", "-0.83"], "threshold=-0.83"),
        (["--hidden-units", "10"], "--hidden-units applies to the model 'mlp'"),
        (["--init-scale", "-1"], "expected a positive number"),
        (["--dataset", "cifar10"], "invalid choice: 'cifar10'"),
        (["--fractions", "0.5", "1"], "expected a number in [0, 1), got '1'"),
        (["--fraction-scope", "model"], "invalid choice: 'model'"),
    ]
    for argv, message in cases:
        assert vd_sparsity.main(argv + ["--output-dir", "/tmp/tfbnn_test_unused"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    with pytest.raises(ValueError, match="Unknown settings \\['depth'\\]"):
        vd_sparsity.run_experiment(depth=3)
    with pytest.raises(ValueError, match=r"Received: fractions=\(0.5, 1.2\)"):
        vd_sparsity.run_experiment(fractions=(0.5, 1.2))
    with pytest.raises(ValueError, match="Received: fraction_scope='model'"):
        vd_sparsity.run_experiment(fraction_scope="model")
    with pytest.raises(ValueError, match="hidden_units=\\(10,\\)"):
        vd_sparsity.run_experiment(hidden_units=(10,))


def test_study_parsers_register_in_the_tfbnn_command():
    from tfbnn import cli

    parser = cli.build_parser()
    args = parser.parse_args(["vd-sparsity", "--method", "graves", "--dataset", "moons"])
    assert args.func is vd_sparsity.run and args.method == "graves" and args.dataset == "moons"
    assert parser.parse_args(["vd-regression", "--steps", "10"]).func is vd_regression.run
    assert parser.parse_args(["vd-transformer", "--dataset", "synthetic_reviews"]).func is vd_transformer.run


# -- 1-D regression --------------------------------------------------------------------------
def test_toy_regression_generator():
    ds = regression.make_toy_regression(seed=3)
    assert ds.num_examples == 40 and ds.x_train.shape == (40, 1) and ds.x_grid.shape == (281, 1)
    assert ds.x_train.min() >= 0.0 and ds.x_train.max() <= 0.5
    x = np.array([0.1, 0.25, 0.4])
    np.testing.assert_allclose(regression.toy_regression_curve(x),
                               x + 0.3 * np.sin(2 * np.pi * x) + 0.3 * np.sin(4 * np.pi * x))
    e = np.array([0.01, -0.02, 0.0])
    np.testing.assert_allclose(regression.toy_regression_curve(x, e),
                               x + 0.3 * np.sin(2 * np.pi * (x + e)) + 0.3 * np.sin(4 * np.pi * (x + e)) + e)
    noiseless = regression.make_toy_regression(noise_std=0.0, seed=3)
    np.testing.assert_allclose(noiseless.y_train[:, 0], regression.toy_regression_curve(noiseless.x_train[:, 0]),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(regression.make_toy_regression(seed=3).y_train, ds.y_train)
    with pytest.raises(ValueError, match="noise_std=-1"):
        regression.make_toy_regression(noise_std=-1)
    with pytest.raises(ValueError, match="x_range=\\(1, 0\\)"):
        regression.make_toy_regression(x_range=(1, 0))


@pytest.mark.heavy
def test_regression_study_bands(tmp_path):
    result = vd_regression.run_experiment(output_dir=str(tmp_path), verbose=False, pretrain_steps=100, steps=100,
                                          num_samples=10)
    assert [r["method"] for r in result["rows"]] == ["deterministic", "vd", "graves"]
    for row in result["rows"]:
        assert np.isfinite(row["rmse_in_range"]) and np.isfinite(row["test_nll"])
    det = result["rows"][0]
    assert det["epistemic_std_in_range"] == 0.0
    for row in result["rows"][1:]:
        assert row["epistemic_std_out_of_range"] > 0.0
    bands = _csv(tmp_path / "bands.csv")
    assert len(bands) == 281 and {"x", "truth", "vd_mean", "vd_total_std", "graves_epistemic_std"} <= set(bands[0])
    assert (tmp_path / "bands.png").stat().st_size > 0
    assert vd_regression.main(["--methods", "bayes"]) == 2


# -- Transformer -------------------------------------------------------------------------------
def test_transformer_study_converts_the_zoo_models_feed_forward_block(tmp_path):
    # The model is tfbnn.models.transformer (tests/models/test_zoo.py tests the builder); the study makes
    # only ff1 and ff2 Bayesian, by conversion.
    assert vd_transformer.build_transformer_classifier is tfbnn.models.transformer
    assert vd_transformer.TokenAndPositionEmbedding is tfbnn.models.TokenAndPositionEmbedding
    x = np.random.default_rng(0).integers(0, 50, size=(3, 120)).astype("int32")
    det = vd_transformer.build_transformer_classifier(vocab_size=50, seed=1)
    assert det.get_layer("embedding").output.shape == (None, 120, 32)
    for variant, cls in (("vd", tfbnn.layers.DenseVariationalDropout),
                         ("bbb", tfbnn.layers.DenseLocalReparameterization)):
        # the study's conversion: its recipe's method and convert_layers (ff1, ff2)
        model = convert_model(vd_transformer.make_recipe(variant, 200, seed=1), det, num_examples=100)
        assert type(model.get_layer("ff1")) is cls and type(model.get_layer("ff2")) is cls
        assert [layer.name for layer in tfbnn.bayesian_layers(model)] == ["ff1", "ff2"]
        assert model(x).shape == (3, 2)
    path = str(tmp_path / "t.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_synthetic_reviews_are_offline_and_seeded():
    ds = text.make_synthetic_reviews(num_examples=50, seed=1)
    assert ds.num_examples == 40 and ds.num_test_examples == 10 and isinstance(ds.x_train[0], str)
    assert set(np.unique(ds.y_train)) <= {0, 1}
    again = text.make_synthetic_reviews(num_examples=50, seed=1)
    assert list(again.x_train) == list(ds.x_train)


@pytest.mark.heavy
def test_transformer_study_on_imdb_through_tfds_mock(tmp_path):
    with tfds.testing.mock_data(num_examples=32):
        result = vd_transformer.run_experiment(output_dir=str(tmp_path), verbose=False, dataset="imdb",
                                               variants=("vd",), vocab_size=200, max_length=16, pretrain_epochs=0,
                                               epochs=1, batch_size=32, num_samples=2, repeats=1)
    (row,) = result["rows"]
    assert row["variant"] == "vd" and 0.0 <= row["accuracy"] <= 1.0 and np.isfinite(row["nll"])
    assert 0.0 <= row["ff_sparsity"] <= 1.0 and 0.0 <= row["accuracy_principled"] <= 1.0
    assert {os.path.basename(f) for f in result["files"]} == {"results.png", "results.csv", "results.json"}
