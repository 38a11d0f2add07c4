"""The base of tfbnn's small configuration objects (priors, posterior builders)."""

__all__ = ["Configurable"]


class Configurable:
    """An object defined by its config: rebuilt by ``from_config``, equal when type and config are.

    Subclasses implement ``get_config`` (a dict of the constructor's arguments).
    """

    def get_config(self):
        raise NotImplementedError

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        # repr: a config may hold dicts (an initializer's config), which do not hash.
        return hash((type(self).__name__, repr(sorted(self.get_config().items()))))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"
