"""Old public names that still resolve, with a ``DeprecationWarning``: a module's ``__getattr__``."""

import sys
import warnings


def renamed(module_name, renames, fallback=None):
    """A module ``__getattr__`` that serves each old name of ``renames`` (old -> new) as the new one.

    The value is looked up when asked for, so it is the module's current object.
    ``fallback(name)`` handles other names (a package's lazy attributes); without it
    they raise ``AttributeError`` as Python would.
    """

    def __getattr__(name):
        if name in renames:
            new = renames[name]
            warnings.warn(f"{module_name}.{name} is deprecated: use {module_name}.{new}.",
                          DeprecationWarning, stacklevel=2)
            return getattr(sys.modules[module_name], new)
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
