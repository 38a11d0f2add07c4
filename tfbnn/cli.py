"""The ``tfbnn`` command-line tool.

Subcommands (one function each; see :data:`SUBCOMMANDS`):

``tfbnn train``
    Trains a Bayes-by-Backprop MLP with KL annealing and saves it as ``.keras``.
    With no arguments it is the project's main job: an MLP on the offline
    ``digits`` dataset (no download), about a minute on two CPU cores, followed
    by a results table (Monte Carlo accuracy and NLL, KL, and predictive entropy
    and mutual information on clean vs. noise-shifted inputs).

Exit status: 0 on success, 2 on a bad option (one ``tfbnn: error: ...`` line on
stderr, no traceback), 1 when the run itself fails (the loss became NaN, a
dataset could not be downloaded); a failed run never replaces a saved model.

Adding a subcommand: write ``add_<name>_parser(subparsers)`` that adds a parser
and sets ``func=<callable(args) -> exit status>`` with ``set_defaults``, and
append it to :data:`SUBCOMMANDS`.
"""

import argparse
import math
import os
import sys
import time

PROG = "tfbnn"

__all__ = ["main", "run_command", "build_parser", "SUBCOMMANDS"]

LAYER_NAMES = ("reparameterization", "flipout", "local_reparameterization")
PRIOR_NAMES = ("normal", "scale_mixture")
SCHEDULE_NAMES = ("constant", "linear", "warmup", "cosine", "cyclic", "blundell")
DATASET_NAMES = ("digits", "moons", "mnist", "fashion_mnist", "cifar10", "cifar100")

SHIFT_GAMMA = 0.5  # x' = (1 - gamma) x + gamma * eps, eps ~ N(0, 1)

# Defaults of `tfbnn train`, tuned so that the bare command (digits) finishes in
# about a minute on 2 CPU cores within a few points of a deterministic MLP.
TRAIN_DEFAULTS = {
    "dataset": "digits",
    "hidden_units": 64,
    "depth": 2,
    "layer": "local_reparameterization",
    "prior": "normal",
    "pi": 0.25,
    "sigma1": 1.0,
    "sigma2": math.exp(-6.0),
    "schedule": "linear",
    "anneal_epochs": None,
    "epochs": 60,
    "batch_size": 32,
    "learning_rate": 3e-3,
    "num_samples": 32,
    "seed": 0,
    "max_examples": None,
    "verbose": None,
    "jit_compile": "auto",
}


class CommandError(Exception):
    """A failure of the run itself (not of its options): exit status 1, one line."""

    exit_status = 1


# -- argument parsing ----------------------------------------------------------


def _one_line(message):
    return " ".join(str(message).split())


class _ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``tfbnn: error: ...`` line (exit 2)."""

    def error(self, message):
        hint = f" (see '{self.prog} --help')"
        self.exit(2, f"{PROG}: error: {_one_line(message)}{hint}\n")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and appends "(default: ...)" to options that have one."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=32, width=min(100, _terminal_width()))

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or action.default in (None, argparse.SUPPRESS, False, True):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


def _terminal_width():
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 100


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _float(text, what):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _positive_float(text):
    value = _float(text, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _open_unit_interval(text):
    value = _float(text, "a number in the open interval (0, 1)")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in the open interval (0, 1), got {text!r}")
    return value


def _keras_path(text):
    if not text.endswith(".keras"):
        raise argparse.ArgumentTypeError(f"expected a file name ending in '.keras', got {text!r}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a file, got the existing folder {text!r}")
    return text


def add_train_parser(subparsers):
    """Registers ``tfbnn train``."""
    d = TRAIN_DEFAULTS
    parser = subparsers.add_parser(
        "train",
        help="train a Bayes-by-Backprop MLP with KL annealing and save it (.keras)",
        formatter_class=_HelpFormatter,
        description=(
            "Train a Bayes-by-Backprop MLP (Blundell et al. 2015) with KL annealing, evaluate its\n"
            "Monte Carlo predictive and save it as a .keras file.\n"
            "\n"
            "The model is a keras.Sequential of tfbnn dense layers: DEPTH hidden layers of\n"
            "HIDDEN_UNITS ReLU units and a softmax output, trained on the per-example negative\n"
            "ELBO  mean NLL + beta * KL(q || p) / N  (N = training examples actually loaded), with\n"
            "beta moved by tfbnn.KLAnnealing following --schedule.\n"
            "\n"
            "With no options this is the main job: the offline 'digits' dataset (scikit-learn's\n"
            "8x8 digits, 1437 train / 360 test, no download), about a minute on 2 CPU cores.\n"
            "\n"
            "After training it prints a results table: test accuracy and NLL of the Monte Carlo\n"
            "predictive (the average of --num-samples sampled predictions), accuracy of the\n"
            "posterior mean, the KL (total and per example, KL/N), and the uncertainty on clean\n"
            "test inputs vs. noise-shifted ones x' = (1 - g) x + g * eps, eps ~ N(0, 1), g = 0.5:\n"
            "mean predictive entropy (total uncertainty) and mean mutual information (epistemic\n"
            "part: predictive entropy minus the mean entropy of the samples), in nats.\n"
            "\n"
            "The model is written to a temporary file next to --output and moved into place only\n"
            "after a successful run: a failed run (e.g. the loss became NaN, which stops training\n"
            "via keras.callbacks.TerminateOnNaN) exits with status 1 and leaves any existing file\n"
            "untouched. Load the result with `import tfbnn; keras.saving.load_model(path)`."
        ),
        epilog=(
            "examples:\n"
            "  tfbnn train\n"
            "  tfbnn train --layer flipout --prior scale_mixture --pi 0.5 --sigma1 1 --sigma2 0.0025\n"
            "  tfbnn train --dataset mnist --hidden-units 400 --epochs 10 --schedule blundell\n"
            "  tfbnn train --epochs 5 --output /tmp/quick.keras"
        ),
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        choices=DATASET_NAMES,
        default=d["dataset"],
        help="digits and moons are offline (bundled with / generated by scikit-learn); mnist and "
        "fashion_mnist come from tensorflow-datasets and download on first use",
    )
    data.add_argument(
        "--max-examples",
        type=_positive_int,
        default=d["max_examples"],
        metavar="N",
        help="use at most N training examples (mnist, fashion_mnist; moons: the number of points "
        "generated before the 80/20 split); N in the ELBO is the count actually loaded",
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--hidden-units", type=_positive_int, default=d["hidden_units"], metavar="UNITS",
        help="units per hidden layer",
    )
    model.add_argument(
        "--depth", type=_positive_int, default=d["depth"], help="number of hidden layers"
    )
    model.add_argument(
        "--layer",
        choices=LAYER_NAMES,
        default=d["layer"],
        help="gradient estimator of the tfbnn dense layers: reparameterization (one weight sample "
        "per step, the textbook BbB), flipout (per-example sign flips, two matmuls), or "
        "local_reparameterization (samples pre-activations: fastest, lowest variance)",
    )
    model.add_argument(
        "--prior",
        choices=PRIOR_NAMES,
        default=d["prior"],
        help="weight prior: normal = N(0, 1) (closed-form KL); scale_mixture = "
        "pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2) (Blundell eq. 7, Monte Carlo KL)",
    )
    model.add_argument(
        "--pi", type=_open_unit_interval, default=d["pi"],
        help="scale mixture: weight of the first component, in (0, 1)",
    )
    model.add_argument(
        "--sigma1", type=_positive_float, default=d["sigma1"],
        help="scale mixture: scale of the first (wide) component, > 0",
    )
    model.add_argument(
        "--sigma2", type=_positive_float, default=d["sigma2"],
        help="scale mixture: scale of the second (narrow) component, > 0 (default: exp(-6) = %(default).4g)",
    )

    training = parser.add_argument_group("training")
    training.add_argument(
        "--schedule",
        choices=SCHEDULE_NAMES,
        default=d["schedule"],
        help="KL weight beta over training (tfbnn.schedules): constant (beta = 1, the plain "
        "ELBO), linear (0 -> 1 over --anneal-epochs), warmup (0 for the first half of "
        "--anneal-epochs, then linear to 1), cosine (half-cosine 0 -> 1 over --anneal-epochs), "
        "cyclic (ramps 0 -> 1 repeating every --anneal-epochs / 2 epochs, Fu et al. 2019), "
        "blundell (per-minibatch weights 2^(M-i) / (2^M - 1), Blundell eq. 9)",
    )
    training.add_argument(
        "--anneal-epochs", type=_positive_float, default=d["anneal_epochs"], metavar="EPOCHS",
        help="length of the KL ramp in (fractional) epochs; default: half of --epochs, so the "
        "second half trains on the full ELBO",
    )
    training.add_argument("--epochs", type=_positive_int, default=d["epochs"], help="training epochs")
    training.add_argument(
        "--batch-size", type=_positive_int, default=d["batch_size"], help="minibatch size"
    )
    training.add_argument(
        "--learning-rate", type=_positive_float, default=d["learning_rate"], metavar="LR",
        help="Adam learning rate",
    )
    training.add_argument(
        "--seed", type=_non_negative_int, default=d["seed"],
        help="seeds everything: the data split, keras.utils.set_random_seed (initialization, "
        "shuffling), every layer's sampling (layer i gets seed + i + 1) and the shift noise",
    )
    training.add_argument(
        "--verbose", type=int, choices=(0, 1, 2), default=d["verbose"],
        help="Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch (default: 1 on "
        "a terminal, 2 when the output is redirected)",
    )
    training.add_argument(
        "--jit-compile",
        choices=("auto", "on", "off"),
        default=d["jit_compile"],
        help="XLA compilation of the train step: auto = on for local_reparameterization with the "
        "normal prior (no weight-sized random draw; XLA helps), off otherwise (XLA makes "
        "weight-sized normal draws very slow on CPU)",
    )
    from tfbnn.distribute import add_strategy_argument

    add_strategy_argument(training)

    evaluation = parser.add_argument_group("evaluation and output")
    evaluation.add_argument(
        "--num-samples", type=_positive_int, default=d["num_samples"], metavar="T",
        help="Monte Carlo samples of the predictive used for the results table",
    )
    evaluation.add_argument(
        "--baseline", action=argparse.BooleanOptionalAction, default=True,
        help="also train the same MLP with keras Dense layers and report its accuracy, NLL, ECE "
        "and Brier score beside the BbB model's (default: on)",
    )
    evaluation.add_argument(
        "--output", type=_keras_path, default=None, metavar="PATH",
        help="where to save the model (must end in .keras); default: "
        "saved_models/bbb_mlp_<dataset>.keras",
    )
    from tfbnn.experiments import cifar_comparison

    cifar_comparison.add_arguments(parser)  # --model / --method: the model-zoo comparison
    parser.set_defaults(func=run_train)
    return parser




def build_parser():
    """The ``tfbnn`` argument parser with every subcommand of :data:`SUBCOMMANDS`."""
    parser = _ArgumentParser(
        prog=PROG,
        formatter_class=_HelpFormatter,
        description=(
            "tfbnn: Bayesian deep learning as Keras 3 layers on TensorFlow Probability.\n"
            "\n"
            "Run `tfbnn <command> --help` for a command's options. `tfbnn train` with no\n"
            "options trains a Bayes-by-Backprop MLP on the offline digits dataset, prints its\n"
            "accuracy, NLL, KL and uncertainty, and saves it under saved_models/."
        ),
        epilog="exit status: 0 success, 1 the run failed (nothing was overwritten), 2 bad options",
    )
    from tfbnn import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    subparsers.required = True
    for add_parser in SUBCOMMANDS:
        add_parser(subparsers)
    return parser


# -- train -----------------------------------------------------------------------


def _make_schedule(name, anneal_epochs):
    from tfbnn import schedules

    if name == "constant":
        return schedules.Constant(1.0)
    if name == "linear":
        return schedules.Linear(epochs=anneal_epochs)
    if name == "warmup":
        return schedules.WarmUp(warmup_epochs=anneal_epochs / 2, epochs=anneal_epochs / 2)
    if name == "cosine":
        return schedules.Cosine(epochs=anneal_epochs)
    if name == "cyclic":
        return schedules.Cyclic(cycle_epochs=anneal_epochs / 2, ratio=0.5)
    if name == "blundell":
        return schedules.Blundell()
    return schedules.get(name)


def _make_prior(args):
    from tfbnn import priors

    if args.prior == "scale_mixture":
        return priors.ScaleMixture(pi=args.pi, sigma1=args.sigma1, sigma2=args.sigma2)
    return priors.get(args.prior)


def build_mlp(input_shape, num_classes, hidden_units, depth, layer, prior, seed, name="bbb_mlp"):
    """The Bayes-by-Backprop MLP that ``tfbnn train`` fits.

    Args:
        input_shape: tuple, the shape of one input, e.g. ``(64,)``.
        num_classes: int, units of the softmax output layer.
        hidden_units: int > 0, units of each hidden ReLU layer.
        depth: int > 0, the number of hidden layers.
        layer: ``"reparameterization"``, ``"flipout"`` or ``"local_reparameterization"``.
        prior: a prior name or :class:`tfbnn.priors.Prior`, for kernels and biases.
        seed: int; layer ``i`` (0-based, output last) gets ``seed + i + 1``.

    Returns:
        An uncompiled ``keras.Sequential`` that outputs softmax probabilities.
    """
    import keras

    from tfbnn import layers as layers_lib

    classes = {
        "reparameterization": layers_lib.DenseReparameterization,
        "flipout": layers_lib.DenseFlipout,
        "local_reparameterization": layers_lib.DenseLocalReparameterization,
    }
    if layer not in classes:
        raise ValueError(f"Unknown layer type. Expected one of {sorted(classes)}. Received: layer={layer!r}")
    cls = classes[layer]
    stack = [keras.Input(shape=tuple(input_shape))]
    for i in range(depth):
        stack.append(
            cls(hidden_units, activation="relu", kernel_prior=prior, bias_prior=prior,
                seed=seed + i + 1, name=f"hidden_{i + 1}")
        )
    stack.append(
        cls(num_classes, activation="softmax", kernel_prior=prior, bias_prior=prior,
            seed=seed + depth + 1, name="output")
    )
    return keras.Sequential(stack, name=name)


def _make_nan_guard():
    """A ``keras.callbacks.TerminateOnNaN`` that remembers where it fired (``.where``)."""
    import keras

    class NaNGuard(keras.callbacks.TerminateOnNaN):
        def __init__(self):
            super().__init__()
            self.epoch = 0
            self.where = None  # (epoch, batch, loss), 1-based

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_batch_end(self, batch, logs=None):
            loss = (logs or {}).get("loss")
            if loss is not None and self.where is None and not math.isfinite(float(loss)):
                self.where = (self.epoch + 1, batch + 1, float(loss))
            super().on_batch_end(batch, logs)

    return NaNGuard()


def format_table(title, sections):
    """Plain aligned text.

    ``sections`` is a list of row lists; a row is ``(label, value, ...)``. Labels
    share one width across sections, values are right-aligned per section, and
    sections are separated by a blank line.
    """
    sections = [[tuple(str(c) for c in row) for row in rows] for rows in sections]
    label_width = max(len(row[0]) for rows in sections for row in rows)
    lines = [title, "-" * len(title)]
    for k, rows in enumerate(sections):
        if k:
            lines.append("")
        ncol = max(len(row) for row in rows)
        widths = [max((len(row[i]) for row in rows if len(row) > i), default=0) for i in range(ncol)]
        for row in rows:
            cells = [row[0].ljust(label_width)] + [c.rjust(widths[i]) for i, c in enumerate(row[1:], 1)]
            lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _prepare_output(path):
    """Makes the output folder; fails early (before training) when it is not writable."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output folder {folder!r}: {e.strerror}. Received: --output={path}") from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"the output folder {folder!r} is not writable. Received: --output={path}")
    return folder


def save_atomically(model, path):
    """Saves ``model`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    A crash or an error while saving leaves an existing ``path`` untouched.

    Raises:
        CommandError: the file could not be written (the message says why).
    """
    import uuid

    folder = os.path.dirname(os.path.abspath(path))
    # A fresh name (not mkstemp, whose 0600 mode the saved file would keep).
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp.keras")
    try:
        model.save(tmp)
        os.replace(tmp, path)
    except OSError as e:
        kept = f"; {path} was left untouched" if os.path.exists(path) else ""
        raise CommandError(f"could not save the model to {path}: {e}{kept}") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _load_data(args):
    from tfbnn import datasets

    kwargs = {"seed": args.seed} if args.dataset in datasets.OFFLINE_DATASETS else {}
    if args.max_examples is not None:
        if args.dataset == "moons":
            kwargs["num_examples"] = args.max_examples
        elif args.dataset == "digits":
            raise ValueError(
                "--max-examples applies to moons, mnist and fashion_mnist, not digits. "
                f"Received: --max-examples={args.max_examples}"
            )
        else:
            kwargs["max_examples"] = args.max_examples
    try:
        return datasets.load(args.dataset, **kwargs)
    except RuntimeError as e:
        raise CommandError(str(e)) from None


def _verbosity(verbose):
    if verbose is not None:
        return verbose
    isatty = getattr(sys.stdout, "isatty", None)
    return 1 if isatty is not None and isatty() else 2


def _jit_compile(args):
    if args.jit_compile == "auto":
        return args.layer == "local_reparameterization" and args.prior == "normal"
    return args.jit_compile == "on"


def run_train(args):
    """``tfbnn train``: returns the exit status."""
    if getattr(args, "model", None) is not None:
        from tfbnn.experiments import cifar_comparison

        return cifar_comparison.run(args)
    output = args.output or os.path.join("saved_models", f"bbb_mlp_{args.dataset}.keras")
    _prepare_output(output)
    anneal_epochs = args.anneal_epochs if args.anneal_epochs is not None else max(args.epochs / 2, 1e-3)

    from tfbnn import distribute

    strategy = distribute.strategy_from_args(args)  # first: --cpu-devices must precede any TF op

    import keras
    import numpy as np

    import tfbnn

    prior = _make_prior(args)
    schedule = _make_schedule(args.schedule, anneal_epochs)
    keras.utils.set_random_seed(args.seed)
    ds = _load_data(args)
    n = ds.num_examples

    with strategy.scope():
        model = build_mlp(
            ds.input_shape, ds.num_classes, args.hidden_units, args.depth, args.layer, prior, args.seed,
            name=f"bbb_mlp_{ds.name}",
        )
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=args.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            jit_compile=distribute.jit_compile_for(strategy, _jit_compile(args), warn=args.jit_compile == "on"),
        )
    annealing = tfbnn.KLAnnealing(num_examples=n, schedule=schedule)
    guard = _make_nan_guard()

    sizes = [ds.input_shape[0]] + [args.hidden_units] * args.depth + [ds.num_classes]
    print(
        f"tfbnn train: {ds.name}, N = {n} training / {ds.num_test_examples} test examples, "
        f"{ds.num_classes} classes\n"
        f"  model:    BbB MLP {' -> '.join(map(str, sizes))}, {args.layer}, prior {prior!r}, "
        f"{model.count_params()} parameters\n"
        f"  training: {args.epochs} epochs, batch {args.batch_size}, Adam lr {args.learning_rate:g}, "
        f"KL schedule {schedule!r}, seed {args.seed}\n"
        f"  strategy: {type(strategy).__name__}, {strategy.num_replicas_in_sync} replica(s)",
        flush=True,
    )
    start = time.perf_counter()
    history = distribute.fit(
        model, ds.x_train, ds.y_train, epochs=args.epochs, batch_size=args.batch_size,
        callbacks=[annealing, guard], verbose=_verbosity(args.verbose), seed=args.seed,
    )
    train_seconds = time.perf_counter() - start

    losses = history.history.get("loss", [])
    weights_finite = all(np.all(np.isfinite(w)) for w in model.get_weights())
    if guard.where is not None or not weights_finite or (losses and not math.isfinite(losses[-1])):
        if guard.where is not None:
            epoch, batch, loss = guard.where
            where = f"the loss became {loss} at epoch {epoch}, batch {batch} (TerminateOnNaN stopped training)"
        else:
            where = "the weights became NaN or infinite"
        kept = f"; {output} was left untouched" if os.path.exists(output) else ""
        raise CommandError(
            f"training diverged: {where}; no model was written{kept}. "
            f"Try a smaller --learning-rate (received {args.learning_rate:g})."
        )

    # -- evaluation -------------------------------------------------------------
    from tfbnn.evaluation import evaluate_classifier

    result = evaluate_classifier(model, ds.x_test, ds.y_test, num_samples=args.num_samples,
                                 shift_gamma=SHIFT_GAMMA, sweep_levels=(), seed=args.seed)
    clean, shifted = result.numbers["clean"], result.numbers["shifted"]
    kl_total = float(tfbnn.kl_divergence(model))
    if not (math.isfinite(kl_total) and math.isfinite(clean["nll"])):
        raise CommandError(
            f"evaluation gave a non-finite KL ({kl_total}) or NLL ({clean['nll']}); no model was written."
        )
    baseline = _deterministic_baseline(args, ds, sizes) if args.baseline else None

    chief = distribute.is_chief(strategy)
    if chief:
        save_atomically(model, output)

    kl_note = " (MC estimate)" if not prior.has_closed_form_kl else ""
    quality = [("test metric (MC predictive)", "BbB", "deterministic" if baseline else "")]
    for key, label, fmt in (("accuracy", "accuracy", "{:.2%}"), ("nll", "NLL", "{:.4f}"),
                            ("ece", "ECE (15 bins)", "{:.4f}"), ("brier", "Brier score", "{:.4f}")):
        quality.append((label, fmt.format(clean[key]), fmt.format(baseline[key]) if baseline else ""))
    quality.append(("accuracy, posterior mean", f"{result.numbers['posterior_mean_accuracy']:.2%}", ""))
    table = format_table(
        f"Results: BbB MLP on {ds.name} ({args.layer}, {args.prior} prior, {args.schedule} KL schedule)",
        [
            [
                ("training examples (N)", n),
                ("test examples", ds.num_test_examples),
                ("MC samples (T)", args.num_samples),
                (f"KL(q || p) total{kl_note}", f"{kl_total:.1f}"),
                ("KL / N (per example)", f"{kl_total / n:.4f}"),
                ("final training loss", f"{losses[-1]:.4f}" if losses else "n/a"),
                ("training time", f"{train_seconds:.1f} s"),
            ],
            quality,
            [
                ("uncertainty (mean, nats)", "clean", f"shifted (gamma={SHIFT_GAMMA:g})"),
                ("predictive entropy (total)", f"{clean['predictive_entropy']:.4f}",
                 f"{shifted['predictive_entropy']:.4f}"),
                ("expected entropy (aleatoric)", f"{clean['aleatoric']:.4f}", f"{shifted['aleatoric']:.4f}"),
                ("mutual information (epistemic)", f"{clean['epistemic']:.4f}", f"{shifted['epistemic']:.4f}"),
                ("accuracy", f"{clean['accuracy']:.2%}", f"{shifted['accuracy']:.2%}"),
            ],
        ],
    )
    print()
    print(table)
    print(f"\nSaved the model to {output}" if chief else "\n(not the chief: the chief saves the model)",
          flush=True)
    return 0


def _deterministic_baseline(args, ds, sizes):
    """The same MLP with keras Dense layers, trained alike; its test metrics."""
    import keras

    from tfbnn import metrics

    keras.utils.set_random_seed(args.seed)
    layers = [keras.Input(ds.input_shape)]
    layers += [keras.layers.Dense(u, activation="relu") for u in sizes[1:-1]]
    layers.append(keras.layers.Dense(ds.num_classes, activation="softmax"))
    model = keras.Sequential(layers, name="deterministic_mlp")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=args.learning_rate),
                  loss="sparse_categorical_crossentropy")
    print("deterministic baseline (same MLP with keras Dense) ...", flush=True)
    model.fit(ds.x_train, ds.y_train, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
    probs = model.predict(ds.x_test, batch_size=1024, verbose=0)
    return {
        "accuracy": metrics.accuracy(probs, ds.y_test),
        "nll": metrics.negative_log_likelihood(probs, ds.y_test),
        "ece": metrics.expected_calibration_error(probs, ds.y_test),
        "brier": metrics.brier_score(probs, ds.y_test),
    }


# -- evaluate and export -------------------------------------------------------------


def _existing_model(text):
    if not os.path.isfile(text) or not text.endswith(".keras"):
        raise argparse.ArgumentTypeError(f"expected an existing .keras file, received {text!r}")
    return text


def _load_model(path):
    import keras

    import tfbnn  # noqa: F401  (registers the tfbnn layers for deserialization)

    try:
        return keras.saving.load_model(path)
    except Exception as e:  # a corrupt or foreign file: one line, not a traceback
        raise CommandError(f"could not load {path}: {_one_line(e)}") from e


def add_evaluate_parser(subparsers):
    """Registers ``tfbnn evaluate``."""
    parser = subparsers.add_parser(
        "evaluate",
        help="Monte Carlo metrics, calibration and shift curves of a saved model, as PNGs + JSON",
        formatter_class=_HelpFormatter,
        description=(
            "Load a saved .keras classifier, run Monte Carlo prediction on a dataset's test split and\n"
            "write metrics.json (accuracy, NLL, Brier, ECE, accuracy-coverage area, total /\n"
            "aleatoric / epistemic uncertainty on clean and Gaussian-shifted inputs, a shift sweep)\n"
            "next to PNG figures: reliability diagram, entropy histograms, accuracy-coverage and\n"
            "uncertainty-versus-shift curves. Use the dataset and --seed the model was trained with,\n"
            "so the test split is the held-out one."
        ),
    )
    parser.add_argument("model", type=_existing_model, help="a .keras file (e.g. from tfbnn train)")
    parser.add_argument("--dataset", choices=DATASET_NAMES, default=TRAIN_DEFAULTS["dataset"],
                        help="dataset whose test split is evaluated (default: %(default)s)")
    parser.add_argument("--seed", type=_non_negative_int, default=0,
                        help="seed of the data split and the shift noise (default: %(default)s)")
    parser.add_argument("--num-samples", type=_positive_int, default=50, metavar="T",
                        help="Monte Carlo samples per example (default: %(default)s)")
    parser.add_argument("--num-bins", type=_positive_int, default=15, help="ECE bins (default: %(default)s)")
    parser.add_argument("--max-examples", type=_positive_int, default=None,
                        help="cap on examples loaded from tfds datasets")
    parser.add_argument("--output-dir", default=None, metavar="DIR",
                        help="where the JSON and PNGs go; default: MODEL without .keras + '_evaluation/'")
    parser.set_defaults(func=run_evaluate)
    return parser


def run_evaluate(args):
    """``tfbnn evaluate``: returns the exit status."""
    from tfbnn.evaluation import evaluate_classifier, write_report

    folder = args.output_dir or args.model[: -len(".keras")] + "_evaluation"
    model = _load_model(args.model)
    ds = _load_data(args)
    if tuple(model.inputs[0].shape[1:]) != tuple(ds.input_shape):
        raise ValueError(
            f"the model expects inputs of shape {tuple(model.inputs[0].shape[1:])}, the dataset has "
            f"{tuple(ds.input_shape)}. Received: --dataset={args.dataset}"
        )
    result = evaluate_classifier(model, ds.x_test, ds.y_test, num_samples=args.num_samples,
                                 num_bins=args.num_bins, shift_gamma=SHIFT_GAMMA, seed=args.seed)
    paths = write_report(result, folder, name=os.path.basename(args.model))
    c, s = result.numbers["clean"], result.numbers["shifted"]
    rows = [("metric", "clean", f"shifted (gamma={SHIFT_GAMMA:g})")]
    for key, label in (("accuracy", "accuracy"), ("nll", "NLL"), ("brier", "Brier score"),
                       ("ece", f"ECE ({args.num_bins} bins)"), ("predictive_entropy", "total uncertainty"),
                       ("aleatoric", "aleatoric"), ("epistemic", "epistemic")):
        rows.append((label, f"{c[key]:.4f}", f"{s[key]:.4f}"))
    sweep = [("Gaussian shift gamma", "accuracy", "total", "aleatoric", "epistemic")]
    sweep += [(f"{r['level']:g}", f"{r['accuracy']:.4f}", f"{r['predictive_entropy']:.4f}",
               f"{r['expected_entropy']:.4f}", f"{r['mutual_information']:.4f}") for r in result.sweep]
    print(format_table(f"Evaluation of {args.model} on {ds.name} ({len(ds.y_test)} test examples, "
                       f"T = {args.num_samples})",
                       [rows, [("accuracy-coverage area", f"{result.numbers['selective_area']:.4f}")], sweep]))
    print(f"\nWrote {len(paths)} files to {folder}/: " + ", ".join(os.path.basename(p) for p in paths))
    return 0


def add_export_parser(subparsers):
    """Registers ``tfbnn export``."""
    parser = subparsers.add_parser(
        "export",
        help="export a saved model as a SavedModel with sample / mean / uncertainty endpoints",
        formatter_class=_HelpFormatter,
        description=(
            "Export a .keras model as a TensorFlow SavedModel that serves without tfbnn\n"
            "(tf.saved_model.load). Endpoints: sample(x), sample_seeded(x, seed), mean(x),\n"
            "summary(x) and summary_seeded(x, seed) (a T-sample summary: mean_probs,\n"
            "predictive_entropy, aleatoric, epistemic). Unseeded endpoints draw fresh samples\n"
            "in every process; seeded ones reproduce."
        ),
    )
    parser.add_argument("model", type=_existing_model, help="a .keras file")
    parser.add_argument("--output", default=None, metavar="DIR",
                        help="SavedModel folder; default: MODEL without .keras + '_savedmodel'")
    parser.add_argument("--num-samples", type=_positive_int, default=100, metavar="T",
                        help="samples of the summary endpoints (default: %(default)s)")
    parser.add_argument("--task", choices=("classification", "regression"), default="classification")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing export folder")
    parser.set_defaults(func=run_export)
    return parser


def run_export(args):
    """``tfbnn export``: returns the exit status."""
    from tfbnn.export import export_saved_model

    output = args.output or args.model[: -len(".keras")] + "_savedmodel"
    model = _load_model(args.model)
    export_saved_model(model, output, num_samples=args.num_samples, task=args.task, overwrite=args.overwrite)
    print(f"Exported {args.model} to {output}/ with endpoints sample, sample_seeded, mean, summary, "
          f"summary_seeded (T = {args.num_samples}).\nServe it with: served = "
          f"tf.saved_model.load({output!r}); served.summary(x)")
    return 0


def add_tune_parser(subparsers):
    """Registers ``tfbnn tune`` (KerasTuner searches; see :mod:`tfbnn.tuning_cli`)."""
    from tfbnn.tuning_cli import add_tune_parser as add  # lazy: tuning_cli imports this module

    return add(subparsers)


def _experiment(module):
    """The ``add_<module>_parser`` of :mod:`tfbnn.experiments.<module>`, imported when used."""

    def add(subparsers):
        import importlib

        return getattr(importlib.import_module(f"tfbnn.experiments.{module}"), f"add_{module}_parser")(subparsers)

    add.__name__ = f"add_{module}_parser"
    return add


#: The subcommands, in the order ``tfbnn --help`` lists them. Each entry adds its
#: parser to the subparsers action and sets ``func``.
SUBCOMMANDS = [
    add_train_parser,
    add_evaluate_parser,
    add_export_parser,
    add_tune_parser,
    _experiment("vd_sparsity"),
    _experiment("vd_regression"),
    _experiment("vd_transformer"),
    _experiment("ibnn_regression"),
    _experiment("ibnn_lenet"),
    _experiment("ibnn_shift"),
]


# -- entry point ------------------------------------------------------------------


def main(argv=None):
    """Runs ``tfbnn`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Never raises ``SystemExit`` itself (the console script wraps it in
    ``sys.exit``): ``--help`` and ``--version`` return 0; bad options print one
    ``tfbnn: error: ...`` line to stderr and return 2, whether argparse or the
    library (a ``ValueError``) rejects them; a failed run returns 1.
    """
    return run_command(build_parser(), argv, interrupted="interrupted; no model was written")


def run_command(parser, argv, interrupted=None):
    """Parses ``argv`` with ``parser`` and runs the chosen subcommand's ``func``; the exit status.

    ``--help``: 0; a bad option (argparse or a ``ValueError`` of the library): one
    ``tfbnn: error: ...`` line and 2; a :class:`CommandError`: its line and its
    status; with ``interrupted``, Ctrl-C prints ``tfbnn: <interrupted>`` and gives 130.
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except CommandError as e:
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"{PROG}: {interrupted}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
