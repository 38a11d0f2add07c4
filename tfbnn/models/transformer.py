"""A Transformer-encoder text classifier whose feed-forward block is Bayesian.

One encoder block (Vaswani et al. 2017, sec. 3.1, post-norm) on int token ids::

    tokens (max_length,) -> TokenAndPositionEmbedding (embed_dim)          "embedding"
    x = LayerNorm(x + Dropout(MultiHeadAttention(x, x)))                   "attention", "norm1"
    h = ff2(ff1(x))    ff1: dense ff_dim, ReLU;  ff2: dense embed_dim      "ff1", "ff2"
    x = LayerNorm(x + Dropout(h))                                          "norm2"
    global average pooling over positions, Dropout, softmax dense          "pool", "predictions"

The encoder (embeddings, attention with ``key_dim = embed_dim``, layer norms) is
deterministic for every method; the method decides the dense layers (the
feed-forward block's ``ff1`` and ``ff2`` and the head, :mod:`tfbnn.models.methods`):
``bbb`` / ``vd`` / ``ibnn`` make all three Bayesian (with ``bayesian_layers="last"``
only the head); ``mc_dropout`` adds :class:`tfbnn.layers.MCDropout` (``rate``) after
``ff1``. Variational dropout in the feed-forward block is the sparsification of
Molchanov et al. 2017 applied to a Transformer (:mod:`tfbnn.experiments.vd_transformer`
converts a trained deterministic block instead). The ``keras.layers.Dropout``
(``dropout``) after attention, feed-forward and pooling is the encoder's training-time
regularizer, off at inference, whatever the method.

Parameters (deterministic), with ``V`` = vocab_size, ``L`` = max_length, ``E`` =
embed_dim, ``H`` = num_heads, ``F`` = ff_dim, ``C`` = num_classes::

    (V + L) E  +  4 H E^2 + 3 H E + E  +  4 E  +  2 E F + F + E  +  E C + C

654,562 with the IMDB experiment's V = 20,000, L = 120, E = 32, H = 2, F = 32, C = 2.

References:
    Vaswani et al. 2017, "Attention is all you need", NeurIPS.
    Molchanov, Ashukha and Vetrov 2017, "Variational dropout sparsifies deep neural
    networks", ICML.
"""

import keras

from tfbnn._internal import checks
from tfbnn.models import _common

__all__ = ["transformer", "TokenAndPositionEmbedding"]


@keras.saving.register_keras_serializable(package="tfbnn")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned position embedding.

    ``y[b, t] = token[x[b, t]] + position[t]``.

    Args:
        vocab_size: int > 0, number of token ids (``0..vocab_size-1``).
        max_length: int > 0, the longest sequence (positions ``0..max_length-1``).
        embed_dim: int > 0, embedding size.
        **kwargs: base layer arguments (``name``, ``dtype``, ...).

    Input shape: ``(batch, length)`` int token ids, ``length <= max_length``.
    Output shape: ``(batch, length, embed_dim)``.

    Example:
        >>> import numpy as np
        >>> from tfbnn.models.transformer import TokenAndPositionEmbedding
        >>> layer = TokenAndPositionEmbedding(vocab_size=100, max_length=8, embed_dim=4)
        >>> layer(np.zeros((2, 8), "int32")).shape
        TensorShape([2, 8, 4])
    """

    def __init__(self, vocab_size, max_length, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = checks.integer("vocab_size", vocab_size, 1)
        self.max_length = checks.integer("max_length", max_length, 1)
        self.embed_dim = checks.integer("embed_dim", embed_dim, 1)
        # The sublayers compute in this layer's policy (a mixed policy's float16 outputs, float32 tables).
        self.token = keras.layers.Embedding(vocab_size, embed_dim, dtype=self.dtype_policy, name="token")
        self.position = keras.layers.Embedding(max_length, embed_dim, dtype=self.dtype_policy, name="position")

    def build(self, input_shape):
        self.token.build(input_shape)
        self.position.build((self.max_length,))

    def call(self, inputs):
        positions = keras.ops.arange(keras.ops.shape(inputs)[-1])
        return self.token(inputs) + self.position(positions)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.embed_dim,)

    def get_config(self):
        config = super().get_config()
        config.update({"vocab_size": self.vocab_size, "max_length": self.max_length, "embed_dim": self.embed_dim})
        return config


def transformer(method="deterministic", *, vocab_size=None, max_length=120, embed_dim=32, num_heads=2, ff_dim=32,
                dropout=0.1, **kwargs):
    """The Transformer-encoder classifier for ``method``; softmax outputs.

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`.
        vocab_size: int > 0, token ids ``0..vocab_size-1`` (required).
        max_length: int > 0, tokens per example. Default 120.
        embed_dim: int > 0, embedding (and attention key) size. Default 32.
        num_heads: int > 0, attention heads. Default 2.
        ff_dim: int > 0, hidden units of the feed-forward block (``ff1``). Default 32.
        dropout: float in [0, 1), the encoder's ``keras.layers.Dropout`` after
            attention, feed-forward and pooling (training only). Default 0.1.
        **kwargs: the zoo's common arguments but ``input_shape`` (``num_classes`` defaults
            to 2 here) and the method's options (:func:`tfbnn.models.build`).

    Input shape: ``(batch, max_length)`` int token ids.
    Output shape: ``(batch, num_classes)`` class probabilities.

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"transformer_<method>"``
        (compile with ``"sparse_categorical_crossentropy"``).

    Example:
        >>> import numpy as np, tfbnn
        >>> token_ids = np.random.default_rng(0).integers(1, 100, size=(16, 12))
        >>> labels = token_ids[:, 0] % 2
        >>> model = tfbnn.models.transformer("vd", vocab_size=100, max_length=12, num_examples=len(labels), seed=0)
        >>> model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        >>> # model.fit(token_ids, labels, epochs=..., callbacks=[tfbnn.KLAnnealing(num_examples=len(labels))])
        >>> tfbnn.predict(model, token_ids[:5], num_samples=4).mean_probs.shape
        (5, 2)
    """
    if vocab_size is None:
        raise ValueError(
            "The transformer reads int token ids and needs `vocab_size` (the number of token ids, e.g. "
            "the size of the text vectorizer's vocabulary): build('transformer', vocab_size=20_000, ...). "
            "Received: vocab_size=None"
        )
    for arg, value in (("vocab_size", vocab_size), ("max_length", max_length), ("embed_dim", embed_dim),
                       ("num_heads", num_heads), ("ff_dim", ff_dim)):
        checks.integer(arg, value, 1)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"Expected `dropout` in [0, 1). Received: dropout={dropout!r}")
    build = _common.start(method, kwargs, "transformer", rank=1, num_classes=2, fixed_shape=(max_length,),
                          dtype="int32")
    x = TokenAndPositionEmbedding(vocab_size, max_length, embed_dim, name="embedding")(build.inputs)
    attention = keras.layers.MultiHeadAttention(num_heads, key_dim=embed_dim, name="attention")(x, x)
    attention = keras.layers.Dropout(dropout, name="attention_dropout")(attention)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="norm1")(keras.layers.Add(name="residual1")([x, attention]))
    h = _common.hidden_dense(x, build.factory, ff_dim, "relu", "ff1", "ff1_mc_dropout")
    h = build.factory.dense(embed_dim, name="ff2")(h)
    h = keras.layers.Dropout(dropout, name="ff_dropout")(h)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="norm2")(keras.layers.Add(name="residual2")([x, h]))
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    x = keras.layers.Dropout(dropout, name="pool_dropout")(x)
    return build.classifier(x, "transformer")
