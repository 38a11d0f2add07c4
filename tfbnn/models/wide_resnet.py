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

from tfbnn._internal import checks
from tfbnn.models import _common

__all__ = ["wide_resnet", "wide_resnet28_10"]


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


def wide_resnet(method="deterministic", *, depth=28, widen_factor=10, **kwargs):
    """WRN-``depth``-``widen_factor`` for ``method``; softmax outputs.

    Inputs ``(height, width, channels)`` of at least 8x8 (default ``input_shape``
    ``(32, 32, 3)``).

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        depth: int, ``6 n + 4`` (``n`` blocks per group). Default 28.
        widen_factor: int >= 1. Default 10.
        **kwargs: the zoo's common arguments and the method's options (:func:`tfbnn.models.build`),
            and ``ensemble`` / ``ensemble_size`` (a BatchEnsemble or rank-1 Bayesian WRN, the
            architecture of Wen et al. 2020 and Dusenberry et al. 2020 on CIFAR; see
            :class:`tfbnn.models.LayerFactory`).

    Returns:
        An uncompiled functional ``keras.Model``, by default named
        ``"wide_resnet<depth>_<widen_factor>_<method>"`` (``..._<ensemble>_<method>`` for an ensemble).
    """
    depth = checks.integer("depth", depth, 10)
    if (depth - 4) % 6:
        raise ValueError(f"Expected `depth` = 6 n + 4 (10, 16, 22, 28, ...). Received: depth={depth!r}")
    widen_factor = checks.integer("widen_factor", widen_factor, 1)
    build = _common.start(method, kwargs, "wide_resnet", min_side=8, ensembles=True)
    x = build.factory.conv2d(16, 3, padding="same", use_bias=False, name="conv1")(build.features)
    for g, (width, stride) in enumerate(zip((16, 32, 64), (1, 2, 2)), 1):
        for b in range(1, (depth - 4) // 6 + 1):
            x = _block(x, build.factory, width * widen_factor, stride if b == 1 else 1, name=f"group{g}_block{b}")
    x = build.factory.batch_norm(name="final_bn")(x)
    x = keras.layers.Activation("relu", name="final_relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    return build.classifier(x, f"wide_resnet{depth}_{widen_factor}")


def wide_resnet28_10(method="deterministic", **kwargs):
    """WRN-28-10 for ``method`` (:func:`wide_resnet` with ``depth=28, widen_factor=10``)."""
    for fixed in ("depth", "widen_factor"):
        if fixed in kwargs:
            raise ValueError(
                f"wide_resnet28_10 fixes `{fixed}`; use wide_resnet(...). Received: {fixed}={kwargs[fixed]!r}"
            )
    return wide_resnet(method, depth=28, widen_factor=10, **kwargs)
