"""The package's layering: ground -> core -> models/datasets -> training -> tuning/experiments -> cli.

Checked on the source (an import graph built from every module's imports, including
imports inside functions) and in fresh processes (what `import tfbnn` loads).
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfbnn")

# Layer of each module or package (a module not listed belongs to its package's layer).
LAYERS = {
    "tfbnn._internal": 0,
    "tfbnn.priors": 1, "tfbnn.posteriors": 1, "tfbnn.kl": 1, "tfbnn.layers": 1, "tfbnn.schedules": 1, "tfbnn.callbacks": 1,
    "tfbnn.inference": 1, "tfbnn.metrics": 1, "tfbnn.calibration": 1, "tfbnn.utils": 1, "tfbnn.likelihoods": 1,
    "tfbnn.pruning": 1, "tfbnn.convert": 1, "tfbnn.export": 1, "tfbnn.distribute": 1, "tfbnn.ibnn": 1, "tfbnn.ensembles": 1, "tfbnn.continual": 1,
    "tfbnn.plots": 1, "tfbnn.testing": 1, "tfbnn.evaluation": 2,
    "tfbnn.models": 2, "tfbnn.datasets": 2,
    "tfbnn.training": 3,
    "tfbnn.tuning": 4, "tfbnn.experiments": 4,
    "tfbnn.cli": 5,
}


def _layer(module):
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in LAYERS:
            return LAYERS[".".join(parts[:k])]
    return None


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
        for target, names in _imports(path, module):
            if not target.startswith("tfbnn"):
                continue
            package = module.rsplit(".", 1)[0]
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


def test_import_tfbnn_loads_no_tuner_no_plots_no_cli():
    # keras itself imports matplotlib when it is installed; tfbnn adds no plotting module of its own.
    code = ("import sys, tfbnn; print(sorted(m for m in ('keras_tuner', 'tfbnn.plots', 'tfbnn.tuning', 'tfbnn.cli', "
            "'tfbnn.evaluation', 'tfbnn.experiments', 'tfbnn.training') if m in sys.modules))")
    assert _fresh(code) == "[]"


def test_import_tfbnn_layers_loads_no_tuner_and_no_cli():
    code = ("import sys, tfbnn.layers; print(sorted(m for m in ('keras_tuner', 'tfbnn.cli', 'tfbnn.plots', "
            "'tfbnn.tuning') if m in sys.modules))")
    assert _fresh(code) == "[]"


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
