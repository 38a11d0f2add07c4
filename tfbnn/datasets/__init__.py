"""Datasets as in-memory NumPy splits (:class:`ArrayDataset`).

=================  ==========================================  ==================
name               what                                        source
=================  ==========================================  ==================
``digits``         8x8 handwritten digits, 64 features, 10     scikit-learn
                   classes, 1437 train / 360 test              (bundled, offline)
``moons``          two interleaving half circles, 2-D,         generated (offline)
                   2 classes
``mnist``          28x28 digits, 784 features, 10 classes      tensorflow-datasets
``fashion_mnist``  28x28 clothing images, 784 features, 10     tensorflow-datasets
=================  ==========================================  ==================

Inputs are float32 in ``[0, 1]`` (moons: raw coordinates), labels int32, and
``ds.num_examples`` is ``N`` of the ELBO convention::

    ds = tfbnn.datasets.load("digits", seed=0)
    model.fit(ds.x_train, ds.y_train,
              callbacks=[tfbnn.KLAnnealing(num_examples=ds.num_examples)])
"""

import importlib

from tfbnn.datasets.catalog import (
    ARRAY_DATASETS,
    CATALOG,
    CIFAR_DATASETS,
    CLASSIFICATION_DATASETS,
    GRAYSCALE_DATASETS,
    IMAGE_DATASETS,
    OFFLINE_DATASETS,
    PIPELINE_DATASETS,
    TEXT_DATASETS,
    TFDS_PIPELINE_DATASETS,
)

__all__ = [
    "ArrayDataset",
    "corruptions",
    "regression",
    "DATASETS",
    "ARRAY_DATASETS",
    "CATALOG",
    "CIFAR_DATASETS",
    "CLASSIFICATION_DATASETS",
    "GRAYSCALE_DATASETS",
    "IMAGE_DATASETS",
    "OFFLINE_DATASETS",
    "TFDS_DATASETS",
    "TEXT_DATASETS",
    "load",
    "load_images",
    "load_digits",
    "make_moons",
    "load_tfds",
    "DataPipeline",
    "PIPELINE_DATASETS",
    "TFDS_PIPELINE_DATASETS",
    "from_arrays",
    "load_pipeline",
    "text_vectorizer",
    "vectorize_text",
]

#: Names accepted by :func:`load` (= :data:`ARRAY_DATASETS`).
DATASETS = ARRAY_DATASETS

# Loaded on first use, so that the name lists above come without TensorFlow.
_LAZY = {
    "ArrayDataset": "tfbnn.datasets.base",
    "load_digits": "tfbnn.datasets.offline",
    "make_moons": "tfbnn.datasets.offline",
    "load_tfds": "tfbnn.datasets.tfds_loader",
    "TFDS_DATASETS": "tfbnn.datasets.tfds_loader",
    "DataPipeline": "tfbnn.datasets.pipelines",
    "from_arrays": "tfbnn.datasets.pipelines",
    "load_pipeline": "tfbnn.datasets.pipelines",
    "text_vectorizer": "tfbnn.datasets.pipelines",
    "vectorize_text": "tfbnn.datasets.pipelines",
}
_SUBMODULES = ("corruptions", "regression", "text", "pipelines", "offline", "tfds_loader", "base", "catalog")


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"tfbnn.datasets.{name}")
    raise AttributeError(f"module 'tfbnn.datasets' has no attribute {name!r}")


def _loader(name):
    from tfbnn.datasets import offline, tfds_loader

    if name == "digits":
        return offline.load_digits
    if name == "moons":
        return offline.make_moons
    return lambda **kwargs: tfds_loader.load_tfds(name, **kwargs)


def load(name, **kwargs):
    """Loads a dataset by name.

    Args:
        name: one of ``"digits"``, ``"moons"`` (offline) or ``"mnist"``,
            ``"fashion_mnist"`` (tensorflow-datasets, downloaded on first use).
        **kwargs: passed to the loader: :func:`load_digits` (``test_fraction``,
            ``seed``), :func:`make_moons` (``num_examples``, ``noise``, ``seed``,
            ``test_fraction``) or :func:`load_tfds` (``max_examples``,
            ``max_test_examples``, ``data_dir``, ``download``).

    Returns:
        An :class:`ArrayDataset`.

    Raises:
        ValueError: an unknown name or a bad keyword argument.
        RuntimeError: a tensorflow-datasets dataset could not be downloaded.

    Example:
        >>> import tfbnn
        >>> ds = tfbnn.datasets.load("moons", num_examples=200, noise=0.1, seed=0)
        >>> ds.name, ds.num_classes, ds.num_examples
        ('moons', 2, 160)
    """
    if not isinstance(name, str) or name not in ARRAY_DATASETS:
        raise ValueError(f"Unknown dataset. Expected one of {list(ARRAY_DATASETS)}. Received: dataset={name!r}")
    try:
        return _loader(name)(**kwargs)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise ValueError(f"Bad argument for dataset {name!r}: {e}. Received: {kwargs}") from None
        raise


def load_images(name, seed=0, max_examples=None, max_test_examples=None):
    """An image classification dataset as an :class:`ArrayDataset` of ``(n, h, w, c)`` images in ``[0, 1]``.

    ``"digits"`` is offline (scikit-learn's 1797 8x8 digits, 1437 train / 360 test,
    as 8x8x1; the stand-in for Fashion-MNIST on machines without internet);
    ``"mnist"`` and ``"fashion_mnist"`` (28x28x1) and ``"cifar10"`` / ``"cifar100"``
    (32x32x3 RGB, 10 / 100 classes) come from tensorflow-datasets: each pixel
    ``x / 255`` as float32, the splits in their stored order, the first ``max_examples``
    training and ``max_test_examples`` test images (None: all). The shape of one
    image is the catalog's (:data:`tfbnn.datasets.CATALOG`).

    Args:
        name: one of :data:`IMAGE_DATASETS`.
        seed: int, the train/test split of ``digits`` (the tensorflow-datasets sets have theirs).
        max_examples: int > 0 or None, at most this many training images (not with ``digits``).
        max_test_examples: int > 0 or None, the same for the test split.

    Returns:
        An :class:`ArrayDataset`: ``x`` float32 ``(n, h, w, c)``, ``y`` int32 ``(n,)``.

    Raises:
        ValueError: another name, a bad ``max_examples``, or ``max_examples`` with ``digits``.
        RuntimeError: tensorflow-datasets could not provide the data.

    Example:
        Offline, with generated stand-in images:

        >>> import tensorflow_datasets as tfds, tfbnn
        >>> with tfds.testing.mock_data(num_examples=6):
        ...     ds = tfbnn.datasets.load_images("cifar10", max_test_examples=4)
        >>> ds.x_train.shape, ds.x_test.shape, ds.num_classes
        ((6, 32, 32, 3), (4, 32, 32, 3), 10)
    """
    import numpy as np

    from tfbnn.datasets.base import ArrayDataset

    if not isinstance(name, str) or name not in IMAGE_DATASETS:
        raise ValueError(f"Unknown dataset. Expected one of {list(IMAGE_DATASETS)}. Received: dataset={name!r}")
    shape = CATALOG[name][1]
    if name == "digits":
        if max_examples is not None or max_test_examples is not None:
            raise ValueError(f"`max_examples` applies to the tensorflow-datasets sets, not digits. "
                             f"Received: max_examples={max_examples}, max_test_examples={max_test_examples}")
        ds = load("digits", seed=seed)
    elif name in GRAYSCALE_DATASETS:
        ds = load(name, max_examples=max_examples, max_test_examples=max_test_examples)
    else:  # RGB (CIFAR): read as load_tfds reads the grey-scale sets, keeping the image shape
        from tfbnn.datasets import _tfds

        def arrays(split, limit):
            batches = list(_tfds.numpy_batches(split, limit))
            x = np.concatenate([b[0] for b in batches]) if batches else np.zeros((0,) + shape, np.uint8)
            y = np.concatenate([b[1] for b in batches]) if batches else np.zeros((0,), np.int32)
            return x.astype(np.float32) / np.float32(255.0), y.astype(np.int32)

        limits = [_tfds.check_max(k, v) for k, v in (("max_examples", max_examples),
                                                     ("max_test_examples", max_test_examples))]
        splits, info = _tfds.load_train_test(name, None, True)
        (x_train, y_train), (x_test, y_test) = (arrays(d, n) for d, n in zip(splits, limits))
        if len(x_train) == 0:
            raise RuntimeError(f"tensorflow-datasets returned no training examples for {name!r}.")
        ds = ArrayDataset(x_train, y_train, x_test, y_test, num_classes=_tfds.num_classes(info, CATALOG[name][2]),
                          name=name)

    def images(x):
        return np.ascontiguousarray(x.reshape((len(x),) + shape), dtype=np.float32)

    return ArrayDataset(images(ds.x_train), ds.y_train, images(ds.x_test), ds.y_test,
                        num_classes=ds.num_classes, name=ds.name)
