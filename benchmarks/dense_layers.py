"""Train-step time and peak memory of Bayesian dense layers against keras Dense.

Model: the Blundell MLP 784-1200-1200-10 (ReLU), batch 128, Adam(1e-3), softmax
cross-entropy, random data. For every implementation and for XLA off/on it runs a
fresh subprocess (so peak memory is per configuration), trains one warm-up epoch,
then times ``--epochs`` epochs of ``--steps`` steps and reports the best epoch's
milliseconds per train step (the median is kept in the JSON) and the ratio to
keras ``Dense`` measured in the same run. Best-of-N, as ``timeit`` does: on a
shared machine the noise only ever adds time, and it comes in multi-second
stretches that can cover a whole median of three.

Implementations:
  keras_dense                       keras.layers.Dense (Keras 3), the baseline
  tfbnn_{reparam,flipout,local}     tfbnn dense layers, N(0, 1) prior, closed-form KL
  tfp_{reparam,flipout,local}       tfp.layers.Dense* under tf_keras (Keras 2), same prior
  tf_keras_dense                    tf_keras.layers.Dense: the Dense of TFP's framework
  floor_local                       lower bound of local reparameterization, not a layer
                                    anyone should train: the mean and variance matmuls
                                    (x mu, x^2 v), one normal draw per example and unit,
                                    and twice Dense's variables, with v a free variable
                                    (no softplus, no KL; Adam may drive v negative and
                                    the loss to NaN, which changes none of the work)
  floor_local_softplus              floor_local with v = (softplus(rho) + 1e-6)^2, the
                                    posterior parameterization the layers must use (no KL)

The two floor rows split tfbnn_local's time into what the method itself costs
(two matmuls, twice the variables, the noise), what sigma = softplus(rho) adds, and
(the rest, up to tfbnn_local) what the closed-form KL and its gradient add.

Usage:
    python benchmarks/dense_layers.py                 # all, XLA off and on
    python benchmarks/dense_layers.py --xla off --steps 20 --epochs 3

Writes benchmarks/results/dense_layers.json and prints a table.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import _readme
from _results import default_path, finish

IMPLEMENTATIONS = [
    "keras_dense",
    "floor_local",
    "floor_local_softplus",
    "tfbnn_reparam",
    "tfbnn_flipout",
    "tfbnn_local",
    "tf_keras_dense",
    "tfp_reparam",
    "tfp_flipout",
    "tfp_local",
]
TFP_EQUIVALENT = {"tfbnn_reparam": "tfp_reparam", "tfbnn_flipout": "tfp_flipout", "tfbnn_local": "tfp_local"}
SIZES = (784, 1200, 1200, 10)
BATCH = 128


def _rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _floor_layer(keras, softplus):
    """The lower bound of a local-reparameterization layer (see the module docstring)."""
    import tensorflow as tf

    class LocalReparameterizationFloor(keras.layers.Layer):
        def __init__(self, units, activation=None):
            super().__init__()
            self.units, self.activation = units, keras.activations.get(activation)
            self.seed_generator = keras.random.SeedGenerator(0)

        def build(self, input_shape):
            shape = (input_shape[-1], self.units)
            self.kernel_loc = self.add_weight(shape=shape, initializer="glorot_uniform")
            # the softplus floor stores rho = -5 (sigma ~ 0.0067), the other sigma^2 itself
            self.kernel_var = self.add_weight(shape=shape, initializer=keras.initializers.Constant(-5.0 if softplus else 4.5e-5))
            self.bias = self.add_weight(shape=(self.units,), initializer="zeros")

        def call(self, x):
            var = tf.square(tf.nn.softplus(self.kernel_var) + 1e-6) if softplus else self.kernel_var
            mean = tf.matmul(x, self.kernel_loc) + self.bias
            std = tf.sqrt(tf.matmul(tf.square(x), var) + 1e-12)
            eps = tf.random.stateless_normal(tf.shape(mean), seed=self.seed_generator.next(), alg="philox")
            return self.activation(mean + std * eps)

    return LocalReparameterizationFloor


def _floor_reparam_layer(keras):
    """The local floor layer (its ``kernel_var`` the free scale ``s``) drawing ``W = mu + s eps``: the lower bound
    of a reparameterization layer (benchmarks/dense_floors.py's ``floor_reparam``)."""
    import tensorflow as tf

    class ReparameterizationFloor(_floor_layer(keras, softplus=False)):
        def call(self, x):
            eps = tf.random.stateless_normal(tf.shape(self.kernel_loc), seed=self.seed_generator.next(), alg="philox")
            return self.activation(tf.matmul(x, self.kernel_loc + self.kernel_var * eps) + self.bias)

    return ReparameterizationFloor


def _keras3_model(impl, n):
    """The MLP of ``impl``: a row of IMPLEMENTATIONS, or dense_floors.py's ``floor_reparam`` and ``*_logvar`` rows."""
    import keras

    import tfbnn

    if impl == "keras_dense":
        make = lambda units, act: keras.layers.Dense(units, activation=act)  # noqa: E731
    elif impl == "floor_reparam":
        make = _floor_reparam_layer(keras)
    elif impl.startswith("floor_"):
        make = _floor_layer(keras, softplus=impl == "floor_local_softplus")
    else:
        cls = {
            "tfbnn_reparam": tfbnn.DenseReparameterization,
            "tfbnn_flipout": tfbnn.DenseFlipout,
            "tfbnn_local": tfbnn.DenseLocalReparameterization,
        }[impl.removesuffix("_logvar")]
        scale = "log_variance" if impl.endswith("_logvar") else "softplus"
        make = lambda units, act: cls(units, activation=act, kl_weight=1.0 / n, scale_parameterization=scale)  # noqa: E731
    layers = [keras.Input((SIZES[0],))]
    layers += [make(u, "relu") for u in SIZES[1:-1]] + [make(SIZES[-1], None)]
    return keras, keras.Sequential(layers)


def _tf_keras_model(impl, n):
    import tensorflow_probability as tfp
    import tf_keras

    if impl == "tf_keras_dense":
        layers = [tf_keras.Input((SIZES[0],))]
        layers += [tf_keras.layers.Dense(u, activation="relu") for u in SIZES[1:-1]]
        return tf_keras, tf_keras.Sequential(layers + [tf_keras.layers.Dense(SIZES[-1])])
    cls = {
        "tfp_reparam": tfp.layers.DenseReparameterization,
        "tfp_flipout": tfp.layers.DenseFlipout,
        "tfp_local": tfp.layers.DenseLocalReparameterization,
    }[impl]
    tfd = tfp.distributions

    def divergence(q, p, _):
        return tfd.kl_divergence(q, p) / n

    def make(units, act):
        return cls(units, activation=act, kernel_divergence_fn=divergence)

    layers = [tf_keras.Input((SIZES[0],))]
    layers += [make(u, "relu") for u in SIZES[1:-1]] + [make(SIZES[-1], None)]
    return tf_keras, tf_keras.Sequential(layers)


def worker(impl, xla, steps, epochs):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow  # noqa: F401  (so "over import" excludes TensorFlow itself)

    rss_import = _rss_mb()
    n = steps * BATCH
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, SIZES[0])).astype("float32")
    y = rng.integers(0, SIZES[-1], size=n).astype("int32")
    lib, model = (_tf_keras_model if impl.startswith(("tfp_", "tf_keras_")) else _keras3_model)(impl, n)
    model.compile(
        optimizer=lib.optimizers.Adam(1e-3),
        loss=lib.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=xla,
    )
    rss_built = _rss_mb()

    times = []

    class Timer(lib.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append((time.perf_counter() - self.t0) / steps)

    model.fit(x, y, batch_size=BATCH, epochs=1 + epochs, shuffle=False, verbose=0, callbacks=[Timer()])
    return {
        "impl": impl,
        "xla": xla,
        "ms_per_step": 1000 * min(times[1:]),
        "median_ms_per_step": 1000 * statistics.median(times[1:]),
        "peak_rss_mb": _rss_mb(),
        "rss_after_import_mb": rss_import,
        "rss_after_build_mb": rss_built,
    }


def run_all(args):
    rows = []
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.xla]
    for xla in modes:
        for impl in args.impl or IMPLEMENTATIONS:
            cmd = [sys.executable, __file__, "--worker", impl, "--steps", str(args.steps), "--epochs", str(args.epochs)]
            if xla:
                cmd.append("--xla-worker")
            print(f"  running {impl:16s} xla={'on' if xla else 'off'} ...", flush=True)
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                err = (out.stderr.strip().splitlines() or ["?"])[-1]
                rows.append({"impl": impl, "xla": xla, "error": err})
                print(f"    failed: {err}")
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def report(rows):
    """Markdown table; "x own Dense" divides TFP's rows by tf_keras Dense (their framework's)."""
    lines = ["| layer | XLA | ms / step (best) | x keras Dense | x own Dense | x TFP equivalent | peak RSS (MB) | RSS over import (MB) |",
             "|---|---|---|---|---|---|---|---|"]
    by_key = {(r["impl"], r["xla"]): r for r in rows if "error" not in r}

    def ratio(r, other):
        return f"{r['ms_per_step'] / other['ms_per_step']:.2f}" if other else "-"

    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | {'on' if r['xla'] else 'off'} | failed: {r['error'][:60]} | | | | | |")
            continue
        base = by_key.get(("keras_dense", r["xla"]))
        own = by_key.get(("tf_keras_dense" if r["impl"].startswith(("tfp_", "tf_keras_")) else "keras_dense", r["xla"]))
        tfp_row = by_key.get((TFP_EQUIVALENT.get(r["impl"]), r["xla"]))
        lines.append(
            f"| {r['impl']} | {'on' if r['xla'] else 'off'} | {r['ms_per_step']:.1f} | {ratio(r, base)} | {ratio(r, own)} | "
            f"{ratio(r, tfp_row)} | {r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['rss_after_import_mb']:.0f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="train steps per timed epoch (default 30)")
    parser.add_argument("--epochs", type=int, default=7, help="timed epochs; the best is reported (default 7)")
    parser.add_argument("--xla", choices=["off", "on", "both"], default="both")
    parser.add_argument("--impl", action="append", choices=IMPLEMENTATIONS, help="restrict to these (repeatable)")
    parser.add_argument("--out", default=default_path("dense_layers.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--xla-worker", action="store_true", help=argparse.SUPPRESS)
    _readme.add_flag(parser)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.xla_worker, args.steps, args.epochs)))
        return
    rows = run_all(args)
    finish("dense_layers", report(rows), args.out, {"rows": rows, "steps": args.steps, "epochs": args.epochs},
           args.write_readme)


if __name__ == "__main__":
    main()
