"""Likelihood heads: a Gaussian output layer and its negative log-likelihood loss.

A regression net that predicts its own noise level (heteroscedastic regression,
Nix & Weigend 1994; Kendall & Gal 2017, eq. 5) ends in :class:`GaussianHead`,
which turns ``2 d`` raw outputs into a mean and a positive scale, and trains
with :func:`gaussian_nll`::

    y | x ~ N(mu(x), sigma(x)^2),    sigma(x) = softplus(raw(x)) + min_scale

With Bayesian layers before the head, :func:`tfbnn.inference.predict` splits the
predictive variance into an aleatoric part (the mean of ``sigma^2`` over weight
samples) and an epistemic part (the variance of ``mu`` over weight samples).
"""

import math

import keras
import tensorflow as tf

from tfbnn._internal import checks

__all__ = ["GaussianHead", "gaussian_nll", "split_gaussian"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def split_gaussian(outputs, name="outputs"):
    """Splits the output of a :class:`GaussianHead` into ``(mean, scale)``.

    Args:
        outputs: tensor or array ``(..., 2 d)``: the means, then the scales.
        name: the argument errors name. Default ``"outputs"``.

    Returns:
        ``(mean, scale)``, each ``(..., d)``.
    """
    outputs = checks.float_tensor(name, outputs)
    dim = outputs.shape[-1] if outputs.shape.rank else None
    if dim is None or dim % 2:
        raise ValueError(
            f"Expected the last dimension of `{name}`, a Gaussian head's output, to be even (means, then "
            f"scales). Received: {name}.shape={tuple(outputs.shape)}"
        )
    return outputs[..., : dim // 2], outputs[..., dim // 2 :]


@keras.saving.register_keras_serializable(package="tfbnn")
class GaussianHead(keras.layers.Layer):
    """Turns ``2 d`` raw outputs into a Gaussian's mean and a positive scale.

    The layer has no weights: put it after any projection to ``2 d`` units
    (``keras.layers.Dense`` or a Bayesian dense layer). With raw inputs
    ``[m, r]`` (each ``d`` wide) it returns ``[m, softplus(r) + min_scale]``::

        p(y | x) = N(y; m, (softplus(r) + min_scale)^2)

    The floor ``min_scale`` keeps the negative log-likelihood bounded when the
    net fits a training point exactly.

    Args:
        min_scale: float > 0, the smallest scale the head outputs. Default 1e-3
            (in the units of the targets: rescale it for tiny targets).

    Input shape: ``(batch, ..., 2 d)``.
    Output shape: ``(batch, ..., 2 d)``, means in ``[..., :d]`` and scales in
    ``[..., d:]`` (see :func:`split_gaussian`).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((1,)),
        ...     keras.layers.Dense(16, activation="relu"),
        ...     tfbnn.layers.DenseFlipout(2, kl_weight=1 / 200, seed=0),  # d = 1
        ...     tfbnn.GaussianHead(),
        ... ])
        >>> model.compile("adam", loss=tfbnn.gaussian_nll)
        >>> mean, scale = tfbnn.likelihoods.split_gaussian(model(np.zeros((3, 1), "float32")))
        >>> bool(np.all(scale.numpy() > 0))
        True

    Reference:
        Kendall, Gal. What Uncertainties Do We Need in Bayesian Deep Learning for
        Computer Vision? NeurIPS 2017 (eq. 5: the heteroscedastic likelihood).
    """

    def __init__(self, min_scale=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.min_scale = checks.number("min_scale", min_scale, low=0, low_open=True)

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim is None or dim % 2:
            raise ValueError(
                f"Layer '{self.name}' expects an even last dimension (2 d: d means, d raw scales). "
                f"Received: input_shape={tuple(input_shape)}"
            )

    def call(self, inputs):
        mean, raw = split_gaussian(inputs)
        scale = tf.nn.softplus(raw) + tf.cast(self.min_scale, raw.dtype)
        return tf.concat([mean, scale], axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"min_scale": self.min_scale})
        return config


def _checked_targets(y_true, mean, y_pred):
    """``y_true`` shaped like the means: broadcasting would score the wrong targets."""
    message = (f"Expected `y_true` shaped like the head's means (`y_pred` holds {mean.shape[-1]} means, then as "
               "many scales).")
    received = f"y_true.shape={tuple(y_true.shape)}, y_pred.shape={tuple(y_pred.shape)}"
    if not y_true.shape.is_compatible_with(mean.shape):
        raise ValueError(f"{message} Received: {received}")
    if y_true.shape.rank is None or y_true.shape.is_fully_defined():
        return y_true
    # Unknown sizes (a retraced step): compared when the step runs.
    return checks.checked(y_true, lambda: tf.reduce_all(tf.equal(tf.shape(y_true), tf.shape(mean))), message,
                           lambda: received)


def _checked_scales(scale):
    """``scale`` > 0: a raw (not GaussianHead) output would give a NaN loss."""
    return checks.checked(
        scale, lambda: tf.reduce_all(scale > 0),
        "Expected positive scales in the second half of `y_pred` (the output of a GaussianHead).",
        lambda: f"y_pred with min scale={float(tf.reduce_min(scale)):.4g}",
    )


@keras.saving.register_keras_serializable(package="tfbnn")
def gaussian_nll(y_true, y_pred):
    """Gaussian negative log-likelihood of ``y_true`` under a :class:`GaussianHead` output.

    Per example, summed over the ``d`` target dimensions (the log-likelihood of
    the example, so it is the ``NLL`` of the ELBO convention; Keras then averages
    over the batch)::

        nll = sum_j [ log sigma_j + (y_j - mu_j)^2 / (2 sigma_j^2) + log(2 pi) / 2 ]

    Args:
        y_true: targets ``(batch, ..., d)``; ``(batch,)`` when ``d = 1``.
        y_pred: head outputs ``(batch, ..., 2 d)``: means then scales.

    Returns:
        Tensor ``(batch, ...)``: the NLL of every example.

    Example:
        >>> import tfbnn
        >>> round(float(tfbnn.gaussian_nll([[0.0]], [[0.0, 1.0]])[0]), 4)  # log(2 pi) / 2
        0.9189
        >>> # model.compile(optimizer="adam", loss=tfbnn.gaussian_nll)
    """
    y_pred = checks.float_tensor("y_pred", y_pred)
    mean, scale = split_gaussian(y_pred, name="y_pred")
    y_true = tf.cast(checks.float_tensor("y_true", y_true), mean.dtype)
    if y_true.shape.rank == mean.shape.rank - 1:
        y_true = y_true[..., None]
    z = (_checked_targets(y_true, mean, y_pred) - mean) / _checked_scales(scale)
    return tf.reduce_sum(tf.math.log(scale) + 0.5 * tf.square(z) + _HALF_LOG_2PI, axis=-1)
