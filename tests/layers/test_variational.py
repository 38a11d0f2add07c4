"""DenseVariational and tfbnn.posteriors (issue 21, item 1): TFP's make_posterior_fn /
make_prior_fn contract in Keras 3, checked against independent computations."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import posteriors, testing

tfd = tfp.distributions

FAMILIES = {
    "mean_field": posteriors.MeanFieldNormal(init_scale=0.05),
    "low_rank": posteriors.LowRankNormal(rank=2, init_scale=0.05),
    "full_covariance": posteriors.FullCovarianceNormal(init_scale=0.05),
}


def _softplus_scale(rho):
    return np.log1p(np.exp(np.asarray(rho, np.float64))) + 1e-6


def _posterior_moments(weights):
    """(mean, covariance) of a posterior layer, from its variables, in NumPy (float64)."""
    loc = weights.loc.numpy().astype(np.float64)
    if isinstance(weights, posteriors.FullCovarianceNormalWeights):
        scale = weights.scale_tril().numpy().astype(np.float64)
        return loc, scale @ scale.T
    diag = _softplus_scale(weights.scale_rho.numpy()) ** 2
    if isinstance(weights, posteriors.LowRankNormalWeights):
        factor = weights.factor.numpy().astype(np.float64)
        return loc, factor @ factor.T + np.diag(diag)
    return loc, np.diag(diag)


def _numpy_mvn_kl(mu_q, cov_q, mu_p, cov_p):
    """KL(N(mu_q, cov_q) || N(mu_p, cov_p)), the textbook closed form."""
    n = len(mu_q)
    diff = mu_p - mu_q
    return 0.5 * (np.trace(np.linalg.solve(cov_p, cov_q)) + diff @ np.linalg.solve(cov_p, diff) - n
                  + np.linalg.slogdet(cov_p)[1] - np.linalg.slogdet(cov_q)[1])


def _built_layer(posterior="mean_field", prior="normal", units=2, input_dim=3, **kwargs):
    layer = tfbnn.layers.DenseVariational(units, FAMILIES.get(posterior, posterior), prior,
                                          kl_weight=kwargs.pop("kl_weight", 0.1), seed=kwargs.pop("seed", 3), **kwargs)
    layer(np.zeros((1, input_dim), "float32"))
    return layer


def _perturb(weights, rng):
    """Moves every variable of a WeightDistribution off its initial value."""
    for variable in weights.trainable_variables:
        variable.assign(variable.numpy() + rng.normal(scale=0.3, size=variable.shape).astype("float32"))


# -- the layer harness --------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dense_variational_basics(family):
    prior = "trainable_normal" if family == "low_rank" else "normal"
    layer = testing.run_layer_test(
        tfbnn.layers.DenseVariational,
        {"units": 3, "make_posterior_fn": FAMILIES[family], "make_prior_fn": prior, "activation": "relu", "seed": 5},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_trainable_weights={"mean_field": 2, "low_rank": 4, "full_covariance": 2}[family],
        run_training=family != "mean_field",  # one fit each for the structured families; mean field trains below
    )
    assert isinstance(layer.posterior, posteriors.WeightDistribution)
    assert layer.posterior.distribution().event_shape == [5 * 3 + 3]


def test_rank_3_inputs_and_no_bias():
    layer = tfbnn.layers.DenseVariational(2, use_bias=False, kl_weight=0.1, seed=1)
    x = np.random.default_rng(0).normal(size=(4, 3, 5)).astype("float32")
    assert layer(x).shape == (4, 3, 2)
    assert layer.posterior.event_size == 10 and layer.prior.event_size == 10
    layer.inference_mode = "mean"
    kernel, bias = layer.unflatten(layer.posterior.distribution().mean())
    assert bias is None
    np.testing.assert_allclose(layer(x), x @ kernel.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mixed_precision_keeps_the_distribution_in_float32(family):
    layer = tfbnn.layers.DenseVariational(2, FAMILIES[family], "trainable_normal", kl_weight=0.1,
                                          dtype="mixed_float16", seed=0)
    assert layer(np.ones((3, 4), "float32")).dtype == tf.float16
    assert layer.posterior.distribution().dtype == tf.float32 and layer.losses[0].dtype == tf.float32
    np.testing.assert_allclose(layer.losses[0], 0.1 * layer.kl_divergence(), rtol=1e-6)


# -- the KL --------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("prior", ["normal", "trainable_normal"])
def test_exact_kl_equals_the_closed_form_from_the_variables(family, prior):
    rng = np.random.default_rng(0)
    prior_builder = posteriors.TrainableNormalPrior(scale=0.7, trainable_scale=True) if prior != "normal" else (
        posteriors.NormalPrior(scale=0.5, loc=0.1))
    layer = _built_layer(family, prior_builder)
    _perturb(layer.posterior, rng)
    _perturb(layer.prior, rng)
    mu_q, cov_q = _posterior_moments(layer.posterior)
    n = len(mu_q)
    if prior == "normal":
        mu_p, cov_p = np.full(n, 0.1), 0.25 * np.eye(n)
    else:
        mu_p = layer.prior.loc.numpy().astype(np.float64)
        cov_p = _softplus_scale(layer.prior.scale_rho.numpy()) ** 2 * np.eye(n)
    expected = _numpy_mvn_kl(mu_q, cov_q, mu_p, cov_p)
    np.testing.assert_allclose(layer.kl_divergence(), expected, rtol=1e-4)
    # The loss of a call is exactly kl_weight * KL.
    layer(np.zeros((2, 3), "float32"))
    assert len(layer.losses) == 1
    np.testing.assert_allclose(layer.losses[0], 0.1 * expected, rtol=1e-4)


def test_mean_field_kl_equals_tfd_kl_of_independent_normals():
    layer = _built_layer("mean_field")
    _perturb(layer.posterior, np.random.default_rng(1))
    q = tfd.Normal(layer.posterior.loc.numpy(), _softplus_scale(layer.posterior.scale_rho.numpy()).astype("float32"))
    expected = tf.reduce_sum(tfd.kl_divergence(q, tfd.Normal(0.0, 1.0)))
    np.testing.assert_allclose(layer.kl_divergence(), expected, rtol=1e-5)


@pytest.mark.parametrize("dense_prior", [False, True])
def test_low_rank_kl_registration_matches_numpy(dense_prior):
    rng = np.random.default_rng(2)
    n, r = 7, 3
    mu_q, diag, factor = rng.normal(size=n), rng.uniform(0.2, 1.0, n), rng.normal(size=(n, r))
    q = tfd.MultivariateNormalDiagPlusLowRankCovariance(mu_q, cov_diag_factor=diag, cov_perturb_factor=factor)
    mu_p = rng.normal(size=n)
    if dense_prior:
        tril = np.tril(rng.normal(size=(n, n)), -1) + np.diag(rng.uniform(0.5, 1.5, n))
        p, cov_p = tfd.MultivariateNormalTriL(mu_p, tril), tril @ tril.T
    else:
        s = rng.uniform(0.5, 1.5, n)
        p, cov_p = tfd.MultivariateNormalDiag(mu_p, s), np.diag(s**2)
    expected = _numpy_mvn_kl(mu_q, factor @ factor.T + np.diag(diag), mu_p, cov_p)
    np.testing.assert_allclose(tfd.kl_divergence(q, p), expected, rtol=1e-10)


def test_low_rank_covariance_is_factor_factor_t_plus_diagonal():
    layer = _built_layer("low_rank", input_dim=2)
    _perturb(layer.posterior, np.random.default_rng(3))
    factor = layer.posterior.factor.numpy().astype(np.float64)
    d = _softplus_scale(layer.posterior.scale_rho.numpy())
    expected = factor @ factor.T + np.diag(d**2)
    np.testing.assert_allclose(layer.posterior.covariance(), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(layer.posterior.distribution().covariance(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family", ["mean_field", "low_rank"])
def test_a_normal_prior_object_gives_the_kl_of_tfd_and_of_the_builder(family):
    layer = _built_layer(family, tfbnn.priors.Normal(0.5, 0.7))
    builder = _built_layer(family, posteriors.NormalPrior(scale=0.7, loc=0.5))
    builder.posterior.set_weights(layer.posterior.get_weights())
    assert layer.make_prior_fn == posteriors.NormalPrior(scale=0.7, loc=0.5)
    assert float(layer.kl_divergence()) == float(builder.kl_divergence())  # the same posterior: bit for bit
    q = layer.posterior.distribution()
    n = q.event_shape[0]
    expected = tfd.kl_divergence(q, tfd.MultivariateNormalDiag(tf.fill([n], 0.5), tf.fill([n], 0.7)))
    np.testing.assert_allclose(float(layer.kl_divergence()), float(expected), rtol=1e-6)
    # The default prior is the object Normal(0, 1).
    standard, named = _built_layer(family, tfbnn.priors.Normal()), _built_layer(family, "normal")
    named.posterior.set_weights(standard.posterior.get_weights())
    assert float(standard.kl_divergence()) == float(named.kl_divergence())


def test_a_prior_object_round_trips_through_the_config():
    layer = testing.run_layer_test(
        tfbnn.layers.DenseVariational, {"units": 2, "make_prior_fn": tfbnn.priors.Normal(0.0, 0.5), "seed": 1},
        input_shape=(4, 3), expected_output_shape=(4, 2), run_training=False)
    config = layer.get_config()
    restored = tfbnn.layers.DenseVariational.from_config(config)
    assert restored.make_prior_fn == posteriors.NormalPrior(scale=0.5) and restored.get_config() == config


def test_a_scale_mixture_prior_object_gives_the_monte_carlo_kl_of_its_density():
    prior = tfbnn.priors.ScaleMixture(0.25, 1.0, 0.1)
    layer = _built_layer("mean_field", prior, seed=4)
    assert layer.make_prior_fn == posteriors.IndependentPrior(prior)
    q, p = layer.posterior.distribution(), layer.prior.distribution()
    w = q.sample(seed=tf.constant([1, 2]))
    # log p(w) is the prior's own density summed over the weights: the one the other layers use.
    np.testing.assert_allclose(float(p.log_prob(w)), float(tf.reduce_sum(prior.log_prob(w))), rtol=1e-5)
    assert np.isfinite(float(layer.kl_divergence()))  # Monte Carlo: TFP registers no KL for the pair
    restored = tfbnn.layers.DenseVariational.from_config(layer.get_config())
    assert restored.make_prior_fn == posteriors.IndependentPrior(prior)


@pytest.mark.parametrize("prior", [tfbnn.priors.Graves(), tfbnn.priors.Posterior([0.0], [1.0])])
def test_a_prior_object_that_is_not_one_fixed_prior_per_weight_is_an_error_naming_make_prior_fn(prior):
    with pytest.raises(ValueError, match=r"Expected `make_prior_fn` to be a fixed prior of one weight.*"
                                         r"Received: make_prior_fn=(Graves|Posterior)"):
        tfbnn.layers.DenseVariational(2, make_prior_fn=prior)


def test_full_covariance_scale_is_lower_triangular_and_starts_at_init_scale():
    layer = _built_layer("full_covariance", input_dim=2)
    np.testing.assert_allclose(layer.posterior.scale_tril(), 0.05 * np.eye(6), atol=1e-7)
    _perturb(layer.posterior, np.random.default_rng(4))
    scale = layer.posterior.scale_tril().numpy()
    assert np.all(np.triu(scale, 1) == 0) and np.all(np.diag(scale) > 0)


def test_monte_carlo_kl_is_log_q_minus_log_p_at_the_call_sample():
    # No bias and x = I: the output is the sampled kernel itself.
    layer = tfbnn.layers.DenseVariational(2, "mean_field", "normal", use_bias=False, kl_use_exact=False,
                                          kl_weight=0.5, seed=4)
    kernel = layer(np.eye(3, dtype="float32")).numpy()
    loc = layer.posterior.loc.numpy().reshape(3, 2)
    scale = _softplus_scale(layer.posterior.scale_rho.numpy()).reshape(3, 2)
    log_q = tfd.Normal(loc.astype(np.float64), scale).log_prob(kernel.astype(np.float64))
    log_p = tfd.Normal(np.float64(0), np.float64(1)).log_prob(kernel.astype(np.float64))
    np.testing.assert_allclose(layer.losses[0], 0.5 * np.sum(log_q - log_p), rtol=1e-4)


def test_monte_carlo_kl_averages_to_the_exact_kl():
    layer = _built_layer("full_covariance", kl_use_exact=False, kl_weight=1.0)
    _perturb(layer.posterior, np.random.default_rng(5))
    q, p = layer.posterior.distribution(), layer.prior.distribution()
    exact = float(tfd.kl_divergence(q, p))
    draws = 4000
    previous = layer.set_weight_samples(draws, joint=True, with_kl=True)
    layer(np.zeros((draws, 3), "float32"), training=True)
    estimate = float(layer.losses[0])  # kl_weight = 1: the mean of `draws` one-sample estimates
    layer.set_weight_samples(*previous)
    # The standard error of the mean of `draws` one-sample estimates, from an independent sample.
    w = q.sample(draws, seed=tf.constant([7, 8]))
    std_error = float(tf.math.reduce_std(q.log_prob(w) - p.log_prob(w))) / np.sqrt(draws)
    assert abs(estimate - exact) < 4 * std_error, (estimate, exact, std_error)


def test_a_pair_without_a_registered_kl_falls_back_to_monte_carlo():
    layer = _built_layer("mean_field", laplace_prior)
    q, p = layer.posterior.distribution(), layer.prior.distribution()
    with pytest.raises(NotImplementedError):
        tfd.kl_divergence(q, p)
    kl = layer.kl_divergence()
    assert np.isfinite(kl.numpy()) and kl.shape == ()


# -- ELBO, training, KLAnnealing -----------------------------------------------------


def _regression_model(posterior="mean_field", prior="normal", seed=0, kl_weight=None):
    return keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(4, activation="tanh"),
        tfbnn.layers.DenseVariational(2, FAMILIES.get(posterior, posterior), prior, kl_weight=kl_weight, seed=seed),
        tfbnn.GaussianHead(),
    ])


def _data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)).astype("float32")
    return x, (x[:, :1] - 0.5 * x[:, 1:]).astype("float32")


def _gaussian_nll(y, outputs):
    mean, scale = np.split(outputs.astype(np.float64), 2, axis=-1)
    return np.mean(0.5 * ((y - mean) / scale) ** 2 + np.log(scale) + 0.5 * np.log(2 * np.pi))


@pytest.mark.parametrize("mode", ["mean", "sample"])
def test_the_loss_is_the_hand_written_elbo(mode):
    x, y = _data()
    model = _regression_model("low_rank", kl_weight=1 / 16)
    model.compile("adam", loss=tfbnn.gaussian_nll)
    layer = model.layers[1]
    layer.inference_mode = mode
    state = layer.seed_generator.state.numpy()
    outputs = model(x).numpy()  # mean mode: q.mean(); sample mode: the seed's weight draw
    q, p = layer.posterior.distribution(), layer.prior.distribution()
    mu_q, cov_q = _posterior_moments(layer.posterior)
    kl = _numpy_mvn_kl(mu_q, cov_q, np.zeros(len(mu_q)), np.eye(len(mu_q)))
    np.testing.assert_allclose(float(tfd.kl_divergence(q, p)), kl, rtol=1e-4)
    layer.seed_generator.state.assign(state)
    loss = model.evaluate(x, y, batch_size=len(x), verbose=0)
    np.testing.assert_allclose(loss, _gaussian_nll(y, outputs) + kl / 16, rtol=1e-4)
    if mode == "mean":  # q.mean() is the mean of the posterior family
        kernel, bias = layer.unflatten(layer.posterior.loc)
        hidden = model.layers[0](x).numpy()
        np.testing.assert_allclose(model.layers[1](hidden), hidden @ kernel.numpy() + bias.numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_kl_annealing_sets_the_weight_and_training_without_it_raises():
    x, y = _data()
    model = _regression_model()
    model.compile("adam", loss=tfbnn.gaussian_nll)
    with pytest.raises(ValueError, match="kl_weight=None"):
        model.fit(x, y, epochs=1, verbose=0)
    model = _regression_model()
    model.compile("adam", loss=tfbnn.gaussian_nll)
    assert model.layers[1] in tfbnn.bayesian_layers(model)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0,
              callbacks=[tfbnn.KLAnnealing(num_examples=len(x), schedule="constant")])
    assert float(model.layers[1].kl_weight) == pytest.approx(1 / len(x))
    model.layers[1](np.zeros((1, 4), "float32"))
    np.testing.assert_allclose(model.layers[1].losses[0],
                               model.layers[1].kl_divergence() / len(x), rtol=1e-5)


# -- sampling, Monte Carlo prediction ------------------------------------------------


@pytest.mark.parametrize("joint", [True, False])
def test_each_block_of_rows_gets_its_own_weight_sample(joint):
    layer = tfbnn.layers.DenseVariational(2, "low_rank", use_bias=False, seed=2)
    layer(np.zeros((1, 3), "float32"))
    num = 5
    with tfbnn.weight_samples(keras.Sequential([keras.Input((3,)), layer]), num, joint=joint):
        kernels = layer(np.tile(np.eye(3, dtype="float32"), (num, 1))).numpy().reshape(num, 3, 2)
    assert len({k.tobytes() for k in kernels}) == num  # T distinct kernels
    assert layer.losses == []  # a prediction adds no KL


def test_predict_draws_distinct_samples_and_a_finite_uncertainty_split():
    x, _ = _data(6)
    model = _regression_model("full_covariance", kl_weight=0.1)
    res = tfbnn.predict(model, x, num_samples=8, return_samples=True)
    assert res.samples.shape[:2] == (8, 6)
    assert len({s.tobytes() for s in res.samples}) == 8
    assert np.all(np.isfinite(res.aleatoric_std)) and np.all(res.epistemic_std > 0)
    with tfbnn.posterior_mean(model):
        mean_res = tfbnn.predict(model, x, num_samples=4)
    np.testing.assert_allclose(mean_res.epistemic_std, 0, atol=1e-6)


def test_mean_mode_is_the_distribution_mean():
    layer = _built_layer("mean_field", inference_mode="mean")
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    kernel, bias = layer.unflatten(layer.posterior.distribution().mean())
    np.testing.assert_allclose(layer(x), x @ kernel.numpy() + bias.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(layer(x), layer(x))


# -- builders, serialization ---------------------------------------------------------


@pytest.mark.parametrize("builder", [posteriors.MeanFieldNormal(0.2, "zeros"), posteriors.LowRankNormal(3),
                                     posteriors.FullCovarianceNormal(), posteriors.NormalPrior(2.0, 0.5),
                                     posteriors.TrainableNormalPrior(trainable_scale=True),
                                     posteriors.IndependentPrior(tfbnn.priors.ScaleMixture())])
def test_builders_round_trip_through_keras_serialization(builder):
    config = keras.saving.serialize_keras_object(builder)
    assert keras.saving.deserialize_keras_object(config) == builder
    assert posteriors.get(config) == builder
    made = builder(6, 2, "float32")
    assert isinstance(made, posteriors.WeightDistribution) and made.event_size == 8


def test_names_resolve_to_builders():
    assert posteriors.get("full_covariance") == posteriors.FullCovarianceNormal()
    assert posteriors.get("trainable_normal", "make_prior_fn") == posteriors.TrainableNormalPrior()


@keras.saving.register_keras_serializable(package="test_dense_variational")
def tfp_style_posterior(kernel_size, bias_size, dtype):
    """TFP's posterior_mean_field, ported: VariableLayer + DistributionLambda -> VariableDistribution."""
    n = kernel_size + bias_size
    c = np.log(np.expm1(1.0))
    return posteriors.VariableDistribution(2 * n, lambda t: tfd.Independent(
        tfd.Normal(loc=t[..., :n], scale=1e-5 + tf.nn.softplus(c + t[..., n:])), reinterpreted_batch_ndims=1),
        initializer=keras.initializers.RandomNormal(stddev=0.1), dtype=dtype)


@keras.saving.register_keras_serializable(package="test_dense_variational")
def tfp_style_prior(kernel_size, bias_size, dtype):
    n = kernel_size + bias_size
    return posteriors.VariableDistribution(
        n, lambda t: tfd.Independent(tfd.Normal(loc=t, scale=1.0), reinterpreted_batch_ndims=1), dtype=dtype)


@keras.saving.register_keras_serializable(package="test_dense_variational")
def laplace_prior(kernel_size, bias_size, dtype):
    n = kernel_size + bias_size
    return posteriors.VariableDistribution(
        1, lambda t: tfd.Independent(tfd.Laplace(tf.zeros([n]), tf.nn.softplus(t) + 1.0), reinterpreted_batch_ndims=1),
        dtype=dtype)


def _save_and_load(model, tmp_path):
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    return keras.saving.load_model(path)


def test_a_ported_tfp_function_saves_and_loads(tmp_path):
    x, y = _data(8)
    model = _regression_model(tfp_style_posterior, tfp_style_prior, kl_weight=1 / 8)
    model.compile("adam", loss=tfbnn.gaussian_nll)
    model.fit(x, y, epochs=1, verbose=0)
    layer = model.layers[1]
    config = layer.get_config()
    assert config["make_posterior_fn"]["config"] == "test_dense_variational>tfp_style_posterior"
    # Independent(Normal) against Independent(Normal): TFP's closed form, from the variables.
    t = layer.posterior.params.numpy().astype(np.float64)
    n = len(t) // 2
    q = tfd.Normal(t[:n], 1e-5 + np.log1p(np.exp(np.log(np.expm1(1.0)) + t[n:])))
    expected = tf.reduce_sum(tfd.kl_divergence(q, tfd.Normal(layer.prior.params.numpy().astype(np.float64), 1.0)))
    np.testing.assert_allclose(layer.kl_divergence(), expected, rtol=1e-5)
    loaded = _save_and_load(model, tmp_path)
    np.testing.assert_allclose(model(x), loaded(x), rtol=1e-6)  # same seed state: the same draw


def test_an_unregistered_function_trains_but_does_not_save():
    def local_prior(kernel_size, bias_size, dtype):
        return posteriors.NormalPrior()(kernel_size, bias_size, dtype)

    layer = tfbnn.layers.DenseVariational(2, "mean_field", local_prior, kl_weight=0.1)
    assert layer(np.ones((2, 3), "float32")).shape == (2, 2)
    with pytest.raises(ValueError, match=r"register_keras_serializable.*Received: make_prior_fn=<function"):
        layer.get_config()


# -- bad arguments -------------------------------------------------------------------


def _returns_a_tfd_distribution(kernel_size, bias_size, dtype):
    return tfd.MultivariateNormalDiag(tf.zeros(kernel_size + bias_size), tf.ones(kernel_size + bias_size))


def _forgets_the_bias(kernel_size, bias_size, dtype):
    return posteriors.MeanFieldNormal()(kernel_size, 0, dtype)


@pytest.mark.parametrize("kwargs,match", [
    ({"units": 0}, "Received: units=0"),
    ({"units": 2.5}, "Received: units=2.5"),
    ({"make_posterior_fn": "gaussian"}, "Received: make_posterior_fn='gaussian'"),
    ({"make_prior_fn": 3}, "Received: make_prior_fn=3"),
    ({"kl_use_exact": "yes"}, "Received: kl_use_exact='yes'"),
    ({"kl_weight": -1.0}, "Received: kl_weight=-1.0"),
])
def test_bad_constructor_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tfbnn.layers.DenseVariational(**{"units": 2, **kwargs})


@pytest.mark.parametrize("builder,match", [
    (_returns_a_tfd_distribution, r"to return a tfbnn.posteriors.WeightDistribution.*Received: "
                                  r"make_posterior_fn=<function _returns_a_tfd_distribution"),
    (_forgets_the_bias, r"event shape \[8\].*Received: make_posterior_fn=<function _forgets_the_bias.*"
                        r"event_shape=\(6,\)"),
])
def test_a_builder_returning_the_wrong_thing_raises_at_build(builder, match):
    layer = tfbnn.layers.DenseVariational(2, builder)
    with pytest.raises(ValueError, match=match):
        layer(np.zeros((1, 3), "float32"))


@pytest.mark.parametrize("make,match", [
    (lambda: posteriors.MeanFieldNormal(init_scale=-1.0), "Received: init_scale=-1.0"),
    (lambda: posteriors.LowRankNormal(rank=0), "Received: rank=0"),
    (lambda: posteriors.LowRankNormal(rank=9)(6, 2), r"in \[1, event_size=8\].*Received: rank=9"),
    (lambda: posteriors.NormalPrior(scale=0.0), "Received: scale=0.0"),
    (lambda: posteriors.TrainableNormalPrior(trainable_scale=1), "Received: trainable_scale=1"),
    (lambda: posteriors.FullCovarianceNormal(loc_initializer="nope"), "Received: loc_initializer='nope'"),
    (lambda: posteriors.MeanFieldNormal()(0, 2), "Received: kernel_size=0"),
    (lambda: posteriors.VariableDistribution(3, "not callable"), "Received: make_distribution='not callable'"),
])
def test_bad_builder_arguments_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_kl_divergence_before_build_raises():
    with pytest.raises(ValueError, match="built=False"):
        tfbnn.layers.DenseVariational(2).kl_divergence()


# -- the done-when -------------------------------------------------------------


@pytest.mark.heavy
def test_tfp_style_full_covariance_regression_fits_saves_loads_and_predicts(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(64, 2)).astype("float32")
    y = (np.sin(2 * x[:, :1]) + 0.5 * x[:, 1:] + 0.1 * rng.normal(size=(64, 1))).astype("float32")
    model = _regression_model(posteriors.FullCovarianceNormal(init_scale=0.05), "normal", seed=1)
    model.compile(keras.optimizers.Adam(0.02), loss=tfbnn.gaussian_nll)
    history = model.fit(x, y, epochs=30, batch_size=32, verbose=0,
                        callbacks=[tfbnn.KLAnnealing(num_examples=len(x), schedule="constant")])
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    loaded = _save_and_load(model, tmp_path)
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(model.predict(x, verbose=0), loaded.predict(x, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(model(x), loaded(x), rtol=1e-5)  # the saved seed state: the same draw
    res = tfbnn.predict(loaded, x[:8], num_samples=16)
    assert res.mean.shape == (8, 1)
    assert np.all(np.isfinite(res.aleatoric_std)) and np.all(res.epistemic_std > 0)
