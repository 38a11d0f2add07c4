"""What the studies share: settings and their checks, the options of their command lines, output files.

A study the ``tfbnn`` command runs (:data:`tfbnn.cli.COMMANDS`) is imported by
``tfbnn <study> --help``, so its module level (and this module's) loads no NumPy, TensorFlow,
Keras or matplotlib: the functions that run the study import them (the list of those imports
and why is ``FUNCTION_LOCAL_IMPORTS`` in ``tests/test_layering.py``). What loads none of them
is imported at the top: the standard library, ``tfbnn`` itself, :mod:`tfbnn.training` (the
recipes and the runner), the :mod:`tfbnn.datasets` package and the package-wide plumbing.
"""

import math
import os

from tfbnn._internal import argtypes, files
from tfbnn._internal.errors import RunError

__all__ = [
    "DEFAULT_ROOT",
    "OPTIONS",
    "prepare_output_dir",
    "write_csv",
    "write_json",
    "write_results",
    "jsonable",
    "settings",
    "check_names",
    "check_integers",
    "check_integer_lists",
    "check_positive_numbers",
    "check_finite_history",
    "array_pipeline",
    "quiet_tensorflow",
    "init_scale",
    "add_options",
    "add_output_dir",
    "run_with_settings",
    "main",
]

#: Parent of every experiment's default output folder (git-ignored with saved_models/).
DEFAULT_ROOT = os.path.join("saved_models", "experiments")


def quiet_tensorflow():
    """Keeps TensorFlow's Python-side warnings (e.g. about retracing, expected when an
    experiment builds many models) out of an experiment's output."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")


# -- output files ----------------------------------------------------------------------------


def prepare_output_dir(path):
    """Creates ``path`` (and parents); fails early and clearly when it cannot be written."""
    return files.prepare_output_dir(path, "--output-dir")


write_csv = files.write_csv
write_json = files.write_json


def jsonable(s):
    """The settings ``s`` as JSON has them (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in s.items()}


def write_results(output_dir, rows, s, **extra):
    """``results.csv`` (``rows``) and ``results.json`` (``{"settings": s, **extra, "rows": rows}``) in
    ``output_dir``; returns their paths."""
    return [write_csv(os.path.join(output_dir, "results.csv"), rows),
            write_json(os.path.join(output_dir, "results.json"), {"settings": jsonable(s), **extra, "rows": rows})]


# -- settings ------------------------------------------------------------------------------------


def settings(defaults, overrides, tuples=(), unique=()):
    """A study's settings: ``defaults`` (its ``DEFAULTS``) updated by ``overrides`` (its ``**settings``).

    The values of ``tuples`` become tuples, those of ``unique`` tuples without repeats.

    Raises:
        ValueError: an override that is not a setting.
    """
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"Unknown settings {unknown}. Expected some of {sorted(defaults)}")
    s = {**defaults, **overrides}
    for key in tuples:
        s[key] = tuple(s[key])
    for key in unique:
        s[key] = tuple(dict.fromkeys(s[key]))
    return s


def check_names(s, key, allowed):
    """``s[key]``: a non-empty sequence of names from ``allowed``; else a ValueError naming ``key``."""
    if not s[key] or any(v not in allowed for v in s[key]):
        raise ValueError(f"Expected `{key}` from {list(allowed)}. Received: {key}={s[key]!r}")


def _integer(v, minimum):
    return not isinstance(v, bool) and isinstance(v, int) and v >= minimum


def check_integers(s, keys, minimum=1):
    """``s[key]`` for each of ``keys``: an int >= ``minimum``; else a ValueError naming the key."""
    what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
    for key in keys:
        if not _integer(s[key], minimum):
            raise ValueError(f"Expected `{key}` to be {what}. Received: {key}={s[key]!r}")


def check_integer_lists(s, keys, minimum=1):
    """``s[key]`` for each of ``keys``: a non-empty sequence of ints >= ``minimum``; else a ValueError."""
    what = {0: "non-negative integers", 1: "positive integers"}.get(minimum, f"integers >= {minimum}")
    for key in keys:
        if not s[key] or not all(_integer(v, minimum) for v in s[key]):
            raise ValueError(f"Expected `{key}` to be {what}. Received: {key}={s[key]!r}")


def check_positive_numbers(s, keys):
    """``s[key]`` for each of ``keys``: a positive finite number; else a ValueError naming the key."""
    for key in keys:
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise ValueError(f"Expected `{key}` to be a positive number. Received: {key}={v!r}")


def check_finite_history(history, what):
    """Raises the command's run failure (exit 1) when training produced NaN/inf losses."""
    losses = history.history.get("loss", [])
    if not losses or not all(math.isfinite(v) for v in losses):
        raise RunError(f"training of {what} diverged (loss {losses[-1] if losses else 'missing'}); "
                       "try a smaller learning rate")


def array_pipeline(x_train, y_train, name, batch_size, num_classes=None, num_test=0):
    """In-memory training arrays as :func:`tfbnn.training.run`'s ``data``: Keras batches them
    (``batch_size``) and reshuffles them every epoch, as ``model.fit(x, y, shuffle=True)``; the
    study evaluates on its own test arrays (``test`` is None)."""
    from tfbnn.datasets import DataPipeline

    return DataPipeline(train=(x_train, y_train), validation=None, test=None, num_examples=len(x_train),
                        num_validation=0, num_test=num_test, num_classes=num_classes,
                        input_shape=tuple(x_train.shape[1:]), name=name, batch_size=batch_size)


# -- command-line plumbing (the pattern of the tfbnn command) --------------------------------


def init_scale(text):
    """``--init-scale``: a positive number or ``moped``."""
    return text if text == "moped" else argtypes.positive_float(text)


#: The options several studies share: setting -> ``add_argument`` keywords. :func:`add_options`
#: adds them as ``--setting-name`` with the study's default (and, where it gives one, its help).
OPTIONS = {
    "hidden_units": {"type": argtypes.positive_int, "help": "units per hidden layer"},
    "depth": {"type": argtypes.positive_int, "help": "hidden layers"},
    "pretrain_epochs": {"type": argtypes.non_negative_int,
                        "help": "epochs of the deterministic model before conversion"},
    "epochs": {"type": argtypes.positive_int, "help": "epochs per model"},
    "warmup_epochs": {"type": argtypes.finite_float, "help": "epochs with beta = 0 after conversion"},
    "anneal_epochs": {"type": argtypes.positive_float, "help": "epochs of the beta ramp 0 -> 1 after the warm-up"},
    "batch_size": {"type": argtypes.positive_int, "help": "minibatch size"},
    "learning_rate": {"type": argtypes.positive_float, "help": "Adam learning rate of the weights"},
    "variational_learning_rate": {"type": argtypes.positive_float,
                                  "help": "iBNN: Adam rate of the node parameters"},
    "num_components": {"type": argtypes.positive_int, "metavar": "K", "help": "iBNN mixture components"},
    "prior_stddev": {"type": argtypes.positive_float, "metavar": "S", "help": "iBNN prior N(1, S^2)"},
    "samples_per_component": {"type": argtypes.positive_int, "metavar": "n",
                              "help": "test samples: K * n for both methods"},
    "dropout_rate": {"type": argtypes.open_unit_interval, "help": "MC dropout rate"},
    "init_scale": {"type": init_scale,
                   "help": "initial posterior std after conversion: a number, or moped (delta * |w|)"},
    "moped_delta": {"type": argtypes.positive_float, "help": "MOPED delta"},
    "num_samples": {"type": argtypes.positive_int, "metavar": "T", "help": "Monte Carlo samples of the predictive"},
    "max_examples": {"type": argtypes.positive_int, "metavar": "N",
                     "help": "fashion_mnist: at most N training examples"},
    "max_test_examples": {"type": argtypes.positive_int, "metavar": "N",
                          "help": "fashion_mnist: at most N test examples"},
    "seed": {"type": argtypes.non_negative_int, "help": "seed of data and models"},
}


def add_options(parser, defaults, *names, **helps):
    """Adds the :data:`OPTIONS` ``names`` to ``parser`` in that order, each with its default from
    ``defaults`` (the study's ``DEFAULTS``) and its help from ``helps`` where given."""
    for name in names:
        options = {**OPTIONS[name], "default": defaults[name]}
        if name in helps:
            options["help"] = helps[name]
        parser.add_argument("--" + name.replace("_", "-"), **options)


def add_output_dir(parser, name, what):
    """``--output-dir``, by default ``saved_models/experiments/<name>``, where ``what`` go."""
    parser.add_argument("--output-dir", default=os.path.join(DEFAULT_ROOT, name), metavar="DIR",
                        help=f"where {what} go")


def run_with_settings(args, defaults, run_experiment, banner=None, **overrides):
    """The ``run(args)`` of an experiment: settings from ``args`` (``defaults`` for the
    missing ones, then ``overrides``), ``banner`` (when given), the run and the list of
    written files. Returns the exit status 0.

    ``run_experiment`` checks the settings and then prepares its output folder, so a bad
    setting leaves no folder behind.
    """
    s = {k: getattr(args, k, v) for k, v in defaults.items()}
    s.update(overrides)
    quiet_tensorflow()
    if banner is not None:
        print(banner, flush=True)
    result = run_experiment(output_dir=args.output_dir, **s)
    print("\nWrote " + ", ".join(result["files"]))
    return 0


def main(module, description, add_arguments, run, argv=None):
    """``python -m tfbnn.experiments.<module>``: parse, run, map errors to exit statuses.

    As the ``tfbnn`` command: 0 success, 2 bad options (one ``error:`` line), 1 the run failed.
    """
    parser = argtypes.ArgumentParser(prog=f"python -m tfbnn.experiments.{module}", description=description,
                                     formatter_class=argtypes.HelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return argtypes.run_parsed(parser, argv)
