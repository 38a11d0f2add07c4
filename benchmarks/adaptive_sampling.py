"""Adaptive Monte Carlo sampling (``num_samples=AdaptiveSampling(...)``) against a fixed T at equal error.

A Bayes-by-Backprop MLP is trained on the offline digits with the main job's recipe
(``digits-bbb-mlp``, whatever it holds at the time; ``--epochs`` to shorten it). On its 360 test examples:

1. a reference predictive mean ``p_ref`` from ``--reference`` samples per example (its
   own Monte Carlo standard error is reported: it must be small next to the tolerances);
2. for each tolerance, ``tfbnn.predict(model, x, num_samples=AdaptiveSampling(tolerance=tol))``
   and, in the same interleaved rounds, ``tfbnn.predict(model, x, num_samples=T)`` for a
   grid of fixed T; per example the error ``e_i = max_c |p_hat_ic - p_ref_ic|``,
   summarised as the worst example (``max``), the 99th percentile and the mean, each
   averaged over ``--rounds`` repeats (every call draws fresh samples); wall time per
   call (median);
3. for each error summary, the fixed T that reaches the adaptive run's error
   (log-log interpolation of error and time between the grid points around it) and
   the speed-up ``time(fixed T*) / time(adaptive)``.

The stopping rule bounds every example's standard error, so the worst-case error is
the comparison it is designed for; the mean error is reported too (a fixed T spends
samples evenly, which is closer to optimal for the mean).

Usage:
    python benchmarks/adaptive_sampling.py [--epochs 60] [--rounds 5] [--reference 20000]

Writes ``benchmarks/results/adaptive_sampling.json`` and ``adaptive_sampling.png``.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

import tfbnn  # noqa: E402
from tfbnn import training  # noqa: E402

import _readme  # noqa: E402
from _results import default_path, write_json  # noqa: E402

SUMMARIES = {"max": np.max, "p99": lambda e: np.percentile(e, 99), "mean": np.mean}


def _reference(model, x, total, chunk=2000):
    """The predictive mean from ``total`` samples (in calls of ``chunk``) and its worst standard error."""
    parts = [tfbnn.predict(model, x, num_samples=chunk, batch_size=30) for _ in range(total // chunk)]
    mean = np.mean([p.mean_probs for p in parts], axis=0)
    # The spread of the per-call means estimates the standard error of their average.
    se = np.std([p.mean_probs for p in parts], axis=0, ddof=1) / np.sqrt(len(parts))
    return mean, float(se.max())


def _interp(xs, ys, x):
    """Log-log interpolation of y(x) on the sorted grid ``xs`` (extrapolating from the end pairs)."""
    lx, ly = np.log(xs), np.log(ys)
    i = int(np.clip(np.searchsorted(lx, np.log(x)) - 1, 0, len(xs) - 2))
    slope = (ly[i + 1] - ly[i]) / (lx[i + 1] - lx[i])
    return float(np.exp(ly[i] + slope * (np.log(x) - lx[i])))


def _t_for_error(grid, errors, target):
    """The fixed T whose (decreasing) error curve reaches ``target``: interpolate log T against log error."""
    order = np.argsort(errors)
    return _interp(np.asarray(errors)[order], np.asarray(grid, float)[order], target)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reference", type=int, default=20000)
    parser.add_argument("--tolerances", type=float, nargs="+", default=[0.02, 0.01, 0.005])
    parser.add_argument("--grid", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--batch-size", type=int, default=360)
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--output", default=default_path("adaptive_sampling.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()

    recipe = training.get_recipe("digits-bbb-mlp").replace(epochs=args.epochs)
    result = training.run(recipe, output_dir=default_path("adaptive_sampling_model"), verbose=0)
    model = result.model
    x, _ = training.arrays(training.load_data(recipe).test)
    t0 = time.perf_counter()
    p_ref, ref_se = _reference(model, x, args.reference)
    print(f"reference: T = {args.reference} in {time.perf_counter() - t0:.0f} s, largest standard error {ref_se:.2e}")

    calls = {f"auto {tol:g}": dict(num_samples=tfbnn.inference.AdaptiveSampling(
        tolerance=tol, chunk_size=args.chunk_size, max_samples=8192)) for tol in args.tolerances}
    calls.update({f"T={t}": dict(num_samples=t) for t in args.grid})
    for kwargs in calls.values():  # warm-up: tracing
        tfbnn.predict(model, x, batch_size=args.batch_size, **kwargs)
    seconds = {k: [] for k in calls}
    errors = {k: {s: [] for s in SUMMARIES} for k in calls}
    used = {k: [] for k in calls}
    for r in range(args.rounds):
        for name, kwargs in calls.items():
            start = time.perf_counter()
            res = tfbnn.predict(model, x, batch_size=args.batch_size, **kwargs)
            seconds[name].append(time.perf_counter() - start)
            e = np.max(np.abs(res.mean_probs - p_ref), axis=-1)
            for s, f in SUMMARIES.items():
                errors[name][s].append(float(f(e)))
            used[name].append(res.samples_used)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    table = {k: {"seconds": statistics.median(seconds[k]), **{f"error_{s}": float(np.mean(v)) for s, v in errors[k].items()},
                 "mean_samples": float(np.mean(used[k])), "max_samples": int(np.max(used[k])),
                 "min_samples": int(np.min(used[k]))} for k in calls}
    grid_time = [table[f"T={t}"]["seconds"] for t in args.grid]
    comparisons = []
    for tol in args.tolerances:
        auto = table[f"auto {tol:g}"]
        row = {"tolerance": tol, "seconds": auto["seconds"], "mean_samples": auto["mean_samples"],
               "max_samples": auto["max_samples"]}
        for s in SUMMARIES:
            t_star = _t_for_error(args.grid, [table[f"T={t}"][f"error_{s}"] for t in args.grid], auto[f"error_{s}"])
            row[f"error_{s}"] = auto[f"error_{s}"]
            row[f"fixed_T_{s}"] = t_star
            row[f"speedup_{s}"] = _interp(args.grid, grid_time, t_star) / auto["seconds"]
        comparisons.append(row)
    print("\n| T | seconds | worst error | p99 error | mean error | samples per example (mean / max) |\n|---|---|---|---|---|---|")
    for k, v in table.items():
        print(f"| {k} | {v['seconds']:.3f} | {v['error_max']:.4f} | {v['error_p99']:.4f} | {v['error_mean']:.5f} | "
              f"{v['mean_samples']:.1f} / {v['max_samples']} |")
    lines = ["| tolerance | adaptive s | samples (mean / max) | fixed T at equal worst error | speed-up | "
             "fixed T at equal p99 | speed-up | fixed T at equal mean error | speed-up |", "|" + "---|" * 9]
    for c in comparisons:
        lines.append(f"| {c['tolerance']:g} | {c['seconds']:.3f} | {c['mean_samples']:.1f} / {c['max_samples']} | "
                     f"{c['fixed_T_max']:.0f} | {c['speedup_max']:.2f}x | {c['fixed_T_p99']:.0f} | {c['speedup_p99']:.2f}x | "
                     f"{c['fixed_T_mean']:.0f} | {c['speedup_mean']:.2f}x |")
    print("\n" + "\n".join(lines))
    if args.write_readme:
        _readme.write_table("adaptive_sampling", "\n".join(lines))
    write_json(args.output, {"settings": vars(args), "test_accuracy": result.test["accuracy"],
                             "reference_standard_error": ref_se, "table": table, "comparisons": comparisons,
                             "samples_used": {k: np.asarray(used[k][0]).tolist() for k in calls if k.startswith("auto")}})
    _figure(args, table, comparisons, used, args.output[: -len(".json")] + ".png")


def _figure(args, table, comparisons, used, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for s in SUMMARIES:
        left.plot([table[f"T={t}"]["seconds"] for t in args.grid], [table[f"T={t}"][f"error_{s}"] for t in args.grid],
                  "o-", label=f"fixed T, {s} error")
        left.plot([c["seconds"] for c in comparisons], [c[f"error_{s}"] for c in comparisons], "s--",
                  label=f"adaptive, {s} error")
    left.set(xscale="log", yscale="log", xlabel="seconds per call (360 examples)",
             ylabel="error of the predictive mean vs reference", title="Error against time")
    left.legend(fontsize=7)
    tol = args.tolerances[len(args.tolerances) // 2]
    right.hist(np.asarray(used[f"auto {tol:g}"][0]), bins=40)
    right.set(yscale="log", xlabel="samples used", ylabel="examples", title=f"Samples per example, tolerance {tol:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
