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
* :func:`molchanov_kl` and :func:`kingma_kl` -- the approximations of the KL
  between a variational-dropout posterior ``N(theta, alpha theta^2)`` and the
  log-uniform prior ``p(|w|) ~ 1 / |w|``, functions of ``log alpha`` only
  (Molchanov et al. 2017, eq. 14; Kingma et al. 2015, eq. 7 / appendix C).

Priors that fit themselves to the posterior (Graves 2011's optimal Gaussian,
:class:`tfbnn.priors.Graves`) compute their own KL through a
``kl_divergence(loc, scale)`` method, which :func:`closed_form_kl` calls.
"""

import math

import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn import priors

tfd = tfp.distributions

__all__ = [
    "closed_form_kl",
    "monte_carlo_kl",
    "gaussian_log_prob_from_noise",
    "molchanov_kl",
    "kingma_kl",
    "MOLCHANOV_K",
    "KINGMA_C",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def closed_form_kl(loc, scale, prior):
    """``sum KL(N(loc, scale^2) || prior)`` in closed form (scalar tensor).

    For a :class:`tfbnn.priors.Normal` prior ``N(m, s^2)`` it is written out,
    ``sum log s - log sigma + (sigma^2 + (mu - m)^2) / (2 s^2) - 1/2`` (the same value
    as ``tfd.kl_divergence``, in fewer weight-sized passes); a prior with a
    ``kl_divergence(loc, scale)`` method (:class:`tfbnn.priors.Graves`) computes
    its own; other priors go through ``tfd.kl_divergence``.
    """
    own_kl = getattr(prior, "kl_divergence", None)
    if own_kl is not None:
        return own_kl(loc, scale)
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


#: Molchanov et al. (2017), eq. 14: ``k1, k2, k3``.
MOLCHANOV_K = (0.63576, 1.87320, 1.48695)
#: Kingma et al. (2015), eq. 7 / appendix C: ``c1, c2, c3``.
KINGMA_C = (1.16145124, -1.50204118, 0.58629921)


def molchanov_kl(log_alpha):
    """Elementwise KL approximation of sparse variational dropout (Molchanov 2017, eq. 14).

    ::

        -KL(q(w | theta, alpha) || p(w)) ~ k1 sigmoid(k2 + k3 log alpha)
                                           - 0.5 log(1 + 1 / alpha) - k1

    with ``k1 = 0.63576, k2 = 1.87320, k3 = 1.48695`` and the log-uniform prior.
    The constant ``-k1`` makes the KL tend to 0 as ``alpha -> inf``; the fit is
    within about 0.01 nats of the exact value at every alpha. ``0.5 log(1 + 1 / alpha)``
    is computed as ``0.5 softplus(-log alpha)`` (finite at any ``log alpha``).

    Args:
        log_alpha: tensor of ``log alpha`` values.

    Returns:
        The KL per element (same shape), >= 0 up to the fit error.
    """
    k1, k2, k3 = MOLCHANOV_K
    log_alpha = tf.convert_to_tensor(log_alpha)
    neg_kl = k1 * tf.sigmoid(k2 + k3 * log_alpha) - 0.5 * tf.nn.softplus(-log_alpha) - k1
    return -neg_kl


def kingma_kl(log_alpha):
    """Elementwise KL approximation of Gaussian dropout (Kingma et al. 2015, eq. 7, appendix C).

    ::

        -KL ~ C + 0.5 log alpha + c1 alpha + c2 alpha^2 + c3 alpha^3

    with ``c1 = 1.16145124, c2 = -1.50204118, c3 = 0.58629921``, fitted for
    ``alpha <= 1`` only (the polynomial diverges above). The paper leaves the
    constant free (it does not move the optimum); tfbnn takes ``C = -k1`` of
    :func:`molchanov_kl`, so both approximations share one reference and agree
    within about 0.04 nats at ``alpha <= 1``.

    Args:
        log_alpha: tensor of ``log alpha`` values; callers clip it to ``<= 0``.

    Returns:
        The KL per element (same shape).
    """
    c1, c2, c3 = KINGMA_C
    log_alpha = tf.convert_to_tensor(log_alpha)
    alpha = tf.exp(log_alpha)
    neg_kl = -MOLCHANOV_K[0] + 0.5 * log_alpha + alpha * (c1 + alpha * (c2 + alpha * c3))
    return -neg_kl
