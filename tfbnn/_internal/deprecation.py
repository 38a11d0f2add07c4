"""Deprecated public names and keyword arguments that still work for a release, with a ``DeprecationWarning``.

:func:`renamed` serves old module attributes (a module's ``__getattr__``);
:func:`keywords_moved` keeps old keyword arguments of a function that became the
fields of an object passed as one argument; :func:`fold_keywords` does the same for
a dict of constructor arguments (a layer's, or its config).
"""

import dataclasses
import functools
import inspect
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


def keywords_moved(argument, target, path, when, names=None):
    """A decorator: the function's keyword arguments ``names`` became the fields of ``target``, passed as ``argument``.

    The decorated function's signature no longer has them. For one release a call may
    still pass them (a None counts as not passed) together with ``argument=when``: each
    one warns ``"`name=` is deprecated; pass argument=path(name=...)"`` and the function
    is called with ``argument=target(**them)``, so ``target`` checks them. With any other
    value of ``argument`` they are a ``ValueError``, as before they moved.

    Args:
        argument: str, the argument that takes a ``target``.
        target: the class the keywords became the fields of (a dataclass when ``names`` is None).
        path: str, the public dotted name of ``target`` (for the messages).
        when: the value of ``argument`` the old keywords went with (e.g. ``"auto"``).
        names: sequence of str, the old keywords, in the order they are reported;
            default: the fields of ``target``.
    """
    names = tuple(f.name for f in dataclasses.fields(target)) if names is None else tuple(names)

    def decorate(function):
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            moved = {name: kwargs.pop(name) for name in names if name in kwargs}
            moved = {name: value for name, value in moved.items() if value is not None}
            if not moved:
                return function(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            value = bound.arguments.get(argument, signature.parameters[argument].default)
            if not (isinstance(value, type(when)) and value == when):
                name, given = next(iter(moved.items()))
                raise ValueError(f"`{name}` applies to {argument}={when!r} (it is a field of {path}). "
                                 f"Received: {argument}={value!r}, {name}={given!r}")
            for name in moved:
                warnings.warn(f"`{name}=` is deprecated; pass {argument}={path}({name}=...)",
                              DeprecationWarning, stacklevel=2)
            bound.arguments[argument] = target(**moved)
            return function(*bound.args, **bound.kwargs)

        return wrapper

    return decorate


def fold_keywords(arguments, argument, names, make, path, warn=True, stacklevel=2, owner=None):
    """``arguments`` with its old keywords ``names`` folded into one object, ``argument=make(**them)``.

    The constructor arguments ``names`` (floats, say ``prior_mean`` and ``prior_stddev``)
    became one object argument (``node_prior=tfbnn.priors.Normal(loc, scale)``). The old
    keywords given (a None counts as not given) are popped and ``make`` builds the object
    from them, by their old names, so that it checks them under those names and fills
    the others with their old defaults. Each one warns (with ``warn``)
    ``"`name=` is deprecated; pass argument=path"``; given together with ``argument``
    they are a ``ValueError`` naming both.

    Args:
        arguments: dict of keyword arguments (or a config); not modified.
        argument: str, the new argument.
        names: sequence of str, the old keywords.
        make: callable taking the old keywords given, returning the new argument's value.
        path: str, how to write the new argument's value (for the message).
        warn: bool, emit a ``DeprecationWarning`` per old keyword (False for configs).
        stacklevel: int, of the warnings, counted from the caller of this function.
        owner: str or None, the class named at the start of the message.

    Returns:
        A new dict.
    """
    arguments = dict(arguments)
    given = {name: arguments.pop(name) for name in names if name in arguments}
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        return arguments
    old = ", ".join(f"{name}={value!r}" for name, value in given.items())
    if arguments.get(argument) is not None:
        raise ValueError(f"Expected `{argument}` or the deprecated {' and '.join(f'`{n}`' for n in given)}, "
                         f"not both. Received: {argument}={arguments[argument]!r}, {old}")
    if warn:
        prefix = "" if owner is None else f"{owner}: "
        for name in given:
            warnings.warn(f"{prefix}`{name}=` is deprecated; pass {argument}={path}.", DeprecationWarning,
                          stacklevel=stacklevel + 1)
    arguments[argument] = make(**given)
    return arguments
