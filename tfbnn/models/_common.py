"""What every zoo builder shares: argument checks, the classification head, the prologue."""

import keras

from tfbnn._internal import checks
from tfbnn.models.methods import get_factory

__all__ = ["check_num_classes", "check_input_shape", "classifier_head", "prologue"]


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
    """The task head: a dense layer of the model's method with a softmax (probabilities).

    Bayesian with either ``bayesian_layers``; for ``mc_dropout`` with ``"last"`` the
    model's one MC dropout layer (``<name>_dropout``) comes in front of it.
    """
    x = factory.head_dropout(x, name=f"{name}_dropout")
    return factory.head(check_num_classes(num_classes), activation="softmax", name=name)(x)


def prologue(method, options, num_examples, seed, num_classes, input_shape, rank, min_side, model,
             bayesian_layers="all", dtype=None):
    """Validates the common arguments; returns ``(factory, keras.Input)``."""
    check_num_classes(num_classes)
    shape = check_input_shape(input_shape, rank, min_side, model)
    factory = get_factory(method, options, num_examples, seed, bayesian_layers)
    return factory, keras.Input(shape, dtype=dtype, name="inputs")


def model_name(name, default, factory):
    return name or f"{default}_{factory.method}"
