"""Monte Carlo prediction and the predictive summary (mean, entropy, aleatoric, epistemic).

:func:`predict` draws T samples of the posterior predictive in one vectorized
computation per batch and summarises them. For classification, with
``p_t = p(y | x, w_t)`` the class probabilities of weight sample ``t`` and
``p_bar = (1 / T) sum_t p_t`` (Depeweg et al. 2018, sec. 3; Trinh et al. 2022,
eq. 26-27), in nats::

    total      H[p_bar]                       = -sum_c p_bar_c log p_bar_c   (predictive entropy)
    aleatoric  E_w H[p(y | x, w)] ~ mean_t H[p_t]                          (expected entropy)
    epistemic  I[y; w | x]        = total - aleatoric                     (mutual information)

For regression, with per-sample means ``mu_t`` and (for a model ending in a
distribution head of :mod:`tfbnn.likelihoods`: :class:`GaussianHead`, Student-t,
mixture density) per-sample variances ``v_t = Var[y | theta_t]``, the law of total
variance splits the predictive variance::

    var[y] = var_t mu_t  +  mean_t v_t
             (epistemic)    (aleatoric)

How the T samples are drawn: the batch ``(B, ...)`` is tiled sample-major to
``(T * B, ...)`` and the model runs once inside :func:`tfbnn.utils.weight_samples`,
so every row gets its own independent weight sample (``joint=False``, the default:
exact per-row sampling by local reparameterization for the mean-field Gaussian
layers, no weight-sized draw), or each block of B rows shares one of T weight
samples (``joint=True``: coherent function draws, one batched matmul). Dropout is
independent per row anyway. Tiling without that context, or ``tf.vectorized_map``,
silently gives T identical samples for the weight-sampling layers.

References:
    Depeweg, Hernandez-Lobato, Doshi-Velez, Udluft. Decomposition of Uncertainty in
    Bayesian Deep Learning for Efficient and Risk-sensitive Learning. ICML 2018.
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022 (eq. 26-27).
    Gal, Ghahramani. Dropout as a Bayesian Approximation. ICML 2016 (MC dropout).
"""

# The API reference lists these names in the order they are imported here.
from tfbnn.inference._predict import METHODS, TASKS, predict
from tfbnn.inference._adaptive import SAMPLING_PER, AdaptiveSampling
from tfbnn.inference._summaries import (
    ClassificationPrediction,
    RegressionPrediction,
    summarize_classification,
    summarize_regression,
    entropy,
)
from tfbnn.inference._weights import FittedPosterior, FlatWeights, WeightPosterior, load_posterior
from tfbnn.likelihoods import GaussianHead, gaussian_nll

__all__ = [
    "predict",
    "AdaptiveSampling",
    "FittedPosterior",
    "load_posterior",
    "WeightPosterior",
    "FlatWeights",
    "SAMPLING_PER",
    "ClassificationPrediction",
    "RegressionPrediction",
    "summarize_classification",
    "summarize_regression",
    "entropy",
    "GaussianHead",
    "gaussian_nll",
    "TASKS",
    "METHODS",
]
