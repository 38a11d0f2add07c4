"""Bayesian low-rank adaptation: Laplace-LoRA and variational LoRA on Keras' native LoRA.

Keras' ``Dense`` and ``EinsumDense`` fine-tune with LoRA natively:
``layer.enable_lora(r)`` freezes the kernel ``W0`` and adds two trainable factors
``A = lora_kernel_a`` (``kernel.shape[:-1] + (r,)``) and ``B = lora_kernel_b``
(``(r, kernel.shape[-1])``), so that the layer computes with the kernel::

    W = W0 + s A B,        s = lora_alpha / lora_rank

(Hu et al. 2022, eq. 3; KerasHub's ``backbone.enable_lora(r)`` does this to the
attention projections). This module puts a posterior on the adapter only, every
other weight staying at its fine-tuned value.

**Laplace-LoRA** (Yang et al. 2024): the Laplace approximation
:class:`tfbnn.laplace.Laplace` over the trainable LoRA factors ``theta = (vec A_1,
vec B_1, vec A_2, ...)`` (each row-major, layers in the model's order), at the
fine-tuned MAP, with the prior ``N(0, delta^-1 I)``: ``q(theta) = N(theta*, (H +
delta I)^-1)`` with ``H`` the GGN ``sum_n J_n^T Lambda_n J_n`` in one of three
structures (:class:`LoRALaplace`): ``"full"``, ``"diag"``, or ``"kron"``, KFAC per
LoRA factor, as Yang et al. (a Kronecker factorization per LoRA weight matrix). A
factor is a linear map from inputs ``a`` to outputs ``z``: for ``A`` the layer's input
``x`` -> ``x A``, for ``B`` the input ``s x A`` -> ``s x A B``. Its GGN block is
approximated by::

    H_factor ~ A_f kron G_f,   A_f = sum_{n,t} a_nt a_nt^T,
                               G_f = 1/(N S) sum_{n,t} sum_k g_ntk g_ntk^T

with ``t`` running over the ``S`` positions a layer is applied at (tokens; ``S = 1``
for a ``Dense`` on ``(batch, features)``) and ``g_ntk = d (L_n^T f_n)_k / d z_nt`` the
sensitivity of the ``k``-th row of the output-Hessian root ``L_n`` (``L_n L_n^T =
Lambda_n``). For ``S = 1`` this is Ritter et al.'s KFAC (``A = sum phi phi^T``, ``G =
mean J^T Lambda J``), exact for one example; for ``S > 1`` it is the "expand" variant
of Eschenhagen et al. (2023). The prior precision (and the regression noise)
is tuned by the marginal likelihood (:meth:`tfbnn.laplace.Laplace.optimize_prior_precision`,
as Yang et al.) and the predictive is the linearized (GLM) one
(:meth:`tfbnn.laplace.Laplace.predict`, as Yang et al.; Immer et al. 2021).
:meth:`LoRALaplace.to_model` samples that predictive as a Keras model
(:class:`LinearizedLoRA`: ``f(x; theta*) + J(x) delta``, ``delta ~ N(0, Sigma)``, ``J delta`` a
forward-mode Jacobian-vector product over the factors), for :func:`tfbnn.predict`, the
calibration metrics, ``.keras`` files (the route to save Laplace-LoRA) and :mod:`tfbnn.export`.

**Variational LoRA** (BLoB, Wang et al. 2024): a mean-field Gaussian
``q(A) = N(M, diag(sigma^2))`` over the ``A`` factor, ``B`` deterministic, trained
by the ELBO (:class:`VariationalLoRA`, :func:`variational`).

Example:
    >>> import keras, numpy as np, tfbnn
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(32, 4)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
    ...                           keras.layers.Dense(2)])
    >>> model.layers[0].enable_lora(2)
    >>> la = tfbnn.lora.fit_laplace(model, x, y, likelihood="classification", hessian="kron")
    >>> la.num_parameters                           # A (4 x 2) and B (2 x 8)
    24
    >>> la.optimize_prior_precision().predict(x[:3]).shape
    (3, 2)
    >>> res = tfbnn.predict(la.to_model(seed=0), x[:3], num_samples=20, from_logits=True)
    >>> res.mean_probs.shape, res.mutual_information.shape
    ((3, 2), (3,))

References:
    Hu, Shen, Wallis, Allen-Zhu, Li, Wang, Wang, Chen. LoRA: Low-Rank Adaptation of Large
    Language Models. ICLR 2022.
    Yang, Robeyns, Wang, Aitchison. Bayesian Low-rank Adaptation for Large Language
    Models. ICLR 2024 (Laplace-LoRA).
    Wang, Shi, Han, Metaxas, Wang. BLoB: Bayesian Low-Rank Adaptation by
    Backpropagation for Large Language Models. NeurIPS 2024.
    Eschenhagen, Immer, Turner, Schneider, Hennig. Kronecker-Factored Approximate
    Curvature for Modern Neural Network Architectures. NeurIPS 2023.
"""

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn import kl as kl_lib
from tfbnn import laplace as laplace_lib
from tfbnn import priors as priors_lib
from tfbnn.layers.base import BayesianLayer, StochasticLayer
from tfbnn.likelihoods import GaussianHead

__all__ = ["lora_layers", "LoRALaplace", "LinearizedLoRA", "fit_laplace", "VariationalLoRA", "variational", "HESSIANS"]

HESSIANS = laplace_lib.HESSIANS
_LORA_TYPES = (keras.layers.Dense, keras.layers.EinsumDense)


def lora_layers(model):
    """The LoRA-enabled ``Dense`` and ``EinsumDense`` layers of ``model``, nested ones included, in order."""
    # Keras' own traversal (used by Model.enable_lora-style code): nested layers of backbones included.
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, _LORA_TYPES) and getattr(layer, "lora_enabled", False)]


def _scale(layer):
    """``s = lora_alpha / lora_rank``."""
    return layer.lora_alpha / layer.lora_rank


def _pre_activation(layer, inputs, kernel):
    """The layer's ``inputs (*) kernel + bias`` (its call before the activation) with the given kernel."""
    kernel = tf.cast(kernel, inputs.dtype)
    if isinstance(layer, keras.layers.EinsumDense):
        outputs = tf.einsum(layer.equation, inputs, kernel)
    else:
        outputs = keras.ops.matmul(inputs, kernel)
    return outputs if layer.bias is None else outputs + tf.cast(layer.bias, outputs.dtype)


def _activate(layer, outputs):
    return outputs if layer.activation is None else layer.activation(outputs)


def _is_dense_like(layer):
    """Whether the layer maps the inputs' last axis by a 2-D kernel to the outputs' last axis (KFAC's linear map)."""
    if isinstance(layer, keras.layers.Dense):
        return True
    operands, output = layer.equation.split("->")
    x_axes, k_axes = operands.split(",")
    return len(k_axes) == 2 and x_axes[-1] == k_axes[0] and output[-1] == k_axes[1] and k_axes[0] not in output


# -- Laplace-LoRA ----------------------------------------------------------------------------------
class _Probes:
    """While active, each LoRA layer's call records its input and adds a watched zero "probe" to its
    pre-activation, so that ``d f / d probe`` is the sensitivity of the outputs to it (the layers' own
    ``call`` is restored on exit)."""

    def __init__(self, layers, tape):
        self.layers, self.tape, self.inputs, self.probes = layers, tape, {}, {}

    def attach(self, layer, inputs, outputs):
        """``outputs + probe`` (the layer's pre-activation), recording ``inputs`` and the probe."""
        probe = tf.zeros_like(outputs)
        self.tape.watch(probe)
        self.inputs[id(layer)], self.probes[id(layer)] = inputs, probe
        return outputs + probe

    def _call(self, layer):
        def call(inputs, *args, **kwargs):
            return _activate(layer, self.attach(layer, inputs, _pre_activation(layer, inputs, layer.kernel)))

        return call

    def __enter__(self):
        for layer in self.layers:
            layer.call = self._call(layer)  # an instance attribute, shadowing the class's method
        return self

    def __exit__(self, *exc):
        for layer in self.layers:
            del layer.call


class LoRALaplace(laplace_lib.Laplace):
    """Laplace-LoRA: the Laplace approximation over a model's LoRA factors only (Yang et al. 2024).

    ``q(theta) = N(theta*, (H / sigma^2 + delta I)^-1)`` over ``theta``, the trainable
    ``lora_kernel_a`` and ``lora_kernel_b`` of every LoRA-enabled ``Dense`` /
    ``EinsumDense`` (:func:`lora_layers`), each flattened row-major, layer by layer;
    all other weights are fixed. A factor frozen by the user
    (``layer.lora_kernel_a.trainable = False``) is not part of ``theta``. The GGN ``H``
    and the KFAC structure are in the module docstring (:mod:`tfbnn.lora`). Everything
    else is :class:`tfbnn.laplace.Laplace` with ``subset="all"``: :meth:`fit`,
    :meth:`optimize_prior_precision` (marginal likelihood, Immer et al. 2021 eq. 4),
    :meth:`predict` (the GLM predictive, as Yang et al.; ``pred_type="nn"``
    samples adapters), :meth:`to_model` (that predictive as a sampling Keras model,
    for :func:`tfbnn.predict`, ``.keras`` and export), :meth:`log_marginal_likelihood`, :meth:`sample`,
    :attr:`posterior_precision` (``"kron"``: dense ``(P, P)`` from the factors).

    Args:
        model: a trained Sequential or functional ``keras.Model`` ending in a
            ``keras.layers.Dense`` (logits or regression means), with LoRA enabled on
            at least one ``Dense`` or ``EinsumDense``.
        likelihood: ``"classification"`` or ``"regression"``.
        hessian: ``"kron"`` (default: KFAC per factor; needs every LoRA layer to be
            dense-like, a 2-D kernel on the inputs' last axis), ``"diag"`` or ``"full"``.
        prior_precision: float > 0, ``delta``. Default 1.
        sigma_noise: float > 0, the regression noise std. Default 1.

    Attributes:
        hessian_factors: ``"full"`` ``(P, P)``; ``"diag"`` ``(P,)``; ``"kron"`` the tuple
            ``(A_1, G_1, A_2, G_2, ...)``, one pair per factor in ``theta``'s order.
        factors: ``[(layer, "a" | "b"), ...]``, the factors in ``theta``'s order.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> model.layers[0].enable_lora(1)
        >>> la = tfbnn.lora.LoRALaplace(model, "regression", hessian="diag").fit(x, x[:, :2])
        >>> la.posterior_covariance.shape               # A (3 x 1) and B (1 x 2)
        (5,)
    """

    _kron_all = True

    def __init__(self, model, likelihood="classification", hessian="kron", prior_precision=1.0, sigma_noise=1.0):
        super().__init__(model, likelihood=likelihood, subset="all", hessian=hessian,
                         prior_precision=prior_precision, sigma_noise=sigma_noise)
        self._activations = None

    def _subset_variables(self, model):
        if not isinstance(model, keras.Model):
            raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
        layers = lora_layers(model)
        if not layers:
            raise ValueError("Expected a model with LoRA enabled on a Dense or EinsumDense layer "
                             f"(`layer.enable_lora(rank)`). Received: model={model.name!r} without LoRA layers")
        self.factors = [(layer, which) for layer in layers for which in ("a", "b")
                        if getattr(layer, f"lora_kernel_{which}").trainable]
        if not self.factors:
            raise ValueError(f"Expected a trainable LoRA factor. Received: model={model.name!r} with every LoRA "
                             "factor frozen")
        if self.hessian == "kron":
            for layer in layers:
                if not _is_dense_like(layer):
                    raise ValueError(
                        "hessian='kron' needs LoRA layers with a 2-D kernel applied to the inputs' last axis (use "
                        f"'diag' or 'full'). Received: layer {layer.name!r} with equation {layer.equation!r}")
        return [getattr(layer, f"lora_kernel_{which}") for layer, which in self.factors]

    # -- KFAC per factor -------------------------------------------------------------------
    def _batch_curvature(self, x):
        if self.hessian != "kron":
            return super()._batch_curvature(x)
        f, inputs, sensitivities = self._layer_terms(x)
        parts = []
        for layer, which in self.factors:
            a, g = self._factor_terms(layer, which, inputs[id(layer)], sensitivities[id(layer)], f)
            parts += [a.T @ a, g.T @ g / (a.shape[0] / f.shape[0])]  # G divided by S here, by N at the end
        return f, tuple(parts)

    def _average_output_factors(self, factors, num):
        return tuple(m / num if i % 2 else m for i, m in enumerate(factors))

    def _factor_terms(self, layer, which, x, sensitivity, f):
        """The factor's inputs ``a`` (N S, in) and output sensitivities ``g`` (N K S, out) of the module docstring."""
        s = _scale(layer)
        x = x.reshape(-1, x.shape[-1])
        rows = f.shape[0]
        root = self._hessian_root(f, sensitivity.reshape(rows, f.shape[1], -1))
        root = root.reshape(-1, sensitivity.shape[-1])  # d (L^T f)_k / d y_t, (N K S, out)
        b = np.asarray(layer.lora_kernel_b.numpy(), np.float64)
        if which == "a":
            return x, s * root @ b.T
        return s * x @ np.asarray(layer.lora_kernel_a.numpy(), np.float64), root

    def _layer_terms(self, x):
        """``f`` (B, K), and per LoRA layer its inputs and ``d f / d y`` (B, K, ..., out), float64."""
        net = self._net
        leaves = [tf.cast(v, t.dtype) for v, t in zip(tf.nest.flatten(x), tf.nest.flatten(net.inputs))]
        x = tf.nest.pack_sequence_as(x, leaves)
        layers = list(dict.fromkeys(layer for layer, _ in self.factors))
        if self._activations is None:
            signature = tf.nest.map_structure(lambda v: tf.TensorSpec([None, *v.shape[1:]], v.dtype), x)
            self._activations = tf.function(lambda inputs: self._trace_terms(layers, inputs),
                                            input_signature=[signature])
        f, inputs, sensitivities = self._activations(x)
        as_numpy = {id(layer): (np.asarray(i, np.float64), np.asarray(g, np.float64))
                    for layer, i, g in zip(layers, inputs, sensitivities)}
        return (np.asarray(f, np.float64), {k: v[0] for k, v in as_numpy.items()},
                {k: v[1] for k, v in as_numpy.items()})

    def _trace_terms(self, layers, x):
        last = self._net.last
        inner = [layer for layer in layers if layer is not last]
        with tf.GradientTape(persistent=True) as tape, _Probes(inner, tape) as probes:
            phi = self._net.features(x, training=False)
            f = _pre_activation(last, phi, last.kernel)  # the last layer's pre-activation, as laplace's
            if len(inner) < len(layers):
                f = probes.attach(last, phi, f)
        sensitivities = [tape.batch_jacobian(f, probes.probes[id(layer)]) for layer in layers]
        return f, [probes.inputs[id(layer)] for layer in layers], sensitivities

    def to_model(self, seed=None, name=None):
        """A Keras model that samples the linearized (GLM) predictive of Laplace-LoRA (Yang et al. 2024).

        Every call draws one adapter offset ``delta ~ N(0, Sigma)`` (``Sigma`` the
        posterior covariance at the current, e.g. marglik-tuned, hyperparameters) and
        returns the network linearized at ``theta*``::

            f_lin(x) = f(x; theta*) + J(x) delta,        J(x) = d f(x; theta*) / d theta

        ``J delta`` is a forward-mode Jacobian-vector product over the LoRA factors
        (:class:`LinearizedLoRA`), about one forward pass per sample, so ``f_lin(x) ~
        N(f(x; theta*), J Sigma J^T)``, the function-space predictive of
        :meth:`function_moments` and :meth:`predict` (Immer et al. 2021). The last
        layer's activation follows (a softmax gives class probabilities; a linear
        classifier gives logits: pass ``from_logits=True`` to :func:`tfbnn.predict`),
        so ``tfbnn.predict(model, x, num_samples=T)`` is the Monte Carlo GLM predictive
        with its aleatoric/epistemic split; for regression the model ends in a
        :class:`tfbnn.GaussianHead` whose scale is ``sigma_noise`` (the aleatoric
        part). The model shares ``model``'s layers (``theta*`` is read from them: after
        training ``model`` further, refit and call ``to_model`` again); it saves as ``.keras`` (``theta*``
        exactly: ``W0`` and the factors unmerged, the posterior root and the seed state
        as the sampling layer's weights) and exports with :mod:`tfbnn.export`. This is
        the route to save Laplace-LoRA (:meth:`save` is not available).

        Args:
            seed: int or None, seed of the sampling layer's ``keras.random.SeedGenerator``.
            name: str or None, the model's name.

        Returns:
            A functional ``keras.Model`` with ``model``'s inputs.

        Example:
            >>> import keras, numpy as np, tfbnn
            >>> x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
            >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
            ...                           keras.layers.Dense(2, activation="softmax")])
            >>> model.layers[0].enable_lora(1)
            >>> la = tfbnn.lora.fit_laplace(model, x, (x[:, 0] > 0).astype("int32"), hessian="kron")
            >>> sampler = la.optimize_prior_precision().to_model(seed=0)
            >>> res = tfbnn.predict(sampler, x[:4], num_samples=20)
            >>> res.mean_probs.shape, bool(np.all(res.mutual_information > 0))
            ((4, 2), True)
        """
        self._check_fitted()
        if name is not None and not isinstance(name, str):
            raise ValueError(f"Expected `name` to be a string or None. Received: name={name!r}")
        net = self._net
        try:  # the model's own input structure (a dict for a KerasHub task)
            inputs = net.model.input
        except (AttributeError, ValueError):  # a Sequential model that was never called
            inputs = net.inputs
        features = keras.Model(inputs, net.last.input, name=f"{net.model.name}_features")
        candidates = _linearized_candidates(features, net.last)
        index = {id(layer): i for i, layer in enumerate(candidates)}
        missing = [layer.name for layer, _ in self.factors if id(layer) not in index]
        if missing:
            raise ValueError("Expected every LoRA layer on the path from the inputs to the last Dense layer. "
                             f"Received: LoRA layers {missing} outside it")
        lora = [[index[id(layer)], int(layer.lora_rank), float(layer.lora_alpha)]
                for layer in candidates if getattr(layer, "lora_enabled", False)]
        factors = [[index[id(layer)], which] for layer, which in self.factors]
        regression = self.likelihood == "regression"
        layer = LinearizedLoRA(features, net.last, factors, lora, structure=self.hessian,
                               noise_scale=self.sigma_noise if regression else None, seed=seed,
                               name=f"{net.last.name}_laplace_lora")
        outputs = layer(inputs)
        layer.set_posterior(**self._lora_scale())
        if regression:
            outputs = GaussianHead(min_scale=self.sigma_noise, name=f"{net.last.name}_noise")(outputs)
        return keras.Model(inputs, outputs, name=name or f"{net.model.name}_laplace_lora")

    def _lora_scale(self):
        """The posterior root at the current hyperparameters, in :meth:`LinearizedLoRA.set_posterior`'s layout."""
        std = 1.0 / np.sqrt(self._precision_values(self.prior_precision, self.sigma_noise))
        if self.hessian == "full":
            return {"scale": self._basis.vectors * std}
        if self.hessian == "diag":
            return {"scale": std}
        blocks = self._basis.blocks
        parts = np.split(std, self._basis.splits)
        return {"scale": [s.reshape(len(b.qa), len(b.qg)) for b, s in zip(blocks, parts)],
                "input_rotations": [b.qa for b in blocks], "output_rotations": [b.qg for b in blocks]}

    def save(self, path):
        """Not available for Laplace-LoRA: save :meth:`to_model`'s model (``model.save("la.keras")``), which
        holds ``theta*`` and the posterior root, or refit (the GGN costs one pass over the data)."""
        raise NotImplementedError("LoRALaplace.save is not available; save `la.to_model()` as a .keras file, "
                                  "or refit with tfbnn.lora.fit_laplace")


def fit_laplace(model, x, y=None, likelihood="classification", hessian="kron", prior_precision=1.0,
                sigma_noise=1.0, batch_size=None):
    """Fits Laplace-LoRA (Yang et al. 2024): ``LoRALaplace(model, ...).fit(x, y)``.

    Args:
        model: the fine-tuned ``keras.Model`` with LoRA-enabled layers (see :class:`LoRALaplace`).
        x: training inputs, or a batched ``tf.data.Dataset`` of ``(x, y)``.
        y: targets (None with a dataset).
        likelihood: ``"classification"`` or ``"regression"``.
        hessian: ``"kron"`` (default), ``"diag"`` or ``"full"``.
        prior_precision: float > 0. Default 1.
        sigma_noise: float > 0 (regression). Default 1.
        batch_size: int or None (default 32).

    Returns:
        A fitted :class:`LoRALaplace`.
    """
    la = LoRALaplace(model, likelihood=likelihood, hessian=hessian, prior_precision=prior_precision,
                     sigma_noise=sigma_noise)
    return la.fit(x, y, batch_size=batch_size)


# -- the linearized sampling layer -----------------------------------------------------------------
_UNMERGED = ("_kernel", "bias", "lora_kernel_a", "lora_kernel_b")
# The raw scale output for a following GaussianHead, as LaplaceDense's: softplus(-1e4) is 0.
_RAW_SCALE = -1e4


def _linearized_candidates(features, last):
    """The ``Dense`` / ``EinsumDense`` layers of ``features`` (nested ones included, in Keras' order), then ``last``:
    :class:`LinearizedLoRA` names its LoRA layers by their index here, which a deserialized copy reproduces."""
    inner = [layer for layer in features._flatten_layers(include_self=False, recursive=True)
             if isinstance(layer, _LORA_TYPES) and layer is not last]
    return inner + [last]


def _unmerged_once(layer, load):
    """Makes ``layer``'s next save (``load=False``) or load (``load=True``) write / read ``W0``, the bias, ``A`` and
    ``B`` as they are, by name; the layer then saves as Keras does again (it may be shared with a user's model).

    Keras' LoRA layers save ``W0 + s A B`` and zero ``A`` and ``B`` on load, which would move the linearization
    point (``J`` depends on ``A`` and ``B``, not only on their product). Keras saves and loads a layer's own
    variables before its sublayers', so the wrapping layer sets this up in its own save / load.
    """
    def variables():
        return {name: getattr(layer, name) for name in _UNMERGED if getattr(layer, name, None) is not None}

    def save_own_variables(store):
        del layer.save_own_variables
        for key, variable in variables().items():
            store[key] = variable

    def load_own_variables(store):
        del layer.load_own_variables
        for key, variable in variables().items():
            variable.assign(store[key])

    # instance attributes, shadowing the class's methods until they run
    if load:
        layer.load_own_variables = load_own_variables
    else:
        layer.save_own_variables = save_own_variables


@keras.saving.register_keras_serializable(package="tfbnn")
class LinearizedLoRA(StochasticLayer):
    """A LoRA network linearized at its adapter ``theta*``, sampling ``delta ~ N(0, Sigma)``: Laplace-LoRA's predictive.

    ``f(x; theta)`` is the last ``Dense`` layer's pre-activation on top of ``features``
    (logits or regression means), ``theta`` the LoRA factors ``(vec A_1, vec B_1, ...)``
    of :meth:`LoRALaplace.factors` (row-major, that order). A call with sampling draws
    ``delta = S eps``, ``eps ~ N(0, I_P)``, ``S S^T = Sigma``, and returns::

        activation(f(x; theta*) + J(x) delta),        J(x) = d f(x; theta*) / d theta

    (Yang et al. 2024 use this linearized predictive; Immer et al. 2021), with ``J
    delta`` a forward-mode Jacobian-vector product (``tf.autodiff.ForwardAccumulator``
    over the ``lora_kernel_a`` / ``lora_kernel_b`` variables, tangents ``delta`` split
    per factor): one pass costs about two forward passes, for LoRA layers nested
    anywhere. ``Sigma``'s root ``S`` is held as non-trainable weights in one of three
    structures (:meth:`set_posterior`):

    * ``"full"``: ``scale`` ``(P, P)``, ``delta = scale eps``;
    * ``"diag"``: ``scale`` ``(P,)``, ``delta = scale * eps``;
    * ``"kron"``: per factor ``f`` of shape ``(m, n)``, ``input_rotation_f`` ``Q_A``
      ``(m, m)``, ``output_rotation_f`` ``Q_G`` ``(n, n)`` and ``scale_f`` ``(m, n)``:
      ``delta_f = Q_A (scale_f * eps_f) Q_G^T`` (the eigenvectors of KFAC's ``A_f`` and
      ``G_f``, the scales ``1 / sqrt(a_i g_j / sigma^2 + delta)``).

    **Monte Carlo protocol** (:func:`tfbnn.utils.weight_samples`): with ``T`` samples
    the ``T * B`` rows are ``T`` blocks, and each block gets its own ``delta`` (one
    JVP per block, ``tf.map_fn``), jointly or not: a row-wise ``delta`` would cost a
    JVP per row. The per-example samples, which :func:`tfbnn.predict`'s summaries
    use, have the same distribution either way; the examples of a block share their
    draw (a joint function sample). With ``inference_mode="mean"`` (or
    :func:`tfbnn.posterior_mean`) the output is the MAP network's ``activation(f(x;
    theta*))``. ``features`` is always called with ``training=False``.

    Saving: the wrapped LoRA layers save ``W0``, the bias, ``A`` and ``B`` unmerged
    inside this layer (Keras would merge them), and LoRA that a deserialized layer lost
    (a KerasHub backbone is rebuilt from its constructor arguments) is enabled again
    from ``lora``. Made by :meth:`LoRALaplace.to_model`.

    Args:
        features: a ``keras.Model`` from the inputs to the last ``Dense`` layer's input.
        last: the last ``keras.layers.Dense`` (its activation is applied to the output).
        factors: ``[[index, "a" | "b"], ...]``, ``theta``'s factors; ``index`` into the
            ``Dense`` / ``EinsumDense`` layers of ``features`` (Keras' flattening order)
            followed by ``last``.
        lora: ``[[index, rank, alpha], ...]``, the LoRA-enabled layers, same indices.
        structure: ``"full"``, ``"kron"`` (default) or ``"diag"``.
        noise_scale: float > 0 or None: regression, the outputs followed by ``K`` raw
            scales of ``-1e4`` for a ``tfbnn.GaussianHead(min_scale=noise_scale)``, as
            :class:`tfbnn.laplace.LaplaceDense`.
        inference_mode: ``"sample"`` (default) or ``"mean"``.
        seed: int or None, seed of the ``keras.random.SeedGenerator``.

    Input: ``features``' inputs. Output shape: ``(batch, K)`` (``(batch, 2 K)`` with
    ``noise_scale``).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> model.layers[0].enable_lora(1)
        >>> la = tfbnn.lora.fit_laplace(model, x, x[:, :2], likelihood="regression", hessian="full")
        >>> layer = la.to_model(seed=0).layers[1]
        >>> type(layer).__name__, layer.sample_offsets(4).shape       # delta: A (3 x 1), B (1 x 2)
        ('LinearizedLoRA', TensorShape([4, 5]))

    References:
        Yang, Robeyns, Wang, Aitchison. Bayesian Low-rank Adaptation for Large Language
        Models. ICLR 2024.
        Immer, Korzepa, Bauer. Improving Predictions of Bayesian Neural Nets via Local
        Linearization. AISTATS 2021.
    """

    def __init__(self, features, last, factors, lora, structure="kron", noise_scale=None, inference_mode="sample",
                 seed=None, **kwargs):
        super().__init__(inference_mode=inference_mode, seed=seed, **kwargs)
        if not isinstance(features, keras.Model):
            raise ValueError(f"Expected `features` to be a keras.Model. Received: features of type "
                             f"{type(features).__name__}")
        if not isinstance(last, keras.layers.Dense):
            raise ValueError(f"Expected `last` to be a keras.layers.Dense. Received: last of type {type(last).__name__}")
        if structure not in laplace_lib.STRUCTURES:
            raise ValueError(f"Expected `structure` in {laplace_lib.STRUCTURES}. Received: structure={structure!r}")
        self.structure = structure
        self.noise_scale = checks.number("noise_scale", noise_scale, low=0, low_open=True, allow_none=True)
        try:
            self.factors = [[int(i), str(w)] for i, w in factors]
            self.lora = [[int(i), int(r), float(a)] for i, r, a in lora]
        except (TypeError, ValueError):
            raise ValueError("Expected `factors` as [[index, 'a' | 'b'], ...] and `lora` as [[index, rank, alpha], "
                             f"...]. Received: factors={factors!r}, lora={lora!r}") from None
        if not self.factors or any(w not in ("a", "b") for _, w in self.factors):
            raise ValueError(f"Expected `factors` as a non-empty list of [index, 'a' | 'b']. Received: factors={factors!r}")
        self.features, self.last = features, last

    @property
    def activation(self):
        """The last layer's activation, applied to the outputs (a softmax tells :func:`tfbnn.predict` the task)."""
        return self.last.activation

    def _candidates(self):
        return _linearized_candidates(self.features, self.last)

    def _variables(self):
        """The LoRA factors in ``theta``'s order (read here, not held: held, they would be this layer's own)."""
        layers = self._candidates()
        return [getattr(layers[i], f"lora_kernel_{w}") for i, w in self.factors]

    def build(self, input_shape):
        if not self.last.built:
            self.last.build(self.features.output.shape)
        layers = self._candidates()
        for i, rank, alpha in self.lora:
            if i >= len(layers) or not isinstance(layers[i], _LORA_TYPES):
                raise ValueError(f"Expected `lora` indices below {len(layers)}. Received: lora={self.lora!r}")
            if not layers[i].lora_enabled:  # lost in deserialization (a KerasHub backbone's constructor)
                layers[i].enable_lora(rank, lora_alpha=alpha)
            layers[i].lora_alpha = alpha  # a Dense rebuilt from its config with `lora_rank` gets alpha = rank
        shapes = [tuple(v.shape) for v in self._variables()]
        self._sizes = [int(np.prod(s)) for s in shapes]
        size = sum(self._sizes)

        def weight(name, shape):
            return self.add_weight(name=name, shape=shape, initializer="zeros", trainable=False)

        if self.structure != "kron":
            self.scale = weight("scale", (size, size) if self.structure == "full" else (size,))
            return
        for f, shape in enumerate(shapes):
            if len(shape) != 2:
                raise ValueError("structure='kron' needs 2-D LoRA factors (a dense-like layer). Received: factor "
                                 f"{f} of shape {shape}")
            for key, weight_shape in (("input_rotation", (shape[0],) * 2), ("output_rotation", (shape[1],) * 2),
                                      ("scale", shape)):
                setattr(self, f"{key}_{f}", weight(f"{key}_{f}", weight_shape))

    def _kron(self, f):
        """``(Q_A, Q_G, scale)`` of factor ``f``."""
        return tuple(getattr(self, f"{key}_{f}") for key in ("input_rotation", "output_rotation", "scale"))

    def set_posterior(self, scale, input_rotations=None, output_rotations=None):
        """Sets the root of ``Sigma``: ``scale`` ``(P, P)`` (full) or ``(P,)`` (diag); for ``"kron"`` the lists of
        per-factor ``scale_f``, ``Q_A`` (``input_rotations``) and ``Q_G`` (``output_rotations``)."""
        if self.structure != "kron":
            self.scale.assign(np.asarray(scale, np.float32))
            return
        for f, parts in enumerate(zip(input_rotations, output_rotations, scale)):
            for variable, value in zip(self._kron(f), parts):
                variable.assign(np.asarray(value, np.float32))

    def _offsets(self, eps):
        """``eps`` (T, P) standard normal -> ``delta = S eps`` split per factor, ``[(T, *factor shape), ...]``."""
        if self.structure == "full":
            eps = tf.matmul(eps, self.scale, transpose_b=True)
        elif self.structure == "diag":
            eps = eps * self.scale
        parts = tf.split(eps, self._sizes, axis=-1)
        offsets = []
        for f, (part, variable) in enumerate(zip(parts, self._variables())):
            if self.structure == "kron":
                qa, qg, scale = self._kron(f)
                part = tf.reshape(part, [-1, *scale.shape]) * scale
                part = tf.matmul(tf.matmul(qa, part), qg, transpose_b=True)
            offsets.append(tf.reshape(part, [-1, *variable.shape]))
        return offsets

    def _draw(self, num_samples):
        return self._offsets(self._normal([num_samples, sum(self._sizes)], self.variable_dtype))

    def sample_offsets(self, num_samples=1):
        """``num_samples`` draws of ``delta`` ``(T, P)`` (``theta``'s order), the draw a call makes next."""
        num_samples = checks.integer("num_samples", num_samples, 1)
        return tf.concat([tf.reshape(o, [num_samples, -1]) for o in self._draw(num_samples)], axis=-1)

    def _logits(self, inputs):
        return _pre_activation(self.last, self.features(inputs, training=False), self.last.kernel)

    def _linearized(self, inputs, offsets):
        """``f(x; theta*) + J(x) delta`` for one ``delta`` (per-factor tangents)."""
        variables = self._variables()
        tangents = [tf.cast(o, v.dtype) for o, v in zip(offsets, variables)]
        with tf.autodiff.ForwardAccumulator([v.value for v in variables], tangents) as acc:
            f = self._logits(inputs)
        return f + acc.jvp(f, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def call(self, inputs, training=None):
        if not self._sampling(training):
            outputs = self._logits(inputs)
        elif self._weight_samples == 1:
            outputs = self._linearized(inputs, [o[0] for o in self._draw(1)])
        else:  # one delta per block of B rows
            samples = self._weight_samples
            blocks = tf.nest.map_structure(
                lambda v: tf.reshape(v, tf.concat([[samples, -1], tf.shape(v)[1:]], 0)), inputs)
            outputs = tf.map_fn(lambda pair: self._linearized(*pair), (blocks, self._draw(samples)),
                                fn_output_signature=tf.TensorSpec([None, self.last.units], self.last.compute_dtype))
            outputs = tf.reshape(outputs, [-1, self.last.units])
        outputs = self.activation(outputs)
        if self.noise_scale is not None:
            raw = tf.fill(tf.shape(outputs), tf.cast(_RAW_SCALE, outputs.dtype))
            outputs = tf.concat([outputs, raw], axis=-1)
        return outputs

    def compute_output_shape(self, input_shape):
        return (None, self.last.units * (2 if self.noise_scale is not None else 1))

    # Keras saves / loads a layer's own variables before its sublayers': set the LoRA layers up for them here.
    def save_own_variables(self, store):
        super().save_own_variables(store)
        for i, _, _ in self.lora:
            _unmerged_once(self._candidates()[i], load=False)

    def load_own_variables(self, store):
        super().load_own_variables(store)
        for i, _, _ in self.lora:
            _unmerged_once(self._candidates()[i], load=True)

    def get_config(self):
        config = super().get_config()
        config.update({"features": keras.saving.serialize_keras_object(self.features),
                       "last": keras.saving.serialize_keras_object(self.last), "factors": self.factors,
                       "lora": self.lora, "structure": self.structure, "noise_scale": self.noise_scale})
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("features", "last"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return super().from_config(config)


# -- variational LoRA (BLoB) -----------------------------------------------------------------------
def _normal_prior(prior):
    prior = priors_lib.Normal(0.0, 1.0) if prior is None else priors_lib.get(prior, name="prior")
    if type(prior) is not priors_lib.Normal:
        raise ValueError("Expected `prior` to be a tfbnn.priors.Normal (the KL is the closed form against a "
                         f"Gaussian). Received: prior={prior!r}")
    return prior


def _check_lora_layer(layer):
    if not isinstance(layer, _LORA_TYPES):
        raise ValueError("Expected a keras.layers.Dense or keras.layers.EinsumDense. "
                         f"Received: layer of type {type(layer).__name__}")
    if not (getattr(layer, "lora_enabled", False) or (not layer.built and layer.lora_rank)):
        raise ValueError("Expected a LoRA-enabled layer (`layer.enable_lora(rank)` after building it, or "
                         f"`lora_rank=`). Received: layer {layer.name!r} without LoRA")
    return layer


def _save_unmerged(layer):
    """Makes ``layer`` save and load its variables as they are (``W0``, bias, ``A``, ``B``).

    Keras' LoRA layers save the merged kernel ``W0 + s A B`` and zero ``A`` and ``B`` on
    load, which would erase the adapter that the posterior is over.
    """
    def save_own_variables(store):
        for i, variable in enumerate(layer.weights):
            store[str(i)] = variable

    def load_own_variables(store):
        for i, variable in enumerate(layer.weights):
            variable.assign(store[str(i)])

    # instance attributes: Keras' saving calls `layer.save_own_variables(store)`
    layer.save_own_variables, layer.load_own_variables = save_own_variables, load_own_variables
    return layer


def _copy(layer):
    """A copy of a built LoRA layer, weights included."""
    copy = type(layer).from_config(layer.get_config())
    copy.build(layer.input.shape)
    copy.set_weights(layer.get_weights())
    return copy


@keras.saving.register_keras_serializable(package="tfbnn")
class VariationalLoRA(BayesianLayer):
    """A LoRA-enabled ``Dense`` / ``EinsumDense`` whose ``A`` factor is Gaussian: BLoB (Wang et al. 2024).

    The wrapped layer computes with ``W = W0 + s A B`` (module docstring); here ``A``
    has the mean-field posterior ``q(A) = N(M, diag(sigma^2))``, ``M`` the layer's
    ``lora_kernel_a``, ``sigma = softplus(rho) + 1e-6``, and ``B`` (``lora_kernel_b``)
    stays deterministic (Wang et al. 2024, BLoB's asymmetric parameterization). A call samples ``A = M +
    sigma * eps`` (reparameterization) and returns::

        activation(x (*) (W0 + s A B) + b) = activation(x (*) W_M + b + s (x (*) ((sigma * eps) B)))

    with ``W_M`` the layer's kernel at the mean (for a ``Dense``, the noise term is
    ``s ((x (sigma * eps)) B)``: no kernel-sized draw). The KL to the prior ``N(m,
    p^2)`` (default ``N(0, 1)``) is the closed form summed over ``A``::

        KL = sum log(p / sigma) + (sigma^2 + (M - m)^2) / (2 p^2) - 1/2

    added as ``kl_weight * KL`` (``kl_weight = beta / N``, the ELBO convention of
    :class:`tfbnn.layers.BayesianLayer`), so ``fit`` minimises the negative ELBO of
    Wang et al. per example (without BLoB's KL re-weighting schedule: use
    :class:`tfbnn.KLAnnealing` for one). With ``inference_mode="mean"`` (or
    :func:`tfbnn.posterior_mean`) it is the wrapped layer at ``A = M``. In Monte Carlo
    prediction (:func:`tfbnn.weight_samples`) each of the ``T`` blocks of rows gets its own
    ``A`` (``joint=True``), or each row (``joint=False``, what :func:`tfbnn.predict` uses).

    Args:
        layer: a built, LoRA-enabled ``keras.layers.Dense`` or ``EinsumDense`` (its
            weights are shared, not copied), or one configured with ``lora_rank``. It
            then saves its variables unmerged (Keras' LoRA layers save ``W0 + s A B``
            and zero ``A``, ``B`` on load, which would erase the posterior's mean):
            :func:`variational` wraps copies for that reason.
        prior: a :class:`tfbnn.priors.Normal` (or its name/config). Default ``N(0, 1)``.
        rho_initializer: initializer of ``rho``; default ``Constant(-5.0)``
            (``sigma ~ 0.0067``: training starts at the fine-tuned adapter).
        kl_weight: float >= 0 or None, ``beta / N``.
        inference_mode: ``"sample"`` (default) or ``"mean"``.
        seed: int or None, seed of the layer's ``keras.random.SeedGenerator``.

    Input shape: the wrapped layer's. Output shape: the wrapped layer's.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> dense = keras.layers.Dense(3)
        >>> dense.build((None, 4))
        >>> dense.enable_lora(2)
        >>> layer = tfbnn.lora.VariationalLoRA(dense, kl_weight=1e-3, seed=0)
        >>> layer(np.ones((5, 4), "float32")).shape
        TensorShape([5, 3])
        >>> float(layer.kl_divergence()) > 0
        True

    Reference:
        Wang, Shi, Han, Metaxas, Wang. BLoB: Bayesian Low-Rank Adaptation by
        Backpropagation for Large Language Models. NeurIPS 2024.
    """

    def __init__(self, layer, prior=None, rho_initializer=None, kl_weight=None, inference_mode="sample", seed=None,
                 **kwargs):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        self.layer = _save_unmerged(_check_lora_layer(layer))
        self.prior = _normal_prior(prior)
        self.rho_initializer = keras.initializers.get(
            keras.initializers.Constant(-5.0) if rho_initializer is None else rho_initializer)

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        if not self.layer.lora_enabled:
            raise ValueError(f"Expected a LoRA-enabled layer. Received: layer {self.layer.name!r} without LoRA")
        self.rho = self.add_weight(name="rho", shape=self.layer.lora_kernel_a.shape,
                                   initializer=self.rho_initializer, dtype="float32")
        self._build_kl_weight()

    def _scale_and_kl(self):
        return kl_lib.softplus_scale_and_normal_kl(self.layer.lora_kernel_a, self.rho, self.prior)

    def a_scale(self):
        """``sigma`` of ``q(A)``, shaped like ``lora_kernel_a``."""
        return self._scale_and_kl()[0]

    def kl_divergence(self):
        """``KL(q(A) || p(A))``, summed, unscaled."""
        return self._scale_and_kl()[1]

    def sample_a(self, num_samples=1):
        """``num_samples`` draws of ``A`` (T, *lora_kernel_a.shape) from ``q``, from the layer's seed generator."""
        scale, _ = self._scale_and_kl()
        return self.layer.lora_kernel_a + scale * self._normal([num_samples, *scale.shape], scale.dtype)

    def _noise(self, inputs, scale):
        """``s (x (*) ((sigma eps) B))`` with one ``eps`` per block of rows (per row when not joint)."""
        layer = self.layer
        draws = self._weight_samples if (self._joint_samples or self._weight_samples == 1) else tf.shape(inputs)[0]
        eps = scale * self._normal(tf.concat([[draws], tf.shape(scale)], 0), scale.dtype)
        b = tf.cast(layer.lora_kernel_b, inputs.dtype) * _scale(layer)
        eps = tf.cast(eps, inputs.dtype)
        if isinstance(layer, keras.layers.Dense):
            blocks = tf.reshape(inputs, [draws, -1, inputs.shape[-1]])
            noise = tf.matmul(tf.matmul(blocks, eps), b)
            return tf.reshape(noise, tf.concat([tf.shape(inputs)[:-1], [-1]], 0))
        blocks = tf.reshape(inputs, tf.concat([[draws, -1], tf.shape(inputs)[1:]], 0))
        noise = tf.map_fn(lambda pair: tf.einsum(layer.equation, pair[0], tf.matmul(pair[1], b)), (blocks, eps),
                          fn_output_signature=inputs.dtype)
        return tf.reshape(noise, tf.concat([[-1], tf.shape(noise)[2:]], 0))

    def call(self, inputs, training=None):
        scale, kl = self._scale_and_kl()
        outputs = _pre_activation(self.layer, inputs, self.layer.kernel)
        if self._sampling(training):
            outputs = outputs + self._noise(inputs, scale)
        if self._adds_kl:
            self._add_kl_loss(kl, training)
        return _activate(self.layer, outputs)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"layer": keras.saving.serialize_keras_object(self.layer),
                       "prior": priors_lib.serialize(self.prior),
                       "rho_initializer": keras.initializers.serialize(self.rho_initializer)})
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layer"] = keras.saving.deserialize_keras_object(config["layer"])
        return super().from_config(config)


def variational(model, prior=None, rho_initializer=None, kl_weight=None, seed=None):
    """A copy of ``model`` with every LoRA-enabled ``Dense`` / ``EinsumDense`` wrapped in :class:`VariationalLoRA`.

    BLoB (Wang et al. 2024): the ``A`` factors get mean-field Gaussian posteriors, ``B``
    and all other weights stay point estimates. Each LoRA layer is wrapped as a copy
    (``model``'s own layer saves as before); all other layers are shared with ``model``.

    Args:
        model: a Sequential or functional ``keras.Model`` whose LoRA layers are its own
            top-level layers (``keras.models.clone_model`` rebuilds its graph).
        prior, rho_initializer, kl_weight: as :class:`VariationalLoRA`.
        seed: int or None; the ``i``-th LoRA layer gets ``seed + i``.

    Returns:
        A functional ``keras.Model``.

    Example:
        >>> import keras, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, lora_rank=2)])
        >>> bayes = tfbnn.lora.variational(model, kl_weight=0.01, seed=0)
        >>> [type(layer).__name__ for layer in bayes.layers]
        ['VariationalLoRA']
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
    targets = [layer for layer in model.layers if isinstance(layer, _LORA_TYPES) and layer.lora_enabled]
    if not targets:
        raise ValueError("Expected a model with LoRA-enabled Dense or EinsumDense layers at its top level. "
                         f"Received: model={model.name!r} without them")
    seeds = {id(layer): (None if seed is None else int(seed) + i) for i, layer in enumerate(targets)}

    def wrap(layer):
        if id(layer) not in seeds:
            return layer
        return VariationalLoRA(_copy(layer), prior=prior, rho_initializer=rho_initializer, kl_weight=kl_weight,
                               seed=seeds[id(layer)], name=f"{layer.name}_blob")

    return keras.models.clone_model(model, clone_function=wrap)
