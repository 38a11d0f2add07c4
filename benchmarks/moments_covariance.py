"""Diagonal against full-covariance moment propagation on a trained network, against an exact Monte Carlo.

A Bayes-by-Backprop MLP (Flipout, ReLU, ``hidden`` units in each of two hidden layers) is
trained on the offline digits (scikit-learn's 8x8 images, no download). On ``--examples``
test digits the logits' exact predictive moments under the trained posterior are computed
by Monte Carlo in NumPy (``--draws`` independent weight draws from the layers' own
``N(mu, sigma^2)``, never tfbnn's sampling), and compared with ``tfbnn.moments.propagate``
with ``covariance="diagonal"`` and ``"full"``: per logit the ratio of the propagated
variance to the exact one (median and 10th-90th percentiles over examples and classes), the
largest difference of the probit probabilities from the same approximation applied to the
exact moments, and the seconds per propagation of all examples.

Usage:
    python benchmarks/moments_covariance.py [--hidden 100 400] [--epochs 30] [--examples 120]
                                            [--draws 10000] [--write-readme]

Writes ``benchmarks/results/moments_covariance.json`` and ``moments_covariance.png`` (the
propagated against the exact variances).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfbnn  # noqa: E402
from tfbnn import moments  # noqa: E402

import _readme  # noqa: E402
from _results import default_path, finish  # noqa: E402

CHUNK = 100


def train(hidden, epochs, seed):
    keras.utils.set_random_seed(seed)
    data = tfbnn.datasets.load_digits(seed=0)
    model = tfbnn.models.mlp("bbb", hidden_units=(hidden, hidden), input_shape=(64,), num_classes=10,
                             num_examples=len(data.x_train), seed=seed)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(data.x_train, data.y_train, batch_size=64, epochs=epochs, verbose=2)
    accuracy = float(np.mean(tfbnn.predict(model, data.x_test, num_samples=30).mean_probs.argmax(1) == data.y_test))
    return model, data, accuracy


def exact_logit_moments(model, x, draws, seed):
    """Mean and variance of the logits under the posterior, from ``draws`` NumPy weight draws (float64)."""
    layers = [layer for layer in model.layers if isinstance(layer, tfbnn.layers.DenseFlipout)]
    posterior = []
    for layer in layers:
        bias_scale = layer.bias_scale().numpy() if layer.bayesian_bias else np.zeros(layer.units)
        posterior.append((layer.kernel_loc.numpy().astype(np.float64), layer.kernel_scale().numpy().astype(np.float64),
                          layer.bias_loc.numpy().astype(np.float64), bias_scale.astype(np.float64)))
    rng = np.random.default_rng(seed)
    total = total_sq = 0.0
    for _ in range(draws // CHUNK):
        h = np.broadcast_to(x.astype(np.float64), (CHUNK, *x.shape))
        for i, (loc, scale, bias, bias_scale) in enumerate(posterior):
            kernel = loc + scale * rng.standard_normal((CHUNK, *loc.shape))
            b = bias + bias_scale * rng.standard_normal((CHUNK, 1, len(bias)))
            h = np.matmul(h, kernel) + b
            if i < len(posterior) - 1:
                h = np.maximum(h, 0.0)
        total, total_sq = total + h.sum(0), total_sq + (h * h).sum(0)
    n = (draws // CHUNK) * CHUNK
    mean = total / n
    return mean, total_sq / n - mean**2


def measure(hidden, args):
    model, data, accuracy = train(hidden, args.epochs, args.seed)
    x = data.x_test[: args.examples]
    exact_mean, exact_var = exact_logit_moments(model, x, args.draws, args.seed)
    exact_probs = moments.probit_softmax(exact_mean.astype("float32"), exact_var.astype("float32")).numpy()
    row = {"hidden": hidden, "accuracy": accuracy, "examples": len(x), "draws": args.draws}
    ratios = {}
    for covariance in moments.COVARIANCES:
        moments.propagate(model, x[:2], covariance=covariance)  # warm-up
        start = time.perf_counter()
        out = moments.propagate(model, x, covariance=covariance)
        seconds = time.perf_counter() - start
        ratio = out.variance.numpy() / exact_var
        ratios[covariance] = (exact_var.ravel(), out.variance.numpy().ravel())
        p10, p50, p90 = np.percentile(ratio, [10, 50, 90])
        row[covariance] = {"variance_ratio_median": float(p50), "variance_ratio_p10": float(p10),
                           "variance_ratio_p90": float(p90), "seconds": seconds,
                           "probability_error_max": float(np.abs(out.probabilities().numpy() - exact_probs).max()),
                           "mean_error_max_in_std": float(np.max(np.abs(out.mean.numpy() - exact_mean)
                                                                 / np.sqrt(exact_var)))}
        print(hidden, covariance, row[covariance], flush=True)
    return row, ratios


def figure(all_ratios, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_ratios), figsize=(5 * len(all_ratios), 4.2), squeeze=False)
    for ax, (hidden, ratios) in zip(axes[0], all_ratios.items()):
        for covariance, marker in zip(moments.COVARIANCES, ("o", "s")):
            exact, propagated = ratios[covariance]
            ax.scatter(exact, propagated, s=6, marker=marker, alpha=0.5, label=f'covariance="{covariance}"')
        low, high = min(r[0].min() for r in ratios.values()), max(r[0].max() for r in ratios.values())
        ax.plot([low, high], [low, high], "k--", lw=1, label="exact")
        ax.set(xscale="log", yscale="log", xlabel="exact logit variance (Monte Carlo)",
               ylabel="propagated logit variance", title=f"64-{hidden}-{hidden}-10 Flipout MLP, digits")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--examples", type=int, default=120)
    parser.add_argument("--draws", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=default_path("moments_covariance.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    rows, all_ratios = [], {}
    lines = ["| hidden units | test accuracy | covariance | logit variance / exact: median (10th-90th pct.) | "
             "max prob. error | max mean error (exact std) | seconds |", "|---|---|---|---|---|---|---|"]
    for hidden in args.hidden:
        row, all_ratios[hidden] = measure(hidden, args)
        rows.append(row)
        for covariance in moments.COVARIANCES:
            r = row[covariance]
            lines.append(f"| {hidden} x 2 | {row['accuracy']:.3f} | {covariance} | {r['variance_ratio_median']:.2f} "
                         f"({r['variance_ratio_p10']:.2f}-{r['variance_ratio_p90']:.2f}) | "
                         f"{r['probability_error_max']:.4f} | {r['mean_error_max_in_std']:.3f} | {r['seconds']:.2f} |")
    figure(all_ratios, os.path.splitext(args.output)[0] + ".png")
    finish("moments_covariance", "\n".join(lines) + "\n", args.output,
           {"epochs": args.epochs, "seed": args.seed, "examples": args.examples, "draws": args.draws, "rows": rows},
           args.write_readme)


if __name__ == "__main__":
    main()
