"""The tuners of the tfbnn searches: resumable, distributable grid and random search.

:class:`GridSearch` and :class:`RandomSearch` are KerasTuner's, with durable records
(written whole, saved again after a trial ends, a reload that re-runs only what did
not finish), a grid order derived from the saved trials (KerasTuner 1.4.8's own
``GridSearch`` cannot resume, keras-team/keras-tuner#1055) and an ``overwrite`` only
the chief may do. :data:`SEARCHES` names each search's space, HyperModel and tuner.
"""

import os
import time
import warnings

import keras_tuner

from tfbnn.tuning.hypermodels import BayesianMLPHyperModel, IBNNHyperModel
from tfbnn.tuning.launch import tuner_id
from tfbnn.tuning.records import write_record
from tfbnn.tuning.spaces import BlundellPriorSpace, IBNNSpace, get_objective

__all__ = [
    "SEARCHES",
    "Search",
    "get_search",
    "GridSearch",
    "RandomSearch",
    "GridSearchOracle",
    "RandomSearchOracle",
    "distributed_role",
]


def distributed_role():
    """``"chief"``, ``"worker"`` or None (not distributed), from KerasTuner's environment variables."""
    if "KERASTUNER_ORACLE_IP" not in os.environ:
        return None
    return "chief" if "chief" in os.environ.get("KERASTUNER_TUNER_ID", "") else "worker"


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
        write_record(self._get_oracle_fname(), self.get_state())

    def _save_trial(self, trial):
        write_record(os.path.join(self._get_trial_dir(trial.trial_id), "trial.json"), trial.get_state())

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
    """Tuner mixin: the oracle from ``oracle_class``, only the chief may overwrite, atomic
    records, a calm wait while idle. Arguments as ``keras_tuner.GridSearch``'s."""

    #: The durable oracle this tuner runs.
    oracle_class = None
    #: Seconds a worker waits before asking again when the oracle has no trial free yet.
    idle_wait = 0.05

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
        overwrite=False,
        **kwargs,
    ):
        if overwrite and distributed_role() == "worker":
            warnings.warn(
                f"overwrite=True ignored on the worker {tuner_id()!r}: only the chief may wipe "
                "the project folder.",
                stacklevel=2,
            )
            overwrite = False
        self._idle = False
        oracle = self.oracle_class(
            objective=get_objective(objective),
            max_trials=max_trials,
            seed=seed,
            hyperparameters=hyperparameters,
            tune_new_entries=tune_new_entries,
            allow_new_entries=allow_new_entries,
            max_retries_per_trial=max_retries_per_trial,
            max_consecutive_failed_trials=max_consecutive_failed_trials,
        )
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
        write_record(self._get_tuner_fname(), self.get_state())


class GridSearch(_TunerMixin, keras_tuner.Tuner):
    """KerasTuner's grid search (every combination exactly once), resumable and distributable.

    Same arguments as ``keras_tuner.GridSearch``; the objective may be a name of
    :data:`OBJECTIVES`. See :class:`GridSearchOracle` for what differs.
    """

    oracle_class = GridSearchOracle


class RandomSearch(_TunerMixin, keras_tuner.Tuner):
    """KerasTuner's random search with the same chief-only overwrite and atomic records.

    Same arguments as ``keras_tuner.RandomSearch`` (``max_trials`` default 10).
    """

    oracle_class = RandomSearchOracle

    def __init__(self, hypermodel=None, objective="val_accuracy", max_trials=10, *args, **kwargs):
        super().__init__(hypermodel, objective, max_trials, *args, **kwargs)


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
