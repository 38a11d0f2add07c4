"""tfbnn.datasets: the offline digits / moons datasets, the tfds loader (mock data), load()."""

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfbnn.datasets as datasets


def test_digits_split_sizes_dtypes_and_range():
    ds = datasets.load_digits()
    assert isinstance(ds, datasets.ArrayDataset)
    assert ds.name == "digits" and ds.num_classes == 10
    assert ds.x_train.shape == (1437, 64) and ds.x_test.shape == (360, 64)
    assert ds.y_train.shape == (1437,) and ds.y_test.shape == (360,)
    assert ds.num_examples == 1437 and ds.num_test_examples == 360 and ds.input_shape == (64,)
    assert ds.x_train.dtype == np.float32 and ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == np.int32 and ds.y_test.dtype == np.int32
    for x in (ds.x_train, ds.x_test):
        assert x.min() == 0.0 and x.max() == 1.0
    # Stratified: every class in both parts, in about the same proportion.
    train_freq = np.bincount(ds.y_train, minlength=10) / len(ds.y_train)
    test_freq = np.bincount(ds.y_test, minlength=10) / len(ds.y_test)
    assert np.all(test_freq > 0) and np.abs(train_freq - test_freq).max() < 0.01


def test_digits_split_is_seeded():
    a, b, c = datasets.load_digits(seed=3), datasets.load_digits(seed=3), datasets.load_digits(seed=4)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_train, c.x_train)
    small = datasets.load_digits(test_fraction=0.5, seed=0)
    assert small.num_test_examples + small.num_examples == 1797 and small.num_test_examples in (898, 899)


@pytest.mark.parametrize(
    "kwargs, name",
    [({"test_fraction": 0.0}, "test_fraction"), ({"test_fraction": 1.5}, "test_fraction"), ({"seed": -1}, "seed")],
)
def test_digits_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"Received: {name}="):
        datasets.load_digits(**kwargs)


def test_moons():
    ds = datasets.make_moons(num_examples=500, noise=0.2, seed=1)
    assert ds.name == "moons" and ds.num_classes == 2
    assert ds.x_train.shape == (400, 2) and ds.x_test.shape == (100, 2) and ds.num_examples == 400
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert set(np.unique(ds.y_train)) == {0, 1} and set(np.unique(ds.y_test)) == {0, 1}
    again = datasets.make_moons(num_examples=500, noise=0.2, seed=1)
    np.testing.assert_array_equal(ds.x_train, again.x_train)
    assert not np.array_equal(ds.x_train, datasets.make_moons(500, 0.2, seed=2).x_train)
    with pytest.raises(ValueError, match="Received: noise=-0.1"):
        datasets.make_moons(noise=-0.1)
    with pytest.raises(ValueError, match="Received: num_examples=0"):
        datasets.make_moons(num_examples=0)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_tfds_loader_under_mock_data(name):
    with tfds.testing.mock_data(num_examples=24):
        ds = datasets.load_tfds(name)
        capped = datasets.load(name, max_examples=10, max_test_examples=5)
    assert ds.name == name and ds.num_classes == 10
    assert ds.x_train.shape == (24, 784) and ds.x_test.shape == (24, 784)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert ds.y_train.min() >= 0 and ds.y_train.max() < 10
    assert ds.num_examples == 24  # N is the count actually loaded
    assert capped.num_examples == 10 and capped.num_test_examples == 5
    # Fewer examples than asked for: N is what was there, not max_examples.
    with tfds.testing.mock_data(num_examples=6):
        assert datasets.load_tfds(name, max_examples=1000).num_examples == 6


@pytest.mark.parametrize("name, num_classes", [("cifar10", 10), ("cifar100", 100)])
def test_load_images_gives_rgb_cifar_under_mock_data(name, num_classes):
    """CIFAR as (n, 32, 32, 3) float32 in [0, 1]: tfds' own uint8 images divided by 255, in the split's order."""
    with tfds.testing.mock_data(num_examples=7):
        ds = datasets.load_images(name, max_test_examples=5)
        (train, test) = tfds.load(name, split=["train", "test"], as_supervised=True, shuffle_files=False)
        raw = [(np.asarray(x), int(y)) for x, y in train.take(7)]
    assert ds.name == name and ds.num_classes == num_classes
    assert ds.x_train.shape == (7, 32, 32, 3) and ds.x_test.shape == (5, 32, 32, 3) and ds.input_shape == (32, 32, 3)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    np.testing.assert_array_equal(ds.x_train, np.stack([x for x, _ in raw]).astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(ds.y_train, [y for _, y in raw])
    assert not np.array_equal(ds.x_train[..., 0], ds.x_train[..., 1])  # three real channels, not grey copies


def test_load_images_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"Expected one of \['digits', 'mnist', 'fashion_mnist', 'cifar10', "
                                         r"'cifar100'\]. Received: dataset='moons'"):
        datasets.load_images("moons")
    with pytest.raises(ValueError, match="Received: max_examples=0"):
        datasets.load_images("cifar10", max_examples=0)
    with pytest.raises(ValueError, match="Received: max_test_examples=-2"):
        datasets.load_images("cifar100", max_test_examples=-2)
    with pytest.raises(ValueError, match="not digits"):
        datasets.load_images("digits", max_examples=5)


def test_tfds_loader_rejects_bad_arguments():
    with pytest.raises(ValueError, match="Received: dataset='cifar10'"):
        datasets.load_tfds("cifar10")
    with pytest.raises(ValueError, match="Received: max_examples=0"):
        datasets.load_tfds("mnist", max_examples=0)


def test_tfds_loaders_turn_a_missing_dataset_into_one_runtime_error(tmp_path):
    """No data in data_dir and no download: each tfds loader says which dataset, why, and the original error."""
    from tfbnn.datasets import pipelines, text

    with pytest.raises(RuntimeError, match=r"Could not load 'mnist' with tensorflow-datasets.*no internet access\?\)"):
        datasets.load_tfds("mnist", data_dir=str(tmp_path), download=False)
    with pytest.raises(RuntimeError, match=r"'imdb_reviews'.*synthetic_reviews works offline\)\. \w+"):
        text.load_imdb(data_dir=str(tmp_path), download=False)
    with pytest.raises(RuntimeError, match=r"Could not load 'fashion_mnist'") as info:
        pipelines._load_tfds("fashion_mnist", str(tmp_path), False, None, None)
    assert info.value.__cause__ is not None  # the original tfds error is chained


def test_load_dispatch_and_unknown_name():
    assert datasets.load("digits", seed=1).name == "digits"
    assert datasets.load("moons", num_examples=100, noise=0.1, seed=0).num_examples == 80
    assert set(datasets.DATASETS) == {"digits", "moons", "mnist", "fashion_mnist"}
    with pytest.raises(ValueError, match=r"Unknown dataset.*Received: dataset='xyz'"):
        datasets.load("xyz")
    with pytest.raises(ValueError, match="unexpected keyword argument"):
        datasets.load("digits", max_examples=5)


def test_a_module_tensorflow_datasets_misses_is_named_as_an_install_problem(monkeypatch):
    """Issue "One way to run a study", item 5: a fresh install failed with "No module named
    'importlib_resources'" and the message blamed the network."""
    def load(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'importlib_resources'", name="importlib_resources")

    monkeypatch.setattr(tfds, "load", load)
    for call in (lambda: datasets.load_tfds("mnist"), lambda: datasets.load_pipeline("cifar10")):
        with pytest.raises(RuntimeError) as info:
            call()
        message = str(info.value)
        assert "pip install importlib_resources" in message and "not the network" in message
        assert "internet" not in message


def test_importlib_resources_is_declared_and_importable():
    import re

    import importlib_resources  # noqa: F401  (tensorflow-datasets imports it undeclared)

    pyproject = open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "pyproject.toml")).read()
    dependencies = pyproject.split("dependencies = [", 1)[1].split("\n]", 1)[0]
    assert re.search(r'"importlib[_-]resources"', dependencies)


def test_a_failed_download_leaves_no_partial_files(tmp_path, monkeypatch):
    data_dir = tmp_path / "tfds"
    kept = data_dir / "mnist" / "2.0.0" / "dataset_info.json"  # prepared earlier: stays
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")

    def load(name, data_dir=None, **kwargs):
        partial = os.path.join(data_dir, name, "3.0.1.incomplete7H3K")
        os.makedirs(partial)
        open(os.path.join(partial, "mnist-train.tfrecord-00000-of-00001"), "w").write("half")
        os.makedirs(os.path.join(data_dir, "downloads", "extracted"))
        open(os.path.join(data_dir, "downloads", "train-images.gz.tmp"), "w").write("half")
        raise ConnectionError("Temporary failure in name resolution")

    monkeypatch.setattr(tfds, "load", load)
    with pytest.raises(RuntimeError, match="no internet access.*ConnectionError"):
        datasets.load_tfds("mnist", data_dir=str(data_dir))
    left = sorted(os.path.relpath(os.path.join(p, n), data_dir) for p, ds, fs in os.walk(data_dir) for n in ds + fs)
    assert left == ["mnist", os.path.join("mnist", "2.0.0"), os.path.join("mnist", "2.0.0", "dataset_info.json")]
