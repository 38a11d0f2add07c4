"""Bayes-by-Backprop dense layers: reparameterization, Flipout, local reparameterization.

All three share one model. Each weight has an independent Gaussian posterior

    q(w_ij) = N(mu_ij, sigma_ij^2),   sigma_ij = softplus(rho_ij) + 1e-6,

(Blundell et al. 2015, sec. 3.2) -- or, with
``scale_parameterization="log_variance"``, ``sigma_ij^2 = exp(rho_ij)``
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
added to ``layer.losses`` as ``kl_weight * KL``; see :class:`tfbnn.layers.BayesianLayer`.
The posterior and the reparameterization and Flipout estimators are those of
:mod:`tfbnn.layers.mean_field`; these layers add the dense shapes
(:class:`tfbnn.layers.DenseArguments`) and exact per-example samples in Monte Carlo
prediction.
"""

import keras
import tensorflow as tf

from tfbnn.layers.arguments import DenseArguments
from tfbnn.layers.mean_field import MeanFieldFlipout, MeanFieldGaussian

__all__ = ["DenseReparameterization", "DenseFlipout", "DenseLocalReparameterization"]


class DenseBayesian(DenseArguments, MeanFieldGaussian):
    """The dense Bayes-by-Backprop layers' shapes and their exact per-example Monte Carlo samples.

    Args:
        units: int > 0, output dimension.
        *args: the arguments of :class:`tfbnn.layers.MeanFieldGaussian` in its order
            (``activation``, ``use_bias``, ``kernel_prior``, ``bias_prior``,
            ``kernel_initializer``, ``kernel_scale_initializer``, ``bias_initializer``,
            ``bias_scale_initializer``, ``kl_weight``, ``inference_mode``, ``seed``,
            ``scale_parameterization``, ``posterior``, ``posterior_rank``,
            ``kernel_factor_initializer``), after ``units``. ``posterior="low_rank"``
            gives the kernel a low-rank plus diagonal covariance; in Monte Carlo
            prediction per row (and in :class:`DenseLocalReparameterization`) its
            pre-activations are then sampled exactly as
            ``x mu + sqrt(x^2 sigma^2) * eps + (x L) z``, ``z ~ N(0, I_r)`` per row.
        **kwargs: the same, by name.

    Input shape: ``(batch, ..., input_dim)``, rank >= 2.
    Output shape: ``(batch, ..., units)``.
    """

    #: Inside :func:`tfbnn.weight_samples`, whether a batch tiled ``T`` times gets the moments of
    #: :meth:`preactivation_moments` computed on one block (True, the default) or on every row.
    share_tiled_moments = True

    def call(self, inputs, training=None):
        if self._per_row_sampling(self._sampling(training)):
            return self._finish(self._local_reparameterization(inputs), None, training, 0.0)
        return super().call(inputs, training)

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
        if self.low_rank:
            return self._low_rank_local_reparameterization(inputs, scale, bias_scale)
        blocks = self._weight_samples
        rows = inputs.shape[0]
        # Prediction only: the data-dependent branch does not compile under XLA (a train step).
        shared = self._mc_prediction and not self._samples_add_kl and self.share_tiled_moments
        if shared and (rows is None or rows % blocks == 0):
            mean, variance = self._moments_of_tiled_rows(inputs, scale, bias_scale, blocks)
        else:
            mean, variance = self.preactivation_moments(inputs, scale, bias_scale)
        eps = self._normal(tf.shape(variance), variance.dtype)
        # The floor keeps d sqrt(v)/dv finite where a ReLU zeroes a whole input row.
        return mean + tf.cast(tf.sqrt(variance + 1e-12) * eps, mean.dtype)

    def _low_rank_local_reparameterization(self, inputs, scale, bias_scale):
        """Pre-activations of a low-rank posterior sampled per row, exactly.

        ``y = x W + b`` with ``W = mu + sigma * eps + L z`` is, per row,
        ``x mu + b_mu + sqrt(x^2 sigma^2 + b_sigma^2) * eps' + (x L) z`` with
        ``eps' ~ N(0, I_units)`` and ``z ~ N(0, I_r)`` drawn per row: the diagonal
        part is independent across units, the low-rank part shared through ``z``.
        """
        mean, variance = self._diagonal_moments(inputs, scale, bias_scale)
        projected = self._factor_projection(inputs)
        z = self._normal(tf.concat([tf.shape(projected)[:-2], [self.posterior_rank]], 0), projected.dtype)
        eps = self._normal(tf.shape(variance), variance.dtype)
        noise = tf.sqrt(variance + 1e-12) * eps + tf.einsum("...ur,...r->...u", projected, z)
        return mean + tf.cast(noise, mean.dtype)

    def _factor_projection(self, inputs):
        """``x L``: ``(batch, ..., units, r)``, the inputs through each column of the low-rank factor
        (float32, the factor's dtype, under mixed precision too: it is part of the noise's scale)."""
        factor = tf.reshape(self.kernel_factor, [-1, self.units * self.posterior_rank])
        projected = keras.ops.matmul(tf.cast(inputs, factor.dtype), factor)
        return tf.reshape(projected, tf.concat([tf.shape(inputs)[:-1], [self.units, self.posterior_rank]], 0))

    def preactivation_moments(self, inputs, scale=None, bias_scale=None):
        """The posterior mean and variance of the pre-activations, ``x mu + b_mu`` and ``x^2 sigma^2 + b_sigma^2``.

        Args:
            inputs: ``(batch, ..., input_dim)``.
            scale, bias_scale: sigma of the kernel and of a Bayesian bias when already
                computed (default: :meth:`kernel_scale`, :meth:`bias_scale`).

        Returns:
            ``(mean, variance)``, each ``(batch, ..., units)``. With a low-rank
            posterior the variance adds ``sum_k ((x L)_jk)^2`` (the marginal
            variances; the units are then correlated). The mean is in the dtype of
            the inputs; the variance is float32 (the variables' dtype) under mixed
            precision too, where ``sigma^2`` of 1e-8 would be 0 in float16.
        """
        mean, variance = self._diagonal_moments(inputs, scale, bias_scale)
        if self.low_rank:
            variance = variance + tf.reduce_sum(tf.square(self._factor_projection(inputs)), -1)
        return mean, variance

    def _diagonal_moments(self, inputs, scale=None, bias_scale=None):
        """:meth:`preactivation_moments` of the diagonal part of the posterior."""
        if scale is None:
            scale = self.kernel_scale()
        if self.bayesian_bias and bias_scale is None:
            bias_scale = self.bias_scale()
        mean = keras.ops.matmul(inputs, tf.cast(self.kernel_loc, inputs.dtype))
        variance = keras.ops.matmul(tf.square(tf.cast(inputs, scale.dtype)), tf.square(scale))
        if self.use_bias:
            mean = mean + tf.cast(self.bias_loc, mean.dtype)
            if self.bayesian_bias:
                variance = variance + tf.square(bias_scale)
        return mean, variance

    def _moments_of_tiled_rows(self, inputs, scale, bias_scale, blocks):
        """:meth:`preactivation_moments`, computed once when the ``blocks`` row blocks of ``inputs`` are equal."""
        shape = tf.shape(inputs)
        rows = shape[0]
        per_block = rows // blocks

        def blocks_equal():
            flat = tf.reshape(inputs, tf.stack([blocks, -1]))
            return tf.reduce_all(tf.equal(flat, flat[:1]))

        def once():
            mean, variance = self.preactivation_moments(inputs[:per_block], scale, bias_scale)
            reps = tf.concat([[blocks], tf.ones([tf.rank(mean) - 1], tf.int32)], axis=0)
            return tf.tile(mean, reps), tf.tile(variance, reps)

        tiled = tf.cond(tf.equal(rows % blocks, 0), blocks_equal, lambda: tf.constant(False))
        return tf.cond(tiled, once, lambda: self.preactivation_moments(inputs, scale, bias_scale))

    def _apply_kernel(self, inputs, kernel):
        """``inputs @ kernel``; a kernel of rank 3 holds one sample per block of rows (one batched matmul).

        The kernel is cast to the dtype of the inputs (the compute dtype under mixed precision).
        """
        kernel = tf.cast(kernel, inputs.dtype)
        if kernel.shape.rank == 2:
            return keras.ops.matmul(inputs, kernel)
        shape = tf.shape(inputs)
        x = tf.reshape(inputs, tf.stack([tf.shape(kernel)[0], -1, shape[-1]]))
        return tf.reshape(tf.matmul(x, kernel), tf.concat([shape[:-1], [self.units]], axis=0))

    def _apply_bias(self, outputs, bias):
        bias = tf.cast(bias, outputs.dtype)
        if bias.shape.rank == 1:
            return outputs + bias
        shape = tf.shape(outputs)
        per_sample = tf.reshape(outputs, tf.stack([tf.shape(bias)[0], -1, self.units]))
        return tf.reshape(per_sample + bias[:, None, :], shape)


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


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseFlipout(DenseBayesian, MeanFieldFlipout):
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
        >>> y = layer(np.ones((2, 4), "float32")).numpy()   # two equal examples
        >>> y.shape, bool(np.allclose(y[0], y[1]))             # see two different kernels
        ((2, 3), False)

    Reference:
        Wen, Vicol, Ba, Tran, Grosse. Flipout: Efficient Pseudo-Independent Weight
        Perturbations on Mini-Batches. ICLR 2018.
    """


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
        >>> x = np.ones((2, 4), "float32")
        >>> layer = tfbnn.layers.DenseLocalReparameterization(3, seed=1, kl_weight=0.01)
        >>> y = layer(x)
        >>> mean, variance = layer.preactivation_moments(x)   # y is drawn from N(mean, variance)
        >>> y.shape == mean.shape == variance.shape
        True

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
            kl = self._kernel_kl(scale, kl, draws)
            if self.bayesian_bias:
                kl = kl + tf.cast(self._kl(self.bias_loc, bias_scale, self.bias_prior, bias_kl, draws), kl.dtype)
        if self._sampling(training):
            outputs = self._local_reparameterization(inputs, scale, bias_scale)
        else:
            outputs = keras.ops.matmul(inputs, self.kernel_loc)
            if self.use_bias:
                outputs = outputs + self.bias_loc
        return self._finish(outputs, None, training, kl)
