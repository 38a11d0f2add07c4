"""TFLite and ONNX exports (tfbnn.export.export): built-in ops only, the same predictive as the
SavedModel within Monte Carlo error, fresh draws in every process, seeded streams that replay."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import export

ort = pytest.importorskip("onnxruntime", reason="the ONNX export is checked with onnxruntime (the [export] extra)")
pytest.importorskip("tf2onnx", reason="the ONNX export needs tf2onnx (the [export] extra)")

# Samples of the summary endpoints: Monte Carlo error about 1 / 40 of the spread. With 400, two formats' predictive
# entropies differed by 6.1% once in a fresh-clone CI run (rtol 5%); 1,600 halves the error at the same
# tolerance (the SavedModel's summary, 200 calls: relative sd 0.74% -> 0.38% for the noisiest input).
T = 1600
DRAWS = 300  # calls of the sample endpoints


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((4,)),
        tfbnn.DenseFlipout(12, activation="relu", kl_weight=1e-3, seed=1),
        tfbnn.MCDropout(0.2, seed=4),
        tfbnn.DenseLocalReparameterization(12, activation="relu", kl_weight=1e-3, seed=2),
        tfbnn.DenseReparameterization(3, activation="softmax", kl_weight=1e-3, seed=3),
    ])
    for layer in tfbnn.bayesian_layers(model):
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -1.0, "float32"))
    return model


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("portable")
    model = _model()
    paths = {fmt: export.export(model, str(tmp / name), format=fmt, num_samples=T)
             for fmt, name in (("saved_model", "sm"), ("tflite", "m.tflite"), ("onnx", "onnx"))}
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    return model, x, paths, tmp


class _Served:
    """One format's endpoints as ``name(x) -> {output: array}``."""

    def __init__(self, fmt, path):
        self.fmt, self.path = fmt, path
        if fmt == "saved_model":
            self.served = tf.saved_model.load(path)
        elif fmt == "tflite":
            self.served = tf.lite.Interpreter(path)
        else:
            self.served = {name: ort.InferenceSession(os.path.join(path, f"{name}.onnx"))
                           for name in export.PORTABLE_ENDPOINTS}

    def __call__(self, name, x):
        if self.fmt == "saved_model":
            out = getattr(self.served, name)(x)
            return {k: v.numpy() for k, v in out.items()} if isinstance(out, dict) else {"output": out.numpy()}
        if self.fmt == "tflite":
            return self.served.get_signature_runner(name)(x=x)
        session = self.served[name]
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_portable_export_matches_the_saved_model_statistically(exports, fmt):
    model, x, paths, _ = exports
    reference, served = _Served("saved_model", paths["saved_model"]), _Served(fmt, paths[fmt])
    # The posterior mean is deterministic: equal up to float rounding.
    with tfbnn.posterior_mean(model):
        np.testing.assert_allclose(served("mean", x)["output"], model(x).numpy(), rtol=1e-4, atol=1e-6)
    # One draw per call: mean and variance of DRAWS calls agree within Monte Carlo error.
    ref_draws = np.stack([reference("sample", x)["output"] for _ in range(DRAWS)])
    draws = np.stack([served("sample", x)["output"] for _ in range(DRAWS)])
    assert len({d.tobytes() for d in draws}) == DRAWS  # every call draws anew
    spread = np.sqrt((ref_draws.var(0) + draws.var(0)) / DRAWS)
    assert np.all(np.abs(draws.mean(0) - ref_draws.mean(0)) < 5 * spread + 1e-6)
    ratio = draws.var(0) / ref_draws.var(0)
    assert np.all((ratio > 0.55) & (ratio < 1.8)), ratio  # sd of the ratio about 0.12 with 300 draws
    # The summary: T draws averaged, so its parts agree within about 5 / sqrt(T) of the spread.
    ref, got = reference("summary", x), served("summary", x)
    assert sorted(got) == ["aleatoric", "epistemic", "mean_probs", "predictive_entropy"]
    np.testing.assert_allclose(got["mean_probs"], ref["mean_probs"], atol=5 * np.sqrt(ref_draws.var(0) * 2 / T).max())
    for key in ("predictive_entropy", "aleatoric"):
        np.testing.assert_allclose(got[key], ref[key], rtol=0.05)
    np.testing.assert_allclose(got["epistemic"], ref["epistemic"], rtol=0.3, atol=0.01)
    assert np.all(got["epistemic"] > 0)
    np.testing.assert_allclose(got["epistemic"], got["predictive_entropy"] - got["aleatoric"], atol=1e-5)


@pytest.mark.heavy
def test_seeded_portable_exports_replay_in_fresh_runtimes(exports):
    model, x, _, tmp = exports
    paths = {fmt: export.export(model, str(tmp / f"seeded_{fmt}"), format=fmt, num_samples=4, seed=7)
             for fmt in ("tflite", "onnx")}
    for fmt, path in paths.items():
        first, second = _Served(fmt, path), _Served(fmt, path)
        a, b = first("sample", x)["output"], first("sample", x)["output"]
        assert not np.allclose(a, b)  # calls within one runtime continue the stream
        np.testing.assert_array_equal(a, second("sample", x)["output"])  # a fresh runtime replays it
        np.testing.assert_array_equal(first("summary", x)["mean_probs"], second("summary", x)["mean_probs"])


FRESH = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, onnxruntime, tensorflow as tf
    x = np.ones((2, 4), "float32")
    tflite = tf.lite.Interpreter(sys.argv[2]).get_signature_runner("sample")(x=x)["output"]
    onnx = onnxruntime.InferenceSession(os.path.join(sys.argv[3], "sample.onnx")).run(None, {"x": x})[0]
    served = tf.saved_model.load(sys.argv[1])
    print(json.dumps({"saved_model": served.sample(x).numpy().tolist(),
                      "tflite": tflite.tolist(), "onnx": onnx.tolist(),
                      "tfbnn_imported": any(m.startswith("tfbnn") for m in sys.modules)}))
    """
)


@pytest.mark.heavy
def test_two_fresh_processes_draw_differently(exports):
    _, _, paths, tmp = exports
    env = dict(os.environ, PYTHONPATH="")
    # Both processes started together (their TensorFlow imports overlap), each its own fresh runtime.
    processes = [subprocess.Popen([sys.executable, "-c", FRESH, paths["saved_model"], paths["tflite"], paths["onnx"]],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp))
                 for _ in range(2)]
    outputs = [process.communicate() for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-2000:]
    runs = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    assert not runs[0]["tfbnn_imported"]
    for fmt in ("saved_model", "tflite", "onnx"):
        assert not np.allclose(runs[0][fmt], runs[1][fmt]), fmt


def test_portable_noise_emits_only_stateful_random_ops_and_restores():
    model = _model()
    with export.portable_noise(model, seed=3):
        graph = tf.function(model).get_concrete_function(tf.TensorSpec([None, 4])).graph
    types = {op.type for op in graph.get_operations()}
    assert {"RandomStandardNormal", "RandomUniform"} <= types
    assert not any(t.startswith("Stateless") for t in types), types
    seeds = [(op.get_attr("seed"), op.get_attr("seed2")) for op in graph.get_operations() if "Random" in op.type]
    assert len(set(seeds)) == len(seeds) and all(seed == 3 for seed, _ in seeds)  # distinct op seeds
    assert all(layer._portable_noise is None for layer in tfbnn.stochastic_layers(model))
    # Flipout's signs are +-1 and the uniforms of MC dropout lie in [0, 1).
    layer = model.layers[0]
    with export.portable_noise(layer):
        signs = layer._rademacher_pair([4000], [1], tf.float32)[0].numpy()
    assert set(np.unique(signs)) == {-1.0, 1.0} and abs(signs.mean()) < 0.1


def test_export_validates_its_arguments(tmp_path):
    model = _model()
    with pytest.raises(ValueError, match="format='keras'"):
        export.export(model, str(tmp_path / "a"), format="keras")
    with pytest.raises(ValueError, match="quantize='int4'"):
        export.export(model, str(tmp_path / "a"), format="tflite", quantize="int4")
    with pytest.raises(ValueError, match="quantize='int8', format='onnx'"):
        export.export(model, str(tmp_path / "a"), format="onnx", quantize="int8")
    with pytest.raises(ValueError, match="seed=1"):
        export.export(model, str(tmp_path / "a"), seed=1)
    with pytest.raises(ValueError, match="seed=-1"):
        export.export(model, str(tmp_path / "a"), format="onnx", seed=-1)
    (tmp_path / "m.tflite").write_bytes(b"old")
    with pytest.raises(ValueError, match="overwrite=True"):
        export.export(model, str(tmp_path / "m.tflite"), format="tflite")
    assert (tmp_path / "m.tflite").read_bytes() == b"old"
    variational = keras.Sequential([keras.Input((4,)), tfbnn.layers.DenseVariational(2, kl_weight=1e-3)])
    with pytest.raises(ValueError, match="DenseVariational"):
        export.export(variational, str(tmp_path / "v"), format="onnx")
    assert not os.path.exists(tmp_path / "v")


@pytest.mark.heavy
def test_tflite_conv_summary_at_several_batch_sizes(tmp_path):
    # Conv layers apply T weight samples block by block, unrolled in a portable export;
    # Flipout's per-example signs broadcast over positions (TFLite once folded the tiling wrongly).
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6, 6, 1)),
                              tfbnn.layers.Conv2DReparameterization(2, 3, activation="relu", kl_weight=1e-3, seed=1),
                              tfbnn.layers.Conv2DFlipout(2, 3, activation="relu", kl_weight=1e-3, seed=2),
                              keras.layers.Flatten(),
                              tfbnn.DenseFlipout(3, activation="softmax", kl_weight=1e-3, seed=3)])
    x = np.random.default_rng(1).normal(size=(3, 6, 6, 1)).astype("float32")
    paths = {fmt: export.export(model, str(tmp_path / name), format=fmt, num_samples=100)  # T unrolled: keep it small
             for fmt, name in (("saved_model", "sm"), ("tflite", "m.tflite"))}
    reference, served = _Served("saved_model", paths["saved_model"]), _Served("tflite", paths["tflite"])
    ref = reference("summary", x)
    for batch in (3, 1, 3):
        got = served("summary", x[:batch])
        np.testing.assert_allclose(got["mean_probs"], ref["mean_probs"][:batch], atol=0.08)
        np.testing.assert_allclose(got["predictive_entropy"], ref["predictive_entropy"][:batch], rtol=0.15)


@pytest.mark.heavy
def test_saturated_probabilities_give_finite_summaries(tmp_path):
    # Softmax outputs of exactly 0 (a confident classifier): 0 log 0 = 0 in every format.
    model = keras.Sequential([keras.Input((2,)), tfbnn.DenseFlipout(3, activation="softmax", kl_weight=1e-3, seed=1)])
    model.layers[0].kernel_loc.assign(np.array([[300.0, -300.0, 0.0], [0.0, 0.0, 0.0]], "float32"))
    x = np.array([[1.0, 0.0], [-1.0, 0.0]], "float32")
    with tfbnn.posterior_mean(model):
        assert np.any(model(x).numpy() == 0.0)
    for fmt, name in (("tflite", "m.tflite"), ("onnx", "onnx")):
        summary = _Served(fmt, export.export(model, str(tmp_path / name), format=fmt, num_samples=8))("summary", x)
        for key, value in summary.items():
            assert np.all(np.isfinite(value)), (fmt, key)
        np.testing.assert_allclose(summary["predictive_entropy"], 0.0, atol=1e-3)


def _auroc(negatives, positives):
    """P(score of a positive > score of a negative), ties counted half (the Mann-Whitney statistic)."""
    diff = np.asarray(positives)[:, None] - np.asarray(negatives)[None, :]
    return float(np.mean(diff > 0) + 0.5 * np.mean(diff == 0))


@pytest.mark.heavy
def test_a_model_trained_under_mixed_float16_exports_and_separates_noisy_inputs_in_every_format(tmp_path):
    """Issue "Deployment", done when: a mixed_float16 model's TFLite and ONNX summaries separate noisy
    from clean inputs as its SavedModel does."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int32")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    train, test = order[:1400], order[1400:1500]
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), tfbnn.DenseFlipout(64, activation="relu", seed=1),
                                  tfbnn.DenseLocalReparameterization(10, seed=2),
                                  keras.layers.Activation("softmax", dtype="float32")])
        model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
        model.fit(x[train], y[train], epochs=30, batch_size=64, verbose=0,
                  callbacks=[tfbnn.KLAnnealing(num_examples=len(train), schedule=tfbnn.schedules.Constant(0.1))])
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert model.layers[0].compute_dtype == "float16"
    clean = x[test]
    noisy = (clean + rng.normal(scale=0.5, size=clean.shape)).astype("float32")  # the main job's shift
    aurocs = {}
    for fmt, name in (("saved_model", "sm"), ("tflite", "m.tflite"), ("onnx", "onnx")):
        served = _Served(fmt, export.export(model, str(tmp_path / name), format=fmt, num_samples=100))
        clean_summary, noisy_summary = served("summary", clean), served("summary", noisy)
        for summary in (clean_summary, noisy_summary):
            assert all(np.all(np.isfinite(v)) for v in summary.values()), fmt
        assert noisy_summary["epistemic"].mean() > 2 * clean_summary["epistemic"].mean(), fmt
        aurocs[fmt] = _auroc(clean_summary["epistemic"], noisy_summary["epistemic"])
    assert aurocs["saved_model"] > 0.8, aurocs
    for fmt in ("tflite", "onnx"):
        assert abs(aurocs[fmt] - aurocs["saved_model"]) < 0.05, aurocs
