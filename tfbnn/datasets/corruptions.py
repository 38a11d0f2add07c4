"""Input corruptions for covariate-shift experiments, and a sweep over their intensity.

Following Trinh et al. (2022, sec. 6 and eq. 28), an input ``x`` is corrupted with
intensity ``gamma`` (Gaussian noise) or ``p`` (salt and pepper)::

    gaussian_noise:   x' = (1 - gamma) x + gamma eps,          eps ~ N(0, 1) per element
    salt_and_pepper:  x'_j = low  with probability p / 2,
                      x'_j = high with probability p / 2,
                      x'_j = x_j  otherwise                    (eq. 28)

:func:`shift_sweep` applies increasing intensities to a test set and reports,
per level, accuracy and the mean total / aleatoric / epistemic uncertainty of
:func:`tfbnn.inference.predict`: under a growing shift a good Bayesian model gets
less accurate and more uncertain.

All randomness is NumPy's ``Generator`` seeded by ``seed`` (an int, or a
``numpy.random.Generator`` to continue a stream); the same seed gives the same
corruption.

Reference:
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022 (eq. 26-28).
"""

import math

import numpy as np

from tfbnn import inference, metrics

__all__ = ["gaussian_noise", "salt_and_pepper", "shift_sweep", "CORRUPTIONS", "DEFAULT_LEVELS"]

#: Default intensities of :func:`shift_sweep` per corruption (0 = clean data).
DEFAULT_LEVELS = {
    "gaussian": (0.0, 0.2, 0.4, 0.6, 0.8),
    "salt_and_pepper": (0.0, 0.05, 0.1, 0.2, 0.3),
}


def _rng(seed):
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"Expected `seed` to be a non-negative int, a numpy Generator or None. Received: seed={seed!r}")
    return np.random.default_rng(seed)


def _check_fraction(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not (
        math.isfinite(value) and 0.0 <= value <= 1.0
    ):
        raise ValueError(f"Expected `{name}` in [0, 1]. Received: {name}={value!r}")
    return float(value)


def _as_float_array(x):
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        raise ValueError(f"Expected numeric inputs `x`. Received: x of dtype {x.dtype}")
    return x if x.dtype.kind == "f" else x.astype(np.float32)


def gaussian_noise(x, gamma, seed=None):
    """Mixes the inputs with standard normal noise: ``(1 - gamma) x + gamma eps``.

    ``gamma = 0`` returns ``x`` unchanged, ``gamma = 1`` pure noise. The result is
    not clipped (inputs in [0, 1] leave that range).

    Args:
        x: array ``(N, ...)`` of inputs.
        gamma: float in [0, 1], the intensity.
        seed: int, ``numpy.random.Generator`` or None (unseeded).

    Returns:
        Array of ``x``'s shape and float dtype.

    Example:
        >>> x = np.full((2, 3), 0.5, "float32")
        >>> float(tfbnn.datasets.corruptions.gaussian_noise(x, 0.0, seed=0)[0, 0])  # gamma = 0: unchanged
        0.5
    """
    gamma = _check_fraction(gamma, "gamma")
    x = _as_float_array(x)
    eps = _rng(seed).standard_normal(x.shape)
    return ((1.0 - gamma) * x + gamma * eps).astype(x.dtype)


def salt_and_pepper(x, p, seed=None, low=0.0, high=1.0):
    """Sets each input element to ``low`` or ``high`` with probability ``p`` (Trinh et al. 2022, eq. 28).

    Each element is independently corrupted with probability ``p``; a corrupted
    element is ``low`` (pepper) or ``high`` (salt) with equal probability.

    Args:
        x: array ``(N, ...)`` of inputs.
        p: float in [0, 1], the probability that an element is corrupted.
        seed: int, ``numpy.random.Generator`` or None (unseeded).
        low: float, the pepper value. Default 0.
        high: float >= low, the salt value. Default 1.

    Returns:
        Array of ``x``'s shape and float dtype.

    Example:
        >>> x = np.full((1000,), 0.5, "float32")
        >>> out = tfbnn.datasets.corruptions.salt_and_pepper(x, 1.0, seed=0)  # every element 0 or 1
        >>> bool(np.all((out == 0) | (out == 1)))
        True
    """
    p = _check_fraction(p, "p")
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"Expected finite `low` <= `high`. Received: low={low!r}, high={high!r}")
    x = _as_float_array(x)
    rng = _rng(seed)
    corrupt = rng.random(x.shape) < p
    salt = rng.random(x.shape) < 0.5
    return np.where(corrupt, np.where(salt, high, low), x).astype(x.dtype)


CORRUPTIONS = {"gaussian": gaussian_noise, "salt_and_pepper": salt_and_pepper}


def shift_sweep(
    model,
    x,
    y,
    corruption="gaussian",
    levels=None,
    num_samples=30,
    seed=0,
    batch_size=None,
    from_logits=False,
    mc_dropout=False,
):
    """Accuracy and uncertainty of a classifier under corruptions of growing intensity.

    For each level the test inputs are corrupted (a fresh draw per level from one
    stream seeded by ``seed``) and :func:`tfbnn.inference.predict` summarises T
    samples. Uncertainties are means over the examples, in nats (Depeweg et al.
    2018; Trinh et al. 2022, eq. 26-27).

    Args:
        model: a Keras classifier (softmax outputs, or logits with ``from_logits``).
        x: array ``(N, ...)`` of clean inputs.
        y: ``(N,)`` integer labels or ``(N, C)`` one-hot.
        corruption: ``"gaussian"`` (:func:`gaussian_noise`, level = gamma) or
            ``"salt_and_pepper"`` (:func:`salt_and_pepper`, level = p).
        levels: sequence of intensities in [0, 1]; default
            ``DEFAULT_LEVELS[corruption]``.
        num_samples: int >= 1, T. Default 30.
        seed: int or None, seed of the corruption noise.
        batch_size, from_logits, mc_dropout: passed to :func:`tfbnn.inference.predict`.

    Returns:
        A list with one dict per level: ``level``, ``accuracy``, ``nll``, ``ece``,
        ``predictive_entropy`` (total), ``expected_entropy`` (aleatoric),
        ``mutual_information`` (epistemic). ``pandas.DataFrame(rows)`` tabulates it.

    Example:
        >>> from tfbnn.datasets import corruptions
        >>> model = keras.Sequential([keras.Input((4,)),
        ...                           tfbnn.layers.DenseFlipout(3, activation="softmax", seed=0)])
        >>> x, y = np.random.default_rng(0).random((20, 4)).astype("float32"), np.zeros(20, int)
        >>> rows = corruptions.shift_sweep(model, x, y, "gaussian", levels=(0.0, 0.5), num_samples=5)
        >>> len(rows), sorted(rows[0])
        (2, ['accuracy', 'ece', 'expected_entropy', 'level', 'mutual_information', 'nll', 'predictive_entropy'])
    """
    if corruption not in CORRUPTIONS:
        raise ValueError(f"Unknown corruption. Expected one of {list(CORRUPTIONS)}. Received: corruption={corruption!r}")
    levels = DEFAULT_LEVELS[corruption] if levels is None else tuple(levels)
    if not levels:
        raise ValueError(f"Expected at least one level. Received: levels={levels!r}")
    name = "gamma" if corruption == "gaussian" else "p"
    for level in levels:
        _check_fraction(level, name)
    x = _as_float_array(x)
    labels = np.asarray(y)
    if labels.shape[0] != x.shape[0]:
        raise ValueError(
            f"Expected `x` and `y` to have the same number of examples. Received: x.shape={x.shape}, y.shape={labels.shape}"
        )
    rng = _rng(seed)
    corrupt = CORRUPTIONS[corruption]
    rows = []
    for level in levels:
        res = inference.predict(
            model,
            corrupt(x, level, seed=rng),
            num_samples=num_samples,
            batch_size=batch_size,
            task="classification",
            from_logits=from_logits,
            mc_dropout=mc_dropout,
        )
        rows.append(
            {
                "level": float(level),
                "accuracy": metrics.accuracy(res.mean_probs, labels),
                "nll": metrics.negative_log_likelihood(res.mean_probs, labels),
                "ece": metrics.expected_calibration_error(res.mean_probs, labels),
                "predictive_entropy": float(np.mean(res.predictive_entropy)),
                "expected_entropy": float(np.mean(res.expected_entropy)),
                "mutual_information": float(np.mean(res.mutual_information)),
            }
        )
    return rows
