"""tfbnn.datasets.load_pipeline: tf.data splits of the tfds datasets (mock data) and the offline ones."""

import hashlib

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import tfbnn
from tfbnn import datasets
from tfbnn.datasets import pipelines

MOCK_N = 30  # mock examples per split; validation_fraction 0.1 holds out 3
IMAGE_SHAPES = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3), "cifar100": (32, 32, 3)}
NUM_CLASSES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100, "imdb_reviews": 2}


def _examples(ds):
    """Unbatched (x, y) NumPy pairs of one pass over a batched dataset, and the batch sizes."""
    xs, ys, sizes = [], [], []
    for x, y in ds.as_numpy_iterator():
        xs.extend(x)
        ys.extend(y)
        sizes.append(len(y))
    return xs, ys, sizes


def _digest(x):
    data = x if isinstance(x, bytes) else np.ascontiguousarray(x).tobytes()
    return hashlib.sha1(data).hexdigest()


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "cifar100", "imdb_reviews"])
def test_tfds_pipeline_under_mock_data(name):
    batch = 8
    with tfds.testing.mock_data(num_examples=MOCK_N):
        # augment=False: hashing must see the stored examples to check the hold-out.
        data = datasets.load_pipeline(name, batch_size=batch, augment=False if name.startswith("cifar") else None)
        splits = {split: _examples(getattr(data, split)) for split in ("train", "validation", "test")}
    assert isinstance(data, datasets.DataPipeline) and data.name == name
    assert data.num_classes == NUM_CLASSES[name] and data.batch_size == batch

    # N is the count of the training examples actually there, after the hold-out.
    train_x, train_y, train_sizes = splits["train"]
    val_x, val_y, val_sizes = splits["validation"]
    test_x, _, test_sizes = splits["test"]
    assert data.num_validation == 3 and data.num_examples == MOCK_N - 3
    assert len(train_x) == data.num_examples and len(val_x) == data.num_validation
    assert len(test_x) == data.num_test == MOCK_N
    assert data.steps_per_epoch == len(train_sizes) == 4
    assert int(data.train.cardinality()) == 4  # known, so Keras and tfbnn.distribute.fit know the steps
    for sizes in (train_sizes, val_sizes, test_sizes):
        assert all(s == batch for s in sizes[:-1]) and 0 < sizes[-1] <= batch

    # Disjoint, and together the whole training split (mock examples are distinct).
    train_hashes, val_hashes = {_digest(x) for x in train_x}, {_digest(x) for x in val_x}
    assert len(train_hashes) == data.num_examples and len(val_hashes) == data.num_validation
    assert not train_hashes & val_hashes

    spec_x, spec_y = data.train.element_spec
    assert spec_y.dtype == tf.int32 and spec_y.shape.as_list() == [None]
    labels = np.array(train_y + val_y)
    assert labels.min() >= 0 and labels.max() < data.num_classes
    if name == "imdb_reviews":
        assert spec_x.dtype == tf.string and data.input_shape == ()
        assert all(isinstance(x, bytes) and x for x in train_x)
    else:
        assert spec_x.dtype == tf.float32 and data.input_shape == IMAGE_SHAPES[name]
        images = np.stack(train_x + val_x + test_x)
        assert images.shape[1:] == IMAGE_SHAPES[name] and images.dtype == np.float32
        assert 0.0 <= images.min() and images.max() <= 1.0 and images.max() > 0.5


def test_max_examples_and_counts_what_is_there():
    with tfds.testing.mock_data(num_examples=MOCK_N):
        capped = datasets.load_pipeline("mnist", batch_size=4, validation_fraction=0.25, max_examples=20,
                                        max_test_examples=7, flatten=True)
        n_seen = len(_examples(capped.train)[0])
        no_val = datasets.load_pipeline("fashion_mnist", batch_size=16, validation_fraction=0.0)
        n_all = len(_examples(no_val.train)[0])
    assert (capped.num_examples, capped.num_validation, capped.num_test) == (15, 5, 7) and n_seen == 15
    assert capped.input_shape == (784,) and capped.train.element_spec[0].shape.as_list() == [None, 784]
    assert no_val.validation is None and no_val.num_validation == 0 and no_val.num_examples == n_all == MOCK_N
    # Fewer examples than asked for: N is what was there.
    with tfds.testing.mock_data(num_examples=6):
        small = datasets.load_pipeline("mnist", max_examples=1000)
        assert len(_examples(small.train)[0]) == small.num_examples == 5


def test_cifar_augmentation_changes_images_keeps_shapes_and_is_seeded():
    with tfds.testing.mock_data(num_examples=16):
        plain = datasets.load_pipeline("cifar10", batch_size=16, augment=False, validation_fraction=0.0, seed=3)
        aug = datasets.load_pipeline("cifar10", batch_size=16, augment=True, validation_fraction=0.0, seed=3)
        again = datasets.load_pipeline("cifar10", batch_size=16, validation_fraction=0.0, seed=3)  # default: on
        other = datasets.load_pipeline("cifar10", batch_size=16, validation_fraction=0.0, seed=4)
        std = datasets.load_pipeline("cifar10", batch_size=16, augment=False, standardize=True,
                                     validation_fraction=0.0, seed=3)
        (x0, y0), = plain.train.as_numpy_iterator()
        (x1, y1), = aug.train.as_numpy_iterator()
        (x1_epoch2, _), = aug.train.as_numpy_iterator()
        (x2, y2), = again.train.as_numpy_iterator()
        (x3, _), = other.train.as_numpy_iterator()
        (xs, _), = std.train.as_numpy_iterator()
        (t0, _), = plain.test.as_numpy_iterator()
        (t1, _), = aug.test.as_numpy_iterator()
    assert x1.shape == x0.shape == (16, 32, 32, 3) and x1.dtype == np.float32
    assert 0.0 <= x1.min() and x1.max() <= 1.0
    np.testing.assert_array_equal(y0, y1)  # the same seeded shuffle, so the same order
    assert not np.array_equal(x0, x1)
    np.testing.assert_array_equal(x1, x2)  # reproducible
    assert not np.array_equal(x1, x3) and not np.array_equal(x1, x1_epoch2)  # other seed, next epoch
    np.testing.assert_array_equal(t0, t1)  # the test split is never augmented
    mean, sd = (np.array(v, np.float32) for v in pipelines.CIFAR_MEAN_STD["cifar10"])
    np.testing.assert_allclose(xs, (x0 - mean) / sd, rtol=1e-5, atol=1e-5)


def test_augment_cifar_is_a_shifted_and_maybe_flipped_copy():
    image = np.random.default_rng(0).integers(1, 256, size=(32, 32, 3)).astype(np.uint8)
    out = pipelines.augment_cifar(tf.constant(image), tf.constant([5, 7], tf.int64)).numpy()
    np.testing.assert_array_equal(out, pipelines.augment_cifar(tf.constant(image), tf.constant([5, 7], tf.int64)))
    padded = np.pad(image, ((4, 4), (4, 4), (0, 0)))
    candidates = [
        view
        for i in range(9)
        for j in range(9)
        for view in (padded[i:i + 32, j:j + 32], padded[i:i + 32, j:j + 32][:, ::-1])
    ]
    assert out.shape == image.shape and any(np.array_equal(out, c) for c in candidates)


def test_imdb_text_vectorization():
    with tfds.testing.mock_data(num_examples=MOCK_N):
        data = datasets.load_pipeline("imdb_reviews", batch_size=8)
        vectorizer = datasets.text_vectorizer(data, max_tokens=50)
        encoded = datasets.vectorize_text(data, vectorizer)
        batches = list(encoded.train.as_numpy_iterator())
        (val_x, _), *_ = encoded.validation.as_numpy_iterator()
    assert 2 < vectorizer.vocabulary_size() <= 50
    assert encoded.input_shape == (120,) and encoded.num_examples == data.num_examples
    x, y = batches[0]
    assert x.shape == (8, 120) and np.issubdtype(x.dtype, np.integer) and y.dtype == np.int32
    assert val_x.shape[1] == 120
    tokens = np.concatenate([b[0] for b in batches])
    assert tokens.min() >= 0 and tokens.max() < 50 and (tokens > 1).any()
    with pytest.raises(ValueError, match="Expected a DataPipeline of text"):
        datasets.text_vectorizer(datasets.load_pipeline("moons"))


def test_offline_pipelines():
    digits = datasets.load_pipeline("digits", batch_size=64, seed=0)
    flat = datasets.load_pipeline("digits", batch_size=64, seed=0, flatten=True)
    assert digits.input_shape == (8, 8, 1) and flat.input_shape == (64,)
    assert (digits.num_examples, digits.num_validation, digits.num_test) == (1293, 144, 360)
    x, y = next(digits.train.as_numpy_iterator())
    assert x.shape == (64, 8, 8, 1) and x.dtype == np.float32 and y.dtype == np.int32
    assert 0.0 <= x.min() and x.max() <= 1.0
    vx, _ = next(flat.validation.as_numpy_iterator())
    np.testing.assert_array_equal(vx, next(digits.validation.as_numpy_iterator())[0].reshape(len(vx), 64))

    curve = datasets.load_pipeline("toy_regression", batch_size=64, validation_fraction=0.0)
    cubic = datasets.load_pipeline("cubic", batch_size=64, validation_fraction=0.0)
    assert curve.num_examples == 40 and cubic.num_examples == 30
    assert curve.num_classes is None and curve.input_shape == (1,)
    _, yc = next(curve.train.as_numpy_iterator())
    assert yc.shape == (40, 1) and yc.dtype == np.float32


def test_hold_out_is_seeded():
    moons = datasets.make_moons(num_examples=200, seed=0)
    arrays = (moons.x_train, moons.y_train, moons.x_test, moons.y_test)

    def held_out(seed):
        data = datasets.from_arrays(*arrays, num_classes=2, name="moons", batch_size=256, seed=seed)
        assert data.num_examples + data.num_validation == 160 and data.num_validation == 16
        return {_digest(x) for x in _examples(data.validation)[0]}

    assert held_out(1) == held_out(1) != held_out(2)


def test_pipeline_trains_a_bayesian_model_with_its_n():
    data = datasets.load_pipeline("digits", batch_size=128, flatten=True, seed=0)
    output = tfbnn.layers.DenseLocalReparameterization(data.num_classes, activation="softmax", seed=1)
    model = keras.Sequential([keras.Input(data.input_shape), output])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    annealing = tfbnn.KLAnnealing(num_examples=data.num_examples, schedule="constant")
    history = model.fit(data.train, validation_data=data.validation, epochs=1, callbacks=[annealing], verbose=0)
    assert np.isfinite(history.history["val_loss"][0])
    assert float(model.layers[-1].kl_weight.numpy()) == pytest.approx(1.0 / 1293)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "xyz"}, r"Unknown dataset.*Received: dataset='xyz'"),
        ({"name": "svhn"}, r"Unknown dataset.*Received: dataset='svhn'"),
        ({"name": "digits", "validation_fraction": 1.0}, "Received: validation_fraction=1.0"),
        ({"name": "digits", "batch_size": 0}, "Received: batch_size=0"),
        ({"name": "digits", "max_examples": -3}, "Received: max_examples=-3"),
        ({"name": "digits", "seed": -1}, "Received: seed=-1"),
        ({"name": "mnist", "augment": True}, "Received: augment=True"),
        ({"name": "mnist", "standardize": True}, "Received: standardize=True"),
        ({"name": "imdb_reviews", "flatten": True}, "Received: flatten=True"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        datasets.load_pipeline(**kwargs)
