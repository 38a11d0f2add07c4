"""Bad input that used to reach the user raw (issue 28): each case gives a clear error naming the argument."""

import numpy as np
import pytest
import tensorflow as tf

import tfbnn


# -- layers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("inference_mode", ["sample", "mean"])
def test_embedding_refuses_out_of_range_ids_in_both_modes(inference_mode):
    layer = tfbnn.layers.EmbeddingReparameterization(10, 3, inference_mode=inference_mode, seed=0)
    with pytest.raises(ValueError, match=r"ids in \[0, input_dim\) with input_dim=10.*min=-1, max=50"):
        layer(np.array([[1, 50, -1]]))
    assert layer(np.array([[0, 9]])).shape == (1, 2, 3)


def test_embedding_refuses_out_of_range_ids_in_a_compiled_step():
    layer = tfbnn.layers.EmbeddingReparameterization(10, 3, seed=0)
    call = tf.function(layer)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input_dim=10"):
        call(tf.constant([[1, 10]]))


@pytest.mark.parametrize("make, shape", [
    (lambda: tfbnn.layers.DenseBatchEnsemble(2, ensemble_size=2), (3, 4)),
    (lambda: tfbnn.layers.DenseRank1(2, ensemble_size=2, kl_weight=0.1), (3, 4)),
    (lambda: tfbnn.layers.Conv2DBatchEnsemble(2, 2, ensemble_size=2), (3, 4, 4, 1)),
    (lambda: tfbnn.layers.Conv2DRank1(2, 2, ensemble_size=2, kl_weight=0.1), (3, 4, 4, 1)),
])
def test_ensemble_layers_refuse_a_batch_that_is_not_a_multiple_of_ensemble_size(make, shape):
    layer = make()
    with pytest.raises(ValueError, match=r"multiple of ensemble_size=2 .* Received: inputs with batch size 3"):
        layer(np.ones(shape, "float32"))
    assert layer(np.ones((4, *shape[1:]), "float32")).shape[0] == 4
    assert layer(np.ones(shape, "float32"), training=True).shape[0] == 3  # a partial batch in training


def test_ensemble_layer_refuses_an_uneven_batch_of_unknown_size_when_compiled():
    layer = tfbnn.layers.DenseBatchEnsemble(2, ensemble_size=2)
    call = tf.function(lambda x: layer(x), input_signature=[tf.TensorSpec([None, 4])])
    assert call(tf.ones((4, 4))).shape == (4, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"multiple of ensemble_size=2"):
        call(tf.ones((3, 4)))
