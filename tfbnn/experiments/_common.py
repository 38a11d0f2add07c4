"""What the iBNN experiments share: output files, the command-line plumbing, small losses.

Heavy imports (TensorFlow, Keras, tfbnn) happen inside functions, so that listing the
experiments' parsers in the ``tfbnn`` command stays fast.
"""

import csv
import json
import math
import os
import sys

__all__ = [
    "DEFAULT_ROOT",
    "prepare_output_dir",
    "write_csv",
    "write_json",
    "add_subcommand",
    "main",
    "check_finite_history",
    "fixed_noise_gaussian_nll",
    "IMAGE_DATASETS",
    "load_images",
    "quiet_tensorflow",
]

#: Datasets the classification experiments accept: ``digits`` is the offline stand-in
#: (scikit-learn's 8x8 digits as 8x8x1 images); ``fashion_mnist`` comes from tfds.
IMAGE_DATASETS = ("digits", "fashion_mnist")

#: Parent of every experiment's default output folder (git-ignored with saved_models/).
DEFAULT_ROOT = os.path.join("saved_models", "experiments")


def quiet_tensorflow():
    """Keeps TensorFlow's Python-side warnings (e.g. about retracing, expected when an
    experiment builds many models) out of an experiment's output."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")


def prepare_output_dir(path):
    """Creates ``path`` (and parents); fails early and clearly when it cannot be written."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output folder {path!r}: {e.strerror}. Received: --output-dir={path}") from None
    if not os.access(path, os.W_OK):
        raise ValueError(f"the output folder {path!r} is not writable. Received: --output-dir={path}")
    return path


def _plain(value):
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else str(value)
    if hasattr(value, "item"):  # NumPy scalars
        return _plain(value.item())
    return value


def write_csv(path, rows):
    """Writes a list of flat dicts as CSV (columns: the union of keys, in first-seen order)."""
    columns = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _plain(v) for k, v in row.items()})
    return path


def write_json(path, obj):
    """Writes ``obj`` as indented JSON (NumPy scalars converted)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=_plain)
    return path


def check_finite_history(history, what):
    """Raises the command's run failure (exit 1) when training produced NaN/inf losses."""
    losses = history.history.get("loss", [])
    if not losses or not all(math.isfinite(v) for v in losses):
        from tfbnn.cli import CommandError

        raise CommandError(f"training of {what} diverged (loss {losses[-1] if losses else 'missing'}); "
                           "try a smaller learning rate")


def fixed_noise_gaussian_nll(noise_std):
    """A Keras loss: per-example Gaussian NLL with a known noise scale (nats).

    ``0.5 ((y - f) / sigma)^2 + log sigma + 0.5 log(2 pi)``, averaged over output units.
    """
    import keras

    log_norm = math.log(noise_std) + 0.5 * math.log(2 * math.pi)

    def gaussian_nll(y_true, y_pred):
        z = (keras.ops.cast(y_true, y_pred.dtype) - y_pred) / noise_std
        return keras.ops.mean(0.5 * keras.ops.square(z), axis=-1) + log_norm

    return gaussian_nll


def load_images(name, seed=0, max_examples=None, max_test_examples=None):
    """An image classification dataset as an :class:`tfbnn.datasets.ArrayDataset` of ``(n, h, w, 1)`` images.

    ``"digits"`` is offline (scikit-learn's 1797 8x8 digits, 1437 train / 360 test,
    reshaped to 8x8x1; the stand-in for Fashion-MNIST on machines without internet);
    ``"fashion_mnist"`` comes from tensorflow-datasets (downloads once), 28x28x1.
    A download failure is the run's failure (exit status 1).
    """
    import numpy as np

    from tfbnn import datasets
    from tfbnn.cli import CommandError

    if name not in IMAGE_DATASETS:
        raise ValueError(f"Unknown dataset. Expected one of {list(IMAGE_DATASETS)}. Received: dataset={name!r}")
    if name == "digits":
        if max_examples is not None or max_test_examples is not None:
            raise ValueError(f"--max-examples applies to fashion_mnist, not digits. Received: max_examples={max_examples}")
        ds, side = datasets.load("digits", seed=seed), 8
    else:
        try:
            ds = datasets.load_tfds(name, max_examples=max_examples, max_test_examples=max_test_examples)
        except RuntimeError as e:
            raise CommandError(str(e)) from None
        side = 28

    def images(x):
        return np.ascontiguousarray(x.reshape(len(x), side, side, 1), dtype=np.float32)

    return datasets.ArrayDataset(images(ds.x_train), ds.y_train, images(ds.x_test), ds.y_test,
                                 num_classes=ds.num_classes, name=ds.name)


# -- command-line plumbing (the pattern of tfbnn.cli) ----------------------------------------


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



def add_subcommand(subparsers, name, help_text, description, add_arguments, run):
    """Adds ``name`` to a ``tfbnn``-style subparsers action with ``func=run``."""
    from tfbnn import cli

    parser = subparsers.add_parser(name, help=help_text, description=description, formatter_class=cli._HelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def main(module, description, add_arguments, run, argv=None):
    """``python -m tfbnn.experiments.<module>``: parse, run, map errors to exit statuses.

    As the ``tfbnn`` command: 0 success, 2 bad options (one ``error:`` line), 1 the run failed.
    """
    from tfbnn import cli

    class ArgumentParser(cli._ArgumentParser):
        def error(self, message):  # one line, named after this program rather than `tfbnn`
            self.exit(2, f"{self.prog}: error: {cli._one_line(message)} (see '{self.prog} --help')\n")

    parser = ArgumentParser(
        prog=f"python -m tfbnn.experiments.{module}", description=description, formatter_class=cli._HelpFormatter
    )
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    try:
        return run(args)
    except ValueError as e:
        print(f"{parser.prog}: error: {cli._one_line(e)}", file=sys.stderr)
        return 2
    except cli.CommandError as e:
        print(f"{parser.prog}: error: {cli._one_line(e)}", file=sys.stderr)
        return e.exit_status
