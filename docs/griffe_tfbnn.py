"""Griffe extension: reads tfbnn's docstring conventions as Google style.

tfbnn's docstrings are Google style with two habits griffe does not know:

* ``Example:`` (singular) titles the examples section; griffe knows ``Examples:``
  only and would render the ``>>>`` lines as prose.
* One ``Args`` entry may document several parameters that share a description:
  ``start, end: ints, the steps where the ramp begins and ends.`` Each name is
  split into its own entry (the first keeps the description, the others point to
  it), so griffe still checks every name against the signature.

Three reStructuredText habits are rewritten for Markdown, for display only:
Sphinx roles (``:class:`KLAnnealing``` becomes code), the literal-block marker
``::`` (an indented block is code in Markdown already) and simple tables (rows
between ``=====  ====`` borders) become Markdown tables.

Everything else is left to griffe, whose warnings ``mkdocs build --strict`` turns
into errors.
"""

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ARGS_HEADER = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")
_LITERAL_MARKER = re.compile(r"(\S)::[ \t]*$|^[ \t]*::[ \t]*$", re.MULTILINE)
_BORDER = re.compile(r"^(\s*)=+(?:[ \t]+=+)+[ \t]*$")
_SHARED = re.compile(r"^(\s*)(\w+(?:\s*,\s*\w+)+)\s*:(?:\s+(.*))?$")


def _indent(line):
    return len(line) - len(line.lstrip())


def _split_shared_entries(lines):
    out, i = [], 0
    while i < len(lines):
        header = _ARGS_HEADER.match(lines[i])
        out.append(lines[i])
        i += 1
        if not header:
            continue
        section_indent = len(header.group(1))
        item_indent = None
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > section_indent):
            line = lines[i]
            if item_indent is None and line.strip():
                item_indent = _indent(line)
            shared = _SHARED.match(line) if line.strip() and _indent(line) == item_indent else None
            if not shared:
                out.append(line)
                i += 1
                continue
            names = [n.strip() for n in shared.group(2).split(",")]
            out.append(f"{shared.group(1)}{names[0]}: {shared.group(3) or ''}".rstrip())
            i += 1
            while i < len(lines) and lines[i].strip() and _indent(lines[i]) > item_indent:
                out.append(lines[i])
                i += 1
            out.extend(f"{shared.group(1)}{name}: As ``{names[0]}``." for name in names[1:])
    return out


def _columns(border):
    """(start, end) of each ``===`` run of a table border; the last column is open-ended."""
    spans = [m.span() for m in re.finditer(r"=+", border)]
    return [(start, spans[k + 1][0] if k + 1 < len(spans) else None) for k, (start, _) in enumerate(spans)]


def _table_rows(lines, columns):
    rows = []
    for line in lines:
        if not line.strip():
            continue
        cells = [line[start:end].strip() if end else line[start:].strip() for start, end in columns]
        if rows and not cells[0]:  # a continuation line: its cells extend the row above
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    return rows


def _markdown_tables(lines):
    out, i = [], 0
    while i < len(lines):
        border = _BORDER.match(lines[i])
        ends = [j for j in range(i + 1, len(lines)) if _BORDER.match(lines[j])] if border else []
        if len(ends) < 2 or lines[ends[0]].rstrip() != lines[i].rstrip():
            out.append(lines[i])
            i += 1
            continue
        columns, indent = _columns(lines[i]), border.group(1)
        header = _table_rows(lines[i + 1:ends[0]], columns)
        body = _table_rows(lines[ends[0] + 1:ends[1]], columns)
        for n, row in enumerate(header + body):
            out.append(indent + "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
            if n == len(header) - 1:
                out.append(indent + "|" + "---|" * len(columns))
        i = ends[1] + 1
    return out


def normalize(text):
    """``text`` with the habits above rewritten for griffe's Google parser and Markdown."""
    text = _EXAMPLE.sub(r"\1Examples:", text)
    text = _ROLE.sub(r"``\1``", text)
    text = _LITERAL_MARKER.sub(lambda m: m.group(1) + ":" if m.group(1) else "", text)
    return "\n".join(_markdown_tables(_split_shared_entries(text.split("\n"))))


class TfbnnDocstrings(griffe.Extension):
    """Applies :func:`normalize` to every docstring griffe loads."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = normalize(obj.docstring.value)
