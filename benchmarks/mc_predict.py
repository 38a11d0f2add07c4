"""Vectorized Monte Carlo prediction against T separate model calls.

For each tfbnn dense layer family, an MLP 784-400-400-10 predicts one batch of 128
examples with T = 100 posterior samples in two ways, measured in the same run:

* vectorized: ``tfbnn.inference.predict(model, x, num_samples=100, batch_size=128)``
  (one tiled (T * B) call with T independent weight samples per layer, plus the
  entropy summary);
* loop: 100 separate calls of the same model on the same batch through a compiled
  ``tf.function`` (the cheapest per-call path; ``model.predict`` would be slower
  still and flatter the ratio), followed by the same summary.

Reports the median over ``--repeats`` of each and the speed-up (loop / vectorized).

Usage:
    python benchmarks/mc_predict.py [--samples 100] [--repeats 5]
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

LAYERS = {
    "reparameterization": tfbnn.DenseReparameterization,
    "flipout": tfbnn.DenseFlipout,
    "local_reparameterization": tfbnn.DenseLocalReparameterization,
}


def _model(cls):
    return keras.Sequential(
        [keras.Input((784,)), cls(400, activation="relu", seed=1), cls(400, activation="relu", seed=2),
         cls(10, activation="softmax", seed=3)]
    )


def _timed(fn, repeats):
    fn()  # warm-up: tracing
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    _readme.add_flag(parser)
    args = parser.parse_args()
    x = np.random.default_rng(0).uniform(size=(args.batch, 784)).astype("float32")
    print(f"T = {args.samples}, batch {args.batch}, MLP 784-400-400-10, median of {args.repeats}")
    lines = ["| layer | vectorized (ms) | 100 calls (ms) | speed-up |", "|---|---|---|---|"]
    print("\n".join(lines))
    for name, cls in LAYERS.items():
        model = _model(cls)
        call = tf.function(lambda inputs, m=model: m(inputs, training=False))

        def vectorized():
            return tfbnn.inference.predict(model, x, num_samples=args.samples, batch_size=args.batch)

        def loop():
            samples = np.stack([call(x).numpy() for _ in range(args.samples)])
            return tfbnn.inference.summarize_classification(samples)

        vec, looped = _timed(vectorized, args.repeats), _timed(loop, args.repeats)
        lines.append(f"| {name} | {1000 * vec:.1f} | {1000 * looped:.1f} | {looped / vec:.2f}x |")
        print(lines[-1], flush=True)
    if args.write_readme:
        _readme.write_table("mc_predict", "\n".join(lines))


if __name__ == "__main__":
    main()
