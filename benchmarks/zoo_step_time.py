"""Train-step time of each Bayesian method of the model zoo, relative to the deterministic net.

Models: ``tfbnn.models.lenet5`` (batch 32) and ``tfbnn.models.resnet50`` (ImageNet
stem, batch 8; ``--resnet-stem cifar`` for the 3x3 stem, about 16x the compute) at
32x32x3 with 10 classes, random data, Adam(1e-3), softmax cross-entropy, no XLA
(``jit_compile=False``: XLA makes weight-sized normal draws very slow on CPU, see
KERAS3_TFP_NOTES.md).

Methods: deterministic, mc_dropout (rate 0.1), bbb with each estimator (flipout,
reparameterization, local_reparameterization; N(0, 1) prior), vd (additive), ibnn
(K = 4). All models of a family are built and traced first (two warm-up steps each);
then, after one untimed round, ``--rounds`` rounds time a few train steps of every method
(20 for lenet5, 3 for resnet50; ``--steps`` overrides) back to back, so
the noise of a shared machine hits all methods alike. Reported: the median ms per
step over the rounds and the median over rounds of the per-round ratio to
deterministic (measured in the same round).

Usage:
    python benchmarks/zoo_step_time.py                       # both models, all methods
    python benchmarks/zoo_step_time.py --models lenet5 --rounds 5 --steps 40

Prints a markdown table and writes benchmarks/results/zoo_step_time.json.
"""

import argparse
import os
import platform
import statistics
import time

import _readme
from _results import default_path, finish

METHODS = {
    "deterministic": ("deterministic", {}),
    "mc_dropout": ("mc_dropout", {"rate": 0.1}),
    "bbb_flipout": ("bbb", {"estimator": "flipout"}),
    "bbb_reparameterization": ("bbb", {"estimator": "reparameterization"}),
    "bbb_local_reparameterization": ("bbb", {"estimator": "local_reparameterization"}),
    "vd": ("vd", {}),
    "ibnn": ("ibnn", {"num_components": 4}),
}
BATCH = {"lenet5": 32, "resnet50": 8}
#: Timed train steps per round (a round of lenet5 steps is ~20 ms each: more of them).
STEPS = {"lenet5": 20, "resnet50": 3}
N = 50_000  # CIFAR-10's training set: kl_weight = 1 / N


def _build(model_name, method_key, stem):
    import tfbnn.models as zoo

    method, options = METHODS[method_key]
    kwargs = {"stem": stem} if model_name == "resnet50" else {}
    return zoo.build(model_name, method=method, num_classes=10, input_shape=(32, 32, 3), num_examples=N, seed=0,
                     **kwargs, **options)


def _time_steps(model, x, y, steps):
    start = time.perf_counter()
    for _ in range(steps):
        loss = model.train_on_batch(x, y)
    elapsed = time.perf_counter() - start
    if loss != loss:  # NaN
        raise RuntimeError(f"{model.name}: the loss became NaN")
    return 1000.0 * elapsed / steps


def bench_family(model_name, methods, steps, rounds, stem):
    import keras
    import numpy as np

    batch = BATCH[model_name]
    rng = np.random.default_rng(0)
    x = rng.random((batch, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=batch).astype("int32")
    models, params = {}, {}
    for key in methods:
        keras.utils.set_random_seed(0)
        model = _build(model_name, key, stem)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                      jit_compile=False)
        start = time.perf_counter()
        for _ in range(2):
            model.train_on_batch(x, y)  # traces the train step
        print(f"  {model_name} {key}: built and warmed up in {time.perf_counter() - start:.1f} s", flush=True)
        models[key], params[key] = model, model.count_params()
    for key in methods:  # an untimed round: the first steps after tracing are still slow
        _time_steps(models[key], x, y, steps)
    times = {key: [] for key in methods}
    for r in range(rounds):
        for key in methods:
            times[key].append(_time_steps(models[key], x, y, steps))
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{k} {times[k][-1]:.0f} ms" for k in methods), flush=True)
    base = times["deterministic"]
    rows = []
    for key in methods:
        ratios = [t / b for t, b in zip(times[key], base)]
        rows.append({"model": model_name, "batch": batch, "method": key, "parameters": params[key],
                     "ms_per_step": statistics.median(times[key]), "ms_all_rounds": times[key],
                     "ratio_to_deterministic": statistics.median(ratios)})
    return rows


def report(rows):
    lines = ["| model | batch | method | parameters | ms / step (median) | x deterministic |",
             "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['method']} | {r['parameters']:,} | "
                     f"{r['ms_per_step']:.1f} | {r['ratio_to_deterministic']:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(BATCH), default=list(BATCH))
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--steps", type=int, default=None,
                        help="train steps per timed round (default: 20 for lenet5, 3 for resnet50)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; medians are reported (default 3)")
    parser.add_argument("--resnet-stem", choices=("imagenet", "cifar"), default="imagenet")
    parser.add_argument("--out", default=default_path("zoo_step_time.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    methods = ["deterministic"] + [m for m in args.methods if m != "deterministic"]

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    rows = []
    for model_name in args.models:
        print(f"{model_name} (batch {BATCH[model_name]}):", flush=True)
        rows += bench_family(model_name, methods, args.steps or STEPS[model_name], args.rounds, args.resnet_stem)
        import keras

        keras.backend.clear_session()
    print()
    finish("zoo_step_time", report(rows), args.out,
           {"rows": rows, "steps": args.steps or STEPS, "rounds": args.rounds, "resnet_stem": args.resnet_stem,
            "tensorflow": tf.__version__, "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "load_average": os.getloadavg()}, args.write_readme)


if __name__ == "__main__":
    main()
