"""The Laplace approximation of a trained Keras model: post-hoc weight uncertainty.

A network trained to a MAP estimate ``theta*`` (cross-entropy or squared error plus
weight decay) gets a Gaussian posterior ``q(theta) = N(theta*, Sigma)`` from the
curvature of the loss at ``theta*``, without retraining (MacKay 1992; Daxberger et
al. 2021, "Laplace Redux"). With the prior ``N(0, delta^-1 I)`` (``delta`` the
prior precision) the posterior precision is::

    Sigma^-1 = H + delta I,      H = sum_n J_n^T Lambda_n J_n            (the GGN)

``J_n = d f(x_n) / d theta`` is the Jacobian of the network's outputs (logits, or
regression means) and ``Lambda_n`` the Hessian of the negative log-likelihood in
those outputs: ``diag(p_n) - p_n p_n^T`` for a softmax (classification), ``I /
sigma^2`` for a Gaussian with noise std ``sigma`` (regression). The generalized
Gauss-Newton ``H`` is the Hessian without its second-order network term: it is
positive semi-definite, and for the last layer (outputs linear in its weights)
it *is* the Hessian.

Which weights and which structure (``subset``, ``hessian``):

========================  ==================================================  ========================
weights, structure        ``H`` is                                            memory
========================  ==================================================  ========================
``last_layer``, ``full``  the GGN of the last ``Dense`` layer's kernel and    ``((d + 1) K)^2``
                          bias, ``sum_n (phi_n phi_n^T) kron Lambda_n``
                          (``phi_n`` its input with a 1 appended)
``last_layer``, ``kron``  KFAC (Ritter et al. 2018), ``A kron G`` with        ``(d + 1)^2 + K^2``
                          ``A = sum_n phi_n phi_n^T`` and ``G = (1/N) sum_n
                          Lambda_n``: exact when ``Lambda_n`` is constant
                          (regression) or for one example
``last_layer``, ``diag``  the diagonal of the last layer's GGN                ``(d + 1) K``
``all``, ``diag``         the diagonal of the GGN of every trainable weight   ``P``
``all``, ``kron``         KFAC per ``Dense`` / ``Conv2D`` layer ``l`` (Martens  ``sum_l (in_l + 1)^2
                          & Grosse 2015; Grosse & Martens 2016): the block    + out_l^2``
                          ``A_l kron G_l``, ``A_l = sum_{n,t} a_nt a_nt^T``
                          over its inputs (a convolution's patches, a 1 for
                          the bias) at the ``S`` positions ``t`` it maps, ``G_l
                          = 1/(N S) sum_{n,t,k} g_ntk g_ntk^T`` with ``g_ntk =
                          d (L_n^T f_n)_k / d z_nt`` (``L_n L_n^T =
                          Lambda_n``, ``z`` its pre-activation); the blocks
                          between layers are dropped. Exact for one layer
                          and one example
``all``, ``full``         the GGN of every trainable weight (small networks,  ``P^2``
                          ``P <= 10^4``)
``subnetwork``, ``full``  the GGN of a chosen subset of the weights, the      ``P_sub^2``
                          others fixed at ``theta*`` (Daxberger et al. 2021):
                          ``subnetwork=n`` takes the ``n`` of largest
                          marginal variance under ``all``/``diag``
========================  ==================================================  ========================

A **prior precision per layer** ``delta_l`` (``optimize_prior_precision(per_layer=True)``;
``kron`` and ``diag``, whose eigenbases keep layers apart) makes the prior term
``sum_l (delta_l ||theta_l||^2 - P_l log delta_l) / 2`` in the evidence below. The callback
:class:`OnlineMarginalLikelihood` tunes the priors and the noise by that evidence during
``fit`` (Immer et al. 2021).

Parameters are ordered as the model's ``trainable_variables`` flattened (all), or
as the last layer's ``[kernel; bias]`` matrix ``(d + 1, K)`` flattened row-major
(last layer), so that ``J_n = phi_n^T kron I_K`` and ``H`` is a Kronecker sum.

**Marginal likelihood.** The Laplace approximation of the evidence (MacKay 1992;
Immer et al. 2021, eq. 4) for ``P`` parameters, at the MAP::

    log p(D | delta, sigma) ~ log p(D | theta*) - delta/2 ||theta*||^2
                              - 1/2 log det Sigma^-1 + P/2 log delta

tuned in ``log delta`` (and ``log sigma`` for regression) by
:meth:`Laplace.optimize_prior_precision`. ``log det Sigma^-1 = sum_i log(lambda_i / s +
delta)`` with ``lambda_i`` the eigenvalues of the GGN at ``sigma = 1`` and ``s =
sigma^2`` (``s = 1`` for classification), so each evaluation is ``O(P)``.

**Predictive.** The linearized (GLM) predictive (Immer, Korzepa, Bauer 2021)
replaces the network by its first-order Taylor expansion at ``theta*``, so the
function values are Gaussian::

    f(x) ~ N(f(x; theta*), J(x) Sigma J(x)^T)

exact for the last-layer approximation. For regression ``y ~ N(f(x; theta*),
J Sigma J^T + sigma^2 I)``. For classification the softmax of that Gaussian is
approximated by Monte Carlo, or by the probit approximation (MacKay 1992; Daxberger
et al. 2021, sec. 3.4)::

    p(y | x) ~ softmax(kappa * f(x; theta*)),   kappa_k = 1 / sqrt(1 + pi/8 * [J Sigma J^T]_kk)

The ``"nn"`` predictive samples weights from ``q`` and runs the network.
:meth:`Laplace.to_model` gives a Keras model whose last layer (:class:`LaplaceDense`)
samples from the posterior, so :func:`tfbnn.predict` reports the aleatoric and
epistemic split, and the model saves as ``.keras`` and exports.

Example:
    >>> import keras, numpy as np, tfbnn
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(64, 2)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8, activation="tanh"),
    ...                           keras.layers.Dense(2, activation="softmax")])
    >>> model.compile("adam", "sparse_categorical_crossentropy")
    >>> _ = model.fit(x, y, epochs=5, verbose=0)
    >>> la = tfbnn.laplace.fit(model, x, y, likelihood="classification", hessian="kron")
    >>> la = la.optimize_prior_precision(method="marglik")
    >>> la.predict(x[:3]).shape                          # probit predictive
    (3, 2)
    >>> res = tfbnn.predict(la.to_model(seed=1), x[:3], num_samples=50)
    >>> res.mutual_information.shape                     # the epistemic part
    (3,)

References:
    MacKay. A Practical Bayesian Framework for Backpropagation Networks. Neural
    Computation 4(3), 1992 (the Laplace evidence, the probit predictive).
    Ritter, Botev, Barber. A Scalable Laplace Approximation for Neural Networks.
    ICLR 2018 (Kronecker-factored curvature).
    Immer, Korzepa, Bauer. Improving Predictions of Bayesian Neural Nets via Local
    Linearization. AISTATS 2021 (the GLM predictive).
    Immer, Bauer, Fortuin, Ratsch, Khan. Scalable Marginal Likelihood Estimation for
    Model Selection in Deep Learning. ICML 2021.
    Martens, Grosse. Optimizing Neural Networks with Kronecker-factored Approximate
    Curvature. ICML 2015. Grosse, Martens. A Kronecker-factored Approximate Fisher Matrix
    for Convolution Layers. ICML 2016.
    Daxberger, Nalisnick, Allingham, Antoran, Hernandez-Lobato. Bayesian Deep Learning via
    Subnetwork Inference. ICML 2021.
    Daxberger, Kristiadi, Immer, Eschenhagen, Bauer, Hennig. Laplace Redux --
    Effortless Bayesian Deep Learning. NeurIPS 2021.
"""

import json
import math

import keras
import numpy as np
import scipy.optimize
import tensorflow as tf

from tfbnn._internal import checks, keras_private
from tfbnn._internal.curvature import Probes, pre_activation
from tfbnn.inference import FittedPosterior, FlatWeights, RegressionPrediction
from tfbnn.layers.base import StochasticLayer, input_features
from tfbnn.likelihoods import GaussianHead

__all__ = [
    "Laplace",
    "LaplaceDense",
    "fit",
    "load",
    "OnlineMarginalLikelihood",
    "LIKELIHOODS",
    "SUBSETS",
    "HESSIANS",
    "PRED_TYPES",
    "LINK_APPROXIMATIONS",
    "PRIOR_METHODS",
]

LIKELIHOODS = ("classification", "regression")
SUBSETS = ("last_layer", "all", "subnetwork")
HESSIANS = ("full", "kron", "diag")
PRED_TYPES = ("glm", "nn")
LINK_APPROXIMATIONS = ("probit", "mc")
PRIOR_METHODS = ("marglik", "val_nll")
STRUCTURES = ("full", "kron", "diag")
#: The largest number of weights ``subset="all", hessian="full"`` accepts (a P x P matrix).
MAX_FULL_PARAMETERS = 10_000
# The raw scale a LaplaceDense outputs for a following GaussianHead: softplus(-1e4) is 0.
_RAW_SCALE = -1e4
_DEFAULT_BATCH = {"last_layer": 256, "all": 32, "subnetwork": 32}


def _choice(name, value, options):
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"Expected `{name}` in {options}. Received: {name}={value!r}")
    return value


def _positive(name, value):
    return checks.number(name, value, low=0, low_open=True)


# -- the network: features, last layer, parameters ------------------------------------
class _Network:
    """A trained model seen as ``f(x) = phi(x) @ kernel + bias``: its last ``Dense`` layer's
    pre-activation (logits or regression means) on top of a feature model sharing its layers."""

    def __init__(self, model, likelihood, subset, variables=None):
        if not isinstance(model, keras.Model):
            raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
        try:
            outputs = model.outputs
        except (AttributeError, ValueError):
            outputs = None
        if not outputs:
            raise ValueError(
                "Expected a built Sequential or functional model (its last layer is read from its graph; a "
                f"subclassed model has none). Received: model={model.name!r}")
        if len(outputs) != 1:
            raise ValueError(f"Expected a model with one output. Received: {len(outputs)} outputs")
        last = keras_private.output_layer(model)
        if not isinstance(last, keras.layers.Dense):
            raise ValueError(
                "Expected the model to end in a keras.layers.Dense layer (its weights are the last layer "
                f"of the Laplace approximation). Received: last layer {last.name!r} of type {type(last).__name__}")
        activation = getattr(last.activation, "__name__", None)
        allowed = ("linear", "softmax") if likelihood == "classification" else ("linear",)
        if activation not in allowed:
            raise ValueError(
                f"Expected the last layer's activation in {allowed} for likelihood={likelihood!r} (the "
                f"approximation works on its pre-activation). Received: activation={activation!r}")
        if likelihood == "classification" and last.units < 2:
            raise ValueError(
                "Expected at least 2 output units for classification (a softmax over K >= 2 classes; for a "
                f"binary task use Dense(2, 'softmax')). Received: units={last.units}")
        if len(last.input.shape) != 2:
            raise ValueError(
                f"Expected the last Dense layer's input to be (batch, features). Received: shape {last.input.shape}")
        self.model, self.last, self.subset = model, last, subset
        # One input as a tensor, not a one-element list: calls then pass a bare array.
        self.inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        self.features = keras.Model(self.inputs, last.input)
        self.units = last.units
        self.use_bias = last.use_bias
        if subset == "last_layer":
            self.variables = None
        else:
            self.variables = list(model.trainable_variables) if variables is None else list(variables)
        # subset="subnetwork": the chosen positions in the flat weights, and the weights they sit in (theta*)
        self.indices, self.anchor = None, None
        self._jacobian = None

    @property
    def input_dim(self):
        return self.last.kernel.shape[0] + int(self.use_bias)

    def last_layer_weights(self):
        """The last layer's ``[kernel; bias]`` ``(d + 1, K)`` (float64)."""
        kernel = np.asarray(self.last.kernel.numpy(), np.float64)
        if not self.use_bias:
            return kernel
        return np.concatenate([kernel, np.asarray(self.last.bias.numpy(), np.float64)[None]], axis=0)

    def parameters(self):
        """``theta*`` (P,) float64, in the order of the module docstring."""
        if self.subset == "last_layer":
            return self.last_layer_weights().ravel()
        flat = self.all_parameters()
        return flat if self.indices is None else flat[self.indices]

    def all_parameters(self):
        """Every weight of ``variables`` flattened (P_all,), float64."""
        return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in self.variables])

    def phi(self, x):
        """Last-layer inputs with a 1 appended for the bias, ``(B, d + 1)`` float64."""
        phi = np.asarray(self.features(x, training=False), np.float64)
        if self.use_bias:
            phi = np.concatenate([phi, np.ones((phi.shape[0], 1))], axis=1)
        return phi

    def outputs(self, x):
        """``f (B, K)``, float64."""
        f = keras.ops.matmul(self.features(x, training=False), self.last.kernel)
        return np.asarray(f + self.last.bias if self.use_bias else f, np.float64)

    def outputs_and_jacobian(self, x):
        """``f (B, K)`` and ``J = df/dtheta (B, K, P)`` over all trainable weights, float64."""
        leaves = [tf.cast(v, t.dtype) for v, t in zip(tf.nest.flatten(x), tf.nest.flatten(self.inputs))]
        x = tf.nest.pack_sequence_as(x, leaves)
        if self._jacobian is None:  # one trace: the batch axis is left unknown
            self._jacobian = self._make_jacobian(
                tf.nest.map_structure(lambda v: tf.TensorSpec([None, *v.shape[1:]], v.dtype), x))
        f, jac = self._jacobian(x)
        jac = np.asarray(jac, np.float64)
        return np.asarray(f, np.float64), jac if self.indices is None else jac[..., self.indices]

    def _make_jacobian(self, signature):
        variables, last, features = self.variables, self.last, self.features

        def one_example(x):  # f (K,) and its Jacobian (K, P) for one example
            with tf.GradientTape() as tape:
                f = keras.ops.matmul(features(tf.nest.map_structure(lambda v: v[None], x), training=False),
                                     last.kernel)
                if last.use_bias:
                    f = f + last.bias
            parts = tape.jacobian(f, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return f[0], tf.concat([tf.reshape(j, [last.units, -1]) for j in parts], axis=-1)

        @tf.function(input_signature=[signature])
        def jacobian(x):
            # Vectorized over the examples, each with its own K backward passes: the Jacobian of the whole
            # batch's (B, K) outputs ran B K backward passes through all B examples (B times the work).
            return tf.vectorized_map(one_example, x)

        return jacobian

    def assign(self, theta):
        """Writes the flat ``theta`` (P,) into the weights it came from."""
        if self.subset == "last_layer":
            w = theta.reshape(self.input_dim, self.units)
            self.last.kernel.assign(w[: self.last.kernel.shape[0]].astype(self.last.kernel.dtype))
            if self.use_bias:
                self.last.bias.assign(w[-1].astype(self.last.bias.dtype))
            return
        if self.indices is not None:
            full = self.anchor.copy()
            full[self.indices] = theta
            theta = full
        start = 0
        for v in self.variables:
            size = int(np.prod(v.shape))
            v.assign(theta[start: start + size].reshape(v.shape).astype(v.dtype))
            start += size


# -- data ------------------------------------------------------------------------------
def _num_rows(x):
    return int(tf.nest.flatten(x)[0].shape[0])


def _finite(values, name):
    """``values`` (an array, or a list/dict of them) as NumPy arrays; a ValueError naming ``name`` for NaN or inf
    (which would surface in fitting as NumPy's "Eigenvalues did not converge", and in predictions as NaN)."""
    return tf.nest.map_structure(lambda v: checks.finite_array(name, v), values)


def _batches(x, y, batch_size, need_targets=True):
    """``(x, y)`` batches from arrays, or from a batched ``tf.data.Dataset`` of ``(x, y)``; the inputs (to fit
    or to predict) and the targets of a fit (``need_targets``) must be finite."""
    if isinstance(x, tf.data.Dataset):
        if y is not None:
            raise ValueError(f"A tf.data.Dataset yields (x, y): do not pass `y`. Received: y of type {type(y).__name__}")
        for element in x:
            if need_targets and not (isinstance(element, (tuple, list)) and len(element) >= 2):
                raise ValueError("Expected a dataset of (x, y) batches. Received: elements without targets")
            xb, yb = (element[0], element[1]) if isinstance(element, (tuple, list)) else (element, None)
            _finite(xb, "x")  # NaN inputs would give NaN predictions: refused, as tfbnn.predict does
            if need_targets:
                _finite(yb, "y")
            yield xb, yb
        return
    if x is None:
        raise ValueError("Expected inputs `x`. Received: x=None")
    x = _finite(x, "x")
    num = _num_rows(x)
    if num == 0:
        raise ValueError("Expected at least one example. Received: x with 0 examples")
    if need_targets:
        if y is None:
            raise ValueError("Expected targets `y` with array inputs. Received: y=None")
        y = _finite(y, "y")
        if len(y) != num:
            raise ValueError(f"Expected as many targets as inputs. Received: {num} inputs, y of shape {y.shape}")
    for start in range(0, num, batch_size):
        xb = tf.nest.map_structure(lambda v, s=start: v[s: s + batch_size], x)
        yield xb, (None if y is None else y[start: start + batch_size])


def _targets(y, f, likelihood):
    """``y`` as (B,) int labels or (B, K) label probabilities (classification), (B, K) floats (regression)."""
    y = np.asarray(y)
    units = f.shape[-1]
    if likelihood == "classification":
        if y.ndim == 2 and y.shape[-1] == units:  # one-hot or label probabilities (K >= 2)
            return y.astype(np.float64)
        labels = y.reshape(len(y))
        if not np.issubdtype(labels.dtype, np.number) or np.any(labels < 0) or np.any(labels >= units) or np.any(
                labels != np.round(labels)):
            raise ValueError(f"Expected integer labels in [0, {units}) or one-hot targets (N, {units}). "
                             f"Received: y of shape {y.shape} and dtype {y.dtype}")
        return labels.astype(np.int64)
    if y.size != f.size:
        raise ValueError(f"Expected regression targets shaped like the outputs {f.shape}. Received: y of shape {y.shape}")
    return y.reshape(f.shape).astype(np.float64)


def _log_softmax(f):
    f = f - f.max(axis=-1, keepdims=True)
    return f - np.log(np.exp(f).sum(axis=-1, keepdims=True))


def _softmax(f):
    return np.exp(_log_softmax(f))


def _label_log_probs(log_p, y):
    """Per-example ``log p(y | x)`` for int labels (B,) or label probabilities (B, K)."""
    if y.ndim == 2:
        return (y * log_p).sum(axis=-1)
    return log_p[np.arange(len(y)), y]


def _output_hessian(f, likelihood):
    """``Lambda_n`` (B, K, K): ``diag(p) - p p^T`` for a softmax, ``I`` for a Gaussian at sigma = 1."""
    if likelihood == "regression":
        return np.broadcast_to(np.eye(f.shape[-1]), (len(f), f.shape[-1], f.shape[-1]))
    p = _softmax(f)
    return np.einsum("bk,kl->bkl", p, np.eye(p.shape[-1])) - np.einsum("bk,bl->bkl", p, p)


def _output_hessian_root(f, likelihood, jac):
    """``L_n^T J_n`` (B, K, P) with ``L_n L_n^T = Lambda_n``; for a softmax ``L = diag(sqrt p) - p sqrt(p)^T``,
    so row ``k`` is ``sqrt(p_k) (J_k - p^T J)``."""
    if likelihood == "regression":
        return jac
    p = _softmax(f)
    return np.sqrt(p)[..., None] * (jac - np.einsum("bk,bkp->bp", p, jac)[:, None, :])


def _add(a, b):
    """``a + b`` for arrays, elementwise for tuples of arrays (Kronecker factors)."""
    return tuple(u + v for u, v in zip(a, b)) if isinstance(a, tuple) else a + b


# -- per-layer terms: KFAC over every layer (Laplace-LoRA's factors use the same probes) ----
def _kfac_layers(model, variables):
    """The ``Dense`` and ``Conv2D`` layers whose ``[kernel, bias]`` are ``variables``, in order: KFAC's blocks
    (``subset="all"``, ``hessian="kron"``); a ValueError naming the first layer that is not one."""
    advice = "use hessian='diag' or 'full', or make its weights non-trainable"
    layers, expected = [], []
    for layer in model.layers:
        if not layer.trainable_weights:
            continue
        dense = isinstance(layer, keras.layers.Dense) and not getattr(layer, "lora_enabled", False)
        conv = (isinstance(layer, keras.layers.Conv2D) and layer.data_format == "channels_last"
                and layer.groups == 1)
        own = [layer.kernel] + ([layer.bias] if getattr(layer, "bias", None) is not None else []) if (
            dense or conv) else []
        if not own or [id(v) for v in layer.trainable_weights] != [id(v) for v in own]:
            raise ValueError(
                "hessian='kron' with subset='all' is KFAC per layer: every trainable weight must be the kernel or "
                "bias of a keras.layers.Dense or Conv2D (channels_last, groups=1) at the top of the model; "
                f"{advice}. Received: layer {layer.name!r} of type {type(layer).__name__} with trainable weights "
                f"{[v.path for v in layer.trainable_weights]}")
        layers.append(layer)
        expected += own
    if [id(v) for v in expected] != [id(v) for v in variables]:
        raise ValueError(
            "hessian='kron' with subset='all' needs the model's trainable weights to be its layers' kernels and "
            f"biases in layer order; {advice}. Received: trainable weights {[v.path for v in variables]}")
    return layers


def _kfac_inputs(layer, inputs):
    """KFAC's inputs ``a`` (B S, in [+ 1]) of a layer: its input at each of the S positions it maps (a
    ``Conv2D``'s image patches, ordered as its kernel's ``(kh, kw, in)``), with a 1 appended for the bias."""
    if isinstance(layer, keras.layers.Conv2D):
        kh, kw = layer.kernel_size
        inputs = tf.image.extract_patches(
            tf.constant(inputs, tf.float64), sizes=[1, kh, kw, 1], strides=[1, *layer.strides, 1],
            rates=[1, *layer.dilation_rate, 1], padding=layer.padding.upper()).numpy()
    a = inputs.reshape(-1, inputs.shape[-1])
    return np.concatenate([a, np.ones((len(a), 1))], axis=1) if layer.bias is not None else a


# -- posterior bases: Sigma = B diag(1 / (lambda / s + delta)) B^T -------------------------
class _DenseBasis:
    """Eigenvectors ``U`` (P, P) of a full GGN."""

    def __init__(self, hessian):
        self.values, self.vectors = np.linalg.eigh(hessian)
        self.values = np.maximum(self.values, 0.0)  # a PSD matrix; round-off can make tiny negatives

    def rotate(self, e):
        return e @ self.vectors.T

    def project_jacobian(self, jac):
        return _Projection(jac @ self.vectors)

    def project_features(self, phi, units):
        u = self.vectors.reshape(phi.shape[1], units, -1)
        return _Projection(np.tensordot(phi, u, axes=1))


class _KroneckerBasis:
    """Eigenvectors ``Q_A kron Q_G`` with eigenvalues ``values`` (P,), ordered ``(i, j)`` row-major:
    KFAC's ``A kron G`` (``values = a_i g_j``), or the last layer's diagonal (identity rotations)."""

    def __init__(self, qa, qg, values):
        self.qa, self.qg = qa, qg
        self.values = np.maximum(values, 0.0)

    @classmethod
    def of_factors(cls, a, g):
        (a_values, qa), (g_values, qg) = np.linalg.eigh(a), np.linalg.eigh(g)
        return cls(qa, qg, np.outer(a_values, g_values).ravel())

    def rotate(self, e):
        shape = e.shape[:-1] + self.values.shape
        m = e.reshape(e.shape[:-1] + (len(self.qa), len(self.qg)))
        return (self.qa @ m @ self.qg.T).reshape(shape)

    def project_features(self, phi, units):
        return _KroneckerProjection(np.square(phi @ self.qa), self.qg)


class _BlockKroneckerBasis:
    """Eigenvectors ``blockdiag(Q_A1 kron Q_G1, Q_A2 kron Q_G2, ...)``: KFAC per weight matrix, from the factors
    ``(A_1, G_1, A_2, G_2, ...)`` (``subset="all"`` with per-layer factors, :class:`tfbnn.lora.LoRALaplace`)."""

    def __init__(self, factors):
        self.blocks = [_KroneckerBasis.of_factors(a, g) for a, g in zip(factors[::2], factors[1::2])]
        self.values = np.concatenate([b.values for b in self.blocks])
        self.splits = np.cumsum([b.values.size for b in self.blocks])[:-1]

    def rotate(self, e):
        return np.concatenate([b.rotate(part) for b, part in zip(self.blocks, np.split(e, self.splits, axis=-1))],
                              axis=-1)

    def project_jacobian(self, jac):
        parts = []
        for b, part in zip(self.blocks, np.split(jac, self.splits, axis=-1)):
            m = part.reshape(part.shape[:2] + (len(b.qa), len(b.qg)))
            # Q_A^T M Q_G as two matrix products: einsum("nkio,ia,ob->nkab") contracts both indices at once,
            # O(N K I^2 O^2) (9 minutes for 20 LeNet-5 examples), against O(N K (I^2 O + I O^2)).
            parts.append((b.qa.T @ m @ b.qg).reshape(part.shape))
        return _Projection(np.concatenate(parts, axis=-1))


class _DiagonalBasis:
    """The identity: a diagonal GGN over all weights."""

    def __init__(self, diagonal):
        self.values = np.maximum(diagonal, 0.0)

    def rotate(self, e):
        return e

    def project_jacobian(self, jac):
        return _Projection(jac)


class _Projection:
    """``R = J B`` (N, K, P): the function covariance is ``R diag(w) R^T``."""

    def __init__(self, r):
        self.r = r

    def variance(self, w):
        return np.matmul(self.r * w, np.swapaxes(self.r, 1, 2))


class _KroneckerProjection:
    """``(phi^T Q_A)^2`` (N, d+1) and ``Q_G``: the covariance ``Q_G diag((phi^T Q_A)^2 W) Q_G^T``."""

    def __init__(self, u2, qg):
        self.u2, self.qg = u2, qg

    def variance(self, w):
        c = self.u2 @ w.reshape(self.u2.shape[1], -1)
        return np.einsum("jk,nk,lk->njl", self.qg, c, self.qg)


# -- the approximation -------------------------------------------------------------------
class Laplace(FittedPosterior):
    """The Laplace approximation ``N(theta*, (H + delta I)^-1)`` of a trained Keras model.

    The model is a Sequential or functional Keras model that ends in a
    ``keras.layers.Dense`` layer: its pre-activation ``f(x)`` is the logits (a softmax
    or linear output, classification) or the regression means (linear output).
    The math, the structures and the references are in the module docstring
    (:mod:`tfbnn.laplace`). Shaped like the PyTorch Laplace library's
    ``Laplace(model, likelihood, subset_of_weights, hessian_structure)``: construct,
    :meth:`fit` on the training data, optionally :meth:`optimize_prior_precision`,
    then :meth:`predict` or :meth:`to_model`. :func:`fit` does the first two steps.

    A fitted ``Laplace`` is a :class:`tfbnn.inference.FittedPosterior`, used as SWAG
    and HMC posteriors are: ``tfbnn.predict(la, x, num_samples=T, seed=s)`` runs the
    network with T weight draws ``theta_t ~ q`` (the ``"nn"`` predictive; for the last
    layer the exact linearized one), :meth:`save` and
    :func:`tfbnn.inference.load_posterior` save it, ``tfbnn.export.export(la, path)``
    exports it. Any ``subset`` and ``hessian``.

    Args:
        model: the trained ``keras.Model`` (its weights are the MAP ``theta*``; they are
            read, never changed, except transiently by ``predict(pred_type="nn")`` with
            ``subset="all"``).
        likelihood: ``"classification"`` (softmax cross-entropy) or ``"regression"``
            (Gaussian with noise std ``sigma_noise``).
        subset: ``"last_layer"`` (default), ``"all"`` (every trainable weight) or
            ``"subnetwork"`` (the weights ``subnetwork`` names).
        hessian: ``"full"``, ``"kron"`` or ``"diag"``; None (default) is ``"kron"`` for the
            last layer, ``"diag"`` for all weights and ``"full"`` for a subnetwork.
            ``subset="all"`` takes ``"diag"``, ``"kron"`` (KFAC per layer: every trainable
            weight in a ``Dense`` or ``Conv2D``), or ``"full"`` for at most
            :data:`MAX_FULL_PARAMETERS` weights; ``"subnetwork"`` takes ``"full"``.
        prior_precision: float > 0, ``delta`` of the prior ``N(0, delta^-1 I)``, or one
            value per layer (:attr:`prior_groups`; ``"kron"`` and ``"diag"``). Default 1.
        sigma_noise: float > 0, the regression noise std ``sigma``. Default 1 (it must
            stay 1 for classification).
        subnetwork: ``subset="subnetwork"`` only: an int ``n`` (the ``n`` weights of largest
            marginal variance under a diagonal Laplace over every weight at the same prior,
            chosen by :meth:`fit`; Daxberger et al. 2021), a boolean mask over the flattened
            trainable weights ``(P_all,)`` or one per trainable weight, or flat indices.

    Attributes:
        mean: ``(P,)`` float64, ``theta*`` (after :meth:`fit`).
        num_parameters: P.
        num_data: N, the training examples seen by :meth:`fit`.
        prior_precision, sigma_noise: the current hyperparameters (floats).
        hessian_factors: the GGN at ``sigma = 1``: ``(P, P)`` (full), ``(A, G)`` with
            ``A`` ``(d+1, d+1)`` and ``G`` ``(K, K)`` (kron, last layer) or ``(A_1, G_1,
            A_2, G_2, ...)`` one pair per layer (kron, all), ``(P,)`` (diag).
        subnetwork_indices: the subnetwork's flat positions (sorted), or None.
    """

    def __init__(self, model, likelihood="classification", subset="last_layer", hessian=None,
                 prior_precision=1.0, sigma_noise=1.0, subnetwork=None):
        self.likelihood = _choice("likelihood", likelihood, LIKELIHOODS)
        self.subset = _choice("subset", subset, SUBSETS)
        if hessian is None:
            hessian = {"last_layer": "kron", "all": "diag", "subnetwork": "full"}[subset]
        self.hessian = _choice("hessian", hessian, HESSIANS)
        if subset == "subnetwork" and hessian != "full":
            raise ValueError("subset='subnetwork' is a full-covariance Laplace over the chosen weights (Daxberger "
                             f"et al. 2021): it takes hessian='full'. Received: hessian={hessian!r}")
        if (subnetwork is None) == (subset == "subnetwork"):
            raise ValueError("`subnetwork` (the weights' count or mask) goes with subset='subnetwork', and only with "
                             f"it. Received: subset={subset!r}, subnetwork of type {type(subnetwork).__name__}")
        self.sigma_noise = _positive("sigma_noise", sigma_noise)
        if likelihood == "classification" and self.sigma_noise != 1.0:
            raise ValueError("`sigma_noise` is the regression noise std; classification has none. "
                             f"Received: likelihood='classification', sigma_noise={sigma_noise!r}")
        self.model = model
        self._net = _Network(model, likelihood, subset, self._subset_variables(model))
        self._kfac = self._kron_layers(model) if subset == "all" and self.hessian == "kron" else None
        self._traced_terms = None
        self._groups = self._group_sizes()
        self.prior_precision = self._prior("prior_precision", prior_precision)
        self._subnetwork_size = None
        if subset == "subnetwork":
            self._choose_subnetwork(subnetwork)
        self.mean = None
        self.num_data = 0
        self.hessian_factors = None
        self._fit_terms = None  # classification: summed NLL; regression: SSE and output count
        self._basis = None

    kind = "laplace"

    @property
    def task(self):
        """The task of :meth:`forward`'s outputs: class probabilities, or regression means."""
        return self.likelihood

    def _subset_variables(self, model):
        """The weights of ``subset="all"``: None for every trainable weight (a subclass picks others)."""
        return None

    def _kron_layers(self, model):
        """The layers of KFAC over every weight (``subset="all"``, ``hessian="kron"``), one block each."""
        return _kfac_layers(model, self._net.variables)

    # -- fitting ------------------------------------------------------------------
    @property
    def num_parameters(self):
        if self.subset == "last_layer":
            return self._net.input_dim * self._net.units
        if self.subset == "subnetwork":
            return self._subnetwork_size if self._net.indices is None else len(self._net.indices)
        return self._num_weights()

    def _num_weights(self):
        return int(sum(np.prod(v.shape) for v in self._net.variables))

    # -- the weights' groups (a prior precision each) and the subnetwork ------------------
    def _group_sizes(self):
        """``[(name, size), ...]``: the layers' parameter groups in ``theta``'s order (one per layer for
        ``subset="all"``, consecutive weights of one layer; one group otherwise), each with a prior precision
        when it is tuned per layer."""
        if self.subset != "all":
            return [(self._net.last.name if self.subset == "last_layer" else "subnetwork", None)]
        groups = []
        for v in self._net.variables:
            owner = v.path.rsplit("/", 1)[0]
            if groups and groups[-1][0] == owner:
                groups[-1][1] += int(np.prod(v.shape))
            else:
                groups.append([owner, int(np.prod(v.shape))])
        return [(owner.rsplit("/", 1)[-1], size) for owner, size in groups]

    @property
    def prior_groups(self):
        """The names of the parameter groups (layers) a per-layer ``prior_precision`` lists, in order."""
        return [name for name, _ in self._groups]

    def _prior(self, name, value):
        """A prior precision: a float > 0, or one per group (a (G,) float64 array) where it keeps the posterior's
        structure (not ``"full"`` over several layers: a per-layer prior does not commute with its eigenbasis)."""
        if np.ndim(value) == 0:
            return _positive(name, value)
        values = np.asarray(value, np.float64).ravel()
        if len(values) != len(self._groups):
            raise ValueError(f"Expected `{name}` to be a float or one value per layer, {len(self._groups)} for "
                             f"{self.prior_groups}. Received: {name} with {len(values)} values")
        for v in values:
            _positive(name, v)
        if len(values) > 1 and self.hessian == "full":
            raise ValueError(f"A per-layer `{name}` takes hessian='kron' or 'diag' (a full posterior's "
                             f"eigenbasis mixes layers). Received: hessian='full' with {len(values)} values")
        return values

    def _delta_vector(self, delta):
        """``delta`` per parameter: the float itself, or each group's value repeated over its weights."""
        if np.ndim(delta) == 0:
            return delta
        return np.repeat(delta, [size or self.num_parameters for _, size in self._groups])

    def _choose_subnetwork(self, subnetwork):
        """``subnetwork``: an int n (the n weights of largest marginal variance under a diagonal Laplace, chosen
        by :meth:`fit`), a boolean mask over the flat weights (P_all,) or one per trainable weight, or the flat
        indices (1-D ints)."""
        total = self._num_weights()
        if isinstance(subnetwork, (int, np.integer)) and not isinstance(subnetwork, bool):
            self._subnetwork_size = checks.integer("subnetwork", subnetwork, 1, min(total, MAX_FULL_PARAMETERS))
            return
        if isinstance(subnetwork, (list, tuple)) and len(subnetwork) == len(self._net.variables) and all(
                np.shape(m) == tuple(v.shape) for m, v in zip(subnetwork, self._net.variables)):
            subnetwork = np.concatenate([np.asarray(m).ravel() for m in subnetwork])
        mask = np.asarray(subnetwork)
        if mask.dtype == bool and mask.shape == (total,):
            indices = np.flatnonzero(mask)
        elif mask.ndim == 1 and np.issubdtype(mask.dtype, np.integer) and np.all((mask >= 0) & (mask < total)):
            indices = np.unique(mask)
        else:
            raise ValueError(
                f"Expected `subnetwork` to be a count, a boolean mask of the {total} trainable weights (flat, or one "
                "array per trainable weight), or flat indices in [0, P). Received: subnetwork of shape "
                f"{mask.shape} and dtype {mask.dtype}")
        if not 1 <= len(indices) <= MAX_FULL_PARAMETERS:
            raise ValueError(f"Expected a subnetwork of 1 to {MAX_FULL_PARAMETERS} weights (a full covariance). "
                             f"Received: {len(indices)} weights")
        self._net.indices = indices

    @property
    def subnetwork_indices(self):
        """The subnetwork's positions in the flat trainable weights (sorted ints), or None."""
        return self._net.indices

    def _select_subnetwork(self, x, y, batch_size):
        """The ``n`` weights of largest marginal variance under a diagonal Laplace over every weight at the same
        prior (Daxberger et al. 2021, sec. 4; the Laplace library's ``LargestVarianceDiagLaplaceSubnetMask``)."""
        diagonal = Laplace(self.model, self.likelihood, "all", "diag", self.prior_precision, self.sigma_noise)
        variance = diagonal.fit(x, y, batch_size=batch_size).posterior_covariance
        self._net.indices = np.sort(np.argsort(-variance, kind="stable")[: self._subnetwork_size])

    def fit(self, x, y=None, batch_size=None):
        """Computes ``theta*``, the GGN and the training loss at ``theta*``.

        Args:
            x: training inputs (an array, or a list/dict of them), or a batched
                ``tf.data.Dataset`` of ``(x, y)``.
            y: targets: int labels ``(N,)`` or one-hot ``(N, K)`` for classification,
                ``(N, K)`` (or ``(N,)`` for ``K = 1``) for regression; None with a dataset.
            batch_size: int or None, examples per step (default 256 for the last layer,
                32 for all weights: the Jacobian is ``(batch, K, P)``).

        Returns:
            ``self``.
        """
        batch_size = self._batch_size(batch_size)
        if self.subset == "all" and self.hessian == "full" and self.num_parameters > MAX_FULL_PARAMETERS:
            raise ValueError(
                f"Expected at most {MAX_FULL_PARAMETERS} weights with subset='all', hessian='full' (a P x P "
                f"matrix); use hessian='diag' or subset='last_layer'. Received: a model with {self.num_parameters} "
                "trainable weights")
        if self._subnetwork_size is not None:
            self._select_subnetwork(x, y, batch_size)
        if self.subset == "subnetwork":
            self._net.anchor = self._net.all_parameters()
        curvature, terms, num = self._accumulate(_batches(x, y, batch_size))
        if num == 0:
            raise ValueError("Expected at least one training batch. Received: an empty dataset")
        self.mean, self.num_data, self._fit_terms = self._net.parameters(), num, terms
        self.hessian_factors = curvature
        self._basis = self._make_basis(curvature)
        return self

    def _accumulate(self, batches):
        terms = {"nll": 0.0, "sse": 0.0, "outputs": 0}
        curvature, num = None, 0
        for xb, yb in batches:
            f, part = self._batch_curvature(xb)
            curvature = part if curvature is None else _add(curvature, part)
            self._add_loss_terms(terms, f, _targets(yb, f, self.likelihood))
            num += len(f)
        if self.hessian == "kron" and curvature is not None:
            curvature = self._average_output_factors(curvature, num)
        return curvature, terms, num

    def _batch_curvature(self, x):
        """``f(x; theta*)`` (B, K) and the batch's GGN in the structure of ``hessian`` (summed over the batch)."""
        if self.subset == "last_layer":
            phi = self._net.phi(x)
            f = phi @ self._net.last_layer_weights()
            return f, self._last_layer_curvature(phi, _output_hessian(f, self.likelihood))
        if self._kfac is not None:
            return self._kfac_curvature(x)
        f, jac = self._net.outputs_and_jacobian(x)
        root = _output_hessian_root(f, self.likelihood, jac)
        if self.hessian == "diag":
            return f, np.square(root).sum(axis=(0, 1))
        return f, np.tensordot(root, root, axes=([0, 1], [0, 1]))

    def _hessian_root(self, f, jac):
        """``L_n^T J_n`` (B, K, P), ``L_n L_n^T = Lambda_n``, for Jacobians ``jac`` (B, K, P) of the outputs ``f``."""
        return _output_hessian_root(f, self.likelihood, jac)

    def _average_output_factors(self, factors, num):
        """KFAC's ``(A_1, G_1, A_2, G_2, ...)`` summed over ``num`` examples -> ``(A_1, G_1 / num, ...)``."""
        return tuple(m / num if i % 2 else m for i, m in enumerate(factors))

    def _kfac_curvature(self, x):
        """``f`` and KFAC's ``(A_l, G_l)`` per layer (Martens & Grosse 2015; Grosse & Martens 2016 for a
        convolution), summed over the batch: ``A = sum_{n,t} a_nt a_nt^T``, ``G = 1/S sum_{n,t,k} g_ntk g_ntk^T``
        with ``g_ntk = d (L_n^T f_n)_k / d z_nt`` (the module docstring); ``G`` is divided by N at the end."""
        f, inputs, sensitivities = self._layer_terms(x, self._kfac)
        parts = []
        for layer in self._kfac:
            a = _kfac_inputs(layer, inputs[id(layer)])
            g = sensitivities[id(layer)]
            root = self._hessian_root(f, g.reshape(len(f), f.shape[1], -1)).reshape(-1, g.shape[-1])
            parts += [a.T @ a, root.T @ root / (len(a) // len(f))]
        return f, tuple(parts)

    def _layer_terms(self, x, layers):
        """``f`` (B, K), and per layer of ``layers`` (keyed by ``id``) its inputs and ``d f / d z`` (B, K, ...,
        out) for its pre-activation ``z``, float64; one trace per approximation."""
        net = self._net
        leaves = [tf.cast(v, t.dtype) for v, t in zip(tf.nest.flatten(x), tf.nest.flatten(net.inputs))]
        x = tf.nest.pack_sequence_as(x, leaves)
        if self._traced_terms is None:
            signature = tf.nest.map_structure(lambda v: tf.TensorSpec([None, *v.shape[1:]], v.dtype), x)
            self._traced_terms = tf.function(lambda inputs: self._trace_terms(layers, inputs),
                                             input_signature=[signature])
        f, inputs, sensitivities = self._traced_terms(x)
        return (np.asarray(f, np.float64), {id(k): np.asarray(v, np.float64) for k, v in zip(layers, inputs)},
                {id(k): np.asarray(v, np.float64) for k, v in zip(layers, sensitivities)})

    def _trace_terms(self, layers, x):
        last = self._net.last
        inner = [layer for layer in layers if layer is not last]
        with tf.GradientTape(persistent=True) as tape, Probes(inner, tape) as probes:
            phi = self._net.features(x, training=False)
            f = pre_activation(last, phi, last.kernel)
            if len(inner) < len(layers):
                f = probes.attach(last, phi, f)
        # d f_k / d z of every layer in one backward pass per output k, vectorized over k (one
        # batch_jacobian per layer ran the backward pass from f down to each layer again: 20 passes for a
        # 20-layer network). Examples are independent at inference, so d (sum_n f_nk) / d z_n = d f_nk / d z_n.
        sources = [probes.probes[id(layer)] for layer in layers]
        num_outputs = f.shape[-1]

        def per_output(k):
            seed = tf.broadcast_to(tf.one_hot(k, num_outputs, dtype=f.dtype), tf.shape(f))
            return tape.gradient(f, sources, output_gradients=seed, unconnected_gradients=tf.UnconnectedGradients.ZERO)

        per_k = tf.vectorized_map(per_output, tf.range(num_outputs))  # each (K, B, ..., out)
        sensitivities = [tf.experimental.numpy.moveaxis(g, 0, 1) for g in per_k]  # (B, K, ..., out)
        return f, [probes.inputs[id(layer)] for layer in layers], sensitivities

    def _last_layer_curvature(self, phi, lam):
        if self.hessian == "kron":
            return phi.T @ phi, lam.sum(axis=0)
        if self.hessian == "diag":
            return (np.square(phi).T @ np.diagonal(lam, axis1=1, axis2=2)).ravel()
        # sum_n (phi_n phi_n^T) kron Lambda_n, indexed [(i, j), (l, k)]: one GEMM over the batch
        weighted = phi[:, :, None, None] * lam[:, None]  # (B, d+1, K, K)
        h = np.tensordot(weighted, phi, axes=([0], [0]))  # (d+1, K, K, d+1)
        size = phi.shape[1] * lam.shape[1]
        return h.transpose(0, 1, 3, 2).reshape(size, size)

    def _add_loss_terms(self, terms, f, y):
        if self.likelihood == "classification":
            terms["nll"] -= float(_label_log_probs(_log_softmax(f), y).sum())
        else:
            terms["sse"] += float(np.square(y - f).sum())
            terms["outputs"] += int(f.size)

    def _make_basis(self, curvature):
        if self.hessian == "full":
            return _DenseBasis(curvature)
        if self.hessian == "kron":
            if self.subset == "all":  # one (A, G) pair per weight matrix
                return _BlockKroneckerBasis(curvature)
            return _KroneckerBasis.of_factors(*curvature)
        if self.subset == "last_layer":  # the diagonal as a Kronecker basis with identities
            return _KroneckerBasis(np.eye(self._net.input_dim), np.eye(self._net.units), curvature)
        return _DiagonalBasis(curvature)

    def _check_fitted(self):
        if self._basis is None:
            raise ValueError("The Laplace approximation is not fitted yet: call `fit(x, y)` first. "
                             "Received: an unfitted Laplace object")

    # -- hyperparameters ----------------------------------------------------------
    def _resolve(self, prior_precision, sigma_noise):
        delta = self.prior_precision if prior_precision is None else self._prior("prior_precision", prior_precision)
        sigma = self.sigma_noise if sigma_noise is None else _positive("sigma_noise", sigma_noise)
        if self.likelihood == "classification" and sigma != 1.0:
            raise ValueError("`sigma_noise` is the regression noise std; classification has none. "
                             f"Received: likelihood='classification', sigma_noise={sigma_noise!r}")
        return delta, sigma

    def _precision_values(self, delta, sigma):
        """Eigenvalues of the posterior precision, ``lambda / sigma^2 + delta`` (P,)."""
        return self._basis.values / sigma**2 + self._delta_vector(delta)

    def _log_likelihood(self, sigma):
        t = self._fit_terms
        if self.likelihood == "classification":
            return -t["nll"]
        return -0.5 * t["outputs"] * math.log(2 * math.pi * sigma**2) - 0.5 * t["sse"] / sigma**2

    def log_marginal_likelihood(self, prior_precision=None, sigma_noise=None):
        """The Laplace approximation of the log evidence ``log p(D | delta, sigma)``.

        ::

            log p(D | theta*) - delta/2 ||theta*||^2 - 1/2 sum_i log(lambda_i / sigma^2 + delta) + P/2 log delta

        (module docstring; MacKay 1992, Immer et al. 2021 eq. 4). For a linear-Gaussian
        model at its MAP it is the exact evidence.

        Args:
            prior_precision: float > 0 or None (the current ``prior_precision``).
            sigma_noise: float > 0 or None (the current ``sigma_noise``; regression).

        Returns:
            float.
        """
        self._check_fitted()
        delta, sigma = self._resolve(prior_precision, sigma_noise)
        logdet = np.log(self._precision_values(delta, sigma)).sum()
        log_prior = np.sum(self._delta_vector(delta) * np.square(self.mean)) - np.sum(
            self._group_counts() * np.log(delta))
        return float(self._log_likelihood(sigma) - 0.5 * log_prior - 0.5 * logdet)

    def _group_counts(self):
        """Weights per group, (G,) (P for one group)."""
        return np.asarray([size or self.num_parameters for _, size in self._groups], np.float64)

    def _group_sums(self, values):
        """``values`` (P,) summed within each group, (G,)."""
        return np.add.reduceat(values, np.concatenate([[0], np.cumsum(self._group_counts())[:-1]]).astype(int))

    def log_marginal_likelihood_gradient(self, prior_precision=None, sigma_noise=None):
        """The gradient of :meth:`log_marginal_likelihood` in ``log delta`` and ``log sigma``.

        ::

            d/d log delta = 1/2 (P - delta ||theta*||^2 - sum_i delta / (lambda_i / sigma^2 + delta))
            d/d log sigma = sum_i (lambda_i / sigma^2) / (lambda_i / sigma^2 + delta) - N K + SSE / sigma^2

        (the second for regression; 0 for classification). With a per-layer prior precision the first is
        one value per layer, its sums running over that layer's weights.

        Returns:
            ``(d/d log delta, d/d log sigma)``: floats, or a (G,) array and a float for a per-layer prior.
        """
        self._check_fitted()
        delta, sigma = self._resolve(prior_precision, sigma_noise)
        precision = self._precision_values(delta, sigma)
        per_weight = self._delta_vector(delta)
        d_delta = 0.5 * (self._group_counts() - self._group_sums(
            per_weight * np.square(self.mean) + per_weight / precision))
        d_delta = d_delta if np.ndim(delta) else float(d_delta.sum())  # one delta: the chain rule sums groups
        if self.likelihood == "classification":
            return d_delta, 0.0
        t = self._fit_terms
        d_sigma = ((self._basis.values / sigma**2) / precision).sum() - t["outputs"] + t["sse"] / sigma**2
        return d_delta, float(d_sigma)

    def optimize_prior_precision(self, method="marglik", x_val=None, y_val=None, tune_sigma_noise=None,
                                 grid=None, link_approx="probit", num_samples=100, seed=None, batch_size=None,
                                 per_layer=False):
        """Tunes ``prior_precision`` (and, by the evidence, ``sigma_noise`` for regression).

        ``"marglik"`` maximises :meth:`log_marginal_likelihood` over ``log delta`` (and
        ``log sigma``) with L-BFGS-B and the analytic gradient, ``delta`` in
        ``[1e-8, 1e8]``, ``sigma`` in ``[1e-6, 1e6]``. ``"val_nll"`` picks from ``grid``
        the ``delta`` whose GLM predictive has the lowest NLL on ``(x_val, y_val)``
        (``sigma`` stays).

        Args:
            method: ``"marglik"`` (default) or ``"val_nll"``.
            x_val: validation inputs (or a dataset of ``(x, y)``), ``"val_nll"`` only.
            y_val: validation targets, ``"val_nll"`` only.
            tune_sigma_noise: bool or None. Tune ``sigma_noise`` with the evidence
                (None: yes for regression with ``"marglik"``).
            grid: ``"val_nll"``: the candidate prior precisions, default
                ``np.logspace(-4, 4, 33)``.
            link_approx: ``"val_nll"`` for classification: ``"probit"`` or ``"mc"``.
            num_samples: int, samples of ``link_approx="mc"``.
            seed: int or None, seed of ``link_approx="mc"``.
            batch_size: int or None, as in :meth:`fit`.
            per_layer: bool, ``"marglik"`` only: one prior precision per layer (:attr:`prior_groups`), as
                Immer et al. (2021) tune them, for ``subset="all"`` with ``hessian="kron"`` or ``"diag"``;
                ``prior_precision`` becomes a (G,) array. Default False.

        Returns:
            ``self``, with the new ``prior_precision`` (and ``sigma_noise``).
        """
        self._check_fitted()
        method = _choice("method", method, PRIOR_METHODS)
        if not isinstance(per_layer, bool):
            raise ValueError(f"Expected `per_layer` to be a bool. Received: per_layer={per_layer!r}")
        if per_layer and method != "marglik":
            raise ValueError(f"`per_layer=True` tunes by the marginal likelihood. Received: method={method!r}")
        if per_layer:  # one value per layer, starting from the current one(s); validated for the structure
            self._prior("prior_precision", np.broadcast_to(self.prior_precision, (len(self._groups),)))
        if tune_sigma_noise is None:
            tune_sigma_noise = self.likelihood == "regression" and method == "marglik"
        if tune_sigma_noise and (self.likelihood != "regression" or method != "marglik"):
            raise ValueError("`tune_sigma_noise=True` needs likelihood='regression' and method='marglik'. "
                             f"Received: likelihood={self.likelihood!r}, method={method!r}")
        if method == "marglik":
            if x_val is not None or y_val is not None:
                raise ValueError("`x_val`/`y_val` are for method='val_nll'. Received: method='marglik' with x_val")
            self._maximize_evidence(bool(tune_sigma_noise), per_layer)
            return self
        if x_val is None:
            raise ValueError("method='val_nll' needs validation data. Received: x_val=None")
        grid = np.logspace(-4, 4, 33) if grid is None else np.asarray(grid, np.float64).ravel()
        for value in grid:
            _positive("grid", value)
        link_approx = _choice("link_approx", link_approx, LINK_APPROXIMATIONS)
        nll = self._validation_nll(x_val, y_val, grid, link_approx, num_samples, seed, batch_size)
        self.prior_precision = float(grid[int(np.argmin(nll))])
        return self

    def _maximize_evidence(self, tune_sigma, per_layer=False):
        groups = len(self._groups) if per_layer else 1

        def unpack(z):
            delta = np.exp(z[:groups]) if per_layer else math.exp(z[0])
            return delta, (math.exp(z[groups]) if tune_sigma else self.sigma_noise)

        def objective(z):
            delta, sigma = unpack(z)
            value = self.log_marginal_likelihood(delta, sigma)
            d_delta, d_sigma = self.log_marginal_likelihood_gradient(delta, sigma)
            grad = np.append(d_delta, d_sigma)
            return -value, -grad[: len(z)]

        start = np.log(np.broadcast_to(self.prior_precision, (groups,)) if per_layer else [np.mean(
            self.prior_precision)])
        start = np.append(start, [math.log(self.sigma_noise)] if tune_sigma else [])
        bounds = [(math.log(1e-8), math.log(1e8))] * groups + ([(math.log(1e-6), math.log(1e6))] if tune_sigma else [])
        result = scipy.optimize.minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds)
        delta, sigma = unpack(result.x)
        self.prior_precision = delta if per_layer else float(delta)
        if tune_sigma:
            self.sigma_noise = float(sigma)

    def _validation_nll(self, x, y, grid, link_approx, num_samples, seed, batch_size):
        """The summed NLL of the GLM predictive on ``(x, y)`` for each prior precision of ``grid``."""
        nll = np.zeros(len(grid))
        rng = np.random.default_rng(checks.numpy_seed(seed))
        for xb, yb in _batches(x, y, self._batch_size(batch_size)):
            f_mu, projection = self._project(xb)
            targets = _targets(yb, f_mu, self.likelihood)
            for g, delta in enumerate(grid):
                f_var = projection.variance(1.0 / self._precision_values(delta, self.sigma_noise))
                nll[g] -= self._log_predictive(f_mu, f_var, targets, link_approx, num_samples, rng).sum()
        return nll

    def _log_predictive(self, f_mu, f_var, y, link_approx, num_samples, rng):
        if self.likelihood == "regression":
            var = np.diagonal(f_var, axis1=1, axis2=2) + self.sigma_noise**2
            return (-0.5 * np.log(2 * np.pi * var) - 0.5 * np.square(y - f_mu) / var).sum(axis=-1)
        probs = self._classify(f_mu, f_var, link_approx, num_samples, rng)
        return _label_log_probs(np.log(np.maximum(probs, 1e-300)), y)

    # -- the posterior --------------------------------------------------------------
    def _batch_size(self, batch_size):
        return checks.integer("batch_size", batch_size, 1, allow_none=True) or _DEFAULT_BATCH[self.subset]

    def _project(self, x):
        """``f(x; theta*)`` (B, K) and the projection whose ``variance(w)`` is ``J B diag(w) B^T J^T``."""
        if self.subset == "last_layer":
            phi = self._net.phi(x)
            return phi @ self.mean.reshape(phi.shape[1], -1), self._basis.project_features(phi, self._net.units)
        f, jac = self._net.outputs_and_jacobian(x)
        return f, self._basis.project_jacobian(jac)

    def _matrix(self, values):
        """``B diag(values) B^T`` as a dense (P, P) array."""
        half = self._basis.rotate(np.diag(values))  # diag(v) B^T
        return self._basis.rotate(np.ascontiguousarray(half.T))

    @property
    def posterior_precision(self):
        """``H / sigma^2 + delta I``: ``(P,)`` for ``"diag"``, else a dense ``(P, P)`` array
        (for ``"kron"`` built from its factors, see ``hessian_factors``)."""
        self._check_fitted()
        values = self._precision_values(self.prior_precision, self.sigma_noise)
        return values if self.hessian == "diag" else self._matrix(values)

    @property
    def posterior_covariance(self):
        """The inverse of :attr:`posterior_precision`, in the same layout."""
        self._check_fitted()
        values = 1.0 / self._precision_values(self.prior_precision, self.sigma_noise)
        return values if self.hessian == "diag" else self._matrix(values)

    def sample(self, num_samples=100, seed=None):
        """Draws weights ``theta ~ N(theta*, Sigma)``.

        Args:
            num_samples: int >= 1, T.
            seed: int or None, seed of a NumPy generator.

        Returns:
            ``(T, P)`` float64 array (parameter order: see the module docstring).
        """
        self._check_fitted()
        num_samples = checks.integer("num_samples", num_samples, 1)
        eps = np.random.default_rng(checks.numpy_seed(seed)).standard_normal((num_samples, self.num_parameters))
        scale = 1.0 / np.sqrt(self._precision_values(self.prior_precision, self.sigma_noise))
        return self.mean + self._basis.rotate(eps * scale)

    def function_moments(self, x, batch_size=None):
        """Mean and covariance of the linearized function values, ``f(x; theta*)`` and ``J Sigma J^T``.

        Args:
            x: inputs (arrays) or a dataset yielding ``x`` or ``(x, y)``.
            batch_size: int or None.

        Returns:
            ``(f_mu, f_var)``: ``(N, K)`` and ``(N, K, K)`` float64 arrays.
        """
        self._check_fitted()
        w = 1.0 / self._precision_values(self.prior_precision, self.sigma_noise)
        means, variances = [], []
        for xb, _ in _batches(x, None, self._batch_size(batch_size), need_targets=False):
            f_mu, projection = self._project(xb)
            means.append(f_mu)
            variances.append(projection.variance(w))
        return np.concatenate(means), np.concatenate(variances)

    # -- prediction -----------------------------------------------------------------
    def predict(self, x, pred_type="glm", link_approx="probit", num_samples=100, seed=None, batch_size=None):
        """The posterior predictive at ``x``.

        Args:
            x: inputs (arrays) or a dataset yielding ``x`` or ``(x, y)``.
            pred_type: ``"glm"`` (default: the linearized predictive, module docstring)
                or ``"nn"`` (Monte Carlo over weights ``theta ~ q``, run through the
                network; for ``subset="all"`` one forward pass per sample).
            link_approx: classification with ``"glm"``: ``"probit"`` (default,
                ``softmax(kappa f)``) or ``"mc"`` (softmax averaged over ``num_samples``
                Gaussian function draws).
            num_samples: int >= 1, samples of ``"mc"`` / ``"nn"``. Default 100.
            seed: int or None, seed of the NumPy generator of the samples.
            batch_size: int or None.

        Returns:
            Classification: ``(N, K)`` class probabilities. Regression: a
            :class:`tfbnn.inference.RegressionPrediction` with ``mean (N, K)``,
            ``epistemic_std`` (the std of ``f``) and ``aleatoric_std = sigma_noise``,
            so ``total_std`` and ``interval(level)`` are the predictive's.
        """
        self._check_fitted()
        pred_type = _choice("pred_type", pred_type, PRED_TYPES)
        link_approx = _choice("link_approx", link_approx, LINK_APPROXIMATIONS)
        num_samples = checks.integer("num_samples", num_samples, 1)
        rng = np.random.default_rng(checks.numpy_seed(seed))
        if pred_type == "nn":
            samples = self._sampled_outputs(x, num_samples, rng, batch_size)  # (T, N, K)
            if self.likelihood == "classification":
                return _softmax(samples).mean(axis=0)
            return self._regression_prediction(samples.mean(axis=0), samples.std(axis=0), num_samples)
        f_mu, f_var = self.function_moments(x, batch_size)
        if self.likelihood == "classification":
            return self._classify(f_mu, f_var, link_approx, num_samples, rng)
        return self._regression_prediction(f_mu, np.sqrt(np.diagonal(f_var, axis1=1, axis2=2)), 1)

    def _regression_prediction(self, mean, epistemic_std, num_samples):
        return RegressionPrediction(
            mean=mean.astype(np.float32), epistemic_std=epistemic_std.astype(np.float32),
            aleatoric_std=np.full(mean.shape, self.sigma_noise, np.float32), num_samples=num_samples,
            samples_used=np.full(len(mean), num_samples))

    def _classify(self, f_mu, f_var, link_approx, num_samples, rng):
        if link_approx == "probit":
            kappa = 1.0 / np.sqrt(1.0 + np.pi / 8.0 * np.diagonal(f_var, axis1=1, axis2=2))
            return _softmax(kappa * f_mu)
        w, v = np.linalg.eigh(f_var)
        root = v * np.sqrt(np.maximum(w, 0.0))[:, None, :]  # root root^T = f_var
        eps = rng.standard_normal((num_samples,) + f_mu.shape)
        return _softmax(f_mu + np.einsum("nkl,tnl->tnk", root, eps)).mean(axis=0)

    def _sampled_outputs(self, x, num_samples, rng, batch_size):
        thetas = self.sample(num_samples, seed=int(rng.integers(2**31)))
        if self.subset == "last_layer":
            phi = np.concatenate([self._net.phi(xb) for xb, _ in _batches(
                x, None, self._batch_size(batch_size), need_targets=False)])
            return np.einsum("ni,tik->tnk", phi, thetas.reshape(num_samples, phi.shape[1], -1))
        outputs = []
        try:
            for theta in thetas:
                self._net.assign(theta)
                outputs.append(np.concatenate([self._net.outputs(xb) for xb, _ in _batches(
                    x, None, self._batch_size(batch_size), need_targets=False)]))
        finally:
            self._net.assign(self.mean)
        return np.stack(outputs)

    # -- the fitted-posterior protocol (tfbnn.predict, save, export) ----------------
    def weight_draws(self, num_samples, seed=None):
        """``(T, P)`` draws ``theta ~ N(theta*, Sigma)``: :meth:`sample`; for a subnetwork every trainable weight
        ``(T, P_all)``, those outside it at ``theta*``."""
        draws = self.sample(num_samples, seed=seed)
        if self.subset != "subnetwork":
            return draws
        full = np.tile(self._net.anchor, (num_samples, 1))
        full[:, self._net.indices] = draws
        return full

    def noise_scales(self, num_samples):
        """``sigma_noise`` for each draw (regression), else None."""
        return np.full(num_samples, self.sigma_noise) if self.likelihood == "regression" else None

    def forward(self, draws, x):
        """The network's outputs for weight draws ``(T, P)`` at ``x`` ``(B, ...)``, ``(T, B, K)``: class
        probabilities (the softmax of the logits ``f``) or the regression means ``f``; traceable."""
        self._check_fitted()
        net = self._net
        if self.subset == "last_layer":
            phi = net.features(x, training=False)
            if net.use_bias:
                phi = tf.concat([phi, tf.ones_like(phi[:, :1])], axis=1)
            weights = tf.reshape(tf.cast(draws, phi.dtype), [-1, net.input_dim, net.units])
            f = tf.einsum("bi,tik->tbk", phi, weights)
        else:
            if getattr(self, "_flat", None) is None:
                with tf.init_scope():  # eagerly: cloning a compiled model reads its optimizer's config
                    self._flat = FlatWeights(self.model, logits=True, variables=net.variables)
            f = self._flat.forward(tf.cast(draws, self._flat.dtype), x)
        return tf.nn.softmax(f, axis=-1) if self.likelihood == "classification" else f

    # -- a Keras model that samples -------------------------------------------------
    def to_model(self, seed=None, name=None):
        """A Keras model whose last layer samples from this posterior (last layer only).

        The model shares every layer of ``model`` but the last, which becomes a
        :class:`LaplaceDense` holding ``theta*`` and a square root of the posterior
        covariance (``"full"``: ``(P, P)``; ``"kron"``: the factors' eigenvectors and
        ``(d+1, K)`` scales; ``"diag"``: ``(d+1, K)`` scales) at the current
        hyperparameters, with the last layer's activation. Its outputs are the
        linearized (here exact) predictive's samples, so ``tfbnn.predict(model, x,
        num_samples=T)`` gives the Monte Carlo predictive with the aleatoric/epistemic
        split; for regression the model ends in a :class:`tfbnn.GaussianHead` whose
        scale is ``sigma_noise`` (the aleatoric part). It saves as ``.keras``
        (the seed state included) and exports with :mod:`tfbnn.export`.

        Args:
            seed: int in ``[0, 2^31)`` (NumPy integers too) or None, seed of the layer's
                ``keras.random.SeedGenerator``.
            name: str or None, the model's name.

        Returns:
            A functional ``keras.Model``.
        """
        self._check_fitted()
        seed = checks.numpy_seed(seed)
        if self.subset != "last_layer":
            raise ValueError("`to_model` samples the last layer: it needs subset='last_layer' (for more weights "
                             "use `predict(x)`, or `tfbnn.predict(la, x)`). Received: "
                             f"subset={self.subset!r}")
        net = self._net
        regression = self.likelihood == "regression"
        layer = LaplaceDense(net.units, structure=self.hessian, activation=net.last.activation,
                             use_bias=net.use_bias, noise_scale=self.sigma_noise if regression else None,
                             seed=seed, name=f"{net.last.name}_laplace")
        outputs = layer(net.last.input)
        layer.set_posterior(self.mean.reshape(net.input_dim, net.units), **self._layer_scale())
        if regression:
            outputs = GaussianHead(min_scale=self.sigma_noise, name=f"{net.last.name}_noise")(outputs)
        return keras.Model(net.inputs, outputs, name=name or f"{net.model.name}_laplace")

    def _layer_scale(self):
        std = 1.0 / np.sqrt(self._precision_values(self.prior_precision, self.sigma_noise))
        if self.hessian == "full":
            return {"scale": self._basis.vectors * std}
        shape = (self._net.input_dim, self._net.units)
        if self.hessian == "kron":
            return {"scale": std.reshape(shape), "input_rotation": self._basis.qa, "output_rotation": self._basis.qg}
        return {"scale": std.reshape(shape)}

    # -- saving ----------------------------------------------------------------------
    def save(self, path):
        """Writes the fitted state (``theta*``, the GGN factors, hyperparameters) to an ``.npz`` file.

        The model itself is saved separately (``model.save("model.keras")``); :func:`load`
        (or :func:`tfbnn.inference.load_posterior`, which reads every fitted posterior) takes both.
        """
        super().save(path)

    def _state(self):
        self._check_fitted()
        config = {"likelihood": self.likelihood, "subset": self.subset, "hessian": self.hessian,
                  "prior_precision": np.asarray(self.prior_precision).tolist(), "sigma_noise": self.sigma_noise,
                  "num_data": self.num_data, "fit_terms": self._fit_terms}
        factors = self.hessian_factors if isinstance(self.hessian_factors, tuple) else (self.hessian_factors,)
        arrays = {f"factor_{i}": f for i, f in enumerate(factors)}
        if self.subset == "subnetwork":
            arrays.update(subnetwork=self._net.indices, anchor=self._net.anchor)
        return config, dict(arrays, mean=self.mean)

    @classmethod
    def _from_state(cls, config, arrays, model):
        factors = [arrays[f"factor_{i}"] for i in range(sum(k.startswith("factor_") for k in arrays))]
        mean = arrays["mean"]
        la = Laplace(model, config["likelihood"], config["subset"], config["hessian"], config["prior_precision"],
                     config["sigma_noise"], subnetwork=arrays.get("subnetwork"))
        if "anchor" in arrays:
            la._net.anchor = arrays["anchor"]
        if mean.shape != (la.num_parameters,):
            raise ValueError(f"Expected a state for a model with {la.num_parameters} parameters in the "
                             f"approximation. Received: a state with {mean.shape[0]}")
        la.mean, la.num_data, la._fit_terms = mean, config["num_data"], config["fit_terms"]
        la.hessian_factors = tuple(factors) if config["hessian"] == "kron" else factors[0]
        la._basis = la._make_basis(la.hessian_factors)
        return la


def load(path, model):
    """A :class:`Laplace` saved by :meth:`Laplace.save`, for ``model`` (the same trained model).

    The same as :func:`tfbnn.inference.load_posterior`, which reads every fitted posterior.

    Args:
        path: the ``.npz`` file.
        model: the Keras model the approximation was fitted to.

    Returns:
        A fitted :class:`Laplace`.
    """
    with np.load(path, allow_pickle=False) as data:
        config = json.loads(str(data["config"]))
        arrays = {name: data[name] for name in data.files if name != "config"}
    config.pop("kind", None)
    return Laplace._from_state(config, arrays, model)


def fit(model, x, y=None, likelihood="classification", subset="last_layer", hessian=None, prior_precision=1.0,
        sigma_noise=1.0, batch_size=None, subnetwork=None):
    """Fits the Laplace approximation of a trained model: ``Laplace(model, ...).fit(x, y)``.

    Args:
        model: the trained Sequential or functional ``keras.Model``, ending in a ``Dense``.
        x: training inputs, or a batched ``tf.data.Dataset`` of ``(x, y)``.
        y: training targets (None with a dataset).
        likelihood: ``"classification"`` or ``"regression"``.
        subset: ``"last_layer"``, ``"all"`` or ``"subnetwork"``.
        hessian: ``"full"``, ``"kron"``, ``"diag"`` or None (``"kron"`` for the last layer,
            ``"diag"`` for all weights, ``"full"`` for a subnetwork).
        prior_precision: float > 0, or one per layer. Default 1.
        sigma_noise: float > 0, regression only. Default 1.
        batch_size: int or None.
        subnetwork: with ``subset="subnetwork"``: a count n (the n weights of largest variance), a
            boolean mask or flat indices (see :class:`Laplace`).

    Returns:
        A fitted :class:`Laplace`; see it for the arguments in full.
    """
    la = Laplace(model, likelihood=likelihood, subset=subset, hessian=hessian, prior_precision=prior_precision,
                 sigma_noise=sigma_noise, subnetwork=subnetwork)
    return la.fit(x, y, batch_size=batch_size)


# -- online marginal likelihood ------------------------------------------------------------
class _PriorPenalty(keras.regularizers.Regularizer):
    """``c ||w||^2`` with ``c`` a variable the callback updates (the traced train step reads it)."""

    def __init__(self, coefficient):
        self.coefficient = keras.Variable(coefficient, dtype="float32", trainable=False, name="prior_penalty")

    def __call__(self, x):
        return tf.cast(self.coefficient, x.dtype) * tf.reduce_sum(tf.square(x))

    def get_config(self):
        return {"coefficient": float(self.coefficient.numpy())}


class OnlineMarginalLikelihood(keras.callbacks.Callback):
    """Learns the prior precisions (and a regression's noise) by the Laplace evidence while ``fit`` trains.

    Online model selection (Immer et al. 2021, Algorithm 1): the network is trained
    to the MAP of its current prior, and every ``every`` epochs (after ``burnin``) the
    prior precisions ``delta_l`` (one per layer, or one for all) and, for regression,
    the noise std ``sigma`` are set to the maximiser of the Laplace evidence at the
    current weights (:meth:`Laplace.log_marginal_likelihood`, ``hessian`` KFAC by
    default), which training then follows. The callback owns the prior term of the
    loss: on ``fit``'s start it puts on every trainable weight of layer ``l`` the
    penalty that makes Keras' mean loss the negative log joint divided by a constant::

        classification (mean cross-entropy):    delta_l / (2 N) * ||theta_l||^2
        regression (mean squared error, K outputs):   sigma^2 delta_l / (N K) * ||theta_l||^2

    so compile the model with ``"sparse_categorical_crossentropy"`` /
    ``"categorical_crossentropy"`` (a softmax output) or ``"mse"`` (a linear output)
    and no regularizers of its own (a weight that has one is refused). The penalties
    are removed at the end of ``fit`` (the saved model carries none). Where Immer et
    al. take a few gradient steps on the hyperparameters per update, this maximises
    the evidence at each update (L-BFGS on the log hyperparameters, the analytic
    gradient); its fixed point is the same, a stationary point of the evidence, and
    for a linear-Gaussian model the exact type-II maximum likelihood.

    Args:
        x: the training inputs the evidence is computed on (arrays, or a batched
            ``tf.data.Dataset`` of ``(x, y)``), usually ``fit``'s.
        y: their targets (None with a dataset).
        likelihood: ``"classification"`` or ``"regression"``.
        hessian: ``"kron"`` (default, KFAC per layer: Dense and Conv2D layers),
            ``"diag"`` or ``"full"`` (small networks).
        every: int >= 1, epochs between updates. Default 5.
        burnin: int >= 0, epochs before the first update. Default 0.
        per_layer: bool, one prior precision per layer (default True; ``"full"`` takes
            False).
        tune_sigma_noise: bool or None (default: True for regression).
        prior_precision: float > 0 (or one per layer), the prior before the first
            update. Default 1.
        sigma_noise: float > 0, the regression noise std before the first update. Default 1.
        batch_size: int or None, the Laplace fit's batch size.

    Attributes:
        laplace: the :class:`Laplace` of the last update (fitted, at the learned
            hyperparameters): ``predict``, ``tfbnn.predict`` and ``save`` it.
        prior_precision, sigma_noise: the current hyperparameters.
        history: a list of dicts, one per update: ``epoch``, ``prior_precision``,
            ``sigma_noise``, ``log_marginal_likelihood``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> rng = np.random.default_rng(0)
        >>> x = rng.normal(size=(64, 2)).astype("float32")
        >>> y = (x @ [1.0, -2.0] + 0.3 * rng.normal(size=64)).astype("float32")[:, None]
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(keras.optimizers.SGD(0.3), "mse")
        >>> online = tfbnn.laplace.OnlineMarginalLikelihood(x, y, "regression", every=5)
        >>> _ = model.fit(x, y, batch_size=64, epochs=20, verbose=0, callbacks=[online])
        >>> len(online.history), 0.2 < online.sigma_noise < 0.4
        (4, True)

    References:
        Immer, Bauer, Fortuin, Ratsch, Khan. Scalable Marginal Likelihood Estimation for
        Model Selection in Deep Learning. ICML 2021 (Algorithm 1, eq. 4).
    """

    def __init__(self, x, y=None, likelihood="classification", hessian="kron", every=5, burnin=0, per_layer=True,
                 tune_sigma_noise=None, prior_precision=1.0, sigma_noise=1.0, batch_size=None):
        super().__init__()
        self.x, self.y = x, y
        self.likelihood = _choice("likelihood", likelihood, LIKELIHOODS)
        self.hessian = _choice("hessian", hessian, HESSIANS)
        self.every = checks.integer("every", every, 1)
        self.burnin = checks.integer("burnin", burnin, 0)
        if not isinstance(per_layer, bool):
            raise ValueError(f"Expected `per_layer` to be a bool. Received: per_layer={per_layer!r}")
        if per_layer and hessian == "full":
            raise ValueError("A per-layer prior takes hessian='kron' or 'diag'. Received: hessian='full', "
                             "per_layer=True")
        self.per_layer = per_layer
        if tune_sigma_noise is None:
            tune_sigma_noise = self.likelihood == "regression"
        if tune_sigma_noise and self.likelihood != "regression":
            raise ValueError("`tune_sigma_noise=True` needs likelihood='regression'. Received: "
                             f"likelihood={likelihood!r}")
        self.tune_sigma_noise = bool(tune_sigma_noise)
        self.prior_precision = prior_precision if np.ndim(prior_precision) else _positive(
            "prior_precision", prior_precision)
        self.sigma_noise = _positive("sigma_noise", sigma_noise)
        self.batch_size = checks.integer("batch_size", batch_size, 1, allow_none=True)
        self.laplace, self.history, self._penalties = None, [], []

    def _approximation(self):
        if self.laplace is None or self.laplace.model is not self.model:
            self.laplace = Laplace(self.model, self.likelihood, "all", self.hessian, self.prior_precision,
                                   self.sigma_noise)
        return self.laplace

    def _num_examples(self):
        if isinstance(self.x, tf.data.Dataset):
            return sum(int(tf.shape(tf.nest.flatten(element[0])[0])[0]) for element in self.x)
        return _num_rows(self.x)

    def _coefficients(self):
        """The penalty per group: ``delta_l / (2N)``, or ``sigma^2 delta_l / (N K)`` for regression."""
        la = self.laplace
        delta = np.broadcast_to(np.asarray(self.prior_precision, np.float64), (len(la.prior_groups),))
        if self.likelihood == "classification":
            return delta / (2 * self._num)
        return self.sigma_noise**2 * delta / (self._num * la._net.units)

    def on_train_begin(self, logs=None):
        la = self._approximation()
        la.prior_precision = la._prior("prior_precision", self.prior_precision)
        taken = [v.path for v in la._net.variables if v.regularizer is not None]
        if taken:
            raise ValueError("OnlineMarginalLikelihood sets the prior term of the loss: the model's trainable "
                             f"weights must have no regularizer. Received: regularizers on {taken}")
        self._num = self._num_examples()
        self._penalties = [_PriorPenalty(c) for c in self._coefficients()]
        ends, start = np.cumsum(la._group_counts()), 0
        for v in la._net.variables:  # a group is a run of consecutive weights of one layer
            v.regularizer = self._penalties[int(np.searchsorted(ends, start, side="right"))]
            start += int(np.prod(v.shape))
        self.model.make_train_function(force=True)

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if done <= self.burnin or (done - self.burnin) % self.every:
            return
        la = self.laplace
        la.prior_precision, la.sigma_noise = la._prior("prior_precision", self.prior_precision), self.sigma_noise
        la.fit(self.x, self.y, batch_size=self.batch_size)
        la.optimize_prior_precision(method="marglik", tune_sigma_noise=self.tune_sigma_noise,
                                    per_layer=self.per_layer)
        self.prior_precision, self.sigma_noise = la.prior_precision, la.sigma_noise
        for penalty, c in zip(self._penalties, self._coefficients()):
            penalty.coefficient.assign(c)
        self.history.append({"epoch": done, "prior_precision": np.asarray(la.prior_precision).tolist(),
                             "sigma_noise": la.sigma_noise, "log_marginal_likelihood": la.log_marginal_likelihood()})

    def on_train_end(self, logs=None):
        for v in self.laplace._net.variables:
            v.regularizer = None
        self._penalties = []
        self.model.make_train_function(force=True)


# -- the sampling layer -----------------------------------------------------------------
@keras.saving.register_keras_serializable(package="tfbnn")
class LaplaceDense(StochasticLayer):
    """A dense layer whose weights are drawn from a Laplace posterior ``N(W*, Sigma)``.

    ``y = activation(x W + b)`` with ``vec([W; b]) ~ N(vec([W*; b*]), Sigma)``, the
    parameters ordered row-major over the ``(d + 1, K)`` matrix ``[W; b]``. ``Sigma
    = S S^T`` is held as a square root in one of three structures:

    * ``"full"``: ``scale`` ``(P, P)``, ``Sigma = scale scale^T``, ``P = (d + 1) K``;
    * ``"kron"``: ``Sigma = (Q_A kron Q_G) diag(scale^2) (Q_A kron Q_G)^T`` with
      ``input_rotation`` ``Q_A`` ``(d+1, d+1)``, ``output_rotation`` ``Q_G`` ``(K, K)``
      and ``scale`` ``(d+1, K)`` (KFAC's eigendecomposition);
    * ``"diag"``: ``Sigma = diag(scale^2)``, ``scale`` ``(d+1, K)``.

    Made by :meth:`tfbnn.laplace.Laplace.to_model` (the weights are non-trainable,
    set by :meth:`set_posterior`). It follows the Monte Carlo protocol of
    :class:`tfbnn.layers.StochasticLayer`: in a call with ``T`` samples
    (:func:`tfbnn.utils.weight_samples`) jointly it draws ``T`` weight matrices and
    applies them with one batched matmul; per row it draws each row's output from its
    exact distribution ``N(x W*, J Sigma J^T)``, ``J = [x, 1] kron I_K`` (``"kron"`` and
    ``"diag"``: ``Q_G (sqrt(c) * eps)`` with ``c = ((x Q_A)^2) scale^2``, no weight-sized
    draw). An ordinary call draws one weight sample for the batch; ``inference_mode
    ="mean"`` gives ``x W* + b*``.

    Args:
        units: int >= 1, K.
        structure: ``"full"``, ``"kron"`` (default) or ``"diag"``.
        activation: the activation (name or callable), default None (linear).
        use_bias: bool, default True.
        noise_scale: float > 0 or None. For a regression posterior predictive: the
            layer outputs ``2 K`` values, the ``K`` sampled outputs and ``K`` raw scales
            of ``-1e4``, which a following ``tfbnn.GaussianHead(min_scale=noise_scale)``
            turns into the noise std (``softplus(-1e4) = 0``), so that
            :func:`tfbnn.predict` reports it as the aleatoric std.
        inference_mode: ``"sample"`` (default) or ``"mean"``.
        seed: int or None.

    Input shape: ``(batch, d)``. Output shape: ``(batch, K)`` (``(batch, 2 K)`` with
    ``noise_scale``).

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.laplace.LaplaceDense(2, structure="diag", seed=0)
        >>> layer.build((None, 3))
        >>> layer.set_posterior(np.ones((4, 2)), scale=np.full((4, 2), 0.1))
        >>> x = np.ones((5, 3), "float32")
        >>> bool(np.allclose(layer(x), 4.0, atol=1.0)), layer(x).shape
        (True, TensorShape([5, 2]))

    Reference:
        Daxberger et al. Laplace Redux -- Effortless Bayesian Deep Learning. NeurIPS 2021.
    """

    def __init__(self, units, structure="kron", activation=None, use_bias=True, noise_scale=None,
                 inference_mode="sample", seed=None, **kwargs):
        super().__init__(inference_mode=inference_mode, seed=seed, **kwargs)
        self.units = checks.integer("units", units, 1)
        self.structure = _choice("structure", structure, STRUCTURES)
        self.activation = checks.activation(activation)
        self.use_bias = bool(use_bias)
        self.noise_scale = None if noise_scale is None else _positive("noise_scale", noise_scale)

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(f"Layer '{self.name}' expects inputs (batch, features). "
                             f"Received: input_shape={tuple(input_shape)}")
        dim = input_features(self, input_shape)
        rows = dim + int(self.use_bias)

        def weight(name, shape):
            return self.add_weight(name=name, shape=shape, initializer="zeros", trainable=False)

        self.kernel = weight("kernel", (dim, self.units))
        self.bias = weight("bias", (self.units,)) if self.use_bias else None
        size = rows * self.units
        self.scale = weight("scale", (size, size) if self.structure == "full" else (rows, self.units))
        if self.structure == "kron":
            self.input_rotation = weight("input_rotation", (rows, rows))
            self.output_rotation = weight("output_rotation", (self.units, self.units))
        self.input_spec = keras.layers.InputSpec(ndim=2, axes={-1: dim})

    def set_posterior(self, weights, scale, input_rotation=None, output_rotation=None):
        """Sets the posterior: ``weights`` ``(d + 1, K)`` (``[W; b]``, ``(d, K)`` without a
        bias) and the square root of the covariance in this layer's structure."""
        weights = np.asarray(weights)
        dim = self.kernel.shape[0]
        self.kernel.assign(weights[:dim])
        if self.use_bias:
            self.bias.assign(weights[dim])
        self.scale.assign(np.asarray(scale))
        if self.structure == "kron":
            self.input_rotation.assign(np.asarray(input_rotation))
            self.output_rotation.assign(np.asarray(output_rotation))

    def _augmented(self, inputs):
        if not self.use_bias:
            return inputs
        return tf.concat([inputs, tf.ones_like(inputs[:, :1])], axis=1)

    def _weight_noise(self, eps):
        """``eps`` (T, P) standard normal -> weight perturbations ``(T, d + 1, K)`` with covariance Sigma."""
        rows = self.kernel.shape[0] + int(self.use_bias)
        if self.structure == "full":
            return tf.reshape(tf.matmul(eps, self.scale, transpose_b=True), [-1, rows, self.units])
        noise = tf.reshape(eps, [-1, rows, self.units]) * self.scale
        if self.structure == "kron":
            noise = tf.matmul(tf.matmul(self.input_rotation, noise), self.output_rotation, transpose_b=True)
        return noise

    def _noise(self, inputs):
        x = self._augmented(inputs)
        size = (self.kernel.shape[0] + int(self.use_bias)) * self.units
        samples = self._weight_samples
        if self._joint_samples or samples == 1:  # T weight matrices, each shared by a block of rows
            noise = self._weight_noise(self._normal([samples, size], x.dtype))
            blocks = tf.reshape(x, [samples, -1, x.shape[-1]])
            return tf.reshape(tf.matmul(blocks, noise), [-1, self.units])
        rows = tf.shape(x)[0]
        if self.structure == "full":  # every row its own weight sample
            noise = self._weight_noise(self._normal([rows, size], x.dtype))
            return tf.einsum("ri,rik->rk", x, noise)
        u = tf.matmul(x, self.input_rotation) if self.structure == "kron" else x
        std = tf.sqrt(tf.matmul(tf.square(u), tf.square(self.scale)))
        z = std * self._normal([rows, self.units], x.dtype)
        return tf.matmul(z, self.output_rotation, transpose_b=True) if self.structure == "kron" else z

    def call(self, inputs, training=None):
        outputs = tf.matmul(inputs, self.kernel)
        if self.use_bias:
            outputs = outputs + self.bias
        if self._sampling(training):
            outputs = outputs + self._noise(inputs)
        outputs = self.activation(outputs)
        if self.noise_scale is not None:
            outputs = tf.concat([outputs, tf.fill(tf.shape(outputs), tf.cast(_RAW_SCALE, outputs.dtype))], axis=-1)
        return outputs

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units * (2 if self.noise_scale is not None else 1),)

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units, "structure": self.structure,
                       "activation": keras.activations.serialize(self.activation), "use_bias": self.use_bias,
                       "noise_scale": self.noise_scale})
        return config
