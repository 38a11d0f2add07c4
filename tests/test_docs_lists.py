"""The guide list is kept once (docs/guides.toml) and every place that shows it is written from it."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _docs_script(name):
    """``docs/<name>.py``, loaded by path (the docs scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"tfbnn_docs_{name}", os.path.join(ROOT, "docs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def guide_list():
    return _docs_script("guides")


def test_every_guide_is_listed_once_and_every_listed_page_exists(guide_list):
    pages = [g["page"] for g in guide_list.guides()]
    files = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "docs", "guides")) if f.endswith(".md"))
    published = [g["page"] for g in guide_list.guides() if g["source"]]
    assert len(pages) == len(set(pages)), pages
    assert sorted(p for p in pages if p not in published) == files
    assert published == ["benchmarks"]


def test_readme_and_index_show_the_list_written_from_the_one_source(guide_list):
    assert guide_list.main(["--check"]) == 0, "run python docs/guides.py"
    for document, prefix in guide_list.DOCUMENTS.items():
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            text = f.read()
        for g in guide_list.guides():
            target = g["source"] if (g["source"] and document == "README.md") else prefix + g["page"] + ".md"
            assert f"- [{g['title']}]({target}): {g['summary']}\n" in text, (document, g["page"])


def test_the_check_fails_on_a_stale_list_and_the_rewrite_mends_it(guide_list, tmp_path, monkeypatch):
    for document in (*guide_list.DOCUMENTS, "docs/guides.toml"):
        os.makedirs(tmp_path / os.path.dirname(document), exist_ok=True)
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            (tmp_path / document).write_text(f.read(), encoding="utf-8")
    os.makedirs(tmp_path / "docs" / "guides")
    os.makedirs(tmp_path / "benchmarks")
    for g in guide_list.guides():
        with open(os.path.join(ROOT, g["file"]), encoding="utf-8") as f:
            (tmp_path / g["file"]).write_text(f.readline(), encoding="utf-8")
    (tmp_path / "docs" / "guides" / "tuning.md").write_text("# Tuning the prior\n", encoding="utf-8")
    monkeypatch.setattr(guide_list, "ROOT", str(tmp_path))
    assert guide_list.main(["--check"]) == 1  # the title changed in the guide, not yet in the lists
    assert guide_list.main([]) == 0
    assert guide_list.main(["--check"]) == 0
    assert "- [Tuning the prior](docs/guides/tuning.md): " in (tmp_path / "README.md").read_text(encoding="utf-8")


def test_the_site_nav_and_the_api_pages_links_come_from_the_list(guide_list):
    nav = guide_list.nav()["Guides"]
    assert [next(iter(entry.values())) for entry in nav] == [f"guides/{g['page']}.md" for g in guide_list.guides()]
    assert guide_list.guide_of_module("tfbnn.layers.rank1") == ("Deep ensembles", "ensembles")
    assert guide_list.guide_of_module("tfbnn.layers.dense") == ("Getting started", "getting-started")
    assert guide_list.guide_of_module("tfbnn.kl") is None
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        assert ": guides/" not in f.read()  # the nav's guides are added by the hook, from the list


# -- the home page ---------------------------------------------------------------------------
def test_the_home_method_table_is_written_from_the_measured_benchmark():
    import json

    home = _docs_script("home")
    assert home.main(["--check"]) == 0, "run python docs/home.py"
    with open(os.path.join(ROOT, home.MEASURED), encoding="utf-8") as f:  # committed: the notebook's outputs are not
        table = json.load(f)
    with open(os.path.join(ROOT, "docs", "index.md"), encoding="utf-8") as f:
        page = f.read()
    assert set(table["settings"]["methods"]) == set(home.METHODS)  # every benchmarked method has a row
    for method, row in zip(table["settings"]["methods"], table["table"]):
        label, link = home.METHODS[method][:2]
        line = next(line for line in page.splitlines() if line.startswith(f"| [{label}]({link}) |"))
        assert f"{row['clean_accuracy']:.3f} / {row['clean_nll']:.3f} / {row['clean_ece']:.3f}" in line
        assert os.path.isfile(os.path.join(ROOT, "docs", link.split("#")[0])), link


def _numbers(text):
    import re

    return [float(v) for v in re.findall(r"-?\d+\.\d+", text)], re.sub(r"-?\d+\.\d+", "#", text)


def test_the_home_example_prints_what_the_page_shows():
    """The home page's short example runs, and prints the page's output: the same words, every
    number within 0.03 (training is seeded; the last digits may differ across CPUs)."""
    import contextlib
    import io
    import re

    with open(os.path.join(ROOT, "docs", "index.md"), encoding="utf-8") as f:
        page = f.read()
    code = re.search(r"## A Bayesian network in eighteen lines\n\n```python\n(.*?)```", page, re.DOTALL).group(1)
    shown = re.search(r"<!-- output -->\n```text\n(.*?)```", page, re.DOTALL).group(1)
    assert len(code.strip().splitlines()) <= 20
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/index.md", "exec"), {"__name__": "__home__"})
    got, got_words = _numbers(out.getvalue())
    want, want_words = _numbers(shown)
    assert got_words == want_words, out.getvalue()
    assert got == pytest.approx(want, abs=0.03), out.getvalue()
    accuracy, ece, clean, noisy = got
    assert accuracy > 0.9 and noisy > 2 * clean  # what the page says of it
