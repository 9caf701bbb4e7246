"""The matrix's report (`prvr-bench matrix`, harness/cli/matrix.py): detectors x treatments, one table per
backbone, from the run records.

Each cell of a table is one recipe of registered parts (the command derives it): its test SumR (mean ±
sample std over the matrix's seeds) and its gain over the backbone's plain cell (the backbone's own method
on the one-to-one labels), with the 95% interval of the two-level paired bootstrap
(harness/reports/stats.py `compare_rows`); a cell not made yet says so with its command, and a cell whose
parts do not fit says why. Every record of the matrix must be of one world (the dataset, the generator,
the scale and the test split's facts, `stats.world_of`): a record of another world is refused in one line
naming both records, before anything is written.

Written to OUT/matrix/<dataset>[~name].{md,csv} with the shared writers (harness/reports/table.py), one
CSV row per cell.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, write_texts
from prvr.harness.base.names import check_name, inside
from prvr.harness.engine.records import drift_heading, drift_note, load_record_at, machine_of, record_path
from prvr.harness.reports.stats import (BOTH_LEVELS, MetricDifference, Row, Settings, compare_rows, load_row,
                                        world_of)
from prvr.harness.reports.table import Markdown, code, csv_text, markdown_cell, markdown_table, mean_std

CANNOT, NOT_RUN, PARTIAL, MADE = "cannot work", "not run", "partly run", "made"


@dataclass(frozen=True)
class MatrixCell:
    """One (detector, treatment, backbone): the run that makes it, or why it cannot work."""

    backbone: str
    detector: str
    treatment: str
    run: str = ""  # the run's folder name; "" where the cell cannot work
    recipe: str = ""  # the `prvr-bench run` line that makes it, without its --seed
    reason: str = ""  # why the parts do not fit (one line); "" where they do
    plain: bool = False  # the backbone's plain cell: what the table's gains are measured against


@dataclass(frozen=True)
class Matrix:
    """What a matrix holds: its dataset, axes (each treatment with what it does), seeds and cells."""

    dataset: str
    backbones: tuple[str, ...]
    detectors: tuple[str, ...]
    treatments: tuple[tuple[str, str], ...]  # (name, what it does to the detected pairs)
    seeds: tuple[int, ...]
    cells: tuple[MatrixCell, ...]
    command: str
    name: str = ""  # the report's file is <dataset>~<name>; "" for <dataset>
    notes: tuple[str, ...] = ()  # how the command derived the cells, shown above the tables

    def cell(self, backbone: str, detector: str, treatment: str) -> MatrixCell:
        return next(c for c in self.cells if (c.backbone, c.detector, c.treatment) == (backbone, detector, treatment))

    def plain(self, backbone: str) -> str:
        """The backbone's plain run ("" where it has none)."""
        return next((c.run for c in self.cells if c.backbone == backbone and c.plain), "")


@dataclass(frozen=True)
class Filled:
    """A cell as its records fill it."""

    cell: MatrixCell
    status: str  # CANNOT, NOT_RUN, PARTIAL or MADE
    seeds: tuple[int, ...] = ()  # the matrix's seeds with a record
    sumr: tuple[float, ...] = ()
    gain: MetricDifference | None = None  # SumR against the plain cell
    over: str = ""  # what the interval resamples
    note: str = ""  # why there is no gain (no plain run yet, too few shared seeds, no rankings)
    drift: str = ""  # where the cell's and the plain cell's seeds were made on different machines (`drift_note`)


def fill(matrix: Matrix, out: str | Path, settings: Settings) -> list[Filled]:
    """Every cell with its records' figures and its gain over its backbone's plain cell."""
    records = _records(matrix, out)
    rows: dict[str, Row | str] = {}  # run -> its row on the matrix's seeds, or why it has none
    for run in dict.fromkeys(run for run, _ in records):
        try:
            row = load_row(out, matrix.dataset, run)
            rows[run] = dataclasses.replace(row, seeds={s: v for s, v in row.seeds.items() if s in matrix.seeds})
        except UserError as e:  # e.g. records without stored rankings: said in the cell
            rows[run] = str(e)
    return [_fill(matrix, c, records, rows, settings) for c in matrix.cells]


def _records(matrix: Matrix, out: str | Path) -> dict[tuple[str, int], Any]:
    """The records of the matrix's runs and seeds, checked to be of one world."""
    found: dict[tuple[str, int], Any] = {}
    first: tuple[tuple[str, ...], Path] | None = None
    for run in dict.fromkeys(c.run for c in matrix.cells if c.run):
        for seed in matrix.seeds:
            path = record_path(out, matrix.dataset, run, seed)
            if not path.is_file():
                continue
            record = load_record_at(path)
            world = world_of(record)
            if first is None:
                first = (world, path)
            elif world != first[0]:
                raise UserError(f"{path} was made on another world than {first[1]} ({_world(world)} against "
                                f"{_world(first[0])}); the cells of a matrix are compared on one world: re-make that "
                                "run (remove its folder), or give the matrix the --set that made it")
            found[(run, seed)] = record
    return found


def _fill(matrix: Matrix, cell: MatrixCell, records: dict[tuple[str, int], Any], rows: dict[str, Row | str],
          settings: Settings) -> Filled:
    if not cell.run:
        return Filled(cell, CANNOT)
    seeds = tuple(s for s in matrix.seeds if (cell.run, s) in records)
    if not seeds:
        return Filled(cell, NOT_RUN)
    sumr = tuple(float(records[(cell.run, s)]["metrics"]["test"]["SumR"]) for s in seeds)
    status = MADE if len(seeds) == len(matrix.seeds) else PARTIAL
    if cell.plain:
        return Filled(cell, status, seeds, sumr)
    plain = matrix.plain(cell.backbone)
    mine, theirs = rows.get(cell.run), rows.get(plain)
    if not plain:
        note = "no plain cell on this backbone to measure a gain against"
    elif isinstance(mine, str) or isinstance(theirs, str):
        note = mine if isinstance(mine, str) else str(theirs)
    elif mine is None or theirs is None:
        note = f"no gain yet: the plain cell {plain} is not run"
    else:
        try:
            comparison = compare_rows(mine, theirs, settings)
        except UserError as e:  # too few shared seeds: said in the cell
            return Filled(cell, status, seeds, sumr, note=str(e))
        gain = next(m for m in comparison.metrics if m.metric == "SumR")
        drift = drift_note(cell.run, {s: machine_of(records[(cell.run, s)]) for s in seeds}, plain,
                           {s: machine_of(records[(plain, s)]) for s in matrix.seeds if (plain, s) in records})
        return Filled(cell, status, seeds, sumr, gain, comparison.interval_over, drift=drift)
    return Filled(cell, status, seeds, sumr, note=note)


# ----------------------------------------------------------------------------- writing
def _world(world: tuple[str, ...]) -> str:
    dataset, generator, scale, digest = (*world, "", "", "", "")[:4]
    return f"dataset {dataset}, generator {generator or '?'}, scale {scale or 'default'}, test split {digest or '?'}"


def _seeds(seeds: Sequence[int]) -> str:
    return " ".join(map(str, seeds))


def _gain_text(f: Filled) -> str:
    if f.gain is None:
        return ""
    d = f.gain
    over = "" if f.over == BOTH_LEVELS else f", {f.over}"
    return f"{d.difference:+.1f} [{d.low:+.1f}, {d.high:+.1f}]{over}"


def cell_text(f: Filled, seeds: Sequence[int]) -> Markdown:
    """A table cell: its run, SumR and gain; or why it has none."""
    c = f.cell
    if f.status == CANNOT:
        return Markdown(markdown_cell(f"cannot work: {c.reason}"))
    if f.status == NOT_RUN:
        return Markdown(f"not run ({code(c.recipe + ' --seed S')}, S = {_seeds(seeds)})")
    figure = mean_std(list(f.sumr))
    part = f" (seeds {_seeds(f.seeds)} of {_seeds(seeds)})" if f.status == PARTIAL else ""
    if c.plain:
        tail = "plain"
    elif f.gain is not None:
        tail = f"gain {_gain_text(f)}" + (f"; {drift_heading(f.drift)} (below)" if f.drift else "")
    else:
        tail = f.note[:160]
    return Markdown(f"{code(c.run)}: {figure}{part}; {markdown_cell(tail)}")


def render(matrix: Matrix, filled: list[Filled]) -> tuple[str, str]:
    """The report (markdown) and its CSV."""
    at = {(f.cell.backbone, f.cell.detector, f.cell.treatment): f for f in filled}
    names = [t for t, _ in matrix.treatments]
    md = [f"# {matrix.dataset}: detectors x treatments x backbones", "",
          f"Written by {code(matrix.command, in_table=False)} (harness/reports/matrix.py; docs/matrix.md). "
          "Each cell is "
          "one recipe of registered parts: test SumR, mean ± sample std over the seeds "
          f"({_seeds(matrix.seeds)}), and its gain over the backbone's plain cell (the cell marked plain) with the "
          "95% interval of the two-level paired bootstrap, seeds then test queries (docs/statistics.md). A cell "
          "whose parts do not fit says why; a cell not made yet gives its command.", "",
          "Treatments:", "", *(f"- **{t}**: {what}" for t, what in matrix.treatments), "",
          *(f"- {n}" for n in matrix.notes), *([""] if matrix.notes else [])]
    for b in matrix.backbones:
        plain = matrix.plain(b)
        table = [[d, *(cell_text(at[(b, d, t)], matrix.seeds) for t in names)] for d in matrix.detectors]
        drifts = [f.drift for f in filled if f.cell.backbone == b and f.drift]
        md += [f"## Backbone {b}" + (f" (plain cell: {plain})" if plain else ""), "",
               markdown_table(["detector", *names], table), "",
               *(f"- {markdown_cell(d)}" for d in dict.fromkeys(drifts)), *([""] if drifts else [])]
    md += ["## The cells' recipes", "",
           "What each cell resolves to: its run (several cells may share one: with no detector, no pair is "
           "treated, so the detector-none row is the plain cell wherever the treatment's objective fits the "
           "backbone), the `prvr-bench run` line that makes it (add `--seed S`), or why its parts do not fit.", "",
           markdown_table(["backbone", "detector", "treatment", "run", "recipe, or why it cannot work"],
                          [[c.backbone, c.detector, c.treatment, c.run or "—",
                            code(c.recipe) if c.run else markdown_cell(c.reason)] for c in matrix.cells]), ""]
    head = ["dataset", "backbone", "detector", "treatment", "status", "run", "plain run", "seeds", "SumR",
            "gain (SumR)", "95% interval", "p", "interval over", "reason or note", "recipe"]
    lines = []
    for f in filled:
        c, d = f.cell, f.gain
        lines.append([matrix.dataset, c.backbone, c.detector, c.treatment, f.status, c.run, matrix.plain(c.backbone),
                      _seeds(f.seeds), mean_std(list(f.sumr)), f"{d.difference:+.2f}" if d else "",
                      f"[{d.low:+.2f}, {d.high:+.2f}]" if d else "", f"{d.p:.3g}" if d else "", f.over if d else "",
                      "; ".join(n for n in (c.reason or f.note, f.drift) if n), c.recipe])
    return "\n".join(md), csv_text(head, lines)


def write_matrix(matrix: Matrix, out: str | Path, settings: Settings = Settings(metrics=("SumR",))) -> str:
    """The matrix's tables under OUT/matrix/; returns the markdown. Everything is read and checked
    before the first file is written."""
    name = f"{matrix.dataset}~{matrix.name}" if matrix.name else matrix.dataset
    stem = inside(Path(out) / "matrix" / check_name(name, "--name", "give a plain file name"), out, "--name")
    md, table = render(matrix, fill(matrix, out, settings))
    write_texts({stem.with_suffix(".md"): md, stem.with_suffix(".csv"): table})
    progress.log(f"wrote {stem}.md, .csv")
    return md
