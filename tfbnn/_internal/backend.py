"""The Keras backend contract: tfbnn runs on Keras 3 with the TensorFlow backend only.

tfbnn's layers are built on TensorFlow Probability and TensorFlow ops (stateless
random ops, ``tf.function``, ``tf.distribute``, SavedModel export). On the JAX or
PyTorch backend Keras would hand them JAX arrays or torch tensors, and the first
call would fail far from the cause (``'tuple' object has no attribute 'rank'``).
:func:`check` runs when ``import tfbnn`` starts, before TensorFlow loads: it finds the
backend the way Keras does (an already imported Keras's own answer; otherwise the
``KERAS_BACKEND`` environment variable, then ``"backend"`` in ``$KERAS_HOME/keras.json``
or ``~/.keras/keras.json``, then Keras' default, TensorFlow) and raises one clear error.
"""

import json
import os
import sys

__all__ = ["BackendError", "check", "configured_backend"]


class BackendError(ImportError):
    """tfbnn was imported with a Keras backend other than TensorFlow."""


def _config_file():
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    for folder in (home, "/tmp/.keras"):  # Keras falls back to /tmp/.keras when home is not writable
        path = os.path.join(folder, "keras.json")
        if os.path.exists(path):
            return path
    return None


def configured_backend():
    """The Keras backend this process uses or will use, without importing Keras."""
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend") and hasattr(keras.backend, "backend"):
        return keras.backend.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    path = _config_file()
    if path is not None:
        try:
            with open(path) as f:
                return json.load(f).get("backend", "tensorflow")
        except (OSError, ValueError):
            return "tensorflow"  # Keras ignores an unreadable config too
    return "tensorflow"


def check():
    """Raises :class:`BackendError` unless the Keras backend is TensorFlow."""
    backend = configured_backend()
    if backend != "tensorflow":
        source = "KERAS_BACKEND" if os.environ.get("KERAS_BACKEND") else (_config_file() or "keras")
        raise BackendError(
            f"tfbnn needs the TensorFlow backend of Keras 3 (its layers are TensorFlow Probability "
            f"and TensorFlow ops), but the Keras backend is {backend!r} (from {source}). Select "
            "TensorFlow before importing Keras or tfbnn: `export KERAS_BACKEND=tensorflow`, or "
            "`os.environ['KERAS_BACKEND'] = 'tensorflow'` at the top of the program, or set "
            "\"backend\": \"tensorflow\" in ~/.keras/keras.json."
        )
