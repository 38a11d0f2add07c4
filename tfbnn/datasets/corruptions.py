"""Input corruptions for covariate-shift experiments, and a sweep over their intensity.

Following Trinh et al. (2022, sec. 6 and eq. 28), an input ``x`` is corrupted with
intensity ``gamma`` (Gaussian noise) or ``p`` (salt and pepper)::

    gaussian_noise:   x' = (1 - gamma) x + gamma eps,          eps ~ N(0, 1) per element
    salt_and_pepper:  x'_j = low  with probability p / 2,
                      x'_j = high with probability p / 2,
                      x'_j = x_j  otherwise                    (eq. 28)
    token_replacement: x'_j = a uniform token id in 1..V-1 with probability p
                      (token sequences; padding, id 0, is kept)

:func:`tfbnn.evaluation.shift_sweep` applies increasing intensities to a test set
and reports, per level, accuracy and the mean total / aleatoric / epistemic
uncertainty: under a growing shift a good Bayesian model gets less accurate and
more uncertain.

All randomness is NumPy's ``Generator`` seeded by ``seed`` (an int, or a
``numpy.random.Generator`` to continue a stream); the same seed gives the same
corruption.

Reference:
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022 (eq. 26-28).
"""

import math

import numpy as np

__all__ = ["gaussian_noise", "salt_and_pepper", "token_replacement", "check_levels", "make_rng", "CORRUPTIONS", "DEFAULT_LEVELS"]

#: Default intensities of :func:`tfbnn.evaluation.shift_sweep` per corruption (0 = clean data).
DEFAULT_LEVELS = {
    "gaussian": (0.0, 0.2, 0.4, 0.6, 0.8),
    "salt_and_pepper": (0.0, 0.05, 0.1, 0.2, 0.3),
    "token_replacement": (0.0, 0.1, 0.25, 0.5, 0.75),
}


def make_rng(seed):
    """A NumPy Generator from an int seed (or None: OS entropy); a Generator is returned as is."""
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
        >>> import numpy as np, tfbnn
        >>> x = np.full((2, 3), 0.5, "float32")
        >>> float(tfbnn.datasets.corruptions.gaussian_noise(x, 0.0, seed=0)[0, 0])  # gamma = 0: unchanged
        0.5
    """
    gamma = _check_fraction(gamma, "gamma")
    x = _as_float_array(x)
    eps = make_rng(seed).standard_normal(x.shape)
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
        >>> import numpy as np, tfbnn
        >>> x = np.full((1000,), 0.5, "float32")
        >>> out = tfbnn.datasets.corruptions.salt_and_pepper(x, 1.0, seed=0)  # every element 0 or 1
        >>> bool(np.all((out == 0) | (out == 1)))
        True
    """
    p = _check_fraction(p, "p")
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"Expected finite `low` <= `high`. Received: low={low!r}, high={high!r}")
    x = _as_float_array(x)
    rng = make_rng(seed)
    corrupt = rng.random(x.shape) < p
    salt = rng.random(x.shape) < 0.5
    return np.where(corrupt, np.where(salt, high, low), x).astype(x.dtype)


def token_replacement(x, p, seed=None, vocab_size=None):
    """Replaces each token id with a uniformly random one with probability ``p``: a shift for text models.

    Integer token sequences cannot take additive noise (a Gaussian shift leaves the
    vocabulary); instead each non-padding token (id != 0) becomes, with probability
    ``p``, a token id drawn uniformly from ``1 .. vocab_size - 1``. ``p = 1`` leaves
    no word of the review: its label is then unpredictable.

    Args:
        x: int array ``(N, length)`` of token ids, 0 the padding.
        p: float in [0, 1], the probability that a token is replaced.
        seed: int, ``numpy.random.Generator`` or None (unseeded).
        vocab_size: int >= 2 or None: the token ids are ``0 .. vocab_size - 1``;
            None: ``x.max() + 1``.

    Returns:
        Array of ``x``'s shape and dtype.

    Example:
        >>> import numpy as np, tfbnn
        >>> x = np.array([[5, 7, 9, 0, 0]])
        >>> out = tfbnn.datasets.corruptions.token_replacement(x, 1.0, seed=0, vocab_size=100)
        >>> out.dtype == x.dtype, bool(np.all(out[:, 3:] == 0)), bool(np.all(out[:, :3] >= 1))
        (True, True, True)
    """
    p = _check_fraction(p, "p")
    x = np.asarray(x)
    if x.dtype.kind not in "iu":
        raise ValueError(f"Expected integer token ids `x`. Received: x of dtype {x.dtype}")
    if vocab_size is None:
        vocab_size = int(x.max()) + 1 if x.size else 2
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
        raise ValueError(f"Expected `vocab_size` to be an integer >= 2. Received: vocab_size={vocab_size!r}")
    rng = make_rng(seed)
    replace = (rng.random(x.shape) < p) & (x != 0)
    return np.where(replace, rng.integers(1, max(2, vocab_size), size=x.shape), x).astype(x.dtype)


CORRUPTIONS = {"gaussian": gaussian_noise, "salt_and_pepper": salt_and_pepper, "token_replacement": token_replacement}


def check_levels(corruption, levels=None):
    """The intensities of a sweep of ``corruption``, checked (default :data:`DEFAULT_LEVELS`).

    Raises:
        ValueError: an unknown corruption, no level, or a level outside [0, 1]
            (named ``gamma`` for Gaussian noise, ``p`` for salt and pepper).
    """
    if corruption not in CORRUPTIONS:
        raise ValueError(f"Unknown corruption. Expected one of {list(CORRUPTIONS)}. Received: corruption={corruption!r}")
    levels = DEFAULT_LEVELS[corruption] if levels is None else tuple(levels)
    if not levels:
        raise ValueError(f"Expected at least one level. Received: levels={levels!r}")
    name = "gamma" if corruption == "gaussian" else "p"
    return tuple(_check_fraction(level, name) for level in levels)
