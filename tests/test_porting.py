"""What a user porting a model to tfbnn hit (issue 28, "What a user porting a model hits")."""

import numpy as np
import pytest
import tensorflow as tf

import tfbnn


def _gaussian_model():
    import keras
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), tfbnn.layers.DenseFlipout(2, kl_weight=0.1, seed=0),
                             tfbnn.GaussianHead()])


# -- export infers the task from the head -----------------------------------------------------------
def test_export_infers_regression_from_a_gaussian_head(tmp_path):
    model = _gaussian_model()
    path = tfbnn.export.export(model, str(tmp_path / "g"), num_samples=4)  # was: "a regression head" error
    served = tf.saved_model.load(path)
    summary = served.summary_seeded(np.ones((2, 3), "float32"), tf.constant(0, tf.int64))
    assert sorted(summary) == ["aleatoric_std", "epistemic_std", "mean"]
    with pytest.raises(ValueError, match=r"The export folder exists"):  # the explicit, agreeing task passed its check
        tfbnn.export.export(model, path, num_samples=4, task="regression")
    with pytest.raises(ValueError, match=r"ends in a GaussianHead, a regression head. Received: task='classification'"):
        tfbnn.export.export(model, str(tmp_path / "c"), task="classification")
    with pytest.raises(ValueError, match=r"Expected `task` in \('classification', 'regression'\) or None"):
        tfbnn.export.export(model, str(tmp_path / "c"), task="auto")


# -- metrics on a distribution head -----------------------------------------------------------------
def _regression_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    return x, (x[:, :1] * 2 + 0.1).astype("float32")


def _head_model():
    import keras
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), tfbnn.GaussianHead()])


@pytest.mark.parametrize("metric", ["rmse_instance", "mse"])
def test_a_plain_metric_on_a_regression_head_is_refused(metric):
    import keras
    x, y = _regression_data()
    model = _head_model()
    plain = keras.metrics.RootMeanSquaredError() if metric == "rmse_instance" else "mse"
    model.compile("sgd", tfbnn.likelihoods.DistributionNLL(model.layers[-1]), metrics=[plain])
    name = "root_mean_squared_error" if metric == "rmse_instance" else "mse"
    for run in (lambda: model.evaluate(x, y, verbose=0), lambda: model.fit(x, y, epochs=1, verbose=0)):
        with pytest.raises(ValueError, match=rf"predictive mean of the model's GaussianHead.*HeadMean.*"
                                             rf"Received: metrics=\['{name}'\]"):
            run()


def test_head_mean_reports_the_metric_of_the_predictive_mean():
    import keras
    x, y = _regression_data()
    model = _head_model()
    head = model.layers[-1]
    model.compile("sgd", tfbnn.likelihoods.DistributionNLL(head),
                  metrics=[tfbnn.metrics.HeadMean(keras.metrics.RootMeanSquaredError(), head)])
    result = model.evaluate(x, y, verbose=0, batch_size=8, return_dict=True)
    mean = model.predict(x, verbose=0)[:, :1]  # [loc, scale]: the Gaussian's mean is loc
    expected = np.sqrt(np.mean((mean - y) ** 2))
    np.testing.assert_allclose(result["root_mean_squared_error"], expected, rtol=1e-5)
    plain = np.sqrt(np.mean((model.predict(x, verbose=0) - y) ** 2))  # what the plain metric reported
    assert abs(plain - expected) > 0.1


def test_head_mean_round_trips_its_config_and_maps_classification_heads_to_probabilities():
    import keras
    metric = tfbnn.metrics.HeadMean("mae", tfbnn.GaussianHead(min_scale=0.01), name="mae_of_mean")
    again = tfbnn.metrics.HeadMean.from_config(keras.metrics.serialize(metric)["config"])
    assert again.name == "mae_of_mean" and again.head.get_config()["min_scale"] == 0.01
    params = np.array([[1.0, 0.3], [-1.0, 2.0]], "float32")
    again.update_state(np.array([[0.0], [0.0]]), tfbnn.GaussianHead(min_scale=0.01)(params))
    np.testing.assert_allclose(float(again.result()), 1.0, rtol=1e-6)  # |0 - 1| and |0 + 1|
    head = tfbnn.likelihoods.BernoulliHead()
    accuracy = tfbnn.metrics.HeadMean(keras.metrics.BinaryAccuracy(), head)
    logits = np.array([[2.0], [-0.3], [0.2]], "float32")  # p(y = 1) = sigmoid: 0.88, 0.43, 0.55
    accuracy.update_state(np.array([[1.0], [1.0], [0.0]]), head(logits))
    np.testing.assert_allclose(float(accuracy.result()), 1 / 3, rtol=1e-6)
    with pytest.raises(ValueError, match=r"Expected `head` to be a tfbnn distribution head"):
        tfbnn.metrics.HeadMean("mae", "gaussian")


# -- no retracing warnings from tfbnn.predict and SWAG ---------------------------------------------
@pytest.fixture
def tf_warnings():
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    yield lambda: [r.getMessage() for r in records if "retracing" in r.getMessage()]
    logger.removeHandler(handler)


def test_repeated_predictions_do_not_warn_of_retracing(tf_warnings):
    import keras
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(20, 3)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), tfbnn.layers.DenseFlipout(2, activation="softmax", kl_weight=0.1)])
    for i in range(7):  # new batch sizes, new T (one graph each, by design)
        tfbnn.predict(model, x[: 5 + i], num_samples=2 + i)
    for i in range(7):
        tfbnn.predict(model, x[: 5 + i], num_samples=4)
    assert tf_warnings() == []


def test_weight_posterior_forward_passes_trace_at_most_twice(tf_warnings):
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    flat = tfbnn.inference.FlatWeights(model)
    theta = flat.flatten()
    for t, n in [(2, 5), (3, 6), (4, 7), (5, 8), (6, 9), (7, 10)]:  # SWAG draws T vectors; batches vary
        out = flat.outputs(np.tile(theta, (t, 1)), np.ones((n, 3), "float32"))
        assert out.shape == (t, n, 1)
    assert flat._compiled.experimental_get_tracing_count() <= 2
    for seed in range(6):  # a new posterior per seed, each with its own FlatWeights
        tfbnn.inference.FlatWeights(model).outputs(theta[None], np.ones((2, 3), "float32"))
    assert tf_warnings() == []


# -- SWAG warns when its snapshots coincide ---------------------------------------------------------
def test_swag_warns_once_when_a_snapshot_repeats_the_previous_one():
    import warnings

    swag = tfbnn.swag.SWAG()
    theta = np.array([0.5, -2.0, 3.0])
    swag.collect(theta)
    with pytest.warns(UserWarning, match=r"SWAG snapshot 2 equals snapshot 1 .*collapse the SWAG covariance.*"
                                         r"keras.utils.set_random_seed.*same order every epoch"):
        swag.collect(theta + 1e-8)  # float32 weights cycling back to the same values
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swag.collect(theta)  # warned once already
    assert swag.num_snapshots == 3 and np.all(swag.diagonal() < 1e-15)


def test_swag_does_not_warn_for_distinct_snapshots():
    import warnings

    swag = tfbnn.swag.SWAG()
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            swag.collect(rng.normal(size=5))
        swag.collect(np.full(5, 1e3))
        swag.collect(np.full(5, 1e3 + 1e-3))  # small against 1e3, still above float32 resolution
    assert swag.num_snapshots == 6


# -- DenseVariational: the documented start, and TFP's ------------------------------------------------
def test_dense_variational_starts_at_small_scales_unless_given_tfps_start():
    import math

    default = tfbnn.layers.DenseVariational(3, kl_weight=0.1, seed=0)
    default.build((None, 4))
    q = default.posterior.distribution()
    np.testing.assert_allclose(q.stddev().numpy(), 0.01, rtol=1e-4)  # init_scale=0.01
    assert 0 < np.std(q.mean().numpy()) < 0.2  # random_normal(stddev=0.05) means

    tfp_start = tfbnn.posteriors.MeanFieldNormal(init_scale=math.log(2.0), loc_initializer="zeros")
    layer = tfbnn.layers.DenseVariational(3, tfp_start, "normal", kl_weight=0.1, seed=0)
    layer.build((None, 4))
    q = layer.posterior.distribution()
    np.testing.assert_allclose(q.stddev().numpy(), np.log1p(np.exp(0.0)), rtol=1e-4)  # TFP: softplus(0)
    np.testing.assert_array_equal(q.mean().numpy(), np.zeros(4 * 3 + 3))
