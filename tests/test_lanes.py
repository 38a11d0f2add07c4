"""The two lanes of the suite: the full run (the README's command, CI) and the fast lane.

The fast lane, ``python -m pytest -q -n 2 -m "not heavy and not slow"``, leaves out the tests
marked ``heavy`` and those listed in ``tests/slow_tests.txt`` (``conftest.py`` marks them
``slow``). A listed name must name a test that exists, or the list would silently shrink the
lane's exclusions to nothing.
"""

import ast
import os

import pytest

from conftest import pytest_collection_modifyitems, slow_tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _test_functions(path):
    """The names of the test functions defined at the top of the module at ``path``."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_listed_slow_test_exists():
    listed = slow_tests()
    assert len(listed) > 10
    for entry in sorted(listed):
        path, _, name = entry.partition("::")
        assert os.path.isfile(os.path.join(ROOT, path)), entry
        assert name in _test_functions(path), f"tests/slow_tests.txt lists {entry}, which does not exist"


def test_the_hook_marks_the_listed_tests_and_their_parameters_only():
    class Item:
        def __init__(self, nodeid):
            self.nodeid, self.markers = nodeid, []

        def add_marker(self, marker):
            self.markers.append(marker.name)

    listed = sorted(slow_tests())[0]
    items = [Item(listed), Item(listed + "[a-1]"), Item(listed + "_not"), Item("tests/test_lanes.py::test_x")]
    pytest_collection_modifyitems(None, items)
    assert [item.markers for item in items] == [["slow"], ["slow"], [], []]


@pytest.mark.parametrize("marker", ["heavy", "slow"])
def test_the_markers_are_declared(request, marker):
    assert any(line.startswith(f"{marker}:") for line in request.config.getini("markers")), marker
