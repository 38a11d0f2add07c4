"""A Transformer-encoder text classifier with a Bayesian feed-forward block.

The model is the zoo's :func:`tfbnn.models.transformer` (``keras.layers.TextVectorization``
outside it, max length 120, embedding 32): token + position embedding, one encoder
block (multi-head self-attention, residual + LayerNorm, feed-forward ``ff1`` (ReLU) ->
``ff2``, residual + LayerNorm), global average pooling, softmax. The feed-forward block
is deterministic (``keras.layers.Dense``), sparse variational dropout
(:class:`tfbnn.layers.DenseVariationalDropout`) or Bayes-by-Backprop
(:class:`tfbnn.layers.DenseLocalReparameterization`), the ``variants``; every other
layer, the head included, stays deterministic.

The experiment follows the sparsity study's path: train the deterministic model,
convert only its feed-forward block (:func:`tfbnn.convert.to_bayesian` with
``layers=["ff1", "ff2"]``; attention, embeddings and norms are kept), train on
``mean NLL + beta KL / N`` with beta warmed up and annealed, and report Monte Carlo
accuracy (T samples, mean +- std over repeats), NLL, ECE, the feed-forward block's
sparsity and accuracy with principled vs random pruning of that block. The
deterministic baseline trains for as many epochs more.

Data: IMDB reviews via tensorflow-datasets (``--dataset imdb``, downloads on first
use; offline tests run it under ``tfds.testing.mock_data``) or the offline generated
``synthetic_reviews``.

Outputs (``--output-dir``, default ``saved_models/experiments/vd_transformer/<dataset>/``):
``results.png``, ``results.csv``, ``results.json``.
"""

import os

import tfbnn
from tfbnn import training
from tfbnn._internal.errors import RunError
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study


def __getattr__(name):
    """The zoo's builder (:func:`tfbnn.models.transformer`, also under its old name here) and
    embedding layer, loaded on first use so that listing the command's parsers needs no TensorFlow."""
    if name in ("build_transformer_classifier", "TokenAndPositionEmbedding"):
        from tfbnn import models

        return models.transformer if name == "build_transformer_classifier" else models.TokenAndPositionEmbedding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["STUDY", "DEFAULTS", "FEED_FORWARD", "make_recipe", "TokenAndPositionEmbedding", "build_transformer_classifier",
           "run_experiment", "add_arguments", "run", "main"]

NAME = "vd_transformer"
FEED_FORWARD = ("deterministic", "vd", "bbb")
DATASETS = ("imdb", "synthetic_reviews")

SETTINGS = (
    Setting("dataset", "imdb", "imdb (tensorflow-datasets, downloads on first use) or the offline synthetic_reviews",
            choices=DATASETS),
    Setting("variants", FEED_FORWARD, "feed-forward blocks to compare", choices=FEED_FORWARD, many=True, unique=True),
    Setting("max_examples", None, "training reviews to use (synthetic_reviews: reviews generated, default 4000)"),
    Setting("max_test_examples", None, "test reviews to use (imdb)"),
    Setting("vocab_size", 20000, "TextVectorization max_tokens", kind="positive_int"),
    Setting("max_length", 120, "tokens per review", kind="positive_int"),
    Setting("embed_dim", 32, "embedding size", kind="positive_int"),
    Setting("num_heads", 2, "attention heads", kind="positive_int"),
    Setting("ff_dim", 32, "feed-forward hidden units", kind="positive_int"),
    Setting("dropout", 0.1, "dropout rate of the transformer block", kind="rate"),
    Setting("pretrain_epochs", 2), Setting("epochs", 2, "epochs after conversion"), Setting("warmup_epochs", 0.25),
    Setting("anneal_epochs", 1.0, "epochs of the beta ramp 0 -> 1 after the warm-up", recipe="kl_epochs"),
    Setting("batch_size", 32), Setting("learning_rate", 1e-3, "Adam rate"), Setting("init_scale", "moped"),
    Setting("moped_delta", 0.1), Setting("num_samples", 10, "MC samples per prediction"),
    Setting("repeats", 3, "MC repeats (error bars)", kind="positive_int"), Setting("seed", 0),
)

DESCRIPTION = (
    "Transformer-encoder text classifier (TextVectorization, max length 120, embedding 32) whose\n"
    "feed-forward block is deterministic, sparse variational dropout or Bayes-by-Backprop: train the\n"
    "deterministic model, convert the feed-forward block, anneal the KL, and report MC accuracy, NLL,\n"
    "ECE, the block's sparsity and principled vs random pruning. IMDB via tensorflow-datasets, or the\n"
    "offline synthetic_reviews. Writes results.png next to results.csv / results.json."
)


# -- the experiment -------------------------------------------------------------------------------
def _load(s):
    from tfbnn.datasets import text

    if s["dataset"] == "synthetic_reviews":
        return text.make_synthetic_reviews(num_examples=s["max_examples"] or 4000, seed=s["seed"])
    try:
        return text.load_imdb(max_examples=s["max_examples"], max_test_examples=s["max_test_examples"])
    except RuntimeError as e:
        raise RunError(str(e)) from None


def _vectorize(s, ds):
    import keras
    import numpy as np

    vectorizer = keras.layers.TextVectorization(max_tokens=s["vocab_size"], output_sequence_length=s["max_length"])
    vectorizer.adapt(ds.x_train.astype(str))
    to_ids = lambda texts: np.asarray(vectorizer(texts.astype(str)), dtype=np.int32)  # noqa: E731
    return to_ids(ds.x_train), to_ids(ds.x_test), len(vectorizer.get_vocabulary())


def make_recipe(variant, vocabulary, **settings):
    """The :class:`tfbnn.training.Recipe` of one feed-forward variant.

    The settings (:data:`DEFAULTS`, overridden by ``settings``) become recipe fields: the zoo's
    ``transformer`` (``vocabulary`` tokens, ``max_length``, ``embed_dim``, ``num_heads``,
    ``ff_dim``, ``dropout``) pre-trained deterministically ``pretrain_epochs``, then its
    feed-forward block (``ff1``, ``ff2``) converted (``convert_layers``; ``vd``: sparse VD,
    ``bbb``: local reparameterization; ``init_scale``, ``moped_delta``) and trained ``epochs``
    with the KL weight 0 for ``warmup_epochs`` then linear to 1 over ``anneal_epochs``; the
    deterministic variant goes on ``epochs`` with a fresh optimizer. Adam at ``learning_rate``,
    ``batch_size``, ``num_samples`` test samples, seed ``seed``.
    """
    return _recipe(variant, vocabulary, STUDY.resolve(settings))


def _recipe(variant, vocabulary, s):
    options = {}
    if variant != "deterministic":
        options = {"convert_layers": ("ff1", "ff2"), "init_scale": s["init_scale"], "moped_delta": s["moped_delta"]}
        if variant == "bbb":
            options["estimator"] = "local_reparameterization"
    return training.Recipe(
        name=variant, description=f"Transformer classifier, {variant} feed-forward block",
        reference="Molchanov et al. 2017 (sparse VD); Blundell et al. 2015", model="transformer",
        model_options={"vocab_size": vocabulary, "max_length": s["max_length"], "embed_dim": s["embed_dim"],
                       "num_heads": s["num_heads"], "ff_dim": s["ff_dim"], "dropout": s["dropout"]},
        method=variant, method_options=options, dataset=s["dataset"], pretrain_epochs=s["pretrain_epochs"],
        epochs=s["epochs"], batch_size=s["batch_size"], learning_rate=s["learning_rate"],
        kl_schedule="warmup" if s["warmup_epochs"] else "linear", warmup_epochs=s["warmup_epochs"],
        kl_epochs=s["anneal_epochs"], eval_samples=s["num_samples"], seed=s["seed"],
    )


def _evaluate(s, model, x_test, y_test, variant):
    import numpy as np

    from tfbnn import metrics, pruning

    def mc(masks=None):
        def once():
            if variant == "deterministic":
                return model.predict(x_test, batch_size=256, verbose=0)
            return tfbnn.predict(model, x_test, num_samples=s["num_samples"], batch_size=64,
                                 task="classification").mean_probs

        if masks is None:
            return once()
        with pruning.pruned(model, masks):
            return once()

    repeats = 1 if variant == "deterministic" else s["repeats"]
    probs = [mc() for _ in range(repeats)]
    accuracy = [float(np.mean(p.argmax(-1) == y_test)) for p in probs]
    row = {
        "variant": variant,
        "accuracy": float(np.mean(accuracy)),
        "accuracy_std": float(np.std(accuracy, ddof=1)) if repeats > 1 else 0.0,
        "nll": float(np.mean(metrics.negative_log_likelihood(probs[0], y_test))),
        "ece": float(metrics.expected_calibration_error(probs[0], y_test)),
        "ff_sparsity": 0.0,
        "accuracy_principled": None,
        "accuracy_random": None,
    }
    if variant != "deterministic":
        masks = pruning.compute_masks(model)
        row["ff_sparsity"] = pruning.sparsity(masks)
        row["accuracy_principled"] = float(np.mean(mc(masks).argmax(-1) == y_test))
        row["accuracy_random"] = float(np.mean(mc(pruning.random_masks(masks, seed=s["seed"])).argmax(-1) == y_test))
    return row


def _plot(rows, path, title):
    from matplotlib.figure import Figure

    from tfbnn import plots

    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    names = [r["variant"] for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.25 for x in xs], [r["accuracy"] for r in rows], width=0.25, yerr=[r["accuracy_std"] for r in rows],
           capsize=3, label="no pruning")
    ax.bar(xs, [r["accuracy_principled"] or 0 for r in rows], width=0.25, label="principled pruning")
    ax.bar([x + 0.25 for x in xs], [r["accuracy_random"] or 0 for r in rows], width=0.25, label="random pruning")
    ax.set_xticks(list(xs), [f"{n}\n({100 * r['ff_sparsity']:.0f}% FF pruned)" if n != "deterministic" else n
                             for n, r in zip(names, rows)])
    ax.set(ylabel="test accuracy", title=title, ylim=(0.0, 1.0))
    ax.legend(fontsize=8, loc="lower right")
    ax2.bar([x - 0.2 for x in xs], [r["nll"] for r in rows], width=0.4, label="NLL")
    ax2.bar([x + 0.2 for x in xs], [r["ece"] for r in rows], width=0.4, label="ECE")
    ax2.set_xticks(list(xs), names)
    ax2.set(title="NLL and ECE (lower is better)")
    ax2.legend(fontsize=8)
    plots.save(fig, path)
    return path


def _validate(s):
    """The conversion's ``init_scale`` with ``moped_delta`` (:func:`tfbnn.convert.check_init_scale`)."""
    from tfbnn import convert

    convert.check_init_scale(s["init_scale"], s["moped_delta"])
    return s


def recipes(s, vocabulary=None):
    """The study's recipes for the checked settings ``s``: one per variant. ``vocabulary``: the tokens the
    vectorizer kept (default ``vocab_size``, their upper bound; the run knows them after adapting it)."""
    return [_recipe(variant, s["vocab_size"] if vocabulary is None else vocabulary, s) for variant in s["variants"]]


def _folder(s):
    return os.path.join(NAME, s["dataset"])


def train(s, output_dir, verbose):
    """Vectorizes the reviews and trains each recipe of :func:`recipes` (one :func:`tfbnn.training.run`, its
    folder under ``<output_dir>/runs/``), each pre-training the deterministic transformer from the same
    seed; the MC accuracy, NLL, ECE and pruning numbers are its ``evaluate``.

    Returns:
        dict: ``rows`` (one per variant), ``runs``, ``vocabulary`` and the dataset ``dataset``.
    """
    import keras

    keras.utils.set_random_seed(s["seed"])
    say = print if verbose else (lambda *a, **k: None)
    ds = _load(s)
    x_train, x_test, vocabulary = _vectorize(s, ds)
    say(f"{NAME}: {ds.name}, N = {ds.num_examples} train / {ds.num_test_examples} test, vocabulary {vocabulary}",
        flush=True)
    data = _common.array_pipeline(x_train, ds.y_train, ds.name, s["batch_size"], 2, ds.num_test_examples)
    rows, runs = [], []
    for recipe in recipes(s, vocabulary):
        variant = recipe.method

        def evaluate(model, recipe, data, variant=variant):
            return _evaluate(s, model, x_test, ds.y_test, variant)

        result = training.run(recipe, output_dir=os.path.join(output_dir, "runs", variant), verbose=0, data=data,
                              evaluate=evaluate, quiet=True)
        runs.append(result.output_dir)
        row = dict(result.test)
        row["seconds"] = result.train_seconds
        rows.append(row)
        pruned = ("" if variant == "deterministic" else
                  f"  FF sparsity {100 * row['ff_sparsity']:.1f}%: principled {row['accuracy_principled']:.4f}, "
                  f"random {row['accuracy_random']:.4f}")
        say(f"  {variant:13s} accuracy {row['accuracy']:.4f} +- {row['accuracy_std']:.4f}  NLL {row['nll']:.4f}  "
            f"ECE {row['ece']:.4f}{pruned}  ({row['seconds']:.0f} s)", flush=True)
    return {"rows": rows, "runs": runs, "vocabulary": vocabulary, "dataset": ds}


def analyse(trained, s, output_dir, verbose):
    """``results.png``, ``results.csv`` and ``results.json``.

    Returns:
        dict with ``rows`` (one per variant), ``vocabulary_size``, ``files`` and ``runs``.
    """
    rows, ds, vocabulary = trained["rows"], trained["dataset"], trained["vocabulary"]
    title = f"{ds.name}: Transformer, Bayesian feed-forward block"
    files = [_plot(rows, os.path.join(output_dir, "results.png"), title),
             *_common.write_results(output_dir, rows, s, dataset={
                 "name": ds.name, "num_examples": ds.num_examples, "num_test_examples": ds.num_test_examples,
                 "vocabulary": vocabulary})]
    return {"rows": rows, "vocabulary_size": vocabulary, "files": files, "runs": trained["runs"]}


STUDY = Study(
    name="vd-transformer", module="tfbnn.experiments.vd_transformer", description=DESCRIPTION, settings=SETTINGS,
    recipes=recipes, train=train, analyse=analyse, outputs="results.png, results.csv and results.json",
    folder=_folder, validate=_validate,
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
