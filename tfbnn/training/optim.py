"""What a recipe's optimizer, learning-rate schedule and KL schedule become in Keras.

* :func:`learning_rate` -- a float, or a ``keras.optimizers.schedules.LearningRateSchedule``
  counted in optimizer steps (epochs x ``steps_per_epoch``).
* :func:`make_optimizer` -- Adam or SGD (momentum, Nesterov), decoupled weight decay
  on the deterministic weights only, and iBNN's second learning rate.
* :func:`kl_schedule` -- the :mod:`tfbnn.schedules` object whose ``beta`` ends at
  the recipe's ``beta``.
"""

import keras

from tfbnn import ibnn, methods, schedules, utils
from tfbnn.schedules import LinearRamp

__all__ = ["learning_rate", "make_optimizer", "kl_schedule", "weight_decay_exclusions", "LinearRamp"]


def learning_rate(recipe, steps_per_epoch):
    """The recipe's learning rate: a float (``constant``) or a step-based schedule.

    ``step``: ``lr * lr_decay^k`` after the k-th epoch of ``lr_boundaries``; ``cosine``:
    half-cosine from ``lr`` to ``lr_final * lr`` over all epochs (Loshchilov and Hutter
    2017, no restarts); ``linear``: ``lr`` until ``lr_boundaries[0]``, then linear to
    ``lr_final * lr`` at ``lr_boundaries[1]`` (default: 0 and all epochs), then constant.
    """
    lr, total = recipe.learning_rate, max(1, recipe.epochs * steps_per_epoch)
    if recipe.lr_schedule == "constant":
        return lr
    if recipe.lr_schedule == "step":
        boundaries = [int(round(b * steps_per_epoch)) for b in recipe.lr_boundaries]
        values = [lr * recipe.lr_decay**k for k in range(len(boundaries) + 1)]
        return keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
    if recipe.lr_schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(lr, decay_steps=total, alpha=recipe.lr_final)
    start, end = recipe.lr_boundaries or (0.0, recipe.epochs)
    return LinearRamp(lr, int(round(start * steps_per_epoch)), max(1, int(round(end * steps_per_epoch))),
                      recipe.lr_final)


def weight_decay_exclusions(model):
    """The variables weight decay must not touch: every posterior parameter.

    Bayes-by-Backprop, variational-dropout and Graves layers hold only posterior
    parameters (their regularizer is the KL); iBNN node layers hold deterministic
    weights, which decay, and node posteriors, which do not.
    """
    nodes = {id(layer) for layer in ibnn.node_layers(model)}
    others = [layer for layer in utils.bayesian_layers(model) if id(layer) not in nodes]
    return ibnn.variational_weights(model) + [w for layer in others for w in layer.trainable_weights]


def make_optimizer(recipe, steps_per_epoch, model=None, num_examples=None):
    """The recipe's Keras optimizer (call before ``model.compile``).

    A method that samples with its optimizer (:attr:`tfbnn.methods.Method.sampler`: ``csgmcmc``)
    gets its sampler instead, with the recipe's ``learning_rate`` as the initial step size over
    ``epochs * steps_per_epoch`` steps.

    Args:
        recipe: a :class:`tfbnn.training.Recipe`.
        steps_per_epoch: int, training batches per epoch (learning-rate schedules).
        model: the built model; needed when ``weight_decay > 0`` (to exclude the
            posterior parameters) and for iBNN's two learning rates.
        num_examples: int, the training examples ``N`` (a sampler's noise scale); needed by a
            method with a sampler.
    """
    method = methods.get(recipe.method)
    if method.sampler is not None:
        if num_examples is None:
            raise ValueError(f"Method {recipe.method!r} samples with its optimizer, whose noise scale needs the "
                             "number of training examples. Received: num_examples=None")
        if recipe.weight_decay or recipe.lr_schedule != "constant":
            raise ValueError(f"Method {recipe.method!r} has its own step-size schedule and Gaussian prior "
                             f"(prior_precision). Received: weight_decay={recipe.weight_decay}, "
                             f"lr_schedule={recipe.lr_schedule!r}")
        return method.sampler(method.resolve_options(recipe.method_options), recipe.learning_rate,
                              max(1, steps_per_epoch * recipe.epochs), num_examples, recipe.seed)
    lr = learning_rate(recipe, steps_per_epoch)
    decay = recipe.weight_decay or None
    if recipe.optimizer == "sgd":
        opt = keras.optimizers.SGD(lr, momentum=recipe.momentum, nesterov=recipe.nesterov, weight_decay=decay)
    else:
        opt = keras.optimizers.Adam(lr, weight_decay=decay)
    if decay and model is not None:
        excluded = weight_decay_exclusions(model)
        if excluded:
            opt.exclude_from_weight_decay(var_list=excluded)
    wrap = methods.get(recipe.method).wrap_optimizer  # iBNN: its node posteriors' own learning rate
    return opt if wrap is None else wrap(opt, recipe.variational_learning_rate)


def kl_schedule(name, ramp_epochs, beta=1.0, warmup_epochs=0.0):
    """The KL-weight schedule ``name`` ending at ``beta`` (see :mod:`tfbnn.schedules`).

    Args:
        name: ``constant`` (``beta`` throughout), ``linear`` / ``cosine`` (0 -> beta over
            ``ramp_epochs``), ``warmup`` (0 for ``warmup_epochs``, or half of
            ``ramp_epochs`` when that is 0, then linear), ``cyclic`` (ramps repeating every
            ``ramp_epochs / 2``), ``blundell`` (eq. 9 minibatch weights; ``beta`` must be 1).
        ramp_epochs: float > 0, in epochs.
        beta: float >= 0, the final weight.
        warmup_epochs: float >= 0.
    """
    if name == "constant":
        return schedules.Constant(beta)
    if name == "linear":
        return schedules.Linear(epochs=ramp_epochs, end=beta)
    if name == "warmup":
        warm = warmup_epochs or ramp_epochs / 2
        return schedules.WarmUp(warmup_epochs=warm, epochs=ramp_epochs if warmup_epochs else ramp_epochs / 2, end=beta)
    if name == "cosine":
        return schedules.Cosine(epochs=ramp_epochs, end=beta)
    if name == "cyclic":
        return schedules.Cyclic(cycle_epochs=ramp_epochs / 2, ratio=0.5, end=beta)
    if name == "blundell":
        if beta != 1.0:
            raise ValueError(f"The 'blundell' schedule fixes beta (eq. 9 weights average 1). Received: beta={beta}")
        return schedules.Blundell()
    return schedules.get(name)
