"""The iBNN experiments (tfbnn.experiments.ibnn_*): tiny end-to-end runs, the tfds path, the CLI plumbing."""

import csv
import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tfbnn import cli, datasets
from tfbnn.experiments import ibnn_lenet, ibnn_regression, ibnn_shift

# 1437 digits training examples = 3 x 479: no partial last batch, so one trace of the train step.
DIGITS_BATCH = 479


def _read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _assert_outputs(result, folder, pngs):
    names = {os.path.basename(p) for p in result["files"]}
    assert names == set(pngs) | {"results.csv", "results.json"}
    for name in names:
        assert os.path.getsize(os.path.join(folder, name)) > 0
    with open(os.path.join(folder, "results.json")) as f:
        assert json.load(f)["rows"]
    assert len(_read_csv(os.path.join(folder, "results.csv"))) == len(result["rows"])


@pytest.mark.heavy
def test_regression_experiment_end_to_end_through_its_command(tmp_path, capsys):
    status = ibnn_regression.main(["--depths", "1", "--units", "16", "--epochs", "2", "--steps-per-epoch", "2",
                                   "--samples-per-component", "2", "--bbb-samples", "4", "--output-dir", str(tmp_path)])
    assert status == 0
    rows = _read_csv(os.path.join(tmp_path, "results.csv"))
    assert [(r["method"], r["depth"]) for r in rows] == [("iBNN", "1"), ("BbB", "1")]
    for r in rows:
        assert np.isfinite(float(r["test_nll"])) and np.isfinite(float(r["r2_in_range"]))
        assert float(r["epistemic_std_in_range"]) > 0 and r["collapsed"] in ("True", "False")
    assert rows[0]["num_samples"] == "8"  # K * n = 4 * 2
    assert os.path.getsize(os.path.join(tmp_path, "bands.png")) > 10_000
    assert "Wrote" in capsys.readouterr().out


def test_regression_data_is_the_cubic_toy():
    x, y, x_test, y_test = ibnn_regression.make_data(30, 3.0, seed=0)
    assert x.shape == (30,) and x_test.shape == (200,) and np.all(np.abs(x) <= 4)
    assert 1.5 < np.std(y - x**3) < 4.5  # noise N(0, 3^2)


@pytest.mark.heavy
def test_lenet_sweep_on_the_offline_digits(tmp_path):
    result = ibnn_lenet.run_experiment(output_dir=str(tmp_path), widths=(1,), epochs=1, batch_size=DIGITS_BATCH,
                                       samples_per_component=1, verbose=False)
    _assert_outputs(result, str(tmp_path), ["model_size.png"])
    assert [(r["method"], r["width"]) for r in result["rows"]] == [("iBNN", 1), ("BbB", 1)]
    ibnn_row, bbb_row = result["rows"]
    assert ibnn_row["weights"] == bbb_row["weights"]  # the same network
    assert bbb_row["variational_parameters"] > 2 * bbb_row["weights"] - 1 > ibnn_row["variational_parameters"]
    for r in result["rows"]:
        assert 0 <= r["accuracy"] <= 1 and np.isfinite(r["nll"]) and r["num_samples"] == 4


def test_lenet_builders_and_the_tfds_path():
    import keras

    for method in ("ibnn", "bbb"):
        model = ibnn_lenet.build_lenet(method, (28, 28, 1), 10, width=1)
        assert model.output_shape == (None, 10)
        assert model(np.zeros((2, 28, 28, 1), "float32")).shape == (2, 10)
        keras.backend.clear_session()
    sizes = [ibnn_lenet.build_lenet("ibnn", (8, 8, 1), 10, width=w).count_params() for w in (1, 4)]
    assert sizes[1] > 10 * sizes[0]  # every hidden layer 4x wider: dense weights grow ~16x
    with tfds.testing.mock_data(num_examples=24):
        ds = datasets.load_images("fashion_mnist")
    assert ds.x_train.shape[1:] == (28, 28, 1) and ds.num_classes == 10 and ds.num_examples == 24
    assert datasets.load_images("digits").input_shape == (8, 8, 1)
    with pytest.raises(ValueError, match="Received: dataset='moons'"):
        datasets.load_images("moons")


@pytest.mark.heavy
def test_lenet_on_fashion_mnist_through_mocked_tfds(tmp_path):
    with tfds.testing.mock_data(num_examples=32):
        result = ibnn_lenet.run_experiment(output_dir=str(tmp_path), dataset="fashion_mnist", widths=(1,),
                                           methods=("ibnn",), epochs=1, batch_size=32, samples_per_component=1,
                                           verbose=False)
    (row,) = result["rows"]
    assert row["method"] == "iBNN" and np.isfinite(row["nll"])


@pytest.mark.heavy
def test_shift_experiment_ibnn_vs_mc_dropout(tmp_path):
    result = ibnn_shift.run_experiment(output_dir=str(tmp_path), hidden_units=16, depth=1, epochs=1,
                                       batch_size=DIGITS_BATCH, samples_per_component=1, verbose=False)
    _assert_outputs(result, str(tmp_path), ["shift_gaussian.png", "shift_salt_and_pepper.png"])
    methods = {(r["method"], r["corruption"]) for r in result["rows"]}
    assert methods == {(m, c) for m in ("iBNN", "MC dropout") for c in ("gaussian", "salt_and_pepper")}
    assert len(result["rows"]) == 2 * (5 + 5)  # default levels of both corruptions
    mc = [r for r in result["rows"] if r["method"] == "MC dropout"]
    assert max(r["mutual_information"] for r in mc) > 0  # dropout stayed on at prediction
    assert {s["method"] for s in result["summary"]} == {"iBNN", "MC dropout"}


# -- command-line plumbing -------------------------------------------------------------------------


def test_parsers_plug_into_the_tfbnn_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("ibnn-regression", "ibnn-lenet", "ibnn-shift"):
        assert name in out
        assert cli.main([name, "--help"]) == 0
        assert "--output-dir" in capsys.readouterr().out
    args = cli.build_parser().parse_args(["ibnn-lenet", "--widths", "1", "4", "--epochs", "3"])
    assert args.func is ibnn_lenet.run and args.widths == [1, 4] and args.dataset == "digits"


@pytest.mark.parametrize(
    "argv",
    [
        ["ibnn-regression", "--depths", "0"],
        ["ibnn-regression", "--methods", "mcmc"],
        ["ibnn-lenet", "--widths", "two"],
        ["ibnn-lenet", "--dataset", "cifar10"],
        ["ibnn-shift", "--dropout-rate", "1.5"],
        ["ibnn-shift", "--prior-stddev", "0"],
        ["ibnn-lenet", "--max-examples", "10"],  # digits is offline and complete: rejected by the run
    ],
)
def test_bad_options_give_one_error_line(argv, capsys, tmp_path):
    assert cli.main(argv + ["--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tfbnn: error: ") and "Traceback" not in err


def test_python_m_entry_point_errors(capsys):
    assert ibnn_shift.main(["--epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m tfbnn.experiments.ibnn_shift: error:") and len(err.strip().splitlines()) == 1
    assert ibnn_regression.main(["--help"]) == 0


def test_run_experiment_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="Unknown settings"):
        ibnn_regression.run_experiment(output_dir=str(tmp_path), depth=3)
    with pytest.raises(ValueError, match="Received: depths=\\(0,\\)"):
        ibnn_regression.run_experiment(output_dir=str(tmp_path), depths=(0,))
    with pytest.raises(ValueError, match="Received: widths="):
        ibnn_lenet.run_experiment(output_dir=str(tmp_path), widths=())
    with pytest.raises(ValueError, match="Received: dropout_rate=0"):
        ibnn_shift.run_experiment(output_dir=str(tmp_path), dropout_rate=0)
