"""Offline datasets: bundled with scikit-learn or generated, never downloaded.

These are the datasets the command-line main job and the tests use on machines
without internet access.
"""

import math

import numpy as np
from sklearn import datasets as sk_datasets
from sklearn.model_selection import train_test_split

from tfbnn.datasets.base import ArrayDataset

__all__ = ["load_digits", "make_moons"]


def _check_test_fraction(test_fraction):
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, (int, float, np.floating))
        or not math.isfinite(test_fraction)
        or not 0.0 < test_fraction < 1.0
    ):
        raise ValueError(
            f"Expected `test_fraction` in the open interval (0, 1). Received: test_fraction={test_fraction!r}"
        )
    return float(test_fraction)


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"Expected `seed` to be a non-negative integer. Received: seed={seed!r}")
    return int(seed)


def _split(x, y, test_fraction, seed, num_classes):
    num_test = math.ceil(test_fraction * len(x))
    if num_test < num_classes or len(x) - num_test < num_classes:
        raise ValueError(
            f"A stratified split of {len(x)} examples with test_fraction={test_fraction} leaves "
            f"{len(x) - num_test} training and {num_test} test examples; each part needs at least "
            f"one example per class ({num_classes}). Received: test_fraction={test_fraction}"
        )

    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y, shuffle=True
    )
    return (
        np.ascontiguousarray(x_train, dtype=np.float32),
        np.ascontiguousarray(y_train, dtype=np.int32),
        np.ascontiguousarray(x_test, dtype=np.float32),
        np.ascontiguousarray(y_test, dtype=np.int32),
    )


def load_digits(test_fraction=0.2, seed=0):
    """The UCI handwritten digits (8x8 images, 10 classes), bundled with scikit-learn.

    1797 images of 8x8 pixels with intensities 0..16, flattened to 64 features
    and scaled to ``[0, 1]`` (divided by 16). The split is stratified by class
    and seeded, so the same ``seed`` always gives the same split.

    Args:
        test_fraction: float in (0, 1), the fraction of examples held out for
            testing. Default 0.2 (1437 train, 360 test).
        seed: int >= 0, seed of the shuffled stratified split.

    Returns:
        An :class:`ArrayDataset` named ``"digits"``: ``x`` float32 ``(n, 64)`` in
        ``[0, 1]``, ``y`` int32 ``(n,)`` in ``[0, 10)``, ``num_classes=10``.

    Raises:
        ValueError: ``test_fraction`` outside (0, 1) or a negative / non-integer ``seed``.

    Example:
        >>> import tfbnn
        >>> ds = tfbnn.datasets.load_digits(seed=0)
        >>> ds.x_train.shape, ds.x_test.shape, float(ds.x_train.max())
        ((1437, 64), (360, 64), 1.0)
    """
    test_fraction = _check_test_fraction(test_fraction)
    seed = _check_seed(seed)
    bunch = sk_datasets.load_digits()
    x = bunch.data.reshape(len(bunch.data), -1).astype(np.float32) / np.float32(16.0)
    y = bunch.target.astype(np.int32)
    x_train, y_train, x_test, y_test = _split(x, y, test_fraction, seed, 10)
    return ArrayDataset(x_train, y_train, x_test, y_test, num_classes=10, name="digits")


def make_moons(num_examples=1000, noise=0.1, seed=0, test_fraction=0.2):
    """Two interleaving half circles in 2-D (scikit-learn's ``make_moons``), 2 classes.

    A small generated problem with a curved decision boundary, handy to look at
    predictive uncertainty away from the data.

    Args:
        num_examples: int >= 4, the total number of points generated (before the
            split; ``ds.num_examples`` is the training part).
        noise: float >= 0, standard deviation of the Gaussian noise added to the points.
        seed: int >= 0, seeds both the generation and the split.
        test_fraction: float in (0, 1), the fraction held out for testing.

    Returns:
        An :class:`ArrayDataset` named ``"moons"``: ``x`` float32 ``(n, 2)``,
        ``y`` int32 in ``{0, 1}``, ``num_classes=2``.

    Raises:
        ValueError: on a bad argument (the message names it and its value).

    Example:
        >>> import tfbnn
        >>> ds = tfbnn.datasets.make_moons(num_examples=500, noise=0.2, seed=1)
        >>> ds.num_examples, ds.x_test.shape
        (400, (100, 2))
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples < 4:
        raise ValueError(
            f"Expected `num_examples` to be an integer >= 4. Received: num_examples={num_examples!r}"
        )
    if (
        isinstance(noise, bool)
        or not isinstance(noise, (int, float, np.floating))
        or not math.isfinite(noise)
        or noise < 0
    ):
        raise ValueError(f"Expected `noise` to be a non-negative number. Received: noise={noise!r}")
    test_fraction = _check_test_fraction(test_fraction)
    seed = _check_seed(seed)
    x, y = sk_datasets.make_moons(n_samples=int(num_examples), noise=float(noise), random_state=seed)
    x_train, y_train, x_test, y_test = _split(x, y, test_fraction, seed, 2)
    return ArrayDataset(x_train, y_train, x_test, y_test, num_classes=2, name="moons")
