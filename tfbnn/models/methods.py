"""The one way every zoo builder chooses its Bayesian method: :class:`LayerFactory`.

A builder describes its architecture once, asking a :class:`LayerFactory` for each
weight layer (``dense``, ``conv2d``), for dropout after a block (``dropout``,
``spatial_dropout``) and for batch norm. The factory decides, from the method, what
those layers are; it reads them from the method's entry in the method registry
(:class:`tfbnn.methods.Method`: ``options``, ``check_options``, ``layers``,
``layer_kwargs``, ``dropout_option``, ``ensembles``), so a method registered with
:func:`tfbnn.methods.register` is a zoo method too. The built-in ones:

* ``deterministic``: ``keras.layers.Dense`` / ``keras.layers.Conv2D``; no dropout
  (``dropout(x)`` returns ``x``).
* ``mc_dropout`` (option ``rate``, default 0.1): the same Keras layers, plus
  :class:`~tfbnn.layers.MCDropout` (``dropout``) / :class:`~tfbnn.layers.MCSpatialDropout2D`
  (``spatial_dropout``) with ``rate``, which stay on at inference.
* ``bbb`` (options ``estimator``, default ``"flipout"``, and ``prior``, default
  ``"normal"``, a name or a :class:`tfbnn.priors.Prior`, used for kernels and biases):

  ================================  ==============================  ========================
  estimator                         dense                           conv2d
  ================================  ==============================  ========================
  ``"flipout"``                     DenseFlipout                    Conv2DFlipout
  ``"reparameterization"``          DenseReparameterization         Conv2DReparameterization
  ``"local_reparameterization"``    DenseLocalReparameterization    Conv2DFlipout (*)
  ================================  ==============================  ========================

  (*) tfbnn has no local-reparameterization convolution; Flipout is the convolution
  whose noise differs per example.
* ``vd`` (option ``parameterization``, ``"additive"`` (Molchanov, default) or
  ``"multiplicative"`` (Kingma)): DenseVariationalDropout / Conv2DVariationalDropout.
* ``ibnn`` (options ``num_components``, K, default 4; the prior ``N(prior_mean,
  prior_stddev^2)``, default ``N(1, 0.1^2)``; the initial component means
  ``N(init_mean, init_stddev^2)``, default ``N(1, 0.5^2)``; the initial component scales
  ``|N(init_scale_mean, init_scale_stddev^2)|``, default ``|N(0.05, 0.02^2)|``; the
  defaults are NodeDense's, the reference code's layer defaults): NodeDense / NodeConv2D.

* ``sngp`` (Liu et al. 2020; options ``norm_multiplier``, ``power_iterations``, ``num_inducing``,
  ``gp_kernel_scale``, ``gp_cov_momentum``, ``gp_cov_ridge_penalty``, ``gp_cov_likelihood`` (default
  ``"gaussian"``, Edward2's),
  ``normalize_input``): :class:`~tfbnn.layers.SpectralDense` / :class:`~tfbnn.layers.SpectralConv2D`
  and, as the classifier's head, :class:`~tfbnn.layers.RandomFeatureGaussianProcess` (the method's
  ``"head"`` layer); deterministic, no ``num_examples``.

So for ``bbb``, ``vd`` and ``ibnn`` *every* convolution and dense layer of a zoo model
is Bayesian (the stem, the residual shortcuts and the softmax head included), and
``mc_dropout`` keeps deterministic weights and adds dropout that stays on at
inference where each family's docstring says. Batch normalization is always the
deterministic ``keras.layers.BatchNormalization``.

Ensembles in one network (``ensemble``, one of :data:`ENSEMBLES`; ``ensemble_size``, E,
default 4; for the builders that take them, :func:`tfbnn.models.resnet50`): every dense and
convolution layer holds E members that share one weight matrix
(:mod:`tfbnn.layers.rank1`), the model repeats its input for the members at inference
(:class:`~tfbnn.layers.EnsembleTile`) and averages their outputs
(:class:`~tfbnn.layers.EnsembleMean`); :func:`tfbnn.predict` reads the members as samples.

=====================  ==========================  ==============================================
ensemble               with method                 dense / conv2d
=====================  ==========================  ==============================================
``"batch_ensemble"``   ``deterministic``           DenseBatchEnsemble / Conv2DBatchEnsemble
``"batch_ensemble"``   ``mc_dropout``              the same, with the method's MC dropout
``"rank1"``            ``bbb``                     DenseRank1 / Conv2DRank1 (the Bayes-by-Backprop
                                                   variant: Gaussian posteriors over the members'
                                                   rank-1 factors, prior ``N(1, 0.1^2)``; the bbb
                                                   options ``estimator`` and ``prior`` do not apply)
=====================  ==========================  ==============================================

Which layers are Bayesian (``bayesian_layers``, one of :data:`BAYESIAN_LAYERS`):

* ``"all"`` (default): as above, the method applies to the whole network.
* ``"last"``: the last-layer-Bayesian ("hybrid") network, a deterministic body and a
  Bayesian head. ``dense`` and ``conv2d`` return ``keras.layers.Dense`` /
  ``keras.layers.Conv2D`` and ``dropout`` / ``spatial_dropout`` return their input;
  only the classification head (``head``) is the method's layer. For ``mc_dropout``
  the head is a ``keras.layers.Dense`` and ``head_dropout`` puts the one
  :class:`~tfbnn.layers.MCDropout` in front of it; for ``deterministic`` nothing
  changes. The model's KL is the head's KL alone.

The ELBO scale: every Bayesian layer gets ``kl_weight = 1 / num_examples`` (``beta = 1``
of the convention in :mod:`tfbnn.callbacks`; :class:`tfbnn.KLAnnealing` moves it), so
``num_examples`` (N, the training examples) is required for ``bbb``, ``vd`` and
``ibnn``: a missing or non-positive N is an error, never a silently dominating KL.

Seeds: with ``seed`` an int, the i-th stochastic layer the factory makes (0-based, in
build order; with ``bayesian_layers="last"`` the head, or its dropout, is the only
one and gets ``seed + 1``) gets ``seed + i + 1`` (the convention of ``tfbnn train``'s
MLP), so all of them differ; with ``seed=None`` every layer draws its own seed from Keras' global
RNG (``keras.utils.set_random_seed`` makes that reproducible).

Example:
    >>> from tfbnn.models import LayerFactory
    >>> f = LayerFactory("bbb", {"estimator": "reparameterization"}, num_examples=50_000, seed=0)
    >>> layer = f.dense(10, activation="softmax")
    >>> type(layer).__name__, layer.get_config()["kl_weight"], layer.seed
    ('DenseReparameterization', 2e-05, 1)
    >>> hybrid = LayerFactory("vd", num_examples=50_000, bayesian_layers="last")
    >>> type(hybrid.dense(100)).__name__, type(hybrid.head(10)).__name__   # deterministic body, VD head
    ('Dense', 'DenseVariationalDropout')
"""

import keras

from tfbnn import layers as layers_lib
from tfbnn import methods as registry
from tfbnn._internal import checks, deprecation

__all__ = [
    "ZOO_METHODS",
    "BAYESIAN_METHODS",
    "ESTIMATORS",
    "METHOD_OPTIONS",
    "BAYESIAN_LAYERS",
    "RECURRENT_CELLS",
    "ENSEMBLES",
    "LayerFactory",
    "get_factory",
]

# The method names and options below are read from the registry (tfbnn.methods), which is
# where a method is defined; these tuples are the built-in methods, kept under their old names.
#: Names accepted for ``method`` (the built-in ones; :func:`tfbnn.methods.names` ``(zoo=True)``
#: lists those registered since too).
ZOO_METHODS = registry.names(zoo=True)
#: Methods whose layers carry a KL term (they need ``num_examples``).
BAYESIAN_METHODS = registry.names(zoo=True, bayesian=True)
#: Gradient estimators of the ``bbb`` method.
ESTIMATORS = registry.ESTIMATORS
#: The options each method accepts, with their defaults.
METHOD_OPTIONS = {name: dict(registry.get(name).options) for name in ZOO_METHODS}
#: The recurrent cells of :meth:`LayerFactory.recurrent`.
RECURRENT_CELLS = ("lstm", "gru")
#: Values of ``bayesian_layers``: the whole network, or the classification head only.
BAYESIAN_LAYERS = ("all", "last")
_ENSEMBLE_DENSE = {"batch_ensemble": layers_lib.DenseBatchEnsemble, "rank1": layers_lib.DenseRank1}
_ENSEMBLE_CONV = {"batch_ensemble": layers_lib.Conv2DBatchEnsemble, "rank1": layers_lib.Conv2DRank1}
#: Values of ``ensemble`` (besides None) and the methods each goes with (:attr:`tfbnn.methods.Method.ensembles`).
ENSEMBLES = {ensemble: registry.names(zoo=True, ensemble=ensemble) for ensemble in _ENSEMBLE_DENSE}


def _check_method(method):
    zoo = registry.names(zoo=True)
    if not isinstance(method, str) or method not in zoo:
        raise ValueError(f"Unknown method. Expected one of {list(zoo)}. Received: method={method!r}")
    return registry.get(method)


def _check_num_examples(method, num_examples):
    if num_examples is None and not method.bayesian:
        return None
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples <= 0:
        raise ValueError(
            f"Expected `num_examples` (N, the number of training examples) to be a positive integer: "
            f"method={method.name!r} gives every Bayesian layer kl_weight = 1 / N (the per-example ELBO "
            f"mean NLL + KL / N). Received: num_examples={num_examples!r}"
        )
    return num_examples


def _check_bayesian_layers(bayesian_layers):
    if not isinstance(bayesian_layers, str) or bayesian_layers not in BAYESIAN_LAYERS:
        raise ValueError(
            f"Expected `bayesian_layers` to be one of {list(BAYESIAN_LAYERS)}. Received: bayesian_layers={bayesian_layers!r}"
        )
    return bayesian_layers


def _check_ensemble(ensemble, ensemble_size, method, bayesian_layers):
    """``(ensemble, E)`` checked against the method; ``(None, 1)`` without an ensemble."""
    if ensemble is None:
        return None, 1
    if not isinstance(ensemble, str) or ensemble not in _ENSEMBLE_DENSE:
        raise ValueError(f"Expected `ensemble` in {[None, *_ENSEMBLE_DENSE]}. Received: ensemble={ensemble!r}")
    if ensemble not in method.ensembles:
        raise ValueError(
            f"ensemble={ensemble!r} goes with method in {list(registry.names(zoo=True, ensemble=ensemble))}. "
            f"Received: method={method.name!r}"
        )
    if bayesian_layers != "all":
        raise ValueError(
            f"An ensemble holds its members in every layer: it needs bayesian_layers='all'. "
            f"Received: ensemble={ensemble!r}, bayesian_layers={bayesian_layers!r}"
        )
    return ensemble, checks.integer("ensemble_size", ensemble_size, 1, what="an integer >= 1 (E)")


def _check_seed(seed):
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"Expected `seed` to be a non-negative integer or None. Received: seed={seed!r}")
    return seed


class LayerFactory:
    """Makes the weight, dropout and normalization layers of one zoo model for one method.

    Args:
        method: a zoo method of the registry (:func:`tfbnn.methods.names` ``(zoo=True)``;
            the built-in ones: :data:`ZOO_METHODS`).
        options: dict of the method's options (:attr:`tfbnn.methods.Method.options`; the
            built-in ones: :data:`METHOD_OPTIONS`): ``rate``
            (mc_dropout), ``estimator`` and ``prior`` (bbb), ``parameterization`` (vd),
            ``num_components``, ``prior_mean``, ``prior_stddev``, ``init_mean``, ``init_stddev``,
            ``init_scale_mean`` and ``init_scale_stddev`` (ibnn). Unknown keys are an error.
        num_examples: int > 0, N; required for ``bbb``, ``vd`` and ``ibnn``
            (``kl_weight = 1 / N``), optional (unused) otherwise.
        seed: int >= 0 or None; the i-th stochastic layer gets ``seed + i + 1``.
        bayesian_layers: ``"all"`` (default, every weight layer follows the method)
            or ``"last"`` (a deterministic body: only :meth:`head` and
            :meth:`head_dropout` follow the method).
        ensemble: None (default) or one of :data:`ENSEMBLES`: E members in every weight
            layer (see the module table).
        ensemble_size: int >= 1, E (with ``ensemble``). Default 4.

    Its attributes: ``method``, ``options`` (resolved, defaults filled in),
    ``num_examples``, ``seed``, ``bayesian_layers``, ``kl_weight`` (``1 / N`` or
    None), ``is_bayesian``, ``ensemble`` and ``ensemble_size`` (1 without an ensemble).
    """

    def __init__(self, method="deterministic", options=None, num_examples=None, seed=None, bayesian_layers="all",
                 ensemble=None, ensemble_size=4):
        self._method = _check_method(method)  # the registry's tfbnn.methods.Method
        self.method = self._method.name
        self.options = self._method.resolve_options(options)
        self.num_examples = _check_num_examples(self._method, num_examples)
        self.seed = _check_seed(seed)
        self.bayesian_layers = _check_bayesian_layers(bayesian_layers)
        self.ensemble, self.ensemble_size = _check_ensemble(ensemble, ensemble_size, self._method,
                                                            self.bayesian_layers)
        self.is_bayesian = self._method.bayesian
        self.kl_weight = 1.0 / self.num_examples if self.is_bayesian else None
        self._count = 0
        # What the body (every layer but the head) is made of.
        self._body = self._method if self.bayesian_layers == "all" else registry.get("deterministic")

    def __repr__(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return (f"LayerFactory(method={self.method!r}, {opts}{', ' if opts else ''}num_examples={self.num_examples}, "
                f"bayesian_layers={self.bayesian_layers!r})")

    def next_seed(self):
        """The next derived seed (``seed + i + 1`` for the i-th call; None without a seed).

        The factory's own stochastic layers take theirs from here; a builder's other
        seeded layers (ConvNeXt's stochastic depth) do too, so no two share a seed.
        """
        self._count += 1
        return None if self.seed is None else self.seed + self._count

    def _bayesian_kwargs(self):
        if self.ensemble == "batch_ensemble":
            return {"ensemble_size": self.ensemble_size, "seed": self.next_seed()}
        kwargs = {"kl_weight": self.kl_weight, "seed": self.next_seed()}
        if self.ensemble == "rank1":
            kwargs["ensemble_size"] = self.ensemble_size
            return kwargs
        # Each method's translation of its options (priors, parameterization, ...): tfbnn.methods.
        kwargs.update(self._method.extra_layer_kwargs(self.options))
        return kwargs

    def _layer_class(self, method, kind):
        """The ``kind`` layer class of ``method`` (a :class:`tfbnn.methods.Method`); None: Keras' own."""
        return registry.layer_class(method.layer_class(kind, self.options))

    def prior(self):
        """The one prior object the method's layers take (``kernel_prior`` for ``bbb``, ``node_prior`` for
        ``ibnn``: ``Normal(prior_mean, prior_stddev)`` of its options), or None (a method without a prior)."""
        kwargs = self._method.extra_layer_kwargs(self.options)
        return next((kwargs[k] for k in ("kernel_prior", "node_prior") if k in kwargs), None)

    # -- weight layers -------------------------------------------------------------
    def dense(self, units, activation=None, use_bias=True, name=None):
        """A dense layer of the body: the method's (see the module table); Keras' with ``"last"``."""
        return self._dense(self._body, units, activation, use_bias, name)

    def head(self, units, activation="softmax", use_bias=True, name=None):
        """The classification head's dense layer: the method's, also with ``bayesian_layers="last"``
        (the method's ``"head"`` layer where it has one: ``sngp``'s GP output layer)."""
        if self.ensemble is None and "head" in self._method.layers:
            cls = self._layer_class(self._method, "head")
            return cls(units, activation=activation, use_bias=use_bias, name=name, seed=self.next_seed(),
                       **self._method.extra_head_kwargs(self.options))
        return self._dense(self._method, units, activation, use_bias, name)

    def classify(self, x, units, name=None):
        """The classifier's output on features ``x``: the method's own output layers
        (:attr:`tfbnn.methods.Method.head_layers`: ``evidential``'s Dirichlet head, ``heteroscedastic``'s
        softmax, ``ddu``'s softmax ``Dense``; the last one named ``name``) where it has them, otherwise
        :meth:`head` with a softmax."""
        if self.ensemble is not None or self._method.head_layers is None:
            return self.head(units, activation="softmax", name=name)(x)
        for layer in self._method.output_layers(units, self.options, self.next_seed(), name):
            x = layer(x)
        return x

    def _dense(self, method, units, activation, use_bias, name):
        if self.ensemble is not None:
            return _ENSEMBLE_DENSE[self.ensemble](units, activation=activation, use_bias=use_bias, name=name,
                                                  **self._bayesian_kwargs())
        cls = self._layer_class(method, "dense")
        if cls is None:
            return keras.layers.Dense(units, activation=activation, use_bias=use_bias, name=name)
        return cls(units, activation=activation, use_bias=use_bias, name=name, **self._bayesian_kwargs())

    def conv2d(self, filters, kernel_size, strides=1, padding="valid", activation=None, use_bias=True, name=None):
        """A 2-D convolution (channels last) of the body: the method's; Keras' with ``"last"``."""
        if self.ensemble is not None:
            return _ENSEMBLE_CONV[self.ensemble](
                filters, kernel_size, strides=strides, padding=padding, activation=activation, use_bias=use_bias,
                name=name, **self._bayesian_kwargs(),
            )
        cls = self._layer_class(self._body, "conv2d")
        if cls is None:
            return keras.layers.Conv2D(
                filters, kernel_size, strides=strides, padding=padding, activation=activation,
                use_bias=use_bias, name=name,
            )
        return cls(
            filters, kernel_size, strides=strides, padding=padding, activation=activation, use_bias=use_bias,
            name=name, **self._bayesian_kwargs(),
        )

    def recurrent(self, cell, units, return_sequences=False, name=None):
        """An LSTM or GRU layer of the body (``cell``: ``"lstm"`` or ``"gru"``).

        ``deterministic`` and ``mc_dropout`` (and any method with ``"last"``): ``keras.layers.LSTM`` /
        ``keras.layers.GRU``; ``bbb``: :class:`tfbnn.layers.LSTMReparameterization` /
        :class:`tfbnn.layers.GRUReparameterization` whatever the ``estimator`` (one weight sample
        per sequence). ``vd`` and ``ibnn`` have no recurrent layer: an error unless ``"last"``.
        """
        if cell not in RECURRENT_CELLS:
            raise ValueError(f"Expected `cell` in {list(RECURRENT_CELLS)}. Received: cell={cell!r}")
        method = self._body
        if method.layers and cell not in method.layers:
            able = [m for m in registry.names(zoo=True) if not registry.get(m).layers or cell in registry.get(m).layers]
            raise ValueError(
                f"No Bayesian recurrent layer for method={method.name!r}. Expected a method in "
                f"{able}, or bayesian_layers='last' (a deterministic recurrent "
                f"body and a {method.name} head). Received: method={method.name!r}, "
                f"bayesian_layers={self.bayesian_layers!r}"
            )
        cls = self._layer_class(method, cell)
        if cls is None:
            cls = keras.layers.LSTM if cell == "lstm" else keras.layers.GRU
            return cls(units, return_sequences=return_sequences, name=name)
        return cls(units, return_sequences=return_sequences, name=name, **self._bayesian_kwargs())

    # -- dropout after a block (MC dropout only) ---------------------------------------
    def dropout(self, x, name=None):
        """``MCDropout(rate)(x)`` for ``mc_dropout`` (element-wise) in the body; ``x`` otherwise."""
        return self._mc_dropout(layers_lib.MCDropout, x, name) if self._body.dropout_option else x

    def spatial_dropout(self, x, name=None):
        """``MCSpatialDropout2D(rate)(x)`` for ``mc_dropout`` (whole feature maps) in the body; ``x`` otherwise."""
        return self._mc_dropout(layers_lib.MCSpatialDropout2D, x, name) if self._body.dropout_option else x

    def head_dropout(self, x, name=None):
        """``MCDropout(rate)(x)`` in front of the head for ``mc_dropout`` with ``"last"``; ``x`` otherwise.

        With ``"all"`` the body's own dropout is what precedes the head.
        """
        last_only = bool(self._method.dropout_option) and self.bayesian_layers == "last"
        return self._mc_dropout(layers_lib.MCDropout, x, name) if last_only else x

    def _mc_dropout(self, cls, x, name):
        return cls(self.options[self._method.dropout_option], seed=self.next_seed(), name=name)(x)

    # -- normalization -------------------------------------------------------------------
    def batch_norm(self, name=None, **kwargs):
        """``keras.layers.BatchNormalization``: deterministic for every method."""
        return keras.layers.BatchNormalization(name=name, **kwargs)


def get_factory(method, options=None, num_examples=None, seed=None, bayesian_layers="all", ensemble=None,
                ensemble_size=4):
    """A :class:`LayerFactory` from a method name, or ``method`` itself when it is one.

    Passing a ready factory together with options, ``num_examples``, ``seed`` or a
    ``bayesian_layers`` other than the default ``"all"`` is an error (they belong to
    the factory).
    """
    if isinstance(method, LayerFactory):
        extra = {k: v for k, v in (("num_examples", num_examples), ("seed", seed)) if v is not None}
        if bayesian_layers != "all":
            extra["bayesian_layers"] = bayesian_layers
        if ensemble is not None:
            extra["ensemble"] = ensemble
        extra.update(options or {})
        if extra:
            raise ValueError(
                "Expected either a LayerFactory or a method name with its options, not both. "
                f"Received: method={method!r} with {extra}"
            )
        return method
    return LayerFactory(method, options, num_examples, seed, bayesian_layers, ensemble, ensemble_size)


__getattr__ = deprecation.renamed(__name__, {"METHODS": "ZOO_METHODS"})
