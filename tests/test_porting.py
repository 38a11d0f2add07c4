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
    assert tfbnn.export.export(model, str(tmp_path / "r"), num_samples=4, task="regression") == str(tmp_path / "r")
    with pytest.raises(ValueError, match=r"ends in a GaussianHead, a regression head. Received: task='classification'"):
        tfbnn.export.export(model, str(tmp_path / "c"), task="classification")
    with pytest.raises(ValueError, match=r"Expected `task` in \('classification', 'regression'\) or None"):
        tfbnn.export.export(model, str(tmp_path / "c"), task="auto")
