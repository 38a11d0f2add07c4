"""tfbnn: Bayesian deep learning as Keras 3 layers on TensorFlow Probability.

Flat public API::

    import tfbnn
    tfbnn.layers.DenseFlipout(...)          # layers
    tfbnn.priors.ScaleMixture(...)          # priors
    tfbnn.KLAnnealing(num_examples=N)       # the ELBO convention's beta schedule
    tfbnn.set_inference_mode(model, "mean") # posterior-mean predictions
"""

from tfbnn import callbacks, kl, layers, priors, schedules, utils
from tfbnn.callbacks import KLAnnealing
from tfbnn.layers import (
    BayesianLayer,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
)
from tfbnn.utils import (
    bayesian_layers,
    kl_divergence,
    posterior_mean,
    set_inference_mode,
    set_kl_weight,
    weight_samples,
)

__version__ = "0.1.0"

__all__ = [
    "callbacks",
    "kl",
    "layers",
    "priors",
    "schedules",
    "utils",
    "KLAnnealing",
    "BayesianLayer",
    "DenseReparameterization",
    "DenseFlipout",
    "DenseLocalReparameterization",
    "bayesian_layers",
    "kl_divergence",
    "posterior_mean",
    "set_inference_mode",
    "set_kl_weight",
    "weight_samples",
    "__version__",
]
