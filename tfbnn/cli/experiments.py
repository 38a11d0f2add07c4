"""The studies of :mod:`tfbnn.experiments` as ``tfbnn`` subcommands (``tfbnn vd-sparsity``, ...).

Each experiment module defines ``add_<name>_parser(subparsers)``; this module lists
them. The experiment modules are imported when the parser is built; they import
TensorFlow only when they run.
"""

import importlib

__all__ = ["PARSERS", "EXPERIMENTS"]

#: Module of tfbnn.experiments -> what it studies.
EXPERIMENTS = {
    "vd_sparsity": "variational dropout / Graves on LeNet-300-100: sparsity, principled vs random pruning",
    "vd_regression": "1-D regression with 40 points: variational dropout, Graves and deterministic bands",
    "vd_transformer": "Transformer text classifier with a Bayesian feed-forward block (IMDB or offline reviews)",
    "ibnn_regression": "iBNN vs BbB on y = x^3 (30 points), predictive bands by depth",
    "ibnn_lenet": "iBNN vs BbB LeNet width sweep (Fashion-MNIST or offline digits)",
    "ibnn_shift": "iBNN vs MC dropout under Gaussian / salt-and-pepper shift",
    "uncertainty_comparison": "deterministic, MC dropout, BbB, iBNN and a deep ensemble on the same data: one table",
    "vcl_split_digits": "split digits, continual learning: VCL (posterior as next prior) vs fine-tuning",
}


def _subcommand(module_name):
    def add(subparsers):
        module = importlib.import_module(f"tfbnn.experiments.{module_name}")
        return getattr(module, f"add_{module_name}_parser")(subparsers)

    add.__name__ = f"add_{module_name}_parser"
    return add


#: One ``add(subparsers)`` per experiment, in the order ``tfbnn --help`` lists them.
PARSERS = [_subcommand(name) for name in EXPERIMENTS]
