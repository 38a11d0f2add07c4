"""Griffe extension: reads tfbnn's docstring conventions as Google style.

tfbnn's docstrings are Google style with two habits griffe does not know:

* ``Example:`` (singular) titles the examples section; griffe knows ``Examples:``
  only and would render the ``>>>`` lines as prose.
* One ``Args`` entry may document several parameters that share a description:
  ``start, end: ints, the steps where the ramp begins and ends.`` Each name is
  split into its own entry (the first keeps the description, the others point to
  it), so griffe still checks every name against the signature.

Everything else is left to griffe, whose warnings ``mkdocs build --strict`` turns
into errors.
"""

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ARGS_HEADER = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
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


def normalize(text):
    """``text`` with the two habits above rewritten for griffe's Google parser."""
    text = _EXAMPLE.sub(r"\1Examples:", text)
    return "\n".join(_split_shared_entries(text.split("\n")))


class TfbnnDocstrings(griffe.Extension):
    """Applies :func:`normalize` to every docstring griffe loads."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = normalize(obj.docstring.value)
