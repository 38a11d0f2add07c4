"""The posterior-comparison study (issue 22, item 4): its quick run, its outputs and its checks.

The pinned numbers of the quick run are in tests/experiments/test_study_pins.py; here the study's
numbers are checked against independent computations: a MAP network's predictive std is
exactly the noise std, and the Laplace row's prior precision is what tfbnn.laplace gives
for the saved MAP model."""

import json
import os

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import cli
from tfbnn.experiments import _posterior_study as study
from tfbnn.experiments import posterior_comparison as pc


def test_regression_metrics_and_distances_against_closed_forms():
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(50, 30))
    y = rng.normal(size=30)
    noise = 0.3
    got = study.regression_metrics(samples, y, noise)
    dens = np.exp(-0.5 * ((y - samples) / noise) ** 2) / (noise * np.sqrt(2 * np.pi))
    assert got["nll"] == pytest.approx(-np.mean(np.log(dens.mean(0))), rel=1e-10)
    mean = samples.mean(0)
    assert got["rmse"] == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)))
    # W2 between N(m1, s1^2) and N(m2, s2^2) is sqrt((m1 - m2)^2 + (s1 - s2)^2); to itself 0.
    assert study.wasserstein_to(samples, samples, noise) == 0.0
    shifted = study.wasserstein_to(samples + 2.0, samples, noise)
    assert shifted == pytest.approx(2.0)
    p = rng.dirichlet([1, 1, 1], size=(4, 10))
    kl, agree = study.kl_and_agreement(p, p)
    assert kl == pytest.approx(0.0, abs=1e-12) and agree == 1.0


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="methods"):
        pc.run_experiment(methods=("map", "nuts"))
    with pytest.raises(ValueError, match="datasets"):
        pc.run_experiment(datasets=("iris",))
    with pytest.raises(ValueError, match="dropout_rate"):
        pc.run_experiment(dropout_rate=1.0)


@pytest.mark.heavy
def test_quick_run_outputs_and_the_laplace_row(tmp_path):
    out = str(tmp_path / "study")
    result = pc.run_experiment(output_dir=out, verbose=False, quick=True, datasets=("gap",),
                               methods=("map", "laplace_last_layer"))
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"map", "laplace_last_layer"}
    # A MAP network's samples are identical: its predictive std is the noise std, everywhere.
    assert rows["map"]["std_gap"] == pytest.approx(pc.DEFAULTS["noise_std"], rel=1e-6)
    assert rows["map"]["std_clusters"] == pytest.approx(pc.DEFAULTS["noise_std"], rel=1e-6)
    # The Laplace row is the saved MAP model's Laplace approximation, its prior by the evidence.
    s = pc.STUDY.resolve({"quick": True})
    x, y, *_ = study.gap_data(s["num_points"], s["noise_std"], s["seed"], num_test=40)
    model = keras.saving.load_model(os.path.join(out, "gap", "runs", "map", "model.keras"))
    la = tfbnn.laplace.fit(model, x, y, likelihood="regression", hessian="kron", sigma_noise=s["noise_std"])
    la.optimize_prior_precision(method="marglik", tune_sigma_noise=False)
    assert rows["laplace_last_layer"]["prior_precision"] == pytest.approx(la.prior_precision, rel=1e-4)
    assert rows["laplace_last_layer"]["std_gap"] > rows["map"]["std_gap"]
    names = sorted(os.listdir(out))
    assert {"results.csv", "results.json", "comparison.md", "gap_bands.png"} <= set(names)
    with open(os.path.join(out, "results.json")) as f:
        saved = json.load(f)
    assert saved["settings"]["methods"] == ["map", "laplace_last_layer"] and len(saved["rows"]) == 2
    assert {"recipe.json", "history.csv", "results.json", "model.keras"} <= set(
        os.listdir(os.path.join(out, "gap", "runs", "map")))


@pytest.mark.heavy
def test_the_csgmcmc_row_is_its_runs_kept_samples(tmp_path):
    """Cyclical SG-MCMC trains through its registered method with the study's prior and its own step
    size; its row is the predictive of the samples the run kept and saved (quick: one cycle, two samples)."""
    out = str(tmp_path / "study")
    result = pc.run_experiment(output_dir=out, verbose=False, quick=True, datasets=("gap",), methods=("csgmcmc",))
    (row,) = result["rows"]
    s = pc.STUDY.resolve({"quick": True})
    recipe = pc.recipes("gap", s)["csgmcmc"]
    assert (recipe.method, recipe.learning_rate) == ("csgmcmc", s["csgmcmc_learning_rate"])
    assert recipe.method_options["prior_precision"] == pytest.approx(1.0 / s["prior_scale"] ** 2)
    model = keras.saving.load_model(os.path.join(out, "gap", "runs", "csgmcmc", "model.keras"))
    assert isinstance(model, tfbnn.DeepEnsemble) and len(model.members) == 2
    _, _, x_test, _, _, gap = study.load("gap", s)
    f = np.stack([m.predict(x_test, verbose=0)[:, 0] for m in model.members]).astype("float64")
    assert np.abs(f[0] - f[1]).max() > 1e-6  # two samples, not one weight vector twice
    std = np.sqrt(f.var(axis=0) + s["noise_std"] ** 2)
    assert row["std_gap"] == pytest.approx(std[gap].mean(), rel=1e-4)
    assert row["std_clusters"] == pytest.approx(std[~gap].mean(), rel=1e-4)
    assert row["label"] == "cyclical SG-MCMC"


def test_pending_methods_say_so():
    import importlib.util

    if importlib.util.find_spec("tfbnn.hmc") is not None:
        pytest.skip("tfbnn.hmc is in this build")
    with pytest.raises(tfbnn.RunError, match="HMC reference .* is pending"):
        study.pending_module("hmc")


def test_run_routes_the_study_and_rejects_options_that_do_not_apply(capsys):
    assert cli.main(["run", "posterior-comparison", "--dataset", "digits"]) == 2
    assert "--dataset does not apply to the study posterior-comparison" in capsys.readouterr().err


@pytest.mark.heavy
def test_swag_and_the_hmc_reference_enter_the_table(tmp_path):
    """SWAG collects the second half of the MAP recipe's epochs; every other row carries its KL to HMC's
    predictive and the agreement of the predicted classes (their formulas: the closed-form test above)."""
    result = pc.run_experiment(output_dir=str(tmp_path), verbose=False, quick=True, datasets=("breast_cancer",),
                               methods=("hmc", "map", "swag"))
    rows = {r["method"]: r for r in result["rows"]}
    assert list(rows) == ["hmc", "map", "swag"]  # the table's order
    epochs = pc.recipes("breast_cancer", pc.STUDY.resolve({"quick": True}))["swag"].epochs
    assert rows["swag"]["snapshots"] == epochs - epochs // 2
    assert "kl_to_hmc" not in rows["hmc"] and rows["hmc"]["max_r_hat"] > 0
    h = rows["hmc"]  # output-space R-hat over the test inputs (its formula: tests/test_swag_hmc.py)
    assert 0 < h["median_r_hat_outputs"] <= h["max_r_hat_outputs"] < float("inf")
    assert 0 < h["min_ess"] <= h["median_ess"] and 0 < h["acceptance"] <= 1 and h["step_size"] > 0
    for m in ("map", "swag"):
        assert rows[m]["kl_to_hmc"] >= 0 and 0 <= rows[m]["agreement_with_hmc"] <= 1
