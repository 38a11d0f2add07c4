"""The package's version, in a module that loads nothing (the command's ``--version`` reads it)."""

__version__ = "0.1.0"
