"""The model zoo: every (model, method) pair builds, trains a step, saves, predicts.

Lean by design (CI on 2 cores): batch 2, 32x32x3 images (784-vectors for the MLP),
SGD (no optimizer slots), ``tfbnn.predict`` with T = 2.

* Light models (mlp, lenet5): every method in graph mode (the compiled train step
  and the compiled Monte Carlo sampler), each with a ``.keras`` round trip.
* Heavy models (alexnet, resnet50, vgg16, wide_resnet28_10; 23-37M parameters, twice
  that for bbb / vd): every method builds, predicts and takes a step, with TF
  functions run eagerly (tracing and optimizing the graphs of these nets, not the
  arithmetic, costs minutes on 2 cores); the ``.keras`` round trip runs once per
  family, with a different method for each (:data:`HEAVY_SAVE_LOAD`), so every
  non-deterministic method is saved and loaded inside a big net once.

Order inside a pair: predict and save/load on the freshly built model, then the
train step. A step on a batch of 2 makes the batch-norm statistics of ResNet-50's
1x1 last stage degenerate (two values per channel), so the moving statistics can make
the *next* inference overflow; that says nothing about the zoo.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

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
LIGHT = {"mlp": (784,), "lenet5": (32, 32, 3)}
HEAVY = {"alexnet": (32, 32, 3), "resnet50": (32, 32, 3), "vgg16": (32, 32, 3), "wide_resnet28_10": (32, 32, 3)}
#: The one method whose .keras round trip each heavy family runs.
HEAVY_SAVE_LOAD = {"alexnet": "mc_dropout", "resnet50": "bbb", "vgg16": "vd", "wide_resnet28_10": "ibnn"}
WEIGHT_LAYERS = (keras.layers.Dense, keras.layers.Conv2D)


def _data(input_shape):
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, *input_shape)).astype("float32")
    y = np.arange(BATCH, dtype="int32") % NUM_CLASSES
    return x, y


def _build(name, method, input_shape, seed=7):
    return zoo.build(name, method=method, num_classes=NUM_CLASSES, input_shape=input_shape,
                     num_examples=N, seed=seed, **METHOD_OPTIONS[method])


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


def _check_pair(name, method, input_shape, save_path):
    x, y = _data(input_shape)
    model = _build(name, method, input_shape)
    assert tuple(model.output.shape) == (None, NUM_CLASSES)
    _check_structure(model, method)
    _check_predict(model, x)
    if save_path is not None:
        _check_save_load(model, x, save_path)
    _check_train_step(model, x, y)


@pytest.fixture
def eager():
    tf.config.run_functions_eagerly(True)
    try:
        yield
    finally:
        tf.config.run_functions_eagerly(False)


# -- every (model, method) pair -------------------------------------------------------


@pytest.mark.parametrize("method", zoo.METHODS)
@pytest.mark.parametrize("name", list(LIGHT))
def test_light_model_method_pair(name, method, tmp_path):
    _check_pair(name, method, LIGHT[name], str(tmp_path / "model.keras"))


@pytest.mark.heavy
@pytest.mark.parametrize("method", zoo.METHODS)
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
    ibnn = zoo.lenet5("ibnn", num_examples=N, num_components=3, prior_stddev=0.2)
    ibnn_layers = tfbnn.bayesian_layers(ibnn)
    assert [type(l) for l in ibnn_layers] == [NodeConv2D] * 2 + [NodeDense] * 3
    assert all(l.num_components == 3 and l.prior_stddev == 0.2 for l in ibnn_layers)
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
