"""Every docstring example (``>>>``) in the tfbnn package runs as a doctest.

One test per module, found by walking the package's files, so a module added later
is checked without touching this file. Each example runs as
``python -m pytest --doctest-modules tfbnn/<module>.py -o doctest_optionflags="ELLIPSIS NORMALIZE_WHITESPACE"``
would run it: with the module's globals, ELLIPSIS and NORMALIZE_WHITESPACE, in a
fresh temporary working directory (examples may write files). Examples import
what they use themselves (``>>> import tfbnn``); there is no hidden namespace.
"""

import doctest
import importlib
import os
import re

import pytest

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfbnn")
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# A `>>>` prompt with code on it (doctest ignores prompts with only a comment).
PROMPT = re.compile(r"^\s*>>> +(?!#)\S", re.MULTILINE)


def _modules():
    """(module name, path) of every module of the package with a ``>>>`` prompt, ``__main__`` excepted."""
    found = []
    root = os.path.dirname(PACKAGE_DIR)
    for folder, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py") and name != "__main__.py":
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    if not PROMPT.search(f.read()):
                        continue
                module = os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                found.append((module, path))
    return found


MODULES = _modules()


def _doctests(module_name):
    module = importlib.import_module(module_name)
    return [test for test in doctest.DocTestFinder().find(module, module_name) if test.examples]


@pytest.mark.parametrize("module_name,path", MODULES, ids=[m for m, _ in MODULES])
def test_docstring_examples_run(module_name, path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tests = _doctests(module_name)
    # Every `>>>` prompt in the file belongs to an example the finder collected: an
    # example hidden where doctest does not look (a docstring of an object from
    # another module, a comment) would otherwise never run. (More examples than
    # prompts: a docstring template filled in for several classes.)
    with open(path, encoding="utf-8") as f:
        prompts = len(PROMPT.findall(f.read()))
    assert sum(len(t.examples) for t in tests) >= prompts, (
        f"{path}: {prompts} `>>>` prompts, but doctest found "
        f"{sum(len(t.examples) for t in tests)} examples in docstrings"
    )
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report = []
    for test in tests:
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, "".join(report)


def test_the_walk_finds_the_package():
    names = [m for m, _ in MODULES]
    assert "tfbnn.metrics" in names and "tfbnn.layers.dense" in names and "tfbnn.training" in names
    assert "tfbnn.cli.__main__" not in names and len(names) >= 30
