"""Bad input that used to reach the user raw (issue 28): each case gives a clear error naming the argument."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfbnn


# -- layers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("inference_mode", ["sample", "mean"])
def test_embedding_refuses_out_of_range_ids_in_both_modes(inference_mode):
    layer = tfbnn.layers.EmbeddingReparameterization(10, 3, inference_mode=inference_mode, seed=0)
    with pytest.raises(ValueError, match=r"ids in \[0, input_dim\) with input_dim=10.*min=-1, max=50"):
        layer(np.array([[1, 50, -1]]))
    assert layer(np.array([[0, 9]])).shape == (1, 2, 3)


def test_embedding_refuses_out_of_range_ids_in_a_compiled_step():
    layer = tfbnn.layers.EmbeddingReparameterization(10, 3, seed=0)
    call = tf.function(layer)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input_dim=10"):
        call(tf.constant([[1, 10]]))


@pytest.mark.parametrize("make, shape", [
    (lambda: tfbnn.layers.DenseBatchEnsemble(2, ensemble_size=2), (3, 4)),
    (lambda: tfbnn.layers.DenseRank1(2, ensemble_size=2, kl_weight=0.1), (3, 4)),
    (lambda: tfbnn.layers.Conv2DBatchEnsemble(2, 2, ensemble_size=2), (3, 4, 4, 1)),
    (lambda: tfbnn.layers.Conv2DRank1(2, 2, ensemble_size=2, kl_weight=0.1), (3, 4, 4, 1)),
])
def test_ensemble_layers_refuse_a_batch_that_is_not_a_multiple_of_ensemble_size(make, shape):
    layer = make()
    with pytest.raises(ValueError, match=r"multiple of ensemble_size=2 .* Received: inputs with batch size 3"):
        layer(np.ones(shape, "float32"))
    assert layer(np.ones((4, *shape[1:]), "float32")).shape[0] == 4
    assert layer(np.ones(shape, "float32"), training=True).shape[0] == 3  # a partial batch in training


def test_ensemble_layer_refuses_an_uneven_batch_of_unknown_size_when_compiled():
    layer = tfbnn.layers.DenseBatchEnsemble(2, ensemble_size=2)
    call = tf.function(lambda x: layer(x), input_signature=[tf.TensorSpec([None, 4])])
    assert call(tf.ones((4, 4))).shape == (4, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"multiple of ensemble_size=2"):
        call(tf.ones((3, 4)))


# -- Laplace, HMC, SWAG: data and seeds -----------------------------------------------------------
def _classifier():
    import keras
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])


def _data(n=16):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.integers(0, 2, n)


@pytest.mark.parametrize("where", ["x", "y"])
def test_laplace_fit_refuses_nan_data_naming_the_argument(where):
    x, y = _data()
    if where == "x":
        x[3, 1] = np.nan
        labels = y
    else:
        labels = y.astype("float64")
        labels[5] = np.nan
    with pytest.raises(ValueError, match=rf"Expected `{where}` to hold finite numbers.*1 NaN or infinite"):
        tfbnn.laplace.fit(_classifier(), x, labels)


def test_laplace_fit_refuses_nan_in_a_dataset():
    x, y = _data()
    x[0, 0] = np.inf
    with pytest.raises(ValueError, match=r"Expected `x` to hold finite numbers"):
        tfbnn.laplace.fit(_classifier(), tf.data.Dataset.from_tensor_slices((x, y)).batch(8))


def test_laplace_refuses_a_negative_numpy_seed_naming_it():
    x, y = _data()
    la = tfbnn.laplace.fit(_classifier(), x, y)
    for call in (lambda: la.sample(3, seed=-1), lambda: la.predict(x, link_approx="mc", seed=-1)):
        with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\).*seed=-1"):
            call()
    # to_model refuses it as well (issue 36: a negative seed was accepted there and not elsewhere).
    with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\).*seed=-1"):
        la.to_model(seed=-1)
    assert la.to_model(seed=np.int64(1))(x).shape == (16, 2)


def _regression():
    import keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 1)).astype("float32")
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]), x, 2 * x


_HMC = dict(noise_scale=0.5, num_chains=1, num_results=2, num_burnin=0, jit_compile=False)


def test_hmc_refuses_a_negative_seed_naming_it():
    model, x, y = _regression()
    with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\)\. Received: seed=-1"):
        tfbnn.hmc.sample(model, x, y, seed=-1, **_HMC)


@pytest.mark.parametrize("where", ["x", "y"])
def test_hmc_refuses_nan_data(where):
    model, x, y = _regression()
    (x if where == "x" else y)[2, 0] = np.nan
    with pytest.raises(ValueError, match=rf"Expected `{where}` to hold finite numbers.*index \(2, 0\)"):
        tfbnn.hmc.sample(model, x, y, **_HMC)


def test_hmc_refuses_a_model_that_samples_at_inference():
    import keras
    _, x, y = _regression()
    model = keras.Sequential([keras.Input((1,)), tfbnn.layers.DenseFlipout(1, kl_weight=0.1, name="flip")])
    with pytest.raises(ValueError, match=r"deterministic at inference.*sampling layers \['flip'\]"):
        tfbnn.hmc.sample(model, x, y, **_HMC)
    tfbnn.set_inference_mode(model, "mean")  # the posterior mean is a deterministic network
    assert tfbnn.hmc.sample(model, x, y, **_HMC).samples.shape[:2] == (1, 2)


def test_swag_posterior_refuses_a_negative_seed():
    model, _, _ = _regression()
    p = len(tfbnn.inference.FlatWeights(model).flatten())
    with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\) or None.*seed=-1"):
        tfbnn.swag.SWAGPosterior(model, np.zeros(p), np.ones(p), np.ones((p, 2)), seed=-1)


# -- an interrupted run ---------------------------------------------------------------------------
def test_an_interrupted_run_leaves_no_staging_folder(tmp_path):
    import keras

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise KeyboardInterrupt  # Ctrl-C during fit

    recipe = tfbnn.training.get_recipe("digits-bbb-mlp").quick(max_examples=32, max_test_examples=16, batch_size=16)
    with pytest.raises(KeyboardInterrupt):
        tfbnn.training.run(recipe, output_dir=str(tmp_path / "run"), verbose=0, callbacks=[Interrupt()],
                           quiet=True, jit_compile=False)
    assert os.listdir(tmp_path) == []


# -- export and the command -----------------------------------------------------------------------
def _small_model():
    import keras
    return keras.Sequential([keras.Input((3,)), tfbnn.layers.DenseFlipout(2, activation="softmax", kl_weight=0.1)])


def test_export_refuses_what_is_not_a_model():
    with pytest.raises(TypeError, match=r"Expected `model` to be a keras.Model .* Received: model of type str"):
        tfbnn.export.export("str", "/tmp/never_written")


@pytest.mark.parametrize("format", ["saved_model", "tflite", "onnx"])
def test_export_to_a_folder_that_cannot_be_made_names_filepath(format, tmp_path):
    with pytest.raises(ValueError, match=r"'/proc/x' cannot be created \(No such file or directory\)\. "
                                         r"Received: filepath='/proc/x/y'"):
        tfbnn.export.export(_small_model(), "/proc/x/y", format=format)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"cannot be created \(a file is in the way\)"):
        tfbnn.export.export(_small_model(), str(tmp_path / "afile" / "y"), format=format)
    with pytest.raises(ValueError, match=r"'/proc' is not writable .* Received: filepath='/proc/y.tflite'"):
        tfbnn.export.export(_small_model(), "/proc/y.tflite", format=format)


def _command(argv, capsys):
    from tfbnn.cli import main
    status = main(argv)
    return status, capsys.readouterr().err


def test_the_export_command_to_an_unwritable_path_prints_one_line(tmp_path, capsys):
    path = str(tmp_path / "m.keras")
    _small_model().save(path)
    status, err = _command(["export", path, "--format", "tflite", "--output", "/proc/x/y.tflite"], capsys)
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("tfbnn: error: ") and "'/proc/x' cannot be created" in err


@pytest.mark.parametrize("command", [["export"], ["laplace", "--data", "digits"]])
def test_a_file_that_is_not_a_model_is_named_as_such(command, tmp_path, capsys):
    junk = tmp_path / "junk.keras"
    junk.write_text("junk")
    status, err = _command([command[0], str(junk), *command[1:]], capsys)
    assert status == 2  # a bad argument (issue 36; it was a RunError, 1, until then)
    assert err == (f"tfbnn: error: argument model: expected a .keras model (a zip archive), received '{junk}', "
                   f"which is not a zip archive (see 'tfbnn {command[0]} --help')\n")
    assert "File not found" not in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["recipes"], ["train", "--epochs", "1"]])
def test_the_command_on_the_jax_backend_prints_one_line(argv):
    """Running a command on the JAX backend: one line, status 2 (its --help still answers, as parsing needs no
    backend: tests/_internal/test_backend.py)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys, _tfbnn_command; sys.argv = ['tfbnn', *{argv!r}]; sys.exit(_tfbnn_command.main())"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KERAS_BACKEND": "jax"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("tfbnn: error: tfbnn needs the TensorFlow backend of Keras 3")
    assert "'jax' (from KERAS_BACKEND)" in done.stderr and done.stderr.count("\n") == 1
