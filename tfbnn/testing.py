"""A shared layer-test harness, in the spirit of Keras' ``run_layer_test``.

:func:`run_layer_test` checks what every tfbnn Bayesian layer promises:

1. config round trip: ``from_config(get_config())`` gives the same config;
2. the output shape on a concrete batch and through ``compute_output_shape``;
3. exactly ``expected_num_losses`` entries in ``layer.losses`` after a call
   (the ``kl_weight * KL`` term) and ``expected_num_seed_generators`` seed generators;
4. ``.keras`` save/load inside a ``Sequential``: identical weights, identical
   posterior-mean outputs and, because the seed state is saved, identical sampled
   outputs on the next call;
5. it trains: one compiled ``fit`` epoch keeps the loss finite and moves the weights;
6. mixed precision, as Keras' own harness checks it (``run_mixed_precision_check``), and
   more: under ``"mixed_float16"`` and ``"mixed_bfloat16"`` the outputs are in the compute
   dtype, every float weight is float32, the KL is float32 and equals the float32 layer's
   (same weights, same seed state), the posterior-mean outputs are close to float32's, and
   one ``fit`` epoch under the first of them keeps the loss finite;
7. with ``keras_checks=True``, also what Keras promises of any layer, by Keras' own
   harness (its test case's ``run_layer_test``, private Keras API): build from a shape, symbolic
   and eager calls with the same output shape, the weight, seed-generator and loss
   counts, a ``fit`` run, masking support where asked. This is the one harness: a test
   of a tfbnn layer asks it for Keras' checks instead of calling Keras' harness itself.

The conformance harness (``tests/test_conformance.py``) runs over every public layer and
model class of tfbnn (:func:`public_classes`): each has a construction :class:`Case` or a
declared row in :data:`DECLARED`, the one table of exceptions, with its reason; each
capability of :data:`CAPABILITIES` passes its check or is declared, and a declared refusal
or known defect is checked to still fail as documented. :func:`support_matrix_markdown`
writes the deployment guide's support matrix from that table
(``python -m tfbnn.testing --write-support-matrix``). A new public layer adds a case to
``_cases()`` here (a few keyword arguments, an input shape, Keras' counts).

Example:
    >>> from tfbnn import testing, layers
    >>> layer = testing.run_layer_test(layers.DenseFlipout, {"units": 3, "seed": 1}, input_shape=(4, 5),
    ...                                expected_output_shape=(4, 3))
    >>> layer.units, layer.built
    (3, True)
"""

import inspect
import os
import subprocess
import sys
import tempfile

import keras
import numpy as np

from tfbnn import moments
from tfbnn._internal import keras_private
from tfbnn.layers.base import BayesianLayer
from tfbnn.utils import posterior_mean

__all__ = ["run_layer_test", "count_seed_generators", "data_formats", "to_channels_last", "CAPABILITIES", "DECLARED",
           "Case", "cases", "public_classes", "support_matrix_markdown", "write_support_matrix", "check_method"]


def count_seed_generators(layer):
    """Number of distinct ``keras.random.SeedGenerator`` attributes of ``layer`` and of the layers it holds
    (a recurrent layer's cell, say), counted as Keras' own harness counts them."""
    generators, seen, stack = set(), set(), [layer]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for value in vars(current).values():
            values = value if isinstance(value, (list, tuple)) else [value]
            generators.update(id(v) for v in values if isinstance(v, keras.random.SeedGenerator))
            stack.extend(v for v in values if isinstance(v, keras.layers.Layer))
    return len(generators)


def _assert_same_config(a, b):
    if a != b:
        raise AssertionError(f"Config round trip changed the config:\n{a}\n!=\n{b}")


def _assert_allclose(a, b, what, atol=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or not np.allclose(a, b, atol=atol, rtol=1e-5):
        raise AssertionError(f"{what} differ: max |a - b| = {np.max(np.abs(a - b)) if a.shape == b.shape else 'shape'}")


def _check_save_load(layer_cls, init_kwargs, x):
    model = keras.Sequential([keras.Input(x.shape[1:], dtype=x.dtype), layer_cls(**init_kwargs)])
    model(x)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    for w, v in zip(model.weights, loaded.weights):
        _assert_allclose(w.numpy(), v.numpy(), f"weights {w.path}", atol=0)
    _assert_allclose(model(x), loaded(x), "sampled outputs after load (same seed state)")
    with posterior_mean(model), posterior_mean(loaded):
        _assert_allclose(model(x), loaded(x), "posterior-mean outputs after load")
    return loaded


def _check_training(layer_cls, init_kwargs, x, expected_output_shape, seed):
    model = keras.Sequential([keras.Input(x.shape[1:], dtype=x.dtype), layer_cls(**init_kwargs)])
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(x.shape[0],) + tuple(expected_output_shape[1:])).astype("float32")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=max(1, x.shape[0] // 2), epochs=1, verbose=0)
    loss = history.history["loss"][-1]
    if not np.isfinite(loss):
        raise AssertionError(f"Training loss is not finite: {loss}")
    moved = [not np.allclose(b, w.numpy()) for b, w in zip(before, model.trainable_weights)]
    if not all(moved):
        raise AssertionError(f"Some trainable weights did not move in training: {moved}")


#: Policies of the mixed-precision check and the tolerance of their posterior-mean outputs,
#: relative to ``1 + max |float32 output|`` (float16 keeps 11 significant bits, bfloat16 8).
MIXED_PRECISION_TOLERANCE = {"mixed_float16": 1e-2, "mixed_bfloat16": 4e-2}


def _check_mixed_precision(layer_cls, init_kwargs, x, expected_output_shape, seed):
    reference = layer_cls(**init_kwargs)
    reference(x)
    with posterior_mean(reference):
        reference_mean = np.asarray(reference(x))
    trained = False
    for policy, tolerance in MIXED_PRECISION_TOLERANCE.items():
        layer = layer_cls(**{**init_kwargs, "dtype": policy})
        layer(x)
        layer.set_weights(reference.get_weights())
        for weight in layer.weights:
            if "float" in str(weight.dtype) and str(weight.dtype) != "float32":
                raise AssertionError(f"{policy}: weight {weight.path} is {weight.dtype}, expected float32")
        if isinstance(layer, BayesianLayer):
            layer.seed_generator.state.assign(reference.seed_generator.state)
            kl, expected = layer.kl_divergence(), reference.kl_divergence()
            if kl.dtype != "float32" or not np.isfinite(kl):
                raise AssertionError(f"{policy}: the KL is {kl.dtype} {float(kl)}, expected a finite float32")
            _assert_allclose(kl, expected, f"{policy}: KL and float32 KL", atol=1e-5 * (1 + abs(float(expected))))
        outputs = layer(x)
        if outputs.dtype != layer.compute_dtype:
            raise AssertionError(f"{policy}: outputs are {outputs.dtype}, expected {layer.compute_dtype}")
        for loss in layer.losses:
            if loss.dtype != "float32":
                raise AssertionError(f"{policy}: a layer loss is {loss.dtype}, expected float32")
        with posterior_mean(layer):
            mean = np.asarray(layer(x), "float32")
        _assert_allclose(mean, reference_mean, f"{policy}: posterior-mean outputs and float32's",
                         atol=tolerance * (1 + float(np.max(np.abs(reference_mean)))))
        if not trained:  # one fit epoch, under the first policy checked (each costs a compile)
            _check_training(layer_cls, {**init_kwargs, "dtype": policy}, x, expected_output_shape, seed)
            trained = True


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_shape,
    expected_output_shape,
    expected_num_losses=1,
    expected_num_seed_generators=1,
    expected_num_trainable_weights=None,
    run_save_load=True,
    run_training=True,
    run_mixed_precision=True,
    seed=0,
    input_data=None,
    keras_checks=False,
    **keras_options,
):
    """Runs the basic checks of a tfbnn layer; raises ``AssertionError`` on failure.

    Args:
        layer_cls: the layer class.
        init_kwargs: dict of constructor arguments. For a ``BayesianLayer``,
            ``kl_weight`` defaults to 0.01 when absent, so the layer can train.
        input_shape: tuple, shape of a concrete input batch.
        expected_output_shape: tuple, output shape for that batch.
        expected_num_losses: int, entries of ``layer.losses`` after one call.
        expected_num_seed_generators: int.
        expected_num_trainable_weights: int or None (not checked).
        run_save_load: bool, check the ``.keras`` round trip.
        run_training: bool, check one epoch of ``fit``.
        run_mixed_precision: bool, check the layer under ``"mixed_float16"`` and
            ``"mixed_bfloat16"`` against float32 (item 6 above).
        seed: int, seed of the generated data.
        input_data: array of shape ``input_shape`` to use instead of generated
            normal floats (integer ids for an embedding, say).
        keras_checks: bool, also run Keras' own ``run_layer_test`` (item 7) with the same
            class, arguments, shapes and expected counts (``expected_num_trainable_weights``
            required), the input dtype of ``input_data`` and its mixed-precision check when
            ``run_mixed_precision``.
        **keras_options: further arguments of Keras' ``run_layer_test`` (for instance
            ``expected_num_non_trainable_weights``, ``supports_masking``); only with
            ``keras_checks``.

    Returns:
        The layer built and called once.
    """
    if keras_options and not keras_checks:
        raise ValueError(f"Expected keras_checks=True with Keras' options. Received: {sorted(keras_options)}")
    if issubclass(layer_cls, BayesianLayer):
        init_kwargs = {"kl_weight": 0.01, **init_kwargs}
    layer = layer_cls(**init_kwargs)
    _assert_same_config(layer.get_config(), layer_cls.from_config(layer.get_config()).get_config())

    if input_data is None:
        x = np.random.default_rng(seed).normal(size=input_shape).astype("float32")
    else:
        x = np.asarray(input_data)
        if x.shape != tuple(input_shape):
            raise ValueError(f"Expected `input_data` of shape input_shape={tuple(input_shape)}. "
                             f"Received: input_data of shape {x.shape}")
    y = layer(x)
    if tuple(y.shape) != tuple(expected_output_shape):
        raise AssertionError(f"Output shape {tuple(y.shape)} != expected {tuple(expected_output_shape)}")
    inferred = tuple(layer.compute_output_shape(input_shape))
    if inferred != tuple(expected_output_shape):
        raise AssertionError(f"compute_output_shape gave {inferred}, expected {tuple(expected_output_shape)}")
    if len(layer.losses) != expected_num_losses:
        raise AssertionError(f"Expected {expected_num_losses} losses, found {len(layer.losses)}")
    n_seeds = count_seed_generators(layer)
    if n_seeds != expected_num_seed_generators:
        raise AssertionError(f"Expected {expected_num_seed_generators} seed generators, found {n_seeds}")
    if expected_num_trainable_weights is not None and len(layer.trainable_weights) != expected_num_trainable_weights:
        raise AssertionError(
            f"Expected {expected_num_trainable_weights} trainable weights, found {len(layer.trainable_weights)}"
        )
    _assert_same_config(layer.get_config(), layer_cls.from_config(layer.get_config()).get_config())

    if run_save_load:
        _check_save_load(layer_cls, init_kwargs, x)
    if run_training:
        _check_training(layer_cls, init_kwargs, x, expected_output_shape, seed)
    if run_mixed_precision:
        _check_mixed_precision(layer_cls, init_kwargs, x, expected_output_shape, seed)
    if keras_checks:
        _run_keras_harness(layer_cls, init_kwargs, input_shape, expected_output_shape, expected_num_losses,
                           expected_num_seed_generators, expected_num_trainable_weights, run_training,
                           run_mixed_precision, x.dtype, keras_options)
    return layer


def _run_keras_harness(layer_cls, init_kwargs, input_shape, expected_output_shape, num_losses, num_seed_generators,
                       num_trainable_weights, run_training, run_mixed_precision, dtype, options):
    """Keras' own ``run_layer_test`` (not public API: :func:`tfbnn._internal.keras_private.keras_test_case`)."""
    if num_trainable_weights is None:
        raise ValueError("Expected `expected_num_trainable_weights` with keras_checks=True: Keras' harness "
                         "checks the count. Received: expected_num_trainable_weights=None")
    TestCase = keras_private.keras_test_case()  # loaded only for these checks: it imports Keras' test utilities

    class _Keras(TestCase):
        pass

    _Keras("run_layer_test").run_layer_test(
        layer_cls, init_kwargs=init_kwargs, input_shape=input_shape, input_dtype=str(dtype),
        expected_output_shape=expected_output_shape, expected_num_trainable_weights=num_trainable_weights,
        expected_num_seed_generators=num_seed_generators, expected_num_losses=num_losses,
        **{"run_training_check": run_training, "run_mixed_precision_check": run_mixed_precision, **options})


def data_formats(x):
    """One batch of a convolution in both layouts: ``[("channels_last", x), ("channels_first", x')]``.

    ``x`` is channels last; ``x'`` has its last axis moved to axis 1. Compare a
    channels-first layer's outputs with :func:`to_channels_last`.

    Example:
        >>> import numpy as np
        >>> from tfbnn import testing
        >>> [(name, x.shape) for name, x in testing.data_formats(np.zeros((2, 5, 5, 3)))]
        [('channels_last', (2, 5, 5, 3)), ('channels_first', (2, 3, 5, 5))]
    """
    return [("channels_last", x), ("channels_first", np.moveaxis(x, -1, 1))]


def to_channels_last(y):
    """A channels-first array (axis 1 the channels) moved to channels last."""
    return np.moveaxis(y, 1, -1)


# -- the conformance harness ------------------------------------------------------------------
#
# Every public layer class (and public keras.Model subclass) of tfbnn has one construction
# case in CASES or is declared in DECLARED; every capability of CAPABILITIES is checked on
# every case, or declared with its reason. tests/test_conformance.py runs it; the deployment
# guide's support matrix is written from the same tables (support_matrix_markdown()).

#: The capabilities (columns) the harness checks on every public layer.
CAPABILITIES = {
    "keras_contract": "Keras' own run_layer_test (config, build from a shape, symbolic and eager calls, "
                      "weight / seed-generator / loss counts, fit, mixed precision)",
    "mixed_precision": "fit, predict and tfbnn.predict under mixed_float16 and mixed_bfloat16: finite loss, "
                       "float32 variables and KL, outputs in the compute dtype",
    "keras_roundtrip": "a .keras file loaded in a fresh process: equal weights, posterior-mean outputs "
                       "and next seeded sample",
    "export_savedmodel": "tfbnn.export.export(format='saved_model'), served by tf.saved_model.load alone",
    "export_tflite": "tfbnn.export.export(format='tflite'), served by tf.lite.Interpreter alone",
    "export_onnx": "tfbnn.export.export(format='onnx'), served by onnxruntime alone",
    "moments": "tfbnn.moments.propagate: a moment rule, or a ValueError naming the layer; with covariance='full' "
               "too (on a point input the diagonal rule's variance), or a refusal naming the layer",
    "xla": "one jit_compile=True training step with a finite loss",
}

_KL = {"kl_weight": 0.01, "seed": 1}
#: The export formats of :func:`tfbnn.export.export` and where each writes, by capability.
EXPORTS = {"export_savedmodel": ("saved_model", "saved_model"), "export_tflite": ("tflite", "model.tflite"),
           "export_onnx": ("onnx", "onnx")}


class Case:
    """How the harness builds one public class: a layer from ``kwargs`` (or a ``make()``
    function for a class that wraps a model), its input and the counts Keras' harness checks.

    Args:
        cls: the public class.
        kwargs: constructor arguments (a layer case), or None with ``make``.
        input_shape: shape of one concrete batch, batch axis first.
        output_shape: the output shape for that batch.
        weights: trainable weights (Keras' harness count).
        seeds: seed generators of the layer.
        losses: entries of ``layer.losses`` after a call.
        ids: int ``high`` for integer ids in ``[0, high)`` as input (an embedding), or None.
        make: ``f() -> layer or model`` for classes built from other objects.
        name: the case id (default the class name).
        keras: further options of Keras' harness.
    """

    def __init__(self, cls, kwargs, input_shape, output_shape, weights=None, seeds=1, losses=1, ids=None,
                 make=None, name=None, keras=None):
        self.cls, self.kwargs, self.input_shape, self.output_shape = cls, kwargs, tuple(input_shape), tuple(output_shape)
        self.weights, self.seeds, self.losses, self.ids, self.make = weights, seeds, losses, ids, make
        self.name, self.keras = name or cls.__name__, keras or {}

    def __repr__(self):
        return f"Case({self.name})"

    def data(self, seed=0):
        """The case's input batch (float32 normals, or int32 ids)."""
        rng = np.random.default_rng(seed)
        if self.ids is not None:
            return rng.integers(0, self.ids, size=self.input_shape).astype("int32")
        return rng.normal(size=self.input_shape).astype("float32")

    def build(self, dtype=None):
        """A fresh layer (or model) of the case, under ``dtype`` (a policy name) when given."""
        if self.make is not None:
            if dtype is None:
                return self.make()
            with _global_policy(dtype):
                return self.make()
        kwargs = dict(self.kwargs)
        if dtype is not None:
            kwargs["dtype"] = dtype
        return self.cls(**kwargs)


class _global_policy:
    """Sets Keras' global dtype policy for a ``with`` block (a model built from other objects)."""

    def __init__(self, policy):
        self.policy = policy

    def __enter__(self):
        self.previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(self.policy)

    def __exit__(self, *exc):
        keras.mixed_precision.set_global_policy(self.previous)


def _tfbnn():
    import tfbnn  # the whole package: the harness reads its public names (tfbnn.testing loads lazily)

    return tfbnn


def _make_ensemble():
    members = [keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]) for _ in range(2)]
    return _tfbnn().DeepEnsemble(members)


def _make_multisample():
    net = keras.Sequential([keras.Input((3,)), _tfbnn().layers.DenseFlipout(2, **_KL)])
    return _tfbnn().MultiSampleModel(net, num_samples=2)


def _make_ibnn():
    net = keras.Sequential([keras.Input((3,)), _tfbnn().layers.NodeDense(2, **_KL)])
    return _tfbnn().ibnn.IBNNModel(net, num_train_samples=2)


def _lora_dense():
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    dense.enable_lora(1)
    return dense


def _make_variational_lora():
    return _tfbnn().lora.VariationalLoRA(_lora_dense(), **_KL)


def _make_variational_lora_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.layers[0].enable_lora(1)
    return _tfbnn().lora.VariationalLoRAModel(model, **_KL)


def _make_linearized_lora():
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.layers[0].enable_lora(1)
    return _tfbnn().lora.LoRALaplace(model, "regression", hessian="diag").fit(x, x[:, :2]).to_model(seed=0)


def _make_spectral_normalization():
    return _tfbnn().layers.SpectralNormalization(keras.layers.Dense(2), seed=1)


def _cases():
    tfbnn = _tfbnn()
    L, lik, ev, hub, models = tfbnn.layers, tfbnn.likelihoods, tfbnn.evidential, tfbnn.hub, tfbnn.models
    dense, conv1, conv2, conv3 = (4, 3), (4, 5, 2), (4, 5, 5, 2), (2, 3, 4, 3, 2)
    k2 = {"filters": 2, "kernel_size": 2}
    transpose = {"filters": 2, "kernel_size": 3, "strides": 2, "padding": "same", "output_padding": 1}
    cases = [
        Case(L.DenseReparameterization, {"units": 2, **_KL}, dense, (4, 2), 4),
        Case(L.DenseFlipout, {"units": 2, **_KL}, dense, (4, 2), 4),
        Case(L.DenseLocalReparameterization, {"units": 2, **_KL}, dense, (4, 2), 4),
        Case(L.DenseVariational, {"units": 2, **_KL}, dense, (4, 2), 2),
        Case(L.GravesDense, {"units": 2, **_KL}, dense, (4, 2), 3),
        Case(L.DenseVariationalDropout, {"units": 2, **_KL}, dense, (4, 2), 3),
        Case(L.Conv1DVariationalDropout, {**k2, **_KL}, conv1, (4, 4, 2), 3),
        Case(L.Conv2DVariationalDropout, {**k2, **_KL}, conv2, (4, 4, 4, 2), 3),
        Case(L.Conv1DReparameterization, {**k2, **_KL}, conv1, (4, 4, 2), 4),
        Case(L.Conv1DFlipout, {**k2, **_KL}, conv1, (4, 4, 2), 4),
        Case(L.Conv2DReparameterization, {**k2, **_KL}, conv2, (4, 4, 4, 2), 4),
        Case(L.Conv2DFlipout, {**k2, **_KL}, conv2, (4, 4, 4, 2), 4),
        Case(L.Conv3DReparameterization, {**k2, **_KL}, conv3, (2, 2, 3, 2, 2), 4),
        Case(L.Conv3DFlipout, {**k2, **_KL}, conv3, (2, 2, 3, 2, 2), 4),
        Case(L.Conv1DTransposeReparameterization, {**transpose, **_KL}, conv1, (4, 10, 2), 4),
        Case(L.Conv1DTransposeFlipout, {**transpose, **_KL}, conv1, (4, 10, 2), 4),
        Case(L.Conv2DTransposeReparameterization, {**transpose, **_KL}, conv2, (4, 10, 10, 2), 4),
        Case(L.Conv2DTransposeFlipout, {**transpose, **_KL}, conv2, (4, 10, 10, 2), 4),
        Case(L.Conv3DTransposeReparameterization, {**transpose, **_KL}, conv3, (2, 6, 8, 6, 2), 4),
        Case(L.Conv3DTransposeFlipout, {**transpose, **_KL}, conv3, (2, 6, 8, 6, 2), 4),
        Case(L.EmbeddingReparameterization, {"input_dim": 6, "output_dim": 2, **_KL}, (4, 3), (4, 3, 2), 2, ids=6),
        Case(L.LSTMReparameterization, {"units": 2, **_KL}, (4, 3, 2), (4, 2), 4),
        Case(L.GRUReparameterization, {"units": 2, **_KL}, (4, 3, 2), (4, 2), 4),
        Case(L.MCDropout, {"rate": 0.5, "seed": 1}, dense, dense, 0, losses=0),
        Case(L.MCSpatialDropout2D, {"rate": 0.5, "seed": 1}, conv2, conv2, 0, losses=0),
        Case(L.NodeDense, {"units": 2, "num_components": 2, **_KL}, dense, (4, 2), 4),
        Case(L.NodeConv1D, {**k2, "num_components": 2, **_KL}, conv1, (4, 4, 2), 4),
        Case(L.NodeConv2D, {**k2, "num_components": 2, **_KL}, conv2, (4, 4, 4, 2), 4),
        Case(L.NodeNoise, {"num_components": 2, **_KL}, dense, dense, 2),
        Case(L.NodeDenseFlow, {"units": 2, "hidden_units": 3, **_KL}, dense, (4, 2), 12),
        Case(L.NodeConv2DFlow, {**k2, "hidden_units": 3, **_KL}, conv2, (4, 4, 4, 2), 12),
        Case(L.DenseRank1, {"units": 2, "ensemble_size": 2, **_KL}, dense, (4, 2), 6),
        Case(L.Conv2DRank1, {**k2, "ensemble_size": 2, **_KL}, conv2, (4, 4, 4, 2), 6),
        Case(L.DenseBatchEnsemble, {"units": 2, "ensemble_size": 2, "seed": 1}, dense, (4, 2), 4, seeds=0, losses=0),
        Case(L.Conv2DBatchEnsemble, {**k2, "ensemble_size": 2, "seed": 1}, conv2, (4, 4, 4, 2), 4, seeds=0,
             losses=0),
        Case(L.EnsembleTile, {"ensemble_size": 2}, dense, (8, 3), 0, seeds=0, losses=0),
        Case(L.EnsembleMean, {"ensemble_size": 2}, dense, (2, 3), 0, seeds=0, losses=0),
        Case(L.SpectralDense, {"units": 2, "seed": 1}, dense, (4, 2), 2, seeds=0, losses=0),
        Case(L.SpectralConv2D, {**k2, "seed": 1}, conv2, (4, 4, 4, 2), 2, seeds=0, losses=0),
        Case(L.SpectralNormalization, None, dense, (4, 2), 2, seeds=0, losses=0, make=_make_spectral_normalization),
        Case(L.RandomFeatureGaussianProcess, {"units": 2, "num_inducing": 8, "seed": 1}, dense, (4, 2), 2, seeds=0, losses=0),
        Case(L.HeteroscedasticSoftmax, {"num_classes": 3, "num_factors": 2, "train_mc_samples": 4,
                                        "test_mc_samples": 4, "seed": 1}, dense, (4, 3), 6, losses=0),
        Case(lik.GaussianHead, {}, (4, 2), (4, 2), 0, seeds=0, losses=0),
        Case(lik.StudentTHead, {}, (4, 3), (4, 3), 0, seeds=0, losses=0),
        Case(lik.MixtureNormalHead, {"num_components": 2}, (4, 6), (4, 6), 0, seeds=0, losses=0),
        Case(lik.BernoulliHead, {}, (4, 1), (4, 1), 0, seeds=0, losses=0),
        Case(lik.CategoricalHead, {}, dense, dense, 0, seeds=0, losses=0),
        Case(lik.QuantileHead, {}, (4, 2), (4, 2), 0, seeds=0, losses=0),
        Case(ev.DirichletHead, {}, dense, dense, 0, seeds=0, losses=0),
        Case(ev.EvidentialRegressionHead, {}, (4, 4), (4, 4), 0, seeds=0, losses=0),
        Case(hub.EnsembleDense, {"num_members": 2, "units": 2, "seed": 1}, dense, (4, 2, 2), 2, losses=0),
        Case(hub.MembersToRows, {}, (4, 2, 3), (8, 3), 0, seeds=0, losses=0),
        Case(tfbnn.laplace.LaplaceDense, {"units": 2, "seed": 1}, dense, (4, 2), 0, losses=0),
        Case(models.LayerScale, {}, dense, dense, 1, seeds=0, losses=0),
        Case(models.StochasticDepth, {"rate": 0.5, "seed": 1}, dense, dense, 0, losses=0),
        Case(models.TokenAndPositionEmbedding, {"vocab_size": 6, "max_length": 3, "embed_dim": 2}, (4, 3), (4, 3, 2),
             2, seeds=0, losses=0, ids=6),
        Case(tfbnn.lora.VariationalLoRA, None, dense, (4, 2), 4, make=_make_variational_lora),
        Case(tfbnn.lora.VariationalLoRAModel, None, dense, (4, 2), 4, make=_make_variational_lora_model),
        Case(tfbnn.lora.LinearizedLoRA, None, dense, (4, 4), 3, losses=0, make=_make_linearized_lora),
        Case(tfbnn.DeepEnsemble, None, dense, (4, 2), 4, seeds=0, losses=0, make=_make_ensemble),
        Case(tfbnn.MultiSampleModel, None, dense, (4, 2), 4, make=_make_multisample),
        Case(tfbnn.ibnn.IBNNModel, None, dense, (4, 2), 4, make=_make_ibnn),
    ]
    return cases


#: The cases, one per public class that the harness builds (:func:`public_classes`).
CASES = None  # filled on first use by cases() (the layers load with tfbnn)


def cases():
    """The harness's construction cases, ``{case name: Case}`` (:class:`Case`)."""
    global CASES
    if CASES is None:
        CASES = {case.name: case for case in _cases()}
    return CASES


_ABSTRACT = "abstract base: tested through its subclasses"
_POSTERIOR = "a weight distribution of DenseVariational (make_posterior_fn / make_prior_fn): tested through it"
_CELL = "a recurrent cell: tested through LSTMReparameterization / GRUReparameterization, which run it"
_WRAPPER = ("not applicable: a keras.Model wrapping a model (built from objects, not keyword arguments): Keras' run_layer_test "
            "does not apply; its config, fit and saving are checked by the other columns")


_NO_MOMENTS = "refused: no moment rule (tfbnn.moments.propagate raises a ValueError naming the layer)"


_ROWS = ("not checked: changes the number of rows (members x examples), which the harness's export check (one "
         "row per example) cannot hold; no test exports it yet")


#: The one table of exceptions: ``{(class name, capability or "*"): reason}``. A capability
#: here is checked to fail as documented (an export: a ValueError at export time naming the
#: layer and the format), so a row that starts passing fails the suite and is removed.
DECLARED = {
    **{(name, "*"): _ABSTRACT for name in ("StochasticLayer", "BayesianLayer", "MeanFieldGaussian",
                                            "MeanFieldFlipout", "DistributionHead", "NetworkWrapper")},
    **{(name, "*"): _POSTERIOR for name in ("AffineCouplingFlow", "FlowNormalWeights", "FullCovarianceNormalWeights",
                                             "IndependentPriorWeights", "LowRankNormalWeights",
                                             "MeanFieldNormalWeights", "NormalPriorWeights", "VariableDistribution",
                                             "WeightDistribution")},
    **{(name, "*"): _CELL for name in ("LSTMCellReparameterization", "GRUCellReparameterization")},
    ("DistributionLambdaHead", "*"): "wraps a user's distribution function: tested in tests/test_likelihoods.py",
    ("BertInputs", "*"): "a KerasHub BERT's input adapter (int ids to a dict): tested in tests/test_hub.py",
    **{(name, "moments"): _NO_MOMENTS for name in (
        "EmbeddingReparameterization", "LSTMReparameterization", "GRUReparameterization", "NodeDense", "NodeConv1D",
        "NodeConv2D", "NodeNoise", "NodeDenseFlow", "NodeConv2DFlow", "DenseRank1", "Conv2DRank1",
        "DenseBatchEnsemble", "Conv2DBatchEnsemble", "EnsembleTile", "EnsembleMean",
        "HeteroscedasticSoftmax", "StudentTHead", "MixtureNormalHead", "BernoulliHead", "CategoricalHead",
        "QuantileHead", "DirichletHead", "EvidentialRegressionHead", "EnsembleDense", "MembersToRows", "LaplaceDense",
        "LayerScale", "StochasticDepth", "TokenAndPositionEmbedding", "VariationalLoRA", "VariationalLoRAModel",
        "LinearizedLoRA",
        "DeepEnsemble", "MultiSampleModel", "IBNNModel", "DenseVariational", "Conv1DTransposeFlipout",
        "Conv1DTransposeReparameterization", "Conv2DTransposeFlipout", "Conv2DTransposeReparameterization",
        "Conv3DTransposeFlipout", "Conv3DTransposeReparameterization")},
    ("MembersToRows", "keras_contract"): ("not applicable: it turns B rows into M * B, so Keras' harness cannot "
                                          "fit it on B targets; its shapes are tested in tests/test_hub.py"),
    **{("DenseVariational", f"export_{fmt}"): "refused: its TFP distribution samples with stateless random ops, "
                                              "which TFLite and ONNX lack (tfbnn.export.UNSUPPORTED)"
       for fmt in ("tflite", "onnx")},
    **{(name, "export_tflite"): "refused: its recurrent loop is a TensorList op, which TFLite's builtin ops lack "
                                "(tfbnn.export.UNSUPPORTED)" for name in ("LSTMReparameterization",
                                                                          "GRUReparameterization")},
    ("MixtureNormalHead", "export_tflite"): "refused: its EnsureShape op is no TFLite builtin op "
                                            "(tfbnn.export.UNSUPPORTED)",
    **{(name, "export_tflite"): "refused: its per-sample map over the Monte Carlo blocks is a TensorList op, "
                                "which TFLite's builtin ops lack (tfbnn.export.UNSUPPORTED)"
       for name in ("VariationalLoRAModel", "LinearizedLoRA")},
    ("DeepEnsemble", "export_tflite"): "refused: a DeepEnsemble exports as a SavedModel only",
    ("DeepEnsemble", "export_onnx"): "refused: a DeepEnsemble exports as a SavedModel only",
    **{(name, capability): _ROWS for name in ("EnsembleTile", "EnsembleMean", "MembersToRows") for capability in EXPORTS},
    **{(name, "keras_contract"): _WRAPPER for name in ("SpectralNormalization", "VariationalLoRA",
                                                       "VariationalLoRAModel", "LinearizedLoRA", "DeepEnsemble",
                                                       "MultiSampleModel", "IBNNModel")},
}


#: The other table of exceptions: columns checked only when ``TFBNN_CONFORMANCE=full`` is set (each is one
#: model of every case: a compile, a process or a conversion), with the reason; the support matrix states it.
FULL_RUN_ONLY = dict.fromkeys(
    ("mixed_precision", "xla", "keras_roundtrip", "export_savedmodel", "export_tflite", "export_onnx"),
    "checked with TFBNN_CONFORMANCE=full only: the six batched columns cost 18 minutes of one core together "
    "(2026-11-29), over the default suite's budget; that run passed every 'yes' cell on 2026-11-29")


def declared(name, capability):
    """The declared reason for ``(name, capability)``, or None."""
    return DECLARED.get((name, "*")) or DECLARED.get((name, capability))


def public_classes():
    """Every public layer (and model) class of tfbnn: ``{class name: class}``.

    Walks ``tfbnn.__all__``'s submodules and their ``__all__`` for subclasses of
    ``keras.layers.Layer`` (``keras.Model`` included), and adds every layer registered as
    serializable under the package ``"tfbnn"`` (a saved model can hold it) whose name is public.
    """
    tfbnn = _tfbnn()
    found = {}
    for module_name in tfbnn.__all__:
        module = getattr(tfbnn, module_name, None)
        if not inspect.ismodule(module):
            continue
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and issubclass(obj, keras.layers.Layer) and obj.__module__.startswith("tfbnn"):
                found[obj.__name__] = obj
    for key, obj in keras.saving.get_custom_objects().items():
        package, _, name = key.partition(">")
        if package == "tfbnn" and not name.startswith("_") and inspect.isclass(obj) \
                and issubclass(obj, keras.layers.Layer):
            found.setdefault(obj.__name__, obj)
    return dict(sorted(found.items()))


def uncovered():
    """Public classes with neither a case nor a declared ``"*"`` row (each is a failure)."""
    names = set(cases())
    return [name for name in public_classes() if name not in names and (name, "*") not in DECLARED]


# -- the checks, one per capability --------------------------------------------------------------
def check_keras_contract(case):
    """Keras' own ``run_layer_test`` on the case, through :func:`run_layer_test` (``keras_checks=True``)."""
    run_layer_test(case.cls, case.kwargs, input_shape=case.input_shape, expected_output_shape=case.output_shape,
                   expected_num_losses=case.losses, expected_num_seed_generators=case.seeds,
                   expected_num_trainable_weights=case.weights, run_save_load=False, run_training=False,
                   run_mixed_precision=False, input_data=case.data(), keras_checks=True, run_training_check=True,
                   run_mixed_precision_check=True, **case.keras)


class _RowsBack(keras.layers.Layer):
    """Gives a row-changing case's output (``M B`` or ``B / E`` rows, or ``B`` where the layer leaves a
    training batch alone) the input's ``B`` rows again, so that ``fit`` pairs it with one target row per
    example: ``M B`` rows averaged over the ``M`` blocks, ``B / E`` rows repeated ``E`` times. Used only by
    the training checks (mixed precision, XLA); no weights."""

    def call(self, outputs, inputs):
        rows, rows_out = keras.ops.shape(inputs)[0], keras.ops.shape(outputs)[0]
        if self.more:  # M blocks of the B rows
            return keras.ops.mean(keras.ops.reshape(outputs, (-1, rows, *outputs.shape[1:])), axis=0)
        return keras.ops.repeat(outputs, keras.ops.maximum(rows // rows_out, 1), axis=0)

    def __init__(self, more, **kwargs):
        super().__init__(**kwargs)
        self.more = more


def _rows_changed(case):
    return case.output_shape[0] != case.input_shape[0]


def _target_shape(case):
    """The output shape a training check fits: the case's, with the input's rows (:class:`_RowsBack`)."""
    return (case.input_shape[0], *case.output_shape[1:])


def _model(selected, dtype=None, layers=None, same_rows=False):
    """One functional model holding ``selected`` cases side by side: an input and an output per case
    (``layers``, a dict, receives each case's layer); ``same_rows``: a row-changing case's output gets
    the input's rows back (:class:`_RowsBack`), for ``fit``."""
    inputs, outputs = {}, {}
    for case in selected:
        inputs[case.name] = keras.Input(case.input_shape[1:], dtype="int32" if case.ids else "float32",
                                        name=case.name)
        layer = case.build(dtype)
        outputs[case.name] = layer(inputs[case.name])
        if same_rows and _rows_changed(case):
            more = case.output_shape[0] > case.input_shape[0]
            outputs[case.name] = _RowsBack(more, dtype=dtype,
                                           name=f"{case.name}_rows")(outputs[case.name], inputs[case.name])
        if layers is not None:
            layers[case.name] = layer
    return keras.Model(inputs, outputs)


def _data(selected):
    return {case.name: case.data() for case in selected}


def _targets(selected):
    return {case.name: np.zeros(_target_shape(case), "float32") for case in selected}


def _per_case(check, selected):
    """``{case name: error message or None}``: ``check(cases)`` on all at once and, if that fails,
    on halves of them, down to the failing cases (a few batches name them)."""
    try:
        check(selected)
        return {case.name: None for case in selected}
    except Exception as e:  # noqa: BLE001 - any failure is attributed to the failing cases below
        if len(selected) == 1:
            return {selected[0].name: f"{type(e).__name__}: {e}"[:2000]}
    half = len(selected) // 2
    return {**_per_case(check, selected[:half]), **_per_case(check, selected[half:])}


def _check_mixed_precision_batch(selected):
    tfbnn = _tfbnn()
    for policy in MIXED_PRECISION_TOLERANCE:
        keras.utils.set_random_seed(0)
        layers = {}
        model = _model(selected, policy, layers=layers, same_rows=True)
        x, y = _data(selected), _targets(selected)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss={name: "mse" for name in y})
        loss = model.fit(x, y, batch_size=None, epochs=1, verbose=0).history["loss"][-1]
        if not np.isfinite(loss):
            raise AssertionError(f"{policy}: training loss {loss}")
        for weight in model.weights:
            if "float" in str(weight.dtype) and str(weight.dtype) != "float32":
                raise AssertionError(f"{policy}: weight {weight.path} is {weight.dtype}, expected float32")
        outputs = model.predict(x, verbose=0)
        for name, out in outputs.items():
            if not np.all(np.isfinite(np.asarray(out, "float32"))):
                raise AssertionError(f"{policy}: predict of {name} is not finite")
        called = model(x)
        for layer in model.layers:
            kl = getattr(layer, "kl_divergence", None)
            if callable(kl) and isinstance(layer, BayesianLayer):
                value = kl()
                if value.dtype != "float32" or not np.isfinite(value):
                    raise AssertionError(f"{policy}: KL of {layer.name} is {value.dtype} {float(value)}")
        for loss in model.losses:
            if loss.dtype != "float32":
                raise AssertionError(f"{policy}: a model loss is {loss.dtype}, expected float32")
        for case in selected:
            if called[case.name].dtype != keras.mixed_precision.Policy(policy).compute_dtype:
                raise AssertionError(f"{policy}: outputs of {case.name} are {called[case.name].dtype}")
            branch = keras.Model(model.input[case.name], model.output[case.name])
            task = getattr(layers[case.name], "task", "regression")  # a head says its task
            result = tfbnn.predict(branch, x[case.name], num_samples=2, task=task)
            if not np.all(np.isfinite(result.mean if task == "regression" else result.mean_probs)):
                raise AssertionError(f"{policy}: tfbnn.predict of {case.name} is not finite")


def _check_xla_batch(selected):
    keras.utils.set_random_seed(0)
    model = _model(selected, same_rows=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss={case.name: "mse" for case in selected},
                  jit_compile=True)
    loss = model.train_on_batch(_data(selected), _targets(selected))
    loss = loss[0] if isinstance(loss, (list, tuple)) else loss
    if not np.isfinite(loss):
        raise AssertionError(f"jit_compile=True: training loss {loss}")


def check_moments(case):
    """``tfbnn.moments.propagate`` on ``Input -> layer`` (a model class: on the model itself): finite moments
    of the output's shape."""
    layer = case.build()
    if isinstance(layer, keras.Model):  # a model class is propagated as itself
        model = layer
    else:
        inputs = keras.Input(case.input_shape[1:], dtype="int32" if case.ids else "float32")
        model = keras.Model(inputs, layer(inputs))
    x = case.data()
    model(x)
    result = moments.propagate(model, x)
    for what in ("mean", "variance"):
        value = np.asarray(getattr(result, what))
        if value.shape != case.output_shape or not np.all(np.isfinite(value)):
            raise AssertionError(f"moments: {what} of shape {value.shape}, finite {np.all(np.isfinite(value))}")
    _check_full_moments(case, model, x, result, point_input=model is not layer)


def _check_full_moments(case, model, x, diagonal, point_input):
    """``covariance="full"``: refused naming the class, or a finite symmetric covariance of the flattened outputs
    whose diagonal is the variance; for ``Input -> layer`` (a point input: nothing to correlate yet) the same
    variance as the diagonal rule."""
    try:
        full = moments.propagate(model, x, covariance="full")
    except ValueError as e:
        if case.cls.__name__ not in str(e) or "covariance='full'" not in str(e):
            raise AssertionError(f"moments: covariance='full' refused {case.cls.__name__} without naming it and "
                                 f"the argument: {e}") from e
        return
    cov, variance = np.asarray(full.covariance), np.asarray(full.variance)
    n = int(np.prod(case.output_shape[1:]))
    if cov.shape != (case.output_shape[0], n, n) or not np.all(np.isfinite(cov)):
        raise AssertionError(f"moments: covariance of shape {cov.shape} (expected {(case.output_shape[0], n, n)}), "
                             f"finite {np.all(np.isfinite(cov))}")
    diag = np.diagonal(cov, axis1=-2, axis2=-1).reshape(variance.shape)
    if not (np.allclose(cov, np.swapaxes(cov, -1, -2), rtol=1e-5, atol=1e-7)
            and np.allclose(diag, variance, rtol=1e-5, atol=1e-7)):
        raise AssertionError("moments: the full covariance is not symmetric, or its diagonal is not the variance")
    if point_input and not np.allclose(variance, np.asarray(diagonal.variance), rtol=1e-4, atol=1e-6):
        raise AssertionError("moments: on a point input the full and diagonal variances differ: "
                             f"{np.max(np.abs(variance - np.asarray(diagonal.variance)))}")


def check_moments_refused(case):
    """``tfbnn.moments.propagate`` refuses the case with a ValueError naming its class."""
    try:
        check_moments(case)
    except ValueError as e:
        if case.cls.__name__ not in str(e):
            raise AssertionError(f"The moments refusal does not name {case.cls.__name__}: {e}") from e
        return
    raise AssertionError(f"moments: {case.cls.__name__} is declared refused, but propagate ran: remove the row")


_RUN = [sys.executable, "-c"]

_LOAD_SCRIPT = """
import sys, numpy as np, keras, tfbnn
from tfbnn.utils import posterior_mean
model = keras.saving.load_model(sys.argv[1])
x = dict(np.load(sys.argv[2]))
out = {f"w:{layer.name}:{i}": np.asarray(w.numpy()) for layer in model.layers for i, w in enumerate(layer.weights)}
out.update({"s:" + k: np.asarray(v, "float32") for k, v in model(x).items()})
with posterior_mean(model):
    out.update({"m:" + k: np.asarray(v, "float32") for k, v in model(x).items()})
np.savez(sys.argv[3], **out)
"""


def roundtrip(selected, folder):
    """Saves one model of all ``selected`` cases as ``.keras``, loads it in a fresh process and returns
    ``{case name: error message or None}``: equal weights, posterior-mean outputs and next seeded sample."""
    keras.utils.set_random_seed(0)
    layers = {}
    model, x = _model(selected, layers=layers), _data(selected)
    model(x)
    path, xpath, outpath = (os.path.join(folder, name) for name in ("all.keras", "x.npz", "out.npz"))
    model.save(path)
    np.savez(xpath, **x)
    sampled = {k: np.asarray(v, "float32") for k, v in model(x).items()}
    with posterior_mean(model):
        mean = {k: np.asarray(v, "float32") for k, v in model(x).items()}
    proc = subprocess.run([*_RUN, _LOAD_SCRIPT, path, xpath, outpath], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode:
        return {case.name: f"load in a fresh process failed: {proc.stderr[-2000:]}" for case in selected}
    loaded = dict(np.load(outpath))
    results = {}
    for case in selected:
        errors = []
        for i, w in enumerate(layers[case.name].weights):
            key = f"w:{layers[case.name].name}:{i}"
            if key not in loaded or not np.array_equal(loaded[key], w.numpy()):
                errors.append(f"weight {w.path} differs after loading")
        for what, expected in (("s", sampled), ("m", mean)):
            got = loaded[f"{what}:{case.name}"]
            if got.shape != expected[case.name].shape or not np.allclose(got, expected[case.name], atol=1e-6,
                                                                         rtol=1e-5):
                errors.append({"s": "next seeded sample", "m": "posterior-mean outputs"}[what] + " differ")
        results[case.name] = "; ".join(errors) or None
    return results


_SERVE_SCRIPT = """
import json, os, sys
import numpy as np
import tensorflow as tf
folder, fmt = sys.argv[1], sys.argv[2]
x = np.load(os.path.join(folder, "x.npy"))
if fmt == "saved_model":
    served = tf.saved_model.load(os.path.join(folder, "saved_model"))
    mean, sample = served.mean(tf.constant(x)), served.sample(tf.constant(x))
elif fmt == "tflite":
    interpreter = tf.lite.Interpreter(os.path.join(folder, "model.tflite"))
    mean = interpreter.get_signature_runner("mean")(x=x)["output"]
    sample = interpreter.get_signature_runner("sample")(x=x)["output"]
else:
    import onnxruntime
    run = lambda name: onnxruntime.InferenceSession(os.path.join(folder, "onnx", name + ".onnx")).run(None, {"x": x})[0]
    mean, sample = run("mean"), run("sample")
assert not any(name == "tfbnn" or name.startswith("tfbnn.") for name in sys.modules), "served with tfbnn loaded"
np.savez(os.path.join(folder, fmt + ".npz"), mean=np.asarray(mean), sample=np.asarray(sample))
"""

_EXPORT_BATCH = 4


def _flat_model(selected, layers=None):
    """One single-input, single-output model of ``selected`` (what :func:`tfbnn.export.export` takes):
    each case reads its slice of one flat input and writes its flattened output."""
    inputs = keras.Input((sum(int(np.prod(case.input_shape[1:])) for case in selected),), name="x")
    outputs, start = [], 0
    for case in selected:
        size = int(np.prod(case.input_shape[1:]))
        part = keras.ops.reshape(inputs[:, start:start + size], (-1, *case.input_shape[1:]))
        if case.ids:
            part = keras.ops.cast(part, "int32")
        layer = case.build()
        outputs.append(keras.ops.reshape(layer(part), (-1, int(np.prod(case.output_shape[1:])))))
        if layers is not None:
            layers[case.name] = layer
        start += size
    return keras.Model(inputs, outputs[0] if len(outputs) == 1 else keras.ops.concatenate(outputs, axis=-1))


def _flat_data(selected):
    parts = []
    for case in selected:
        x = Case(case.cls, None, (_EXPORT_BATCH, *case.input_shape[1:]), case.output_shape, ids=case.ids).data()
        parts.append(x.reshape(_EXPORT_BATCH, -1).astype("float32"))
    return np.concatenate(parts, axis=-1)


def export_and_serve(selected, capability, folder):
    """Exports one model of ``selected`` with :func:`tfbnn.export.export` in ``capability``'s format,
    serves its ``mean`` and ``sample`` endpoints in a fresh process that never imports tfbnn, and
    raises unless the served posterior-mean outputs equal the model's and the samples are finite."""
    from tfbnn import export  # a floor above (inference/, export): loaded when a check runs

    fmt, target = EXPORTS[capability]
    keras.utils.set_random_seed(0)
    model, x = _flat_model(selected), _flat_data(selected)
    with posterior_mean(model):
        expected = np.asarray(model(x), "float32")
    os.makedirs(folder, exist_ok=True)
    export.export(model, os.path.join(folder, target), format=fmt, num_samples=2, task="regression", overwrite=True)
    np.save(os.path.join(folder, "x.npy"), x)
    proc = subprocess.run([*_RUN, _SERVE_SCRIPT, folder, fmt], capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise AssertionError(f"Serving the {fmt} export without tfbnn failed: {proc.stderr[-2000:]}")
    served = np.load(os.path.join(folder, f"{fmt}.npz"))
    if not np.all(np.isfinite(served["sample"])) or served["sample"].shape != expected.shape:
        raise AssertionError(f"{fmt}: the served sample is not finite or of shape {served['sample'].shape}")
    if not np.allclose(served["mean"], expected, atol=1e-4, rtol=1e-4):
        raise AssertionError(f"{fmt}: served posterior-mean outputs differ from the model's: max |d| = "
                             f"{np.max(np.abs(served['mean'] - expected))}")


def check_export_refused(case, capability, folder):
    """:func:`tfbnn.export.export` refuses the case in ``capability``'s format with a ValueError naming the
    layer's class and the format, before converting anything."""
    from tfbnn import export

    fmt, target = EXPORTS[capability]
    model = case.build()
    if isinstance(model, keras.Model):  # a model class is exported as itself
        model(case.data())
    else:
        model = _flat_model([case])
    try:
        export.export(model, os.path.join(folder, target), format=fmt, num_samples=2,
                      task="regression", overwrite=True)
    except ValueError as e:
        if case.cls.__name__ not in str(e) or repr(fmt) not in str(e):
            raise AssertionError(f"The refusal names neither {case.cls.__name__} nor format={fmt!r}: {e}") from e
        return
    raise AssertionError(f"{case.cls.__name__} is declared refused for {fmt}, but it exported: remove the row")


def check_batch(capability, selected, folder):
    """A batched capability's check on ``selected`` cases together: ``{case name: error message or None}``.

    One model holds every case side by side (one compile, one process, one conversion); if it fails,
    halves of the cases are checked again down to the failing ones (:func:`_per_case`).

    Args:
        capability: one of ``"mixed_precision"``, ``"xla"``, ``"keras_roundtrip"`` or a key of :data:`EXPORTS`.
        selected: list of :class:`Case`.
        folder: str, a writable folder for saved models and exports.
    """
    if capability == "mixed_precision":
        return _per_case(_check_mixed_precision_batch, selected)
    if capability == "xla":
        return _per_case(_check_xla_batch, selected)
    if capability == "keras_roundtrip":
        return roundtrip(selected, folder)
    if capability in EXPORTS:
        return _per_case(lambda cases: export_and_serve(cases, capability, folder), selected)
    raise ValueError(f"Expected `capability` to be a batched check ('mixed_precision', 'xla', 'keras_roundtrip', "
                     f"{', '.join(map(repr, EXPORTS))}). Received: capability={capability!r}")


# -- the support matrix ----------------------------------------------------------------------------
_MATRIX_BEGIN = "<!-- support-matrix: generated by `python -m tfbnn.testing --write-support-matrix`; do not edit -->"
_MATRIX_END = "<!-- end support-matrix -->"
_COLUMNS = {"keras_contract": "Keras contract", "mixed_precision": "mixed precision", "keras_roundtrip": ".keras",
            "export_savedmodel": "SavedModel", "export_tflite": "TFLite", "export_onnx": "ONNX",
            "moments": "moments", "xla": "XLA"}


def support_matrix_markdown():
    """The deployment guide's support matrix (public class x capability), written from
    :data:`DECLARED`: "yes" where the harness checks it passes, else "no" with the declared reason."""
    notes, rows = [], []

    def note(reason):
        if reason not in notes:
            notes.append(reason)
        return notes.index(reason) + 1

    for name in public_classes():
        cells = []
        for capability in CAPABILITIES:
            reason = declared(name, capability)
            cells.append("yes" if reason is None else f"no [{note(reason)}]")
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    header = "| class | " + " | ".join(_COLUMNS[c] for c in CAPABILITIES) + " |"
    lines = [_MATRIX_BEGIN, "", header, "|" + "---|" * (len(CAPABILITIES) + 1), *rows, ""]
    lines += [f"[{i}]: {reason}  " for i, reason in enumerate(notes, 1)]
    for reason in dict.fromkeys(FULL_RUN_ONLY.values()):
        columns = ", ".join(_COLUMNS[c] for c, r in FULL_RUN_ONLY.items() if r == reason)
        lines += ["", f"Columns {columns}: {reason}."]
    lines += ["", "Columns: " + "; ".join(f"**{_COLUMNS[c]}**: {text}" for c, text in CAPABILITIES.items()) + ".",
              "", _MATRIX_END]
    return "\n".join(lines)


def _guide_path():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "guides",
                        "deployment.md")


def write_support_matrix(path=None):
    """Replaces the support matrix in the deployment guide (between its markers) with
    :func:`support_matrix_markdown`; returns the path."""
    path = path or _guide_path()
    with open(path) as f:
        text = f.read()
    begin, end = text.index(_MATRIX_BEGIN), text.index(_MATRIX_END) + len(_MATRIX_END)
    with open(path, "w") as f:
        f.write(text[:begin] + support_matrix_markdown() + text[end:])
    return path


def guide_support_matrix(path=None):
    """The support matrix as the deployment guide holds it (between its markers)."""
    with open(path or _guide_path()) as f:
        text = f.read()
    begin, end = text.index(_MATRIX_BEGIN), text.index(_MATRIX_END) + len(_MATRIX_END)
    return text[begin:end]


if __name__ == "__main__":  # python -m tfbnn.testing --write-support-matrix
    if sys.argv[1:] != ["--write-support-matrix"]:
        raise SystemExit("usage: python -m tfbnn.testing --write-support-matrix")
    print(write_support_matrix())


# -- the registered methods ------------------------------------------------------------------------
def method_model(name, input_dim=3, num_classes=2, num_examples=8, seed=0):
    """The zoo's small MLP (one hidden layer of 4 units) trained by the registered method ``name``,
    built as :func:`tfbnn.training.run` builds it: by the zoo, converted, or as an ensemble."""
    tfbnn = _tfbnn()
    method = tfbnn.methods.get(name)
    common = dict(hidden_units=(4,), input_shape=(input_dim,), num_classes=num_classes, seed=seed)
    if method.build == "zoo":
        return tfbnn.models.mlp(name, num_examples=num_examples, **common)
    if method.build == "convert":
        model = tfbnn.models.mlp("deterministic", **common)
        return tfbnn.convert.to_bayesian(model, method=next(iter(method.conversions)), num_examples=num_examples,
                                         seed=seed)
    members = [tfbnn.models.mlp("deterministic", **{**common, "seed": seed + m}, name=f"member_{m}")
               for m in range(2)]
    return tfbnn.DeepEnsemble(members)


def check_method(name):
    """One ``fit`` step of ``name``'s MLP under ``mixed_float16`` (finite loss, float32 variables), one
    ``jit_compile=True`` step, and ``tfbnn.predict`` (finite)."""
    tfbnn = _tfbnn()
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 3)).astype("float32"), rng.integers(0, 2, size=8).astype("int32")
    def trained(model):  # a deep ensemble trains its members one by one (it refuses fit as a whole)
        return list(model.members) if isinstance(model, tfbnn.DeepEnsemble) else [model]

    with _global_policy("mixed_float16"):
        for model in trained(method_model(name)):
            model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
            loss = model.fit(x, y, batch_size=8, epochs=1, verbose=0).history["loss"][-1]
            if not np.isfinite(loss):
                raise AssertionError(f"{name}: mixed_float16 training loss {loss}")
            wrong = [w.path for w in model.weights if "float" in str(w.dtype) and str(w.dtype) != "float32"]
            if wrong:
                raise AssertionError(f"{name}: mixed_float16 variables not float32: {wrong}")
    model = method_model(name)
    for trainee in trained(model):
        trainee.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy",
                        jit_compile=True)
        loss = trainee.train_on_batch(x, y)
        if not np.isfinite(loss[0] if isinstance(loss, (list, tuple)) else loss):
            raise AssertionError(f"{name}: jit_compile=True training loss {loss}")
    result = tfbnn.predict(model, x, num_samples=2)
    if not np.all(np.isfinite(result.mean_probs)):
        raise AssertionError(f"{name}: tfbnn.predict gave non-finite probabilities")
