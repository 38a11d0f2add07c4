"""LeNet-5 (LeCun et al. 1998), the small convolutional net of the CIFAR comparison.

Backbone::

    conv1  6 filters 5x5, sigmoid  -> average pool 2x2
    conv2 16 filters 5x5, sigmoid  -> average pool 2x2
    flatten -> dense 120, sigmoid -> dense 84, sigmoid

Head: softmax dense. ``padding="valid"`` (default) is the original network: 62,006
parameters at 32x32x3 with 10 classes, 61,706 at 32x32x1 (LeCun's padded MNIST).
Inputs smaller than 16x16 (the offline 8x8 digits) need ``padding="same"``.
``width_multiplier`` scales every hidden layer (6, 16, 120, 84 filters / units), as the
iBNN paper's LeNet width sweep does; ``kernel_size``, ``pooling`` and ``activation``
give its variant (3x3 kernels on 8x8 inputs, max pooling, ReLU).

Bayesian layers per method: ``bbb`` / ``vd`` / ``ibnn`` make both convolutions and all
three dense layers Bayesian; ``mc_dropout`` adds
:class:`tfbnn.layers.MCSpatialDropout2D` after each conv stage (after the pooling)
and :class:`tfbnn.layers.MCDropout` after each hidden dense layer (Gal and
Ghahramani's "LeNet-all").
"""

import keras

from tfbnn._internal import checks
from tfbnn.models import _common

__all__ = ["lenet5", "small_image_options"]

_PADDINGS = ("valid", "same")


def small_image_options(side):
    """The builder options that fit LeNet-5 to images of side ``side``: ``padding="same"`` below 16x16."""
    return {"padding": "same"} if side < 16 else {}
_POOLING = {"average": keras.layers.AveragePooling2D, "max": keras.layers.MaxPooling2D}
_WIDTHS = (6, 16, 120, 84)


def lenet5(method="deterministic", *, padding="valid", activation="sigmoid", width_multiplier=1, kernel_size=5,
           pooling="average", **kwargs):
    """LeNet-5 for ``method``; softmax outputs.

    Inputs ``(height, width, channels)`` (default ``input_shape`` ``(32, 32, 3)``).

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        padding: ``"valid"`` (default, the original; needs >= 16x16 inputs) or
            ``"same"`` (keeps the size through the convolutions; for tiny inputs).
        activation: activation of the conv and hidden dense layers. Default
            ``"sigmoid"`` (as in the comparison); ``"relu"`` trains faster.
        width_multiplier: int >= 1; every hidden layer has this many times its
            filters / units (the dense weights grow with its square). Default 1.
        kernel_size: int >= 1, the convolutions' kernel side. Default 5.
        pooling: ``"average"`` (default, LeCun's subsampling) or ``"max"``.
        **kwargs: the zoo's common arguments and the method's options (:func:`tfbnn.models.build`).

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"lenet5_<method>"``.

    Example:
        >>> import tfbnn
        >>> model = tfbnn.models.lenet5("mc_dropout", rate=0.2)
        >>> [type(layer).__name__ for layer in model.layers if "Dropout" in type(layer).__name__]
        ['MCSpatialDropout2D', 'MCSpatialDropout2D', 'MCDropout', 'MCDropout']
    """
    if padding not in _PADDINGS:
        raise ValueError(f"Expected `padding` in {_PADDINGS}. Received: padding={padding!r}")
    if pooling not in _POOLING:
        raise ValueError(f"Expected `pooling` in {tuple(_POOLING)}. Received: pooling={pooling!r}")
    width_multiplier = checks.integer("width_multiplier", width_multiplier, 1)
    kernel_size = checks.integer("kernel_size", kernel_size, 1)
    c1, c2, f1, f2 = (w * width_multiplier for w in _WIDTHS)
    build = _common.start(method, kwargs, "lenet5", min_side=4 * kernel_size - 4 if padding == "valid" else 4)
    x = build.inputs
    for i, filters in enumerate((c1, c2), 1):
        x = build.factory.conv2d(filters, kernel_size, padding=padding, activation=activation, name=f"conv{i}")(x)
        x = _POOLING[pooling](2, name=f"pool{i}")(x)
        x = build.factory.spatial_dropout(x, name=f"dropout_conv{i}")
    x = keras.layers.Flatten(name="flatten")(x)
    for i, units in enumerate((f1, f2), 1):
        x = _common.hidden_dense(x, build.factory, units, activation, f"fc{i}", f"dropout_fc{i}")
    return build.classifier(x, "lenet5")
