"""The one list of dataset names, with what each is (no TensorFlow import here).

=================  =========  ==============  =======  ===========================================
name               kind       one example     classes  source
=================  =========  ==============  =======  ===========================================
``digits``         image      8x8x1           10       scikit-learn's 8x8 digits (bundled, offline)
``moons``          vector     2               2        generated two half circles (offline)
``toy_regression`` regression 1               -        generated curve, 40 points (offline)
``cubic``          regression 1               -        y = x^3 + N(0, 3^2), 30 points (offline)
``mnist``          image      28x28x1         10       tensorflow-datasets (downloads once)
``fashion_mnist``  image      28x28x1         10       tensorflow-datasets
``cifar10``        image      32x32x3         10       tensorflow-datasets
``cifar100``       image      32x32x3         100      tensorflow-datasets
``imdb_reviews``   text       a string        2        tensorflow-datasets
``synthetic_reviews`` text    a string        2        generated reviews with a learnable sentiment
                                                       (offline stand-in for IMDB)
=================  =========  ==============  =======  ===========================================

The command line takes its choices from here, so ``tfbnn --help`` lists them without
importing TensorFlow.
"""

__all__ = [
    "CATALOG",
    "PIPELINE_DATASETS",
    "OFFLINE_DATASETS",
    "TFDS_PIPELINE_DATASETS",
    "IMAGE_DATASETS",
    "CLASSIFICATION_DATASETS",
    "CIFAR_DATASETS",
    "TEXT_DATASETS",
    "ARRAY_DATASETS",
    "GRAYSCALE_DATASETS",
]

# name -> (kind, shape of one example, number of classes or None, offline)
CATALOG = {
    "digits": ("image", (8, 8, 1), 10, True),
    "moons": ("vector", (2,), 2, True),
    "toy_regression": ("regression", (1,), None, True),
    "cubic": ("regression", (1,), None, True),
    "mnist": ("image", (28, 28, 1), 10, False),
    "fashion_mnist": ("image", (28, 28, 1), 10, False),
    "cifar10": ("image", (32, 32, 3), 10, False),
    "cifar100": ("image", (32, 32, 3), 100, False),
    "imdb_reviews": ("text", (), 2, False),
    "synthetic_reviews": ("text", (), 2, True),
}

#: Names accepted by :func:`tfbnn.datasets.load_pipeline`.
PIPELINE_DATASETS = tuple(CATALOG)
#: Names that never download (bundled or generated).
OFFLINE_DATASETS = tuple(n for n, (_, _, _, offline) in CATALOG.items() if offline)
#: tensorflow-datasets names -> (kind, shape, classes).
TFDS_PIPELINE_DATASETS = {n: spec[:3] for n, spec in CATALOG.items() if not spec[3]}
#: Image classification datasets (the zoo's convolutional models take them).
IMAGE_DATASETS = tuple(n for n, (kind, *_) in CATALOG.items() if kind == "image")
#: Classification datasets of numeric inputs (what :func:`tfbnn.training.run` trains on).
CLASSIFICATION_DATASETS = tuple(n for n, (kind, *_) in CATALOG.items() if kind in ("image", "vector"))
#: Text classification datasets (raw strings; the zoo's text models take them vectorized).
TEXT_DATASETS = tuple(n for n, (kind, *_) in CATALOG.items() if kind == "text")
#: CIFAR (standardized per channel, pad-crop-flip augmentation by default).
CIFAR_DATASETS = ("cifar10", "cifar100")
#: Grey-scale image datasets (one channel): :func:`tfbnn.datasets.load_images`.
GRAYSCALE_DATASETS = tuple(n for n, (kind, shape, *_) in CATALOG.items() if kind == "image" and shape[-1] == 1)
#: Names accepted by :func:`tfbnn.datasets.load` (in-memory NumPy splits, flattened images).
ARRAY_DATASETS = tuple(n for n, (kind, *_) in CATALOG.items() if n in GRAYSCALE_DATASETS or kind == "vector")
