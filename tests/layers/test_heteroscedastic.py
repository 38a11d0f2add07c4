"""HeteroscedasticSoftmax (Collier et al. 2021): the harness, its noiseless limit against NumPy, the sampled
logits' covariance against V V^T + diag(d^2), seeded reproducibility, predict, bad input."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import special

import tfbnn
from tfbnn import testing
from tfbnn.layers import HeteroscedasticSoftmax


def _features(n, dim=3, seed=0):
    return np.random.default_rng(seed).normal(size=(n, dim)).astype("float32")


def test_basics():
    testing.run_layer_test(HeteroscedasticSoftmax, {"num_classes": 3, "num_factors": 2, "train_mc_samples": 8,
                                                    "test_mc_samples": 8, "temperature": 0.7, "seed": 1},
                           input_shape=(4, 5), expected_output_shape=(4, 3), expected_num_losses=0,
                           expected_num_seed_generators=1, expected_num_trainable_weights=6)


def test_without_noise_it_is_the_tempered_softmax_of_the_mean():
    layer = HeteroscedasticSoftmax(4, num_factors=2, temperature=0.5, test_mc_samples=3, seed=0)
    x = _features(6)
    layer(x)
    layer.factor_kernel.assign(np.zeros(layer.factor_kernel.shape))
    layer.diag_kernel.assign(np.zeros(layer.diag_kernel.shape))
    layer.diag_bias.assign(np.full(4, -60.0))  # d = softplus(-60) + 1e-7
    layer.loc_bias.assign(np.array([0.1, -0.3, 0.2, 0.0]))
    mu = x.astype(np.float64) @ layer.loc_kernel.numpy() + layer.loc_bias.numpy()
    np.testing.assert_allclose(layer(x), special.softmax(mu / 0.5, axis=1), rtol=1e-5)
    logits_only = HeteroscedasticSoftmax.from_config({**layer.get_config(), "logits_only": True})
    logits_only(x)
    logits_only.set_weights(layer.get_weights())
    np.testing.assert_allclose(logits_only(x), special.log_softmax(mu / 0.5, axis=1), rtol=1e-5, atol=1e-6)


def test_sampled_logits_have_the_low_rank_plus_diagonal_covariance():
    layer = HeteroscedasticSoftmax(3, num_factors=2, bias_initializer="random_normal", seed=4)
    x = _features(2, seed=1)
    layer(x)
    logits = layer.sample_logits(x, 40_000).numpy().astype(np.float64)  # (S, B, K)
    mu, v, d = (t.numpy().astype(np.float64) for t in layer.noise_parameters(x))
    for b in range(2):
        expected = v[b] @ v[b].T + np.diag(d[b] ** 2)
        np.testing.assert_allclose(logits[:, b].mean(axis=0), mu[b], atol=4 * np.sqrt(np.diag(expected).max() / 4e4))
        sample = np.cov(logits[:, b], rowvar=False)
        # entry-wise standard error of a sample covariance: sqrt((S_ii S_jj + S_ij^2) / n)
        se = np.sqrt((np.outer(np.diag(expected), np.diag(expected)) + expected ** 2) / 4e4)
        assert np.all(np.abs(sample - expected) < 5 * se), (sample, expected)


def test_seeded_layers_reproduce_and_calls_draw_fresh_noise():
    x = _features(5)
    a = HeteroscedasticSoftmax(3, num_factors=1, test_mc_samples=4, seed=7)
    b = HeteroscedasticSoftmax(3, num_factors=1, test_mc_samples=4, seed=7)
    a(x)
    b(x)
    b.set_weights(a.get_weights())
    first = a(x).numpy()
    np.testing.assert_array_equal(first, b(x).numpy())
    assert not np.allclose(first, a(x).numpy())


def test_predict_reads_a_model_ending_in_it_as_a_classifier():
    model = keras.Sequential([keras.Input((3,)), tfbnn.DenseFlipout(4, activation="tanh", seed=0),
                              HeteroscedasticSoftmax(3, num_factors=1, test_mc_samples=16, seed=2)])
    res = tfbnn.predict(model, _features(5), num_samples=6, return_samples=True)
    assert isinstance(res, tfbnn.ClassificationPrediction) and res.mean_probs.shape == (5, 3)
    np.testing.assert_allclose(res.mean_probs, res.samples.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(res.mean_probs.sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(res.mutual_information > 0)


def _tempered_softmax(logits, temperature):
    return special.softmax(np.asarray(logits, np.float64) / temperature, axis=-1)


def test_samples_are_the_philox_draws_of_the_layers_seed():
    # The noise of sample path: two philox normal draws per call from the seed generator's states
    # [seed, 0], [seed, 1], then [seed, 2], [seed, 3] (the numbers the layer gave before it moved onto
    # the stochastic layer base).
    x = _features(3, dim=4, seed=1)
    layer = HeteroscedasticSoftmax(3, num_factors=2, train_mc_samples=5, test_mc_samples=7, temperature=0.7, seed=11)
    layer.build((None, 4))
    mu, v, d = (t.numpy().astype(np.float64) for t in layer.noise_parameters(x))

    def expected(num_samples, first_state):
        eps = tf.random.stateless_normal([num_samples, 3, 2], seed=[11, first_state], alg="philox").numpy()
        eps_diag = tf.random.stateless_normal([num_samples, 3, 3], seed=[11, first_state + 1], alg="philox").numpy()
        logits = mu + np.einsum("bkr,sbr->sbk", v, eps) + d * eps_diag
        return _tempered_softmax(logits, 0.7).mean(axis=0)

    np.testing.assert_allclose(layer(x), expected(7, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer(x, training=True), expected(5, 2), rtol=1e-5, atol=1e-6)


def test_posterior_mean_gives_the_tempered_softmax_of_the_mean_logits():
    x = _features(4)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5, activation="tanh"),
                              HeteroscedasticSoftmax(3, num_factors=2, temperature=0.5, test_mc_samples=4, seed=3)])
    head = model.layers[-1]
    features = model.layers[0](x)
    mean = _tempered_softmax(head.noise_parameters(features)[0], 0.5)
    with tfbnn.posterior_mean(model):
        np.testing.assert_allclose(model(x), mean, rtol=1e-5)
        res = tfbnn.predict(model, x, num_samples=3)
        np.testing.assert_allclose(res.mean_probs, mean, rtol=1e-5)
        np.testing.assert_allclose(res.mutual_information, 0.0, atol=1e-6)
    assert not np.allclose(model(x), mean, atol=1e-4)  # sampling again outside the context
    tfbnn.set_inference_mode(model, "mean")
    np.testing.assert_allclose(model(x), mean, rtol=1e-5)
    np.testing.assert_allclose(model(x, training=True).numpy().sum(axis=1), 1.0, rtol=1e-5)  # training samples
    assert HeteroscedasticSoftmax.from_config(head.get_config()).inference_mode == "mean"
    logits_only = HeteroscedasticSoftmax(3, num_factors=2, temperature=0.5, logits_only=True, inference_mode="mean")
    logits_only.build((None, 5))
    logits_only.set_weights(head.get_weights())
    np.testing.assert_allclose(logits_only(features), np.log(mean), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_classes": 1}, "num_classes=1"),
    ({"num_classes": 3, "inference_mode": "median"}, "inference_mode='median'"),
    ({"num_classes": 3, "num_factors": -1}, "num_factors=-1"),
    ({"num_classes": 3, "temperature": 0}, "temperature=0"),
    ({"num_classes": 3, "train_mc_samples": 0}, "train_mc_samples=0"),
    ({"num_classes": 3, "logits_only": "yes"}, "logits_only='yes'"),
    ({"num_classes": 3, "min_scale": -1.0}, "min_scale=-1.0"),
])
def test_bad_input_raises_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HeteroscedasticSoftmax(**kwargs)


def test_inputs_of_another_rank_are_refused():
    with pytest.raises(ValueError, match=r"Received: input_shape=\(2, 3, 4\)"):
        HeteroscedasticSoftmax(3)(np.zeros((2, 3, 4), "float32"))
