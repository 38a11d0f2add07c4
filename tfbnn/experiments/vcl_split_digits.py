"""Split digits: variational continual learning (posterior as the next prior) against fine-tuning.

The offline 8x8 digits (:func:`tfbnn.datasets.load_digits`) are cut into five tasks, the
class pairs {0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, learned one after the other (about 290
training and 72 test images each); an MLP 64 -> 100 -> 100 (ReLU) is trained on task 1,
then task 2, ... and after every task tested on every task seen so far.

Settings (``head``):

* ``"single"`` (default; class-incremental): one 10-way output layer; while task ``t`` is
  trained and tested, the output units of the classes seen so far are active (the softmax
  runs over the first ``2 t`` units), as in van de Ven & Tolias (2019). The task is not
  given at test time, so forgetting is measurable: fine-tuning forgets every earlier task.
* ``"multi"`` (task-incremental, VCL's split-MNIST setting): one 2-way head per task, the
  task given at test time. On these digits even fine-tuning keeps most earlier tasks.

Methods (``methods``):

* ``finetune``: the same MLP with deterministic ``keras.layers.Dense`` layers, trained on
  each task in turn (plain fine-tuning);
* ``bbb``: Bayes-by-Backprop (``DenseLocalReparameterization``, mean-field Gaussian
  posterior) trained on each task against the original prior ``N(0, prior_scale^2)``,
  continuing from the previous posterior;
* ``vcl``: the same layers, the prior of task ``t`` the posterior after task ``t - 1``
  (:func:`tfbnn.continual.posterior_as_prior`; Nguyen et al. 2018, eq. 4).

The Bayesian methods minimise ``mean NLL + beta KL(q || prior) / N_t`` (``N_t`` the task's
training examples). ``beta = 0.1`` by default (a tempered posterior, the likelihood counted
ten times): with about 290 examples per task and 17.6k weights, the true ELBO (``beta = 1``)
leaves posteriors so broad that VCL with a 20-image coreset averaged 0.31 accuracy after
the five tasks, against 0.82 with ``beta = 0.1`` (3 seeds, single head). Coreset (``coreset_sizes``, K per task; VCL's Algorithm 1 with
a random coreset): K random training images of each task go to a coreset ``C`` instead of
the task's training set; the model carried to the next task never sees them, and the model
tested after task ``t`` is a copy of it trained further on all of ``C`` (for VCL with the
carried posterior as its prior; for BbB with the original prior; fine-tuning: plain replay
of ``C``, the control for what the coreset alone does).

Reported, per method and coreset size, over seeds: the accuracy matrix ``R[t, j]`` (after
task ``t``, on task ``j``), the average accuracy after the last task, the tasks and classes
forgotten (learned: accuracy >= ``threshold`` right after their task; forgotten: below it
after the last task; :func:`tfbnn.continual.forgetting_summary`), the backward transfer.

Outputs (``--output-dir``, default ``saved_models/experiments/vcl_split_digits/``):
``accuracy_matrices.png`` (the mean matrix of every method), ``accuracy_curves.png`` (each
task's accuracy as tasks are added), ``results.csv`` / ``results.md`` (the table),
``results.json`` (settings, every run's matrices and numbers).

Run: ``tfbnn vcl-split-digits`` (18 runs: 3 methods x 2 coreset sizes x 3 seeds, about 11 minutes on 2
busy CPU cores) or
``tfbnn vcl-split-digits --quick`` (a smoke run: one seed, 40 steps per task, a few minutes).

Why this study keeps its own training loop (``_fit``) instead of :func:`tfbnn.training.run`:
a run builds a fresh model from a recipe, trains it once and evaluates it; continual learning
trains one network through a sequence of tasks: the same weights carry over from task to task,
the prior is swapped for the last posterior between tasks (VCL), each task has its own loss
(the softmax over the classes seen so far, or its own head), a fixed number of steps over a
seeded order of its examples, and a coreset fine-tunes a copy before testing. None of that is a
single run's data, model or loss; the loop is small, checks for a non-finite loss itself, and
anneals nothing (``beta`` is constant).

References:
    Nguyen, Li, Bui, Turner. Variational Continual Learning. ICLR 2018 (eq. 4, Algorithm 1).
    van de Ven, Tolias. Three scenarios for continual learning. arXiv:1904.07734, 2019.
"""

import math
import os
import time

import tfbnn
from tfbnn import datasets
from tfbnn._internal import files
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "QUICK", "COMPARED_METHODS", "HEADS", "TASKS", "split_tasks", "run_sequence", "run_experiment",
           "add_arguments", "run", "main"]

NAME = "vcl_split_digits"
COMPARED_METHODS = ("finetune", "bbb", "vcl")
METHOD_LABELS = {"finetune": "fine-tuning", "bbb": "BbB, original prior", "vcl": "VCL"}
HEADS = ("single", "multi")
TASKS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))

#: ``quick``: a smoke run of the whole protocol (and only the first seed).
QUICK = {"steps": 40, "coreset_steps": 10, "hidden_units": (32, 32), "num_samples": 4}

SETTINGS = (
    Setting("head", "single", "single: one 10-way output, classes seen so far active (class-incremental); "
            "multi: a 2-way head per task", choices=HEADS),
    Setting("methods", COMPARED_METHODS, "finetune (deterministic), bbb (original prior every task), vcl (posterior "
            "as prior)", choices=COMPARED_METHODS, many=True, unique=True),
    Setting("coreset_sizes", (0, 20), "coreset images per task (0: none; single head only)", kind="non_negative_int",
            many=True, unique=True, metavar="K"),
    Setting("hidden_units", (100, 100), "units of the hidden ReLU layers", many=True, metavar="U"),
    Setting("steps", 1000, "training steps per task", kind="positive_int"),
    Setting("coreset_steps", 300, "steps on the coreset before testing", kind="positive_int"),
    Setting("batch_size", 64), Setting("learning_rate", 5e-3, "Adam learning rate (a fresh optimizer per task)"),
    Setting("prior_scale", 0.3, "first prior N(0, S^2) of the Bayesian methods", kind="positive_float", metavar="S"),
    Setting("initial_scale", 0.05, "initial posterior standard deviation", kind="positive_float", metavar="SIGMA"),
    Setting("beta", 0.1, "KL weight: loss = mean NLL + beta KL / N_t (1: the true ELBO)", kind="positive_float"),
    Setting("num_samples", 20, "Monte Carlo samples per test prediction"),
    Setting("threshold", 0.5, "a task (class) is learned at accuracy >= THRESHOLD, forgotten below it at the end",
            kind="positive_fraction"),
    Setting("seeds", (0, 1, 2), "seeds (data split, weights, noise, coreset)", kind="non_negative_int", many=True,
            unique=True),
    Setting("quick", False, "a smoke run: the first seed, " + ", ".join(f"{k}={v}" for k, v in QUICK.items())),
)

DESCRIPTION = (
    "Split digits, five tasks {0,1}, {2,3}, ..., {8,9} learned in sequence by an MLP 64-100-100:\n"
    "variational continual learning (the posterior after each task is the next task's prior,\n"
    "Nguyen et al. 2018) against fine-tuning (deterministic, and Bayes-by-Backprop with the original\n"
    "prior), single-head (class-incremental) or multi-head, with and without a coreset. Writes\n"
    "accuracy_matrices.png and accuracy_curves.png next to results.csv / results.md / results.json."
)


def split_tasks(ds, head):
    """The five tasks of ``ds`` (an :class:`tfbnn.datasets.ArrayDataset` of digits).

    Returns a list of ``(x_train, y_train, x_test, y_test, classes)``: labels are the digits
    for ``head="single"`` and 0 / 1 (first or second class of the pair) for ``"multi"``.
    """
    import numpy as np

    tasks = []
    for classes in TASKS:
        train = np.isin(ds.y_train, classes)
        test = np.isin(ds.y_test, classes)
        y_train, y_test = ds.y_train[train], ds.y_test[test]
        if head == "multi":
            y_train, y_test = (y_train == classes[1]).astype("int32"), (y_test == classes[1]).astype("int32")
        tasks.append((ds.x_train[train], y_train, ds.x_test[test], y_test, classes))
    return tasks


def _masked_crossentropy(active):
    """Sparse cross-entropy from logits over the first ``active`` output units only."""
    import keras

    def masked_crossentropy(y_true, logits):
        return keras.losses.sparse_categorical_crossentropy(y_true, logits[..., :active], from_logits=True)

    return masked_crossentropy


class _Network:
    """The MLP of one run: a shared body, one 10-way head or five 2-way heads; a model per task."""

    def __init__(self, method, s, seed):
        import keras

        def dense(units, activation, index):
            if method == "finetune":
                return keras.layers.Dense(units, activation=activation,
                                          kernel_initializer=keras.initializers.GlorotUniform(seed + 7919 * index))
            prior = tfbnn.priors.Normal(0.0, s["prior_scale"])
            rho = keras.initializers.Constant(math.log(math.expm1(s["initial_scale"])))  # softplus(rho) = scale
            return tfbnn.DenseLocalReparameterization(
                units, activation=activation, kernel_prior=prior, bias_prior=prior, kernel_scale_initializer=rho,
                bias_scale_initializer=rho, seed=seed + 7919 * index,
                kernel_initializer=keras.initializers.GlorotUniform(seed + 7919 * index))

        self.bayesian = method != "finetune"
        inputs = keras.Input((64,))
        features = inputs
        for i, units in enumerate(s["hidden_units"]):
            features = dense(units, "relu", i)(features)
        num_heads, outputs = (len(TASKS), 2) if s["head"] == "multi" else (1, 10)
        self.models = [keras.Model(inputs, dense(outputs, None, 100 + h)(features)) for h in range(num_heads)]

    def model(self, task):
        return self.models[task if len(self.models) > 1 else 0]

    def trained_part(self, task):
        """The models of tasks ``0..task``: the layers trained so far (for posterior_as_prior)."""
        return self.models[: task + 1] if len(self.models) > 1 else self.models[0]


def _fit(model, x, y, steps, active, s, rng, bayesian):
    import keras
    import numpy as np

    model.compile(keras.optimizers.Adam(s["learning_rate"]), _masked_crossentropy(active), jit_compile=False)
    batch = min(s["batch_size"], len(x))
    # Exactly `steps` minibatches: shuffled passes over the data, back to back, in one epoch.
    passes = math.ceil(steps * batch / len(x))
    order = np.concatenate([rng.permutation(len(x)) for _ in range(passes)])[: steps * batch]
    callbacks = ([tfbnn.KLAnnealing(num_examples=len(x), schedule=tfbnn.schedules.Constant(s["beta"]))]
                 if bayesian else [])
    history = model.fit(x[order], y[order], batch_size=batch, epochs=1, shuffle=False, verbose=0,
                        callbacks=callbacks)
    _common.check_finite_history(history, f"{model.name} ({len(x)} examples)")


def _probabilities(model, x, active, num_samples):
    """Monte Carlo predictive ``mean_t softmax(logits_t[:, :active])`` (one pass for a deterministic net)."""
    import numpy as np
    import tensorflow as tf

    with tfbnn.weight_samples(model, num_samples):
        logits = model(tfbnn.utils.tile_rows(tf.constant(x), num_samples), training=False)
    logits = tf.reshape(logits, (num_samples, len(x), -1))[..., :active]
    return np.asarray(tf.reduce_mean(tf.nn.softmax(logits), axis=0))


def _evaluate(network, tasks, t, s):
    """Row ``t`` of the task and class accuracy matrices (NaN for what is not trained yet)."""
    import numpy as np

    num_samples = s["num_samples"] if network.bayesian else 1
    task_row, class_row = np.full(len(tasks), np.nan), np.full(10, np.nan)
    for j in range(t + 1):
        _, _, x_test, y_test, classes = tasks[j]
        if s["head"] == "multi":
            probs = _probabilities(network.model(j), x_test, 2, num_samples)
        else:
            probs = _probabilities(network.model(t), x_test, 2 * (t + 1), num_samples)
        correct = probs.argmax(-1) == y_test
        task_row[j] = correct.mean()
        for k, c in enumerate(classes):
            mask = (y_test == (k if s["head"] == "multi" else c))
            class_row[c] = correct[mask].mean()
    return task_row, class_row


def _predictor(network, method, s, seed, core, active, t, rng):
    """VCL's Algorithm 1, step 3: a copy of the carried model trained on the coreset ``C``."""
    copy = _Network(method, s, seed)
    copy.model(t).set_weights(network.model(t).get_weights())
    if method == "vcl":
        tfbnn.continual.posterior_as_prior(copy.model(t))
    _fit(copy.model(t), core[0], core[1], s["coreset_steps"], active, s, rng, copy.bayesian)
    return copy


def run_sequence(method, s, tasks, coreset_size, seed):
    """Trains ``method`` on the tasks in order; returns the task and class accuracy matrices.

    Args:
        method: ``"finetune"``, ``"bbb"`` or ``"vcl"``.
        s: the settings (:data:`DEFAULTS` with overrides).
        tasks: :func:`split_tasks` output.
        coreset_size: int >= 0, K coreset images per task (0: none).
        seed: int, seeds the weights, the noise, the coreset and the minibatch order.

    Returns:
        ``(accuracy, class_accuracy)``: ``(5, 5)`` and ``(5, 10)`` arrays, NaN where not trained yet.
    """
    import keras
    import numpy as np

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    network = _Network(method, s, seed)
    accuracy, class_accuracy = np.full((len(tasks), len(tasks)), np.nan), np.full((len(tasks), 10), np.nan)
    core_x, core_y = [], []
    for t, (x, y, _, _, _) in enumerate(tasks):
        if coreset_size:
            pick = rng.choice(len(x), coreset_size, replace=False)
            core_x.append(x[pick])
            core_y.append(y[pick])
            keep = np.setdiff1d(np.arange(len(x)), pick)
            x, y = x[keep], y[keep]
        if method == "vcl" and t > 0:
            tfbnn.continual.posterior_as_prior(network.trained_part(t - 1))
        active = 2 if s["head"] == "multi" else 2 * (t + 1)
        _fit(network.model(t), x, y, s["steps"], active, s, rng, network.bayesian)
        tested = network
        if coreset_size:
            core = (np.concatenate(core_x), np.concatenate(core_y))
            tested = _predictor(network, method, s, seed, core, active, t, rng)
        accuracy[t], class_accuracy[t] = _evaluate(tested, tasks, t, s)
    return accuracy, class_accuracy


def _summaries(accuracy, class_accuracy, threshold):
    import numpy as np

    from tfbnn import continual

    tasks = continual.forgetting_summary(accuracy, threshold)
    classes = continual.forgetting_summary(class_accuracy, threshold,
                                           learned_at=np.repeat(np.arange(len(TASKS)), 2))
    return tasks, classes


def _mean_std(values):
    import numpy as np

    values = np.asarray(values, float)
    return float(values.mean()), float(values.std())


def _table_row(method, coreset_size, runs):
    avg = _mean_std([r["tasks"]["average_accuracy"] for r in runs])
    row = {"method": METHOD_LABELS[method], "coreset_per_task": coreset_size, "seeds": len(runs),
           "average_accuracy": avg[0], "average_accuracy_std": avg[1]}
    for key, part in (("forgotten_tasks", "tasks"), ("forgotten_classes", "classes")):
        mean, std = _mean_std([r[part]["num_forgotten"] for r in runs])
        row[key], row[key + "_std"] = mean, std
    row["never_learned_tasks"] = _mean_std([len(r["tasks"]["never_learned"]) for r in runs])[0]
    row["backward_transfer"] = _mean_std([r["tasks"]["backward_transfer"] for r in runs])[0]
    row["mean_forgetting"] = _mean_std([r["tasks"]["mean_forgetting"] for r in runs])[0]
    row["accuracy_last_task"] = _mean_std([r["accuracy"][-1][-1] for r in runs])[0]
    row["train_seconds"] = sum(r["seconds"] for r in runs)
    return row


def _markdown(rows, runs, s):
    import numpy as np

    lines = [f"Split digits, {s['head']}-head, {len(s['seeds'])} seed(s), threshold {s['threshold']:.0%}: "
             "mean over seeds (std).", "",
             "| method | coreset / task | average accuracy | forgotten tasks (of 4) | forgotten classes (of 8) "
             "| never learned tasks | backward transfer | last task accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['coreset_per_task']} | {r['average_accuracy']:.3f} "
                     f"({r['average_accuracy_std']:.3f}) | {r['forgotten_tasks']:.2f} ({r['forgotten_tasks_std']:.2f}) "
                     f"| {r['forgotten_classes']:.2f} ({r['forgotten_classes_std']:.2f}) | "
                     f"{r['never_learned_tasks']:.2f} | {r['backward_transfer']:+.3f} | {r['accuracy_last_task']:.3f} |")
    for (method, k), group in runs.items():
        mean = np.mean([g["accuracy"] for g in group], axis=0)
        lines += ["", f"Accuracy matrix, {METHOD_LABELS[method]}, coreset {k} (row: after task, column: task; "
                      "mean over seeds):", "",
                  "| after \\ on | " + " | ".join(f"{a}{b}" for a, b in TASKS) + " |",
                  "|---" * (len(TASKS) + 1) + "|"]
        for t, row in enumerate(mean):
            cells = ["" if np.isnan(v) else f"{v:.2f}" for v in row]
            lines.append(f"| {''.join(map(str, TASKS[t]))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _grid(runs, s, height):
    """A figure with one panel per (coreset size: row, method: column) and the mean matrix of each."""
    import numpy as np
    from matplotlib.figure import Figure

    rows, cols = list(dict.fromkeys(k for _, k in runs)), list(dict.fromkeys(m for m, _ in runs))
    fig = Figure(figsize=(3.4 * len(cols), height * len(rows) + 0.6), layout="constrained")
    axes = np.array(fig.subplots(len(rows), len(cols), squeeze=False))
    panels = [(axes[rows.index(k), cols.index(m)], (m, k), np.mean([g["accuracy"] for g in group], axis=0))
              for (m, k), group in runs.items()]  # the mean is NaN above the diagonal
    return fig, axes, panels


def _plot(runs, s, folder):
    import numpy as np

    from tfbnn import plots

    labels = ["".join(map(str, c)) for c in TASKS]
    seeds = f"mean over {len(s['seeds'])} seed{'s' if len(s['seeds']) > 1 else ''}"
    fig, axes, panels = _grid(runs, s, 3.3)
    for ax, (method, k), mean in panels:
        image = ax.imshow(np.ma.masked_invalid(mean), vmin=0, vmax=1, cmap="viridis")
        for (i, j), v in np.ndenumerate(mean):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
        ax.set(xticks=range(len(TASKS)), yticks=range(len(TASKS)), xticklabels=labels, yticklabels=labels,
               xlabel="tested on task", ylabel="after task", title=f"{METHOD_LABELS[method]}, coreset {k} / task")
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="accuracy")
    fig.suptitle(f"Split digits, {s['head']}-head: accuracy matrix ({seeds})")
    matrices = plots.save(fig, os.path.join(folder, "accuracy_matrices.png"))

    fig, axes, panels = _grid(runs, s, 2.8)
    for ax, (method, k), mean in panels:
        for j in range(len(TASKS)):
            ax.plot(range(j + 1, len(TASKS) + 1), mean[j:, j], marker="o", label=f"task {labels[j]}")
        ax.axhline(s["threshold"], color="0.5", linestyle="--", linewidth=1)
        ax.set(xlabel="tasks trained", ylabel="accuracy", xticks=range(1, len(TASKS) + 1), ylim=(-0.02, 1.02),
               title=f"{METHOD_LABELS[method]}, coreset {k} / task")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside right center", fontsize=8)
    fig.suptitle(f"Split digits, {s['head']}-head: accuracy on each task as tasks are added ({seeds}; "
                 f"dashed: the {s['threshold']:.0%} threshold)")
    curves = plots.save(fig, os.path.join(folder, "accuracy_curves.png"))
    return [matrices, curves]


def _validate(s):
    """The coreset's limits; a ``quick`` run's settings (:data:`QUICK`, the first seed)."""
    if s["head"] == "multi" and any(s["coreset_sizes"]):
        raise ValueError("The coreset is implemented for the single head only (one 10-way output trained on "
                         f"all coreset classes). Received: head='multi', coreset_sizes={s['coreset_sizes']!r}")
    if max(s["coreset_sizes"]) >= 200:
        raise ValueError("Expected coreset sizes below 200 (a task has about 290 training images). "
                         f"Received: coreset_sizes={s['coreset_sizes']!r}")
    if s["quick"]:
        s.update(QUICK, seeds=s["seeds"][:1])
    return s


def recipes(s):
    """No recipe: this study keeps its own training loop (the module docstring says why)."""
    return []


def train(s, output_dir, verbose):
    """Runs every (coreset size, method, seed) through the five tasks (:func:`run_sequence`).

    Returns:
        dict: ``grouped`` ((method, coreset size) -> the runs) and ``runs`` (one per method, coreset
        size and seed: ``accuracy``, ``class_accuracy``, their :func:`tfbnn.continual.forgetting_summary`
        as ``tasks`` / ``classes``).
    """
    import keras

    grouped, flat = {}, []
    for coreset_size in s["coreset_sizes"]:
        for method in s["methods"]:
            for seed in s["seeds"]:
                tasks = split_tasks(datasets.load_digits(seed=seed), s["head"])
                start = time.perf_counter()
                accuracy, class_accuracy = run_sequence(method, s, tasks, coreset_size, seed)
                task_summary, class_summary = _summaries(accuracy, class_accuracy, s["threshold"])
                run_record = {"method": method, "coreset_per_task": coreset_size, "seed": seed,
                              "accuracy": accuracy.tolist(), "class_accuracy": class_accuracy.tolist(),
                              "tasks": task_summary, "classes": class_summary,
                              "seconds": time.perf_counter() - start}
                grouped.setdefault((method, coreset_size), []).append(run_record)
                flat.append(run_record)
                keras.backend.clear_session()
                if verbose:
                    print(f"  {METHOD_LABELS[method]:20s} coreset {coreset_size:3d} seed {seed}: final "
                          f"{[round(float(v), 2) for v in accuracy[-1]]}  average {task_summary['average_accuracy']:.3f}  "
                          f"forgotten tasks {task_summary['forgotten']} classes {class_summary['forgotten']}  "
                          f"({run_record['seconds']:.0f} s)", flush=True)
    return {"grouped": grouped, "runs": flat}


def analyse(trained, s, output_dir, verbose):
    """The table (means over seeds; ``results.csv`` / ``.md`` / ``.json``) and the plots.

    Returns:
        dict with ``rows`` (one per method and coreset size, means over seeds), ``runs`` and ``files``.
    """
    grouped, flat = trained["grouped"], trained["runs"]
    rows = [_table_row(method, k, group) for (method, k), group in grouped.items()]
    written = _plot(grouped, s, output_dir)
    written += _common.write_results(output_dir, rows, s, tasks=[list(c) for c in TASKS], runs=flat)
    written.append(files.write_text(os.path.join(output_dir, "results.md"), _markdown(rows, grouped, s)))
    return {"rows": rows, "runs": flat, "files": written}


STUDY = Study(
    name="vcl-split-digits", module="tfbnn.experiments.vcl_split_digits", description=DESCRIPTION, settings=SETTINGS,
    recipes=recipes, train=train, analyse=analyse, outputs="the PNGs and results.csv / .md / .json",
    validate=_validate,
    banner=lambda s: (f"{NAME}: 5 tasks, {s['head']}-head, methods {list(s['methods'])}, coreset "
                      f"{list(s['coreset_sizes'])} per task, seeds {list(s['seeds'])}"),
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
