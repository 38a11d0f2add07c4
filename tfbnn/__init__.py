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

import importlib

from tfbnn._internal import allocator as _allocator
from tfbnn._internal import backend as _backend
from tfbnn._internal.version import __version__

_backend.check()  # one clear error on the JAX or PyTorch backend, before TensorFlow loads
_allocator.prefer_pooled_allocator()  # TF_CPU_ALLOCATOR_USE_BFC=true unless set (tfbnn/_internal/allocator.py)

# The one list of public names: every submodule (loaded by `import tfbnn` when in
# _CORE, on first use when in _LAZY_MODULES) and every name re-exported from one
# (_NAMES); ``__all__`` is built from them. `import tfbnn` loads the core
# (TensorFlow, Keras, the layers, so that saved models deserialize) but never
# KerasTuner or matplotlib: tuning, plots, evaluation, training, experiments and
# the command line load on first use (``tfbnn.tuning``). This is the one import mode: the
# `tfbnn` command's entry point (_tfbnn_command.py, outside the package) parses its
# arguments before this file runs, and then runs it as it is.
# tests/test_public_names.py checks that every name resolves and that the
# submodules are the ones the API reference documents.
_CORE = ("priors", "posteriors", "kl", "layers", "schedules", "utils", "callbacks", "inference",
         "likelihoods", "evidential", "metrics", "calibration", "pruning", "convert", "export", "distribute", "ibnn",
         "multisample", "ensembles", "continual", "laplace", "hub", "lora", "swag", "hmc", "sgmcmc", "conformal", "moments",
         "sngp", "ddu", "methods", "models", "datasets")
_LAZY_MODULES = ("tuning", "plots", "evaluation", "training", "experiments", "testing", "cli")
# Documented and importable (``tfbnn.cli``, ``import tfbnn.testing``), but not library API: the
# command line, the studies behind it and the test harness for new layers stay out of ``__all__``
# (``from tfbnn import *`` does not bind them).
_TOOLS = ("experiments", "testing", "cli")
_NAMES = {
    "_internal.errors": ("RunError",),
    "_internal.backend": ("BackendError",),
    "callbacks": ("KLAnnealing", "SparsityMonitor"),
    "calibration": ("TemperatureScaling",),
    "inference": ("ClassificationPrediction", "RegressionPrediction", "predict"),
    "likelihoods": ("GaussianHead", "gaussian_nll", "StudentTHead", "MixtureNormalHead", "BernoulliHead",
                    "CategoricalHead", "DistributionLambdaHead", "DistributionNLL"),
    "metrics": ("BrierScore", "ExpectedCalibrationError", "NegativeLogLikelihood", "brier_score",
                "expected_calibration_error", "negative_log_likelihood"),
    "layers": ("Conv1DVariationalDropout", "Conv2DVariationalDropout", "DenseVariationalDropout", "GravesDense",
               "NodeConv1D", "NodeConv2D", "NodeDense", "NodeNoise", "NodeDenseFlow", "NodeConv2DFlow",
               "Conv1DFlipout", "Conv1DReparameterization",
               "Conv2DFlipout", "Conv2DReparameterization", "Conv3DFlipout", "Conv3DReparameterization",
               "Conv1DTransposeFlipout", "Conv1DTransposeReparameterization", "Conv2DTransposeFlipout",
               "Conv2DTransposeReparameterization", "Conv3DTransposeFlipout", "Conv3DTransposeReparameterization",
               "EmbeddingReparameterization",
               "BayesianLayer", "DenseFlipout", "DenseLocalReparameterization", "DenseReparameterization",
               "MCDropout", "MCSpatialDropout2D", "StochasticLayer", "DenseVariational",
               "LSTMCellReparameterization", "GRUCellReparameterization", "LSTMReparameterization",
               "GRUReparameterization"),
    "multisample": ("MultiSampleModel",),
    "ensembles": ("DeepEnsemble",),
    "utils": ("bayesian_layers", "kl_divergence", "posterior_mean", "set_inference_mode", "set_kl_weight",
              "stochastic_layers", "weight_samples"),
}
_HOME = {name: module for module, names in _NAMES.items() for name in names}


def __getattr__(name):
    if name in _CORE or name in _LAZY_MODULES:
        return importlib.import_module(f"tfbnn.{name}")
    if name in _HOME:
        return getattr(importlib.import_module(f"tfbnn.{_HOME[name]}"), name)
    raise AttributeError(f"module 'tfbnn' has no attribute {name!r}")


def __dir__():
    """The loaded attributes and every public name, the lazy modules included."""
    return sorted(set(globals()) | set(__all__) | set(_TOOLS))


for _module in _CORE:
    globals()[_module] = importlib.import_module(f"tfbnn.{_module}")
for _name, _module in _HOME.items():
    globals()[_name] = getattr(importlib.import_module(f"tfbnn.{_module}"), _name)
del _name, _module

__all__ = [*_CORE, *(m for m in _LAZY_MODULES if m not in _TOOLS), *_HOME, "__version__"]
