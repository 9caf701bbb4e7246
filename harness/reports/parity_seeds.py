"""Parity over seeds: one comparison's parity reports pooled, the difference with its interval.

One parity report compares one seed of each side; a comparison is the series of reports named NAME,
NAME_s1, NAME_s2, ... (the `_sN` suffix is the seed's, docs/parity.md). For each series with its
sidecars (harness/reports/speed.py), `prvr-bench speed` writes `OUT/parity.{md,csv}`: the best
validation SumR of each side over its seeds (mean ± sample std), the difference of the means, ours −
official, with Welch's 95% interval (`scipy.stats.ttest_ind(ours, official, equal_var=False)
.confidence_interval()`: the two sides' seeds are separate draws of their own generators, not pairs,
and their spreads differ; where every report's two runs started from one set of weights,
`train.init_weights`, the seeds are pairs and the interval is the paired t's, `scipy.stats.ttest_rel`),
and a verdict against the parity tolerance: `within` where the whole interval lies inside ±tolerance,
`outside` where it lies wholly beyond it, `unresolved` where it reaches both (more seeds decide), `one
seed` where a series has a single report (its Δ is the one figure). The same for the best validation
VCMR SumR where every report of a series has both sides'.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from scipy import stats

from prvr.harness.base.io import UserError
from prvr.harness.reports.speed import ParitySidecar
from prvr.harness.reports.table import code, csv_text, markdown_table, mean_std

SEED_SUFFIX = re.compile(r"(?P<series>.+)_s(?P<seed>\d+)")
LEVEL = 0.95


def series_name(name: str) -> str:
    """The comparison a report belongs to: its name without a trailing `_sN`."""
    m = SEED_SUFFIX.fullmatch(name)
    return m.group("series") if m else name


@dataclass(frozen=True)
class Pooled:
    """One figure's best validation values over a series' seeds, and their difference ours − official."""

    ours: tuple[float, ...]
    official: tuple[float, ...]
    difference: float
    low: float | None  # Welch's interval; None with one seed a side or no spread on either
    high: float | None
    verdict: str  # within | outside | unresolved | one seed


def pooled(ours: Sequence[float], official: Sequence[float], tolerance: float, paired: bool = False) -> Pooled:
    """With `paired` (each seed's two runs from one start), the paired t interval of the seeds'
    differences; else Welch's, the sides' seeds separate draws."""
    difference = float(sum(ours) / len(ours) - sum(official) / len(official))
    low = high = None
    if len(ours) > 1 and len(official) > 1:
        test = (stats.ttest_rel(list(ours), list(official)) if paired
                else stats.ttest_ind(list(ours), list(official), equal_var=False))
        ci = test.confidence_interval(LEVEL)
        if math.isfinite(ci.low) and math.isfinite(ci.high):
            low, high = float(ci.low), float(ci.high)
    if low is None or high is None:
        verdict = "one seed" if len(ours) == 1 else "no spread"
    elif -tolerance <= low and high <= tolerance:
        verdict = "within"
    elif low > tolerance or high < -tolerance:
        verdict = "outside"
    else:
        verdict = "unresolved"
    return Pooled(tuple(ours), tuple(official), difference, low, high, verdict)


@dataclass(frozen=True)
class Series:
    """One comparison: its reports' shared name, what they compare, their seeds and the pooled figures."""

    name: str
    method: str
    dataset: str
    seeds: tuple[int, ...]
    tolerance: float
    sumr: Pooled
    vcmr: Pooled | None  # where every report of the series has both sides' VCMR SumR
    reports: tuple[str, ...]
    paired: bool = False  # every report's runs started from one set of weights (train.init_weights)


def series(found: Sequence[ParitySidecar]) -> list[Series]:
    """The sidecars grouped into comparisons, in the order of their first report. A series whose
    reports disagree on what they compare (method, dataset, tolerance) or repeat a seed is one line."""
    groups: dict[str, list[ParitySidecar]] = {}
    for s in found:
        groups.setdefault(series_name(s["name"]), []).append(s)
    out = []
    for name, members in groups.items():
        members.sort(key=lambda s: s["seed"])
        first = members[0]
        for s in members[1:]:
            for key, a, b in (("method", first["method"], s["method"]), ("dataset", first["dataset"], s["dataset"]),
                              ("sumr.tolerance", first["sumr"]["tolerance"], s["sumr"]["tolerance"])):
                if a != b:
                    raise UserError(f"parity reports {first['name']} and {s['name']} are one series ({name}: a name "
                                    f"and its _sN seeds) but differ in {key} ({a} against {b}); rename one with "
                                    "`prvr-bench parity --name`, or delete its sidecar")
        seeds = [s["seed"] for s in members]
        twice = next((a for a, b in zip(seeds, seeds[1:]) if a == b), None)  # sorted: a repeat is adjacent
        if twice is not None:
            names = ", ".join(s["name"] for s in members if s["seed"] == twice)
            raise UserError(f"parity reports {names} of series {name} are all seed {twice}: one report a seed; "
                            "delete the extra sidecar or rename it with `prvr-bench parity --name`")
        started = [s for s in members if "started_from" in s]
        if started and len(started) < len(members):
            other = next(s for s in members if "started_from" not in s)
            raise UserError(f"parity reports {started[0]['name']} and {other['name']} are one series ({name}) but the "
                            "first's run started from given weights (train.init_weights) and the second's from its "
                            "seeded init: one way for every seed of a series; rename one with "
                            "`prvr-bench parity --name`")
        paired = bool(started)
        tolerance = first["sumr"]["tolerance"]
        sumr = pooled([s["sumr"]["ours_best"] for s in members], [s["sumr"]["official_best"] for s in members],
                      tolerance, paired)
        ours_v = [s["sumr"].get("ours_best_vcmr") for s in members]
        off_v = [s["sumr"].get("official_best_vcmr") for s in members]
        vcmr = None
        if all(v is not None for v in (*ours_v, *off_v)):
            vcmr = pooled([float(v) for v in ours_v if v is not None], [float(v) for v in off_v if v is not None],
                          tolerance, paired)
        out.append(Series(name, first["method"], first["dataset"], tuple(seeds), tolerance, sumr, vcmr,
                          tuple(s["report"] for s in members), paired))
    return out


HEADER = ("comparison", "method", "dataset", "seeds", "ours best val SumR", "official best val SumR",
          "Δ (ours − official) [95% CI]", "verdict", "ours best val VCMR SumR", "official best val VCMR SumR",
          "Δ VCMR [95% CI]", "VCMR verdict")


def _difference(p: Pooled | None) -> str:
    if p is None:
        return ""
    interval = "" if p.low is None or p.high is None else f" [{p.low:+.1f}, {p.high:+.1f}]"
    return f"{p.difference:+.1f}{interval}"


def _verdict(p: Pooled | None, tolerance: float) -> str:
    if p is None:
        return ""
    return p.verdict if p.verdict in ("one seed", "no spread", "unresolved") else f"{p.verdict} {tolerance:g}"


def _seeds(seeds: Sequence[int]) -> str:
    return " ".join(map(str, seeds))  # in order: `series` sorts each comparison's reports by seed


def row(s: Series) -> list[str]:
    seeds = _seeds(s.seeds) + (" (one start)" if s.paired else "")
    return [code(s.name), s.method, s.dataset, seeds, mean_std(s.sumr.ours), mean_std(s.sumr.official),
            _difference(s.sumr), _verdict(s.sumr, s.tolerance),
            mean_std(s.vcmr.ours) if s.vcmr else "", mean_std(s.vcmr.official) if s.vcmr else "",
            _difference(s.vcmr), _verdict(s.vcmr, s.tolerance)]


def csv_row(s: Series) -> list[str]:
    def figures(p: Pooled | None) -> list[str]:
        if p is None:
            return ["", "", "", "", "", "", ""]
        return [" ".join(f"{v:g}" for v in p.ours), " ".join(f"{v:g}" for v in p.official), f"{p.difference:.4f}",
                "" if p.low is None else f"{p.low:.4f}", "" if p.high is None else f"{p.high:.4f}", p.verdict,
                f"{s.tolerance:g}"]

    return [s.name, s.method, s.dataset, _seeds(s.seeds), *figures(s.sumr), *figures(s.vcmr), " ".join(s.reports),
            "one" if s.paired else "own"]


CSV_HEADER = ("comparison", "method", "dataset", "seeds",
              *(f"{fig} {col}" for fig in ("sumr", "vcmr")
                for col in ("ours best", "official best", "difference", "low", "high", "verdict", "tolerance")),
              "reports", "start")
NOTE = ("One row per comparison: the parity reports named NAME, NAME_s1, NAME_s2, ... (each one seed of each side, "
        "`results/parity/`), pooled. The best validation SumR of each side over its seeds (mean ± sample std); the "
        "difference of the means, ours − official, with Welch's 95% interval (scipy.stats.ttest_ind with "
        "equal_var=False: the sides' seeds are separate draws, not pairs), or, where every report's runs started from "
        "the official code's weights (`train.init_weights`, `(one start)` after the seeds), the paired t interval of "
        "the seeds' differences (scipy.stats.ttest_rel: a seed's two runs share their start); `within` where the whole "
        "interval lies inside ± the tolerance, `outside` where it lies wholly beyond it, `unresolved` where it "
        "reaches both (more seeds decide), `one seed` where the comparison has one report (its Δ is that seed's). "
        "VCMR: the same for the moment figures, where every report of the comparison has them (XML's).")


def parity_markdown(rows: Sequence[Series]) -> str:
    lines = ["# Parity over seeds: ours against the official code", "",
             "Written by `prvr-bench speed` (harness/reports/parity_seeds.py) from the parity reports' sidecars; "
             "each report's curves and speed are in its own file (`parity/NAME.md`), what was run in docs/parity.md.",
             "", NOTE, ""]
    if not rows:
        lines += ["No parity report has a sidecar yet: run `prvr-bench parity ...` (docs/parity.md).", ""]
    lines += [markdown_table(HEADER, [row(s) for s in rows]), ""]
    return "\n".join(lines)


def parity_files(out: str | Path, found: Sequence[ParitySidecar]) -> dict[Path, str]:
    """OUT/parity.md and OUT/parity.csv from the sidecars `found`."""
    rows = series(found)
    return {Path(out) / "parity.md": parity_markdown(rows),
            Path(out) / "parity.csv": csv_text(CSV_HEADER, [csv_row(s) for s in rows])}
