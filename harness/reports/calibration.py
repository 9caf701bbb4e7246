"""Calibration report of a simulated dataset, generated from its committed run records.

A simulated world is useful when it behaves like the dataset it imitates and when its label
ambiguity costs the plain baseline something measurable. `evaluate` judges each calibration
target (thresholds below; docs/simulated-world.md says why each is there) on the records of one
simulated dataset, read as the leaderboard reads them (harness/reports/leaderboard.py `collect` /
`build_rows`): only rows on the dataset's protocol, only the dataset itself (not a
real-layout export of it). The test split's facts come from the records'
`provenance.data.test` (written by the run from the generated world), never from the data
itself, so the report is the same on every machine. `write_reports` writes
`<out>/calibration/<dataset>.{md,csv}` for every simulated dataset with records;
`prvr-bench leaderboard` (`nox -s leaderboard`) calls it.

Each target's cell names the record keys it reads, the seeds and run names, and whether it
is met; the commands that made those records are listed under the table. A target whose
records are missing is "no records", never a guess.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from prvr.harness.base import progress
from prvr.harness.base.io import write_text
from prvr.harness.base.names import check_name, inside, join_run_name
from prvr.harness.engine.record_types import DataFacts, RunRecord
from prvr.harness.engine.records import budget_label
from prvr.harness.base.registry import DATASETS
from prvr.harness.reports.rows import (baseline, build_rows, dataset_label, diverged, p_value as _p_value,
                               record_protocol)
from prvr.harness.reports.table import Markdown, code, composed, csv_text, markdown_table, mean_and_std, mean_std
from prvr.harness.engine.sections import dataset_preset
from prvr.harness.reports.world_calibration import TOLERANCE, near_enough, ratio_to_real

SUMR_RANGE = (120.0, 230.0)  # baseline test SumR: room above and below, like the real datasets' baselines
MULTI_RELEVANT_MIN = 0.20  # share of test queries with more than one relevant video
DOZENS = 24  # "dozens" of relevant videos: two dozen or more
DOZENS_SHARE_MAX = 0.05  # "few" queries with dozens: at most this share
ORACLE_GAP_MIN = 5.0  # baseline + oracle over baseline, labelled test SumR
ALPHA = 0.05  # the significance level the oracle SumR target asks for
MV_TOLERANCE = 0.02  # per M/V bin, absolute
WORDS_TOLERANCE = 0.15  # words per query, relative to the imitated dataset's

# The imitated datasets' statistics (docs/datasets.md, measured on the original annotation
# files), keyed by a simulated preset's `family`.
REFERENCES = {
    "tvr": {"split": "TVR val", "mv_fractions": (0.853, 0.092, 0.055), "words_per_query": 12.2},
    "activitynet": {"split": "ActivityNet Captions train", "mv_fractions": (0.461, 0.249, 0.290),
                    "words_per_query": 13.5},
    "charades": {"split": "Charades-STA train", "mv_fractions": (0.299, 0.568, 0.133), "words_per_query": 6.2},
}

MET, NOT_MET, NO_RECORDS, NO_REFERENCE = "met", "not met", "no records", "no reference"


def oracle_run() -> str:
    """The baseline fed the simulated ground truth (run name method+detector)."""
    return join_run_name(baseline(), "oracle")


@dataclass
class Result:
    """One target judged on the records."""

    target: str
    status: str  # MET, NOT_MET, NO_RECORDS or NO_REFERENCE
    measured: str  # the figure(s), as the report prints them
    keys: list[str]  # the record keys read
    runs: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)  # for the CSV: per seed, or the facts read
    per_seed: bool = True  # whether `values` are one per seed (then the CSV gives their mean and std)
    p: float | None = None
    commands: list[str] = field(default_factory=list)


def simulated_datasets(records: list[RunRecord]) -> list[str]:
    """The datasets among the records that are simulated: registered as such, or (not
    registered) with records whose data facts carry the generator's version."""
    out = set()
    for r in records:
        name = r["dataset"]
        if dataset_label(r) != name:  # a real-layout export of a simulated dataset
            continue
        if name in DATASETS:
            if DATASETS.get(name).simulated:
                out.add(name)
        elif "generator_version" in _data(r):
            out.add(name)
    return sorted(out)


def reference_for(dataset: str) -> dict[str, Any] | None:
    """The imitated dataset's statistics, through the simulated preset's `family`."""

    if dataset not in DATASETS:
        return None
    family = dataset_preset(dataset).get("family")
    return REFERENCES.get(family) if isinstance(family, str) else None


def _data(record: RunRecord) -> DataFacts:
    prov = record.get("provenance")
    data = prov.get("data") if isinstance(prov, dict) else None
    return data if isinstance(data, dict) else {}


def _test_facts(record: RunRecord) -> dict[str, Any]:
    test = _data(record).get("test")
    return test if isinstance(test, dict) else {}


FROM_PRESET: Any = object()


def evaluate(records: list[RunRecord], dataset: str, reference: Any = FROM_PRESET) -> list[Result]:
    """Every calibration target of `dataset`, judged on its records on the protocol.
    `reference`: the imitated dataset's statistics (`REFERENCES`), None for none; by default
    `reference_for(dataset)`."""
    if reference is FROM_PRESET:
        reference = reference_for(dataset)
    mine = [r for r in records if r["dataset"] == dataset and dataset_label(r) == dataset]
    rows = [r for r in build_rows(mine) if r["on_protocol"]]
    # The reference rows as the leaderboard's Δ takes them (the last on-protocol baseline row).
    base = ([None] + [r for r in rows if r["run"] == baseline()])[-1]
    oracle = next((r for r in rows if r["run"] == oracle_run()), None)
    facts_row = base or _facts_row(rows)
    facts_records = [] if facts_row is None else sorted(
        (r for r in mine if r.get("run_name", r["method"]) == facts_row["run"] and not diverged(r)
         and budget_label(record_protocol(r)) == facts_row["budget"]), key=lambda r: r["seed"])
    return [_baseline_sumr(base), _oracle_sumr(base), _oracle_gap(base, oracle),
            *_data_targets(facts_records, facts_row, reference, real_ambiguity(dataset))]


def real_ambiguity(dataset: str) -> dict[str, Any] | None:
    """The real split's verified ambiguity a world was calibrated to (its preset's
    `calibrated_to`: docs/simulated-world.md, "Real ambiguity"), or None."""

    return dataset_preset(dataset).get("calibrated_to") if dataset in DATASETS else None


def _facts_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Without baseline records, the run whose records give the test split's facts: the
    on-protocol run with the most seeds, the first by name among equals. The facts belong
    to the generated world, which every run of the dataset builds from the same preset."""
    return min(rows, key=lambda r: (-len(r["seeds"]), r["run"]), default=None)


def _row_fields(row: dict[str, Any] | None) -> dict[str, Any]:
    return {} if row is None else {"runs": [row["run"]], "seeds": list(row["seeds"]), "commands": list(row["commands"])}


def _baseline_sumr(base: dict[str, Any] | None) -> Result:
    lo, hi = SUMR_RANGE
    target = f"baseline test SumR between {lo:g} and {hi:g}"
    keys = ["metrics.test.SumR"]
    if base is None or not base["SumR"]:
        return Result(target, NO_RECORDS, f"no `{baseline()}` records on the protocol", keys)
    mean = float(np.mean(base["SumR"]))
    recalls = ", ".join(f"{c} {mean_std(base[c])}" for c in ("R@1", "R@5", "R@10", "R@100") if base[c])
    measured = f"{mean_std(base['SumR'])} ({recalls})" if recalls else mean_std(base["SumR"])
    return Result(target, MET if lo <= mean <= hi else NOT_MET, measured,
                  keys + ["metrics.test.R@1", "metrics.test.R@5", "metrics.test.R@10", "metrics.test.R@100"],
                  values=list(base["SumR"]), **_row_fields(base))


def _oracle_sumr(base: dict[str, Any] | None) -> Result:
    target = f"baseline oracle SumR (any relevant video counts) above its labelled SumR (paired t-test p < {ALPHA:g})"
    keys = ["metrics.test.oracle.SumR", "metrics.test.SumR"]
    if base is None or not base["oracle SumR"] or not base["SumR"]:
        return Result(target, NO_RECORDS, f"no `{baseline()}` records with an oracle SumR on the protocol", keys)
    gaps = [o - s for o, s in zip(base["oracle SumR"], base["SumR"])]
    p = _p_value(dict(zip(base["seeds"], base["oracle SumR"])), dict(zip(base["seeds"], base["SumR"])))
    met = float(np.mean(gaps)) > 0 and p is not None and p < ALPHA
    measured = (f"{mean_std(base['oracle SumR'])} vs {mean_std(base['SumR'])}; gap {_fmt_signed(gaps)} "
                f"(per seed {', '.join(f'{g:+.1f}' for g in gaps)}; {_p_text(p, base['seeds'])})")
    return Result(target, MET if met else NOT_MET, measured, keys, values=gaps, p=p, **_row_fields(base))


def _oracle_gap(base: dict[str, Any] | None, oracle: dict[str, Any] | None) -> Result:
    target = f"baseline + `oracle` beats baseline by >= {ORACLE_GAP_MIN:g} labelled test SumR (mean over seeds)"
    keys = ["metrics.test.SumR"]
    if base is None or oracle is None or not base["SumR"] or not oracle["SumR"]:
        missing = " and ".join(n for n, r in ((f"`{baseline()}`", base), (f"`{oracle_run()}`", oracle))
                               if r is None or not r["SumR"])
        return Result(target, NO_RECORDS, f"no {missing} records on the protocol", keys)
    delta = float(np.mean(oracle["SumR"]) - np.mean(base["SumR"]))  # the leaderboard's Δ
    p = _p_value(dict(zip(oracle["seeds"], oracle["SumR"])), dict(zip(base["seeds"], base["SumR"])))
    b = dict(zip(base["seeds"], base["SumR"]))
    shared = [s for s in oracle["seeds"] if s in b]
    per_seed = [dict(zip(oracle["seeds"], oracle["SumR"]))[s] - b[s] for s in shared]
    measured = (f"{delta:+.1f} ({mean_std(oracle['SumR'])} vs {mean_std(base['SumR'])}"
                + (f"; per seed {', '.join(f'{d:+.1f}' for d in per_seed)}" if per_seed else "")
                + f"; {_p_text(p, shared)})")
    return Result(target, MET if delta >= ORACLE_GAP_MIN else NOT_MET, measured, keys,
                  runs=[base["run"], oracle["run"]], seeds=sorted(set(base["seeds"]) | set(oracle["seeds"])),
                  values=per_seed, p=p, commands=sorted(set(base["commands"]) | set(oracle["commands"])))


def _fmt_signed(values: list[float]) -> str:
    text = mean_std(values)
    return text if text.startswith("-") else f"+{text}"


def _p_text(p: float | None, seeds: list[int]) -> str:
    if p is None or math.isnan(p):
        return "too few seeds for a t-test"
    return f"paired t-test over seeds {' '.join(map(str, seeds))}: p = {p:.3f}" if len(seeds) >= 2 \
        else f"Welch t-test: p = {p:.3f}"


def _data_targets(records: list[RunRecord], base: dict[str, Any] | None,
                  reference: dict[str, Any] | None, real: dict[str, Any] | None = None) -> list[Result]:
    """The test split's facts, from `provenance.data.test` of one run's records (the
    baseline's when there are any, see `_facts_row`; the same generated world on every seed:
    the world's seed is fixed across run seeds)."""
    prefix = "provenance.data.test."
    fields = _row_fields(base)
    fields["seeds"] = [r["seed"] for r in records]

    def facts(key: str) -> list[Any] | None:
        values = [_test_facts(r).get(key) for r in records]
        return values if values and all(v is not None for v in values) else None

    def judged(target: str, keys: list[str], measure: Callable[..., tuple[bool, str, list[float]]]) -> Result:
        got = [facts(k) for k in keys]
        full = [prefix + k for k in keys]
        if any(g is None for g in got):
            absent = ", ".join(f"`{prefix + k}`" for k, g in zip(keys, got) if g is None)
            run = base["run"] if base else baseline()
            return Result(target, NO_RECORDS, f"not in the `{run}` records on the protocol ({absent})", full,
                          **fields)
        known = [g for g in got if g is not None]  # every one, as checked above
        ok, measured, values = measure(*known)
        return Result(target, MET if ok else NOT_MET, measured + _same_note(known), full, values=values,
                      per_seed=False, **fields)

    def multi(share):
        s = _one(share)
        return s >= MULTI_RELEVANT_MIN, f"{100 * s:.1f}% have more than one relevant video", [s]

    def dozens(mean, most):
        m, top = _one(mean), _one(most)
        bound = (m - 1) / (DOZENS - 1)  # each query has at least its labelled video
        text = (f"at most {top:g} relevant videos for one query; {m:.2f} per query on average, so at most "
                f"{100 * bound:.1f}% of queries can have {DOZENS} or more (the share itself is not in the records)")
        return top >= DOZENS and bound <= DOZENS_SHARE_MAX, text, [m, top, bound]

    def near(key: str):
        def measure(values):
            x, want = _one(values), float(real[key])
            ratio = ratio_to_real(x, want, key)  # as calibrate-world compares them
            return near_enough(ratio), f"{x:.3f} against {want:.3f} (x{ratio:.2f})", [x]
        return measure

    if real is not None:  # a world calibrated to a real split: its verified figures are the targets
        split = real.get("split", "the real split")
        out = [judged(f"share of test queries with several relevant videos within x{TOLERANCE:g} of {split}'s "
                      f"({float(real['multi_relevant_share']):.3f}, {real.get('source', 'verified relevance')})",
                      ["multi_relevant_share"], near("multi_relevant_share")),
               judged(f"extra relevant videos per query within x{TOLERANCE:g} of {split}'s (relevant per query "
                      f"{float(real['relevant_per_query']):.3f})", ["relevant_per_query_mean"],
                      near("relevant_per_query"))]
    else:
        out = [judged(f">= {100 * MULTI_RELEVANT_MIN:.0f}% of test queries with several relevant videos",
                      ["multi_relevant_share"], multi),
               judged(f"few test queries with dozens of relevant videos: some with >= {DOZENS}, at most "
                      f"{100 * DOZENS_SHARE_MAX:.0f}% of queries (bounded by the mean relevant per query)",
                      ["relevant_per_query_mean", "relevant_per_query_max"], dozens)]
    if reference is None:
        for target in ("M/V fractions of the imitated dataset", "words per query of the imitated dataset"):
            out.append(Result(target, NO_REFERENCE, "no imitated dataset's statistics for this preset's `family`", [],
                              **fields))
        return out
    ref_mv, ref_words, split = reference["mv_fractions"], reference["words_per_query"], reference["split"]

    def mv(fractions):
        f = _one([tuple(x) for x in fractions])
        off = max(abs(a - b) for a, b in zip(f, ref_mv))
        return (off <= MV_TOLERANCE, " / ".join(f"{x:.3f}" for x in f) + f" (largest difference {off:.3f})", list(f))

    def words(w):
        x = _one(w)
        return abs(x - ref_words) <= WORDS_TOLERANCE * ref_words, f"{x:.1f}", [x]

    out += [judged(f"M/V fractions (0,.2] / (.2,.4] / (.4,1] of {split} ({' / '.join(f'{x:.3f}' for x in ref_mv)}), "
                   f"each within {MV_TOLERANCE:g}", ["mv_fractions"], mv),
            judged(f"words per query of {split} ({ref_words:g}), within {100 * WORDS_TOLERANCE:.0f}%",
                   ["words_per_query"], words)]
    return out


def _one(values: list[Any]) -> Any:
    """The fact of the first record (the note under the cell says whether the others agree)."""
    return values[0]


def _same_note(got: list[list[Any]]) -> str:
    n = len(got[0])
    if n < 2:
        return ""
    same = all(len({repr(v) for v in g}) == 1 for g in got)
    return f"; the same in all {n} records" if same else f"; the {n} records differ (first shown): {got}"


# ---------------------------------------------------------------------------- files


def tally(results: list[Result]) -> str:
    """'M of N targets met.', naming the targets judged otherwise by their status."""
    met = sum(r.status == MET for r in results)
    others = [f"{n} {status}" for status in (NOT_MET, NO_RECORDS, NO_REFERENCE)
              if (n := sum(r.status == status for r in results))]
    return f"{met} of {len(results)} targets met" + (f" ({', '.join(others)})" if others else "") + "."


def to_markdown(dataset: str, results: list[Result], command: str = "prvr-bench leaderboard") -> str:
    commands = sorted({c for r in results for c in r.commands})
    number = {c: i + 1 for i, c in enumerate(commands)}
    lines = [f"# Calibration of {dataset}", "",
             f"Generated by `{command}` (`nox -s leaderboard`) from the run records under `runs/{dataset}/` of this "
             "results folder; do not edit by hand. Only runs on the dataset's protocol count (as in the leaderboard); "
             "the test split's facts are the records' `provenance.data.test`, written by each run from the generated "
             "world. Mean ± sample std over seeds; the targets and why they are there: docs/simulated-world.md.", "",
             markdown_table(["target", "measured", "seeds", "runs", "record keys", "records made by", "status"],
                            ([composed(r.target), composed(r.measured), " ".join(map(str, r.seeds)),
                              Markdown(", ".join(code(x) for x in r.runs)), Markdown(", ".join(code(k) for k in r.keys)),
                              " ".join(f"[{number[c]}]" for c in r.commands), Markdown(f"**{r.status}**")]
                             for r in results))]
    lines += ["", tally(results)]
    if commands:
        lines += ["", "The records were made by (`nox -s bench -- ARGS` runs `prvr-bench bench ARGS`):", ""]
        lines += [f"[{number[c]}] {code(c, in_table=False)}  " for c in commands]
        lines[-1] = lines[-1].rstrip()
    return "\n".join(lines) + "\n"


def to_csv(dataset: str, results: list[Result]) -> str:
    header = ["dataset", "target", "status", "measured", "values", "mean", "std", "p", "seeds", "runs", "record keys",
              "commands"]
    body = []
    for r in results:
        v = r.values
        spread = mean_and_std(v) if r.per_seed else None
        body.append([dataset, r.target, r.status, r.measured, " ".join(f"{x:.4f}" for x in v),
                     "" if spread is None else f"{spread[0]:.4f}",
                     "" if spread is None or spread[1] is None else f"{spread[1]:.4f}",
                     "" if r.p is None else f"{r.p:.4f}", " ".join(map(str, r.seeds)), " ".join(r.runs),
                     " ".join(r.keys), " ; ".join(r.commands)])
    return csv_text(header, body)


def write_reports(root: str | Path, records: list[RunRecord], show: bool = False,
                  command: str = "prvr-bench leaderboard") -> list[Path]:
    """`<root>/calibration/<dataset>.{md,csv}` for every simulated dataset among the records;
    the files written (each atomically)."""
    written: list[Path] = []
    for dataset in simulated_datasets(records):
        name = re.sub(r"[^A-Za-z0-9_.+@~-]+", "-", dataset).strip("-.")
        check_name(name, "calibration report name", "rename the dataset")
        folder = inside(Path(root) / "calibration", root, "calibration report folder")
        results = evaluate(records, dataset)
        md, csv = folder / f"{name}.md", folder / f"{name}.csv"
        write_text(md, to_markdown(dataset, results, command))
        write_text(csv, to_csv(dataset, results))
        written += [md, csv]
        if show:
            progress.log(f"wrote {md} and {csv} ({tally(results).rstrip('.')})")
    return written
