"""The backend contract: on a Keras backend other than TensorFlow, `import tfbnn` raises one clear error."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _import_tfbnn(env_update, home):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    env.update({"PYTHONPATH": ROOT, "HOME": str(home), **env_update})
    return subprocess.run([sys.executable, "-c", "import tfbnn; print('imported', tfbnn.__version__)"],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_non_tensorflow_backend_from_the_environment_is_refused(backend, tmp_path):
    result = _import_tfbnn({"KERAS_BACKEND": backend}, tmp_path)
    assert result.returncode != 0
    assert "tfbnn._internal.backend.BackendError" in result.stderr
    assert f"the Keras backend is {backend!r} (from KERAS_BACKEND)" in result.stderr
    assert "export KERAS_BACKEND=tensorflow" in result.stderr
    # The check runs before TensorFlow loads: no TensorFlow log lines.
    assert "oneDNN" not in result.stderr


def test_a_non_tensorflow_backend_from_keras_json_is_refused(tmp_path):
    keras_home = tmp_path / "keras_home"
    keras_home.mkdir()
    (keras_home / "keras.json").write_text(json.dumps({"backend": "jax", "floatx": "float32"}))
    result = _import_tfbnn({"KERAS_HOME": str(keras_home)}, tmp_path)
    assert result.returncode != 0
    assert f"the Keras backend is 'jax' (from {keras_home / 'keras.json'})" in result.stderr


def test_the_environment_overrides_keras_json_as_in_keras(tmp_path):
    keras_home = tmp_path / "keras_home"
    keras_home.mkdir()
    (keras_home / "keras.json").write_text(json.dumps({"backend": "torch"}))
    result = _import_tfbnn({"KERAS_HOME": str(keras_home), "KERAS_BACKEND": "tensorflow"}, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "imported" in result.stdout


def test_the_error_is_public_and_an_import_error():
    import tfbnn

    assert issubclass(tfbnn.BackendError, ImportError)
    assert tfbnn.BackendError.__module__ == "tfbnn._internal.backend"


def test_the_command_answers_help_on_any_backend_and_refuses_to_run_in_one_line(tmp_path):
    """`tfbnn --help` parses before the package's core (and its backend check) loads; running a command
    on the JAX backend is one `tfbnn: error:` line and exit status 2, no traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    env.update({"PYTHONPATH": ROOT, "HOME": str(tmp_path), "KERAS_BACKEND": "jax"})

    def command(*argv):
        code = f"import sys, _tfbnn_command; sys.argv = ['tfbnn', *{list(argv)!r}]; sys.exit(_tfbnn_command.main())"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)

    shown = command("--help")
    assert shown.returncode == 0 and "usage: tfbnn" in shown.stdout and shown.stderr == ""
    refused = command("recipes")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfbnn: error: tfbnn needs the TensorFlow backend"), lines
    assert "the Keras backend is 'jax' (from KERAS_BACKEND)" in lines[0]
