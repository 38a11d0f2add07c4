"""The exception a run raises when it fails for a reason other than a bad argument.

Bad arguments raise ``ValueError`` / ``TypeError`` naming the argument. A run that
starts with good arguments and then fails (the loss became NaN, a dataset could not
be loaded, a file could not be written) raises :class:`RunError`; the ``tfbnn``
command prints its message on one line and exits with status 1.
"""

__all__ = ["RunError"]


class RunError(RuntimeError):
    """A run failed (training diverged, data or files unavailable); nothing saved was lost."""

    exit_status = 1
