"""Pruning Bayesian layers: masks from the posterior, random baselines, sparse export.

A trained posterior says which weights matter. Two criteria:

* signal-to-noise ratio ``|mu| / sigma < threshold`` (Graves 2011; default
  threshold 0.83): :func:`snr_mask`. Works for every layer with a Gaussian
  posterior (Bayes-by-Backprop, :class:`tfbnn.layers.GravesDense`, variational
  dropout, whose ``|theta| / sigma = alpha^(-1/2)``).
* ``log alpha > threshold`` (Molchanov et al. 2017; default 3, a dropout rate
  above 95%): :func:`log_alpha_mask`, for the variational-dropout layers.

A *mask* is a boolean NumPy array shaped like the layer's kernel, ``True`` where
the weight is **kept**; a model's masks are a dict ``{layer name: mask}``
(:func:`compute_masks`). A weight already pruned (posterior mean exactly 0) is
always reported pruned, so masks and sparsity are stable after pruning.

:func:`random_masks` prunes as many weights per layer, at uniformly random
positions: the baseline that shows the posterior's choice matters.

Applying a mask (:func:`apply_masks`, or the context manager :func:`pruned`) sets
the pruned weights' posterior mean to 0 and their scale to (essentially) 0, so
both sampled and posterior-mean predictions exclude them: for the
variational-dropout layers exactly (the noise variance is ``alpha theta^2``); for
Gaussian layers the scale goes to its floor (1e-6 for softplus, ~4e-18 for log
variance).

Stored size: :func:`export_sparse` writes the kept posterior means only (a bit
mask or indices, and the values) in a compressed ``.npz`` whose size falls with
sparsity; :func:`restore_sparse` reads it back into a model of the same
architecture. :func:`save_compressed` writes a deflate-compressed ``.keras``
that :func:`keras.saving.load_model` reads as usual (Keras itself stores its
``.keras`` zip uncompressed, so its size does not change with sparsity).

Example:
    >>> import os, tempfile, keras, numpy as np, tfbnn
    >>> x = np.random.default_rng(0).normal(size=(100, 8)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((8,)),
    ...     tfbnn.DenseVariationalDropout(32, activation="relu", name="hidden", seed=1),
    ...     tfbnn.DenseVariationalDropout(2, activation="softmax", name="out", seed=2)])
    >>> masks = tfbnn.pruning.compute_masks(model)            # log alpha > 3 / snr < 0.83
    >>> {name: mask.shape for name, mask in masks.items()}    # True where a weight is kept
    {'hidden': (8, 32), 'out': (32, 2)}
    >>> print(tfbnn.pruning.sparsity_report(model, masks))    # untrained: little is pruned
    layer   type                     criterion  weights  pruned  sparsity  compression
    ...
    total                                           320 ...
    >>> with tfbnn.pruning.pruned(model, masks):
    ...     probs = tfbnn.predict(model, x, num_samples=10).mean_probs   # pruned predictions
    >>> rand = tfbnn.pruning.random_masks(masks, seed=0)       # same sparsity per layer
    >>> tfbnn.pruning.sparsity(rand) == tfbnn.pruning.sparsity(masks)
    True
    >>> nbytes = tfbnn.pruning.export_sparse(model, os.path.join(tempfile.mkdtemp(), "model.npz"), masks)
"""

import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
import zipfile

import keras
import numpy as np

from tfbnn._internal import checks
from tfbnn._internal import files
from tfbnn.inference import predict
from tfbnn.layers.variational_dropout import VariationalDropoutLayer
from tfbnn.utils import bayesian_layers

__all__ = [
    "CRITERIA",
    "DEFAULT_SNR_THRESHOLD",
    "DEFAULT_LOG_ALPHA_THRESHOLD",
    "prunable_layers",
    "signal_to_noise",
    "snr_mask",
    "log_alpha_mask",
    "compute_masks",
    "random_masks",
    "SCOPES",
    "BLUNDELL_FRACTIONS",
    "fraction_masks",
    "pruning_curve",
    "format_pruning_curve",
    "write_pruning_curve",
    "sparsity",
    "apply_masks",
    "pruned",
    "LayerSparsity",
    "SparsityReport",
    "sparsity_report",
    "require_prunable_layers",
    "check_threshold",
    "uncompiled_copy",
    "export_sparse",
    "load_sparse",
    "restore_sparse",
    "save_compressed",
]

CRITERIA = ("auto", "snr", "log_alpha")
#: Graves (2011): prune weights with |mu| / sigma below this.
DEFAULT_SNR_THRESHOLD = 0.83
#: Molchanov et al. (2017): prune weights with log alpha above this.
DEFAULT_LOG_ALPHA_THRESHOLD = 3.0
# Untransformed scale written into pruned weights: sigma = softplus(-100) + 1e-6 = 1e-6,
# and sigma^2 = exp(-80) (the log-variance clip).
#: Scopes of :func:`fraction_masks`: one ranking over all kernels, or one per layer.
SCOPES = ("global", "layer")
#: Blundell et al. (2015), Table 2: the fractions of weights removed (0: the full model).
BLUNDELL_FRACTIONS = (0.0, 0.5, 0.75, 0.95, 0.98)
_PRUNED_RHO = {"softplus": -100.0, "log_variance": -80.0}
_FORMAT = "tfbnn.sparse/1"


# -- which layers ----------------------------------------------------------------
def _is_prunable(layer):
    return hasattr(layer, "kernel_loc") and hasattr(layer, "kernel_scale") and layer.built


def prunable_layers(model):
    """The built Bayesian layers of ``model`` with a kernel posterior (``kernel_loc``, ``kernel_scale()``)."""
    return [layer for layer in bayesian_layers(model) if _is_prunable(layer)]


def require_prunable_layers(model_or_layer):
    """The prunable layers of a model (at least one) or ``[layer]``; a clear ``ValueError`` otherwise."""
    if isinstance(model_or_layer, keras.Model):
        layers = prunable_layers(model_or_layer)
        if not layers:
            raise ValueError(
                "Expected a model with at least one built Bayesian layer with a weight posterior "
                f"(e.g. DenseVariationalDropout, GravesDense). Received: model={model_or_layer.name!r}"
            )
        return layers
    if not _is_prunable(model_or_layer):
        raise ValueError(
            "Expected a built Bayesian layer with a weight posterior or a model holding some. "
            f"Received: {type(model_or_layer).__name__}"
        )
    return [model_or_layer]


def _check_names_unique(layers):
    names = [layer.name for layer in layers]
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"Masks are keyed by layer name; these names repeat: {repeated}")


# -- criteria --------------------------------------------------------------------
def check_threshold(criterion, threshold):
    """``threshold`` as a float, checked for ``criterion`` (``"snr"``: > 0; ``"log_alpha"``: finite)."""
    threshold = checks.number("threshold", threshold)
    if criterion == "snr" and threshold <= 0:
        raise ValueError(
            "Expected `threshold` > 0 for the signal-to-noise criterion |mu| / sigma (a ratio of "
            f"non-negative numbers; Graves uses {DEFAULT_SNR_THRESHOLD}). Received: threshold={threshold}"
        )
    return threshold


def _already_pruned(layer):
    return np.asarray(layer.kernel_loc.numpy()) == 0


def signal_to_noise(layer, scale=None):
    """``|mu| / sigma`` per kernel weight (NumPy); 0 where ``mu`` is 0.

    ``scale``: the layer's ``kernel_scale()`` when the caller has it already (else computed)."""
    mu = np.abs(np.asarray(layer.kernel_loc.numpy(), np.float64))
    sigma = np.asarray(layer.kernel_scale().numpy() if scale is None else scale, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        snr = np.where(mu > 0, mu / np.maximum(sigma, 1e-30), 0.0)
    return snr


def _one_or_many(model_or_layer, fn):
    if isinstance(model_or_layer, keras.Model):
        layers = require_prunable_layers(model_or_layer)
        _check_names_unique(layers)
        return {layer.name: fn(layer) for layer in layers}
    return fn(require_prunable_layers(model_or_layer)[0])


def snr_mask(model_or_layer, threshold=DEFAULT_SNR_THRESHOLD):
    """Keep-mask ``|mu| / sigma >= threshold`` (Graves 2011).

    Args:
        model_or_layer: a Bayesian layer, or a model (then a dict per layer).
        threshold: float > 0. Default 0.83.

    Returns:
        A boolean array shaped like the kernel (``True`` = kept), or a dict of them.
    """
    threshold = check_threshold("snr", threshold)

    def mask(layer):
        return (signal_to_noise(layer) >= threshold) & ~_already_pruned(layer)

    return _one_or_many(model_or_layer, mask)


def log_alpha_mask(model_or_layer, threshold=DEFAULT_LOG_ALPHA_THRESHOLD):
    """Keep-mask ``log alpha <= threshold`` (Molchanov et al. 2017) for variational-dropout layers.

    ``log alpha`` is the layer's clipped value (:meth:`DenseVariationalDropout.log_alpha`).
    With the multiplicative form (``alpha <= 1``) a threshold above 0 keeps every weight.

    Args:
        model_or_layer: a variational-dropout layer, or a model (a dict over its
            variational-dropout layers).
        threshold: float. Default 3.

    Raises:
        ValueError: the layer (or every layer of the model) has no ``log alpha``.
    """
    threshold = check_threshold("log_alpha", threshold)

    def mask(layer):
        if not isinstance(layer, VariationalDropoutLayer):
            raise ValueError(
                "The log-alpha criterion needs a variational-dropout layer (DenseVariationalDropout, "
                f"Conv2DVariationalDropout); use criterion='snr'. Received: layer {layer.name!r} of type "
                f"{type(layer).__name__}"
            )
        return (np.asarray(layer.log_alpha().numpy()) <= threshold) & ~_already_pruned(layer)

    if isinstance(model_or_layer, keras.Model):
        layers = [l for l in require_prunable_layers(model_or_layer) if isinstance(l, VariationalDropoutLayer)]
        if not layers:
            raise ValueError(
                "The log-alpha criterion needs variational-dropout layers and the model has none; "
                f"use criterion='snr'. Received: model={model_or_layer.name!r}"
            )
        _check_names_unique(layers)
        return {layer.name: mask(layer) for layer in layers}
    return mask(model_or_layer)


def _resolve_criterion(layer, criterion):
    if criterion == "auto":
        return "log_alpha" if isinstance(layer, VariationalDropoutLayer) else "snr"
    return criterion


def compute_masks(model, criterion="auto", threshold=None):
    """Keep-masks of every prunable layer of ``model``.

    Args:
        model: a Keras model with Bayesian layers.
        criterion: ``"auto"`` (default: ``log alpha`` for variational-dropout layers,
            signal-to-noise for the others), ``"snr"`` or ``"log_alpha"``.
        threshold: float or None (the criterion's default: 0.83 for snr, 3 for log alpha).
            With ``"auto"`` a given threshold applies to every layer, so pass it only
            when all layers use one criterion.

    Returns:
        ``{layer name: boolean keep-mask}``.
    """
    if criterion not in CRITERIA:
        raise ValueError(f"Expected `criterion` in {CRITERIA}. Received: criterion={criterion!r}")
    layers = require_prunable_layers(model)
    _check_names_unique(layers)
    masks = {}
    for layer in layers:
        which = _resolve_criterion(layer, criterion)
        if which == "snr":
            masks[layer.name] = snr_mask(layer, DEFAULT_SNR_THRESHOLD if threshold is None else threshold)
        else:
            masks[layer.name] = log_alpha_mask(layer, DEFAULT_LOG_ALPHA_THRESHOLD if threshold is None else threshold)
    return masks


def _check_masks(masks):
    if not isinstance(masks, dict) or not masks:
        raise ValueError(f"Expected a non-empty dict {{layer name: keep-mask}}. Received: masks={type(masks).__name__}")
    out = {}
    for name, mask in masks.items():
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise ValueError(f"Expected boolean keep-masks. Received: masks[{name!r}] of dtype {mask.dtype}")
        out[name] = mask
    return out


def random_masks(masks, seed=None):
    """Random keep-masks with exactly as many pruned weights per layer as ``masks``.

    The pruned positions are drawn uniformly without replacement over all the
    layer's weights: the baseline against which principled pruning is compared.

    Args:
        masks: ``{layer name: keep-mask}``, e.g. from :func:`compute_masks`.
        seed: int or None, seed of the NumPy generator.

    Returns:
        ``{layer name: keep-mask}`` with the same shapes and per-layer sparsity.
    """
    masks = _check_masks(masks)
    rng = np.random.default_rng(checks.numpy_seed(seed))
    out = {}
    for name, mask in masks.items():
        num_pruned = int(mask.size - np.count_nonzero(mask))
        flat = np.ones(mask.size, bool)
        flat[rng.choice(mask.size, size=num_pruned, replace=False)] = False
        out[name] = flat.reshape(mask.shape)
    return out


# -- fixed fractions -------------------------------------------------------------------
def _log_snr(layer, criterion):
    """``log(|mu| / sigma)`` per kernel weight, by ``criterion``; ``-inf`` where already pruned.

    For the log-alpha criterion this is ``-log(alpha) / 2`` from the layer's clipped
    ``log alpha`` (``|theta| / sigma = alpha^(-1/2)``), so the ranking is by highest
    ``log alpha`` first and layers of either criterion share one scale.
    """
    if _resolve_criterion(layer, criterion) == "snr":
        with np.errstate(divide="ignore"):
            score = np.log(signal_to_noise(layer))
    else:
        if not isinstance(layer, VariationalDropoutLayer):
            raise ValueError(
                "The log-alpha criterion needs a variational-dropout layer (DenseVariationalDropout, "
                f"Conv2DVariationalDropout); use criterion='snr'. Received: layer {layer.name!r} of type "
                f"{type(layer).__name__}"
            )
        score = -0.5 * np.asarray(layer.log_alpha().numpy(), np.float64)
    return np.where(_already_pruned(layer), -np.inf, score)


def _lowest(scores, count):
    """Boolean keep-mask of a flat score array with the ``count`` lowest removed (ties: lower index first)."""
    keep = np.ones(scores.size, bool)
    keep[np.argsort(scores, kind="stable")[:count]] = False
    return keep


def _check_fraction_args(criterion, scope, fraction):
    if criterion not in CRITERIA:
        raise ValueError(f"Expected `criterion` in {CRITERIA}. Received: criterion={criterion!r}")
    if scope not in SCOPES:
        raise ValueError(f"Expected `scope` in {SCOPES}. Received: scope={scope!r}")
    return checks.number("fraction", fraction, low=0, high=1, high_open=True)


def fraction_masks(model, fraction, criterion="auto", scope="global"):
    """Keep-masks that prune a fixed fraction of the weights, lowest signal-to-noise first.

    Each kernel weight gets the score ``s = log(|mu| / sigma)`` (Graves 2011), or for
    variational dropout with the log-alpha criterion ``s = -log(alpha) / 2`` (the same
    quantity, ``|theta| / sigma = alpha^(-1/2)``, from the layer's clipped
    ``log alpha``: the highest ``log alpha`` goes first). Weights already pruned
    (``mu = 0``) score ``-inf``. With ``n`` weights in scope, exactly
    ``k = round(fraction * n)`` (Python's ``round``) with the lowest scores are pruned:

    * ``scope="global"``: one ranking over all prunable kernels together
      (``n`` = all their weights), as in Blundell et al. (2015), Table 2;
    * ``scope="layer"``: each layer loses ``round(fraction * n_layer)`` of its own.

    Ties are broken deterministically: among equal scores the weight that comes first
    (layers in model order, then the kernel's flat C-order index) is pruned first.

    Args:
        model: a Keras model with Bayesian layers.
        fraction: float in ``[0, 1)``, the fraction of weights to prune (0 prunes nothing).
        criterion: ``"auto"`` (default: log alpha for variational-dropout layers,
            signal-to-noise for the others), ``"snr"`` or ``"log_alpha"``.
        scope: ``"global"`` (default) or ``"layer"``.

    Returns:
        ``{layer name: boolean keep-mask}``, like :func:`compute_masks`.

    Example:
        >>> import keras, tfbnn
        >>> model = keras.Sequential([keras.Input((8,)), tfbnn.DenseFlipout(32, seed=1),
        ...                           tfbnn.DenseFlipout(2, seed=2)])
        >>> masks = tfbnn.pruning.fraction_masks(model, 0.95)       # Blundell's 95% row
        >>> round(tfbnn.pruning.sparsity(masks), 2)
        0.95
        >>> masks = tfbnn.pruning.fraction_masks(model, 0.5, scope="layer")   # half of each layer
        >>> [round(tfbnn.pruning.sparsity(mask), 2) for mask in masks.values()]
        [0.5, 0.5]

    References:
        Blundell et al. (2015), Weight Uncertainty in Neural Networks, sec. 5.1,
        Table 2 and Fig. 4. Graves (2011), Practical Variational Inference for
        Neural Networks.
    """
    fraction = _check_fraction_args(criterion, scope, fraction)
    layers = require_prunable_layers(model)
    _check_names_unique(layers)
    scores = [_log_snr(layer, criterion) for layer in layers]
    if scope == "layer":
        return {
            layer.name: _lowest(s.reshape(-1), round(fraction * s.size)).reshape(s.shape)
            for layer, s in zip(layers, scores)
        }
    flat = np.concatenate([s.reshape(-1) for s in scores])
    keep = _lowest(flat, round(fraction * flat.size))
    ends = np.cumsum([s.size for s in scores])[:-1]
    return {layer.name: part.reshape(s.shape) for layer, s, part in zip(layers, scores, np.split(keep, ends))}


def _mc_accuracy(model, x, labels, num_samples, batch_size, masks):
    with pruned(model, masks):
        res = predict(model, x, num_samples=num_samples, batch_size=batch_size, task="classification")
    return float(np.mean(res.predicted_class == labels))


def pruning_curve(model, x, y, fractions=BLUNDELL_FRACTIONS, num_samples=10, scope="global", criterion="auto",
                  seed=None, random_baseline=True, batch_size=512):
    """Monte Carlo accuracy against the fraction of weights pruned, principled and random.

    For each ``fraction`` the model is pruned by :func:`fraction_masks` (lowest
    ``|mu| / sigma`` first) and, for the baseline, by :func:`random_masks` with the same
    number of weights per layer; the accuracy is that of the Monte Carlo predictive
    ``p(y | x) ~ (1/T) sum_t p(y | x, w_t)``, ``w_t ~ q(w)`` (:func:`tfbnn.predict`,
    ``T = num_samples``) of the pruned model (:func:`pruned`; the model is restored after).

    Args:
        model: a Keras classifier with Bayesian layers.
        x: inputs.
        y: integer labels ``(N,)`` or one-hot ``(N, C)``.
        fractions: fractions in ``[0, 1)`` (default Blundell's 0, 50, 75, 95, 98%).
        num_samples: int > 0, Monte Carlo samples T (default 10).
        scope: ``"global"`` (default) or ``"layer"`` (see :func:`fraction_masks`).
        criterion: ``"auto"``, ``"snr"`` or ``"log_alpha"``.
        seed: int or None, seeds the random masks (one draw per fraction).
        random_baseline: bool, also measure random pruning (default True).
        batch_size: int > 0, examples per prediction batch (default 512).

    Returns:
        A list of dicts ``{fraction, num_pruned, sparsity, accuracy, random_accuracy}``
        (``random_accuracy`` None without the baseline), one per fraction in order.

    Example:
        >>> import os, tempfile, keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(100, 8)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> model = keras.Sequential([keras.Input((8,)), tfbnn.DenseFlipout(32, activation="relu", seed=1),
        ...                           tfbnn.DenseFlipout(2, activation="softmax", seed=2)])
        >>> rows = tfbnn.pruning.pruning_curve(model, x, y, seed=0)      # by |mu| / sigma
        >>> [row["fraction"] for row in rows]
        [0.0, 0.5, 0.75, 0.95, 0.98]
        >>> print(tfbnn.pruning.format_pruning_curve(rows))
        Accuracy against the fraction of weights pruned
        -----------------------------------------------
        pruned  weights  accuracy  random
        0%            0 ...
        98%         314 ...
        >>> paths = tfbnn.pruning.write_pruning_curve(rows, tempfile.mkdtemp())
        >>> [os.path.basename(path) for path in paths]      # CSV, JSON and PNG
        ['pruning_curve.csv', 'pruning_curve.json', 'pruning_curve.png']

    References:
        Blundell et al. (2015), sec. 5.1, Table 2 (accuracy after removing 50-98% of
        the weights by signal-to-noise) and Fig. 4. Graves (2011).
    """
    if isinstance(fractions, (str, bytes)) or not hasattr(fractions, "__iter__"):
        raise ValueError(f"Expected `fractions` to be a sequence of numbers in [0, 1). Received: fractions={fractions!r}")
    fractions = [_check_fraction_args(criterion, scope, f) for f in fractions]
    if not fractions:
        raise ValueError("Expected at least one fraction. Received: fractions=[]")
    num_samples = checks.integer("num_samples", num_samples, 1)
    batch_size = checks.integer("batch_size", batch_size, 1)
    seed = checks.numpy_seed(seed)
    labels = np.asarray(y)
    if labels.ndim == 2:
        labels = labels.argmax(-1)
    if labels.ndim != 1 or len(labels) != len(x):
        raise ValueError(
            "Expected `y` to be integer labels (N,) or one-hot (N, C) with N = len(x) = "
            f"{len(x)}. Received: y of shape {np.shape(y)}"
        )
    rng = np.random.default_rng(seed)
    rows = []
    for fraction in fractions:
        masks = fraction_masks(model, fraction, criterion, scope)
        row = {"fraction": fraction, "num_pruned": sum(int(m.size - np.count_nonzero(m)) for m in masks.values()),
               "sparsity": sparsity(masks),
               "accuracy": _mc_accuracy(model, x, labels, num_samples, batch_size, masks),
               "random_accuracy": None}
        if random_baseline:
            rand = random_masks(masks, seed=int(rng.integers(2**31)))
            row["random_accuracy"] = _mc_accuracy(model, x, labels, num_samples, batch_size, rand)
        rows.append(row)
    return rows


def format_pruning_curve(rows, title="Accuracy against the fraction of weights pruned"):
    """:func:`pruning_curve`'s rows as a plain text table (Blundell et al. 2015, Table 2 style)."""
    table = [("pruned", "weights", "accuracy", "random")]
    for r in rows:
        random = "-" if r["random_accuracy"] is None else f"{100 * r['random_accuracy']:.2f}%"
        table.append((f"{100 * r['fraction']:g}%", str(r["num_pruned"]), f"{100 * r['accuracy']:.2f}%", random))
    return files.format_table(title, [table])


def write_pruning_curve(rows, output_dir, name="pruning_curve", title=None):
    """Writes :func:`pruning_curve`'s rows as ``<name>.csv``, ``<name>.json`` and ``<name>.png``.

    The files go next to each other in ``output_dir`` (created if needed); each is
    written atomically (:mod:`tfbnn._internal.files`); the PNG is :func:`tfbnn.plots.pruning_curve`.

    Returns:
        The three paths, CSV, JSON, PNG.
    """
    from tfbnn import plots  # matplotlib: loaded only when a figure is written

    files.prepare_output_dir(output_dir)
    base = os.path.join(output_dir, name)
    csv_path = files.write_csv(base + ".csv", rows, columns=["fraction", "num_pruned", "sparsity", "accuracy",
                                                          "random_accuracy"])
    json_path = files.write_json(base + ".json", {"rows": rows})
    fig = plots.pruning_curve(rows, **({} if title is None else {"title": title}))
    with files.atomic_write(base + ".png") as tmp:
        plots.save(fig, tmp)
    return [csv_path, json_path, base + ".png"]


def sparsity(masks):
    """Fraction of pruned weights: of one mask, or overall for a dict of masks."""
    if isinstance(masks, dict):
        total = sum(np.asarray(m).size for m in masks.values())
        kept = sum(np.count_nonzero(m) for m in masks.values())
        return float(1.0 - kept / total) if total else 0.0
    mask = np.asarray(masks)
    return float(1.0 - np.count_nonzero(mask) / mask.size) if mask.size else 0.0


# -- applying masks ----------------------------------------------------------------
def _scale_variable(layer):
    """(variable, value written where pruned) for the layer's kernel scale parameter, or None."""
    if isinstance(layer, VariationalDropoutLayer):
        # theta = 0 already zeroes the noise (variance alpha theta^2); a constant makes
        # the stored array compress and keeps log alpha at its upper clip.
        if layer.parameterization == "additive":
            return layer.kernel_log_sigma2, 0.0
        return layer.kernel_log_alpha, layer.max_log_alpha
    rho = getattr(layer, "kernel_rho", None)
    if rho is None:
        return None
    return rho, _PRUNED_RHO.get(getattr(layer, "scale_parameterization", "softplus"), -100.0)


def _noiseless_scale_value(layer):
    """The scale parameter of a (near) deterministic kept weight: the smallest noise the layer allows."""
    if isinstance(layer, VariationalDropoutLayer):
        return -1e4 if layer.parameterization == "additive" else layer.min_log_alpha  # log alpha at its lower clip
    return _PRUNED_RHO.get(getattr(layer, "scale_parameterization", "softplus"), -100.0)


def _layer_map(model, masks):
    layers = {layer.name: layer for layer in prunable_layers(model)}
    unknown = sorted(set(masks) - set(layers))
    if unknown:
        raise ValueError(
            f"Masks name layers that are not prunable layers of the model: {unknown}. "
            f"Received: model layers {sorted(layers)}"
        )
    for name, mask in masks.items():
        shape = tuple(layers[name].kernel_loc.shape)
        if mask.shape != shape:
            raise ValueError(
                f"Expected the mask of {name!r} to have the kernel's shape {shape}. Received: shape={mask.shape}"
            )
    return layers


def _apply(layers, masks):
    for name, mask in masks.items():
        layer = layers[name]
        keep = mask.astype(layer.kernel_loc.dtype)
        layer.kernel_loc.assign(layer.kernel_loc.numpy() * keep)
        scale = _scale_variable(layer)
        if scale is not None:
            variable, value = scale
            variable.assign(np.where(mask, variable.numpy(), np.asarray(value, variable.dtype)))


def _clone(model):
    try:
        clone = keras.models.clone_model(model)
    except ValueError as e:
        raise ValueError(
            "`copy=True` rebuilds the model, which needs a Sequential or functional model. Prune in "
            f"place (copy=False) or use `pruned(model, masks)`. Received: model of type {type(model).__name__}"
        ) from e
    for source, target in zip(model.variables, clone.variables):
        target.assign(source)
    return clone


def uncompiled_copy(model):
    """The model rebuilt from its config with its weights, without compile state (no optimizer).

    ``keras.models.clone_model`` compiles the clone like the original, so saving it
    would still write the optimizer's slots (Adam's triple the file). A model that
    cannot be rebuilt from its config (subclassed) is returned as it is.
    """
    try:
        copy = type(model).from_config(model.get_config())
    except (NotImplementedError, TypeError, ValueError):
        return model
    if len(copy.variables) != len(model.variables):
        return model
    for source, target in zip(model.variables, copy.variables):
        target.assign(source)
    return copy


def apply_masks(model, masks, copy=False):
    """Prunes: pruned weights get posterior mean 0 and a (near) zero scale.

    Args:
        model: a Keras model with Bayesian layers.
        masks: ``{layer name: keep-mask}``.
        copy: bool. False (default): prune ``model`` in place and return it. True:
            return a pruned clone and leave ``model`` untouched (Sequential or
            functional models).

    Returns:
        The pruned model.
    """
    masks = _check_masks(masks)
    _layer_map(model, masks)
    target = _clone(model) if copy else model
    _apply(_layer_map(target, masks), masks)
    return target


@contextlib.contextmanager
def pruned(model, masks):
    """Context manager: ``model`` pruned by ``masks`` inside, restored exactly after.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((8,)), tfbnn.DenseFlipout(2, seed=1)])
        >>> masks = tfbnn.pruning.fraction_masks(model, 0.5)
        >>> before = model.layers[0].kernel_loc.numpy()
        >>> with tfbnn.pruning.pruned(model, masks):
        ...     pruned_loc = model.layers[0].kernel_loc.numpy()
        >>> int((pruned_loc == 0).sum()), bool(np.array_equal(model.layers[0].kernel_loc.numpy(), before))
        (8, True)
    """
    masks = _check_masks(masks)
    layers = _layer_map(model, masks)
    saved = []
    for name in masks:
        layer = layers[name]
        variables = [layer.kernel_loc] + ([_scale_variable(layer)[0]] if _scale_variable(layer) else [])
        saved.extend((v, v.numpy().copy()) for v in variables)
    _apply(layers, masks)
    try:
        yield model
    finally:
        for variable, value in saved:
            variable.assign(value)


# -- reports ------------------------------------------------------------------------
class _PrunedFraction:
    """``sparsity`` and ``compression`` of ``num_weights`` weights of which ``num_pruned`` are pruned."""

    @property
    def sparsity(self):
        """``num_pruned / num_weights`` (0 without weights)."""
        return self.num_pruned / self.num_weights if self.num_weights else 0.0

    @property
    def compression(self):
        """``num_weights / kept`` (inf when everything is pruned)."""
        kept = self.num_weights - self.num_pruned
        return self.num_weights / kept if kept else math.inf


@dataclasses.dataclass(frozen=True)
class LayerSparsity(_PrunedFraction):
    """Sparsity of one layer's kernel."""

    name: str
    layer_type: str
    criterion: str
    num_weights: int
    num_pruned: int


@dataclasses.dataclass(frozen=True)
class SparsityReport(_PrunedFraction):
    """Per-layer sparsity of a model's kernels and the total.

    ``str(report)`` is a table; :meth:`as_dict` is JSON-able.
    """

    layers: tuple

    @property
    def num_weights(self):
        return sum(r.num_weights for r in self.layers)

    @property
    def num_pruned(self):
        return sum(r.num_pruned for r in self.layers)

    def per_layer(self):
        """``{layer name: sparsity}``."""
        return {r.name: r.sparsity for r in self.layers}

    def as_dict(self):
        return {
            "layers": [
                {**dataclasses.asdict(r), "sparsity": r.sparsity, "compression": r.compression} for r in self.layers
            ],
            "num_weights": self.num_weights,
            "num_pruned": self.num_pruned,
            "sparsity": self.sparsity,
            "compression": self.compression,
        }

    def __str__(self):
        rows = [("layer", "type", "criterion", "weights", "pruned", "sparsity", "compression")]
        for r in self.layers:
            rows.append(
                (r.name, r.layer_type, r.criterion, str(r.num_weights), str(r.num_pruned),
                 f"{100 * r.sparsity:.2f}%", f"{r.compression:.1f}x")
            )
        rows.append(("total", "", "", str(self.num_weights), str(self.num_pruned),
                     f"{100 * self.sparsity:.2f}%", f"{self.compression:.1f}x"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
        ]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(line.rstrip() for line in lines)


def sparsity_report(model, masks=None, criterion="auto", threshold=None):
    """Per-layer sparsity of ``model`` under ``masks`` (computed from the posterior if None).

    Returns:
        A :class:`SparsityReport`.
    """
    if masks is None:
        masks = compute_masks(model, criterion, threshold)
    masks = _check_masks(masks)
    layers = _layer_map(model, masks)
    rows = []
    for name, mask in masks.items():
        layer = layers[name]
        rows.append(
            LayerSparsity(
                name=name,
                layer_type=type(layer).__name__,
                criterion=_resolve_criterion(layer, criterion) if criterion in CRITERIA else "given",
                num_weights=int(mask.size),
                num_pruned=int(mask.size - np.count_nonzero(mask)),
            )
        )
    return SparsityReport(tuple(rows))


# -- stored size ----------------------------------------------------------------------
def _weights_by_key(model):
    """``{variable path without the model's own name: variable}`` (stable across rebuilt copies)."""
    out = {}
    for variable in model.weights:
        out.setdefault(variable.path.split("/", 1)[-1], variable)
    return out


def _encode_mask(mask):
    """The cheaper of a packed bit mask and a sorted index list."""
    flat_idx = np.flatnonzero(mask.reshape(-1))
    index_dtype = np.uint16 if mask.size <= np.iinfo(np.uint16).max else np.uint32
    bits = np.packbits(mask.reshape(-1))
    if flat_idx.size * np.dtype(index_dtype).itemsize < bits.nbytes:
        return "indices", flat_idx.astype(index_dtype)
    return "bitmask", bits


def _decode_mask(encoding, data, shape):
    size = int(np.prod(shape))
    if encoding == "indices":
        flat = np.zeros(size, bool)
        flat[data.astype(np.int64)] = True
    else:
        flat = np.unpackbits(data, count=size).astype(bool)
    return flat.reshape(shape)


def export_sparse(model, path, masks=None, include_scales=False, criterion="auto", threshold=None):
    """Writes a pruned model's weights to a compressed ``.npz``; returns its size in bytes.

    For each prunable layer only the kept posterior means are stored (with a
    packed bit mask or an index list, whichever is smaller), plus, with
    ``include_scales=True``, the kept weights' scale parameters (so the restored
    model can still sample). Every other weight (biases, other layers) is stored
    as is. The architecture is not stored: :func:`restore_sparse` writes the
    arrays into a model built the same way.

    Args:
        model: a Keras model with Bayesian layers.
        path: str, the output file (``.npz`` is appended by NumPy if missing).
        masks: ``{layer name: keep-mask}`` or None (computed with ``criterion``,
            ``threshold``). Already-zero weights are always dropped.
        include_scales: bool. Default False (the posterior mean: sparse prediction).

    Returns:
        int, the file size in bytes.
    """
    if masks is None:
        masks = compute_masks(model, criterion, threshold)
    masks = _check_masks(masks)
    layers = _layer_map(model, masks)
    arrays, meta = {}, {"format": _FORMAT, "layers": {}, "include_scales": bool(include_scales)}
    for name, mask in masks.items():
        layer = layers[name]
        loc = layer.kernel_loc.numpy()
        keep = mask & (loc != 0)
        encoding, data = _encode_mask(keep)
        key = f"layer{len(meta['layers'])}"
        arrays[f"{key}.mask"] = data
        arrays[f"{key}.loc"] = loc[keep]
        entry = {"key": key, "encoding": encoding, "shape": list(loc.shape)}
        scale = _scale_variable(layer)
        if include_scales and scale is not None:
            arrays[f"{key}.scale"] = scale[0].numpy()[keep]
        meta["layers"][name] = entry
    skip = {id(layers[n].kernel_loc) for n in masks}
    skip |= {id(_scale_variable(layers[n])[0]) for n in masks if _scale_variable(layers[n])}
    others = {}
    for name, variable in _weights_by_key(model).items():
        if id(variable) in skip:
            continue
        key = f"other{len(others)}"
        others[name] = key
        arrays[key] = variable.numpy()
    meta["others"] = others
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    path = str(path)
    if not path.endswith(".npz"):
        path += ".npz"
    np.savez_compressed(path, **arrays)
    return os.path.getsize(path)


def load_sparse(path):
    """Reads :func:`export_sparse`'s file.

    Returns ``{"layers": {name: {"kernel_loc", "mask", "kernel_scale_param"}}, "others": {key: array}}``.

    ``kernel_loc`` is the dense kernel (zeros where pruned), ``mask`` the keep-mask,
    ``kernel_scale_param`` the dense scale parameter with kept values (None if not stored).
    """
    with np.load(path) as data:
        try:
            meta = json.loads(bytes(data["__meta__"]).decode("utf-8"))
        except KeyError:
            raise ValueError(
                f"Expected a file written by tfbnn.pruning.export_sparse. Received: path={path!r}"
            ) from None
        if meta.get("format") != _FORMAT:
            raise ValueError(f"Unknown sparse format {meta.get('format')!r}. Received: path={path!r}")
        layers = {}
        for name, entry in meta["layers"].items():
            shape = tuple(entry["shape"])
            keep = _decode_mask(entry["encoding"], data[f"{entry['key']}.mask"], shape)
            loc = np.zeros(shape, data[f"{entry['key']}.loc"].dtype)
            loc[keep] = data[f"{entry['key']}.loc"]
            scale = None
            if f"{entry['key']}.scale" in data:
                scale = np.zeros(shape, loc.dtype)
                scale[keep] = data[f"{entry['key']}.scale"]
            layers[name] = {"kernel_loc": loc, "mask": keep, "kernel_scale_param": scale}
        others = {name: data[key] for name, key in meta["others"].items()}
    return {"layers": layers, "others": others}


def restore_sparse(model, path):
    """Writes an :func:`export_sparse` file into ``model`` (same architecture and layer names).

    Pruned weights get mean 0 and a (near) zero scale; without stored scales every
    kept weight gets the smallest scale the layer allows (variational dropout:
    ``log alpha`` at its lower clip), i.e. (nearly) the posterior-mean network.

    Returns:
        ``model``.
    """
    stored = load_sparse(path)
    masks = {name: entry["mask"] for name, entry in stored["layers"].items()}
    layers = _layer_map(model, masks)
    for name, entry in stored["layers"].items():
        layer = layers[name]
        layer.kernel_loc.assign(entry["kernel_loc"])
        scale = _scale_variable(layer)
        if scale is not None:
            variable, pruned_value = scale
            kept = entry["kernel_scale_param"]
            if kept is None:
                kept = np.full(variable.shape, _noiseless_scale_value(layer), variable.dtype)
            variable.assign(np.where(entry["mask"], kept, np.asarray(pruned_value, variable.dtype)))
    by_name = _weights_by_key(model)
    missing = sorted(set(stored["others"]) - set(by_name))
    if missing:
        raise ValueError(f"The model has no weights named {missing}; was it built like the exported one?")
    for name, value in stored["others"].items():
        by_name[name].assign(value)
    return model


def save_compressed(model, path):
    """Saves ``model`` as a ``.keras`` file whose zip entries are deflate-compressed.

    Keras writes ``.keras`` archives uncompressed; pruned (zeroed) weights then
    cost as much as any. This saves an uncompiled copy (no optimizer state; a
    subclassed model is saved as it is) and re-packs the archive with
    ``ZIP_DEFLATED`` (still a valid ``.keras`` for :func:`keras.saving.load_model`).

    Returns:
        int, the file size in bytes.
    """
    path = str(path)
    if not path.endswith(".keras"):
        raise ValueError(f"Expected a file name ending in '.keras'. Received: path={path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    model = uncompiled_copy(model)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        plain = os.path.join(tmp, "plain.keras")
        model.save(plain)
        packed = os.path.join(tmp, "packed.keras")
        with zipfile.ZipFile(plain) as src, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
            for info in src.infolist():
                dst.writestr(info.filename, src.read(info.filename))
        shutil.move(packed, path)
    return os.path.getsize(path)
