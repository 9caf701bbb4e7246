"""`prvr-bench data check`: validate a layout and summarise it, listing every problem.

It runs the loader's own validation with a collecting report (an item with a problem is
dropped, counted and listed, and the check goes on) and writes nothing, not even the cache.
Warnings are facts a user should judge but that valid data can have (captions shared between
splits: datasets/overlap.py); they are listed and do not fail the check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from prvr.datasets.overlap import shared_captions
from prvr.datasets.real.annotations import mv_fractions
from prvr.datasets.real.assemble import Built, BuiltSplit
from prvr.datasets.real.problems import LayoutError, Report
from prvr.datasets.real.relevance import SplitKeys, join, read_relevance, split_files
from prvr.datasets.real.store import make_layout

MAX_LISTED = 20


@dataclass
class CheckResult:
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    built: Built | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def run_check(name: str, cfg) -> CheckResult:
    report = Report(strict=False)
    result = CheckResult()
    try:
        layout = make_layout(name, cfg)
        result.lines.append(f"{name}: {cfg.data.layout} layout at {layout.collection}")
        result.built = layout.build(report, None)
    except LayoutError as e:  # a structural problem: nothing after it can be read
        report.errors.append(str(e))
    if result.built is not None:
        result.lines += summary_lines(result.built, report)
        result.lines += relevance_lines(result.built, layout, cfg.data.relevance, report)
        result.warnings = [f"captions shared between splits: {s.line()}" for s in shared_captions(result.built.splits)]
    result.errors = report.errors
    result.lines += [f"notes: {n}" for n in report.notes]
    result.lines += listed("warnings", result.warnings) + error_lines(report.errors)
    return result


def summary_lines(built: Built, report: Report) -> list[str]:
    f = built.facts
    lines = [
        f"video features: {f['video_features']}: {built.frame_dim}-d, {built.frame_rows:,} rows",
        f"query features: {f['query_features']}: {built.token_dim}-d tokens",
    ]
    if "annotations" in f:
        lines.append(f"annotations: {f['annotations']} ({report.counts.get('annotation rows read', 0):,} rows)")
    lines.append(f"{'split':<6} {'videos':>7} {'queries':>8}  {'frames/video min/mean/max':<26} {'tokens/query':>12}  "
                 f"{'timestamps':<17} M/V (0,.2] (.2,.4] (.4,1]")
    lines += [split_line(name, s) for name, s in built.splits.items()]
    lines += [
        f"queries without features: {report.counts.get('captions without query features', 0)}",
        f"features without queries: {f['videos_without_queries']} videos",
        f"NaN/Inf rows: {report.counts.get('video feature rows with NaN/Inf', 0)} video feature rows",
    ]
    skip = {"captions without query features", "annotation rows read", "video feature rows with NaN/Inf"}
    lines += [f"{label}: {n:,}" for label, n in sorted(report.counts.items()) if label not in skip]
    return lines


def relevance_lines(built: Built, layout, setting: str, report: Report) -> list[str]:
    """The join of each split's relevance file (datasets/real/relevance.py), as the loader does it;
    a file that cannot be read is an error of the check."""
    lines = []
    try:
        for split, path in split_files(layout, setting, built.splits).items():
            s = built.splits[split]
            _, joined = join(read_relevance(path), SplitKeys(s.video_ids, s.query_ids, s.query_text, s.query_video))
            lines += [f"{split}: {line.strip()}" if i == 0 else line for i, line in enumerate(joined.lines())]
    except LayoutError as e:
        report.errors.append(str(e))
    return lines


def split_line(name: str, s: BuiltSplit) -> str:
    frames = np.diff(s.frame_offsets)
    tokens = np.diff(s.token_offsets)
    nq = len(s.query_ids)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = (s.moments[:, 1] - s.moments[:, 0]) / s.durations[s.query_video] if nq else np.zeros(0)
    have = int(np.isfinite(s.moments[:, 0]).sum())
    share = f"{have:,} ({100 * have / nq:.0f}%)" if nq else "0"
    mv = " ".join("  -  " if math.isnan(x) else f"{x:5.3f}" for x in mv_fractions(frac)) if have else "(no timestamps)"
    fr = f"{frames.min()} / {frames.mean():.1f} / {frames.max()}" if len(frames) else "-"
    tok = f"{tokens.mean():.1f}" if len(tokens) else "-"
    return f"{name:<6} {len(s.video_ids):>7,} {nq:>8,}  {fr:<26} {tok:>12}  {share:<17} {mv}"


def error_lines(errors: list[str]) -> list[str]:
    return listed("errors", errors) or ["errors: none"]


def listed(title: str, items: list[str]) -> list[str]:
    """'title: N' and the first MAX_LISTED items, indented; nothing when there are none."""
    if not items:
        return []
    out = [f"{title}: {len(items)}"] + [f"  {e}" for e in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        out.append(f"  ... and {len(items) - MAX_LISTED} more")
    return out
