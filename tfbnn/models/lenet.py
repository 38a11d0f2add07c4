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

from tfbnn.models import _common

__all__ = ["lenet5"]

_PADDINGS = ("valid", "same")
_POOLING = {"average": keras.layers.AveragePooling2D, "max": keras.layers.MaxPooling2D}
_WIDTHS = (6, 16, 120, 84)


def lenet5(
    method="deterministic",
    *,
    num_classes=10,
    input_shape=(32, 32, 3),
    num_examples=None,
    seed=None,
    padding="valid",
    activation="sigmoid",
    width_multiplier=1,
    kernel_size=5,
    pooling="average",
    bayesian_layers="all",
    name=None,
    **method_options,
):
    """LeNet-5 for ``method``; softmax outputs.

    Args:
        method: ``"deterministic"``, ``"mc_dropout"``, ``"bbb"``, ``"vd"``, ``"ibnn"``,
            or a :class:`tfbnn.models.LayerFactory`.
        num_classes: int >= 2.
        input_shape: ``(height, width, channels)``. Default ``(32, 32, 3)``.
        num_examples: int, N (required for bbb, vd, ibnn).
        seed: int or None.
        padding: ``"valid"`` (default, the original; needs >= 16x16 inputs) or
            ``"same"`` (keeps the size through the convolutions; for tiny inputs).
        activation: activation of the conv and hidden dense layers. Default
            ``"sigmoid"`` (as in the comparison); ``"relu"`` trains faster.
        width_multiplier: int >= 1; every hidden layer has this many times its
            filters / units (the dense weights grow with its square). Default 1.
        kernel_size: int >= 1, the convolutions' kernel side. Default 5.
        pooling: ``"average"`` (default, LeCun's subsampling) or ``"max"``.
        bayesian_layers: ``"all"`` (default) or ``"last"``: a deterministic body and a
            Bayesian head (:mod:`tfbnn.models.methods`).
        name: model name; default ``"lenet5_<method>"``.
        **method_options: the method's options.

    Returns:
        An uncompiled functional ``keras.Model``.

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
    for arg, value in (("width_multiplier", width_multiplier), ("kernel_size", kernel_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Expected `{arg}` to be a positive integer. Received: {arg}={value!r}")
    c1, c2, f1, f2 = (w * width_multiplier for w in _WIDTHS)
    min_side = 4 * kernel_size - 4 if padding == "valid" else 4
    factory, inputs = _common.prologue(method, method_options, num_examples, seed, num_classes,
                                       input_shape, 3, min_side, "lenet5", bayesian_layers=bayesian_layers)
    x = inputs
    for i, filters in enumerate((c1, c2), 1):
        x = factory.conv2d(filters, kernel_size, padding=padding, activation=activation, name=f"conv{i}")(x)
        x = _POOLING[pooling](2, name=f"pool{i}")(x)
        x = factory.spatial_dropout(x, name=f"dropout_conv{i}")
    x = keras.layers.Flatten(name="flatten")(x)
    for i, units in enumerate((f1, f2), 1):
        x = factory.dense(units, activation=activation, name=f"fc{i}")(x)
        x = factory.dropout(x, name=f"dropout_fc{i}")
    outputs = _common.classifier_head(x, factory, num_classes)
    return keras.Model(inputs, outputs, name=_common.model_name(name, "lenet5", factory))
