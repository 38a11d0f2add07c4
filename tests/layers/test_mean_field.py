"""tfbnn.layers.mean_field: the mean-field Gaussian posterior that the Bayes-by-Backprop layers share.

The KL against ``tfd.kl_divergence``, the samples' moments against ``mu`` and
``softplus(rho)``, and the subclassing contract: a shape family plus
:class:`MeanFieldGaussian` or :class:`MeanFieldFlipout` is a complete layer.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn.layers import arguments, mean_field

tfd = tfp.distributions


class _DenseFlipout(arguments.DenseArguments, mean_field.MeanFieldFlipout):
    """The guide's recipe: a shape family before the posterior family, nothing else."""


class _DenseReparameterization(arguments.DenseArguments, mean_field.MeanFieldGaussian):
    pass


def _built(layer, features=3):
    layer(np.zeros((1, features), "float32"))
    return layer


@pytest.mark.parametrize("prior", [tfbnn.priors.Normal(0.0, 1.0), tfbnn.priors.Normal(0.5, 0.3)])
def test_the_closed_form_kl_is_tfp_kl_divergence_summed(prior):
    layer = _built(_DenseReparameterization(4, kernel_prior=prior, bias_prior=prior, seed=1,
                                            kernel_initializer=keras.initializers.RandomNormal(stddev=0.5, seed=2)))
    scale = lambda rho: tf.nn.softplus(rho) + 1e-6  # noqa: E731  (the documented sigma)
    p = tfd.Normal(prior.loc, prior.scale)
    expected = (tf.reduce_sum(tfd.kl_divergence(tfd.Normal(layer.kernel_loc, scale(layer.kernel_rho)), p))
                + tf.reduce_sum(tfd.kl_divergence(tfd.Normal(layer.bias_loc, scale(layer.bias_rho)), p)))
    np.testing.assert_allclose(float(layer.kl_divergence()), float(expected), rtol=1e-5)


def test_reparameterized_samples_have_the_posterior_moments():
    """A one-hot input reads one kernel row: over many calls its mean is mu and its spread softplus(rho)."""
    layer = _built(_DenseReparameterization(3, use_bias=False, seed=3,
                                            kernel_scale_initializer=keras.initializers.Constant(-1.0)), features=2)
    x = np.tile(np.array([[1.0, 0.0]], "float32"), (3000, 1))
    layer.set_weight_samples(3000)  # the Monte Carlo protocol: row t reads kernel sample t
    draws = np.asarray(layer(x))
    layer.set_weight_samples(1)
    np.testing.assert_allclose(draws.mean(0), np.asarray(layer.kernel_loc)[0], atol=0.05)
    np.testing.assert_allclose(draws.std(0), np.log1p(np.exp(-1.0)) + 1e-6, rtol=0.05)


def test_a_subclass_of_the_two_families_is_the_library_layer():
    """_DenseFlipout (shape family + MeanFieldFlipout) computes what tfbnn.layers.DenseFlipout computes,
    draw for draw, and saves like it."""
    x = np.random.default_rng(0).normal(size=(5, 3)).astype("float32")
    ours, library = _built(_DenseFlipout(4, seed=9)), _built(tfbnn.layers.DenseFlipout(4, seed=9))
    library.set_weights(ours.get_weights())
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(library(x)))
    with tfbnn.posterior_mean(ours), tfbnn.posterior_mean(library):
        np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(library(x)))
    assert tfbnn.layers.MeanFieldFlipout is mean_field.MeanFieldFlipout
    config = ours.get_config()
    assert _DenseFlipout.from_config(config).get_config() == config


def test_flipout_gives_each_example_its_own_perturbation_and_the_same_marginal():
    """Flipout: two identical rows of one batch get different outputs; reparameterization shares one kernel."""
    x = np.ones((2, 3), "float32")
    flip = _built(_DenseFlipout(2, seed=4, kernel_scale_initializer=keras.initializers.Constant(0.0)))
    shared = _built(_DenseReparameterization(2, seed=4, kernel_scale_initializer=keras.initializers.Constant(0.0)))
    y_flip, y_shared = np.asarray(flip(x)), np.asarray(shared(x))
    assert not np.allclose(y_flip[0], y_flip[1])
    np.testing.assert_array_equal(y_shared[0], y_shared[1])
