"""tfbnn: Bayesian deep learning as Keras 3 layers on TensorFlow Probability.

Flat public API::

    import tfbnn
    tfbnn.layers.DenseFlipout(...)          # layers
    tfbnn.priors.ScaleMixture(...)          # priors
    tfbnn.KLAnnealing(num_examples=N)       # the ELBO convention's beta schedule
    tfbnn.set_inference_mode(model, "mean") # posterior-mean predictions
    tfbnn.predict(model, x, num_samples=100)  # Monte Carlo predictive + uncertainty split
    tfbnn.metrics.ExpectedCalibrationError()  # calibration metrics
"""

from tfbnn import _quiet

if _quiet.running_the_command():  # the `tfbnn` command: keep TF's start-up log out of its output
    _quiet.import_tensorflow_quietly()

from tfbnn import callbacks, datasets, distribute, export, kl, layers, priors, schedules, utils  # noqa: E402
from tfbnn import calibration, convert, evaluation, ibnn, models, inference, likelihoods, metrics, plots, pruning, tuning  # noqa: E402
from tfbnn.pruning import SparsityMonitor  # noqa: E402
from tfbnn.calibration import TemperatureScaling  # noqa: E402
from tfbnn.inference import ClassificationPrediction, RegressionPrediction, predict  # noqa: E402
from tfbnn.likelihoods import GaussianHead, gaussian_nll  # noqa: E402
from tfbnn.metrics import (  # noqa: E402
    BrierScore,
    ExpectedCalibrationError,
    NegativeLogLikelihood,
    brier_score,
    expected_calibration_error,
    negative_log_likelihood,
)
from tfbnn.callbacks import KLAnnealing  # noqa: E402
from tfbnn.layers import (  # noqa: E402
    Conv2DVariationalDropout,
    DenseVariationalDropout,
    GravesDense,
    NodeConv2D,
    NodeDense,
    NodeNoise,
    Conv1DFlipout,
    Conv1DReparameterization,
    Conv2DFlipout,
    Conv2DReparameterization,
    BayesianLayer,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
    MCDropout,
    MCSpatialDropout2D,
    StochasticLayer,
)
from tfbnn.utils import (  # noqa: E402
    bayesian_layers,
    kl_divergence,
    posterior_mean,
    set_inference_mode,
    set_kl_weight,
    stochastic_layers,
    weight_samples,
)

__version__ = "0.1.0"

__all__ = [
    "callbacks",
    "datasets",
    "distribute",
    "export",
    "kl",
    "layers",
    "priors",
    "schedules",
    "utils",
    "calibration",
    "evaluation",
    "plots",
    "models",
    "ibnn",
    "convert",
    "pruning",
    "SparsityMonitor",
    "tuning",
    "inference",
    "likelihoods",
    "metrics",
    "KLAnnealing",
    "BayesianLayer",
    "DenseReparameterization",
    "DenseFlipout",
    "DenseLocalReparameterization",
    "Conv1DReparameterization",
    "Conv1DFlipout",
    "Conv2DReparameterization",
    "Conv2DFlipout",
    "DenseVariationalDropout",
    "Conv2DVariationalDropout",
    "GravesDense",
    "NodeDense",
    "NodeConv2D",
    "NodeNoise",
    "MCDropout",
    "MCSpatialDropout2D",
    "StochasticLayer",
    "bayesian_layers",
    "kl_divergence",
    "posterior_mean",
    "set_inference_mode",
    "set_kl_weight",
    "stochastic_layers",
    "weight_samples",
    "predict",
    "ClassificationPrediction",
    "RegressionPrediction",
    "GaussianHead",
    "gaussian_nll",
    "TemperatureScaling",
    "ExpectedCalibrationError",
    "NegativeLogLikelihood",
    "BrierScore",
    "expected_calibration_error",
    "negative_log_likelihood",
    "brier_score",
    "__version__",
]
