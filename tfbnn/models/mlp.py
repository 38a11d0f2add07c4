"""Multilayer perceptrons: Blundell's 2 x 1200, LeNet-300-100, one hidden layer of 400/800/1200.

Backbone: ``Flatten`` (for image inputs), then one ReLU dense layer per entry of
``hidden_units``. Head: a softmax dense layer (:func:`tfbnn.models._common.classifier_head`).

Bayesian layers per method (:mod:`tfbnn.models.methods`): ``bbb`` / ``vd`` / ``ibnn``
make every dense layer, head included, Bayesian; ``mc_dropout`` adds
:class:`tfbnn.layers.MCDropout` (``rate``) after every hidden layer.

Presets (:data:`PRESETS`, also names of :func:`tfbnn.models.build`):

=================  ============  ===================================  ========================================
name               hidden units  parameters (784 inputs, 10 classes)  source
=================  ============  ===================================  ========================================
``mlp_blundell``   1200, 1200    2,395,210                            Blundell et al. 2015 (MNIST, sec. 5.1)
``lenet_300_100``  300, 100      266,610                              LeCun et al. 1998; Molchanov et al. 2017
``mlp_400``        400           318,010                              Blundell et al. 2015 (one hidden layer
``mlp_800``        800           636,010                              of 400, 800 or 1200 units)
``mlp_1200``       1200          954,010
=================  ============  ===================================  ========================================
"""

import keras

from tfbnn._internal import checks
from tfbnn.models import _common

__all__ = ["mlp", "PRESETS"]

#: Preset name -> hidden units.
PRESETS = {
    "mlp_blundell": (1200, 1200),
    "lenet_300_100": (300, 100),
    "mlp_400": (400,),
    "mlp_800": (800,),
    "mlp_1200": (1200,),
}


def _check_hidden_units(hidden_units):
    if isinstance(hidden_units, str):
        if hidden_units not in PRESETS:
            raise ValueError(
                f"Unknown MLP preset. Expected one of {list(PRESETS)}. Received: hidden_units={hidden_units!r}"
            )
        return PRESETS[hidden_units]
    units = tuple(hidden_units) if isinstance(hidden_units, (tuple, list)) else None
    if units is None or not all(isinstance(u, int) and not isinstance(u, bool) and u > 0 for u in units):
        raise ValueError(
            "Expected `hidden_units` to be a preset name or a sequence of positive integers. "
            f"Received: hidden_units={hidden_units!r}"
        )
    return units


def mlp(method="deterministic", *, hidden_units=(1200, 1200), activation="relu", outputs=None, normalization=None,
        **kwargs):
    """A classifier MLP for ``method``; softmax outputs (or a regression MLP: ``outputs``).

    Inputs of any shape (default ``input_shape`` ``(784,)``); inputs of rank > 1 are flattened.

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        hidden_units: tuple of ints, or a preset name of :data:`PRESETS`. Default
            ``(1200, 1200)`` (Blundell et al. 2015).
        activation: hidden activation. Default ``"relu"``.
        outputs: None (a classifier: ``num_classes`` softmax units) or an int >= 1:
            a regression net with that many linear outputs (``num_classes`` unused).
        normalization: None, or ``(mean, variance)`` of the inputs: a
            ``keras.layers.Normalization`` standardizes them first (deterministic).
        **kwargs: the zoo's common arguments and the method's options (:func:`tfbnn.models.build`).

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"mlp_<method>"``
        (compile with ``"sparse_categorical_crossentropy"``).

    Example:
        >>> import numpy as np, tfbnn
        >>> model = tfbnn.models.mlp("bbb", hidden_units="lenet_300_100", num_examples=60_000)
        >>> [(type(layer).__name__, layer.units) for layer in model.layers[1:]]
        [('DenseFlipout', 300), ('DenseFlipout', 100), ('DenseFlipout', 10)]
        >>> float(model.layers[1].kl_weight.numpy()) == float(np.float32(1 / 60_000))   # 1 / N
        True
    """
    units = _check_hidden_units(hidden_units)
    outputs = checks.integer("outputs", outputs, 1, allow_none=True)
    build = _common.start(method, kwargs, "mlp", rank=None, input_shape=(784,), classifier=outputs is None)
    x = keras.layers.Flatten(name="flatten")(build.inputs) if len(build.inputs.shape) > 2 else build.inputs
    if normalization is not None:
        mean, variance = normalization
        x = keras.layers.Normalization(mean=float(mean), variance=float(variance), name="standardize")(x)
    for i, u in enumerate(units, 1):
        x = _common.hidden_dense(x, build.factory, u, activation, f"dense_{i}", f"dropout_{i}")
    if outputs is None:
        return build.classifier(x, "mlp")
    y = build.factory.head_dropout(x, name="predictions_dropout")
    return build.model(build.factory.head(outputs, activation=None, name="predictions")(y), "mlp")
