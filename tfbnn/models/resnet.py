"""ResNet-50 (He et al. 2016): bottleneck blocks 3-4-6-3 with batch norm.

The layout of ``keras.applications.ResNet50`` (ResNet v1, stride on the first 1x1
convolution of a stage, convolutions with biases, batch norm epsilon 1.001e-5), so
the deterministic model has exactly its parameter count (23,608,202 with 10
classes, 25,636,712 with 1000) and its layer names (``conv2_block1_1_conv``, ...).

Stem (``stem``):

* ``"imagenet"`` (default): zero-pad 3, conv 64 x 7x7 / 2, BN, ReLU, zero-pad 1,
  max pool 3x3 / 2 (total stride 32: a 32x32 input ends at 1x1).
* ``"cifar"``: conv 64 x 3x3 / 1 (same), BN, ReLU, no pooling (total stride 8: a
  32x32 input ends at 4x4; about 16x the compute of the ImageNet stem at 32x32).

Stages: ``conv2`` 3 blocks of (64, 64, 256), ``conv3`` 4 of 128, ``conv4`` 6 of 256,
``conv5`` 3 of 512; each block ``1x1 -> 3x3 -> 1x1`` convolutions with BN (ReLU after
the first two and after the residual sum), a 1x1 projection shortcut with BN in the
first block of each stage. Head: global average pooling, softmax dense.

Bayesian layers per method: ``bbb`` / ``vd`` / ``ibnn`` make all 53 convolutions
(stem, blocks and projection shortcuts) and the head Bayesian, batch norm stays
deterministic; ``mc_dropout`` adds :class:`tfbnn.layers.MCSpatialDropout2D` after every
residual block (after the sum and ReLU, 16 in all).

Ensembles (``ensemble``, ``ensemble_size``; Wen et al. 2020, Dusenberry et al. 2020): with
``"batch_ensemble"`` (methods ``deterministic``, ``mc_dropout``) or ``"rank1"`` (method
``bbb``) every convolution and the head hold E members sharing one weight
(:mod:`tfbnn.layers.rank1`); batch norm is shared by the members; the input is repeated
for the members at inference and their softmax outputs averaged.
"""

import keras

from tfbnn.models import _common

__all__ = ["resnet50", "STEMS", "STAGES", "small_image_options"]

def small_image_options(side):
    """The builder options that fit ResNet-50 to images of side ``side``: the CIFAR stem below 32x32."""
    return {"stem": "cifar"} if side < 32 else {}


#: Values of ``stem``.
STEMS = ("imagenet", "cifar")
#: ``(name, bottleneck filters, blocks, stride of the first block)`` per stage.
STAGES = (("conv2", 64, 3, 1), ("conv3", 128, 4, 2), ("conv4", 256, 6, 2), ("conv5", 512, 3, 2))
_BN_EPSILON = 1.001e-5  # keras.applications' value


def _bottleneck(x, factory, filters, stride, projection, name):
    """One bottleneck block of ``keras.applications.resnet.block1``."""
    if projection:
        shortcut = factory.conv2d(4 * filters, 1, strides=stride, name=f"{name}_0_conv")(x)
        shortcut = factory.batch_norm(epsilon=_BN_EPSILON, name=f"{name}_0_bn")(shortcut)
    else:
        shortcut = x
    y = factory.conv2d(filters, 1, strides=stride, name=f"{name}_1_conv")(x)
    y = factory.batch_norm(epsilon=_BN_EPSILON, name=f"{name}_1_bn")(y)
    y = keras.layers.Activation("relu", name=f"{name}_1_relu")(y)
    y = factory.conv2d(filters, 3, padding="same", name=f"{name}_2_conv")(y)
    y = factory.batch_norm(epsilon=_BN_EPSILON, name=f"{name}_2_bn")(y)
    y = keras.layers.Activation("relu", name=f"{name}_2_relu")(y)
    y = factory.conv2d(4 * filters, 1, name=f"{name}_3_conv")(y)
    y = factory.batch_norm(epsilon=_BN_EPSILON, name=f"{name}_3_bn")(y)
    y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
    y = keras.layers.Activation("relu", name=f"{name}_out")(y)
    return factory.spatial_dropout(y, name=f"{name}_dropout")


def _stem(x, factory, stem):
    if stem == "imagenet":
        x = keras.layers.ZeroPadding2D(3, name="conv1_pad")(x)
        x = factory.conv2d(64, 7, strides=2, name="conv1_conv")(x)
    else:
        x = factory.conv2d(64, 3, padding="same", name="conv1_conv")(x)
    x = factory.batch_norm(epsilon=_BN_EPSILON, name="conv1_bn")(x)
    x = keras.layers.Activation("relu", name="conv1_relu")(x)
    if stem == "imagenet":
        x = keras.layers.ZeroPadding2D(1, name="pool1_pad")(x)
        x = keras.layers.MaxPooling2D(3, strides=2, name="pool1_pool")(x)
    return x


def resnet50(method="deterministic", *, stem="imagenet", **kwargs):
    """ResNet-50 for ``method``; softmax outputs.

    Inputs ``(height, width, channels)`` of at least 32x32 with the ImageNet stem, 8x8
    with the CIFAR stem (default ``input_shape`` ``(32, 32, 3)``).

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        stem: ``"imagenet"`` (default, 7x7 / 2 + max pool, as keras.applications) or
            ``"cifar"`` (3x3 / 1, no pooling).
        **kwargs: the zoo's common arguments and the method's options (:func:`tfbnn.models.build`),
            and ``ensemble`` (None, ``"batch_ensemble"`` with ``deterministic`` or ``mc_dropout``, or
            ``"rank1"`` with ``bbb``) and ``ensemble_size`` (E, default 4): a BatchEnsemble or
            rank-1 Bayesian ResNet (:class:`tfbnn.models.LayerFactory`).

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"resnet50_<method>"``.
    """
    if stem not in STEMS:
        raise ValueError(f"Expected `stem` in {STEMS}. Received: stem={stem!r}")
    build = _common.start(method, kwargs, f"resnet50 (stem={stem!r})", min_side=32 if stem == "imagenet" else 8,
                          ensembles=True)
    x = _stem(build.features, build.factory, stem)
    for stage, filters, blocks, stride in STAGES:
        for b in range(1, blocks + 1):
            x = _bottleneck(x, build.factory, filters, stride if b == 1 else 1, b == 1, name=f"{stage}_block{b}")
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    return build.classifier(x, "resnet50")
