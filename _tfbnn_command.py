"""The ``tfbnn`` console script's entry point: the command parses before TensorFlow loads.

``import tfbnn`` loads the library's core (TensorFlow, Keras and the layers, so that saved
models deserialize), which takes seconds, and it always does: ``tfbnn/__init__.py`` has
one behaviour. The command should answer ``--help`` and a bad option at once, so its
entry point is this module, outside the package. Importing it puts the ``tfbnn`` package
in ``sys.modules`` *before its ``__init__`` has run* (:func:`defer_package`): the
command's parsers, which import only TensorFlow-free modules (listed in
``tests/test_layering.py``), load from it as submodules; after the arguments parsed,
:func:`tfbnn._internal.startup.complete_package_import` runs ``tfbnn/__init__.py``
(TensorFlow quietly, then the core) and the command runs with the whole library.
Library users never import this module.
"""

import importlib.util
import sys


def defer_package():
    """Registers the ``tfbnn`` package without running its ``__init__`` (a no-op when it is loaded).

    The package's submodules import from it as usual; the module object is the one
    ``tfbnn/__init__.py`` later runs in, so ``tfbnn`` names one module throughout.
    """
    if "tfbnn" in sys.modules:
        return
    spec = importlib.util.find_spec("tfbnn")
    sys.modules["tfbnn"] = importlib.util.module_from_spec(spec)


defer_package()
# Also when run as a script (`python _tfbnn_command.py`), where this module is __main__.
sys.modules.setdefault("_tfbnn_command", sys.modules[__name__])


def main():
    """The ``tfbnn`` command: parses ``sys.argv[1:]``, runs, returns the exit status.

    A Keras backend other than TensorFlow (``KERAS_BACKEND=jax``) does not stop the parse
    (``--help`` answers); running a command then prints the backend error as one
    ``tfbnn: error: ...`` line, status 2 (:func:`tfbnn._internal.argtypes.run_parsed`).
    """
    from tfbnn.cli import main as command

    return command(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
