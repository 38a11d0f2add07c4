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

import math

import keras
import numpy as np

from tfbnn import layers as layers_lib
from tfbnn import methods as registry
from tfbnn import priors as priors_lib
from tfbnn._internal import deprecation

__all__ = ["CONVERSION_METHODS", "to_bayesian", "convertible_layers"]

#: Accepted ``method`` names (the built-in ones): each belongs to a method of the registry
#: (:attr:`tfbnn.methods.Method.conversions`), which says what Dense and Conv2D become.
CONVERSION_METHODS = registry.conversion_names()
_MIN_SIGMA = 1e-12


def convertible_layers(model):
    """The ``keras.layers.Dense`` and ``keras.layers.Conv2D`` layers of ``model`` (nested included)."""
    found = model._flatten_layers(include_self=False, recursive=True)
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
    def __init__(self, method, prior, mode, scale, seed, kl_weight, names, layer_kwargs):
        self.method, self.prior, self.mode, self.scale = method, prior, mode, scale
        self.layer_kwargs = layer_kwargs
        self.seed, self.kl_weight, self.names = seed, kl_weight, names
        self.pairs = []  # (original, new, converted)
        self.count = 0

    def _next_seed(self):
        self.count += 1
        return None if self.seed is None else self.seed + self.count

    def _bayesian(self, layer):
        is_conv = isinstance(layer, keras.layers.Conv2D)
        common = {**_common(layer), "seed": self._next_seed(), "kl_weight": self.kl_weight, **self.layer_kwargs}
        _, conversion = registry.method_of_conversion(self.method)
        if is_conv:
            cls = registry.layer_class(conversion.conv2d)
            if cls is None:
                raise ValueError(
                    f"Method {self.method!r} has no Conv2D layer in tfbnn.layers, so Conv2D layer "
                    f"{layer.name!r} cannot be converted. Keep it deterministic with "
                    f"`exclude=[{layer.name!r}]`, or use method='vd' or 'flipout'. Received: method={self.method!r}"
                )
            args = _conv_args(layer)
            if conversion.channels_last_only and args.pop("data_format") != "channels_last":
                raise ValueError(
                    f"{cls.__name__} supports channels_last inputs only; Conv2D layer {layer.name!r} is "
                    f"channels_first. Use method='vd' or exclude it. Received: method={self.method!r}"
                )
            return cls(**args, **conversion.kwargs("conv2d", self.prior), **common)
        cls = registry.layer_class(conversion.dense)
        return cls(layer.units, **conversion.kwargs("dense", self.prior), **common)

    def __call__(self, layer):
        if layer.name in self.names:
            new = self._bayesian(layer)
            self.pairs.append((layer, new, True))
            return new
        new = layer.__class__.from_config(layer.get_config())
        self.pairs.append((layer, new, False))
        return new

    def initialise(self, new, old):
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
        kinds = sorted({type(l).__name__ for l in model._flatten_layers(include_self=False, recursive=True)})
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
    converter = _Converter(
        method, prior, mode, scale, seed, kl_weight, _select(model, layers, exclude), dict(layer_kwargs or {})
    )
    try:
        new_model = keras.models.clone_model(model, clone_function=converter, recursive=True)
    except ValueError as e:
        if "subclass" in str(e).lower() or "functional" in str(e).lower() or "sequential" in str(e).lower():
            raise ValueError(
                "Conversion rebuilds the model, which needs a Sequential or functional model. "
                f"Received: model of type {type(model).__name__} ({e})"
            ) from e
        raise
    for old, new, converted in converter.pairs:
        if not new.built:
            raise ValueError(f"Layer {new.name!r} was not built by the cloned model; cannot copy its weights.")
        if converted:
            converter.initialise(new, old)
        else:
            new.set_weights(old.get_weights())
    new_model.name = name or f"{model.name}_{method}"
    return new_model


__getattr__ = deprecation.renamed(__name__, {"METHODS": "CONVERSION_METHODS"})
