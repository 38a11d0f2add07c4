"""MkDocs hook: one API page per public module of the tfbnn package, and the benchmarks page.

Walks ``tfbnn/`` (no import), skips private modules (``_name.py``) and
``__main__``, and adds ``api/<module>.md`` holding a mkdocstrings directive
(``::: tfbnn.module``), so every module is documented and a module added later
gets its page without a change here; the pages go to the nav under
"API reference". ``benchmarks/README.md``, whose tables the benchmark scripts
write (``--write-readme``), is published unchanged as ``guides/benchmarks.md``.
"""

import os

from mkdocs.structure.files import File

PACKAGE = "tfbnn"
BENCHMARKS = os.path.join("benchmarks", "README.md")
BENCHMARKS_PAGE = "guides/benchmarks.md"


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


def on_config(config):
    root = os.path.dirname(config.config_file_path)
    if config["nav"] is not None:
        config["nav"].append({"API reference": [{m: f"api/{m}.md"} for m in public_modules(root)]})
    return config


def on_files(files, config):
    root = os.path.dirname(config.config_file_path)
    for module in public_modules(root):
        files.append(File.generated(config, f"api/{module}.md", content=f"::: {module}\n"))
    with open(os.path.join(root, BENCHMARKS), encoding="utf-8") as f:
        files.append(File.generated(config, BENCHMARKS_PAGE, content=f.read()))
    return files
