"""Leaderboard rows: the records' frame (harness/reports/table.py `records_frame`) grouped by
(dataset, run name, budget), each metric the list of its seeds' values, and each row's difference
to its dataset's baseline with the p of the paired t-test over seeds (`p_value`). The leaderboard
replaces the SumR ones with the stored rankings' bootstrap interval and randomization test where the
records have rankings, keeps this test as its marked fallback, and Holm-corrects every p it reports
(harness/reports/leaderboard.py `judge`).

The floor below every report that reads run records: the leaderboard's tables
(harness/reports/leaderboard.py) and the reports it rebuilds beside them (harness/reports/buckets.py,
harness/reports/noise.py, harness/reports/calibration.py) all group and judge records through here and
format them through table.py, so a record counts in the same row and a figure reads the same in each.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd
from scipy import stats

from prvr.harness.base.registry import marked_method
from prvr.harness.engine.record_types import RunRecord
# The columns and record readers live with the results table (harness/reports/table.py); they are
# kept importable from here, where the reports and commands have always found them.
from prvr.harness.reports.table import (COLUMNS, MOMENT_DECIMALS, MOMENT_DEFAULTS, MOMENT_KEY,  # noqa: F401
                                        MOMENT_SUM, MOMENT_TIOUS, ORACLE_SUMR, PRVR_KEYS, RELEVANCE_COLUMNS, VR_KEYS,
                                        Column, carries_moments, dataset_label, diverged, figures, is_metric_key,
                                        is_moment_key, moment_columns, near_cap, record_protocol, records_frame,
                                        value_at)


def build_rows(records: list[RunRecord]) -> list[dict[str, Any]]:
    """One row per (dataset, run name, budget) of the records' frame (table.records_frame): seeds
    trained under different budgets never average together, and a row off its dataset's protocol
    is marked and gets no Δ. Diverged runs (`diverged`) enter no row."""
    return rows_of(records_frame(records))


def rows_of(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """`build_rows` of a frame: each figure the list of its seeds' values, [] where some seed
    lacks it (an empty cell, not a partial mean)."""
    kept = frame[~frame["diverged"]]
    groups = sorted(kept.groupby(["dataset", "run", "budget"], sort=False),
                    key=lambda kv: (kv[0][0], kv[0][1] != baseline(), kv[0][1], kv[0][2]))
    rows = [_row(group.sort_values("seed", kind="stable"), figures(frame)) for _, group in groups]
    _add_significance(rows)
    _add_moment_significance(rows)
    return rows


def _row(group: pd.DataFrame, names: list[str]) -> dict[str, Any]:
    first = group.iloc[0]
    row: dict[str, Any] = {
        "dataset": first["dataset"], "run": first["run"], "budget": first["budget"],
        "on_protocol": bool(first["on_protocol"]), "protocol": first["protocol"],
        "dataset_protocol": first["dataset_protocol"], "method": first["method"], "backbone": first["backbone"],
        "relations": first["relations"], "tag": first["tag"], "seeds": [int(s) for s in group["seed"]],
        "n": len(group), "best_epochs": [(_int(b), _int(n)) for b, n in zip(group["best_epoch"], group["epochs_run"])],
        "near_cap": [c for c in group["near_cap"] if isinstance(c, dict)],
        "commands": sorted(set(group["command"]) - {""}),
        "uncommitted": [int(s) for s, dirty in zip(group["seed"], group["uncommitted"]) if dirty],
        "world": first["world"]}
    for name in names:
        values = group[name]
        row[name] = [float(v) for v in values] if values.notna().all() else []
    row["localizes"] = bool(group["localizes"].any())
    row["relevance"] = list(dict.fromkeys(p for p in group["relevance"] if isinstance(p, str)))
    return row


def _int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def baseline_rows(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The on-protocol runs of the baseline, plain or tagged (`baseline~train_videos3000`), by (dataset, run)."""
    plain = baseline()
    return {(r["dataset"], r["run"]): r for r in rows
            if r["run"].partition("~")[0] == plain and r["on_protocol"]}


def same_tag_or_plain(row: dict[str, Any], name: str,
                      find: Callable[[str], dict[str, Any] | None]) -> dict[str, Any] | None:
    """The run `name` a row is compared with: `name` under the row's own tag where it was made (a sweep's
    `msl~repeat_prob0` for `ral@msl~repeat_prob0`, `baseline~train_videos3000` for
    `msl~train_videos3000`: the same world and training regime), else the plain `name`; either only on the
    row's test set (`same_world`), and never the row itself. `find` looks a run name up among the rows."""
    tag = row["run"].partition("~")[2]
    for candidate in ([f"{name}~{tag}"] if tag else []) + [name]:
        b = find(candidate)
        if b is not None and b is not row and same_world(row, b):
            return b
    return None


def reference_row(row: dict[str, Any], base: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any] | None:
    """The baseline run a row's Δ SumR is taken against (`same_tag_or_plain` over `baseline_rows`)."""
    return same_tag_or_plain(row, baseline(), lambda name: base.get((row["dataset"], name)))


def _add_significance(rows: list[dict[str, Any]]) -> None:
    base = baseline_rows(rows)
    for r in rows:
        b = reference_row(r, base)
        r["delta"], r["p"] = None, None
        if b is None or not r["on_protocol"] or not r["SumR"] or not b["SumR"]:
            continue
        r["delta"], r["p"] = compare(r, b, "SumR")


def same_world(row: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether two rows were tested on one test set (a sweep's rows are other worlds: no Δ against the plain
    baseline); rows whose records state no facts are taken as their dataset's."""
    return not row.get("world") or not base.get("world") or row["world"] == base["world"]


def compare(row: dict[str, Any], other: dict[str, Any], key: str) -> tuple[float, float | None]:
    """Δ of the mean of `key` (row minus other) and its p-value over the seeds (`p_value`)."""
    return (float(np.mean(row[key]) - np.mean(other[key])),
            p_value(dict(zip(row["seeds"], row[key])), dict(zip(other["seeds"], other[key]))))


def baseline() -> str:
    """The run every row of its dataset is compared with (Δ SumR): the registered method whose spec
    says `reference` (the baseline's, methods/baseline.py)."""
    return marked_method("reference")


def moment_baseline() -> str:
    """The run the moment table's Δ VCMR SumR compares with: the registered method whose spec
    says `moment_reference` (XML's, registered in methods/xml.py)."""
    return marked_method("moment_reference")


def _add_moment_significance(rows: list[dict[str, Any]]) -> None:
    """Δ VCMR SumR (`vcmr_delta`, `vcmr_p`) of each row of a dataset whose runs localize, against
    the dataset's `xml` row, as `_add_significance` does for SumR."""
    reference = moment_baseline()
    base = {r["dataset"]: r for r in rows if r["run"] == reference and r["on_protocol"] and r.get("localizes")}
    for r in rows:
        b = base.get(r["dataset"])
        r["vcmr_delta"], r["vcmr_p"] = None, None
        if b is None or r is b or not r["on_protocol"] or not r.get(MOMENT_SUM.name) or not b.get(MOMENT_SUM.name) \
                or not same_world(r, b):
            continue
        r["vcmr_delta"], r["vcmr_p"] = compare(r, b, MOMENT_SUM.name)


def seed_interval(a: dict[int, float], b: dict[int, float],
                  level: float = 0.95) -> tuple[float, float | None, float | None, float | None]:
    """(difference, low, high, p) of two rows' figures by seed, the interval and p of one test: over two or
    more shared seeds, the mean paired difference with the paired t-test's interval and p
    (scipy.stats.ttest_rel; equal differences: the point, p 0, or 1 where they are 0); else, each row with
    two or more seeds, the difference of the means with Welch's (ttest_ind, equal_var=False); else the
    difference of the means, with no interval or p."""
    shared = sorted(set(a) & set(b))
    if len(shared) >= 2:
        x, y = [a[s] for s in shared], [b[s] for s in shared]
        diffs = np.subtract(x, y)
        mean = float(diffs.mean())
        if np.allclose(diffs, diffs[0]):
            return mean, mean, mean, 0.0 if diffs[0] != 0 else 1.0
        paired = stats.ttest_rel(x, y)
        ci = paired.confidence_interval(level)
        return mean, float(ci.low), float(ci.high), float(paired.pvalue)
    delta = float(np.mean(list(a.values())) - np.mean(list(b.values())))
    if len(a) < 2 or len(b) < 2:
        return delta, None, None, None
    welch = stats.ttest_ind(list(a.values()), list(b.values()), equal_var=False)
    ci = welch.confidence_interval(level)
    return delta, float(ci.low), float(ci.high), float(welch.pvalue)


def p_value(a: dict[int, float], b: dict[int, float]) -> float | None:
    """p of the difference of two rows' figures by seed (`seed_interval`'s test): the paired t-test over
    the shared seeds (two or more), else Welch's test where each has two or more, else None."""
    return seed_interval(a, b)[3]
