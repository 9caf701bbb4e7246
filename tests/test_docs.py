"""README.md and docs/ stay one consistent set of pages: every relative markdown link points
to a file that exists, and carries no #anchor (section titles change; files are checked).
The manual builds as a site (mkdocs.yml) in strict mode, with every page of docs/ in its nav."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def test_every_relative_markdown_link_points_to_an_existing_file_without_anchor():
    assert (ROOT / "docs" / "index.md").is_file()
    problems = []
    for page in PAGES:
        for target in relative_links(page):
            name = page.relative_to(ROOT)
            if "#" in target:
                problems.append(f"{name}: link {target!r} has an anchor; link the file and name the section in words")
            elif not (page.parent / target).resolve().exists():
                problems.append(f"{name}: link {target!r} points to no file")
    assert not problems, "\n".join(problems)


def test_the_link_finder_sees_links_outside_code_only():
    page = ROOT / "README.md"
    assert "docs/index.md" in relative_links(page)
    assert all("://" not in t for t in relative_links(page))


DOCS = ROOT / "docs"


def nav_pages(nav) -> list[str]:
    """The page paths of a mkdocs nav (a list of strings and {title: page or list})."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in nav_pages(v)]
    return [p for item in nav for p in nav_pages(item)]


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[test]' (or '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_every_docs_page_is_in_the_mkdocs_nav_once():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config["strict"] is True
    nav = nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == sorted(nav), "a page is in the nav twice"
    assert sorted(nav) == pages, f"not in the nav: {sorted(set(pages) - set(nav))}; no such page: {sorted(set(nav) - set(pages))}"
    assert nav[0] == "index.md"


def test_the_manual_builds_strictly_with_an_html_page_per_docs_page(tmp_path):
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    missing = []
    for page in DOCS.rglob("*.md"):
        rel = page.relative_to(DOCS).with_suffix("")
        html = rel.parent / "index.html" if rel.name == "index" else rel / "index.html"
        if not (tmp_path / "site" / html).is_file():
            missing.append(f"{page.relative_to(ROOT)} -> {html}")
    assert not missing, "no HTML page for: " + ", ".join(missing)
    # Links from docs/ to files elsewhere in the repository land on copies under repo/ (docs/site_hooks.py).
    assert (tmp_path / "site" / "repo" / "index.html").is_file()  # ../README.md, from docs/index.md
    assert 'href="repo/"' in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")


def test_a_strict_build_fails_on_a_broken_link_and_on_a_page_missing_from_the_nav(tmp_path):
    # mkdocs.yml's own settings (validation, strict, theme, hooks) on a two-page manual.
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.update(docs_dir="docs", nav=["index.md"], hooks=[str(ROOT / h) for h in config.get("hooks", [])])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the page](no-such-page.md).\n", encoding="utf-8")
    (tmp_path / "docs" / "forgotten.md").write_text("# Forgotten\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "no-such-page.md" in out and "forgotten.md" in out, out
