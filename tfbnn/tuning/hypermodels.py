"""KerasTuner HyperModels of the tfbnn searches: each trial a zoo model, trained on the ELBO.

:class:`BayesianMLPHyperModel` (Bayes by Backprop over a :class:`BlundellPriorSpace`)
and :class:`IBNNHyperModel` (node-based iBNN over an :class:`IBNNSpace`) build their
models with :func:`tfbnn.models.mlp`, the one builder of tfbnn's models, and fit
them on a training split with :class:`tfbnn.KLAnnealing` given that split's ``N``.
"""

import json
import os
import time

import keras
import keras_tuner
import numpy as np

from tfbnn import ibnn
from tfbnn import layers as layers_lib
from tfbnn import models as models_lib
from tfbnn.callbacks import KLAnnealing
from tfbnn.tuning.launch import tuner_id
from tfbnn.tuning.spaces import (
    BlundellPriorSpace,
    IBNNSpace,
    check_validation_split,
    is_positive,
    is_positive_int,
    make_schedule,
    split_validation,
)
from tfbnn.utils import build_for_fit

__all__ = ["BayesianMLPHyperModel", "IBNNHyperModel", "LAYER_NAMES"]

#: The Bayes-by-Backprop layer types (the zoo's ``bbb`` estimators).
LAYER_NAMES = models_lib.ESTIMATORS

# N of a model built before the data is known; ``fit`` replaces it (see ``num_examples``).
_PLACEHOLDER_NUM_EXAMPLES = 1


class BayesianMLPHyperModel(keras_tuner.HyperModel):
    """A Bayes-by-Backprop MLP classifier per trial, trained on the ELBO with ``N`` = the training split.

    ``build(hp)`` makes the zoo's Bayes-by-Backprop MLP, ``tfbnn.models.mlp("bbb",
    hidden_units=(units,) * depth, estimator=layer, prior=...)``: ``depth`` hidden
    ReLU layers of tfbnn dense layers (``layer``: flipout, local reparameterization
    or reparameterization) and a softmax head, every kernel and bias under the
    trial's prior (the :class:`BlundellPriorSpace` scale mixture), compiled with
    Adam, the sparse categorical cross-entropy, and the metrics ``accuracy`` and ``nll``.
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
        name: str, also the name of the built models.
        num_examples: int or None, N of the model ``build`` returns (its Bayesian
            layers start at ``kl_weight = 1 / N``). KerasTuner builds before it passes
            any data, so by default (None) ``build`` uses N = 1 as a placeholder. That
            value never trains: this HyperModel's ``fit`` adds :class:`tfbnn.KLAnnealing`
            with N = the training split, which writes ``beta / N`` into every layer
            before the first batch (and every batch after), and KerasTuner's
            checkpoints keep that weight. Give N when you build a model to train it
            without this ``fit``.

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
        num_examples=None,
    ):
        super().__init__(name=name, tunable=True)
        self.input_shape = tuple(int(d) for d in input_shape)
        if not is_positive_int(num_classes) or num_classes < 2:
            raise ValueError(f"Expected `num_classes` to be an integer >= 2. Received: num_classes={num_classes!r}")
        self.num_classes = int(num_classes)
        self.space = self._check_space(space)
        for arg, value in (("hidden_units", hidden_units), ("depth", depth), ("batch_size", batch_size)):
            if not is_positive_int(value):
                raise ValueError(f"Expected `{arg}` to be a positive integer. Received: {arg}={value!r}")
        self.hidden_units, self.depth, self.batch_size = int(hidden_units), int(depth), int(batch_size)
        if layer not in LAYER_NAMES:
            raise ValueError(f"Unknown layer type. Expected one of {list(LAYER_NAMES)}. Received: layer={layer!r}")
        self.layer = layer
        if not is_positive(learning_rate):
            raise ValueError(f"Expected `learning_rate` to be a positive number. Received: learning_rate={learning_rate!r}")
        self.learning_rate = float(learning_rate)
        make_schedule(schedule, 1)  # validates the name
        self.schedule = schedule
        if epochs is not None and not is_positive_int(epochs):
            raise ValueError(f"Expected `epochs` to be a positive integer or None. Received: epochs={epochs!r}")
        self.epochs = epochs
        self.validation_split = check_validation_split(validation_split)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"Expected `seed` to be a non-negative integer. Received: seed={seed!r}")
        self.seed = int(seed)
        self.jit_compile = bool(jit_compile)
        self.run_eagerly = bool(run_eagerly)
        self.fit_log = None if fit_log is None else os.fspath(fit_log)
        self.verbose = verbose
        if num_examples is not None and not is_positive_int(num_examples):
            raise ValueError(
                f"Expected `num_examples` to be a positive integer or None. Received: num_examples={num_examples!r}"
            )
        self.num_examples = None if num_examples is None else int(num_examples)

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
        values = self.space.declare(hp)
        model = self._zoo_mlp(values, "bbb", estimator=self.layer, prior=self.space.prior(values))
        return self._compile(model, keras.optimizers.Adam(learning_rate=self._setting(values, "learning_rate")))

    def _zoo_mlp(self, values, method, **options):
        """The trial's :func:`tfbnn.models.mlp`: ``depth`` hidden layers of the trial's width."""
        keras.utils.set_random_seed(self.seed)
        units = int(self._setting(values, "hidden_units"))
        return models_lib.mlp(
            method,
            hidden_units=(units,) * self.depth,
            num_classes=self.num_classes,
            input_shape=self.input_shape,
            num_examples=self.num_examples or _PLACEHOLDER_NUM_EXAMPLES,
            seed=self.seed,
            name=self.name,
            **options,
        )

    def _compile(self, model, optimizer):
        model.compile(
            optimizer=optimizer,
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
        build_for_fit(model, (x[:1], y[:1]))  # the train step is traced once, not twice
        history = model.fit(x, y, validation_data=validation_data, epochs=epochs, callbacks=callbacks, **kwargs)
        final = {k: float(v[-1]) for k, v in history.history.items() if v}
        self._log("end", hp, num_examples=num_examples, epochs=epochs, metrics=final)
        return history

    def _log(self, event, hp, **fields):
        if self.fit_log is None:
            return
        record = {"event": event, "values": dict(hp.values), "tuner_id": tuner_id(), "pid": os.getpid(),
                  "time": time.time(), **fields}
        # One write of one line in append mode: lines from several processes never interleave.
        with open(self.fit_log, "a") as f:
            f.write(json.dumps(record) + "\n")


class IBNNHyperModel(BayesianMLPHyperModel):
    """A node-based iBNN MLP per trial over an :class:`IBNNSpace` (Trinh et al. 2022).

    ``build(hp)`` makes the zoo's iBNN MLP, ``tfbnn.models.mlp("ibnn", ...)``:
    ``depth`` hidden :class:`tfbnn.layers.NodeDense` ReLU layers and a softmax
    ``NodeDense`` head with the trial's ``K``, ``sigma0`` and ``s``, compiled with
    :func:`tfbnn.ibnn.node_optimizer` (Adam at ``learning_rate`` for the weights,
    the trial's variational learning rate for the node posteriors). ``fit`` is
    :meth:`BayesianMLPHyperModel.fit` (validation split, ``KLAnnealing`` with N).
    Without ``tfbnn.layers.NodeDense`` (an older tfbnn), ``build`` raises
    ``NotImplementedError`` naming the missing layer; KerasTuner calls ``build`` when
    the tuner is made, so that error comes before any training.

    Args: those of :class:`BayesianMLPHyperModel`, with ``space`` an :class:`IBNNSpace`
    (``layer`` is not used).
    """

    def _check_space(self, space):
        space = IBNNSpace() if space is None else space
        if not isinstance(space, IBNNSpace):
            raise ValueError(f"Expected `space` to be a tfbnn.tuning.IBNNSpace. Received: space={type(space).__name__}")
        return space

    def build(self, hp):
        values = self.space.declare(hp)
        if getattr(layers_lib, "NodeDense", None) is None:
            raise NotImplementedError(
                "The iBNN search needs the node-based layer tfbnn.layers.NodeDense (Trinh et al. "
                "2022), which this version of tfbnn does not have; the search space "
                "(tfbnn.tuning.IBNNSpace) is defined, the model is not."
            )
        model = self._zoo_mlp(values, "ibnn", num_components=values["num_components"],
                              prior_stddev=values["prior_stddev"], init_stddev=values["init_stddev"])
        optimizer = ibnn.node_optimizer(keras.optimizers.Adam(self.learning_rate),
                                        variational_learning_rate=values["variational_learning_rate"])
        return self._compile(model, optimizer)
