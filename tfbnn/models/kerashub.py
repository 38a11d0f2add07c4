"""KerasHub classifiers in the zoo: a ViT image classifier and a BERT text classifier.

Both are a KerasHub backbone and the head of its KerasHub task, built as a zoo model
(softmax outputs, ``method=...``) so that recipes and ``tfbnn train`` fine-tune them::

    kerashub_vit:   image (H, W, C) -> ViTBackbone -> class token      "backbone"
                    -> Dropout -> softmax dense                         "head_dropout", "predictions"
    kerashub_bert:  token ids (max_length,) -> BertInputs (segment ids 0,  "bert_inputs"
                    padding mask ids != 0) -> BertBackbone -> pooled [CLS]  "backbone"
                    -> Dropout -> softmax dense                         "head_dropout", "predictions"

The head is ``ViTImageClassifier``'s (``pooling="token"``) and ``BertTextClassifier``'s
(the pooled output, dropout, a dense layer), with the zoo's softmax (KerasHub's tasks
output logits). The backbone comes from a small config (random weights, offline; the
defaults: 1 ViT layer / 2 BERT layers, 2 heads, width 16, feed-forward 32) or, with
``preset=`` (a KerasHub preset name such as ``"vit_base_patch16_224_imagenet"`` or
``"bert_tiny_en_uncased"``; downloads once), from the preset's weights: the model then
fine-tunes the pretrained backbone with a new head.

The method decides the head and the dropout (:mod:`tfbnn.models.methods`):

* ``deterministic``: ``keras.layers.Dense`` head; the backbone's dropout and the
  head's ``keras.layers.Dropout`` at ``dropout`` (training only).
* ``mc_dropout`` (``rate``): the backbone's own dropout rates set to ``rate`` and a
  :class:`tfbnn.layers.MCDropout` (``rate``, kept on at inference) in front of the head.
  :func:`tfbnn.predict` samples the head's dropout; ``tfbnn.predict(model, x,
  mc_dropout=True)`` keeps the backbone's dropout on too (Gal and Ghahramani 2016, all of
  the network's dropout). With ``bayesian_layers="last"`` the backbone keeps ``dropout``.
* any other method (``bbb``, ``vd``, ...) with ``bayesian_layers="last"``: the head is the
  method's layer (``bbb``: :class:`tfbnn.layers.DenseFlipout` by default, ``kl_weight = 1 / N``,
  seed ``seed + 1``), the layer :func:`tfbnn.hub.bayesian_head` makes of a fine-tuned
  task's head, but here the whole network trains from its initialization (nothing frozen).
  ``bayesian_layers="all"`` is refused: KerasHub keeps the backbone's weight layers
  (patch embedding, attention and feed-forward dense layers) inside subclassed layers
  (``ViTEncoder``, ``TransformerEncoder``) that a zoo builder cannot replace.

keras-hub is imported only when such a model is built (the optional extra
``pip install tfbnn[hub]``). A saved model loads with ``keras.saving.load_model`` once
``keras_hub`` and ``tfbnn`` are imported.

References:
    Dosovitskiy et al. 2021, "An image is worth 16x16 words", ICLR (ViT).
    Devlin et al. 2019, "BERT: pre-training of deep bidirectional transformers", NAACL.
    Blundell et al. 2015, "Weight uncertainty in neural networks", ICML (eq. 2, the head's ELBO).
    Gal and Ghahramani 2016, "Dropout as a Bayesian approximation", ICML.
"""

import keras

from tfbnn._internal import checks
from tfbnn.models import _common

__all__ = ["kerashub_vit", "kerashub_bert", "BertInputs"]

#: The methods that keep a KerasHub backbone deterministic (or MC dropout), so that it trains with
#: ``bayesian_layers="all"``; every other method takes a Bayesian head only (``bayesian_layers="last"``).
DETERMINISTIC_BODY_METHODS = ("deterministic", "mc_dropout")
_DETERMINISTIC_BODY = DETERMINISTIC_BODY_METHODS


def _keras_hub():
    try:
        import keras_hub
    except ImportError as e:
        raise ImportError(
            "The KerasHub zoo models (kerashub_vit, kerashub_bert) need keras-hub, the optional extra `hub`: "
            "pip install tfbnn[hub]") from e
    return keras_hub


@keras.saving.register_keras_serializable(package="tfbnn")
class BertInputs(keras.layers.Layer):
    """Int token ids to the inputs of a KerasHub ``BertBackbone``.

    ``{"token_ids": x, "segment_ids": 0, "padding_mask": x != 0}``: one segment, 0 the
    padding (as ``keras.layers.TextVectorization`` gives it).

    Input shape: ``(batch, length)`` int token ids. Output: a dict of three ``(batch, length)``
    int32 tensors.

    Example:
        >>> import numpy as np
        >>> from tfbnn.models.kerashub import BertInputs
        >>> out = BertInputs()(np.array([[5, 3, 0]]))
        >>> out["padding_mask"].numpy().tolist(), out["segment_ids"].numpy().tolist()
        ([[1, 1, 0]], [[0, 0, 0]])
    """

    def call(self, inputs):
        ids = keras.ops.cast(inputs, "int32")
        mask = keras.ops.cast(keras.ops.not_equal(ids, 0), "int32")
        return {"padding_mask": mask, "segment_ids": keras.ops.zeros_like(ids), "token_ids": ids}

    def compute_output_spec(self, inputs):
        return {key: keras.KerasTensor(inputs.shape, dtype="int32") for key in ("padding_mask", "segment_ids", "token_ids")}


@keras.saving.register_keras_serializable(package="tfbnn")
class _ClassToken(keras.layers.Layer):
    """``(B, T, d) -> (B, d)``: the first (class) token, ``ViTImageClassifier``'s ``pooling="token"``."""

    def call(self, inputs):
        return inputs[:, 0, :]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


def _check_rate(name, value):
    if not checks.is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"Expected `{name}` in [0, 1). Received: {name}={value!r}")
    return float(value)


def _check_preset(preset):
    if preset is not None and (not isinstance(preset, str) or not preset):
        raise ValueError(f"Expected `preset` to be a KerasHub preset name or None. Received: preset={preset!r}")
    return preset


def _start(method, kwargs, model, **start_kwargs):
    """The zoo's common checks (:func:`tfbnn.models._common.start`), then the refusal of a Bayesian body."""
    build = _common.start(method, kwargs, model, **start_kwargs)
    factory = build.factory
    if factory.bayesian_layers == "all" and factory.method not in _DETERMINISTIC_BODY:
        raise ValueError(
            f"{model} takes method={factory.method!r} only with bayesian_layers='last' (a Bayesian head): KerasHub "
            "keeps the backbone's weight layers (the patch or token embeddings, the attention and feed-forward "
            "dense layers) inside subclassed layers (ViTEncoder / TransformerEncoder) that the zoo cannot replace. "
            f"Received: method={factory.method!r}, bayesian_layers='all'")
    return build


def _backbone_dropout(build, dropout):
    """The backbone's dropout rate: the method's ``rate`` for ``mc_dropout`` with ``"all"``, else ``dropout``."""
    factory = build.factory
    if factory.bayesian_layers == "all" and factory.method == "mc_dropout":
        return factory.options["rate"]
    return dropout


def _head(build, pooled, dropout, default_name):
    """The task's head: dropout (the method's MC dropout, or Keras' at ``dropout``) and the softmax dense."""
    factory = build.factory
    # mc_dropout: the one MC dropout layer (the body's with "all", the head's with "last"); else Keras' dropout.
    x = factory.head_dropout(factory.dropout(pooled, name="head_dropout"), name="head_dropout")
    if x is pooled:
        x = keras.layers.Dropout(dropout, name="head_dropout")(pooled)
    return build.model(factory.classify(x, _common.check_num_classes(build.num_classes), name="predictions"),
                       default_name)


def kerashub_vit(method="deterministic", *, patch_size=None, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32,
                 dropout=0.1, preset=None, **kwargs):
    """A KerasHub ViT image classifier (``ViTBackbone`` and ``ViTImageClassifier``'s head) for ``method``.

    The image is cut into ``patch_size`` x ``patch_size`` patches, embedded with a class
    token and run through ``num_layers`` pre-norm Transformer blocks (Dosovitskiy et al.
    2021, eq. 1-4); the head reads the class token: ``p(y | x) = softmax(z_0^L W + b)``.

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`;
            other than ``deterministic`` / ``mc_dropout`` only with ``bayesian_layers="last"``.
        patch_size: int > 0 dividing both image sides. Default: a quarter of the smaller
            side (4 for 16x16, 2 for the 8x8 digits), at least 1.
        num_layers, num_heads, hidden_dim, mlp_dim: ints > 0, the backbone's config
            (``hidden_dim`` a multiple of ``num_heads``). Defaults 1, 2, 16, 32.
        dropout: float in [0, 1), the backbone's and the head's dropout (training only);
            ``mc_dropout`` sets the backbone's to ``rate``. Default 0.1.
        preset: None (default: the config above, random weights) or a KerasHub ViT preset
            name: the backbone with its pretrained weights (``input_shape`` must be the
            preset's, e.g. ``(224, 224, 3)``; the config arguments are then unused).
        **kwargs: the zoo's common arguments (``input_shape`` default ``(32, 32, 3)``) and the
            method's options (:func:`tfbnn.models.build`).

    Input shape: ``(batch, H, W, C)`` floats. Output shape: ``(batch, num_classes)`` probabilities.

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"kerashub_vit_<method>"``.

    Example:
        >>> import numpy as np, tfbnn
        >>> x = np.random.default_rng(0).random((4, 8, 8, 1)).astype("float32")
        >>> model = tfbnn.models.build("kerashub_vit", "bbb", input_shape=(8, 8, 1), num_examples=100,
        ...                            bayesian_layers="last", seed=0)
        >>> [type(layer).__name__ for layer in tfbnn.bayesian_layers(model)]
        ['DenseFlipout']
        >>> tfbnn.predict(model, x, num_samples=4).mean_probs.shape
        (4, 10)
    """
    for arg, value in (("num_layers", num_layers), ("num_heads", num_heads), ("hidden_dim", hidden_dim),
                       ("mlp_dim", mlp_dim)):
        checks.integer(arg, value, 1)
    dropout, preset = _check_rate("dropout", dropout), _check_preset(preset)
    build = _start(method, kwargs, "kerashub_vit")
    height, width, channels = build.inputs.shape[1:]
    if patch_size is None:
        patch_size = max(1, min(height, width) // 4)
    checks.integer("patch_size", patch_size, 1)
    if height % patch_size or width % patch_size:
        raise ValueError(f"Expected `patch_size` to divide the image sides {(height, width)}. "
                         f"Received: patch_size={patch_size!r}")
    if hidden_dim % num_heads:
        raise ValueError(f"Expected `hidden_dim` to be a multiple of `num_heads` ({num_heads}). "
                         f"Received: hidden_dim={hidden_dim!r}")
    keras_hub = _keras_hub()
    rate = _backbone_dropout(build, dropout)
    if preset is not None:
        backbone = keras_hub.models.ViTBackbone.from_preset(preset, dropout_rate=rate, attention_dropout=rate)
    else:
        backbone = keras_hub.models.ViTBackbone(
            image_shape=(height, width, channels), patch_size=patch_size, num_layers=num_layers, num_heads=num_heads,
            hidden_dim=hidden_dim, mlp_dim=mlp_dim, dropout_rate=rate, attention_dropout=rate, name="backbone")
    tokens = backbone(build.inputs)
    pooled = _ClassToken(name="class_token")(tokens)
    return _head(build, pooled, dropout, "kerashub_vit")


def kerashub_bert(method="deterministic", *, vocab_size=None, max_length=120, num_layers=2, num_heads=2,
                  hidden_dim=16, intermediate_dim=32, dropout=0.1, preset=None, **kwargs):
    """A KerasHub BERT text classifier (``BertBackbone`` and ``BertTextClassifier``'s head) on int token ids.

    ``num_layers`` post-norm Transformer encoder blocks over token, position and segment
    embeddings (Devlin et al. 2019, sec. 3); the head reads the pooled ``[CLS]`` feature
    ``h = tanh(z_0 W_p + b_p)``: ``p(y | x) = softmax(h W + b)``. The token ids come as the
    zoo's text models take them (0 the padding, masked out of the attention).

    Args:
        method: as for :func:`kerashub_vit`.
        vocab_size: int > 1, token ids ``0..vocab_size-1`` (required; with ``preset``, the
            preset's vocabulary size, ids from its tokenizer).
        max_length: int > 0, tokens per example. Default 120.
        num_layers, num_heads, hidden_dim, intermediate_dim: ints > 0, the backbone's config
            (``hidden_dim`` a multiple of ``num_heads``). Defaults 2, 2, 16, 32.
        dropout: float in [0, 1), the backbone's and the head's dropout (training only);
            ``mc_dropout`` sets the backbone's to ``rate``. Default 0.1.
        preset: None (default, the config above with random weights) or a KerasHub BERT preset
            name (the pretrained backbone; the config arguments are then unused).
        **kwargs: the zoo's common arguments but ``input_shape`` (``num_classes`` defaults to 2)
            and the method's options (:func:`tfbnn.models.build`).

    Input shape: ``(batch, max_length)`` int token ids. Output shape: ``(batch, num_classes)``.

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"kerashub_bert_<method>"``.

    Example:
        >>> import numpy as np, tfbnn
        >>> ids = np.random.default_rng(0).integers(0, 50, size=(4, 12))
        >>> model = tfbnn.models.build("kerashub_bert", "mc_dropout", vocab_size=50, max_length=12, seed=0)
        >>> [layer.name for layer in tfbnn.stochastic_layers(model)]
        ['head_dropout']
        >>> tfbnn.predict(model, ids, num_samples=4, mc_dropout=True).mean_probs.shape  # the backbone's too
        (4, 2)
    """
    if vocab_size is None:
        raise ValueError("kerashub_bert reads int token ids and needs `vocab_size` (the number of token ids). "
                         "Received: vocab_size=None")
    checks.integer("vocab_size", vocab_size, 2)
    for arg, value in (("max_length", max_length), ("num_layers", num_layers), ("num_heads", num_heads),
                       ("hidden_dim", hidden_dim), ("intermediate_dim", intermediate_dim)):
        checks.integer(arg, value, 1)
    if hidden_dim % num_heads:
        raise ValueError(f"Expected `hidden_dim` to be a multiple of `num_heads` ({num_heads}). "
                         f"Received: hidden_dim={hidden_dim!r}")
    dropout, preset = _check_rate("dropout", dropout), _check_preset(preset)
    build = _start(method, kwargs, "kerashub_bert", rank=1, num_classes=2, fixed_shape=(max_length,), dtype="int32")
    keras_hub = _keras_hub()
    rate = _backbone_dropout(build, dropout)
    if preset is not None:
        backbone = keras_hub.models.BertBackbone.from_preset(preset, dropout=rate)
    else:
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=vocab_size, num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim, max_sequence_length=max_length, dropout=rate, name="backbone")
    pooled = backbone(BertInputs(name="bert_inputs")(build.inputs))["pooled_output"]
    return _head(build, pooled, dropout, "kerashub_bert")
