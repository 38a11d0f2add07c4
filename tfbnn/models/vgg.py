"""VGG-16 (Simonyan and Zisserman 2015), configuration D, in two variants.

Backbone: five blocks of 3x3 same-padded ReLU convolutions, (64, 64), (128, 128),
(256, 256, 256), (512, 512, 512), (512, 512, 512), each followed by a 2x2 max pool;
flatten, then two ReLU dense layers (``fc1``, ``fc2``) and the softmax dense head
(``predictions``). No batch norm and no dropout in the deterministic net. The
variants differ in the width of ``fc1`` and ``fc2`` (:data:`VARIANTS`):

* ``"imagenet"`` (default): 4096 units, as ``keras.applications.VGG16``, whose layer
  names and parameter count it has: 33,638,218 at 32x32x3 with 10 classes,
  138,357,544 at 224x224x3 with 1000.
* ``"small"``: 512 units, "VGG16-small", the CIFAR network of the iBNN paper (Trinh et
  al. 2022; official code ``models/vgg.py``, classifier 512-512-512-classes):
  15,245,130 parameters at 32x32x3 with 10 classes (14,714,688 in the convolutions).
  Also built by :func:`vgg16_small`.

With ``method="ibnn"`` every layer multiplies its *inputs* by noise, one variable per
input channel or feature: 3 + 64 + 64 + 128 + 128 + 256 * 3 + 512 * 5 = 3,715 for the
13 convolutions and 512 * 3 = 1,536 for the three dense layers of VGG16-small at 32x32
(the flattened 1x1x512 map feeds ``fc1``): 5,251 noise variables, the number the paper
states.

Bayesian layers per method: ``bbb`` / ``vd`` / ``ibnn``: all 13 convolutions and the
three dense layers; ``mc_dropout``: :class:`tfbnn.layers.MCSpatialDropout2D` after each
of the five blocks (after its pooling) and :class:`tfbnn.layers.MCDropout` after fc1
and fc2.
"""

import keras

from tfbnn.models import _common

__all__ = ["vgg16", "vgg16_small", "BLOCKS", "VARIANTS"]

#: Filters of the convolutions of each block (configuration D).
BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
#: ``variant`` -> units of ``fc1`` and ``fc2``.
VARIANTS = {"imagenet": 4096, "small": 512}


def vgg16(method="deterministic", *, variant="imagenet", **kwargs):
    """VGG-16 for ``method``; softmax outputs.

    Inputs ``(height, width, channels)`` of at least 32x32 (five 2x2 pools; default
    ``input_shape`` ``(32, 32, 3)``).

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        variant: ``"imagenet"`` (default; fc1 and fc2 of 4096 units, 33.6M parameters
            at 32x32x10) or ``"small"`` (512 units, VGG16-small, 15.2M).
        **kwargs: the zoo's common arguments and the method's options (:func:`tfbnn.models.build`).

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"vgg16_<method>"``
        (``"vgg16_small_<method>"``).

    Example:
        >>> import tfbnn
        >>> tfbnn.models.vgg16(variant="small").count_params()
        15245130
    """
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ValueError(f"Expected `variant` in {list(VARIANTS)}. Received: variant={variant!r}")
    build = _common.start(method, kwargs, "vgg16", min_side=32)
    x = build.inputs
    for b, filters in enumerate(BLOCKS, 1):
        for c, f in enumerate(filters, 1):
            x = build.factory.conv2d(f, 3, padding="same", activation="relu", name=f"block{b}_conv{c}")(x)
        x = keras.layers.MaxPooling2D(2, strides=2, name=f"block{b}_pool")(x)
        x = build.factory.spatial_dropout(x, name=f"block{b}_dropout")
    x = keras.layers.Flatten(name="flatten")(x)
    for i in (1, 2):
        x = _common.hidden_dense(x, build.factory, VARIANTS[variant], "relu", f"fc{i}", f"fc{i}_dropout")
    return build.classifier(x, "vgg16" if variant == "imagenet" else f"vgg16_{variant}")


def vgg16_small(method="deterministic", **kwargs):
    """VGG16-small (``vgg16(method, variant="small", ...)``), the iBNN paper's CIFAR network.

    Example:
        >>> import tfbnn
        >>> model = tfbnn.models.vgg16_small("ibnn", num_examples=50_000)
        >>> sum(layer.num_nodes for layer in tfbnn.ibnn.node_layers(model))  # noise variables
        5251
    """
    if "variant" in kwargs:
        raise ValueError(f"vgg16_small fixes `variant`; use vgg16(...). Received: variant={kwargs['variant']!r}")
    return vgg16(method, variant="small", **kwargs)
