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


# -- image corruptions (Hendrycks & Dietterich 2019) ------------------------------------------------

GRAY = np.random.default_rng(1).uniform(0.1, 0.9, size=(6, 8, 8, 1)).astype("float32")
RGB = np.random.default_rng(2).uniform(0.1, 0.9, size=(3, 12, 12, 3)).astype("float32")


@pytest.mark.parametrize("name", corruptions.IMAGE_CORRUPTIONS)
def test_image_corruption_range_shape_seed_and_severity(name):
    for x, severities in ((GRAY, range(1, 6)), (RGB, (1, 5))):
        outs = [corruptions.corrupt_images(x, name, s, seed=3) for s in severities]
        for out in outs:
            assert out.shape == x.shape and out.dtype == np.float32
            assert out.min() >= 0.0 and out.max() <= 1.0
        mse = [np.mean((out - x) ** 2) for out in outs]
        assert all(a < b for a, b in zip(mse, mse[1:])), mse  # the distortion grows with the severity
    again = corruptions.corrupt_images(GRAY, name, 3, seed=3)
    np.testing.assert_array_equal(again, corruptions.corrupt_images(GRAY, name, 3, seed=3))
    if name in ("gaussian_noise", "shot_noise", "impulse_noise", "motion_blur"):  # the random ones
        assert not np.array_equal(again, corruptions.corrupt_images(GRAY, name, 3, seed=4))


def test_transform_is_per_example_and_order_free():
    """Element i's corruption depends on the seed and i only: the same under a shuffled, parallel map."""
    transform = corruptions.corruption_transform("gaussian_noise", 2, seed=7)
    ds = tf.data.Dataset.from_tensor_slices((GRAY, np.arange(6))).enumerate()
    parallel = ds.shuffle(6, seed=0).map(transform, num_parallel_calls=2)
    got = {int(label): image.numpy() for image, label in parallel}
    expected = corruptions.corrupt_images(GRAY, "gaussian_noise", 2, seed=7)
    for i in range(6):
        np.testing.assert_array_equal(got[i], expected[i])
    assert not np.allclose(expected[0] - GRAY[0], expected[1] - GRAY[1])  # each example its own noise
    d = next(iter(tf.data.Dataset.from_tensor_slices({"image": GRAY, "id": np.arange(6)}).enumerate().map(transform)))
    np.testing.assert_array_equal(d["image"], expected[0])


def test_noise_statistics():
    flat = np.full((40, 16, 16, 1), 0.5, "float32")  # 10,240 elements, far from the clipping
    noise = corruptions.corrupt_images(flat, "gaussian_noise", 5, seed=0) - 0.5
    assert abs(noise.mean()) < 4 * 0.1 / np.sqrt(noise.size) and noise.std() == pytest.approx(0.10, rel=0.03)
    shot = corruptions.corrupt_images(flat, "shot_noise", 5, seed=0) * 50.0  # Poisson(50 * 0.5) counts
    np.testing.assert_allclose(shot, np.round(shot), atol=1e-3)
    assert shot.mean() == pytest.approx(25.0, abs=4 * 5 / np.sqrt(shot.size))
    assert shot.var() == pytest.approx(25.0, rel=0.05)
    impulse = corruptions.corrupt_images(flat, "impulse_noise", 5, seed=0)
    assert np.mean(impulse != 0.5) == pytest.approx(0.07, abs=0.01)
    assert np.mean(impulse == 1.0) == pytest.approx(0.035, abs=0.008)


@pytest.mark.parametrize("severity", [1, 5])
def test_contrast_and_brightness_against_numpy(severity):
    c = corruptions.SEVERITY_PARAMETERS["contrast"][severity - 1]
    mean = RGB.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(corruptions.corrupt_images(RGB, "contrast", severity),
                               np.clip((RGB - mean) * c + mean, 0, 1), atol=1e-6)
    b = corruptions.SEVERITY_PARAMETERS["brightness"][severity - 1]
    np.testing.assert_allclose(corruptions.corrupt_images(GRAY, "brightness", severity), np.clip(GRAY + b, 0, 1),
                               atol=1e-6)
    import colorsys

    def brighten(pixel):
        h, s, v = colorsys.rgb_to_hsv(*pixel)
        return colorsys.hsv_to_rgb(h, s, min(1.0, v + b))

    expected = np.apply_along_axis(brighten, -1, RGB.astype(np.float64))
    np.testing.assert_allclose(corruptions.corrupt_images(RGB, "brightness", severity), expected, atol=1e-5)


def test_pixelate_is_block_mean_and_nearest_upsampling():
    assert corruptions.pixelate_size(8, 4) == 4  # 2x2 blocks on the 8x8 digits
    blocks = GRAY.reshape(6, 4, 2, 4, 2, 1).mean(axis=(2, 4))
    expected = blocks.repeat(2, axis=1).repeat(2, axis=2)
    np.testing.assert_allclose(corruptions.corrupt_images(GRAY, "pixelate", 4), expected, atol=1e-6)
    x = RGB[:, :4, :4]
    assert corruptions.pixelate_size(4, 2) == 2  # 2x2 blocks, colour
    expected = x.reshape(3, 2, 2, 2, 2, 3).mean(axis=(2, 4)).repeat(2, axis=1).repeat(2, axis=2)
    np.testing.assert_allclose(corruptions.corrupt_images(x, "pixelate", 2), expected, atol=1e-6)


@pytest.mark.parametrize("severity", [2, 5])
def test_defocus_blur_against_scipy(severity):
    import scipy.ndimage

    radius, alias = corruptions.SEVERITY_PARAMETERS["defocus_blur"][severity - 1]
    kernel = corruptions.disk_kernel(radius, alias)
    assert kernel.sum() == pytest.approx(1.0) and np.allclose(kernel, kernel.T) and np.allclose(kernel, kernel[::-1])
    for x in (GRAY, RGB):
        expected = np.stack([np.stack([scipy.ndimage.convolve(img[..., ch].astype(np.float64), kernel, mode="mirror")
                                       for ch in range(x.shape[-1])], -1) for img in x])
        np.testing.assert_allclose(corruptions.corrupt_images(x, "defocus_blur", severity), np.clip(expected, 0, 1),
                                   atol=1e-5)


def test_disk_kernel_is_the_disk_when_unblurred():
    """With a tiny alias blur the kernel is the normalized integer disk: 5 pixels for r = 1, 9 for r = 1.5."""
    np.testing.assert_allclose(corruptions.disk_kernel(1.0, 1e-3), np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]]) / 5,
                               atol=1e-12)
    np.testing.assert_allclose(corruptions.disk_kernel(1.5, 1e-3), np.ones((3, 3)) / 9, atol=1e-12)


def test_blurs_keep_a_flat_image_and_zoom_is_deterministic():
    flat = np.full((2, 12, 12, 3), 0.3, "float32")
    for name in ("defocus_blur", "motion_blur", "zoom_blur"):
        np.testing.assert_allclose(corruptions.corrupt_images(flat, name, 5, seed=1), flat, atol=1e-6)
    np.testing.assert_array_equal(corruptions.corrupt_images(RGB, "zoom_blur", 3, seed=0),
                                  corruptions.corrupt_images(RGB, "zoom_blur", 3, seed=9))


def test_jpeg_matches_an_encode_decode_and_loses_more_at_lower_quality():
    out = corruptions.corrupt_images(RGB, "jpeg_compression", 5)
    pixels = np.round(RGB[0] * 255).astype(np.uint8)
    np.testing.assert_array_equal(out[0] * 255, tf.io.decode_jpeg(tf.io.encode_jpeg(pixels, quality=40)).numpy())
    np.testing.assert_allclose(out * 255, np.round(out * 255), atol=1e-3)  # 8-bit levels


IMAGE_BAD_CALLS = [
    (lambda: corruptions.corruption_transform("blur", 1), r"Expected one of \['gaussian_noise', .*name='blur'"),
    (lambda: corruptions.corruption_transform("contrast", 0), "severity=0"),
    (lambda: corruptions.corruption_transform("contrast", 6), "severity=6"),
    (lambda: corruptions.corruption_transform("contrast", 2.0), "severity=2.0"),
    (lambda: corruptions.corruption_transform("contrast", 2, seed=-1), "seed=-1"),
    (lambda: corruptions.corrupt_images(GRAY[..., 0], "contrast", 2), r"x.shape=\(6, 8, 8\)"),
    (lambda: corruptions.corrupt_images(GRAY * 2, "contrast", 2), r"values in \[0, 1\]"),
    (lambda: corruptions.corrupt_image(np.zeros((8, 8, 2)), "contrast", 2, [0, 0]), r"image.shape=\(8, 8, 2\)"),
]


@pytest.mark.parametrize("call, match", IMAGE_BAD_CALLS, ids=[m for _, m in IMAGE_BAD_CALLS])
def test_image_corruption_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
