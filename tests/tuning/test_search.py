"""KerasTuner searches: the Blundell prior grid, KL scale, resume, chief/worker tuning, errors.

Tiny models (8 hidden units, 1 epoch, one eager step per trial) on 200 generated
moons points, so the 27-trial grid takes well under a minute; every tuner writes
under pytest's tmp_path.
"""

import csv
import gc
import glob
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from unittest import mock

import keras
import keras_tuner
import numpy as np
import pytest

import tfbnn
from tfbnn import tuning
from tfbnn.cli import tune as tuning_cli

# 200 moons points -> 160 train (the dataset's 80/20 split) -> 133 train + 27 validation.
TINY = ["--dataset", "moons", "--max-examples", "200", "--epochs", "1", "--hidden-units", "8", "--depth", "1",
        "--batch-size", "256", "--run-eagerly"]
N_TRAIN = 133  # floor(160 * (1 - 1/6)): N of the ELBO
GRID = set(itertools.product((0.25, 0.5, 0.75), (0.0, 1.0, 2.0), (6.0, 7.0, 8.0)))


def _assert_one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tfbnn: error: "), err
    assert "Traceback" not in err


def _combo(values):
    return (values["pi"], values["neg_log_sigma1"], values["neg_log_sigma2"])


def _trials(project):
    """The trial records KerasTuner's oracle wrote: {trial_id: trial.json contents}."""
    trials = {}
    for path in glob.glob(os.path.join(project, "trial_*", "trial.json")):
        with open(path) as f:
            record = json.load(f)
        trials[record["trial_id"]] = record
    return trials


def _fits(folder):
    with open(os.path.join(folder, "fits.jsonl")) as f:
        return [json.loads(line) for line in f]


def _count(fits, event):
    counts = {}
    for fit in fits:
        if fit["event"] == event:
            counts[_combo(fit["values"])] = counts.get(_combo(fit["values"]), 0) + 1
    return counts


def _csv_rows(folder):
    with open(os.path.join(folder, "results.csv")) as f:
        return list(csv.DictReader(f))


# -- the search space ---------------------------------------------------------------------


def test_blundell_space_is_the_papers_grid():
    space = tuning.BlundellPriorSpace()
    assert space.pi == (0.25, 0.5, 0.75)
    assert space.neg_log_sigma1 == (0.0, 1.0, 2.0)
    assert space.neg_log_sigma2 == (6.0, 7.0, 8.0)
    assert space.size == 27
    grid = space.grid()
    assert len(grid) == 27 and {_combo(v) for v in grid} == GRID
    best = space.prior({"pi": 0.25, "neg_log_sigma1": 0.0, "neg_log_sigma2": 8.0})  # the default prior (the seed study's best point)
    assert isinstance(best, tfbnn.priors.ScaleMixture)
    assert best.pi == 0.25 and best.sigma1 == 1.0 and abs(best.sigma2 - 3.35e-4) < 1e-6
    hp = keras_tuner.HyperParameters()
    assert space.declare(hp) == {"pi": 0.25, "neg_log_sigma1": 0.0, "neg_log_sigma2": 6.0}
    assert [p.name for p in hp.space] == ["pi", "neg_log_sigma1", "neg_log_sigma2"]


def test_optional_dimensions_and_sigma_parameterization():
    space = tuning.BlundellPriorSpace(pi=[0.5], sigma1=[1.0, math.exp(-1)], neg_log_sigma2=[7],
                                      learning_rate=[1e-3, 3e-3], hidden_units=[8, 16], schedule=["constant"])
    assert space.neg_log_sigma1 == (0.0, pytest.approx(1.0))
    assert list(space.dimensions()) == ["pi", "neg_log_sigma1", "neg_log_sigma2", "learning_rate", "hidden_units",
                                        "schedule"]
    assert space.size == 8 and len({tuple(v.values()) for v in space.grid()}) == 8


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"pi": [0.25, 1.5]}, "Received: pi=1.5"),
        ({"pi": [0.0]}, "Received: pi=0.0"),
        ({"pi": []}, "Received: pi=()"),
        ({"pi": [0.25, 0.25]}, "Expected distinct values for `pi`"),
        ({"pi": ["a"]}, "Received: pi='a'"),
        ({"neg_log_sigma1": [0.0, float("inf")]}, "Received: neg_log_sigma1=inf"),
        ({"neg_log_sigma2": [float("nan")]}, "Received: neg_log_sigma2=nan"),
        ({"sigma1": [-1.0]}, "Received: sigma1=-1.0"),
        ({"sigma2": [0.0]}, "Received: sigma2=0.0"),
        ({"sigma1": [1.0], "neg_log_sigma1": [0.0]}, "either `neg_log_sigma1` or `sigma1`"),
        ({"learning_rate": [-1e-3]}, "Received: learning_rate=-0.001"),
        ({"hidden_units": [0]}, "Received: hidden_units=0"),
        ({"schedule": ["bogus"]}, "Received: schedule='bogus'"),
    ],
)
def test_invalid_grid_values_are_rejected(kwargs, needle):
    with pytest.raises(ValueError, match="Expected") as info:
        tuning.BlundellPriorSpace(**kwargs)
    assert needle in str(info.value)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown search\. Expected one of \['blundell-prior-grid', 'ibnn-random'\]\. "
                                         r"Received: search='prior-grid'"):
        tuning.get_search("prior-grid")
    with pytest.raises(ValueError, match=r"Expected one of \['val_accuracy', 'val_nll', 'val_loss'\]"):
        tuning.get_objective("accuracy")
    assert tuning.get_objective("val_nll").direction == "min"
    assert tuning.get_objective("val_accuracy").direction == "max"
    with pytest.raises(ValueError, match="Received: layer='dense'"):
        tuning.BayesianMLPHyperModel((2,), 2, layer="dense")


def test_ibnn_space(tmp_path):
    space = tuning.IBNNSpace()
    assert list(space.dimensions()) == ["num_components", "init_stddev", "prior_stddev", "variational_learning_rate"]
    assert space.size == 3 * 3 * 4 * 3 and len({tuple(v.values()) for v in space.grid()}) == space.size
    assert tuning.IBNNSpace(num_components=[4], init_stddev=[0.5], prior_stddev=[0.1],
                            variational_learning_rate=[0.01]).grid() == [
        {"num_components": 4, "init_stddev": 0.5, "prior_stddev": 0.1, "variational_learning_rate": 0.01}]
    hp = keras_tuner.HyperParameters()
    assert space.declare(hp) == {"num_components": 1, "init_stddev": 0.1, "prior_stddev": 0.05,
                                 "variational_learning_rate": 1e-3}
    for kwargs, needle in (({"num_components": [0]}, "num_components=0"), ({"prior_stddev": [-1]}, "prior_stddev=-1"),
                           ({"init_stddev": []}, "init_stddev=()"),
                           ({"variational_learning_rate": [0.0]}, "variational_learning_rate=0.0")):
        with pytest.raises(ValueError, match="Expected") as info:
            tuning.IBNNSpace(**kwargs)
        assert needle in str(info.value)


def test_ibnn_hypermodel_builds_node_layers_when_they_exist():
    if not hasattr(tfbnn.layers, "NodeDense"):
        pytest.skip("no tfbnn.layers.NodeDense in this tfbnn")
    space = tuning.IBNNSpace(num_components=[2], init_stddev=[0.25], prior_stddev=[0.5], variational_learning_rate=[0.05])
    hypermodel = tuning.IBNNHyperModel((2,), 2, space=space, hidden_units=4, depth=1, batch_size=64,
                                       validation_split=0.25, run_eagerly=True)
    hp = keras_tuner.HyperParameters()
    model = hypermodel.build(hp)
    nodes = [layer for layer in model.layers if isinstance(layer, tfbnn.layers.NodeDense)]
    assert len(nodes) == 2
    assert all((n.num_components, n.init_stddev, n.prior_stddev) == (2, 0.25, 0.5) for n in nodes)
    x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    history = hypermodel.fit(hp, model, x, (x[:, 0] > 0).astype("int32"), epochs=1)
    assert np.isfinite(history.history["val_nll"][0])
    assert all(float(n.kl_weight.numpy()) == pytest.approx(1.0 / 48) for n in nodes)


def test_ibnn_hypermodel_names_the_missing_layer(tmp_path, monkeypatch):
    monkeypatch.delattr(tfbnn.layers, "NodeDense", raising=False)
    hypermodel = tuning.IBNNHyperModel((2,), 2)
    with pytest.raises(NotImplementedError, match=r"tfbnn\.layers\.NodeDense"):
        tuning.RandomSearch(hypermodel, max_trials=2, directory=str(tmp_path), project_name="ibnn")


# -- the HyperModel ---------------------------------------------------------------------------


def test_kl_scale_follows_the_training_split(tmp_path):
    """N is the training part actually used: floor(n (1 - f)) with a split, len(x) with validation_data."""
    x = np.random.default_rng(0).normal(size=(100, 2)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    log = tmp_path / "fits.jsonl"
    hypermodel = tuning.BayesianMLPHyperModel((2,), 2, hidden_units=4, depth=1, batch_size=100,
                                              validation_split=0.25, run_eagerly=True, fit_log=log)
    hp = keras_tuner.HyperParameters()
    model = hypermodel.build(hp)
    history = hypermodel.fit(hp, model, x, y, epochs=1)
    assert set(history.history) >= {"val_accuracy", "val_nll", "val_loss"}
    for layer in tfbnn.bayesian_layers(model):
        assert float(layer.kl_weight.numpy()) == pytest.approx(1.0 / 75)  # beta = 1 (constant schedule)
    model = hypermodel.build(hp)
    hypermodel.fit(hp, model, x, y, validation_data=(x[:10], y[:10]), epochs=1)
    for layer in tfbnn.bayesian_layers(model):
        assert float(layer.kl_weight.numpy()) == pytest.approx(1.0 / 100)
    fits = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(f["event"], f["num_examples"]) for f in fits] == [("begin", 75), ("end", 75), ("begin", 100), ("end", 100)]
    assert fits[1]["values"] == {"pi": 0.25, "neg_log_sigma1": 0.0, "neg_log_sigma2": 6.0}
    # The built model carries the trial's scale-mixture prior.
    prior = tfbnn.bayesian_layers(model)[0].kernel_prior
    assert prior == tfbnn.priors.ScaleMixture(0.25, 1.0, math.exp(-6.0))


@pytest.mark.parametrize("hypermodel_class", ["BayesianMLPHyperModel", "IBNNHyperModel"])
def test_a_trial_traces_its_train_step_once(hypermodel_class, train_step_traces):
    x = np.random.default_rng(0).normal(size=(40, 2)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    hypermodel = getattr(tuning, hypermodel_class)((2,), 2, hidden_units=4, depth=1, batch_size=10)
    hp = keras_tuner.HyperParameters()
    model = hypermodel.build(hp)
    history = hypermodel.fit(hp, model, x, y, epochs=2)
    assert len(train_step_traces) == 1 and len(history.history["loss"]) == 2


def _weights_and_kl(model):
    return [type(layer) for layer in model.layers], [w.numpy() for w in model.weights], tfbnn.kl_divergence(model)


@pytest.mark.parametrize("search", ["bbb", "ibnn"])
def test_hypermodels_build_zoo_models(search):
    """A trial's model is the zoo's tfbnn.models.mlp with the trial's settings: same layers, weights and KL."""
    if search == "bbb":
        hypermodel = tuning.BayesianMLPHyperModel((3,), 2, hidden_units=4, depth=2, layer="reparameterization",
                                                  seed=5, num_examples=60)
        options = {"estimator": "reparameterization", "prior": tfbnn.priors.ScaleMixture(0.25, 1.0, math.exp(-6.0))}
    else:
        space = tuning.IBNNSpace(num_components=[2], init_stddev=[0.25], prior_stddev=[0.5],
                                 variational_learning_rate=[0.05])
        hypermodel = tuning.IBNNHyperModel((3,), 2, space=space, hidden_units=4, depth=2, seed=5, num_examples=60)
        options = {"num_components": 2, "init_stddev": 0.25, "prior_stddev": 0.5}
    model = hypermodel.build(keras_tuner.HyperParameters())
    keras.utils.set_random_seed(5)
    zoo = tfbnn.models.mlp(search, hidden_units=(4, 4), num_classes=2, input_shape=(3,), num_examples=60, seed=5,
                           **options)
    classes, weights, kl = _weights_and_kl(model)
    zoo_classes, zoo_weights, zoo_kl = _weights_and_kl(zoo)
    assert classes == zoo_classes and len(tfbnn.bayesian_layers(model)) == 3
    assert len(weights) == len(zoo_weights) and all(np.array_equal(a, b) for a, b in zip(weights, zoo_weights))
    assert float(kl) == float(zoo_kl) and np.isfinite(float(kl))
    assert all(float(layer.kl_weight.numpy()) == pytest.approx(1 / 60) for layer in tfbnn.bayesian_layers(model))
    # Without N the build-time scale is a placeholder (N = 1) that fit replaces (test_kl_scale_follows_...).
    placeholder = type(hypermodel)((3,), 2, space=hypermodel.space, hidden_units=4, depth=1)
    assert all(float(layer.kl_weight.numpy()) == 1.0
               for layer in tfbnn.bayesian_layers(placeholder.build(keras_tuner.HyperParameters())))
    with pytest.raises(ValueError, match="Received: num_examples=0"):
        type(hypermodel)((3,), 2, num_examples=0)


def test_tuning_does_not_import_the_command_line():
    """tfbnn.tuning sits below the command line: importing it and building its models never loads tfbnn.cli."""
    code = (
        "import sys, keras_tuner; import tfbnn.tuning as t\n"
        "for hm in (t.BayesianMLPHyperModel((2,), 2, hidden_units=2, depth=1),\n"
        "           t.IBNNHyperModel((2,), 2, hidden_units=2, depth=1)):\n"
        "    hm.build(keras_tuner.HyperParameters())\n"
        "print(sorted(m for m in sys.modules if m == 'tfbnn.cli' or m.startswith(('tfbnn.cli.', 'tfbnn.tuning_cli'))))\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_validation_split_rule_matches_keras():
    x, y = np.arange(160), np.arange(160)
    (xt, _), (xv, _) = tuning.split_validation(x, y, 1 / 6)
    assert len(xt) == N_TRAIN and len(xv) == 27 and xv[0] == N_TRAIN
    with pytest.raises(ValueError, match="Received: validation_split=1.5"):
        tuning.split_validation(x, y, 1.5)
    with pytest.raises(ValueError, match="both need at least one"):
        tuning.split_validation(x[:2], y[:2], 0.6)


# -- tfbnn tune ---------------------------------------------------------------------------------


def test_tune_runs_the_27_grid_points_exactly_once_then_resumes_without_rerunning(tmp_path, capsys):
    out = tmp_path / "grid"
    start = time.perf_counter()
    assert tuning_cli.main(["tune", "--search", "blundell-prior-grid", *TINY, "--output", str(out)]) == 0
    seconds = time.perf_counter() - start
    printed = capsys.readouterr().out
    assert "Search: Running Trial #27" in printed  # KerasTuner's own progress
    assert "Top 10 of 27 completed trials" in printed
    header = next(line for line in printed.splitlines() if line.startswith("rank"))
    for column in ("pi", "sigma1", "sigma2", "val accuracy", "val NLL"):
        assert column in header
    assert f"N = {N_TRAIN} training / 27 validation" in printed

    trials = _trials(out / "search")
    assert len(trials) == 27
    assert all(t["status"] == "COMPLETED" for t in trials.values())
    assert {_combo(t["hyperparameters"]["values"]) for t in trials.values()} == GRID

    rows = _csv_rows(out)
    assert len(rows) == 27 and [int(r["rank"]) for r in rows] == list(range(1, 28))
    assert {(float(r["pi"]), float(r["neg_log_sigma1"]), float(r["neg_log_sigma2"])) for r in rows} == GRID
    assert all(float(r["sigma2"]) == pytest.approx(math.exp(-float(r["neg_log_sigma2"]))) for r in rows)
    scores = [float(r["score"]) for r in rows]
    assert scores == sorted(scores, reverse=True) and scores[0] == float(rows[0]["val_accuracy"])
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    fits = _fits(out)
    assert _count(fits, "begin") == {c: 1 for c in GRID} and _count(fits, "end") == {c: 1 for c in GRID}
    assert {f["num_examples"] for f in fits} == {N_TRAIN}
    print(f"\n27-trial grid: {seconds:.1f} s")

    # The same command again: everything is reloaded, nothing is trained again.
    assert tuning_cli.main(["tune", "--search", "blundell-prior-grid", *TINY, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "resuming: 27 completed trial(s) kept" in printed and "Top 10 of 27" in printed
    assert len(_fits(out)) == len(fits)
    assert _trials(out / "search") == trials


def test_the_search_keeps_a_callers_gc_freeze_and_undoes_only_its_own(tmp_path, capsys):
    # The search freezes the objects alive at its start (KerasTuner collects before every trial). A
    # process that had frozen objects itself (conftest has, as a server after its start-up might) keeps
    # them frozen; in one that had not, the search unfreezes after itself (seen through a stand-in for
    # gc.unfreeze: the real one would thaw this worker's whole heap).
    # The freeze count is no witness: frozen objects that die by reference counting leave it (the search
    # clears Keras' session), so a caller's object, frozen here, must still be outside the collector's
    # generations, where gc.get_objects does not list it.
    one = ["--pi", "0.5", "--neg-log-sigma1", "1", "--neg-log-sigma2", "6", *TINY]
    callers = [object()]
    gc.freeze()
    assert gc.get_freeze_count() > 0 and not any(o is callers for o in gc.get_objects())
    with mock.patch.object(gc, "unfreeze", wraps=gc.unfreeze) as unfreeze:
        assert tuning_cli.main(["tune", *one, "--output", str(tmp_path / "a")]) == 0
    assert unfreeze.call_count == 0 and not any(o is callers for o in gc.get_objects())
    with mock.patch.object(gc, "get_freeze_count", return_value=0), mock.patch.object(gc, "unfreeze") as unfreeze:
        assert tuning_cli.main(["tune", *one, "--output", str(tmp_path / "b")]) == 0
    unfreeze.assert_called_once_with()
    assert len(_csv_rows(tmp_path / "a")) == len(_csv_rows(tmp_path / "b")) == 1
    capsys.readouterr()


def test_custom_grid_objective_settings_check_and_overwrite(tmp_path, capsys):
    out = tmp_path / "small"
    small = ["--pi", "0.5", "--neg-log-sigma1", "1", "--neg-log-sigma2", "6,8", "--objective", "val_nll"]
    assert tuning_cli.main(["tune", *TINY, *small, "--output", str(out)]) == 0
    rows = _csv_rows(out)
    assert [(float(r["pi"]), float(r["neg_log_sigma1"]), float(r["neg_log_sigma2"])) for r in rows] != []
    assert {float(r["neg_log_sigma2"]) for r in rows} == {6.0, 8.0} and len(rows) == 2
    assert all(float(r["score"]) == pytest.approx(float(r["val_nll"])) for r in rows)  # NLL alone, not val_loss
    assert float(rows[0]["val_nll"]) <= float(rows[1]["val_nll"])  # minimized
    capsys.readouterr()

    # Resuming with other settings would mix incomparable trials: refused, nothing touched.
    before = _trials(out / "search")
    assert tuning_cli.main(["tune", *TINY, *small, "--epochs", "2", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "epochs: 1 there, 2 now" in err and "--overwrite" in err
    assert _trials(out / "search") == before

    # --overwrite starts over with the new settings.
    assert tuning_cli.main(["tune", *TINY, *small, "--epochs", "2", "--overwrite", "--output", str(out)]) == 0
    fits = _fits(out)
    assert len(fits) == 4 and {f["epochs"] for f in fits} == {2}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["tune", "--search", "prior-grid"],
         "invalid choice: 'prior-grid' (choose from 'blundell-prior-grid', 'ibnn-random')"),
        (["tune", "--pi", "0.25,1.5"], "Received: --pi=1.5"),
        (["tune", "--pi", "0"], "Received: --pi=0.0"),
        (["tune", "--pi", "0.25,0.25"], "distinct values for --pi"),
        (["tune", "--sigma1", "-1"], "Received: --sigma1=-1.0"),
        (["tune", "--sigma2", "0"], "Received: --sigma2=0.0"),
        (["tune", "--neg-log-sigma1", "x"], "expected comma-separated numbers"),
        (["tune", "--neg-log-sigma2", "inf"], "expected finite numbers"),
        (["tune", "--sigma1", "1", "--neg-log-sigma1", "0"], "either --neg-log-sigma1 or --sigma1"),
        (["tune", "--tune-schedule", "linear,bogus"], "unknown 'bogus'"),
        (["tune", "--tune-hidden-units", "8,0"], "Received: --tune-hidden-units=0"),
        (["tune", "--objective", "accuracy"], "invalid choice"),
        (["tune", "--epochs", "0"], "expected a positive integer"),
        (["tune", "--validation-split", "1"], "open interval (0, 1)"),
        (["tune", "--search", "ibnn-random", "--pi", "0.5"], "--pi applies to the blundell-prior-grid search only"),
    ],
)
def test_bad_options_exit_2_with_one_line(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert tuning_cli.main(argv) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert needle in err
    assert not os.path.exists(tmp_path / "tuners")  # rejected before anything was written


def test_ibnn_search_fails_cleanly_without_node_layers(tmp_path, capsys, monkeypatch):
    monkeypatch.delattr(tfbnn.layers, "NodeDense", raising=False)
    assert tuning_cli.main(["tune", "--search", "ibnn-random", *TINY, "--output", str(tmp_path / "ibnn")]) == 1
    err = capsys.readouterr().err
    _assert_one_error_line(err)
    assert "tfbnn.layers.NodeDense" in err


def test_workers_get_the_same_search():
    parser = tuning_cli.build_parser()
    argv = ["tune", *TINY, "--pi", "0.25,0.5", "--sigma2", "0.001,0.0001", "--tune-schedule", "constant,linear",
            "--objective", "val_nll", "--validation-split", "0.2", "--workers", "2", "--port", "5555",
            "--overwrite", "--output", "somewhere"]
    args = parser.parse_args(argv)
    child = parser.parse_args(tuning_cli.child_argv(args) + ["--output", "somewhere"])
    for name, value in vars(args).items():
        if name in ("workers", "port", "overwrite", "func", "tune_parser"):
            continue
        assert getattr(child, name) == value, name
    assert child.workers == 0 and not child.overwrite


def test_only_the_chief_may_overwrite(tmp_path, monkeypatch):
    project = tmp_path / "search"
    (project / "trial_0000").mkdir(parents=True)
    (project / "keep.txt").write_text("completed work")
    monkeypatch.setenv("KERASTUNER_ORACLE_IP", "127.0.0.1")
    monkeypatch.setenv("KERASTUNER_ORACLE_PORT", str(tuning.free_port()))
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "tuner0")
    assert tuning.distributed_role() == "worker"
    hypermodel = tuning.BayesianMLPHyperModel((2,), 2, hidden_units=4, depth=1)
    with pytest.warns(UserWarning, match="only the chief may wipe the project folder"):
        tuning.GridSearch(hypermodel, directory=str(tmp_path), project_name="search", overwrite=True)
    assert (project / "keep.txt").read_text() == "completed work"
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "chief")
    assert tuning.distributed_role() == "chief"
    tuning.GridSearch(hypermodel, directory=str(tmp_path), project_name="search", overwrite=True)
    assert not (project / "keep.txt").exists()


class _Quadratic(tuning.GridSearch):
    """A grid search without Keras: each trial is one evaluation, logged in ``self.runs``."""

    def run_trial(self, trial, *args, **kwargs):
        values = trial.hyperparameters.values
        self.runs.append((trial.trial_id, values["a"], values["b"]))
        return {"val_accuracy": -(values["a"] - 1.0) ** 2 + values["b"]}


def _quadratic(folder, max_trials):
    hp = keras_tuner.HyperParameters()
    hp.Choice("a", [0.0, 1.0, 2.0])
    hp.Choice("b", [1.0, 2.0])
    tuner = _Quadratic(objective="val_accuracy", max_trials=max_trials, hyperparameters=hp,
                       directory=str(folder), project_name="q")
    tuner.oracle.verbose = 0
    tuner.runs = []
    return tuner


def test_grid_search_resumes_from_the_saved_trials(tmp_path):
    """The next grid point comes from the saved trials (KerasTuner 1.4.8's GridSearch KeyErrors on resume)."""
    first = _quadratic(tmp_path, 3)
    first.search()
    assert [r[0] for r in first.runs] == ["0", "1", "2"]
    second = _quadratic(tmp_path, 6)  # what a new process sees
    second.search()
    assert [r[0] for r in second.runs] == ["3", "4", "5"]
    values = {(r[1], r[2]) for r in first.runs + second.runs}
    assert values == set(itertools.product((0.0, 1.0, 2.0), (1.0, 2.0)))
    assert [t.score for t in second.oracle.get_best_trials(1)] == [2.0]


def test_reload_reruns_only_unfinished_trials(tmp_path):
    first = _quadratic(tmp_path, 3)
    first.search()
    project = tmp_path / "q"
    # A distributed chief's last save used to list its last trial as still ongoing ...
    state = json.loads((project / "oracle.json").read_text())
    state["ongoing_trials"] = {"tuner0": "2"}
    (project / "oracle.json").write_text(json.dumps(state))
    # ... and a kill right after a trial's creation leaves a record the oracle state lacks.
    record = json.loads((project / "trial_2" / "trial.json").read_text())
    record.update(trial_id="3", status="RUNNING", score=None, best_step=None, metrics={"metrics": {}})
    record["hyperparameters"]["values"] = {"a": 1.0, "b": 2.0}
    (project / "trial_3").mkdir()
    (project / "trial_3" / "trial.json").write_text(json.dumps(record))

    second = _quadratic(tmp_path, 6)
    second.search()
    assert sorted(second.runs) == [("3", 1.0, 2.0), ("4", 2.0, 1.0), ("5", 2.0, 2.0)]  # trial 2 not re-run
    assert all(t.status == "COMPLETED" for t in second.oracle.trials.values())
    assert len(second.oracle.trials) == 6
    assert json.loads((project / "oracle.json").read_text())["ongoing_trials"] == {}


# -- distributed and kill-and-restart (subprocesses) -----------------------------------------


@pytest.mark.heavy
def test_chief_and_two_workers_finish_the_grid_once(tmp_path, capfd):
    out = tmp_path / "dist"
    start = time.perf_counter()
    assert tuning_cli.main(["tune", *TINY, "--output", str(out), "--workers", "2"]) == 0
    seconds = time.perf_counter() - start
    printed = capfd.readouterr().out
    assert "[chief: serving the oracle" in printed and "Top 10 of 27 completed trials" in printed

    # The oracle's records (written by the chief): 27 distinct trials, each completed once.
    with open(out / "search" / "oracle.json") as f:
        oracle = json.load(f)
    assert len(oracle["start_order"]) == 27 and len(set(oracle["start_order"])) == 27
    assert sorted(oracle["end_order"]) == sorted(oracle["start_order"])
    assert oracle["ongoing_trials"] == {}
    trials = _trials(out / "search")
    assert sorted(trials) == sorted(oracle["end_order"])
    assert all(t["status"] == "COMPLETED" and t["score"] is not None for t in trials.values())
    assert {_combo(t["hyperparameters"]["values"]) for t in trials.values()} == GRID

    # Who trained what: every combination once, by the two workers (never the chief).
    fits = _fits(out)
    assert _count(fits, "begin") == {c: 1 for c in GRID} and _count(fits, "end") == {c: 1 for c in GRID}
    workers = {f["tuner_id"] for f in fits}
    assert workers == {"tuner0", "tuner1"}, workers
    assert len(_csv_rows(out)) == 27
    print(f"\nchief + 2 workers, 27 trials: {seconds:.1f} s")


def _completed(project):
    try:
        return {k: v for k, v in _trials(project).items() if v["status"] == "COMPLETED"}
    except (OSError, json.JSONDecodeError):  # a record being replaced right now
        return {}


@pytest.mark.heavy
def test_killed_search_resumes_without_rerunning_completed_trials(tmp_path):
    out = tmp_path / "killed"
    # 2 x 2 x 3 = 12 grid points keep two process start-ups and the trials lean.
    grid = set(itertools.product((0.25, 0.5), (0.0, 1.0), (6.0, 7.0, 8.0)))
    command = [sys.executable, "-m", "tfbnn.cli.tune", "tune", *TINY, "--pi", "0.25,0.5", "--neg-log-sigma1", "0,1",
               "--output", str(out)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while len(_completed(out / "search")) < 3:
            assert process.poll() is None, "the search ended before it could be killed"
            assert time.monotonic() < deadline, "no trial completed in time"
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    before = _completed(out / "search")
    assert 3 <= len(before) < 12
    begun = _count(_fits(out), "begin")

    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resuming: {len(before)} completed trial(s) kept" in result.stdout

    after = _trials(out / "search")
    assert len(after) == 12  # the trial cut off by the kill ran again under its own id
    assert all(t["status"] == "COMPLETED" for t in after.values())
    assert {_combo(t["hyperparameters"]["values"]) for t in after.values()} == grid
    for trial_id, record in before.items():  # kept as they were: same id, values, score
        assert after[trial_id]["hyperparameters"]["values"] == record["hyperparameters"]["values"]
        assert after[trial_id]["score"] == record["score"]
    fits = _fits(out)
    begins, ends = _count(fits, "begin"), _count(fits, "end")
    for record in before.values():  # completed before the kill: trained once, never again
        assert begins[_combo(record["hyperparameters"]["values"])] == 1
    assert ends == {c: 1 for c in grid}  # every combination finished exactly once overall
    # Only the trial running at the kill may have started twice.
    assert sum(begins.values()) - 12 <= 1 and sum(begun.values()) - len(before) <= 1
    with open(out / "search" / "oracle.json") as f:
        assert json.load(f)["ongoing_trials"] == {}
    assert len(_csv_rows(out)) == 12
    print(f"\nkill after {len(before)} trials + resume: {seconds:.1f} s")
