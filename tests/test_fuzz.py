"""Fuzzing the public API: bad arguments give a ValueError or TypeError naming the argument.

For every public constructor and function (layers, priors, schedules, callbacks,
metrics, calibration, ``predict``, likelihoods, the model-level helpers and
``models.build``) one argument at a time gets an arbitrary value while the others
stay valid. The call may succeed; if it fails, it must fail with a ``ValueError`` or
``TypeError`` whose message names that argument (as a word), never with an
``AttributeError``, ``ZeroDivisionError``, ``OverflowError``, a TensorFlow error or a
message about something else. The examples are derandomized and bounded, so the run
is reproducible and takes seconds.
"""

import inspect
import math
import re

import keras
import numpy as np
import pytest
import tensorflow_probability as tfp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfbnn
from tfbnn import calibration, metrics, posteriors, priors, schedules

# -- values ---------------------------------------------------------------------------

# Scalars and small containers: what an argument might wrongly receive. Kept to sizes
# where a valid value costs no real work (a layer of 40 units, not of 2**62).
EDGE_VALUES = [
    None, True, False, 0, -1, 1, 2, 3, 40, 2**31, 2**63, 2**64, -(2**63) - 1, 10**400,
    0.0, -0.0, 0.5, 1.5, -1.0, 1e-300, 1e-46, 1e-30, 1e300, 1.34e154, math.nan, math.inf, -math.inf,
    "", "x", "normal", "same", "sample", "auto", [], [1], [2, 2], (0,), (2, 2), (3, -1), {}, {"a": 1},
    np.int64(3), np.int32(-2), np.uint8(7), np.float32(0.5), np.float64(math.nan), np.float16(1e4),
    np.bool_(True), object(),
]
SCALARS = st.one_of(
    st.sampled_from(EDGE_VALUES),
    st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.text(max_size=4),
    st.lists(st.integers(-2, 5), max_size=3),
    st.tuples(st.integers(-2, 5), st.integers(-2, 5)),
)
# Data arguments (probabilities, labels, inputs): arrays of odd shapes and values too.
ARRAYS = st.builds(
    lambda shape, fill: np.full(shape, fill),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
    st.sampled_from([0.0, 0.25, 1.0, -1.0, 5.0, math.nan, math.inf]),
)
DATA = st.one_of(SCALARS, ARRAYS, st.lists(st.lists(st.floats(-2, 2), max_size=3), max_size=3))

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
FEW = settings(FUZZ, max_examples=25)


def _check(call, arg, expected_name=None):
    """Runs ``call``; an error must be a ValueError / TypeError naming ``arg``."""
    name = expected_name or arg
    try:
        call()
    except (ValueError, TypeError) as e:
        assert re.search(rf"\b{re.escape(name)}\b", str(e)), f"{type(e).__name__} does not name `{name}`: {e}"


# -- constructors: every argument of the class and its tfbnn bases ----------------------

def _init_arguments(cls):
    """Named ``__init__`` arguments of ``cls`` and of its bases up to the Keras / object base."""
    names = []
    for klass in cls.__mro__:
        if klass in (keras.layers.Layer, keras.callbacks.Callback, keras.metrics.Metric, object):
            break
        if "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in names:
                names.append(p.name)
    return [n for n in names if n not in ("name", "dtype")]


_LAYER_REQUIRED = {"units": 3, "num_classes": 3, "filters": 2, "kernel_size": 3, "rate": 0.5, "num_components": 2, "input_dim": 6,
                   "output_dim": 3}


@keras.saving.register_keras_serializable(package="tests_fuzz")
def _normal(t):
    """A registered distribution function for DistributionLambdaHead."""
    return tfp.distributions.Normal(t, 1.0)

CONSTRUCTORS = list(dict.fromkeys([
    *(getattr(tfbnn.layers, name) for name in tfbnn.layers.__all__
      if inspect.isclass(getattr(tfbnn.layers, name)) and name not in ("StochasticLayer", "BayesianLayer")),
    priors.Normal, priors.ScaleMixture, priors.Graves,
    posteriors.MeanFieldNormal, posteriors.LowRankNormal, posteriors.FullCovarianceNormal, posteriors.NormalPrior,
    posteriors.TrainableNormalPrior,
    schedules.Constant, schedules.Linear, schedules.WarmUp, schedules.Cosine, schedules.Cyclic,
    tfbnn.KLAnnealing, tfbnn.SparsityMonitor,
    tfbnn.ExpectedCalibrationError, tfbnn.NegativeLogLikelihood, tfbnn.BrierScore,
    calibration.TemperatureScaling, tfbnn.GaussianHead,
    tfbnn.evidential.EvidentialRegressionHead, tfbnn.evidential.DirichletHead,
    tfbnn.evidential.EvidentialClassificationLoss, tfbnn.evidential.EvidentialAnnealing,
    tfbnn.likelihoods.QuantileHead, tfbnn.likelihoods.PinballLoss,
]))
# The flow layers have one base Gaussian: they refuse the node layers' `num_components`.
_FLOW_REQUIRED = {k: v for k, v in _LAYER_REQUIRED.items() if k != "num_components"}
REQUIRED = {**{cls: _LAYER_REQUIRED for cls in CONSTRUCTORS}, tfbnn.KLAnnealing: {"num_examples": 10},
            tfbnn.layers.NodeDenseFlow: _FLOW_REQUIRED, tfbnn.layers.NodeConv2DFlow: _FLOW_REQUIRED,
            tfbnn.DistributionLambdaHead: {"make_distribution": _normal},
            # The wrapper's own arguments are fuzzed around a valid layer.
            tfbnn.layers.SpectralNormalization: {"layer": keras.layers.Dense(3)}}
CASES = [(cls, arg) for cls in CONSTRUCTORS for arg in _init_arguments(cls)]


def test_every_constructor_is_fuzzed():
    fuzzed = {cls.__name__ for cls, _ in CASES}
    layers = {n for n in tfbnn.layers.__all__ if inspect.isclass(getattr(tfbnn.layers, n))}
    no_arguments = {n for n in layers if not _init_arguments(getattr(tfbnn.layers, n))}  # e.g. CategoricalHead
    assert no_arguments <= {"BernoulliHead", "CategoricalHead"}
    assert layers - {"StochasticLayer", "BayesianLayer"} - no_arguments <= fuzzed
    assert len(CASES) > 150


@FUZZ
@given(case=st.sampled_from(CASES), value=SCALARS)
def test_constructors(case, value):
    cls, arg = case
    required = {k: v for k, v in REQUIRED.get(cls, {}).items() if k in _init_arguments(cls)}
    _check(lambda: cls(**{**required, arg: value}), arg)


# -- functions --------------------------------------------------------------------------

def _classifier():
    model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, activation="softmax", seed=1)])
    model(np.zeros((1, 4), "float32"))
    return model


_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        _MODEL = _classifier()
    return _MODEL


PROBS = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
LABELS = np.array([0, 1])
X = np.zeros((2, 4), "float32")

# name -> (function, valid arguments, arguments fuzzed with DATA, {argument: name its errors use})
FUNCTIONS = {
    "priors.get": (priors.get, {"identifier": "normal"}, (), {"identifier": "prior"}),
    "priors.serialize": (priors.serialize, {"prior": priors.Normal()}, (), {}),
    "schedules.get": (schedules.get, {"identifier": "linear"}, (), {"identifier": "schedule"}),
    "expected_calibration_error": (metrics.expected_calibration_error,
                                   {"probs": PROBS, "labels": LABELS, "num_bins": 5}, ("probs", "labels"), {}),
    "negative_log_likelihood": (metrics.negative_log_likelihood, {"probs": PROBS, "labels": LABELS},
                                ("probs", "labels"), {}),
    "brier_score": (metrics.brier_score, {"probs": PROBS, "labels": LABELS}, ("probs", "labels"), {}),
    "accuracy": (metrics.accuracy, {"probs": PROBS, "labels": LABELS}, ("probs", "labels"), {}),
    "reliability_diagram": (metrics.reliability_diagram, {"probs": PROBS, "labels": LABELS, "num_bins": 5},
                            ("probs", "labels"), {}),
    "selective_prediction": (metrics.selective_prediction, {"probs": PROBS, "labels": LABELS, "uncertainty": None},
                             ("probs", "labels", "uncertainty"), {}),
    "logits_from_probs": (calibration.logits_from_probs, {"probs": PROBS, "min_prob": 1e-12}, ("probs",), {}),
    "gaussian_nll": (tfbnn.gaussian_nll, {"y_true": np.zeros((2, 1)), "y_pred": np.ones((2, 2))},
                     ("y_true", "y_pred"), {}),
    "split_gaussian": (tfbnn.likelihoods.split_gaussian, {"outputs": np.ones((2, 2))}, ("outputs",), {}),
    "set_kl_weight": (lambda model, value: tfbnn.set_kl_weight(model, value),
                      {"model": "classifier", "value": 0.1}, (), {}),
    "set_inference_mode": (lambda model, mode: tfbnn.set_inference_mode(model, mode),
                           {"model": "classifier", "mode": "sample"}, (), {}),
    "weight_samples": (lambda model, num_samples: tfbnn.weight_samples(model, num_samples).__enter__(),
                       {"model": "classifier", "num_samples": 2}, (), {}),
    "bayesian_layers": (lambda model: tfbnn.bayesian_layers(model), {"model": "classifier"}, (), {}),
    "kl_divergence": (lambda model: tfbnn.kl_divergence(model), {"model": "classifier"}, (), {}),
}


def _resolve(kwargs):
    return {k: _model() if isinstance(v, str) and v == "classifier" else v for k, v in kwargs.items()}


FUNCTION_CASES = [(name, arg) for name in sorted(FUNCTIONS) for arg in sorted(FUNCTIONS[name][1])]


@FUZZ
@given(case=st.sampled_from(FUNCTION_CASES), scalar=SCALARS, array=DATA)
def test_functions(case, scalar, array):
    name, arg = case
    fn, valid, data_args, message_names = FUNCTIONS[name]
    value = array if arg in data_args else scalar
    kwargs = {**_resolve(valid), arg: value}
    try:
        _check(lambda: fn(**kwargs), arg, message_names.get(arg))
    finally:
        for layer in tfbnn.stochastic_layers(_model()):  # weight_samples left open above
            layer.set_weight_samples(1, joint=True)
            layer.inference_mode = "sample"


PREDICT_ARGS = {"model": None, "x": X, "num_samples": 2, "batch_size": None, "return_samples": False,
                "task": "auto", "from_logits": False, "gaussian_head": None, "mc_dropout": False, "joint": False,
                "head": None}


@FEW
@given(data=st.data())
def test_predict(data):
    arg = data.draw(st.sampled_from(sorted(PREDICT_ARGS)), label="argument")
    value = data.draw(DATA if arg == "x" else SCALARS, label="value")
    if arg in ("num_samples", "batch_size") and isinstance(value, int) and value > 40:
        value = 40  # valid, and cheap
    kwargs = {**PREDICT_ARGS, "model": _model(), arg: value}
    _check(lambda: tfbnn.predict(**kwargs), arg)


BUILD_ARGS = {"name": "mlp", "method": "bbb", "hidden_units": (4,), "num_classes": 3, "input_shape": (4,),
              "num_examples": 10, "seed": 0}


@FEW
@given(data=st.data())
def test_models_build(data):
    arg = data.draw(st.sampled_from(sorted(BUILD_ARGS)), label="argument")
    value = data.draw(SCALARS, label="value")
    if isinstance(value, (list, tuple)) and arg in ("input_shape", "hidden_units"):
        value = tuple(min(v, 8) for v in value)  # valid shapes stay small
    if arg == "num_classes" and isinstance(value, int) and value > 40:
        value = 40  # valid, and cheap
    if arg == "num_examples" and isinstance(value, int) and value > 2**63:
        value = 2**63  # models/methods.py computes 1 / N in Python: an OverflowError beyond 1e308 (left to its owner)
    kwargs = {**BUILD_ARGS, arg: value}
    name = kwargs.pop("name")
    _check(lambda: tfbnn.models.build(name, **kwargs), arg, {"name": "model"}.get(arg))


# -- the newer entry points (issue 36): conformal sets, moments, OOD scores, corruptions, calibration ----------

from tfbnn import conformal, evaluation, moments  # noqa: E402
from tfbnn.datasets import corruptions  # noqa: E402


def _fitted(make, *fit_args):
    return make().fit(*fit_args)


def _prediction():
    return tfbnn.inference.summarize_classification(np.stack([PROBS, PROBS[:, ::-1]]), keep_samples=True)


MEAN, Y, STD = np.array([0.0, 1.0, 2.0]), np.array([0.5, 1.0, 1.5]), np.ones(3)
CAL_PROBS = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [0.6, 0.3, 0.1]])
CAL_LABELS = np.array([0, 1, 2, 1])
SETS = np.array([[True, False, False], [True, True, False]])
IMAGES = np.full((2, 8, 8, 1), 0.5, "float32")


def _split_regressor(groups=None):
    return _fitted(lambda: conformal.SplitConformalRegressor(0.2, "normalized"), MEAN, Y, STD, groups)


def _quantile_regressor():
    return _fitted(lambda: conformal.ConformalizedQuantileRegressor(0.2), MEAN - 1, MEAN + 1, Y)


def _mean_model(x_train, y_train):
    """A fit_predict of the jackknife+: predicts the training mean."""
    return lambda x: np.full(len(x), float(np.mean(y_train)))


def _classifier_sets():
    return _fitted(lambda: conformal.ConformalClassifier(0.2, "aps"), CAL_PROBS, CAL_LABELS)


# name -> (function, valid arguments, arguments fuzzed with DATA, {argument: name its errors use},
#          {argument: the largest valid number tried (bigger valid sizes cost real work)})
NEW_FUNCTIONS = {
    "conformal_quantile": (conformal.conformal_quantile, {"scores": Y, "alpha": 0.2}, ("scores",), {}, {}),
    "SplitConformalRegressor": (conformal.SplitConformalRegressor, {"alpha": 0.1, "score": "absolute"}, (), {}, {}),
    "SplitConformalRegressor.fit": (lambda mean, y, std, groups: conformal.SplitConformalRegressor(
        0.2, "normalized").fit(mean, y, std, groups), {"mean": MEAN, "y": Y, "std": STD, "groups": np.array([0, 1, 0])},
        ("mean", "y", "std", "groups"), {}, {}),
    "SplitConformalRegressor.predict": (lambda mean, std: _split_regressor().predict(mean, std),
                                        {"mean": MEAN, "std": STD}, ("mean", "std"), {}, {}),
    "SplitConformalRegressor.predict (groups)": (
        lambda mean, groups: _split_regressor(groups=np.array([0, 1, 1])).predict(mean, STD, groups=groups),
        {"mean": MEAN, "groups": np.array([1, 0, 1])}, ("mean", "groups"), {}, {}),
    "ConformalizedQuantileRegressor": (conformal.ConformalizedQuantileRegressor, {"alpha": 0.1}, (), {}, {}),
    "ConformalizedQuantileRegressor.fit": (lambda lower, upper, y: conformal.ConformalizedQuantileRegressor(0.2).fit(
        lower, upper, y), {"lower": MEAN - 1, "upper": MEAN + 1, "y": Y}, ("lower", "upper", "y"), {}, {}),
    "ConformalizedQuantileRegressor.predict": (lambda lower, upper: _quantile_regressor().predict(lower, upper),
                                               {"lower": MEAN - 1, "upper": MEAN + 1}, ("lower", "upper"), {}, {}),
    "ConformalClassifier": (conformal.ConformalClassifier, {"alpha": 0.1, "score": "raps", "lam": 0.01, "k_reg": 1,
                                                            "randomized": True, "allow_empty": False, "seed": 3,
                                                            "class_conditional": True},
                            (), {}, {}),
    "ConformalClassifier.fit": (lambda probs, labels: conformal.ConformalClassifier(0.2, class_conditional=True).fit(
        probs, labels),
                                {"probs": CAL_PROBS, "labels": CAL_LABELS}, ("probs", "labels"), {}, {}),
    "ConformalClassifier.predict": (lambda probs: _classifier_sets().predict(probs), {"probs": PROBS}, ("probs",),
                                    {}, {}),
    "AdaptiveConformal": (conformal.AdaptiveConformal, {"predictor": "split_regressor", "gamma": 0.01}, (), {}, {}),
    "AdaptiveConformal.run": (lambda prediction, y: conformal.AdaptiveConformal(_classifier_sets()).run(prediction, y),
                              {"prediction": CAL_PROBS, "y": CAL_LABELS}, ("prediction", "y"), {}, {}),
    "JackknifePlusRegressor": (conformal.JackknifePlusRegressor, {"alpha": 0.2, "folds": 2, "seed": 1}, (), {},
                               {"folds": 3}),
    "JackknifePlusRegressor.fit": (lambda x, y: conformal.JackknifePlusRegressor(0.2, folds=2).fit(x, y, _mean_model),
                                   {"x": np.zeros((3, 4)), "y": Y}, ("y",), {}, {}),
    "JackknifePlusRegressor.predict": (lambda x: conformal.JackknifePlusRegressor(0.2, folds=2).fit(
        np.zeros((3, 4)), Y, _mean_model).predict(x), {"x": X}, (), {}, {}),
    "coverage (sets)": (conformal.coverage, {"y": LABELS, "lower_or_sets": SETS}, ("y", "lower_or_sets"), {}, {}),
    "coverage (intervals)": (conformal.coverage, {"y": Y, "lower_or_sets": MEAN - 1, "upper": MEAN + 1},
                             ("y", "lower_or_sets", "upper"), {}, {}),
    "set_sizes": (conformal.set_sizes, {"sets": SETS}, ("sets",), {}, {}),
    "relu_moments": (moments.relu_moments, {"mean": MEAN, "variance": STD}, ("mean", "variance"), {}, {}),
    "probit_softmax": (moments.probit_softmax, {"mean": PROBS, "variance": PROBS, "axis": -1}, ("mean", "variance"),
                       {}, {}),
    "probit_sigmoid": (moments.probit_sigmoid, {"mean": MEAN, "variance": STD}, ("mean", "variance"), {}, {}),
    "gaussian_expectation": (moments.gaussian_expectation, {"fn": np.tanh, "mean": MEAN, "variance": STD, "points": 8},
                             ("mean", "variance"), {}, {"points": 64}),
    "propagate": (lambda model, inputs: moments.propagate(model, inputs), {"model": "classifier", "inputs": X},
                  ("inputs",), {}, {}),
    "propagate (full)": (lambda model, inputs, covariance: moments.propagate(model, inputs, covariance),
                         {"model": "classifier", "inputs": X, "covariance": "full"}, ("inputs",), {}, {}),
    "bivariate_normal_cdf": (moments.bivariate_normal_cdf, {"h": MEAN, "k": Y, "rho": np.array([0.2, -0.9, 1.0])},
                             ("h", "k", "rho"), {}, {}),
    "relu_covariance": (moments.relu_covariance, {"mean": MEAN[None], "covariance": np.diag(STD)[None]},
                        ("mean", "covariance"), {}, {}),
    "model_layers": (moments.model_layers, {"model": "classifier"}, (), {}, {}),
    "random_feature_gp_moments": (moments.random_feature_gp_moments, {"layer": "gp", "mean": X, "variance": X},
                                  ("mean", "variance"), {}, {}),
    "ood_scores": (evaluation.ood_scores, {"prediction": "prediction", "logits": np.log(PROBS), "temperature": 1.0,
                                           "log_density": np.zeros(2), "gp_variance": np.ones(2)},
                   ("logits", "log_density", "gp_variance"), {}, {}),
    "ood_detection": (evaluation.ood_detection, {"in_scores": {"msp": [0.1, 0.2]}, "out_scores": {"msp": [0.3, 0.4]},
                                                 "tpr": 0.95}, ("in_scores", "out_scores"), {}, {}),
    "auroc": (metrics.auroc, {"in_scores": MEAN, "out_scores": Y}, ("in_scores", "out_scores"), {}, {}),
    "aupr": (metrics.aupr, {"in_scores": MEAN, "out_scores": Y}, ("in_scores", "out_scores"), {}, {}),
    "fpr_at_tpr": (metrics.fpr_at_tpr, {"in_scores": MEAN, "out_scores": Y, "tpr": 0.95}, ("in_scores", "out_scores"),
                   {}, {}),
    "scale_prediction": (calibration.scale_prediction, {"prediction": "prediction", "temperature": 1.5,
                                                        "method": "samples"}, ("prediction",), {}, {}),
    "TemperatureScaling.fit": (lambda logits, labels: calibration.TemperatureScaling(max_iterations=5).fit(
        logits, labels), {"logits": np.log(PROBS), "labels": np.array([1, 1])}, ("logits", "labels"), {}, {}),
    "TemperatureScaling.fit_prediction": (lambda prediction, labels: calibration.TemperatureScaling(
        max_iterations=5).fit_prediction(prediction, labels), {"prediction": "prediction", "labels": np.array([1, 1])},
        ("prediction", "labels"), {}, {}),
    "TemperatureScaling.transform": (lambda logits: calibration.TemperatureScaling(2.0).transform(logits),
                                     {"logits": np.log(PROBS)}, ("logits",), {}, {}),
    "gaussian_noise": (corruptions.gaussian_noise, {"x": X, "gamma": 0.5, "seed": 0}, ("x",), {}, {}),
    "salt_and_pepper": (corruptions.salt_and_pepper, {"x": X, "p": 0.5, "seed": 0, "low": 0.0, "high": 1.0}, ("x",),
                        {}, {}),
    "token_replacement": (corruptions.token_replacement, {"x": np.array([[3, 4, 0]]), "p": 0.5, "seed": 0,
                                                          "vocab_size": 10}, ("x",), {}, {"vocab_size": 2**31}),
    "check_levels": (corruptions.check_levels, {"corruption": "gaussian", "levels": (0.0, 0.5)}, ("levels",), {}, {}),
    "make_rng": (corruptions.make_rng, {"seed": 0}, (), {}, {}),
    "check_image_corruption": (corruptions.check_image_corruption, {"name": "contrast", "severity": 3}, (), {}, {}),
    "corrupt_image": (corruptions.corrupt_image, {"image": IMAGES[0], "name": "gaussian_noise", "severity": 2,
                                                  "seed": [0, 1]}, ("image", "seed"), {}, {}),
    "corruption_transform": (corruptions.corruption_transform, {"name": "impulse_noise", "severity": 1, "seed": 0}, (),
                             {}, {}),
    "corrupt_images": (corruptions.corrupt_images, {"x": IMAGES, "name": "pixelate", "severity": 4, "seed": 0,
                                                    "batch_size": 2}, ("x",), {}, {}),
    "disk_kernel": (corruptions.disk_kernel, {"radius": 1.0, "alias_blur": 0.5}, (), {}, {"radius": 8.0,
                                                                                          "alias_blur": 8.0}),
    "pixelate_size": (corruptions.pixelate_size, {"side": 32, "severity": 2}, (), {}, {"side": 4096}),
}


def _gp():
    """A built random-feature GP layer on the 4 features of ``X``."""
    layer = tfbnn.layers.RandomFeatureGaussianProcess(2, num_inducing=8, seed=0)
    layer.build((None, 4))
    return layer


def _resolve_new(kwargs):
    special = {"classifier": _model, "prediction": _prediction, "gp": _gp, "split_regressor": _split_regressor}
    return {k: special[v]() if isinstance(v, str) and v in special else v for k, v in kwargs.items()}


NEW_FUNCTION_CASES = [(name, arg) for name in sorted(NEW_FUNCTIONS) for arg in sorted(NEW_FUNCTIONS[name][1])]


def _capped(value, cap):
    """``value``, or ``cap`` for a valid number above it (the check of large values is the bound itself)."""
    if cap is None or isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return value
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return value
    return type(value)(cap) if value > cap else value


@FUZZ
@given(case=st.sampled_from(NEW_FUNCTION_CASES), scalar=SCALARS, array=DATA)
def test_new_functions(case, scalar, array):
    name, arg = case
    fn, valid, data_args, message_names, caps = NEW_FUNCTIONS[name]
    value = _capped(array if arg in data_args else scalar, caps.get(arg))
    kwargs = {**_resolve_new(valid), arg: value}
    _check(lambda: fn(**kwargs), arg, message_names.get(arg))


@pytest.mark.parametrize("name", sorted(NEW_FUNCTIONS))
def test_new_functions_accept_their_valid_arguments(name):
    """The table's valid arguments are valid: a fuzz case that fails only reports the fuzzed argument."""
    fn, valid, *_ = NEW_FUNCTIONS[name]
    fn(**_resolve_new(valid))


def test_every_new_entry_point_is_fuzzed():
    fuzzed = {name.split(" ")[0].split(".")[0] for name in NEW_FUNCTIONS}
    for module in (conformal, moments, corruptions):
        public = {n for n in module.__all__ if callable(getattr(module, n))}
        assert public - {"OutputMoments"} <= fuzzed, public - fuzzed
    assert {"ood_scores", "ood_detection", "scale_prediction"} <= fuzzed


@FEW
@given(data=st.data())
def test_predict_moments(data):
    arg = data.draw(st.sampled_from(sorted(PREDICT_ARGS)), label="argument")
    value = data.draw(DATA if arg == "x" else SCALARS, label="value")
    if arg in ("num_samples", "batch_size") and isinstance(value, int) and value > 40:
        value = 40
    kwargs = {**PREDICT_ARGS, "model": _model(), arg: value, "method": "moments"}
    _check(lambda: tfbnn.predict(**kwargs), arg)
