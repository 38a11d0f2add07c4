"""Graves (2011) variational dense layer: log-variance posterior, fixed Gaussian prior.

:class:`GravesDense` is :class:`tfbnn.layers.DenseLocalReparameterization` with
Graves' choices as defaults:

* posterior ``q(w_ij) = N(mu_ij, sigma_ij^2)`` with ``sigma_ij^2 = exp(rho_ij)``
  (``scale_parameterization="log_variance"``);
* a fixed Gaussian prior ``N(0, sigma_p^2)`` the user picks, ``N(0, 1)`` by default
  (``kernel_prior="normal"``; Graves used ``N(0, 1)`` on MNIST, and ``N(0, 2^2)``
  suits regression: ``kernel_prior=tfbnn.priors.Normal(0.0, 2.0)``), closed-form KL;
* a point-estimate bias (``bias_prior=None``), as the variational-dropout layers.

Graves' adaptive prior, ``N(mu_p, sigma_p^2)`` fitted to the posterior in closed form
at every step (``kernel_prior="graves"`` or ``"adaptive"``, :class:`tfbnn.priors.Graves`),
is an option. It is not the default because at ``beta = 1`` it can collapse the
network to a constant predictor (see :class:`tfbnn.priors.Graves`).

The same model is reachable from every core dense layer::

    tfbnn.layers.DenseFlipout(64, kernel_prior="normal", bias_prior=None, scale_parameterization="log_variance")

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
    and, by default, the fixed prior ``N(0, s^2)`` with ``s = 1``; per weight the KL is
    (Graves 2011, eq. 13 with a fixed prior)::

        KL = log(s / sigma) + (sigma^2 + mu^2) / (2 s^2) - 1/2.

    With ``kernel_prior="graves"`` (alias ``"adaptive"``) the prior is instead fitted
    to the posterior of the kernel in closed form (Graves 2011, sec. 5)::

        mu_p = mean_ij mu_ij,   sigma_p^2 = mean_ij (sigma_ij^2 + (mu_ij - mu_p)^2),
        KL = n log sigma_p - sum_ij log sigma_ij.

    Warning: the adaptive prior no longer penalizes large weights, only their
    spread; at ``beta = 1`` it can drive every weight of a tensor to one value, so
    the network predicts a constant (the class base rate). Use it with a tempered
    ``beta < 1`` and check the accuracy it reaches; the fixed prior does not collapse.

    Pre-activations are sampled per example (Kingma et al. 2015, eq. 6), so Monte
    Carlo prediction is per row in both modes of :func:`tfbnn.weight_samples`.

    Args:
        units: int > 0.
        kernel_prior: default ``"normal"`` (fixed ``N(0, 1)``); choose the scale with
            ``tfbnn.priors.Normal(0.0, 2.0)``; ``"graves"`` / ``"adaptive"`` for the
            fitted prior (``tfbnn.priors.Graves(0.0, None)`` fits the scale only);
            any prior of :mod:`tfbnn.priors` is accepted.
        bias_prior: default None (point-estimate bias).
        scale_parameterization: default ``"log_variance"`` (before tfbnn 0.3 ``parameterization``,
            still accepted with a ``DeprecationWarning``).
        **kwargs: every other argument of :class:`DenseLocalReparameterization`
            (``activation``, initializers, ``kl_weight``, ``inference_mode``, ``seed``).

    Input shape: ``(batch, ..., input_dim)``; output ``(batch, ..., units)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.GravesDense(3, seed=1, kl_weight=0.01)
        >>> layer(np.ones((2, 4), "float32")).shape
        TensorShape([2, 3])
        >>> layer.kernel_prior
        Normal(loc=0.0, scale=1.0)
        >>> tfbnn.layers.GravesDense(3, kernel_prior=tfbnn.priors.Normal(0.0, 2.0)).kernel_prior.scale
        2.0

    Reference:
        Graves. Practical Variational Inference for Neural Networks. NeurIPS 2011.
    """

    def __init__(
        self,
        units,
        kernel_prior="normal",
        bias_prior=None,
        scale_parameterization="log_variance",
        **kwargs,
    ):
        super().__init__(
            units,
            kernel_prior=kernel_prior,
            bias_prior=bias_prior,
            scale_parameterization=scale_parameterization,
            **kwargs,
        )
