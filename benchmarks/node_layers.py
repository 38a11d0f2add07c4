"""iBNN node layers: train-step time against keras Dense, and vectorized K*n prediction.

1. Train step. The MLP 784-1200-1200-10 (ReLU), batch 128, softmax cross-entropy, random
   data, for

     keras_dense        keras.layers.Dense with Adam(1e-3), the baseline
     node_dense         tfbnn.layers.NodeDense (K = 4, S = 1) with Adam(1e-3), kl_weight = 1/N
     node_dense_multi   the same with tfbnn.ibnn.node_optimizer (MultiOptimizer: Adam for the
                        weights, Adam(1e-2) for the variational parameters)

   All models are built in one process and timed in interleaved rounds (per round and
   model, the second epoch of a two-epoch ``fit`` of ``--steps`` steps, so fit's start-up
   work is left out; after a warm-up epoch), so that load changes on a
   shared machine hit every model alike; the median ms per step and its ratio to
   keras Dense are reported, with XLA off and/or on, in wall-clock time and in process
   CPU time (all threads; less sensitive to other processes on a shared machine).

   What a node layer adds to a Dense layer: one N(0, 1) draw per example and input
   node (B x d: 407k values per step here), a few elementwise passes over B x d, and a
   KL over (K, d). The draw dominates; on CPU it costs about as much as a fifth of the
   Dense step.

2. Prediction. The trained node MLP predicts ``--examples`` inputs (batches of
   ``--batch``) with T = K * n samples (n = 5: 20 samples), as

     vectorized         one call per batch on the batch tiled to (T * B, ...) inside
                        tfbnn.weight_samples (what tfbnn.predict / tfbnn.ibnn.predict_per_component run)
     loop               T calls per batch of a compiled single-sample forward pass

   and the end-to-end ``tfbnn.ibnn.predict_per_component`` (summaries included).

Usage:
    python benchmarks/node_layers.py                  # XLA off, 20 steps x 5 rounds
    python benchmarks/node_layers.py --xla both --steps 30 --rounds 7

Prints a markdown table and writes benchmarks/results/node_layers.json.
"""

import argparse
import os
import statistics
import time

import _readme
from _results import default_path, finish

SIZES = (784, 1200, 1200, 10)
BATCH = 128
K = 4
IMPLS = ("keras_dense", "node_dense", "node_dense_multi")


def _model(impl, n):
    import keras

    from tfbnn import ibnn, layers

    def make(units, activation, i):
        if impl == "keras_dense":
            return keras.layers.Dense(units, activation=activation)
        return layers.NodeDense(units, activation=activation, num_components=K, kl_weight=1.0 / n, seed=i)

    stack = [keras.Input((SIZES[0],))]
    stack += [make(u, "relu", i) for i, u in enumerate(SIZES[1:-1])] + [make(SIZES[-1], None, 9)]
    model = keras.Sequential(stack, name=impl)
    optimizer = ibnn.node_optimizer(keras.optimizers.Adam(1e-3)) if impl == "node_dense_multi" \
        else keras.optimizers.Adam(1e-3)
    return model, optimizer


def train_step_times(xla, steps, rounds):
    import keras
    import numpy as np

    n = steps * BATCH
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, SIZES[0])).astype("float32")
    y = rng.integers(0, SIZES[-1], size=n).astype("int32")
    models = {}
    for impl in IMPLS:
        keras.utils.set_random_seed(0)
        model, optimizer = _model(impl, n)
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=xla)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # trace + warm-up
        models[impl] = model
    wall = {impl: [] for impl in IMPLS}
    cpu = {impl: [] for impl in IMPLS}

    class Timer(keras.callbacks.Callback):
        """Times the last epoch of a fit call, leaving out fit's start-up work."""

        def on_epoch_begin(self, epoch, logs=None):
            self.start, self.start_cpu = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            self.wall = 1000 * (time.perf_counter() - self.start) / steps
            self.cpu = 1000 * (time.process_time() - self.start_cpu) / steps

    for _ in range(rounds):
        for impl, model in models.items():
            timer = Timer()
            model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[timer])
            wall[impl].append(timer.wall)
            cpu[impl].append(timer.cpu)
    medians = {impl: {"wall_ms": statistics.median(wall[impl]), "cpu_ms": statistics.median(cpu[impl])}
               for impl in IMPLS}
    return medians, {"wall_ms": wall, "cpu_ms": cpu}, models["node_dense"], x


def prediction_times(model, x, examples, batch, samples_per_component, repeats):
    import numpy as np
    import tensorflow as tf

    import tfbnn
    from tfbnn import ibnn

    t_total = ibnn.ibnn_num_samples(model, samples_per_component)
    data = np.resize(x, (examples, x.shape[1])).astype("float32")
    spec = tf.TensorSpec((None, x.shape[1]), tf.float32)
    batches = [tf.constant(data[i : i + batch]) for i in range(0, examples, batch)]

    @tf.function(input_signature=[spec])
    def single(v):
        return model(v, training=False)

    def loop():
        for b in batches:
            outs = [single(b) for _ in range(t_total)]
        return outs[-1].numpy()

    single(batches[0])  # traced outside weight_samples: one sample per row
    with tfbnn.weight_samples(model, t_total):
        @tf.function(input_signature=[spec])
        def tiled(v):
            return model(tf.tile(v, [t_total, 1]), training=False)

        def vectorized():
            for b in batches:
                out = tiled(b)
            return out.numpy()

        results = {}
        for name, fn in (("vectorized", vectorized), ("loop", loop)):
            fn()  # trace
            results[name] = []
        for _ in range(repeats):
            for name, fn in (("vectorized", vectorized), ("loop", loop)):
                start = time.perf_counter()
                fn()
                results[name].append(1000 * (time.perf_counter() - start))
        distinct = tiled(batches[0]).numpy().reshape(t_total, -1, SIZES[-1])
    ibnn.predict_per_component(model, data, n=samples_per_component, batch_size=batch)  # trace
    end_to_end = []
    for _ in range(repeats):
        start = time.perf_counter()
        ibnn.predict_per_component(model, data, n=samples_per_component, batch_size=batch)
        end_to_end.append(1000 * (time.perf_counter() - start))
    return {
        "num_samples": t_total,
        "examples": examples,
        "batch": batch,
        "vectorized_ms": statistics.median(results["vectorized"]),
        "loop_ms": statistics.median(results["loop"]),
        "ibnn_predict_ms": statistics.median(end_to_end),
        "samples_distinct": bool(not np.allclose(distinct[0], distinct[1])),
    }


def report(train_rows, predict_rows):
    lines = ["| model (784-1200-1200-10, batch 128, Adam) | XLA | wall ms / step | x keras Dense | "
             "CPU ms / step | x keras Dense (CPU) |", "|---|---|---|---|---|---|"]
    for row in train_rows:
        base = row["median_ms"]["keras_dense"]
        for impl in IMPLS:
            m = row["median_ms"][impl]
            lines.append(f"| {impl} | {'on' if row['xla'] else 'off'} | {m['wall_ms']:.1f} | "
                         f"{m['wall_ms'] / base['wall_ms']:.2f} | {m['cpu_ms']:.1f} | {m['cpu_ms'] / base['cpu_ms']:.2f} |")
    p = predict_rows[0]
    lines += ["", f"| prediction of {p['examples']} examples, T = K * n = {p['num_samples']} samples | batch | ms | "
                  "x vectorized | samples distinct |", "|---|---|---|---|---|"]
    for p in predict_rows:
        v = p["vectorized_ms"]
        lines += [
            f"| vectorized (one (T*B)-row call per batch) | {p['batch']} | {v:.0f} | 1.00 | {p['samples_distinct']} |",
            f"| loop (T single-sample calls per batch) | {p['batch']} | {p['loop_ms']:.0f} | {p['loop_ms'] / v:.2f} | |",
            f"| tfbnn.ibnn.predict_per_component (vectorized + summaries) | {p['batch']} | "
            f"{p['ibnn_predict_ms']:.0f} | "
            f"{p['ibnn_predict_ms'] / v:.2f} | |",
        ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="train steps per timed epoch (default 30)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timed epochs per model (default 5)")
    parser.add_argument("--xla", choices=["off", "on", "both"], default="off")
    parser.add_argument("--examples", type=int, default=1024, help="examples to predict (default 1024)")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 256],
                        help="prediction batch sizes (default 32, the tfbnn.predict default, and 256)")
    parser.add_argument("--samples-per-component", type=int, default=5, help="n (default 5: T = 20)")
    parser.add_argument("--out", default=default_path("node_layers.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    train_rows, node_model, x = [], None, None
    for xla in {"off": [False], "on": [True], "both": [False, True]}[args.xla]:
        print(f"  timing train steps, XLA {'on' if xla else 'off'} ...", flush=True)
        medians, raw, model, data = train_step_times(xla, args.steps, args.rounds)
        train_rows.append({"xla": xla, "median_ms": medians, "all_ms": raw})
        if node_model is None:
            node_model, x = model, data
    predict_rows = []
    for batch in args.batch:
        print(f"  timing prediction, batch {batch} ...", flush=True)
        predict_rows.append(prediction_times(node_model, x, args.examples, batch, args.samples_per_component,
                                             args.rounds))
    finish("node_layers", report(train_rows, predict_rows), args.out,
           {"train": train_rows, "predict": predict_rows, "steps": args.steps, "rounds": args.rounds}, args.write_readme)


if __name__ == "__main__":
    main()
