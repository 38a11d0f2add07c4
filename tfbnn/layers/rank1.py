"""BatchEnsemble and rank-1 Bayesian layers: E ensemble members sharing one weight matrix.

Every member ``k = 1 .. E`` of the ensemble has the weight ``W_k = W o (r_k s_k^T)``:
one shared ("slow") weight ``W`` and two ("fast") vectors per member, ``r_k`` over the
input features (channels) and ``s_k`` over the outputs. The product never has to be
formed; a member's output is (Wen et al. 2020, sec. 3, eq. 5)::

    y = phi( ((x o r_k) W) o s_k + b_k )

and for a convolution ``y = phi( conv(x o r_k, W) o s_k + b_k )``, ``r_k`` and ``s_k``
broadcast over the spatial positions.

* **BatchEnsemble** (:class:`DenseBatchEnsemble`, :class:`Conv2DBatchEnsemble`; Wen,
  Tran, Ba 2020): ``r_k`` and ``s_k`` are deterministic, trained like ``W``. No KL.
* **Rank-1 Bayesian** (:class:`DenseRank1`, :class:`Conv2DRank1`; Dusenberry et al.
  2020, sec. 3, eq. 2-3): ``W`` and ``b_k`` stay point estimates and the fast weights
  get a mean-field Gaussian posterior per member,
  ``q(r_k) = N(mu_r_k, softplus(rho_r_k)^2)``, ``q(s_k)`` alike, against the prior
  ``p = fast_weight_prior``, a :class:`tfbnn.priors.Normal` over each entry of ``r_k``
  and ``s_k`` (default ``Normal(1.0, 0.1)``; the floats ``prior_mean`` and
  ``prior_stddev`` are its deprecated aliases). With the posterior a
  uniform mixture of the E members, the ELBO is the members' average (Dusenberry et al.
  2020, eq. 3), so the layer's KL is the average of its members' closed-form KLs::

      KL = (1 / E) sum_k [ KL(q(r_k) || p) + KL(q(s_k) || p) ]

  added once per call as ``kl_weight * KL`` (the ELBO convention of
  :mod:`tfbnn.callbacks`, ``kl_weight = beta / N``).

**The ensemble is a batch dimension.** A layer splits the rows of its input (the
leading axis) into E contiguous groups, row ``i`` of ``n`` going to member
``floor(i E / n)``: a batch of ``E b`` rows gives member ``k`` the rows ``k b .. k b +
b - 1``, as Edward2's layers do. At inference a batch that is not a multiple of E is
refused (a ValueError; an ``InvalidArgumentError`` inside a compiled step): the rows
are then not ``E`` blocks of the same examples. In training an uneven batch (the last,
partial batch of ``fit``) is split as above, some members getting one row fewer. Two layers put the members around a network:

* :class:`EnsembleTile` at its input: at inference it repeats the batch E times,
  member-major ``(E B, ...)``, so every member sees every example; in training it
  passes the batch through, so each member trains on its own ``B / E`` examples
  of the batch (one network's cost per step; Edward2's baselines instead repeat the
  batch E times in training too, at E times the cost).
* :class:`EnsembleMean` at its output: at inference it averages the E members'
  outputs back to ``(B, ...)`` (for softmax outputs the ensemble's predictive
  distribution), so ``model.predict`` and ``evaluate`` see the ensemble; in training it
  passes the rows through, each row scored against its own label.

:func:`tfbnn.predict` treats the members as samples, as for a
:class:`tfbnn.DeepEnsemble`: it switches the :class:`EnsembleMean` layers off
(:func:`members_as_samples`) and returns ``E * T`` samples, member-major, from which the
aleatoric / epistemic split follows. A BatchEnsemble model has no noise: its
predictive is exact with one sample per member.

Noise of the rank-1 layers: each row draws its own ``r`` and ``s`` (in training and at
inference); inside ``tfbnn.weight_samples(model, T, joint=True)`` the rows of one
(member, sample) block share one draw. ``inference_mode="mean"`` uses the posterior
means.

References:
    Wen, Tran, Ba. BatchEnsemble: an Alternative Approach to Efficient Ensemble and
    Lifelong Learning. ICLR 2020 (sec. 3, eq. 5).
    Dusenberry, Jerfel, Wen, Ma, Snoek, Heller, Lakshminarayanan, Tran. Efficient and
    Scalable Bayesian Neural Nets with Rank-1 Factors. ICML 2020 (sec. 3, eq. 2-3).
"""

import contextlib
import math

import keras
import tensorflow as tf

from tfbnn import kl as kl_lib
from tfbnn import priors as priors_lib
from tfbnn._internal import checks, keras_private
from tfbnn.layers.arguments import ConvArguments, DenseArguments
from tfbnn.layers.base import (FLOAT_PRIOR_ARGUMENTS, BayesianLayer, FloatPriorAttributes, KernelArguments,
                               multiplicative_prior)

__all__ = [
    "EnsembleTile",
    "EnsembleMean",
    "DenseBatchEnsemble",
    "Conv2DBatchEnsemble",
    "DenseRank1",
    "Conv2DRank1",
    "ensemble_size",
    "members_as_samples",
    "member_of_rows",
    "ensemble_means",
    "FastWeights",
    "BatchEnsemble",
    "Rank1",
]


def _check_ensemble_size(value):
    return checks.integer("ensemble_size", value, 1, what="an integer >= 1 (E, the ensemble members)")


def member_of_rows(num_rows, ensemble_size):
    """The member of each of ``num_rows`` rows: ``floor(i E / n)``, int32 ``(num_rows,)``.

    Example:
        >>> import tfbnn
        >>> tfbnn.layers.rank1.member_of_rows(6, 3).numpy().tolist()
        [0, 0, 1, 1, 2, 2]
    """
    return (tf.range(num_rows) * ensemble_size) // num_rows


def _rows(table, members):
    """``table[members]`` for an ``(E, d)`` table, as ``one_hot(members) @ table`` (exact).

    A matmul rather than ``tf.gather``: its gradient is a matmul too, where a gather's is
    a scatter-add, which XLA on CPU runs several times slower than the layer's own matmul.
    """
    return tf.matmul(tf.one_hot(members, tf.shape(table)[0], dtype=table.dtype), table)


def _per_row(values, rank, axis):
    """``(rows, d)`` values shaped to broadcast against a rank-``rank`` tensor along ``axis``."""
    shape = [-1] + [1] * (rank - 1)
    shape[axis % rank] = values.shape[-1]
    return tf.reshape(values, shape)


def _checked_batch(layer, inputs):
    """``inputs``, once its batch size is a multiple of ``layer.ensemble_size`` (statically when known)."""
    e = layer.ensemble_size
    message = (f"Expected the batch size of the inputs of layer '{layer.name}' to be a multiple of "
               f"ensemble_size={e} at inference (E * B rows, one block per member, as EnsembleTile makes them).")
    batch = inputs.shape[0]
    if batch is not None:
        if batch % e:
            raise ValueError(f"{message} Received: inputs with batch size {batch}")
        return inputs
    return checks.checked(inputs, lambda: tf.equal(tf.shape(inputs)[0] % e, 0), message,
                          lambda: f"inputs with batch size {int(tf.shape(inputs)[0])}")


# -- the members around a network ------------------------------------------------------------
@keras.saving.register_keras_serializable(package="tfbnn")
class EnsembleTile(keras.layers.Layer):
    """Repeats the batch for the E members at inference, ``(B, ...) -> (E B, ...)``.

    Put it after a model's input, in front of the :class:`DenseBatchEnsemble`,
    :class:`DenseRank1`, ... layers, and end the model with :class:`EnsembleMean`. In
    training it passes the batch through (each member trains on its group of the
    batch); see :mod:`tfbnn.layers.rank1`.

    Args:
        ensemble_size: int >= 1, E.

    Input shape: ``(B, ...)``. Output shape: ``(E B, ...)`` at inference, ``(B, ...)`` in training.

    Example:
        >>> import numpy as np, tfbnn
        >>> tfbnn.layers.EnsembleTile(3)(np.ones((2, 4), "float32")).shape
        TensorShape([6, 4])
    """

    def __init__(self, ensemble_size, **kwargs):
        super().__init__(**kwargs)
        self.ensemble_size = _check_ensemble_size(ensemble_size)

    def call(self, inputs, training=None):
        if training:
            return inputs
        multiples = tf.concat([[self.ensemble_size], tf.ones([tf.rank(inputs) - 1], tf.int32)], axis=0)
        return tf.tile(inputs, multiples)

    def compute_output_shape(self, input_shape):
        batch = input_shape[0]
        return (None if batch is None else self.ensemble_size * batch, *input_shape[1:])

    def get_config(self):
        config = super().get_config()
        config["ensemble_size"] = self.ensemble_size
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class EnsembleMean(keras.layers.Layer):
    """Averages the E members' outputs at inference, ``(E B, ...) -> (B, ...)``.

    ``(1 / E) sum_k f_k(x)``: for softmax outputs the ensemble's predictive
    distribution. In training, and inside :func:`members_as_samples` (how
    :func:`tfbnn.predict` reads the members), it passes its input through.

    Args:
        ensemble_size: int >= 1, E.

    Input shape: ``(E B, ...)``, member-major. Output shape: ``(B, ...)`` at inference.

    Example:
        >>> import numpy as np, tfbnn
        >>> y = np.arange(6, dtype="float32").reshape(6, 1)    # 3 members x 2 examples
        >>> tfbnn.layers.EnsembleMean(3)(y).numpy().ravel().tolist()
        [2.0, 3.0]
    """

    def __init__(self, ensemble_size, **kwargs):
        super().__init__(**kwargs)
        self.ensemble_size = _check_ensemble_size(ensemble_size)
        self._members = False

    def call(self, inputs, training=None):
        if training or self._members:
            return inputs
        self._check_rows(inputs.shape[0])
        divisible = tf.debugging.assert_equal(
            tf.shape(inputs)[0] % self.ensemble_size, 0,
            message=f"{self._rows_message()} Received: a batch of rows not divisible by ensemble_size",
        )
        # The reshape waits for the check: in a graph, ops without a dependency run in any order, and the reshape's
        # own error ("Input to reshape is a tensor with 12 values") could come first.
        with tf.control_dependencies([divisible] if divisible is not None else []):
            shape = tf.concat([[self.ensemble_size, -1], tf.shape(inputs)[1:]], axis=0)
            return tf.reduce_mean(tf.reshape(inputs, shape), axis=0)

    def _rows_message(self):
        return (f"Layer '{self.name}' expects E * B rows at inference (E = ensemble_size = {self.ensemble_size}), "
                "member-major: put an EnsembleTile(ensemble_size) in front of the ensemble layers.")

    def _check_rows(self, rows):
        """A ValueError when a known number of rows is not a multiple of E."""
        if rows is not None and rows % self.ensemble_size:
            raise ValueError(f"{self._rows_message()} Received: {rows} rows with ensemble_size={self.ensemble_size}")

    @property
    def returns_members(self):
        """Whether an inference call passes every member's rows through (inside :func:`members_as_samples`)."""
        return self._members

    def compute_output_shape(self, input_shape):
        rows = input_shape[0]
        self._check_rows(rows)
        return (None if rows is None else rows // self.ensemble_size, *input_shape[1:])

    def get_config(self):
        config = super().get_config()
        config["ensemble_size"] = self.ensemble_size
        return config


def ensemble_means(model):
    """The :class:`EnsembleMean` layers of ``model`` (nested ones included)."""
    return [l for l in keras_private.sublayers(model, include_self=True) if isinstance(l, EnsembleMean)]


def ensemble_size(model):
    """E of a model ending in :class:`EnsembleMean` (1 for any other model).

    Raises a ValueError for a model with several :class:`EnsembleMean` layers of
    different sizes (its members cannot be read as samples).
    """
    sizes = {layer.ensemble_size for layer in ensemble_means(model)}
    if len(sizes) > 1:
        raise ValueError(f"Expected one ensemble size in a model. Received: EnsembleMean sizes {sorted(sizes)}")
    return sizes.pop() if sizes else 1


@contextlib.contextmanager
def members_as_samples(model):
    """Inside it, ``model``'s :class:`EnsembleMean` layers return every member's rows.

    A model that ends in an ``EnsembleMean(E)`` then maps ``(B, ...)`` inputs to
    ``(E B, ...)`` outputs at inference, member-major (rows ``k B .. k B + B - 1`` are
    member ``k``'s). :func:`tfbnn.predict` uses it to treat the members as samples.

    Yields:
        E, :func:`ensemble_size` of ``model``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.layers.EnsembleTile(2),
        ...                           tfbnn.layers.DenseBatchEnsemble(3, ensemble_size=2, seed=0),
        ...                           tfbnn.layers.EnsembleMean(2)])
        >>> x = np.ones((5, 4), "float32")
        >>> with tfbnn.layers.members_as_samples(model) as members:
        ...     per_member = model(x)
        >>> members, per_member.shape, model(x).shape
        (2, TensorShape([10, 3]), TensorShape([5, 3]))
    """
    layers = ensemble_means(model)
    size = ensemble_size(model)
    previous = [layer._members for layer in layers]
    for layer in layers:
        layer._members = True
    try:
        yield size
    finally:
        for layer, value in zip(layers, previous):
            layer._members = value


# -- the fast weights ------------------------------------------------------------------------------
class FastWeights(KernelArguments):
    """What the BatchEnsemble and rank-1 layers share: E, the slow weights, the per-row members.

    Mixed in after a shape family (:class:`tfbnn.layers.DenseArguments`,
    :class:`tfbnn.layers.ConvArguments`): it builds the shared kernel ``W`` and the
    per-member bias ``(E, units)`` and computes ``((x o r) W) o s + b`` row by row.
    A subclass builds its fast weights (``_build_fast_weights``) and gives each row's
    ``r`` and ``s`` (``_row_factors``).
    """

    def init_fast_weights(self, ensemble_size, activation, use_bias, kernel_initializer, bias_initializer):
        self.ensemble_size = _check_ensemble_size(ensemble_size)
        self.init_kernel_arguments(activation, use_bias, kernel_initializer, bias_initializer)

    def build_posterior(self, kernel_shape, bias_shape):
        self.kernel = self.add_weight(name="kernel", shape=kernel_shape, initializer=self.kernel_initializer)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.ensemble_size, *bias_shape),
                                        initializer=self.bias_initializer)
        self._build_fast_weights(kernel_shape[-2], kernel_shape[-1])

    def _fast_initializer(self, mean, stddev, offset):
        if stddev == 0:
            return keras.initializers.Constant(mean)
        seed = None if self.seed is None else self.seed * 4 + offset
        return keras.initializers.RandomNormal(mean, stddev, seed=seed)

    def _row_members(self, inputs, training):
        """Each row's member; at inference only once the batch is ``E * B`` rows (see the module docstring)."""
        if not training:
            inputs = _checked_batch(self, inputs)
        return member_of_rows(tf.shape(inputs)[0], self.ensemble_size)

    def _ensemble_forward(self, inputs, r, s, members):
        """``((x o r) W) o s + b`` for per-row ``r (rows, in)``, ``s (rows, units)``."""
        rank, axis = inputs.shape.rank, self.channel_axis
        outputs = self.forward(inputs * _per_row(tf.cast(r, inputs.dtype), rank, axis), self.kernel)
        outputs = outputs * _per_row(tf.cast(s, outputs.dtype), rank, axis)
        if self.bias is not None:
            outputs = outputs + _per_row(_rows(tf.cast(self.bias, outputs.dtype), members), rank, axis)
        return outputs

    def fast_config(self):
        config = self.kernel_config()
        config["ensemble_size"] = self.ensemble_size
        return config


class BatchEnsemble(FastWeights, keras.layers.Layer):
    """The BatchEnsemble layer family: deterministic fast weights ``r_k``, ``s_k`` (Wen et al. 2020).

    See :mod:`tfbnn.layers.rank1`. Weights: ``kernel`` (shared), ``alpha`` ``(E, in)``
    (the ``r_k``), ``gamma`` ``(E, units)`` (the ``s_k``), ``bias`` ``(E, units)``.

    Args:
        ensemble_size: int >= 1, E. Default 4.
        activation, use_bias, kernel_initializer, bias_initializer: as ``keras.layers.Dense``.
        fast_weight_stddev: float >= 0: ``r_k`` and ``s_k`` start as draws from
            ``N(1, fast_weight_stddev^2)``, so that the members differ from the start.
            Default 0.5; 0 starts them at 1 (all members equal but for their data).
        seed: int or None, seed of the initializers.
    """

    def __init__(self, ensemble_size=4, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", fast_weight_stddev=0.5, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.init_fast_weights(ensemble_size, activation, use_bias, kernel_initializer, bias_initializer)
        self.fast_weight_stddev = checks.number("fast_weight_stddev", fast_weight_stddev, low=0)
        self.seed = checks.seed(seed)

    def _build_fast_weights(self, input_dim, units):
        e, sd = self.ensemble_size, self.fast_weight_stddev
        self.alpha = self.add_weight(name="alpha", shape=(e, input_dim), initializer=self._fast_initializer(1.0, sd, 0))
        self.gamma = self.add_weight(name="gamma", shape=(e, units), initializer=self._fast_initializer(1.0, sd, 1))

    def call(self, inputs, training=None):
        members = self._row_members(inputs, training)
        outputs = self._ensemble_forward(inputs, _rows(self.alpha, members), _rows(self.gamma, members),
                                         members)
        return outputs if self.activation is None else self.activation(outputs)

    def get_config(self):
        config = super().get_config()
        config.update(self.fast_config())
        config.update({"fast_weight_stddev": self.fast_weight_stddev, "seed": self.seed})
        return config


class Rank1(FastWeights, FloatPriorAttributes, BayesianLayer):
    """The rank-1 Bayesian layer family: Gaussian posteriors over ``r_k``, ``s_k`` (Dusenberry et al. 2020).

    See :mod:`tfbnn.layers.rank1`. Weights: ``kernel`` (shared, a point estimate),
    ``alpha_loc`` / ``alpha_rho`` ``(E, in)`` and ``gamma_loc`` / ``gamma_rho`` ``(E, units)``
    (posterior means and untransformed scales, ``sigma = softplus(rho)``; always
    float32, also under a mixed-precision policy), ``bias`` ``(E, units)``.

    Args:
        ensemble_size: int >= 1, E. Default 4.
        activation, use_bias, kernel_initializer, bias_initializer: as ``keras.layers.Dense``.
        fast_weight_prior: the prior ``p`` of each entry of the fast weights ``r_k``, ``s_k``:
            a :class:`tfbnn.priors.Normal` (or its name or serialized dict). Default None:
            ``Normal(1.0, 0.1)``.
        init_mean: finite float; the posterior means start as draws from
            ``N(init_mean, init_stddev^2)``. Default 1.
        init_stddev: float >= 0, see ``init_mean``. Default 0.5 (members differ from the start).
        init_scale: float > 0, the initial posterior standard deviation. Default 0.03.
        kl_weight, inference_mode, seed: see :class:`tfbnn.layers.BayesianLayer`.

    Deprecated in tfbnn 0.3: the floats ``prior_mean`` and ``prior_stddev`` (defaults 1
    and 0.1) are ``fast_weight_prior=tfbnn.priors.Normal(prior_mean, prior_stddev)``. They
    still construct, each with a ``DeprecationWarning`` naming ``fast_weight_prior``;
    together with ``fast_weight_prior`` they are a ``ValueError``; configs that hold them
    load silently. The attributes ``prior_mean`` and ``prior_stddev`` stay, read-only.
    """

    folded_arguments = {"fast_weight_prior": FLOAT_PRIOR_ARGUMENTS}
    prior_argument = "fast_weight_prior"

    def __init__(self, ensemble_size=4, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", fast_weight_prior=None, init_mean=1.0, init_stddev=0.5,
                 init_scale=0.03, kl_weight=None, inference_mode="sample", seed=None, **kwargs):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        self.init_fast_weights(ensemble_size, activation, use_bias, kernel_initializer, bias_initializer)
        self.fast_weight_prior = multiplicative_prior(fast_weight_prior, "fast_weight_prior")
        self.init_mean = checks.number("init_mean", init_mean)
        self.init_stddev = checks.number("init_stddev", init_stddev, low=0)
        self.init_scale = checks.number("init_scale", init_scale, low=0, low_open=True)

    def _factor_weights(self, name, shape, offset):
        rho = math.log(math.expm1(self.init_scale))
        loc = self.add_weight(name=f"{name}_loc", shape=shape, dtype="float32", autocast=False,
                              initializer=self._fast_initializer(self.init_mean, self.init_stddev, offset))
        rho = self.add_weight(name=f"{name}_rho", shape=shape, dtype="float32", autocast=False,
                              initializer=keras.initializers.Constant(rho))
        return loc, rho

    def _build_fast_weights(self, input_dim, units):
        self.alpha_loc, self.alpha_rho = self._factor_weights("alpha", (self.ensemble_size, input_dim), 0)
        self.gamma_loc, self.gamma_rho = self._factor_weights("gamma", (self.ensemble_size, units), 1)
        self._build_kl_weight()

    def kl_divergence(self):
        """``(1 / E) sum_k KL(q(r_k) || p) + KL(q(s_k) || p)``, float32, unscaled."""
        total = sum(kl_lib.closed_form_kl(loc, tf.nn.softplus(rho), self.fast_weight_prior)
                    for loc, rho in ((self.alpha_loc, self.alpha_rho), (self.gamma_loc, self.gamma_rho)))
        return total / self.ensemble_size

    def _sample_factor(self, loc, rho, members, training):
        """Each row's ``r`` (or ``s``): its member's mean, or a draw from its member's posterior."""
        if not self._sampling(training):
            return _rows(loc, members)
        num_rows = tf.shape(members)[0]
        if self._mc_prediction and self._joint_samples:  # one draw per (member, sample) block of rows
            blocks = self.ensemble_size * self._weight_samples
            block_members = tf.range(blocks) // self._weight_samples
            eps = self._normal(tf.stack([blocks, tf.shape(loc)[1]]), loc.dtype)
            draws = tf.gather(loc, block_members) + tf.gather(tf.nn.softplus(rho), block_members) * eps
            return tf.gather(draws, (tf.range(num_rows) * blocks) // num_rows)
        eps = self._normal(tf.stack([num_rows, tf.shape(loc)[1]]), loc.dtype)
        return _rows(loc, members) + _rows(tf.nn.softplus(rho), members) * eps

    def call(self, inputs, training=None):
        members = self._row_members(inputs, training)
        r = self._sample_factor(self.alpha_loc, self.alpha_rho, members, training)
        s = self._sample_factor(self.gamma_loc, self.gamma_rho, members, training)
        return self._finish(self._ensemble_forward(inputs, r, s, members), None, training)

    def get_config(self):
        config = super().get_config()
        config.update(self.fast_config())
        config.update({"fast_weight_prior": priors_lib.serialize(self.fast_weight_prior),
                       "init_mean": self.init_mean, "init_stddev": self.init_stddev, "init_scale": self.init_scale})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseBatchEnsemble(DenseArguments, BatchEnsemble):
    """A BatchEnsemble dense layer: ``y = phi(((x o r_k) W) o s_k + b_k)`` (Wen et al. 2020, eq. 5).

    Row ``i`` of ``n`` belongs to member ``k = floor(i E / n)``. Arguments: ``units``
    and those of :class:`tfbnn.layers.rank1.BatchEnsemble`.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.DenseBatchEnsemble(3, ensemble_size=2, seed=0)
        >>> y = layer(np.ones((4, 5), "float32"))               # rows 0-1: member 0, rows 2-3: member 1
        >>> w0 = layer.kernel.numpy() * np.outer(layer.alpha.numpy()[0], layer.gamma.numpy()[0])
        >>> bool(np.allclose(y[0], np.ones(5) @ w0 + layer.bias.numpy()[0], atol=1e-5))
        True

    Reference:
        Wen, Tran, Ba. BatchEnsemble. ICLR 2020, sec. 3, eq. 5.
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DBatchEnsemble(ConvArguments, BatchEnsemble):
    """A BatchEnsemble 2-D convolution: ``y = phi(conv(x o r_k, W) o s_k + b_k)`` (Wen et al. 2020).

    ``r_k`` over the input channels, ``s_k`` and ``b_k`` over the filters. Arguments: those
    of :class:`tfbnn.layers.ConvArguments` and :class:`tfbnn.layers.rank1.BatchEnsemble`.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.Conv2DBatchEnsemble(4, 3, padding="same", ensemble_size=2, seed=0)
        >>> layer(np.ones((2, 8, 8, 3), "float32")).shape, tuple(layer.alpha.shape), tuple(layer.gamma.shape)
        (TensorShape([2, 8, 8, 4]), (2, 3), (2, 4))

    Reference:
        Wen, Tran, Ba. BatchEnsemble. ICLR 2020, sec. 3 and 4.
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseRank1(DenseArguments, Rank1):
    """A rank-1 Bayesian dense layer: ``y = phi(((x o r) W) o s + b_k)``, ``r ~ q(r_k)``, ``s ~ q(s_k)``.

    Dusenberry et al. 2020, eq. 2: ``W_k = W o (s_k r_k^T)`` with Gaussian posteriors
    over ``r_k`` and ``s_k``. Row ``i`` of ``n`` belongs to member ``k = floor(i E / n)``.
    Arguments: ``units`` and those of :class:`tfbnn.layers.rank1.Rank1`.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.DenseRank1(3, ensemble_size=2, kl_weight=1e-3, seed=0)
        >>> layer(np.ones((4, 5), "float32")).shape, tuple(layer.alpha_loc.shape), len(layer.losses)
        (TensorShape([4, 3]), (2, 5), 1)
        >>> tfbnn.layers.DenseRank1(3, fast_weight_prior=tfbnn.priors.Normal(1.0, 0.2)).prior_stddev
        0.2

    Reference:
        Dusenberry et al. Efficient and Scalable Bayesian Neural Nets with Rank-1
        Factors. ICML 2020, sec. 3, eq. 2-3.
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class Conv2DRank1(ConvArguments, Rank1):
    """A rank-1 Bayesian 2-D convolution: ``y = phi(conv(x o r, W) o s + b_k)`` (Dusenberry et al. 2020).

    ``r`` over the input channels, ``s`` and ``b_k`` over the filters, drawn per row from
    its member's posterior. Arguments: those of :class:`tfbnn.layers.ConvArguments` and
    :class:`tfbnn.layers.rank1.Rank1`.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.Conv2DRank1(4, 3, ensemble_size=2, kl_weight=1e-3, seed=0)
        >>> layer(np.ones((2, 8, 8, 3), "float32")).shape
        TensorShape([2, 6, 6, 4])

    Reference:
        Dusenberry et al. Efficient and Scalable Bayesian Neural Nets with Rank-1
        Factors. ICML 2020, sec. 3 and 5.
    """
