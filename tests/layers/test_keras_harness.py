"""Keras' own checks, through the one harness, on the layers users bring from TFP, Edward2 and bayesian-torch.

``tfbnn.testing.run_layer_test(..., keras_checks=True)`` adds Keras' harness
(``keras.src.testing.TestCase.run_layer_test``, not public API) to its own checks: what
Keras promises of any layer (config round trip, build from a shape, symbolic and eager
calls with the same output shape, the weight and loss counts, a training run with
``fit``, and the mixed-precision check: float32 variables, outputs in the compute
dtype). Here only Keras' part runs (the rest of the harness runs per family in their own
files); the recurrent layers run it in ``tests/layers/test_recurrent.py``.
"""

import pytest

import tfbnn
from tfbnn import testing

KL = {"kl_weight": 0.01, "seed": 1}

# (id, class, init kwargs, input shape, output shape, trainable weights, seed generators, losses)
# Conv3D, the transposed convolutions, DenseVariational (mean field), NodeDenseFlow, NodeConv2DFlow,
# EnsembleTile and EmbeddingReparameterization run Keras' harness (the same call, the same options) in
# the conformance harness, tests/test_conformance.py (tfbnn.testing.cases()); the cases here add options.
CASES = [
    ("DenseRank1", tfbnn.layers.DenseRank1, {"units": 3, "ensemble_size": 2, "activation": "relu", **KL},
     (4, 5), (4, 3), 6, 1, 1),
    ("Conv2DRank1", tfbnn.layers.Conv2DRank1, {"filters": 3, "kernel_size": 3, "ensemble_size": 2, **KL},
     (4, 5, 5, 2), (4, 3, 3, 3), 6, 1, 1),
    ("DenseBatchEnsemble", tfbnn.layers.DenseBatchEnsemble, {"units": 3, "ensemble_size": 2, "seed": 1},
     (4, 5), (4, 3), 4, 0, 0),
    ("Conv2DBatchEnsemble", tfbnn.layers.Conv2DBatchEnsemble,
     {"filters": 3, "kernel_size": 3, "padding": "same", "ensemble_size": 2, "seed": 1}, (4, 5, 5, 2), (4, 5, 5, 3),
     4, 0, 0),
    ("DenseVariational-full_covariance", tfbnn.layers.DenseVariational,
     {"units": 3, "make_posterior_fn": "full_covariance", **KL}, (4, 5), (4, 3), 2, 1, 1),
    ("DenseVariational-low_rank", tfbnn.layers.DenseVariational,
     {"units": 3, "make_posterior_fn": "low_rank", "make_prior_fn": "trainable_normal", **KL}, (4, 5), (4, 3), 4,
     1, 1),
    # EnsembleMean is not here: its rows are E * B in training (passed through) and B at inference,
    # so its static output shape leaves the batch None, which Keras' harness compares with the call's.
]


def _keras_only(cls, kwargs, shape, out, weights, seeds, losses, input_data=None):
    """The one harness with Keras' checks on and its own save/load, training and mixed-precision parts off."""
    return testing.run_layer_test(cls, kwargs, input_shape=shape, expected_output_shape=out,
                                  expected_num_losses=losses, expected_num_seed_generators=seeds,
                                  expected_num_trainable_weights=weights, run_save_load=False, run_training=False,
                                  run_mixed_precision=False, input_data=input_data, keras_checks=True,
                                  run_training_check=True, run_mixed_precision_check=True)


@pytest.mark.parametrize("cls, kwargs, shape, out, weights, seeds, losses",
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_keras_run_layer_test(cls, kwargs, shape, out, weights, seeds, losses):
    _keras_only(cls, kwargs, shape, out, weights, seeds, losses)


def test_the_harness_reports_what_keras_finds_and_refuses_keras_options_without_its_checks():
    with pytest.raises(AssertionError):  # Keras counts 4 trainable weights, not 5
        _keras_only(tfbnn.layers.DenseFlipout, {"units": 3, **KL}, (4, 5), (4, 3), 5, 1, 1)
    with pytest.raises(ValueError, match=r"keras_checks=True.*supports_masking"):
        testing.run_layer_test(tfbnn.layers.DenseFlipout, {"units": 3}, (4, 5), (4, 3), supports_masking=True)
    with pytest.raises(ValueError, match=r"expected_num_trainable_weights=None"):
        testing.run_layer_test(tfbnn.layers.DenseFlipout, {"units": 3}, (4, 5), (4, 3), run_save_load=False,
                               run_training=False, run_mixed_precision=False, keras_checks=True)
