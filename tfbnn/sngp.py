"""SNGP (Liu et al. 2020): what a model with a :class:`tfbnn.layers.RandomFeatureGaussianProcess` output needs.

A spectral-normalized neural Gaussian process is a deterministic network whose hidden
layers are spectrally normalized (:class:`tfbnn.layers.SpectralNormalization`) and whose
output layer is a random-feature GP with a Laplace covariance
(:class:`tfbnn.layers.RandomFeatureGaussianProcess`). One forward pass gives the
mean-field predictive; the GP's posterior variance is an epistemic score.

* :class:`ResetCovariance`: the callback that starts each epoch's precision sum afresh
  (``tfbnn.models.mlp("sngp", ...)`` trained by :func:`tfbnn.training.run` gets it);
* :func:`gp_layers`: the GP layers of a model;
* :func:`predictive_variance`: ``diag(Phi Sigma Phi^T)`` of a model's GP layer for inputs
  (the ``sngp_variance`` score of :func:`tfbnn.evaluation.ood_scores`).

Example:
    >>> import numpy as np, tfbnn
    >>> model = tfbnn.models.mlp("sngp", hidden_units=(8,), input_shape=(4,), num_classes=3, num_inducing=32, seed=0)
    >>> model.compile("adam", "sparse_categorical_crossentropy")
    >>> x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    >>> _ = model.fit(x, np.arange(16) % 3, epochs=2, verbose=0, callbacks=[tfbnn.sngp.ResetCovariance()])
    >>> tfbnn.sngp.predictive_variance(model, x).shape
    (16,)

Reference:
    Liu, Lin, Padhy, Tran, Bedrax-Weiss, Lakshminarayanan. Simple and Principled Uncertainty
    Estimation with Deterministic Deep Learning via Distance Awareness. NeurIPS 2020.
"""

import keras
import numpy as np

from tfbnn._internal import checks, keras_private
from tfbnn.layers.gp import RandomFeatureGaussianProcess

__all__ = ["ResetCovariance", "gp_layers", "predictive_variance"]


def gp_layers(model):
    """Every :class:`tfbnn.layers.RandomFeatureGaussianProcess` in ``model`` (nested ones included)."""
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(f"Expected a Keras model or layer. Received: model={model!r}")
    return [layer for layer in keras_private.sublayers(model, include_self=True)
            if isinstance(layer, RandomFeatureGaussianProcess)]


class ResetCovariance(keras.callbacks.Callback):
    """Resets every GP layer's precision to ``ridge * I`` at the start of each epoch.

    With ``gp_cov_momentum < 0`` (the default) the precision is the exact sum over one
    epoch, ``ridge * I + sum_i w_i phi_i phi_i^T`` (Liu et al. 2020, eq. 9): without the
    reset it would add up every epoch's features. A moving average (momentum >= 0) is
    reset too, so that each epoch's average starts from the prior.

    Example:
        >>> import tfbnn
        >>> callback = tfbnn.sngp.ResetCovariance()
    """

    def on_epoch_begin(self, epoch, logs=None):
        layers = gp_layers(self.model)
        if not layers:
            raise ValueError("ResetCovariance needs a model with a RandomFeatureGaussianProcess layer. "
                             f"Received: model={self.model.name!r}")
        for layer in layers:
            layer.reset_covariance()


def _only_gp_layer(model):
    layers = gp_layers(model)
    if len(layers) != 1:
        raise ValueError(f"Expected a model with exactly one RandomFeatureGaussianProcess layer. "
                         f"Received: model={getattr(model, 'name', model)!r} with {len(layers)}")
    return layers[0]


def predictive_variance(model, x, batch_size=256):
    """``diag(Phi Sigma Phi^T)``: the GP posterior variance of the logits of each input (Liu et al. 2020, eq. 9).

    Args:
        model: a functional or Sequential ``keras.Model`` with one GP layer.
        x: ``(B, ...)`` inputs of the model.
        batch_size: int >= 1. Default 256.

    Returns:
        ``(B,)`` float64 array (higher: farther from the training data).

    Raises:
        ValueError: ``x`` with no examples or non-finite values, or a model without exactly one GP layer.
    """
    layer = _only_gp_layer(model)
    batch_size = checks.integer("batch_size", batch_size, 1)
    x = checks.finite_array("x", x, np.float32)
    if x.ndim == 0 or len(x) == 0:
        raise ValueError(f"Expected `x` with at least one example. Received: x of shape {x.shape}")
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs  # a bare array matches one input
    features = keras.Model(inputs, layer.input)  # called eagerly in batches: no predict graph to trace
    return np.concatenate([np.asarray(layer.predictive_variance(features(x[i:i + batch_size], training=False)),
                                      np.float64) for i in range(0, len(x), batch_size)])
