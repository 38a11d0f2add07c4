"""SNGP's precision weights: Gaussian (``w_i = 1``, the default, Edward2's) against logistic (``p (1 - p)``).

The set-up of the single-pass guide (docs/guides/single-pass.md): an SNGP MLP (one
``SpectralDense`` layer of 32 units, a random-feature GP head of 128 features) trained on the
offline digits 0-8, the digit 9 held out. Per setting and seed, the test accuracy on the known
digits and the AUROC of SNGP's GP variance (``tfbnn.sngp.predictive_variance``) separating the
held-out digit from the known ones (0.5: chance; below 0.5: worse than chance). Settings:
``gp_cov_likelihood`` logistic or Gaussian, with and without ``normalize_input``.

Usage:
    python benchmarks/sngp_precision_weights.py [--epochs 8] [--seeds 0 1 2] [--write-readme]

Writes ``benchmarks/results/sngp_precision_weights.json``.
"""

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfbnn  # noqa: E402
from tfbnn import metrics, sngp  # noqa: E402

import _readme  # noqa: E402
from _results import default_path, finish  # noqa: E402

SETTINGS = (("logistic", False), ("logistic", True), ("gaussian", False), ("gaussian", True))


def measure(likelihood, normalize, seed, epochs):
    """``(accuracy on the known digits, AUROC of the GP variance for the held-out digit 9)``."""
    keras.utils.set_random_seed(seed)
    data = tfbnn.datasets.load_digits(seed=0)
    known = data.y_train < 9
    x_in, y_in = data.x_test[data.y_test < 9], data.y_test[data.y_test < 9]
    x_out = data.x_test[data.y_test == 9]
    model = tfbnn.models.mlp("sngp", hidden_units=(32,), input_shape=(64,), num_classes=9, num_inducing=128,
                             seed=seed, gp_cov_likelihood=likelihood, normalize_input=normalize)
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    model.fit(data.x_train[known], data.y_train[known], batch_size=64, epochs=epochs, verbose=0,
              callbacks=[sngp.ResetCovariance()])
    accuracy = float(np.mean(model.predict(x_in, verbose=0).argmax(1) == y_in))
    auroc = metrics.auroc(np.asarray(sngp.predictive_variance(model, x_in)),
                          np.asarray(sngp.predictive_variance(model, x_out)))
    return accuracy, float(auroc)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--output", default=default_path("sngp_precision_weights.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    rows, lines = [], ["| gp_cov_likelihood | normalize_input | accuracy (digits 0-8) | AUROC of the GP variance, "
                       "digit 9 held out (mean, min-max over seeds) |", "|---|---|---|---|"]
    for likelihood, normalize in SETTINGS:
        runs = [measure(likelihood, normalize, seed, args.epochs) for seed in args.seeds]
        acc, auc = [r[0] for r in runs], [r[1] for r in runs]
        rows.append({"gp_cov_likelihood": likelihood, "normalize_input": normalize, "accuracy": acc, "auroc": auc})
        default = " (default)" if likelihood == "gaussian" and not normalize else ""
        lines.append(f"| {likelihood}{default} | {normalize} | {statistics.mean(acc):.3f} | "
                     f"{statistics.mean(auc):.2f} ({min(auc):.2f}-{max(auc):.2f}) |")
        print(lines[-1], flush=True)
    finish("sngp_precision_weights", "\n".join(lines) + "\n", args.output,
           {"epochs": args.epochs, "seeds": args.seeds, "rows": rows}, args.write_readme)


if __name__ == "__main__":
    main()
