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

import os
import re
from pathlib import Path

from prvr.harness.io import UserError

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


def _show(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"
