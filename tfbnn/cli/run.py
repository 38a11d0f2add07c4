"""``tfbnn run RECIPE``: a study's protocol (a built-in recipe or a .json file) from the command line."""

from tfbnn import training
from tfbnn._internal import argtypes

__all__ = ["DESCRIPTION", "EPILOG", "add_arguments", "run"]

DESCRIPTION = (
    "Run a recipe with tfbnn.training.run: train, evaluate (accuracy, NLL, ECE, Brier score,\n"
    "total / aleatoric / epistemic uncertainty on clean and shifted inputs), and write\n"
    "recipe.json, history.csv/.json, learning_curves.png, results.json and model.keras into\n"
    "--output-dir, only after the run succeeded.\n"
    "\n"
    "RECIPE is a built-in name (`tfbnn recipes` lists them with their sources) or a JSON file\n"
    "as written by tfbnn.training.save_recipe or by an earlier run (its recipe.json)."
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


def run(args):
    """``tfbnn run``: returns the exit status."""
    recipe = training.resolve(args.recipe)
    if args.quick:
        recipe = recipe.quick()
    changes = {k: getattr(args, k) for k in ("dataset", "epochs", "seed") if getattr(args, k) is not None}
    if changes:
        recipe = recipe.replace(**changes)
    training.run(recipe, output_dir=args.output_dir, verbose=argtypes.verbosity(args.verbose))
    return 0
