"""The `tfbnn` command: help, one-line errors, a short training run, atomic saves."""

import os
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfbnn
from tfbnn import cli

# One small epoch without XLA compilation: a few seconds.
TINY = ["--epochs", "1", "--depth", "1", "--hidden-units", "16", "--batch-size", "128", "--num-samples", "3",
        "--verbose", "0", "--jit-compile", "off", "--no-baseline", "--no-beta-comparison"]


def _assert_one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tfbnn: error: "), err
    assert "Traceback" not in err


def test_help_lists_the_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: tfbnn" in out
    for command in ("train", "evaluate", "export", "tune", "vd-sparsity", "vd-regression", "vd-transformer"):
        assert command in out


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
    assert cli.main(["train", "--model", "no_such_model"]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "--model=no_such_model" in err
    assert not os.path.exists(tmp_path / "saved_models")


def test_train_writes_a_loadable_model_and_prints_the_table(tmp_path, capsys):
    path = tmp_path / "models" / "tiny.keras"
    assert cli.main(["train", *TINY, "--output", str(path)]) == 0
    out = capsys.readouterr().out
    for text in (
        "N = 1221 training / 216 validation",  # the main job holds out 15% for temperature scaling
        "test metric (MC predictive)",
        "NLL",
        "ECE (15 bins)",
        "KL / N (per example)",
        "predictive entropy (total)",
        "expected entropy (aleatoric)",
        "mutual information (epistemic)",
        "shifted (gamma=0.5)",
        str(path),
    ):
        assert text in out, text
    assert sorted(os.listdir(path.parent)) == ["tiny.keras", "tiny_run"]  # no temporary file left
    assert sorted(os.listdir(path.parent / "tiny_run")) == [
        "history.csv", "history.json", "learning_curves.png", "recipe.json", "results.json"]
    model = keras.saving.load_model(path)
    assert len(tfbnn.bayesian_layers(model)) == 2
    probs = model.predict(np.zeros((3, 64), "float32"), verbose=0)
    assert probs.shape == (3, 10) and np.allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_train_on_mock_tfds_uses_the_loaded_count(tmp_path, capsys):
    path = tmp_path / "mnist.keras"
    with tfds.testing.mock_data(num_examples=40):
        assert cli.main(["train", *TINY, "--dataset", "mnist", "--output", str(path)]) == 0
    out = capsys.readouterr().out
    assert "N = 34 training / 6 validation" in out and path.exists()


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


def test_failed_save_keeps_the_old_model(tmp_path, capsys):
    path = tmp_path / "model.keras"
    path.write_bytes(b"the previous model")

    def failing_save(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:  # a partial write, then the failure
            f.write(b"partial")
        raise OSError("No space left on device")

    with mock.patch.object(keras.Model, "save", failing_save):
        assert cli.main(["train", *TINY, "--output", str(path)]) == 1
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "No space left on device" in err
    assert path.read_bytes() == b"the previous model"
    assert os.listdir(tmp_path) == ["model.keras"]


def test_parser_has_one_module_per_subcommand():
    import importlib
    import inspect

    from tfbnn.cli import train

    assert list(cli.COMMANDS)[:6] == ["train", "run", "recipes", "evaluate", "export", "tune"]
    for name, (module_name, summary) in cli.COMMANDS.items():
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.run), name
        assert module.DESCRIPTION.strip() and summary.strip() and "\n" not in summary, name
        assert inspect.signature(module.run).parameters.keys() == {"args"}, name
    parser = cli.build_parser()
    args = parser.parse_args(["train"])
    assert args.func is train.run and args.dataset == "digits" and args.baseline


def test_train_reports_beta_1_and_the_deterministic_baseline_beside_the_tempered_bbb(tmp_path, capsys):
    import json

    tiny = [a for a in TINY if a not in ("--no-baseline", "--no-beta-comparison")]
    assert cli.main(["train", *tiny, "--output", str(tmp_path / "m.keras")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("test metric (MC predictive)"))
    assert header.split()[-5:] == ["BbB", "beta=0.1", "BbB", "beta=1", "deterministic"]
    for label in ("ECE (15 bins)", "ECE, temperature-scaled", "NLL, temperature-scaled", "mean confidence"):
        row = next(line for line in lines if line.startswith(label))
        assert len(row.split()) == len(label.split()) + 3, row
    results = json.loads((tmp_path / "m_run" / "results.json").read_text())
    assert results["comparison"]["beta"] == 1.0
    for test in (results["test"], results["comparison"], results["baseline"]):
        scaled = test["temperature_scaled"]
        assert scaled["method"] == "pooled" and scaled["temperature"] > 0 and scaled["num_validation"] == 216
        assert scaled["clean"]["accuracy"] == test["accuracy"]  # pooled temperature scaling keeps the argmax
        assert 0 <= test["shift_detection"]["auroc_entropy"] <= 1
    # the deterministic baseline has no epistemic score (issue 36: "n/a", not a chance-level 0.500)
    det_row = next(line for line in lines if line.startswith("AUROC, epistemic (own score)"))
    assert det_row.split()[-1] == "n/a" and results["baseline"]["epistemic"] == 0.0
    assert results["baseline"]["shift_detection"] == {**results["baseline"]["shift_detection"],
                                                      "auroc_epistemic": None, "epistemic_score": "none"}
    assert results["test"]["shift_detection"]["epistemic_score"] == "mutual_information"
    assert "Reading the table (N = 1221 training examples)" in out and "at beta = 1 (the ELBO)" in out
    assert "tempered, 'cold' posterior" in out  # the header says beta < 1 is not the ELBO


def test_train_defaults_are_the_main_recipe_and_temperature_scaling_needs_a_hold_out(tmp_path, capsys):
    from tfbnn import training

    main = training.get_recipe("digits-bbb-mlp")
    recipe = cli.train.recipe_from_args(cli.build_parser().parse_args(["train"]))
    for field in ("beta", "validation_fraction", "temperature_scaling", "learning_rate", "epochs", "batch_size",
                  "kl_schedule", "eval_samples", "model_options", "method_options"):
        assert getattr(recipe, field) == getattr(main, field), field
    assert main.beta == 0.1 and main.temperature_scaling and main.validation_fraction == 0.15
    blundell = cli.train.recipe_from_args(cli.build_parser().parse_args(["train", "--schedule", "blundell"]))
    assert blundell.beta == 1.0  # Blundell's minibatch weights fix beta
    status = cli.main(["train", *TINY, "--validation-fraction", "0", "--output", str(tmp_path / "m.keras")])
    assert status == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "Received: --temperature-scale=True, --validation-fraction=0.0" in err and os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("trained") / "tiny.keras"
    assert cli.main(["train", *TINY, "--epochs", "3", "--output", str(path)]) == 0
    return path


def test_evaluate_writes_metrics_json_next_to_the_figures(trained, tmp_path, capsys):
    import json

    out_dir = tmp_path / "eval"
    assert cli.main(["evaluate", str(trained), "--num-samples", "5", "--output-dir", str(out_dir)]) == 0
    files = sorted(os.listdir(out_dir))
    assert files == sorted(["metrics.json", "reliability.png", "entropy_histogram.png", "epistemic_histogram.png",
                            "accuracy_coverage.png", "shift.png"])
    numbers = json.loads((out_dir / "metrics.json").read_text())
    assert numbers["num_samples"] == 5 and numbers["num_examples"] == 360
    clean, shifted = numbers["clean"], numbers["shifted"]
    for part in (clean, shifted):
        assert part["predictive_entropy"] == pytest.approx(part["aleatoric"] + part["epistemic"], abs=1e-6)
        assert 0 <= part["ece"] <= 1 and 0 <= part["accuracy"] <= 1
    assert [r["level"] for r in numbers["sweep"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    out = capsys.readouterr().out
    assert f"{clean['ece']:.4f}" in out and "accuracy-coverage area" in out


def test_evaluate_applies_or_fits_a_temperature(trained, tmp_path, capsys):
    import json

    assert cli.main(["evaluate", str(trained), "--num-samples", "4", "--temperature", "1",
                     "--output-dir", str(tmp_path / "t1")]) == 0
    numbers = json.loads((tmp_path / "t1" / "metrics.json").read_text())
    scaled = numbers["temperature_scaled"]
    assert scaled["temperature"] == 1.0
    for key in ("nll", "ece", "predictive_entropy", "epistemic"):  # T = 1: the raw predictive
        assert scaled["clean"][key] == pytest.approx(numbers["clean"][key], abs=1e-5)
    assert "temperature-scaled (temperature 1)" in capsys.readouterr().out
    assert cli.main(["evaluate", str(trained), "--num-samples", "4", "--fit-temperature",
                     "--output-dir", str(tmp_path / "fit")]) == 0
    fitted = json.loads((tmp_path / "fit" / "metrics.json").read_text())["temperature_scaled"]
    assert fitted["temperature"] != 1.0 and "shift detection (AUROC)" in capsys.readouterr().out
    assert cli.main(["evaluate", str(trained), "--fit-temperature", "--validation-fraction", "0"]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "--validation-fraction=0" in err
    assert cli.main(["evaluate", str(trained), "--fit-temperature", "--temperature", "2"]) == 2


def test_evaluate_rejects_a_model_of_another_dataset(trained, tmp_path, capsys):
    assert cli.main(["evaluate", str(trained), "--dataset", "moons", "--output-dir", str(tmp_path / "e")]) == 2
    _assert_one_error_line(capsys.readouterr().err)
    assert cli.main(["evaluate", str(tmp_path / "missing.keras")]) == 2
    _assert_one_error_line(capsys.readouterr().err)
    broken = tmp_path / "broken.keras"
    broken.write_bytes(b"not a zip")
    assert cli.main(["evaluate", str(broken)]) == 2  # a bad argument, as a missing file (issue 36; it was 1)
    _assert_one_error_line(capsys.readouterr().err)


def test_export_command_writes_a_servable_saved_model(trained, tmp_path, capsys):
    import tensorflow as tf

    out = tmp_path / "served"
    assert cli.main(["export", str(trained), "--output", str(out), "--num-samples", "4"]) == 0
    assert (out / "saved_model.pb").exists()
    served = tf.saved_model.load(str(out))
    summary = served.summary_seeded(tf.zeros((2, 64)), tf.constant(1, tf.int64))
    assert summary["mean_probs"].shape == (2, 10)
    # A second export to the same folder needs --overwrite, and the message says so in flags.
    assert cli.main(["export", str(trained), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "--overwrite" in err and "overwrite=True" not in err


@pytest.mark.heavy
def test_export_command_writes_tflite_and_checks_format_options(trained, tmp_path, capsys):
    import numpy as np
    import tensorflow as tf

    out = tmp_path / "served.tflite"
    assert cli.main(["export", str(trained), "--format", "tflite", "--quantize", "float16", "--seed", "3",
                     "--output", str(out), "--num-samples", "4"]) == 0
    assert "get_signature_runner('summary')" in capsys.readouterr().out
    runners = [tf.lite.Interpreter(str(out)).get_signature_runner("summary") for _ in range(2)]
    first, second = (runner(x=np.zeros((2, 64), "float32")) for runner in runners)
    assert first["mean_probs"].shape == (2, 10)
    np.testing.assert_array_equal(first["mean_probs"], second["mean_probs"])  # --seed: fresh interpreters replay
    for flags, named in ((["--seed", "1"], "--seed=1"), (["--format", "onnx", "--quantize", "int8"], "--quantize=int8")):
        assert cli.main(["export", str(trained), "--output", str(tmp_path / "x"), *flags]) == 2
        err = capsys.readouterr().err
        _assert_one_error_line(err)
        assert named in err
    assert not (tmp_path / "x").exists()


@pytest.mark.heavy
def test_train_under_mirrored_strategy_on_two_logical_cpus(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "mirrored.keras"
    out = subprocess.run(
        [sys.executable, "-m", "tfbnn.cli", "train", *TINY, "--strategy", "mirrored", "--cpu-devices", "2",
         "--output", str(path)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MirroredStrategy, 2 replica(s)" in out.stdout and path.exists()


def test_run_command_exit_statuses_and_interrupts(capsys):
    """The shared entry point of `tfbnn`, `python -m tfbnn.cli.tune` and the experiments: 2 and one line
    for a ValueError, the RunError's own status, 130 and the given line for Ctrl-C (re-raised without one)."""
    import argparse

    from tfbnn._internal.argtypes import run_parsed as run_command
    from tfbnn._internal.errors import RunError as CommandError

    def parser_raising(error):
        parser = argparse.ArgumentParser(prog="tfbnn")

        def func(args):
            raise error

        parser.set_defaults(func=func)
        return parser

    assert run_command(parser_raising(ValueError("Expected `x` > 0.\nReceived: x=-1")), []) == 2
    assert capsys.readouterr().err == "tfbnn: error: Expected `x` > 0. Received: x=-1\n"
    failed = CommandError("the run failed")
    assert run_command(parser_raising(failed), []) == failed.exit_status
    assert run_command(parser_raising(KeyboardInterrupt()), [], interrupted="stopped; nothing written") == 130
    assert capsys.readouterr().err.endswith("tfbnn: stopped; nothing written\n")
    with pytest.raises(KeyboardInterrupt):
        run_command(parser_raising(KeyboardInterrupt()), [])
    assert run_command(parser_raising(ValueError("unused")), ["--bad-option"]) == 2


# -- the defects a new user found (issue "One way to run a study", item 4) ----------------------


def _recipe(argv):
    from tfbnn.cli import train

    return train.recipe_from_args(cli.build_parser().parse_args(["train", *argv]))


def test_train_method_without_model_trains_that_method():
    recipe = _recipe(["--method", "mc_dropout"])
    assert (recipe.model, recipe.method, recipe.method_options) == ("mlp", "mc_dropout", {"rate": 0.1})
    assert _recipe(["--method", "mc_dropout", "--dropout-rate", "0.3"]).method_options == {"rate": 0.3}


def test_train_hidden_units_and_layer_are_honoured(tmp_path, capsys):
    recipe = _recipe(["--model", "mlp", "--hidden-units", "32", "--layer", "flipout", "--depth", "3"])
    assert recipe.model_options == {"hidden_units": (32, 32, 32)}
    assert recipe.method_options["estimator"] == "flipout"
    path = tmp_path / "m.keras"
    assert cli.main(["train", *TINY, "--model", "mlp", "--hidden-units", "32", "--layer", "flipout",
                     "--output", str(path)]) == 0
    model = keras.saving.load_model(path)
    bayesian = tfbnn.bayesian_layers(model)
    assert [type(layer).__name__ for layer in bayesian] == ["DenseFlipout", "DenseFlipout"]
    assert bayesian[0].units == 32


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--method", "mc_dropout", "--layer", "flipout"], "--layer (bbb only)"),
        (["--method", "bbb", "--dropout-rate", "0.2"], "--dropout-rate (mc_dropout only)"),
        (["--model", "lenet5", "--hidden-units", "32"], "--hidden-units (mlp only)"),
        (["--method", "deterministic", "--num-components", "3"], "--num-components (ibnn only)"),
        (["--momentum", "0.9"], "--momentum/--nesterov (--optimizer sgd only)"),
        (["--prior", "normal", "--pi", "0.5"], "--prior scale_mixture"),
    ],
)
def test_an_option_that_does_not_apply_is_an_error(argv, named, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *argv]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert named in err


def test_help_shows_defaults_equal_to_zero_one_and_false(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--seed SEED seeds the data split, initialization, shuffling and every layer's noise (default: 0)" in out
    assert "(default: 0.0)" in out and "(default: True)" in out  # --momentum, --temperature-scale
    assert "(default: 0.1; 1 with --schedule blundell, whose minibatch weights fix it)" in out  # --beta


def test_help_and_option_errors_do_not_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys, _tfbnn_command; from tfbnn.cli import main; "
            "codes = [main(['--help']), main(['train', '--help']), main(['train', '--epochs', '0']), "
            "main(['no-such-command'])]; print(codes, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[0, 0, 2, 2] False", out.stderr[-2000:]


def test_failed_run_leaves_no_output_folder(tmp_path, capsys):
    out_dir = tmp_path / "run"
    status = cli.main(["train", *TINY, "--learning-rate", "1e30", "--output", str(tmp_path / "m.keras"),
                       "--output-dir", str(out_dir)])
    assert status == 1
    assert os.listdir(tmp_path) == []


def test_evaluate_reads_a_convolutional_model_trained_on_digits(tmp_path, capsys):
    path = tmp_path / "lenet.keras"
    assert cli.main(["train", "--model", "lenet5", "--method", "deterministic", "--epochs", "1", "--verbose", "0",
                     "--num-samples", "2", "--output", str(path)]) == 0
    assert keras.saving.load_model(path).inputs[0].shape[1:] == (8, 8, 1)
    out_dir = tmp_path / "eval"
    assert cli.main(["evaluate", str(path), "--num-samples", "2", "--output-dir", str(out_dir)]) == 0
    assert (out_dir / "metrics.json").exists()


def test_evaluate_clean_and_shifted_numbers_are_rows_of_its_own_sweep(trained):
    from tfbnn import datasets, evaluation

    model = keras.saving.load_model(trained)
    ds = datasets.load("digits", seed=0)
    result = evaluation.evaluate_classifier(model, ds.x_test[:120], ds.y_test[:120], num_samples=4,
                                            shift_gamma=0.5, sweep_levels=(0.0, 0.5, 1.0), seed=3)
    rows = {row["level"]: row for row in result.sweep}
    for level, part in ((0.0, "clean"), (0.5, "shifted")):
        numbers = result.numbers[part]
        assert numbers["accuracy"] == rows[level]["accuracy"]
        assert numbers["predictive_entropy"] == pytest.approx(rows[level]["predictive_entropy"], rel=1e-6)
        assert numbers["epistemic"] == pytest.approx(rows[level]["mutual_information"], rel=1e-6)


def test_export_task_must_match_the_model_and_is_explained(trained, tmp_path, capsys):
    assert cli.main(["export", "--help"]) == 0
    assert "softmax" in capsys.readouterr().out
    assert cli.main(["export", str(trained), "--task", "regression", "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "classification" in err and "--task=regression" in err
    assert not (tmp_path / "x").exists()


def test_recipes_and_run_commands(tmp_path, capsys):
    from tfbnn import training

    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name in training.recipe_names():
        assert name in out
    assert cli.main(["recipes", "--show", "ibnn-cifar10-vgg16"]) == 0
    shown = training.Recipe.from_dict(__import__("json").loads(capsys.readouterr().out))
    assert shown == training.get_recipe("ibnn-cifar10-vgg16")
    out_dir = tmp_path / "quick"
    assert cli.main(["run", "digits-bbb-mlp", "--quick", "--verbose", "0", "--output-dir", str(out_dir)]) == 0
    written = training.load_recipe(str(out_dir / "recipe.json"))
    assert written == training.get_recipe("digits-bbb-mlp").quick()
    # The written recipe runs again as a file, here with TensorBoard logs: Keras' own and the posterior board's.
    board = tmp_path / "board"
    assert cli.main(["run", str(out_dir / "recipe.json"), "--verbose", "0", "--output-dir", str(tmp_path / "again"),
                     "--tensorboard", str(board)]) == 0
    import glob

    import tensorflow as tf

    tags = {value.tag for path in glob.glob(str(board / "posterior" / "events.*"))
            for event in tf.compat.v1.train.summary_iterator(path) for value in event.summary.value}
    assert {"kl/total", "validation/nll", "validation/reliability_diagram"} <= tags, sorted(tags)
    assert (board / "train").is_dir()
    assert cli.main(["run", "no-such-recipe"]) == 2
    _assert_one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("sigma2", ["1e-300", "1e160"])
def test_a_prior_scale_float32_cannot_hold_is_one_error_line(sigma2, tmp_path, capsys):
    """Issue 12 item 2: such a scale gave a ZeroDivisionError / OverflowError traceback."""
    status = cli.main(["train", *TINY, "--prior", "scale_mixture", "--sigma2", sigma2,
                       "--output", str(tmp_path / "m.keras")])
    assert status == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "sigma2" in err and os.listdir(tmp_path) == []


def test_library_errors_speak_of_flags_not_python_arguments(tmp_path, capsys):
    assert cli.main(["tune", "--pi", "1.5", "--output", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "--pi" in err and "`pi`" not in err and " pi=" not in err
    from tfbnn._internal import argtypes

    parser = cli.build_parser()
    assert argtypes.in_flags("Expected `num_samples` > 0. Received: num_samples=0, max_num_samples=3", parser) == \
        "Expected --num-samples > 0. Received: --num-samples=0, max_num_samples=3"


def test_tune_header_names_the_searched_model_and_space(tmp_path, capsys):
    argv = ["tune", "--search", "ibnn-random", "--max-trials", "1", "--epochs", "1", "--dataset", "moons",
            "--max-examples", "60", "--hidden-units", "4", "--depth", "1", "--output", str(tmp_path / "t")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    header = out[out.index("tfbnn tune: ibnn-random"):].split("project:")[0]
    assert "model:   iBNN MLP, 1 x 4 NodeDense units" in header and "BbB" not in header
    assert "space:   IBNNSpace over num_components, init_stddev, prior_stddev, variational_learning_rate" in header
    assert " object at 0x" not in header


# -- deep ensembles and adaptive sampling from the command line ---------------------------------------------
def test_train_ensemble_flags_describe_the_members(capsys, tmp_path, monkeypatch):
    recipe = _recipe(["--method", "ensemble", "--members", "3", "--member-method", "bbb", "--layer", "flipout"])
    assert recipe.method == "ensemble" and recipe.num_members == 3 and recipe.member_method == "bbb"
    assert recipe.method_options["estimator"] == "flipout" and recipe.method_options["prior"] == "normal"
    assert _recipe(["--method", "ensemble"]).method_options == {"members": 5, "member_method": "deterministic"}
    assert _recipe(["--method", "ensemble", "--member-method", "mc_dropout", "--dropout-rate", "0.3"]
                   ).method_options == {"members": 5, "member_method": "mc_dropout", "rate": 0.3}
    monkeypatch.chdir(tmp_path)
    for argv, named in [(["--members", "3"], "--members (ensemble only)"),
                        (["--method", "ensemble", "--layer", "flipout"], "--layer (bbb only)"),
                        (["--method", "ensemble", "--members", "0"], "--members")]:
        assert cli.main(["train", *argv]) == 2
        err = capsys.readouterr().err
        _assert_one_error_line(err)
        assert named in err


@pytest.mark.heavy
def test_train_and_evaluate_a_deep_ensemble(tmp_path, capsys):
    import json

    path = tmp_path / "ens.keras"
    assert cli.main(["train", *TINY, "--method", "ensemble", "--members", "2", "--output", str(path)]) == 0
    assert "ensemble of 2 deterministic" in capsys.readouterr().out
    model = keras.saving.load_model(path)
    assert isinstance(model, tfbnn.DeepEnsemble) and model.num_members == 2
    out_dir = tmp_path / "eval"
    assert cli.main(["evaluate", str(path), "--num-samples", "7", "--output-dir", str(out_dir)]) == 0
    numbers = json.loads((out_dir / "metrics.json").read_text())
    assert numbers["num_examples"] == 360 and numbers["clean"]["epistemic"] > 0  # the members disagree
    # Exported, it is still a classifier whose summary has the members' disagreement.
    import tensorflow as tf

    served_dir = tmp_path / "served"
    assert cli.main(["export", str(path), "--output", str(served_dir)]) == 0
    assert "(classification)" in capsys.readouterr().out
    x = np.random.default_rng(0).uniform(size=(3, 64)).astype("float32")
    served = tf.saved_model.load(str(served_dir))  # kept: its functions need its variables alive
    summary = served.summary(x)
    np.testing.assert_allclose(summary["epistemic"], tfbnn.predict(model, x, num_samples=1).mutual_information,
                               atol=1e-5)


def test_evaluate_with_adaptive_sampling(trained, tmp_path, capsys):
    import json

    out_dir = tmp_path / "auto"
    assert cli.main(["evaluate", str(trained), "--num-samples", "auto", "--tolerance", "0.02", "--max-samples", "64",
                     "--output-dir", str(out_dir)]) == 0
    assert "T = auto, tolerance 0.02" in capsys.readouterr().out
    numbers = json.loads((out_dir / "metrics.json").read_text())
    assert numbers["num_samples"] == "auto" and numbers["tolerance"] == 0.02
    for part in (numbers["clean"], numbers["shifted"]):
        assert 16 <= part["mean_samples_used"] <= 64
    assert cli.main(["evaluate", str(trained), "--num-samples", "5", "--tolerance", "0.1"]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "--tolerance applies to --num-samples='auto'" in err
    assert cli.main(["evaluate", str(trained), "--num-samples", "many"]) == 2
    _assert_one_error_line(capsys.readouterr().err)


def test_evaluate_conformalizes_on_the_validation_hold_out(trained, tmp_path, capsys):
    import json

    from tfbnn import conformal, datasets
    from tfbnn.cli import evaluate

    assert evaluate.CONFORMAL_SCORES == conformal.CLASSIFICATION_SCORES
    out_dir = tmp_path / "conformal"
    assert cli.main(["evaluate", str(trained), "--num-samples", "4", "--conformalize", "0.1", "--conformal-score",
                     "aps", "--output-dir", str(out_dir)]) == 0
    c = json.loads((out_dir / "metrics.json").read_text())["conformal"]
    held_out = datasets.load_pipeline("digits", batch_size=1024, validation_fraction=0.15, seed=0, flatten=True)
    n_val = sum(int(b[1].shape[0]) for b in held_out.validation)
    assert (c["alpha"], c["score"], c["randomized"], c["num_calibration"]) == (0.1, "aps", True, n_val)
    m = 360  # test examples; 4 standard deviations of a split's coverage around its [1 - alpha, +1 / (n + 1)] range
    margin = 4 * np.sqrt(0.1 * 0.9 * (1 / (n_val + 2) + 1 / m))
    assert 0.9 - margin <= c["clean"]["coverage"] <= 0.9 + 1 / (n_val + 1) + margin
    for part in ("clean", "shifted"):
        assert 0 <= c[part]["coverage"] <= 1 and 0 <= c[part]["mean_set_size"] <= 10  # randomized: sets may be empty
    assert 0 < c["quantile"] <= 1.0 + 1e-6  # an APS score is a probability mass
    out = capsys.readouterr().out
    assert "conformal sets (APS, randomized, alpha=0.1" in out and f"{c['clean']['mean_set_size']:.4f}" in out
    for bad in ("0", "1", "1.5", "-0.1", "x"):
        assert cli.main(["evaluate", str(trained), "--conformalize", bad]) == 2
        err = capsys.readouterr().err
        _assert_one_error_line(err)
        assert "--conformalize" in err and "(0, 1)" in err
    assert cli.main(["evaluate", str(trained), "--conformalize", "0.1", "--validation-fraction", "0"]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "--conformalize calibrates the sets on the validation hold-out. Received: --validation-fraction=0" in err


def test_the_console_script_is_the_entry_module_and_parses_before_tensorflow():
    """`tfbnn` runs `_tfbnn_command:main` (pyproject.toml), which parses before the package's core runs: `--help` loads no TensorFlow,
    while a plain `import tfbnn` loads it (saved models deserialize)."""
    import subprocess
    import sys
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"] == {"tfbnn": "_tfbnn_command:main"}
    code = ("import sys, _tfbnn_command; sys.argv = ['tfbnn', 'vd-sparsity', '--help']; status = _tfbnn_command.main(); "
            "print(status, 'tensorflow' in sys.modules, sorted(m for m in sys.modules if m.startswith('tfbnn.experiments.') and '._' not in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sparsity" in out.stdout
    *_, last = out.stdout.strip().splitlines()
    status, tf_loaded, studies = last.split(" ", 2)
    assert status == "0" and tf_loaded == "False" and studies == "['tfbnn.experiments.vd_sparsity']", last  # only the chosen study
    out = subprocess.run([sys.executable, "-c", "import sys, tfbnn; print('tensorflow' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr[-2000:]


@pytest.mark.heavy
def test_evaluate_reports_the_model_s_own_epistemic_score(tmp_path, capsys):
    """`tfbnn evaluate` reads an SNGP model's score off its GP layer: the AUROC of the GP variance of the clean
    against the shifted test digits (scikit-learn's, on the variance of the same inputs), not 0.5 from a mutual
    information that is 0; `--epistemic none` prints n/a."""
    import json

    from sklearn.metrics import roc_auc_score

    from tfbnn import datasets, sngp, training
    from tfbnn.datasets import corruptions

    keras.utils.set_random_seed(0)
    model = tfbnn.models.mlp("sngp", hidden_units=(16,), input_shape=(64,), num_inducing=32, seed=0)
    path = tmp_path / "sngp.keras"
    model.save(path)
    assert cli.main(["evaluate", str(path), "--num-samples", "2", "--max-examples", "60",
                     "--output-dir", str(tmp_path / "e")]) == 0
    out = capsys.readouterr().out
    detection = json.loads((tmp_path / "e" / "metrics.json").read_text())["shift_detection"]
    x, _ = training.arrays(datasets.load_pipeline("digits", batch_size=1024, flatten=True, seed=0,
                                                  max_test_examples=60).test)
    rng = corruptions.make_rng(0)
    levels = (0.0, 0.25, 0.5, 0.75, 1.0)  # the sweep's stream: the clean and the 0.5 inputs
    inputs = {level: corruptions.CORRUPTIONS["gaussian"](x, level, seed=rng) for level in levels}
    v = [sngp.predictive_variance(model, inputs[level]) for level in (0.0, 0.5)]
    expected = roc_auc_score(np.r_[np.zeros(len(x)), np.ones(len(x))], np.r_[v[0], v[1]])
    assert detection["epistemic_score"] == "gp_variance" and detection["auroc_epistemic"] != 0.5
    assert detection["auroc_epistemic"] == pytest.approx(expected, abs=1e-9)
    row = next(line for line in out.splitlines() if line.startswith("epistemic (GP variance)"))
    assert row.split()[-1] == f"{detection['auroc_epistemic']:.4f}"
    assert cli.main(["evaluate", str(path), "--num-samples", "2", "--max-examples", "60", "--epistemic", "none",
                     "--output-dir", str(tmp_path / "n")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("epistemic (none)"))
    assert row.split()[-1] == "n/a"
