"""Deterministic moment propagation (DVI, diagonal or full covariance): a one-pass predictive without random numbers.

Each activation of a network is summarised by a mean ``m`` and a per-unit variance ``v``
under the posterior, and those two are pushed through the layers in closed form, so a
trained Bayesian network gives its predictive mean and spread in one deterministic pass
(Wu et al. 2019, "Deterministic variational inference for robust Bayesian neural
networks"; Edward2's ``DenseDVI``). The rules, with a weight ``w ~ N(mu, s^2)``
independent of its input ``x`` (mean ``m``, variance ``v``):

* a mean-field Gaussian layer (Bayes-by-Backprop dense or convolution, any estimator:
  reparameterization, Flipout and local reparameterization share the posterior
  ``N(mu, sigma^2)``), or variational dropout's ``N(theta, alpha theta^2)``, with ``op``
  the layer's linear map (a matmul, a convolution)::

      mean = op(m, mu) + b_mu
      var  = op(v, mu^2 + s^2) + op(m^2, s^2) + b_s^2        (Var[x w] = v (mu^2 + s^2) + m^2 s^2)

  (Wu et al. 2019, eq. 4-5 with the covariances dropped); a deterministic
  ``keras.layers.Dense`` / ``Conv*D`` is the case ``s = 0``;
* ReLU, from the rectified Gaussian (Wu et al. 2019, eq. 10; Frey & Hinton 1999), with
  ``z = m / sqrt(v)``, ``Phi`` and ``phi`` the standard normal CDF and density::

      E[relu(a)]   = m Phi(z) + sqrt(v) phi(z)
      Var[relu(a)] = v [z^2 Phi(z) (1 - Phi(z)) + Phi(z) - phi(z)^2 + z phi(z) (1 - 2 Phi(z))]

  (the second moment ``(m^2 + v) Phi(z) + m sqrt(v) phi(z)`` minus the squared mean,
  rearranged so that no large terms cancel);
* MC dropout with rate ``p`` (``x * mask / (1 - p)``): ``mean = m``,
  ``var = v / (1 - p) + m^2 p / (1 - p)``;
* linear activations, ``Flatten``, ``Reshape``, ``Permute`` and Keras' ``Dropout``,
  ``GaussianDropout``, ``GaussianNoise`` and ``AlphaDropout`` (off at inference, as
  :func:`tfbnn.predict` runs them without ``mc_dropout``): as they are;
* the output softmax by the probit (mean-field) approximation (MacKay 1992; Lu, Ie & Sha
  2020; the same as :mod:`tfbnn.laplace`'s ``link_approx="probit"``)::

      p = softmax(m / sqrt(1 + pi/8 v))        (a sigmoid output: sigmoid(m / sqrt(1 + pi/8 v)))

  not Wu et al.'s own approximation of the softmax's expectation.

**Diagonal or full covariance.** By default (``covariance="diagonal"``) every unit is
treated as independent of the others: covariances between units are dropped. The rules
above are exact for the marginals of a layer whose inputs are independent (the first
Bayesian layer, and the layer after it when the first has a mean-field posterior and a
deterministic input); deeper in the network the units of a layer share the weights below
and are correlated, and the diagonal propagation understates the variance (on a trained
digits classifier by a factor measured in the Uncertainty guide). ``covariance="full"``
is Wu et al.'s method: the covariance ``C`` between the units of each dense activation is
propagated, ``(B, d, d)``, by

    dense:  mean = M^T m + b_mu,   Cov = M^T C M + diag(sum_i (C_ii + m_i^2) S_ij + s_b_j^2)

(``M``, ``S``: the kernel's means and variances; exact for any input independent of the
weights), MC dropout ``Cov = C + diag(C_ii (1/q - 1) + m_i^2 p / q)``, and ReLU by the
rectified bivariate Gaussian of every pair of units (:func:`relu_covariance`, with the
bivariate normal CDF :func:`bivariate_normal_cdf`); the GP layer takes the full input
covariance (``S = W^T C W / l``) and gives the logits' covariance. What stays approximate
is only that a pre-activation after the first random layer is taken as Gaussian (it is a
sum of products). Full covariance is kept between the units of flat ``(B, d)``
activations: convolutions of random inputs, Bayesian convolutions, spatial dropout and
reshapes of random units are refused by name (``covariance="diagonal"`` takes them); layers
that keep units independent (constants into a Bayesian dense layer, elementwise layers)
go by the diagonal rule, which is exact for them, until the first layer that correlates
its outputs. Cost: ``O(B d^2)`` memory and, per ReLU layer, ``O(B d^2)`` bivariate CDFs of
32 quadrature nodes each; a dense layer adds ``O(B d^3)``.

Supported layers (a clear ``ValueError`` naming the layer and its class otherwise): the
Bayes-by-Backprop dense and convolution layers with
``posterior="mean_field"`` (:class:`tfbnn.layers.DenseArguments` or
:class:`tfbnn.layers.ConvArguments` on :class:`tfbnn.layers.MeanFieldGaussian`),
:class:`tfbnn.layers.DenseVariationalDropout` and the variational-dropout convolutions
(their posterior is Gaussian too), :class:`tfbnn.layers.MCDropout` and
``MCSpatialDropout2D``, SNGP's layers (:class:`tfbnn.layers.SpectralNormalization`, ``SpectralDense``
and ``SpectralConv2D``: the affine map with the normalized kernel, deterministic at inference;
:class:`tfbnn.layers.RandomFeatureGaussianProcess` without ``normalize_input``: closed-form
moments of its random Fourier features of a Gaussian input, plus the GP's own variance,
:func:`random_feature_gp_moments`), ``keras.layers.Dense``, ``keras.layers.Conv1D/2D/3D``, ``Flatten``,
``Reshape``, ``Permute``, Keras' dropout and noise layers, ``Activation`` / ``ReLU`` /
``Softmax``, nested Sequential or functional models, and a :class:`tfbnn.GaussianHead` at the output. Activations: linear and
ReLU anywhere, softmax and sigmoid at the output only. The iBNN node layers are refused:
their mixture node noise assigns the mixture's components to rows (an ensemble inside the
layer), which has no one-pass moment form here. Low-rank posteriors are refused (their
weights are correlated). A layer in ``inference_mode="mean"`` propagates with zero weight
variance, as Monte Carlo prediction would sample it.

Example:
    >>> import keras, numpy as np, tfbnn
    >>> model = keras.Sequential([
    ...     keras.Input((3,)),
    ...     tfbnn.layers.DenseFlipout(8, activation="relu", seed=0),
    ...     tfbnn.layers.DenseFlipout(2, seed=1),
    ... ])
    >>> out = tfbnn.moments.propagate(model, np.ones((4, 3), "float32"))
    >>> out.mean.shape, bool(np.all(out.variance.numpy() > 0)), out.link
    (TensorShape([4, 2]), True, None)

References:
    Wu, Nowozin, Meeds, Turner, Hernandez-Lobato, Gaunt. Deterministic Variational
    Inference for Robust Bayesian Neural Networks. ICLR 2019 (eq. 4-5, 10; sec. 3.2 for
    the full covariance).
    Frey, Hinton. Variational Learning in Nonlinear Gaussian Belief Networks. Neural
    Computation 11, 1999 (the rectified Gaussian's moments).
    MacKay. The Evidence Framework Applied to Classification Networks. Neural
    Computation 4(5), 1992 (the probit approximation).
    Lu, Ie, Sha. Mean-Field Approximation to Gaussian-Softmax Integral with Application
    to Uncertainty Estimation. arXiv:2006.07584, 2020.
"""

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.layers.arguments import ConvArguments, ConvTransposeArguments, DenseArguments
from tfbnn.layers.base import StochasticLayer
from tfbnn.layers.gp import RandomFeatureGaussianProcess
from tfbnn.layers.mc_dropout import MCDropout, MCSpatialDropout2D
from tfbnn.layers.mean_field import MeanFieldGaussian
from tfbnn.layers.node import NodeLayer
from tfbnn.layers.spectral import SpectralNormalization
from tfbnn.layers.variational_dropout import VariationalDropoutLayer
from tfbnn.likelihoods import DistributionHead, GaussianHead

__all__ = ["OutputMoments", "propagate", "relu_moments", "relu_covariance", "bivariate_normal_cdf", "probit_softmax",
           "probit_sigmoid", "gaussian_expectation", "random_feature_gp_moments", "model_layers", "LINKS",
           "COVARIANCES"]

#: What :attr:`OutputMoments.link` can be: the output nonlinearity left out of the propagated moments.
LINKS = (None, "softmax", "sigmoid", "gaussian_head")
# Beyond |z| = 40 the normal CDF is 0 or 1 and the density 0 in float32 and float64: clipping z
# there changes nothing but keeps z^2 (a variance of 1e-30 under a mean of 1e4) from overflowing.
_Z_MAX = 40.0
_HERMITE_POINTS = 32
#: What ``propagate(..., covariance=)`` keeps between the units of a layer: their variances, or their covariance matrix.
COVARIANCES = ("diagonal", "full")
# Gauss-Legendre nodes of the bivariate normal CDF's one-dimensional integral: 32 with the cubic
# substitution below keep it within 5e-7 of an adaptive quadrature, |rho| up to 1 - 1e-6 included.
_BVN_POINTS = 32
_BVN_SWITCH = 0.7


def relu_moments(mean, variance):
    """Mean and variance of ``relu(a)`` for ``a ~ N(mean, variance)``, elementwise (the rectified Gaussian).

    With ``s = sqrt(variance)``, ``z = mean / s`` (Frey & Hinton 1999; Wu et al. 2019, eq. 10)::

        E[relu(a)]   = mean Phi(z) + s phi(z)
        Var[relu(a)] = s^2 [z^2 Phi(z) Phi(-z) + Phi(z) - phi(z)^2 + z phi(z) (Phi(-z) - Phi(z))]

    A variance of 0 gives ``(relu(mean), 0)``. The variance form needs no subtraction of
    large numbers (``E[relu^2] - E[relu]^2`` would lose it all in float32 when ``|z|`` is
    large); it is clipped at 0 against round-off.

    Args:
        mean: float tensor or array.
        variance: float tensor or array >= 0, broadcastable against ``mean``.

    Returns:
        ``(mean, variance)`` of the rectified variable, tensors in the dtype of ``mean``.

    Example:
        >>> import numpy as np, tfbnn
        >>> m, v = tfbnn.moments.relu_moments(np.float32([0.0, 3.0]), np.float32([1.0, 0.0]))
        >>> np.round(m.numpy(), 4), np.round(v.numpy(), 4)   # 1/sqrt(2 pi), 1/2 - 1/(2 pi)
        (array([0.3989, 3.    ], dtype=float32), array([0.3408, 0.    ], dtype=float32))
    """
    mean, variance = _moment_pair(mean, variance)
    mean, variance = mean + tf.zeros_like(variance), variance + tf.zeros_like(mean)
    positive = variance > 0
    std = tf.sqrt(tf.where(positive, variance, tf.ones_like(variance)))
    z = tf.clip_by_value(mean / std, -_Z_MAX, _Z_MAX)
    cdf, tail = 0.5 * tf.math.erfc(-z / math.sqrt(2.0)), 0.5 * tf.math.erfc(z / math.sqrt(2.0))
    pdf = tf.exp(-0.5 * tf.square(z)) / math.sqrt(2.0 * math.pi)
    first = mean * cdf + std * pdf
    spread = tf.square(z) * cdf * tail + cdf - tf.square(pdf) + z * pdf * (tail - cdf)
    second = tf.maximum(tf.square(std) * spread, 0.0)
    return tf.where(positive, first, tf.nn.relu(mean)), tf.where(positive, second, tf.zeros_like(second))


def _normal_cdf(x):
    return 0.5 * tf.math.erfc(-x / math.sqrt(2.0))


def _normal_sf(x):
    return 0.5 * tf.math.erfc(x / math.sqrt(2.0))


def _normal_pdf(x):
    return tf.exp(-0.5 * tf.square(x)) / math.sqrt(2.0 * math.pi)


def _cdf_difference(x, y):
    """``Phi(x) - Phi(y)``, from the upper tails where both are near 1 (no cancellation of two numbers near 1)."""
    return tf.where(x + y > 0, _normal_sf(y) - _normal_sf(x), _normal_cdf(x) - _normal_cdf(y))


def _bvn_dependence(h, k, rho):
    """``Phi_2(h, k; rho) - Phi(h) Phi(k)`` elementwise, by a 32-node Gauss-Legendre rule (see :func:`bivariate_normal_cdf`)."""
    dtype = h.dtype
    tiny = np.finfo(dtype.as_numpy_dtype).tiny
    negative = rho < 0
    k = tf.where(negative, -k, k)                   # Phi_2(h, k; rho) - Phi(h) Phi(k) = -[the same at (h, -k; -rho)]
    r = tf.minimum(tf.abs(rho), 1.0)
    low = r < _BVN_SWITCH
    a, b = 0.5 * (tf.square(h) + tf.square(k)), h * k
    half_gap = 0.5 * tf.square(h - k)
    theta_top = tf.asin(tf.where(low, r, tf.zeros_like(r)))
    psi_top = tf.acos(tf.where(low, tf.ones_like(r), r))
    nodes, weights = np.polynomial.legendre.leggauss(_BVN_POINTS)
    nodes = tf.constant(0.5 * (nodes + 1.0), dtype)   # on [0, 1]
    weights = tf.constant(0.5 * weights, dtype)

    def add_node(i, total):
        u, w = nodes[i], weights[i]
        s = tf.sin(theta_top * u)                     # rho < 0.7: t = asin(rho) u, the integrand in sin t
        theta_value = tf.exp(-tf.maximum(a - b * s, 0.0) / (1.0 - tf.square(s)))
        p = psi_top * u**3                            # rho >= 0.7: p = acos(rho) u^3 clusters the nodes near p = 0
        exponent = half_gap / tf.maximum(tf.square(tf.sin(p)), tiny) + b / (2.0 * tf.square(tf.cos(0.5 * p)))
        psi_value = (3.0 * u * u) * tf.exp(-tf.maximum(exponent, 0.0))
        return i + 1, total + w * tf.where(low, theta_value, psi_value)

    # A loop rather than 32 unrolled copies: a traced export of a full-covariance network stays small.
    _, total = tf.while_loop(lambda i, _: i < _BVN_POINTS, add_node, (tf.constant(0), tf.zeros_like(a)))
    integral = total * tf.where(low, theta_top, psi_top) / (2.0 * math.pi)
    upper = _normal_cdf(tf.minimum(h, k)) * _normal_sf(tf.maximum(h, k)) - integral
    dependence = tf.where(low, integral, upper)
    return tf.where(negative, -dependence, dependence)


def bivariate_normal_cdf(h, k, rho):
    """``P(U <= h, V <= k)`` for standard normal ``U, V`` with correlation ``rho``, elementwise.

    From Plackett's identity ``d Phi_2 / d rho = phi_2(h, k; rho)`` (the bivariate density),
    integrated from ``rho = 0`` (``Phi(h) Phi(k)``) for ``|rho| < 0.7`` and down from
    ``rho = 1`` (``Phi(min(h, k))``) above (Drezner & Wesolowsky 1990's two forms), with
    ``a = (h^2 + k^2) / 2`` and ``b = h k``::

        Phi_2 = Phi(h) Phi(k) + 1/(2 pi) int_0^{asin rho} exp(-(a - b sin t) / cos^2 t) dt           (0 <= rho < 0.7)
        Phi_2 = Phi(min(h, k)) - 1/(2 pi) int_0^{acos rho} exp(-(a - b cos p) / sin^2 p) dp          (rho >= 0.7)

    and ``Phi_2(h, k; rho) = Phi(h) - Phi_2(h, -k; -rho)`` for ``rho < 0``. Each integral is
    a 32-node Gauss-Legendre rule, the second after ``p = acos(rho) u^3`` (its integrand
    has a boundary layer at ``p = 0`` when ``h`` is near ``k``), written as
    ``(h - k)^2 / (2 sin^2 p) + b / (2 cos^2(p / 2))`` so that nothing cancels: within
    5e-7 of an adaptive quadrature in float64 for ``|rho|`` up to 1 (``rho = +-1``: the
    limits ``Phi(min(h, k))`` and ``max(0, Phi(h) - Phi(-k))``). The ReLU covariance of
    :func:`relu_covariance` uses it.

    Args:
        h, k: float tensors or arrays, the upper limits.
        rho: float tensor or array in [-1, 1], broadcastable against ``h`` and ``k``
            (clipped to [-1, 1] against round-off).

    Returns:
        A tensor of probabilities in [0, 1], broadcast from the three, in the dtype of ``h``.

    Example:
        >>> import numpy as np, tfbnn
        >>> p = tfbnn.moments.bivariate_normal_cdf(np.float64([0.0, 0.0, 1.0]), np.float64([0.0, 0.0, 1.0]),
        ...                                        np.float64([0.0, 0.5, 1.0]))
        >>> np.round(p.numpy(), 6)            # 1/4, 1/4 + asin(1/2) / (2 pi) = 1/3, Phi(1)
        array([0.25    , 0.333333, 0.841345])

    References:
        Plackett. A Reduction Formula for Normal Multivariate Integrals. Biometrika 41, 1954.
        Drezner, Wesolowsky. On the Computation of the Bivariate Normal Integral. Journal of
        Statistical Computation and Simulation 35, 1990.
    """
    h = checks.float_tensor("h", h)
    k = tf.cast(checks.float_tensor("k", k), h.dtype)
    rho = tf.cast(checks.float_tensor("rho", rho), h.dtype)
    try:
        shape = tf.broadcast_static_shape(tf.broadcast_static_shape(h.shape, k.shape), rho.shape)
    except ValueError:
        raise ValueError(f"Expected `h`, `k` and `rho` of broadcastable shapes. Received: h.shape={tuple(h.shape)}, "
                         f"k.shape={tuple(k.shape)}, rho.shape={tuple(rho.shape)}") from None
    if tf.executing_eagerly():
        finite = bool(tf.reduce_all(tf.math.is_finite(rho))) and bool(tf.reduce_all(tf.abs(rho) <= 1.0 + 1e-6))
        if not finite:
            raise ValueError("Expected `rho` to hold correlations in [-1, 1]. Received: "
                             f"{checks.value_range('rho', rho.numpy())}")
        for name, value in (("h", h), ("k", k)):
            if bool(tf.reduce_any(tf.math.is_nan(value))):
                raise ValueError(f"Expected `{name}` without NaN. Received: {checks.value_range(name, value.numpy())}")
    h, k = h + tf.zeros(shape, h.dtype), k + tf.zeros(shape, h.dtype)
    rho = tf.clip_by_value(rho + tf.zeros(shape, h.dtype), -1.0, 1.0)
    h, k = (tf.clip_by_value(t, -_Z_MAX, _Z_MAX) for t in (h, k))
    return tf.clip_by_value(_normal_cdf(h) * _normal_cdf(k) + _bvn_dependence(h, k, rho), 0.0, 1.0)


def relu_covariance(mean, covariance):
    """Mean and covariance of ``relu(a)`` for a Gaussian vector ``a ~ N(mean, covariance)``: the rectified
    bivariate Gaussian, pair by pair (Wu et al. 2019, sec. 3.2, with the exact bivariate normal CDF).

    For units ``i, j`` with ``s_i = sqrt(C_ii)``, ``z_i = mean_i / s_i``, correlation
    ``rho = C_ij / (s_i s_j)`` and ``r = sqrt(1 - rho^2)`` (from the moments of a truncated
    bivariate normal, Rosenbaum 1961)::

        E[relu(a_i) relu(a_j)] = s_i s_j [ (z_i z_j + rho) Phi_2(z_i, z_j; rho)
                                           + z_i phi(z_j) Phi((z_i - rho z_j) / r)
                                           + z_j phi(z_i) Phi((z_j - rho z_i) / r)
                                           + r / (2 pi) exp(-(z_i^2 - 2 rho z_i z_j + z_j^2) / (2 r^2)) ]

    minus ``E[relu(a_i)] E[relu(a_j)]`` (:func:`relu_moments`), rearranged so that the parts
    that cancel are computed as differences (``Phi_2 - Phi Phi``, ``Phi(x) - Phi(y)``). The
    diagonal is :func:`relu_moments`' variance; a unit with variance 0 has no covariance.
    ``rho = 0`` gives 0. Cost ``O(d^2)`` per example with 32 quadrature nodes per pair
    (:func:`bivariate_normal_cdf`).

    Args:
        mean: float tensor ``(..., d)``.
        covariance: float tensor ``(..., d, d)``, symmetric positive semi-definite.

    Returns:
        ``(mean, covariance)`` of the rectified vector, ``(..., d)`` and ``(..., d, d)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> m, c = tfbnn.moments.relu_covariance(np.zeros((1, 2), "float64"), np.ones((1, 2, 2)))  # a_1 = a_2
        >>> float(c[0, 0, 1]) == float(c[0, 0, 0]), round(float(c[0, 0, 1]), 4)   # 1/2 - 1/(2 pi)
        (True, 0.3408)

    References:
        Wu et al. Deterministic Variational Inference for Robust Bayesian Neural Networks. ICLR 2019.
        Rosenbaum. Moments of a Truncated Bivariate Normal Distribution. JRSS B 23, 1961.
    """
    mean = checks.float_tensor("mean", mean)
    covariance = tf.cast(checks.float_tensor("covariance", covariance), mean.dtype)
    d = mean.shape[-1] if mean.shape.rank else None
    if d is None or covariance.shape.rank != mean.shape.rank + 1 or (
            covariance.shape[-2:] != (d, d)) or covariance.shape[:-2] != mean.shape[:-1]:
        raise ValueError(f"Expected `covariance` of shape (..., d, d) for `mean` of shape (..., d). Received: "
                         f"mean.shape={tuple(mean.shape)}, covariance.shape={tuple(covariance.shape)}")
    if tf.executing_eagerly():
        if not bool(tf.reduce_all(tf.math.is_finite(mean))):
            raise ValueError(f"Expected `mean` to hold finite numbers. Received: "
                             f"{checks.value_range('mean', mean.numpy())}")
        diagonal = tf.linalg.diag_part(covariance)
        if not (bool(tf.reduce_all(tf.math.is_finite(covariance))) and bool(tf.reduce_all(diagonal >= 0))):
            raise ValueError("Expected `covariance` to hold finite numbers with a diagonal >= 0. Received: "
                             f"{checks.value_range('covariance', covariance.numpy())}")
    return _relu_covariance(mean, covariance)


def _relu_covariance(mean, covariance):
    dtype = mean.dtype
    tiny = np.finfo(dtype.as_numpy_dtype).tiny
    variance = tf.maximum(tf.linalg.diag_part(covariance), 0.0)
    out_mean, out_variance = relu_moments(mean, variance)
    positive = variance > 0
    std = tf.sqrt(tf.where(positive, variance, tf.ones_like(variance)))
    z = tf.where(positive, tf.clip_by_value(mean / std, -_Z_MAX, _Z_MAX), tf.zeros_like(mean))
    z1, z2 = z[..., :, None], z[..., None, :]
    scale = std[..., :, None] * std[..., None, :]
    both_random = tf.logical_and(positive[..., :, None], positive[..., None, :])
    rho = tf.clip_by_value(tf.where(both_random, covariance / scale, tf.zeros_like(scale)), -1.0, 1.0)
    r2 = tf.maximum(1.0 - tf.square(rho), 0.0)
    r = tf.sqrt(r2)
    safe_r = tf.maximum(r, tiny)
    dependence = _bvn_dependence(z1, z2, rho)
    joint = _normal_cdf(z1) * _normal_cdf(z2) + dependence
    a1 = tf.clip_by_value((z1 - rho * z2) / safe_r, -_Z_MAX, _Z_MAX)
    a2 = tf.clip_by_value((z2 - rho * z1) / safe_r, -_Z_MAX, _Z_MAX)
    quadratic = tf.maximum(tf.square(z1) - 2.0 * rho * z1 * z2 + tf.square(z2), 0.0)
    density = (r * tf.exp(-quadratic / (2.0 * tf.maximum(r2, tiny)))
               - tf.exp(-0.5 * (tf.square(z1) + tf.square(z2)))) / (2.0 * math.pi)
    bracket = (z1 * z2 * dependence + rho * joint + z1 * _normal_pdf(z2) * _cdf_difference(a1, z1)
               + z2 * _normal_pdf(z1) * _cdf_difference(a2, z2) + density)
    cov = tf.where(both_random, scale * bracket, tf.zeros_like(scale))
    cov = 0.5 * (cov + tf.linalg.matrix_transpose(cov))
    return out_mean, tf.linalg.set_diag(cov, out_variance)


def _moment_pair(mean, variance):
    """``mean`` and ``variance`` as float tensors of one dtype and broadcastable shapes; else a ValueError naming
    the argument."""
    mean = checks.float_tensor("mean", mean)
    variance = tf.cast(checks.float_tensor("variance", variance), mean.dtype)
    try:
        tf.broadcast_static_shape(mean.shape, variance.shape)
    except ValueError:
        raise ValueError(f"Expected `variance` shaped like `mean` (or broadcastable to it). Received: "
                         f"mean.shape={tuple(mean.shape)}, variance.shape={tuple(variance.shape)}") from None
    return mean, variance


def _probit_scaled(mean, variance):
    mean, variance = _moment_pair(mean, variance)
    return mean / tf.sqrt(1.0 + (math.pi / 8.0) * variance)


def probit_softmax(mean, variance, axis=-1):
    """The probit (mean-field) approximation of ``E[softmax(a)]`` for ``a ~ N(mean, diag(variance))``.

    ``softmax(mean / sqrt(1 + pi/8 variance))`` (MacKay 1992 for two classes; Lu, Ie & Sha
    2020 for the softmax): each logit is shrunk towards 0 by its own variance, so
    uncertain logits give flatter probabilities. Not Wu et al.'s approximation.

    Args:
        mean, variance: float tensors ``(..., C)`` of the logits' means and variances (>= 0).
        axis: the class axis.

    Returns:
        Probabilities ``(..., C)``, summing to 1 along ``axis``.

    Example:
        >>> import numpy as np, tfbnn
        >>> p = tfbnn.moments.probit_softmax(np.float32([[2.0, 0.0]]), np.float32([[8 / np.pi * 3, 0.0]]))
        >>> np.round(p.numpy(), 4)                 # softmax([2 / sqrt(4), 0]) = softmax([1, 0])
        array([[0.7311, 0.2689]], dtype=float32)
    """
    scaled = _probit_scaled(mean, variance)
    rank = scaled.shape.rank
    axis = checks.integer("axis", axis, -rank if rank else None, rank - 1 if rank else None)
    return tf.nn.softmax(scaled, axis=axis)


def probit_sigmoid(mean, variance):
    """MacKay's (1992) probit approximation ``E[sigmoid(a)] ~ sigmoid(mean / sqrt(1 + pi/8 variance))``.

    Args:
        mean, variance: float tensors of the logit's mean and variance (>= 0).

    Returns:
        Probabilities shaped like ``mean``.

    Example:
        >>> import numpy as np, tfbnn
        >>> float(tfbnn.moments.probit_sigmoid(np.float32(0.0), np.float32(5.0)))
        0.5
    """
    return tf.sigmoid(_probit_scaled(mean, variance))


def gaussian_expectation(fn, mean, variance, points=_HERMITE_POINTS):
    """``E[fn(a)]`` for ``a ~ N(mean, variance)`` elementwise, by Gauss-Hermite quadrature (no random numbers).

    ``E[fn(a)] ~ (1 / sqrt(pi)) sum_i w_i fn(mean + sqrt(2 variance) x_i)`` with the
    ``points`` nodes ``x_i`` and weights ``w_i`` of ``numpy.polynomial.hermite.hermgauss``:
    exact for polynomials of degree up to ``2 points - 1``, and accurate for smooth ``fn``
    such as a softplus scale.

    Args:
        fn: elementwise TensorFlow function.
        mean, variance: float tensors of the same shape (variance >= 0).
        points: int >= 1, the number of nodes. Default 32.

    Returns:
        A tensor shaped like ``mean``.

    Example:
        >>> import numpy as np, tensorflow as tf, tfbnn
        >>> e = tfbnn.moments.gaussian_expectation(tf.square, np.float32([1.0]), np.float32([4.0]))
        >>> np.round(e.numpy(), 4)                    # m^2 + v
        array([5.], dtype=float32)
    """
    if not isinstance(points, (int, np.integer)) or isinstance(points, bool) or points < 1:
        raise ValueError(f"Expected `points` to be an int >= 1. Received: points={points!r}")
    if not callable(fn):
        raise ValueError(f"Expected `fn` to be an elementwise function. Received: fn={fn!r}")
    mean, variance = _moment_pair(mean, variance)
    nodes, weights = np.polynomial.hermite.hermgauss(int(points))
    nodes = tf.constant(nodes, mean.dtype)
    weights = tf.constant(weights / np.sqrt(np.pi), mean.dtype)
    std = tf.sqrt(2.0 * tf.maximum(variance, 0.0))
    values = fn(mean[..., None] + std[..., None] * nodes)
    return tf.reduce_sum(values * weights, axis=-1)


def _entropy(probs):
    safe = tf.where(probs > 0, probs, tf.ones_like(probs))
    return -tf.reduce_sum(probs * tf.math.log(safe), axis=-1)


@dataclasses.dataclass(frozen=True)
class OutputMoments:
    """The propagated moments of a model's output, and the output nonlinearity they stop before.

    Attributes:
        mean: tensor ``(B, ...)``, the propagated mean of the outputs; when ``link`` is
            ``"softmax"`` or ``"sigmoid"``, of the logits (the output layer's
            pre-activations), and for ``"gaussian_head"`` of the head's inputs ``[m, r]``.
        variance: tensor like ``mean``, the per-unit variance.
        link: one of :data:`LINKS`: ``None`` (the outputs themselves), ``"softmax"`` or
            ``"sigmoid"`` (the model's output activation, applied by :meth:`probabilities`
            through the probit approximation), ``"gaussian_head"`` (a
            :class:`tfbnn.GaussianHead` at the output).
        head: the :class:`tfbnn.GaussianHead` when ``link == "gaussian_head"``, else None.
        covariance: with ``propagate(..., covariance="full")``, the covariance ``(B, n, n)``
            between the ``n`` (flattened) output units, whose diagonal is ``variance``;
            None with the diagonal rule.
    """

    mean: tf.Tensor
    variance: tf.Tensor
    link: str = None
    head: GaussianHead = None
    covariance: tf.Tensor = None

    def probabilities(self, from_logits=False):
        """Class probabilities ``(B, C)`` by the probit approximation (a one-unit sigmoid as two classes).

        Args:
            from_logits: bool: the outputs are logits (``link`` None): apply a softmax
                (sigmoid for one unit).

        Returns:
            A float tensor ``(B, C)`` (``C = 2`` for one sigmoid unit: ``[1 - p, p]``).
        """
        link = self.link
        if link is None and from_logits:
            link = "sigmoid" if self.mean.shape[-1] == 1 else "softmax"
        if link == "softmax":
            return probit_softmax(self.mean, self.variance)
        if link == "sigmoid":
            if self.mean.shape[-1] != 1:
                raise ValueError("Expected one sigmoid output unit for a classification predictive (more are "
                                 f"independent labels). Received: outputs of shape {tuple(self.mean.shape)}")
            p = probit_sigmoid(self.mean, self.variance)
            return tf.concat([1.0 - p, p], axis=-1)
        raise ValueError("Class probabilities need a softmax or sigmoid output (or logits, from_logits=True). "
                         f"Received: link={self.link!r}, from_logits={from_logits!r}")

    def summary(self, task=None, from_logits=False):
        """The one-pass predictive summary as a dict of tensors.

        Classification: ``mean_probs`` (:meth:`probabilities`) and ``predictive_entropy``
        ``H[mean_probs]`` (nats). The split into expected entropy (aleatoric) and mutual
        information (epistemic) needs the distribution of the probabilities, which two
        moments of the logits do not give: it is not part of this summary.
        Regression: ``mean`` and ``epistemic_std = sqrt(variance)``; behind a
        :class:`tfbnn.GaussianHead` ``[m, r]``, ``mean = E[m]``, ``epistemic_std =
        sqrt(Var[m])`` and ``aleatoric_std = sqrt(E[(softplus(r) + min_scale)^2])`` by
        Gauss-Hermite quadrature over ``r ~ N(mean_r, var_r)`` (the law of total
        variance, as :func:`tfbnn.predict` splits Monte Carlo samples). ``r`` is taken
        as Gaussian with its propagated moments (DVI's assumption; a sum of rectified
        terms is not exactly Gaussian), so ``aleatoric_std`` is an approximation even
        where the moments are exact, as are the probit probabilities.

        Args:
            task: ``"classification"``, ``"regression"`` or None (default: classification
                for a softmax or sigmoid output or ``from_logits``, else regression).
            from_logits: bool, the outputs are logits.

        Returns:
            A dict of float tensors, ``(B, C)`` / ``(B,)`` or ``(B, ..., d)``.
        """
        task = self.task(task, from_logits)
        if task == "classification":
            probs = self.probabilities(from_logits)
            return {"mean_probs": probs, "predictive_entropy": _entropy(probs)}
        if self.link == "gaussian_head":
            d = self.mean.shape[-1] // 2
            head = self.head

            def squared_scale(r):
                return tf.square(tf.nn.softplus(r) + tf.cast(head.min_scale, r.dtype))

            aleatoric = gaussian_expectation(squared_scale, self.mean[..., d:], self.variance[..., d:])
            return {"mean": self.mean[..., :d], "epistemic_std": tf.sqrt(self.variance[..., :d]),
                    "aleatoric_std": tf.sqrt(aleatoric)}
        return {"mean": self.mean, "epistemic_std": tf.sqrt(self.variance)}

    def task(self, task=None, from_logits=False):
        """``"classification"`` or ``"regression"``: ``task`` checked against the output, or read from it."""
        if task not in (None, "auto", "classification", "regression"):
            raise ValueError(f"Expected `task` in (None, 'auto', 'classification', 'regression'). Received: task={task!r}")
        classifies = self.link in ("softmax", "sigmoid") or (self.link is None and from_logits)
        if task in (None, "auto"):
            return "classification" if classifies else "regression"
        if task == "classification" and not classifies:
            raise ValueError("A moment-propagated classification predictive needs the model to end in a softmax or "
                             "sigmoid (or logits with from_logits=True): the approximation is applied to the logits' "
                             f"moments. Received: task='classification', an output with link={self.link!r}")
        if task == "regression" and self.link in ("softmax", "sigmoid"):
            raise ValueError(f"The model ends in a {self.link}: a classifier. Received: task='regression'")
        return task


# -- the layers of a model ---------------------------------------------------------------------
def _refuse(layer, why):
    raise ValueError(f"Moment propagation does not support layer '{layer.name}' (class {type(layer).__name__}): "
                     f"{why}. Use Monte Carlo prediction (method='monte_carlo') for this model.")


def _is_chain(model, layers):
    """Whether ``model``'s (functional) graph is the chain ``layers``: one input, each layer fed by the last."""
    try:
        if len(model.inputs) != 1 or len(model.outputs) != 1:
            return False
        previous = model.inputs[0]
        for layer in layers:
            if layer.input is not previous:
                return False
            previous = layer.output
        return previous is model.outputs[0]
    except (AttributeError, ValueError, TypeError):
        return False


def model_layers(model):
    """The layers of a Sequential or functional model whose layers form a chain, nested models expanded.

    Args:
        model: a ``keras.Sequential``, or a functional ``keras.Model`` with one input and
            one output whose layers each take the previous layer's output.

    Returns:
        The list of layers in order (``InputLayer`` left out).

    Raises:
        ValueError: for another model (a subclassed model, a graph with branches), naming its class.
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected a keras.Model. Received: model of type {type(model).__name__}")
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if not isinstance(model, keras.Sequential) and not _is_chain(model, layers):
        raise ValueError("Moment propagation and frozen export walk a Sequential or functional model whose layers "
                         "form a chain (one input, each layer fed by the previous one). "
                         f"Received: model '{model.name}' of type {type(model).__name__}, whose layers are "
                         + ", ".join(f"'{layer.name}' ({type(layer).__name__})" for layer in layers))
    flat = []
    for layer in layers:
        flat.extend(model_layers(layer) if isinstance(layer, keras.Model) else [layer])
    return flat


def _activation_name(activation):
    if activation is None:
        return "linear"
    return getattr(activation, "__name__", repr(activation))


def _activation(layer, name, mean, spread, last, relu=relu_moments):
    """The moments through the activation ``name``; a softmax / sigmoid at the output becomes the link.

    ``spread``: the variance (``relu``: :func:`relu_moments`) or the covariance (:func:`_relu_covariance`)."""
    if name == "linear":
        return mean, spread, None
    if name == "relu":
        return (*relu(mean, spread), None)
    if name in ("softmax", "sigmoid") and last:
        return mean, spread, name
    _refuse(layer, f"its activation {name!r} has no moment rule here (supported: linear and relu anywhere, softmax "
                   "and sigmoid at the output)")


def _pass_through(layer, mean, spread, last, relu=relu_moments):
    """``(mean, spread, link)`` after an identity at inference, an activation layer or an output head; None for
    another layer."""
    if isinstance(layer, _INFERENCE_IDENTITY):  # off at inference
        return mean, spread, None
    if isinstance(layer, keras.layers.Activation):
        return _activation(layer, _activation_name(layer.activation), mean, spread, last, relu)
    if isinstance(layer, keras.layers.ReLU):
        if layer.max_value is not None or layer.negative_slope or layer.threshold:
            _refuse(layer, "only the plain ReLU (no max_value, negative_slope or threshold) has a moment rule")
        return _activation(layer, "relu", mean, spread, last, relu)
    if isinstance(layer, keras.layers.Softmax):
        if layer.axis not in (-1, len(mean.shape) - 1):
            _refuse(layer, f"a softmax over axis {layer.axis} (not the last)")
        return _activation(layer, "softmax", mean, spread, last, relu)
    if isinstance(layer, GaussianHead) and last:
        return mean, spread, "gaussian_head"
    return None


def _sampling(layer):
    return not (isinstance(layer, StochasticLayer) and layer.inference_mode == "mean")


def _linear_moments(apply, add_bias, mean, variance, loc, weight_variance, bias, bias_variance):
    """``op(m, mu) + b`` and ``op(v, mu^2 + s^2) + op(m^2, s^2) + b_s^2`` for a bilinear ``op`` (``apply``)."""
    out_mean = apply(mean, loc)
    if weight_variance is None:
        out_variance = apply(variance, tf.square(loc))
    else:
        out_variance = apply(variance, tf.square(loc) + weight_variance) + apply(tf.square(mean), weight_variance)
    if bias is not None:
        out_mean = add_bias(out_mean, bias)
    if bias_variance is not None:
        out_variance = add_bias(out_variance, bias_variance)
    return out_mean, out_variance


def _bayesian_kernel_moments(layer, mean, variance):
    if not isinstance(layer, (DenseArguments, ConvArguments)) or isinstance(layer, ConvTransposeArguments):
        _refuse(layer, "its linear map is not a dense layer or a convolution (transposed convolutions not yet)")
    loc, weight_variance, bias, bias_variance = _kernel_posterior(layer)
    return _linear_moments(layer.forward, layer.add_bias, mean, variance, loc, weight_variance, bias, bias_variance)


def _kernel_posterior(layer):
    """``(kernel mean, kernel variance or None, bias mean or None, bias variance or None)`` of a Bayesian layer
    (variances None in ``inference_mode="mean"``); a low-rank posterior is refused."""
    if getattr(layer, "low_rank", False):
        _refuse(layer, "its posterior is low rank (posterior='low_rank'): its weights are correlated")
    sampling = _sampling(layer)
    bias = layer.bias_loc if layer.use_bias else None
    weight_variance = bias_variance = None
    if isinstance(layer, VariationalDropoutLayer):
        weight_variance = layer.kernel_variance() if sampling else None
    else:
        weight_variance = tf.square(layer.kernel_scale()) if sampling else None
        if sampling and layer.bayesian_bias:
            bias_variance = tf.square(layer.bias_scale())
    return tf.convert_to_tensor(layer.kernel_loc), weight_variance, bias, bias_variance


def _keras_bias(layer):
    def add(outputs, bias):
        if getattr(layer, "data_format", "channels_last") == "channels_first":
            bias = tf.reshape(bias, [-1] + [1] * (len(outputs.shape) - 2))
        return outputs + tf.cast(bias, outputs.dtype)
    return add


def _keras_moments(layer, mean, variance):
    bias = layer.bias if layer.use_bias else None
    if isinstance(layer, keras.layers.Dense):
        def apply(x, kernel):
            return keras.ops.matmul(x, kernel)
    else:
        apply = layer.convolution_op
    return _linear_moments(apply, _keras_bias(layer), mean, variance, tf.convert_to_tensor(layer.kernel), None,
                           bias, None)


def _spectral_moments(layer, mean, variance):
    """A spectrally normalized ``Dense`` / ``Conv2D`` at inference: the affine map with the normalized kernel."""
    inner = layer.layer
    kernel = layer.normalized_kernel(training=False)
    bias = inner.bias if inner.use_bias else None
    if isinstance(inner, keras.layers.Conv2D):
        def apply(x, w):
            return keras.ops.conv(x, w, strides=inner.strides, padding=inner.padding, data_format=inner.data_format,
                                  dilation_rate=inner.dilation_rate)
    else:
        def apply(x, w):
            return keras.ops.matmul(x, w)
    mean, variance = _linear_moments(apply, _keras_bias(inner), mean, variance, kernel, None, bias, None)
    return mean, variance, inner.activation


def random_feature_gp_moments(layer, mean, variance):
    """Mean and variance of the logits of a :class:`tfbnn.layers.RandomFeatureGaussianProcess` for a Gaussian
    input ``h ~ N(mean, diag(variance))``, its Laplace posterior over the output weights included.

    With ``z = W^T h / sqrt(l) + b`` (the features' arguments: ``mu = W^T mean / sqrt(l) + b``,
    covariance ``S = W^T diag(variance) W / l``) and ``phi = c cos(z)`` (``c = sqrt(2 / D)`` or 1),
    ``E[cos z_i] = exp(-S_ii / 2) cos(mu_i)`` and, by ``cos a cos b = (cos(a - b) + cos(a + b)) / 2``,
    the features' covariance::

        Cov(phi_i, phi_j) = c^2 / 2 exp(-(S_ii + S_jj) / 2) [expm1(S_ij) cos(mu_i - mu_j)
                                                           + expm1(-S_ij) cos(mu_i + mu_j)]

    (``expm1``: zero for a zero variance, without cancellation). The logits
    ``f = phi^T beta + bias`` with ``beta ~ N(kernel, Sigma)`` (the layer's Laplace posterior
    of each class) have, by the law of total variance::

        E[f]   = kernel^T E[phi] + bias
        Var[f] = kernel^T Cov(phi) kernel  +  tr(Sigma Cov(phi)) + E[phi]^T Sigma E[phi]

    exact for a Gaussian input with a diagonal covariance; the last two terms are the GP's own
    variance ``E[phi^T Sigma phi]`` (``diag(Phi Sigma Phi^T)`` for a point input). The features'
    covariance is ``D x D`` per example: ``O(B d D^2)`` time and a few ``(B, D, D)`` tensors
    (``B = 64``, ``D = 1024``: 256 MB each): propagate large batches in parts.

    Args:
        layer: a built :class:`tfbnn.layers.RandomFeatureGaussianProcess` without ``normalize_input``.
        mean, variance: float tensors ``(B, d)`` (variance >= 0).

    Returns:
        ``(mean, variance)``, float32 tensors ``(B, units)`` of the logits (before the activation).

    Example:
        >>> import numpy as np, tfbnn
        >>> gp = tfbnn.layers.RandomFeatureGaussianProcess(2, num_inducing=8, seed=0)
        >>> h = np.ones((1, 3), "float32")
        >>> m, v = tfbnn.moments.random_feature_gp_moments(gp, h, np.zeros_like(h))  # a point: the layer itself
        >>> bool(np.allclose(m, gp(h), atol=1e-6)), bool(np.allclose(v[:, 0], gp.predictive_variance(h), atol=1e-6))
        (True, True)
    """
    if not isinstance(layer, RandomFeatureGaussianProcess):
        raise TypeError(f"Expected `layer` to be a tfbnn.layers.RandomFeatureGaussianProcess. Received: "
                        f"layer={layer!r}")
    mean, variance = _moment_pair(mean, variance)
    mean, variance = tf.cast(mean, tf.float32), tf.cast(variance, tf.float32)
    if mean.shape.rank != 2 or variance.shape != mean.shape:
        raise ValueError(f"Expected `mean` and `variance` of one shape (batch, features). Received: "
                         f"mean.shape={tuple(mean.shape)}, variance.shape={tuple(variance.shape)}")
    if layer.built and mean.shape[-1] != layer.feature_kernel.shape[0]:
        raise ValueError(f"Expected `mean` with {layer.feature_kernel.shape[0]} features (the layer's input). "
                         f"Received: mean.shape={tuple(mean.shape)}")
    if tf.executing_eagerly() and not bool(tf.reduce_all(tf.math.is_finite(mean))):
        raise ValueError("Expected `mean` to hold finite numbers. Received: mean with NaN or infinite values")
    if tf.executing_eagerly() and not bool(tf.reduce_all(tf.math.is_finite(variance) & (variance >= 0.0))):
        raise ValueError("Expected `variance` to hold finite numbers >= 0. Received: "
                         f"{checks.value_range('variance', variance.numpy())}")
    if not layer.built:
        layer.build(mean.shape)
    out_mean, feature_cov, own = _gp_logit_parts(layer, mean, variance=variance)
    kernel = tf.cast(tf.convert_to_tensor(layer.kernel), tf.float32)
    from_features = tf.reduce_sum(kernel * tf.matmul(feature_cov, kernel), axis=1)    # (B, units)
    return out_mean, from_features + own[:, None]


def _gp_logit_parts(layer, mean, variance=None, covariance=None):
    """The logits' mean ``(B, units)``, the features' covariance ``(B, D, D)`` and the GP's own variance
    ``(B,)`` for an input ``N(mean, diag(variance))`` or ``N(mean, covariance)`` (float32)."""
    if layer.input_norm is not None:
        _refuse(layer, "its input layer normalization (normalize_input=True) of a random input has no closed-form "
                       "moments")
    w = tf.convert_to_tensor(layer.feature_kernel) / math.sqrt(layer.gp_kernel_scale)
    mu = tf.matmul(mean, w) + layer.feature_bias                                        # (B, D)
    c2 = 2.0 / layer.num_inducing if layer.scale_random_features else 1.0
    kernel = tf.cast(tf.convert_to_tensor(layer.kernel), tf.float32)
    sigma = layer.covariance()
    if covariance is None:
        s = tf.einsum("ki,bk,kj->bij", w, variance, w)                                # (B, D, D)
    else:
        s = tf.einsum("ki,bkl,lj->bij", w, covariance, w)
    half = tf.exp(-0.5 * tf.linalg.diag_part(s))                                        # (B, D)
    cov = (0.5 * c2) * (half[:, :, None] * half[:, None, :]) * (
        tf.math.expm1(s) * tf.cos(mu[:, :, None] - mu[:, None, :])
        + tf.math.expm1(-s) * tf.cos(mu[:, :, None] + mu[:, None, :]))
    feature_mean = math.sqrt(c2) * half * tf.cos(mu)
    own = (tf.reduce_sum(sigma * cov, axis=[1, 2])
           + tf.reduce_sum(feature_mean * tf.matmul(feature_mean, sigma), axis=1))      # (B,)
    out_mean = tf.matmul(feature_mean, kernel)
    if layer.use_bias:
        out_mean = out_mean + tf.cast(tf.convert_to_tensor(layer.bias), tf.float32)
    return out_mean, cov, own


_IBNN_REFUSAL = ("the iBNN node noise is a mixture whose components are assigned to rows (an ensemble inside the "
                 "layer), which has no one-pass moment form here")
_SHAPE_LAYERS = (keras.layers.Flatten, keras.layers.Reshape, keras.layers.Permute)
_KERAS_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)
_INFERENCE_IDENTITY = (keras.layers.Dropout, keras.layers.GaussianDropout, keras.layers.GaussianNoise,
                       keras.layers.AlphaDropout)


def _layer_moments(layer, mean, variance, last):
    """``(mean, variance, link)`` after ``layer``; ``last``: it is the model's output layer."""
    if isinstance(layer, NodeLayer):
        _refuse(layer, _IBNN_REFUSAL)
    if isinstance(layer, (MeanFieldGaussian, VariationalDropoutLayer)):
        mean, variance = _bayesian_kernel_moments(layer, mean, variance)
        return _activation(layer, _activation_name(layer.activation), mean, variance, last)
    if isinstance(layer, MCDropout):
        if not _sampling(layer) or layer.rate == 0:
            return mean, variance, None
        keep = 1.0 - layer.rate
        return mean, variance / keep + tf.square(mean) * (layer.rate / keep), None
    if isinstance(layer, StochasticLayer):
        _refuse(layer, "its noise has no closed-form moments here")
    if isinstance(layer, SpectralNormalization):
        mean, variance, activation = _spectral_moments(layer, mean, variance)
        return _activation(layer, _activation_name(activation), mean, variance, last)
    if isinstance(layer, RandomFeatureGaussianProcess):
        mean, variance = random_feature_gp_moments(layer, mean, variance)
        return _activation(layer, _activation_name(layer.activation), mean, variance, last)
    if isinstance(layer, keras.layers.Dense) or (isinstance(layer, _KERAS_CONVOLUTIONS)
                                                 and not isinstance(layer, keras.layers.Conv2DTranspose)):
        mean, variance = _keras_moments(layer, mean, variance)
        return _activation(layer, _activation_name(layer.activation), mean, variance, last)
    if isinstance(layer, _SHAPE_LAYERS):
        return layer(mean), layer(variance), None
    passed = _pass_through(layer, mean, variance, last)
    if passed is not None:
        return passed
    if isinstance(layer, DistributionHead):
        _refuse(layer, "of the distribution heads only a GaussianHead, at the output, is supported")
    _refuse(layer, "it has no moment rule (supported: Bayes-by-Backprop and variational-dropout dense and "
                   "convolution layers, MC dropout, SNGP's spectral and GP layers, keras Dense and Conv1D/2D/3D, "
                   "Flatten, Reshape, Permute, "
                   "Dropout, Activation / ReLU / Softmax, a GaussianHead at the output)")


# -- full covariance (Wu et al. 2019) -------------------------------------------------------------
def _refuse_full(layer, why):
    raise ValueError(f"Full-covariance moment propagation (covariance='full') does not support layer '{layer.name}' "
                     f"(class {type(layer).__name__}): {why}. Use covariance='diagonal', or Monte Carlo prediction "
                     "(method='monte_carlo').")


def _adds_noise(layer):
    """Whether ``layer`` makes a point input random (a Bayesian kernel that samples, MC dropout, the GP)."""
    if isinstance(layer, (MeanFieldGaussian, VariationalDropoutLayer)):
        return _sampling(layer)
    if isinstance(layer, MCDropout):
        return _sampling(layer) and layer.rate > 0
    return isinstance(layer, RandomFeatureGaussianProcess)


def _keeps_independence(layer, point, rank):
    """Whether ``layer`` maps inputs of rank ``rank`` with independent units (``point``: constants) to outputs with
    independent units, so that the diagonal rule is exact for it and no covariance needs to be formed."""
    if isinstance(layer, MCDropout):  # independent masks per unit; a spatial mask is shared by a channel's positions
        return not isinstance(layer, MCSpatialDropout2D) or not _adds_noise(layer)
    if isinstance(layer, (MeanFieldGaussian, VariationalDropoutLayer)):
        # a random kernel on constants: units independent if they share no weight (dense on (B, d), not on
        # (B, T, d): the positions share the kernel), or if it does not sample
        return point and ((isinstance(layer, DenseArguments) and rank == 2) or not _sampling(layer))
    if isinstance(layer, (RandomFeatureGaussianProcess, SpectralNormalization, keras.layers.Dense)
                  + _KERAS_CONVOLUTIONS):
        return point  # a linear map mixes random units
    return True  # elementwise, shape and identity layers, heads; other layers are refused by the diagonal rule


def _dense_parts(layer):
    """``(loc, weight_variance or None, bias or None, bias_variance or None, activation)`` of a dense layer."""
    if isinstance(layer, NodeLayer):
        _refuse(layer, _IBNN_REFUSAL)
    if isinstance(layer, (MeanFieldGaussian, VariationalDropoutLayer)):
        if not isinstance(layer, DenseArguments):
            _refuse_full(layer, "the outputs of a random convolution share its kernel across positions, a covariance "
                                "between every pair of positions and channels (refused rather than formed)")
        return (*_kernel_posterior(layer), layer.activation)
    if isinstance(layer, SpectralNormalization):
        inner = layer.layer
        if not isinstance(inner, keras.layers.Dense):
            _refuse_full(layer, "a convolution mixes positions (full covariance is kept between dense units)")
        return (layer.normalized_kernel(training=False), None, inner.bias if inner.use_bias else None, None,
                inner.activation)
    if isinstance(layer, keras.layers.Dense):
        return layer.kernel, None, layer.bias if layer.use_bias else None, None, layer.activation
    return None


def _full_dense(mean, cov, loc, weight_variance, bias, bias_variance):
    """``y = x W + b`` with ``x ~ (m, C)`` and independent ``W_ij ~ (M_ij, S_ij)``, ``b_j ~ (mu_j, s_j^2)``::

        E[y] = M^T m + mu,   Cov[y] = M^T C M + diag(sum_i (C_ii + m_i^2) S_ij + s_j^2)
    """
    dtype = mean.dtype
    loc = tf.cast(tf.convert_to_tensor(loc), dtype)
    out_mean = tf.matmul(mean, loc)
    out_cov = tf.einsum("ji,bjk,kl->bil", loc, cov, loc)
    if weight_variance is not None:
        second = tf.linalg.diag_part(cov) + tf.square(mean)
        out_cov = tf.linalg.set_diag(out_cov, tf.linalg.diag_part(out_cov)
                                     + tf.matmul(second, tf.cast(weight_variance, dtype)))
    if bias is not None:
        out_mean = out_mean + tf.cast(bias, dtype)
    if bias_variance is not None:
        out_cov = tf.linalg.set_diag(out_cov, tf.linalg.diag_part(out_cov) + tf.cast(bias_variance, dtype))
    return out_mean, out_cov


def _full_activation(layer, name, mean, cov, last):
    return _activation(layer, name, mean, cov, last, relu=_relu_covariance)


def _full_layer_moments(layer, mean, cov, last):
    """``(mean, covariance, link)`` after ``layer`` for inputs ``(B, d)`` with a full covariance ``(B, d, d)``."""
    parts = _dense_parts(layer)
    if parts is not None:
        loc, weight_variance, bias, bias_variance, activation = parts
        mean, cov = _full_dense(mean, cov, loc, weight_variance, bias, bias_variance)
        return _full_activation(layer, _activation_name(activation), mean, cov, last)
    if isinstance(layer, MCDropout):
        if not _adds_noise(layer):
            return mean, cov, None
        if isinstance(layer, MCSpatialDropout2D):
            _refuse_full(layer, "its masks are shared across positions")
        keep = 1.0 - layer.rate  # Cov[x_i z_i / q, x_l z_l / q] = C_il off the diagonal, C_ii / q + m_i^2 p / q on it
        diagonal = tf.linalg.diag_part(cov) / keep + tf.square(mean) * (layer.rate / keep)
        return mean, tf.linalg.set_diag(cov, diagonal), None
    if isinstance(layer, StochasticLayer):
        _refuse(layer, "its noise has no closed-form moments here")
    if isinstance(layer, RandomFeatureGaussianProcess):
        out_mean, feature_cov, own = _gp_logit_parts(layer, tf.cast(mean, tf.float32),
                                                     covariance=tf.cast(cov, tf.float32))
        kernel = tf.cast(tf.convert_to_tensor(layer.kernel), tf.float32)
        out_cov = tf.einsum("iu,bij,jv->buv", kernel, feature_cov, kernel)
        out_cov = tf.linalg.set_diag(out_cov, tf.linalg.diag_part(out_cov) + own[:, None])
        return _full_activation(layer, _activation_name(layer.activation), out_mean, out_cov, last)
    if isinstance(layer, _SHAPE_LAYERS):
        if tuple(layer.compute_output_shape(mean.shape))[1:] != tuple(mean.shape)[1:]:
            _refuse_full(layer, "it reshapes units that have a covariance (full covariance is kept between the "
                                "units of a flat (batch, units) activation)")
        return mean, cov, None
    passed = _pass_through(layer, mean, cov, last, relu=_relu_covariance)
    if passed is not None:
        return passed
    if isinstance(layer, _KERAS_CONVOLUTIONS):
        _refuse_full(layer, "a convolution of random inputs mixes positions (full covariance is kept between the "
                            "units of a flat (batch, units) activation)")
    _layer_moments(layer, mean, tf.linalg.diag_part(cov), last)  # refuses the layer by the diagonal rule's reason
    _refuse_full(layer, "it has no full-covariance rule")


def _propagate_full(layers, mean):
    """Full-covariance propagation: ``(mean, variance, covariance or None, link, head)``.

    Inputs with independent units (constants, then the outputs of a Bayesian dense layer
    on constants, of elementwise layers, ...) go by the diagonal rule, exact for them; from
    the first layer that correlates its outputs the covariance ``(B, d, d)`` is formed."""
    variance, cov = tf.zeros_like(mean), None
    point, link, head = True, None, None
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1
        if cov is None and _keeps_independence(layer, point, mean.shape.rank):
            mean, variance, link = _layer_moments(layer, mean, variance, last)
        else:
            if cov is None:
                if mean.shape.rank != 2:
                    _refuse_full(layer, f"its input of shape {tuple(mean.shape)} has random units that it "
                                        "correlates; full covariance is kept between the units of a flat (batch, units) "
                                        "activation")
                cov = tf.linalg.diag(variance)
            mean, cov, link = _full_layer_moments(layer, mean, cov, last)
            variance = tf.linalg.diag_part(cov)
        point = point and not _adds_noise(layer)
        if link == "gaussian_head":
            head = layer
    return mean, variance, cov, link, head


def _check_built(layers):
    for layer in layers:
        if not layer.built:
            raise ValueError(f"Expected a built model: layer '{layer.name}' is not built; call the model on data "
                             "first. Received: a model with unbuilt layers")


def _declared_inputs(model):
    """The model's declared inputs (a Sequential built without an ``Input`` may have none)."""
    try:
        return list(model.inputs or [])
    except (AttributeError, ValueError):
        return []


def propagate(model, inputs, covariance="diagonal"):
    """Propagates the inputs' moments (a point: variance 0) through ``model``: the output's mean and variance.

    ``covariance="diagonal"`` (default): one deterministic pass with about twice the
    matmuls / convolutions of the posterior-mean network (three for a Bayesian layer whose
    input is random), every unit's variance and no covariances. ``covariance="full"``:
    the covariance matrix between the units of each dense activation (Wu et al. 2019),
    ``O(B d^2)`` memory and ``O(B d^2 Q)`` time per ReLU layer (``Q = 32`` quadrature
    nodes, :func:`relu_covariance`). See the module docstring for the rules, the
    supported layers and what is approximated.

    Args:
        model: a built Sequential or functional model whose layers form a chain (nested
            models expanded), of the supported layers.
        inputs: a float array or tensor ``(B, ...)``, the model's input.
        covariance: one of :data:`COVARIANCES`: ``"diagonal"`` or ``"full"``.

    Returns:
        An :class:`OutputMoments`: ``mean`` and ``variance`` of the outputs (of the
        logits when the model ends in a softmax or sigmoid, of the head's inputs for a
        :class:`tfbnn.GaussianHead`) and the ``link`` left out.

    Raises:
        ValueError: naming the layer and its class when a layer has no moment rule; naming
            ``inputs`` when they are not numbers, not shaped like the model's input, or not finite.
    """
    if covariance not in COVARIANCES:
        raise ValueError(f"Expected `covariance` in {COVARIANCES}. Received: covariance={covariance!r}")
    layers = model_layers(model)
    _check_built(layers)
    mean = checks.float_tensor("inputs", inputs)
    declared = _declared_inputs(model)
    if len(declared) == 1:
        checks.input_shape(mean, declared[0].shape, "inputs")
    checks.finite_inputs(mean, name="inputs")
    if covariance == "full":
        mean, variance, cov, link, head = _propagate_full(layers, mean)
        if cov is None:  # units independent to the end: the covariance of the flattened outputs is diagonal
            flat = tf.reshape(variance, [-1, int(np.prod(variance.shape[1:]))])
            cov = tf.linalg.diag(flat)
        return OutputMoments(mean=mean, variance=variance, link=link, head=head, covariance=cov)
    variance = tf.zeros_like(mean)
    link, head = None, None
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1
        mean, variance, link = _layer_moments(layer, mean, variance, last)
        if link == "gaussian_head":
            head = layer
    return OutputMoments(mean=mean, variance=variance, link=link, head=head)
