"""Variational dropout layers: KL approximations against the published formulas and the
exact KL, the two parameterizations against each other, sampling, clipping, errors."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import integrate

import tfbnn
from tfbnn import kl as kl_lib
from tfbnn import testing

VD = tfbnn.layers.DenseVariationalDropout
CONV = tfbnn.layers.Conv2DVariationalDropout
ALPHAS = [1e-3, 0.01, 0.1, 0.5, 1.0, 3.0, 20.0, 400.0]


def _molchanov_by_hand(alpha):
    k1, k2, k3 = 0.63576, 1.87320, 1.48695
    neg_kl = k1 / (1 + np.exp(-(k2 + k3 * np.log(alpha)))) - 0.5 * np.log(1 + 1 / alpha) - k1
    return -neg_kl


def _kingma_by_hand(alpha):
    c1, c2, c3 = 1.16145124, -1.50204118, 0.58629921
    return -(-0.63576 + 0.5 * np.log(alpha) + c1 * alpha + c2 * alpha**2 + c3 * alpha**3)


def _exact_kl(alpha):
    """KL(N(theta, alpha theta^2) || log-uniform) by quadrature, with the constant making it 0 at alpha -> inf.

    -KL = 0.5 log alpha - E[log |1 + sqrt(alpha) eps|] - (gamma + log 2) / 2.
    """
    density = lambda e: np.log(abs(1 + math.sqrt(alpha) * e)) * math.exp(-e * e / 2) / math.sqrt(2 * math.pi)
    expectation = integrate.quad(density, -40, 40, points=[-1 / math.sqrt(alpha)], limit=500)[0]
    return -(0.5 * math.log(alpha) - expectation - (np.euler_gamma + math.log(2)) / 2)


# -- harness ---------------------------------------------------------------------------
@pytest.mark.parametrize("parameterization", ["additive", "multiplicative"])
def test_dense_basics(parameterization):
    testing.run_layer_test(
        VD,
        {"units": 3, "activation": "relu", "parameterization": parameterization, "seed": 7},
        input_shape=(4, 5),
        expected_output_shape=(4, 3),
        expected_num_trainable_weights=3,
    )


@pytest.mark.parametrize("parameterization", ["molchanov", "kingma"])
def test_conv_basics(parameterization):
    testing.run_layer_test(
        CONV,
        {"filters": 3, "kernel_size": 3, "strides": 2, "padding": "same", "parameterization": parameterization,
         "seed": 7},
        input_shape=(2, 7, 7, 2),
        expected_output_shape=(2, 4, 4, 3),
        expected_num_trainable_weights=3,
    )


def test_aliases_resolve_and_round_trip():
    assert VD(2, parameterization="molchanov").get_config()["parameterization"] == "additive"
    assert VD(2, parameterization="kingma").get_config()["parameterization"] == "multiplicative"
    assert VD(2, parameterization="kingma").max_log_alpha == 0.0
    assert VD(2).max_log_alpha == 8.0 and VD(2).min_log_alpha == -8.0


# -- KL approximations ------------------------------------------------------------------
def test_molchanov_kl_matches_published_formula_and_exact_kl():
    alphas = np.array(ALPHAS)
    got = kl_lib.molchanov_kl(tf.constant(np.log(alphas), tf.float64)).numpy()
    np.testing.assert_allclose(got, _molchanov_by_hand(alphas), rtol=1e-10, atol=1e-12)
    exact = np.array([_exact_kl(a) for a in alphas])
    np.testing.assert_allclose(got, exact, atol=0.01)  # the paper's fit, at every alpha
    # Limits: KL -> 0 as alpha -> inf; -KL ~ 0.5 log alpha - k1 as alpha -> 0.
    assert abs(float(kl_lib.molchanov_kl(tf.constant(30.0)))) < 1e-6
    np.testing.assert_allclose(float(kl_lib.molchanov_kl(tf.constant(-20.0))), 10.0 + 0.63576, rtol=1e-6)


def test_kingma_kl_matches_published_formula_and_exact_kl_for_alpha_up_to_one():
    alphas = np.array([a for a in ALPHAS if a <= 1.0])
    got = kl_lib.kingma_kl(tf.constant(np.log(alphas), tf.float64)).numpy()
    np.testing.assert_allclose(got, _kingma_by_hand(alphas), rtol=1e-10, atol=1e-12)
    exact = np.array([_exact_kl(a) for a in alphas])
    np.testing.assert_allclose(got, exact, atol=0.04)
    # Both approximations describe the same KL where both hold (alpha <= 1).
    np.testing.assert_allclose(got, kl_lib.molchanov_kl(tf.constant(np.log(alphas), tf.float64)).numpy(), atol=0.045)


def test_layer_kl_is_the_sum_of_the_approximation_and_is_added_scaled():
    layer = VD(4, kl_weight=0.5, seed=1)
    layer.build((None, 3))
    theta = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    log_alpha = np.linspace(-6, 6, 12).reshape(3, 4).astype("float32")
    layer.kernel_loc.assign(theta)
    layer.kernel_log_sigma2.assign(log_alpha + np.log(theta**2 + 1e-8))
    np.testing.assert_allclose(layer.log_alpha().numpy(), log_alpha, atol=1e-4)
    expected = _molchanov_by_hand(np.exp(log_alpha.astype(np.float64))).sum()
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-4)
    layer(np.ones((2, 3), "float32"))
    np.testing.assert_allclose(float(layer.losses[0]), 0.5 * expected, rtol=1e-4)


# -- the two parameterizations -------------------------------------------------------------
def test_additive_and_multiplicative_forms_agree_on_alpha_outputs_and_kl():
    rng = np.random.default_rng(1)
    theta = rng.normal(size=(5, 6)).astype("float32")
    log_alpha = rng.uniform(-6, -0.1, size=(5, 6)).astype("float32")  # alpha <= 1: both forms apply
    add = VD(6, parameterization="additive", seed=3)
    mul = VD(6, parameterization="multiplicative", seed=3)
    for layer in (add, mul):
        layer.build((None, 5))
        layer.kernel_loc.assign(theta)
    add.kernel_log_sigma2.assign(log_alpha + np.log(theta.astype(np.float64) ** 2 + 1e-8).astype("float32"))
    mul.kernel_log_alpha.assign(log_alpha)
    np.testing.assert_allclose(add.log_alpha().numpy(), mul.log_alpha().numpy(), atol=1e-4)
    np.testing.assert_allclose(add.kernel_variance().numpy(), mul.kernel_variance().numpy(), rtol=1e-3)
    x = rng.normal(size=(8, 5)).astype("float32")
    # Same seed, same pre-activation distribution: the same sampled outputs.
    np.testing.assert_allclose(add(x).numpy(), mul(x).numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(float(add.kl_divergence()), float(mul.kl_divergence()), atol=0.045 * theta.size)


def test_multiplicative_form_keeps_alpha_at_most_one():
    layer = VD(3, parameterization="multiplicative")
    layer.build((None, 2))
    layer.kernel_log_alpha.assign(np.full((2, 3), 5.0, "float32"))
    assert float(tf.reduce_max(layer.log_alpha())) == 0.0
    with pytest.raises(ValueError, match="max_log_alpha=1.0"):
        VD(3, parameterization="multiplicative", max_log_alpha=1.0)


# -- sampling --------------------------------------------------------------------------------
def test_local_reparameterization_moments_and_mean_mode():
    rng = np.random.default_rng(2)
    layer = VD(3, seed=5)
    layer.build((None, 4))
    theta = rng.normal(size=(4, 3)).astype("float32")
    layer.kernel_loc.assign(theta)
    layer.kernel_log_sigma2.assign(np.full((4, 3), -1.0, "float32"))
    layer.bias_loc.assign(np.array([0.5, -1.0, 2.0], "float32"))
    x = rng.normal(size=(1, 4)).astype("float32")
    t = 20000
    samples = layer(np.tile(x, (t, 1))).numpy()
    mean = x @ theta + layer.bias_loc.numpy()
    std = np.sqrt((x**2) @ np.full((4, 3), np.exp(-1.0)))
    np.testing.assert_allclose(samples.mean(0), mean[0], atol=4 * std.max() / math.sqrt(t))
    np.testing.assert_allclose(samples.std(0), std[0], rtol=0.03)
    layer.inference_mode = "mean"
    np.testing.assert_allclose(layer(x).numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(layer(x).numpy(), layer(x).numpy())


def test_conv_mean_mode_is_the_keras_convolution():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 9, 9, 3)).astype("float32")
    for padding, strides, dilation in (("valid", 2, 1), ("same", 1, 2)):
        ref = keras.layers.Conv2D(4, 3, strides=strides, padding=padding, dilation_rate=dilation)
        y_ref = ref(x).numpy()
        layer = CONV(4, 3, strides=strides, padding=padding, dilation_rate=dilation, inference_mode="mean")
        layer.build(x.shape)
        layer.kernel_loc.assign(ref.kernel.numpy())
        layer.bias_loc.assign(rng.normal(size=(4,)).astype("float32"))
        y = layer(x).numpy()
        np.testing.assert_allclose(y, y_ref + layer.bias_loc.numpy(), rtol=1e-4, atol=1e-5)
        assert tuple(layer.compute_output_shape(x.shape)) == y.shape


def test_seeded_layers_reproduce_and_samples_vary():
    x = np.ones((4, 5), "float32")
    outs = []
    for _ in range(2):
        layer = VD(3, seed=11, kernel_initializer=keras.initializers.GlorotUniform(seed=5),
                   kernel_scale_initializer=keras.initializers.Constant(-2.0))
        outs.append(np.stack([layer(x).numpy() for _ in range(3)]))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.allclose(outs[0][0], outs[0][1])


@pytest.mark.parametrize("joint", [False, True])
def test_weight_samples_protocol(joint):
    t, b = 4, 3
    x = np.ones((b, 5), "float32")  # identical rows
    noisy = keras.initializers.Constant(0.0)
    model = keras.Sequential([keras.Input((5,)), VD(2, seed=1, kernel_scale_initializer=noisy)])
    with tfbnn.weight_samples(model, t, joint=joint):
        y = model(np.tile(x, (t, 1))).numpy().reshape(t, b, 2)
        assert all(float(loss) == 0.0 for loss in model.losses) or not model.losses
    for i in range(t):
        for j in range(i + 1, t):
            assert not np.allclose(y[i], y[j])
    if joint:  # one weight sample per block of rows
        np.testing.assert_allclose(y, np.broadcast_to(y[:, :1], y.shape), rtol=1e-6)
    else:
        assert np.std(y, axis=1).min() > 0.05


def test_weight_samples_protocol_with_conv_is_per_element():
    noisy = keras.initializers.Constant(0.0)
    model = keras.Sequential([keras.Input((5, 5, 1)), CONV(2, 3, seed=1, kernel_scale_initializer=noisy)])
    x = np.ones((2, 5, 5, 1), "float32")
    with tfbnn.weight_samples(model, 3, joint=True):
        y = model(np.tile(x, (3, 1, 1, 1))).numpy()
    assert y.shape == (6, 3, 3, 2) and np.std(y, axis=0).min() > 0.05


# -- numerics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("parameterization", ["additive", "multiplicative"])
def test_extreme_log_alpha_stays_finite(parameterization):
    x = np.random.default_rng(0).normal(size=(16, 5)).astype("float32") * 100
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    key = "kernel_scale_initializer"
    model = keras.Sequential([  # log alpha far below and far above the clip, and theta = 0
        keras.Input((5,)),
        VD(8, activation="relu", kl_weight=1e-3, seed=1, parameterization=parameterization,
           **{key: keras.initializers.Constant(-1e4)}),
        VD(2, kl_weight=1e-3, seed=2, parameterization=parameterization, kernel_initializer="zeros",
           **{key: keras.initializers.Constant(1e4)}),
    ])
    model.compile("adam", "mse")
    history = model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    assert np.all(np.isfinite(history.history["loss"])), history.history["loss"]
    assert all(np.all(np.isfinite(w.numpy())) for w in model.weights)
    for layer in model.layers:
        la = layer.log_alpha().numpy()
        assert la.min() >= layer.min_log_alpha and la.max() <= layer.max_log_alpha
        assert np.isfinite(float(layer.kl_divergence()))


def test_zero_theta_contributes_nothing():
    layer = VD(3, seed=1, kernel_scale_initializer=keras.initializers.Constant(5.0))
    layer.build((None, 4))
    layer.kernel_loc.assign(np.zeros((4, 3), "float32"))
    out = layer(np.random.default_rng(0).normal(size=(5, 4)).astype("float32")).numpy()
    np.testing.assert_allclose(out, 0.0, atol=1e-5)


# -- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: VD(0), "units=0"),
        (lambda: VD(2, parameterization="gaussian"), "parameterization='gaussian'"),
        (lambda: VD(2, min_log_alpha=3.0, max_log_alpha=1.0), "min_log_alpha=3.0, max_log_alpha=1.0"),
        (lambda: VD(2, min_log_alpha=float("nan")), "min_log_alpha=nan"),
        (lambda: VD(2, kl_weight=-1.0), "kl_weight=-1.0"),
        (lambda: VD(2, inference_mode="median"), "inference_mode='median'"),
        (lambda: CONV(0, 3), "filters=0"),
        (lambda: CONV(2, (3, 0)), r"kernel_size=\(3, 0\)"),
        (lambda: CONV(2, 3, padding="causal"), "padding='causal'"),
        (lambda: CONV(2, 3, data_format="nhwc"), "data_format='nhwc'"),
    ],
)
def test_bad_arguments(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_wrong_input_rank_and_missing_kl_scale():
    with pytest.raises(ValueError, match=r"rank >= 2.*input_shape=\(5,\)"):
        VD(3, kl_weight=0.1)(np.ones((5,), "float32"))
    with pytest.raises(ValueError, match=r"rank 4.*input_shape=\(2, 5, 5\)"):
        CONV(3, 3, kl_weight=0.1)(np.ones((2, 5, 5), "float32"))
    model = keras.Sequential([keras.Input((3,)), VD(2)])
    model.compile("adam", "mse")
    with pytest.raises(ValueError, match="without a KL scale"):
        model.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)


CONV1D = tfbnn.layers.Conv1DVariationalDropout


@pytest.mark.parametrize("parameterization", ["additive", "multiplicative"])
@pytest.mark.parametrize("cls, rank", [(CONV1D, 1), (CONV, 2)])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_conv_basics_both_data_formats(cls, rank, data_format, parameterization):
    spatial_in, spatial_out = (6,) * rank, (3,) * rank
    shape = (2, *spatial_in, 2) if data_format == "channels_last" else (2, 2, *spatial_in)
    out = (2, *spatial_out, 3) if data_format == "channels_last" else (2, 3, *spatial_out)
    testing.run_layer_test(cls, {"filters": 3, "kernel_size": 2, "strides": 2, "data_format": data_format,
                                 "parameterization": parameterization, "seed": 1},
                           input_shape=shape, expected_output_shape=out, expected_num_trainable_weights=3)


@pytest.mark.parametrize("cls, rank", [(CONV1D, 1), (CONV, 2)])
def test_conv_channels_first_equals_channels_last_on_transposed_inputs(cls, rank):
    """Posterior mean and KL agree exactly; the sampled pre-activations have the same mean and variance."""
    x = np.random.default_rng(0).normal(size=(2,) + (7,) * rank + (2,)).astype("float32")
    results = {}
    for data_format, inputs in testing.data_formats(x):
        layer = cls(3, 3, padding="same", data_format=data_format, seed=2, inference_mode="mean",
                    kernel_initializer=keras.initializers.GlorotUniform(seed=3),
                    bias_initializer=keras.initializers.RandomNormal(seed=4),
                    kernel_scale_initializer=keras.initializers.Constant(-2.0))
        y = layer(inputs).numpy()
        variance = layer.forward(tf.square(inputs), layer.kernel_variance()).numpy()
        results[data_format] = (y, variance, float(layer.kl_divergence()))
    (y_last, var_last, kl_last), (y_first, var_first, kl_first) = results["channels_last"], results["channels_first"]
    np.testing.assert_allclose(testing.to_channels_last(y_first), y_last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(testing.to_channels_last(var_first), var_last, rtol=1e-5, atol=1e-7)
    assert kl_first == kl_last
