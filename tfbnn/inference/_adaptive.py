"""Adaptive sampling: the stopping rule, running moments, and the chunked sampling loop."""

import dataclasses

import numpy as np
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.inference._summaries import (
    ROUNDOFF_NATS,
    ClassificationPrediction,
    RegressionPrediction,
    class_probabilities,
    entropy,
    head_epistemic,
    head_moments,
)


SAMPLING_PER = ("example", "batch")
_DEFAULT_MAX_SAMPLES = 1000
_NUM_SAMPLES = "a positive integer, 'auto' or a tfbnn.inference.AdaptiveSampling"


@dataclasses.dataclass(frozen=True)
class AdaptiveSampling:
    """Adaptive Monte Carlo sampling: ``tfbnn.predict(model, x, num_samples=AdaptiveSampling(...))``.

    Samples are added in vectorized chunks until the Monte Carlo standard error of each
    example's predictive mean is at most ``tolerance``: with ``n`` samples per member,
    ``S`` members (1 for an ordinary model) and ``s_{m,c}^2`` the sample variance of
    component ``c`` of member ``m``'s outputs, an example stops at the end of the first
    chunk with ``n >= min_samples`` and::

        max_c se_c <= tolerance,       se_c = sqrt( (sum_m s_{m,c}^2 / S  +  f / n) / (S n) )

    (``f = 1`` for class probabilities, the Chow and Robbins 1965 term; ``f = 0`` for
    regression), or at ``max_samples``. :func:`predict` has the details; its
    ``num_samples="auto"`` is ``AdaptiveSampling()``. The fields are checked, and the
    defaults that depend on other fields filled in, on construction.

    Args:
        tolerance: float > 0, the largest Monte Carlo standard error allowed on any
            component of the predictive mean (a probability for classification, an
            output value for regression). Default 0.01.
        max_samples: int >= ``min_samples``, the most samples per example (per member of
            an ensemble). Default (None): ``max(1000, min_samples)``.
        min_samples: int >= 2, the fewest (a sample variance needs two). Default (None):
            ``max(chunk_size, 2)``.
        chunk_size: int >= 1, the smallest chunk of samples per example and vectorized
            call. Default 16.
        per: ``"example"`` (default: stop each example when it meets the rule) or
            ``"batch"`` (sample a batch until all its examples meet it).

    Example:
        >>> import tfbnn
        >>> tfbnn.inference.AdaptiveSampling(tolerance=0.005, chunk_size=32)
        AdaptiveSampling(tolerance=0.005, max_samples=1000, min_samples=32, chunk_size=32, per='example')
        >>> tfbnn.inference.AdaptiveSampling(min_samples=1)
        Traceback (most recent call last):
        ...
        ValueError: Expected `min_samples` to be an integer >= 2 (a variance needs two samples). Received: min_samples=1
    """

    tolerance: float = 1e-2
    max_samples: int = None
    min_samples: int = None
    chunk_size: int = 16
    per: str = "example"

    def __post_init__(self):
        tolerance = checks.number("tolerance", self.tolerance, low=0, low_open=True)
        chunk_size = checks.integer("chunk_size", self.chunk_size, 1)
        min_samples = max(chunk_size, 2) if self.min_samples is None else self.min_samples
        min_samples = checks.integer("min_samples", min_samples, 2,
                                     what="an integer >= 2 (a variance needs two samples)")
        max_samples = max(_DEFAULT_MAX_SAMPLES, min_samples) if self.max_samples is None else self.max_samples
        max_samples = checks.integer("max_samples", max_samples, min_samples,
                                     what=f"an integer >= min_samples={min_samples}")
        if self.per not in SAMPLING_PER:
            raise ValueError(f"Expected `per` in {SAMPLING_PER}. Received: per={self.per!r}")
        for name, value in (("tolerance", tolerance), ("max_samples", max_samples), ("min_samples", min_samples),
                            ("chunk_size", chunk_size)):
            object.__setattr__(self, name, value)  # frozen: the checked values replace the given ones


def sampling_rule(num_samples):
    """``(T, None)`` for a fixed number of samples; ``(None, rule)`` for an :class:`AdaptiveSampling` or ``"auto"``."""
    if isinstance(num_samples, AdaptiveSampling):
        return None, num_samples
    if isinstance(num_samples, str) and num_samples == "auto":
        return None, AdaptiveSampling()
    return checks.integer("num_samples", num_samples, 1, what=_NUM_SAMPLES), None


def _expand(values, ndim):
    """``(B,)`` values broadcastable against ``(B, ...)`` arrays of ``ndim`` axes."""
    return values.reshape(values.shape + (1,) * (ndim - 1))


class _RunningMoments:
    """Per-stratum running means and sums of squared deviations of ``(B, ...)`` samples, float64.

    Chunks merge by the pairwise update of Chan, Golub and LeVeque (1979): with
    ``delta = mean_b - mean_a`` and ``n = n_a + n_b``, ``mean = mean_a + delta n_b / n`` and
    ``M2 = M2_a + M2_b + delta^2 n_a n_b / n`` (no cancellation, unlike sums of squares).
    """

    def __init__(self, strata, shape):
        self.count = np.zeros(shape[0], np.int64)
        self.mean = np.zeros((strata, *shape))
        self.m2 = np.zeros((strata, *shape))

    def add(self, rows, chunk):
        """Adds ``chunk`` ``(S, k, b, ...)``, the samples of the examples ``rows`` ``(b,)``."""
        k = chunk.shape[1]
        n_a = self.count[rows].astype(np.float64)
        n = n_a + k
        mean_b = chunk.mean(axis=1)
        m2_b = np.square(chunk - mean_b[:, None]).sum(axis=1)
        delta = mean_b - self.mean[:, rows]
        self.mean[:, rows] += delta * _expand(k / n, mean_b.ndim - 1)
        self.m2[:, rows] += m2_b + np.square(delta) * _expand(n_a * k / n, mean_b.ndim - 1)
        self.count[rows] += k

    def standard_error(self, rows, floor=0.0):
        """``(b,)``: the largest component of ``sqrt((sum_s var_s / S + floor / n) / (S n))``, the
        standard error of the equally weighted mean of the S strata means, each sample variance
        raised by ``floor / n`` (Chow and Robbins 1965; inf below 2 samples)."""
        n = self.count[rows].astype(np.float64)
        strata = self.mean.shape[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            variance = self.m2[:, rows] / _expand(n - 1, self.m2.ndim - 1)
            se2 = (variance.sum(axis=0) / strata + _expand(floor / n, self.m2.ndim - 1)) / _expand(
                strata * n, self.m2.ndim - 1)
        se = np.sqrt(np.max(se2.reshape(len(rows), -1), axis=1))
        return np.where(n >= 2, se, np.inf)

    def pooled(self):
        """The mean over all strata and the population variance of all ``S * n`` samples."""
        grand = self.mean.mean(axis=0)
        n = _expand(self.count.astype(np.float64), self.m2.ndim - 1)
        within = (self.m2 / n).mean(axis=0)
        between = np.square(self.mean - grand).mean(axis=0)
        return grand, within + between


def _split_strata(samples, strata):
    return samples.reshape(strata, samples.shape[0] // strata, *samples.shape[1:])


class AdaptiveBatch:
    """The running summary of one batch under adaptive sampling (classification or regression)."""

    def __init__(self, task, strata, batch_size, from_logits, head, keep_samples):
        self.task, self.strata, self.size = task, strata, batch_size
        self.from_logits, self.head, self.keep = from_logits, head, keep_samples
        self.moments = None
        self.extra = None  # classification: summed sample entropies; regression head: summed variances
        self.head_epistemic = None  # an evidential head's summed own epistemic variances
        # Probabilities lie in [0, 1]: a variance floor 1 / n keeps a run of identical samples (a rare class
        # not drawn yet) from stopping early. Regression outputs have no known range: no floor.
        self.variance_floor = 1.0 if task == "classification" else 0.0
        self.chunks = []

    def add(self, rows, samples):
        """``samples`` ``(S * k, b, ...)`` of the examples ``rows``."""
        if self.task == "classification":
            values = class_probabilities(samples, self.from_logits, self.head)
            extra = entropy(values)
        else:
            values = np.asarray(samples, dtype=np.float64)
            extra = None
            if self.head is not None:
                own = head_epistemic(self.head, values)
                values, extra = head_moments(self.head, values)
                if own is not None:
                    summed = _split_strata(own, self.strata).sum(axis=(0, 1))
                    if self.head_epistemic is None:
                        self.head_epistemic = np.zeros((self.size, *summed.shape[1:]))
                    self.head_epistemic[rows] += summed
        chunk = _split_strata(values, self.strata)
        if self.moments is None:
            self.moments = _RunningMoments(self.strata, (self.size, *chunk.shape[3:]))
        if extra is not None:
            total = _split_strata(extra, self.strata).sum(axis=(0, 1))
            if self.extra is None:
                self.extra = np.zeros((self.size, *total.shape[1:]))
            self.extra[rows] += total
        if self.keep:
            kept = _split_strata(np.asarray(samples if self.task == "regression" else values), self.strata)
            self.chunks.append((rows, self.moments.count[rows[0]], kept))
        self.moments.add(rows, chunk)

    def _samples(self):
        """The kept samples, ``(S * T_max, B, ...)`` member-major, NaN where an example stopped."""
        longest = int(self.moments.count.max())
        trailing = self.chunks[0][2].shape[3:]
        out = np.full((self.strata, longest, self.size, *trailing), np.nan, np.float32)
        for rows, start, chunk in self.chunks:
            out[:, start:start + chunk.shape[1], rows] = chunk
        return out.reshape(self.strata * longest, self.size, *trailing)

    def result(self):
        m = self.moments
        used = m.count * self.strata
        common = {
            "samples": self._samples() if self.keep else None,
            "num_samples": int(used.max()),
            "samples_used": used,
            "standard_error": m.standard_error(np.arange(self.size), self.variance_floor).astype(np.float32),
        }
        if self.task == "classification":
            mean_probs, _ = m.pooled()
            total = entropy(mean_probs)
            aleatoric = self.extra / _expand(used.astype(np.float64), self.extra.ndim)
            gap = total - aleatoric
            epistemic = np.where(gap > ROUNDOFF_NATS, gap, 0.0)  # as summarize_classification
            return ClassificationPrediction(
                mean_probs=mean_probs.astype(np.float32), predictive_entropy=total.astype(np.float32),
                expected_entropy=aleatoric.astype(np.float32), mutual_information=epistemic.astype(np.float32),
                **common)
        mean, variance = m.pooled()
        aleatoric = None
        if self.head is not None:
            aleatoric = np.sqrt(self.extra / _expand(used.astype(np.float64), self.extra.ndim)).astype(np.float32)
        if self.head_epistemic is not None:
            variance = variance + self.head_epistemic / _expand(used.astype(np.float64), self.head_epistemic.ndim)
        return RegressionPrediction(mean=mean.astype(np.float32), epistemic_std=np.sqrt(variance).astype(np.float32),
                                    aleatoric_std=aleatoric, **common)


def _next_chunk(rule, done, errors):
    """Samples per example of the next call: enough for the median active example to meet the
    rule if its variance estimate holds (``se^2`` falls as ``1 / n``; Stein's two-stage idea,
    iterated), at least ``chunk_size``, at most doubling ``n``, as ``chunk_size * 2^j`` (few traces)."""
    if done == 0:
        return min(max(rule.chunk_size, rule.min_samples), rule.max_samples)
    needed = done * np.square(np.median(errors) / rule.tolerance) - done
    wanted = int(np.clip(needed, rule.chunk_size, max(rule.chunk_size, done)))
    k = rule.chunk_size * 2 ** int(np.ceil(np.log2(wanted / rule.chunk_size)))
    return int(min(k, rule.max_samples - done))


def sample_adaptively(draw, batch, rule, resolve, make_batch):
    """Draws chunks for the examples of ``batch`` that have not met ``rule``; returns the summary.

    ``draw(sub_batch, k)`` returns ``(S * k, b, ...)`` samples; ``resolve(samples)`` the
    task (called once); ``make_batch(task)`` an empty :class:`AdaptiveBatch`.
    """
    size = int(tf.nest.flatten(batch)[0].shape[0])
    active, errors, summary = np.arange(size), None, None
    while active.size:
        done = 0 if summary is None else int(summary.moments.count[active[0]])
        sub = batch if active.size == size else tf.nest.map_structure(lambda v: tf.gather(v, active), batch)
        samples = draw(sub, _next_chunk(rule, done, errors))
        if summary is None:
            summary = make_batch(resolve(samples))
        summary.add(active, samples)
        count = summary.moments.count[active]
        errors = summary.moments.standard_error(active, summary.variance_floor)
        converged = (count >= rule.min_samples) & (errors <= rule.tolerance)
        if rule.per == "batch":
            converged = np.full(active.shape, bool(converged.all()))
        keep = ~converged & (count < rule.max_samples)
        active, errors = active[keep], errors[keep]
    return summary.result()
