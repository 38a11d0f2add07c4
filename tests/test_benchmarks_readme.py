"""The benchmarks write their own tables into benchmarks/README.md (``--write-readme``).

Tests the shared writer (``benchmarks/_readme.py``) on temporary files, without running
a benchmark: the table between a benchmark's markers is replaced, every other byte of
the file stays, a failed write leaves the old file, and every benchmark script has its
markers and writes through the helper.
"""

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def _writer():
    spec = importlib.util.spec_from_file_location("benchmarks_readme", os.path.join(BENCHMARKS, "_readme.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HEAD = "# Benchmarks\n\nText that names `<!-- BEGIN name -->` inline is prose.\n\n"
FIRST = "<!-- BEGIN first -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- END first -->\n"
MIDDLE = "\nWhat the first table shows.\n\n"
SECOND = "<!-- BEGIN second -->\n| c |\n|---|\n| 3 |\n<!-- END second -->\n"
TAIL = "\nThe end, no newline after this"


def _file(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(HEAD + FIRST + MIDDLE + SECOND + TAIL, encoding="utf-8")
    return path


def test_write_table_replaces_only_between_its_markers(tmp_path):
    path = _file(tmp_path)
    _writer().write_table("first", "| x |\n|---|\n| 9.5 |\n| 10.0 |\n", path=str(path))
    new_first = "<!-- BEGIN first -->\n| x |\n|---|\n| 9.5 |\n| 10.0 |\n<!-- END first -->\n"
    assert path.read_text(encoding="utf-8") == HEAD + new_first + MIDDLE + SECOND + TAIL
    assert os.listdir(tmp_path) == ["README.md"]  # no temporary file left behind
    # Writing again with the same table changes nothing; the other table is independent.
    _writer().write_table("second", "| c |\n|---|\n| 4 |", path=str(path))
    assert path.read_text(encoding="utf-8") == (
        HEAD + new_first + MIDDLE + "<!-- BEGIN second -->\n| c |\n|---|\n| 4 |\n<!-- END second -->\n" + TAIL)


@pytest.mark.parametrize("text,count", [
    (HEAD + MIDDLE, 0),                                      # no markers
    (HEAD + FIRST + FIRST, 2),                               # repeated
    (HEAD + "<!-- END first -->\n<!-- BEGIN first -->\n", 0),  # out of order
])
def test_missing_or_repeated_markers_raise_and_leave_the_file(tmp_path, text, count):
    path = tmp_path / "README.md"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(
            f"Expected one `<!-- BEGIN first -->` ... `<!-- END first -->` block in the benchmarks README. "
            f"Received: name='first' ({count} blocks)")):
        _writer().write_table("first", "| x |", path=str(path))
    assert path.read_text(encoding="utf-8") == text


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = _file(tmp_path)
    writer = _writer()

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(writer.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        writer.write_table("first", "| x |", path=str(path))
    assert path.read_text(encoding="utf-8") == HEAD + FIRST + MIDDLE + SECOND + TAIL
    assert os.listdir(tmp_path) == ["README.md"]


def test_every_benchmark_writes_its_table_between_its_markers():
    scripts = sorted(f[:-3] for f in os.listdir(BENCHMARKS) if f.endswith(".py") and not f.startswith("_"))
    with open(os.path.join(BENCHMARKS, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert len(scripts) >= 8, scripts
    for name in scripts:
        with open(os.path.join(BENCHMARKS, f"{name}.py"), encoding="utf-8") as f:
            source = f.read()
        assert "_readme.add_flag(parser)" in source, name
        # Directly, or through _results.finish (table, JSON and README in one call).
        assert f'_readme.write_table("{name}", ' in source or f'finish("{name}", ' in source, name
        # The README's block for it parses (one block) and holds a table or a placeholder.
        block = re.search(rf"^<!-- BEGIN {name} -->\n(.*?)^<!-- END {name} -->$", readme, re.MULTILINE | re.DOTALL)
        assert block is not None and _writer().replace_table(readme, name, block.group(1)) == readme, name
