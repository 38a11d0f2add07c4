"""The guide list is kept once (docs/guides.toml) and every place that shows it is written from it."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def guide_list():
    spec = importlib.util.spec_from_file_location("tfbnn_docs_guides", os.path.join(ROOT, "docs", "guides.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
