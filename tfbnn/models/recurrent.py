"""A recurrent (LSTM or GRU) text classifier: the sentiment model of IMDB and the synthetic reviews.

On int token ids (0 the padding, as ``keras.layers.TextVectorization`` gives them)::

    tokens (max_length,) -> Embedding(vocab_size, embed_dim, mask_zero=True)   "embedding"
    LSTM or GRU (units), the padding masked, last state                     "recurrent"
    [MC dropout]                                                            "recurrent_mc_dropout"
    softmax dense                                                           "predictions"

The method decides the recurrent layer and the head (:mod:`tfbnn.models.methods`):

* ``deterministic``: ``keras.layers.LSTM`` / ``GRU`` and a ``Dense`` head;
* ``mc_dropout``: the same with :class:`tfbnn.layers.MCDropout` (``rate``) on the final
  state, kept on at inference (Gal and Ghahramani 2016);
* ``bbb``: :class:`tfbnn.layers.LSTMReparameterization` / ``GRUReparameterization``
  (one weight sample per sequence, Fortunato et al. 2017) and the ``estimator``'s
  Bayesian dense head;
* ``vd`` / ``ibnn``: only with ``bayesian_layers="last"`` (a deterministic recurrent body
  and the method's head).

The embedding is a deterministic ``keras.layers.Embedding`` for every method.

Parameters (deterministic) with ``V`` = vocab_size, ``E`` = embed_dim, ``U`` = units,
``C`` = num_classes, ``G`` = 4 (LSTM) or 3 (GRU; Keras' ``reset_after`` has two biases)::

    V E  +  G U (E + U + 1)  [+ 3 U for the GRU]  +  U C + C

648,386 for an LSTM with V = 20,000, E = 32, U = 32, C = 2.

References:
    Hochreiter and Schmidhuber 1997, "Long short-term memory"; Cho et al. 2014 (GRU).
    Fortunato, Blundell and Vinyals 2017, "Bayesian recurrent neural networks", arXiv:1704.02798.
    Gal and Ghahramani 2016, "A theoretically grounded application of dropout in recurrent
    neural networks", NeurIPS.
"""

import keras

from tfbnn._internal import checks
from tfbnn.models import _common

__all__ = ["rnn_classifier"]


def rnn_classifier(method="deterministic", *, vocab_size=None, max_length=120, embed_dim=32, units=32, cell="lstm",
                   **kwargs):
    """The LSTM / GRU text classifier for ``method``; softmax outputs.

    Args:
        method: a name of :data:`tfbnn.models.ZOO_METHODS` or a :class:`tfbnn.models.LayerFactory`
            (``vd`` and ``ibnn`` need ``bayesian_layers="last"``).
        vocab_size: int > 1, token ids ``0..vocab_size-1``, 0 the padding (required).
        max_length: int > 0, tokens per example. Default 120.
        embed_dim: int > 0, embedding size. Default 32.
        units: int > 0, the recurrent state size. Default 32.
        cell: ``"lstm"`` (default) or ``"gru"``.
        **kwargs: the zoo's common arguments but ``input_shape`` (``num_classes`` defaults
            to 2) and the method's options (:func:`tfbnn.models.build`).

    Input shape: ``(batch, max_length)`` int token ids.
    Output shape: ``(batch, num_classes)`` class probabilities.

    Returns:
        An uncompiled functional ``keras.Model``, by default named ``"rnn_classifier_<method>"``.

    Example:
        >>> import numpy as np, tfbnn
        >>> token_ids = np.random.default_rng(0).integers(1, 50, size=(8, 10))
        >>> model = tfbnn.models.rnn_classifier("bbb", vocab_size=50, max_length=10, num_examples=100, seed=0)
        >>> [type(layer).__name__ for layer in model.layers[2:]]
        ['LSTMReparameterization', 'DenseFlipout']
        >>> tfbnn.predict(model, token_ids, num_samples=4).mean_probs.shape
        (8, 2)
    """
    if vocab_size is None:
        raise ValueError(
            "The recurrent classifier reads int token ids and needs `vocab_size` (the number of token ids, e.g. "
            "the text vectorizer's vocabulary size). Received: vocab_size=None"
        )
    checks.integer("vocab_size", vocab_size, 2)
    for arg, value in (("max_length", max_length), ("embed_dim", embed_dim), ("units", units)):
        checks.integer(arg, value, 1)
    build = _common.start(method, kwargs, "rnn_classifier", rank=1, num_classes=2, fixed_shape=(max_length,),
                          dtype="int32")
    x = keras.layers.Embedding(vocab_size, embed_dim, mask_zero=True, name="embedding")(build.inputs)
    x = build.factory.recurrent(cell, units, name="recurrent")(x)
    x = build.factory.dropout(x, name="recurrent_mc_dropout")
    return build.classifier(x, "rnn_classifier")
