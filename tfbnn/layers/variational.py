"""A dense layer whose posterior and prior are any TFP distributions over its weights.

:class:`DenseVariational` is TFP's ``tfp.layers.DenseVariational`` as a Keras 3
layer: the same ``make_posterior_fn`` / ``make_prior_fn`` contract, with the
builders returning a :class:`tfbnn.posteriors.WeightDistribution` (a Keras 3 layer)
instead of a ``tf_keras`` model, and tfbnn's ELBO convention, sampling switch and
Monte Carlo protocol (see :class:`tfbnn.layers.BayesianLayer`).
"""

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn import posteriors
from tfbnn import priors as priors_lib
from tfbnn._internal import checks
from tfbnn.layers.base import BayesianLayer, input_features

tfd = tfp.distributions

__all__ = ["DenseVariational"]


def _prior_builder(make_prior_fn):
    """``make_prior_fn``, a prior object made a builder: a :class:`tfbnn.priors.Normal` the builder of
    ``N(loc, scale^2 I)`` (closed-form KL), another fixed prior :class:`tfbnn.posteriors.IndependentPrior`."""
    if not isinstance(make_prior_fn, priors_lib.Prior):
        return make_prior_fn
    if type(make_prior_fn) is priors_lib.Normal:
        return posteriors.NormalPrior(scale=make_prior_fn.scale, loc=make_prior_fn.loc)
    return posteriors.IndependentPrior(posteriors.scalar_prior(make_prior_fn, "make_prior_fn"))


def exact_kl(posterior, prior):
    """``tfd.kl_divergence(posterior, prior)``, or None where TFP registers no KL for the pair."""
    try:
        return tfd.kl_divergence(posterior, prior)
    except NotImplementedError:
        return None


@keras.saving.register_keras_serializable(package="tfbnn")
class DenseVariational(BayesianLayer):
    """Dense layer with a posterior and a prior given as TFP distributions over its weights.

    The kernel ``W`` (``[d, units]``) and the bias ``b`` are one flattened vector
    ``w = [vec(W); b]`` of ``n = d * units + units`` weights (row-major kernel,
    then the bias), with a posterior ``q(w)`` and a prior ``p(w)`` that are TFP
    distributions of event shape ``[n]`` made by two builders::

        make_posterior_fn(kernel_size, bias_size, dtype) -> WeightDistribution  # q, trained
        make_prior_fn(kernel_size, bias_size, dtype) -> WeightDistribution      # p, fixed or trained

    (``kernel_size = d * units``, ``bias_size = units`` or 0 without a bias).
    A call draws ``w ~ q`` (reparameterized, shared by the batch, as Blundell et
    al. 2015 and TFP do) and returns ``activation(x W + b)``; in ``"mean"`` mode at
    inference it uses ``w = E_q[w]`` (``q.mean()``; for a posterior whose mean has no
    closed form, its :meth:`tfbnn.posteriors.WeightDistribution.mean_weights`). The layer trains by the ELBO
    (Blundell et al. 2015, eq. 1-2), per example in tfbnn's convention::

        loss = mean_batch NLL(y | x, w)  +  kl_weight * KL(q || p),   kl_weight = beta / N

    with ``KL(q || p) = E_q[log q(w) - log p(w)]``: in closed form,
    ``tfd.kl_divergence(q, p)``, where TFP registers it (all pairs of
    :mod:`tfbnn.posteriors`' builders), else the one-sample Monte Carlo estimate
    ``log q(w) - log p(w)`` at the call's weight sample (Blundell et al. 2015,
    eq. 2; averaged over the samples with T > 1). ``kl_weight * KL`` is added to
    ``layer.losses``; :class:`tfbnn.KLAnnealing` and :func:`tfbnn.set_kl_weight`
    set ``kl_weight`` as for every Bayesian layer.

    Posterior families (:mod:`tfbnn.posteriors`): ``"mean_field"`` (diagonal
    Gaussian), ``"low_rank"`` (``Sigma = L L^T + diag(d^2)``, Tomczak et al.
    2020), ``"full_covariance"`` (``MultivariateNormalTriL``, small layers only:
    ``O(n^2)`` parameters), ``"flow"`` (a mean-field Gaussian through RealNVP
    coupling bijectors, ``tfd.TransformedDistribution``; Monte Carlo KL); priors ``"normal"`` (fixed ``N(0, I)``) and
    ``"trainable_normal"`` (trained mean, TFP's ``prior_trainable``); or your own.

    Monte Carlo prediction (:func:`tfbnn.predict`, :func:`tfbnn.utils.weight_samples`
    with T samples, the batch tiled ``T * B`` sample-major): the layer draws T
    weight samples and applies sample ``t`` to the ``t``-th block of B rows with
    one batched matmul. Per row (``joint=False``) it does the same: the rows of
    a block share this layer's sample (a general ``q`` has no cheap per-row
    sampling such as local reparameterization), which leaves each example's
    predictive distribution, and so every per-example summary, unchanged; only
    examples of one block are correlated through this layer. Each call draws
    ``T`` weight-sized samples.

    **Porting from TFP.** ``tfp.layers.VariableLayer`` and ``DistributionLambda``
    are ``tf_keras`` layers, which a Keras 3 model rejects: build a
    :class:`tfbnn.posteriors.VariableDistribution` (the same vector ``t`` and the
    same distribution function) and register the builder so that a saved model
    finds it. Before (TFP, ``tf_keras``)::

        def posterior_mean_field(kernel_size, bias_size=0, dtype=None):
            n = kernel_size + bias_size
            c = np.log(np.expm1(1.0))
            return tf_keras.Sequential([
                tfp.layers.VariableLayer(2 * n, dtype=dtype),
                tfp.layers.DistributionLambda(lambda t: tfd.Independent(
                    tfd.Normal(loc=t[..., :n], scale=1e-5 + tf.nn.softplus(c + t[..., n:])),
                    reinterpreted_batch_ndims=1)),
            ])

        layer = tfp.layers.DenseVariational(8, posterior_mean_field, prior_trainable, kl_weight=1 / N)

    After (tfbnn, Keras 3)::

        @keras.saving.register_keras_serializable(package="my_project")
        def posterior_mean_field(kernel_size, bias_size, dtype):
            n = kernel_size + bias_size
            c = np.log(np.expm1(1.0))
            return tfbnn.posteriors.VariableDistribution(2 * n, lambda t: tfd.Independent(
                tfd.Normal(loc=t[..., :n], scale=1e-5 + tf.nn.softplus(c + t[..., n:])),
                reinterpreted_batch_ndims=1), dtype=dtype)

        layer = tfbnn.layers.DenseVariational(8, posterior_mean_field, "trainable_normal", kl_weight=1 / N)

    ``kl_weight`` means what it means in TFP (the KL's factor, ``1 / N`` for the
    ELBO); TFP's ``kl_use_exact`` defaults to False, here to True. The priors of
    :mod:`tfbnn.posteriors` are ``MultivariateNormalDiag``: against a posterior
    written as ``Independent(Normal)`` TFP has no closed-form KL, so the layer uses
    the Monte Carlo one; write the posterior as ``tfd.MultivariateNormalDiag(loc,
    scale_diag)`` (same distribution) or port the prior as an ``Independent(Normal)``
    too for the exact KL.

    **Where the posterior starts** (unlike TFP). TFP's tutorial builders start every
    weight at mean 0 with scale ``softplus(0) = 0.693`` (a zero-initialized
    ``VariableLayer``; 1.0 with their shift ``log(expm1(1))``). The ready-made posteriors
    here start at a random mean (``loc_initializer="random_normal"``, std 0.05) with
    scale ``init_scale=0.01``, as Bayes-by-Backprop layers do. For TFP's start pass the
    builder with TFP's values:
    ``tfbnn.posteriors.MeanFieldNormal(init_scale=math.log(2.0), loc_initializer="zeros")``.

    Args:
        units: int > 0, output dimension.
        make_posterior_fn: the posterior's builder, called as
            ``make_posterior_fn(kernel_size, bias_size, dtype)`` in ``build``: a
            name (``"mean_field"``, ``"low_rank"``, ``"full_covariance"``, ``"flow"``), a builder
            of :mod:`tfbnn.posteriors` (``MeanFieldNormal(init_scale=0.05)``), or a
            function returning a :class:`tfbnn.posteriors.WeightDistribution` (register
            it with ``keras.saving.register_keras_serializable`` to save the layer).
            Default ``"mean_field"``.
        make_prior_fn: the prior's builder, as ``make_posterior_fn`` (names
            ``"normal"``, ``"trainable_normal"``), or a prior object as the other layers
            take it (their ``kernel_prior``), on every weight: a :class:`tfbnn.priors.Normal`
            ``(loc, scale)`` is the fixed prior ``N(loc, scale^2 I)``, the builder
            :class:`tfbnn.posteriors.NormalPrior` ``(scale, loc)`` (which ``get_config`` holds;
            closed-form KL); another fixed prior (``tfbnn.priors.ScaleMixture()``) is
            :class:`tfbnn.posteriors.IndependentPrior` (Monte Carlo KL).
            Default ``"normal"`` (``Normal(0, 1)``).
        kl_weight: float >= 0 or None, ``beta / N``; see :class:`BayesianLayer`.
        activation: activation name or callable. Default None (linear).
        use_bias: bool. Default True.
        kl_use_exact: bool. True (default): the closed-form KL where TFP registers
            one for the pair, the Monte Carlo estimate otherwise. False: always
            the Monte Carlo estimate.
        inference_mode: ``"sample"`` (default) or ``"mean"`` (``q.mean()`` at inference).
        seed: int or None, seed of the weight samples.

    Call arguments:
        inputs: ``(batch, ..., input_dim)``.
        training: bool or None.

    Input shape: ``(batch, ..., input_dim)``, rank >= 2.
    Output shape: ``(batch, ..., units)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.linspace(-1, 1, 32, dtype="float32")[:, None]
        >>> model = keras.Sequential([
        ...     keras.Input((1,)),
        ...     keras.layers.Dense(8, activation="tanh"),
        ...     tfbnn.layers.DenseVariational(1, tfbnn.posteriors.FullCovarianceNormal(), "normal",
        ...                                   kl_weight=1 / len(x), seed=0),
        ... ])
        >>> model.compile("adam", "mse")
        >>> history = model.fit(x, 2 * x, epochs=2, verbose=0)
        >>> layer = model.layers[-1]
        >>> layer.posterior.distribution().event_shape   # 8 * 1 kernel weights + 1 bias
        TensorShape([9])
        >>> res = tfbnn.predict(model, x[:4], num_samples=20)
        >>> res.mean.shape, bool(np.all(res.epistemic_std > 0))
        ((4, 1), True)
        >>> tfbnn.layers.DenseVariational(1, make_prior_fn=tfbnn.priors.Normal(0.0, 0.5)).make_prior_fn
        NormalPrior(scale=0.5, loc=0.0)

    References:
        Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
        Networks. ICML 2015.
        TensorFlow Probability, ``tfp.layers.DenseVariational``
        (``tensorflow_probability/python/layers/dense_variational_v2.py``).
        Tomczak, Swaroop, Turner. Efficient Low Rank Gaussian Variational Inference
        for Neural Networks. NeurIPS 2020.
    """

    def __init__(
        self,
        units,
        make_posterior_fn="mean_field",
        make_prior_fn="normal",
        kl_weight=None,
        activation=None,
        use_bias=True,
        kl_use_exact=True,
        inference_mode="sample",
        seed=None,
        **kwargs,
    ):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        self.units = checks.integer("units", units, 1)
        self.make_posterior_fn = posteriors.get(make_posterior_fn, "make_posterior_fn")
        self.make_prior_fn = posteriors.get(_prior_builder(make_prior_fn), "make_prior_fn")
        self.activation = checks.activation(activation)
        self.use_bias = bool(use_bias)
        if not isinstance(kl_use_exact, bool):
            raise ValueError(f"Expected `kl_use_exact` to be a bool. Received: kl_use_exact={kl_use_exact!r}")
        self.kl_use_exact = kl_use_exact

    def build(self, input_shape):
        input_dim = input_features(self, input_shape)
        self._kernel_shape = (input_dim, self.units)
        self._kernel_size = input_dim * self.units
        bias_size = self.units if self.use_bias else 0
        self.posterior = self._weight_distribution("make_posterior_fn", self.make_posterior_fn, bias_size)
        self.prior = self._weight_distribution("make_prior_fn", self.make_prior_fn, bias_size)
        self._build_kl_weight()
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})

    def _weight_distribution(self, name, make, bias_size):
        """``make(kernel_size, bias_size, dtype)``, built, with its distribution's shapes checked."""
        made = make(self._kernel_size, bias_size, self.variable_dtype)
        received = f"{name}={make!r} returning {made!r} for kernel_size={self._kernel_size}, bias_size={bias_size}"
        if not isinstance(made, posteriors.WeightDistribution):
            raise ValueError(
                f"Expected `{name}` to return a tfbnn.posteriors.WeightDistribution (a Keras 3 layer holding its "
                "variables; tfp.layers' tf_keras models cannot be used in Keras 3: port one with "
                f"tfbnn.posteriors.VariableDistribution, see DenseVariational). Received: {received}"
            )
        if not made.built:
            made.build(None)
        distribution = made.distribution()
        event = self._kernel_size + bias_size
        if not isinstance(distribution, tfd.Distribution) or distribution.event_shape != [event] or (
                distribution.batch_shape != []):
            shapes = (f"event_shape={distribution.event_shape}, batch_shape={distribution.batch_shape}"
                      if isinstance(distribution, tfd.Distribution) else f"a {type(distribution).__name__}")
            raise ValueError(
                f"Expected `{name}`'s distribution() to be a TFP distribution of event shape [{event}] "
                f"(kernel_size + bias_size) and batch shape []. Received: {received}, with {shapes}"
            )
        return made

    def _sample_seed(self):
        # TFP's stateless samplers take an int32 seed pair.
        return tf.cast(self._next_seed(), tf.int32)

    def unflatten(self, weights):
        """``(kernel, bias)`` from flattened weights ``[..., n]``.

        Args:
            weights: a tensor ``[..., n]``, e.g. a posterior sample.

        Returns:
            ``kernel`` ``[..., input_dim, units]`` and ``bias`` ``[..., units]``
            (None without a bias).
        """
        lead = list(weights.shape[:-1])
        kernel = tf.reshape(weights[..., : self._kernel_size], lead + list(self._kernel_shape))
        return kernel, (weights[..., self._kernel_size:] if self.use_bias else None)

    def _apply(self, inputs, weights):
        """``x W + b``; weights ``[T, n]`` apply sample ``t`` to the ``t``-th block of rows."""
        kernel, bias = self.unflatten(tf.cast(weights, inputs.dtype))
        if weights.shape.rank == 1:
            outputs = keras.ops.matmul(inputs, kernel)
            return outputs if bias is None else outputs + bias
        shape = tf.shape(inputs)
        blocks = tf.reshape(inputs, tf.stack([weights.shape[0], -1, shape[-1]]))
        outputs = tf.matmul(blocks, kernel)
        if bias is not None:
            outputs = outputs + bias[:, None, :]
        outputs = tf.reshape(outputs, tf.concat([shape[:-1], [self.units]], axis=0))
        outputs.set_shape(inputs.shape[:-1].concatenate([self.units]))
        return outputs

    def _kl(self, posterior, weights=None):
        """``KL(q || p)``: exact where registered (and ``kl_use_exact``), else the Monte Carlo
        estimate at ``weights`` (``[n]`` or ``[T, n]``, averaged), or at a fresh sample if None."""
        prior = self.prior.distribution()
        if self.kl_use_exact:
            kl = exact_kl(posterior, prior)
            if kl is not None:
                return kl
        if weights is None:
            weights = posterior.sample(seed=self._sample_seed())
        return tf.reduce_mean(posterior.log_prob(weights) - prior.log_prob(weights))

    def call(self, inputs, training=None):
        sampling = self._sampling(training)
        posterior = self.posterior.distribution()
        weights = None
        if sampling:
            num_samples = self._weight_samples
            weights = posterior.sample(() if num_samples == 1 else num_samples, seed=self._sample_seed())
            outputs = self._apply(inputs, weights)
        else:
            outputs = self._apply(inputs, self.posterior.mean_weights(posterior))
        if self._adds_kl:
            self._add_kl_loss(self._kl(posterior, weights), training)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def kl_divergence(self):
        """``KL(q || p)``, unscaled: exact where TFP registers it (and ``kl_use_exact``),
        else a one-sample Monte Carlo estimate at a fresh posterior sample (it
        advances the layer's seed)."""
        if not self.built:
            raise ValueError(f"Layer '{self.name}' has no posterior yet: build it (call it on data) first. "
                             f"Received: a layer with built={self.built}")
        return self._kl(self.posterior.distribution())

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "make_posterior_fn": posteriors.serialize(self.make_posterior_fn, "make_posterior_fn"),
            "make_prior_fn": posteriors.serialize(self.make_prior_fn, "make_prior_fn"),
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kl_use_exact": self.kl_use_exact,
        }
