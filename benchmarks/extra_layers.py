"""Forward + backward time of the 3-D, transposed, embedding, recurrent, DenseVariational and low-rank
layers against their Keras twins.

Each Bayesian layer is timed next to its deterministic Keras counterpart, on the same
input, as in ``layer_step.py``: the time to compute ``sum(y) + layer losses`` and its
gradient with respect to the layer's trainable weights inside one ``tf.function``
(XLA off; ``--xla`` adds the compiled runs). The cases:

* ``Conv3D`` (batch 4, 12^3 x 8 -> 16 filters, 3^3 kernel, "same") against
  ``Conv3DReparameterization`` and ``Conv3DFlipout``;
* ``Conv{1,2,3}DTranspose`` (stride 2, kernel 3, "same") against
  ``Conv{1,2,3}DTranspose{Reparameterization,Flipout}``;
* ``Embedding`` (20 000 x 128, batch 32 x 64 ids) against ``EmbeddingReparameterization``
  (which samples only the looked-up rows);
* ``LSTM`` and ``GRU`` (batch 32, 20 steps, 32 -> 64 units) against
  ``LSTMReparameterization`` and ``GRUReparameterization`` (one weight sample per sequence);
* ``Dense`` 32 -> 32 at batch 128 against ``DenseVariational`` with the mean-field, the
  full-covariance (``MultivariateNormalTriL`` over all 1,056 weights) and the low-rank
  (rank 8) posterior (TFP's ``make_posterior_fn`` contract);
* ``Dense`` 1200 -> 1200 at batch 128 against the mean-field ``DenseReparameterization``
  and ``DenseReparameterization(posterior="low_rank", posterior_rank=r)`` (default
  ``r = 8``; 1.44M weights, the KL through the ``r x r`` capacitance matrix), and the
  low-rank ``DenseLocalReparameterization``.

Every function runs in one process, in ``--rounds`` interleaved rounds of ``--calls``
calls each, so that slow stretches of a shared machine hit them all. The table gives
the best round (ms per call), the ratio to the Keras layer of its case and, for the
low-rank dense layers, to the mean-field ``DenseReparameterization``.

Usage:
    python benchmarks/extra_layers.py [--rounds 10] [--calls 5] [--rank 8] [--xla]

Writes benchmarks/results/extra_layers.json and prints a table.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfbnn  # noqa: E402

import _readme  # noqa: E402
from _results import default_path, finish, interleaved_ms  # noqa: E402
from layer_step import _step  # noqa: E402

N = 60_000  # the KL scale 1/N (any positive value: it only scales one term)
MEAN_FIELD = "DenseReparameterization"


def _conv_case(rank, transpose, batch, side, channels, filters):
    suffix = "DTranspose" if transpose else "D"
    keras_cls = getattr(keras.layers, f"Conv{rank}{suffix}")
    strides = 2 if transpose else 1
    make = {"keras": lambda: keras_cls(filters, 3, strides=strides, padding="same")}
    for seed, estimator in enumerate(("Reparameterization", "Flipout")):
        cls = getattr(tfbnn.layers, f"Conv{rank}{suffix}{estimator}")
        make[cls.__name__] = (lambda cls=cls, seed=seed: cls(filters, 3, strides=strides, padding="same",
                                                                 kl_weight=1 / N, seed=seed))
    shape = (batch,) + (side,) * rank + (channels,)
    return f"Conv{rank}{suffix}", shape, "float32", make


def cases(rank):
    """``[(case, input shape, dtype, {name: layer factory})]``; the Keras twin is named ``"keras"``."""
    dense = {
        "keras": lambda: keras.layers.Dense(1200),
        MEAN_FIELD: lambda: tfbnn.DenseReparameterization(1200, kl_weight=1 / N, seed=1),
        f"DenseReparameterization low_rank r={rank}": lambda: tfbnn.DenseReparameterization(
            1200, posterior="low_rank", posterior_rank=rank, kl_weight=1 / N, seed=2),
        f"DenseLocalReparameterization low_rank r={rank}": lambda: tfbnn.DenseLocalReparameterization(
            1200, posterior="low_rank", posterior_rank=rank, kl_weight=1 / N, seed=3),
    }
    embedding = {
        "keras": lambda: keras.layers.Embedding(20_000, 128),
        "EmbeddingReparameterization": lambda: tfbnn.EmbeddingReparameterization(20_000, 128, kl_weight=1 / N,
                                                                                   seed=4),
    }
    recurrent = [(name, (32, 20, 32), "float32", {
        "keras": lambda cls=getattr(keras.layers, name): cls(64),
        f"{name}Reparameterization": lambda cls=getattr(tfbnn.layers, f"{name}Reparameterization"), seed=seed: cls(
            64, kl_weight=1 / N, seed=seed)}) for seed, name in enumerate(("LSTM", "GRU"), start=5)]
    posteriors = tfbnn.posteriors
    variational = {"keras": lambda: keras.layers.Dense(32)}
    for seed, (label, make_posterior) in enumerate((
            ("mean_field", lambda: "mean_field"), ("full covariance", lambda: posteriors.FullCovarianceNormal()),
            ("low_rank r=8", lambda: posteriors.LowRankNormal(rank=8))), start=7):
        variational[f"DenseVariational {label}"] = (
            lambda make_posterior=make_posterior, seed=seed: tfbnn.layers.DenseVariational(
                32, make_posterior(), "normal", kl_weight=1 / N, seed=seed))
    return [
        _conv_case(3, False, 4, 12, 8, 16),
        _conv_case(1, True, 32, 64, 16, 16),
        _conv_case(2, True, 16, 16, 16, 16),
        _conv_case(3, True, 4, 8, 8, 8),
        ("Embedding", (32, 64), "int32", embedding),
        *recurrent,
        ("Dense 32", (128, 32), "float32", variational),
        ("Dense 1200", (128, 1200), "float32", dense),
    ]


def _inputs(shape, dtype):
    rng = np.random.default_rng(0)
    if dtype == "int32":
        return tf.constant(rng.integers(0, 20_000, size=shape).astype("int32"))
    return tf.constant(rng.normal(size=shape).astype("float32"))


def run(rounds, calls, rank, xla_modes):
    rows = []
    for case, shape, dtype, factories in cases(rank):
        x = _inputs(shape, dtype)
        layers = {name: make() for name, make in factories.items()}
        for layer in layers.values():
            layer(x)
        for xla in xla_modes:
            steps = {name: tf.function(_step(layer, x, True), jit_compile=xla) for name, layer in layers.items()}
            for step in steps.values():
                step()  # trace and compile
            times = interleaved_ms(steps, rounds, calls)
            for name, values in times.items():
                rows.append({"case": case, "impl": name, "xla": xla, "ms": min(values),
                             "median_ms": float(np.median(values))})
    return rows


def report(rows):
    lines = ["| case | layer | XLA | ms fwd+bwd (best) | x Keras layer | x mean-field DenseReparameterization |",
             "|---|---|---|---|---|---|"]
    by_key = {(r["case"], r["impl"], r["xla"]): r for r in rows}
    for r in rows:
        base = by_key[(r["case"], "keras", r["xla"])]["ms"]
        mean_field = by_key.get((r["case"], MEAN_FIELD, r["xla"]))
        vs_mean_field = f"{r['ms'] / mean_field['ms']:.2f}" if mean_field and "low_rank" in r["impl"] else "-"
        name = f"keras {r['case']}" if r["impl"] == "keras" else r["impl"]
        lines.append(f"| {r['case']} | {name} | {'on' if r['xla'] else 'off'} | {r['ms']:.2f} | "
                     f"{r['ms'] / base:.2f} | {vs_mean_field} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8, help="posterior_rank of the low-rank dense layers")
    parser.add_argument("--xla", action="store_true", help="also time every layer with jit_compile=True")
    parser.add_argument("--out", default=default_path("extra_layers.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    rows = run(args.rounds, args.calls, args.rank, (False, True) if args.xla else (False,))
    finish("extra_layers", report(rows), args.out,
           {"rows": rows, "rounds": args.rounds, "calls": args.calls, "rank": args.rank}, args.write_readme)


if __name__ == "__main__":
    main()
