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
``q(A) = N(M, diag(sigma^2))`` over the ``A`` factor, ``M`` the layer's
``lora_kernel_a``, ``sigma = softplus(rho) + 1e-6``, ``B`` deterministic, trained
by the ELBO ``mean NLL + kl_weight * sum KL(q(A) || p(A))``, ``kl_weight = beta / N``
(:func:`variational`). Two forms: :class:`VariationalLoRA` wraps one LoRA layer (a
model's top-level layers, rebuilt by ``keras.models.clone_model``; an ``A`` per row in
Monte Carlo prediction); :class:`VariationalLoRAModel` wraps a whole model and reaches
LoRA layers nested anywhere (KerasHub's attention projections after
``backbone.enable_lora(r)``) through public Keras API: it runs the model inside a
``keras.StatelessScope`` that maps each ``lora_kernel_a`` to its draw ``M + sigma eps``
(one draw per call, or per block of rows in Monte Carlo prediction).

**Mixed precision** (``"mixed_float16"``, ``"mixed_bfloat16"``): the variables (``rho``, the
posterior root, the LoRA factors) stay float32, and the KL and the draws of ``A`` and ``delta``
are computed from the factors as stored, in float32; the forward pass, ``J delta`` included
(float32 tangents on the float32 factors, cast with them by the layers' reads), and the outputs
are in the compute dtype.

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

import copy

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks, keras_private
from tfbnn._internal.curvature import Probes, activate, pre_activation
from tfbnn import kl as kl_lib
from tfbnn import laplace as laplace_lib
from tfbnn import priors as priors_lib
from tfbnn.layers.base import BayesianLayer, StochasticLayer
from tfbnn.likelihoods import GaussianHead
from tfbnn.utils import NetworkWrapper, weight_samples

__all__ = ["lora_layers", "LoRALaplace", "LinearizedLoRA", "fit_laplace", "VariationalLoRA", "VariationalLoRAModel",
           "variational", "HESSIANS"]

HESSIANS = laplace_lib.HESSIANS
_LORA_TYPES = (keras.layers.Dense, keras.layers.EinsumDense)


def _dense_layers(model):
    """The ``Dense`` and ``EinsumDense`` layers of ``model``, nested ones included, in Keras' traversal order."""
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(f"Expected a Keras model or layer. Received: model of type {type(model).__name__}")
    # Keras' own traversal (KerasHub's Backbone.enable_lora uses it too): nested layers of backbones included.
    return [layer for layer in keras_private.sublayers(model)
            if isinstance(layer, _LORA_TYPES)]


def lora_layers(model):
    """The LoRA-enabled ``Dense`` and ``EinsumDense`` layers of ``model``, nested ones included, in order."""
    return [layer for layer in _dense_layers(model) if getattr(layer, "lora_enabled", False)]


def _required_lora_layers(model):
    """:func:`lora_layers` of ``model``; a ValueError when ``model`` is not a Keras model or has none."""
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
    layers = lora_layers(model)
    if not layers:
        raise ValueError("Expected a model with LoRA enabled on a Dense or EinsumDense layer "
                         f"(`layer.enable_lora(rank)`). Received: model={model.name!r} without LoRA layers")
    return layers


def _check_inputs(inputs, x):
    """A ValueError naming ``x`` when a batch's arrays do not have the shapes (past the batch axis) of the model's
    inputs (Keras would raise inside the traced Jacobian, several frames down)."""
    leaves, expected = tf.nest.flatten(x), tf.nest.flatten(inputs)
    shapes = [tuple(np.shape(v))[1:] for v in leaves]
    wanted = [tuple(t.shape)[1:] for t in expected]
    if len(shapes) != len(wanted) or any(
            len(a) != len(b) or any(e is not None and e != g for e, g in zip(b, a)) for a, b in zip(shapes, wanted)):
        raise ValueError(f"Expected inputs of shape {[(None, *w) for w in wanted]} (the model's). Received: x of "
                         f"shape {[tuple(np.shape(v)) for v in leaves]}")


def _scale(layer):
    """``s = lora_alpha / lora_rank``."""
    return layer.lora_alpha / layer.lora_rank


class _StoredDtype(keras.layers.Layer):
    """Runs ``fn()`` with Keras variables read in the dtype they are stored in.

    Under a mixed policy a layer's call reads every autocast float variable, its own or
    another layer's, in its compute dtype (float16 / bfloat16). The LoRA factors belong
    to the wrapped ``Dense`` / ``EinsumDense`` layers (autocast, float32): read so, a
    posterior's mean ``M`` would be rounded before its KL, and a forward-mode JVP would
    watch a cast copy instead of the variable. A layer of float32 policy called from
    inside such a call makes Keras replace the caller's autocasting by its own (float32:
    no cast), through public API; nothing else happens in the call.
    """

    def __init__(self):
        super().__init__(dtype="float32", trainable=False, name="stored_dtype_reads")
        self.built = True

    def call(self, unused, fn):
        return fn()


def _stored_values(variables):
    """``[v.value for v in variables]`` read in their stored dtype (float32: the variables themselves, as
    ``tf.Variable``), not cast to the compute dtype of a calling layer under a mixed policy."""
    if all(v.dtype == "float32" for v in variables):  # no autocasting in effect
        return [v.value for v in variables]
    return _StoredDtype()(tf.zeros(()), fn=lambda: [v.value for v in variables])


def _is_dense_like(layer):
    """Whether the layer maps the inputs' last axis by a 2-D kernel to the outputs' last axis (KFAC's linear map)."""
    if isinstance(layer, keras.layers.Dense):
        return True
    operands, output = layer.equation.split("->")
    x_axes, k_axes = operands.split(",")
    return len(k_axes) == 2 and x_axes[-1] == k_axes[0] and output[-1] == k_axes[1] and k_axes[0] not in output


# -- Laplace-LoRA ----------------------------------------------------------------------------------
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

    def _kron_layers(self, model):
        return None  # KFAC per LoRA factor (_batch_curvature), not per layer

    def __init__(self, model, likelihood="classification", hessian="kron", prior_precision=1.0, sigma_noise=1.0):
        super().__init__(model, likelihood=likelihood, subset="all", hessian=hessian,
                         prior_precision=prior_precision, sigma_noise=sigma_noise)

    def _subset_variables(self, model):
        layers = _required_lora_layers(model)
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
        _check_inputs(self._net.inputs, x)
        if self.hessian != "kron":
            return super()._batch_curvature(x)
        f, inputs, sensitivities = self._layer_terms(x, list(dict.fromkeys(layer for layer, _ in self.factors)))
        parts = []
        for layer, which in self.factors:
            a, g = self._factor_terms(layer, which, inputs[id(layer)], sensitivities[id(layer)], f)
            parts += [a.T @ a, g.T @ g / (a.shape[0] / f.shape[0])]  # G divided by S here, by N at the end
        return f, tuple(parts)

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
            seed: int in ``[0, 2^31)`` (NumPy integers too) or None, seed of the sampling layer's
                ``keras.random.SeedGenerator`` (as :meth:`tfbnn.laplace.Laplace.to_model`).
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
        seed = checks.numpy_seed(seed)
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
_UNMERGED = (keras_private.LORA_BASE_KERNEL, "bias", "lora_kernel_a", "lora_kernel_b")
# The raw scale output for a following GaussianHead, as LaplaceDense's: softplus(-1e4) is 0.
_RAW_SCALE = -1e4


def _linearized_candidates(features, last):
    """The ``Dense`` / ``EinsumDense`` layers of ``features`` (nested ones included, in Keras' order), then ``last``:
    :class:`LinearizedLoRA` names its LoRA layers by their index here, which a deserialized copy reproduces."""
    inner = [layer for layer in keras_private.sublayers(features)
             if isinstance(layer, _LORA_TYPES) and layer is not last]
    return inner + [last]


def _batch_size(input_shape):
    """The batch size of an input shape, or of the first of a structure of them (a KerasHub task's dict)."""
    while isinstance(input_shape, dict) or (isinstance(input_shape, (list, tuple)) and input_shape
                                            and isinstance(input_shape[0], (list, tuple, dict, tf.TensorShape))):
        input_shape = next(iter(input_shape.values())) if isinstance(input_shape, dict) else input_shape[0]
    return tuple(input_shape)[0] if len(input_shape) else None


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
        keras_private.restore_variable_saving(layer, save=True)
        for key, variable in variables().items():
            store[key] = variable

    def load_own_variables(store):
        keras_private.restore_variable_saving(layer, load=True)
        for key, variable in variables().items():
            variable.assign(store[key])

    # instance attributes, shadowing the class's methods until they run
    if load:
        keras_private.override_variable_saving(layer, load=load_own_variables)
    else:
        keras_private.override_variable_saving(layer, save=save_own_variables)


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
        if any(rank < 1 for _, rank, _ in self.lora):
            raise ValueError(f"Expected LoRA ranks >= 1 in `lora`. Received: lora={lora!r}")
        if any(i not in {index for index, _, _ in self.lora} for i, _ in self.factors):
            raise ValueError("Expected the indices of `factors` among those of `lora`. Received: "
                             f"factors={factors!r}, lora={lora!r}")
        self.features, self.last = features, last
        self._restore_lora(enable=False)

    def _restore_lora(self, enable):
        """Puts ``lora`` back on the layers: ``lora_alpha`` (a Dense or EinsumDense built from a config with
        ``lora_rank``, as deserialization builds it, gets alpha = rank) and, with ``enable``, LoRA itself where a
        deserialized layer lost it (a KerasHub backbone is rebuilt from its constructor arguments)."""
        layers = self._candidates()
        for i, rank, alpha in self.lora:
            if i < 0 or i >= len(layers):
                raise ValueError(f"Expected `lora` indices in [0, {len(layers)}) (the Dense and EinsumDense layers of "
                                 f"`features`, then `last`). Received: lora={self.lora!r}")
            if enable and not layers[i].lora_enabled:
                layers[i].enable_lora(rank, lora_alpha=alpha)
            if layers[i].lora_enabled:
                layers[i].lora_alpha = alpha

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
        self._restore_lora(enable=True)
        shapes = [tuple(v.shape) for v in self._variables()]
        self._sizes = [int(np.prod(s)) for s in shapes]
        size = sum(self._sizes)

        def weight(name, shape):
            # float32 under a mixed policy too, and read so inside `call` (never autocast): the root of Sigma
            return self.add_weight(name=name, shape=shape, initializer="zeros", trainable=False, dtype="float32",
                                   autocast=False)

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
        return self._offsets(self._normal([num_samples, sum(self._sizes)], "float32"))

    def sample_offsets(self, num_samples=1):
        """``num_samples`` draws of ``delta`` ``(T, P)`` (``theta``'s order), the draw a call makes next."""
        num_samples = checks.integer("num_samples", num_samples, 1)
        return tf.concat([tf.reshape(o, [num_samples, -1]) for o in self._draw(num_samples)], axis=-1)

    def _logits(self, inputs):
        """``f(x; theta*)``, computed as the model computes it (its layers' compute dtypes)."""
        return pre_activation(self.last, self.features(inputs, training=False), self.last.kernel)

    def _linearized(self, inputs, offsets):
        """``f(x; theta*) + J(x) delta`` for one ``delta`` (per-factor tangents), in the compute dtype.

        Under a mixed policy the JVP watches the float32 factors themselves (read outside the autocasting of this
        layer's call), with the float32 ``delta`` as tangents; the layers' reads cast both to their compute dtype,
        so ``J delta`` is computed in the forward's dtype, as ``f``.
        """
        primals = _stored_values(self._variables())
        tangents = [tf.cast(o, p.dtype) for o, p in zip(offsets, primals)]
        with tf.autodiff.ForwardAccumulator(primals, tangents) as acc:
            f = self._logits(inputs)
        jvp = acc.jvp(f, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return tf.cast(f + tf.cast(jvp, f.dtype), self.compute_dtype)

    def call(self, inputs, training=None):
        if not self._sampling(training):
            outputs = tf.cast(self._logits(inputs), self.compute_dtype)
        elif self._weight_samples == 1:
            outputs = self._linearized(inputs, [o[0] for o in self._draw(1)])
        else:  # one delta per block of B rows
            samples = self._weight_samples
            blocks = tf.nest.map_structure(
                lambda v: tf.reshape(v, tf.concat([[samples, -1], tf.shape(v)[1:]], 0)), inputs)
            outputs = tf.map_fn(lambda pair: self._linearized(*pair), (blocks, self._draw(samples)),
                                fn_output_signature=tf.TensorSpec([None, self.last.units], self.compute_dtype))
            outputs = tf.reshape(outputs, [-1, self.last.units])
        outputs = self.activation(outputs)
        if self.noise_scale is not None:
            raw = tf.fill(tf.shape(outputs), tf.cast(_RAW_SCALE, outputs.dtype))
            outputs = tf.concat([outputs, raw], axis=-1)
        return outputs

    def compute_output_shape(self, input_shape):
        return (_batch_size(input_shape), self.last.units * (2 if self.noise_scale is not None else 1))

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
                       "last": keras.saving.serialize_keras_object(self.last),
                       # plain lists: Keras wraps a layer's list attributes in tracking lists, which do not copy
                       "factors": [list(f) for f in self.factors], "lora": [list(spec) for spec in self.lora],
                       "structure": self.structure, "noise_scale": self.noise_scale})
        return config

    @classmethod
    def from_config(cls, config):
        config = copy.deepcopy(config)  # Keras' deserialization pops from the nested configs
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
    if not layer.built:  # Keras checks the rank when the layer builds, not in its constructor
        checks.integer("lora_rank", layer.lora_rank, 1)
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
    keras_private.override_variable_saving(layer, save=save_own_variables, load=load_own_variables)
    return layer


def _copy(layer):
    """A copy of a built LoRA layer, weights included (and ``lora_alpha``: Keras' ``build`` of a layer configured
    with ``lora_rank`` calls ``enable_lora(rank)``, which sets ``lora_alpha = rank``)."""
    copy = type(layer).from_config(layer.get_config())
    copy.build(layer.input.shape)
    copy.lora_alpha = layer.lora_alpha
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
        self._lora_alpha = layer.lora_alpha  # as configured: Keras' build of a `lora_rank` layer resets it to the rank
        self.prior = _normal_prior(prior)
        self.rho_initializer = keras.initializers.get(
            keras.initializers.Constant(-5.0) if rho_initializer is None else rho_initializer)

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
            self.layer.lora_alpha = self._lora_alpha
        if not self.layer.lora_enabled:
            raise ValueError(f"Expected a LoRA-enabled layer. Received: layer {self.layer.name!r} without LoRA")
        self.input_spec = self.layer.input_spec  # a wrong feature count: Keras' own error, naming this layer
        self.rho = self.add_weight(name="rho", shape=self.layer.lora_kernel_a.shape,
                                   initializer=self.rho_initializer, dtype="float32")
        self._build_kl_weight()

    def _mean(self):
        """``M``, float32 (under a mixed policy too: the KL and the draws are float32)."""
        return _stored_values([self.layer.lora_kernel_a])[0]

    def _scale_and_kl(self):
        return kl_lib.softplus_scale_and_normal_kl(self._mean(), self.rho, self.prior)

    def a_scale(self):
        """``sigma`` of ``q(A)``, shaped like ``lora_kernel_a``."""
        return self._scale_and_kl()[0]

    def kl_divergence(self):
        """``KL(q(A) || p(A))``, summed, unscaled."""
        return self._scale_and_kl()[1]

    def sample_a(self, num_samples=1):
        """``num_samples`` draws of ``A`` (T, *lora_kernel_a.shape) from ``q``, from the layer's seed generator."""
        num_samples = checks.integer("num_samples", num_samples, 1)
        scale, _ = self._scale_and_kl()
        return self._mean() + scale * self._normal([num_samples, *scale.shape], scale.dtype)

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
        outputs = pre_activation(self.layer, inputs, self.layer.kernel)
        if self._sampling(training):
            outputs = outputs + self._noise(inputs, scale)
        if self._adds_kl:
            self._add_kl_loss(kl, training)
        return activate(self.layer, outputs)

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
        config = copy.deepcopy(config)  # Keras' deserialization pops from the nested configs
        alpha = config["layer"].get("config", {}).get("lora_alpha")
        config["layer"] = keras.saving.deserialize_keras_object(config["layer"])
        if alpha is not None:  # the layer is built from its build config, which resets lora_alpha to the rank
            config["layer"].lora_alpha = alpha
        return super().from_config(config)


class _AdapterPosterior(BayesianLayer):
    """``q(A_l) = N(M_l, diag(sigma_l^2))`` for each LoRA layer ``l`` of a :class:`VariationalLoRAModel`.

    Holds one ``rho_l`` per layer, the KL weight, the seed generator and the sampling switch
    (so :func:`tfbnn.set_kl_weight`, :class:`tfbnn.KLAnnealing`, :func:`tfbnn.posterior_mean`
    and :func:`tfbnn.weight_samples` find it like any Bayesian layer). The means ``M_l`` are
    the LoRA layers' own ``lora_kernel_a``, passed in by the model.
    """

    def __init__(self, shapes, prior=None, rho_initializer=None, kl_weight=None, inference_mode="sample", seed=None,
                 **kwargs):
        super().__init__(kl_weight=kl_weight, inference_mode=inference_mode, seed=seed, **kwargs)
        self.shapes = [tuple(shape) for shape in shapes]
        self.prior = _normal_prior(prior)
        self.rho_initializer = keras.initializers.get(
            keras.initializers.Constant(-5.0) if rho_initializer is None else rho_initializer)

    def build(self, input_shape=None):
        self.rhos = [self.add_weight(name=f"rho_{i}", shape=shape, initializer=self.rho_initializer, dtype="float32")
                     for i, shape in enumerate(self.shapes)]
        self._build_kl_weight()

    def scales_and_kl(self, means):
        """``[sigma_l]`` and ``sum_l KL(q(A_l) || p(A_l))`` (unscaled)."""
        pairs = [kl_lib.softplus_scale_and_normal_kl(m, rho, self.prior)
                 for m, rho in zip(_stored_values(means), self.rhos)]
        return [scale for scale, _ in pairs], tf.add_n([kl for _, kl in pairs])

    def sample(self, means, scales, num_samples=1):
        """``[A_l]``, each ``(num_samples, *M_l.shape)``: ``A_l = M_l + sigma_l eps_l``, one ``eps_l`` per layer from the
        seed generator, in layer order."""
        return [tf.convert_to_tensor(m) + scale * self._normal([num_samples, *scale.shape], scale.dtype)
                for m, scale in zip(_stored_values(means), scales)]

    def add_kl(self, kl, training):
        """Adds ``kl_weight * kl`` to the losses (the :class:`tfbnn.layers.BayesianLayer` convention)."""
        self._add_kl_loss(kl, training)


def _lora_spec(model):
    """``[[index, rank, alpha], ...]``: each LoRA layer's position among :func:`_dense_layers` and its LoRA."""
    return [[i, int(layer.lora_rank), float(layer.lora_alpha)] for i, layer in enumerate(_dense_layers(model))
            if getattr(layer, "lora_enabled", False)]


def _restore_lora(model, spec):
    """Enables LoRA, of the rank and alpha of ``spec`` (:func:`_lora_spec`), on the layers of a model rebuilt from
    its config (KerasHub's backbones do not keep ``enable_lora`` in their config)."""
    layers = _dense_layers(model)
    for index, rank, alpha in spec:
        if index >= len(layers):
            raise ValueError(f"Expected a Dense or EinsumDense layer at index {index} of the model. Received: "
                             f"model={model.name!r} with {len(layers)}")
        layer = layers[index]
        if not getattr(layer, "lora_enabled", False):
            layer.enable_lora(rank, lora_alpha=alpha)
        elif layer.lora_rank != rank:
            raise ValueError(f"Expected LoRA rank {rank} on layer {layer.name!r}. Received: lora_rank={layer.lora_rank}")
        # Keras 3.15's Dense and EinsumDense rebuilt from a config with `lora_rank` enable LoRA with alpha = rank,
        # whatever `lora_alpha` the config holds.
        layer.lora_alpha = alpha


@keras.saving.register_keras_serializable(package="tfbnn")
class VariationalLoRAModel(NetworkWrapper):
    """BLoB on a model's LoRA layers wherever they are nested: a Gaussian ``q(A)`` per layer (Wang et al. 2024).

    For each LoRA-enabled ``Dense`` / ``EinsumDense`` ``l`` found anywhere in ``model``
    (:func:`lora_layers`: also inside subclassed layers, e.g. KerasHub's
    ``TransformerEncoder -> CachedMultiHeadAttention -> EinsumDense`` after
    ``backbone.enable_lora(r)``), ``A_l`` gets the mean-field posterior
    ``q(A_l) = N(M_l, diag(sigma_l^2))``, ``M_l`` the layer's own ``lora_kernel_a``,
    ``sigma_l = softplus(rho_l) + 1e-6``; ``B_l`` (``lora_kernel_b``) and every other
    weight stay point estimates (Wang et al. 2024, sec. 3, BLoB's asymmetric
    parameterization). A call draws, by reparameterization,::

        A_l = M_l + sigma_l * eps_l,      eps_l ~ N(0, I)      (one draw per layer per call)

    and runs ``model`` with every ``lora_kernel_a`` read as its draw (a
    ``keras.StatelessScope`` mapping; the layer computes with ``W0 + s A_l B_l``), so
    gradients reach ``M_l``, ``rho_l`` and ``B_l``. It adds::

        kl_weight * sum_l KL(q(A_l) || p(A_l)),
        KL = sum log(p / sigma) + (sigma^2 + (M - m)^2) / (2 p^2) - 1/2      (prior N(m, p^2))

    to the losses, ``kl_weight = beta / N`` (the ELBO convention of
    :class:`tfbnn.layers.BayesianLayer`; :class:`tfbnn.KLAnnealing` and
    :func:`tfbnn.set_kl_weight` set it), so ``fit`` minimises the per-example negative
    ELBO ``mean NLL + beta KL / N`` of Wang et al. (eq. 7, without BLoB's KL
    re-weighting schedule). Variable updates that ``model`` makes in a call (dropout
    seed states, batch-norm statistics) are applied after it; losses that ``model``
    adds are kept.

    One ``A`` sample is shared by the whole batch of a call. In Monte Carlo prediction
    (:func:`tfbnn.predict`, :func:`tfbnn.weight_samples` with ``T`` samples) each of
    the ``T`` blocks of ``B`` rows gets its own draw: ``model`` then runs ``T`` times
    on ``B`` rows (unrolled in the traced graph), for ``joint=True`` and ``joint=False``
    alike (per-row marginals are the same; rows of a block are not independent).
    With ``inference_mode="mean"`` (or :func:`tfbnn.posterior_mean`) ``A_l = M_l``:
    the plain LoRA model.

    ``model``'s layers are shared, not copied: training the wrapper trains ``model``'s
    adapters, and its LoRA layers now save their variables unmerged (``W0``, bias,
    ``A``, ``B``; Keras' LoRA layers save ``W0 + s A B`` and zero ``A``, ``B`` on load,
    which would erase the posterior's means). The config records which layers have LoRA
    (their index among the model's ``Dense`` / ``EinsumDense`` and rank, alpha), so a
    ``.keras`` file of a KerasHub model, whose config does not keep ``enable_lora``,
    loads with its adapters; and which of its weights were frozen (``trainable=False``).

    Args:
        model: a built ``keras.Model`` (Sequential, functional or subclassed, e.g. a
            KerasHub task) with LoRA enabled on at least one ``Dense`` / ``EinsumDense``.
        prior: a :class:`tfbnn.priors.Normal` (or its name/config). Default ``N(0, 1)``.
        rho_initializer: initializer of each ``rho_l``; default ``Constant(-5.0)``
            (``sigma ~ 0.0067``: training starts at the fine-tuned adapter).
        kl_weight: float >= 0 or None, ``beta / N``.
        inference_mode: ``"sample"`` (default) or ``"mean"``.
        seed: int or None, seed of the posterior's ``keras.random.SeedGenerator``.

    Attributes:
        network: ``model``.
        posterior: the layer holding ``rho_l`` (``posterior.rhos``, in
            :attr:`adapter_layers` order), ``kl_weight`` and the seed generator.

    Input shape: ``model``'s. Output shape: ``model``'s.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, lora_rank=2)])
        >>> model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2)])  # LoRA one level down
        >>> bayes = tfbnn.lora.VariationalLoRAModel(model, kl_weight=1e-3, seed=0)
        >>> [tuple(v.shape) for v in bayes.posterior.rhos]
        [(4, 2)]
        >>> bayes(np.ones((5, 4), "float32")).shape
        TensorShape([5, 2])

    Reference:
        Wang, Shi, Han, Metaxas, Wang. BLoB: Bayesian Low-Rank Adaptation by
        Backpropagation for Large Language Models. NeurIPS 2024.
    """

    def __init__(self, model, prior=None, rho_initializer=None, kl_weight=None, inference_mode="sample", seed=None,
                 **kwargs):
        super().__init__(**kwargs)
        layers = _required_lora_layers(model)
        for layer in layers:
            _save_unmerged(layer)
        self.network = model
        self.posterior = _AdapterPosterior([layer.lora_kernel_a.shape for layer in layers], prior=prior,
                                           rho_initializer=rho_initializer, kl_weight=kl_weight,
                                           inference_mode=inference_mode, seed=seed, name="adapter_posterior")
        self.posterior.build()
        self.built = True

    @property
    def adapter_layers(self):
        """The LoRA layers of :attr:`network` (:func:`lora_layers`), in ``posterior.rhos`` order."""
        return lora_layers(self.network)

    def _means(self):
        return [layer.lora_kernel_a for layer in self.adapter_layers]

    def a_scales(self):
        """``[sigma_l]``, each shaped like its layer's ``lora_kernel_a``."""
        return self.posterior.scales_and_kl(self._means())[0]

    def kl_divergence(self):
        """``sum_l KL(q(A_l) || p(A_l))``, unscaled."""
        return self.posterior.scales_and_kl(self._means())[1]

    def sample_a(self, num_samples=1):
        """``[A_l]``, each ``(num_samples, *lora_kernel_a.shape)``, from ``q`` and the posterior's seed generator.

        With ``num_samples`` equal to the call's ``T`` (1 outside :func:`tfbnn.weight_samples`)
        these are the draws the next sampling call makes: it advances the generator the same way.
        """
        num_samples = checks.integer("num_samples", num_samples, 1)
        means = self._means()
        return self.posterior.sample(means, self.posterior.scales_and_kl(means)[0], num_samples)

    def call(self, inputs, training=None):
        posterior, means = self.posterior, self._means()
        scales, kl = posterior.scales_and_kl(means)
        if posterior._adds_kl:
            posterior.add_kl(kl, training)
        if not posterior._sampling(training):
            return self.network(inputs, training=training)
        num_samples = posterior.weight_samples[0]
        draws = posterior.sample(means, scales, num_samples)
        if num_samples == 1:
            return self._sampled_call(inputs, means, [a[0] for a in draws], training)
        blocks = tf.nest.map_structure(
            lambda v: tf.reshape(v, tf.concat([[num_samples, -1], tf.shape(v)[1:]], 0)), inputs)
        with weight_samples(self.network, 1):  # each block of rows is an ordinary call of the network
            if posterior._adds_kl:  # training on T samples: the model's own losses are kept, T copies traced
                outputs = [self._sampled_call(tf.nest.map_structure(lambda v: v[t], blocks), means,
                                              [a[t] for a in draws], training) for t in range(num_samples)]
                return tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *outputs)
            return self._mapped_calls(blocks, means, draws, training)

    def _mapped_calls(self, blocks, means, draws, training):
        """Monte Carlo prediction: block ``t`` of the ``(T, B, ...)`` inputs with the draws ``A_l[t]``, in a
        ``tf.map_fn`` (the network traced twice, not ``T`` times), rows ``(T B, ...)`` out. The model's own
        losses are dropped (a prediction has no use for them)."""
        first = self._sampled_call(tf.nest.map_structure(lambda v: v[0], blocks), means, [a[0] for a in draws],
                                   training)
        spec = tf.nest.map_structure(lambda y: tf.TensorSpec(y.shape, y.dtype), first)
        rest = tf.map_fn(lambda e: self._sampled_call(e[0], means, e[1], training, keep_losses=False),
                         (tf.nest.map_structure(lambda v: v[1:], blocks), [a[1:] for a in draws]),
                         fn_output_signature=spec, parallel_iterations=1)  # in order: seed updates apply in turn
        return tf.nest.map_structure(
            lambda y, ys: tf.concat([y, tf.reshape(ys, tf.concat([[-1], tf.shape(ys)[2:]], 0))], 0), first, rest)

    def _sampled_call(self, inputs, means, values, training, keep_losses=True):
        """``network(inputs)`` with each ``lora_kernel_a`` read as its value in ``values``; the variable updates
        the network made applied after (and its losses added, with ``keep_losses``)."""
        mapped = {id(m) for m in means}
        with keras.StatelessScope(state_mapping=list(zip(means, values)), collect_losses=keep_losses) as scope:
            outputs = self.network(inputs, training=training)
        for variable in self.network.variables:  # updates made inside the scope are only recorded there
            value = None if id(variable) in mapped else scope.get_current_value(variable)
            if value is not None:
                variable.assign(value)
        for loss in scope.losses:
            self.add_loss(loss)
        return outputs

    def compute_output_shape(self, input_shape):
        return self.network.compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        posterior = self.posterior
        config.update({"model": keras.saving.serialize_keras_object(self.network),
                       "prior": priors_lib.serialize(posterior.prior),
                       "rho_initializer": keras.initializers.serialize(posterior.rho_initializer),
                       "kl_weight": posterior._kl_weight_value, "inference_mode": posterior.inference_mode,
                       "seed": posterior.seed, "lora_layers": _lora_spec(self.network),
                       "frozen_weights": [i for i, v in enumerate(self.network.weights) if not v.trainable]})
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = copy.deepcopy(config)  # Keras' deserialization pops from the nested configs
        model = keras.saving.deserialize_keras_object(config.pop("model"), custom_objects=custom_objects)
        _restore_lora(model, config.pop("lora_layers"))
        weights = model.weights
        for i in config.pop("frozen_weights", []):  # e.g. KerasHub's enable_lora freezes all but the adapters
            weights[i].trainable = False
        return cls(model, **config)


def variational(model, prior=None, rho_initializer=None, kl_weight=None, seed=None):
    """BLoB (Wang et al. 2024) on ``model``'s LoRA layers: mean-field Gaussian posteriors over their ``A`` factors.

    Two routes, one posterior (``q(A) = N(M, diag(sigma^2))``, ``B`` and all other
    weights point estimates, ``kl_weight * KL`` added to the losses):

    * every LoRA layer is a top-level layer of ``model`` (Sequential or functional): a copy
      of ``model`` (``keras.models.clone_model``) with each LoRA layer wrapped, as a
      copy, in :class:`VariationalLoRA` (all other layers shared with ``model``; ``model``'s
      own layers save as before). Monte Carlo prediction draws an ``A`` per row.
    * otherwise (LoRA layers nested in sub-models or subclassed layers, e.g. a KerasHub
      task after ``backbone.enable_lora(r)``): :class:`VariationalLoRAModel` around
      ``model`` itself, sharing its layers. One ``A`` per call, per block of rows in
      Monte Carlo prediction.

    Args:
        model: a built ``keras.Model`` with LoRA enabled on a ``Dense`` or ``EinsumDense``.
        prior, rho_initializer, kl_weight: as :class:`VariationalLoRA`.
        seed: int or None; in the first route the ``i``-th LoRA layer gets ``seed + i``.

    Returns:
        A functional ``keras.Model`` of :class:`VariationalLoRA` layers, or a
        :class:`VariationalLoRAModel`.

    Example:
        >>> import keras, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, lora_rank=2)])
        >>> bayes = tfbnn.lora.variational(model, kl_weight=0.01, seed=0)
        >>> [type(layer).__name__ for layer in bayes.layers]
        ['VariationalLoRA']
        >>> nested = keras.Sequential([keras.Input((4,)), model])
        >>> type(tfbnn.lora.variational(nested, kl_weight=0.01, seed=0)).__name__
        'VariationalLoRAModel'
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
    seed = checks.seed(seed)
    targets = [layer for layer in model.layers if isinstance(layer, _LORA_TYPES) and layer.lora_enabled]
    if not targets or len(targets) < len(lora_layers(model)):  # some nested: out of clone_model's reach
        return VariationalLoRAModel(model, prior=prior, rho_initializer=rho_initializer, kl_weight=kl_weight,
                                    seed=seed)
    seeds = {id(layer): (None if seed is None else int(seed) + i) for i, layer in enumerate(targets)}

    def wrap(layer):
        if id(layer) not in seeds:
            return layer
        return VariationalLoRA(_copy(layer), prior=prior, rho_initializer=rho_initializer, kl_weight=kl_weight,
                               seed=seeds[id(layer)], name=f"{layer.name}_blob")

    return keras.models.clone_model(model, clone_function=wrap)

