"""Bayes-by-Backprop dense layers: reparameterization, Flipout, local reparameterization.

All three share one model. Each weight has an independent Gaussian posterior

    q(w_ij) = N(mu_ij, sigma_ij^2),   sigma_ij = softplus(rho_ij) + 1e-6,

(Blundell et al. 2015, sec. 3.2) -- or, with
``parameterization="log_variance"``, ``sigma_ij^2 = exp(rho_ij)``
(Graves 2011; ``rho`` clipped to ``[-80, 40]`` so that ``sigma`` and ``log sigma``
stay finite in float32) -- and a prior chosen by name or object
(:mod:`tfbnn.priors`). They differ only in how a forward pass samples:

=========================  ==========================================  ==========================
layer                      forward pass (x: [..., d], W: [d, u])        cost per step
=========================  ==========================================  ==========================
DenseReparameterization    W = mu + sigma * eps, one eps per step;     one weight-sized normal
                           y = x W + b                                 draw, one matmul
DenseFlipout               y = x mu + ((x * s_in) (sigma * eps)) *     one weight-sized draw,
                           s_out, s_in / s_out random signs per        two matmuls; near-
                           example (Wen et al. 2018, eq. 3)            independent per example
DenseLocalReparameteri-    y ~ N(x mu + b_mu, x^2 sigma^2 + b_sig^2)   no weight-sized draw with
zation                     sampled per example and unit (Kingma et     a closed-form KL; two
                           al. 2015, sec. 2.3)                         matmuls; lowest variance
=========================  ==========================================  ==========================

Which to pick: local reparameterization is the fastest and has the lowest
gradient variance, but samples pre-activations, so its samples are independent
per example (use it for training and Monte Carlo prediction). Reparameterization
samples one weight matrix shared by the batch (the textbook Bayes-by-Backprop; the
one to use when a whole function sample is wanted). Flipout decorrelates the
examples of a batch at the price of a second matmul. With the scale-mixture prior
the KL is a Monte Carlo estimate at a weight sample, so local reparameterization
then also draws one weight-sized sample for the KL.

The KL (closed form for a Normal prior, Monte Carlo for the scale mixture) is
added to ``layer.losses`` as ``kl_weight * KL``; see :class:`BayesianLayer`.
"""


import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn import kl as kl_lib
from tfbnn import priors as priors_lib
from tfbnn.layers.base import BayesianLayer, input_features

__all__ = ["MeanFieldGaussian", "DenseReparameterization", "DenseFlipout", "DenseLocalReparameterization"]

_MIN_SCALE = kl_lib.SOFTPLUS_MIN_SCALE
PARAMETERIZATIONS = ("softplus", "log_variance")
# exp(-80) ~ 1.8e-35 is still a normal float32; exp(40) keeps x^2 sigma^2 sums finite.
_LOG_VARIANCE_RANGE = (-80.0, 40.0)


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


class MeanFieldGaussian(BayesianLayer):
    """Mean-field Gaussian posterior over a kernel and a bias: the base of the BbB layers.

    Not a dense layer: it holds the posterior ``q(w) = N(mu, sigma^2)`` per weight
    (``kernel_loc`` / ``kernel_rho``, ``bias_loc`` / ``bias_rho``; ``sigma =
    softplus(rho) + 1e-6`` or ``sigma^2 = exp(rho)``, Blundell et al. 2015, sec. 3.2),
    the priors, the KL (closed form, the fused softplus/Normal op
    :func:`tfbnn.kl.softplus_scale_and_normal_kl`, or Monte Carlo) and weight
    sampling under the T-sample Monte Carlo protocol
    (:meth:`StochasticLayer.set_weight_samples`). A subclass supplies the shapes
    (calling :meth:`_build_posterior` in ``build``) and the forward pass (``call``,
    ending in :meth:`_finish`); :class:`DenseBayesian` and the Bayesian convolutions
    are such subclasses.

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
            ``sigma^2 = exp(rho)`` with the log-variance parameterization).
            Default ``rho = -5`` (softplus) / ``rho = -10`` (log variance): sigma ~ 0.0067.
        parameterization: ``"softplus"`` (default, Blundell et al. 2015:
            ``sigma = softplus(rho) + 1e-6``) or ``"log_variance"`` (Graves 2011:
            ``sigma^2 = exp(rho)``, ``rho`` clipped to ``[-80, 40]``). With
            ``bias_prior=None`` the latter is Graves' variational dense layer
            (:class:`tfbnn.layers.GravesDense`; ``kernel_prior="graves"`` for his adaptive prior).
        kl_weight, inference_mode, seed: see :class:`BayesianLayer`.

    Renamed in tfbnn 0.2 (the old names still load and, with a
    ``DeprecationWarning``, construct): ``kernel_loc_initializer`` ->
    ``kernel_initializer``, ``bias_loc_initializer`` -> ``bias_initializer``,
    ``kernel_rho_initializer`` -> ``kernel_scale_initializer``,
    ``bias_rho_initializer`` -> ``bias_scale_initializer``,
    ``posterior_parameterization`` -> ``parameterization``.

    """

    renamed_arguments = {
        "kernel_loc_initializer": "kernel_initializer",
        "bias_loc_initializer": "bias_initializer",
        "kernel_rho_initializer": "kernel_scale_initializer",
        "bias_rho_initializer": "bias_scale_initializer",
        "posterior_parameterization": "parameterization",
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
        parameterization="softplus",
        **kwargs,
    ):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        if parameterization not in PARAMETERIZATIONS:
            raise ValueError(
                f"Expected `parameterization` in {PARAMETERIZATIONS}. "
                f"Received: parameterization={parameterization!r}"
            )
        self.parameterization = parameterization
        default_rho = (
            _default_rho_initializer if parameterization == "softplus" else _default_log_variance_initializer
        )
        self.activation = checks.activation(activation)
        self.use_bias = bool(use_bias)
        self.kernel_prior = priors_lib.get(kernel_prior, name="kernel_prior")
        self.bias_prior = None if bias_prior is None else priors_lib.get(bias_prior, name="bias_prior")
        self.kernel_initializer = checks.initializer("kernel_initializer", kernel_initializer)
        self.kernel_scale_initializer = checks.initializer(
            "kernel_scale_initializer", default_rho() if kernel_scale_initializer is None else kernel_scale_initializer
        )
        self.bias_initializer = checks.initializer("bias_initializer", bias_initializer)
        self.bias_scale_initializer = checks.initializer(
            "bias_scale_initializer", default_rho() if bias_scale_initializer is None else bias_scale_initializer
        )

    @property
    def bayesian_bias(self):
        return self.use_bias and self.bias_prior is not None

    def _build_posterior(self, kernel_shape, bias_shape):
        """Makes the posterior weights of the given shapes (and the KL weight); checks the priors' shapes."""
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
        if self.bayesian_bias:
            self.bias_prior.check_shape(self.bias_loc.shape, "bias_prior")
        self._build_kl_weight()

    # -- posterior pieces ------------------------------------------------------
    def _scale(self, rho):
        if self.parameterization == "log_variance":
            return _log_variance_scale(rho)
        return _softplus_scale(rho)

    def kernel_scale(self):
        return self._scale(self.kernel_rho)

    def bias_scale(self):
        return self._scale(self.bias_rho) if self.bayesian_bias else None

    def _scale_and_kl(self, loc, rho, prior):
        """``(sigma, KL)``: the KL in closed form where the prior has one, else None.

        Softplus sigma with a Normal prior goes through one fused op with a
        hand-written gradient (:func:`tfbnn.kl.softplus_scale_and_normal_kl`).
        """
        if self.parameterization == "softplus" and type(prior) is priors_lib.Normal:
            return kl_lib.softplus_scale_and_normal_kl(loc, rho, prior)
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
        self.kernel_prior = priors_lib.Posterior(self.kernel_loc, self.kernel_scale())
        if self.bayesian_bias:
            self.bias_prior = priors_lib.Posterior(self.bias_loc, self.bias_scale())
        return self.kernel_prior, (self.bias_prior if self.bayesian_bias else None)

    def _kernel_scale_and_kl(self):
        return self._scale_and_kl(self.kernel_loc, self.kernel_rho, self.kernel_prior)

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
        total = self._kl(self.kernel_loc, scale, self.kernel_prior, kl)
        if self.bayesian_bias:
            scale, kl = self._bias_scale_and_kl()
            total = total + self._kl(self.bias_loc, scale, self.bias_prior, kl)
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

    def _finish(self, outputs, bias, kl, training):
        if bias is not None:
            outputs = self._add_bias(outputs, bias)
        if self._adds_kl:
            self._add_kl_loss(kl, training)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_prior": priors_lib.serialize(self.kernel_prior),
                "bias_prior": None if self.bias_prior is None else priors_lib.serialize(self.bias_prior),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "kernel_scale_initializer": keras.initializers.serialize(self.kernel_scale_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "bias_scale_initializer": keras.initializers.serialize(self.bias_scale_initializer),
                "parameterization": self.parameterization,
            }
        )
        return config


class DenseBayesian(MeanFieldGaussian):
    """The dense Bayes-by-Backprop layers' shapes and forward-pass pieces.

    Args:
        units: int > 0, output dimension.
        activation, use_bias, kernel_prior, bias_prior, kernel_initializer,
            kernel_scale_initializer, bias_initializer, bias_scale_initializer,
            kl_weight, inference_mode, seed, parameterization: see
            :class:`MeanFieldGaussian` (the same order after ``units``).

    Input shape: ``(batch, ..., input_dim)``, rank >= 2.
    Output shape: ``(batch, ..., units)``.
    """

    def __init__(self, units, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.units = checks.integer("units", units, 1)

    def build(self, input_shape):
        input_dim = input_features(self, input_shape)
        self._build_posterior(self._kernel_shape(input_dim), (self.units,))
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})

    def _kernel_shape(self, input_dim):
        return (input_dim, self.units)

    def _per_row_sampling(self, sampling):
        """Monte Carlo prediction with an independent weight sample per row."""
        return sampling and self._mc_prediction and not self._joint_samples

    def _local_reparameterization(self, inputs, scale=None, bias_scale=None):
        """Pre-activations sampled per row (Kingma et al. 2015, eq. 6), bias included.

        For a mean-field Gaussian posterior this is exact: each row's output has the
        distribution it would have under its own independent weight sample.
        ``scale`` / ``bias_scale``: sigma of kernel and bias when already computed.

        In Monte Carlo prediction (``T`` sample blocks of ``B`` rows) the first
        Bayesian layer usually sees the batch tiled ``T`` times; when all blocks
        are equal (checked, one read of the inputs) the mean and variance are
        computed on one block and broadcast, so its matmuls cost ``1/T``. Only the
        noise differs between blocks, so the result is the same in distribution
        and, for a given seed, in value.
        """
        if scale is None:
            scale = self.kernel_scale()
        if self.bayesian_bias and bias_scale is None:
            bias_scale = self.bias_scale()
        blocks = self._weight_samples
        rows = inputs.shape[0]
        # Prediction only: the data-dependent branch does not compile under XLA (a train step).
        shared = self._mc_prediction and not self._samples_add_kl and self._share_tiled_moments
        if shared and (rows is None or rows % blocks == 0):
            mean, variance = self._moments_of_tiled_rows(inputs, scale, bias_scale, blocks)
        else:
            mean, variance = self._moments(inputs, scale, bias_scale)
        eps = self._normal(tf.shape(mean), mean.dtype)
        # The floor keeps d sqrt(v)/dv finite where a ReLU zeroes a whole input row.
        return mean + tf.sqrt(variance + 1e-12) * eps

    # Set False to always compute the moments of every row (for tests and benchmarks).
    _share_tiled_moments = True

    def _moments(self, inputs, scale, bias_scale):
        """Mean and variance of the pre-activations, ``x mu + b_mu`` and ``x^2 sigma^2 + b_sigma^2``."""
        mean = keras.ops.matmul(inputs, self.kernel_loc)
        variance = keras.ops.matmul(tf.square(inputs), tf.square(scale))
        if self.use_bias:
            mean = mean + self.bias_loc
            if self.bayesian_bias:
                variance = variance + tf.square(bias_scale)
        return mean, variance

    def _moments_of_tiled_rows(self, inputs, scale, bias_scale, blocks):
        """:meth:`_moments`, computed once when the ``blocks`` row blocks of ``inputs`` are equal."""
        shape = tf.shape(inputs)
        rows = shape[0]
        per_block = rows // blocks

        def blocks_equal():
            flat = tf.reshape(inputs, tf.stack([blocks, -1]))
            return tf.reduce_all(tf.equal(flat, flat[:1]))

        def once():
            mean, variance = self._moments(inputs[:per_block], scale, bias_scale)
            reps = tf.concat([[blocks], tf.ones([tf.rank(mean) - 1], tf.int32)], axis=0)
            return tf.tile(mean, reps), tf.tile(variance, reps)

        tiled = tf.cond(tf.equal(rows % blocks, 0), blocks_equal, lambda: tf.constant(False))
        return tf.cond(tiled, once, lambda: self._moments(inputs, scale, bias_scale))

    def _matmul(self, inputs, kernel):
        """``inputs @ kernel``; a kernel of rank 3 holds one sample per block of rows."""
        if kernel.shape.rank == 2:
            return keras.ops.matmul(inputs, kernel)
        shape = tf.shape(inputs)
        x = tf.reshape(inputs, tf.stack([tf.shape(kernel)[0], -1, shape[-1]]))
        return tf.reshape(tf.matmul(x, kernel), tf.concat([shape[:-1], [self.units]], axis=0))

    def _add_bias(self, outputs, bias):
        if bias.shape.rank == 1:
            return outputs + bias
        shape = tf.shape(outputs)
        per_sample = tf.reshape(outputs, tf.stack([tf.shape(bias)[0], -1, self.units]))
        return tf.reshape(per_sample + bias[:, None, :], shape)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config["units"] = self.units
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseReparameterization(DenseBayesian):
    """Bayes-by-Backprop dense layer with the reparameterization estimator.

    Each call draws one kernel ``W = mu + sigma * eps``, ``eps ~ N(0, I)``, shared
    by the whole batch (Blundell et al. 2015, sec. 3.2, eq. 3-4), and returns
    ``activation(x W + b)``. The KL against the prior is closed form for a Normal
    prior and the one-sample estimate ``log q(W) - log p(W)`` (eq. 2) for the
    scale mixture, evaluated at the same ``W``.

    Args: see :class:`DenseBayesian` (``units``, ``activation``, priors,
    initializers, ``kl_weight``, ``inference_mode``, ``seed``).

    Input shape: ``(batch, ..., input_dim)``; output ``(batch, ..., units)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((4,)),
        ...     tfbnn.layers.DenseReparameterization(8, activation="relu", kl_weight=1 / 100),
        ...     tfbnn.layers.DenseReparameterization(3, kernel_prior="scale_mixture", kl_weight=1 / 100),
        ... ])
        >>> model(np.zeros((2, 4), "float32")).shape
        TensorShape([2, 3])

    Reference:
        Blundell et al. Weight Uncertainty in Neural Networks. ICML 2015.
    """

    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        if self._per_row_sampling(sampling):
            return self._finish(self._local_reparameterization(inputs), None, 0.0, training)
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        if sampling:
            kernel, kl = self._sample(loc, scale, self.kernel_prior, self._num_samples(sampling), kl)
        else:
            kernel, kl = loc, self._kl(loc, scale, self.kernel_prior, kl)
        bias, bias_kl = self._bias(sampling)
        outputs = self._matmul(inputs, kernel)
        return self._finish(outputs, bias, kl + bias_kl, training)


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseFlipout(DenseBayesian):
    """Bayes-by-Backprop dense layer with the Flipout estimator.

    One weight perturbation ``dW = sigma * eps`` per call is decorrelated across
    the examples of the batch by random signs (Wen et al. 2018, eq. 3)::

        y = x mu + ((x * s_in) dW) * s_out,   s_in, s_out in {-1, +1}

    so every example sees a different (pseudo-independent) weight sample at the
    cost of a second matmul. The KL is that of :class:`DenseReparameterization`,
    evaluated at ``W = mu + dW`` when it is a Monte Carlo estimate.

    Args: see :class:`DenseBayesian`.

    Input shape: ``(batch, ..., input_dim)``; output ``(batch, ..., units)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.DenseFlipout(3, seed=1, kl_weight=0.01)
        >>> layer(np.ones((2, 4), "float32")).shape
        TensorShape([2, 3])

    Reference:
        Wen, Vicol, Ba, Tran, Grosse. Flipout: Efficient Pseudo-Independent Weight
        Perturbations on Mini-Batches. ICLR 2018.
    """

    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        if self._per_row_sampling(sampling):
            return self._finish(self._local_reparameterization(inputs), None, 0.0, training)
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        outputs = keras.ops.matmul(inputs, loc)
        if sampling:
            num_samples = self._num_samples(sampling)
            shape = tf.shape(loc) if num_samples == 1 else tf.concat([[num_samples], tf.shape(loc)], 0)
            eps = self._normal(shape, loc.dtype)
            delta = scale * eps
            signs = self._signs(inputs)
            perturbation = self._matmul(inputs * signs[0], delta) * signs[1]
            outputs = outputs + perturbation
            if kl is None:
                kl = kl_lib.monte_carlo_kl(loc + delta, eps, scale, self.kernel_prior) / num_samples
        else:
            kl = self._kl(loc, scale, self.kernel_prior, kl)
        bias, bias_kl = self._bias(sampling)
        return self._finish(outputs, bias, kl + bias_kl, training)

    def _signs(self, inputs):
        in_shape = tf.shape(inputs)
        out_shape = tf.concat([in_shape[:-1], [self.units]], axis=0)
        seeds = tf.random.experimental.stateless_split(self._next_seed(), 2)
        return (
            self._rademacher(in_shape, inputs.dtype, seeds[0]),
            self._rademacher(out_shape, inputs.dtype, seeds[1]),
        )


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseLocalReparameterization(DenseBayesian):
    """Bayes-by-Backprop dense layer with the local reparameterization trick.

    For a factorized Gaussian posterior the pre-activations are Gaussian, so they
    are sampled directly, independently per example and unit (Kingma, Salimans,
    Welling 2015, sec. 2.3, eq. 6)::

        gamma = x mu + b_mu,   delta = x^2 sigma^2 + b_sigma^2,
        y = activation(gamma + sqrt(delta) * eps),   eps ~ N(0, I)

    No weight-sized random draw is needed when the KL is closed form (Normal
    prior); with the scale-mixture prior one weight sample is drawn for the Monte
    Carlo KL only.

    Args: see :class:`DenseBayesian`.

    Input shape: ``(batch, ..., input_dim)``; output ``(batch, ..., units)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.DenseLocalReparameterization(3, seed=1, kl_weight=0.01)
        >>> layer(np.ones((2, 4), "float32")).shape
        TensorShape([2, 3])

    Reference:
        Kingma, Salimans, Welling. Variational Dropout and the Local
        Reparameterization Trick. NeurIPS 2015.
    """

    def call(self, inputs, training=None):
        scale, kl = self._kernel_scale_and_kl()
        bias_scale, bias_kl = self._bias_scale_and_kl() if self.bayesian_bias else (None, 0.0)
        if not self._adds_kl:
            kl = 0.0
        else:
            # Training with T samples (weight_samples(..., with_kl=True)): a Monte
            # Carlo KL is averaged over T draws, like the other estimators' T samples.
            draws = self._weight_samples
            kl = self._kl(self.kernel_loc, scale, self.kernel_prior, kl, draws)
            if self.bayesian_bias:
                kl = kl + self._kl(self.bias_loc, bias_scale, self.bias_prior, bias_kl, draws)
        if self._sampling(training):
            outputs = self._local_reparameterization(inputs, scale, bias_scale)
        else:
            outputs = keras.ops.matmul(inputs, self.kernel_loc)
            if self.use_bias:
                outputs = outputs + self.bias_loc
        return self._finish(outputs, None, kl, training)
