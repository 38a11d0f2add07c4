"""Fitted posteriors over a model's weights (Laplace, SWAG, HMC): the one protocol that
:func:`tfbnn.predict`, saving (:meth:`FittedPosterior.save`, :func:`load_posterior`) and
:func:`tfbnn.export.export` use, and the functional forward pass of flattened weights."""

import json

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks, keras_private
from tfbnn.inference._sampling import check_finite

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

    def __init__(self, model, logits=False, variables=None):
        if not isinstance(model, keras.Model):
            raise ValueError(f"Expected a Keras model. Received: model of type {type(model).__name__}")
        if not model.built or not model.trainable_variables:
            raise ValueError(f"Expected a built model with trainable weights. Received: model={model.name!r}")
        self.model = model
        self.network = _logits_view(model) if logits else model
        # ``variables``: a subset of the trainable weights that theta covers (the others keep their values).
        self.variables = list(model.trainable_variables) if variables is None else list(variables)
        self.shapes = [tuple(v.shape) for v in self.variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dtype = self.variables[0].dtype
        self.num_parameters = sum(self.sizes)
        self._compiled = None

    def flatten(self, model=None):
        """The model's current trainable weights as one float64 vector (P,)."""
        variables = self.variables if model is None else model.trainable_variables
        return np.concatenate([np.asarray(keras.ops.convert_to_numpy(v), np.float64).ravel() for v in variables])

    def assign(self, theta, model=None):
        """Writes ``theta`` (P,) into the trainable weights of ``model`` (default: this model)."""
        theta = np.asarray(theta)
        if theta.shape != (self.num_parameters,):
            raise ValueError(f"Expected weights of shape ({self.num_parameters},). Received: shape {theta.shape}")
        parts = np.split(theta, np.cumsum(self.sizes)[:-1])
        for v, part, shape in zip(self.variables if model is None else model.trainable_variables, parts,
                                  self.shapes):
            v.assign(part.reshape(shape).astype(v.dtype))

    def unflatten(self, theta):
        """``theta`` (P,) tensor -> the list of weight tensors, shaped like the variables."""
        parts = tf.split(theta, self.sizes, axis=-1)
        return [tf.reshape(p, s) for p, s in zip(parts, self.shapes)]

    def forward(self, thetas, x):
        """Outputs ``(T, B, ...)`` for weights ``thetas`` (T, P) and inputs ``x`` (B, ...); traceable."""
        # The model's own non-trainable state (a logits view is a clone whose own state was never set).
        state = [v.value for v in self.model.non_trainable_variables]
        covered = {id(v): i for i, v in enumerate(self.variables)}

        def one(theta):
            parts = self.unflatten(theta)
            trainable = [parts[covered[id(v)]] if id(v) in covered else v.value
                         for v in self.model.trainable_variables]
            return self.network.stateless_call(trainable, state, x, training=False)[0]

        return tf.vectorized_map(one, thetas)

    def outputs(self, thetas, x, batch_size=None):
        """``forward`` in chunks of samples and batches of inputs, as a NumPy array ``(T, N, ...)``."""
        if self._compiled is None:
            self._compiled = _compiled(self.forward)
        return _chunked_outputs(self._compiled, np.asarray(thetas).astype(self.dtype), x, batch_size)


def _compiled(forward):
    """``forward(draws, x)`` as a ``tf.function`` that takes any number of draws and rows."""
    # reduce_retracing: the sample chunks and the last batch vary in size; after one retrace the
    # function takes any size (otherwise every size retraced, with TensorFlow's retracing warnings).
    # Each posterior traces its own function at most twice; TensorFlow counts the traces of every
    # posterior's forward together and would call that retracing.
    return keras_private.quiet_retracing(tf.function(forward, reduce_retracing=True))


def _chunked_outputs(function, draws, x, batch_size):
    """``function(draws, x)`` in chunks of draws and batches of (finite) inputs: ``(T, N, ...)`` NumPy."""
    rows, seen = [], 0
    for xb in _input_batches(x, batch_size or _DEFAULT_BATCH_SIZE):
        check_finite(xb, seen)
        seen += int(tf.nest.flatten(xb)[0].shape[0])
        chunks = [function(tf.constant(draws[s: s + _SAMPLE_CHUNK]), xb).numpy()
                  for s in range(0, len(draws), _SAMPLE_CHUNK)]
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


# kind -> the FittedPosterior class that saves with it (filled as the classes are defined).
_KINDS = {}


class FittedPosterior:
    """A posterior fitted to a Keras model's weights: the one way to use Laplace, SWAG and HMC.

    Whatever fitted it (:mod:`tfbnn.laplace` with any ``subset`` and ``hessian``,
    :class:`tfbnn.swag.SWAG` and :class:`tfbnn.swag.SWAGPosterior`,
    :class:`tfbnn.hmc.HMCResult`, and the samplers to come), a fitted posterior is used
    in the same three ways:

    - **predict**: ``tfbnn.predict(posterior, x, num_samples=T, seed=s)``: T weight
      draws ``theta_t ~ q`` (:meth:`weight_draws`), each run over all of ``x`` (one
      function draw per sample), summarised like every Monte Carlo predictive (the
      entropy split for classification; for regression the mean, ``epistemic_std =
      std_t f(x; theta_t)`` and, for a Gaussian likelihood with noise std ``sigma_t``
      (:meth:`noise_scales`), ``aleatoric_std = sqrt(mean_t sigma_t^2)``). The same
      ``seed`` gives the same draws.
    - **save**: :meth:`save` writes the posterior's state to an ``.npz`` file (the
      model is saved on its own, ``model.save("model.keras")``);
      :func:`load_posterior` ``(path, model)`` reads any of them back.
    - **export**: ``tfbnn.export.export(posterior, path, num_samples=K, seed=s)`` writes
      a SavedModel whose ``summary`` (``serving_default``) is the K-draw predictive
      ``tfbnn.predict(posterior, x, num_samples=K, seed=s)`` gives, served without
      tfbnn (the K draws are stored in it).

    A subclass sets ``model`` and implements :meth:`weight_draws`, :meth:`forward`
    and the saving pair :meth:`_state` / :meth:`_from_state` (with a class attribute
    ``kind``); :meth:`noise_scales` and ``task`` are optional.

    Attributes:
        model: the ``keras.Model`` whose weights the posterior is over.
        task: ``"classification"`` (the outputs of :meth:`forward` are class
            probabilities), ``"regression"``, or None (default): read from ``model``'s
            output layer, as for a Keras model.
        kind: str, the name :meth:`save` writes and :func:`load_posterior` reads.
    """

    task = None
    kind = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in vars(cls) and cls.kind is not None:
            _KINDS[cls.kind] = cls

    def weight_draws(self, num_samples, seed=None):
        """``(T, P)`` weight draws for ``num_samples`` T; the same ``seed`` (an int) gives the same draws."""
        raise NotImplementedError

    def forward(self, draws, x):
        """Outputs ``(T, B, ...)`` of draws ``(T, P)`` at inputs ``(B, ...)``; traceable (export traces it)."""
        raise NotImplementedError

    def noise_scales(self, num_samples):
        """``(T,)`` noise stds of a Gaussian likelihood matching :meth:`weight_draws`, or None."""
        return None

    def predictive_samples(self, x, num_samples, batch_size=None, seed=None):
        """Output samples ``(T, N, ...)`` (with noise scales appended on the last axis when known).

        Args:
            x: inputs ``(N, ...)`` (finite), a list/dict of them, or a dataset yielding ``x`` or ``(x, y)``.
            num_samples: int >= 1, T.
            batch_size: int or None, examples per call.
            seed: int in ``[0, 2^31)`` or None, the seed of the draws.
        """
        num_samples = checks.integer("num_samples", num_samples, 1)
        seed = checks.numpy_seed(seed)
        draws = self.weight_draws(num_samples, seed=seed)
        noise = self.noise_scales(num_samples)
        outputs = self._output_samples(draws, x, batch_size)
        if noise is not None:
            scales = np.broadcast_to(np.asarray(noise, outputs.dtype).reshape((-1,) + (1,) * (outputs.ndim - 1)),
                                     outputs.shape)
            outputs = np.concatenate([outputs, scales], axis=-1)
        return outputs

    def _output_samples(self, draws, x, batch_size):
        if getattr(self, "_compiled_forward", None) is None:
            self._compiled_forward = _compiled(self.forward)
        dtype = keras.config.floatx()
        return _chunked_outputs(self._compiled_forward, np.asarray(draws).astype(dtype), x, batch_size)

    # -- saving ------------------------------------------------------------------------------
    def _state(self):
        """``(config, arrays)``: a JSON-serializable dict and a dict of NumPy arrays."""
        raise NotImplementedError(f"{type(self).__name__} cannot be saved")

    @classmethod
    def _from_state(cls, config, arrays, model):
        raise NotImplementedError

    def save(self, path):
        """Writes the posterior (not the model) to an ``.npz`` file; :func:`load_posterior` reads it back.

        Example:
            >>> import os, tempfile, keras, numpy as np, tfbnn
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> post = tfbnn.swag.SWAGPosterior(model, np.zeros(3), np.ones(3), np.eye(3)[:, :2], seed=0)
            >>> path = os.path.join(tempfile.mkdtemp(), "swag.npz")
            >>> post.save(path)
            >>> back = tfbnn.inference.load_posterior(path, model)
            >>> bool(np.array_equal(back.weight_draws(4, seed=1), post.weight_draws(4, seed=1)))
            True
        """
        config, arrays = self._state()
        np.savez(path, config=np.asarray(json.dumps(dict(config, kind=self.kind))), **arrays)


def load_posterior(path, model):
    """A fitted posterior saved by :meth:`FittedPosterior.save`, for ``model``.

    Args:
        path: the ``.npz`` file.
        model: the ``keras.Model`` the posterior was fitted to (the same architecture
            and MAP weights; load it with ``keras.saving.load_model`` first).

    Returns:
        The posterior, of the class that saved it (:class:`tfbnn.laplace.Laplace`,
        :class:`tfbnn.swag.SWAG`, :class:`tfbnn.swag.SWAGPosterior`,
        :class:`tfbnn.hmc.HMCResult`).
    """
    with np.load(path, allow_pickle=False) as data:
        config = json.loads(str(data["config"])) if "config" in data.files else {}
        arrays = {name: data[name] for name in data.files if name != "config"}
    kind = config.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"Expected a file written by a fitted posterior's `save` (kinds {sorted(_KINDS)}). "
                         f"Received: path={str(path)!r} of kind {kind!r}")
    return _KINDS[kind]._from_state(config, arrays, model)


class WeightPosterior(FittedPosterior):
    """A :class:`FittedPosterior` over a Keras model's flattened trainable weights (SWAG, HMC).

    Subclasses (:class:`tfbnn.swag.SWAGPosterior`, :class:`tfbnn.hmc.HMCResult`) hold
    ``model`` (the Keras model the weights belong to) and implement
    :meth:`weight_draws`; :meth:`forward` runs the model with T weight vectors (one
    function draw each, shared by all examples, :class:`FlatWeights`). For a regression
    posterior with a noise scale (:meth:`noise_scales`) the outputs carry it as a
    :class:`tfbnn.GaussianHead` would, so the aleatoric part is reported.
    """

    def forward(self, draws, x):
        return self._flat_weights().forward(tf.cast(draws, self._flat_weights().dtype), x)

    def _flat_weights(self):
        if getattr(self, "_flat", None) is None or self._flat.model is not self.model:
            self._flat = FlatWeights(self.model)
        return self._flat

    def _output_samples(self, thetas, x, batch_size):
        return self._flat_weights().outputs(thetas, x, batch_size)
