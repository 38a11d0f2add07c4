"""ConvNeXt (Liu et al. 2022, "A ConvNet for the 2020s"), channels last.

Stem: a "patchify" convolution, ``dims[0]`` filters of ``p x p`` with stride ``p``
(``patch_size``, 4 in the paper), then LayerNorm. Stage ``s`` (1-based) is ``depths[s-1]``
ConvNeXt blocks of width ``d = dims[s-1]``; every stage but the first starts with a
downsampling layer, LayerNorm then a ``2 x 2`` convolution of stride 2. A block (Fig. 4)::

    y = DepthwiseConv 7x7 (x)                      "stageS_blockB_depthwise_conv"
    y = LayerNorm (y)                              "stageS_blockB_layernorm"
    y = GELU (y W1 + b1)     W1: d x 4d            "stageS_blockB_pointwise_conv_1"
    y = y W2 + b2            W2: 4d x d            "stageS_blockB_pointwise_conv_2"
    y = gamma o y            layer scale, gamma_0 = 1e-6          "..._layer_scale"
    x = x + DropPath (y)     stochastic depth, training only     "..._stochastic_depth"

The two 1x1 ("pointwise") convolutions are dense layers over the channels of every
position, as in the paper's own implementation (``nn.Linear`` on channels-last maps).
Head: global average pooling, LayerNorm, softmax dense (``predictions``). LayerNorm has
epsilon 1e-6 and normalizes over the channels of each position.

ConvNeXt-T (the defaults: ``depths=(3, 3, 9, 3)``, ``dims=(96, 192, 384, 768)``) has
28,589,128 parameters at 224x224x3 with 1000 classes (the paper's Table 11: 28M;
torchvision's and keras.applications' count): per block ``8 d^2 + 58 d``, per
downsampling layer ``2 d_in + 4 d_in d + d``, stem ``16 * 3 * 96 + 96 + 192``, head
``2 * 768 + 768 * 1000 + 1000``. :data:`CONFIGS` has T / S / B / L. On CIFAR-sized
inputs use a small patch (``patch_size=1`` or 2: 32x32 ends at 4x4 or 2x2) and, for
tests, tiny ``depths`` and ``dims``.

Bayesian layers per method (:mod:`tfbnn.models.methods`): ``bbb`` / ``vd`` / ``ibnn``
make the stem, the three downsampling convolutions, both pointwise layers of every
block and the head Bayesian (for ``ibnn``: node noise on their inputs, shared over the
positions of a map, as for a 1x1 ``NodeConv2D``). The 7x7 depthwise convolutions stay
deterministic ``keras.layers.DepthwiseConv2D``: tfbnn has no Bayesian depthwise layer,
and they hold about 1.2% of ConvNeXt-T's weights (331,200), while the pointwise
layers hold 88%. LayerNorm and layer scale are deterministic too. ``mc_dropout`` puts
:class:`tfbnn.layers.MCDropout` after the GELU of every block (on the 4d-wide hidden
layer, where Transformers put their MLP dropout); ``bayesian_layers="last"`` keeps the
whole body deterministic and makes the head the method's layer. Graves' layer comes
from converting a trained deterministic ConvNeXt (:func:`tfbnn.convert.to_bayesian`,
``method="graves"``: the pointwise layers become ``GravesDense``, the stem and
downsampling convolutions log-variance ``Conv2DFlipout``, the depthwise ones stay).

Stochastic depth (``drop_path_rate``, default 0; the paper uses 0.1 for ConvNeXt-T on
ImageNet-1K) drops a block's residual branch per example in training with a rate that
grows linearly from 0 at the first block to ``drop_path_rate`` at the last
(:class:`StochasticDepth`); it is a training-time regularizer, off at inference, for
every method, like the transformer's ``keras.layers.Dropout``.

Reference:
    Liu, Mao, Wu, Feichtenhofer, Darrell, Xie. A ConvNet for the 2020s. CVPR 2022.
"""

import keras
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.models import _common

__all__ = ["convnext", "CONFIGS", "LayerScale", "StochasticDepth", "small_image_options"]

#: ``name -> {"depths": ..., "dims": ...}`` of the paper's models (Sec. 2.6, Table 11).
CONFIGS = {
    "tiny": {"depths": (3, 3, 9, 3), "dims": (96, 192, 384, 768)},
    "small": {"depths": (3, 3, 27, 3), "dims": (96, 192, 384, 768)},
    "base": {"depths": (3, 3, 27, 3), "dims": (128, 256, 512, 1024)},
    "large": {"depths": (3, 3, 27, 3), "dims": (192, 384, 768, 1536)},
}
_LN_EPSILON = 1e-6


@keras.saving.register_keras_serializable(package="tfbnn")
class LayerScale(keras.layers.Layer):
    """Per-channel learned scale ``y = gamma o x`` (Touvron et al. 2021; ConvNeXt's layer scale).

    Args:
        init_value: float, every ``gamma_c`` starts at it. Default 1e-6 (ConvNeXt's).
        **kwargs: base layer arguments.

    Input shape: any, channels last; output: the same.

    Example:
        >>> import numpy as np
        >>> LayerScale(0.5)(np.ones((2, 3), "float32")).numpy().tolist()
        [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]
    """

    def __init__(self, init_value=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.init_value = checks.number("init_value", init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],),
                                     initializer=keras.initializers.Constant(self.init_value))

    def call(self, inputs):
        return inputs * keras.ops.cast(self.gamma, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config["init_value"] = self.init_value
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class StochasticDepth(keras.layers.Layer):
    """Drops the whole input of an example with probability ``rate`` in training (Huang et al. 2016).

    ``y_i = x_i * m_i / (1 - rate)``, ``m_i ~ Bernoulli(1 - rate)`` per example ``i``, so
    ``E[y] = x``; the identity at inference. On a residual branch it drops the block.

    Args:
        rate: float in [0, 1).
        seed: int or None, seed of the layer's ``keras.random.SeedGenerator``.
        **kwargs: base layer arguments.

    Input shape: ``(batch, ...)``; output: the same.

    Example:
        >>> import numpy as np
        >>> layer = StochasticDepth(0.5, seed=0)
        >>> y = layer(np.ones((1000, 2), "float32"), training=True).numpy()
        >>> sorted(set(y.ravel().tolist())), bool(0.4 < (y[:, 0] > 0).mean() < 0.6)
        ([0.0, 2.0], True)
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = checks.number("rate", rate, low=0, high=1, high_open=True)
        self.seed = checks.seed(seed)
        self.seed_generator = keras.random.SeedGenerator(self.seed)

    def call(self, inputs, training=None):
        if not training or self.rate == 0:
            return inputs
        keep = 1.0 - self.rate
        shape = tf.concat([tf.shape(inputs)[:1], tf.ones([tf.rank(inputs) - 1], tf.int32)], axis=0)
        uniform = keras.random.uniform(shape, dtype=inputs.dtype, seed=self.seed_generator)
        return inputs * (tf.floor(keep + uniform) / keep)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config


def _check_stages(depths, dims):
    ok = (isinstance(depths, (tuple, list)) and len(depths) >= 1
          and all(checks.is_integer(d) and d >= 1 for d in depths))
    if not ok:
        raise ValueError(f"Expected `depths` to be a non-empty tuple of positive integers. Received: depths={depths!r}")
    ok = isinstance(dims, (tuple, list)) and all(checks.is_integer(d) and d >= 1 for d in dims)
    if not ok or len(dims) != len(depths):
        raise ValueError(
            f"Expected `dims` to be a tuple of {len(depths)} positive integers (one width per stage of `depths`). "
            f"Received: dims={dims!r}"
        )
    return tuple(int(d) for d in depths), tuple(int(d) for d in dims)


def _block(x, factory, dim, drop_rate, layer_scale_init, name):
    y = keras.layers.DepthwiseConv2D(7, padding="same", name=f"{name}_depthwise_conv")(x)
    y = keras.layers.LayerNormalization(epsilon=_LN_EPSILON, name=f"{name}_layernorm")(y)
    y = _common.hidden_dense(y, factory, 4 * dim, "gelu", f"{name}_pointwise_conv_1", f"{name}_dropout")
    y = factory.dense(dim, name=f"{name}_pointwise_conv_2")(y)
    if layer_scale_init:
        y = LayerScale(layer_scale_init, name=f"{name}_layer_scale")(y)
    if drop_rate:
        y = StochasticDepth(drop_rate, seed=factory.next_seed(), name=f"{name}_stochastic_depth")(y)
    return keras.layers.Add(name=f"{name}_add")([x, y])


def small_image_options(side):
    """The builder options that fit ConvNeXt to images of side ``side``: below 32x32 a patch of
    ``side // 8`` (at least 1), as the four stages halve the map three times."""
    return {"patch_size": max(1, side // 8)} if side < 32 else {}


def convnext(method="deterministic", *, depths=CONFIGS["tiny"]["depths"], dims=CONFIGS["tiny"]["dims"], patch_size=4,
             drop_path_rate=0.0, layer_scale_init=1e-6, **kwargs):
    """ConvNeXt for ``method``; softmax outputs.

    Inputs ``(height, width, channels)`` with sides of at least
    ``patch_size * 2^(len(depths) - 1)`` (32 for the defaults; default ``input_shape``
    ``(32, 32, 3)``). Stochastic-depth layers take derived seeds after the method's.

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        depths: blocks per stage. Default ``(3, 3, 9, 3)`` (ConvNeXt-T).
        dims: channels per stage, one per entry of ``depths``. Default ``(96, 192, 384, 768)``.
        patch_size: int >= 1, the stem's kernel and stride. Default 4 (the paper's);
            1 or 2 for CIFAR-sized images.
        drop_path_rate: float in [0, 1), the stochastic-depth rate of the last block
            (linear from 0). Default 0.
        layer_scale_init: float >= 0, the initial layer scale; 0 or None: no layer scale.
            Default 1e-6.
        **kwargs: the zoo's common arguments and the method's options (:func:`tfbnn.models.build`).

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"convnext_<method>"``.

    Example:
        >>> import tfbnn
        >>> model = tfbnn.models.convnext("bbb", num_examples=50_000, depths=(1, 1), dims=(8, 16), patch_size=2)
        >>> [layer.name for layer in tfbnn.bayesian_layers(model)]  # doctest: +NORMALIZE_WHITESPACE
        ['stem_conv', 'stage1_block1_pointwise_conv_1', 'stage1_block1_pointwise_conv_2', 'stage2_downsample_conv',
         'stage2_block1_pointwise_conv_1', 'stage2_block1_pointwise_conv_2', 'predictions']
    """
    depths, dims = _check_stages(depths, dims)
    patch_size = checks.integer("patch_size", patch_size, 1)
    drop_path_rate = checks.number("drop_path_rate", drop_path_rate, low=0, high=1, high_open=True)
    layer_scale_init = checks.number("layer_scale_init", layer_scale_init or 0.0, low=0)
    build = _common.start(method, kwargs, f"convnext (patch_size={patch_size}, {len(depths)} stages)",
                          min_side=patch_size * 2 ** (len(depths) - 1))
    factory = build.factory
    x = factory.conv2d(dims[0], patch_size, strides=patch_size, name="stem_conv")(build.inputs)
    x = keras.layers.LayerNormalization(epsilon=_LN_EPSILON, name="stem_layernorm")(x)
    total, index = sum(depths), 0
    for s, (depth, dim) in enumerate(zip(depths, dims), 1):
        if s > 1:
            x = keras.layers.LayerNormalization(epsilon=_LN_EPSILON, name=f"stage{s}_downsample_layernorm")(x)
            x = factory.conv2d(dim, 2, strides=2, name=f"stage{s}_downsample_conv")(x)
        for b in range(1, depth + 1):
            rate = drop_path_rate * index / max(total - 1, 1)
            x = _block(x, factory, dim, rate, layer_scale_init, name=f"stage{s}_block{b}")
            index += 1
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    x = keras.layers.LayerNormalization(epsilon=_LN_EPSILON, name="head_layernorm")(x)
    return build.classifier(x, "convnext")
