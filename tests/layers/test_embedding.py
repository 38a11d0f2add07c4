"""EmbeddingReparameterization: the harness, row sampling, the KL against tfd, the MC protocol, masking."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import testing
from tfbnn.layers import EmbeddingReparameterization

tfd = tfp.distributions
IDS = np.array([[1, 2, 1, 0], [3, 3, 4, 0]], "int32")


@pytest.mark.parametrize("prior", ["normal", "scale_mixture"])
def test_embedding_basics(prior):
    layer = testing.run_layer_test(
        EmbeddingReparameterization, {"input_dim": 6, "output_dim": 3, "embeddings_prior": prior, "seed": 2},
        input_shape=IDS.shape, expected_output_shape=IDS.shape + (3,), expected_num_trainable_weights=2,
        input_data=IDS)
    assert [w.name for w in layer.trainable_weights] == ["kernel_loc", "kernel_rho"]
    assert layer.kernel_loc.shape == (6, 3)


def _layer(**kwargs):
    kwargs = {"kl_weight": 1.0, "seed": 1, "embeddings_scale_initializer": keras.initializers.Constant(0.0), **kwargs}
    layer = EmbeddingReparameterization(6, 3, **kwargs)
    layer.build()
    return layer


def test_one_row_sample_per_distinct_id_and_the_mean_mode_is_a_lookup():
    layer = _layer()
    y = layer(IDS).numpy()
    np.testing.assert_array_equal(y[0, 0], y[0, 2])   # id 1 twice in one row
    np.testing.assert_array_equal(y[1, 0], y[1, 1])   # id 3 twice
    np.testing.assert_array_equal(y[0, 3], y[1, 3])   # id 0 in two rows of the batch
    assert not np.allclose(y[0, 0], y[0, 1])
    assert not np.allclose(layer(IDS).numpy(), y)      # a new sample per call
    with tfbnn.posterior_mean(layer):
        np.testing.assert_array_equal(layer(IDS).numpy(), layer.kernel_loc.numpy()[IDS])


def test_row_samples_have_the_posterior_distribution():
    layer = _layer(embeddings_scale_initializer=keras.initializers.Constant(-0.5))
    mu, sigma = layer.kernel_loc.numpy(), layer.kernel_scale().numpy()
    call = tf.function(lambda ids: layer(ids))
    draws = np.stack([call(tf.range(6)).numpy() for _ in range(400)])
    z = (draws - mu) / sigma
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1.0) < 0.05  # 7200 standardized draws
    # Rows of distinct ids and the entries of a row are uncorrelated.
    corr = np.corrcoef(z.reshape(400, -1).T)
    assert np.max(np.abs(corr - np.eye(18))) < 0.25


def test_kl_is_tfd_kl_over_the_whole_matrix_and_the_loss_is_kl_weight_times_it():
    layer = _layer(embeddings_prior=tfbnn.priors.Normal(0.1, 0.5))
    expected = tf.reduce_sum(tfd.kl_divergence(tfd.Normal(layer.kernel_loc, layer.kernel_scale()), tfd.Normal(0.1, 0.5)))
    np.testing.assert_allclose(float(layer.kl_divergence()), float(expected), rtol=1e-5)
    layer.set_kl_weight(0.25)
    layer(IDS)
    np.testing.assert_allclose(float(layer.losses[0]), 0.25 * float(expected), rtol=1e-5)


def test_monte_carlo_kl_of_the_scale_mixture_averages_to_the_exact_value():
    layer = _layer(embeddings_prior="scale_mixture", embeddings_scale_initializer=keras.initializers.Constant(-2.0))
    prior = layer.kernel_prior
    mu, sigma = layer.kernel_loc.numpy(), layer.kernel_scale().numpy()
    w = mu + sigma * np.random.default_rng(0).normal(size=(4000,) + mu.shape)
    reference = np.mean(np.sum(tfd.Normal(mu, sigma).log_prob(w).numpy() - prior.log_prob(w.astype("float32")).numpy(),
                               axis=(1, 2)))
    kl = tf.function(layer.kl_divergence)
    estimates = [float(kl()) for _ in range(300)]
    assert abs(np.mean(estimates) - reference) < 4 * np.std(estimates) / np.sqrt(300) + 0.05


@pytest.mark.parametrize("joint", [True, False])
def test_weight_samples_protocol(joint):
    layer = _layer()
    t = 3
    with tfbnn.weight_samples(layer, t, joint=joint):
        y = layer(np.tile(IDS, (t, 1))).numpy().reshape((t,) + IDS.shape + (3,))
    for i in range(t):
        for j in range(i + 1, t):
            assert not np.allclose(y[i], y[j])
    # Within a block (joint) all occurrences of an id share the row; per row (not joint) only within a row.
    np.testing.assert_array_equal(y[1, 0, 0], y[1, 0, 2])
    assert np.allclose(y[1, 0, 3], y[1, 1, 3]) == joint


def test_mask_zero_masks_padding_through_a_recurrent_layer():
    ids = np.array([[3, 4, 0, 0], [5, 0, 0, 0]], "int32")
    layer = EmbeddingReparameterization(6, 3, mask_zero=True, kl_weight=0.1, seed=0)
    np.testing.assert_array_equal(layer.compute_mask(ids).numpy(), ids != 0)
    inputs = keras.Input((4,), dtype="int32")
    outputs = keras.layers.SimpleRNN(2, return_sequences=True)(layer(inputs))
    model = keras.Model(inputs, outputs)
    with tfbnn.posterior_mean(model):
        y = model(ids).numpy()
    np.testing.assert_allclose(y[0, 2], y[0, 1])  # a masked step carries the last state
    np.testing.assert_allclose(y[1, 3], y[1, 0])
    assert EmbeddingReparameterization(6, 3).compute_mask(ids) is None


@pytest.mark.parametrize("kwargs, match", [
    ({"input_dim": 0, "output_dim": 3}, "input_dim=0"),
    ({"input_dim": 5, "output_dim": 2.5}, "output_dim=2.5"),
    ({"input_dim": 5, "output_dim": 2, "mask_zero": "yes"}, "mask_zero='yes'"),
    ({"input_dim": 5, "output_dim": 2, "embeddings_prior": "cauchy"}, "prior='cauchy'"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EmbeddingReparameterization(**kwargs)
