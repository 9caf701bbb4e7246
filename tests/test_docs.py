"""README.md and docs/ stay one consistent set of pages: every relative markdown link points
to a file that exists, and carries no #anchor (section titles change; files are checked)."""

import re
from pathlib import Path

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
