"""SNGP end to end (tfbnn.sngp, method="sngp"): the epoch's reset, the zoo, training.run, predict, save and export."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import export, methods, models, sngp, training
from tfbnn.layers import RandomFeatureGaussianProcess, SpectralConv2D, SpectralDense


def _small_mlp(**options):
    return models.mlp("sngp", hidden_units=(6,), input_shape=(4,), num_classes=3, seed=0,
                      **{"num_inducing": 16, **options})


def _epoch_precision(model, x):
    """``I + sum_i w_i phi_i phi_i^T`` over ``x`` (``w_i = 1``, or ``p_i (1 - p_i)`` with the logistic weights), in
    NumPy from the model's features and weights."""
    gp = sngp.gp_layers(model)[0]
    h = keras.Model(model.inputs, gp.input).predict(x, verbose=0).astype(np.float64)
    phi = np.cos(h @ gp.feature_kernel.numpy() + gp.feature_bias.numpy()) * math.sqrt(2.0 / gp.num_inducing)
    logits = phi @ gp.kernel.numpy() + gp.bias.numpy()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p = (p / p.sum(1, keepdims=True)).max(1)
    w = p * (1 - p) if gp.logistic_weights else np.ones_like(p)
    return np.eye(gp.num_inducing) + (phi * w[:, None]).T @ phi


@pytest.mark.parametrize("reset, likelihood", [(True, "gaussian"), (False, "logistic")])
def test_reset_covariance_keeps_one_epoch_s_exact_sum(reset, likelihood):
    # A learning rate of 0 and a bound c no kernel reaches: every epoch sees the same features.
    model = _small_mlp(norm_multiplier=100.0, gp_cov_likelihood=likelihood)
    model.compile(keras.optimizers.SGD(0.0), "sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(12, 4)).astype("float32")
    callbacks = [sngp.ResetCovariance()] if reset else []
    model.fit(x, np.arange(12) % 3, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    one_epoch = _epoch_precision(model, x)
    expected = one_epoch if reset else 2 * one_epoch - np.eye(16)  # without the reset: two epochs' sums
    np.testing.assert_allclose(sngp.gp_layers(model)[0].precision.numpy(), expected, rtol=1e-4, atol=1e-6)


def test_the_zoo_builds_spectral_layers_and_the_gp_head():
    model = _small_mlp(norm_multiplier=0.5, gp_cov_ridge_penalty=2.0)
    hidden, head = model.layers[1], model.layers[-1]
    assert type(hidden) is SpectralDense and hidden.norm_multiplier == 0.5 and hidden.seed == 1
    assert type(head) is RandomFeatureGaussianProcess and head.name == "predictions" and head.seed == 2
    assert (head.num_inducing, head.gp_cov_ridge_penalty, head.is_classifier) == (16, 2.0, True)
    assert head.gp_cov_likelihood == "gaussian" and not head.logistic_weights  # Edward2's and the reference's
    lenet = models.lenet5("sngp", input_shape=(12, 12, 1), num_classes=3, num_inducing=8, padding="same")
    kinds = {type(layer) for layer in lenet.layers}
    assert {SpectralConv2D, SpectralDense, RandomFeatureGaussianProcess} <= kinds
    assert not kinds & {keras.layers.Dense, keras.layers.Conv2D}
    last = models.mlp("sngp", hidden_units=(6,), input_shape=(4,), num_inducing=8, bayesian_layers="last")
    assert type(last.layers[1]) is keras.layers.Dense and type(last.layers[-1]) is RandomFeatureGaussianProcess
    regression = models.mlp("sngp", hidden_units=(6,), input_shape=(4,), num_inducing=8, outputs=1)
    assert not regression.layers[-1].is_classifier  # no softmax: no mean-field adjustment
    assert [type(c).__name__ for c in methods.get("sngp").training_callbacks(model)] == ["ResetCovariance"]


def test_sngp_options_are_checked():
    with pytest.raises(ValueError, match="num_inducing=0"):
        _small_mlp(num_inducing=0)
    with pytest.raises(ValueError, match="gp_cov_momentum=1.5"):
        _small_mlp(gp_cov_momentum=1.5)
    with pytest.raises(ValueError, match=r"Unknown option for method='sngp'"):
        _small_mlp(rate=0.1)


def test_predictive_variance_and_reset_need_a_gp_layer():
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="exactly one RandomFeatureGaussianProcess layer"):
        sngp.predictive_variance(plain, np.ones((2, 3), "float32"))
    plain.compile("sgd", "mse")
    with pytest.raises(ValueError, match="ResetCovariance needs a model with a RandomFeatureGaussianProcess"):
        plain.fit(np.ones((2, 3)), np.ones((2, 2)), verbose=0, callbacks=[sngp.ResetCovariance()])


class _PrecisionAtEpochStart(keras.callbacks.Callback):
    """Records the GP precision at each epoch's start (after the method's reset, which comes first)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(sngp.gp_layers(self.model)[0].precision.numpy().copy())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    recipe = training.Recipe(name="sngp-digits", model="mlp", model_options={"hidden_units": (16,)}, method="sngp",
                             method_options={"num_inducing": 32}, dataset="digits", epochs=2).quick(epochs=2)
    probe = _PrecisionAtEpochStart()
    result = training.run(recipe, output_dir=str(tmp_path_factory.mktemp("run")), verbose=0, quiet=True,
                          jit_compile=False, callbacks=[probe])
    return result, probe


def test_run_trains_sngp_with_the_reset(trained):
    result, probe = trained
    assert len(probe.seen) == 2
    for precision in probe.seen:  # training.run added ResetCovariance
        np.testing.assert_array_equal(precision, np.eye(32))
    precision = sngp.gp_layers(result.model)[0].precision.numpy()
    assert not np.allclose(precision, np.eye(32)) and np.all(np.linalg.eigvalsh(precision) >= 1.0 - 1e-4)
    assert np.isfinite(result.test["nll"]) and result.test["epistemic"] == 0.0  # one deterministic pass


def test_predict_save_and_export_give_the_mean_field_predictive(trained, tmp_path):
    model = trained[0].model
    x = np.random.default_rng(1).normal(size=(5, 64)).astype("float32")
    gp = sngp.gp_layers(model)[0]
    h = keras.Model(model.inputs, gp.input).predict(x, verbose=0)
    raw = (gp.features(h).numpy() @ gp.kernel.numpy() + gp.bias.numpy()).astype(np.float64)
    var = sngp.predictive_variance(model, x)
    adjusted = raw / np.sqrt(1 + math.pi / 8 * var)[:, None]
    expected = np.exp(adjusted - adjusted.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    res = tfbnn.predict(model, x, num_samples=3)
    np.testing.assert_allclose(res.mean_probs, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res.mutual_information, 0.0, atol=1e-6)
    path = os.path.join(tmp_path, "sngp.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, rtol=1e-4, atol=1e-6)
    folder = os.path.join(tmp_path, "exported")
    export.export(model, folder, num_samples=2)
    served = tf.saved_model.load(folder)
    np.testing.assert_allclose(served.mean(x).numpy(), expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(served.summary(x)["mean_probs"].numpy(), expected, rtol=1e-4, atol=1e-6)
    # A model that draws nothing exports without a random op (it used to seed its no generators from one).
    for name in ("summary", "sample", "mean", "summary_seeded", "sample_seeded"):
        for fn in getattr(served, name).concrete_functions:
            assert export.random_ops(fn) == [], name
    np.testing.assert_allclose(served.summary(x)["sngp_variance"].numpy(), var, rtol=1e-5, atol=1e-7)


def _x(n=24, d=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype("float32")


@pytest.mark.heavy  # two compiles (predict, fit) per policy
@pytest.mark.parametrize("policy, rtol", [("mixed_float16", 1e-2), ("mixed_bfloat16", 5e-2)])
def test_sngp_fits_and_predicts_under_mixed_precision(policy, rtol):
    x, y = _x(), np.arange(24) % 3
    reference = _small_mlp(normalize_input=True)
    reference(x, training=True)  # a precision beyond the prior
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = _small_mlp(normalize_input=True)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.set_weights(reference.get_weights())
    gp = sngp.gp_layers(model)[0]
    assert gp.compute_dtype == policy.split("_")[1] and gp.input_norm.compute_dtype == gp.compute_dtype
    # The GP's variance in float32 from features computed in the policy's dtype: close to float32's.
    np.testing.assert_allclose(sngp.predictive_variance(model, x), sngp.predictive_variance(reference, x), rtol=rtol)
    probs = model.predict(x, verbose=0)
    np.testing.assert_allclose(probs, reference.predict(x, verbose=0), atol=2 * rtol)
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(x, y, epochs=1, batch_size=12, verbose=0, callbacks=[sngp.ResetCovariance()])
    assert np.all(np.isfinite(history.history["loss"]))
    assert {str(w.dtype) for w in model.weights} == {"float32"}
    assert np.all(np.isfinite(model.predict(x, verbose=0))) and np.all(sngp.predictive_variance(model, x) > 0)


def test_predictive_variance_refuses_no_examples():
    with pytest.raises(ValueError, match=r"Expected `x` with at least one example. Received: x of shape \(0, 4\)"):
        sngp.predictive_variance(_small_mlp(), np.zeros((0, 4), "float32"))


@pytest.fixture(scope="module")
def fitted_small():
    model = _small_mlp()
    x = _x(24)
    model(x, training=True)  # a precision beyond the prior
    return model, _x(7, seed=1)


@pytest.mark.parametrize("format", ["tflite", "onnx"])
def test_portable_exports_serve_the_mean_field_predictive_and_the_gp_variance(fitted_small, format, tmp_path):
    model, x = fitted_small
    if format == "onnx":
        ort = pytest.importorskip("onnxruntime", reason="the ONNX export is checked with onnxruntime")
        pytest.importorskip("tf2onnx", reason="the ONNX export needs tf2onnx (the [export] extra)")
    path = export.export(model, str(tmp_path / ("m.tflite" if format == "tflite" else "onnx")), format=format)
    if format == "tflite":
        interpreter = tf.lite.Interpreter(path)
        summary, mean = (interpreter.get_signature_runner(name)(x=x) for name in ("summary", "mean"))
    else:
        def run(name):
            session = ort.InferenceSession(os.path.join(path, f"{name}.onnx"))
            return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
        summary, mean = run("summary"), run("mean")
    # The covariance factored at export: matmuls only, equal to the layer's solves to float32 rounding.
    np.testing.assert_allclose(summary["sngp_variance"], sngp.predictive_variance(model, x), rtol=1e-5, atol=1e-7)
    probs = model.predict(x, verbose=0)
    np.testing.assert_allclose(mean["output"], probs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["mean_probs"], probs, rtol=1e-5, atol=1e-7)


def test_gp_moment_rule_matches_monte_carlo_on_a_gaussian_input():
    # A mean-field dense layer on a point input: independent Gaussian units, the GP rule's exact case.
    first = tfbnn.layers.DenseReparameterization(5, kl_weight=1e-3, seed=1)
    gp = RandomFeatureGaussianProcess(3, num_inducing=16, activation="softmax", seed=2)
    model = keras.Sequential([keras.Input((4,)), first, gp])
    model(_x(30, seed=2), training=True)  # a precision beyond the prior
    first.kernel_rho.assign(np.full(first.kernel_rho.shape, -1.0, "float32"))
    x = _x(3)
    out = tfbnn.moments.propagate(model, x)
    assert out.link == "softmax"
    h = tfbnn.moments.propagate(keras.Sequential([keras.Input((4,)), first]), x)
    n, rng = 20000, np.random.default_rng(3)
    for b in range(len(x)):
        draws = (h.mean.numpy()[b] + np.sqrt(h.variance.numpy()[b]) * rng.standard_normal((n, 5))).astype("float32")
        logits = gp.features(draws).numpy().astype(np.float64) @ gp.kernel.numpy() + gp.bias.numpy()
        mean = logits.mean(0)
        # Var[f] = Var_h[E[f | h]] + E_h[phi^T Sigma phi]: the spread of the means plus the GP's own variance.
        total = (logits - mean) ** 2 + gp.predictive_variance(draws).numpy()[:, None]
        assert np.all(np.abs(out.mean.numpy()[b] - mean) < 5 * logits.std(0) / np.sqrt(n))
        assert np.all(np.abs(out.variance.numpy()[b] - total.mean(0)) < 5 * total.std(0) / np.sqrt(n))


def test_sngp_moments_of_a_point_input_are_the_model_s_own_outputs(fitted_small):
    model, x = fitted_small
    out = tfbnn.moments.propagate(model, x)  # spectral dense (relu) -> GP: zero variance until the GP
    gp = sngp.gp_layers(model)[0]
    h = keras.Model(model.inputs, gp.input)(x)
    np.testing.assert_allclose(out.mean, gp._logits(gp.features(h)), rtol=1e-5, atol=1e-6)
    variance = sngp.predictive_variance(model, x)
    np.testing.assert_allclose(out.variance, np.repeat(variance[:, None], 3, axis=1), rtol=1e-5, atol=1e-7)
    probs = model.predict(x, verbose=0)  # the mean-field factor pi / 8 is the probit's
    np.testing.assert_allclose(out.probabilities(), probs, rtol=1e-5, atol=1e-6)


@pytest.mark.heavy  # an export: tracing and writing three endpoints
def test_sngp_exports_in_moments_mode(fitted_small, tmp_path):
    model, x = fitted_small
    served = tf.saved_model.load(export.export(model, str(tmp_path / "moments"), mode="moments"))
    probs = model.predict(x, verbose=0)
    np.testing.assert_allclose(served.summary(x)["mean_probs"], probs, rtol=1e-5, atol=1e-6)
    moments = served.moments(x)
    np.testing.assert_allclose(moments["variance"][:, 0], sngp.predictive_variance(model, x), rtol=1e-5, atol=1e-7)


def test_gp_moment_rule_refuses_an_input_normalization():
    model = _small_mlp(normalize_input=True)
    with pytest.raises(ValueError, match=r"class RandomFeatureGaussianProcess\): its input layer normalization"):
        tfbnn.moments.propagate(model, _x(2))
