"""The ``tfbnn`` command: one table of subcommands, each a module with ``add_arguments`` and ``run``.

:data:`COMMANDS` maps each subcommand to the module that implements it and the line
``tfbnn --help`` shows. ``tfbnn --help`` reads the table alone; only the chosen
command's module is imported, and it adds its options (``add_arguments(parser)``,
with its ``DESCRIPTION`` and optional ``EPILOG``) and runs (``run(args)``, or the
``func`` its options set). The modules a parser imports stay TensorFlow-free at their
top (``TENSORFLOW_FREE`` in ``tests/test_layering.py``); they load the numeric libraries
inside the functions that run.

Start-up: the console script's entry point is ``_tfbnn_command:main``, a module
outside this package, which registers the ``tfbnn`` package before its ``__init__``
runs. The command parses its arguments with TensorFlow-free modules first, then runs
``tfbnn/__init__.py`` (TensorFlow quietly, the core) and the command, so ``--help`` and
option errors answer at once.

Exit status: 0 on success, 2 on a bad option (one ``tfbnn: error: ...`` line on
stderr, no traceback), 1 when the run itself fails (the loss became NaN, a dataset
could not be loaded); a failed run never replaces a saved file.

Nothing in tfbnn imports this package.
"""

import importlib
import sys

from tfbnn import experiments
from tfbnn._internal.version import __version__
from tfbnn._internal import argtypes

__all__ = ["main", "build_parser", "COMMANDS", "PROG"]

PROG = "tfbnn"

#: Subcommand -> (module, one-line summary), in the order ``tfbnn --help`` lists them; the studies
#: come from :data:`tfbnn.experiments.STUDIES`.
COMMANDS = {
    "train": ("tfbnn.cli.train",
              "train a model of the zoo with one Bayesian method, evaluate it and save it (.keras)"),
    "run": ("tfbnn.cli.run", "run a recipe: a built-in study protocol by name (see `tfbnn recipes`) or a .json file"),
    "recipes": ("tfbnn.cli.recipes", "list the built-in recipes (the seed studies' protocols), or show one"),
    "evaluate": ("tfbnn.cli.evaluate",
                 "Monte Carlo metrics, calibration and shift curves of a saved model, as PNGs + JSON"),
    "export": ("tfbnn.cli.export", "export a saved model as a SavedModel with sample / mean / uncertainty endpoints"),
    "tune": ("tfbnn.cli.tune",
             "KerasTuner search: the Blundell scale-mixture prior grid (27 trials), resumable, distributable"),
    "laplace": ("tfbnn.cli.laplace",
                "post-hoc Laplace approximation of a saved model: fit, tune the prior, save (.npz) and evaluate (.json)"),
    **experiments.STUDIES,  # the one list of the studies
}

_DESCRIPTION = (
    "tfbnn: Bayesian deep learning as Keras 3 layers on TensorFlow Probability.\n"
    "\n"
    "Run `tfbnn <command> --help` for a command's options. `tfbnn train` with no\n"
    "options trains a Bayes-by-Backprop MLP on the offline digits dataset, prints its\n"
    "accuracy, NLL, ECE and uncertainty beside a deterministic baseline, and saves it\n"
    "under saved_models/. `tfbnn recipes` lists the studies' protocols; `tfbnn run NAME`\n"
    "runs one."
)


def add_command(subparsers, name):
    """Adds subcommand ``name`` of :data:`COMMANDS` to ``subparsers``, importing its module."""
    module_name, summary = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = subparsers.add_parser(name, help=summary, description=module.DESCRIPTION,
                                   epilog=getattr(module, "EPILOG", None), formatter_class=argtypes.HelpFormatter)
    parser.set_defaults(func=module.run)
    module.add_arguments(parser)
    return parser


def build_parser(command=None):
    """The ``tfbnn`` parser: every command listed, ``command``'s options added (None: all of them).

    ``tfbnn --help`` needs none of the modules; :func:`main` passes the command named in
    ``argv`` so that only its module is imported.
    """
    parser = argtypes.ArgumentParser(prog=PROG, formatter_class=argtypes.HelpFormatter, description=_DESCRIPTION,
                                     epilog="exit status: 0 success, 1 the run failed (nothing was overwritten), "
                                            "2 bad options")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    subparsers.required = True
    for name, (_, summary) in COMMANDS.items():
        if command is None or name == command:
            add_command(subparsers, name)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def _named_command(argv):
    """The subcommand ``argv`` names: its first word that is not an option (None if none is in the table)."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in COMMANDS else None


def main(argv=None):
    """Runs ``tfbnn`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Never raises ``SystemExit`` itself (the console script wraps it in ``sys.exit``).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    return argtypes.run_parsed(build_parser(_named_command(argv)), argv,
                               interrupted="interrupted; nothing was overwritten")


if __name__ == "__main__":
    sys.exit(main())
