"""The ``tfbnn`` console script's entry point: the command parses before TensorFlow loads.

``import tfbnn`` loads the library's core (TensorFlow, Keras and the layers, so that saved
models deserialize), which takes seconds. The command should answer ``--help`` and a
bad option at once, so its entry point is this module, outside the package: importing
it sets :data:`DEFER_CORE` before anything of tfbnn is imported, ``tfbnn/__init__.py``
then leaves its core to load on first use, and :func:`tfbnn.cli.main` imports
TensorFlow (quietly) only after the arguments parsed.
"""

import sys

#: Read by ``tfbnn/__init__.py``: the command, not a library user, is importing tfbnn.
DEFER_CORE = True
# Also when run as a script (`python _tfbnn_command.py`), where this module is __main__.
sys.modules.setdefault("_tfbnn_command", sys.modules[__name__])


def main():
    """The ``tfbnn`` command: parses ``sys.argv[1:]``, runs, returns the exit status.

    A Keras backend other than TensorFlow (``KERAS_BACKEND=jax``) stops ``import tfbnn`` with a
    ``BackendError``; the command prints its message as one ``tfbnn: error: ...`` line (status 2),
    ``--help`` included, rather than a traceback.
    """
    try:
        from tfbnn.cli import main as command
    except ImportError as e:
        if type(e).__name__ != "BackendError":  # tfbnn._internal.backend.BackendError, not importable here
            raise
        print(f"tfbnn: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return command(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
