"""Train-step time of tfbnn's convolutions with TensorFlow's input gradient and with the forward one.

``tfbnn.layers.set_conv_input_gradient("forward")`` replaces a stride-1 convolution's input
gradient (TensorFlow's ``Conv2DBackpropInput``) by a forward convolution of the padded output
gradient with the flipped kernel (tfbnn/layers/conv_gradient.py). Three networks, their 2-D
convolutions tfbnn's Conv2DReparameterization / Conv2DFlipout / Conv2DVariationalDropout:
LeNet-5 and the ResNet-20-sized stack of benchmarks/conv_layers.py (batch 32 and 16) and a
VGG-16 tail (4x4x256 inputs, three 512-channel 3x3 convolutions, max-pool to 2x2, three more,
global average pool, dense 10; batch 16: the last two stages of VGG-16 on 32x32 images, where
the maps are smallest and the channels most). Every model is built, traced and timed in one
process, interleaved (``--rounds`` rounds of ``--steps`` steps of every model in turn); the table
keeps each model's best round. Before timing, the two gradients of each network's first step are
compared (largest difference relative to the largest gradient entry).

    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/conv_gradient.py     # Eigen (AMD, ARM CPUs)
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/conv_gradient.py     # oneDNN

Writes benchmarks/results/conv_gradient_<eigen|onednn>.json and the table of both paths' last runs
to benchmarks/results/conv_gradient.json (``--write-readme``: into benchmarks/README.md, between the
``conv_gradient`` markers).
"""

import argparse
import os
import statistics
import sys

import _readme
import conv_layers
from _results import KERNEL_PATHS, default_path, finish, interleaved_ms, kernel_path, save_path_rows

IMPLEMENTATIONS = ["tfbnn_reparam", "tfbnn_flipout", "tfbnn_vd"]
NETWORKS = {"lenet5": None, "resnet20": None, "vgg_tail": ((4, 4, 256), 16)}
MODES = ("tensorflow", "forward")


def build(network, impl, n):
    if network != "vgg_tail":
        return conv_layers.build(network, impl, n)
    lib, conv = conv_layers._conv_factory(impl, n)
    inputs = lib.Input(NETWORKS["vgg_tail"][0])
    h = inputs
    for stage in range(2):
        for _ in range(3):
            h = conv(512, 3, 1, "relu")(h)
        if not stage:
            h = lib.layers.MaxPooling2D()(h)
    return lib, lib.Model(inputs, lib.layers.Dense(10)(lib.layers.GlobalAveragePooling2D()(h)))


def _shape(network):
    return NETWORKS[network] or conv_layers.NETWORKS[network]


def run(networks, impls, steps, rounds):
    import keras
    import numpy as np
    import tensorflow as tf

    import tfbnn

    rows = []
    for network in networks:
        shape, batch = _shape(network)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.normal(size=(batch, *shape)).astype("float32"))
        y = tf.constant(rng.integers(0, 10, size=batch).astype("int32"))
        trainers, agreement = {}, {}
        for impl in impls:
            gradients = {}
            for mode in MODES:
                previous = tfbnn.layers.set_conv_input_gradient(mode)
                keras.utils.set_random_seed(0)
                _, model = build(network, impl, steps * batch)
                model.compile(optimizer=keras.optimizers.Adam(1e-3),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

                @tf.function
                def first_gradient(model=model):
                    with tf.GradientTape() as tape:
                        loss = model.compute_loss(x, y, model(x, training=True), training=True)
                    return tape.gradient(loss, model.trainable_variables)

                gradients[mode] = [g.numpy() for g in first_gradient()]
                model.train_on_batch(x, y)  # traced with this mode, outside the timing
                tfbnn.layers.set_conv_input_gradient(previous)
                trainers[(impl, mode)] = model
                print(f"  built {network} {impl:14s} input gradient: {mode}", flush=True)
            scale = max(float(np.max(np.abs(g))) for g in gradients["tensorflow"])
            agreement[impl] = max(float(np.max(np.abs(a - b))) for a, b in
                                  zip(gradients["tensorflow"], gradients["forward"])) / scale
        times = interleaved_ms({key: (lambda m=model: m.train_on_batch(x, y)) for key, model in trainers.items()},
                               rounds, steps)
        for (impl, mode), t in times.items():
            rows.append({"network": network, "impl": impl, "input_gradient": mode, "ms_per_step": min(t),
                         "median_ms_per_step": statistics.median(t), "rounds": t,
                         "relative_gradient_difference": agreement[impl]})
    return rows


def report(rows):
    """One line per network and layer: both gradients' step times, the speed-up, the gradients' agreement."""
    lines = ["| kernels | network | layer | TensorFlow's gradient (ms / step) | forward gradient (ms / step) | "
             "speed-up | max. relative gradient difference |", "|---|---|---|---|---|---|---|"]
    by_key = {(r["kernels"], r["network"], r["impl"], r["input_gradient"]): r for r in rows}
    for (kernels, network, impl, mode), r in by_key.items():
        if mode != "tensorflow":
            continue
        f = by_key[(kernels, network, impl, "forward")]
        lines.append(f"| {kernels} | {network} | {impl} | {r['ms_per_step']:.1f} | {f['ms_per_step']:.1f} | "
                     f"{r['ms_per_step'] / f['ms_per_step']:.2f} | {r['relative_gradient_difference']:.1e} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", nargs="+", choices=list(NETWORKS), default=list(NETWORKS))
    parser.add_argument("--impl", nargs="+", choices=IMPLEMENTATIONS, default=IMPLEMENTATIONS)
    parser.add_argument("--steps", type=int, default=3, help="train steps per model and round (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best is reported (default 5)")
    parser.add_argument("--out", default=default_path("conv_gradient.json"), help="the table of both kernel paths")
    _readme.add_flag(parser)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    rows = [dict(r, kernels=KERNEL_PATHS[kernel_path()])
            for r in run(args.networks, args.impl, args.steps, args.rounds)]
    both = save_path_rows("conv_gradient", rows, steps=args.steps, rounds=args.rounds)
    finish("conv_gradient", report(both), args.out, {"rows": both}, args.write_readme)


if __name__ == "__main__":
    sys.exit(main())
