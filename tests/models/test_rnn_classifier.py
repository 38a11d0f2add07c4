"""The LSTM / GRU sentiment classifier of the zoo, its data (synthetic reviews, IMDB) and its recipe."""

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfbnn
from tfbnn import datasets, training
from tfbnn import models as zoo
from tfbnn.datasets import corruptions

N = 1000


@pytest.mark.parametrize("cell, gates, extra", [("lstm", 4, 0), ("gru", 3, 3)])
def test_deterministic_parameter_count_is_the_closed_form(cell, gates, extra):
    v, e, u, c = 50, 6, 5, 3
    model = zoo.rnn_classifier(vocab_size=v, max_length=7, embed_dim=e, units=u, num_classes=c, cell=cell)
    # embedding + recurrent kernel, recurrent kernel and bias (the GRU: a second bias) + head
    assert model.count_params() == v * e + gates * u * (e + u + 1) + extra * u + u * c + c


@pytest.mark.parametrize("method, expected", [
    ("deterministic", ["Embedding", "LSTM", "Dense"]),
    ("mc_dropout", ["Embedding", "LSTM", "MCDropout", "Dense"]),
    ("bbb", ["Embedding", "LSTMReparameterization", "DenseFlipout"]),
])
def test_methods_choose_the_layers_and_the_kl_scale(method, expected):
    model = zoo.build("rnn_classifier", method, vocab_size=30, max_length=6, num_examples=N, seed=0)
    assert [type(layer).__name__ for layer in model.layers[1:]] == expected
    assert all(layer.get_config()["kl_weight"] == 1 / N for layer in tfbnn.bayesian_layers(model))
    x = np.random.default_rng(0).integers(0, 30, size=(3, 6))
    assert tfbnn.predict(model, x, num_samples=3).mean_probs.shape == (3, 2)


def test_vd_needs_a_deterministic_recurrent_body():
    with pytest.raises(ValueError, match="method='vd', bayesian_layers='all'"):
        zoo.rnn_classifier("vd", vocab_size=30, num_examples=N)
    model = zoo.rnn_classifier("vd", vocab_size=30, num_examples=N, bayesian_layers="last", cell="gru")
    assert [type(layer).__name__ for layer in model.layers[2:]] == ["GRU", "DenseVariationalDropout"]


@pytest.mark.parametrize("call, message", [
    (lambda: zoo.rnn_classifier(), r"needs `vocab_size`.*Received: vocab_size=None"),
    (lambda: zoo.rnn_classifier(vocab_size=1), r"Received: vocab_size=1"),
    (lambda: zoo.rnn_classifier(vocab_size=9, units=0), r"Received: units=0"),
    (lambda: zoo.rnn_classifier(vocab_size=9, cell="rnn"), r"Received: cell='rnn'"),
    (lambda: zoo.rnn_classifier("bbb", vocab_size=9), r"Received: num_examples=None"),
])
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_padding_is_masked():
    """Trailing padding (id 0) does not change the prediction: the recurrent layer skips masked steps."""
    model = zoo.rnn_classifier("bbb", vocab_size=20, max_length=8, num_examples=N, seed=1)
    x = np.array([[3, 4, 5, 0, 0, 0, 0, 0]])
    short = zoo.rnn_classifier("bbb", vocab_size=20, max_length=3, num_examples=N, seed=1)
    short.set_weights(model.get_weights())
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(short):
        np.testing.assert_allclose(model(x).numpy(), short(x[:, :3]).numpy(), rtol=1e-5, atol=1e-6)


def test_synthetic_reviews_pipeline_is_offline_seeded_and_vectorizes():
    data = datasets.load_pipeline("synthetic_reviews", batch_size=64, validation_fraction=0.1, seed=3)
    assert (data.num_examples, data.num_validation, data.num_test, data.num_classes) == (1440, 160, 400, 2)
    again = datasets.load_pipeline("synthetic_reviews", batch_size=64, validation_fraction=0.1, seed=3)
    first, second = next(iter(data.test)), next(iter(again.test))
    assert first[0].numpy().tolist() == second[0].numpy().tolist()
    reference = datasets.text.make_synthetic_reviews(seed=3)
    assert [t.decode() for t in first[0].numpy()] == list(reference.x_test[:64])


def test_imdb_through_the_recipe_data_path():
    recipe = training.get_recipe("reviews-lstm-bbb").replace(dataset="imdb_reviews", max_examples=24,
                                                             max_test_examples=8, batch_size=8)
    with tfds.testing.mock_data(num_examples=24):
        data = training.load_data(recipe)
    x, y = next(iter(data.train))
    assert data.input_shape == (64,) and x.shape[1] == 64 and x.dtype.is_integer
    assert data.num_examples == 24 - round(0.1 * 24) and set(y.numpy()) <= {0, 1}


def test_token_replacement_replaces_the_fraction_and_keeps_padding():
    rng = np.random.default_rng(0)
    x = rng.integers(1, 50, size=(200, 30))
    x[:, 20:] = 0
    out = corruptions.token_replacement(x, 0.3, seed=1, vocab_size=50)
    changed = out[:, :20] != x[:, :20]
    # a replaced token keeps its id with probability 1 / 49
    assert abs(changed.mean() - 0.3 * 48 / 49) < 0.02
    assert np.all(out[:, 20:] == 0) and out.min() >= 0 and out.max() < 50 and out.dtype == x.dtype
    np.testing.assert_array_equal(out, corruptions.token_replacement(x, 0.3, seed=1, vocab_size=50))
    np.testing.assert_array_equal(corruptions.token_replacement(x, 0.0, seed=1), x)
    with pytest.raises(ValueError, match="Received: x of dtype float"):
        corruptions.token_replacement(x.astype("float32"), 0.3)
    with pytest.raises(ValueError, match="vocab_size=1"):
        corruptions.token_replacement(x, 0.3, vocab_size=1)


@pytest.mark.heavy
@pytest.mark.parametrize("method", ["bbb", "mc_dropout"])
def test_the_recipe_learns_above_chance_on_the_synthetic_reviews(method, tmp_path):
    recipe = training.get_recipe("reviews-lstm-bbb")
    options = {"rate": 0.1} if method == "mc_dropout" else recipe.method_options
    recipe = recipe.replace(method=method, method_options=options, max_examples=800, max_test_examples=200, epochs=3, eval_samples=4,
                            model_options={**recipe.model_options, "max_length": 40, "units": 16, "embed_dim": 16})
    keras.utils.set_random_seed(0)
    result = training.run(recipe, output_dir=str(tmp_path / "out"), verbose=0, jit_compile=False)
    assert result.test["accuracy"] > 0.65  # chance: 0.5 (balanced labels)
    assert result.test["shifted"]["accuracy"] < result.test["accuracy"]  # half of the words replaced
