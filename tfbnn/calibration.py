"""Post-hoc calibration: temperature scaling (Guo et al. 2017).

Temperature scaling divides the logits by one scalar ``T > 0`` fitted on held-out
data, which leaves the predicted class unchanged and only sharpens (``T < 1``) or
softens (``T > 1``) the probabilities::

    p(y | x) = softmax(z(x) / T),    T* = argmin_T  -(1/N) sum_i log softmax(z_i / T)_{y_i}

The fit minimises the validation NLL over ``log T`` (so ``T`` stays positive)
with L-BFGS (``tfp.optimizer.lbfgs_minimize``), in float64.

For a model that ends in a softmax, :func:`logits_from_probs` gives logits
``log p`` (the softmax is shift invariant, so ``softmax(log p / T)`` is temperature
scaling of the original logits).

Reference:
    Guo, Pleiss, Sun, Weinberger. On Calibration of Modern Neural Networks.
    ICML 2017 (sec. 4.2, temperature scaling).
"""

import math

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn import checks
from tfbnn.metrics import check_labels

__all__ = ["TemperatureScaling", "logits_from_probs"]

_MIN_PROB = 1e-12


def logits_from_probs(probs, min_prob=_MIN_PROB):
    """Logits ``log p`` of probability vectors (clipped below at ``min_prob``).

    ``softmax(log p) = p`` for rows summing to 1, so these logits can be
    temperature-scaled like the pre-softmax ones.

    Args:
        probs: ``(N, C)`` probabilities (for example ``predict(...).mean_probs``).
        min_prob: float > 0, the floor that keeps ``log 0`` finite. Default 1e-12.

    Returns:
        float64 array ``(N, C)``.

    Example:
        >>> import tfbnn
        >>> tfbnn.calibration.logits_from_probs([[0.5, 0.5]])
        array([[-0.69314718, -0.69314718]])
    """
    min_prob = checks.number("min_prob", min_prob, low=0, low_open=True)
    p = checks.array("probs", probs, np.float64)
    if np.any(p < 0) or not np.all(np.isfinite(p)):
        raise ValueError(f"Expected non-negative finite probabilities. Received: {checks.value_range('probs', p)}")
    return np.log(np.maximum(p, min_prob))


def _check_logits(logits):
    z = checks.array("logits", logits, np.float64)
    if z.ndim != 2 or z.shape[1] < 2 or z.shape[0] == 0:
        raise ValueError(f"Expected `logits` of shape (N, C) with N >= 1, C >= 2. Received: logits.shape={z.shape}")
    if not np.all(np.isfinite(z)):
        raise ValueError("Expected finite `logits`. Received: NaN or infinite values")
    return z


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class TemperatureScaling:
    """Temperature scaling: ``softmax(logits / T)`` with ``T`` fitted on validation NLL.

    Args:
        temperature: float > 0, the temperature used until :meth:`fit` sets it.
            Default 1.0 (no change).
        max_iterations: int > 0, L-BFGS iterations of :meth:`fit`. Default 100.

    Example:
        >>> import numpy as np, tfbnn
        >>> rng = np.random.default_rng(0)
        >>> z = rng.normal(size=(2000, 3))                     # calibrated logits
        >>> y = np.array([rng.choice(3, p=np.exp(r) / np.exp(r).sum()) for r in z])
        >>> ts = tfbnn.TemperatureScaling().fit(4 * z, y)      # over-confident by 4x
        >>> round(ts.temperature)
        4
        >>> ts.transform(4 * z).shape                          # calibrated probabilities
        (2000, 3)
        >>> # a model ending in a softmax:
        >>> # ts.fit(tfbnn.calibration.logits_from_probs(model.predict(x_val)), y_val)

    Reference:
        Guo et al. On Calibration of Modern Neural Networks. ICML 2017, sec. 4.2.
    """

    def __init__(self, temperature=1.0, max_iterations=100):
        self._temperature = checks.number("temperature", temperature, low=0, low_open=True)
        self.max_iterations = checks.integer("max_iterations", max_iterations, 1)
        self.fitted = False

    @property
    def temperature(self):
        """The current temperature ``T`` (a float)."""
        return self._temperature

    @staticmethod
    def nll(logits, labels, temperature=1.0):
        """Mean NLL ``-(1/N) sum_i log softmax(z_i / T)_{y_i}`` (nats, no clipping)."""
        z = _check_logits(logits) / temperature
        y = check_labels(labels, z)
        log_norm = np.log(np.sum(np.exp(z - z.max(axis=1, keepdims=True)), axis=1)) + z.max(axis=1)
        return float(np.mean(log_norm - z[np.arange(len(y)), y]))

    def fit(self, logits, labels):
        """Fits ``T`` by minimising the NLL of ``softmax(logits / T)`` over ``log T``.

        Args:
            logits: ``(N, C)`` validation logits (not probabilities: see
                :func:`logits_from_probs`).
            labels: ``(N,)`` integers or ``(N, C)`` one-hot.

        Returns:
            ``self``.
        """
        z = tf.constant(_check_logits(logits))
        y = tf.constant(check_labels(labels, z.numpy()))

        def loss_and_grad(log_t):
            return tfp.math.value_and_gradient(
                lambda v: tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z * tf.exp(-v[0]))
                ),
                log_t,
            )

        result = tfp.optimizer.lbfgs_minimize(
            loss_and_grad,
            initial_position=tf.constant([math.log(self._temperature)], tf.float64),
            max_iterations=self.max_iterations,
            tolerance=1e-10,
        )
        log_t = float(result.position.numpy()[0])
        if not math.isfinite(log_t):
            raise RuntimeError(f"Temperature scaling diverged. Received: log T={log_t}")
        self._temperature = math.exp(log_t)
        self.fitted = True
        return self

    def scale(self, logits):
        """Calibrated logits ``logits / T`` (float64 ``(N, C)``)."""
        return _check_logits(logits) / self._temperature

    def transform(self, logits):
        """Calibrated probabilities ``softmax(logits / T)`` (float64 ``(N, C)``)."""
        return _softmax(self.scale(logits))

    def fit_transform(self, logits, labels):
        """``fit(logits, labels)`` then ``transform(logits)``."""
        return self.fit(logits, labels).transform(logits)

    def get_config(self):
        return {"temperature": self._temperature, "max_iterations": self.max_iterations}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return f"TemperatureScaling(temperature={self._temperature:.4g}, fitted={self.fitted})"
