"""Training callbacks. The ELBO convention of tfbnn is stated here once.

The ELBO convention
-------------------
Keras reduces the data loss to a mean over the minibatch. tfbnn layers add
``kl_weight * KL(q || p)`` to ``model.losses``. With ``N`` training examples the
per-example negative ELBO (Blundell et al. 2015, eq. 1-2, divided by N) is::

    loss = mean_batch NLL  +  beta * KL(q || p) / N

so every Bayesian layer holds ``kl_weight = beta / N``. ``beta = 1`` is the true
ELBO; schedules move it (annealing, warm-up, Blundell's minibatch weights, see
:mod:`tfbnn.schedules`). :class:`KLAnnealing` owns ``beta`` and writes ``beta / N``
into each layer's non-trainable ``kl_weight`` variable before every batch, so the
change takes effect inside the compiled train step.

Tempered ("cold") posteriors: beta < 1
--------------------------------------
A final ``beta < 1`` is not the ELBO but a tempered one. Multiplying the loss by
``N / beta``::

    (N / beta) * loss = (1 / beta) * sum_i NLL_i  +  KL(q || p)

which is the negative ELBO of a data set holding every example ``1 / beta`` times
(``beta = 0.1``: ten copies), or equally of the prior's weight cut to ``beta``
against the data. Over all ``q`` its optimum is the likelihood-tempered posterior
``p_beta(w | D) = p(D | w)^(1/beta) p(w) / Z``: a "cold" posterior, sharper than
the Bayes posterior, that tends to the maximum-likelihood point as ``beta -> 0``
(``beta`` is Wenzel et al.'s temperature ``T`` with the likelihood tempered and the
prior not; with a Normal prior ``N(0, s^2)`` their fully tempered posterior
``exp(-U(w) / T)``, ``U = -sum_i log p(y_i | x_i, w) - log p(w)``, is this one with
the prior ``N(0, T s^2)``). Variational BNNs down-weight the KL this way in
practice (Zhang et al. 2018, noisy natural gradient, KL weight ``lambda``; Osawa
et al. 2019, VOGN, ``tau``), and Wenzel et al. (2020) find cold posteriors predict
better than the Bayes posterior in deep networks.

The trade-off. On little data the ``beta = 1`` mean-field posterior is wide: its
samples disagree, so the Monte Carlo predictive is under-confident (its mean
confidence below its accuracy) and less accurate than a deterministic network.
A smaller ``beta`` narrows it: accuracy, NLL and calibration usually improve,
but the epistemic uncertainty (mutual information) shrinks with it, so the
model says less about inputs it has not seen, and the result is no longer the
Bayes posterior of the stated prior (``beta`` is a hyper-parameter: choose it on
validation data). Post-hoc temperature scaling of the predictive
(:meth:`tfbnn.TemperatureScaling.fit_prediction`) fixes the calibration of a
``beta = 1`` model without retraining, but not its accuracy.

References:
    Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
    Networks. ICML 2015 (eq. 1-2, 9).
    Wenzel et al. How Good is the Bayes Posterior in Deep Neural Networks Really?
    ICML 2020 (sec. 2, the tempered posterior).
    Zhang, Sun, Duvenaud, Grosse. Noisy Natural Gradient as Variational Inference.
    ICML 2018.
    Osawa et al. Practical Deep Learning with Bayesian Principles. NeurIPS 2019.
"""

import math
import time
import warnings

import keras

from tfbnn import pruning
from tfbnn._internal import checks, keras_private
from tfbnn import schedules as schedules_lib
from tfbnn.utils import bayesian_layers, set_kl_weight

__all__ = ["KLAnnealing", "SparsityMonitor", "NaNGuard", "EpochTimer"]


class KLAnnealing(keras.callbacks.Callback):
    """Sets ``kl_weight = beta / N`` on every Bayesian layer before each batch.

    ``beta`` follows ``schedule(epoch, batch, steps_per_epoch)`` (a pure function of
    the position in training), so after an interruption
    ``keras.callbacks.BackupAndRestore`` resumes with the same beta the
    uninterrupted run would have had. The current beta is logged as ``kl_beta``
    (progress bar per batch, ``History`` per epoch: the value at the epoch's last
    batch).

    ``beta`` ends at the schedule's final value: 1 for the ELBO, below 1 for a
    tempered ("cold") posterior (see the module docstring, "Tempered posteriors").

    Args:
        num_examples: int > 0, ``N``, the number of training examples (not batches).
        schedule: a name (``"constant", "linear", "warmup", "cosine", "cyclic",
            "blundell"``), a :class:`tfbnn.schedules.Schedule`, or a callable
            ``(epoch, batch, steps_per_epoch) -> beta``. Default ``"linear"``
            (0 -> 1 over 10 epochs).
        steps_per_epoch: int or None. Minibatches per epoch; read from ``fit`` when
            None. Needed by ``"blundell"`` and for per-batch ramps on datasets of
            unknown length.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(2, activation="softmax", seed=0)])
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> cb = tfbnn.KLAnnealing(num_examples=len(x), schedule=tfbnn.schedules.WarmUp(1, 2))
        >>> history = model.fit(x, y, epochs=3, batch_size=32, callbacks=[cb], verbose=0)
        >>> history.history["kl_beta"]   # beta at each epoch's last batch (2 batches per epoch)
        [0.0, 0.25, 0.75]

    With ``fit(steps_per_execution=k)`` Keras calls batch hooks once per k steps,
    so beta changes every k batches.
    """

    def __init__(self, num_examples, schedule="linear", steps_per_epoch=None):
        super().__init__()
        self.num_examples = checks.integer(
            "num_examples", num_examples, 1, what="a positive integer (N, the number of training examples)"
        )
        self.schedule = schedules_lib.get(schedule)
        self.steps_per_epoch = checks.integer("steps_per_epoch", steps_per_epoch, 1, allow_none=True)
        self._epoch = 0
        self.beta = None

    def on_train_begin(self, logs=None):
        if not bayesian_layers(self.model):
            warnings.warn("KLAnnealing: the model has no tfbnn Bayesian layer; it has no effect.")
        self._steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if getattr(self.schedule, "needs_steps_per_epoch", False) and not self._steps:
            raise ValueError(
                f"The schedule {self.schedule!r} needs the number of minibatches per epoch, and "
                "`fit` does not know it (a dataset of unknown length). Pass "
                "`KLAnnealing(..., steps_per_epoch=M)`. Received: steps_per_epoch=None"
            )
        # Before the first trace of the train step: the layers know N from here on.
        self._apply(keras_private.initial_epoch(self.model), 0)

    def beta_at(self, epoch, batch):
        """The beta this callback uses at ``(epoch, batch)`` of the current run."""
        return float(self.schedule(epoch, batch, self._steps))

    def _apply(self, epoch, batch):
        self.beta = self.beta_at(epoch, batch)
        set_kl_weight(self.model, self.beta / self.num_examples)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._apply(self._epoch, batch)

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            logs["kl_beta"] = self.beta

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["kl_beta"] = self.beta


class SparsityMonitor(keras.callbacks.Callback):
    """Logs the sparsity the posterior implies, per layer, at the end of every epoch.

    Adds ``sparsity`` (all prunable kernels) and ``sparsity/<layer name>`` to the
    epoch logs (so to ``History`` and TensorBoard) and keeps every epoch's
    :class:`SparsityReport` in ``self.reports``.

    Args:
        criterion: ``"auto"``, ``"snr"`` or ``"log_alpha"`` (see :func:`compute_masks`).
        threshold: float or None (the criterion's default).
        verbose: 0 or 1; 1 prints one line per epoch.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseVariationalDropout(2, activation="softmax", seed=0)])
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> monitor = tfbnn.callbacks.SparsityMonitor()
        >>> history = model.fit(x, y, epochs=2, callbacks=[tfbnn.KLAnnealing(len(x)), monitor], verbose=0)
        >>> len(history.history["sparsity"]), len(monitor.reports)   # one value and report per epoch
        (2, 2)
    """

    def __init__(self, criterion="auto", threshold=None, verbose=0):
        super().__init__()
        if criterion not in pruning.CRITERIA:
            raise ValueError(f"Expected `criterion` in {pruning.CRITERIA}. Received: criterion={criterion!r}")
        if threshold is not None:
            pruning.check_threshold("snr" if criterion == "snr" else "log_alpha", threshold)
        self.criterion = criterion
        self.threshold = threshold
        self.verbose = verbose
        self.reports = []

    def on_train_begin(self, logs=None):
        pruning.require_prunable_layers(self.model)

    def on_epoch_end(self, epoch, logs=None):
        report = pruning.sparsity_report(self.model, criterion=self.criterion, threshold=self.threshold)
        self.reports.append(report)
        if logs is not None:
            logs["sparsity"] = report.sparsity
            for row in report.layers:
                logs[f"sparsity/{row.name}"] = row.sparsity
        if self.verbose:
            per_layer = ", ".join(f"{r.name} {100 * r.sparsity:.1f}%" for r in report.layers)
            print(f"epoch {epoch + 1}: sparsity {100 * report.sparsity:.2f}% ({per_layer})")


class NaNGuard(keras.callbacks.TerminateOnNaN):
    """``keras.callbacks.TerminateOnNaN`` that remembers where the loss stopped being finite.

    After training, ``where`` is ``None`` or ``(epoch, batch, loss)`` (1-based) of the
    first non-finite batch loss, and :meth:`message` says it in words, so a failed run
    can report where training diverged.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.full((8, 2), np.nan, "float32")            # NaN inputs: the loss becomes NaN
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> guard = tfbnn.callbacks.NaNGuard()
        >>> _ = model.fit(x, np.zeros(8), epochs=3, callbacks=[guard], verbose=0)
        Batch 0: Invalid loss, terminating training
        >>> guard.message()
        'the loss became nan at epoch 1, batch 1'
    """

    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.where = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and self.where is None and not math.isfinite(float(loss)):
            self.where = (self.epoch + 1, batch + 1, float(loss))
        super().on_batch_end(batch, logs)

    def message(self):
        """``"the loss became nan at epoch E, batch B"``, or ``""`` when training stayed finite."""
        if self.where is None:
            return ""
        epoch, batch, loss = self.where
        return f"the loss became {loss} at epoch {epoch}, batch {batch}"


class EpochTimer(keras.callbacks.Callback):
    """Adds ``seconds``, the wall time of the epoch, to the epoch logs (and so to ``History``)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["seconds"] = time.perf_counter() - self._start
