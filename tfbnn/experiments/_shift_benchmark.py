"""The numeric side of ``tfbnn shift-benchmark`` (:mod:`tfbnn.experiments.shift_benchmark`).

The methods are one table, :data:`METHODS`: name -> :class:`BenchmarkMethod` (a label and
``fit(context) -> predict``, where ``predict(x)`` returns the ``(n, K)`` predictive class
probabilities of the images ``x``, or, for a method with its own out-of-distribution score,
a pair ``(probs, score)`` with ``score`` ``(n,)``, higher for inputs less like the training
data). The study trains each asked method, predicts every evaluation set (clean, each
corruption at each severity, held-out classes, synthetic inputs and the clean calibration
split) and keeps the probabilities and scores; :func:`tables` turns them into the numbers.

Adding a method is one entry::

    def fit_mine(context):
        result = context.train("vd", {"parameterization": "multiplicative"})  # a tfbnn.methods method
        return lambda x: my_predictive(result.model, x)                        # (n, K) probabilities
    METHODS["vd_kingma"] = BenchmarkMethod("VD (Kingma)", fit_mine)

Every network trains through :func:`tfbnn.training.run` (``context.train``) as a method of the
registry (:mod:`tfbnn.methods`), the single-pass ones (SNGP, DDU, evidential, heteroscedastic)
included; a method's own epistemic score is the registry's (:attr:`tfbnn.methods.Method.epistemic`).

``context`` (:class:`Context`) holds the settings, the training arrays, a seeded
:func:`tfbnn.training.run` of the study's recipe with another method (``context.train``,
cached per method and options, so Laplace reuses the deterministic network) and the
output folder.
"""

import dataclasses
import os
import time

import keras
import numpy as np
from matplotlib.figure import Figure

import tfbnn
from tfbnn import conformal, ddu, evaluation, laplace, metrics, plots, swag, training
from tfbnn._internal import files
from tfbnn.datasets import corruptions
from tfbnn.experiments import _common
from tfbnn.experiments._posterior_study import pipeline
from tfbnn.experiments.shift_benchmark import base_recipe
from tfbnn.inference import entropy

__all__ = ["BenchmarkMethod", "Context", "METHODS", "load", "evaluation_sets", "predict_all", "normalized", "tables"]


@dataclasses.dataclass(frozen=True)
class BenchmarkMethod:
    """One row of the benchmark: its label in the tables and ``fit(context) -> predict(x) -> (n, K) probs``
    (or ``(probs, score)``; ``score`` then names the method's own OOD score in the tables)."""

    label: str
    fit: object
    score: str = ""


class Context:
    """What a method's ``fit`` gets: the settings ``s``, the in-distribution training arrays ``x, y``
    (images ``(n, h, w, c)``), ``num_classes`` (``in_classes``: the classes ``0 .. in_classes - 1``, whether
    or not a small subset holds each), the base :class:`tfbnn.training.Recipe` and :meth:`train`."""

    def __init__(self, s, x, y, recipe, output_dir):
        self.s, self.x, self.y, self.recipe, self.output_dir = s, x, y, recipe, output_dir
        self.num_classes = s["in_classes"]
        self._runs = {}

    def train(self, method, options=None, callbacks=()):
        """A :func:`tfbnn.training.run` of the study's recipe with ``method`` and ``options``; cached
        (without callbacks) per method and options."""
        options = dict(options or {})
        key = (method, tuple(sorted(options.items())))
        if key in self._runs and not callbacks:
            return self._runs[key]
        recipe = self.recipe.replace(name=f"{self.recipe.name}-{method}", method=method, method_options=options)
        data = pipeline(self.x, self.y, self.s["dataset"], recipe.batch_size, self.num_classes, self.s["seed"])
        folder = os.path.join(self.output_dir, "runs", method + ("-" + str(len(self._runs)) if callbacks else ""))
        result = training.run(recipe, output_dir=folder, verbose=0, data=data, evaluate=lambda *_: {}, quiet=True,
                              jit_compile=False, callbacks=list(callbacks), figures=False)
        if not callbacks:
            self._runs[key] = result
        return result


def _monte_carlo(model, x, num_samples, batch_size=512):
    """The mean of ``num_samples`` predictive draws (:func:`tfbnn.predict`) of ``model`` at ``x``."""
    return tfbnn.predict(model, x, num_samples=num_samples, batch_size=batch_size).mean_probs


def _trained(method, options=lambda s: {}):
    """``fit`` of a :mod:`tfbnn.methods` method trained by the study's recipe (:meth:`Context.train`): its
    Monte Carlo predictive with ``num_samples`` draws (one for a method whose predictions are not random), and
    for a method whose own epistemic score is not the mutual information (:attr:`tfbnn.methods.Method.epistemic`:
    SNGP's GP variance, DDU's ``-log q(z)`` of a feature density fitted on the training images, the evidential
    ``u = K / S``) that score (:func:`tfbnn.evaluation.epistemic_scores`)."""

    def fit(context):
        result = context.train(method, options(context.s))
        spec = tfbnn.methods.get(method)
        samples = spec.num_eval_samples(result.model, context.s["num_samples"] if spec.stochastic else 1)
        own = spec.epistemic not in ("mutual_information", "none")
        density = ddu.DDU(result.model, batch_size=512).fit(context.x, context.y) if spec.epistemic == "density" \
            else None

        def predict(x):
            prediction = tfbnn.predict(result.model, x, num_samples=samples, batch_size=512)
            if not own:
                return prediction.mean_probs
            return prediction.mean_probs, evaluation.epistemic_scores(result.model, x, spec.epistemic, prediction,
                                                                      density, batch_size=512)

        return predict

    return fit


def _bbb_options(s):
    """Bayes by Backprop as ``bbb`` and ``dvi`` train it (one cached run for both)."""
    return {"estimator": "local_reparameterization", "prior": "normal"}


def _fit_dvi(context):
    """The ``bbb`` network (the same cached run) predicted by moment propagation (:mod:`tfbnn.moments`,
    Wu et al. 2019): one deterministic pass, the probit approximation of the softmax."""
    model = context.train("bbb", _bbb_options(context.s)).model
    return lambda x: tfbnn.predict(model, x, method="moments", batch_size=512).mean_probs


def _sngp_options(s):
    """SNGP (:mod:`tfbnn.sngp`; spectrally normalized ReLU layers, a random-feature GP head with Gaussian
    precision weights and input normalization, as the single-pass guide recommends): the mean-field
    predictive; own score the GP posterior variance (Liu et al. 2020, eq. 9)."""
    return {"num_inducing": s["num_inducing"], "gp_cov_likelihood": "gaussian", "normalize_input": True}


def _evidential_options(s):
    """Evidential classification (Sensoy et al. 2018, :mod:`tfbnn.evidential`): a Dirichlet head on the MLP,
    the MSE loss (eq. 5) with the KL term annealed over min(10, epochs) epochs; predictive ``alpha / S``,
    own score ``u = K / S``."""
    return {"loss": "mse", "annealing_epochs": min(10, s["epochs"])}


def _heteroscedastic_options(s):
    """The heteroscedastic softmax of Collier et al. (2021) (:class:`tfbnn.layers.HeteroscedasticSoftmax`,
    rank-3 correlated logit noise plus a diagonal, 100 Monte Carlo samples in training, 1000 at
    inference) on the MLP."""
    return {"num_factors": 3, "train_mc_samples": 100, "test_mc_samples": 1000}


def _own_score(method):
    """The name of a registered method's own epistemic score in the tables (:data:`tfbnn.evaluation.EPISTEMIC_LABELS`)."""
    return evaluation.EPISTEMIC_LABELS[tfbnn.methods.get(method).epistemic]


def _fit_laplace(context):
    """The deterministic network's last-layer KFAC Laplace, prior precision by the marginal likelihood;
    the probit predictive (:mod:`tfbnn.laplace`)."""
    model = context.train("deterministic").model
    la = laplace.fit(model, context.x, context.y, likelihood="classification", subset="last_layer", hessian="kron")
    la = la.optimize_prior_precision(method="marglik")
    return la.predict


def _fit_swag(context):
    """SWAG (:mod:`tfbnn.swag`) over the iterates of every epoch of the second half of a deterministic run."""
    collector = swag.SWAG(start_epoch=context.recipe.epochs // 2, collect_every=1, max_rank=10)
    context.train("deterministic", callbacks=(collector,))
    posterior = collector.posterior(seed=context.s["seed"])
    return lambda x: _monte_carlo(posterior, x, context.s["num_samples"])


#: The methods: name -> :class:`BenchmarkMethod`. Add one entry to benchmark another method.
METHODS = {
    "deterministic": BenchmarkMethod("deterministic", _trained("deterministic")),
    "mc_dropout": BenchmarkMethod("MC dropout", _trained("mc_dropout", lambda s: {"rate": s["dropout_rate"]})),
    "bbb": BenchmarkMethod("BbB", _trained("bbb", _bbb_options)),
    "vd": BenchmarkMethod("VD", _trained("vd")),
    "ibnn": BenchmarkMethod("iBNN", _trained("ibnn", lambda s: {"num_components": 4})),
    "ensemble": BenchmarkMethod("deep ensemble", _trained("ensemble", lambda s: {
        "members": s["members"], "member_method": "deterministic"})),
    "laplace": BenchmarkMethod("Laplace (last layer)", _fit_laplace),
    "swag": BenchmarkMethod("SWAG", _fit_swag),
    "dvi": BenchmarkMethod("DVI (BbB, moments)", _fit_dvi),
    "sngp": BenchmarkMethod("SNGP", _trained("sngp", _sngp_options), score=_own_score("sngp")),
    "ddu": BenchmarkMethod("DDU", _trained("ddu"), score=_own_score("ddu")),
    "evidential": BenchmarkMethod("evidential", _trained("evidential", _evidential_options),
                                  score=_own_score("evidential")),
    "heteroscedastic": BenchmarkMethod("heteroscedastic", _trained("heteroscedastic", _heteroscedastic_options)),
}


# -- data -----------------------------------------------------------------------------------------


def _images(dataset, s):
    """``(x_train, y_train, x_test, y_test, num_classes)``: images in [0, 1], ``(n, h, w, c)`` (one channel, or
    three for CIFAR) (:func:`tfbnn.datasets.load_images`)."""
    limits = {} if dataset == "digits" else {"max_examples": s["max_examples"],
                                              "max_test_examples": s["max_test_examples"]}
    ds = tfbnn.datasets.load_images(dataset, seed=s["seed"], **limits)
    return ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes


def load(s):
    """The benchmark's data for the checked settings ``s``: a dict of ``x_train, y_train`` (the
    in-distribution classes ``0 .. in_classes - 1`` less the calibration split), ``x_cal, y_cal``,
    ``x_test, y_test`` (clean, in-distribution) and ``x_ood`` (the test images of the other classes)."""
    x_train, y_train, x_test, y_test, num_classes = _images(s["dataset"], s)
    k = s["in_classes"]
    if k >= num_classes:
        raise ValueError(f"Expected `in_classes` below the dataset's {num_classes} classes (the others "
                         f"are the out-of-distribution ones). Received: in_classes={k}")
    rng = np.random.default_rng(s["seed"])
    inside = np.flatnonzero(y_train < k)
    inside = rng.permutation(inside)
    if s["quick"]:
        inside = inside[:320]
    num_cal = int(round(len(inside) * s["calibration_fraction"]))
    cal, fit = inside[:num_cal], inside[num_cal:]
    test_in, test_out = np.flatnonzero(y_test < k), np.flatnonzero(y_test >= k)
    if s["quick"]:
        test_in, test_out = test_in[:48], test_out[:48]
    return {"x_train": x_train[fit], "y_train": y_train[fit], "x_cal": x_train[cal], "y_cal": y_train[cal],
            "x_test": x_test[test_in], "y_test": y_test[test_in], "x_ood": x_test[test_out]}


def evaluation_sets(data, s, verbose=False):
    """Every input set the methods predict: name -> images. ``clean``, ``calibration``,
    ``<corruption>/<severity>`` (the clean test images corrupted, :func:`tfbnn.datasets.corruptions.corrupt_images`
    seeded by ``seed``), ``ood_classes`` and ``ood_synthetic`` (as many images as the clean test set:
    half uniform noise, half constant images of uniform random level)."""
    x = data["x_test"]
    sets = {"clean": x, "calibration": data["x_cal"]}
    for name in s["corruptions"]:
        start = time.perf_counter()
        for severity in range(1, 6):
            sets[f"{name}/{severity}"] = corruptions.corrupt_images(x, name, severity, seed=s["seed"])
        if verbose:
            print(f"  corrupted the test set: {name} x 5 severities ({time.perf_counter() - start:.1f} s)", flush=True)
    rng = np.random.default_rng(s["seed"] + 1)
    half = len(x) // 2
    noise = rng.uniform(size=(half,) + x.shape[1:])
    constant = np.broadcast_to(rng.uniform(size=(len(x) - half,) + (1,) * (x.ndim - 1)), (len(x) - half,) + x.shape[1:])
    sets["ood_classes"] = data["x_ood"]
    sets["ood_synthetic"] = np.concatenate([noise, constant]).astype(np.float32)
    return sets


def predict_all(s, data, sets, output_dir, verbose=False):
    """``(predictions, scores)``: ``{method: {set name: (n, K) probabilities}}`` of every method of
    ``s["methods"]`` and ``{method: {set name: (n,) own OOD scores}}`` of those with an own score."""
    context = Context(s, data["x_train"], data["y_train"], base_recipe(s), output_dir)
    everything = np.concatenate(list(sets.values()))
    bounds = np.cumsum([0] + [len(v) for v in sets.values()])

    def split(values):
        return {key: values[a:b] for key, a, b in zip(sets, bounds[:-1], bounds[1:])}

    out, scores = {}, {}
    for i, name in enumerate(s["methods"], 1):
        start = time.perf_counter()
        keras.utils.set_random_seed(s["seed"])
        predict = METHODS[name].fit(context)
        result = predict(everything)
        if isinstance(result, tuple):
            result, score = result
            scores[name] = split(np.asarray(score, np.float64))
        out[name] = split(np.asarray(result, np.float64))
        if verbose:
            print(f"[{i}/{len(s['methods'])}] {METHODS[name].label}: trained and predicted "
                  f"{len(everything)} images in {time.perf_counter() - start:.1f} s", flush=True)
    keras.backend.clear_session()
    return out, scores


# -- the numbers ----------------------------------------------------------------------------------


def normalized(probs):
    """``probs`` renormalized in float64 to sum to 1: the conformal sets' input. APS's score of a confident right
    prediction is ``p_y``, near 1; probabilities whose float32 sum rounds a few 1e-7 off 1 would then set the
    threshold ``q_hat`` to exactly 1 and fill the sets with classes of mass ~1e-16 (coverage 1, 4 of 8 classes,
    seen with the heteroscedastic softmax's Monte Carlo averages)."""
    probs = np.asarray(probs, np.float64)
    return probs / probs.sum(axis=1, keepdims=True)


def _metrics(probs, labels, predictor, num_bins):
    sets = predictor.predict(normalized(probs))
    return {"accuracy": metrics.accuracy(probs, labels), "nll": metrics.negative_log_likelihood(probs, labels),
            "ece": metrics.expected_calibration_error(probs, labels, num_bins=num_bins),
            "coverage": conformal.coverage(labels, sets), "set_size": float(np.mean(conformal.set_sizes(sets)))}


def _mean(rows, key):
    return float(np.mean([r[key] for r in rows]))


def _own_aurocs(scores):
    """The OOD AUROCs (held-out classes; synthetic inputs) of a method's own score, or None without one."""
    if scores is None:
        return {"ood_auroc_own_classes": None, "ood_auroc_own_synthetic": None}
    return {f"ood_auroc_own_{kind}": metrics.auroc(scores["clean"], scores[f"ood_{kind}"])
            for kind in ("classes", "synthetic")}


def tables(predictions, y_test, y_cal, s, scores=None):
    """The benchmark's numbers from the stored probabilities (and own OOD scores ``scores``,
    ``{method: {set name: (n,) scores}}``, of the methods that have one).

    Returns:
        ``(table, by_corruption, by_severity)``: lists of dicts. ``by_corruption``: per method,
        corruption and severity (0: clean) accuracy, NLL, ECE, conformal coverage and mean set
        size; ``by_severity``: their means over the corruptions; ``table``: one row per method,
        clean and mean corrupted (over corruptions and severities) accuracy / NLL / ECE, the OOD
        AUROCs by predictive entropy (held-out classes; synthetic inputs), the same AUROCs by the
        method's own score (None without one: SNGP's GP variance, DDU's negative log density,
        evidential ``u = K / S``) and the coverage and set size of the conformal sets (randomized APS
        on the :func:`normalized` probabilities, calibrated on clean data) clean and corrupted, and
        ``coverage_corrupted_aci``, the long-run coverage of :func:`aci_stream_coverage`.
    """
    scores = scores or {}
    table, by_corruption, by_severity = [], [], []
    for name, sets in predictions.items():
        label = METHODS[name].label if name in METHODS else name
        predictor = conformal.ConformalClassifier(alpha=s["alpha"], score="aps").fit(normalized(sets["calibration"]),
                                                                                     y_cal)
        clean = {"method": label, "corruption": "clean", "severity": 0,
                 **_metrics(sets["clean"], y_test, predictor, s["ece_bins"])}
        rows = [{"method": label, "corruption": c, "severity": k,
                 **_metrics(sets[f"{c}/{k}"], y_test, predictor, s["ece_bins"])}
                for c in s["corruptions"] for k in range(1, 6)]
        by_corruption += [clean] + rows
        means = [{"method": label, "severity": k, **{m: _mean([r for r in rows if r["severity"] == k], m) for m in
                                                     ("accuracy", "nll", "ece", "coverage", "set_size")}}
                 for k in range(1, 6)]
        by_severity += [{"method": label, "severity": 0, **{m: clean[m] for m in means[0] if m not in ("method",
                                                                                                        "severity")}}]
        by_severity += means
        in_scores = entropy(sets["clean"])
        table.append({
            "method": label, "clean_accuracy": clean["accuracy"], "clean_nll": clean["nll"], "clean_ece": clean["ece"],
            "corrupted_accuracy": _mean(rows, "accuracy"), "corrupted_nll": _mean(rows, "nll"),
            "corrupted_ece": _mean(rows, "ece"),
            "ood_auroc_classes": metrics.auroc(in_scores, entropy(sets["ood_classes"])),
            "ood_auroc_synthetic": metrics.auroc(in_scores, entropy(sets["ood_synthetic"])),
            **_own_aurocs(scores.get(name)),
            "coverage_clean": clean["coverage"], "coverage_corrupted": _mean(rows, "coverage"),
            "set_size_clean": clean["set_size"], "set_size_corrupted": _mean(rows, "set_size"),
            "coverage_corrupted_aci": aci_stream_coverage(predictor, sets, y_test, s),
        })
    return table, by_corruption, by_severity


def aci_stream_coverage(predictor, sets, y_test, s):
    """The long-run coverage of adaptive conformal inference (Gibbs & Candes 2021, step ``s["aci_gamma"]``) started
    from ``predictor`` (split conformal, calibrated on clean data) over the corrupted test images as one stream of
    growing severity: every corruption of ``s["corruptions"]`` at severity 1, then all at 2, ..., 5 (each image's
    label revealed after its set). Split conformal's coverage of the same stream is the mean ``coverage_corrupted``
    (equal parts)."""
    order = [f"{c}/{k}" for k in range(1, 6) for c in s["corruptions"]]
    aci = conformal.AdaptiveConformal(predictor, gamma=s.get("aci_gamma", 0.005))
    aci.run(normalized(np.concatenate([sets[key] for key in order])), np.tile(y_test, len(order)))
    return 1.0 - float(np.mean(aci.errors))


_HEADER = ("method", "clean acc", "clean NLL", "clean ECE", "corrupted acc", "corrupted NLL", "corrupted ECE",
           "OOD AUROC (classes)", "OOD AUROC (synthetic)", "own-score OOD AUROC (classes)",
           "own-score OOD AUROC (synthetic)", "coverage clean", "coverage corrupted", "coverage corrupted (ACI)")


def _cell(value):
    return "-" if value is None else f"{value:.3f}"


def markdown(table, s):
    """The table in the uncertainty-baselines layout, as Markdown; the own scores named below it."""
    lines = [f"Shift benchmark on {s['dataset']} (classes 0-{s['in_classes'] - 1} in distribution; "
             f"{len(s['corruptions'])} corruptions x 5 severities; conformal sets at 1 - alpha = {1 - s['alpha']:g})",
             "", "| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    keys = ("clean_accuracy", "clean_nll", "clean_ece", "corrupted_accuracy", "corrupted_nll", "corrupted_ece",
            "ood_auroc_classes", "ood_auroc_synthetic", "ood_auroc_own_classes", "ood_auroc_own_synthetic",
            "coverage_clean", "coverage_corrupted", "coverage_corrupted_aci")
    for r in table:
        lines.append("| " + " | ".join([r["method"]] + [_cell(r[k]) for k in keys]) + " |")
    own = [f"{m.label}: {m.score}" for m in METHODS.values() if m.score and m.label in [r["method"] for r in table]]
    if own:
        lines += ["", "OOD AUROCs by predictive entropy; own scores: " + "; ".join(own) + "."]
    return "\n".join(lines) + "\n"


def severity_figure(by_severity, metric, ylabel, dataset):
    """``metric`` against the severity (0: clean; 1-5: mean over the corruptions), one line per method."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for label in dict.fromkeys(r["method"] for r in by_severity):
        rows = [r for r in by_severity if r["method"] == label]
        ax.plot([r["severity"] for r in rows], [r[metric] for r in rows], marker="o", label=label)
    ax.set(xlabel="corruption severity (0: clean)", ylabel=ylabel, title=f"{dataset}: {ylabel} under shift",
           xticks=range(6))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write(predictions, y_test, y_cal, s, output_dir, scores=None):
    """Writes the tables, the plots, the probabilities (``<method>|<set>``) and the own scores
    (``score|<method>|<set>``); returns ``(table, markdown, files)``."""
    table, by_corruption, by_severity = tables(predictions, y_test, y_cal, s, scores)
    text = markdown(table, s)
    arrays = {f"{m}|{key}": p.astype(np.float32) for m, sets in predictions.items() for key, p in sets.items()}
    arrays.update({f"score|{m}|{key}": v for m, sets in (scores or {}).items() for key, v in sets.items()})
    path = os.path.join(output_dir, "predictions.npz")
    np.savez_compressed(path, y_test=y_test, y_cal=y_cal, **arrays)
    written = [
        _common.write_csv(os.path.join(output_dir, "table.csv"), table),
        _common.write_json(os.path.join(output_dir, "table.json"), {
            "settings": _common.jsonable(s), "table": table, "by_corruption": by_corruption,
            "by_severity": by_severity}),
        _common.write_csv(os.path.join(output_dir, "by_corruption.csv"), by_corruption),
        _common.write_csv(os.path.join(output_dir, "by_severity.csv"), by_severity),
        files.write_text(os.path.join(output_dir, "table.md"), text),
        plots.save(severity_figure(by_severity, "accuracy", "accuracy", s["dataset"]),
                   os.path.join(output_dir, "accuracy_vs_severity.png")),
        plots.save(severity_figure(by_severity, "ece", "ECE", s["dataset"]),
                   os.path.join(output_dir, "ece_vs_severity.png")),
        path,
    ]
    return table, text, written
