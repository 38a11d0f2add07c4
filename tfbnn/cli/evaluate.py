"""``tfbnn evaluate``: Monte Carlo metrics, calibration and shift curves of a saved model."""

import os

from tfbnn import datasets, training
from tfbnn import methods as registry
from tfbnn._internal import argtypes, files
from tfbnn._internal.errors import RunError
from tfbnn.datasets.catalog import CLASSIFICATION_DATASETS

CONFORMAL_SCORES = ("lac", "aps", "raps")  # tfbnn.conformal.CLASSIFICATION_SCORES (this module loads no NumPy)
EPISTEMIC_SCORES = registry.EPISTEMIC_SCORES

__all__ = ["DESCRIPTION", "add_arguments", "run", "load_model", "SHIFT_GAMMA"]

SHIFT_GAMMA = 0.5  # x' = (1 - gamma) x + gamma * eps, eps ~ N(0, 1)


DESCRIPTION = (
    "Load a saved .keras classifier, run Monte Carlo prediction on a dataset's test split and\n"
    "write metrics.json (accuracy, NLL, Brier, ECE, accuracy-coverage area, total /\n"
    "aleatoric / epistemic uncertainty on clean and Gaussian-shifted inputs, a shift sweep)\n"
    "next to PNG figures: reliability diagram, entropy histograms, accuracy-coverage and\n"
    "uncertainty-versus-shift curves. The clean and shifted numbers are rows of the sweep\n"
    "(the same noise draws). Use the dataset and --seed the model was trained with, so the\n"
    "test split is the held-out one. Dense and convolutional models both work: the images\n"
    "are given in the shape the model expects.\n"
    "\n"
    "Temperature scaling of the Monte Carlo predictive, softmax(log p_bar / T) (Guo et al. 2017):\n"
    "--temperature T applies a known T (e.g. the one `tfbnn train` fitted, in its results.json);\n"
    "--fit-temperature fits T on the validation hold-out of the training split (--validation-fraction\n"
    "and --seed as in training, so that the model never saw those examples). The tempered numbers\n"
    "are printed beside the raw ones and stored under temperature_scaled in metrics.json.\n"
    "\n"
    "Conformal prediction sets (split conformal; Angelopoulos & Bates 2023): --conformalize ALPHA\n"
    "calibrates on the same validation hold-out (--validation-fraction, --seed) and builds LAC (default),\n"
    "APS or RAPS sets (--conformal-score) that hold the true class with probability >= 1 - ALPHA on\n"
    "exchangeable data (APS and RAPS randomized, seeded by --seed, as in Romano et al. 2020: coverage\n"
    "1 - ALPHA on both sides; --conformal-nonrandomized for the rule without the uniform); their empirical coverage and mean set size on the clean and shifted test inputs\n"
    "are printed and stored under conformal in metrics.json (the shifted inputs are not exchangeable with\n"
    "the calibration data: the guarantee does not cover them)."
)
EPILOG = (
    "examples:\n"
    "  tfbnn evaluate saved_models/bbb_mlp_digits.keras --fit-temperature\n"
    "  tfbnn evaluate saved_models/bbb_mlp_digits.keras --temperature 0.9\n"
    "  tfbnn evaluate saved_models/bbb_mlp_digits.keras --conformalize 0.1 --conformal-score aps"
)


def add_arguments(parser):
    """The options of ``tfbnn evaluate``."""
    parser.add_argument("model", type=argtypes.existing_model, help="a .keras file (e.g. from tfbnn train)")
    parser.add_argument("--dataset", choices=CLASSIFICATION_DATASETS, default="digits",
                        help="dataset whose test split is evaluated")
    parser.add_argument("--seed", type=argtypes.non_negative_int, default=0,
                        help="seed of the data split and the shift noise")
    parser.add_argument("--num-samples", type=argtypes.samples_or_auto, default=50, metavar="T",
                        help="Monte Carlo samples per example (per member of a deep ensemble), or 'auto': add "
                        "samples in chunks until the Monte Carlo standard error of each example's predictive "
                        "mean is below --tolerance")
    parser.add_argument("--tolerance", type=argtypes.positive_float, default=None, metavar="SE",
                        help="--num-samples auto: the target standard error of the predicted probabilities "
                        "(default 0.01)")
    parser.add_argument("--max-samples", type=argtypes.positive_int, default=None, metavar="T",
                        help="--num-samples auto: the most samples per example (default 1000)")
    parser.add_argument("--num-bins", type=argtypes.positive_int, default=15, help="ECE bins")
    parser.add_argument("--max-examples", type=argtypes.positive_int, default=None,
                        help="cap on the test examples")
    scaling = parser.add_mutually_exclusive_group()
    scaling.add_argument("--temperature", type=argtypes.positive_float, default=None, metavar="T",
                         help="also evaluate the predictive tempered by this T")
    scaling.add_argument("--fit-temperature", action="store_true",
                         help="fit T on the validation hold-out (minimum NLL) and evaluate the tempered predictive")
    parser.add_argument("--validation-fraction", type=argtypes.rate, default=0.15, metavar="F",
                        help="with --fit-temperature or --conformalize: the hold-out fraction the model was trained "
                        "with (tfbnn train's default)")
    parser.add_argument("--conformalize", type=argtypes.open_unit_interval, default=None, metavar="ALPHA",
                        help="build conformal prediction sets of miscoverage ALPHA in (0, 1), calibrated on the "
                        "validation hold-out; report their coverage and mean size")
    parser.add_argument("--conformal-score", choices=CONFORMAL_SCORES, default=None,
                        help="with --conformalize: the conformity score (default lac)")
    parser.add_argument("--conformal-nonrandomized", action="store_true",
                        help="with --conformal-score aps or raps: the sets without the tie-breaking uniform "
                        "(coverage at least 1 - ALPHA, larger sets)")
    parser.add_argument("--epistemic", choices=("auto",) + EPISTEMIC_SCORES, default="auto",
                        help="the epistemic score of the shift detection: auto (default) reads it off the model: "
                        "gp_variance with an SNGP GP layer, evidential (K / S) ending in a Dirichlet head, "
                        "mutual_information with stochastic layers or members, none otherwise; density: DDU's "
                        "-log feature density, fitted on the dataset's training split (--seed)")
    parser.add_argument("--output-dir", default=None, metavar="DIR",
                        help="where the JSON and PNGs go; default: MODEL without .keras + '_evaluation/'")


def load_model(path):
    """A saved ``.keras`` model (tfbnn's layers registered); a file Keras cannot load is a bad argument: a
    ``ValueError`` naming ``model`` (the command's exit status 2; for a file that is no zip archive, Keras'
    own message says "File not found")."""
    import zipfile

    import keras

    import tfbnn.ensembles  # noqa: F401  (DeepEnsemble)
    import tfbnn.layers  # noqa: F401  (registers the tfbnn layers for deserialization)
    import tfbnn.models  # noqa: F401  (the zoo's own layers)
    import tfbnn.schedules  # noqa: F401  (the learning-rate schedule of compiled recipe models)

    if not zipfile.is_zipfile(path):
        raise ValueError(f"Expected a readable .keras model (a zip archive). Received: model={path}, which is not a "
                         "zip archive")
    try:
        return keras.saving.load_model(path)
    except Exception as e:  # a corrupt or foreign file: a bad argument, one line, not a traceback
        raise ValueError(f"Expected a readable .keras model ({argtypes.one_line(e)}). Received: model={path}") from e


def _splits(args, model):
    """The data in the shape the model takes (flattened for dense models, images for conv):
    ``(name, (x_test, y_test), (x_val, y_val) or None)``."""
    from tfbnn.ensembles import DeepEnsemble

    shape = tuple((model.members[0] if isinstance(model, DeepEnsemble) else model).inputs[0].shape[1:])
    held_out = args.fit_temperature or args.conformalize is not None
    fraction = args.validation_fraction if held_out else 0.0
    if held_out and not fraction:
        flag = "--fit-temperature fits T" if args.fit_temperature else "--conformalize calibrates the sets"
        raise ValueError(f"{flag} on the validation hold-out. Received: --validation-fraction=0")
    try:
        data = datasets.load_pipeline(args.dataset, batch_size=1024, validation_fraction=fraction,
                                      standardize=args.dataset in datasets.CIFAR_DATASETS, flatten=len(shape) == 1,
                                      seed=args.seed, max_test_examples=args.max_examples)
    except RuntimeError as e:
        raise RunError(str(e)) from e
    if tuple(data.input_shape) != shape:
        raise ValueError(f"the model expects inputs of shape {shape}, the dataset has {tuple(data.input_shape)}. "
                         f"Received: --dataset={args.dataset}")
    validation = training.arrays(data.validation) if data.validation is not None else None
    return data.name, training.arrays(data.test), validation, data


def _num_samples(args):
    """``num_samples`` for :func:`tfbnn.predict`: ``--num-samples T``, or for ``auto`` an
    :class:`tfbnn.inference.AdaptiveSampling` of ``--tolerance`` and ``--max-samples``."""
    from tfbnn.inference import AdaptiveSampling

    options = {name: getattr(args, name) for name in ("tolerance", "max_samples")}
    given = {name: value for name, value in options.items() if value is not None}
    if args.num_samples == "auto":
        return AdaptiveSampling(**given)
    if given:
        name, value = next(iter(given.items()))
        raise ValueError(f"`{name}` applies to num_samples='auto' (adaptive sampling). "
                         f"Received: num_samples={args.num_samples!r}, {name}={value!r}")
    return args.num_samples


def _validation_prediction(model, validation, num_samples):
    """The Monte Carlo predictive on the validation hold-out, or None without one."""
    from tfbnn import inference

    if validation is None:
        return None
    return inference.predict(model, validation[0], num_samples=num_samples, task="classification")


def _temperature(args, validation, prediction):
    """The :class:`tfbnn.TemperatureScaling` to apply, or None."""
    from tfbnn import calibration

    if args.temperature is not None:
        return calibration.TemperatureScaling(temperature=args.temperature)
    if not args.fit_temperature:
        return None
    return calibration.TemperatureScaling().fit_prediction(prediction, validation[1])


def _conformal_numbers(alpha, score, calibration, labels, result, y_test, randomized=True, seed=0):
    """Split-conformal sets calibrated on ``calibration`` (a ClassificationPrediction) with ``labels``, applied to
    ``result``'s clean and shifted predictives: ``alpha``, ``score``, ``randomized``, ``num_calibration``,
    ``quantile`` and, per part, ``coverage`` and ``mean_set_size``."""
    from tfbnn import conformal

    sets = conformal.ConformalClassifier(alpha=alpha, score=score, randomized=randomized, seed=seed).fit(
        calibration, labels)
    parts = {}
    for part in ("clean", "shifted"):
        membership = sets.predict(getattr(result, part))
        parts[part] = {"coverage": conformal.coverage(y_test, membership),
                       "mean_set_size": float(conformal.set_sizes(membership).mean())}
    return {"alpha": alpha, "score": score, "randomized": randomized and score != "lac", "num_calibration": sets.num_calibration, "quantile": sets.quantile,
            **parts}


def _conformal_rows(numbers):
    c = numbers["conformal"]
    rule = c["score"].upper() + (", randomized" if c.get("randomized") else "")
    rows = [(f"conformal sets ({rule}, alpha={c['alpha']:g}, n={c['num_calibration']})", "clean",
             f"shifted (gamma={SHIFT_GAMMA:g})")]
    return rows + [(label, f"{c['clean'][key]:.4f}", f"{c['shifted'][key]:.4f}")
                   for key, label in (("coverage", f"coverage (target >= {1 - c['alpha']:g})"),
                                      ("mean_set_size", "mean set size"))]


def _metric_rows(title, part, keys, num_bins):
    """Rows ``(label, clean, shifted)`` of ``part`` (a dict with ``clean`` and ``shifted``)."""
    labels = {"accuracy": "accuracy", "nll": "NLL", "brier": "Brier score", "ece": f"ECE ({num_bins} bins)",
              "predictive_entropy": "total uncertainty", "aleatoric": "aleatoric", "epistemic": "epistemic",
              "mean_samples_used": "samples per example (mean)"}
    rows = [(title, "clean", f"shifted (gamma={SHIFT_GAMMA:g})")]
    return rows + [(labels[k], f"{part['clean'][k]:.4f}", f"{part['shifted'][k]:.4f}") for k in keys]


def _detection_rows(numbers, labels):
    rows = [("shift detection (AUROC)", "raw")]
    d = numbers["shift_detection"]
    scaled = numbers.get("temperature_scaled")
    if scaled:
        rows[0] += ("temperature-scaled",)
    own = f"epistemic ({labels[d['epistemic_score']]})"
    for key, label in (("auroc_entropy", "predictive entropy"), ("auroc_epistemic", own)):
        cells = [d[key]] + ([scaled["shift_detection"][key]] if scaled else [])
        rows.append((label, *("n/a" if v is None else f"{v:.4f}" for v in cells)))
    return rows


def run(args):
    """``tfbnn evaluate``: returns the exit status."""
    from tfbnn.evaluation import EPISTEMIC_LABELS, epistemic_score_of, evaluate_classifier, write_report

    if args.conformal_score is not None and args.conformalize is None:
        raise ValueError("--conformal-score chooses the score of --conformalize's sets. Received: "
                         f"--conformal-score={args.conformal_score} without --conformalize")
    if args.conformal_nonrandomized and args.conformal_score not in ("aps", "raps"):
        raise ValueError("--conformal-nonrandomized applies to the randomized APS and RAPS sets. Received: "
                         f"--conformal-nonrandomized with --conformal-score={args.conformal_score}")
    folder = args.output_dir or args.model[: -len(".keras")] + "_evaluation"
    num_samples = _num_samples(args)
    model = load_model(args.model)
    name, (x_test, y_test), validation, data = _splits(args, model)
    held_out = _validation_prediction(model, validation, num_samples)
    epistemic = epistemic_score_of(model) if args.epistemic == "auto" else args.epistemic
    density = None
    if epistemic == "density":  # DDU's class-conditional Gaussians of the features, fitted on the training split
        from tfbnn import ddu

        density = ddu.DDU(model).fit(*training.arrays(data.train))
    result = evaluate_classifier(model, x_test, y_test, num_samples=num_samples, num_bins=args.num_bins,
                                 shift_gamma=SHIFT_GAMMA, seed=args.seed,
                                 temperature=_temperature(args, validation, held_out), epistemic=epistemic,
                                 density=density)
    if args.conformalize is not None:
        result.numbers["conformal"] = _conformal_numbers(args.conformalize, args.conformal_score or "lac", held_out,
                                                        validation[1], result, y_test,
                                                        randomized=not args.conformal_nonrandomized, seed=args.seed)
    paths = write_report(result, folder, name=os.path.basename(args.model))
    adaptive = ("mean_samples_used",) if "mean_samples_used" in result.numbers["clean"] else ()
    blocks = [_metric_rows("metric", result.numbers, ("accuracy", "nll", "brier", "ece", "predictive_entropy",
                                                      "aleatoric", "epistemic", *adaptive), args.num_bins)]
    scaled = result.numbers.get("temperature_scaled")
    if scaled:
        blocks.append(_metric_rows(f"temperature-scaled (temperature {scaled['temperature']:.4g})", scaled,
                                   ("nll", "brier", "ece", "predictive_entropy"), args.num_bins))
    blocks.append(_detection_rows(result.numbers, EPISTEMIC_LABELS))
    if "conformal" in result.numbers:
        blocks.append(_conformal_rows(result.numbers))
    sweep = [("Gaussian shift gamma", "accuracy", "total", "aleatoric", "epistemic")]
    sweep += [(f"{r['level']:g}", f"{r['accuracy']:.4f}", f"{r['predictive_entropy']:.4f}",
               f"{r['expected_entropy']:.4f}", f"{r['mutual_information']:.4f}") for r in result.sweep]
    print(files.format_table(f"Evaluation of {args.model} on {name} ({len(y_test)} test examples, "
                          f"T = {args.num_samples}"
                          + (f", tolerance {num_samples.tolerance:g})" if args.num_samples == "auto" else ")"),
                          [*blocks, [("accuracy-coverage area", f"{result.numbers['selective_area']:.4f}")], sweep]))
    print(f"\nWrote {len(paths)} files to {folder}/: " + ", ".join(os.path.basename(p) for p in paths))
    return 0
