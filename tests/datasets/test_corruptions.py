import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import evaluation
from tfbnn.datasets import corruptions

X = np.random.default_rng(0).uniform(size=(20, 6)).astype("float32")


def test_gaussian_noise_by_hand():
    eps = np.random.default_rng(5).standard_normal(X.shape)
    np.testing.assert_allclose(corruptions.gaussian_noise(X, 0.3, seed=5), 0.7 * X + 0.3 * eps, rtol=1e-6)
    np.testing.assert_array_equal(corruptions.gaussian_noise(X, 0.0, seed=5), X)
    np.testing.assert_allclose(corruptions.gaussian_noise(X, 1.0, seed=5), eps, rtol=1e-6)
    out = corruptions.gaussian_noise(X, 0.5, seed=1)
    assert out.shape == X.shape and out.dtype == np.float32


def test_salt_and_pepper_by_hand():
    rng = np.random.default_rng(7)
    corrupt = rng.random(X.shape) < 0.3
    salt = rng.random(X.shape) < 0.5
    expected = np.where(corrupt, np.where(salt, 1.0, 0.0), X)
    np.testing.assert_array_equal(corruptions.salt_and_pepper(X, 0.3, seed=7), expected)
    np.testing.assert_array_equal(corruptions.salt_and_pepper(X, 0.0, seed=7), X)
    full = corruptions.salt_and_pepper(X, 1.0, seed=7, low=-1.0, high=2.0)
    assert set(np.unique(full)) == {-1.0, 2.0}
    big = corruptions.salt_and_pepper(np.full((200, 100), 0.5, "float32"), 0.2, seed=0)
    assert np.mean(big != 0.5) == pytest.approx(0.2, abs=0.01)
    assert np.mean(big == 1.0) == pytest.approx(0.1, abs=0.01)


@pytest.mark.parametrize("fn, level", [(corruptions.gaussian_noise, 0.4), (corruptions.salt_and_pepper, 0.4)])
def test_seeded_reproducibility(fn, level):
    np.testing.assert_array_equal(fn(X, level, seed=3), fn(X, level, seed=3))
    assert not np.array_equal(fn(X, level, seed=3), fn(X, level, seed=4))
    # A Generator continues its stream: two draws from one generator differ.
    rng = np.random.default_rng(3)
    first, second = fn(X, level, seed=rng), fn(X, level, seed=rng)
    np.testing.assert_array_equal(first, fn(X, level, seed=3))
    assert not np.array_equal(first, second)


BAD_CALLS = [
    (lambda: corruptions.gaussian_noise(X, -0.1, seed=0), "gamma=-0.1"),
    (lambda: corruptions.gaussian_noise(X, 1.5, seed=0), "gamma=1.5"),
    (lambda: corruptions.gaussian_noise(X, float("nan"), seed=0), "gamma=nan"),
    (lambda: corruptions.salt_and_pepper(X, 2, seed=0), "p=2"),
    (lambda: corruptions.salt_and_pepper(X, 0.1, seed=0, low=1.0, high=0.0), "low=1.0, high=0.0"),
    (lambda: corruptions.gaussian_noise(X, 0.1, seed=-1), "seed=-1"),
    (lambda: corruptions.gaussian_noise(np.array(["a"]), 0.1, seed=0), "dtype"),
    (lambda: evaluation.shift_sweep(None, X, np.zeros(20), corruption="blur"), "corruption='blur'"),
    (lambda: evaluation.shift_sweep(None, X, np.zeros(20), levels=(0.0, 1.2)), "gamma=1.2"),
    (lambda: evaluation.shift_sweep(None, X, np.zeros(20), "salt_and_pepper", levels=(-0.5,)), "p=-0.5"),
    (lambda: evaluation.shift_sweep(None, X, np.zeros(19)), r"x.shape=\(20, 6\), y.shape=\(19,\)"),
]


@pytest.mark.parametrize("call, match", BAD_CALLS, ids=[match for _, match in BAD_CALLS])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_shift_sweep_on_a_trained_bayesian_classifier():
    rng = np.random.default_rng(0)
    centers = rng.uniform(size=(3, 8)) * 2.0
    y = rng.integers(0, 3, size=300)
    x = (centers[y] + 0.15 * rng.normal(size=(300, 8))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            tfbnn.DenseLocalReparameterization(16, activation="relu", kl_weight=1 / 300, seed=1),
            tfbnn.DenseLocalReparameterization(3, activation="softmax", kl_weight=1 / 300, seed=2),
        ]
    )
    model.compile(keras.optimizers.Adam(0.03), "sparse_categorical_crossentropy")
    batches = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(300, seed=0).batch(50).repeat(15)
    model.fit(batches, epochs=1, shuffle=False, verbose=0)  # 90 steps in one epoch: less per-epoch overhead

    levels = (0.0, 0.5, 1.0)
    rows = evaluation.shift_sweep(model, x[:150], y[:150], "gaussian", levels=levels, num_samples=10, seed=0)
    assert [r["level"] for r in rows] == list(levels)
    keys = {"level", "accuracy", "nll", "ece", "predictive_entropy", "expected_entropy", "mutual_information"}
    assert all(set(r) == keys for r in rows)
    assert rows[0]["accuracy"] > 0.9
    assert rows[-1]["predictive_entropy"] > rows[0]["predictive_entropy"] + 0.2
    for r in rows:
        assert r["mutual_information"] == pytest.approx(r["predictive_entropy"] - r["expected_entropy"], abs=1e-5)
    with tfbnn.posterior_mean(model):  # a deterministic model: equal seeds give equal rows
        twice = [evaluation.shift_sweep(model, x[:150], y[:150], levels=levels, num_samples=10, seed=4) for _ in range(2)]
    assert twice[0] == twice[1]
    assert all(r["mutual_information"] == pytest.approx(0.0, abs=1e-6) for r in twice[0])

    sp = evaluation.shift_sweep(model, x[:150], y[:150], "salt_and_pepper", num_samples=10, seed=1)
    assert [r["level"] for r in sp] == list(corruptions.DEFAULT_LEVELS["salt_and_pepper"])


def test_shift_sweep_takes_an_adaptive_sampling_and_the_old_keywords_with_a_warning():
    y = np.zeros(20, int)

    def model():
        keras.utils.set_random_seed(0)  # the initial posterior; the layer's seed drives the noise
        return keras.Sequential([keras.Input((6,)), tfbnn.DenseFlipout(3, activation="softmax", seed=1)])

    def sweep(**kwargs):
        return evaluation.shift_sweep(model(), X, y, levels=(0.0, 0.5), seed=0, **kwargs)

    rule = tfbnn.inference.AdaptiveSampling(tolerance=0.05, max_samples=64)
    new = sweep(num_samples=rule)
    assert all(16 <= r["mean_samples_used"] <= 64 for r in new)
    with pytest.warns(DeprecationWarning, match=r"`tolerance=` is deprecated; pass num_samples="
                                                r"tfbnn.inference.AdaptiveSampling\(tolerance=...\)"):
        old = sweep(num_samples="auto", tolerance=0.05, max_samples=64)
    assert old == new
    with pytest.raises(ValueError, match=r"`max_samples` applies to num_samples='auto'"):
        sweep(num_samples=5, max_samples=64)
    numbers = evaluation.evaluate_classifier(model(), X, y, num_samples=rule, sweep_levels=()).numbers
    assert numbers["num_samples"] == "auto" and numbers["tolerance"] == 0.05
