"""Posteriors held as draws of a model's flattened weights (SWAG, HMC): the functional forward pass
and their Monte Carlo predictive through :func:`tfbnn.predict`."""

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks

_SAMPLE_CHUNK = 64
_DEFAULT_BATCH_SIZE = 256


class FlatWeights:
    """A Keras model seen as a function of one flat weight vector ``theta`` (P,).

    ``theta`` is the concatenation of ``model.trainable_variables``, each flattened
    row-major, in that order. :meth:`outputs` runs the model with T such vectors at
    once (``keras.Layer.stateless_call`` vectorized over the samples): the inputs are
    shared, each sample has its own weights, so ``outputs[t]`` is one function draw.
    Non-trainable state (BatchNormalization statistics) is the model's current one.

    Args:
        model: a built ``keras.Model``.
        logits: bool. If the model ends in a softmax ``Dense`` layer, run a copy whose
            last layer is linear, so the outputs are logits (for a stable likelihood).
    """

    def __init__(self, model, logits=False):
        if not isinstance(model, keras.Model):
            raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
        if not model.built or not model.trainable_variables:
            raise ValueError(f"Expected a built model with trainable weights. Received: model={model.name!r}")
        self.model = model
        self.network = _logits_view(model) if logits else model
        self.shapes = [tuple(v.shape) for v in model.trainable_variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dtype = model.trainable_variables[0].dtype
        self.num_parameters = sum(self.sizes)
        self._compiled = None

    def flatten(self, model=None):
        """The model's current trainable weights as one float64 vector (P,)."""
        variables = (model or self.model).trainable_variables
        return np.concatenate([np.asarray(keras.ops.convert_to_numpy(v), np.float64).ravel() for v in variables])

    def assign(self, theta, model=None):
        """Writes ``theta`` (P,) into the trainable weights of ``model`` (default: this model)."""
        theta = np.asarray(theta)
        if theta.shape != (self.num_parameters,):
            raise ValueError(f"Expected weights of shape ({self.num_parameters},). Received: shape {theta.shape}")
        parts = np.split(theta, np.cumsum(self.sizes)[:-1])
        for v, part, shape in zip((model or self.model).trainable_variables, parts, self.shapes):
            v.assign(part.reshape(shape).astype(v.dtype))

    def unflatten(self, theta):
        """``theta`` (P,) tensor -> the list of weight tensors, shaped like the variables."""
        parts = tf.split(theta, self.sizes, axis=-1)
        return [tf.reshape(p, s) for p, s in zip(parts, self.shapes)]

    def forward(self, thetas, x):
        """Outputs ``(T, B, ...)`` for weights ``thetas`` (T, P) and inputs ``x`` (B, ...); traceable."""
        state = [v.value for v in self.network.non_trainable_variables]

        def one(theta):
            return self.network.stateless_call(self.unflatten(theta), state, x, training=False)[0]

        return tf.vectorized_map(one, thetas)

    def outputs(self, thetas, x, batch_size=None):
        """``forward`` in chunks of samples and batches of inputs, as a NumPy array ``(T, N, ...)``."""
        if self._compiled is None:
            # reduce_retracing: the sample chunks and the last batch vary in size; after one retrace the
            # function takes any size (otherwise every size retraced, with TensorFlow's retracing warnings).
            self._compiled = tf.function(self.forward, reduce_retracing=True)
            # Each FlatWeights (each posterior of a model) traces its own function at most twice; TensorFlow
            # counts the traces of every FlatWeights.forward together and would call that retracing.
            self._compiled._omit_frequent_tracing_warning = True
        thetas = np.asarray(thetas).astype(self.dtype)
        rows = []
        for xb in _input_batches(x, batch_size or _DEFAULT_BATCH_SIZE):
            chunks = [self._compiled(tf.constant(thetas[s: s + _SAMPLE_CHUNK]), xb).numpy()
                      for s in range(0, len(thetas), _SAMPLE_CHUNK)]
            rows.append(np.concatenate(chunks, axis=0))
        return np.concatenate(rows, axis=1)


def _logits_view(model):
    """A copy of ``model`` whose softmax output ``Dense`` is linear (same weight order and shapes)."""
    last = getattr(model, "layers", [None])[-1]
    if not (isinstance(last, keras.layers.Dense) and getattr(last.activation, "__name__", None) == "softmax"):
        return model

    def clone(layer):
        config = layer.get_config()
        if layer is last:
            config["activation"] = "linear"
        return layer.__class__.from_config(config)

    return keras.models.clone_model(model, clone_function=clone)


def _input_batches(x, batch_size):
    if isinstance(x, tf.data.Dataset):
        for element in x:
            yield element[0] if isinstance(element, tuple) else element
        return
    x = tf.nest.map_structure(lambda v: tf.convert_to_tensor(
        np.asarray(v, keras.config.floatx()) if np.issubdtype(np.asarray(v).dtype, np.floating) else v), x)
    num = int(tf.nest.flatten(x)[0].shape[0])
    if num == 0:
        raise ValueError("Expected at least one example. Received: x with 0 examples")
    for start in range(0, num, batch_size):
        yield tf.nest.map_structure(lambda v, s=start: v[s: s + batch_size], x)


class WeightPosterior:
    """A posterior over a Keras model's flattened weights that :func:`tfbnn.predict` samples.

    Subclasses (:class:`tfbnn.swag.SWAGPosterior`, :class:`tfbnn.hmc.HMCResult`) hold
    ``model`` (the Keras model the weights belong to) and implement
    :meth:`weight_draws`. ``tfbnn.predict(posterior, x, num_samples=T)`` runs the model
    with T weight vectors (one function draw each, shared by all examples) and
    summarises the outputs like any Monte Carlo predictive; for a regression posterior
    with a noise scale (:meth:`noise_scales`) the outputs carry it as a
    :class:`tfbnn.GaussianHead` would, so the aleatoric part is reported.
    """

    def weight_draws(self, num_samples):
        """``(T, P)`` weight vectors for ``num_samples`` T."""
        raise NotImplementedError

    def noise_scales(self, num_samples):
        """``(T,)`` noise stds of a Gaussian likelihood matching :meth:`weight_draws`, or None."""
        return None

    def predictive_samples(self, x, num_samples, batch_size=None):
        """Output samples ``(T, N, ...)`` (with noise scales appended on the last axis when known)."""
        num_samples = checks.integer("num_samples", num_samples, 1)
        thetas = self.weight_draws(num_samples)
        noise = self.noise_scales(num_samples)
        outputs = self._output_samples(thetas, x, batch_size)
        if noise is not None:
            scales = np.broadcast_to(np.asarray(noise, outputs.dtype).reshape((-1,) + (1,) * (outputs.ndim - 1)),
                                     outputs.shape)
            outputs = np.concatenate([outputs, scales], axis=-1)
        return outputs

    def _output_samples(self, thetas, x, batch_size):
        if getattr(self, "_flat", None) is None or self._flat.model is not self.model:
            self._flat = FlatWeights(self.model)
        return self._flat.outputs(thetas, x, batch_size)
