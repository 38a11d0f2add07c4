"""KerasTuner HyperModels and search spaces for tfbnn models.

A search is a search space (which hyperparameters, which values), a HyperModel
(builds and fits a tfbnn model for one set of values) and a KerasTuner tuner.

=========================  =================================================  ===========
search (:data:`SEARCHES`)  space                                              tuner
=========================  =================================================  ===========
``blundell-prior-grid``    :class:`BlundellPriorSpace`: the scale-mixture     GridSearch
                           prior grid of Blundell et al. (2015), sec. 5.1:
                           ``pi`` in {1/4, 1/2, 3/4}, ``-log sigma1`` in
                           {0, 1, 2}, ``-log sigma2`` in {6, 7, 8} (27
                           combinations), optionally x learning rate, width,
                           KL schedule
``ibnn-random``            :class:`IBNNSpace`: node-based iBNN (Trinh et al.  RandomSearch
                           2022, :class:`tfbnn.layers.NodeDense`): ``K``,
                           ``sigma0``, prior ``s``, variational learning rate
=========================  =================================================  ===========

Each trial trains for a fixed number of epochs on a training split and is
scored on a held-out validation split (never the test set). The objective is
``"val_accuracy"`` (max), ``"val_nll"`` (min: the validation negative
log-likelihood alone, a ``SparseCategoricalCrossentropy`` metric named ``nll``)
or ``"val_loss"`` (min: the NLL *plus* ``beta * KL / N``, so it also rewards a
prior close to the posterior). Validation metrics come from one posterior
sample per example, as Keras' ``fit`` evaluates a sampling model.

The ELBO's ``N`` is the size of the training split actually used: with
``validation_split = f`` the first ``floor(n (1 - f))`` examples train (Keras'
own split rule) and :class:`tfbnn.KLAnnealing` gets exactly that count.

Example (the 27-trial prior grid on the bundled digits)::

    ds = tfbnn.datasets.load("digits")
    hypermodel = tfbnn.tuning.BayesianMLPHyperModel(ds.input_shape, ds.num_classes,
                                                    space=tfbnn.tuning.BlundellPriorSpace())
    tuner = tfbnn.tuning.GridSearch(hypermodel, objective="val_accuracy",
                                    directory="tuners/results/demo", project_name="search")
    tuner.search(ds.x_train, ds.y_train, epochs=5)
    tfbnn.tuning.trial_records(tuner)[:3]   # best first

Resuming: KerasTuner reloads a project folder when ``overwrite=False``; completed
trials are kept (ids, scores, checkpoints) and a trial that was running when the
process died is run again. KerasTuner 1.4.8's own ``GridSearch`` cannot resume
(its ordering state is not saved: ``KeyError`` in ``LinkedList.next`` after a
restart, keras-team/keras-tuner#1055); :class:`GridSearch` here derives the next
grid point from the saved trials instead, and writes KerasTuner's JSON records
atomically so that a kill mid-write cannot corrupt them.

Distributed tuning is KerasTuner's own chief/worker mode over gRPC: every
process runs the same search with ``KERASTUNER_TUNER_ID`` (``chief``,
``tuner0``, ``tuner1``, ...), ``KERASTUNER_ORACLE_IP`` and
``KERASTUNER_ORACLE_PORT`` set; the chief serves the oracle and its ``search``
returns when every trial has ended, the workers train. Only the chief may wipe
the project folder (``overwrite=True`` is ignored on a worker, with a warning).
:func:`launch_distributed` starts a chief and workers on this machine.

References:
    Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
    Networks. ICML 2015 (sec. 5.1, the prior grid).
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022.
"""

import csv
import itertools
import json
import math
import os
import socket
import subprocess
import time
import warnings

import keras
import keras_tuner
import numpy as np

from tfbnn import layers as layers_lib
from tfbnn import priors as priors_lib
from tfbnn import schedules as schedules_lib
from tfbnn.callbacks import KLAnnealing

__all__ = [
    "BLUNDELL_PI",
    "BLUNDELL_NEG_LOG_SIGMA1",
    "BLUNDELL_NEG_LOG_SIGMA2",
    "OBJECTIVES",
    "SEARCHES",
    "BlundellPriorSpace",
    "IBNNSpace",
    "BayesianMLPHyperModel",
    "IBNNHyperModel",
    "GridSearch",
    "RandomSearch",
    "Search",
    "get_search",
    "get_objective",
    "make_schedule",
    "split_validation",
    "distributed_role",
    "trial_records",
    "write_csv",
    "plot_prior_grid",
    "free_port",
    "wait_for_chief",
    "launch_distributed",
]

#: Blundell et al. (2015), sec. 5.1: the scale-mixture prior grid.
BLUNDELL_PI = (0.25, 0.5, 0.75)
BLUNDELL_NEG_LOG_SIGMA1 = (0.0, 1.0, 2.0)
BLUNDELL_NEG_LOG_SIGMA2 = (6.0, 7.0, 8.0)

#: Objective name -> direction. ``val_nll`` needs the ``nll`` metric every tfbnn
#: HyperModel compiles; ``val_loss`` includes ``beta * KL / N``.
OBJECTIVES = {"val_accuracy": "max", "val_nll": "min", "val_loss": "min"}

LAYER_NAMES = ("flipout", "local_reparameterization", "reparameterization")
SCHEDULE_NAMES = ("constant", "linear", "warmup", "cosine", "cyclic", "blundell")


# -- argument checks -----------------------------------------------------------


def _is_number(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _values(name, values, check, what):
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
    return _is_number(value) and 0.0 < value < 1.0


def _finite(value):
    return _is_number(value) and math.isfinite(value)


def _positive(value):
    return _finite(value) and value > 0


def _positive_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _floats(name, values, check, what):
    return tuple(float(v) for v in _values(name, values, check, what))


def _neg_log_sigmas(name, neg_log, sigma, default):
    """``-log sigma`` values, from either parameterization (not both)."""
    if sigma is not None:
        if neg_log is not None:
            raise ValueError(
                f"Expected either `neg_log_{name}` or `{name}`, not both. "
                f"Received: neg_log_{name}={neg_log!r}, {name}={sigma!r}"
            )
        sigmas = _floats(name, sigma, _positive, "a positive finite number")
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
    ramp = max(epochs / 2.0, 1e-3)
    if name == "constant":
        return schedules_lib.Constant(1.0)
    if name == "linear":
        return schedules_lib.Linear(epochs=ramp)
    if name == "warmup":
        return schedules_lib.WarmUp(warmup_epochs=ramp / 2, epochs=ramp / 2)
    if name == "cosine":
        return schedules_lib.Cosine(epochs=ramp)
    if name == "cyclic":
        return schedules_lib.Cyclic(cycle_epochs=ramp / 2, ratio=0.5)
    if name == "blundell":
        return schedules_lib.Blundell()
    raise ValueError(f"Unknown KL schedule. Expected one of {list(SCHEDULE_NAMES)}. Received: schedule={name!r}")


# -- search spaces ---------------------------------------------------------------


class BlundellPriorSpace:
    """The scale-mixture prior grid of Blundell et al. (2015), sec. 5.1, and optional extras.

    The prior of every weight is ``pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2)``
    (eq. 7) with ``sigma1 = exp(-neg_log_sigma1)``, ``sigma2 = exp(-neg_log_sigma2)``.
    The defaults are the paper's grid: ``pi`` in {1/4, 1/2, 3/4}, ``-log sigma1``
    in {0, 1, 2}, ``-log sigma2`` in {6, 7, 8}: 27 combinations. The paper's best
    point was ``(1/4, 1, e^-8 = 3.35e-4)``, i.e. ``-log sigma1 = 0``, ``-log sigma2 = 8``.

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
            "learning_rate", learning_rate, _positive, "a positive finite number"
        )
        self.hidden_units = None if hidden_units is None else tuple(
            int(v) for v in _values("hidden_units", hidden_units, _positive_int, "a positive integer")
        )
        self.schedule = None if schedule is None else _values(
            "schedule", schedule, lambda s: s in SCHEDULE_NAMES, f"one of {list(SCHEDULE_NAMES)}"
        )

    def dimensions(self):
        """``{hyperparameter name: values}`` in declaration order (tuned ones only)."""
        dims = {"pi": self.pi, "neg_log_sigma1": self.neg_log_sigma1, "neg_log_sigma2": self.neg_log_sigma2}
        for name in ("learning_rate", "hidden_units", "schedule"):
            if getattr(self, name) is not None:
                dims[name] = getattr(self, name)
        return dims

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

    @staticmethod
    def prior(values):
        """The :class:`tfbnn.priors.ScaleMixture` of one set of values."""
        return priors_lib.ScaleMixture(
            pi=values["pi"],
            sigma1=math.exp(-values["neg_log_sigma1"]),
            sigma2=math.exp(-values["neg_log_sigma2"]),
        )

    def get_config(self):
        return {name: list(values) for name, values in self.dimensions().items()}

    def __repr__(self):
        args = ", ".join(f"{k}={tuple(v)}" for k, v in self.get_config().items())
        return f"BlundellPriorSpace({args})"


class IBNNSpace:
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
            int(v) for v in _values("num_components", num_components, _positive_int, "a positive integer")
        )
        self.init_stddev = _floats("init_stddev", init_stddev, _positive, "a positive finite number")
        self.prior_stddev = _floats("prior_stddev", prior_stddev, _positive, "a positive finite number")
        self.variational_learning_rate = _floats(
            "variational_learning_rate", variational_learning_rate, _positive, "a positive finite number"
        )

    def dimensions(self):
        return {
            "num_components": self.num_components,
            "init_stddev": self.init_stddev,
            "prior_stddev": self.prior_stddev,
            "variational_learning_rate": self.variational_learning_rate,
        }

    def declare(self, hp):
        return {name: hp.Choice(name, list(values)) for name, values in self.dimensions().items()}

    @property
    def size(self):
        return math.prod(len(v) for v in self.dimensions().values())

    def grid(self):
        dims = self.dimensions()
        return [dict(zip(dims, combo)) for combo in itertools.product(*dims.values())]

    def get_config(self):
        return {name: list(values) for name, values in self.dimensions().items()}


# -- hypermodels -------------------------------------------------------------------


def split_validation(x, y, validation_split):
    """Keras' ``validation_split`` rule: the last ``validation_split`` of the examples validates.

    Returns ``(x_train, y_train), (x_val, y_val)`` with
    ``len(x_train) = floor(n * (1 - validation_split))``, as ``model.fit`` splits.
    """
    if not (_is_number(validation_split) and 0.0 < validation_split < 1.0):
        raise ValueError(
            f"Expected `validation_split` in the open interval (0, 1). Received: validation_split={validation_split!r}"
        )
    n = len(x)
    split_at = int(math.floor(n * (1.0 - validation_split)))
    if split_at < 1 or split_at >= n:
        raise ValueError(
            f"A validation split of {validation_split} leaves {split_at} training and {n - split_at} "
            f"validation examples of {n}; both need at least one. Received: validation_split={validation_split}"
        )
    return (x[:split_at], y[:split_at]), (x[split_at:], y[split_at:])


def _tuner_id():
    return os.environ.get("KERASTUNER_TUNER_ID", "tuner0")


class BayesianMLPHyperModel(keras_tuner.HyperModel):
    """A Bayes-by-Backprop MLP classifier per trial, trained on the ELBO with ``N`` = the training split.

    ``build(hp)`` makes ``depth`` hidden ReLU layers of tfbnn dense layers
    (``layer``: flipout, local reparameterization or reparameterization) and a
    softmax output, every kernel and bias under the trial's prior (the
    :class:`BlundellPriorSpace` scale mixture), compiled with Adam, the
    sparse categorical cross-entropy, and the metrics ``accuracy`` and ``nll``.
    ``fit`` holds out the validation split, adds :class:`tfbnn.KLAnnealing` with
    ``num_examples`` = the training examples actually used, and trains.

    Args:
        input_shape: tuple, one input's shape, e.g. ``(64,)``.
        num_classes: int >= 2.
        space: a :class:`BlundellPriorSpace` (default: the paper's grid).
        hidden_units: int, units per hidden layer unless the space tunes it. Default 64.
        depth: int, hidden layers. Default 2.
        layer: ``"flipout"`` (default), ``"local_reparameterization"`` or ``"reparameterization"``.
        learning_rate: float, Adam's learning rate unless the space tunes it. Default 3e-3.
        schedule: KL schedule name unless the space tunes it. Default ``"constant"`` (beta = 1).
        batch_size: int. Default 32.
        epochs: int or None, default epochs of ``fit`` (``search(..., epochs=...)`` overrides).
        validation_split: float in (0, 1), the held-out fraction when ``fit`` gets no
            ``validation_data``. Default 1/6 (Blundell held out 10,000 of MNIST's 60,000).
        seed: int. Every trial starts from ``keras.utils.set_random_seed(seed)`` and
            seeded layers, so trials differ only by their hyperparameters.
        jit_compile: bool. Default False (XLA makes weight-sized draws slow on CPU).
        fit_log: None or a file path: each ``fit`` appends a JSON line when it begins
            and when it ends (values, tuner id, pid, N, final metrics) -- an audit trail
            of which process trained what, shared by distributed workers.
        verbose: Keras ``fit`` verbosity (0, 1, 2). Default 0.
        name: str.

    Example:
        >>> hm = BayesianMLPHyperModel((2,), 2, hidden_units=8)
        >>> model = hm.build(keras_tuner.HyperParameters())   # first grid point
    """

    def __init__(
        self,
        input_shape,
        num_classes,
        space=None,
        hidden_units=64,
        depth=2,
        layer="flipout",
        learning_rate=3e-3,
        schedule="constant",
        batch_size=32,
        epochs=None,
        validation_split=1.0 / 6.0,
        seed=0,
        jit_compile=False,
        run_eagerly=False,
        fit_log=None,
        verbose=0,
        name="bbb_mlp",
    ):
        super().__init__(name=name, tunable=True)
        self.input_shape = tuple(int(d) for d in input_shape)
        if not _positive_int(num_classes) or num_classes < 2:
            raise ValueError(f"Expected `num_classes` to be an integer >= 2. Received: num_classes={num_classes!r}")
        self.num_classes = int(num_classes)
        self.space = self._check_space(space)
        for arg, value in (("hidden_units", hidden_units), ("depth", depth), ("batch_size", batch_size)):
            if not _positive_int(value):
                raise ValueError(f"Expected `{arg}` to be a positive integer. Received: {arg}={value!r}")
        self.hidden_units, self.depth, self.batch_size = int(hidden_units), int(depth), int(batch_size)
        if layer not in LAYER_NAMES:
            raise ValueError(f"Unknown layer type. Expected one of {list(LAYER_NAMES)}. Received: layer={layer!r}")
        self.layer = layer
        if not _positive(learning_rate):
            raise ValueError(f"Expected `learning_rate` to be a positive number. Received: learning_rate={learning_rate!r}")
        self.learning_rate = float(learning_rate)
        make_schedule(schedule, 1)  # validates the name
        self.schedule = schedule
        if epochs is not None and not _positive_int(epochs):
            raise ValueError(f"Expected `epochs` to be a positive integer or None. Received: epochs={epochs!r}")
        self.epochs = epochs
        if not (_is_number(validation_split) and 0.0 < validation_split < 1.0):
            raise ValueError(
                f"Expected `validation_split` in the open interval (0, 1). Received: validation_split={validation_split!r}"
            )
        self.validation_split = float(validation_split)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"Expected `seed` to be a non-negative integer. Received: seed={seed!r}")
        self.seed = int(seed)
        self.jit_compile = bool(jit_compile)
        self.run_eagerly = bool(run_eagerly)
        self.fit_log = None if fit_log is None else os.fspath(fit_log)
        self.verbose = verbose

    def _check_space(self, space):
        space = BlundellPriorSpace() if space is None else space
        if not isinstance(space, BlundellPriorSpace):
            raise ValueError(
                "Expected `space` to be a tfbnn.tuning.BlundellPriorSpace. "
                f"Received: space={type(space).__name__}"
            )
        return space

    def _setting(self, values, name):
        return values.get(name, getattr(self, name))

    def build(self, hp):
        from tfbnn.cli import build_mlp

        values = self.space.declare(hp)
        keras.utils.set_random_seed(self.seed)
        model = build_mlp(
            self.input_shape,
            self.num_classes,
            self._setting(values, "hidden_units"),
            self.depth,
            self.layer,
            self.space.prior(values),
            self.seed,
            name=self.name,
        )
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=self._setting(values, "learning_rate")),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy", keras.metrics.SparseCategoricalCrossentropy(name="nll")],
            jit_compile=False if self.run_eagerly else self.jit_compile,
            run_eagerly=self.run_eagerly,
        )
        return model

    def fit(self, hp, model, x, y=None, validation_data=None, validation_split=None, callbacks=None, **kwargs):
        """Trains ``model`` on the training split with ``KLAnnealing(num_examples=N)``.

        ``x``, ``y``: NumPy arrays. Without ``validation_data``, the last
        ``validation_split`` of them (default: the HyperModel's) validates and
        ``N = floor(n (1 - validation_split))``; with it, all of ``x`` trains and ``N = len(x)``.
        Other keyword arguments go to ``model.fit`` (``epochs``, ``batch_size``, ...).
        """
        if y is None:
            raise ValueError(
                "Expected NumPy arrays `x` and `y` (the training inputs and labels), so that N, the "
                "number of training examples of the ELBO, is known. Received: y=None"
            )
        if validation_data is None:
            split = self.validation_split if validation_split is None else validation_split
            (x, y), validation_data = split_validation(x, y, split)
        num_examples = int(len(x))
        epochs = kwargs.pop("epochs", self.epochs)
        if epochs is None:
            raise ValueError("Expected the number of epochs: pass `search(..., epochs=E)`. Received: epochs=None")
        kwargs.setdefault("batch_size", self.batch_size)
        kwargs.setdefault("verbose", self.verbose)
        schedule = make_schedule(hp.values.get("schedule", self.schedule), epochs)
        callbacks = list(callbacks or []) + [KLAnnealing(num_examples=num_examples, schedule=schedule)]
        self._log("begin", hp, num_examples=num_examples, epochs=epochs)
        history = model.fit(x, y, validation_data=validation_data, epochs=epochs, callbacks=callbacks, **kwargs)
        final = {k: float(v[-1]) for k, v in history.history.items() if v}
        self._log("end", hp, num_examples=num_examples, epochs=epochs, metrics=final)
        return history

    def _log(self, event, hp, **fields):
        if self.fit_log is None:
            return
        record = {"event": event, "values": dict(hp.values), "tuner_id": _tuner_id(), "pid": os.getpid(),
                  "time": time.time(), **fields}
        # One write of one line in append mode: lines from several processes never interleave.
        with open(self.fit_log, "a") as f:
            f.write(json.dumps(record) + "\n")


class IBNNHyperModel(BayesianMLPHyperModel):
    """A node-based iBNN MLP per trial over an :class:`IBNNSpace` (Trinh et al. 2022).

    ``depth`` hidden :class:`tfbnn.layers.NodeDense` ReLU layers and a softmax
    ``NodeDense`` output with the trial's ``K``, ``sigma0`` and ``s``, compiled with
    :func:`tfbnn.ibnn.make_optimizer` (Adam at ``learning_rate`` for the weights,
    the trial's variational learning rate for the node posteriors). ``fit`` is
    :meth:`BayesianMLPHyperModel.fit` (validation split, ``KLAnnealing`` with N).
    Without ``tfbnn.layers.NodeDense`` (an older tfbnn), ``build`` raises
    ``NotImplementedError`` naming the missing layer; KerasTuner calls ``build`` when
    the tuner is made, so that error comes before any training.

    Args: those of :class:`BayesianMLPHyperModel`, with ``space`` an :class:`IBNNSpace`.
    """

    def _check_space(self, space):
        space = IBNNSpace() if space is None else space
        if not isinstance(space, IBNNSpace):
            raise ValueError(f"Expected `space` to be a tfbnn.tuning.IBNNSpace. Received: space={type(space).__name__}")
        return space

    def build(self, hp):
        values = self.space.declare(hp)
        node_dense = getattr(layers_lib, "NodeDense", None)
        if node_dense is None:
            raise NotImplementedError(
                "The iBNN search needs the node-based layer tfbnn.layers.NodeDense (Trinh et al. "
                "2022), which this version of tfbnn does not have; the search space "
                "(tfbnn.tuning.IBNNSpace) is defined, the model is not."
            )
        from tfbnn import ibnn

        node = {"num_components": values["num_components"], "init_stddev": values["init_stddev"],
                "prior_stddev": values["prior_stddev"]}
        keras.utils.set_random_seed(self.seed)
        stack = [keras.Input(shape=self.input_shape)]
        for i in range(self.depth):
            stack.append(node_dense(self.hidden_units, activation="relu", seed=self.seed + i + 1,
                                    name=f"hidden_{i + 1}", **node))
        stack.append(node_dense(self.num_classes, activation="softmax", seed=self.seed + self.depth + 1,
                                name="output", **node))
        model = keras.Sequential(stack, name=self.name)
        optimizer = ibnn.make_optimizer(keras.optimizers.Adam(self.learning_rate),
                                        variational_learning_rate=values["variational_learning_rate"])
        model.compile(
            optimizer=optimizer,
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy", keras.metrics.SparseCategoricalCrossentropy(name="nll")],
            jit_compile=False if self.run_eagerly else self.jit_compile,
            run_eagerly=self.run_eagerly,
        )
        return model


# -- tuners ---------------------------------------------------------------------------


def distributed_role():
    """``"chief"``, ``"worker"`` or None (not distributed), from KerasTuner's environment variables."""
    if "KERASTUNER_ORACLE_IP" not in os.environ:
        return None
    return "chief" if "chief" in os.environ.get("KERASTUNER_TUNER_ID", "") else "worker"


def _write_json(path, obj):
    """KerasTuner's JSON records, written whole or not at all (a kill never leaves half a file)."""
    text = json.dumps(obj)
    path = os.fspath(path)
    if "://" in path:  # a remote file system (gs://...): no rename, write as KerasTuner does
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class _DurableRecords:
    """Oracle mixin: records that survive a kill at any point and a chief that exits.

    * The oracle and trial records are written atomically (a temporary file, then a rename).
    * ``end_trial`` saves the oracle again after the trial has left ``ongoing_trials``:
      KerasTuner saves just before, and a distributed chief never saves afterwards, so
      the last trial would stay "ongoing" on disk and be run again on resume.
    * ``reload`` re-runs only what did not finish: an "ongoing" trial whose own record
      says COMPLETED (killed between the two writes) is kept, and a RUNNING trial the
      oracle state does not know yet (killed right after its creation) is retried
      under its own id instead of being left RUNNING forever.
    """

    def save(self):
        _write_json(self._get_oracle_fname(), self.get_state())

    def _save_trial(self, trial):
        _write_json(os.path.join(self._get_trial_dir(trial.trial_id), "trial.json"), trial.get_state())

    @keras_tuner.synchronized
    def end_trial(self, trial):
        super().end_trial(trial)
        self.save()

    def reload(self):
        super().reload()
        finished = ("COMPLETED", "FAILED")
        retry = [tid for tid in self._retry_queue if self.trials[tid].status not in finished]
        for trial_id, trial in sorted(self.trials.items()):
            if trial.status == "RUNNING" and trial_id not in retry:
                self._record_values(trial)
                retry.append(trial_id)
        self._retry_queue = retry


class GridSearchOracle(_DurableRecords, keras_tuner.oracles.GridSearchOracle):
    """KerasTuner's grid search oracle, resumable.

    The next trial gets the first grid combination (in KerasTuner's grid order)
    that no trial has taken yet, derived from the saved trial records rather than
    from in-memory bookkeeping. So a reloaded project continues where it stopped,
    and concurrent workers never get the same combination.
    """

    def populate_space(self, trial_id):
        values = self._first_untried_values()
        if values is not None:
            return {"status": "RUNNING", "values": values}
        if self.ongoing_trials:  # the last trials are still running (a failure may need a retry)
            return {"status": "IDLE", "values": None}
        return {"status": "STOPPED", "values": None}

    def _first_untried_values(self):
        space = self.get_space()
        values = {hp.name: hp.default for hp in space.space if space.is_active(hp)}
        while values is not None:
            if not self._duplicate(values):
                return values
            values = self._get_next_combination(values)
        return None


class RandomSearchOracle(_DurableRecords, keras_tuner.oracles.RandomSearchOracle):
    """KerasTuner's random search oracle with atomic records."""


class _TunerMixin:
    """Tuner mixin: only the chief may overwrite, atomic records, a calm wait while idle."""

    #: Seconds a worker waits before asking again when the oracle has no trial free yet.
    idle_wait = 0.05

    def __init__(self, oracle, hypermodel=None, overwrite=False, **kwargs):
        if overwrite and distributed_role() == "worker":
            warnings.warn(
                f"overwrite=True ignored on the worker {_tuner_id()!r}: only the chief may wipe "
                "the project folder.",
                stacklevel=3,
            )
            overwrite = False
        self._idle = False
        super().__init__(oracle, hypermodel, overwrite=overwrite, **kwargs)

    def pre_create_trial(self):
        # Called before every request for a trial; after an IDLE answer (no
        # on_trial_begin since) wait a little instead of polling the chief in a tight loop.
        if self._idle:
            time.sleep(self.idle_wait)
        self._idle = True

    def on_trial_begin(self, trial):
        self._idle = False
        super().on_trial_begin(trial)

    def save(self):
        if not self._is_worker():
            self.oracle.save()
        _write_json(self._get_tuner_fname(), self.get_state())


class GridSearch(_TunerMixin, keras_tuner.Tuner):
    """KerasTuner's grid search (every combination exactly once), resumable and distributable.

    Same arguments as ``keras_tuner.GridSearch``; the objective may be a name of
    :data:`OBJECTIVES`. See :class:`GridSearchOracle` for what differs.
    """

    def __init__(
        self,
        hypermodel=None,
        objective="val_accuracy",
        max_trials=None,
        seed=None,
        hyperparameters=None,
        tune_new_entries=True,
        allow_new_entries=True,
        max_retries_per_trial=0,
        max_consecutive_failed_trials=3,
        **kwargs,
    ):
        oracle = GridSearchOracle(
            objective=get_objective(objective),
            max_trials=max_trials,
            seed=seed,
            hyperparameters=hyperparameters,
            tune_new_entries=tune_new_entries,
            allow_new_entries=allow_new_entries,
            max_retries_per_trial=max_retries_per_trial,
            max_consecutive_failed_trials=max_consecutive_failed_trials,
        )
        super().__init__(oracle, hypermodel, **kwargs)


class RandomSearch(_TunerMixin, keras_tuner.Tuner):
    """KerasTuner's random search with the same chief-only overwrite and atomic records."""

    def __init__(self, hypermodel=None, objective="val_accuracy", max_trials=10, seed=None, hyperparameters=None,
                 tune_new_entries=True, allow_new_entries=True, max_retries_per_trial=0,
                 max_consecutive_failed_trials=3, **kwargs):
        oracle = RandomSearchOracle(
            objective=get_objective(objective),
            max_trials=max_trials,
            seed=seed,
            hyperparameters=hyperparameters,
            tune_new_entries=tune_new_entries,
            allow_new_entries=allow_new_entries,
            max_retries_per_trial=max_retries_per_trial,
            max_consecutive_failed_trials=max_consecutive_failed_trials,
        )
        super().__init__(oracle, hypermodel, **kwargs)


class Search:
    """A named search: its space, HyperModel and tuner classes, and a description."""

    def __init__(self, name, space_class, hypermodel_class, tuner_class, description):
        self.name = name
        self.space_class = space_class
        self.hypermodel_class = hypermodel_class
        self.tuner_class = tuner_class
        self.description = description

    def __repr__(self):
        return f"Search({self.name!r})"


#: The named searches of ``tfbnn tune --search``.
SEARCHES = {
    "blundell-prior-grid": Search(
        "blundell-prior-grid", BlundellPriorSpace, BayesianMLPHyperModel, GridSearch,
        "Blundell et al. (2015) scale-mixture prior grid: pi x -log sigma1 x -log sigma2, 27 trials",
    ),
    "ibnn-random": Search(
        "ibnn-random", IBNNSpace, IBNNHyperModel, RandomSearch,
        "node-based iBNN (Trinh et al. 2022, tfbnn.layers.NodeDense): K, sigma0, prior s, "
        "variational learning rate",
    ),
}


def get_search(name):
    """The :class:`Search` called ``name``; a ValueError listing the known names otherwise."""
    if isinstance(name, Search):
        return name
    search = SEARCHES.get(name) if isinstance(name, str) else None
    if search is None:
        raise ValueError(f"Unknown search. Expected one of {list(SEARCHES)}. Received: search={name!r}")
    return search


# -- results ---------------------------------------------------------------------------


def _oracle(tuner_or_oracle):
    oracle = getattr(tuner_or_oracle, "oracle", tuner_or_oracle)
    if not hasattr(oracle, "trials"):
        raise ValueError(
            "Expected a tuner or oracle holding the trial records (on the chief in distributed mode). "
            f"Received: {type(tuner_or_oracle).__name__}"
        )
    return oracle


def _metrics_at(trial, step):
    out = {}
    for name in trial.metrics.metrics:
        history = trial.metrics.get_history(name)
        at_step = [obs.value for obs in history if obs.step == step] if step is not None else []
        value = at_step[-1] if at_step else (history[-1].value if history else None)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        out[name] = None if value is None else float(value)
    return out


def trial_records(tuner_or_oracle):
    """One dict per trial, best first (completed trials ranked by the objective, then the rest).

    Keys: ``rank`` (None unless completed; ties broken by the validation NLL),
    ``trial_id``, ``status``, ``score`` (the objective's best value over epochs,
    KerasTuner's trial score), ``best_epoch``
    (1-based), the hyperparameter values, ``sigma1`` / ``sigma2`` when the values
    hold ``neg_log_sigma1`` / ``neg_log_sigma2``, and every metric at the best epoch.
    """
    oracle = _oracle(tuner_or_oracle)
    direction = oracle.objective.direction
    done, rest = [], []
    for trial in oracle.trials.values():
        record = {"rank": None, "trial_id": trial.trial_id, "status": trial.status, "score": trial.score,
                  "best_epoch": None if trial.best_step is None else int(trial.best_step) + 1}
        record.update(trial.hyperparameters.values)
        for k in ("1", "2"):
            if f"neg_log_sigma{k}" in record:
                record[f"sigma{k}"] = math.exp(-record[f"neg_log_sigma{k}"])
        record.update(_metrics_at(trial, trial.best_step))
        ok = trial.status == "COMPLETED" and trial.score is not None and math.isfinite(trial.score)
        (done if ok else rest).append(record)
    # Ties (common in short runs) go to the better validation NLL (accuracy for a val_nll objective).
    tie_name, tie_sign = ("val_accuracy", -1.0) if oracle.objective.name == "val_nll" else ("val_nll", 1.0)

    def key(r):
        tie = r.get(tie_name)
        return (-r["score"] if direction == "max" else r["score"],
                math.inf if tie is None else tie_sign * tie, r["trial_id"])

    done.sort(key=key)
    for rank, record in enumerate(done, 1):
        record["rank"] = rank
    rest.sort(key=lambda r: r["trial_id"])
    return done + rest


def write_csv(records, path):
    """Writes :func:`trial_records` to ``path`` (atomically); returns the column names."""
    leading = ["rank", "trial_id", "status", "score", "best_epoch"]
    columns = list(leading)
    for record in records:
        columns += [k for k in record if k not in columns]
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for record in records:
            writer.writerow({k: "" if record.get(k) is None else record.get(k) for k in columns})
    os.replace(tmp, path)
    return columns


def plot_prior_grid(records, path, metric="val_accuracy", title=None):
    """Heat maps of ``metric`` over (-log sigma1, -log sigma2), one panel per ``pi``.

    A cell holds the best value of ``metric`` among the completed trials at that
    prior (over any other tuned hyperparameter), annotated; missing cells are blank.
    Drawn without pyplot (``matplotlib.figure.Figure``, Agg canvas), so it needs no
    display and leaves the caller's pyplot state alone. Returns ``path``.
    """
    from matplotlib.figure import Figure

    direction = OBJECTIVES.get(metric, "max")
    rows = [r for r in records if r.get("status") == "COMPLETED" and r.get(metric) is not None
            and all(k in r for k in ("pi", "neg_log_sigma1", "neg_log_sigma2"))]
    if not rows:
        raise ValueError(f"No completed trial has a value of {metric!r} and a prior to plot. Received: metric={metric!r}")
    pis = sorted({r["pi"] for r in rows})
    a_values = sorted({r["neg_log_sigma1"] for r in rows})
    b_values = sorted({r["neg_log_sigma2"] for r in rows})
    best = {}
    for r in rows:
        key = (r["pi"], r["neg_log_sigma1"], r["neg_log_sigma2"])
        old = best.get(key)
        if old is None or (r[metric] > old if direction == "max" else r[metric] < old):
            best[key] = r[metric]
    values = np.array(list(best.values()))
    vmin, vmax = float(values.min()), float(values.max())
    if vmin == vmax:
        vmin, vmax = vmin - 0.5e-3, vmax + 0.5e-3
    cmap = "viridis" if direction == "max" else "viridis_r"

    fig = Figure(figsize=(3.6 * len(pis) + 1.2, 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(pis), sharey=True))
    for ax, pi in zip(axes, pis):
        grid = np.full((len(a_values), len(b_values)), np.nan)
        for i, a in enumerate(a_values):
            for j, b in enumerate(b_values):
                grid[i, j] = best.get((pi, a, b), np.nan)
        image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", aspect="auto")
        for i in range(len(a_values)):
            for j in range(len(b_values)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=8,
                            color="white" if (grid[i, j] - vmin) / (vmax - vmin) < 0.5 else "black")
        ax.set_xticks(range(len(b_values)), [f"{b:g}" for b in b_values])
        ax.set_yticks(range(len(a_values)), [f"{a:g}" for a in a_values])
        ax.set_xlabel(r"$-\log \sigma_2$")
        ax.set_title(rf"$\pi$ = {pi:g}")
    axes[0].set_ylabel(r"$-\log \sigma_1$")
    fig.colorbar(image, ax=list(axes), label=metric)
    if title:
        fig.suptitle(title)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


# -- distributed launch -------------------------------------------------------------------


def free_port(host="127.0.0.1"):
    """A TCP port on ``host`` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_chief(timeout=600.0, poll=0.2):
    """In a distributed worker: blocks until the chief's gRPC port accepts connections.

    A worker that builds its tuner only after this never races the chief's
    ``overwrite`` of the project folder. Raises RuntimeError after ``timeout`` seconds.
    """
    host, port = os.environ["KERASTUNER_ORACLE_IP"], int(os.environ["KERASTUNER_ORACLE_PORT"])
    deadline = time.monotonic() + timeout
    while not _port_open(host, port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"No KerasTuner chief answered on {host}:{port} within {timeout:g} s.")
        time.sleep(poll)


def _stop(processes):
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def launch_distributed(command, num_workers, host="127.0.0.1", port=None, log_dir=None, env=None,
                       chief_stdout=None, start_timeout=300.0, workers_wait_for_chief=False):
    """Runs ``command`` as a KerasTuner chief and ``num_workers`` workers on this machine.

    The chief (``KERASTUNER_TUNER_ID=chief``) starts first; the workers
    (``tuner0``, ``tuner1``, ...) start once its gRPC port accepts connections (so that
    they never see a project folder the chief is about to overwrite), or right away with
    ``workers_wait_for_chief=True`` for commands whose workers wait for the port
    themselves before touching the folder (``tfbnn tune`` does; it saves their start-up
    time). All get
    ``KERASTUNER_ORACLE_IP=host`` and ``KERASTUNER_ORACLE_PORT=port``. The command must
    build the same tuner in every process and call ``search`` (the chief's blocks
    until every trial has ended) -- ``tfbnn tune`` and the scripts in ``tuners/`` do.

    Args:
        command: list of str, the program and its arguments (e.g.
            ``[sys.executable, "-m", "tfbnn.tuning_cli", "tune", ...]``).
        num_workers: int >= 1.
        host: the chief's address. Default 127.0.0.1.
        port: int or None (a free port).
        log_dir: folder for the workers' output (``worker-tuner0.log``, ...); default:
            their output is discarded.
        env: dict or None, the base environment (default ``os.environ``).
        chief_stdout: a file object for the chief's output (default: this process's).
        start_timeout: seconds to wait for the chief's port.

    Returns:
        The chief's exit status (0 when it and every worker succeeded; a failed
        worker makes it 1 at least and stops the rest, so the chief never waits forever).
    """
    if not _positive_int(num_workers):
        raise ValueError(f"Expected `num_workers` to be a positive integer. Received: num_workers={num_workers!r}")
    port = free_port(host) if port is None else int(port)
    base = dict(os.environ if env is None else env)
    base.update({"KERASTUNER_ORACLE_IP": host, "KERASTUNER_ORACLE_PORT": str(port)})

    def start(tuner_id, stdout):
        return subprocess.Popen(list(command), env={**base, "KERASTUNER_TUNER_ID": tuner_id},
                                stdout=stdout, stderr=subprocess.STDOUT if stdout is not None else None)

    chief = start("chief", chief_stdout)
    processes, logs = [chief], []
    try:
        deadline = time.monotonic() + start_timeout
        while not workers_wait_for_chief and not _port_open(host, port):
            if chief.poll() is not None:
                return chief.returncode or 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"The KerasTuner chief did not open {host}:{port} within {start_timeout:g} s.")
            time.sleep(0.2)
        for k in range(num_workers):
            tuner_id = f"tuner{k}"
            if log_dir is not None:
                os.makedirs(log_dir, exist_ok=True)
                logs.append(open(os.path.join(log_dir, f"worker-{tuner_id}.log"), "w"))
                stdout = logs[-1]
            else:
                stdout = subprocess.DEVNULL
            processes.append(start(tuner_id, stdout))
        workers = processes[1:]
        failed = False
        while chief.poll() is None:
            if any(w.poll() not in (None, 0) for w in workers):
                failed = True  # the chief would wait for the lost worker's trial forever
                break
            time.sleep(0.5)
        if failed:
            _stop(processes)
            return 1
        for w in workers:
            try:
                w.wait(timeout=60)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        if chief.returncode != 0:
            return chief.returncode
        return 0 if all(w.returncode == 0 for w in workers) else 1
    finally:
        _stop(processes)
        for f in logs:
            f.close()
