"""Datasets as batched ``tf.data`` pipelines with a held-out validation split.

:func:`load_pipeline` returns a :class:`DataPipeline`: ``train`` / ``validation``
/ ``test`` datasets of ``(x, y)`` batches ready for ``model.fit`` (also under
``tf.distribute``), plus ``num_examples``, the ``N`` of the ELBO convention,
counted from the training examples actually used (after ``max_examples`` and
after the validation hold-out)::

    data = tfbnn.datasets.load_pipeline("cifar10", batch_size=128, seed=0)
    model.fit(data.train, validation_data=data.validation, epochs=200,
              callbacks=[tfbnn.KLAnnealing(num_examples=data.num_examples)])

==================  ==================================  ==========  ==================
name                x (one example)                     classes     source
==================  ==================================  ==========  ==================
``mnist``           float32 (28, 28, 1) in [0, 1]       10          tensorflow-datasets
``fashion_mnist``   float32 (28, 28, 1) in [0, 1]       10          tensorflow-datasets
``cifar10``         float32 (32, 32, 3) in [0, 1]       10          tensorflow-datasets
``cifar100``        float32 (32, 32, 3) in [0, 1]       100         tensorflow-datasets
``imdb_reviews``    tf.string (the review)              2           tensorflow-datasets
``synthetic_reviews`` tf.string (a generated review)    2           generated (offline)
``digits``          float32 (8, 8, 1) in [0, 1]         10          scikit-learn (offline)
``moons``           float32 (2,)                        2           generated (offline)
``toy_regression``  float32 (1,); y float32 (1,)        None        generated (offline)
``cubic``           float32 (1,); y float32 (1,)        None        generated (offline)
==================  ==================================  ==========  ==================

Labels are int32 (regression targets float32). ``flatten=True`` turns images into
vectors (``(784,)``, ``(64,)``, ...) for MLPs. CIFAR only: ``standardize=True``
subtracts the usual per-channel means and divides by the stds, and ``augment``
(default on for CIFAR) is the standard pad-4 / random-crop-32 / horizontal-flip,
applied to the training split only. IMDB and the synthetic reviews
(:func:`tfbnn.datasets.make_synthetic_reviews`) become integer sequences with
:func:`text_vectorizer` and :func:`vectorize_text`.

How the splits are made:

* the validation examples are a seeded random subset (``round(validation_fraction
  * n)`` of the ``n`` training examples, ``numpy.random.default_rng(seed)``),
  selected by position in tf.data. tensorflow-datasets split strings such as
  ``"train[:90%]"`` are not used (mock data ignores them); the tfds order is
  deterministic (``shuffle_files=False``), so the split is too.
* ``n`` is the tf.data cardinality of the loaded training split when tf.data
  knows it, and an iteration count otherwise; it is never read from
  ``info.splits`` (empty under ``tfds.testing.mock_data``).
* the raw (uint8) examples are cached in memory after the split (``cache=True``),
  the training split is reshuffled every epoch (``shuffle_buffer``, ``seed``) and
  augmented with stateless random ops whose seeds come from
  ``tf.data.Dataset.random(seed)``: a fixed ``seed`` (and TensorFlow global seed,
  e.g. ``keras.utils.set_random_seed``) gives the same batches in every run,
  with fresh shuffles and crops in every epoch.
"""

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

__all__ = [
    "DataPipeline",
    "PIPELINE_DATASETS",
    "TFDS_PIPELINE_DATASETS",
    "CIFAR_MEAN_STD",
    "CIFAR_DATASETS",
    "load_pipeline",
    "from_arrays",
    "augment_cifar",
    "text_vectorizer",
    "vectorize_text",
]

from tfbnn.datasets import _tfds  # noqa: E402
from tfbnn.datasets.catalog import CATALOG, CIFAR_DATASETS, PIPELINE_DATASETS, TFDS_PIPELINE_DATASETS  # noqa: E402
from tfbnn.datasets.offline import load_digits, make_moons  # noqa: E402
from tfbnn.datasets.regression import make_cubic, make_toy_regression  # noqa: E402
from tfbnn.datasets.text import make_synthetic_reviews  # noqa: E402

#: Per-channel (mean, std) of the training images, in [0, 1] units.
CIFAR_MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}

_CIFAR_PAD = 4
_AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True, repr=False)
class DataPipeline:
    """Batched ``tf.data`` splits of a dataset and what a model needs to know about it.

    Attributes:
        train: ``tf.data.Dataset`` of ``(x, y)`` batches, shuffled every epoch
            (and augmented, if asked).
        validation: ``tf.data.Dataset`` of ``(x, y)`` batches held out from the
            training split, or ``None`` when ``validation_fraction=0``.
        test: ``tf.data.Dataset`` of ``(x, y)`` batches.
        num_examples: int, ``N``: the training examples actually used, after the
            hold-out. Use it for the KL scale: ``tfbnn.KLAnnealing(num_examples=N)``.
        num_validation: int, the held-out examples.
        num_test: int, the test examples.
        num_classes: int, or ``None`` for regression.
        input_shape: tuple, the shape of one ``x`` (``()`` for raw text).
        name: str, the dataset's name.
        batch_size: int, the (global) batch size.
    """

    train: tf.data.Dataset
    validation: object
    test: tf.data.Dataset
    num_examples: int
    num_validation: int
    num_test: int
    num_classes: object
    input_shape: tuple
    name: str
    batch_size: int

    @property
    def steps_per_epoch(self):
        """Training batches per epoch, ``ceil(N / batch_size)``."""
        return math.ceil(self.num_examples / self.batch_size)

    def __repr__(self):
        return (
            f"DataPipeline(name={self.name!r}, N={self.num_examples}, num_validation={self.num_validation}, "
            f"num_test={self.num_test}, input_shape={self.input_shape}, num_classes={self.num_classes}, "
            f"batch_size={self.batch_size})"
        )


# -- argument checks ---------------------------------------------------------------


def _check_int(name, value, low, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        suffix = " or None" if allow_none else ""
        raise ValueError(f"Expected `{name}` to be {kind}{suffix}. Received: {name}={value!r}")
    return int(value)


def _check_fraction(value):
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.floating))
        or not math.isfinite(value)
        or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            "Expected `validation_fraction` in [0, 1). Received: "
            f"validation_fraction={value!r}"
        )
    return float(value)


def _check_name(name):
    if not isinstance(name, str) or name not in PIPELINE_DATASETS:
        raise ValueError(f"Unknown dataset. Expected one of {list(PIPELINE_DATASETS)}. Received: dataset={name!r}")
    return name


def _check_options(name, augment, standardize, flatten):
    kind = CATALOG[name][0]
    if augment is None:
        augment = name in CIFAR_DATASETS
    if augment and name not in CIFAR_DATASETS:
        raise ValueError(
            f"Augmentation (pad-crop-flip) is defined for {list(CIFAR_DATASETS)} only. Received: augment={augment!r} "
            f"with dataset={name!r}"
        )
    if standardize and name not in CIFAR_DATASETS:
        raise ValueError(
            f"Per-channel standardization is defined for {list(CIFAR_DATASETS)} only. Received: "
            f"standardize={standardize!r} with dataset={name!r}"
        )
    if flatten and kind != "image":
        raise ValueError(f"`flatten` applies to image datasets. Received: flatten={flatten!r} with dataset={name!r}")
    return bool(augment)


# -- splitting and counting ----------------------------------------------------------


def _count(ds):
    """The number of elements: tf.data's cardinality when known, else an iteration count."""
    n = int(ds.cardinality())
    if n == int(tf.data.INFINITE_CARDINALITY):
        raise ValueError("Expected a finite dataset. Received: an infinite dataset")
    if n >= 0:
        return n
    return int(ds.reduce(np.int64(0), lambda count, _: count + 1))


def _validation_mask(n, validation_fraction, seed, name):
    """A seeded boolean mask of the ``n`` training positions held out for validation."""
    num_validation = int(round(validation_fraction * n))
    if validation_fraction > 0 and num_validation == 0:
        num_validation = 1
    if n - num_validation < 1:
        raise ValueError(
            f"Holding out {num_validation} of the {n} training examples of {name!r} for validation leaves "
            f"none to train on. Received: validation_fraction={validation_fraction}"
        )
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).choice(n, size=num_validation, replace=False)] = True
    return mask


def _select(ds, mask, keep):
    """The elements of ``ds`` at the positions where ``mask == keep``, in order."""
    table = tf.constant(mask if keep else ~mask)
    ds = ds.enumerate().filter(lambda i, example: tf.gather(table, i))
    # The count is known: say so, so that Keras (and tfbnn.distribute.fit) know the steps per epoch.
    count = int(table.numpy().sum())
    return ds.map(lambda i, example: example).apply(tf.data.experimental.assert_cardinality(count))


# -- per-example transforms ------------------------------------------------------------


def augment_cifar(image, seed):
    """Pad 4 (zeros), random 32x32 crop and random horizontal flip of one image.

    Stateless: the same ``image`` and ``seed`` (int shape ``(2,)``) give the same
    result. Works on uint8 or float images of shape ``(H, W, C)``.
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.shape(image)
    padded = tf.pad(image, [[_CIFAR_PAD, _CIFAR_PAD], [_CIFAR_PAD, _CIFAR_PAD], [0, 0]])
    cropped = tf.image.stateless_random_crop(padded, shape, seed=crop_seed)
    return tf.image.stateless_random_flip_left_right(cropped, seed=flip_seed)


def _image_transform(name, flatten, standardize):
    mean = std = None
    if standardize:
        mean, std = (tf.constant(v, tf.float32) for v in CIFAR_MEAN_STD[name])

    def transform(x, y):
        if x.dtype == tf.uint8:  # tfds images; the offline digits are already float32 in [0, 1]
            x = tf.cast(x, tf.float32) / 255.0
        if mean is not None:
            x = (x - mean) / std
        if flatten:
            x = tf.reshape(x, [-1])
        return x, tf.cast(y, tf.int32)

    return transform


def _label_transform(x, y):
    return x, tf.cast(y, tf.int32)


def _finish(ds, batch_size, drop_remainder):
    # Under MultiWorkerMirroredStrategy, shard by element (never by file): the
    # hold-out is chosen by position, and file sharding would change the positions.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(_AUTOTUNE)
    return ds.with_options(options)


def _build(name, train_raw, test_raw, transform, settings):
    """Splits, caches, shuffles, augments, batches: the three batched datasets and counts."""
    n = _count(train_raw)
    if n == 0:
        raise RuntimeError(f"The training split of {name!r} has no examples.")
    fraction = settings["validation_fraction"]
    validation = None
    num_validation = 0
    train = train_raw
    if fraction > 0:
        mask = _validation_mask(n, fraction, settings["seed"], name)
        num_validation = int(mask.sum())
        train, validation = _select(train_raw, mask, keep=False), _select(train_raw, mask, keep=True)
    num_test = _count(test_raw)
    if settings["cache"]:
        train, test_raw = train.cache(), test_raw.cache()
        validation = validation.cache() if validation is not None else None

    train = train.shuffle(settings["shuffle_buffer"], seed=settings["seed"], reshuffle_each_iteration=True)
    if settings["augment"]:
        seeds = tf.data.Dataset.random(seed=settings["seed"], rerandomize_each_iteration=True).batch(2)
        train = tf.data.Dataset.zip((train, seeds)).map(
            lambda example, seed: (augment_cifar(example[0], seed), example[1]), num_parallel_calls=_AUTOTUNE
        )
    batch, drop = settings["batch_size"], settings["drop_remainder"]
    splits = [
        _finish(ds.map(transform, num_parallel_calls=_AUTOTUNE), batch, drop) if ds is not None else None
        for ds in (train, validation, test_raw)
    ]
    return splits, n - num_validation, num_validation, num_test


# -- sources ---------------------------------------------------------------------


def _load_tfds(name, data_dir, download, max_examples, max_test_examples):
    (train, test), info = _tfds.load_train_test(name, data_dir, download)
    num_classes = _tfds.num_classes(info, TFDS_PIPELINE_DATASETS[name][2])
    if max_examples is not None:
        train = train.take(max_examples)
    if max_test_examples is not None:
        test = test.take(max_test_examples)
    return train, test, num_classes


def _offline_arrays(name, seed):
    """``(x_train, y_train, x_test, y_test, num_classes)`` of an offline dataset."""
    if name == "digits":
        ds = load_digits(seed=seed)
        return ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes
    if name == "moons":
        ds = make_moons(seed=seed)
        return ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes
    if name == "synthetic_reviews":
        ds = make_synthetic_reviews(seed=seed)
        return ds.x_train.astype(str), ds.y_train, ds.x_test.astype(str), ds.y_test, ds.num_classes
    if name == "toy_regression":
        ds = make_toy_regression(seed=seed)
        return ds.x_train, ds.y_train, ds.x_grid, ds.y_grid, None
    # The y = x^3 + N(0, 3^2) problem with 30 points (Hernandez-Lobato and Adams 2015).
    x, y, x_test, y_test = make_cubic(seed=seed)
    return x[:, None], y[:, None], x_test[:, None], y_test[:, None], None


def _settings(batch_size, validation_fraction, shuffle_buffer, seed, cache, drop_remainder):
    """The checked batching, hold-out and shuffle arguments every pipeline takes."""
    return {
        "batch_size": _check_int("batch_size", batch_size, 1),
        "validation_fraction": _check_fraction(validation_fraction),
        "shuffle_buffer": _check_int("shuffle_buffer", shuffle_buffer, 1),
        "seed": _check_int("seed", seed, 0),
        "cache": bool(cache),
        "drop_remainder": bool(drop_remainder),
    }


def _labels_transform(num_classes):
    """Labels cast to int32 for a classification dataset; the examples as they are otherwise."""
    return _label_transform if num_classes is not None else (lambda x, y: (x, y))


def _pipeline(name, train_raw, test_raw, transform, settings, num_classes, input_shape):
    """The :class:`DataPipeline` of the raw splits: transformed, held out, shuffled, batched."""
    (train, validation, test), n, num_validation, num_test = _build(name, train_raw, test_raw, transform, settings)
    return DataPipeline(train=train, validation=validation, test=test, num_examples=n, num_validation=num_validation,
                        num_test=num_test, num_classes=num_classes, input_shape=input_shape, name=name,
                        batch_size=settings["batch_size"])


def _cap(arrays, limit):
    return arrays if limit is None else tuple(a[:limit] for a in arrays)


# -- public API --------------------------------------------------------------------------


def load_pipeline(
    name,
    batch_size=128,
    validation_fraction=0.1,
    augment=None,
    standardize=False,
    flatten=False,
    cache=True,
    shuffle_buffer=10_000,
    seed=0,
    max_examples=None,
    max_test_examples=None,
    drop_remainder=False,
    data_dir=None,
    download=True,
):
    """Loads a dataset as batched ``tf.data`` train / validation / test pipelines.

    Args:
        name: one of :data:`PIPELINE_DATASETS` (see the module docstring).
        batch_size: int > 0, the global batch size (split across replicas under
            ``tf.distribute``). Default 128.
        validation_fraction: float in [0, 1), the fraction of the training split
            held out (seeded) for validation. 0 gives ``validation=None``. Default 0.1.
        augment: bool or None. Pad-4 / random-crop-32 / horizontal-flip of the
            training images (CIFAR only). None (default): on for CIFAR, off otherwise.
        standardize: bool. CIFAR only: ``(x - mean) / std`` per channel with
            :data:`CIFAR_MEAN_STD`, after scaling to [0, 1]. Default False.
        flatten: bool. Images as vectors (e.g. ``(784,)``) instead of ``(H, W, C)``.
        cache: bool. Keep the raw examples in memory after the first epoch. Default True.
        shuffle_buffer: int > 0, the buffer of the per-epoch shuffle of the training split.
        seed: int >= 0. Seeds the validation hold-out, the shuffle, the augmentation
            and, for offline datasets, their generation / train-test split.
        max_examples: int > 0 or None. Use at most this many training examples
            (the first ones, before the hold-out); ``num_examples`` is what is left.
        max_test_examples: int > 0 or None, the same for the test split.
        drop_remainder: bool. Drop the last smaller batch of every split.
        data_dir: str or None, where tensorflow-datasets keeps its data.
        download: bool, whether tensorflow-datasets may download.

    Returns:
        A :class:`DataPipeline`.

    Raises:
        ValueError: an unknown name, a bad argument, or an option that does not
            apply to the dataset (the message names the argument and its value).
        RuntimeError: tensorflow-datasets could not provide the data.

    Example:
        >>> import tfbnn
        >>> data = tfbnn.datasets.load_pipeline("digits", batch_size=32, seed=0)
        >>> data.num_examples, data.num_validation, data.input_shape
        (1293, 144, (8, 8, 1))
    """
    name = _check_name(name)
    settings = _settings(batch_size, validation_fraction, shuffle_buffer, seed, cache, drop_remainder)
    max_examples = _check_int("max_examples", max_examples, 1, allow_none=True)
    max_test_examples = _check_int("max_test_examples", max_test_examples, 1, allow_none=True)
    settings["augment"] = _check_options(name, augment, standardize, flatten)

    if name in TFDS_PIPELINE_DATASETS:
        kind, shape, _ = TFDS_PIPELINE_DATASETS[name]
        train_raw, test_raw, num_classes = _load_tfds(name, data_dir, download, max_examples, max_test_examples)
    else:
        x, y, x_test, y_test, num_classes = _offline_arrays(name, settings["seed"])
        x, y = _cap((x, y), max_examples)
        x_test, y_test = _cap((x_test, y_test), max_test_examples)
        kind = CATALOG[name][0]
        shape = (8, 8, 1) if name == "digits" else tuple(x.shape[1:])
        if name == "digits":  # load_digits flattens and scales by 1/16; keep the 8x8x1 image
            x, x_test = x.reshape((-1, *shape)), x_test.reshape((-1, *shape))
        train_raw = tf.data.Dataset.from_tensor_slices((x, y))
        test_raw = tf.data.Dataset.from_tensor_slices((x_test, y_test))

    if kind == "image":
        transform = _image_transform(name, flatten, standardize)
        input_shape = (int(np.prod(shape)),) if flatten else tuple(shape)
    else:
        transform = _labels_transform(num_classes)
        input_shape = tuple(shape)
    return _pipeline(name, train_raw, test_raw, transform, settings, num_classes, input_shape)


def from_arrays(x_train, y_train, x_test, y_test, num_classes=None, name="arrays", batch_size=128,
                validation_fraction=0.1, cache=True, shuffle_buffer=10_000, seed=0, drop_remainder=False):
    """A :class:`DataPipeline` from NumPy arrays (e.g. an :class:`ArrayDataset`'s splits).

    The arrays are used as they are (no scaling); labels are cast to int32 when
    ``num_classes`` is given. The hold-out, shuffle and batching follow
    :func:`load_pipeline`.

    Example:
        >>> import tfbnn
        >>> ds = tfbnn.datasets.load("moons", seed=0)
        >>> data = tfbnn.datasets.from_arrays(ds.x_train, ds.y_train, ds.x_test, ds.y_test,
        ...                                   num_classes=2, name="moons", batch_size=32)
    """
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ValueError(
            "Expected as many labels as inputs. Received: "
            f"len(x_train)={len(x_train)}, len(y_train)={len(y_train)}, "
            f"len(x_test)={len(x_test)}, len(y_test)={len(y_test)}"
        )
    settings = {**_settings(batch_size, validation_fraction, shuffle_buffer, seed, cache, drop_remainder),
                "augment": False}
    train_raw = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    test_raw = tf.data.Dataset.from_tensor_slices((x_test, y_test))
    return _pipeline(name, train_raw, test_raw, _labels_transform(num_classes), settings, num_classes,
                     tuple(np.shape(x_train)[1:]))


# -- text ------------------------------------------------------------------------------


def text_vectorizer(data, max_tokens=20_000, output_sequence_length=120):
    """A ``keras.layers.TextVectorization`` adapted on the training text of ``data``.

    Only the training split is seen (the vocabulary must not leak validation or
    test words). Text is lower-cased and stripped of punctuation (Keras' default).

    Args:
        data: a :class:`DataPipeline` of text (``load_pipeline("imdb_reviews")``).
        max_tokens: int >= 3, the vocabulary size, padding and out-of-vocabulary
            tokens included. Default 20000.
        output_sequence_length: int > 0, every text becomes this many token ids
            (padded with 0 or truncated). Default 120.

    Returns:
        The adapted layer: strings ``(B,)`` -> int64 ``(B, output_sequence_length)``.
    """
    _check_text(data)
    layer = keras.layers.TextVectorization(
        max_tokens=_check_int("max_tokens", max_tokens, 3),
        output_mode="int",
        output_sequence_length=_check_int("output_sequence_length", output_sequence_length, 1),
    )
    layer.adapt(data.train.map(lambda x, y: x))
    return layer


def vectorize_text(data, vectorizer):
    """``data`` with every text mapped through ``vectorizer`` (int64 ``(B, L)`` token ids).

    Vectorizing in the input pipeline keeps the string op out of the model, so
    the model itself can run on any device and under XLA.

    Returns:
        A new :class:`DataPipeline` with ``input_shape = (L,)``.
    """
    _check_text(data)

    def encode(x, y):
        return vectorizer(x), y

    def mapped(ds):
        return None if ds is None else ds.map(encode, num_parallel_calls=_AUTOTUNE).prefetch(_AUTOTUNE)

    length = vectorizer.get_config()["output_sequence_length"]
    return dataclasses.replace(
        data,
        train=mapped(data.train),
        validation=mapped(data.validation),
        test=mapped(data.test),
        input_shape=(int(length),),
    )


def _check_text(data):
    if not isinstance(data, DataPipeline) or data.train.element_spec[0].dtype != tf.string:
        raise ValueError(
            "Expected a DataPipeline of text, e.g. tfbnn.datasets.load_pipeline('imdb_reviews'). "
            f"Received: data={data!r}"
        )
