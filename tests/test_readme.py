"""The examples of the README and of the user guides work as written.

Convention (stated in the README's quick start and in the getting-started guide): every
```python block of README.md, of docs/guides/*.md and of benchmarks/README.md (published
as the Benchmarks guide) is self-contained. Each runs here on its own, in a fresh
namespace and a fresh temporary working directory (files it writes land there), so a
reader can paste any one block into a new Python session. ```bash blocks and indented
command blocks are not run; every ``tfbnn ...`` command shown in them or inline must
parse with the real ``tfbnn`` argument parser.
"""

import importlib.util
import os
import re
import shlex
import zipfile

import pytest

import tfbnn  # noqa: F401  (the checkout's package, imported before the blocks change directory)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
GUIDES = os.path.join(ROOT, "docs", "guides")


def _guide_list():
    """docs/guides.py (loaded by path): the one list of the guides."""
    spec = importlib.util.spec_from_file_location("tfbnn_docs_guides", os.path.join(ROOT, "docs", "guides.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The guides the site's nav lists (docs/guides.toml), the benchmarks page (published from its README) apart.
GUIDE_PAGES = tuple(g["page"] for g in _guide_list().guides() if not g["source"])
DOCUMENTS = (["README.md"] + [f"docs/guides/{page}.md" for page in GUIDE_PAGES] + ["benchmarks/README.md"])

# Blocks that cannot run here, by their id (see ``python_blocks``), with the reason.
# Empty on purpose: a block that needs a download or hours of training is rewritten
# to an offline, quick equivalent instead. A reason given here shows in the skip.
SKIPPED = {}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`(tfbnn [^`]*)`")


def _read(document):
    with open(os.path.join(ROOT, document), encoding="utf-8") as f:
        return f.read()


def _readme():
    return _read("README.md")


def _sections(text):
    """(heading, body) of each ``## `` section, in order."""
    parts = re.split(r"^## (.*)$", text, flags=re.MULTILINE)
    return [("(top)", parts[0])] + list(zip(parts[1::2], parts[2::2]))


def python_blocks(text):
    """[(id, code)]: the ```python blocks, named ``<section heading> #<n>``."""
    blocks = []
    for heading, body in _sections(text):
        for n, match in enumerate(m for m in FENCE.finditer(body) if m.group(1) == "python"):
            blocks.append((f"{heading} #{n + 1}", match.group(2)))
    return blocks


def _indented_blocks(text):
    """Code indented by four spaces after a blank line, outside fenced blocks."""
    lines = FENCE.sub("", text).split("\n")
    code, previous_blank = [], True
    in_block = False
    for line in lines:
        if line.startswith("    ") and (previous_blank or in_block) and line.strip():
            code.append(line.strip())
            in_block = True
        elif line.strip():
            in_block = False
        previous_blank = not line.strip()
    return code


def tfbnn_commands(text):
    """Every ``tfbnn ...`` command the README shows, as argument lists.

    From ```bash blocks and indented blocks (comments dropped, ``a && tfbnn ...``
    split) and from inline code spans; an inline span that writes alternatives
    (``--method vd|graves``) or elides (``...``) is notation, not a command.
    """
    lines = [line for m in FENCE.finditer(text) if m.group(1) in ("bash", "sh", "") for line in
             m.group(2).splitlines()]
    lines += _indented_blocks(text)
    commands = []
    for line in lines:
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["tfbnn"]:
                commands.append(words)
    for span in INLINE.findall(FENCE.sub("", text)):
        if "|" not in span and "..." not in span and len(span.split()) > 1:
            commands.append(shlex.split(span))
    return commands


def _document_blocks():
    """[(id, code)] of every document, the id ``<document>: <section heading> #<n>``."""
    return [(f"{document}: {block_id}", code) for document in DOCUMENTS
            for block_id, code in python_blocks(_read(document))]


BLOCKS = _document_blocks()
QUICK_STARTS = ("README.md: Quick start #1", "docs/guides/getting-started.md: Quick start #1")


def _distinct_blocks(blocks):
    """[(id, code)] with each code once, the id naming every block that shows it (``a = b``): a block
    that two documents show word for word (the README's quick start is the getting-started guide's)
    runs once, and checked for both."""
    ids = {}
    for block_id, code in blocks:
        ids.setdefault(code, []).append(block_id)
    return [(" = ".join(names), code) for code, names in ids.items()]


RUNS = _distinct_blocks(BLOCKS)


def test_the_readme_and_the_guides_have_their_examples():
    ids = [block_id for block_id, _ in BLOCKS]
    assert set(QUICK_STARTS) <= set(ids), ids
    assert [i for i in ids if i.startswith("README.md")] == ["README.md: Quick start #1"], ids
    assert len(ids) >= 12, ids
    assert set(SKIPPED) <= set(ids), f"SKIPPED names a block that is gone: {set(SKIPPED) - set(ids)}"
    # Every guide the site lists exists here, and every page of docs/guides/ is listed.
    assert sorted(f[:-3] for f in os.listdir(GUIDES) if f.endswith(".md")) == sorted(GUIDE_PAGES)


def _heading_slugs(text):
    """The anchors MkDocs (and GitHub) give the Markdown headings of ``text``."""
    headings = re.findall(r"^#+ (.*)$", FENCE.sub("", text), flags=re.MULTILINE)
    return {re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", h.lower()).strip()) for h in headings}


def test_the_readme_is_a_front_page():
    text = _readme()
    assert len(text.splitlines()) < 250
    # Exactly two set-up commands, the second the one CI runs.
    setup = _sections(text)[1]
    assert setup[0] == "Set up", setup[0]
    commands = [m.group(2).strip() for m in FENCE.finditer(setup[1])]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        script = f.read()
    ci = script.strip().splitlines()[-1]
    venv = "python3.11 -m venv .venv && . .venv/bin/activate && "
    assert len(commands) == 2 and all(c.startswith(venv) for c in commands), commands
    assert commands[1] == venv + ci, (commands, ci)
    # CI runs that command in a virtual environment of its own, made anew, on the Eigen kernel path.
    assert re.search(r'^"\$python" -m venv "\$venv"$', script, re.MULTILINE), script
    assert re.search(r"^venv=\$\(mktemp -d ", script, re.MULTILINE), script
    assert re.search(r"^export TF_ENABLE_ONEDNN_OPTS=0$", script, re.MULTILINE), script
    # Every guide is linked from the README, and every relative link resolves.
    for page in GUIDE_PAGES:
        assert f"(docs/guides/{page}.md" in text, page
    for target, anchor in re.findall(r"\]\(([^)#:]+)(?:#([^)]*))?\)", text):
        assert os.path.isfile(os.path.join(ROOT, target)), target
        if anchor:
            assert anchor in _heading_slugs(_read(target)), (target, anchor)


def test_blocks_shown_twice_run_once_and_only_those():
    runs = dict(RUNS)
    assert sorted(i for run in runs for i in run.split(" = ")) == sorted(i for i, _ in BLOCKS)
    assert " = ".join(QUICK_STARTS) in runs  # the README's quick start is the guide's, word for word
    assert len({code for code in runs.values()}) == len(runs)


@pytest.mark.heavy
@pytest.mark.parametrize("block_id,code", RUNS, ids=[b for b, _ in RUNS])
def test_python_block_runs_as_written(block_id, code, tmp_path, monkeypatch):
    names = block_id.split(" = ")
    if any(name in SKIPPED for name in names):
        pytest.skip("; ".join(SKIPPED[name] for name in names if name in SKIPPED))
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    exec(compile(code, names[0], "exec"), namespace)
    if set(names) & set(QUICK_STARTS):
        # What the quick start says: while KLAnnealing ramps beta up (10 epochs), the
        # loss rises although the data term falls; the KL term is loss - nll.
        h = namespace["history"].history
        assert h["kl_beta"][0] < h["kl_beta"][9] == pytest.approx(1.0, abs=0.01)
        assert h["loss"][9] > 2 * h["loss"][0]
        assert h["nll"][9] < h["nll"][0]
        assert h["accuracy"][19] > h["accuracy"][0]
        assert h["loss"][19] < h["loss"][10]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_tfbnn_command_shown_parses(document, tmp_path, monkeypatch, capsys):
    from tfbnn.cli import build_parser

    monkeypatch.chdir(tmp_path)
    commands = tfbnn_commands(_read(document))
    if document == "README.md":
        assert ["tfbnn", "train"] in commands and len(commands) >= 10, commands
    parser = build_parser()
    for words in commands:
        for word in words:  # the .keras files a command reads must exist (a zip archive, as a .keras is) to parse
            if word.endswith(".keras"):
                os.makedirs(os.path.dirname(word) or ".", exist_ok=True)
                zipfile.ZipFile(word, "w").close()
        try:
            args = parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"`{' '.join(words)}` does not parse: {capsys.readouterr().err.strip()}")
        assert callable(args.func), words
