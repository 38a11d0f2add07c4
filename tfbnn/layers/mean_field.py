"""The mean-field Gaussian posterior of the Bayes-by-Backprop layers, and how to build a layer on it.

Every weight has an independent Gaussian posterior

    q(w_ij) = N(mu_ij, sigma_ij^2),   sigma_ij = softplus(rho_ij) + 1e-6,

(Blundell et al. 2015, sec. 3.2) -- or, with ``scale_parameterization="log_variance"``,
``sigma_ij^2 = exp(rho_ij)`` (Graves 2011; ``rho`` clipped to ``[-80, 40]`` so that
``sigma`` and ``log sigma`` stay finite in float32) -- and a prior chosen by name or
object (:mod:`tfbnn.priors`). The KL is closed form for a Normal prior and a Monte
Carlo estimate at the weight sample for the others (the scale mixture).

:class:`MeanFieldGaussian` holds this posterior for one kernel and one bias and
samples it with the reparameterization estimator (one kernel per call, shared by the
batch); :class:`MeanFieldFlipout` samples it with Flipout. The dense layers
(:mod:`tfbnn.layers.dense`) and the convolutions (:mod:`tfbnn.layers.conv`) are these
two with a shape family (:class:`tfbnn.layers.DenseArguments`,
:class:`tfbnn.layers.ConvArguments`); a new layer on the same posterior (a 3-D
convolution, a recurrent cell, an op of its own) is built the same way.

With ``posterior="low_rank"`` the kernel's posterior (the bias stays mean field)
has a low-rank plus diagonal covariance over its ``n`` flattened weights,

    q(vec W) = N(mu, diag(sigma^2) + L L^T),   L of shape [n, r],

(Tomczak et al. 2020), sampled as ``W = mu + sigma * eps + L z`` (``eps ~ N(0, I_n)``,
``z ~ N(0, I_r)``), ``O(n r)``; the KL against a Normal prior is closed form in
``O(n r^2)`` (:func:`tfbnn.kl.low_rank_kl`), never an ``n x n`` matrix. So the class
holds a Gaussian posterior that is mean field by default and not with this option (the
name keeps the default). The low-rank Gaussian itself (KL, log-density, log-determinant)
is written once, :class:`tfbnn.kl.LowRankGaussian`, which
:class:`tfbnn.posteriors.LowRankNormalWeights` (``DenseVariational(..., "low_rank")``) shares.
"""

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks, deprecation
from tfbnn import kl as kl_lib
from tfbnn import priors as priors_lib
from tfbnn.layers.base import BayesianLayer, KernelArguments

__all__ = ["MeanFieldGaussian", "MeanFieldFlipout", "SCALE_PARAMETERIZATIONS", "POSTERIORS"]

_MIN_SCALE = kl_lib.SOFTPLUS_MIN_SCALE
#: Values of ``scale_parameterization``: how ``rho`` gives ``sigma``. (Not variational
#: dropout's ``parameterization``, additive or multiplicative noise, an unrelated choice.)
SCALE_PARAMETERIZATIONS = ("softplus", "log_variance")
#: Values of ``posterior``: the covariance of the kernel's Gaussian posterior.
POSTERIORS = ("mean_field", "low_rank")
_LOG_VARIANCE_RANGE = kl_lib.LOG_VARIANCE_RANGE


def _default_rho_initializer():
    # softplus(-5) ~= 0.0067: the net starts close to its posterior mean, so early
    # training behaves like the deterministic net while the KL widens sigma.
    return keras.initializers.Constant(-5.0)


def _softplus_scale(rho):
    return tf.nn.softplus(rho) + _MIN_SCALE


def _log_variance_scale(rho):
    return tf.exp(0.5 * tf.clip_by_value(rho, *_LOG_VARIANCE_RANGE))


def _default_log_variance_initializer():
    # log sigma^2 = 2 log softplus(-5): the same initial sigma (~0.0067) as the softplus default.
    return keras.initializers.Constant(-10.0)


class MeanFieldGaussian(KernelArguments, BayesianLayer):
    """Mean-field Gaussian posterior over a kernel and a bias: the base of the Bayes-by-Backprop layers.

    It holds the posterior ``q(w) = N(mu, sigma^2)`` per weight (``kernel_loc`` /
    ``kernel_rho``, ``bias_loc`` / ``bias_rho``; ``sigma = softplus(rho) + 1e-6`` or
    ``sigma^2 = exp(rho)``, Blundell et al. 2015, sec. 3.2), the priors, the KL (closed
    form, the fused scale/Normal ops :func:`tfbnn.kl.softplus_scale_and_normal_kl` and
    :func:`tfbnn.kl.log_variance_scale_and_normal_kl`, or Monte Carlo) and the forward pass of the reparameterization estimator: each call
    draws one kernel ``W = mu + sigma * eps`` (and bias) shared by the batch, applies
    it, adds the bias, the KL loss (``kl_weight * KL``) and the activation; inside
    :func:`tfbnn.weight_samples` with ``T`` samples it draws ``T`` kernels and applies
    kernel ``t`` to the ``t``-th block of rows. ``inference_mode="mean"`` uses ``W = mu``.

    Subclassing: a layer on this posterior provides

    * ``build(input_shape)``, which calls :meth:`build_posterior` once with the shapes
      of its kernel and its bias;
    * ``forward(inputs, kernel)``, its operation for one kernel (a sample or the mean),
      before bias and activation;
    * ``add_bias(outputs, bias)`` when a bias of ``bias_shape`` does not broadcast
      against the outputs (the default is ``outputs + bias``);
    * ``get_config`` for arguments of its own (and ``compute_output_shape``).

    Everything else (``call``, the KL, ``posterior_as_prior``, the Monte Carlo protocol,
    saving) is inherited. A shape family (:class:`tfbnn.layers.DenseArguments`,
    :class:`tfbnn.layers.ConvArguments`) listed before it provides the first three; for
    Flipout, derive from :class:`MeanFieldFlipout` instead.

    Args:
        activation: activation name or callable, as in ``keras.layers.Dense``.
        use_bias: bool. Whether the layer has a bias.
        kernel_prior: prior name, dict or :class:`tfbnn.priors.Prior` for the
            kernel. Default ``"normal"`` (N(0, 1)). A :class:`tfbnn.priors.Posterior`
            (per weight) must have the kernel's shape (checked in ``build``).
        bias_prior: the same for the bias; ``None`` makes the bias a point
            estimate (no posterior, no KL), as TFP's layers do by default.
        kernel_initializer, kernel_scale_initializer, bias_initializer, bias_scale_initializer:
            Keras initializers for the posterior mean and the untransformed scale
            ``rho`` (``sigma = softplus(rho)``, or
            ``sigma^2 = exp(rho)`` with ``scale_parameterization="log_variance"``).
            Default ``rho = -5`` (softplus) / ``rho = -10`` (log variance): sigma ~ 0.0067.
        scale_parameterization: how ``rho`` gives ``sigma``: ``"softplus"`` (default,
            Blundell et al. 2015: ``sigma = softplus(rho) + 1e-6``) or ``"log_variance"`` (Graves 2011:
            ``sigma^2 = exp(rho)``, ``rho`` clipped to ``[-80, 40]``). With
            ``bias_prior=None`` the latter is Graves' variational dense layer
            (:class:`tfbnn.layers.GravesDense`; ``kernel_prior="graves"`` for his adaptive prior).
        posterior: ``"mean_field"`` (default) or ``"low_rank"``: the kernel's
            posterior is ``N(mu, diag(sigma^2) + L L^T)`` over its ``n`` flattened
            weights, with a trained factor ``L`` (weight ``kernel_factor``, of shape
            ``kernel_shape + (posterior_rank,)``; Tomczak et al. 2020). A sample is
            ``W = mu + sigma * eps + L z``, ``z ~ N(0, I_r)``: ``O(n r)``; the KL to a
            Normal (or :class:`tfbnn.priors.Posterior`) prior is closed form in
            ``O(n r^2)`` through the ``r x r`` capacitance matrix
            (:func:`tfbnn.kl.low_rank_kl`), to other priors a Monte Carlo estimate
            with the Woodbury log-density (:func:`tfbnn.kl.low_rank_log_prob`). The
            bias stays mean field. Flipout rejects it: its random sign flips keep a
            perturbation's distribution only when the weights are independent.
        posterior_rank: int >= 1, ``r``, the columns of ``L`` (at most the kernel's
            size); used with ``posterior="low_rank"``. Default 2.
        kernel_factor_initializer: Keras initializer of ``L``, or None (default:
            ``N(0, (1e-3)^2 / r)`` entries, so the covariance starts close to the
            mean-field one but not exactly diagonal).
        kl_weight, inference_mode, seed: see :class:`tfbnn.layers.BayesianLayer`.

    Renamed in tfbnn 0.2 (the old names still load and, with a
    ``DeprecationWarning``, construct): ``kernel_loc_initializer`` ->
    ``kernel_initializer``, ``bias_loc_initializer`` -> ``bias_initializer``,
    ``kernel_rho_initializer`` -> ``kernel_scale_initializer``,
    ``bias_rho_initializer`` -> ``bias_scale_initializer``,
    ``posterior_parameterization`` -> ``parameterization``. Renamed in tfbnn 0.3, the same
    way: ``parameterization`` -> ``scale_parameterization`` (variational dropout's
    ``parameterization``, additive or multiplicative noise, keeps its name: the two were
    unrelated choices under one name); the attribute ``parameterization`` stays, read-only.

    Example:
        A Bayesian element-wise scale ``y = x * w + b``, one ``N(mu_i, sigma_i^2)`` per
        ``w_i`` and ``b_i``:

        >>> import numpy as np, tfbnn
        >>> class BayesianScale(tfbnn.layers.MeanFieldGaussian):
        ...     def build(self, input_shape):
        ...         self.build_posterior(kernel_shape=input_shape[-1:], bias_shape=input_shape[-1:])
        ...     def forward(self, inputs, kernel):
        ...         return inputs * kernel
        >>> layer = BayesianScale(kl_weight=1e-3, seed=0)
        >>> layer(np.ones((2, 4), "float32")).shape
        TensorShape([2, 4])
        >>> [w.name for w in layer.trainable_weights], len(layer.losses)
        (['kernel_loc', 'kernel_rho', 'bias_loc', 'bias_rho'], 1)
        >>> with tfbnn.weight_samples(layer, 3):  # 3 kernels, one per block of 2 rows
        ...     y = layer(np.ones((3 * 2, 4), "float32")).numpy()
        >>> bool(np.allclose(y[0], y[1])), bool(np.allclose(y[0], y[2]))
        (True, False)
    """

    renamed_arguments = {
        "kernel_loc_initializer": "kernel_initializer",
        "bias_loc_initializer": "bias_initializer",
        "kernel_rho_initializer": "kernel_scale_initializer",
        "bias_rho_initializer": "bias_scale_initializer",
        "posterior_parameterization": "scale_parameterization",
        "parameterization": "scale_parameterization",
    }

    def __init__(
        self,
        activation=None,
        use_bias=True,
        kernel_prior="normal",
        bias_prior="normal",
        kernel_initializer="glorot_uniform",
        kernel_scale_initializer=None,
        bias_initializer="zeros",
        bias_scale_initializer=None,
        kl_weight=None,
        inference_mode="sample",
        seed=None,
        scale_parameterization="softplus",
        posterior="mean_field",
        posterior_rank=2,
        kernel_factor_initializer=None,
        **kwargs,
    ):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        self._init_posterior(posterior, posterior_rank, kernel_factor_initializer)
        if scale_parameterization not in SCALE_PARAMETERIZATIONS:
            raise ValueError(
                f"Expected `scale_parameterization` in {SCALE_PARAMETERIZATIONS}. "
                f"Received: scale_parameterization={scale_parameterization!r}"
            )
        self.scale_parameterization = scale_parameterization
        default_rho = (
            _default_rho_initializer if scale_parameterization == "softplus" else _default_log_variance_initializer
        )
        self.init_kernel_arguments(activation, use_bias, kernel_initializer, bias_initializer)
        self.kernel_prior = priors_lib.get(kernel_prior, name="kernel_prior")
        self.bias_prior = None if bias_prior is None else priors_lib.get(bias_prior, name="bias_prior")
        self.kernel_scale_initializer = checks.initializer(
            "kernel_scale_initializer", default_rho() if kernel_scale_initializer is None else kernel_scale_initializer
        )
        self.bias_scale_initializer = checks.initializer(
            "bias_scale_initializer", default_rho() if bias_scale_initializer is None else bias_scale_initializer
        )

    #: Whether the layer's estimator takes ``posterior="low_rank"``.
    supports_low_rank = True

    def _init_posterior(self, posterior, posterior_rank, kernel_factor_initializer):
        if posterior not in POSTERIORS:
            raise ValueError(f"Expected `posterior` in {POSTERIORS}. Received: posterior={posterior!r}")
        if posterior == "low_rank" and not self.supports_low_rank:
            raise ValueError(
                f"{type(self).__name__} takes only posterior='mean_field': its estimator needs independent "
                "weights (use the Reparameterization layer for a low-rank posterior). Received: posterior='low_rank'"
            )
        self.posterior = posterior
        self.posterior_rank = checks.integer("posterior_rank", posterior_rank, 1)
        self._default_factor_initializer = kernel_factor_initializer is None
        # The default is made when a low-rank layer builds, not here: an unseeded Keras initializer
        # draws its seed from Python's `random`, which would shift every later initializer of a
        # mean-field model whose program seeded it (keras.utils.set_random_seed).
        self.kernel_factor_initializer = None if kernel_factor_initializer is None else checks.initializer(
            "kernel_factor_initializer", kernel_factor_initializer)

    @property
    def parameterization(self):
        """:attr:`scale_parameterization`, under its name before tfbnn 0.3 (read-only)."""
        return self.scale_parameterization

    @property
    def low_rank(self):
        """Whether the kernel's posterior is low rank plus diagonal (``posterior="low_rank"``)."""
        return self.posterior == "low_rank"

    @property
    def bayesian_bias(self):
        return self.use_bias and self.bias_prior is not None

    def build_posterior(self, kernel_shape, bias_shape):
        """Makes the posterior's weights: ``kernel_loc``, ``kernel_rho`` (``kernel_shape``), ``bias_loc``,
        ``bias_rho`` (``bias_shape``; as ``use_bias`` and ``bias_prior`` ask) and the KL weight.

        A subclass calls it once, in ``build``. It checks a per-weight prior's shape.
        """
        self.kernel_loc = self.add_weight(
            name="kernel_loc", shape=kernel_shape, initializer=self.kernel_initializer
        )
        self.kernel_rho = self.add_weight(
            name="kernel_rho", shape=kernel_shape, initializer=self.kernel_scale_initializer
        )
        self.bias_loc = self.bias_rho = None
        if self.use_bias:
            self.bias_loc = self.add_weight(
                name="bias_loc", shape=bias_shape, initializer=self.bias_initializer
            )
            if self.bayesian_bias:
                self.bias_rho = self.add_weight(
                    name="bias_rho", shape=bias_shape, initializer=self.bias_scale_initializer
                )
        self.kernel_prior.check_shape(self.kernel_loc.shape, "kernel_prior")
        self.kernel_factor = None
        if self.low_rank:
            self._build_kernel_factor(kernel_shape)
        if self.bayesian_bias:
            self.bias_prior.check_shape(self.bias_loc.shape, "bias_prior")
        self._build_kl_weight()

    def _build_kernel_factor(self, kernel_shape):
        size = int(np.prod(kernel_shape))
        if self.posterior_rank > size:
            raise ValueError(f"Expected `posterior_rank` at most the kernel's size, {size}. "
                             f"Received: posterior_rank={self.posterior_rank}")
        if getattr(self.kernel_prior, "adaptive", False):
            raise ValueError("Expected a fixed `kernel_prior` with posterior='low_rank' (the adaptive Graves prior "
                             f"is fitted to a mean-field posterior). Received: kernel_prior={self.kernel_prior!r}")
        self.kernel_factor = self.add_weight(
            name="kernel_factor", shape=tuple(kernel_shape) + (self.posterior_rank,),
            initializer=self.kernel_factor_initializer or keras.initializers.RandomNormal(
                stddev=1e-3 / self.posterior_rank**0.5, seed=self.seed),
            autocast=False,
        )

    # -- posterior pieces ------------------------------------------------------
    def _scale(self, rho):
        if self.scale_parameterization == "log_variance":
            return _log_variance_scale(rho)
        return _softplus_scale(rho)

    def kernel_scale(self):
        return self._scale(self.kernel_rho)

    def bias_scale(self):
        return self._scale(self.bias_rho) if self.bayesian_bias else None

    def _scale_and_kl(self, loc, rho, prior):
        """``(sigma, KL)``: the KL in closed form where the prior has one, else None.

        Either scale with a Normal prior goes through one fused op with a hand-written
        gradient (:func:`tfbnn.kl.softplus_scale_and_normal_kl`,
        :func:`tfbnn.kl.log_variance_scale_and_normal_kl`).
        """
        if type(prior) is priors_lib.Normal:
            if self.scale_parameterization == "softplus":
                return kl_lib.softplus_scale_and_normal_kl(loc, rho, prior)
            return kl_lib.log_variance_scale_and_normal_kl(loc, rho, prior)
        scale = self._scale(rho)
        return scale, (kl_lib.closed_form_kl(loc, scale, prior) if prior.has_closed_form_kl else None)

    def posterior_as_prior(self):
        """Freezes the current posterior as the prior: variational continual learning.

        Sets ``kernel_prior`` (and ``bias_prior`` for a Bayesian bias) to a
        :class:`tfbnn.priors.Posterior` holding the current ``N(mu, sigma^2)`` of every
        weight as constants, so that further training minimises
        ``-E_q[log p(D | w)] + KL(q || q_old)`` (Nguyen et al. 2018, eq. 4). The
        posterior itself is not touched: training continues from it, and right after
        this call the KL is 0. A point-estimate bias (``bias_prior=None``) stays one.
        Models whose step functions were already traced must retrace (see
        :func:`tfbnn.continual.posterior_as_prior`, which does that for a model).

        Returns:
            ``(kernel_prior, bias_prior)``, the new priors (``bias_prior`` None
            without a Bayesian bias).
        """
        if not self.built:
            raise ValueError(f"Layer '{self.name}' has no posterior yet: build it (call it on data) first. "
                             f"Received: a layer with built={self.built}")
        if self.low_rank:
            raise ValueError(f"Layer '{self.name}' has a low-rank posterior, which no per-weight prior holds. "
                             "Received: posterior='low_rank'")
        self.kernel_prior = priors_lib.Posterior(self.kernel_loc, self.kernel_scale())
        if self.bayesian_bias:
            self.bias_prior = priors_lib.Posterior(self.bias_loc, self.bias_scale())
        return self.kernel_prior, (self.bias_prior if self.bayesian_bias else None)

    def _kernel_scale_and_kl(self):
        """``(sigma, KL)`` of the kernel: the KL in closed form where it has one, else None."""
        if not self.low_rank:
            return self._scale_and_kl(self.kernel_loc, self.kernel_rho, self.kernel_prior)
        scale = self.kernel_scale()
        if not kl_lib.has_low_rank_closed_form(self.kernel_prior):
            return scale, None
        return scale, kl_lib.low_rank_kl(self.kernel_loc, scale, self.kernel_factor, self.kernel_prior)

    def _sample_kernel(self, scale, num_samples=1, kl=None):
        """Kernel sample(s) ``mu + sigma * eps (+ L z)`` and the KL (``kl``, or Monte Carlo over the samples)."""
        if not self.low_rank:
            return self._sample(self.kernel_loc, scale, self.kernel_prior, num_samples, kl)
        delta = self._low_rank_noise(scale, num_samples)
        sample = self.kernel_loc + delta
        if kl is None:
            log_q = kl_lib.low_rank_log_prob(tf.reshape(delta, tf.concat([[num_samples], tf.shape(scale)], 0)),
                                             scale, self.kernel_factor)
            log_p = tf.reduce_sum(tf.cast(self.kernel_prior.log_prob(tf.cast(sample, tf.float32)), tf.float32))
            kl = (tf.reduce_sum(log_q) - log_p) / num_samples
        return sample, kl

    def _low_rank_noise(self, scale, num_samples=1):
        """``sigma * eps + L z``, with a leading axis of T samples when ``num_samples = T > 1``."""
        shape = self._kernel_noise_shape(num_samples)
        factor = tf.convert_to_tensor(self.kernel_factor)
        flat_factor = tf.reshape(factor, [-1, self.posterior_rank])
        z = self._normal([num_samples, self.posterior_rank], factor.dtype)
        correlated = tf.reshape(tf.matmul(z, flat_factor, transpose_b=True), shape)
        return scale * self._normal(shape, scale.dtype) + tf.cast(correlated, scale.dtype)

    def _kernel_kl(self, scale, kl, num_samples=1):
        """The kernel's KL: ``kl`` (closed form) or a Monte Carlo estimate over ``num_samples`` samples."""
        return self._sample_kernel(scale, num_samples)[1] if kl is None else kl

    def _sample(self, loc, scale, prior, num_samples=1, kl=None):
        """Weight sample(s) and the KL: ``kl`` (the closed form of :meth:`_scale_and_kl`)
        when given, else the Monte Carlo estimate averaged over the samples.

        With ``num_samples = T > 1`` the sample has a leading axis of size T.
        """
        shape = tf.shape(loc)
        if num_samples > 1:
            shape = tf.concat([[num_samples], shape], axis=0)
        eps = self._normal(shape, loc.dtype)
        sample = loc + scale * eps
        if kl is not None:
            return sample, kl
        return sample, kl_lib.monte_carlo_kl(sample, eps, scale, prior) / num_samples

    def _num_samples(self, sampling):
        return self._weight_samples if sampling else 1

    def _kl(self, loc, scale, prior, kl, num_samples=1):
        """``kl`` (the closed form from :meth:`_scale_and_kl`), or if None a Monte Carlo
        estimate averaged over ``num_samples`` weight samples."""
        return self._sample(loc, scale, prior, num_samples)[1] if kl is None else kl

    def kl_divergence(self):
        """``KL(q || p)`` of kernel and bias, summed, unscaled (MC for the scale mixture)."""
        scale, kl = self._kernel_scale_and_kl()
        total = self._kernel_kl(scale, kl)
        if self.bayesian_bias:
            scale, kl = self._bias_scale_and_kl()
            total = total + tf.cast(self._kl(self.bias_loc, scale, self.bias_prior, kl), total.dtype)
        return total

    def _bias_scale_and_kl(self):
        """``(sigma, KL)`` of a Bayesian bias (KL None for a Monte Carlo prior)."""
        return self._scale_and_kl(self.bias_loc, self.bias_rho, self.bias_prior)

    def _bias(self, sampling):
        """Bias sample(s) (or mean) and its KL."""
        if not self.use_bias:
            return None, 0.0
        if not self.bayesian_bias:
            return self.bias_loc, 0.0
        scale, kl = self._bias_scale_and_kl()
        if sampling:
            return self._sample(self.bias_loc, scale, self.bias_prior, self._num_samples(sampling), kl)
        return self.bias_loc, self._kl(self.bias_loc, scale, self.bias_prior, kl)

    # -- the forward pass (reparameterization) ------------------------------------------
    def forward(self, inputs, kernel):
        """The layer's operation for one kernel (a sample or the mean), before bias and activation."""
        raise NotImplementedError(f"{type(self).__name__} must define forward(inputs, kernel).")

    def add_bias(self, outputs, bias):
        """``outputs + bias``; a subclass whose bias does not broadcast against its outputs overrides it."""
        return outputs + tf.cast(bias, outputs.dtype)

    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        if sampling:
            kernel, kl = self._sample_kernel(scale, self._num_samples(sampling), kl)
        else:
            kernel, kl = loc, self._kernel_kl(scale, kl)
        bias, bias_kl = self._bias(sampling)
        return self._finish(self._apply_kernel(inputs, kernel), bias, training, kl + tf.cast(bias_kl, kl.dtype))

    def _apply_kernel(self, inputs, kernel):
        """:meth:`forward`; a kernel with a leading axis of T samples is applied to T blocks of rows.

        The kernel (float32, see :meth:`tfbnn.layers.BayesianLayer.add_weight`) is cast to
        the dtype of the inputs, the compute dtype under mixed precision.
        """
        kernel = tf.cast(kernel, inputs.dtype)
        if len(kernel.shape) == len(self.kernel_loc.shape):
            return self.forward(inputs, kernel)
        return self._per_block(self.forward, inputs, kernel)

    def _apply_bias(self, outputs, bias):
        """:meth:`add_bias`; a bias with a leading axis of T samples is added to T blocks of rows."""
        if len(bias.shape) == len(self.bias_loc.shape):
            return self.add_bias(outputs, bias)
        return self._per_block(self.add_bias, outputs, bias)

    def _per_block(self, fn, rows, samples):
        """``fn(block_t, samples[t])`` for the T blocks of ``rows`` (sample-major), concatenated."""
        blocks = tf.reshape(rows, tf.concat([[tf.shape(samples)[0], -1], tf.shape(rows)[1:]], axis=0))
        if self._portable_noise is not None and samples.shape[0] is not None:
            # A TFLite export has no TensorList ops (map_fn's loop): T, fixed there, unrolled.
            outputs = tf.stack([fn(blocks[t], samples[t]) for t in range(samples.shape[0])])
        else:
            outputs = tf.map_fn(lambda pair: fn(pair[0], pair[1]), (blocks, samples), fn_output_signature=rows.dtype)
        return tf.reshape(outputs, tf.concat([[-1], tf.shape(outputs)[2:]], axis=0))

    def _kernel_noise_shape(self, num_samples):
        shape = tf.shape(self.kernel_loc)
        return shape if num_samples == 1 else tf.concat([[num_samples], shape], axis=0)

    def get_config(self):
        config = super().get_config()
        config.update(self.kernel_config())
        config.update(
            {
                "kernel_prior": priors_lib.serialize(self.kernel_prior),
                "bias_prior": None if self.bias_prior is None else priors_lib.serialize(self.bias_prior),
                "kernel_scale_initializer": keras.initializers.serialize(self.kernel_scale_initializer),
                "bias_scale_initializer": keras.initializers.serialize(self.bias_scale_initializer),
                "scale_parameterization": self.scale_parameterization,
                "posterior": self.posterior,
                "posterior_rank": self.posterior_rank,
                "kernel_factor_initializer": None if self._default_factor_initializer else
                keras.initializers.serialize(self.kernel_factor_initializer),
            }
        )
        return config


class MeanFieldFlipout(MeanFieldGaussian):
    """:class:`MeanFieldGaussian` sampled with the Flipout estimator (Wen et al. 2018, eq. 3).

    One perturbation ``dW = sigma * eps`` per call is decorrelated across the examples
    of the batch by random signs::

        y = f(x, mu) + f(x * s_in, dW) * s_out,   s_in, s_out in {-1, +1}

    for the layer's linear operation ``f`` (``forward``), so every example sees a
    different (pseudo-independent) kernel at the cost of a second ``f``. The KL is
    :class:`MeanFieldGaussian`'s, evaluated at ``W = mu + dW`` when it is a Monte
    Carlo estimate. A subclass provides what :class:`MeanFieldGaussian` asks for and
    ``_flipout_signs(inputs)``, the signs ``(s_in, s_out)`` shaped to broadcast against
    the inputs and the outputs (:class:`tfbnn.layers.DenseArguments` and
    :class:`tfbnn.layers.ConvArguments` have them).

    Args: as :class:`MeanFieldGaussian`.

    Reference:
        Wen, Vicol, Ba, Tran, Grosse. Flipout: Efficient Pseudo-Independent Weight
        Perturbations on Mini-Batches. ICLR 2018.
    """

    # Flipping the signs of rows and columns of a correlated perturbation changes its distribution.
    supports_low_rank = False

    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        outputs = self.forward(inputs, tf.cast(loc, inputs.dtype))
        if sampling:
            num_samples = self._num_samples(sampling)
            eps = self._normal(self._kernel_noise_shape(num_samples), loc.dtype)
            delta = scale * eps
            s_in, s_out = self._flipout_signs(inputs)
            outputs = outputs + self._apply_kernel(inputs * s_in, delta) * s_out
            if kl is None:
                kl = kl_lib.monte_carlo_kl(loc + delta, eps, scale, self.kernel_prior) / num_samples
        else:
            kl = self._kl(loc, scale, self.kernel_prior, kl)
        bias, bias_kl = self._bias(sampling)
        return self._finish(outputs, bias, training, kl + bias_kl)


__getattr__ = deprecation.renamed(__name__, {"PARAMETERIZATIONS": "SCALE_PARAMETERIZATIONS"})
