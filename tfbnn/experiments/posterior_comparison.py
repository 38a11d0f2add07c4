"""Posterior comparison: fifteen approximate posteriors of one small MLP against an HMC reference.

The comparison the VI thesis left open (issue 22, item 4). Every method fits the same MLP
(``--hidden-units`` x ``--depth`` ReLU units) on the same data, and its predictive on the
test inputs is scored and compared with the predictive of Hamiltonian Monte Carlo over
all weights (the asymptotically exact posterior under the same N(0, ``prior_scale``^2)
prior and Gaussian noise):

==========================  ==========================================================
method                      what (reference)
==========================  ==========================================================
``map``                     the deterministic network, one weight vector (MAP)
``mc_dropout``              dropout kept on at test time (Gal & Ghahramani 2016)
``bbb_reparameterization``  Bayes by Backprop, mean-field Gaussian, one weight sample
                            per step (Blundell et al. 2015)
``bbb_flipout``             the same posterior, Flipout estimator (Wen et al. 2018)
``bbb_local_reparameterization``  the same posterior, local reparameterization (Kingma
                            et al. 2015)
``vd``                      sparse variational dropout (Molchanov et al. 2017)
``ibnn``                    node-based BNN, K = 4 mixture components (Trinh et al. 2022)
``ensemble``                deep ensemble of ``--members`` MAP networks
                            (Lakshminarayanan et al. 2017)
``laplace_last_layer``      post-hoc Laplace on the MAP network's last layer, KFAC,
                            prior precision by the marginal likelihood (Daxberger et
                            al. 2021), GLM predictive
``laplace_diag``            post-hoc Laplace over all weights, diagonal GGN, the same
``laplace_kfac``            post-hoc Laplace over all weights, KFAC per layer (Ritter et
                            al. 2018), the same
``laplace_subnetwork``      post-hoc Laplace, full covariance over the
                            ``subnetwork_size`` weights of largest diagonal-Laplace
                            variance (Daxberger et al. 2021), the same
``swag``                    SWAG, low rank plus diagonal Gaussian from the iterates of
                            the MAP recipe's second half (Maddox et al. 2019, who use
                            SGD; here Adam, the optimizer of every method)
``csgmcmc``                 cyclical SG-MCMC (Zhang et al. 2020): SGHMC with momentum
                            0.9 on a cyclical cosine step size from
                            ``csgmcmc_learning_rate`` (3e-3), ``csgmcmc_cycles`` (10)
                            cycles whose last ``1 - csgmcmc_exploration`` (20%)
                            samples, ``csgmcmc_samples`` (5) kept per cycle; the same
                            prior, steps and minibatches as the other methods
``hmc``                     the reference: NUTS over all weights, 4 chains of 500 draws
                            after 500 adaptation steps, trees up to depth 10; R-hat of
                            the weights and of the predictive outputs, and ESS reported
==========================  ==========================================================

Data (all offline): ``gap``, the 1-D regression of Foong et al. (2019) with inputs in two
clusters and a gap between them (the test inputs include the gap), with each method's
predictive band plotted beside HMC's; ``diabetes`` (scikit-learn, 442 patients, 10
features, standardized target, regression); ``breast_cancer`` (scikit-learn, 569 tumours,
30 features, 2 classes). Regression uses a Gaussian likelihood with a fixed noise std
(``noise_std`` for the gap data, ``tabular_noise_std`` for diabetes), the same for every
method (Laplace's noise is not tuned, only its prior precision).

Columns: test NLL; RMSE (regression) or accuracy; ECE (classification: 10 confidence
bins; regression: the mean |coverage - level| of the central intervals at levels 0.1 ...
0.9); the coverage of the central 50% and 90% intervals; the predictive std in the gap
and in the clusters (``gap``); the distance to HMC's predictive (regression: the
2-Wasserstein distance between moment-matched Gaussians, averaged over test points;
classification: ``KL(p_HMC || p)`` and the agreement of the predicted class); wall time
in seconds (Laplace: the MAP training plus the fit).

What the papers report: Foong et al. (2019) prove and show that mean-field Gaussian VI
(and MC dropout) of a one-hidden-layer network cannot widen its predictive between two
clusters of data, where HMC (and the linearized Laplace) do; Maddox et al. (2019) report
SWAG close to HMC-like calibration on regression and classification benchmarks;
Daxberger et al. (2021, Laplace Redux) report that last-layer Laplace with the GLM
predictive and marginal-likelihood prior tuning is competitive with deep ensembles in
NLL and calibration at a fraction of the cost. ``docs/guides/posterior-comparison.md``
gives the numbers of this run beside them.

Outputs (``--output-dir``, default ``saved_models/experiments/posterior_comparison/``):
``results.csv`` / ``results.json`` (one row per dataset and method, with the settings),
``comparison.md`` (the tables), ``gap_bands.png``, and under ``<dataset>/runs/<method>/``
each trained method's :func:`tfbnn.training.run` folder (recipe.json, history,
learning curves, results.json, model.keras).

Run: ``tfbnn posterior-comparison`` (or ``tfbnn run posterior-comparison``, or
``python -m tfbnn.experiments.posterior_comparison``); ``--quick`` is the test suite's
smoke run (seconds).

References:
    Foong, Li, Hernandez-Lobato, Turner. 'In-Between' Uncertainty in Bayesian Neural
    Networks. ICML 2019 Workshop on Uncertainty and Robustness in Deep Learning.
    Maddox, Garipov, Izmailov, Vetrov, Wilson. A Simple Baseline for Bayesian
    Uncertainty in Deep Learning. NeurIPS 2019.
    Daxberger, Kristiadi, Immer, Eschenhagen, Bauer, Hennig. Laplace Redux --
    Effortless Bayesian Deep Learning. NeurIPS 2021.
    Neal. MCMC using Hamiltonian dynamics. Handbook of MCMC, 2011.
"""

import os

from tfbnn import training
from tfbnn._internal import files
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "METHODS", "DATASETS", "recipes", "run_experiment", "add_arguments", "run", "main"]

NAME = "posterior_comparison"

#: Method -> table label, in the table's order.
METHODS = {
    "hmc": "HMC (reference)",
    "map": "MAP",
    "mc_dropout": "MC dropout",
    "bbb_reparameterization": "BbB (reparameterization)",
    "bbb_flipout": "BbB (Flipout)",
    "bbb_local_reparameterization": "BbB (local reparameterization)",
    "vd": "variational dropout",
    "ibnn": "iBNN",
    "ensemble": "deep ensemble",
    "laplace_last_layer": "Laplace (last layer, KFAC)",
    "laplace_diag": "Laplace (all weights, diagonal)",
    "laplace_kfac": "Laplace (all weights, KFAC)",
    "laplace_subnetwork": "Laplace (subnetwork, full)",
    "swag": "SWAG",
    "csgmcmc": "cyclical SG-MCMC",
}
DATASETS = ("gap", "diabetes", "breast_cancer")

SETTINGS = (
    Setting("datasets", DATASETS, f"datasets, from {', '.join(DATASETS)}", choices=DATASETS, many=True, unique=True,
            metavar="NAME"),
    Setting("methods", tuple(METHODS), f"methods, from {', '.join(METHODS)}", choices=tuple(METHODS), many=True,
            unique=True, metavar="M"),
    Setting("hidden_units", 32), Setting("depth", 2), Setting("num_points", 40, "points of the 1-D gap data"),
    Setting("noise_std", 0.1, "noise std of the gap data and its Gaussian likelihood"),
    Setting("tabular_noise_std", 0.7, "noise std of the Gaussian likelihood on diabetes (standardized targets)",
            recipe="noise_std"),
    Setting("prior_scale", 1.0, "std of the N(0, s^2) weight prior (BbB, Laplace, HMC)", kind="positive_float"),
    Setting("gap_steps", 1000, "full-batch steps on the 1-D gap data", kind="positive_int"),
    Setting("epochs", 60, "epochs on the tabular data"), Setting("batch_size", 32), Setting("learning_rate", 3e-3),
    Setting("dropout_rate", 0.1), Setting("members", 5, "deep ensemble size"), Setting("num_samples", 100),
    Setting("swag_rank", 10, "SWAG: rank of the covariance's low-rank part", kind="positive_int"),
    Setting("subnetwork_size", 500, "subnetwork Laplace: the weights of largest diagonal-Laplace variance",
            kind="positive_int"),
    Setting("csgmcmc_learning_rate", 3e-3, "cyclical SG-MCMC: the initial step size of each cycle (on the mean loss)",
            kind="positive_float"),
    Setting("csgmcmc_cycles", 10, "cyclical SG-MCMC: cycles", kind="positive_int"),
    Setting("csgmcmc_samples", 5, "cyclical SG-MCMC: samples kept at the end of each cycle", kind="positive_int"),
    Setting("csgmcmc_exploration", 0.8, "cyclical SG-MCMC: the fraction of each cycle without noise (the paper's 0.8)",
            kind="rate"),
    Setting("hmc_chains", 4, "HMC chains", kind="positive_int"),
    Setting("hmc_results", 500, "HMC samples kept per chain", kind="positive_int"),
    Setting("hmc_burnin", 500, "HMC burn-in (step-size adaptation) steps per chain", kind="non_negative_int"),
    Setting("hmc_tree_depth", 10, "NUTS's largest tree depth (up to 2^depth - 1 leapfrog steps per draw)",
            kind="positive_int"),
    Setting("hmc_step_size", 1e-3, "HMC's initial step size", kind="positive_float"),
    Setting("seed", 0),
    Setting("quick", False, "a smoke run: 3 epochs, 120 tabular examples, 8 samples, short HMC chains"),
)

DESCRIPTION = (
    "MAP, MC dropout, Bayes by Backprop (reparameterization, Flipout, local reparameterization),\n"
    "variational dropout, iBNN, a deep ensemble, Laplace (last layer, diagonal, KFAC, subnetwork),\n"
    "SWAG and cyclical SG-MCMC against an HMC reference, on the 1-D 'in-between' regression of\n"
    "Foong et al. 2019 and two scikit-learn datasets (diabetes, breast cancer): test NLL, RMSE /\n"
    "accuracy, ECE, interval coverage, distance to HMC's predictive, run time. CSV, JSON, markdown\n"
    "and the predictive bands (PNG)."
)


#: Full-batch steps per (logged) epoch on the gap data.
_GAP_STEPS_PER_EPOCH = 20


def _trained_options(s):
    normal = {"prior": {"class_name": "Normal", "config": {"loc": 0.0, "scale": s["prior_scale"]}}}
    return {
        "map": ("deterministic", {}),
        "mc_dropout": ("mc_dropout", {"rate": s["dropout_rate"]}),
        **{f"bbb_{e}": ("bbb", {"estimator": e, **normal})
           for e in ("reparameterization", "flipout", "local_reparameterization")},
        "vd": ("vd", {}),
        "ibnn": ("ibnn", {"num_components": 4}),
        "ensemble": ("ensemble", {"members": s["members"], "member_method": "deterministic"}),
        "swag": ("deterministic", {}),
        "csgmcmc": ("csgmcmc", {"cycles": s["csgmcmc_cycles"], "samples_per_cycle": s["csgmcmc_samples"],
                                "exploration": s["csgmcmc_exploration"],
                                "prior_precision": 1.0 / s["prior_scale"] ** 2}),
    }


def recipes(dataset, s):
    """``{method: Recipe}`` of the trained methods on ``dataset`` (``map`` first: Laplace uses it).

    The same MLP for all; Adam; the gap data full-batch (``gap_steps`` steps, learning
    rate 1e-2), the tabular data in minibatches of ``batch_size`` for ``epochs`` epochs;
    the KL weight ramps linearly to the ELBO's ``beta = 1`` over the first half; SWAG
    is the MAP recipe with the SWAG callback collecting the iterates of every epoch of
    the second half (Adam at a constant rate, not the paper's SGD: one optimizer for all).
    """
    regression = dataset != "breast_cancer"
    gap = dataset == "gap"
    quick = s["quick"]
    epochs = (-(-s["gap_steps"] // _GAP_STEPS_PER_EPOCH) if gap else s["epochs"]) if not quick else 3
    base = training.Recipe(
        name=f"posterior-comparison-{dataset}", description=f"the posterior comparison on {dataset}",
        reference="issue 22 item 4", model="mlp",
        model_options={"hidden_units": (s["hidden_units"],) * s["depth"], **({"outputs": 1} if regression else {}),
                       "seed": s["seed"]},
        dataset=dataset, optimizer="adam", learning_rate=1e-2 if gap else s["learning_rate"], epochs=epochs,
        batch_size=s["num_points"] if gap else s["batch_size"], kl_schedule="linear",
        steps_per_epoch=_GAP_STEPS_PER_EPOCH if gap and not quick else None,
        likelihood="gaussian" if regression else "categorical",
        noise_std=(s["noise_std"] if gap else s["tabular_noise_std"]) if regression else None,
        eval_samples=s["num_samples"], seed=s["seed"])
    out = {}
    for method, (recipe_method, options) in _trained_options(s).items():
        changes = {}
        if quick and method == "ensemble":
            options = {**options, "members": min(2, s["members"])}
        if method == "csgmcmc":  # its own step size: SGHMC's noise and momentum, not Adam's normalized steps
            changes["learning_rate"] = s["csgmcmc_learning_rate"]
            if quick:  # a few steps: one cycle, every step sampling, two samples kept
                options = {**options, "cycles": 1, "samples_per_cycle": 2, "exploration": 0.0}
        r = base.replace(name=f"{base.name}-{method}", method=recipe_method, method_options=options, **changes)
        out[method] = r
    return out


def _validate(s):
    """A ``quick`` run's caps on the samples, the chains and the ensemble."""
    if s["quick"]:
        s.update(num_samples=min(s["num_samples"], 8), hmc_results=min(s["hmc_results"], 20),
                 hmc_burnin=min(s["hmc_burnin"], 20), hmc_chains=min(s["hmc_chains"], 2),
                 members=min(s["members"], 2))
    return s


def all_recipes(s):
    """Every recipe the study trains for the checked settings ``s``: :func:`recipes` of each dataset."""
    return [r for dataset in s["datasets"] for r in recipes(dataset, s).values()]


_COLUMNS = {
    "regression": (("label", "method"), ("nll", "NLL"), ("rmse", "RMSE"), ("ece", "interval ECE"),
                   ("coverage_50", "50% cover"), ("coverage_90", "90% cover"), ("std_gap", "sd gap"),
                   ("std_clusters", "sd clusters"), ("w2_to_hmc", "W2 to HMC"), ("seconds", "seconds")),
    "classification": (("label", "method"), ("nll", "NLL"), ("accuracy", "accuracy"), ("ece", "ECE"),
                       ("kl_to_hmc", "KL(HMC, p)"), ("agreement_with_hmc", "agrees with HMC"),
                       ("seconds", "seconds")),
}


def train(s, output_dir, verbose):
    """Runs every method on every dataset (:func:`tfbnn.experiments._posterior_study.run_dataset`: one
    :func:`tfbnn.training.run` per recipe of :func:`recipes` under ``<dataset>/runs/<method>/``, then
    Laplace, SWAG and HMC); returns ``{dataset: (rows, the bands PNG or None)}``.

    Raises:
        RunError: a method that is not in this build (SWAG or HMC pending), or a failed run.
    """
    _common.quiet_tensorflow()
    from tfbnn.experiments import _posterior_study as study

    return {dataset: study.run_dataset(dataset, s, recipes(dataset, s), output_dir, verbose)
            for dataset in s["datasets"]}


def analyse(trained, s, output_dir, verbose):
    """The tables (``results.csv`` / ``.json``, ``comparison.md``), rows in :data:`METHODS`' order.

    Returns:
        ``{"rows": [...], "markdown": str, "files": [...], "settings": {...}}``.
    """
    from tfbnn.experiments import _posterior_study as study

    rows, written, tables = [], [], []
    for dataset, (got, plot) in trained.items():
        for r in got:
            r["label"] = METHODS[r["method"]]
        got.sort(key=lambda r: list(METHODS).index(r["method"]))
        rows += got
        written += [plot] if plot else []
        kind = "classification" if dataset == "breast_cancer" else "regression"
        tables.append(study.markdown(dataset, got, _COLUMNS[kind]))
    text = "\n".join(tables)
    written += [*_common.write_results(output_dir, rows, s),
                files.write_text(os.path.join(output_dir, "comparison.md"), text)]
    if verbose:
        print("\n" + text, flush=True)
    return {"rows": rows, "markdown": text, "files": written, "settings": _common.jsonable(s)}


STUDY = Study(
    name="posterior-comparison", module="tfbnn.experiments.posterior_comparison", description=DESCRIPTION,
    settings=SETTINGS, recipes=all_recipes, train=train, analyse=analyse,
    outputs="the tables, the plots and the runs", validate=_validate,
    banner=lambda s: f"{NAME}: {', '.join(s['methods'])} on {', '.join(s['datasets'])}",
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
