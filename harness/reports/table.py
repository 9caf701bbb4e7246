"""The results table: the run records as one typed pandas DataFrame, and the one markdown writer, CSV
writer and mean ± std formatter that every report writes its figures with.

- The columns (`Column`: header, where in `metrics.test`, higher-is-better, decimals) and the record
  readers (`value_at`, `dataset_label`, `record_protocol`, `diverged`, `near_cap`) are the ones the
  leaderboard has always read records with; `records_frame` applies them once, one frame row per
  record, and harness/reports/rows.py groups that frame into the leaderboard's rows. The records come
  in checked (harness/engine/records.py `load_record_at`, harness/reports/leaderboard.py `collect`):
  nothing here judges a record again.
- `markdown_table` escapes every cell (backslash, pipe, backtick; line breaks become spaces), so a run
  name, tag or note taken from a record cannot end a row, open a code span or start a fence; a cell
  the report composed as markdown (`Markdown`, `code`) is passed through whole. `fenced` makes a
  code block that no line of its content can close.
- `csv_text` writes through the csv module (quotes doubled, line breaks kept inside a quoted cell);
  a cell beginning with = + - @, a tab or a carriage return gets a leading quote so that a
  spreadsheet shows it instead of running it as a formula (OWASP's advice), while numbers stay
  numbers.
- `mean_std`: mean ± sample std over seeds (one seed: its value; none: an empty cell).

Why pandas: a frame is one typed table that each report selects and groups (`groupby`) instead of
walking nested record dicts with its own lookups; the column dtypes (string, Int64, float64 with NaN
for a figure a record lacks) make a missing figure an explicit NaN, never a silent zero.
"""

from __future__ import annotations

import hashlib
import json

import csv
import io
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from prvr.harness.engine.record_types import RunProtocol, RunRecord
from prvr.harness.engine.records import budget_label, run_protocol


# ---------------------------------------------------------------------------- columns


@dataclass(frozen=True)
class Column:
    name: str  # header
    path: tuple[str, ...]  # where in metrics.test
    higher_is_better: bool = True
    decimals: int = 1  # shown with this many decimals


ORACLE_SUMR = "oracle SumR"  # any truly relevant video counts (simulated ground truth)
COLUMNS = (
    Column("R@1", ("R@1",)), Column("R@5", ("R@5",)), Column("R@10", ("R@10",)), Column("R@100", ("R@100",)),
    Column("SumR", ("SumR",)),
    Column("short SumR", ("buckets", "short", "SumR")), Column("medium SumR", ("buckets", "medium", "SumR")),
    Column("long SumR", ("buckets", "long", "SumR")),
    Column(ORACLE_SUMR, ("oracle", "SumR")),
)
# Real data scored against a relevance file (datasets/real/relevance.py): the oracle figures over
# the queries it covers, and prvr-ea's dense recall |top K ∩ relevant| / |relevant|; shown in their
# own table for the rows whose records joined one (provenance.data.relevance)
RELEVANCE_COLUMNS = (Column(ORACLE_SUMR, ("oracle", "SumR")),
                     *(Column(f"dense R@{k}", ("oracle", f"dense R@{k}")) for k in (1, 5, 10, 100)),
                     Column("dense SumR", ("oracle", "dense SumR")),
                     Column("multi-relevant %", ("oracle", "multi_relevant_share")))

# Moment retrieval (harness/engine/vcmr.py): the keys its evaluation pass writes, `VCMR-<tIoU> R@<k>` and
# `SVMR-<tIoU> R@<k>`, and the ks and tIoUs it writes by default (vcmr.VCMR_KS, vcmr.SVMR_KS,
# EvalConfig.vcmr_tious; tests/test_reported_vcmr.py holds them equal). Kept here so that the
# tables never import the evaluator (and torch).
MOMENT_KEY = re.compile(r"(VCMR|SVMR)-(\d+(?:\.\d+)?) R@(\d+)")
MOMENT_DEFAULTS = {"VCMR": (1, 10, 100), "SVMR": (1, 5)}
MOMENT_TIOUS = (0.5, 0.7)
MOMENT_DECIMALS = 2  # as the SBERT-PR paper gives them (VCMR R@1 on Charades-STA is below 1 %)
MOMENT_SUM = Column("VCMR SumR", ("VCMR SumR",), decimals=MOMENT_DECIMALS)
VR_KEYS = ("R@1", "R@5", "R@10", "R@100")
PRVR_KEYS = (*VR_KEYS, "SumR")


def is_moment_key(key: object) -> bool:
    return isinstance(key, str) and MOMENT_KEY.fullmatch(key) is not None


def is_metric_key(key: object) -> bool:
    return key in PRVR_KEYS or is_moment_key(key)


def carries_moments(block: Mapping[str, Any]) -> bool:
    """Whether a metrics block (or a reported row) holds VCMR / SVMR figures."""
    return isinstance(block, dict) and any(is_moment_key(k) for k in block)


def _moment_order(key: str) -> tuple[int, float, int]:
    match = MOMENT_KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"{key!r} is not a moment figure (MOMENT_KEY)")
    task, tiou, k = match.groups()
    return (0 if task == "VCMR" else 1, float(tiou), int(k))


def moment_columns(blocks: Iterable[Mapping[str, Any]]) -> tuple[Column, ...]:
    """The moment columns of a table whose metric blocks (records' `metrics.test`, reported rows)
    are `blocks`: none when no block holds VCMR / SVMR figures, else VCMR R@{1, 10, 100} and SVMR
    R@{1, 5} at each default tIoU, any other VCMR / SVMR key a block holds, then VR R@1/5/10/100."""
    found = {k for b in blocks if isinstance(b, dict) for k in b if is_moment_key(k)}
    if not found:
        return ()
    keys = found | {f"{task}-{t:g} R@{k}" for task, ks in MOMENT_DEFAULTS.items() for t in MOMENT_TIOUS for k in ks}
    return (*(Column(k, (k,), decimals=MOMENT_DECIMALS) for k in sorted(keys, key=_moment_order)),
            *(Column(f"VR {k}", (k,), decimals=MOMENT_DECIMALS) for k in VR_KEYS))


# ---------------------------------------------------------------------------- record readers


def value_at(block: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at `path` in a metrics block; None where it is missing or not a number."""
    for p in path:
        if not isinstance(block, dict) or p not in block:
            return None
        block = block[p]
    return float(block) if isinstance(block, (int, float)) and not isinstance(block, bool) else None


def dataset_label(record: RunRecord) -> str:
    """The dataset column: a real-layout dataset loaded from an export of a simulated one is
    marked as such, so it never sits unmarked beside the papers' figures for the real data."""
    data = record.get("provenance", {}).get("data", {})
    test = data.get("test")
    source = data.get("exported_from") or (test.get("exported_from") if isinstance(test, dict) else None)
    return f"{record['dataset']} (export of {source})" if source else record["dataset"]


def record_protocol(record: RunRecord) -> RunProtocol:
    """The run's budget, judged against its dataset's protocol as the presets state it now; a run
    whose test metrics hold VCMR figures had moments to select on."""
    data = record.get("provenance", {}).get("data", {}) if isinstance(record.get("provenance"), dict) else {}
    test = (record.get("metrics") or {}).get("test") or {}
    return run_protocol(record.get("config", {}), record["dataset"], data.get("selection"),
                        localizes=MOMENT_SUM.name in test)


def diverged(record: RunRecord) -> bool:
    """Whether the run's loss became non-finite, or every loss part was exactly 0 for an epoch
    (nothing trained: `degenerate`); the trainer marks its record either way."""
    return bool(record.get("nonfinite")) or bool(record.get("degenerate"))


def near_cap(record: RunRecord) -> dict[str, Any] | None:
    """Where the selected epoch lies among the last `patience` epochs of the run's epoch cap
    (so the cap, not early stopping, may have ended a rising curve): the seed, the selected
    epoch (1-based), the cap and the range of the last `patience` validation SumRs; else None."""
    protocol = record_protocol(record)
    best, cap, patience = record.get("best_epoch"), protocol.get("epochs"), protocol.get("patience")
    if not (isinstance(best, int) and isinstance(cap, int) and isinstance(patience, int)) or best + 1 <= cap - patience:
        return None
    last = [h["val"]["SumR"] for h in record.get("history", []) if isinstance(h.get("val"), dict)
            and isinstance(h["val"].get("SumR"), (int, float))][-patience:]
    return {"seed": record["seed"], "best": best + 1, "cap": cap, "patience": patience,
            "last": (min(last), max(last)) if last else None}


def relevance_phrase(record: RunRecord) -> Markdown | None:
    """What the test split's relevance file covered in this run, as markdown (the file a code
    span, the note escaped): `provenance.data.relevance.test`, written where a real dataset joined
    one; None for none."""
    data = (record.get("provenance") or {}).get("data") or {}
    test = (data.get("relevance") or {}).get("test") if isinstance(data.get("relevance"), dict) else None
    if not (isinstance(test, dict) and test.get("covered")):
        return None
    note = f"; {markdown_cell(str(test['note']))}" if test.get("note") else ""
    return Markdown(f"{test.get('covered', 0):,} of {test.get('queries', 0):,} test queries "
                    f"({code(str(test.get('file', '?')))}{note})")


# ---------------------------------------------------------------------------- the frame


KEYS = {"dataset": "string", "run": "string", "method": "string", "backbone": "string", "relations": "string",
        "tag": "string", "seed": "int64", "budget": "string", "protocol": "string", "on_protocol": "bool",
        "dataset_protocol": "object", "best_epoch": "Int64", "epochs_run": "Int64", "command": "string",
        "diverged": "bool", "localizes": "bool", "near_cap": "object", "relevance": "object", "uncommitted": "bool",
        "world": "string"}


def metric_columns(records: Sequence[RunRecord]) -> tuple[Column, ...]:
    """The figure columns of a table of these records: the PRVR ones, then the moment ones where
    the runs that did not diverge localize, then the relevance ones."""
    moments = moment_columns(r["metrics"].get("test", {}) for r in records if not diverged(r))
    return (*COLUMNS, *moments, *((MOMENT_SUM,) if moments else ()),
            *(c for c in RELEVANCE_COLUMNS if c not in COLUMNS))


def records_frame(records: Sequence[RunRecord]) -> pd.DataFrame:
    """The records as one typed frame, one row per record in the order given: the key columns
    (`KEYS`), then one float column per figure (`metric_columns`), NaN where a record lacks it."""
    columns = metric_columns(records)
    rows = [{**_keys_of(r), **{c.name: value_at(r["metrics"].get("test", {}), c.path) for c in columns}}
            for r in records]
    frame = pd.DataFrame(rows, columns=[*KEYS, *(c.name for c in columns)])
    return frame.astype({**KEYS, **{c.name: "float64" for c in columns}})


def figures(frame: pd.DataFrame) -> list[str]:
    """The frame's figure columns, in order."""
    return [c for c in frame.columns if c not in KEYS]


def _keys_of(record: RunRecord) -> dict[str, Any]:
    protocol = record_protocol(record)
    return {"dataset": dataset_label(record), "run": record.get("run_name", record["method"]),
            "method": record["method"], "backbone": record.get("backbone", ""),
            "relations": record.get("relations", ""), "tag": record.get("tag", ""), "seed": record["seed"],
            "budget": budget_label(protocol), "protocol": budget_label(protocol["dataset_protocol"]),
            "on_protocol": bool(protocol["follows_protocol"]), "dataset_protocol": protocol["dataset_protocol"],
            "best_epoch": record.get("best_epoch"), "epochs_run": record.get("epochs_run"),
            "command": record.get("command", ""), "diverged": diverged(record),
            "localizes": carries_moments(record["metrics"].get("test", {})), "near_cap": near_cap(record),
            "relevance": relevance_phrase(record),
            # made from a tree with uncommitted changes: no commit holds its code (`prvr-bench reproduce` refuses it)
            "uncommitted": bool(record.get("provenance", {}).get("git_dirty")),
            "world": world_digest(record)}


def world_digest(record: RunRecord) -> str:
    """Which test set a record was scored on, beyond its dataset's name: a digest of the test split's facts as
    the run recorded them (`provenance.data.test`: videos, queries, multi-relevant share, words per query, ...).
    A sweep's `--set sim.repeat_prob=0.6` makes another world under the same name; a training setting
    (`train.batch_size`) does not. "" where the record states none."""
    facts = record.get("provenance", {}).get("data", {}).get("test")
    if not isinstance(facts, dict) or not facts:
        return ""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:8]


# ---------------------------------------------------------------------------- figures


def mean_and_std(values: Sequence[float]) -> tuple[float, float | None] | None:
    """Mean and sample standard deviation (ddof=1; None for one value); None for no values."""
    if not len(values):
        return None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else None


def mean_std(values: Sequence[float], decimals: int = 1) -> str:
    """A cell: empty for no values, the value for one seed, mean ± sample std for more."""
    spread = mean_and_std(values)
    if spread is None:
        return ""
    mean, std = spread
    return f"{mean:.{decimals}f}" if std is None else f"{mean:.{decimals}f} ± {std:.{decimals}f}"


# ---------------------------------------------------------------------------- markdown


class Markdown(str):
    """A cell the report wrote as markdown from escaped parts (`code`, `markdown_cell`): passed
    through by `markdown_table` as it is."""


def markdown_cell(text: str) -> str:
    """Text as a markdown table cell: backslashes, pipes and backticks escaped (no code span or
    fence can open), line breaks made spaces."""
    escaped = text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
    return re.sub(r"\s*[\r\n]+\s*", " ", escaped)


def composed(text: str) -> Markdown:
    """A cell a report composed as markdown, its code spans holding only checked names and numbers
    (a calibration target): pipes escaped and line breaks made spaces, its backticks kept."""
    return Markdown(re.sub(r"\s*[\r\n]+\s*", " ", text.replace("|", "\\|")))


def code(text: str, in_table: bool = True) -> Markdown:
    """`text` as a code span that shows it whole: a fence of more backticks than any run inside it,
    line breaks made spaces, and in a table cell pipes escaped (GFM reads `\\|` there as a pipe)."""
    text = re.sub(r"\s*[\r\n]+\s*", " ", text)
    if in_table:
        text = text.replace("|", "\\|")
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return Markdown(f"{ticks}{pad}{text}{pad}{ticks}")


def fenced(lines: Sequence[str]) -> str:
    """A fenced code block of `lines`, one line each (a line break inside one made a space), behind a
    fence longer than any run of backticks in them: no line can close it early."""
    flat = [re.sub(r"\s*[\r\n]+\s*", " ", line) for line in lines]
    longest = max((len(run) for line in flat for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return "\n".join([fence, *flat, fence])


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table (GFM), every cell escaped with `markdown_cell` unless it is `Markdown`."""
    def cells(row: Sequence[str]) -> str:
        return "| " + " | ".join(c if isinstance(c, Markdown) else markdown_cell(str(c)) for c in row) + " |"

    return "\n".join([cells(header), "|" + "---|" * len(header), *(cells(r) for r in rows)])


# ---------------------------------------------------------------------------- CSV


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?(inf|nan)", re.IGNORECASE)


def spreadsheet_safe(text: str) -> str:
    """A CSV cell a spreadsheet will not run as a formula: input beginning with = + - @ (or a tab or
    carriage return) gets a leading quote; numbers the reports formatted stay numbers."""
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not NUMBER.fullmatch(text):
        return "'" + text
    return text


def csv_text(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A CSV table through the csv module (quotes doubled, a line break kept inside its quoted
    cell), every cell `spreadsheet_safe`; lines end in a newline."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([spreadsheet_safe(str(c)) for c in header])
    writer.writerows([spreadsheet_safe(str(c)) for c in row] for row in rows)
    return buffer.getvalue()
