"""SavedModel export: endpoints served in a fresh process that does not import tfbnn."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import export

SERVE = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, tensorflow as tf
    served = tf.saved_model.load(sys.argv[1])
    x = tf.constant(np.load(sys.argv[2]))
    seed = tf.constant(42, tf.int64)
    out = {
        "sample": served.sample(x).numpy().tolist(),
        "sample_again": served.sample(x).numpy().tolist(),
        "sample_seeded": served.sample_seeded(x, seed).numpy().tolist(),
        "mean": served.mean(x).numpy().tolist(),
        "summary": {k: v.numpy().tolist() for k, v in served.summary(x).items()},
        "summary_seeded": {k: v.numpy().tolist() for k, v in served.summary_seeded(x, seed).items()},
        "tfbnn_imported": any(m.startswith("tfbnn") for m in sys.modules),
    }
    print(json.dumps(out))
    """
)


def _serve(path, x_path):
    env = dict(os.environ, PYTHONPATH="")
    out = subprocess.run([sys.executable, "-c", SERVE, path, x_path], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(path))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("export")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            tfbnn.DenseFlipout(16, activation="relu", kernel_prior="scale_mixture", kl_weight=1e-3, seed=1),
            tfbnn.DenseReparameterization(3, activation="softmax", kl_weight=1e-3, seed=2),
        ]
    )
    for layer in model.layers:
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -1.5, "float32"))
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    path = str(tmp / "model")
    export.export_saved_model(model, path, num_samples=64)
    np.save(tmp / "x.npy", x)
    return model, x, path, str(tmp / "x.npy")


@pytest.mark.heavy
def test_saved_model_endpoints_in_fresh_processes(exported):
    model, x, path, x_path = exported
    first, second = _serve(path, x_path), _serve(path, x_path)
    assert not first["tfbnn_imported"]
    # Fresh processes draw fresh samples; calls within a process differ too.
    assert not np.allclose(first["sample"], second["sample"])
    assert not np.allclose(first["sample"], first["sample_again"])
    assert not np.allclose(first["summary"]["mean_probs"], second["summary"]["mean_probs"])
    # With a seed, results reproduce across processes.
    np.testing.assert_array_equal(first["sample_seeded"], second["sample_seeded"])
    for key in ("mean_probs", "predictive_entropy", "aleatoric", "epistemic"):
        np.testing.assert_array_equal(first["summary_seeded"][key], second["summary_seeded"][key])
    # The mean endpoint is the posterior-mean model.
    with tfbnn.posterior_mean(model):
        np.testing.assert_allclose(first["mean"], model(x).numpy(), rtol=1e-5, atol=1e-6)
    # The summary is a consistent entropy decomposition of proper probabilities.
    s = {k: np.array(v) for k, v in first["summary_seeded"].items()}
    np.testing.assert_allclose(s["mean_probs"].sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(s["predictive_entropy"], -(s["mean_probs"] * np.log(s["mean_probs"])).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(s["epistemic"], s["predictive_entropy"] - s["aleatoric"], atol=1e-6)
    assert np.all(s["epistemic"] > 0)


def test_export_in_process_summary_matches_samples(exported):
    import tensorflow as tf

    model, x, path, _ = exported
    served = tf.saved_model.load(path)
    seed = tf.constant(7, tf.int64)
    one = served.sample_seeded(x, seed).numpy()
    np.testing.assert_array_equal(one, served.sample_seeded(x, seed).numpy())
    assert not np.allclose(one, served.sample_seeded(x, tf.constant(8, tf.int64)).numpy())
    # Exporting left the live model's seed state and modes untouched.
    assert all(layer.inference_mode == "sample" for layer in tfbnn.bayesian_layers(model))
    assert all(layer._weight_samples == 1 for layer in tfbnn.bayesian_layers(model))


def test_export_refuses_to_overwrite_and_validates(exported, tmp_path):
    model, _, path, _ = exported
    with pytest.raises(ValueError, match="overwrite=True"):
        export.export_saved_model(model, path)
    with pytest.raises(ValueError, match="num_samples=0"):
        export.export_saved_model(model, str(tmp_path / "a"), num_samples=0)
    with pytest.raises(ValueError, match="task='ranking'"):
        export.export_saved_model(model, str(tmp_path / "b"), task="ranking")
