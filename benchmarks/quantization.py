"""Post-training quantization of the TFLite export: size, accuracy, NLL, ECE against float32.

Exports the main job's model (``tfbnn train``: a Bayes-by-Backprop MLP 64-64-64-10 with
local reparameterization on the offline digits, saved as
``saved_models/bbb_mlp_digits.keras``) with :func:`tfbnn.export.export` as TFLite
three ways, float32, ``quantize="float16"`` (every float weight stored as float16)
and ``quantize="int8"`` (TFLite's dynamic-range quantization: int8 weights of the
matmuls, which for local reparameterization are the posterior means ``mu`` and the
variances ``sigma^2``, per channel, for tensors of at least 1024 elements), plus the
ONNX export. On the digits test split, with the ``summary`` endpoint (T samples), it
reports the file size, accuracy, NLL, ECE (15 bins) and the mean epistemic part (the
mutual information, which the posterior scales drive: a rounding of ``sigma`` shows
there), and the same metrics of the posterior-mean endpoint. A second float32 row
(another T draws of the same file) shows the Monte Carlo noise floor that the
quantized rows' differences must be read against.

Run: ``tfbnn train`` first (or pass ``--model``), then
``python benchmarks/quantization.py [--num-samples 1000] [--write-readme]``.
"""

import argparse
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tfbnn
from tfbnn import datasets, export, metrics, training

import _readme
from _results import default_path, finish

VARIANTS = (("tflite", None), ("tflite", "float16"), ("tflite", "int8"), ("onnx", None))


def scores(probs, labels):
    """``{accuracy, nll, ece}`` of predictive probabilities ``(N, K)`` against integer ``labels``."""
    return {"accuracy": float(metrics.accuracy(probs, labels)),
            "nll": float(metrics.negative_log_likelihood(probs, labels)),
            "ece": float(metrics.expected_calibration_error(probs, labels))}


def _runner(fmt, path, name):
    """``x -> {output: array}`` for endpoint ``name`` of a TFLite file or an ONNX folder."""
    if fmt == "tflite":
        runner = tf.lite.Interpreter(path, num_threads=2).get_signature_runner(name)
        return lambda x: runner(x=x)
    import onnxruntime  # the [export] extra

    session = onnxruntime.InferenceSession(os.path.join(path, f"{name}.onnx"))
    names = [o.name for o in session.get_outputs()]
    return lambda x: dict(zip(names, session.run(None, {"x": x})))


def evaluate(fmt, path, x, y):
    """One row: the summary's and the posterior mean's scores on ``(x, y)`` and the mean epistemic part."""
    summary = _runner(fmt, path, "summary")(x)
    mean = _runner(fmt, path, "mean")(x)["output"]
    row = scores(summary["mean_probs"], y)
    row["epistemic"] = float(np.mean(summary["epistemic"]))
    row.update({f"mean_{k}": v for k, v in scores(mean, y).items()})
    return row


def size(path):
    """Bytes of a file, or of every file under a folder."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def measure(model, x, y, folder, num_samples):
    """The rows of the table: one per (format, quantization), float32 TFLite twice."""
    rows = []
    for fmt, quantize in VARIANTS:
        path = os.path.join(folder, f"{fmt}_{quantize or 'float32'}" + (".tflite" if fmt == "tflite" else ""))
        export.export(model, path, format=fmt, num_samples=num_samples, quantize=quantize)
        repeats = 2 if (fmt, quantize) == ("tflite", None) else 1
        for repeat in range(repeats):
            label = (quantize or "float32") + (" (another draw)" if repeat else "")
            rows.append({"format": fmt, "weights": label, "bytes": size(path), **evaluate(fmt, path, x, y)})
    return rows


def table(rows, num_samples):
    base = rows[0]
    lines = [f"| format | weights | size (KB) | accuracy | NLL | ECE | mean epistemic | posterior-mean accuracy "
             f"/ NLL / ECE |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def delta(key):
            return "" if r is base else f" ({r[key] - base[key]:+.4f})"
        lines.append(f"| {r['format']} | {r['weights']} | {r['bytes'] / 1024:.1f} | {r['accuracy']:.4f}{delta('accuracy')}"
                     f" | {r['nll']:.4f}{delta('nll')} | {r['ece']:.4f}{delta('ece')} | "
                     f"{r['epistemic']:.4f}{delta('epistemic')} | {r['mean_accuracy']:.4f} / {r['mean_nll']:.4f} / "
                     f"{r['mean_ece']:.4f} |")
    lines.append(f"\nT = {num_samples} samples per summary; in brackets the difference to the first float32 row.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.path.join("saved_models", "bbb_mlp_digits.keras"),
                        help="a .keras classifier trained on the digits (default: the main job's, `tfbnn train`)")
    parser.add_argument("--num-samples", type=int, default=1000, metavar="T")
    parser.add_argument("--output", default=default_path("quantization.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    if not os.path.exists(args.model):
        parser.error(f"no model at {args.model}: run `tfbnn train` first, or pass --model")
    model = keras.saving.load_model(args.model)
    data = datasets.load_pipeline("digits", batch_size=1024, validation_fraction=0.0, flatten=True)
    x, y = training.arrays(data.test)
    with tempfile.TemporaryDirectory() as folder:
        rows = measure(model, np.asarray(x, "float32"), np.asarray(y), folder, args.num_samples)
    finish("quantization", table(rows, args.num_samples), args.output,
           {"model": args.model, "num_samples": args.num_samples, "tfbnn": tfbnn.__version__, "rows": rows},
           args.write_readme)


if __name__ == "__main__":
    main()
