"""The Monte Carlo predictive summaries: entropies, the prediction classes, and summaries of T samples."""

import dataclasses
import statistics

import numpy as np

from tfbnn._internal import checks
from tfbnn.likelihoods import GaussianHead

# H[mean_t p_t] - mean_t H[p_t] of identical samples is not exactly 0 in float64
# (about 1e-15): below this it is round-off, not disagreement between samples.
ROUNDOFF_NATS = 1e-9


def entropy(probs, axis=-1):
    """Shannon entropy in nats, ``-sum_c p_c log p_c`` with ``0 log 0 = 0``.

    Args:
        probs: array ``(..., C)`` of probabilities.
        axis: the class axis.

    Returns:
        float64 array ``(...)``.
    """
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -np.sum(terms, axis=axis)


def concat(parts, strata=1):
    """Concatenates per-batch predictions (examples on axis 0, samples on axis 1).

    Samples of different lengths (adaptive sampling) are NaN-padded per stratum
    (ensemble member): the samples axis stays member-major.
    """
    first = parts[0]
    values = {}
    for field in dataclasses.fields(first):
        items = [getattr(p, field.name) for p in parts]
        if field.name == "num_samples":
            values[field.name] = max(items)
        elif items[0] is None:
            values[field.name] = None
        elif field.name == "samples":
            values[field.name] = np.concatenate(_pad_samples(items, strata), axis=1)
        else:
            values[field.name] = np.concatenate(items, axis=0)
    return type(first)(**values)


def _pad_samples(items, strata):
    """Per-batch ``(S * T_i, B_i, ...)`` samples NaN-padded to the longest ``T`` in each of ``S`` strata."""
    longest = max(item.shape[0] for item in items) // strata

    def pad(item):
        per = item.reshape(strata, item.shape[0] // strata, *item.shape[1:])
        filler = np.full((strata, longest - per.shape[1], *per.shape[2:]), np.nan, item.dtype)
        return np.concatenate([per, filler], axis=1).reshape(strata * longest, *item.shape[1:])

    return [item if item.shape[0] == longest * strata else pad(item) for item in items]


@dataclasses.dataclass(frozen=True)
class ClassificationPrediction:
    """Monte Carlo predictive summary of a classifier (entropies in nats).

    Attributes:
        mean_probs: ``(B, C)``, ``p_bar = mean_t p_t``, the predictive distribution.
        predictive_entropy: ``(B,)``, total uncertainty ``H[p_bar]``.
        expected_entropy: ``(B,)``, aleatoric uncertainty ``mean_t H[p_t]``.
        mutual_information: ``(B,)``, epistemic uncertainty
            ``H[p_bar] - mean_t H[p_t]`` (Depeweg et al. 2018; Trinh et al. 2022,
            eq. 26-27), >= 0: differences below ``1e-9`` nats are float round-off
            and set to 0, so identical samples (a deterministic model) give exactly 0.
        samples: ``(T, B, C)`` per-sample probabilities, or None when
            ``return_samples=False``. With adaptive sampling (:class:`AdaptiveSampling`)
            ``T`` is the most samples any example got and example ``b``'s rows past its
            ``samples_used[b]`` are NaN (see :func:`predict` for the order).
        num_samples: T, the length of the samples axis.
        samples_used: ``(B,)`` int, the samples averaged for each example (all ``T``
            with a fixed ``num_samples``).
        standard_error: ``(B,)``, with adaptive sampling: the Monte Carlo standard
            error of ``mean_probs`` (its largest component) that the stopping rule
            compared with ``tolerance``; None with a fixed ``num_samples``.

    Properties: ``predicted_class`` ``(B,)`` (argmax of ``mean_probs``),
    ``confidence`` ``(B,)`` (max of ``mean_probs``), and the aliases ``total``,
    ``aleatoric``, ``epistemic``. (Leading axes other than one batch axis are kept:
    ``B`` can stand for ``B, L`` for per-token outputs.)
    """

    mean_probs: np.ndarray
    predictive_entropy: np.ndarray
    expected_entropy: np.ndarray
    mutual_information: np.ndarray
    samples: np.ndarray = None
    num_samples: int = 1
    samples_used: np.ndarray = None
    standard_error: np.ndarray = None

    @property
    def predicted_class(self):
        return np.argmax(self.mean_probs, axis=-1)

    @property
    def confidence(self):
        return np.max(self.mean_probs, axis=-1)

    @property
    def total(self):
        return self.predictive_entropy

    @property
    def aleatoric(self):
        return self.expected_entropy

    @property
    def epistemic(self):
        return self.mutual_information


@dataclasses.dataclass(frozen=True)
class RegressionPrediction:
    """Monte Carlo predictive summary of a regressor.

    Attributes:
        mean: ``(B, ..., d)``, the predictive mean ``mean_t mu_t``.
        epistemic_std: ``(B, ..., d)``, ``std_t mu_t`` (population std over samples).
        aleatoric_std: ``(B, ..., d)``, ``sqrt(mean_t v_t)`` (``v_t`` the variance of
            sample ``t``'s predictive distribution) when the model ends in a regression
            distribution head (:class:`GaussianHead`, :class:`tfbnn.likelihoods.StudentTHead`,
            :class:`tfbnn.likelihoods.MixtureNormalHead`, ...), else None.
        samples: ``(T, B, ...)`` the model's outputs per sample (for a Gaussian
            head: means then scales on the last axis), or None. NaN-padded with
            adaptive sampling, as for :class:`ClassificationPrediction`.
        num_samples: T, the length of the samples axis.
        samples_used: ``(B,)`` int, the samples averaged for each example.
        standard_error: ``(B,)`` or None: with adaptive sampling, the Monte Carlo
            standard error of ``mean`` (its largest component).

    Properties: ``total_std = sqrt(epistemic_std^2 + aleatoric_std^2)`` (the
    variance of the mixture of the T predictive distributions); ``variance``.
    """

    mean: np.ndarray
    epistemic_std: np.ndarray
    aleatoric_std: np.ndarray = None
    samples: np.ndarray = None
    num_samples: int = 1
    samples_used: np.ndarray = None
    standard_error: np.ndarray = None

    @property
    def total_std(self):
        if self.aleatoric_std is None:
            return self.epistemic_std
        return np.sqrt(np.square(self.epistemic_std) + np.square(self.aleatoric_std))

    @property
    def variance(self):
        return np.square(self.total_std)

    def interval(self, level=0.95):
        """Central predictive interval ``mean -/+ z total_std``, ``z = Phi^-1((1 + level) / 2)``.

        The predictive is a mixture of T Gaussians (or of T point masses without a
        Gaussian head); the interval is that of the Gaussian with the mixture's
        mean and variance (moment matching), exact for T -> inf only when the
        mixture is itself Gaussian. Skewed or multi-modal predictives get a
        symmetric interval.

        Args:
            level: float in (0, 1), the nominal coverage. Default 0.95.

        Returns:
            ``(lower, upper)``, each shaped like ``mean``.
        """
        level = checks.number("level", level, low=0, high=1, low_open=True, high_open=True)
        z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
        half = z * self.total_std
        return self.mean - half, self.mean + half


def as_probs(samples, from_logits):
    x = np.asarray(samples, dtype=np.float64)
    if x.shape[-1] == 1:  # one sigmoid unit: p(class 1); expand to two classes
        p = 1.0 / (1.0 + np.exp(-x)) if from_logits else x
        return np.concatenate([1.0 - p, p], axis=-1)
    if from_logits:
        z = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return z / np.sum(z, axis=-1, keepdims=True)
    return x


def class_probabilities(samples, from_logits=False, head=None):
    """Per-sample class probabilities: a classification head's, or ``samples`` as :func:`as_probs` reads them."""
    if head is None:
        return as_probs(samples, from_logits)
    return np.asarray(head.class_probabilities(np.asarray(samples, dtype=np.float64)), dtype=np.float64)


def summarize_classification(samples, from_logits=False, keep_samples=True):
    """Predictive entropy, expected entropy and mutual information of T samples.

    With ``p_t`` the class probabilities of sample ``t`` and ``p_bar = mean_t p_t``
    (Depeweg et al. 2018; Trinh et al. 2022, eq. 26-27)::

        predictive_entropy = H[p_bar]
        expected_entropy   = (1 / T) sum_t H[p_t]
        mutual_information = predictive_entropy - expected_entropy

    Args:
        samples: array ``(T, B, C)`` of probabilities (or logits with
            ``from_logits=True``). ``C = 1`` is one sigmoid unit, expanded to the
            two classes ``[1 - p, p]``.
        from_logits: bool, apply a softmax (sigmoid for ``C = 1``) per sample first.
        keep_samples: bool, keep the per-sample probabilities in the result.

    Returns:
        A :class:`ClassificationPrediction`.

    Example:
        >>> import numpy as np, tfbnn
        >>> p = np.array([[[0.9, 0.1]], [[0.1, 0.9]]])  # T=2 confident, disagreeing samples
        >>> s = tfbnn.inference.summarize_classification(p)
        >>> round(float(s.mutual_information[0]), 4)  # log 2 - H(0.9, 0.1)
        0.3681
    """
    probs = as_probs(samples, from_logits)
    if probs.ndim < 3:
        raise ValueError(f"Expected samples of shape (T, B, C). Received: samples.shape={probs.shape}")
    mean_probs = probs.mean(axis=0)
    total = entropy(mean_probs)
    aleatoric = entropy(probs).mean(axis=0)
    gap = total - aleatoric
    epistemic = np.where(gap > ROUNDOFF_NATS, gap, 0.0)
    return ClassificationPrediction(
        mean_probs=mean_probs.astype(np.float32),
        predictive_entropy=total.astype(np.float32),
        expected_entropy=aleatoric.astype(np.float32),
        mutual_information=epistemic.astype(np.float32),
        samples=probs.astype(np.float32) if keep_samples else None,
        num_samples=probs.shape[0],
        samples_used=np.full(probs.shape[1], probs.shape[0]),
    )


def head_moments(head, samples):
    """``(means, variances)`` of a regression head's per-sample distributions, float64 NumPy arrays."""
    mean, variance = head.moments(np.asarray(samples, dtype=np.float64))
    return np.asarray(mean, dtype=np.float64), np.asarray(variance, dtype=np.float64)


def head_epistemic(head, samples):
    """A head's own per-sample epistemic variance (an evidential head's ``Var[mu]``), float64, or None."""
    if not hasattr(head, "epistemic_variance"):
        return None
    return np.asarray(head.epistemic_variance(np.asarray(samples, dtype=np.float64)), dtype=np.float64)


def summarize_regression(samples, gaussian_head=False, keep_samples=True, head=None):
    """Predictive mean and the epistemic / aleatoric split of T regression samples.

    With ``m_t`` and ``v_t`` the mean and variance of sample ``t``'s predictive
    distribution (a distribution head's, see :mod:`tfbnn.likelihoods`; ``m_t`` the
    output itself and ``v_t = 0`` without a head), the law of total variance
    (Depeweg et al. 2018, eq. 5 for the variance form)::

        mean = mean_t m_t,   epistemic_std = std_t m_t,   aleatoric_std = sqrt(mean_t v_t)

    A head with its own single-pass epistemic variance ``e_t`` (an evidential head's
    ``Var[mu]``, :class:`tfbnn.evidential.EvidentialRegressionHead`) adds its mean:
    ``epistemic_std^2 = var_t m_t + mean_t e_t``.

    Args:
        samples: array ``(T, B, ...)`` of outputs; with a head, its outputs (for
            ``gaussian_head=True`` the last axis holds ``d`` means then ``d`` scales,
            see :class:`GaussianHead`).
        gaussian_head: bool, whether the outputs are a :class:`GaussianHead`'s (the
            same as ``head=GaussianHead()``).
        keep_samples: bool, keep the raw samples in the result.
        head: a regression :class:`tfbnn.likelihoods.DistributionHead` or None:
            the outputs are that head's parameters.

    Returns:
        A :class:`RegressionPrediction`.

    Example:
        >>> import numpy as np, tfbnn
        >>> s = tfbnn.inference.summarize_regression(np.array([[[1.0, 0.5]], [[3.0, 0.5]]]),
        ...                                          gaussian_head=True)
        >>> s.mean, s.epistemic_std, s.aleatoric_std
        (array([[2.]], dtype=float32), array([[1.]], dtype=float32), array([[0.5]], dtype=float32))
    """
    raw = np.asarray(samples, dtype=np.float64)
    if raw.ndim < 2:
        raise ValueError(f"Expected samples of shape (T, B, ...). Received: samples.shape={raw.shape}")
    if gaussian_head and head is None:
        head = GaussianHead()
    aleatoric = None
    means, epistemic = raw, None
    if head is not None:
        means, variances = head_moments(head, raw)
        aleatoric = np.sqrt(np.mean(variances, axis=0)).astype(np.float32)
        epistemic = head_epistemic(head, raw)
    spread = means.var(axis=0) + (0.0 if epistemic is None else epistemic.mean(axis=0))
    return RegressionPrediction(
        mean=means.mean(axis=0).astype(np.float32),
        epistemic_std=np.sqrt(spread).astype(np.float32),
        aleatoric_std=aleatoric,
        samples=raw.astype(np.float32) if keep_samples else None,
        num_samples=raw.shape[0],
        samples_used=np.full(raw.shape[1], raw.shape[0]),
    )
