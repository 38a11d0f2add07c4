"""Deep Deterministic Uncertainty (DDU, Mukhoti et al. 2021/2023): a feature density on a trained network.

DDU fits a Gaussian discriminant analysis (GDA) to the features ``z = f(x)`` of a trained,
distance-preserving (spectrally normalized, residual) classifier: per class ``c`` a mean,
a covariance and a prior,

    mu_c = mean_{i: y_i = c} z_i,    Sigma_c = cov_{i: y_i = c} z_i + j I,    pi_c = N_c / N

(the unbiased covariance, divided by ``N_c - 1`` as in the reference code and ``np.cov``; scikit-learn
1.9's ``QuadraticDiscriminantAnalysis`` divides by ``N_c``; ``j`` the smallest jitter of :data:`JITTERS` that makes
every ``Sigma_c`` positive definite). The feature density is the epistemic score and the
softmax entropy of the network's own prediction the aleatoric one (Mukhoti et al. 2023,
Algorithm 1, eq. 2-3):

    log q(z) = logsumexp_c [ log pi_c + log N(z; mu_c, Sigma_c) ]      (low: out of distribution)
    H[p(y | x)] = -sum_c p_c log p_c                                   (high: ambiguous)

:func:`tfbnn.evaluation.ood_scores` takes ``log_density`` and gives ``ddu_density`` =
``-log q(z)``.

Example:
    >>> import keras, numpy as np, tfbnn
    >>> inputs = keras.Input((4,))
    >>> h = tfbnn.layers.SpectralDense(6, activation="relu", seed=0, name="features")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    >>> x = np.random.default_rng(0).normal(size=(40, 4)).astype("float32")
    >>> ddu = tfbnn.ddu.DDU(model, feature_layer="features").fit(x, np.arange(40) % 2)
    >>> ddu.log_density(x).shape, ddu.aleatoric(x).shape
    ((40,), (40,))

Reference:
    Mukhoti, Kirsch, van Amersfoort, Torr, Gal. Deep Deterministic Uncertainty: A New Simple
    Baseline. CVPR 2023 (arXiv:2102.11582, 2021).
"""

import keras
import numpy as np
from scipy import linalg, special

from tfbnn._internal import checks
from tfbnn.inference import entropy

__all__ = ["DDU", "JITTERS"]

#: The jitters tried, smallest first, until every class covariance is positive definite (the
#: reference code's search, on a coarser grid).
JITTERS = (0.0, *(10.0 ** e for e in range(-12, 1)))


def _batched(model, x, batch_size):
    """``model(x)`` in batches, eagerly (no ``predict`` graph to trace for a few calls), as float64."""
    return np.concatenate([np.asarray(model(x[i:i + batch_size], training=False), np.float64)
                           for i in range(0, len(x), batch_size)])


def _examples(x):
    """``x`` as a finite float32 array with at least one example; else a ValueError naming ``x``."""
    x = checks.finite_array("x", x, np.float32)
    if x.ndim == 0 or len(x) == 0:
        raise ValueError(f"Expected `x` with at least one example. Received: x of shape {x.shape}")
    return x


def _model_input(model):
    """The model's input tensor (its list for several inputs): calling with a bare array then matches it."""
    return model.inputs[0] if len(model.inputs) == 1 else model.inputs


def _feature_model(model, feature_layer):
    if not isinstance(model, keras.Model):
        raise ValueError(f"Expected `model` to be a keras.Model. Received: model={model!r}")
    if isinstance(feature_layer, keras.Model):
        return feature_layer
    if feature_layer is None:  # the penultimate features: the output layer's input
        return keras.Model(_model_input(model), model.layers[-1].input)
    if isinstance(feature_layer, str):
        names = [layer.name for layer in model.layers]
        if feature_layer not in names:
            raise ValueError(f"Expected `feature_layer` to name a layer of the model ({names}). "
                             f"Received: feature_layer={feature_layer!r}")
        return keras.Model(_model_input(model), model.get_layer(feature_layer).output)
    raise ValueError("Expected `feature_layer` to be a layer name, a keras.Model or None. "
                     f"Received: feature_layer={feature_layer!r}")


class DDU:
    """A Gaussian discriminant analysis of a network's features: DDU's density and entropy.

    Args:
        model: the trained classifier (a functional or Sequential ``keras.Model`` whose outputs are
            class probabilities).
        feature_layer: the features ``z``: a layer name (that layer's output), a ``keras.Model`` mapping
            the inputs to features, or None (default: the input of the model's output layer).
        num_classes: int >= 2 or None (default: the model's last output dimension).
        batch_size: int >= 1, the batch of the forward passes. Default 256.

    After :meth:`fit`: ``means_`` ``(C, d)``, ``covariances_`` ``(C, d, d)`` (jitter included),
    ``priors_`` ``(C,)`` and ``jitter_``.
    """

    def __init__(self, model, feature_layer=None, num_classes=None, batch_size=256):
        self.model = model
        self.feature_model = _feature_model(model, feature_layer)
        if num_classes is None:
            num_classes = model.outputs[0].shape[-1]
        self.num_classes = checks.integer("num_classes", num_classes, 2)
        self.batch_size = checks.integer("batch_size", batch_size, 1)
        self._cholesky = None

    def features(self, x):
        """``z = f(x)``: ``(B, d)`` float64 features (flattened)."""
        x = _examples(x)
        z = _batched(self.feature_model, x, self.batch_size)
        z = z.reshape(len(z), -1)
        if not np.all(np.isfinite(z)):
            raise ValueError("The features of `x` are not finite (a diverged network?). "
                             f"Received: {int(np.sum(~np.isfinite(z)))} non-finite feature values")
        return z

    def fit(self, x, y):
        """Fits the class means, covariances and priors on the training inputs ``x`` and labels ``y``; returns self.

        Raises:
            ValueError: labels outside ``[0, C)``, a class with fewer than 2 examples, non-finite
                inputs or features, or no jitter of :data:`JITTERS` making the covariances positive definite.
        """
        y = np.asarray(y)
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or np.any(y < 0) or np.any(y >= self.num_classes):
            raise ValueError(f"Expected `y` to be integer labels in [0, {self.num_classes}). "
                             f"Received: y of dtype {y.dtype}, shape {y.shape}")
        counts = np.bincount(y, minlength=self.num_classes)
        if np.any(counts < 2):
            raise ValueError("Expected at least 2 examples of every class (a class covariance needs them). "
                             f"Received: class counts {counts.tolist()} in y")
        z = self.features(x)
        if len(z) != len(y):
            raise ValueError(f"Expected as many labels as inputs. Received: {len(z)} inputs, {len(y)} labels")
        self.means_ = np.stack([z[y == c].mean(axis=0) for c in range(self.num_classes)])
        covariances = np.stack([np.cov(z[y == c], rowvar=False).reshape(z.shape[1], z.shape[1])
                                for c in range(self.num_classes)])
        self.priors_ = counts / counts.sum()
        eye = np.eye(z.shape[1])
        for jitter in JITTERS:
            try:
                self._cholesky = np.stack([linalg.cholesky(s + jitter * eye, lower=True) for s in covariances])
            except linalg.LinAlgError:
                continue
            self.jitter_, self.covariances_ = jitter, covariances + jitter * eye
            return self
        raise ValueError(f"No jitter up to {JITTERS[-1]} makes the class covariances positive definite "
                         "(non-finite or degenerate features).")

    def class_log_densities(self, x):
        """``log pi_c + log N(f(x); mu_c, Sigma_c)``: ``(B, C)`` float64."""
        if self._cholesky is None:
            raise ValueError("Call fit(x, y) first: the DDU has no class densities yet.")
        z = self.features(x)
        d = z.shape[1]
        out = np.empty((len(z), self.num_classes))
        for c, chol in enumerate(self._cholesky):
            white = linalg.solve_triangular(chol, (z - self.means_[c]).T, lower=True)
            log_det = 2.0 * np.sum(np.log(np.diag(chol)))
            out[:, c] = np.log(self.priors_[c]) - 0.5 * (d * np.log(2 * np.pi) + log_det + np.sum(white**2, axis=0))
        return out

    def log_density(self, x):
        """``log q(f(x)) = logsumexp_c [log pi_c + log N(f(x); mu_c, Sigma_c)]``: ``(B,)`` float64, the epistemic
        score (low: unlike the training data)."""
        return special.logsumexp(self.class_log_densities(x), axis=1)

    def aleatoric(self, x):
        """The entropy of the model's predicted class probabilities ``H[p(y | x)]``: ``(B,)`` float64."""
        x = _examples(x)
        return entropy(_batched(self.model, x, self.batch_size))
