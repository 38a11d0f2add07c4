"""What the studies share: output files, in-memory data, the ``python -m`` entry point.

A study's settings, their checks and its command line come from its :class:`tfbnn.experiments.Study`
(:mod:`tfbnn.experiments._study`).

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
    "prepare_output_dir",
    "write_csv",
    "write_json",
    "write_results",
    "jsonable",
    "check_finite_history",
    "array_pipeline",
    "quiet_tensorflow",
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


def main(module, description, add_arguments, run, argv=None):
    """``python -m tfbnn.experiments.<module>``: parse, run, map errors to exit statuses.

    As the ``tfbnn`` command: 0 success, 2 bad options (one ``error:`` line), 1 the run failed.
    """
    parser = argtypes.ArgumentParser(prog=f"python -m tfbnn.experiments.{module}", description=description,
                                     formatter_class=argtypes.HelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return argtypes.run_parsed(parser, argv)
