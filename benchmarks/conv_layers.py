"""Train-step time of Bayesian convolutions against each framework's own Conv2D, side by side.

Two networks, every 2-D convolution replaced by the layer under test (the dense layers stay
deterministic): LeNet-5 (28x28x1: conv 6@5x5, pool, conv 16@5x5, pool, dense 120-84-10) and a
ResNet-20-sized stack (32x32x3: a 16-channel stem and three stages of three residual blocks of two
3x3 convolutions, 16/32/64 channels, stride 2 between stages; 19 convolutions). Batch 32 (LeNet-5)
and 16 (the stack), Adam(1e-3), softmax cross-entropy, random data.

Implementations (the Bayesian layers with an N(0, 1) prior and the closed-form KL / N):
  keras_conv        keras.layers.Conv2D (Keras 3), the baseline of tfbnn's rows
  tfbnn_reparam     tfbnn.layers.Conv2DReparameterization
  tfbnn_flipout     tfbnn.layers.Conv2DFlipout
  tfbnn_vd          tfbnn.layers.Conv2DVariationalDropout (local reparameterization of the
                    activations, Molchanov et al. 2017; tfbnn has no other convolution with it)
  tf_keras_conv     tf_keras.layers.Conv2D: the baseline of TFP's rows (its framework)
  tfp_reparam       tfp.layers.Convolution2DReparameterization (tf_keras)
  tfp_flipout       tfp.layers.Convolution2DFlipout (tf_keras)

Every model is built and compiled in one process and timed interleaved: ``--rounds`` rounds, each
running ``--steps`` train steps of every model in turn (the slow stretches of a shared machine hit
every row alike); the table keeps each model's best round (milliseconds per step, best-of-N as
``timeit`` does) and the JSON the medians. The ratio "x own Conv2D" divides by the baseline of the
row's framework measured in the same run; "x TFP" divides a tfbnn row by TFP's layer of the same
estimator. ``--xla both`` also times every model compiled with ``jit_compile=True``.

The kernel library is chosen when TensorFlow loads, so the two paths are two runs::

    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/conv_layers.py     # Eigen (AMD, ARM CPUs)
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/conv_layers.py     # oneDNN (x86 default)

Writes this path's rows to benchmarks/results/conv_layers_<eigen|onednn>.json, then prints the table
of both paths' rows (the other path's from its last run) and writes it to
benchmarks/results/conv_layers.json (``--write-readme``: into benchmarks/README.md, between the
``conv_layers`` markers).
"""

import argparse
import os
import statistics
import sys

import _readme
from _results import KERNEL_PATHS, default_path, finish, interleaved_ms, kernel_path, save_path_rows

IMPLEMENTATIONS = ["keras_conv", "tfbnn_reparam", "tfbnn_flipout", "tfbnn_vd", "tf_keras_conv", "tfp_reparam",
                   "tfp_flipout"]
TFP_EQUIVALENT = {"tfbnn_reparam": "tfp_reparam", "tfbnn_flipout": "tfp_flipout"}
NETWORKS = {"lenet5": ((28, 28, 1), 32), "resnet20": ((32, 32, 3), 16)}


def _conv_factory(impl, n):
    """``make(filters, kernel, strides, activation) -> layer`` and the framework (keras or tf_keras)."""
    if impl in ("tf_keras_conv", "tfp_reparam", "tfp_flipout"):
        import tensorflow_probability as tfp
        import tf_keras

        if impl == "tf_keras_conv":
            return tf_keras, lambda f, k, s, a: tf_keras.layers.Conv2D(f, k, strides=s, padding="same", activation=a)
        cls = tfp.layers.Convolution2DReparameterization if impl == "tfp_reparam" else tfp.layers.Convolution2DFlipout

        def divergence(q, p, _):
            return tfp.distributions.kl_divergence(q, p) / n

        return tf_keras, lambda f, k, s, a: cls(f, k, strides=s, padding="same", activation=a,
                                                kernel_divergence_fn=divergence)
    import keras

    import tfbnn

    if impl == "keras_conv":
        return keras, lambda f, k, s, a: keras.layers.Conv2D(f, k, strides=s, padding="same", activation=a)
    cls = {"tfbnn_reparam": tfbnn.layers.Conv2DReparameterization, "tfbnn_flipout": tfbnn.layers.Conv2DFlipout,
           "tfbnn_vd": tfbnn.layers.Conv2DVariationalDropout}[impl]
    return keras, lambda f, k, s, a: cls(f, k, strides=s, padding="same", activation=a, kl_weight=1.0 / n)


def build(network, impl, n):
    """The network with ``impl``'s convolutions: ``(framework, model)``."""
    lib, conv = _conv_factory(impl, n)
    layers = lib.layers
    shape, _ = NETWORKS[network]
    inputs = lib.Input(shape)
    if network == "lenet5":
        h = layers.MaxPooling2D()(conv(6, 5, 1, "relu")(inputs))
        h = layers.MaxPooling2D()(conv(16, 5, 1, "relu")(h))
        h = layers.Dense(84, activation="relu")(layers.Dense(120, activation="relu")(layers.Flatten()(h)))
        return lib, lib.Model(inputs, layers.Dense(10)(h))
    h = conv(16, 3, 1, "relu")(inputs)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage and not block else 1
            shortcut = h if strides == 1 and h.shape[-1] == filters else conv(filters, 1, strides, None)(h)
            r = conv(filters, 3, strides, "relu")(h)
            h = layers.Activation("relu")(layers.Add()([shortcut, conv(filters, 3, 1, None)(r)]))
    return lib, lib.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling2D()(h)))


def run(networks, impls, xla_modes, steps, rounds):
    import tfbnn  # noqa: F401  (first: it chooses TensorFlow's CPU allocator before the first tensor)

    import numpy as np
    import tensorflow as tf

    rows = []
    for network in networks:
        shape, batch = NETWORKS[network]
        n = steps * batch
        rng = np.random.default_rng(0)
        x = tf.constant(rng.normal(size=(batch, *shape)).astype("float32"))
        y = tf.constant(rng.integers(0, 10, size=batch).astype("int32"))
        trainers = {}
        for xla in xla_modes:
            for impl in impls:
                lib, model = build(network, impl, n)
                model.compile(optimizer=lib.optimizers.Adam(1e-3),
                              loss=lib.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=xla)
                model.train_on_batch(x, y)  # trace (and compile) outside the timing
                trainers[(impl, xla)] = model
                print(f"  built {network} {impl:14s} xla={'on' if xla else 'off'}", flush=True)
        times = interleaved_ms({key: (lambda m=model: m.train_on_batch(x, y)) for key, model in trainers.items()},
                               rounds, steps)
        for (impl, xla), t in times.items():
            rows.append({"network": network, "impl": impl, "xla": xla, "ms_per_step": min(t),
                         "median_ms_per_step": statistics.median(t), "rounds": t})
    return rows


KERNELS = KERNEL_PATHS


def report(rows):
    """The table; "x own Conv2D" divides by the row's framework's Conv2D (same kernel path, same run), "x TFP"
    a tfbnn row by TFP's layer of the same estimator."""
    lines = ["| kernels | network | layer | XLA | ms / step (best) | x own Conv2D | x TFP equivalent |",
             "|---|---|---|---|---|---|---|"]
    by_key = {(r["kernels"], r["network"], r["impl"], r["xla"]): r for r in rows}

    def ratio(r, other):
        return f"{r['ms_per_step'] / other['ms_per_step']:.2f}" if other else "-"

    for r in rows:
        own = "tf_keras_conv" if r["impl"].startswith(("tfp_", "tf_keras_")) else "keras_conv"
        base = by_key.get((r["kernels"], r["network"], own, r["xla"]))
        tfp_row = by_key.get((r["kernels"], r["network"], TFP_EQUIVALENT.get(r["impl"]), r["xla"]))
        lines.append(f"| {r['kernels']} | {r['network']} | {r['impl']} | {'on' if r['xla'] else 'off'} | "
                     f"{r['ms_per_step']:.1f} | {ratio(r, base)} | {ratio(r, tfp_row)} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", nargs="+", choices=list(NETWORKS), default=list(NETWORKS))
    parser.add_argument("--impl", nargs="+", choices=IMPLEMENTATIONS, default=IMPLEMENTATIONS)
    parser.add_argument("--xla", choices=["off", "on", "both"], default="both")
    parser.add_argument("--steps", type=int, default=5, help="train steps per model and round (default 5)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best is reported (default 5)")
    parser.add_argument("--out", default=default_path("conv_layers.json"), help="the table of both kernel paths")
    _readme.add_flag(parser)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.xla]
    rows = [dict(r, kernels=KERNELS[kernel_path()]) for r in run(args.networks, args.impl, modes, args.steps,
                                                                  args.rounds)]
    both = save_path_rows("conv_layers", rows, steps=args.steps, rounds=args.rounds)
    finish("conv_layers", report(both), args.out, {"rows": both}, args.write_readme)


if __name__ == "__main__":
    sys.exit(main())
