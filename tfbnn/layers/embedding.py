"""A Bayesian embedding: a mean-field Gaussian posterior over the embedding matrix.

``EmbeddingReparameterization`` is ``keras.layers.Embedding`` with a distribution over
its ``(input_dim, output_dim)`` matrix ``E``: ``q(E_vj) = N(mu_vj, sigma_vj^2)``, the
posterior of :class:`tfbnn.layers.MeanFieldGaussian` (priors, scale parameterizations, the
closed-form or Monte Carlo KL, ``kl_weight``, seeds, the sampling switch), Edward2's
``EmbeddingReparameterization`` in Keras 3.

A call samples only the rows it looks up: the distinct ids of the batch are found
(``tf.unique``), one row ``E_v = mu_v + sigma_v * eps_v`` is drawn per distinct id and
gathered back, so every occurrence of an id in the batch sees the same row. That is
exactly a sample of the whole matrix ``E ~ q`` restricted to the rows used, at the
cost of ``distinct ids x output_dim`` normal draws instead of ``input_dim x output_dim``
(a 50 000-word vocabulary costs no more than the batch's words). The KL covers the
whole matrix: closed form for a Normal prior; for a prior without one (the scale
mixture) a Monte Carlo estimate at a full matrix sample.
"""

import keras
import tensorflow as tf

from tfbnn import priors as priors_lib
from tfbnn._internal import checks
from tfbnn.layers.base import BayesianLayer
from tfbnn.layers.mean_field import MeanFieldGaussian

__all__ = ["EmbeddingReparameterization"]


@keras.saving.register_keras_serializable(package="tfbnn")
class EmbeddingReparameterization(MeanFieldGaussian):
    """Bayesian embedding with a mean-field Gaussian posterior, reparameterization estimator.

    For an id ``v`` the layer returns row ``v`` of a sample ``E = mu + sigma * eps``
    of the embedding matrix, ``sigma = softplus(rho) + 1e-6`` (Blundell et al. 2015,
    sec. 3.2, eq. 3-4); one matrix sample per call, shared by the batch, drawn only at
    the distinct ids the batch looks up (see the module docstring). The layer adds
    ``kl_weight * KL(q(E) || p(E))`` to its losses. In ``inference_mode="mean"`` it
    returns ``mu_v``. Inside :func:`tfbnn.weight_samples` with ``T`` samples, each
    block of rows gets its own matrix sample (``joint=True``) or every row its own
    (``joint=False``); the ids are made distinct per block (or row) before sampling.

    Args:
        input_dim: int > 0, the vocabulary size (ids in ``[0, input_dim)``).
        output_dim: int > 0, the embedding dimension.
        embeddings_initializer: Keras initializer of ``mu``. Default ``"uniform"``
            (as ``keras.layers.Embedding``).
        embeddings_scale_initializer: Keras initializer of ``rho``. Default
            ``rho = -5`` (``sigma ~ 0.0067``; ``-10`` with ``"log_variance"``).
        embeddings_prior: prior name, dict or :class:`tfbnn.priors.Prior`. Default
            ``"normal"`` (N(0, 1)).
        mask_zero: bool. Whether id 0 is padding: the layer then returns a mask
            (``inputs != 0``) that later layers (RNNs, attention) use, as
            ``keras.layers.Embedding``. Default False.
        scale_parameterization: ``"softplus"`` (default) or ``"log_variance"``, see
            :class:`tfbnn.layers.MeanFieldGaussian` (before tfbnn 0.3 ``parameterization``).
        kl_weight, inference_mode, seed: see :class:`tfbnn.layers.BayesianLayer`.

    The weights are ``kernel_loc`` and ``kernel_rho`` (``(input_dim, output_dim)``),
    the names of every Bayes-by-Backprop layer's posterior (so pruning and
    :func:`tfbnn.continual.posterior_as_prior` work on it as on a dense layer).

    Input shape: ``(batch, ...)`` integer ids in ``[0, input_dim)``; an id outside that range raises
    a ValueError (an ``InvalidArgumentError`` inside a compiled step). Output shape:
    ``(batch, ..., output_dim)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.EmbeddingReparameterization(10, 3, kl_weight=1e-3, seed=0)
        >>> y = layer(np.array([[1, 2, 1]])).numpy()
        >>> y.shape, bool(np.allclose(y[0, 0], y[0, 2]))   # id 1 twice: one row sample
        ((1, 3, 3), True)

    Reference:
        Blundell et al. Weight Uncertainty in Neural Networks. ICML 2015.
        Tran et al. Bayesian Layers: A Module for Neural Network Uncertainty.
        NeurIPS 2019 (Edward2's ``EmbeddingReparameterization``).
    """

    def __init__(
        self,
        input_dim,
        output_dim,
        embeddings_initializer="uniform",
        embeddings_scale_initializer=None,
        embeddings_prior="normal",
        mask_zero=False,
        kl_weight=None,
        inference_mode="sample",
        seed=None,
        scale_parameterization="softplus",
        **kwargs,
    ):
        # Checked under their own names first (the base would name its kernel_* arguments).
        embeddings_initializer = checks.initializer("embeddings_initializer", embeddings_initializer)
        if embeddings_scale_initializer is not None:
            embeddings_scale_initializer = checks.initializer("embeddings_scale_initializer",
                                                              embeddings_scale_initializer)
        embeddings_prior = priors_lib.get(embeddings_prior, name="embeddings_prior")
        super().__init__(
            use_bias=False,
            kernel_prior=embeddings_prior,
            bias_prior=None,
            kernel_initializer=embeddings_initializer,
            kernel_scale_initializer=embeddings_scale_initializer,
            kl_weight=kl_weight,
            inference_mode=inference_mode,
            seed=seed,
            scale_parameterization=scale_parameterization,
            **kwargs,
        )
        self.input_dim = checks.integer("input_dim", input_dim, 1)
        self.output_dim = checks.integer("output_dim", output_dim, 1)
        if not isinstance(mask_zero, bool):
            raise ValueError(f"Expected `mask_zero` to be a bool. Received: mask_zero={mask_zero!r}")
        self.mask_zero = mask_zero
        self.supports_masking = mask_zero

    def build(self, input_shape=None):
        self.build_posterior((self.input_dim, self.output_dim), None)

    def call(self, inputs, training=None):
        ids = self._checked_ids(tf.cast(inputs, "int32"))
        loc = self.kernel_loc
        scale, kl = self._kernel_scale_and_kl()
        if self._adds_kl:
            kl = self._kernel_kl(scale, kl, self._weight_samples if self._mc_prediction else 1)
        if not self._sampling(training):
            outputs = tf.gather(loc, ids)
        else:
            outputs = self._sample_rows(ids, loc, scale)
        # The rows in the compute dtype (float16 under a mixed policy), as keras.layers.Embedding's;
        # the matrix and the KL stay float32.
        return self._finish(tf.cast(outputs, self.compute_dtype), None, training, kl)

    def _checked_ids(self, ids):
        """``ids``, once every id lies in ``[0, input_dim)`` (sampling would otherwise wrap them silently)."""
        return checks.checked(
            ids,
            lambda: tf.reduce_all((ids >= 0) & (ids < self.input_dim)),
            f"Expected `inputs` to be ids in [0, input_dim) with input_dim={self.input_dim}.",
            lambda: f"inputs with min={int(tf.reduce_min(ids))}, max={int(tf.reduce_max(ids))}",
        )

    def _sample_rows(self, ids, loc, scale):
        """Row ``ids`` of one matrix sample (per block of rows, or per row, in Monte Carlo prediction)."""
        key = ids
        if self._mc_prediction:
            rows = tf.shape(ids)[0]
            group = tf.range(rows) if not self._joint_samples else tf.range(rows) // (rows // self._weight_samples)
            group = tf.reshape(group, tf.concat([[rows], tf.ones([tf.rank(ids) - 1], tf.int32)], 0))
            key = ids + self.input_dim * group
        distinct, where = tf.unique(tf.reshape(key, [-1]))
        vocabulary = distinct % self.input_dim
        rows = tf.gather(loc, vocabulary) + tf.gather(scale, vocabulary) * self._normal(
            tf.stack([tf.size(distinct), self.output_dim]), loc.dtype)
        return tf.reshape(tf.gather(rows, where), tf.concat([tf.shape(ids), [self.output_dim]], 0))

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return keras.ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        config = BayesianLayer.get_config(self)
        config.update(
            {
                "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "embeddings_initializer": keras.initializers.serialize(self.kernel_initializer),
                "embeddings_scale_initializer": keras.initializers.serialize(self.kernel_scale_initializer),
                "embeddings_prior": priors_lib.serialize(self.kernel_prior),
                "mask_zero": self.mask_zero,
                "scale_parameterization": self.scale_parameterization,
            }
        )
        return config
