import dataclasses
import os
import statistics
import tempfile

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import inference
from tfbnn.inference import AdaptiveSampling

DENSE = [tfbnn.DenseReparameterization, tfbnn.DenseFlipout, tfbnn.DenseLocalReparameterization]


def _x(n=10, d=5, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype("float32")


def _classifier(cls, d=5, classes=3, rho=-1.0):
    model = keras.Sequential(
        [keras.Input((d,)), cls(8, activation="relu", seed=1), cls(classes, activation="softmax", seed=2)]
    )
    for layer in model.layers:
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, rho, "float32"))
    return model


def _hand_entropy(p):
    return -sum(pc * np.log(pc) for pc in p if pc > 0)


def _assert_distinct_samples(samples):
    t = samples.shape[0]
    for i in range(t):
        for j in range(i + 1, t):
            # every example differs between every pair of samples
            assert np.all(np.max(np.abs(samples[i] - samples[j]), axis=-1) > 1e-5), (i, j)


@pytest.mark.parametrize("cls", DENSE)
def test_samples_differ_for_every_dense_family(cls):
    x = _x()
    model = _classifier(cls)
    for joint in (False, True):
        res = tfbnn.predict(model, x, num_samples=6, batch_size=4, return_samples=True, joint=joint)
        assert isinstance(res, tfbnn.ClassificationPrediction)
        assert res.samples.shape == (6, 10, 3) and res.mean_probs.shape == (10, 3)
        _assert_distinct_samples(res.samples)
        assert np.all(res.mutual_information > 0)


def test_mc_dropout_samples_differ_and_leave_batchnorm_alone():
    x = _x(12)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.5, seed=3),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    bn = model.layers[1]
    bn.moving_mean.assign(np.full((16,), 0.3, "float32"))
    stats = [w.numpy().copy() for w in bn.weights]
    res = tfbnn.predict(model, x, num_samples=5, return_samples=True, mc_dropout=True)
    _assert_distinct_samples(res.samples)
    assert np.all(res.mutual_information > 0)
    for before, w in zip(stats, bn.weights):
        np.testing.assert_array_equal(before, w.numpy())  # inference statistics, no update
    # Dropout off (Keras' inference behaviour): identical samples, with a warning.
    with pytest.warns(UserWarning, match="mc_dropout=True"):
        off = tfbnn.predict(model, x, num_samples=5, return_samples=True)
    # Identical up to float32 rounding: the T copies are rows of one batched matmul, and Eigen's CPU
    # kernels (AMD/ARM, TF_ENABLE_ONEDNN_OPTS=0) block rows differently (seen: 1 ulp, 6e-8); dropout on
    # moves them by more than 1e-2.
    np.testing.assert_allclose(off.samples, np.broadcast_to(off.samples[:1], off.samples.shape), rtol=1e-6, atol=0)
    np.testing.assert_allclose(off.mean_probs, model.predict(x, verbose=0), atol=1e-6)
    np.testing.assert_allclose(off.mutual_information, 0.0, atol=1e-6)


def test_mc_dropout_with_bayesian_layers_in_a_nested_functional_model():
    # tanh, not relu: an example whose relu units were all dead gave the same output in two samples.
    inner = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(8, activation="tanh", seed=1), keras.layers.Dropout(0.3)])
    inputs = keras.Input((5,))
    outputs = keras.layers.Dense(2, activation="softmax")(inner(inputs))
    model = keras.Model(inputs, outputs)
    # No KL scale is set: with training=True the Bayesian layer would refuse to run.
    res = tfbnn.predict(model, _x(), num_samples=4, return_samples=True, mc_dropout=True)
    _assert_distinct_samples(res.samples)


def test_mc_dropout_errors():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2, activation="softmax")
            self.drop = keras.layers.Dropout(0.5)

        def call(self, x):
            return self.dense(self.drop(x))

    with pytest.raises(ValueError, match="Sequential or functional.*Subclassed"):
        tfbnn.predict(Subclassed(), _x(), num_samples=2, mc_dropout=True)
    model = _classifier(tfbnn.DenseFlipout)
    with pytest.raises(ValueError, match="no Keras dropout layer"):
        tfbnn.predict(model, _x(), num_samples=2, mc_dropout=True)


def test_entropy_decomposition_against_hand_computation():
    p = np.array(
        [
            [[0.7, 0.2, 0.1], [1.0, 0.0, 0.0]],
            [[0.1, 0.8, 0.1], [1.0, 0.0, 0.0]],
            [[0.3, 0.3, 0.4], [0.5, 0.5, 0.0]],
        ]
    )  # T=3, B=2, C=3
    res = inference.summarize_classification(p)
    for b in range(2):
        p_bar = [sum(p[t, b, c] for t in range(3)) / 3 for c in range(3)]
        total = _hand_entropy(p_bar)
        aleatoric = sum(_hand_entropy(p[t, b]) for t in range(3)) / 3
        np.testing.assert_allclose(res.mean_probs[b], p_bar, rtol=1e-6)
        np.testing.assert_allclose(res.predictive_entropy[b], total, rtol=1e-6)
        np.testing.assert_allclose(res.expected_entropy[b], aleatoric, rtol=1e-6)
        np.testing.assert_allclose(res.mutual_information[b], total - aleatoric, rtol=1e-5)
    np.testing.assert_array_equal(res.predicted_class, [1, 0])
    np.testing.assert_allclose(res.confidence, [1.3 / 3, 2.5 / 3], rtol=1e-6)
    assert res.epistemic is res.mutual_information and res.aleatoric is res.expected_entropy
    # Two confident samples that disagree: all epistemic, log 2 - H(0.9, 0.1).
    two = inference.summarize_classification(np.array([[[0.9, 0.1]], [[0.1, 0.9]]]))
    np.testing.assert_allclose(two.mutual_information, np.log(2) - _hand_entropy([0.9, 0.1]), rtol=1e-6)
    # Logits give the same summary as their softmax; one sigmoid unit becomes two classes.
    from_logits = inference.summarize_classification(np.log(np.clip(p, 1e-30, 1)), from_logits=True)
    np.testing.assert_allclose(from_logits.predictive_entropy, res.predictive_entropy, rtol=1e-5)
    sig = inference.summarize_classification(np.array([[[0.0]], [[np.log(3.0)]]]), from_logits=True)
    np.testing.assert_allclose(sig.mean_probs, [[0.375, 0.625]], rtol=1e-6)


def test_predict_summary_equals_manual_computation_from_its_samples():
    x = _x(11)
    model = _classifier(tfbnn.DenseFlipout)
    res = tfbnn.predict(model, x, num_samples=7, batch_size=3, return_samples=True)
    s = res.samples.astype(np.float64)
    assert s.shape == (7, 11, 3)
    np.testing.assert_allclose(s.sum(-1), 1.0, atol=1e-5)
    p_bar = s.mean(0)
    total = -(p_bar * np.log(p_bar)).sum(-1)
    aleatoric = (-(s * np.log(s)).sum(-1)).mean(0)
    np.testing.assert_allclose(res.mean_probs, p_bar, rtol=1e-5)
    np.testing.assert_allclose(res.predictive_entropy, total, rtol=1e-5)
    np.testing.assert_allclose(res.expected_entropy, aleatoric, rtol=1e-5)
    np.testing.assert_allclose(res.mutual_information, total - aleatoric, atol=1e-6)
    # The same shapes for any batching, a dataset, and without samples.
    for kwargs in ({"batch_size": None}, {"batch_size": 11}, {"batch_size": 1}):
        other = tfbnn.predict(model, x, num_samples=7, **kwargs)
        assert other.samples is None and other.mean_probs.shape == (11, 3)
        assert other.mutual_information.shape == other.predictive_entropy.shape == (11,)
    ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(11))).batch(4)
    assert tfbnn.predict(model, ds, num_samples=7).mean_probs.shape == (11, 3)


def test_joint_samples_are_sample_major_with_one_weight_draw_per_sample():
    # A linear reparameterization layer with joint=True: within one batch, sample t
    # must be x W_t + b_t for one (W_t, b_t), i.e. an exact affine function of x.
    x = _x(9, 3)
    model = keras.Sequential([keras.Input((3,)), tfbnn.DenseReparameterization(2, seed=4)])
    model.layers[0].kernel_rho.assign(np.zeros((3, 2), "float32"))
    model.layers[0].bias_rho.assign(np.zeros((2,), "float32"))
    res = tfbnn.predict(model, x, num_samples=5, batch_size=9, return_samples=True, task="regression", joint=True)
    design = np.concatenate([x, np.ones((9, 1), "float32")], axis=1)
    coefs = []
    for t in range(5):
        coef, *_ = np.linalg.lstsq(design, res.samples[t], rcond=None)
        np.testing.assert_allclose(design @ coef, res.samples[t], atol=1e-4)
        coefs.append(coef)
    assert min(np.abs(coefs[i] - coefs[j]).max() for i in range(5) for j in range(i + 1, 5)) > 1e-2
    # The default (per-row samples) is not one affine map per sample.
    per_row = tfbnn.predict(model, x, num_samples=5, batch_size=9, return_samples=True, task="regression")
    coef, *_ = np.linalg.lstsq(design, per_row.samples[0], rcond=None)
    assert np.abs(design @ coef - per_row.samples[0]).max() > 1e-2


def test_mean_mode_gives_zero_mutual_information_and_the_cache_follows_the_mode():
    x = _x()
    model = _classifier(tfbnn.DenseReparameterization)
    tfbnn.set_inference_mode(model, "mean")
    res = tfbnn.predict(model, x, num_samples=5, return_samples=True)
    np.testing.assert_allclose(res.mutual_information, 0.0, atol=1e-6)
    np.testing.assert_allclose(res.samples, np.broadcast_to(res.samples[:1], res.samples.shape), atol=1e-7)
    np.testing.assert_allclose(res.mean_probs, model.predict(x, verbose=0), atol=1e-6)
    tfbnn.set_inference_mode(model, "sample")
    assert np.all(tfbnn.predict(model, x, num_samples=5).mutual_information > 0)


def test_the_cache_follows_the_mode_of_mc_dropout_layers_too():
    """posterior_mean switches MC dropout off: predict must not reuse the sampling trace."""
    x = _x()
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8), tfbnn.MCDropout(0.5, seed=1),
                              keras.layers.Dense(3, activation="softmax")])
    assert np.all(tfbnn.predict(model, x, num_samples=8).mutual_information > 0)
    with tfbnn.posterior_mean(model):
        off = tfbnn.predict(model, x, num_samples=8, return_samples=True)
        np.testing.assert_allclose(off.mean_probs, model.predict(x, verbose=0), atol=1e-6)  # dropout off
    np.testing.assert_allclose(off.mutual_information, 0.0, atol=1e-6)
    assert np.all(tfbnn.predict(model, x, num_samples=8).mutual_information > 0)


def test_a_dropout_warning_only_when_no_stochastic_layer_samples():
    x = _x()
    plain = keras.layers.Dropout(0.5)
    mixed = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8), plain, tfbnn.MCDropout(0.5, seed=1),
                              keras.layers.Dense(3, activation="softmax")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the MC dropout layer samples: no "identical samples" warning
        assert np.all(tfbnn.predict(mixed, x, num_samples=4).mutual_information > 0)
    with tfbnn.posterior_mean(mixed), pytest.warns(UserWarning, match="all Monte Carlo samples will be identical"):
        tfbnn.predict(mixed, x, num_samples=4)


class _CountingLayer(keras.layers.Layer):
    """The identity, counting its calls: Python runs ``call`` once per trace of the sampler."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def call(self, inputs):
        self.calls += 1
        return inputs


def test_one_trace_serves_all_batch_sizes():
    x = _x(10)
    counter = _CountingLayer()
    model = keras.Sequential([keras.Input((5,)), counter, tfbnn.DenseLocalReparameterization(8, seed=1),
                              tfbnn.DenseLocalReparameterization(3, activation="softmax", seed=2)])
    built = counter.calls
    tfbnn.predict(model, x, num_samples=4, batch_size=4)  # batches of 4, 4, 2
    tfbnn.predict(model, x[:3], num_samples=4, batch_size=4)
    assert counter.calls - built == 1
    tfbnn.predict(model, x[:3], num_samples=5)  # another T: a second trace (the counter sees traces)
    assert counter.calls - built == 2
    assert all(layer.weight_samples[0] == 1 for layer in tfbnn.bayesian_layers(model))


def test_task_resolution():
    x = _x()
    softmax = _classifier(tfbnn.DenseFlipout)
    linear = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(2, seed=1)])
    assert isinstance(tfbnn.predict(softmax, x, num_samples=2), tfbnn.ClassificationPrediction)
    reg = tfbnn.predict(linear, x, num_samples=3)
    assert isinstance(reg, tfbnn.RegressionPrediction) and reg.aleatoric_std is None
    assert reg.mean.shape == reg.epistemic_std.shape == reg.total_std.shape == (10, 2)
    assert isinstance(tfbnn.predict(linear, x, num_samples=2, from_logits=True), tfbnn.ClassificationPrediction)
    assert isinstance(tfbnn.predict(softmax, x, num_samples=2, task="regression"), tfbnn.RegressionPrediction)
    binary = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(1, activation="sigmoid", seed=1)])
    assert tfbnn.predict(binary, x, num_samples=2, task="classification").mean_probs.shape == (10, 2)


def test_auto_task_comes_from_the_model_not_the_data():
    x = _x()
    classifier = _classifier(tfbnn.DenseFlipout)
    x_nan = x.copy()
    x_nan[0] = np.nan  # the first batch's outputs are no longer probability vectors
    with pytest.raises(ValueError, match=r"Expected finite inputs.*rows \[0\]"):
        tfbnn.predict(classifier, x_nan, num_samples=2)  # was a RegressionPrediction (no mean_probs)
    x_late = x.copy()
    x_late[6, 1] = np.inf
    with pytest.raises(ValueError, match=r"rows \[6\]"):
        tfbnn.predict(classifier, x_late, num_samples=2, batch_size=4)
    with pytest.raises(ValueError, match=r"rows \[6\]"):
        tfbnn.predict(classifier, tf.data.Dataset.from_tensor_slices(x_late).batch(4), num_samples=2)
    # A Softmax layer (nested in a functional model) makes a classifier ...
    logits = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(3, seed=1)])
    inputs = keras.Input((5,))
    nested = keras.Model(inputs, keras.layers.Softmax()(logits(inputs)))
    assert isinstance(tfbnn.predict(nested, x, num_samples=2), tfbnn.ClassificationPrediction)
    # ... and a regression head stays regression even where its outputs look like probabilities.
    regression = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(
        2, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant([0.25, 0.75]), seed=1)])
    with tfbnn.posterior_mean(regression):
        res = tfbnn.predict(regression, x, num_samples=2)
    assert isinstance(res, tfbnn.RegressionPrediction)
    np.testing.assert_allclose(res.mean, np.tile([0.25, 0.75], (10, 1)))


def test_bad_arguments():
    model = _classifier(tfbnn.DenseFlipout)
    for kwargs, match in [
        ({"num_samples": 0}, "num_samples=0"),
        ({"num_samples": 2.0}, "num_samples=2.0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"task": "ranking"}, "task='ranking'"),
        ({"task": "regression", "from_logits": True}, "from_logits=True"),
        ({"task": "classification", "gaussian_head": True}, "gaussian_head=True"),
    ]:
        with pytest.raises(ValueError, match=match):
            tfbnn.predict(model, _x(), **kwargs)
    with pytest.raises(ValueError, match="batch_size=4"):
        tfbnn.predict(model, tf.data.Dataset.from_tensor_slices(_x()).batch(2), batch_size=4)
    with pytest.raises(ValueError, match="0 examples"):
        tfbnn.predict(model, _x()[:0])


def test_numpy_scalars_are_accepted_as_keras_accepts_them():
    model = _classifier(tfbnn.DenseFlipout)
    res = tfbnn.predict(model, _x(), num_samples=np.int64(3), batch_size=np.int32(4))
    assert res.num_samples == 3 and res.mean_probs.shape == (10, 3)
    with tfbnn.weight_samples(model, np.int16(2)):
        assert all(layer.weight_samples[0] == 2 for layer in tfbnn.bayesian_layers(model))
    reg = tfbnn.predict(keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(2, seed=1)]), _x(), num_samples=2)
    lower, upper = reg.interval(np.float32(0.9))
    assert np.all(lower <= upper)
    with pytest.raises(ValueError, match="num_samples=True"):
        tfbnn.predict(model, _x(), num_samples=True)


def test_regression_summary_and_interval_by_hand():
    # T=2 Gaussian-head samples for B=1, d=1: means 1 and 3, scales 0.5 and 1.5.
    s = inference.summarize_regression(np.array([[[1.0, 0.5]], [[3.0, 1.5]]]), gaussian_head=True)
    np.testing.assert_allclose(s.mean, [[2.0]])
    np.testing.assert_allclose(s.epistemic_std, [[1.0]])
    np.testing.assert_allclose(s.aleatoric_std, [[np.sqrt((0.25 + 2.25) / 2)]], rtol=1e-6)
    np.testing.assert_allclose(s.total_std, [[np.sqrt(1.0 + 1.25)]], rtol=1e-6)
    lo, hi = s.interval(0.95)
    z = statistics.NormalDist().inv_cdf(0.975)
    np.testing.assert_allclose([lo[0, 0], hi[0, 0]], [2 - z * np.sqrt(2.25), 2 + z * np.sqrt(2.25)], rtol=1e-6)
    for level in (0, 1, 1.5, True):
        with pytest.raises(ValueError, match="level="):
            s.interval(level)


def test_gaussian_nll_and_head():
    y_pred = np.array([[0.5, -1.0, 0.3, 2.0]], "float32")  # d=2: means (0.5, -1), scales (0.3, 2)
    y_true = np.array([[0.0, 1.0]], "float32")
    expected = -tfp.distributions.Normal([0.5, -1.0], [0.3, 2.0]).log_prob([0.0, 1.0]).numpy().sum()
    np.testing.assert_allclose(tfbnn.gaussian_nll(y_true, y_pred).numpy(), [expected], rtol=1e-5)
    np.testing.assert_allclose(tfbnn.gaussian_nll(np.array([0.0]), y_pred[:, [0, 2]]).numpy(),
                               [-tfp.distributions.Normal(0.5, 0.3).log_prob(0.0).numpy()], rtol=1e-5)
    head = tfbnn.GaussianHead(min_scale=0.01)
    out = head(np.array([[1.0, -50.0], [2.0, 0.0]], "float32")).numpy()
    np.testing.assert_allclose(out, [[1.0, 0.01], [2.0, np.log(2.0) + 0.01]], rtol=1e-5)
    assert tfbnn.GaussianHead.from_config(head.get_config()).get_config() == head.get_config()
    with pytest.raises(ValueError, match="min_scale=0"):
        tfbnn.GaussianHead(min_scale=0)
    with pytest.raises(ValueError, match=r"even last dimension.*input_shape=\(None, 3\)"):
        keras.Sequential([keras.Input((3,)), tfbnn.GaussianHead()])


def test_gaussian_nll_rejects_mismatched_targets_and_non_positive_scales():
    one_output = np.array([[0.0, 1.0]] * 4, "float32")  # d = 1: a mean and a scale per example
    with pytest.raises(ValueError, match=r"Expected `y_true`.*y_true.shape=\(4, 2\), y_pred.shape=\(4, 2\)"):
        tfbnn.gaussian_nll(np.zeros((4, 2), "float32"), one_output)  # would broadcast to (4, 2)
    for scale in (-1.0, 0.0, np.nan):
        with pytest.raises(ValueError, match="positive scales.*y_pred"):
            tfbnn.gaussian_nll(np.zeros((4, 1), "float32"), np.array([[0.0, scale]] * 4, "float32"))
    # In a compiled train step: a raw Dense head (negative scales), then targets of the wrong width.
    def model(scale):
        net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(
            2, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant([0.0, scale]))])
        net.compile("sgd", loss=tfbnn.gaussian_nll)
        return net

    x = np.zeros((4, 1), "float32")
    with pytest.raises(tf.errors.InvalidArgumentError, match="positive scales"):
        model(-1.0).fit(x, np.zeros((4, 1), "float32"), verbose=0)
    with pytest.raises(ValueError, match=r"y_true.shape=\(None, 3\)"):
        model(1.0).fit(x, np.zeros((4, 3), "float32"), verbose=0)
    net = model(1.0)
    net.fit(x, np.zeros((4, 1), "float32"), verbose=0)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="Expected `y_true`"):
        net.fit(x, np.zeros((4, 3), "float32"), verbose=0)  # a retraced step may not know the width


def test_gaussian_head_learns_heteroscedastic_noise_and_predict_splits_variance():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(200, 1)).astype("float32")
    noise = 0.05 + 0.25 * (x + 1)  # 0.05 at x=-1 up to 0.55 at x=1
    y = (np.sin(2 * x) + noise * rng.normal(size=x.shape)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((1,)),
            keras.layers.Dense(32, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(1)),
            keras.layers.Dense(2, kernel_initializer=keras.initializers.GlorotUniform(2)),
            tfbnn.GaussianHead(),
        ]
    )
    model.compile(keras.optimizers.Adam(0.02), loss=tfbnn.gaussian_nll)
    steps = tf.data.Dataset.from_tensors((x, y)).repeat(400)  # 400 full-batch steps, one epoch
    model.fit(steps, epochs=1, shuffle=False, verbose=0)
    probe = np.array([[-0.8], [0.0], [0.8]], "float32")
    res = tfbnn.predict(model, probe, num_samples=2)  # the Gaussian head is detected
    assert isinstance(res, tfbnn.RegressionPrediction)
    true_scale = (0.05 + 0.25 * (probe + 1))[:, 0]
    np.testing.assert_allclose(res.aleatoric_std[:, 0], true_scale, rtol=0.4)
    assert res.aleatoric_std[2, 0] > 2.5 * res.aleatoric_std[0, 0]
    np.testing.assert_allclose(res.epistemic_std, 0.0, atol=1e-6)  # a deterministic net
    np.testing.assert_allclose(res.mean[:, 0], np.sin(2 * probe[:, 0]), atol=0.15)

    # The compiled loss and the head survive a .keras round trip.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(probe, verbose=0), model.predict(probe, verbose=0), atol=1e-6)
    assert np.isfinite(loaded.evaluate(x, y, verbose=0))


def test_bayesian_gaussian_head_has_both_uncertainties():
    model = keras.Sequential(
        [keras.Input((2,)), tfbnn.DenseFlipout(8, activation="relu", seed=1), tfbnn.DenseFlipout(2, seed=2), tfbnn.GaussianHead()]
    )
    for layer in tfbnn.bayesian_layers(model):
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -1.0, "float32"))
    res = tfbnn.predict(model, _x(6, 2), num_samples=20, return_samples=True)
    assert res.samples.shape == (20, 6, 2) and res.mean.shape == (6, 1)
    assert np.all(res.aleatoric_std > 0) and np.all(res.epistemic_std > 0)
    np.testing.assert_allclose(res.total_std**2, res.epistemic_std**2 + res.aleatoric_std**2, rtol=1e-5)
    np.testing.assert_allclose(res.mean[:, 0], res.samples[:, :, 0].mean(0), rtol=1e-5, atol=1e-6)


# -- adaptive sampling (num_samples=AdaptiveSampling(...) or "auto") ----------------------------------
def _wide_posterior(seed=1, rho=1.0):
    """One Flipout softmax layer with a deterministic bias: x = 0 has no epistemic variance, large x a lot."""
    model = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(3, activation="softmax", bias_prior=None,
                                                                    seed=seed)])
    model.layers[0].kernel_rho.assign(np.full((5, 3), rho, "float32"))
    return model


def _easy_and_hard(n=6):
    x = _x(2 * n)
    x[:n] = 0.0
    return x


def _numpy_standard_error(samples, strata=1, floor=1.0):
    """max_c sqrt((sum_m s_mc^2 / S + floor / n) / (S n)) from NaN-padded, member-major samples (S * T, B, C)."""
    s = samples.astype(np.float64).reshape(strata, -1, *samples.shape[1:])
    n = np.sum(~np.isnan(s[0, :, :, 0]), axis=0)
    var = np.nanvar(s, axis=1, ddof=1)  # (S, B, C)
    return np.sqrt(np.max((var.sum(axis=0) / strata + floor / n[:, None]) / (strata * n[:, None]), axis=-1)), n


def test_adaptive_stopping_rule_holds_on_the_returned_samples():
    x = _easy_and_hard()
    model = _wide_posterior()
    tol, chunk, low, high = 0.02, 8, 16, 400
    rule = AdaptiveSampling(tolerance=tol, chunk_size=chunk, min_samples=low, max_samples=high)
    res = tfbnn.predict(model, x, num_samples=rule, return_samples=True, batch_size=5)
    assert res.samples.shape == (res.num_samples, 12, 3) and res.num_samples == res.samples_used.max()
    se, n = _numpy_standard_error(res.samples)
    np.testing.assert_array_equal(n, res.samples_used)
    np.testing.assert_allclose(res.standard_error, se, rtol=1e-5, atol=1e-9)
    assert np.all((n >= low) & (n <= high)) and np.all(n % chunk == 0)
    stopped = n < high
    assert np.all(se[stopped] <= tol) and stopped.sum() >= 6
    # Identical samples (x = 0) stop once the Chow-Robbins term 1 / n^2 <= tol^2: n >= 1 / tol.
    assert np.all(n[:6] >= 1 / tol) and np.all(n[:6] < 2 / tol + chunk)
    # The summary is the ordinary summary of each example's own samples.
    s = res.samples.astype(np.float64)
    for b in range(12):
        own = inference.summarize_classification(s[: n[b], b : b + 1])
        np.testing.assert_allclose(res.mean_probs[b], own.mean_probs[0], atol=1e-6)
        np.testing.assert_allclose(res.expected_entropy[b], own.expected_entropy[0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(res.mutual_information[b], own.mutual_information[0], atol=1e-6)


def test_adaptive_counts_differ_between_easy_and_hard_inputs_and_per_batch_shares_them():
    x = _easy_and_hard()
    model = _wide_posterior()
    res = tfbnn.predict(model, x, num_samples=AdaptiveSampling(tolerance=0.01, max_samples=4000))
    assert np.all(res.samples_used[:6] <= 256)  # x = 0: no variance, 1 / tol samples and a chunk
    assert np.all(res.samples_used[6:] >= 4 * res.samples_used[:6].max())
    batch = tfbnn.predict(model, x, num_samples=AdaptiveSampling(tolerance=0.01, max_samples=4000, per="batch"),
                          batch_size=4)
    counts = batch.samples_used.reshape(3, 4)
    assert np.all(counts == counts[:, :1]) and counts[0, 0] <= 256 and counts[2, 0] >= 4 * counts[0, 0]
    assert np.all(batch.standard_error[batch.samples_used < 4000] <= 0.01)


def test_adaptive_sampling_of_a_deterministic_model_stops_at_the_minimum():
    det = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    res = tfbnn.predict(det, _x(), num_samples=AdaptiveSampling(min_samples=5, chunk_size=2), return_samples=True)
    np.testing.assert_array_equal(res.samples_used, np.full(10, 5))
    np.testing.assert_array_equal(res.standard_error, np.zeros(10))  # no noise, no Monte Carlo error
    np.testing.assert_array_equal(res.mutual_information, np.zeros(10))  # exactly, not round-off
    np.testing.assert_array_equal(tfbnn.predict(det, _x(), num_samples=7).mutual_information, np.zeros(10))
    np.testing.assert_allclose(res.mean_probs, det.predict(_x(), verbose=0), atol=1e-6)
    reg = tfbnn.predict(keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)]), _x(), num_samples="auto")
    np.testing.assert_array_equal(reg.samples_used, np.full(10, 16))  # the default minimum
    # Bayesian layers in posterior-mean mode: identical samples, zero variance; regression has no floor.
    linear = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(2, seed=1)])
    with tfbnn.posterior_mean(linear):
        same = tfbnn.predict(linear, _x(), num_samples=AdaptiveSampling(min_samples=3, chunk_size=2))
    np.testing.assert_array_equal(same.samples_used, np.full(10, 3))


def test_adaptive_regression_and_ensembles_follow_the_numpy_computation():
    x = _easy_and_hard(4)
    linear = keras.Sequential([keras.Input((5,)), tfbnn.DenseFlipout(2, bias_prior=None, seed=3)])
    linear.layers[0].kernel_rho.assign(np.full((5, 2), -1.0, "float32"))
    rule = AdaptiveSampling(tolerance=0.02, chunk_size=4, min_samples=4, max_samples=4000)
    res = tfbnn.predict(linear, x, num_samples=rule, return_samples=True)
    se, n = _numpy_standard_error(res.samples, floor=0.0)  # regression: no variance floor
    np.testing.assert_allclose(res.standard_error, se, rtol=1e-5, atol=1e-9)
    assert np.all(se <= 0.02) and np.all(n[:4] == 4) and np.all(n[4:] > 4)
    s = res.samples.astype(np.float64)
    for b in range(8):
        np.testing.assert_allclose(res.mean[b], s[: n[b], b].mean(0), atol=1e-5)
        np.testing.assert_allclose(res.epistemic_std[b], s[: n[b], b].std(0), rtol=1e-4, atol=1e-6)
    # An ensemble of Bayesian members: the members are strata, between-member spread is no Monte Carlo error.
    ensemble = tfbnn.DeepEnsemble([_wide_posterior(seed=s, rho=-1.0) for s in (1, 1001, 2001)])
    ens = tfbnn.predict(ensemble, x, num_samples=AdaptiveSampling(tolerance=0.01, chunk_size=4, min_samples=4),
                        return_samples=True)
    se, n = _numpy_standard_error(ens.samples, strata=3)
    np.testing.assert_array_equal(3 * n, ens.samples_used)
    np.testing.assert_allclose(ens.standard_error, se, rtol=1e-5, atol=1e-9)
    assert np.all(se <= 0.01) and np.all(n[4:] > n[:4].max())
    s = ens.samples.astype(np.float64).reshape(3, -1, 8, 3)
    np.testing.assert_allclose(ens.mean_probs, np.nanmean(s, axis=1).mean(axis=0), atol=1e-6)


def test_adaptive_sampling_is_seeded():
    x = _easy_and_hard()

    def run(seed):
        keras.utils.set_random_seed(0)  # the initial posterior means; the layer seed drives the noise
        return tfbnn.predict(_wide_posterior(seed=seed), x, num_samples=AdaptiveSampling(tolerance=0.02))

    first, second, other = run(7), run(7), run(8)
    np.testing.assert_array_equal(first.samples_used, second.samples_used)
    np.testing.assert_array_equal(first.mean_probs, second.mean_probs)
    assert np.abs(first.mean_probs - other.mean_probs).max() > 1e-4


def test_adaptive_sampling_rejects_bad_settings_by_name():
    for kwargs, match in [
        ({"tolerance": 0}, "tolerance=0"),
        ({"tolerance": -0.1}, "tolerance=-0.1"),
        ({"tolerance": float("nan")}, "tolerance=nan"),
        ({"tolerance": "small"}, "tolerance='small'"),
        ({"max_samples": 0}, "max_samples=0"),
        ({"max_samples": 8, "min_samples": 16}, r"max_samples=8.*|min_samples=16"),
        ({"max_samples": 2.5}, "max_samples=2.5"),
        ({"min_samples": 1}, "min_samples=1"),
        ({"chunk_size": 0}, "chunk_size=0"),
        ({"per": "dataset"}, "per='dataset'"),
    ]:
        with pytest.raises(ValueError, match=match):  # on construction, before any model runs
            AdaptiveSampling(**kwargs)
    model = _wide_posterior()
    with pytest.raises(ValueError, match="num_samples='many'"):
        tfbnn.predict(model, _x(), num_samples="many")
    with pytest.raises(ValueError, match=r"positive integer, 'auto' or a tfbnn.inference.AdaptiveSampling.*num_samples=0"):
        tfbnn.predict(model, _x(), num_samples=0)


def test_adaptive_sampling_defaults_depend_on_the_chunk_size():
    assert AdaptiveSampling() == AdaptiveSampling(0.01, 1000, 16, 16, "example")
    assert AdaptiveSampling(chunk_size=1).min_samples == 2  # a variance needs two samples
    assert AdaptiveSampling(chunk_size=64).min_samples == 64
    assert AdaptiveSampling(min_samples=2000).max_samples == 2000
    rule = AdaptiveSampling(tolerance=1, max_samples=np.int64(50))  # checked values come back as Python numbers
    assert type(rule.tolerance) is float and type(rule.max_samples) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.tolerance = 0.5


def test_auto_is_the_default_adaptive_sampling():
    x = _easy_and_hard()

    def run(num_samples):
        keras.utils.set_random_seed(0)
        return tfbnn.predict(_wide_posterior(seed=7), x, num_samples=num_samples, return_samples=True)

    auto, default = run("auto"), run(AdaptiveSampling())
    np.testing.assert_array_equal(auto.samples_used, default.samples_used)
    np.testing.assert_array_equal(auto.mean_probs, default.mean_probs)
    np.testing.assert_array_equal(auto.samples, default.samples)


def test_the_old_adaptive_keywords_still_work_with_a_deprecation_warning():
    x = _easy_and_hard()
    settings = {"tolerance": 0.02, "max_samples": 400, "min_samples": 8, "chunk_size": 8, "per": "batch"}

    def run(**kwargs):
        keras.utils.set_random_seed(0)
        return tfbnn.predict(_wide_posterior(seed=7), x, batch_size=4, return_samples=True, **kwargs)

    with pytest.warns(DeprecationWarning) as caught:
        old = run(num_samples="auto", **settings)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"`{name}=` is deprecated; pass num_samples=tfbnn.inference.AdaptiveSampling({name}=...)" for name in settings]
    assert all(w.filename == __file__ for w in caught if w.category is DeprecationWarning)  # at the caller
    new = run(num_samples=AdaptiveSampling(**settings))
    np.testing.assert_array_equal(old.samples_used, new.samples_used)
    np.testing.assert_array_equal(old.mean_probs, new.mean_probs)
    np.testing.assert_array_equal(old.standard_error, new.standard_error)
    np.testing.assert_array_equal(old.samples, new.samples)
    with pytest.warns(DeprecationWarning, match="`tolerance=` is deprecated"):
        regression = tfbnn.predict(keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)]), _x(),
                                   num_samples="auto", tolerance=0.5)
    assert regression.standard_error.shape == (10,)
    # Bad values are AdaptiveSampling's errors; None is "not given", as it was.
    with pytest.raises(ValueError, match="tolerance=0"):
        tfbnn.predict(_wide_posterior(), _x(), num_samples="auto", tolerance=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tfbnn.predict(_wide_posterior(), _x(), num_samples="auto", tolerance=None, per=None)
    # With a fixed T, or beside an AdaptiveSampling, they are an error (no warning) as before.
    model = _wide_posterior()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"`tolerance` applies to num_samples='auto'.*tolerance=0.1"):
            tfbnn.predict(model, _x(), num_samples=10, tolerance=0.1)
        with pytest.raises(ValueError, match="`max_samples` applies"):
            tfbnn.predict(model, _x(), num_samples=10, max_samples=100)
        with pytest.raises(ValueError, match=r"`per` applies to num_samples='auto'.*num_samples=AdaptiveSampling"):
            tfbnn.predict(model, _x(), num_samples=AdaptiveSampling(), per="batch")
    with pytest.raises(TypeError, match="tolerence"):  # a misspelt keyword is still a TypeError
        tfbnn.predict(model, _x(), num_samples="auto", tolerence=0.1)


class _Block(keras.layers.Layer):
    """A subclassed layer with its own sublayers, as a KerasHub TransformerEncoder (and optionally batch norm)."""

    def __init__(self, norm=False, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(4)
        self.drop = keras.layers.Dropout(0.5, seed=0)
        self.norm = keras.layers.BatchNormalization() if norm else None

    def call(self, x, training=None):
        h = self.drop(self.dense(x), training=training)
        return self.norm(h, training=training) if self.norm is not None else h


def test_mc_dropout_reaches_dropout_inside_a_subclassed_layer():
    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(2)(_Block()(inp)))
    x = np.ones((2, 3), "float32")
    samples = tfbnn.predict(model, x, num_samples=6, mc_dropout=True, task="regression", return_samples=True).samples
    # Inverted dropout keeps a unit as h / (1 - rate) or drops it: each unit's output takes both values.
    hidden = keras.Model(inp, model.layers[1].output)
    h = tfbnn.predict(hidden, x, num_samples=64, mc_dropout=True, task="regression", return_samples=True).samples
    clean = hidden(x).numpy()
    assert np.all(np.isclose(h, 0) | np.isclose(h, 2 * clean, atol=1e-6))
    assert np.isclose(h, 0).any() and not np.isclose(h, 0).all()
    assert np.std(samples, axis=0).max() > 0
    np.testing.assert_allclose(model(x), model(x))  # the model itself keeps its dropout off


def test_mc_dropout_refuses_a_subclassed_layer_whose_training_mode_changes_more():
    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(2)(_Block(norm=True, name="block")(inp)))
    with pytest.raises(ValueError, match="could not reach the dropout layers inside a subclassed layer"):
        tfbnn.predict(model, np.ones((2, 3), "float32"), num_samples=2, mc_dropout=True, task="regression")
