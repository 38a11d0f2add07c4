"""What the iBNN experiments share: output files, the command-line plumbing, small losses.

Heavy imports (TensorFlow, Keras, tfbnn) happen inside functions, so that listing the
experiments' parsers in the ``tfbnn`` command stays fast.
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
    "main",
    "check_finite_history",
    "fixed_noise_gaussian_nll",
    "array_pipeline",
    "quiet_tensorflow",
]

#: Parent of every experiment's default output folder (git-ignored with saved_models/).
DEFAULT_ROOT = os.path.join("saved_models", "experiments")


def quiet_tensorflow():
    """Keeps TensorFlow's Python-side warnings (e.g. about retracing, expected when an
    experiment builds many models) out of an experiment's output."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")


def prepare_output_dir(path):
    """Creates ``path`` (and parents); fails early and clearly when it cannot be written."""
    return files.prepare_output_dir(path, "--output-dir")


write_csv = files.write_csv
write_json = files.write_json


def check_finite_history(history, what):
    """Raises the command's run failure (exit 1) when training produced NaN/inf losses."""
    losses = history.history.get("loss", [])
    if not losses or not all(math.isfinite(v) for v in losses):
        raise RunError(f"training of {what} diverged (loss {losses[-1] if losses else 'missing'}); "
                       "try a smaller learning rate")


def fixed_noise_gaussian_nll(noise_std):
    """A Keras loss: per-example Gaussian NLL with a known noise scale (nats): the loss of a
    ``likelihood="gaussian"`` recipe (:func:`tfbnn.training.run.fixed_noise_gaussian_nll`)."""
    from tfbnn.training.run import fixed_noise_gaussian_nll as loss

    return loss(noise_std)


def array_pipeline(x_train, y_train, name, batch_size, num_classes=None, num_test=0):
    """In-memory training arrays as :func:`tfbnn.training.run`'s ``data``: Keras batches them
    (``batch_size``) and reshuffles them every epoch, as ``model.fit(x, y, shuffle=True)``; the
    study evaluates on its own test arrays (``test`` is None)."""
    from tfbnn.datasets import DataPipeline

    return DataPipeline(train=(x_train, y_train), validation=None, test=None, num_examples=len(x_train),
                        num_validation=0, num_test=num_test, num_classes=num_classes,
                        input_shape=tuple(x_train.shape[1:]), name=name, batch_size=batch_size)


# -- command-line plumbing (the pattern of the tfbnn command) --------------------------------


def run_with_settings(args, defaults, run_experiment, banner, **overrides):
    """The ``run(args)`` of an experiment: settings from ``args`` (``defaults`` for the
    missing ones, then ``overrides``), a prepared output folder, ``banner``, the run and
    the list of written files. Returns the exit status 0.
    """
    settings = {k: getattr(args, k, v) for k, v in defaults.items()}
    settings.update(overrides)
    prepare_output_dir(args.output_dir)
    quiet_tensorflow()
    print(banner, flush=True)
    result = run_experiment(output_dir=args.output_dir, **settings)
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
