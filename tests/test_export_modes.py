"""export(mode="moments" | "frozen"): SavedModels with no random op, equal to the in-Python computation.

The random-op check walks every endpoint's graph of the *loaded* SavedModel (its function
library included) against a list of TensorFlow's random op types; the check can fail: the
Monte Carlo graph of the same model has such ops. The frozen export is checked against K
NumPy weight samples drawn independently with the documented scheme (one
``numpy.random.default_rng(seed)``, per Bayesian layer the kernel's then the bias's
standard normals) and the K networks run one by one in the test.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import export, moments

# Not imported from tfbnn: the test's own list of the random op types TensorFlow has.
RANDOM = {"RandomStandardNormal", "RandomUniform", "RandomUniformInt", "TruncatedNormal", "StatelessRandomNormalV2",
          "StatelessRandomUniformV2", "StatelessRandomGetKeyCounter", "StatelessRandomNormal",
          "StatelessRandomUniform", "StatelessRandomUniformIntV2", "StatefulStandardNormalV2", "RngReadAndSkip"}


def _op_types(concrete):
    graph_def = concrete.graph.as_graph_def()
    return {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}


def _conv_net():
    model = keras.Sequential([
        keras.Input((5, 5, 1)),
        tfbnn.layers.Conv2DFlipout(2, 3, activation="relu", kernel_scale_initializer=keras.initializers.Constant(-1.0),
                                   seed=0),
        keras.layers.Flatten(),
        tfbnn.layers.DenseReparameterization(3, activation="softmax", seed=1),
    ])
    return model


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(0).normal(size=(4, 5, 5, 1)).astype("float32")


def test_the_random_op_check_sees_the_monte_carlo_graph():
    model = _conv_net()
    spec = tf.TensorSpec([None, 5, 5, 1])
    assert _op_types(tf.function(lambda x: model(x)).get_concrete_function(spec)) & RANDOM
    assert export.random_ops(tf.function(lambda x: model(x)).get_concrete_function(spec))


def test_moments_export_has_no_random_op_and_serves_the_propagated_summary(tmp_path, data):
    model = _conv_net()
    path = export.export(model, str(tmp_path / "moments"), mode="moments")
    served = tf.saved_model.load(path)
    for name in ("summary", "moments", "mean"):
        concrete = getattr(served, name).get_concrete_function(tf.TensorSpec([None, 5, 5, 1]))
        assert not _op_types(concrete) & RANDOM, name
    out = moments.propagate(model, data)
    summary = served.summary(tf.constant(data))
    assert sorted(summary) == ["mean_probs", "predictive_entropy"]
    np.testing.assert_allclose(summary["mean_probs"], out.probabilities().numpy(), rtol=1e-5, atol=1e-7)
    served_moments = served.moments(tf.constant(data))
    np.testing.assert_allclose(served_moments["variance"], out.variance.numpy(), rtol=1e-5, atol=1e-7)
    with tfbnn.posterior_mean(model):
        np.testing.assert_allclose(served.mean(tf.constant(data)), model(data).numpy(), rtol=1e-5, atol=1e-7)
    sig = served.signatures["serving_default"](x=tf.constant(data))
    np.testing.assert_allclose(sig["mean_probs"], summary["mean_probs"])


def _numpy_conv(x, kernel):
    """A valid, stride-1 correlation ``(N, H, W, C) * (k, k, C, F)``, by hand."""
    k = kernel.shape[0]
    n, h, w, _ = x.shape
    out = np.zeros((n, h - k + 1, w - k + 1, kernel.shape[-1]))
    for i in range(k):
        for j in range(k):
            out += np.einsum("nhwc,cf->nhwf", x[:, i:i + h - k + 1, j:j + w - k + 1], kernel[i, j])
    return out


def test_frozen_export_has_no_random_op_and_equals_k_numpy_networks(tmp_path, data):
    model = _conv_net()
    K, seed = 6, 11
    path = export.export(model, str(tmp_path / "frozen"), mode="frozen", num_samples=K, seed=seed)
    served = tf.saved_model.load(path)
    for name in ("summary", "samples", "mean"):
        assert not _op_types(getattr(served, name).get_concrete_function(tf.TensorSpec([None, 5, 5, 1]))) & RANDOM
    conv, dense = model.layers[0], model.layers[2]
    rng = np.random.default_rng(seed)
    conv_k = conv.kernel_loc.numpy() + conv.kernel_scale().numpy() * rng.standard_normal((K, 3, 3, 1, 2), "float32")
    conv_b = conv.bias_loc.numpy() + conv.bias_scale().numpy() * rng.standard_normal((K, 2), "float32")
    dense_k = dense.kernel_loc.numpy() + dense.kernel_scale().numpy() * rng.standard_normal((K, 18, 3), "float32")
    dense_b = dense.bias_loc.numpy() + dense.bias_scale().numpy() * rng.standard_normal((K, 3), "float32")
    probs = []
    for k in range(K):  # the K networks, one at a time
        h = np.maximum(_numpy_conv(data, conv_k[k]) + conv_b[k], 0).reshape(len(data), -1)
        logits = h @ dense_k[k] + dense_b[k]
        probs.append(np.exp(logits - logits.max(-1, keepdims=True)) / np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    probs = np.stack(probs)
    np.testing.assert_allclose(served.samples(tf.constant(data)), probs, rtol=1e-4, atol=1e-6)
    summary = served.summary(tf.constant(data))
    np.testing.assert_allclose(summary["mean_probs"], probs.mean(0), rtol=1e-4, atol=1e-6)
    entropy = -(probs * np.log(probs)).sum(-1)
    np.testing.assert_allclose(summary["aleatoric"], entropy.mean(0), rtol=1e-4, atol=1e-6)


def test_frozen_samples_are_seeded():
    model = _conv_net()
    a = export.frozen_samples(model, 3, seed=5)
    b = export.frozen_samples(model, 3, seed=5)
    c = export.frozen_samples(model, 3, seed=6)
    assert all(np.array_equal(x[1], y[1]) and np.array_equal(x[2], y[2]) for x, y in zip(a, b))
    assert not np.array_equal(a[0][1], c[0][1])


def test_bad_modes_and_unsupported_layers_are_refused(tmp_path):
    model = _conv_net()
    with pytest.raises(ValueError, match=r"Expected `mode` in \('monte_carlo', 'moments', 'frozen'\). Received: mode='dvi'"):
        export.export(model, str(tmp_path / "a"), mode="dvi")
    with pytest.raises(ValueError, match="mode='moments' exports format='saved_model'. Received: format='tflite'"):
        export.export(model, str(tmp_path / "a.tflite"), format="tflite", mode="moments")
    with pytest.raises(ValueError, match="num_samples"):
        export.frozen_samples(model, 0)
    dropout = keras.Sequential([keras.Input((3,)), tfbnn.layers.MCDropout(0.5, seed=0), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"layer 'mc_dropout\w*' \(class MCDropout\) draws other noise"):
        export.export(dropout, str(tmp_path / "b"), mode="frozen")
    node = keras.Sequential([keras.Input((3,)), tfbnn.layers.NodeDense(2, seed=0)])
    with pytest.raises(ValueError, match=r"\(class NodeDense\)"):
        export.export(node, str(tmp_path / "c"), mode="moments")
    assert not os.path.exists(tmp_path / "b") and not os.path.exists(tmp_path / "c")
