"""Evidential heads: one forward pass gives a second-order distribution (Normal-Inverse-Gamma, Dirichlet).

An evidential network outputs the parameters of a *prior over the likelihood's
parameters* and reads "aleatoric" and "epistemic" uncertainty off it in one pass,
without weight samples:

* regression (Amini et al. 2020, "Deep Evidential Regression"): :class:`EvidentialRegressionHead`
  outputs a Normal-Inverse-Gamma ``NIG(gamma, nu, alpha, beta)`` over the Gaussian's
  ``(mu, sigma^2)``; the loss :class:`EvidentialRegressionLoss` is the Student-t marginal
  NLL plus an evidence regularizer;
* classification (Sensoy et al. 2018, "Evidential Deep Learning to Quantify
  Classification Uncertainty"): :class:`DirichletHead` outputs a Dirichlet ``alpha =
  evidence + 1`` over the class probabilities; the loss :class:`EvidentialClassificationLoss`
  is the expected squared error (or a digamma / log loss) plus an annealed KL term that
  removes misleading evidence (:class:`EvidentialAnnealing` anneals it).

**What the "epistemic" number is.** Later work found that these single-pass
"epistemic" uncertainties are not faithful epistemic uncertainties: they are fitted by
a loss, not inferred, so they need not vanish as the data grow, and the regularizer's
weight sets their scale (Bengs et al. 2022; Meinert et al. 2023). Treat them as a
learned spread, useful for ranking inputs, not as posterior variances; the guide
``docs/guides/distribution-heads.md`` ("Evidential heads") shows it on data.

References:
    Amini, Schwarting, Soleimany, Rus. Deep Evidential Regression. NeurIPS 2020 (eq. 5, 8, 9).
    Sensoy, Kaplan, Kandemir. Evidential Deep Learning to Quantify Classification
    Uncertainty. NeurIPS 2018 (eq. 3-5, the KL term of sec. 4).
    Bengs, Huellermeier, Waegeman. Pitfalls of Epistemic Uncertainty Quantification
    through Loss Minimisation. NeurIPS 2022.
    Meinert, Gawlikowski, Lavin. The Unreasonable Effectiveness of Deep Evidential
    Regression. AAAI 2023.
"""

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn._internal import checks
from tfbnn.likelihoods import CategoricalHead, DistributionHead, checked_labels, distribution_head

tfd = tfp.distributions

__all__ = [
    "EvidentialRegressionHead",
    "EvidentialRegressionLoss",
    "DirichletHead",
    "EvidentialClassificationLoss",
    "EvidentialAnnealing",
    "EVIDENCE_FUNCTIONS",
    "CLASSIFICATION_LOSSES",
]

#: The evidence functions of :class:`DirichletHead` (raw score -> evidence >= 0).
EVIDENCE_FUNCTIONS = ("softplus", "relu", "exp")
#: The data terms of :class:`EvidentialClassificationLoss` (Sensoy et al. 2018, eq. 5, 4, 3).
CLASSIFICATION_LOSSES = ("mse", "digamma", "log")
_EXP_CLIP = 10.0  # exp evidence: raw scores clipped to [-10, 10] (e^10 ~ 2.2e4), as the reference code does


def _softplus_floor(raw, floor):
    return tf.nn.softplus(raw) + tf.cast(floor, raw.dtype)


@keras.saving.register_keras_serializable(package="tfbnn")
class EvidentialRegressionHead(DistributionHead):
    """Deep evidential regression head: ``4 d`` raw outputs -> Normal-Inverse-Gamma ``[gamma, nu, alpha, beta]``.

    The network's output is the NIG prior over a Gaussian likelihood's mean and
    variance (Amini et al. 2020, eq. 2-5)::

        y ~ N(mu, sigma^2),   mu ~ N(gamma, sigma^2 / nu),   sigma^2 ~ Gamma^-1(alpha, beta)

    With raw inputs ``[g, r_nu, r_alpha, r_beta]`` (each ``d`` wide) it returns
    ``gamma = g``, ``nu = softplus(r_nu) + m``, ``alpha = 1 + softplus(r_alpha) + m``,
    ``beta = softplus(r_beta) + m`` (``m = min_evidence``: ``nu, beta > 0`` and ``alpha > 1``
    stay finite at any initialization). Its moments (eq. 5)::

        E[mu] = gamma,   aleatoric E[sigma^2] = beta / (alpha - 1),
        epistemic Var[mu] = beta / (nu (alpha - 1))

    and, integrating ``mu`` and ``sigma^2`` out, the Student-t marginal (eq. 8)::

        p(y | gamma, nu, alpha, beta) = St(y; gamma, beta (1 + nu) / (nu alpha), 2 alpha)

    (location, squared scale, degrees of freedom), whose variance is the sum of the two
    parts above. :meth:`distribution` is that Student-t (``tfd.Independent(tfd.StudentT)``);
    train with :class:`EvidentialRegressionLoss` (its NLL plus the evidence regularizer).

    **In** :func:`tfbnn.predict`. :meth:`moments` gives ``(gamma, E[sigma^2])`` and
    :meth:`epistemic_variance` ``Var[mu]``; with T weight samples ``theta_t`` of a Bayesian
    body (T = 1 for a deterministic one)::

        mean = mean_t gamma_t,   aleatoric_std^2 = mean_t E[sigma^2]_t,
        epistemic_std^2 = var_t gamma_t + mean_t Var[mu]_t

    (the law of total variance over the weights, with the head's own ``Var[mu]`` added
    to the epistemic part). For a deterministic body ``epistemic_std^2 = Var[mu]``, the
    single-pass number of the paper; read the module docstring on what it is worth.

    Args:
        min_evidence: float > 0, the floor of ``nu``, ``beta`` and ``alpha - 1``. Default 1e-3.

    Input shape: ``(batch, ..., 4 d)``.
    Output shape: the same: ``gamma``, ``nu``, ``alpha``, ``beta``, each ``d`` wide.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> head = tfbnn.evidential.EvidentialRegressionHead()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(head.params_size(1)), head])
        >>> model.compile("adam", loss=tfbnn.evidential.EvidentialRegressionLoss(head, lam=0.01))
        >>> gamma, nu, alpha, beta = head.split(head(np.array([[0.5, 0.0, 0.0, 0.0]], "float32")))
        >>> float(gamma[0, 0]), round(float(nu[0, 0]), 4), round(float(alpha[0, 0]), 4)   # log 2 + 1e-3
        (0.5, 0.6941, 1.6941)
        >>> res = tfbnn.predict(model, np.zeros((3, 2), "float32"), num_samples=1)
        >>> res.aleatoric_std.shape, res.epistemic_std.shape
        ((3, 1), (3, 1))

    Reference:
        Amini, Schwarting, Soleimany, Rus. Deep Evidential Regression. NeurIPS 2020.
    """

    def __init__(self, min_evidence=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.min_evidence = checks.number("min_evidence", min_evidence, low=0, low_open=True)

    @staticmethod
    def params_size(event_size):
        """``4 d``: the units of the layer before the head."""
        return 4 * checks.integer("event_size", event_size, 1)

    def _event_size(self, dim, name, shape, inputs=False):
        if dim is None or dim % 4 or dim < 4:
            raise ValueError(f"Layer '{self.name}' expects a last dimension divisible by 4 (gamma, nu, alpha, "
                             f"beta for each target). Received: {name}={shape}")
        return dim // 4

    def call(self, inputs):
        gamma, nu, alpha, beta = tf.split(inputs, 4, axis=-1)
        floor = self.min_evidence
        return tf.concat([gamma, _softplus_floor(nu, floor), 1.0 + _softplus_floor(alpha, floor),
                          _softplus_floor(beta, floor)], axis=-1)

    def split(self, y_pred):
        """``(gamma, nu, alpha, beta)``, each ``(..., d)``, of the head's output ``(..., 4 d)``."""
        return tuple(tf.split(self._params(y_pred), 4, axis=-1))

    def student_t(self, y_pred):
        """``(loc, scale, df)`` of the Student-t marginal (eq. 8): ``gamma``, ``sqrt(beta (1 + nu) / (nu alpha))``,
        ``2 alpha``."""
        gamma, nu, alpha, beta = self.split(y_pred)
        return gamma, tf.sqrt(beta * (1.0 + nu) / (nu * alpha)), 2.0 * alpha

    def distribution(self, y_pred):
        loc, scale, df = self.student_t(y_pred)
        return tfd.Independent(tfd.StudentT(df, loc, scale), reinterpreted_batch_ndims=1)

    def moments(self, y_pred):
        """``(gamma, E[sigma^2] = beta / (alpha - 1))``: the mean and the aleatoric variance (eq. 5)."""
        gamma, _, alpha, beta = self.split(y_pred)
        return gamma, beta / (alpha - 1.0)

    def epistemic_variance(self, y_pred):
        """``Var[mu] = beta / (nu (alpha - 1))`` ``(..., d)`` (eq. 5): the head's single-pass "epistemic" part."""
        _, nu, alpha, beta = self.split(y_pred)
        return beta / (nu * (alpha - 1.0))

    def get_config(self):
        config = super().get_config()
        config.update({"min_evidence": self.min_evidence})
        return config


def _regression_head(head):
    head = distribution_head(head)
    if not isinstance(head, EvidentialRegressionHead):
        raise ValueError(f"Expected `head` to be an EvidentialRegressionHead. Received: head={head!r}")
    return head


@keras.saving.register_keras_serializable(package="tfbnn")
class EvidentialRegressionLoss(keras.losses.Loss):
    """Deep evidential regression loss: Student-t NLL (eq. 8) plus ``lam`` times the evidence regularizer (eq. 9).

    Per example, summed over the ``d`` targets (Keras averages over the batch)::

        L = -log St(y; gamma, beta (1 + nu) / (nu alpha), 2 alpha)  +  lam |y - gamma| (2 nu + alpha)

    The regularizer removes evidence (``nu``, ``alpha``) where the error is large; ``lam``
    sets how hard, and with it the scale of the "epistemic" ``Var[mu]`` the model learns
    (Amini et al. use 0.01 to 0.1; Meinert et al. 2023 sec. 4 on its effect).

    Args:
        head: the model's :class:`EvidentialRegressionHead` (or an equal one).
        lam: float >= 0, the regularizer's weight ``lambda``. Default 0.01.
        reduction, name, dtype: as for a Keras loss.

    Example:
        >>> import numpy as np, scipy.stats, tfbnn
        >>> head = tfbnn.evidential.EvidentialRegressionHead()
        >>> out = np.array([[0.0, 1.0, 3.0, 2.0]], "float32")      # gamma, nu, alpha, beta (already constrained)
        >>> loss = tfbnn.evidential.EvidentialRegressionLoss(head, lam=0.0)
        >>> expected = -scipy.stats.t.logpdf(0.5, df=6.0, scale=np.sqrt(2.0 * 2 / 3))
        >>> bool(np.isclose(float(loss(np.array([[0.5]]), out)), expected, rtol=1e-5))
        True
    """

    def __init__(self, head, lam=0.01, reduction="sum_over_batch_size", name="evidential_regression_loss",
                 dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.head = _regression_head(head)
        self.lam = checks.number("lam", lam, low=0)

    def call(self, y_true, y_pred):
        nll = -self.head.log_prob(y_true, y_pred)
        gamma, nu, alpha, _ = self.head.split(y_pred)
        y = tf.reshape(tf.cast(y_true, gamma.dtype), tf.shape(gamma))
        return nll + self.lam * tf.reduce_sum(tf.abs(y - gamma) * (2.0 * nu + alpha), axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update({"head": keras.saving.serialize_keras_object(self.head), "lam": self.lam})
        return config


def _evidence(name, raw):
    if name == "softplus":
        return tf.nn.softplus(raw)
    if name == "relu":
        return tf.nn.relu(raw)
    return tf.exp(tf.clip_by_value(raw, -_EXP_CLIP, _EXP_CLIP))


@keras.saving.register_keras_serializable(package="tfbnn")
class DirichletHead(DistributionHead):
    """Evidential classification head: ``K`` raw scores -> Dirichlet concentrations ``alpha = evidence + 1``.

    Sensoy et al. (2018) read a classifier's outputs as evidence ``e_k >= 0`` for each of
    ``K`` classes and place ``Dir(p; alpha)``, ``alpha_k = e_k + 1``, over the class
    probabilities. With ``S = sum_k alpha_k``::

        class probabilities  p_k = alpha_k / S,      uncertainty  u = K / S  in (0, 1]

    (``u = 1``: no evidence at all). :meth:`distribution` is the predictive of one label,
    ``DirichletMultinomial(1, alpha)`` (its ``log_prob`` of a one-hot label is ``log(alpha_y / S)``,
    Sensoy's eq. 3); :meth:`dirichlet` the ``tfd.Dirichlet`` itself. Train with
    :class:`EvidentialClassificationLoss`. :func:`tfbnn.predict` averages ``alpha / S`` over
    weight samples (a deterministic body: one sample, zero mutual information); read ``u``
    with :meth:`uncertainty`.

    Args:
        evidence: one of :data:`EVIDENCE_FUNCTIONS`: ``"softplus"`` (default), ``"relu"``
            (Sensoy et al.) or ``"exp"`` (raw scores clipped to [-10, 10]).

    Input shape: ``(batch, ..., K)``, ``K >= 2``.
    Output shape: the same: the concentrations ``alpha`` (each >= 1).

    Example:
        >>> import numpy as np, tfbnn
        >>> head = tfbnn.evidential.DirichletHead(evidence="relu")
        >>> alpha = head(np.array([[4.0, -1.0, 0.0]], "float32"))    # evidence (4, 0, 0)
        >>> alpha.numpy().tolist(), [round(float(p), 3) for p in head.class_probabilities(alpha)[0]]
        ([[5.0, 1.0, 1.0]], [0.714, 0.143, 0.143])
        >>> round(float(head.uncertainty(alpha)[0]), 4)               # K / S = 3 / 7
        0.4286

    Reference:
        Sensoy, Kaplan, Kandemir. Evidential Deep Learning to Quantify Classification
        Uncertainty. NeurIPS 2018.
    """

    task = "classification"

    def __init__(self, evidence="softplus", **kwargs):
        super().__init__(**kwargs)
        if evidence not in EVIDENCE_FUNCTIONS:
            raise ValueError(f"Expected `evidence` in {EVIDENCE_FUNCTIONS}. Received: evidence={evidence!r}")
        self.evidence = evidence

    # One score per class, as CategoricalHead: K outputs, a last dimension >= 2.
    params_size = staticmethod(CategoricalHead.params_size)
    _event_size = CategoricalHead._event_size

    def call(self, inputs):
        return _evidence(self.evidence, inputs) + 1.0

    def dirichlet(self, y_pred):
        """``tfd.Dirichlet(alpha)``: the distribution over the class probabilities."""
        return tfd.Dirichlet(self._params(y_pred))

    def distribution(self, y_pred):
        alpha = self._params(y_pred)
        return tfd.DirichletMultinomial(tf.ones_like(alpha[..., 0]), alpha)

    def log_prob(self, y_true, y_pred):
        """One-hot targets ``(B, ..., K)`` or integer labels ``(B, ...)`` / ``(B, ..., 1)``: ``log(alpha_y / S)``."""
        alpha = self._params(y_pred)
        return tf.reduce_sum(one_hot_targets(y_true, alpha) * tf.math.log(alpha / tf.reduce_sum(
            alpha, axis=-1, keepdims=True)), axis=-1)

    def class_probabilities(self, y_pred):
        alpha = self._params(y_pred)
        return alpha / tf.reduce_sum(alpha, axis=-1, keepdims=True)

    def uncertainty(self, y_pred):
        """``u = K / S`` ``(B, ...)``: Sensoy's uncertainty mass (1 without evidence)."""
        alpha = self._params(y_pred)
        return tf.cast(tf.shape(alpha)[-1], alpha.dtype) / tf.reduce_sum(alpha, axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update({"evidence": self.evidence})
        return config


def one_hot_targets(y_true, alpha):
    """``y_true`` (one-hot ``(B, ..., K)`` or integer labels ``(B, ...)`` / ``(B, ..., 1)``) as one-hot floats."""
    y_true = tf.convert_to_tensor(y_true)
    k = alpha.shape[-1]
    if y_true.shape.rank == alpha.shape.rank and y_true.shape[-1] == 1 and k != 1:
        y_true = y_true[..., 0]
    if y_true.shape.rank == alpha.shape.rank - 1:
        labels = checked_labels(y_true, k)
        return tf.one_hot(labels, k, dtype=alpha.dtype)
    if not y_true.shape.is_compatible_with(alpha.shape):
        raise ValueError(f"Expected one-hot `y_true` shaped like `y_pred`, or integer labels. Received: "
                         f"y_true.shape={tuple(y_true.shape)}, y_pred.shape={tuple(alpha.shape)}")
    return tf.cast(y_true, alpha.dtype)


def dirichlet_kl_to_uniform(alpha):
    """``KL(Dir(alpha) || Dir(1, ..., 1))`` ``(B, ...)`` in closed form (Sensoy et al. 2018, sec. 4)::

        log Gamma(S) - log Gamma(K) - sum_k log Gamma(alpha_k) + sum_k (alpha_k - 1)(psi(alpha_k) - psi(S))
    """
    s = tf.reduce_sum(alpha, axis=-1)
    k = tf.cast(tf.shape(alpha)[-1], alpha.dtype)
    return (tf.math.lgamma(s) - tf.math.lgamma(k) - tf.reduce_sum(tf.math.lgamma(alpha), axis=-1)
            + tf.reduce_sum((alpha - 1.0) * (tf.math.digamma(alpha) - tf.math.digamma(s)[..., None]), axis=-1))


@keras.saving.register_keras_serializable(package="tfbnn")
class EvidentialClassificationLoss(keras.losses.Loss):
    """Evidential classification loss (Sensoy et al. 2018): a data term plus the annealed KL on misleading evidence.

    With ``alpha`` the :class:`DirichletHead`'s output, ``S = sum_k alpha_k``, ``p = alpha / S``
    and ``y`` one-hot, the data term is one of (per example)::

        "mse"      sum_k (y_k - p_k)^2 + p_k (1 - p_k) / (S + 1)        (eq. 5, the paper's choice)
        "digamma"  sum_k y_k (psi(S) - psi(alpha_k))                    (eq. 4)
        "log"      sum_k y_k (log S - log alpha_k)                      (eq. 3)

    and the regularizer is the KL from the Dirichlet with the true class's evidence
    removed, ``alpha~ = y + (1 - y) alpha``, to the uniform ``Dir(1)``::

        L = data + lambda_t KL(Dir(alpha~) || Dir(1)),    lambda_t = min(1, t / annealing_epochs)

    ``lambda_t`` is the non-trainable variable :attr:`kl_coefficient` (read inside the
    compiled step); :class:`EvidentialAnnealing` sets it at each epoch ``t``. Without that
    callback it keeps the value it was made with (default 1: the un-annealed loss).
    The config holds its current value, so a model saved after annealing (``.keras``, whose
    compile config holds the loss) loads with the coefficient it had: the loss belongs to
    the loss object, not to the :class:`DirichletHead` (the KL term reads the labels, which
    a layer never sees), and Keras saves a loss through its config.

    Args:
        loss: one of :data:`CLASSIFICATION_LOSSES`. Default ``"mse"``.
        kl_coefficient: float >= 0, the KL weight until a callback changes it. Default 1.
        reduction, name, dtype: as for a Keras loss.

    Targets: one-hot ``(B, K)`` or integer labels ``(B,)`` / ``(B, 1)``.

    Example:
        >>> import numpy as np, tfbnn
        >>> loss = tfbnn.evidential.EvidentialClassificationLoss("mse", kl_coefficient=0.0)
        >>> alpha = np.array([[3.0, 1.0]], "float32")                  # p = (3/4, 1/4), S = 4
        >>> round(float(loss(np.array([0]), alpha)), 4)                 # 2 (1/16) + 2 (3/16) / 5
        0.2
    """

    def __init__(self, loss="mse", kl_coefficient=1.0, reduction="sum_over_batch_size",
                 name="evidential_classification_loss", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        if loss not in CLASSIFICATION_LOSSES:
            raise ValueError(f"Expected `loss` in {CLASSIFICATION_LOSSES}. Received: loss={loss!r}")
        self.loss = loss
        self.initial_kl_coefficient = checks.number("kl_coefficient", kl_coefficient, low=0)
        self.kl_coefficient = keras.Variable(self.initial_kl_coefficient, dtype="float32", trainable=False,
                                             name="kl_coefficient")

    def data_term(self, y, alpha):
        s = tf.reduce_sum(alpha, axis=-1, keepdims=True)
        if self.loss == "mse":
            p = alpha / s
            return tf.reduce_sum(tf.square(y - p) + p * (1.0 - p) / (s + 1.0), axis=-1)
        if self.loss == "digamma":
            return tf.reduce_sum(y * (tf.math.digamma(s) - tf.math.digamma(alpha)), axis=-1)
        return tf.reduce_sum(y * (tf.math.log(s) - tf.math.log(alpha)), axis=-1)

    def call(self, y_true, y_pred):
        alpha = checks.float_tensor("y_pred", y_pred)
        y = one_hot_targets(y_true, alpha)
        kl = dirichlet_kl_to_uniform(y + (1.0 - y) * alpha)
        return self.data_term(y, alpha) + tf.cast(self.kl_coefficient, alpha.dtype) * kl

    def get_config(self):
        config = super().get_config()
        config.update({"loss": self.loss, "kl_coefficient": float(keras.ops.convert_to_numpy(self.kl_coefficient))})
        return config


class EvidentialAnnealing(keras.callbacks.Callback):
    """Sets ``kl_coefficient = min(1, epoch / annealing_epochs)`` on the model's evidential losses each epoch.

    Sensoy et al. (2018, sec. 4) anneal the KL term from 0 so that the network first
    learns to put evidence on the true class. The coefficient is logged as
    ``evidential_kl_coefficient``.

    Args:
        annealing_epochs: int > 0, the epochs to reach 1 (Sensoy et al.: 10). Default 10.
        losses: the :class:`EvidentialClassificationLoss` objects to drive, or None
            (default): those the model was compiled with.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), tfbnn.evidential.DirichletHead()])
        >>> model.compile("adam", loss=tfbnn.evidential.EvidentialClassificationLoss())
        >>> x, y = np.zeros((8, 2), "float32"), np.zeros(8, "int32")
        >>> h = model.fit(x, y, epochs=3, verbose=0, callbacks=[tfbnn.evidential.EvidentialAnnealing(2)])
        >>> h.history["evidential_kl_coefficient"]
        [0.0, 0.5, 1.0]
    """

    def __init__(self, annealing_epochs=10, losses=None):
        super().__init__()
        self.annealing_epochs = checks.integer("annealing_epochs", annealing_epochs, 1)
        self.losses = None if losses is None else list(tf.nest.flatten(losses))
        self.coefficient = None

    def _targets(self):
        found = self.losses if self.losses is not None else tf.nest.flatten(getattr(self.model, "loss", None))
        targets = [loss for loss in found if isinstance(loss, EvidentialClassificationLoss)]
        if not targets:
            raise ValueError("Expected a model compiled with an EvidentialClassificationLoss (or `losses`). "
                             f"Received: losses={found!r}")
        return targets

    def on_epoch_begin(self, epoch, logs=None):
        self.coefficient = min(1.0, epoch / self.annealing_epochs)
        for loss in self._targets():
            loss.kl_coefficient.assign(self.coefficient)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["evidential_kl_coefficient"] = self.coefficient

