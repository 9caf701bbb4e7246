"""Leaderboard rows: run records grouped by (dataset, run name, budget), each metric the list of
its seeds' values, and each row's difference to its dataset's baseline with a p-value.

The floor below every report that reads run records: the leaderboard's tables
(harness/reports/leaderboard.py) and the reports it rebuilds beside them (harness/reports/buckets.py,
harness/reports/noise.py, harness/reports/calibration.py) all group, judge and format records through here, so
a record counts in the same row and a figure reads the same in each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
from scipy import stats

from prvr.harness.engine.record_types import RunProtocol, RunRecord
from prvr.harness.engine.records import budget_label, run_protocol
from prvr.harness.base.registry import marked_method


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


def build_rows(records: list[RunRecord]) -> list[dict[str, Any]]:
    """One row per (dataset, run name, budget): seeds trained under different budgets never
    average together, and a row off its dataset's protocol is marked and gets no Δ. Diverged
    runs (`diverged`) enter no row."""
    groups: dict[tuple[str, str, str], list[RunRecord]] = {}
    kept = [r for r in records if not diverged(r)]
    moments = moment_columns(r["metrics"].get("test", {}) for r in kept)
    columns = (*COLUMNS, *moments, *((MOMENT_SUM,) if moments else ()),
               *(c for c in RELEVANCE_COLUMNS if c not in COLUMNS))
    for r in kept:
        groups.setdefault((dataset_label(r), r.get("run_name", r["method"]), budget_label(record_protocol(r))),
                          []).append(r)
    rows = []
    for (dataset, name, budget), recs in sorted(groups.items(),
                                                key=lambda kv: (kv[0][0], kv[0][1] != baseline(), kv[0][1], kv[0][2])):
        recs = sorted(recs, key=lambda r: r["seed"])
        protocol = record_protocol(recs[0])
        row = {"dataset": dataset, "run": name, "budget": budget, "on_protocol": protocol["follows_protocol"],
               "protocol": budget_label(protocol["dataset_protocol"]), "dataset_protocol": protocol["dataset_protocol"],
               "method": recs[0]["method"], "backbone": recs[0].get("backbone", ""),
               "relations": recs[0].get("relations", ""), "tag": recs[0].get("tag", ""),
               "seeds": [r["seed"] for r in recs], "n": len(recs),
               "best_epochs": [(r.get("best_epoch"), r.get("epochs_run")) for r in recs],
               "near_cap": [c for r in recs if (c := near_cap(r)) is not None],
               "commands": sorted({r.get("command", "") for r in recs} - {""})}
        for col in columns:
            values = [v for r in recs if (v := value_at(r["metrics"].get("test", {}), col.path)) is not None]
            row[col.name] = values if len(values) == len(recs) else []  # empty cell, not a partial mean
        row["localizes"] = any(carries_moments(r["metrics"].get("test", {})) for r in recs)
        row["relevance"] = relevance_coverage(recs)
        rows.append(row)
    _add_significance(rows)
    _add_moment_significance(rows)
    return rows


def relevance_coverage(records: list[RunRecord]) -> list[str]:
    """What the test split's relevance file covered in these runs, one phrase per distinct file
    (`provenance.data.relevance.test`, written where a real dataset joined one); [] for none."""
    phrases = []
    for r in records:
        data = (r.get("provenance") or {}).get("data") or {}
        test = (data.get("relevance") or {}).get("test") if isinstance(data.get("relevance"), dict) else None
        if isinstance(test, dict) and test.get("covered"):
            note = f"; {test['note']}" if test.get("note") else ""
            phrases.append(f"{test.get('covered', 0):,} of {test.get('queries', 0):,} test queries "
                           f"(`{test.get('file', '?')}`{note})")
    return list(dict.fromkeys(phrases))


def _add_significance(rows: list[dict[str, Any]]) -> None:
    base = {r["dataset"]: r for r in rows if r["run"] == baseline() and r["on_protocol"]}
    for r in rows:
        b = base.get(r["dataset"])
        r["delta"], r["p"] = None, None
        if b is None or r is b or not r["on_protocol"] or not r["SumR"] or not b["SumR"]:
            continue
        r["delta"], r["p"] = compare(r, b, "SumR")


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
        if b is None or r is b or not r["on_protocol"] or not r.get(MOMENT_SUM.name) or not b.get(MOMENT_SUM.name):
            continue
        r["vcmr_delta"], r["vcmr_p"] = compare(r, b, MOMENT_SUM.name)


def p_value(a: dict[int, float], b: dict[int, float]) -> float | None:
    """p of the difference of two rows' figures by seed: the paired t-test over the shared seeds
    (two or more), else Welch's test where each has two or more, else None."""
    shared = sorted(set(a) & set(b))
    if len(shared) >= 2:
        diffs = [a[s] - b[s] for s in shared]
        if np.allclose(diffs, diffs[0]):
            return 0.0 if diffs[0] != 0 else 1.0
        return float(stats.ttest_rel([a[s] for s in shared], [b[s] for s in shared]).pvalue)
    if len(a) >= 2 and len(b) >= 2:
        return float(stats.ttest_ind(list(a.values()), list(b.values()), equal_var=False).pvalue)
    return None


def fmt(values: list[float], decimals: int = 1) -> str:
    """A cell: empty for no values, the value for one seed, mean ± sample std for more."""
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.{decimals}f}"
    return f"{np.mean(values):.{decimals}f} ± {np.std(values, ddof=1):.{decimals}f}"


def csv_cell(text: str) -> str:
    """A CSV cell, quoted where it holds a comma or a quote."""
    return f'"{text}"' if "," in text or '"' in text else text


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
