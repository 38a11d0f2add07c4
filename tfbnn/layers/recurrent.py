"""Bayes-by-Backprop recurrent layers: LSTM and GRU cells and layers with weight noise fixed per sequence.

The cells have the mean-field Gaussian posterior of the dense layers
(:class:`tfbnn.layers.MeanFieldGaussian`) over one stacked kernel

    K = [W; U]   of shape (input_dim + units, gates * units),

the input kernel ``W = K[:input_dim]`` and the recurrent kernel
``U = K[input_dim:]`` (``gates`` = 4 for the LSTM, 3 for the GRU), and over the
bias: ``q(K_ij) = N(mu_ij, sigma_ij^2)``, ``sigma = softplus(rho) + 1e-6``; the
prior by name or object (``kernel_prior`` covers ``W`` and ``U``). The recurrences
are Keras' (``keras.layers.LSTMCell``, ``keras.layers.GRUCell`` with
``reset_after=True``), with the sampled ``W``, ``U`` and ``b`` in place of Keras'
weights.

**The noise is drawn once per sequence.** One weight sample ``K ~ q`` (and ``b``)
is drawn before the time loop and used at every step of that call, as in Fortunato,
Blundell and Vinyals 2017 ("Bayesian Recurrent Neural Networks", sec. 3: "the same
weights are used at all time steps of a sequence"); resampling per step would
be a different (and noisier) model. The draw happens in the hook that
``keras.layers.RNN`` calls before its loop (the one that fixes a dropout mask
per sequence for ``keras.layers.LSTMCell``); the convenience layers
(:class:`LSTMReparameterization`, :class:`GRUReparameterization`) also draw
explicitly before the loop. A cell called on its own (one step, outside an RNN)
draws a fresh sample on that call. The KL, ``kl_weight * KL(q || p)`` of the
stacked kernel and the bias, is added once per sequence (not per step), following
the ELBO convention of :class:`tfbnn.layers.BayesianLayer`.

Sampling follows the layer's inference mode: in training, and at inference in
``"sample"`` mode, the step uses the sample; in ``"mean"`` mode at inference it
uses the posterior mean ``mu``. Monte Carlo prediction (:func:`tfbnn.predict`,
:func:`tfbnn.weight_samples`) draws ``T`` independent stacked kernels, one per block
of ``B`` rows, and runs every step with one batched matmul; as for the
convolutions, joint and per-row modes coincide (a recurrent weight is shared over
time, so per-row local reparameterization would not be exact).

Reference:
    Fortunato, Blundell, Vinyals. Bayesian Recurrent Neural Networks. arXiv:1704.02798, 2017.
    Blundell et al. Weight Uncertainty in Neural Networks. ICML 2015.
"""

import inspect

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.layers.base import StochasticLayer, input_features
from tfbnn.layers.mean_field import MeanFieldGaussian

__all__ = ["LSTMCellReparameterization", "GRUCellReparameterization", "LSTMReparameterization",
           "GRUReparameterization"]

# keras.layers.RNN fixes a per-sequence dropout mask through a hook that it calls,
# before its time loop, on cells that are instances of Keras' dropout-cell mixin
# (get_dropout_mask, then reset_dropout_mask after the loop). The mixin is not public:
# it is found among the bases of the public keras.layers.LSTMCell. The cells use the
# hook to draw their weight sample once per sequence.
# Without it (a Keras that drops the mixin), only the convenience layers hold one sample per
# sequence; tests/layers/test_recurrent.py checks the cell alone in keras.layers.RNN.
_PER_SEQUENCE_HOOK = next((c for c in keras.layers.LSTMCell.__mro__ if c.__name__ == "DropoutRNNCell"), object)


def _batched_matmul(x, kernel):
    """``x @ kernel``; a kernel with a leading axis of T samples is applied to T blocks of rows."""
    if kernel.shape.rank == 2:
        return tf.matmul(x, kernel)
    rows = tf.reshape(x, tf.stack([tf.shape(kernel)[0], -1, tf.shape(x)[-1]]))
    return tf.reshape(tf.matmul(rows, kernel), tf.stack([-1, tf.shape(kernel)[-1]]))


def _add_bias(x, bias):
    """``x + bias``; a bias with a leading axis of T samples is added to T blocks of rows."""
    if bias.shape.rank == 1:
        return x + bias
    rows = tf.reshape(x, tf.stack([tf.shape(bias)[0], -1, tf.shape(x)[-1]]))
    return tf.reshape(rows + bias[:, None, :], tf.shape(x))


class RecurrentCellReparameterization(MeanFieldGaussian, _PER_SEQUENCE_HOOK):
    """What the Bayesian LSTM and GRU cells share: the stacked kernel, the per-sequence sample, the step.

    A subclass sets ``gates``, ``bias_shape(units)``, ``state_size`` and ``step(inputs,
    states, kernel, bias)``.
    """

    gates = 4

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", **kwargs):
        super().__init__(activation=activation, use_bias=use_bias, kernel_initializer=kernel_initializer, **kwargs)
        self.units = checks.integer("units", units, 1)
        self.recurrent_activation = checks.activation(recurrent_activation, "recurrent_activation")
        self.recurrent_initializer = checks.initializer("recurrent_initializer", recurrent_initializer)
        # Per-sequence state of the hook, dropout-mixin attributes that keras.layers.RNN may read.
        self.dropout = self.recurrent_dropout = 0.0
        self._sequence_weights = None

    @property
    def output_size(self):
        return self.units

    def bias_shape(self):
        return (self.gates * self.units,)

    def build(self, input_shape):
        input_dim = input_features(self, input_shape)
        width = self.gates * self.units
        self.build_posterior((input_dim + self.units, width), self.bias_shape())
        # Keras' initialization: glorot for W, orthogonal for U (one stacked weight here).
        self.kernel_loc.assign(tf.concat([self.kernel_initializer((input_dim, width)),
                                          self.recurrent_initializer((self.units, width))], axis=0))
        self.input_dim = input_dim

    # -- the weight sample of one sequence -------------------------------------------
    def draw_weights(self):
        """One weight sample and its KL: ``(kernel, bias, kl)``.

        ``kernel`` is the stacked ``[W; U]`` of shape ``(input_dim + units, gates * units)``
        (``T`` samples on a leading axis inside :func:`tfbnn.weight_samples` with ``T > 1``),
        ``bias`` its bias sample (the mean for ``bias_prior=None``; None without a bias), and
        ``kl`` the layer's ``KL(q || p)`` (closed form, or the Monte Carlo estimate at this
        sample). It advances the layer's seed generator: the cell calls it once per sequence.
        """
        num_samples = self._weight_samples
        scale, kl = self._kernel_scale_and_kl()
        kernel, kl = self._sample(self.kernel_loc, scale, self.kernel_prior, num_samples, kl)
        bias, bias_kl = self._bias(True)
        return kernel, bias, kl + bias_kl

    def begin_sequence(self):
        """Draws the weights of the next sequence and adds the KL loss (once); no-op if already drawn."""
        if self._sequence_weights is not None:
            return
        kernel, bias, kl = self.draw_weights()
        self._sequence_weights = (kernel, bias)
        if self._adds_kl:
            self._add_kl_loss(kl, training=None)  # the scale is checked per step, where `training` is known

    def end_sequence(self):
        """Forgets the sequence's weight sample."""
        self._sequence_weights = None

    # keras.layers.RNN's per-sequence hook (see _PER_SEQUENCE_HOOK).
    def get_dropout_mask(self, step_input):
        self.begin_sequence()
        return None

    def get_recurrent_dropout_mask(self, step_input):
        return None

    def reset_dropout_mask(self):
        self.end_sequence()

    def reset_recurrent_dropout_mask(self):
        pass

    # -- one step ---------------------------------------------------------------------
    def call(self, inputs, states, training=None):
        self._check_kl_scale(training)
        alone = self._sequence_weights is None
        if alone:  # one step outside an RNN: its own sample and KL
            self.begin_sequence()
        kernel, bias = self._sequence_weights
        if not self._sampling(training):
            kernel, bias = self.kernel_loc, self.bias_loc
        if alone:
            self.end_sequence()
        kernel = tf.cast(kernel, inputs.dtype)
        bias = None if bias is None else tf.cast(bias, inputs.dtype)
        return self.step(inputs, states, kernel, bias)

    def split_kernel(self, kernel):
        """``(W, U)`` of a stacked kernel (a leading sample axis kept)."""
        return kernel[..., : self.input_dim, :], kernel[..., self.input_dim:, :]

    def get_config(self):
        config = super().get_config()
        config.update({
            "units": self.units,
            "recurrent_activation": keras.activations.serialize(self.recurrent_activation),
            "recurrent_initializer": keras.initializers.serialize(self.recurrent_initializer),
        })
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class LSTMCellReparameterization(RecurrentCellReparameterization):
    """Bayes-by-Backprop LSTM cell, one weight sample per sequence (use it in ``keras.layers.RNN``).

    With the sampled input kernel ``W``, recurrent kernel ``U`` and bias ``b`` (the
    stacked ``[W; U] ~ N(mu, sigma^2)`` drawn once per sequence, see
    :mod:`tfbnn.layers.recurrent`), a step is Keras' LSTM (Hochreiter and Schmidhuber
    1997; gate order i, f, c, o as ``keras.layers.LSTMCell``)::

        [i, f, g, o] = x_t W + h_{t-1} U + b
        c_t = sigma(f) * c_{t-1} + sigma(i) * tanh(g),    h_t = sigma(o) * tanh(c_t)

    (``sigma`` = ``recurrent_activation``, ``tanh`` = ``activation``).

    Args:
        units: int > 0, size of the hidden and carry states.
        activation: default ``"tanh"``.
        recurrent_activation: default ``"sigmoid"``.
        use_bias: bool, default True.
        unit_forget_bias: bool, default True: the forget gate's bias mean starts at 1.
        kernel_initializer: the initializer of ``mu`` of ``W`` (default ``"glorot_uniform"``).
        recurrent_initializer: of ``mu`` of ``U`` (default ``"orthogonal"``).
        **kwargs: as :class:`tfbnn.layers.DenseReparameterization`: ``kernel_prior``,
            ``bias_prior``, ``kernel_scale_initializer``, ``bias_initializer``,
            ``bias_scale_initializer``, ``scale_parameterization``, ``kl_weight``,
            ``inference_mode``, ``seed`` (``kernel_prior`` and ``kernel_scale_initializer``
            cover ``W`` and ``U``), and the base layer's (``name``, ``dtype``).

    Call arguments: ``inputs`` ``(batch, input_dim)``, ``states`` ``[h, c]`` each
    ``(batch, units)``, ``training``. Returns ``h, [h, c]``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> cell = tfbnn.layers.LSTMCellReparameterization(4, kl_weight=1e-3, seed=0)
        >>> layer = keras.layers.RNN(cell, return_sequences=True)
        >>> layer(np.ones((2, 5, 3), "float32")).shape, len(layer.losses)   # one KL per sequence
        (TensorShape([2, 5, 4]), 1)

    Reference:
        Fortunato, Blundell, Vinyals. Bayesian Recurrent Neural Networks. arXiv:1704.02798,
        2017, sec. 3 (one weight sample per sequence); Blundell et al. 2015, eq. 3-4.
    """

    gates = 4

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                 unit_forget_bias=True, kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal",
                 **kwargs):
        super().__init__(units, activation=activation, recurrent_activation=recurrent_activation,
                         use_bias=use_bias, kernel_initializer=kernel_initializer,
                         recurrent_initializer=recurrent_initializer, **kwargs)
        self.unit_forget_bias = bool(unit_forget_bias)

    @property
    def state_size(self):
        return [self.units, self.units]

    def build(self, input_shape):
        super().build(input_shape)
        if self.use_bias and self.unit_forget_bias:
            u = self.units
            bias = tf.convert_to_tensor(self.bias_loc)
            self.bias_loc.assign(tf.concat([bias[:u], tf.ones([u], bias.dtype), bias[2 * u:]], axis=0))

    def step(self, inputs, states, kernel, bias):
        h, c = states[0], states[1]
        z = _batched_matmul(tf.concat([inputs, h], axis=-1), kernel)
        if bias is not None:
            z = _add_bias(z, bias)
        i, f, g, o = tf.split(z, 4, axis=-1)
        c = self.recurrent_activation(f) * c + self.recurrent_activation(i) * self.activation(g)
        h = self.recurrent_activation(o) * self.activation(c)
        return h, [h, c]

    def get_config(self):
        config = super().get_config()
        config["unit_forget_bias"] = self.unit_forget_bias
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class GRUCellReparameterization(RecurrentCellReparameterization):
    """Bayes-by-Backprop GRU cell, one weight sample per sequence (use it in ``keras.layers.RNN``).

    With the sampled ``W``, ``U`` and the bias ``b = [b_in; b_rec]`` (shape ``(2, 3
    units)``, drawn once per sequence), a step is Keras' GRU with ``reset_after=True``
    (Cho et al. 2014; gate order z, r, h as ``keras.layers.GRUCell``)::

        [xz, xr, xh] = x_t W + b_in,     [hz, hr, hh] = h_{t-1} U + b_rec
        z = sigma(xz + hz),  r = sigma(xr + hr),  n = tanh(xh + r * hh)
        h_t = z * h_{t-1} + (1 - z) * n

    Args:
        units: int > 0, size of the state.
        activation: default ``"tanh"``.
        recurrent_activation: default ``"sigmoid"``.
        use_bias: bool, default True.
        kernel_initializer: the initializer of ``mu`` of ``W`` (default ``"glorot_uniform"``).
        recurrent_initializer: of ``mu`` of ``U`` (default ``"orthogonal"``).
        **kwargs: the posterior's arguments and the base layer's, as
            :class:`LSTMCellReparameterization`.

    Call arguments: ``inputs`` ``(batch, input_dim)``, ``states`` ``[h]``, ``training``.
    Returns ``h, [h]``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> cell = tfbnn.layers.GRUCellReparameterization(4, kl_weight=1e-3, seed=0)
        >>> keras.layers.RNN(cell)(np.ones((2, 5, 3), "float32")).shape
        TensorShape([2, 4])

    Reference:
        Fortunato, Blundell, Vinyals. Bayesian Recurrent Neural Networks. arXiv:1704.02798,
        2017, sec. 3; Cho et al. 2014, eq. 5-8.
    """

    gates = 3

    @property
    def state_size(self):
        return self.units

    def bias_shape(self):
        return (2, self.gates * self.units)

    def step(self, inputs, states, kernel, bias):
        h = states[0] if isinstance(states, (list, tuple)) else states
        w, u = self.split_kernel(kernel)
        x = _batched_matmul(inputs, w)
        r = _batched_matmul(h, u)
        if bias is not None:
            x = _add_bias(x, bias[..., 0, :])
            r = _add_bias(r, bias[..., 1, :])
        xz, xr, xh = tf.split(x, 3, axis=-1)
        hz, hr, hh = tf.split(r, 3, axis=-1)
        z = self.recurrent_activation(xz + hz)
        reset = self.recurrent_activation(xr + hr)
        h = z * h + (1 - z) * self.activation(xh + reset * hh)
        return h, [h]


_RNN_ARGUMENTS = ("return_sequences", "return_state", "go_backwards", "stateful", "unroll", "zero_output_for_mask")


def _cell_arguments(cell_class):
    """The constructor arguments of a tfbnn cell class, along its tfbnn bases (not Keras' base layer's)."""
    names = set()
    for klass in cell_class.__mro__:
        if issubclass(klass, StochasticLayer) and "__init__" in klass.__dict__:
            names |= set(inspect.signature(klass.__init__).parameters)
    return names - {"self", "args", "kwargs"}


class _BayesianRNN(keras.layers.RNN):
    """``keras.layers.RNN`` over a Bayesian cell made from the layer's own arguments."""

    cell_class = None

    def __init__(self, units, return_sequences=False, return_state=False, go_backwards=False, stateful=False,
                 unroll=False, zero_output_for_mask=False, **kwargs):
        cell_names = _cell_arguments(self.cell_class)
        cell_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in cell_names}
        cell = self.cell_class(units, dtype=kwargs.get("dtype"), name="cell", **cell_kwargs)
        super().__init__(cell, return_sequences=return_sequences, return_state=return_state,
                         go_backwards=go_backwards, stateful=stateful, unroll=unroll,
                         zero_output_for_mask=zero_output_for_mask, **kwargs)
        self.supports_masking = True

    def call(self, sequences, initial_state=None, mask=None, training=False):
        self.cell.begin_sequence()  # before the loop, whatever keras.layers.RNN's hooks do
        try:
            return super().call(sequences, initial_state=initial_state, mask=mask, training=training)
        finally:
            self.cell.end_sequence()

    @property
    def units(self):
        return self.cell.units

    def kl_divergence(self):
        """The cell's ``KL(q || p)``, unscaled."""
        return self.cell.kl_divergence()

    def get_config(self):
        config = {k: getattr(self, k) for k in _RNN_ARGUMENTS}
        base = keras.layers.Layer.get_config(self)
        cell = self.cell.get_config()
        for key in ("name", "trainable", "dtype"):
            cell.pop(key, None)
        return {**base, **config, **cell}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _layer_doc(cell, keras_layer):
    return f"""A Bayes-by-Backprop ``keras.layers.{keras_layer}``: ``keras.layers.RNN`` over a :class:`{cell}`.

    One weight sample per sequence (per call), held fixed over the time steps; the KL
    ``kl_weight * KL(q || p)`` added once per call (:mod:`tfbnn.layers.recurrent`). It
    takes ``keras.layers.{keras_layer}``'s sequence arguments and the cell's arguments.

    Args:
        units: int > 0.
        return_sequences: bool, as ``keras.layers.RNN`` (and ``return_state``,
            ``go_backwards``, ``stateful``, ``unroll``, ``zero_output_for_mask``).
        **kwargs: the cell's arguments (:class:`{cell}`: ``activation``,
            ``recurrent_activation``, ``kernel_prior``, ``kl_weight``, ``seed``, ...) and the
            base layer's (``name``, ``dtype``).

    Input shape: ``(batch, timesteps, features)``; a mask (``keras.layers.Masking``,
    ``keras.layers.Embedding(mask_zero=True)``) is honoured as by ``keras.layers.RNN``.
    Output shape: ``(batch, units)``, or ``(batch, timesteps, units)`` with
    ``return_sequences``; with ``return_state`` followed by the final states.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((6, 3)),
        ...     tfbnn.layers.{cell.replace('Cell', '')}(8, kl_weight=1e-3, seed=0),
        ...     tfbnn.layers.DenseFlipout(2, activation="softmax", kl_weight=1e-3, seed=1),
        ... ])
        >>> tfbnn.predict(model, np.ones((4, 6, 3), "float32"), num_samples=5).mean_probs.shape
        (4, 2)

    Reference:
        Fortunato, Blundell, Vinyals. Bayesian Recurrent Neural Networks. arXiv:1704.02798, 2017, sec. 3.
    """


@keras.saving.register_keras_serializable(package="tfbnn")
class LSTMReparameterization(_BayesianRNN):
    __doc__ = _layer_doc("LSTMCellReparameterization", "LSTM")
    cell_class = LSTMCellReparameterization


@keras.saving.register_keras_serializable(package="tfbnn")
class GRUReparameterization(_BayesianRNN):
    __doc__ = _layer_doc("GRUCellReparameterization", "GRU")
    cell_class = GRUCellReparameterization
