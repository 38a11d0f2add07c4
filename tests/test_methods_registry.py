"""The method registry (tfbnn.methods): one Method per method, asked by the zoo, the recipes,
training.run, convert and `tfbnn train`.

The acceptance test of "adding a method touches one module": a toy method registered here (and
unregistered after) is built by the zoo, accepted by Recipe, trained by training.run, converted
to by convert.to_bayesian and offered by `tfbnn train`, with no other module changed.
"""

import os

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import cli, convert, methods, models, training
from tfbnn.cli import train as train_command
from tfbnn.training import recipe as recipe_module


# -- the old tuples are the registry's --------------------------------------------------------------
def test_the_derived_tuples_equal_the_registry():
    assert models.ZOO_METHODS == methods.names(zoo=True) == ("deterministic", "mc_dropout", "bbb", "vd", "ibnn",
                                                              "sngp")
    assert models.BAYESIAN_METHODS == methods.names(zoo=True, bayesian=True) == ("bbb", "vd", "ibnn")
    assert training.RECIPE_METHODS == methods.names() == (
        "deterministic", "mc_dropout", "bbb", "vd", "ibnn", "graves", "ensemble", "sngp")
    assert recipe_module.MEMBER_METHODS == models.ZOO_METHODS
    assert recipe_module.DEFAULT_MEMBERS == 5
    assert models.ESTIMATORS == methods.ESTIMATORS == ("flipout", "reparameterization", "local_reparameterization")
    assert models.METHOD_OPTIONS == {name: dict(methods.get(name).options) for name in models.ZOO_METHODS}
    assert models.METHOD_OPTIONS["ibnn"]["num_components"] == 4 and models.METHOD_OPTIONS["mc_dropout"] == {"rate": 0.1}
    assert models.ENSEMBLES == {"batch_ensemble": ("deterministic", "mc_dropout"), "rank1": ("bbb",)}
    assert set(convert.CONVERSION_METHODS) == {"vd", "vd_additive", "molchanov", "vd_multiplicative", "kingma",
                                               "graves", "flipout", "reparameterization", "local_reparameterization"}
    assert convert.CONVERSION_METHODS == methods.conversion_names()
    assert methods.names(bayesian=True) == ("bbb", "vd", "ibnn", "graves")
    assert methods.names(build="convert") == ("graves",) and methods.names(build="ensemble") == ("ensemble",)
    assert methods.names(convertible=True) == ("bbb", "vd", "graves")


def test_the_command_s_method_flags_are_the_registry_s():
    assert train_command.METHOD_FLAGS == {
        "dropout_rate": ("mc_dropout",), "layer": ("bbb",), "prior": ("bbb",), "pi": ("bbb",), "sigma1": ("bbb",),
        "sigma2": ("bbb",), "parameterization": ("vd",), "num_components": ("ibnn",), "members": ("ensemble",),
        "member_method": ("ensemble",)}
    text = cli.build_parser().parse_args(["train"])  # parses: every flag added once
    assert text.method == "bbb"


def test_the_built_in_methods_say_what_each_part_needs():
    bbb, vd, ibnn, graves = (methods.get(n) for n in ("bbb", "vd", "ibnn", "graves"))
    assert bbb.layer_class("dense", {"estimator": "local_reparameterization"}) == "DenseLocalReparameterization"
    assert bbb.layer_class("conv2d", {"estimator": "local_reparameterization"}) == "Conv2DFlipout"
    assert vd.conversion_name({"parameterization": "multiplicative"}) == "vd_multiplicative"
    assert bbb.conversion_name({}) == "flipout" and graves.conversion_name({}) == "graves"
    assert methods.get("deterministic").layer_class("dense", {}) is None  # Keras' own layer
    with pytest.raises(ValueError, match="has no lstm layer"):
        vd.layer_class("lstm", {})
    assert ibnn.samples_phrase == "noise samples per example" and bbb.display_name == "BbB"
    assert bbb.uses_xla({"estimator": "local_reparameterization"}) and not bbb.uses_xla({"estimator": "flipout"})
    assert not methods.get("deterministic").stochastic and methods.get("mc_dropout").stochastic
    assert methods.method_of_conversion("kingma")[0] is vd
    assert methods.layer_class("NodeDense") is tfbnn.layers.NodeDense
    assert methods.layer_class(tfbnn.layers.MCDropout) is tfbnn.layers.MCDropout and methods.layer_class(None) is None
    with pytest.raises(ValueError, match="Expected the name of a tfbnn.layers class or a layer class"):
        methods.layer_class("NoSuchLayer")


# -- unknown names ------------------------------------------------------------------------------------
def test_an_unknown_method_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown method\. Expected one of \['deterministic', 'mc_dropout', "
                                         r"'bbb', 'vd', 'ibnn', 'graves', 'ensemble', 'sngp'\]\. "
                                         r"Received: method='nope'"):
        methods.get("nope")
    with pytest.raises(ValueError, match=r"Expected one of \['deterministic', .*'ibnn', 'sngp'\]\. Received: method='graves'"):
        models.build("mlp", method="graves")  # a recipe-level method, not the zoo's
    with pytest.raises(ValueError, match=r"recipe field `method` to be one of \[.*'ensemble', 'sngp'\]"):
        training.Recipe(method="nope")
    with pytest.raises(ValueError, match=r"Unknown conversion method\. Expected one of \[.*'kingma'.*\]"):
        convert.to_bayesian(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), method="bbb")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "--method", "nope"])


def test_register_refuses_a_clash_and_keeps_the_built_in_methods():
    with pytest.raises(ValueError, match="registered already"):
        methods.register(methods.Method("bbb", "again"))
    with pytest.raises(ValueError, match="Expected a tfbnn.methods.Method"):
        methods.register("bbb")
    with pytest.raises(ValueError, match=r"\['flipout'\] belong to method 'bbb'"):
        methods.register(methods.Method("other", "x", bayesian=True,
                                        conversions={"flipout": methods.Conversion("DenseFlipout")}))
    assert "other" not in methods.names()
    with pytest.raises(ValueError, match="built-in methods stay registered"):
        methods.unregister("vd")
    with pytest.raises(ValueError, match="Expected `build` in"):
        methods.Method("x", "x", build="nowhere")
    with pytest.raises(ValueError, match="identifier"):
        methods.Method("two words", "x")


# -- a new method, registered in one place ----------------------------------------------------------------
def _toy_flags(values):
    return {"prior_scale": values["toy_scale"] if values.get("toy_scale") is not None else 0.5}


def _toy_check(options):
    scale = options["prior_scale"]
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise ValueError(f"Expected `prior_scale` to be a positive number. Received: prior_scale={scale!r}")
    return {**options, "prior_scale": float(scale)}


def _toy_layer_kwargs(options):
    prior = tfbnn.priors.Normal(0.0, options["prior_scale"])
    return {"kernel_prior": prior, "bias_prior": prior}


TOY = methods.Method(
    name="toy",
    description="Bayes by Backprop with a N(0, s^2) prior",
    bayesian=True,
    options={"prior_scale": 0.5},
    check_options=_toy_check,
    layers={"dense": "DenseReparameterization", "conv2d": "Conv2DReparameterization"},
    layer_kwargs=_toy_layer_kwargs,
    conversions={"toy_reparameterization": methods.Conversion(
        "DenseReparameterization", "Conv2DReparameterization", {"kernel_prior": methods.PRIOR, "bias_prior": None},
        {"kernel_prior": methods.PRIOR, "bias_prior": None})},
    label="Toy",
    flags=(methods.Flag("toy_scale", "toy only: the prior's scale s (default: 0.5)", type=float),),
    options_from_flags=_toy_flags,
)


@pytest.fixture
def toy():
    methods.register(TOY)
    try:
        yield TOY
    finally:
        methods.unregister("toy")
    assert "toy" not in methods.names()


def test_a_registered_method_is_built_by_the_zoo(toy):
    model = models.build("mlp", method="toy", hidden_units=(8,), input_shape=(4,), num_classes=3, num_examples=100,
                         prior_scale=0.25, seed=0)
    layers = tfbnn.bayesian_layers(model)
    assert [type(layer).__name__ for layer in layers] == ["DenseReparameterization"] * 2
    assert all(layer.kernel_prior.scale == 0.25 and layer.get_config()["kl_weight"] == 0.01 for layer in layers)
    conv = models.build("lenet5", method="toy", input_shape=(16, 16, 1), num_examples=10, seed=0)
    assert "Conv2DReparameterization" in {type(layer).__name__ for layer in tfbnn.bayesian_layers(conv)}
    assert "toy" in methods.names(zoo=True, bayesian=True)
    with pytest.raises(ValueError, match=r"Unknown option for method='toy'\. Expected one of \['prior_scale'\]"):
        models.build("mlp", method="toy", num_examples=10, rate=0.1)
    with pytest.raises(ValueError, match="prior_scale"):
        models.build("mlp", method="toy", num_examples=10, prior_scale=-1.0)
    with pytest.raises(ValueError, match="num_examples"):
        models.build("mlp", method="toy")  # Bayesian: N is required


def test_a_registered_method_is_a_recipe_method_and_trains_through_run(toy, tmp_path):
    recipe = training.Recipe(name="toy-digits", model="mlp", model_options={"hidden_units": (16,)}, method="toy",
                             method_options={"prior_scale": 0.3}, dataset="digits", epochs=1).quick()
    assert recipe.is_bayesian and recipe.member_method == "toy"
    assert recipe.replace(train_samples=2).train_samples == 2  # stochastic: several samples per step allowed
    with pytest.raises(ValueError, match="variational_learning_rate"):
        recipe.replace(variational_learning_rate=0.1)
    ensemble = training.Recipe(method="ensemble", method_options={"members": 2, "member_method": "toy"})
    assert ensemble.member_recipe(1).method == "toy"
    result = training.run(recipe, output_dir=str(tmp_path / "out"), verbose=0, quiet=True, jit_compile=False)
    layers = tfbnn.bayesian_layers(result.model)
    assert [type(layer).__name__ for layer in layers] == ["DenseReparameterization"] * 2
    assert layers[0].kernel_prior.scale == pytest.approx(0.3)
    assert 0.0 <= result.test["accuracy"] <= 1.0 and result.test["kl"] > 0
    assert "Toy beta=" in training.results_table(result)
    assert sorted(os.listdir(tmp_path / "out"))[0] == "history.csv"


def test_a_registered_method_is_a_conversion_target(toy):
    det = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    bnn = convert.to_bayesian(det, method="toy_reparameterization", prior=tfbnn.priors.Normal(0.0, 2.0), seed=0)
    assert [type(layer).__name__ for layer in bnn.layers] == ["DenseReparameterization"] * 2
    assert bnn.layers[0].kernel_prior.scale == 2.0
    np.testing.assert_allclose(bnn.layers[0].kernel_loc.numpy(), det.layers[0].kernel.numpy())
    pretrained = training.Recipe(method="toy", pretrain_epochs=1)  # convertible: it may be pre-trained
    assert pretrained.pretrain_epochs == 1
    assert methods.get("toy").conversion_name({}) == "toy_reparameterization"


def test_a_registered_method_is_offered_by_tfbnn_train(toy):
    parser = cli.build_parser()
    recipe = train_command.recipe_from_args(parser.parse_args(["train", "--method", "toy", "--toy-scale", "0.2"]))
    assert (recipe.method, recipe.method_options) == ("toy", {"prior_scale": 0.2})
    assert train_command.recipe_from_args(parser.parse_args(["train", "--method", "toy"])).method_options == {
        "prior_scale": 0.5}
    with pytest.raises(ValueError, match=r"--toy-scale \(toy only\)"):
        train_command.recipe_from_args(parser.parse_args(["train", "--method", "bbb", "--toy-scale", "0.2"]))
    # argparse wraps the help where the methods registered before it put the line ends
    help_text = " ".join(parser._subparsers._group_actions[0].choices["train"].format_help().split())
    assert "toy (Bayes by Backprop with a N(0, s^2) prior)" in help_text and "--toy-scale" in help_text


def test_a_method_without_conversion_cannot_be_pretrained():
    with pytest.raises(ValueError, match=r"applies to methods 'bbb', 'vd', 'graves' and 'deterministic'"):
        training.Recipe(method="ibnn", pretrain_epochs=1)


def test_the_registry_loads_no_tensorflow():
    """Recipes and the command's parsers read it before TensorFlow starts."""
    import subprocess
    import sys

    code = ("import sys, _tfbnn_command, tfbnn.methods as m; m.get('bbb').layer_class('dense', "
            "{'estimator': 'flipout'}); print(sorted(x for x in ('tensorflow', 'keras', 'numpy') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
