"""1-D regression y = x^3 from 30 points: iBNN versus Bayes-by-Backprop as depth grows.

The toy problem of Hernandez-Lobato & Adams (2015), used by Trinh et al. (2022) to show
that Bayes-by-Backprop (BbB) fits degrade as the network deepens while the node-based
iBNN keeps fitting: 30 inputs ``x ~ U(-4, 4)``, targets ``y = x^3 + eps``,
``eps ~ N(0, 3^2)``; MLPs with 1 to 5 hidden layers of 256 ReLU units.

* iBNN: :class:`tfbnn.layers.NodeDense` layers (K components, prior N(1, s^2)),
  trained with :func:`tfbnn.ibnn.node_optimizer` (a constant, larger learning rate for
  the variational parameters) and predicted with ``n`` samples per component.
* BbB: :class:`tfbnn.layers.DenseReparameterization` (Blundell et al. 2015, one weight
  sample per step, N(0, 1) prior on weights and biases).

Both minimise ``mean NLL + beta KL / N`` (N = 30) with the known noise scale in the
Gaussian likelihood and ``beta`` annealed 0 -> 1 over the first half of training
(:class:`tfbnn.KLAnnealing`). Inputs are scaled by 1/4 and targets by 1/64 for training;
everything reported is in the original units.

Outputs (``--output-dir``, default ``saved_models/experiments/ibnn_regression/``):

* ``bands.png`` -- one panel per (method, depth): training points, truth, predictive mean,
  epistemic and total +-2 std bands and a few coherent function draws
  (``weight_samples(joint=True)``), on ``[-6, 6]`` (extrapolation beyond |x| = 4);
* ``results.csv`` / ``results.json`` -- per (method, depth): R^2 and RMSE of the predictive
  mean against x^3 on [-4, 4], mean epistemic std inside and outside the data range, test
  NLL (log-mean-exp over samples) and whether the fit collapsed (R^2 < 0.5).

Run: ``python -m tfbnn.experiments.ibnn_regression`` (about 2-4 minutes on 2 CPU cores)
or, once registered, ``tfbnn ibnn-regression``.
"""

import math
import os

import tfbnn
from tfbnn import training
from tfbnn.experiments import _common
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "COMPARED_METHODS", "make_data", "make_recipe", "make_pipeline", "build_model",
           "run_experiment", "add_arguments", "run", "main"]

NAME = "ibnn_regression"
#: The two methods the study compares.
COMPARED_METHODS = ("ibnn", "bbb")
METHOD_LABELS = {"ibnn": "iBNN", "bbb": "BbB"}
X_RANGE = 4.0
PLOT_RANGE = 6.0
_X_SCALE = 4.0
_Y_SCALE = 64.0
COLLAPSE_R2 = 0.5

SETTINGS = (
    Setting("depths", (1, 2, 3, 4, 5), "numbers of hidden layers", kind="positive_int", many=True, metavar="D"),
    Setting("units", 256, "units per hidden layer", kind="positive_int"),
    Setting("num_points", 30), Setting("noise_std", 3.0, "noise std of y = x^3 + noise (original units)"),
    Setting("epochs", 100, "epochs"),
    Setting("steps_per_epoch", 20, "full-batch steps per epoch (KL annealed over the first half of the epochs)"),
    Setting("learning_rate", 1e-2), Setting("variational_learning_rate", 1e-2), Setting("num_components", 4),
    Setting("prior_stddev", 0.1), Setting("train_samples", 1, "iBNN noise samples per example in training"),
    Setting("samples_per_component", 25, "iBNN prediction: n samples per component (K * n in all)"),
    Setting("bbb_samples", 100, "BbB prediction samples", recipe="eval_samples"),
    Setting("methods", COMPARED_METHODS, "ibnn (NodeDense) and/or bbb (DenseReparameterization)",
            choices=COMPARED_METHODS, many=True, unique=True),
    Setting("seed", 0),
)

DESCRIPTION = (
    "iBNN vs Bayes-by-Backprop on y = x^3 + N(0, 3^2) from 30 points, with 1-5 hidden layers of\n"
    "256 ReLU units (Trinh et al. 2022). Writes bands.png (predictive bands per method and depth)\n"
    "next to results.csv / results.json (R^2 of the mean vs x^3, epistemic std in and out of the\n"
    "data range, test NLL, whether the fit collapsed)."
)


def make_data(num_points=30, noise_std=3.0, seed=0, num_test=200):
    """Training and test points of ``y = x^3 + N(0, noise_std^2)`` (:func:`tfbnn.datasets.regression.make_cubic`)."""
    from tfbnn.datasets.regression import make_cubic

    return make_cubic(num_points, noise_std, seed, num_test)


def build_model(method, depth, units=256, num_components=4, prior_stddev=0.1, seed=0, num_examples=1):
    """The zoo MLP ``1 -> units x depth (ReLU) -> 1`` (:func:`tfbnn.models.mlp` with one linear
    output) of ``method`` ("ibnn", or "bbb" with the reparameterization estimator): the model
    :func:`tfbnn.training.run` builds from :func:`make_recipe`."""
    from tfbnn import models

    r = make_recipe(method, depth, units=units, num_components=num_components, prior_stddev=prior_stddev,
                    seed=seed)
    return models.build(r.model, method=r.method, input_shape=(1,), num_examples=num_examples,
                        **{**r.model_options, "seed": seed}, **r.method_options)


def make_recipe(method, depth, **settings):
    """The :class:`tfbnn.training.Recipe` of one (method, depth) of the study.

    The study's settings (:data:`DEFAULTS`, overridden by ``settings``) become recipe fields:
    ``units`` and ``depth`` the zoo MLP's ``hidden_units`` (one linear output), ``epochs``,
    ``steps_per_epoch`` (full-batch steps: every step sees all N points, in order),
    ``learning_rate`` and iBNN's ``variational_learning_rate``, ``num_components`` and
    ``prior_stddev`` iBNN's method options (BbB: the reparameterization estimator), the Gaussian
    likelihood with the known noise ``noise_std / 64`` (targets are trained in units of 64),
    ``train_samples``, ``eval_samples`` (iBNN: ``K * samples_per_component``; BbB:
    ``bbb_samples``); the KL weight is annealed linearly 0 -> 1 over the first half of the
    epochs. The run's seed is ``seed``, its model's ``seed + 100 * depth``.
    """
    return _recipe(method, depth, STUDY.resolve(settings))


def _recipe(method, depth, s):
    if method not in COMPARED_METHODS:
        raise ValueError(f"Unknown method. Expected one of {COMPARED_METHODS}. Received: method={method!r}")
    ibnn = method == "ibnn"
    options = ({"num_components": s["num_components"], "prior_stddev": s["prior_stddev"]} if ibnn
               else {"estimator": "reparameterization"})
    return training.Recipe(
        name=f"{method}-depth{depth}", description=f"{METHOD_LABELS[method]} on y = x^3, {depth} hidden layers",
        reference="Trinh et al. 2022, sec. 6.1 (Hernandez-Lobato and Adams 2015)",
        model="mlp", model_options={"hidden_units": (s["units"],) * depth, "outputs": 1,
                                    "seed": s["seed"] + 100 * depth},
        method=method, method_options=options, dataset="cubic", epochs=s["epochs"], batch_size=s["num_points"],
        steps_per_epoch=s["steps_per_epoch"], learning_rate=s["learning_rate"],
        variational_learning_rate=s["variational_learning_rate"] if ibnn else None,
        likelihood="gaussian", noise_std=s["noise_std"] / _Y_SCALE, kl_schedule="linear",
        train_samples=s["train_samples"] if ibnn else 1,
        eval_samples=s["num_components"] * s["samples_per_component"] if ibnn else s["bbb_samples"],
        seed=s["seed"],
    )


def make_pipeline(x, y, x_test, y_test):
    """The :class:`tfbnn.datasets.DataPipeline` of the study: inputs scaled by 1/4, targets by 1/64,
    one full batch of the N training points (in order)."""
    import tensorflow as tf

    from tfbnn.datasets import DataPipeline

    def split(a, b, batch):
        return tf.data.Dataset.from_tensor_slices(((a / _X_SCALE)[:, None], (b / _Y_SCALE)[:, None])).batch(batch)

    return DataPipeline(train=split(x, y, len(x)), validation=None, test=split(x_test, y_test, 256),
                        num_examples=len(x), num_validation=0, num_test=len(x_test), num_classes=None,
                        input_shape=(1,), name="cubic", batch_size=len(x))


def _evaluate(model, recipe, x_test, y_test, noise_std):
    """The study's numbers (original units) and the curves of the bands plot."""
    import numpy as np

    num_samples = recipe.eval_samples
    grid = np.linspace(-PLOT_RANGE, PLOT_RANGE, 241).astype("float32")
    res = tfbnn.predict(model, grid[:, None] / _X_SCALE, num_samples=num_samples, task="regression",
                        joint=True, return_samples=True, batch_size=256)
    mean = res.mean[:, 0] * _Y_SCALE
    epistemic = res.epistemic_std[:, 0] * _Y_SCALE
    inside = np.abs(grid) <= X_RANGE
    truth = grid**3
    sse = float(np.sum((mean[inside] - truth[inside]) ** 2))
    sst = float(np.sum((truth[inside] - truth[inside].mean()) ** 2))
    test = tfbnn.predict(model, x_test[:, None] / _X_SCALE, num_samples=num_samples, task="regression",
                         return_samples=True, batch_size=256)
    mu = test.samples[..., 0].astype("float64") * _Y_SCALE  # (T, N)
    log_p = -0.5 * ((y_test[None] - mu) / noise_std) ** 2 - math.log(noise_std) - 0.5 * math.log(2 * math.pi)
    peak = log_p.max(axis=0)
    nll = float(-np.mean(peak + np.log(np.mean(np.exp(log_p - peak), axis=0))))
    r2 = 1.0 - sse / sst
    numbers = {
        "r2_in_range": r2,
        "rmse_in_range": math.sqrt(sse / inside.sum()),
        "epistemic_std_in_range": float(epistemic[inside].mean()),
        "epistemic_std_out_of_range": float(epistemic[~inside].mean()),
        "test_nll": nll,
        "collapsed": bool(r2 < COLLAPSE_R2),
        "num_samples": num_samples,
    }
    curves = {"grid": grid, "mean": mean, "epistemic": epistemic,
              "total": np.sqrt(epistemic**2 + noise_std**2), "samples": res.samples[:20, :, 0] * _Y_SCALE}
    return numbers, curves


def _plot(panels, depths, methods, x, y, path):
    from matplotlib.figure import Figure

    from tfbnn import plots

    fig = Figure(figsize=(3.2 * len(depths), 2.9 * len(methods)), layout="constrained")
    axes = fig.subplots(len(methods), len(depths), squeeze=False)
    for r, method in enumerate(methods):
        for c, depth in enumerate(depths):
            ax = axes[r][c]
            row, curves = panels[(method, depth)]
            plots.regression_bands(
                x, y, curves["grid"], curves["mean"], epistemic_std=curves["epistemic"],
                total_std=curves["total"], samples=curves["samples"], true_fn=lambda g: g**3, ax=ax,
                title=f"{METHOD_LABELS[method]}, {depth} hidden layer{'s' if depth > 1 else ''}\n"
                      f"R$^2$ = {row['r2_in_range']:.2f}{' (collapsed)' if row['collapsed'] else ''}",
            )
            ax.set_ylim(-150, 150)
            ax.axvspan(-PLOT_RANGE, -X_RANGE, color="0.9", zorder=0)
            ax.axvspan(X_RANGE, PLOT_RANGE, color="0.9", zorder=0)
            if (r, c) != (0, 0) and ax.get_legend() is not None:
                ax.get_legend().remove()
    fig.suptitle("y = x$^3$ + N(0, 3$^2$), 30 points: predictive bands (grey: outside the data)")
    plots.save(fig, path)
    return path


def recipes(s):
    """The study's recipes for the checked settings ``s``: one per (method, depth), in the order they run."""
    return [_recipe(method, depth, s) for method in s["methods"] for depth in s["depths"]]


def train(s, output_dir, verbose):
    """Trains each recipe of :func:`recipes` on :func:`make_pipeline`'s data (one :func:`tfbnn.training.run`,
    recorded in ``<output_dir>/runs/<method>-depth<d>/``); its ``evaluate`` gives the numbers and the bands.

    Returns:
        dict: ``rows`` (one per method and depth), ``panels`` ((method, depth) -> (row, curves)), ``runs``
        and the training points ``x``, ``y``.
    """
    import keras

    x, y, x_test, y_test = make_data(s["num_points"], s["noise_std"], s["seed"])
    data = make_pipeline(x, y, x_test, y_test)
    rows, panels, runs = [], {}, []
    for recipe in recipes(s):
        curves = {}

        def evaluate(model, recipe, data, curves=curves):
            numbers, curves["curves"] = _evaluate(model, recipe, x_test, y_test, s["noise_std"])
            return numbers

        result = training.run(recipe, output_dir=os.path.join(output_dir, "runs", recipe.name), verbose=0,
                              data=data, evaluate=evaluate, quiet=True)
        depth = len(recipe.model_options["hidden_units"])
        row = {"method": METHOD_LABELS[recipe.method], "depth": depth, "units": s["units"], **result.test,
               "train_seconds": result.train_seconds}
        rows.append(row)
        runs.append(result.output_dir)
        panels[(recipe.method, depth)] = (row, curves["curves"])
        if verbose:
            print(f"  {row['method']:5s} depth {depth}: R^2 {row['r2_in_range']:+.3f}  test NLL "
                  f"{row['test_nll']:.3f}  epistemic std in/out {row['epistemic_std_in_range']:.2f}/"
                  f"{row['epistemic_std_out_of_range']:.2f}  ({result.train_seconds:.0f} s)", flush=True)
        keras.backend.clear_session()
    return {"rows": rows, "panels": panels, "runs": runs, "x": x, "y": y}


def analyse(trained, s, output_dir, verbose):
    """``bands.png`` (one panel per method and depth), ``results.csv`` and ``results.json``.

    Returns:
        dict with ``rows`` (one dict per method and depth), ``files`` (the study's) and ``runs``
        (the run folders).
    """
    files = [_plot(trained["panels"], s["depths"], s["methods"], trained["x"], trained["y"],
                   os.path.join(output_dir, "bands.png")),
             *_common.write_results(output_dir, trained["rows"], s)]
    return {"rows": trained["rows"], "files": files, "runs": trained["runs"]}


STUDY = Study(
    name="ibnn-regression", module="tfbnn.experiments.ibnn_regression", description=DESCRIPTION, settings=SETTINGS,
    recipes=recipes, train=train, analyse=analyse, outputs="bands.png, results.csv and results.json",
    banner=lambda s: (f"{NAME}: y = x^3 from {s['num_points']} points, depths {list(s['depths'])}, "
                      f"{s['epochs']} x {s['steps_per_epoch']} steps per model"),
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
