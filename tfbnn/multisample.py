"""Training with several weight samples per step (Blundell et al. 2015, sec. 3.2 / 5.1)."""

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.layers.node import NodeLayer
from tfbnn.utils import NetworkWrapper, stochastic_layers, tile_rows, weight_samples

__all__ = ["MultiSampleModel", "AVERAGES"]

AVERAGES = ("mean", "log_mean_exp")


def _split_samples(y, times):
    return tf.reshape(y, tf.concat([[times, -1], tf.shape(y)[1:]], axis=0))


def average_samples(outputs, average):
    """Averages ``(S, B, ...)`` sample outputs over the first axis (see :class:`MultiSampleModel`)."""
    if average == "mean":
        return tf.reduce_mean(outputs, axis=0)
    num = tf.cast(tf.shape(outputs)[0], outputs.dtype)
    return tf.reduce_logsumexp(tf.nn.log_softmax(outputs, axis=-1), axis=0) - tf.math.log(num)


@keras.saving.register_keras_serializable(package="tfbnn")
class MultiSampleModel(NetworkWrapper):
    """Trains and evaluates a Bayesian model with ``S`` whole-network weight samples per step.

    Blundell et al. (2015) estimate the ELBO's expected likelihood with several
    weight samples per minibatch (their reproduction draws 5 and averages the
    network outputs before the cross-entropy). In ``train_step`` and ``test_step``
    this wrapper runs the wrapped model *once*, vectorized, on the batch tiled
    ``S`` times inside ``tfbnn.weight_samples(model, S, joint=True, with_kl=True)``:
    each block of ``B`` rows gets its own weight sample ``w_s ~ q`` (one whole
    network draw; MC dropout masks and per-row estimators are independent per row
    anyway). The ``(S * B, ...)`` outputs ``f(x; w_s)`` are reshaped to
    ``(S, B, ...)`` and averaged:

    * ``average="mean"`` (default): ``y_hat = (1/S) sum_s f(x; w_s)``. For a model
      that outputs logits this is Blundell's averaged logits (compile the loss
      with ``from_logits=True``); for a softmax head (the zoo's models) it is the
      S-sample predictive mean ``p_hat = (1/S) sum_s p_s``, and the cross-entropy
      is ``-log p_hat(y) = -logmeanexp_s log p_s(y)``; for regression, the mean
      prediction.
    * ``average="log_mean_exp"``: for a model that outputs logits over the last
      axis: ``y_hat = logsumexp_s log_softmax(f(x; w_s)) - log S``, the logits of
      the predictive mean, so a ``from_logits=True`` cross-entropy is again
      ``-log (1/S) sum_s p_s(y)``.

    The loss is the compiled loss on ``y_hat`` plus the layers' KL, averaged over
    the samples::

        loss = L(y, y_hat) + sum_layers kl_weight * (1/S) sum_s KL_s

    A closed-form KL does not depend on the sample and is added once; a Monte
    Carlo KL (scale-mixture prior) is the mean of the ``S`` one-sample estimates
    ``log q(w_s) - log p(w_s)`` at the forward pass' draws (local
    reparameterization draws ``S`` weight samples for it). With ``kl_weight = beta
    / N`` this is the per-example negative ELBO of the ELBO convention (docs/guides/elbo.md); the
    KL is not multiplied by ``S``. Metrics see ``y_hat``. ``predict`` and
    ``call`` run the wrapped model unchanged (use :func:`tfbnn.predict` for Monte
    Carlo prediction). With ``S = 1`` it is the wrapped model. The cost of a step
    is about ``S`` forward/backward passes, in one call.

    Works for the reparameterization, Flipout and local reparameterization layers
    (dense and conv), variational dropout, Graves and MC dropout. iBNN node
    layers draw per-example component noise and train with several samples
    through :class:`tfbnn.ibnn.IBNNModel`.

    Args:
        model: a Keras model with tfbnn stochastic layers.
        num_samples: int >= 1, ``S``, weight samples per step. Default 5 (Blundell).
        average: ``"mean"`` or ``"log_mean_exp"``, see above.
        **kwargs: passed to ``keras.Model`` (``name``, ...).

    Saves and loads as ``.keras`` (registered); the wrapped model is
    ``.network``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> net = keras.Sequential([keras.Input((8,)),            # a softmax-output Bayesian model
        ...                         tfbnn.DenseFlipout(16, activation="relu", seed=1),
        ...                         tfbnn.DenseFlipout(2, activation="softmax", seed=2)])
        >>> model = tfbnn.MultiSampleModel(net, num_samples=5)
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> history = model.fit(x, y, callbacks=[tfbnn.KLAnnealing(num_examples=len(x))], verbose=0)
        >>> model.network is net
        True

    Reference:
        Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
        Networks. ICML 2015, sec. 3.2 (eq. 2, the Monte Carlo ELBO) and 5.1.
    """

    def __init__(self, model, num_samples=5, average="mean", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(model, keras.Model):
            raise ValueError(f"Expected a Keras model. Received: model={type(model).__name__}")
        num_samples = checks.integer("num_samples", num_samples, 1)
        if average not in AVERAGES:
            raise ValueError(f"Expected `average` in {AVERAGES}. Received: average={average!r}")
        layers = stochastic_layers(model)
        if not layers:
            raise ValueError(f"Expected a model with tfbnn stochastic layers. Received: model={model.name!r} without any")
        if any(isinstance(layer, NodeLayer) for layer in layers):
            raise ValueError(
                "Expected a model without iBNN node layers: train those with several samples through "
                f"tfbnn.ibnn.IBNNModel(model, num_train_samples=S). Received: model={model.name!r}"
            )
        self.network = model
        self.num_samples = num_samples
        self.average = average
        self._averaging = False

    def call(self, inputs, training=None):
        if not self._averaging or self.num_samples == 1:
            return super().call(inputs, training=training)
        samples = self.num_samples
        with weight_samples(self.network, samples, joint=True, with_kl=True):
            outputs = self.network(tile_rows(inputs, samples), training=training)
        return tf.nest.map_structure(lambda y: average_samples(_split_samples(y, samples), self.average), outputs)

    def _steps_with_samples(self, step, data):
        # Read by `call` while the step is traced.
        self._averaging = True
        try:
            return step(data)
        finally:
            self._averaging = False

    def train_step(self, data):
        return self._steps_with_samples(super().train_step, data)

    def test_step(self, data):
        return self._steps_with_samples(super().test_step, data)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "model": keras.saving.serialize_keras_object(self.network),
                "num_samples": self.num_samples,
                "average": self.average,
            }
        )
        return config

