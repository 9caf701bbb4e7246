"""What a gain depends on, if not the noise: the sensitivity table (`prvr-bench sensitivity`).

At the world's preset (its label noise held) each other knob moves one at a time; at each setting the
table gives every gain A - B (test SumR, mean over the shared seeds) with its 95% two-level bootstrap
interval (harness/reports/stats.py `compare_rows`), beside the papers' gains on the real dataset the world
imitates (methods/reported.yaml, rows of one paper table: the same features and a shared source). A gain
reads `=` where the paper's gain lies inside its interval, `->` where it moved toward the paper's (closer
than at the preset), `<-` where it moved away, each only where it moved at all: a second table gives each
gain's change from the preset's with its interval (`stats.gain_change_apart`) and its p, Holm-adjusted
over the settings made for that gain, and the knobs each gain depends on with the label noise held. The
last column says whether that setting's intervals hold every paper's gain. The world is not tuned to these
numbers: the table says which knobs move which gain.
Beside each setting, the label noise its records state (the test split's multi-relevant share): a knob that
moves it too is named under the table, since its gains are then not at the preset's noise.

Written to OUT/sensitivity/<name>.{md,csv} with the shared writers (harness/reports/table.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, write_texts
from prvr.harness.base.names import check_name, inside
from prvr.harness.engine.records import load_record_at, record_path
from prvr.harness.reports.leaderboard import paper_figures
from prvr.harness.reports.stats import LEVEL, GainChange, GainDraws, MetricDifference, NoRecords, Row, Settings, \
    change_apart, compare_rows, fmt_p, gain_draws, holm
from prvr.harness.reports.sweeps import FACTS, Point, Sweep, SweepRows, run_at, show_point, sumr_of, world_facts
from prvr.harness.reports.table import csv_text, markdown_table

PRESET = "preset"
NOT_MADE = "not made"
NO_PAPER = "(no paper's gain)"  # the last column of a table none of whose gains a paper reports
# the label noise the table holds at its preset: the test split's multi-relevant share, as sweeps label it
NOISE_FACT = next(label for split, key, label in FACTS if (split, key) == ("test", "multi_relevant_share"))


@dataclass(frozen=True)
class PaperGain:
    """A - B in one paper table on the real dataset: its SumR difference and where it is from."""

    value: float
    source: str
    features: str


@dataclass(frozen=True)
class Setting:
    """A row of the table: the preset, or one knob at one value."""

    knob: str  # "" at the preset
    value: Point
    sweep: Sweep


@dataclass(frozen=True)
class Entry:
    gain: MetricDifference | None
    note: str = ""
    missing: bool = False  # not made: a row of the gain has no records yet
    seeds: tuple[int, ...] = ()  # the seeds the gain is made over (its rows' shared seeds)
    rows: tuple[Row, Row] | None = None  # A's and B's rows, where the gain is made (a change from the preset reads them)


@dataclass(frozen=True)
class Change:
    """A setting's change from the preset's gain, and its p adjusted by Holm's step-down over every setting
    made for the same gain (`holm_by_gain`)."""

    g: GainChange
    holm_p: float


def paper_gain(a: str, b: str, dataset: str, rows: Sequence[dict[str, Any]] | None = None) -> PaperGain | None:
    """The papers' A - B on `dataset` (a real dataset, e.g. tvr): the first pair of rows with the same
    features whose sources share a table (`RAL Table 1` in "ARL Table 1; RAL Table 1"), None without one."""
    rows = paper_figures() if rows is None else rows
    found = [r for r in rows if r.get("dataset") == dataset and "SumR" in r and not r.get("condition")]
    for ra in (r for r in found if r["method"] == a):
        for rb in (r for r in found if r["method"] == b and r["features"] == ra["features"]):
            shared = _sources(ra) & _sources(rb)
            if shared:
                return PaperGain(float(ra["SumR"]) - float(rb["SumR"]), "; ".join(sorted(shared)), str(ra["features"]))
    return None


def _sources(row: dict[str, Any]) -> set[str]:
    return {s.strip() for s in str(row.get("source", "")).split(";") if s.strip()}


def settings_of(sweeps: Sequence[Sweep]) -> list[Setting]:
    """The preset first (once), then each knob's other values in the order given."""
    out = [Setting("", sweeps[0].default, sweeps[0])] if sweeps else []
    for sweep in sweeps:
        out += [Setting(sweep.knob, v, sweep) for v in sweep.values if v != sweep.default]
    return out


def entries(setting: Setting, gains: Sequence[tuple[str, str]], out: str | Path,
            settings: Settings) -> list[Entry]:
    found, rows = [], SweepRows(out, setting.sweep)  # a base of several gains (gmmformer) read once
    for a, b in gains:
        try:
            row_a, row_b = (rows(run_at(r, setting.sweep, setting.value)) for r in (a, b))
            made = compare_rows(row_a, row_b, settings)
            found.append(Entry(sumr_of(made), seeds=made.seeds, rows=(row_a, row_b)))
        except UserError as e:  # not made yet, too few seeds: said in the cell
            found.append(Entry(None, str(e), missing=isinstance(e, NoRecords)))
    return found


def noise_at(setting: Setting, gains: Sequence[tuple[str, str]], out: str | Path) -> float | None:
    """The test split's multi-relevant share at a setting, as the first record of its gains' rows states it
    (`provenance.data.test`); None where none is made or states it."""
    for run in (r for pair in gains for r in pair):
        for seed in setting.sweep.seeds:
            path = record_path(out, setting.sweep.dataset, run_at(run, setting.sweep, setting.value), seed)
            if path.is_file():
                share = world_facts(load_record_at(path))[NOISE_FACT]
                return float(share) if isinstance(share, (int, float)) else None
    return None


def _noise_cell(share: float | None, preset: float | None) -> tuple[str, bool]:
    """The share as the table shows it, and whether the knob moved it off the preset's (beyond rounding)."""
    if share is None:
        return "", False
    moved = preset is not None and abs(share - preset) >= 0.0005
    return (f"{share:.1%} (preset {preset:.1%})" if moved and preset is not None else f"{share:.1%}"), moved


def _reads(d: MetricDifference, paper: PaperGain | None, at_preset: MetricDifference | None,
           change: Change | None = None) -> str:
    """` =` where the paper's gain lies in the interval; else, where the gain moved from the preset's (its
    `change` told from none), ` ->` if it moved toward the paper's and ` <-` if away; else nothing (a
    knob that did not move the gain moved it neither way)."""
    if paper is None:
        return ""
    if d.low <= paper.value <= d.high:
        return " ="
    if at_preset is None or d is at_preset or change is None or not _moved(change):
        return ""
    return " ->" if abs(d.difference - paper.value) < abs(at_preset.difference - paper.value) else " <-"


def _holds(holds: Sequence[bool], cells: int) -> str:
    """The last column, over the row's gains that a paper reports (`cells` of them; a gain none reports is
    shown, not judged): `yes` where every one is made and holds its paper's, `no` where a made one does not,
    and, short of either, how many of them are not made yet (an open row is no answer)."""
    if holds and not all(holds):
        return "no"
    if len(holds) == cells:
        return "yes"
    return f"open: {cells - len(holds)} of {cells} not made"


def _fewer_seeds(made: Sequence[int], asked: int) -> str:
    """`2 of 3 seeds` where a gain is made over fewer of the `asked` seeds than all, else "" (`made`: its rows'
    shared seeds, which `SweepRows` has already narrowed to the asked ones)."""
    return f"{len(made)} of {asked} seeds" if len(made) < asked else ""


def _unmade_lines(unmade: Sequence[Entry], cells: int) -> list[str]:
    """Below the table: how many cells are not made and how to make them; each reason other than a row
    with no records yet (too few seeds, a record of another world) once."""
    if not unmade:
        return []
    missing = sum(e.missing for e in unmade)
    other = sorted({e.note for e in unmade if not e.missing})
    lines = [f"{len(unmade)} of {cells} cells are not made; {missing} of them for want of their runs' records, which "
             "the same command without `--report-only` makes (`--plan` lists those runs and their expected time)."]
    if other:
        lines += ["", "The others:", "", *(f"- {n}" for n in other)]
    return [*lines, ""]


def change_of(entry: Entry, preset: GainDraws | None, settings: Settings) -> GainChange | None:
    """How far a setting's gain moved from the preset's (`stats.gain_change_apart`: the two worlds' test
    queries are different queries, so the two gains are drawn apart; `preset`: the preset's gain drawn once
    from the seed plus one, `preset_draws`), where both are made."""
    if entry.rows is None or preset is None:
        return None
    return change_apart(gain_draws(*entry.rows, settings, settings.seed), preset)


def preset_draws(entry: Entry, settings: Settings) -> GainDraws | None:
    """The preset's gain and its replicates, drawn as `stats.gain_change_apart` draws its reference, once
    for every setting's change."""
    return None if entry.rows is None else gain_draws(*entry.rows, settings, settings.seed + 1)


def holm_by_gain(changes: Sequence[Sequence[GainChange | None]]) -> list[list[Change | None]]:
    """`changes[setting][gain]` with each made change's p adjusted by Holm over its gain's column: one family
    per gain, the settings made for it (the question each answers: which knobs that gain depends on)."""
    out: list[list[Change | None]] = [[None] * len(row) for row in changes]
    for j in range(len(changes[0]) if changes else 0):
        made = [(i, g) for i, row in enumerate(changes) if (g := row[j]) is not None]
        for (i, g), adjusted in zip(made, holm([g.p for _, g in made])):
            out[i][j] = Change(g, adjusted)
    return out


def _alone(c: Change) -> bool:
    """Whether the change's own 95% interval leaves 0."""
    return c.g.low > 0 or c.g.high < 0


def _moved(c: Change) -> str:
    """`grew` / `shrank` where the change's interval lies above / below 0 and its Holm-adjusted p is below
    1 - LEVEL (told from none with every setting of its gain read together), else ""."""
    if not (_alone(c) and c.holm_p < 1 - LEVEL):
        return ""
    return "grew" if c.g.low > 0 else "shrank"


def _change_text(c: Change) -> str:
    g = c.g
    return f"{g.change:+.1f} [{g.low:+.1f}, {g.high:+.1f}], p {fmt_p(g.p)}, Holm {fmt_p(c.holm_p)}"


def _change_cell(c: Change) -> str:
    moved = _moved(c)
    return _change_text(c) + (f" {moved}" if moved else "")


def _depends_lines(gains: Sequence[tuple[str, str]], moves: Sequence[tuple[Setting, bool, list[Change | None]]]
                   ) -> list[str]:
    """Under the change table, per gain: the knobs it depends on (moved with the label noise held, after
    Holm's correction), the settings where it moved with the noise moved too, those where only the change's
    own interval leaves 0, and those where no change is told from none."""
    lines = []
    for j, (a, b) in enumerate(gains):
        depends: list[str] = []
        with_noise: list[str] = []
        alone: list[str] = []
        still: list[str] = []
        made = sum(found[j] is not None for _, _, found in moves)
        for s, off, found in moves:
            c = found[j]
            if c is None:
                continue
            where = f"{s.knob}={show_point(s.value)}"
            if _moved(c):
                (with_noise if off else depends).append(f"{where} ({_change_text(c)})")
            elif _alone(c):
                alone.append(f"{where} ({_change_text(c)})")
            else:
                still.append(where)
        if not made:
            lines.append(f"- `{a} - {b}`: no setting away from the preset is made yet.")
            continue
        said = ([f"depends on the knob at {', '.join(depends)}, the label noise held"] if depends else [])
        said += ([f"moved at {', '.join(with_noise)}, where the label noise moved too"] if with_noise else [])
        said += ([f"its own interval leaves 0 but Holm's correction over the {made} settings made for it does not "
                  f"tell it from none at {', '.join(alone)}"] if alone else [])
        said += ([f"no change told from none at {', '.join(still)}"] if still else [])
        lines.append(f"- `{a} - {b}`: {'; '.join(said)}.")
    return lines


def table(dataset: str, family: str, sweeps: Sequence[Sweep], gains: Sequence[tuple[str, str]], out: str | Path,
          command: str, settings: Settings = Settings()) -> tuple[str, str]:
    """The markdown and CSV of the sensitivity table."""
    papers = [paper_gain(a, b, family) for a, b in gains]
    rows = [(s, entries(s, gains, out, settings)) for s in settings_of(sweeps)]
    preset = [e.gain for e in rows[0][1]] if rows else [None] * len(gains)
    shares = [noise_at(s, gains, out) for s, _ in rows]
    head = ["knob", "value", "multi-relevant (test)", *(f"{a} - {b}" for a, b in gains), "holds every paper's gain"]
    md_rows, csv_rows = [], []
    paper_cells = [f"{p.value:+.1f} ({p.source}, {p.features})" if p else "(no paper row)" for p in papers]
    md_rows.append([f"papers ({family})", "", "", *paper_cells, ""])
    unmade: list[Entry] = []  # the cells not made, each with why (a row's records missing, too few seeds)
    short: list[str] = []  # the cells made over fewer seeds than asked
    moved: list[str] = []  # the settings whose knob moved the label noise too
    moves: list[tuple[Setting, bool, list[Change | None]]] = []  # per setting away from the preset: its changes
    change_md: list[list[str]] = []
    at_preset = [preset_draws(e, settings) for e in rows[0][1]] if rows else []
    every = holm_by_gain([[change_of(e, pe, settings) if s.knob else None for e, pe in zip(found, at_preset)]
                          for s, found in rows])
    asked = len(set(sweeps[0].seeds)) if sweeps else 0
    judged = sum(p is not None for p in papers)  # the gains a paper reports: the last column's cells
    for (s, found), share, changes in zip(rows, shares, every):
        cells, holds = [], []
        noise, off = _noise_cell(share, shares[0] if shares else None)
        if off:
            moved.append(f"{s.knob}={show_point(s.value)}: {noise}")
        for (a, b), e, p, base, g in zip(gains, found, papers, preset, changes):
            if e.gain is None:
                cells.append(NOT_MADE)
                unmade.append(e)
                continue
            d = e.gain
            fewer = _fewer_seeds(e.seeds, asked)
            if fewer:
                short.append(f"{a} - {b} at {s.knob or PRESET}={show_point(s.value)} ({fewer})")
            cells.append(f"{d.difference:+.1f} [{d.low:+.1f}, {d.high:+.1f}]{_reads(d, p, base, g)}"
                         + (f" ({fewer})" if fewer else ""))
            if p is not None:  # a gain no paper reports is shown, not judged
                holds.append(d.low <= p.value <= d.high)
            csv_rows.append([dataset, s.knob or PRESET, show_point(s.value), f"{d.difference:.6g}", f"{d.low:.6g}",
                             f"{d.high:.6g}", f"{d.p:.6g}", a, b, f"{p.value:.6g}" if p else "",
                             p.source if p else "", "" if share is None else f"{share:.6g}",
                             " ".join(map(str, e.seeds)),
                             *([f"{g.g.change:.6g}", f"{g.g.low:.6g}", f"{g.g.high:.6g}", f"{g.g.p:.6g}",
                                f"{g.holm_p:.6g}"] if g else ["", "", "", "", ""])])
        md_rows.append([s.knob or PRESET, show_point(s.value), noise, *cells,
                        _holds(holds, judged) if judged else NO_PAPER])
        if s.knob:
            moves.append((s, off, changes))
            change_md.append([s.knob, show_point(s.value), noise,
                              *(NOT_MADE if e.gain is None else _change_cell(g) if g else "(preset not made)"
                                for e, g in zip(found, changes))])
    note = ("Gains A - B in test SumR on " + dataset + " (mean over the shared seeds), 95% interval of the two-level "
            "paired bootstrap (docs/statistics.md). At the preset every knob is the world's own; below, one knob "
            "moves at a time. `=`: the paper's gain lies in the interval; `->`: closer to it than at the preset, "
            "`<-`: farther, each only where the gain moved from the preset's (its change, in the second table, told "
            "from none after Holm's correction). The papers' gains are on the real dataset the world imitates, from "
            "one table each (methods/reported.yaml); a gain none of them reports reads `(no paper row)` there and is "
            "shown, not judged in the last column. Multi-relevant (test): the label noise at the setting, the share "
            "of test queries with more than one relevant video as its records state it. "
            f"Written by `{command}` (harness/reports/sensitivity.py).")
    held = ([f"The label noise moved with the knob at {len(moved)} setting(s): {'; '.join(moved)}. Their gains "
             "are not at the preset's noise: a change there may be the noise's as much as the knob's.", ""]
            if moved else [])
    partial = ([f"Made over fewer seeds than the {asked} asked, so far: {'; '.join(short)}. The same "
                "command without `--report-only` makes the rest; until then their intervals are wider than the "
                "others' and may yet move.", ""] if short else [])
    made = sum(g is not None for _, _, found in moves for g in found)
    changed = ["## How far each gain moved from the preset's", "",
               "The gain at the setting minus the gain at the preset, with the 95% percentile interval of the difference "
               "of the two gains' two-level bootstraps, drawn independently: a moved knob makes another world, whose "
               "test queries are other queries, so nothing pairs across the two (harness/reports/stats.py "
               "`gain_change_apart`). p: the two-sided p of no change read off the same replicates "
               "(`stats.bootstrap_p`); Holm: that p adjusted by Holm's step-down over every setting made for the "
               f"same gain ({made} changes made so far, one family per gain), so a reading can change as cells "
               "are added. `grew` / `shrank`: the interval lies above / below 0 and the Holm p is below "
               f"{1 - LEVEL:.2g}. A gain that moves with a knob while the label noise holds depends on that knob, "
               "not on the noise.", "", markdown_table(head[:-1], change_md), "", *_depends_lines(gains, moves), ""]
    md = "\n".join([f"# What the gains depend on: {dataset}", "", note, "", markdown_table(head, md_rows), "",
                    *held, *partial, *_unmade_lines(unmade, len(rows) * len(gains)),
                    *(changed if moves else [])])
    text = csv_text(["dataset", "knob", "value", "gain", "low", "high", "p", "a", "b", "paper_gain", "paper_source",
                     "multi_relevant_share", "seeds", "change_from_preset", "change_low", "change_high", "change_p",
                     "change_holm_p"], csv_rows)
    return md, text


def write(dataset: str, family: str, sweeps: Sequence[Sweep], gains: Sequence[tuple[str, str]], out: str | Path,
          name: str, command: str, settings: Settings = Settings()) -> str:
    md, text = table(dataset, family, sweeps, gains, out, command, settings)
    stem = inside(Path(out) / "sensitivity" / check_name(name, "--name", "give a plain file name"), out, "--name")
    write_texts({stem.with_suffix(".md"): md, stem.with_suffix(".csv"): text})
    progress.log(f"wrote {stem}.md, .csv")
    return md

