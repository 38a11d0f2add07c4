"""Monte Carlo dropout: dropout that stays on at inference, seeded.

Gal & Ghahramani (2016) read a network trained with dropout as a variational
approximation whose samples are the dropout masks, so keeping dropout on at test
time and averaging T forward passes gives a Monte Carlo predictive. Keras' own
``Dropout`` switches off at inference; these layers do not (unless their
``inference_mode`` is ``"mean"``, which gives the usual deterministic net):

    y = x * m / (1 - rate),   m_i ~ Bernoulli(1 - rate)

``MCSpatialDropout2D`` drops whole feature maps (one mask value per example and
channel; Tompson et al. 2015), the variant used in convolutional MC-dropout nets.
Masks are drawn independently per row, so the vectorized Monte Carlo prediction of
:func:`tfbnn.inference.predict` gives T distinct samples without further work.
They are :class:`tfbnn.layers.StochasticLayer` s: seeded, switched with the
Bayesian layers by :func:`tfbnn.set_inference_mode` / :func:`tfbnn.posterior_mean`,
and with no KL term (the weight-decay view of the MC-dropout ELBO is left to the
optimizer or a kernel regularizer).
"""

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.layers.base import StochasticLayer

__all__ = ["MCDropout", "MCSpatialDropout2D"]


def _check_rate(rate):
    return checks.number("rate", rate, low=0, high=1, high_open=True)


def _check_noise_shape(noise_shape):
    if noise_shape is None:
        return None
    if not isinstance(noise_shape, (tuple, list)) or not all(
        d is None or (checks.is_integer(d) and d > 0) for d in noise_shape
    ):
        raise ValueError(
            "Expected `noise_shape` to be None or a tuple of positive ints and None. "
            f"Received: noise_shape={noise_shape!r}"
        )
    return tuple(None if d is None else int(d) for d in noise_shape)


@keras.saving.register_keras_serializable(package="tfbnn")
class MCDropout(StochasticLayer):
    """Dropout kept on at inference: the MC-dropout posterior sample (Gal & Ghahramani 2016).

    Args:
        rate: float in [0, 1), the probability of dropping a unit.
        noise_shape: None or a tuple broadcast against the input shape (``None``
            entries take the input's size), as in ``keras.layers.Dropout``.
        inference_mode: ``"sample"`` (default, dropout on at inference) or ``"mean"``
            (off: the deterministic network).
        seed: int or None.

    Input and output shape: any, unchanged.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
        ...                           tfbnn.layers.MCDropout(0.2, seed=1), keras.layers.Dense(3)])
        >>> res = tfbnn.predict(model, np.ones((4, 8), "float32"), num_samples=20, task="regression")

    Reference:
        Gal, Ghahramani. Dropout as a Bayesian Approximation: Representing Model
        Uncertainty in Deep Learning. ICML 2016.
    """

    def __init__(self, rate, noise_shape=None, inference_mode="sample", seed=None, **kwargs):
        super().__init__(inference_mode=inference_mode, seed=seed, **kwargs)
        self.rate = _check_rate(rate)
        self.noise_shape = _check_noise_shape(noise_shape)

    def _mask_shape(self, inputs):
        shape = tf.shape(inputs)
        if self.noise_shape is None:
            return shape
        return tf.stack([shape[i] if d is None else d for i, d in enumerate(self.noise_shape)])

    def call(self, inputs, training=None):
        if self.rate == 0.0 or not self._sampling(training):
            return inputs
        keep = self._uniform(self._mask_shape(inputs), inputs.dtype) >= self.rate
        return inputs * tf.cast(keep, inputs.dtype) / (1.0 - self.rate)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "noise_shape": self.noise_shape})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class MCSpatialDropout2D(MCDropout):
    """Spatial (channel-wise) dropout kept on at inference, for ``(B, H, W, C)`` maps.

    One Bernoulli value per example and channel drops a whole feature map
    (Tompson et al. 2015), which is what decorrelates convolutional activations.

    Args:
        rate: float in [0, 1).
        data_format: ``"channels_last"`` (default) or ``"channels_first"``.
        inference_mode, seed: as :class:`MCDropout`.

    Input shape: rank 4. Output: unchanged.
    """

    def __init__(self, rate, data_format="channels_last", inference_mode="sample", seed=None, **kwargs):
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(
                "Expected `data_format` in ('channels_last', 'channels_first'). "
                f"Received: data_format={data_format!r}"
            )
        noise_shape = (None, 1, 1, None) if data_format == "channels_last" else (None, None, 1, 1)
        super().__init__(rate, noise_shape=noise_shape, inference_mode=inference_mode, seed=seed, **kwargs)
        self.data_format = data_format
        self.input_spec = keras.layers.InputSpec(ndim=4)

    def get_config(self):
        config = super().get_config()
        config.pop("noise_shape")
        config["data_format"] = self.data_format
        return config
