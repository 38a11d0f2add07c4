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
                                                              "sngp", "ddu", "evidential", "heteroscedastic",
                                                              "csgmcmc")
    assert models.BAYESIAN_METHODS == methods.names(zoo=True, bayesian=True) == ("bbb", "vd", "ibnn")
    assert training.RECIPE_METHODS == methods.names() == (
        "deterministic", "mc_dropout", "bbb", "vd", "ibnn", "graves", "ensemble", "sngp", "ddu", "evidential",
        "heteroscedastic", "blob", "csgmcmc")
    assert recipe_module.MEMBER_METHODS == models.ZOO_METHODS
    assert recipe_module.DEFAULT_MEMBERS == 5
    assert models.ESTIMATORS == methods.ESTIMATORS == ("flipout", "reparameterization", "local_reparameterization")
    assert models.METHOD_OPTIONS == {name: dict(methods.get(name).options) for name in models.ZOO_METHODS}
    assert models.METHOD_OPTIONS["ibnn"]["num_components"] == 4 and models.METHOD_OPTIONS["mc_dropout"] == {"rate": 0.1}
    assert models.ENSEMBLES == {"batch_ensemble": ("deterministic", "mc_dropout"), "rank1": ("bbb",)}
    assert set(convert.CONVERSION_METHODS) == {"vd", "vd_additive", "molchanov", "vd_multiplicative", "kingma",
                                               "graves", "flipout", "reparameterization", "local_reparameterization"}
    assert convert.CONVERSION_METHODS == methods.conversion_names()
    assert methods.names(bayesian=True) == ("bbb", "vd", "ibnn", "graves", "blob")
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
    assert not bbb.uses_xla({"estimator": "local_reparameterization", "prior": "scale_mixture"})   # not measured
    assert bbb.uses_xla({"estimator": "flipout"}, "lenet5", "eigen") and not bbb.uses_xla(
        {"estimator": "flipout"}, "lenet5", "onednn")
    assert not bbb.uses_xla({"estimator": "local_reparameterization"}, "resnet20", "eigen")  # Conv2DFlipout
    assert bbb.uses_xla({"estimator": "reparameterization"}, "resnet20", "eigen") and not bbb.uses_xla(
        {"estimator": "reparameterization"}, "resnet20", "onednn")
    assert not vd.uses_xla({}, "mlp") and not vd.uses_xla({}, "lenet5", "onednn") and not vd.uses_xla({}, "lenet5", "eigen")
    # The measured row of variational dropout is the additive Conv2DVariationalDropout's; the multiplicative one has none.
    assert vd.xla({}, "lenet5") == "tfbnn_vd" and vd.xla({"parameterization": "multiplicative"}, "lenet5") is None
    assert not bbb.uses_xla({"estimator": "flipout"}, None) and not graves.uses_xla({})
    assert not methods.get("deterministic").stochastic and methods.get("mc_dropout").stochastic
    assert methods.method_of_conversion("kingma")[0] is vd
    assert methods.layer_class("NodeDense") is tfbnn.layers.NodeDense
    assert methods.layer_class(tfbnn.layers.MCDropout) is tfbnn.layers.MCDropout and methods.layer_class(None) is None
    with pytest.raises(ValueError, match="Expected the name of a tfbnn.layers class or a layer class"):
        methods.layer_class("NoSuchLayer")


# -- unknown names ------------------------------------------------------------------------------------
def test_an_unknown_method_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown method\. Expected one of \['deterministic', 'mc_dropout', "
                                         r"'bbb', 'vd', 'ibnn', 'graves', 'ensemble', 'sngp', 'ddu', 'evidential', "
                                         r"'heteroscedastic', 'blob', 'csgmcmc'\]\. Received: method='nope'"):
        methods.get("nope")
    with pytest.raises(ValueError, match=r"Expected one of \['deterministic', .*'ibnn', 'sngp', 'ddu', 'evidential', "
                                         r"'heteroscedastic', 'csgmcmc'\]\. Received: method='graves'"):
        models.build("mlp", method="graves")  # a recipe-level method, not the zoo's
    with pytest.raises(ValueError,
                       match=r"recipe field `method` to be one of \[.*'ensemble', 'sngp', .*'blob', 'csgmcmc'\]"):
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


# -- every method that trains is registered, with its epistemic score (issue 36) --------------------------------
def test_every_method_declares_its_epistemic_score():
    assert {name: methods.get(name).epistemic for name in methods.names()} == {
        "deterministic": "none", "mc_dropout": "mutual_information", "bbb": "mutual_information",
        "vd": "mutual_information", "ibnn": "mutual_information", "graves": "mutual_information",
        "ensemble": "mutual_information", "sngp": "gp_variance", "ddu": "density", "evidential": "evidential",
        "heteroscedastic": "none", "blob": "mutual_information", "csgmcmc": "mutual_information"}
    with pytest.raises(ValueError, match=r"Expected `epistemic` in \['mutual_information'.*Received: epistemic='gp'"):
        methods.Method("x", "x", epistemic="gp")


@pytest.mark.parametrize("builder, kwargs", [("mlp", {"hidden_units": (8,), "input_shape": (8, 8, 1)}),
                                             ("lenet5", {"input_shape": (8, 8, 1), "padding": "same"})])
def test_the_zoo_builds_the_single_pass_methods(builder, kwargs):
    """The MLP and a conv net of DDU (spectral body, softmax Dense), evidential (Dense -> DirichletHead) and the
    heteroscedastic softmax, each output layer named "predictions"; a seeded model builds again the same."""
    x = np.random.default_rng(0).random((3, 8, 8, 1)).astype("float32")
    expected = {"ddu": ("SpectralDense", "Dense"), "evidential": ("Dense", "DirichletHead"),
                "heteroscedastic": ("Dense", "HeteroscedasticSoftmax")}
    for method, (body, head) in expected.items():
        keras.utils.set_random_seed(0)
        model = models.build(builder, method=method, num_classes=3, seed=1, **kwargs)
        assert type(model.layers[-1]).__name__ == head and model.layers[-1].name == "predictions"
        assert body in [type(layer).__name__ for layer in model.layers]
        if builder == "lenet5" and method == "ddu":
            assert "SpectralConv2D" in [type(layer).__name__ for layer in model.layers]
        keras.utils.set_random_seed(0)
        again = models.build(builder, method=method, num_classes=3, seed=1, **kwargs)
        for a, b in zip(model.get_weights(), again.get_weights()):
            np.testing.assert_array_equal(a, b)
        out = np.asarray(model(x))
        assert out.shape == (3, 3) and np.all(np.isfinite(out))


@pytest.mark.heavy
def test_the_single_pass_methods_train_through_run_and_report_their_own_score(tmp_path):
    """training.run trains DDU, evidential and heteroscedastic recipes (the method's loss, head and callbacks) and
    reports the method's own epistemic AUROC: the evidential vacuity K / S computed by hand from the model's
    Dirichlet outputs (scikit-learn's AUROC), DDU's -log density of a GDA fitted again on the training split,
    and none (None) for the heteroscedastic softmax."""
    from sklearn.metrics import roc_auc_score

    from tfbnn import ddu
    from tfbnn.datasets import corruptions

    base = training.get_recipe("digits-bbb-mlp").quick(epochs=2).replace(
        model_options={"hidden_units": (16,)}, max_examples=240, temperature_scaling=False, validation_fraction=0.0)
    options = {"evidential": {"annealing_epochs": 2},
               "heteroscedastic": {"num_factors": 2, "train_mc_samples": 8, "test_mc_samples": 8}, "ddu": {}}
    for method, opts in options.items():
        recipe = base.replace(name=f"own-{method}", method=method, method_options=opts, eval_samples=2)
        result = training.run(recipe, output_dir=str(tmp_path / method), verbose=0, jit_compile=False, quiet=True)
        history = result.history[-1]
        assert np.isfinite(history["loss"]) and 0 <= history["accuracy"] <= 1
        detection = result.test["shift_detection"]
        assert detection["epistemic_score"] == methods.get(method).epistemic
        data = training.load_data(recipe)
        x, _ = training.arrays(data.test)
        rng = corruptions.make_rng(recipe.seed)
        clean, shifted = (corruptions.CORRUPTIONS["gaussian"](x, level, seed=rng) for level in (0.0, 0.5))
        if method == "heteroscedastic":
            assert detection["auroc_epistemic"] is None and result.test["epistemic_own"] is None
            continue
        if method == "evidential":
            assert history["evidential_kl_coefficient"] == 0.5  # the method's callback ran: epoch 1 of 2
            alpha = [np.asarray(result.model(v), np.float64) for v in (clean, shifted)]
            scores = [a.shape[1] / a.sum(axis=1) for a in alpha]
        else:
            gda = ddu.DDU(result.model).fit(*training.arrays(data.train))
            scores = [-gda.log_density(v) for v in (clean, shifted)]
        expected = roc_auc_score(np.r_[np.zeros(len(x)), np.ones(len(x))], np.r_[scores[0], scores[1]])
        assert detection["auroc_epistemic"] == pytest.approx(expected, abs=1e-9)
        assert result.test["epistemic_own"] == pytest.approx(scores[0].mean(), rel=1e-6)


def test_blob_is_registered_but_no_zoo_recipe_builds_it(tmp_path):
    recipe = training.get_recipe("digits-bbb-mlp").quick().replace(method="blob", method_options={})
    with pytest.raises(ValueError, match=r"Method 'blob' adapts a pre-trained network.*fit_model.*method='blob'"):
        training.run(recipe, output_dir=str(tmp_path / "x"), verbose=0, quiet=True)
    assert not os.path.exists(tmp_path / "x")
    import argparse

    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    assert parser.parse_args(["--method", "evidential"]).method == "evidential"
    with pytest.raises(SystemExit):  # not a --method choice: it adapts a pre-trained network
        parser.parse_args(["--method", "blob"])


def _study_sources():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(tfbnn.__file__))), "tfbnn", "experiments")
    return {name: open(os.path.join(root, name)).read() for name in sorted(os.listdir(root)) if name.endswith(".py")}


def _named_methods(source):
    """The method names a study's source trains: string literals given as the first argument of ``train`` /
    ``_trained`` / ``_own_score``, as the second of ``fit`` (the KerasHub study's ``context.fit``), or as
    ``method=`` of a ``Recipe`` or its ``replace``."""
    import ast

    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = getattr(node.func, "attr", getattr(node.func, "id", ""))
        args = {"train": 0, "_trained": 0, "_own_score": 0, "fit": 1}
        if func in args and len(node.args) > args[func] and isinstance(node.args[args[func]], ast.Constant) \
                and isinstance(node.args[args[func]].value, str):
            names.append(node.args[args[func]].value)
        if func in ("Recipe", "replace"):
            names += [k.value.value for k in node.keywords
                      if k.arg == "method" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)]
    return names


def test_the_studies_train_registered_methods_only():
    """A method trained in tfbnn/experiments is a registered one, and the shift benchmark and the KerasHub study
    compile and fit nothing themselves: they train through tfbnn.training (run / fit_model)."""
    sources = _study_sources()
    named = {name: _named_methods(source) for name, source in sources.items()}
    unregistered = {f: sorted(set(n) - set(methods.names())) for f, n in named.items() if set(n) - set(methods.names())}
    assert unregistered == {}
    assert {"ddu", "evidential", "heteroscedastic", "sngp"} <= set(named["_shift_benchmark.py"])
    assert {"deterministic", "bbb", "blob"} <= set(named["_kerashub_finetune.py"])
    for name in ("_shift_benchmark.py", "_kerashub_finetune.py"):
        assert ".compile(" not in sources[name] and "model.fit(" not in sources[name], name
    assert _named_methods("context.train('gp'); training.Recipe(method='bogus')") == ["gp", "bogus"]


def _measured_xla_pairs(block):
    """``{(network, layer, kernels or None): {xla: ms}}`` from a benchmarks/README.md table block."""
    import re

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    body = re.search(f"<!-- BEGIN {block} -->(.*?)<!-- END {block} -->", text, re.DOTALL).group(1)
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.strip().splitlines()]
    header, rows = rows[0], rows[2:]
    pairs = {}
    for row in rows:
        cell = dict(zip(header, row))
        kernels = None if "kernels" not in cell else ("eigen" if cell["kernels"].startswith("Eigen") else "onednn")
        key = (cell.get("network", "mlp"), cell["layer"], kernels)
        pairs.setdefault(key, {})[cell["XLA"] == "on"] = float(cell["ms / step (best)"])
    return pairs


def test_the_xla_rule_picks_the_faster_measured_path():
    """jit_compile="auto"'s rule (tfbnn.methods.XLA_RULE) against the committed side-by-side tables (the MLP's from
    benchmarks/dense_floors.py, the convolutions' from benchmarks/conv_layers.py, both kernel paths): in every
    measured case it picks the faster path, or one within 5% of it (one run each: the spread between runs)."""
    measured = {**_measured_xla_pairs("dense_floors"), **_measured_xla_pairs("conv_layers")}
    checked = set()
    for (network, layer), choice in methods.XLA_RULE.items():
        assert set(choice) == {"eigen", "onednn"}, (network, layer)
        for kernels, on in choice.items():
            ms = measured.get((network, layer, kernels)) or measured.get((network, layer, None))
            assert ms is not None and set(ms) == {False, True}, f"{network} {layer} {kernels}: not measured"
            assert ms[on] <= 1.05 * min(ms.values()), (network, layer, kernels, ms, on)
            checked.add((network, layer))
    # Every measured tfbnn or Keras layer has its rule (TFP's and tf_keras' rows, the floors and the posterior ops are
    # not layers of ours; the _logvar rows time the log-variance scale, which no method's option selects).
    ours = {(n, layer) for n, layer, _ in measured if layer.startswith(("tfbnn_", "keras_")) and not layer.endswith("_logvar")}
    assert ours == checked == set(methods.XLA_RULE), ours ^ set(methods.XLA_RULE)


def test_kernel_library_reads_tensorflow_s_flag(monkeypatch):
    for flag, kernels in (("0", "eigen"), ("false", "eigen"), ("1", "onednn"), ("True", "onednn")):
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", flag)
        assert methods.kernel_library() == kernels, flag
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    import platform

    assert methods.kernel_library() == ("onednn" if platform.machine().lower() in ("x86_64", "amd64") else "eigen")
