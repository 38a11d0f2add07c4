"""Evaluate a classifier's predictive uncertainty: metrics, shift, plots, JSON.

:func:`evaluate_classifier` computes, from T Monte Carlo samples per example,
accuracy, NLL, Brier score, ECE (15 equal-width bins), the area under the
accuracy-coverage curve, and the total / aleatoric / epistemic uncertainty on clean
inputs and on Gaussian-shifted inputs ``x' = (1 - gamma) x + gamma eps``, plus a
sweep over shift intensities. :func:`write_report` saves the figures next to a JSON
of the numbers. The ``tfbnn evaluate`` command and ``tfbnn train``'s results table
use both.
"""

import dataclasses
import json
import os

import numpy as np

from tfbnn import inference, metrics, plots
from tfbnn.datasets import corruptions
from tfbnn.utils import bayesian_layers, posterior_mean

__all__ = ["Evaluation", "evaluate_classifier", "write_report"]


@dataclasses.dataclass
class Evaluation:
    """Numbers (``numbers``, JSON-able) and what the figures need."""

    numbers: dict
    labels: np.ndarray
    clean: object
    shifted: object
    sweep: list


def _summary(res, labels, num_bins):
    return {
        "accuracy": metrics.accuracy(res.mean_probs, labels),
        "nll": metrics.negative_log_likelihood(res.mean_probs, labels),
        "brier": metrics.brier_score(res.mean_probs, labels),
        "ece": metrics.expected_calibration_error(res.mean_probs, labels, num_bins),
        "predictive_entropy": float(np.mean(res.predictive_entropy)),
        "aleatoric": float(np.mean(res.expected_entropy)),
        "epistemic": float(np.mean(res.mutual_information)),
    }


def evaluate_classifier(model, x, y, num_samples=50, num_bins=15, shift_gamma=0.5,
                        sweep_levels=(0.0, 0.25, 0.5, 0.75, 1.0), seed=0, batch_size=256):
    """Monte Carlo evaluation of a classifier on clean and shifted inputs.

    Args:
        model: a Keras classifier with softmax outputs (tfbnn layers sample; a model
            with no Bayesian layer gives zero epistemic uncertainty).
        x: ``(N, ...)`` inputs; y: ``(N,)`` integer labels.
        num_samples: int, T.
        num_bins: int, ECE bins (default 15).
        shift_gamma: float in [0, 1], the shift of the clean-vs-shifted comparison.
        sweep_levels: Gaussian-shift intensities of the sweep (empty: no sweep).
        seed: int, seed of the shift noise.
        batch_size: examples per vectorized call.

    Returns:
        An :class:`Evaluation`; ``numbers`` holds ``clean`` and ``shifted`` dicts
        (accuracy, nll, brier, ece, predictive_entropy, aleatoric, epistemic),
        ``selective_area``, ``posterior_mean_accuracy`` and ``posterior_mean_ece``
        (Bayesian models), and the ``sweep`` rows.
    """
    labels = np.asarray(y)
    clean = inference.predict(model, x, num_samples=num_samples, batch_size=batch_size, task="classification")
    x_shift = corruptions.gaussian_noise(x, shift_gamma, seed=seed)
    shifted = inference.predict(model, x_shift, num_samples=num_samples, batch_size=batch_size,
                                task="classification")
    sweep = corruptions.shift_sweep(model, x, labels, "gaussian", levels=sweep_levels, num_samples=num_samples,
                                    seed=seed, batch_size=batch_size) if sweep_levels else []
    numbers = {
        "num_examples": int(len(labels)),
        "num_samples": int(num_samples),
        "num_bins": int(num_bins),
        "shift_gamma": float(shift_gamma),
        "clean": _summary(clean, labels, num_bins),
        "shifted": _summary(shifted, labels, num_bins),
        "selective_area": metrics.selective_prediction(clean.mean_probs, labels, clean.predictive_entropy).area,
        "sweep": sweep,
    }
    if bayesian_layers(model):
        with posterior_mean(model):
            mean_probs = model.predict(x, batch_size=batch_size, verbose=0)
        numbers["posterior_mean_accuracy"] = metrics.accuracy(mean_probs, labels)
        numbers["posterior_mean_ece"] = metrics.expected_calibration_error(mean_probs, labels, num_bins)
    return Evaluation(numbers=numbers, labels=labels, clean=clean, shifted=shifted, sweep=sweep)


def write_report(evaluation, folder, name="model"):
    """Writes ``metrics.json`` and the PNG figures into ``folder``; returns the paths."""
    os.makedirs(folder, exist_ok=True)
    e = evaluation
    figures = {
        "reliability.png": plots.reliability_diagram(e.clean.mean_probs, e.labels, e.numbers["num_bins"],
                                                     title=f"Reliability: {name}"),
        "entropy_histogram.png": plots.entropy_histograms(
            e.clean.predictive_entropy, e.shifted.predictive_entropy,
            labels=("clean", f"shifted (gamma={e.numbers['shift_gamma']:g})")),
        "epistemic_histogram.png": plots.entropy_histograms(
            e.clean.mutual_information, e.shifted.mutual_information,
            labels=("clean", f"shifted (gamma={e.numbers['shift_gamma']:g})"),
            xlabel="mutual information (nats)", title="Epistemic uncertainty in vs out of distribution"),
        "accuracy_coverage.png": plots.accuracy_coverage(
            {name: metrics.selective_prediction(e.clean.mean_probs, e.labels, e.clean.predictive_entropy)}),
    }
    if e.sweep:
        figures["shift.png"] = plots.uncertainty_vs_shift({name: e.sweep}, xlabel="Gaussian shift gamma")
    paths = [plots.save(fig, os.path.join(folder, fname)) for fname, fig in figures.items()]
    json_path = os.path.join(folder, "metrics.json")
    with open(json_path, "w") as f:
        json.dump(e.numbers, f, indent=2)
    return [json_path] + paths
