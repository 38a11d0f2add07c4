"""Recipes and the one training routine of tfbnn.

A :class:`Recipe` is a declarative, JSON-serializable description of a training
run (model and method, dataset and hold-out, optimizer, learning-rate schedule,
epochs, batch size, KL schedule and ``beta``, samples per step, evaluation samples,
seed); :func:`run` fits, evaluates and records it. The built-in recipes
(:data:`RECIPES`) reproduce the seed studies' protocols as published.

Layering: this package sits above the core (layers, schedules, callbacks,
inference, metrics), :mod:`tfbnn.models` and :mod:`tfbnn.datasets`, and below
:mod:`tfbnn.tuning`, :mod:`tfbnn.experiments` and the command line, which all use it.

Example:
    >>> import os, tempfile
    >>> import tfbnn.training as training
    >>> out = tempfile.mkdtemp()
    >>> recipe = training.get_recipe("digits-bbb-mlp")
    >>> result = training.run(recipe.quick(), output_dir=os.path.join(out, "run"),  # a few steps
    ...                       verbose=0, jit_compile=False)                       # no XLA compile
    digits-bbb-mlp: mlp_bbb ...
    Wrote 6 files to .../run/
    >>> sorted(os.path.basename(path) for path in result.files)
    ['history.csv', 'history.json', 'learning_curves.png', 'model.keras', 'recipe.json', 'results.json']
    >>> sorted(result.test)[:5]
    ['accuracy', 'aleatoric', 'brier', 'confidence', 'ece']
    >>> path = training.save_recipe(recipe.replace(epochs=50), os.path.join(out, "my_recipe.json"))
    >>> training.load_recipe(path).epochs                  # `tfbnn run my_recipe.json` runs it
    50
"""

import importlib

from tfbnn._internal import deprecation
from tfbnn.training.recipe import KL_SCHEDULES, LR_SCHEDULES, OPTIMIZERS, RECIPE_METHODS, Recipe, load_recipe, save_recipe
from tfbnn.training.recipes import RECIPES, get_recipe, recipe_names, resolve
from tfbnn.training.run import (
    DEFAULT_ROOT,
    SHIFT_GAMMA,
    RunResult,
    arrays,
    fit_model,
    build_model,
    convert_model,
    deterministic_version,
    fit_temperature,
    interpretation,
    load_data,
    results_table,
    run,
)

_OPTIM = ("LinearRamp", "kl_schedule", "learning_rate", "make_optimizer", "weight_decay_exclusions")


def _lazy(name):  # the Keras-side helpers load on first use: recipes stay TensorFlow-free
    if name in _OPTIM or name == "optim":
        module = importlib.import_module("tfbnn.training.optim")
        return module if name == "optim" else getattr(module, name)
    raise AttributeError(f"module 'tfbnn.training' has no attribute {name!r}")


__getattr__ = deprecation.renamed(__name__, {"METHODS": "RECIPE_METHODS"}, fallback=_lazy)


__all__ = [
    "Recipe",
    "RunResult",
    "run",
    "fit_model",
    "RECIPES",
    "get_recipe",
    "recipe_names",
    "resolve",
    "load_recipe",
    "save_recipe",
    "build_model",
    "convert_model",
    "deterministic_version",
    "load_data",
    "arrays",
    "results_table",
    "interpretation",
    "fit_temperature",
    "make_optimizer",
    "learning_rate",
    "kl_schedule",
    "weight_decay_exclusions",
    "LinearRamp",
    "OPTIMIZERS",
    "LR_SCHEDULES",
    "KL_SCHEDULES",
    "RECIPE_METHODS",
    "SHIFT_GAMMA",
    "DEFAULT_ROOT",
]
