"""Stored size of a pruned LeNet-300-100 (784-300-100-10) against its sparsity.

For sparse variational dropout (``DenseVariationalDropout``) and Graves
(``GravesDense``) layers, prunes the given fraction of each kernel (the weights
with the smallest |theta|, a stand-in for a trained posterior; the file size does
not depend on which weights go) and writes:

* the Keras ``.keras`` file (uncompressed zip, no optimizer state);
* :func:`tfbnn.pruning.save_compressed` (a deflated ``.keras``, loadable as usual);
* :func:`tfbnn.pruning.export_sparse` (kept means only: a bit mask or index list and
  the values, in a compressed ``.npz``), and with ``include_scales=True``.

Prints one row per (method, sparsity) with the bytes and the ratio to the dense
``.keras``; ``--output`` writes the rows as JSON.

Run: ``python benchmarks/pruned_size.py``.
"""

import argparse
import os
import tempfile

import keras
import numpy as np

from tfbnn import convert, pruning

import _readme
from _results import default_path, write_json

SPARSITIES = (0.0, 0.5, 0.9, 0.95, 0.98, 0.99)


def lenet300_100(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(300, activation="relu", name="fc1"),
        keras.layers.Dense(100, activation="relu", name="fc2"),
        keras.layers.Dense(10, activation="softmax", name="fc3"),
    ])


def magnitude_masks(model, sparsity):
    masks = {}
    for layer in pruning.prunable_layers(model):
        theta = np.abs(layer.kernel_loc.numpy())
        k = int(round(sparsity * theta.size))
        keep = np.ones(theta.size, bool)
        keep[np.argsort(theta, axis=None)[:k]] = False
        masks[layer.name] = keep.reshape(theta.shape)
    return masks


def measure(method, sparsity, folder):
    model = convert.to_bayesian(lenet300_100(), method=method, init_scale="moped", seed=1)
    masks = magnitude_masks(model, sparsity)
    pruning.apply_masks(model, masks)
    plain = os.path.join(folder, "plain.keras")
    pruning.uncompiled_copy(model).save(plain)
    return {
        "method": method,
        "sparsity": pruning.sparsity(masks),
        "keras_bytes": os.path.getsize(plain),
        "keras_deflated_bytes": pruning.save_compressed(model, os.path.join(folder, "packed.keras")),
        "sparse_npz_bytes": pruning.export_sparse(model, os.path.join(folder, "sparse.npz"), masks),
        "sparse_npz_with_scales_bytes": pruning.export_sparse(model, os.path.join(folder, "scales.npz"), masks,
                                                              include_scales=True),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["vd", "graves"], choices=["vd", "vd_multiplicative", "graves"])
    parser.add_argument("--sparsities", nargs="+", type=float, default=list(SPARSITIES))
    parser.add_argument("--output", default=default_path("pruned_size.json"))
    _readme.add_flag(parser)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for method in args.methods:
            for sparsity in args.sparsities:
                rows.append(measure(method, sparsity, folder))
    base = {m: next(r["keras_bytes"] for r in rows if r["method"] == m) for m in args.methods}
    lines = ["| method | sparsity | .keras (bytes) | deflated .keras | sparse .npz | sparse .npz + scales | "
             "sparse / .keras |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {100 * r['sparsity']:.1f}% | {r['keras_bytes']:,} | "
                     f"{r['keras_deflated_bytes']:,} | {r['sparse_npz_bytes']:,} | "
                     f"{r['sparse_npz_with_scales_bytes']:,} | {r['sparse_npz_bytes'] / base[r['method']]:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.write_readme:
        _readme.write_table("pruned_size", table)
    write_json(args.output, {"model": "LeNet-300-100 (784-300-100-10)", "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
