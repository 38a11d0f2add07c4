"""Normalizing-flow posteriors: the RealNVP flow, the flow node layers, the flow DenseVariational posterior."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import testing
from tfbnn.layers import NodeConv2DFlow, NodeDense, NodeDenseFlow
from tfbnn.posteriors import AffineCouplingFlow, FlowNormal

tfd = tfp.distributions


def _randomize(weights, seed, scale=0.5):
    """Every weight drawn from N(0, scale^2): a flow far from the identity."""
    rng = np.random.default_rng(seed)
    for w in weights:
        w.assign(scale * rng.normal(size=w.shape).astype("float32"))


def _normal_log_pdf(x, loc, scale):
    return np.sum(-0.5 * ((x - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi), axis=-1)


def _mean_and_stderr(values):
    values = np.asarray(values, np.float64)
    return values.mean(), values.std() / np.sqrt(len(values))


def _flow_layer(d=4, seed=0, **kwargs):
    layer = NodeDenseFlow(2, kl_weight=1e-3, hidden_units=6, num_flows=3, seed=seed, **kwargs)
    layer.build((None, d))
    return layer


# -- the harness ---------------------------------------------------------------------------------


@pytest.mark.heavy
def test_node_dense_flow_basics():
    # kernel, bias, node_loc, node_rho, and 4 per coupling (2 couplings)
    testing.run_layer_test(NodeDenseFlow, {"units": 3, "activation": "relu", "hidden_units": 4, "seed": 7},
                           input_shape=(4, 5), expected_output_shape=(4, 3), expected_num_trainable_weights=12)


def test_node_conv2d_flow_basics_channels_first():
    layer = testing.run_layer_test(
        NodeConv2DFlow, {"filters": 2, "kernel_size": 3, "hidden_units": 4, "seed": 1, "data_format": "channels_first"},
        input_shape=(2, 3, 5, 5), expected_output_shape=(2, 2, 3, 3), run_training=False)
    assert layer.node_loc.shape == (1, 3)  # one noise variable per input channel


# -- the flow: change of variables ---------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 3])
def test_flow_log_det_is_the_log_det_of_the_numerical_jacobian(size):
    flow = AffineCouplingFlow(size, num_flows=3, hidden_units=5, seed=0)
    flow.build()
    _randomize(flow.weights, seed=1)
    x = tf.constant(np.random.default_rng(2).normal(size=(6, size)).astype("float32"))
    y, log_det = flow.forward_and_log_det(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        again = flow.bijector().forward(x)
    jacobian = tape.batch_jacobian(again, x).numpy().astype(np.float64)  # (6, size, size)
    np.testing.assert_allclose(log_det, np.linalg.slogdet(jacobian)[1], atol=1e-4)
    assert np.max(np.abs(log_det)) > 1e-3  # the flow is not volume-preserving
    np.testing.assert_allclose(flow.bijector().inverse(tf.constant(y.numpy())), x, atol=1e-5)


def test_layer_log_density_is_the_change_of_variables():
    layer = _flow_layer(d=3)
    _randomize(layer.flow.weights, seed=3)
    layer.node_rho.assign(np.log(np.expm1([[0.3, 0.5, 0.2]])).astype("float32"))
    base = layer.node_loc.numpy() + 0.3 * np.random.default_rng(4).normal(size=(5, 3)).astype("float32")
    z, log_ratio = layer.log_q_minus_log_p(tf.constant(base))
    with tf.GradientTape() as tape:
        x = tf.constant(base)
        tape.watch(x)
        again = layer.flow.bijector().forward(x)
    _, log_det = np.linalg.slogdet(tape.batch_jacobian(again, x).numpy().astype(np.float64))
    sigma = np.log1p(np.exp(layer.node_rho.numpy()))
    log_q = _normal_log_pdf(base, layer.node_loc.numpy(), sigma) - log_det
    log_p = _normal_log_pdf(z.numpy(), 1.0, 0.1)
    np.testing.assert_allclose(log_ratio, log_q - log_p, rtol=1e-5, atol=1e-3)
    # TFP's TransformedDistribution inverts the flow: the same density from the other side.
    fresh = tf.constant(z.numpy())
    np.testing.assert_allclose(layer.noise_distribution().log_prob(fresh), log_q, rtol=1e-5, atol=1e-3)


# -- KL against an independent Monte Carlo estimate ---------------------------------------------------


def test_kl_estimates_match_an_independent_monte_carlo_estimate():
    layer = _flow_layer(d=4, seed=5, num_kl_samples=20000)
    _randomize(layer.flow.weights, seed=6, scale=0.3)
    q, n = layer.noise_distribution(), 20000
    z = tf.constant(q.sample(n, seed=(7, 8)).numpy())  # a fresh tensor: no bijector cache shared with the sample
    values = q.log_prob(z).numpy() - _normal_log_pdf(z.numpy(), 1.0, 0.1)
    reference, stderr = _mean_and_stderr(values)
    assert abs(float(layer.kl_divergence()) - reference) < 5 * np.sqrt(2) * stderr
    # The call's own estimate: one draw per row, averaged over the rows (kl_weight * KL in layer.losses).
    layer(np.ones((n, 4), "float32"), training=True)
    (loss,) = layer.losses
    assert abs(float(loss) / 1e-3 - reference) < 5 * np.sqrt(2) * stderr
    assert loss.dtype == tf.float32


def test_identity_flow_is_the_one_component_node_layer():
    x = np.random.default_rng(0).normal(size=(6, 4)).astype("float32")
    flow = NodeDenseFlow(3, kl_weight=1e-3, hidden_units=5, seed=11, num_kl_samples=40000)
    node = NodeDense(3, kl_weight=1e-3, num_components=1, seed=11)
    flow.build((None, 4))
    node.build((None, 4))
    node.kernel.assign(flow.kernel)
    np.testing.assert_array_equal(node.node_loc, flow.node_loc)  # same seed: same initial posterior
    np.testing.assert_array_equal(node.node_rho, flow.node_rho)
    # Same seed stream and z = f(z0) = z0: the same noise draws, the same outputs.
    np.testing.assert_allclose(flow(x, training=True), node(x, training=True), rtol=1e-6)
    with tfbnn.posterior_mean(flow), tfbnn.posterior_mean(node):
        np.testing.assert_allclose(flow(x), node(x), rtol=1e-6)
    # The Monte Carlo KL matches the closed-form Gaussian KL (node layer, and tfd.kl_divergence).
    exact = float(node.kl_divergence())
    sigma = tf.nn.softplus(flow.node_rho[0])
    np.testing.assert_allclose(exact, float(tf.reduce_sum(tfd.kl_divergence(
        tfd.Normal(flow.node_loc[0], sigma), tfd.Normal(1.0, 0.1)))), rtol=1e-5)
    base = flow.node_loc.numpy() + sigma.numpy() * np.random.default_rng(1).normal(size=(40000, 4))
    _, stderr = _mean_and_stderr(flow.log_q_minus_log_p(tf.constant(base, tf.float32))[1])
    assert abs(float(flow.kl_divergence()) - exact) < 5 * stderr


# -- seeds, dtypes, errors ---------------------------------------------------------------------------


def test_seeded_layers_reproduce_and_seeds_differ():
    x = np.ones((3, 4), "float32")
    a, b, c = (NodeDenseFlow(2, kl_weight=0.0, hidden_units=4, kernel_initializer="ones", seed=s) for s in (1, 1, 2))
    ya, yb, yc = a(x, training=True), b(x, training=True), c(x, training=True)
    np.testing.assert_array_equal(ya, yb)
    np.testing.assert_array_equal(a.flow.weights[1], b.flow.weights[1])
    assert not np.allclose(a.flow.weights[1], c.flow.weights[1])
    assert not np.allclose(ya, yc)
    assert not np.allclose(a(x, training=True), ya)  # a fresh draw per call


def test_mixed_precision_keeps_the_posterior_and_kl_in_float32():
    layer = NodeDenseFlow(2, kl_weight=1e-3, hidden_units=4, seed=0, dtype="mixed_float16")
    y = layer(np.ones((3, 4), "float32"), training=True)
    assert y.dtype == tf.float16
    assert {w.dtype for w in layer.flow.weights + [layer.node_loc, layer.node_rho]} == {"float32"}
    assert layer.losses[0].dtype == tf.float32


@pytest.mark.parametrize("kwargs, message", [
    ({"num_components": 2}, "num_components=2"),
    ({"kl_estimator": "mixture_mean"}, "kl_estimator='mixture_mean'"),
    ({"num_flows": 0}, "num_flows=0"),
    ({"hidden_units": "8"}, "hidden_units='8'"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NodeDenseFlow(2, **kwargs)


def test_flow_normal_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_flows=-1"):
        FlowNormal(num_flows=-1)


# -- training ----------------------------------------------------------------------------------------


def _regression(n=64, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, 3)).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5], "float32"))[:, None]


def _mean_loss(model, x, y, draws=32):
    """The negative ELBO per example, averaged over ``draws`` posterior samples in one vectorized call."""
    with tfbnn.utils.weight_samples(model, draws, joint=True, with_kl=True):
        out = model(tfbnn.utils.tile_rows(tf.constant(x), draws), training=True)
        return float(tf.reduce_mean(tf.square(out - np.tile(y, (draws, 1)))) + tf.add_n(model.losses))


@pytest.mark.heavy
def test_node_flow_model_trains_with_fit_and_kl_annealing():
    x, y = _regression()
    model = keras.Sequential([keras.Input((3,)), NodeDenseFlow(16, "tanh", hidden_units=8, seed=1),
                              NodeDenseFlow(1, hidden_units=8, seed=2)])
    model.compile(tfbnn.ibnn.node_optimizer(keras.optimizers.Adam(1e-2)), "mse")
    tfbnn.set_kl_weight(model, 0.5 / len(x))  # for the loss before training; KLAnnealing sets 1 / N
    before = _mean_loss(model, x, y)
    model.fit(x, y, epochs=20, batch_size=32, verbose=0, callbacks=[tfbnn.KLAnnealing(num_examples=len(x), schedule="constant")])
    assert _mean_loss(model, x, y) < 0.5 * before
    layer = model.layers[0]
    assert float(layer.kl_weight) == pytest.approx(1 / len(x))  # KLAnnealing wrote beta / N
    assert np.abs(layer.flow.couplings[0][-1].numpy()).max() > 0  # the flow left the identity
    res = tfbnn.predict(model, x[:5], num_samples=8)
    assert res.mean.shape == (5, 1) and np.all(res.epistemic_std > 0)


@pytest.mark.heavy
def test_flow_normal_dense_variational_trains_saves_and_predicts(tmp_path):
    x, y = _regression(n=32)
    model = keras.Sequential([keras.Input((3,)), tfbnn.layers.DenseVariational(
        1, FlowNormal(hidden_units=4, init_scale=0.05, seed=0), "normal", kl_weight=1 / len(x), seed=3)])
    model.compile(keras.optimizers.Adam(3e-2), "mse")
    model(x)
    before = _mean_loss(model, x, y)
    model.fit(x, y, epochs=15, batch_size=16, verbose=0)
    assert _mean_loss(model, x, y) < 0.5 * before
    layer = model.layers[0]
    q = layer.posterior
    assert q.distribution().bijector.name == "affine_coupling_flow"  # a TransformedDistribution
    with tfbnn.posterior_mean(model):  # mean mode uses f(mu)
        kernel, bias = layer.unflatten(q.flow.bijector().forward(tf.convert_to_tensor(q.loc)))
        np.testing.assert_allclose(model(x), x @ kernel.numpy() + bias.numpy(), rtol=1e-5, atol=1e-5)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(model(x), loaded(x))
    res = tfbnn.predict(loaded, x[:4], num_samples=16)
    assert np.all(res.epistemic_std > 0)
