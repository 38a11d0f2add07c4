import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import testing
from tfbnn.layers import MCDropout, MCSpatialDropout2D


@pytest.mark.parametrize(
    "cls, kwargs, shape",
    [(MCDropout, {"rate": 0.3, "seed": 1}, (4, 6)),
     (MCDropout, {"rate": 0.5, "noise_shape": (None, 1, 5), "seed": 2}, (3, 4, 5)),
     (MCSpatialDropout2D, {"rate": 0.5, "seed": 3}, (2, 5, 5, 8))],
)
def test_mc_dropout_basics(cls, kwargs, shape):
    testing.run_layer_test(cls, kwargs, input_shape=shape, expected_output_shape=shape,
                           expected_num_losses=0, expected_num_seed_generators=1,
                           expected_num_trainable_weights=0, run_training=False)


def test_dropout_stays_on_at_inference_with_the_right_rate_and_scale():
    layer = MCDropout(0.25, seed=0)
    x = np.ones((200, 500), "float32")
    a, b = layer(x).numpy(), layer(x, training=False).numpy()
    assert not np.array_equal(a, b)
    assert abs((a == 0).mean() - 0.25) < 0.01
    np.testing.assert_allclose(a[a != 0], 1 / 0.75, rtol=1e-6)
    assert abs(a.mean() - 1.0) < 0.01  # inverted dropout keeps the expectation


def test_mean_mode_turns_dropout_off_for_the_whole_model():
    x = np.random.default_rng(0).normal(size=(8, 6)).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              MCDropout(0.5, seed=1), keras.layers.Dense(2)])
    assert not np.allclose(model.predict(x, verbose=0), model.predict(x, verbose=0))
    with tfbnn.posterior_mean(model):
        dense_only = model.layers[2](model.layers[0](x))
        np.testing.assert_allclose(model.predict(x, verbose=0), dense_only, rtol=1e-5, atol=1e-6)
    assert tfbnn.stochastic_layers(model) == [model.layers[1]] and tfbnn.bayesian_layers(model) == []


def test_spatial_dropout_drops_whole_feature_maps():
    y = MCSpatialDropout2D(0.5, seed=4)(np.ones((6, 4, 4, 10), "float32")).numpy()
    per_map = y.reshape(6, 16, 10)
    assert np.all((per_map == 0).all(axis=1) | (per_map != 0).all(axis=1))
    assert 0 < (per_map == 0).all(axis=1).mean() < 1


def test_vectorized_mc_prediction_with_mc_dropout_gives_distinct_samples():
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              MCDropout(0.3, seed=1), keras.layers.Dense(3, activation="softmax")])
    res = tfbnn.predict(model, x, num_samples=8, return_samples=True)
    s = res.samples
    assert all(not np.allclose(s[i], s[j]) for i in range(8) for j in range(i + 1, 8))
    assert np.all(res.mutual_information > 0)


@pytest.mark.parametrize("kwargs, match", [({"rate": 1.0}, "rate=1.0"), ({"rate": -0.1}, "rate=-0.1"),
                                           ({"rate": "x"}, "rate='x'")])
def test_bad_rate(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MCDropout(**kwargs)
    with pytest.raises(ValueError, match="data_format='nchw'"):
        MCSpatialDropout2D(0.1, data_format="nchw")
