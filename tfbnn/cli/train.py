"""``tfbnn train``: a recipe from flags, run by :func:`tfbnn.training.run`.

With no options it is the project's main job: the built-in recipe ``digits-bbb-mlp``
(a Bayes-by-Backprop MLP on the offline digits with a tempered posterior, beta = 0.1,
and temperature scaling fitted on a 15% hold-out), the same MLP at beta = 1 (the ELBO)
and a deterministic baseline beside it, about a minute and a quarter on two CPU cores. Every flag changes one field of that recipe; a
flag that does not apply to the chosen model or method is an error, never dropped.
"""

import argparse
import os

from tfbnn import methods as registry
from tfbnn import training
from tfbnn._internal import argtypes
from tfbnn.datasets.catalog import CLASSIFICATION_DATASETS
from tfbnn.training.recipe import KL_SCHEDULES

__all__ = ["DESCRIPTION", "add_arguments", "run", "recipe_from_args", "METHOD_FLAGS", "method_flags"]


def method_flags():
    """The methods' own flags, each once, from the registry (:attr:`tfbnn.methods.Method.flags`):
    ``{dest: (Flag, (method, ...))}``, a flag shared by several methods listing them all."""
    flags = {}
    for name in registry.names():
        for flag in registry.get(name).flags:
            first, methods = flags.get(flag.dest, (flag, ()))
            flags[flag.dest] = (first, methods + (name,))
    return flags


#: Flags that apply to some methods only (dest -> methods): the built-in methods' (:func:`method_flags`).
METHOD_FLAGS = {dest: methods for dest, (_, methods) in method_flags().items()}
#: Flags that apply to the MLP only.
MLP_FLAGS = ("hidden_units", "depth")

# The main job's MLP, when --model is mlp and the flags are not given.
_MAIN_HIDDEN_UNITS, _MAIN_DEPTH = 64, 2
# The main job's validation hold-out and final KL weight (tests check they equal the recipe's).
_MAIN_VALIDATION_FRACTION, _MAIN_BETA = 0.15, 0.1
#: The main job's learning rate (Adam), and the initial step size of a method that samples with its optimizer
#: (csgmcmc's SGHMC: the digits-csgmcmc-mlp recipe's).
_MAIN_LEARNING_RATE, _SAMPLER_LEARNING_RATE = 3e-3, 0.1


DESCRIPTION = (
    "Train a model of the tfbnn zoo with one method, evaluate its Monte Carlo predictive and\n"
    "save it as a .keras file, through tfbnn.training.run (the recipe is written next to the\n"
    "results as recipe.json; `tfbnn run recipe.json` runs it again).\n"
    "\n"
    "The loss is the per-example negative ELBO  mean NLL + beta * KL(q || p) / N  (N = the\n"
    "training examples actually loaded), with beta moved by tfbnn.KLAnnealing following\n"
    "--schedule up to --beta.\n"
    "\n"
    "With no options this is the main job: a Bayes-by-Backprop MLP (2 x 64 units, local\n"
    "reparameterization, N(0, 1) prior) on the offline 'digits' dataset (scikit-learn's 8x8\n"
    "digits, 1437 train / 360 test, no download), about a minute on 2 CPU cores, beside the\n"
    "same MLP with deterministic layers. It trains a tempered posterior, beta = 0.1 (the data\n"
    "counted ten times against the prior), and the same model at beta = 1 (the ELBO) beside it.\n"
    "The results table shows test accuracy, NLL, ECE (raw and after temperature scaling fitted\n"
    "on a 15% validation hold-out), Brier score and mean confidence of the Monte Carlo\n"
    "predictive (--num-samples samples), the KL, and shift detection: how well the predictive\n"
    "entropy and the method's own epistemic score (mutual information for Monte Carlo methods,\n"
    "SNGP's GP variance, DDU's feature density, the evidential K / S; n/a without one) tell noise-shifted inputs\n"
    "x' = (1 - g) x + g * eps, eps ~ N(0, 1), g = 0.5 from clean ones (AUROC, 0.5 = chance),\n"
    "followed by a paragraph reading the trade-off.\n"
    "\n"
    "Files are written only after a successful run: a failed run (e.g. the loss became NaN)\n"
    "exits with status 1 and leaves no output and any existing file untouched."
)
EPILOG = (
    "examples:\n"
    "  tfbnn train\n"
    "  tfbnn train --beta 1 --no-temperature-scale          # the untempered ELBO, raw predictive\n"
    "  tfbnn train --layer flipout --prior scale_mixture --pi 0.25 --sigma1 1 --sigma2 0.000335\n"
    "  tfbnn train --method mc_dropout --dropout-rate 0.2\n"
    "  tfbnn train --method ensemble --members 5 --baseline\n"
    "  tfbnn train --method ensemble --members 3 --member-method bbb --layer flipout\n"
    "  tfbnn train --model lenet5 --method bbb --dataset cifar10 --epochs 100 --beta 0.1\n"
    "  tfbnn train --dataset mnist --hidden-units 400 --epochs 10 --schedule blundell"
)


def add_arguments(parser):
    """The options of ``tfbnn train``."""
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=CLASSIFICATION_DATASETS, default="digits",
                      help="digits and moons are offline; the others come from tensorflow-datasets and "
                      "download on first use")
    data.add_argument("--max-examples", type=argtypes.positive_int, default=None, metavar="N",
                      help="use at most N training examples; N in the ELBO is the count actually used")
    data.add_argument("--validation-fraction", type=argtypes.rate, default=_MAIN_VALIDATION_FRACTION, metavar="F",
                      help="hold out this fraction of the training split (seeded): validation curves, and the "
                      "examples temperature scaling is fitted on")

    model = parser.add_argument_group("model and method")
    model.add_argument("--model", default="mlp", metavar="MODEL",
                       help="a tfbnn.models name or preset: mlp, lenet5, alexnet, resnet50, vgg16, "
                       "vgg16_small, convnext, wide_resnet28_10, transformer, lenet_300_100, mlp_blundell, ...")
    # --method and each method's flags come from the method registry (tfbnn.methods).
    trainable = [name for name in registry.names() if registry.get(name).build != "adapter"]  # run builds them
    model.add_argument("--method", choices=trainable, default="bbb",
                       help="; ".join(_method_help(name) for name in trainable))
    for flag, _ in method_flags().values():
        model.add_argument(flag.option, **flag.argparse_kwargs())
    model.add_argument("--hidden-units", type=argtypes.positive_int, default=None, metavar="UNITS",
                       help=f"mlp only: units per hidden layer (default: {_MAIN_HIDDEN_UNITS})")
    model.add_argument("--depth", type=argtypes.positive_int, default=None,
                       help=f"mlp only: number of hidden layers (default: {_MAIN_DEPTH})")

    training = parser.add_argument_group("training")
    training.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="the optimizer")
    training.add_argument("--learning-rate", type=argtypes.positive_float, default=None, metavar="LR",
                          help=f"the initial learning rate (default: {_MAIN_LEARNING_RATE:g}; {_SAMPLER_LEARNING_RATE:g}, "
                               "the initial step size, for a method that samples with its optimizer: csgmcmc)")
    training.add_argument("--momentum", type=argtypes.rate, default=0.0, help="sgd only: momentum")
    training.add_argument("--nesterov", action="store_true", help="sgd only: Nesterov momentum")
    training.add_argument("--weight-decay", type=argtypes.non_negative_float, default=0.0,
                          help="decoupled weight decay of the deterministic weights (never the posteriors)")
    training.add_argument("--lr-schedule", choices=("constant", "cosine", "linear"), default="constant",
                          help="learning rate over training: constant, cosine or linear decay to 0")
    training.add_argument("--epochs", type=argtypes.positive_int, default=60, help="training epochs")
    training.add_argument("--batch-size", type=argtypes.positive_int, default=32, help="minibatch size")
    training.add_argument("--schedule", choices=KL_SCHEDULES, default="linear",
                          help="KL weight over training (tfbnn.schedules): constant (beta throughout), linear "
                          "(0 -> beta over --anneal-epochs), warmup (0 for the first half of --anneal-epochs, "
                          "then linear), cosine, cyclic (Fu et al. 2019), blundell (minibatch weights "
                          "2^(M-i) / (2^M - 1), Blundell eq. 9)")
    training.add_argument("--anneal-epochs", type=argtypes.positive_float, default=None, metavar="EPOCHS",
                          help="length of the KL ramp in epochs (default: half of --epochs)")
    training.add_argument("--beta", type=argtypes.non_negative_float, default=None,
                          help="the final KL weight: 1 is the ELBO; < 1 a tempered ('cold') posterior, the data "
                          "counted 1/beta times against the prior (Wenzel et al. 2020): sharper, more accurate and "
                          f"better calibrated on little data, with less epistemic uncertainty (default: {_MAIN_BETA:g}; "
                          "1 with --schedule blundell, whose minibatch weights fix it)")
    training.add_argument("--seed", type=argtypes.non_negative_int, default=0,
                          help="seeds the data split, initialization, shuffling and every layer's noise")
    training.add_argument("--verbose", type=int, choices=(0, 1, 2), default=None,
                          help="Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch (default: 1 "
                          "on a terminal, 2 when the output is redirected)")
    training.add_argument("--jit-compile", choices=("auto", "on", "off"), default="auto",
                          help="XLA: auto = on a CPU, on where the measured rule (tfbnn.methods.XLA_RULE: method, "
                          "network, Eigen or oneDNN kernels) found it faster, in runs of 1,000 train steps or more "
                          "(its compilation takes seconds); with a GPU, Keras' own choice")
    argtypes.add_strategy_argument(training)

    evaluation = parser.add_argument_group("evaluation and output")
    evaluation.add_argument("--num-samples", type=argtypes.positive_int, default=32, metavar="T",
                            help="Monte Carlo samples of the test predictive")
    evaluation.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                            help="also train the same model with deterministic layers and report its accuracy, "
                            "NLL, ECE, Brier score and shift detection beside")
    evaluation.add_argument("--beta-comparison", action=argparse.BooleanOptionalAction, default=True,
                            help="when --beta is not 1 (Bayesian methods): also train the same model at beta = 1, "
                            "the untempered ELBO, and report it beside")
    evaluation.add_argument("--temperature-scale", dest="temperature_scaling",
                            action=argparse.BooleanOptionalAction, default=True,
                            help="fit a temperature T to the Monte Carlo predictive, softmax(log p_bar / T), on the "
                            "validation hold-out (Guo et al. 2017) and report NLL and ECE before and after; needs "
                            "--validation-fraction > 0")
    evaluation.add_argument("--output", type=argtypes.keras_path, default=None, metavar="PATH",
                            help="the .keras model (default: saved_models/<method>_<model>_<dataset>.keras)")
    evaluation.add_argument("--output-dir", default=None, metavar="DIR",
                            help="history, curves, results and recipe (default: PATH without .keras + '_run')")
    evaluation.add_argument("--tensorboard", default=None, metavar="DIR",
                            help="write TensorBoard logs there during training: Keras' own and tfbnn's posterior "
                                 "board (KL per layer, posterior scales and signal-to-noise, the validation "
                                 "predictive with its reliability diagram)")


def _not_applicable(args):
    """One error for every given flag that the chosen model or method does not use."""
    from tfbnn import models

    given = [(dest, methods) for dest, (_, methods) in method_flags().items() if getattr(args, dest) is not None]
    member = _member_method(args)
    wrong = [f"--{d.replace('_', '-')} ({'/'.join(m)} only)" for d, m in given
             if args.method not in m and member not in m]
    is_mlp = args.model == "mlp"
    wrong += [f"--{d.replace('_', '-')} (mlp only)" for d in MLP_FLAGS if getattr(args, d) is not None and not is_mlp]
    if args.optimizer != "sgd" and (args.momentum or args.nesterov):
        wrong.append("--momentum/--nesterov (--optimizer sgd only)")
    if wrong:
        raise ValueError(f"options that do not apply to --model {args.model} --method {args.method}: "
                         f"{', '.join(wrong)}")
    names = [n for n in models.MODELS if n not in models.TEXT_MODELS] + list(models.PRESETS)
    if args.model not in names:
        hint = " (a text model: see `tfbnn vd-transformer`)" if args.model in models.TEXT_MODELS else ""
        raise ValueError(f"unknown model{hint}; expected one of {names}. Received: --model={args.model}")
    _check_kerashub_method(args, models.kerashub)


def _check_kerashub_method(args, kerashub):
    """A KerasHub model (of the zoo's module ``kerashub``) takes a Bayesian method only as a Bayesian head,
    which ``tfbnn train`` has no flag for: say which methods it trains."""
    member = _member_method(args)
    if args.model in kerashub.__all__ and registry.get(member).build == "zoo" \
            and member not in kerashub.DETERMINISTIC_BODY_METHODS:
        works = ", ".join(kerashub.DETERMINISTIC_BODY_METHODS)
        raise ValueError(f"--model {args.model} trains with --method {works}, or ensemble with --member-method one of "
                         f"them: KerasHub keeps the backbone's weight layers inside subclassed layers that tfbnn "
                         f"cannot make Bayesian (a Bayesian head alone: tfbnn.models.build(..., "
                         f"bayesian_layers='last') in Python). Received: --model={args.model}, --method={args.method}"
                         + (f", --member-method={member}" if member != args.method else ""))


def _method_help(name):
    """``name (description)`` of a method in ``--method``'s help."""
    description = registry.get(name).description
    return f"{name} ({description})" if description else name


def _member_method(args):
    """The method of the trained networks: ``--method``, or ``--member-method`` of an ensemble."""
    if registry.get(args.method).build == "ensemble":
        return args.member_method or "deterministic"
    return args.method


def _method_options(args):
    """The recipe's ``method_options``: the method's reading of its flags (:meth:`tfbnn.methods.Method.options_from`)."""
    return registry.get(args.method).options_from({dest: getattr(args, dest) for dest in method_flags()})


def _learning_rate(args):
    if args.learning_rate is not None:
        return args.learning_rate
    return _SAMPLER_LEARNING_RATE if registry.get(args.method).sampler is not None else _MAIN_LEARNING_RATE


def _beta(args):
    if args.beta is not None:
        return args.beta
    return 1.0 if args.schedule == "blundell" else _MAIN_BETA


def recipe_from_args(args):
    """The :class:`tfbnn.training.Recipe` the flags describe (the main job's, changed by each flag)."""
    _not_applicable(args)
    model_options = {}
    if args.model == "mlp":
        model_options["hidden_units"] = (args.hidden_units or _MAIN_HIDDEN_UNITS,) * (args.depth or _MAIN_DEPTH)
    return training.get_recipe("digits-bbb-mlp").replace(
        name=f"{args.method}_{args.model}_{args.dataset}", description="tfbnn train", reference="",
        model=args.model, model_options=model_options, method=args.method, method_options=_method_options(args),
        dataset=args.dataset, max_examples=args.max_examples, validation_fraction=args.validation_fraction,
        optimizer=args.optimizer, learning_rate=_learning_rate(args), momentum=args.momentum, nesterov=args.nesterov,
        weight_decay=args.weight_decay, lr_schedule=args.lr_schedule, epochs=args.epochs, batch_size=args.batch_size,
        kl_schedule=args.schedule, kl_epochs=args.anneal_epochs, beta=_beta(args), eval_samples=args.num_samples,
        temperature_scaling=args.temperature_scaling, seed=args.seed,
    )


def run(args):
    """``tfbnn train``: returns the exit status."""
    from tfbnn import distribute

    recipe = recipe_from_args(args)
    output = args.output or os.path.join("saved_models", f"{recipe.name}.keras")
    output_dir = args.output_dir or output[: -len(".keras")] + "_run"
    strategy = distribute.strategy_from_args(args)
    jit = {"auto": "auto", "on": True, "off": False}[args.jit_compile]
    compare = args.beta_comparison and recipe.is_bayesian and recipe.beta != 1.0
    training.run(recipe, output_dir=output_dir, model_path=output, verbose=argtypes.verbosity(args.verbose),
                 baseline=args.baseline and recipe.method != "deterministic", jit_compile=jit,
                 strategy=strategy, compare_beta=1.0 if compare else None, tensorboard=args.tensorboard)
    print(f"Saved the model to {output}", flush=True)
    return 0
