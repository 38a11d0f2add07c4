"""``tfbnn run RECIPE`` and ``tfbnn recipes``: the studies' protocols from the command line."""

import textwrap

from tfbnn._internal import argtypes

__all__ = ["add_run_parser", "add_recipes_parser", "run", "list_recipes"]


def add_run_parser(subparsers):
    """Registers ``tfbnn run``."""
    parser = subparsers.add_parser(
        "run",
        help="run a recipe: a built-in study protocol by name (see `tfbnn recipes`) or a .json file",
        formatter_class=argtypes.HelpFormatter,
        description=(
            "Run a recipe with tfbnn.training.run: train, evaluate (accuracy, NLL, ECE, Brier score,\n"
            "total / aleatoric / epistemic uncertainty on clean and shifted inputs), and write\n"
            "recipe.json, history.csv/.json, learning_curves.png, results.json and model.keras into\n"
            "--output-dir, only after the run succeeded.\n"
            "\n"
            "RECIPE is a built-in name (`tfbnn recipes` lists them with their sources) or a JSON file\n"
            "as written by tfbnn.training.save_recipe or by an earlier run (its recipe.json)."
        ),
        epilog="examples:\n  tfbnn run blundell-mnist-1200\n  tfbnn run vd-lenet300-100 --quick --dataset digits\n"
               "  tfbnn run saved_models/runs/blundell-mnist-400/recipe.json",
    )
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
    parser.set_defaults(func=run)
    return parser


def add_recipes_parser(subparsers):
    """Registers ``tfbnn recipes``."""
    parser = subparsers.add_parser(
        "recipes", help="list the built-in recipes (the seed studies' protocols), or show one",
        formatter_class=argtypes.HelpFormatter,
        description="List the built-in recipes with what they reproduce, or print one recipe as JSON.",
    )
    parser.add_argument("--show", default=None, metavar="NAME", help="print this recipe's JSON")
    parser.set_defaults(func=list_recipes)
    return parser


def run(args):
    """``tfbnn run``: returns the exit status."""
    from tfbnn import training

    recipe = training.resolve(args.recipe)
    if args.quick:
        recipe = recipe.quick()
    changes = {k: getattr(args, k) for k in ("dataset", "epochs", "seed") if getattr(args, k) is not None}
    if changes:
        recipe = recipe.replace(**changes)
    training.run(recipe, output_dir=args.output_dir, verbose=argtypes.verbosity(args.verbose))
    return 0


def list_recipes(args):
    """``tfbnn recipes``: returns the exit status."""
    from tfbnn import training

    if args.show is not None:
        print(training.get_recipe(args.show).to_json())
        return 0
    for name, recipe in training.RECIPES.items():
        print(name)
        print(textwrap.fill(recipe.description, 96, initial_indent="    ", subsequent_indent="    "))
        print(textwrap.fill(f"source: {recipe.reference}", 96, initial_indent="    ", subsequent_indent="    "))
    return 0
