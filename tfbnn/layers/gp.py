"""The SNGP output layer: a Gaussian process approximated by random Fourier features, with a Laplace covariance.

Liu et al. (2020, sec. 3.1) replace a classifier's dense output layer by a GP with an RBF
kernel on the (spectrally normalized) hidden features ``h``, approximated by ``D`` random
Fourier features (Rahimi & Recht 2007) and a Laplace posterior over the output weights:

    phi(h) = s * cos(W h / sqrt(l) + b),   W_jk ~ N(0, 1),  b_j ~ U(0, 2 pi)   (fixed, seeded)
    logits = phi(h)^T beta                                                     (beta trained)

with ``s = sqrt(2 / D)`` (``scale_random_features``) and ``l`` = ``gp_kernel_scale``, so
that ``phi(h)^T phi(h') ~= exp(-||h - h'||^2 / (2 l))``. The posterior precision of
``beta`` is accumulated over the training data (Liu et al. 2020, eq. 9):

    P = ridge * I + sum_i w_i phi_i phi_i^T,   w_i = 1  (Gaussian, the default),  w_i = p_i (1 - p_i)  (logistic)

where ``p_i`` is ``sigmoid(logit)`` for one unit and the largest softmax probability for
several (one covariance shared by the classes, as SNGP's reference implementations). The
Gaussian weights are the default of Edward2's layer and of the reference code, for
classifiers too: with the logistic weights, the examples a classifier fits confidently add
almost nothing to ``P`` and the variance stays near the prior's everywhere (a held-out
digit detected at AUROC 0.39 against 0.67, mean of three seeds, docs/guides/single-pass.md). With
``gp_cov_momentum < 0`` the sum is exact over an epoch (reset it at each epoch start:
:class:`tfbnn.sngp.ResetCovariance`); with ``0 <= m < 1`` it is a moving average,
``P <- m P + (1 - m) * (batch sum) / B``. At inference the posterior covariance of the
logits of inputs ``Phi`` is ``Phi Sigma Phi^T`` with ``Sigma = P^{-1}``, and a classifier's
outputs (a softmax or sigmoid ``activation``, whatever the precision weights) use the
mean-field approximation of the predictive (Lu et al. 2020; Liu et al. 2020, eq. 10):

    logits_adjusted = logits / sqrt(1 + lambda * var),   var = diag(Phi Sigma Phi^T),   lambda = pi / 8
"""

import math

import keras
import tensorflow as tf

from tfbnn._internal import checks

__all__ = ["RandomFeatureGaussianProcess", "GP_COV_LIKELIHOODS"]

#: Values of ``gp_cov_likelihood``: the Laplace weights ``w_i`` of the precision.
GP_COV_LIKELIHOODS = ("auto", "gaussian", "logistic")
_CLASSIFIER_ACTIVATIONS = ("softmax", "sigmoid")


@keras.saving.register_keras_serializable(package="tfbnn")
class RandomFeatureGaussianProcess(keras.layers.Layer):
    """A random-feature GP output layer with a Laplace posterior covariance (SNGP, Liu et al. 2020).

    See the module docstring for the model. In training the layer returns
    ``activation(logits)`` and adds the batch to the precision ``P``; at inference it
    returns ``activation(logits / sqrt(1 + lambda * var))`` for a classifier (a softmax or
    sigmoid ``activation``: the mean-field predictive) and ``activation(logits)`` otherwise.

    Args:
        units: int >= 1, outputs (classes).
        num_inducing: int >= 1, ``D`` random features. Default 1024.
        normalize_input: bool; a ``LayerNormalization`` of the input first. Default False.
        scale_random_features: bool; scale the features by ``sqrt(2 / D)``. Default True.
        gp_kernel_scale: float > 0, ``l`` of the RBF kernel ``exp(-||h - h'||^2 / (2 l))``. Default 1.
        gp_cov_momentum: float < 1; negative: the exact sum over an epoch (default -1), else the
            moving average's momentum.
        gp_cov_ridge_penalty: float > 0, the prior precision ``ridge``. Default 1.
        gp_cov_likelihood: one of :data:`GP_COV_LIKELIHOODS`, the precision weights:
            ``"gaussian"`` (default, ``w_i = 1``: Edward2's and the reference code's default),
            ``"logistic"`` (``w_i = p_i (1 - p_i)``, the Laplace weights of a classifier) or
            ``"auto"`` (logistic with a softmax or sigmoid ``activation``, else Gaussian).
        mean_field_factor: float >= 0, ``lambda`` of a classifier's mean-field adjustment (a softmax
            or sigmoid ``activation``). Default ``pi / 8`` (0: no adjustment).
        activation: the output activation (the zoo's classifier: ``"softmax"``). Default None.
        use_bias: bool; a trainable output bias. Default True.
        seed: int or None, seeds ``W`` and ``b``.

    Input shape: ``(B, d)``. Output shape: ``(B, units)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> gp = tfbnn.layers.RandomFeatureGaussianProcess(3, num_inducing=16, activation="softmax", seed=0)
        >>> h = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
        >>> _ = gp(h, training=True)                       # adds the batch to the precision
        >>> tuple(gp.posterior_covariance(h).shape), tuple(gp.predictive_variance(h).shape)
        ((5, 5), (5,))

    References:
        Liu et al. Simple and Principled Uncertainty Estimation with Deterministic Deep Learning via
        Distance Awareness. NeurIPS 2020 (sec. 3.1, eq. 9-10). Rahimi, Recht. Random Features for
        Large-Scale Kernel Machines. NeurIPS 2007. Lu, Ie, Sha. Mean-Field Approximation to Gaussian-Softmax
        Integral with Application to Uncertainty Estimation. arXiv:2006.07584, 2020.
    """

    def __init__(self, units, num_inducing=1024, normalize_input=False, scale_random_features=True,
                 gp_kernel_scale=1.0, gp_cov_momentum=-1.0, gp_cov_ridge_penalty=1.0, gp_cov_likelihood="gaussian",
                 mean_field_factor=math.pi / 8, activation=None, use_bias=True, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.units = checks.integer("units", units, 1)
        self.num_inducing = checks.integer("num_inducing", num_inducing, 1)
        self.normalize_input = bool(normalize_input)
        self.scale_random_features = bool(scale_random_features)
        self.gp_kernel_scale = checks.number("gp_kernel_scale", gp_kernel_scale, low=0, low_open=True)
        self.gp_cov_momentum = checks.number("gp_cov_momentum", gp_cov_momentum, high=1, high_open=True)
        self.gp_cov_ridge_penalty = checks.number("gp_cov_ridge_penalty", gp_cov_ridge_penalty, low=0, low_open=True)
        if gp_cov_likelihood not in GP_COV_LIKELIHOODS:
            raise ValueError(f"Expected `gp_cov_likelihood` in {list(GP_COV_LIKELIHOODS)}. "
                             f"Received: gp_cov_likelihood={gp_cov_likelihood!r}")
        self.gp_cov_likelihood = gp_cov_likelihood
        self.mean_field_factor = checks.number("mean_field_factor", mean_field_factor, low=0)
        self.activation = checks.activation(activation)
        self.use_bias = bool(use_bias)
        self.seed = checks.seed(seed)
        self.input_norm = (keras.layers.LayerNormalization(name="input_norm", dtype=self.dtype_policy)
                           if self.normalize_input else None)

    @property
    def is_classifier(self):
        """Whether the outputs are a classifier's (a softmax or sigmoid ``activation``): they take the
        mean-field adjustment at inference."""
        return getattr(self.activation, "__name__", None) in _CLASSIFIER_ACTIVATIONS

    @property
    def logistic_weights(self):
        """Whether the precision takes the logistic weights ``p (1 - p)`` (else ``w_i = 1``)."""
        if self.gp_cov_likelihood != "auto":
            return self.gp_cov_likelihood == "logistic"
        return self.is_classifier

    def build(self, input_shape):
        if len(input_shape) != 2 or input_shape[-1] is None:
            raise ValueError(f"Expected inputs of shape (batch, features). Received: input_shape={input_shape}")
        d, n = int(input_shape[-1]), self.num_inducing
        if self.input_norm is not None:
            self.input_norm.build(input_shape)
        seed = None if self.seed is None else self.seed + 1
        # The fixed feature weights and the precision are not autocast: the features and the covariance
        # algebra stay in float32 under a mixed policy (TensorFlow has no float16 or bfloat16 Cholesky).
        self.feature_kernel = self.add_weight(name="feature_kernel", shape=(d, n), trainable=False, autocast=False,
                                              initializer=keras.initializers.RandomNormal(stddev=1.0, seed=self.seed))
        self.feature_bias = self.add_weight(name="feature_bias", shape=(n,), trainable=False, autocast=False,
                                            initializer=keras.initializers.RandomUniform(0.0, 2 * math.pi, seed=seed))
        self.kernel = self.add_weight(name="kernel", shape=(n, self.units), initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros") if self.use_bias else None
        self.precision = self.add_weight(name="precision", shape=(n, n), trainable=False, autocast=False,
                                         initializer=keras.initializers.Identity(self.gp_cov_ridge_penalty))
        self.built = True

    # -- the math --------------------------------------------------------------------------
    def features(self, inputs):
        """``Phi``: the ``(B, D)`` random Fourier features of ``inputs``, float32 under any dtype policy.

        In float32 also under a mixed policy: ``cos(W h + b)`` of an argument of some tens in
        float16 (bfloat16) would be off by about 0.03 (0.2); the logits' matmul takes them in
        the compute dtype.
        """
        h = tf.convert_to_tensor(inputs)
        if self.input_norm is not None:
            h = self.input_norm(tf.cast(h, self.compute_dtype))
        h = tf.cast(h, tf.float32) / math.sqrt(self.gp_kernel_scale)
        phi = tf.cos(tf.matmul(h, self.feature_kernel) + self.feature_bias)
        return phi * math.sqrt(2.0 / self.num_inducing) if self.scale_random_features else phi

    def _logits(self, phi):
        logits = tf.matmul(phi, tf.cast(self.kernel, phi.dtype))
        return logits + tf.cast(self.bias, phi.dtype) if self.use_bias else logits

    def _laplace_weights(self, logits):
        if not self.logistic_weights:
            return tf.ones_like(logits[:, 0])
        p = tf.sigmoid(logits[:, 0]) if self.units == 1 else tf.reduce_max(tf.nn.softmax(logits), axis=-1)
        return p * (1.0 - p)

    def update_precision(self, phi, logits):
        """Adds the batch ``(Phi, logits)`` to the precision (exact sum or moving average), in float32."""
        phi = tf.cast(tf.stop_gradient(phi), tf.float32)
        weights = self._laplace_weights(tf.cast(tf.stop_gradient(logits), tf.float32))
        weighted = phi * tf.sqrt(weights)[:, None]
        batch = tf.matmul(weighted, weighted, transpose_a=True)
        m = self.gp_cov_momentum
        if m < 0:
            self.precision.assign_add(batch)
        else:
            size = tf.cast(tf.shape(phi)[0], phi.dtype)
            self.precision.assign(m * self.precision + (1.0 - m) * batch / size)

    def reset_covariance(self):
        """Sets the precision back to ``ridge * I`` (the start of an epoch's exact sum)."""
        self.precision.assign(self.gp_cov_ridge_penalty * tf.eye(self.num_inducing, dtype=self.precision.dtype))

    def covariance(self):
        """``Sigma = P^{-1}``, the ``(D, D)`` float32 posterior covariance of the output weights."""
        return tf.linalg.cholesky_solve(tf.linalg.cholesky(self.precision),
                                        tf.eye(self.num_inducing, dtype=self.precision.dtype))

    def covariance_factor(self):
        """``C = L^{-T}`` with ``P = L L^T``: ``Sigma = C C^T`` (float32, upper triangular ``(D, D)``).

        ``diag(Phi Sigma Phi^T)`` is then the row-wise ``||Phi C||^2``: matmuls only, which is how
        an export (:func:`tfbnn.export.export`) serves the variance without a triangular solve.
        """
        chol = tf.linalg.cholesky(self.precision)
        return tf.transpose(tf.linalg.triangular_solve(chol, tf.eye(self.num_inducing, dtype=chol.dtype),
                                                       lower=True))

    def _whitened(self, phi):
        """``L^{-1} Phi^T`` with ``P = L L^T`` (float32): its columns' inner products are ``Phi Sigma Phi^T``."""
        return tf.linalg.triangular_solve(tf.linalg.cholesky(self.precision), tf.transpose(tf.cast(phi, tf.float32)),
                                          lower=True)

    def posterior_covariance(self, inputs):
        """``Phi Sigma Phi^T``: the ``(B, B)`` float32 posterior covariance of the logits (each class) of ``inputs``."""
        a = self._whitened(self.features(inputs))
        return tf.matmul(a, a, transpose_a=True)

    def predictive_variance(self, inputs):
        """``diag(Phi Sigma Phi^T)``: the ``(B,)`` float32 posterior variance of each input's logits."""
        return self._variance(self.features(inputs))

    def _variance(self, phi):
        factor = getattr(self, "_frozen_factor", None)
        if factor is not None:  # an export's constant factor: no solve in the served graph
            return tf.reduce_sum(tf.square(tf.matmul(tf.cast(phi, tf.float32), tf.constant(factor))), axis=-1)
        return tf.reduce_sum(tf.square(self._whitened(phi)), axis=0)

    def call(self, inputs, training=False):
        phi = self.features(inputs)
        logits = self._logits(tf.cast(phi, self.compute_dtype))
        if training:
            self.update_precision(phi, logits)
        elif self.is_classifier and self.mean_field_factor > 0:
            scale = tf.sqrt(1.0 + self.mean_field_factor * self._variance(phi))[:, None]
            logits = logits / tf.cast(scale, logits.dtype)
        return logits if self.activation is None else self.activation(logits)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "num_inducing": self.num_inducing,
                "normalize_input": self.normalize_input, "scale_random_features": self.scale_random_features,
                "gp_kernel_scale": self.gp_kernel_scale, "gp_cov_momentum": self.gp_cov_momentum,
                "gp_cov_ridge_penalty": self.gp_cov_ridge_penalty, "gp_cov_likelihood": self.gp_cov_likelihood,
                "mean_field_factor": self.mean_field_factor,
                "activation": keras.activations.serialize(self.activation), "use_bias": self.use_bias,
                "seed": self.seed}
