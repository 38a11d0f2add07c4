"""tfbnn.callbacks.PosteriorBoard: the event files read back equal the library's own computations."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import metrics, pruning


def _events(folder):
    """``{tag: {step: value}}``: scalars as floats, histograms as ``(k, 3)`` arrays, images as PNG bytes."""
    out = {}
    for path in glob.glob(os.path.join(folder, "posterior", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tensor = tf.make_ndarray(value.tensor)
                plugin = value.metadata.plugin_data.plugin_name
                if plugin == "scalars":
                    item = float(tensor)
                elif plugin == "images":
                    item = tensor[2]   # width, height, then the PNG
                else:
                    item = tensor
                out.setdefault(value.tag, {})[event.step] = item
    return out


def test_the_logged_values_equal_the_layers_and_the_metrics(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 5)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    model = keras.Sequential([keras.Input((5,)),
                              tfbnn.layers.DenseVariationalDropout(8, activation="relu", seed=0),
                              tfbnn.layers.DenseFlipout(2, activation="softmax", seed=1)])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    board = tfbnn.callbacks.PosteriorBoard(str(tmp_path), validation_data=(x, y), num_samples=8, histogram_every=2,
                                           validation_every=2, reliability_every=4, snr_thresholds=(0.83, 2.0))
    history = model.fit(x, y, epochs=4, batch_size=32, verbose=0,
                        callbacks=[tfbnn.KLAnnealing(len(x)), board, keras.callbacks.TensorBoard(str(tmp_path))])
    events = _events(str(tmp_path))
    vd, flipout = model.layers
    last = 3
    for layer in model.layers:   # the last epoch's values are the trained weights'
        kl = float(layer.kl_divergence())
        assert events[f"kl/{layer.name}"][last] == pytest.approx(kl, rel=1e-5)
        scaled = float(layer.kl_weight) * kl
        assert events[f"kl_scaled/{layer.name}"][last] == pytest.approx(scaled, rel=1e-5)
        assert events[f"kl_share/{layer.name}"][last] == pytest.approx(scaled / history.history["loss"][-1], rel=1e-5)
        snr = pruning.signal_to_noise(layer)
        for threshold in (0.83, 2.0):
            assert events[f"prunable/snr{threshold:g}/{layer.name}"][last] == pytest.approx(np.mean(snr < threshold))
        histogram = events[f"posterior_scale/{layer.name}"][last]
        scale = layer.kernel_scale().numpy()
        assert histogram[:, 2].sum() == scale.size
        assert histogram[0, 0] == pytest.approx(scale.min(), rel=1e-5)
        assert histogram[-1, 1] == pytest.approx(scale.max(), rel=1e-5)
    assert events["kl/total"][last] == pytest.approx(float(tfbnn.utils.kl_divergence(model)), rel=1e-5)
    assert events["kl_beta"][last] == pytest.approx(history.history["kl_beta"][-1])
    log_alpha = vd.log_alpha().numpy()
    assert events[f"sparsity/{vd.name}"][last] == pytest.approx(np.mean(log_alpha > 3.0))
    assert events[f"log_alpha/{vd.name}"][last][:, 2].sum() == log_alpha.size
    assert f"log_alpha/{flipout.name}" not in events
    res = board.last_prediction
    assert events["validation/nll"][last] == pytest.approx(float(metrics.negative_log_likelihood(res.mean_probs, y)),
                                                           rel=1e-5)
    assert events["validation/ece"][last] == pytest.approx(
        float(metrics.expected_calibration_error(res.mean_probs, y, 15)), rel=1e-5, abs=1e-7)
    assert events["validation/accuracy"][last] == pytest.approx(np.mean(res.mean_probs.argmax(1) == y))
    assert events["validation/mutual_information"][last] == pytest.approx(np.mean(res.mutual_information), rel=1e-5)
    # Every so many epochs, from epoch 0, and the last epoch.
    assert sorted(events[f"posterior_scale/{vd.name}"]) == sorted(events["validation/nll"]) == [0, 2, 3]
    assert sorted(events["validation/reliability_diagram"]) == [0, 3]
    assert sorted(events["kl/total"]) == [0, 1, 2, 3]
    image = tf.image.decode_png(events["validation/reliability_diagram"][3]).numpy()
    assert image.shape[0] > 100 and image.shape[1] > 100 and image.shape[2] == 4
    # The image is the last validation predictive's diagram (rendering is deterministic), not another's.
    np.testing.assert_array_equal(image, board._reliability_image(res.mean_probs, y)[0].numpy())
    assert np.any(image != board._reliability_image(np.full_like(res.mean_probs, 0.5), y)[0].numpy())
    assert sorted(os.listdir(tmp_path)) == ["posterior", "train"]   # beside Keras' own TensorBoard callback


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(ValueError, match="log_dir"):
        tfbnn.callbacks.PosteriorBoard(3)
    with pytest.raises(ValueError, match="validation_data"):
        tfbnn.callbacks.PosteriorBoard(str(tmp_path), validation_data=np.zeros(3))
    with pytest.raises(ValueError, match="snr_thresholds"):
        tfbnn.callbacks.PosteriorBoard(str(tmp_path), snr_thresholds=(0.5, -1.0))
    with pytest.raises(ValueError, match="reliability_every"):
        tfbnn.callbacks.PosteriorBoard(str(tmp_path), reliability_every=0)
    with pytest.raises(ValueError, match="multiple of `validation_every`"):
        tfbnn.callbacks.PosteriorBoard(str(tmp_path), validation_every=3, reliability_every=4)


def test_a_model_built_by_its_first_batch_gets_its_layer_summaries(tmp_path):
    """The board finds the prunable layers at the first epoch's end: a Sequential without an Input is built
    by fit's first batch, after on_train_begin."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 3)).astype("float32"), rng.integers(0, 2, 32)
    model = keras.Sequential([tfbnn.layers.DenseFlipout(2, activation="softmax", seed=0)])
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=2, verbose=0, callbacks=[tfbnn.KLAnnealing(len(x)),
                                                    tfbnn.callbacks.PosteriorBoard(str(tmp_path), snr_thresholds=(1.0,))])
    events = _events(str(tmp_path))
    name = model.layers[0].name
    assert sorted(events[f"prunable/snr1/{name}"]) == [0, 1]
    assert events[f"prunable/snr1/{name}"][1] == pytest.approx(np.mean(pruning.signal_to_noise(model.layers[0]) < 1.0))
