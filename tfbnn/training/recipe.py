"""A declarative, serializable description of one training run: :class:`Recipe`.

A recipe names everything a study fixes: the zoo model and its Bayesian method, the
dataset and its validation hold-out, the optimizer (Adam or SGD with momentum /
Nesterov, weight decay), the learning-rate schedule, epochs and batch size, the KL
schedule and its final weight ``beta``, the weight samples per training step, the
Monte Carlo samples of the evaluation, and the seed. It holds plain values only
(strings, numbers, tuples, dicts), so it round-trips through JSON
(:meth:`Recipe.to_dict` / :meth:`Recipe.from_dict`, :func:`load_recipe` /
:func:`save_recipe`) and a file is a complete record of how a result was produced.

:func:`tfbnn.training.run` executes a recipe.
"""

import dataclasses
import json
import math
import numbers
import os

from tfbnn import methods as registry
from tfbnn._internal import deprecation, files

__all__ = [
    "Recipe",
    "OPTIMIZERS",
    "LR_SCHEDULES",
    "KL_SCHEDULES",
    "RECIPE_METHODS",
    "MEMBER_METHODS",
    "DEFAULT_MEMBERS",
    "LIKELIHOODS",
    "load_recipe",
    "save_recipe",
]

#: Optimizers a recipe can name.
OPTIMIZERS = ("adam", "sgd")
#: Learning-rate schedules: constant; step (multiply by ``lr_decay`` at each epoch of
#: ``lr_boundaries``); cosine (half-cosine to ``lr_final`` x lr over all epochs); linear
#: (constant until ``lr_boundaries[0]``, then linear to ``lr_final`` x lr at
#: ``lr_boundaries[1]``, then constant; default boundaries ``(0, epochs)``).
LR_SCHEDULES = ("constant", "step", "cosine", "linear")
#: KL-weight schedules (:mod:`tfbnn.schedules`), all ending at ``beta``.
KL_SCHEDULES = ("constant", "linear", "warmup", "cosine", "cyclic", "blundell")
#: Methods (the built-in ones of the registry, :mod:`tfbnn.methods`, which a recipe asks): the
#: zoo's (:data:`tfbnn.models.ZOO_METHODS`) plus ``graves`` (a deterministic zoo model converted
#: by :func:`tfbnn.convert.to_bayesian`, Graves 2011) and ``ensemble`` (a deep ensemble of
#: ``members`` zoo models of ``member_method``, Lakshminarayanan et al. 2017).
RECIPE_METHODS = registry.names()
#: What the members of an ``ensemble`` recipe can be (the zoo's methods).
MEMBER_METHODS = registry.names(zoo=True)
#: What the loss of a recipe is: the categorical NLL of a softmax classifier
#: (``sparse_categorical_crossentropy``), or the Gaussian NLL of a regression net's
#: linear outputs with the fixed noise scale ``noise_std``
#: (``0.5 ((y - f) / sigma)^2 + log sigma + 0.5 log(2 pi)``, averaged over outputs).
LIKELIHOODS = ("categorical", "gaussian")
#: The members of an ``ensemble`` recipe without ``method_options["members"]`` (the paper's M).
DEFAULT_MEMBERS = registry.get("ensemble").options["members"]


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _tuples(value):
    """Lists as tuples, recursively (a recipe read from JSON equals the one written)."""
    if isinstance(value, (list, tuple)):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _check(condition, field, value, expected):
    if not condition:
        raise ValueError(f"Expected recipe field `{field}` to be {expected}. Received: {field}={value!r}")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One training run, as a study fixes it.

    Args:
        name: str, the run's name (the output folder's default name).
        description: str, one line on what the recipe reproduces.
        reference: str, the paper, section and table whose protocol this is.
        model: a :func:`tfbnn.models.build` name or preset (``"mlp"``, ``"lenet5"``, ...).
        model_options: dict of builder arguments (``hidden_units``, ``stem``, ``outputs``
            (linear outputs of a regression net), ...; ``seed``: the builder's base seed
            of the stochastic layers, default ``seed``: a study that seeds each model
            apart from the run, e.g. one per depth).
        method: a registered method (:func:`tfbnn.methods.names`; the built-in ones:
            :data:`RECIPE_METHODS`).
        method_options: dict of the method's options (``estimator``, ``prior`` (a name
            or a :func:`tfbnn.priors.serialize` dict), ``rate``, ``parameterization``,
            ``num_components``, ``prior_stddev``; for ``graves`` and pre-trained
            recipes: ``init_scale``, ``moped_delta`` and ``convert_layers`` (the names of
            the layers :func:`tfbnn.convert.to_bayesian` converts, the others staying
            deterministic: a Bayesian block in a deterministic network; with it the run
            converts even without pre-training); for
            ``ensemble``: ``members`` (M, default 5), ``member_method`` (one of
            :data:`MEMBER_METHODS`, default ``"deterministic"``) and that method's options).
            An ``ensemble`` recipe trains M members, each as the recipe with
            ``member_method`` (:meth:`member_recipe`; member ``m`` with the seed
            ``seed + 1000 m``, its own initialization, data order and noise), and
            evaluates their mixture (:class:`tfbnn.DeepEnsemble`); ``eval_samples`` is
            then T per member.
        dataset: a :func:`tfbnn.datasets.load_pipeline` name (``"digits"`` is offline).
        max_examples, max_test_examples: int caps, or None (all).
        validation_fraction: float in [0, 1), the seeded hold-out of the training split.
        optimizer: ``"adam"`` or ``"sgd"``.
        learning_rate: float > 0, the initial rate.
        momentum: float in [0, 1), SGD only.
        nesterov: bool, SGD only.
        weight_decay: float >= 0. Keras' decoupled decay ``w <- w - lr * wd * w``,
            applied to deterministic weights only (never to posterior parameters,
            whose regularizer is the KL).
        lr_schedule: one of :data:`LR_SCHEDULES`.
        lr_boundaries: epochs at which ``step`` multiplies the rate by ``lr_decay``;
            for ``linear``, ``(start, end)`` of the ramp.
        lr_decay: float in (0, 1], the ``step`` factor.
        lr_final: float in [0, 1], the final rate of ``linear`` / ``cosine`` as a
            fraction of ``learning_rate``.
        variational_learning_rate: float > 0 or None: iBNN's constant rate of the
            node posteriors (:func:`tfbnn.ibnn.node_optimizer`).
        epochs, batch_size: ints > 0.
        steps_per_epoch: int >= 1 or None: training batches per epoch. None: one pass
            over the training split; an int repeats the split (in order, as the data
            gives it) and counts an epoch as that many batches (the 1-D regression
            studies train full-batch, all N points in each step, for a fixed number of
            steps per epoch). Learning-rate and KL schedules count these steps.
        likelihood: one of :data:`LIKELIHOODS`: ``"categorical"`` (a classifier,
            evaluated by :func:`tfbnn.evaluation.evaluate_classifier`) or
            ``"gaussian"`` (a regression net with linear outputs, trained on the
            Gaussian NLL with the known noise scale ``noise_std``).
        noise_std: float > 0, the Gaussian likelihood's fixed noise scale in the
            units of the targets the model is trained on; only (and always) with
            ``likelihood="gaussian"``.
        pretrain_epochs: int >= 0. Train the deterministic model first for this many
            epochs, then convert it (:func:`tfbnn.convert.to_bayesian`) to ``method``
            (``bbb``, ``vd`` or ``graves``): "frequentist pre-training"; a
            ``deterministic`` recipe goes on for ``epochs`` with a fresh optimizer (the
            baseline trained as long as the converted models).
        kl_schedule: one of :data:`KL_SCHEDULES`: how ``beta`` moves.
        kl_epochs: float > 0 or None, the ramp length (``linear``, ``cosine``; the
            ramp after ``warmup_epochs`` for ``warmup``; the cycle for ``cyclic``).
            None: half of ``epochs``.
        warmup_epochs: float >= 0, ``warmup``'s KL-free epochs.
        beta: float >= 0, the final KL weight (1: the ELBO; ``constant`` uses it
            throughout). ``beta < 1`` trains a tempered ("cold") posterior: the
            loss ``mean NLL + beta * KL / N`` is, up to the factor ``beta``, the
            ELBO of the data counted ``1 / beta`` times against the prior, whose
            optimum is the likelihood-tempered posterior
            ``p(D | w)^(1/beta) p(w) / Z`` (Wenzel et al. 2020; KL
            down-weighting as in Zhang et al. 2018 and Osawa et al. 2019). What it
            buys and costs: :mod:`tfbnn.callbacks`, "Tempered posteriors".
        train_samples: int >= 1, ``S``, samples per step: for iBNN the noise samples per
            example (:class:`tfbnn.ibnn.IBNNModel`), for the other stochastic methods
            whole-network weight samples whose outputs are averaged before the loss
            (:class:`tfbnn.MultiSampleModel`, Blundell et al. 2015 sec. 5.1).
        eval_samples: int >= 1, ``T`` of the Monte Carlo test predictive.
        ece_bins: int >= 1.
        temperature_scaling: bool. Fit a temperature ``T`` to the Monte Carlo
            predictive on the validation hold-out (needs ``validation_fraction > 0``;
            :meth:`tfbnn.TemperatureScaling.fit_prediction`, ``"pooled"``:
            ``softmax(log p_bar / T)``, Guo et al. 2017) and report the test metrics
            of the tempered predictive beside the raw ones (``results.json``:
            ``test["temperature_scaled"]``).
        seed: int >= 0: data split, initialization, shuffling, every layer's noise.
    """

    name: str = "custom"
    description: str = ""
    reference: str = ""
    model: str = "mlp"
    model_options: dict = dataclasses.field(default_factory=dict)
    method: str = "bbb"
    method_options: dict = dataclasses.field(default_factory=dict)
    dataset: str = "digits"
    max_examples: object = None
    max_test_examples: object = None
    validation_fraction: float = 0.0
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    lr_boundaries: tuple = ()
    lr_decay: float = 0.1
    lr_final: float = 0.0
    variational_learning_rate: object = None
    epochs: int = 10
    batch_size: int = 128
    steps_per_epoch: object = None
    likelihood: str = "categorical"
    noise_std: object = None
    pretrain_epochs: int = 0
    kl_schedule: str = "linear"
    kl_epochs: object = None
    warmup_epochs: float = 0.0
    beta: float = 1.0
    train_samples: int = 1
    eval_samples: int = 32
    ece_bins: int = 15
    temperature_scaling: bool = False
    seed: int = 0

    def __post_init__(self):
        set_ = object.__setattr__
        for field in ("name", "description", "reference", "model", "method", "dataset", "optimizer",
                      "lr_schedule", "kl_schedule", "likelihood"):
            _check(isinstance(getattr(self, field), str), field, getattr(self, field), "a string")
        _check(bool(self.name) and "/" not in self.name and not self.name.startswith("."), "name", self.name,
               "a non-empty file name")
        for field in ("model_options", "method_options"):
            _check(isinstance(getattr(self, field), dict), field, getattr(self, field), "a dict")
            set_(self, field, _tuples(getattr(self, field)))
        known = registry.names()
        _check(self.method in known, "method", self.method, f"one of {list(known)}")
        _check(self.likelihood in LIKELIHOODS, "likelihood", self.likelihood, f"one of {list(LIKELIHOODS)}")
        _check(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"one of {list(OPTIMIZERS)}")
        _check(self.lr_schedule in LR_SCHEDULES, "lr_schedule", self.lr_schedule, f"one of {list(LR_SCHEDULES)}")
        _check(self.kl_schedule in KL_SCHEDULES, "kl_schedule", self.kl_schedule, f"one of {list(KL_SCHEDULES)}")
        for field, low in (("epochs", 1), ("batch_size", 1), ("pretrain_epochs", 0), ("train_samples", 1),
                           ("eval_samples", 1), ("ece_bins", 1), ("seed", 0)):
            value = getattr(self, field)
            _check(_is_int(value) and value >= low, field, value, f"an integer >= {low}")
            set_(self, field, int(value))
        for field in ("max_examples", "max_test_examples", "steps_per_epoch"):
            value = getattr(self, field)
            _check(value is None or (_is_int(value) and value >= 1), field, value, "a positive integer or None")
        rules = {
            "learning_rate": (lambda v: v > 0, "a positive number"),
            "momentum": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
            "weight_decay": (lambda v: v >= 0, "a non-negative number"),
            "lr_decay": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
            "lr_final": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
            "validation_fraction": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
            "warmup_epochs": (lambda v: v >= 0, "a non-negative number"),
            "beta": (lambda v: v >= 0, "a non-negative number"),
        }
        for field, (ok, expected) in rules.items():
            value = getattr(self, field)
            _check(_is_real(value) and ok(value), field, value, expected)
            set_(self, field, float(value))
        for field in ("kl_epochs", "variational_learning_rate", "noise_std"):
            value = getattr(self, field)
            _check(value is None or (_is_real(value) and value > 0), field, value, "a positive number or None")
        for field in ("nesterov", "temperature_scaling"):
            _check(isinstance(getattr(self, field), bool), field, getattr(self, field), "a bool")
        boundaries = self.lr_boundaries
        _check(isinstance(boundaries, (tuple, list)) and all(_is_real(b) and 0 <= b <= self.epochs for b in boundaries)
               and list(boundaries) == sorted(set(boundaries)), "lr_boundaries", boundaries,
               f"increasing epochs in [0, epochs={self.epochs}]")
        set_(self, "lr_boundaries", tuple(boundaries))
        self._check_combinations()

    def _check_combinations(self):
        if self.optimizer != "sgd" and (self.momentum or self.nesterov):
            raise ValueError(
                "`momentum` and `nesterov` apply to optimizer='sgd' only. "
                f"Received: optimizer={self.optimizer!r}, momentum={self.momentum}, nesterov={self.nesterov}"
            )
        if self.nesterov and not self.momentum:
            raise ValueError(f"`nesterov` needs momentum > 0. Received: nesterov=True, momentum={self.momentum}")
        if self.lr_schedule == "step" and not self.lr_boundaries:
            raise ValueError("lr_schedule='step' needs `lr_boundaries` (epochs). Received: lr_boundaries=()")
        if self.lr_schedule == "linear" and len(self.lr_boundaries) not in (0, 2):
            raise ValueError("lr_schedule='linear' takes `lr_boundaries` (start, end) of its ramp, or none. "
                             f"Received: lr_boundaries={self.lr_boundaries}")
        if self.lr_schedule in ("constant", "cosine") and self.lr_boundaries:
            raise ValueError(
                f"`lr_boundaries` apply to lr_schedule 'step' and 'linear'. Received: lr_schedule={self.lr_schedule!r}, "
                f"lr_boundaries={self.lr_boundaries}"
            )
        if self._method.build == "ensemble":
            self._check_ensemble()
        if (self.likelihood == "gaussian") != (self.noise_std is not None):
            raise ValueError(
                "likelihood='gaussian' needs the noise scale `noise_std` (> 0), and only it takes one. "
                f"Received: likelihood={self.likelihood!r}, noise_std={self.noise_std!r}"
            )
        if self.likelihood != "categorical" and self.temperature_scaling:
            raise ValueError(
                "`temperature_scaling` calibrates a classifier's softmax. "
                f"Received: likelihood={self.likelihood!r}, temperature_scaling=True"
            )
        if self.variational_learning_rate is not None and registry.get(self.member_method).wrap_optimizer is None:
            able = " or ".join(repr(m) for m in registry.names() if registry.get(m).wrap_optimizer is not None)
            raise ValueError(
                f"`variational_learning_rate` applies to method={able} only. "
                f"Received: method={self.method!r}, variational_learning_rate={self.variational_learning_rate}"
            )
        if self.train_samples > 1 and not registry.get(self.member_method).stochastic:
            raise ValueError(
                "`train_samples` > 1 (several weight or noise samples per step) needs a stochastic "
                f"method, one of {list(registry.names(stochastic=True))}. "
                f"Received: method={self.method!r}, train_samples={self.train_samples}"
            )
        if self.pretrain_epochs and self.method not in _pretrainable_methods():
            able = ", ".join(repr(m) for m in _pretrainable_methods() if m != "deterministic")
            raise ValueError(
                "`pretrain_epochs` (frequentist pre-training, then conversion) applies to methods "
                f"{able} and 'deterministic' (the baseline trained as long). "
                f"Received: method={self.method!r}, pretrain_epochs={self.pretrain_epochs}"
            )
        if self.temperature_scaling and not self.validation_fraction:
            raise ValueError(
                "`temperature_scaling` fits T on the validation hold-out: set `validation_fraction` > 0. "
                f"Received: temperature_scaling=True, validation_fraction={self.validation_fraction}"
            )
        if self.kl_schedule == "blundell" and self.beta != 1.0:
            raise ValueError(
                "kl_schedule='blundell' fixes the minibatch weights (Blundell et al. 2015 eq. 9, averaging 1); "
                f"use another schedule for beta != 1. Received: beta={self.beta}"
            )

    def _check_ensemble(self):
        options = self.method_options
        members = options.get("members", DEFAULT_MEMBERS)
        _check(_is_int(members) and members >= 1, "method_options['members']", members, "an integer >= 1")
        member = options.get("member_method", "deterministic")
        # A member is one trained network: not a method whose run ends in an ensemble of its own (csgmcmc).
        zoo = tuple(n for n in registry.names(zoo=True) if registry.get(n).finish is None)
        _check(member in zoo, "method_options['member_method']", member, f"one of {list(zoo)}")

    # -- derived values ---------------------------------------------------------------
    @property
    def _method(self):
        """The registry's :class:`tfbnn.methods.Method` of ``method``."""
        return registry.get(self.method)

    @property
    def member_method(self):
        """The method of each trained network: ``method``, or an ensemble's ``member_method``."""
        if self._method.build == "ensemble":
            return self.method_options.get("member_method", "deterministic")
        return self.method

    @property
    def num_members(self):
        """M: an ensemble's ``members``, 1 for every other method."""
        return self.method_options.get("members", DEFAULT_MEMBERS) if self._method.build == "ensemble" else 1

    def member_recipe(self, index):
        """The recipe of member ``index`` of an ensemble: ``member_method`` with the member's options and
        the seed ``seed + 1000 * index`` (:func:`tfbnn.ensembles.member_seeds`)."""
        if self._method.build != "ensemble":
            raise ValueError(f"member_recipe applies to method='ensemble'. Received: method={self.method!r}")
        _check(_is_int(index) and 0 <= index < self.num_members, "index", index,
               f"an integer in [0, {self.num_members})")
        options = {k: v for k, v in self.method_options.items() if k not in ("members", "member_method")}
        return self.replace(name=f"{self.name}-member{index}", method=self.member_method, method_options=options,
                            seed=self.seed + 1000 * index)

    @property
    def is_bayesian(self):
        """Whether the model (each member of an ensemble) has a KL term (the ELBO's ``beta`` and ``N`` apply)."""
        return registry.get(self.member_method).bayesian

    @property
    def ramp_epochs(self):
        """The KL ramp length: ``kl_epochs``, or half of ``epochs``."""
        return self.kl_epochs if self.kl_epochs is not None else max(self.epochs / 2.0, 1e-3)

    def replace(self, **changes):
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def quick(self, epochs=1, max_examples=64, max_test_examples=32, batch_size=16, eval_samples=4):
        """A copy for a smoke run of a few steps: same model, method and protocol, less of everything.

        Learning-rate boundaries and KL ramps are rescaled to the shorter run; a method that samples with
        its optimizer (``csgmcmc``) runs one cycle, its second half sampling (a few steps hold no more).
        """
        scale = epochs / self.epochs
        options = self.method_options
        if registry.get(self.method).sampler is not None:
            options = {**options, "cycles": 1, "exploration": min(options.get("exploration", 0.8), 0.5)}
        boundaries = tuple(sorted({min(max(b * scale, 1e-3), epochs * 0.999) for b in self.lr_boundaries}))
        eval_samples = max(eval_samples, self.method_options.get("num_components", 1))
        return self.replace(
            epochs=epochs, batch_size=min(batch_size, self.batch_size),
            max_examples=max_examples if self.max_examples is None else min(max_examples, self.max_examples),
            max_test_examples=max_test_examples, eval_samples=eval_samples, lr_boundaries=boundaries,
            pretrain_epochs=min(self.pretrain_epochs, 1),
            kl_epochs=None if self.kl_epochs is None else max(self.kl_epochs * scale, 1e-3),
            warmup_epochs=self.warmup_epochs * scale, method_options=options,
        )

    # -- serialization ----------------------------------------------------------------
    def to_dict(self):
        """A JSON-able dict (priors serialized); :meth:`from_dict` inverts it."""
        out = dataclasses.asdict(self)
        options = dict(out["method_options"])
        if "prior" in options and not isinstance(options["prior"], (str, dict)):
            from tfbnn import priors

            options["prior"] = priors.serialize(options["prior"])
        out["method_options"] = options
        out["lr_boundaries"] = list(self.lr_boundaries)
        return out

    @classmethod
    def from_dict(cls, config):
        """A recipe from :meth:`to_dict`'s dict; unknown keys are an error."""
        if not isinstance(config, dict):
            raise ValueError(f"Expected a recipe dict. Received: {type(config).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - fields)
        if unknown:
            raise ValueError(f"Unknown recipe field(s) {unknown}. Expected some of {sorted(fields)}.")
        config = dict(config)
        if "lr_boundaries" in config and isinstance(config["lr_boundaries"], list):
            config["lr_boundaries"] = tuple(config["lr_boundaries"])
        return cls(**config)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=1)


def _pretrainable_methods():
    """The methods a recipe may pre-train (``pretrain_epochs``): those :func:`tfbnn.convert.to_bayesian`
    converts to, and ``deterministic`` (the baseline trained as long)."""
    return registry.names(convertible=True) + ("deterministic",)


def save_recipe(recipe, path):
    """Writes ``recipe`` as JSON to ``path`` (atomically); returns ``path``."""
    return files.write_json(path, recipe.to_dict())


def load_recipe(path):
    """The :class:`Recipe` in the JSON file ``path``.

    Raises:
        ValueError: the file is missing, not JSON, or not a valid recipe (named).
    """
    if not os.path.isfile(path):
        raise ValueError(f"Expected an existing recipe file (.json). Received: recipe={path!r}")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"Could not read the recipe {path!r}: {e}") from None
    return Recipe.from_dict(config)


__getattr__ = deprecation.renamed(__name__, {"METHODS": "RECIPE_METHODS"})
