"""The package's layering: ground -> core -> models/datasets -> training -> tuning/experiments -> cli.

Checked on the source (an import graph built from every module's imports, including
imports inside functions) and in fresh processes (what `import tfbnn` loads). An import
inside a function is listed with its reason (:data:`FUNCTION_LOCAL_IMPORTS`): all others
stand at the top of their module.
"""

import ast
import functools
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfbnn")

# Layer of each module or package (a module not listed belongs to its package's layer).
LAYERS = {
    "tfbnn._internal": 0,
    "tfbnn.priors": 1, "tfbnn.posteriors": 1, "tfbnn.kl": 1, "tfbnn.layers": 1, "tfbnn.schedules": 1, "tfbnn.callbacks": 1,
    "tfbnn.inference": 1, "tfbnn.metrics": 1, "tfbnn.calibration": 1, "tfbnn.utils": 1, "tfbnn.likelihoods": 1, "tfbnn.evidential": 1,
    "tfbnn.pruning": 1, "tfbnn.convert": 1, "tfbnn.export": 1, "tfbnn.distribute": 1, "tfbnn.ibnn": 1, "tfbnn.ensembles": 1, "tfbnn.continual": 1,
    "tfbnn.laplace": 1, "tfbnn.hub": 1, "tfbnn.lora": 1, "tfbnn.swag": 1, "tfbnn.hmc": 1, "tfbnn.sgmcmc": 1,
    "tfbnn.conformal": 1,
    "tfbnn.moments": 1, "tfbnn.sngp": 1, "tfbnn.ddu": 1, "tfbnn.methods": 1,
    "tfbnn.plots": 1, "tfbnn.testing": 1, "tfbnn.evaluation": 2,
    "tfbnn.models": 2, "tfbnn.datasets": 2,
    "tfbnn.training": 3,
    "tfbnn.tuning": 4, "tfbnn.experiments": 4,
    "tfbnn.cli": 5,
}


# -- imports inside functions ---------------------------------------------------------------------
# A module imports at its top unless that costs start-up time where start-up must stay short:
# `import tfbnn` (no KerasTuner, no plotting module), and the `tfbnn` command's parsers, which
# answer `--help` and a bad option before any numeric library loads (tests/cli/test_commands.py and
# test_the_commands_load_no_numeric_library_before_they_run below). What those light modules
# import at their top: the standard library, `tfbnn` itself, the package-wide plumbing
# (tfbnn._internal's argtypes, files, errors), tfbnn.training (the recipes; the runner's Keras
# side is imported inside its functions) and the tfbnn.datasets package (the catalog).


def _command(name):
    return (f"start-up time of `tfbnn {name} --help`: the command's module loads no TensorFlow, Keras or NumPy; "
            "they load after the arguments parsed")


def _study(name):
    return (f"start-up time of `tfbnn {name} --help`, which imports the study's module: NumPy, TensorFlow, Keras, "
            "matplotlib and the core load when the study runs")


_STUDIES = ("start-up time of `tfbnn <study> --help`: the studies' shared module loads no NumPy or TensorFlow; "
            "they load when a study runs")
_TRAINING = ("start-up time of `tfbnn train/tune/run/recipes --help`: they import tfbnn.training (the recipe "
             "vocabulary), whose package imports this module; TensorFlow, Keras and the core load when a run starts")
_CATALOG = ("start-up time of `tfbnn train/evaluate/tune --help`: they read this package's catalog of names, which "
            "loads no NumPy; the loaders load on first use")
_REGISTRY = ("the method registry loads no TensorFlow (recipes and the command's parsers read it); a built-in "
             "method's function imports the core when a model is built or trained")
_PLOTS = "matplotlib only when plotting: `import tfbnn` loads no tfbnn.plots (the core may not import it at its top)"
_TFDS = ("tensorflow-datasets (seconds to import) loads only when a tfds dataset is asked for; the offline "
         "datasets never need it")

#: (path, qualified name of the function) -> why it imports inside its body. A function listed
#: here may hold several such imports; test_function_local_imports_are_listed keeps it exact.
FUNCTION_LOCAL_IMPORTS = {
    ("tfbnn/_internal/startup.py", "import_tensorflow_quietly"):
        "the function's purpose: TensorFlow imported after the arguments parsed, its start-up log filtered",
    ("tfbnn/_internal/keras_private.py", "in_xla_context"):
        "a TensorFlow-internal module that may be missing (then False)",
    ("tfbnn/_internal/keras_private.py", "calling_model"):
        "Keras' call context, a private module that may move (then None)",
    ("tfbnn/_internal/keras_private.py", "philox_key_counter"):
        "a TensorFlow-internal module, used only while XLA compiles a layer's draws",
    ("tfbnn/_internal/keras_private.py", "keras_test_case"):
        "Keras' test utilities, loaded only for the conformance harness's Keras checks",
    ("tfbnn/pruning.py", "write_pruning_curve"): _PLOTS,
    ("tfbnn/callbacks.py", "PosteriorBoard._reliability_image"): _PLOTS,
    ("tfbnn/datasets/__init__.py", "_loader"): _CATALOG,
    ("tfbnn/datasets/__init__.py", "load_images"): _CATALOG,
    ("tfbnn/datasets/_tfds.py", "_data_dir"): _TFDS,
    ("tfbnn/datasets/_tfds.py", "load_train_test"): _TFDS,
    ("tfbnn/training/recipe.py", "Recipe.to_dict"): _TRAINING,
    **{("tfbnn/methods.py", name): _REGISTRY for name in (
        "layer_class", "_multi_sample_model", "_check_bbb", "_check_vd", "_check_ibnn", "_ibnn_layer_kwargs", "_ibnn_sample_model", "_ibnn_eval_samples",
        "_ibnn_optimizer", "_check_sngp", "_sngp_callbacks", "_softmax_head", "_evidential_head", "_evidential_loss",
        "_evidential_callbacks", "_heteroscedastic_head", "_check_csgmcmc", "_csgmcmc_sampler", "_csgmcmc_callbacks",
        "_csgmcmc_finish")},
    **{("tfbnn/training/run.py", name): _TRAINING for name in (
        "_is_mlp", "build_model", "convert_model", "fixed_noise_gaussian_nll", "_compile", "_fit", "arrays",
        "fit_temperature", "_evaluate_regression", "_evaluate", "_member_data", "_train_ensemble",
        "_element_spec", "_train", "_copy", "_write_outputs", "_is_chief", "run", "_classifier_metrics", "_density",
        "_own_score", "_board_callbacks", "_jit")},
    ("tfbnn/testing.py", "_tfbnn"): "the conformance harness reads the whole package's public names (a floor above)",
    ("tfbnn/testing.py", "export_and_serve"): "tfbnn.export is a floor above: loaded when an export check runs",
    ("tfbnn/testing.py", "check_export_refused"): "tfbnn.export is a floor above: loaded when an export check runs",
    ("tfbnn/models/kerashub.py", "_keras_hub"):
        "keras-hub is the optional [hub] extra: imported only when a KerasHub zoo model is built",
    ("tfbnn/export.py", "_onnx_model"): "tf2onnx is the optional [export] extra; the other formats work without it",
    ("tfbnn/cli/evaluate.py", "load_model"): _command("evaluate"),
    ("tfbnn/cli/evaluate.py", "_splits"): _command("evaluate"),
    ("tfbnn/cli/evaluate.py", "_temperature"): _command("evaluate"),
    ("tfbnn/cli/evaluate.py", "_validation_prediction"): _command("evaluate"),
    ("tfbnn/cli/evaluate.py", "_conformal_numbers"): _command("evaluate"),
    ("tfbnn/cli/evaluate.py", "_num_samples"): _command("evaluate"),
    ("tfbnn/cli/evaluate.py", "run"): _command("evaluate"),
    ("tfbnn/cli/export.py", "_output_layer"): _command("export"),
    ("tfbnn/cli/export.py", "model_task"): _command("export"),
    ("tfbnn/cli/export.py", "run"): _command("export"),
    ("tfbnn/cli/train.py", "_not_applicable"): _command("train"),
    ("tfbnn/cli/train.py", "run"): _command("train"),
    **{("tfbnn/cli/tune.py", name): _command("tune") + " (tfbnn.tuning: KerasTuner and TensorFlow)" for name in (
        "_space", "_report", "run", "_launch", "_space_names", "_run_search")},
    **{("tfbnn/cli/laplace.py", name): _command("laplace") for name in (
        "_load_npz", "_load_named", "_likelihood", "_progress", "_evaluate", "run")},
    **{("tfbnn/experiments/posterior_comparison.py", name):
        _study("posterior-comparison") + " (its numeric side, tfbnn.experiments._posterior_study)"
        for name in ("train", "analyse")},
    **{("tfbnn/experiments/shift_benchmark.py", name):
        _study("shift-benchmark") + " (its numeric side, tfbnn.experiments._shift_benchmark)"
        for name in ("_validate", "train", "analyse")},
    **{("tfbnn/experiments/kerashub_finetune.py", name):
        _study("kerashub-finetune") + " (its numeric side, tfbnn.experiments._kerashub_finetune)"
        for name in ("train", "analyse")},
    ("tfbnn/experiments/_kerashub_finetune.py", "build_task"):
        "keras-hub is the optional [hub] extra: imported only when a KerasHub model is built",
    ("tfbnn/experiments/_common.py", "quiet_tensorflow"): _STUDIES,
    ("tfbnn/experiments/_common.py", "array_pipeline"): _STUDIES,
    ("tfbnn/experiments/_study.py", "Setting._one"):
        _STUDIES + " (the settings' checks are tfbnn._internal.checks, which loads TensorFlow; the recipe class)",
    **{("tfbnn/experiments/ibnn_lenet.py", name): _study("ibnn-lenet") for name in (
        "build_lenet", "_evaluate", "_train_and_evaluate", "_plot")},
    **{("tfbnn/experiments/ibnn_regression.py", name): _study("ibnn-regression") for name in (
        "make_data", "build_model", "make_pipeline", "_evaluate", "_plot", "train")},
    **{("tfbnn/experiments/ibnn_shift.py", name): _study("ibnn-shift") for name in ("build_mlp", "train", "analyse")},
    **{("tfbnn/experiments/uncertainty_comparison.py", name): _study("uncertainty-comparison") for name in (
        "_row", "_figure", "train", "analyse")},
    **{("tfbnn/experiments/vcl_split_digits.py", name): _study("vcl-split-digits") for name in (
        "split_tasks", "_masked_crossentropy", "_Network.__init__", "_fit", "_probabilities", "_evaluate",
        "run_sequence", "_summaries", "_mean_std", "_markdown", "_grid", "_plot", "train")},
    **{("tfbnn/experiments/vd_regression.py", name): _study("vd-regression") for name in (
        "build_model", "_recipe", "_pipeline", "_evaluate", "_plot", "_validate", "_data", "train", "analyse")},
    **{("tfbnn/experiments/vd_sparsity.py", name): _study("vd-sparsity") for name in (
        "build_model", "mc_accuracy", "_validate", "_accuracy_vs_samples", "_summarise", "_storage", "_sweep",
        "_plot", "train", "analyse")},
    ("tfbnn/experiments/vd_transformer.py", "__getattr__"):
        _study("vd-transformer") + " (the zoo's builder under its old name here, loaded on first use)",
    **{("tfbnn/experiments/vd_transformer.py", name): _study("vd-transformer") for name in (
        "_load", "_vectorize", "_evaluate", "_plot", "_validate", "train")},
}


#: The modules that must stay TensorFlow-free: the ones the `tfbnn` command imports to parse
#: its arguments (every command's ``--help``), before ``tfbnn/__init__.py`` and TensorFlow load.
#: At their top they import the standard library and each other only (NumPy, TensorFlow, Keras,
#: matplotlib, KerasTuner, scikit-learn and tensorflow-datasets load inside functions, listed
#: above). Checked three ways below: statically, in a fresh process, and for completeness.
TENSORFLOW_FREE = (
    "tfbnn._internal", "tfbnn._internal.allocator", "tfbnn._internal.argtypes", "tfbnn._internal.backend", "tfbnn._internal.deprecation",
    "tfbnn._internal.errors", "tfbnn._internal.files", "tfbnn._internal.startup", "tfbnn._internal.version",
    "tfbnn.cli", "tfbnn.cli.evaluate", "tfbnn.cli.export", "tfbnn.cli.laplace", "tfbnn.cli.recipes", "tfbnn.cli.run",
    "tfbnn.cli.train", "tfbnn.cli.tune",
    "tfbnn.datasets", "tfbnn.datasets.catalog",
    "tfbnn.experiments", "tfbnn.experiments._common", "tfbnn.experiments._study", "tfbnn.experiments.ibnn_lenet",
    "tfbnn.experiments.kerashub_finetune",
    "tfbnn.experiments.ibnn_regression", "tfbnn.experiments.ibnn_shift", "tfbnn.experiments.posterior_comparison",
    "tfbnn.experiments.shift_benchmark", "tfbnn.experiments.uncertainty_comparison", "tfbnn.experiments.vcl_split_digits",
    "tfbnn.experiments.vd_regression", "tfbnn.experiments.vd_sparsity", "tfbnn.experiments.vd_transformer",
    "tfbnn.methods", "tfbnn.training", "tfbnn.training.recipe", "tfbnn.training.recipes", "tfbnn.training.run",
)
_HEAVY_LIBRARIES = ("numpy", "tensorflow", "keras", "matplotlib", "keras_tuner", "sklearn", "tensorflow_datasets",
                    "tensorflow_probability", "scipy")


def _top_level_imports(path):
    """The modules imported at the top of the module at ``path`` (outside functions; ``try`` blocks included)."""
    found = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.extend(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0:
                found.extend([child.module] + [f"{child.module}.{alias.name}" for alias in child.names])
            visit(child)

    visit(ast.parse(open(path).read()))
    return found


def test_the_tensorflow_free_modules_import_only_the_standard_library_and_each_other_at_their_top():
    modules = dict(_modules())
    offenders = []
    for module in TENSORFLOW_FREE:
        for name in _top_level_imports(modules[module]):
            if name.split(".")[0] in _HEAVY_LIBRARIES:
                offenders.append(f"{module} imports {name}")
            elif name.startswith("tfbnn.") and name in modules and name not in TENSORFLOW_FREE:
                offenders.append(f"{module} imports {name}, which is not TensorFlow-free")
    assert not offenders, "\n".join(offenders)


def test_the_list_is_every_module_the_command_loads_to_parse():
    """Every command's --help, run through the entry point: the tfbnn modules loaded are the listed ones."""
    code = ("import contextlib, io, sys, _tfbnn_command\nfrom tfbnn.cli import COMMANDS, main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    codes = [main([name, '--help']) for name in COMMANDS]\n"
            "assert set(codes) == {0}, codes\nprint(sorted(m for m in sys.modules if m.startswith('tfbnn.')))")
    assert _fresh(code) == str(sorted(TENSORFLOW_FREE))


def test_one_import_mode_import_tfbnn_always_loads_the_core():
    """``tfbnn/__init__.py`` has no branch on who imports it; the command's entry point defers running it
    (the parse above loads no TensorFlow) and then runs it in the same module object."""
    init = os.path.join(ROOT, "__init__.py")
    assert "sys" not in _top_level_imports(init) and "DEFER_CORE" not in open(init).read()
    code = ("import sys, _tfbnn_command; import tfbnn; before = 'tensorflow' in sys.modules; "
            "module = sys.modules['tfbnn']; from tfbnn._internal import startup; startup.complete_package_import(); "
            "import tfbnn.layers; "
            "print(before, sys.modules['tfbnn'] is module, 'tensorflow' in sys.modules, callable(tfbnn.predict), "
            "tfbnn.layers.DenseFlipout.__name__, tfbnn.__version__)")
    assert _fresh(code) == "False True True True DenseFlipout 0.1.0"
    report = _fresh_import("tfbnn")
    assert (report["tensorflow"], report["layers"]) == (True, True)


def _layer(module):
    """The layer of ``module``'s longest dotted prefix in LAYERS (None: unlisted)."""
    prefixes = (module.rsplit(".", k)[0] for k in range(module.count(".") + 1))
    return next((LAYERS[p] for p in prefixes if p in LAYERS), None)


def _modules():
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), path


def _imports(path, module):
    """(imported module, imported names) pairs of a file, relative imports resolved."""
    tree = ast.parse(open(path).read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            yield base, tuple(a.name for a in node.names)


def _graph():
    graph = {}
    for module, path in _modules():
        deps = set()
        for target, names in _imports(path, module):
            if not target.startswith("tfbnn"):
                continue
            deps.add(target)
            deps.update(f"{target}.{n}" for n in names if f"{target}.{n}".replace(".", os.sep) and
                        os.path.exists(os.path.join(os.path.dirname(ROOT), *f"{target}.{n}".split(".")) + ".py"))
        graph[module] = deps
    return graph


def test_no_module_imports_a_higher_layer():
    wrong = []
    for module, deps in _graph().items():
        mine = _layer(module)
        for dep in deps:
            theirs = _layer(dep)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{module} (layer {mine}) imports {dep} (layer {theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def test_nothing_imports_the_command_line():
    users = [m for m, deps in _graph().items() if not m.startswith("tfbnn.cli")
             and any(d == "tfbnn.cli" or d.startswith("tfbnn.cli.") for d in deps)]
    assert users == []


def test_no_module_imports_another_modules_private_name():
    private = []
    for module, path in _modules():
        # A package's own __init__ belongs to it: it may re-export its private modules' names.
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        for target, names in _imports(path, module):
            if not target.startswith("tfbnn"):
                continue
            # A package's private helper module (models/_common.py) serves its own package only.
            submodules = [n for n in names if os.path.exists(os.path.join(os.path.dirname(ROOT),
                                                                          *target.split("."), n + ".py"))]
            hidden = [n for n in names if n.startswith("_") and n != "__version__"
                      and not (n in submodules and target == package)]
            parts = [p for p in target.split(".") if p.startswith("_")]
            if target == "tfbnn._internal" or target.startswith("tfbnn._internal."):
                parts = []  # the package-wide plumbing: any tfbnn module may use it
            if hidden or (parts and target.rsplit(".", 1)[0] != package):
                private.append(f"{module}: from {target} import {', '.join(names)}")
    assert not private, "\n".join(sorted(private))


def test_the_package_import_graph_has_no_cycle_between_layers_of_packages():
    """Cycles inside one package are allowed (lazy imports); across the top-level packages none."""
    graph = _graph()
    top = {}
    for module, deps in graph.items():
        a = ".".join(module.split(".")[:2])
        top.setdefault(a, set()).update(".".join(d.split(".")[:2]) for d in deps if d.startswith("tfbnn."))
    for a in top:
        top[a].discard(a)
        top[a].discard("tfbnn")
    seen, stack = {}, []

    def visit(node):
        seen[node] = "open"
        stack.append(node)
        for nxt in sorted(top.get(node, ())):
            if seen.get(nxt) == "open":
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = "done"

    for node in sorted(top):
        if node not in seen:
            visit(node)


def _fresh(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


#: The modules a plain import must not load: the tuner, plotting, the command line and the studies.
_NOT_ON_IMPORT = ("keras_tuner", "tfbnn.plots", "tfbnn.tuning", "tfbnn.cli", "tfbnn.evaluation", "tfbnn.experiments",
                  "tfbnn.training")


@functools.lru_cache(maxsize=None)
def _fresh_import(module):
    """What ``import <module>`` does in a fresh process: which of _NOT_ON_IMPORT it loaded, whether it
    loaded TensorFlow and whether ``tfbnn.layers`` is then an attribute of the package. One process per
    module and worker, shared by the tests that read it (a fresh ``import tfbnn`` costs 10-25 s here)."""
    code = (f"import json, sys, {module}; import tfbnn; print(json.dumps({{'loaded': sorted(m for m in "
            f"{_NOT_ON_IMPORT!r} if m in sys.modules), 'tensorflow': 'tensorflow' in sys.modules, "
            f"'layers': 'layers' in vars(tfbnn)}}))")
    return json.loads(_fresh(code))


def test_import_tfbnn_loads_no_tuner_no_plots_no_cli():
    # keras itself imports matplotlib when it is installed; tfbnn adds no plotting module of its own.
    assert _fresh_import("tfbnn")["loaded"] == []


def test_import_tfbnn_layers_loads_no_tuner_and_no_cli():
    assert _fresh_import("tfbnn.layers")["loaded"] == []


def test_the_command_parses_without_tensorflow_and_lists_recipes_lazily():
    code = ("import sys, _tfbnn_command; import tfbnn.cli, tfbnn.training.recipes, tfbnn.datasets.catalog; "
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    assert _fresh(code) == "False False"


def test_one_list_of_dataset_names():
    """No module but the catalog spells out a tuple of dataset names."""
    import re

    pattern = re.compile(r"\(\s*\"digits\",\s*\"(moons|mnist|fashion_mnist)\"")
    offenders = [m for m, path in _modules() if m != "tfbnn.datasets.catalog" and pattern.search(open(path).read())]
    assert offenders == []


def _is_module(name):
    base = os.path.join(os.path.dirname(ROOT), *name.split("."))
    return os.path.exists(base + ".py") or os.path.exists(os.path.join(base, "__init__.py"))


def _module_names(tree, module, path):
    """Names a file binds to tfbnn modules: ``import tfbnn.x as y``, ``from tfbnn.x import y`` (a module)."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tfbnn"):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "tfbnn"
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if base.startswith("tfbnn") and _is_module(f"{base}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def test_no_module_reads_another_modules_private_name_as_an_attribute():
    """``from tfbnn import pruning; pruning._helper(...)`` is the same breach as importing ``_helper``."""
    private = []
    for module, path in _modules():
        tree = ast.parse(open(path).read())
        bound = _module_names(tree, module, path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if not isinstance(value, ast.Name) or value.id not in bound:
                continue
            target = bound[value.id]
            for part in chain:  # tfbnn.inference.x: follow the submodules
                if not _is_module(f"{target}.{part}"):
                    target = None
                    break
                target = f"{target}.{part}"
            if target is not None and target != module:
                private.append(f"{module}:{node.lineno}: {target}.{node.attr}")
    assert not private, "\n".join(sorted(private))


def _function_local_imports():
    """``{(path, qualified name of the function): [line, ...]}`` of the imports inside functions of tfbnn/."""
    found = {}

    def visit(node, rel, scope, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, rel, scope + [child.name], in_function or not isinstance(child, ast.ClassDef))
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.setdefault((rel, ".".join(scope)), []).append(child.lineno)
            visit(child, rel, scope, in_function)

    for _, path in _modules():
        rel = os.path.relpath(path, os.path.dirname(ROOT)).replace(os.sep, "/")
        visit(ast.parse(open(path).read()), rel, [], False)
    return found


def test_function_local_imports_are_listed():
    """Every import inside a function is in FUNCTION_LOCAL_IMPORTS with its reason, and every entry still has one."""
    found = _function_local_imports()
    unlisted = [f"{path}:{line} in {name}" for (path, name), lines in sorted(found.items())
                if (path, name) not in FUNCTION_LOCAL_IMPORTS for line in lines]
    assert not unlisted, ("imports inside functions that FUNCTION_LOCAL_IMPORTS does not list: import at the top "
                          "of the module, or list the function and why:\n" + "\n".join(unlisted))
    stale = [f"{path}: {name}" for path, name in sorted(FUNCTION_LOCAL_IMPORTS) if (path, name) not in found]
    assert not stale, "FUNCTION_LOCAL_IMPORTS lists functions that import nothing any more:\n" + "\n".join(stale)
    assert all(isinstance(why, str) and why.strip() for why in FUNCTION_LOCAL_IMPORTS.values())


def test_the_commands_load_no_numeric_library_before_they_run():
    """What the reasons of FUNCTION_LOCAL_IMPORTS claim: every TensorFlow-free module (:data:`TENSORFLOW_FREE`:
    the command table's modules, the studies, tfbnn.training, the registry and the dataset catalog), imported
    in a fresh process through the command's entry point, loads no NumPy, TensorFlow, Keras, TensorFlow
    Probability, SciPy, matplotlib, KerasTuner, scikit-learn or tensorflow-datasets."""
    code = ("import importlib, sys, _tfbnn_command; "
            f"[importlib.import_module(m) for m in {TENSORFLOW_FREE!r}]; "
            f"print(sorted(m for m in {_HEAVY_LIBRARIES!r} if m in sys.modules))")
    assert _fresh(code) == "[]"
