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

Example:
    >>> from tfbnn import testing, layers
    >>> layer = testing.run_layer_test(layers.DenseFlipout, {"units": 3, "seed": 1}, input_shape=(4, 5),
    ...                                expected_output_shape=(4, 3))
    >>> layer.units, layer.built
    (3, True)
"""

import os
import tempfile

import keras
import numpy as np

from tfbnn._internal import keras_private
from tfbnn.layers.base import BayesianLayer
from tfbnn.utils import posterior_mean

__all__ = ["run_layer_test", "count_seed_generators", "data_formats", "to_channels_last"]


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
