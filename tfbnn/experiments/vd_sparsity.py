"""The sparsity study: pre-train, convert, anneal the KL, prune by the posterior vs at random.

Reproduces the VariationalMLP study of sparse variational dropout (Molchanov et al.
2017) and Graves' variational dense layers (Graves 2011) on LeNet-300-100:

1. pre-train the deterministic MLP (``keras.layers.Dense``) for ``pretrain_epochs``;
2. convert it (:func:`tfbnn.convert.to_bayesian`): posterior means = the trained
   weights, small initial scales (``init_scale``, MOPED ``sigma = delta |w|`` by default);
3. train the Bayesian net on ``mean NLL + beta KL / N`` with ``beta`` held at 0 for
   ``warmup_epochs`` and then annealed linearly to ``kl_beta`` over ``anneal_epochs``
   (:class:`tfbnn.KLAnnealing` with :class:`tfbnn.schedules.WarmUp`), logging the
   per-layer sparsity each epoch (:class:`tfbnn.callbacks.SparsityMonitor`);
4. report the per-layer sparsity of the principled masks (``log alpha > 3`` for
   variational dropout, ``|mu| / sigma < 0.83`` for Graves; ``threshold`` overrides);
5. measure Monte Carlo accuracy (``tfbnn.predict``, T samples) for no pruning,
   principled pruning and random pruning at the same per-layer sparsity, for T in
   ``sample_counts``, each repeated ``repeats`` times (fresh MC noise, and a fresh
   random mask for random pruning): mean and standard deviation;
6. sweep the pruning threshold: sparsity, accuracy (principled and random) and the
   stored size of the pruned model (:func:`tfbnn.pruning.export_sparse`, a sparse
   ``.npz``; :func:`tfbnn.pruning.save_compressed`, a deflated ``.keras``);
7. prune fixed fractions of the weights, lowest signal-to-noise first (``fractions``,
   default Blundell et al. 2015's 0, 50, 75, 95, 98%; ``fraction_scope`` global or per
   layer; :func:`tfbnn.pruning.pruning_curve`), against random pruning at each fraction.

Outputs (``output_dir``, default ``saved_models/experiments/vd_sparsity/<dataset>_<method>/``):
``study.png`` (accuracy vs T with error bars; sparsity per epoch per layer; accuracy
and stored size vs sparsity), ``accuracy_vs_samples.csv``, ``sparsity_per_epoch.csv``,
``sparsity.csv``, ``threshold_sweep.csv``, ``storage.csv``, ``pruning_curve.csv`` /
``.json`` / ``.png``, ``results.json`` and the pruned model ``pruned.npz``.

Datasets: ``digits`` (default, offline, 8x8 inputs: LeNet-300-100 is 64-300-100-10),
``moons`` (offline, 2-D), ``mnist`` and ``fashion_mnist`` (tensorflow-datasets,
downloaded on first use; 784-300-100-10 as in the paper).

Run: ``python -m tfbnn.experiments.vd_sparsity --method vd`` (about a minute on 2 CPU
cores with the defaults) or, once registered, ``tfbnn vd-sparsity --method graves``.

One route to the Molchanov study: the training is always :func:`tfbnn.training.run` of a
recipe (steps 1-3: :func:`make_recipe` from the settings, or ``recipe=`` /
``--recipe vd-lenet300-100-pretrained``, the published protocol of
:mod:`tfbnn.training.recipes`, exactly the run of ``tfbnn run vd-lenet300-100-pretrained``);
this study is the analysis on top of that run (steps 4-7), written beside the run's own folder
(``<output_dir>/run/``: recipe, history, learning curves, results, model).
"""

import math
import os

import tfbnn
from tfbnn import datasets, training
from tfbnn._internal import argtypes
from tfbnn._internal.errors import RunError
from tfbnn.datasets.catalog import ARRAY_DATASETS
from tfbnn.experiments import _common

__all__ = [
    "DEFAULTS",
    "MODELS",
    "SPARSIFYING_METHODS",
    "DATASETS",
    "make_recipe",
    "build_model",
    "mc_accuracy",
    "run_experiment",
    "add_arguments",
    "run",
    "main",
]

NAME = "vd_sparsity"
MODELS = {"lenet300_100": (300, 100), "mlp": None}
SPARSIFYING_METHODS = ("vd", "vd_multiplicative", "graves")
METHOD_LABELS = {"vd": "sparse VD (Molchanov)", "vd_multiplicative": "Gaussian VD (Kingma)", "graves": "Graves"}
DATASETS = ARRAY_DATASETS
VARIANTS = ("none", "principled", "random")
_SWEEP = {"log_alpha": (-4.0, -2.0, 0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
          "snr": (0.1, 0.25, 0.5, 0.83, 1.0, 1.5, 2.0, 3.0, 5.0)}

DEFAULTS = {
    "model": "lenet300_100",
    "hidden_units": (300, 100),
    "method": "vd",
    "dataset": "digits",
    "max_examples": None,
    "pretrain_epochs": 10,
    "epochs": 30,
    "warmup_epochs": 2.0,
    "anneal_epochs": 13.0,
    "kl_beta": 1.0,
    "batch_size": 64,
    "learning_rate": 1e-3,
    "init_scale": "moped",
    "moped_delta": 0.1,
    "threshold": None,
    "num_samples": 10,
    "sample_counts": (1, 2, 5, 10, 20, 50),
    "repeats": 5,
    "sweep": True,
    "fractions": (0.0, 0.5, 0.75, 0.95, 0.98),  # tfbnn.pruning.BLUNDELL_FRACTIONS
    "fraction_scope": "global",
    "seed": 0,
    "recipe": None,
}

DESCRIPTION = (
    "Sparsity study of variational dropout / Graves layers (Molchanov et al. 2017; Graves 2011) on\n"
    "LeNet-300-100: pre-train the deterministic MLP, convert it to the Bayesian variant\n"
    "(tfbnn.convert), warm up and anneal the KL, report per-layer sparsity (log alpha > 3 or\n"
    "|mu|/sigma < 0.83), then Monte Carlo accuracy with no / principled / random pruning and\n"
    "accuracy against the number of MC samples with error bars over repeats, a threshold sweep\n"
    "with the stored size of the pruned model, and accuracy after pruning fixed fractions of the\n"
    "weights (Blundell et al. 2015: 50-98%) against random pruning. Writes study.png and\n"
    "pruning_curve.png next to CSV and JSON files.\n"
    "The default dataset (digits) is offline; mnist and fashion_mnist download via tfds."
)


# -- building blocks -------------------------------------------------------------------------
def build_model(input_shape, num_classes, hidden_units=(300, 100), name="lenet300_100"):
    """The deterministic zoo MLP ``input -> hidden_units (ReLU) -> num_classes (softmax)``
    (:func:`tfbnn.models.mlp`; layers ``dense_1, dense_2, ..., predictions``)."""
    from tfbnn import models

    return models.mlp("deterministic", hidden_units=tuple(hidden_units), num_classes=num_classes,
                      input_shape=tuple(input_shape), name=name)

def mc_accuracy(model, x, y, num_samples, masks=None, batch_size=512):
    """Accuracy of the Monte Carlo predictive (``tfbnn.predict`` with T samples), pruned by ``masks`` if given."""
    import numpy as np

    from tfbnn import pruning

    def accuracy():
        res = tfbnn.predict(model, x, num_samples=num_samples, batch_size=batch_size, task="classification")
        return float(np.mean(res.predicted_class == y))

    if masks is None:
        return accuracy()
    with pruning.pruned(model, masks):
        return accuracy()


def _criterion(method):
    return "snr" if method == "graves" else "log_alpha"


def _load(s):
    kwargs = {}
    if s["dataset"] in datasets.OFFLINE_DATASETS:
        kwargs["seed"] = s["seed"]
        if s["dataset"] == "moons":
            kwargs["num_examples"] = s["max_examples"] or 2000
            kwargs["noise"] = 0.2
        elif s["max_examples"] is not None:
            raise ValueError("`max_examples` applies to moons, mnist and fashion_mnist. "
                             f"Received: max_examples={s['max_examples']}")
    elif s["max_examples"] is not None:
        kwargs["max_examples"] = s["max_examples"]
    try:
        return datasets.load(s["dataset"], **kwargs)
    except RuntimeError as e:
        raise RunError(str(e)) from None


def _check_settings(s):
    from tfbnn._internal import checks

    if s["model"] not in MODELS:
        raise ValueError(f"Expected `model` in {list(MODELS)}. Received: model={s['model']!r}")
    if s["method"] not in SPARSIFYING_METHODS:
        raise ValueError(f"Unknown method. Expected one of {list(SPARSIFYING_METHODS)}. "
                         f"Received: method={s['method']!r}")
    if s["dataset"] not in DATASETS:
        raise ValueError(f"Expected `dataset` in {list(DATASETS)}. Received: dataset={s['dataset']!r}")
    _common.check_integers(s, ("pretrain_epochs",), minimum=0)
    _common.check_integers(s, ("epochs", "batch_size", "num_samples", "repeats"))
    _common.check_positive_numbers(s, ("learning_rate", "anneal_epochs", "kl_beta"))
    v = s["warmup_epochs"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
        raise ValueError(f"Expected `warmup_epochs` to be a non-negative number. Received: warmup_epochs={v!r}")
    _common.check_integer_lists(s, ("sample_counts", "hidden_units"))
    for f in s["fractions"]:
        checks.number("fractions", f, low=0, high=1, high_open=True)
    if s["fraction_scope"] not in ("global", "layer"):
        raise ValueError("Expected `fraction_scope` in ('global', 'layer'). "
                         f"Received: fraction_scope={s['fraction_scope']!r}")
    if s["threshold"] is not None:
        from tfbnn import pruning

        pruning.check_threshold(_criterion(s["method"]), s["threshold"])
    from tfbnn import convert

    convert.check_init_scale(s["init_scale"], s["moped_delta"])


# -- the study -----------------------------------------------------------------------------------
def make_recipe(input_shape=(64,), **settings):
    """The :class:`tfbnn.training.Recipe` the study trains and then analyses.

    The settings (:data:`DEFAULTS`, overridden by ``settings``) become recipe fields: the
    deterministic zoo MLP with ``hidden_units`` (unseeded: Keras' global seed initializes it)
    pre-trained ``pretrain_epochs``, then converted (:func:`tfbnn.convert.to_bayesian`:
    ``init_scale``, ``moped_delta``) to ``method`` (``vd_multiplicative``: ``vd`` with
    ``parameterization="multiplicative"``), trained ``epochs`` with the KL weight 0 for
    ``warmup_epochs`` and then linear to ``kl_beta`` over ``anneal_epochs``; Adam at
    ``learning_rate`` in both phases, ``batch_size``, ``num_samples`` test samples. With
    ``pretrain_epochs=0`` the Bayesian MLP is the zoo's, from its own initialization (there is
    nothing to convert).
    """
    s = _settings(settings)
    method, options = s["method"], {"init_scale": s["init_scale"], "moped_delta": s["moped_delta"]}
    if method == "vd_multiplicative":
        method, options = "vd", {**options, "parameterization": "multiplicative"}
    return training.Recipe(
        name=f"{s['dataset']}_{s['method']}", description=f"{METHOD_LABELS[s['method']]} on {s['model']}",
        reference="Molchanov et al. 2017; Graves 2011", model="mlp",
        model_options={"hidden_units": s["hidden_units"], "seed": None}, method=method, method_options=options,
        dataset=s["dataset"], max_examples=s["max_examples"], pretrain_epochs=s["pretrain_epochs"],
        epochs=s["epochs"], batch_size=s["batch_size"], learning_rate=s["learning_rate"],
        kl_schedule="warmup" if s["warmup_epochs"] else "linear", warmup_epochs=s["warmup_epochs"],
        kl_epochs=s["anneal_epochs"], beta=s["kl_beta"], eval_samples=s["num_samples"], seed=s["seed"],
    )


def _deterministic_accuracy(det, ds):
    """Test accuracy of the pre-trained deterministic net."""
    det.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    return float(det.evaluate(ds.x_test, ds.y_test, batch_size=512, verbose=0)[1])


def _settings(settings):
    """:data:`DEFAULTS` with ``settings`` (checked)."""
    s = _common.settings(DEFAULTS, settings)
    if s["model"] == "lenet300_100":
        if tuple(s["hidden_units"]) != MODELS["lenet300_100"]:
            raise ValueError(
                "LeNet-300-100 has hidden layers (300, 100); use model='mlp' for other sizes. "
                f"Received: hidden_units={s['hidden_units']!r}"
            )
    s["hidden_units"], s["sample_counts"] = tuple(s["hidden_units"]), tuple(s["sample_counts"])
    s["fractions"] = tuple(s["fractions"])
    if s["num_samples"] not in s["sample_counts"]:
        s["sample_counts"] = tuple(sorted(set(s["sample_counts"]) | {s["num_samples"]}))
    _check_settings(s)
    return s


def _settings_of(recipe, s):
    """The study's settings that describe ``recipe`` (its method, dataset and protocol)."""
    if recipe.method not in ("vd", "graves") or recipe.dataset not in DATASETS:
        raise ValueError(f"Expected a 'vd' or 'graves' recipe on one of {list(DATASETS)}. "
                         f"Received: recipe={recipe.name!r} (method={recipe.method!r}, dataset={recipe.dataset!r})")
    multiplicative = recipe.method_options.get("parameterization") == "multiplicative"
    hidden = recipe.model_options.get("hidden_units", MODELS.get(recipe.model.replace("lenet_", "lenet"), None))
    return {**s, "recipe": recipe.name, "model": recipe.model, "hidden_units": tuple(hidden or s["hidden_units"]),
            "method": "vd_multiplicative" if multiplicative else recipe.method, "dataset": recipe.dataset,
            "max_examples": recipe.max_examples, "pretrain_epochs": recipe.pretrain_epochs, "epochs": recipe.epochs,
            "warmup_epochs": recipe.warmup_epochs, "anneal_epochs": recipe.ramp_epochs, "kl_beta": recipe.beta,
            "batch_size": recipe.batch_size, "learning_rate": recipe.learning_rate, "seed": recipe.seed}


def _per_epoch_rows(history):
    """The sparsity per epoch from a run's history rows."""
    rows = []
    for h in history:
        row = {"epoch": h["epoch"], "kl_beta": h["kl_beta"], "loss": h["loss"], "train_accuracy": h["accuracy"],
               "sparsity": h["sparsity"]}
        row.update({k.split("/", 1)[1]: v for k, v in h.items() if k.startswith("sparsity/")})
        rows.append(row)
    return rows


def _accuracy_vs_samples(s, model, ds, masks):
    from tfbnn import pruning

    rows = []
    for t in s["sample_counts"]:
        for r in range(s["repeats"]):
            for variant in VARIANTS:
                if variant == "none":
                    m = None
                elif variant == "principled":
                    m = masks
                else:
                    m = pruning.random_masks(masks, seed=s["seed"] * 1000 + r)
                rows.append({"variant": variant, "num_samples": t, "repeat": r,
                             "accuracy": mc_accuracy(model, ds.x_test, ds.y_test, t, m)})
    return rows


def _summarise(rows):
    import numpy as np

    summary = []
    for variant in VARIANTS:
        for t in sorted({r["num_samples"] for r in rows}):
            acc = [r["accuracy"] for r in rows if r["variant"] == variant and r["num_samples"] == t]
            summary.append({"variant": variant, "num_samples": t, "mean": float(np.mean(acc)),
                            "std": float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0, "repeats": len(acc)})
    return summary


def _storage(s, model, masks, output_dir):
    import numpy as np

    from tfbnn import pruning

    sparsity = pruning.sparsity(masks)
    rows = []
    plain = os.path.join(output_dir, ".dense.keras")
    pruning.uncompiled_copy(model).save(plain)  # no optimizer state
    rows.append({"format": ".keras (Keras, uncompressed)", "pruned": False, "sparsity": 0.0,
                 "bytes": os.path.getsize(plain)})
    os.remove(plain)
    packed = os.path.join(output_dir, ".dense_deflated.keras")
    rows.append({"format": ".keras deflated", "pruned": False, "sparsity": 0.0,
                 "bytes": pruning.save_compressed(model, packed)})
    os.remove(packed)
    everything = {name: np.ones_like(mask) for name, mask in masks.items()}
    dense_npz = os.path.join(output_dir, ".dense.npz")
    rows.append({"format": "sparse .npz (means)", "pruned": False, "sparsity": 0.0,
                 "bytes": pruning.export_sparse(model, dense_npz, everything)})
    os.remove(dense_npz)
    with pruning.pruned(model, masks):
        packed = os.path.join(output_dir, "pruned.keras")
        rows.append({"format": ".keras deflated", "pruned": True, "sparsity": sparsity,
                     "bytes": pruning.save_compressed(model, packed)})
        path = os.path.join(output_dir, "pruned.npz")
        rows.append({"format": "sparse .npz (means)", "pruned": True, "sparsity": sparsity,
                     "bytes": pruning.export_sparse(model, path, masks)})
        scales = os.path.join(output_dir, ".pruned_scales.npz")
        rows.append({"format": "sparse .npz (means + scales)", "pruned": True, "sparsity": sparsity,
                     "bytes": pruning.export_sparse(model, scales, masks, include_scales=True)})
        os.remove(scales)
    return rows, [path, packed]


def _sweep(s, model, ds, output_dir):
    from tfbnn import pruning

    criterion = _criterion(s["method"])
    rows = []
    tmp = os.path.join(output_dir, ".sweep.npz")
    for threshold in _SWEEP[criterion]:
        masks = pruning.compute_masks(model, criterion=criterion, threshold=threshold)
        rows.append({
            "criterion": criterion,
            "threshold": threshold,
            "sparsity": pruning.sparsity(masks),
            "accuracy_principled": mc_accuracy(model, ds.x_test, ds.y_test, s["num_samples"], masks),
            "accuracy_random": mc_accuracy(model, ds.x_test, ds.y_test, s["num_samples"],
                                           pruning.random_masks(masks, seed=s["seed"])),
            "sparse_npz_bytes": pruning.export_sparse(model, tmp, masks),
        })
    os.remove(tmp)
    return rows


def _plot(result, path):
    from matplotlib.figure import Figure

    from tfbnn import plots

    summary, epochs, sweep = result["accuracy_summary"], result["sparsity_per_epoch"], result["threshold_sweep"]
    ncols = 3 if sweep else 2
    fig = Figure(figsize=(5.2 * ncols, 4.0), layout="constrained")
    axes = fig.subplots(1, ncols)
    colors = {"none": "tab:blue", "principled": "tab:green", "random": "tab:red"}
    ax = axes[0]
    for variant in VARIANTS:
        rows = [r for r in summary if r["variant"] == variant]
        label = {"none": "no pruning", "principled": f"principled ({100 * result['sparsity']:.1f}% pruned)",
                 "random": "random, same sparsity"}[variant]
        ax.errorbar([r["num_samples"] for r in rows], [r["mean"] for r in rows], yerr=[r["std"] for r in rows],
                    marker="o", capsize=3, color=colors[variant], label=label)
    ax.set(xscale="log", xlabel="MC samples T", ylabel="test accuracy",
           title=f"{result['settings']['dataset']}, {METHOD_LABELS[result['settings']['method']]}")
    ax.axhline(result["deterministic_accuracy"], color="0.5", linestyle=":", label="deterministic (pre-trained)")
    ax.legend(fontsize=8)
    ax = axes[1]
    layer_names = [k for k in epochs[0] if k not in ("epoch", "kl_beta", "loss", "train_accuracy", "sparsity")]
    for name in layer_names:
        ax.plot([r["epoch"] for r in epochs], [100 * r[name] for r in epochs], label=name)
    ax.plot([r["epoch"] for r in epochs], [100 * r["sparsity"] for r in epochs], "k--", label="all")
    twin = ax.twinx()
    twin.plot([r["epoch"] for r in epochs], [r["kl_beta"] for r in epochs], color="0.6", linewidth=1)
    twin.set_ylabel("KL weight beta", color="0.5")
    ax.set(xlabel="epoch", ylabel="sparsity (%)", title="Sparsity per layer during training")
    ax.legend(fontsize=8)
    if sweep:
        ax = axes[2]
        x = [100 * r["sparsity"] for r in sweep]
        ax.plot(x, [r["accuracy_principled"] for r in sweep], "o-", color="tab:green", label="principled")
        ax.plot(x, [r["accuracy_random"] for r in sweep], "o-", color="tab:red", label="random")
        ax.set(xlabel="sparsity (%)", ylabel=f"accuracy (T = {result['settings']['num_samples']})",
               title="Threshold sweep")
        twin = ax.twinx()
        twin.plot(x, [r["sparse_npz_bytes"] / 1024 for r in sweep], "s--", color="tab:purple", label="stored size")
        twin.set_ylabel("sparse .npz size (KiB)", color="tab:purple")
        ax.legend(fontsize=8, loc="lower left")
    plots.save(fig, path)
    return path


def run_experiment(output_dir=None, verbose=True, **settings):
    """Runs the whole study; writes the PNG, CSVs, JSON and the pruned model.

    Args:
        output_dir: folder for the outputs (default
            ``saved_models/experiments/vd_sparsity/<dataset>_<method>``).
        verbose: bool, print progress and the tables.
        **settings: overrides of :data:`DEFAULTS`; ``recipe``: a
            :class:`tfbnn.training.Recipe`, built-in name or JSON path of a ``vd`` or
            ``graves`` recipe to train instead of :func:`make_recipe` (its protocol replaces
            the training settings).

    Returns:
        dict: ``settings``, ``deterministic_accuracy``, ``sparsity`` (principled,
        overall), ``sparsity_report`` (per layer), ``accuracy`` (``{variant: mean,
        std}`` at ``num_samples``), ``accuracy_summary``, ``accuracy_rows``,
        ``sparsity_per_epoch``, ``threshold_sweep``, ``pruning_curve`` (rows of
        :func:`tfbnn.pruning.pruning_curve`), ``storage`` and ``files``.
    """
    s = _settings(settings)
    recipe = None
    if s["recipe"] is not None:
        recipe = training.resolve(s["recipe"])
        s = _settings_of(recipe, s)
    output_dir = _common.prepare_output_dir(
        output_dir or os.path.join(_common.DEFAULT_ROOT, NAME, f"{s['dataset']}_{s['method']}"))

    import keras

    from tfbnn import pruning

    keras.utils.set_random_seed(s["seed"])
    ds = _load(s)
    say = print if verbose else (lambda *a, **k: None)
    sizes = " -> ".join(str(v) for v in (ds.input_shape[0],) + s["hidden_units"] + (ds.num_classes,))
    say(f"{NAME}: {ds.name} (N = {ds.num_examples}), {s['model']} {sizes}, method {s['method']}", flush=True)
    from tfbnn import callbacks

    data = None  # a given recipe loads its own dataset
    if recipe is None:
        recipe = make_recipe(ds.input_shape, **settings)
        data = _common.array_pipeline(ds.x_train, ds.y_train, ds.name, s["batch_size"], ds.num_classes,
                                      ds.num_test_examples)
    monitor = callbacks.SparsityMonitor(criterion=_criterion(s["method"]), threshold=s["threshold"])
    found = {}

    def evaluate(model, recipe, data):  # the study's analysis is done below, on the trained model
        found["model"] = model
        return {}

    run = training.run(recipe, output_dir=os.path.join(output_dir, "run"), verbose=0, data=data,
                       callbacks=[monitor], evaluate=evaluate, quiet=True)
    model, history = run.model, run.history
    det_accuracy = (_deterministic_accuracy(run.pretrained, ds) if run.pretrained is not None else float("nan"))
    say(f"  pre-trained deterministic net: test accuracy {det_accuracy:.4f}", flush=True)
    say(f"  trained {s['method']} for {s['epochs']} epochs (beta 0 -> {s['kl_beta']:g}) "
        f"({run.train_seconds:.0f} s)", flush=True)
    masks = pruning.compute_masks(model, criterion=_criterion(s["method"]), threshold=s["threshold"])
    report = pruning.sparsity_report(model, masks, criterion=_criterion(s["method"]))
    say("\n" + str(report) + "\n", flush=True)
    rows = _accuracy_vs_samples(s, model, ds, masks)
    summary = _summarise(rows)
    at_t = {r["variant"]: {"mean": r["mean"], "std": r["std"]} for r in summary if r["num_samples"] == s["num_samples"]}
    storage, model_files = _storage(s, model, masks, output_dir)
    sweep = _sweep(s, model, ds, output_dir) if s["sweep"] else []
    curve = []
    if s["fractions"]:
        curve = pruning.pruning_curve(model, ds.x_test, ds.y_test, s["fractions"], s["num_samples"],
                                      scope=s["fraction_scope"], criterion=_criterion(s["method"]), seed=s["seed"])
        say("\n" + pruning.format_pruning_curve(
            curve, f"MC accuracy (T = {s['num_samples']}) after pruning a fraction ({s['fraction_scope']})") + "\n")
    result = {
        "settings": _common.jsonable(s),
        "dataset": {"name": ds.name, "num_examples": ds.num_examples, "num_test_examples": ds.num_test_examples},
        "deterministic_accuracy": det_accuracy,
        "sparsity": report.sparsity,
        "sparsity_report": report.as_dict(),
        "accuracy": at_t,
        "accuracy_summary": summary,
        "accuracy_rows": rows,
        "sparsity_per_epoch": _per_epoch_rows(history),
        "threshold_sweep": sweep,
        "pruning_curve": curve,
        "storage": storage,
        "seconds": run.train_seconds,
        "run": run.output_dir,
    }
    files = [
        _plot(result, os.path.join(output_dir, "study.png")),
        _common.write_csv(os.path.join(output_dir, "accuracy_vs_samples.csv"), summary),
        _common.write_csv(os.path.join(output_dir, "accuracy_rows.csv"), rows),
        _common.write_csv(os.path.join(output_dir, "sparsity_per_epoch.csv"), result["sparsity_per_epoch"]),
        _common.write_csv(os.path.join(output_dir, "sparsity.csv"), result["sparsity_report"]["layers"]),
        _common.write_csv(os.path.join(output_dir, "storage.csv"), storage),
    ]
    if sweep:
        files.append(_common.write_csv(os.path.join(output_dir, "threshold_sweep.csv"), sweep))
    if curve:
        files += pruning.write_pruning_curve(curve, output_dir)
    files += model_files
    files.append(_common.write_json(os.path.join(output_dir, "results.json"), result))
    result["files"] = files
    t = s["num_samples"]
    say(f"MC accuracy (T = {t}, {s['repeats']} repeats): "
        + ", ".join(f"{v} {100 * at_t[v]['mean']:.2f} +- {100 * at_t[v]['std']:.2f}%" for v in VARIANTS)
        + f"; deterministic {100 * det_accuracy:.2f}%")
    say("stored size: " + ", ".join(f"{r['format']}{' pruned' if r['pruned'] else ''} {r['bytes']} B" for r in storage))
    return result


# -- command line ------------------------------------------------------------------------------


def add_arguments(parser):
    """The options of the study (shared by ``python -m`` and the ``tfbnn`` subcommand)."""
    d = DEFAULTS
    parser.add_argument("--model", choices=list(MODELS), default=d["model"],
                        help="lenet300_100 (hidden 300-100) or mlp (hidden sizes from --hidden-units)")
    parser.add_argument("--hidden-units", type=argtypes.positive_int, nargs="+", default=None, metavar="U",
                        help="hidden layer sizes of --model mlp (default: 300 100)")
    parser.add_argument("--method", choices=SPARSIFYING_METHODS, default=d["method"],
                        help="vd: sparse variational dropout (Molchanov, additive); vd_multiplicative: Kingma's "
                             "(alpha <= 1, does not sparsify); graves: GravesDense (log-variance posterior, "
                             "fixed N(0, 1) prior)")
    parser.add_argument("--dataset", choices=DATASETS, default=d["dataset"],
                        help="digits / moons are offline; mnist / fashion_mnist download via tensorflow-datasets")
    _common.add_options(parser, d, "max_examples", "pretrain_epochs", "epochs", "warmup_epochs", "anneal_epochs",
                        max_examples="training examples to use (mnist, fashion_mnist; moons: points generated)",
                        pretrain_epochs="epochs of deterministic pre-training", epochs="epochs of Bayesian training",
                        anneal_epochs="epochs of the linear beta ramp after the warm-up")
    parser.add_argument("--kl-beta", type=argtypes.positive_float, default=d["kl_beta"],
                        help="final beta (default: 1, the ELBO; lower it when the KL overwhelms a small N)")
    _common.add_options(parser, d, "batch_size", "learning_rate", "init_scale", "moped_delta",
                        learning_rate="Adam rate")
    parser.add_argument("--threshold", type=argtypes.finite_float, default=d["threshold"],
                        help="pruning threshold (default: log alpha 3 for vd, |mu|/sigma 0.83 for graves)")
    _common.add_options(parser, d, "num_samples", num_samples="MC samples of the headline accuracy and the sweep")
    parser.add_argument("--sample-counts", type=argtypes.positive_int, nargs="+", default=list(d["sample_counts"]),
                        metavar="T", help="numbers of MC samples for the accuracy-vs-T curve")
    parser.add_argument("--repeats", type=argtypes.positive_int, default=d["repeats"],
                        help="repeats per point (error bars: std over repeats)")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the threshold sweep")
    parser.add_argument("--fractions", type=argtypes.rate, nargs="*", default=list(d["fractions"]), metavar="F",
                        help="fractions of the weights to prune, lowest signal-to-noise first, each in [0, 1), "
                             "against random pruning (Blundell et al. 2015; writes pruning_curve.*; "
                             "no value: skip)")
    parser.add_argument("--fraction-scope", choices=("global", "layer"), default=d["fraction_scope"],
                        help="rank the weights over all layers together or within each layer")
    _common.add_options(parser, d, "seed")
    parser.add_argument("--recipe", default=None, metavar="NAME",
                        help="train this recipe (a built-in name such as vd-lenet300-100-pretrained, or a JSON "
                             "file) with training.run and analyse it; its protocol replaces the training options")
    parser.add_argument("--output-dir", default=None, metavar="DIR",
                        help="output folder (default: saved_models/experiments/vd_sparsity/<dataset>_<method>)")


def run(args):
    """Runs the study from parsed arguments; returns the exit status."""
    if args.hidden_units is not None and args.model != "mlp":
        raise ValueError(f"--hidden-units applies to --model mlp. Received: --model {args.model}")
    hidden_units = DEFAULTS["hidden_units"] if args.hidden_units is None else tuple(args.hidden_units)
    return _common.run_with_settings(args, DEFAULTS, run_experiment, hidden_units=hidden_units,
                                     sample_counts=tuple(args.sample_counts), fractions=tuple(args.fractions))


def main(argv=None):
    """``python -m tfbnn.experiments.vd_sparsity [options]``; returns the exit status."""
    return _common.main(NAME, DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
