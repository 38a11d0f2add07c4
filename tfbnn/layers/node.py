"""Node-based implicit Bayesian layers (iBNN): a mixture posterior over input-node noise.

In an implicit Bayesian neural network (Trinh, Heinonen, Acerbi, Kaski 2022) the
weights ``U_l`` and biases ``b_l`` stay deterministic (point estimates) and every
layer multiplies its inputs by latent noise, one variable per input node (dense)
or per input channel (convolution)::

    f_l(x) = sigma( U_l (z_l o f_{l-1}(x)) + b_l ),      z_l in R^{d_l}

so the weights ``W_l = U_l diag(z_l)`` are implicitly random with only ``d_l``
latent variables per layer instead of ``d_l x d_{l+1}``.

Variational posterior (eq. 19), prior (eq. 21), per layer::

    q(z_l) = (1 / K) sum_k N(z_l | mu_k, diag sigma_k^2),   sigma_k = softplus(rho_k)
    p(z_l) = N(z_l | m_p, s^2 I)        node_prior=tfbnn.priors.Normal(m_p, s), default Normal(1, 0.1)

The prior is the ``node_prior`` argument, a :class:`tfbnn.priors.Normal` over each
entry of ``z`` (the layer's random variables are the node noise, as a Bayes-by-Backprop
layer's are its kernel, whose prior is ``kernel_prior``). The floats ``prior_mean``
and ``prior_stddev`` of tfbnn 0.2 are deprecated aliases of ``node_prior=Normal(prior_mean,
prior_stddev)``: they still work, with a ``DeprecationWarning``, and configs that hold
them still load.

KL (``kl_estimator="mixture_mean"``, the default; eqs. 22-24): the mixture is
replaced by the Gaussian of the mean of K independent component draws,
``q_hat = N(m, v)``, ``m = (1/K) sum_k mu_k``, ``v = (1/K^2) sum_k sigma_k^2``::

    KL(q || p) ~ KL(q_hat || p) = sum_j  log(s / sqrt(v_j)) + (v_j + (m_j - m_p)^2) / (2 s^2) - 1/2

Closed form and cheap, as in the authors' code. Note it pushes ``sum_k sigma_k^2``
towards ``K^2 s^2`` (each ``sigma_k`` towards ``sqrt(K) s``) and does not see how far
apart the component means are. ``kl_estimator="monte_carlo"`` instead estimates
the true KL of this layer's mixture, ``E_q[log q(z) - log p(z)]``, with
``num_kl_samples`` reparameterized draws from every component (stratified over
the components; unbiased; costs ``num_kl_samples * K^2 * d`` log-densities).

Initialisation (as the reference code, ``StoLayer.sto_init``): ``mu_k ~ N(init_mean,
init_stddev^2)`` and ``sigma_k ~ |N(init_scale_mean, init_scale_stddev^2)|``, stored as
``rho = log(expm1(sigma))``, the inverse softplus. The defaults are the reference code's
layer defaults: prior ``N(1, 0.1^2)``, means ``N(1, 0.5^2)``, scales ``|N(0.05, 0.02^2)|``.
Its CIFAR commands (README, VGG16 / ResNet18) use prior ``N(1, 0.3^2)`` / ``N(1, 0.4^2)``,
means ``N(1, 0.05^2)`` and scales ``|N(0.3, 0.02^2)|`` / ``|N(0.4, 0.02^2)|``: the initial
component scale equal to the prior's (the ``ibnn-cifar10-vgg16`` recipe).

Which mixture component a row uses (the rows of one call, leading axis):

=========================================  ============================================
situation                                  component of row r
=========================================  ============================================
training, ``model.fit`` (Algorithm 1)      example ``i = r`` uses ``i mod K``
training with S samples per example        the batch is tiled sample-major to
(:class:`tfbnn.ibnn.IBNNModel`)            ``(S * B, ...)``; row ``s * B + i`` uses
                                           ``i mod K`` (all S draws of an example
                                           come from its component)
Monte Carlo prediction                     rows ``t * B .. t * B + B - 1`` are sample
(:func:`tfbnn.weight_samples`, T blocks)   ``t``, which uses component ``t mod K``; with
                                           ``T = K * n`` every component gives ``n``
                                           samples of every example
a plain inference call (``predict``)       ``i mod K``, one draw per example
``inference_mode="mean"``                  no noise: ``z = E_q[z] = (1/K) sum_k mu_k``
=========================================  ============================================

Each row draws its own ``eps``; with ``weight_samples(model, T, joint=True)`` the
rows of a sample block share one ``z`` (a coherent function draw). The
pre-activation is linear in ``z``, so ``"mean"`` mode is the network at the
posterior mean of the noise (the analogue of Bayes-by-Backprop's ``W = mu``).

The KL is added to ``layer.losses`` as ``kl_weight * KL`` (the ELBO convention of
:mod:`tfbnn.callbacks`; ``kl_weight = beta / N``). The variational parameters are
the weights named ``node_loc`` and ``node_rho``: :func:`tfbnn.ibnn.node_optimizer`
gives them their own (large, constant) learning rate.

Reference:
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022 (eqs. 19-24, Algorithm 1). The implicit
    BNN model first appeared in their "Scalable Bayesian neural networks by
    layer-wise input augmentation" (arXiv, 2020).
"""

import math
import warnings

import keras
import tensorflow as tf

from tfbnn import priors as priors_lib
from tfbnn._internal import checks
from tfbnn.layers.arguments import ConvArguments, DenseArguments
from tfbnn.layers.base import (FLOAT_PRIOR_ARGUMENTS, BayesianLayer, FloatPriorAttributes, KernelArguments,
                               multiplicative_prior)

__all__ = [
    "NodeDense",
    "NodeConv1D",
    "NodeConv2D",
    "NodeNoise",
    "KL_ESTIMATORS",
    "VARIATIONAL_WEIGHT_NAMES",
]

#: Values of ``kl_estimator``.
KL_ESTIMATORS = ("mixture_mean", "monte_carlo")
#: Names of the variational weights of every node layer (``(K, d)`` each).
VARIATIONAL_WEIGHT_NAMES = ("node_loc", "node_rho")
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# The smallest initial sigma (|N(0.05, 0.02^2)| can come out at ~0; log(expm1(0)) = -inf).
_MIN_INIT_SCALE = 1e-6


# -- argument checks ------------------------------------------------------------


def _check_int(name, value, minimum):
    return checks.integer(name, value, minimum, what=f"an integer >= {minimum}")


def _check_float(name, value, positive):
    return checks.number(name, value, low=0, low_open=positive)


def _check_finite(name, value):
    return checks.number(name, value)


class _InverseSoftplusAbsNormal(keras.initializers.Initializer):
    """``rho = log(expm1(|N(mean, stddev^2)|))``, so that ``softplus(rho) = |N(mean, stddev^2)|``."""

    def __init__(self, mean, stddev, seed=None):
        self.mean, self.stddev, self.seed = mean, stddev, seed

    def __call__(self, shape, dtype=None):
        draw = keras.initializers.RandomNormal(self.mean, self.stddev, seed=self.seed)(shape, dtype=dtype)
        scale = tf.maximum(tf.abs(draw), _MIN_INIT_SCALE)
        return tf.math.log(tf.math.expm1(scale))

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


# -- the shared node-noise machinery ------------------------------------------------


class NodeLayer(FloatPriorAttributes, BayesianLayer):
    """Mixture posterior over per-node multiplicative noise; see the module docstring.

    Args:
        num_components: int >= 1, ``K``, mixture components (eq. 19). Default 4.
        node_prior: the prior ``p(z) = N(m_p, s^2)`` of each noise entry (eq. 21): a
            :class:`tfbnn.priors.Normal` (or its name or serialized dict). Default None:
            ``Normal(1.0, 0.1)`` (the noise leaves the node as it is on average).
        init_mean: finite float: component means start around it. Default 1.
        init_stddev: float >= 0, ``sigma0``, the spread of the initial component
            means, ``mu_k ~ N(init_mean, sigma0^2)``. Default 0.5 (the reference
            code's layer default; it makes the components differ from the start).
            0 starts every mean at ``init_mean``.
        init_scale_mean, init_scale_stddev: floats, ``> 0`` and ``>= 0``: the initial
            component scales, ``sigma_k ~ |N(init_scale_mean, init_scale_stddev^2)|``.
            Default 0.05 and 0.02 (the reference code's layer default); 0 for
            ``init_scale_stddev`` starts every ``sigma_k`` at ``init_scale_mean``.
        kl_estimator: ``"mixture_mean"`` (default, eqs. 22-24, closed form) or
            ``"monte_carlo"`` (an unbiased estimate of this layer's mixture KL).
        num_kl_samples: int >= 1, draws per component of the Monte Carlo KL. Default 1.
        kl_weight, inference_mode, seed: see :class:`tfbnn.layers.BayesianLayer`.
            ``seed`` also seeds the initial ``mu_k`` and ``sigma_k``.

    Deprecated in tfbnn 0.3: the floats ``prior_mean`` and ``prior_stddev`` (defaults 1
    and 0.1) are ``node_prior=tfbnn.priors.Normal(prior_mean, prior_stddev)``. They still
    construct, each with a ``DeprecationWarning`` naming ``node_prior``; together with
    ``node_prior`` they are a ``ValueError``; configs that hold them load silently. The
    attributes ``prior_mean`` and ``prior_stddev`` stay, read-only.
    """

    folded_arguments = {"node_prior": FLOAT_PRIOR_ARGUMENTS}
    prior_argument = "node_prior"

    def __init__(
        self,
        num_components=4,
        node_prior=None,
        init_stddev=0.5,
        init_scale_mean=0.05,
        init_scale_stddev=0.02,
        kl_estimator="mixture_mean",
        num_kl_samples=1,
        kl_weight=None,
        inference_mode="sample",
        seed=None,
        init_mean=1.0,
        **kwargs,
    ):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        self.num_components = _check_int("num_components", num_components, 1)
        self.node_prior = multiplicative_prior(node_prior, "node_prior")
        self.init_mean = _check_finite("init_mean", init_mean)
        self.init_stddev = _check_float("init_stddev", init_stddev, positive=False)
        self.init_scale_mean = _check_float("init_scale_mean", init_scale_mean, positive=True)
        self.init_scale_stddev = _check_float("init_scale_stddev", init_scale_stddev, positive=False)
        if kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"Expected `kl_estimator` in {KL_ESTIMATORS}. Received: kl_estimator={kl_estimator!r}")
        self.kl_estimator = kl_estimator
        self.num_kl_samples = _check_int("num_kl_samples", num_kl_samples, 1)
        # Samples per example in training: set by tfbnn.ibnn.IBNNModel while it traces
        # its train step on a batch tiled sample-major to (S * B, ...).
        self._train_samples = 1

    # -- weights -----------------------------------------------------------------
    def _init_seed(self, offset):
        return None if self.seed is None else self.seed * 2 + offset

    def _build_node_weights(self, num_nodes):
        # Float32 under a mixed policy too (BayesianLayer.add_weight never autocasts).
        self.num_nodes = int(num_nodes)
        shape = (self.num_components, self.num_nodes)
        if self.init_stddev == 0:
            loc_init = keras.initializers.Constant(self.init_mean)
        else:
            loc_init = keras.initializers.RandomNormal(self.init_mean, self.init_stddev, seed=self._init_seed(0))
        self.node_loc = self.add_weight(name="node_loc", shape=shape, initializer=loc_init)
        self.node_rho = self.add_weight(
            name="node_rho",
            shape=shape,
            initializer=_InverseSoftplusAbsNormal(self.init_scale_mean, self.init_scale_stddev, self._init_seed(1)),
        )
        self._build_kl_weight()

    def node_scale(self):
        """``sigma_k = softplus(rho_k)``, shape ``(K, d)``."""
        return tf.nn.softplus(self.node_rho)

    def node_mean(self):
        """The mixture mean ``E_q[z] = (1/K) sum_k mu_k``, shape ``(d,)``."""
        return tf.reduce_mean(self.node_loc, axis=0)

    def set_train_samples(self, num_samples=1):
        """Sets ``S``, the noise samples per example in training; returns the previous ``S``.

        With ``S > 1`` a training call's rows are the batch tiled ``S`` times,
        sample-major (``(S * B, ...)``), and row ``s * B + i`` uses the component of
        example ``i`` (see the module table). :class:`tfbnn.ibnn.IBNNModel` sets it on
        every node layer while it traces its train step; set it back after use.

        Example:
            >>> import tfbnn
            >>> layer = tfbnn.layers.NodeNoise(num_components=2)
            >>> layer.set_train_samples(3), layer.train_samples
            (1, 3)
        """
        previous, self._train_samples = self._train_samples, checks.integer("num_samples", num_samples, 1)
        return previous

    @property
    def train_samples(self):
        """``S``, the noise samples per example in training (1 outside :class:`tfbnn.ibnn.IBNNModel`)."""
        return self._train_samples

    # -- which component each row uses ---------------------------------------------
    def component_index(self, num_rows):
        """The component each of ``num_rows`` rows uses now (int32 ``(num_rows,)``; see the module table).

        For inspection: :meth:`call` gets the same assignment by broadcasting the ``(K, d)``
        parameters against noise drawn in a ``(..., groups, K, ...)`` layout.
        """
        rows = tf.range(num_rows)
        if self._mc_prediction:
            return (rows // (num_rows // self._weight_samples)) % self.num_components
        return (rows % (num_rows // self._train_samples)) % self.num_components

    def _check_sample_blocks(self, blocks):
        if blocks % self.num_components:
            warnings.warn(
                f"Layer '{self.name}': {blocks} Monte Carlo samples do not cover its "
                f"{self.num_components} mixture components equally; use a multiple of K, "
                "e.g. tfbnn.ibnn.ibnn_num_samples(model, n).",
                stacklevel=3,
            )

    # -- the noise -------------------------------------------------------------------
    def _standard_normal(self, leading, dtype):
        """``N(0, 1)`` noise of shape ``(*leading, d)`` from the layer's seed stream.

        Box-Muller on philox uniforms, the two outputs of each pair side by side:
        exact Gaussian draws (up to ``|eps| < 5.7``, the float32 resolution of ``u``) at about two
        thirds of the cost of ``stateless_normal`` on CPU, where drawing one value per
        example and node is most of what this layer adds to a Dense layer.
        """
        d = self.num_nodes
        if self._portable_noise is not None:
            # A TFLite / ONNX export being traced: its RandomStandardNormal op (ONNX has no Log1p).
            return self._normal(tf.stack([*leading, d]), dtype)
        half = (d + 1) // 2
        u = self._uniform(tf.stack([2, *leading, half]), dtype)
        radius = tf.sqrt(-2.0 * tf.math.log1p(-u[0]))  # 1 - u in (0, 1]
        angle = (2.0 * math.pi) * u[1]
        eps = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=-1)
        return eps if 2 * half == d else eps[..., :d]

    def _noise(self, inputs, training, axis):
        """``z`` shaped to broadcast against ``inputs`` along ``axis``.

        The component pattern is periodic in the rows, so ``eps`` is drawn as
        ``(..., groups, K, ...)`` and the ``(K, d)`` parameters broadcast against it;
        no gather (a gather and its scatter-add gradient cost about as much as the
        layer's matmul) and no per-row copies of the parameters.
        """
        rank = inputs.shape.rank
        shape = [1] * rank
        shape[axis % rank] = self.num_nodes
        if not self._sampling(training):
            return tf.cast(tf.reshape(self.node_mean(), shape), inputs.dtype)
        shape[0] = -1
        k, d = self.num_components, self.num_nodes
        num_rows = tf.shape(inputs)[0]
        loc, scale = self.node_loc, self.node_scale()
        if self._mc_prediction:
            # T sample blocks of B rows; block t uses component t mod K.
            blocks = self._weight_samples
            self._check_sample_blocks(blocks)
            tiled = tf.debugging.assert_equal(
                num_rows % blocks, 0,
                message=f"Layer '{self.name}': inside weight_samples(model, {blocks}) the batch must be tiled "
                "to (T * B, ...) rows",
            )
            with tf.control_dependencies([tiled] if tiled is not None else []):  # before any reshape can fail
                num_rows = tf.identity(num_rows)
            per_block = num_rows // blocks
            groups = -(-blocks // k)
            noise_rows = 1 if self._joint_samples else per_block  # joint: one z per block
            eps = self._standard_normal([groups, k, noise_rows], loc.dtype)
            z = loc[None, :, None, :] + scale[None, :, None, :] * eps
            z = tf.reshape(z, tf.stack([groups * k, noise_rows, d]))[:blocks]
            if self._joint_samples:
                z = tf.broadcast_to(z, tf.stack([blocks, per_block, d]))
        else:
            # S copies of a batch of B examples (S = 1 outside IBNNModel); example i uses i mod K.
            copies = self._train_samples
            per_copy = num_rows // copies
            groups = (per_copy + k - 1) // k
            eps = self._standard_normal([copies, groups, k], loc.dtype)
            z = tf.reshape(loc + scale * eps, tf.stack([copies, groups * k, d]))[:, :per_copy]
        return tf.cast(tf.reshape(z, shape), inputs.dtype)

    # -- KL ------------------------------------------------------------------------------
    def kl_divergence(self):
        """``KL(q || p)`` of this layer's noise, summed over nodes, unscaled.

        ``"mixture_mean"``: ``KL(q_hat || p)`` in closed form (eqs. 22-24).
        ``"monte_carlo"``: a fresh stratified estimate of the mixture KL.
        """
        if self.kl_estimator == "monte_carlo":
            return self._monte_carlo_kl()
        k = float(self.num_components)
        s = self.prior_stddev
        mean = self.node_mean()
        variance = tf.reduce_sum(tf.square(self.node_scale()), axis=0) / (k * k)
        return tf.reduce_sum(
            math.log(s) - 0.5 * tf.math.log(variance) + (variance + tf.square(mean - self.prior_mean)) / (2 * s * s)
            - 0.5
        )

    def _monte_carlo_kl(self):
        loc, scale = self.node_loc, self.node_scale()
        k, m = self.num_components, self.num_kl_samples
        eps = self._normal(tf.stack([m, k, self.num_nodes]), loc.dtype)
        z = loc + scale * eps  # (M, K, d): M draws from every component
        # log q(z) = logsumexp_j log N(z | mu_j, sigma_j^2) - log K, densities over the whole vector.
        centred = (z[:, :, None, :] - loc[None, None]) / scale[None, None]  # (M, K, K_j, d)
        log_components = tf.reduce_sum(-0.5 * tf.square(centred) - tf.math.log(scale)[None, None], axis=-1)
        log_q = tf.reduce_logsumexp(log_components, axis=-1) - math.log(k) - self.num_nodes * _HALF_LOG_2PI
        s = self.prior_stddev
        log_p = tf.reduce_sum(-0.5 * tf.square((z - self.prior_mean) / s), axis=-1) - self.num_nodes * (
            math.log(s) + _HALF_LOG_2PI
        )
        return tf.reduce_mean(log_q - log_p)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_components": self.num_components,
                "node_prior": priors_lib.serialize(self.node_prior),
                "init_mean": self.init_mean,
                "init_stddev": self.init_stddev,
                "init_scale_mean": self.init_scale_mean,
                "init_scale_stddev": self.init_scale_stddev,
                "kl_estimator": self.kl_estimator,
                "num_kl_samples": self.num_kl_samples,
            }
        )
        return config


def _known_dim(layer, input_shape, axis, what):
    dim = input_shape[axis]
    if dim is None:
        raise ValueError(
            f"The {what} dimension of the inputs of '{layer.name}' must be known. "
            f"Received: input_shape={tuple(input_shape)}"
        )
    return int(dim)


# -- the layers --------------------------------------------------------------------------


class NodeKernelLayer(KernelArguments, NodeLayer):
    """A layer with a deterministic kernel ``U`` and bias ``b`` whose inputs carry node noise.

    ``activation(f(z o x, U) + b)`` with the shape family's operation ``f`` (a matmul,
    a convolution), one ``z`` entry per input feature or channel. The base of
    :class:`NodeDense` and the node convolutions, with a shape family
    (:class:`tfbnn.layers.DenseArguments`, :class:`tfbnn.layers.ConvArguments`)
    listed first.

    Args:
        activation: activation name or callable.
        use_bias: bool. Default True.
        kernel_initializer, bias_initializer: Keras initializers of ``U`` and ``b``.
        **kwargs: the arguments of :class:`NodeLayer`.
    """

    def __init__(self, activation=None, use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 **kwargs):
        super().__init__(**kwargs)
        self.init_kernel_arguments(activation, use_bias, kernel_initializer, bias_initializer)

    def build_posterior(self, kernel_shape, bias_shape):
        """Makes ``kernel``, ``bias`` (with ``use_bias``) and the node noise of the kernel's input axis."""
        self.kernel = self.add_weight(name="kernel", shape=kernel_shape, initializer=self.kernel_initializer)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=bias_shape, initializer=self.bias_initializer)
        self._build_node_weights(kernel_shape[-2])

    def call(self, inputs, training=None):
        outputs = self.forward(inputs * self._noise(inputs, training, self.channel_axis), self.kernel)
        return self._finish(outputs, self.bias, training)

    def get_config(self):
        config = super().get_config()
        config.update(self.kernel_config())
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class NodeDense(DenseArguments, NodeKernelLayer):
    """Dense layer with iBNN node noise: ``activation((z o x) U + b)``, ``z ~ q(z)``.

    ``U`` (``kernel``, ``(d, units)``) and ``b`` (``bias``) are deterministic; ``z``
    has one entry per input node, drawn per example from the K-component mixture
    posterior (eq. 19) and shared across any middle axes of the input. See
    :mod:`tfbnn.layers.node` for the posterior, prior, KL and which component a
    row uses.

    Args:
        units: int > 0, output dimension.
        *args: ``activation`` (name or callable), ``use_bias`` (default True),
            ``kernel_initializer`` and ``bias_initializer`` (of ``U`` and ``b``), in this
            order after ``units`` (:class:`NodeKernelLayer`).
        **kwargs: those four by name, and the arguments of :class:`NodeLayer` (``num_components``,
            ``node_prior``, ``init_mean``, ``init_stddev``,
            ``init_scale_mean``, ``init_scale_stddev``, ``kl_estimator``, ``num_kl_samples``,
            ``kl_weight``, ``inference_mode``, ``seed``; K = 4, prior N(1, 0.1^2), means
            from N(1, 0.5^2), scales from |N(0.05, 0.02^2)|).

    Call arguments:
        inputs: tensor ``(batch, ..., d)``.
        training: bool; the layer samples in training and, in ``"sample"``
            inference mode, at inference too.

    Input shape: ``(batch, ..., d)``, rank >= 2. Output shape: ``(batch, ..., units)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((4,)),
        ...     tfbnn.layers.NodeDense(8, activation="relu", num_components=2, seed=1),
        ...     tfbnn.layers.NodeDense(3, activation="softmax", num_components=2, seed=2),
        ... ])
        >>> model(np.zeros((5, 4), "float32")).shape
        TensorShape([5, 3])
        >>> wide = tfbnn.layers.NodeDense(3, node_prior=tfbnn.priors.Normal(1.0, 0.3))  # p(z) = N(1, 0.3^2)
        >>> wide.prior_mean, wide.prior_stddev
        (1.0, 0.3)

    Reference:
        Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
        Bayesian Neural Networks. ICML 2022 (eqs. 19-24).
    """


_CONV_DOC = """{rank}-D convolution with iBNN node noise per input channel: ``activation(conv(z o x, U) + b)``.

    ``z`` has one entry per input channel (``(K, C_in)`` variational parameters),
    drawn per example and shared over all spatial positions; the kernel ``U``
    (``kernel_size + (C_in, filters)``, the layout of ``keras.layers.Conv{rank}D``) and the
    bias are deterministic. Posterior, prior, KL and component assignment: see
    :mod:`tfbnn.layers.node`.

    Args:
        filters: int > 0, output channels.
        kernel_size: int or tuple of {rank} ints.
        strides: int or tuple. Default 1.
        padding: ``"valid"`` (default) or ``"same"``.
        data_format: ``"channels_last"`` (default) or ``"channels_first"``.
        dilation_rate: int or tuple. Default 1.
        activation, use_bias, kernel_initializer, bias_initializer: as in
            ``keras.layers.Conv{rank}D``.
        **kwargs: the arguments of :class:`NodeLayer` (``num_components``,
            ``node_prior``, ``init_stddev``, ...).

    Input shape: ``(batch, {spatial}, C_in)`` (channels_first: ``(batch, C_in, {spatial})``).
    Output shape: ``(batch, {spatial}, filters)`` (channels_first: ``(batch, filters, {spatial})``).

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.layers.NodeConv{rank}D(4, 3, padding="same", num_components=2, seed=1)
        >>> layer(np.zeros((2, {example}3), "float32")).shape
        TensorShape([2, {example}4])
        >>> tuple(layer.node_loc.shape)  # (K, C_in)
        (2, 3)

    Reference:
        Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
        Bayesian Neural Networks. ICML 2022.
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class NodeConv1D(ConvArguments, NodeKernelLayer):
    __doc__ = _CONV_DOC.format(rank=1, spatial="length", example="8, ")
    rank = 1


@keras.saving.register_keras_serializable(package="tfbnn")
class NodeConv2D(ConvArguments, NodeKernelLayer):
    __doc__ = _CONV_DOC.format(rank=2, spatial="rows, cols", example="8, 8, ")
    rank = 2


@keras.saving.register_keras_serializable(package="tfbnn")
class NodeNoise(NodeLayer):
    """The iBNN node noise alone: ``z o x`` with one ``z`` entry per channel of ``axis``.

    Put it in front of any layer (``keras.layers.Dense``, ``Conv2D``, ...) to make
    that layer's inputs noisy exactly as :class:`NodeDense` / :class:`NodeConv2D`
    do; :func:`tfbnn.ibnn.add_node_noise` inserts one before every Dense / Conv2D
    of a trained model (the pretrained start). ``NodeNoise() + Dense`` computes the
    same function as :class:`NodeDense` with the same weights.

    Args:
        axis: int, the channel axis carrying the nodes (default -1; 1 for
            channels_first convolutions). Not the batch axis.
        **kwargs: the arguments of :class:`NodeLayer` (``num_components``,
            ``node_prior``, ``init_stddev``, ...).

    Input shape: any, rank >= 2, with a known ``axis`` dimension ``d``.
    Output shape: the input shape.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((6, 6, 3)),
        ...                           tfbnn.layers.NodeNoise(num_components=2, seed=0),
        ...                           keras.layers.Conv2D(4, 3)])
        >>> model(np.ones((2, 6, 6, 3), "float32")).shape
        TensorShape([2, 4, 4, 4])
    """

    def __init__(self, axis=-1, **kwargs):
        super().__init__(**kwargs)
        if not checks.is_integer(axis) or axis == 0:
            raise ValueError(f"Expected `axis` to be a non-zero integer (not the batch axis). Received: axis={axis!r}")
        self.axis = int(axis)

    def build(self, input_shape):
        rank = len(input_shape)
        if rank < 2 or not -rank <= self.axis < rank or self.axis % rank == 0:
            raise ValueError(
                f"Layer '{self.name}' expects inputs of rank >= 2 with a channel axis {self.axis} "
                f"that is not the batch axis. Received: input_shape={tuple(input_shape)}"
            )
        dim = _known_dim(self, input_shape, self.axis, f"axis-{self.axis}")
        self._build_node_weights(dim)
        self.input_spec = keras.layers.InputSpec(ndim=rank, axes={self.axis: dim})

    def call(self, inputs, training=None):
        outputs = inputs * self._noise(inputs, training, self.axis)
        if self._adds_kl:
            self._add_kl_loss(self.kl_divergence(), training)
        return outputs

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config["axis"] = self.axis
        return config
