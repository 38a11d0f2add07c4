"""Split conformal prediction on top of any tfbnn predictive: intervals and sets with a coverage guarantee.

A predictive (a Bayesian network's Monte Carlo predictive, an ensemble, a Laplace
approximation, a deterministic model) is turned into prediction intervals or sets that
contain the true target with probability at least ``1 - alpha``, whatever the model and
however wrong it is, as long as the calibration and test examples are exchangeable
(Vovk et al. 2005; Angelopoulos & Bates 2023, sec. 1-2).

Split conformal: a score ``s_i = s(x_i, y_i)`` ("how badly the predictive fits") on ``n``
held-out calibration examples; its conformal quantile is the ``k``-th smallest score,

    q_hat = s_(k),   k = ceil((n + 1)(1 - alpha)),

(``q_hat = inf`` when ``k > n``: too few calibration examples for that ``alpha``), and the
prediction set of a test input is every ``y`` whose score is at most ``q_hat``. Then

    1 - alpha <= P(Y_test in C(X_test)) <= 1 - alpha + 1 / (n + 1)

(the upper bound when the scores have no ties), over the draw of calibration and test
examples (Angelopoulos & Bates 2023, Theorem D.1 / D.2).

Scores:

* regression, ``"absolute"``: ``|y - mu(x)|``; the interval ``mu -/+ q_hat`` (Lei et al. 2018);
* regression, ``"normalized"``: ``|y - mu(x)| / sigma(x)`` with ``sigma`` the predictive
  standard deviation (``tfbnn.predict``'s ``total_std``); the interval ``mu -/+ q_hat sigma``,
  wide where the model is unsure (Papadopoulos et al. 2002; Angelopoulos & Bates 2023, sec. 2.3);
* quantile regression (CQR, Romano et al. 2019, eq. 6): ``max(lo(x) - y, y - hi(x))`` for a
  model's lower and upper quantiles; the interval ``[lo - q_hat, hi + q_hat]``;
* classification, ``"lac"`` (Sadinle et al. 2019): ``1 - p_y(x)``; the smallest sets on average;
* classification, ``"aps"`` (Romano et al. 2020, eq. 5): the probability mass of the classes
  ranked at or above ``y``; sets that grow with the predictive's uncertainty;
* classification, ``"raps"`` (Angelopoulos et al. 2021, eq. 3): APS plus
  ``lambda * max(0, rank(y) - k_reg)``, which keeps sets small when many classes are unlikely.

The set of a test input holds every class whose score is at most ``q_hat``.

Mondrian (group-conditional) conformal (Vovk et al. 2005, ch. 4.5; Angelopoulos & Bates 2023,
sec. 4.1): one quantile per group, computed from the calibration examples of that group only,

    q_hat_g = s_(k_g) among the n_g scores of group g,   k_g = ceil((n_g + 1)(1 - alpha)),

so that the coverage holds within every group, ``P(Y in C(X) | group g) >= 1 - alpha``, not
only on average over the groups: by class for classification (``class_conditional=True``:
the class ``c`` enters a set when its score is at most ``q_hat_c``), by a user's groups for
regression (``groups=`` in ``fit`` and ``predict``). A group with ``n_g < 1 / alpha - 1``
calibration examples gets ``q_hat_g = inf``.

APS and RAPS are **randomized** by default, as in the references' code (Romano et al. 2020,
eq. 7; Angelopoulos et al. 2021, Algorithm 2; MAPIE's ``include_last_label="randomized"``):
the class ranked ``r`` scores the mass ranked strictly above it plus ``u`` times its own
probability,

    E(x, y, u) = sum_{j: rank_j < rank_y} p_j(x) + u * p_y(x)  [+ lambda * max(0, rank_y - k_reg)],

with one ``u ~ U(0, 1)`` per example (seeded). The scores then have no ties, and the
coverage is ``1 - alpha`` up to ``1 / (n + 1)`` on both sides. The non-randomized rule
(``randomized=False``, ``u = 1``) keeps the lower bound only: cumulative masses near 1 tie on
confident models, so its sets swell (a Flipout MLP on MNIST at ``alpha = 0.1``: coverage 0.965
with 5.9 classes per set, against 0.90 for LAC).
A randomized set may be empty (``allow_empty=True``, as in Romano et al.'s code: needed for
the upper bound); ``allow_empty=False`` always keeps the top class (Angelopoulos et al.'s
ImageNet code), which can only add coverage.

Example:
    >>> import numpy as np
    >>> from tfbnn import conformal
    >>> rng = np.random.default_rng(0)
    >>> y_cal, mu_cal = rng.normal(size=500), np.zeros(500)
    >>> cp = conformal.SplitConformalRegressor(alpha=0.1).fit(mu_cal, y_cal)
    >>> lower, upper = cp.predict(np.zeros(3))
    >>> round(float(upper[0]), 2)      # this sample's; the 0.9 quantile of |N(0, 1)| is 1.64
    1.51
    >>> # with tfbnn: res = tfbnn.predict(model, x_cal); cp.fit(res, y_cal); cp.predict(tfbnn.predict(model, x))

References:
    Vovk, Gammerman, Shafer. Algorithmic Learning in a Random World. Springer 2005.
    Angelopoulos, Bates. Conformal Prediction: A Gentle Introduction. Found. Trends ML 2023.
    Lei, G'Sell, Rinaldo, Tibshirani, Wasserman. Distribution-Free Predictive Inference for
    Regression. JASA 2018.
    Papadopoulos, Proedrou, Vovk, Gammerman. Inductive Confidence Machines for Regression. ECML 2002.
    Romano, Patterson, Candes. Conformalized Quantile Regression. NeurIPS 2019.
    Sadinle, Lei, Wasserman. Least Ambiguous Set-Valued Classifiers with Bounded Error Levels. JASA 2019.
    Romano, Sesia, Candes. Classification with Valid and Adaptive Coverage. NeurIPS 2020.
    Angelopoulos, Bates, Malik, Jordan. Uncertainty Sets for Image Classifiers using Conformal
    Prediction. ICLR 2021.
"""

import math

import numpy as np

from tfbnn._internal import checks

__all__ = ["conformal_quantile", "SplitConformalRegressor", "ConformalizedQuantileRegressor", "AdaptiveConformal",
           "JackknifePlusRegressor",
           "ConformalClassifier", "REGRESSION_SCORES", "CLASSIFICATION_SCORES", "coverage", "set_sizes"]

#: Scores of :class:`SplitConformalRegressor`.
REGRESSION_SCORES = ("absolute", "normalized")
#: Scores of :class:`ConformalClassifier`.
CLASSIFICATION_SCORES = ("lac", "aps", "raps")


def _alpha(alpha):
    return checks.number("alpha", alpha, low=0, high=1, low_open=True, high_open=True,
                         what="a miscoverage level in (0, 1)")


def _vector(name, value, length=None, positive=False, like="the other inputs"):
    """``value`` as a finite float64 vector (a column ``(n, 1)`` is flattened), of ``length`` when given (that
    of the argument ``like``)."""
    v = checks.finite_array(name, value, np.float64)
    if v.ndim == 2 and v.shape[1] == 1:
        v = v[:, 0]
    if v.ndim != 1 or v.shape[0] == 0:
        raise ValueError(f"Expected `{name}` of shape (n,) with n >= 1. Received: {name}.shape={v.shape}")
    if length is not None and v.shape[0] != length:
        raise ValueError(f"Expected `{name}` of length {length}, as {like}. Received: {name}.shape={v.shape}")
    if positive and not np.all(v > 0):
        raise ValueError(f"Expected `{name}` > 0 (standard deviations). Received: min {name}={v.min()!r}")
    return v


def _class_labels(name, value, n, num_classes, rows_of):
    """``value`` as ``(n,)`` integer class labels in ``[0, num_classes)``; else a ValueError naming ``name``."""
    y = checks.array(name, value)
    if y.ndim != 1 or len(y) != n or y.dtype.kind not in "iu" or np.any(y < 0) or np.any(y >= num_classes):
        found = f", min={y.min()}, max={y.max()}" if y.size and y.dtype.kind in "biuf" else ""
        raise ValueError(f"Expected `{name}` of shape ({n},), ints in [0, {num_classes}) (one class per row of "
                         f"`{rows_of}`). "
                         f"Received: {name} of shape {y.shape}, dtype {y.dtype}{found}")
    return y


def _sets(name, value, alternative=""):
    """``value`` as a boolean ``(m, C)`` membership matrix (bools or 0 / 1), m, C >= 1; else a ValueError."""
    sets = checks.array(name, value)
    if sets.ndim != 2 or 0 in sets.shape or not np.all((sets == 0) | (sets == 1)):
        raise ValueError(f"Expected `{name}` to be a boolean (m, C) set matrix with m, C >= 1{alternative}. "
                         f"Received: {name} of shape {sets.shape}, dtype {sets.dtype}")
    return sets.astype(bool)


def conformal_quantile(scores, alpha):
    """The split-conformal quantile of calibration ``scores``: ``s_(k)``, ``k = ceil((n + 1)(1 - alpha))``.

    Args:
        scores: ``(n,)`` finite calibration scores.
        alpha: float in (0, 1), the miscoverage level.

    Returns:
        The ``k``-th smallest score, or ``inf`` when ``k > n`` (``n < 1 / alpha - 1``: no
        finite set has the guarantee).

    Example:
        >>> from tfbnn.conformal import conformal_quantile
        >>> conformal_quantile([3.0, 1.0, 2.0, 5.0, 4.0], alpha=0.4)   # k = ceil(6 * 0.6) = 4
        4.0
        >>> conformal_quantile([1.0, 2.0], alpha=0.1)
        inf
    """
    return _order_statistic(np.sort(_vector("scores", scores)), _alpha(alpha))


def _regression_moments(prediction, std):
    """(mean, std) from a :class:`tfbnn.RegressionPrediction` (its ``total_std``) or from arrays."""
    if hasattr(prediction, "mean") and hasattr(prediction, "total_std"):
        if std is not None:
            raise ValueError("Expected `std` only with an array `mean`: a RegressionPrediction brings its own "
                             f"total_std. Received: std of shape {np.shape(std)}")
        return prediction.mean, prediction.total_std
    return prediction, std


class SplitConformalRegressor:
    """Split conformal intervals ``mu -/+ q_hat`` (``"absolute"``) or ``mu -/+ q_hat sigma`` (``"normalized"``).

    Args:
        alpha: float in (0, 1), the miscoverage level: the intervals cover the target with
            probability at least ``1 - alpha``.
        score: one of :data:`REGRESSION_SCORES`. ``"normalized"`` needs the predictive
            standard deviation (``tfbnn.predict``'s ``total_std``, or ``std=``).

    Attributes:
        quantile: ``q_hat`` after :meth:`fit` (``inf`` when the calibration set is too small), over all
            calibration examples.
        group_quantiles: after a :meth:`fit` with ``groups``: ``{group: q_hat_g}`` (Mondrian conformal:
            coverage ``>= 1 - alpha`` within each group); else None.
        num_calibration: n.

    Shapes: one target per example (``(n,)`` or ``(n, 1)``).

    Example:
        >>> import numpy as np
        >>> from tfbnn.conformal import SplitConformalRegressor
        >>> rng = np.random.default_rng(1)
        >>> sigma = rng.uniform(0.1, 2.0, size=400)
        >>> y = rng.normal(scale=sigma)
        >>> cp = SplitConformalRegressor(alpha=0.2, score="normalized").fit(np.zeros(400), y, std=sigma)
        >>> lower, upper = cp.predict(np.zeros(2), std=np.array([0.1, 2.0]))
        >>> bool(upper[1] - lower[1] > 10 * (upper[0] - lower[0]))   # wide where sigma is large
        True
    """

    def __init__(self, alpha=0.1, score="absolute"):
        self.alpha = _alpha(alpha)
        if score not in REGRESSION_SCORES:
            raise ValueError(f"Expected `score` in {REGRESSION_SCORES}. Received: score={score!r}")
        self.score = score
        self.quantile = None
        self.calibration_scores = None
        self.group_quantiles = None
        self.num_calibration = 0
        self.num_classes = None

    def _scale(self, std, n):
        if self.score == "absolute":
            return np.ones(n)
        if std is None:
            raise ValueError("Expected `std` (the predictive standard deviation) with score='normalized'. "
                             "Received: std=None")
        return _vector("std", std, n, positive=True, like="`mean`")

    def fit(self, mean, y, std=None, groups=None):
        """Computes ``q_hat`` from calibration predictions and targets; returns ``self``.

        Args:
            mean: ``(n,)`` predictive means, or a :class:`tfbnn.RegressionPrediction`.
            y: ``(n,)`` targets.
            std: ``(n,)`` predictive standard deviations (``"normalized"`` with array means).
            groups: ``(n,)`` group labels (ints or strings), or None. Given: Mondrian conformal,
                one quantile per group (:attr:`group_quantiles`); :meth:`predict` then needs the
                test inputs' groups.
        """
        mean, std = _regression_moments(mean, std)
        mu = _vector("mean", mean)
        target = _vector("y", y, len(mu), like="`mean`")
        scores = np.abs(target - mu) / self._scale(std, len(mu))
        self.quantile, self.num_calibration = conformal_quantile(scores, self.alpha), len(mu)
        self.calibration_scores = np.sort(scores)
        self.group_quantiles = None if groups is None else _group_quantiles(scores, _groups(groups, len(mu)),
                                                                            self.alpha)
        return self

    def predict(self, mean, std=None, groups=None):
        """``(lower, upper)``, each ``(m,)``: the conformal intervals of test predictions (with ``groups``, the
        ``(m,)`` groups of the test inputs, when :meth:`fit` had groups)."""
        if self.quantile is None:
            raise ValueError("Expected a fitted SplitConformalRegressor: call fit(mean, y) on calibration data first.")
        mean, std = _regression_moments(mean, std)
        mu = _vector("mean", mean)
        half = _per_group(self.group_quantiles, self.quantile, groups, len(mu)) * self._scale(std, len(mu))
        return mu - half, mu + half


class ConformalizedQuantileRegressor:
    """Conformalized quantile regression (CQR, Romano et al. 2019): ``[lo - q_hat, hi + q_hat]``.

    The score ``max(lo(x) - y, y - hi(x))`` (negative inside the model's band); the band of a
    quantile model (its ``alpha / 2`` and ``1 - alpha / 2`` quantiles) widened or narrowed so
    that it covers with probability at least ``1 - alpha``.

    Args:
        alpha: float in (0, 1), the miscoverage level.

    Example:
        >>> import numpy as np
        >>> from tfbnn.conformal import ConformalizedQuantileRegressor
        >>> y = np.linspace(-1.0, 1.0, 99)
        >>> cqr = ConformalizedQuantileRegressor(alpha=0.1).fit(np.zeros(99), np.zeros(99), y)  # a band of width 0
        >>> lower, upper = cqr.predict([0.0], [0.0])
        >>> round(float(lower[0]), 3), round(float(upper[0]), 3)
        (-0.918, 0.918)

    A model ending in :class:`tfbnn.likelihoods.QuantileHead` plugs in directly:
    ``cqr.fit_model(model, x_cal, y_cal)``, then ``lower, upper = cqr.predict_model(model, x_test)``.
    """

    def __init__(self, alpha=0.1):
        self.alpha = _alpha(alpha)
        self.quantile = None
        self.num_calibration = 0
        self.num_classes = None

    def fit(self, lower, upper, y):
        """Computes ``q_hat`` from the calibration band ``[lower, upper]`` and targets ``y`` (each ``(n,)``)."""
        lo = _vector("lower", lower)
        hi = _vector("upper", upper, len(lo), like="`lower`")
        target = _vector("y", y, len(lo), like="`lower`")
        self.quantile = conformal_quantile(np.maximum(lo - target, target - hi), self.alpha)
        self.num_calibration = len(lo)
        return self

    def predict(self, lower, upper):
        """``(lower - q_hat, upper + q_hat)`` for a test band."""
        if self.quantile is None:
            raise ValueError("Expected a fitted ConformalizedQuantileRegressor: call fit(lower, upper, y) first.")
        lo = _vector("lower", lower)
        hi = _vector("upper", upper, len(lo), like="`lower`")
        return lo - self.quantile, hi + self.quantile

    def fit_model(self, model, x, y, batch_size=None):
        """:meth:`fit` on the band a quantile model (one ending in :class:`tfbnn.likelihoods.QuantileHead`,
        or any model with ``(n, 2)`` outputs ``[lower, upper]``) predicts for calibration inputs ``x``."""
        return self.fit(*_band(model, x, batch_size), y)

    def predict_model(self, model, x, batch_size=None):
        """:meth:`predict` on the band the quantile model predicts for test inputs ``x``."""
        return self.predict(*_band(model, x, batch_size))


def _band(model, x, batch_size):
    """``(lower, upper)`` of a quantile model's ``(n, 2)`` predictions."""
    if not callable(getattr(model, "predict", None)):
        raise ValueError(f"Expected `model` to be a Keras model predicting [lower, upper]. Received: model={model!r}")
    band = checks.finite_array("model outputs", model.predict(x, batch_size=batch_size, verbose=0), np.float64)
    if band.ndim != 2 or band.shape[1] != 2:
        raise ValueError("Expected a quantile model with outputs (n, 2), [lower, upper] (a model ending in "
                         f"tfbnn.likelihoods.QuantileHead). Received: outputs of shape {band.shape}")
    return band[:, 0], band[:, 1]


def _probabilities(prediction, name="probs"):
    """``(n, C)`` class probabilities from a :class:`tfbnn.ClassificationPrediction` or an array."""
    probs = getattr(prediction, "mean_probs", prediction)
    p = checks.finite_array(name, probs, np.float64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] < 2:
        raise ValueError(f"Expected `{name}` of shape (n, C) with n >= 1, C >= 2. Received: {name}.shape={p.shape}")
    if np.any(p < 0) or not np.allclose(p.sum(axis=1), 1.0, atol=1e-4):
        raise ValueError(f"Expected `{name}` to hold probabilities (non-negative rows that sum to 1). "
                         f"Received: row sums from {p.sum(axis=1).min():.4g} to {p.sum(axis=1).max():.4g}")
    return p


class ConformalClassifier:
    """Conformal prediction sets for a classifier's predictive: LAC, APS or RAPS.

    Args:
        alpha: float in (0, 1), the miscoverage level.
        score: one of :data:`CLASSIFICATION_SCORES`.
        lam: float >= 0, RAPS' penalty per class beyond ``k_reg`` (Angelopoulos et al. 2021
            use 0.01 to 0.1 on ImageNet). Default 0.01.
        k_reg: int >= 0, RAPS' number of classes free of the penalty. Default 1.
        randomized: bool, APS and RAPS with the tie-breaking uniform (the default, coverage
            ``1 - alpha`` on both sides) or without (``u = 1``: coverage at least ``1 - alpha``).
            LAC has nothing to randomize.
        allow_empty: bool, whether a randomized set may be empty (default True, the exact
            guarantee); False adds the top class to an empty set.
        seed: int in ``[0, 2^31)``, the seed of the uniforms: :meth:`fit` draws its ``n`` from
            ``(seed, 0)``, every :meth:`predict` its ``m`` from ``(seed, 1)``, so the same inputs
            give the same sets.
        class_conditional: bool, Mondrian conformal by class: one quantile per class from the
            calibration examples of that class (coverage ``>= 1 - alpha`` for every class, larger
            sets). Default False.

    Attributes:
        quantile: ``q_hat`` after :meth:`fit` (over all calibration examples).
        class_quantiles: ``(C,)`` per-class ``q_hat_c`` after :meth:`fit` with ``class_conditional``
            (``inf`` for a class with fewer than ``1 / alpha - 1`` calibration examples); else None.
        num_classes: ``C`` after :meth:`fit`; :meth:`predict` refuses probabilities over other classes.

    Shapes: ``probs`` ``(n, C)``; labels ``(n,)`` ints in ``[0, C)``; :meth:`predict` gives
    a boolean ``(m, C)`` membership matrix.

    Example:
        >>> import numpy as np
        >>> from tfbnn.conformal import ConformalClassifier
        >>> probs = np.array([[0.7, 0.2, 0.1]] * 20)
        >>> labels = np.array([0] * 14 + [1] * 4 + [2] * 2)
        >>> cc = ConformalClassifier(alpha=0.2, score="lac").fit(probs, labels)
        >>> cc.predict(probs[:1]).astype(int).tolist()   # 0 alone covers 70%: {0, 1} covers 90% >= 80%
        [[1, 1, 0]]
    """

    def __init__(self, alpha=0.1, score="aps", lam=0.01, k_reg=1, randomized=True, allow_empty=True, seed=0,
                 class_conditional=False):
        self.alpha = _alpha(alpha)
        if score not in CLASSIFICATION_SCORES:
            raise ValueError(f"Expected `score` in {CLASSIFICATION_SCORES}. Received: score={score!r}")
        self.score = score
        self.lam = checks.number("lam", lam, low=0)
        self.k_reg = checks.integer("k_reg", k_reg, 0)
        for name, value in (("randomized", randomized), ("allow_empty", allow_empty),
                            ("class_conditional", class_conditional)):
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"Expected `{name}` to be True or False. Received: {name}={value!r}")
        self.randomized = bool(randomized)
        self.allow_empty = bool(allow_empty)
        self.class_conditional = bool(class_conditional)
        self.class_quantiles = None
        self.calibration_scores = None
        self.seed = checks.numpy_seed(seed, allow_none=False)
        self.quantile = None
        self.num_calibration = 0
        self.num_classes = None

    def _uniforms(self, n, *stream):
        """``(n, 1)`` uniforms of stream 0 (calibration), 1 (test) or (2, call) (an ACI stream), or ones for the
        non-randomized rule."""
        if not self.randomized or self.score == "lac":
            return np.ones((n, 1))
        return np.random.default_rng([self.seed, *stream]).uniform(size=(n, 1))

    def scores(self, probs, u=None):
        """``(n, C)``: the score of every class of every example (lower: more conforming).

        Args:
            probs: ``(n, C)`` probabilities or a :class:`tfbnn.ClassificationPrediction`.
            u: ``(n,)`` uniforms in ``[0, 1]`` of the randomized APS / RAPS (one per example); None:
                ``u = 1``, the non-randomized scores.
        """
        p = _probabilities(probs)
        if self.score == "lac":
            return 1.0 - p
        u = np.ones((len(p), 1)) if u is None else np.reshape(_vector("u", u, len(p), like="`probs` rows"), (-1, 1))
        order = np.argsort(-p, axis=1, kind="stable")
        ranked = np.take_along_axis(p, order, axis=1)
        mass = np.cumsum(ranked, axis=1) - (1.0 - u) * ranked  # mass ranked above, plus u times its own
        if self.score == "raps":
            ranks = np.arange(1, p.shape[1] + 1)
            mass = mass + self.lam * np.maximum(0, ranks - self.k_reg)
        out = np.empty_like(mass)
        np.put_along_axis(out, order, mass, axis=1)
        return out

    def fit(self, probs, labels):
        """Computes ``q_hat`` from calibration probabilities (or a ClassificationPrediction) and labels."""
        p = _probabilities(probs)
        s = self.scores(p, self._uniforms(len(p), 0))
        y = _class_labels("labels", labels, len(s), s.shape[1], "probs")
        true = s[np.arange(len(y)), y]
        self.quantile = conformal_quantile(true, self.alpha)
        self.calibration_scores = np.sort(true)
        if self.class_conditional:
            per_class = _group_quantiles(true, y, self.alpha)
            self.class_quantiles = np.array([per_class.get(c, np.inf) for c in range(s.shape[1])])
        self.num_calibration = len(y)
        self.num_classes = s.shape[1]
        return self

    def predict(self, probs):
        """Boolean ``(m, C)``: class ``c`` is in the set of example ``i`` when its score is at most ``q_hat``
        (``q_hat_c`` with ``class_conditional``)."""
        if self.quantile is None:
            raise ValueError("Expected a fitted ConformalClassifier: call fit(probs, labels) first.")
        p = _probabilities(probs)
        if p.shape[1] != self.num_classes:
            raise ValueError(f"Expected `probs` over the {self.num_classes} classes the sets were calibrated on. "
                             f"Received: probs.shape={p.shape}")
        threshold = self.class_quantiles[None, :] if self.class_conditional else self.quantile
        sets = self.scores(p, self._uniforms(len(p), 1)) <= threshold
        if self.randomized and not self.allow_empty and self.score != "lac":
            sets[np.arange(len(p)), p.argmax(axis=1)] = True
        return sets


def _groups(value, n, name="groups"):
    """``value`` as ``(n,)`` group labels (ints, bools or strings); else a ValueError naming ``name``."""
    try:
        g = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged
        raise ValueError(f"Expected `{name}` to be an array of group labels. Received: {name} of type "
                         f"{type(value).__name__} ({e})") from None
    if g.ndim != 1 or len(g) != n or g.dtype.kind not in "biuUS":
        raise ValueError(f"Expected `{name}` of shape ({n},) holding group labels (ints or strings), one per row of "
                         f"`mean`. Received: {name} of shape {g.shape}, dtype {g.dtype}")
    return g


def _group_quantiles(scores, groups, alpha):
    """``{group: q_hat_g}``: the conformal quantile of each group's scores (Mondrian conformal)."""
    return {g.item(): conformal_quantile(scores[groups == g], alpha) for g in np.unique(groups)}


def _per_group(quantiles, quantile, groups, m):
    """``(m,)`` thresholds: ``quantile`` for every row without groups, else each row's group's quantile."""
    if quantiles is None:
        if groups is not None:
            raise ValueError("Expected `groups` only when fit() was given groups (Mondrian conformal). Received: "
                             "groups for a regressor calibrated without them")
        return np.full(m, quantile)
    if groups is None:
        raise ValueError("Expected `groups` (the test inputs' groups): fit() was given groups. Received: groups=None")
    g = _groups(groups, m)
    unseen = sorted({v.item() for v in np.unique(g)} - set(quantiles))
    if unseen:
        raise ValueError(f"Expected `groups` among the calibration groups {sorted(quantiles)}. "
                         f"Received: groups without calibration examples: {unseen}")
    return np.array([quantiles[v.item()] for v in g])


def _order_statistic(sorted_scores, level):
    """The split-conformal threshold of ``sorted_scores`` at miscoverage ``level`` (any real): the ``k``-th smallest,
    ``k = ceil((n + 1)(1 - level))``; ``inf`` when ``k > n`` (``level <= 1 / (n + 1)``: every label),
    ``-inf`` when ``k < 1`` (``level >= 1``: the empty set)."""
    n = len(sorted_scores)
    k = math.ceil((n + 1) * (1 - level) - 1e-12)  # (guard against (n + 1)(1 - alpha) = 9.000001)
    return float("inf") if k > n else float("-inf") if k < 1 else float(sorted_scores[k - 1])


class AdaptiveConformal:
    """Adaptive conformal inference (ACI, Gibbs & Candes 2021) over a stream whose distribution drifts.

    Split conformal covers exchangeable test inputs; on a stream that drifts away from the
    calibration data (a sensor ageing, corrupted inputs) its coverage breaks. ACI keeps a
    running miscoverage level ``alpha_t`` and, after each input's label is revealed, moves it by
    the error made (Gibbs & Candes 2021, eq. 2):

        C_t = the split-conformal set (or interval) at level alpha_t,
        err_t = 1 if y_t not in C_t else 0,     alpha_{t+1} = alpha_t + gamma (alpha - err_t).

    Whatever the stream (even adversarial), the long-run miscoverage is within a deterministic
    bound of ``alpha`` (Gibbs & Candes 2021, Proposition 4.1): for every ``T``,

        | (1 / T) sum_{t <= T} err_t - alpha |  <=  (max(alpha_1, 1 - alpha_1) + gamma) / (gamma T).

    The set at level ``alpha_t`` is the split-conformal one with the calibration scores of
    ``predictor``: the ``k``-th smallest score, ``k = ceil((n + 1)(1 - alpha_t))`` (every label
    when ``alpha_t <= 1 / (n + 1)``, the empty set when ``alpha_t >= 1``).

    Args:
        predictor: a fitted :class:`ConformalClassifier` or :class:`SplitConformalRegressor` (marginal:
            not class-conditional or grouped); its ``alpha`` is the target and ``alpha_1``.
        gamma: float > 0, the step size. Default 0.005 (Gibbs & Candes 2021 use 0.005 on stock and
            election data; larger adapts faster and oscillates more).

    Attributes:
        alpha_t: the current level (the next input's).
        alphas: ``(T,)`` the level each input of the stream was predicted at, so far.
        errors: ``(T,)`` bool, whether each input's label fell outside its set.

    Example:
        >>> import numpy as np
        >>> from tfbnn.conformal import AdaptiveConformal, SplitConformalRegressor
        >>> rng = np.random.default_rng(0)
        >>> cp = SplitConformalRegressor(alpha=0.1).fit(np.zeros(200), rng.normal(size=200))
        >>> stream = rng.normal(scale=np.linspace(1, 3, 2000))       # the noise grows: a drift
        >>> aci = AdaptiveConformal(cp, gamma=0.01)
        >>> lower, upper = aci.run(np.zeros(2000), stream)
        >>> split_lower, split_upper = cp.predict(np.zeros(2000))        # split conformal: one fixed interval
        >>> split_miss = np.mean((stream < split_lower) | (stream > split_upper))
        >>> round(float(np.mean(aci.errors)), 2), round(float(split_miss), 2)   # long-run miscoverage, alpha = 0.1
        (0.1, 0.42)

    References:
        Gibbs, Candes. Adaptive Conformal Inference Under Distribution Shift. NeurIPS 2021.
    """

    def __init__(self, predictor, gamma=0.005):
        if not isinstance(predictor, (ConformalClassifier, SplitConformalRegressor)) or \
                getattr(predictor, "calibration_scores", None) is None:
            raise ValueError("Expected `predictor` to be a fitted ConformalClassifier or SplitConformalRegressor. "
                             f"Received: predictor={predictor!r}")
        if getattr(predictor, "class_conditional", False) or getattr(predictor, "group_quantiles", None) is not None:
            raise ValueError("Expected `predictor` calibrated marginally: ACI adapts one level, not one per class or "
                             "group. Received: a class-conditional or grouped predictor")
        self.predictor = predictor
        self.gamma = checks.number("gamma", gamma, low=0, low_open=True)
        self.alpha = predictor.alpha
        self.reset()

    def reset(self):
        """Starts a new stream at ``alpha_1 = alpha``."""
        self.alpha_t = self.alpha
        self.alphas = np.zeros(0)
        self.errors = np.zeros(0, bool)
        self._calls = 0
        return self

    def bound(self):
        """The deterministic bound on ``|mean(errors) - alpha|`` after the stream so far (Proposition 4.1)."""
        return (max(self.alpha, 1 - self.alpha) + self.gamma) / (self.gamma * max(len(self.errors), 1))

    def run(self, prediction, y, std=None):
        """Predicts each input of a stream in order, updating the level with each label as it is revealed.

        Args:
            prediction: a classifier's ``(m, C)`` probabilities (or ClassificationPrediction), or a
                regressor's ``(m,)`` means (or RegressionPrediction), in the stream's order.
            y: ``(m,)`` the labels or targets, each revealed after its input's prediction.
            std: ``(m,)`` predictive standard deviations (a ``"normalized"`` regressor with array means).

        Returns:
            The sets, boolean ``(m, C)``, or the intervals ``(lower, upper)``, each made at its ``alpha_t``
            (in :attr:`alphas`); the stream continues across calls until :meth:`reset`.
        """
        cp = self.predictor
        if isinstance(cp, ConformalClassifier):
            p = _probabilities(prediction, "prediction")
            if p.shape[1] != cp.num_classes:
                raise ValueError(f"Expected `prediction` over the {cp.num_classes} classes the sets were calibrated "
                                 f"on. Received: prediction.shape={p.shape}")
            labels = _class_labels("y", y, len(p), p.shape[1], "prediction")
            scores = cp.scores(p, cp._uniforms(len(p), 2, self._calls))
            true, width = scores[np.arange(len(p)), labels], None
        else:
            mean, std = _regression_moments(prediction, std)
            mu = _vector("prediction", mean)
            target = _vector("y", y, len(mu), like="`prediction`")
            width = cp._scale(std, len(mu))
            true, scores = np.abs(target - mu) / width, None
        self._calls += 1
        thresholds, errors = np.empty(len(true)), np.empty(len(true), bool)
        alphas = np.empty(len(true))
        for t, s in enumerate(true):  # the label of input t is revealed after its set is made
            alphas[t] = self.alpha_t
            thresholds[t] = _order_statistic(cp.calibration_scores, self.alpha_t)
            errors[t] = s > thresholds[t]
            self.alpha_t += self.gamma * (self.alpha - errors[t])
        self.alphas, self.errors = np.r_[self.alphas, alphas], np.r_[self.errors, errors]
        if scores is not None:
            return scores <= thresholds[:, None]
        return mu - thresholds * width, mu + thresholds * width


def _rows(x):
    """``x`` as an array of ``n >= 1`` rows; else a ValueError naming ``x``."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:  # ragged
        raise ValueError(f"Expected `x` to be an array of inputs, one per row. Received: x of type "
                         f"{type(x).__name__} ({e})") from None
    if a.ndim == 0 or len(a) == 0 or a.dtype == object:
        raise ValueError(f"Expected `x` to be an array of n >= 1 inputs, one per row. Received: x of shape {a.shape}, "
                         f"dtype {a.dtype}")
    return a


class JackknifePlusRegressor:
    """Jackknife+ and CV+ intervals (Barber et al. 2021): conformal without giving up a calibration split.

    For small data sets where holding out a calibration split wastes data: every example is
    predicted by a model trained without it. With ``folds=None`` (jackknife+) the model is refit
    ``n`` times, leaving out one example each; with ``folds=K`` (CV+) ``K`` times, leaving out one
    fold. With ``mu_{-i}`` the model that did not see example ``i`` and ``R_i = |y_i - mu_{-i}(x_i)|``,
    the interval of a test input ``x`` is (Barber et al. 2021, eq. 3 and 7)

        [ q-_alpha{ mu_{-i}(x) - R_i },  q+_alpha{ mu_{-i}(x) + R_i } ],

    ``q+`` the ``ceil((1 - alpha)(n + 1))``-th smallest of the ``n`` values, ``q-`` the
    ``floor(alpha (n + 1))``-th smallest (``-inf`` / ``inf`` past the ends). Coverage, for any
    regression algorithm that treats its training examples symmetrically: at least
    ``1 - 2 alpha`` for jackknife+ (Theorem 1), at least
    ``1 - 2 alpha - min(2 (1 - 1/K) / (n/K + 1), (1 - K/n) / (K + 1))`` for CV+ (Theorem 4); in
    practice close to ``1 - alpha``.

    Args:
        alpha: float in (0, 1), the miscoverage level.
        folds: None (jackknife+, ``n`` fits) or an int in ``[2, n]`` (CV+, ``K`` fits).
        seed: int in ``[0, 2^31)``, the seed of CV+'s assignment of examples to folds.

    Attributes (after :meth:`fit`): ``residuals`` ``(n,)`` the ``R_i``; ``fold_of`` ``(n,)`` each
    example's fold; ``predictors``, one per fold.

    Example:
        >>> import numpy as np
        >>> from tfbnn.conformal import JackknifePlusRegressor
        >>> rng = np.random.default_rng(0)
        >>> x = rng.uniform(-1, 1, size=(40, 1)); y = 2 * x[:, 0] + rng.normal(scale=0.3, size=40)
        >>> def fit_predict(x_train, y_train):   # least squares; any model works (a Keras fit, ...)
        ...     w = np.linalg.lstsq(np.c_[x_train, np.ones(len(x_train))], y_train, rcond=None)[0]
        ...     return lambda x_new: np.c_[x_new, np.ones(len(x_new))] @ w
        >>> jp = JackknifePlusRegressor(alpha=0.1).fit(x, y, fit_predict)
        >>> lower, upper = jp.predict(np.array([[0.0]]))
        >>> bool(lower[0] < 0 < upper[0]), round(float(upper[0] - lower[0]), 1)
        (True, 1.0)

    References:
        Barber, Candes, Ramdas, Tibshirani. Predictive Inference with the Jackknife+. Ann. Statist. 2021.
    """

    def __init__(self, alpha=0.1, folds=None, seed=0):
        self.alpha = _alpha(alpha)
        self.folds = checks.integer("folds", folds, 2, what="an int >= 2 (CV+) or None (jackknife+)",
                                    allow_none=True)
        self.seed = checks.numpy_seed(seed, allow_none=False)
        self.residuals = self.fold_of = self.predictors = None

    def fit(self, x, y, fit_predict):
        """Fits one model per left-out example (or fold) and stores the out-of-fold residuals; returns ``self``.

        Args:
            x: ``(n, ...)`` inputs (anything ``fit_predict`` takes, indexable by rows).
            y: ``(n,)`` targets.
            fit_predict: ``fit_predict(x_train, y_train)`` trains a model and returns a function
                ``predict(x) -> (m,)`` of its point predictions.
        """
        if not callable(fit_predict):
            raise ValueError(f"Expected `fit_predict` to be a function (x_train, y_train) -> predict. Received: "
                             f"fit_predict={fit_predict!r}")
        target = _vector("y", y)
        n = len(target)
        x = _rows(x)
        if len(x) != n:
            raise ValueError(f"Expected `x` with one row per target in `y` ({n}). Received: {len(x)} rows of x, "
                             f"y of length {n}")
        k = n if self.folds is None else self.folds
        if k > n:
            raise ValueError(f"Expected `folds` <= the {n} examples. Received: folds={self.folds}")
        order = np.arange(n) if self.folds is None else np.random.default_rng(self.seed).permutation(n)
        self.fold_of = np.empty(n, int)
        for j, part in enumerate(np.array_split(order, k)):
            self.fold_of[part] = j
        self.predictors, self.residuals = [], np.empty(n)
        for j in range(k):
            held = self.fold_of == j
            predict = fit_predict(x[~held], target[~held])
            self.predictors.append(predict)
            self.residuals[held] = np.abs(target[held] - _vector("the predictions", predict(x[held]), int(held.sum()),
                                                                 like="the rows given to the predict function"))
        return self

    def predict(self, x):
        """``(lower, upper)``, each ``(m,)``: the jackknife+ / CV+ intervals of the inputs ``x``."""
        if self.predictors is None:
            raise ValueError("Expected a fitted JackknifePlusRegressor: call fit(x, y, fit_predict) first.")
        x = _rows(x)
        by_fold = np.stack([_vector("the predictions", predict(x), len(x), like="`x`")
                            for predict in self.predictors])  # (k, m)
        mu = by_fold[self.fold_of]  # (n, m): mu_{-i}(x)
        n = len(self.residuals)
        hi_k = math.ceil((1 - self.alpha) * (n + 1) - 1e-12)
        lo_k = math.floor(self.alpha * (n + 1) + 1e-12)
        upper = np.full(mu.shape[1], np.inf) if hi_k > n else \
            np.sort(mu + self.residuals[:, None], axis=0)[hi_k - 1]
        lower = np.full(mu.shape[1], -np.inf) if lo_k < 1 else \
            np.sort(mu - self.residuals[:, None], axis=0)[lo_k - 1]
        return lower, upper


def coverage(y, lower_or_sets, upper=None):
    """The fraction of examples whose target is in its interval ``[lower, upper]`` or its set.

    Args:
        y: ``(m,)`` targets (regression) or int labels (classification).
        lower_or_sets: ``(m,)`` lower ends, or a boolean ``(m, C)`` set matrix.
        upper: ``(m,)`` upper ends (regression only).

    Example:
        >>> from tfbnn.conformal import coverage
        >>> coverage([0.0, 2.0], [-1.0, -1.0], [1.0, 1.0])
        0.5
        >>> coverage([1, 0], [[False, True], [False, True]])
        0.5
    """
    if upper is None:
        sets = _sets("lower_or_sets", lower_or_sets, " (or the lower ends, with `upper`)")
        labels = _class_labels("y", y, len(sets), sets.shape[1], "lower_or_sets")
        return float(np.mean(sets.astype(bool)[np.arange(len(labels)), labels]))
    target = _vector("y", y)
    lo = _vector("lower_or_sets", lower_or_sets, len(target), like="`y`")
    hi = _vector("upper", upper, len(target), like="`y`")
    return float(np.mean((lo <= target) & (target <= hi)))


def set_sizes(sets):
    """``(m,)`` ints: the number of classes in each prediction set."""
    return _sets("sets", sets).sum(axis=1)
