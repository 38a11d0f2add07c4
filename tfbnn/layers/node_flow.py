"""Node noise with a normalizing-flow posterior: iBNN layers whose noise passes through TFP bijectors.

The layers of :mod:`tfbnn.layers.node` multiply each input node (channel) by
latent noise ``z`` with a Gaussian-mixture posterior. Here ``z`` has a
normalizing-flow posterior instead, the multiplicative normalizing flow of Louizos
& Welling (2017) on the node noise of an implicit BNN (Trinh et al. 2022)::

    f_l(x) = sigma( U_l (z_l o f_{l-1}(x)) + b_l )
    z0 ~ q0 = N(mu, diag(sigma^2)),   sigma = softplus(rho)        (d values per layer)
    z = f(z0) = f_T o ... o f_1 (z0)                                (T = num_flows)
    p(z) = N(z | m_p, s^2 I)                                        (the iBNN prior)

``f`` is an :class:`tfbnn.posteriors.AffineCouplingFlow`: RealNVP affine coupling
bijectors (``tfb.RealNVP``) with small trained networks (Dinh et al. 2017,
eqs. 4-6), alternating which half of the nodes they move. The weights ``U``,
``b`` stay deterministic, so the layer has ``2 d`` Gaussian parameters plus the
flow's ``(1.5 d + 1) H + d`` per coupling (``H = hidden_units``), never a
weight-sized distribution: it scales like the iBNN layers (one ``d``-vector per
example through the flow, about ``1.5 d H`` multiply-adds per coupling).

Density by the change of variables (Rezende & Mohamed 2015, eq. 6)::

    log q(z) = log q0(z0) - sum_t log |det d f_t / d z_{t-1}|,     z = f(z0)

and the KL is its Monte Carlo estimate at the call's own noise draws, averaged
over the ``R`` rows of the call (each row an example with its own ``z_r``)::

    KL(q || p) = E_q[log q(z) - log p(z)]
               ~ (1/R) sum_r [log q0(z0_r) - log |det J_f(z0_r)| - log p(f(z0_r))]

unbiased for the true KL (Louizos & Welling 2017 need the auxiliary bound with
``r(z | W)`` only because their weights are random given ``z``; here they are
not, so ``log q(z)`` is exact). :meth:`NodeFlowLayer.kl_divergence` draws
``num_kl_samples`` fresh ``z`` for it. The flow starts as the identity, where
the layer is :class:`tfbnn.layers.NodeDense` with one component
(``num_components=1``: its KL is the closed-form ``KL(N(mu, sigma^2) || p)``,
which this estimate matches in expectation).

What a row draws follows :mod:`tfbnn.layers.node` with ``K = 1``: a fresh ``z`` per
example in training and in ``"sample"`` inference; inside
:func:`tfbnn.utils.weight_samples` (Monte Carlo prediction) per row, or one per
sample block with ``joint=True``. ``inference_mode="mean"`` uses ``z = f(mu)``, the
flow at the base mean (``E_q[z]`` has no closed form; at the identity start they
agree). The KL is added as ``kl_weight * KL`` (the ELBO convention of
:mod:`tfbnn.callbacks`; :class:`tfbnn.KLAnnealing` applies). The base parameters
are ``node_loc`` and ``node_rho`` (shape ``(1, d)``), which
:func:`tfbnn.ibnn.node_optimizer` trains with the variational learning rate; the
flow's weights (``flow/coupling_*``) train with the weights' rate.

References:
    Louizos, Welling. Multiplicative Normalizing Flows for Variational Bayesian
    Neural Networks. ICML 2017.
    Dinh, Sohl-Dickstein, Bengio. Density Estimation using Real NVP. ICLR 2017.
    Rezende, Mohamed. Variational Inference with Normalizing Flows. ICML 2015.
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022.
"""

import math

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn._internal import checks
from tfbnn.layers.arguments import ConvArguments, DenseArguments
from tfbnn.layers.node import NodeKernelLayer, NodeLayer
from tfbnn.posteriors import AffineCouplingFlow

tfd = tfp.distributions

__all__ = ["NodeFlowLayer", "NodeDenseFlow", "NodeConv2DFlow"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# NodeLayer arguments that a flow posterior fixes: one base Gaussian, a Monte Carlo KL.
_FIXED = {"num_components": 1, "kl_estimator": "monte_carlo"}


class NodeFlowLayer(NodeLayer):
    """Node noise ``z = f(z0)``, ``z0 ~ N(mu, diag(sigma^2))``, ``f`` a RealNVP flow; see the module docstring.

    Args:
        num_flows: int >= 1, the coupling bijectors of ``f``. Default 2.
        hidden_units: int >= 1, hidden units of each coupling network. Default 50.
        **kwargs: the arguments of :class:`tfbnn.layers.node.NodeLayer` but
            ``num_components`` and ``kl_estimator`` (fixed: one base Gaussian, a
            Monte Carlo KL): ``prior_mean`` and ``prior_stddev`` (the prior
            ``N(m_p, s^2 I)``, default 1 and 0.1); ``init_mean``, ``init_stddev``
            (``mu ~ N(init_mean, init_stddev^2)`` at the start, default 1 and 0.5,
            as :class:`tfbnn.layers.NodeDense`); ``init_scale_mean``,
            ``init_scale_stddev`` (``sigma ~ |N(., .^2)|``, default 0.05 and 0.02);
            ``num_kl_samples`` (fresh draws of :meth:`kl_divergence`; a call uses its
            own draws, one per row; default 1); ``kl_weight``, ``inference_mode``,
            ``seed`` (:class:`tfbnn.layers.BayesianLayer`; ``seed`` also seeds ``mu``,
            ``sigma`` and the flow's first weights).
    """

    def __init__(self, num_flows=2, hidden_units=50, **kwargs):
        fixed = sorted(set(kwargs) & set(_FIXED))
        if fixed:
            raise ValueError(
                f"Expected no {' or '.join(f'`{k}`' for k in fixed)}: a flow posterior has one base Gaussian and a "
                f"Monte Carlo KL. Received: {', '.join(f'{k}={kwargs[k]!r}' for k in fixed)}"
            )
        super().__init__(**_FIXED, **kwargs)
        self.num_flows = checks.integer("num_flows", num_flows, 1)
        self.hidden_units = checks.integer("hidden_units", hidden_units, 1)

    def _build_node_weights(self, num_nodes):
        super()._build_node_weights(num_nodes)
        self.flow = AffineCouplingFlow(self.num_nodes, self.num_flows, self.hidden_units, seed=self._init_seed(2),
                                       name="flow", dtype=self.dtype_policy)
        self.flow.build()

    # -- the distributions, for inspection and checks ------------------------------------
    def noise_distribution(self):
        """``q(z)``: ``tfd.TransformedDistribution`` of ``N(mu, diag(sigma^2))`` through the flow, event ``[d]``."""
        base = tfd.MultivariateNormalDiag(self.node_loc[0], self.node_scale()[0])
        return tfd.TransformedDistribution(base, self.flow.bijector())

    def noise_prior(self):
        """``p(z) = N(m_p, s^2 I)``, event ``[d]``."""
        dtype = self.node_loc.dtype
        return tfd.MultivariateNormalDiag(tf.fill([self.num_nodes], tf.constant(self.prior_mean, dtype)),
                                          tf.fill([self.num_nodes], tf.constant(self.prior_stddev, dtype)))

    def log_q_minus_log_p(self, base_noise):
        """``(f(z0), log q(f(z0)) - log p(f(z0)))`` for base draws ``z0`` of shape ``[R, d]``.

        ``log q`` by the change of variables: ``log q0(z0) - log |det J_f(z0)|``.
        """
        loc, scale = self.node_loc, self.node_scale()
        d = self.num_nodes
        log_q0 = tf.reduce_sum(-0.5 * tf.square((base_noise - loc) / scale) - tf.math.log(scale), axis=-1)
        z, log_det = self.flow.forward_and_log_det(base_noise)
        s = self.prior_stddev
        log_p = tf.reduce_sum(-0.5 * tf.square((z - self.prior_mean) / s), axis=-1) - d * math.log(s)
        return z, log_q0 - d * _HALF_LOG_2PI - log_det - (log_p - d * _HALF_LOG_2PI)

    # -- the noise -------------------------------------------------------------------------
    def _flow_noise(self, inputs, training, axis):
        """``(z, kl)``: ``z`` shaped to broadcast against ``inputs`` along ``axis``; ``kl`` the
        estimate at these draws (None without sampling)."""
        dtype = self.node_loc.dtype
        base = super()._noise(tf.cast(inputs, dtype), training, axis)  # z0, or mu without sampling
        z, log_ratio = self.log_q_minus_log_p(tf.reshape(base, [-1, self.num_nodes]))
        z = tf.cast(tf.reshape(z, tf.shape(base)), inputs.dtype)
        return z, (tf.reduce_mean(log_ratio) if self._sampling(training) else None)

    def _noise(self, inputs, training, axis):
        return self._flow_noise(inputs, training, axis)[0]

    # -- KL ------------------------------------------------------------------------------
    def kl_divergence(self):
        """A fresh Monte Carlo estimate of ``KL(q || p)`` from ``num_kl_samples`` draws, unscaled.

        ``mean_m [log q0(z0_m) - log |det J_f(z0_m)| - log p(f(z0_m))]``; it advances the seed.
        """
        loc, scale = self.node_loc, self.node_scale()
        base = loc + scale * self._normal(tf.stack([self.num_kl_samples, self.num_nodes]), loc.dtype)
        return tf.reduce_mean(self.log_q_minus_log_p(base)[1])

    def get_config(self):
        config = super().get_config()
        for key in _FIXED:
            config.pop(key)
        config.update({"num_flows": self.num_flows, "hidden_units": self.hidden_units})
        return config


class NodeFlowKernelLayer(NodeKernelLayer, NodeFlowLayer):
    """A deterministic kernel and bias whose inputs carry flow node noise (the base of the flow layers).

    Args:
        activation, use_bias, kernel_initializer, bias_initializer: as :class:`tfbnn.layers.node.NodeKernelLayer`.
        **kwargs: the arguments of :class:`NodeFlowLayer`.
    """

    def call(self, inputs, training=None):
        z, kl = self._flow_noise(inputs, training, self.channel_axis)
        return self._finish(self.forward(inputs * z, self.kernel), self.bias, training, kl=kl)


@keras.saving.register_keras_serializable(package="tfbnn")
class NodeDenseFlow(DenseArguments, NodeFlowKernelLayer):
    """Dense layer with flow node noise: ``activation((z o x) U + b)``, ``z = f(z0)``, ``z0 ~ N(mu, diag(sigma^2))``.

    The multiplicative normalizing flow (Louizos & Welling 2017) on the iBNN node
    noise: ``U`` (``kernel``, ``(d, units)``) and ``b`` are deterministic, ``z`` has
    one entry per input node, drawn per example, through ``num_flows`` RealNVP
    couplings (:class:`tfbnn.posteriors.AffineCouplingFlow`). KL: the Monte Carlo
    ``log q(z) - log p(z)`` at the call's draws, ``log q`` by the change of
    variables (Rezende & Mohamed 2015, eq. 6). See :mod:`tfbnn.layers.node_flow`.

    Args:
        units: int > 0, output dimension.
        *args: ``activation``, ``use_bias``, ``kernel_initializer``,
            ``bias_initializer``, in this order after ``units``.
        **kwargs: those by name and the arguments of :class:`NodeFlowLayer`
            (``num_flows=2``, ``hidden_units=50``, ``prior_mean=1``,
            ``prior_stddev=0.1``, ``init_mean``, ``init_stddev``,
            ``init_scale_mean``, ``init_scale_stddev``, ``num_kl_samples``,
            ``kl_weight``, ``inference_mode``, ``seed``).

    Call arguments:
        inputs: tensor ``(batch, ..., d)``.
        training: bool.

    Input shape: ``(batch, ..., d)``, rank >= 2. Output shape: ``(batch, ..., units)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.NodeDenseFlow(3, num_flows=2, hidden_units=8, kl_weight=1e-3, seed=0)
        >>> layer(np.ones((5, 4), "float32")).shape
        TensorShape([5, 3])
        >>> layer.noise_distribution().event_shape, len(layer.losses)
        (TensorShape([4]), 1)

    References:
        Louizos, Welling. Multiplicative Normalizing Flows for Variational Bayesian
        Neural Networks. ICML 2017.
        Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
        Bayesian Neural Networks. ICML 2022.
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class NodeConv2DFlow(ConvArguments, NodeFlowKernelLayer):
    """2-D convolution with flow node noise per input channel: ``activation(conv(z o x, U) + b)``.

    ``z = f(z0)``, ``z0 ~ N(mu, diag(sigma^2))`` with one entry per input channel,
    drawn per example and shared over all positions, ``f`` RealNVP couplings (the
    multiplicative normalizing flow, Louizos & Welling 2017); the kernel and bias
    are deterministic. See :mod:`tfbnn.layers.node_flow`.

    Args:
        filters: int > 0, output channels.
        kernel_size: int or tuple of 2 ints.
        strides: int or tuple. Default 1.
        padding: ``"valid"`` (default) or ``"same"``.
        data_format: ``"channels_last"`` (default) or ``"channels_first"``.
        dilation_rate: int or tuple. Default 1.
        **kwargs: ``activation``, ``use_bias``, ``kernel_initializer``,
            ``bias_initializer`` (as ``keras.layers.Conv2D``) and the arguments of
            :class:`NodeFlowLayer`.

    Input shape: ``(batch, rows, cols, C_in)`` (channels_first: ``(batch, C_in, rows, cols)``).
    Output shape: ``(batch, rows', cols', filters)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.NodeConv2DFlow(4, 3, padding="same", hidden_units=8, kl_weight=1e-3, seed=0)
        >>> layer(np.ones((2, 8, 8, 3), "float32")).shape
        TensorShape([2, 8, 8, 4])

    References:
        Louizos, Welling. Multiplicative Normalizing Flows for Variational Bayesian
        Neural Networks. ICML 2017.
    """

    rank = 2
