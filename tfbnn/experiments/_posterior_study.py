"""The numeric side of ``posterior_comparison``: data, each method's predictive, the metrics, the plots.

Imported by :func:`tfbnn.experiments.posterior_comparison.run_experiment` when the study runs
(the study's module itself loads no NumPy or TensorFlow, so ``tfbnn posterior-comparison
--help`` answers at once).

Every method's predictive on the test inputs is reduced to one of two forms, so that one
set of metrics and one distance to the HMC reference apply to all of them:

* regression: function samples ``f`` of shape ``(T, N)`` (a Laplace GLM predictive is
  sampled from its Gaussian ``N(f*, J Sigma J^T)``), the predictive being the mixture
  ``(1/T) sum_t N(y; f_t, sigma^2)`` with the study's fixed noise std ``sigma``;
* classification: class-probability samples ``(T, N, K)``, the predictive their mean.
"""

import importlib
import math
import os
import time

import keras
import numpy as np
import sklearn.datasets
import tensorflow as tf
from matplotlib.figure import Figure

import tfbnn
from tfbnn import laplace, metrics, plots, training
from tfbnn._internal.errors import RunError
from tfbnn.datasets import DataPipeline

#: Central-interval levels whose empirical coverage is reported (regression).
COVERAGE_LEVELS = (0.5, 0.9)
#: Levels of the regression calibration error: mean |coverage - level| over these central intervals.
CALIBRATION_LEVELS = tuple(np.round(np.arange(0.1, 1.0, 0.1), 2))

# -- data ---------------------------------------------------------------------------------------


def gap_data(num_points, noise_std, seed, num_test=200):
    """The in-between data of Foong et al. (2019): inputs in two clusters with a gap between them.

    ``x`` uniform on ``[-1.5, -0.7]`` and ``[0.7, 1.5]`` (half of the points each), ``y = sin(2 x) +
    0.5 x + N(0, noise_std^2)``; the test inputs are drawn from the same clusters *and* the gap
    ``[-0.7, 0.7]`` (a third each), where the data say nothing and a good posterior widens.

    Returns:
        ``(x_train (n, 1), y_train (n, 1), x_test, y_test, grid (241, 1))``, float32.
    """
    rng = np.random.default_rng(seed)

    def clusters(n):
        left = rng.uniform(-1.5, -0.7, n // 2)
        return np.concatenate([left, rng.uniform(0.7, 1.5, n - n // 2)])

    def target(x):
        return np.sin(2.0 * x) + 0.5 * x + noise_std * rng.standard_normal(x.shape)

    x = clusters(num_points)
    x_test = np.concatenate([clusters(2 * num_test // 3), rng.uniform(-0.7, 0.7, num_test - 2 * num_test // 3)])
    grid = np.linspace(-2.5, 2.5, 241)
    col = lambda a: a.astype("float32")[:, None]  # noqa: E731
    return col(x), col(target(x)), col(x_test), col(target(x_test)), col(grid)


def tabular_data(name, seed, test_fraction=0.2, max_examples=None):
    """A scikit-learn bundled dataset (offline), standardized on its training split.

    ``"diabetes"`` (442 patients, 10 features, disease progression: regression, the target
    standardized too) or ``"breast_cancer"`` (569 tumours, 30 features, 2 classes).

    Returns:
        ``(x_train, y_train, x_test, y_test)``: regression targets ``(n, 1)`` float32,
        labels ``(n,)`` int32.
    """
    bunch = sklearn.datasets.load_diabetes() if name == "diabetes" else sklearn.datasets.load_breast_cancer()
    x, y = bunch.data.astype("float64"), bunch.target
    order = np.random.default_rng(seed).permutation(len(x))
    if max_examples is not None:
        order = order[:max_examples]
    split = int(round(len(order) * (1 - test_fraction)))
    train, test = order[:split], order[split:]
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-12
    x = ((x - mu) / sd).astype("float32")
    if name == "diabetes":
        ym, ys = y[train].mean(), y[train].std()
        y = ((y - ym) / ys).astype("float32")[:, None]
    else:
        y = y.astype("int32")
    return x[train], y[train], x[test], y[test]


def pipeline(x, y, name, batch_size, num_classes, seed):
    """The training arrays as :func:`tfbnn.training.run`'s ``data``: a ``tf.data`` pipeline reshuffled
    every epoch (seeded), so that a deep ensemble's members can each reshuffle it their own way."""
    train = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
             .batch(batch_size))
    return DataPipeline(train=train, validation=None, test=None, num_examples=len(x), num_validation=0, num_test=0,
                        num_classes=num_classes, input_shape=tuple(x.shape[1:]), name=name, batch_size=batch_size)


# -- predictives ----------------------------------------------------------------------------------


class Predictive:
    """One method's predictive on the test inputs (and, for 1-D data, on the plot grid).

    Attributes:
        samples: regression ``(T, N)`` function samples; classification ``(T, N, K)`` probabilities.
        grid: regression on 1-D data: ``(T, G)`` function samples on the plot grid, else None.
        seconds: wall time of the method (training and any post-hoc fitting).
        extra: method-specific numbers (HMC's R-hat, Laplace's prior precision, ...).
    """

    def __init__(self, samples, grid=None, seconds=0.0, extra=None):
        self.samples = np.asarray(samples, np.float64)
        self.grid = None if grid is None else np.asarray(grid, np.float64)
        self.seconds = float(seconds)
        self.extra = dict(extra or {})


def model_samples(model, x, num_samples, regression):
    """``tfbnn.predict`` samples of ``model`` at ``x``: ``(T, N)`` means or ``(T, N, K)`` probabilities."""
    res = tfbnn.predict(model, x, num_samples=num_samples, return_samples=True,
                        task="regression" if regression else "classification", batch_size=256)
    return res.samples[..., 0] if regression else res.samples


def laplace_samples(la, x, num_samples, seed, regression):
    """Samples of a :class:`tfbnn.laplace.Laplace` predictive: regression ``(T, N)`` draws of the
    GLM Gaussian ``N(f*, J Sigma J^T)``; classification ``(T, N, K)`` probabilities of the
    Gaussian's function draws (the GLM predictive with Monte Carlo link)."""
    rng = np.random.default_rng(seed)
    f_mu, f_var = la.function_moments(x)
    if regression:
        std = np.sqrt(np.maximum(f_var[:, 0, 0], 0.0))
        return f_mu[None, :, 0] + std[None] * rng.standard_normal((num_samples, len(f_mu)))
    w, v = np.linalg.eigh(f_var)
    root = v * np.sqrt(np.maximum(w, 0.0))[:, None, :]
    f = f_mu[None] + np.einsum("nkl,tnl->tnk", root, rng.standard_normal((num_samples,) + f_mu.shape))
    f = f - f.max(axis=-1, keepdims=True)
    p = np.exp(f)
    return p / p.sum(axis=-1, keepdims=True)


# -- metrics --------------------------------------------------------------------------------------


def gaussian_moments(samples, noise_std):
    """Mean and std of the regression mixture ``(1/T) sum_t N(f_t, sigma^2)``, each ``(N,)``."""
    return samples.mean(axis=0), np.sqrt(samples.var(axis=0) + noise_std**2)


def regression_metrics(samples, y, noise_std):
    """Test NLL of the mixture, RMSE of its mean, coverage of central intervals and the calibration error.

    The intervals are those of the Gaussian with the mixture's mean and variance. The
    calibration error is ``mean_p |coverage(p) - p|`` over :data:`CALIBRATION_LEVELS`
    (central intervals; Kuleshov et al. 2018 use one-sided quantiles).
    """
    y = np.asarray(y, np.float64).reshape(-1)
    log_p = -0.5 * ((y[None] - samples) / noise_std) ** 2 - math.log(noise_std) - 0.5 * math.log(2 * math.pi)
    peak = log_p.max(axis=0)
    nll = float(-np.mean(peak + np.log(np.mean(np.exp(log_p - peak), axis=0))))
    mean, std = gaussian_moments(samples, noise_std)
    return {"nll": nll, **interval_metrics(y, mean, std)}


def interval_metrics(y, mean, std):
    """RMSE of ``mean``, the interval calibration error and the 50% / 90% coverages of a Gaussian predictive."""
    y = np.asarray(y, np.float64).reshape(-1)
    mean, std = np.asarray(mean, np.float64).reshape(-1), np.asarray(std, np.float64).reshape(-1)
    covered = metrics.interval_coverage(y, mean, std, CALIBRATION_LEVELS)
    out = {"rmse": float(np.sqrt(np.mean((y - mean) ** 2))),
           "ece": float(np.mean(np.abs(np.asarray(covered) - np.asarray(CALIBRATION_LEVELS))))}
    out.update({f"coverage_{int(100 * p)}": c for p, c in zip(COVERAGE_LEVELS,
                                                              metrics.interval_coverage(y, mean, std, COVERAGE_LEVELS))})
    return out


def classification_metrics(samples, y, num_bins=10):
    """Test NLL, accuracy and ECE (:mod:`tfbnn.metrics`) of the mean of the probability samples."""
    probs = np.clip(samples.mean(axis=0), 1e-12, 1.0)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    return {"nll": float(metrics.negative_log_likelihood(probs, y)), "accuracy": float(metrics.accuracy(probs, y)),
            "ece": float(metrics.expected_calibration_error(probs, y, num_bins=num_bins))}


def wasserstein_to(samples, reference, noise_std):
    """Mean over test points of the 2-Wasserstein distance between the Gaussian approximations
    (moment matched) of two regression predictives: ``sqrt((m1 - m2)^2 + (s1 - s2)^2)``."""
    m1, s1 = gaussian_moments(samples, noise_std)
    m2, s2 = gaussian_moments(reference, noise_std)
    return float(np.mean(np.sqrt((m1 - m2) ** 2 + (s1 - s2) ** 2)))


def kl_and_agreement(samples, reference):
    """Classification: mean ``KL(p_ref || p)`` over test points (nats) and the fraction of test points
    where the predicted classes agree."""
    p = np.clip(samples.mean(axis=0), 1e-12, 1.0)
    q = np.clip(reference.mean(axis=0), 1e-12, 1.0)
    kl = float(np.mean(np.sum(q * (np.log(q) - np.log(p)), axis=-1)))
    return kl, float(np.mean(p.argmax(-1) == q.argmax(-1)))


def row(method, label, pred, y, regression, noise_std, reference=None, gap=None):
    """The table row of one method (``reference``: HMC's :class:`Predictive`, or None)."""
    numbers = (regression_metrics(pred.samples, y, noise_std) if regression
               else classification_metrics(pred.samples, y))
    out = {"method": method, "label": label, **numbers}
    if gap is not None:  # the in-between test points vs those in the clusters
        _, std = gaussian_moments(pred.samples, noise_std)
        out["std_gap"], out["std_clusters"] = float(std[gap].mean()), float(std[~gap].mean())
    if reference is not None and reference is not pred:
        if regression:
            out["w2_to_hmc"] = wasserstein_to(pred.samples, reference.samples, noise_std)
        else:
            out["kl_to_hmc"], out["agreement_with_hmc"] = kl_and_agreement(pred.samples, reference.samples)
    out["seconds"] = round(pred.seconds, 2)
    out.update(pred.extra)
    return out


# -- the methods ------------------------------------------------------------------------------------


def train(recipe, data, output_dir, x_eval, num_samples, regression, callbacks=()):
    """One :func:`tfbnn.training.run` of ``recipe`` on ``data`` (its outputs under ``output_dir``),
    evaluated at each of ``x_eval``; returns ``(run result, [samples per x_eval])``."""
    kept = {}

    def evaluate(model, recipe, data):
        kept["samples"] = [model_samples(model, x, num_samples, regression) for x in x_eval]
        return {"num_samples": int(kept["samples"][0].shape[0])}

    result = training.run(recipe, output_dir=output_dir, verbose=0, data=data, evaluate=evaluate, quiet=True,
                          jit_compile=False, callbacks=list(callbacks))
    return result, kept["samples"]


def fit_laplace(model, x, y, regression, noise_std, subset, hessian, subnetwork=None):
    """The Laplace approximation of the MAP ``model`` with the prior precision maximising the
    marginal likelihood (the noise stays the study's ``noise_std``); ``subnetwork``: the count of
    a subnetwork Laplace (capped at the model's weights)."""
    if subnetwork is not None:
        subnetwork = min(subnetwork, int(sum(np.prod(v.shape) for v in model.trainable_variables)))
    la = laplace.fit(model, x, y, likelihood="regression" if regression else "classification", subset=subset,
                     hessian=hessian, sigma_noise=noise_std if regression else 1.0, subnetwork=subnetwork)
    return la.optimize_prior_precision(method="marglik", tune_sigma_noise=False)


#: Method -> (module, what it is) of the parts of issue 22 built on another branch (items 2-3).
PENDING = {"hmc": ("tfbnn.hmc", "the HMC reference (issue 22, item 3)"),
           "swag": ("tfbnn.swag", "SWAG (issue 22, item 2)")}


def pending_module(method):
    """The module of ``method`` (``"hmc"``, ``"swag"``), or a RunError saying that it is pending."""
    module, what = PENDING[method]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise RunError(f"{what} is pending: {module} is not in this build; run without the {method!r} method "
                       "(--methods)") from e


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - start


# -- plots --------------------------------------------------------------------------------------------


def band_plot(panels, x, y, grid, noise_std, path, reference=None):
    """One panel per method: its mean and +-2 std predictive band on the grid, HMC's band beside it."""
    cols = 4
    rows_ = max(1, math.ceil(len(panels) / cols))
    fig = Figure(figsize=(4 * cols, 3 * rows_))
    axes = np.atleast_1d(fig.subplots(rows_, cols, sharex=True, sharey=True)).ravel()
    g = grid[:, 0]
    for ax, (label, pred) in zip(axes, panels):
        if reference is not None and reference is not pred:
            m, s = gaussian_moments(reference.grid, noise_std)
            ax.fill_between(g, m - 2 * s, m + 2 * s, color="0.8", label="HMC +-2 sd")
            ax.plot(g, m, color="0.4", lw=1)
        m, s = gaussian_moments(pred.grid, noise_std)
        ax.fill_between(g, m - 2 * s, m + 2 * s, color="tab:blue", alpha=0.35, label=f"{label} +-2 sd")
        ax.plot(g, m, color="tab:blue", lw=1.2)
        ax.scatter(x[:, 0], y[:, 0], s=6, color="k", zorder=3)
        ax.axvspan(-0.7, 0.7, color="tab:orange", alpha=0.06)
        ax.set_title(label, fontsize=10)
        ax.set_ylim(-4, 4)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    fig.suptitle("In-between uncertainty (Foong et al. 2019): predictive bands, the gap shaded")
    fig.tight_layout()
    return plots.save(fig, path)


def markdown(title, rows, columns):
    """A markdown table of ``rows`` with ``columns`` ((key, header) pairs); missing cells are blank."""
    lines = [f"### {title}", "", "| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for key, _ in columns:
            v = r.get(key)
            cells.append("" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- one dataset ----------------------------------------------------------------------------------


def load(dataset, s):
    """``(x, y, x_test, y_test, grid or None, gap mask or None)`` of ``dataset`` for settings ``s``."""
    if dataset == "gap":
        x, y, x_test, y_test, grid = gap_data(s["num_points"], s["noise_std"], s["seed"],
                                              num_test=40 if s["quick"] else 200)
        return x, y, x_test, y_test, grid, np.abs(x_test[:, 0]) < 0.7
    x, y, x_test, y_test = tabular_data(dataset, s["seed"], max_examples=120 if s["quick"] else None)
    return x, y, x_test, y_test, None, None


def run_dataset(dataset, s, recipes, output_dir, verbose):
    """Every method of ``s["methods"]`` on ``dataset``; returns ``(rows, predictives by method)``.

    ``recipes``: ``{method: Recipe}`` of the trained methods (the study's :func:`recipes`).
    HMC starts its chains at the MAP network's weights; every row carries its distance to
    HMC's predictive.
    """
    regression = dataset != "breast_cancer"
    noise = s["noise_std"] if dataset == "gap" else s["tabular_noise_std"]
    x, y, x_test, y_test, grid, gap = load(dataset, s)
    data = pipeline(x, y, dataset, recipes["map"].batch_size, None if regression else int(y.max()) + 1, s["seed"])
    x_eval = [x_test] + ([grid] if grid is not None else [])
    T = s["num_samples"]
    preds = {}

    def say(method):
        if verbose:
            r = row(method, method, preds[method], y_test, regression, noise, preds.get("hmc"), gap)
            key = "rmse" if regression else "accuracy"
            print(f"  {dataset:13s} {method:32s} NLL {r['nll']:8.3f}  {key} {r[key]:.3f}  "
                  f"({preds[method].seconds:.1f} s)", flush=True)

    def from_samples(method, samples, seconds, extra=None):
        preds[method] = Predictive(samples[0], samples[1] if len(samples) > 1 else None, seconds, extra)
        say(method)

    runs = os.path.join(output_dir, dataset, "runs")
    map_result = None
    for method, recipe in recipes.items():
        if method not in s["methods"] and not (method == "map" and ({"hmc", *LAPLACE} & set(s["methods"]))):
            continue
        callbacks = ()
        if method == "swag":
            swag = pending_module("swag")
            callbacks = (swag.SWAG(start_epoch=recipe.epochs // 2, collect_every=1, max_rank=s["swag_rank"]),)
        result, samples = train(recipe, data, os.path.join(runs, method), x_eval, T, regression, callbacks)
        extra = None
        if method == "swag":
            posterior = callbacks[0].posterior(seed=s["seed"])
            samples = [model_samples(posterior, xe, T, regression) for xe in x_eval]
            extra = {"snapshots": int(callbacks[0].num_snapshots)}
        if method == "map":
            map_result = result
        if method in s["methods"]:
            from_samples(method, samples, result.train_seconds, extra)
        if method != "map":
            clear()
    if "hmc" in s["methods"]:  # started from the MAP weights (plus jitter): a short burn-in
        hmc = pending_module("hmc")
        result = hmc.sample(map_result.model, x, y, likelihood="normal" if regression else "categorical",
                            prior_scale=s["prior_scale"], noise_scale=noise if regression else None,
                            num_chains=s["hmc_chains"], num_results=s["hmc_results"], num_burnin=s["hmc_burnin"],
                            step_size=s["hmc_step_size"], seed=s["seed"],
                            # quick: plain HMC without XLA compilation (seconds); else NUTS under XLA
                            **({"kernel": "hmc", "num_leapfrog_steps": 5, "jit_compile": False} if s["quick"]
                               else {"max_tree_depth": s["hmc_tree_depth"]}))
        samples = [model_samples(result, xe, T, regression) for xe in x_eval]
        from_samples("hmc", samples, result.seconds, hmc_diagnostics(result, x_test))
    for method, (subset, hessian) in LAPLACE.items():
        if method not in s["methods"]:
            continue
        la, seconds = timed(fit_laplace, map_result.model, x, y, regression, noise, subset, hessian,
                            s["subnetwork_size"] if subset == "subnetwork" else None)
        samples = [laplace_samples(la, xe, T, s["seed"], regression) for xe in x_eval]
        from_samples(method, samples, map_result.train_seconds + seconds,
                     {"prior_precision": float(la.prior_precision)})
    reference = preds.get("hmc")
    rows = [{"dataset": dataset, **row(m, m, p, y_test, regression, noise, reference, gap)} for m, p in preds.items()]
    plot = None
    if grid is not None:
        plot = band_plot([(m, p) for m, p in preds.items()], x, y, grid, noise,
                         os.path.join(output_dir, f"{dataset}_bands.png"), reference)
    return rows, plot


def hmc_diagnostics(result, x_test):
    """The reference's diagnostics: R-hat and ESS over the weights (largest R-hat, smallest
    and median ESS), R-hat of the network's outputs at the test inputs (largest and median:
    the chains' agreement on the function, which is what the predictive uses), the mean
    acceptance probability and the adapted step size."""
    outputs = result.r_hat_outputs(x_test)
    return {"max_r_hat": float(np.nanmax(result.r_hat)), "min_ess": float(np.nanmin(result.ess)),
            "median_ess": float(np.nanmedian(result.ess)),
            "max_r_hat_outputs": float(np.nanmax(outputs)), "median_r_hat_outputs": float(np.nanmedian(outputs)),
            "acceptance": float(np.mean(result.acceptance_rate)), "step_size": float(result.step_size)}


#: The post-hoc Laplace methods: (subset, hessian).
LAPLACE = {"laplace_last_layer": ("last_layer", "kron"), "laplace_diag": ("all", "diag"),
           "laplace_kfac": ("all", "kron"), "laplace_subnetwork": ("subnetwork", "full")}


def clear():
    keras.backend.clear_session()
