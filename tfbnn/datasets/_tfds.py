"""What the tensorflow-datasets loaders share: the size-limit check and one guarded ``tfds.load``."""

import numpy as np


def check_max(name, value):
    """``value`` as an int (a positive example count) or None; ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"Expected `{name}` to be a positive integer or None. Received: {name}={value!r}")
    return int(value)


def load_train_test(name, data_dir, download, offline_hint=""):
    """``((train, test), info)`` of ``tfds.load(name, split=["train", "test"], as_supervised=True)``.

    The splits are read in their stored order (``shuffle_files=False``). Any
    failure of tensorflow-datasets (network, missing files, imports: it raises
    many types) becomes one RuntimeError that names the dataset, carries the
    original error and ends the "no internet access?" question with
    ``offline_hint``.
    """
    import tensorflow_datasets as tfds

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
    except Exception as e:
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
