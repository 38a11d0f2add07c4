"""The user-guide list, kept once (``docs/guides.toml``) and written everywhere it is shown.

``docs/guides.toml`` orders the guides and gives each a summary (and the modules whose API
pages link to it); a guide's title is its own first heading. From it:

* :func:`nav` gives the site's "Guides" nav (``docs/api_pages.py`` adds it to ``mkdocs.yml``'s);
* :func:`guide_of_module` gives the guide an API page links to;
* :func:`block` gives the Markdown list that ``README.md`` and ``docs/index.md`` hold between
  ``<!-- guides -->`` and ``<!-- /guides -->``; ``python docs/guides.py`` rewrites both,
  ``python docs/guides.py --check`` exits 1 while either differs (``tests/test_docs_lists.py``
  runs the check).

Standard library only: the MkDocs hook and the tests load this file by path.
"""

import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- guides: written by `python docs/guides.py` from docs/guides.toml -->", "<!-- /guides -->"
#: document -> how its links reach docs/guides/ (README.md sits at the root, index.md in docs/).
DOCUMENTS = {"README.md": "docs/guides/", os.path.join("docs", "index.md"): "guides/"}


def guides(root=None):
    """The guides in order: dicts with ``page``, ``title``, ``summary``, ``modules``, ``file``
    (the Markdown file, relative to ``root``) and ``source`` (a page published from another
    file, or None)."""
    root = root or ROOT
    with open(os.path.join(root, "docs", "guides.toml"), "rb") as f:
        entries = tomllib.load(f)["guide"]
    out = []
    for entry in entries:
        file = entry.get("source") or os.path.join("docs", "guides", entry["page"] + ".md")
        with open(os.path.join(root, file), encoding="utf-8") as f:
            heading = f.readline()
        if not heading.startswith("# "):
            raise ValueError(f"{file} must start with its title ('# ...'); it starts with {heading!r}")
        out.append({"page": entry["page"], "title": heading[2:].strip(), "summary": entry["summary"],
                    "modules": tuple(entry.get("modules", ())), "file": file, "source": entry.get("source")})
    return out


def nav(root=None):
    """The site's "Guides" nav section: ``{"Guides": [{title: "guides/<page>.md"}, ...]}``."""
    return {"Guides": [{g["title"]: f"guides/{g['page']}.md"} for g in guides(root)]}


def guide_of_module(module, root=None):
    """(title, page) of the guide ``module``'s API page links to: its own entry, else its
    nearest package's; None when no guide names it or a package of it."""
    owner = {m: (g["title"], g["page"]) for g in guides(root) for m in g["modules"]}
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in owner:
            return owner[".".join(parts[:n])]
    return None


def block(document, root=None):
    """The guide list as ``document`` (a key of :data:`DOCUMENTS`) shows it, markers included."""
    prefix = DOCUMENTS[document]
    lines = [BEGIN]
    for g in guides(root):
        # In the README a published page links to its source file (GitHub renders that);
        # on the site, to the page MkDocs publishes.
        target = g["source"] if (g["source"] and document == "README.md") else f"{prefix}{g['page']}.md"
        lines.append(f"- [{g['title']}]({target}): {g['summary']}")
    lines.append(END)
    return "\n".join(lines)


def rewritten(document, root=None):
    """``document``'s text with its guide list replaced by :func:`block`'s."""
    with open(os.path.join(root or ROOT, document), encoding="utf-8") as f:
        text = f.read()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{document} must hold the guide list once, between {BEGIN!r} and {END!r}")
    return pattern.sub(lambda _: block(document, root), text)


def main(argv=None):
    """Rewrites the lists (or, with ``--check``, returns 1 and names the documents that differ)."""
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for document in DOCUMENTS:
        text = rewritten(document)
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            if f.read() == text:
                continue
        stale.append(document)
        if not check:
            with open(os.path.join(ROOT, document), "w", encoding="utf-8") as f:
                f.write(text)
    if check and stale:
        print(f"the guide list differs from docs/guides.toml in {', '.join(stale)}: run python docs/guides.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
