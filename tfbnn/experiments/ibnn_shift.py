"""Uncertainty under covariate shift: iBNN versus MC dropout.

The shift curves of Trinh et al. (2022, sec. 6): the test inputs are corrupted with
growing intensity -- Gaussian noise ``x' = (1 - gamma) x + gamma eps`` and salt and
pepper with probability ``p`` (eq. 28) -- and for each level we record accuracy, NLL,
ECE and the mean total / aleatoric / epistemic uncertainty (predictive entropy,
expected entropy, mutual information; eqs. 26-27) through
:func:`tfbnn.evaluation.shift_sweep`. A model whose uncertainty tracks the
shift gets less accurate but more uncertain, mostly epistemically.

Models: the same MLP (``--hidden-units`` x ``--depth`` ReLU, softmax output) on the
flattened images, as

* iBNN: :class:`tfbnn.layers.NodeDense` layers, :func:`tfbnn.ibnn.node_optimizer`,
  ``beta`` annealed 0 -> 1 over the first half of training; ``K * n`` test samples;
* MC dropout (Gal & Ghahramani 2016): ``keras.layers.Dense`` with
  :class:`tfbnn.layers.MCDropout` after every hidden layer (kept on at test time), the
  same number of test samples.

Both are the zoo's MLP (:func:`tfbnn.models.mlp`). Data: ``digits`` (offline,
default), ``mnist`` or ``fashion_mnist`` (tensorflow-datasets).

Outputs (``--output-dir``, default ``saved_models/experiments/ibnn_shift/``):
``shift_gaussian.png``, ``shift_salt_and_pepper.png`` (uncertainty and accuracy against
intensity, both models), ``results.csv`` (one row per model, corruption and level) and
``results.json``.

Run: ``python -m tfbnn.experiments.ibnn_shift`` or ``tfbnn ibnn-shift``.

Reference:
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based Bayesian
    Neural Networks. ICML 2022.
"""

import os

from tfbnn import datasets, training
from tfbnn.datasets.catalog import GRAYSCALE_DATASETS
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "COMPARED_METHODS", "make_recipe", "build_mlp", "run_experiment", "add_arguments",
           "run", "main"]

NAME = "ibnn_shift"
COMPARED_METHODS = ("ibnn", "mc_dropout")
METHOD_LABELS = {"ibnn": "iBNN", "mc_dropout": "MC dropout"}
CORRUPTION_LABELS = {"gaussian": "Gaussian noise intensity gamma", "salt_and_pepper": "salt-and-pepper probability p"}

SETTINGS = (
    Setting("dataset", "digits", "digits: offline; fashion_mnist: tensorflow-datasets (downloads once)",
            choices=GRAYSCALE_DATASETS),
    Setting("hidden_units", 128), Setting("depth", 2), Setting("epochs", 40), Setting("batch_size", 32),
    Setting("learning_rate", 3e-3), Setting("variational_learning_rate", 3e-2), Setting("num_components", 4),
    Setting("prior_stddev", 0.1), Setting("dropout_rate", 0.2), Setting("samples_per_component", 10),
    Setting("corruptions", ("gaussian", "salt_and_pepper"), "corruptions to sweep", choices=tuple(CORRUPTION_LABELS),
            many=True, unique=True),
    Setting("max_examples", None), Setting("max_test_examples", None), Setting("seed", 0),
)

DESCRIPTION = (
    "Accuracy and total / aleatoric / epistemic uncertainty under growing input corruption\n"
    "(Gaussian noise, salt and pepper) for an iBNN MLP (NodeDense) vs the same MLP with MC\n"
    "dropout, after Trinh et al. 2022. Writes shift_<corruption>.png next to results.csv /\n"
    "results.json."
)


def build_mlp(method, input_dim, num_classes, hidden_units=128, depth=2, num_components=4, prior_stddev=0.1,
              dropout_rate=0.2, seed=0, num_examples=1):
    """The zoo MLP (:func:`tfbnn.models.mlp`) of ``method``: "ibnn" (NodeDense layers) or
    "mc_dropout" (Dense layers with MCDropout after each hidden layer): the model
    :func:`tfbnn.training.run` builds from :func:`make_recipe`. ``num_examples`` is N of the KL
    scale, which :class:`tfbnn.KLAnnealing` sets again in training."""
    from tfbnn import models

    r = make_recipe(method, hidden_units=hidden_units, depth=depth, num_components=num_components,
                    prior_stddev=prior_stddev, dropout_rate=dropout_rate, seed=seed)
    return models.build(r.model, method=method, num_classes=num_classes, input_shape=(input_dim,),
                        num_examples=num_examples, seed=seed, **r.model_options, **r.method_options)


def make_recipe(method, **settings):
    """The :class:`tfbnn.training.Recipe` of one model of the study.

    The settings (:data:`DEFAULTS`, overridden by ``settings``) become recipe fields: the zoo MLP
    with ``depth`` hidden layers of ``hidden_units`` (on flattened images), iBNN's
    ``num_components`` and ``prior_stddev`` or MC dropout's ``dropout_rate``, Adam at
    ``learning_rate`` (iBNN: node posteriors at ``variational_learning_rate``), ``epochs``,
    ``batch_size``, ``eval_samples = K * samples_per_component`` (both methods), seed ``seed``;
    iBNN's KL weight annealed linearly 0 -> 1 over the first half.
    """
    return _recipe(method, STUDY.resolve(settings))


def _recipe(method, s):
    if method not in COMPARED_METHODS:
        raise ValueError(f"Unknown method. Expected one of {COMPARED_METHODS}. Received: method={method!r}")
    ibnn = method == "ibnn"
    return training.Recipe(
        name=f"{method}-mlp", description=f"{METHOD_LABELS[method]} MLP under covariate shift",
        reference="Trinh et al. 2022, sec. 6", model="mlp",
        model_options={"hidden_units": (s["hidden_units"],) * s["depth"]}, method=method,
        method_options=({"num_components": s["num_components"], "prior_stddev": s["prior_stddev"]} if ibnn
                        else {"rate": s["dropout_rate"]}),
        dataset=s["dataset"], max_examples=s["max_examples"], max_test_examples=s["max_test_examples"],
        learning_rate=s["learning_rate"], variational_learning_rate=s["variational_learning_rate"] if ibnn else None,
        epochs=s["epochs"], batch_size=s["batch_size"], kl_schedule="linear",
        eval_samples=s["num_components"] * s["samples_per_component"], seed=s["seed"],
    )


def recipes(s):
    """The study's recipes for the checked settings ``s``: one per method of :data:`COMPARED_METHODS`."""
    return [_recipe(method, s) for method in COMPARED_METHODS]


def train(s, output_dir, verbose):
    """Trains each recipe of :func:`recipes` (one :func:`tfbnn.training.run`, its folder under
    ``<output_dir>/runs/``) on the flattened images; its ``evaluate`` sweeps every corruption.

    Returns:
        dict: ``results`` (method -> the :func:`tfbnn.training.run` result) and ``dataset`` (its name).
    """
    import keras

    from tfbnn import evaluation

    ds = datasets.load_images(s["dataset"], seed=s["seed"], max_examples=s["max_examples"],
                              max_test_examples=s["max_test_examples"])
    x_test = ds.x_test.reshape(ds.num_test_examples, -1)
    data = _common.array_pipeline(ds.x_train.reshape(ds.num_examples, -1), ds.y_train, ds.name, s["batch_size"],
                                  ds.num_classes, ds.num_test_examples)

    def evaluate(model, recipe, data):  # both corruption sweeps
        return {"sweeps": {c: evaluation.shift_sweep(model, x_test, ds.y_test, c, num_samples=recipe.eval_samples,
                                                     seed=s["seed"], batch_size=128) for c in s["corruptions"]}}

    results = {}
    for recipe in recipes(s):
        result = training.run(recipe, output_dir=os.path.join(output_dir, "runs", recipe.name), verbose=0,
                              data=data, evaluate=evaluate, quiet=True)
        results[recipe.method] = result
        if verbose:
            label = METHOD_LABELS[recipe.method]
            for corruption in s["corruptions"]:
                first, last = result.test["sweeps"][corruption][0], result.test["sweeps"][corruption][-1]
                print(f"  {label:10s} {corruption:15s} accuracy {first['accuracy']:.3f} -> {last['accuracy']:.3f}  "
                      f"epistemic {first['mutual_information']:.3f} -> {last['mutual_information']:.3f}  "
                      f"total {first['predictive_entropy']:.3f} -> {last['predictive_entropy']:.3f}", flush=True)
            print(f"  ({label} trained in {result.train_seconds:.0f} s)", flush=True)
        keras.backend.clear_session()
    return {"results": results, "dataset": ds.name}


def analyse(trained, s, output_dir, verbose):
    """The rows, the summary and one PNG per corruption of :func:`train`'s results; ``results.csv`` /
    ``results.json``.

    Returns:
        dict with ``rows`` (one per method, corruption and level), ``files``, ``runs`` and
        ``summary`` (per method and corruption: accuracy and epistemic uncertainty at
        the lowest and highest level).
    """
    from tfbnn import plots

    sweeps = {c: {} for c in s["corruptions"]}
    rows, summary = [], []
    for method, result in trained["results"].items():
        label = METHOD_LABELS[method]
        for corruption in s["corruptions"]:
            sweep = result.test["sweeps"][corruption]
            sweeps[corruption][label] = sweep
            rows += [{"method": label, "corruption": corruption, **r} for r in sweep]
            first, last = sweep[0], sweep[-1]
            summary.append({
                "method": label, "corruption": corruption,
                "accuracy_clean": first["accuracy"], "accuracy_most_shifted": last["accuracy"],
                "epistemic_clean": first["mutual_information"], "epistemic_most_shifted": last["mutual_information"],
                "total_clean": first["predictive_entropy"], "total_most_shifted": last["predictive_entropy"],
            })
    files = []
    for corruption, by_model in sweeps.items():
        fig = plots.uncertainty_vs_shift(by_model, xlabel=CORRUPTION_LABELS[corruption],
                                         title=f"{trained['dataset']}: uncertainty under {corruption.replace('_', ' ')}")
        files.append(plots.save(fig, os.path.join(output_dir, f"shift_{corruption}.png")))
    num_samples = s["num_components"] * s["samples_per_component"]
    files += _common.write_results(output_dir, rows, s, num_samples=num_samples, summary=summary)
    return {"rows": rows, "summary": summary, "files": files,
            "runs": [result.output_dir for result in trained["results"].values()]}


STUDY = Study(
    name="ibnn-shift", module="tfbnn.experiments.ibnn_shift", description=DESCRIPTION, settings=SETTINGS,
    recipes=recipes, train=train, analyse=analyse, outputs="the PNGs, results.csv and results.json",
    banner=lambda s: f"{NAME}: iBNN vs MC dropout MLP on {s['dataset']}, {s['epochs']} epochs each",
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
