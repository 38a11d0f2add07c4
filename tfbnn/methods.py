"""The method registry: one :class:`Method` per Bayesian method, asked by every part of tfbnn.

A method (``"bbb"``, ``"vd"``, ...) is a name that the zoo, the recipes, the runner, the
converter and the ``tfbnn train`` command all understand. What each of them needs to
know about it lives here, in one frozen :class:`Method`:

=======================  ======================================================================
field                    who asks and what it means
=======================  ======================================================================
``name``                 the one name (``Recipe.method``, ``models.build(method=...)``, ``--method``)
``description``          one line, shown in ``tfbnn train --help`` (``--method``)
``build``                how :func:`tfbnn.training.run` makes the model: ``"zoo"`` (the zoo
                         builds it), ``"convert"`` (a deterministic zoo model converted by
                         :func:`tfbnn.convert.to_bayesian`, e.g. ``graves``), ``"ensemble"``
                         (M member networks, each of a zoo method) or ``"adapter"`` (adapters on
                         a pre-trained network, ``blob``: trained by :func:`tfbnn.training.fit_model`)
``bayesian``             its layers carry a KL term: ``num_examples`` (N) and ``beta`` apply
``stochastic``           its predictions are random (``train_samples > 1`` makes sense)
``options``              the options and their defaults (:class:`tfbnn.models.LayerFactory`)
``check_options``        ``f(options) -> options``: validates and resolves the filled-in options
``layers``               the zoo's layer per kind (``"dense"``, ``"conv2d"``, ``"lstm"``, ``"gru"``, and
                         ``"head"``, the output layer when it differs from ``"dense"``):
                         a :mod:`tfbnn.layers` class name (or a layer class of your own), or
                         ``f(options) -> name``; empty:
                         Keras' own layers (``deterministic``, ``mc_dropout``); a kind missing
                         from a non-empty mapping: the method has no such layer (an error)
``layer_kwargs``         ``f(options) -> dict``: the arguments the zoo adds to every layer of
                         ``layers`` (priors, parameterization, ...; ``kl_weight`` and ``seed``
                         are the zoo's)
``head_kwargs``          ``f(options) -> dict``: the arguments the zoo gives a ``"head"`` layer of
                         ``layers`` (the classifier's output layer, when it is not the dense one;
                         ``seed`` is the zoo's), instead of ``layer_kwargs``
``callbacks``            ``f(model, options) -> list``: Keras callbacks :func:`tfbnn.training.run` adds to
                         the method's training (``sngp``: :class:`tfbnn.sngp.ResetCovariance`;
                         ``evidential``: :class:`tfbnn.evidential.EvidentialAnnealing`), or None
``head_layers``          ``f(units, options, seed, name) -> [layers]``: the classifier's output layers
                         when they are not one layer of ``layers`` (``evidential``: ``Dense`` and a
                         :class:`tfbnn.evidential.DirichletHead`; ``heteroscedastic``:
                         :class:`tfbnn.layers.HeteroscedasticSoftmax`; ``ddu``: a softmax ``Dense``),
                         the last one named ``name``; or None
``loss``                 ``f(options) -> Keras loss``: the training loss of a classifier, or None (sparse
                         categorical cross-entropy on the probabilities)
``epistemic``            the method's own epistemic score, one of :data:`EPISTEMIC_SCORES` (what
                         :func:`tfbnn.evaluation.epistemic_scores` computes and ``tfbnn train``,
                         ``tfbnn evaluate`` and the studies report); default ``"mutual_information"``
                         for a stochastic method, ``"none"`` otherwise
``dropout_option``       the option holding the rate of the MC dropout the zoo adds after a
                         block (``mc_dropout``: ``"rate"``), or None
``ensembles``            the in-network ensembles (``"batch_ensemble"``, ``"rank1"``) it goes with
``conversions``          the ``method`` names of :func:`tfbnn.convert.to_bayesian` that convert
                         to it, each a :class:`Conversion` (what Dense and Conv2D become)
``conversion_for``       ``f(options) -> conversion name``: the one :func:`tfbnn.training.run`
                         uses for a pre-trained recipe (default: the first of ``conversions``)
``sample_model``         ``f(model, S) -> model`` that trains with ``S`` samples per step
                         (default :class:`tfbnn.MultiSampleModel`; iBNN: :class:`tfbnn.ibnn.IBNNModel`)
``samples_phrase``       what those samples are, in the run's description
``eval_samples``         ``f(model, T) -> T'``: the test predictive's sample count (iBNN: a
                         multiple of K); None: ``T``
``wrap_optimizer``       ``f(optimizer, variational_learning_rate) -> optimizer`` (iBNN's two
                         learning rates), or None (then a recipe's ``variational_learning_rate``
                         is an error)
``sampler``              ``f(options, learning_rate, total_steps, num_examples, seed) -> optimizer``: the
                         optimizer that replaces the recipe's (``csgmcmc``: :class:`tfbnn.sgmcmc.SGHMC` or
                         :class:`tfbnn.sgmcmc.SGLD` on a :class:`tfbnn.sgmcmc.CyclicalSchedule`), or None
``finish``               ``f(model, callbacks) -> model``: what :func:`tfbnn.training.run` keeps, evaluates and
                         saves after ``fit``, given the method's callbacks (``csgmcmc``: the collected samples
                         as a :class:`tfbnn.DeepEnsemble`, :meth:`tfbnn.sgmcmc.SGMCMCPosterior.to_ensemble`), or None
``xla``                  ``f(options, network) -> str or bool or None``: for ``jit_compile="auto"``, the
                         benchmark layer whose measured train step decides (a row of :data:`XLA_RULE`,
                         ``network`` one of its networks), or a bool that decides directly; None: no XLA
``label``                the name in result tables (``"BbB"``), default ``name``
``flags``                its ``tfbnn train`` options, each a :class:`Flag`
``options_from_flags``   ``f(values) -> options``: the recipe's ``method_options`` from the
                         parsed flags (``values``: every flag's dest -> value or None)
=======================  ======================================================================

Nothing here imports TensorFlow: recipes and the command's parsers read the registry
before TensorFlow starts. Layer classes are named (strings looked up in
:mod:`tfbnn.layers` when a model is built), and the few functions that need the core
import it when called.

Adding a method is one :func:`register` call (or one module that makes it); the zoo,
:class:`tfbnn.training.Recipe`, :func:`tfbnn.training.run`, :func:`tfbnn.convert.to_bayesian`
and ``tfbnn train`` then know it.

Example:
    >>> import tfbnn
    >>> wide = tfbnn.methods.Method(
    ...     name="bbb_wide", description="Bayes by Backprop with a N(0, s^2) prior",
    ...     bayesian=True, options={"prior_scale": 2.0},
    ...     layers={"dense": "DenseReparameterization", "conv2d": "Conv2DReparameterization"},
    ...     layer_kwargs=lambda o: {"kernel_prior": tfbnn.priors.Normal(0.0, o["prior_scale"])})
    >>> tfbnn.methods.register(wide)
    >>> model = tfbnn.models.mlp("bbb_wide", hidden_units=(8,), input_shape=(4,), num_examples=100)
    >>> sorted({type(layer).__name__ for layer in tfbnn.bayesian_layers(model)})
    ['DenseReparameterization']
    >>> tfbnn.methods.unregister("bbb_wide")
"""

import dataclasses
import math
import os
import platform
import types

from tfbnn._internal import argtypes

__all__ = ["Method", "Conversion", "Flag", "PRIOR", "ESTIMATORS", "BUILDS", "EPISTEMIC_SCORES", "register",
           "unregister", "get", "names", "conversion_names", "method_of_conversion", "layer_class", "XLA_RULE",
           "kernel_library"]

#: How :func:`tfbnn.training.run` makes a method's model (:attr:`Method.build`); ``"adapter"``: a method applied to
#: a pre-trained network by its own function (``blob``: :func:`tfbnn.lora.variational`), which no zoo recipe
#: builds: :func:`tfbnn.training.fit_model` trains what that function returns.
BUILDS = ("zoo", "convert", "ensemble", "adapter")
#: A method's own epistemic score (:attr:`Method.epistemic`), each higher for inputs less like the training data:
#: ``"mutual_information"`` (Monte Carlo: ``H[p_bar] - mean_t H[p_t]``), ``"gp_variance"`` (SNGP's GP posterior
#: variance), ``"density"`` (DDU: ``-log q(z)``, the negative log feature density), ``"evidential"`` (``u = K / S``,
#: the Dirichlet's vacuity) and ``"none"`` (the method has none: a deterministic network; the heteroscedastic
#: softmax, whose noise is aleatoric).
EPISTEMIC_SCORES = ("mutual_information", "gp_variance", "density", "evidential", "none")
#: Gradient estimators of the ``bbb`` method.
ESTIMATORS = ("flipout", "reparameterization", "local_reparameterization")
#: In a :class:`Conversion`'s keyword arguments: the ``prior`` given to :func:`tfbnn.convert.to_bayesian`.
PRIOR = "<the conversion's prior>"

_REGISTRY = {}


def _no_options(options):
    return options


def _no_kwargs(options):
    return {}


@dataclasses.dataclass(frozen=True)
class Flag:
    """One ``tfbnn train`` option of a method: ``--<dest with dashes>``.

    Args:
        dest: str, the parsed value's name (``"dropout_rate"`` is ``--dropout-rate``).
        help: str, the help line (say which method it is for: ``"mc_dropout only: ..."``).
        type: a :mod:`tfbnn._internal.argtypes` validator or None (a string).
        choices: tuple of the accepted values, ``f() -> tuple`` (read when the parser is made), or None.
        metavar: str or None.

    Several methods may share a flag (the same ``dest``): it is added once and applies to each.

    Example:
        >>> import tfbnn
        >>> flag = tfbnn.methods.get("ibnn").flags[0]
        >>> flag.option, flag.argparse_kwargs()["metavar"]
        ('--num-components', 'K')
    """

    dest: str
    help: str
    type: object = None
    choices: object = None
    metavar: str = None

    @property
    def option(self):
        """The flag as typed: ``--dropout-rate``."""
        return "--" + self.dest.replace("_", "-")

    def argparse_kwargs(self):
        """Keyword arguments of ``parser.add_argument`` (default None: not given)."""
        choices = self.choices() if callable(self.choices) else self.choices
        kwargs = {"help": self.help, "default": None}
        kwargs.update({k: v for k, v in (("type", self.type), ("choices", choices), ("metavar", self.metavar))
                       if v is not None})
        return kwargs


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What :func:`tfbnn.convert.to_bayesian` turns ``Dense`` and ``Conv2D`` layers into.

    Args:
        dense: str, the :mod:`tfbnn.layers` class (name) of a converted ``Dense`` layer, or a class.
        conv2d: str, a class or None, that of a ``Conv2D`` layer (None: none, keep them with ``exclude``).
        dense_kwargs, conv2d_kwargs: dicts of the classes' extra arguments; the value
            :data:`PRIOR` stands for the conversion's ``prior``.
        channels_last_only: bool; a ``channels_first`` Conv2D is an error (else its
            ``data_format`` is passed on). Default False.

    Example:
        >>> import tfbnn
        >>> graves = tfbnn.methods.get("graves").conversions["graves"]
        >>> graves.dense, graves.kwargs("dense", "normal")
        ('GravesDense', {'kernel_prior': 'normal'})
    """

    dense: str
    conv2d: object = None
    dense_kwargs: dict = dataclasses.field(default_factory=dict)
    conv2d_kwargs: dict = dataclasses.field(default_factory=dict)
    channels_last_only: bool = False

    def kwargs(self, kind, prior):
        """The extra arguments of the ``kind`` (``"dense"`` or ``"conv2d"``) layer, ``prior`` filled in."""
        template = self.dense_kwargs if kind == "dense" else self.conv2d_kwargs
        return {k: prior if v == PRIOR else v for k, v in template.items()}


@dataclasses.dataclass(frozen=True)
class Method:
    """One method, as the zoo, the recipes, the runner, the converter and the command know it.

    The module docstring's table says what each field means and who asks for it. Only
    ``name`` and ``description`` are required; the defaults describe a deterministic
    zoo method with no options.

    Args:
        name: str, the method's name (an identifier).
        description: str, one line.
        build: one of :data:`BUILDS`. Default ``"zoo"``.
        bayesian: bool. Default False.
        stochastic: bool or None; None (default): ``bayesian``, or a method with MC dropout.
        options: dict of option names and defaults.
        check_options: ``f(options) -> options`` or None.
        layers: dict of layer kind -> :mod:`tfbnn.layers` class name or ``f(options) -> name``.
        layer_kwargs: ``f(options) -> dict`` or None.
        head_kwargs: ``f(options) -> dict`` or None (no arguments).
        callbacks: ``f(model, options) -> list`` of Keras callbacks, or None.
        head_layers: ``f(units, options, seed, name) -> list`` of the classifier's output layers, or None.
        loss: ``f(options) -> Keras loss``, or None (sparse categorical cross-entropy).
        epistemic: one of :data:`EPISTEMIC_SCORES`, or None (``"mutual_information"`` for a stochastic
            method, ``"none"`` otherwise).
        dropout_option: str or None.
        ensembles: tuple of in-network ensemble names.
        conversions: dict of :func:`tfbnn.convert.to_bayesian` method name -> :class:`Conversion`.
        conversion_for: ``f(options) -> conversion name`` or None.
        sample_model: ``f(model, num_samples) -> keras.Model`` or None (:class:`tfbnn.MultiSampleModel`).
        samples_phrase: str.
        eval_samples: ``f(model, num_samples) -> int`` or None.
        wrap_optimizer: ``f(optimizer, variational_learning_rate) -> optimizer`` or None.
        sampler: ``f(options, learning_rate, total_steps, num_examples, seed) -> optimizer`` or None.
        finish: ``f(model, callbacks) -> model`` or None (the trained model).
        xla: ``f(options, network) -> str or bool or None`` (a layer of :data:`XLA_RULE`), or None (never).
        label: str or None (``name``).
        flags: tuple of :class:`Flag`.
        options_from_flags: ``f(values) -> dict`` or None (no options).

    Example:
        >>> import tfbnn
        >>> tfbnn.methods.get("vd").layer_class("dense", {"parameterization": "additive"})
        'DenseVariationalDropout'
    """

    name: str
    description: str
    build: str = "zoo"
    bayesian: bool = False
    stochastic: object = None
    options: dict = dataclasses.field(default_factory=dict)
    check_options: object = None
    layers: dict = dataclasses.field(default_factory=dict)
    layer_kwargs: object = None
    head_kwargs: object = None
    callbacks: object = None
    head_layers: object = None
    loss: object = None
    epistemic: object = None
    dropout_option: object = None
    ensembles: tuple = ()
    conversions: dict = dataclasses.field(default_factory=dict)
    conversion_for: object = None
    sample_model: object = None
    samples_phrase: str = "whole-network weight samples"
    eval_samples: object = None
    wrap_optimizer: object = None
    sampler: object = None
    finish: object = None
    xla: object = None
    label: object = None
    flags: tuple = ()
    options_from_flags: object = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Expected `name` to be an identifier string. Received: name={self.name!r}")
        if self.build not in BUILDS:
            raise ValueError(f"Expected `build` in {list(BUILDS)}. Received: build={self.build!r}")
        if self.build == "convert" and not self.conversions:
            raise ValueError(f"build='convert' needs `conversions`. Received: name={self.name!r}, conversions={{}}")
        if self.dropout_option is not None and self.dropout_option not in self.options:
            raise ValueError(f"Expected `dropout_option` to be one of the options {sorted(self.options)}. "
                             f"Received: dropout_option={self.dropout_option!r}")
        for kind in self.layers:
            if kind not in ("dense", "conv2d", "lstm", "gru", "head"):
                raise ValueError(f"Expected `layers` keys in ['dense', 'conv2d', 'lstm', 'gru', 'head']. "
                                 f"Received: {kind!r}")
        set_ = object.__setattr__
        set_(self, "options", types.MappingProxyType(dict(self.options)))
        set_(self, "layers", types.MappingProxyType(dict(self.layers)))
        set_(self, "conversions", types.MappingProxyType(dict(self.conversions)))
        set_(self, "ensembles", tuple(self.ensembles))
        set_(self, "flags", tuple(self.flags))
        if self.stochastic is None:
            set_(self, "stochastic", bool(self.bayesian or self.dropout_option))
        if self.epistemic is None:
            set_(self, "epistemic", "mutual_information" if self.stochastic else "none")
        if self.epistemic not in EPISTEMIC_SCORES:
            raise ValueError(f"Expected `epistemic` in {list(EPISTEMIC_SCORES)}. Received: epistemic={self.epistemic!r}")

    # -- what the zoo asks ---------------------------------------------------------------
    @property
    def zoo(self):
        """Whether the zoo builds the method (``build == "zoo"``)."""
        return self.build == "zoo"

    def resolve_options(self, options):
        """The defaults with ``options`` on top, checked; an unknown option is an error."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            received = ", ".join(f"{k}={options[k]!r}" for k in unknown)
            raise ValueError(
                f"Unknown option for method={self.name!r}. Expected one of {sorted(self.options)}. Received: {received}"
            )
        return (self.check_options or _no_options)({**self.options, **options})

    def layer_class(self, kind, options):
        """The :mod:`tfbnn.layers` class name (or class) of a ``kind`` layer for the resolved ``options``;
        None: Keras' own layer (a method without ``layers``); :func:`layer_class` gives the class.

        Raises:
            ValueError: the method has layers but none of this kind.
        """
        if not self.layers:
            return None
        spec = self.layers.get(kind)
        if spec is None:
            raise ValueError(f"Method {self.name!r} has no {kind} layer. Expected a kind in {sorted(self.layers)}. "
                             f"Received: kind={kind!r}")
        return spec(options) if callable(spec) else spec

    def extra_layer_kwargs(self, options):
        """The arguments :attr:`layer_kwargs` adds to every layer of the method."""
        return dict((self.layer_kwargs or _no_kwargs)(options))

    def extra_head_kwargs(self, options):
        """The arguments :attr:`head_kwargs` gives a ``"head"`` layer."""
        return dict((self.head_kwargs or _no_kwargs)(options))

    # -- what the runner asks ------------------------------------------------------------
    def training_callbacks(self, model, options=None):
        """The Keras callbacks the method's training of ``model`` with ``options`` needs (:attr:`callbacks`)."""
        return list(self.callbacks(model, self.resolve_options(options))) if self.callbacks is not None else []

    def training_loss(self, options=None):
        """The classifier's training loss for ``options`` (:attr:`loss`): a Keras loss, or
        ``"sparse_categorical_crossentropy"``."""
        return self.loss(self.resolve_options(options)) if self.loss is not None else "sparse_categorical_crossentropy"

    def output_layers(self, units, options, seed, name):
        """The classifier's output layers (:attr:`head_layers`) for the resolved ``options``, or None."""
        return None if self.head_layers is None else list(self.head_layers(units, options, seed, name))

    def conversion_name(self, options):
        """The :func:`tfbnn.convert.to_bayesian` method converting to this one, or None."""
        if self.conversion_for is not None:
            return self.conversion_for(options)
        return next(iter(self.conversions), None)

    def train_model(self, model, num_samples):
        """The model that trains ``model`` with ``num_samples`` samples per step."""
        return (self.sample_model or _multi_sample_model)(model, num_samples)

    def num_eval_samples(self, model, num_samples):
        """The test predictive's sample count for ``num_samples`` asked."""
        return num_samples if self.eval_samples is None else self.eval_samples(model, num_samples)

    def uses_xla(self, options, network="mlp", kernels=None):
        """Whether ``jit_compile="auto"`` compiles the method's ``network`` with XLA on a CPU with ``kernels``.

        Args:
            options: the method's options.
            network: a network of :data:`XLA_RULE` (``"mlp"``, ``"lenet5"``, ``"resnet20"``) or None
                (an unmeasured network: no XLA).
            kernels: ``"eigen"`` or ``"onednn"``; default :func:`kernel_library`.
        """
        if self.xla is None or network is None:
            return False
        layer = self.xla(options, network)
        if layer is None or isinstance(layer, bool):
            return bool(layer)
        row = XLA_RULE.get((network, layer))
        return bool(row and row[kernels or kernel_library()])

    @property
    def display_name(self):
        """The name in result tables."""
        return self.label or self.name

    # -- what the command asks -----------------------------------------------------------
    def options_from(self, values):
        """The ``method_options`` of the parsed flags ``values`` (dest -> value or None)."""
        return dict(self.options_from_flags(values)) if self.options_from_flags is not None else {}


def register(method, replace=False):
    """Adds ``method`` to the registry.

    Args:
        method: a :class:`Method`.
        replace: bool; allow replacing a method of the same name. Default False.

    Raises:
        ValueError: not a Method, a name already registered, or a conversion name
            another method has.

    Example:
        >>> import tfbnn
        >>> tfbnn.methods.register(tfbnn.methods.Method("plain", "a deterministic network, renamed"))
        >>> tfbnn.models.mlp("plain", hidden_units=(4,), input_shape=(2,)).count_params()
        62
        >>> tfbnn.methods.unregister("plain")
    """
    if not isinstance(method, Method):
        raise ValueError(f"Expected a tfbnn.methods.Method. Received: method of type {type(method).__name__}")
    if method.name in _REGISTRY and not replace:
        raise ValueError(f"A method named {method.name!r} is registered already; pass replace=True to replace it. "
                         f"Received: method={method.name!r}")
    taken = {c: m.name for m in _REGISTRY.values() if m.name != method.name for c in m.conversions}
    clash = sorted(set(method.conversions) & set(taken))
    if clash:
        raise ValueError(f"The conversion name(s) {clash} belong to method {taken[clash[0]]!r}. "
                         f"Received: method={method.name!r}")
    _REGISTRY[method.name] = method


def unregister(name):
    """Removes the method ``name`` (a method registered by the caller; the built-in ones stay).

    Raises:
        ValueError: an unknown or built-in name.
    """
    if name in _BUILT_IN:
        raise ValueError(f"The built-in methods stay registered. Received: name={name!r}")
    get(name)
    del _REGISTRY[name]


def get(name):
    """The :class:`Method` named ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).

    Example:
        >>> import tfbnn
        >>> tfbnn.methods.get("ibnn").bayesian
        True
    """
    if isinstance(name, Method):
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"Unknown method. Expected one of {list(_REGISTRY)}. Received: method={name!r}")
    return _REGISTRY[name]


def names(zoo=None, bayesian=None, stochastic=None, build=None, convertible=None, ensemble=None):
    """The registered method names, in registration order, that match every filter given.

    Args:
        zoo: bool or None; the zoo builds it (``build == "zoo"``).
        bayesian: bool or None.
        stochastic: bool or None.
        build: one of :data:`BUILDS` or None.
        convertible: bool or None; :func:`tfbnn.convert.to_bayesian` converts to it.
        ensemble: an in-network ensemble name or None: the methods that go with it.

    Example:
        >>> import tfbnn
        >>> tfbnn.methods.names(zoo=True, bayesian=True)[:3]
        ('bbb', 'vd', 'ibnn')
    """
    def keep(m):
        return ((zoo is None or m.zoo == zoo) and (bayesian is None or m.bayesian == bayesian)
                and (stochastic is None or m.stochastic == stochastic) and (build is None or m.build == build)
                and (convertible is None or bool(m.conversions) == convertible)
                and (ensemble is None or ensemble in m.ensembles))

    return tuple(m.name for m in _REGISTRY.values() if keep(m))


def conversion_names():
    """Every :func:`tfbnn.convert.to_bayesian` ``method`` name, method by method."""
    return tuple(c for m in _REGISTRY.values() for c in m.conversions)


def method_of_conversion(conversion):
    """``(Method, Conversion)`` of a :func:`tfbnn.convert.to_bayesian` ``method`` name.

    Raises:
        ValueError: an unknown name (the message lists the known ones).

    Example:
        >>> import tfbnn
        >>> method, conversion = tfbnn.methods.method_of_conversion("kingma")
        >>> method.name, conversion.dense_kwargs
        ('vd', {'parameterization': 'multiplicative'})
    """
    for method in _REGISTRY.values():
        if isinstance(conversion, str) and conversion in method.conversions:
            return method, method.conversions[conversion]
    raise ValueError(f"Unknown conversion method. Expected one of {list(conversion_names())}. "
                     f"Received: method={conversion!r}")


def layer_class(spec):
    """The layer class a :class:`Method` or :class:`Conversion` names: ``spec`` a :mod:`tfbnn.layers`
    class name, or a class itself (a method of your own with its own layer); None stays None.

    Raises:
        ValueError: a name that :mod:`tfbnn.layers` does not have.
    """
    if spec is None or isinstance(spec, type):
        return spec
    from tfbnn import layers

    cls = getattr(layers, spec, None) if isinstance(spec, str) else None
    if not isinstance(cls, type):
        raise ValueError(f"Expected the name of a tfbnn.layers class or a layer class. Received: {spec!r}")
    return cls


# -- the functions of the built-in methods ---------------------------------------------------------
def _multi_sample_model(model, num_samples):
    from tfbnn.multisample import MultiSampleModel

    return MultiSampleModel(model, num_samples=num_samples)


def _check_rate(options):
    rate = options["rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
        raise ValueError(f"Expected `rate` in [0, 1). Received: rate={rate!r}")
    return {**options, "rate": float(rate)}


def _check_bbb(options):
    from tfbnn import priors

    if options["estimator"] not in ESTIMATORS:
        raise ValueError(
            f"Unknown estimator. Expected one of {list(ESTIMATORS)}. Received: estimator={options['estimator']!r}"
        )
    return {**options, "prior": priors.get(options["prior"])}


def _check_vd(options):
    from tfbnn.layers.variational_dropout import resolve_parameterization

    return {**options, "parameterization": resolve_parameterization(options["parameterization"])}


def _check_ibnn(options):
    from tfbnn._internal import checks

    k = options["num_components"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"Expected `num_components` (K) to be an integer >= 1. Received: num_components={k!r}")
    resolved = dict(options)
    # The node layers' own rules; spreads may be 0 (every mean at init_mean, every scale at init_scale_mean).
    for key in ("prior_stddev", "init_scale_mean"):
        resolved[key] = checks.number(key, resolved[key], low=0, low_open=True)
    for key in ("init_stddev", "init_scale_stddev"):
        resolved[key] = checks.number(key, resolved[key], low=0)
    for key in ("prior_mean", "init_mean"):
        resolved[key] = checks.number(key, resolved[key])
    return resolved


# How each family's options become its layers' arguments (the zoo's prior translation).
def _bbb_layer_kwargs(options):
    prior = options["prior"]
    return {"kernel_prior": prior, "bias_prior": prior}


def _vd_layer_kwargs(options):
    return {"parameterization": options["parameterization"]}


def _ibnn_layer_kwargs(options):
    """The node layers' one prior object, ``node_prior = Normal(prior_mean, prior_stddev)``, and the other options."""
    from tfbnn import priors

    rest = {k: v for k, v in options.items() if k not in ("prior_mean", "prior_stddev")}
    return {"node_prior": priors.Normal(options["prior_mean"], options["prior_stddev"]), **rest}


_BBB_DENSE = {"flipout": "DenseFlipout", "reparameterization": "DenseReparameterization",
              "local_reparameterization": "DenseLocalReparameterization"}
# tfbnn has no local-reparameterization convolution; Flipout is the convolution whose noise differs per example.
_BBB_CONV = {"flipout": "Conv2DFlipout", "reparameterization": "Conv2DReparameterization",
             "local_reparameterization": "Conv2DFlipout"}


#: ``jit_compile="auto"``'s measured rule on CPUs: ``(network, layer) -> {kernels: XLA on}``, whether XLA made the
#: whole train step faster in benchmarks/README.md's side-by-side runs (2 AMD EPYC cores, 2026-12-03, one interleaved
#: run per kernel path, TensorFlow's pooled CPU allocator; tests/test_methods_registry.py checks every entry against
#: those tables). Networks: ``"mlp"`` (784-1200-1200-10, batch 128: benchmarks/dense_floors.py), ``"lenet5"``
#: (LeNet-5, batch 32) and ``"resnet20"`` (a ResNet-20-sized stack of 19 convolutions, batch 16: it stands for the
#: zoo's deep convolutional networks; both benchmarks/conv_layers.py). Layers: the benchmarks' row names. Kernels:
#: TensorFlow's CPU kernel library (:func:`kernel_library`). What was not measured (other networks, priors,
#: variational dropout in an MLP, GPUs) gets no XLA from the rule. Milliseconds per step, XLA on against off.
XLA_RULE = {
    ("mlp", "keras_dense"): {"eigen": True, "onednn": True},           # Eigen 7.9 / 9.3, oneDNN 8.6 / 9.3
    ("mlp", "tfbnn_reparam"): {"eigen": True, "onednn": True},         # 30.5 / 31.5, 32.5 / 34.7
    ("mlp", "tfbnn_flipout"): {"eigen": False, "onednn": False},       # 39.0 / 37.9, 43.7 / 41.0
    ("mlp", "tfbnn_local"): {"eigen": True, "onednn": True},           # 24.3 / 25.9, 26.3 / 27.0
    ("lenet5", "keras_conv"): {"eigen": True, "onednn": False},        # 6.4 / 8.4, 4.7 / 3.3
    ("lenet5", "tfbnn_reparam"): {"eigen": True, "onednn": False},     # 5.8 / 7.4, 4.2 / 2.9
    ("lenet5", "tfbnn_flipout"): {"eigen": True, "onednn": False},     # 9.9 / 10.6, 6.6 / 4.3
    ("lenet5", "tfbnn_vd"): {"eigen": False, "onednn": False},         # 13.8 / 12.3, 8.8 / 5.4
    ("resnet20", "keras_conv"): {"eigen": True, "onednn": False},      # 24.0 / 31.3, 23.8 / 19.6
    ("resnet20", "tfbnn_reparam"): {"eigen": True, "onednn": False},   # 30.8 / 36.7, 29.8 / 22.5
    ("resnet20", "tfbnn_flipout"): {"eigen": False, "onednn": False},  # 71.6 / 65.6, 71.8 / 43.3
    ("resnet20", "tfbnn_vd"): {"eigen": False, "onednn": False},       # 126.0 / 85.2, 124.6 / 58.2
}


def kernel_library():
    """TensorFlow's CPU kernel library here: ``"eigen"`` or ``"onednn"``.

    ``TF_ENABLE_ONEDNN_OPTS`` decides where it is set (``0``/``false``: Eigen); otherwise oneDNN on x86-64
    (TensorFlow's default there) and Eigen elsewhere (ARM wheels run Eigen unless oneDNN is asked for).

    Example:
        >>> import tfbnn
        >>> tfbnn.methods.kernel_library() in ("eigen", "onednn")
        True
    """
    flag = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if flag is not None and flag.strip():
        return "eigen" if flag.strip().lower() in ("0", "false") else "onednn"
    return "onednn" if platform.machine().lower() in ("x86_64", "amd64") else "eigen"


def _keras_xla(options, network):
    return "keras_dense" if network == "mlp" else "keras_conv"


#: The benchmark row (of :data:`XLA_RULE`) that measured each Bayes-by-Backprop layer class.
_BENCHMARK_ROWS = {"DenseReparameterization": "tfbnn_reparam", "DenseFlipout": "tfbnn_flipout",
                   "DenseLocalReparameterization": "tfbnn_local", "Conv2DReparameterization": "tfbnn_reparam",
                   "Conv2DFlipout": "tfbnn_flipout"}


def _bbb_xla(options, network):
    if options.get("prior", "normal") != "normal":
        return None  # measured with the N(0, 1) prior only
    layers = _BBB_DENSE if network == "mlp" else _BBB_CONV
    return _BENCHMARK_ROWS.get(layers.get(options.get("estimator", "flipout")))


def _vd_xla(options, network):
    # Conv2DVariationalDropout (additive) was measured; an MLP of it was not.
    return "tfbnn_vd" if network != "mlp" and options.get("parameterization", "additive") == "additive" else None


def _vd_conversion(options):
    return "vd_multiplicative" if options.get("parameterization") == "multiplicative" else "vd"


def _bbb_conversion(options):
    return options.get("estimator", "flipout")


def _ibnn_sample_model(model, num_samples):
    from tfbnn import ibnn

    return ibnn.IBNNModel(model, num_train_samples=num_samples)


def _ibnn_eval_samples(model, num_samples):
    from tfbnn import ibnn

    k = ibnn.num_components(model)  # iBNN prediction draws the components in turn: a multiple of K
    return -(-num_samples // k) * k


def _ibnn_optimizer(optimizer, variational_learning_rate):
    from tfbnn import ibnn

    return ibnn.node_optimizer(optimizer, variational_learning_rate=variational_learning_rate)


# -- the built-in methods' command-line options -------------------------------------------------------
def _bbb_flags(values):
    prior = values.get("prior") or "normal"
    if prior == "scale_mixture":
        prior = {"class_name": "ScaleMixture", "config": {
            "pi": values["pi"] if values.get("pi") is not None else 0.25,
            "sigma1": values["sigma1"] if values.get("sigma1") is not None else 1.0,
            "sigma2": values["sigma2"] if values.get("sigma2") is not None else math.exp(-8.0)}}
    elif any(values.get(k) is not None for k in ("pi", "sigma1", "sigma2")):
        raise ValueError("--pi, --sigma1 and --sigma2 apply to --prior scale_mixture. Received: --prior normal")
    return {"estimator": values.get("layer") or "local_reparameterization", "prior": prior}


def _mc_dropout_flags(values):
    return {"rate": values["dropout_rate"] if values.get("dropout_rate") is not None else 0.1}


def _ibnn_flags(values):
    return {"num_components": values.get("num_components") or 4}


def _vd_flags(values):
    return {"parameterization": values.get("parameterization") or "additive"}


def _ensemble_flags(values):
    member = values.get("member_method") or "deterministic"
    return {"members": values.get("members") or _ENSEMBLE_DEFAULTS["members"], "member_method": member,
            **get(member).options_from(values)}


def _zoo_names():
    return names(zoo=True)


_ENSEMBLE_DEFAULTS = {"members": 5, "member_method": "deterministic"}

_BBB_FLAGS = (
    Flag("layer", "bbb only: gradient estimator: reparameterization (one weight sample per step), flipout "
         "(per-example sign flips), local_reparameterization (samples pre-activations; convolutions use flipout) "
         "(default: local_reparameterization)", choices=("reparameterization", "flipout", "local_reparameterization")),
    Flag("prior", "bbb only: normal = N(0, 1) (closed-form KL); scale_mixture = pi N(0, sigma1^2) + "
         "(1 - pi) N(0, sigma2^2) (Blundell eq. 7, Monte Carlo KL) (default: normal)",
         choices=("normal", "scale_mixture")),
    Flag("pi", "bbb, scale mixture: weight of the first component (default: 0.25)",
         type=argtypes.open_unit_interval),
    Flag("sigma1", "bbb, scale mixture: the wide scale (default: 1)", type=argtypes.positive_float),
    Flag("sigma2", "bbb, scale mixture: the narrow scale (default: exp(-8), the best of Blundell's grid)",
         type=argtypes.positive_float),
)

_VD_CONVERSIONS = {
    name: Conversion("DenseVariationalDropout", "Conv2DVariationalDropout", {"parameterization": p},
                     {"parameterization": p})
    for name, p in (("vd", "additive"), ("vd_additive", "additive"), ("molchanov", "additive"),
                    ("vd_multiplicative", "multiplicative"), ("kingma", "multiplicative"))
}
_BBB_CONVERSIONS = {
    name: Conversion(_BBB_DENSE[name], None if name == "local_reparameterization" else _BBB_CONV[name],
                     {"kernel_prior": PRIOR, "bias_prior": None}, {"kernel_prior": PRIOR, "bias_prior": None},
                     channels_last_only=True)
    for name in ("local_reparameterization", "flipout", "reparameterization")
}

_BUILT_IN_METHODS = (
    Method("deterministic", "", ensembles=("batch_ensemble",), xla=_keras_xla),
    Method("mc_dropout", "dropout kept on at inference", options={"rate": 0.1}, check_options=_check_rate,
           dropout_option="rate", ensembles=("batch_ensemble",), xla=_keras_xla,
           flags=(Flag("dropout_rate", "mc_dropout only: the dropout rate (default: 0.1)", type=argtypes.rate),),
           options_from_flags=_mc_dropout_flags),
    Method("bbb", "Bayes by Backprop", bayesian=True, options={"estimator": "flipout", "prior": "normal"},
           check_options=_check_bbb,
           layers={"dense": lambda o: _BBB_DENSE[o["estimator"]], "conv2d": lambda o: _BBB_CONV[o["estimator"]],
                   "lstm": "LSTMReparameterization", "gru": "GRUReparameterization"},
           layer_kwargs=_bbb_layer_kwargs, ensembles=("rank1",), conversions=_BBB_CONVERSIONS,
           conversion_for=_bbb_conversion, xla=_bbb_xla, label="BbB", flags=_BBB_FLAGS,
           options_from_flags=_bbb_flags),
    Method("vd", "sparse variational dropout", bayesian=True, options={"parameterization": "additive"},
           check_options=_check_vd,
           layers={"dense": "DenseVariationalDropout", "conv2d": "Conv2DVariationalDropout"},
           layer_kwargs=_vd_layer_kwargs, conversions=_VD_CONVERSIONS, conversion_for=_vd_conversion, xla=_vd_xla,
           flags=(Flag("parameterization", "vd only: additive (Molchanov 2017) or multiplicative (Kingma 2015)",
                       choices=("additive", "multiplicative")),),
           options_from_flags=_vd_flags),
    Method("ibnn", "node-based iBNN", bayesian=True,
           options={"num_components": 4, "prior_mean": 1.0, "prior_stddev": 0.1, "init_mean": 1.0,
                    "init_stddev": 0.5, "init_scale_mean": 0.05, "init_scale_stddev": 0.02},
           check_options=_check_ibnn, layers={"dense": "NodeDense", "conv2d": "NodeConv2D"},
           layer_kwargs=_ibnn_layer_kwargs, sample_model=_ibnn_sample_model,
           samples_phrase="noise samples per example", eval_samples=_ibnn_eval_samples,
           wrap_optimizer=_ibnn_optimizer,
           flags=(Flag("num_components", "ibnn only: mixture components K (default: 4)",
                       type=argtypes.positive_int, metavar="K"),),
           options_from_flags=_ibnn_flags),
    Method("graves", "Graves 2011, fixed N(0, 1) prior", build="convert", bayesian=True,
           conversions={"graves": Conversion(
               "GravesDense", "Conv2DFlipout", {"kernel_prior": PRIOR},
               {"kernel_prior": PRIOR, "bias_prior": None, "scale_parameterization": "log_variance"},
               channels_last_only=True)}),
    Method("ensemble", "a deep ensemble of --members networks of --member-method, Lakshminarayanan et al. 2017",
           build="ensemble", stochastic=True, options=_ENSEMBLE_DEFAULTS,
           flags=(Flag("members", f"ensemble only: the number of members, each trained from its own seed "
                       f"(seed + 1000 m) (default: {_ENSEMBLE_DEFAULTS['members']})", type=argtypes.positive_int,
                       metavar="M"),
                  Flag("member_method", "ensemble only: the members' method; the method flags (--layer, "
                       "--dropout-rate, ...) then apply to the members (default: deterministic)",
                       choices=_zoo_names)),
           options_from_flags=_ensemble_flags),
)
for _method in _BUILT_IN_METHODS:
    register(_method)
_BUILT_IN = frozenset(m.name for m in _BUILT_IN_METHODS)
del _method


# -- SNGP (Liu et al. 2020): spectrally normalized hidden layers, a random-feature GP output layer ---------------
_SNGP_DEFAULTS = {"norm_multiplier": 0.95, "power_iterations": 1, "num_inducing": 1024, "gp_kernel_scale": 1.0,
                  "gp_cov_momentum": -1.0, "gp_cov_ridge_penalty": 1.0, "gp_cov_likelihood": "gaussian",
                  "normalize_input": False}
# tfbnn.layers.gp.GP_COV_LIKELIHOODS (the registry loads no TensorFlow, so not imported from there)
_GP_COV_LIKELIHOODS = ("auto", "gaussian", "logistic")
_SNGP_BODY = ("norm_multiplier", "power_iterations")


def _check_sngp(options):
    from tfbnn._internal import checks

    resolved = dict(options)
    for key in ("norm_multiplier", "gp_kernel_scale", "gp_cov_ridge_penalty"):
        resolved[key] = checks.number(key, resolved[key], low=0, low_open=True)
    resolved["gp_cov_momentum"] = checks.number("gp_cov_momentum", resolved["gp_cov_momentum"], high=1,
                                                high_open=True)
    for key in ("power_iterations", "num_inducing"):
        resolved[key] = checks.integer(key, resolved[key], 1)
    if resolved["gp_cov_likelihood"] not in _GP_COV_LIKELIHOODS:
        raise ValueError(f"Expected `gp_cov_likelihood` in {list(_GP_COV_LIKELIHOODS)}. "
                         f"Received: gp_cov_likelihood={resolved['gp_cov_likelihood']!r}")
    resolved["normalize_input"] = bool(resolved["normalize_input"])
    return resolved


def _sngp_callbacks(model, options):
    from tfbnn import sngp

    return [sngp.ResetCovariance()]


register(Method(
    "sngp", "SNGP, Liu et al. 2020",
    options=_SNGP_DEFAULTS, check_options=_check_sngp,
    layers={"dense": "SpectralDense", "conv2d": "SpectralConv2D", "head": "RandomFeatureGaussianProcess"},
    layer_kwargs=lambda o: {k: o[k] for k in _SNGP_BODY},
    head_kwargs=lambda o: {k: v for k, v in o.items() if k not in _SNGP_BODY},
    callbacks=_sngp_callbacks, epistemic="gp_variance", label="SNGP"))
_BUILT_IN = _BUILT_IN | {"sngp"}


# -- single-pass methods with their own output layers: DDU, evidential, heteroscedastic ---------------------------
def _softmax_head(units, options, seed, name):
    import keras

    return [keras.layers.Dense(units, activation="softmax", name=name)]


def _evidential_head(units, options, seed, name):
    import keras

    from tfbnn import evidential

    return [keras.layers.Dense(units, name=f"{name}_evidence"),
            evidential.DirichletHead(evidence=options["evidence"], name=name)]


def _evidential_loss(options):
    from tfbnn import evidential

    return evidential.EvidentialClassificationLoss(options["loss"])


def _evidential_callbacks(model, options):
    from tfbnn import evidential

    return [evidential.EvidentialAnnealing(options["annealing_epochs"])]


def _heteroscedastic_head(units, options, seed, name):
    from tfbnn import layers

    return [layers.HeteroscedasticSoftmax(units, seed=seed, name=name, **options)]


register(Method(
    "ddu", "DDU, Mukhoti et al. 2023: spectrally normalized body, softmax head, a feature density fitted after "
    "training", options={k: _SNGP_DEFAULTS[k] for k in _SNGP_BODY},
    layers={"dense": "SpectralDense", "conv2d": "SpectralConv2D"}, layer_kwargs=lambda o: dict(o),
    head_layers=_softmax_head, epistemic="density", label="DDU"))
register(Method(
    "evidential", "evidential classification, Sensoy et al. 2018: a Dirichlet head, the annealed MSE loss",
    options={"evidence": "softplus", "loss": "mse", "annealing_epochs": 10},
    head_layers=_evidential_head, loss=_evidential_loss, callbacks=_evidential_callbacks, epistemic="evidential"))
register(Method(
    "heteroscedastic", "heteroscedastic softmax, Collier et al. 2021: correlated logit noise (aleatoric)",
    options={"num_factors": 10, "temperature": 1.0, "train_mc_samples": 1000, "test_mc_samples": 1000},
    head_layers=_heteroscedastic_head, epistemic="none"))
register(Method(
    "blob", "BLoB, Wang et al. 2024: Gaussian posteriors over the LoRA adapters of a pre-trained network "
    "(tfbnn.lora.variational)", build="adapter", bayesian=True, label="BLoB"))
_BUILT_IN = _BUILT_IN | {"ddu", "evidential", "heteroscedastic", "blob"}


# -- cyclical SG-MCMC: a deterministic network sampled by its optimizer ------------------------------------------
_SAMPLERS = ("sghmc", "sgld")
#: Zhang et al. 2020 (sec. 4): 4 cycles, exploration for the first 80% of each, a few samples at the end of each
#: cycle, SGHMC with momentum 0.9, T = 1; a N(0, 1) prior (prior_precision, in the potential's units).
_CSGMCMC_DEFAULTS = {"sampler": "sghmc", "cycles": 4, "exploration": 0.8, "samples_per_cycle": 3, "momentum": 0.9,
                     "temperature": 1.0, "prior_precision": 1.0}


def _check_csgmcmc(options):
    from tfbnn._internal import checks

    resolved = dict(options)
    if resolved["sampler"] not in _SAMPLERS:
        raise ValueError(f"Expected `sampler` in {list(_SAMPLERS)}. Received: sampler={resolved['sampler']!r}")
    for key in ("cycles", "samples_per_cycle"):
        resolved[key] = checks.integer(key, resolved[key], 1)
    resolved["exploration"] = checks.number("exploration", resolved["exploration"], 0.0, 1.0, high_open=True)
    resolved["momentum"] = checks.number("momentum", resolved["momentum"], 0.0, 1.0, high_open=True)
    for key in ("temperature", "prior_precision"):
        resolved[key] = checks.number(key, resolved[key], 0.0)
    return resolved


def _csgmcmc_sampler(options, learning_rate, total_steps, num_examples, seed):
    from tfbnn import sgmcmc

    if options["cycles"] > total_steps:
        raise ValueError(f"Cyclical SG-MCMC needs at least one optimizer step per cycle. Received: "
                         f"cycles={options['cycles']} for {total_steps} steps")
    schedule = sgmcmc.CyclicalSchedule(learning_rate, total_steps=total_steps, cycles=options["cycles"],
                                       exploration=options["exploration"])
    shared = dict(num_examples=num_examples, temperature=options["temperature"],
                  prior_precision=options["prior_precision"], seed=seed)
    if options["sampler"] == "sgld":
        return sgmcmc.SGLD(schedule, **shared)
    return sgmcmc.SGHMC(schedule, momentum=options["momentum"], **shared)


def _csgmcmc_callbacks(model, options):
    from tfbnn import sgmcmc

    return [sgmcmc.SampleCollector(per_cycle=options["samples_per_cycle"])]


def _csgmcmc_finish(model, callbacks):
    from tfbnn import sgmcmc

    collector = next(c for c in callbacks if isinstance(c, sgmcmc.SampleCollector))
    return collector.posterior(model).to_ensemble()


register(Method(
    "csgmcmc", "cyclical SG-MCMC, Zhang et al. 2020: a deterministic network sampled by SGHMC (or SGLD) on a "
    "cyclical step size, a few samples at the end of each cycle, predicting as their ensemble",
    options=_CSGMCMC_DEFAULTS, check_options=_check_csgmcmc, callbacks=_csgmcmc_callbacks,
    sampler=_csgmcmc_sampler, finish=_csgmcmc_finish, eval_samples=lambda model, t: 1,
    epistemic="mutual_information", label="cSG-MCMC"))
_BUILT_IN = _BUILT_IN | {"csgmcmc"}
