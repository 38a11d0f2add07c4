"""The shift benchmark: every method under image corruptions and out-of-distribution inputs.

The protocol of Ovadia et al. (2019, "Can you trust your model's uncertainty?") and of the
uncertainty-baselines tables, on the offline 8x8 digits by default (``--dataset``: also
mnist and fashion_mnist, 28x28x1, and the RGB cifar10 and cifar100, 32x32x3, through tensorflow-datasets where
present, :func:`tfbnn.datasets.load_images`; every method's MLP flattens the images, the corruptions act on
every channel):

* train on the classes ``0 .. in_classes - 1`` (default 8: digits 0-7), the same MLP and data for
  every method, with a clean calibration split (``--calibration-fraction``) held out;
* evaluate on the clean test images of those classes and on the same images under each
  corruption of :data:`tfbnn.datasets.corruptions.IMAGE_CORRUPTIONS` (Hendrycks & Dietterich
  2019) at severities 1-5: accuracy, NLL, ECE;
* out-of-distribution AUROC (predictive entropy as the score) against the test images of the
  held-out classes and against synthetic inputs (uniform noise, constant images); for the
  methods with their own score also by that score (SNGP: the GP posterior variance, Liu et al.
  2020 eq. 9; DDU: ``-log q(z)``, Mukhoti et al. 2023 eq. 2; evidential: ``u = K / S``, Sensoy
  et al. 2018);
* conformal prediction sets (randomized APS, :class:`tfbnn.conformal.ConformalClassifier` calibrated on
  the clean calibration split at ``1 - alpha``): their coverage and size under shift; and the
  long-run coverage of adaptive conformal inference (:class:`tfbnn.conformal.AdaptiveConformal`,
  Gibbs & Candes 2021, step ``--aci-gamma``) on the corrupted test images as one stream of
  growing severity (every corruption at severity 1, then 2, ..., 5), beside split conformal's.

The methods are a table (``tfbnn.experiments._shift_benchmark.METHODS``, name -> label and
``fit(context) -> predict``): ``deterministic``, ``mc_dropout``, ``bbb``, ``vd``, ``ibnn``,
``ensemble``, ``laplace`` (last-layer KFAC of the deterministic network), ``swag``, and the
single-pass ones: ``dvi`` (the ``bbb`` network predicted by moment propagation,
:mod:`tfbnn.moments`), ``sngp`` (:mod:`tfbnn.sngp`, ``--num-inducing`` random features),
``ddu`` (:mod:`tfbnn.ddu` on a softmax MLP with spectrally normalized layers), ``evidential``
(a :class:`tfbnn.evidential.DirichletHead`) and ``heteroscedastic``
(:class:`tfbnn.layers.HeteroscedasticSoftmax`). A new method is one entry there;
``--methods`` then accepts its name.

Outputs (``--output-dir``, default ``saved_models/experiments/shift_benchmark/``):
``table.csv`` / ``table.json`` / ``table.md`` (rows: method; columns: clean accuracy / NLL /
ECE, mean corrupted accuracy / NLL / ECE, OOD AUROCs by entropy and by the own score, coverage clean, corrupted
and corrupted with ACI), ``by_corruption.csv``
(method x corruption x severity), ``by_severity.csv`` (means over the corruptions),
``accuracy_vs_severity.png``, ``ece_vs_severity.png`` and ``predictions.npz`` (every
method's probabilities on every set, with the labels, and the own scores as ``score|<method>|<set>``).
``--quick`` is a smoke run of a few seconds (few epochs, small subsets).

Run: ``tfbnn shift-benchmark`` or ``python -m tfbnn.experiments.shift_benchmark``.

References:
    Ovadia, Fertig, Ren, Nado, Sculley, Nowozin, Dillon, Lakshminarayanan, Snoek. Can You
    Trust Your Model's Uncertainty? Evaluating Predictive Uncertainty Under Dataset Shift.
    NeurIPS 2019.
    Hendrycks, Dietterich. Benchmarking Neural Network Robustness to Common Corruptions and
    Perturbations. ICLR 2019.
    Nado et al. Uncertainty Baselines: Benchmarks for Uncertainty & Robustness in Deep
    Learning. arXiv:2106.04015, 2021.
    Liu et al. Simple and Principled Uncertainty Estimation with Deterministic Deep Learning
    via Distance Awareness (SNGP). NeurIPS 2020.
    Mukhoti, Kirsch, van Amersfoort, Torr, Gal. Deep Deterministic Uncertainty: A New Simple
    Baseline (DDU). CVPR 2023.
    Sensoy, Kaplan, Kandemir. Evidential Deep Learning to Quantify Classification Uncertainty.
    NeurIPS 2018.
    Collier, Mustafa, Kokiopoulou, Jenatton, Berent. Correlated Input-Dependent Label Noise in
    Large-Scale Image Classification. CVPR 2021.
    Wu, Nowozin, Meeds, Turner, Hernandez-Lobato, Gaunt. Deterministic Variational Inference
    for Robust Bayesian Neural Networks (DVI). ICLR 2019.
"""

from tfbnn import training
from tfbnn.datasets.catalog import CATALOG, IMAGE_DATASETS
from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDY", "DEFAULTS", "base_recipe", "DEFAULT_METHODS", "run_experiment", "add_arguments", "run", "main"]

#: The methods the benchmark runs by default (the names of ``_shift_benchmark.METHODS``).
DEFAULT_METHODS = ("deterministic", "mc_dropout", "bbb", "vd", "ibnn", "ensemble", "laplace", "swag", "dvi", "sngp",
                   "ddu", "evidential", "heteroscedastic")
_CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "motion_blur", "zoom_blur",
                "contrast", "brightness", "pixelate", "jpeg_compression")
#: A quick run's corruptions (those asked among them): one noise, one blur, one digital.
_QUICK_CORRUPTIONS = ("gaussian_noise", "defocus_blur", "contrast")
#: A quick run's caps on the training / test images read from tensorflow-datasets (unless smaller ones are asked).
_QUICK_READ = (2000, 1000)

SETTINGS = (
    Setting("dataset", "digits", "digits: offline; mnist / fashion_mnist (grey) and cifar10 / cifar100 (RGB): "
                                 "tensorflow-datasets", choices=IMAGE_DATASETS),
    Setting("methods", DEFAULT_METHODS, "methods to benchmark (names of _shift_benchmark.METHODS)", kind="name",
            many=True, unique=True, metavar="NAME"),
    Setting("corruptions", _CORRUPTIONS, "image corruptions, each at severities 1-5", choices=_CORRUPTIONS,
            many=True, unique=True, metavar="NAME"),
    Setting("in_classes", 8, "classes 0..K-1 are in distribution; the rest are the OOD classes",
            kind="positive_int", metavar="K"),
    Setting("hidden_units", 64), Setting("depth", 2), Setting("epochs", 40), Setting("batch_size", 32),
    Setting("learning_rate", 3e-3), Setting("dropout_rate", 0.2), Setting("members", 5),
    Setting("num_inducing", 1024, "SNGP's random features", kind="positive_int"),
    Setting("num_samples", 32, "Monte Carlo samples of the predictive"),
    Setting("calibration_fraction", 0.2, "fraction of the training images held out to calibrate the conformal sets",
            kind="open_unit"),
    Setting("alpha", 0.1, "conformal miscoverage: sets of 1 - alpha coverage", kind="open_unit"),
    Setting("aci_gamma", 0.005, "step size of adaptive conformal inference on the corrupted stream (Gibbs & Candes "
            "2021)", kind="positive_float"),
    Setting("ece_bins", 15, "bins of the ECE", kind="positive_int"),
    Setting("max_examples", None), Setting("max_test_examples", None), Setting("seed", 0),
    Setting("quick", False, "a smoke run: 4 epochs of 16 units on 256 images, 48 test images, 2 members, 4 samples, "
                             "128 random features, 3 corruptions; a tensorflow-datasets set read up to "
                             f"{_QUICK_READ[0]} / {_QUICK_READ[1]} images"),
)

DESCRIPTION = (
    "Benchmark every method under covariate shift: train on some classes, then accuracy, NLL and ECE\n"
    "under ten image corruptions at severities 1-5, OOD AUROC against held-out classes and synthetic\n"
    "inputs, conformal coverage and set size under shift. Table (CSV/JSON/MD), plots and predictions.\n"
    "Offline digits by default; --dataset mnist, fashion_mnist, cifar10 or cifar100 (tensorflow-datasets)."
)


def _validate(s):
    """Known method names; ``in_classes`` below the dataset's classes; a quick run's caps."""
    from tfbnn.experiments import _shift_benchmark

    unknown = [m for m in s["methods"] if m not in _shift_benchmark.METHODS]
    if unknown:
        raise ValueError(f"Unknown methods. Expected names from {list(_shift_benchmark.METHODS)}. "
                         f"Received: methods={list(s['methods'])}")
    if s["in_classes"] < 2:
        raise ValueError(f"Expected `in_classes` >= 2. Received: in_classes={s['in_classes']}")
    num_classes = CATALOG[s["dataset"]][2]
    if s["in_classes"] >= num_classes:
        raise ValueError(f"Expected `in_classes` below the {num_classes} classes of {s['dataset']} (the others are "
                         f"the out-of-distribution ones). Received: in_classes={s['in_classes']}")
    if s["quick"]:
        kept = tuple(c for c in s["corruptions"] if c in _QUICK_CORRUPTIONS) or s["corruptions"][:1]
        s.update(epochs=min(s["epochs"], 4), hidden_units=min(s["hidden_units"], 16), depth=1,
                 members=min(s["members"], 2), num_samples=min(s["num_samples"], 4), corruptions=kept,
                 num_inducing=min(s["num_inducing"], 128))
        if s["dataset"] != "digits":  # read no more of a tensorflow-datasets set than a smoke run uses
            s.update({key: min(s[key] or cap, cap) for key, cap in zip(("max_examples", "max_test_examples"),
                                                                       _QUICK_READ)})
    return s


def base_recipe(s):
    """The :class:`tfbnn.training.Recipe` every trained method runs, its ``method`` replaced: the MLP
    (``hidden_units`` x ``depth`` ReLU), Adam, a linear KL ramp to beta = 1 over the first half."""
    return training.Recipe(
        name="shift-benchmark", description="the shift benchmark", reference="Ovadia et al. 2019", model="mlp",
        model_options={"hidden_units": (s["hidden_units"],) * s["depth"], "seed": s["seed"]},
        dataset=s["dataset"], optimizer="adam", learning_rate=s["learning_rate"], epochs=s["epochs"],
        batch_size=s["batch_size"], kl_schedule="linear", eval_samples=s["num_samples"], seed=s["seed"])


def train(s, output_dir, verbose):
    """Loads the data, corrupts the test set, trains every method and predicts every set."""
    from tfbnn.experiments import _shift_benchmark

    data = _shift_benchmark.load(s)
    if verbose:
        print(f"{len(data['x_train'])} training, {len(data['x_cal'])} calibration, {len(data['x_test'])} test and "
              f"{len(data['x_ood'])} held-out-class images", flush=True)
    sets = _shift_benchmark.evaluation_sets(data, s, verbose)
    return (data, *_shift_benchmark.predict_all(s, data, sets, output_dir, verbose))


def analyse(results, s, output_dir, verbose):
    """The table, the per-corruption and per-severity numbers, the plots and the probabilities.

    Returns:
        ``{"table": [...one dict per method...], "markdown": str, "files": [...]}``.
    """
    from tfbnn.experiments import _shift_benchmark

    data, predictions, scores = results
    table, text, files = _shift_benchmark.write(predictions, data["y_test"], data["y_cal"], s, output_dir, scores)
    if verbose:
        print("\n" + text, flush=True)
    return {"table": table, "markdown": text, "files": files}


STUDY = Study(
    name="shift-benchmark", module="tfbnn.experiments.shift_benchmark", description=DESCRIPTION,
    settings=SETTINGS, recipes=lambda s: [base_recipe(s)], train=train, analyse=analyse, validate=_validate,
    outputs="the table, the plots and the predictions",
    banner=lambda s: f"shift_benchmark: {', '.join(s['methods'])} on {s['dataset']} under "
                     f"{len(s['corruptions'])} corruptions x 5 severities",
)
#: ``DEFAULTS``: the settings and their defaults; the entry points under the names of every study module.
DEFAULTS, run_experiment, add_arguments, run, main = STUDY.entry_points()

if __name__ == "__main__":
    raise SystemExit(main())
