"""Named, serializable priors over weights.

A prior is a small configuration object (not a closure) that produces a scalar
``tfp.distributions.Distribution``; layers broadcast it over every weight, so the
prior over a kernel is the product of independent scalar priors.

The priors provided:

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
  the KL given the posterior (per weight tensor), with the closed-form KL. This
  adaptive (empirical-Bayes) prior is an option, not the default of
  :class:`tfbnn.layers.GravesDense` (a fixed ``Normal``): at ``beta = 1`` it can
  collapse the network to a constant predictor (see :class:`Graves`).
* :class:`Posterior` -- a per-weight Gaussian ``N(w_i; m_i, s_i^2)`` holding a
  trained layer's posterior as constants: the prior of variational continual
  learning (Nguyen et al. 2018, eq. 4; :mod:`tfbnn.continual`), closed-form KL.

Priors are chosen by name or by object, as Keras initializers are::

    tfbnn.priors.get("scale_mixture")                   # paper defaults
    tfbnn.priors.get(tfbnn.priors.ScaleMixture(0.25, 1.0, 3.35e-4))
"""

import base64
import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn._internal import checks
from tfbnn._internal.configurable import Configurable

tfd = tfp.distributions

__all__ = ["Prior", "Normal", "ScaleMixture", "Graves", "Posterior", "get", "serialize", "deserialize"]


# Layers compute in float32. A scale that float32 rounds to 0 (1e-46) makes the KL
# infinite; one whose 0.5 / scale^2 (the KL's factor) is no normal float32 number
# (scale > 2^62 ~ 4.6e18) makes that factor 0 and the KL NaN (inf * 0).
_MIN_SCALE = float(np.finfo(np.float32).tiny)  # ~1.18e-38
_MAX_SCALE = 2.0**62
_MAX_LOC = float(np.finfo(np.float32).max)  # ~3.40e38


def _check_scale(name, value, allow_none=False):
    return checks.number(
        name, value, low=_MIN_SCALE, high=_MAX_SCALE, allow_none=allow_none,
        what=f"a positive number in [{_MIN_SCALE:.3g}, {_MAX_SCALE:.3g}] (float32 holds it and 1 / {name}^2)",
    )


def _check_loc(value, allow_none=False):
    return checks.number(
        "loc", value, low=-_MAX_LOC, high=_MAX_LOC, allow_none=allow_none,
        what=f"a number that float32 represents, in [{-_MAX_LOC:.3g}, {_MAX_LOC:.3g}]",
    )


class Prior(Configurable):
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

    def check_shape(self, shape, name="prior"):
        """Raises a ValueError naming ``name`` if the prior cannot cover weights of ``shape``.

        Scalar priors broadcast over any weight tensor; :class:`Posterior` has one shape.
        """


@keras.saving.register_keras_serializable(package="tfbnn")
class Normal(Prior):
    """Gaussian prior ``p(w) = N(w; loc, scale^2)``, independent per weight.

    The KL from the mean-field posterior ``N(mu, sigma^2)`` is, per weight,
    ``log(scale / sigma) + (sigma^2 + (mu - loc)^2) / (2 scale^2) - 1/2``
    (Graves 2011, eq. 13 with a fixed prior).

    Args:
        loc: float, prior mean. Default 0.
        scale: float > 0, prior standard deviation. Default 1. Layers compute in
            float32, so ``scale`` must lie in ``[1.18e-38, 2^62 ~ 4.6e18]`` (float32
            holds ``scale`` and ``1 / scale^2``) and ``|loc|`` in float32's range. A
            KL beyond float32 (a tiny scale) is infinite, never NaN.

    Example:
        >>> p = Normal(0.0, 0.1)
        >>> float(p.distribution().stddev())
        0.1...
    """

    has_closed_form_kl = True

    def __init__(self, loc=0.0, scale=1.0):
        self.loc = _check_loc(loc)
        self.scale = _check_scale("scale", scale)

    def distribution(self, dtype="float32"):
        return tfd.Normal(tf.constant(self.loc, dtype), tf.constant(self.scale, dtype))

    def get_config(self):
        return {"loc": self.loc, "scale": self.scale}


@keras.saving.register_keras_serializable(package="tfbnn")
class ScaleMixture(Prior):
    """Blundell et al. (2015) scale-mixture prior, eq. 7.

    ``p(w) = pi N(w; 0, sigma1^2) + (1 - pi) N(w; 0, sigma2^2)``

    The defaults ``pi = 1/4, sigma1 = e^0, sigma2 = e^-8`` are the best point of the
    paper's MNIST grid in the seed study (the paper itself does not name its best
    prior; ``tfbnn tune`` reruns the grid).

    Args:
        pi: float in (0, 1), weight of the first component.
        sigma1: float > 0, scale of the first component.
        sigma2: float > 0, scale of the second component. Both scales lie in
            ``[1.18e-38, 2^62]`` (see :class:`Normal`).

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

    def __init__(self, pi=0.25, sigma1=1.0, sigma2=math.exp(-8.0)):
        self.pi = checks.number("pi", pi, low=0, high=1, low_open=True, high_open=True,
                                 what="a number in the open interval (0, 1)")
        self.sigma1 = _check_scale("sigma1", sigma1)
        self.sigma2 = _check_scale("sigma2", sigma2)

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
        # Same value as distribution().log_prob(x), written as one log-sum-exp so the
        # Monte Carlo KL over millions of weights stays two fused elementwise passes.
        # Each component uses (x / sigma)^2, never x^2 * (1 / sigma^2): for a narrow
        # component that factor overflows float32 and x = 0 would give 0 * inf = NaN;
        # an overflowing (x / sigma)^2 is a component density of 0, which log-sum-exp takes.
        log_norm = -0.5 * math.log(2.0 * math.pi)
        a = math.log(self.pi) - math.log(self.sigma1) + log_norm
        b = math.log1p(-self.pi) - math.log(self.sigma2) + log_norm
        return tf.math.reduce_logsumexp(
            tf.stack([a - 0.5 * tf.square(x * (1.0 / self.sigma1)), b - 0.5 * tf.square(x * (1.0 / self.sigma2))]),
            axis=0,
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

    Warning -- collapse at ``beta = 1``: the fitted KL ``n log sigma_p - sum_i log sigma_i``
    no longer charges for the size of the weights, only for their spread, and it
    is lowest when every ``mu_i`` equals ``mu_p`` and every ``sigma_i`` is equal. With the
    full ELBO weight (``beta = 1``) on a modest data set this pull wins: all weights
    of a tensor shrink to one value and the network predicts a constant (the
    class base rate; 10% accuracy on the 8x8 digits, the majority class on breast
    cancer). Graves (2011) himself, and :class:`tfbnn.layers.GravesDense` by default,
    use a *fixed* prior the user picks (``Normal(0, 1)`` for MNIST, ``Normal(0, 2)``
    for regression). Use the adaptive prior with a tempered ``beta < 1`` or check
    the accuracy it reaches.
    Given numbers, ``loc`` and/or ``scale`` are held fixed (the other, if None,
    is still fitted) and the KL is
    ``sum_i log(sigma_p / sigma_i) + (sigma_i^2 + (mu_i - mu_p)^2) / (2 sigma_p^2) - 1/2``.

    Pair it with the log-variance posterior of Graves (``sigma^2 = exp(rho)``):
    :class:`tfbnn.layers.GravesDense`, or
    ``DenseLocalReparameterization(..., kernel_prior="graves",
    scale_parameterization="log_variance")``. Graves pruned weights by their
    signal-to-noise ratio ``|mu| / sigma`` (:func:`tfbnn.pruning.snr_mask`).

    Args:
        loc: float or None (fitted), the prior mean.
        scale: float > 0 or None (fitted), the prior standard deviation; as for
            :class:`Normal`, in ``[1.18e-38, 2^62]``.

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
        self.loc = _check_loc(loc, allow_none=True)
        self.scale = _check_scale("scale", scale, allow_none=True)

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


def _weights_array(name, value):
    """``value`` as a read-only float32 array of finite numbers; a ValueError naming ``name`` otherwise."""
    if isinstance(value, (tf.Tensor, tf.Variable, keras.Variable)):
        value = keras.ops.convert_to_numpy(value)
    a = checks.array(name, value)
    if a.dtype.kind == "b":
        raise ValueError(f"Expected `{name}` to hold numbers, not booleans. Received: {name} of dtype {a.dtype}")
    with np.errstate(over="ignore"):
        a = np.array(a, dtype=np.float32)  # a copy: the prior never aliases the caller's array
    if not np.all(np.isfinite(a)):
        raise ValueError(f"Expected `{name}` to hold finite numbers that float32 represents. "
                         f"Received: {checks.value_range(name, value)}")
    a.setflags(write=False)
    return a


def _encode(a):
    """The bytes of ``a`` as little-endian float32 in C order, base64 (exact, ~5.3 characters per value)."""
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


def _decode(name, value, shape):
    """Inverse of :func:`_encode` for ``shape``; a nested list of numbers is accepted too."""
    if not isinstance(value, str):
        return value
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as e:
        raise ValueError(f"Expected `{name}` to be base64 text of float32 values ({e}). "
                         f"Received: {name}={value[:40]!r}...") from None
    size = math.prod(shape)
    if len(raw) != 4 * size:
        raise ValueError(f"Expected `{name}` to hold {size} float32 values ({4 * size} bytes) for shape "
                         f"{tuple(shape)}. Received: {name} with {len(raw)} bytes")
    return np.frombuffer(raw, dtype="<f4").reshape(shape)


@keras.saving.register_keras_serializable(package="tfbnn")
class Posterior(Prior):
    """A trained posterior, frozen, as the prior of the next task: ``N(w_i; m_i, s_i^2)`` per weight.

    Variational continual learning (Nguyen, Li, Bui, Turner 2018, eq. 4) updates the
    approximate posterior after each task ``t`` with data ``D_t`` by

        q_t(theta) = argmin_q KL(q(theta) || (1 / Z_t) q_{t-1}(theta) p(D_t | theta)),

    which, up to the constant ``log Z_t``, is the negative ELBO of task ``t`` with the
    previous posterior ``q_{t-1}`` as its prior::

        -E_q[log p(D_t | theta)] + KL(q || q_{t-1}).

    This prior holds the per-weight means ``m`` and standard deviations ``s`` of a
    trained mean-field Gaussian posterior as constants (they receive no gradient).
    Against the layer's posterior ``N(mu_i, sigma_i^2)`` the KL has the closed form,
    summed over the weights::

        KL = sum_i log(s_i / sigma_i) + (sigma_i^2 + (mu_i - m_i)^2) / (2 s_i^2) - 1/2
           = sum_i 0.5 (r_i^2 + z_i^2 - 1) - log r_i,   r_i = sigma_i / s_i,  z_i = (mu_i - m_i) / s_i

    (the second form is exactly 0 where the posterior equals the prior). It is the
    same value as ``tfd.kl_divergence(tfd.Normal(mu, sigma), tfd.Normal(m, s))``, summed.
    Build one from a layer with :func:`tfbnn.continual.posterior_as_prior`, or
    pass ``kernel_prior=Posterior(loc, scale)`` to a Bayes-by-Backprop dense or
    convolutional layer, whose kernel (or bias) must then have exactly ``loc``'s shape.

    Serialization: the config holds ``shape`` and ``loc`` / ``scale`` as base64 text of
    their little-endian float32 bytes (exact, about 5.3 characters per value), so the
    arrays travel with a layer's config through ``.keras`` files and ``get_config``.
    A million weights add about 11 MB to ``config.json``; the arrays also become
    constants of the traced train step.

    Args:
        loc: array-like of the prior means ``m`` (any shape; stored as float32), finite.
        scale: array-like of the prior standard deviations ``s``, the shape of
            ``loc``, every entry in ``[1.18e-38, 2^62]`` (see :class:`Normal`).

    Example:
        >>> p = Posterior(loc=[[0.5, -1.0]], scale=[[0.1, 0.2]])
        >>> p.shape
        (1, 2)
        >>> float(p.kl_divergence(tf.constant([[0.5, -1.0]]), tf.constant([[0.1, 0.2]])))
        0.0
        >>> Posterior.from_config(p.get_config()) == p
        True

    Reference:
        Nguyen, Li, Bui, Turner. Variational Continual Learning. ICLR 2018, eq. 4.
    """

    has_closed_form_kl = True

    def __init__(self, loc, scale):
        self.loc = _weights_array("loc", loc)
        self.scale = _weights_array("scale", scale)
        if self.scale.shape != self.loc.shape:
            raise ValueError(f"Expected `scale` to have the shape of `loc`, {self.loc.shape}. "
                             f"Received: scale of shape {self.scale.shape}")
        bad = ~((self.scale >= _MIN_SCALE) & (self.scale <= _MAX_SCALE))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"Expected `scale` to hold positive numbers in [{_MIN_SCALE:.3g}, {_MAX_SCALE:.3g}] (float32 "
                f"holds them and 1 / scale^2). Received: scale with {int(bad.sum())} of {bad.size} entries "
                f"outside, e.g. scale[{', '.join(map(str, where))}]={float(self.scale[where])!r}"
            )

    @property
    def shape(self):
        """The shape of the weight tensor this prior covers."""
        return self.loc.shape

    def check_shape(self, shape, name="prior"):
        shape = tuple(shape)
        if shape != self.shape:
            raise ValueError(f"Expected `{name}` to be a Posterior prior of the weights' shape {shape}. "
                             f"Received: {name}={self!r}")

    def distribution(self, dtype="float32"):
        """``tfd.Normal(m, s)`` with batch shape :attr:`shape`."""
        return tfd.Normal(tf.constant(self.loc, dtype), tf.constant(self.scale, dtype))

    def kl_divergence(self, loc, scale):
        """``sum_i KL(N(loc_i, scale_i^2) || N(m_i, s_i^2))`` (scalar); ``loc`` must have :attr:`shape`."""
        loc = tf.convert_to_tensor(loc)
        scale = tf.convert_to_tensor(scale, loc.dtype)
        self.check_shape(loc.shape, "prior")
        ratio = scale / tf.constant(self.scale, loc.dtype)
        z = (loc - tf.constant(self.loc, loc.dtype)) / tf.constant(self.scale, loc.dtype)
        return tf.reduce_sum(0.5 * (tf.square(ratio) + tf.square(z) - 1.0) - tf.math.log(ratio))

    def get_config(self):
        return {"shape": list(self.shape), "loc": _encode(self.loc), "scale": _encode(self.scale)}

    @classmethod
    def from_config(cls, config):
        shape = config.get("shape") if isinstance(config, dict) else None
        if (not isinstance(shape, (list, tuple)) or not all(checks.is_integer(d) and d >= 0 for d in shape)
                or not {"loc", "scale"} <= set(config)):
            raise ValueError("Expected `config` to be a dict with `shape` (a list of non-negative integers), "
                             f"`loc` and `scale`. Received: config={config!r:.200}")
        shape = tuple(int(d) for d in shape)
        return cls(_decode("loc", config["loc"], shape), _decode("scale", config["scale"], shape))

    def __eq__(self, other):
        return (type(self) is type(other) and self.shape == other.shape
                and np.array_equal(self.loc, other.loc) and np.array_equal(self.scale, other.scale))

    def __hash__(self):
        return hash((type(self).__name__, self.shape, self.loc.tobytes(), self.scale.tobytes()))

    def __repr__(self):
        if self.loc.size == 0:
            return f"Posterior(shape={self.shape})"
        return (f"Posterior(shape={self.shape}, loc in [{self.loc.min():.4g}, {self.loc.max():.4g}], "
                f"scale in [{self.scale.min():.4g}, {self.scale.max():.4g}])")


_ALIASES = {
    "normal": Normal,
    "gaussian": Normal,
    "scale_mixture": ScaleMixture,
    "blundell": ScaleMixture,
    "graves": Graves,
    "adaptive": Graves,
}


def serialize(prior):
    """Returns a JSON-able dict ``{"class_name": ..., "config": ...}``."""
    if not isinstance(prior, Prior):
        raise ValueError(f"Expected `prior` to be a tfbnn.priors.Prior. Received: prior={prior!r}")
    return {"class_name": type(prior).__name__, "config": prior.get_config()}


def deserialize(config):
    """Inverse of :func:`serialize`."""
    return get(config)


def get(identifier, name="prior"):
    """Resolves a prior from a name, a config dict or a :class:`Prior`.

    Args:
        identifier: ``"normal"``, ``"scale_mixture"`` (alias ``"blundell"``),
            ``"graves"`` (alias ``"adaptive"``: the fitted Gaussian of :class:`Graves`), a dict
            from :func:`serialize` (of any of these or of :class:`Posterior`, which
            has no name: it needs its arrays), or a :class:`Prior` instance (returned as is).
        name: the argument errors name (``"kernel_prior"`` for a layer's). Default ``"prior"``.

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
                f"Unknown prior. Expected one of {sorted(_ALIASES)}. Received: {name}={identifier!r}"
            )
        return cls()
    if isinstance(identifier, dict) and "class_name" in identifier:
        class_name = identifier["class_name"]
        classes = {c.__name__: c for c in (*_ALIASES.values(), Posterior)}
        config = identifier.get("config", {})
        if not isinstance(class_name, str) or class_name not in classes or not isinstance(config, dict):
            raise ValueError(
                f"Expected `{name}` to be a serialized prior of a class in {sorted(classes)} with a config "
                f"dict. Received: {name}={identifier!r}"
            )
        return classes[class_name].from_config(config)
    raise ValueError(
        f"Expected `{name}` to be a prior name, a serialized prior dict or a tfbnn.priors.Prior. "
        f"Received: {name}={identifier!r}"
    )
