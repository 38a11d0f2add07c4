"""Uncertainty heads for a fine-tuned backbone (a KerasHub task model or any functional model).

A KerasHub task (``keras_hub.models.BertTextClassifier``, ``ImageClassifier``, ...) is a
backbone, a pooled feature ``phi(x)`` (BERT's ``[CLS]`` pooler, an image model's global
pool) and a last ``Dense`` layer ``f(x) = phi(x) W + b``. This module puts the
uncertainty on that head, where it is cheap, while the backbone stays as fine-tuned:

* :func:`last_layer_laplace`: the last-layer Laplace approximation
  ``N(theta*, (H + delta I)^-1)`` of ``[W; b]`` (:mod:`tfbnn.laplace`) with the prior
  precision ``delta`` tuned by the Laplace marginal likelihood (Immer et al. 2021, eq. 4);
  the pooled features are computed once.
* :func:`bayesian_head`: the last ``Dense`` converted to Bayes by Backprop
  (:func:`tfbnn.convert.by_policy`, posterior means at the trained weights) and the
  backbone frozen (shared with the task, not copied); trains with ``fit`` on the ELBO
  ``mean NLL + KL / N``; :func:`load_model` loads its ``.keras`` file with the backbone
  still frozen.
* MC dropout with the backbone's own dropout kept on at prediction:
  ``tfbnn.predict(task, x, mc_dropout=True)`` (it reaches the dropout inside KerasHub's
  ``TransformerEncoder`` layers too).
* :func:`ensemble_heads` / :class:`EnsembleDense`: a deep ensemble (Lakshminarayanan et
  al. 2017) of M heads over one frozen backbone, as one batched layer
  ``f_m(x) = phi(x) W_m + b_m`` (``(B, d) -> (B, M, K)``), so the backbone runs once for
  all M heads; :func:`ensemble_model` turns it into a model whose members
  :func:`tfbnn.predict` reads as samples.

Example:
    >>> import keras, numpy as np, tfbnn
    >>> x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> inp = keras.Input((4,))
    >>> task = keras.Model(inp, keras.layers.Dense(2, name="logits")(keras.layers.Dense(8, "tanh")(inp)))
    >>> tfbnn.hub.pooled_features(task, x).shape
    (32, 8)
    >>> la = tfbnn.hub.last_layer_laplace(task, x, y)
    >>> la.predict(tfbnn.hub.pooled_features(task, x[:2])).shape  # on the features
    (2, 2)

References:
    Daxberger, Kristiadi, Immer, Eschenhagen, Bauer, Hennig. Laplace Redux -- Effortless
    Bayesian Deep Learning. NeurIPS 2021 (last-layer Laplace, sec. 3).
    Immer, Bauer, Fortuin, Ratsch, Khan. Scalable Marginal Likelihood Estimation for Model
    Selection in Deep Learning. ICML 2021 (eq. 4).
    Lakshminarayanan, Pritzel, Blundell. Simple and Scalable Predictive Uncertainty
    Estimation using Deep Ensembles. NeurIPS 2017.
    Gal, Ghahramani. Dropout as a Bayesian Approximation. ICML 2016.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import keras_private
from tfbnn import convert
from tfbnn._internal import checks
from tfbnn import laplace as laplace_lib
from tfbnn.layers.rank1 import EnsembleMean

__all__ = ["head_layer", "feature_model", "pooled_features", "last_layer_laplace", "bayesian_head", "load_model",
           "EnsembleDense", "ensemble_heads", "ensemble_model", "tile_labels"]


def head_layer(task):
    """The last ``keras.layers.Dense`` of a functional ``task`` model (its output layer).

    Raises:
        ValueError: ``task`` is not a functional model with one output made by a Dense layer.
    """
    if not isinstance(task, keras.Model):
        raise ValueError(f"Expected a Keras model. Received: task of type {type(task).__name__}")
    try:
        outputs = task.outputs
    except (AttributeError, ValueError):
        outputs = None
    if not outputs or len(outputs) != 1:
        raise ValueError(
            "Expected a functional model with one output (a KerasHub task, or keras.Model(inputs, outputs)). "
            f"Received: task={task.name!r} with outputs {outputs}")
    last = keras_private.output_layer(task)
    if type(last) is not keras.layers.Dense:
        raise ValueError(
            "Expected the task to end in a keras.layers.Dense head on pooled features. "
            f"Received: last layer {last.name!r} of type {type(last).__name__}")
    return last


def feature_model(task):
    """The model ``x -> phi(x)``: the task's inputs to its head's input (the pooled features).

    It shares the task's layers (no copy). Dropout between the pooler and the head is
    part of it and is off at inference.
    """
    last = head_layer(task)
    return keras.Model(task.inputs, last.input, name=f"{task.name}_features")


def pooled_features(task, x, batch_size=32):
    """``phi(x)``, the pooled features the head sees, as a ``(N, d)`` NumPy array (backbone run once).

    Args:
        task: a functional model ending in a ``Dense`` head (:func:`head_layer`).
        x: the task's inputs (an array, or a dict of arrays for a KerasHub text task).
        batch_size: int > 0. Default 32.
    """
    batch_size = checks.integer("batch_size", batch_size, 1)
    return np.asarray(feature_model(task).predict(x, batch_size=batch_size, verbose=0))


def _plain_head(last, name):
    """A Sequential ``Input(d) -> Dense`` copy of ``last`` (same weights and activation)."""
    head = keras.Sequential([keras.Input((last.kernel.shape[0],)), keras.layers.Dense.from_config(last.get_config())],
                            name=name)
    head.set_weights(last.get_weights())
    return head


def last_layer_laplace(task, x, y, hessian="kron", prior_precision="marglik", batch_size=32):
    """The last-layer Laplace approximation of a fine-tuned task's head, on its pooled features.

    The posterior over the head's ``[W; b]`` is ``N(theta*, (H + delta I)^-1)`` with
    ``H = sum_n (phi_n phi_n^T) kron Lambda_n`` (``Lambda_n = diag(p_n) - p_n p_n^T``, the
    softmax Hessian): :class:`tfbnn.laplace.Laplace` on a plain ``Dense`` model over the
    features ``phi(x)``, computed once. With ``prior_precision="marglik"`` ``delta``
    maximizes the Laplace evidence ``log p(D|theta*) - delta/2 ||theta*||^2 -
    1/2 log det(H + delta I) + P/2 log delta`` (Immer et al. 2021, eq. 4).

    Args:
        task: a trained functional classifier ending in a linear or softmax ``Dense``
            head (a KerasHub task with ``preprocessor=None``).
        x, y: training inputs and int labels ``(N,)``.
        hessian: ``"kron"`` (default), ``"full"`` or ``"diag"``.
        prior_precision: ``"marglik"`` (default, tuned) or a float > 0 (fixed).
        batch_size: int > 0, for the features. Default 32.

    Returns:
        A fitted :class:`tfbnn.laplace.Laplace` over the head model
        ``Input(d) -> Dense``; predict with ``la.predict(tfbnn.hub.pooled_features(task, x))``.
    """
    features = pooled_features(task, x, batch_size)
    head = _plain_head(head_layer(task), f"{task.name}_head")
    if prior_precision == "marglik":
        return laplace_lib.fit(head, features, y, likelihood="classification", hessian=hessian,
                               batch_size=batch_size).optimize_prior_precision(method="marglik")
    if isinstance(prior_precision, str):
        raise ValueError(
            f"Expected `prior_precision` to be 'marglik' or a positive number. Received: prior_precision={prior_precision!r}")
    return laplace_lib.Laplace(head, likelihood="classification", hessian=hessian,
                               prior_precision=prior_precision).fit(features, y, batch_size=batch_size)


def bayesian_head(task, method="flipout", num_examples=None, init_scale=1e-3, prior="normal", seed=None):
    """The task with its last ``Dense`` made Bayesian and every other weight frozen.

    The head ``f(x) = phi(x) W + b`` becomes the ``method`` layer (Bayes by Backprop with
    any estimator, ``"vd"``, ...; :func:`tfbnn.convert.by_policy`) with posterior means
    ``mu_W = W``, ``mu_b = b`` at the trained weights and standard deviations
    ``init_scale``; training then fits the head's posterior ``q(W)`` on the ELBO
    ``mean_n -log p(y_n | x_n, W) + KL(q(W) || p(W)) / N`` (Blundell et al. 2015, eq. 2),
    the backbone ``phi`` fixed.

    The backbone is **shared, not copied** (:func:`tfbnn.convert.by_policy` rebuilds only
    the models that hold the head, so a KerasHub ``ViTBackbone``, which keras-hub 0.32
    cannot rebuild from its layers' configs, works): freezing it sets
    ``trainable = False`` on the task's own layers too. Set ``task.trainable = True`` to
    fine-tune the task again. The result saves as ``.keras``; load it with
    :func:`load_model`, which keeps the backbone frozen.

    Args:
        task: a functional model ending in a ``Dense`` head (a KerasHub task with
            ``preprocessor=None``).
        method: a :data:`tfbnn.convert.CONVERSION_METHODS` name. Default ``"flipout"``.
        num_examples: N, the training set size (``kl_weight = 1 / N``).
        init_scale, prior, seed: as for :func:`tfbnn.convert.by_policy`.

    Returns:
        A new uncompiled ``keras.Model`` (inputs as the task's, outputs ``(B, K)`` like
        the head's) whose only trainable layer is the head.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
        >>> inp = keras.Input((4,))
        >>> body = keras.Model(inp, keras.layers.Dense(6, "tanh")(inp), name="body")
        >>> task = keras.Model(inp, keras.layers.Dense(3, name="logits")(body(inp)))
        >>> model = tfbnn.hub.bayesian_head(task, num_examples=8, seed=0)
        >>> model.get_layer("body") is body, [v.path for v in model.trainable_variables]
        (True, ['logits/kernel_loc', 'logits/kernel_rho', 'logits/bias_loc'])
        >>> with tfbnn.posterior_mean(model):
        ...     np.allclose(model(x), task(x), atol=1e-6)
        True

    Reference:
        Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
        Networks. ICML 2015.
    """
    last = head_layer(task)  # a layer of the task's own graph: its path is its name
    model = convert.by_policy(task, [(last.name, method)], init_scale=init_scale, prior=prior, num_examples=num_examples,
                              seed=seed, name=f"{task.name}_{method}_head")
    new_head = keras_private.output_layer(model)
    for layer in model.layers:
        layer.trainable = layer is new_head
    return model


def load_model(filepath, custom_objects=None, safe_mode=True):
    """Loads a ``.keras`` file of :func:`bayesian_head` (or any model) with its frozen layers still frozen.

    ``keras.saving.load_model`` restores a KerasHub backbone by calling its constructor
    with the saved ``trainable=False`` (keras-hub 0.32 ``Backbone.from_config``); the
    functional constructor's ``self.trainable = trainable`` then never reaches the
    ``trainable`` setter, because on the TensorFlow backend an assignment of the value an
    attribute already has is skipped (Keras 3.15, ``backend/tensorflow/trackable.py``),
    so the backbone's flag is False while its variables stay trainable: the loaded model
    would train the whole backbone. This sets every frozen layer's flag again, through the
    setter (``True`` then ``False``). The model is returned uncompiled (an optimizer state
    saved for the unfrozen variable list would not match): compile it to go on training.

    Args:
        filepath: path of a ``.keras`` file.
        custom_objects, safe_mode: as for ``keras.saving.load_model``.

    Returns:
        The uncompiled model; ``model.trainable_variables`` are those of the saved model.
    """
    model = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=False, safe_mode=safe_mode)
    for layer in keras_private.sublayers(model, include_self=True):
        if not layer.trainable:
            layer.trainable = True  # a change of value, so that the setter runs (and reaches the variables)
            layer.trainable = False
    return model


@keras.saving.register_keras_serializable(package="tfbnn")
class EnsembleDense(keras.layers.Layer):
    """M independent ``Dense`` heads as one batched layer: ``y_m = activation(x W_m + b_m)``.

    One ``einsum("bd,mdk->bmk")`` evaluates all M heads, so a backbone's features are
    computed once for the whole ensemble (a deep ensemble of heads, Lakshminarayanan et
    al. 2017). Each ``W_m`` starts Glorot-uniform, ``U(-l, l)`` with ``l = sqrt(6 / (d + K))``,
    drawn independently per member from the layer's seed; biases start at 0.

    Args:
        num_members: int >= 1, M.
        units: int >= 1, K.
        activation: activation name or None (linear). Default None.
        seed: int or None, the initial weights' seed.

    Input shape: ``(B, d)``. Output shape: ``(B, M, K)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> layer = tfbnn.hub.EnsembleDense(3, 2, seed=0)
        >>> layer(np.ones((4, 5), "float32")).shape
        TensorShape([4, 3, 2])
    """

    def __init__(self, num_members, units, activation=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.num_members = checks.integer("num_members", num_members, 1)
        self.units = checks.integer("units", units, 1)
        self.seed = seed = checks.seed(seed)
        self.activation = keras.activations.get(activation)
        self.seed_generator = keras.random.SeedGenerator(seed)

    def _glorot(self, shape, dtype=None):
        limit = math.sqrt(6.0 / (shape[1] + shape[2]))
        return keras.random.uniform(shape, -limit, limit, dtype=dtype, seed=self.seed_generator)

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(f"Expected inputs of shape (batch, features). Received: input_shape={input_shape}")
        self.kernel = self.add_weight(shape=(self.num_members, input_shape[-1], self.units), initializer=self._glorot,
                                      name="kernel")
        self.bias = self.add_weight(shape=(self.num_members, self.units), initializer="zeros", name="bias")

    def call(self, inputs):
        return self.activation(tf.einsum("bd,mdk->bmk", inputs, self.kernel) + self.bias)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_members, self.units)

    def get_config(self):
        config = super().get_config()
        config.update(num_members=self.num_members, units=self.units,
                      activation=keras.activations.serialize(self.activation), seed=self.seed)
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class MembersToRows(keras.layers.Layer):
    """``(B, M, K) -> (M B, K)``, member-major: the rows :class:`tfbnn.layers.EnsembleMean` averages."""

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"Layer '{self.name}' expects inputs of shape (batch, members, units). "
                             f"Received: input_shape={tuple(input_shape)}")

    def call(self, inputs):
        shape = tf.shape(inputs)
        rows = tf.reshape(tf.transpose(inputs, [1, 0, 2]), [-1, shape[2]])
        return tf.ensure_shape(rows, self.compute_output_shape(inputs.shape))

    def compute_output_shape(self, input_shape):
        batch, members, units = input_shape
        return (None if batch is None or members is None else members * batch, units)


def ensemble_heads(task, num_members, seed=None):
    """A deep ensemble of M heads for ``task``'s pooled features: ``Input(d) -> EnsembleDense``.

    The heads have the task head's K outputs and are linear (logits, ``(B, M, K)``).
    Train them on :func:`pooled_features` (the frozen backbone runs once) with the labels
    repeated per member (:func:`tile_labels`) and
    ``SparseCategoricalCrossentropy(from_logits=True)``: the loss is the members' mean,
    so each member gets its own gradient, scaled by ``1/M`` (Adam is invariant to it).

    Args:
        task: a functional model ending in a ``Dense`` head.
        num_members: int >= 1, M.
        seed: int or None, the heads' initial weights.
    """
    last = head_layer(task)
    inp = keras.Input((last.kernel.shape[0],), name="features")
    out = EnsembleDense(num_members, last.units, seed=seed, name="heads")(inp)
    return keras.Model(inp, out, name=f"{task.name}_heads")


def tile_labels(y, num_members):
    """Labels ``(N,)`` repeated for M heads: ``(N, M)``, the targets of :func:`ensemble_heads`."""
    num_members = checks.integer("num_members", num_members, 1)
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"Expected labels of shape (N,). Received: y.shape={y.shape}")
    return np.repeat(y.reshape(len(y), 1), num_members, axis=1)


def ensemble_model(task, heads):
    """The task's backbone with the trained ensemble ``heads`` on top: ``x -> mean_m softmax(f_m(x))``.

    The output is the ensemble's predictive ``(1/M) sum_m softmax(f_m(x))``
    (:class:`tfbnn.layers.EnsembleMean`); :func:`tfbnn.predict` reads the M members as
    its samples (mutual information = the members' disagreement). Saves as ``.keras``.
    """
    features = feature_model(task)
    layer = next((l for l in heads.layers if isinstance(l, EnsembleDense)), None)
    if layer is None:
        raise ValueError(f"Expected a model from ensemble_heads. Received: heads={heads.name!r} with no EnsembleDense")
    rows = MembersToRows(name="members")(keras.layers.Softmax(name="member_probs")(layer(features.outputs[0])))
    probs = EnsembleMean(layer.num_members, name="ensemble_mean")(rows)
    return keras.Model(task.inputs, probs, name=f"{task.name}_ensemble")
