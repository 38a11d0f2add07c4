"""Which model is calling a layer: the one private Keras state tfbnn's distribution heads read.

Keras gives a layer no public reference to the model whose call is running it. Its
``Layer.__call__`` records the outermost layer of the running call (the model that
``fit``, ``evaluate``, ``predict`` or ``model(x)`` called) in a call context, a global
of ``keras.src.backend.common.global_state``; :func:`calling_model` reads it, nothing
else. Checked on Keras 3.15: if a later Keras moves it, :func:`calling_model` returns
None (the checks that use it are skipped) rather than failing.
"""

try:
    from keras.src.backend.common import global_state
except ImportError:  # pragma: no cover - a Keras without this module
    global_state = None

__all__ = ["calling_model"]


def calling_model():
    """The outermost layer or model whose call is running now (Keras' call context), or None."""
    if global_state is None:  # pragma: no cover
        return None
    context = global_state.get_global_attribute("current_call_ctx")
    return getattr(context, "entry_layer", None)
