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

Training: Adam (``--learning-rate``; iBNN: :func:`tfbnn.ibnn.make_optimizer`, its
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
adapt two models: LeNet-5 below 16x16 uses ``padding="same"``, ResNet-50 below 32x32
the CIFAR stem; VGG-16 needs at least 32x32. MLPs see flattened images.

Outputs, in ``--output-dir`` (default ``saved_models/experiments/cifar_comparison``):

* ``<model>-<method>-<dataset>/``: ``history.csv`` and ``history.json`` (per epoch),
  ``learning_curves.png`` (loss, accuracy and NLL, training vs validation),
  ``results.json`` (the test metrics and the settings) and ``model.keras`` (or
  ``--output``, when run as ``tfbnn train``);
* ``comparison.csv`` and ``comparison.md``: one row per run (model, method, dataset).

Run: ``python -m tfbnn.experiments.cifar_comparison --model lenet5 --method bbb`` or,
once integrated, ``tfbnn train --model lenet5 --method bbb --dataset cifar10``.
"""

import argparse
import os
import time

from tfbnn.experiments import _common

__all__ = ["DEFAULTS", "DATASETS", "run_experiment", "add_arguments", "run", "main"]

NAME = "cifar_comparison"
#: Datasets this comparison accepts.
DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100")
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
    "sigma2": 0.0024787521766663585,  # exp(-6), as tfbnn train
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
    "Train a model of the tfbnn zoo (mlp, lenet5, alexnet, resnet50, vgg16, wide_resnet28_10) with\n"
    "one method (deterministic, mc_dropout, bbb, vd, ibnn) and write its learning curves (loss,\n"
    "accuracy and NLL per epoch, PNG + CSV/JSON), its test accuracy, NLL and ECE from T Monte Carlo\n"
    "samples, the .keras model, and a comparison table of all runs in --output-dir. cifar10 /\n"
    "cifar100 / mnist / fashion_mnist come from tensorflow-datasets (download once); the default,\n"
    "digits, is offline."
)


# -- settings ----------------------------------------------------------------------------


def _model_kwargs(model, input_shape):
    """Builder arguments that adapt a model to small inputs (see the module docstring)."""
    side = min(input_shape[:2]) if len(input_shape) == 3 else None
    if model == "lenet5" and side is not None and side < 16:
        return {"padding": "same"}
    if model == "resnet50" and side is not None and side < 32:
        return {"stem": "cifar"}
    return {}


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
    from tfbnn import models

    return [n for n in models.MODELS if n not in models.TEXT_MODELS] + list(models.PRESETS)


def _check_model_and_method(model, method):
    from tfbnn import models

    if model is None or model in models.TEXT_MODELS:
        raise ValueError(f"Expected --model, one of {_model_names()}. Received: --model={model!r}")
    models.get_builder(model)  # a clear error for an unknown name
    if method not in models.METHODS:
        raise ValueError(f"Unknown method. Expected one of {list(models.METHODS)}. Received: method={method!r}")


def _is_mlp(model):
    from tfbnn import models

    return model == "mlp" or model in models.PRESETS


def _check_dataset(dataset):
    if dataset not in DATASETS:
        raise ValueError(f"Unknown dataset. Expected one of {list(DATASETS)}. Received: dataset={dataset!r}")


def _load_data(dataset, model, batch_size, seed, max_examples, max_test_examples):
    from tfbnn import datasets
    from tfbnn.cli import CommandError

    cifar = dataset.startswith("cifar")
    try:
        return datasets.load_pipeline(
            dataset, batch_size=batch_size, validation_fraction=0.1, standardize=cifar, flatten=_is_mlp(model),
            seed=seed, max_examples=max_examples, max_test_examples=max_test_examples,
        )
    except RuntimeError as e:  # tfds could not download
        raise CommandError(str(e)) from None


def _optimizer(method, learning_rate):
    import keras

    if method == "ibnn":
        from tfbnn import ibnn

        return ibnn.make_optimizer(keras.optimizers.Adam(learning_rate))
    return keras.optimizers.Adam(learning_rate)


def _epoch_timer():
    """A callback adding ``seconds`` (wall time of the epoch) to the epoch logs."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["seconds"] = time.perf_counter() - self._start

    return EpochTimer()


def _arrays(ds):
    import numpy as np

    xs, ys = [], []
    for x, y in ds:
        xs.append(x.numpy())
        ys.append(y.numpy())
    return np.concatenate(xs), np.concatenate(ys)


def _evaluate(model, data, num_samples):
    import numpy as np

    from tfbnn import inference, metrics

    x_test, y_test = _arrays(data.test)
    # T * batch rows per vectorized call: keep it near 2048.
    res = inference.predict(model, x_test, num_samples=num_samples, batch_size=max(1, 2048 // num_samples),
                            task="classification")
    return {
        "accuracy": metrics.accuracy(res.mean_probs, y_test),
        "nll": metrics.negative_log_likelihood(res.mean_probs, y_test),
        "ece": metrics.expected_calibration_error(res.mean_probs, y_test, ECE_BINS),
        "brier": metrics.brier_score(res.mean_probs, y_test),
        "predictive_entropy": float(np.mean(res.predictive_entropy)),
        "mutual_information": float(np.mean(res.mutual_information)),
    }


# -- outputs --------------------------------------------------------------------------------


_CURVE_KEYS = ("loss", "accuracy", "nll")
_COMPARISON_COLUMNS = ("run", "model", "method", "options", "dataset", "num_examples", "epochs", "parameters",
                       "accuracy", "nll", "ece", "brier", "mutual_information", "train_seconds")


def _history_rows(history):
    logs = history.history
    epochs = len(logs.get("loss", []))
    return [{"epoch": i + 1, **{k: float(v[i]) for k, v in logs.items() if i < len(v)}} for i in range(epochs)]


def _write_curves(history, folder, title):
    from tfbnn import plots

    logs = {k: history.history[k] for key in _CURVE_KEYS for k in (key, f"val_{key}") if k in history.history}
    return plots.save(plots.learning_curves(logs, title=title), os.path.join(folder, "learning_curves.png"))


def _read_comparison(path):
    import csv

    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _markdown(rows):
    header = ["model", "method", "options", "dataset", "N", "epochs", "accuracy", "NLL", "ECE"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["model"], r["method"], r["options"], r["dataset"], r["num_examples"], r["epochs"],
                 f"{float(r['accuracy']):.4f}", f"{float(r['nll']):.4f}", f"{float(r['ece']):.4f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _update_comparison(root, row):
    """Adds (or replaces) this run's row of ``comparison.csv`` / ``.md``; returns all rows."""
    path = os.path.join(root, "comparison.csv")
    rows = [r for r in _read_comparison(path) if r.get("run") != row["run"]]
    rows.append({k: row[k] for k in _COMPARISON_COLUMNS})
    rows.sort(key=lambda r: (r["dataset"], r["model"], r["method"], r["run"]))
    _common.write_csv(path, rows)
    with open(os.path.join(root, "comparison.md"), "w") as f:
        f.write(_markdown(rows))
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
    """Trains and evaluates one (model, method) pair; returns a dict of results and files.

    Args:
        model: a name of :data:`tfbnn.models.MODELS` (not a text model) or a preset.
        method: ``"deterministic"``, ``"mc_dropout"``, ``"bbb"``, ``"vd"`` or ``"ibnn"``.
        dataset: one of :data:`DATASETS`.
        estimator, prior: bbb's estimator and prior (name or :class:`tfbnn.priors.Prior`).
        dropout_rate: mc_dropout's rate. num_components: iBNN's K.
        schedule: a :mod:`tfbnn.schedules` name or object for beta (KL methods).
            ``"linear"`` / ``"warmup"`` / ... use ``anneal_epochs`` (default half of ``epochs``).
        epochs, batch_size, learning_rate: training.
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
    folder = _common.prepare_output_dir(os.path.join(root, run_name))
    _common.quiet_tensorflow()

    import keras

    from tfbnn import callbacks, cli, models

    if model_path is None:
        model_path = os.path.join(folder, "model.keras")
    else:
        cli._prepare_output(model_path)

    keras.utils.set_random_seed(seed)
    data = _load_data(dataset, model, batch_size, seed, max_examples, max_test_examples)
    options = _method_options(method, estimator, prior, dropout_rate, num_components)
    net = models.build(model, method=method, num_classes=data.num_classes, input_shape=data.input_shape,
                       num_examples=data.num_examples, seed=seed, **_model_kwargs(model, data.input_shape), **options)
    net.compile(optimizer=_optimizer(method, learning_rate), loss="sparse_categorical_crossentropy",
                metrics=["accuracy", keras.metrics.SparseCategoricalCrossentropy(name="nll")])
    if method == "ibnn" and num_samples % num_components:
        num_samples += num_components - num_samples % num_components

    guard = cli._make_nan_guard()
    cbs = [guard, _epoch_timer()]
    if method in models.BAYESIAN_METHODS:
        if isinstance(schedule, str):
            schedule = cli._make_schedule(schedule, anneal_epochs or max(epochs / 2, 1e-3))
        cbs.insert(0, callbacks.KLAnnealing(num_examples=data.num_examples, schedule=schedule))
    option_text = ", ".join(f"{k}={v}" for k, v in options.items())
    print(f"{NAME}: {net.name} on {data.name}, N = {data.num_examples} training / {data.num_validation} validation / "
          f"{data.num_test} test examples; {net.count_params():,} parameters; {epochs} epochs, batch {batch_size}, "
          f"Adam lr {learning_rate:g}{'; ' + option_text if option_text else ''}", flush=True)

    start = time.perf_counter()
    # The pipeline shuffles (seeded) itself; fit's own shuffle does not apply to a dataset.
    history = net.fit(data.train, validation_data=data.validation, epochs=epochs, callbacks=cbs, verbose=verbose,
                      shuffle=False)
    train_seconds = time.perf_counter() - start
    if guard.where is not None:
        epoch, batch, loss = guard.where
        raise cli.CommandError(
            f"training of {net.name} diverged: the loss became {loss} at epoch {epoch}, batch {batch}; nothing "
            f"was saved. Try a smaller --learning-rate (received {learning_rate:g})."
        )
    _common.check_finite_history(history, net.name)

    test = _evaluate(net, data, num_samples)
    rows = _history_rows(history)
    files = [
        _common.write_csv(os.path.join(folder, "history.csv"), rows),
        _common.write_json(os.path.join(folder, "history.json"), rows),
        _write_curves(history, folder, f"{net.name} on {data.name}"),
    ]
    row = {
        "run": run_name, "model": model, "method": method, "options": option_text, "dataset": data.name,
        "num_examples": data.num_examples, "epochs": epochs, "parameters": net.count_params(),
        **{k: test[k] for k in ("accuracy", "nll", "ece", "brier", "mutual_information")},
        "train_seconds": round(train_seconds, 1),
    }
    settings = {"model": model, "method": method, "options": option_text, "dataset": data.name,
                "num_examples": data.num_examples, "num_validation": data.num_validation, "num_test": data.num_test,
                "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate,
                "num_samples": num_samples, "seed": seed, "ece_bins": ECE_BINS}
    files.append(_common.write_json(os.path.join(folder, "results.json"),
                                    {"settings": settings, "test": test, "train_seconds": train_seconds}))
    cli.save_atomically(net, model_path)
    files.append(model_path)
    comparison, comparison_files = _update_comparison(root, row)
    files += comparison_files

    print()
    print(cli.format_table(
        f"Results: {net.name} on {data.name} (test, Monte Carlo predictive, T = {num_samples})",
        [[("accuracy", f"{test['accuracy']:.2%}"), ("NLL", f"{test['nll']:.4f}"),
          (f"ECE ({ECE_BINS} bins)", f"{test['ece']:.4f}"), ("Brier score", f"{test['brier']:.4f}"),
          ("mutual information (epistemic)", f"{test['mutual_information']:.4f}"),
          ("training time", f"{train_seconds:.1f} s")]],
    ))
    print(f"\nComparison ({os.path.join(root, 'comparison.md')}):\n")
    print(_markdown(comparison))
    return {"run": run_name, "row": row, "test": test, "history": rows, "comparison": comparison, "files": files}


# -- command line -------------------------------------------------------------------------------


def _add(parser, *flags, **kwargs):
    """``parser.add_argument``, skipping an option the parser already has.

    ``tfbnn train`` already defines ``--dataset``, ``--epochs``, ``--prior``, ... with the
    same meaning; there its definition (and default) is kept.
    """
    try:
        parser.add_argument(*flags, **kwargs)
    except argparse.ArgumentError:
        pass


def add_arguments(parser):
    """Adds the comparison's options to ``parser``; options it already has are kept as they are.

    Run standalone (``python -m``) or added to ``tfbnn train``'s parser, where
    ``--model`` (default None) switches ``tfbnn train`` to :func:`run`.
    """
    from tfbnn import cli, models

    d = DEFAULTS
    names = _model_names()
    _add(parser, "--model", choices=names, default=d["model"], metavar="MODEL",
         help=f"zoo model: {', '.join(names)}")
    _add(parser, "--method", choices=models.METHODS, default=d["method"],
         help="deterministic; mc_dropout (dropout kept on at inference, --dropout-rate); bbb (Bayes by Backprop, "
              "--estimator, --prior); vd (sparse variational dropout); ibnn (node-based iBNN, --num-components)")
    _add(parser, "--dataset", choices=DATASETS, default=d["dataset"],
         help="digits is offline; mnist, fashion_mnist, cifar10, cifar100 come from tensorflow-datasets")
    _add(parser, "--estimator", choices=models.ESTIMATORS, default=d["estimator"],
         help="bbb: flipout (default), reparameterization, or local_reparameterization (dense layers; "
              "convolutions use Flipout)")
    _add(parser, "--prior", choices=cli.PRIOR_NAMES, default=d["prior"], help="bbb: weight prior")
    _add(parser, "--pi", type=cli._open_unit_interval, default=d["pi"], help="scale mixture: weight of component 1")
    _add(parser, "--sigma1", type=cli._positive_float, default=d["sigma1"], help="scale mixture: wide scale")
    _add(parser, "--sigma2", type=cli._positive_float, default=d["sigma2"], help="scale mixture: narrow scale")
    _add(parser, "--dropout-rate", type=_rate, default=d["dropout_rate"], help="mc_dropout: the dropout rate")
    _add(parser, "--num-components", type=cli._positive_int, default=d["num_components"], metavar="K",
         help="ibnn: mixture components K")
    _add(parser, "--schedule", choices=cli.SCHEDULE_NAMES, default=d["schedule"],
         help="KL weight beta over training (bbb, vd, ibnn)")
    _add(parser, "--anneal-epochs", type=cli._positive_float, default=d["anneal_epochs"], metavar="EPOCHS",
         help="length of the KL ramp (default: half of --epochs)")
    _add(parser, "--epochs", type=cli._positive_int, default=d["epochs"], help="training epochs")
    _add(parser, "--batch-size", type=cli._positive_int, default=d["batch_size"], help="minibatch size")
    _add(parser, "--learning-rate", type=cli._positive_float, default=d["learning_rate"], metavar="LR",
         help="Adam learning rate")
    _add(parser, "--num-samples", type=cli._positive_int, default=d["num_samples"], metavar="T",
         help="Monte Carlo samples of the test predictive")
    _add(parser, "--seed", type=cli._non_negative_int, default=d["seed"], help="seed of data, initialization, noise")
    _add(parser, "--max-examples", type=cli._positive_int, default=d["max_examples"], metavar="N",
         help="use at most N training examples (N in the ELBO: what is left after the 10%% validation hold-out)")
    _add(parser, "--max-test-examples", type=cli._positive_int, default=d["max_test_examples"], metavar="N",
         help="evaluate on at most N test examples")
    _add(parser, "--output-dir", default=None, metavar="DIR",
         help=f"where the runs and the comparison table go (default: {DEFAULT_ROOT})")
    _add(parser, "--verbose", type=int, choices=(0, 1, 2), default=d["verbose"],
         help="Keras fit verbosity (default: 1 on a terminal, 2 otherwise)")


def _rate(text):
    from tfbnn import cli

    value = cli._float(text, "a number in [0, 1)")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _prior(args):
    from tfbnn import priors

    name = getattr(args, "prior", DEFAULTS["prior"])
    if name == "scale_mixture":
        return priors.ScaleMixture(**{k: getattr(args, k, DEFAULTS[k]) for k in ("pi", "sigma1", "sigma2")})
    return name


def run(args):
    """Runs the comparison from parsed arguments (standalone or ``tfbnn train --model``); exit status.

    Reads the options of :func:`add_arguments` (a missing one takes its :data:`DEFAULTS`
    value) and, as ``tfbnn train``, its ``--output`` as the model's path.
    """
    from tfbnn import cli

    settings = {k: getattr(args, k, v) for k, v in DEFAULTS.items() if k not in ("pi", "sigma1", "sigma2")}
    settings["prior"] = _prior(args)
    settings["verbose"] = cli._verbosity(settings["verbose"])
    result = run_experiment(output_dir=getattr(args, "output_dir", None), model_path=getattr(args, "output", None),
                            **settings)
    print("Wrote " + ", ".join(result["files"]))
    return 0


def main(argv=None):
    """``python -m tfbnn.experiments.cifar_comparison [options]``; returns the exit status."""
    return _common.main(NAME, DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
