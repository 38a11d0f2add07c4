"""Post-hoc calibration: temperature scaling (Guo et al. 2017), also of a Monte Carlo predictive.

Temperature scaling divides the logits by one scalar ``T > 0`` fitted on held-out
data, which leaves the predicted class unchanged and only sharpens (``T < 1``) or
softens (``T > 1``) the probabilities::

    p(y | x) = softmax(z(x) / T),    T* = argmin_T  -(1/N) sum_i log softmax(z_i / T)_{y_i}

The fit minimises the validation NLL over ``log T`` (so ``T`` stays positive)
with L-BFGS (``tfp.optimizer.lbfgs_minimize``), in float64, within
``1e-3 < T < 1e3`` (a fit that ends at a bound warns: the validation NLL has no
finite minimum, e.g. predictions no better than uniform).

For a model that ends in a softmax, :func:`logits_from_probs` gives logits
``log p`` (the softmax is shift invariant, so ``softmax(log p / T)`` is temperature
scaling of the original logits).

The Monte Carlo predictive
--------------------------
A Bayesian model predicts ``p_bar = (1/S) sum_s p_s`` from ``S`` weight samples
(:func:`tfbnn.predict`). :func:`scale_prediction` and
:meth:`TemperatureScaling.fit_prediction` temper it in one of two ways
(``method``)::

    "pooled"   p_T = softmax(log p_bar / T)                  pool, then calibrate
    "samples"  p_T = (1/S) sum_s softmax(log p_s / T)        calibrate each sample, then pool

``"pooled"`` is the default: it is Guo et al.'s temperature scaling applied to the
distribution the model actually predicts, so it is the post-hoc recalibration of
the predictive, and Rahaman & Thiery (2021) find pool-then-calibrate the
better order for ensembles. It can also sharpen a predictive that is
under-confident because the samples disagree (a Bayes-by-Backprop MLP at
``beta = 1`` on a small data set), which ``"samples"`` cannot: sharpening every
sample leaves their disagreement, and so the width of the mixture, in place.
``"samples"`` keeps the predictive a mixture of per-sample predictions, so the
uncertainty split stays the exact Depeweg et al. (2018) one, but unlike
``"pooled"`` it can change the predicted class.

The uncertainty split of a tempered predictive. ``"samples"``: the tempered samples
go through :func:`tfbnn.inference.summarize_classification` (total = aleatoric +
epistemic, exactly). ``"pooled"``: ``p_T`` is no longer a mixture of the samples,
so mutual information is not defined for it; the total is ``H[p_T]`` and each
example keeps the epistemic share of its raw predictive,
``epistemic_T = H[p_T] * I / H[p_bar]``, ``aleatoric_T = H[p_T] - epistemic_T``
(``I`` the raw mutual information; share 0 where ``H[p_bar] = 0``). Temperature
scaling thus changes how much uncertainty the predictive carries, not what part of
it comes from the posterior's disagreement.

References:
    Guo, Pleiss, Sun, Weinberger. On Calibration of Modern Neural Networks.
    ICML 2017 (sec. 4.2, temperature scaling).
    Rahaman, Thiery. Uncertainty Quantification and Deep Ensembles. NeurIPS 2021
    (pool-then-calibrate versus calibrate-then-pool).
    Depeweg, Hernandez-Lobato, Doshi-Velez, Udluft. Decomposition of Uncertainty in
    Bayesian Deep Learning. ICML 2018 (the total / aleatoric / epistemic split).
"""

import math
import warnings

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn._internal import checks, deprecation
from tfbnn.inference import ClassificationPrediction, entropy, summarize_classification
from tfbnn.metrics import check_labels

__all__ = ["TemperatureScaling", "logits_from_probs", "scale_prediction", "TEMPERING_METHODS", "MAX_TEMPERATURE"]

#: How a Monte Carlo predictive is tempered: ``softmax(log p_bar / T)`` ("pooled") or
#: ``mean_s softmax(log p_s / T)`` ("samples").
TEMPERING_METHODS = ("pooled", "samples")
#: Fitted temperatures stay in (1 / MAX_TEMPERATURE, MAX_TEMPERATURE).
MAX_TEMPERATURE = 1e3

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
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _check_method(method):
    if method not in TEMPERING_METHODS:
        raise ValueError(f"Expected `method` to be one of {list(TEMPERING_METHODS)}. Received: method={method!r}")
    return method


def _check_prediction(prediction, method):
    """A :class:`ClassificationPrediction` from one, or from ``(S, N, C)`` sample probabilities."""
    if not isinstance(prediction, ClassificationPrediction):
        samples = checks.finite_array("prediction", prediction, np.float64)
        if samples.ndim != 3:
            raise ValueError("Expected `prediction` to be a tfbnn.ClassificationPrediction or sample probabilities "
                             f"of shape (S, N, C). Received: prediction.shape={samples.shape}")
        if samples.size == 0 or np.any(samples < 0):
            raise ValueError("Expected `prediction` to hold sample probabilities (non-negative, S, N, C >= 1). "
                             f"Received: prediction of shape {samples.shape}"
                             + (f", min={samples.min():.6g}" if samples.size else ""))
        prediction = summarize_classification(samples)
    if np.ndim(prediction.mean_probs) != 2:
        raise ValueError("Expected a prediction of one batch axis, mean_probs (N, C). "
                         f"Received: mean_probs.shape={np.shape(prediction.mean_probs)}")
    if method == "samples" and prediction.samples is None:
        raise ValueError("method='samples' tempers every sample and needs them: predict with "
                         "return_samples=True. Received: prediction.samples=None")
    return prediction


def _sample_logits(prediction):
    """``log p_s`` of every sample, float64 ``(S, N, C)``, clipped as :func:`logits_from_probs`."""
    return np.log(np.maximum(np.asarray(prediction.samples, np.float64), _MIN_PROB))


def scale_prediction(prediction, temperature, method="pooled"):
    """The Monte Carlo predictive tempered by ``T``, with its uncertainty split.

    With ``p_s`` the class probabilities of sample ``s`` and ``p_bar = mean_s p_s``::

        "pooled"   p_T = softmax(log p_bar / T)               (Guo et al. 2017 on the predictive)
        "samples"  p_T = (1/S) sum_s softmax(log p_s / T)

    ``"samples"`` returns :func:`tfbnn.inference.summarize_classification` of the
    tempered samples. ``"pooled"`` returns ``mean_probs = p_T``,
    ``predictive_entropy = H[p_T]``, and splits it in the proportions of the raw
    predictive: ``mutual_information = H[p_T] * I / H[p_bar]``,
    ``expected_entropy = H[p_T] - mutual_information`` (``samples`` is None). See
    the module docstring for why pooled is the default. ``T = 1`` returns the
    predictive unchanged (up to the ``1e-12`` probability floor of the logs).
    ``"pooled"`` never changes the predicted class; ``"samples"`` can (a mixture of
    sharpened samples may favour another class than the mixture did), and so can
    change the accuracy.

    Args:
        prediction: a :class:`tfbnn.ClassificationPrediction` (from
            :func:`tfbnn.predict`; ``"samples"`` needs its ``samples``), or sample
            probabilities ``(S, N, C)``.
        temperature: float > 0, ``T``.
        method: ``"pooled"`` (default) or ``"samples"``.

    Returns:
        A :class:`tfbnn.ClassificationPrediction` (float32, as :func:`tfbnn.predict`).

    Example:
        >>> import numpy as np, tfbnn
        >>> p = np.array([[[0.6, 0.4]], [[0.8, 0.2]]])                 # S=2 samples, N=1
        >>> cal = tfbnn.calibration.scale_prediction(p, 0.5)           # sharpen the predictive
        >>> cal.mean_probs.round(4)                                    # softmax(2 log [0.7, 0.3])
        array([[0.8448, 0.1552]], dtype=float32)
        >>> bool(np.allclose(cal.predictive_entropy, cal.expected_entropy + cal.mutual_information))
        True
    """
    temperature = checks.number("temperature", temperature, low=0, low_open=True)
    prediction = _check_prediction(prediction, _check_method(method))
    if method == "samples":
        return summarize_classification(_softmax(_sample_logits(prediction) / temperature))
    mean_probs = _softmax(logits_from_probs(prediction.mean_probs) / temperature)
    total = entropy(mean_probs)
    raw_total = np.asarray(prediction.predictive_entropy, np.float64)
    share = np.divide(np.asarray(prediction.mutual_information, np.float64), raw_total,
                      out=np.zeros_like(raw_total), where=raw_total > 0)
    share = np.clip(share, 0.0, 1.0)
    return ClassificationPrediction(
        mean_probs=mean_probs.astype(np.float32),
        predictive_entropy=total.astype(np.float32),
        expected_entropy=((1.0 - share) * total).astype(np.float32),
        mutual_information=(share * total).astype(np.float32),
        samples=None,
        num_samples=prediction.num_samples,
    )


def _lbfgs_log_temperature(loss, initial_temperature, max_iterations):
    """``argmin_T loss(log T)`` by L-BFGS over ``log T``, clipped to ``(1 / MAX_TEMPERATURE, MAX_TEMPERATURE)``.

    A validation NLL that keeps falling as ``T -> inf`` (predictions no better than
    uniform there) or ``T -> 0`` sends ``log T`` far out: the fit stops at the bound,
    with a warning, instead of overflowing.
    """

    def loss_and_grad(log_t):
        return tfp.math.value_and_gradient(lambda v: loss(v[0]), log_t)

    result = tfp.optimizer.lbfgs_minimize(
        loss_and_grad,
        initial_position=tf.constant([math.log(initial_temperature)], tf.float64),
        max_iterations=max_iterations,
        tolerance=1e-10,
    )
    log_t = float(result.position.numpy()[0])
    if math.isnan(log_t):
        raise RuntimeError(f"Temperature scaling diverged. Received: log T={log_t}")
    bound = math.log(MAX_TEMPERATURE)
    if abs(log_t) >= bound:
        log_t = math.copysign(bound, log_t)
        warnings.warn(f"Temperature scaling stopped at the bound T = {math.exp(log_t):.4g}: the validation NLL "
                      "keeps falling towards T = " + ("inf (the predictions are no better than uniform on the "
                      "validation data)" if log_t > 0 else "0") + ". Check the model and the hold-out.")
    return math.exp(log_t)


class TemperatureScaling:
    """Temperature scaling: ``softmax(logits / T)`` with ``T`` fitted on validation NLL.

    Args:
        temperature: float > 0, the temperature used until :meth:`fit` sets it.
            Default 1.0 (no change).
        max_iterations: int > 0, L-BFGS iterations of :meth:`fit`. Default 100.
        method: how :meth:`fit_prediction` / :meth:`transform_prediction` temper a
            Monte Carlo predictive: ``"pooled"`` (default, ``softmax(log p_bar / T)``)
            or ``"samples"`` (``mean_s softmax(log p_s / T)``); see
            :func:`scale_prediction`. :meth:`fit` on logits does not use it.

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
        >>> # a Monte Carlo predictive (tfbnn.predict), calibrated through the uncertainty split:
        >>> # ts = tfbnn.TemperatureScaling().fit_prediction(tfbnn.predict(model, x_val), y_val)
        >>> # res = ts.transform_prediction(tfbnn.predict(model, x_test))

    Reference:
        Guo et al. On Calibration of Modern Neural Networks. ICML 2017, sec. 4.2.
    """

    def __init__(self, temperature=1.0, max_iterations=100, method="pooled"):
        self._temperature = checks.number("temperature", temperature, low=0, low_open=True)
        self.max_iterations = checks.integer("max_iterations", max_iterations, 1)
        self.method = _check_method(method)
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
        self._temperature = _lbfgs_log_temperature(
            lambda log_t: tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z * tf.exp(-log_t))),
            self._temperature, self.max_iterations)
        self.fitted = True
        return self

    def fit_prediction(self, prediction, labels):
        """Fits ``T`` by minimising the NLL of the tempered Monte Carlo predictive.

        ``"pooled"``: :meth:`fit` on the logits ``log p_bar``. ``"samples"``:
        ``T* = argmin_T -(1/N) sum_i log (1/S) sum_s softmax(log p_si / T)_{y_i}``
        (a log-sum-exp over the samples), over ``log T`` by L-BFGS.

        Args:
            prediction: held-out :class:`tfbnn.ClassificationPrediction` (or
                ``(S, N, C)`` sample probabilities), e.g. ``tfbnn.predict(model, x_val)``.
            labels: ``(N,)`` integers or ``(N, C)`` one-hot.

        Returns:
            ``self``.
        """
        prediction = _check_prediction(prediction, self.method)
        if self.method == "pooled":
            return self.fit(logits_from_probs(prediction.mean_probs), labels)
        z = tf.constant(_sample_logits(prediction))
        y = check_labels(labels, np.asarray(prediction.mean_probs))
        picked = tf.constant(np.stack([np.arange(len(y)), y], axis=1))
        num_samples = float(z.shape[0])

        def nll(log_t):
            log_p = tf.nn.log_softmax(z * tf.exp(-log_t), axis=-1)                 # (S, N, C)
            log_mean = tf.reduce_logsumexp(log_p, axis=0) - math.log(num_samples)  # (N, C)
            return -tf.reduce_mean(tf.gather_nd(log_mean, picked))

        self._temperature = _lbfgs_log_temperature(nll, self._temperature, self.max_iterations)
        self.fitted = True
        return self

    def transform_prediction(self, prediction):
        """The tempered predictive, :func:`scale_prediction` with this ``T`` and ``method``."""
        return scale_prediction(prediction, self._temperature, self.method)

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
        return {"temperature": self._temperature, "max_iterations": self.max_iterations, "method": self.method}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return f"TemperatureScaling(temperature={self._temperature:.4g}, method={self.method!r}, fitted={self.fitted})"


__getattr__ = deprecation.renamed(__name__, {"METHODS": "TEMPERING_METHODS"})
