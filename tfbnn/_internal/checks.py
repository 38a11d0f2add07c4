"""Argument checks shared by tfbnn's public entry points.

One message format (``Expected ... Received: name=value``) and one notion of a
number, the one Keras uses: any ``numbers.Integral`` / ``numbers.Real`` scalar
(Python or NumPy), never a ``bool``. Checked values come back as Python ``int``
/ ``float``, so configs stay JSON-serializable. :func:`checked` checks tensor
values, eagerly or inside a compiled step.
"""

import math
import numbers
import types

import keras
import numpy as np
import tensorflow as tf

__all__ = [
    "is_integer", "is_number", "integer", "number", "seed", "numpy_seed", "array", "finite_array", "float_tensor", "value_range", "initializer",
    "finite_inputs", "input_shape",
    "activation", "checked", "registered",
]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def is_integer(value):
    """An integer scalar (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value):
    """A real scalar (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _reject(name, what, value):
    raise ValueError(f"Expected `{name}` to be {what}. Received: {name}={value!r}")


def integer(name, value, minimum=None, maximum=None, what=None, allow_none=False):
    """``value`` as an ``int`` in ``[minimum, maximum]``; else a ValueError naming ``name``."""
    if value is None and allow_none:
        return None
    if (
        not is_integer(value)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        if what is None:
            what = {None: "an integer", 1: "a positive integer", 0: "a non-negative integer"}.get(
                minimum, f"an integer >= {minimum}"
            )
            what += " or None" if allow_none else ""
        _reject(name, what, value)
    return int(value)


def seed(value, name="seed"):
    """A seed: an integer that fits in int64 (the seed generators' state), or None."""
    return integer(name, value, _INT64_MIN, _INT64_MAX, "an integer (int64) or None", allow_none=True)


def numpy_seed(value, name="seed", allow_none=True):
    """A seed of a NumPy generator (``numpy.random.default_rng``): an integer in ``[0, 2^31)``, or None.

    Non-negative (NumPy refuses negative seeds without naming the argument) and within int32, so that
    the same seed can also seed a TensorFlow stateless op.
    """
    return integer(name, value, 0, 2**31 - 1, "an integer in [0, 2^31)" + (" or None" if allow_none else ""),
                   allow_none=allow_none)


def _finite_float(value):
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range
        return None
    return value if math.isfinite(value) else None


def _interval(low, high, low_open, high_open):
    if low is None and high is None:
        return "a finite number"
    if high is None and low == 0:
        return "a positive finite number" if low_open else "a non-negative finite number"
    left = "-inf" if low is None else f"{low:g}"
    right = "inf" if high is None else f"{high:g}"
    return f"a number in {'(' if low_open or low is None else '['}{left}, {right}{')' if high_open or high is None else ']'}"


def number(name, value, low=None, high=None, low_open=False, high_open=False, what=None, allow_none=False):
    """``value`` as a finite ``float`` between ``low`` and ``high``; else a ValueError naming ``name``.

    ``low_open`` / ``high_open`` exclude the bound itself (``low=0, low_open=True``: positive).
    """
    if value is None and allow_none:
        return None
    v = _finite_float(value) if is_number(value) else None
    if (
        v is None
        or (low is not None and (v <= low if low_open else v < low))
        or (high is not None and (v >= high if high_open else v > high))
    ):
        if what is None:
            what = _interval(low, high, low_open, high_open) + (" or None" if allow_none else "")
        _reject(name, what, value)
    return v


def _not_numbers(name, value, reason):
    return ValueError(
        f"Expected `{name}` to be an array or tensor of numbers ({reason}). "
        f"Received: {name} of type {type(value).__name__}"
    )


def array(name, value, dtype=None):
    """``np.asarray(value, dtype)`` of numbers (bools included); else a ValueError naming ``name``."""
    try:
        a = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:  # ragged lists, None, strings, huge ints
        raise _not_numbers(name, value, e) from None
    if a.dtype.kind not in "biuf":
        raise _not_numbers(name, value, f"dtype {a.dtype}")
    return a


def finite_array(name, value, dtype=None):
    """:func:`array`, with every value finite; else a ValueError naming ``name`` and where the first bad value is."""
    a = array(name, value, dtype)
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))
        raise ValueError(f"Expected `{name}` to hold finite numbers. Received: {name} with "
                         f"{len(bad)} NaN or infinite values (the first at index {tuple(int(i) for i in bad[0])})")
    return a


def finite_inputs(batch, offset=0, name="x"):
    """Rejects NaN / infinite values in the floating-point tensors of ``batch`` (a tensor or a nest of them),
    which would give NaN predictions; the message names ``name`` and the rows (counted from ``offset``).
    Eager only: inside a traced function (an export's endpoint) the check is the export's own, in the graph."""
    if not tf.executing_eagerly():
        return
    for v in tf.nest.flatten(batch):
        if v.dtype.is_floating and not bool(tf.reduce_all(tf.math.is_finite(v))):
            flat = tf.reshape(tf.math.is_finite(v), [tf.shape(v)[0] if v.shape.rank else 1, -1])
            rows = (np.flatnonzero(~tf.reduce_all(flat, axis=1).numpy()) + offset).tolist()
            raise ValueError(
                "Expected finite inputs (NaN or infinite values give NaN predictions). "
                f"Received: {name} with NaN or infinite values in rows {rows[:10]}{' ...' if len(rows) > 10 else ''}"
            )


def input_shape(batch, expected, name="x"):
    """Rejects a ``batch`` (a tensor or a one-tensor nest) whose shape beyond the batch axis does not fit the
    model input shape ``expected`` (batch axis first, ``None`` for unknown sizes)."""
    expected = tf.TensorShape(expected)
    leaves = tf.nest.flatten(batch)
    if len(leaves) != 1 or not tf.TensorShape(leaves[0].shape)[1:].is_compatible_with(expected[1:]):
        raise ValueError(
            f"Expected `{name}` shaped like the model's input {tuple(expected)}. "
            f"Received: {name} with shapes {[tuple(v.shape) for v in leaves]}"
        )


def float_tensor(name, value):
    """``value`` as a floating-point tensor (integers and bools cast to floatx); else a ValueError naming ``name``."""
    try:
        t = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as e:
        raise _not_numbers(name, value, e) from None
    if t.dtype.is_floating:
        return t
    if not (t.dtype.is_integer or t.dtype.is_bool):
        raise _not_numbers(name, value, f"dtype {t.dtype.name}")
    return tf.cast(t, keras.config.floatx())


def value_range(name, values):
    """How a failed value check reads: ``name`` has NaN / infinite values, or its range."""
    values = np.asarray(values)
    if not np.all(np.isfinite(values)):
        return f"{name} with NaN or infinite values"
    return f"{name} with min={values.min():.6g}, max={values.max():.6g}"


def _keras_object(name, get, value, what):
    """``get(value)``, with Keras' error (which does not say which argument was wrong) named for ``name``."""
    try:
        return get(value)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Expected `{name}` to be {what} ({e}). Received: {name}={value!r}") from None


def initializer(name, value):
    """``keras.initializers.get(value)``; a ValueError naming ``name`` if it is no initializer."""
    return _keras_object(name, keras.initializers.get, value, "a Keras initializer (a name, config or instance)")


def activation(value, name="activation"):
    """``keras.activations.get(value)``; a ValueError naming ``name`` if it is no activation."""
    return _keras_object(name, keras.activations.get, value, "an activation (a name or a callable)")


def checked(tensor, condition, message, received):
    """``tensor``, once the boolean scalar tensor ``condition()`` holds.

    Eagerly a failed check raises ``ValueError(f"{message} Received: {received()}")``.
    While tracing (a compiled train / evaluate step) the check becomes a runtime
    assertion carrying ``message`` (an ``InvalidArgumentError`` when it fails), which
    XLA compiles to a no-op.
    """
    if tf.executing_eagerly():
        if not bool(condition()):
            raise ValueError(f"{message} Received: {received()}")
        return tensor
    with tf.control_dependencies([tf.debugging.Assert(condition(), [message])]):
        return tf.identity(tensor)


def registered(name, value, what):
    """``keras.saving.serialize_keras_object(value)``; a ValueError naming ``name`` for a function that
    ``keras.saving.register_keras_serializable`` has not registered (a lambda, a local function), which
    a saved model could not find again. ``what`` says what else ``value`` may be."""
    if isinstance(value, types.FunctionType) and (
            keras.saving.get_registered_object(keras.saving.get_registered_name(value)) is not value):
        raise ValueError(
            f"Expected `{name}` to be {what} or a function registered with "
            "`@keras.saving.register_keras_serializable(package=...)`, so that a saved model can find it again. "
            f"Received: {name}={value!r}"
        )
    return keras.saving.serialize_keras_object(value)
