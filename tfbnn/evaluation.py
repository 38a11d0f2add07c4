"""Evaluate a classifier's predictive uncertainty: metrics, shift, plots, JSON.

:func:`evaluate_classifier` computes, from T Monte Carlo samples per example,
accuracy, NLL, Brier score, ECE (15 equal-width bins), the area under the
accuracy-coverage curve, and the total / aleatoric / epistemic uncertainty on clean
inputs and on Gaussian-shifted inputs ``x' = (1 - gamma) x + gamma eps``, plus a
sweep over shift intensities (:func:`shift_sweep`). The clean and shifted numbers
are rows of that same sweep (one stream of corruption noise), so they agree with
its table. :func:`write_report` saves the figures next to a JSON of the numbers.
The ``tfbnn evaluate`` command and :func:`tfbnn.training.run` use both.

Shift detection: how well an uncertainty score tells the shifted inputs from the
clean ones, as the AUROC (:func:`tfbnn.metrics.auroc`, 0.5 = chance) of the
predictive entropy (total) and of the method's own epistemic score
(:func:`epistemic_scores`, one of :data:`tfbnn.methods.EPISTEMIC_SCORES`): the mutual
information of a Monte Carlo method, SNGP's GP variance, DDU's negative log feature
density, the evidential vacuity ``K / S``. A single-pass method has no mutual information
(0 everywhere); its own score is what flags a shift, and a method with none (a
deterministic network: ``"none"``) has no epistemic AUROC (None, "n/a" in the reports).

With a ``temperature`` (fitted on held-out data by
:meth:`tfbnn.TemperatureScaling.fit_prediction`), the same numbers are computed
for the tempered predictive (:func:`tfbnn.calibration.scale_prediction`) too.
"""

import collections.abc
import dataclasses
import os

import numpy as np

from tfbnn import calibration, ensembles, evidential, inference, likelihoods, metrics, methods, plots, sngp
from tfbnn._internal import checks, deprecation, files
from tfbnn._internal.files import markdown_table  # public here: results tables for reports and notebooks
from tfbnn.datasets import corruptions
from tfbnn.utils import bayesian_layers, posterior_mean, stochastic_layers

__all__ = ["Evaluation", "evaluate_classifier", "shift_detection", "shift_sweep", "write_report", "markdown_table",
           "OOD_SCORES", "ood_scores", "ood_detection", "EPISTEMIC_LABELS", "epistemic_scores", "epistemic_score_of"]

#: The out-of-distribution scores :func:`ood_scores` computes (higher: more likely out of distribution).
OOD_SCORES = ("msp", "max_logit", "energy", "predictive_entropy", "mutual_information", "variation_ratio",
              "ddu_density", "sngp_variance")

#: The name in reports of each method's own epistemic score (:data:`tfbnn.methods.EPISTEMIC_SCORES`).
EPISTEMIC_LABELS = {"mutual_information": "mutual information", "gp_variance": "GP variance",
                    "density": "-log feature density", "evidential": "u = K / S", "none": "none"}


@dataclasses.dataclass
class Evaluation:
    """Numbers (``numbers``, JSON-able) and what the figures need."""

    numbers: dict
    labels: np.ndarray
    clean: object
    shifted: object
    sweep: list


def _summary(res, labels, num_bins):
    adaptive = {} if res.standard_error is None else {"mean_samples_used": float(np.mean(res.samples_used))}
    return {
        **adaptive,
        "accuracy": metrics.accuracy(res.mean_probs, labels),
        "nll": metrics.negative_log_likelihood(res.mean_probs, labels),
        "brier": metrics.brier_score(res.mean_probs, labels),
        "ece": metrics.expected_calibration_error(res.mean_probs, labels, num_bins),
        "confidence": float(np.mean(res.confidence)),
        "predictive_entropy": float(np.mean(res.predictive_entropy)),
        "aleatoric": float(np.mean(res.expected_entropy)),
        "epistemic": float(np.mean(res.mutual_information)),
    }


def _own(score, prediction, values):
    """The own epistemic scores of one set: the prediction's mutual information, ``values``, or None."""
    if score == "mutual_information":
        return np.asarray(prediction.mutual_information, np.float64)
    return None if score == "none" else values


def shift_detection(clean, shifted, epistemic="mutual_information", clean_scores=None, shifted_scores=None):
    """AUROC of telling ``shifted`` from ``clean`` predictions by their uncertainty.

    Args:
        clean, shifted: :class:`tfbnn.ClassificationPrediction` of the clean and the
            shifted inputs.
        epistemic: the method's own epistemic score, one of :data:`tfbnn.methods.EPISTEMIC_SCORES`.
            Default ``"mutual_information"`` (read from the predictions).
        clean_scores, shifted_scores: ``(n,)`` own scores of the clean and shifted inputs
            (:func:`epistemic_scores`), for a score other than ``"mutual_information"`` and ``"none"``.

    Returns:
        ``{"auroc_entropy": ..., "auroc_epistemic": ..., "epistemic_score": epistemic}``:
        :func:`tfbnn.metrics.auroc` of the predictive entropy and of the own epistemic score
        (None for ``"none"``: the method has no epistemic uncertainty to detect a shift with).
    """
    own = (_own(epistemic, clean, clean_scores), _own(epistemic, shifted, shifted_scores))
    if epistemic not in ("mutual_information", "none") and (own[0] is None or own[1] is None):
        raise ValueError(f"Expected `clean_scores` and `shifted_scores` for epistemic={epistemic!r}. Received: None")
    return {
        "auroc_entropy": metrics.auroc(clean.predictive_entropy, shifted.predictive_entropy),
        "auroc_epistemic": None if own[0] is None else metrics.auroc(*own),
        "epistemic_score": epistemic,
    }


def _numbers(clean, shifted, labels, num_bins, epistemic="mutual_information", scores=(None, None)):
    numbers = {"clean": _summary(clean, labels, num_bins), "shifted": _summary(shifted, labels, num_bins),
               "shift_detection": shift_detection(clean, shifted, epistemic, *scores)}
    for part, prediction, values in (("clean", clean, scores[0]), ("shifted", shifted, scores[1])):
        own = _own(epistemic, prediction, values)
        numbers[part]["epistemic_own"] = None if own is None else float(np.mean(own))
    return numbers


def epistemic_score_of(model):
    """The epistemic score (:data:`tfbnn.methods.EPISTEMIC_SCORES`) a trained classifier shows by its layers:
    ``"gp_variance"`` with an SNGP GP layer, ``"evidential"`` ending in a :class:`tfbnn.evidential.DirichletHead`,
    ``"mutual_information"`` with stochastic layers or several members, otherwise ``"none"``. A DDU network
    is a plain softmax network to look at: its ``"density"`` needs to be asked for.

    Example:
        >>> import tfbnn
        >>> tfbnn.evaluation.epistemic_score_of(tfbnn.models.mlp("sngp", hidden_units=(4,), input_shape=(2,)))
        'gp_variance'
    """
    if sngp.gp_layers(model):
        return "gp_variance"
    if isinstance(likelihoods.output_layer(model), evidential.DirichletHead):
        return "evidential"
    if isinstance(model, ensembles.DeepEnsemble) or stochastic_layers(model):
        return "mutual_information"
    return "none"


def epistemic_scores(model, x, epistemic, prediction=None, density=None, batch_size=256):
    """A method's own epistemic score of each input, higher for inputs less like the training data.

    ==========================  ===================================================================
    ``epistemic``               the score
    ==========================  ===================================================================
    ``"mutual_information"``    ``H[p_bar] - mean_t H[p_t]`` of ``prediction`` (Depeweg et al. 2018)
    ``"gp_variance"``           SNGP's GP posterior variance (:func:`tfbnn.sngp.predictive_variance`;
                                Liu et al. 2020, eq. 9), :func:`ood_scores`' ``sngp_variance``
    ``"density"``               ``-log q(f(x))`` of a fitted :class:`tfbnn.ddu.DDU` ``density``
                                (Mukhoti et al. 2023, eq. 2), :func:`ood_scores`' ``ddu_density``
    ``"evidential"``            ``u = K / S`` of the model's Dirichlet ``alpha`` (Sensoy et al. 2018)
    ``"none"``                  None: the method has no epistemic score
    ==========================  ===================================================================

    Args:
        model: the trained classifier.
        x: ``(n, ...)`` inputs.
        epistemic: one of :data:`tfbnn.methods.EPISTEMIC_SCORES`.
        prediction: the :class:`tfbnn.ClassificationPrediction` of ``x`` (``tfbnn.predict``); needed for
            ``"mutual_information"``, computed with one sample when None otherwise.
        density: a fitted :class:`tfbnn.ddu.DDU` of ``model``, for ``"density"``.
        batch_size: int, the forward passes' batch. Default 256.

    Returns:
        ``(n,)`` float64 scores, or None for ``"none"``.

    Example:
        >>> import numpy as np, tfbnn
        >>> model = tfbnn.models.mlp("evidential", hidden_units=(4,), input_shape=(2,), num_classes=3, seed=0)
        >>> u = tfbnn.evaluation.epistemic_scores(model, np.zeros((2, 2), "float32"), "evidential")
        >>> u.shape, bool(np.all((u > 0) & (u <= 1)))
        ((2,), True)
    """
    if epistemic not in methods.EPISTEMIC_SCORES:
        raise ValueError(f"Expected `epistemic` in {list(methods.EPISTEMIC_SCORES)}. Received: epistemic={epistemic!r}")
    if epistemic == "none":
        return None
    if epistemic == "evidential":
        head, x = _dirichlet_head(model), np.asarray(x)  # eager batches: no predict graph to trace
        return np.concatenate([np.asarray(head.uncertainty(model(x[i:i + batch_size], training=False)), np.float64)
                               for i in range(0, len(x), batch_size)])
    if prediction is None:
        if epistemic == "mutual_information":
            raise ValueError("Expected the `prediction` of `x` for epistemic='mutual_information'. Received: None")
        prediction = inference.predict(model, x, num_samples=1, batch_size=batch_size, task="classification")
    if epistemic == "mutual_information":
        return ood_scores(prediction)["mutual_information"]
    if epistemic == "gp_variance":
        return ood_scores(prediction, gp_variance=sngp.predictive_variance(model, x, batch_size=batch_size))[
            "sngp_variance"]
    if density is None or not hasattr(density, "log_density"):
        raise ValueError(f"Expected a fitted tfbnn.ddu.DDU as `density` for epistemic='density'. "
                         f"Received: density={density!r}")
    return ood_scores(prediction, log_density=density.log_density(x))["ddu_density"]


def _dirichlet_head(model):
    head = likelihoods.output_layer(model)
    if not isinstance(head, evidential.DirichletHead):
        raise ValueError("Expected a model ending in a tfbnn.evidential.DirichletHead for epistemic='evidential'. "
                         f"Received: a model ending in {type(head).__name__}")
    return head


# Until the next release evaluate_classifier and shift_sweep also take tolerance= and max_samples=
# (with num_samples="auto"), as they did before num_samples took an AdaptiveSampling.
_ADAPTIVE_KEYWORDS = deprecation.keywords_moved("num_samples", inference.AdaptiveSampling,
                                                "tfbnn.inference.AdaptiveSampling", when="auto",
                                                names=("tolerance", "max_samples"))


@_ADAPTIVE_KEYWORDS
def evaluate_classifier(model, x, y, num_samples=50, num_bins=15, shift_gamma=0.5,
                        sweep_levels=(0.0, 0.25, 0.5, 0.75, 1.0), seed=0, batch_size=256, temperature=None,
                        corruption="gaussian", epistemic="mutual_information", density=None):
    """Monte Carlo evaluation of a classifier on clean and shifted inputs.

    Args:
        model: a Keras classifier with softmax outputs (tfbnn layers sample; a model
            with no Bayesian layer gives zero epistemic uncertainty).
        x: ``(N, ...)`` inputs; y: ``(N,)`` integer labels.
        num_samples: int, T, or a :class:`tfbnn.inference.AdaptiveSampling` (or
            ``"auto"``, its defaults): adaptive sampling, see
            :func:`tfbnn.inference.predict`; the summaries then add
            ``mean_samples_used``, and ``numbers`` the ``tolerance``.
        num_bins: int, ECE bins (default 15).
        shift_gamma: float in [0, 1], the shift of the clean-vs-shifted comparison.
        sweep_levels: Gaussian-shift intensities of the sweep (empty: no sweep).
        seed: int, seed of the shift noise.
        batch_size: examples per vectorized call.
        temperature: None, a float ``T > 0`` or a :class:`tfbnn.TemperatureScaling`
            (its ``temperature`` and ``method``; a float means ``method="pooled"``):
            also evaluate the tempered predictive.
        corruption: the shift, a name of :data:`tfbnn.datasets.corruptions.CORRUPTIONS`:
            ``"gaussian"`` (default; ``shift_gamma`` its intensity) or, for token ids,
            ``"token_replacement"`` (``shift_gamma`` the replaced fraction).
        epistemic: the method's own epistemic score (:data:`tfbnn.methods.EPISTEMIC_SCORES`,
            :func:`epistemic_scores`): the ``auroc_epistemic`` of ``shift_detection`` and the
            ``epistemic_own`` means. Default ``"mutual_information"``; :func:`epistemic_score_of`
            reads it off the model's layers.
        density: a fitted :class:`tfbnn.ddu.DDU` of ``model`` for ``epistemic="density"``.

    Returns:
        An :class:`Evaluation`; ``numbers`` holds ``clean`` and ``shifted`` dicts
        (accuracy, nll, brier, ece, confidence (the mean top probability),
        predictive_entropy, aleatoric, epistemic (the mutual information), epistemic_own (the
        mean own epistemic score, None for ``"none"``)), ``shift_detection``
        (:func:`shift_detection`), ``selective_area``, ``posterior_mean_accuracy`` and
        ``posterior_mean_ece`` (Bayesian models), the ``sweep`` rows, and with a
        ``temperature`` ``temperature_scaled``: ``temperature``, ``method`` and the
        tempered ``clean``, ``shifted`` and ``shift_detection``.
    """
    scaling = _scaling(temperature)
    labels = np.asarray(y)
    sweep_levels = tuple(sweep_levels or ())
    levels = tuple(sorted({0.0, float(shift_gamma), *map(float, sweep_levels)}))
    if epistemic == "density" and density is None:
        raise ValueError("Expected a fitted tfbnn.ddu.DDU as `density` for epistemic='density'. Received: None")
    kept = {0.0, float(shift_gamma)}

    def own(level, inputs, prediction):  # the own score of the two compared sets
        if level in kept and epistemic not in ("mutual_information", "none"):
            return epistemic_scores(model, inputs, epistemic, prediction, density, batch_size)
        return None

    rows, predictions, scores = _sweep(model, x, labels, corruption, levels, num_samples, seed, batch_size,
                                       return_samples=scaling is not None and scaling.method == "samples", score=own)
    at = (levels.index(0.0), levels.index(float(shift_gamma)))
    clean, shifted = predictions[at[0]], predictions[at[1]]
    own_scores = (scores[at[0]], scores[at[1]])
    sweep = [row for row in rows if row["level"] in set(map(float, sweep_levels))]
    numbers = {
        "num_examples": int(len(labels)),
        **_sampling_numbers(num_samples),
        "num_bins": int(num_bins),
        "shift_gamma": float(shift_gamma),
        **_numbers(clean, shifted, labels, num_bins, epistemic, own_scores),
        "selective_area": metrics.selective_prediction(clean.mean_probs, labels, clean.predictive_entropy).area,
        "sweep": sweep,
    }
    if bayesian_layers(model):
        with posterior_mean(model):
            mean_probs = model.predict(x, batch_size=batch_size, verbose=0)
        numbers["posterior_mean_accuracy"] = metrics.accuracy(mean_probs, labels)
        numbers["posterior_mean_ece"] = metrics.expected_calibration_error(mean_probs, labels, num_bins)
    if scaling is not None:
        numbers["temperature_scaled"] = {
            "temperature": scaling.temperature, "method": scaling.method,
            **_numbers(scaling.transform_prediction(clean), scaling.transform_prediction(shifted), labels, num_bins,
                       epistemic, own_scores),
        }
    return Evaluation(numbers=numbers, labels=labels, clean=clean, shifted=shifted, sweep=sweep)


def ood_scores(prediction, logits=None, temperature=1.0, log_density=None, gp_variance=None):
    """Out-of-distribution scores of a classifier's predictive, each higher for inputs less like the training data.

    From a :class:`tfbnn.ClassificationPrediction` (``tfbnn.predict``) with Monte Carlo
    samples ``p_t`` and predictive ``p_bar = mean_t p_t``:

    * ``msp``: ``1 - max_c p_bar_c``, one minus the maximum softmax probability (Hendrycks &
      Gimpel 2017);
    * ``predictive_entropy``: ``H[p_bar]`` (total uncertainty);
    * ``mutual_information``: ``H[p_bar] - mean_t H[p_t]`` (epistemic; Depeweg et al. 2018);
    * ``variation_ratio``: ``1 - f / T`` with ``f`` the number of samples voting for the most
      voted class (Freeman 1965; Gal 2016, sec. 3.3.1), when the prediction kept its samples;

    and from the logits ``f(x)`` of a (deterministic or posterior-mean) forward pass, when given:

    * ``max_logit``: ``-max_c f_c(x)`` (Hendrycks et al. 2022);
    * ``energy``: ``-T log sum_c exp(f_c(x) / T)`` (Liu et al. 2020, eq. 6, T = ``temperature``);

    and from single-pass models, when given:

    * ``ddu_density``: ``-log q(f(x))``, the negative log feature density of DDU
      (:meth:`tfbnn.ddu.DDU.log_density`; Mukhoti et al. 2023, eq. 2);
    * ``sngp_variance``: the GP posterior variance ``diag(Phi Sigma Phi^T)`` of SNGP
      (:func:`tfbnn.sngp.predictive_variance`; Liu et al. 2020, eq. 9).

    Args:
        prediction: a :class:`tfbnn.ClassificationPrediction`.
        logits: ``(B, C)`` logits of the same inputs, or None.
        temperature: float > 0, the energy's T. Default 1.
        log_density: ``(B,)`` DDU log densities of the same inputs, or None.
        gp_variance: ``(B,)`` SNGP posterior variances of the same inputs, or None.

    Returns:
        dict of score name -> ``(B,)`` float64 array (the names of :data:`OOD_SCORES` that apply).

    Example:
        >>> import numpy as np
        >>> from tfbnn import evaluation
        >>> from tfbnn.inference import ClassificationPrediction
        >>> p = np.array([[0.9, 0.1], [0.5, 0.5]])
        >>> res = ClassificationPrediction(p, None, None, None, samples=np.stack([p, p[:, ::-1]]), num_samples=2)
        >>> scores = evaluation.ood_scores(res, logits=np.log(p))
        >>> [round(float(v), 3) for v in scores["msp"]], [abs(round(float(v), 3)) for v in scores["energy"]]
        ([0.1, 0.5], [0.0, 0.0])
    """
    probs = checks.finite_array("prediction.mean_probs", getattr(prediction, "mean_probs", None), np.float64)
    if probs.ndim != 2:
        raise ValueError("Expected `prediction` to be a ClassificationPrediction (mean_probs of shape (B, C)). "
                         f"Received: mean_probs of shape {probs.shape}")
    scores = {"msp": 1.0 - probs.max(axis=1), "predictive_entropy": inference.entropy(probs)}
    if prediction.mutual_information is not None:
        scores["mutual_information"] = np.asarray(prediction.mutual_information, np.float64)
    samples = getattr(prediction, "samples", None)
    if samples is not None:
        votes = np.argmax(np.asarray(samples), axis=-1)  # (T, B)
        counts = np.stack([np.sum(votes == c, axis=0) for c in range(probs.shape[1])], axis=1)
        scores["variation_ratio"] = 1.0 - counts.max(axis=1) / votes.shape[0]
    if logits is not None:
        f = checks.finite_array("logits", logits, np.float64)
        if f.shape != probs.shape:
            raise ValueError(f"Expected `logits` of shape {probs.shape}, as the prediction's probabilities. "
                             f"Received: logits.shape={f.shape}")
        t = checks.number("temperature", temperature, low=0, low_open=True)
        top = f.max(axis=1)
        scores["max_logit"] = -top
        scores["energy"] = -(t * np.log(np.sum(np.exp((f - top[:, None]) / t), axis=1)) + top)
    for name, values, sign in (("ddu_density", log_density, -1.0), ("sngp_variance", gp_variance, 1.0)):
        if values is not None:
            arg = "log_density" if name == "ddu_density" else "gp_variance"
            v = checks.finite_array(arg, values, np.float64)
            if v.shape != probs.shape[:1]:
                raise ValueError(f"Expected `{arg}` of shape {probs.shape[:1]}, one value per input. "
                                 f"Received: {arg}.shape={v.shape}")
            scores[name] = sign * v
    return scores


def ood_detection(in_scores, out_scores, tpr=0.95):
    """How well each score separates out-of-distribution inputs from in-distribution ones.

    Args:
        in_scores: non-empty dict of score name -> ``(n_in,)`` scores of the in-distribution
            inputs (:func:`ood_scores` of their prediction); one score array ``a`` goes in as
            ``{"score": a}``.
        out_scores: the same for the out-of-distribution inputs (same names).
        tpr: float in (0, 1], the detection rate of the false-positive rate. Default 0.95.

    Returns:
        dict of score name -> ``{"auroc", "aupr", "fpr_at_95_tpr"}`` (the last key named after
        ``tpr``): :func:`tfbnn.metrics.auroc`, :func:`tfbnn.metrics.aupr` and
        :func:`tfbnn.metrics.fpr_at_tpr`, the OOD inputs as positives.

    Example:
        >>> from tfbnn import evaluation
        >>> evaluation.ood_detection({"msp": [0.1, 0.2]}, {"msp": [0.3, 0.15]})["msp"]["auroc"]
        0.75
    """
    for name, scores in (("in_scores", in_scores), ("out_scores", out_scores)):
        if not isinstance(scores, collections.abc.Mapping) or not scores:
            raise ValueError(f"Expected `{name}` to be a dict of score name -> (n,) scores, as ood_scores returns "
                             f"(for one score array a: {{'score': a}}). Received: {name} of type {type(scores).__name__}"
                             + (" (empty)" if isinstance(scores, collections.abc.Mapping) else ""))
    tpr = checks.number("tpr", tpr, low=0, high=1, low_open=True, what="a true-positive rate in (0, 1]")
    missing = sorted(set(in_scores) ^ set(out_scores), key=str)
    if missing:
        raise ValueError(f"Expected the same score names in `in_scores` and `out_scores`. Received: {missing} "
                         "in one only")
    key = f"fpr_at_{round(100 * tpr):d}_tpr"
    return {name: {"auroc": metrics.auroc(in_scores[name], out_scores[name]),
                   "aupr": metrics.aupr(in_scores[name], out_scores[name]),
                   key: metrics.fpr_at_tpr(in_scores[name], out_scores[name], tpr)}
            for name in in_scores}


def _sampling_numbers(num_samples):
    """``num_samples`` (``"auto"`` when adaptive) and, when adaptive, the ``tolerance``, for the JSON."""
    if isinstance(num_samples, str) and num_samples == "auto":
        num_samples = inference.AdaptiveSampling()
    if isinstance(num_samples, inference.AdaptiveSampling):
        return {"num_samples": "auto", "tolerance": num_samples.tolerance}
    return {"num_samples": int(num_samples)}


def _scaling(temperature):
    if temperature is None or isinstance(temperature, calibration.TemperatureScaling):
        return temperature
    return calibration.TemperatureScaling(temperature=temperature)


def write_report(evaluation, folder, name="model"):
    """Writes ``metrics.json`` and the PNG figures into ``folder``; returns the paths."""
    os.makedirs(folder, exist_ok=True)
    e = evaluation
    figures = {
        "reliability.png": plots.reliability_diagram(e.clean.mean_probs, e.labels, e.numbers["num_bins"],
                                                     title=f"Reliability: {name}"),
        "entropy_histogram.png": plots.entropy_histograms(
            e.clean.predictive_entropy, e.shifted.predictive_entropy,
            labels=("clean", f"shifted (gamma={e.numbers['shift_gamma']:g})")),
        "epistemic_histogram.png": plots.entropy_histograms(
            e.clean.mutual_information, e.shifted.mutual_information,
            labels=("clean", f"shifted (gamma={e.numbers['shift_gamma']:g})"),
            xlabel="mutual information (nats)", title="Epistemic uncertainty in vs out of distribution"),
        "accuracy_coverage.png": plots.accuracy_coverage(
            {name: metrics.selective_prediction(e.clean.mean_probs, e.labels, e.clean.predictive_entropy)}),
    }
    if e.sweep:
        figures["shift.png"] = plots.uncertainty_vs_shift({name: e.sweep}, xlabel="Gaussian shift gamma")
    paths = [plots.save(fig, os.path.join(folder, fname)) for fname, fig in figures.items()]
    json_path = files.write_json(os.path.join(folder, "metrics.json"), e.numbers, indent=2)
    return [json_path] + paths


@_ADAPTIVE_KEYWORDS
def shift_sweep(
    model,
    x,
    y,
    corruption="gaussian",
    levels=None,
    num_samples=30,
    seed=0,
    batch_size=None,
    from_logits=False,
    mc_dropout=False,
    return_predictions=False,
    return_samples=False,
):
    """Accuracy and uncertainty of a classifier under corruptions of growing intensity.

    For each level the test inputs are corrupted (a fresh draw per level from one
    stream seeded by ``seed``) and :func:`tfbnn.inference.predict` summarises T
    samples. Uncertainties are means over the examples, in nats (Depeweg et al.
    2018; Trinh et al. 2022, eq. 26-27).

    Args:
        model: a Keras classifier (softmax outputs, or logits with ``from_logits``).
        x: array ``(N, ...)`` of clean inputs.
        y: ``(N,)`` integer labels or ``(N, C)`` one-hot.
        corruption: ``"gaussian"`` (:func:`gaussian_noise`, level = gamma) or
            ``"salt_and_pepper"`` (:func:`salt_and_pepper`, level = p).
        levels: sequence of intensities in [0, 1]; default
            ``DEFAULT_LEVELS[corruption]``.
        num_samples: int >= 1, T, or a :class:`tfbnn.inference.AdaptiveSampling` (or
            ``"auto"``, its defaults; :func:`tfbnn.inference.predict`). Default 30.
        seed: int or None, seed of the corruption noise.
        batch_size, from_logits, mc_dropout: passed to :func:`tfbnn.inference.predict`.
        return_predictions: bool; also return each level's
            :class:`tfbnn.inference.ClassificationPrediction`.
        return_samples: bool; those predictions keep their ``(T, N, C)`` samples.

    Returns:
        A list with one dict per level: ``level``, ``accuracy``, ``nll``, ``ece``,
        ``predictive_entropy`` (total), ``expected_entropy`` (aleatoric),
        ``mutual_information`` (epistemic). ``pandas.DataFrame(rows)`` tabulates it.
        With ``return_predictions``: ``(rows, predictions)``.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([keras.Input((4,)),
        ...                           tfbnn.layers.DenseFlipout(3, activation="softmax", seed=0)])
        >>> x, y = np.random.default_rng(0).random((20, 4)).astype("float32"), np.zeros(20, int)
        >>> rows = tfbnn.evaluation.shift_sweep(model, x, y, "gaussian", levels=(0.0, 0.5), num_samples=5)
        >>> len(rows), sorted(rows[0])
        (2, ['accuracy', 'ece', 'expected_entropy', 'level', 'mutual_information', 'nll', 'predictive_entropy'])
    """
    levels = corruptions.check_levels(corruption, levels)
    rows, predictions, _ = _sweep(model, x, y, corruption, levels, num_samples, seed, batch_size, from_logits,
                                  mc_dropout, return_samples)
    return (rows, predictions) if return_predictions else rows


def _sweep(model, x, y, corruption, levels, num_samples, seed, batch_size, from_logits=False, mc_dropout=False,
           return_samples=False, score=None):
    """:func:`shift_sweep`'s rows and predictions, and per level ``score(level, inputs, prediction)``
    (None without ``score``) of the corrupted inputs."""
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        raise ValueError(f"Expected numeric inputs `x`. Received: x of dtype {x.dtype}")
    labels = np.asarray(y)
    if labels.shape[0] != x.shape[0]:
        raise ValueError(
            f"Expected `x` and `y` to have the same number of examples. Received: x.shape={x.shape}, y.shape={labels.shape}"
        )
    rng = seed if isinstance(seed, np.random.Generator) else corruptions.make_rng(seed)
    corrupt = corruptions.CORRUPTIONS[corruption]
    rows, predictions, scores = [], [], []
    for level in levels:
        inputs = corrupt(x, level, seed=rng)
        res = inference.predict(
            model,
            inputs,
            num_samples=num_samples,
            batch_size=batch_size,
            task="classification",
            from_logits=from_logits,
            mc_dropout=mc_dropout,
            return_samples=return_samples,
        )
        predictions.append(res)
        scores.append(None if score is None else score(float(level), inputs, res))
        rows.append(
            {
                "level": float(level),
                "accuracy": metrics.accuracy(res.mean_probs, labels),
                "nll": metrics.negative_log_likelihood(res.mean_probs, labels),
                "ece": metrics.expected_calibration_error(res.mean_probs, labels),
                "predictive_entropy": float(np.mean(res.predictive_entropy)),
                "expected_entropy": float(np.mean(res.expected_entropy)),
                "mutual_information": float(np.mean(res.mutual_information)),
                **({} if res.standard_error is None else {"mean_samples_used": float(np.mean(res.samples_used))}),
            }
        )
    return rows, predictions, scores
