"""Deep-ensemble prediction: all members in one call (parallel graph, stacked weights) vs a Python loop.

For M members of one architecture, the time to get every member's outputs on one batch,
``(M, B, C)``, three ways, timed in interleaved rounds in one process (median):

* ``loop``: a Python loop over the members, each member's own compiled ``tf.function``
  (the cheapest per-call path; ``model.predict`` per member is slower still), outputs
  stacked with NumPy;
* ``parallel``: ``tfbnn.DeepEnsemble(members).call_members`` in one ``tf.function``: one
  graph holding every member's forward pass (TensorFlow may run them concurrently);
* ``stacked``: ``DeepEnsemble(members, vectorize="stacked")``: the weights stacked on a
  leading member axis and one forward pass vectorized over it (``stateless_call`` under
  ``tf.vectorized_map``: batched matmuls).

For Bayesian members (BbB, Flipout) it also times ``tfbnn.predict(ensemble, x, T)``
(all M x T samples in one vectorized call per batch) against ``[tfbnn.predict(m, x, T)
for m in members]``.

Usage:
    python benchmarks/ensemble_predict.py [--members 5] [--rounds 15]

Writes ``benchmarks/results/ensemble_predict.json`` and ``ensemble_predict.png``.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfbnn  # noqa: E402

import _readme  # noqa: E402
from _results import default_path, write_json  # noqa: E402

# (name, input dim, hidden units, batch sizes)
ARCHITECTURES = [("mlp 64-64-64-10 (digits)", 64, (64, 64), (32, 360)),
                 ("mlp 784-400-400-10", 784, (400, 400), (32, 256, 2048))]


def _member(seed, d, hidden, method="deterministic"):
    keras.utils.set_random_seed(seed)
    return tfbnn.models.mlp(method, hidden_units=hidden, num_classes=10, input_shape=(d,), seed=seed,
                            num_examples=1000 if method == "bbb" else None, name=f"m{seed}")


def _interleaved(fns, rounds):
    """Median seconds of each function, timed in interleaved rounds after a warm-up."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _deterministic_rows(m, rounds):
    rows = []
    for arch, d, hidden, batches in ARCHITECTURES:
        members = [_member(s, d, hidden) for s in tfbnn.ensembles.member_seeds(0, m)]
        calls = [tf.function(member.__call__) for member in members]
        parallel = tfbnn.DeepEnsemble(members)
        stacked = tfbnn.DeepEnsemble(members, vectorize="stacked")
        p_fn, s_fn = tf.function(parallel.call_members), tf.function(stacked.call_members)
        for b in batches:
            x = tf.constant(np.random.default_rng(0).random((b, d)).astype("float32"))
            np.testing.assert_allclose(s_fn(x).numpy(), p_fn(x).numpy(), atol=1e-5)
            t = _interleaved({
                "loop": lambda: np.stack([c(x).numpy() for c in calls]),
                "parallel": lambda: p_fn(x).numpy(),
                "stacked": lambda: s_fn(x).numpy(),
            }, rounds)
            rows.append({"members": "deterministic", "architecture": arch, "M": m, "batch": b,
                         **{f"{k}_ms": 1e3 * v for k, v in t.items()},
                         "speedup_parallel": t["loop"] / t["parallel"], "speedup_stacked": t["loop"] / t["stacked"]})
            print(rows[-1], flush=True)
    return rows


def _bayesian_rows(m, rounds, samples):
    rows = []
    arch, d, hidden, _ = ARCHITECTURES[0]
    members = [_member(s, d, hidden, "bbb") for s in tfbnn.ensembles.member_seeds(0, m)]
    ensemble = tfbnn.DeepEnsemble(members)
    for b in (32, 360):
        x = np.random.default_rng(0).random((b, d)).astype("float32")
        t = _interleaved({
            "loop": lambda: [tfbnn.predict(member, x, num_samples=samples, batch_size=b) for member in members],
            "parallel": lambda: tfbnn.predict(ensemble, x, num_samples=samples, batch_size=b),
        }, rounds)
        rows.append({"members": f"bbb (predict, T={samples})", "architecture": arch, "M": m, "batch": b,
                     **{f"{k}_ms": 1e3 * v for k, v in t.items()}, "speedup_parallel": t["loop"] / t["parallel"]})
        print(rows[-1], flush=True)
    return rows


def _figure(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['architecture'].split(' (')[0]}\n{r['members'].split(' (')[0]}, B={r['batch']}" for r in rows]
    pos = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(rows)), 4))
    for i, (key, label) in enumerate((("speedup_parallel", "parallel graph"), ("speedup_stacked", "stacked weights"))):
        ax.bar(pos + (i - 0.5) * 0.4, [r.get(key, np.nan) for r in rows], 0.4, label=label)
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set(xticks=pos, ylabel="speed-up over a Python loop", title=f"Deep ensemble of M={rows[0]['M']}: members in one call")
    ax.set_xticklabels(labels, fontsize=7)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--samples", type=int, default=10, help="T per member for the Bayesian rows")
    parser.add_argument("--output", default=default_path("ensemble_predict.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    rows = _deterministic_rows(args.members, args.rounds) + _bayesian_rows(args.members, args.rounds, args.samples)
    header = "| members | architecture | batch | loop (ms) | parallel (ms) | stacked (ms) | x parallel | x stacked |"
    lines = [header, "|" + "---|" * 8]
    for r in rows:
        stacked = f"{r['stacked_ms']:.2f}" if "stacked_ms" in r else "-"
        xs = f"{r['speedup_stacked']:.2f}" if "speedup_stacked" in r else "-"
        lines.append(f"| {r['members']} | {r['architecture']} | {r['batch']} | {r['loop_ms']:.2f} | "
                     f"{r['parallel_ms']:.2f} | {stacked} | {r['speedup_parallel']:.2f} | {xs} |")
    print("\n" + "\n".join(lines))
    if args.write_readme:
        _readme.write_table("ensemble_predict", "\n".join(lines))
    write_json(args.output, {"members": args.members, "rounds": args.rounds, "rows": rows})
    _figure(rows, args.output[: -len(".json")] + ".png")


if __name__ == "__main__":
    main()
