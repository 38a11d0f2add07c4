"""Serving latency of a variational-LoRA (BLoB) classifier and a Bayesian-head KerasHub classifier's ``summary``.

The model: a LoRA'd transformer block classifier (16 tokens of 32 features, single-head
attention whose query and value projections carry rank-4 Keras-native LoRA adapters, a
64-unit GELU feed-forward, mean pooling, a 2-class softmax head), made Bayesian with
:func:`tfbnn.lora.variational` (a Gaussian posterior over each adapter's ``A`` factor).
keras-hub is not a dependency of tfbnn, so the block is built from plain Keras layers,
the same computation as a one-layer KerasHub encoder with ``backbone.enable_lora(4)``.
It is exported with :func:`tfbnn.export.export` as a SavedModel for T = 1, 30 and 100
samples; a fresh Python process loads each export and times ``summary`` on batches of 1
and 32 random inputs (the child of ``serving_latency.py``: warm-up calls, then
``--calls`` timed calls one at a time); the table gives the 50th and 99th percentiles in
milliseconds. T = 1 is the cost of the network itself. Weights are untrained: the time
does not depend on their values. The goal (issue 30): p99 < 50 ms at batch 1, T = 30.

With keras-hub installed, a second model: the tiny KerasHub ViT of ``tfbnn kerashub-finetune``
(``ViTBackbone`` from its config, 8x8x1 images, 2x2 patches, one layer of width 16, and
``ViTImageClassifier``) whose head is Bayes by Backprop (Flipout; :func:`tfbnn.hub.bayesian_head` with
a softmax on top, ``bayesian_head_task`` of :mod:`tfbnn.experiments._kerashub_finetune`), exported
and timed the same way ("a Bayesian-head KerasHub classifier exports with its ``summary`` endpoint
and its serving latency is measured (p99, batch 1, T = 30)").

Run: ``python benchmarks/lora_serving.py [--calls 300] [--write-readme]``.
"""

import os

import _readme
from _results import finish
from serving_latency import latency_parser, time_export, timed_run

SAMPLES = (1, 30, 100)
GOAL_MS = 50.0
TOKENS, WIDTH, RANK = 16, 32, 4


def model():
    """The LoRA'd transformer block classifier, made Bayesian by ``tfbnn.lora.variational``."""
    import keras

    import tfbnn

    keras.utils.set_random_seed(0)
    inputs = keras.Input((TOKENS, WIDTH))
    query, value = keras.layers.Dense(WIDTH, name="query"), keras.layers.Dense(WIDTH, name="value")
    attended = keras.layers.Attention(name="attention")([query(inputs), value(inputs),
                                                          keras.layers.Dense(WIDTH, name="key")(inputs)])
    h = keras.layers.LayerNormalization()(keras.layers.Add()([inputs, attended]))
    ff = keras.layers.Dense(WIDTH)(keras.layers.Dense(2 * WIDTH, activation="gelu")(h))
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, ff]))
    outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling1D()(h))
    base = keras.Model(inputs, outputs)
    query.enable_lora(RANK)
    value.enable_lora(RANK)
    return tfbnn.lora.variational(base, kl_weight=1e-3, seed=0)


def hub_model():
    """The tiny KerasHub ViT classifier with a Flipout Bayes-by-Backprop head, or None without keras-hub."""
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        return None
    from tfbnn.experiments import _kerashub_finetune as kh

    task = kh.build_task("image", {"num_classes": 8}, {"seed": 0, "dropout_rate": 0.1})
    return kh.bayesian_head_task(task, num_examples=1000, seed=0)


def models():
    """``{label: (model, input shape)}``: the BLoB block and, with keras-hub, the KerasHub ViT with a BbB head."""
    out = {f"BLoB transformer block (LoRA r={RANK} on query, value)": (model(), [TOKENS, WIDTH])}
    vit = hub_model()
    if vit is not None:
        out["KerasHub ViT (1 layer, width 16), BbB head (Flipout)"] = (vit, [8, 8, 1])
    return out


def measure(folder, calls):
    from tfbnn import export

    rows = []
    for i, (label, (bayes, shape)) in enumerate(models().items()):
        for num_samples in SAMPLES:
            path = os.path.join(folder, f"model{i}_{num_samples}")
            export.export(bayes, path, num_samples=num_samples)
            timed = time_export("saved_model", path, shape, calls)
            for batch in (1, 32):
                p50, p99 = timed[str(batch)]
                rows.append({"model": label, "T": num_samples, "batch": batch, "p50_ms": p50, "p99_ms": p99,
                             "load_s": timed["load_s"]})
            print(rows[-2], rows[-1], flush=True)
    return rows


def table(rows, load_before, load_after):
    lines = ["| model | T | load (s) | batch 1 p50 / p99 (ms) | batch 32 p50 / p99 (ms) |", "|---|---|---|---|---|"]
    keyed = {(r["model"], r["T"], r["batch"]): r for r in rows}
    for label in dict.fromkeys(r["model"] for r in rows):
        for t in SAMPLES:
            one, big = keyed[(label, t, 1)], keyed[(label, t, 32)]
            p99 = f"{one['p99_ms']:.2f}"
            if t == 30 and one["p99_ms"] < GOAL_MS:
                p99 = f"**{p99}**"
            lines.append(f"| {label} | {t} | {one['load_s']:.1f} | "
                         f"{one['p50_ms']:.2f} / {p99} | {big['p50_ms']:.2f} / {big['p99_ms']:.2f} |")
    lines.append(f"\nSavedModel `summary` endpoint. Bold: the goal, p99 < {GOAL_MS:g} ms at batch 1 and T = 30, "
                 f"met. Load average (1 min) {load_before:.1f} before and {load_after:.1f} after the run, on 2 cores.")
    return "\n".join(lines)


def main():
    parser = latency_parser(__doc__, "lora_serving")
    _readme.add_flag(parser)
    args = parser.parse_args()
    rows, record = timed_run(measure, args.calls)
    finish("lora_serving", table(rows, *record["load_average"]), args.output, record, args.write_readme)


if __name__ == "__main__":
    main()
