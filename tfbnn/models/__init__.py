"""The model zoo: classifiers whose Bayesian method is one argument.

Every builder takes ``method`` (``"deterministic"``, ``"mc_dropout"``, ``"bbb"``,
``"vd"``, ``"ibnn"``) with that method's options, ``num_classes``, ``input_shape``
(the text models, ``transformer``, ``rnn_classifier`` and ``kerashub_bert``: ``vocab_size`` and ``max_length``), ``num_examples`` (N; required
for the methods with a KL term), ``seed`` and ``bayesian_layers``, and returns an
uncompiled functional ``keras.Model`` that outputs softmax probabilities (compile it
with ``"sparse_categorical_crossentropy"``; the outputs go straight into
:func:`tfbnn.predict` and :mod:`tfbnn.metrics`). How a method turns into layers is
decided in one place, :class:`LayerFactory` (:mod:`tfbnn.models.methods`), from the
method's entry in the method registry (:mod:`tfbnn.methods`), and the factory also
gives every Bayesian layer ``kl_weight = 1 / N`` and its own seed.

``bayesian_layers="all"`` (default) applies the method to every weight layer;
``bayesian_layers="last"`` builds the last-layer-Bayesian ("hybrid") network: the same
architecture with a deterministic body (``keras.layers.Dense`` / ``Conv2D``, no MC
dropout) and the method's layer as the classification head only (``mc_dropout``: one
:class:`tfbnn.layers.MCDropout` in front of a deterministic head). The model's KL is
then the head's; ``kl_weight = 1 / N`` and the seeds (the head gets ``seed + 1``) follow
the same rules.

====================  ============================  =====================================
name                  builder                       deterministic parameters, 10 classes
====================  ============================  =====================================
``mlp``               :func:`mlp` (presets below)   2,395,210 (784-1200-1200-10)
``lenet5``            :func:`lenet5`                62,006 (32x32x3)
``alexnet``           :func:`alexnet`               37,323,146 (32x32x3)
``resnet50``          :func:`resnet50`              23,608,202 (= keras.applications)
``vgg16``             :func:`vgg16`                 33,638,218 (= keras.applications)
``vgg16_small``       :func:`vgg16_small`           15,245,130 (VGG16-small, Trinh et al.
                                                    2022; fc layers of 512)
``wide_resnet28_10``  :func:`wide_resnet28_10`      36,479,194 trainable
``convnext``          :func:`convnext`              28,589,128 (ConvNeXt-T, 224x224x3,
                                                    1000 classes; CIFAR: ``patch_size`` 1-2)
``transformer``       :func:`transformer`           654,562 (vocab 20,000, length 120,
                                                    2 classes)
``rnn_classifier``    :func:`rnn_classifier`        648,386 (LSTM, vocab 20,000, 2 classes;
                                                    ``cell="gru"``: a GRU; bbb, mc_dropout,
                                                    deterministic; vd / ibnn with "last")
``kerashub_vit``      :func:`kerashub_vit`          a KerasHub ViT (``ViTBackbone``, tiny
                                                    config or ``preset=``); needs keras-hub;
                                                    deterministic, mc_dropout; other methods
                                                    with "last" (a Bayesian head)
``kerashub_bert``     :func:`kerashub_bert`         a KerasHub BERT (``BertBackbone``) on
                                                    token ids; as ``kerashub_vit``
====================  ============================  =====================================

MLP presets, also accepted by :func:`build`: ``mlp_blundell`` (2 x 1200),
``lenet_300_100``, ``mlp_400``, ``mlp_800``, ``mlp_1200``.

Method options: ``mc_dropout``: ``rate`` (default 0.1); ``bbb``: ``estimator``
(``"flipout"`` default, ``"reparameterization"``, ``"local_reparameterization"``) and
``prior`` (a name such as ``"normal"``, ``"scale_mixture"``, or a
:class:`tfbnn.priors.Prior`); ``vd``: ``parameterization`` (``"additive"`` default,
``"multiplicative"``); ``ibnn``: ``num_components`` (K, default 4), the prior
``prior_mean`` / ``prior_stddev`` (``N(1, 0.1^2)``), the initial component means
``init_mean`` / ``init_stddev`` (``N(1, 0.5^2)``) and scales ``init_scale_mean`` /
``init_scale_stddev`` (``|N(0.05, 0.02^2)|``).

Example:
    >>> import numpy as np, tfbnn
    >>> x = np.random.default_rng(0).random((32, 16, 16, 1)).astype("float32")
    >>> model = tfbnn.models.build("lenet5", method="bbb", estimator="flipout", num_examples=len(x),
    ...                            input_shape=(16, 16, 1), seed=0)
    >>> sorted({type(layer).__name__ for layer in tfbnn.bayesian_layers(model)})
    ['Conv2DFlipout', 'DenseFlipout']
    >>> model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    >>> # model.fit(x, y, epochs=..., callbacks=[tfbnn.KLAnnealing(num_examples=len(x))])
    >>> tfbnn.predict(model, x[:4], num_samples=8).mean_probs.shape
    (4, 10)
    >>> hybrid = tfbnn.models.build("lenet5", method="vd", num_examples=len(x), input_shape=(16, 16, 1),
    ...                             bayesian_layers="last")
    >>> [type(layer).__name__ for layer in tfbnn.bayesian_layers(hybrid)]   # the head only
    ['DenseVariationalDropout']
"""

from tfbnn._internal import deprecation
from tfbnn.models.alexnet import alexnet
from tfbnn.models.convnext import CONFIGS as CONVNEXT_CONFIGS
from tfbnn.models import convnext as _convnext
from tfbnn.models import lenet as _lenet
from tfbnn.models import resnet as _resnet
from tfbnn.models.convnext import LayerScale, StochasticDepth, convnext
from tfbnn.models.kerashub import BertInputs, kerashub_bert, kerashub_vit
from tfbnn.models.lenet import lenet5
from tfbnn.models import methods
from tfbnn.models.methods import (
    BAYESIAN_LAYERS,
    BAYESIAN_METHODS,
    ENSEMBLES,
    ESTIMATORS,
    METHOD_OPTIONS,
    RECURRENT_CELLS,
    ZOO_METHODS,
    LayerFactory,
    get_factory,
)
from tfbnn.models.mlp import PRESETS as MLP_PRESETS
from tfbnn.models.mlp import mlp
from tfbnn.models.recurrent import rnn_classifier
from tfbnn.models.resnet import resnet50
from tfbnn.models.transformer import TokenAndPositionEmbedding, transformer
from tfbnn.models.vgg import vgg16, vgg16_small
from tfbnn.models.wide_resnet import wide_resnet, wide_resnet28_10

__all__ = [
    "MODELS",
    "TEXT_MODELS",
    "PRESETS",
    *methods.__all__,
    "build",
    "get_builder",
    "SMALL_IMAGE_OPTIONS",
    "input_options",
    "mlp",
    "lenet5",
    "alexnet",
    "resnet50",
    "vgg16",
    "vgg16_small",
    "convnext",
    "CONVNEXT_CONFIGS",
    "LayerScale",
    "StochasticDepth",
    "wide_resnet",
    "wide_resnet28_10",
    "transformer",
    "TokenAndPositionEmbedding",
    "rnn_classifier",
    "kerashub_vit",
    "kerashub_bert",
    "BertInputs",
]

#: Model name -> builder.
MODELS = {
    "mlp": mlp,
    "lenet5": lenet5,
    "alexnet": alexnet,
    "resnet50": resnet50,
    "vgg16": vgg16,
    "vgg16_small": vgg16_small,
    "convnext": convnext,
    "wide_resnet28_10": wide_resnet28_10,
    "transformer": transformer,
    "rnn_classifier": rnn_classifier,
    "kerashub_vit": kerashub_vit,
    "kerashub_bert": kerashub_bert,
}

#: Models on int token ids (``vocab_size``, ``max_length``) instead of ``input_shape``.
TEXT_MODELS = ("transformer", "rnn_classifier", "kerashub_bert")

#: Preset name -> (model name, fixed builder arguments).
PRESETS = {name: ("mlp", {"hidden_units": units}) for name, units in MLP_PRESETS.items()}


#: Model name -> ``f(side) -> dict``: the builder options that fit the model to images whose
#: smaller side is ``side`` (LeNet-5 ``padding="same"`` below 16x16, ResNet-50's CIFAR stem
#: below 32x32, ConvNeXt's patch of ``side // 8`` below 32x32); a model not listed needs none.
SMALL_IMAGE_OPTIONS = {
    "lenet5": _lenet.small_image_options,
    "resnet50": _resnet.small_image_options,
    "convnext": _convnext.small_image_options,
}


def input_options(name, input_shape):
    """The builder options that fit the model ``name`` to ``input_shape`` (:data:`SMALL_IMAGE_OPTIONS`);
    ``{}`` for a model without such options or an input that is not an image.

    Example:
        >>> import tfbnn
        >>> tfbnn.models.input_options("lenet5", (8, 8, 1))
        {'padding': 'same'}
    """
    fit = SMALL_IMAGE_OPTIONS.get(name)
    if fit is None or len(input_shape) != 3:
        return {}
    return fit(min(input_shape[:2]))


def _names():
    return list(MODELS) + list(PRESETS)


def get_builder(name):
    """The builder of a model or preset name (a preset's fixed arguments bound)."""
    if isinstance(name, str) and name in MODELS:
        return MODELS[name]
    if isinstance(name, str) and name in PRESETS:
        family, fixed = PRESETS[name]

        def preset(method="deterministic", **kwargs):
            clash = sorted(set(fixed) & set(kwargs))
            if clash:
                raise ValueError(
                    f"The preset {name!r} fixes {clash}; use build({family!r}, ...) to choose them. "
                    f"Received: {', '.join(f'{k}={kwargs[k]!r}' for k in clash)}"
                )
            if kwargs.get("name") is None:
                kwargs["name"] = f"{name}_{getattr(method, 'method', method)}"
            return MODELS[family](method, **fixed, **kwargs)

        preset.__name__ = name
        preset.__doc__ = f"The {family} preset {name!r}: {family}(method, {fixed}, ...)."
        return preset
    raise ValueError(f"Unknown model. Expected one of {_names()}. Received: model={name!r}")


def build(name, method="deterministic", **kwargs):
    """Builds the zoo model ``name`` for ``method``.

    Every builder takes ``method``, its family's own arguments (``stem``, ``variant``,
    ``hidden_units``, ...) and, as ``**kwargs``, the zoo's common arguments, documented
    here once, and the method's options.

    Args:
        name: a model name of :data:`MODELS` or a preset of :data:`PRESETS`.
        method: ``"deterministic"``, ``"mc_dropout"``, ``"bbb"``, ``"vd"``, ``"ibnn"``,
            or a :class:`LayerFactory`.
        **kwargs: the family's own arguments, the common arguments and the method's options.
            The common arguments:
            ``num_classes`` (int >= 2, softmax outputs; default 10, the transformer's 2);
            ``input_shape`` (one example, no batch axis; default ``(32, 32, 3)``, the MLP's
            ``(784,)``; the transformer takes ``max_length`` instead);
            ``num_examples`` (int, N, required for bbb, vd and ibnn: every Bayesian layer
            gets ``kl_weight = 1 / N``);
            ``seed`` (int >= 0 or None, the base seed of the stochastic layers, see
            :mod:`tfbnn.models.methods`);
            ``bayesian_layers`` (``"all"``, default, or ``"last"``: a deterministic body and a
            Bayesian head);
            ``name`` (the model's name; default ``"<builder>_<method>"``).
            The method's options (:data:`METHOD_OPTIONS`): ``rate``; ``estimator``, ``prior``;
            ``parameterization``; ``num_components``, ``prior_mean``, ``prior_stddev``,
            ``init_mean``, ``init_stddev``, ``init_scale_mean``, ``init_scale_stddev``.

    Returns:
        An uncompiled functional ``keras.Model`` with softmax outputs.

    Raises:
        ValueError: an unknown model, method or option, a missing ``num_examples``
            for a Bayesian method, or a bad ``input_shape`` / ``num_classes`` /
            ``bayesian_layers``.
    """
    return get_builder(name)(method, **kwargs)

__getattr__ = deprecation.renamed(__name__, {"METHODS": "ZOO_METHODS"})
