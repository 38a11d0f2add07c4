"""Bayesian LSTM and GRU: one weight sample per sequence, KL, save/load, seeds, Keras' RNN and harnesses."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import testing
from tfbnn.layers import (
    GRUCellReparameterization,
    GRUReparameterization,
    LSTMCellReparameterization,
    LSTMReparameterization,
)

tfd = tfp.distributions
LAYERS = [(LSTMReparameterization, keras.layers.LSTM), (GRUReparameterization, keras.layers.GRU)]
CELLS = [LSTMCellReparameterization, GRUCellReparameterization]


def _x(shape=(3, 5, 4), seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _noisy(layer):
    """Large posterior scales, so that a sample differs visibly from the mean."""
    cell = layer.cell
    cell.kernel_rho.assign(np.full(cell.kernel_rho.shape, -1.0, "float32"))
    cell.bias_rho.assign(np.full(cell.bias_rho.shape, -1.0, "float32"))


def _keras_twin(keras_cls, layer, kernel, bias, **kwargs):
    """The deterministic Keras layer with the given stacked kernel ``[W; U]`` and bias (of ``layer``'s sizes)."""
    d = layer.cell.input_dim if hasattr(layer, "cell") else layer.input_dim
    twin = keras_cls(layer.units, **kwargs)
    twin.build((None, None, d))
    twin.cell.kernel.assign(kernel[:d])
    twin.cell.recurrent_kernel.assign(kernel[d:])
    twin.cell.bias.assign(bias)
    return twin


@pytest.mark.parametrize("cls, keras_cls", LAYERS)
@pytest.mark.parametrize("go_backwards", [False, True])
def test_the_noise_is_drawn_once_per_sequence(cls, keras_cls, go_backwards):
    """A sampled call equals Keras' deterministic layer run with that call's weight sample at every step."""
    x = _x()
    layer = cls(6, return_sequences=True, go_backwards=go_backwards, kl_weight=1e-3, seed=3)
    layer(x)
    _noisy(layer)
    state = layer.cell.seed_generator.state.numpy().copy()
    y = layer(x).numpy()
    layer.cell.seed_generator.state.assign(state)  # replay the call's draw
    kernel, bias, _ = layer.cell.draw_weights()
    twin = _keras_twin(keras_cls, layer, kernel.numpy(), bias.numpy(), return_sequences=True,
                       go_backwards=go_backwards)
    np.testing.assert_allclose(y, twin(x).numpy(), rtol=1e-5, atol=1e-5)
    # ... and differs from the posterior mean (the weights were sampled).
    mean_twin = _keras_twin(keras_cls, layer, layer.cell.kernel_loc.numpy(), layer.cell.bias_loc.numpy(),
                            return_sequences=True, go_backwards=go_backwards)
    assert np.abs(y - mean_twin(x).numpy()).max() > 1e-2
    with tfbnn.posterior_mean(layer):
        np.testing.assert_allclose(layer(x).numpy(), mean_twin(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls, keras_cls", LAYERS)
def test_cell_in_keras_rnn_holds_the_sample_with_an_initial_state_and_a_mask(cls, keras_cls):
    """The cell alone in ``keras.layers.RNN`` (initial state given, masked steps): still one draw per call."""
    x = _x((2, 5, 4), seed=1)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    cell = cls.cell_class(3, kl_weight=1e-3, seed=4, kernel_scale_initializer=keras.initializers.Constant(-1.0))
    rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True)
    n_states = 2 if cls is LSTMReparameterization else 1
    h0 = [np.full((2, 3), 0.1 * (i + 1), "float32") for i in range(n_states)]
    rnn(x, initial_state=h0, mask=mask)
    state = cell.seed_generator.state.numpy().copy()
    out = rnn(x, initial_state=h0, mask=mask)
    assert len(rnn.losses) == 1
    cell.seed_generator.state.assign(state)
    kernel, bias, _ = cell.draw_weights()
    twin = _keras_twin(keras_cls, cell, kernel.numpy(), bias.numpy(), return_sequences=True, return_state=True)
    expected = twin(x, initial_state=h0, mask=mask)
    for a, b in zip(out, expected):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [c for c, _ in LAYERS])
def test_kl_matches_tfd_and_is_added_once_per_call(cls):
    layer = cls(3, kl_weight=0.25, seed=0)
    y = layer(_x((2, 7, 4)))
    assert y.shape == (2, 3)
    cell = layer.cell
    sigma = lambda rho: tf.nn.softplus(rho) + 1e-6  # noqa: E731
    expected = sum(
        float(tf.reduce_sum(tfd.kl_divergence(tfd.Normal(loc, sigma(rho)), tfd.Normal(0.0, 1.0))))
        for loc, rho in ((cell.kernel_loc, cell.kernel_rho), (cell.bias_loc, cell.bias_rho))
    )
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
    assert len(layer.losses) == 1  # seven steps, one KL term
    np.testing.assert_allclose(float(layer.losses[0]), 0.25 * expected, rtol=1e-5)


@pytest.mark.parametrize("cls", [c for c, _ in LAYERS])
def test_scale_mixture_kl_is_a_monte_carlo_estimate_at_the_sample(cls):
    layer = cls(3, kernel_prior="scale_mixture", kl_weight=1.0, seed=0)
    x = _x((2, 4, 4))
    layer(x)
    state = layer.cell.seed_generator.state.numpy().copy()
    layer(x)
    loss = float(layer.losses[0])
    layer.cell.seed_generator.state.assign(state)
    kernel, _, _ = layer.cell.draw_weights()
    cell = layer.cell
    q = tfd.Normal(cell.kernel_loc, cell.kernel_scale())
    prior = cell.kernel_prior  # pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2), written out with TFP
    p = tfd.MixtureSameFamily(tfd.Categorical(probs=[prior.pi, 1 - prior.pi]),
                              tfd.Normal(0.0, [prior.sigma1, prior.sigma2]))
    bias_kl = tf.reduce_sum(tfd.kl_divergence(tfd.Normal(cell.bias_loc, cell.bias_scale()), tfd.Normal(0.0, 1.0)))
    expected = float(tf.reduce_sum(q.log_prob(kernel) - p.log_prob(kernel)) + bias_kl)
    np.testing.assert_allclose(loss, expected, rtol=1e-4)


@pytest.mark.parametrize("cls", [c for c, _ in LAYERS])
def test_seeded_layers_reproduce_and_successive_calls_differ(cls):
    x = _x()
    runs = []
    for _ in range(2):
        layer = cls(4, seed=11, kernel_initializer=keras.initializers.GlorotUniform(seed=5),
                    recurrent_initializer=keras.initializers.Orthogonal(seed=6), kl_weight=1e-3)
        runs.append([layer(x).numpy() for _ in range(2)])
    np.testing.assert_array_equal(np.stack(runs[0]), np.stack(runs[1]))
    assert not np.allclose(runs[0][0], runs[0][1])


@pytest.mark.parametrize("cls", [c for c, _ in LAYERS])
def test_save_load_keeps_weights_seed_and_sequence_arguments(cls, tmp_path):
    x = _x()
    model = keras.Sequential([keras.Input((5, 4)), keras.layers.Masking(0.0),
                              cls(4, return_sequences=True, go_backwards=True, kl_weight=1e-3, seed=2),
                              cls(3, kl_weight=1e-3, seed=3)])
    model(x)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.layers[1].go_backwards and loaded.layers[1].return_sequences
    assert isinstance(loaded.layers[1].cell, cls.cell_class)
    np.testing.assert_array_equal(model(x).numpy(), loaded(x).numpy())  # same seed state: same sample
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_array_equal(model(x).numpy(), loaded(x).numpy())


@pytest.mark.parametrize("cls", [c for c, _ in LAYERS])
def test_mc_prediction_draws_distinct_whole_sequence_samples(cls):
    x = _x((4, 5, 4))
    model = keras.Sequential([keras.Input((5, 4)), cls(6, kl_weight=1e-3, seed=1),
                              keras.layers.Dense(2, activation="softmax")])
    model(x)
    _noisy(model.layers[0])
    prediction = tfbnn.predict(model, x, num_samples=8, return_samples=True)
    samples = prediction.samples  # (T, B, C)
    assert samples.shape == (8, 4, 2)
    assert np.std(samples, axis=0).min() > 1e-4  # T distinct samples
    # Sample t of the vectorized call is the model run with the t-th of T kernels drawn jointly.
    layer = model.layers[0]
    with tfbnn.weight_samples(model, 3, joint=True):
        state = layer.cell.seed_generator.state.numpy().copy()
        tiled = model(np.concatenate([x] * 3)).numpy().reshape(3, 4, 2)
        layer.cell.seed_generator.state.assign(state)
        kernels, biases, _ = layer.cell.draw_weights()
    head = model.layers[1]
    keras_cls = keras.layers.LSTM if cls is LSTMReparameterization else keras.layers.GRU
    for t in range(3):
        twin = _keras_twin(keras_cls, layer, kernels.numpy()[t], biases.numpy()[t])
        np.testing.assert_allclose(tiled[t], head(twin(x)).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [c for c, _ in LAYERS])
def test_training_without_a_kl_scale_is_an_error(cls):
    layer = cls(2)
    with pytest.raises(ValueError, match="kl_weight=None"):
        layer(_x(), training=True)


@pytest.mark.parametrize("cell_cls", CELLS)
def test_a_cell_called_alone_draws_its_own_sample_and_kl(cell_cls):
    cell = cell_cls(3, kl_weight=0.5, seed=0)
    states = [np.zeros((2, 3), "float32")] * (2 if cell_cls is LSTMCellReparameterization else 1)
    h, new_states = cell(np.ones((2, 4), "float32"), states)
    assert h.shape == (2, 3) and len(new_states) == len(states) and len(cell.losses) == 1
    np.testing.assert_allclose(float(cell.losses[0]), 0.5 * float(cell.kl_divergence()), rtol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"units": 0}, "units=0"),
    ({"units": 3, "kernel_prior": "cauchy"}, "prior='cauchy'"),
    ({"units": 3, "recurrent_initializer": "nope"}, "recurrent_initializer='nope'"),
    ({"units": 3, "kl_weight": -1.0}, "kl_weight=-1.0"),
    ({"units": 3, "seed": "x"}, "seed='x'"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    for cls in CELLS + [LSTMReparameterization]:
        with pytest.raises(ValueError, match=match):
            cls(**kwargs)


@pytest.mark.parametrize("cls", [c for c, _ in LAYERS])
def test_tfbnn_layer_harness(cls):
    layer = testing.run_layer_test(cls, {"units": 3, "seed": 1, "kl_weight": 0.01}, input_shape=(4, 5, 2),
                                   expected_output_shape=(4, 3), expected_num_losses=1,
                                   expected_num_seed_generators=1, expected_num_trainable_weights=4)
    assert testing.count_seed_generators(layer.cell) == 1  # the layer's one generator is its cell's


@pytest.mark.parametrize("cls", [LSTMReparameterization, GRUReparameterization])
@pytest.mark.parametrize("return_sequences", [False, True])
def test_keras_checks_through_the_one_harness(cls, return_sequences):
    testing.run_layer_test(
        cls, {"units": 3, "seed": 1, "kl_weight": 0.01, "return_sequences": return_sequences},
        input_shape=(2, 4, 5), expected_output_shape=(2, 4, 3) if return_sequences else (2, 3),
        expected_num_trainable_weights=4, expected_num_seed_generators=1, expected_num_losses=1,
        run_save_load=False, run_training=True, run_mixed_precision=False, keras_checks=True,
        expected_num_non_trainable_weights=1, supports_masking=True)


@pytest.mark.parametrize("cls", [LSTMReparameterization, GRUReparameterization])
def test_a_bad_recurrent_activation_is_named_as_such(cls):
    """Found by tests/test_fuzz.py: the error named `activation` for a bad `recurrent_activation`."""
    with pytest.raises(ValueError, match=r"Expected `recurrent_activation` .*Received: recurrent_activation=True"):
        cls(3, recurrent_activation=True)
