"""Named, serializable priors over weights.

A prior is a small configuration object (not a closure) that produces a scalar
``tfp.distributions.Distribution``; layers broadcast it over every weight, so the
prior over a kernel is the product of independent scalar priors.

Three priors are provided:

* :class:`Normal` -- ``p(w) = N(w; loc, scale^2)``. Its KL against the Gaussian
  mean-field posterior has a closed form (Blundell et al. 2015, and Graves 2011
  for a general ``loc``).
* :class:`ScaleMixture` -- Blundell et al. (2015), eq. 7::

      p(w) = pi N(w; 0, sigma1^2) + (1 - pi) N(w; 0, sigma2^2)

  with ``sigma1 > sigma2`` in the paper (a wide and a narrow component). TFP has
  no registered KL between a Normal and a mixture, so layers use a Monte Carlo
  estimate ``log q(w) - log p(w)`` at the sampled weights (Blundell eq. 2).
* :class:`Graves` -- Graves (2011): a Gaussian ``N(mu_p, sigma_p^2)`` whose
  parameters are, by default, set in closed form to the values that minimise
  the KL given the posterior (per weight tensor), with the closed-form KL.

Priors are chosen by name or by object, as Keras initializers are::

    tfbnn.priors.get("scale_mixture")                   # paper defaults
    tfbnn.priors.get(tfbnn.priors.ScaleMixture(0.25, 1.0, 3.35e-4))
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

tfd = tfp.distributions

__all__ = ["Prior", "Normal", "ScaleMixture", "Graves", "get", "serialize", "deserialize"]


def _check_positive(name, value):
    if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
        raise ValueError(f"Expected `{name}` to be a positive number. Received: {name}={value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"Expected `{name}` to be a positive finite number. Received: {name}={value}")
    return float(value)


class Prior:
    """Base class of tfbnn priors.

    Subclasses implement :meth:`distribution` (a scalar TFP distribution that
    broadcasts over weights) and :meth:`get_config`. ``has_closed_form_kl``
    tells layers whether ``tfd.kl_divergence(Normal, prior)`` is registered; if
    not, they use a Monte Carlo KL from a weight sample.
    """

    has_closed_form_kl = False

    def distribution(self, dtype="float32"):
        raise NotImplementedError

    def log_prob(self, x):
        """Elementwise ``log p(x)``; same shape as ``x``."""
        return self.distribution(x.dtype).log_prob(x)

    def get_config(self):
        raise NotImplementedError

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


@keras.saving.register_keras_serializable(package="tfbnn")
class Normal(Prior):
    """Gaussian prior ``p(w) = N(w; loc, scale^2)``, independent per weight.

    The KL from the mean-field posterior ``N(mu, sigma^2)`` is, per weight,
    ``log(scale / sigma) + (sigma^2 + (mu - loc)^2) / (2 scale^2) - 1/2``
    (Graves 2011, eq. 13 with a fixed prior).

    Args:
        loc: float, prior mean. Default 0.
        scale: float > 0, prior standard deviation. Default 1.

    Example:
        >>> p = Normal(0.0, 0.1)
        >>> float(p.distribution().stddev())
        0.1...
    """

    has_closed_form_kl = True

    def __init__(self, loc=0.0, scale=1.0):
        if not isinstance(loc, (int, float, np.floating, np.integer)) or not math.isfinite(loc):
            raise ValueError(f"Expected `loc` to be a finite number. Received: loc={loc!r}")
        self.loc = float(loc)
        self.scale = _check_positive("scale", scale)

    def distribution(self, dtype="float32"):
        return tfd.Normal(tf.constant(self.loc, dtype), tf.constant(self.scale, dtype))

    def get_config(self):
        return {"loc": self.loc, "scale": self.scale}


@keras.saving.register_keras_serializable(package="tfbnn")
class ScaleMixture(Prior):
    """Blundell et al. (2015) scale-mixture prior, eq. 7.

    ``p(w) = pi N(w; 0, sigma1^2) + (1 - pi) N(w; 0, sigma2^2)``

    The defaults are the best grid point of the paper's MNIST search
    (``pi = 1/4, -log sigma1 = 0, -log sigma2 = 6``).

    Args:
        pi: float in (0, 1), weight of the first component.
        sigma1: float > 0, scale of the first component.
        sigma2: float > 0, scale of the second component.

    Example:
        >>> p = ScaleMixture(pi=0.25, sigma1=1.0, sigma2=math.exp(-6))
        >>> d = p.distribution()          # a tfd.MixtureSameFamily
        >>> bool(abs(float(d.log_prob(0.0)) - float(p.log_prob(tf.constant(0.0)))) < 1e-5)
        True

    Reference:
        Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
        Networks. ICML 2015, eq. 7.
    """

    has_closed_form_kl = False

    def __init__(self, pi=0.25, sigma1=1.0, sigma2=math.exp(-6.0)):
        if not isinstance(pi, (int, float, np.floating)) or not (0.0 < pi < 1.0):
            raise ValueError(f"Expected `pi` in the open interval (0, 1). Received: pi={pi!r}")
        self.pi = float(pi)
        self.sigma1 = _check_positive("sigma1", sigma1)
        self.sigma2 = _check_positive("sigma2", sigma2)

    def distribution(self, dtype="float32"):
        return tfd.MixtureSameFamily(
            mixture_distribution=tfd.Categorical(
                probs=tf.constant([self.pi, 1.0 - self.pi], dtype)
            ),
            components_distribution=tfd.Normal(
                loc=tf.zeros([2], dtype), scale=tf.constant([self.sigma1, self.sigma2], dtype)
            ),
        )

    def log_prob(self, x):
        # Same value as distribution().log_prob(x), written as one logaddexp so the
        # Monte Carlo KL over millions of weights stays two fused elementwise passes.
        log_norm = -0.5 * math.log(2.0 * math.pi)
        a = math.log(self.pi) - math.log(self.sigma1) + log_norm
        b = math.log1p(-self.pi) - math.log(self.sigma2) + log_norm
        x2 = tf.square(x)
        return tf.math.reduce_logsumexp(
            tf.stack([a - x2 * (0.5 / self.sigma1**2), b - x2 * (0.5 / self.sigma2**2)]), axis=0
        )

    def get_config(self):
        return {"pi": self.pi, "sigma1": self.sigma1, "sigma2": self.sigma2}


@keras.saving.register_keras_serializable(package="tfbnn")
class Graves(Prior):
    """Graves (2011) Gaussian prior ``N(mu_p, sigma_p^2)`` with a closed-form KL.

    With ``loc=None, scale=None`` (the default, Graves 2011 sec. 5, eq. 13-15) the
    prior of each weight tensor (a kernel, a bias) is the Gaussian closest to its
    mean-field posterior ``N(mu_i, sigma_i^2)``, i = 1..n::

        mu_p = mean_i mu_i,    sigma_p^2 = mean_i (sigma_i^2 + (mu_i - mu_p)^2)

    and at that optimum the KL has the closed form
    ``KL = n log sigma_p - sum_i log sigma_i`` (the quadratic terms sum to n / 2).
    The optimum is recomputed at every step, so the prior is an empirical-Bayes
    prior; its gradient is the KL's partial gradient (envelope theorem).
    Given numbers, ``loc`` and/or ``scale`` are held fixed (the other, if None,
    is still fitted) and the KL is
    ``sum_i log(sigma_p / sigma_i) + (sigma_i^2 + (mu_i - mu_p)^2) / (2 sigma_p^2) - 1/2``.

    Pair it with the log-variance posterior of Graves (``sigma^2 = exp(rho)``):
    :class:`tfbnn.layers.GravesDense`, or
    ``DenseLocalReparameterization(..., kernel_prior="graves",
    posterior_parameterization="log_variance")``. Graves pruned weights by their
    signal-to-noise ratio ``|mu| / sigma`` (:func:`tfbnn.pruning.snr_mask`).

    Args:
        loc: float or None (fitted), the prior mean.
        scale: float > 0 or None (fitted), the prior standard deviation.

    Example:
        >>> p = Graves()
        >>> mu_p, sigma_p = p.fit(tf.constant([1.0, 3.0]), tf.constant([1.0, 1.0]))
        >>> float(mu_p), round(float(sigma_p) ** 2, 4)
        (2.0, 2.0)

    Reference:
        Graves. Practical Variational Inference for Neural Networks. NeurIPS 2011.
    """

    has_closed_form_kl = True

    def __init__(self, loc=None, scale=None):
        if loc is not None and (
            isinstance(loc, bool) or not isinstance(loc, (int, float, np.floating, np.integer)) or not math.isfinite(loc)
        ):
            raise ValueError(f"Expected `loc` to be a finite number or None. Received: loc={loc!r}")
        self.loc = None if loc is None else float(loc)
        self.scale = None if scale is None else _check_positive("scale", scale)

    @property
    def adaptive(self):
        """Whether some prior parameter is fitted to the posterior."""
        return self.loc is None or self.scale is None

    def fit(self, loc, scale):
        """The prior's ``(mu_p, sigma_p)`` for a posterior ``N(loc, scale^2)`` (scalar tensors)."""
        loc = tf.convert_to_tensor(loc)
        scale = tf.convert_to_tensor(scale, loc.dtype)
        mu_p = tf.reduce_mean(loc) if self.loc is None else tf.constant(self.loc, loc.dtype)
        if self.scale is None:
            sigma_p = tf.sqrt(tf.reduce_mean(tf.square(scale) + tf.square(loc - mu_p)))
        else:
            sigma_p = tf.constant(self.scale, loc.dtype)
        return mu_p, sigma_p

    def kl_divergence(self, loc, scale):
        """``sum_i KL(N(loc_i, scale_i^2) || N(mu_p, sigma_p^2))``, the prior fitted if adaptive."""
        loc = tf.convert_to_tensor(loc)
        scale = tf.convert_to_tensor(scale, loc.dtype)
        mu_p, sigma_p = self.fit(loc, scale)
        variance_p = tf.square(sigma_p)
        per_weight = (tf.square(scale) + tf.square(loc - mu_p)) / (2.0 * variance_p) - tf.math.log(scale)
        n = tf.cast(tf.size(loc), loc.dtype)
        return tf.reduce_sum(per_weight) + n * (tf.math.log(sigma_p) - 0.5)

    def distribution(self, dtype="float32"):
        if self.adaptive:
            raise ValueError(
                "The Graves prior with a fitted loc or scale depends on the posterior: use "
                "`prior.fit(loc, scale)` for its parameters or `prior.kl_divergence(loc, scale)`. "
                f"Received: loc={self.loc}, scale={self.scale}"
            )
        return tfd.Normal(tf.constant(self.loc, dtype), tf.constant(self.scale, dtype))

    def get_config(self):
        return {"loc": self.loc, "scale": self.scale}


_ALIASES = {
    "normal": Normal,
    "gaussian": Normal,
    "scale_mixture": ScaleMixture,
    "blundell": ScaleMixture,
    "graves": Graves,
}


def serialize(prior):
    """Returns a JSON-able dict ``{"class_name": ..., "config": ...}``."""
    return {"class_name": type(prior).__name__, "config": prior.get_config()}


def deserialize(config):
    """Inverse of :func:`serialize`."""
    return get(config)


def get(identifier):
    """Resolves a prior from a name, a config dict or a :class:`Prior`.

    Args:
        identifier: ``"normal"``, ``"scale_mixture"`` (alias ``"blundell"``),
            ``"graves"`` (the fitted Gaussian of :class:`Graves`), a dict
            from :func:`serialize`, or a :class:`Prior` instance (returned as is).

    Returns:
        A :class:`Prior`.

    Raises:
        ValueError: unknown name or unsupported type.
    """
    if isinstance(identifier, Prior):
        return identifier
    if isinstance(identifier, str):
        cls = _ALIASES.get(identifier.lower())
        if cls is None:
            raise ValueError(
                f"Unknown prior. Expected one of {sorted(_ALIASES)}. Received: prior={identifier!r}"
            )
        return cls()
    if isinstance(identifier, dict) and "class_name" in identifier:
        name = identifier["class_name"]
        classes = {c.__name__: c for c in _ALIASES.values()}
        if name not in classes:
            raise ValueError(f"Unknown prior class. Received: class_name={name!r}")
        return classes[name].from_config(identifier.get("config", {}))
    raise ValueError(
        "Expected a prior name, a serialized prior dict or a tfbnn.priors.Prior. "
        f"Received: prior={identifier!r}"
    )
