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

import os

import tfbnn
from tfbnn import datasets, training
from tfbnn._internal.errors import RunError
from tfbnn.datasets.catalog import ARRAY_DATASETS
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = [
    "STUDY",
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

SETTINGS = (
    Setting("model", "lenet300_100", "lenet300_100 (hidden 300-100) or mlp (hidden sizes from --hidden-units)",
            choices=tuple(MODELS)),
    Setting("hidden_units", (300, 100), "hidden layer sizes of --model mlp (LeNet-300-100 has 300 100)",
            kind="positive_int", many=True, metavar="U"),
    Setting("method", "vd", "vd: sparse variational dropout (Molchanov, additive); vd_multiplicative: Kingma's "
            "(alpha <= 1, does not sparsify); graves: GravesDense (log-variance posterior, fixed N(0, 1) prior)",
            choices=SPARSIFYING_METHODS),
    Setting("dataset", "digits", "digits / moons are offline; mnist / fashion_mnist download via tensorflow-datasets",
            choices=DATASETS),
    Setting("max_examples", None, "training examples to use (mnist, fashion_mnist; moons: points generated)"),
    Setting("pretrain_epochs", 10, "epochs of deterministic pre-training"),
    Setting("epochs", 30, "epochs of Bayesian training"), Setting("warmup_epochs", 2.0),
    Setting("anneal_epochs", 13.0, "epochs of the linear beta ramp after the warm-up", recipe="kl_epochs"),
    # One name for the final KL weight, the recipe's: `kl_beta` (--kl-beta) was its second name.
    Setting("beta", 1.0, "final beta (default: 1, the ELBO; lower it when the KL overwhelms a small N)",
            aliases=("kl_beta",)),
    Setting("batch_size", 64), Setting("learning_rate", 1e-3, "Adam rate"), Setting("init_scale", "moped"),
    Setting("moped_delta", 0.1),
    Setting("threshold", None, "pruning threshold (default: log alpha 3 for vd, |mu|/sigma 0.83 for graves)",
            kind="finite_float", allow_none=True),
    Setting("num_samples", 10, "MC samples of the headline accuracy and the sweep"),
    Setting("sample_counts", (1, 2, 5, 10, 20, 50), "numbers of MC samples for the accuracy-vs-T curve",
            kind="positive_int", many=True, metavar="T"),
    Setting("repeats", 5, "repeats per point (error bars: std over repeats)", kind="positive_int"),
    Setting("sweep", True, "skip the threshold sweep", kind="bool"),
    Setting("fractions", (0.0, 0.5, 0.75, 0.95, 0.98),  # tfbnn.pruning.BLUNDELL_FRACTIONS
            "fractions of the weights to prune, lowest signal-to-noise first, each in [0, 1), against random "
            "pruning (Blundell et al. 2015; writes pruning_curve.*; no value: skip)", kind="rate", many=True,
            allow_empty=True, metavar="F"),
    Setting("fraction_scope", "global", "rank the weights over all layers together or within each layer",
            choices=("global", "layer")),
    Setting("seed", 0),
    Setting("recipe", None, "train this recipe (a built-in name such as vd-lenet300-100-pretrained, or a JSON "
            "file) with training.run and analyse it; its protocol replaces the training options", kind="recipe",
            allow_none=True, metavar="NAME"),
)

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


# -- the study -----------------------------------------------------------------------------------
def make_recipe(input_shape=(64,), **settings):
    """The :class:`tfbnn.training.Recipe` the study trains and then analyses.

    The settings (:data:`DEFAULTS`, overridden by ``settings``) become recipe fields: the
    deterministic zoo MLP with ``hidden_units`` (unseeded: Keras' global seed initializes it)
    pre-trained ``pretrain_epochs``, then converted (:func:`tfbnn.convert.to_bayesian`:
    ``init_scale``, ``moped_delta``) to ``method`` (``vd_multiplicative``: ``vd`` with
    ``parameterization="multiplicative"``), trained ``epochs`` with the KL weight 0 for
    ``warmup_epochs`` and then linear to ``beta`` over ``anneal_epochs``; Adam at
    ``learning_rate`` in both phases, ``batch_size``, ``num_samples`` test samples. With
    ``pretrain_epochs=0`` the Bayesian MLP is the zoo's, from its own initialization (there is
    nothing to convert).
    """
    return _recipe(STUDY.resolve(settings))


def _recipe(s):
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
        kl_epochs=s["anneal_epochs"], beta=s["beta"], eval_samples=s["num_samples"], seed=s["seed"],
    )


def _deterministic_accuracy(det, ds):
    """Test accuracy of the pre-trained deterministic net."""
    det.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    return float(det.evaluate(ds.x_test, ds.y_test, batch_size=512, verbose=0)[1])


def _validate(s):
    """The checks between settings; a given ``recipe`` resolved (:func:`tfbnn.training.resolve`) and its
    protocol in place of the training settings (:func:`_settings_of`)."""
    if s["model"] == "lenet300_100" and s["hidden_units"] != MODELS["lenet300_100"]:
        raise ValueError("`hidden_units` applies to the model 'mlp' (LeNet-300-100 has hidden layers (300, 100)). "
                         f"Received: model={s['model']!r}, hidden_units={s['hidden_units']!r}")
    if s["num_samples"] not in s["sample_counts"]:
        s["sample_counts"] = tuple(sorted(set(s["sample_counts"]) | {s["num_samples"]}))
    if s["threshold"] is not None:
        from tfbnn import pruning

        pruning.check_threshold(_criterion(s["method"]), s["threshold"])
    from tfbnn import convert

    convert.check_init_scale(s["init_scale"], s["moped_delta"])
    if s["recipe"] is not None:
        s = _settings_of(training.resolve(s["recipe"]), s)
    return s


def _settings_of(recipe, s):
    """The study's settings that describe ``recipe`` (its method, dataset and protocol)."""
    if recipe.method not in ("vd", "graves") or recipe.dataset not in DATASETS:
        raise ValueError(f"Expected a 'vd' or 'graves' recipe on one of {list(DATASETS)}. "
                         f"Received: recipe={recipe.name!r} (method={recipe.method!r}, dataset={recipe.dataset!r})")
    multiplicative = recipe.method_options.get("parameterization") == "multiplicative"
    hidden = recipe.model_options.get("hidden_units", MODELS.get(recipe.model.replace("lenet_", "lenet"), None))
    return {**s, "recipe": recipe, "model": recipe.model, "hidden_units": tuple(hidden or s["hidden_units"]),
            "method": "vd_multiplicative" if multiplicative else recipe.method, "dataset": recipe.dataset,
            "max_examples": recipe.max_examples, "pretrain_epochs": recipe.pretrain_epochs, "epochs": recipe.epochs,
            "warmup_epochs": recipe.warmup_epochs, "anneal_epochs": recipe.ramp_epochs, "beta": recipe.beta,
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


def recipes(s):
    """The one recipe the study trains for the checked settings ``s``: the given ``recipe``, else
    :func:`make_recipe`'s."""
    return [s["recipe"] if s["recipe"] is not None else _recipe(s)]


def _folder(s):
    return os.path.join(NAME, f"{s['dataset']}_{s['method']}")


def train(s, output_dir, verbose):
    """Loads the data and trains the recipe of :func:`recipes` (one :func:`tfbnn.training.run`, its folder
    ``<output_dir>/run``) with a :class:`tfbnn.callbacks.SparsityMonitor`.

    Returns:
        dict: the run's result ``run`` and the dataset ``dataset``.
    """
    import keras

    from tfbnn import callbacks

    keras.utils.set_random_seed(s["seed"])
    ds = _load(s)
    say = print if verbose else (lambda *a, **k: None)
    sizes = " -> ".join(str(v) for v in (ds.input_shape[0],) + s["hidden_units"] + (ds.num_classes,))
    say(f"{NAME}: {ds.name} (N = {ds.num_examples}), {s['model']} {sizes}, method {s['method']}", flush=True)
    data = None  # a given recipe loads its own dataset
    recipe, = recipes(s)
    if s["recipe"] is None:
        data = _common.array_pipeline(ds.x_train, ds.y_train, ds.name, s["batch_size"], ds.num_classes,
                                      ds.num_test_examples)
    monitor = callbacks.SparsityMonitor(criterion=_criterion(s["method"]), threshold=s["threshold"])

    def evaluate(model, recipe, data):  # the study's analysis is :func:`analyse`, on the trained model
        return {}

    run = training.run(recipe, output_dir=os.path.join(output_dir, "run"), verbose=0, data=data,
                       callbacks=[monitor], evaluate=evaluate, quiet=True)
    return {"run": run, "dataset": ds}


def analyse(trained, s, output_dir, verbose):
    """The analysis of the trained model: sparsity per layer, Monte Carlo accuracy with no / principled /
    random pruning against the number of samples, the stored sizes, the threshold sweep and the pruning
    curve; ``study.png``, the CSVs, ``results.json`` and the pruned model.

    Returns:
        dict: ``settings``, ``deterministic_accuracy``, ``sparsity`` (principled,
        overall), ``sparsity_report`` (per layer), ``accuracy`` (``{variant: mean,
        std}`` at ``num_samples``), ``accuracy_summary``, ``accuracy_rows``,
        ``sparsity_per_epoch``, ``threshold_sweep``, ``pruning_curve`` (rows of
        :func:`tfbnn.pruning.pruning_curve`), ``storage`` and ``files``.
    """
    from tfbnn import pruning

    run, ds = trained["run"], trained["dataset"]
    say = print if verbose else (lambda *a, **k: None)
    model, history = run.model, run.history
    det_accuracy = (_deterministic_accuracy(run.pretrained, ds) if run.pretrained is not None else float("nan"))
    say(f"  pre-trained deterministic net: test accuracy {det_accuracy:.4f}", flush=True)
    say(f"  trained {s['method']} for {s['epochs']} epochs (beta 0 -> {s['beta']:g}) "
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
        "settings": _common.jsonable({**s, "recipe": None if s["recipe"] is None else s["recipe"].name}),
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


STUDY = Study(
    name="vd-sparsity", module="tfbnn.experiments.vd_sparsity", description=DESCRIPTION, settings=SETTINGS,
    recipes=recipes, train=train, analyse=analyse, outputs="the PNGs, CSVs, JSON and the pruned model",
    folder=_folder, validate=_validate,
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
