"""The `tfbnn` command: help, one-line errors, a short training run, atomic saves."""

import os

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfbnn
from tfbnn import cli

# One small epoch without XLA compilation: a few seconds.
TINY = ["--epochs", "1", "--depth", "1", "--hidden-units", "16", "--batch-size", "128", "--num-samples", "3",
        "--verbose", "0", "--jit-compile", "off"]


def _assert_one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tfbnn: error: "), err
    assert "Traceback" not in err


def test_help_lists_the_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "usage: tfbnn" in out


def test_train_help_explains_every_option(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for option in (
        "--dataset", "--hidden-units", "--depth", "--layer", "--prior", "--pi", "--sigma1", "--sigma2",
        "--schedule", "--epochs", "--batch-size", "--learning-rate", "--num-samples", "--seed", "--output",
        "local_reparameterization", "scale_mixture", "blundell", "fashion_mnist", "saved_models",
    ):
        assert option in out, option


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["train", "--dataset", "xyz"],
        ["train", "--epochs", "0"],
        ["train", "--epochs", "two"],
        ["train", "--hidden-units", "-3"],
        ["train", "--depth", "0"],
        ["train", "--batch-size", "0"],
        ["train", "--learning-rate", "-1"],
        ["train", "--pi", "1.5"],
        ["train", "--pi", "0"],
        ["train", "--sigma1", "-1"],
        ["train", "--sigma2", "0"],
        ["train", "--num-samples", "0"],
        ["train", "--layer", "dense"],
        ["train", "--output", "model.h5"],
        ["train", "--bogus"],
    ],
)
def test_bad_options_exit_2_with_one_line(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    _assert_one_error_line(captured.err)
    assert not os.path.exists(tmp_path / "saved_models" / "bbb_mlp_digits.keras")


def test_library_value_error_is_one_line(capsys, tmp_path, monkeypatch):
    # Rejected by the library (not argparse): still one line and status 2.
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--max-examples", "10"]) == 2
    _assert_one_error_line(capsys.readouterr().err)


def test_train_writes_a_loadable_model_and_prints_the_table(tmp_path, capsys):
    path = tmp_path / "models" / "tiny.keras"
    assert cli.main(["train", *TINY, "--output", str(path)]) == 0
    out = capsys.readouterr().out
    for text in (
        "N = 1437",
        "test accuracy, MC predictive",
        "test NLL, MC predictive",
        "KL / N (per example)",
        "predictive entropy",
        "mutual information",
        "shifted (gamma=0.5)",
        str(path),
    ):
        assert text in out, text
    assert sorted(os.listdir(path.parent)) == ["tiny.keras"]  # no temporary file left
    model = keras.saving.load_model(path)
    assert len(tfbnn.bayesian_layers(model)) == 2
    probs = model.predict(np.zeros((3, 64), "float32"), verbose=0)
    assert probs.shape == (3, 10) and np.allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_train_on_mock_tfds_uses_the_loaded_count(tmp_path, capsys):
    path = tmp_path / "mnist.keras"
    with tfds.testing.mock_data(num_examples=40):
        assert cli.main(["train", *TINY, "--dataset", "mnist", "--output", str(path)]) == 0
    out = capsys.readouterr().out
    assert "N = 40 training" in out and path.exists()


def test_nan_loss_fails_cleanly_and_keeps_the_old_model(tmp_path, capsys):
    path = tmp_path / "model.keras"
    path.write_bytes(b"the previous model")
    status = cli.main(["train", *TINY, "--learning-rate", "1e30", "--output", str(path)])
    assert status == 1
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "NaN" in err or "nan" in err or "infinite" in err
    assert path.read_bytes() == b"the previous model"
    assert os.listdir(tmp_path) == ["model.keras"]


def test_failed_save_keeps_the_old_model(tmp_path, capsys, monkeypatch):
    path = tmp_path / "model.keras"
    path.write_bytes(b"the previous model")

    def failing_save(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:  # a partial write, then the failure
            f.write(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(keras.Model, "save", failing_save)
    assert cli.main(["train", *TINY, "--output", str(path)]) == 1
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "No space left on device" in err
    assert path.read_bytes() == b"the previous model"
    assert os.listdir(tmp_path) == ["model.keras"]


def test_parser_has_one_function_per_subcommand():
    assert cli.SUBCOMMANDS == [cli.add_train_parser]
    parser = cli.build_parser()
    args = parser.parse_args(["train"])
    assert args.func is cli.run_train and args.dataset == "digits"
