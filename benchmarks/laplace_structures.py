"""Memory and time of each Laplace structure on LeNet-5 and a ResNet-20-sized network.

For each network and each ``tfbnn.laplace.Laplace`` structure (``subset`` x ``hessian``), in
its own process so that the peak memory is the structure's own:

* ``fit``: the seconds of :meth:`Laplace.fit` over ``--examples`` training examples (the
  curvature: GGN, KFAC factors or the diagonal, and the subnetwork's choice for
  ``subnetwork``) and of the prior precision by the marginal likelihood
  (:meth:`Laplace.optimize_prior_precision`);
* ``predict``: the seconds of the GLM predictive (:meth:`Laplace.predict`, probit link) on
  ``--test`` examples;
* memory: the bytes of the fitted curvature (``hessian_factors``) and the process's peak
  resident memory above what it held before the fit (``ru_maxrss``).

Networks (deterministic, random weights: the cost does not depend on the weights' values):
the zoo's LeNet-5 (``tfbnn.models.lenet5``, 32x32x3, 10 classes) and the ResNet-20-sized stack
of ``conv_layers.py`` with keras ``Conv2D`` (32x32x3, a 16-channel stem, three stages of three
residual blocks of two 3x3 convolutions, 16/32/64 channels, no batch normalization: KFAC
covers Dense and Conv2D). Random images and labels.

Usage:
    python benchmarks/laplace_structures.py [--networks lenet5 resnet20] [--examples 256]
                                            [--test 64] [--subnetwork-size 1000] [--write-readme]

Writes ``benchmarks/results/laplace_structures.json``.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import _readme  # noqa: E402
from _results import default_path, finish  # noqa: E402

#: (label, subset, hessian): the structures, cheapest first.
STRUCTURES = (("last layer, KFAC", "last_layer", "kron"), ("last layer, full", "last_layer", "full"),
              ("all weights, diagonal", "all", "diag"), ("all weights, KFAC", "all", "kron"),
              ("subnetwork, full", "subnetwork", "full"), ("all weights, full", "all", "full"))
NETWORKS = ("lenet5", "resnet20")


def build(network, examples):
    import keras

    import tfbnn

    keras.utils.set_random_seed(0)
    if network == "lenet5":
        return tfbnn.models.lenet5("deterministic", input_shape=(32, 32, 3), num_classes=10)
    import conv_layers  # the same ResNet-20-sized stack as the convolution benchmark

    return conv_layers.build("resnet20", "keras_conv", examples)[1]


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_one(network, subset, hessian, examples, test, subnetwork_size):
    """One structure in this process: a dict of the measurements (or the refusal's message)."""
    import numpy as np

    import tfbnn

    model = build(network, examples)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(examples + test, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, examples)
    row = {"network": network, "subset": subset, "hessian": hessian, "parameters": int(model.count_params())}
    model.predict(x[:2], verbose=0)
    before = _rss_bytes()
    try:
        la = tfbnn.laplace.Laplace(model, "classification", subset=subset, hessian=hessian,
                                   subnetwork=subnetwork_size if subset == "subnetwork" else None)
        start = time.perf_counter()
        la.fit(x[:examples], y)
        row["fit_seconds"] = time.perf_counter() - start
    except ValueError as e:
        return {**row, "refused": str(e).split(".")[0]}
    start = time.perf_counter()
    la.optimize_prior_precision(method="marglik")
    row["prior_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    probs = la.predict(x[examples:])
    row["predict_seconds"] = time.perf_counter() - start
    row["finite"] = bool(np.isfinite(np.asarray(probs)).all())
    factors = la.hessian_factors if isinstance(la.hessian_factors, tuple) else (la.hessian_factors,)
    row["curvature_bytes"] = int(sum(np.asarray(f).nbytes for f in factors))
    row["weights_in_posterior"] = int(la.num_parameters)
    # ru_maxrss: kilobytes on Linux; the peak above what the process held before the fit
    row["peak_extra_bytes"] = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)
    return row


def _mb(n):
    return f"{n / 2**20:,.1f}" if n >= 2**20 / 10 else f"{n / 2**20:.3f}"


def report(rows, examples, test):
    lines = [f"| network (weights) | structure | weights in the posterior | fit ({examples} ex.) s | prior (marglik) s "
             f"| GLM predict ({test} ex.) s | curvature MB | peak extra memory MB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['network']} ({r['parameters']:,}) | {r['label']} |"
        if "refused" in r:
            lines.append(f"{head} refused: {r['refused'].split(' (')[0]} | | | | | |")
            continue
        lines.append(f"{head} {r['weights_in_posterior']:,} | {r['fit_seconds']:.2f} | {r['prior_seconds']:.2f} | "
                     f"{r['predict_seconds']:.2f} | {_mb(r['curvature_bytes'])} | {_mb(r['peak_extra_bytes'])} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", nargs="+", choices=NETWORKS, default=list(NETWORKS))
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--test", type=int, default=64)
    parser.add_argument("--subnetwork-size", type=int, default=1000)
    parser.add_argument("--output", default=default_path("laplace_structures.json"))
    parser.add_argument("--one", nargs=3, metavar=("NETWORK", "SUBSET", "HESSIAN"), help=argparse.SUPPRESS)
    _readme.add_flag(parser)
    args = parser.parse_args()
    if args.one:  # a child process: one structure, its row as JSON on the last line
        row = measure_one(*args.one, args.examples, args.test, args.subnetwork_size)
        print(json.dumps(row))
        return
    rows = []
    for network in args.networks:
        for label, subset, hessian in STRUCTURES:
            out = subprocess.run([sys.executable, __file__, "--one", network, subset, hessian,
                                  "--examples", str(args.examples), "--test", str(args.test),
                                  "--subnetwork-size", str(args.subnetwork_size)],
                                 capture_output=True, text=True, check=True)
            row = {**json.loads(out.stdout.strip().splitlines()[-1]), "label": label}
            print(row, flush=True)
            rows.append(row)
    finish("laplace_structures", report(rows, args.examples, args.test), args.output,
           {"examples": args.examples, "test": args.test, "subnetwork_size": args.subnetwork_size, "rows": rows},
           args.write_readme)


if __name__ == "__main__":
    main()
