"""``tfbnn recipes``: the built-in recipes (the studies' protocols) and the studies, listed; a recipe shown as JSON."""

import importlib
import json
import textwrap

from tfbnn import experiments
from tfbnn.training import recipes

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = ("List the built-in recipes with what they reproduce and the studies (sets of recipes with their\n"
               "own analysis) that `tfbnn run NAME` runs, or print one recipe (a study's recipes) as JSON.")


def add_arguments(parser):
    """The options of ``tfbnn recipes``."""
    parser.add_argument("--show", default=None, metavar="NAME",
                        help="print this recipe's JSON; for a study, the list of the recipes it trains by default")


def run(args):
    """``tfbnn recipes``: returns the exit status."""
    if args.show in experiments.STUDIES:
        study = importlib.import_module(experiments.STUDIES[args.show][0]).STUDY
        print(json.dumps([r.to_dict() for r in study.recipes(study.resolve({}))], indent=1))
        return 0
    if args.show is not None:
        print(recipes.get_recipe(args.show).to_json())
        return 0
    for name, recipe in recipes.RECIPES.items():
        print(name)
        print(textwrap.fill(recipe.description, 96, initial_indent="    ", subsequent_indent="    "))
        print(textwrap.fill(f"source: {recipe.reference}", 96, initial_indent="    ", subsequent_indent="    "))
    print("\nstudies (a set of recipes and their analysis; `tfbnn NAME --help` lists a study's options):")
    for name, (_, summary) in experiments.STUDIES.items():
        print(name)
        print(textwrap.fill(summary, 96, initial_indent="    ", subsequent_indent="    "))
    return 0
