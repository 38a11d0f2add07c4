"""LeNet model-size sweep: iBNN versus Bayes-by-Backprop as the hidden width grows.

Trinh et al. (2022) compare node-based iBNNs with Bayes-by-Backprop (BbB) on LeNet-5
scaled to 1x, 4x, 16x and 64x its parameter count, that is 1x, 2x, 4x and 8x its hidden
width (the dense weights, most of the parameters, grow with the square of the width):
BbB has two variational parameters
per weight and its KL grows with the model, iBNN has ``2 K`` per input node and keeps
deterministic weights, so its accuracy and NLL hold up (or improve) as the model
grows while BbB's degrade.

Model (``width`` = multiplier w; every hidden layer is scaled):

===================  =======================================  =====================================
                     28x28x1 (Fashion-MNIST)                  8x8x1 (offline digits stand-in)
===================  =======================================  =====================================
conv 1               6w filters 5x5 valid, ReLU, max-pool 2   6w filters 3x3 same, ReLU, max-pool 2
conv 2               16w filters 5x5 valid, ReLU, max-pool 2  16w filters 3x3 same, ReLU, max-pool 2
dense                120w, 84w ReLU, 10 softmax               120w, 84w ReLU, 10 softmax
===================  =======================================  =====================================

* iBNN: :class:`tfbnn.layers.NodeConv2D` (noise per input channel) and
  :class:`tfbnn.layers.NodeDense`; :func:`tfbnn.ibnn.node_optimizer` (Adam with cosine
  decay for the weights, a constant larger rate for the variational parameters);
  prediction with ``n`` samples per component.
* BbB: :class:`tfbnn.layers.Conv2DFlipout` and
  :class:`tfbnn.layers.DenseLocalReparameterization` (N(0, 1) priors, closed-form KL);
  Adam with cosine decay.

Both minimise ``mean NLL + beta KL / N`` with ``beta`` annealed 0 -> 1 over the first
half of training. Test metrics use T Monte Carlo samples (iBNN ``T = K n``; BbB the
same T): accuracy and ECE of the mean probabilities, NLL by log-mean-exp over samples.

Data: ``--dataset fashion_mnist`` loads Fashion-MNIST through tensorflow-datasets
(needs internet once); the default ``digits`` is the offline stand-in (scikit-learn's
8x8 digits, 1437 train / 360 test, as 8x8x1 images) so that the sweep runs anywhere.
The 64x model on digits has about 75 M weights (BbB: 150 M variational parameters).

Outputs (``--output-dir``, default ``saved_models/experiments/ibnn_lenet/``):
``model_size.png`` (test accuracy and NLL against the width multiplier), ``results.csv``,
``results.json``.

Run: ``python -m tfbnn.experiments.ibnn_lenet`` or ``tfbnn ibnn-lenet``.
"""

import os

import tfbnn
from tfbnn import datasets, training
from tfbnn.datasets.catalog import CATALOG, GRAYSCALE_DATASETS
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "COMPARED_METHODS", "make_recipe", "build_lenet", "run_experiment", "add_arguments",
           "run", "main"]

NAME = "ibnn_lenet"
COMPARED_METHODS = ("ibnn", "bbb")
METHOD_LABELS = {"ibnn": "iBNN", "bbb": "BbB"}

SETTINGS = (
    Setting("dataset", "digits", "digits: offline 8x8x1 stand-in; fashion_mnist: tensorflow-datasets (downloads once)",
            choices=GRAYSCALE_DATASETS),
    # parameter counts x1, x4, x16, x64 (Trinh et al. 2022, Fig. 5)
    Setting("widths", (1, 2, 4, 8), "hidden-width multipliers", kind="positive_int", many=True, metavar="W"),
    Setting("methods", COMPARED_METHODS, "methods to run", choices=COMPARED_METHODS, many=True, unique=True),
    Setting("epochs", 20), Setting("batch_size", 64),
    Setting("learning_rate", 1e-3, "initial Adam learning rate of the weights (cosine decay)"),
    Setting("variational_learning_rate", 1e-2, "iBNN: constant rate of the node parameters"),
    Setting("num_components", 4), Setting("prior_stddev", 0.1), Setting("samples_per_component", 5),
    Setting("max_examples", None), Setting("max_test_examples", None), Setting("seed", 0),
)

DESCRIPTION = (
    "LeNet-5 width sweep (1x, 4x, 16x, 64x hidden width) of iBNN (NodeConv2D / NodeDense) vs\n"
    "Bayes-by-Backprop (Conv2DFlipout / DenseLocalReparameterization), after Trinh et al. 2022.\n"
    "--dataset fashion_mnist uses tensorflow-datasets (downloads once); the default, digits, is\n"
    "the offline stand-in (8x8x1 images). Writes model_size.png (accuracy and NLL vs width)\n"
    "next to results.csv / results.json."
)


def build_lenet(method, input_shape, num_classes, width=1, num_components=4, prior_stddev=0.1, seed=0,
                num_examples=1):
    """The zoo's LeNet-5 (:func:`tfbnn.models.lenet5`) with every hidden layer ``width`` times wider,
    ReLU and max pooling (3x3 "same" convolutions below 20x20 inputs), as iBNN or BbB (Flipout
    convolutions, local-reparameterization dense layers): the model :func:`tfbnn.training.run`
    builds from :func:`make_recipe`. ``num_examples``: N of the KL scale, set again by
    :class:`tfbnn.KLAnnealing` in training."""
    from tfbnn import models

    r = make_recipe(method, width, tuple(input_shape), num_components=num_components, prior_stddev=prior_stddev)
    return models.build(r.model, method=method, num_classes=num_classes, input_shape=tuple(input_shape),
                        num_examples=num_examples, **{**r.model_options, "seed": seed}, **r.method_options)


def make_recipe(method, width, input_shape=(8, 8, 1), **settings):
    """The :class:`tfbnn.training.Recipe` of one (method, width) of the sweep.

    The settings (:data:`DEFAULTS`, overridden by ``settings``) become recipe fields: the zoo's
    ``lenet5`` with ``width_multiplier=width`` (3x3 "same" convolutions below 20x20 inputs),
    iBNN's ``num_components`` and ``prior_stddev`` (BbB: local reparameterization), Adam at
    ``learning_rate`` with cosine decay to 1% over all steps, iBNN's constant
    ``variational_learning_rate``, ``epochs``, ``batch_size``, ``eval_samples = K *
    samples_per_component``; the KL weight annealed linearly 0 -> 1 over the first half. The
    run's seed is ``seed``, its model's ``seed + 10 * width``.
    """
    return _recipe(method, width, tuple(input_shape), STUDY.resolve(settings))


def _recipe(method, width, input_shape, s):
    if method not in COMPARED_METHODS:
        raise ValueError(f"Unknown method. Expected one of {COMPARED_METHODS}. Received: method={method!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"Expected `width` to be a positive integer multiplier. Received: width={width!r}")
    small = min(input_shape[:2]) < 20
    ibnn = method == "ibnn"
    options = ({"num_components": s["num_components"], "prior_stddev": s["prior_stddev"]} if ibnn
               else {"estimator": "local_reparameterization"})
    return training.Recipe(
        name=f"{method}-lenet-x{width}", description=f"{METHOD_LABELS[method]} LeNet-5, hidden width x{width}",
        reference="Trinh et al. 2022, Fig. 5", model="lenet5",
        model_options={"padding": "same" if small else "valid", "kernel_size": 3 if small else 5,
                       "pooling": "max", "activation": "relu", "width_multiplier": width,
                       "seed": s["seed"] + 10 * width},
        method=method, method_options=options, dataset=s["dataset"], max_examples=s["max_examples"],
        max_test_examples=s["max_test_examples"], learning_rate=s["learning_rate"], lr_schedule="cosine",
        lr_final=0.01, variational_learning_rate=s["variational_learning_rate"] if ibnn else None,
        epochs=s["epochs"], batch_size=s["batch_size"], kl_schedule="linear",
        eval_samples=s["num_components"] * s["samples_per_component"], seed=s["seed"],
    )


def _weight_count(model, method):
    """Deterministic-equivalent weights (kernels and biases) of the network."""
    names = ("kernel", "bias") if method == "ibnn" else ("kernel_loc", "bias_loc")
    return int(sum(w.numpy().size for w in model.weights if w.name in names))


def _evaluate(model, method, ds, num_samples):
    """The study's test numbers of a trained model (T = ``num_samples``)."""
    import numpy as np

    from tfbnn import ibnn, metrics

    res = tfbnn.predict(model, ds.x_test, num_samples=num_samples, batch_size=128, task="classification")
    return {
        "weights": _weight_count(model, method),
        "variational_parameters": int(sum(w.numpy().size for w in model.trainable_weights))
        if method == "bbb" else int(sum(w.numpy().size for w in ibnn.variational_weights(model))),
        "accuracy": metrics.accuracy(res.mean_probs, ds.y_test),
        "nll": ibnn.predictive_nll(model, ds.x_test, ds.y_test, num_samples=num_samples, batch_size=128),
        "ece": metrics.expected_calibration_error(res.mean_probs, ds.y_test),
        "mutual_information": float(np.mean(res.mutual_information)),
        "kl_per_example": float(tfbnn.kl_divergence(model)) / ds.num_examples,
    }


def recipes(s):
    """The study's recipes for the checked settings ``s``: one per (width, method), in the order they run."""
    input_shape = CATALOG[s["dataset"]][1]
    return [_recipe(method, width, input_shape, s) for width in s["widths"] for method in s["methods"]]


def _train_and_evaluate(recipe, ds, s, output_dir):
    import keras

    method, width = recipe.method, recipe.model_options["width_multiplier"]
    result = training.run(recipe, output_dir=os.path.join(output_dir, "runs", recipe.name), verbose=0,
                          data=_common.array_pipeline(ds.x_train, ds.y_train, ds.name, s["batch_size"], ds.num_classes,
                                                      ds.num_test_examples), quiet=True,
                          evaluate=lambda model, r, data: _evaluate(model, method, ds, r.eval_samples))
    t = result.test
    row = {
        "method": METHOD_LABELS[method], "width": width, "weights": t["weights"],
        "variational_parameters": t["variational_parameters"], "accuracy": t["accuracy"], "nll": t["nll"],
        "ece": t["ece"], "mutual_information": t["mutual_information"], "kl_per_example": t["kl_per_example"],
        "final_train_loss": result.history[-1]["loss"], "train_seconds": result.train_seconds,
        "num_samples": recipe.eval_samples,
    }
    keras.backend.clear_session()
    return row, result.output_dir


def _plot(rows, widths, methods, dataset, path):
    from matplotlib.figure import Figure

    from tfbnn import plots

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    for method in methods:
        label = METHOD_LABELS[method]
        mine = sorted((r for r in rows if r["method"] == label), key=lambda r: r["width"])
        for ax, key in zip(axes, ("accuracy", "nll")):
            ax.plot([r["width"] for r in mine], [r[key] for r in mine], marker="o", label=label)
    for ax, title in zip(axes, ("test accuracy", "test NLL (log-mean-exp over samples)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(widths), [f"{w}x" for w in widths])
        ax.set(xlabel="hidden width multiplier", title=title)
        ax.legend()
    fig.suptitle(f"LeNet-5 model size on {dataset}: iBNN vs Bayes-by-Backprop")
    plots.save(fig, path)
    return path


def train(s, output_dir, verbose):
    """Trains and evaluates each recipe of :func:`recipes` (one :func:`tfbnn.training.run` each, recorded in
    ``<output_dir>/runs/<method>-lenet-x<width>/``; the study's numbers are its ``evaluate``).

    Returns:
        dict: ``rows`` (one per model), ``runs`` (the run folders) and ``dataset`` (the loaded dataset).
    """
    ds = datasets.load_images(s["dataset"], seed=s["seed"], max_examples=s["max_examples"],
                              max_test_examples=s["max_test_examples"])
    if verbose:
        print(f"  {ds.name}: {ds.num_examples} train / {ds.num_test_examples} test images {ds.input_shape}",
              flush=True)
    rows, runs = [], []
    for recipe in recipes(s):
        row, folder = _train_and_evaluate(recipe, ds, s, output_dir)
        rows.append(row)
        runs.append(folder)
        if verbose:
            print(f"  {row['method']:5s} {row['width']:3d}x ({row['weights']:>10,d} weights): accuracy "
                  f"{row['accuracy']:.4f}  NLL {row['nll']:.4f}  ECE {row['ece']:.4f}  "
                  f"({row['train_seconds']:.0f} s)", flush=True)
    return {"rows": rows, "runs": runs, "dataset": ds}


def analyse(trained, s, output_dir, verbose):
    """``model_size.png`` (accuracy and NLL against width), ``results.csv`` and ``results.json``.

    Returns:
        dict with ``rows``, ``files`` (the study's) and ``runs`` (the run folders).
    """
    rows, ds = trained["rows"], trained["dataset"]
    files = [_plot(rows, s["widths"], s["methods"], ds.name, os.path.join(output_dir, "model_size.png")),
             *_common.write_results(output_dir, rows, s, num_examples=ds.num_examples)]
    return {"rows": rows, "files": files, "runs": trained["runs"]}


STUDY = Study(
    name="ibnn-lenet", module="tfbnn.experiments.ibnn_lenet", description=DESCRIPTION, settings=SETTINGS,
    recipes=recipes, train=train, analyse=analyse, outputs="model_size.png, results.csv and results.json",
    banner=lambda s: f"{NAME}: LeNet widths {list(s['widths'])} on {s['dataset']}, {s['epochs']} epochs per model",
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
