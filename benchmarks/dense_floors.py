"""How close tfbnn's dense estimators come to their floors: one process, interleaved rounds.

The Blundell MLP 784-1200-1200-10 of benchmarks/dense_layers.py (ReLU, batch 128, Adam(1e-3),
softmax cross-entropy, N(0, 1) prior, KL / N), every model built, traced and timed in one
process: ``--rounds`` rounds of ``--steps`` ``train_on_batch`` steps of every model in turn, the
best round kept (the median is in the JSON); XLA off and on in two such processes. Interleaving lets a shared machine's slow stretches
hit every row alike, which the one-process-per-row runs of dense_layers.py (there for peak memory)
cannot: their ratios between rows move by 10-20% from run to run.

Rows:
  keras_dense                 keras.layers.Dense, the baseline
  floor_reparam               the least a reparameterization step must do: one weight draw
                              W = mu + s eps per step (s a free variable: no softplus, no KL),
                              one matmul, Adam on twice Dense's variables
  tfbnn_reparam               tfbnn.DenseReparameterization (sigma = softplus(rho) + 1e-6)
  tfbnn_reparam_logvar        the same with scale_parameterization="log_variance" (sigma^2 = exp(rho))
  floor_local                 the least local reparameterization must do: the x mu and x^2 v
                              matmuls, one normal draw per example and unit, v a free variable
                              (no softplus, no KL), Adam on twice Dense's variables
  floor_local_softplus        floor_local with v = (softplus(rho) + 1e-6)^2 (autodiff), no KL
  tfbnn_local                 tfbnn.DenseLocalReparameterization
  tfbnn_local_logvar          the same with scale_parameterization="log_variance"
  tfbnn_flipout               tfbnn.DenseFlipout (no floor: beside the others, with and without XLA)
  posterior_op_softplus       what the floors leave out, alone: the scale and closed-form KL of
  posterior_op_logvar         the three kernels and their gradients (tfbnn.kl's fused ops,
                              softplus_scale_and_normal_kl / log_variance_scale_and_normal_kl,
                              with an upstream gradient of sigma as a layer gives it), no model

Columns: "x floor" divides a layer by its floor; "floor + op" adds the posterior op of the layer's
parameterization to the floor, the work the layer cannot skip, and "x (floor + op)" divides the
layer by it: near 1, the layer's time is the floor's plus its posterior's arithmetic, nothing
else. "weight-sized ops" counts the operations of one traced train step (without XLA) whose
output has at least 900,000 elements (the two large kernels' size): the passes over the weights,
which the matmuls of 2 CPU cores outpace.

    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/dense_floors.py     # Eigen (AMD, ARM CPUs)
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/dense_floors.py     # oneDNN

Writes benchmarks/results/dense_floors_<eigen|onednn>.json and the table of both paths' last runs
to benchmarks/results/dense_floors.json (``--write-readme``: into benchmarks/README.md, between the
``dense_floors`` markers).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import _readme
import dense_layers
from _results import KERNEL_PATHS, default_path, finish, interleaved_ms, kernel_path, save_path_rows

MODELS = ["keras_dense", "floor_reparam", "tfbnn_reparam", "tfbnn_reparam_logvar", "floor_local",
          "floor_local_softplus", "tfbnn_local", "tfbnn_local_logvar", "tfbnn_flipout"]
OPS = ["posterior_op_softplus", "posterior_op_logvar"]
#: Each layer's floor and the posterior op of its parameterization.
FLOOR = {"tfbnn_reparam": "floor_reparam", "tfbnn_reparam_logvar": "floor_reparam",
         "tfbnn_local": "floor_local", "tfbnn_local_logvar": "floor_local"}
OP = {"tfbnn_reparam": "posterior_op_softplus", "tfbnn_reparam_logvar": "posterior_op_logvar",
      "tfbnn_local": "posterior_op_softplus", "tfbnn_local_logvar": "posterior_op_logvar"}
SIZES, BATCH = dense_layers.SIZES, dense_layers.BATCH
#: Outputs of at least this many elements count as passes over the weights (784 x 1200 = 940,800).
WEIGHT_SIZED = 900_000
_FREE_OPS = {"ReadVariableOp", "Identity", "IdentityN", "Const", "Placeholder"}


def posterior_op(name, n, xla):
    """The fused scale/KL op of the MLP's three kernels, forward and backward, as a step function."""
    import tensorflow as tf

    from tfbnn import kl, priors

    fused = kl.softplus_scale_and_normal_kl if name == "posterior_op_softplus" else kl.log_variance_scale_and_normal_kl
    rho0 = -5.0 if name == "posterior_op_softplus" else -10.0  # the layers' default initial sigma, ~0.0067
    shapes = list(zip(SIZES[:-1], SIZES[1:]))
    locs = [tf.Variable(tf.random.stateless_normal(s, seed=[0, i], stddev=0.03)) for i, s in enumerate(shapes)]
    rhos = [tf.Variable(tf.fill(s, rho0)) for s in shapes]
    upstream = [tf.random.stateless_normal(s, seed=[1, i]) for i, s in enumerate(shapes)]
    prior = priors.Normal(0.0, 1.0)

    @tf.function(jit_compile=xla)
    def step():
        with tf.GradientTape() as tape:
            total = 0.0
            for loc, rho, g in zip(locs, rhos, upstream):
                sigma, divergence = fused(loc, rho, prior)
                total += tf.reduce_sum(sigma * g) + divergence / n
        return tape.gradient(total, locs + rhos)

    return step


def weight_sized_ops(model, x, y):
    """The computing ops of one traced train step (loss, gradient, Adam) with an output of WEIGHT_SIZED or more."""
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x, y, model(x, training=True), training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(grads, model.trainable_variables)
        return loss

    graph = step.get_concrete_function(x, y).graph
    count = 0
    for op in graph.get_operations():
        if op.type in _FREE_OPS:
            continue
        for out in op.outputs:
            if out.shape.is_fully_defined() and out.shape.num_elements() >= WEIGHT_SIZED and out.consumers():
                count += 1
    return count


def run(steps, rounds, xla):
    """This process's rows: every model and op with XLA ``xla``, interleaved."""
    import tfbnn  # noqa: F401  (first: it chooses TensorFlow's CPU allocator before the first tensor)

    import keras
    import numpy as np
    import tensorflow as tf

    n = 60000  # the KL / N of a 60,000-example training set (MNIST's)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(BATCH, SIZES[0])).astype("float32"))
    y = tf.constant(rng.integers(0, SIZES[-1], size=BATCH).astype("int32"))
    trainers, passes = {}, {}
    for name in MODELS:
        keras.utils.set_random_seed(0)
        _, model = dense_layers._keras3_model(name, n)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=xla)
        model.train_on_batch(x, y)  # traced outside the timing
        passes[name] = None if xla else weight_sized_ops(model, x, y)
        trainers[name] = lambda m=model: m.train_on_batch(x, y)
        print(f"  built {name:22s} XLA {'on' if xla else 'off'}", file=sys.stderr, flush=True)
    for name in OPS:
        step = posterior_op(name, n, xla)
        step()
        trainers[name] = step
    times = interleaved_ms(trainers, rounds, steps)
    return [{"impl": name, "xla": xla, "ms_per_step": min(t), "median_ms_per_step": statistics.median(t),
             "rounds": t, "weight_sized_ops": passes.get(name)} for name, t in times.items()]


def report(rows):
    lines = ["| kernels | layer | XLA | ms / step (best) | ms / step (median) | x keras Dense | x floor | floor + op (ms) | "
             "x (floor + op) | weight-sized ops |", "|---|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["kernels"], r["impl"], r["xla"]): r for r in rows}
    for (kernels, name, xla), r in by_key.items():
        ms = r["ms_per_step"]
        dense = by_key.get((kernels, "keras_dense", xla))
        floor = by_key.get((kernels, FLOOR.get(name), xla))
        op = by_key.get((kernels, OP.get(name), xla))
        both = floor["ms_per_step"] + op["ms_per_step"] if floor and op else None
        cells = [kernels, name, "on" if xla else "off", f"{ms:.1f}", f"{r['median_ms_per_step']:.1f}",
                 f"{ms / dense['ms_per_step']:.2f}" if dense and not name.startswith("posterior_op") else "-",
                 f"{ms / floor['ms_per_step']:.2f}" if floor else "-", f"{both:.1f}" if both else "-",
                 f"{ms / both:.2f}" if both else "-",
                 "-" if xla or r["weight_sized_ops"] is None else str(r["weight_sized_ops"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="train steps per model and round (default 10)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds; the best is reported (default 9)")
    parser.add_argument("--out", default=default_path("dense_floors.json"), help="the table of both kernel paths")
    parser.add_argument("--worker", choices=["off", "on"], help=argparse.SUPPRESS)
    _readme.add_flag(parser)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.worker:
        print(json.dumps(run(args.steps, args.rounds, args.worker == "on")))
        return 0
    rows = []
    for mode in ("off", "on"):  # one process per XLA mode, as in dense_layers.py
        out = subprocess.run([sys.executable, __file__, "--worker", mode, "--steps", str(args.steps),
                              "--rounds", str(args.rounds)], stdout=subprocess.PIPE, text=True, check=True)
        rows += [dict(r, kernels=KERNEL_PATHS[kernel_path()]) for r in json.loads(out.stdout.strip().splitlines()[-1])]
    both = save_path_rows("dense_floors", rows, steps=args.steps, rounds=args.rounds)
    finish("dense_floors", report(both), args.out, {"rows": both}, args.write_readme)


if __name__ == "__main__":
    sys.exit(main())
