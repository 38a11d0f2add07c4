"""1-D regression: predictive bands of variational dropout, Graves dense and a deterministic net.

The toy problem of Blundell et al. (2015, sec. 5.2) with 40 training points
(:func:`tfbnn.datasets.regression.make_toy_regression`)::

    y = x + 0.3 sin(2 pi (x + e)) + 0.3 sin(4 pi (x + e)) + e,   e ~ N(0, 0.02^2),  x ~ U(0, 0.5)

and a net with one hidden layer of 64 ReLU units (inputs standardized). As in the sparsity study, the
deterministic net is trained first, then converted
(:func:`tfbnn.convert.to_bayesian`) to sparse variational dropout (``vd``) and to
Graves' layer (``graves``, with the fixed prior ``N(0, 2^2)`` that suits regression,
``graves_prior_scale``; Graves' adaptive prior would collapse at beta = 1), which train on
``mean NLL + beta KL / N`` (N = 40, the Gaussian likelihood with the known noise scale)
with beta warmed up and annealed to 1;
the deterministic baseline continues training for as many steps on the NLL alone.

Outputs (``--output-dir``, default ``saved_models/experiments/vd_regression/``):
``bands.png`` (one panel per method: data, truth, predictive mean, epistemic and total
+-2 std bands on ``[-0.2, 1.2]``), ``bands.csv`` (the curves), ``results.csv`` /
``results.json`` (RMSE of the mean against the noise-free curve inside the data range,
mean epistemic std inside and outside it, test NLL on fresh points, sparsity).

Run: ``python -m tfbnn.experiments.vd_regression`` (about a minute on 2 CPU cores).
"""

import math
import os

import tfbnn
from tfbnn import training
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "COMPARED_METHODS", "STEPS_PER_EPOCH", "make_recipe", "build_model", "run_experiment",
           "add_arguments", "run", "main"]

NAME = "vd_regression"
COMPARED_METHODS = ("deterministic", "vd", "graves")
METHOD_LABELS = {"deterministic": "deterministic", "vd": "variational dropout (Molchanov)", "graves": "Graves"}

SETTINGS = (
    Setting("methods", COMPARED_METHODS, "models to compare", choices=COMPARED_METHODS, many=True, unique=True),
    Setting("num_points", 40), Setting("noise_std", 0.02), Setting("hidden_units", 64, "hidden units"),
    Setting("pretrain_steps", 2000, "full-batch steps of the deterministic net", kind="positive_int"),
    Setting("steps", 3000, "full-batch steps of each Bayesian net", kind="positive_int"),
    Setting("warmup_fraction", 0.1, "fraction of the steps with beta = 0", kind="fraction"),
    Setting("anneal_fraction", 0.4, "fraction of the steps of the beta ramp 0 -> 1", kind="fraction"),
    Setting("learning_rate", 1e-2, "Adam rate"), Setting("init_scale", "moped"), Setting("moped_delta", 0.1),
    Setting("graves_prior_scale", 2.0, "std of the fixed N(0, S^2) prior of the Graves layer", kind="positive_float",
            metavar="S"),
    Setting("num_samples", 200), Setting("seed", 0),
)

DESCRIPTION = (
    "Predictive bands on the 1-D regression y = x + 0.3 sin(2 pi (x+e)) + 0.3 sin(4 pi (x+e)) + e\n"
    "(40 points, Blundell et al. 2015) for a deterministic net with one hidden layer of 64 units and\n"
    "its conversions to sparse variational dropout and to Graves' variational dense layer. Writes\n"
    "bands.png next to bands.csv and results.csv / results.json."
)


def build_model(hidden_units=64, input_mean=0.25, input_variance=0.5**2 / 12, name="regression_mlp"):
    """The deterministic zoo net ``1 -> standardize -> hidden_units (ReLU) -> 1`` (:func:`tfbnn.models.mlp`).

    The inputs are standardized with the training data's mean and variance (a
    ``keras.layers.Normalization``, kept as is by the conversion): without it every
    ReLU of a zero-bias init kinks at ``x = 0``, at the edge of the data, and the
    net starts (and stays, for a while) nearly linear on ``[0, 0.5]``.
    """
    from tfbnn import models

    return models.mlp("deterministic", hidden_units=(hidden_units,), input_shape=(1,), outputs=1,
                      normalization=(input_mean, input_variance), name=name)

#: Full-batch steps per epoch (each epoch is 100 passes over the N points).
STEPS_PER_EPOCH = 100


def make_recipe(method, input_mean=0.25, input_variance=0.5**2 / 12, **settings):
    """The :class:`tfbnn.training.Recipe` of one method of the study.

    The settings (:data:`DEFAULTS`, overridden by ``settings``) become recipe fields: the zoo MLP
    ``1 -> standardize (input_mean, input_variance) -> hidden_units -> 1`` (:func:`build_model`,
    unseeded: Keras' global seed initializes it), full-batch epochs of
    :data:`STEPS_PER_EPOCH` steps (``pretrain_steps`` and ``steps`` in hundreds), Adam at
    ``learning_rate``, the Gaussian likelihood with the known ``noise_std``, pre-training then
    conversion (:func:`tfbnn.convert.to_bayesian`: ``init_scale``, ``moped_delta``, Graves'
    fixed prior ``N(0, graves_prior_scale^2)``; the deterministic baseline goes on with a fresh
    optimizer), the KL weight 0 for ``warmup_fraction`` of the epochs, then linear to 1 over
    ``anneal_fraction`` of them; ``eval_samples = num_samples``.
    """
    return _recipe(method, input_mean, input_variance, STUDY.resolve(settings))


def _recipe(method, input_mean, input_variance, s):
    from tfbnn import priors

    options = {"init_scale": s["init_scale"], "moped_delta": s["moped_delta"]} if method != "deterministic" else {}
    if method == "graves":
        options["prior"] = priors.Normal(0.0, float(s["graves_prior_scale"]))
    epochs = max(1, s["steps"] // STEPS_PER_EPOCH)
    return training.Recipe(
        name=method, description=f"{METHOD_LABELS[method]} on the 1-D toy regression",
        reference="Blundell et al. 2015, sec. 5.2; Molchanov et al. 2017", model="mlp",
        model_options={"hidden_units": (s["hidden_units"],), "outputs": 1,
                       "normalization": (float(input_mean), float(input_variance)), "seed": None},
        method=method, method_options=options, dataset="toy_regression", epochs=epochs,
        pretrain_epochs=max(1, s["pretrain_steps"] // STEPS_PER_EPOCH), batch_size=s["num_points"],
        steps_per_epoch=STEPS_PER_EPOCH, learning_rate=s["learning_rate"], likelihood="gaussian",
        noise_std=s["noise_std"], kl_schedule="warmup", warmup_epochs=s["warmup_fraction"] * epochs,
        kl_epochs=max(s["anneal_fraction"] * epochs, 1e-3), eval_samples=s["num_samples"], seed=s["seed"],
    )


def _pipeline(ds):
    import tensorflow as tf

    from tfbnn.datasets import DataPipeline

    train = tf.data.Dataset.from_tensor_slices((ds.x_train, ds.y_train)).batch(ds.num_examples)
    return DataPipeline(train=train, validation=None, test=None, num_examples=ds.num_examples, num_validation=0,
                        num_test=0, num_classes=None, input_shape=(1,), name="toy_regression",
                        batch_size=ds.num_examples)


def _evaluate(model, method, ds, s, x_test, y_test):
    import numpy as np

    from tfbnn import pruning

    noise = s["noise_std"]
    if method == "deterministic":
        mean = model.predict(ds.x_grid, verbose=0)[:, 0]
        epistemic = np.zeros_like(mean)
        test_mu = model.predict(x_test, verbose=0)[None, :, 0]
    else:
        res = tfbnn.predict(model, ds.x_grid, num_samples=s["num_samples"], task="regression", batch_size=512)
        mean, epistemic = res.mean[:, 0], res.epistemic_std[:, 0]
        test_mu = tfbnn.predict(model, x_test, num_samples=s["num_samples"], task="regression",
                                return_samples=True, batch_size=512).samples[..., 0]
    grid = ds.x_grid[:, 0]
    inside = (grid >= ds.x_range[0]) & (grid <= ds.x_range[1])
    truth = ds.y_grid[:, 0]
    log_p = (-0.5 * ((y_test[None, :, 0] - test_mu.astype(np.float64)) / noise) ** 2
             - math.log(noise) - 0.5 * math.log(2 * math.pi))
    peak = log_p.max(axis=0)
    numbers = {
        "rmse_in_range": float(np.sqrt(np.mean((mean[inside] - truth[inside]) ** 2))),
        "epistemic_std_in_range": float(epistemic[inside].mean()),
        "epistemic_std_out_of_range": float(epistemic[~inside].mean()),
        "test_nll": float(-np.mean(peak + np.log(np.mean(np.exp(log_p - peak), axis=0)))),
        "sparsity": pruning.sparsity_report(model).sparsity if method != "deterministic" else 0.0,
    }
    curves = {"mean": mean, "epistemic": epistemic, "total": np.sqrt(epistemic**2 + noise**2)}
    return numbers, curves


def _plot(panels, ds, path):
    from matplotlib.figure import Figure

    from tfbnn import plots
    from tfbnn.datasets.regression import toy_regression_curve

    fig = Figure(figsize=(5.0 * len(panels), 4.0), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (method, (row, curves)) in zip(axes, panels.items()):
        plots.regression_bands(
            ds.x_train[:, 0], ds.y_train[:, 0], ds.x_grid[:, 0], curves["mean"],
            epistemic_std=curves["epistemic"] if method != "deterministic" else None, total_std=curves["total"],
            true_fn=toy_regression_curve, ax=ax,
            title=f"{METHOD_LABELS[method]}\nRMSE {row['rmse_in_range']:.3f}, test NLL {row['test_nll']:.2f}",
        )
        ax.axvspan(ds.x_grid[0, 0], ds.x_range[0], color="0.92", zorder=0)
        ax.axvspan(ds.x_range[1], ds.x_grid[-1, 0], color="0.92", zorder=0)
        ax.set_ylim(-1.0, 2.0)
    fig.suptitle(f"{ds.num_examples} points, noise std {ds.noise_std:g} (grey: outside the data)")
    plots.save(fig, path)
    return path


def _validate(s):
    """The conversion's ``init_scale`` with ``moped_delta`` (:func:`tfbnn.convert.check_init_scale`)."""
    from tfbnn import convert

    convert.check_init_scale(s["init_scale"], s["moped_delta"])
    return s


def _data(s):
    """The training points and 500 fresh test points."""
    from tfbnn.datasets.regression import make_toy_regression

    return (make_toy_regression(s["num_points"], s["noise_std"], seed=s["seed"]),
            make_toy_regression(500, s["noise_std"], seed=s["seed"] + 1))


def recipes(s):
    """The study's recipes for the checked settings ``s``: one per method, its inputs standardized with
    the training points' mean and variance."""
    ds, _ = _data(s)
    return [_recipe(method, float(ds.x_train.mean()), float(ds.x_train.var()), s) for method in s["methods"]]


def train(s, output_dir, verbose):
    """Trains each recipe of :func:`recipes` (one :func:`tfbnn.training.run`, pre-training the same
    deterministic net from the same seed, then converting it or going on), recorded under
    ``<output_dir>/runs/<method>/``; the bands and numbers are its ``evaluate``.

    Returns:
        dict: ``panels`` (method -> (row, curves)), ``runs`` and the training data ``dataset``.
    """
    import keras

    keras.utils.set_random_seed(s["seed"])
    ds, test = _data(s)
    say = print if verbose else (lambda *a, **k: None)
    data = _pipeline(ds)
    panels, runs = {}, []
    for recipe in recipes(s):
        method, found = recipe.method, {}

        def evaluate(model, recipe, data, found=found, method=method):
            numbers, found["curves"] = _evaluate(model, method, ds, s, test.x_train, test.y_train)
            return numbers

        result = training.run(recipe, output_dir=os.path.join(output_dir, "runs", method), verbose=0, data=data,
                              evaluate=evaluate, quiet=True)
        runs.append(result.output_dir)
        row = {"method": method, **result.test}
        panels[method] = (row, found["curves"])
        say(f"  {method:13s} RMSE {row['rmse_in_range']:.4f}  test NLL {row['test_nll']:8.3f}  epistemic std "
            f"in/out {row['epistemic_std_in_range']:.3f}/{row['epistemic_std_out_of_range']:.3f}  sparsity "
            f"{100 * row['sparsity']:.1f}%  ({result.train_seconds:.0f} s)", flush=True)
    return {"panels": panels, "runs": runs, "dataset": ds}


def analyse(trained, s, output_dir, verbose):
    """``bands.png`` (one panel per method), ``bands.csv`` (the curves), ``results.csv`` and ``results.json``.

    Returns:
        dict with ``rows`` (one per method), ``curves``, ``files``, ``runs`` and ``x_grid``.
    """
    import numpy as np

    panels, ds = trained["panels"], trained["dataset"]
    rows = [row for row, _ in panels.values()]
    curve_rows = []
    for i, x in enumerate(ds.x_grid[:, 0]):
        row = {"x": float(x), "truth": float(ds.y_grid[i, 0])}
        for method, (_, curves) in panels.items():
            row.update({f"{method}_mean": float(curves["mean"][i]),
                        f"{method}_epistemic_std": float(curves["epistemic"][i]),
                        f"{method}_total_std": float(curves["total"][i])})
        curve_rows.append(row)
    files = [_plot(panels, ds, os.path.join(output_dir, "bands.png")),
             _common.write_csv(os.path.join(output_dir, "bands.csv"), curve_rows),
             *_common.write_results(output_dir, rows, s,
                                    train={"x": ds.x_train[:, 0].tolist(), "y": ds.y_train[:, 0].tolist()})]
    return {"rows": rows, "curves": {m: c for m, (_, c) in panels.items()}, "files": files, "runs": trained["runs"],
            "x_grid": np.asarray(ds.x_grid[:, 0])}


STUDY = Study(
    name="vd-regression", module="tfbnn.experiments.vd_regression", description=DESCRIPTION, settings=SETTINGS,
    recipes=recipes, train=train, analyse=analyse, outputs="bands.png, bands.csv, results.csv and results.json",
    validate=_validate,
    banner=lambda s: (f"{NAME}: {s['num_points']} points, one hidden layer of {s['hidden_units']} units, "
                      f"methods {list(s['methods'])}"),
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
