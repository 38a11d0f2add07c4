"""What the tensorflow-datasets loaders share: the size-limit check, one guarded ``tfds.load``, the reading."""

import os
import shutil

import numpy as np


def check_max(name, value):
    """``value`` as an int (a positive example count) or None; ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"Expected `{name}` to be a positive integer or None. Received: {name}={value!r}")
    return int(value)


# Examples per NumPy batch while a split is read into arrays.
_ITERATION_BATCH = 1024


def numpy_batches(ds, limit):
    """The ``(x, y)`` NumPy batches of a supervised ``tf.data.Dataset``, its first ``limit`` examples
    (None: all), read in batches (never ``batch_size=-1``, which would hold the split twice)."""
    if limit is not None:
        ds = ds.take(limit)
    return ds.batch(_ITERATION_BATCH).as_numpy_iterator()


def _data_dir(data_dir):
    import tensorflow_datasets as tfds

    return os.path.expanduser(data_dir or os.environ.get("TFDS_DATA_DIR") or tfds.core.constants.DATA_DIR)


def _entries(folder, name):
    """The files and folders a preparation of ``name`` may write under ``folder``."""
    found = set()
    for sub in (name, "downloads"):
        root = os.path.join(folder, sub)
        if os.path.isdir(root):
            for path, dirs, files in os.walk(root):
                found.update(os.path.join(path, n) for n in dirs + files)
            found.add(root)
    return found


def _remove_new(before, after):
    """Removes what a failed preparation added (newest first); what existed before stays."""
    for path in sorted(after - before, key=len, reverse=True):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            try:
                os.remove(path)
            except OSError:
                pass


def load_train_test(name, data_dir, download, offline_hint=""):
    """``((train, test), info)`` of ``tfds.load(name, split=["train", "test"], as_supervised=True)``.

    The splits are read in their stored order (``shuffle_files=False``). Failures
    become one RuntimeError that names the dataset and its true cause:

    * a module tensorflow-datasets needs is missing (an install problem, named with
      the ``pip install`` that fixes it), never reported as a network problem;
    * any other failure (network, missing files): the original error with the
      "no internet access?" question and ``offline_hint``. Files and folders the
      failed download or preparation left in the data folder are removed, so the
      next attempt starts clean; data prepared earlier is kept.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise RuntimeError(f"Could not load {name!r}: tensorflow-datasets cannot be imported ({e}). "
                           "Reinstall tfbnn's dependencies: pip install tensorflow-datasets") from e
    folder = _data_dir(data_dir)
    before = _entries(folder, name)
    try:
        return tfds.load(
            name,
            split=["train", "test"],
            as_supervised=True,
            with_info=True,
            shuffle_files=False,
            data_dir=data_dir,
            download=download,
        )
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
        raise RuntimeError(
            f"Could not load {name!r}: tensorflow-datasets needs the Python module {missing!r}, which is not "
            f"installed (an installation problem, not the network). Install it: pip install {missing}"
        ) from e
    except Exception as e:
        _remove_new(before, _entries(folder, name))
        raise RuntimeError(
            f"Could not load {name!r} with tensorflow-datasets, which downloads it on first use "
            f"(no internet access?{offline_hint}). {type(e).__name__}: {e}"
        ) from e


def num_classes(info, fallback):
    """The label feature's number of classes from the builder info, else ``fallback``."""
    try:
        return int(info.features["label"].num_classes)
    except (KeyError, AttributeError, TypeError):
        return fallback
