"""``tfbnn laplace``: a tiny trained model saved in tmp_path, fitted, tuned, saved and evaluated end to end.

Every number the command writes is recomputed here through the library's API (the same
approximation fitted directly) or NumPy, so a wrong option mapping or metric fails."""

import json
import math
import os

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import cli


def _model(tmp_path, name, outputs, activation):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6, activation="tanh"),
                              keras.layers.Dense(outputs, activation=activation)])
    model.compile("adam", "sparse_categorical_crossentropy" if outputs > 1 else "mse")
    return model, str(tmp_path / f"{name}.keras")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clf")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 3)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    model, path = _model(tmp, "clf", 2, "softmax")
    model.fit(x, y, epochs=20, verbose=0)
    model.save(path)
    data = str(tmp / "clf.npz")
    np.savez(data, x_train=x[:60], y_train=y[:60], x_test=x[60:], y_test=y[60:], x_val=x[45:60], y_val=y[45:60])
    return path, data


@pytest.fixture(scope="module")
def regressor(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reg")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(90, 3)).astype("float32")
    y = (np.sin(x[:, 0]) + 0.1 * rng.normal(size=90)).astype("float32")
    model, path = _model(tmp, "reg", 1, None)
    model.fit(x, y, epochs=30, verbose=0)
    model.save(path)
    data = str(tmp / "reg.npz")
    np.savez(data, x_train=x[:60], y_train=y[:60], x_test=x[60:], y_test=y[60:], x_val=x[45:60], y_val=y[45:60])
    return path, data


def test_classification_writes_the_approximation_and_its_evaluation(classifier, tmp_path, capsys):
    path, data = classifier
    prefix = str(tmp_path / "out" / "la")
    assert cli.main(["laplace", path, "--data", data, "--output", prefix, "--verbose", "0"]) == 0
    out = capsys.readouterr().out
    assert "Laplace (last_layer, kron, probit predictive)" in out and "la.npz" in out
    with open(prefix + ".json") as f:
        report = json.load(f)
    f = np.load(data)
    model = keras.saving.load_model(path)
    # The same approximation through the API: the marginal-likelihood prior precision is the command's.
    direct = tfbnn.laplace.fit(model, f["x_train"], f["y_train"], likelihood="classification")
    direct.optimize_prior_precision(method="marglik")
    assert report["likelihood"] == "classification" and report["hessian"] == "kron"
    assert report["prior_precision"] == pytest.approx(direct.prior_precision, rel=1e-6)
    assert report["log_marginal_likelihood"] == pytest.approx(direct.log_marginal_likelihood(), rel=1e-6)
    # The saved .npz is the fitted state: loaded, it predicts what the direct fit predicts.
    loaded = tfbnn.laplace.load(prefix + ".npz", model)
    probs = direct.predict(f["x_test"])
    np.testing.assert_allclose(loaded.predict(f["x_test"]), probs, rtol=1e-6)
    y_test = f["y_test"]
    assert report["laplace"]["nll"] == pytest.approx(-np.mean(np.log(probs[np.arange(len(y_test)), y_test])),
                                                     rel=1e-5)
    assert report["laplace"]["accuracy"] == pytest.approx(np.mean(probs.argmax(-1) == y_test))
    assert report["laplace"]["ece"] == pytest.approx(tfbnn.metrics.expected_calibration_error(probs, y_test))
    map_probs = model.predict(f["x_test"], verbose=0)
    assert report["map"]["accuracy"] == pytest.approx(np.mean(map_probs.argmax(-1) == y_test))


def test_regression_validation_prior_and_the_weight_sampling_predictive(regressor, tmp_path, capsys):
    path, data = regressor
    prefix = str(tmp_path / "r")
    argv = ["laplace", path, "--data", data, "--output", prefix, "--subset", "all", "--hessian", "diag",
            "--prior", "val_nll", "--sigma-noise", "0.2", "--predictive", "mc", "--num-samples", "200",
            "--seed", "3", "--verbose", "0"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    with open(prefix + ".json") as f:
        report = json.load(f)
    f = np.load(data)
    model = keras.saving.load_model(path)
    la = tfbnn.laplace.fit(model, f["x_train"], f["y_train"][:, None], likelihood="regression", subset="all",
                           hessian="diag", sigma_noise=0.2)
    la.optimize_prior_precision(method="val_nll", x_val=f["x_val"], y_val=f["y_val"][:, None], seed=3)
    assert report["prior_precision"] == la.prior_precision and report["sigma_noise"] == 0.2
    pred = la.predict(f["x_test"], pred_type="nn", num_samples=200, seed=3)
    y = f["y_test"].astype("float64")
    mean, std = pred.mean[:, 0].astype("float64"), pred.total_std[:, 0].astype("float64")
    assert report["laplace"]["rmse"] == pytest.approx(math.sqrt(np.mean((y - mean) ** 2)), rel=1e-5)
    nll = np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * ((y - mean) / std) ** 2)
    assert report["laplace"]["nll"] == pytest.approx(nll, rel=1e-5)
    inside = np.abs(y - mean) <= 1.6448536269514722 * std  # the central 90% interval
    assert report["laplace"]["coverage_90"] == pytest.approx(np.mean(inside))


@pytest.mark.parametrize("extra, named", [
    (["--predictive", "probit"], "--predictive=probit"),
    (["--likelihood", "regression", "--prior", "val_nll", "--data", "NOVAL"], "x_val"),
])
def test_bad_combinations_are_one_error_line(regressor, tmp_path, capsys, extra, named):
    path, data = regressor
    if "NOVAL" in extra:
        f = np.load(data)
        stripped = str(tmp_path / "noval.npz")
        np.savez(stripped, **{k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")})
        extra = [stripped if v == "NOVAL" else v for v in extra]
    assert cli.main(["laplace", path, "--data", data, "--output", str(tmp_path / "x"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "x.json")


def test_data_must_be_a_known_name_or_an_npz(regressor, capsys):
    path, _ = regressor
    assert cli.main(["laplace", path, "--data", "nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err


def test_a_missing_npz_is_one_error_line(regressor, tmp_path, capsys):
    path, _ = regressor
    assert cli.main(["laplace", path, "--data", str(tmp_path / "none.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none.npz" in err


def test_the_written_sampling_model_is_what_tfbnn_export_serves(classifier, regressor, tmp_path, capsys):
    """``tfbnn laplace`` -> ``PREFIX.keras`` -> ``tfbnn export``: the TFLite summary of the exported
    classifier is the approximation's Monte Carlo predictive (the .npz loaded through the API);
    the exported regressor's SavedModel gives the GLM predictive's mean and epistemic std, and the
    tuned noise as its aleatoric std."""
    import tensorflow as tf

    path, data = classifier
    prefix = str(tmp_path / "clf_la")
    assert cli.main(["laplace", path, "--data", data, "--output", prefix, "--verbose", "0"]) == 0
    assert f"tfbnn export {prefix}.keras" in capsys.readouterr().out
    out = str(tmp_path / "clf.tflite")
    assert cli.main(["export", prefix + ".keras", "--format", "tflite", "--num-samples", "2000", "--output", out]) == 0
    capsys.readouterr()
    f = np.load(data)
    la = tfbnn.laplace.load(prefix + ".npz", keras.saving.load_model(path))
    x = f["x_test"][:6]
    served = tf.lite.Interpreter(out).get_signature_runner("summary")(x=x)
    np.testing.assert_allclose(served["mean_probs"], la.predict(x, link_approx="mc", num_samples=20000, seed=0),
                               atol=0.04)
    assert np.all(served["epistemic"] > 0)

    path, data = regressor
    prefix = str(tmp_path / "reg_la")
    assert cli.main(["laplace", path, "--data", data, "--output", prefix, "--verbose", "0"]) == 0
    out = str(tmp_path / "reg_saved")
    assert cli.main(["export", prefix + ".keras", "--num-samples", "4000", "--output", out]) == 0
    capsys.readouterr()
    f = np.load(data)
    la = tfbnn.laplace.load(prefix + ".npz", keras.saving.load_model(path))
    x = f["x_test"][:6]
    loaded = tf.saved_model.load(out)  # kept referenced: its variables live as long as it does
    summary = loaded.summary(tf.constant(x))
    glm = la.predict(x)
    np.testing.assert_allclose(np.asarray(summary["mean"])[:, 0], glm.mean[:, 0], atol=0.05)
    np.testing.assert_allclose(np.asarray(summary["aleatoric_std"])[:, 0], la.sigma_noise, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(summary["epistemic_std"])[:, 0], glm.epistemic_std[:, 0], rtol=0.1)
