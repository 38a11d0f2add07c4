"""The KerasHub zoo models (tfbnn.models.kerashub): tiny ViT / BERT configs, random weights, offline."""

import sys
import warnings

import keras
import numpy as np
import pytest

pytest.importorskip("keras_hub")

import tfbnn  # noqa: E402
import tfbnn.models as zoo  # noqa: E402
from tfbnn.layers import DenseFlipout, MCDropout  # noqa: E402

N = 64
VIT = {"input_shape": (8, 8, 1), "patch_size": 4, "num_classes": 3}  # 4 patches + the class token
BERT = {"vocab_size": 20, "max_length": 6, "num_layers": 1}


def _images(n=8):
    return np.random.default_rng(0).random((n, 8, 8, 1)).astype("float32")


def _ids(n=8):
    ids = np.random.default_rng(1).integers(1, BERT["vocab_size"], (n, BERT["max_length"])).astype("int32")
    ids[:, -2:] = 0  # padding
    return ids


def _normal_kl(loc, rho):
    """KL(N(loc, sigma^2) || N(0, 1)) summed, sigma = softplus(rho) + 1e-6, in NumPy float64."""
    sigma = np.logaddexp(0.0, np.asarray(rho, np.float64)) + 1e-6
    loc = np.asarray(loc, np.float64)
    return float(np.sum(-np.log(sigma) + 0.5 * (sigma**2 + loc**2) - 0.5))


def test_vit_bbb_head_is_the_only_bayesian_layer_and_everything_trains():
    keras.utils.set_random_seed(0)
    model = zoo.build("kerashub_vit", "bbb", num_examples=N, seed=7, bayesian_layers="last", **VIT)
    head = model.get_layer("predictions")
    assert model.name == "kerashub_vit_bbb" and tuple(model.output.shape) == (None, 3)
    assert type(head) is DenseFlipout and head.activation is keras.activations.softmax
    assert tfbnn.stochastic_layers(model) == [head] and head.seed == 8
    assert float(head.kl_weight.numpy()) == pytest.approx(1.0 / N)
    kl = _normal_kl(head.kernel_loc, head.kernel_rho) + _normal_kl(head.bias_loc, head.bias_rho)
    np.testing.assert_allclose(float(tfbnn.kl_divergence(model)), kl, rtol=1e-5)
    x, y = _images(), np.arange(8) % 3
    model(x, training=True)
    (loss,) = model.losses  # the objective's KL term is the head's
    np.testing.assert_allclose(float(loss), kl / N, rtol=1e-5)
    backbone = model.get_layer("backbone")
    assert backbone.trainable_weights and all(v.trainable for v in backbone.weights)  # end to end, nothing frozen
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", run_eagerly=True)  # 2 steps: no trace
    for _ in range(2):
        model.train_on_batch(x, y)
    moved = {v.path for v in model.trainable_variables if not np.allclose(v.numpy(), before[v.path])}
    assert {"predictions/kernel_loc", "predictions/kernel_rho", "predictions/bias_loc"} <= moved
    assert any(p.startswith("vit_patching_and_embedding/") for p in moved)  # the backbone trains too


def test_bert_mc_dropout_samples_the_head_and_reaches_the_backbones_dropout():
    rate = 0.3
    model = zoo.build("kerashub_bert", "mc_dropout", rate=rate, seed=3, **BERT)
    inner = [l for l in model.get_layer("backbone")._flatten_layers(recursive=True) if isinstance(l, keras.layers.Dropout)]
    assert inner and all(l.rate == rate for l in inner)  # the backbone's own dropout at the method's rate
    (head_dropout,) = tfbnn.stochastic_layers(model)
    assert type(head_dropout) is MCDropout and head_dropout.rate == rate and head_dropout.seed == 4
    x = _ids()
    samples = tfbnn.predict(model, x, num_samples=3, return_samples=True).samples
    assert np.ptp(samples, axis=0).max() > 1e-4  # the head's MC dropout is on at inference
    with tfbnn.posterior_mean(model):  # the head's dropout off: Keras' dropout stays off too
        np.testing.assert_allclose(model(x), model(x), rtol=0, atol=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "all Monte Carlo samples will be identical": that is the point here
            same = tfbnn.predict(model, x, num_samples=3, return_samples=True).samples
        np.testing.assert_allclose(same[0], same[1], atol=1e-6)
        np.testing.assert_allclose(same[0], model.predict(x, verbose=0), atol=1e-6)
        backbone = tfbnn.predict(model, x, num_samples=3, return_samples=True, mc_dropout=True).samples
    assert np.ptp(backbone, axis=0).max() > 1e-4  # mc_dropout=True: the dropout inside the TransformerEncoders
    np.testing.assert_allclose(backbone.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("name, method, shape", [("kerashub_vit", "bbb", VIT), ("kerashub_bert", "vd", BERT)])
def test_keras_round_trip_and_seeded_builds(name, method, shape, tmp_path):
    def build():
        keras.utils.set_random_seed(5)
        return zoo.build(name, method, num_examples=N, seed=2, bayesian_layers="last", **shape)

    model, again = build(), build()
    x = _images() if name == "kerashub_vit" else _ids()
    for w, v in zip(model.weights, again.weights):
        np.testing.assert_array_equal(w.numpy(), v.numpy())
    np.testing.assert_array_equal(tfbnn.predict(model, x, num_samples=2, return_samples=True).samples,
                                  tfbnn.predict(again, x, num_samples=2, return_samples=True).samples)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert [v.path for v in loaded.trainable_variables] == [v.path for v in model.trainable_variables]
    for w, v in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(w.numpy(), v.numpy())
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(model(x), loaded(x), rtol=1e-6, atol=1e-7)


def test_deterministic_models_follow_the_kerashub_task():
    """The head reads what KerasHub's task reads: the class token (ViT), the pooled [CLS] (BERT)."""
    vit = zoo.build("kerashub_vit", **VIT)
    assert not tfbnn.stochastic_layers(vit) and vit.name == "kerashub_vit_deterministic"
    x = _images(4)
    tokens = vit.get_layer("backbone")(x)
    head = vit.get_layer("predictions")
    np.testing.assert_allclose(vit(x), keras.ops.softmax(tokens[:, 0] @ head.kernel + head.bias), atol=1e-6)
    bert = zoo.build("kerashub_bert", **BERT)
    ids = _ids(4)
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": (ids != 0).astype("int32")}
    pooled = bert.get_layer("backbone")(inputs)["pooled_output"]
    head = bert.get_layer("predictions")
    np.testing.assert_allclose(bert(ids), keras.ops.softmax(pooled @ head.kernel + head.bias), atol=1e-6)
    assert tuple(bert.output.shape) == (None, 2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: zoo.build("kerashub_vit", "bbb", num_examples=N, **VIT),
         r"kerashub_vit takes method='bbb' only with bayesian_layers='last'.*ViTEncoder.*Received: method='bbb', "
         r"bayesian_layers='all'"),
        (lambda: zoo.build("kerashub_bert", "vd", num_examples=N, **BERT), r"TransformerEncoder.*method='vd'"),
        (lambda: zoo.build("kerashub_vit", input_shape=(8, 8, 1), patch_size=3), r"Received: patch_size=3"),
        (lambda: zoo.build("kerashub_vit", input_shape=(64,)), r"kerashub_vit expects `input_shape` \(height"),
        (lambda: zoo.build("kerashub_vit", hidden_dim=15), r"multiple of `num_heads` \(2\). Received: hidden_dim=15"),
        (lambda: zoo.build("kerashub_vit", dropout=1.0), r"Expected `dropout` in \[0, 1\). Received: dropout=1.0"),
        (lambda: zoo.build("kerashub_vit", preset=3), r"Received: preset=3"),
        (lambda: zoo.build("kerashub_bert"), r"needs `vocab_size`.*Received: vocab_size=None"),
        (lambda: zoo.build("kerashub_bert", vocab_size=1), r"Received: vocab_size=1"),
        (lambda: zoo.build("kerashub_bert", vocab_size=9, num_layers=0), r"Received: num_layers=0"),
        (lambda: zoo.build("kerashub_bert", "bbb", vocab_size=9, bayesian_layers="last"), r"Received: num_examples=None"),
    ],
)
def test_bad_arguments_are_rejected_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_missing_keras_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # import keras_hub -> ImportError
    with pytest.raises(ImportError, match=r"pip install tfbnn\[hub\]"):
        zoo.build("kerashub_vit", **VIT)
