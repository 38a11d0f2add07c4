"""Uncertainty for a fine-tuned KerasHub model: seven ways to add it, on a text and an image task.

Issue 30, item 4. Two tiny KerasHub classifiers built from their configs (random weights,
no ``from_preset``, nothing downloads), each fine-tuned and then made uncertain in seven
ways (:mod:`tfbnn.hub`, :mod:`tfbnn.lora`):

* ``text``: a 2-layer BERT (``keras_hub.models.BertBackbone`` + ``BertTextClassifier``,
  ``preprocessor=None``) on the offline synthetic reviews (:func:`tfbnn.datasets.make_synthetic_reviews`,
  the ``synthetic_reviews`` recipe's data), token ids from a ``TextVectorization`` adapted on the
  training reviews fed straight in. OOD: synthetic inputs, reviews of uniformly random tokens.
* ``image``: a 1-layer ViT (``ViTBackbone`` + ``ViTImageClassifier``, patches of 2x2) on the
  offline 8x8 digits, trained on digits 0-7. OOD: the held-out classes, test digits 8-9.

The methods (:data:`tfbnn.experiments._kerashub_finetune.METHODS`):

==================  ===================================================================
``map``             plain fine-tuning (every weight, dropout on in training): softmax of the logits
``laplace``         last-layer Laplace (KFAC) on the pooled features, prior precision by the
                    marginal likelihood, probit predictive (:func:`tfbnn.hub.last_layer_laplace`)
``bbb_head``        the head made Bayes by Backprop (Flipout, means at the MAP weights) and trained on
                    the ELBO over the frozen backbone's pooled features (:func:`tfbnn.hub.bayesian_head`)
``laplace_lora``    rank-r LoRA on the attention query/value projections (``backbone.enable_lora``),
                    the adapter fine-tuned from the MAP model, then Laplace-LoRA (diagonal GGN over the
                    factors, prior by the marginal likelihood, GLM probit predictive; Yang et al. 2024)
``blob``            the same adapter trained on the ELBO with a Gaussian ``A`` factor
                    (:class:`tfbnn.lora.VariationalLoRA`, BLoB; Wang et al. 2024)
``mc_dropout``      the MAP model with its backbone's own dropout kept on (Gal & Ghahramani 2016)
``ensemble``        M heads over the frozen backbone (:func:`tfbnn.hub.ensemble_heads`)
==================  ===================================================================

Outputs (``--output-dir``, default ``saved_models/experiments/kerashub_finetune/``):
``table.csv`` / ``table.json`` / ``table.md`` (rows: model x method; accuracy, NLL, ECE on the
in-distribution test set, OOD AUROC with the predictive entropy as the score, which OOD set),
``reliability.png`` (accuracy against confidence per method, one panel per model) and
``predictions.npz`` (every method's probabilities on the test and OOD sets, with the labels).
``--quick`` is a smoke run of a few seconds (tiny data, one epoch).

Why this study keeps its own training loop (``model.fit`` in ``_kerashub_finetune.Context``) and lists no
:class:`tfbnn.training.Recipe`: a recipe names a zoo model, and KerasHub tasks are not in the zoo
(keras-hub is an optional extra); every method also starts from the one fine-tuned model rather
than from a recipe of its own.

Run: ``tfbnn kerashub-finetune`` or ``python -m tfbnn.experiments.kerashub_finetune``. Needs
keras-hub (the ``hub`` extra).

References:
    Daxberger et al. Laplace Redux -- Effortless Bayesian Deep Learning. NeurIPS 2021.
    Yang, Robeyns, Wang, Aitchison. Bayesian Low-rank Adaptation for Large Language Models. ICLR 2024.
    Wang, Shi, Han, Metaxas, Wang. BLoB: Bayesian Low-Rank Adaptation by Backpropagation for
    Large Language Models. NeurIPS 2024.
    Blundell et al. Weight Uncertainty in Neural Networks. ICML 2015.
    Gal, Ghahramani. Dropout as a Bayesian Approximation. ICML 2016.
    Lakshminarayanan, Pritzel, Blundell. Simple and Scalable Predictive Uncertainty Estimation
    using Deep Ensembles. NeurIPS 2017.
"""

from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "DEFAULT_METHODS", "MODELS", "run_experiment", "add_arguments", "run", "main"]

#: The methods, in the table's order (the names of ``_kerashub_finetune.METHODS``).
DEFAULT_METHODS = ("map", "laplace", "bbb_head", "laplace_lora", "blob", "mc_dropout", "ensemble")
#: The two KerasHub tasks.
MODELS = ("text", "image")

SETTINGS = (
    Setting("models", MODELS, "text: BERT on synthetic reviews; image: ViT on the digits", choices=MODELS,
            many=True, unique=True, metavar="NAME"),
    Setting("methods", DEFAULT_METHODS, "methods to compare", choices=DEFAULT_METHODS, many=True, unique=True,
            metavar="NAME"),
    Setting("epochs", 8, "epochs of plain fine-tuning (the MAP model every method starts from)"),
    Setting("adapter_epochs", 4, "epochs of the LoRA adapter (Laplace-LoRA, BLoB) after the MAP model",
            kind="positive_int"),
    Setting("head_epochs", 20, "epochs of the heads on the frozen backbone's pooled features (BbB head, ensemble)",
            kind="positive_int"),
    Setting("batch_size", 32), Setting("learning_rate", 1e-3),
    Setting("lora_rank", 4, "rank r of the LoRA adapters", kind="positive_int", metavar="R"),
    Setting("dropout_rate", 0.1, "dropout of the backbones and of the classifier (MC dropout keeps it on)"),
    Setting("members", 5, "ensemble: heads"),
    Setting("num_samples", 30, "Monte Carlo samples of the predictive (BbB head, BLoB, MC dropout)"),
    Setting("sequence_length", 48, "tokens per review (padded or truncated)", kind="positive_int", metavar="L"),
    Setting("ece_bins", 15, "bins of the ECE", kind="positive_int"),
    Setting("seed", 0),
    Setting("quick", False, "a smoke run: 160 training and 48 test examples, 1 epoch, 2 heads, 4 samples"),
)

DESCRIPTION = (
    "Fine-tune a tiny KerasHub BERT (synthetic reviews) and ViT (digits) built from configs, then add\n"
    "uncertainty seven ways: MAP, last-layer Laplace, BbB head, Laplace-LoRA, BLoB, MC dropout, an\n"
    "ensemble of heads. Accuracy, NLL, ECE and OOD AUROC in one table (CSV/JSON/MD), a reliability plot."
)


def _validate(s):
    """A quick run's caps."""
    if s["quick"]:
        s.update(epochs=min(s["epochs"], 1), adapter_epochs=1, head_epochs=min(s["head_epochs"], 2),
                 members=min(s["members"], 2), num_samples=min(s["num_samples"], 4),
                 sequence_length=min(s["sequence_length"], 16))
    return s


def _no_recipes(s):
    """No recipe: this study keeps its own training loop (the module docstring says why)."""
    return []


def train(s, output_dir, verbose):
    """Fine-tunes each model, fits every method and predicts the test and OOD sets."""
    from tfbnn.experiments import _kerashub_finetune

    return _kerashub_finetune.predict_all(s, verbose)


def analyse(results, s, output_dir, verbose):
    """The table, the reliability plot and the probabilities.

    Returns:
        ``{"table": [...one dict per model and method...], "markdown": str, "files": [...]}``.
    """
    from tfbnn.experiments import _kerashub_finetune

    table, text, files = _kerashub_finetune.write(results, s, output_dir)
    if verbose:
        print("\n" + text, flush=True)
    return {"table": table, "markdown": text, "files": files}


STUDY = Study(
    name="kerashub-finetune", module="tfbnn.experiments.kerashub_finetune", description=DESCRIPTION,
    settings=SETTINGS, recipes=_no_recipes, train=train, analyse=analyse, validate=_validate,
    outputs="the table, the plot and the predictions",
    banner=lambda s: f"kerashub_finetune: {', '.join(s['methods'])} on {', '.join(s['models'])}",
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
