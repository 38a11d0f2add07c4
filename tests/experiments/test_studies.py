"""What training.run gained for the studies: a Gaussian likelihood, steps per epoch, given data,
a study's own evaluation, a model seed apart from the run's (issue 19, part 1)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tfbnn import training
from tfbnn.datasets import DataPipeline


def _pipeline(n=24, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 1)).astype("float32")
    y = (x**3 + 0.1 * rng.standard_normal((n, 1))).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return DataPipeline(train=ds.batch(n), validation=None, test=ds.batch(8), num_examples=n, num_validation=0,
                        num_test=n, num_classes=None, input_shape=(1,), name="toy", batch_size=n)


def _recipe(**changes):
    base = dict(name="toy-bbb", model="mlp", model_options={"hidden_units": (8,), "outputs": 1}, method="bbb",
                method_options={"estimator": "reparameterization"}, dataset="toy", epochs=2, steps_per_epoch=3,
                likelihood="gaussian", noise_std=0.1, eval_samples=4, learning_rate=1e-2)
    return training.Recipe(**{**base, **changes})


def test_gaussian_likelihood_needs_its_noise_and_only_it_takes_one():
    with pytest.raises(ValueError, match="Received: likelihood='gaussian', noise_std=None"):
        _recipe(noise_std=None)
    with pytest.raises(ValueError, match="Received: likelihood='categorical', noise_std=0.1"):
        _recipe(likelihood="categorical")
    with pytest.raises(ValueError, match="Received: likelihood='poisson'"):
        _recipe(likelihood="poisson")
    with pytest.raises(ValueError, match="Received: steps_per_epoch=0"):
        _recipe(steps_per_epoch=0)
    assert training.Recipe.from_dict(_recipe().to_dict()) == _recipe()


def test_fixed_noise_gaussian_nll_is_the_closed_form():
    from tfbnn.training.run import fixed_noise_gaussian_nll

    y, f = np.array([[1.0, -2.0]], "float32"), np.array([[0.5, 0.0]], "float32")
    expected = np.mean(0.5 * ((y - f) / 0.5) ** 2) + math.log(0.5) + 0.5 * math.log(2 * math.pi)
    assert float(fixed_noise_gaussian_nll(0.5)(y, f)[0]) == pytest.approx(expected, rel=1e-6)


def test_run_trains_a_regression_recipe_on_given_data_for_its_steps(tmp_path):
    result = training.run(_recipe(), output_dir=str(tmp_path / "run"), verbose=0, data=_pipeline(), quiet=True)
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert int(result.model.optimizer.iterations.numpy()) == 2 * 3  # epochs x steps_per_epoch, one batch each
    test = result.test
    assert np.isfinite(test["rmse"]) and np.isfinite(test["nll"]) and test["epistemic_std"] > 0
    assert test["num_samples"] == 4 and test["num_test"] == 24 and test["kl"] > 0
    assert {p.rsplit("/", 1)[-1] for p in result.files} == {"recipe.json", "history.csv", "history.json",
                                                              "learning_curves.png", "results.json", "model.keras"}


def test_a_study_evaluation_and_model_seed(tmp_path):
    seen = {}

    def evaluate(model, recipe, data):
        seen["model"] = model
        return {"answer": 42.0}

    recipe = _recipe(model_options={"hidden_units": (8,), "outputs": 1, "seed": 7}, epochs=1)
    result = training.run(recipe, output_dir=str(tmp_path / "a"), verbose=0, data=_pipeline(), evaluate=evaluate,
                          quiet=True)
    assert result.test == {"answer": 42.0} and seen["model"] is result.model
    # model_options["seed"] seeds the model's stochastic layers (their noise) apart from the run's seed.
    import keras

    from tfbnn.training.run import build_model

    x = np.linspace(-1, 1, 5, dtype="float32")[:, None]

    def draws(r):
        keras.utils.set_random_seed(r.seed)
        model = build_model(r, _pipeline())
        return [model(x, training=True).numpy() for _ in range(2)]

    once, twice = draws(recipe), draws(recipe)
    other = draws(recipe.replace(model_options={"hidden_units": (8,), "outputs": 1, "seed": 8}))
    assert all(np.array_equal(a, b) for a, b in zip(once, twice))
    assert not np.array_equal(once[0], other[0])
