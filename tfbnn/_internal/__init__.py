"""tfbnn's plumbing, shared by its modules and not part of the public API.

=================  ==============================================================
module             what it holds
=================  ==============================================================
``argtypes``       argparse types and the one-line error handling of the command
``startup``        the command's TensorFlow import with its start-up chatter filtered
``checks``         argument validation that names the argument and the value
``errors``         :class:`RunError` (re-exported as ``tfbnn.RunError``)
``files``          atomic writes, JSON/CSV/text output, plain-value conversion, tables
``configurable``   the base of the small config objects (priors, posterior builders)
``backend``        the backend contract: one clear error on a Keras backend other than TensorFlow
=================  ==============================================================

Any tfbnn module may import from here; users and tests use the public modules.
"""
