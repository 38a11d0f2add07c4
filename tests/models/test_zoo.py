"""The model zoo: every (model, method) pair builds, trains a step, saves, predicts.

Lean by design (CI on 2 cores): batch 2, 32x32x3 images (784-vectors for the MLP),
SGD (no optimizer slots), ``tfbnn.predict`` with T = 2.

* Light models (mlp, lenet5, a tiny transformer on int token ids): every method in
  graph mode (the compiled train step and the compiled Monte Carlo sampler), each
  with a ``.keras`` round trip.
* Heavy models (alexnet, resnet50, vgg16, wide_resnet28_10; 23-37M parameters, twice
  that for bbb / vd): every method builds, predicts and takes a step, with TF
  functions run eagerly (tracing and optimizing the graphs of these nets, not the
  arithmetic, costs minutes on 2 cores); the ``.keras`` round trip runs once per
  family, with a different method for each (:data:`HEAVY_SAVE_LOAD`), so every
  non-deterministic method is saved and loaded inside a big net once.
* ``bayesian_layers="last"`` (deterministic body, Bayesian head): every builder and
  method, with small inputs; built and called once, not trained.

Order inside a pair: predict and save/load on the freshly built model, then the
train step. A step on a batch of 2 makes the batch-norm statistics of ResNet-50's
1x1 last stage degenerate (two values per channel), so the moving statistics can make
the *next* inference overflow; that says nothing about the zoo.
"""

import os
import re

import keras
import numpy as np
import pytest

import tfbnn
import tfbnn.models as zoo
from tfbnn.layers import (
    BayesianLayer,
    Conv2DFlipout,
    Conv2DReparameterization,
    Conv2DVariationalDropout,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
    DenseVariationalDropout,
    MCDropout,
    MCSpatialDropout2D,
    NodeConv2D,
    NodeDense,
    StochasticLayer,
)

N = 1000  # num_examples of the Bayesian builds
BATCH = 2
NUM_CLASSES = 10
METHOD_OPTIONS = {
    "deterministic": {},
    "mc_dropout": {"rate": 0.1},
    "bbb": {"estimator": "flipout", "prior": "normal"},
    "vd": {"parameterization": "additive"},
    "ibnn": {"num_components": 2},  # T = 2 Monte Carlo samples cover both components
}
TINY_TRANSFORMER = {"vocab_size": 20, "max_length": 6, "embed_dim": 4, "num_heads": 2, "ff_dim": 8}
#: Builder arguments that fix each model's input.
LIGHT = {"mlp": {"input_shape": (784,)}, "lenet5": {"input_shape": (32, 32, 3)}, "transformer": TINY_TRANSFORMER}
HEAVY = {name: {"input_shape": (32, 32, 3)} for name in ("alexnet", "resnet50", "vgg16", "wide_resnet28_10")}
#: The one method whose .keras round trip each heavy family runs.
HEAVY_SAVE_LOAD = {"alexnet": "mc_dropout", "resnet50": "bbb", "vgg16": "vd", "wide_resnet28_10": "ibnn"}
WEIGHT_LAYERS = (keras.layers.Dense, keras.layers.Conv2D)


def _data(shape):
    """A batch for a model built with ``shape`` (``input_shape``, or a transformer's token ids)."""
    rng = np.random.default_rng(0)
    if "vocab_size" in shape:
        x = rng.integers(0, shape["vocab_size"], (BATCH, shape["max_length"])).astype("int32")
    else:
        x = rng.random((BATCH, *shape["input_shape"])).astype("float32")
    y = np.arange(BATCH, dtype="int32") % NUM_CLASSES
    return x, y


def _build(name, method, shape, seed=7, **kwargs):
    return zoo.build(name, method, num_classes=NUM_CLASSES, num_examples=N, seed=seed, **shape,
                     **METHOD_OPTIONS[method], **kwargs)


def _sublayers(model):
    return model._flatten_layers(include_self=False, recursive=True)


def _check_structure(model, method):
    """Which layers the method made: the module table of tfbnn.models.methods."""
    layers = _sublayers(model)
    stochastic = [l for l in layers if isinstance(l, StochasticLayer)]
    bayesian = [l for l in stochastic if isinstance(l, BayesianLayer)]
    if method == "deterministic":
        assert not stochastic
    elif method == "mc_dropout":
        assert not bayesian and stochastic
        assert all(isinstance(l, (MCDropout, MCSpatialDropout2D)) for l in stochastic)
        assert all(l.rate == METHOD_OPTIONS["mc_dropout"]["rate"] for l in stochastic)
    else:
        # Every weight layer is Bayesian; only batch norm stays deterministic.
        assert not [l.name for l in layers if isinstance(l, WEIGHT_LAYERS)]
        assert bayesian and len(bayesian) == len(stochastic)
        assert all(float(l.kl_weight.numpy()) == pytest.approx(1.0 / N) for l in bayesian)
    seeds = [l.seed for l in stochastic]
    assert len(set(seeds)) == len(seeds), "every stochastic layer has its own seed"


def _check_predict(model, x):
    res = tfbnn.predict(model, x, num_samples=2, return_samples=True, task="classification")
    assert res.mean_probs.shape == (BATCH, NUM_CLASSES)
    assert res.samples.shape == (2, BATCH, NUM_CLASSES)
    assert res.mutual_information.shape == (BATCH,)
    assert np.all(np.isfinite(res.mean_probs))
    np.testing.assert_allclose(res.mean_probs.sum(axis=-1), 1.0, atol=1e-4)


def _check_save_load(model, x, path):
    model.save(path)
    loaded = keras.saving.load_model(path)
    os.remove(path)
    assert type(loaded) is type(model) and len(loaded.weights) == len(model.weights)
    for w, v in zip(model.weights, loaded.weights):
        assert w.path == v.path
        np.testing.assert_array_equal(w.numpy(), v.numpy())
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(model(x, training=False), loaded(x, training=False), rtol=1e-5, atol=1e-6)


def _check_train_step(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="sparse_categorical_crossentropy")
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    if any(isinstance(l, BayesianLayer) for l in _sublayers(model)):
        assert len(model.losses) > 0  # the kl_weight * KL terms


def _check_pair(name, method, shape, save_path):
    x, y = _data(shape)
    model = _build(name, method, shape)
    assert tuple(model.output.shape) == (None, NUM_CLASSES)
    _check_structure(model, method)
    _check_predict(model, x)
    if save_path is not None:
        _check_save_load(model, x, save_path)
    _check_train_step(model, x, y)


# -- every (model, method) pair -------------------------------------------------------


# The methods of METHOD_OPTIONS; sngp's zoo models are tested in tests/test_sngp.py (the mlp and lenet5:
# its layers are those of every builder, and a heavy net per method costs minutes of suite time).
@pytest.mark.parametrize("method", list(METHOD_OPTIONS))
@pytest.mark.parametrize("name", list(LIGHT))
def test_light_model_method_pair(name, method, tmp_path):
    _check_pair(name, method, LIGHT[name], str(tmp_path / "model.keras"))


@pytest.mark.heavy
@pytest.mark.parametrize("method", list(METHOD_OPTIONS))
@pytest.mark.parametrize("name", list(HEAVY))
def test_heavy_model_method_pair(name, method, tmp_path, eager):
    save = str(tmp_path / "model.keras") if HEAVY_SAVE_LOAD[name] == method else None
    _check_pair(name, method, HEAVY[name], save)


# -- parameter counts of the standard architectures ---------------------------------------


def _trainable(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def test_mlp_and_lenet_parameter_counts():
    assert zoo.build("mlp_blundell", input_shape=(784,)).count_params() == 2_395_210
    assert zoo.build("lenet_300_100", input_shape=(784,)).count_params() == 266_610
    assert zoo.build("mlp_400", input_shape=(784,)).count_params() == 318_010
    assert zoo.build("mlp_800", input_shape=(784,)).count_params() == 636_010
    assert zoo.build("mlp_1200", input_shape=(784,)).count_params() == 954_010
    assert zoo.lenet5(input_shape=(32, 32, 3)).count_params() == 62_006
    assert zoo.lenet5(input_shape=(32, 32, 1)).count_params() == 61_706  # LeCun's padded MNIST
    # bbb: a loc and a rho per weight and bias, plus one kl_weight scalar per layer.
    bbb = zoo.lenet5("bbb", num_examples=N)
    assert _trainable(bbb) == 2 * 62_006


@pytest.mark.heavy
def test_big_net_parameter_counts():
    resnet = zoo.resnet50(num_classes=10, input_shape=(32, 32, 3))
    reference = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    assert resnet.count_params() == reference.count_params() == 23_608_202
    assert _trainable(resnet) == _trainable(reference)
    del reference
    assert zoo.resnet50(num_classes=1000).count_params() == 25_636_712
    # The CIFAR stem swaps the 7x7 conv for a 3x3 one.
    assert zoo.resnet50(stem="cifar").count_params() == 23_608_202 - 64 * 3 * (49 - 9)
    keras.backend.clear_session()

    vgg = zoo.vgg16(num_classes=10, input_shape=(32, 32, 3))
    reference = keras.applications.VGG16(weights=None, input_shape=(32, 32, 3), classes=10)
    assert vgg.count_params() == reference.count_params() == 33_638_218
    del vgg, reference
    keras.backend.clear_session()

    wrn = zoo.wide_resnet28_10(num_classes=10)
    assert _trainable(wrn) == 36_479_194  # Zagoruyko and Komodakis: 36.5M
    del wrn
    keras.backend.clear_session()

    assert zoo.alexnet(num_classes=10, input_shape=(32, 32, 3)).count_params() == 37_323_146
    keras.backend.clear_session()
    original = zoo.alexnet(num_classes=1000, input_shape=(227, 227, 3))  # built, never run
    assert original.get_layer("conv1").kernel.shape == (11, 11, 3, 96)
    assert original.count_params() == 62_378_344


def test_vgg16_small_parameter_count_and_ibnn_noise_variables():
    # VGG16-small (Trinh et al. 2022, official models/vgg.py): VGG-16's 13 convolutions, then
    # dense 512 -> 512 -> 512 -> classes on the flattened 1x1x512 map of a 32x32 input.
    channels = [3] + [f for block in zoo.vgg.BLOCKS for f in block]  # 3, 64, 64, 128, ..., 512
    convs = sum(9 * c_in * c_out + c_out for c_in, c_out in zip(channels[:-1], channels[1:]))
    dense = (512 * 512 + 512) * 2 + 512 * NUM_CLASSES + NUM_CLASSES
    small = zoo.vgg16_small(num_classes=NUM_CLASSES)
    assert small.count_params() == convs + dense == 15_245_130  # "VGG16-small: ~15M parameters"
    assert convs == 14_714_688 and small.name == "vgg16_small_deterministic"
    assert small.get_config()["layers"] == zoo.build("vgg16", variant="small").get_config()["layers"]
    options = dict(num_components=4, prior_mean=1.0, prior_stddev=0.3, init_stddev=0.05, init_scale_mean=0.3,
                   init_scale_stddev=0.02)
    ibnn = zoo.build("vgg16_small", "ibnn", num_examples=N, **options)
    nodes = [layer.num_nodes for layer in tfbnn.ibnn.node_layers(ibnn)]
    # iBNN noise multiplies every layer's inputs: one variable per input channel of each convolution
    # (3, then the outputs of the first 12: 3,715) and per input feature of each dense layer (the
    # flattened 512-map into fc1, fc1's 512 into fc2, fc2's 512 into the head: 1,536).
    assert nodes == channels[:-1] + [512, 512, 512]
    assert sum(channels[:-1]) == 3_715 and sum(nodes) == 5_251  # the paper's count of noise variables
    layer = ibnn.get_layer("fc1")
    assert (layer.prior_mean, layer.prior_stddev, layer.init_stddev, layer.init_scale_mean) == (1.0, 0.3, 0.05, 0.3)


# -- ConvNeXt -------------------------------------------------------------------------------------

#: A two-stage ConvNeXt for 32x32x3 (patch 2: 16x16, then 8x8), stochastic depth on its second block.
TINY_CONVNEXT = {"input_shape": (32, 32, 3), "depths": (1, 1), "dims": (8, 16), "patch_size": 2,
                 "drop_path_rate": 0.2}
CONVNEXT_METHODS = [("deterministic", {}), ("mc_dropout", {}), ("vd", {}), ("ibnn", {})] + [
    ("bbb", {"estimator": e}) for e in zoo.ESTIMATORS]


@pytest.mark.parametrize("method, options", CONVNEXT_METHODS,
                         ids=[options.get("estimator", method) for method, options in CONVNEXT_METHODS])
def test_convnext_every_method_builds_predicts_saves_and_trains(method, options, tmp_path, eager):
    # Eager: tracing the graphs of a 2-stage net costs more than its arithmetic on 2 cores.
    x, y = _data(TINY_CONVNEXT)
    model = zoo.build("convnext", method, num_classes=NUM_CLASSES, num_examples=N, seed=7, **TINY_CONVNEXT,
                      **{**METHOD_OPTIONS[method], **options})
    assert tuple(model.output.shape) == (None, NUM_CLASSES) and model.name == f"convnext_{method}"
    _check_structure(model, method)
    weights = {l.name: type(l) for l in _sublayers(model) if isinstance(l, (BayesianLayer, *WEIGHT_LAYERS))}
    pointwise = [n for n in weights if "pointwise" in n]
    assert sorted(weights) == sorted(["stem_conv", "stage2_downsample_conv", "predictions", *pointwise])
    assert len(pointwise) == 4  # two per block
    # The 7x7 depthwise convolutions stay deterministic for every method (see tfbnn.models.convnext).
    depthwise = [l for l in _sublayers(model) if isinstance(l, keras.layers.DepthwiseConv2D)]
    assert [type(l) for l in depthwise] == [keras.layers.DepthwiseConv2D] * 2
    drop = model.get_layer("stage2_block1_stochastic_depth")
    assert drop.rate == pytest.approx(0.2) and "stage1_block1_stochastic_depth" not in weights  # rate 0: none
    if method in ("bbb", "vd", "ibnn"):
        expected = {"flipout": DenseFlipout, "reparameterization": DenseReparameterization,
                    "local_reparameterization": DenseLocalReparameterization}.get(options.get("estimator"))
        expected = expected or {"vd": DenseVariationalDropout, "ibnn": NodeDense}[method]
        assert {weights[n] for n in pointwise} == {expected}
    _check_predict(model, x)
    _check_save_load(model, x, str(tmp_path / "model.keras"))
    _check_train_step(model, x, y)


def test_convnext_graves_by_conversion_keeps_predictions(tmp_path, eager):
    x, _ = _data(TINY_CONVNEXT)
    det = _build("convnext", "deterministic", TINY_CONVNEXT)
    bnn = tfbnn.convert.to_bayesian(det, method="graves", init_scale=1e-7, num_examples=N, seed=1)
    kinds = {l.name: type(l).__name__ for l in tfbnn.bayesian_layers(bnn)}
    assert kinds["stem_conv"] == kinds["stage2_downsample_conv"] == "Conv2DFlipout"
    assert [k for n, k in kinds.items() if "pointwise" in n or n == "predictions"] == ["GravesDense"] * 5
    assert all(l.kernel_prior == tfbnn.priors.Normal(0.0, 1.0) for l in tfbnn.bayesian_layers(bnn))
    with tfbnn.posterior_mean(bnn):
        np.testing.assert_allclose(bnn(x), det(x), rtol=1e-4, atol=1e-5)
    _check_save_load(bnn, x, str(tmp_path / "graves.keras"))


def test_convnext_t_parameter_count():
    # Liu et al. 2022, Table 11: ConvNeXt-T, 28M parameters at 224x224 (torchvision: 28,589,128).
    depths, dims = zoo.CONVNEXT_CONFIGS["tiny"]["depths"], zoo.CONVNEXT_CONFIGS["tiny"]["dims"]
    block = lambda d: 49 * d + d + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d) + d  # dw, LN, pw1, pw2, scale
    down = lambda d_in, d: 2 * d_in + 4 * d_in * d + d  # LN, 2x2 conv
    count = (16 * 3 * dims[0] + dims[0] + 2 * dims[0]) + sum(n * block(d) for n, d in zip(depths, dims))
    count += sum(down(a, b) for a, b in zip(dims[:-1], dims[1:])) + 2 * dims[-1] + dims[-1] * 1000 + 1000
    model = zoo.build("convnext", num_classes=1000, input_shape=(224, 224, 3))
    assert model.count_params() == count == 28_589_128
    assert model.get_layer("stage4_block3_pointwise_conv_1").kernel.shape == (768, 3072)
    keras.backend.clear_session()


def test_convnext_layers_and_options():
    scale = zoo.LayerScale(0.5, name="s")
    assert keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(scale)).get_config() == \
        scale.get_config()
    np.testing.assert_allclose(scale(np.full((2, 3), 4.0, "float32")), 2.0)
    drop = zoo.StochasticDepth(0.25, seed=3)
    x = np.random.default_rng(0).random((400, 2, 2, 3)).astype("float32") + 1.0
    np.testing.assert_array_equal(drop(x), x)  # inference: the identity
    y = drop(x, training=True).numpy()
    kept = np.all(y == np.float32(1 / 0.75) * x, axis=(1, 2, 3))
    assert np.all(kept | np.all(y == 0, axis=(1, 2, 3)))  # per example: all kept (rescaled) or all dropped
    assert 0.68 < kept.mean() < 0.82  # 1 - rate = 0.75
    np.testing.assert_array_equal(y, zoo.StochasticDepth(0.25, seed=3)(x, training=True))  # seeded
    # Stochastic-depth seeds follow the method's layers, so no two stochastic layers share one.
    model = zoo.convnext("mc_dropout", seed=10, **{**TINY_CONVNEXT, "depths": (2, 1)})
    seeds = [l.seed for l in _sublayers(model) if isinstance(l, (StochasticLayer, zoo.StochasticDepth))]
    assert len(seeds) == len(set(seeds)) == 3 + 2  # 3 MC dropouts, 2 drop paths (the first block has rate 0)
    rates = [l.rate for l in _sublayers(model) if isinstance(l, zoo.StochasticDepth)]
    np.testing.assert_allclose(rates, [0.1, 0.2])  # linear in the block index: 0, 0.1, 0.2
    plain = zoo.convnext(layer_scale_init=0, **{**TINY_CONVNEXT, "drop_path_rate": 0.0})
    assert not [l for l in _sublayers(plain) if isinstance(l, (zoo.LayerScale, zoo.StochasticDepth))]


# -- the method factory ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, conv_cls, dense_cls",
    [
        ({"estimator": "flipout"}, Conv2DFlipout, DenseFlipout),
        ({"estimator": "reparameterization"}, Conv2DReparameterization, DenseReparameterization),
        ({"estimator": "local_reparameterization"}, Conv2DFlipout, DenseLocalReparameterization),
    ],
)
def test_bbb_estimators_choose_the_layers(options, conv_cls, dense_cls):
    model = zoo.lenet5("bbb", num_examples=N, **options)
    layers = _sublayers(model)
    assert [type(l) for l in layers if isinstance(l, BayesianLayer)] == [conv_cls] * 2 + [dense_cls] * 3


def test_bbb_prior_by_name_and_object():
    model = zoo.mlp("bbb", hidden_units=(8,), input_shape=(4,), num_examples=N, prior="scale_mixture")
    assert all(type(l.kernel_prior).__name__ == "ScaleMixture" for l in tfbnn.bayesian_layers(model))
    prior = tfbnn.priors.Normal(0.0, 0.5)
    model = zoo.mlp("bbb", hidden_units=(8,), input_shape=(4,), num_examples=N, prior=prior)
    assert all(l.kernel_prior is prior and l.bias_prior is prior for l in tfbnn.bayesian_layers(model))


def test_vd_ibnn_and_mc_dropout_layers_and_options():
    vd = zoo.lenet5("vd", num_examples=N, parameterization="multiplicative")
    vd_layers = tfbnn.bayesian_layers(vd)
    assert [type(l) for l in vd_layers] == [Conv2DVariationalDropout] * 2 + [DenseVariationalDropout] * 3
    assert all(l.parameterization == "multiplicative" for l in vd_layers)
    options = dict(num_components=3, prior_mean=0.9, prior_stddev=0.2, init_mean=1.1, init_stddev=0.0,
                   init_scale_mean=0.25, init_scale_stddev=0.0)
    ibnn = zoo.lenet5("ibnn", num_examples=N, **options)
    ibnn_layers = tfbnn.bayesian_layers(ibnn)
    assert [type(l) for l in ibnn_layers] == [NodeConv2D] * 2 + [NodeDense] * 3
    assert all({k: getattr(l, k) for k in options} == options for l in ibnn_layers)
    head = ibnn.get_layer("predictions")  # the initial means and scales the options asked for
    np.testing.assert_array_equal(head.node_loc.numpy(), np.float32(1.1))
    np.testing.assert_allclose(head.node_scale().numpy(), 0.25, rtol=1e-6)
    mc = zoo.lenet5("mc_dropout", rate=0.3)
    kinds = [type(l) for l in tfbnn.stochastic_layers(mc)]
    assert kinds == [MCSpatialDropout2D] * 2 + [MCDropout] * 2
    assert all(l.rate == 0.3 for l in tfbnn.stochastic_layers(mc))


def test_seeds_are_derived_and_distinct():
    model = zoo.lenet5("bbb", num_examples=N, seed=10)
    assert [l.seed for l in tfbnn.bayesian_layers(model)] == [11, 12, 13, 14, 15]
    unseeded = zoo.lenet5("bbb", num_examples=N)
    assert all(l.seed is None for l in tfbnn.bayesian_layers(unseeded))


def test_batch_norm_stays_deterministic():
    # A CIFAR-stem ResNet-50 is only built here (symbolically), never run.
    model = zoo.resnet50("bbb", num_examples=N, stem="cifar")
    layers = _sublayers(model)
    bns = [l for l in layers if isinstance(l, keras.layers.BatchNormalization)]
    convs = [l for l in layers if isinstance(l, Conv2DFlipout)]
    assert len(bns) == 53 and len(convs) == 53  # stem, 16 blocks x 3, 4 projection shortcuts
    assert not any(isinstance(l, StochasticLayer) for l in bns)


def test_layer_factory_can_be_passed_instead_of_a_name():
    factory = zoo.LayerFactory("bbb", {"estimator": "reparameterization"}, num_examples=N, seed=0)
    model = zoo.lenet5(factory)
    assert isinstance(tfbnn.bayesian_layers(model)[0], Conv2DReparameterization)
    with pytest.raises(ValueError, match="either a LayerFactory or a method name"):
        zoo.lenet5(factory, num_examples=N)


def test_build_matches_the_named_builders_and_presets():
    a = zoo.build("lenet5", method="mc_dropout", rate=0.2, seed=3)
    b = zoo.lenet5("mc_dropout", rate=0.2, seed=3)
    assert a.get_config()["layers"] == b.get_config()["layers"]
    preset = zoo.build("lenet_300_100", method="bbb", num_examples=N, input_shape=(784,))
    assert preset.name == "lenet_300_100_bbb"
    assert [l.units for l in tfbnn.bayesian_layers(preset)] == [300, 100, 10]
    assert zoo.mlp(hidden_units="mlp_800", input_shape=(784,)).count_params() == 636_010


# -- the transformer ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, stochastic",
    [("deterministic", []), ("mc_dropout", ["ff1_mc_dropout"]), ("bbb", ["ff1", "ff2", "predictions"]),
     ("vd", ["ff1", "ff2", "predictions"]), ("ibnn", ["ff1", "ff2", "predictions"])],
)
def test_transformer_encoder_stays_deterministic(method, stochastic):
    model = _build("transformer", method, TINY_TRANSFORMER)
    assert [l.name for l in tfbnn.stochastic_layers(model)] == stochastic
    assert model.input.dtype == "int32" and tuple(model.input.shape) == (None, TINY_TRANSFORMER["max_length"])
    assert type(model.get_layer("attention")) is keras.layers.MultiHeadAttention
    assert type(model.get_layer("embedding")) is zoo.TokenAndPositionEmbedding


def test_transformer_parameter_count():
    v, length, e, h, f, c = 20_000, 120, 32, 2, 32, 2  # the IMDB experiment's model
    embedding = v * e + length * e
    attention = 3 * (e * h * e + h * e) + h * e * e + e  # query, key, value (key_dim = e); output
    norms = 2 * 2 * e
    feed_forward = (e * f + f) + (f * e + e)
    head = e * c + c
    model = zoo.transformer(vocab_size=v, max_length=length, embed_dim=e, num_heads=h, ff_dim=f, num_classes=c)
    assert model.count_params() == embedding + attention + norms + feed_forward + head == 654_562


def test_token_and_position_embedding_config_and_shapes():
    layer = zoo.TokenAndPositionEmbedding(vocab_size=10, max_length=5, embed_dim=3, name="emb")
    config = layer.get_config()
    assert zoo.TokenAndPositionEmbedding.from_config(config).get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is zoo.TokenAndPositionEmbedding and restored.get_config() == config
    y = layer(np.array([[1, 2, 3], [4, 5, 6]], "int32"))  # shorter than max_length
    assert tuple(y.shape) == (2, 3, 3) == layer.compute_output_shape((2, 3))
    np.testing.assert_allclose(y[0, 1], layer.token.embeddings[2] + layer.position.embeddings[1])


# -- bayesian_layers="last": a deterministic body and a Bayesian head -----------------------------

#: name -> (builder arguments of a small net, its weight layers before the head)
LAST = {
    "mlp": ({"hidden_units": (8, 8), "input_shape": (4,)}, 2),
    "lenet5": ({"input_shape": (8, 8, 1), "padding": "same"}, 4),
    "transformer": (TINY_TRANSFORMER, 2),
    "alexnet": ({"input_shape": (8, 8, 3)}, 7),
    "resnet50": ({"input_shape": (8, 8, 3), "stem": "cifar"}, 53),
    "vgg16": ({"input_shape": (32, 32, 3)}, 15),
    "wide_resnet28_10": ({"input_shape": (8, 8, 3)}, 28),
    "convnext": ({"input_shape": (8, 8, 3), "depths": (1, 1), "dims": (4, 8), "patch_size": 1}, 6),
}


def _check_last_layer_bayesian(name, method, shape, num_body):
    seed = 7
    model = _build(name, method, shape, seed=seed, bayesian_layers="last")
    head = model.get_layer("predictions")
    body = [l for l in _sublayers(model) if isinstance(l, WEIGHT_LAYERS) and l is not head]
    assert len(body) == num_body and all(type(l) in WEIGHT_LAYERS for l in body)
    stochastic = tfbnn.stochastic_layers(model)
    if method == "mc_dropout":
        # Dropout only in front of a deterministic head.
        assert type(head) is keras.layers.Dense and not tfbnn.bayesian_layers(model)
        assert [(type(l), l.name, l.seed) for l in stochastic] == [(MCDropout, "predictions_dropout", seed + 1)]
        return
    assert tfbnn.bayesian_layers(model) == [head] and stochastic == [head]
    assert head.seed == seed + 1 and float(head.kl_weight.numpy()) == pytest.approx(1.0 / N)
    np.testing.assert_allclose(tfbnn.kl_divergence(model), head.kl_divergence(), rtol=1e-6)
    x, _ = _data(shape)
    model(x, training=True)
    (loss,) = model.losses  # the objective's KL term is the head's
    np.testing.assert_allclose(loss, head.kl_weight * head.kl_divergence(), rtol=1e-5)


@pytest.mark.parametrize("method", ["mc_dropout", "bbb", "vd", "ibnn"])
@pytest.mark.parametrize("name", list(LAST))
def test_last_layer_bayesian(name, method):
    shape, num_body = LAST[name]
    _check_last_layer_bayesian(name, method, shape, num_body)


def test_last_layer_bayesian_deterministic_is_unchanged_and_factory_carries_it():
    shape = {"hidden_units": (8,), "input_shape": (4,)}
    assert (_build("mlp", "deterministic", shape, bayesian_layers="last").get_config()["layers"]
            == _build("mlp", "deterministic", shape).get_config()["layers"])
    factory = zoo.LayerFactory("vd", num_examples=N, bayesian_layers="last")
    assert [l.name for l in tfbnn.bayesian_layers(zoo.mlp(factory, **shape))] == ["predictions"]
    with pytest.raises(ValueError, match=r"Received: method=.* with \{'bayesian_layers': 'last'\}"):
        zoo.mlp(zoo.LayerFactory("vd", num_examples=N), bayesian_layers="last", **shape)


@pytest.mark.parametrize("value", ["first", None, True])
@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_bad_bayesian_layers_are_rejected_clearly(name, value):
    shape = {"vocab_size": 20} if name in zoo.TEXT_MODELS else {}
    message = re.escape(f"Expected `bayesian_layers` to be one of ['all', 'last']. Received: bayesian_layers={value!r}")
    with pytest.raises(ValueError, match=message):
        zoo.build(name, method="vd", num_examples=N, bayesian_layers=value, **shape)
    with pytest.raises(ValueError, match=message):
        zoo.LayerFactory("bbb", num_examples=N, bayesian_layers=value)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: zoo.build("xyz"), r"Expected one of \['mlp', 'lenet5', .*\]. Received: model='xyz'"),
        (lambda: zoo.build("lenet5", method="xyz"), r"Expected one of \['deterministic', .*\]. Received: method='xyz'"),
        (lambda: zoo.lenet5("bbb"), r"num_examples.*Received: num_examples=None"),
        (lambda: zoo.lenet5("vd", num_examples=0), r"Received: num_examples=0"),
        (lambda: zoo.lenet5("ibnn", num_examples=-5), r"Received: num_examples=-5"),
        (lambda: zoo.lenet5("bbb", num_examples=10.5), r"Received: num_examples=10.5"),
        (lambda: zoo.lenet5("bbb", num_examples=N, rate=0.5), r"Unknown option for method='bbb'.*Received: rate=0.5"),
        (lambda: zoo.lenet5("deterministic", num_clases=3), r"Received: num_clases=3"),
        (lambda: zoo.lenet5("bbb", num_examples=N, estimator="xyz"), r"Received: estimator='xyz'"),
        (lambda: zoo.lenet5("bbb", num_examples=N, prior="xyz"), r"Received: prior='xyz'"),
        (lambda: zoo.lenet5("vd", num_examples=N, parameterization="xyz"), r"Received: parameterization='xyz'"),
        (lambda: zoo.lenet5("ibnn", num_examples=N, num_components=0), r"Received: num_components=0"),
        (lambda: zoo.lenet5("ibnn", num_examples=N, prior_mean=float("nan")), r"Received: prior_mean=nan"),
        (lambda: zoo.lenet5("ibnn", num_examples=N, prior_stddev=0), r"Received: prior_stddev=0"),
        (lambda: zoo.lenet5("ibnn", num_examples=N, init_scale_mean=-0.1), r"Received: init_scale_mean=-0.1"),
        (lambda: zoo.lenet5("ibnn", num_examples=N, init_scale_stddev="a"), r"Received: init_scale_stddev='a'"),
        (lambda: zoo.vgg16(variant="tiny"), r"Expected `variant` in \['imagenet', 'small'\]. Received: variant='tiny'"),
        (lambda: zoo.vgg16_small(variant="small"), r"vgg16_small fixes `variant`"),
        (lambda: zoo.build("transformer"), r"needs `vocab_size`.*Received: vocab_size=None"),
        (lambda: zoo.convnext(depths=(3, 0)), r"Received: depths=\(3, 0\)"),
        (lambda: zoo.convnext(depths=(1, 1), dims=(8,)), r"one width per stage.*Received: dims=\(8,\)"),
        (lambda: zoo.convnext(patch_size=0), r"Received: patch_size=0"),
        (lambda: zoo.convnext(drop_path_rate=1.0), r"Received: drop_path_rate=1.0"),
        (lambda: zoo.convnext(input_shape=(16, 16, 3)), r"convnext \(patch_size=4, 4 stages\) needs images of at least 32x32"),
        (lambda: zoo.StochasticDepth(-0.1), r"Received: rate=-0.1"),
        (lambda: zoo.lenet5("mc_dropout", rate=1.0), r"Received: rate=1.0"),
        (lambda: zoo.lenet5(seed=-1), r"Received: seed=-1"),
        (lambda: zoo.lenet5(num_classes=1), r"Received: num_classes=1"),
        (lambda: zoo.lenet5(input_shape=(784,)), r"lenet5 expects `input_shape` \(height, width, channels\)"),
        (lambda: zoo.lenet5(input_shape=(8, 8, 1)), r"at least 16x16.*Received: input_shape=\(8, 8, 1\)"),
        (lambda: zoo.lenet5(input_shape=(32, 0, 3)), r"Received: input_shape=\(32, 0, 3\)"),
        (lambda: zoo.lenet5(padding="causal"), r"Received: padding='causal'"),
        (lambda: zoo.vgg16(input_shape=(16, 16, 3)), r"vgg16 needs images of at least 32x32"),
        (lambda: zoo.resnet50(stem="xyz"), r"Received: stem='xyz'"),
        (lambda: zoo.alexnet(layout="xyz"), r"Received: layout='xyz'"),
        (lambda: zoo.mlp(hidden_units="xyz"), r"Unknown MLP preset.*Received: hidden_units='xyz'"),
        (lambda: zoo.mlp(hidden_units=(10, 0)), r"Received: hidden_units=\(10, 0\)"),
        (lambda: zoo.build("lenet_300_100", hidden_units=(5,)), r"preset 'lenet_300_100' fixes \['hidden_units'\]"),
        (lambda: zoo.wide_resnet28_10(depth=16), r"wide_resnet28_10 fixes `depth`"),
        (lambda: zoo.wide_resnet(depth=27), r"Received: depth=27"),
        (lambda: zoo.transformer(vocab_size=0), r"Expected `vocab_size` to be a positive integer. Received: vocab_size=0"),
        (lambda: zoo.transformer(vocab_size=9, num_heads=2.0), r"Received: num_heads=2.0"),
        (lambda: zoo.transformer(vocab_size=9, dropout=1.0), r"Expected `dropout` in \[0, 1\). Received: dropout=1.0"),
        (lambda: zoo.transformer("bbb", vocab_size=9), r"Received: num_examples=None"),
        (lambda: zoo.TokenAndPositionEmbedding(10, 0, 3), r"Received: max_length=0"),
    ],
)
def test_bad_arguments_are_rejected_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("method", ["deterministic", "mc_dropout", "bbb"])
def test_numpy_num_classes_is_accepted_as_keras_accepts_it(method):
    model = zoo.build("mlp", method, hidden_units=(4,), num_classes=np.int64(3), input_shape=(5,), num_examples=N)
    assert tuple(model.output.shape) == (None, 3)
    with pytest.raises(ValueError, match="num_classes=True"):
        zoo.build("mlp", method, hidden_units=(4,), num_classes=True, input_shape=(5,), num_examples=N)


def test_small_inputs_with_same_padding():
    model = zoo.lenet5(input_shape=(8, 8, 1), padding="same", activation="relu")
    assert tuple(model(np.zeros((3, 8, 8, 1), "float32")).shape) == (3, 10)


def test_lenet5_width_kernel_and_pooling_options():
    base = zoo.lenet5("deterministic", input_shape=(8, 8, 1), padding="same", kernel_size=3, pooling="max",
                         activation="relu")
    wide = zoo.lenet5("deterministic", input_shape=(8, 8, 1), padding="same", kernel_size=3, pooling="max",
                         activation="relu", width_multiplier=2)
    # Hand count at 8x8x1, 3x3 'same' convolutions, two 2x2 poolings (8 -> 4 -> 2), widths (6, 16, 120, 84) x w.
    def count(w):
        c1, c2, f1, f2 = 6 * w, 16 * w, 120 * w, 84 * w
        return (9 * 1 * c1 + c1) + (9 * c1 * c2 + c2) + (2 * 2 * c2 * f1 + f1) + (f1 * f2 + f2) + (f2 * 10 + 10)
    assert base.count_params() == count(1) and wide.count_params() == count(2)
    assert isinstance(wide.get_layer("pool1"), keras.layers.MaxPooling2D)
    for kwargs, needle in (({"width_multiplier": 0}, "width_multiplier=0"), ({"kernel_size": 2.5}, "kernel_size=2.5"),
                           ({"pooling": "min"}, "pooling='min'")):
        with pytest.raises(ValueError, match=needle):
            zoo.lenet5("deterministic", **kwargs)


def test_mlp_regression_head_and_input_normalization():
    model = zoo.mlp("bbb", hidden_units=(8,), input_shape=(1,), outputs=2, normalization=(3.0, 4.0),
                       num_examples=10, seed=0)
    assert model.output_shape == (None, 2)
    head = model.get_layer("predictions")
    assert head.activation is keras.activations.linear and isinstance(head, tfbnn.layers.BayesianLayer)
    norm = model.get_layer("standardize")
    np.testing.assert_allclose(norm(np.array([[5.0]], "float32")), [[1.0]], rtol=1e-6)  # (5 - 3) / sqrt(4)
    with pytest.raises(ValueError, match="outputs=0"):
        zoo.mlp("deterministic", outputs=0)


def test_input_options_fit_a_model_to_small_images():
    """What training.run builds for small images, as data on each model (SMALL_IMAGE_OPTIONS)."""
    assert zoo.input_options("lenet5", (8, 8, 1)) == {"padding": "same"}
    assert zoo.input_options("lenet5", (16, 16, 1)) == {}
    assert zoo.input_options("resnet50", (28, 28, 1)) == {"stem": "cifar"}
    assert zoo.input_options("resnet50", (32, 32, 3)) == {}
    assert zoo.input_options("convnext", (16, 16, 3)) == {"patch_size": 2}
    assert zoo.input_options("convnext", (4, 4, 3)) == {"patch_size": 1}
    assert zoo.input_options("mlp", (8, 8, 1)) == {} and zoo.input_options("lenet5", (64,)) == {}
    assert set(zoo.SMALL_IMAGE_OPTIONS) <= set(zoo.MODELS)
