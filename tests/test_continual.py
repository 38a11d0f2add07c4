"""Variational continual learning: the Posterior prior, posterior_as_prior, forgetting numbers."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import continual, layers, priors, testing

tfd = tfp.distributions

_RNG = np.random.default_rng(0)  # restarted at every test (tests/conftest.py)

# (layer class, constructor arguments, input shape); the kernel shapes follow from them.
_FAMILIES = [
    (layers.DenseReparameterization, {"units": 3}, (4, 5)),
    (layers.DenseFlipout, {"units": 3}, (4, 5)),
    (layers.DenseLocalReparameterization, {"units": 3}, (4, 5)),
    (layers.DenseLocalReparameterization, {"units": 3, "parameterization": "log_variance"}, (4, 5)),
    (layers.GravesDense, {"units": 3}, (4, 5)),
    (layers.Conv1DFlipout, {"filters": 2, "kernel_size": 3}, (2, 6, 3)),
    (layers.Conv2DReparameterization, {"filters": 2, "kernel_size": 2}, (2, 5, 5, 3)),
    (layers.Conv2DFlipout, {"filters": 2, "kernel_size": 2}, (2, 5, 5, 3)),
]


def _posterior(shape):
    return priors.Posterior(_RNG.normal(0, 0.5, size=shape), _RNG.uniform(0.05, 1.5, size=shape))


def _numpy_sigma(layer, rho):
    rho = np.asarray(rho, "float64")
    if layer.parameterization == "log_variance":
        return np.exp(0.5 * np.clip(rho, -80, 40))
    return np.log1p(np.exp(rho)) + 1e-6


def _perturb(layer):
    """Moves the posterior away from its initialization (means and scales differ per weight)."""
    for v in layer.trainable_weights:
        v.assign(v.numpy() + _RNG.normal(0, 0.3, size=v.shape).astype("float32"))


def _kernel_shape(cls, kwargs, input_shape):
    layer = cls(**kwargs)
    layer.build(input_shape)
    return tuple(layer.kernel_loc.shape), tuple(layer.bias_loc.shape)


@pytest.mark.parametrize("cls, kwargs, input_shape", _FAMILIES, ids=lambda v: getattr(v, "__name__", None))
def test_kl_against_a_posterior_prior_is_tfd_normal_kl_summed(cls, kwargs, input_shape):
    kernel_shape, bias_shape = _kernel_shape(cls, kwargs, input_shape)
    kernel_prior = _posterior(kernel_shape)
    bias_prior = _posterior(bias_shape) if cls is not layers.GravesDense else None
    layer = cls(**kwargs, kernel_prior=kernel_prior, bias_prior=bias_prior, kl_weight=0.25, seed=1)
    layer.build(input_shape)
    _perturb(layer)

    def independent_kl(loc, rho, prior):
        q = tfd.Normal(loc.numpy().astype("float64"), _numpy_sigma(layer, rho.numpy()))
        p = tfd.Normal(prior.loc.astype("float64"), prior.scale.astype("float64"))
        return float(tf.reduce_sum(tfd.kl_divergence(q, p)))

    expected = independent_kl(layer.kernel_loc, layer.kernel_rho, kernel_prior)
    if bias_prior is not None:
        expected += independent_kl(layer.bias_loc, layer.bias_rho, bias_prior)
    assert expected > 1.0  # a KL far from 0: the test can fail
    np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-5)
    x = _RNG.normal(size=input_shape).astype("float32")
    layer(x, training=True)
    np.testing.assert_allclose(float(layer.losses[0]), 0.25 * expected, rtol=1e-5)


@pytest.mark.parametrize("cls, kwargs, input_shape", [_FAMILIES[1], _FAMILIES[6]],
                         ids=lambda v: getattr(v, "__name__", None))
def test_layer_basics_with_posterior_priors(cls, kwargs, input_shape):
    kernel_shape, bias_shape = _kernel_shape(cls, kwargs, input_shape)
    testing.run_layer_test(cls, {**kwargs, "kernel_prior": _posterior(kernel_shape),
                                 "bias_prior": _posterior(bias_shape), "seed": 3},
                           input_shape=input_shape, expected_output_shape=tuple(cls(**kwargs).compute_output_shape(
                               input_shape)))


def _classifier(seed=0):
    return keras.Sequential([
        keras.Input((6,)),
        layers.DenseFlipout(8, activation="relu", seed=seed),
        layers.DenseLocalReparameterization(8, activation="relu", bias_prior=None, seed=seed + 1),
        keras.layers.Dense(8, activation="relu"),  # deterministic: no prior, trained on
        layers.DenseReparameterization(3, activation="softmax", seed=seed + 2),
    ])


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")


def test_posterior_as_prior_freezes_the_posterior_and_the_kl_is_zero():
    x, y = _data()
    model = _classifier()
    model.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy")
    tfbnn.set_kl_weight(model, 1.0)  # a KL that dominates: a stale prior would show in the loss
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    before = [w.numpy().copy() for w in model.weights]
    kl_before = float(tfbnn.kl_divergence(model))
    stale = model.evaluate(x, y, verbose=0)
    assert kl_before > 100 and stale > 100

    changed = continual.posterior_as_prior(model)
    assert [layer.name for layer in changed] == [layer.name for layer in tfbnn.bayesian_layers(model)]
    for layer in changed:
        np.testing.assert_array_equal(layer.kernel_prior.loc, layer.kernel_loc.numpy())
        np.testing.assert_array_equal(layer.kernel_prior.scale, layer.kernel_scale().numpy())
        assert layer.kernel_prior.scale.std() > 0  # per weight, not one number
        if layer.bias_prior is not None:
            np.testing.assert_array_equal(layer.bias_prior.scale, layer.bias_scale().numpy())
    assert changed[1].bias_prior is None  # a point-estimate bias stays one
    for b, w in zip(before, model.weights):  # nothing re-initialized
        np.testing.assert_array_equal(b, w.numpy())
    assert abs(float(tfbnn.kl_divergence(model))) < 1e-6
    # The compiled steps were dropped: evaluate now sees KL = 0 (the loss is the NLL alone).
    assert model.evaluate(x, y, verbose=0) < 10
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    kl_after = float(tfbnn.kl_divergence(model))
    assert 0 < kl_after < kl_before


def test_save_load_keeps_the_posterior_priors_and_predictions(tmp_path):
    x, y = _data()
    model = _classifier()
    model.compile("adam", "sparse_categorical_crossentropy")
    tfbnn.set_kl_weight(model, 1 / len(x))
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    continual.posterior_as_prior(model)
    _perturb(model.layers[0])  # a KL that is not 0
    path = os.path.join(tmp_path, "vcl.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for a, b in zip(tfbnn.bayesian_layers(model), tfbnn.bayesian_layers(loaded)):
        for prior_a, prior_b in ((a.kernel_prior, b.kernel_prior), (a.bias_prior, b.bias_prior)):
            assert type(prior_b) is type(prior_a)
            if prior_a is not None:
                assert prior_b.loc.tobytes() == prior_a.loc.tobytes()
                assert prior_b.scale.tobytes() == prior_a.scale.tobytes()
    np.testing.assert_allclose(float(tfbnn.kl_divergence(loaded)), float(tfbnn.kl_divergence(model)), rtol=1e-6)
    assert float(tfbnn.kl_divergence(loaded)) > 1
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)  # the seed state is saved too
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_a_posterior_prior_of_the_wrong_shape_is_rejected_at_build():
    with pytest.raises(ValueError, match=r"Expected `kernel_prior` to be a Posterior prior of the weights' "
                                         r"shape \(4, 3\). Received: kernel_prior=Posterior\(shape=\(3, 4\)"):
        layers.DenseFlipout(3, kernel_prior=_posterior((3, 4)))(np.ones((2, 4), "float32"))
    with pytest.raises(ValueError, match=r"`bias_prior`.*shape \(3,\)"):
        layers.Conv2DFlipout(3, 2, bias_prior=_posterior((2,)))(np.ones((1, 4, 4, 2), "float32"))


@pytest.mark.parametrize("make, name", [
    (lambda: layers.DenseVariationalDropout(4, seed=0), "DenseVariationalDropout"),
    (lambda: layers.NodeDense(4, seed=0), "NodeDense"),
    (lambda: layers.MCDropout(0.5, seed=0), "MCDropout"),
])
def test_layers_without_a_gaussian_posterior_and_prior_are_refused(make, name):
    model = keras.Sequential([keras.Input((4,)), make(), layers.DenseFlipout(2, seed=1)])
    model(np.ones((1, 4), "float32"))
    with pytest.raises(ValueError, match=rf"supports the Bayes-by-Backprop.*Received: model with unsupported "
                                         rf"layers '[a-z_0-9]+' \({name}\)"):
        continual.posterior_as_prior(model)
    assert type(model.layers[-1].kernel_prior) is priors.Normal  # nothing changed


def test_posterior_as_prior_bad_input():
    with pytest.raises(ValueError, match="Expected `model` to contain a Bayesian layer"):
        continual.posterior_as_prior(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match=r"Expected `model` to be built.*unbuilt layers \['lonely'\]"):
        continual.posterior_as_prior(layers.DenseFlipout(2, name="lonely"))
    with pytest.raises(ValueError, match="Expected a Keras model or layer. Received: model='net'"):
        continual.posterior_as_prior("net")
    with pytest.raises(ValueError, match="non-empty list"):
        continual.posterior_as_prior([])


def test_a_multi_head_body_keeps_an_untrained_head_on_its_original_prior():
    inputs = keras.Input((6,))
    body = layers.DenseFlipout(8, activation="relu", seed=0)
    heads = [layers.DenseFlipout(2, seed=1 + i) for i in range(2)]
    features = body(inputs)
    first, second = (keras.Model(inputs, head(features)) for head in heads)
    continual.posterior_as_prior(first)
    assert type(body.kernel_prior) is priors.Posterior and type(heads[0].kernel_prior) is priors.Posterior
    assert type(heads[1].kernel_prior) is priors.Normal
    assert float(tfbnn.kl_divergence(second)) == pytest.approx(float(heads[1].kl_divergence()), rel=1e-6)


def _forgetting_by_hand(r, threshold, learned):
    last = r.shape[0] - 1
    forgotten, never, drops, transfers = [], [], [], []
    for j in range(r.shape[1]):
        if learned[j] == last:
            continue
        start = r[learned[j], j]
        if start < threshold:
            never.append(j)
        elif r[last, j] < threshold:
            forgotten.append(j)
        drops.append(max(r[learned[j]:last, j]) - r[last, j])
        transfers.append(r[last, j] - start)
    return forgotten, never, drops, sum(transfers) / len(transfers)


@pytest.mark.parametrize("columns", ["tasks", "classes"])
def test_forgetting_summary_matches_a_hand_count(columns):
    rng = np.random.default_rng(3)
    learned = np.arange(5) if columns == "tasks" else np.repeat(np.arange(5), 2)
    r = rng.uniform(0, 1, size=(5, len(learned)))
    for j, t in enumerate(learned):
        r[:t, j] = np.nan  # not trained yet: never read
    s = continual.forgetting_summary(r, threshold=0.4, learned_at=None if columns == "tasks" else learned)
    forgotten, never, drops, transfer = _forgetting_by_hand(r, 0.4, learned)
    assert s["forgotten"] == forgotten and s["num_forgotten"] == len(forgotten) and s["never_learned"] == never
    np.testing.assert_allclose(s["forgetting"], drops)
    assert s["backward_transfer"] == pytest.approx(transfer)
    assert s["average_accuracy"] == pytest.approx(r[-1].mean())
    assert s["average_accuracy_per_task"][1] == pytest.approx(np.mean(r[1][learned <= 1]))


@pytest.mark.parametrize("kwargs, match", [
    ({"accuracy": [0.5, 0.4]}, r"Expected `accuracy` to be a \(tasks, columns\) matrix"),
    ({"accuracy": [[0.5, 0.1], [1.5, 0.2]]}, r"accuracies in \[0, 1\].*max=1.5"),
    ({"accuracy": [[0.5, 0.1], [0.5, 0.2]], "threshold": 0}, "Expected `threshold` to be a number in"),
    ({"accuracy": [[0.5, 0.1, 0.2]]}, "Expected `learned_at` when `accuracy` has 3 columns for 1 tasks"),
    ({"accuracy": [[0.5, 0.1]], "learned_at": [0, 1]}, r"Expected `learned_at` to be 2 task indices in \[0, 1\)"),
])
def test_forgetting_summary_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        continual.forgetting_summary(**kwargs)


# -- the split-digits experiment -------------------------------------------------------------------


def test_split_digits_tasks_are_the_class_pairs():
    from tfbnn.experiments import vcl_split_digits

    ds = tfbnn.datasets.load_digits(seed=0)
    single, multi = (vcl_split_digits.split_tasks(ds, head) for head in ("single", "multi"))
    assert sum(len(t[0]) for t in single) == ds.num_examples and sum(len(t[2]) for t in single) == len(ds.x_test)
    for (x, y, _, y_test, classes), (_, y_multi, _, y_test_multi, _) in zip(single, multi):
        assert set(y) == set(y_test) == set(classes)
        np.testing.assert_array_equal(y_multi, (y == classes[1]).astype("int32"))
        np.testing.assert_array_equal(y_test_multi, (y_test == classes[1]).astype("int32"))


def _check_run_against_its_matrices(run, threshold):
    r = np.array([[np.nan if v == "nan" else v for v in row] for row in run["accuracy"]], float)
    c = np.array([[np.nan if v == "nan" else v for v in row] for row in run["class_accuracy"]], float)
    assert np.all(np.isnan(r[np.triu_indices(5, 1)])) and np.all((r[np.tril_indices(5)] >= 0) & (r <= 1)[
        np.tril_indices(5)])
    forgotten, never, _, transfer = _forgetting_by_hand(r, threshold, np.arange(5))
    assert run["tasks"]["forgotten"] == forgotten and run["tasks"]["num_forgotten"] == len(forgotten)
    assert run["tasks"]["never_learned"] == never
    assert run["tasks"]["backward_transfer"] == pytest.approx(transfer)
    assert run["tasks"]["average_accuracy"] == pytest.approx(r[-1].mean())
    class_forgotten, _, _, _ = _forgetting_by_hand(c, threshold, np.repeat(np.arange(5), 2))
    assert run["classes"]["forgotten"] == class_forgotten
    # A task's accuracy is the example-weighted mean of its two classes' accuracies.
    for t in range(5):
        for j in range(t + 1):
            assert min(c[t, 2 * j], c[t, 2 * j + 1]) - 1e-9 <= r[t, j] <= max(c[t, 2 * j], c[t, 2 * j + 1]) + 1e-9


@pytest.mark.heavy
def test_split_digits_quick_run_reports_forgetting_consistent_with_its_matrices(tmp_path, capsys):
    import csv
    import json

    from tfbnn.experiments import vcl_split_digits

    status = vcl_split_digits.main(["--quick", "--methods", "vcl", "--coreset-sizes", "5",
                                    "--threshold", "0.4", "--seeds", "3", "4", "--output-dir", str(tmp_path)])
    assert status == 0 and "Wrote" in capsys.readouterr().out
    with open(tmp_path / "results.json") as f:
        result = json.load(f)
    assert result["settings"]["seeds"] == [3] and result["settings"]["hidden_units"] == [32, 32]  # --quick
    assert [(r["method"], r["coreset_per_task"]) for r in result["runs"]] == [("vcl", 5)]
    for run in result["runs"]:
        _check_run_against_its_matrices(run, 0.4)
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    for row, run in zip(rows, result["runs"]):  # one seed: the row is that run
        assert float(row["forgotten_tasks"]) == run["tasks"]["num_forgotten"]
        assert float(row["forgotten_classes"]) == run["classes"]["num_forgotten"]
        assert float(row["average_accuracy"]) == pytest.approx(run["tasks"]["average_accuracy"])
    markdown = (tmp_path / "results.md").read_text()
    assert "| VCL | 5 |" in markdown and "Accuracy matrix, VCL, coreset 5" in markdown
    for name in ("accuracy_matrices.png", "accuracy_curves.png"):
        assert (tmp_path / name).stat().st_size > 10_000


@pytest.mark.heavy
def test_split_digits_multi_head_trains_one_head_per_task(tmp_path):
    from tfbnn.experiments import vcl_split_digits

    result = vcl_split_digits.run_experiment(
        output_dir=str(tmp_path), head="multi", methods=("finetune", "vcl"), coreset_sizes=(0,), steps=5,
        hidden_units=(8,), seeds=(0,), num_samples=2, threshold=0.5, verbose=False)
    assert [r["method"] for r in result["rows"]] == ["fine-tuning", "VCL"]
    for run in result["runs"]:
        _check_run_against_its_matrices(json.loads(json.dumps(run, default=lambda v: v.tolist())), 0.5)


@pytest.mark.parametrize("argv, match", [
    (["--head", "multi", "--coreset-sizes", "5"], "coreset is implemented for the single head only"),
    (["--threshold", "1.5"], "--threshold"),
    (["--methods", "ewc"], "--methods"),
    (["--coreset-sizes", "250"], "coreset sizes below 200"),
])
def test_split_digits_bad_options_give_one_error_line(argv, match, tmp_path, capsys):
    from tfbnn import cli

    assert cli.main(["vcl-split-digits", *argv, "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tfbnn: error: ") and match in lines[0]
