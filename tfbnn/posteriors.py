"""Posteriors and priors over a layer's flattened weights, as TFP distributions.

:class:`tfbnn.layers.DenseVariational` follows TFP's ``DenseVariational``
contract: two builders, ``make_posterior_fn(kernel_size, bias_size, dtype)`` and
``make_prior_fn(kernel_size, bias_size, dtype)``, each return an object holding the
variables of a distribution over the layer's ``n = kernel_size + bias_size``
weights, flattened as ``w = [vec(W); b]`` (the kernel row-major, then the bias).
TFP's builders return ``tf_keras`` models (``VariableLayer`` + ``DistributionLambda``)
that a Keras 3 model rejects; here they return a :class:`WeightDistribution`, a
Keras 3 layer that owns its variables (so they train, save and load with the
model) and whose :meth:`WeightDistribution.distribution` is a TFP distribution of
event shape ``[n]``.

The ready-made builders (serializable objects, ``builder(kernel_size, bias_size,
dtype)`` returns the layer; ``scale = softplus(rho) + 1e-6`` throughout):

========================  ==============================================  ===================
builder                   distribution over ``w`` (``n`` weights)         parameters
========================  ==============================================  ===================
MeanFieldNormal           ``N(mu, diag(sigma^2))`` (Blundell et al.       ``2 n``
                          2015): ``MultivariateNormalDiag``
LowRankNormal(rank=r)     ``N(mu, L L^T + diag(d^2))``, ``L`` of shape    ``(r + 2) n``
                          ``[n, r]`` (Tomczak et al. 2020):
                          ``MultivariateNormalDiagPlusLowRankCovariance``
FullCovarianceNormal      ``N(mu, S S^T)``, ``S`` lower triangular with   ``n + n (n + 1) / 2``
                          a positive diagonal (``FillScaleTriL``):
                          ``MultivariateNormalTriL``
FlowNormal                ``N(mu, diag(sigma^2))`` pushed through         ``2 n`` + the flow's
                          ``num_flows`` affine coupling bijectors
                          (RealNVP, Dinh et al. 2017):
                          ``TransformedDistribution``
NormalPrior               fixed ``N(m, s^2 I)``                           none
TrainableNormalPrior      ``N(mu_p, s^2 I)``, ``mu_p`` trained (TFP's     ``n`` (+1)
                          ``prior_trainable``); ``s`` too, optionally
========================  ==============================================  ===================

The full covariance has ``O(n^2)`` parameters and an ``O(n^3)`` log-density: it is
for small layers (a few hundred weights). The low-rank family keeps ``O(r n)``
parameters and ``O(r^2 n)`` log-density and KL (Woodbury and the matrix
determinant lemma), the structured middle ground between mean field and full
covariance.

The KL between any of these posteriors and the two priors has a closed form:
TFP registers it for the multivariate normals with a linear-operator scale
(mean field, full covariance), and this module registers
``KL(MultivariateNormalDiagPlusLowRankCovariance || MultivariateNormalLinearOperator)``
(:func:`low_rank_normal_kl`), which TFP 0.25 lacks. For two multivariate normals
(``mu_q, Sigma_q`` and ``mu_p, Sigma_p``)::

    KL(q || p) = 1/2 [ tr(Sigma_p^-1 Sigma_q) + (mu_p - mu_q)^T Sigma_p^-1 (mu_p - mu_q)
                       - n + log det Sigma_p - log det Sigma_q ]

A pair without a registered KL (a prior of your own, say a Laplace, or the flow
posterior) gets the Monte Carlo estimate ``log q(w) - log p(w)`` at the layer's
weight sample. For the flow posterior ``w = f(w0)``, ``w0 ~ N(mu, diag(sigma^2))``,
the density is the change of variables (Rezende & Mohamed 2015, eq. 6)::

    log q(w) = log N(w0 | mu, diag(sigma^2)) - log |det df/dw0 (w0)|

so the estimate is unbiased for ``KL(q || p)``. :class:`AffineCouplingFlow` is the
flow (its weights are trained with the posterior's); it starts as the identity, where
the flow posterior is the mean-field one.

Your own distribution: :class:`VariableDistribution` is the port of TFP's
``VariableLayer`` + ``DistributionLambda``: one trainable parameter vector and a
function turning it into the distribution. Register the builder function with
``keras.saving.register_keras_serializable`` so that a saved model finds it (see
:class:`tfbnn.layers.DenseVariational` for a before/after).

References:
    Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
    Networks. ICML 2015.
    Tomczak, Swaroop, Turner. Efficient Low Rank Gaussian Variational Inference
    for Neural Networks. NeurIPS 2020.
    Dinh, Sohl-Dickstein, Bengio. Density Estimation using Real NVP. ICLR 2017.
    Rezende, Mohamed. Variational Inference with Normalizing Flows. ICML 2015.
    Louizos, Welling. Multiplicative Normalizing Flows for Variational Bayesian
    Neural Networks. ICML 2017.
    Louizos, Welling. Structured and Efficient Variational Deep Learning with
    Matrix Gaussian Posteriors. ICML 2016.
    TensorFlow Probability, ``tfp.layers.DenseVariational`` (its
    ``posterior_mean_field`` and ``prior_trainable`` examples).
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn import kl as kl_lib
from tfbnn import priors as priors_lib
from tfbnn._internal import checks
from tfbnn._internal.configurable import Configurable

tfd = tfp.distributions
tfb = tfp.bijectors

__all__ = [
    "WeightDistribution",
    "MeanFieldNormalWeights",
    "LowRankNormalWeights",
    "FullCovarianceNormalWeights",
    "NormalPriorWeights",
    "IndependentPriorWeights",
    "AffineCouplingFlow",
    "FlowNormalWeights",
    "VariableDistribution",
    "MeanFieldNormal",
    "LowRankNormal",
    "FullCovarianceNormal",
    "FlowNormal",
    "NormalPrior",
    "TrainableNormalPrior",
    "IndependentPrior",
    "scalar_prior",
    "low_rank_normal_kl",
    "get",
    "serialize",
]

# sigma = softplus(rho) + MIN_SCALE, the floor of the Bayes-by-Backprop layers.
MIN_SCALE = 1e-6


def _inverse_softplus_scale(scale):
    """``rho`` with ``softplus(rho) + MIN_SCALE = scale``."""
    return float(np.log(np.expm1(scale - MIN_SCALE)))


def _softplus_scale(rho):
    return tf.nn.softplus(rho) + MIN_SCALE


def _check_init_scale(value, name="init_scale"):
    return checks.number(name, value, low=MIN_SCALE, low_open=True, high=1e6,
                         what=f"a number in ({MIN_SCALE:g}, 1e6], the initial standard deviation")


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"Expected `{name}` to be a bool. Received: {name}={value!r}")
    return bool(value)


class WeightDistribution(keras.layers.Layer):
    """A distribution over a layer's flattened weights: a Keras layer holding its variables.

    Subclasses create their variables in ``build`` (the owning layer calls
    ``build(None)`` when it builds; make them with ``add_weight(..., autocast=False)``
    so that a mixed-precision model does not cast them to float16) and return the TFP distribution, of event
    shape ``[kernel_size + bias_size]`` and batch shape ``[]``, from
    :meth:`distribution`. It is made anew at each call of the owning layer
    (cheap: a few tensor ops), so it reads the variables' current values. It takes
    ``keras.layers.Layer``'s arguments (``dtype``, ``name``).
    """

    def build(self, input_shape=None):
        pass

    def distribution(self):
        """The TFP distribution over the flattened weights."""
        raise NotImplementedError

    def mean_weights(self, distribution=None):
        """The weights of ``"mean"`` inference mode: ``distribution().mean()``.

        A family whose mean has no closed form (:class:`FlowNormalWeights`) returns
        its own deterministic point instead.

        Args:
            distribution: this object's :meth:`distribution`, if made already.
        """
        return (self.distribution() if distribution is None else distribution).mean()

    def _variable(self, name, shape, initializer, trainable=True):
        """``add_weight``, never autocast: under a mixed policy (float16 compute) the
        distribution stays in the variable dtype, and the owning layer casts its sample."""
        return self.add_weight(name=name, shape=shape, initializer=initializer, trainable=trainable, autocast=False)


class _SizedWeights(WeightDistribution):
    """A built-in family over ``event_size`` weights.

    Args:
        event_size: int > 0, ``n = kernel_size + bias_size``.
        **kwargs: ``keras.layers.Layer`` arguments.
    """

    def __init__(self, event_size, **kwargs):
        super().__init__(**kwargs)
        self.event_size = checks.integer("event_size", event_size, 1)

    def get_config(self):
        config = super().get_config()
        config["event_size"] = self.event_size
        return config


class _GaussianWeights(_SizedWeights):
    """A Gaussian over ``n`` weights with a trained mean ``loc`` (``[n]``); subclasses add the scale.

    Args:
        event_size: int > 0.
        init_scale: float > 0, the initial standard deviation.
        loc_initializer: Keras initializer of the mean.
    """

    def __init__(self, event_size, init_scale=0.01, loc_initializer="random_normal", **kwargs):
        super().__init__(event_size, **kwargs)
        self.init_scale = _check_init_scale(init_scale)
        self.loc_initializer = checks.initializer("loc_initializer", loc_initializer)

    def build(self, input_shape=None):
        self.loc = self._variable("loc", (self.event_size,), self.loc_initializer)

    def get_config(self):
        config = super().get_config()
        config.update({"init_scale": self.init_scale,
                       "loc_initializer": keras.initializers.serialize(self.loc_initializer)})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class MeanFieldNormalWeights(_GaussianWeights):
    """``N(mu, diag(sigma^2))`` over ``n`` weights, ``sigma = softplus(rho) + 1e-6``.

    Variables ``loc`` and ``scale_rho``, each ``[n]``.

    Args:
        event_size: int > 0.
        init_scale: float > 0, the initial ``sigma``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``
            (``N(0, 0.05^2)``).
    """

    def build(self, input_shape=None):
        super().build(input_shape)
        self.scale_rho = self._variable("scale_rho", (self.event_size,), keras.initializers.Constant(
            _inverse_softplus_scale(self.init_scale)))

    def scale(self):
        """``sigma``, ``[n]``."""
        return _softplus_scale(self.scale_rho)

    def distribution(self):
        return tfd.MultivariateNormalDiag(loc=tf.convert_to_tensor(self.loc), scale_diag=self.scale())


@keras.saving.register_keras_serializable(package="tfbnn")
class LowRankNormalWeights(MeanFieldNormalWeights):
    """``N(mu, L L^T + diag(d^2))`` over ``n`` weights: low rank plus diagonal.

    ``d = softplus(rho) + 1e-6`` (``[n]``) and the factor ``L`` (``[n, rank]``).
    A sample is ``w = mu + d * e1 + L e2`` with ``e1 ~ N(0, I_n)``,
    ``e2 ~ N(0, I_rank)``: ``O(rank n)`` per sample. Variables ``loc``,
    ``scale_rho`` and ``factor``.

    Args:
        event_size: int > 0.
        rank: int in ``[1, event_size]``, the columns of ``L``. Default 2.
        init_scale: float > 0, the initial ``d``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``.
        factor_initializer: Keras initializer of ``L``, or None (default): entries
            ``N(0, (0.1 init_scale)^2 / rank)``, so that the covariance starts
            close to ``init_scale^2 I`` but not exactly diagonal.
    """

    def __init__(self, event_size, rank=2, init_scale=0.01, loc_initializer="random_normal",
                 factor_initializer=None, **kwargs):
        super().__init__(event_size, init_scale=init_scale, loc_initializer=loc_initializer, **kwargs)
        self.rank = checks.integer("rank", rank, 1, self.event_size,
                                   what=f"an integer in [1, event_size={self.event_size}] (a higher rank adds nothing)")
        if factor_initializer is None:
            factor_initializer = keras.initializers.RandomNormal(stddev=0.1 * self.init_scale / math.sqrt(self.rank))
        self.factor_initializer = checks.initializer("factor_initializer", factor_initializer)

    def build(self, input_shape=None):
        super().build(input_shape)
        self.factor = self._variable("factor", (self.event_size, self.rank), self.factor_initializer)

    def low_rank(self):
        """This posterior as the :class:`tfbnn.kl.LowRankGaussian` ``N(mu, diag(d^2) + L L^T)``."""
        return kl_lib.LowRankGaussian(tf.convert_to_tensor(self.loc), tf.square(self.scale()),
                                      tf.convert_to_tensor(self.factor))

    def covariance(self):
        """``L L^T + diag(d^2)``, ``[n, n]`` (dense: for checks and small layers)."""
        return self.low_rank().covariance()

    def distribution(self):
        return tfd.MultivariateNormalDiagPlusLowRankCovariance(
            loc=tf.convert_to_tensor(self.loc), cov_diag_factor=tf.square(self.scale()),
            cov_perturb_factor=tf.convert_to_tensor(self.factor))

    def get_config(self):
        config = super().get_config()
        config.update({"rank": self.rank,
                       "factor_initializer": keras.initializers.serialize(self.factor_initializer)})
        return config


def _scale_tril_bijector():
    # Lower triangular, diagonal softplus(x) + MIN_SCALE: every vector of n (n + 1) / 2 reals is a valid scale.
    return tfb.FillScaleTriL(diag_shift=MIN_SCALE)


@keras.saving.register_keras_serializable(package="tfbnn")
class FullCovarianceNormalWeights(_GaussianWeights):
    """``N(mu, S S^T)`` over ``n`` weights, ``S`` lower triangular with a positive diagonal.

    ``S = FillScaleTriL(v)``: the ``n (n + 1) / 2`` reals ``v`` fill the lower
    triangle, and the diagonal is ``softplus + 1e-6``. Variables ``loc`` ``[n]``
    and ``scale_params`` ``[n (n + 1) / 2]``; ``S`` starts at ``init_scale I``.

    Args:
        event_size: int > 0 (memory and time grow as its square and cube).
        init_scale: float > 0, the initial diagonal of ``S``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``.
    """

    def build(self, input_shape=None):
        super().build(input_shape)
        n = self.event_size
        self.scale_params = self._variable("scale_params", (n * (n + 1) // 2,), self._initial_scale_params)

    def _initial_scale_params(self, shape, dtype=None):
        eye = tf.eye(self.event_size, dtype=dtype or "float32")
        return tf.reshape(_scale_tril_bijector().inverse(self.init_scale * eye), shape)

    def scale_tril(self):
        """``S``, ``[n, n]`` lower triangular."""
        return _scale_tril_bijector().forward(tf.convert_to_tensor(self.scale_params))

    def distribution(self):
        return tfd.MultivariateNormalTriL(loc=tf.convert_to_tensor(self.loc), scale_tril=self.scale_tril())


def _inverse_permutation(size):
    return list(range(size - 1, -1, -1))


@keras.saving.register_keras_serializable(package="tfbnn")
class AffineCouplingFlow(keras.layers.Layer):
    """A chain of RealNVP affine coupling bijectors with trained coupling networks.

    Coupling ``t`` (``t = 1 .. num_flows``) keeps one half ``x_a`` of its input and
    moves the other half ``x_b`` by an affine map whose shift and log-scale come
    from a one-hidden-layer network of ``x_a`` (Dinh et al. 2017, eqs. 4-6)::

        h = tanh(x_a W_t + c_t)
        [m, s] = h V_t + e_t                          (shift m, log-scale s)
        y_a = x_a,   y_b = x_b * exp(s) + m
        log |det dy/dx| = sum_j s_j

    Even couplings keep the first ``floor(D / 2)`` coordinates, odd ones the last
    ``ceil(D / 2)`` (``tfb.RealNVP`` with a positive or negative ``num_masked``), so
    every coordinate is moved by every second coupling and the output stays in the
    input's order. (With ``D = 1`` each coupling is an affine map of the one
    coordinate with a trained shift and log-scale, its ``output_bias``.) ``V_t`` and ``e_t`` start at zero:
    the flow starts as the identity. The log-determinant of the chain is the sum
    of the couplings' (Rezende & Mohamed 2015, eq. 6). Louizos & Welling (2017)
    use such masked RealNVP couplings (with a sigmoid-gated update) as the flow on
    the multiplicative noise ``z`` of a Bayesian network.

    Cost per sample of ``D`` values: about ``1.5 D H`` multiply-adds per coupling
    (``H = hidden_units``); parameters ``(1.5 D + 1) H + D`` per coupling.

    Args:
        event_size: int > 0, ``D``.
        num_flows: int >= 1, the couplings. Default 2.
        hidden_units: int >= 1, ``H``. Default 50.
        seed: int or None, seed of the initial ``W_t`` (Glorot uniform).
        **kwargs: ``keras.layers.Layer`` arguments (``dtype``, ``name``).

    Example:
        >>> import numpy as np, tfbnn
        >>> flow = tfbnn.posteriors.AffineCouplingFlow(4, num_flows=2, hidden_units=8, seed=0)
        >>> flow.build()
        >>> x = np.arange(8, dtype="float32").reshape(2, 4)
        >>> bool(np.allclose(flow.bijector().forward(x), x))  # the identity at the start
        True

    References:
        Dinh, Sohl-Dickstein, Bengio. Density Estimation using Real NVP. ICLR 2017.
        Louizos, Welling. Multiplicative Normalizing Flows for Variational Bayesian
        Neural Networks. ICML 2017.
    """

    def __init__(self, event_size, num_flows=2, hidden_units=50, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.event_size = checks.integer("event_size", event_size, 1)
        self.num_flows = checks.integer("num_flows", num_flows, 1)
        self.hidden_units = checks.integer("hidden_units", hidden_units, 1)
        self.seed = checks.seed(seed)

    def _split(self, index):
        """``(num_masked, kept, moved)`` of coupling ``index``."""
        size = self.event_size
        if size == 1:
            return 0, 0, 1
        first = size // 2
        if index % 2 == 0:
            return first, first, size - first
        return -(size - first), size - first, first

    def build(self, input_shape=None):
        self.couplings = []
        for index in range(self.num_flows):
            _, kept, moved = self._split(index)
            output_bias = self.add_weight(name=f"coupling_{index}_output_bias", shape=(2 * moved,),
                                          initializer="zeros", autocast=False)
            if not kept:  # D = 1: nothing to condition on, the shift and log-scale are the bias
                self.couplings.append((output_bias,))
                continue
            seed = None if self.seed is None else self.seed + index
            self.couplings.append((
                output_bias,
                self.add_weight(name=f"coupling_{index}_hidden_kernel", shape=(kept, self.hidden_units),
                                initializer=keras.initializers.GlorotUniform(seed=seed), autocast=False),
                self.add_weight(name=f"coupling_{index}_hidden_bias", shape=(self.hidden_units,),
                                initializer="zeros", autocast=False),
                self.add_weight(name=f"coupling_{index}_output_kernel", shape=(self.hidden_units, 2 * moved),
                                initializer="zeros", autocast=False),
            ))

    def _shift_and_log_scale_fn(self, index):
        output_bias, *network = self.couplings[index]

        def shift_and_log_scale(kept, moved):
            if network:
                hidden_kernel, hidden_bias, output_kernel = network
                hidden = tf.tanh(keras.ops.matmul(kept, hidden_kernel) + hidden_bias)
                out = keras.ops.matmul(hidden, output_kernel) + output_bias
            else:
                out = tf.zeros(tf.concat([tf.shape(kept)[:-1], [2 * moved]], 0), kept.dtype) + output_bias
            return out[..., :moved], out[..., moved:]

        return shift_and_log_scale

    def bijector(self):
        """The flow ``f`` as a ``tfb.Chain`` of ``tfb.RealNVP`` couplings (event rank 1)."""
        couplings = [tfb.RealNVP(num_masked=self._split(index)[0],
                                 shift_and_log_scale_fn=self._shift_and_log_scale_fn(index),
                                 name=f"coupling_{index}")
                     for index in range(self.num_flows)]
        return tfb.Chain(couplings[::-1], name="affine_coupling_flow")  # a Chain applies its last bijector first

    def forward_and_log_det(self, x):
        """``(f(x), log |det df/dx|)`` for ``x`` of shape ``[..., D]`` (the log-det ``[...]``)."""
        bijector = self.bijector()
        return bijector.forward(x), bijector.forward_log_det_jacobian(x, event_ndims=1)

    def get_config(self):
        config = super().get_config()
        config.update({"event_size": self.event_size, "num_flows": self.num_flows,
                       "hidden_units": self.hidden_units, "seed": self.seed})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class FlowNormalWeights(MeanFieldNormalWeights):
    """A normalizing-flow posterior over ``n`` weights: ``w = f(w0)``, ``w0 ~ N(mu, diag(sigma^2))``.

    ``f`` is an :class:`AffineCouplingFlow` (RealNVP couplings, trained with ``mu``
    and ``sigma``), so ``q`` is a ``tfd.TransformedDistribution`` with the density
    (Rezende & Mohamed 2015, eq. 6)::

        log q(w) = log N(w0 | mu, diag(sigma^2)) - log |det df/dw0 (w0)|,   w0 = f^-1(w)

    and correlated, non-Gaussian weights. No KL against a Gaussian prior has a
    closed form: :class:`tfbnn.layers.DenseVariational` uses the unbiased
    ``log q(w) - log p(w)`` at its weight sample. ``"mean"`` inference mode uses
    ``f(mu)`` (:meth:`mean_weights`; ``E_q[w]`` has no closed form; at the identity
    start they agree). Variables ``loc``, ``scale_rho`` (``[n]`` each) and the flow's.

    Args:
        event_size: int > 0.
        num_flows: int >= 1, the coupling bijectors. Default 2.
        hidden_units: int >= 1, the hidden units of each coupling network. Default 16.
        init_scale: float > 0, the initial ``sigma``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``.
        seed: int or None, seed of the flow's initial weights.
    """

    def __init__(self, event_size, num_flows=2, hidden_units=16, init_scale=0.01, loc_initializer="random_normal",
                 seed=None, **kwargs):
        super().__init__(event_size, init_scale=init_scale, loc_initializer=loc_initializer, **kwargs)
        self.flow = AffineCouplingFlow(self.event_size, num_flows, hidden_units, seed=seed, name="flow",
                                       dtype=self.dtype_policy)

    def build(self, input_shape=None):
        super().build(input_shape)
        self.flow.build()

    def base_distribution(self):
        """``N(mu, diag(sigma^2))``, the distribution of ``w0``."""
        return super().distribution()

    def distribution(self):
        return tfd.TransformedDistribution(self.base_distribution(), self.flow.bijector())

    def mean_weights(self, distribution=None):
        """``f(mu)``, the flow at the base mean."""
        return self.flow.bijector().forward(tf.convert_to_tensor(self.loc))

    def get_config(self):
        config = super().get_config()
        config.update({"num_flows": self.flow.num_flows, "hidden_units": self.flow.hidden_units,
                       "seed": self.flow.seed})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class NormalPriorWeights(_SizedWeights):
    """The prior ``N(m, s^2 I)`` over ``n`` weights, fixed or partly trained.

    Fixed by default (no variables). With ``trainable_loc=True`` the mean is a
    trained vector ``m`` (``[n]``, variable ``loc``, starting at ``loc``): TFP's
    ``prior_trainable`` example. With ``trainable_scale=True`` one trained
    ``s = softplus(rho) + 1e-6`` (variable ``scale_rho``, a scalar, starting at
    ``scale``) is shared by all weights: empirical Bayes, as Graves 2011's
    adaptive prior. A trained prior moves towards the posterior, so the KL holds
    the weights less than a fixed prior does.

    Args:
        event_size: int > 0.
        loc: float, ``m`` (its initial value when trained). Default 0.
        scale: float > 0, ``s`` (its initial value when trained). Default 1.
        trainable_loc: bool. Default False.
        trainable_scale: bool. Default False.
    """

    def __init__(self, event_size, loc=0.0, scale=1.0, trainable_loc=False, trainable_scale=False, **kwargs):
        super().__init__(event_size, **kwargs)
        self.init_loc = checks.number("loc", loc)
        self.init_scale = _check_init_scale(scale, "scale")
        self.trainable_loc = _check_bool("trainable_loc", trainable_loc)
        self.trainable_scale = _check_bool("trainable_scale", trainable_scale)

    def build(self, input_shape=None):
        self.loc = self.scale_rho = None
        if self.trainable_loc:
            self.loc = self._variable("loc", (self.event_size,), keras.initializers.Constant(self.init_loc))
        if self.trainable_scale:
            self.scale_rho = self._variable("scale_rho", (), keras.initializers.Constant(
                _inverse_softplus_scale(self.init_scale)))

    def distribution(self):
        dtype = self.variable_dtype
        if self.loc is None:
            loc = tf.fill([self.event_size], tf.constant(self.init_loc, dtype))
        else:
            loc = tf.convert_to_tensor(self.loc)
        scale = tf.constant(self.init_scale, dtype) if self.scale_rho is None else _softplus_scale(self.scale_rho)
        return tfd.MultivariateNormalDiag(loc=loc, scale_diag=tf.fill([self.event_size], scale))

    def get_config(self):
        config = super().get_config()
        config.update({"loc": self.init_loc, "scale": self.init_scale, "trainable_loc": self.trainable_loc,
                       "trainable_scale": self.trainable_scale})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class IndependentPriorWeights(_SizedWeights):
    """A :mod:`tfbnn.priors` prior on each of ``n`` weights, independently: ``p(w) = prod_i p(w_i)``.

    ``tfd.Sample(prior.distribution(), n)``, event shape ``[n]``, no variables. TFP
    registers no KL between these posteriors and it, so the layer uses the Monte Carlo
    KL (for a :class:`tfbnn.priors.Normal` use :class:`NormalPriorWeights`, closed form).

    Args:
        event_size: int > 0.
        prior: a :class:`tfbnn.priors.Prior` of one weight (its name or serialized dict):
            ``Normal``, ``ScaleMixture`` or a fixed ``Graves``.
    """

    def __init__(self, event_size, prior, **kwargs):
        super().__init__(event_size, **kwargs)
        self.prior = scalar_prior(prior, "prior")

    def distribution(self):
        return tfd.Sample(self.prior.distribution(self.variable_dtype), sample_shape=[self.event_size])

    def get_config(self):
        config = super().get_config()
        config["prior"] = priors_lib.serialize(self.prior)
        return config


def scalar_prior(value, name="prior"):
    """``value`` (a prior, its name or serialized dict) as a fixed :mod:`tfbnn.priors` prior of one weight.

    A :class:`tfbnn.priors.Posterior` (per weight) or an adaptive :class:`tfbnn.priors.Graves`
    (fitted to a mean-field posterior) is a ValueError naming ``name``.
    """
    prior = priors_lib.get(value, name=name)
    if isinstance(prior, priors_lib.Posterior) or getattr(prior, "adaptive", False):
        raise ValueError(f"Expected `{name}` to be a fixed prior of one weight (Normal, ScaleMixture, Graves with loc "
                         f"and scale), broadcast over every weight. Received: {name}={prior!r}")
    return prior


@keras.saving.register_keras_serializable(package="tfbnn")
class VariableDistribution(WeightDistribution):
    """One trainable parameter vector and a function that makes the distribution from it.

    The port of TFP's ``tf_keras.Sequential([tfp.layers.VariableLayer(num_params),
    tfp.layers.DistributionLambda(make_distribution)])``: the vector ``t``
    (``[num_params]``) is the layer's variable ``params``, and
    ``make_distribution(t)`` returns the TFP distribution over the weights.

    Args:
        num_params: int > 0, the length of ``t``.
        make_distribution: callable ``t -> tfd.Distribution`` of event shape
            ``[kernel_size + bias_size]``. A lambda is fine inside a registered
            builder function (the builder, not this layer, is what a saved model
            names).
        initializer: Keras initializer of ``t``. Default ``"zeros"`` (TFP's
            ``VariableLayer`` default).
        **kwargs: ``keras.layers.Layer`` arguments (``dtype``, ``name``).

    Example:
        >>> import tensorflow as tf, tensorflow_probability as tfp, tfbnn
        >>> tfd = tfp.distributions
        >>> q = tfbnn.posteriors.VariableDistribution(
        ...     6, lambda t: tfd.Independent(tfd.Normal(t[:3], 1e-5 + tf.nn.softplus(t[3:])), 1))
        >>> q.build()
        >>> q.distribution().event_shape
        TensorShape([3])
    """

    def __init__(self, num_params, make_distribution, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if isinstance(make_distribution, dict):
            make_distribution = keras.saving.deserialize_keras_object(make_distribution)
        if not callable(make_distribution):
            raise ValueError("Expected `make_distribution` to be a callable t -> tfd.Distribution. "
                             f"Received: make_distribution={make_distribution!r}")
        self.num_params = checks.integer("num_params", num_params, 1)
        self.make_distribution = make_distribution
        self.initializer = checks.initializer("initializer", initializer)

    def build(self, input_shape=None):
        self.params = self._variable("params", (self.num_params,), self.initializer)

    def distribution(self):
        return self.make_distribution(tf.convert_to_tensor(self.params))

    def get_config(self):
        config = super().get_config()
        config.update({"num_params": self.num_params,
                       "make_distribution": keras.saving.serialize_keras_object(self.make_distribution),
                       "initializer": keras.initializers.serialize(self.initializer)})
        return config


# -- builders: the make_posterior_fn / make_prior_fn of DenseVariational --------


class _Builder(Configurable):
    """A serializable ``(kernel_size, bias_size, dtype) -> WeightDistribution``.

    Subclasses set ``layer_class`` and keep their constructor arguments in
    ``self._config``; :meth:`_layer_config` is what the layer is made with.
    """

    layer_class = None

    def __call__(self, kernel_size, bias_size=0, dtype=None):
        kernel_size = checks.integer("kernel_size", kernel_size, 1)
        bias_size = checks.integer("bias_size", bias_size, 0)
        return self.layer_class(kernel_size + bias_size, dtype=dtype, **self._layer_config())

    def _layer_config(self):
        return self._config

    def get_config(self):
        return dict(self._config)


class _GaussianBuilder(_Builder):
    """A builder of a Gaussian posterior: ``init_scale`` and ``loc_initializer`` (see the subclasses)."""

    def __init__(self, init_scale=0.01, loc_initializer="random_normal"):
        _check_init_scale(init_scale)
        checks.initializer("loc_initializer", loc_initializer)
        self._config = {"init_scale": float(init_scale), "loc_initializer": _initializer_config(loc_initializer)}


@keras.saving.register_keras_serializable(package="tfbnn")
class MeanFieldNormal(_GaussianBuilder):
    """Builds a :class:`MeanFieldNormalWeights` posterior: ``N(mu, diag(sigma^2))``.

    Args:
        init_scale: float > 0, the initial ``sigma``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``.

    Example:
        >>> import tfbnn
        >>> q = tfbnn.posteriors.MeanFieldNormal(init_scale=0.05)(kernel_size=6, bias_size=2, dtype="float32")
        >>> q.build()
        >>> q.distribution().event_shape, [w.name for w in q.weights]
        (TensorShape([8]), ['loc', 'scale_rho'])
    """

    layer_class = MeanFieldNormalWeights


@keras.saving.register_keras_serializable(package="tfbnn")
class FullCovarianceNormal(_GaussianBuilder):
    """Builds a :class:`FullCovarianceNormalWeights` posterior: ``N(mu, S S^T)``, ``MultivariateNormalTriL``.

    Args:
        init_scale: float > 0, the initial diagonal of ``S``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``.
    """

    layer_class = FullCovarianceNormalWeights


@keras.saving.register_keras_serializable(package="tfbnn")
class LowRankNormal(_GaussianBuilder):
    """Builds a :class:`LowRankNormalWeights` posterior: ``N(mu, L L^T + diag(d^2))``.

    Args:
        rank: int > 0, the columns of ``L``, at most ``kernel_size + bias_size``. Default 2.
        init_scale: float > 0, the initial ``d``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``.
        factor_initializer: Keras initializer of ``L`` or None (the default of
            :class:`LowRankNormalWeights`).
    """

    layer_class = LowRankNormalWeights

    def __init__(self, rank=2, init_scale=0.01, loc_initializer="random_normal", factor_initializer=None):
        super().__init__(init_scale, loc_initializer)
        if factor_initializer is not None:
            checks.initializer("factor_initializer", factor_initializer)
        self._config = {"rank": checks.integer("rank", rank, 1), **self._config,
                        "factor_initializer": _initializer_config(factor_initializer)}


@keras.saving.register_keras_serializable(package="tfbnn")
class FlowNormal(_GaussianBuilder):
    """Builds a :class:`FlowNormalWeights` posterior: ``N(mu, diag(sigma^2))`` through a RealNVP flow.

    Args:
        num_flows: int >= 1, the coupling bijectors. Default 2.
        hidden_units: int >= 1, the hidden units of each coupling network. Default 16.
        init_scale: float > 0, the initial ``sigma``. Default 0.01.
        loc_initializer: Keras initializer of ``mu``. Default ``"random_normal"``.
        seed: int or None, seed of the flow's initial weights.

    Example:
        >>> import tfbnn
        >>> q = tfbnn.posteriors.FlowNormal(num_flows=2, hidden_units=4, seed=0)(kernel_size=6, bias_size=2)
        >>> q.build()
        >>> q.distribution().event_shape, len(q.trainable_weights)   # loc, scale_rho, 4 per coupling
        (TensorShape([8]), 10)
    """

    layer_class = FlowNormalWeights

    def __init__(self, num_flows=2, hidden_units=16, init_scale=0.01, loc_initializer="random_normal", seed=None):
        super().__init__(init_scale, loc_initializer)
        self._config = {"num_flows": checks.integer("num_flows", num_flows, 1),
                        "hidden_units": checks.integer("hidden_units", hidden_units, 1), **self._config,
                        "seed": checks.seed(seed)}


@keras.saving.register_keras_serializable(package="tfbnn")
class NormalPrior(_Builder):
    """Builds the fixed prior ``N(loc, scale^2 I)`` (a :class:`NormalPriorWeights`).

    Args:
        scale: float > 0. Default 1.
        loc: float. Default 0.
    """

    layer_class = NormalPriorWeights

    def __init__(self, scale=1.0, loc=0.0):
        self._config = {"scale": _check_init_scale(scale, "scale"), "loc": checks.number("loc", loc)}


@keras.saving.register_keras_serializable(package="tfbnn")
class TrainableNormalPrior(_Builder):
    """Builds the prior ``N(m, s^2 I)`` with a trained mean ``m`` (a :class:`NormalPriorWeights`).

    TFP's ``prior_trainable``: ``m`` starts at 0, ``s`` is fixed, or trained
    (one ``s`` shared by all weights) with ``trainable_scale=True``.

    Args:
        scale: float > 0, ``s`` (its initial value when trained). Default 1.
        trainable_scale: bool. Default False.
    """

    layer_class = NormalPriorWeights

    def __init__(self, scale=1.0, trainable_scale=False):
        self._config = {"scale": _check_init_scale(scale, "scale"),
                        "trainable_scale": _check_bool("trainable_scale", trainable_scale)}

    def _layer_config(self):
        return {**self._config, "trainable_loc": True}


@keras.saving.register_keras_serializable(package="tfbnn")
class IndependentPrior(_Builder):
    """Builds ``prod_i p(w_i)`` from a :mod:`tfbnn.priors` prior ``p`` of one weight (an :class:`IndependentPriorWeights`).

    What :class:`tfbnn.layers.DenseVariational` makes of ``make_prior_fn=`` a prior object
    other than a ``Normal`` (say ``tfbnn.priors.ScaleMixture()``, Blundell et al. 2015): the
    same prior the other layers take as ``kernel_prior``, over the flattened weights. KL:
    Monte Carlo.

    Args:
        prior: a :class:`tfbnn.priors.Prior` (or its name or serialized dict), fixed.

    Example:
        >>> import tfbnn
        >>> p = tfbnn.posteriors.IndependentPrior(tfbnn.priors.ScaleMixture())(kernel_size=6, bias_size=2)
        >>> p.distribution().event_shape
        TensorShape([8])
    """

    layer_class = IndependentPriorWeights

    def __init__(self, prior):
        self._config = {"prior": priors_lib.serialize(scalar_prior(prior, "prior"))}


def _initializer_config(value):
    """A JSON-able form of an initializer argument (names stay names)."""
    if value is None or isinstance(value, str):
        return value
    return keras.initializers.serialize(keras.initializers.get(value))


_NAMED = {
    "mean_field": MeanFieldNormal,
    "low_rank": LowRankNormal,
    "full_covariance": FullCovarianceNormal,
    "flow": FlowNormal,
    "normal": NormalPrior,
    "trainable_normal": TrainableNormalPrior,
}


def get(identifier, name="make_posterior_fn"):
    """A builder ``(kernel_size, bias_size, dtype) -> WeightDistribution`` from a name, config or callable.

    Args:
        identifier: one of ``"mean_field", "low_rank", "full_covariance", "flow",
            "normal", "trainable_normal"`` (the builders with their defaults); a
            config from :func:`serialize`; or a callable (a builder object, or
            your own function: register it with
            ``keras.saving.register_keras_serializable`` to save the model).
        name: the argument named in errors.

    Returns:
        The callable builder.

    Example:
        >>> import tfbnn
        >>> tfbnn.posteriors.get("low_rank")
        LowRankNormal(rank=2, init_scale=0.01, loc_initializer='random_normal', factor_initializer=None)
    """
    if isinstance(identifier, str):
        if identifier not in _NAMED:
            raise ValueError(f"Expected `{name}` to be one of {sorted(_NAMED)}, a builder or a function. "
                             f"Received: {name}={identifier!r}")
        return _NAMED[identifier]()
    if isinstance(identifier, dict):
        try:
            identifier = keras.saving.deserialize_keras_object(identifier)
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"Expected `{name}` to be a builder's config ({e}). Received: {name}={identifier!r}") \
                from None
    if not callable(identifier) or isinstance(identifier, type):
        raise ValueError(f"Expected `{name}` to be a builder (kernel_size, bias_size, dtype) -> "
                         f"tfbnn.posteriors.WeightDistribution: a name in {sorted(_NAMED)}, a builder object or a "
                         f"function. Received: {name}={identifier!r}")
    return identifier


def serialize(builder, name="make_posterior_fn"):
    """The config of a builder: an object with ``get_config``, or a registered function.

    Args:
        builder: the builder.
        name: the argument named in errors.

    Returns:
        A JSON-able dict for ``keras.saving.deserialize_keras_object`` (and :func:`get`).
        A function that ``keras.saving.register_keras_serializable`` has not registered
        (a lambda, a local function) cannot be found again when a model loads: it
        raises a ValueError naming ``name``.
    """
    return checks.registered(name, builder, "a builder object")


# -- the KL that TFP 0.25 does not register -------------------------------------


def _is_diagonal(operator):
    return isinstance(operator, (tf.linalg.LinearOperatorDiag, tf.linalg.LinearOperatorIdentity,
                                 tf.linalg.LinearOperatorScaledIdentity))


def low_rank_normal_kl(q, p, name=None):
    """``KL(q || p)``, ``q = N(mu_q, diag(D) + U U^T)`` (rank r), ``p = N(mu_p, S S^T)``.

    Registered with ``tfd.RegisterKL``, so ``tfd.kl_divergence(q, p)`` works. With
    ``n`` dimensions (the formula in the module docstring)::

        tr(Sigma_p^-1 Sigma_q) = ||S^-1 diag(D)^(1/2)||_F^2 + ||S^-1 U||_F^2
        log det Sigma_q = sum log D + log det(I_r + U^T diag(D)^-1 U)

    (the matrix determinant lemma): ``O(r^2 n)`` for a diagonal ``S`` (then it is
    :meth:`tfbnn.kl.LowRankGaussian.kl_to_diagonal`, the KL of the layers' low-rank
    posteriors too), ``O(n^2 (n + r))`` for a dense one.

    Args:
        q: ``tfd.MultivariateNormalDiagPlusLowRankCovariance``.
        p: a ``tfd.MultivariateNormalLinearOperator`` (``MultivariateNormalDiag``,
            ``MultivariateNormalTriL``, ...).
        name: unused (TFP's signature).

    Returns:
        The KL, of ``q``'s and ``p``'s broadcast batch shape.
    """
    del name
    diag = tf.convert_to_tensor(q.parameters["cov_diag_factor"])
    factor = tf.convert_to_tensor(q.parameters["cov_perturb_factor"])
    low_rank = kl_lib.LowRankGaussian(q.mean(), diag, factor)
    scale = p.scale
    if _is_diagonal(scale):
        return low_rank.kl_to_diagonal(p.mean(), scale.diag_part())
    trace = (tf.reduce_sum(tf.square(scale.solve(tf.linalg.diag(tf.sqrt(diag)))), [-2, -1])
             + tf.reduce_sum(tf.square(scale.solve(factor)), [-2, -1]))
    mahalanobis = tf.reduce_sum(tf.square(scale.solvevec(p.mean() - q.mean())), -1)
    log_det_q = low_rank.log_det()
    log_det_p = 2.0 * scale.log_abs_determinant()
    n = tf.cast(tf.shape(diag)[-1], diag.dtype)
    return 0.5 * (trace + mahalanobis - n + log_det_p - log_det_q)


try:
    tfd.RegisterKL(tfd.MultivariateNormalDiagPlusLowRankCovariance, tfd.MultivariateNormalLinearOperator)(
        low_rank_normal_kl)
except ValueError:  # registered already: by a TFP that has it, or when this module is reloaded
    pass
