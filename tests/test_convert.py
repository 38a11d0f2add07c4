"""Conversion of trained deterministic models: same predictions at ~0 scale, weights carried
over, scales as asked, the converted model trains, clear errors."""

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import convert

RNG = np.random.default_rng(0)  # restarted at every test (tests/conftest.py)
X_IMG = RNG.normal(size=(12, 8, 8, 1)).astype("float32")


def _functional_cnn():
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.MaxPooling2D(name="pool")(h)
    h = keras.layers.Flatten(name="flat")(h)
    inner = keras.Sequential([keras.Input((36,)), keras.layers.Dense(16, activation="relu", name="fc")], name="inner")
    h = keras.layers.Dropout(0.3, name="drop")(inner(h))
    outputs = keras.layers.Dense(3, activation="softmax", name="out")(h)
    model = keras.Model(inputs, outputs, name="cnn")
    bn = model.get_layer("bn")  # "trained" statistics, so that copying them matters
    bn.moving_mean.assign(np.random.default_rng(1).normal(size=4).astype("float32"))
    bn.moving_variance.assign(np.random.default_rng(2).uniform(0.5, 2.0, size=4).astype("float32"))
    return model


def _sequential_mlp():
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="tanh", name="h1"),
        keras.layers.LayerNormalization(name="ln"),
        keras.layers.Dense(2, name="out"),
    ], name="mlp")
    return model


@pytest.mark.parametrize("method", ["vd", "vd_multiplicative"])
def test_vd_conversion_keeps_predictions_of_functional_cnn(method):
    det = _functional_cnn()
    expected = det(X_IMG).numpy()
    bnn = convert.to_bayesian(det, method=method, init_scale=1e-7, seed=1, layer_kwargs={"min_log_alpha": -40.0})
    kinds = {l.name: type(l).__name__ for l in bnn._flatten_layers(include_self=False, recursive=True)}
    assert kinds["conv"] == "Conv2DVariationalDropout" and kinds["fc"] == kinds["out"] == "DenseVariationalDropout"
    assert kinds["bn"] == "BatchNormalization" and kinds["drop"] == "Dropout"
    with tfbnn.posterior_mean(bnn):
        np.testing.assert_allclose(bnn(X_IMG).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bnn(X_IMG).numpy(), expected, atol=1e-4)  # sampling, scales ~0
    np.testing.assert_array_equal(bnn.get_layer("bn").moving_mean.numpy(), det.get_layer("bn").moving_mean.numpy())
    assert bnn.name == f"cnn_{method}"


@pytest.mark.parametrize("method", ["graves", "reparameterization"])
def test_gaussian_conversion_of_a_cnn_keeps_predictions(method):
    det = _functional_cnn()
    expected = det(X_IMG).numpy()
    bnn = convert.to_bayesian(det, method=method, init_scale=1e-7, seed=1)
    conv = bnn.get_layer("conv")
    assert type(conv).__name__ == ("Conv2DReparameterization" if method == "reparameterization" else "Conv2DFlipout")
    if method == "graves":
        # Graves' layer with the fixed N(0, 1) prior by default; his adaptive prior on request.
        assert conv.parameterization == "log_variance" and conv.kernel_prior == tfbnn.priors.Normal(0.0, 1.0)
        assert bnn.get_layer("out").kernel_prior == tfbnn.priors.Normal(0.0, 1.0)
        adaptive = convert.to_bayesian(det, method="graves", prior="adaptive", seed=1)
        assert adaptive.get_layer("conv").kernel_prior == adaptive.get_layer("out").kernel_prior == tfbnn.priors.Graves()
    with tfbnn.posterior_mean(bnn):
        np.testing.assert_allclose(bnn(X_IMG).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bnn(X_IMG).numpy(), expected, atol=1e-4)


@pytest.mark.parametrize("method", ["graves", "flipout", "reparameterization", "local_reparameterization"])
def test_gaussian_conversion_keeps_predictions(method):
    det = _sequential_mlp()
    x = RNG.normal(size=(6, 5)).astype("float32")
    expected = det(x).numpy()
    bnn = convert.to_bayesian(det, method=method, init_scale=1e-7, seed=1)
    with tfbnn.posterior_mean(bnn):
        np.testing.assert_allclose(bnn(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bnn(x).numpy(), expected, atol=1e-4)
    np.testing.assert_allclose(bnn.get_layer("h1").kernel_loc.numpy(), det.get_layer("h1").kernel.numpy())
    # The softplus parameterization floors sigma at 1e-6; log variance reaches 1e-7.
    floor = 1e-7 if method == "graves" else 1e-6
    np.testing.assert_allclose(bnn.get_layer("h1").kernel_scale().numpy(), floor, rtol=0.02)


def test_initial_scales_fixed_and_moped():
    det = _sequential_mlp()
    w = det.get_layer("h1").kernel.numpy()
    for method in ("vd", "graves", "flipout"):
        fixed = convert.to_bayesian(det, method=method, init_scale=0.01)
        expected = 0.01
        if method == "vd":  # log alpha in [min, max] ([-8, 8]): sigma in [e^(min/2) |w|, e^(max/2) |w|]
            layer = fixed.get_layer("h1")
            expected = np.clip(0.01, np.exp(layer.min_log_alpha / 2) * np.abs(w),
                               np.exp(layer.max_log_alpha / 2) * np.abs(w))
        np.testing.assert_allclose(fixed.get_layer("h1").kernel_scale().numpy(), expected, rtol=1e-2)
        moped = convert.to_bayesian(det, method=method, init_scale="moped", moped_delta=0.1)
        np.testing.assert_allclose(moped.get_layer("h1").kernel_scale().numpy(), 0.1 * np.abs(w), rtol=1e-3, atol=2e-6)
    vd = convert.to_bayesian(det, method="vd", init_scale="moped", moped_delta=0.1)
    np.testing.assert_allclose(vd.get_layer("h1").log_alpha().numpy(), 2 * np.log(0.1), atol=1e-3)  # alpha = delta^2


def test_layer_selection_and_kl_weight():
    det = _sequential_mlp()
    bnn = convert.to_bayesian(det, method="vd", exclude=["out"], num_examples=200)
    assert type(bnn.get_layer("out")) is keras.layers.Dense
    assert float(bnn.get_layer("h1").kl_weight.numpy()) == pytest.approx(1 / 200)
    only = convert.to_bayesian(det, method="graves", layers=["out"])
    assert type(only.get_layer("h1")) is keras.layers.Dense
    assert type(only.get_layer("out")) is tfbnn.layers.GravesDense
    np.testing.assert_array_equal(only.get_layer("h1").kernel.numpy(), det.get_layer("h1").kernel.numpy())


def test_converted_model_trains():
    keras.utils.set_random_seed(0)
    ds = tfbnn.datasets.load("moons", num_examples=400, noise=0.1, seed=0)
    det = keras.Sequential([keras.Input((2,)), keras.layers.Dense(32, activation="relu", name="h"),
                            keras.layers.Dense(2, activation="softmax", name="out")])
    det.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    det.fit(ds.x_train, ds.y_train, epochs=8, batch_size=64, verbose=0)
    det_accuracy = np.mean(det(ds.x_test).numpy().argmax(-1) == ds.y_test)
    for method in ("vd", "graves"):
        bnn = convert.to_bayesian(det, method=method, init_scale="moped", moped_delta=0.05, seed=2)
        bnn.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
        before = bnn.get_layer("h").kernel_loc.numpy().copy()
        history = bnn.fit(ds.x_train, ds.y_train, epochs=3, batch_size=64, verbose=0,
                          callbacks=[tfbnn.KLAnnealing(ds.num_examples, "linear")])
        assert np.all(np.isfinite(history.history["loss"]))
        assert not np.allclose(before, bnn.get_layer("h").kernel_loc.numpy())
        with tfbnn.posterior_mean(bnn):
            accuracy = np.mean(bnn(ds.x_test).numpy().argmax(-1) == ds.y_test)
        assert accuracy >= det_accuracy - 0.05, (method, accuracy, det_accuracy)


def test_bad_input_is_rejected_clearly():
    det = _sequential_mlp()
    with pytest.raises(ValueError, match="method='bbb'"):
        convert.to_bayesian(det, method="bbb")
    no_dense = keras.Sequential([keras.Input((4,)), keras.layers.LayerNormalization(), keras.layers.ReLU()],
                                name="plain")
    with pytest.raises(ValueError, match="at least one keras.layers.Dense or keras.layers.Conv2D.*plain"):
        convert.to_bayesian(no_dense)
    with pytest.raises(ValueError, match="init_scale=-0.1"):
        convert.to_bayesian(det, init_scale=-0.1)
    with pytest.raises(ValueError, match="init_scale='wide'"):
        convert.to_bayesian(det, init_scale="wide")
    with pytest.raises(ValueError, match="moped_delta=0"):
        convert.to_bayesian(det, init_scale="moped", moped_delta=0)
    with pytest.raises(ValueError, match=r"exclude=\['h9'\]"):
        convert.to_bayesian(det, exclude=["h9"])
    with pytest.raises(ValueError, match="num_examples=0"):
        convert.to_bayesian(det, num_examples=0)
    with pytest.raises(ValueError, match="Conv2D layer 'conv'.*exclude=\\['conv'\\]"):
        convert.to_bayesian(_functional_cnn(), method="local_reparameterization")

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(2)

        def call(self, x):
            return self.d(x)

    sub = Sub()
    sub(np.ones((1, 3), "float32"))
    with pytest.raises(ValueError, match="Sequential or functional"):
        convert.to_bayesian(sub)


class _Unclonable(keras.layers.Layer):
    """Like KerasHub 0.32's ViTPatchingAndEmbedding: its config holds a key its constructor rejects."""

    def __init__(self, scale=2.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def call(self, x):
        return x * self.scale

    def get_config(self):
        return {**super().get_config(), "scale": self.scale, "derived": 2 * self.scale}


def _nested_with_unclonable():
    inner_in = keras.Input((3,))
    h = keras.layers.Dense(4, activation="tanh", name="hidden")(_Unclonable(name="odd")(inner_in))
    backbone = keras.Model(inner_in, keras.layers.LayerNormalization(name="ln")(h), name="backbone")
    inp = keras.Input((3,))
    return keras.Model(inp, keras.layers.Dense(2, name="head")(backbone(inp)), name="task")


def test_by_policy_rebuilds_only_the_graphs_holding_a_converted_layer_and_shares_the_rest():
    model = _nested_with_unclonable()
    x = RNG.normal(size=(5, 3)).astype("float32")
    with pytest.raises(TypeError, match="derived"):  # what rebuilding the backbone from its configs meets
        _Unclonable.from_config(model.get_layer("backbone").get_layer("odd").get_config())
    head_only = convert.by_policy(model, {"head": "flipout"}, seed=0)
    assert head_only.get_layer("backbone") is model.get_layer("backbone")  # reused, not rebuilt
    assert type(head_only.get_layer("head")) is tfbnn.layers.DenseFlipout
    inner = convert.by_policy(model, {"backbone/hidden": "reparameterization"}, seed=0)
    backbone = inner.get_layer("backbone")
    assert backbone is not model.get_layer("backbone")  # holds a converted layer: rebuilt
    assert type(backbone.get_layer("hidden")) is tfbnn.layers.DenseReparameterization
    for path in ("odd", "ln"):  # its other layers, and the unconverted head, are the original objects
        assert backbone.get_layer(path) is model.get_layer("backbone").get_layer(path)
    assert inner.get_layer("head") is model.get_layer("head")
    assert inner.get_layer("head").kernel is model.get_layer("head").kernel  # the weights are shared
    for bnn in (head_only, inner):
        with tfbnn.posterior_mean(bnn):
            np.testing.assert_allclose(bnn(x).numpy(), model(x).numpy(), atol=1e-6)
    old = model.get_layer("head").kernel.numpy()
    model.get_layer("head").kernel.assign(old + 1.0)  # a change to the original shows in the shared copy
    with tfbnn.posterior_mean(inner):
        np.testing.assert_allclose(inner(x).numpy(), model(x).numpy(), atol=1e-6)
    model.get_layer("head").kernel.assign(old)
