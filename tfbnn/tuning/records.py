"""What a search leaves behind: KerasTuner's JSON records, the trial table, the CSV, the heat map.

:func:`write_record` writes KerasTuner's oracle, trial and tuner records whole or
not at all (:func:`tfbnn._internal.files.write_text`), so a search killed at any moment can be
resumed. :func:`trial_records` reads the trials of a tuner (best first),
:func:`write_csv` and :func:`plot_prior_grid` turn them into a table and a figure.
"""

import json
import math
import os

import numpy as np
import tensorflow as tf
from matplotlib.figure import Figure

from tfbnn._internal.files import write_csv as files_write_csv
from tfbnn._internal.files import write_text
from tfbnn.tuning.spaces import OBJECTIVES

__all__ = ["write_record", "trial_records", "write_csv", "plot_prior_grid"]


def write_record(path, obj):
    """Writes one of KerasTuner's JSON records (oracle, trial, tuner state) to ``path``.

    Whole or not at all (:func:`tfbnn._internal.files.write_text`: a temporary file, then a
    rename), so that a kill never leaves half a record for a resumed search to choke
    on. The text is ``json.dumps(obj)`` exactly as KerasTuner writes it (a diverged
    trial's ``NaN`` score stays a number when read back). On a remote file system
    (``gs://...``) there is no rename: the record is written as KerasTuner writes it.
    """
    path = os.fspath(path)
    if "://" in path:
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(json.dumps(obj))
        return path
    return write_text(path, json.dumps(obj))


def _oracle(tuner_or_oracle):
    oracle = getattr(tuner_or_oracle, "oracle", tuner_or_oracle)
    if not hasattr(oracle, "trials"):
        raise ValueError(
            "Expected a tuner or oracle holding the trial records (on the chief in distributed mode). "
            f"Received: {type(tuner_or_oracle).__name__}"
        )
    return oracle


def _metrics_at(trial, step):
    out = {}
    for name in trial.metrics.metrics:
        history = trial.metrics.get_history(name)
        at_step = [obs.value for obs in history if obs.step == step] if step is not None else []
        value = at_step[-1] if at_step else (history[-1].value if history else None)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        out[name] = None if value is None else float(value)
    return out


def trial_records(tuner_or_oracle):
    """One dict per trial, best first (completed trials ranked by the objective, then the rest).

    Keys: ``rank`` (None unless completed; ties broken by the validation NLL),
    ``trial_id``, ``status``, ``score`` (the objective's best value over epochs,
    KerasTuner's trial score), ``best_epoch``
    (1-based), the hyperparameter values, ``sigma1`` / ``sigma2`` when the values
    hold ``neg_log_sigma1`` / ``neg_log_sigma2``, and every metric at the best epoch.
    """
    oracle = _oracle(tuner_or_oracle)
    direction = oracle.objective.direction
    done, rest = [], []
    for trial in oracle.trials.values():
        record = {"rank": None, "trial_id": trial.trial_id, "status": trial.status, "score": trial.score,
                  "best_epoch": None if trial.best_step is None else int(trial.best_step) + 1}
        record.update(trial.hyperparameters.values)
        for k in ("1", "2"):
            if f"neg_log_sigma{k}" in record:
                record[f"sigma{k}"] = math.exp(-record[f"neg_log_sigma{k}"])
        record.update(_metrics_at(trial, trial.best_step))
        ok = trial.status == "COMPLETED" and trial.score is not None and math.isfinite(trial.score)
        (done if ok else rest).append(record)
    # Ties (common in short runs) go to the better validation NLL (accuracy for a val_nll objective).
    tie_name, tie_sign = ("val_accuracy", -1.0) if oracle.objective.name == "val_nll" else ("val_nll", 1.0)

    def key(r):
        tie = r.get(tie_name)
        return (-r["score"] if direction == "max" else r["score"],
                math.inf if tie is None else tie_sign * tie, r["trial_id"])

    done.sort(key=key)
    for rank, record in enumerate(done, 1):
        record["rank"] = rank
    rest.sort(key=lambda r: r["trial_id"])
    return done + rest


def write_csv(records, path):
    """Writes :func:`trial_records` to ``path`` (atomically); returns the column names.

    Floats keep every digit: :func:`tfbnn._internal.files.write_csv` rounds them to 6 decimals, which
    would cut ``sigma2 = e^-8 = 0.000335...`` to three significant digits.
    """
    columns = ["rank", "trial_id", "status", "score", "best_epoch"]
    for record in records:
        columns += [k for k in record if k not in columns]
    rows = [{k: str(v) if isinstance(v, float) else v for k, v in record.items()} for record in records]
    files_write_csv(path, rows, columns)
    return columns


def plot_prior_grid(records, path, metric="val_accuracy", title=None):
    """Heat maps of ``metric`` over (-log sigma1, -log sigma2), one panel per ``pi``.

    A cell holds the best value of ``metric`` among the completed trials at that
    prior (over any other tuned hyperparameter), annotated; missing cells are blank.
    Drawn without pyplot (``matplotlib.figure.Figure``, Agg canvas), so it needs no
    display and leaves the caller's pyplot state alone. Returns ``path``.
    """
    direction = OBJECTIVES.get(metric, "max")
    rows = [r for r in records if r.get("status") == "COMPLETED" and r.get(metric) is not None
            and all(k in r for k in ("pi", "neg_log_sigma1", "neg_log_sigma2"))]
    if not rows:
        raise ValueError(f"No completed trial has a value of {metric!r} and a prior to plot. Received: metric={metric!r}")
    pis = sorted({r["pi"] for r in rows})
    a_values = sorted({r["neg_log_sigma1"] for r in rows})
    b_values = sorted({r["neg_log_sigma2"] for r in rows})
    best = {}
    for r in rows:
        key = (r["pi"], r["neg_log_sigma1"], r["neg_log_sigma2"])
        old = best.get(key)
        if old is None or (r[metric] > old if direction == "max" else r[metric] < old):
            best[key] = r[metric]
    values = np.array(list(best.values()))
    vmin, vmax = float(values.min()), float(values.max())
    if vmin == vmax:
        vmin, vmax = vmin - 0.5e-3, vmax + 0.5e-3
    cmap = "viridis" if direction == "max" else "viridis_r"

    fig = Figure(figsize=(3.6 * len(pis) + 1.2, 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(pis), sharey=True))
    for ax, pi in zip(axes, pis):
        grid = np.full((len(a_values), len(b_values)), np.nan)
        for i, a in enumerate(a_values):
            for j, b in enumerate(b_values):
                grid[i, j] = best.get((pi, a, b), np.nan)
        image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", aspect="auto")
        for i in range(len(a_values)):
            for j in range(len(b_values)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=8,
                            color="white" if (grid[i, j] - vmin) / (vmax - vmin) < 0.5 else "black")
        ax.set_xticks(range(len(b_values)), [f"{b:g}" for b in b_values])
        ax.set_yticks(range(len(a_values)), [f"{a:g}" for a in a_values])
        ax.set_xlabel(r"$-\log \sigma_2$")
        ax.set_title(rf"$\pi$ = {pi:g}")
    axes[0].set_ylabel(r"$-\log \sigma_1$")
    fig.colorbar(image, ax=list(axes), label=metric)
    if title:
        fig.suptitle(title)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
