"""Heteroscedastic classification: input-dependent, correlated Gaussian noise on the logits (Collier et al. 2021).

A classifier's labels are noisy in an input-dependent, class-correlated way (a cat
confused with a dog, not with a truck). Collier et al. (2021) model it with a latent
Gaussian on the logits whose covariance is computed from the features, and the
predictive is the Monte Carlo average of the tempered softmax.
"""

import math

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.layers.base import StochasticLayer

__all__ = ["HeteroscedasticSoftmax"]


@keras.saving.register_keras_serializable(package="tfbnn")
class HeteroscedasticSoftmax(StochasticLayer):
    """Dense output layer with correlated Gaussian logit noise and a Monte Carlo tempered softmax.

    From features ``h`` (``D`` wide) the layer computes, for ``K`` classes and ``R``
    factors, the logit mean ``mu = h W_mu + b_mu`` ``(K,)``, a low-rank factor ``V =
    reshape(h W_V + b_V, (K, R))`` and a diagonal scale ``d = softplus(h W_d + b_d) + min_scale``
    ``(K,)``. The latent logits are Gaussian with covariance ``V V^T + diag(d^2)``, and
    the class probabilities are (Collier et al. 2021, eq. 1-4 and sec. 3)::

        u_s = mu + V eps_s + d * eps'_s,    eps_s ~ N(0, I_R),  eps'_s ~ N(0, I_K)
        p   = (1 / S) sum_s softmax(u_s / tau)

    with ``S`` Monte Carlo samples (``train_mc_samples`` in training, ``test_mc_samples``
    at inference) and temperature ``tau``. The noise is drawn from the layer's own seed
    generator (independently per example and sample), so a seeded layer is reproducible.

    A :class:`tfbnn.layers.StochasticLayer`: in training it always samples; at inference it
    samples when ``inference_mode == "sample"`` (the default) and otherwise returns the
    softmax of the mean logits, ``softmax(mu / tau)`` (the latent noise set to its mean, 0),
    which is what :func:`tfbnn.posterior_mean` and :func:`tfbnn.set_inference_mode` select.
    Its seed state is saved with the weights, replicas of a ``tf.distribute`` run draw
    distinct noise, and a TFLite / ONNX export draws it with portable random ops.
    The noise is the label noise (aleatoric); :func:`tfbnn.predict` reads the output as
    class probabilities (a model ending here is a classifier), and weight samples of
    a Bayesian body give the epistemic part. Each call is a fresh Monte Carlo estimate:
    with a deterministic body, the T samples of :func:`tfbnn.predict` differ only by that
    estimate's error (a mutual information near 0 that falls as ``1 / S``).

    **From Edward2** (``ed.layers.MCSoftmaxDenseFA``): ``num_classes``, ``num_factors``,
    ``temperature``, ``train_mc_samples``, ``test_mc_samples`` and ``logits_only`` are the
    same; ``eps`` is ``min_scale``; ``parameter_efficient=True`` and
    ``share_samples_across_batch=True`` are not offered (the full factor, independent
    noise per example); the noise is seeded by ``seed``.

    Args:
        num_classes: int >= 2, ``K``.
        num_factors: int >= 0, ``R``, the rank of the correlated part (0: diagonal only).
            Default 10.
        temperature: float > 0, ``tau``. Default 1.
        train_mc_samples: int >= 1, ``S`` in training. Default 1000.
        test_mc_samples: int >= 1, ``S`` at inference. Default 1000.
        logits_only: bool. False (default): the output is ``p``. True: ``log p`` (computed
            as a log-sum-exp; a loss with ``from_logits=True`` recovers ``p``, and
            :func:`tfbnn.predict` needs ``from_logits=True``).
        min_scale: float > 0, the floor of ``d``. Default 1e-7.
        kernel_initializer, bias_initializer: of the three projections. Defaults
            ``"glorot_uniform"`` and ``"zeros"``.
        inference_mode: ``"sample"`` (default) or ``"mean"`` (``softmax(mu / tau)`` at inference).
        seed: int or None, the noise's seed.

    Call arguments:
        inputs: ``(batch, D)`` features.
        training: bool, picks ``train_mc_samples`` or ``test_mc_samples``.

    Input shape: ``(batch, D)``.
    Output shape: ``(batch, K)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
        ...                           tfbnn.layers.HeteroscedasticSoftmax(3, num_factors=2, test_mc_samples=50,
        ...                                                               seed=0)])
        >>> p = model(np.zeros((2, 4), "float32"))
        >>> p.shape, bool(np.allclose(p.numpy().sum(axis=1), 1.0, atol=1e-5))
        (TensorShape([2, 3]), True)
        >>> model.compile("adam", "sparse_categorical_crossentropy")

    Reference:
        Collier, Mustafa, Kokiopoulou, Jenatton, Berent. Correlated Input-Dependent Label
        Noise in Large-Scale Image Classification. CVPR 2021.
    """

    def __init__(self, num_classes, num_factors=10, temperature=1.0, train_mc_samples=1000, test_mc_samples=1000,
                 logits_only=False, min_scale=1e-7, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 inference_mode="sample", seed=None, **kwargs):
        super().__init__(inference_mode=inference_mode, seed=seed, **kwargs)
        self.num_classes = checks.integer("num_classes", num_classes, 2)
        self.num_factors = checks.integer("num_factors", num_factors, 0)
        self.temperature = checks.number("temperature", temperature, low=0, low_open=True)
        self.train_mc_samples = checks.integer("train_mc_samples", train_mc_samples, 1)
        self.test_mc_samples = checks.integer("test_mc_samples", test_mc_samples, 1)
        if not isinstance(logits_only, bool):
            raise ValueError(f"Expected `logits_only` to be a bool. Received: logits_only={logits_only!r}")
        self.logits_only = logits_only
        self.min_scale = checks.number("min_scale", min_scale, low=0, low_open=True)
        self.kernel_initializer = checks.initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = checks.initializer("bias_initializer", bias_initializer)

    @property
    def outputs_probabilities(self):
        """True when the output is class probabilities (``logits_only=False``): :func:`tfbnn.predict` reads it."""
        return not self.logits_only

    def build(self, input_shape):
        if len(input_shape) != 2 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}' expects inputs of shape (batch, features). "
                             f"Received: input_shape={tuple(input_shape)}")
        dim, k = int(input_shape[-1]), self.num_classes

        def projection(name, units):
            kernel = self.add_weight(name=f"{name}_kernel", shape=(dim, units), initializer=self.kernel_initializer)
            bias = self.add_weight(name=f"{name}_bias", shape=(units,), initializer=self.bias_initializer)
            return kernel, bias

        self.loc_kernel, self.loc_bias = projection("loc", k)
        self.diag_kernel, self.diag_bias = projection("diag", k)
        if self.num_factors:
            self.factor_kernel, self.factor_bias = projection("factor", k * self.num_factors)

    def noise_parameters(self, inputs):
        """``(mu (B, K), V (B, K, R), d (B, K))`` of the latent logits' Gaussian."""
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        mu = tf.matmul(inputs, self.loc_kernel) + self.loc_bias
        d = tf.nn.softplus(tf.matmul(inputs, self.diag_kernel) + self.diag_bias) + self.min_scale
        if self.num_factors:
            v = tf.reshape(tf.matmul(inputs, self.factor_kernel) + self.factor_bias,
                           [-1, self.num_classes, self.num_factors])
        else:
            v = tf.zeros([tf.shape(inputs)[0], self.num_classes, 0], inputs.dtype)
        return mu, v, d

    def sample_logits(self, inputs, num_samples):
        """``(S, B, K)`` latent logit samples ``mu + V eps + d * eps'`` (before the temperature)."""
        num_samples = checks.integer("num_samples", num_samples, 1)
        mu, v, d = self.noise_parameters(inputs)
        batch = tf.shape(mu)[0]
        eps = self._normal([num_samples, batch, self.num_factors], mu.dtype)
        eps_diag = self._normal([num_samples, batch, self.num_classes], mu.dtype)
        return mu + tf.einsum("bkr,sbr->sbk", v, eps) + d * eps_diag

    def call(self, inputs, training=None):
        if not self._sampling(training):  # inference_mode "mean": the latent noise at its mean
            log_mean = tf.nn.log_softmax(self.noise_parameters(inputs)[0] / self.temperature, axis=-1)
        else:
            num_samples = self.train_mc_samples if training else self.test_mc_samples
            log_p = tf.nn.log_softmax(self.sample_logits(inputs, num_samples) / self.temperature, axis=-1)
            log_mean = tf.reduce_logsumexp(log_p, axis=0) - math.log(num_samples)
        return log_mean if self.logits_only else tf.exp(log_mean)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_classes": self.num_classes, "num_factors": self.num_factors, "temperature": self.temperature,
            "train_mc_samples": self.train_mc_samples, "test_mc_samples": self.test_mc_samples,
            "logits_only": self.logits_only, "min_scale": self.min_scale,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        })
        return config
