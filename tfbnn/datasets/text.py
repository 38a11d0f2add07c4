"""Text classification data: IMDB reviews (tensorflow-datasets) and an offline synthetic stand-in.

Both return an :class:`tfbnn.datasets.ArrayDataset` whose inputs are 1-D NumPy
arrays of Python strings (vectorize them with ``keras.layers.TextVectorization``)
and whose labels are int32 (IMDB: 0 negative, 1 positive).
"""

import math

import numpy as np

from tfbnn.datasets import _tfds
from tfbnn.datasets.base import ArrayDataset

__all__ = ["load_imdb", "make_synthetic_reviews"]

def _texts(ds, limit):
    texts, labels = [], []
    for x, y in _tfds.numpy_batches(ds, limit):
        texts.extend(t.decode("utf-8", errors="replace") for t in x)
        labels.append(y)
    labels = np.concatenate(labels).astype(np.int32) if labels else np.zeros((0,), np.int32)
    return np.array(texts, dtype=object), labels


def load_imdb(max_examples=None, max_test_examples=None, data_dir=None, download=True):
    """The IMDB movie reviews (``imdb_reviews``, 25k train / 25k test) from tensorflow-datasets.

    Downloads on first use (about 80 MB). Offline, tests run it under
    ``tfds.testing.mock_data`` (random strings and labels).

    Args:
        max_examples: int > 0 or None, keep the first training reviews only.
        max_test_examples: int > 0 or None, the same for the test split.
        data_dir: str or None, the tensorflow-datasets folder.
        download: bool, whether tensorflow-datasets may download.

    Returns:
        An :class:`ArrayDataset` named ``"imdb"``: ``x`` object arrays of str,
        ``y`` int32 in ``{0, 1}``, ``num_classes=2``.

    Raises:
        RuntimeError: tensorflow-datasets could not provide the data (no internet?).
    """
    max_examples = _tfds.check_max("max_examples", max_examples)
    max_test_examples = _tfds.check_max("max_test_examples", max_test_examples)
    (train, test), _ = _tfds.load_train_test("imdb_reviews", data_dir, download,
                                             offline_hint=" --dataset synthetic_reviews works offline")
    x_train, y_train = _texts(train, max_examples)
    x_test, y_test = _texts(test, max_test_examples)
    if len(x_train) == 0:
        raise RuntimeError("tensorflow-datasets returned no training reviews for 'imdb_reviews'.")
    return ArrayDataset(x_train, y_train, x_test, y_test, num_classes=2, name="imdb")


_POSITIVE = ("great", "excellent", "wonderful", "superb", "moving", "brilliant", "enjoyable", "delightful",
             "masterful", "charming", "gripping", "beautiful", "funny", "touching", "fresh", "memorable")
_NEGATIVE = ("awful", "boring", "terrible", "dull", "weak", "poor", "clumsy", "tedious", "bland", "messy",
             "predictable", "lifeless", "annoying", "forgettable", "silly", "painful")
_FILLER = ("the", "a", "movie", "film", "plot", "actor", "actress", "story", "scene", "and", "but", "was",
           "is", "it", "this", "with", "of", "director", "music", "ending", "character", "script", "camera",
           "very", "quite", "really", "at", "times", "overall", "cast", "dialogue", "pace", "i", "found")


def make_synthetic_reviews(num_examples=2000, seed=0, test_fraction=0.2, min_length=20, max_length=80,
                           sentiment_words=4, flip_fraction=0.25):
    """Generated "reviews" with a learnable sentiment: an offline stand-in for IMDB.

    Each review is ``min_length..max_length`` words of neutral filler with
    ``sentiment_words`` words of its class (positive / negative vocabulary) mixed in,
    each replaced by a word of the other class with probability ``flip_fraction``
    so the task is not trivially separable.

    Args:
        num_examples: int >= 10, total reviews before the split.
        seed: int >= 0.
        test_fraction: float in (0, 1).
        min_length, max_length: int, review length range in words.
        sentiment_words: int >= 1, sentiment-bearing words per review.
        flip_fraction: float in [0, 0.5), probability that a sentiment word is of the other class.

    Returns:
        An :class:`ArrayDataset` named ``"synthetic_reviews"`` (x: str arrays, y: int32).
    """
    for name, value, low in (("num_examples", num_examples, 10), ("seed", seed, 0), ("min_length", min_length, 1),
                             ("sentiment_words", sentiment_words, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"Expected `{name}` to be an integer >= {low}. Received: {name}={value!r}")
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < min_length:
        raise ValueError(f"Expected `max_length` >= min_length ({min_length}). Received: max_length={max_length!r}")
    if not isinstance(test_fraction, float) or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"Expected `test_fraction` in (0, 1). Received: test_fraction={test_fraction!r}")
    if not isinstance(flip_fraction, (int, float)) or not 0.0 <= flip_fraction < 0.5:
        raise ValueError(f"Expected `flip_fraction` in [0, 0.5). Received: flip_fraction={flip_fraction!r}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=num_examples).astype(np.int32)
    texts = []
    for label in labels:
        words = list(rng.choice(_FILLER, size=rng.integers(min_length, max_length + 1)))
        for _ in range(sentiment_words):
            own = label if rng.uniform() >= flip_fraction else 1 - label
            word = rng.choice(_POSITIVE if own == 1 else _NEGATIVE)
            words.insert(int(rng.integers(0, len(words) + 1)), word)
        texts.append(" ".join(words))
    texts = np.array(texts, dtype=object)
    num_test = max(1, math.ceil(test_fraction * num_examples))
    return ArrayDataset(texts[num_test:], labels[num_test:], texts[:num_test], labels[:num_test], num_classes=2,
                        name="synthetic_reviews")
