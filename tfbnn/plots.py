"""Matplotlib figures for predictive uncertainty (no display needed).

Every function returns a ``matplotlib.figure.Figure`` built without pyplot, so it
works headless and leaves the user's pyplot state alone; :func:`save` writes it.

* :func:`reliability_diagram` -- accuracy against confidence per bin, with ECE.
* :func:`regression_bands` -- predictive mean, epistemic and total bands, data.
* :func:`entropy_histograms` -- uncertainty in- vs out-of-distribution.
* :func:`accuracy_coverage` -- selective prediction curves.
* :func:`uncertainty_vs_shift` -- total / aleatoric / epistemic entropy and accuracy
  against corruption intensity (from :func:`tfbnn.evaluation.shift_sweep`).
* :func:`learning_curves` -- loss and metrics per epoch from a Keras ``History``.
* :func:`pruning_curve` -- accuracy against the fraction of weights pruned, by
  signal-to-noise and at random (from :func:`tfbnn.pruning.pruning_curve`).

Example:
    >>> import os, tempfile, keras, numpy as np, tfbnn
    >>> x_test = np.random.default_rng(0).normal(size=(50, 4)).astype("float32")
    >>> y_test = (x_test[:, 0] > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(2, activation="softmax", seed=0)])
    >>> res = tfbnn.predict(model, x_test, num_samples=50)
    >>> fig = tfbnn.plots.reliability_diagram(res.mean_probs, y_test)
    >>> path = os.path.join(tempfile.mkdtemp(), "reliability.png")
    >>> tfbnn.plots.save(fig, path) == path and os.path.getsize(path) > 0
    True
"""

import os

import numpy as np
from matplotlib.figure import Figure

from tfbnn import metrics

__all__ = [
    "reliability_diagram",
    "regression_bands",
    "entropy_histograms",
    "accuracy_coverage",
    "uncertainty_vs_shift",
    "learning_curves",
    "pruning_curve",
    "save",
]


def _figure(ncols=1, width=5.0, height=4.0):
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, np.atleast_1d(axes)


def save(fig, path, dpi=120):
    """Writes ``fig`` to ``path`` (format from the extension), creating the folder."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def reliability_diagram(probs, labels, num_bins=15, title="Reliability diagram"):
    """Bars of per-bin accuracy against confidence, the gap to the diagonal, and ECE.

    Args:
        probs: ``(N, C)`` predictive probabilities.
        labels: ``(N,)`` integer labels (or one-hot).
        num_bins: int > 0, equal-width confidence bins (default 15).
        title: str.
    """
    d = metrics.reliability_diagram(probs, labels, num_bins)
    fig, (ax,) = _figure()
    width = d.edges[1] - d.edges[0]
    filled = d.count > 0
    left = d.edges[:-1][filled]
    ax.bar(left, d.accuracy[filled], width=width, align="edge", color="tab:blue", edgecolor="black",
           label="accuracy")
    low = np.minimum(d.accuracy[filled], d.confidence[filled])
    gap = np.abs(d.confidence[filled] - d.accuracy[filled])
    ax.bar(left, gap, bottom=low, width=width, align="edge", color=(1.0, 0.0, 0.0, 0.15),
           edgecolor="tab:red", hatch="//", linewidth=0.5, label="gap to mean confidence")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=title)
    ax.text(0.04, 0.92, f"ECE = {d.ece:.4f}", transform=ax.transAxes, fontsize=11,
            bbox={"facecolor": "white", "alpha": 0.8})
    ax.legend(loc="lower right")
    return fig


def regression_bands(x_train, y_train, x_grid, mean, epistemic_std=None, total_std=None,
                     samples=None, true_fn=None, title="Predictive distribution", ax=None):
    """Predictive mean with +-2 std bands (epistemic, total) over 1-D inputs.

    Args:
        x_train, y_train: ``(n,)`` training points.
        x_grid: ``(m,)`` sorted evaluation inputs.
        mean: ``(m,)`` predictive mean.
        epistemic_std, total_std: ``(m,)`` or None.
        samples: ``(T, m)`` optional function samples to draw thinly.
        true_fn: optional callable giving the noiseless truth on ``x_grid``.
        title: str.
        ax: an existing axes to draw on (the figure is then ``ax.figure``).
    """
    if ax is None:
        fig, (ax,) = _figure(width=6.0)
    else:
        fig = ax.figure
    x_grid, mean = np.ravel(x_grid), np.ravel(mean)
    if total_std is not None:
        s = np.ravel(total_std)
        ax.fill_between(x_grid, mean - 2 * s, mean + 2 * s, color="tab:orange", alpha=0.25, label="total +-2 std")
    if epistemic_std is not None:
        s = np.ravel(epistemic_std)
        ax.fill_between(x_grid, mean - 2 * s, mean + 2 * s, color="tab:blue", alpha=0.35, label="epistemic +-2 std")
    if samples is not None:
        for row in np.asarray(samples)[:20]:
            ax.plot(x_grid, np.ravel(row), color="tab:blue", linewidth=0.5, alpha=0.4)
    if true_fn is not None:
        ax.plot(x_grid, true_fn(x_grid), "k:", linewidth=1, label="truth")
    ax.plot(x_grid, mean, color="tab:blue", linewidth=2, label="predictive mean")
    ax.scatter(np.ravel(x_train), np.ravel(y_train), s=12, color="black", zorder=3, label="training points")
    ax.set(xlabel="x", ylabel="y", title=title)
    ax.legend(loc="best", fontsize=8)
    return fig


def entropy_histograms(in_distribution, out_of_distribution, labels=("in-distribution", "shifted"),
                       xlabel="predictive entropy (nats)", title="Uncertainty in vs out of distribution"):
    """Overlaid histograms of an uncertainty score on two input sets."""
    fig, (ax,) = _figure()
    a, b = np.ravel(in_distribution), np.ravel(out_of_distribution)
    bins = np.linspace(0.0, max(a.max(initial=0), b.max(initial=0)) + 1e-6, 40)
    ax.hist(a, bins=bins, alpha=0.6, label=f"{labels[0]} (mean {a.mean():.3f})", color="tab:blue")
    ax.hist(b, bins=bins, alpha=0.6, label=f"{labels[1]} (mean {b.mean():.3f})", color="tab:red")
    ax.set(xlabel=xlabel, ylabel="examples", title=title)
    ax.legend()
    return fig


def accuracy_coverage(curves, title="Selective prediction"):
    """Accuracy against coverage for one or several ``SelectivePrediction`` curves.

    Args:
        curves: a :class:`tfbnn.metrics.SelectivePrediction` or a dict ``{label: curve}``.
    """
    if not isinstance(curves, dict):
        curves = {"model": curves}
    fig, (ax,) = _figure()
    for label, curve in curves.items():
        ax.plot(curve.coverage, curve.accuracy, label=f"{label} (area {curve.area:.4f})")
    ax.set(xlabel="coverage (fraction kept, most certain first)", ylabel="accuracy", xlim=(0, 1), title=title)
    ax.legend(loc="lower left")
    return fig


def uncertainty_vs_shift(sweeps, xlabel="corruption intensity", title="Uncertainty under dataset shift"):
    """Mean total / aleatoric / epistemic entropy and accuracy against shift intensity.

    Args:
        sweeps: the rows of :func:`tfbnn.evaluation.shift_sweep`, or a dict
            ``{label: rows}`` to compare models.
    """
    if not isinstance(sweeps, dict):
        sweeps = {"model": sweeps}
    fig, axes = _figure(ncols=2, width=5.0)
    styles = {"predictive_entropy": "-", "expected_entropy": "--", "mutual_information": ":"}
    names = {"predictive_entropy": "total", "expected_entropy": "aleatoric", "mutual_information": "epistemic"}
    for i, (label, rows) in enumerate(sweeps.items()):
        color = f"C{i}"
        levels = [r["level"] for r in rows]
        for key, style in styles.items():
            axes[0].plot(levels, [r[key] for r in rows], style, color=color, marker="o", markersize=3,
                         label=f"{label}: {names[key]}")
        axes[1].plot(levels, [r["accuracy"] for r in rows], "-", color=color, marker="o", markersize=3, label=label)
    axes[0].set(xlabel=xlabel, ylabel="mean entropy (nats)", title=title)
    axes[1].set(xlabel=xlabel, ylabel="accuracy", ylim=(0, 1), title="Accuracy under shift")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    return fig


def learning_curves(history, title="Learning curves"):
    """Loss and every other logged quantity per epoch (train and validation).

    Args:
        history: a ``keras.callbacks.History`` or its ``.history`` dict.
    """
    logs = getattr(history, "history", history)
    keys = [k for k in logs if not k.startswith("val_")]
    fig, axes = _figure(ncols=max(1, len(keys)), width=4.0, height=3.2)
    for ax, key in zip(axes, keys):
        epochs = np.arange(1, len(logs[key]) + 1)
        ax.plot(epochs, logs[key], marker="o", markersize=3, label="train")
        if f"val_{key}" in logs:
            ax.plot(epochs, logs[f"val_{key}"], marker="o", markersize=3, label="validation")
        ax.set(xlabel="epoch", title=key)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return fig


def pruning_curve(rows, title="Pruning by signal-to-noise vs at random"):
    """Accuracy against the percentage of weights pruned: principled and random pruning.

    Blundell et al. (2015), Table 2 as a curve: the principled masks remove the weights
    with the lowest ``|mu| / sigma`` (:func:`tfbnn.pruning.fraction_masks`), the random
    ones as many per layer at random positions.

    Args:
        rows: the rows of :func:`tfbnn.pruning.pruning_curve` (``fraction``,
            ``accuracy``, ``random_accuracy`` (None: not drawn)).
        title: str.
    """
    fig, (ax,) = _figure(width=5.5)
    # Evenly spaced positions: Blundell's fractions crowd near 100% on a linear axis.
    x = np.arange(len(rows))
    ax.plot(x, [r["accuracy"] for r in rows], "o-", color="tab:green", label="lowest signal-to-noise pruned")
    random = [(xi, r["random_accuracy"]) for xi, r in zip(x, rows) if r.get("random_accuracy") is not None]
    if random:
        ax.plot(*zip(*random), "s--", color="tab:red", label="random, same count per layer")
    ax.set(xlabel="weights pruned", ylabel="accuracy", ylim=(0, 1.02), title=title)
    ax.set_xticks(x, [f"{100 * r['fraction']:g}%" for r in rows])
    ax.legend(loc="lower left")
    return fig
