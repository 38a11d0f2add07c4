"""SavedModel export with stochastic, posterior-mean and uncertainty endpoints.

The exported SavedModel needs neither tfbnn nor Keras to serve: load it with plain
``tf.saved_model.load(path)``. Endpoints (``x`` is a batch shaped like the model's
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

import os
import shutil

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.ensembles import DeepEnsemble
from tfbnn.likelihoods import DistributionHead, output_layer
from tfbnn.utils import posterior_mean, stochastic_layers, weight_samples

__all__ = ["export_saved_model", "seed_generators"]

_TASKS = ("classification", "regression")


def seed_generators(model):
    """Every ``keras.random.SeedGenerator`` held by a layer of ``model``."""
    found = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
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


def _classification_summary(samples, from_logits):
    """The graph version of :func:`tfbnn.inference.summarize_classification`
    (same conventions: ``0 log 0 = 0``, mutual information clipped at 0)."""
    probs = tf.nn.softmax(samples, axis=-1) if from_logits else samples
    mean = tf.reduce_mean(probs, axis=0)
    total = -tf.reduce_sum(tf.math.xlogy(mean, mean), axis=-1)
    aleatoric = tf.reduce_mean(-tf.reduce_sum(tf.math.xlogy(probs, probs), axis=-1), axis=0)
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
    return {"mean": tf.reduce_mean(means, axis=0), "epistemic_std": tf.math.reduce_std(means, axis=0),
            "aleatoric_std": tf.sqrt(tf.reduce_mean(variances, axis=0))}


def _output_head(model, task):
    """The model's output distribution head (an ensemble's first member's), or None."""
    layer = output_layer(model.members[0] if isinstance(model, DeepEnsemble) else model)
    if not isinstance(layer, DistributionHead):
        return None
    if task != layer.task:
        raise ValueError(f"The model ends in a {type(layer).__name__}, a {layer.task} head. Received: task={task!r}")
    return layer


def export_saved_model(model, filepath, num_samples=100, task="classification", from_logits=False,
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
            ``from_logits=True``) or ``"regression"``. A model ending in a
            distribution head (:mod:`tfbnn.likelihoods`) is summarised through it,
            as :func:`tfbnn.predict` does, and ``task`` must be the head's.
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
    num_samples = checks.integer("num_samples", num_samples, 1)
    if task not in _TASKS:
        raise ValueError(f"Expected `task` in {_TASKS}. Received: task={task!r}")
    if os.path.exists(filepath) and not overwrite:
        raise ValueError(f"The export folder exists; pass overwrite=True to replace it. Received: filepath={filepath!r}")
    ensemble = isinstance(model, DeepEnsemble)
    if input_signature is None:
        # An ensemble (a subclassed model) has no inputs of its own; every member takes the same input.
        model_inputs = getattr(model.members[0] if ensemble else model, "inputs", None)
        if not model_inputs:
            raise ValueError("The model has no defined inputs; pass `input_signature`. Received: input_signature=None")
        inp = model_inputs[0]
        input_signature = tf.TensorSpec(inp.shape, inp.dtype)
    generators = seed_generators(model)
    head = _output_head(model, task)
    if ensemble and not stochastic_layers(model):
        num_samples = 1  # the M members are the samples; more draws would repeat them

    # The sampling mode is set inside each traced body (Python runs at trace time),
    # so the endpoint is right however often saving retraces it.
    def summarize(x):
        with weight_samples(model, num_samples):
            return _summarize(x)

    def _summarize(x):
        batch = tf.shape(x)[0]
        tiled = tf.tile(x, tf.concat([[num_samples], tf.ones([tf.rank(x) - 1], tf.int32)], axis=0))
        if ensemble:  # (M, T * B, ...) -> (M * T, B, ...), member-major as tfbnn.predict
            outputs = model.call_members(tiled, training=False)
            samples = tf.reshape(outputs, tf.concat([[model.num_members * num_samples, batch],
                                                     tf.shape(outputs)[2:]], axis=0))
            samples.set_shape([None, None, *outputs.shape[2:]])
        else:
            outputs = model(tiled, training=False)
            samples = tf.reshape(outputs, tf.concat([[num_samples, batch], tf.shape(outputs)[1:]], axis=0))
            samples.set_shape([None, None, *outputs.shape[1:]])
        if task == "classification":
            if head is not None:
                return _classification_summary(head.class_probabilities(samples), False)
            return _classification_summary(samples, from_logits)
        return _regression_summary(samples, head)

    def draw(x, seed):
        _reseed(generators, seed)
        return _member_draw(model, x, seed) if ensemble else model(x, training=False)

    @tf.function(input_signature=[input_signature])
    def sample(x):
        return draw(x, _fresh_seed())

    @tf.function
    def sample_seeded(x, seed):
        return draw(x, seed)

    @tf.function(input_signature=[input_signature])
    def mean(x):
        with posterior_mean(model):
            return model(x, training=False)

    @tf.function(input_signature=[input_signature])
    def summary(x):
        _reseed(generators, _fresh_seed())
        return summarize(x)

    @tf.function
    def summary_seeded(x, seed):
        _reseed(generators, seed)
        return summarize(x)

    saved_states = [g.state.numpy() for g in generators]
    try:
        for fn in (sample, mean, summary):
            fn.get_concrete_function()
        for fn in (sample_seeded, summary_seeded):  # the seed as an int64 or an int32 scalar
            for dtype in (tf.int64, tf.int32):
                fn.get_concrete_function(input_signature, tf.TensorSpec([], dtype, name="seed"))
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
