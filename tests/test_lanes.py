"""The two lanes of the suite: the full run (the README's command, CI) and the fast lane.

The fast lane, ``python -m pytest -q -n 2 -m "not heavy"``, leaves out the tests marked
``heavy``: the end-to-end tests marked in code, and those measured at 1.5 s or more, listed in
``tests/heavy_tests.txt`` (``conftest.py`` marks them). A listed name must name a test that exists, or the list would silently shrink the
lane's exclusions to nothing.
"""

import ast
import os

from conftest import measured_heavy_tests, pytest_collection_modifyitems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _test_functions(path):
    """The names of the test functions defined at the top of the module at ``path``."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_listed_heavy_test_exists():
    listed = measured_heavy_tests()
    assert len(listed) > 10
    for entry in sorted(listed):
        path, _, name = entry.partition("::")
        assert os.path.isfile(os.path.join(ROOT, path)), entry
        assert name in _test_functions(path), f"tests/heavy_tests.txt lists {entry}, which does not exist"


def test_the_hook_marks_the_listed_tests_and_their_parameters_only():
    class Item:
        def __init__(self, nodeid):
            self.nodeid, self.markers = nodeid, []

        def add_marker(self, marker):
            self.markers.append(marker.name)

    listed = sorted(measured_heavy_tests())[0]
    items = [Item(listed), Item(listed + "[a-1]"), Item(listed + "_not"), Item("tests/test_lanes.py::test_x")]
    pytest_collection_modifyitems(None, items)
    assert [item.markers for item in items] == [["heavy"], ["heavy"], [], []]


def test_the_heavy_marker_is_declared_and_the_fast_lane_needs_no_other(request):
    declared = [line.split(":", 1)[0] for line in request.config.getini("markers")]
    assert "heavy" in declared and "slow" not in declared, declared


def test_the_tests_mirror_the_package():
    """tests/<sub>/ for each subpackage tfbnn/<sub>/ that has tests, and no other folder; every module of
    tfbnn/layers/ has tests/layers/test_<module>.py (a folder may hold more files, by topic)."""
    package, tests = os.path.join(ROOT, "tfbnn"), os.path.join(ROOT, "tests")
    folders = {d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d)) and d not in ("fixtures", "__pycache__")}
    subpackages = {d for d in os.listdir(package) if os.path.isfile(os.path.join(package, d, "__init__.py"))}
    assert folders <= subpackages, folders - subpackages
    assert {"layers", "models", "training", "experiments", "cli", "datasets", "inference"} <= folders
    modules = {f[:-3] for f in os.listdir(os.path.join(package, "layers")) if f.endswith(".py") and f != "__init__.py"}
    missing = sorted(m for m in modules if not os.path.isfile(os.path.join(tests, "layers", f"test_{m}.py")))
    assert not missing, f"tfbnn/layers modules without tests/layers/test_<module>.py: {missing}"
    basenames = [f for _, _, files in os.walk(tests) for f in files if f.startswith("test_") and f.endswith(".py")]
    assert len(basenames) == len(set(basenames)), "two test files share a name (pytest imports them by basename)"


def test_module_level_generators_are_restarted_at_every_test():
    """A NumPy generator at a test module's top is shared by its tests, so a test's data would
    depend on the order the tests ran in (xdist, -k). conftest.py restarts the generators named in
    MODULE_RNG_NAMES before each test; one under another name would not be."""
    from conftest import MODULE_RNG_NAMES

    shared = []
    for folder, _, names in os.walk(os.path.join(ROOT, "tests")):
        for name in names:
            if not (name.startswith("test_") and name.endswith(".py")):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                        and ast.unparse(node.value.func).endswith("default_rng"):
                    shared += [(os.path.relpath(path, ROOT), t.id) for t in node.targets
                               if isinstance(t, ast.Name) and t.id not in MODULE_RNG_NAMES]
    assert not shared, f"name these generators one of {MODULE_RNG_NAMES} (or make them per test): {shared}"
