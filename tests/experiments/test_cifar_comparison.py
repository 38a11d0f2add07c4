"""The CIFAR comparison (tfbnn.experiments.cifar_comparison): tiny runs offline and on mocked tfds CIFAR-10."""

import csv
import json
import os

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfbnn
from tfbnn.experiments import cifar_comparison

RUN_FILES = ("history.csv", "history.json", "learning_curves.png", "results.json", "model.keras")


def _run_folder(root, run):
    folder = os.path.join(root, run)
    for name in RUN_FILES:
        assert os.path.getsize(os.path.join(folder, name)) > 0, name
    return folder


def test_digits_run_writes_curves_table_and_model_with_the_right_n(tmp_path):
    root = str(tmp_path)
    result = cifar_comparison.run_experiment(
        "lenet5", method="bbb", dataset="digits", estimator="reparameterization", epochs=2, batch_size=32,
        max_examples=64, num_samples=2, output_dir=root, verbose=0,
    )
    assert result["run"] == "lenet5-bbb_reparameterization-digits"
    folder = _run_folder(root, result["run"])
    # N = the training examples actually used: 64 capped, minus the 10% validation hold-out.
    n = result["row"]["num_examples"]
    assert n == 64 - round(0.1 * 64)
    history = result["history"]
    assert [r["epoch"] for r in history] == [1, 2]
    for key in ("loss", "accuracy", "nll", "val_loss", "val_accuracy", "val_nll", "kl_beta", "seconds"):
        assert all(np.isfinite(r[key]) for r in history), key
    with open(os.path.join(folder, "history.csv"), newline="") as f:
        assert len(list(csv.DictReader(f))) == 2
    with open(os.path.join(folder, "results.json")) as f:
        saved = json.load(f)
    assert saved["num_examples"] == n and saved["test"]["num_samples"] == 2
    for key in ("accuracy", "nll", "ece"):
        assert np.isfinite(saved["test"][key]) and saved["test"][key] == pytest.approx(result["test"][key])
    assert 0.0 <= result["test"]["accuracy"] <= 1.0 and 0.0 <= result["test"]["ece"] <= 1.0

    # The saved model: 8x8 digits made LeNet use "same" padding; KLAnnealing left kl_weight = beta / N.
    model = keras.saving.load_model(os.path.join(folder, "model.keras"))
    assert model.input_shape == (None, 8, 8, 1) and model.get_layer("conv1").padding == "same"
    final_beta = history[-1]["kl_beta"]
    for layer in tfbnn.bayesian_layers(model):
        assert float(layer.kl_weight.numpy()) * n == pytest.approx(final_beta, rel=1e-5)

    # The comparison table gains one row per run and replaces a rerun's row.
    cifar_comparison.run_experiment("mlp_400", method="mc_dropout", dataset="digits", epochs=1, batch_size=64,
                                    num_samples=2, output_dir=root, verbose=0)
    with open(os.path.join(root, "comparison.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["run"] for r in rows) == ["lenet5-bbb_reparameterization-digits", "mlp_400-mc_dropout-digits"]
    with open(os.path.join(root, "comparison.md")) as f:
        table = f.read()
    assert "| lenet5 | bbb |" in table and "| mlp_400 | mc_dropout |" in table


@pytest.mark.heavy
def test_cifar10_run_under_mocked_tfds(tmp_path):
    with tfds.testing.mock_data(num_examples=20):
        result = cifar_comparison.run_experiment(
            "lenet5", method="mc_dropout", dataset="cifar10", epochs=1, batch_size=8, num_samples=2,
            max_test_examples=8, output_dir=str(tmp_path), verbose=0,
        )
    folder = _run_folder(str(tmp_path), "lenet5-mc_dropout-cifar10")
    assert result["row"]["num_examples"] == 18 and result["row"]["dataset"] == "cifar10"
    assert result["row"]["parameters"] == 62_006  # the original LeNet-5 at 32x32x3
    with open(os.path.join(folder, "results.json")) as f:
        assert json.load(f)["test"]["num_test"] == 8
    assert np.isfinite(result["test"]["nll"])


def test_command_line_standalone(tmp_path, capsys):
    status = cifar_comparison.main([
        "--model", "mlp_400", "--method", "ibnn", "--num-components", "2", "--epochs", "1", "--batch-size", "64",
        "--num-samples", "3", "--max-examples", "100", "--output-dir", str(tmp_path), "--verbose", "0",
    ])
    assert status == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "ECE (15 bins)" in out and "T = 4" in out  # T rounded up to a multiple of K
    _run_folder(str(tmp_path), "mlp_400-ibnn-digits")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "bbb"], "Expected --model"),
        (["--model", "xyz"], "invalid choice: 'xyz'"),
        (["--model", "transformer"], "invalid choice: 'transformer'"),  # a text model
        (["--model", "lenet5", "--method", "xyz"], "invalid choice: 'xyz'"),
        (["--model", "lenet5", "--dataset", "imagenet"], "invalid choice: 'imagenet'"),
        (["--model", "lenet5", "--dropout-rate", "1.5"], "expected a number in [0, 1)"),
        (["--model", "vgg16", "--dataset", "digits"], "vgg16 needs images of at least 32x32"),
    ],
)
def test_command_line_errors_are_one_line(argv, message, tmp_path, capsys):
    assert cifar_comparison.main(argv + ["--output-dir", str(tmp_path), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_text_models_are_not_image_models():
    with pytest.raises(ValueError, match=r"Expected --model, one of \['mlp', .*\]. Received: --model='transformer'"):
        cifar_comparison.run_experiment("transformer")
