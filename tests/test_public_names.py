"""The public names of ``tfbnn``: one list (``tfbnn.__all__``), every name resolves,
and its submodules are the package's public modules that the API reference documents.
"""

import importlib
import os
import subprocess
import sys
import types

import pytest

import tfbnn

pytest.importorskip("mkdocs", reason="the API reference's page list needs mkdocs (the [dev] extra)")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "docs"))
import api_pages  # noqa: E402

sys.path.pop(0)


def test_every_name_in_all_resolves():
    assert len(tfbnn.__all__) == len(set(tfbnn.__all__)), "a name listed twice"
    for name in tfbnn.__all__:
        value = getattr(tfbnn, name)
        if name in tfbnn._CORE or name in tfbnn._LAZY_MODULES:
            assert value is importlib.import_module(f"tfbnn.{name}"), name
        elif name != "__version__":
            assert value is getattr(importlib.import_module(f"tfbnn.{tfbnn._HOME[name]}"), name), name
            assert not isinstance(value, types.ModuleType), name


def test_dir_lists_every_public_name():
    assert set(tfbnn.__all__) <= set(dir(tfbnn))


def test_submodules_are_the_documented_modules():
    documented = {m.split(".")[1] for m in api_pages.public_modules(REPO) if m.count(".") >= 1}
    exported = {name for name in tfbnn.__all__ if isinstance(getattr(tfbnn, name), types.ModuleType)}
    # The command line, its studies and the layer test harness are documented, reachable as
    # attributes, and left out of __all__ (not library API: `from tfbnn import *` skips them).
    assert exported | set(tfbnn._TOOLS) == documented and not exported & set(tfbnn._TOOLS)
    assert all(getattr(tfbnn, name) is importlib.import_module(f"tfbnn.{name}") for name in tfbnn._TOOLS)


def test_star_import_binds_the_library_api_not_the_tools():
    namespace = {}
    exec("from tfbnn import *", namespace)
    assert {"layers", "predict", "training"} <= set(namespace)
    assert not {"cli", "experiments", "testing"} & set(namespace)


def test_an_unknown_name_raises_attribute_error():
    try:
        tfbnn.not_a_name
    except AttributeError as error:
        assert str(error) == "module 'tfbnn' has no attribute 'not_a_name'"
    else:
        raise AssertionError("tfbnn.not_a_name resolved")


def test_dir_does_not_load_the_lazy_modules():
    code = "import sys, tfbnn; dir(tfbnn); print(sorted(m for m in sys.modules if m.split('.')[:2] in "
    code += "[['tfbnn', n] for n in tfbnn._LAZY_MODULES]))"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("module_name,new_name", [
    ("tfbnn.training", "RECIPE_METHODS"),
    ("tfbnn.training.recipe", "RECIPE_METHODS"),
    ("tfbnn.models", "ZOO_METHODS"),
    ("tfbnn.models.methods", "ZOO_METHODS"),
    ("tfbnn.convert", "CONVERSION_METHODS"),
    ("tfbnn.calibration", "TEMPERING_METHODS"),
])
def test_the_old_methods_name_is_a_deprecated_alias(module_name, new_name):
    module = importlib.import_module(module_name)
    message = rf"^{module_name}\.METHODS is deprecated: use {module_name}\.{new_name}\.$"
    with pytest.warns(DeprecationWarning, match=message):
        old = module.METHODS
    assert old is getattr(module, new_name)
    assert "METHODS" not in module.__all__ and new_name in module.__all__


def test_the_four_method_lists_are_distinct():
    lists = [tfbnn.training.RECIPE_METHODS, tfbnn.models.ZOO_METHODS, tfbnn.convert.CONVERSION_METHODS,
             tfbnn.calibration.TEMPERING_METHODS]
    assert len({tuple(x) for x in lists}) == 4
    assert tfbnn.calibration.TEMPERING_METHODS == ("pooled", "samples")
    assert set(tfbnn.models.ZOO_METHODS) < set(tfbnn.training.RECIPE_METHODS)


def test_training_keeps_its_lazy_optimizer_helpers():
    assert tfbnn.training.make_optimizer is importlib.import_module("tfbnn.training.optim").make_optimizer
    with pytest.raises(AttributeError, match="^module 'tfbnn.training' has no attribute 'nope'$"):
        tfbnn.training.nope


@pytest.mark.parametrize("old_name,new_name", [("make_optimizer", "node_optimizer"),
                                                ("predict", "predict_per_component")])
def test_the_old_ibnn_names_are_deprecated_aliases(old_name, new_name):
    with pytest.warns(DeprecationWarning,
                      match=rf"^tfbnn\.ibnn\.{old_name} is deprecated: use tfbnn\.ibnn\.{new_name}\.$"):
        old = getattr(tfbnn.ibnn, old_name)
    assert old is getattr(tfbnn.ibnn, new_name)
    assert old_name not in tfbnn.ibnn.__all__ and new_name in tfbnn.ibnn.__all__
    assert tfbnn.predict is not tfbnn.ibnn.predict_per_component
