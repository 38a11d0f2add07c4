"""The home page's "which method should I use?" table, written from the measured shift benchmark.

The full offline run of notebook 07 writes ``notebooks/outputs/shift_benchmark/`` (git-ignored:
its ``table.json`` and each method's training run under ``runs/``); ``python docs/home.py
--refresh`` keeps what the table needs (the rows, the settings, each run's training seconds) in
:data:`MEASURED`, ``docs/assets/shift_benchmark.json``, which is committed. :func:`block` turns
that into the table ``docs/index.md`` holds between :data:`BEGIN` and :data:`END`: per method
its clean and corrupted accuracy, NLL and ECE, its OOD AUROC against held-out classes, its
training time and the forward passes a prediction takes, each row linking its guide.
``python docs/home.py`` rewrites the table, ``python docs/home.py --check`` exits 1 while it
differs (``tests/test_docs_lists.py`` runs the check). Standard library only.
"""

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("notebooks", "outputs", "shift_benchmark")
MEASURED = os.path.join("docs", "assets", "shift_benchmark.json")
PAGE = os.path.join("docs", "index.md")
BEGIN = "<!-- methods: written by `python docs/home.py` from docs/assets/shift_benchmark.json -->"
END = "<!-- /methods -->"

#: method -> (label, guide link from docs/, training run, forward passes per prediction, when to use it).
#: ``T`` is the benchmark's Monte Carlo samples, ``M`` its ensemble members.
METHODS = {
    "deterministic": ("deterministic network", "guides/getting-started.md", "deterministic", "1",
                      "the baseline: no epistemic uncertainty"),
    "mc_dropout": ("MC dropout", "guides/uncertainty.md", "mc_dropout", "T",
                   "a network that already has dropout"),
    "bbb": ("Bayes by Backprop", "guides/getting-started.md#layers-and-estimators", "bbb", "T",
            "a weight posterior trained with `fit`; shift detection"),
    "vd": ("variational dropout", "guides/variational-dropout.md", "vd", "T",
           "sparsity: prune most weights by log-alpha"),
    "ibnn": ("iBNN (node noise)", "guides/ibnn.md", "ibnn", "T",
             "calibration under shift at the cost of a few extra parameters"),
    "ensemble": ("deep ensemble", "guides/ensembles.md", "ensemble", "M",
                 "the strongest all-round baseline, at M times the cost"),
    "laplace": ("Laplace (last layer)", "guides/laplace.md", "deterministic", "1 + T (last layer)",
                "uncertainty for a model already trained, no retraining"),
    "swag": ("SWAG", "guides/laplace.md#swa-and-swag", "deterministic-6", "T",  # its own deterministic run
             "a posterior from the SGD iterates of one training run"),
    "dvi": ("moment propagation (DVI)", "guides/uncertainty.md", "bbb", "1",
            "a Bayes-by-Backprop network predicted in one pass"),
    "sngp": ("SNGP", "guides/single-pass.md", "sngp", "1",
             "single-pass, distance-aware OOD scores"),
    "ddu": ("DDU", "guides/single-pass.md", "ddu", "1",
            "single-pass OOD detection by feature density"),
    "evidential": ("evidential (Dirichlet head)", "guides/distribution-heads.md", "evidential", "1",
                   "a second-order head; its `u` behaves as a total-uncertainty score"),
    "heteroscedastic": ("heteroscedastic softmax", "guides/distribution-heads.md", "heteroscedastic", "1",
                        "label noise (aleatoric), single pass"),
}


def refresh(root=None):
    """Copies what the table needs from the notebook's outputs (:data:`RESULTS`) to :data:`MEASURED`."""
    root = root or ROOT
    with open(os.path.join(root, RESULTS, "table.json"), encoding="utf-8") as f:
        table = json.load(f)
    seconds = {}
    runs = os.path.join(root, RESULTS, "runs")
    for name in sorted(os.listdir(runs)):
        path = os.path.join(runs, name, "results.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                seconds[name] = json.load(f).get("train_seconds")
    with open(os.path.join(root, MEASURED), "w", encoding="utf-8") as f:
        json.dump({"settings": table["settings"], "table": table["table"], "train_seconds": seconds}, f, indent=1)
        f.write("\n")


def measured(root=None):
    """The committed measurements (:data:`MEASURED`): ``settings``, ``table`` rows, ``train_seconds`` per run."""
    with open(os.path.join(root or ROOT, MEASURED), encoding="utf-8") as f:
        return json.load(f)


def block(root=None):
    """The table, markers included."""
    table = measured(root)
    seconds, settings = table["train_seconds"], table["settings"]
    lines = [BEGIN,
             "| method | use it for | clean acc / NLL / ECE | corrupted acc / NLL / ECE | OOD AUROC (held-out "
             "classes) | training (s) | passes per prediction |",
             "|---|---|---|---|---|---|---|"]
    if len(settings["methods"]) != len(table["table"]):
        raise ValueError(f"{RESULTS}/table.json: {len(table['table'])} rows for methods {settings['methods']}")
    for method, row in zip(settings["methods"], table["table"]):  # the rows follow the methods' order
        label, link, run, passes, use = METHODS[method]
        train = seconds.get(run) if run else None
        passes = passes.replace("T", str(settings["num_samples"])).replace("M", str(settings["members"]))
        lines.append(
            f"| [{label}]({link}) | {use} | {row['clean_accuracy']:.3f} / {row['clean_nll']:.3f} / "
            f"{row['clean_ece']:.3f} | {row['corrupted_accuracy']:.3f} / {row['corrupted_nll']:.3f} / "
            f"{row['corrupted_ece']:.3f} | {row['ood_auroc_classes']:.3f} | "
            f"{'-' if train is None else f'{train:.0f}'} | {passes} |")
    lines.append(END)
    return "\n".join(lines)


def rewritten(root=None):
    """``docs/index.md`` with its table replaced by :func:`block`'s."""
    with open(os.path.join(root or ROOT, PAGE), encoding="utf-8") as f:
        text = f.read()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{PAGE} must hold the method table once, between {BEGIN!r} and {END!r}")
    return pattern.sub(lambda _: block(root), text)


def main(argv=None):
    """Rewrites the table (or, with ``--check``, returns 1 while it differs)."""
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    if "--refresh" in argv:
        refresh()
    text = rewritten()
    with open(os.path.join(ROOT, PAGE), encoding="utf-8") as f:
        same = f.read() == text
    if check:
        if not same:
            print(f"the method table of {PAGE} differs from {MEASURED}: run python docs/home.py")
        return 0 if same else 1
    if not same:
        with open(os.path.join(ROOT, PAGE), "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
