"""VGG-16 (Simonyan and Zisserman 2015), configuration D, as ``keras.applications.VGG16``.

Backbone: five blocks of 3x3 same-padded ReLU convolutions, (64, 64), (128, 128),
(256, 256, 256), (512, 512, 512), (512, 512, 512), each followed by a 2x2 max pool;
flatten, dense 4096 (``fc1``), dense 4096 (``fc2``), ReLU. Head: softmax dense
(``predictions``). No batch norm and no dropout in the deterministic net, as
keras.applications, whose layer names and parameter count it has: 33,638,218 at
32x32x3 with 10 classes, 138,357,544 at 224x224x3 with 1000.

Bayesian layers per method: ``bbb`` / ``vd`` / ``ibnn``: all 13 convolutions and the
three dense layers; ``mc_dropout``: :class:`tfbnn.layers.MCSpatialDropout2D` after each
of the five blocks (after its pooling) and :class:`tfbnn.layers.MCDropout` after fc1
and fc2.
"""

import keras

from tfbnn.models import _common

__all__ = ["vgg16", "BLOCKS"]

#: Filters of the convolutions of each block (configuration D).
BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def vgg16(
    method="deterministic",
    *,
    num_classes=10,
    input_shape=(32, 32, 3),
    num_examples=None,
    seed=None,
    bayesian_layers="all",
    name=None,
    **method_options,
):
    """VGG-16 for ``method``; softmax outputs.

    Args:
        method: ``"deterministic"``, ``"mc_dropout"``, ``"bbb"``, ``"vd"``, ``"ibnn"``,
            or a :class:`tfbnn.models.LayerFactory`.
        num_classes: int >= 2.
        input_shape: ``(height, width, channels)``, at least 32x32 (five 2x2 pools).
            Default ``(32, 32, 3)``.
        num_examples: int, N (required for bbb, vd, ibnn).
        seed: int or None.
        bayesian_layers: ``"all"`` (default) or ``"last"``: a deterministic body and a
            Bayesian head (:mod:`tfbnn.models.methods`).
        name: model name; default ``"vgg16_<method>"``.
        **method_options: the method's options.

    Returns:
        An uncompiled functional ``keras.Model``.
    """
    factory, inputs = _common.prologue(method, method_options, num_examples, seed, num_classes,
                                       input_shape, 3, 32, "vgg16", bayesian_layers=bayesian_layers)
    x = inputs
    for b, filters in enumerate(BLOCKS, 1):
        for c, f in enumerate(filters, 1):
            x = factory.conv2d(f, 3, padding="same", activation="relu", name=f"block{b}_conv{c}")(x)
        x = keras.layers.MaxPooling2D(2, strides=2, name=f"block{b}_pool")(x)
        x = factory.spatial_dropout(x, name=f"block{b}_dropout")
    x = keras.layers.Flatten(name="flatten")(x)
    for i in (1, 2):
        x = factory.dense(4096, activation="relu", name=f"fc{i}")(x)
        x = factory.dropout(x, name=f"fc{i}_dropout")
    outputs = _common.classifier_head(x, factory, num_classes)
    return keras.Model(inputs, outputs, name=_common.model_name(name, "vgg16", factory))
