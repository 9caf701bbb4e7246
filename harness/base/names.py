"""Names that become path components, and the rule that a run's files stay under --out.

Run names (`<method>[+<detector>][@<backbone>][~<tag>]`), tags, dataset, method and other
registered names each become one folder or file name under the results folder:
`<out>/runs/<dataset>/<run>/seed<S>.json`, `<out>/checkpoints/<dataset>/<run>/seed<S>/`,
`<out>/logs/<dataset>/<run>/seed<S>.log`. One rule for all of them: a letter or digit,
then letters, digits and `. _ + @ ~ -`, at most 64 characters, never `..`. So a name can
neither climb out of its folder nor make a folder of its own, and `inside` checks every
path built from them against the folder it must stay in.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

from prvr.harness.base.io import UserError

MAX_LEN = 64
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@~-]*")
RULE = f"letters, digits and . _ + @ ~ -, starting with a letter or digit, at most {MAX_LEN} characters, no '..'"


def name_problem(name: object) -> str | None:
    """None for a safe name, else what is wrong with it."""
    if not isinstance(name, str):
        return f"is {type(name).__name__}, not text"
    if not name:
        return "is empty"
    if len(name) > MAX_LEN:
        return f"is {len(name)} characters long"
    if not NAME.fullmatch(name[0]):
        return f"starts with {name[0]!r}"
    if ".." in name:
        return "holds '..'"
    bad = next((c for c in name if not NAME.fullmatch("a" + c)), None)
    return f"holds {bad!r}" if bad else None


def check_name(name: object, what: str, fix: str) -> str:
    """`name` when it is safe as a path component, else a one-line UserError naming `what`."""
    problem = name_problem(name)
    if problem:
        raise UserError(f"{what} {_show(name)} {problem}; {fix} (names may use {RULE})")
    return name  # type: ignore[return-value]


def check_tag(tag: str) -> str:
    """--tag: empty (no tag) or a safe name."""
    return check_name(tag, "--tag", "pick another tag") if tag else tag


def inside(path: str | Path, root: str | Path, what: str) -> Path:
    """`path` when it lies under `root` (compared after normalising `..`, not following links:
    a folder the user linked elsewhere stays theirs to choose), else a one-line UserError."""
    p, r = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    if p != r and r not in p.parents:
        raise UserError(f"{what} {_show(str(path), 80)} would lie outside {r}; nothing is read or written there")
    return Path(path)


def from_here(path: str | Path) -> str | None:
    """A path as a command written beside a result names it, so the command runs again from the
    working folder: as given where relative, relative to the working folder where it lies below
    it; None for a path elsewhere (the caller names it without this machine's folders)."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return None


def _show(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


# ---------------------------------------------------------------- unknown names
def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
    neighbouring characters each cost one ('mls' is one edit from 'msl', two from 'xml')."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def unknown_message(kind: str, name: Any, known: list[str]) -> str:
    """The one line that answers an unknown name (a registry's, a config value's): the closest
    known names first, then all of them."""
    if not isinstance(name, str):
        return f"unknown {kind} {repr(name)[:40]}: known: {', '.join(known) or '(none)'}"
    # difflib finds the candidates; the fewest edits (a swap of two neighbours counts one) orders them
    close = sorted(difflib.get_close_matches(name, known, n=5, cutoff=0.4), key=lambda c: edit_distance(name, c))[:3]
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    # a name with newlines or of any length still gives one short line
    shown = f"'{name}'" if name.isprintable() and len(name) <= 40 else repr(name[:40]) + ("..." if len(name) > 40 else "")
    return f"unknown {kind} {shown}: {hint}known: {', '.join(known) or '(none)'}"


def split_run_name(name: str) -> tuple[str, str, str, str]:
    """A run's name as records.run_tag and the tags build it, method+detector@backbone~tag, in its
    parts (method, detector, backbone, tag); a part the name lacks is ''."""
    head, _, tag = name.partition("~")
    head, _, backbone = head.partition("@")
    method, _, detector = head.partition("+")
    return method, detector, backbone, tag


def join_run_name(method: str, detector: str = "", backbone: str = "", tag: str = "") -> str:
    """The name `split_run_name` splits: method, +detector, @backbone, ~tag, each where given."""
    return method + (f"+{detector}" if detector else "") + (f"@{backbone}" if backbone else "") + \
        (f"~{tag}" if tag else "")
