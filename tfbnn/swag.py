"""SWA and SWAG: a Gaussian over weights from the iterates of SGD (Maddox et al. 2019).

Stochastic weight averaging (SWA; Izmailov et al. 2018) averages the weights
``theta_i`` that SGD visits (one snapshot per epoch, or every few steps, with a
constant or cyclical learning rate). SWA-Gaussian (SWAG; Maddox, Garipov, Izmailov,
Vetrov, Wilson 2019, sec. 3) keeps, over the ``n`` snapshots, the first and second
moments and the last ``K`` deviations::

    theta_SWA = (1/n) sum_i theta_i                                   (eq. 1)
    Sigma_diag = diag((1/n) sum_i theta_i^2 - theta_SWA^2)            (eq. 2)
    D = [D_1 ... D_K],   D_i = theta_i - theta_bar_i                  (eq. 3, Algorithm 1)

with ``theta_bar_i`` the running mean after snapshot ``i``, and uses the Gaussian
``N(theta_SWA, 1/2 (Sigma_diag + D D^T / (K - 1)))`` as an approximate posterior
(sec. 3.3), sampled without forming a ``P x P`` matrix::

    theta = theta_SWA + 1/sqrt(2) Sigma_diag^{1/2} z1 + 1/sqrt(2 (K - 1)) D z2,
    z1 ~ N(0, I_P),  z2 ~ N(0, I_K)

:class:`SWAG` is the callback that collects the moments during ``model.fit``;
:meth:`SWAG.posterior` gives a :class:`SWAGPosterior` that :func:`tfbnn.predict`
samples (``tfbnn.predict(posterior, x, num_samples=T)``: T weight draws, each run
through the model). ``scale`` multiplies the covariance (0.5, the paper's 1/2, by
default). BatchNormalization statistics depend on the weights: for a model with
BatchNorm, :meth:`SWAGPosterior.bn_update` makes every weight draw recompute them on
training data before predicting (the paper's protocol; :func:`bn_update` does it for
one model, e.g. after :meth:`SWAG.apply_swa`).

Example:
    >>> import keras, numpy as np, tfbnn
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(64, 2)).astype("float32")
    >>> y = x @ np.array([[1.0], [-1.0]], "float32")
    >>> keras.utils.set_random_seed(0)
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8, activation="tanh"),
    ...                           keras.layers.Dense(1)])
    >>> model.compile(keras.optimizers.SGD(0.05), "mse")
    >>> swag = tfbnn.swag.SWAG(start_epoch=5, max_rank=5)
    >>> _ = model.fit(x, y, epochs=15, batch_size=16, callbacks=[swag], verbose=0)
    >>> swag.num_snapshots, swag.deviations().shape          # 10 snapshots, D is (P, K)
    (10, (33, 5))
    >>> res = tfbnn.predict(swag.posterior(seed=0), x[:4], num_samples=20)
    >>> res.mean.shape, bool(np.all(res.epistemic_std > 0))
    ((4, 1), True)

References:
    Maddox, Garipov, Izmailov, Vetrov, Wilson. A Simple Baseline for Bayesian
    Uncertainty in Deep Learning. NeurIPS 2019 (sec. 3, eqs. 1-3, Algorithm 1).
    Izmailov, Podoprikhin, Garipov, Vetrov, Wilson. Averaging Weights Leads to Wider
    Optima and Better Generalization. UAI 2018 (SWA).
"""

import collections
import json
import warnings

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks, keras_private
from tfbnn.inference import FlatWeights, WeightPosterior

# Two snapshots closer than this (relative to the largest weight, at least 1) count as the same:
# float32 weights resolve about 1.2e-7 of their size.
_SAME_SNAPSHOT = 1e-7

__all__ = ["SWAG", "SWAGPosterior", "bn_update", "load"]


def _batch_norm_layers(model):
    return [l for l in keras_private.sublayers(model)
            if isinstance(l, keras.layers.BatchNormalization)]


def bn_update(model, x, batch_size=32):
    """Recomputes the BatchNormalization statistics of ``model`` on ``x``, in place.

    Each ``BatchNormalization`` layer's moving mean and variance become the average
    of its batch statistics over ``x`` (the cumulative average: the layer's momentum
    is set to ``1 - 1/b`` for the ``b``-th batch, then restored), with the other
    weights fixed, as SWA and SWAG need after their weights are set (Izmailov et al.
    2018, sec. 3.2). The model runs with ``training=True`` (dropout layers are on, as
    in training). A model without BatchNorm is left unchanged.

    Args:
        model: a ``keras.Model``.
        x: inputs: an array ``(N, ...)`` or a batched ``tf.data.Dataset`` yielding
            ``x`` or ``(x, y)``.
        batch_size: int >= 1, for an array. Default 32.

    Returns:
        ``model``.
    """
    batch_size = checks.integer("batch_size", batch_size, 1)
    layers = _batch_norm_layers(model)
    if not layers:
        return model
    momenta = [l.momentum for l in layers]
    try:
        for b, xb in enumerate(_batches(x, batch_size), start=1):
            for layer in layers:
                layer.momentum = 1.0 - 1.0 / b
            model(xb, training=True)
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    return model


def _batches(x, batch_size):
    if isinstance(x, tf.data.Dataset):
        for element in x:
            yield element[0] if isinstance(element, tuple) else element
        return
    x = np.asarray(x)
    if len(x) == 0:
        raise ValueError("Expected at least one example. Received: x with 0 examples")
    for start in range(0, len(x), batch_size):
        yield x[start: start + batch_size]


class SWAG(keras.callbacks.Callback, WeightPosterior):
    """Collects SWA/SWAG moments of all trainable weights during ``fit`` (Maddox et al. 2019).

    At each collection point (the end of every ``collect_every``-th epoch from
    ``start_epoch`` on, or every ``collect_every_steps`` training steps from there)
    the trainable weights, flattened in the order of ``model.trainable_variables``,
    become snapshot ``theta_n`` and update (float64)::

        mean    <- mean + (theta_n - mean) / n                       (eq. 1)
        sq_mean <- sq_mean + (theta_n^2 - sq_mean) / n               (eq. 2)
        D       <- the last max_rank columns of [..., theta_n - mean] (eq. 3)

    Snapshots accumulate across several ``fit`` calls. A snapshot equal to the previous
    one (to float32 precision) raises a ``UserWarning``, once: SGD did not move between
    two collection points, and coinciding snapshots give a covariance of about 0. After ``fit``,
    ``tfbnn.predict(swag, x, num_samples=T)`` samples :meth:`posterior` (default scale,
    unseeded); make the posterior yourself for a seed or another scale. Use a learning rate that keeps
    SGD moving (constant, or cyclical) over the collection epochs, as the paper does.

    Args:
        start_epoch: int >= 0, the first epoch (0-based) whose weights are collected.
            Default 0.
        collect_every: int >= 1, collect every this many epochs. Default 1.
        collect_every_steps: int >= 1 or None: collect every this many training steps
            (batches) instead, from ``start_epoch`` on. Default None.
        max_rank: int >= 2, K, the columns of the deviation matrix. Default 20.
        diag_clip: float >= 0, the smallest diagonal variance (rounding can make
            ``sq_mean - mean^2`` negative). Default 1e-30.

    Attributes:
        num_snapshots: n. ``mean``, ``sq_mean`` (P,) float64.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> swag = tfbnn.swag.SWAG(collect_every_steps=2)
        >>> _ = model.fit(np.ones((8, 1)), np.ones((8, 1)), batch_size=2, epochs=2, callbacks=[swag], verbose=0)
        >>> swag.num_snapshots, swag.swa_weights().shape       # 8 steps: every 2nd collected
        (4, (2,))
    """

    def __init__(self, start_epoch=0, collect_every=1, collect_every_steps=None, max_rank=20, diag_clip=1e-30):
        super().__init__()
        self.start_epoch = checks.integer("start_epoch", start_epoch, 0)
        self.collect_every = checks.integer("collect_every", collect_every, 1)
        self.collect_every_steps = checks.integer("collect_every_steps", collect_every_steps, 1, allow_none=True)
        self.max_rank = checks.integer("max_rank", max_rank, 2)
        self.diag_clip = checks.number("diag_clip", diag_clip, low=0)
        self.num_snapshots = 0
        self.mean = self.sq_mean = None
        self._deviations = collections.deque(maxlen=self.max_rank)
        self._epoch = 0
        self._steps = 0
        self._flat = None
        self._bn_data = None
        self._last = None
        self._warned_repeated = False

    # -- collection ------------------------------------------------------------------
    def set_model(self, model):
        super().set_model(model)
        self._flat = None

    def _flat_weights(self):
        if self._flat is None or self._flat.model is not self.model:
            self._flat = FlatWeights(self.model)
        return self._flat

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.collect_every_steps is None or self._epoch < self.start_epoch:
            return
        self._steps += 1
        if self._steps % self.collect_every_steps == 0:
            self.collect()

    def on_epoch_end(self, epoch, logs=None):
        if self.collect_every_steps is None and epoch >= self.start_epoch and (
                epoch - self.start_epoch) % self.collect_every == 0:
            self.collect()

    def collect(self, weights=None):
        """Adds a snapshot: ``weights`` (P,), or the model's current trainable weights."""
        theta = self._flat_weights().flatten() if weights is None else np.asarray(weights, np.float64)
        if self.mean is not None and theta.shape != self.mean.shape:
            raise ValueError(f"Expected a snapshot of {self.mean.shape[0]} weights (the model's trainable weights "
                             f"changed?). Received: {theta.shape[0]} weights")
        if self.mean is None:
            self.mean, self.sq_mean = np.zeros_like(theta), np.zeros_like(theta)
        self._warn_if_repeated(theta)
        self.num_snapshots += 1
        self.mean += (theta - self.mean) / self.num_snapshots
        self.sq_mean += (theta ** 2 - self.sq_mean) / self.num_snapshots
        self._deviations.append(theta - self.mean)
        self._last = theta

    def _warn_if_repeated(self, theta):
        """Warns (once) when ``theta`` equals the previous snapshot to float32 precision: the weights did not
        move between two collection points, and snapshots that coincide make a covariance of about 0."""
        last = self._last
        if last is None or self._warned_repeated:
            return
        change = float(np.max(np.abs(theta - last))) if theta.size else 0.0
        if change <= _SAME_SNAPSHOT * max(1.0, float(np.max(np.abs(theta)))):
            self._warned_repeated = True
            warnings.warn(
                f"SWAG snapshot {self.num_snapshots + 1} equals snapshot {self.num_snapshots} (largest weight change "
                f"{change:.3g}): the weights did not move between two collection points, and coinciding snapshots "
                "collapse the SWAG covariance to about 0. A common cause: after `keras.utils.set_random_seed`, "
                "`fit` on NumPy arrays shuffles them in the same order every epoch, so on a convex problem SGD "
                "settles into a cycle whose epoch ends coincide. Collect within epochs (`collect_every_steps`), "
                "feed a `tf.data` pipeline that reshuffles every epoch, or keep SGD moving (a larger or "
                "cyclical learning rate).", UserWarning, stacklevel=3)

    # -- the moments -----------------------------------------------------------------
    def _check_collected(self, minimum=1):
        if self.num_snapshots < minimum:
            raise ValueError(f"Expected at least {minimum} SWAG snapshot(s) (pass the callback to `fit`, and check "
                             f"`start_epoch`). Received: {self.num_snapshots} snapshots")

    def swa_weights(self):
        """``theta_SWA`` (P,) float64, the mean of the snapshots (eq. 1)."""
        self._check_collected()
        return self.mean.copy()

    def diagonal(self):
        """``Sigma_diag`` (P,) float64: ``max(sq_mean - mean^2, diag_clip)`` (eq. 2)."""
        self._check_collected()
        return np.maximum(self.sq_mean - self.mean ** 2, self.diag_clip)

    def deviations(self):
        """``D`` (P, K) float64, the last K deviations ``theta_i - theta_bar_i``, oldest first (eq. 3)."""
        self._check_collected()
        return np.stack(self._deviations, axis=1)

    def apply_swa(self, bn_data=None, batch_size=32):
        """Writes ``theta_SWA`` into the model (SWA), recomputing BatchNorm statistics on ``bn_data`` if given.

        Returns:
            The model.
        """
        self._flat_weights().assign(self.swa_weights())
        return self.model if bn_data is None else bn_update(self.model, bn_data, batch_size)

    def bn_update(self, x, batch_size=32):
        """Records training inputs on which the posteriors made later recompute BatchNorm statistics
        for every weight draw (see :meth:`SWAGPosterior.bn_update`). Returns ``self``."""
        self._bn_data = (x, checks.integer("batch_size", batch_size, 1))
        return self

    def posterior(self, scale=0.5, seed=None, model=None):
        """The SWAG Gaussian ``N(theta_SWA, scale (Sigma_diag + D D^T / (K - 1)))`` (sec. 3.3).

        Args:
            scale: float > 0, multiplies the covariance; 0.5 (default) is the paper's 1/2.
            seed: int or None, seed of the posterior's draws.
            model: the ``keras.Model`` the weights belong to (default: the model ``fit`` ran).

        Returns:
            A :class:`SWAGPosterior`.
        """
        self._check_collected(2)
        model = model or self.model
        if model is None:
            raise ValueError("Expected a model for the posterior (this SWAG was loaded without one). "
                             "Received: model=None")
        posterior = SWAGPosterior(model, self.swa_weights(), self.diagonal(), self.deviations(), scale=scale, seed=seed)
        if self._bn_data is not None:
            posterior.bn_update(*self._bn_data)
        return posterior

    kind = "swag"

    def weight_draws(self, num_samples, seed=None):
        """``(T, P)`` draws of :meth:`posterior` (default scale) with ``seed``."""
        return self.posterior(seed=seed).sample(num_samples)

    def predictive_samples(self, x, num_samples, batch_size=None, seed=None):
        return self.posterior(seed=seed).predictive_samples(x, num_samples, batch_size)

    def forward(self, draws, x):
        return self.posterior().forward(draws, x)

    # -- saving ----------------------------------------------------------------------
    def get_config(self):
        return {"start_epoch": self.start_epoch, "collect_every": self.collect_every,
                "collect_every_steps": self.collect_every_steps, "max_rank": self.max_rank,
                "diag_clip": self.diag_clip}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def save(self, path):
        """Writes the configuration and the collected moments to an ``.npz`` file (see :func:`load`, or
        :func:`tfbnn.inference.load_posterior`, which reads every fitted posterior)."""
        super().save(path)

    def _state(self):
        self._check_collected()
        config = dict(self.get_config(), num_snapshots=self.num_snapshots)
        return config, {"mean": self.mean, "sq_mean": self.sq_mean, "deviations": self.deviations()}

    @classmethod
    def _from_state(cls, config, arrays, model):
        return _restore(config, arrays, model)


def load(path, model=None):
    """A :class:`SWAG` saved by :meth:`SWAG.save`, with its moments, for ``model`` (optional).

    Args:
        path: the ``.npz`` file.
        model: the ``keras.Model`` the moments belong to, or None (then pass it to
            :meth:`SWAG.posterior`).

    Returns:
        A :class:`SWAG` (it can go on collecting in another ``fit``).
    """
    with np.load(path, allow_pickle=False) as data:
        config = json.loads(str(data["config"]))
        arrays = {name: data[name] for name in ("mean", "sq_mean", "deviations")}
    config.pop("kind", None)
    return _restore(config, arrays, model)


def _restore(config, arrays, model):
    mean, sq_mean, deviations = arrays["mean"], arrays["sq_mean"], arrays["deviations"]
    config = dict(config)
    num_snapshots = config.pop("num_snapshots")
    swag = SWAG.from_config(config)
    if model is not None:
        size = FlatWeights(model).num_parameters
        if size != mean.shape[0]:
            raise ValueError(f"Expected a model with {mean.shape[0]} trainable weights (the saved SWAG's). "
                             f"Received: model={model.name!r} with {size}")
        swag.set_model(model)
    swag.num_snapshots, swag.mean, swag.sq_mean = num_snapshots, mean, sq_mean
    swag._deviations.extend(deviations.T)
    return swag


class SWAGPosterior(WeightPosterior):
    """The SWAG Gaussian over a model's flattened weights, sampled without a ``P x P`` matrix.

    ``theta = mean + sqrt(scale) (diag^{1/2} * z1 + D z2 / sqrt(K - 1))``, ``z1 ~ N(0,
    I_P)``, ``z2 ~ N(0, I_K)``: covariance ``scale (diag(diag) + D D^T / (K - 1))``
    (Maddox et al. 2019, sec. 3.3; ``scale = 1/2`` there). ``tfbnn.predict(posterior,
    x, num_samples=T)`` runs the model with T draws.

    Args:
        model: the ``keras.Model`` whose trainable weights (flattened) the posterior is over.
        mean: (P,), ``theta_SWA``.
        diagonal: (P,), ``Sigma_diag``.
        deviations: (P, K), ``D``, K >= 2.
        scale: float > 0. Default 0.5.
        seed: int or None: the draws come from a NumPy generator seeded with it, so a
            posterior made with a seed gives the same sequence of draws.
    """

    kind = "swag_posterior"

    def __init__(self, model, mean, diagonal, deviations, scale=0.5, seed=None):
        self.model = model
        self.mean = np.asarray(mean, np.float64)
        self.diagonal = np.asarray(diagonal, np.float64)
        self.deviation_matrix = np.asarray(deviations, np.float64)
        size = self.mean.shape[0]
        if self.diagonal.shape != (size,) or self.deviation_matrix.ndim != 2 or self.deviation_matrix.shape[0] != size:
            raise ValueError(f"Expected mean (P,), diagonal (P,) and deviations (P, K). Received: shapes "
                             f"{self.mean.shape}, {self.diagonal.shape}, {self.deviation_matrix.shape}")
        if self.deviation_matrix.shape[1] < 2:
            raise ValueError(f"Expected deviations with K >= 2 columns. Received: K={self.deviation_matrix.shape[1]}")
        self.scale = checks.number("scale", scale, low=0, low_open=True)
        self.seed = checks.numpy_seed(seed)
        self._rng = np.random.default_rng(self.seed)
        self._bn_data = None

    @property
    def rank(self):
        """K, the columns of the deviation matrix."""
        return self.deviation_matrix.shape[1]

    def covariance(self):
        """The dense ``(P, P)`` covariance (small models and tests only)."""
        d = self.deviation_matrix
        return self.scale * (np.diag(self.diagonal) + d @ d.T / (self.rank - 1))

    def sample(self, num_samples=None, seed=None):
        """Weight draws: ``(P,)`` for ``num_samples=None``, else ``(T, P)``, float64.

        Args:
            num_samples: int >= 1 or None.
            seed: int or None: a fresh generator with this seed; None continues the
                posterior's own generator.
        """
        count = checks.integer("num_samples", num_samples, 1, allow_none=True)
        rng = self._rng if seed is None else np.random.default_rng(checks.numpy_seed(seed))
        k = count or 1
        z1 = rng.standard_normal((k, self.mean.shape[0]))
        z2 = rng.standard_normal((k, self.rank))
        noise = np.sqrt(self.diagonal) * z1 + z2 @ self.deviation_matrix.T / np.sqrt(self.rank - 1)
        draws = self.mean + np.sqrt(self.scale) * noise
        return draws[0] if count is None else draws

    def weight_draws(self, num_samples, seed=None):
        return self.sample(num_samples, seed=seed)

    def forward(self, draws, x):
        if self._bn_data is not None and _batch_norm_layers(self.model):
            raise ValueError("A SWAG posterior that recomputes BatchNorm statistics per draw (`bn_update`) runs "
                             "one draw at a time, eagerly; it has no traceable forward pass (export). "
                             f"Received: model={self.model.name!r} with BatchNormalization layers")
        return super().forward(draws, x)

    def _state(self):
        config = {"scale": self.scale, "seed": self.seed}
        return config, {"mean": self.mean, "diagonal": self.diagonal, "deviations": self.deviation_matrix}

    @classmethod
    def _from_state(cls, config, arrays, model):
        return cls(model, arrays["mean"], arrays["diagonal"], arrays["deviations"], **config)

    def bn_update(self, x, batch_size=32):
        """Predictions recompute the BatchNorm statistics on ``x`` for each weight draw.

        With BatchNorm in the model, each draw is written into a copy of the model,
        :func:`bn_update` runs on ``x``, and the copy predicts (one draw at a time).
        Returns ``self``.
        """
        self._bn_data = (x, checks.integer("batch_size", batch_size, 1))
        return self

    def _output_samples(self, thetas, x, batch_size):
        if self._bn_data is None or not _batch_norm_layers(self.model):
            return super()._output_samples(thetas, x, batch_size)
        copy = keras.models.clone_model(self.model)
        copy.set_weights(self.model.get_weights())
        flat = FlatWeights(copy)
        outputs = []
        for theta in thetas:
            flat.assign(theta)
            bn_update(copy, *self._bn_data)
            outputs.append(np.concatenate([np.asarray(copy(xb, training=False)) for xb in _batches(
                x, batch_size or 256)]))
        return np.stack(outputs)
