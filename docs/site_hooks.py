"""MkDocs hooks (mkdocs.yml `hooks:`). A page in docs/ may link to a file elsewhere in the
repository, as it reads on the code host (`../README.md`, `../../results/leaderboard.md`);
tests/test_docs.py checks that such a file exists. The site holds docs/ only, so each such
file is published under repo/ (a Markdown file as a page, not in the nav) and the link is
pointed at it in the site; the page sources stay as they are. Links within docs/ are left
alone, and a link to a file that does not exist is left for strict mode to reject."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

PREFIX = "repo"  # site folder of the published repository files
LINK = re.compile(r"(\]\()([^)\s]+)(\))")  # [text](target) and ![alt](target)
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.S | re.M)  # fences and code spans: no links
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|/|#)", re.I)


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _repo_path(file: File, root: Path) -> str | None:
    """The file's path from the repository root, or None if it lies elsewhere."""
    try:
        return Path(file.abs_src_path).resolve().relative_to(root).as_posix()
    except (TypeError, ValueError):
        return None


def _outside_targets(text: str, page_path: str, docs: str, root: Path):
    """(link target, repository path) of each link in `text` to a file outside docs/."""
    for part in CODE.split(text):
        for _, target, _ in LINK.findall(part):
            path = target.split("#", 1)[0]
            if not path or EXTERNAL.match(target):
                continue
            dest = posixpath.normpath(posixpath.join(posixpath.dirname(page_path), path))
            if dest.startswith("../") or dest == ".." or dest.startswith(docs + "/"):
                continue
            if (root / dest).is_file():
                yield target, dest


def on_files(files: Files, config) -> Files:
    root = _root(config)
    docs = Path(config.docs_dir).resolve().relative_to(root).as_posix()
    site = Path(config.site_dir).resolve()
    queue = list(files.documentation_pages())
    while queue:
        page = queue.pop()
        page_path = _repo_path(page, root)
        if page_path is None:
            continue
        text = Path(page.abs_src_path).read_text(encoding="utf-8")
        for _, dest in _outside_targets(text, page_path, docs, root):
            src_uri = f"{PREFIX}/{dest}"
            if files.get_file_from_path(src_uri) or site in (root / dest).resolve().parents:
                continue
            new = File.generated(
                config, src_uri, abs_src_path=str(root / dest), inclusion=InclusionLevel.NOT_IN_NAV
            )
            files.append(new)
            if new.is_documentation_page():
                queue.append(new)
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    root = _root(config)
    docs = Path(config.docs_dir).resolve().relative_to(root).as_posix()
    page_path = _repo_path(page.file, root)
    if page_path is None:
        return markdown
    here = posixpath.dirname(page.file.src_uri) or "."

    def site_target(target: str) -> str | None:
        path, hash_, anchor = target.partition("#")
        if not path or EXTERNAL.match(target):
            return None
        dest = posixpath.normpath(posixpath.join(posixpath.dirname(page_path), path))
        if dest.startswith(docs + "/"):
            if page_path.startswith(docs + "/"):
                return None  # docs/ to docs/: MkDocs resolves it as it is
            src_uri = dest[len(docs) + 1 :]
        elif files.get_file_from_path(f"{PREFIX}/{dest}"):
            src_uri = f"{PREFIX}/{dest}"
        else:
            return None
        return posixpath.relpath(src_uri, here) + hash_ + anchor

    def relink(match: re.Match) -> str:
        new = site_target(match.group(2))
        return match.group(0) if new is None else match.group(1) + new + match.group(3)

    parts, pos = [], 0
    for code in CODE.finditer(markdown):
        parts += [LINK.sub(relink, markdown[pos : code.start()]), code.group(0)]
        pos = code.end()
    parts.append(LINK.sub(relink, markdown[pos:]))
    return "".join(parts)
