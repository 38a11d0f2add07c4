"""Graves (2011) variational dense layer: log-variance posterior, fitted Gaussian prior.

:class:`GravesDense` is :class:`tfbnn.layers.DenseLocalReparameterization` with
Graves' choices as defaults:

* posterior ``q(w_ij) = N(mu_ij, sigma_ij^2)`` with ``sigma_ij^2 = exp(rho_ij)``
  (``posterior_parameterization="log_variance"``);
* prior ``N(mu_p, sigma_p^2)`` per weight tensor with the closed-form optimum
  ``mu_p = mean mu``, ``sigma_p^2 = mean(sigma^2 + (mu - mu_p)^2)`` and the
  closed-form KL (``kernel_prior="graves"``, :class:`tfbnn.priors.Graves`);
* a point-estimate bias (``bias_prior=None``), as the variational-dropout layers.

The same model is reachable from every core dense layer::

    tfbnn.layers.DenseFlipout(64, kernel_prior="graves", posterior_parameterization="log_variance")

Graves pruned weights whose signal-to-noise ratio ``|mu| / sigma`` is below a
threshold: :func:`tfbnn.pruning.snr_mask` (default 0.83).
"""

import keras

from tfbnn.layers.dense import DenseLocalReparameterization

__all__ = ["GravesDense"]


@keras.saving.register_keras_serializable(package="tfbnn")
class GravesDense(DenseLocalReparameterization):
    """Graves' variational dense layer (Graves 2011), trained by local reparameterization.

    Each kernel weight has the posterior ``N(mu, sigma^2)``, ``sigma^2 = exp(rho)``,
    and the Gaussian prior fitted to it in closed form (Graves 2011, sec. 5):

        mu_p = mean_ij mu_ij,   sigma_p^2 = mean_ij (sigma_ij^2 + (mu_ij - mu_p)^2),
        KL = n log sigma_p - sum_ij log sigma_ij.

    Pre-activations are sampled per example (Kingma et al. 2015, eq. 6), so Monte
    Carlo prediction is per row in both modes of :func:`tfbnn.weight_samples`.

    Args:
        units: int > 0.
        kernel_prior: default ``"graves"`` (fitted); ``tfbnn.priors.Graves(0.0, 0.1)``
            fixes ``mu_p, sigma_p``; any prior of :mod:`tfbnn.priors` is accepted.
        bias_prior: default None (point-estimate bias).
        posterior_parameterization: default ``"log_variance"``.
        **kwargs: every other argument of :class:`DenseLocalReparameterization`
            (``activation``, initializers, ``kl_weight``, ``inference_mode``, ``seed``).

    Input shape: ``(batch, ..., input_dim)``; output ``(batch, ..., units)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.GravesDense(3, seed=1, kl_weight=0.01)
        >>> layer(np.ones((2, 4), "float32")).shape
        TensorShape([2, 3])

    Reference:
        Graves. Practical Variational Inference for Neural Networks. NeurIPS 2011.
    """

    def __init__(
        self,
        units,
        kernel_prior="graves",
        bias_prior=None,
        posterior_parameterization="log_variance",
        **kwargs,
    ):
        super().__init__(
            units,
            kernel_prior=kernel_prior,
            bias_prior=bias_prior,
            posterior_parameterization=posterior_parameterization,
            **kwargs,
        )
