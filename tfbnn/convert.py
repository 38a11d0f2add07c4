"""Turn a trained deterministic Keras model into a Bayesian one.

The path "frequentist pre-training, then variational training": train an
ordinary model, convert its ``Dense`` and ``Conv2D`` layers to a Bayesian family
whose posterior means start at the trained weights and whose scales start
small, then continue training on the ELBO (usually with the KL annealed in,
:class:`tfbnn.KLAnnealing` with :class:`tfbnn.schedules.WarmUp`). Every other
layer (normalization, pooling, attention, embeddings, ...) is kept with its
trained weights.

================================  ===============================  ===============================
method                            Dense becomes                    Conv2D becomes
================================  ===============================  ===============================
``"vd"`` (``"vd_additive"``,      DenseVariationalDropout          Conv2DVariationalDropout
``"molchanov"``)                  (additive, sparse VD)            (additive)
``"vd_multiplicative"``           DenseVariationalDropout          Conv2DVariationalDropout
(``"kingma"``)                    (multiplicative, alpha <= 1)     (multiplicative)
``"graves"``                      GravesDense                      Conv2DFlipout, log-variance
                                  (prior ``prior``)                posterior (prior ``prior``)
``"flipout"``,                    DenseFlipout,                    Conv2DFlipout,
``"reparameterization"``          DenseReparameterization          Conv2DReparameterization
                                  (prior ``prior``)                (prior ``prior``)
``"local_reparameterization"``    DenseLocalReparameterization     -- (keep it with ``exclude``)
================================  ===============================  ===============================

Each ``method`` name belongs to a method of the registry (:attr:`tfbnn.methods.Method.conversions`,
a :class:`tfbnn.methods.Conversion` each; the table above shows the built-in ones), so a
registered method can be a conversion target too.

Initial scales: ``init_scale`` a float gives every converted weight the posterior
standard deviation ``sigma = init_scale``; ``init_scale="moped"`` gives
``sigma = moped_delta * |w|`` (MOPED, Krishnan et al. 2020), i.e. for variational
dropout a constant ``alpha = moped_delta^2``. With scales near 0 the converted
model predicts as the deterministic one, also when sampling. Floors: the softplus
parameterization has ``sigma >= 1e-6``; variational dropout clips
``log alpha >= min_log_alpha`` (-8 by default, noise std >= 1.8% of ``|w|``; pass
``layer_kwargs={"min_log_alpha": -20.0}`` for less).

Example:
    >>> import keras, numpy as np, tfbnn
    >>> ds = tfbnn.datasets.load("digits")                 # 8x8 digits, offline
    >>> x, y = ds.x_train[:256], ds.y_train[:256]
    >>> det = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, "relu"),
    ...                         keras.layers.Dense(10, "softmax")])
    >>> det.compile("adam", "sparse_categorical_crossentropy")
    >>> _ = det.fit(x, y, epochs=1, verbose=0)
    >>> bnn = tfbnn.convert.to_bayesian(det, method="vd", init_scale="moped", moped_delta=0.05)
    >>> [type(layer).__name__ for layer in bnn.layers]
    ['DenseVariationalDropout', 'DenseVariationalDropout']
    >>> with tfbnn.posterior_mean(bnn):                    # posterior means = the trained weights
    ...     np.allclose(bnn.predict(x, verbose=0), det.predict(x, verbose=0), atol=1e-5)
    True
    >>> bnn.compile("adam", "sparse_categorical_crossentropy")
    >>> _ = bnn.fit(x, y, epochs=1, verbose=0,
    ...             callbacks=[tfbnn.KLAnnealing(len(x), tfbnn.schedules.WarmUp(1, 10))])

Reference:
    Krishnan, Subedar, Tickoo. Specifying Weight Priors in Bayesian Deep Neural
    Networks with Empirical Bayes (MOPED). AAAI 2020.
"""

import fnmatch
import math
import re

import keras
import numpy as np

from tfbnn import layers as layers_lib
from tfbnn import methods as registry
from tfbnn import priors as priors_lib
from tfbnn._internal import deprecation, keras_private

__all__ = ["CONVERSION_METHODS", "to_bayesian", "convertible_layers", "by_policy", "policy_plan", "layer_paths",
           "policy_methods", "MC_DROPOUT", "KEEP"]

#: Accepted ``method`` names (the built-in ones): each belongs to a method of the registry
#: (:attr:`tfbnn.methods.Method.conversions`), which says what Dense and Conv2D become.
CONVERSION_METHODS = registry.conversion_names()
_MIN_SIGMA = 1e-12


def convertible_layers(model):
    """The ``keras.layers.Dense`` and ``keras.layers.Conv2D`` layers of ``model`` (nested included)."""
    found = keras_private.sublayers(model)
    return [l for l in found if type(l) in (keras.layers.Dense, keras.layers.Conv2D)]


# -- argument checks -------------------------------------------------------------
def _check_method(method):
    registry.method_of_conversion(method)  # an unknown name: the error lists the known ones
    return method


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not (
        math.isfinite(value) and value > 0
    ):
        raise ValueError(f"Expected `{name}` to be a positive finite number. Received: {name}={value!r}")
    return float(value)


def check_init_scale(init_scale, moped_delta):
    if init_scale == "moped":
        return "moped", _check_positive("moped_delta", moped_delta)
    if isinstance(init_scale, str):
        raise ValueError(
            f"Expected `init_scale` to be a positive number or 'moped'. Received: init_scale={init_scale!r}"
        )
    return "fixed", _check_positive("init_scale", init_scale)


# -- initial scale parameters ------------------------------------------------------
def _sigma(weights, mode, value):
    if mode == "moped":
        return np.maximum(value * np.abs(weights), _MIN_SIGMA)
    return np.full(weights.shape, value)


def _inverse_softplus(y):
    y = np.maximum(y, _MIN_SIGMA)
    return y + np.log(-np.expm1(-y))


def _rho(sigma, parameterization):
    if parameterization == "log_variance":
        return np.log(np.square(sigma))
    return _inverse_softplus(sigma - 1e-6)  # sigma = softplus(rho) + 1e-6


# -- building the Bayesian layers -------------------------------------------------
def _common(layer):
    config = layer.get_config()
    return {
        "name": layer.name,
        "activation": config["activation"],
        "use_bias": config["use_bias"],
        "dtype": config.get("dtype"),
    }


def _conv_args(layer):
    config = layer.get_config()
    if config.get("groups", 1) != 1:
        raise ValueError(
            f"Grouped convolutions are not converted. Received: layer {layer.name!r} with groups={config['groups']}"
        )
    return {
        "filters": config["filters"],
        "kernel_size": tuple(config["kernel_size"]),
        "strides": tuple(config["strides"]),
        "padding": config["padding"],
        "data_format": config["data_format"],
        "dilation_rate": tuple(config["dilation_rate"]),
    }


class _Converter:
    """The clone function: ``plan`` maps ``id(layer)`` to the method that layer becomes."""

    def __init__(self, plan, prior, mode, scale, seed, kl_weight, layer_kwargs, share=False):
        self.plan, self.prior, self.mode, self.scale = plan, prior, mode, scale
        self.layer_kwargs = layer_kwargs
        self.seed, self.kl_weight = seed, kl_weight
        self.share = share  # reuse every layer with nothing of the plan in it; rebuild only the graphs that have
        self.rebuilt = {}  # id(original graph) -> its rebuilt copy (share mode: each graph once)
        self.pairs = []  # (original, new, converted)
        self.count = 0

    def _next_seed(self):
        self.count += 1
        return None if self.seed is None else self.seed + self.count

    def _bayesian(self, layer, method):
        if method == MC_DROPOUT:
            return layers_lib.MCDropout(layer.rate, noise_shape=layer.noise_shape, seed=self._next_seed(),
                                        name=layer.name, dtype=layer.dtype_policy)
        is_conv = isinstance(layer, keras.layers.Conv2D)
        common = {**_common(layer), "seed": self._next_seed(), "kl_weight": self.kl_weight, **self.layer_kwargs}
        _, conversion = registry.method_of_conversion(method)
        if is_conv:
            cls = registry.layer_class(conversion.conv2d)
            if cls is None:
                raise ValueError(
                    f"Method {method!r} has no Conv2D layer in tfbnn.layers, so Conv2D layer "
                    f"{layer.name!r} cannot be converted. Keep it deterministic with "
                    f"`exclude=[{layer.name!r}]`, or use method='vd' or 'flipout'. Received: method={method!r}"
                )
            args = _conv_args(layer)
            if conversion.channels_last_only and args.pop("data_format") != "channels_last":
                raise ValueError(
                    f"{cls.__name__} supports channels_last inputs only; Conv2D layer {layer.name!r} is "
                    f"channels_first. Use method='vd' or exclude it. Received: method={method!r}"
                )
            return cls(**args, **conversion.kwargs("conv2d", self.prior), **common)
        cls = registry.layer_class(conversion.dense)
        return cls(layer.units, **conversion.kwargs("dense", self.prior), **common)

    def _holds_plan(self, layer):
        return any(id(inner) in self.plan for inner in keras_private.sublayers(layer))

    def __call__(self, layer):
        if id(layer) in self.plan:
            new = self._bayesian(layer, self.plan[id(layer)])
            self.pairs.append((layer, new, True))
            return new
        if self.share:
            if not (_is_graph(layer) and self._holds_plan(layer)):
                return layer  # nothing converted in it: the same layer (and weights), never rebuilt from its config
            if id(layer) not in self.rebuilt:  # a graph with a converted layer: rebuilt, one level at a time
                self.rebuilt[id(layer)] = keras.models.clone_model(layer, clone_function=self)
            return self.rebuilt[id(layer)]
        new = layer.__class__.from_config(layer.get_config())
        self.pairs.append((layer, new, False))
        return new

    def initialise(self, new, old):
        if isinstance(new, layers_lib.MCDropout):
            return
        kernel = old.kernel.numpy() if hasattr(old.kernel, "numpy") else np.asarray(old.kernel)
        new.kernel_loc.assign(kernel)
        sigma = _sigma(kernel.astype(np.float64), self.mode, self.scale)
        if isinstance(new, (layers_lib.DenseVariationalDropout, layers_lib.Conv2DVariationalDropout)):
            # alpha = sigma^2 / w^2, written so that the layer's own log alpha (which uses
            # log(w^2 + 1e-8) in the additive form) comes out exactly.
            w2 = np.square(kernel.astype(np.float64))
            log_alpha = np.log(np.square(sigma)) - np.log(np.maximum(w2, 1e-30))
            log_alpha = np.clip(log_alpha, new.min_log_alpha, new.max_log_alpha)
            if new.parameterization == "additive":
                new.kernel_log_sigma2.assign((log_alpha + np.log(w2 + 1e-8)).astype(np.float32))
            else:
                new.kernel_log_alpha.assign(log_alpha.astype(np.float32))
            if old.use_bias:
                new.bias_loc.assign(old.bias.numpy())
            return
        new.kernel_rho.assign(_rho(sigma, new.scale_parameterization).astype(np.float32))
        if old.use_bias:
            new.bias_loc.assign(old.bias.numpy())


def _select(model, layers, exclude):
    candidates = convertible_layers(model)
    names = [l.name for l in candidates]
    if not candidates:
        kinds = sorted({type(l).__name__ for l in keras_private.sublayers(model)})
        raise ValueError(
            "Expected a model with at least one keras.layers.Dense or keras.layers.Conv2D layer to "
            f"convert. Received: model={model.name!r} with layers of types {kinds}"
        )
    for arg, given in (("layers", layers), ("exclude", exclude)):
        unknown = sorted(set(given or ()) - set(names))
        if unknown:
            raise ValueError(
                f"Expected `{arg}` to name Dense/Conv2D layers of the model {names}. Received: {arg}={list(given)}"
            )
    chosen = [n for n in names if (layers is None or n in layers) and n not in set(exclude or ())]
    if not chosen:
        raise ValueError(f"No layer left to convert. Received: layers={layers}, exclude={exclude}")
    return set(chosen)


def to_bayesian(
    model,
    method="vd",
    init_scale=1e-3,
    moped_delta=0.1,
    prior="normal",
    layers=None,
    exclude=None,
    num_examples=None,
    kl_weight=None,
    seed=None,
    name=None,
    layer_kwargs=None,
):
    """A Bayesian copy of a trained deterministic model, means initialised from its weights.

    Args:
        model: a built Sequential or functional Keras model (nested ones included).
        method: the Bayesian family, one of :data:`CONVERSION_METHODS` (see the module table).
            Default ``"vd"`` (sparse variational dropout).
        init_scale: float > 0, the initial posterior standard deviation of every
            converted weight; or ``"moped"`` for ``sigma = moped_delta * |w|``.
            Default 1e-3.
        moped_delta: float > 0, MOPED's ``delta``. Default 0.1.
        prior: the kernel prior of the Bayes-by-Backprop methods and of ``"graves"``
            (name or :class:`tfbnn.priors.Prior`). Default ``"normal"``, the fixed
            ``N(0, 1)``; ``tfbnn.priors.Normal(0.0, 2.0)`` for a wider one; for
            ``"graves"``, ``"graves"`` / ``"adaptive"`` is Graves' fitted prior, which can
            collapse the network at ``beta = 1`` (:class:`tfbnn.priors.Graves`).
            Ignored by ``"vd*"`` (log-uniform). Biases stay point estimates.
        layers: names of the Dense/Conv2D layers to convert, or None (all).
        exclude: names of Dense/Conv2D layers to keep deterministic.
        num_examples: int > 0 or None. Sets ``kl_weight = 1 / num_examples`` (the
            ELBO convention); or set it later (``tfbnn.KLAnnealing``).
        kl_weight: float or None, an explicit ``beta / N`` instead.
        seed: int or None; converted layer ``i`` (1-based) gets ``seed + i``.
        name: str or None, the new model's name (default ``<name>_<method>``).
        layer_kwargs: dict or None, extra constructor arguments of every new
            Bayesian layer, e.g. ``{"min_log_alpha": -20.0}`` (variational dropout
            clips ``log alpha >= -8`` by default, so its noise std is at least
            ``e^-4 |w|`` ~ 1.8% of ``|w|`` whatever ``init_scale``; lower it to make
            the converted net sample closer to the deterministic one) or
            ``{"inference_mode": "mean"}``.

    Returns:
        A new, uncompiled Keras model; ``model`` is not changed. Layer names are kept.
        Converted layers keep units / filters, kernel geometry, activation and bias;
        their regularizers and constraints are not carried over (the KL is the
        regularizer).

    Raises:
        ValueError: an unknown method, no Dense/Conv2D layer to convert, a bad
            scale, a subclassed model, or a Conv2D layer the method cannot convert.
    """
    method = _check_method(method)
    options = _check_options(model, init_scale, moped_delta, prior, num_examples, kl_weight, seed, layer_kwargs)
    chosen = _select(model, layers, exclude)
    plan = {id(l): method for l in convertible_layers(model) if l.name in chosen}
    return _rebuild(model, plan, options, name or f"{model.name}_{method}")


def _check_options(model, init_scale, moped_delta, prior, num_examples, kl_weight, seed, layer_kwargs):
    """The checked shared arguments of :func:`to_bayesian` and :func:`by_policy`, as a dict."""
    mode, scale = check_init_scale(init_scale, moped_delta)
    if num_examples is not None:
        if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples <= 0:
            raise ValueError(
                f"Expected `num_examples` to be a positive integer. Received: num_examples={num_examples!r}"
            )
        if kl_weight is not None:
            raise ValueError(
                "Pass `num_examples` or `kl_weight`, not both. "
                f"Received: num_examples={num_examples}, kl_weight={kl_weight}"
            )
        kl_weight = 1.0 / int(num_examples)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"Expected `seed` to be an int or None. Received: seed={seed!r}")
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
    if not model.built:
        raise ValueError(f"Expected a built (trained) model. Received: model={model.name!r} that is not built")
    prior = priors_lib.get(prior)
    if layer_kwargs is not None and not isinstance(layer_kwargs, dict):
        raise ValueError(f"Expected `layer_kwargs` to be a dict or None. Received: layer_kwargs={layer_kwargs!r}")
    fixed = {"name", "seed", "kl_weight", "activation", "use_bias", "units", "filters"}
    reserved = sorted(set(layer_kwargs or {}) & fixed)
    if reserved:
        raise ValueError(
            f"`layer_kwargs` cannot set {reserved}: conversion sets them. Received: layer_kwargs={layer_kwargs}"
        )
    return {"prior": prior, "mode": mode, "scale": scale, "seed": seed, "kl_weight": kl_weight,
            "layer_kwargs": dict(layer_kwargs or {})}


def _rebuild(model, plan, options, name, share=False):
    """Clones ``model`` (nested models included) with the layers of ``plan`` converted, weights copied.

    With ``share``, only the layers of ``plan`` and the graphs (nested Sequential/functional
    models) that hold one are new; every other layer is the original object, shared.
    """
    converter = _Converter(plan, **options, share=share)
    try:
        new_model = keras.models.clone_model(model, clone_function=converter, recursive=not share)
    except ValueError as e:
        if "subclass" in str(e).lower() or "functional" in str(e).lower() or "sequential" in str(e).lower():
            raise ValueError(
                "Conversion rebuilds the model, which needs a Sequential or functional model. "
                f"Received: model of type {type(model).__name__} ({e})"
            ) from e
        raise
    for old, new, converted in converter.pairs:
        if not isinstance(old, keras.layers.Layer):  # a graph operation (a KerasHub task's dict lookups)
            continue
        if not new.built:
            raise ValueError(f"Layer {new.name!r} was not built by the cloned model; cannot copy its weights.")
        if converted:
            converter.initialise(new, old)
        else:
            new.set_weights(old.get_weights())
    new_model.name = name
    return new_model



# -- conversion by policy -----------------------------------------------------------
#: The policy method that replaces a ``keras.layers.Dropout`` by :class:`tfbnn.layers.MCDropout`.
MC_DROPOUT = "mc_dropout"
#: The policy method that leaves a layer as it is.
KEEP = "keep"
_WEIGHT_TYPES = (keras.layers.Dense, keras.layers.Conv2D, keras.layers.EinsumDense)
_CONTAINERS = (keras.Sequential, keras.Model)


def policy_methods():
    """The ``method`` names a policy accepts: the conversion names, ``"mc_dropout"`` and ``"keep"``."""
    return (*registry.conversion_names(), MC_DROPOUT, KEEP)


def _is_graph(layer):
    """Whether ``layer`` is a Sequential/functional model (its layers are rebuilt by cloning)."""
    return isinstance(layer, _CONTAINERS) and bool(getattr(layer, "_operations", None) or
                                                   isinstance(layer, keras.Sequential))


def _walk(container, prefix="", owner=None):
    """``(path, layer, owner)`` for every layer under ``container``, depth first.

    ``path`` joins the names of the enclosing models and layers with ``/``; ``owner`` is
    the path of the innermost enclosing subclassed (non-graph) layer, or None.
    """
    for path, layer, owner, _ in _walk_parents(container, prefix, owner):
        yield path, layer, owner


def _walk_parents(container, prefix="", owner=None):
    """:func:`_walk` with each layer's direct container as a fourth item."""
    for layer in keras_private.sublayers(container, recursive=False):
        path = f"{prefix}{layer.name}"
        yield path, layer, owner, container
        inner_owner = owner if _is_graph(layer) else (owner or path)
        yield from _walk_parents(layer, f"{path}/", inner_owner)


def layer_paths(model):
    """Every layer's path in ``model``: the names of its enclosing models and layers joined by ``/``.

    For a KerasHub ``BertTextClassifier`` e.g. ``"logits"``, ``"bert_backbone/pooled_dense"``,
    ``"bert_backbone/transformer_layer_0/self_attention_layer/query"``. (Keras' own
    ``layer.path`` is the name scope the layer was created in: it leaves out the functional
    models a layer belongs to, and is None for some layers.)
    """
    return [path for path, _, _ in _walk(model)]


def _check_policy(policy):
    entries = list(policy.items()) if isinstance(policy, dict) else policy
    try:
        entries = [(pattern, method) for pattern, method in entries]
    except (TypeError, ValueError):
        raise ValueError(
            "Expected `policy` to be a dict or a list of (pattern, method) pairs. "
            f"Received: policy={policy!r}") from None
    if not entries:
        raise ValueError(f"Expected at least one (pattern, method) entry. Received: policy={policy!r}")
    for pattern, method in entries:
        if not isinstance(pattern, str) or not pattern or pattern == "re:":
            raise ValueError(f"Expected each pattern to be a non-empty string. Received: pattern={pattern!r}")
        if method not in policy_methods():
            raise ValueError(
                f"Expected each method in {list(policy_methods())}. Received: method={method!r} "
                f"for pattern {pattern!r}")
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise ValueError(f"Expected a valid regular expression ({e}). Received: pattern={pattern!r}") from None
    return entries


def _matches(pattern, path):
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], path) is not None
    return fnmatch.fnmatchcase(path, pattern)


def _applies(method, layer):
    """Whether a policy entry's ``method`` is meant for ``layer``: dropout for MC dropout,
    a weight layer for a Bayesian method, any layer for ``"keep"``."""
    if method == KEEP:
        return True
    if method == MC_DROPOUT:
        return type(layer) is keras.layers.Dropout
    return type(layer) in _WEIGHT_TYPES


def _calls(parent, layer):
    """How many times the functional ``parent``'s own graph calls ``layer`` (other models built on
    the same layers add nodes to the layer, not to this graph)."""
    by_depth = getattr(parent, "_nodes_by_depth", None)
    if not by_depth:
        return 1
    return sum(1 for nodes in by_depth.values() for node in nodes if node.operation is layer)


def _refuse(path, layer, owner, method, parent):
    if isinstance(layer, keras.layers.EinsumDense):
        raise ValueError(
            f"The EinsumDense layer {path!r} (an attention projection) has no Bayesian counterpart in tfbnn. "
            f"Keep it: put ({path!r}, 'keep') (or a pattern such as '*/self_attention_layer/*') before the entry "
            "that matched it; for uncertainty in attention use MC dropout "
            f"(tfbnn.predict(..., mc_dropout=True)). Received: method={method!r} for {path!r}")
    if owner is not None:
        hint = ("MC dropout reaches it at prediction: tfbnn.predict(..., mc_dropout=True)" if method == MC_DROPOUT
                else f"keep it with an entry ({owner + '/*'!r}, 'keep') before the one that matched")
        raise ValueError(
            f"Layer {path!r} lives inside the subclassed layer {owner!r}, whose sublayers are code, not model "
            "graph, so it cannot be replaced and saved; " + hint + f". Received: method={method!r} "
            f"for {path!r}")
    calls = _calls(parent, layer)
    if calls > 1:
        raise ValueError(
            f"Layer {path!r} is shared (called {calls} times in the graph): its Bayesian copy "
            "would need one posterior for several calls. Keep it with an entry "
            f"({path!r}, 'keep') before the one that matched. Received: method={method!r} for {path!r}")


def _plan(model, policy):
    """``[(path, layer, method)]`` of the layers the policy changes, checked."""
    entries = _check_policy(policy)
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
    walked = list(_walk_parents(model))
    used, seen, plan = set(), {}, []
    for path, layer, owner, parent in walked:
        for i, (pattern, method) in enumerate(entries):
            if _matches(pattern, path):
                used.add(i)
        if not isinstance(layer, (*_WEIGHT_TYPES, keras.layers.Dropout)) or _is_graph(layer):
            continue
        method = next((m for p, m in entries if _matches(p, path) and _applies(m, layer)), KEEP)
        if method == KEEP:
            continue
        if id(layer) in seen:
            raise ValueError(
                f"Layer {path!r} is shared: it is also at {seen[id(layer)]!r}. Keep it with an entry "
                f"({path!r}, 'keep') before the one that matched. Received: method={method!r} for {path!r}")
        seen[id(layer)] = path
        _refuse(path, layer, owner, method, parent)
        plan.append((path, layer, method))
    unused = [entries[i][0] for i in range(len(entries)) if i not in used]
    if unused:
        raise ValueError(
            f"Expected every pattern to match a layer path. Received: patterns {unused} that match none of "
            f"{[w[0] for w in walked][:12]}{' ...' if len(walked) > 12 else ''}")
    return plan


def policy_plan(model, policy):
    """What :func:`by_policy` would do to ``model``: ``{layer path: method}`` of the layers it changes.

    Args:
        model: a Keras model.
        policy: as for :func:`by_policy`.

    Returns:
        A dict, in the order of :func:`layer_paths`, of the layers that change (``"keep"``
        ones are left out).

    Example:
        >>> import keras, tfbnn
        >>> inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="hidden")], name="body")
        >>> model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dropout(0.1, name="drop"),
        ...                           keras.layers.Dense(2, name="out")])
        >>> tfbnn.convert.policy_plan(model, [("body/*", "flipout"), ("drop", "mc_dropout"), ("*", "keep")])
        {'body/hidden': 'flipout', 'drop': 'mc_dropout'}
    """
    return {path: method for path, _, method in _plan(model, policy)}


def by_policy(
    model,
    policy,
    init_scale=1e-3,
    moped_delta=0.1,
    prior="normal",
    num_examples=None,
    kl_weight=None,
    seed=None,
    name=None,
    layer_kwargs=None,
    verbose=False,
):
    """A Bayesian version of any Sequential/functional model, each layer converted as a policy says.

    It shares the layers it does not convert with ``model`` (see "What is new and what is shared").

    The policy is an ordered list of ``(pattern, method)`` pairs (or a dict, in its order).
    Each layer's *path* (:func:`layer_paths`: the names of its enclosing models and
    layers joined by ``/``, e.g. ``"bert_backbone/pooled_dense"``) is matched against the
    patterns in order and **the first entry that matches and applies to the layer wins**:

    * a pattern is a shell glob (:func:`fnmatch.fnmatchcase`; ``*`` also crosses ``/``),
      or a regular expression after ``"re:"`` (:func:`re.fullmatch`);
    * a Bayesian method (any of :data:`CONVERSION_METHODS`: Bayes by Backprop with the
      ``"reparameterization"``, ``"flipout"`` or ``"local_reparameterization"`` estimator,
      ``"graves"``, variational dropout ``"vd"`` / ``"vd_multiplicative"``) applies to
      weight layers (``Dense``, ``Conv2D``, ``EinsumDense``);
      ``"mc_dropout"`` applies to ``keras.layers.Dropout`` (it becomes
      :class:`tfbnn.layers.MCDropout`, on at inference, seeded); ``"keep"`` to any layer;
    * a layer no entry applies to is kept, with its trained weights;
    * a pattern that matches no layer path at all is an error (a typo would otherwise
      convert nothing).

    The converted weights start as in :func:`to_bayesian`: posterior means at the
    trained weights, standard deviations ``init_scale`` or MOPED ``moped_delta * |w|``
    (Krishnan et al. 2020). The KL follows the ELBO convention
    ``loss = mean NLL + beta * KL / N`` (``num_examples`` = N sets ``kl_weight = 1/N``).

    What is new and what is shared: the converted layers are new, and so is every model
    on the way to one (the model itself and each nested Sequential/functional model that
    holds a converted layer, at any depth), rebuilt as a plain functional ``keras.Model``
    (or ``keras.Sequential``) with the same graph. **Every other layer is reused, not
    copied**: a nested model with no converted layer in it (a KerasHub backbone when only
    the head is converted) is the very same object, never rebuilt from its config, and so
    are the unconverted layers of a rebuilt model. The result therefore shares those
    layers' weights with ``model``: training one changes the other, unless they are frozen
    (:func:`tfbnn.hub.bayesian_head` freezes them, in ``model`` too). A rebuilt model
    saves and loads as ``.keras`` whatever the original's class (a KerasHub task's own
    ``get_config`` would rebuild a deterministic backbone); a reused backbone saves with
    its own config (a KerasHub ``ViTBackbone`` rebuilds from its arguments); a task's
    preprocessor is not carried over.

    Refused with a ``ValueError`` that names the layer path and what to do: an
    ``EinsumDense`` (attention projections: keep them, use MC dropout), a layer inside
    a subclassed layer (e.g. the feed-forward ``Dense`` of a KerasHub
    ``TransformerEncoder``, which is code, not graph), and a shared layer.

    Args:
        model: a built Sequential or functional Keras model (a KerasHub task or backbone).
        policy: list of ``(pattern, method)`` pairs, or a dict pattern -> method.
        init_scale, moped_delta, prior, num_examples, kl_weight, seed, layer_kwargs:
            as for :func:`to_bayesian` (converted layer ``i`` gets ``seed + i``).
        name: str or None, the new model's name (default ``<name>_bayesian``).
        verbose: bool, print the report (path -> method) of what was converted.

    Returns:
        A new, uncompiled ``keras.Model`` that shares the unconverted layers of
        ``model`` (see above); ``model``'s graph and weights are not changed. The
        report is :func:`policy_plan` ``(model, policy)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
        >>> inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, "relu", name="hidden")],
        ...                          name="body")
        >>> model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dropout(0.1, name="drop"),
        ...                           keras.layers.Dense(2, name="out")])
        >>> bnn = tfbnn.convert.by_policy(model, {"body/*": "flipout", "drop": "mc_dropout"},
        ...                               num_examples=32, seed=0, verbose=True)
        body/hidden -> flipout
        drop -> mc_dropout
        >>> with tfbnn.posterior_mean(bnn):                    # means = the trained weights
        ...     np.allclose(bnn(x), model(x), atol=1e-5)
        True

    Reference:
        Krishnan, Subedar, Tickoo. Specifying Weight Priors in Bayesian Deep Neural
        Networks with Empirical Bayes (MOPED). AAAI 2020.
    """
    plan = _plan(model, policy)
    options = _check_options(model, init_scale, moped_delta, prior, num_examples, kl_weight, seed, layer_kwargs)
    if not plan:
        raise ValueError(
            f"The policy changes no layer (every match is 'keep' or applies to no layer). Received: policy={policy!r}")
    if verbose:
        print("\n".join(f"{path} -> {method}" for path, _, method in plan))
    return _rebuild(model, {id(layer): method for _, layer, method in plan}, options, name or f"{model.name}_bayesian",
                    share=True)


__getattr__ = deprecation.renamed(__name__, {"METHODS": "CONVERSION_METHODS"})
