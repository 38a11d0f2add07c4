"""Argument checks shared by tfbnn's public entry points.

One message format (``Expected ... Received: name=value``) and one notion of a
number, the one Keras uses: any ``numbers.Integral`` / ``numbers.Real`` scalar
(Python or NumPy), never a ``bool``. Checked values come back as Python ``int``
/ ``float``, so configs stay JSON-serializable. :func:`checked` checks tensor
values, eagerly or inside a compiled step.
"""

import math
import numbers

import tensorflow as tf

__all__ = ["is_integer", "is_number", "integer", "number", "seed", "checked"]

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
