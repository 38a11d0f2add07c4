"""One way to use a fitted posterior (issue 36, 9): Laplace, SWAG and HMC through tfbnn.predict, save and export.

The same tiny classifier under each posterior: ``tfbnn.predict(posterior, x, num_samples=T, seed=s)`` against an
independent NumPy forward pass of the posterior's own draws (and each posterior's older path), the ``.npz``
round trip through ``load_posterior``, and the exported SavedModel's ``summary`` against ``tfbnn.predict``.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import hmc, laplace, swag
from tfbnn.inference import FittedPosterior, load_posterior

D_IN, HIDDEN, K = 3, 5, 3


@pytest.fixture(scope="module")
def setting():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((D_IN,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                              keras.layers.Dense(K, activation="softmax")])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, D_IN)).astype("float32")
    y = rng.integers(0, K, 30)
    theta = np.concatenate([v.numpy().ravel() for v in model.trainable_variables]).astype(np.float64)
    size = theta.size
    posteriors = {
        "laplace": laplace.fit(model, x, y, hessian="kron", prior_precision=0.5),
        "laplace_all": laplace.fit(model, x, y, subset="all", hessian="diag"),
        "swag": swag.SWAGPosterior(model, theta, np.full(size, 0.01), 0.1 * rng.normal(size=(size, 4)), seed=5),
        "hmc": hmc.HMCResult(model=model, samples=theta + 0.1 * rng.normal(size=(2, 10, size)), noise=None,
                             likelihood="categorical", noise_scale=None, r_hat=np.ones(size), ess=np.ones(size),
                             acceptance_rate=np.ones(2), step_size=0.1, seconds=0.0, kernel="nuts"),
    }
    return model, x, posteriors


def _np_probs(model, draws, x):
    """Class probabilities (T, N, K) of the MLP with each flat weight draw, in float64 NumPy."""
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    out = []
    for theta in draws:
        parts = np.split(theta, np.cumsum([int(np.prod(s)) for s in shapes])[:-1])
        w1, b1, w2, b2 = (p.reshape(s) for p, s in zip(parts, shapes))
        f = np.tanh(x.astype(np.float64) @ w1 + b1) @ w2 + b2
        e = np.exp(f - f.max(axis=-1, keepdims=True))
        out.append(e / e.sum(axis=-1, keepdims=True))
    return np.stack(out)


def _full_draws(model, name, posterior, draws):
    """A last-layer Laplace draw ``[kernel; bias]`` (d + 1, K) as a draw of all the model's weights."""
    if name != "laplace":
        return draws
    fixed = np.concatenate([v.numpy().ravel() for v in model.trainable_variables[:2]]).astype(np.float64)
    w = draws.reshape(len(draws), HIDDEN + 1, K)
    return np.concatenate([np.tile(fixed, (len(draws), 1)), w[:, :-1].reshape(len(draws), -1), w[:, -1]], axis=1)


@pytest.mark.parametrize("name", ["laplace", "laplace_all", "swag", "hmc"])
def test_predict_takes_each_posterior_with_a_seed(setting, name):
    model, x, posteriors = setting
    post = posteriors[name]
    assert isinstance(post, FittedPosterior)
    res = tfbnn.predict(post, x[:4], num_samples=6, seed=3, return_samples=True)
    draws = _full_draws(model, name, post, post.weight_draws(6, seed=3))
    np.testing.assert_allclose(res.samples, _np_probs(model, draws, x[:4]), atol=1e-5)
    np.testing.assert_allclose(res.mean_probs, res.samples.mean(axis=0), atol=1e-6)
    again = tfbnn.predict(post, x[:4], num_samples=6, seed=3, return_samples=True)
    np.testing.assert_array_equal(res.samples, again.samples)
    other = tfbnn.predict(post, x[:4], num_samples=6, seed=4, return_samples=True)
    assert np.array_equal(res.samples, other.samples) == (name == "hmc")  # HMC's draws are its chains'


def test_predict_matches_each_posteriors_older_path(setting):
    model, x, posteriors = setting
    la = posteriors["laplace"]
    glm = la.predict(x[:4], link_approx="mc", num_samples=20000, seed=0)
    np.testing.assert_allclose(tfbnn.predict(la, x[:4], num_samples=4000, seed=1).mean_probs, glm, atol=0.015)
    np.testing.assert_allclose(tfbnn.predict(la.to_model(seed=1), x[:4], num_samples=4000).mean_probs, glm,
                               atol=0.015)
    old = posteriors["swag"]  # a SWAG posterior made with seed 5 draws as predict's seed=5 does
    fresh = swag.SWAGPosterior(model, old.mean, old.diagonal, old.deviation_matrix, seed=5)
    np.testing.assert_array_equal(tfbnn.predict(fresh, x[:4], num_samples=5, return_samples=True).samples,
                                  tfbnn.predict(old, x[:4], num_samples=5, seed=5, return_samples=True).samples)
    result = posteriors["hmc"]
    np.testing.assert_allclose(result.predictive(x[:4]).mean_probs,
                               _np_probs(model, result.pooled(), x[:4]).mean(axis=0), atol=1e-5)


def test_laplace_regression_reports_the_noise_as_aleatoric():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((D_IN,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                              keras.layers.Dense(2)])
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, D_IN)).astype("float32"), rng.normal(size=(30, 2))
    la = laplace.fit(model, x, y, likelihood="regression", hessian="full", sigma_noise=0.4)
    res = tfbnn.predict(la, x[:4], num_samples=4000, seed=0)
    old = la.predict(x[:4])
    np.testing.assert_allclose(res.aleatoric_std, 0.4, rtol=1e-6)
    np.testing.assert_allclose(res.epistemic_std, old.epistemic_std, rtol=0.06)
    assert np.all(np.abs(res.mean - old.mean) < 5 * old.epistemic_std / np.sqrt(4000))


@pytest.mark.parametrize("name", ["laplace", "laplace_all", "swag", "hmc"])
def test_save_and_load_posterior_round_trip(setting, name, tmp_path):
    model, x, posteriors = setting
    post = posteriors[name]
    path = str(tmp_path / f"{name}.npz")
    post.save(path)
    back = load_posterior(path, model)
    assert type(back) is type(post)
    np.testing.assert_array_equal(back.weight_draws(5, seed=2), post.weight_draws(5, seed=2))
    np.testing.assert_array_equal(tfbnn.predict(back, x[:4], num_samples=5, seed=2).mean_probs,
                                  tfbnn.predict(post, x[:4], num_samples=5, seed=2).mean_probs)


def test_the_swag_callback_saves_and_predicts_as_its_posterior(setting, tmp_path):
    model, x, posteriors = setting
    collector = swag.SWAG(max_rank=3)
    collector.set_model(model)
    rng = np.random.default_rng(2)
    for _ in range(4):
        collector.collect(posteriors["swag"].mean + 0.1 * rng.normal(size=posteriors["swag"].mean.shape))
    path = str(tmp_path / "swag.npz")
    collector.save(path)
    back = load_posterior(path, model)
    assert isinstance(back, swag.SWAG) and back.num_snapshots == 4
    expected = tfbnn.predict(collector.posterior(seed=7), x[:4], num_samples=5).mean_probs
    np.testing.assert_array_equal(tfbnn.predict(back, x[:4], num_samples=5, seed=7).mean_probs, expected)
    np.testing.assert_array_equal(swag.load(path, model).mean, collector.mean)  # the old entry point


@pytest.mark.parametrize("name", ["laplace", "laplace_all", "swag", "hmc"])
def test_export_serves_the_seeded_predictive(setting, name, tmp_path):
    model, x, posteriors = setting
    post = posteriors[name]
    path = tfbnn.export.export(post, str(tmp_path / name), num_samples=8, seed=3)
    served = tf.saved_model.load(path)
    expected = tfbnn.predict(post, x[:4], num_samples=8, seed=3, return_samples=True)
    summary = served.signatures["serving_default"](x=tf.constant(x[:4]))
    np.testing.assert_allclose(summary["mean_probs"], expected.mean_probs, atol=1e-5)
    np.testing.assert_allclose(summary["epistemic"], expected.mutual_information, atol=1e-5)
    np.testing.assert_allclose(served.samples(tf.constant(x[:4])), expected.samples, atol=1e-5)
    bad = x[:2].copy()
    bad[0, 0] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected finite inputs"):
        served.summary(tf.constant(bad))


def test_bad_arguments(setting, tmp_path):
    model, x, posteriors = setting
    la = posteriors["laplace"]
    with pytest.raises(ValueError, match=r"Received: seed=3 with model of type Sequential"):
        tfbnn.predict(model, x, seed=3)
    with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\).*seed=-1"):
        tfbnn.predict(la, x, num_samples=2, seed=-1)
    with pytest.raises(ValueError, match="from_logits=True"):
        tfbnn.predict(la, x, num_samples=2, from_logits=True)
    with pytest.raises(ValueError, match="task='regression'"):
        tfbnn.predict(la, x, num_samples=2, task="regression")
    bad = x[:3].copy()
    bad[2, 0] = np.inf
    for post in posteriors.values():
        with pytest.raises(ValueError, match=r"Received: x with NaN or infinite values in rows \[2\]"):
            tfbnn.predict(post, bad, num_samples=2)
    with pytest.raises(ValueError, match="format='tflite'"):
        tfbnn.export.export(la, str(tmp_path / "a.tflite"), format="tflite")
    with pytest.raises(ValueError, match="mode='moments'"):
        tfbnn.export.export(la, str(tmp_path / "b"), mode="moments")
    np.savez(str(tmp_path / "junk.npz"), a=np.ones(2))
    with pytest.raises(ValueError, match="of kind None"):
        load_posterior(str(tmp_path / "junk.npz"), model)
