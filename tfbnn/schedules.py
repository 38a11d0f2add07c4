"""KL-weight schedules: ``beta`` as a function of (epoch, batch).

A schedule maps the position in training to ``beta`` in the per-example loss
``mean NLL + beta * KL / N``. It is a pure function of ``(epoch, batch,
steps_per_epoch)``, so a run resumed by ``keras.callbacks.BackupAndRestore`` gets
exactly the betas the uninterrupted run would have had. Positions are measured in
fractional epochs ``t = epoch + batch / steps_per_epoch`` so ramps move per batch.

=================  ===============================================================
name               beta(t)
=================  ===============================================================
``constant``       ``beta``
``linear``         ``start + (end - start) * min(1, t / epochs)``
``warmup``         0 for ``t < warmup_epochs``, then linear over ``epochs``
``cosine``         ``start + (end - start) * (1 - cos(pi * min(1, t / epochs))) / 2``
``cyclic``         ``min(1, tau / ratio)``, ``tau = (t mod cycle_epochs) / cycle_epochs``
                   (Fu et al. 2019, cyclical annealing)
``blundell``       ``beta_i = M * 2^(M - i) / (2^M - 1)`` for minibatch ``i = 1..M`` of
                   an epoch: Blundell et al. (2015) eq. 9 weights ``pi_i`` times ``M``
=================  ===============================================================

One learning-rate schedule lives here too, so that a model compiled with it loads
after ``import tfbnn``: :class:`LinearRamp` (flat, then linear, then flat; Molchanov et
al. 2017, Trinh et al. 2022), used by :func:`tfbnn.training.learning_rate`.
"""

import math

import keras

from tfbnn._internal import checks

__all__ = ["Schedule", "Constant", "Linear", "WarmUp", "Cosine", "Cyclic", "Blundell", "get", "LinearRamp"]


def _check_nonneg(name, value):
    return checks.number(name, value, low=0)


def _check_positive(name, value):
    return checks.number(name, value, low=0, low_open=True)


def _position(epoch, batch, steps_per_epoch):
    if steps_per_epoch:
        return epoch + batch / steps_per_epoch
    return float(epoch)


class Schedule:
    """Base class. ``schedule(epoch, batch, steps_per_epoch) -> beta`` (a float)."""

    needs_steps_per_epoch = False

    def __call__(self, epoch, batch, steps_per_epoch=None):
        raise NotImplementedError

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


@keras.saving.register_keras_serializable(package="tfbnn")
class Constant(Schedule):
    """``beta`` fixed (1 is the true ELBO)."""

    def __init__(self, beta=1.0):
        self.beta = _check_nonneg("beta", beta)

    def __call__(self, epoch, batch, steps_per_epoch=None):
        return self.beta

    def get_config(self):
        return {"beta": self.beta}


@keras.saving.register_keras_serializable(package="tfbnn")
class Linear(Schedule):
    """Linear ramp from ``start`` to ``end`` over ``epochs`` (fractional) epochs."""

    def __init__(self, epochs=10, start=0.0, end=1.0):
        self.epochs = _check_positive("epochs", epochs)
        self.start = _check_nonneg("start", start)
        self.end = _check_nonneg("end", end)

    def _ramp(self, t):
        return min(1.0, max(0.0, t) / self.epochs)

    def __call__(self, epoch, batch, steps_per_epoch=None):
        return self.start + (self.end - self.start) * self._ramp(_position(epoch, batch, steps_per_epoch))

    def get_config(self):
        return {"epochs": self.epochs, "start": self.start, "end": self.end}


@keras.saving.register_keras_serializable(package="tfbnn")
class WarmUp(Linear):
    """KL off (``beta = start``, default 0) for ``warmup_epochs``, then a linear ramp."""

    def __init__(self, warmup_epochs=5, epochs=10, start=0.0, end=1.0):
        super().__init__(epochs=epochs, start=start, end=end)
        self.warmup_epochs = _check_nonneg("warmup_epochs", warmup_epochs)

    def __call__(self, epoch, batch, steps_per_epoch=None):
        t = _position(epoch, batch, steps_per_epoch) - self.warmup_epochs
        return self.start + (self.end - self.start) * self._ramp(t)

    def get_config(self):
        return {"warmup_epochs": self.warmup_epochs, **super().get_config()}


@keras.saving.register_keras_serializable(package="tfbnn")
class Cosine(Linear):
    """Half-cosine ramp from ``start`` to ``end`` over ``epochs``."""

    def __call__(self, epoch, batch, steps_per_epoch=None):
        ramp = self._ramp(_position(epoch, batch, steps_per_epoch))
        return self.start + (self.end - self.start) * 0.5 * (1.0 - math.cos(math.pi * ramp))


@keras.saving.register_keras_serializable(package="tfbnn")
class Cyclic(Schedule):
    """Cyclical annealing (Fu et al. 2019): repeated ramps 0 -> ``end``.

    Each cycle lasts ``cycle_epochs``; within it beta rises linearly for the first
    ``ratio`` of the cycle and stays at ``end`` for the rest.
    """

    def __init__(self, cycle_epochs=4, ratio=0.5, end=1.0):
        self.cycle_epochs = _check_positive("cycle_epochs", cycle_epochs)
        self.ratio = checks.number("ratio", ratio, low=0, high=1, low_open=True)
        self.end = _check_nonneg("end", end)

    def __call__(self, epoch, batch, steps_per_epoch=None):
        t = _position(epoch, batch, steps_per_epoch)
        tau = math.fmod(t, self.cycle_epochs) / self.cycle_epochs
        return self.end * min(1.0, tau / self.ratio)

    def get_config(self):
        return {"cycle_epochs": self.cycle_epochs, "ratio": self.ratio, "end": self.end}


@keras.saving.register_keras_serializable(package="tfbnn")
class Blundell(Schedule):
    """Blundell et al. (2015) eq. 9 minibatch weights, in the per-example convention.

    The paper weights the KL of minibatch ``i`` of ``M`` by ``pi_i = 2^(M-i) / (2^M - 1)``
    (sums to 1 over an epoch; early batches carry most of the complexity cost). With
    the loss ``mean NLL + beta * KL / N`` this is ``beta_i = M * pi_i``, so the
    betas average 1 over an epoch.
    """

    needs_steps_per_epoch = True

    def __call__(self, epoch, batch, steps_per_epoch=None):
        if not steps_per_epoch:
            raise ValueError(
                "The 'blundell' schedule needs the number of minibatches per epoch. "
                f"Received: steps_per_epoch={steps_per_epoch!r}"
            )
        m, i = int(steps_per_epoch), int(batch) + 1
        if i > m:
            return 0.0
        # Exact integer arithmetic: 2**M overflows a float for M > 1023.
        return m * 2 ** (m - i) / (2**m - 1)


_NAMES = {
    "constant": Constant,
    "linear": Linear,
    "warmup": WarmUp,
    "cosine": Cosine,
    "cyclic": Cyclic,
    "blundell": Blundell,
}


def get(identifier):
    """A schedule from a name (``constant, linear, warmup, cosine, cyclic, blundell``),
    a :class:`Schedule`, or a callable ``(epoch, batch, steps_per_epoch) -> beta``."""
    if isinstance(identifier, Schedule) or (callable(identifier) and not isinstance(identifier, type)):
        return identifier
    if isinstance(identifier, str) and identifier.lower() in _NAMES:
        return _NAMES[identifier.lower()]()
    raise ValueError(
        f"Unknown KL schedule. Expected one of {sorted(_NAMES)} or a Schedule. "
        f"Received: schedule={identifier!r}"
    )


# -- learning rate ----------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="tfbnn")
class LinearRamp(keras.optimizers.schedules.LearningRateSchedule):
    """``initial`` until step ``start``, linear to ``final * initial`` at step ``end``, then constant.

    The learning-rate policy of Molchanov et al. (2017; flat, then linear to 0) and of
    Trinh et al. (2022; flat for 50% of training, linear to 1% at 90%)::

        lr(t) = initial * (1 - (1 - final) * clip((t - start) / (end - start), 0, 1))

    Args:
        initial: float, the rate before ``start``.
        start, end: ints, optimizer steps where the ramp begins and ends.
        final: float, the rate after ``end`` as a fraction of ``initial``. Default 0.

    Example:
        >>> import keras, tfbnn
        >>> schedule = tfbnn.schedules.LinearRamp(1e-3, start=100 * 600, end=200 * 600)
        >>> [round(float(schedule(step)), 6) for step in (0, 100 * 600, 150 * 600, 200 * 600)]
        [0.001, 0.001, 0.0005, 0.0]
        >>> optimizer = keras.optimizers.Adam(schedule)
    """

    def __init__(self, initial, start, end, final=0.0):
        self.initial, self.start, self.end, self.final = float(initial), int(start), int(end), float(final)

    def __call__(self, step):
        t = keras.ops.cast(step, "float32")
        frac = keras.ops.clip((t - self.start) / max(self.end - self.start, 1), 0.0, 1.0)
        return self.initial * (1.0 - (1.0 - self.final) * frac)

    def get_config(self):
        return {"initial": self.initial, "start": self.start, "end": self.end, "final": self.final}
