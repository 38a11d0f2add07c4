"""MkDocs hook: the guides' nav, one API page per public module of the tfbnn package, and the benchmarks page.

The "Guides" section of the nav comes from ``docs/guides.toml`` (through ``docs/guides.py``), the
one list of the guides.

Walks ``tfbnn/`` (no import), skips private modules (``_name.py``) and
``__main__``, and adds ``api/<module>.md`` holding a mkdocstrings directive
(``::: tfbnn.module``), so every module is documented and a module added later
gets its page without a change here; the pages go to the nav under
"API reference"; a page's members follow its module's ``__all__`` (the layers page lists the layers users
instantiate first, the bases last). The footer names the version (pyproject.toml). ``benchmarks/README.md``, whose tables the benchmark scripts
write (``--write-readme``), is published unchanged as ``guides/benchmarks.md``.
"""

import importlib.util
import os
import re

from mkdocs.structure.files import File

PACKAGE = "tfbnn"
BENCHMARKS = os.path.join("benchmarks", "README.md")
BENCHMARKS_PAGE = "guides/benchmarks.md"


def _guides():
    """docs/guides.py, loaded by path (MkDocs imports this hook as a file, not as a package)."""
    spec = importlib.util.spec_from_file_location("tfbnn_docs_guides", os.path.join(os.path.dirname(__file__), "guides.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GUIDES = _guides()


def public_modules(root):
    """Dotted names of the package's public modules and subpackages, sorted."""
    names = []
    for folder, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in files:
            if not name.endswith(".py") or name == "__main__.py":
                continue
            if name.startswith("_") and name != "__init__.py":
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)[:-3]
            names.append(rel.replace(os.sep, ".").removesuffix(".__init__"))
    return sorted(names)


def guide_of(module):
    """(title, page) of the guide for ``module`` (``docs/guides.toml``'s ``modules``: its own entry,
    else its nearest package's); or None."""
    return GUIDES.guide_of_module(module)


def api_page(module):
    """The Markdown of ``module``'s API page: a link to its guide, then the mkdocstrings directive."""
    guide = guide_of(module)
    link = f"User guide: [{guide[0]}](../guides/{guide[1]}.md)\n\n" if guide else ""
    return f"{link}::: {module}\n"


def version(root):
    """The package version (pyproject.toml), shown in every page's footer."""
    with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.MULTILINE).group(1)


def on_config(config):
    root = os.path.dirname(config.config_file_path)
    config["copyright"] = f"tfbnn {version(root)}: this documentation is for version {version(root)}"
    if config["nav"] is not None:
        config["nav"].insert(1, GUIDES.nav(root))
        config["nav"].append({"API reference": [{m: f"api/{m}.md"} for m in public_modules(root)]})
        config["nav"].append({"Contributing": "contributing.md"})
    return config


def on_files(files, config):
    root = os.path.dirname(config.config_file_path)
    for module in public_modules(root):
        files.append(File.generated(config, f"api/{module}.md", content=api_page(module)))
    with open(os.path.join(root, BENCHMARKS), encoding="utf-8") as f:
        files.append(File.generated(config, BENCHMARKS_PAGE, content=f.read()))
    return files
