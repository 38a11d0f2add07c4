"""BatchEnsemble and rank-1 Bayesian layers (tfbnn.layers.rank1) and their members as predict's samples."""

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import testing
from tfbnn.inference._summaries import entropy
from tfbnn.layers import rank1

tfd = tfp.distributions
E = 3


def _x(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _member_weight(kernel, r, s):
    """``W o (r s^T)``: the member's full weight (kernel axes ``(..., in, out)``)."""
    return kernel * np.multiply.outer(r, s)


# -- the harness ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls, kwargs, shape, out, losses, seeds, weights", [
    (tfbnn.layers.DenseBatchEnsemble, {"units": 3, "ensemble_size": 2, "activation": "relu", "seed": 1},
     (4, 5), (4, 3), 0, 0, 4),
    (tfbnn.layers.DenseRank1, {"units": 3, "ensemble_size": 2, "activation": "relu", "seed": 1},
     (4, 5), (4, 3), 1, 1, 6),
    (tfbnn.layers.Conv2DBatchEnsemble, {"filters": 3, "kernel_size": 3, "padding": "same", "ensemble_size": 2,
                                        "seed": 1}, (4, 5, 5, 2), (4, 5, 5, 3), 0, 0, 4),
    (tfbnn.layers.Conv2DRank1, {"filters": 3, "kernel_size": 3, "strides": 2, "ensemble_size": 2, "seed": 1},
     (4, 5, 5, 2), (4, 2, 2, 3), 1, 1, 6),
])
def test_basics(cls, kwargs, shape, out, losses, seeds, weights):
    testing.run_layer_test(cls, kwargs, input_shape=shape, expected_output_shape=out, expected_num_losses=losses,
                           expected_num_seed_generators=seeds, expected_num_trainable_weights=weights)


# -- numbers against an independent computation --------------------------------------------------------
def test_dense_batch_ensemble_member_is_a_dense_layer_with_w_times_r_s():
    layer = tfbnn.layers.DenseBatchEnsemble(4, ensemble_size=E, activation="tanh", bias_initializer="random_normal",
                                            seed=3)
    x = _x((E * 2, 5))
    y = layer(x).numpy()
    kernel, alpha, gamma, bias = (v.numpy() for v in (layer.kernel, layer.alpha, layer.gamma, layer.bias))
    for k in range(E):
        dense = keras.layers.Dense(4, activation="tanh")
        dense.build((None, 5))
        dense.set_weights([_member_weight(kernel, alpha[k], gamma[k]), bias[k]])
        np.testing.assert_allclose(y[2 * k: 2 * k + 2], dense(x[2 * k: 2 * k + 2]).numpy(), atol=1e-5)


def test_conv_batch_ensemble_member_is_a_conv2d_with_w_times_r_s():
    layer = tfbnn.layers.Conv2DBatchEnsemble(3, 3, strides=2, padding="same", ensemble_size=E,
                                             bias_initializer="random_normal", seed=4)
    x = _x((E * 2, 6, 6, 2))
    y = layer(x).numpy()
    kernel, alpha, gamma, bias = (v.numpy() for v in (layer.kernel, layer.alpha, layer.gamma, layer.bias))
    for k in range(E):
        conv = keras.layers.Conv2D(3, 3, strides=2, padding="same")
        conv.build((None, 6, 6, 2))
        conv.set_weights([_member_weight(kernel, alpha[k], gamma[k]), bias[k]])
        np.testing.assert_allclose(y[2 * k: 2 * k + 2], conv(x[2 * k: 2 * k + 2]).numpy(), atol=1e-5)


def test_uneven_batches_split_into_contiguous_groups():
    assert rank1.member_of_rows(7, 3).numpy().tolist() == [0, 0, 0, 1, 1, 2, 2]
    layer = tfbnn.layers.DenseBatchEnsemble(2, ensemble_size=3, use_bias=False, seed=0)
    x = _x((7, 4))
    y = layer(x, training=True).numpy()  # in training (a partial last batch); refused at inference
    members = [0, 0, 0, 1, 1, 2, 2]
    expected = [x[i] @ _member_weight(layer.kernel.numpy(), layer.alpha.numpy()[k], layer.gamma.numpy()[k])
                for i, k in enumerate(members)]
    np.testing.assert_allclose(y, np.stack(expected), atol=1e-5)


@pytest.mark.parametrize("cls, kwargs, shape", [
    (tfbnn.layers.DenseRank1, {"units": 4}, (E * 2, 5)),
    (tfbnn.layers.Conv2DRank1, {"filters": 3, "kernel_size": 2}, (E * 2, 5, 5, 2)),
])
def test_rank1_posterior_mean_member_is_the_deterministic_layer_at_the_means(cls, kwargs, shape):
    layer = cls(**kwargs, ensemble_size=E, bias_initializer="random_normal", inference_mode="mean", seed=5)
    x = _x(shape)
    y = layer(x).numpy()
    kernel, bias = layer.kernel.numpy(), layer.bias.numpy()
    for k in range(E):
        plain = keras.layers.Dense(4) if cls is tfbnn.layers.DenseRank1 else keras.layers.Conv2D(3, 2)
        plain.build((None, *shape[1:]))
        plain.set_weights([_member_weight(kernel, layer.alpha_loc.numpy()[k], layer.gamma_loc.numpy()[k]), bias[k]])
        np.testing.assert_allclose(y[2 * k: 2 * k + 2], plain(x[2 * k: 2 * k + 2]).numpy(), atol=1e-5)


def test_rank1_samples_follow_each_members_posterior():
    """With W = I, x = 1 and s pinned (sigma ~ 1e-13) the outputs are the rows' r draws over s."""
    d, rows = 3, 3 * 4000
    layer = tfbnn.layers.DenseRank1(d, ensemble_size=E, use_bias=False, kernel_initializer="identity", seed=6)
    layer.build((None, d))
    layer.gamma_rho.assign(np.full((E, d), -30.0, "float32"))
    layer.alpha_rho.assign(np.log(np.expm1(np.array([[0.1, 0.2, 0.3]] * E, "float32"))))
    r = (layer(np.ones((rows, d), "float32")).numpy() / layer.gamma_loc.numpy()[np.repeat(np.arange(E), rows // E)])
    r = r.reshape(E, rows // E, d)
    se = np.array([0.1, 0.2, 0.3]) / np.sqrt(rows // E)
    assert np.all(np.abs(r.mean(axis=1) - layer.alpha_loc.numpy()) < 5 * se)
    np.testing.assert_allclose(r.std(axis=1), np.broadcast_to([0.1, 0.2, 0.3], (E, d)), rtol=0.06)


def test_rank1_kl_is_the_members_average_of_tfd_kl_divergence():
    layer = tfbnn.layers.DenseRank1(4, ensemble_size=E, prior_mean=0.9, prior_stddev=0.2, init_scale=0.05,
                                    kl_weight=0.01, seed=7)
    layer.build((None, 5))
    layer.alpha_rho.assign(_x((E, 5), 1))
    prior = tfd.Normal(0.9, 0.2)
    expected = sum(
        tf.reduce_sum(tfd.kl_divergence(tfd.Normal(loc, tf.nn.softplus(rho)), prior)).numpy()
        for loc, rho in ((layer.alpha_loc, layer.alpha_rho), (layer.gamma_loc, layer.gamma_rho))
    ) / E
    np.testing.assert_allclose(layer.kl_divergence().numpy(), expected, rtol=1e-5)
    layer(_x((6, 5)))
    np.testing.assert_allclose(layer.losses[0].numpy(), 0.01 * expected, rtol=1e-5)


# -- the prior object (fast_weight_prior) and its deprecated float aliases --------------------------------
_RANK1 = [lambda **kw: tfbnn.layers.DenseRank1(4, ensemble_size=E, init_scale=0.05, seed=7, **kw),
          lambda **kw: tfbnn.layers.Conv2DRank1(4, 3, ensemble_size=E, init_scale=0.05, seed=7, **kw)]


def _built_rank1(layer):
    layer.build((None, 5) if isinstance(layer, tfbnn.layers.DenseRank1) else (None, 6, 6, 5))
    return layer


@pytest.mark.parametrize("make", _RANK1, ids=["dense", "conv2d"])
def test_fast_weight_prior_gives_the_kl_of_tfd_and_of_the_deprecated_floats(make):
    layer = _built_rank1(make(fast_weight_prior=tfbnn.priors.Normal(0.9, 0.2)))
    with pytest.warns(DeprecationWarning, match=r"`prior_stddev=` is deprecated; pass fast_weight_prior=tfbnn\.priors"):
        old = _built_rank1(make(prior_mean=0.9, prior_stddev=0.2))
    assert float(old.kl_divergence()) == float(layer.kl_divergence())  # seeded: bit for bit
    assert old.fast_weight_prior == layer.fast_weight_prior and (layer.prior_mean, layer.prior_stddev) == (0.9, 0.2)
    expected = sum(
        tf.reduce_sum(tfd.kl_divergence(tfd.Normal(loc, tf.nn.softplus(rho)), tfd.Normal(0.9, 0.2))).numpy()
        for loc, rho in ((layer.alpha_loc, layer.alpha_rho), (layer.gamma_loc, layer.gamma_rho))
    ) / E
    np.testing.assert_allclose(layer.kl_divergence().numpy(), expected, rtol=1e-5)


def test_fast_weight_prior_defaults_round_trips_and_old_keys_load():
    assert tfbnn.layers.DenseRank1(2).fast_weight_prior == tfbnn.priors.Normal(1.0, 0.1)
    layer = testing.run_layer_test(
        tfbnn.layers.DenseRank1, {"units": 3, "ensemble_size": 2, "fast_weight_prior": tfbnn.priors.Normal(1.0, 0.3),
                                  "seed": 1},
        input_shape=(4, 5), expected_output_shape=(4, 3), expected_num_losses=1, run_training=False)
    config = layer.get_config()
    assert config["fast_weight_prior"] == {"class_name": "Normal", "config": {"loc": 1.0, "scale": 0.3}}
    assert "prior_mean" not in config and "prior_stddev" not in config
    # A config as tfbnn 0.2 wrote it (the floats) loads, silently, to the same layer.
    old = {**{k: v for k, v in config.items() if k != "fast_weight_prior"}, "prior_mean": 1.0, "prior_stddev": 0.3}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert tfbnn.layers.DenseRank1.from_config(old).get_config() == config


def test_fast_weight_prior_with_a_deprecated_float_or_not_normal_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"Expected `fast_weight_prior` or the deprecated `prior_mean`, not both\. "
                                         r"Received: fast_weight_prior=Normal\(loc=1\.0, scale=0\.1\), prior_mean=0\.5"):
        tfbnn.layers.DenseRank1(3, fast_weight_prior=tfbnn.priors.Normal(1.0, 0.1), prior_mean=0.5)
    with pytest.raises(ValueError, match=r"Expected `fast_weight_prior` to be a tfbnn\.priors\.Normal.*"
                                         r"Received: fast_weight_prior=ScaleMixture"):
        tfbnn.layers.Conv2DRank1(3, 3, fast_weight_prior="scale_mixture")


def test_rank1_posterior_and_kl_stay_float32_under_mixed_precision():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        layer = tfbnn.layers.DenseRank1(3, ensemble_size=2, kl_weight=0.01, seed=0)
        y = layer(_x((4, 5)).astype("float16"))
    finally:
        keras.config.set_dtype_policy(previous)
    assert y.dtype == tf.float16
    assert {v.dtype for v in (layer.alpha_loc, layer.alpha_rho, layer.gamma_loc, layer.gamma_rho)} == {"float32"}
    assert layer.kl_divergence().dtype == tf.float32 and layer.losses[0].dtype == tf.float32


# -- seeds, save / load ---------------------------------------------------------------------------------
def test_rank1_seeded_layers_reproduce_their_samples():
    x = _x((6, 5))

    def draws():
        keras.utils.set_random_seed(0)   # the shared kernel's initializer; the layer's seed draws the noise
        layer = tfbnn.layers.DenseRank1(3, ensemble_size=E, seed=11)
        return [layer(x).numpy() for _ in range(2)]

    first, second = draws(), draws()
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert not np.allclose(first[0], first[1])


def _ensemble_model(cls, size=E, seed=0):
    kwargs = {"kl_weight": 1e-3} if issubclass(cls, tfbnn.layers.BayesianLayer) else {}
    return keras.Sequential([
        keras.Input((5,)),
        tfbnn.layers.EnsembleTile(size),
        cls(8, ensemble_size=size, activation="relu", seed=seed + 1, **kwargs),
        cls(3, ensemble_size=size, activation="softmax", seed=seed + 2, **kwargs),
        tfbnn.layers.EnsembleMean(size),
    ])


def test_ensemble_model_saves_loads_and_averages_its_members(tmp_path):
    model = _ensemble_model(tfbnn.layers.DenseBatchEnsemble)
    x = _x((4, 5))
    with tfbnn.layers.members_as_samples(model) as members:
        per_member = model(x).numpy().reshape(members, 4, 3)
    np.testing.assert_allclose(model(x).numpy(), per_member.mean(axis=0), atol=1e-6)
    path = os.path.join(tmp_path, "be.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=1e-6)


def test_ensemble_model_trains_with_fit():
    model = _ensemble_model(tfbnn.layers.DenseRank1)
    x, y = _x((12, 5)), np.arange(12) % 3
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=6, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert all(not np.allclose(b, w.numpy()) for b, w in zip(before, model.trainable_weights))
    assert model.predict(x, verbose=0).shape == (12, 3)


# -- predict: the members are samples ------------------------------------------------------------------
def test_predict_reads_batch_ensemble_members_as_samples():
    model = _ensemble_model(tfbnn.layers.DenseBatchEnsemble)
    x = _x((5, 5), 2)
    with tfbnn.layers.members_as_samples(model):
        probs = model(x).numpy().reshape(E, 5, 3).astype(np.float64)
    res = tfbnn.predict(model, x, num_samples=10, return_samples=True)
    assert res.num_samples == E and res.samples.shape == (E, 5, 3)   # exact: one sample per member
    np.testing.assert_allclose(res.mean_probs, probs.mean(axis=0), atol=1e-6)
    total, aleatoric = entropy(probs.mean(axis=0)), entropy(probs).mean(axis=0)
    np.testing.assert_allclose(res.predictive_entropy, total, atol=1e-5)
    np.testing.assert_allclose(res.expected_entropy, aleatoric, atol=1e-5)
    np.testing.assert_allclose(res.mutual_information, total - aleatoric, atol=1e-5)
    assert np.all(res.mutual_information > 0)


def test_predict_draws_t_samples_per_rank1_member_member_major():
    model = _ensemble_model(tfbnn.layers.DenseRank1)
    x = _x((4, 5), 3)
    res = tfbnn.predict(model, x, num_samples=6, return_samples=True)
    assert res.samples.shape == (E * 6, 4, 3)
    per_member = res.samples.reshape(E, 6, 4, 3)
    assert not np.allclose(per_member[0, 0], per_member[0, 1])   # draws within a member differ
    probs = res.samples.astype(np.float64)
    np.testing.assert_allclose(res.mutual_information, entropy(probs.mean(0)) - entropy(probs).mean(0), atol=1e-5)
    with tfbnn.posterior_mean(model):
        mean = tfbnn.predict(model, x, num_samples=2, return_samples=True)
        with tfbnn.layers.members_as_samples(model):
            members = model(x).numpy().reshape(E, 4, 3)
    np.testing.assert_allclose(mean.samples.reshape(E, 2, 4, 3), np.repeat(members[:, None], 2, axis=1), atol=1e-6)


def test_a_deep_ensemble_of_batch_ensembles_reads_each_member_as_its_mixture():
    members = [_ensemble_model(tfbnn.layers.DenseBatchEnsemble, size=2, seed=s) for s in (0, 10)]
    ensemble = tfbnn.DeepEnsemble(members)
    x = _x((4, 5), 4)
    res = tfbnn.predict(ensemble, x, num_samples=3, return_samples=True)
    np.testing.assert_allclose(res.samples, np.stack([m(x).numpy() for m in members]), atol=1e-6)


def test_adaptive_prediction_of_a_batch_ensemble_is_exact_with_one_sample_per_member():
    model = _ensemble_model(tfbnn.layers.DenseBatchEnsemble)
    x = _x((4, 5), 5)
    res = tfbnn.predict(model, x, num_samples=tfbnn.inference.AdaptiveSampling(tolerance=0.01), return_samples=True)
    assert res.samples.shape == (E, 4, 3) and np.all(res.standard_error == 0)
    with tfbnn.layers.members_as_samples(model):
        np.testing.assert_allclose(res.samples, model(x).numpy().reshape(E, 4, 3), atol=1e-6)


def test_joint_samples_share_one_draw_per_member_and_sample():
    layer = tfbnn.layers.DenseRank1(2, ensemble_size=2, use_bias=False, seed=8)
    model = keras.Sequential([keras.Input((3,)), layer])
    x = np.ones((2 * 3 * 4, 3), "float32")      # E = 2 members x T = 3 samples x B = 4 rows
    with tfbnn.weight_samples(model, 3, joint=True):
        y = model(x).numpy().reshape(6, 4, 2)
    np.testing.assert_allclose(y, np.repeat(y[:, :1], 4, axis=1), atol=1e-6)
    assert not np.allclose(y[0, 0], y[1, 0])


# -- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: tfbnn.layers.DenseRank1(3, ensemble_size=0), "ensemble_size=0"),
    (lambda: tfbnn.layers.EnsembleTile(1.5), "ensemble_size=1.5"),
    (lambda: tfbnn.layers.DenseRank1(3, prior_stddev=-1.0), "prior_stddev=-1.0"),
    (lambda: tfbnn.layers.Conv2DBatchEnsemble(3, 3, fast_weight_stddev=-0.1), "fast_weight_stddev=-0.1"),
])
def test_bad_arguments_name_the_argument(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_several_ensemble_sizes_in_one_model_are_rejected():
    model = keras.Sequential([keras.Input((3,)), tfbnn.layers.EnsembleMean(2), tfbnn.layers.EnsembleMean(3)])
    with pytest.raises(ValueError, match=r"EnsembleMean sizes \[2, 3\]"):
        tfbnn.layers.ensemble_size(model)


# -- the zoo and the recipe --------------------------------------------------------------------------
TINY_WRN = {"depth": 10, "widen_factor": 1, "input_shape": (8, 8, 1), "num_classes": 3}


@pytest.mark.parametrize("method, ensemble, conv", [
    ("deterministic", "batch_ensemble", tfbnn.layers.Conv2DBatchEnsemble),
    ("mc_dropout", "batch_ensemble", tfbnn.layers.Conv2DBatchEnsemble),
    ("bbb", "rank1", tfbnn.layers.Conv2DRank1),
])
def test_zoo_ensemble_variants_hold_the_members_in_every_weight_layer(method, ensemble, conv):
    model = tfbnn.models.wide_resnet(method, ensemble=ensemble, ensemble_size=2, num_examples=100, seed=3,
                                     **TINY_WRN)
    weights = [l for l in model.layers if isinstance(l, (keras.layers.Conv2D, keras.layers.Dense, rank1.FastWeights))]
    assert weights and all(isinstance(l, (conv, rank1.FastWeights)) and l.ensemble_size == 2 for l in weights)
    assert isinstance(model.layers[1], tfbnn.layers.EnsembleTile) and isinstance(model.layers[-1],
                                                                                  tfbnn.layers.EnsembleMean)
    assert model.name == f"wide_resnet10_1_{ensemble}_{method}"
    assert bool(tfbnn.utils.stochastic_layers(model)) == (method != "deterministic")
    if method == "bbb":
        np.testing.assert_allclose([l.kl_weight.numpy() for l in tfbnn.bayesian_layers(model)], 0.01, rtol=1e-6)


@pytest.mark.parametrize("kwargs, needle", [
    ({"method": "bbb", "ensemble": "batch_ensemble"}, "method='bbb'"),
    ({"method": "deterministic", "ensemble": "rank1"}, "method='deterministic'"),
    ({"method": "deterministic", "ensemble": "bagging"}, "ensemble='bagging'"),
    ({"method": "deterministic", "ensemble": "batch_ensemble", "ensemble_size": 0}, "ensemble_size=0"),
    ({"method": "bbb", "ensemble": "rank1", "bayesian_layers": "last"}, "bayesian_layers='last'"),
])
def test_zoo_rejects_ensembles_that_do_not_fit_the_method(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        tfbnn.models.LayerFactory(num_examples=10, **kwargs)


def test_models_without_the_ensemble_option_reject_it():
    with pytest.raises(ValueError, match="ensemble"):
        tfbnn.models.lenet5("deterministic", ensemble="batch_ensemble", input_shape=(8, 8, 1), padding="same")


@pytest.mark.heavy  # about 15 s of CPU: two traces (train step, Monte Carlo prediction) of a 10-layer network
def test_rank1_recipe_trains_a_few_steps_on_tiny_synthetic_data(tmp_path, monkeypatch):
    monkeypatch.setitem(tfbnn.models.MODELS, "wide_resnet", tfbnn.models.wide_resnet)  # a tiny WRN for the run
    recipe = tfbnn.training.get_recipe("cifar10-resnet50-rank1")
    assert recipe.model_options["ensemble"] == "rank1" and recipe.method == "bbb"
    # The recipe's method and options on a tiny WRN (the ResNet-50 run is tests/training/test_run.py's, heavy).
    quick = recipe.quick(max_examples=24, max_test_examples=12, batch_size=8, eval_samples=2).replace(
        dataset="digits", model="wide_resnet", model_options={"ensemble": "rank1", "ensemble_size": 2, "depth": 10,
                                                              "widen_factor": 1})
    result = tfbnn.training.run(quick, output_dir=str(tmp_path / "out"), verbose=0)
    assert all(np.isfinite(r["loss"]) for r in result.history)
    test = result.test
    assert test["predictive_entropy"] == pytest.approx(test["aleatoric"] + test["epistemic"], abs=1e-5)
    assert test["epistemic"] > 0
    loaded = keras.saving.load_model(tmp_path / "out" / "model.keras")
    assert tfbnn.layers.ensemble_size(loaded) == 2
