"""Image classification datasets from ``tensorflow-datasets``, as NumPy arrays.

``tensorflow-datasets`` downloads and prepares a dataset on first use (into
``~/tensorflow_datasets`` unless ``data_dir`` says otherwise), so these loaders
need internet access once. Offline, tests run them under
``tfds.testing.mock_data`` (random images and labels of the right shapes).
"""

import numpy as np

from tfbnn.datasets import _tfds
from tfbnn.datasets.base import ArrayDataset
from tfbnn.datasets.catalog import CATALOG, GRAYSCALE_DATASETS

__all__ = ["load_tfds", "TFDS_DATASETS"]

# name -> number of classes (also the fallback when the builder info has none).
#: The tensorflow-datasets sets :func:`load_tfds` takes (grey-scale images) -> classes.
TFDS_DATASETS = {n: CATALOG[n][2] for n in GRAYSCALE_DATASETS if not CATALOG[n][3]}

def _to_numpy(ds, limit):
    """The split as float32 ``(n, features)`` in [0, 1] and int32 labels."""
    xs, ys = [], []
    for x, y in _tfds.numpy_batches(ds, limit):
        xs.append(x.reshape(len(x), -1))
        ys.append(y)
    if not xs:
        return np.zeros((0, 0), np.float32), np.zeros((0,), np.int32)
    x = np.concatenate(xs).astype(np.float32) / np.float32(255.0)
    y = np.concatenate(ys).astype(np.int32)
    return x, y


def load_tfds(name, max_examples=None, max_test_examples=None, data_dir=None, download=True):
    """MNIST or Fashion-MNIST from ``tensorflow-datasets`` as an :class:`ArrayDataset`.

    Loads the ``"train"`` and ``"test"`` splits with
    ``tfds.load(name, split=["train", "test"], as_supervised=True)``, iterates
    them into NumPy arrays, flattens each 28x28x1 image to 784 features and
    scales it to ``[0, 1]`` (divided by 255).

    Args:
        name: ``"mnist"`` or ``"fashion_mnist"``.
        max_examples: int > 0 or None. Keep at most this many training examples
            (the first ones in the split's order). ``ds.num_examples`` is the count
            actually loaded, which can be smaller.
        max_test_examples: int > 0 or None, the same for the test split.
        data_dir: str or None, where tensorflow-datasets keeps its data.
        download: bool. Whether tensorflow-datasets may download and prepare the
            dataset when it is not already in ``data_dir``.

    Returns:
        An :class:`ArrayDataset`: ``x`` float32 ``(n, 784)`` in ``[0, 1]``,
        ``y`` int32 ``(n,)``, ``num_classes=10``, ``name`` as given.

    Raises:
        ValueError: an unsupported ``name`` or a bad ``max_examples``.
        RuntimeError: tensorflow-datasets could not provide the data (e.g. no
            internet on first use); the message carries the original error.

    Example:
        With a connection (MNIST downloads on first use)::

            ds = tfbnn.datasets.load_tfds("mnist", max_examples=10000)
            ds.num_examples, ds.x_train.shape[1]     # (10000, 784)

        Offline, with generated stand-in data:

        >>> import tensorflow_datasets as tfds, tfbnn
        >>> with tfds.testing.mock_data(num_examples=32):
        ...     ds = tfbnn.datasets.load_tfds("fashion_mnist")
        >>> ds.num_examples
        32
    """
    if name not in TFDS_DATASETS:
        raise ValueError(
            f"Unknown tensorflow-datasets dataset. Expected one of {sorted(TFDS_DATASETS)}. "
            f"Received: dataset={name!r}"
        )
    max_examples = _tfds.check_max("max_examples", max_examples)
    max_test_examples = _tfds.check_max("max_test_examples", max_test_examples)
    (train, test), info = _tfds.load_train_test(name, data_dir, download)
    num_classes = _tfds.num_classes(info, TFDS_DATASETS[name])
    x_train, y_train = _to_numpy(train, max_examples)
    x_test, y_test = _to_numpy(test, max_test_examples)
    if len(x_train) == 0:
        raise RuntimeError(f"tensorflow-datasets returned no training examples for {name!r}.")
    return ArrayDataset(x_train, y_train, x_test, y_test, num_classes=num_classes, name=name)
