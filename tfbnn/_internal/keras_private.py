"""The one module that reaches private Keras and TensorFlow API.

tfbnn needs a few things Keras 3 and TensorFlow offer no public API for. Every such use
is a small named function here, whose docstring says which private API it touches, why,
and the public replacement to switch to when one appears; the rest of the package calls
these functions (``tests/_internal/test_keras_private.py`` keeps it so). A Keras or
TensorFlow upgrade that moves one of them breaks this file only.

Checked on Keras 3.15 and TensorFlow 2.21.
"""

import keras

#: The attribute of a LoRA-enabled ``keras.layers.Dense`` / ``EinsumDense`` that holds the frozen base kernel
#: ``W0`` (the public ``kernel`` property returns the merged ``W0 + s A B``). Private: ``Dense._kernel``.
#: Public replacement: none in Keras 3.15.
LORA_BASE_KERNEL = "_kernel"


def sublayers(layer, include_self=False, recursive=True):
    """The layers tracked by ``layer`` (nested ones too with ``recursive``), in Keras' order.

    Private: ``keras.layers.Layer._flatten_layers``. Why: a layer may hold sublayers as
    attributes (wrappers, custom blocks, nested models); Keras tracks them, and only this
    method walks them. Public replacement: none in Keras 3.15 (``keras.Model.layers`` is
    one level of a model only, and ``keras.layers.Layer`` has no ``submodules``).

    Args:
        layer: a ``keras.layers.Layer`` (a model too).
        include_self: bool, ``layer`` first.
        recursive: bool, nested layers too (False: the direct sublayers).

    Returns:
        A list of layers.
    """
    return list(layer._flatten_layers(include_self=include_self, recursive=recursive))


def output_layer(model):
    """The layer whose output is ``model``'s first output.

    Public API for a model with one output: ``model.layers[-1]`` (a ``Sequential``) or
    ``model.operations[-1]`` (a functional model: its operations in topological order;
    the one producing a single output is the only one no other consumes, so it is the
    last). Formerly, and still for a model with several outputs, the private
    ``KerasTensor._keras_history.operation`` of ``model.outputs[0]``; public replacement
    for that case: none in Keras 3.15.

    Args:
        model: a built Sequential or functional ``keras.Model``.
    """
    if isinstance(model, keras.Sequential):
        return model.layers[-1]
    if len(model.outputs) == 1:
        return model.operations[-1]
    return model.outputs[0]._keras_history.operation


def inbound_layer(layer):
    """The layer whose output feeds ``layer`` at its first call (its first input).

    Private: ``Layer._inbound_nodes`` and ``KerasTensor._keras_history``. Why: reading a
    functional graph backwards from a layer called more than once (the public
    ``layer.input`` raises then). Public replacement: none in Keras 3.15.
    """
    return layer._inbound_nodes[0].input_tensors[0]._keras_history.operation


def quiet_retracing(function):
    """``function`` (a ``tf.function``) without TensorFlow's "frequent retracing" warning; returns it.

    Private: ``tf.function``'s ``_omit_frequent_tracing_warning`` attribute. Why: each
    fitted posterior compiles its own forward pass (at most twice); TensorFlow counts the
    traces of every instance together and would warn of retracing. Public replacement:
    none in TensorFlow 2.21 (``reduce_retracing=True`` bounds the traces, not the warning).
    """
    function._omit_frequent_tracing_warning = True
    return function


def symbolic_build(model, data_batch):
    """Builds ``model``'s optimizer and metric state from one batch before tracing; False if Keras lacks it.

    Private: ``keras.Model._symbolic_build``. Why: a train step traced before its state
    exists creates the state inside the trace (a retrace, and under ``tf.distribute`` a
    failure). Public replacement: none in Keras 3.15 (``model.optimizer.build(model.
    trainable_variables)`` builds the optimizer only; the caller falls back to it).
    """
    build = getattr(model, "_symbolic_build", None)
    if not callable(build):
        return False
    build(data_batch=tuple(data_batch))
    return True


def initial_epoch(model):
    """The ``initial_epoch`` of the ``fit`` call now starting (0 when unknown).

    Private: ``keras.Model._initial_epoch`` (set by ``fit``). Why: a callback's
    ``on_train_begin`` must apply its schedule at the epoch a resumed ``fit`` starts from,
    before the first train step is traced. Public replacement: none in Keras 3.15
    (``on_epoch_begin`` gets the epoch, too late for the first trace).
    """
    return getattr(model, "_initial_epoch", 0) or 0


def in_xla_context():
    """True while tracing a function that XLA compiles (``jit_compile=True``, TPU); False if unknown.

    Private: ``tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext`` and
    ``tensorflow.python.framework.ops.get_default_graph``. Why: the KL is written in the
    form XLA compiles best only under XLA. Public replacement: none in TensorFlow 2.21.
    """
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TensorFlow without the internal module
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def philox_key_counter(seed):
    """Philox's ``(key, counter)`` for a stateless ``seed``, as ``tf.random.stateless_*(..., alg="philox")`` computes them.

    Private: ``tensorflow.python.ops.random_ops_util.get_key_counter_alg``. Why: inside a function
    XLA compiles, the one-op path (``tf.raw_ops.StatelessRandomGetKeyCounter``, whose CPU and GPU
    kernels scramble the seed as this does) scrambles otherwise, and the layers' draws must stay
    TensorFlow's Philox stream there too. Public replacement: none in TensorFlow 2.21 (the public
    stateless ops take a seed, not a key and counter).
    """
    from tensorflow.python.ops import random_ops_util

    return random_ops_util.get_key_counter_alg(seed, "philox")[:2]


def keras_test_case():
    """Keras' own layer test case class (``run_layer_test``), for :mod:`tfbnn.testing`.

    Private: ``keras.src.testing.TestCase``. Why: the conformance harness runs every
    public layer through Keras' own layer contract. Public replacement: none in Keras 3.15.
    Imported when called: it loads Keras' test utilities.
    """
    from keras.src.testing import TestCase

    return TestCase


def override_call(layer, call):
    """Makes ``layer(...)`` run ``call`` instead of its class's ``call`` until :func:`restore_call`.

    Unsupported use of Keras: an instance attribute shadowing ``Layer.call`` (Keras' ``__call__``
    looks ``self.call`` up on the instance). Why: Laplace-LoRA and KFAC over every layer (tfbnn.laplace) probe
    the pre-activations of layers inside a model they did not build. Public replacement: none in Keras 3.15.
    """
    layer.call = call


def restore_call(layer):
    """Undoes :func:`override_call`."""
    del layer.call


def override_variable_saving(layer, save=None, load=None):
    """Makes ``layer`` save (``save(store)``) and/or load (``load(store)``) its own variables these ways.

    Unsupported use of Keras: instance attributes shadowing ``Layer.save_own_variables`` /
    ``Layer.load_own_variables``, which Keras' ``.keras`` saving calls on the instance. Why:
    Keras' LoRA layers save the merged kernel and zero the factors on load, erasing an
    adapter posterior. Public replacement: none in Keras 3.15. :func:`restore_variable_saving`
    removes them again.
    """
    if save is not None:
        layer.save_own_variables = save
    if load is not None:
        layer.load_own_variables = load


def restore_variable_saving(layer, save=False, load=False):
    """Undoes :func:`override_variable_saving` for the saving (``save``) and/or loading (``load``) method."""
    if save:
        del layer.save_own_variables
    if load:
        del layer.load_own_variables


__all__ = ["LORA_BASE_KERNEL", "calling_model", "sublayers", "output_layer", "inbound_layer", "quiet_retracing", "symbolic_build",
           "initial_epoch", "in_xla_context", "philox_key_counter", "keras_test_case", "override_call", "restore_call",
           "override_variable_saving", "restore_variable_saving"]


def calling_model():
    """The outermost layer or model whose call is running now, or None.

    Private: Keras' call context (``keras.src.backend.common.global_state``'s
    ``current_call_ctx``, whose ``entry_layer`` is the model that ``fit``, ``evaluate``,
    ``predict`` or ``model(x)`` called). Why: the distribution heads refuse a plain metric
    compiled on the model that runs them, and Keras gives a layer no reference to that
    model. Public replacement: none in Keras 3.15. If a later Keras moves it, this returns
    None and the check that uses it is skipped rather than failing.
    """
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # pragma: no cover - a Keras without this module
        return None
    context = global_state.get_global_attribute("current_call_ctx")
    return getattr(context, "entry_layer", None)
