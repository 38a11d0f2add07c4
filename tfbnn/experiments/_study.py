"""Studies as data: a :class:`Study` is its settings, its recipes and its analysis.

A study declares each setting once (:class:`Setting`: name, default, kind, help). From
that one declaration come the study's ``DEFAULTS``, its Python entry point
(``run_experiment(**settings)``), its checks (one set, :meth:`Setting.check`, through
:mod:`tfbnn._internal.checks`), its command line (``tfbnn <study>``, ``python -m
tfbnn.experiments.<module>``: :meth:`Study.add_arguments`, one option per setting) and its
``run(args)``. A setting named as a :class:`tfbnn.training.Recipe` field (or that names one
with ``recipe=``) takes that field's kind and help (:data:`RECIPE_FIELDS`).

A study runs in two steps: ``train(s, output_dir, verbose)`` trains the study's recipes
(``recipes(s)``: the list of :class:`tfbnn.training.Recipe` it runs, one
:func:`tfbnn.training.run` each) and returns their results; ``analyse(results, s,
output_dir, verbose)`` makes the tables and plots and returns the study's result dict with
its ``files``.

This module loads no NumPy or TensorFlow (``tfbnn <study> --help`` imports it); the checks
load :mod:`tfbnn._internal.checks` when a study runs.

Example:

```python
from tfbnn import training
from tfbnn.experiments import Setting, Study

def recipes(s):
    return [training.Recipe(name=f"{m}-mlp", method=m, epochs=s["epochs"], seed=s["seed"])
            for m in s["methods"]]

def train(s, output_dir, verbose):
    return [training.run(r, output_dir=f"{output_dir}/runs/{r.name}", verbose=0) for r in recipes(s)]

def analyse(results, s, output_dir, verbose):
    rows = [{"method": r.recipe.method, "nll": r.test["nll"]} for r in results]
    return {"rows": rows, "files": []}  # the tables and plots it writes

STUDY = Study(
    name="tiny-comparison", module="my_studies.tiny", description="BbB vs MC dropout on the digits.",
    settings=(Setting("methods", ("bbb", "mc_dropout"), "methods to compare", choices=("bbb", "mc_dropout"),
                      many=True, unique=True),
              Setting("epochs", 5), Setting("seed", 0)),
    recipes=recipes, train=train, analyse=analyse)
STUDY.run_experiment(epochs=1, methods=["bbb"])   # or STUDY.main(["--epochs", "1"]): the command line
```

``docs/guides/zoo-and-recipes.md`` ("A study is data") runs such a study.
"""

import argparse
import dataclasses
import os
import sys
import warnings

from tfbnn._internal import argtypes
from tfbnn.training import recipe as _recipe
from tfbnn.experiments import _common
from tfbnn.experiments._common import DEFAULT_ROOT

__all__ = ["Setting", "Study", "KINDS", "RECIPE_FIELDS", "COMMON_SETTINGS"]


def _number_in(what, accepts):
    """A parser of a finite number that ``accepts``; else "expected ``what``"."""

    def parse(text):
        value = argtypes.finite_float(text)
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def _init_scale(text):
    """``--init-scale``: a positive number or ``moped``."""
    return text if text == "moped" else argtypes.positive_float(text)


@dataclasses.dataclass(frozen=True)
class _Kind:
    """What a setting's value is: the command line's parser, the Python value's check
    (:mod:`tfbnn._internal.checks` ``integer`` with ``bounds = (minimum,)``, or ``number`` with its
    ``bounds = (low, high, low_open, high_open)``; else a name, a bool, ...) and, in words, several values."""

    parse: object
    check: str  # "integer", "number", "name", "bool", "init_scale", "recipe"
    plural: str
    bounds: tuple = ()


#: Setting kinds: name -> parser and check. Ranges as :mod:`tfbnn._internal.checks` words them.
KINDS = {
    "positive_int": _Kind(argtypes.positive_int, "integer", "positive integers", (1,)),
    "non_negative_int": _Kind(argtypes.non_negative_int, "integer", "non-negative integers", (0,)),
    "positive_float": _Kind(argtypes.positive_float, "number", "positive numbers", (0, None, True, False)),
    "non_negative_float": _Kind(argtypes.non_negative_float, "number", "non-negative numbers", (0, None, False, False)),
    "finite_float": _Kind(argtypes.finite_float, "number", "finite numbers", (None, None, False, False)),
    "open_unit": _Kind(argtypes.open_unit_interval, "number", "numbers in (0, 1)", (0, 1, True, True)),
    "rate": _Kind(argtypes.rate, "number", "numbers in [0, 1)", (0, 1, False, True)),
    "fraction": _Kind(_number_in("a number in [0, 1]", lambda v: 0 <= v <= 1), "number", "numbers in [0, 1]",
                      (0, 1, False, False)),
    "positive_fraction": _Kind(_number_in("a number in (0, 1]", lambda v: 0 < v <= 1), "number",
                               "numbers in (0, 1]", (0, 1, True, False)),
    "init_scale": _Kind(_init_scale, "init_scale", "positive numbers or 'moped'"),
    "name": _Kind(str, "name", "names"),
    "bool": _Kind(None, "bool", "bools"),
    "recipe": _Kind(str, "recipe", "recipes"),
}

#: Every setting a study may take by name: name -> (kind, None allowed, help). A setting of that
#: name (or, for a recipe field, with ``recipe=`` naming it) takes its kind and help.
_KNOWN_SETTINGS = {
    "dataset": ("name", False, "dataset (digits is offline; the tfds ones download once)"),
    "epochs": ("positive_int", False, "epochs per model"),
    "batch_size": ("positive_int", False, "minibatch size"),
    "learning_rate": ("positive_float", False, "Adam learning rate of the weights"),
    "variational_learning_rate": ("positive_float", False, "iBNN: Adam rate of the node parameters"),
    "pretrain_epochs": ("non_negative_int", False, "epochs of the deterministic model before conversion"),
    "warmup_epochs": ("non_negative_float", False, "epochs with beta = 0 after conversion"),
    "kl_epochs": ("positive_float", False, "epochs of the beta ramp 0 -> 1 after the warm-up"),
    "beta": ("non_negative_float", False, "final KL weight beta (1: the ELBO)"),
    "steps_per_epoch": ("positive_int", False, "full-batch steps per epoch"),
    "train_samples": ("positive_int", False, "samples per training step"),
    "eval_samples": ("positive_int", False, "Monte Carlo samples of the predictive"),
    "noise_std": ("positive_float", False, "noise std of the data and of the Gaussian likelihood"),
    "max_examples": ("positive_int", True, "at most N training examples (tfds datasets)"),
    "max_test_examples": ("positive_int", True, "at most N test examples (tfds datasets)"),
    "seed": ("non_negative_int", False, "seed of data and models"),
    "hidden_units": ("positive_int", False, "units per hidden layer"),
    "depth": ("positive_int", False, "hidden layers"),
    "num_components": ("positive_int", False, "iBNN mixture components"),
    "prior_stddev": ("positive_float", False, "iBNN prior N(1, S^2)"),
    "samples_per_component": ("positive_int", False, "test samples: K * n for both methods"),
    "dropout_rate": ("open_unit", False, "MC dropout rate"),
    "init_scale": ("init_scale", False, "initial posterior std after conversion: a number, or moped (delta * |w|)"),
    "moped_delta": ("positive_float", False, "MOPED delta"),
    "num_samples": ("positive_int", False, "Monte Carlo samples of the predictive"),
    "members": ("positive_int", False, "deep ensemble: members"),
    "num_points": ("positive_int", False, "training points"),
    "quick": ("bool", False, "a smoke run"),
}
#: The settings that are :class:`tfbnn.training.Recipe` fields (their kinds accept and reject what
#: ``Recipe`` does: ``tests/experiments/test_study.py`` checks it).
RECIPE_FIELDS = {name: value for name, value in _KNOWN_SETTINGS.items()
                 if name in {f.name for f in dataclasses.fields(_recipe.Recipe)}}
#: Settings several studies share that are not recipe fields.
COMMON_SETTINGS = {name: value for name, value in _KNOWN_SETTINGS.items() if name not in RECIPE_FIELDS}

_METAVARS = {"max_examples": "N", "max_test_examples": "N", "eval_samples": "T", "train_samples": "S",
             "num_components": "K", "prior_stddev": "S", "samples_per_component": "n", "num_samples": "T",
             "members": "M"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a study, declared once: its default, its check and its command-line option.

    Args:
        name: str, the keyword of ``run_experiment`` (``--name-with-dashes`` on the command line). A
            name of :data:`RECIPE_FIELDS` or :data:`COMMON_SETTINGS` brings its kind and help.
        default: the value when not given (a tuple for ``many``).
        help: str, the option's help; default: the recipe field's (:data:`RECIPE_FIELDS`) or the
            shared setting's (:data:`COMMON_SETTINGS`).
        kind: a name of :data:`KINDS`; default: the recipe field's, else ``"name"`` when
            ``choices`` are given.
        choices: names the value (each value, with ``many``) must be one of, or None.
        many: bool, a non-empty sequence of values (``nargs="+"``), held as a tuple.
        unique: bool, with ``many``: repeats dropped (first occurrence kept).
        allow_empty: bool, with ``many``: an empty sequence is allowed (``nargs="*"``).
        allow_none: bool, None is a value (default: the recipe field's).
        recipe: str or None, the :class:`tfbnn.training.Recipe` field this setting sets, when
            its name differs (its kind and help then apply).
        metavar: str or None, the option's value name in ``--help``.
        aliases: old names of the setting, accepted with a ``DeprecationWarning`` (Python) or a
            warning line (command line).

    Example:

    >>> from tfbnn.experiments import Setting
    >>> Setting("epochs", 40).help
    'epochs per model'
    >>> Setting("depths", (1, 2), "numbers of hidden layers", kind="positive_int", many=True).check((0,))
    Traceback (most recent call last):
    ...
    ValueError: Expected `depths` to be positive integers. Received: depths=(0,)
    """

    name: str
    default: object
    help: str = None
    kind: str = None
    choices: tuple = None
    many: bool = False
    unique: bool = False
    allow_empty: bool = False
    allow_none: bool = None
    recipe: str = None
    metavar: str = None
    aliases: tuple = ()

    def __post_init__(self):
        field = RECIPE_FIELDS.get(self.recipe or self.name) or COMMON_SETTINGS.get(self.name)
        if self.recipe is not None and field is None:
            raise ValueError(f"Expected `recipe` from {sorted(RECIPE_FIELDS)}. Received: recipe={self.recipe!r}")
        kind, allow_none, help_ = field if field else (None, False, "")
        set_ = object.__setattr__
        if self.kind is None:
            set_(self, "kind", "name" if self.choices is not None else kind)
        if self.kind not in KINDS:
            raise ValueError(f"Expected `kind` from {sorted(KINDS)}. Received: kind={self.kind!r} ({self.name})")
        if self.allow_none is None:
            set_(self, "allow_none", allow_none)
        if self.help is None:
            set_(self, "help", help_)
        if self.metavar is None and not self.choices:
            set_(self, "metavar", _METAVARS.get(self.recipe or self.name))

    # -- the Python side --------------------------------------------------------------------
    def check(self, value):
        """``value`` checked (tuples for ``many``; ints and floats as Python's); else a ValueError naming
        the setting."""
        if value is None and self.allow_none:
            return None
        if not self.many:
            return self._one(value, self.name)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise ValueError(f"Expected `{self.name}` to be a sequence. Received: {self.name}={value!r}")
        values = tuple(dict.fromkeys(value)) if self.unique else tuple(value)
        if not values and not self.allow_empty:
            raise ValueError(f"Expected `{self.name}` to be {self._values()}. Received: {self.name}={values!r}")
        try:
            return tuple(self._one(v, self.name) for v in values)
        except ValueError:
            raise ValueError(f"Expected `{self.name}` to be {self._values()}. "
                             f"Received: {self.name}={values!r}") from None

    def _values(self):
        """What the values of a ``many`` setting are, in words."""
        return f"names from {list(self.choices)}" if self.choices is not None else KINDS[self.kind].plural

    def _one(self, value, name):
        kind = KINDS[self.kind]
        if kind.check in ("integer", "number"):
            from tfbnn._internal import checks

            if kind.check == "integer":
                return checks.integer(name, value, minimum=kind.bounds[0])
            return checks.number(name, value, *kind.bounds)
        if kind.check == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"Expected `{name}` to be a bool. Received: {name}={value!r}")
        elif kind.check == "recipe":
            from tfbnn import training

            if not isinstance(value, (str, training.Recipe)):
                raise ValueError(f"Expected `{name}` to be a Recipe, a built-in recipe name or a recipe file. "
                                 f"Received: {name}={value!r}")
        elif kind.check == "init_scale":
            if value != "moped":
                from tfbnn._internal import checks

                return checks.number(name, value, 0, None, True, False, what="a positive number or 'moped'")
        elif self.choices is not None and value not in self.choices:
            raise ValueError(f"Expected `{name}` from {list(self.choices)}. Received: {name}={value!r}")
        elif not isinstance(value, str):
            raise ValueError(f"Expected `{name}` to be a string. Received: {name}={value!r}")
        return value

    # -- the command line -------------------------------------------------------------------
    @property
    def flag(self):
        """The option: ``--name-with-dashes``."""
        return "--" + self.name.replace("_", "-")

    def add_to(self, parser):
        """Adds this setting's option (and its deprecated aliases) to the argparse ``parser``."""
        if self.kind == "bool":
            if self.default:
                parser.add_argument("--no-" + self.name.replace("_", "-"), dest=self.name, action="store_false",
                                    help=self.help)
            else:
                parser.add_argument(self.flag, action="store_true", help=self.help)
        else:
            options = {"default": list(self.default) if self.many else self.default, "help": self.help}
            if KINDS[self.kind].parse is not str:
                options["type"] = KINDS[self.kind].parse
            if self.choices is not None:
                options["choices"] = self.choices
            if self.metavar is not None:
                options["metavar"] = self.metavar
            if self.many:
                options["nargs"] = "*" if self.allow_empty else "+"
            parser.add_argument(self.flag, **options)
        for alias in self.aliases:
            parser.add_argument("--" + alias.replace("_", "-"), dest=self.name, action=_DeprecatedOption,
                                type=KINDS[self.kind].parse, new=self.flag, help=argparse.SUPPRESS)


class _DeprecatedOption(argparse.Action):
    """An old spelling of an option: stores the value under the new name and says so on stderr."""

    def __init__(self, option_strings, dest, new, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _dump(value):
    """A setting's value as ``results.json`` has it (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


@dataclasses.dataclass(frozen=True)
class Study:
    """A study as data: settings, the recipes it trains, how it trains them and its analysis.

    Args:
        name: str, the command's name (``tfbnn <name>``, ``tfbnn run <name>``), e.g. ``"ibnn-shift"``.
        module: str, the module that defines it (``python -m <module>``).
        description: str, what the study does and writes (``--help``).
        settings: tuple of :class:`Setting`, in the order of the command's options.
        recipes: callable ``recipes(s) -> list of tfbnn.training.Recipe``: the runs of the settings ``s``.
        train: callable ``train(s, output_dir, verbose) -> results``: the study's data and one
            :func:`tfbnn.training.run` per recipe.
        analyse: callable ``analyse(results, s, output_dir, verbose) -> dict``: tables, plots and
            numbers; the dict's ``files`` lists what it wrote.
        outputs: str, what ``--output-dir`` receives (its help).
        folder: str, callable ``folder(s) -> str`` or None: the default output folder under
            ``saved_models/experiments`` (default: the module's last name).
        validate: callable ``validate(s) -> s`` or None: checks between settings, and settings
            derived from others, after each setting's own check.
        banner: callable ``banner(s) -> str`` or None: the line the command prints first.

    Example: the module docstring of ``tfbnn.experiments._study`` defines a study; a study module
    exposes ``STUDY.run_experiment``, ``STUDY.add_arguments``, ``STUDY.run`` and ``STUDY.main``.
    """

    name: str
    module: str
    description: str
    settings: tuple
    recipes: object
    train: object
    analyse: object
    outputs: str = "the results"
    folder: str = None
    validate: object = None
    banner: object = None

    def __post_init__(self):
        names = [s.name for s in self.settings] + [a for s in self.settings for a in s.aliases]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"Expected each setting named once. Received: {repeated} repeated in {self.name}")
        if self.folder is None:
            object.__setattr__(self, "folder", self.module.rsplit(".", 1)[-1])

    def entry_points(self):
        """``(defaults, run_experiment, add_arguments, run, main)``: what a study module exposes under
        these names (``tfbnn.cli`` adds ``add_arguments`` and calls ``run``; ``python -m`` calls ``main``)."""
        return self.defaults, self.run_experiment, self.add_arguments, self.run, self.main

    @property
    def defaults(self):
        """``{setting: default}`` (the study's ``DEFAULTS``)."""
        return {s.name: s.default for s in self.settings}

    def resolve(self, overrides):
        """The checked settings: :attr:`defaults` updated by ``overrides`` (old names warned and mapped).

        Raises:
            ValueError: an unknown setting, or a value its :class:`Setting` rejects (named).
        """
        overrides = dict(overrides)
        for setting in self.settings:
            for alias in setting.aliases:
                if alias in overrides:
                    warnings.warn(f"`{alias}` is deprecated; use `{setting.name}`.", DeprecationWarning, stacklevel=3)
                    overrides.setdefault(setting.name, overrides.pop(alias))
        defaults = self.defaults
        unknown = sorted(set(overrides) - set(defaults))
        if unknown:
            raise ValueError(f"Unknown settings {unknown}. Expected some of {sorted(defaults)}")
        s = {setting.name: setting.check(overrides.get(setting.name, setting.default)) for setting in self.settings}
        return self.validate(s) if self.validate is not None else s

    def jsonable(self, s):
        """The settings ``s`` as ``results.json`` records them (tuples as lists)."""
        return {k: _dump(v) for k, v in s.items()}

    def run_experiment(self, output_dir=None, verbose=True, **settings):
        """Checks the settings, trains (``train``) and analyses (``analyse``); returns the analysis' dict.

        Args:
            output_dir: folder of every output; default ``saved_models/experiments/<folder>``.
            verbose: bool, print progress.
            **settings: overrides of :attr:`defaults` (each checked).

        A bad setting raises before the output folder exists.
        """
        s = self.resolve(settings)
        folder = self.folder(s) if callable(self.folder) else self.folder
        output_dir = _common.prepare_output_dir(output_dir or os.path.join(DEFAULT_ROOT, folder))
        return self.analyse(self.train(s, output_dir, verbose), s, output_dir, verbose)

    # -- the command line -------------------------------------------------------------------
    def add_arguments(self, parser):
        """One option per setting (:meth:`Setting.add_to`), then ``--output-dir``."""
        for setting in self.settings:
            setting.add_to(parser)
        folder = self.module.rsplit(".", 1)[-1] + "/..." if callable(self.folder) else self.folder
        parser.add_argument("--output-dir", default=None, metavar="DIR",
                            help=f"where {self.outputs} go (default: {os.path.join(DEFAULT_ROOT, folder)})")

    def run(self, args):
        """Runs the study with the parsed ``args``; prints what it wrote; returns the exit status 0."""
        s = {setting.name: getattr(args, setting.name) for setting in self.settings}
        _common.quiet_tensorflow()
        if self.banner is not None:
            print(self.banner(self.resolve(s)), flush=True)
        result = self.run_experiment(output_dir=args.output_dir, **s)
        print("\nWrote " + ", ".join(result["files"]))
        return 0

    def main(self, argv=None):
        """``python -m <module> [options]``: parse, run, map errors to exit statuses (0, 2 bad options, 1)."""
        return _common.main(self.module.rsplit(".", 1)[-1], self.description, self.add_arguments, self.run, argv)
