"""The 1-D toy regression of Blundell et al. (2015, sec. 5.2), generated offline.

    y = x + 0.3 sin(2 pi (x + e)) + 0.3 sin(4 pi (x + e)) + e,    e ~ N(0, noise_std^2)

Training inputs are drawn uniformly from ``x_range`` (default ``[0, 0.5]``, where
the paper's data lie); predictions are looked at on a wider grid
(default ``[-0.2, 1.2]``), where a Bayesian net should grow uncertain.
"""

import dataclasses
import math

import numpy as np

__all__ = ["RegressionDataset", "make_toy_regression", "toy_regression_curve", "make_cubic", "CUBIC_X_RANGE"]


@dataclasses.dataclass(frozen=True, repr=False)
class RegressionDataset:
    """A 1-D regression problem as NumPy arrays.

    Attributes:
        x_train, y_train: float32 ``(N, 1)``, the noisy training points.
        x_grid: float32 ``(M, 1)``, sorted inputs covering and extending the data range.
        y_grid: float32 ``(M, 1)``, the noise-free curve (``e = 0``) on ``x_grid``.
        x_range: ``(low, high)`` of the training inputs.
        noise_std: float, the standard deviation of ``e``.
        name: str.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_grid: np.ndarray
    y_grid: np.ndarray
    x_range: tuple
    noise_std: float
    name: str = "toy_regression"

    @property
    def num_examples(self):
        """``N``, the number of training points (the ``N`` of the ELBO convention)."""
        return int(len(self.x_train))

    def __repr__(self):
        return (f"RegressionDataset(name={self.name!r}, N={self.num_examples}, x_range={self.x_range}, "
                f"noise_std={self.noise_std}, grid={len(self.x_grid)} points)")


def toy_regression_curve(x, noise=0.0):
    """``x + 0.3 sin(2 pi (x + e)) + 0.3 sin(4 pi (x + e)) + e`` elementwise."""
    x = np.asarray(x, np.float64)
    shifted = x + noise
    return x + 0.3 * np.sin(2 * np.pi * shifted) + 0.3 * np.sin(4 * np.pi * shifted) + noise


def _check_range(name, value):
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        or not value[0] < value[1]
    ):
        raise ValueError(f"Expected `{name}` to be a pair (low, high) with low < high. Received: {name}={value!r}")
    return (float(value[0]), float(value[1]))


def make_toy_regression(num_examples=40, noise_std=0.02, x_range=(0.0, 0.5), grid_range=(-0.2, 1.2),
                        num_grid=281, seed=0):
    """Generates the toy regression problem.

    Args:
        num_examples: int >= 2, training points. Default 40.
        noise_std: float >= 0, the standard deviation of ``e``. Default 0.02 (Blundell et al.).
        x_range: ``(low, high)`` of the uniform training inputs. Default ``(0, 0.5)``.
        grid_range: ``(low, high)`` of the evaluation grid. Default ``(-0.2, 1.2)``.
        num_grid: int >= 2, grid points.
        seed: int >= 0.

    Returns:
        A :class:`RegressionDataset`.

    Example:
        >>> from tfbnn.datasets.regression import make_toy_regression
        >>> ds = make_toy_regression(seed=0)
        >>> ds.x_train.shape, ds.x_grid.shape
        ((40, 1), (281, 1))
    """
    for name, value, low in (("num_examples", num_examples, 2), ("num_grid", num_grid, 2), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"Expected `{name}` to be an integer >= {low}. Received: {name}={value!r}")
    if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)) or not (
        math.isfinite(noise_std) and noise_std >= 0
    ):
        raise ValueError(f"Expected `noise_std` to be a non-negative number. Received: noise_std={noise_std!r}")
    x_range = _check_range("x_range", x_range)
    grid_range = _check_range("grid_range", grid_range)
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(*x_range, size=num_examples))
    y = toy_regression_curve(x, rng.normal(0.0, noise_std, size=num_examples))
    grid = np.linspace(*grid_range, num_grid)
    return RegressionDataset(
        x_train=x[:, None].astype(np.float32),
        y_train=y[:, None].astype(np.float32),
        x_grid=grid[:, None].astype(np.float32),
        y_grid=toy_regression_curve(grid)[:, None].astype(np.float32),
        x_range=x_range,
        noise_std=float(noise_std),
    )


#: Inputs of the cubic problem are drawn from U(-CUBIC_X_RANGE, CUBIC_X_RANGE).
CUBIC_X_RANGE = 4.0


def make_cubic(num_points=30, noise_std=3.0, seed=0, num_test=200):
    """Points of ``y = x^3 + N(0, noise_std^2)``, ``x ~ U(-4, 4)`` (Hernandez-Lobato and Adams 2015).

    The 1-D regression problem of the iBNN paper (Trinh et al. 2022, sec. 6.1).

    Returns:
        ``(x, y, x_test, y_test)``, 1-D float32 arrays in the original units.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-CUBIC_X_RANGE, CUBIC_X_RANGE, size=num_points)
    x_test = rng.uniform(-CUBIC_X_RANGE, CUBIC_X_RANGE, size=num_test)
    y = x**3 + noise_std * rng.standard_normal(num_points)
    y_test = x_test**3 + noise_std * rng.standard_normal(num_test)
    return x.astype("float32"), y.astype("float32"), x_test.astype("float32"), y_test.astype("float32")
