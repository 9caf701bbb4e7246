"""What the leaderboard shows between its headline tables and its ablation detail: each sweep's gains
against the oracle's room ("Is it the noise?") and the matrix's made cells, read back from the tables
`prvr-bench sweep` and `prvr-bench matrix` wrote (OUT/sweeps/*.csv, OUT/matrix/*.csv).

Those reports hold figures the leaderboard does not recompute (a sweep's answer needs the sweep's
knobs and values, which only its command names), so the leaderboard reads their CSV files: through
pandas' CSV reader, every cell a string, the columns it shows checked by name. A report is untrusted
input like a record: a file that is not a CSV table, or lacks a column, is one line naming the file
and the column, with the command that re-makes it. Nothing in a cell is evaluated; `markdown_table`
escapes each cell.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import pandas as pd

from prvr.harness.base.io import UserError, read_text
from prvr.harness.reports.table import markdown_table

SWEEPS, MATRIX = "sweeps", "matrix"
SWEEP_COLUMNS = ("value", "multi-relevant share (test)", "mislabelled queries (train)", "run", "base", "seeds",
                 "gain (SumR)", "95% interval", "oracle's gain on the base", "the room's 95% interval",
                 "share of the room closed", "the share's 95% interval", "reads")
SWEEP_HEADER = ("value", "multi-relevant share", "mislabelled (train)", "run", "base", "seeds", "gain",
                "its 95% interval", "oracle's gain on the base", "its 95% interval", "room closed",
                "its 95% interval", "reads")
COST_COLUMNS = ("value", "run", "what the noise costs it", "the cost's 95% interval", "base", "gain (SumR)",
                "share of the base's cost recovered", "the recovered share's 95% interval")
COST_HEADER = ("value", "run", "cost of the noise", "its 95% interval", "base", "gain", "cost recovered",
               "its 95% interval")
CHANGE_COLUMNS = ("value", "run", "base", "gain at the preset's value", "gain (SumR)", "change of the gain",
                  "the change's 95% interval")
CHANGE_HEADER = ("value", "run", "base", "gain at the preset's value", "gain here", "change", "its 95% interval")
ROOM_COLUMNS = ("value", "run", "base", "oracle's gain on the base", "the oracle's room on the run",
                "room the run takes", "the taken room's 95% interval")
ROOM_HEADER = ("value", "run", "base", "the room on the base", "the room on the run", "room the run takes",
               "its 95% interval")
MOMENT_COLUMNS = ("value", "run", "base", "VCMR SumR", "gain (VCMR SumR)", "VCMR gain's 95% interval", "VCMR gain's p",
                  "VCMR interval over")
MOMENT_HEADER = ("value", "run", "base", "VCMR SumR", "gain", "its 95% interval", "p", "interval over")
# a sweep report's further tables: (its CSV columns, the header shown, the column a row of it fills, the caption)
EXTRA_TABLES = (
    (COST_COLUMNS, COST_HEADER, 2, "What the noise costs each run (itself at the preset's value, same test queries), "
                                   "and the share of its base's cost a run recovers:"),  # a knob of the training split
    (CHANGE_COLUMNS, CHANGE_HEADER, 5, "How each gain moves with the training regime (against the same gain at the "
                                       "preset's value, same test queries):"),  # a knob of the training regime
    (ROOM_COLUMNS, ROOM_HEADER, 5, "The room a run leaves (the oracle's room on the run against the room on its base, "
                                   "same test queries): a method that handles label noise takes part of its base's "
                                   "room:"),  # runs trained with the oracle too
    (MOMENT_COLUMNS, MOMENT_HEADER, 4, "Moments: each localizing run's VCMR SumR and its gain over its base (the "
                                       "two-level paired bootstrap where both runs' rankings hold moment ranks, else "
                                       "the paired t-test over the seeds: the last column says which):"),
)
MATRIX_COLUMNS = ("backbone", "detector", "treatment", "run", "plain run", "seeds", "SumR", "gain (SumR)",
                  "95% interval")
MATRIX_HEADER = ("backbone", "detector", "treatment", "run", "plain run", "seeds", "SumR", "gain", "its 95% interval")


def read_report(path: Path, columns: Sequence[str], remake: str) -> pd.DataFrame:
    """A report's CSV table as strings, with `columns` present; one line naming the file otherwise."""
    text = read_text(path, "report table", remake)
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: not a CSV table the leaderboard can read ({why}); {remake}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: no column {missing[0]!r} (a table of an older or other report); {remake}")
    return frame


def sweep_lines(root: Path) -> list[str]:
    """Per sweep report: its gains with their intervals, the oracle's room on the same base and world,
    and the share closed (the rows of its answer table), linked to the report."""
    lines: list[str] = []
    for path in sorted((root / SWEEPS).glob("*.csv")):
        frame = read_report(path, SWEEP_COLUMNS, f"re-make it with the command in {path.with_suffix('.md').name} "
                                                 "(its --report-only form) or remove it")
        gains = frame[frame["gain (SumR)"] != ""]
        if gains.empty:
            continue
        lines += ["", f"### [{path.stem}]({SWEEPS}/{path.with_suffix('.md').name})", "",
                  markdown_table(SWEEP_HEADER, gains.loc[:, list(SWEEP_COLUMNS)].itertuples(index=False))]
        for columns, header, filled, caption in EXTRA_TABLES:  # the tables only some reports have
            if all(c in frame.columns for c in columns):
                rows = frame[frame[columns[filled]] != ""]
                if not rows.empty:
                    lines += ["", caption, "", markdown_table(header, rows.loc[:, list(columns)].itertuples(index=False))]
    return lines


def matrix_lines(root: Path) -> list[str]:
    """Per matrix report: the cells made with a gain over their backbone's plain cell."""
    lines: list[str] = []
    for path in sorted((root / MATRIX).glob("*.csv")):
        frame = read_report(path, MATRIX_COLUMNS, "re-make it with `prvr-bench matrix --report-only` (its command "
                                                  f"is in {path.with_suffix('.md').name}) or remove it")
        made = frame[frame["gain (SumR)"] != ""].drop_duplicates(subset=["run"])
        if made.empty:
            continue
        lines += ["", f"### [matrix: {path.stem}]({MATRIX}/{path.with_suffix('.md').name})", "",
                  markdown_table(MATRIX_HEADER, made.loc[:, list(MATRIX_COLUMNS)].itertuples(index=False))]
    return lines


def findings(root: str | Path) -> list[str]:
    """The section, or nothing where no sweep or matrix report has a gain."""
    root = Path(root)
    body = sweep_lines(root) + matrix_lines(root)
    if not body:
        return []
    return ["", "## Is it the noise? Sweeps and the matrix", "",
            "Each gain over its base (95% interval of the two-level paired bootstrap), beside the oracle's gain on "
            "the same base and world (the room: what knowing every false negative is worth there) and the share of "
            "that room the run closes, as the sweep and matrix reports compute them (harness/reports/sweeps.py, "
            "harness/reports/matrix.py; docs/sweeps.md, docs/matrix.md). A sweep's rows are other worlds than the "
            "tables above (their world in the value and share columns); each title links its report, with its "
            "command, its world at each value and its slope table.", *body]
