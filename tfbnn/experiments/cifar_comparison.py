"""The CIFAR comparison: one zoo model, one Bayesian method, learning curves and a results table.

Trains ``tfbnn.models.build(--model, method=--method, ...)`` on a dataset, records the
loss, accuracy and NLL per epoch (training and held-out validation), and evaluates the
Monte Carlo predictive (:func:`tfbnn.predict`, T = ``--num-samples``) on the test
split: accuracy, NLL, ECE (15 bins) and Brier score of the mean probabilities, and
the mean mutual information (epistemic uncertainty). Each run also adds its row to a
comparison table shared by all runs in ``--output-dir``, so running the grid::

    for m in lenet5 alexnet resnet50; do for meth in deterministic mc_dropout bbb; do
        tfbnn train --model $m --method $meth --dataset cifar10 --epochs 100
    done; done

leaves one table of every (model, method) pair.

Training: Adam (``--learning-rate``; iBNN: :func:`tfbnn.ibnn.node_optimizer`, its
variational parameters at a constant 1e-2), softmax cross-entropy, and, for the
methods with a KL term (bbb, vd, ibnn), :class:`tfbnn.KLAnnealing` with
``N = data.num_examples`` (the training examples actually used, after
``--max-examples`` and the 10% validation hold-out) and ``beta`` moved by
``--schedule`` (default: linear 0 -> 1 over the first half of training). Loss
that becomes NaN stops training with a message, and nothing is saved.

Data (:func:`tfbnn.datasets.load_pipeline`): ``cifar10`` / ``cifar100`` (tfds;
standardized per channel, pad-crop-flip augmentation), ``mnist`` / ``fashion_mnist``
(tfds), and ``digits``, the offline default (scikit-learn's 8x8 digits as 8x8x1
images) on which every model but vgg16 runs here without a download. Small inputs
adapt three models: LeNet-5 below 16x16 uses ``padding="same"``, ResNet-50 below 32x32
the CIFAR stem, ConvNeXt below 32x32 a patch of side // 8; VGG-16 needs at least 32x32.
MLPs see flattened images.

Outputs, in ``--output-dir`` (default ``saved_models/experiments/cifar_comparison``):

* ``<model>-<method>-<dataset>/``: ``history.csv`` and ``history.json`` (per epoch),
  ``learning_curves.png`` (loss, accuracy and NLL, training vs validation),
  ``results.json`` (the test metrics and the settings) and ``model.keras`` (or
  ``--output``, when run as ``tfbnn train``);
* ``comparison.csv`` and ``comparison.md``: one row per run (model, method, dataset).

Run: ``python -m tfbnn.experiments.cifar_comparison --model lenet5 --method bbb`` or,
once integrated, ``tfbnn train --model lenet5 --method bbb --dataset cifar10``.
"""

import csv
import os

# Not a `tfbnn` subcommand (tfbnn.cli.COMMANDS), and its parser lists the zoo's names: the zoo loads at import.
from tfbnn import models, priors, training
from tfbnn._internal import argtypes, files
from tfbnn.datasets.catalog import CLASSIFICATION_DATASETS
from tfbnn.experiments import _common
from tfbnn.training.recipe import KL_SCHEDULES

__all__ = ["DEFAULTS", "DATASETS", "run_experiment", "add_arguments", "run", "main"]

NAME = "cifar_comparison"
#: Datasets this comparison accepts.
DATASETS = tuple(d for d in CLASSIFICATION_DATASETS if d != "moons")
DEFAULT_ROOT = os.path.join(_common.DEFAULT_ROOT, NAME)
ECE_BINS = 15

DEFAULTS = {
    "model": None,
    "method": "deterministic",
    "dataset": "digits",
    "estimator": "flipout",
    "prior": "normal",
    "pi": 0.25,
    "sigma1": 1.0,
    "sigma2": 0.00033546262790251185,  # exp(-8), as tfbnn train
    "dropout_rate": 0.1,
    "num_components": 4,
    "schedule": "linear",
    "anneal_epochs": None,
    "epochs": 10,
    "batch_size": 128,
    "learning_rate": 1e-3,
    "num_samples": 32,
    "seed": 0,
    "max_examples": None,
    "max_test_examples": None,
    "verbose": None,
}

DESCRIPTION = (
    "Train a model of the tfbnn zoo (mlp, lenet5, alexnet, resnet50, vgg16, vgg16_small, convnext,\n"
    "wide_resnet28_10) with one method (deterministic, mc_dropout, bbb, vd, ibnn) and write its\n"
    "learning curves (loss, accuracy and NLL per epoch, PNG + CSV/JSON), its test accuracy, NLL and\n"
    "ECE from T Monte Carlo\n"
    "samples, the .keras model, and a comparison table of all runs in --output-dir. cifar10 /\n"
    "cifar100 / mnist / fashion_mnist come from tensorflow-datasets (download once); the default,\n"
    "digits, is offline."
)


# -- settings ----------------------------------------------------------------------------


def _method_options(method, estimator, prior, dropout_rate, num_components):
    return {
        "deterministic": {},
        "mc_dropout": {"rate": dropout_rate},
        "bbb": {"estimator": estimator, "prior": prior},
        "vd": {},
        "ibnn": {"num_components": num_components},
    }.get(method, {})


def _run_label(model, method, dataset, estimator):
    label = f"bbb_{estimator}" if method == "bbb" else method
    return f"{model}-{label}-{dataset}"


def _model_names():
    """The zoo's image and vector models and presets (not the text models)."""
    return [n for n in models.MODELS if n not in models.TEXT_MODELS] + list(models.PRESETS)


def _check_model_and_method(model, method):
    if model is None or model in models.TEXT_MODELS:
        raise ValueError(f"Expected --model, one of {_model_names()}. Received: --model={model!r}")
    models.get_builder(model)  # a clear error for an unknown name
    if method not in models.ZOO_METHODS:
        raise ValueError(f"Unknown method. Expected one of {list(models.ZOO_METHODS)}. Received: method={method!r}")


def _check_dataset(dataset):
    if dataset not in DATASETS:
        raise ValueError(f"Unknown dataset. Expected one of {list(DATASETS)}. Received: dataset={dataset!r}")


# -- outputs --------------------------------------------------------------------------------


_COMPARISON_COLUMNS = ("run", "model", "method", "options", "dataset", "num_examples", "epochs", "parameters",
                       "accuracy", "nll", "ece", "brier", "mutual_information", "train_seconds")


def _read_comparison(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _markdown(rows):
    header = ["model", "method", "options", "dataset", "N", "epochs", "accuracy", "NLL", "ECE"]
    return files.markdown_table(header, [
        [r["model"], r["method"], r["options"], r["dataset"], r["num_examples"], r["epochs"],
         f"{float(r['accuracy']):.4f}", f"{float(r['nll']):.4f}", f"{float(r['ece']):.4f}"] for r in rows])


def _update_comparison(root, row):
    """Adds (or replaces) this run's row of ``comparison.csv`` / ``.md``; returns all rows."""
    path = os.path.join(root, "comparison.csv")
    rows = [r for r in _read_comparison(path) if r.get("run") != row["run"]]
    rows.append({k: row[k] for k in _COMPARISON_COLUMNS})
    rows.sort(key=lambda r: (r["dataset"], r["model"], r["method"], r["run"]))
    _common.write_csv(path, rows)
    files.write_text(os.path.join(root, "comparison.md"), _markdown(rows))
    return rows, [path, os.path.join(root, "comparison.md")]


# -- the experiment ---------------------------------------------------------------------------


def run_experiment(
    model,
    method="deterministic",
    dataset="digits",
    estimator="flipout",
    prior="normal",
    dropout_rate=0.1,
    num_components=4,
    schedule="linear",
    anneal_epochs=None,
    epochs=10,
    batch_size=128,
    learning_rate=1e-3,
    num_samples=32,
    seed=0,
    max_examples=None,
    max_test_examples=None,
    output_dir=None,
    model_path=None,
    verbose=2,
):
    """Trains and evaluates one (model, method) pair through :func:`tfbnn.training.run`.

    Args:
        model: a name of :data:`tfbnn.models.MODELS` (not a text model) or a preset.
        method: ``"deterministic"``, ``"mc_dropout"``, ``"bbb"``, ``"vd"`` or ``"ibnn"``.
        dataset: one of :data:`DATASETS`.
        estimator, prior: bbb's estimator and prior (name or :class:`tfbnn.priors.Prior`).
        dropout_rate: mc_dropout's rate. num_components: iBNN's K.
        schedule: a KL schedule name (:data:`tfbnn.training.KL_SCHEDULES`), over
            ``anneal_epochs`` (default half of ``epochs``).
        epochs, batch_size, learning_rate: training (Adam).
        num_samples: T of the Monte Carlo test predictive (iBNN: rounded up to a multiple of K).
        seed: seeds Keras (initialization, shuffling), the data split and the layers.
        max_examples, max_test_examples: caps on the training / test examples.
        output_dir: the comparison's folder (default ``saved_models/experiments/cifar_comparison``).
        model_path: where the ``.keras`` model goes (default ``<run folder>/model.keras``).
        verbose: Keras ``fit`` verbosity.

    Returns:
        ``{"run", "row" (the comparison row), "test" (metrics), "history" (per-epoch
        rows), "comparison" (all rows), "files"}``.
    """
    _check_model_and_method(model, method)
    _check_dataset(dataset)
    root = _common.prepare_output_dir(output_dir or DEFAULT_ROOT)
    run_name = _run_label(model, method, dataset, estimator)
    _common.quiet_tensorflow()
    options = _method_options(method, estimator, prior, dropout_rate, num_components)
    option_text = ", ".join(f"{k}={v}" for k, v in options.items())
    if "prior" in options and not isinstance(options["prior"], str):
        options["prior"] = priors.serialize(options["prior"])
    recipe = training.Recipe(
        name=run_name, description=f"{model} with {method} (the CIFAR comparison)", model=model, method=method,
        method_options=options, dataset=dataset, max_examples=max_examples, max_test_examples=max_test_examples,
        validation_fraction=0.1, optimizer="adam", learning_rate=learning_rate, epochs=epochs,
        batch_size=batch_size, kl_schedule=schedule, kl_epochs=anneal_epochs, eval_samples=num_samples,
        ece_bins=ECE_BINS, seed=seed,
    )
    result = training.run(recipe, output_dir=os.path.join(root, run_name), model_path=model_path, verbose=verbose)
    test = {**result.test, "mutual_information": result.test["epistemic"]}
    row = {
        "run": run_name, "model": model, "method": method, "options": option_text, "dataset": dataset,
        "num_examples": result.num_examples, "epochs": epochs, "parameters": result.model.count_params(),
        **{k: test[k] for k in ("accuracy", "nll", "ece", "brier", "mutual_information")},
        "train_seconds": round(result.train_seconds, 1),
    }
    comparison, comparison_files = _update_comparison(root, row)
    print(f"\nComparison ({os.path.join(root, 'comparison.md')}):\n")
    print(_markdown(comparison))
    return {"run": run_name, "row": row, "test": test, "history": result.history, "comparison": comparison,
            "files": result.files + comparison_files}


# -- command line -------------------------------------------------------------------------------


def _add(parser, *flags, **kwargs):
    parser.add_argument(*flags, **kwargs)


def add_arguments(parser):
    """Adds the comparison's options to ``parser``; options it already has are kept as they are.

    Run standalone (``python -m``) or added to ``tfbnn train``'s parser, where
    ``--model`` (default None) switches ``tfbnn train`` to :func:`run`.
    """
    d = DEFAULTS
    names = _model_names()
    _add(parser, "--model", choices=names, default=d["model"], metavar="MODEL",
         help=f"zoo model: {', '.join(names)}")
    _add(parser, "--method", choices=models.ZOO_METHODS, default=d["method"],
         help="deterministic; mc_dropout (dropout kept on at inference, --dropout-rate); bbb (Bayes by Backprop, "
              "--estimator, --prior); vd (sparse variational dropout); ibnn (node-based iBNN, --num-components)")
    _add(parser, "--dataset", choices=DATASETS, default=d["dataset"],
         help="digits is offline; mnist, fashion_mnist, cifar10, cifar100 come from tensorflow-datasets")
    _add(parser, "--estimator", choices=models.ESTIMATORS, default=d["estimator"],
         help="bbb: flipout (default), reparameterization, or local_reparameterization (dense layers; "
              "convolutions use Flipout)")
    _add(parser, "--prior", choices=("normal", "scale_mixture"), default=d["prior"], help="bbb: weight prior")
    _add(parser, "--pi", type=argtypes.open_unit_interval, default=d["pi"], help="scale mixture: weight of component 1")
    _add(parser, "--sigma1", type=argtypes.positive_float, default=d["sigma1"], help="scale mixture: wide scale")
    _add(parser, "--sigma2", type=argtypes.positive_float, default=d["sigma2"], help="scale mixture: narrow scale")
    _add(parser, "--dropout-rate", type=argtypes.rate, default=d["dropout_rate"], help="mc_dropout: the dropout rate")
    _add(parser, "--num-components", type=argtypes.positive_int, default=d["num_components"], metavar="K",
         help="ibnn: mixture components K")
    _add(parser, "--schedule", choices=KL_SCHEDULES, default=d["schedule"],
         help="KL weight beta over training (bbb, vd, ibnn)")
    _add(parser, "--anneal-epochs", type=argtypes.positive_float, default=d["anneal_epochs"], metavar="EPOCHS",
         help="length of the KL ramp (default: half of --epochs)")
    _add(parser, "--epochs", type=argtypes.positive_int, default=d["epochs"], help="training epochs")
    _add(parser, "--batch-size", type=argtypes.positive_int, default=d["batch_size"], help="minibatch size")
    _add(parser, "--learning-rate", type=argtypes.positive_float, default=d["learning_rate"], metavar="LR",
         help="Adam learning rate")
    _add(parser, "--num-samples", type=argtypes.positive_int, default=d["num_samples"], metavar="T",
         help="Monte Carlo samples of the test predictive")
    _add(parser, "--seed", type=argtypes.non_negative_int, default=d["seed"], help="seed of data, initialization, noise")
    _add(parser, "--max-examples", type=argtypes.positive_int, default=d["max_examples"], metavar="N",
         help="use at most N training examples (N in the ELBO: what is left after the 10%% validation hold-out)")
    _add(parser, "--max-test-examples", type=argtypes.positive_int, default=d["max_test_examples"], metavar="N",
         help="evaluate on at most N test examples")
    _add(parser, "--output-dir", default=None, metavar="DIR",
         help=f"where the runs and the comparison table go (default: {DEFAULT_ROOT})")
    _add(parser, "--verbose", type=int, choices=(0, 1, 2), default=d["verbose"],
         help="Keras fit verbosity (default: 1 on a terminal, 2 otherwise)")


def _prior(args):
    name = getattr(args, "prior", DEFAULTS["prior"])
    if name == "scale_mixture":
        return priors.ScaleMixture(**{k: getattr(args, k, DEFAULTS[k]) for k in ("pi", "sigma1", "sigma2")})
    return name


def run(args):
    """Runs the comparison from parsed arguments (standalone or ``tfbnn train --model``); exit status.

    Reads the options of :func:`add_arguments` (a missing one takes its :data:`DEFAULTS`
    value) and, as ``tfbnn train``, its ``--output`` as the model's path.
    """
    settings = {k: getattr(args, k, v) for k, v in DEFAULTS.items() if k not in ("pi", "sigma1", "sigma2")}
    settings["prior"] = _prior(args)
    settings["verbose"] = argtypes.verbosity(settings["verbose"])
    result = run_experiment(output_dir=getattr(args, "output_dir", None), model_path=getattr(args, "output", None),
                            **settings)
    print("Wrote " + ", ".join(result["files"]))
    return 0


def main(argv=None):
    """``python -m tfbnn.experiments.cifar_comparison [options]``; returns the exit status."""
    return _common.main(NAME, DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
