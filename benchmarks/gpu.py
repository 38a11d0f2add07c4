"""The dense and convolution side by side on GPUs: mixed precision off and on, one GPU and all of them.

One script for a GPU machine, to run unchanged there: the models of ``dense_layers.py`` (the Blundell
MLP 784-1200-1200-10) and of ``conv_layers.py`` (LeNet-5 and the ResNet-20-sized stack), each with
every layer under test (keras' own layer, tfbnn's estimators, TFP's layers under tf_keras with
tf_keras' own layer as their baseline), for each precision (``float32``, ``mixed_float16``,
``mixed_bfloat16``: the policy set in both Keras 3 and tf_keras before a model is built) and each
placement:

  one GPU      ``tf.distribute.OneDeviceStrategy("/gpu:0")``, the per-replica batch
  mirrored     ``tf.distribute.MirroredStrategy`` over every visible GPU (only with two or more),
               the per-replica batch on each, so the global batch grows with the GPUs

Per-replica batches: 128 (the MLP), 32 (LeNet-5), 16 (the stack); Adam(1e-3), softmax
cross-entropy, random data, N(0, 1) prior and the closed-form KL / N for every Bayesian layer.
The models of one (network, precision, placement) group are built, compiled and traced first,
then timed interleaved (``--rounds`` rounds of ``--steps`` train steps each, the best round kept,
the medians in the JSON), as ``conv_layers.py`` times them, so each ratio ("x own baseline": to
the row's framework's deterministic layer; "x TFP": a tfbnn row over TFP's layer of the same
estimator) is of two numbers measured side by side. A model that fails to build or train (TFP's
layers under a mixed policy, say) is a row saying why.

Usage:
    python benchmarks/gpu.py                      # every group on the visible GPUs
    python benchmarks/gpu.py --write-readme       # ... and the table into benchmarks/README.md
    python benchmarks/gpu.py --networks lenet5 --precision float32 mixed_float16

On a machine without a GPU it says so and measures nothing (exit 0). ``--allow-cpu`` runs the same
code on the CPU instead (one device; a check of this script, not a GPU measurement).

Writes benchmarks/results/gpu.json and prints the table.
"""

import argparse
import os
import statistics

import _readme
import conv_layers
import dense_layers
from _results import default_path, finish, interleaved_ms

#: network -> (input shape, per-replica batch, the layers under test, the builder's module)
NETWORKS = {
    "mlp": ((dense_layers.SIZES[0],), dense_layers.BATCH,
            ["keras_dense", "floor_local", "floor_local_softplus", "tfbnn_reparam", "tfbnn_flipout", "tfbnn_local", "tf_keras_dense", "tfp_reparam",
             "tfp_flipout", "tfp_local"]),
    "lenet5": (conv_layers.NETWORKS["lenet5"][0], conv_layers.NETWORKS["lenet5"][1], conv_layers.IMPLEMENTATIONS),
    "resnet20": (conv_layers.NETWORKS["resnet20"][0], conv_layers.NETWORKS["resnet20"][1],
                 conv_layers.IMPLEMENTATIONS),
}
PRECISIONS = ["float32", "mixed_float16", "mixed_bfloat16"]
#: a Bayesian layer -> its framework's deterministic baseline, and TFP's layer of the same estimator
TFP_EQUIVALENT = {**dense_layers.TFP_EQUIVALENT, **conv_layers.TFP_EQUIVALENT}
NO_GPU = "No GPU is visible to TensorFlow: nothing measured (this script is for a GPU machine; --allow-cpu runs it on the CPU)."


def _baseline(impl, network):
    own_framework = impl.startswith(("tfp_", "tf_keras_"))
    if network == "mlp":
        return "tf_keras_dense" if own_framework else "keras_dense"
    return "tf_keras_conv" if own_framework else "keras_conv"


def _build(network, impl, n):
    """``(framework, uncompiled model)`` of ``network`` with ``impl``'s layers."""
    if network == "mlp":
        tf_keras_row = impl.startswith(("tfp_", "tf_keras_"))
        return (dense_layers._tf_keras_model if tf_keras_row else dense_layers._keras3_model)(impl, n)
    return conv_layers.build(network, impl, n)


def _set_policy(precision):
    """The global dtype policy of Keras 3 and of tf_keras (TFP's framework)."""
    import keras
    import tf_keras

    keras.mixed_precision.set_global_policy(precision)
    tf_keras.mixed_precision.set_global_policy(precision)


def placements(allow_cpu):
    """``[(name, strategy, replicas)]`` for the visible devices; ``[]`` without a GPU (unless ``allow_cpu``)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return [("cpu", tf.distribute.OneDeviceStrategy("/cpu:0"), 1)] if allow_cpu else []
    found = [("one GPU", tf.distribute.OneDeviceStrategy(gpus[0].name), 1)]
    if len(gpus) > 1:
        found.append((f"mirrored x{len(gpus)}", tf.distribute.MirroredStrategy([g.name for g in gpus]), len(gpus)))
    return found


def run_group(network, impls, precision, placement, steps, rounds):
    """The rows of one (network, precision, placement) group, its models timed interleaved."""
    import numpy as np
    import tensorflow as tf

    name, strategy, replicas = placement
    shape, batch, _ = NETWORKS[network]
    batch *= replicas
    n = steps * batch
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(batch, *shape)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, size=batch).astype("int32"))
    common = {"network": network, "precision": precision, "placement": name, "replicas": replicas, "batch": batch}
    rows, steps_of = [], {}
    _set_policy(precision)
    try:
        for impl in impls:
            try:
                with strategy.scope():
                    lib, model = _build(network, impl, n)
                    model.compile(optimizer=lib.optimizers.Adam(1e-3),
                                  loss=lib.losses.SparseCategoricalCrossentropy(from_logits=True))
                model.train_on_batch(x, y)  # trace outside the timing
            except Exception as error:  # noqa: BLE001 (a row says why the layer does not run here)
                rows.append({**common, "impl": impl, "error": f"{type(error).__name__}: {error}".splitlines()[0][:200]})
                print(f"  {network} {impl:14s} {precision:14s} {name}: failed ({rows[-1]['error'][:80]})", flush=True)
                continue
            steps_of[impl] = lambda m=model: m.train_on_batch(x, y)
            print(f"  built {network} {impl:14s} {precision:14s} {name}", flush=True)
    finally:
        _set_policy("float32")
    for impl, t in interleaved_ms(steps_of, rounds, steps).items():
        rows.append({**common, "impl": impl, "ms_per_step": min(t), "median_ms_per_step": statistics.median(t),
                     "rounds": t})
    return rows


def report(rows):
    """The table: one line per row, its ratios to the baselines of its own group."""
    lines = ["| network | precision | placement | global batch | layer | ms / step (best) | x own baseline | x TFP equivalent |",
             "|---|---|---|---|---|---|---|---|"]
    by_key = {(r["network"], r["precision"], r["placement"], r["impl"]): r for r in rows if "error" not in r}

    def ratio(r, other):
        return f"{r['ms_per_step'] / other['ms_per_step']:.2f}" if other else "-"

    for r in rows:
        group = (r["network"], r["precision"], r["placement"])
        head = f"| {r['network']} | {r['precision']} | {r['placement']} | {r['batch']} | {r['impl']} |"
        if "error" in r:
            lines.append(f"{head} failed: {r['error'][:70]} | | |")
            continue
        base = by_key.get((*group, _baseline(r["impl"], r["network"])))
        tfp_row = by_key.get((*group, TFP_EQUIVALENT.get(r["impl"])))
        lines.append(f"{head} {r['ms_per_step']:.2f} | {ratio(r, base)} | {ratio(r, tfp_row)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", nargs="+", choices=list(NETWORKS), default=list(NETWORKS))
    parser.add_argument("--impl", nargs="+", help="only these layers (names of dense_layers.py / conv_layers.py)")
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=PRECISIONS)
    parser.add_argument("--steps", type=int, default=10, help="train steps per model and round (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best is reported (default 5)")
    parser.add_argument("--allow-cpu", action="store_true", help="without a GPU, run on the CPU (checks the script)")
    parser.add_argument("--out", default=default_path("gpu.json"))
    _readme.add_flag(parser)
    args = parser.parse_args(argv)
    for option in ("steps", "rounds"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be at least 1. Received: {getattr(args, option)}")
    known = {impl for _, _, impls in NETWORKS.values() for impl in impls}
    if args.impl and not set(args.impl) <= known:
        parser.error(f"--impl takes {sorted(known)}. Received: {sorted(set(args.impl) - known)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    found = placements(args.allow_cpu)
    if not found:
        print(NO_GPU)
        return 0
    rows = []
    for network in args.networks:
        impls = [i for i in NETWORKS[network][2] if not args.impl or i in args.impl]
        for precision in args.precision:
            for placement in found:
                rows += run_group(network, impls, precision, placement, args.steps, args.rounds)
    devices = [placement for placement, _, _ in found]
    finish("gpu", report(rows), args.out, {"rows": rows, "steps": args.steps, "rounds": args.rounds,
                                           "placements": devices}, args.write_readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
