"""What every tfbnn Bayesian layer shares: the KL weight, the sampling switch, seeds."""

import functools
import inspect
import warnings

import keras
import tensorflow as tf

from tfbnn import priors as priors_lib
from tfbnn._internal import checks, deprecation, keras_private

__all__ = ["StochasticLayer", "BayesianLayer", "KernelArguments", "INFERENCE_MODES", "validate_kl_weight",
           "input_features", "multiplicative_prior", "FLOAT_PRIOR_ARGUMENTS", "FloatPriorAttributes"]

INFERENCE_MODES = ("sample", "mean")
_SEED_KEY = "seed_state"


class _StoreWithout:
    """A read-only view of a Keras variable store without one key."""

    def __init__(self, store, key):
        self._store, self._key = store, key

    def keys(self):
        return [k for k in self._store.keys() if k != self._key]

    def __getitem__(self, key):
        return self._store[key]

    def __contains__(self, key):
        return key != self._key and key in self._store.keys()

    def __len__(self):
        return len(self.keys())


def validate_kl_weight(value, name="kl_weight", allow_none=True):
    """``value`` as a float >= 0 (or None when ``allow_none``); a ValueError naming ``name`` otherwise."""
    if value is None and allow_none:
        return None
    if not checks.is_number(value) and not isinstance(value, (str, bytes, bool)):
        try:  # a scalar tensor or 0-d array
            value = float(value)
        except (TypeError, ValueError):
            pass
    return checks.number(name, value, low=0, what="a non-negative finite float (beta / N)")


def multiplicative_prior(value, name):
    """The prior of a multiplicative latent (iBNN node noise, rank-1 factors) as a :class:`tfbnn.priors.Normal`.

    ``value``: a prior name, a serialized prior or a :class:`tfbnn.priors.Prior`; None
    gives the default ``Normal(1, 0.1)`` (the noise leaves its input as it is on
    average). Only a ``Normal`` is accepted: these layers' KL is the closed form
    against a Gaussian. A ValueError names ``name`` otherwise.
    """
    prior = priors_lib.Normal(1.0, 0.1) if value is None else priors_lib.get(value, name=name)
    if type(prior) is not priors_lib.Normal:
        raise ValueError(f"Expected `{name}` to be a tfbnn.priors.Normal (the layer's KL is the closed form against "
                         f"a Gaussian prior). Received: {name}={prior!r}")
    return prior


def _normal_from_floats(prior_mean=1.0, prior_stddev=0.1):
    """``Normal(prior_mean, prior_stddev)``, each checked under its old name (their defaults were 1 and 0.1)."""
    return priors_lib.Normal(checks.number("prior_mean", prior_mean),
                             checks.number("prior_stddev", prior_stddev, low=0, low_open=True))


#: The deprecated float arguments of the node and rank-1 layers, folded into their prior
#: object (an entry of :attr:`StochasticLayer.folded_arguments`).
FLOAT_PRIOR_ARGUMENTS = (("prior_mean", "prior_stddev"), _normal_from_floats, "tfbnn.priors.Normal(loc, scale)")


class FloatPriorAttributes:
    """``prior_mean`` and ``prior_stddev``, read-only, of a layer whose prior is the Normal ``prior_argument``.

    The attributes of the deprecated float arguments (:data:`FLOAT_PRIOR_ARGUMENTS`), read from
    the prior object (``node_prior``, ``fast_weight_prior``).
    """

    prior_argument = None

    @property
    def prior_mean(self):
        """The mean of the layer's prior object (read-only; the argument is deprecated)."""
        return getattr(self, self.prior_argument).loc

    @property
    def prior_stddev(self):
        """The standard deviation of the layer's prior object (read-only; the argument is deprecated)."""
        return getattr(self, self.prior_argument).scale


def input_features(layer, input_shape):
    """The (known) last dimension of a dense layer's ``input_shape``, of rank >= 2; a ValueError otherwise."""
    if len(input_shape) < 2:
        raise ValueError(
            f"Layer '{layer.name}' expects inputs of rank >= 2 (batch, ..., features). "
            f"Received: input_shape={tuple(input_shape)}"
        )
    input_dim = input_shape[-1]
    if input_dim is None:
        raise ValueError(
            f"The last dimension of the inputs of '{layer.name}' must be known. "
            f"Received: input_shape={tuple(input_shape)}"
        )
    return input_dim


class StochasticLayer(keras.layers.Layer):
    """Base class: a layer with seeded noise, a sampling switch and the MC protocol.

    Sampling: in training the layer always samples. At inference it samples when
    ``inference_mode == "sample"`` (the default: predictions are draws from the
    posterior predictive) and is deterministic (posterior mean, dropout off) when
    it is ``"mean"``. Switch a whole model with :func:`tfbnn.set_inference_mode` or
    the :func:`tfbnn.posterior_mean` context manager.

    Randomness comes from the layer's own ``keras.random.SeedGenerator`` through
    stateless philox ops; the seed state is saved with the weights, and replicas
    of a ``tf.distribute`` run fold their replica id into the seed.

    Args:
        inference_mode: ``"sample"`` or ``"mean"``.
        seed: int or None, seed of the layer's ``keras.random.SeedGenerator``.
    """

    #: Constructor arguments renamed since tfbnn 0.1, ``{old name: new name}``
    #: (merged along the class hierarchy). The constructor accepts an old name
    #: with a ``DeprecationWarning`` naming the new one; ``from_config`` accepts it
    #: silently, so ``.keras`` files saved by tfbnn 0.1 load.
    renamed_arguments = {}
    #: Constructor arguments that became one object since tfbnn 0.3 (merged along the class
    #: hierarchy): ``{new argument: (old names, make, how to write it)}``, e.g. the floats
    #: ``prior_mean`` and ``prior_stddev`` that became ``node_prior=tfbnn.priors.Normal(loc, scale)``.
    #: The constructor accepts the old ones with a ``DeprecationWarning`` naming the new
    #: argument (both together are a ``ValueError``); ``from_config`` folds them silently,
    #: so configs and ``.keras`` files written with the old keys load
    #: (:func:`tfbnn._internal.deprecation.fold_keywords`).
    folded_arguments = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            init = cls.__init__

            @functools.wraps(init)
            def __init__(self, *args, **arguments):
                return init(self, *args, **type(self).rename_arguments(arguments, warn=True))

            # The real signature for help() and for Keras' __new__, which reads it both
            # through inspect.signature and inspect.getfullargspec.
            __init__.__signature__ = inspect.signature(init)
            cls.__init__ = __init__

    @classmethod
    def renamed_argument_names(cls, arguments):
        """``{old name: new name}`` for a call with ``arguments``: :attr:`renamed_arguments`
        merged along the class hierarchy. A new name None drops an old argument
        that had no effect."""
        renames = {}
        for klass in reversed(cls.__mro__):
            renames.update(klass.__dict__.get("renamed_arguments", {}))
        return renames

    @classmethod
    def rename_arguments(cls, arguments, warn=False):
        """``arguments`` (a dict of constructor arguments) with old names replaced by new ones.

        Args:
            arguments: dict, constructor arguments or a config.
            warn: bool, emit a ``DeprecationWarning`` per old name.

        The old arguments of :attr:`folded_arguments` are folded into their object the same way.

        Returns:
            A new dict. Raises ``ValueError`` if an old name and its new name are both given.
        """
        arguments = dict(arguments)
        for old, new in cls.renamed_argument_names(arguments).items():
            if old not in arguments:
                continue
            value = arguments.pop(old)
            if new is None:
                continue
            if new in arguments:
                raise ValueError(
                    f"Expected `{new}` or its old name `{old}`, not both. "
                    f"Received: {old}={value!r}, {new}={arguments[new]!r}"
                )
            if warn:
                warnings.warn(
                    f"{cls.__name__}: the argument `{old}` is renamed `{new}`; the old name will be removed.",
                    DeprecationWarning,
                    stacklevel=4,
                )
            arguments[new] = value
        folds = {}
        for klass in reversed(cls.__mro__):
            folds.update(klass.__dict__.get("folded_arguments", {}))
        for new, (names, make, path) in folds.items():
            arguments = deprecation.fold_keywords(arguments, new, names, make, path, warn=warn, stacklevel=4,
                                                  owner=cls.__name__)
        return arguments

    @classmethod
    def from_config(cls, config):
        return super().from_config(cls.rename_arguments(config))

    def __init__(self, inference_mode="sample", seed=None, **kwargs):
        super().__init__(**kwargs)
        self.inference_mode = inference_mode
        self.seed = seed = checks.seed(seed)
        self.seed_generator = keras.random.SeedGenerator(seed)
        # Monte Carlo prediction protocol (see tfbnn.utils.weight_samples): with T > 1
        # the leading axis of the inputs is T * B, sample-major. Jointly, layers that
        # share one weight sample across a batch draw T independent ones; per row,
        # every row gets its own independent sample.
        self._weight_samples = 1
        self._joint_samples = True
        # Set by weight_samples(..., with_kl=True) (training with several samples,
        # tfbnn.MultiSampleModel): the KL is then added, averaged over the T samples.
        self._samples_add_kl = False
        # Set by tfbnn.export.portable_noise while an export for TFLite / ONNX is traced.
        self._portable_noise = None

    def set_weight_samples(self, num_samples=1, joint=True, with_kl=False):
        """Sets this layer's Monte Carlo protocol; returns the previous setting.

        With ``num_samples = T > 1`` the leading axis of the layer's inputs is
        ``T * B``, sample-major (rows ``t * B .. t * B + B - 1`` belong to sample
        ``t``). ``joint=True``: each block of B rows shares one weight sample;
        ``joint=False``: every row gets its own. ``with_kl``: the layer adds its KL
        loss (averaged over the T samples) in a call with ``T > 1``; otherwise it adds
        none there. ``num_samples=1`` (the default) is an ordinary call. Use
        :func:`tfbnn.utils.weight_samples`, which sets every layer of a model and
        restores them, rather than calling this directly.

        Args:
            num_samples: int >= 1, T.
            joint: bool.
            with_kl: bool.

        Returns:
            The previous ``(num_samples, joint, with_kl)``, to pass back as
            ``layer.set_weight_samples(*previous)``.

        Example:

        >>> import tfbnn
        >>> layer = tfbnn.layers.DenseFlipout(2)
        >>> previous = layer.set_weight_samples(8, joint=False)
        >>> previous, layer.weight_samples
        ((1, True, False), (8, False, False))
        >>> _ = layer.set_weight_samples(*previous)
        """
        num_samples = checks.integer("num_samples", num_samples, 1)
        previous = self.weight_samples
        self._weight_samples, self._joint_samples = num_samples, bool(joint)
        self._samples_add_kl = bool(with_kl)
        return previous

    @property
    def weight_samples(self):
        """The Monte Carlo protocol ``(num_samples, joint, with_kl)``, see :meth:`set_weight_samples`."""
        return self._weight_samples, self._joint_samples, self._samples_add_kl

    @property
    def inference_mode(self):
        return self._inference_mode

    @inference_mode.setter
    def inference_mode(self, mode):
        if mode not in INFERENCE_MODES:
            raise ValueError(
                f"Expected `inference_mode` in {INFERENCE_MODES}. Received: inference_mode={mode!r}"
            )
        self._inference_mode = mode

    def _sampling(self, training):
        return bool(training) or self._inference_mode == "sample"

    @property
    def _mc_prediction(self):
        """Inside ``weight_samples(model, T > 1)``: a prediction, no loss is used."""
        return self._weight_samples > 1

    @property
    def _adds_kl(self):
        """Whether this call adds its KL loss: always, except in Monte Carlo prediction."""
        return not self._mc_prediction or self._samples_add_kl

    def _next_seed(self):
        """A fresh stateless seed; replicas of a tf.distribute run get distinct ones."""
        seed = self.seed_generator.next()
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            replica_id = ctx.replica_id_in_sync_group
            if replica_id is not None:
                seed = seed + tf.cast(tf.stack([replica_id, 0]), seed.dtype) * 7919
        return seed

    # The seed state travels with the weights, so a seeded model reloaded from a
    # `.keras` file continues the exact sample sequence of the model it was saved from.
    def save_own_variables(self, store):
        super().save_own_variables(store)
        store[_SEED_KEY] = self.seed_generator.state

    def load_own_variables(self, store):
        super().load_own_variables(_StoreWithout(store, _SEED_KEY))
        if _SEED_KEY in store.keys():
            self.seed_generator.state.assign(store[_SEED_KEY])

    # Philox, named explicitly: under XLA on CPU the default "auto_select" algorithm
    # is 30x slower (851 ms against 28 ms for a 1200 x 1200 normal draw).
    # Every draw goes through these three methods. While `_portable_noise` is set
    # (tfbnn.export.portable_noise, a TFLite / ONNX export being traced) they emit
    # stateful RandomStandardNormal / RandomUniform ops instead, with the (seed, seed2)
    # attributes it hands out: TFLite's builtins and ONNX's RandomNormalLike /
    # RandomUniformLike have those ops, not the stateless ones.
    def _normal(self, shape, dtype):
        if self._portable_noise is not None:
            return self._portable_noise.normal(shape, dtype)
        key, counter = _key_counter(self._next_seed())
        return tf.raw_ops.StatelessRandomNormalV2(shape=shape, key=key, counter=counter, alg=_PHILOX, dtype=dtype)

    def _uniform(self, shape, dtype):
        if self._portable_noise is not None:
            return self._portable_noise.uniform(shape, dtype)
        key, counter = _key_counter(self._next_seed())
        return tf.raw_ops.StatelessRandomUniformV2(shape=shape, key=key, counter=counter, alg=_PHILOX, dtype=dtype)

    def _rademacher(self, shape, dtype, seed):
        key, counter = _key_counter(seed)
        bits = tf.raw_ops.StatelessRandomUniformIntV2(shape=shape, key=key, counter=counter, alg=_PHILOX,
                                                      minval=0, maxval=2)
        return tf.cast(2 * bits - 1, dtype)

    def _rademacher_pair(self, shape_a, shape_b, dtype):
        """Independent random signs of ``shape_a`` and of ``shape_b`` (Flipout's input and output signs)."""
        if self._portable_noise is not None:  # u < 1/2: -1, else +1 (sign(u - 1/2) was 0 at u = 1/2 exactly)
            return tuple(_signs(self._portable_noise.uniform(shape, dtype)) for shape in (shape_a, shape_b))
        seeds = tf.random.experimental.stateless_split(self._next_seed(), 2)
        return self._rademacher(shape_a, dtype, seeds[0]), self._rademacher(shape_b, dtype, seeds[1])

    def get_config(self):
        config = super().get_config()
        config.update({"inference_mode": self._inference_mode, "seed": self.seed})
        return config


class BayesianLayer(StochasticLayer):
    """Base class: a stochastic layer with a posterior and a KL term.

    The ELBO convention (one rule, see :mod:`tfbnn.callbacks`): the layer adds
    ``kl_weight * KL(q || p)`` to ``layer.losses`` on every call, and
    ``kl_weight = beta / N`` with ``N`` the number of training examples, so that
    Keras' mean-over-batch data loss plus the layer losses is the per-example
    negative ELBO ``mean NLL + beta KL / N``. ``kl_weight`` lives in a
    non-trainable variable made in ``build`` so callbacks can move it per batch
    inside a compiled train step. Sampling and seeds: see :class:`StochasticLayer`.

    Args:
        kl_weight: float >= 0 or None. ``beta / N``. ``None`` (default) means "not
            set yet": the KL term is 0 at inference, and training raises a clear
            error until :class:`tfbnn.KLAnnealing` or :func:`tfbnn.set_kl_weight`
            sets it. It is never silently 1 (a KL that would dominate the data).
        inference_mode: ``"sample"`` or ``"mean"``.
        seed: int or None.
    """

    def __init__(self, kl_weight=None, inference_mode="sample", seed=None, **kwargs):
        super().__init__(inference_mode=inference_mode, seed=seed, **kwargs)
        self._kl_weight_value = validate_kl_weight(kl_weight)

    def add_weight(self, *args, autocast=False, **kwargs):
        """``keras.layers.Layer.add_weight``, with ``autocast=False`` by default.

        Mixed precision (``keras.mixed_precision.set_global_policy("mixed_float16")``
        or ``"mixed_bfloat16"``): a Bayesian layer's variables are float32 (the
        policy's variable dtype) and are read as float32 inside ``call`` too, so the
        posterior's scales, its samples and the KL are computed in float32: the KL
        of a 1200 x 1200 layer (about 1e6) is beyond float16's largest value, 65504,
        and scales of 1e-4 are subnormal there. The shape families cast the
        kernel and bias to the compute dtype where they meet the inputs
        (:meth:`tfbnn.layers.DenseArguments.forward`), so the matmuls and
        convolutions run in float16 or bfloat16; the KL is added to ``layer.losses``
        as a float32 scalar, as Keras' own regularization losses are.
        """
        return super().add_weight(*args, autocast=autocast, **kwargs)

    def _build_kl_weight(self):
        # Never autocast: under a mixed policy beta / N read as float16 loses digits
        # (1 / 60000 is subnormal there) or underflows to 0.
        self._kl_weight = self.add_weight(
            name="kl_weight",
            shape=(),
            initializer=keras.initializers.Constant(self._kl_weight_value or 0.0),
            trainable=False,
            dtype="float32",
            autocast=False,
        )

    @property
    def kl_weight(self):
        """The non-trainable variable holding ``beta / N``."""
        return self._kl_weight

    @property
    def kl_weight_is_set(self):
        return self._kl_weight_value is not None

    def set_kl_weight(self, value):
        """Sets ``kl_weight`` (``beta / N``); safe to call between compiled steps."""
        value = validate_kl_weight(value, allow_none=False)
        self._kl_weight_value = value
        if self.built:
            self._kl_weight.assign(value)

    def _check_kl_scale(self, training):
        if training and self._kl_weight_value is None:
            raise ValueError(
                f"Layer '{self.name}' ({type(self).__name__}) is being trained without a KL "
                "scale. The per-example loss is mean NLL + beta * KL / N, so the layer needs "
                "kl_weight = beta / N with N the number of training examples. Pass "
                "`kl_weight=1/N` to the layer, call `tfbnn.set_kl_weight(model, 1/N)`, or add "
                "the callback `tfbnn.KLAnnealing(num_examples=N)` to `fit`. "
                "Received: kl_weight=None"
            )

    def _add_kl_loss(self, kl, training):
        self._check_kl_scale(training)
        self.add_loss(tf.cast(self._kl_weight, kl.dtype) * kl)

    def kl_divergence(self):
        """The layer's KL(q || p), summed over its weights, not scaled."""
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config["kl_weight"] = self._kl_weight_value
        return config


class KernelArguments:
    """What every Bayesian layer with a kernel and a bias shares (mixed into a :class:`BayesianLayer`).

    The arguments of ``keras.layers.Dense`` that every family has, ``activation``,
    ``use_bias``, ``kernel_initializer`` (of the kernel, or of its posterior mean) and
    ``bias_initializer``: their checks (:meth:`init_kernel_arguments`) and config
    (:meth:`kernel_config`); and how a call ends (:meth:`_finish`): the bias, the KL
    loss, the activation.
    """

    def init_kernel_arguments(self, activation, use_bias, kernel_initializer, bias_initializer):
        self.activation = checks.activation(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = checks.initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = checks.initializer("bias_initializer", bias_initializer)

    def kernel_config(self):
        return {
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }

    def _apply_bias(self, outputs, bias):
        return self.add_bias(outputs, bias)

    def _finish(self, outputs, bias, training, kl=None):
        """``outputs`` with ``bias`` added (None: no bias), the KL loss and the activation.

        The KL loss is ``kl`` or, when None, :meth:`kl_divergence`, computed only when
        the call adds one (not in Monte Carlo prediction).
        """
        if bias is not None:
            outputs = self._apply_bias(outputs, bias)
        if self._adds_kl:
            self._add_kl_loss(self.kl_divergence() if kl is None else kl, training)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs


#: TensorFlow's number of the Philox algorithm (``tf.random.Algorithm.PHILOX``) for the raw stateless ops.
_PHILOX = 1


def _key_counter(seed):
    """Philox's key and counter for a stateless seed: what ``tf.random.stateless_normal(..., alg="philox")``
    computes from ``seed``.

    TensorFlow's Python scramble (``random_ops_util._philox_scramble_seed``) writes about 40 graph ops;
    the op ``StatelessRandomGetKeyCounter`` scrambles the same way in one, in the CPU and GPU kernels.
    A Bayesian layer draws a few times per call and every model traces its call several times (train,
    test and predict steps), so the seeds' ops were most of a Bayesian layer's trace: 314 ops for one
    ``DenseFlipout`` call, 9 for ``keras.layers.Dense`` (138 with the one op). XLA's version of the op
    scrambles otherwise, so a function XLA compiles keeps TensorFlow's scramble
    (tests/layers/test_base.py checks the draws are bitwise TensorFlow's, eager, traced and under XLA).
    """
    if keras_private.in_xla_context():
        return keras_private.philox_key_counter(seed)
    return tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)


def _signs(uniform):
    """Random signs from uniforms on ``[0, 1)``: -1 below 1/2, +1 from 1/2 on; never 0."""
    return tf.where(uniform < 0.5, -tf.ones_like(uniform), tf.ones_like(uniform))
