"""The ``tfbnn`` command: one module per subcommand, on top of everything else.

=========================  ==========================================================
subcommand                 module
=========================  ==========================================================
``tfbnn train``            :mod:`tfbnn.cli.train` (a recipe from flags; the main job)
``tfbnn run RECIPE``       :mod:`tfbnn.cli.recipes` (a built-in name or a .json file)
``tfbnn recipes``          :mod:`tfbnn.cli.recipes` (list, or ``--show NAME``)
``tfbnn evaluate``         :mod:`tfbnn.cli.evaluate`
``tfbnn export``           :mod:`tfbnn.cli.export`
``tfbnn tune``             :mod:`tfbnn.cli.tune`
``tfbnn vd-sparsity`` ...  :mod:`tfbnn.cli.experiments` (the studies of tfbnn.experiments)
=========================  ==========================================================

Exit status: 0 on success, 2 on a bad option (one ``tfbnn: error: ...`` line on
stderr, no traceback), 1 when the run itself fails (the loss became NaN, a dataset
could not be loaded); a failed run never replaces a saved file. Arguments are parsed
before TensorFlow is imported, so ``--help`` and option errors answer at once.

Nothing in tfbnn imports this package.
"""

import sys

from tfbnn._internal import argtypes
from tfbnn.cli import evaluate, experiments, export, recipes, train, tune

__all__ = ["main", "build_parser", "SUBCOMMANDS", "PROG"]

PROG = "tfbnn"

#: The subcommands, in the order ``tfbnn --help`` lists them. Each adds its parser
#: to the subparsers action and sets ``func``.
SUBCOMMANDS = [
    train.add_parser,
    recipes.add_run_parser,
    recipes.add_recipes_parser,
    evaluate.add_parser,
    export.add_parser,
    tune.add_parser,
    *experiments.PARSERS,
]


def build_parser():
    """The ``tfbnn`` argument parser with every subcommand of :data:`SUBCOMMANDS`."""
    parser = argtypes.ArgumentParser(
        prog=PROG,
        formatter_class=argtypes.HelpFormatter,
        description=(
            "tfbnn: Bayesian deep learning as Keras 3 layers on TensorFlow Probability.\n"
            "\n"
            "Run `tfbnn <command> --help` for a command's options. `tfbnn train` with no\n"
            "options trains a Bayes-by-Backprop MLP on the offline digits dataset, prints its\n"
            "accuracy, NLL, ECE and uncertainty beside a deterministic baseline, and saves it\n"
            "under saved_models/. `tfbnn recipes` lists the studies' protocols; `tfbnn run NAME`\n"
            "runs one."
        ),
        epilog="exit status: 0 success, 1 the run failed (nothing was overwritten), 2 bad options",
    )
    from tfbnn import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    subparsers.required = True
    for add_parser in SUBCOMMANDS:
        add_parser(subparsers)
    return parser


def main(argv=None):
    """Runs ``tfbnn`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Never raises ``SystemExit`` itself (the console script wraps it in ``sys.exit``).
    """
    return argtypes.run_parsed(build_parser(), argv, interrupted="interrupted; nothing was overwritten")


if __name__ == "__main__":
    sys.exit(main())
