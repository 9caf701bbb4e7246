"""Errors about files in a public layout, and the report that collects them.

Every message is one line: the file, the line or key, what is wrong, and what to do.
Structural problems (a missing file, a truncated feature.bin) raise `LayoutError` at once.
Problems of single items (a caption without query features, a NaN row) go through
`Report.problem`: the loader raises on the first one; `prvr-bench data check` collects
them all, drops the item and goes on, so its summary shows every problem at once.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from prvr.harness.base.io import UserError


class LayoutError(UserError):
    """A dataset folder that does not match its public layout (one-line message)."""


def where(path: str | Path, line: int | None = None, key: str | None = None) -> str:
    """'file line 12' / "file key 'x'" / 'file'."""
    out = str(path)
    if line is not None:
        out += f" line {line}"
    if key is not None:
        out += f" key {key!r}"
    return out


def layout_error(path: str | Path, problem: str, fix: str, line: int | None = None,
                 key: str | None = None) -> LayoutError:
    return LayoutError(f"{where(path, line, key)}: {problem}; {fix}")


@dataclass
class Report:
    """Problems and counts found while reading a layout.

    strict: raise on the first problem (loading); otherwise record it and let the caller
    drop the item (checking). `counts` holds facts the summary prints (clipped
    timestamps, skipped rows, unmatched captions ...).
    """

    strict: bool = True
    errors: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def problem(self, path: str | Path, problem: str, fix: str, line: int | None = None,
                key: str | None = None) -> None:
        err = layout_error(path, problem, fix, line, key)
        if self.strict:
            raise err
        self.errors.append(str(err))

    def causes(self) -> list[str]:
        """The problems recorded (non-strict), one line per cause with its count and first case:
        what a reader that drops such items left out (ids and line numbers do not make a cause)."""
        groups: dict[str, list[str]] = {}
        for err in self.errors:
            what = err.split(": ", 1)[1] if ": " in err else err
            cause = re.sub(r"'[^']*\d[^']*'|\b\d+(\.\d+)?\b", "…", what.split("; ")[0])  # ids and numbers out
            groups.setdefault(cause, []).append(err)
        return [f"{len(errs)} × {cause} (first: {Path(errs[0].split(': ', 1)[0]).name})"
                for cause, errs in groups.items()]

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.counts[name] += n

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
