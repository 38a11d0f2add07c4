"""MkDocs hook: one API page per public module of the tfbnn package, and the benchmarks page.

Walks ``tfbnn/`` (no import), skips private modules (``_name.py``) and
``__main__``, and adds ``api/<module>.md`` holding a mkdocstrings directive
(``::: tfbnn.module``), so every module is documented and a module added later
gets its page without a change here; the pages go to the nav under
"API reference". ``benchmarks/README.md``, whose tables the benchmark scripts
write (``--write-readme``), is published unchanged as ``guides/benchmarks.md``.
"""

import os

from mkdocs.structure.files import File

PACKAGE = "tfbnn"
BENCHMARKS = os.path.join("benchmarks", "README.md")
BENCHMARKS_PAGE = "guides/benchmarks.md"
# The user guide of a module (and of its submodules), linked at the top of its API page.
GUIDES = {
    "tfbnn.callbacks": ("The ELBO convention", "elbo"),
    "tfbnn.schedules": ("The ELBO convention", "elbo"),
    "tfbnn.multisample": ("The ELBO convention", "elbo"),
    "tfbnn.layers": ("Getting started", "getting-started"),
    "tfbnn.priors": ("Getting started", "getting-started"),
    "tfbnn.posteriors": ("Getting started", "getting-started"),
    "tfbnn.datasets": ("Getting started", "getting-started"),
    "tfbnn.distribute": ("Getting started", "getting-started"),
    "tfbnn.inference": ("Predictive uncertainty and calibration", "uncertainty"),
    "tfbnn.calibration": ("Predictive uncertainty and calibration", "uncertainty"),
    "tfbnn.metrics": ("Predictive uncertainty and calibration", "uncertainty"),
    "tfbnn.evaluation": ("Predictive uncertainty and calibration", "uncertainty"),
    "tfbnn.ensembles": ("Deep ensembles", "ensembles"),
    "tfbnn.laplace": ("Post-hoc uncertainty: Laplace, SWAG and HMC", "laplace"),
    "tfbnn.swag": ("Post-hoc uncertainty: Laplace, SWAG and HMC", "laplace"),
    "tfbnn.hmc": ("Post-hoc uncertainty: Laplace, SWAG and HMC", "laplace"),
    "tfbnn.layers.rank1": ("Deep ensembles", "ensembles"),
    "tfbnn.experiments.posterior_comparison": ("Posterior comparison", "posterior-comparison"),
    "tfbnn.continual": ("Continual learning", "continual"),
    "tfbnn.experiments.vcl_split_digits": ("Continual learning", "continual"),
    "tfbnn.layers.variational_dropout": ("Variational dropout, pruning and conversion", "variational-dropout"),
    "tfbnn.layers.graves": ("Variational dropout, pruning and conversion", "variational-dropout"),
    "tfbnn.pruning": ("Variational dropout, pruning and conversion", "variational-dropout"),
    "tfbnn.convert": ("Variational dropout, pruning and conversion", "variational-dropout"),
    "tfbnn.ibnn": ("Node-based implicit BNNs (iBNN)", "ibnn"),
    "tfbnn.layers.node": ("Node-based implicit BNNs (iBNN)", "ibnn"),
    "tfbnn.layers.recurrent": ("Recurrent layers and the sentiment classifier", "recurrent"),
    "tfbnn.models.recurrent": ("Recurrent layers and the sentiment classifier", "recurrent"),
    "tfbnn.methods": ("Model zoo and recipes", "zoo-and-recipes"),
    "tfbnn.models": ("Model zoo and recipes", "zoo-and-recipes"),
    "tfbnn.training": ("Model zoo and recipes", "zoo-and-recipes"),
    "tfbnn.experiments": ("Model zoo and recipes", "zoo-and-recipes"),
    "tfbnn.tuning": ("Tuning", "tuning"),
    "tfbnn.export": ("Deployment", "deployment"),
}


def public_modules(root):
    """Dotted names of the package's public modules and subpackages, sorted."""
    names = []
    for folder, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in files:
            if not name.endswith(".py") or name == "__main__.py":
                continue
            if name.startswith("_") and name != "__init__.py":
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)[:-3]
            names.append(rel.replace(os.sep, ".").removesuffix(".__init__"))
    return sorted(names)


def guide_of(module):
    """(title, page) of the guide for ``module``: its own entry, else its nearest package's; or None."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in GUIDES:
            return GUIDES[".".join(parts[:n])]
    return None


def api_page(module):
    """The Markdown of ``module``'s API page: a link to its guide, then the mkdocstrings directive."""
    guide = guide_of(module)
    link = f"User guide: [{guide[0]}](../guides/{guide[1]}.md)\n\n" if guide else ""
    return f"{link}::: {module}\n"


def on_config(config):
    root = os.path.dirname(config.config_file_path)
    if config["nav"] is not None:
        config["nav"].append({"API reference": [{m: f"api/{m}.md"} for m in public_modules(root)]})
    return config


def on_files(files, config):
    root = os.path.dirname(config.config_file_path)
    for module in public_modules(root):
        files.append(File.generated(config, f"api/{module}.md", content=api_page(module)))
    with open(os.path.join(root, BENCHMARKS), encoding="utf-8") as f:
        files.append(File.generated(config, BENCHMARKS_PAGE, content=f.read()))
    return files
