"""``tfbnn run RECIPE``: a study's protocol (a built-in recipe or a .json file) from the command line."""

import importlib

from tfbnn import experiments, training
from tfbnn._internal import argtypes

__all__ = ["DESCRIPTION", "EPILOG", "STUDIES", "add_arguments", "run"]

#: Studies ``tfbnn run NAME`` runs with their defaults (``--quick`` where the study has that setting,
#: ``--seed`` and ``--output-dir`` apply): name -> the module of its ``run_experiment``, every study of
#: :data:`tfbnn.experiments.STUDIES`; ``tfbnn NAME --help`` has all their options.
STUDIES = {name: module for name, (module, _) in experiments.STUDIES.items()}

DESCRIPTION = (
    "Run a recipe with tfbnn.training.run: train, evaluate (accuracy, NLL, ECE, Brier score,\n"
    "total / aleatoric / epistemic uncertainty on clean and shifted inputs), and write\n"
    "recipe.json, history.csv/.json, learning_curves.png, results.json and model.keras into\n"
    "--output-dir, only after the run succeeded.\n"
    "\n"
    "RECIPE is a built-in name (`tfbnn recipes` lists them with their sources) or a JSON file\n"
    "as written by tfbnn.training.save_recipe or by an earlier run (its recipe.json), or a study\n"
    "that is a set of recipes with its own analysis (`tfbnn recipes` lists them; `tfbnn STUDY --help`\n"
    "lists a study's options; here --seed, --output-dir and, where the study has it, --quick apply)."
)
EPILOG = ("examples:\n  tfbnn run blundell-mnist-1200\n  tfbnn run vd-lenet300-100 --quick --dataset digits\n"
          "  tfbnn run saved_models/runs/blundell-mnist-400/recipe.json")


def add_arguments(parser):
    """The options of ``tfbnn run``."""
    parser.add_argument("recipe", help="a built-in recipe name or a recipe .json file")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 epoch on 64 examples, 4 Monte Carlo samples (Recipe.quick())")
    parser.add_argument("--dataset", default=None,
                        help="run on another dataset than the recipe's (e.g. the offline digits)")
    parser.add_argument("--epochs", type=argtypes.positive_int, default=None, help="override the recipe's epochs")
    parser.add_argument("--seed", type=argtypes.non_negative_int, default=None, help="override the recipe's seed")
    parser.add_argument("--output-dir", default=None, metavar="DIR",
                        help="where the outputs go (default: saved_models/runs/<recipe name>)")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=None,
                        help="Keras fit verbosity (default: 1 on a terminal, 2 otherwise)")
    parser.add_argument("--tensorboard", default=None, metavar="DIR",
                        help="write TensorBoard logs there: Keras' own and tfbnn's posterior board (KL per layer, "
                             "posterior scales and signal-to-noise, the validation predictive); a recipe only")


def run(args):
    """``tfbnn run``: returns the exit status."""
    if args.recipe in STUDIES:
        return _run_study(args)
    recipe = training.resolve(args.recipe)
    if args.quick:
        recipe = recipe.quick()
    changes = {k: getattr(args, k) for k in ("dataset", "epochs", "seed") if getattr(args, k) is not None}
    if changes:
        recipe = recipe.replace(**changes)
    training.run(recipe, output_dir=args.output_dir, verbose=argtypes.verbosity(args.verbose),
                 tensorboard=args.tensorboard)
    return 0


def _run_study(args):
    """``tfbnn run STUDY``: the study's ``run_experiment`` with its defaults and the options that apply."""
    study = importlib.import_module(STUDIES[args.recipe])
    not_applicable = [f"--{k}" for k in ("dataset", "epochs", "verbose", "tensorboard") if getattr(args, k) is not None]
    if args.quick and "quick" not in study.DEFAULTS:
        not_applicable.append("--quick")
    if not_applicable:
        raise ValueError(f"{not_applicable[0]} does not apply to the study {args.recipe} (see `tfbnn {args.recipe} "
                         f"--help`). Received: {args.recipe} with {not_applicable[0]}")
    settings = {"quick": True} if args.quick else {}
    if args.seed is not None:
        settings["seed"] = args.seed
    result = study.run_experiment(output_dir=args.output_dir, **settings)
    print("\nWrote " + ", ".join(result["files"]))
    return 0
