"""Exports with stochastic, posterior-mean and uncertainty endpoints: SavedModel, TFLite, ONNX.

Export with :func:`export` (``format="saved_model"``, ``"tflite"`` or ``"onnx"``), not
with Keras' ``model.export``: Keras saves every layer's ``SeedGenerator`` state with
the model, so every fresh process that loads a ``model.export`` SavedModel gives the
same first "random" draw, and the same sequence after it. The exports here draw fresh
noise in every process unless a seed is asked for.

TFLite and ONNX exports (:func:`export`, :func:`portable_noise`) have the endpoints
``summary``, ``sample`` and ``mean`` with built-in ops only (see :func:`export`).

The exported SavedModel (:func:`export_saved_model`) needs neither tfbnn nor Keras to
serve: load it with plain ``tf.saved_model.load(path)``. Its endpoints (``x`` is a batch shaped like the model's
input; ``seed`` a scalar ``tf.int64`` or ``tf.int32`` tensor):

=====================  =========================================================
``sample(x)``          one draw from the posterior predictive (fresh randomness
                       in every process and call)
``sample_seeded(x,     the same, reproducible: equal seeds give equal outputs in
seed)``                any process
``mean(x)``            the posterior-mean prediction (deterministic)
``summary(x)``         a T-sample Monte Carlo summary, vectorized: ``mean_probs``,
                       ``predictive_entropy`` (total), ``aleatoric`` (expected
                       entropy), ``epistemic`` (mutual information), Depeweg et al.
                       2018 / Trinh et al. eqs. 26-27; for regression ``mean``,
                       ``epistemic_std`` (and ``aleatoric_std`` for a model ending
                       in a regression distribution head)
``summary_seeded(x,    the same, reproducible
seed)``
=====================  =========================================================

A :class:`tfbnn.DeepEnsemble` exports with its members as posterior samples, as
:func:`tfbnn.predict` treats them: ``summary`` runs every member with ``T`` samples
(``T = 1`` when no member is stochastic), ``M * T`` samples in all, each member
weighted ``1 / M``, so ``epistemic`` includes the members' disagreement; ``sample``
draws one member uniformly (from the seed) and returns its draw; ``mean`` averages
the members' posterior-mean predictions.

``serving_default`` (the signature TF Serving and ``saved_model_cli`` use when none
is named) is ``summary``: a client asking for "the prediction" gets the Monte Carlo
predictive with its uncertainty, as :func:`tfbnn.predict` returns it, not one noisy
posterior draw (ask for ``sample`` for that).

Why the seed handling: Keras saves each layer's ``SeedGenerator`` state with the
model, so a naively exported stochastic model replays the same sample sequence in
every fresh process. Here every endpoint first overwrites all seed states, either
from a process-level entropy source (an unseeded ``RandomUniformInt`` op) or from
the caller's ``seed``. Generator ``i`` (of every stochastic layer, in order) gets the
state ``[seed, i * 2^32]``; a layer's draws only advance the second component, so the
layers draw disjoint seeds and independent noise within one call.
"""

import contextlib
import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks, files, keras_private
from tfbnn import moments as moments_lib
from tfbnn.ensembles import DeepEnsemble
from tfbnn.inference import FittedPosterior
from tfbnn.likelihoods import GaussianHead
from tfbnn.layers.arguments import ConvArguments, ConvTransposeArguments, DenseArguments
from tfbnn.layers.base import StochasticLayer
from tfbnn.layers.mean_field import MeanFieldGaussian
from tfbnn.layers.variational_dropout import VariationalDropoutLayer
from tfbnn.layers.variational import DenseVariational
from tfbnn.likelihoods import DistributionHead, output_layer
from tfbnn.sngp import gp_layers
from tfbnn.utils import posterior_mean, stochastic_layers, weight_samples

__all__ = ["export", "export_saved_model", "portable_noise", "seed_generators", "frozen_samples", "FORMATS",
           "QUANTIZATIONS", "PORTABLE_ENDPOINTS", "MODES", "RANDOM_OPS", "random_ops"]

_TASKS = ("classification", "regression")


def seed_generators(model):
    """Every ``keras.random.SeedGenerator`` held by a layer of ``model``."""
    found = []
    for layer in keras_private.sublayers(model, include_self=True):
        found += [v for v in vars(layer).values() if isinstance(v, keras.random.SeedGenerator)]
    return found


def _fresh_seed():
    # seed=seed2=0 makes the kernel draw its own seed from the OS: a new stream in
    # every process, unaffected by a global seed set while tracing.
    return tf.raw_ops.RandomUniformInt(
        shape=tf.constant([], tf.int32), minval=tf.constant(0, tf.int64),
        maxval=tf.constant(2**62, tf.int64), seed=0, seed2=0,
    )


# Each generator owns a block of 2^32 counters: a layer's SeedGenerator.next() only
# increments the second state component, so generator i draws [seed, i * 2^32 + k],
# k = 0, 1, ..., and no two generators (nor two seeds) ever share a seed in one call.
# Its first seeds used to be [seed, i], [seed, i + 1]: the next generator's first seed.
_COUNTER_BLOCK = 2**32


def _reseed(generators, seed):
    seed = tf.cast(seed, tf.int64)
    for i, generator in enumerate(generators):
        state = tf.stack([seed, tf.constant(i * _COUNTER_BLOCK, tf.int64)])
        generator.state.assign(tf.cast(state, generator.state.dtype))


def _entropy(probs):
    """``-sum p log p`` over the last axis with ``0 log 0 = 0``.

    Not ``xlogy``, which is neither a TFLite nor an ONNX op; no tiny constant
    (``log(max(p, 1e-30))``), which a float16-quantized TFLite export rounds to 0; and
    no ``where`` around ``p log p`` (tf2onnx's select leaks the NaN of ``0 log 0``):
    ``p log q`` with ``q = p`` where ``p > 0`` and ``q = 1`` (``log q = 0``) elsewhere.
    """
    safe = tf.where(probs > 0, probs, tf.ones_like(probs))
    return -tf.reduce_sum(probs * tf.math.log(safe), axis=-1)


def _classification_summary(samples, from_logits):
    """The graph version of :func:`tfbnn.inference.summarize_classification`
    (same conventions: ``0 log 0 = 0``, mutual information clipped at 0)."""
    probs = tf.nn.softmax(samples, axis=-1) if from_logits else samples
    mean = tf.reduce_mean(probs, axis=0)
    total = _entropy(mean)
    aleatoric = tf.reduce_mean(_entropy(probs), axis=0)
    return {
        "mean_probs": mean,
        "predictive_entropy": total,
        "aleatoric": aleatoric,
        "epistemic": tf.maximum(total - aleatoric, 0.0),
    }


def _member_draw(model, x, seed):
    """One draw from an ensemble's predictive: a member chosen uniformly from ``seed``, its output."""
    pair = tf.stack([tf.cast(seed, tf.int64), tf.constant(-1, tf.int64)])  # not a layer generator's state
    member = tf.random.stateless_uniform([], pair, minval=0, maxval=model.num_members, dtype=tf.int32)
    # Only the chosen member runs.
    return tf.switch_case(member, [lambda m=m: m(x, training=False) for m in model.members])


def _regression_summary(samples, head=None):
    """Mean and epistemic std of the samples' means; with a head, the law of total variance as in
    :func:`tfbnn.predict` (``aleatoric_std = sqrt(mean_t Var[y | theta_t])``)."""
    if head is None:
        return {"mean": tf.reduce_mean(samples, axis=0), "epistemic_std": tf.math.reduce_std(samples, axis=0)}
    means, variances = head.moments(samples)
    spread = tf.math.reduce_variance(means, axis=0)
    if hasattr(head, "epistemic_variance"):  # an evidential head's own Var[mu], as tfbnn.predict adds it
        spread += tf.reduce_mean(head.epistemic_variance(samples), axis=0)
    return {"mean": tf.reduce_mean(means, axis=0), "epistemic_std": tf.sqrt(spread),
            "aleatoric_std": tf.sqrt(tf.reduce_mean(variances, axis=0))}


def _task_and_head(model, task):
    """``(task, head)``: the model's output distribution head (an ensemble's first member's) or None, and
    ``task``, which defaults (None) to the head's task, else to ``"classification"``; a ``task`` other
    than the head's is refused."""
    if task is not None and task not in _TASKS:
        raise ValueError(f"Expected `task` in {_TASKS} or None. Received: task={task!r}")
    layer = output_layer(model.members[0] if isinstance(model, DeepEnsemble) else model)
    if not isinstance(layer, DistributionHead):
        return task or "classification", None
    if task is not None and task != layer.task:
        raise ValueError(f"The model ends in a {type(layer).__name__}, a {layer.task} head. Received: task={task!r}")
    return layer.task, layer


def _check_target(model, filepath):
    """``filepath`` as a str, once ``model`` is a Keras model and ``filepath``'s folder exists (or was made)
    and is writable: a bad target fails here, before any tracing, with the argument named."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected `model` to be a keras.Model (or a tfbnn.DeepEnsemble). "
                        f"Received: model of type {type(model).__name__}")
    if not isinstance(filepath, (str, os.PathLike)):
        raise TypeError(f"Expected `filepath` to be a path (str or os.PathLike). "
                        f"Received: filepath of type {type(filepath).__name__}")
    return files.check_target(filepath, "filepath")


def _input_signature(model, input_signature):
    """``input_signature``, or a ``tf.TensorSpec`` of the model's input when None."""
    if input_signature is not None:
        return input_signature
    # An ensemble (a subclassed model) has no inputs of its own; every member takes the same input.
    model_inputs = getattr(model.members[0] if isinstance(model, DeepEnsemble) else model, "inputs", None)
    if not model_inputs:
        raise ValueError("The model has no defined inputs; pass `input_signature`. Received: input_signature=None")
    return tf.TensorSpec(model_inputs[0].shape, model_inputs[0].dtype)


def _gp_features(model):
    """``(gp, features)``: the model's one :class:`tfbnn.layers.RandomFeatureGaussianProcess` and a model from the
    inputs to its input, or None for a model without exactly one GP layer in a functional or Sequential graph."""
    layers = gp_layers(model)
    if len(layers) != 1 or not getattr(model, "inputs", None):
        return None
    try:
        return layers[0], keras.Model(model.inputs[0] if len(model.inputs) == 1 else model.inputs, layers[0].input)
    except (AttributeError, ValueError):  # a subclassed model's layer has no symbolic input
        return None


def _finite_inputs(x):
    """``x``, checked when served: a floating input with NaN or infinite values fails the call (TensorFlow's
    ``InvalidArgumentError`` with this message) instead of returning NaN summaries, as :func:`tfbnn.predict`
    refuses them."""
    if not x.dtype.is_floating:
        return x
    return tf.debugging.assert_all_finite(
        x, "Expected finite inputs (NaN or infinite values give NaN predictions). Received: x with NaN or "
           "infinite values")


def _summarizer(model, num_samples, task, from_logits, head=None):
    """The traced body of the ``summary`` endpoints: ``x`` -> the T-sample summary dict (float32, also
    for a model computing in float16 under a mixed policy); ``head``: the model's distribution head.

    A model that draws nothing (no seed generator, no stochastic layer) is run once (``T = 1``): its
    T outputs would be equal. A model with one SNGP output layer also gets ``sngp_variance``, the
    GP's ``diag(Phi Sigma Phi^T)`` (:func:`tfbnn.sngp.predictive_variance`), averaged over the T draws."""
    ensemble = isinstance(model, DeepEnsemble)
    if not ensemble and not seed_generators(model) and not stochastic_layers(model):
        num_samples = 1
    gp = None if ensemble else _gp_features(model)

    # The sampling mode is set inside each traced body (Python runs at trace time),
    # so the endpoint is right however often saving retraces it.
    def summarize(x):
        with weight_samples(model, num_samples):
            batch = tf.shape(x)[0]
            # x repeated T times along the batch axis, sample-major. Not tf.tile: TFLite's converter folds a
            # Tile feeding a broadcasting Mul (Flipout's signs) into the Mul, wrong for a batch > 1.
            shape = tf.shape(x)
            tiled = tf.reshape(tf.broadcast_to(x[tf.newaxis], tf.concat([[num_samples], shape], axis=0)),
                               tf.concat([[num_samples * batch], shape[1:]], axis=0))
            if ensemble:  # (M, T * B, ...) -> (M * T, B, ...), member-major as tfbnn.predict
                outputs = model.call_members(tiled, training=False)
                samples = tf.reshape(outputs, tf.concat([[model.num_members * num_samples, batch],
                                                         tf.shape(outputs)[2:]], axis=0))
                samples.set_shape([None, None, *outputs.shape[2:]])
            else:
                outputs = model(tiled, training=False)
                samples = tf.reshape(outputs, tf.concat([[num_samples, batch], tf.shape(outputs)[1:]], axis=0))
                samples.set_shape([None, None, *outputs.shape[1:]])
            summary = _summarize_samples(samples, task, from_logits, head)
            if gp is not None:
                layer, features = gp
                variance = layer.predictive_variance(features(tiled, training=False))
                summary["sngp_variance"] = tf.reduce_mean(tf.reshape(variance, [num_samples, -1]), axis=0)
        return summary

    return summarize


@contextlib.contextmanager
def _factored_gp_covariance(model):
    """Within this context every SNGP output layer of ``model`` computes its variance as ``||Phi C||^2`` with
    ``C`` its covariance factor (:meth:`tfbnn.layers.RandomFeatureGaussianProcess.covariance_factor`), computed
    once now and traced as a constant: matmuls only, no Cholesky or triangular solve (neither is a TFLite
    built-in). The variance equals the layer's own to float32 rounding."""
    layers = gp_layers(model)
    for layer in layers:
        layer._frozen_factor = layer.covariance_factor().numpy()
    try:
        yield model
    finally:
        for layer in layers:
            layer._frozen_factor = None


def _summarize_samples(samples, task, from_logits, head):
    """The summary dict of ``(T, B, ...)`` output samples, as :func:`tfbnn.predict` summarises them."""
    samples = tf.cast(samples, tf.float32)
    if task == "classification":
        if head is not None:
            return _classification_summary(head.class_probabilities(samples), False)
        return _classification_summary(samples, from_logits)
    return _regression_summary(samples, head)


def export_saved_model(model, filepath, num_samples=100, task=None, from_logits=False,
                       input_signature=None, overwrite=False):
    """Exports ``model`` as a SavedModel with uncertainty endpoints.

    Args:
        model: a built Keras model with tfbnn layers (or MC dropout), or a
            :class:`tfbnn.DeepEnsemble` (its members are the samples; see the module
            docstring).
        filepath: output folder.
        num_samples: int >= 1, T for the ``summary`` endpoints (per member for an
            ensemble of stochastic members; an ensemble of deterministic members
            uses its M members as the samples).
        task: ``"classification"`` (outputs are probabilities, or logits with
            ``from_logits=True``), ``"regression"`` or None (default): the task of
            the model's distribution head, ``"classification"`` without one. A model
            ending in a distribution head (:mod:`tfbnn.likelihoods`) is summarised
            through it, as :func:`tfbnn.predict` does, and ``task`` must be the head's.
        from_logits: bool, whether classification outputs are logits.
        input_signature: a ``tf.TensorSpec`` for ``x``; default from ``model.inputs``.
        overwrite: bool. If False and ``filepath`` exists, raise instead of replacing it.

    Returns:
        ``filepath``. Its ``serving_default`` signature is the ``summary`` endpoint
        (see the module docstring); ``sample_seeded`` / ``summary_seeded`` take the
        seed as an int64 or int32 scalar tensor.

    Example:
        >>> import os, tempfile, keras, numpy as np, tensorflow as tf, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, activation="softmax", seed=0)])
        >>> path = os.path.join(tempfile.mkdtemp(), "bbb_export")
        >>> tfbnn.export.export_saved_model(model, path, num_samples=50) == path
        True
        >>> served = tf.saved_model.load(path)                 # no tfbnn needed
        >>> x = np.ones((2, 4), "float32")
        >>> summary = served.summary_seeded(x, tf.constant(0, tf.int64))
        >>> summary["epistemic"].shape
        TensorShape([2])
        >>> np.array_equal(summary["mean_probs"], served.summary_seeded(x, tf.constant(0, tf.int64))["mean_probs"])
        True
    """
    filepath = _check_target(model, filepath)
    num_samples = checks.integer("num_samples", num_samples, 1)
    task, head = _task_and_head(model, task)
    if os.path.exists(filepath) and not overwrite:
        raise ValueError(f"The export folder exists; pass overwrite=True to replace it. Received: filepath={filepath!r}")
    ensemble = isinstance(model, DeepEnsemble)
    input_signature = _input_signature(model, input_signature)
    generators = seed_generators(model)
    if ensemble and not stochastic_layers(model):
        num_samples = 1  # the M members are the samples; more draws would repeat them

    summarize = _summarizer(model, num_samples, task, from_logits, head)

    def draw(x, seed):
        _reseed(generators, seed)
        return _member_draw(model, x, seed) if ensemble else model(x, training=False)

    # A model that draws nothing (no seed generator; an ensemble draws its member) gets no random op.
    draws = bool(generators) or ensemble

    @tf.function(input_signature=[input_signature])
    def sample(x):
        return draw(x, _fresh_seed() if draws else tf.constant(0, tf.int64))

    @tf.function
    def sample_seeded(x, seed):
        return draw(x, seed)

    @tf.function(input_signature=[input_signature])
    def mean(x):
        with posterior_mean(model):
            return model(x, training=False)

    @tf.function(input_signature=[input_signature])
    def summary(x):
        if generators:
            _reseed(generators, _fresh_seed())
        return summarize(_finite_inputs(x))

    @tf.function
    def summary_seeded(x, seed):
        _reseed(generators, seed)
        return summarize(_finite_inputs(x))

    saved_states = [g.state.numpy() for g in generators]
    try:
        for fn in (sample, mean, summary):
            fn.get_concrete_function()
        # `x` named as saving lists the traced signatures: an unnamed spec would be traced once more there.
        x_spec = input_signature
        if isinstance(input_signature, tf.TensorSpec) and input_signature.name is None:
            x_spec = tf.TensorSpec(input_signature.shape, input_signature.dtype, name="x")
        for fn in (sample_seeded, summary_seeded):  # the seed as an int64 or an int32 scalar
            for dtype in (tf.int64, tf.int32):
                fn.get_concrete_function(x_spec, tf.TensorSpec([], dtype, name="seed"))
        archive = keras.export.ExportArchive()
        archive.track(model)
        # The first endpoint is also the SavedModel's "serving_default" signature (what
        # TF Serving and saved_model_cli call by default): the Monte Carlo summary.
        for name, fn in (("summary", summary), ("sample", sample), ("mean", mean),
                         ("sample_seeded", sample_seeded), ("summary_seeded", summary_seeded)):
            archive.add_endpoint(name, fn)
        # Written beside the target and moved into place: a failed export leaves any
        # earlier export at `filepath` untouched.
        staging = f"{os.path.normpath(filepath)}.partial-{os.getpid()}"
        archive.write_out(staging, verbose=False)
        if os.path.exists(filepath):
            shutil.rmtree(filepath)
        os.replace(staging, filepath)
    finally:
        for g, state in zip(generators, saved_states):
            g.state.assign(state)
    return filepath


# -- TFLite and ONNX -----------------------------------------------------------------------

#: What :func:`export` writes.
FORMATS = ("saved_model", "tflite", "onnx")
#: Post-training quantizations of :func:`export` for ``format="tflite"`` (None: float32).
QUANTIZATIONS = (None, "float16", "int8")
#: The endpoints of a TFLite or ONNX export, in order.
PORTABLE_ENDPOINTS = ("summary", "sample", "mean")
#: What a format cannot hold, by layer class name: ``{class name: {format: why}}``. :func:`export`
#: refuses a model with such a layer before converting anything, naming the layer and the format
#: (the deployment guide's support matrix lists them).
UNSUPPORTED = {
    "DenseVariational": dict.fromkeys(("tflite", "onnx"), "its TFP distribution samples with stateless random "
                                                          "ops, which TFLite and ONNX lack"),
    # Found by the conformance harness (tfbnn.testing, 2026-11-29): TFLite's converter fails on these with
    # builtin ops only; refused here by name instead of TensorFlow's ConverterError.
    **{name: {"tflite": "its recurrent loop is a TensorList (while-loop) op, which TFLite's builtin ops lack"}
       for name in ("LSTMReparameterization", "GRUReparameterization")},
    "MixtureNormalHead": {"tflite": "its EnsureShape op (the mixture's parameter split) is no TFLite builtin op"},
    **{name: {"tflite": "its per-sample map (tf.map_fn over the Monte Carlo blocks) is a TensorList op, which "
                        "TFLite's builtin ops lack"} for name in ("VariationalLoRAModel", "LinearizedLoRA")},
}
_ONNX_OPSET = 17
# An ONNX `seed` attribute is a float: op seeds stay below 2^24, where every integer is exact.
_SEED2_RANGE = 2**24 - 1


class _StatefulNoise:
    """One layer's noise in a portable export: stateful ``RandomStandardNormal`` / ``RandomUniform`` ops.

    ``seed=None``: every op has ``seed = seed2 = 0``, which TensorFlow and TFLite read as
    "seed from the OS when the op (the interpreter) starts", and :func:`export` removes
    the ONNX ``seed`` attribute, which onnxruntime reads the same way. With an int seed
    every op gets ``(seed, seed2)`` with its own ``seed2`` (tf2onnx keeps ``seed2`` as the
    ONNX ``seed``), so a fresh interpreter or session replays one fixed stream.
    """

    def __init__(self, seed, index):
        self.seed, self.index, self.count = seed, index, 0

    def _op_seeds(self):
        if self.seed is None:
            return 0, 0
        self.count += 1
        return self.seed, 1 + (self.seed * 7919 + self.index * 1000 + self.count) % _SEED2_RANGE

    # Drawn in float32 (the dtype of TFLite's random kernels) and cast to the layer's dtype.
    def normal(self, shape, dtype):
        seed, seed2 = self._op_seeds()
        draw = tf.raw_ops.RandomStandardNormal(shape=tf.cast(shape, tf.int32), dtype=tf.float32, seed=seed,
                                               seed2=seed2)
        return tf.cast(draw, dtype)

    def uniform(self, shape, dtype):
        seed, seed2 = self._op_seeds()
        draw = tf.raw_ops.RandomUniform(shape=tf.cast(shape, tf.int32), dtype=tf.float32, seed=seed, seed2=seed2)
        return tf.cast(draw, dtype)


@contextlib.contextmanager
def portable_noise(model, seed=None):
    """Within this context ``model``'s tfbnn layers draw their noise with stateful random
    ops that TFLite (``RANDOM_STANDARD_NORMAL``, ``RANDOM_UNIFORM``) and ONNX
    (``RandomNormalLike``, ``RandomUniformLike``) have as built-in ops.

    Outside it they use stateless philox ops seeded from their ``SeedGenerator``
    (:class:`tfbnn.layers.StochasticLayer`), which neither runtime has. Trace a
    ``tf.function`` inside it to convert it with ``tf.lite.TFLiteConverter`` or tf2onnx;
    :func:`export` does. The same distributions are drawn: Gaussian noise, uniforms for
    MC-dropout masks, Flipout's signs as ``sign(u - 1/2)``, ``u ~ U[0, 1)``.

    Args:
        model: a Keras model or layer.
        seed: int >= 0 or None. None: each op seeds itself from the OS when the runtime
            starts it (new draws in every process, interpreter or session). An int: the
            ops get fixed, distinct seeds from it, so every fresh interpreter or session
            replays one stream (successive calls within it still differ).

    Yields:
        ``model``.

    Raises:
        ValueError: a :class:`tfbnn.layers.DenseVariational` (its TFP distribution
            samples with its own stateless ops), or a bad ``seed``.

    Example:
        >>> import keras, numpy as np, tensorflow as tf, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, seed=0)])
        >>> with tfbnn.export.portable_noise(model):
        ...     graph = tf.function(model).get_concrete_function(tf.TensorSpec([None, 4])).graph
        >>> sorted({op.type for op in graph.get_operations() if "Random" in op.type})
        ['RandomStandardNormal', 'RandomUniform']
    """
    seed = None if seed is None else checks.integer("seed", seed, 0)
    layers = stochastic_layers(model)
    variational = [layer.name for layer in layers if isinstance(layer, DenseVariational)]
    if variational:
        raise ValueError("A DenseVariational layer samples its TFP distribution with stateless ops that TFLite and "
                         "ONNX lack; export the model as a SavedModel (format='saved_model'). "
                         f"Received: model with DenseVariational layers {variational}")
    previous = [layer._portable_noise for layer in layers]
    for index, layer in enumerate(layers):
        layer._portable_noise = _StatefulNoise(seed, index)
    try:
        yield model
    finally:
        for layer, noise in zip(layers, previous):
            layer._portable_noise = noise


def _refuse_unsupported(model, format):
    """A ValueError naming the first layer of ``model`` that ``format`` cannot hold (:data:`UNSUPPORTED`)."""
    for layer in keras_private.sublayers(model, include_self=True):
        for cls in type(layer).__mro__:
            why = UNSUPPORTED.get(cls.__name__, {}).get(format)
            if why:
                raise ValueError(f"Cannot export layer '{layer.name}' ({type(layer).__name__}) to format={format!r}: "
                                 f"{why}. Export it as a SavedModel (format='saved_model'). Received: "
                                 f"format={format!r}")


def _computing_in_float32(model):
    """``model``, or for a model with layers computing in float16 / bfloat16 (a mixed policy) a copy
    whose layers compute in float32, with the same weights (all float32 under a mixed policy)."""
    if all(layer.compute_dtype == "float32" for layer in keras_private.sublayers(model)):
        return model

    def float32_layer(layer):
        return type(layer).from_config({**layer.get_config(), "dtype": "float32"})

    copy = keras.models.clone_model(model, clone_function=float32_layer)
    copy.set_weights(model.get_weights())
    return copy


def _portable_endpoints(model, num_samples, task, head, from_logits, input_signature):
    """``{name: tf.function}`` for :data:`PORTABLE_ENDPOINTS` (trace them inside :func:`portable_noise`)."""
    summarize = _summarizer(model, num_samples, task, from_logits, head)

    @tf.function(input_signature=[input_signature])
    def summary(x):
        return summarize(x)

    @tf.function(input_signature=[input_signature])
    def sample(x):
        return {"output": model(x, training=False)}

    @tf.function(input_signature=[input_signature])
    def mean(x):
        with posterior_mean(model):
            return {"output": model(x, training=False)}

    return {"summary": summary, "sample": sample, "mean": mean}


def _tflite_bytes(endpoints, model, quantize, staging):
    """The endpoints as one ``.tflite`` flatbuffer with one signature each (built-in ops only)."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    for name, fn in endpoints.items():
        archive.add_endpoint(name, fn)
    saved = os.path.join(staging, "saved_model")
    archive.write_out(saved, verbose=False)
    converter = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=list(endpoints))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]  # alone: dynamic-range int8 weights
        if quantize == "float16":
            converter.target_spec.supported_types = [tf.float16]
    return converter.convert()


def _onnx_model(fn, input_signature, seeded):
    """``fn`` converted by tf2onnx, its outputs named as ``fn``'s dict keys.

    tf2onnx writes every random op's ``seed`` attribute (0 for an unseeded op, which
    onnxruntime would take as the fixed seed 0): unseeded, they are removed, so that
    onnxruntime seeds each op from the OS when a session starts.
    """
    import tf2onnx  # the optional [export] extra

    concrete = fn.get_concrete_function()
    proto, _ = tf2onnx.convert.from_function(fn, input_signature=[input_signature], opset=_ONNX_OPSET)
    names = sorted(concrete.structured_outputs)  # tf.nest flattens a dict in key order
    renamed = dict(zip([output.name for output in proto.graph.output], names))
    for node in proto.graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        node.output[:] = [renamed.get(name, name) for name in node.output]
        if node.op_type.startswith("Random") and not seeded:
            kept = [attribute for attribute in node.attribute if attribute.name != "seed"]
            del node.attribute[:]
            node.attribute.extend(kept)
    for output in proto.graph.output:
        output.name = renamed[output.name]
    return proto


def _replace(staging, filepath):
    """Moves ``staging`` to ``filepath``, replacing what is there only now that the export succeeded."""
    if os.path.isdir(filepath) and not os.path.islink(filepath):
        shutil.rmtree(filepath)
    elif os.path.exists(filepath):
        os.remove(filepath)
    os.replace(staging, filepath)


# -- random-free modes: moment propagation and frozen weight samples -------------------------------

#: Values of :func:`export`'s ``mode``: ``"monte_carlo"`` (random endpoints, the default),
#: ``"moments"`` (:mod:`tfbnn.moments`' one-pass graph) and ``"frozen"`` (K weight samples as constants).
MODES = ("monte_carlo", "moments", "frozen")
#: The TensorFlow op types that draw random numbers: a ``"moments"`` or ``"frozen"`` export has none of them.
RANDOM_OPS = (
    "RandomStandardNormal", "RandomUniform", "RandomUniformInt", "TruncatedNormal", "RandomShuffle", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "Multinomial", "ParameterizedTruncatedNormal", "StatelessRandomNormal",
    "StatelessRandomUniform", "StatelessRandomUniformInt", "StatelessRandomUniformFullInt",
    "StatelessTruncatedNormal", "StatelessRandomNormalV2", "StatelessRandomUniformV2",
    "StatelessRandomUniformIntV2", "StatelessRandomUniformFullIntV2", "StatelessTruncatedNormalV2",
    "StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg", "StatelessMultinomial",
    "StatefulStandardNormalV2", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulTruncatedNormal", "RngReadAndSkip", "RngSkip",
)


def random_ops(concrete_function):
    """The random op types (:data:`RANDOM_OPS`) in a concrete function's graph, its function library included.

    Args:
        concrete_function: a ``tf.function``'s concrete function (or a loaded SavedModel's endpoint).

    Returns:
        A sorted list of op type names; empty for a graph that draws nothing.

    Example:
        >>> import tensorflow as tf, tfbnn
        >>> fn = tf.function(lambda x: x + tf.random.normal(tf.shape(x)))
        >>> tfbnn.export.random_ops(fn.get_concrete_function(tf.TensorSpec([2])))
        ['RandomStandardNormal']
    """
    graph_def = concrete_function.graph.as_graph_def()
    nodes = list(graph_def.node) + [node for fn in graph_def.library.function for node in fn.node_def]
    return sorted({node.op for node in nodes} & set(RANDOM_OPS))


def _frozen_layer(layer):
    """Whether ``layer``'s weights are frozen as samples; a ValueError for other stochastic layers."""
    if not isinstance(layer, StochasticLayer):
        return False
    supported = (isinstance(layer, (MeanFieldGaussian, VariationalDropoutLayer))
                 and isinstance(layer, (DenseArguments, ConvArguments))
                 and not isinstance(layer, ConvTransposeArguments) and not getattr(layer, "low_rank", False))
    if not supported:
        raise ValueError(
            f"A frozen export stacks weight samples of the mean-field Bayes-by-Backprop and variational-dropout dense "
            f"and convolution layers; layer '{layer.name}' (class {type(layer).__name__}) draws other noise. "
            "Use mode='moments' where supported, or mode='monte_carlo'.")
    return True


def frozen_samples(model, num_samples, seed=0):
    """``num_samples`` posterior weight samples of every Bayesian layer of ``model``, drawn once with ``seed``.

    The draw (what :func:`export` with ``mode="frozen"`` bakes in): one
    ``numpy.random.default_rng(seed)``; for each Bayesian layer in the order of the
    model's layers, ``K`` standard normals of the kernel's shape ``eps`` (float32) and
    then, for a Bayesian bias, ``K`` of the bias's shape ``eps_b``; the samples are
    ``kernel = mu + sigma * eps`` and ``bias = b_mu + b_sigma * eps_b`` (a point-estimate
    bias repeated; variational dropout's ``sigma = sqrt(alpha) |theta|``; a layer in
    ``inference_mode="mean"`` gets ``sigma = 0``, its noise still drawn).

    Args:
        model: a built Sequential or functional model of chained layers (see
            :func:`tfbnn.moments.model_layers`).
        num_samples: int >= 1, ``K``.
        seed: int >= 0, the seed of the draw. Default 0.

    Returns:
        A list of ``(layer, kernels (K, ...), biases (K, ...) or None)`` NumPy float32 arrays.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.layers.DenseFlipout(3, seed=0)])
        >>> [(k.shape, b.shape) for layer, k, b in tfbnn.export.frozen_samples(model, 5, seed=1)]
        [((5, 4, 3), (5, 3))]
    """
    num_samples = checks.integer("num_samples", num_samples, 1)
    seed = checks.seed(seed)
    rng = np.random.default_rng(seed)
    draws = []
    for layer in moments_lib.model_layers(model):
        if not _frozen_layer(layer):
            continue
        sampling = layer.inference_mode != "mean"
        loc = np.asarray(layer.kernel_loc, np.float32)
        if isinstance(layer, VariationalDropoutLayer):
            scale = np.sqrt(np.asarray(layer.kernel_variance(), np.float32))
        else:
            scale = np.asarray(layer.kernel_scale(), np.float32)
        eps = rng.standard_normal((num_samples, *loc.shape), dtype=np.float32)
        kernels = loc + (scale if sampling else 0.0) * eps
        biases = None
        if layer.use_bias:
            bias = np.asarray(layer.bias_loc, np.float32)
            biases = np.broadcast_to(bias, (num_samples, *bias.shape)).copy()
            if getattr(layer, "bayesian_bias", False):
                eps_b = rng.standard_normal((num_samples, *bias.shape), dtype=np.float32)
                biases = bias + (np.asarray(layer.bias_scale(), np.float32) if sampling else 0.0) * eps_b
        draws.append((layer, kernels, biases))
    return draws


def _fold_samples(x, channel_axis):
    """``(K, B, ..., C, ...)`` -> ``(B, ..., K * C, ...)``: the K samples moved into the channel axis (K-major)."""
    rank = len(x.shape)
    axis = channel_axis % (rank - 1)  # the channel axis of one sample's (B, ...) tensor
    moved = tf.transpose(x, [*range(1, axis + 1), 0, *range(axis + 1, rank)])
    shape = tf.shape(moved)
    return tf.reshape(moved, tf.concat([shape[:axis], [-1], shape[axis + 2:]], 0))


def _unfold_samples(y, channel_axis, num_samples):
    """The inverse of :func:`_fold_samples`: ``(B, ..., K * F, ...)`` -> ``(K, B, ..., F, ...)``."""
    rank = len(y.shape)
    axis = channel_axis % rank
    shape = tf.shape(y)
    split = tf.reshape(y, tf.concat([shape[:axis], [num_samples, -1], shape[axis + 1:]], 0))
    return tf.transpose(split, [axis, *range(axis), *range(axis + 1, rank + 1)])


def _stacked_layer(layer, h, kernels, biases):
    """``layer`` with its K kernels (and biases) applied to the K blocks of ``h`` ``(K, B, ...)``: one op each."""
    num_samples = kernels.shape[0]
    kernels = tf.constant(kernels)
    if isinstance(layer, DenseArguments):
        shape = tf.shape(h)
        flat = tf.reshape(h, tf.stack([num_samples, -1, shape[-1]]))
        out = tf.reshape(tf.matmul(flat, kernels), tf.concat([shape[:-1], [layer.units]], 0))
        bias_shape = [num_samples] + [1] * (len(h.shape) - 2) + [layer.units]
    else:  # a grouped convolution: group k holds sample k's input channels and kernel
        rank = layer.rank
        folded_kernel = tf.reshape(tf.transpose(kernels, [*range(1, rank + 2), 0, rank + 2]),
                                   [*kernels.shape[1:rank + 2], -1])
        out = layer.channels_last(keras.ops.conv, _fold_samples(h, layer.channel_axis), folded_kernel,
                                  strides=layer.strides, padding=layer.padding, dilation_rate=layer.dilation_rate)
        out = _unfold_samples(out, layer.channel_axis, num_samples)
        bias_shape = layer.channel_shape(leading=(num_samples, 1))
    if biases is not None:
        out = out + tf.reshape(tf.constant(biases), bias_shape)
    return out if layer.activation is None else layer.activation(out)


def _frozen_outputs(model, draws, x):
    """The K frozen networks on ``x``: outputs ``(K, B, ...)``, one batched graph (no loop over K)."""
    num_samples = draws[0][1].shape[0] if draws else 1
    stacked = {id(layer): (kernels, biases) for layer, kernels, biases in draws}
    shape = tf.shape(x)
    h = tf.broadcast_to(x[tf.newaxis], tf.concat([[num_samples], shape], 0))
    for layer in moments_lib.model_layers(model):
        if id(layer) in stacked:
            h = _stacked_layer(layer, h, *stacked[id(layer)])
            continue
        merged = tf.reshape(h, tf.concat([[-1], tf.shape(h)[2:]], 0))  # (K * B, ...), sample-major
        out = layer(merged, training=False)
        h = tf.reshape(out, tf.concat([[num_samples, shape[0]], tf.shape(out)[1:]], 0))
    return h


def _output_task(model, task, from_logits, head):
    """The task of a ``moments`` / ``frozen`` export: ``task``, or the head's, or read from the output layer."""
    if task is not None or head is not None:
        return task or head.task
    if from_logits:
        return "classification"
    activation = getattr(output_layer(model), "activation", None)
    ends_in = getattr(activation, "__name__", None)
    return "classification" if ends_in in ("softmax", "sigmoid") or isinstance(
        output_layer(model), keras.layers.Softmax) else "regression"


def _mode_endpoints(model, mode, num_samples, seed, task, head, from_logits, input_signature,
                    covariance="diagonal"):
    """``{name: tf.function}`` of a ``moments`` or ``frozen`` export (no random op in any of them).

    Without AutoGraph: their Python control flow is fixed at trace time, and converting the layer
    walk costs seconds per trace."""
    @tf.function(input_signature=[input_signature], autograph=False)
    def mean(x):
        with posterior_mean(model):
            return model(x, training=False)

    if mode == "moments":
        @tf.function(input_signature=[input_signature], autograph=False)
        def summary(x):
            return moments_lib.propagate(model, x, covariance=covariance).summary(task, from_logits)

        @tf.function(input_signature=[input_signature], autograph=False)
        def moments(x):
            out = moments_lib.propagate(model, x, covariance=covariance)
            if covariance == "full":
                return {"mean": out.mean, "variance": out.variance, "covariance": out.covariance}
            return {"mean": out.mean, "variance": out.variance}

        return {"summary": summary, "moments": moments, "mean": mean}
    draws = frozen_samples(model, num_samples, seed)

    @tf.function(input_signature=[input_signature], autograph=False)
    def summary(x):
        return _summarize_samples(_frozen_outputs(model, draws, x), task, from_logits, head)

    @tf.function(input_signature=[input_signature], autograph=False)
    def samples(x):
        return _frozen_outputs(model, draws, x)

    return {"summary": summary, "samples": samples, "mean": mean}


def _export_mode(model, filepath, format, mode, num_samples, task, from_logits, input_signature, seed,
                 covariance="diagonal"):
    """:func:`export` with ``mode="moments"`` or ``"frozen"``: the endpoints traced, checked and written."""
    if format != "saved_model":  # TFLite lacks Erfc (the ReLU moments) and a grouped convolution of unknown shape
        raise ValueError(f"mode={mode!r} exports format='saved_model'. Received: format={format!r}")
    if isinstance(model, DeepEnsemble):
        raise ValueError(f"A DeepEnsemble exports with mode='monte_carlo'. Received: mode={mode!r}")
    if mode == "moments" and seed is not None:
        raise ValueError(f"mode='moments' draws nothing: `seed` is for mode='frozen'. Received: seed={seed!r}")
    head = _task_and_head(model, task)[1]
    task = _output_task(model, task, from_logits, head)
    input_signature = _input_signature(model, input_signature)
    endpoints = _mode_endpoints(model, mode, num_samples, 0 if seed is None else seed, task, head, from_logits,
                                input_signature, covariance)
    for name, fn in endpoints.items():  # trace now: an unsupported layer fails before anything is written
        ops = random_ops(fn.get_concrete_function())
        if ops:
            raise ValueError(f"The {name!r} endpoint of mode={mode!r} would hold random ops {sorted(ops)}. "
                             f"Received: a model with layers {[layer.name for layer in stochastic_layers(model)]}")
    folder = os.path.dirname(os.path.abspath(filepath))
    staging = tempfile.mkdtemp(dir=folder, prefix=f".{os.path.basename(filepath)}.partial-")
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        for name, fn in endpoints.items():  # the first, summary, is also serving_default
            archive.add_endpoint(name, fn)
        target = os.path.join(staging, "saved_model")
        archive.write_out(target, verbose=False)
        _replace(target, filepath)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return filepath


def _export_posterior(posterior, filepath, format, mode, num_samples, task, from_logits, input_signature,
                      overwrite, seed):
    """:func:`export` of a :class:`tfbnn.inference.FittedPosterior`: K weight draws stored in a SavedModel."""
    if format != "saved_model":
        raise ValueError(f"A fitted posterior exports format='saved_model'. Received: format={format!r}")
    if mode == "moments":
        raise ValueError("A fitted posterior exports its weight draws (mode='monte_carlo' or 'frozen'). "
                         f"Received: mode={mode!r}")
    model = posterior.model
    filepath = _check_target(model, filepath)
    num_samples = checks.integer("num_samples", num_samples, 1)
    seed = checks.numpy_seed(seed)
    if os.path.exists(filepath) and not overwrite:
        raise ValueError(f"{filepath!r} exists; pass overwrite=True to replace it. Received: filepath={filepath!r}")
    if posterior.task is not None:
        if task not in (None, posterior.task) or from_logits:
            raise ValueError(f"The posterior is a {posterior.task} posterior whose outputs it reads itself. "
                             f"Received: task={task!r}, from_logits={from_logits!r}")
        task, head = posterior.task, None
    else:
        head = _task_and_head(model, task)[1]
        task = _output_task(model, task, from_logits, head)
    noise = posterior.noise_scales(num_samples)
    if noise is not None:  # appended to the outputs in a GaussianHead's layout, as tfbnn.predict does
        task, head = "regression", GaussianHead()
    input_signature = _input_signature(model, input_signature)
    draws = tf.constant(np.asarray(posterior.weight_draws(num_samples, seed=seed), keras.config.floatx()))

    def outputs(x):
        samples = posterior.forward(draws, x)
        if noise is None:
            return samples
        scales = tf.reshape(tf.constant(noise, samples.dtype), [-1] + [1] * (samples.shape.rank - 1))
        return tf.concat([samples, tf.broadcast_to(scales, tf.shape(samples))], axis=-1)

    @tf.function(input_signature=[input_signature], autograph=False)
    def summary(x):
        return _summarize_samples(outputs(_finite_inputs(x)), task, from_logits, head)

    @tf.function(input_signature=[input_signature], autograph=False)
    def samples(x):
        return outputs(_finite_inputs(x))

    folder = os.path.dirname(os.path.abspath(filepath))
    staging = tempfile.mkdtemp(dir=folder, prefix=f".{os.path.basename(filepath)}.partial-")
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        for name, fn in (("summary", summary), ("samples", samples)):  # summary is also serving_default
            archive.add_endpoint(name, fn)
        target = os.path.join(staging, "saved_model")
        archive.write_out(target, verbose=False)
        _replace(target, filepath)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return filepath


def export(model, filepath, format="saved_model", num_samples=100, task=None, from_logits=False,
           input_signature=None, overwrite=False, seed=None, quantize=None, mode="monte_carlo",
           moments_covariance="diagonal"):
    """Exports ``model`` for serving: a SavedModel, a TFLite flatbuffer or ONNX graphs.

    Every format serves the posterior predictive and its uncertainty without tfbnn:

    - ``"saved_model"``: a folder, :func:`export_saved_model` (endpoints ``summary``,
      ``sample``, ``mean``, ``summary_seeded``, ``sample_seeded``).
    - ``"tflite"``: one ``.tflite`` file with the signatures ``summary``, ``sample`` and
      ``mean`` (:data:`PORTABLE_ENDPOINTS`), built-in ops only: run them with
      ``tf.lite.Interpreter(path).get_signature_runner(name)(x=x)``.
    - ``"onnx"``: a folder with ``summary.onnx``, ``sample.onnx`` and ``mean.onnx``
      (opset 17, standard ops only), input ``x``; run with onnxruntime.

    Outputs: ``summary`` gives, for a classifier, ``mean_probs`` (B, K), the mean of
    T softmax outputs ``p_t``; ``predictive_entropy`` ``H[mean_t p_t]``; ``aleatoric``
    ``mean_t H[p_t]``; ``epistemic`` their difference, the mutual information
    (Depeweg et al. 2018, eq. 2; Trinh et al. 2022, eqs. 26-27); for regression
    ``mean`` and ``epistemic_std`` over the T draws. ``sample`` and ``mean`` give
    ``output``: one posterior draw, and the posterior-mean prediction.

    Randomness: TFLite and ONNX draw with stateful random ops (:func:`portable_noise`),
    the same distributions as the layers' own noise. With ``seed=None`` every
    interpreter / session seeds itself from the OS: fresh draws in every process and
    every call. With an int ``seed`` the seeds are written into the file: every fresh
    interpreter / session replays the same sequence of draws (the first call repeats,
    later calls continue the stream). There is no per-call seed input in these two
    formats (their random ops take seeds as attributes); the SavedModel's
    ``*_seeded(x, seed)`` endpoints have one.

    Why not ``model.export``: Keras saves each layer's ``SeedGenerator`` state with the
    model, so every fresh process that loads a ``model.export`` SavedModel replays the
    same "random" draws. Export with this function instead.

    Random-free modes, for runtimes without random number generation (TF.js, TensorRT,
    Core ML, which convert from a SavedModel), ``format="saved_model"`` only (TFLite has no
    built-in ``Erfc``, which the ReLU moments use, nor a grouped convolution of unknown
    shape; not offered yet); no endpoint holds a random op
    (:data:`RANDOM_OPS`, checked when exporting):

    - ``mode="moments"``: the one-pass moment-propagation graph of :mod:`tfbnn.moments`
      (diagonal DVI, Wu et al. 2019). Endpoints ``summary`` (``serving_default``:
      ``mean_probs`` by the probit approximation and ``predictive_entropy``; for
      regression ``mean``, ``epistemic_std`` and, behind a :class:`tfbnn.GaussianHead`,
      ``aleatoric_std``; no aleatoric / epistemic entropy split), ``moments`` (``mean``
      and ``variance`` of the outputs, of the logits for a softmax / sigmoid output) and
      ``mean`` (the posterior-mean network). Cost: about two to three times the
      posterior-mean network. Loses: correlations between units (an approximation
      beyond the first layers; ``moments_covariance="full"`` keeps them between the units
      of dense layers, at ``O(d^2)`` memory per example), the entropy split, and layers
      without a moment rule.
    - ``mode="frozen"``: ``K = num_samples`` weight samples of every Bayesian layer drawn
      once with ``seed`` (None: 0; :func:`frozen_samples`) and stored as constants; the
      K networks run stacked in one batched graph (a batched matmul per dense layer, a
      grouped convolution per convolution). Endpoints ``summary`` (the Monte Carlo summary
      over the K networks, with the entropy split), ``samples`` (``(K, B, ...)``) and
      ``mean``. Loses: fresh randomness (every call sees the same K functions, a fixed
      K-member ensemble), and the weights grow K-fold; layers that draw per-example noise
      (MC dropout, iBNN, Flipout's and local reparameterization's per-example noise is
      replaced by the K shared weight samples) are refused when they are not mean-field
      weight posteriors.

    With these modes ``task=None`` reads the task from the output: a distribution head's,
    classification for a softmax or sigmoid output or ``from_logits``, else regression.

    Fitted posteriors (:class:`tfbnn.inference.FittedPosterior`: a fitted
    :class:`tfbnn.laplace.Laplace`, :class:`tfbnn.swag.SWAGPosterior`,
    :class:`tfbnn.hmc.HMCResult`) export as a SavedModel holding ``K = num_samples``
    weight draws ``posterior.weight_draws(K, seed)``, drawn once (``seed`` None: unseeded);
    endpoints ``summary`` (``serving_default``; the K-draw predictive, equal to
    ``tfbnn.predict(posterior, x, num_samples=K, seed=seed)``) and ``samples`` (``(K, B,
    ...)``, with the noise scales appended for a Gaussian likelihood). Like
    ``mode="frozen"``, every call sees the same K functions. (A last-layer Laplace also
    exports as a sampling Keras model, ``export(la.to_model(), path)``, with fresh draws
    in every call.)

    Quantization (``format="tflite"`` only): ``"float16"`` stores every float weight
    as float16 (half the weights' bytes; the file shrinks to about 55-70%, and for
    Flipout / reparameterization layers, whose T draws are separate ops, it grows with T:
    see the Deploying guide's measured sizes); ``"int8"`` is TFLite's dynamic-range quantization,
    int8 weights for the matmuls and convolutions, which for local reparameterization
    are the posterior means and variances. All endpoints survive both; sampling stays
    in float32, with the posterior scales rounded (see the Deploying guide for the
    measured effect on accuracy, NLL and ECE).

    Mixed precision: a model trained under ``"mixed_float16"`` or ``"mixed_bfloat16"``
    exports to every format. Its SavedModel and ONNX graphs compute in the policy's
    dtype (summaries in float32); TFLite's built-in kernels have no float16 matmul, so
    the TFLite export runs a float32 copy of the model (its variables are float32
    anyway, see :meth:`tfbnn.layers.BayesianLayer.add_weight`): ``quantize="float16"``
    is how TFLite halves the weights.

    Args:
        model: a built Keras model with tfbnn layers; a :class:`tfbnn.DeepEnsemble`
            exports as a SavedModel only; a fitted posterior (above) too.
        filepath: the output: a folder (``saved_model``, ``onnx``) or a file (``tflite``).
        format: one of :data:`FORMATS`.
        num_samples: int >= 1, T of the ``summary`` endpoints.
        task: ``"classification"``, ``"regression"`` or None (default): the task of the
            model's distribution head (a :class:`tfbnn.GaussianHead` exports as
            regression), ``"classification"`` without one. An explicit task must be
            the head's.
        from_logits: bool, whether classification outputs are logits.
        input_signature: a ``tf.TensorSpec`` for ``x``; default from ``model.inputs``.
        overwrite: bool. If False and ``filepath`` exists, raise instead of replacing it.
        seed: int >= 0 or None, the fixed seed of a ``tflite`` / ``onnx`` export (see
            above); None for a ``saved_model`` (it has seeded endpoints). With
            ``mode="frozen"``: the seed of the K weight samples (None: 0). For a fitted
            posterior: the seed of its K weight draws.
        quantize: one of :data:`QUANTIZATIONS`, for ``tflite``.
        mode: one of :data:`MODES`: ``"monte_carlo"`` (default; random endpoints),
            ``"moments"`` or ``"frozen"`` (random-free, above).
        moments_covariance: with ``mode="moments"``, ``"diagonal"`` (default) or ``"full"``
            (:func:`tfbnn.moments.propagate`'s ``covariance``: the covariance between the
            units of each dense layer kept; the ``moments`` endpoint adds ``covariance``
            ``(B, n, n)``).

    Returns:
        ``filepath``. Nothing is replaced when the export fails.

    Example:
        >>> import os, tempfile, keras, numpy as np, tensorflow as tf, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, activation="softmax", seed=0)])
        >>> path = tfbnn.export.export(model, os.path.join(tempfile.mkdtemp(), "bbb.tflite"), format="tflite",
        ...                            num_samples=30)
        >>> summary = tf.lite.Interpreter(path).get_signature_runner("summary")
        >>> out = summary(x=np.ones((2, 4), "float32"))
        >>> sorted(out), out["epistemic"].shape
        (['aleatoric', 'epistemic', 'mean_probs', 'predictive_entropy'], (2,))
    """
    if format not in FORMATS:
        raise ValueError(f"Expected `format` in {FORMATS}. Received: format={format!r}")
    if mode not in MODES:
        raise ValueError(f"Expected `mode` in {MODES}. Received: mode={mode!r}")
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"Expected `quantize` in {QUANTIZATIONS}. Received: quantize={quantize!r}")
    if quantize is not None and format != "tflite":
        raise ValueError(f"Quantization is offered for format='tflite'. Received: quantize={quantize!r}, "
                         f"format={format!r}")
    if isinstance(model, FittedPosterior):
        return _export_posterior(model, filepath, format, mode, num_samples, task, from_logits, input_signature,
                                 overwrite, seed)
    if moments_covariance not in moments_lib.COVARIANCES:
        raise ValueError(f"Expected `moments_covariance` in {moments_lib.COVARIANCES}. "
                         f"Received: moments_covariance={moments_covariance!r}")
    if moments_covariance != "diagonal" and mode != "moments":
        raise ValueError(f"`moments_covariance` is for mode='moments'. Received: moments_covariance="
                         f"{moments_covariance!r}, mode={mode!r}")
    if mode != "monte_carlo":
        filepath = _check_target(model, filepath)
        num_samples = checks.integer("num_samples", num_samples, 1)
        if os.path.exists(filepath) and not overwrite:
            raise ValueError(f"{filepath!r} exists; pass overwrite=True to replace it. Received: filepath={filepath!r}")
        return _export_mode(model, filepath, format, mode, num_samples, task, from_logits, input_signature, seed,
                            moments_covariance)
    if format == "saved_model":
        if seed is not None:
            raise ValueError("A SavedModel takes its seed per call (sample_seeded, summary_seeded); "
                             f"`seed` is for format='tflite' or 'onnx'. Received: seed={seed!r}")
        return export_saved_model(model, filepath, num_samples=num_samples, task=task, from_logits=from_logits,
                                  input_signature=input_signature, overwrite=overwrite)
    filepath = _check_target(model, filepath)
    num_samples = checks.integer("num_samples", num_samples, 1)
    task, _ = _task_and_head(model, task)
    if isinstance(model, DeepEnsemble):
        raise ValueError(f"A DeepEnsemble exports as a SavedModel only. Received: format={format!r}")
    _refuse_unsupported(model, format)
    if os.path.exists(filepath) and not overwrite:
        raise ValueError(f"{filepath!r} exists; pass overwrite=True to replace it. Received: filepath={filepath!r}")
    if format == "tflite":
        model = _computing_in_float32(model)
    _, head = _task_and_head(model, task)  # the head of the float32 copy
    input_signature = _input_signature(model, input_signature)
    folder = os.path.dirname(os.path.abspath(filepath))
    staging = tempfile.mkdtemp(dir=folder, prefix=f".{os.path.basename(filepath)}.partial-")
    try:
        with portable_noise(model, seed), _factored_gp_covariance(model):
            endpoints = _portable_endpoints(model, num_samples, task, head, from_logits, input_signature)
            if format == "tflite":
                target = os.path.join(staging, "model.tflite")
                with open(target, "wb") as f:
                    f.write(_tflite_bytes(endpoints, model, quantize, staging))
            else:
                target = os.path.join(staging, "onnx")
                os.makedirs(target)
                for name, fn in endpoints.items():
                    with open(os.path.join(target, f"{name}.onnx"), "wb") as f:
                        f.write(_onnx_model(fn, input_signature, seed is not None).SerializeToString())
        _replace(target, filepath)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return filepath
