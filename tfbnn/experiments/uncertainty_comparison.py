"""One table: deterministic, MC dropout, Bayes by Backprop, iBNN and a deep ensemble on the same data.

Every method trains the same MLP (``--hidden-units`` x ``--depth`` ReLU, softmax head) on
the same split of the same data through :func:`tfbnn.training.run`, with the main job's
protocol (recipe ``digits-bbb-mlp``: Adam 3e-3, batch 32, 60 epochs, KL ramp over the first
half of training for the methods with a KL term, here to the ELBO's ``beta = 1``, with every
training example used for training and no temperature scaling) and only the method changed:

==================  =====================================================================
row                 recipe method
==================  =====================================================================
deterministic       ``deterministic`` (Keras ``Dense``)
MC dropout          ``mc_dropout`` (Gal & Ghahramani 2016; ``--dropout-rate``)
BbB                 ``bbb`` (Blundell et al. 2015; local reparameterization, N(0, 1) prior)
iBNN                ``ibnn`` (Trinh et al. 2022; K = 4 node mixture components)
deep ensemble       ``ensemble`` of ``--members`` deterministic MLPs (Lakshminarayanan et al. 2017)
==================  =====================================================================

Each is evaluated with the Monte Carlo predictive (:func:`tfbnn.predict`, ``T`` samples;
an ensemble of deterministic members is exact with one sample per member) on the clean
test split and on the same inputs shifted by Gaussian noise, ``x' = (1 - g) x + g eps``
(``g = 0.5``, :data:`tfbnn.training.SHIFT_GAMMA`). Columns: accuracy, NLL, ECE (15 bins),
Brier score; mean epistemic uncertainty (mutual information) on clean and shifted
inputs; and how well each example's epistemic uncertainty (and total predictive
entropy) tells the shifted inputs from the clean ones, as the area under the ROC curve
(:func:`tfbnn.metrics.auroc`, 0.5 = chance).

Outputs (``--output-dir``, default ``saved_models/experiments/uncertainty_comparison/``):
``comparison.csv``, ``comparison.json``, ``comparison.md`` (the table) and
``comparison.png`` (epistemic uncertainty clean vs shifted, and the AUROCs), next to
one ``tfbnn.training.run`` folder per method. ``--quick`` runs a few steps of each on a
subset (the test suite's smoke run).

Run: ``tfbnn uncertainty-comparison`` or ``python -m tfbnn.experiments.uncertainty_comparison``.

References:
    Lakshminarayanan, Pritzel, Blundell. Simple and Scalable Predictive Uncertainty
    Estimation using Deep Ensembles. NeurIPS 2017.
    Gal, Ghahramani. Dropout as a Bayesian Approximation. ICML 2016.
    Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural Networks. ICML 2015.
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based Bayesian
    Neural Networks. ICML 2022.
"""

import os

from tfbnn import training
from tfbnn._internal import files
from tfbnn.datasets.catalog import GRAYSCALE_DATASETS
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "COMPARED_METHODS", "recipes", "run_experiment", "add_arguments",
           "run", "main"]

NAME = "uncertainty_comparison"
#: Row label -> recipe method.
COMPARED_METHODS = {"deterministic": "deterministic", "MC dropout": "mc_dropout", "BbB": "bbb", "iBNN": "ibnn",
                    "deep ensemble": "ensemble"}

SETTINGS = (
    Setting("dataset", "digits", "digits: offline; mnist / fashion_mnist: tensorflow-datasets (download once)",
            choices=GRAYSCALE_DATASETS),
    Setting("hidden_units", 64), Setting("depth", 2), Setting("epochs", 60, "epochs per network"),
    Setting("members", 5), Setting("dropout_rate", 0.2),
    Setting("num_samples", 32, "Monte Carlo samples of the test predictive (per member)"), Setting("seed", 0),
    Setting("quick", False, "a smoke run: 1 epoch on 128 examples, 2 members"),
)

DESCRIPTION = (
    "Train deterministic, MC dropout, Bayes-by-Backprop, iBNN and deep-ensemble MLPs on the same data\n"
    "(tfbnn.training recipes) and write one table: accuracy, NLL, ECE, Brier score, epistemic\n"
    "uncertainty on clean vs Gaussian-shifted inputs, and the AUROC of detecting the shifted inputs by\n"
    "epistemic uncertainty (and by total entropy). CSV, JSON, markdown and a PNG."
)

_COLUMNS = ("method", "accuracy", "nll", "ece", "brier", "epistemic_clean", "epistemic_shifted",
            "auroc_epistemic", "auroc_total", "accuracy_shifted", "num_samples", "train_seconds")


def recipes(s):
    """The five :class:`tfbnn.training.Recipe` s of the table for the checked settings ``s``:
    ``{row label: recipe}``."""
    dataset, hidden_units, depth, epochs, members, dropout_rate, num_samples, seed, quick = (
        s[k] for k in ("dataset", "hidden_units", "depth", "epochs", "members", "dropout_rate", "num_samples", "seed",
                       "quick"))
    options = {"deterministic": {}, "mc_dropout": {"rate": dropout_rate},
               "bbb": {"estimator": "local_reparameterization", "prior": "normal"}, "ibnn": {"num_components": 4},
               "ensemble": {"members": members, "member_method": "deterministic"}}
    base = training.get_recipe("digits-bbb-mlp").replace(
        description="the uncertainty comparison", reference="", model_options={"hidden_units": (hidden_units,) * depth},
        dataset=dataset, epochs=epochs, eval_samples=num_samples, seed=seed,
        validation_fraction=0.0, beta=1.0, temperature_scaling=False)  # the ELBO; all data for training
    out = {}
    for label, method in COMPARED_METHODS.items():
        recipe = base.replace(name=f"{NAME}-{method}", method=method, method_options=options[method])
        if quick:
            recipe = recipe.quick(max_examples=128, max_test_examples=64, batch_size=32)
            if method == "ensemble":
                recipe = recipe.replace(method_options={**options[method], "members": min(members, 2)})
        out[label] = recipe
    return out


def _row(label, result, recipe):
    """The table row of one method: the run's metrics plus per-example detection AUROCs."""
    from tfbnn import evaluation, metrics

    x, y = training.arrays(training.load_data(recipe).test)
    t = max(1, result.test["num_samples"] // recipe.num_members)  # per member (1: deterministic members)
    e = evaluation.evaluate_classifier(result.model, x, y, num_samples=t, num_bins=recipe.ece_bins,
                                       shift_gamma=training.SHIFT_GAMMA, sweep_levels=(), seed=recipe.seed,
                                       batch_size=max(1, 2048 // result.test["num_samples"]))
    test = result.test
    return {
        "method": label, "accuracy": test["accuracy"], "nll": test["nll"], "ece": test["ece"], "brier": test["brier"],
        "epistemic_clean": test["epistemic"], "epistemic_shifted": test["shifted"]["epistemic"],
        "auroc_epistemic": metrics.auroc(e.clean.mutual_information, e.shifted.mutual_information),
        "auroc_total": metrics.auroc(e.clean.predictive_entropy, e.shifted.predictive_entropy),
        "accuracy_shifted": test["shifted"]["accuracy"], "num_samples": test["num_samples"],
        "train_seconds": round(result.train_seconds, 1),
    }


def _markdown(rows, dataset):
    header = ["method", "accuracy", "NLL", "ECE", "Brier", "epistemic clean",
              f"epistemic shifted (g={training.SHIFT_GAMMA:g})",
              "AUROC shifted by epistemic", "AUROC shifted by total", "samples"]
    lines = [f"Uncertainty comparison on {dataset} (same MLP, same data)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["method"], f"{r['accuracy']:.4f}", f"{r['nll']:.4f}", f"{r['ece']:.4f}", f"{r['brier']:.4f}",
                 f"{r['epistemic_clean']:.4f}", f"{r['epistemic_shifted']:.4f}", f"{r['auroc_epistemic']:.3f}",
                 f"{r['auroc_total']:.3f}", str(r["num_samples"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _figure(rows, dataset):
    import numpy as np
    from matplotlib.figure import Figure

    labels = [r["method"] for r in rows]
    pos = np.arange(len(rows))
    fig = Figure(figsize=(11, 4))
    left, right = fig.subplots(1, 2)
    left.bar(pos - 0.2, [r["epistemic_clean"] for r in rows], 0.4, label="clean")
    left.bar(pos + 0.2, [r["epistemic_shifted"] for r in rows], 0.4, label="shifted")
    left.set(xticks=pos, ylabel="mean mutual information (nats)", title=f"{dataset}: epistemic uncertainty")
    left.set_xticklabels(labels, rotation=20)
    left.legend()
    right.bar(pos - 0.2, [r["auroc_epistemic"] for r in rows], 0.4, label="by epistemic")
    right.bar(pos + 0.2, [r["auroc_total"] for r in rows], 0.4, label="by total entropy")
    right.axhline(0.5, color="gray", lw=1, ls="--")
    right.set(xticks=pos, ylim=(0, 1), ylabel="AUROC", title="detecting shifted inputs")
    right.set_xticklabels(labels, rotation=20)
    right.legend()
    fig.tight_layout()
    return fig


def train(s, output_dir, verbose):
    """Trains each recipe of :func:`recipes` (one :func:`tfbnn.training.run`, its folder
    ``<output_dir>/<method>``) and evaluates its row; returns the rows."""
    import keras

    _common.quiet_tensorflow()
    rows = []
    for label, recipe in recipes(s).items():
        print(f"\n== {label} ==", flush=True)
        result = training.run(recipe, output_dir=os.path.join(output_dir, recipe.method), verbose=2 if verbose else 0)
        rows.append(_row(label, result, recipe))
        keras.backend.clear_session()
    return rows


def analyse(rows, s, output_dir, verbose):
    """The table (``comparison.csv`` / ``.json`` / ``.md``) and ``comparison.png``.

    Returns:
        ``{"rows": [...one dict per method...], "markdown": str, "files": [...]}``.
    """
    from tfbnn import plots

    markdown = _markdown(rows, s["dataset"])
    written = [
        _common.write_csv(os.path.join(output_dir, "comparison.csv"), [{k: r[k] for k in _COLUMNS} for r in rows]),
        _common.write_json(os.path.join(output_dir, "comparison.json"), {"settings": s, "rows": rows}),
        files.write_text(os.path.join(output_dir, "comparison.md"), markdown),
        plots.save(_figure(rows, s["dataset"]), os.path.join(output_dir, "comparison.png")),
    ]
    print("\n" + markdown, flush=True)
    return {"rows": rows, "markdown": markdown, "files": written}


STUDY = Study(
    name="uncertainty-comparison", module="tfbnn.experiments.uncertainty_comparison", description=DESCRIPTION,
    settings=SETTINGS, recipes=lambda s: list(recipes(s).values()), train=train, analyse=analyse,
    outputs="the table, the PNG and the runs",
    banner=lambda s: f"{NAME}: deterministic, MC dropout, BbB, iBNN and a deep ensemble on {s['dataset']}",
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
