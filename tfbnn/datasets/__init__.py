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

import functools

from tfbnn.datasets import corruptions
from tfbnn.datasets.base import ArrayDataset
from tfbnn.datasets.offline import load_digits, make_moons
from tfbnn.datasets.tfds_loader import TFDS_DATASETS, load_tfds
from tfbnn.datasets.pipelines import (
    PIPELINE_DATASETS,
    DataPipeline,
    from_arrays,
    load_pipeline,
    text_vectorizer,
    vectorize_text,
)

__all__ = [
    "ArrayDataset",
    "corruptions",
    "DATASETS",
    "OFFLINE_DATASETS",
    "TFDS_DATASETS",
    "load",
    "load_digits",
    "make_moons",
    "load_tfds",
    "DataPipeline",
    "PIPELINE_DATASETS",
    "from_arrays",
    "load_pipeline",
    "text_vectorizer",
    "vectorize_text",
]

_LOADERS = {
    "digits": load_digits,
    "moons": make_moons,
    "mnist": functools.partial(load_tfds, "mnist"),
    "fashion_mnist": functools.partial(load_tfds, "fashion_mnist"),
}

#: Names accepted by :func:`load`.
DATASETS = tuple(_LOADERS)

#: Names that never download (bundled or generated).
OFFLINE_DATASETS = ("digits", "moons")


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
        >>> ds = tfbnn.datasets.load("moons", num_examples=200, noise=0.1, seed=0)
        >>> ds.name, ds.num_classes, ds.num_examples
        ('moons', 2, 160)
    """
    loader = _LOADERS.get(name) if isinstance(name, str) else None
    if loader is None:
        raise ValueError(f"Unknown dataset. Expected one of {list(DATASETS)}. Received: dataset={name!r}")
    try:
        return loader(**kwargs)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise ValueError(f"Bad argument for dataset {name!r}: {e}. Received: {kwargs}") from None
        raise
