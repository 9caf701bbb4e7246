"""Leaderboard tables derived only from run records (never edited by hand).

One row per (dataset, run name) where the run name encodes method, detector, backbone and
tag. Each metric is mean +- std over seeds with the number of seeds; a row's SumR is
compared with the baseline's on the same dataset (`judge`: from the runs' stored rankings, the
difference over the shared seeds with its 95% two-level paired bootstrap interval and the p of the
paired randomization test, harness/reports/stats.py; where a row has no stored rankings or shares
fewer than two seeds, the marked fallback: the paired t-test over seeds, Welch's test, or none), and
every p is Holm-corrected over its table's family (a dataset's comparisons with its baseline, with its
moment reference, of its plug-in rows with their backbones). A missing metric is an empty
cell, never a mean over what happens to exist.
A run whose loss became non-finite (trained on with train.on_nonfinite=continue, its
record marked `nonfinite`) never enters a row: it is listed under the table instead. The
records of `bench --quick` (tagged `quick`, harness/reports/quick.py) enter no table or figure at all.
Where records carry noise robustness curves, the noise figures and tables are rebuilt too
(`<out>/noise/<dataset>.{png,md}`, harness/reports/noise.py), and so are the M/V bucket charts of the
runs on their dataset's protocol (`<out>/buckets/<dataset>.{png,md}`, harness/reports/buckets.py).

The columns follow the metrics the records carry: where the runs of a dataset localize (their
records carry VCMR / SVMR figures, harness/engine/vcmr.py), a second table shows them (VCMR, SVMR and
VR R@K, two decimals as the SBERT-PR paper gives them), with Δ VCMR SumR to the dataset's `xml`
row; a dataset without them is shown as before. The papers' figures (methods/reported.yaml)
follow in their own rows: the PRVR ones in the PRVR columns, the moment ones in the moment columns.

The markdown opens with one headline table per dataset (its runs without a `~tag`), then *Variants
and ablations* (the `~tag` runs), the notes, the comparisons and the papers' figures, and ends with
the commands that made the records (*Produced by*). A record naming a method, backbone or relation
detector that is not registered is refused in one line (`registered_name_problem`).

The rows themselves (grouping, means over seeds, Δ and p) are built in harness/reports/rows.py from
the records' frame, and every table and CSV is written by harness/reports/table.py (`markdown_table`,
`csv_text`, `mean_std`, `fenced`: cells from records escaped), the floors below this file and below
the reports it rebuilds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any


from prvr.harness.reports import buckets, calibration, noise

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, read_yaml, write_texts
from prvr.harness.reports.quick import QUICK_TAG, is_quick
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.rankings import rankings_path
from prvr.harness.engine.records import load_record_at, record_path
from prvr.harness.base.names import unknown_message
from prvr.harness.base.registry import BACKBONES, DETECTORS, METHODS, Registry
# The rows and their figures (harness/reports/rows.py); the names below that this file does not use are
# kept importable from here, where callers and tests have always found them.
from prvr.harness.reports.rows import (COLUMNS, MOMENT_DECIMALS, MOMENT_DEFAULTS, MOMENT_SUM,  # noqa: F401
                               MOMENT_TIOUS, ORACLE_SUMR, PRVR_KEYS, RELEVANCE_COLUMNS, build_rows, carries_moments,
                               compare, dataset_label, seed_interval, diverged, is_metric_key, moment_columns,
                               moment_baseline, near_cap, reference_row, baseline_rows, same_tag_or_plain, same_world)
from prvr.harness.reports.findings import findings
from prvr.harness.reports import stats
from prvr.harness.reports.table import (Markdown, code, csv_text, fenced, markdown_cell, markdown_table, mean_and_std,
                                        mean_std)

KEY_COLUMNS = ("dataset", "method", "backbone", "relations", "tag")
RECORD_NAME = re.compile(r"seed-?\d+\.json")


# The papers' figures (methods/reported.yaml): the keys every row has, the optional ones, and the
# metric keys (PRVR_KEYS or MOMENT_KEY). An entry is a row or a group of rows (`rows:`) whose other
# keys its rows share; `columns` + `figures` give metric keys and values in the paper's order.
REPORTED_KEYS = ("method", "dataset", "features", "source")
REPORTED_OPTIONAL = ("table", "split", "condition", "phi", "theta", "terms", "label", "note", "leaderboard")
REPORTED_FILE = "methods/reported.yaml"


def paper_figures(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Every row of the papers' figures (methods/reported.yaml), groups flattened: each row a dict
    of its (and its group's) keys, metric keys included. Checked: a row names method, dataset,
    features and source, holds the five PRVR figures or VCMR / SVMR figures, and no other key."""
    if path is None:
        from importlib.resources import files

        path = Path(str(files("prvr.methods") / "reported.yaml"))
    path = Path(path)
    items = read_yaml(path, "reported figures", "restore methods/reported.yaml from version control") or []
    if not isinstance(items, list):
        raise UserError(f"{path} holds {type(items).__name__}; it must be a list of rows and groups of rows")
    rows = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and "rows" in item:
            shared = {k: v for k, v in item.items() if k != "rows"}
            if not isinstance(item["rows"], list):
                raise UserError(f"{path}: entry {i + 1} key 'rows' must be a list of rows")
            rows += [_reported_row({**shared, **r} if isinstance(r, dict) else r, f"entry {i + 1} row {j + 1}", path)
                     for j, r in enumerate(item["rows"])]
        else:
            rows.append(_reported_row(item, f"entry {i + 1}", path))
    return rows


def _reported_row(item: Any, where: str, path: Path) -> dict[str, Any]:
    """One checked row: `columns` and `figures` turned into metric keys."""
    if not isinstance(item, dict):
        raise UserError(f"{path}: {where} is {type(item).__name__}, not a mapping of keys")
    row = dict(item)
    columns, figures = row.pop("columns", []), row.pop("figures", [])
    if not isinstance(columns, list) or not isinstance(figures, list) or len(columns) != len(figures):
        raise UserError(f"{path}: {where} has {len(figures) if isinstance(figures, list) else 'no list of'} figures "
                        f"for {len(columns) if isinstance(columns, list) else 'no list of'} columns; give one figure "
                        "per column, in the columns' order")
    for key, value in zip(columns, figures):
        if key in row:
            raise UserError(f"{path}: {where} gives '{key}' twice (a key and a column); keep one")
        row[key] = value
    unknown = [str(k) for k in row if k not in REPORTED_KEYS + REPORTED_OPTIONAL and not is_metric_key(k)]
    if unknown:
        raise UserError(f"{path}: {where} has unknown key(s) {', '.join(unknown)}; a row's keys are "
                        f"{', '.join(REPORTED_KEYS + REPORTED_OPTIONAL)} and metric keys {', '.join(PRVR_KEYS)}, "
                        "VCMR-<tIoU> R@<k>, SVMR-<tIoU> R@<k>")
    missing = [k for k in REPORTED_KEYS if k not in row] + \
        ([] if carries_moments(row) else [k for k in PRVR_KEYS if k not in row])
    if missing:
        raise UserError(f"{path}: {where} lacks {', '.join(missing)}; every entry needs "
                        f"{', '.join(REPORTED_KEYS)} and either {', '.join(PRVR_KEYS)} or VCMR / SVMR figures")
    bad = [k for k in row if is_metric_key(k) and (isinstance(row[k], bool) or not isinstance(row[k], (int, float)))]
    if bad:
        raise UserError(f"{path}: {where} figure(s) {', '.join(bad)} are not numbers; write them as the paper does, "
                        "e.g. 0.3")
    return row


def _on_leaderboard(row: dict[str, Any]) -> bool:
    return row.get("leaderboard", True) is not False


def reported_rows(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The papers' PRVR figures the leaderboard shows: separate rows, never mixed into means; each
    holds R@1, R@5, R@10, R@100 and SumR."""
    return [r for r in paper_figures(path) if _on_leaderboard(r) and not carries_moments(r)]


def reported_moment_rows(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The papers' moment retrieval figures the leaderboard shows (SBERT-PR Tables 5-6): rows with
    VCMR / SVMR figures, from groups not marked `leaderboard: false` (those are the ablation
    tables', `prvr-bench ablate`)."""
    return [r for r in paper_figures(path) if _on_leaderboard(r) and carries_moments(r)]


TABLE_METRICS = ("R@1", "R@5", "R@10", "R@100", "SumR")  # every record on the leaderboard has them


def collect(root: str | Path, skip_bad: bool = False) -> list[RunRecord]:
    """All run records under root/runs (sorted); a bad record is an error unless skipped."""
    return collect_checked(root, skip_bad)[0]


def collect_checked(root: str | Path, skip_bad: bool = False) -> tuple[list[RunRecord], list[str]]:
    """All run records under root/runs (sorted), each checked (records.load_record_at: its shape,
    its values, its place), and no two seeds of a run with the same results (a record copied
    under another seed); a bad record is an error, or with `skip_bad` left out and listed
    (the second list: one phrase each, for the note under the table)."""
    # Records are runs/<dataset>/<run>/seed<S>.json; other files there (figures, tables
    # written next to a record, e.g. seed0.fig4.json) are not records.
    files = sorted(f for f in Path(root).glob("runs/*/*/seed*.json") if RECORD_NAME.fullmatch(f.name))
    records: list[RunRecord] = []
    skipped: list[str] = []
    seen: dict[tuple[Path, str], Path] = {}
    for f in files:
        try:
            record = load_record_at(f)
            unregistered = registered_name_problem(record)
            if unregistered:
                raise UserError(f"run record {f} key {unregistered}; delete it or re-run that run")
            missing = [k for k in TABLE_METRICS if k not in record["metrics"]["test"]]
            if missing:  # an empty cell would pass for a figure nobody measured
                raise UserError(f"run record {f} key 'metrics.test.{missing[0]}': missing, the table shows it; "
                                "restore the record or re-run that run")
            # a trained run's history (per-epoch losses) differs between seeds; records without one
            # (hand-made, older) are not compared
            results = json.dumps([record["metrics"], record.get("history")], sort_keys=True)
            twin = seen.setdefault((f.parent, results), f) if record.get("history") else f
            if twin != f:
                raise UserError(f"run record {f} holds the same results as {twin.name} (metrics and history): a copy "
                                "under another seed, not a second seed; delete it or re-run that seed")
            records.append(record)
        except UserError as e:
            if not skip_bad:
                raise UserError(f"{e} (or pass --skip-bad to leave it out of the tables)") from None
            progress.log(f"[yellow]skipped[/]: {e}")
            skipped.append(str(e))
    return records, skipped


# The record keys that name a registered part, and the registry each must be in (a tag is free-form)
REGISTERED_KEYS: tuple[tuple[str, Registry[Any]], ...] = (("method", METHODS), ("backbone", BACKBONES),
                                                           ("relations", DETECTORS))


def registered_name_problem(record: RunRecord) -> str | None:
    """The first key naming a method, backbone or relation detector that is not registered, with the
    registry's answer (the known names); None when all are. An absent or empty backbone or relations
    (older records) passes: the method is required."""
    for key, registry in REGISTERED_KEYS:
        name = record.get(key, "")
        if (name or key == "method") and name not in registry:
            return f"{key!r}: {unknown_message(registry.kind, name, registry.names())}"
    return None


def protocol_sentence(protocol: dict[str, Any]) -> str:
    """A dataset protocol (records.dataset_protocol) in words, for the note above the table."""
    figure = protocol["selection"]
    fallback = " (val SumR for a backbone that does not localize)" if protocol.get("select_on") == "vcmr" else ""
    return (f"at most {protocol['epochs']} epochs, early stop after {protocol['patience']} epochs without a "
            f"{figure} gain{fallback}, the best {figure} epoch tested")


def diverged_runs(records: list[RunRecord]) -> list[str]:
    """The marked runs, one phrase each, for the note under the table."""
    out = []
    for r in sorted(records, key=lambda r: (r["dataset"], r.get("run_name", ""), r["seed"])):
        if r.get("nonfinite"):
            nonfinite = r["nonfinite"] if isinstance(r["nonfinite"], dict) else {}
            out.append(f"{dataset_label(r)} {r.get('run_name', r['method'])} seed {r['seed']} (loss not finite "
                       f"from epoch {nonfinite.get('epoch', '?')}, step {nonfinite.get('step', '?')})")
        elif diverged(r):
            at = r["degenerate"] if isinstance(r["degenerate"], dict) else {}
            why = (f"test scores: {at['scores']}" if "scores" in at else
                   f"every loss part exactly 0 in epoch {at.get('epoch', '?')}")
            out.append(f"{dataset_label(r)} {r.get('run_name', r['method'])} seed {r['seed']} ({why}: degenerate)")
    return out


def relevance_table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows scored against a relevance file (real data): oracle SumR, dense R@K, the
    multi-relevant share and the coverage; [] when no row has one."""
    rows = [r for r in rows if r.get("relevance")]
    if not rows:
        return []
    head = ["dataset", "run", "seeds", *(c.name for c in RELEVANCE_COLUMNS), "covers"]
    return ["", "## Verified relevance", "",
            "Rows whose test split was joined to a relevance file (docs/evaluation.md, \"Relevance files\"), over "
            "the queries it covers: oracle SumR counts a hit when any relevant video is in the top K; dense R@K "
            "(prvr-ea's multi-GT recall) is |top K ∩ relevant| / |relevant| per query, averaged; multi-relevant % "
            "= share of covered queries with more than one relevant video. Verified labels mined from models' top "
            "candidates are a lower bound on relevance.", "",
            markdown_table(head, ([r["dataset"], r["run"], str(r["n"]), *(mean_std(r[c.name]) for c in RELEVANCE_COLUMNS),
                                   Markdown("; ".join(r["relevance"]))] for r in rows))]


def backbone_row_name(row: dict[str, Any]) -> str | None:
    """The run a plug-in row is compared with: the backbone's own run under the same relations
    (`ral@msl` -> `msl`, `ral@msl+oracle` -> `msl+oracle`, `ral` on gmmformer2 -> `gmmformer2`,
    `xml-pr~c1` -> `xml`); None where the method is its own backbone (arl, xml) or has none."""
    method, backbone = row.get("method", ""), row.get("backbone", "")
    if not backbone or backbone == method:
        return None
    relations = row.get("relations") or "none"
    suffix = f"+{relations}" if relations != "none" and f"+{relations}" in row["run"] else ""
    return backbone + suffix


def backbone_comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each on-protocol plug-in row against its backbone's row (`backbone_row_name`) on the same
    dataset and budget: mean SumR of both, Δ SumR with its interval and test (`judge`), the difference
    per shared seed, and Δ oracle SumR (from the stored rankings and the simulated world's relevance where
    both rows have them, as Δ SumR; else the t-test over seeds); no row where the backbone has no run."""
    judged(rows)
    return [r["backbone_comparison"] for r in rows if r.get("backbone_comparison")]


def _backbone_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    by_name = {(r["dataset"], r["run"], r["budget"]): r for r in rows}
    out = []
    for r in rows:
        name = backbone_row_name(r)
        # the backbone's run on the row's world and regime; a row whose world no backbone run shares gets no Δ
        b = same_tag_or_plain(r, name, lambda n: by_name.get((r["dataset"], n, r["budget"]))) if name else None
        if b is None or not r["on_protocol"] or not r["SumR"] or not b["SumR"]:
            continue
        out.append((r, b))
    return out


# ----------------------------------------------------------------------------- the statistics of each Δ
# Every Δ the leaderboard reports, with its interval and p (harness/reports/stats.py, docs/statistics.md):
# from the runs' stored rankings where both rows have them for two shared seeds or more, else the fallback.
SETTINGS = stats.Settings(resamples=2000, permutations=2000, metrics=("SumR",))
RANDOMIZATION, T_TEST, WELCH = "randomization", "t-test", "Welch"
NO_RANKINGS = "no stored rankings (records made before rankings were stored)"
FEW_SEEDS = "fewer than 2 shared seeds"
NOT_RANKED = "a figure the stored rankings do not hold"
OTHER_WORLD = "rows of different worlds (another test set: the queries do not pair up)"


def judge(rows: list[dict[str, Any]], root: str | Path | None = None,
          records: list[RunRecord] | None = None, settings: stats.Settings = SETTINGS) -> None:
    """Every comparison of the leaderboard, set on its rows: Δ SumR vs the baseline (`comparison`,
    `delta`, `p`), Δ VCMR SumR vs the moment reference (`vcmr_comparison`, `vcmr_delta`, `vcmr_p`) and the
    plug-in row against its backbone (`backbone_comparison`). A SumR Δ between rows whose records under
    `root` have stored rankings for two or more shared seeds is `stats.compare_rows`'s (difference over
    the shared seeds, 95% two-level paired bootstrap interval, paired randomization test); any other is
    the fallback over the seeds' figures (`rows.seed_interval`: the paired t-test or Welch's, with its 95%
    interval, or no test), marked so. Holm's correction runs over the p-values of one table's comparisons
    (`p_holm`): a dataset's Δ SumR against its baseline (its headline table and its variants), its Δ VCMR
    SumR, and its plug-in rows against their backbones, each a family of its own."""
    files = {(dataset_label(r), r.get("run_name", r["method"]), r["seed"]):
             record_path(root, r["dataset"], r.get("run_name", r["method"]), r["seed"])
             for r in records or []} if root is not None else {}
    by_record = {key: r for r in records or [] for key in
                 [(dataset_label(r), r.get("run_name", r["method"]), r["seed"])]}

    # each record's rankings read once; with the oracle's column (its world rebuilt) where an oracle Δ reads the row
    loaded: dict[tuple[str, str, int], stats.SeedScores] = {}
    oracle_rows = {(x["dataset"], x["run"]) for pair in _backbone_pairs(rows)
                   if all(p.get(ORACLE_SUMR) for p in pair) for x in pair}

    def stored(row: dict[str, Any], seeds: list[int]) -> stats.Row | None:
        keys = [(row["dataset"], row["run"], s) for s in seeds]
        if not keys or any(k not in files or not rankings_path(files[k]).is_file() for k in keys):
            return None
        for k in keys:
            if k not in loaded:
                loaded[k] = stats.seed_scores(files[k], by_record[k], k[:2] in oracle_rows)
        scores = {s: loaded[k] for s, k in zip(seeds, keys)}
        return stats.Row(row["dataset"], row["run"], stats.world_of(by_record[keys[0]]), scores)

    def compared(a: dict[str, Any], b: dict[str, Any], metric: str = "SumR") -> dict[str, Any]:
        shared = sorted(set(a["seeds"]) & set(b["seeds"]))
        ra, rb = stored(a, shared), stored(b, shared)
        if ra is not None and rb is not None and ra.world != rb.world:
            return {**seed_test(a, b, metric), "why": OTHER_WORLD}
        if ra is not None and rb is not None and len(shared) >= max(2, settings.min_seeds):
            if not (stats.has_metric(ra, metric, shared) and stats.has_metric(rb, metric, shared)):
                return {**seed_test(a, b, metric), "why": NOT_RANKED}  # VCMR SumR without moment ranks, oracle SumR
                # of a world not rebuilt
            (d,) = stats.compare_rows(ra, rb, dataclasses.replace(settings, metrics=(metric,))).metrics
            return {"delta": d.difference, "low": d.low, "high": d.high, "p": d.p, "test": RANDOMIZATION,
                    "seeds": shared, "why": None}
        why = FEW_SEEDS if len(shared) < 2 else NO_RANKINGS
        return {**seed_test(a, b, metric), "why": why}

    base = baseline_rows(rows)
    moment = {r["dataset"]: r for r in rows
              if r["run"] == moment_baseline() and r["on_protocol"] and r.get("localizes")}
    found: list[dict[str, Any]] = []
    for r in rows:
        r["comparison"] = r["vcmr_comparison"] = r["backbone_comparison"] = None
        b = reference_row(r, base)
        if r.get("delta") is not None and b is not None:
            r["comparison"] = compared(r, b)
            r["comparison"]["against"] = b["run"]
            r["delta"], r["p"] = r["comparison"]["delta"], r["comparison"]["p"]
        m = moment.get(r["dataset"])
        if r.get("vcmr_delta") is not None and m is not None:
            r["vcmr_comparison"] = {**compared(r, m, MOMENT_SUM.name), "against": m["run"]}
        for kind, c in (("reference", r["comparison"]), ("moment", r["vcmr_comparison"])):
            if c:
                c["family"] = (kind, r["dataset"])
                found.append(c)
    for r, b in _backbone_pairs(rows):
        a_by, b_by = dict(zip(r["seeds"], r["SumR"])), dict(zip(b["seeds"], b["SumR"]))
        shared = sorted(set(a_by) & set(b_by))
        delta = {**compared(r, b), "against": b["run"]}
        oracle = ({**compared(r, b, ORACLE_SUMR), "against": b["run"]}
                  if r.get(ORACLE_SUMR) and b.get(ORACLE_SUMR) else None)
        r["backbone_comparison"] = {
            "dataset": r["dataset"], "run": r["run"], "against": b["run"], "seeds": r["seeds"],
            "against_seeds": b["seeds"], "shared": shared, "SumR": r["SumR"], "against_SumR": b["SumR"],
            "delta": delta["delta"], "p": delta["p"], "comparison": delta,
            "paired_deltas": [a_by[s] - b_by[s] for s in shared], "oracle_comparison": oracle,
            "oracle_delta": None if oracle is None else oracle["delta"],
            "oracle_p": None if oracle is None else oracle["p"]}
        for kind, c in (("backbone", delta), ("backbone oracle", oracle)):
            if c:
                c["family"] = (kind, r["dataset"])
                found.append(c)
    families: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in found:
        if c["p"] is not None and not math.isnan(c["p"]):
            families.setdefault(c.pop("family"), []).append(c)
        else:
            c.pop("family", None)
    for tested in families.values():
        for c, adjusted in zip(tested, stats.holm([c["p"] for c in tested])):
            c["p_holm"] = adjusted
    for c in found:
        c.setdefault("p_holm", None)
    for r in rows:
        r["judged"] = True


def judged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, judged (`judge`) from their figures alone where no rebuild judged them from their records."""
    if any(not r.get("judged") for r in rows):
        judge(rows)
    return rows


def seed_test(a: dict[str, Any], b: dict[str, Any], key: str) -> dict[str, Any]:
    """The fallback comparison over the seeds' figures (`rows.seed_interval`): the mean paired difference
    over two or more shared seeds with the paired t-test's 95% interval and p, Welch's where fewer are shared
    and each row has two or more seeds, else the difference of the means with no test."""
    delta, low, high, p = seed_interval(dict(zip(a["seeds"], a[key])), dict(zip(b["seeds"], b[key])))
    shared = sorted(set(a["seeds"]) & set(b["seeds"]))
    test = None if p is None else T_TEST if len(shared) >= 2 else WELCH
    return {"delta": delta, "low": low, "high": high, "p": p, "test": test, "seeds": shared}


def fallbacks(rows: list[dict[str, Any]]) -> list[str]:
    """The comparisons that fell back to a test over seeds, grouped by why, one phrase each."""
    why: dict[str, list[str]] = {}
    for r in judged(rows):
        for c in (r["comparison"], (r["backbone_comparison"] or {}).get("comparison")):
            if c and c["why"]:
                why.setdefault(c["why"], []).append(f"{r['dataset']} {r['run']} vs {c['against']}")
    out = []
    for reason, pairs in why.items():
        datasets = list(dict.fromkeys(p.split(" ", 1)[0] for p in pairs))
        if reason == NO_RANKINGS:
            out.append(f"{reason}: {len(pairs)} Δ SumR of {', '.join(datasets)}")
        else:
            out.append(f"{reason}: {'; '.join(pairs)}")
    return out


def backbone_table(rows: list[dict[str, Any]]) -> list[str]:
    comps = backbone_comparisons(rows)
    if not comps:
        return []
    head = ["dataset", "run", "against", "seeds / against seeds", "SumR", "against SumR", "Δ SumR",
            "per shared seed", "Δ oracle SumR"]
    body = [[c["dataset"], c["run"], c["against"], f"{' '.join(map(str, c['seeds']))} / "
             f"{' '.join(map(str, c['against_seeds']))}", mean_std(c["SumR"]), mean_std(c["against_SumR"]),
             fmt_comparison(c["comparison"]),
             " ".join(f"{s}: {d:+.1f}" for s, d in zip(c["shared"], c["paired_deltas"])) or "none shared",
             fmt_comparison(c["oracle_comparison"])] for c in comps]
    return ["", "## Against the backbone", "",
            "Each method run on another method's backbone (RAL on MS-SL, +PR on XML, ...) against that backbone's "
            "own row under the same relations and budget: Δ of mean test SumR with its interval and p as in the "
            "tables above (the stored rankings' bootstrap and randomization test, or the marked fallback), the "
            "difference per shared seed, and Δ of the oracle SumR (any truly relevant video counts), where both rows "
            "have it: from the stored rankings' top lists and the simulated world's relevance, rebuilt from each "
            "record's config, with the same bootstrap and test, else the marked fallback.",
            "", markdown_table(head, body)]


def fmt_comparison(c: dict[str, Any] | None, decimals: int = 1) -> str:
    """A Δ cell: the difference, its 95% bootstrap interval `[low, high]` where one was drawn, the p of its
    test (`p=` the randomization test's, `t-test p=` or `Welch p=` the fallback's) with Holm's adjusted p,
    and * where the adjusted p is below 0.05 and the interval, where there is one, excludes 0, ° where the
    adjusted p is below 0.05 but the interval holds 0 (the seeds disagree); `(no test)` where none could run."""
    if c is None or c.get("delta") is None:
        return ""
    text = f"{c['delta']:+.{decimals}f}"
    if c.get("low") is not None:
        text += f" [{c['low']:+.{decimals}f}, {c['high']:+.{decimals}f}]"
    p = c.get("p")
    if p is None or math.isnan(p):
        return text + " (no test)"
    label = {RANDOMIZATION: "p", T_TEST: "t-test p", WELCH: "Welch p"}.get(c.get("test") or "", "p")
    holm = c.get("p_holm")
    if holm is None:
        return text + f" ({label}={stats.fmt_p(p)})"
    return text + f" ({label}={stats.fmt_p(p)}, Holm {stats.fmt_p(holm)})" + significance_mark(c, holm)


def significance_mark(c: dict[str, Any], holm: float) -> str:
    """* where Holm's p is below 0.05 and the interval (where the cell has one) excludes 0; ° where
    Holm's p is below 0.05 but the interval holds 0; nothing otherwise."""
    if holm >= 0.05:
        return ""
    low, high = c.get("low"), c.get("high")
    return "°" if low is not None and high is not None and low <= 0 <= high else "*"


def fmt_delta(row: dict[str, Any], decimals: int = 1) -> str:
    """A row's Δ SumR cell (`fmt_comparison` of its judged comparison); a bare {delta, p} is the t-test's."""
    if "comparison" in row:
        return fmt_comparison(row["comparison"], decimals)
    if row.get("delta") is None:
        return ""
    return fmt_comparison({"delta": row["delta"], "p": row.get("p"), "test": T_TEST}, decimals)


def to_csv(rows: list[dict[str, Any]], reported: list[dict[str, Any]] | None = None) -> str:
    """The leaderboard as CSV (table.csv_text: the csv module, cells from input made safe for
    spreadsheets); where runs or reported rows hold moment figures, their columns (VCMR / SVMR keys
    and VCMR SumR, mean and std) and Δ VCMR SumR follow the PRVR ones."""
    reported = reported or []
    moments = [c for c in moment_columns([*rows, *reported]) if not c.name.startswith("VR ")]
    moments += [MOMENT_SUM] if moments else []
    header = ["dataset", "run", "budget", "on_protocol", "method", "backbone", "relations", "tag", "n_seeds", "seeds",
              "best/run epochs"]
    for col in (*COLUMNS, *moments):
        header += [f"{col.name} mean", f"{col.name} std"]
    header += ["delta SumR vs baseline", "low", "high", "p", "test", "p Holm", "against"]
    header += [f"delta VCMR SumR vs {moment_baseline()}", "p (VCMR SumR)", "test (VCMR SumR)",
               "p Holm (VCMR SumR)"] if moments else []
    body = []
    for r in judged(rows):
        cells = [r["dataset"], r["run"], r["budget"], str(r["on_protocol"]).lower(), r["method"], r["backbone"],
                 r["relations"], r["tag"], str(r["n"]), " ".join(map(str, r["seeds"])), epochs_cell(r)]
        for col in (*COLUMNS, *moments):
            spread = mean_and_std(r.get(col.name) or [])
            cells += ["", ""] if spread is None else \
                [f"{spread[0]:.3f}", "" if spread[1] is None else f"{spread[1]:.3f}"]
        c = r.get("comparison") or {}
        cells += [_csv_number(c.get("delta"), 3), _csv_number(c.get("low"), 3), _csv_number(c.get("high"), 3),
                  _csv_number(c.get("p"), 4), c.get("test") or "", _csv_number(c.get("p_holm"), 4),
                  c.get("against") or ""]
        if moments:
            v = r.get("vcmr_comparison") or {}
            cells += [_csv_number(v.get("delta"), 3), _csv_number(v.get("p"), 4), v.get("test") or "",
                      _csv_number(v.get("p_holm"), 4)]
        body.append([*cells, ""])
    for r in reported:
        cells = [r["dataset"], reported_name(r), "", "", r["method"], "", "reported", r["features"], "0", "", ""]
        for col in (*COLUMNS, *moments):
            cells += [f"{float(r[col.name]):.3f}" if col.name in r else "", ""]
        body.append([*cells, *[""] * 6, *([""] * 4 if moments else []), r["source"]])
    return csv_text([*header, "source"], body)


def _csv_number(value: float | None, decimals: int) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.{decimals}f}"


def reported_name(r: dict[str, Any]) -> str:
    """A reported row's run cell: the method, marked reported (and its condition, where given)."""
    return f"{r['method']} (reported, {r['condition']})" if r.get("condition") else f"{r['method']} (reported)"


def convergence_note(rows: list[dict[str, Any]]) -> str:
    """The convergence evidence of the budgets, from the records: the runs whose selected epoch
    lies among the last `patience` epochs of the cap, each with the spread of its last
    validation SumRs (a narrow spread is a plateau, not a curve the cap cut)."""
    hits = [(r, c) for r in rows for c in r.get("near_cap", [])]
    runs = sum(r["n"] for r in rows)
    if not hits:
        return (f"Convergence: each of the {runs} runs above selected an epoch before the last `patience` epochs "
                "of its cap (early stopping, not the cap, ended training).")
    listed = "; ".join(
        f"{r['dataset']} {r['run']} seed {c['seed']}: epoch {c['best']} of {c['cap']}"
        + (f", last {c['patience']} val SumRs {c['last'][0]:.1f}-{c['last'][1]:.1f}" if c["last"] else "")
        for r, c in hits)
    return (f"Convergence: {runs - len(hits)} of the {runs} runs above selected an epoch before the last "
            f"`patience` epochs of their cap; the others, with the spread of their last validation SumRs (a narrow "
            f"spread is a plateau the cap did not cut): {listed}.")


def epochs_cell(r: dict[str, Any]) -> str:
    """Per seed, the selected epoch (1-based) / the epochs run: the convergence evidence of a
    budget (a selected epoch next to the cap means the cap cut training short)."""
    return " ".join(f"{b + 1}/{n}" if isinstance(b, int) and isinstance(n, int) else "?"
                    for b, n in r.get("best_epochs", []))


def budget_cell(r: dict[str, Any]) -> str:
    return r["budget"] if r["on_protocol"] else f"{r['budget']} (off protocol)"


def table_cells(r: dict[str, Any]) -> list[str]:
    return [r["dataset"], r["run"], budget_cell(r), r["backbone"], r["relations"], str(r["n"]), epochs_cell(r)] \
        + [mean_std(r[c.name]) for c in COLUMNS] + [fmt_delta(r)]


STATISTICS_NOTE = (
    "Each Δ cell: the difference, then where both rows' records have stored rankings (`seed<S>.rank.npz`) for two or "
    "more shared seeds, its 95% interval `[low, high]` (two-level paired bootstrap over the shared seeds and then "
    f"their test queries, percentile interval of {SETTINGS.resamples} resamples; the difference is then over the "
    "shared seeds) and `p`, the two-sided paired randomization test over the (seed, query) pairs "
    f"({SETTINGS.permutations} permutations; harness/reports/stats.py, as `prvr-bench compare` draws them, random "
    f"seed {SETTINGS.seed}). Elsewhere the fallback over the seeds' figures, marked: `t-test p` (paired t-test over "
    "the shared seeds, the difference then over them), `Welch p` (Welch's test, fewer than two shared seeds), each "
    "with its test's 95% interval (scipy.stats: seeds are its only level, so with three it is wide), or "
    "`(no test)`. `Holm`: "
    "Holm's step-down adjusted p over the family of the table's comparisons (a dataset's Δ SumR against its "
    "baseline, headline and variant rows together; a dataset's backbone comparisons' Δ SumR, and their Δ oracle "
    "SumR; a dataset's moment comparisons), of either test; * Holm p < 0.05 and, where the cell has an interval, "
    "the interval excludes 0 (a claim that holds under both); ° Holm p < 0.05 while the interval holds 0: these "
    "trained models differ beyond test-query noise, but the difference does not survive resampling the seeds, "
    "so it is no claim. What a difference means: docs/statistics.md.")
TABLE_HEADER = ["dataset", "run", "budget", "backbone", "relations", "seeds", "best / run epochs"] + [c.name for c in COLUMNS] + ["Δ SumR vs baseline"]
COMMANDS = "Produced by"  # the last section: the commands that made the records


def is_variant(row: dict[str, Any]) -> bool:
    """A tagged run (`M~tag`: an ablation or another setting), shown under *Variants and ablations*
    rather than in its dataset's headline table."""
    return bool(row.get("tag")) or "~" in row["run"]


def headline_tables(rows: list[dict[str, Any]]) -> list[str]:
    """One table per dataset of its untagged rows: each method on its own, on each backbone it plugs
    into, and its +oracle row, with Δ SumR to the baseline."""
    lines: list[str] = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows if not is_variant(r)):
        mine = [r for r in rows if r["dataset"] == dataset and not is_variant(r)]
        lines += ["", f"## {markdown_cell(dataset)}", "", markdown_table(TABLE_HEADER, map(table_cells, mine))]
    return lines


def variants_table(rows: list[dict[str, Any]]) -> list[str]:
    variants = [r for r in rows if is_variant(r)]
    if not variants:
        return []
    return ["", "## Variants and ablations", "",
            "The tagged runs (`run~tag`: an ablation, or the method under other settings; the tag's settings are in "
            f"the command that made the run, under *{COMMANDS}*), in the columns of the tables above; a row's Δ SumR is "
            "against the baseline under its own tag where that run exists (`ral@msl~train_videos3000` against "
            "`baseline~train_videos3000`: the same world and regime), else against the plain baseline (the CSV's "
            "`against` column names it).", "",
            markdown_table(TABLE_HEADER, map(table_cells, variants))]


def notes(rows: list[dict[str, Any]], left_out: list[str] | None, skipped: list[str] | None) -> list[str]:
    """The notes under the tables: convergence, the runs left out, the files skipped, val = test."""
    lines = ["", convergence_note(rows)] if rows else []
    dirty = [r for r in rows if r.get("uncommitted")]
    if dirty:
        lines += ["", "Made from an uncommitted tree (the records' `provenance.git_dirty`; no commit holds the code "
                  "that made them, so `prvr-bench reproduce` cannot check them; re-run them from a clean checkout): "
                  + "; ".join(f"{markdown_cell(r['dataset'])} {markdown_cell(r['run'])} seeds "
                              f"{' '.join(map(str, r['uncommitted']))}" for r in dirty) + "."]
    if left_out:
        lines += ["", "Left out of the table: runs whose training loss became non-finite (trained on with "
                  "`train.on_nonfinite=continue`; their records are marked `nonfinite`)"
                  + (" or marked `degenerate` (every loss part exactly 0 for an epoch, or test scores that tell no "
                     "video apart)"
                     if any("degenerate" in x for x in left_out) else "") + ": "
                  + "; ".join(map(markdown_cell, left_out)) + "."]
    if skipped:
        lines += ["", f"Skipped (`--skip-bad`): {len(skipped)} file(s) under `runs/` that are not sound run records: "
                  + "; ".join(map(markdown_cell, skipped)) + "."]
    if any("val = test" in r["budget"] for r in rows):
        lines += ["", "Rows whose budget says *on val = test queries* selected their epoch on a val split that holds "
                  "the test queries (compared by content: datasets/selection.py), as the published MS-SL family "
                  "figures appear to; `--set data.val_from_train=N` selects on N held-out training videos instead, "
                  "and such rows never average with these."]
    return lines


def to_markdown(rows: list[dict[str, Any]], reported: list[dict[str, Any]] | None = None,
                left_out: list[str] | None = None, skipped: list[str] | None = None,
                found: list[str] | None = None) -> str:
    """The leaderboard: one headline table per dataset, the sweeps' and the matrix's gains (`found`,
    harness/reports/findings.py), the variants and ablations, the notes, the backbone, relevance and
    moment tables, the papers' figures, and last the commands."""
    commands = sorted({c for r in judged(rows) for c in r["commands"]})
    lines = ["# Leaderboard", "",
             "Generated by `nox -s leaderboard` from the run records under `results/runs/`; do not edit by hand. "
             "First one table per dataset of its runs without a `~tag` (each method, on each backbone it plugs "
             "into, +oracle), then the sweeps' and the matrix's gains against the oracle's room, then *Variants and "
             "ablations* (the `~tag` runs), the comparisons and the papers' "
             f"figures; the commands that made the records are at the end (*{COMMANDS}*).",
             "Test split, percent; mean ± sample std over seeds. Δ: difference of mean SumR to the `baseline` row "
             "of the same dataset. " + STATISTICS_NOTE + " oracle SumR counts a hit when "
             "any truly relevant video is in the top K (simulated data only" + (
                 "; real data with a relevance file: see *Verified relevance*" if any(r.get("relevance") for r in rows)
                 else "") + "). best / run epochs: per seed, the "
             "epoch selected on validation (by the figure the protocol names; 1-based) / the epochs trained "
             "before early stopping or the cap.", ""]
    protocols = sorted({(r["dataset"], r["protocol"]): r["dataset_protocol"] for r in rows}.items())
    if protocols:
        lines += ["Protocol (every row of a dataset; the `budget` column shows each row's own, and a row "
                  "off its dataset's protocol is marked and gets no Δ): "
                  + "; ".join(f"{d}: {protocol_sentence(p)}" for (d, _), p in protocols) + "."]
    lines += headline_tables(rows)
    lines += found or []
    lines += variants_table(rows)
    lines += notes(rows, left_out, skipped)
    fallen = fallbacks(rows)
    if fallen:
        lines += ["", "Δ with the fallback test over seeds (`t-test p` or `Welch p`, its interval the test's): "
                  + "; ".join(map(markdown_cell, fallen)) + "."]
    lines += backbone_table(rows)
    lines += relevance_table(rows)
    lines += moment_table(rows)
    lines += reported_tables(reported or [])
    if commands:
        lines += ["", f"## {COMMANDS}", "", "The commands that made the records (`nox -s bench -- ARGS` runs "
                  "`prvr-bench bench ARGS`):", "", fenced(commands)]
    return "\n".join(lines) + "\n"


def reported_tables(reported: list[dict[str, Any]]) -> list[str]:
    """The papers' figures: the PRVR rows, then the moment retrieval rows."""
    prvr = [r for r in reported if not carries_moments(r)]
    moments = [r for r in reported if carries_moments(r)]
    lines = ["", "## Reported in the papers", ""] if prvr or moments else []
    if prvr:
        head = ["dataset", "method", "features", "R@1", "R@5", "R@10", "R@100", "SumR", "source"]
        lines += ["Not reproduced here: the figures the papers report on the real datasets (from "
                  "`methods/reported.yaml`), for comparison with runs on `tvr` / `activitynet`.", "",
                  markdown_table(head, ([str(r[k]) for k in head] for r in prvr))]
    return lines + reported_moment_table(moments, after_prvr=bool(prvr))


def moment_table(rows: list[dict[str, Any]]) -> list[str]:
    """The moment retrieval table: every row of each dataset whose runs localize; [] when none do."""
    datasets = {r["dataset"] for r in rows if r.get("localizes")}
    if not datasets:
        return []
    columns = (*moment_columns(rows), MOMENT_SUM)
    head = ["dataset", "run", "budget", "seeds", *(c.name for c in columns), f"Δ VCMR SumR vs {moment_baseline()}"]
    body = [[r["dataset"], r["run"], budget_cell(r), str(r["n"]),
             *(mean_std(r.get(c.name) or [], c.decimals) for c in columns),
             fmt_comparison(r.get("vcmr_comparison"), MOMENT_DECIMALS)]
            for r in judged(rows) if r["dataset"] in datasets]
    return ["", "## Moment retrieval", "",
            "The rows of the datasets whose runs localize (VCMR / SVMR: `harness/engine/vcmr.py`, docs/evaluation.md, "
            "\"Moment retrieval\"): test split, percent, mean ± sample std over seeds, two decimals. VR R@K are the "
            "video ranks of the table above; VCMR SumR sums the VCMR R@K over k and tIoU (the SBERT-PR paper picks "
            f"its conditions by this sum). Δ: difference of mean VCMR SumR to the `{moment_baseline()}` row of the "
            "same dataset, with the 95% interval of the two-level paired bootstrap and the randomization test's p "
            "where both rows' stored rankings hold per-query moment ranks (runs made since the rankings keep them), "
            "else the fallback, the paired t-test over shared seeds (`t-test p`); Holm-corrected over the dataset's "
            "Δ VCMR SumR (* Holm p < 0.05). An empty cell: a figure that not every "
            "seed of the row has (a backbone that does not localize has no VCMR / SVMR).", "",
            markdown_table(head, body)]


def reported_moment_table(reported: list[dict[str, Any]], after_prvr: bool = False) -> list[str]:
    """The papers' moment retrieval rows, in the moment columns that any of them fills."""
    if not reported:
        return []
    columns = [c for c in moment_columns(reported) if any(c.path[0] in r for r in reported)]
    head = ["dataset", "method", "condition", "split", "features", *(c.name for c in columns), "source"]
    datasets = " / ".join(code(d, in_table=False) for d in dict.fromkeys(r["dataset"] for r in reported))
    body = [[r["dataset"], r["method"], str(r.get("condition", "")), str(r.get("split", "")), r["features"],
             *(f"{float(r[c.path[0]]):.{c.decimals}f}" if c.path[0] in r else "" for c in columns), r["source"]]
            for r in reported]
    return [*([""] if after_prvr else []),
            "Moment retrieval, not reproduced here either (from `methods/reported.yaml`): the figures the papers "
            f"report for the conditions, for comparison with runs on {datasets}; the figures of their ablation "
            "tables are shown under the tables `prvr-bench ablate` writes. VR R@K: video ranks; an empty cell: a "
            "figure the paper does not give.", "",
            markdown_table(head, body)]


def write(root: str | Path, rows: list[dict[str, Any]], reported: list[dict[str, Any]] | None = None,
          left_out: list[str] | None = None, skipped: list[str] | None = None) -> tuple[Path, Path]:
    root = Path(root)
    csv_path, md_path = root / "leaderboard.csv", root / "leaderboard.md"
    markdown = to_markdown(rows, reported, left_out, skipped, findings(root))
    write_texts({Path(csv_path): to_csv(rows, reported), Path(md_path): markdown})
    return csv_path, md_path


TERMINAL_COLUMNS = ("R@1", "R@5", "R@10", "R@100", "SumR", "oracle SumR")


TERMINAL_TITLE = "prvr-bench leaderboard (test split, mean ± std over seeds)"
TERMINAL_HEADER = ("dataset", "run", "budget", "seeds", *TERMINAL_COLUMNS, "Δ SumR")


def terminal_rows(rows: list[dict[str, Any]],
                  reported: list[dict[str, Any]] | None = None) -> list[tuple[list[str], bool]]:
    """The cells of the short view: the headline columns (buckets are in the markdown and CSV),
    then reported rows (flagged True) only for datasets that have runs."""
    out = [([r["dataset"], r["run"], budget_cell(r), str(r["n"]), *[mean_std(r[c]) for c in TERMINAL_COLUMNS],
             fmt_delta(r)], False) for r in judged(rows)]
    datasets = {r["dataset"] for r in rows}
    for r in reported or []:
        if r["dataset"] in datasets and not carries_moments(r):  # the moment figures: the markdown's own table
            out.append(([r["dataset"], f"{r['method']} (reported, {r['features']})", "", "",
                         *[f"{float(r[c]):.1f}" if c in r else "" for c in TERMINAL_COLUMNS], ""], True))
    return out


def rich_table(rows: list[dict[str, Any]], reported: list[dict[str, Any]] | None = None):
    """The terminal view (`terminal_rows`), fitted to the terminal's width."""
    from rich.table import Table

    table = Table(title=TERMINAL_TITLE)
    for h in TERMINAL_HEADER:
        table.add_column(h, justify="left" if h in ("dataset", "run") else "right", no_wrap=h == "run")
    for cells, is_reported in terminal_rows(rows, reported):
        table.add_row(*cells, style="dim" if is_reported else None)
    return table


def plain_table(rows: list[dict[str, Any]], reported: list[dict[str, Any]] | None = None) -> str:
    """The same view as plain text for pipes and log files: every cell whole, columns aligned
    with spaces, however wide the lines get."""
    body = [cells for cells, _ in terminal_rows(rows, reported)]
    widths = [max(len(str(c)) for c in column) for column in zip(TERMINAL_HEADER, *body)]
    left = {"dataset", "run"}

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if h in left else c.rjust(w)
                         for h, c, w in zip(TERMINAL_HEADER, cells, widths)).rstrip()

    return "\n".join([TERMINAL_TITLE, line(TERMINAL_HEADER), *map(line, body)]) + "\n"


def show_table(rows: list[dict[str, Any]], reported: list[dict[str, Any]] | None = None) -> None:
    """The short view on stdout: a rich table on a terminal, plain text elsewhere (a rich table
    would be cut to 80 columns and its cells truncated)."""
    from rich.console import Console

    console = Console()
    if console.is_terminal:
        console.print(rich_table(rows, reported))
    else:
        print(plain_table(rows, reported), end="")


def check_results_folder(root: Path) -> None:
    """A results folder to tabulate: it exists and has runs/ (else a table of nothing would be
    written and shown without a word)."""
    if not root.is_dir():
        raise UserError(f"results folder {root} does not exist; pass as --out the folder the runs were written to "
                        "(it holds runs/<dataset>/<run>/seed<S>.json)")
    if not (root / "runs").is_dir():
        raise UserError(f"results folder {root} has no runs/ folder, so no run records; pass as --out the folder "
                        "the runs were written to (it holds runs/<dataset>/<run>/seed<S>.json)")


def rebuild(root: str | Path, skip_bad: bool = False, show: bool = True) -> list[dict[str, Any]]:
    check_results_folder(Path(root))
    records, skipped = collect_checked(root, skip_bad)
    quick = sum(is_quick(r) for r in records)
    records = [r for r in records if not is_quick(r)]  # a smoke test's figures are not the benchmark's
    if quick and show:
        progress.log(f"left out {quick} quick run record{'s' if quick > 1 else ''} (tag {QUICK_TAG}, bench --quick)")
    rows, left_out = build_rows(records), diverged_runs(records)
    judge(rows, root, records)  # every Δ's interval and test, from the stored rankings where there are some
    reported = reported_rows() + reported_moment_rows()
    csv_path, md_path = write(root, rows, reported, left_out, skipped)
    noise_files = noise.write_reports(root, records)  # results/noise/<dataset>.{png,md}, where records carry curves
    bucket_files = buckets.write_reports(root, records)  # results/buckets/<dataset>.{png,md} (RAL Fig. 4)
    if show:
        show_table(rows, reported)
        if left_out:
            progress.log(f"[yellow]left out[/] (loss not finite, train.on_nonfinite=continue): {'; '.join(left_out)}")
        progress.log(f"wrote {csv_path} and {md_path} ({len(rows)} rows)")
        if noise_files:
            progress.log(f"wrote the noise robustness figures and tables: {', '.join(str(f) for f in noise_files)}")
        if bucket_files:
            progress.log(f"wrote the M/V bucket figures and tables: {', '.join(str(f) for f in bucket_files)}")
    calibration.write_reports(root, records, show=show)  # results/calibration/<dataset>.{md,csv}, simulated data
    return rows
