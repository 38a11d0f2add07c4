"""The numeric side of ``tfbnn kerashub-finetune`` (:mod:`tfbnn.experiments.kerashub_finetune`).

:data:`METHODS` is the table of methods: name -> :class:`HubMethod` (a label and
``fit(context) -> predict``, ``predict(x)`` the ``(n, K)`` predictive probabilities of the
task's inputs ``x``). Every method starts from the same fine-tuned (MAP) task; a method that
changes weights (LoRA) works on its own copy, built from the task's config.
"""

import dataclasses
import os
import time

import keras
import numpy as np
from matplotlib.figure import Figure

import tfbnn
from tfbnn import hub, lora, metrics, plots, training
from tfbnn._internal import files, keras_private
from tfbnn.datasets import DataPipeline, text
from tfbnn.experiments import _common
from tfbnn.inference import entropy

__all__ = ["HubMethod", "Context", "METHODS", "load", "build_task", "bayesian_head_task", "predict_all", "tables", "markdown", "write"]

_NUM_IN_CLASSES = 8  # the image task's digits 0-7; 8-9 are its OOD set
_QUICK_TRAIN, _QUICK_TEST = 160, 48


@dataclasses.dataclass(frozen=True)
class HubMethod:
    """One method: its label in the table and ``fit(context) -> predict(x) -> (n, K) probs``."""

    label: str
    fit: object


class Context:
    """What a method's ``fit`` gets: the settings ``s``, the model kind, the fine-tuned ``task`` and its
    training data ``x, y`` (``n`` examples)."""

    def __init__(self, s, kind, task, x, y):
        self.s, self.kind, self.task, self.x, self.y = s, kind, task, x, y
        self.n = len(y)

    def copy(self):
        """A new task of the same config with the fine-tuned weights."""
        clone = type(self.task).from_config(self.task.get_config())
        clone.set_weights(self.task.get_weights())
        return clone

    def fit(self, model, method, x, y, epochs):
        """Trains ``model`` (logits out) as :func:`tfbnn.training.run` trains the registered ``method``
        (:func:`tfbnn.training.fit_model`): Adam at ``learning_rate`` on the logits' cross-entropy, batches of
        ``batch_size`` reshuffled every epoch (seeded), the method's callbacks and, for a Bayesian method, its
        KL at beta = 1 (``kl_weight = 1 / N``, ``N`` the examples ``x``)."""
        recipe = training.Recipe(
            name=f"kerashub-{self.kind}-{method}", model="kerashub_bert" if self.kind == "text" else "kerashub_vit",
            method=method, dataset=self.kind, optimizer="adam", learning_rate=self.s["learning_rate"], epochs=epochs,
            batch_size=self.s["batch_size"], kl_schedule="constant", beta=1.0, seed=self.s["seed"])
        data = DataPipeline(train=(x, y), validation=None, test=None, num_examples=len(y), num_validation=0,
                            num_test=0, num_classes=None, input_shape=(), name=self.kind,
                            batch_size=self.s["batch_size"])
        training.fit_model(model, recipe, data, from_logits=True)
        return model


def _softmax(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _fit_map(context):
    return lambda x: _softmax(np.asarray(context.task.predict(x, batch_size=256, verbose=0), np.float64))


def _fit_laplace(context):
    la = hub.last_layer_laplace(context.task, context.x, context.y)
    return lambda x: la.predict(hub.pooled_features(context.task, x, batch_size=256))


def bayesian_head_task(task, num_examples, seed=None, init_scale=1e-3):
    """``x -> softmax(f(x))`` with ``f`` the task under :func:`tfbnn.hub.bayesian_head` (its head Flipout Bayes by
    Backprop, posterior means at the fine-tuned weights, the backbone shared and frozen), class probabilities out:
    one model that :func:`tfbnn.predict` and :func:`tfbnn.export.export` take as they are. It shares (and freezes)
    ``task``'s backbone: pass a copy to keep ``task`` trainable."""
    logits = hub.bayesian_head(task, "flipout", num_examples=num_examples, init_scale=init_scale, seed=seed)
    probs = keras.layers.Softmax(name="probs")(logits.outputs[0])
    return keras.Model(logits.input, probs, name=f"{task.name}_bbb_head")


def _fit_bbb_head(context):
    """The head as Flipout Bayes by Backprop (:func:`tfbnn.hub.bayesian_head`, posterior means at the fine-tuned
    weights) on a copy of the task, whose backbone it shares and freezes. The backbone is frozen and
    deterministic at prediction, so the head trains on the ELBO over the pooled features computed once (the same
    head layer, ``Input(d) -> head``), and the predictive is the head's over those features: what
    ``tfbnn.predict(bnn, x)`` computes, without running the backbone T times."""
    bnn = hub.bayesian_head(context.copy(), "flipout", num_examples=context.n, seed=context.s["seed"])
    head = keras_private.output_layer(bnn)
    features = hub.pooled_features(context.task, context.x)
    on_features = keras.Sequential([keras.Input(features.shape[1:]), head], name=f"{bnn.name}_on_features")
    context.fit(on_features, "bbb", features, context.y, context.s["head_epochs"])
    samples = context.s["num_samples"]
    return lambda x: tfbnn.predict(on_features, hub.pooled_features(context.task, x, batch_size=256),
                                   num_samples=samples, from_logits=True).mean_probs


def _lora_task(context):
    """A copy of the task with rank-r LoRA on its attention query and value projections."""
    task = context.copy()
    task.backbone.enable_lora(context.s["lora_rank"])
    return task


def _fit_laplace_lora(context):
    task = context.fit(_lora_task(context), "deterministic", context.x, context.y, context.s["adapter_epochs"])
    la = lora.fit_laplace(task, context.x, context.y, likelihood="classification", hessian="diag")
    la = la.optimize_prior_precision(method="marglik")
    return lambda x: la.predict(x)


def _variational_adapters(task, kl_weight, seed):
    """BLoB around ``task``: :class:`tfbnn.lora.VariationalLoRAModel`, a Gaussian ``q(A)`` over each attention's LoRA
    query and value projections (nested in KerasHub's subclassed blocks; the task's layers are shared)."""
    return lora.variational(task, kl_weight=kl_weight, seed=seed)


def _fit_blob(context):
    model = _variational_adapters(_lora_task(context), 1.0 / context.n, context.s["seed"])
    context.fit(model, "blob", context.x, context.y, context.s["adapter_epochs"])
    samples = context.s["num_samples"]
    return lambda x: tfbnn.predict(model, x, num_samples=samples, batch_size=256, from_logits=True).mean_probs


def _fit_mc_dropout(context):
    samples = context.s["num_samples"]
    return lambda x: tfbnn.predict(context.task, x, num_samples=samples, batch_size=256, mc_dropout=True,
                                   from_logits=True).mean_probs


def _fit_ensemble(context):
    members = context.s["members"]
    heads = hub.ensemble_heads(context.task, members, seed=context.s["seed"])
    context.fit(heads, "deterministic", hub.pooled_features(context.task, context.x),
                hub.tile_labels(context.y, members), context.s["head_epochs"])
    model = hub.ensemble_model(context.task, heads)
    return lambda x: np.asarray(model.predict(x, batch_size=256, verbose=0), np.float64)


#: The methods: name -> :class:`HubMethod`, in the table's order.
METHODS = {
    "map": HubMethod("MAP (fine-tuning)", _fit_map),
    "laplace": HubMethod("last-layer Laplace", _fit_laplace),
    "bbb_head": HubMethod("BbB head", _fit_bbb_head),
    "laplace_lora": HubMethod("Laplace-LoRA", _fit_laplace_lora),
    "blob": HubMethod("BLoB (variational LoRA)", _fit_blob),
    "mc_dropout": HubMethod("MC dropout", _fit_mc_dropout),
    "ensemble": HubMethod("ensemble of heads", _fit_ensemble),
}


# -- data and models --------------------------------------------------------------------------------


def _subset(x, index):
    return {k: v[index] for k, v in x.items()} if isinstance(x, dict) else x[index]


def _bert_inputs(token_ids):
    token_ids = np.asarray(token_ids, np.int32)
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
            "padding_mask": (token_ids != 0).astype(np.int32)}


def _text(s):
    """Synthetic reviews as BERT inputs; OOD: as many reviews of uniformly random tokens."""
    n = 2000 if not s["quick"] else _QUICK_TRAIN + _QUICK_TEST
    ds = text.make_synthetic_reviews(num_examples=n, seed=s["seed"], test_fraction=0.2 if not s["quick"]
                                               else _QUICK_TEST / n)
    vectorizer = keras.layers.TextVectorization(max_tokens=256, output_sequence_length=s["sequence_length"])
    vectorizer.adapt(ds.x_train.astype(str))
    ids = lambda texts: np.asarray(vectorizer(texts.astype(str)))  # noqa: E731
    x_train, x_test = ids(ds.x_train), ids(ds.x_test)
    vocab = vectorizer.vocabulary_size()
    rng = np.random.default_rng(s["seed"] + 1)
    ood = rng.integers(2, vocab, size=x_test.shape)  # 0 padding, 1 out-of-vocabulary
    return {"x_train": _bert_inputs(x_train), "y_train": ds.y_train.astype(np.int32),
            "x_test": _bert_inputs(x_test), "y_test": ds.y_test.astype(np.int32), "x_ood": _bert_inputs(ood),
            "num_classes": 2, "vocabulary_size": vocab, "ood": "random-token reviews (synthetic)"}


def _image(s):
    """The 8x8 digits 0-7 (in [0, 1]); OOD: the test digits 8 and 9 (held-out classes)."""
    ds = tfbnn.datasets.load_images("digits", seed=s["seed"])
    train, test = np.flatnonzero(ds.y_train < _NUM_IN_CLASSES), np.flatnonzero(ds.y_test < _NUM_IN_CLASSES)
    ood = np.flatnonzero(ds.y_test >= _NUM_IN_CLASSES)
    if s["quick"]:
        train, test, ood = train[:_QUICK_TRAIN], test[:_QUICK_TEST], ood[:_QUICK_TEST]
    f = lambda x: np.asarray(x, np.float32)  # noqa: E731
    return {"x_train": f(ds.x_train[train]), "y_train": ds.y_train[train].astype(np.int32),
            "x_test": f(ds.x_test[test]), "y_test": ds.y_test[test].astype(np.int32), "x_ood": f(ds.x_test[ood]),
            "num_classes": _NUM_IN_CLASSES, "ood": "held-out digits 8-9"}


def load(kind, s):
    """The data of the ``kind`` task (``"text"`` or ``"image"``): a dict of ``x_train, y_train, x_test,
    y_test, x_ood`` (the task's inputs), ``num_classes`` and ``ood`` (what the OOD set is)."""
    return _text(s) if kind == "text" else _image(s)


def build_task(kind, data, s):
    """The tiny KerasHub classifier of ``kind``, from its config (random weights, seeded by ``seed``).

    ``text``: ``BertBackbone`` (2 layers, 2 heads, width 16, feed-forward 32) and
    ``BertTextClassifier``; ``image``: ``ViTBackbone`` (8x8x1 images, 2x2 patches, 1 layer, 2 heads,
    width 16, MLP 32) and ``ViTImageClassifier``. Both without preprocessor, ``dropout_rate`` in the
    backbone and before the head.
    """
    import keras_hub

    keras.utils.set_random_seed(s["seed"])
    rate = s["dropout_rate"]
    if kind == "text":
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=data["vocabulary_size"], num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
            max_sequence_length=s["sequence_length"], dropout=rate)
        return keras_hub.models.BertTextClassifier(backbone=backbone, preprocessor=None,
                                                   num_classes=data["num_classes"], dropout=rate)
    backbone = keras_hub.models.ViTBackbone(image_shape=(8, 8, 1), patch_size=2, num_layers=1, num_heads=2,
                                            hidden_dim=16, mlp_dim=32, dropout_rate=rate, attention_dropout=0.0)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, preprocessor=None, num_classes=data["num_classes"],
                                               dropout=rate)


def _concatenate(a, b):
    if isinstance(a, dict):
        return {k: np.concatenate([a[k], b[k]]) for k in a}
    return np.concatenate([a, b])


def predict_all(s, verbose=False):
    """Fine-tunes each model of ``s["models"]`` and fits every method of ``s["methods"]``.

    Returns:
        ``{kind: {"y_test": labels, "ood": str, "probs": {method: {"test": (n, K), "ood": (m, K)}}}}``.
    """
    out = {}
    for kind in s["models"]:
        start = time.perf_counter()
        data = load(kind, s)
        task = build_task(kind, data, s)
        context = Context(s, kind, task, data["x_train"], data["y_train"])
        context.fit(task, "deterministic", data["x_train"], data["y_train"], s["epochs"])
        if verbose:
            print(f"{kind}: {type(task).__name__} ({task.count_params()} weights) fine-tuned on {context.n} examples "
                  f"for {s['epochs']} epochs in {time.perf_counter() - start:.1f} s", flush=True)
        everything = _concatenate(data["x_test"], data["x_ood"])
        num_test = len(data["y_test"])
        probs = {}
        for i, name in enumerate(s["methods"], 1):
            start = time.perf_counter()
            keras.utils.set_random_seed(s["seed"])
            # float32, as predictions.npz keeps them: the table is what the stored probabilities give
            p = np.asarray(METHODS[name].fit(context)(everything), np.float32).astype(np.float64)
            probs[name] = {"test": p[:num_test], "ood": p[num_test:]}
            if verbose:
                print(f"  [{i}/{len(s['methods'])}] {METHODS[name].label}: fitted and predicted in "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
        out[kind] = {"y_test": data["y_test"], "ood": data["ood"], "probs": probs}
        keras.backend.clear_session()
    return out


# -- the numbers -------------------------------------------------------------------------------------


def tables(results, s):
    """One row per model and method: accuracy, NLL and ECE on the test set, and the AUROC of telling the
    OOD set from it by the predictive entropy (OOD the positive class)."""
    rows = []
    for kind, result in results.items():
        y = result["y_test"]
        for name, p in result["probs"].items():
            rows.append({"model": kind, "method": METHODS[name].label, "accuracy": metrics.accuracy(p["test"], y),
                         "nll": metrics.negative_log_likelihood(p["test"], y),
                         "ece": metrics.expected_calibration_error(p["test"], y, num_bins=s["ece_bins"]),
                         "ood_auroc": metrics.auroc(entropy(p["test"]), entropy(p["ood"])), "ood": result["ood"]})
    return rows


_HEADER = ("model", "method", "accuracy", "NLL", "ECE", "OOD AUROC", "OOD set")


def markdown(table):
    """The table as Markdown."""
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    for r in table:
        numbers = [f"{r[k]:.3f}" for k in ("accuracy", "nll", "ece", "ood_auroc")]
        lines.append("| " + " | ".join([r["model"], r["method"], *numbers, r["ood"]]) + " |")
    return "\n".join(lines) + "\n"


def reliability_figure(results, num_bins):
    """Accuracy against confidence (bins with examples), one line per method, one panel per model."""
    fig = Figure(figsize=(5.5 * len(results), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(results)))
    for ax, (kind, result) in zip(axes, results.items()):
        ax.plot([0, 1], [0, 1], color="gray", linestyle=":", label="calibrated")
        for name, p in result["probs"].items():
            d = metrics.reliability_diagram(p["test"], result["y_test"], num_bins=num_bins)
            kept = d.count > 0
            ax.plot(d.confidence[kept], d.accuracy[kept], marker="o", markersize=3, label=METHODS[name].label)
        ax.set(xlabel="confidence", ylabel="accuracy", title=f"{kind}: accuracy vs confidence", xlim=(0, 1),
               ylim=(0, 1.02))
        ax.legend(fontsize=7)
    return fig


def write(results, s, output_dir):
    """Writes the table, the plot and the probabilities; returns ``(table, markdown, files)``."""
    table = tables(results, s)
    text = markdown(table)
    arrays = {f"{kind}|{name}|{split}": p[split].astype(np.float32)
              for kind, r in results.items() for name, p in r["probs"].items() for split in ("test", "ood")}
    labels = {f"{kind}|y_test": r["y_test"] for kind, r in results.items()}
    path = os.path.join(output_dir, "predictions.npz")
    np.savez_compressed(path, **labels, **arrays)
    written = [
        _common.write_csv(os.path.join(output_dir, "table.csv"), table),
        _common.write_json(os.path.join(output_dir, "table.json"), {"settings": _common.jsonable(s), "table": table}),
        files.write_text(os.path.join(output_dir, "table.md"), text),
        plots.save(reliability_figure(results, s["ece_bins"]), os.path.join(output_dir, "reliability.png")),
        path,
    ]
    return table, text, written
