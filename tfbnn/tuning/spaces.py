"""Search spaces of the tfbnn searches, their value checks, objectives, KL schedules, the split.

A space declares its hyperparameters on a ``keras_tuner.HyperParameters`` (every
one a ``Choice``, so a grid search enumerates them) and says what one set of values
means: :class:`BlundellPriorSpace` (the scale-mixture prior grid of Blundell et al.
2015) and :class:`IBNNSpace` (node-based iBNNs, Trinh et al. 2022).

The checks (:func:`is_number`, :func:`is_positive`, :func:`is_positive_int`,
:func:`check_values`, :func:`check_validation_split`) raise tfbnn's
"Expected ... Received: name=value" errors; the other modules of
:mod:`tfbnn.tuning` use them for their own arguments.
"""

import itertools
import math

import keras_tuner
import numpy as np

from tfbnn import priors as priors_lib
from tfbnn.training.recipe import KL_SCHEDULES
from tfbnn.training import kl_schedule

__all__ = [
    "BLUNDELL_PI",
    "BLUNDELL_NEG_LOG_SIGMA1",
    "BLUNDELL_NEG_LOG_SIGMA2",
    "OBJECTIVES",
    "SCHEDULE_NAMES",
    "BlundellPriorSpace",
    "IBNNSpace",
    "get_objective",
    "make_schedule",
    "split_validation",
    "check_validation_split",
    "check_values",
    "is_number",
    "is_positive",
    "is_positive_int",
]

#: Blundell et al. (2015), sec. 5.1: the scale-mixture prior grid.
BLUNDELL_PI = (0.25, 0.5, 0.75)
BLUNDELL_NEG_LOG_SIGMA1 = (0.0, 1.0, 2.0)
BLUNDELL_NEG_LOG_SIGMA2 = (6.0, 7.0, 8.0)

#: Objective name -> direction. ``val_nll`` needs the ``nll`` metric every tfbnn
#: HyperModel compiles; ``val_loss`` includes ``beta * KL / N``.
OBJECTIVES = {"val_accuracy": "max", "val_nll": "min", "val_loss": "min"}

#: The KL schedules :func:`make_schedule` knows.
SCHEDULE_NAMES = KL_SCHEDULES


# -- argument checks -----------------------------------------------------------


def is_number(value):
    """Whether ``value`` is a real number (Python or NumPy, not a bool)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def check_values(name, values, check, what):
    """A non-empty tuple of distinct values, each passing ``check``; else a ValueError."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        values = (values,)
    values = tuple(values)
    if not values:
        raise ValueError(f"Expected at least one value for `{name}`. Received: {name}={values!r}")
    for value in values:
        if not check(value):
            raise ValueError(f"Expected every value of `{name}` to be {what}. Received: {name}={value!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"Expected distinct values for `{name}`. Received: {name}={values!r}")
    return values


def _open_unit(value):
    return is_number(value) and 0.0 < value < 1.0


def _finite(value):
    return is_number(value) and math.isfinite(value)


def is_positive(value):
    """Whether ``value`` is a finite number > 0."""
    return _finite(value) and value > 0


def is_positive_int(value):
    """Whether ``value`` is an integer > 0 (Python or NumPy, not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _floats(name, values, check, what):
    return tuple(float(v) for v in check_values(name, values, check, what))


def _neg_log_sigmas(name, neg_log, sigma, default):
    """``-log sigma`` values, from either parameterization (not both)."""
    if sigma is not None:
        if neg_log is not None:
            raise ValueError(
                f"Expected either `neg_log_{name}` or `{name}`, not both. "
                f"Received: neg_log_{name}={neg_log!r}, {name}={sigma!r}"
            )
        sigmas = _floats(name, sigma, is_positive, "a positive finite number")
        return tuple(-math.log(s) for s in sigmas)
    if neg_log is None:
        return default
    return _floats(f"neg_log_{name}", neg_log, _finite, "a finite number (sigma = exp(-value) > 0)")


def get_objective(objective):
    """A ``keras_tuner.Objective`` from a name in :data:`OBJECTIVES` (or an Objective)."""
    if isinstance(objective, keras_tuner.Objective):
        return objective
    if objective not in OBJECTIVES:
        raise ValueError(f"Unknown objective. Expected one of {list(OBJECTIVES)}. Received: objective={objective!r}")
    return keras_tuner.Objective(objective, direction=OBJECTIVES[objective])


def make_schedule(name, epochs):
    """The KL schedule ``name`` over a run of ``epochs``: ramps last half the run.

    ``constant`` is beta = 1 (the plain ELBO); ``linear``, ``cosine`` ramp 0 -> 1
    over ``epochs / 2``; ``warmup`` is 0 for ``epochs / 4`` then linear over
    ``epochs / 4``; ``cyclic`` repeats a ramp every ``epochs / 4``; ``blundell`` is
    Blundell's per-minibatch weighting (eq. 9). As ``tfbnn train`` does.
    """
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"Unknown KL schedule. Expected one of {list(SCHEDULE_NAMES)}. Received: schedule={name!r}")
    return kl_schedule(name, max(epochs / 2.0, 1e-3))


# -- search spaces ---------------------------------------------------------------


class _Space:
    """What every space does with its ``dimensions()`` (``{hyperparameter name: values}``)."""

    def declare(self, hp):
        """Declares the hyperparameters on ``hp``; returns this trial's values."""
        return {name: hp.Choice(name, list(values)) for name, values in self.dimensions().items()}

    @property
    def size(self):
        """The number of grid combinations."""
        return math.prod(len(v) for v in self.dimensions().values())

    def grid(self):
        """Every combination as a dict, in the order a grid search visits them."""
        dims = self.dimensions()
        return [dict(zip(dims, combo)) for combo in itertools.product(*dims.values())]

    def get_config(self):
        return {name: list(values) for name, values in self.dimensions().items()}


class BlundellPriorSpace(_Space):
    """The scale-mixture prior grid of Blundell et al. (2015), sec. 5.1, and optional extras.

    The prior of every weight is ``pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2)``
    (eq. 7) with ``sigma1 = exp(-neg_log_sigma1)``, ``sigma2 = exp(-neg_log_sigma2)``.
    The defaults are the paper's grid: ``pi`` in {1/4, 1/2, 3/4}, ``-log sigma1``
    in {0, 1, 2}, ``-log sigma2`` in {6, 7, 8}: 27 combinations. The paper does not
    name its best point; the library's default prior ``(1/4, 1, e^-8 = 3.35e-4)``, i.e.
    ``-log sigma1 = 0``, ``-log sigma2 = 8``, is the best point of the seed study's rerun.

    Hyperparameter names: ``pi``, ``neg_log_sigma1``, ``neg_log_sigma2`` and, when
    given, ``learning_rate``, ``hidden_units``, ``schedule`` (each a ``Choice``, so
    a grid search enumerates them; the last one declared varies fastest).

    Args:
        pi: values of the mixture weight, each in (0, 1).
        neg_log_sigma1: values of ``-log sigma1`` (finite numbers).
        neg_log_sigma2: values of ``-log sigma2``.
        sigma1, sigma2: the scales themselves (positive), instead of
            ``neg_log_sigma1`` / ``neg_log_sigma2``.
        learning_rate: None (not tuned: the HyperModel's value) or positive values.
        hidden_units: None or positive integers (units of every hidden layer).
        schedule: None or KL schedule names (see :func:`make_schedule`).

    Raises:
        ValueError: an empty or repeated value list, or a value out of range
            ("Expected ... Received: name=value").

    Example:
        >>> space = BlundellPriorSpace()
        >>> space.size, space.grid()[0]
        (27, {'pi': 0.25, 'neg_log_sigma1': 0.0, 'neg_log_sigma2': 6.0})
    """

    name = "blundell_prior"

    def __init__(
        self,
        pi=BLUNDELL_PI,
        neg_log_sigma1=None,
        neg_log_sigma2=None,
        sigma1=None,
        sigma2=None,
        learning_rate=None,
        hidden_units=None,
        schedule=None,
    ):
        self.pi = _floats("pi", pi, _open_unit, "in the open interval (0, 1)")
        self.neg_log_sigma1 = _neg_log_sigmas("sigma1", neg_log_sigma1, sigma1, BLUNDELL_NEG_LOG_SIGMA1)
        self.neg_log_sigma2 = _neg_log_sigmas("sigma2", neg_log_sigma2, sigma2, BLUNDELL_NEG_LOG_SIGMA2)
        self.learning_rate = None if learning_rate is None else _floats(
            "learning_rate", learning_rate, is_positive, "a positive finite number"
        )
        self.hidden_units = None if hidden_units is None else tuple(
            int(v) for v in check_values("hidden_units", hidden_units, is_positive_int, "a positive integer")
        )
        self.schedule = None if schedule is None else check_values(
            "schedule", schedule, lambda s: s in SCHEDULE_NAMES, f"one of {list(SCHEDULE_NAMES)}"
        )

    def dimensions(self):
        """``{hyperparameter name: values}`` in declaration order (tuned ones only)."""
        dims = {"pi": self.pi, "neg_log_sigma1": self.neg_log_sigma1, "neg_log_sigma2": self.neg_log_sigma2}
        for name in ("learning_rate", "hidden_units", "schedule"):
            if getattr(self, name) is not None:
                dims[name] = getattr(self, name)
        return dims

    @staticmethod
    def prior(values):
        """The :class:`tfbnn.priors.ScaleMixture` of one set of values."""
        return priors_lib.ScaleMixture(
            pi=values["pi"],
            sigma1=math.exp(-values["neg_log_sigma1"]),
            sigma2=math.exp(-values["neg_log_sigma2"]),
        )

    def __repr__(self):
        args = ", ".join(f"{k}={tuple(v)}" for k, v in self.get_config().items())
        return f"BlundellPriorSpace({args})"


class IBNNSpace(_Space):
    """Search space of node-based iBNNs (Trinh et al. 2022), :class:`tfbnn.layers.NodeDense`.

    iBNNs keep point-estimate weights and put a variational posterior on
    multiplicative noise ``z`` of the input nodes of every layer: a mixture of ``K``
    Gaussians whose means start at ``N(1, sigma0^2)``, under the prior ``N(1, s^2)``;
    the variational parameters have their own (constant) learning rate.

    Hyperparameter names (= the ``NodeDense`` arguments): ``num_components`` (K),
    ``init_stddev`` (sigma0), ``prior_stddev`` (s), ``variational_learning_rate``.

    The defaults bracket the layer's and the authors' settings (K = 4, sigma0 = 0.5,
    s = 0.1 in NodeDense, s = 0.5 in the authors' code, a variational rate 10x the
    weights'): a starting grid, not the paper's tuned values.

    Args:
        num_components: positive integers, K.
        init_stddev: positive numbers, sigma0.
        prior_stddev: positive numbers, s.
        variational_learning_rate: positive numbers.
    """

    name = "ibnn"

    def __init__(
        self,
        num_components=(1, 2, 4),
        init_stddev=(0.1, 0.25, 0.5),
        prior_stddev=(0.05, 0.1, 0.25, 0.5),
        variational_learning_rate=(1e-3, 1e-2, 1e-1),
    ):
        self.num_components = tuple(
            int(v) for v in check_values("num_components", num_components, is_positive_int, "a positive integer")
        )
        self.init_stddev = _floats("init_stddev", init_stddev, is_positive, "a positive finite number")
        self.prior_stddev = _floats("prior_stddev", prior_stddev, is_positive, "a positive finite number")
        self.variational_learning_rate = _floats(
            "variational_learning_rate", variational_learning_rate, is_positive, "a positive finite number"
        )

    def dimensions(self):
        return {
            "num_components": self.num_components,
            "init_stddev": self.init_stddev,
            "prior_stddev": self.prior_stddev,
            "variational_learning_rate": self.variational_learning_rate,
        }


# -- the validation split ------------------------------------------------------------


def check_validation_split(validation_split):
    """``validation_split`` as a float in the open interval (0, 1); else a ValueError."""
    if not (is_number(validation_split) and 0.0 < validation_split < 1.0):
        raise ValueError(
            f"Expected `validation_split` in the open interval (0, 1). Received: validation_split={validation_split!r}"
        )
    return float(validation_split)


def split_validation(x, y, validation_split):
    """Keras' ``validation_split`` rule: the last ``validation_split`` of the examples validates.

    Returns ``(x_train, y_train), (x_val, y_val)`` with
    ``len(x_train) = floor(n * (1 - validation_split))``, as ``model.fit`` splits.
    """
    check_validation_split(validation_split)
    n = len(x)
    split_at = int(math.floor(n * (1.0 - validation_split)))
    if split_at < 1 or split_at >= n:
        raise ValueError(
            f"A validation split of {validation_split} leaves {split_at} training and {n - split_at} "
            f"validation examples of {n}; both need at least one. Received: validation_split={validation_split}"
        )
    return (x[:split_at], y[:split_at]), (x[split_at:], y[split_at:])
