"""KL divergences between the mean-field Gaussian posterior and a prior.

Both functions return the KL summed over all weights, unscaled (the ELBO
convention in :mod:`tfbnn.callbacks` divides it by the number of training
examples).

* :func:`closed_form_kl` -- ``sum_i KL(N(mu_i, sigma_i^2) || p)`` through
  ``tfd.kl_divergence``, for priors whose KL against a Normal TFP registers.
* :func:`monte_carlo_kl` -- the one-sample estimate of Blundell et al. (2015),
  eq. 2: ``sum_i log q(w_i) - log p(w_i)`` at a reparameterized sample
  ``w = mu + sigma * eps``. ``log q`` is computed from ``eps`` directly
  (``-eps^2/2 - log sigma - log(2 pi)/2``), which is exact and avoids recomputing
  ``(w - mu) / sigma``. Unbiased; its variance falls as the number of weights grows.
"""

import math

import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn import priors

tfd = tfp.distributions

__all__ = ["closed_form_kl", "monte_carlo_kl", "gaussian_log_prob_from_noise"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def closed_form_kl(loc, scale, prior):
    """``sum KL(N(loc, scale^2) || prior)`` in closed form (scalar tensor).

    For a :class:`tfbnn.priors.Normal` prior ``N(m, s^2)`` it is written out,
    ``sum log s - log sigma + (sigma^2 + (mu - m)^2) / (2 s^2) - 1/2`` (the same value
    as ``tfd.kl_divergence``, in fewer weight-sized passes); other priors go
    through ``tfd.kl_divergence``.
    """
    if isinstance(prior, priors.Normal):
        variance = tf.square(scale)
        centred = loc if prior.loc == 0.0 else loc - prior.loc
        per_weight = (variance + tf.square(centred)) * (0.5 / prior.scale**2) - 0.5 * tf.math.log(variance)
        n = tf.cast(tf.size(loc), loc.dtype)
        return tf.reduce_sum(per_weight) + n * (math.log(prior.scale) - 0.5)
    q = tfd.Normal(loc=loc, scale=scale)
    return tf.reduce_sum(tfd.kl_divergence(q, prior.distribution(loc.dtype)))


def gaussian_log_prob_from_noise(eps, scale):
    """``log N(mu + scale * eps; mu, scale^2)`` elementwise, from the noise ``eps``."""
    return -0.5 * tf.square(eps) - tf.math.log(scale) - _HALF_LOG_2PI


def monte_carlo_kl(sample, eps, scale, prior):
    """One-sample Monte Carlo KL ``sum log q(sample) - log p(sample)`` (scalar)."""
    log_q = gaussian_log_prob_from_noise(eps, scale)
    return tf.reduce_sum(log_q - prior.log_prob(sample))
