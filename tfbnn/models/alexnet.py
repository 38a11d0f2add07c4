"""AlexNet (Krizhevsky et al. 2012): five convolutions 96-256-384-384-256, dense 4096-4096.

Two layouts of the same backbone (single tower, no local response normalization);
the head is a softmax dense layer.

=====  ==========================================  ==============================================
layer  ``layout="cifar"`` (inputs below 67x67)     ``layout="imagenet"`` (the original, 227x227)
=====  ==========================================  ==============================================
conv1  96 x 5x5, stride 1, same, ReLU;             96 x 11x11, stride 4, valid, ReLU;
       max pool 3x3 / 2, same (32 -> 16)           max pool 3x3 / 2 (55 -> 27)
conv2  256 x 5x5, same, ReLU; max pool (-> 8)      256 x 5x5, same, ReLU; max pool (-> 13)
conv3  384 x 3x3, same, ReLU                       384 x 3x3, same, ReLU
conv4  384 x 3x3, same, ReLU                       384 x 3x3, same, ReLU
conv5  256 x 3x3, same, ReLU; max pool (-> 4)      256 x 3x3, same, ReLU; max pool (-> 6)
fc6    dense 4096, ReLU (from 4 x 4 x 256)         dense 4096, ReLU (from 6 x 6 x 256)
fc7    dense 4096, ReLU                            dense 4096, ReLU
=====  ==========================================  ==============================================

Parameters (deterministic): 37,323,146 at 32x32x3 with 10 classes; 62,378,344 for the
original at 227x227x3 with 1000 classes (the usual "62.3M").

Bayesian layers per method: ``bbb`` / ``vd`` / ``ibnn``: all five convolutions and
the three dense layers; ``mc_dropout``: :class:`tfbnn.layers.MCSpatialDropout2D`
after each pooled stage (conv1, conv2, conv5) and :class:`tfbnn.layers.MCDropout`
after fc6 and fc7 (the original network's dropout positions).
"""

import keras

from tfbnn.models import _common

__all__ = ["alexnet", "LAYOUTS"]

#: Values of ``layout``.
LAYOUTS = ("cifar", "imagenet")
_FILTERS = (96, 256, 384, 384, 256)
_POOL_AFTER = (1, 2, 5)
# The smallest input the ImageNet layout takes (11x11 / 4, then three 3x3 / 2 pools).
_IMAGENET_MIN_SIDE = 67


def _resolve_layout(layout, input_shape):
    if layout is None:
        shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else ()
        sides = [d for d in shape[:2] if isinstance(d, int)]
        return "imagenet" if sides and min(sides) >= _IMAGENET_MIN_SIDE else "cifar"
    if layout not in LAYOUTS:
        raise ValueError(f"Expected `layout` in {LAYOUTS} or None. Received: layout={layout!r}")
    return layout


def alexnet(method="deterministic", *, layout=None, **kwargs):
    """AlexNet for ``method``; softmax outputs.

    Inputs ``(height, width, channels)`` (default ``input_shape`` ``(32, 32, 3)``), at
    least 8x8 in the CIFAR layout and 67x67 in the ImageNet one.

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        layout: ``"cifar"``, ``"imagenet"`` or None (default: ``"imagenet"`` for
            inputs of at least 67x67, ``"cifar"`` below); see the module table.
        **kwargs: the zoo's common arguments and the method's options (:func:`tfbnn.models.build`).

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"alexnet_<method>"``.
    """
    layout = _resolve_layout(layout, kwargs.get("input_shape", (32, 32, 3)))
    min_side = 8 if layout == "cifar" else _IMAGENET_MIN_SIDE
    build = _common.start(method, kwargs, f"alexnet (layout={layout!r})", min_side=min_side)
    pool_padding = "same" if layout == "cifar" else "valid"
    x = build.inputs
    for i, filters in enumerate(_FILTERS, 1):
        if i == 1:
            kernel, strides, padding = (5, 1, "same") if layout == "cifar" else (11, 4, "valid")
        else:
            kernel, strides, padding = (5 if i == 2 else 3), 1, "same"
        x = build.factory.conv2d(filters, kernel, strides=strides, padding=padding, activation="relu",
                                 name=f"conv{i}")(x)
        if i in _POOL_AFTER:
            x = keras.layers.MaxPooling2D(3, strides=2, padding=pool_padding, name=f"pool{i}")(x)
            x = build.factory.spatial_dropout(x, name=f"dropout_conv{i}")
    x = keras.layers.Flatten(name="flatten")(x)
    for i in (6, 7):
        x = _common.hidden_dense(x, build.factory, 4096, "relu", f"fc{i}", f"dropout_fc{i}")
    return build.classifier(x, "alexnet")
