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

Modules (everything below is also importable from ``tfbnn.tuning``):

=======================  ===================================================================
module                   what it holds
=======================  ===================================================================
:mod:`.spaces`           the search spaces (:class:`BlundellPriorSpace`, :class:`IBNNSpace`),
                         their value checks, :data:`OBJECTIVES`, :func:`get_objective`,
                         :func:`make_schedule`, :func:`split_validation`
:mod:`.hypermodels`      :class:`BayesianMLPHyperModel`, :class:`IBNNHyperModel` (models
                         from :func:`tfbnn.models.mlp`)
:mod:`.tuners`           :class:`GridSearch`, :class:`RandomSearch` and their durable oracles,
                         :class:`Search`, :data:`SEARCHES`, :func:`get_search`,
                         :func:`distributed_role`
:mod:`.records`          KerasTuner's JSON records (:func:`write_record`),
                         :func:`trial_records`, :func:`write_csv`, :func:`plot_prior_grid`
:mod:`.launch`           :func:`free_port`, :func:`wait_for_chief`, :func:`launch_distributed`
=======================  ===================================================================

References:
    Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
    Networks. ICML 2015 (sec. 5.1, the prior grid).
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022.
"""

from tfbnn.tuning.hypermodels import LAYER_NAMES, BayesianMLPHyperModel, IBNNHyperModel
from tfbnn.tuning.launch import free_port, launch_distributed, tuner_id, wait_for_chief
from tfbnn.tuning.records import plot_prior_grid, trial_records, write_csv, write_record
from tfbnn.tuning.spaces import (
    BLUNDELL_NEG_LOG_SIGMA1,
    BLUNDELL_NEG_LOG_SIGMA2,
    BLUNDELL_PI,
    OBJECTIVES,
    SCHEDULE_NAMES,
    BlundellPriorSpace,
    IBNNSpace,
    get_objective,
    make_schedule,
    split_validation,
)
from tfbnn.tuning.tuners import (
    SEARCHES,
    GridSearch,
    GridSearchOracle,
    RandomSearch,
    RandomSearchOracle,
    Search,
    distributed_role,
    get_search,
)

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
    "LAYER_NAMES",
    "SCHEDULE_NAMES",
    "GridSearchOracle",
    "RandomSearchOracle",
    "tuner_id",
    "write_record",
]
