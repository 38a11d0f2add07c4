"""Calibration and proper-scoring metrics: plain functions and ``keras.metrics.Metric`` classes.

Plain functions take NumPy arrays or tensors, ``probs (N, C)`` (rows are
probability vectors) and ``labels``: integers ``(N,)`` or one-hot ``(N, C)``
(one-hot rows are read through their argmax). They return Python floats.

==============================  =============================================================
function / metric               definition (``p_i`` probs, ``y_i`` label, ``c_i = max_c p_ic``)
==============================  =============================================================
expected_calibration_error      ``sum_m |B_m| / N * |acc(B_m) - conf(B_m)|`` over ``M`` equal-
``ExpectedCalibrationError``    width confidence bins ``B_m = ((m-1)/M, m/M]`` (Naeini et al.
                                2015; Guo et al. 2017, eq. 3)
negative_log_likelihood         ``-(1/N) sum_i log p_{i, y_i}`` (nats; probabilities clipped
``NegativeLogLikelihood``       below at ``1e-7``)
brier_score ``BrierScore``      ``(1/N) sum_i sum_c (p_ic - 1[c = y_i])^2`` (Brier 1950, summed
                                over classes: range [0, 2]; some papers divide by C)
accuracy                        ``(1/N) sum_i 1[argmax_c p_ic = y_i]``
interval_coverage               the fraction of targets inside the central Gaussian intervals
                                ``mean -/+ Phi^-1((1 + p) / 2) std`` of levels ``p`` (regression
                                calibration: ideally ``p``)
auroc                           ``P(s_out > s_in) + P(s_out = s_in) / 2``: the area under the ROC
                                curve of telling apart two sets of uncertainty scores (Mann-
                                Whitney U / (n_in n_out); Hanley & McNeil 1982)
==============================  =============================================================

Bin convention: bins are right-closed, ``((m-1)/M, m/M]`` as in Guo et al.
(2017); a confidence of exactly ``m/M`` falls in bin ``m``, and so does one less
than ``1e-7`` above it (float32 stores 0.8 as 0.80000001). ``tfp.stats`` uses
``tf.histogram_fixed_width_bins`` (left-closed ``[(m-1)/M, m/M)``), so the two
agree except for confidences on (or within float error of) a bin edge.

The ``Metric`` classes accumulate sums across batches in state variables and
accept sparse labels ``(B,)`` / ``(B, 1)`` or one-hot labels ``(B, C)``, an
optional ``sample_weight`` and ``from_logits``::

    model.compile("adam", "sparse_categorical_crossentropy",
                  metrics=["accuracy", tfbnn.metrics.ExpectedCalibrationError(num_bins=15)])

References:
    Naeini, Cooper, Hauskrecht. Obtaining Well Calibrated Probabilities Using
    Bayesian Binning. AAAI 2015.
    Guo, Pleiss, Sun, Weinberger. On Calibration of Modern Neural Networks. ICML 2017.
    Brier. Verification of Forecasts Expressed in Terms of Probability. 1950.
    Geifman, El-Yaniv. Selective Classification for Deep Neural Networks. NeurIPS 2017.
    Hanley, McNeil. The Meaning and Use of the Area under a Receiver Operating
    Characteristic (ROC) Curve. Radiology 1982 (AUROC = Mann-Whitney U / (m n)).
    Hendrycks, Gimpel. A Baseline for Detecting Misclassified and Out-of-Distribution
    Examples in Neural Networks. ICLR 2017 (AUROC of uncertainty scores).
"""

import dataclasses
import math
import statistics

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.likelihoods import distribution_head

__all__ = [
    "expected_calibration_error",
    "negative_log_likelihood",
    "brier_score",
    "accuracy",
    "reliability_diagram",
    "ReliabilityDiagram",
    "selective_prediction",
    "SelectivePrediction",
    "auroc",
    "aupr",
    "fpr_at_tpr",
    "interval_coverage",
    "ExpectedCalibrationError",
    "NegativeLogLikelihood",
    "BrierScore",
    "HeadMean",
]

_EPS = 1e-7
_SUM_TOL = 1e-3
# A confidence this close above a bin edge counts as on the edge: float32 stores
# 0.8 as 0.80000001, which would otherwise land one bin up.
_EDGE_TOL = 1e-7


# -- argument checks ---------------------------------------------------------------
_MAX_BINS = 100_000  # the Keras metric holds three float64 vectors of this length


def _check_num_bins(num_bins):
    return checks.integer("num_bins", num_bins, 1, _MAX_BINS, f"an integer in [1, {_MAX_BINS}]")


def _check_probs(probs):
    p = checks.array("probs", probs, np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(
            "Expected `probs` of shape (N, C) with C >= 2 classes (stack [1 - p, p] for one "
            f"sigmoid output). Received: probs.shape={p.shape}"
        )
    if p.shape[0] == 0:
        raise ValueError(f"Expected at least one example. Received: probs.shape={p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < -_SUM_TOL) or np.any(p > 1 + _SUM_TOL):
        raise ValueError(
            "Expected `probs` to hold probabilities in [0, 1] (pass logits through a softmax "
            f"first). Received: {checks.value_range('probs', p)}"
        )
    sums = p.sum(axis=1)
    if not np.allclose(sums, 1.0, atol=_SUM_TOL):
        worst = sums[np.argmax(np.abs(sums - 1.0))]
        raise ValueError(f"Expected each row of `probs` to sum to 1. Received: a row summing to {worst:.6g}")
    return np.clip(p, 0.0, 1.0)


def check_labels(labels, probs):
    y = checks.array("labels", labels)
    n, num_classes = probs.shape
    if y.ndim == 2 and y.shape[1] == num_classes and num_classes > 1:
        y = np.argmax(y, axis=1)
    elif y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise ValueError(
            f"Expected `labels` of shape (N,) (integers) or (N, C) (one-hot). Received: labels.shape={np.shape(labels)}"
        )
    if y.shape[0] != n:
        raise ValueError(
            "Expected `probs` and `labels` to have the same number of examples. "
            f"Received: probs.shape={probs.shape}, labels.shape={np.shape(labels)}"
        )
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
            raise ValueError(f"Expected integer class labels. Received: labels of dtype {y.dtype}")
        y = y.astype(np.int64)
    if np.any(y < 0) or np.any(y >= num_classes):
        raise ValueError(
            f"Expected labels in [0, {num_classes}). Received: labels with min={y.min()}, max={y.max()}"
        )
    return y


def _inputs(probs, labels):
    p = _check_probs(probs)
    return p, check_labels(labels, p)


def _bin_index(confidence, num_bins):
    """Right-closed equal-width bins ((m-1)/M, m/M], as 0-based indices."""
    idx = np.ceil((confidence - _EDGE_TOL) * num_bins).astype(np.int64) - 1
    return np.clip(idx, 0, num_bins - 1)


# -- plain functions -----------------------------------------------------------------
def accuracy(probs, labels):
    """Fraction of examples whose argmax class is the label.

    Args:
        probs: ``(N, C)`` probabilities.
        labels: ``(N,)`` integers or ``(N, C)`` one-hot.

    Returns:
        float in [0, 1].

    Example:
        >>> import tfbnn
        >>> tfbnn.metrics.accuracy([[0.9, 0.1], [0.4, 0.6]], [0, 0])
        0.5
    """
    p, y = _inputs(probs, labels)
    return float(np.mean(np.argmax(p, axis=1) == y))


def negative_log_likelihood(probs, labels):
    """Mean negative log-likelihood ``-(1/N) sum_i log p_{i, y_i}`` in nats.

    Probabilities are clipped below at ``1e-7`` so a confident mistake costs at
    most ``-log(1e-7) ~= 16.1`` instead of infinity (the same clip as the
    :class:`NegativeLogLikelihood` metric).

    Args:
        probs: ``(N, C)`` probabilities.
        labels: ``(N,)`` integers or ``(N, C)`` one-hot.

    Returns:
        float >= 0.

    Example:
        >>> import tfbnn
        >>> round(tfbnn.metrics.negative_log_likelihood([[0.5, 0.5], [0.25, 0.75]], [0, 1]), 4)
        0.4904
    """
    p, y = _inputs(probs, labels)
    picked = p[np.arange(len(y)), y]
    return float(-np.mean(np.log(np.maximum(picked, _EPS))))


def brier_score(probs, labels):
    """Brier score ``(1/N) sum_i sum_c (p_ic - 1[c = y_i])^2``.

    Convention: summed over classes, averaged over examples (Brier's original
    multi-class score; range [0, 2], 0 is perfect). Divide by ``C`` for the
    per-class mean some papers report.

    Args:
        probs: ``(N, C)`` probabilities.
        labels: ``(N,)`` integers or ``(N, C)`` one-hot.

    Returns:
        float in [0, 2].

    Example:
        >>> import tfbnn
        >>> tfbnn.metrics.brier_score([[1.0, 0.0], [0.5, 0.5]], [0, 1])
        0.25
    """
    p, y = _inputs(probs, labels)
    onehot = np.eye(p.shape[1])[y]
    return float(np.mean(np.sum(np.square(p - onehot), axis=1)))


@dataclasses.dataclass(frozen=True)
class ReliabilityDiagram:
    """Per-bin statistics of a reliability diagram (empty bins hold NaN).

    Attributes:
        confidence: ``(M,)`` mean confidence ``conf(B_m)`` in each bin.
        accuracy: ``(M,)`` accuracy ``acc(B_m)`` in each bin.
        count: ``(M,)`` number of examples in each bin.
        edges: ``(M + 1,)`` bin edges ``0, 1/M, ..., 1`` (bins are right-closed).

    Property ``ece``: ``sum_m count_m / N * |accuracy_m - confidence_m|``.
    """

    confidence: np.ndarray
    accuracy: np.ndarray
    count: np.ndarray
    edges: np.ndarray

    @property
    def ece(self):
        filled = self.count > 0
        gaps = np.abs(self.accuracy[filled] - self.confidence[filled])
        return float(np.sum(self.count[filled] * gaps) / np.sum(self.count))


def reliability_diagram(probs, labels, num_bins=15):
    """Accuracy against confidence in ``num_bins`` equal-width confidence bins.

    With ``c_i = max_c p_ic`` and ``B_m = {i : c_i in ((m-1)/M, m/M]}``::

        conf(B_m) = mean_{i in B_m} c_i,    acc(B_m) = mean_{i in B_m} 1[argmax p_i = y_i]

    A calibrated model has ``acc(B_m) = conf(B_m)`` (Guo et al. 2017, sec. 2).

    Args:
        probs: ``(N, C)`` probabilities.
        labels: ``(N,)`` integers or ``(N, C)`` one-hot.
        num_bins: int > 0, M. Default 15 (as Guo et al. 2017 and Trinh et al. 2022).

    Returns:
        A :class:`ReliabilityDiagram`.

    Example:
        >>> import tfbnn
        >>> d = tfbnn.metrics.reliability_diagram([[0.9, 0.1], [0.6, 0.4]], [0, 1], num_bins=5)
        >>> d.count.tolist(), d.accuracy[[2, 4]].tolist()   # 0.6 is in (0.4, 0.6]
        ([0, 0, 1, 0, 1], [0.0, 1.0])
        >>> # plt.bar(d.edges[:-1], d.accuracy, width=1 / 5, align="edge") draws the diagram
    """
    num_bins = _check_num_bins(num_bins)
    p, y = _inputs(probs, labels)
    conf = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(np.float64)
    idx = _bin_index(conf, num_bins)
    count = np.bincount(idx, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=conf, minlength=num_bins) / count
        mean_acc = np.bincount(idx, weights=correct, minlength=num_bins) / count
    return ReliabilityDiagram(
        confidence=mean_conf, accuracy=mean_acc, count=count, edges=np.linspace(0.0, 1.0, num_bins + 1)
    )


def expected_calibration_error(probs, labels, num_bins=15):
    """Expected calibration error with equal-width confidence bins.

    ``ECE = sum_m |B_m| / N * |acc(B_m) - conf(B_m)|`` over the bins
    ``B_m = ((m-1)/M, m/M]`` of the confidence ``max_c p_ic`` (Naeini et al.
    2015; Guo et al. 2017, eq. 3). Equals ``tfp.stats.expected_calibration_error(
    num_bins, logits=log(probs), labels_true=labels)`` up to float error, except
    for confidences exactly on a bin edge (TFP's bins are left-closed).

    Args:
        probs: ``(N, C)`` probabilities.
        labels: ``(N,)`` integers or ``(N, C)`` one-hot.
        num_bins: int > 0, M. Default 15 (Guo et al. 2017; Trinh et al. 2022).

    Returns:
        float in [0, 1].

    Example:
        >>> import tfbnn
        >>> tfbnn.metrics.expected_calibration_error([[0.9, 0.1], [0.8, 0.2]], [0, 1], num_bins=10)
        0.45
    """
    return reliability_diagram(probs, labels, num_bins).ece


@dataclasses.dataclass(frozen=True)
class SelectivePrediction:
    """Accuracy-coverage curve of selective prediction.

    Attributes:
        coverage: ``(N,)`` ``k / N`` for ``k = 1..N`` (fraction of examples kept).
        accuracy: ``(N,)`` accuracy on the ``k`` least uncertain examples.
        area: area under the curve, ``(1/N) sum_k accuracy_k`` (higher is better).
    """

    coverage: np.ndarray
    accuracy: np.ndarray
    area: float

    def accuracy_at(self, coverage):
        """Accuracy when keeping the fraction ``coverage`` in (0, 1] of the examples."""
        if not 0 < coverage <= 1:
            raise ValueError(f"Expected `coverage` in (0, 1]. Received: coverage={coverage!r}")
        k = max(1, int(np.ceil(coverage * len(self.coverage) - 1e-9)))
        return float(self.accuracy[k - 1])


def selective_prediction(probs, labels, uncertainty=None):
    """Accuracy as the most uncertain examples are deferred (rejected).

    Examples are sorted by increasing ``uncertainty`` (ties keep their input
    order); keeping the first ``k`` gives coverage ``k / N`` and the accuracy on
    them. A good uncertainty makes accuracy fall as coverage grows; the area
    under the accuracy-coverage curve summarises it (Geifman & El-Yaniv 2017).

    Args:
        probs: ``(N, C)`` probabilities (predictions are their argmax).
        labels: ``(N,)`` integers or ``(N, C)`` one-hot.
        uncertainty: ``(N,)`` scores, higher means more uncertain (for example
            ``predict(...).predictive_entropy`` or ``.mutual_information``). Default
            ``1 - max_c p_ic``.

    Returns:
        A :class:`SelectivePrediction` (``coverage``, ``accuracy``, ``area``).

    Example:
        >>> import tfbnn
        >>> curve = tfbnn.metrics.selective_prediction([[0.9, 0.1], [0.6, 0.4]], [0, 1])
        >>> curve.accuracy.tolist(), curve.area
        ([1.0, 0.5], 0.75)
        >>> # with a model: res = tfbnn.predict(model, x, num_samples=50);
        >>> # selective_prediction(res.mean_probs, y, uncertainty=res.predictive_entropy)
    """
    p, y = _inputs(probs, labels)
    if uncertainty is None:
        u = 1.0 - p.max(axis=1)
    else:
        u = checks.array("uncertainty", uncertainty, np.float64)
        if u.shape != y.shape:
            raise ValueError(
                "Expected one `uncertainty` score per example. "
                f"Received: uncertainty.shape={u.shape}, labels.shape={y.shape}"
            )
        if not np.all(np.isfinite(u)):
            raise ValueError("Expected finite `uncertainty` scores. Received: NaN or infinite values")
    order = np.argsort(u, kind="stable")
    correct = (np.argmax(p, axis=1) == y)[order].astype(np.float64)
    k = np.arange(1, len(y) + 1)
    acc = np.cumsum(correct) / k
    return SelectivePrediction(coverage=k / len(y), accuracy=acc, area=float(np.mean(acc)))


def _check_scores(name, scores):
    s = checks.array(name, scores, np.float64)
    if s.ndim != 1 or s.shape[0] == 0:
        raise ValueError(f"Expected `{name}` of shape (N,) with N >= 1. Received: {name}.shape={s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"Expected finite `{name}`. Received: NaN or infinite values")
    return s


def auroc(in_scores, out_scores):
    """Area under the ROC curve of separating ``out_scores`` (positives) from ``in_scores``.

    With uncertainty scores (higher = more uncertain) of in-distribution inputs
    ``s_in`` and shifted or out-of-distribution inputs ``s_out``::

        AUROC = P(s_out > s_in) + P(s_out = s_in) / 2
              = U / (n_in n_out),   U = sum of the ranks of s_out - n_out (n_out + 1) / 2

    (Mann-Whitney U with mid-ranks for ties; Hanley & McNeil 1982). 1 separates the
    two sets perfectly, 0.5 is chance; a score that cannot see the shift at all (the
    epistemic uncertainty of a deterministic model, always 0) gives exactly 0.5. The
    threshold-free detection measure of Hendrycks & Gimpel (2017).

    Args:
        in_scores: ``(n_in,)`` scores of the clean inputs (the negatives).
        out_scores: ``(n_out,)`` scores of the shifted inputs (the positives).

    Returns:
        A float in [0, 1] (``sklearn.metrics.roc_auc_score`` on the stacked scores
        with labels 0 / 1 gives the same number).

    Example:
        >>> import tfbnn
        >>> tfbnn.metrics.auroc([0.1, 0.2, 0.3], [0.25, 0.4])   # 5 of 6 pairs ordered
        0.8333333333333334
        >>> tfbnn.metrics.auroc([0.0, 0.0], [0.0])                # ties: chance
        0.5
        >>> # res_in, res_out = tfbnn.predict(model, x), tfbnn.predict(model, x_shifted)
        >>> # auroc(res_in.mutual_information, res_out.mutual_information)
    """
    neg = _check_scores("in_scores", in_scores)
    pos = _check_scores("out_scores", out_scores)
    scores = np.concatenate([neg, pos])
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Mid-ranks: every member of a run of equal scores gets the mean of the run's ranks.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    u = ranks[len(neg):].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(neg) * len(pos)))


def aupr(in_scores, out_scores):
    """Area under the precision-recall curve of detecting ``out_scores`` (positives), as average precision.

    The out-of-distribution (or shifted) inputs are the positives and a higher score flags
    them, as in :func:`auroc`. Sorting by score, descending, with ``P_k`` the precision and
    ``R_k`` the recall at the ``k``-th distinct threshold::

        AP = sum_k (R_k - R_{k-1}) P_k

    (``sklearn.metrics.average_precision_score`` gives the same number; ties share one
    threshold). Chance is the positives' share ``n_out / (n_in + n_out)``, not 0.5.

    Args:
        in_scores: ``(n_in,)`` scores of the in-distribution inputs (negatives).
        out_scores: ``(n_out,)`` scores of the out-of-distribution inputs (positives).

    Returns:
        A float in (0, 1].

    Example:
        >>> import tfbnn
        >>> tfbnn.metrics.aupr([0.1, 0.2, 0.3], [0.25, 0.4])   # thresholds 0.4, 0.3, 0.25: (1 + 2/3) / 2
        0.8333333333333333
    """
    neg = _check_scores("in_scores", in_scores)
    pos = _check_scores("out_scores", out_scores)
    scores = np.concatenate([pos, neg])
    is_pos = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    order = np.argsort(-scores, kind="mergesort")
    scores, is_pos = scores[order], is_pos[order]
    last = np.r_[scores[1:] != scores[:-1], True]  # the last row of each run of equal scores: one threshold
    tp = np.cumsum(is_pos)[last]
    flagged = (np.arange(1, len(scores) + 1))[last]
    recall = tp / len(pos)
    return float(np.sum(np.diff(np.r_[0.0, recall]) * tp / flagged))


def fpr_at_tpr(in_scores, out_scores, tpr=0.95):
    """The false-positive rate at the first threshold that detects a fraction ``tpr`` of the positives.

    "FPR at 95% TPR" (Hendrycks & Gimpel 2017; Liang et al. 2018) with the
    out-of-distribution inputs as positives and a higher score flagging them: the
    threshold is the largest ``t`` with ``P(s_out >= t) >= tpr``, and the result is
    ``P(s_in >= t)``, the share of in-distribution inputs flagged with it. 0 is perfect,
    ``tpr`` is chance.

    Args:
        in_scores: ``(n_in,)`` scores of the in-distribution inputs.
        out_scores: ``(n_out,)`` scores of the out-of-distribution inputs.
        tpr: float in (0, 1]. Default 0.95.

    Returns:
        A float in [0, 1].

    Example:
        >>> import tfbnn
        >>> tfbnn.metrics.fpr_at_tpr([0.1, 0.2, 0.3, 0.5], [0.25, 0.4, 0.6, 0.7], tpr=0.75)  # t = 0.4: 1 of 4
        0.25
    """
    neg = _check_scores("in_scores", in_scores)
    pos = np.sort(_check_scores("out_scores", out_scores))[::-1]
    tpr = checks.number("tpr", tpr, low=0, high=1, low_open=True, what="a true-positive rate in (0, 1]")
    threshold = pos[math.ceil(tpr * len(pos) - 1e-12) - 1]
    return float(np.mean(neg >= threshold))


def interval_coverage(targets, mean, std, levels=(0.5, 0.9)):
    """Empirical coverage of central Gaussian predictive intervals (regression calibration).

    For each level ``p`` the fraction of targets with ``|y_i - mu_i| <= z_p sigma_i``,
    ``z_p = Phi^-1((1 + p) / 2)``: a calibrated predictive covers a fraction ``p``
    (Kuleshov et al. 2018 use one-sided quantiles; these are central intervals, as
    :meth:`tfbnn.RegressionPrediction.interval` gives them).

    Args:
        targets: ``(N, ...)`` regression targets.
        mean: the predictive means, shaped like ``targets``.
        std: the predictive standard deviations (> 0), shaped like ``targets``.
        levels: sequence of floats in (0, 1). Default ``(0.5, 0.9)``.

    Returns:
        A list of floats in [0, 1], one coverage per level.

    Example:
        >>> import tfbnn
        >>> tfbnn.metrics.interval_coverage([0.0, 1.0, 3.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], levels=(0.5, 0.9))
        [0.3333333333333333, 0.6666666666666666]
    """
    y, mu, sd = (np.asarray(v, np.float64) for v in (targets, mean, std))
    if not (y.shape == mu.shape == sd.shape):
        raise ValueError(f"Expected `targets`, `mean` and `std` of one shape. Received: shapes {y.shape}, "
                         f"{mu.shape} and {sd.shape}")
    if not np.all(sd > 0):
        raise ValueError(f"Expected `std` > 0. Received: std with minimum {float(sd.min())!r}")
    out = []
    for level in levels:
        level = checks.number("levels", level, low=0, high=1, low_open=True, high_open=True)
        z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
        out.append(float(np.mean(np.abs(y - mu) <= z * sd)))
    return out


# -- Keras metrics ---------------------------------------------------------------------
def _probs_and_labels(y_true, y_pred, from_logits):
    """Probabilities ``(B, C)`` and int labels ``(B,)`` from sparse or one-hot labels."""
    y_pred = tf.convert_to_tensor(y_pred)
    if y_pred.shape.rank is not None and (y_pred.shape.rank < 2 or y_pred.shape[-1] == 1):
        raise ValueError(
            "Expected `y_pred` of shape (B, ..., C) with C >= 2 classes (stack [1 - p, p] for one sigmoid "
            f"output). Received: y_pred.shape={tuple(y_pred.shape)}"
        )
    probs = tf.nn.softmax(y_pred, axis=-1) if from_logits else y_pred
    probs = tf.cast(probs, tf.float64)
    y_true = tf.convert_to_tensor(y_true)
    rank, num_classes = y_true.shape.rank, probs.shape[-1]
    if rank == probs.shape.rank and y_true.shape[-1] == num_classes and num_classes != 1:
        labels = tf.argmax(y_true, axis=-1)
    elif rank == probs.shape.rank and y_true.shape[-1] == 1:
        labels = tf.squeeze(y_true, axis=-1)
    else:
        labels = y_true
    labels = tf.reshape(tf.cast(labels, tf.float64), [-1])
    probs = tf.reshape(probs, [-1, tf.shape(probs)[-1]])
    return _checked_probs(probs, from_logits), _checked_labels(labels, probs, y_true, y_pred)


def _same_length(a, b, message, received):
    """``a`` if its leading dimension is ``b``'s (statically when known, else when run)."""
    n_a, n_b = a.shape[0], b.shape[0]
    if n_a is not None and n_b is not None:
        if n_a != n_b:
            raise ValueError(f"{message} Received: {received()}")
        return a
    return checks.checked(a, lambda: tf.equal(tf.shape(a)[0], tf.shape(b)[0]), message, received)


def _checked_probs(probs, from_logits):
    """The checks of :func:`expected_calibration_error` & co. on ``y_pred``, in the graph."""
    if from_logits:
        return checks.checked(probs, lambda: tf.reduce_all(tf.math.is_finite(probs)),
                               "Expected finite logits `y_pred`.", lambda: "NaN or infinite values")
    probs = checks.checked(
        probs,
        lambda: tf.reduce_all(tf.math.is_finite(probs) & (probs >= -_SUM_TOL) & (probs <= 1 + _SUM_TOL)),
        "Expected `y_pred` to hold probabilities in [0, 1] (logits need from_logits=True).",
        lambda: checks.value_range("y_pred", probs),
    )
    sums = tf.reduce_sum(probs, axis=-1)
    return checks.checked(
        probs, lambda: tf.reduce_all(tf.abs(sums - 1.0) <= _SUM_TOL),
        "Expected each row of `y_pred` to sum to 1.",
        lambda: f"a row summing to {float(tf.gather(sums, tf.argmax(tf.abs(sums - 1.0)))):.6g}",
    )


def _checked_labels(labels, probs, y_true, y_pred):
    """Integer labels ``(B,)`` in ``[0, C)``, one per row of ``probs`` (as :func:`check_labels`)."""
    labels = _same_length(
        labels, probs, "Expected `y_true` and `y_pred` to have the same number of examples.",
        lambda: f"y_true.shape={tuple(y_true.shape)}, y_pred.shape={tuple(y_pred.shape)}",
    )
    num_classes = tf.cast(tf.shape(probs)[-1], labels.dtype)
    labels = checks.checked(
        labels,
        lambda: tf.reduce_all((labels >= 0) & (labels < num_classes) & tf.equal(labels, tf.round(labels))),
        f"Expected integer class labels in [0, {probs.shape[-1]}) in `y_true`.",
        lambda: checks.value_range("y_true", labels),
    )
    return tf.cast(labels, tf.int64)


def _weights(sample_weight, labels):
    """Per-example weights ``(B,)`` from None, a scalar, ``(B,)`` or ``(B, 1)``."""
    if sample_weight is None:
        return tf.ones_like(labels, dtype=tf.float64)
    w = tf.cast(sample_weight, tf.float64)
    if not w.shape.rank:
        return tf.broadcast_to(w, tf.shape(labels))
    return _same_length(
        tf.reshape(w, [-1]), labels, "Expected one `sample_weight` per example.",
        lambda: f"sample_weight.shape={tuple(w.shape)}, labels.shape={tuple(labels.shape)}",
    )


class _MeanOfExamples(keras.metrics.Metric):
    """A weighted mean over examples of a per-example score."""

    def __init__(self, from_logits=False, name=None, dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.from_logits = bool(from_logits)
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float64", name="total")
        self.weight = self.add_variable(shape=(), initializer="zeros", dtype="float64", name="weight")

    def _per_example(self, probs, labels):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        probs, labels = _probs_and_labels(y_true, y_pred, self.from_logits)
        w = _weights(sample_weight, labels)
        self.total.assign_add(tf.reduce_sum(w * self._per_example(probs, labels)))
        self.weight.assign_add(tf.reduce_sum(w))

    def result(self):
        return tf.cast(tf.math.divide_no_nan(self.total, self.weight), self.dtype)

    def get_config(self):
        config = super().get_config()
        config.update({"from_logits": self.from_logits})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class NegativeLogLikelihood(_MeanOfExamples):
    """Mean negative log-likelihood ``-(1/N) sum_i log p_{i, y_i}`` as a Keras metric.

    Accumulates over batches (weighted by ``sample_weight``); probabilities are
    clipped below at ``1e-7`` as in :func:`negative_log_likelihood`.

    Args:
        from_logits: bool, ``y_pred`` are logits (a softmax is applied).
        name, dtype: as for any ``keras.metrics.Metric``.

    Example:
        >>> import tfbnn
        >>> m = tfbnn.metrics.NegativeLogLikelihood()
        >>> m.update_state([0, 1], [[0.5, 0.5], [0.25, 0.75]])
        >>> round(float(m.result()), 4)
        0.4904
        >>> # model.compile("adam", "sparse_categorical_crossentropy", metrics=[m])
    """

    def __init__(self, from_logits=False, name="nll", dtype=None):
        super().__init__(from_logits=from_logits, name=name, dtype=dtype)

    def _per_example(self, probs, labels):
        picked = tf.gather(probs, labels[:, None], batch_dims=1)[:, 0]
        return -tf.math.log(tf.maximum(picked, _EPS))


@keras.saving.register_keras_serializable(package="tfbnn")
class BrierScore(_MeanOfExamples):
    """Brier score ``(1/N) sum_i sum_c (p_ic - 1[c = y_i])^2`` as a Keras metric.

    Summed over classes, averaged over examples (see :func:`brier_score`).

    Args:
        from_logits: bool, ``y_pred`` are logits (a softmax is applied).
        name, dtype: as for any ``keras.metrics.Metric``.

    Example:
        >>> import tfbnn
        >>> m = tfbnn.metrics.BrierScore()
        >>> m.update_state([0, 1], [[1.0, 0.0], [0.5, 0.5]])
        >>> float(m.result())
        0.25
        >>> # model.compile("adam", "sparse_categorical_crossentropy", metrics=[m])
    """

    def __init__(self, from_logits=False, name="brier", dtype=None):
        super().__init__(from_logits=from_logits, name=name, dtype=dtype)

    def _per_example(self, probs, labels):
        onehot = tf.one_hot(labels, tf.shape(probs)[-1], dtype=probs.dtype)
        return tf.reduce_sum(tf.square(probs - onehot), axis=-1)


@keras.saving.register_keras_serializable(package="tfbnn")
class ExpectedCalibrationError(keras.metrics.Metric):
    """Expected calibration error as a Keras metric, accumulated over batches.

    Holds per-bin sums (weight, confidence, correct) of the right-closed
    equal-width bins ``((m-1)/M, m/M]`` of the confidence ``max_c p_ic``, and
    returns ``sum_m |sum correct_m - sum conf_m| / N``, which is
    ``sum_m |B_m| / N * |acc(B_m) - conf(B_m)|`` (Naeini et al. 2015; Guo et al.
    2017, eq. 3) over everything seen since the last ``reset_state``.

    Args:
        num_bins: int > 0, M. Default 15.
        from_logits: bool, ``y_pred`` are logits (a softmax is applied).
        name, dtype: as for any ``keras.metrics.Metric``.

    Example:
        >>> import tfbnn
        >>> m = tfbnn.metrics.ExpectedCalibrationError(num_bins=10)
        >>> m.update_state([0], [[0.9, 0.1]])
        >>> m.update_state([1], [[0.8, 0.2]])   # accumulated across batches
        >>> round(float(m.result()), 4)
        0.45
        >>> # model.compile(..., metrics=["accuracy", m]); model.evaluate(...)["ece"]
    """

    def __init__(self, num_bins=15, from_logits=False, name="ece", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.num_bins = _check_num_bins(num_bins)
        self.from_logits = bool(from_logits)
        self.bin_count = self.add_variable(shape=(self.num_bins,), initializer="zeros", dtype="float64", name="bin_count")
        self.bin_confidence = self.add_variable(
            shape=(self.num_bins,), initializer="zeros", dtype="float64", name="bin_confidence"
        )
        self.bin_correct = self.add_variable(shape=(self.num_bins,), initializer="zeros", dtype="float64", name="bin_correct")

    def update_state(self, y_true, y_pred, sample_weight=None):
        probs, labels = _probs_and_labels(y_true, y_pred, self.from_logits)
        w = _weights(sample_weight, labels)
        conf = tf.reduce_max(probs, axis=-1)
        correct = tf.cast(tf.equal(tf.argmax(probs, axis=-1), labels), tf.float64)
        idx = tf.cast(tf.math.ceil((conf - _EDGE_TOL) * self.num_bins), tf.int32) - 1
        idx = tf.clip_by_value(idx, 0, self.num_bins - 1)
        self.bin_count.assign_add(tf.math.unsorted_segment_sum(w, idx, self.num_bins))
        self.bin_confidence.assign_add(tf.math.unsorted_segment_sum(w * conf, idx, self.num_bins))
        self.bin_correct.assign_add(tf.math.unsorted_segment_sum(w * correct, idx, self.num_bins))

    def result(self):
        gap = tf.reduce_sum(tf.abs(self.bin_correct - self.bin_confidence))
        return tf.cast(tf.math.divide_no_nan(gap, tf.reduce_sum(self.bin_count)), self.dtype)

    def get_config(self):
        config = super().get_config()
        config.update({"num_bins": self.num_bins, "from_logits": self.from_logits})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class HeadMean(keras.metrics.Metric):
    """A Keras metric of a distribution head's predictive mean instead of its raw parameters.

    A model ending in a distribution head (:mod:`tfbnn.likelihoods`) outputs the
    parameters of a distribution, e.g. ``[loc, scale]`` ``(B, 2 d)`` for a
    :class:`tfbnn.GaussianHead`, not a prediction: a plain metric such as
    ``keras.metrics.RootMeanSquaredError()`` would compare the targets ``(B, d)`` with
    them (tfbnn refuses that for regression heads; a classification head's normalized logits
    keep an argmax-based accuracy right, but not a metric that reads probabilities). ``HeadMean(metric, head)`` gives ``metric`` the
    prediction the head's distribution makes, for each example::

        regression heads:      E[y | theta] = head.moments(y_pred)[0]                 (B, ..., d)
        classification heads:  E[y | theta] = head.distribution(y_pred).mean()         (B, ..., C) or (B, ..., d)

    (the class probabilities of a :class:`tfbnn.likelihoods.CategoricalHead`, the label
    probabilities ``p(y = 1)`` of a :class:`tfbnn.likelihoods.BernoulliHead`)

    (one weight sample per step, as every metric ``fit`` / ``evaluate`` report; for the
    Monte Carlo predictive use :func:`tfbnn.predict`). The result, state and reset are
    ``metric``'s; the name is ``metric``'s unless given, so the logs read as before.

    Args:
        metric: a Keras metric (instance, name or config), e.g.
            ``keras.metrics.RootMeanSquaredError()``.
        head: the model's :class:`tfbnn.likelihoods.DistributionHead` (its output layer,
            or an equal one), or its config.
        name: str or None (default: ``metric``'s name).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> head = tfbnn.GaussianHead()
        >>> rmse = tfbnn.metrics.HeadMean(keras.metrics.RootMeanSquaredError(), head)
        >>> y = np.array([[1.0], [2.0]])
        >>> params = np.array([[0.0, 5.0], [2.0, -3.0]], "float32")   # [loc, raw scale]: means 0 and 2
        >>> round(float(rmse(y, head(params))), 4)                    # sqrt(((1 - 0)^2 + 0) / 2)
        0.7071
        >>> # model.compile("adam", tfbnn.likelihoods.DistributionNLL(head), metrics=[rmse])
    """

    #: Read by the distribution heads: this metric sees predictions, not parameters.
    reads_distribution_head = True

    def __init__(self, metric, head, name=None, dtype=None):
        try:
            metric = keras.metrics.get(metric)
        except (ValueError, TypeError) as e:
            raise ValueError(f"Expected `metric` to be a Keras metric ({e}). Received: metric={metric!r}") from None
        if not isinstance(metric, keras.metrics.Metric):  # a plain function such as keras.metrics.mse
            metric = keras.metrics.MeanMetricWrapper(metric, name=getattr(metric, "__name__", None))
        head = distribution_head(head)
        super().__init__(name=name or metric.name, dtype=dtype or metric.dtype)
        self.metric = metric
        self.head = head

    def update_state(self, y_true, y_pred, sample_weight=None):
        if self.head.task == "classification":
            prediction = self.head.distribution(y_pred).mean()
        else:
            prediction = self.head.moments(y_pred)[0]
        return self.metric.update_state(y_true, prediction, sample_weight=sample_weight)

    def result(self):
        return self.metric.result()

    def reset_state(self):
        self.metric.reset_state()

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype,
                "metric": keras.metrics.serialize(self.metric),
                "head": keras.saving.serialize_keras_object(self.head)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["metric"] = keras.metrics.deserialize(config["metric"])
        return cls(**config)
