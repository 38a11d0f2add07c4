"""Continual learning: the posterior after one task is the prior of the next.

Variational continual learning (VCL; Nguyen, Li, Bui, Turner 2018) learns tasks
``D_1, D_2, ...`` in sequence without storing them. Bayes' rule gives the posterior
after ``t`` tasks recursively, ``p(theta | D_1..t) ~ p(theta | D_1..t-1) p(D_t | theta)``,
and VCL projects each step back onto the mean-field Gaussian family (eq. 4)::

    q_t(theta) = argmin_{q} KL(q(theta) || (1 / Z_t) q_{t-1}(theta) p(D_t | theta)),
    q_0(theta) = p(theta).

Up to ``log Z_t`` this is the negative ELBO of task ``t`` with ``q_{t-1}`` as its prior,
``-E_q[log p(D_t | theta)] + KL(q || q_{t-1})``: ordinary Bayes-by-Backprop training
whose prior is the previous posterior, frozen. In tfbnn's ELBO convention the per-example
loss is ``mean NLL + beta KL(q || q_{t-1}) / N_t`` with ``N_t`` task ``t``'s training
examples (``tfbnn.KLAnnealing(num_examples=N_t)``, ``beta = 1`` for the true ELBO).

:func:`posterior_as_prior` performs the step between tasks: every Bayesian layer's
``kernel_prior`` (and ``bias_prior``) becomes a :class:`tfbnn.priors.Posterior` holding
its current posterior means and standard deviations as constants; the posterior itself
is untouched, so training continues from it, and the KL is 0 right after the call. The
KL stays in closed form, per weight and summed (see :class:`tfbnn.priors.Posterior`).

Supported layers: the Bayes-by-Backprop families with a mean-field Gaussian posterior,
``DenseReparameterization``, ``DenseFlipout``, ``DenseLocalReparameterization``,
``Conv1DReparameterization``, ``Conv1DFlipout``, ``Conv2DReparameterization``,
``Conv2DFlipout`` and ``GravesDense`` (either posterior parameterization). Not supported
(:func:`posterior_as_prior` raises a ValueError naming them):

* variational dropout (``DenseVariationalDropout``, ``Conv2DVariationalDropout``): the
  log-uniform prior is built into the layer and its KL is an approximation in ``log alpha``
  alone (Molchanov et al. 2017, eq. 14); the layer takes no other prior;
* iBNN node layers (``NodeDense``, ``NodeConv2D``, ``NodeNoise``): the weights are point
  estimates and the node noise has a mixture posterior, with no closed-form KL to a mixture;
* MC dropout (``MCDropout``, ``MCSpatialDropout2D``): no posterior distribution, no KL.

Deterministic Keras layers in the model (``keras.layers.Dense``, normalization) have no
prior; they are simply trained further. :func:`forgetting_summary` turns a matrix of
accuracies "after task t, on task j" into the usual continual-learning numbers.

Example::

    for t, (x, y) in enumerate(tasks):
        if t > 0:
            tfbnn.continual.posterior_as_prior(model)      # q_{t-1} becomes the prior
        model.compile("adam", "sparse_categorical_crossentropy")
        model.fit(x, y, epochs=50, callbacks=[tfbnn.KLAnnealing(num_examples=len(x))])

``tfbnn vcl-split-digits`` runs the split-digits study (VCL against fine-tuning).

Reference:
    Nguyen, Li, Bui, Turner. Variational Continual Learning. ICLR 2018.
"""

import keras
import numpy as np

from tfbnn import utils
from tfbnn._internal import checks
from tfbnn.layers.mean_field import MeanFieldGaussian

__all__ = ["posterior_as_prior", "supports_posterior_prior", "forgetting_summary"]


def supports_posterior_prior(layer):
    """Whether :func:`posterior_as_prior` can freeze ``layer``'s posterior as its prior
    (the Bayes-by-Backprop dense and convolution layers, ``GravesDense``)."""
    return isinstance(layer, MeanFieldGaussian)


def _stochastic_layers(model):
    if isinstance(model, (list, tuple)):
        if not model:
            raise ValueError("Expected `model` to be a Keras model or layer, or a non-empty list of them. "
                             "Received: model=[]")
        found = []
        for item in model:
            found.extend(layer for layer in utils.stochastic_layers(item) if layer not in found)
        return found
    return utils.stochastic_layers(model)


def posterior_as_prior(model):
    """Makes every Bayesian layer's current posterior its prior (VCL, Nguyen et al. 2018, eq. 4).

    For each layer, ``kernel_prior`` (and ``bias_prior`` for a Bayesian bias) becomes
    ``tfbnn.priors.Posterior(mu, sigma)`` of its current posterior ``N(mu, sigma^2)``,
    frozen as constants. Nothing is re-initialized: the next ``fit`` starts from the
    posterior and minimises ``mean NLL + beta KL(q || q_old) / N`` for the new task's
    ``N``. Keras' cached step functions of ``model`` are dropped, so the next
    ``fit`` / ``evaluate`` / ``predict`` traces the new priors (other models sharing
    these layers must be compiled again, or passed here too).

    Multi-head models: pass only the part trained so far (the shared body and the heads
    of earlier tasks); a head not yet trained keeps its original prior.

    Args:
        model: a Keras model or layer, or a list of them, after training on a task.

    Returns:
        The list of layers whose priors were set.

    Raises:
        ValueError: ``model`` has no Bayesian layer, a layer is not built, or it holds a
            stochastic layer without a mean-field Gaussian posterior (variational
            dropout, iBNN node layers, MC dropout; named in the message).

    Example:
        >>> import keras, tfbnn
        >>> model = keras.Sequential([keras.Input((3,)), tfbnn.DenseFlipout(2, kl_weight=0.1, seed=0)])
        >>> layers = tfbnn.continual.posterior_as_prior(model)
        >>> type(layers[0].kernel_prior).__name__, layers[0].kernel_prior.shape
        ('Posterior', (3, 2))
        >>> abs(float(tfbnn.kl_divergence(model))) < 1e-6      # the posterior is the prior
        True
    """
    layers = _stochastic_layers(model)
    unsupported = [layer for layer in layers if not supports_posterior_prior(layer)]
    if unsupported:
        names = ", ".join(f"'{layer.name}' ({type(layer).__name__})" for layer in unsupported)
        raise ValueError(
            "posterior_as_prior supports the Bayes-by-Backprop layers with a mean-field Gaussian posterior "
            "(Dense/Conv1D/Conv2D Reparameterization and Flipout, DenseLocalReparameterization, GravesDense); "
            "variational dropout, iBNN node layers and MC dropout have no such posterior and prior. "
            f"Received: model with unsupported layers {names}"
        )
    if not layers:
        raise ValueError(f"Expected `model` to contain a Bayesian layer. Received: model={model!r}")
    unbuilt = [layer.name for layer in layers if not layer.built]
    if unbuilt:
        raise ValueError(f"Expected `model` to be built (call it on data first). Received: unbuilt layers {unbuilt}")
    for layer in layers:
        layer.posterior_as_prior()
    for item in model if isinstance(model, (list, tuple)) else [model]:
        if isinstance(item, keras.Model):
            utils.reset_compiled_functions(item)
    return layers


def _learned_at(learned_at, num_tasks, num_columns):
    if learned_at is None:
        if num_columns != num_tasks:
            raise ValueError(f"Expected `learned_at` when `accuracy` has {num_columns} columns for {num_tasks} "
                             "tasks (one column per task needs a square matrix). Received: learned_at=None")
        return np.arange(num_tasks)
    a = checks.array("learned_at", learned_at)
    if (a.shape != (num_columns,) or a.dtype.kind not in "iu" or a.size and (a.min() < 0 or a.max() >= num_tasks)):
        raise ValueError(f"Expected `learned_at` to be {num_columns} task indices in [0, {num_tasks}). "
                         f"Received: learned_at={learned_at!r}")
    return a.astype(int)


def forgetting_summary(accuracy, threshold=0.5, learned_at=None):
    """Continual-learning summary of an accuracy matrix.

    ``accuracy[t, j]`` is the accuracy on task (or class) ``j`` after training on
    tasks ``0..t``; column ``j`` is trained at task ``learned_at[j]`` (default ``j``).
    With ``T`` tasks, ``L = learned_at`` and ``R = accuracy``:

    * ``average_accuracy``: ``mean_j R[T-1, j]``, every column after the last task;
    * ``average_accuracy_per_task``: after each task ``t``, the mean over the columns
      trained so far, ``mean_{j: L[j] <= t} R[t, j]``;
    * ``forgotten``: the columns ``j`` trained before the last task that were learned,
      ``R[L[j], j] >= threshold``, and are below it at the end, ``R[T-1, j] < threshold``
      (``never_learned``: those below it already right after their task);
    * ``forgetting``: per such column, ``max_{L[j] <= l < T-1} R[l, j] - R[T-1, j]``
      (Chaudhry et al. 2018), and ``mean_forgetting`` over them;
    * ``backward_transfer``: ``mean_j R[T-1, j] - R[L[j], j]`` over them
      (Lopez-Paz & Ranzato 2017; negative when the model forgets).

    Args:
        accuracy: ``(T, K)`` array of accuracies in [0, 1]; entries for columns not yet
            trained are not read (they may be NaN).
        threshold: float in (0, 1], what "learned" means. Default 0.5.
        learned_at: ``K`` task indices, or None for ``K == T`` (column ``j`` is task ``j``).

    Returns:
        A dict of the numbers above (plain Python floats, ints and lists).

    Example:
        >>> import tfbnn
        >>> R = [[0.99, 0.10, 0.00],
        ...      [0.40, 0.98, 0.00],
        ...      [0.60, 0.30, 0.97]]
        >>> s = tfbnn.continual.forgetting_summary(R, threshold=0.5)
        >>> s["forgotten"], round(s["average_accuracy"], 4), round(s["backward_transfer"], 4)
        ([1], 0.6233, -0.535)
    """
    r = checks.array("accuracy", accuracy).astype(float)
    if r.ndim != 2 or r.shape[0] < 1:
        raise ValueError(f"Expected `accuracy` to be a (tasks, columns) matrix. Received: accuracy of shape {r.shape}")
    threshold = checks.number("threshold", threshold, low=0, high=1, low_open=True, what="a number in (0, 1]")
    num_tasks, num_columns = r.shape
    learned = _learned_at(learned_at, num_tasks, num_columns)
    last = num_tasks - 1
    used = np.array([[t >= learned[j] for j in range(num_columns)] for t in range(num_tasks)])
    if not np.all(np.isfinite(r[used])) or np.any((r[used] < 0) | (r[used] > 1)):
        raise ValueError("Expected `accuracy` to hold accuracies in [0, 1] for every trained column. "
                         f"Received: {checks.value_range('accuracy', r[used])}")
    earlier = [j for j in range(num_columns) if learned[j] < last]
    at_learning = {j: r[learned[j], j] for j in earlier}
    was_learned = [j for j in earlier if at_learning[j] >= threshold]
    forgetting = {j: float(r[learned[j]:last, j].max() - r[last, j]) for j in earlier}
    return {
        "threshold": threshold,
        "average_accuracy": float(r[last].mean()),
        "average_accuracy_per_task": [float(r[t, used[t]].mean()) for t in range(num_tasks)],
        "forgotten": [j for j in was_learned if r[last, j] < threshold],
        "num_forgotten": sum(bool(r[last, j] < threshold) for j in was_learned),
        "never_learned": [j for j in earlier if at_learning[j] < threshold],
        "forgetting": [forgetting[j] for j in earlier],
        "mean_forgetting": float(np.mean(list(forgetting.values()))) if earlier else 0.0,
        "backward_transfer": float(np.mean([r[last, j] - at_learning[j] for j in earlier])) if earlier else 0.0,
    }
