"""Wide ResNet 28-10 (Zagoruyko and Komodakis 2016), the CIFAR network.

Pre-activation basic blocks (BN, ReLU, conv 3x3; BN, ReLU, conv 3x3) without
convolution biases; depth 28 gives ``(28 - 4) / 6 = 4`` blocks per group and widen
factor 10 the widths 160, 320, 640::

    conv 16 x 3x3 (same)
    group 1: 4 blocks of 160, stride 1     (32x32)
    group 2: 4 blocks of 320, stride 2     (16x16)
    group 3: 4 blocks of 640, stride 2     (8x8)
    BN, ReLU, global average pooling, softmax dense

The first block of a group changes the width, so its shortcut is a 1x1 convolution
(stride of the group) of the pre-activated input, as in the authors' code. Parameters
(deterministic, CIFAR-10): 36,479,194 trainable (the paper's 36.5M); Keras'
``count_params()`` also counts the 17,952 batch-norm moving statistics (36,497,146).

Bayesian layers per method: ``bbb`` / ``vd`` / ``ibnn``: all 28 convolutions (shortcut
projections included) and the head; batch norm stays deterministic. ``mc_dropout``:
:class:`tfbnn.layers.MCSpatialDropout2D` between the two convolutions of every block,
the position of the paper's dropout (sec. 2.4), channel-wise.
"""

import keras

from tfbnn.models import _common

__all__ = ["wide_resnet", "wide_resnet28_10"]


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"Expected `{name}` to be an integer >= {low}. Received: {name}={value!r}")
    return value


def _block(x, factory, width, stride, name):
    pre = factory.batch_norm(name=f"{name}_bn1")(x)
    pre = keras.layers.Activation("relu", name=f"{name}_relu1")(pre)
    if stride != 1 or x.shape[-1] != width:
        shortcut = factory.conv2d(width, 1, strides=stride, use_bias=False, name=f"{name}_shortcut")(pre)
    else:
        shortcut = x
    y = factory.conv2d(width, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1")(pre)
    y = factory.batch_norm(name=f"{name}_bn2")(y)
    y = keras.layers.Activation("relu", name=f"{name}_relu2")(y)
    y = factory.spatial_dropout(y, name=f"{name}_dropout")
    y = factory.conv2d(width, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    return keras.layers.Add(name=f"{name}_add")([shortcut, y])


def wide_resnet(
    method="deterministic",
    *,
    depth=28,
    widen_factor=10,
    num_classes=10,
    input_shape=(32, 32, 3),
    num_examples=None,
    seed=None,
    bayesian_layers="all",
    name=None,
    **method_options,
):
    """WRN-``depth``-``widen_factor`` for ``method``; softmax outputs.

    Args:
        method: ``"deterministic"``, ``"mc_dropout"``, ``"bbb"``, ``"vd"``, ``"ibnn"``,
            or a :class:`tfbnn.models.LayerFactory`.
        depth: int, ``6 n + 4`` (``n`` blocks per group). Default 28.
        widen_factor: int >= 1. Default 10.
        num_classes: int >= 2.
        input_shape: ``(height, width, channels)``, at least 8x8. Default ``(32, 32, 3)``.
        num_examples: int, N (required for bbb, vd, ibnn).
        seed: int or None.
        bayesian_layers: ``"all"`` (default) or ``"last"``: a deterministic body and a
            Bayesian head (:mod:`tfbnn.models.methods`).
        name: model name; default ``"wide_resnet<depth>_<widen_factor>_<method>"``.
        **method_options: the method's options.

    Returns:
        An uncompiled functional ``keras.Model``.
    """
    _check_int("depth", depth, 10)
    if (depth - 4) % 6:
        raise ValueError(f"Expected `depth` = 6 n + 4 (10, 16, 22, 28, ...). Received: depth={depth!r}")
    _check_int("widen_factor", widen_factor, 1)
    factory, inputs = _common.prologue(method, method_options, num_examples, seed, num_classes,
                                       input_shape, 3, 8, "wide_resnet", bayesian_layers=bayesian_layers)
    x = factory.conv2d(16, 3, padding="same", use_bias=False, name="conv1")(inputs)
    for g, (width, stride) in enumerate(zip((16, 32, 64), (1, 2, 2)), 1):
        for b in range(1, (depth - 4) // 6 + 1):
            x = _block(x, factory, width * widen_factor, stride if b == 1 else 1, name=f"group{g}_block{b}")
    x = factory.batch_norm(name="final_bn")(x)
    x = keras.layers.Activation("relu", name="final_relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = _common.classifier_head(x, factory, num_classes)
    default = f"wide_resnet{depth}_{widen_factor}"
    return keras.Model(inputs, outputs, name=_common.model_name(name, default, factory))


def wide_resnet28_10(method="deterministic", **kwargs):
    """WRN-28-10 for ``method`` (:func:`wide_resnet` with ``depth=28, widen_factor=10``)."""
    for fixed in ("depth", "widen_factor"):
        if fixed in kwargs:
            raise ValueError(
                f"wide_resnet28_10 fixes `{fixed}`; use wide_resnet(...). Received: {fixed}={kwargs[fixed]!r}"
            )
    return wide_resnet(method, depth=28, widen_factor=10, **kwargs)
