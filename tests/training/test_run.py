"""tfbnn.training: recipes (published protocols, JSON round trip, validation), the optimizer and
schedules they become, and run() end to end (outputs, atomicity, reproducibility)."""

import dataclasses
import importlib
import json
import math
import os

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfbnn
from tfbnn import training
from tfbnn._internal.errors import RunError

# -- the published protocols, written out independently of tfbnn/training/recipes.py ----------
# Blundell et al. 2015 sec. 5.1: 2 hidden ReLU layers of 400/800/1200, SGD (eq. 5-6, no momentum)
# with learning rate from {1e-3, 1e-4, 1e-5}, minibatch 128, 600 epochs (Fig. 2), 50,000 train /
# 10,000 validation, scale-mixture prior (grid pi {1/4,1/2,3/4}, -log s1 {0,1,2}, -log s2 {6,7,8}),
# minibatch KL weights pi_i = 2^(M-i) / (2^M - 1) (eq. 9).
BLUNDELL = dict(model="mlp", method="bbb", dataset="mnist", optimizer="sgd", momentum=0.0, batch_size=128,
                epochs=600, kl_schedule="blundell", beta=1.0, validation_fraction=10_000 / 60_000)
# Molchanov et al. 2017, official code (lenet300-100-ard.py, optpolicy.py): Adam 1e-3 flat for 100
# epochs then linear to 0 at 200, batch 100, 200 epochs, KL weight 0 for 5 epochs then linear over 15.
MOLCHANOV = dict(model="lenet_300_100", dataset="mnist", optimizer="adam", learning_rate=1e-3, lr_schedule="linear",
                 lr_boundaries=(100.0, 200.0), lr_final=0.0, batch_size=100, epochs=200, kl_schedule="warmup",
                 warmup_epochs=5.0, kl_epochs=15, beta=1.0)
# Trinh et al. 2022, official code README (StoVGG16, models/vgg.py: VGG16-small, classifier 512-512):
# SGD Nesterov 0.9, lr 0.05, flat to 50% then linear to 1% at 90%, weight decay 5e-4, variational lr
# 0.05 constant, batch 128, 300 epochs, K = 4, KL weight min(1, epoch / 200), 4 training samples,
# 8 test samples per component; prior_mean=1.0 prior_std=0.30, posterior_mean_init=(1.0, 0.05),
# posterior_std_init=(0.30, 0.02).
TRINH_NODES = dict(num_components=4, prior_mean=1.0, prior_stddev=0.3, init_mean=1.0, init_stddev=0.05,
                   init_scale_mean=0.3, init_scale_stddev=0.02)
TRINH = dict(model="vgg16_small", method="ibnn", dataset="cifar10", optimizer="sgd", momentum=0.9, nesterov=True,
             learning_rate=0.05, lr_schedule="linear", lr_boundaries=(150.0, 270.0), lr_final=0.01,
             weight_decay=5e-4, variational_learning_rate=0.05, batch_size=128, epochs=300, kl_schedule="linear",
             kl_epochs=200, beta=1.0, train_samples=4, eval_samples=32)
# The CIFAR-10 comparison (seed study 004): BbB with Adam and constant beta = 0.1, MC dropout with SGD
# lr 0.01 and dropout 0.3-0.5; batch 64.
CIFAR_BBB = dict(method="bbb", dataset="cifar10", optimizer="adam", kl_schedule="constant", beta=0.1, batch_size=64)
CIFAR_DROPOUT = dict(method="mc_dropout", dataset="cifar10", optimizer="sgd", learning_rate=0.01, batch_size=64)


def _expect(recipe, fields):
    for field, value in fields.items():
        got = getattr(recipe, field)
        assert got == pytest.approx(value), (recipe.name, field, got, value)


@pytest.mark.parametrize("units", [400, 800, 1200])
def test_blundell_recipes_follow_the_paper(units):
    recipe = training.get_recipe(f"blundell-mnist-{units}")
    _expect(recipe, BLUNDELL)
    assert recipe.model_options["hidden_units"] == (units, units)
    assert recipe.learning_rate in (1e-3, 1e-4, 1e-5)
    prior = tfbnn.priors.get(recipe.method_options["prior"])
    assert isinstance(prior, tfbnn.priors.ScaleMixture)
    assert prior.pi in (0.25, 0.5, 0.75)
    assert -math.log(prior.sigma1) == pytest.approx(round(-math.log(prior.sigma1)))
    assert round(-math.log(prior.sigma1)) in (0, 1, 2) and round(-math.log(prior.sigma2)) in (6, 7, 8)


@pytest.mark.parametrize("method", ["vd", "graves"])
@pytest.mark.parametrize("pretrained", [False, True])
def test_lenet300_100_recipes_follow_the_official_code(method, pretrained):
    name = f"{method}-lenet300-100{'-pretrained' if pretrained else ''}"
    recipe = training.get_recipe(name)
    _expect(recipe, {**MOLCHANOV, "method": method})
    assert (recipe.pretrain_epochs > 0) == pretrained
    if method == "graves":  # Graves' own MNIST prior, fixed (his adaptive prior collapses at beta = 1)
        assert tfbnn.priors.get(recipe.method_options["prior"]) == tfbnn.priors.Normal(0.0, 1.0)
    schedule = training.kl_schedule(recipe.kl_schedule, recipe.ramp_epochs, recipe.beta, recipe.warmup_epochs)
    # rw_linear: 0 for epochs 0-4, (epoch - 5) / 15 for 5-19, then 1.
    for epoch in (0, 4, 5, 12, 20, 50):
        assert schedule(epoch, 0, 10) == pytest.approx(min(1.0, max(0.0, (epoch - 5) / 15)))
    lr = training.learning_rate(recipe, steps_per_epoch=10)
    for epoch in (0, 99, 100, 150, 200):  # lr_linear: 1e-3 * min(2 - epoch / 100, 1)
        assert float(lr(epoch * 10)) == pytest.approx(1e-3 * min(2 - epoch / 100, 1.0), abs=1e-9)


def test_ibnn_recipe_follows_the_official_code():
    recipe = training.get_recipe("ibnn-cifar10-vgg16")
    _expect(recipe, TRINH)
    assert recipe.method_options == TRINH_NODES
    lr = training.learning_rate(recipe, steps_per_epoch=2)
    for epoch, factor in ((0, 1.0), (150, 1.0), (210, 1 - 0.99 * 0.5), (270, 0.01), (299, 0.01)):
        assert float(lr(epoch * 2)) == pytest.approx(0.05 * factor, rel=1e-5)
    schedule = training.kl_schedule(recipe.kl_schedule, recipe.ramp_epochs, recipe.beta)
    for epoch in (0, 100, 200, 250):
        assert schedule(epoch, 0, 1) == pytest.approx(min(1.0, epoch / 200))


@pytest.mark.parametrize("model", ["lenet5", "alexnet", "resnet50"])
def test_cifar_comparison_recipes(model):
    _expect(training.get_recipe(f"cifar10-{model}-bbb"), {**CIFAR_BBB, "model": model})
    dropout = training.get_recipe(f"cifar10-{model}-mc_dropout")
    _expect(dropout, {**CIFAR_DROPOUT, "model": model})
    assert 0.3 <= dropout.method_options["rate"] <= 0.5


@pytest.mark.parametrize("name", training.recipe_names())
def test_every_recipe_round_trips_through_json(name, tmp_path):
    recipe = training.get_recipe(name)
    path = training.save_recipe(recipe, str(tmp_path / "r.json"))
    assert training.load_recipe(path) == recipe
    assert training.Recipe.from_dict(json.loads(recipe.to_json())) == recipe
    assert training.resolve(path) == recipe and training.resolve(name) is recipe


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"epochs": 0}, "epochs=0"),
        ({"method": "bayes"}, "method='bayes'"),
        ({"optimizer": "rmsprop"}, "optimizer='rmsprop'"),
        ({"momentum": 0.9}, "momentum"),
        ({"optimizer": "sgd", "nesterov": True}, "nesterov"),
        ({"lr_schedule": "step"}, "lr_boundaries"),
        ({"beta": -1.0}, "beta=-1.0"),
        ({"kl_schedule": "blundell", "beta": 0.5}, "beta=0.5"),
        ({"train_samples": 2, "method": "deterministic"}, "train_samples=2"),
        ({"pretrain_epochs": 3, "method": "mc_dropout"}, "pretrain_epochs=3"),
        ({"learning_rate": float("nan")}, "learning_rate=nan"),
        ({"name": "../x"}, "name='../x'"),
        ({"seed": True}, "seed=True"),
        ({"temperature_scaling": 1}, "temperature_scaling=1"),
        ({"temperature_scaling": True, "validation_fraction": 0.0}, "temperature_scaling=True, validation_fraction=0.0"),
    ],
)
def test_bad_recipes_name_the_field(changes, needle):
    with pytest.raises(ValueError, match=r"Received: .*" + __import__("re").escape(needle)):
        training.get_recipe("digits-bbb-mlp").replace(**changes)
    with pytest.raises(ValueError, match="Unknown recipe field"):
        training.Recipe.from_dict({"nme": "x"})
    with pytest.raises(ValueError, match="Unknown recipe"):
        training.get_recipe("nope")


def test_optimizer_settings_and_weight_decay_spares_the_posteriors():
    recipe = training.get_recipe("ibnn-cifar10-vgg16").replace(model="mlp", model_options={"hidden_units": (8,)})
    model = tfbnn.models.mlp("ibnn", hidden_units=(8,), num_classes=3, input_shape=(4,), num_examples=10, seed=0)
    excluded = {id(v) for v in training.weight_decay_exclusions(model)}
    node = {id(w) for w in tfbnn.ibnn.variational_weights(model)}
    assert excluded == node and node  # node posteriors excluded, node-layer kernels decay
    opt = training.make_optimizer(recipe, steps_per_epoch=5, model=model)
    assert isinstance(opt, keras.optimizers.MultiOptimizer)
    bbb = tfbnn.models.mlp("bbb", hidden_units=(8,), num_classes=3, input_shape=(4,), num_examples=10, seed=0)
    assert {id(v) for v in training.weight_decay_exclusions(bbb)} == {id(v) for v in bbb.trainable_weights}
    sgd = training.make_optimizer(training.get_recipe("cifar10-lenet5-mc_dropout"), steps_per_epoch=5)
    assert isinstance(sgd, keras.optimizers.SGD) and float(sgd.learning_rate) == pytest.approx(0.01)


def test_kl_schedules_end_at_beta():
    for name in ("constant", "linear", "warmup", "cosine", "cyclic"):
        schedule = training.kl_schedule(name, ramp_epochs=4, beta=0.1)
        assert schedule(3.999, 0, 1) <= 0.1 + 1e-12
        assert schedule(4, 0, 1) == pytest.approx(0.1) or name == "cyclic"
    with pytest.raises(ValueError, match="beta=0.5"):
        training.kl_schedule("blundell", 4, beta=0.5)


# -- run() end to end ---------------------------------------------------------------------------


def _quick(name, **changes):
    # The big networks run eagerly (_EAGER) take their 48 examples in one step per epoch: an eager step
    # costs its weight-sized draws and per-variable updates, whatever its batch (ResNet-50 BbB: 1.7 s of
    # its Eigen convolution gradient alone); the protocol (model, method, optimizer, schedules, save,
    # results) is the same at any number of steps.
    #
    # VGG16 keeps CIFAR-10's 32x32 images (its five poolings need them) and has no weight draws: there the
    # batch is the cost (four noise samples of each of 48 images, 8 s of Eigen gradients on 2 cores), so it
    # takes one step of 16 examples (the other 32 stay in the data, whose size the test checks).
    batch_size = 48 if name in _EAGER and name not in _ONE_SMALL_STEP else 16
    recipe = training.get_recipe(name).quick(max_examples=48, max_test_examples=24, batch_size=batch_size)
    if name in _ONE_SMALL_STEP:
        recipe = recipe.replace(steps_per_epoch=1)
    if recipe.dataset == "cifar10" and not recipe.model.startswith("vgg16"):  # 8x8 digits: the same path, fewer FLOPs
        recipe = recipe.replace(dataset="digits")
    return recipe.replace(**changes)


# The big convolutional models take long to build on 2 CPU cores: heavy.
_HEAVY = {"ibnn-cifar10-vgg16", "cifar10-alexnet-bbb", "cifar10-resnet50-bbb", "cifar10-resnet50-mc_dropout",
          "cifar10-resnet50-rank1",
          "blundell-mnist-800", "blundell-mnist-1200", "graves-lenet300-100"}


# The big convolutional networks run their few quick steps eagerly (conftest's `eager`): ResNet-50's
# quick recipe takes 30 s so against 71 s traced; the compiled steps run in the other recipes' tests.
_EAGER = {"ibnn-cifar10-vgg16", "cifar10-alexnet-bbb", "cifar10-resnet50-bbb", "cifar10-resnet50-mc_dropout",
          "cifar10-resnet50-rank1"}
_ONE_SMALL_STEP = {"ibnn-cifar10-vgg16"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.heavy) if n in _HEAVY else n for n in training.recipe_names()])
def test_every_recipe_runs_end_to_end_in_quick_mode_offline(name, tmp_path, request):
    if name in _EAGER:
        request.getfixturevalue("eager")
    recipe = _quick(name)
    with tfds.testing.mock_data(num_examples=48):  # mnist / cifar10 without a download (random pixels)
        result = training.run(recipe, output_dir=str(tmp_path / "out"), verbose=0)
    assert sorted(os.listdir(tmp_path / "out")) == [
        "history.csv", "history.json", "learning_curves.png", "model.keras", "recipe.json", "results.json"]
    assert result.num_examples == 48 - int(48 * recipe.validation_fraction) or recipe.validation_fraction
    assert len(result.history) == recipe.epochs * recipe.num_members  # an ensemble: one row per member and epoch
    assert all(math.isfinite(r["loss"]) for r in result.history)
    test = result.test
    assert test["predictive_entropy"] == pytest.approx(test["aleatoric"] + test["epistemic"], abs=1e-5)
    assert training.load_recipe(str(tmp_path / "out" / "recipe.json")) == recipe
    stored = json.loads((tmp_path / "out" / "results.json").read_text())
    assert stored["test"]["accuracy"] == pytest.approx(test["accuracy"])
    if recipe.is_bayesian:
        kl_weights = {float(layer.kl_weight.numpy()) for layer in tfbnn.bayesian_layers(result.model)}
        assert len(kl_weights) == 1  # KLAnnealing set beta / N on every layer


def test_run_writes_a_model_whose_posterior_mean_matches_the_reported_numbers(tmp_path):
    result = training.run(_quick("digits-bbb-mlp", epochs=2), output_dir=str(tmp_path / "r"), verbose=0)
    model = keras.saving.load_model(tmp_path / "r" / "model.keras")
    x, y = training.arrays(training.load_data(result.recipe).test)
    with tfbnn.posterior_mean(model):
        probs = model.predict(x, verbose=0)
    assert tfbnn.metrics.accuracy(probs, y) == pytest.approx(result.test["posterior_mean_accuracy"])
    # KL reported = the model's KL; the ELBO's N is the data actually used.
    assert result.test["kl"] == pytest.approx(float(tfbnn.kl_divergence(model)), rel=1e-5)
    assert result.num_examples == 48 - round(48 * result.recipe.validation_fraction)


def test_the_train_step_is_traced_once(tmp_path, train_step_traces):
    """The optimizer and metrics are built before fit: Keras would otherwise create their
    variables inside the first trace and trace the step twice."""
    result = training.run(_quick("digits-bbb-mlp", epochs=2), output_dir=str(tmp_path / "r"), verbose=0,
                          jit_compile=False)
    assert train_step_traces == [result.model.name]
    assert result.model.optimizer.iterations.numpy() == 2 * 3  # 41 examples in batches of 16, two epochs


def test_build_for_fit_leaves_a_strategy_model_to_keras_outside_its_scope():
    import tensorflow as tf

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, activation="softmax", kl_weight=0.5,
                                                                        seed=0)])
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    batch = (np.zeros((2, 4), "float32"), np.zeros((2,), "int32"))
    assert not tfbnn.utils.build_for_fit(model, batch).optimizer.built  # its variables belong in the scope
    with strategy.scope():
        tfbnn.utils.build_for_fit(model, batch)
    assert model.optimizer.built
    history = model.fit(*batch, epochs=1, verbose=0)  # Keras finds its state built in the scope
    assert len(history.history["loss"]) == 1


def test_build_for_fit_skips_the_symbolic_build_while_functions_run_eagerly(eager):
    """Nothing is traced, so the symbolic build (a trace of the model's graph) is skipped; Keras builds
    the optimizer in the first eager step, and training goes exactly as after the symbolic build."""
    x = np.random.default_rng(0).random((8, 4)).astype("float32")
    y = np.arange(8, dtype="int32") % 3

    def trained(symbolic_build):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, activation="softmax", kl_weight=0.1,
                                                                        seed=0)])
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        if symbolic_build:
            model._symbolic_build(data_batch=(x, y))  # what build_for_fit does when steps are traced
        assert tfbnn.utils.build_for_fit(model, (x, y)).optimizer.built is symbolic_build
        losses = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0).history["loss"]
        return losses, [w.numpy() for w in model.weights]

    (skipped, weights), (built, reference) = trained(False), trained(True)
    assert skipped == built
    for w, v in zip(weights, reference):
        np.testing.assert_array_equal(w, v)


def test_run_is_seeded(tmp_path):
    recipe = _quick("digits-bbb-mlp", epochs=2)
    a = training.run(recipe, output_dir=str(tmp_path / "a"), verbose=0)
    b = training.run(recipe, output_dir=str(tmp_path / "b"), verbose=0)
    assert [r["loss"] for r in a.history] == [r["loss"] for r in b.history]
    assert a.test["accuracy"] == b.test["accuracy"]


def test_a_diverging_run_raises_and_leaves_nothing(tmp_path):
    out = tmp_path / "runs" / "bad"
    os.makedirs(tmp_path / "runs")
    with pytest.raises(RunError, match="diverged: the loss became nan at epoch 1"):
        training.run(_quick("digits-bbb-mlp", learning_rate=1e30), output_dir=str(out), verbose=0)
    assert os.listdir(tmp_path / "runs") == []


def test_a_rerun_replaces_results_only_when_it_succeeds(tmp_path):
    out = tmp_path / "r"
    training.run(_quick("digits-bbb-mlp"), output_dir=str(out), verbose=0)
    before = (out / "results.json").read_bytes()
    with pytest.raises(RunError):
        training.run(_quick("digits-bbb-mlp", learning_rate=1e30), output_dir=str(out), verbose=0)
    assert (out / "results.json").read_bytes() == before
    assert not [n for n in os.listdir(tmp_path) if "tfbnn-tmp" in n]


def test_baseline_and_graves_conversion(tmp_path):
    result = training.run(_quick("graves-lenet300-100-pretrained", dataset="digits"), output_dir=str(tmp_path / "g"),
                          verbose=0, baseline=True)
    assert [type(layer).__name__ for layer in tfbnn.bayesian_layers(result.model)] == ["GravesDense"] * 3
    assert {layer.kernel_prior for layer in tfbnn.bayesian_layers(result.model)} == {tfbnn.priors.Normal(0.0, 1.0)}
    assert set(result.baseline) >= {"accuracy", "nll", "ece", "brier"}
    np.testing.assert_allclose(result.baseline["predictive_entropy"],
                               result.baseline["aleatoric"], atol=1e-6)  # deterministic: no epistemic part


def test_a_recipe_model_with_its_optimizer_loads_in_a_fresh_process_after_import_tfbnn(tmp_path):
    """The Molchanov recipe compiles with a LinearRamp learning rate; `import tfbnn` registers it."""
    import subprocess
    import sys

    recipe = _quick("vd-lenet300-100", dataset="digits")
    training.run(recipe, output_dir=str(tmp_path / "vd"), verbose=0)
    code = ("import keras, tfbnn; m = keras.saving.load_model(%r); "
            "print(type(m.optimizer.learning_rate).__name__, type(m.optimizer._learning_rate).__name__)"
            % str(tmp_path / "vd" / "model.keras"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].split()[-1] == "LinearRamp"


def test_defaults_follow_the_papers():
    """Issue 13 item 3 (partly): the scale mixture's default is the seed study's best grid point
    (1/4, e^0, e^-8); the iBNN LeNet sweep scales parameter counts x1/x4/x16/x64 (widths x1/2/4/8)."""
    from tfbnn.experiments import ibnn_lenet

    prior = tfbnn.priors.ScaleMixture()
    assert (prior.pi, prior.sigma1, prior.sigma2) == pytest.approx((0.25, 1.0, math.exp(-8.0)))
    from tfbnn import cli

    args = cli.build_parser().parse_args(["train", "--prior", "scale_mixture"])
    assert cli.train.recipe_from_args(args).method_options["prior"]["config"]["sigma2"] == pytest.approx(math.exp(-8))
    widths = ibnn_lenet.DEFAULTS["widths"]
    counts = [ibnn_lenet.build_lenet("bbb", (28, 28, 1), 10, width=w).count_params() for w in widths]
    for count, factor in zip(counts, (1, 4, 16, 64)):
        assert 0.7 * factor < count / counts[0] < 1.1 * factor  # dense weights grow with the square of the width


def test_train_samples_wrap_every_stochastic_method(tmp_path):
    run_module = importlib.import_module("tfbnn.training.run")

    recipe = _quick("digits-bbb-mlp", epochs=1, train_samples=3)
    result = training.run(recipe, output_dir=str(tmp_path / "r"), verbose=0)
    assert all(math.isfinite(r["loss"]) for r in result.history)
    assert isinstance(run_module._multi_sample_model(recipe, result.model), tfbnn.MultiSampleModel)
    assert recipe.replace(method="mc_dropout", method_options={}).train_samples == 3  # allowed


# -- deep ensembles (Lakshminarayanan et al. 2017) as a recipe method ----------------------------------------
def test_ensemble_recipes_validate_and_give_each_member_its_own_seed():
    recipe = training.get_recipe("digits-ensemble-mlp")
    # Lakshminarayanan et al. 2017 sec. 2.4 / 3: M = 5 members, uniformly mixed.
    assert recipe.method == "ensemble" and recipe.num_members == 5 and recipe.member_method == "deterministic"
    assert not recipe.is_bayesian
    bayes = recipe.replace(method_options={"members": 3, "member_method": "bbb", "estimator": "flipout"})
    assert bayes.is_bayesian and bayes.num_members == 3
    members = [bayes.member_recipe(m) for m in range(3)]
    assert [m.seed for m in members] == tfbnn.ensembles.member_seeds(bayes.seed, 3)
    assert all(m.method == "bbb" and m.method_options == {"estimator": "flipout"} for m in members)
    assert members[0].replace(name=bayes.name, method="ensemble", method_options=bayes.method_options,
                              seed=bayes.seed) == bayes  # nothing else changes
    for options, needle in [({"members": 0}, "members'\\]=0"), ({"members": 2.5}, "2.5"),
                            ({"member_method": "ensemble"}, "member_method'\\]='ensemble'"),
                            ({"member_method": "graves"}, "'graves'")]:
        with pytest.raises(ValueError, match=needle):
            recipe.replace(method_options=options)
    with pytest.raises(ValueError, match="train_samples"):
        recipe.replace(train_samples=2)  # deterministic members
    assert recipe.replace(method_options={"member_method": "mc_dropout"}, train_samples=2).train_samples == 2
    with pytest.raises(ValueError, match="index=3"):
        bayes.member_recipe(3)
    with pytest.raises(ValueError, match="method='bbb'"):
        training.get_recipe("digits-bbb-mlp").member_recipe(0)


@pytest.mark.heavy
def test_an_ensemble_recipe_trains_distinct_members_and_reports_their_mixture(tmp_path):
    recipe = _quick("digits-ensemble-mlp", method_options={"members": 2, "member_method": "bbb",
                                                           "estimator": "local_reparameterization"})
    result = training.run(recipe, output_dir=str(tmp_path / "e"), verbose=0)
    model = result.model
    assert isinstance(model, tfbnn.DeepEnsemble) and model.num_members == 2
    assert [r["member"] for r in result.history] == [0, 1]
    a, b = (m.trainable_variables[0].numpy() for m in model.members)
    assert np.abs(a - b).max() > 1e-3  # different seeds: different members
    assert result.test["num_samples"] == 2 * recipe.eval_samples
    x, y = training.arrays(training.load_data(recipe).test)
    loaded = keras.saving.load_model(tmp_path / "e" / "model.keras")
    for original, member in zip(model.members, loaded.members):
        for v, w in zip(original.weights, member.weights):
            np.testing.assert_array_equal(v.numpy(), w.numpy())
    with tfbnn.posterior_mean(loaded):  # the mean of the members' posterior-mean predictions
        probs = loaded.predict(x, verbose=0)
    assert tfbnn.metrics.accuracy(probs, y) == pytest.approx(result.test["posterior_mean_accuracy"])
    assert result.test["kl"] == pytest.approx(float(tfbnn.kl_divergence(model)) / 2, rel=1e-5)  # members' mean


def _numbers(accuracy, confidence, nll, ece, epistemic, auroc_epistemic):
    shifted = {"epistemic": 3 * epistemic, "accuracy": 0.3}
    return {"accuracy": accuracy, "confidence": confidence, "nll": nll, "ece": ece, "epistemic": epistemic,
            "shifted": shifted, "shift_detection": {"auroc_entropy": 0.9, "auroc_epistemic": auroc_epistemic}}


def test_the_printed_reading_follows_the_numbers():
    """interpretation() quotes the results and picks its words from them, not from expectations."""
    recipe = training.get_recipe("digits-bbb-mlp")
    result = training.RunResult(
        recipe=recipe, model=None, history=[], num_examples=100, train_seconds=1.0, files=[], output_dir="",
        test=_numbers(0.90, 0.95, 0.40, 0.05, 0.02, 0.8),                    # beta = 0.1: over-confident, worse NLL
        comparison={"beta": 1.0, **_numbers(0.93, 0.80, 0.30, 0.11, 0.20, 0.95)},  # beta = 1: under-confident
        baseline=_numbers(0.93, 0.97, 0.35, 0.04, 0.0, 0.5))
    text = " ".join(training.interpretation(result).split())
    assert "at beta = 1 (the ELBO) the BbB predictive is under-confident (mean confidence 80.0% at accuracy 93.0%" in text
    assert "at beta = 0.1 (a cold posterior, each example counted 10 times) it is over-confident" in text
    assert "and as accurate" in text and "and 3.0 points less accurate" in text
    assert "The smaller beta did not improve the predictive here (NLL 0.300 -> 0.400" in text
    assert "AUROC 0.950 at beta = 1, 0.800 at beta = 0.1" in text and "(AUROC 0.50)" in text
    assert "Temperature scaling" not in text  # none was fitted
    assert training.interpretation(dataclasses.replace(result, baseline=None)) == ""
    with pytest.raises(ValueError, match="compare_beta=1"):
        training.run(recipe.replace(method="deterministic"), compare_beta=1.0)


def test_auto_xla_only_for_runs_long_enough_to_pay_for_its_compilation(monkeypatch):
    run_module = importlib.import_module("tfbnn.training.run")
    main_job = training.get_recipe("digits-bbb-mlp")  # local reparameterization MLP: XLA helps it per step
    limit = run_module.XLA_MIN_STEPS
    assert run_module._jit("auto", main_job, 39 * main_job.epochs) is (39 * main_job.epochs >= limit) is True
    assert run_module._jit("auto", main_job, limit - 1) is False  # a quick run: the compilation would not pay
    assert run_module._jit("auto", main_job, limit) is True
    assert run_module._jit(True, main_job, 3) is True and run_module._jit(False, main_job, 10 ** 6) is False
    # The measured rule (tfbnn.methods.XLA_RULE): a Flipout MLP was not faster with XLA (39.0 against 37.9 ms) ...
    flipout = main_job.replace(method_options={"estimator": "flipout", "prior": "normal"})
    assert run_module._jit("auto", flipout, 10 ** 6) is False
    # ... the local-reparameterization MLP was (24.3 against 25.9), but not with the unmeasured scale-mixture
    # prior, nor an unmeasured network (a recurrent classifier).
    mixture = main_job.replace(method_options={"estimator": "local_reparameterization", "prior": "scale_mixture"})
    assert run_module._jit("auto", main_job.replace(method_options={"estimator": "local_reparameterization",
                                                                    "prior": "normal"}), 10 ** 6) is True
    assert run_module._jit("auto", mixture, 10 ** 6) is False
    assert run_module._jit("auto", main_job.replace(model="rnn_classifier"), 10 ** 6) is False
    # LeNet-5 with Flipout convolutions: XLA paid on Eigen's kernels (9.9 against 10.6 ms), not on oneDNN's
    # (6.6 against 4.3); a deep convolutional network's Flipout was slower with XLA on both; its Keras Conv2D
    # (MC dropout) faster on Eigen's (24.0 against 31.3), slower on oneDNN's (23.8 against 19.6).
    lenet = main_job.replace(model="lenet5")
    for kernels, on in (("0", True), ("1", False)):
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", kernels)
        assert run_module._jit("auto", lenet.replace(method_options={"estimator": "flipout"}), 10 ** 6) is on
        assert run_module._jit("auto", lenet.replace(model="resnet50", method_options={"estimator": "flipout"}),
                               10 ** 6) is False
        assert run_module._jit("auto", lenet.replace(model="resnet50", method="mc_dropout", method_options={}),
                               10 ** 6) is on


# -- each method's own epistemic score (tfbnn.methods.Method.epistemic) ----------------------------------------
def _shifted_test_inputs(recipe, data):
    """The clean and Gaussian-shifted test inputs of a run's evaluation, drawn again from the same stream."""
    from tfbnn.datasets import corruptions

    x, y = training.arrays(data.test)
    rng = corruptions.make_rng(recipe.seed)
    clean = corruptions.CORRUPTIONS["gaussian"](x, 0.0, seed=rng)
    return clean, corruptions.CORRUPTIONS["gaussian"](x, training.SHIFT_GAMMA, seed=rng)


def _auroc(clean, shifted):
    from sklearn.metrics import roc_auc_score

    return roc_auc_score(np.r_[np.zeros(len(clean)), np.ones(len(shifted))], np.r_[clean, shifted])


def _gp_variance_by_hand(model, x):
    """``diag(Phi P^{-1} Phi^T)`` in NumPy from the GP layer's weights: ``Phi = sqrt(2 / D) cos(h W + b)``."""
    gp = tfbnn.sngp.gp_layers(model)[0]
    h = np.asarray(keras.Model(model.inputs[0], gp.input)(x, training=False), np.float64)
    d = gp.num_inducing
    phi = np.sqrt(2.0 / d) * np.cos(h / np.sqrt(gp.gp_kernel_scale) @ gp.feature_kernel.numpy().astype(np.float64)
                                    + gp.feature_bias.numpy())
    return np.einsum("bi,ij,bj->b", phi, np.linalg.inv(gp.precision.numpy().astype(np.float64)), phi)


def test_single_pass_methods_report_their_own_epistemic_score(tmp_path, capsys):
    """SNGP's shift-detection AUROC is that of its GP variance (scikit-learn's, on the variance computed in NumPy
    from the GP layer's weights), not the mutual information of a deterministic pass (0 everywhere: AUROC 0.5)."""
    recipe = training.Recipe(
        name="sngp-own", model="mlp", model_options={"hidden_units": (16,)}, method="sngp",
        method_options={"num_inducing": 32}, dataset="digits", epochs=2).quick(epochs=2)
    result = training.run(recipe, output_dir=str(tmp_path / "run"), verbose=0, jit_compile=False,
                          baseline=True)
    table = capsys.readouterr().out
    detection = result.test["shift_detection"]
    assert detection["epistemic_score"] == "gp_variance" and result.test["epistemic"] == 0.0
    clean, shifted = _shifted_test_inputs(recipe, training.load_data(recipe))
    v_clean, v_shifted = _gp_variance_by_hand(result.model, clean), _gp_variance_by_hand(result.model, shifted)
    assert detection["auroc_epistemic"] == pytest.approx(_auroc(v_clean, v_shifted), abs=1e-9)
    assert detection["auroc_epistemic"] != 0.5
    assert result.test["epistemic_own"] == pytest.approx(v_clean.mean(), rel=1e-4)
    # the table: the own score's AUROC, and n/a for the deterministic baseline, which has none
    row = next(line for line in table.splitlines() if line.startswith("AUROC, epistemic (own score)"))
    assert row.split()[-2:] == [f"{detection['auroc_epistemic']:.3f}", "n/a"]
    assert result.baseline["shift_detection"]["auroc_epistemic"] is None
    assert "GP variance (epistemic)" in table and "mutual information (epistemic)" not in table
