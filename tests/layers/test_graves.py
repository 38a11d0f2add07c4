"""Graves (2011): the log-variance posterior on the core dense layers and the fitted Gaussian prior."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import kl as kl_lib
from tfbnn import priors, testing

tfd = tfp.distributions


def test_graves_dense_basics():
    testing.run_layer_test(
        tfbnn.layers.GravesDense,
        {"units": 3, "activation": "relu", "seed": 7},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_trainable_weights=3,
    )


@pytest.mark.parametrize("cls", [tfbnn.DenseReparameterization, tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization])
def test_core_dense_layers_take_the_log_variance_parameterization(cls):
    layer = testing.run_layer_test(
        cls,
        {"units": 3, "kernel_prior": "graves", "parameterization": "log_variance", "seed": 7},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_trainable_weights=4,
        run_save_load=cls is tfbnn.DenseFlipout,
        run_training=cls is tfbnn.DenseFlipout,
    )
    # sigma^2 = exp(rho); the default rho gives the softplus default's sigma.
    np.testing.assert_allclose(layer.kernel_scale().numpy(), np.exp(-5.0), rtol=1e-5)
    np.testing.assert_allclose(np.exp(-5.0), np.log1p(np.exp(-5.0)), rtol=0.01)
    layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, 1.5, "float32"))
    np.testing.assert_allclose(layer.kernel_scale().numpy() ** 2, np.exp(1.5), rtol=1e-5)


def test_log_variance_scale_is_finite_at_extreme_rho():
    layer = tfbnn.layers.GravesDense(2, kl_weight=1.0)
    layer.build((None, 3))
    for rho in (-1e4, 1e4):
        layer.kernel_rho.assign(np.full((3, 2), rho, "float32"))
        assert np.all(np.isfinite(layer.kernel_scale().numpy())) and np.all(layer.kernel_scale().numpy() > 0)
        assert np.isfinite(float(layer.kl_divergence()))


def _graves_kl_by_hand(mu, sigma):
    mu_p = mu.mean()
    var_p = np.mean(sigma**2 + (mu - mu_p) ** 2)
    return np.sum(np.log(np.sqrt(var_p) / sigma) + (sigma**2 + (mu - mu_p) ** 2) / (2 * var_p) - 0.5), mu_p, var_p


def test_graves_prior_is_the_closed_form_optimum():
    rng = np.random.default_rng(0)
    mu = rng.normal(0.3, 0.5, size=(6, 4))
    sigma = rng.uniform(0.05, 0.4, size=(6, 4))
    prior = priors.get("graves")
    assert isinstance(prior, priors.Graves) and prior.adaptive
    got = float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), prior))
    expected, mu_p, var_p = _graves_kl_by_hand(mu, sigma)
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    # = n log sigma_p - sum log sigma_i, and = tfd's KL against the fitted Normal.
    np.testing.assert_allclose(got, mu.size * 0.5 * np.log(var_p) - np.log(sigma).sum(), rtol=1e-10)
    via_tfd = tf.reduce_sum(tfd.kl_divergence(tfd.Normal(mu, sigma), tfd.Normal(mu_p, np.sqrt(var_p))))
    np.testing.assert_allclose(got, float(via_tfd), rtol=1e-10)
    # The fitted prior beats any fixed Gaussian prior.
    for loc, scale in ((0.0, 1.0), (0.3, 0.5), (float(mu_p), float(np.sqrt(var_p)) * 1.1)):
        fixed = float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), priors.Graves(loc, scale)))
        assert fixed > got
    # Fixed parameters give the plain Normal prior's KL.
    np.testing.assert_allclose(
        float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), priors.Graves(0.1, 0.7))),
        float(kl_lib.closed_form_kl(tf.constant(mu), tf.constant(sigma), priors.Normal(0.1, 0.7))),
        rtol=1e-10,
    )


def test_graves_dense_layer_kl_and_loss_with_the_adaptive_prior():
    layer = tfbnn.layers.GravesDense(4, kernel_prior="graves", kl_weight=0.25, seed=1)
    layer.build((None, 3))
    layer.kernel_rho.assign(np.random.default_rng(1).uniform(-6, -1, size=(3, 4)).astype("float32"))
    mu, sigma = layer.kernel_loc.numpy().astype(np.float64), layer.kernel_scale().numpy().astype(np.float64)
    np.testing.assert_allclose(sigma**2, np.exp(layer.kernel_rho.numpy()), rtol=1e-5)
    expected = _graves_kl_by_hand(mu, sigma)[0]
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-4)
    layer(np.ones((2, 3), "float32"))
    np.testing.assert_allclose(float(layer.losses[0]), 0.25 * expected, rtol=1e-4)


def test_graves_prior_serializes_and_rejects_bad_values():
    for prior in (priors.Graves(), priors.Graves(0.0, 0.2)):
        assert priors.deserialize(priors.serialize(prior)) == prior
    with pytest.raises(ValueError, match="scale=-1.0"):
        priors.Graves(0.0, -1.0)
    with pytest.raises(ValueError, match="loc=nan"):
        priors.Graves(float("nan"))
    with pytest.raises(ValueError, match="depends on the posterior"):
        priors.Graves().distribution()
    with pytest.raises(ValueError, match="parameterization='exp'"):
        tfbnn.DenseFlipout(3, parameterization="exp")


# -- the default prior: fixed N(0, 1); the adaptive prior is an option ----------------------------


def _tfd_kl(layer, scale):
    mu, sigma = layer.kernel_loc.numpy().astype(np.float64), layer.kernel_scale().numpy().astype(np.float64)
    return float(tf.reduce_sum(tfd.kl_divergence(tfd.Normal(mu, sigma), tfd.Normal(np.float64(0.0), scale))))


def test_graves_dense_default_prior_is_a_fixed_standard_normal():
    layer = tfbnn.layers.GravesDense(4, kl_weight=0.5, seed=3)
    layer.build((None, 3))
    layer.kernel_rho.assign(np.random.default_rng(3).uniform(-6, 1, size=(3, 4)).astype("float32"))
    assert layer.kernel_prior == priors.Normal(0.0, 1.0) and layer.bias_prior is None
    np.testing.assert_allclose(float(layer.kl_divergence()), _tfd_kl(layer, 1.0), rtol=1e-5)
    layer(np.ones((2, 3), "float32"), training=True)
    np.testing.assert_allclose(float(layer.losses[0]), 0.5 * _tfd_kl(layer, 1.0), rtol=1e-5)
    # The scale is the user's choice (Graves: N(0, 2^2) for regression).
    wide = tfbnn.layers.GravesDense(4, kernel_prior=priors.Normal(0.0, 2.0), seed=3)
    wide.build((None, 3))
    wide.kernel_loc.assign(layer.kernel_loc)
    wide.kernel_rho.assign(layer.kernel_rho)
    np.testing.assert_allclose(float(wide.kl_divergence()), _tfd_kl(layer, 2.0), rtol=1e-5)
    # The adaptive (fitted) prior by name.
    for name in ("graves", "adaptive"):
        assert tfbnn.layers.GravesDense(4, kernel_prior=name).kernel_prior == priors.Graves()


def test_graves_dense_configs_round_trip_old_and_new():
    new = tfbnn.layers.GravesDense(3, seed=1, kernel_prior=priors.Normal(0.0, 2.0))
    config = new.get_config()
    assert config["kernel_prior"] == {"class_name": "Normal", "config": {"loc": 0.0, "scale": 2.0}}
    assert tfbnn.layers.GravesDense.from_config(config).get_config() == config
    # A config saved before the default changed names the adaptive prior explicitly: it stays adaptive.
    old = {**config, "kernel_prior": {"class_name": "Graves", "config": {"loc": None, "scale": None}}}
    restored = tfbnn.layers.GravesDense.from_config(old)
    assert restored.kernel_prior == priors.Graves() and restored.kernel_prior.adaptive
    assert restored.get_config() == old
    # A config without the key gets today's default.
    bare = {k: v for k, v in config.items() if k != "kernel_prior"}
    assert tfbnn.layers.GravesDense.from_config(bare).kernel_prior == priors.Normal(0.0, 1.0)


def _digits_accuracy(kernel_prior):
    """Posterior-mean test accuracy of a 64-64-10 Graves MLP after 4 epochs on the 8x8 digits at beta = 1."""
    import keras

    from tfbnn.datasets.offline import load_digits

    ds = load_digits(seed=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,)),
        tfbnn.layers.GravesDense(64, activation="relu", kernel_prior=kernel_prior, seed=1),
        tfbnn.layers.GravesDense(10, activation="softmax", kernel_prior=kernel_prior, seed=2),
    ])
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    model.fit(ds.x_train, ds.y_train, epochs=4, batch_size=64, verbose=0,
              callbacks=[tfbnn.KLAnnealing(num_examples=len(ds.x_train), schedule="constant")])  # beta = 1 throughout
    with tfbnn.posterior_mean(model):
        return float(np.mean(model.predict(ds.x_test, verbose=0).argmax(-1) == ds.y_test))


@pytest.mark.heavy
def test_default_prior_learns_the_digits_at_beta_1_where_the_adaptive_prior_collapses():
    assert _digits_accuracy("normal") > 0.85  # about 0.96
    # The fitted prior pulls every weight to one value: a constant predictor (10 classes: ~10%).
    assert _digits_accuracy("adaptive") < 0.2
