"""Forward + backward time of one Bayesian dense layer, without the optimizer or Keras' train step.

``dense_layers.py`` times whole train steps, so it also times what Keras 3 and
tf_keras do around the layers (the train-step function, the Adam update of every
variable). This isolates the layers. One 1200 -> 1200 layer at batch 128 (the middle
layer of the Blundell MLP): the time to compute the loss ``sum(y) + layer losses`` and
its gradient with respect to the layer's trainable weights, inside one
``tf.function`` (XLA off and on). It covers keras ``Dense``, the three tfbnn layers,
and TFP's three layers (tf_keras), all with an N(0, 1) prior and a closed-form KL;
and the iBNN node layer (``NodeDense``, K = 4, closed-form KL) with its
normalizing-flow version (``NodeDenseFlow``: 2 RealNVP couplings of 50 hidden units
on the 1200 node-noise values of each example, Monte Carlo KL);
and the ensemble layers (``DenseBatchEnsemble``, ``DenseRank1``, E = 4 members of 32
rows each) against keras ``Dense``, and their convolutions (``Conv2DBatchEnsemble``,
``Conv2DRank1``, 3x3, 64 -> 64 channels on 16x16 maps, batch 32) against keras ``Conv2D``.

Every function runs in one process, in ``--rounds`` interleaved rounds of ``--calls``
calls each, so that slow stretches of a shared machine hit them all. The table
reports the best round (ms per call) and the ratios to keras ``Dense`` and to the
TFP equivalent.

Usage:
    python benchmarks/layer_step.py [--rounds 15] [--calls 5]

Writes benchmarks/results/layer_step.json and prints a table.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402

import tfbnn  # noqa: E402

import _readme  # noqa: E402
from _results import default_path, finish, interleaved_ms  # noqa: E402

BATCH, UNITS = 128, 1200
ENSEMBLE = 4
CONV_BATCH, CONV_SIDE, CONV_CHANNELS = 32, 16, 64
#: The deterministic Keras counterpart each row is compared with (keras Dense otherwise).
KERAS_BASELINE = {"conv_keras": "conv_keras", "conv_batch_ensemble": "conv_keras", "conv_rank1": "conv_keras"}
N = 60_000  # the KL scale 1/N (any positive value: it only scales one term)
TFP_EQUIVALENT = {"tfbnn_reparam": "tfp_reparam", "tfbnn_flipout": "tfp_flipout", "tfbnn_local": "tfp_local"}


def _layers():
    tfd = tfp.distributions

    def divergence(q, p, _):
        return tfd.kl_divergence(q, p) / N

    return {
        "keras_dense": keras.layers.Dense(UNITS),
        "tfbnn_reparam": tfbnn.DenseReparameterization(UNITS, kl_weight=1 / N, seed=1),
        "tfbnn_flipout": tfbnn.DenseFlipout(UNITS, kl_weight=1 / N, seed=2),
        "tfbnn_local": tfbnn.DenseLocalReparameterization(UNITS, kl_weight=1 / N, seed=3),
        "tfbnn_node": tfbnn.NodeDense(UNITS, kl_weight=1 / N, seed=4),
        "tfbnn_node_flow": tfbnn.NodeDenseFlow(UNITS, kl_weight=1 / N, seed=5),
        "tfp_reparam": tfp.layers.DenseReparameterization(UNITS, kernel_divergence_fn=divergence),
        "tfp_flipout": tfp.layers.DenseFlipout(UNITS, kernel_divergence_fn=divergence),
        "tfp_local": tfp.layers.DenseLocalReparameterization(UNITS, kernel_divergence_fn=divergence),
        "tfbnn_batch_ensemble": tfbnn.layers.DenseBatchEnsemble(UNITS, ensemble_size=ENSEMBLE, seed=4),
        "tfbnn_rank1": tfbnn.layers.DenseRank1(UNITS, ensemble_size=ENSEMBLE, kl_weight=1 / N, seed=5),
    }


def _conv_layers():
    return {
        "conv_keras": keras.layers.Conv2D(CONV_CHANNELS, 3, padding="same"),
        "conv_batch_ensemble": tfbnn.layers.Conv2DBatchEnsemble(CONV_CHANNELS, 3, padding="same",
                                                                ensemble_size=ENSEMBLE, seed=6),
        "conv_rank1": tfbnn.layers.Conv2DRank1(CONV_CHANNELS, 3, padding="same", ensemble_size=ENSEMBLE,
                                               kl_weight=1 / N, seed=7),
    }


def _step(layer, x, keras3):
    def step():
        with tf.GradientTape() as tape:
            y = layer(x, training=True) if keras3 else layer(x)
            loss = tf.reduce_sum(y)
            if layer.losses:
                loss = loss + tf.add_n(layer.losses)
        return tape.gradient(loss, layer.trainable_weights)

    return step


def run(rounds, calls):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(BATCH, UNITS)).astype("float32"))
    images = tf.constant(rng.normal(size=(CONV_BATCH, CONV_SIDE, CONV_SIDE, CONV_CHANNELS)).astype("float32"))
    layers = {**_layers(), **_conv_layers()}
    inputs = {name: images if name.startswith("conv_") else x for name in layers}
    for name, layer in layers.items():
        layer(inputs[name])
    rows = []
    for xla in (False, True):
        steps = {name: tf.function(_step(layer, inputs[name], not name.startswith("tfp_")), jit_compile=xla)
                 for name, layer in layers.items()}
        for step in steps.values():
            step()  # trace and compile
        times = interleaved_ms(steps, rounds, calls)
        for name, values in times.items():
            rows.append({"impl": name, "xla": xla, "ms": min(values), "median_ms": float(np.median(values))})
    return rows


def report(rows):
    lines = ["| layer (dense 1200 -> 1200, batch 128; conv_*: 3x3 64 -> 64, 16x16, batch 32) | XLA | "
             "ms fwd+bwd (best) | x keras Dense / Conv2D | x TFP equivalent |",
             "|---|---|---|---|---|"]
    by_key = {(r["impl"], r["xla"]): r for r in rows}
    for r in rows:
        base = by_key[(KERAS_BASELINE.get(r["impl"], "keras_dense"), r["xla"])]["ms"]
        tfp_row = by_key.get((TFP_EQUIVALENT.get(r["impl"]), r["xla"]))
        vs_tfp = f"{r['ms'] / tfp_row['ms']:.2f}" if tfp_row else "-"
        lines.append(f"| {r['impl']} | {'on' if r['xla'] else 'off'} | {r['ms']:.2f} | {r['ms'] / base:.2f} | {vs_tfp} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", default=default_path("layer_step.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    rows = run(args.rounds, args.calls)
    finish("layer_step", report(rows), args.out, {"rows": rows, "rounds": args.rounds, "calls": args.calls},
           args.write_readme)


if __name__ == "__main__":
    main()
