"""Writes a benchmark's table into ``benchmarks/README.md``, between its markers.

Each script's table sits in the README between the lines ``<!-- BEGIN name -->`` and
``<!-- END name -->``; run with ``--write-readme`` a script replaces what is between
them with the table it measured and leaves the rest of the file as it was. The file
is replaced atomically (a temporary file in the same folder, then ``os.replace``), so
an interrupted run leaves the old README, never half a new one.
"""

import os
import re
import tempfile

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")


def add_flag(parser):
    """Adds ``--write-readme`` to a benchmark's argument parser."""
    parser.add_argument("--write-readme", action="store_true",
                        help="also write the table into benchmarks/README.md, between this benchmark's markers")


def replace_table(text, name, table):
    """``text`` with the lines between ``name``'s markers replaced by ``table``.

    Raises ValueError when the markers are missing, repeated or out of order.
    """
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    pattern = re.compile(rf"^{re.escape(begin)}\n.*?^{re.escape(end)}$", re.MULTILINE | re.DOTALL)
    found = pattern.findall(text)
    if len(found) != 1:
        raise ValueError(f"Expected one `{begin}` ... `{end}` block in the benchmarks README. "
                         f"Received: name={name!r} ({len(found)} blocks)")
    return pattern.sub(lambda _: f"{begin}\n{table.strip()}\n{end}", text)


def write_table(name, table, path=README):
    """Replaces ``name``'s table in ``path`` (default ``benchmarks/README.md``) atomically."""
    with open(path, encoding="utf-8") as f:
        text = replace_table(f.read(), name, table)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".README.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"wrote the {name} table into {path}")
