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
"""

import warnings

import keras

from tfbnn import _checks
from tfbnn import schedules as schedules_lib
from tfbnn.utils import bayesian_layers, set_kl_weight

__all__ = ["KLAnnealing"]


class KLAnnealing(keras.callbacks.Callback):
    """Sets ``kl_weight = beta / N`` on every Bayesian layer before each batch.

    ``beta`` follows ``schedule(epoch, batch, steps_per_epoch)`` (a pure function of
    the position in training), so after an interruption
    ``keras.callbacks.BackupAndRestore`` resumes with the same beta the
    uninterrupted run would have had. The current beta is logged as ``kl_beta``
    (progress bar per batch, ``History`` per epoch: the value at the epoch's last
    batch).

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
        >>> cb = tfbnn.KLAnnealing(num_examples=len(x_train), schedule=tfbnn.schedules.WarmUp(2, 5))
        >>> model.fit(x_train, y_train, epochs=10, callbacks=[cb])

    With ``fit(steps_per_execution=k)`` Keras calls batch hooks once per k steps,
    so beta changes every k batches.
    """

    def __init__(self, num_examples, schedule="linear", steps_per_epoch=None):
        super().__init__()
        self.num_examples = _checks.integer(
            "num_examples", num_examples, 1, what="a positive integer (N, the number of training examples)"
        )
        self.schedule = schedules_lib.get(schedule)
        self.steps_per_epoch = _checks.integer("steps_per_epoch", steps_per_epoch, 1, allow_none=True)
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
        self._apply(getattr(self.model, "_initial_epoch", 0) or 0, 0)

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
