"""tfbnn.layers.base: the two bases every stochastic layer builds on.

:class:`StochasticLayer`: the inference-mode switch, seeded noise that travels with the
weights, the Monte Carlo protocol; :class:`BayesianLayer`: the KL loss scaled by
``kl_weight``, refused in training without a scale.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn.layers import base


class _Noise(base.StochasticLayer):
    """The smallest stochastic layer: x + N(0, 1) noise while sampling, x otherwise."""

    def call(self, inputs, training=None):
        if not self._sampling(training):
            return inputs
        return inputs + self._normal(tf.shape(inputs), inputs.dtype)


class _Scaled(base.BayesianLayer):
    """x * w with a fixed KL of 2.5: the base's loss is kl_weight * 2.5."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(), initializer="ones", name="w")
        self._build_kl_weight()

    def kl_divergence(self):
        return tf.constant(2.5)

    def call(self, inputs, training=None):
        self._add_kl_loss(self.kl_divergence(), training)
        return inputs * self.w


def test_seeded_noise_repeats_for_the_same_seed_and_differs_for_another():
    x = np.zeros((4, 3), "float32")
    a, b, c = _Noise(seed=7), _Noise(seed=7), _Noise(seed=8)
    first = [np.asarray(a(x)) for _ in range(2)]
    np.testing.assert_array_equal(first[0], np.asarray(b(x)))
    assert not np.array_equal(first[0], first[1])  # the generator moves on: a new draw per call
    assert not np.array_equal(first[0], np.asarray(c(x)))
    assert abs(np.std(np.asarray(_Noise(seed=1)(np.zeros((4000, 1), "float32")))) - 1.0) < 0.05


def test_the_inference_mode_switches_the_noise_and_refuses_an_unknown_mode():
    layer, x = _Noise(seed=1), np.ones((2, 2), "float32")
    with tfbnn.posterior_mean(layer):
        np.testing.assert_array_equal(np.asarray(layer(x)), x)
    assert not np.array_equal(np.asarray(layer(x)), x)
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)) != x, True)  # "sample": noise at inference
    with pytest.raises(ValueError, match=r"Expected `inference_mode` in .*Received: inference_mode='median'"):
        layer.inference_mode = "median"


def test_the_seed_state_is_saved_with_the_weights(tmp_path):
    """A reloaded seeded model continues the sample sequence of the model it was saved from."""
    model = keras.Sequential([keras.Input((3,)), _Noise(seed=3)])
    x = np.zeros((2, 3), "float32")
    model(x)
    path = str(tmp_path / "noise.keras")
    model.save(path)
    expected = np.asarray(model(x))
    loaded = keras.saving.load_model(path, custom_objects={"_Noise": _Noise})
    np.testing.assert_array_equal(np.asarray(loaded(x)), expected)


def test_the_kl_loss_is_kl_weight_times_the_kl_and_training_needs_a_scale():
    layer = _Scaled(kl_weight=0.2)
    layer(np.ones((1, 1), "float32"), training=True)
    np.testing.assert_allclose(float(sum(layer.losses)), 0.2 * 2.5, rtol=1e-7)
    layer.set_kl_weight(0.04)
    layer(np.ones((1, 1), "float32"), training=True)
    np.testing.assert_allclose(float(sum(layer.losses)), 0.04 * 2.5, rtol=1e-7)
    with pytest.raises(ValueError, match=r"trained without a KL scale.*Received: kl_weight=None"):
        _Scaled()(np.ones((1, 1), "float32"), training=True)
    _Scaled()(np.ones((1, 1), "float32"), training=False)  # prediction needs none


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), "0.1", True])
def test_a_bad_kl_weight_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"kl_weight"):
        base.validate_kl_weight(value)
    with pytest.raises(ValueError, match=r"kl_weight"):
        _Scaled(kl_weight=value)


def test_the_monte_carlo_protocol_is_set_and_restored():
    layer = _Noise(seed=1)
    previous = layer.set_weight_samples(4, joint=False, with_kl=True)
    assert previous == (1, True, False) and layer.weight_samples == (4, False, True)
    assert layer._mc_prediction and layer._adds_kl
    layer.set_weight_samples(*previous)
    assert layer.weight_samples == (1, True, False) and not layer._mc_prediction
    with pytest.raises(ValueError, match="num_samples"):
        layer.set_weight_samples(0)


@pytest.mark.parametrize("compile_mode", ["eager", "traced", "xla"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_draws_are_tensorflows_philox_streams_of_the_layers_seeds(compile_mode, dtype):
    """The base draws through Philox's key and counter computed in one op (base._key_counter, the
    kernel's scramble): bit for bit what tf.random's stateless ops with alg="philox" give for the
    same seeds (the stream every saved model and pinned number was made with), eager, traced and
    under XLA."""
    layer, reference = _Noise(seed=7), _Noise(seed=7)
    for each in (layer, reference):
        each.build((3,))

    def draws():
        signs = layer._rademacher_pair([2, 5], [4], dtype)
        return (layer._normal([3, 4], dtype), layer._uniform([6], dtype)) + signs

    def reference_signs(shape, seed):
        bits = tf.random.stateless_uniform(shape, seed, minval=0, maxval=2, dtype=tf.int32, alg="philox")
        return tf.cast(2 * bits - 1, dtype)

    def reference_draws():
        split = tf.random.experimental.stateless_split(reference._next_seed(), 2)
        normal = tf.random.stateless_normal([3, 4], reference._next_seed(), dtype=dtype, alg="philox")
        uniform = tf.random.stateless_uniform([6], reference._next_seed(), dtype=dtype, alg="philox")
        return normal, uniform, reference_signs([2, 5], split[0]), reference_signs([4], split[1])

    wrap = {"eager": lambda f: f, "traced": tf.function, "xla": lambda f: tf.function(f, jit_compile=True)}[compile_mode]
    for _ in range(2):  # the second call draws from the advanced seeds
        got = [np.asarray(t, np.float32) for t in wrap(draws)()]
        expected = [np.asarray(t, np.float32) for t in wrap(reference_draws)()]
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    assert set(np.unique(got[2])) | set(np.unique(got[3])) == {-1.0, 1.0}
    assert not np.array_equal(got[0], np.asarray(layer._normal([3, 4], dtype), np.float32))
