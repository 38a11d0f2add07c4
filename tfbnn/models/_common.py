"""What every zoo builder shares: its common arguments, their checks, the input, the head and the model.

A builder's signature holds ``method`` and its family's own arguments; everything else
comes as ``**kwargs`` and goes to :func:`start`, which takes the common arguments out
(``num_classes``, ``input_shape``, ``num_examples``, ``seed``, ``bayesian_layers``, ``name``;
documented once, in :func:`tfbnn.models.build`), treats the rest as the method's options,
checks them all and returns a :class:`Build`: the :class:`~tfbnn.models.LayerFactory`, the
``keras.Input`` and :meth:`Build.classifier` / :meth:`Build.model`, which end every builder.
"""

import keras

from tfbnn import layers
from tfbnn._internal import checks
from tfbnn.models.methods import get_factory

__all__ = ["Build", "start", "check_num_classes", "check_input_shape", "classifier_head", "hidden_dense"]


def check_num_classes(num_classes):
    return checks.integer("num_classes", num_classes, 2)


def check_input_shape(input_shape, rank=None, min_side=1, model=""):
    """A tuple of positive ints; of length ``rank`` (channels last) with spatial sides >= ``min_side``."""
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else None
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(
            f"Expected `input_shape` to be a tuple of positive integers (one example, no batch axis). "
            f"Received: input_shape={input_shape!r}"
        )
    if rank is not None and len(shape) != rank:
        what = "(height, width, channels)" if rank == 3 else f"of rank {rank}"
        raise ValueError(f"{model} expects `input_shape` {what}. Received: input_shape={input_shape!r}")
    if rank == 3 and min(shape[:2]) < min_side:
        raise ValueError(
            f"{model} needs images of at least {min_side}x{min_side} with these settings. "
            f"Received: input_shape={input_shape!r}"
        )
    return shape


def classifier_head(x, factory, num_classes, name="predictions"):
    """The task head: a dense layer of the model's method with a softmax (probabilities), or the
    method's own output layers (:meth:`~tfbnn.models.LayerFactory.classify`).

    Bayesian with either ``bayesian_layers``; for ``mc_dropout`` with ``"last"`` the
    model's one MC dropout layer (``<name>_dropout``) comes in front of it.
    """
    x = factory.head_dropout(x, name=f"{name}_dropout")
    return factory.classify(x, check_num_classes(num_classes), name=name)


def hidden_dense(x, factory, units, activation, name, dropout_name):
    """A hidden dense layer of the body and, for ``mc_dropout``, the MC dropout after it."""
    x = factory.dense(units, activation=activation, name=name)(x)
    return factory.dropout(x, name=dropout_name)


class Build:
    """One zoo model being built: its method's factory, its input and its common arguments.

    Made by :func:`start`. Attributes: ``factory`` (a :class:`~tfbnn.models.LayerFactory`),
    ``inputs`` (the ``keras.Input``), ``num_classes`` and ``name`` (as given).
    """

    def __init__(self, factory, inputs, num_classes, name):
        self.factory, self.inputs, self.num_classes, self.name = factory, inputs, num_classes, name

    @property
    def features(self):
        """What the body starts from: ``inputs``, repeated for the members of an ensemble
        (:class:`tfbnn.layers.EnsembleTile`) when the factory has one."""
        if self.factory.ensemble is None:
            return self.inputs
        return layers.EnsembleTile(self.factory.ensemble_size, name="ensemble_tile")(self.inputs)

    def classifier(self, x, default_name):
        """The softmax head on ``x`` (:func:`classifier_head`) and the model (:meth:`model`)."""
        return self.model(classifier_head(x, self.factory, self.num_classes), default_name)

    def model(self, outputs, default_name):
        """The functional ``keras.Model``, named ``name`` or ``<default_name>_<method>``; an ensemble's
        outputs averaged over its members (:class:`tfbnn.layers.EnsembleMean`)."""
        if self.factory.ensemble is not None:
            outputs = layers.EnsembleMean(self.factory.ensemble_size, name="ensemble_mean")(outputs)
            default_name = f"{default_name}_{self.factory.ensemble}"
        return keras.Model(self.inputs, outputs, name=self.name or f"{default_name}_{self.factory.method}")


def start(method, kwargs, model, *, rank=3, min_side=1, num_classes=10, input_shape=(32, 32, 3), fixed_shape=None,
          classifier=True, dtype=None, ensembles=False):
    """Checks a builder's common arguments and the method's options; returns a :class:`Build`.

    Args:
        method: the builder's ``method``.
        kwargs: the builder's ``**kwargs``: the common arguments and the method's options.
        model: the model's name in error messages.
        rank, min_side: the rank ``input_shape`` must have (None: any) and, for images, the
            smallest side.
        num_classes, input_shape: the family's defaults of these common arguments.
        fixed_shape: the input shape of a family that takes no ``input_shape`` (then an
            ``input_shape`` argument is an unknown option).
        classifier: False when the model has no ``num_classes`` outputs (a regression MLP):
            ``num_classes`` is then not checked.
        dtype: the input's dtype (None: float).
        ensembles: True for a builder whose body starts from :attr:`Build.features`: it then
            takes ``ensemble`` and ``ensemble_size`` (:class:`~tfbnn.models.LayerFactory`).
    """
    common = {"num_classes": num_classes, "input_shape": input_shape, "num_examples": None, "seed": None,
              "bayesian_layers": "all", "name": None}
    if ensembles:
        common.update(ensemble=None, ensemble_size=4)
    if fixed_shape is not None:
        del common["input_shape"]
    options = {k: v for k, v in kwargs.items() if k not in common}
    common.update((k, v) for k, v in kwargs.items() if k in common)
    if classifier:
        check_num_classes(common["num_classes"])
    shape = check_input_shape(common.get("input_shape", fixed_shape), rank, min_side, model)
    ensemble = {k: common[k] for k in ("ensemble", "ensemble_size") if k in common}
    factory = get_factory(method, options, common["num_examples"], common["seed"], common["bayesian_layers"],
                          **ensemble)
    return Build(factory, keras.Input(shape, dtype=dtype, name="inputs"), common["num_classes"], common["name"])
