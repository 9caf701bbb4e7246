"""A sweep's curves and table (`prvr-bench sweep`, harness/cli/sweep.py), from the run records.

At each value of the swept knob (or point of several knobs moved together, `--knob sim.repeat_prob
sim.repeat_copies --values 1,4`): the world's figures as its records state them (the test split's
multi-relevant share, relevant videos per query, words per query, the training split's mislabelled
queries), so a reader sees what moved with the knob and what did not; each run's labelled and oracle
SumR (mean and sample std over seeds); and each run's gain over its base on the same world, with the
95% interval of the two-level bootstrap and the randomization test's p (harness/reports/stats.py).
A run's base: `X+oracle` -> `X` (how much knowing every false negative is worth), `M@B` of a method
that extends its backbone's own method -> that method (RAL on MS-SL -> MS-SL).

Every record of a sweep must be of one world but for the swept knobs: a record whose other knobs differ
(made with another `--set`, or before a preset changed) is refused in one line naming the knob and both
values, never averaged in.

Written to OUT/sweeps/<dataset>~<knob>.{md,csv,png}; the CSV through the csv module, one row per
(value, run), cells from input made safe for spreadsheets.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import scipy.stats

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, write_png, write_texts
from prvr.harness.base.names import check_name, inside, join_run_name, split_run_name
from prvr.harness.base.registry import DETECTORS, METHODS, home_method
from prvr.harness.engine.records import drift_note, load_record_at, machine_of, record_path
from prvr.harness.reports.stats import (BOTH_LEVELS, LEVEL, Comparison, GainChange, MetricDifference, Row, RoomShare,
                                        Settings, compare_rows, gain_change, has_metric, load_row, room_share)
from prvr.harness.reports.rows import seed_interval
from prvr.harness.reports.table import MOMENT_SUM, csv_text, markdown_table, mean_std

if TYPE_CHECKING:  # harness/base/contract.py imports torch, which a report does not need
    from prvr.harness.base.contract import MethodSpec

# the world's figures shown at each value (provenance.data.<split>.<key>)
FACTS = (("test", "multi_relevant_share", "multi-relevant share (test)"),
         ("test", "relevant_per_query_mean", "relevant videos per query (test)"),
         ("test", "words_per_query", "words per query (test)"),
         ("train", "mislabelled", "mislabelled queries (train)"))


Point = tuple[float, ...]  # one value per swept knob


# knobs that move the world's relevance: their curves are drawn against the multi-relevant share
# the treatments `sweep --room` measures the oracle's room with beside a row that reads no relations (`arl~base`); the
# first is the default: the pairs as positives, as `relations.oracle.mode=positive` trains every other oracle row
ROOM_TREATMENTS = ("positive", "ignore")
ROOM_READS = {"positive": "trained as positives, as every other oracle row trains them",
              "ignore": "left out of its negatives, not trained"}
RELEVANCE_KNOBS = {"sim.repeat_prob", "sim.repeat_copies", "sim.vague_prob"}


@dataclass(frozen=True)
class Sweep:
    """What a sweep trained: knobs of a dataset at some points (a value per knob), runs (named as at the
    preset's point), seeds."""

    dataset: str
    knobs: tuple[str, ...]
    values: tuple[Point, ...]
    default: Point  # the preset's values: its runs are the plain rows, untagged
    runs: tuple[str, ...]
    seeds: tuple[int, ...]
    command: str
    name: str = ""  # the report's file name under OUT/sweeps/ (default <dataset>~<knob>)
    # the treatments of the oracle's room beside a row that reads no relations (`sweep --room`): the first is the
    # room the answer table reads, the others are trained and reported as rows of their own
    rooms: tuple[str, ...] = (ROOM_TREATMENTS[0],)

    @property
    def knob(self) -> str:
        return " ".join(self.knobs)


@dataclass(frozen=True)
class Cell:
    """One run at one value: its seeds' labelled and oracle SumR, and its gain over its base."""

    value: Point
    run: str
    seeds: tuple[int, ...]
    sumr: tuple[float, ...]
    oracle_sumr: tuple[float, ...]
    base: str
    gain: Comparison | None
    note: str = ""
    moments: tuple[float, ...] = ()  # each seed's test VCMR SumR where the run localizes (NaN where a record has none)
    machines: tuple[str, ...] = ()  # where each seed was made (`machine_of`)
    drift: str = ""  # where the run's and its base's seeds were made on different machines, says so (`two_machines`)


def knob_tag(knob: str, value: float) -> str:
    """The tag of a sweep's run away from the preset's value: `repeat_prob0.6` for sim.repeat_prob=0.6."""
    return check_name(f"{knob.rpartition('.')[2]}{value:g}", "sweep tag", "sweep a knob with a shorter name")


def point_tag(knobs: Sequence[str], point: Point, default: Point) -> str:
    """The tag of a sweep's runs at `point`: each knob away from the preset's value, joined by '-'
    (`repeat_prob1-repeat_copies4`); "" at the preset's point."""
    return "-".join(knob_tag(k, v) for k, v, d in zip(knobs, point, default) if v != d)


def show_point(point: Point) -> str:
    """A point as the report and the command line write it: `0.35`, or `1,4` for two knobs."""
    return ",".join(f"{v:g}" for v in point)


def run_at(run: str, sweep: Sweep, value: Point) -> str:
    """The folder name of `run` at `value`: the plain name at the preset's point, else tagged."""
    tag = point_tag(sweep.knobs, value, sweep.default)
    return f"{run}~{tag}" if tag else run


def base_of(run: str) -> str | None:
    """The run a gain is measured against: `room_of` a base row -> that row (`arl+oracle~tv_only-positive` and
    `arl+oracle~tv_only-ignore` -> `arl~base`); `X+oracle` -> `X`; a matrix cell `M+DETECTOR~TREATMENT` -> the
    plain run of M's backbone (`baseline+holmes~soft` -> `baseline`, `arl+sbert~tv_only-ignore` -> `arl~base`); a
    method with a base row (MethodSpec.base_row) -> that row (`arl` -> `arl~base`, its encoder without the
    ambiguity set); `M@B` where M extends B's own method -> that method (`ral@msl` -> `msl`); a condition of its
    backbone's home method, the same objective under other weights or another detector's pairs -> that method
    (`xml-pr` -> `xml`); else none."""
    method, detector, backbone, tag = split_run_name(run)
    spec = METHODS.get(method) if method in METHODS else None
    rooms = {_room_tag(spec, t) for t in ROOM_TREATMENTS} if spec is not None and spec.base_row else set()
    if detector == "oracle" and spec is not None and tag in rooms:  # `room_of` a base row, under either treatment
        return join_run_name(method, backbone=backbone, tag=spec.base_row)
    if detector == "oracle":
        return join_run_name(method, backbone=backbone, tag=tag)
    if detector and spec is not None and detector in DETECTORS:  # a matrix cell: its backbone's plain run
        return join_run_name(method, backbone=backbone, tag=spec.base_row)
    if spec is None or tag:
        return None
    if spec.base_row:
        return f"{run}~{spec.base_row}"
    home = home_method(spec.backbone)
    if not backbone and home not in (None, method) and METHODS.get(home).objective is spec.objective:
        return home  # a condition of its backbone's home method: its objective under other weights or pairs
    if backbone and spec.extends_backbone:
        return home_method(backbone)
    return None


class SweepRows:
    """Each run folder of a sweep as a statistics row on the sweep's seeds (its records and stored
    rankings), read once per report: a base is the base of several runs, and the answer table reads
    the rows the gains read."""

    def __init__(self, out: str | Path, sweep: Sweep) -> None:
        self.out, self.sweep = out, sweep
        self.rows: dict[str, Row] = {}

    def __call__(self, name: str) -> Row:
        if name not in self.rows:
            self.rows[name] = only_seeds(load_row(self.out, self.sweep.dataset, name), self.sweep.seeds)
        return self.rows[name]


def sweep_cells(sweep: Sweep, out: str | Path, settings: Settings,
                rows: SweepRows | None = None) -> tuple[list[Cell], dict[Point, dict[str, Any]]]:
    """Every (value, run) with records, and the world's figures at each value."""
    rows = SweepRows(out, sweep) if rows is None else rows
    cells: list[Cell] = []
    facts: dict[Point, dict[str, Any]] = {}
    world = WorldCheck(sweep)
    for value in sweep.values:
        for run in sweep.runs:
            name = run_at(run, sweep, value)
            paths = [(s, record_path(out, sweep.dataset, name, s)) for s in sweep.seeds]
            found = [(s, world.check(load_record_at(p), p)) for s, p in paths if p.is_file()]
            if not found:
                continue
            facts.setdefault(value, world_facts(found[0][1]))
            base = base_of(run)
            gain, note = None, ""
            if base is not None:
                gain, note = _gain(rows, name, run_at(base, sweep, value), settings)
            cells.append(Cell(value, run, tuple(s for s, _ in found),
                              tuple(float(r["metrics"]["test"]["SumR"]) for _, r in found),
                              tuple(_oracle(r) for _, r in found), base or "", gain, note,
                              tuple(_moment(r) for _, r in found), tuple(machine_of(r) for _, r in found)))
    at = {(c.value, c.run): c for c in cells}
    return [dataclasses.replace(c, drift=two_machines(c, at[c.value, c.base])) if (c.value, c.base) in at else c
            for c in cells], facts


def two_machines(cell: Cell, base: Cell) -> str:
    """`records.drift_note` of a cell and its base's cell at one value."""
    return drift_note(cell.run, dict(zip(cell.seeds, cell.machines)), base.run, dict(zip(base.seeds, base.machines)))


class WorldCheck:
    """The records of one sweep differ only in its knobs: the first record's other world knobs (its
    config's `sim` section) are the sweep's; a record whose other knobs differ is one line naming the
    record, the knob and both values (a sweep of two worlds' rows would credit the knob with the other
    change)."""

    def __init__(self, sweep: Sweep) -> None:
        self.swept = {k.partition(".")[2] for k in sweep.knobs if k.startswith("sim.")}
        self.first: tuple[Path, dict[str, Any]] | None = None

    def check(self, record: Any, path: Path) -> Any:
        """The record, once its world is the sweep's."""
        sim = record.get("config", {}).get("sim")
        if not isinstance(sim, dict):
            return record  # a record without its world's knobs (an old schema): its facts still show in the table
        others = {k: v for k, v in sim.items() if k not in self.swept}
        if self.first is None:
            self.first = (path, others)
            return record
        where, theirs = self.first
        for key in sorted(others.keys() & theirs.keys()):  # a knob newer than a record is not in it
            if others[key] != theirs[key]:
                raise UserError(f"{path}: made on another world than {where}: sim.{key} is {others[key]!r} "
                                f"here against {theirs[key]!r} there, and the sweep moves only "
                                f"{', '.join(sorted(self.swept)) or 'other sections'}; re-make the run (remove its "
                                "folder) with the sweep's command, or sweep that knob too")
        return record


def _gain(rows: SweepRows, name: str, base: str, settings: Settings) -> tuple[Comparison | None, str]:
    try:
        return compare_rows(rows(name), rows(base), settings), ""
    except UserError as e:  # too few shared seeds, a base not made yet: said in the cell
        return None, str(e)


def only_seeds(row: Row, seeds: Sequence[int]) -> Row:
    """The row on the sweep's seeds alone (a plain row may have more: the leaderboard's three)."""
    return dataclasses.replace(row, seeds={s: v for s, v in row.seeds.items() if s in seeds})


def world_facts(record: Any) -> dict[str, Any]:
    """The world's figures a record states (`FACTS`, by label; None where it states none)."""
    data = record.get("provenance", {}).get("data", {})
    return {label: data.get(split, {}).get(key) for split, key, label in FACTS}


def _oracle(record: Any) -> float:
    return _figure(record["metrics"]["test"].get("oracle", {}), "SumR")


def _moment(record: Any) -> float:
    return _figure(record["metrics"]["test"], MOMENT_SUM.name)


def _figure(block: Any, key: str) -> float:
    """A figure of a metrics block, NaN where the record has none."""
    value = block.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def _finite(values: Sequence[float]) -> list[float]:
    """The finite values (a seed without an oracle figure is NaN: left out of its mean ± std)."""
    return [v for v in values if math.isfinite(v)]


def _gain_cells(cell: Cell) -> list[str]:
    if cell.gain is None:
        return ["", "", "", cell.note[:120] if cell.base else ""]
    d = sumr_of(cell.gain)
    over = "" if cell.gain.interval_over == BOTH_LEVELS else str(cell.gain.interval_over)
    return [f"{d.difference:+.1f}", f"[{d.low:+.1f}, {d.high:+.1f}]", f"{d.p:.3g}",
            "; ".join(n for n in (over, cell.drift) if n)]


def sumr_of(comparison: Comparison) -> MetricDifference:
    return next(m for m in comparison.metrics if m.metric == "SumR")


SEEDS_ONLY = "seeds (t-test)"  # a moment gain's interval where the rankings hold no moment ranks


@dataclass(frozen=True)
class MomentGain:
    """A localizing run's gain in test VCMR SumR over its base at one value: the difference of the means
    over their shared seeds, with its 95% interval and p. Where both rows' stored rankings hold per-query
    moment ranks on every shared seed, these are `stats.compare_rows`'s (two-level paired bootstrap,
    paired randomization test), as for SumR; otherwise the paired t-test over the seeds
    (scipy.stats.ttest_rel), the seeds the only level, as in the leaderboard's Δ VCMR SumR (`over`
    says which)."""

    cell: Cell
    seeds: tuple[int, ...]
    difference: float
    low: float
    high: float
    p: float | None
    over: str = SEEDS_ONLY


def moment_gains(cells: Sequence[Cell], sweep: Sweep | None = None, rows: SweepRows | None = None,
                 settings: Settings = Settings()) -> list[MomentGain]:
    """Per cell whose base was made at its value, both with VCMR SumR on two shared seeds or more; from the
    stored moment ranks where `sweep` and `rows` are given and the ranks are there."""
    at = {(c.value, c.run): c for c in cells}
    found = []
    for cell in cells:
        base = at.get((cell.value, cell.base)) if cell.base else None
        if base is None:
            continue
        mine, theirs = _by_seed(cell.seeds, cell.moments), _by_seed(base.seeds, base.moments)
        shared = sorted(mine.keys() & theirs.keys())
        if len(shared) < 2:
            continue
        ranked = (_ranked_moment_gain(cell, base, shared, sweep, rows, settings)
                  if sweep is not None and rows is not None else None)
        if ranked is not None:
            found.append(ranked)
            continue
        delta, low, high, p = seed_interval({s: mine[s] for s in shared}, {s: theirs[s] for s in shared}, LEVEL)
        assert low is not None and high is not None  # two shared seeds or more: the paired t-test's interval
        found.append(MomentGain(cell, tuple(shared), delta, low, high, p))
    return found


def _ranked_moment_gain(cell: Cell, base: Cell, shared: list[int], sweep: Sweep, rows: SweepRows,
                        settings: Settings) -> MomentGain | None:
    """The gain from both rows' stored moment ranks on `shared`, or None where a seed has none."""
    try:
        a, b = rows(run_at(cell.run, sweep, cell.value)), rows(run_at(base.run, sweep, base.value))
    except UserError:
        return None
    if not (has_metric(a, MOMENT_SUM.name, shared) and has_metric(b, MOMENT_SUM.name, shared)):
        return None
    pick = dataclasses.replace(settings, metrics=(MOMENT_SUM.name,))
    (d,) = compare_rows(only_seeds(a, shared), only_seeds(b, shared), pick).metrics
    return MomentGain(cell, tuple(shared), d.difference, d.low, d.high, d.p, BOTH_LEVELS)


def _by_seed(seeds: Sequence[int], values: Sequence[float]) -> dict[int, float]:
    return {s: v for s, v in zip(seeds, values) if math.isfinite(v)}


MOMENT_HEAD = ["value", "run", "seeds", "VCMR SumR", "base", "gain (VCMR SumR)", "VCMR gain's 95% interval",
               "VCMR gain's p", "VCMR interval over"]


def moment_rows(cells: Sequence[Cell], gains: Sequence[MomentGain]) -> list[list[str]]:
    """A row per cell with VCMR SumR, its gain where `moment_gains` made one."""
    by_cell = {(g.cell.value, g.cell.run): g for g in gains}
    out = []
    for c in cells:
        found = _by_seed(c.seeds, c.moments)  # the seeds with the figure
        if not found:
            continue
        g = by_cell.get((c.value, c.run))
        out.append([show_point(c.value), c.run, " ".join(map(str, found)), mean_std(list(found.values())), c.base,
                    *([f"{g.difference:+.1f}", f"[{g.low:+.1f}, {g.high:+.1f}]", "" if g.p is None else f"{g.p:.3g}",
                       g.over] if g is not None else ["", "", "", ""])])
    return out


HEAD = ["value", "run", "seeds", "SumR", "oracle SumR", "base", "gain (SumR)", "95% interval", "p", "note"]


def rows_of(cells: list[Cell]) -> list[list[str]]:
    return [[show_point(c.value), c.run, " ".join(map(str, c.seeds)), mean_std(_finite(c.sumr)), mean_std(_finite(c.oracle_sumr)),
             c.base, *_gain_cells(c)] for c in cells]


@dataclass(frozen=True)
class Slope:
    """How a run's gain over its base moves with the test split's multi-relevant share: the least-squares
    slope of the per-seed gains (the run's SumR minus its base's, same seed and world) against the share
    in points, per 10 points of share, with its 95% interval (scipy.stats.linregress's standard error and
    Student's t with n - 2 degrees of freedom)."""

    run: str
    base: str
    points: int
    per_10: float
    low: float
    high: float


SHARE_AXIS = "share"  # the slope's axis where the multi-relevant share moves


def noise_axis(sweep: Sweep, facts: dict[Point, dict[str, Any]]) -> tuple[str | None, dict[Point, float]]:
    """What the slope is taken against, in points (x100): the test split's multi-relevant share where it
    moves with the knob; else, for one knob that moves the training labels alone (sim.mislabel_rate: the
    records' mislabelled training queries move with it), the knob's own value (the share of training
    queries moved to a wrong video); else None: the knob moves no label noise the records show (the
    training regime, e.g. sim.train_videos), and the report asks how the gains move with it instead."""
    shares = {v: facts[v][FACTS[0][2]] for v in sweep.values
              if isinstance(facts.get(v, {}).get(FACTS[0][2]), (int, float))}
    if len(set(shares.values())) >= 2 or len(sweep.knobs) != 1:
        return SHARE_AXIS, {v: 100 * x for v, x in shares.items()}
    wrong = [facts[v].get(FACTS[3][2]) for v in sweep.values if v in facts]
    if len(wrong) >= 2 and None not in wrong and len(set(wrong)) == 1:  # records older than the fact: a noise knob
        return None, {}
    return sweep.knobs[0], {v: 100 * v[0] for v in sweep.values}


def slopes(sweep: Sweep, cells: list[Cell], facts: dict[Point, dict[str, Any]], figure: str = "sumr") -> list[Slope]:
    """A slope per run whose base is swept with it, where two values or more have both, from the cells'
    own per-seed figures (`figure`: "sumr", or "moments" for VCMR SumR; the records were read once, by
    `sweep_cells`; a seed without the figure is left out), against `noise_axis`."""
    sumr = {(c.value, c.run): _by_seed(c.seeds, getattr(c, figure)) for c in cells}
    _, axis = noise_axis(sweep, facts)
    found = []
    for run, base in dict.fromkeys((c.run, c.base) for c in cells if c.base):
        xs, ys = [], []
        for value in sweep.values:
            mine, theirs = sumr.get((value, run), {}), sumr.get((value, base), {})
            for seed in sorted(mine.keys() & theirs.keys()):
                if value in axis:
                    xs.append(axis[value])
                    ys.append(mine[seed] - theirs[seed])
        if len(set(xs)) >= 2 and len(xs) >= 3:
            fit = scipy.stats.linregress(xs, ys)
            half = scipy.stats.t.ppf(0.975, len(xs) - 2) * fit.stderr
            found.append(Slope(run, base, len(xs), 10 * fit.slope, 10 * (fit.slope - half), 10 * (fit.slope + half)))
    return found


def slope_rows(found: list[Slope], cells: Sequence[Cell] = (),
               lows: dict[str, list[float]] | None = None) -> list[list[str]]:
    """The slope table's rows; `lows`: each run's gains' lower interval ends (default: its SumR gains')."""
    if lows is None:
        lows = {}
        for c in cells:
            if c.gain is not None:
                lows.setdefault(c.run, []).append(sumr_of(c.gain).low)
    return [[s.run, s.base, str(s.points), f"{s.per_10:+.2f}", f"[{s.low:+.2f}, {s.high:+.2f}]",
             _slope_reads(s, lows.get(s.run, []))] for s in found]


def _slope_reads(slope: Slope, lows: Sequence[float]) -> str:
    """What the slope says, and what the run's gain is credited to when it does not grow with the noise
    (`lows`: the lower ends of the run's gains' intervals at the values it was made)."""
    if slope.low > 0:
        return "grows with the noise"
    trend = "shrinks with the noise" if slope.high < 0 else "no trend the interval can tell from none"
    if "+oracle" not in slope.run and any(low > 0 for low in lows):
        return f"{trend}: its gain is its encoder's or loss's, not a gain from handling label noise"
    return trend


def _room_tag(spec: MethodSpec, treatment: str) -> str:
    """The tag of the oracle x `treatment` cell on the method's backbone (`tv_only-positive` for ARL, whose cells
    start from its treatment row; the treatment's name elsewhere)."""
    return spec.treated_tag(treatment) or treatment


def reads_no_relations(run: str) -> bool:
    """`METHOD~ROW` where ROW is the row the method names as its base (MethodSpec.base_row: `arl~base`, ARL
    without its ambiguity sets): it trains without any detector's pairs, so an oracle beside it would be the
    same run again; the oracle's room on its encoder is the matrix cell `room_of` names, which `sweep --oracle`
    trains beside it."""
    method, detector, _, tag = split_run_name(run)
    return bool(tag) and not detector and method in METHODS and tag == METHODS.get(method).base_row


def room_of(run: str, treatment: str = ROOM_TREATMENTS[0]) -> str:
    """The oracle's room beside a row that reads no relations: the matrix cell oracle x `treatment` on the row's
    encoder, from the row its cells start from (docs/matrix.md): `positive`, the true false negatives trained as
    positives, as the oracle rows of the methods that read relations are (`relations.oracle.mode=positive`;
    `arl~base` -> `arl+oracle~tv_only-positive`); `ignore`, only left out of its negatives
    (`arl+oracle~tv_only-ignore`)."""
    method, _, backbone, _ = split_run_name(run)
    return join_run_name(method, "oracle", backbone, _room_tag(METHODS.get(method), treatment))


def oracle_of(run: str) -> str:
    """The run's name with the oracle detector: `msl` -> `msl+oracle`, `arl~base` -> `arl+oracle~base`
    (harness/engine/records.py `run_tag`: the detector before the backbone and the tag)."""
    method, _, backbone, tag = split_run_name(run)
    return join_run_name(method, "oracle", backbone, tag)


def room_beside(base: str, treatment: str = ROOM_TREATMENTS[0]) -> str:
    """The run that measures the oracle's room on `base`: its oracle row, or beside a row that reads no
    relations the matrix cell `room_of` names under `treatment`."""
    return room_of(base, treatment) if reads_no_relations(base) else oracle_of(base)


def own_room(run: str, base: str, treatment: str = ROOM_TREATMENTS[0]) -> str:
    """The run's own oracle row, from which the room it leaves is read: `oracle_of(run)`; beside a base that
    reads no relations, whose room is a matrix cell under `treatment`, the run's oracle row under that treatment,
    so that both rooms train the true pairs alike (`arl` -> `arl+oracle~positive`, ARL's Table 6 row with the
    oracle's pairs, made by `sweep --method arl~positive --oracle`; `arl+oracle` trains them restrained, ARL's own
    treatment, and is not read against a room measured as positives)."""
    if not reads_no_relations(base):
        return oracle_of(run)
    method, _, backbone, _ = split_run_name(run)
    return join_run_name(method, "oracle", backbone, treatment)


@dataclass(frozen=True)
class Answer:
    """One run at one value, read against the oracle's room on its base there."""

    cell: Cell
    room: Cell | None  # the base with the oracle detector, against the base
    share: RoomShare | None
    note: str = ""


def answers(sweep: Sweep, cells: list[Cell], rows: SweepRows, settings: Settings) -> list[Answer]:
    """Per (value, run with a base): its gain, the oracle's gain on the same base and world, and the share
    of that room the run closes (stats.room_share)."""
    at = {(c.value, c.run): c for c in cells}
    found = []
    for c in cells:
        if not c.base or c.gain is None:
            continue
        if "+oracle" in c.run:  # the room itself
            found.append(Answer(c, c, None))
            continue
        oracle_run = room_beside(c.base, sweep.rooms[0])
        room = at.get((c.value, oracle_run))
        if room is None or room.gain is None:
            how = " (sweep --oracle trains it beside the base)" if reads_no_relations(c.base) else ""
            found.append(Answer(c, None, None, f"no {oracle_run} run at this value{how}"))
            continue
        try:
            method, base, oracle = (rows(run_at(r, sweep, c.value)) for r in (c.run, c.base, room.run))
            found.append(Answer(c, room, room_share(method, base, oracle, settings)))
        except UserError as e:
            found.append(Answer(c, room, None, str(e)[:120]))
    return found


@dataclass(frozen=True)
class RoomLeft:
    """One run at one value beside its own oracle row (`oracle_of(run)`: `ral@msl` -> `ral+oracle@msl`) and
    its base's: the room the oracle finds on the run, (run+oracle - run), against the room it finds on the
    base, (base+oracle - base), on the same test queries (stats.gain_change: `before` the base's room, `after`
    the run's). A method that handles label noise takes part of its base's room: less is left on it."""

    cell: Cell
    own: Cell  # the run with the oracle detector
    base_room: Cell  # the base with the oracle detector (or the oracle's room beside a base without relations)
    change: GainChange | None
    note: str = ""


def rooms_left(sweep: Sweep, cells: list[Cell], rows: SweepRows, settings: Settings) -> list[RoomLeft]:
    """Per (value, run with a base) where the run's own oracle row and its base's were both trained."""
    at = {(c.value, c.run): c for c in cells}
    found = []
    for c in cells:
        if not c.base or "+oracle" in c.run:
            continue
        own = at.get((c.value, own_room(c.run, c.base, sweep.rooms[0])))
        base_room = at.get((c.value, room_beside(c.base, sweep.rooms[0])))
        if own is None or base_room is None:
            continue
        try:
            run_oracle, run, base_oracle, base = (rows(run_at(r, sweep, c.value))
                                                  for r in (own.run, c.run, base_room.run, c.base))
            found.append(RoomLeft(c, own, base_room, gain_change(run_oracle, run, base_oracle, base, settings)))
        except UserError as e:
            found.append(RoomLeft(c, own, base_room, None, str(e)[:120]))
    return found


ROOM_LEFT_HEAD = ["value", "multi-relevant share", "run", "the oracle's room on it", "base", "the room on the base",
                  "room the run takes", "its 95% interval", "reads"]
ROOM_LEFT_CSV = ["the oracle's room on the run", "room the run takes", "the taken room's 95% interval"]


def room_left_rows(found: list[RoomLeft], facts: dict[Point, dict[str, Any]]) -> list[list[str]]:
    out = []
    for k in found:
        c, g = k.cell, k.change
        share = _fact(facts.get(c.value, {}).get(FACTS[0][2]))
        if g is None:
            out.append([show_point(c.value), share, c.run, "", c.base, "", "", "", k.note])
            continue
        # taken = base's room - the run's own room; its interval is the change's, negated (0.0 - x: no -0.0)
        out.append([show_point(c.value), share, c.run, f"{g.after:+.1f}", c.base, f"{g.before:+.1f}",
                    f"{0.0 - g.change:+.1f}", f"[{0.0 - g.high:+.1f}, {0.0 - g.low:+.1f}]",
                    _and_drifts(_room_left_reads(k, g), k.own, k.base_room)])
    return out


def _room_left_reads(k: RoomLeft, g: GainChange) -> str:
    base = sumr_of(k.base_room.gain) if k.base_room.gain is not None else None
    if base is not None and base.high < 0:  # the oracle costs the base: there is no room, only a cost to compare
        than = ("less than its base" if g.low > 0 else "more than its base" if g.high < 0
                else "as much as its base, as far as the interval can tell")
        return f"knowing the false negatives costs its base ({g.before:+.1f}): no room to take; it costs the run {than}"
    if g.high < 0:
        gain = sumr_of(k.cell.gain) if k.cell.gain is not None else None
        if gain is not None and gain.high < 0:  # less room on it, yet below its base: nothing of the room taken
            return (f"leaves less room than its base ({g.after:+.1f} against {g.before:+.1f}) while it loses to the "
                    f"base ({gain.difference:+.1f}): less is left to take on it, none of it taken")
        taken = f" ({-g.change / g.before:.0%} of it)" if g.before > 0 else ""
        return f"leaves less room than its base{taken}: it takes part of what the false negatives cost"
    if g.low > 0:
        return "leaves more room than its base: knowing the false negatives is worth more on it"
    if base is None or base.low <= 0:
        return "no room on its base the interval can tell from zero: nothing to take"
    most, gain = 0.0 - g.low, sumr_of(k.cell.gain) if k.cell.gain is not None else None
    if gain is not None and most < gain.low:
        return (f"no difference the interval can tell: it takes at most {most:.1f} of the base's {g.before:.1f}, less "
                f"than its gain's lower bound ({gain.low:+.1f}), so most of its gain is not the false negatives' room")
    return (f"no difference the interval can tell: it takes between {0.0 - g.high:.1f} and {most:.1f} of the base's "
            f"{g.before:.1f}")


@dataclass(frozen=True)
class Cost:
    """Where the knob moves only the training split (the test set the same at every value: mislabelled
    training pairs), one run at one value against the same run at the preset's value: what the noise costs
    it (clean minus noisy, paired on the same test queries), and for a run with a base, the share of its
    base's cost it recovers, (run - base) / (base clean - base), over one joint bootstrap (`room_share`
    with the clean base in the oracle's place)."""

    cell: Cell
    cost: MetricDifference | None
    recovered: RoomShare | None
    note: str = ""


def costs(sweep: Sweep, cells: list[Cell], rows: SweepRows, settings: Settings) -> list[Cost]:
    """Each (value away from the preset, run) whose run at the preset's value was scored on the same test
    set; none for a knob that moves the test set too (the multi-relevant share): there, clean and noisy
    runs answer other queries, and the oracle's room is the reference."""
    if sweep.default not in sweep.values:
        return []
    at = {(c.value, c.run): c for c in cells}
    found = []
    for c in cells:
        if c.value == sweep.default or (sweep.default, c.run) not in at:
            continue
        noisy, clean = rows(run_at(c.run, sweep, c.value)), rows(c.run)
        if noisy.world != clean.world:
            continue
        try:
            cost = sumr_of(compare_rows(clean, noisy, settings))
        except UserError as e:
            found.append(Cost(c, None, None, str(e)[:120]))
            continue
        recovered, note = None, ""
        if c.base and c.gain is not None and (sweep.default, c.base) in at:
            try:
                recovered = room_share(noisy, rows(run_at(c.base, sweep, c.value)), rows(c.base), settings)
            except UserError as e:
                note = str(e)[:120]
        found.append(Cost(c, cost, recovered, note))
    return found


COST_CSV = ["what the noise costs it", "the cost's 95% interval", "share of the base's cost recovered",
            "the recovered share's 95% interval"]  # the cost table's own columns in the CSV
COST_HEAD = ["value", "mislabelled (train)", "run", "what the noise costs it", "its 95% interval", "base",
             "gain over the base", "its 95% interval", "share of the base's cost recovered", "the share's 95% interval",
             "reads"]


def cost_rows(found: list[Cost], facts: dict[Point, dict[str, Any]], by_run: dict[tuple[Point, str], Cost]
              ) -> list[list[str]]:
    out = []
    for k in found:
        c = k.cell
        gain = sumr_of(c.gain) if c.gain is not None and k.recovered is not None else None
        base_cost = by_run.get((c.value, c.base))
        out.append([show_point(c.value), _fact(facts.get(c.value, {}).get(FACTS[3][2])), c.run,
                    *(_signed(k.cost) if k.cost else ["", ""]), c.base if gain else "",
                    *(_signed(gain) if gain else ["", ""]), *(_share(k.recovered) if k.recovered else ["", ""]),
                    k.note or _cost_reads(k, gain, base_cost.cost if base_cost else None)])
    return out


def _cost_reads(k: Cost, gain: MetricDifference | None, base_cost: MetricDifference | None) -> str:
    if k.cost is None:
        return ""
    if gain is None:
        return ("the noise costs it this much" if k.cost.low > 0 else
                "no cost the interval can tell from zero")
    if base_cost is None or base_cost.low <= 0:
        return "its base pays no cost the interval can tell from zero: nothing to recover"
    if gain.high < 0:
        return "adds to its base's cost: below its base under this noise"
    if gain.low <= 0:
        return "recovers no part of its base's cost the interval can tell from none"
    return "recovers this share of what the noise costs its base"


@dataclass(frozen=True)
class Change:
    """Where the knob sets the training regime (no noise axis): one run with a base at one value, its gain
    there against its gain at the preset's value on the same test queries (stats.gain_change)."""

    cell: Cell
    change: GainChange | None
    note: str = ""


def changes(sweep: Sweep, cells: list[Cell], rows: SweepRows, settings: Settings) -> list[Change]:
    """Per (value away from the preset, run with a base): how its gain moved from the preset's value."""
    if sweep.default not in sweep.values:
        return []
    at = {(c.value, c.run): c for c in cells}
    found = []
    for c in cells:
        ref = at.get((sweep.default, c.run))
        if c.value == sweep.default or c.gain is None or ref is None or ref.gain is None:
            continue
        try:
            run, base, run_ref, base_ref = (rows(run_at(r, sweep, v)) for v in (c.value, sweep.default)
                                            for r in (c.run, c.base))
            found.append(Change(c, gain_change(run, base, run_ref, base_ref, settings)))
        except UserError as e:
            found.append(Change(c, None, str(e)[:120]))
    return found


CHANGE_HEAD = ["value", "run", "base", "gain at the preset's value", "gain here", "change of the gain",
               "its 95% interval", "reads"]
CHANGE_CSV = ["gain at the preset's value", "change of the gain", "the change's 95% interval"]


def change_rows(found: list[Change]) -> list[list[str]]:
    out = []
    for k in found:
        g = k.change
        if g is None:
            out.append([show_point(k.cell.value), k.cell.run, k.cell.base, "", "", "", "", k.note])
            continue
        reads = ("the gain grows with it" if g.low > 0 else "the gain shrinks with it" if g.high < 0 else
                 "no change the interval can tell from none")
        out.append([show_point(k.cell.value), k.cell.run, k.cell.base, f"{g.before:+.1f}", f"{g.after:+.1f}",
                    f"{g.change:+.1f}", f"[{g.low:+.1f}, {g.high:+.1f}]", reads])
    return out


def order_rows(sweep: Sweep, cells: list[Cell]) -> list[list[str]]:
    """Per value: the runs from the highest mean test SumR down (whether the methods' order moves)."""
    out = []
    for value in sweep.values:
        here = sorted((c for c in cells if c.value == value), key=lambda c: -float(np.mean(c.sumr)))
        if here:
            out.append([show_point(value), " > ".join(f"{c.run} {np.mean(c.sumr):.1f}" for c in here)])
    return out


ANSWER_HEAD = ["value", "multi-relevant share", "run", "base", "gain", "its 95% interval", "oracle's gain on the base",
               "the room's 95% interval", "share of the room closed", "the share's 95% interval", "reads"]


def answer_rows(found: list[Answer], facts: dict[Point, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for a in found:
        c, gain = a.cell, sumr_of(a.cell.gain) if a.cell.gain is not None else None
        room = sumr_of(a.room.gain) if a.room is not None and a.room.gain is not None else None
        share = a.share
        rows.append([show_point(c.value), _fact(facts.get(c.value, {}).get(FACTS[0][2])), c.run, c.base,
                     *(_signed(gain) if gain else ["", ""]), *(_signed(room) if room else ["", ""]),
                     *(_share(share) if share else ["", ""]), _with_drift(_answer_reads(a, gain, room), a)])
    return rows


def _with_drift(reads: str, a: Answer) -> str:
    """The reads, and where the gain's or the room's rows were made on two machines, that they were."""
    return _and_drifts(reads, a.cell, *([a.room] if a.room is not None and a.room is not a.cell else []))


def _and_drifts(reads: str, *cells: Cell) -> str:
    return "; ".join(n for n in (reads, *dict.fromkeys(c.drift for c in cells)) if n)


def _signed(d: MetricDifference) -> list[str]:
    return [f"{d.difference:+.1f}", f"[{d.low:+.1f}, {d.high:+.1f}]"]


def _share(share: RoomShare) -> list[str]:
    if not math.isfinite(share.share):
        return ["", ""]
    if not math.isfinite(share.low):  # the room's interval holds 0: a ratio to it means nothing
        return ["", "(no room to share)"]
    return [f"{share.share:.0%}", f"[{share.low:.0%}, {share.high:.0%}]"]


def _answer_reads(a: Answer, gain: MetricDifference | None, room: MetricDifference | None) -> str:
    if a.note:
        return a.note
    if gain is None or room is None:
        return ""
    if "+oracle" in a.cell.run:
        return ("knowing every false negative is worth this much here" if room.low > 0
                else "knowing every false negative costs the base here: no room" if room.high < 0
                else "no room the interval can tell from zero")
    if gain.high < 0:
        return "loses to its base"
    if gain.low <= 0:
        return "no gain the interval can tell from none"
    if room.low <= 0:
        return "gains where the oracle has no room: not a gain from handling label noise"
    if a.share is not None and math.isfinite(a.share.low) and a.share.share > 1:
        if a.share.low > 1:
            return "gains more than the oracle's whole room: more than handling these false negatives gives"
        return ("gains about the oracle's whole room or more (the share's interval holds 100%): label noise "
                "explains it only if the run takes all of the room")
    return "gains within the oracle's room: the share closed is what label noise can explain"


def render(sweep: Sweep, cells: list[Cell], facts: dict[Point, dict[str, Any]],
           found: Sequence[Slope] = (), found_answers: Sequence[Answer] = (),
           found_costs: Sequence[Cost] = (), found_changes: Sequence[Change] = (),
           found_rooms: Sequence[RoomLeft] = (), found_moments: Sequence[MomentGain] = (),
           moment_slopes: Sequence[Slope] = ()) -> tuple[str, str]:
    """The report (markdown) and its CSV; runs that localize add their VCMR SumR and its gains (a section, and
    columns of the CSV, that only such a sweep has)."""
    fact_head = ["value", *(label for _, _, label in FACTS)]
    axis = noise_axis(sweep, facts)[0]
    fact_rows = [[show_point(v), *(_fact(facts[v].get(label)) for _, _, label in FACTS)] for v in sweep.values if v in facts]
    # each table's rows made once: the markdown shows them and the CSV reads its columns from them
    run_rows, answer_table = rows_of(cells), answer_rows(list(found_answers), facts)
    change_table, room_rows = change_rows(list(found_changes)), room_left_rows(list(found_rooms), facts)
    by_run = {(k.cell.value, k.cell.run): k for k in found_costs}
    cost_table = cost_rows(list(found_costs), facts, by_run)
    moment_table = moment_rows(cells, found_moments)
    md = [f"# {sweep.dataset}: {sweep.knob} swept", "",
          f"Written by `{sweep.command}` (harness/reports/sweeps.py; the statistics: docs/statistics.md). "
          f"At {sweep.knob}={show_point(sweep.default)} (the preset's value) the runs are the dataset's plain rows. SumR: "
          "test split, mean ± sample std over seeds; oracle SumR: the same ranks against every relevant video; "
          "gain: the run's mean SumR minus its base's on the same world and seeds, with the 95% interval of the "
          "two-level (seeds, then test queries) paired bootstrap and the paired randomization test's p.", "",
          "## The world at each value", "", markdown_table(fact_head, fact_rows), "",
          "## Runs", "", markdown_table(HEAD, run_rows), "",
          *(_slope_section(axis, found, cells) if axis is not None else _regime_section(sweep, cells, change_table)),
          "## Is it the noise?", "",
          "Per run with a base and value: its gain over the base, the oracle's gain on the same base and world "
          "(the base trained with every false negative known: the room label noise leaves), and the share of "
          "that room the run closes, gain / room, with the 95% percentile interval of the ratio over the same "
          "two-level paired bootstrap drawn jointly for both differences (harness/reports/stats.py `room_share`; "
          "left out where the room's own interval is not above zero). A gain larger than the room, or a gain "
          "where there is no room, is not a gain from handling label noise.", "",
          *_room_treatment_note(sweep, cells),
          markdown_table(ANSWER_HEAD, answer_table) if answer_table
          else "(no run with a base and its oracle at one value yet)", ""]
    if room_rows:
        md += ["## The room a run leaves", "",
               "Per run at a value where the run was also trained with the oracle detector (`ral+oracle@msl` beside "
               "`ral@msl`) and its base too: the oracle's room on the run itself (run+oracle - run) against the "
               "room on its base (base+oracle - base), and the room the run takes, the base's room minus its "
               "own, with the 95% interval of the two-level paired bootstrap over each query's difference of "
               "differences (harness/reports/stats.py `gain_change`). A method that handles label noise leaves "
               "less room on itself than its base leaves; one whose gain comes from elsewhere leaves the same.", "",
               markdown_table(ROOM_LEFT_HEAD, room_rows), ""]
    if moment_table:
        md += _moment_section(axis, moment_table, list(found_moments), list(moment_slopes))
    if cost_table:
        md += ["## What the noise costs, and how much of it each run recovers", "",
               "The knob moves only the training split (the test set is the same at every value), so each run at a "
               "value is compared with itself at the preset's value on the same test queries: what the noise costs "
               "it (clean minus noisy SumR, the two-level paired bootstrap's 95% interval). For a run with a base: "
               "its gain over the base at that value and the share of the base's cost it recovers, gain / cost, "
               "with the ratio's interval over one joint bootstrap (`room_share`, the clean base in the oracle's "
               "place). The oracle knows every false negative but not which labelled pair is wrong, so its share "
               "is what knowing the false negatives recovers of a mislabelling's cost.", "",
               markdown_table(COST_HEAD, cost_table), ""]
    answered = {(r[0], r[2]): r[6:] for r in answer_table}
    changed = {(r[0], r[1]): [r[3], *r[5:7]] for r in change_table}
    costed = {(r[0], r[2]): [*r[3:5], *r[8:10]] for r in cost_table}
    left = {(r[0], r[2]): [r[3], *r[6:8]] for r in room_rows}
    moment_csv = MOMENT_HEAD[3:4] + MOMENT_HEAD[5:] if moment_table else []  # only a sweep of runs that localize
    located = {(r[0], r[1]): [r[3], *r[5:]] for r in moment_table}
    table = csv_text([*HEAD, *(label for _, _, label in FACTS), *ANSWER_HEAD[6:], *COST_CSV, *CHANGE_CSV,
                      *ROOM_LEFT_CSV, *moment_csv],
                     (row + [_fact(facts[cell.value].get(label)) for _, _, label in FACTS]
                      + answered.get((row[0], cell.run), [""] * len(ANSWER_HEAD[6:]))
                      + costed.get((row[0], cell.run), [""] * len(COST_CSV))
                      + changed.get((row[0], cell.run), [""] * len(CHANGE_CSV))
                      + left.get((row[0], cell.run), [""] * len(ROOM_LEFT_CSV))
                      + (located.get((row[0], cell.run), [""] * len(moment_csv)) if moment_csv else [])
                      for cell, row in zip(cells, run_rows)))
    return "\n".join(md), table


def _room_treatment_note(sweep: Sweep, cells: Sequence[Cell]) -> list[str]:
    """Where a base reads no relations (`arl~base`), which matrix cell the answer table reads as its room."""
    bases = sorted({c.base for c in cells if c.base and reads_no_relations(c.base)})
    if not bases:
        return []
    read, *other = sweep.rooms
    also = f"; the room under {', '.join(other)} ({', '.join(room_of(b, t) for b in bases for t in other)}) is " \
           "a row of the runs table" if other else ""
    return [f"Beside {', '.join(bases)}, which trains no detector's pairs, the room is the matrix cell oracle x {read} "
            f"({', '.join(room_of(b, read) for b in bases)}; `sweep --room`, docs/matrix.md): the true false "
            f"negatives {ROOM_READS[read]}{also}.", ""]


def _slope_section(axis: str, found: Sequence[Slope], cells: list[Cell]) -> list[str]:
    return ["## Does the gain grow with the noise?", "",
            "Per run with a base: the slope of its per-seed gain over the base against "
            + ("the test split's multi-relevant share (SumR points per 10 points of share)" if axis == SHARE_AXIS else
               f"{axis} x 100 (SumR points per 10 points of it: the test set is the same at every value)")
            + ", least squares over every (value, seed) with both runs, 95% interval from scipy.stats.linregress's "
            "standard error and Student's t. A label-noise method earns its name where its gain grows with the noise.",
            "",
            markdown_table(["run", "base", "points", f"slope per 10 pts of {axis}", "95% interval", "reads"],
                           slope_rows(list(found), cells)) if found else "(no run with a base at two values yet)", ""]


def _moment_section(axis: str | None, table: list[list[str]], gains: list[MomentGain],
                    found: list[Slope]) -> list[str]:
    lows: dict[str, list[float]] = {}
    for g in gains:
        lows.setdefault(g.cell.run, []).append(g.low)
    md = ["## Moments: VCMR SumR", "",
          "The runs localize (video corpus moment retrieval, harness/engine/vcmr.py): each run's test VCMR SumR "
          "(mean ± sample std over seeds) and its gain over its base on the same world and seeds, with its 95% "
          "interval and p. Where both runs' stored rankings hold per-query moment ranks (runs made since the "
          "rankings keep them), the interval is the two-level paired bootstrap's and p the paired randomization "
          f"test's, as for SumR (\"{BOTH_LEVELS}\"); otherwise they are the paired t-test's over the seeds "
          f"(scipy.stats.ttest_rel, \"{SEEDS_ONLY}\"; as in the leaderboard's Δ VCMR SumR): with three seeds "
          "that interval is wide.", "", markdown_table(MOMENT_HEAD, table), ""]
    if axis is not None:
        md += ["Per run with a base: the slope of its per-seed VCMR gain against the same axis as above, fitted "
               "the same way.", "",
               markdown_table(["run", "base", "points", f"VCMR slope per 10 pts of {axis}", "95% interval", "reads"],
                              slope_rows(found, lows=lows)) if found else "(no run with a base at two values yet)", ""]
    return md


def _regime_section(sweep: Sweep, cells: list[Cell], change_table: list[list[str]]) -> list[str]:
    return ["## Does the gain depend on the training regime?", "",
            f"{sweep.knob} moves no label noise the records show (the test split's multi-relevant share and the "
            "training split's mislabelled queries are the same at every value): it sets the training regime (how "
            "much data, how many steps). Per run with a base, at each value away from the preset's: its gain over "
            "the base there against its gain at the preset's value, on the same test queries, and the change with "
            "the 95% interval of the two-level paired bootstrap over each query's difference of differences "
            "(harness/reports/stats.py `gain_change`). Then the runs' order at each value.", "",
            markdown_table(CHANGE_HEAD, change_table) if change_table
            else "(no run with a base at the preset's value and another yet)", "",
            markdown_table(["value", "runs by mean test SumR"], order_rows(sweep, cells)), ""]


def _fact(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else ""


def plot(sweep: Sweep, cells: list[Cell], facts: dict[Point, dict[str, Any]]):
    """SumR (labelled, solid; oracle, dashed) against the multi-relevant share, one colour per run, and each
    gain with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    by_share = bool(RELEVANCE_KNOBS & set(sweep.knobs)) or len(sweep.knobs) > 1
    x_of = {v: facts[v].get(FACTS[0][2]) if by_share else v[0] for v in facts}
    xlabel = FACTS[0][2] if by_share else sweep.knob
    for run in sweep.runs:
        mine = sorted((c for c in cells if c.run == run), key=lambda c: c.value)
        xs = [x_of[c.value] for c in mine]
        line, = left.plot(xs, [np.mean(c.sumr) for c in mine], marker="o", label=run)
        left.plot(xs, [np.nanmean(c.oracle_sumr) for c in mine], linestyle="--", color=line.get_color())
        gains = [c for c in mine if c.gain is not None]
        if gains:
            d = [sumr_of(c.gain) for c in gains if c.gain is not None]
            right.errorbar([x_of[c.value] for c in gains], [m.difference for m in d],
                           yerr=[[m.difference - m.low for m in d], [m.high - m.difference for m in d]],
                           marker="o", capsize=3, label=f"{run} - {gains[0].base}", color=line.get_color())
    left.set(xlabel=xlabel, ylabel="test SumR (dashed: oracle)", title=f"{sweep.dataset}: SumR")
    right.axhline(0, color="k", linewidth=0.8)
    right.set(xlabel=xlabel, ylabel="gain over base (SumR, 95% interval)", title="gains")
    for ax in (left, right):
        if ax.get_legend_handles_labels()[0]:  # no gain yet: no legend to draw
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_sweep(sweep: Sweep, out: str | Path, settings: Settings = Settings()) -> str:
    """The sweep's table and curves under OUT/sweeps/; returns the markdown."""
    rows = SweepRows(out, sweep)
    cells, facts = sweep_cells(sweep, out, settings, rows)
    if not cells:
        raise UserError(f"no records of the sweep under {Path(out) / 'runs' / sweep.dataset} yet; run it without "
                        "--report-only, or check --out")
    regime = noise_axis(sweep, facts)[0] is None
    moments = moment_gains(cells, sweep, rows, settings)
    md, table = render(sweep, cells, facts, [] if regime else slopes(sweep, cells, facts),
                       answers(sweep, cells, rows, settings), [] if regime else costs(sweep, cells, rows, settings),
                       changes(sweep, cells, rows, settings) if regime else [],
                       rooms_left(sweep, cells, rows, settings),
                       moments, [] if regime or not moments else slopes(sweep, cells, facts, "moments"))
    name = sweep.name or f"{sweep.dataset}~{'-'.join(k.rpartition('.')[2] for k in sweep.knobs)}"
    stem = inside(Path(out) / "sweeps" / check_name(name, "--name", "give a plain file name"), out, "--name")
    write_texts({stem.with_suffix(".md"): md, stem.with_suffix(".csv"): table})
    write_png(plot(sweep, cells, facts), stem.with_suffix(".png"))
    progress.log(f"wrote {stem}.md, .csv, .png")
    return md
