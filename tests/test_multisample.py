"""tfbnn.MultiSampleModel: S whole-network weight samples per train step (issue 13 item 1)."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import layers as L

S = 4
KL_WEIGHT = 0.05


def _seed_states(model):
    return [(layer, layer.seed_generator.state.numpy()) for layer in tfbnn.stochastic_layers(model)]


def _restore(states):
    for layer, state in states:
        layer.seed_generator.state.assign(state)


def _one_step_loss(model, x, y, loss):
    """The loss of one train step (learning rate 0, so the weights stay) and the seed states before it."""
    model.compile(keras.optimizers.SGD(0.0), loss)
    states = _seed_states(model.network)
    return float(model.train_on_batch(x, y)), states


def _joint_call(net, x, samples=S):
    """The S sample outputs ``(S, B, ...)`` and the KL loss, by the same vectorized call as the wrapper."""
    with tfbnn.weight_samples(net, samples, joint=True, with_kl=True):
        out = net(np.tile(x, (samples,) + (1,) * (x.ndim - 1)), training=True)
    return np.reshape(np.asarray(out), (samples, -1) + tuple(out.shape[1:])), float(sum(net.losses))


def _normal_log_prob(w, loc, scale):
    return -0.5 * np.square((w - loc) / scale) - np.log(scale) - 0.5 * math.log(2 * math.pi)


@pytest.mark.parametrize("prior", ["normal", "scale_mixture"])
def test_train_step_loss_equals_hand_computed_one(prior):
    # x = I makes the S output blocks of a linear, bias-free layer its S kernel samples W_s.
    d, u = 3, 2
    net = keras.Sequential([keras.Input((d,)), L.DenseReparameterization(
        u, use_bias=False, kernel_prior=prior, kernel_scale_initializer="zeros", kl_weight=KL_WEIGHT, seed=3)])
    x, y = np.eye(d, dtype="float32"), np.ones((d, u), "float32")
    loss, states = _one_step_loss(tfbnn.MultiSampleModel(net, num_samples=S), x, y, "mse")
    _restore(states)
    kernels, kl_loss = _joint_call(net, x)
    layer = net.layers[0]
    loc, scale = layer.kernel_loc.numpy(), layer.kernel_scale().numpy()
    assert np.all(np.std(kernels, axis=0) > 0)  # S distinct weight samples
    if prior == "normal":  # closed form, once (not S times)
        kl = np.sum(np.log(1.0 / scale) + (scale**2 + loc**2) / 2 - 0.5)
    else:  # the mean of the S one-sample estimates log q(W_s) - log p(W_s)
        p = layer.kernel_prior
        log_p = np.log(p.pi * np.exp(_normal_log_prob(kernels, 0, p.sigma1))
                       + (1 - p.pi) * np.exp(_normal_log_prob(kernels, 0, p.sigma2)))
        kl = np.mean(np.sum(_normal_log_prob(kernels, loc, scale) - log_p, axis=(1, 2)))
    np.testing.assert_allclose(kl_loss, KL_WEIGHT * kl, rtol=1e-4)
    mse = np.mean(np.square(y - kernels.mean(axis=0)))
    np.testing.assert_allclose(loss, mse + KL_WEIGHT * kl, rtol=1e-4)


@pytest.mark.parametrize("average", ["mean", "log_mean_exp"])
def test_classification_loss_equals_hand_computed_one(average):
    rng = np.random.RandomState(0)
    x, y = rng.randn(8, 5).astype("float32"), rng.randint(0, 3, 8)
    head = "softmax" if average == "mean" else None
    net = keras.Sequential([
        keras.Input((5,)),
        L.DenseFlipout(6, activation="relu", kernel_scale_initializer="zeros", kl_weight=KL_WEIGHT, seed=1),
        L.DenseLocalReparameterization(3, activation=head, kernel_prior="scale_mixture",
                                       kernel_scale_initializer="zeros", kl_weight=KL_WEIGHT, seed=2),
    ])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=head is None)
    loss, states = _one_step_loss(tfbnn.MultiSampleModel(net, num_samples=S, average=average), x, y, loss_fn)
    _restore(states)
    outputs, kl_loss = _joint_call(net, x)
    probs = outputs if head else np.exp(outputs) / np.exp(outputs).sum(-1, keepdims=True)
    predictive = probs.mean(axis=0)  # both averages: -log (1/S) sum_s p_s(y)
    nll = -np.mean(np.log(predictive[np.arange(len(y)), y]))
    np.testing.assert_allclose(loss, nll + kl_loss, rtol=1e-4)
    assert kl_loss > 0


def _gradient_variance(samples, repeats=40):
    net = keras.Sequential([keras.Input((4,)), L.DenseReparameterization(
        3, kernel_scale_initializer="zeros", kl_weight=1e-3, seed=7)])
    model = tfbnn.MultiSampleModel(net, num_samples=samples)
    model.compile(keras.optimizers.SGD(1.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 4).astype("float32"), rng.randint(0, 3, 16)
    start = [v.numpy() for v in net.trainable_variables]
    loc = net.layers[0].kernel_loc
    grads = []
    for _ in range(repeats):  # the seed generator moves on: a new weight draw each step
        before = loc.numpy()
        model.train_on_batch(x, y)
        grads.append(before - loc.numpy())  # SGD with rate 1: the gradient w.r.t. the posterior mean
        for v, value in zip(net.trainable_variables, start):
            v.assign(value)
    return float(np.sum(np.var(np.stack(grads), axis=0)))


def test_gradient_variance_falls_with_the_number_of_samples():
    one, eight = _gradient_variance(1), _gradient_variance(8)
    assert one > 0
    assert eight < 0.5 * one, (one, eight)


def _dense(layer_fn, closed_form=True):
    return lambda: keras.Sequential([keras.Input((6,)), layer_fn(8, "relu"), layer_fn(3, "softmax")]), closed_form


def _conv(layer_fn):
    def build():
        return keras.Sequential([keras.Input((6, 6, 1)), layer_fn(), keras.layers.Flatten(),
                                 L.DenseFlipout(3, activation="softmax", kl_weight=0.01, seed=9)])
    return build, True


_KW = dict(kl_weight=0.01, seed=4)
FAMILIES = {
    "reparameterization": _dense(lambda u, a: L.DenseReparameterization(u, activation=a, **_KW)),
    "reparameterization_scale_mixture": _dense(
        lambda u, a: L.DenseReparameterization(u, activation=a, kernel_prior="scale_mixture", **_KW), False),
    "flipout": _dense(lambda u, a: L.DenseFlipout(u, activation=a, **_KW)),
    "local_reparameterization": _dense(lambda u, a: L.DenseLocalReparameterization(u, activation=a, **_KW)),
    "variational_dropout": _dense(lambda u, a: L.DenseVariationalDropout(u, activation=a, **_KW)),
    "variational_dropout_multiplicative": _dense(
        lambda u, a: L.DenseVariationalDropout(u, activation=a, parameterization="multiplicative", **_KW)),
    "graves": _dense(lambda u, a: L.GravesDense(u, activation=a, **_KW)),
    "conv_reparameterization": _conv(lambda: L.Conv2DReparameterization(2, 3, activation="relu", **_KW)),
    "conv_flipout": _conv(lambda: L.Conv2DFlipout(2, 3, activation="relu", **_KW)),
    "conv_variational_dropout": _conv(lambda: L.Conv2DVariationalDropout(2, 3, activation="relu", **_KW)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_fits_with_several_samples(family):
    build, closed_form = FAMILIES[family]
    net = build()
    rng = np.random.RandomState(1)
    x = rng.randn(32, *net.input_shape[1:]).astype("float32")
    y = rng.randint(0, 3, 32)
    _, kl_loss = _joint_call(net, x[:4])
    if closed_form:  # a deterministic KL is added once per step, never S times
        np.testing.assert_allclose(kl_loss, 0.01 * float(tfbnn.kl_divergence(net)), rtol=1e-5)
    model = tfbnn.MultiSampleModel(net, num_samples=3)
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[tfbnn.KLAnnealing(num_examples=32)])
    assert np.isfinite(history.history["loss"]).all()
    assert np.isfinite(model.evaluate(x, y, verbose=0))


def test_mc_dropout_fits_and_the_wrapper_saves(tmp_path):
    net = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                            L.MCDropout(0.3, seed=2), keras.layers.Dense(3, activation="softmax")])
    model = tfbnn.MultiSampleModel(net, num_samples=5)
    model.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.RandomState(2)
    x, y = rng.randn(32, 6).astype("float32"), rng.randint(0, 3, 32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = str(tmp_path / "multisample.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, tfbnn.MultiSampleModel)
    assert (loaded.num_samples, loaded.average) == (5, "mean")
    for a, b in zip(model.network.get_weights(), loaded.network.get_weights()):
        np.testing.assert_array_equal(a, b)
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(model.predict(x, verbose=0), loaded.predict(x, verbose=0), rtol=1e-5)
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0)


def _bayesian_net():
    return keras.Sequential([keras.Input((3,)), L.DenseFlipout(2, kl_weight=0.1)])


@pytest.mark.parametrize("value", [0, "x", True, 2.5])
def test_bad_num_samples_is_named(value):
    with pytest.raises(ValueError, match="num_samples"):
        tfbnn.MultiSampleModel(_bayesian_net(), num_samples=value)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="average"):
        tfbnn.MultiSampleModel(_bayesian_net(), average="logits_mean")
    with pytest.raises(ValueError, match="model"):
        tfbnn.MultiSampleModel(L.DenseFlipout(2))
    with pytest.raises(ValueError, match="model"):
        tfbnn.MultiSampleModel("mlp")
    with pytest.raises(ValueError, match="stochastic"):
        tfbnn.MultiSampleModel(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    node = keras.Sequential([keras.Input((3,)), L.NodeDense(2, num_components=2, kl_weight=0.1)])
    with pytest.raises(ValueError, match="IBNNModel"):
        tfbnn.MultiSampleModel(node)
    with pytest.raises(ValueError, match="joint"):
        with tfbnn.weight_samples(_bayesian_net(), 2, with_kl=True):
            pass


def test_one_sample_is_the_wrapped_model():
    net = _bayesian_net()
    model = tfbnn.MultiSampleModel(net, num_samples=1)
    x = np.ones((2, 3), "float32")
    with tfbnn.posterior_mean(model):
        np.testing.assert_array_equal(model.predict(x, verbose=0), net.predict(x, verbose=0))
    assert tf.is_tensor(model(x, training=True))


def test_fits_under_xla():
    net, _ = FAMILIES["local_reparameterization"]
    model = tfbnn.MultiSampleModel(net(), num_samples=3)
    model.compile("adam", "sparse_categorical_crossentropy", jit_compile=True)
    rng = np.random.RandomState(3)
    history = model.fit(rng.randn(32, 6).astype("float32"), rng.randint(0, 3, 32), batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
