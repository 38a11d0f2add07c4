"""Model-level helpers: find Bayesian layers, set their KL weight and sampling mode."""

import contextlib

import keras
import tensorflow as tf

from tfbnn._internal import checks, keras_private
from tfbnn.layers.base import INFERENCE_MODES, BayesianLayer, StochasticLayer, validate_kl_weight

__all__ = [
    "stochastic_layers",
    "bayesian_layers",
    "set_kl_weight",
    "set_inference_mode",
    "posterior_mean",
    "weight_samples",
    "kl_divergence",
    "tile_rows",
    "NetworkWrapper",
    "reset_compiled_functions",
    "build_for_fit",
]


def stochastic_layers(model):
    """All :class:`tfbnn.layers.StochasticLayer` instances in ``model`` (Bayesian layers,
    MC dropout, ...), nested ones included."""
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(f"Expected a Keras model or layer. Received: model={model!r}")
    # Keras' own traversal: covers Sequential, functional, subclassed and nested models.
    layers = keras_private.sublayers(model, include_self=True)
    return [layer for layer in layers if isinstance(layer, StochasticLayer)]


def bayesian_layers(model):
    """All :class:`tfbnn.layers.BayesianLayer` instances (layers with a KL term) in ``model``."""
    return [layer for layer in stochastic_layers(model) if isinstance(layer, BayesianLayer)]


def set_kl_weight(model, value):
    """Sets ``kl_weight = value`` (``beta / N``) on every Bayesian layer of ``model``.

    Args:
        model: a Keras model or layer.
        value: float >= 0.

    Returns:
        The number of layers set.
    """
    layers = bayesian_layers(model)
    value = validate_kl_weight(value, "value", allow_none=False)
    for layer in layers:
        layer.set_kl_weight(value)
    return len(layers)


_COMPILED = ("predict_function", "test_function", "train_function")


def _reset_compiled_functions(model):
    """Drops Keras' cached step functions and returns them.

    The sampling switch is read when a step function is traced, so after a mode
    change the next ``predict``/``evaluate``/``fit`` must retrace. A context that
    restores the old modes can hand the returned functions back with
    :func:`_restore_compiled_functions`, so leaving it costs no retrace.
    """
    saved = {attr: getattr(model, attr, None) for attr in _COMPILED}
    for attr, fn in saved.items():
        if fn is not None:
            setattr(model, attr, None)
    return saved


def reset_compiled_functions(model):
    """Drops ``model``'s cached Keras step functions, so that the next ``predict``,
    ``evaluate`` or ``fit`` traces them again.

    A traced step has baked in what it read from the layers' Python attributes: the
    sampling mode, the priors (:func:`tfbnn.continual.posterior_as_prior` changes
    them). ``compile`` drops them too.
    """
    _reset_compiled_functions(model)


def build_for_fit(model, data_batch):
    """Creates a compiled model's training state (optimizer slots, loss and metric
    variables) now, so that ``fit`` traces its train step once.

    Without a distribution strategy Keras 3 creates that state inside the first traced
    train step, and ``tf.function`` then traces the step a second time; for a big
    Bayesian network on a CPU that is most of the first epoch (ResNet-50 with Bayes by
    Backprop at 32x32: a one-batch first ``fit`` took 23 s after this call, 37 s
    without). This runs Keras' own symbolic build, which Keras itself runs first under a
    strategy; where that build is missing (another Keras) it builds the optimizer
    through its public API. A model compiled with ``run_eagerly=True`` or used while
    ``tf.config.run_functions_eagerly(True)`` is on (nothing is traced, and the symbolic
    build would only trace the model's graph once for nothing: 5 s of CPU time for
    ResNet-50 with Bayes by Backprop), a model that belongs to a strategy whose scope is
    not entered (Keras builds it there) and a built model are left as they are.

    Args:
        model: a compiled ``keras.Model``.
        data_batch: ``(x, y)`` of one training batch, as arrays, tensors or
            ``tf.TensorSpec`` (e.g. ``dataset.element_spec``); only shapes and dtypes
            are read.

    Returns:
        ``model``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, activation="softmax", seed=0)])
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> x, y = np.zeros((8, 4), "float32"), np.zeros((8,), "int32")
        >>> tfbnn.utils.build_for_fit(model, (x, y)).optimizer.built
        True
    """
    if model.run_eagerly or tf.config.functions_run_eagerly():
        return model  # nothing is traced: Keras builds the state in the first (eager) step
    if model.distribute_strategy is not tf.distribute.get_strategy():
        return model  # a strategy's model outside its scope (Keras builds it there)
    if not keras_private.symbolic_build(model, data_batch) and model.optimizer is not None and (
            not model.optimizer.built):
        model.optimizer.build(model.trainable_variables)
    return model


def _restore_compiled_functions(model, saved):
    for attr, fn in saved.items():
        if hasattr(model, attr):
            setattr(model, attr, fn)


def set_inference_mode(model, mode):
    """Switches every Bayesian layer of ``model`` to ``"sample"`` or ``"mean"``.

    ``"mean"`` gives posterior-mean (deterministic) predictions, ``"sample"`` draws
    from the posterior at every call. Training always samples. Works for any model,
    ``Sequential`` included, without call arguments.

    Returns:
        A dict ``{layer_name: previous_mode}`` usable to restore the old modes.
    """
    if mode not in INFERENCE_MODES:
        raise ValueError(f"Expected `mode` in {INFERENCE_MODES}. Received: mode={mode!r}")
    previous = {}
    for layer in stochastic_layers(model):
        previous[layer.name] = layer.inference_mode
        layer.inference_mode = mode
    _reset_compiled_functions(model)
    return previous


@contextlib.contextmanager
def posterior_mean(model):
    """Context manager: posterior-mean predictions inside, previous modes after.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, seed=0)])
        >>> x = np.ones((2, 4), "float32")
        >>> with tfbnn.posterior_mean(model):
        ...     y_mean = model.predict(x, verbose=0)
        >>> bool(np.allclose(y_mean, x @ model.layers[0].kernel_loc.numpy()))   # x mu (+ bias 0)
        True
        >>> bool(np.allclose(model.predict(x, verbose=0), y_mean))   # sampled again outside
        False
    """
    saved = _reset_compiled_functions(model)
    previous = set_inference_mode(model, "mean")
    try:
        yield model
    finally:
        for layer in stochastic_layers(model):
            layer.inference_mode = previous.get(layer.name, layer.inference_mode)
        _restore_compiled_functions(model, saved)


@contextlib.contextmanager
def weight_samples(model, num_samples, joint=False, with_kl=False):
    """Context manager for vectorized Monte Carlo prediction with T weight samples.

    Inside it, ``model`` expects its batch tiled sample-major, ``(T * B, ...)``
    (rows ``t * B .. t * B + B - 1`` belong to sample ``t``). Tiling the batch
    without this context gives T *identical* samples for layers that share one
    weight sample across a batch (reparameterization, Flipout). Two modes:

    * ``joint=False`` (default; what per-example predictive summaries need): every
      row gets its own independent weight sample. For the mean-field Gaussian
      layers this is done exactly by local reparameterization (each row's
      pre-activations have the distribution of its own weight sample), with no
      weight-sized random draw at all.
    * ``joint=True``: each block of B rows shares one weight sample, T independent
      samples in all, applied with one batched matmul: coherent function draws
      (e.g. sampled regression curves), at the cost of T weight-sized draws.

    Layers that sample per row anyway (local reparameterization, MC dropout) are
    the same in both modes. Inside the context the layers add no KL loss (a
    prediction has no use for it) unless ``with_kl=True``.

    Args:
        model: a Keras model.
        num_samples: int >= 1, T.
        joint: bool, see above.
        with_kl: bool. True (for training with T samples, see
            :class:`tfbnn.MultiSampleModel`; needs ``joint=True``): every Bayesian
            layer adds ``kl_weight * KL`` as in an ordinary call, the KL averaged
            over the T samples: a closed-form KL once, a Monte Carlo KL as the mean
            of its T one-sample estimates (at the T weight draws of the forward
            pass; local reparameterization draws T weight samples for it).
    """
    num_samples = checks.integer("num_samples", num_samples, 1)
    if with_kl and not joint:
        raise ValueError(
            "Expected `joint=True` with `with_kl=True`: a training loss needs T whole-network "
            f"weight samples. Received: joint={joint!r}"
        )
    layers = stochastic_layers(model)
    previous = [layer.set_weight_samples(num_samples, joint=joint, with_kl=with_kl) for layer in layers]
    saved = _reset_compiled_functions(model)
    try:
        yield model
    finally:
        for layer, setting in zip(layers, previous):
            layer.set_weight_samples(*setting)
        _restore_compiled_functions(model, saved)


def kl_divergence(model):
    """Sum of the unscaled KL of all Bayesian layers of ``model`` (a scalar tensor)."""
    return sum(layer.kl_divergence() for layer in bayesian_layers(model))


def tile_rows(x, times):
    """``x`` (a nest of tensors, or None) tiled ``times`` times along the rows, sample-major."""
    if x is None:
        return None
    return tf.nest.map_structure(
        lambda v: tf.tile(v, tf.concat([[times], tf.ones([tf.rank(v) - 1], tf.int32)], axis=0)), x
    )


class NetworkWrapper(keras.Model):
    """Base of the models that train a wrapped ``self.network`` their own way
    (:class:`tfbnn.ibnn.IBNNModel`, :class:`tfbnn.MultiSampleModel`): calls go to the
    network unchanged, and the config holds it under ``"model"``."""

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        model = keras.saving.deserialize_keras_object(config.pop("model"), custom_objects=custom_objects)
        return cls(model, **config)
