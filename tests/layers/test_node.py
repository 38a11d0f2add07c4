"""iBNN node layers (tfbnn.layers.node) and their training / prediction helpers (tfbnn.ibnn)."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import ibnn, testing
from tfbnn.layers import NodeConv2D, NodeDense, NodeNoise

tfd = tfp.distributions


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def _marked_components(layer, spread=0.0):
    """Component k of ``layer`` becomes z = k + 1 (sigma ~ 0): outputs reveal which component a row used."""
    k, d = layer.node_loc.shape
    layer.node_loc.assign(np.repeat(np.arange(1, k + 1, dtype="float32")[:, None], d, axis=1))
    layer.node_rho.assign(np.full((k, d), -30.0 if spread == 0 else math.log(math.expm1(spread)), "float32"))


# -- the shared harness ------------------------------------------------------------------------


def test_node_dense_basics():
    testing.run_layer_test(
        NodeDense,
        {"units": 3, "activation": "relu", "num_components": 3, "seed": 7},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_trainable_weights=4,  # kernel, bias, node_loc, node_rho
    )


def test_node_dense_rank3_inputs_share_noise_over_middle_axes():
    layer = testing.run_layer_test(
        NodeDense, {"units": 2, "use_bias": False, "seed": 1}, input_shape=(3, 4, 6),
        expected_output_shape=(3, 4, 2), expected_num_trainable_weights=3, run_save_load=False, run_training=False,
    )
    assert layer.node_loc.shape == (4, 6)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_node_conv2d_basics(data_format):
    shape = (2, 6, 6, 3) if data_format == "channels_last" else (2, 3, 6, 6)
    out = (2, 4, 4, 5) if data_format == "channels_last" else (2, 5, 4, 4)
    layer = testing.run_layer_test(
        NodeConv2D, {"filters": 5, "kernel_size": 3, "num_components": 2, "seed": 3, "data_format": data_format},
        input_shape=shape, expected_output_shape=out, expected_num_trainable_weights=4,
    )
    assert layer.node_loc.shape == (2, 3)  # (K, C_in): one noise variable per input channel
    assert layer.kernel.shape == (3, 3, 3, 5)  # the keras Conv2D layout


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_node_conv1d_basics(data_format):
    shape = (2, 7, 3) if data_format == "channels_last" else (2, 3, 7)
    out = (2, 3, 5) if data_format == "channels_last" else (2, 5, 3)
    layer = testing.run_layer_test(
        tfbnn.layers.NodeConv1D, {"filters": 5, "kernel_size": 3, "strides": 2, "num_components": 2, "seed": 3,
                                  "data_format": data_format},
        input_shape=shape, expected_output_shape=out, expected_num_trainable_weights=4,
    )
    assert layer.node_loc.shape == (2, 3) and layer.kernel.shape == (3, 3, 5)


@pytest.mark.parametrize("cls, rank", [(tfbnn.layers.NodeConv1D, 1), (NodeConv2D, 2)])
def test_node_conv_channels_first_equals_channels_last_on_transposed_inputs(cls, rank):
    """Same seed and weights: the same noise per (example, channel), so the same samples."""
    x = np.random.default_rng(0).normal(size=(4,) + (6,) * rank + (3,)).astype("float32")
    outputs = {}
    for data_format, inputs in testing.data_formats(x):
        layer = cls(4, 3, padding="same", data_format=data_format, num_components=2, seed=5,
                    kernel_initializer=keras.initializers.GlorotUniform(seed=1),
                    bias_initializer=keras.initializers.RandomNormal(seed=2))
        outputs[data_format] = (layer(inputs).numpy(), float(layer.kl_divergence()))
    np.testing.assert_allclose(testing.to_channels_last(outputs["channels_first"][0]), outputs["channels_last"][0],
                               rtol=1e-5, atol=1e-5)
    assert outputs["channels_first"][1] == outputs["channels_last"][1]


def test_node_noise_basics_and_conv_axis():
    testing.run_layer_test(NodeNoise, {"num_components": 2, "seed": 2}, input_shape=(4, 5),
                           expected_output_shape=(4, 5), expected_num_trainable_weights=2)
    layer = NodeNoise(axis=1, num_components=3, seed=0)
    assert layer(np.ones((2, 4, 5, 5), "float32")).shape == (2, 4, 5, 5)
    assert layer.node_loc.shape == (3, 4)


def test_node_noise_then_dense_equals_node_dense():
    x = np.random.default_rng(0).normal(size=(6, 5)).astype("float32")
    node = NodeDense(3, num_components=2, seed=4)
    node(x)
    noise, dense = NodeNoise(num_components=2, seed=4), keras.layers.Dense(3)
    dense(noise(x))
    dense.set_weights([node.kernel.numpy(), node.bias.numpy()])
    noise.node_loc.assign(node.node_loc)
    noise.node_rho.assign(node.node_rho)
    noise.seed_generator.state.assign(node.seed_generator.state)
    np.testing.assert_allclose(dense(noise(x)), node(x), rtol=1e-5, atol=1e-6)


# -- initialisation and KL ------------------------------------------------------------------------


def test_initialisation_follows_the_reference_code():
    layer = NodeDense(2, num_components=8, init_stddev=0.5, seed=0)
    layer.build((None, 2000))
    loc, scale = layer.node_loc.numpy(), layer.node_scale().numpy()
    assert abs(loc.mean() - 1.0) < 0.02 and abs(loc.std() - 0.5) < 0.02  # mu_k ~ N(1, sigma0^2)
    folded = np.abs(np.random.default_rng(0).normal(0.05, 0.02, size=200_000))  # |N(0.05, 0.02^2)|
    assert abs(scale.mean() - folded.mean()) < 2e-3 and abs(scale.std() - folded.std()) < 2e-3
    np.testing.assert_allclose(_softplus(layer.node_rho.numpy()), scale, rtol=1e-5)  # rho = softplus^-1(sigma)
    zero = NodeDense(2, init_stddev=0.0, seed=0)
    zero.build((None, 5))
    np.testing.assert_array_equal(zero.node_loc.numpy(), 1.0)


@pytest.mark.parametrize("d", [600, 601])
def test_noise_is_standard_normal(d):
    # A posterior N(0, 1) for every node: the noise on inputs of ones is eps itself.
    layer = NodeNoise(num_components=1, init_mean=0.0, init_stddev=0.0, init_scale_mean=1.0, init_scale_stddev=0.0,
                      seed=3, kl_weight=0.0)
    eps = layer(np.ones((200, d), "float32"), training=True).numpy()
    assert eps.shape == (200, d) and np.all(np.isfinite(eps))
    flat = eps.ravel()
    assert abs(flat.mean()) < 0.01 and abs(flat.std() - 1) < 0.01
    assert abs(np.mean(flat**4) - 3) < 0.1  # Gaussian kurtosis
    assert abs(np.corrcoef(eps[:, 0], eps[:, (d + 1) // 2])[0, 1]) < 0.25  # the two outputs of a pair
    assert abs(np.mean(np.abs(flat) < 1.0) - 0.6827) < 0.01


@pytest.mark.parametrize("k", [1, 3])
def test_kl_is_the_closed_form_of_eqs_22_to_24(k):
    layer = NodeDense(4, num_components=k, prior_stddev=0.3, init_stddev=0.7, seed=5, kl_weight=0.01)
    layer(np.ones((2, 6), "float32"))
    loc, rho = layer.node_loc.numpy().astype(np.float64), layer.node_rho.numpy().astype(np.float64)
    # q_hat = N(mean_k mu_k, sum_k sigma_k^2 / K^2) against p = N(1, s^2), summed over nodes.
    m, v = loc.mean(axis=0), np.sum(_softplus(rho) ** 2, axis=0) / k**2
    expected = float(tf.reduce_sum(tfd.kl_divergence(tfd.Normal(m, np.sqrt(v)), tfd.Normal(np.float64(1.0), np.float64(0.3)))))
    s = 0.3
    by_hand = np.sum(np.log(s / np.sqrt(v)) + (v + (m - 1) ** 2) / (2 * s**2) - 0.5)
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
    np.testing.assert_allclose(expected, by_hand, rtol=1e-10)
    np.testing.assert_allclose(float(layer.losses[0]), 0.01 * expected, rtol=1e-5)  # kl_weight * KL


def test_kl_with_a_non_default_prior_mean_is_that_of_the_normal_components():
    layer = NodeDense(3, num_components=2, prior_mean=0.6, prior_stddev=0.25, init_stddev=0.4, seed=8, kl_weight=0.1)
    layer(np.ones((2, 5), "float32"))
    loc, scale = layer.node_loc.numpy().astype(np.float64), layer.node_scale().numpy().astype(np.float64)
    # q_hat = N(mean_k mu_k, sum_k sigma_k^2 / K^2) per node, against p = N(0.6, 0.25^2).
    q_hat = tfd.Normal(loc.mean(axis=0), np.sqrt(np.sum(scale**2, axis=0)) / 2)
    expected = float(tf.reduce_sum(tfd.kl_divergence(q_hat, tfd.Normal(np.float64(0.6), np.float64(0.25)))))
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
    # The prior mean matters: the same posterior against the default N(1, 0.25^2) differs.
    default = float(tf.reduce_sum(tfd.kl_divergence(q_hat, tfd.Normal(np.float64(1.0), np.float64(0.25)))))
    assert abs(default - expected) > 0.1


def test_initial_means_and_scales_follow_the_arguments():
    # The official CIFAR command: means N(1, 0.05^2), scales |N(0.3, 0.02^2)|.
    layer = NodeDense(2, num_components=4, init_stddev=0.05, init_scale_mean=0.3, init_scale_stddev=0.02, seed=2)
    layer.build((None, 5000))
    loc, scale = layer.node_loc.numpy(), layer.node_scale().numpy()
    assert abs(loc.mean() - 1.0) < 2e-3 and abs(loc.std() - 0.05) < 2e-3
    assert abs(scale.mean() - 0.3) < 2e-3 and abs(scale.std() - 0.02) < 2e-3
    exact = NodeNoise(num_components=3, init_mean=0.5, init_stddev=0.0, init_scale_mean=0.4, init_scale_stddev=0.0)
    exact.build((None, 7))
    np.testing.assert_array_equal(exact.node_loc.numpy(), 0.5)
    np.testing.assert_allclose(exact.node_scale().numpy(), 0.4, rtol=1e-6)


def test_prior_and_initialisation_arguments_round_trip():
    kwargs = {"num_components": 2, "node_prior": tfbnn.priors.Normal(0.8, 0.3), "init_mean": 0.9,
              "init_stddev": 0.05, "init_scale_mean": 0.3, "init_scale_stddev": 0.01, "seed": 4}
    layer = testing.run_layer_test(NodeDense, {"units": 3, **kwargs}, input_shape=(4, 5), expected_output_shape=(4, 3),
                                   expected_num_trainable_weights=4, run_training=False)
    config = layer.get_config()
    assert {k: config[k] for k in kwargs} == {**kwargs, "node_prior": tfbnn.priors.serialize(kwargs["node_prior"])}
    assert NodeDense.from_config(config).get_config() == config
    # A config written before prior_mean and init_mean existed (tfbnn 0.1: prior_stddev only)
    # loads with the former constants (mean 1).
    old = {k: v for k, v in config.items() if k not in ("node_prior", "init_mean")}
    restored = NodeDense.from_config({**old, "prior_stddev": 0.3})
    assert restored.prior_mean == 1.0 and restored.init_mean == 1.0
    assert restored.node_prior == tfbnn.priors.Normal(1.0, 0.3)


# -- the prior object (node_prior) and its deprecated float aliases ------------------------------------


def _built(layer, input_dim=5):
    layer.build((None, input_dim))
    return layer


@pytest.mark.parametrize("make", [
    lambda **kw: NodeNoise(num_components=2, init_stddev=0.4, seed=8, **kw),
    lambda **kw: NodeNoise(num_components=2, init_stddev=0.4, kl_estimator="monte_carlo", num_kl_samples=3, seed=8,
                           **kw),
    lambda **kw: tfbnn.layers.NodeDenseFlow(3, hidden_units=4, seed=8, **kw),
], ids=["mixture_mean", "monte_carlo", "flow"])
def test_node_prior_gives_the_numbers_of_the_deprecated_floats(make):
    layer = _built(make(node_prior=tfbnn.priors.Normal(0.6, 0.25)))
    with pytest.warns(DeprecationWarning, match=r"`prior_mean=` is deprecated; pass node_prior=tfbnn\.priors\.Normal"):
        old = _built(make(prior_mean=0.6, prior_stddev=0.25))
    assert float(old.kl_divergence()) == float(layer.kl_divergence())  # seeded: the same numbers, bit for bit
    assert old.node_prior == layer.node_prior == tfbnn.priors.Normal(0.6, 0.25)
    assert (layer.prior_mean, layer.prior_stddev) == (0.6, 0.25)
    assert {**old.get_config(), "name": None} == {**layer.get_config(), "name": None}


def test_node_prior_gives_the_kl_of_tfd_kl_divergence():
    layer = _built(NodeDense(3, num_components=2, node_prior=tfbnn.priors.Normal(0.6, 0.25), init_stddev=0.4, seed=8))
    loc, scale = layer.node_loc.numpy().astype(np.float64), layer.node_scale().numpy().astype(np.float64)
    q_hat = tfd.Normal(loc.mean(axis=0), np.sqrt(np.sum(scale**2, axis=0)) / 2)  # eqs. 22-24
    expected = float(tf.reduce_sum(tfd.kl_divergence(q_hat, tfd.Normal(np.float64(0.6), np.float64(0.25)))))
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)


def test_node_prior_defaults_to_normal_1_0_1_and_one_old_float_keeps_the_other_default():
    assert NodeDense(2).node_prior == tfbnn.priors.Normal(1.0, 0.1)
    with pytest.warns(DeprecationWarning, match="prior_stddev"):
        assert NodeConv2D(2, 3, prior_stddev=0.3).node_prior == tfbnn.priors.Normal(1.0, 0.3)
    assert NodeDense(2, node_prior={"class_name": "Normal", "config": {"loc": 1.0, "scale": 0.2}}).prior_stddev == 0.2


@pytest.mark.parametrize("old", [{"prior_mean": 0.9}, {"prior_stddev": 0.2}, {"prior_mean": 0.9, "prior_stddev": 0.2}])
def test_node_prior_and_a_deprecated_float_together_are_an_error_naming_both(old):
    with pytest.raises(ValueError, match=r"Expected `node_prior` or the deprecated `prior_.*`, not both\. "
                                         r"Received: node_prior=Normal\(loc=1\.0, scale=0\.3\), prior_"):
        NodeDense(2, node_prior=tfbnn.priors.Normal(1.0, 0.3), **old)


def test_node_prior_must_be_a_normal():
    for bad in (tfbnn.priors.ScaleMixture(), "scale_mixture"):
        with pytest.raises(ValueError, match=r"Expected `node_prior` to be a tfbnn\.priors\.Normal.*Received: "
                                             r"node_prior=ScaleMixture"):
            NodeNoise(node_prior=bad)
    with pytest.raises(ValueError, match="Received: node_prior=1.0"):
        NodeNoise(node_prior=1.0)


def test_a_saved_config_with_the_old_prior_keys_loads_silently_with_the_same_kl(recwarn):
    layer = NodeDense(3, num_components=2, node_prior=tfbnn.priors.Normal(0.7, 0.2), seed=3)
    layer.build((None, 4))
    saved = keras.saving.serialize_keras_object(layer)
    config = {k: v for k, v in saved["config"].items() if k != "node_prior"}
    old = {**saved, "config": {**config, "prior_mean": 0.7, "prior_stddev": 0.2}}  # as tfbnn 0.2 wrote it
    restored = keras.saving.deserialize_keras_object(old)  # built from the saved build config
    restored.set_weights(layer.get_weights())
    assert restored.node_prior == layer.node_prior and restored.get_config() == layer.get_config()
    assert float(restored.kl_divergence()) == float(layer.kl_divergence())
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning) and "prior_" in str(w.message)]


@pytest.mark.parametrize("prior_mean", [1.0, 0.6])
def test_monte_carlo_kl_estimates_the_true_mixture_kl(prior_mean):
    layer = NodeNoise(num_components=2, prior_mean=prior_mean, prior_stddev=0.5, kl_estimator="monte_carlo",
                      num_kl_samples=4000, seed=1)
    layer.build((None, 3))
    layer.node_loc.assign([[0.5, 1.0, 1.5], [1.5, 1.2, 0.8]])
    layer.node_rho.assign(np.log(np.expm1(np.array([[0.2, 0.3, 0.1], [0.25, 0.1, 0.3]], "float32"))))
    estimate = float(layer.kl_divergence())
    # Independent reference: E_q[log q - log p] under the TFP mixture, from its own samples.
    q = tfd.MixtureSameFamily(
        tfd.Categorical(logits=tf.zeros(2, tf.float64)),
        tfd.Independent(tfd.Normal(tf.constant(layer.node_loc.numpy(), tf.float64),
                                   tf.constant(layer.node_scale().numpy(), tf.float64)), 1),
    )
    p = tfd.Independent(tfd.Normal(tf.fill([3], tf.constant(prior_mean, tf.float64)), 0.5), 1)
    z = q.sample(200_000, seed=3)
    reference = float(tf.reduce_mean(q.log_prob(z) - p.log_prob(z)))
    assert abs(estimate - reference) < 0.05 * abs(reference) + 0.02
    # The mixture-mean approximation is a different number for separated components.
    approx = NodeNoise(num_components=2, prior_mean=prior_mean, prior_stddev=0.5, seed=1)
    approx.build((None, 3))
    approx.node_loc.assign(layer.node_loc)
    approx.node_rho.assign(layer.node_rho)
    assert abs(float(approx.kl_divergence()) - reference) > 0.1


# -- which component each row uses (Algorithm 1 and the prediction protocol) -----------------------------


def test_training_rows_use_component_i_mod_k():
    layer = NodeNoise(num_components=3, seed=0, kl_weight=0.0)
    layer.build((None, 2))
    _marked_components(layer)
    out = layer(np.ones((7, 2), "float32"), training=True).numpy()
    np.testing.assert_allclose(out[:, 0], [1, 2, 3, 1, 2, 3, 1], rtol=1e-6)
    assert layer.component_index(7).numpy().tolist() == [0, 1, 2, 0, 1, 2, 0]
    # A plain inference call samples the same way (one draw per example).
    np.testing.assert_allclose(layer(np.ones((4, 2), "float32")).numpy()[:, 1], [1, 2, 3, 1], rtol=1e-6)


def test_s_samples_per_example_keep_the_example_component():
    model = keras.Sequential([keras.Input((2,)), NodeNoise(num_components=2, seed=0, kl_weight=0.0)])
    _marked_components(model.layers[0])
    x = np.ones((3, 2), "float32")
    previous = model.layers[0].set_train_samples(3)  # what IBNNModel sets while it traces its step
    out = model(np.tile(x, (3, 1)), training=True).numpy()[:, 0]
    model.layers[0].set_train_samples(previous)
    # Rows s * B + i (B = 3): example i uses component i mod 2 in all three of its samples.
    np.testing.assert_allclose(out, [1, 2, 1] * 3, rtol=1e-6)


def test_ibnn_model_train_step_tiles_and_assigns_per_example():
    # B = 3 examples (in order: the component goes by batch row), K = 2, S = 2; SGD with rate 0
    # so the reported loss is the loss of the batch.
    noise = NodeNoise(num_components=2, seed=0, kl_weight=0.0)
    net = keras.Sequential([keras.Input((1,)), noise])
    _marked_components(noise)

    class Rows(keras.metrics.Metric):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.rows = self.add_variable(shape=(), initializer="zeros", name="rows")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.rows.assign(tf.cast(tf.shape(y_pred)[0], "float32"))

        def result(self):
            return self.rows

    x = np.array([[1.0], [2.0], [3.0]], "float32")
    model = ibnn.IBNNModel(net, num_train_samples=2)
    model.compile(keras.optimizers.SGD(0.0), "mse", metrics=[Rows(name="rows")])
    history = model.fit(x, np.zeros((3, 1), "float32"), batch_size=3, epochs=1, shuffle=False, verbose=0)
    assert history.history["rows"][0] == 6  # S * B rows in the train step
    # Example i uses z = (i mod 2) + 1 in both samples: mean over rows of (z_i x_i)^2.
    np.testing.assert_allclose(history.history["loss"][0], np.mean([1.0, 16.0, 9.0]), rtol=1e-5)
    assert model.evaluate(x, np.zeros((3, 1)), verbose=0, return_dict=True)["rows"] == 3  # untiled outside training


def test_monte_carlo_blocks_use_component_t_mod_k():
    layer = NodeNoise(num_components=3, seed=0)
    layer.build((None, 2))
    _marked_components(layer)
    b, n = 4, 2
    model = keras.Sequential([keras.Input((2,)), layer])
    with tfbnn.weight_samples(model, 3 * n):
        out = model(np.ones((3 * n * b, 2), "float32")).numpy().reshape(3 * n, b, 2)
    np.testing.assert_allclose(out[:, :, 0], np.repeat(np.array([1, 2, 3, 1, 2, 3])[:, None], b, axis=1), rtol=1e-6)
    with tfbnn.weight_samples(model, 3 * n):
        np.testing.assert_array_equal(layer.component_index(3 * n * b).numpy(), np.repeat([0, 1, 2, 0, 1, 2], b))
    with pytest.warns(UserWarning, match="do not cover"):
        with tfbnn.weight_samples(model, 4):
            model(np.ones((8, 2), "float32"))


def test_mean_mode_uses_the_mixture_mean():
    layer = NodeNoise(num_components=3, seed=0, inference_mode="mean")
    layer.build((None, 2))
    _marked_components(layer, spread=0.5)
    np.testing.assert_allclose(layer(np.ones((5, 2), "float32")).numpy(), 2.0)  # (1 + 2 + 3) / 3


def test_per_row_and_joint_sampling_in_monte_carlo_prediction():
    layer = NodeNoise(num_components=2, seed=0)
    model = keras.Sequential([keras.Input((3,)), layer])
    x = np.ones((4 * 5, 3), "float32")  # T = 4 samples of B = 5 identical examples
    with tfbnn.weight_samples(model, 4):
        per_row = model(x).numpy().reshape(4, 5, 3)
    with tfbnn.weight_samples(model, 4, joint=True):
        joint = model(x).numpy().reshape(4, 5, 3)
    assert np.std(per_row, axis=1).min() > 0  # every row its own draw
    np.testing.assert_allclose(joint, np.broadcast_to(joint[:, :1], joint.shape))  # one draw per sample block
    assert not np.allclose(joint[0], joint[2])  # ... and distinct samples


# -- shapes, seeds, save/load -----------------------------------------------------------------------------


def _mlp(k=4, seed=1):
    return keras.Sequential([
        keras.Input((6,)),
        NodeDense(16, activation="relu", num_components=k, seed=seed),
        NodeDense(3, activation="softmax", num_components=k, seed=seed + 1),
    ])


def test_k_and_s_shapes_and_prediction_sample_count():
    x = np.random.default_rng(0).normal(size=(10, 6)).astype("float32")
    net = _mlp(k=3)
    assert [layer.node_loc.shape for layer in ibnn.node_layers(net)] == [(3, 6), (3, 16)]
    assert ibnn.num_components(net) == 3 and ibnn.ibnn_num_samples(net) == 15 and ibnn.ibnn_num_samples(net, 2) == 6
    res = tfbnn.predict(net, x, num_samples=ibnn.ibnn_num_samples(net, n=2), return_samples=True)
    assert res.samples.shape == (6, 10, 3) and res.mean_probs.shape == (10, 3)
    assert ibnn.predict_per_component(net, x, n=2).num_samples == 6
    assert ibnn.sample_outputs(net, x, 6, batch_size=4).shape == (6, 10, 3)
    mixed = keras.Sequential([keras.Input((6,)), NodeDense(4, num_components=2), NodeDense(3, num_components=3)])
    assert ibnn.num_components(mixed) == 6  # lcm: every component of every layer is covered


def test_seeded_layers_reproduce():
    x = np.ones((5, 4), "float32")
    runs = []
    for _ in range(2):
        layer = NodeDense(3, num_components=2, seed=11, kl_weight=0.0,
                          kernel_initializer=keras.initializers.GlorotUniform(seed=5))
        runs.append(np.stack([layer(x, training=True if i else None).numpy() for i in range(3)]))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.allclose(runs[0][0], runs[0][1])  # fresh noise on every call


def test_ibnn_model_and_multi_optimizer_save_load(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = ibnn.IBNNModel(_mlp(), num_train_samples=2)
    model.compile(ibnn.node_optimizer(variational_learning_rate=0.05), "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[tfbnn.KLAnnealing(num_examples=64)])
    path = os.path.join(tmp_path, "ibnn.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, ibnn.IBNNModel) and loaded.num_train_samples == 2
    assert isinstance(loaded.optimizer, keras.optimizers.MultiOptimizer)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(model(x), loaded(x))  # sampled: the seed state was saved too
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[tfbnn.KLAnnealing(num_examples=64)])


# -- per-group learning rates -------------------------------------------------------------------------------


def test_node_optimizer_routes_variational_parameters():
    x = np.random.default_rng(0).normal(size=(32, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    net = _mlp()
    net.compile(ibnn.node_optimizer(keras.optimizers.SGD(0.0), variational_learning_rate=0.1),
                "sparse_categorical_crossentropy")
    det_before = [w.numpy().copy() for w in ibnn.deterministic_weights(net)]
    var_before = [w.numpy().copy() for w in ibnn.variational_weights(net)]
    net.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[tfbnn.KLAnnealing(num_examples=32)])
    assert len(det_before) == 4 and len(var_before) == 4
    for before, w in zip(det_before, ibnn.deterministic_weights(net)):
        np.testing.assert_array_equal(before, w.numpy())  # SGD(0): the weights stay
    assert all(not np.allclose(b, w.numpy()) for b, w in zip(var_before, ibnn.variational_weights(net)))
    opt = net.optimizer
    rates = sorted(float(o.learning_rate.numpy()) for o in opt.optimizers)
    assert rates == [0.0, pytest.approx(0.1)]


def test_node_optimizer_copies_the_weight_optimizer_with_a_constant_rate():
    schedule = keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=100)
    adam = keras.optimizers.Adam(schedule, beta_1=0.8, weight_decay=1e-4)
    opt = ibnn.node_optimizer(adam)
    assert adam in opt.optimizers and len(opt.optimizers) == 2  # the decaying one, as given
    (variational,) = [o for o in opt.optimizers if o is not adam]
    assert isinstance(variational, keras.optimizers.Adam) and variational.beta_1 == 0.8
    assert variational.weight_decay is None and float(variational.learning_rate) == pytest.approx(1e-2)


# -- the pretrained start ------------------------------------------------------------------------------------


def test_add_node_noise_to_a_trained_sequential_model():
    x = np.random.default_rng(0).normal(size=(40, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    base = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(2, activation="softmax")])  # stands for a trained model
    before = [w.numpy().copy() for w in base.weights]
    model = ibnn.add_node_noise(base, num_components=3, freeze_weights=True, seed=0)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["NodeNoise", "Dense", "NodeNoise", "Dense"]
    with tfbnn.posterior_mean(model):  # mu_k start at 1: the copy computes the trained function
        np.testing.assert_allclose(model(x), base(x), rtol=1e-5, atol=1e-6)
    assert {w.name for w in model.trainable_weights} == {"node_loc", "node_rho"}  # only the noise trains
    model.compile(ibnn.node_optimizer(), "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=1, verbose=0, callbacks=[tfbnn.KLAnnealing(num_examples=40)])
    for b, w in zip(before, base.weights):
        np.testing.assert_array_equal(b, w.numpy())  # the original is untouched


def test_add_node_noise_takes_node_prior_and_the_deprecated_floats_once():
    base = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    prior = tfbnn.priors.Normal(1.0, 0.3)
    model = ibnn.add_node_noise(base, node_prior=prior, seed=0)
    assert [layer.node_prior for layer in ibnn.node_layers(model)] == [prior, prior]
    with pytest.warns(DeprecationWarning, match="`prior_stddev=` is deprecated; pass node_prior=") as caught:
        old = ibnn.add_node_noise(base, prior_stddev=0.3, seed=0)
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1  # once, not per layer
    assert [layer.node_prior for layer in ibnn.node_layers(old)] == [prior, prior]
    with pytest.raises(ValueError, match="Expected `node_prior` or the deprecated `prior_stddev`, not both"):
        ibnn.add_node_noise(base, node_prior=prior, prior_stddev=0.3)


def test_add_node_noise_to_a_functional_conv_model():
    inputs = keras.Input((8, 8, 2))
    h = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    base = keras.Model(inputs, keras.layers.Dense(3)(h))
    x = np.random.default_rng(1).normal(size=(5, 8, 8, 2)).astype("float32")
    model = ibnn.add_node_noise(base, num_components=2, seed=3)
    noises = ibnn.node_layers(model)
    assert [n.node_loc.shape for n in noises] == [(2, 2), (2, 4)]  # per input channel, per input node
    with tfbnn.posterior_mean(model):
        np.testing.assert_allclose(model(x), base(x), rtol=1e-5, atol=1e-5)
    assert len(model.trainable_weights) == len(base.trainable_weights) + 4


# -- prediction: log-mean-exp NLL ---------------------------------------------------------------------------------


def test_predictive_nll_is_log_mean_exp_over_samples():
    x = np.random.default_rng(0).normal(size=(12, 6)).astype("float32")
    y = np.arange(12) % 3
    net = _mlp(k=2)
    logits = keras.Sequential([keras.Input((6,)), NodeDense(16, "relu", num_components=2), NodeDense(3, num_components=2)])
    logits.set_weights(net.get_weights())
    with tfbnn.posterior_mean(net), tfbnn.posterior_mean(logits):  # identical samples: NLL of the mean net
        probs = net.predict(x, verbose=0)
        expected = tfbnn.negative_log_likelihood(probs, y)
        np.testing.assert_allclose(ibnn.predictive_nll(net, x, y, n=2), expected, rtol=1e-5)
        np.testing.assert_allclose(ibnn.predictive_nll(logits, x, y, n=2, from_logits=True), expected, rtol=1e-4)
    samples = ibnn.sample_outputs(net, x, 8)
    assert not np.allclose(samples[0], samples[1])  # distinct samples in one vectorized call
    nll = ibnn.predictive_nll(net, x, y, num_samples=8)
    assert math.isfinite(nll) and nll > 0


# -- bad arguments ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_components": 0}, "num_components=0"),
        ({"num_components": -2}, "num_components=-2"),
        ({"num_components": 1.5}, "num_components=1.5"),
        ({"num_components": True}, "num_components=True"),
        ({"prior_stddev": 0.0}, "prior_stddev=0.0"),
        ({"prior_stddev": -1.0}, "prior_stddev=-1.0"),
        ({"prior_stddev": float("nan")}, "prior_stddev=nan"),
        ({"init_stddev": -0.1}, "init_stddev=-0.1"),
        ({"prior_mean": float("nan")}, "prior_mean=nan"),
        ({"prior_mean": "1"}, "prior_mean='1'"),
        ({"init_mean": float("inf")}, "init_mean=inf"),
        ({"init_scale_mean": 0.0}, "init_scale_mean=0.0"),
        ({"init_scale_stddev": -1}, "init_scale_stddev=-1"),
        ({"kl_estimator": "exact"}, "kl_estimator='exact'"),
        ({"num_kl_samples": 0}, "num_kl_samples=0"),
        ({"units": 0}, "units=0"),
        ({"inference_mode": "median"}, "inference_mode='median'"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match="Expected .*Received: " + match.replace("(", r"\(").replace(".", r"\.")):
        NodeDense(**{"units": 2, **kwargs})


def test_bad_arguments_of_the_helpers():
    with pytest.raises(ValueError, match="Received: filters=0"):
        NodeConv2D(0, 3)
    with pytest.raises(ValueError, match="Received: axis=0"):
        NodeNoise(axis=0)
    with pytest.raises(ValueError, match="Received: num_train_samples=0"):
        ibnn.IBNNModel(_mlp(), num_train_samples=0)
    with pytest.raises(ValueError, match="without any"):
        ibnn.IBNNModel(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    with pytest.raises(ValueError, match="Received: n=0"):
        ibnn.ibnn_num_samples(_mlp(), n=0)
    with pytest.raises(ValueError, match="not both"):
        ibnn.node_optimizer(variational_optimizer="sgd", variational_learning_rate=0.1)
    with pytest.raises(ValueError, match="Received: variational_learning_rate=-1"):
        ibnn.node_optimizer(variational_learning_rate=-1)
    with pytest.raises(ValueError, match="Received: num_components=0"):
        ibnn.add_node_noise(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), num_components=0)
    with pytest.raises(ValueError, match="Expected a built Sequential or functional model"):
        ibnn.add_node_noise(keras.Sequential([keras.layers.Dense(1)]))
    with pytest.raises(ValueError, match="no layer of the types"):
        ibnn.add_node_noise(keras.Sequential([keras.Input((2,)), keras.layers.Activation("relu")]))
    with pytest.raises(ValueError, match="rank 4"):
        NodeConv2D(2, 3)(np.ones((2, 5), "float32"))


@pytest.mark.heavy
def test_node_layers_export_to_onnx_and_serve_without_tfbnn(tmp_path):
    """Issue 36 (found by the conformance harness): the node noise's Box-Muller draw used Log1p, which ONNX
    lacks, so onnxruntime refused every iBNN export (INVALID_GRAPH); a portable export now draws with its
    RandomStandardNormal op. Served by onnxruntime alone: the posterior mean equals the model's, samples finite."""
    cases = testing.cases()
    testing.export_and_serve([cases["NodeDense"], cases["NodeConv2D"]], "export_onnx", str(tmp_path))
