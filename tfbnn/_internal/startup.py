"""Start-up of the `tfbnn` command (no TensorFlow import here).

The command's entry point (``_tfbnn_command.py``) registers the ``tfbnn`` package before
``tfbnn/__init__.py`` runs; the command parses its arguments first and then calls
:func:`complete_package_import`, which imports TensorFlow with its start-up chatter
filtered (:func:`import_tensorflow_quietly`) and runs ``tfbnn/__init__.py``. Library
users keep their own logging untouched.
"""

import os
import sys
import tempfile

from tfbnn._internal import allocator

# Lines TensorFlow writes to stderr while it loads on a CPU-only machine.
_TF_IMPORT_NOISE = (
    "WARNING: All log messages before absl::InitializeLog()",
    "I0000 ",
    "W0000 ",
    "To enable the following instructions",
    "failed call to cuInit",
)


def import_tensorflow_quietly():
    """Imports TensorFlow with its C++ start-up chatter filtered out of stderr.

    TF_CPP_MIN_LOG_LEVEL does not silence the lines TensorFlow 2.21 logs before
    absl is initialized (oneDNN, CUDA stubs), so stderr is captured at the file
    descriptor level while TensorFlow loads and initializes its devices, and
    everything except those known lines is written back. A no-op when
    TensorFlow is already imported.
    """
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    allocator.prefer_pooled_allocator()  # before TensorFlow first allocates (tfbnn/_internal/allocator.py)
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        import tensorflow  # noqa: F401

        return
    captured = tempfile.TemporaryFile()
    os.dup2(captured.fileno(), 2)
    try:
        import tensorflow as tf

        tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        captured.seek(0)
        text = captured.read().decode("utf-8", errors="replace")
        captured.close()
        kept = [line for line in text.splitlines() if not any(n in line for n in _TF_IMPORT_NOISE)]
        if kept:
            sys.stderr.write("\n".join(kept) + "\n")


def complete_package_import():
    """Finishes ``import tfbnn`` for the command: TensorFlow quietly, then ``tfbnn/__init__.py``.

    The command's entry point registered the package without running its ``__init__``
    (``_tfbnn_command.defer_package``); this runs it in that same module object, once. A
    no-op where the package was imported normally (a library user, the tests).

    Raises:
        tfbnn.BackendError: Keras is configured for another backend than TensorFlow.
    """
    import_tensorflow_quietly()
    package = sys.modules.get("tfbnn")
    if package is not None and "__all__" not in vars(package):  # __all__ is the last name __init__ binds
        package.__spec__.loader.exec_module(package)
