"""Ground-level command-line plumbing: the argument validators, the parser and the help format.

Every ``tfbnn`` subcommand and every ``python -m tfbnn.experiments.<name>`` entry point
takes its option types from here, so a value is checked one way everywhere and its
error names the flag and the value. Nothing here imports TensorFlow: the command
parses its arguments before TensorFlow starts.
"""

import argparse
import math
import os
import re
import sys
import zipfile

from tfbnn._internal import startup
from tfbnn._internal.backend import BackendError
from tfbnn._internal.errors import RunError

__all__ = [
    "ArgumentParser",
    "HelpFormatter",
    "one_line",
    "positive_int",
    "non_negative_int",
    "finite_float",
    "positive_float",
    "non_negative_float",
    "open_unit_interval",
    "rate",
    "number_list",
    "int_list",
    "name_list",
    "port",
    "keras_path",
    "existing_model",
    "verbosity",
    "run_parsed",
    "in_flags",
    "STRATEGIES",
    "add_strategy_argument",
]

#: tf.distribute strategies by name (:func:`tfbnn.distribute.get_strategy`).
STRATEGIES = ("auto", "default", "mirrored", "multi_worker")


def one_line(message):
    """``message`` on one line (whitespace collapsed)."""
    return " ".join(str(message).split())


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``<prog>: error: ...`` line (exit status 2)."""

    def error(self, message):
        prog = self.prog.split()[0] if self.prog.startswith("tfbnn") else self.prog
        self.exit(2, f"{prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and appends "(default: ...)" to every option with a default.

    Defaults equal to 0, 1 or False are shown too; only None, flags (store_true) and
    suppressed defaults are left out.
    """

    def __init__(self, prog):
        try:
            width = os.get_terminal_size().columns
        except OSError:
            width = 100
        super().__init__(prog, max_help_position=32, width=min(100, width))

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or action.default is None or action.default is argparse.SUPPRESS:
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


def _number(text, what, convert=float):
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text):
    value = _number(text, "a positive integer", int)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def samples_or_auto(text):
    """Monte Carlo samples: a positive integer, or ``auto`` (adaptive sampling, :func:`tfbnn.predict`)."""
    if text == "auto":
        return text
    value = _number(text, "a positive integer or 'auto'", int)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}")
    return value


def non_negative_int(text):
    value = _number(text, "a non-negative integer", int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def finite_float(text):
    return _number(text, "a finite number")


def positive_float(text):
    value = _number(text, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative_float(text):
    value = _number(text, "a non-negative number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def open_unit_interval(text):
    value = _number(text, "a number in the open interval (0, 1)")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in the open interval (0, 1), got {text!r}")
    return value


def rate(text):
    """A dropout rate or a momentum: a number in [0, 1)."""
    value = _number(text, "a number in [0, 1)")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def number_list(text):
    """``"0.25,0.5,0.75"`` -> ``(0.25, 0.5, 0.75)``; the library checks the ranges."""
    try:
        values = tuple(float(t.strip()) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return values


def int_list(text):
    try:
        return tuple(int(t.strip()) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def name_list(choices):
    """A parser of comma-separated names from ``choices``."""

    def parse(text):
        values = tuple(t.strip() for t in text.split(","))
        unknown = [v for v in values if v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown[0]!r}; expected names from {', '.join(choices)}")
        return values

    return parse


def port(text):
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {text!r}")
    return value


def keras_path(text):
    """A path for a new ``.keras`` file."""
    if not text.endswith(".keras"):
        raise argparse.ArgumentTypeError(f"expected a file name ending in '.keras', got {text!r}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a file, got the existing folder {text!r}")
    return text


def existing_model(text):
    """An existing ``.keras`` file: a zip archive (what a ``.keras`` file is), checked before TensorFlow starts."""
    if not os.path.isfile(text) or not text.endswith(".keras"):
        raise argparse.ArgumentTypeError(f"expected an existing .keras file, received {text!r}")
    if not zipfile.is_zipfile(text):
        raise argparse.ArgumentTypeError(f"expected a .keras model (a zip archive), received {text!r}, which is "
                                         "not a zip archive")
    return text


def verbosity(verbose):
    """Keras ``fit`` verbosity: ``verbose``, or 1 on a terminal and 2 when the output is redirected."""
    if verbose is not None:
        return verbose
    isatty = getattr(sys.stdout, "isatty", None)
    return 1 if isatty is not None and isatty() else 2


def _flags(parser):
    """``{dest: "--flag"}`` of every optional argument of ``parser`` and its subcommands."""
    flags = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags.update(_flags(sub))
        elif action.option_strings and action.dest not in ("help", "version"):
            # A --x/--no-x pair (BooleanOptionalAction) is named by its positive flag.
            names = [o for o in action.option_strings if not o.startswith("--no-")] or action.option_strings
            flags.setdefault(action.dest, max(names, key=len))
    return flags


def in_flags(message, parser):
    """``message`` with the library's argument names (`` `pi` ``, ``overwrite=True``) as the
    command's flags (``--pi``, ``--overwrite=True``): a command-line user never sees Python names."""
    for dest, flag in _flags(parser).items():
        message = re.sub(rf"`{re.escape(dest)}`", flag, message)
        message = re.sub(rf"(?<![\w\-`]){re.escape(dest)}=", f"{flag}=", message)
    return message


def run_parsed(parser, argv, interrupted=None):
    """Parses ``argv`` with ``parser`` and runs the chosen ``func``; returns the exit status.

    ``--help``: 0; a bad option (argparse, or a ``ValueError`` / ``TypeError`` of the
    library, its argument names written as flags: :func:`in_flags`): one
    ``<prog>: error: ...`` line and 2; a :class:`tfbnn.RunError`:
    its line and 1; with ``interrupted``, Ctrl-C prints ``<prog>: <interrupted>`` and
    gives 130. TensorFlow and the library's core load (quietly) only after the arguments
    parsed (:func:`tfbnn._internal.startup.complete_package_import`); a Keras backend other
    than TensorFlow is one ``<prog>: error: ...`` line and 2.
    """
    prog = parser.prog
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    try:
        startup.complete_package_import()
    except BackendError as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"{prog}: error: {in_flags(one_line(e), parser)}", file=sys.stderr)
        return 2
    except RunError as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return 130


def add_strategy_argument(parser):
    """Adds ``--strategy`` and ``--cpu-devices`` to an ``argparse`` parser (or group).

    Use :func:`tfbnn.distribute.strategy_from_args` on the parsed namespace, before
    TensorFlow has run any op (``--cpu-devices`` splits the CPU, which must happen first).
    """
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="tf.distribute strategy: auto = multi_worker when TF_CONFIG lists several tasks, mirrored "
        "with several local GPUs, default otherwise; mirrored = MirroredStrategy over the local GPUs "
        "(or the logical CPUs of --cpu-devices); multi_worker = MultiWorkerMirroredStrategy over the "
        "TF_CONFIG cluster (run the same command on every worker). --batch-size is the global batch; "
        "XLA is turned off with several replicas",
    )
    parser.add_argument("--cpu-devices", type=positive_int, default=None, metavar="K",
                        help="split the CPU into K logical devices (to try --strategy mirrored without GPUs)")
    return parser
