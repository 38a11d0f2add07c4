"""The vectorized sampler: tiling, the compiled per-batch function, the MC dropout view, and the inputs."""

import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks, keras_private
from tfbnn.ensembles import DeepEnsemble
from tfbnn.layers.rank1 import ensemble_means, ensemble_size
from tfbnn.utils import stochastic_layers

_DEFAULT_BATCH_SIZE = 32
# Layers that MC dropout keeps on at inference. GaussianNoise is left out on
# purpose: it is an input-noise regularizer, not a dropout posterior.
_DROPOUT_TYPES = (keras.layers.Dropout, keras.layers.GaussianDropout, keras.layers.AlphaDropout)
# Compiled per-batch functions, keyed weakly by model: a cache only (dropping it
# changes nothing but speed), so it holds no reference that keeps a model alive.
_COMPILED = weakref.WeakKeyDictionary()


# -- the vectorized sampler ------------------------------------------------------------
class _AlwaysOnDropout(keras.layers.Layer):
    """Runs a Keras dropout layer's math with ``training=True`` (the MC dropout view).

    It shares the source layer (rate, noise shape and seed generator), so it adds
    no state; it exists only inside the clone :func:`_mc_dropout_view` makes.
    """

    def __init__(self, source):
        super().__init__(name=f"{source.name}_mc", dtype=source.dtype_policy)
        self.source = source

    def call(self, inputs):
        return self.source.call(inputs, training=True)

    def compute_output_shape(self, input_shape):
        return input_shape


class _AlwaysTraining(keras.layers.Layer):
    """Calls a subclassed layer with ``training=True`` (the MC dropout view of its inner dropout).

    Used only for a layer whose dropout the clone cannot reach and whose only
    training-dependent sublayers are dropout (a KerasHub ``TransformerEncoder``), so
    that ``training=True`` changes nothing but the dropout.
    """

    def __init__(self, source):
        super().__init__(name=f"{source.name}_mc", dtype=source.dtype_policy)
        self.source = source

    def call(self, *args, **kwargs):
        kwargs["training"] = True
        return self.source(*args, **kwargs)

    def compute_output_spec(self, *args, **kwargs):
        return self.source.compute_output_spec(*args, **kwargs)


def _only_dropout_depends_on_training(layer):
    """Whether the subclassed ``layer`` has dropout inside and no other sublayer known to act
    differently in training (normalization statistics, noise, Bayesian sampling)."""
    inner = keras_private.sublayers(layer)
    other = (keras.layers.BatchNormalization, keras.layers.GaussianNoise, keras.layers.ActivityRegularization)
    sampling = {id(l) for l in stochastic_layers(layer)}
    return (any(isinstance(l, _DROPOUT_TYPES) for l in inner)
            and not any(isinstance(l, other) or id(l) in sampling for l in inner))


def _dropout_layers(model):
    return [l for l in keras_private.sublayers(model) if isinstance(l, _DROPOUT_TYPES)]


def _mc_dropout_view(model):
    """A model sharing every layer of ``model`` but with its dropout layers always on.

    Only the dropout layers change, so BatchNormalization keeps its inference
    statistics and Bayesian layers stay in inference (no KL scale needed), unlike
    calling the model with ``training=True``.
    """
    replaced = []

    def swap(layer):
        if isinstance(layer, _DROPOUT_TYPES):
            replaced.append(layer)
            return _AlwaysOnDropout(layer)
        if (isinstance(layer, keras.layers.Layer) and not isinstance(layer, keras.Model)
                and _only_dropout_depends_on_training(layer)):
            replaced.extend(_dropout_layers(layer))  # e.g. a KerasHub TransformerEncoder's dropout
            return _AlwaysTraining(layer)
        return layer

    try:
        view = keras.models.clone_model(model, clone_function=swap, recursive=True)
    except ValueError as e:
        raise ValueError(
            "`mc_dropout=True` rebuilds the model with its dropout layers kept on, which needs a "
            "Sequential or functional model (a subclassed model cannot be rebuilt). Build the model "
            "functionally, or use a dropout layer that stays on at inference. "
            f"Received: model of type {type(model).__name__}"
        ) from e
    missing = [l.name for l in _dropout_layers(model) if not any(l is r for r in replaced)]
    if missing:
        raise ValueError(
            "`mc_dropout=True` could not reach the dropout layers inside a subclassed layer or "
            f"model: {missing}. Received: model={model.name!r}"
        )
    return view


def _tile(x, num_samples):
    return tf.tile(x, tf.concat([[num_samples], tf.ones([tf.rank(x) - 1], tf.int32)], axis=0))


def input_signature(batch):
    """Input specs with an unknown batch axis: one trace serves every batch size."""
    return tf.nest.map_structure(lambda v: tf.TensorSpec([None] + v.shape[1:].as_list(), v.dtype), batch)


def compiled_sampler(model, num_samples, joint, mc_dropout, signature):
    """The per-batch ``tf.function`` ``x (B, ...) -> outputs (T, B, ...)``, cached.

    The key holds everything read when tracing: T and ``joint`` (read by the layers
    through :func:`weight_samples`), the dropout switch, the layers' inference
    modes and the input specs. It is only ever called inside that context.
    """
    entry = _COMPILED.setdefault(model, {})
    modes = tuple(layer.inference_mode for layer in stochastic_layers(model))  # MC dropout's too
    specs = tuple((tuple(s.shape.as_list()), s.dtype.name) for s in tf.nest.flatten(signature))
    members = tuple(layer.returns_members for layer in ensemble_means(model))  # EnsembleMean: members as samples
    key = (num_samples, bool(joint), bool(mc_dropout), modes, members, repr(tf.nest.map_structure(lambda _: None, signature)), specs)
    if key in entry:
        return entry[key]
    if mc_dropout:
        if "mc_view" not in entry:
            entry["mc_view"] = _mc_dropout_view(model)
        target = weakref.ref(entry["mc_view"])
    else:
        target = weakref.ref(model)

    @tf.function(input_signature=[signature])
    def sample(x):
        tiled = tf.nest.map_structure(lambda v: _tile(v, num_samples), x)
        net = target()
        if isinstance(net, DeepEnsemble):  # (M, T * B, ...) -> (M * T, B, ...), member-major
            outputs = net.call_members(tiled, training=False)
            return tf.reshape(outputs, tf.concat([[net.num_members * num_samples, -1], tf.shape(outputs)[2:]], 0))
        outputs = net(tiled, training=False)
        if not isinstance(outputs, tf.Tensor):
            raise ValueError(
                "`tfbnn.inference.predict` needs a model with one output tensor. "
                f"Received: outputs of type {type(outputs).__name__}"
            )
        # (E T B, ...) rows, member-major, when EnsembleMean layers pass every member's rows through
        groups = num_samples * (ensemble_size(net) if any(members) else 1)
        return tf.reshape(outputs, tf.concat([[groups, -1], tf.shape(outputs)[1:]], axis=0))

    # One tf.function per key, traced once (the batch axis is unknown in its signature): a new T or
    # input spec needs its own graph, since the layers read T while tracing. TensorFlow counts traces
    # per source function, so a handful of keys (T = 10, 20, 50, ...) would read to it as "retracing"
    # and log its warning, which here has nothing to fix: it is switched off for these functions
    # (as TensorFlow does for the functions of a loaded SavedModel).
    keras_private.quiet_retracing(sample)
    entry[key] = sample
    return sample


# -- inputs ------------------------------------------------------------------------
def _to_tensor(v):
    if isinstance(v, tf.Tensor):
        return v
    try:
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.floating):
            v = v.astype(keras.config.floatx())
        return tf.convert_to_tensor(v)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"Expected `x` to be arrays or tensors ({e}). Received: x with a value of type {type(v).__name__}"
        ) from None


def check_input_shapes(model, batch):
    """``x`` against the model's declared inputs (Sequential / functional): a clear error
    here instead of one from inside the traced Monte Carlo function."""
    try:
        inputs = reference_model(model).inputs
    except (AttributeError, ValueError):  # a subclassed model declares none
        return
    if not inputs or len(inputs) > 1:  # several inputs: Keras matches them by name or order
        return
    checks.input_shape(batch, inputs[0].shape)


def input_batches(x, batch_size):
    if isinstance(x, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError(
                "A tf.data.Dataset is already batched: do not pass `batch_size`. "
                f"Received: batch_size={batch_size}"
            )
        for element in x:
            yield element[0] if isinstance(element, tuple) else element
        return
    x = tf.nest.map_structure(_to_tensor, x)
    leaves = tf.nest.flatten(x)
    if not leaves or any(v.shape.rank == 0 for v in leaves):
        raise ValueError(f"Expected inputs with a batch axis. Received: x of shape {getattr(x, 'shape', None)}")
    num = int(leaves[0].shape[0])
    if num == 0:
        raise ValueError("Expected at least one example. Received: x with 0 examples")
    if any(int(v.shape[0]) != num for v in leaves):
        raise ValueError(
            f"Expected every input in `x` to have the same number of examples. Received: x with shapes "
            f"{[tuple(v.shape) for v in leaves]}"
        )
    size = batch_size or _DEFAULT_BATCH_SIZE
    for start in range(0, num, size):
        yield tf.nest.map_structure(lambda v, s=start: v[s : s + size], x)


def reference_model(model):
    """The model whose inputs and output layer describe ``model`` (an ensemble's first member)."""
    return model.members[0] if isinstance(model, DeepEnsemble) else model


def check_finite(batch, offset):
    """Rejects NaN / infinite inputs: they would give NaN summaries."""
    checks.finite_inputs(batch, offset)


def check_dropout(model, mc_dropout):
    dropouts = _dropout_layers(model)
    if mc_dropout and not dropouts:
        raise ValueError(
            "`mc_dropout=True` but the model has no Keras dropout layer "
            f"({', '.join(t.__name__ for t in _DROPOUT_TYPES)}). Received: model={model.name!r}"
        )
    # Any stochastic layer that samples (Bayesian, MC dropout, iBNN node noise) makes the samples differ.
    sampling = any(layer.inference_mode == "sample" for layer in stochastic_layers(model))
    sampling = sampling or bool(ensemble_means(model))  # an ensemble's members are its samples
    if dropouts and not mc_dropout and not sampling:
        warnings.warn(
            f"Model {model.name!r} has dropout layers, which Keras turns off at inference, and no "
            "stochastic layer that samples: all Monte Carlo samples will be identical. Pass "
            "`mc_dropout=True` for MC dropout."
        )
