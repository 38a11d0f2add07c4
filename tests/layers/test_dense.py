import json

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import priors, testing

DENSE = [tfbnn.DenseReparameterization, tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization]


@pytest.mark.parametrize("cls", DENSE)
@pytest.mark.parametrize("prior", ["normal", "scale_mixture"])
def test_dense_basics(cls, prior):
    testing.run_layer_test(
        cls,
        {"units": 3, "activation": "relu", "kernel_prior": prior, "seed": 7},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_losses=1,
        expected_num_seed_generators=1,
        expected_num_trainable_weights=4,
    )


@pytest.mark.parametrize("cls", DENSE)
def test_dense_deterministic_bias_and_rank3_inputs(cls):
    testing.run_layer_test(
        cls,
        {"units": 2, "bias_prior": None, "seed": 1},
        input_shape=(3, 4, 6),
        expected_output_shape=(3, 4, 2),
        expected_num_trainable_weights=3,
        run_save_load=False,
    )


@pytest.mark.parametrize("cls", DENSE)
def test_mean_mode_is_deterministic_and_sample_mode_is_not(cls):
    x = np.random.default_rng(0).normal(size=(8, 5)).astype("float32")
    model = keras.Sequential(
        [keras.Input((5,)), cls(16, activation="relu", seed=1), cls(3, seed=2)]
    )
    for layer in tfbnn.bayesian_layers(model):
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -1.0, "float32"))
    sampled = [model.predict(x, verbose=0) for _ in range(2)]
    assert not np.allclose(sampled[0], sampled[1])
    with tfbnn.posterior_mean(model):
        means = [model.predict(x, verbose=0) for _ in range(2)]
        np.testing.assert_array_equal(means[0], means[1])
        assert all(layer.inference_mode == "mean" for layer in tfbnn.bayesian_layers(model))
    # The posterior mean is the deterministic net with W = mu, b = mu_b.
    h = np.maximum(x @ model.layers[0].kernel_loc.numpy() + model.layers[0].bias_loc.numpy(), 0)
    np.testing.assert_allclose(means[0], h @ model.layers[1].kernel_loc.numpy() + model.layers[1].bias_loc.numpy(), rtol=1e-4, atol=1e-5)
    # Back to sampling after the context, and through set_inference_mode.
    assert not np.allclose(model.predict(x, verbose=0), model.predict(x, verbose=0))
    tfbnn.set_inference_mode(model, "mean")
    np.testing.assert_array_equal(model.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize("cls", DENSE)
def test_seeded_layers_reproduce(cls):
    x = np.ones((4, 5), "float32")
    outs = []
    for _ in range(2):
        layer = cls(3, seed=11, kernel_initializer=keras.initializers.GlorotUniform(seed=5))
        outs.append([layer(x).numpy() for _ in range(3)])
    np.testing.assert_array_equal(np.stack(outs[0]), np.stack(outs[1]))
    assert not np.allclose(outs[0][0], outs[0][1])


def test_flipout_and_local_reparameterization_samples_differ_per_example():
    x = np.ones((64, 5), "float32")  # identical rows
    for cls in (tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization):
        layer = cls(4, seed=3, kernel_scale_initializer=keras.initializers.Constant(0.0))
        y = layer(x).numpy()
        assert np.std(y, axis=0).min() > 0.1
    layer = tfbnn.DenseReparameterization(4, seed=3)
    y = layer(x).numpy()
    np.testing.assert_allclose(y, np.broadcast_to(y[:1], y.shape))  # one weight sample per batch


@pytest.mark.parametrize("cls", DENSE)
def test_extreme_initializations_stay_finite(cls):
    x = np.random.default_rng(0).normal(size=(16, 5)).astype("float32") * 100
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    for rho in (-200.0, 50.0):
        model = keras.Sequential(
            [
                keras.Input((5,)),
                cls(8, activation="relu", kl_weight=1e-3, seed=1, kernel_scale_initializer=keras.initializers.Constant(rho)),
                cls(2, kernel_prior="scale_mixture", kl_weight=1e-3, seed=2, kernel_scale_initializer=keras.initializers.Constant(rho)),
            ]
        )
        model.compile("adam", "mse")
        history = model.fit(x, y, epochs=2, batch_size=8, verbose=0)
        assert np.all(np.isfinite(history.history["loss"])), (rho, history.history["loss"])
        assert all(np.all(np.isfinite(w.numpy())) for w in model.weights)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"units": u}, f"units={u}") for u in (0, -3, 2.5)] + [
        ({"units": 3, "kernel_prior": "cauchy"}, "prior='cauchy'"),
        ({"units": 3, "kernel_prior": priors.Normal}, "prior="),
        ({"units": 3, "kl_weight": -1.0}, "kl_weight=-1.0"),
        ({"units": 3, "inference_mode": "median"}, "inference_mode='median'"),
        ({"units": 3, "seed": "x"}, "seed='x'"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tfbnn.DenseFlipout(**kwargs)


@pytest.mark.parametrize("cls", DENSE + [tfbnn.GravesDense, tfbnn.DenseVariationalDropout, tfbnn.NodeDense])
def test_numpy_scalars_are_accepted_as_keras_accepts_them(cls):
    layer = cls(np.int64(4), seed=np.int32(3), kl_weight=np.float32(0.5))
    assert layer.units == 4 and layer.seed == 3
    assert type(layer.units) is int and type(layer.seed) is int
    json.dumps(layer.get_config())  # configs stay JSON-serializable
    assert layer(np.ones((2, 5), "float32")).shape == (2, 4)
    for bad in (True, np.float64(4.0)):
        with pytest.raises(ValueError, match="units="):
            cls(bad)
    with pytest.raises(ValueError, match="seed=True"):
        cls(4, seed=True)
    with pytest.raises(ValueError, match="seed=18446744073709551616"):
        cls(4, seed=2**64)  # beyond the int64 seed state


@pytest.mark.parametrize("cls", DENSE)
def test_wrong_input_rank(cls):
    layer = cls(3, kl_weight=0.1)
    with pytest.raises(ValueError, match=r"rank >= 2.*input_shape=\(5,\)"):
        layer(np.ones((5,), "float32"))
    layer(np.ones((2, 5), "float32"))  # once built, Keras' InputSpec guards the rank
    with pytest.raises(ValueError, match="min_ndim=2, found ndim=1"):
        layer(np.ones((5,), "float32"))


def test_training_without_num_examples_fails_clearly():
    model = keras.Sequential([keras.Input((3,)), tfbnn.DenseFlipout(2)])
    model.compile("adam", "mse")
    with pytest.raises(ValueError, match="without a KL scale.*KLAnnealing"):
        model.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)
    # Inference without N is fine, and contributes no KL.
    model(np.ones((4, 3), "float32"))
    assert float(model.losses[0]) == 0.0


def test_model_helpers_name_their_bad_arguments():
    with pytest.raises(ValueError, match="Expected a Keras model.*model='str'"):
        tfbnn.set_kl_weight("str", 0.1)
    with pytest.raises(ValueError, match="Expected a Keras model.*model=None"):
        tfbnn.set_inference_mode(None, "mean")
    no_bayesian_layer = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    for bad in ("0.1", -1.0, None):  # checked even when no layer would receive it
        with pytest.raises(ValueError, match=f"Expected `value`.*value={bad!r}"):
            tfbnn.set_kl_weight(no_bayesian_layer, bad)
    with pytest.raises(ValueError, match="mode='median'"):
        tfbnn.set_inference_mode(no_bayesian_layer, "median")


def test_set_kl_weight_reaches_nested_models():
    inner = keras.Sequential([keras.Input((3,)), tfbnn.DenseFlipout(4), keras.layers.ReLU()])
    outer = keras.Sequential([keras.Input((3,)), inner, tfbnn.DenseLocalReparameterization(2)])
    assert len(tfbnn.bayesian_layers(outer)) == 2
    assert tfbnn.set_kl_weight(outer, 0.125) == 2
    assert all(float(layer.kl_weight.numpy()) == 0.125 for layer in tfbnn.bayesian_layers(outer))
    assert all(layer.get_config()["kl_weight"] == 0.125 for layer in tfbnn.bayesian_layers(outer))
    with pytest.raises(ValueError, match="value=nan"):
        tfbnn.set_kl_weight(outer, float("nan"))


@pytest.mark.parametrize("cls", DENSE)
@pytest.mark.parametrize("joint", [True, False])
def test_weight_samples_protocol_gives_distinct_samples(cls, joint):
    t, b = 4, 3
    x = np.random.default_rng(0).normal(size=(b, 5)).astype("float32")
    model = keras.Sequential([keras.Input((5,)), cls(6, activation="relu", seed=1), cls(2, seed=2)])
    for layer in model.layers:
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -1.0, "float32"))
    tiled = np.tile(x, (t, 1))
    with tfbnn.utils.weight_samples(model, t, joint=joint):
        y = model(tiled).numpy().reshape(t, b, 2)
        assert all(float(loss) == 0.0 for loss in model.losses) or not model.losses
    for i in range(t):
        for j in range(i + 1, t):
            assert not np.allclose(y[i], y[j]), (i, j)
    # With a (near) zero posterior scale every sample collapses to the mean net.
    for layer in model.layers:
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -30.0, "float32"))
        layer.bias_rho.assign(np.full(layer.bias_rho.shape, -30.0, "float32"))
    with tfbnn.posterior_mean(model):
        mean = model(x).numpy()
    with tfbnn.utils.weight_samples(model, t, joint=joint):
        y = model(tiled).numpy().reshape(t, b, 2)
    np.testing.assert_allclose(y, np.broadcast_to(mean, y.shape), atol=1e-4)
    assert all(layer.weight_samples[0] == 1 for layer in model.layers)
    with pytest.raises(ValueError, match="num_samples=0"):
        with tfbnn.utils.weight_samples(model, 0):
            pass


def test_joint_samples_share_one_weight_sample_per_block():
    t = 3
    x = np.ones((4, 5), "float32")  # identical rows: a shared weight sample gives identical outputs
    layer = tfbnn.DenseReparameterization(2, seed=1, kernel_scale_initializer=keras.initializers.Constant(0.0))
    model = keras.Sequential([keras.Input((5,)), layer])
    with tfbnn.utils.weight_samples(model, t, joint=True):
        y = model(np.tile(x, (t, 1))).numpy().reshape(t, 4, 2)
    np.testing.assert_allclose(y, np.broadcast_to(y[:, :1], y.shape), rtol=1e-6)
    with tfbnn.utils.weight_samples(model, t, joint=False):
        y = model(np.tile(x, (t, 1))).numpy().reshape(t, 4, 2)
    assert np.std(y, axis=1).min() > 0.1  # per-row samples


def test_per_row_samples_have_the_weight_sampling_distribution():
    """Per-row (local reparameterization) outputs match the moments of explicit weight samples."""
    x = np.random.default_rng(0).normal(size=(1, 5)).astype("float32")
    layer = tfbnn.DenseReparameterization(3, seed=1, kernel_scale_initializer=keras.initializers.Constant(-1.0),
                                          bias_scale_initializer=keras.initializers.Constant(-1.0))
    model = keras.Sequential([keras.Input((5,)), layer])
    t = 20000
    with tfbnn.utils.weight_samples(model, t, joint=False):
        per_row = model(np.tile(x, (t, 1))).numpy()
    with tfbnn.utils.weight_samples(model, t, joint=True):
        joint = model(np.tile(x, (t, 1))).numpy()
    np.testing.assert_allclose(per_row.mean(0), joint.mean(0), atol=0.05)
    np.testing.assert_allclose(per_row.std(0), joint.std(0), rtol=0.05)
    sigma_k, sigma_b = layer.kernel_scale().numpy(), layer.bias_scale().numpy()
    np.testing.assert_allclose(per_row.std(0), np.sqrt((x**2) @ sigma_k**2 + sigma_b**2)[0], rtol=0.03)


@pytest.mark.parametrize(
    "cls", [tfbnn.DenseReparameterization, tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization]
)
def test_monte_carlo_moments_of_a_tiled_batch_are_computed_once(cls):
    """Inside weight_samples(T) a batch tiled T times gets its mean/variance matmuls on one block only,
    with the same outputs (same seed) as computing every row; other inputs take the full path."""
    num_samples, batch = 5, 3
    rows_seen = []

    class Recording(cls):  # a subclass, not a patch of the shared class: nothing to undo
        def preactivation_moments(self, inputs, scale=None, bias_scale=None):
            rows_seen.append(int(inputs.shape[0]))
            return super().preactivation_moments(inputs, scale, bias_scale)

    layer = Recording(4, seed=7)
    x = np.random.default_rng(0).normal(size=(batch, 6)).astype("float32")
    layer(x)
    rows_seen.clear()  # the building call's

    def run(inputs, share):
        state = layer.seed_generator.state.numpy()
        layer.share_tiled_moments = share  # this test's own layer
        with tfbnn.weight_samples(layer, num_samples):
            out = np.asarray(layer(inputs))
        layer.seed_generator.state.assign(state)
        return out

    tiled = np.tile(x, (num_samples, 1))
    shared, full = run(tiled, True), run(tiled, False)
    assert rows_seen == [batch, num_samples * batch]
    np.testing.assert_allclose(shared, full, rtol=1e-5, atol=1e-6)
    assert not np.allclose(shared[:batch], shared[batch:2 * batch])  # the blocks still differ by their noise

    rows_seen.clear()
    distinct = np.random.default_rng(1).normal(size=(num_samples * batch, 6)).astype("float32")
    np.testing.assert_allclose(run(distinct, True), run(distinct, False), rtol=1e-5, atol=1e-6)
    assert rows_seen == [num_samples * batch, num_samples * batch]
