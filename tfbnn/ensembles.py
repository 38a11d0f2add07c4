"""Deep ensembles (Lakshminarayanan et al. 2017): M independently trained networks as one model.

A deep ensemble trains ``M`` networks of one architecture (or of several) from
different random initializations and data orders, each on a proper scoring rule
(the softmax cross-entropy, or the Gaussian NLL of a :class:`tfbnn.GaussianHead`),
and predicts with the uniform mixture of their predictive distributions
(Lakshminarayanan et al. 2017, sec. 2.4)::

    p(y | x) = (1 / M) sum_m p(y | x, theta_m)

:class:`DeepEnsemble` holds the members and evaluates all of them in one call;
:func:`tfbnn.predict` treats the members as samples of a posterior, so the
uncertainty split of :mod:`tfbnn.inference` applies unchanged: with ``p_m`` the
class probabilities of member ``m`` and ``p_bar = (1 / M) sum_m p_m``::

    total      H[p_bar]
    aleatoric  (1 / M) sum_m H[p_m]
    epistemic  H[p_bar] - (1 / M) sum_m H[p_m]      (the members' disagreement)

Members may be Bayesian themselves (an ensemble of BbB, MC dropout or iBNN
networks): :func:`tfbnn.predict` then draws ``T`` samples from every member, ``M * T``
samples in all, each member weighted ``1 / M``.

:func:`train_ensemble` trains the members one after the other, each with its own
seed (:func:`member_seeds`): initialization, data shuffling and every layer's noise
differ between members and are reproducible.

Reference:
    Lakshminarayanan, Pritzel, Blundell. Simple and Scalable Predictive Uncertainty
    Estimation using Deep Ensembles. NeurIPS 2017 (sec. 2.4, eq. of the mixture;
    sec. 2.2, proper scoring rules).
"""

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.utils import stochastic_layers

__all__ = ["DeepEnsemble", "train_ensemble", "member_seeds", "VECTORIZE", "SEED_STRIDE"]

#: How a :class:`DeepEnsemble` evaluates its members in one call.
VECTORIZE = ("parallel", "stacked")
#: Member ``m`` of an ensemble with seed ``s`` gets the seed ``s + m * SEED_STRIDE``.
SEED_STRIDE = 1000


def member_seeds(seed, num_members):
    """The seeds of the members: ``seed + m * SEED_STRIDE`` for ``m = 0 .. M - 1``.

    The stride keeps the members' layer seeds apart: a zoo model built with seed ``s``
    gives its ``i``-th stochastic layer the seed ``s + i + 1``, so nearby member seeds
    would give two members' layers the same noise stream (and, for deterministic
    layers seeded the same way, the same initial weights).

    Example:
        >>> import tfbnn
        >>> tfbnn.ensembles.member_seeds(3, 4)
        [3, 1003, 2003, 3003]
    """
    seed = checks.integer("seed", seed, 0)
    num_members = checks.integer("num_members", num_members, 1)
    return [seed + m * SEED_STRIDE for m in range(num_members)]


def _check_members(members):
    if isinstance(members, keras.Model) or not isinstance(members, (list, tuple)):
        raise ValueError(f"Expected `members` to be a list of Keras models. Received: members of type "
                         f"{type(members).__name__}")
    if not members:
        raise ValueError("Expected at least one member. Received: members=[]")
    wrong = [i for i, m in enumerate(members) if not isinstance(m, keras.Model)]
    if wrong:
        raise ValueError(f"Expected every member to be a Keras model. Received: members[{wrong[0]}] of type "
                         f"{type(members[wrong[0]]).__name__}")
    if len({id(m) for m in members}) != len(members):
        raise ValueError("Expected distinct member models (one model listed twice would be counted twice). "
                         f"Received: {len(members)} members, {len({id(m) for m in members})} distinct")
    return list(members)


def _variable_shapes(model):
    return [tuple(v.shape) for v in model.trainable_variables], [tuple(v.shape) for v in model.non_trainable_variables]


@keras.saving.register_keras_serializable(package="tfbnn")
class DeepEnsemble(keras.Model):
    """M Keras models as one: the uniform mixture of their predictions (Lakshminarayanan et al. 2017).

    ``ensemble(x)`` returns the mean of the members' outputs, ``(1 / M) sum_m f_m(x)``:
    for softmax members the ensemble's predictive distribution ``p_bar`` (so
    ``ensemble.predict``, ``evaluate`` and the metrics of :mod:`tfbnn.metrics` see the
    ensemble); for regression the mean prediction. :meth:`call_members` returns the
    members' outputs stacked, ``(M, B, ...)``. :func:`tfbnn.predict` uses it and
    treats the members as posterior samples (``num_samples`` is then ``T`` per member;
    see :func:`tfbnn.inference.predict`).

    All members are evaluated in one call, two ways (``vectorize``):

    * ``"parallel"`` (default): one graph holding every member's forward pass, their
      outputs stacked. Works for any members (different architectures, Bayesian
      members with their own noise) whose outputs have one shape.
    * ``"stacked"``: the members' weights stacked along a leading member axis and one
      forward pass of the first member's architecture vectorized over that axis
      (``model.stateless_call`` under ``tf.vectorized_map``: batched matmuls). Needs
      members that share an architecture (the same variable shapes) and have no
      stochastic layers.

    ``benchmarks/ensemble_predict.py`` measures both against a Python loop over the
    members.

    Members are trained independently (:func:`train_ensemble`); fitting the ensemble
    as a whole would train one big averaged model, not an ensemble, and is refused.
    ``compile`` + ``evaluate`` work (on the mean output). Saves and loads as
    ``.keras`` (registered), the members inside.

    Args:
        members: list of Keras models (M >= 1) with one output each, of equal shape.
        vectorize: ``"parallel"`` or ``"stacked"``, see above.
        **kwargs: passed to ``keras.Model`` (``name``, ...).

    Call arguments:
        inputs: what every member takes, ``(B, ...)``.
        training: passed to every member.

    Output shape: the members' output shape, ``(B, ...)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> def member(seed):
        ...     keras.utils.set_random_seed(seed)
        ...     return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        >>> ensemble = tfbnn.DeepEnsemble([member(s) for s in (0, 1, 2)])
        >>> x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
        >>> ensemble.call_members(x).shape
        TensorShape([3, 5, 3])
        >>> res = tfbnn.predict(ensemble, x, num_samples=1)   # 3 samples: one per member
        >>> res.num_samples, bool(np.all(res.mutual_information > 0))
        (3, True)

    Reference:
        Lakshminarayanan, Pritzel, Blundell. Simple and Scalable Predictive
        Uncertainty Estimation using Deep Ensembles. NeurIPS 2017, sec. 2.4.
    """

    def __init__(self, members, vectorize="parallel", **kwargs):
        super().__init__(**kwargs)
        members = _check_members(members)
        if vectorize not in VECTORIZE:
            raise ValueError(f"Expected `vectorize` in {VECTORIZE}. Received: vectorize={vectorize!r}")
        if vectorize == "stacked":
            self._check_stackable(members)
        self.members = members
        self.vectorize = vectorize
        if all(m.built for m in members):
            self.built = True

    @staticmethod
    def _check_stackable(members):
        noisy = [m.name for m in members if stochastic_layers(m)]
        if noisy:
            raise ValueError(
                "vectorize='stacked' evaluates members without stochastic layers; use vectorize='parallel' "
                f"for Bayesian or MC dropout members. Received: members with stochastic layers {noisy}"
            )
        unbuilt = [m.name for m in members if not m.built]
        if unbuilt:
            raise ValueError(f"vectorize='stacked' needs built members (their weights are stacked). "
                             f"Received: unbuilt members {unbuilt}")
        first = _variable_shapes(members[0])
        other = [m.name for m in members[1:] if _variable_shapes(m) != first]
        if other:
            raise ValueError(
                "vectorize='stacked' needs members that share an architecture (the same variable shapes) as "
                f"{members[0].name!r}. Received: members {other} with other variables"
            )

    @property
    def num_members(self):
        """M, the number of members."""
        return len(self.members)

    def _stacked(self, inputs):
        template = self.members[0]
        trainable = [tf.stack([m.trainable_variables[i].value for m in self.members])
                     for i in range(len(template.trainable_variables))]
        fixed = [tf.stack([m.non_trainable_variables[i].value for m in self.members])
                 for i in range(len(template.non_trainable_variables))]

        def one_member(variables):
            outputs, _ = template.stateless_call(variables[0], variables[1], inputs, training=False)
            return outputs

        return tf.vectorized_map(one_member, (trainable, fixed))

    def call_members(self, inputs, training=None):
        """The members' outputs stacked on a leading member axis: ``(M, B, ...)``."""
        if self.vectorize == "stacked" and not training:
            return self._stacked(inputs)
        outputs = [member(inputs, training=training) for member in self.members]
        if not all(isinstance(y, tf.Tensor) or keras.ops.is_tensor(y) for y in outputs):
            raise ValueError("Expected members with one output tensor each. Received: outputs of types "
                             f"{sorted({type(y).__name__ for y in outputs})}")
        shapes = {tuple(y.shape[1:]) for y in outputs}
        if len(shapes) > 1:
            raise ValueError(f"Expected members with outputs of one shape. Received: output shapes {sorted(shapes)}")
        return tf.stack(outputs)

    def call(self, inputs, training=None):
        return tf.reduce_mean(self.call_members(inputs, training=training), axis=0)

    def compute_output_shape(self, input_shape):
        return self.members[0].compute_output_shape(input_shape)

    def train_step(self, data):
        raise ValueError(
            "A DeepEnsemble is not fitted as a whole (that would train one averaged model): train its members "
            "independently, e.g. with tfbnn.ensembles.train_ensemble(build_fn, num_members, x, y). "
            f"Received: fit on ensemble {self.name!r}"
        )

    def get_config(self):
        config = super().get_config()
        config.update({
            "members": [keras.saving.serialize_keras_object(m) for m in self.members],
            "vectorize": self.vectorize,
        })
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        members = [keras.saving.deserialize_keras_object(m, custom_objects=custom_objects)
                   for m in config.pop("members")]
        return cls(members, **config)


def _callbacks_for(callbacks, seed):
    if callbacks is None:
        return []
    if callable(callbacks):
        return list(callbacks(seed))
    return list(callbacks)


def train_ensemble(build_fn, num_members, x, y=None, seed=0, compile_kwargs=None, callbacks=None,
                   vectorize="parallel", return_histories=False, **fit_kwargs):
    """Trains ``M`` members independently and returns them as a :class:`DeepEnsemble`.

    For member ``m`` with seed ``s_m`` (:func:`member_seeds`: ``seed + m * 1000``):
    ``keras.utils.set_random_seed(s_m)`` (initialization and, for arrays, ``fit``'s
    shuffling), ``model = build_fn(s_m)`` (pass ``s_m`` on as the layers' seed: the
    zoo's ``seed=``), ``model.compile(**compile_kwargs)`` unless ``build_fn`` already
    compiled it, and ``model.fit(x, y, callbacks=..., **fit_kwargs)``. Each member
    minimises its own loss (a proper scoring rule: cross-entropy or Gaussian NLL),
    as in Lakshminarayanan et al. (2017), Algorithm 1, without the optional
    adversarial training.

    Args:
        build_fn: ``seed -> keras.Model``, called once per member.
        num_members: int >= 1, M (the paper uses 5).
        x, y: training data for ``fit`` (arrays, or a ``tf.data.Dataset`` with
            ``y=None``; a dataset shuffles with its own seed, so give it a different
            order per member yourself if you want one).
        seed: int >= 0, the ensemble's seed.
        compile_kwargs: dict for ``model.compile`` (optimizer, loss, metrics) of
            members that ``build_fn`` returns uncompiled. Give the optimizer by name
            or config: one optimizer object cannot serve several models.
        callbacks: a list of callbacks shared by every member's ``fit``, or
            ``seed -> list`` for fresh ones per member (e.g. a
            :class:`tfbnn.KLAnnealing` for Bayesian members).
        vectorize: the returned ensemble's ``vectorize``.
        return_histories: bool; also return the members' ``History`` objects.
        **fit_kwargs: passed to every ``fit`` (``epochs``, ``batch_size``, ``verbose``, ...).

    Returns:
        A :class:`DeepEnsemble` (and the list of histories with ``return_histories``).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> def build(seed):
        ...     return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
        ...                              keras.layers.Dense(2, activation="softmax")])
        >>> ensemble = tfbnn.ensembles.train_ensemble(
        ...     build, 3, x, y, compile_kwargs={"optimizer": "adam", "loss": "sparse_categorical_crossentropy"},
        ...     epochs=2, verbose=0)
        >>> ensemble.num_members
        3
    """
    if not callable(build_fn):
        raise ValueError(f"Expected `build_fn` to be a callable seed -> keras.Model. Received: build_fn={build_fn!r}")
    if compile_kwargs is not None and not isinstance(compile_kwargs, dict):
        raise ValueError(f"Expected `compile_kwargs` to be a dict or None. Received: compile_kwargs={compile_kwargs!r}")
    if isinstance((compile_kwargs or {}).get("optimizer"), keras.optimizers.Optimizer) and num_members > 1:
        raise ValueError(
            "Expected `compile_kwargs['optimizer']` as a name or config: one optimizer object cannot train several "
            f"members. Received: optimizer={compile_kwargs['optimizer']!r}"
        )
    members, histories = [], []
    for s in member_seeds(seed, num_members):
        keras.utils.set_random_seed(s)
        model = build_fn(s)
        if not isinstance(model, keras.Model):
            raise ValueError(f"Expected `build_fn` to return a Keras model. Received: {type(model).__name__}")
        if compile_kwargs is not None and not model.compiled:
            options = dict(compile_kwargs)
            if isinstance(options.get("optimizer"), dict):
                options["optimizer"] = keras.optimizers.get(options["optimizer"])
            model.compile(**options)
        histories.append(model.fit(x, y, callbacks=_callbacks_for(callbacks, s), **fit_kwargs))
        members.append(model)
    ensemble = DeepEnsemble(members, vectorize=vectorize)
    return (ensemble, histories) if return_histories else ensemble
