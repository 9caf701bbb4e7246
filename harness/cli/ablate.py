"""`prvr-bench ablate`: a method's ablation table (e.g. ARL Tables 5 and 6) as one command.

A method declares its tables (`register_table`): each row is a tag and config overrides.
The command trains every row x seed on a dataset (each row is an ordinary run with its
own record, `<method>~<tag>`; a row without tag is the method's plain run), then writes
the table from the records: results/ablations/<dataset>/<method>_table<name>.{md,csv}.
`--tag X` adds `_X` to every row's run name and to the table's file name (the same names as
`prvr-bench run --tag <row>_X`), so a variant of a whole table, e.g. `--tag e30 --set
train.epochs=30`, keeps its own records and its own table.

The columns follow the metrics: R@1/5/10/100 and SumR, Δ SumR; where the records or the paper's
figures of the table hold VCMR / SVMR figures (a backbone that localizes, e.g. the SBERT-PR
tables), the moment columns of the leaderboard (harness/reports/leaderboard.py `moment_columns`) and
Δ VCMR SumR instead. The paper's figures (`reported`, or the rows of methods/reported.yaml that
`reported_from` names) follow under the table, each beside the label of the row it stands for.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from prvr.harness.cli.args import (add_jobs_argument, command, common_arguments, data_root_overrides,
                                   run_args, run_line, set_threads)
from prvr.harness.cli.fanout import launch_from_args, run_in_processes
from prvr.harness.base import progress
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError, ensure_dir, write_text
from prvr.harness.reports.leaderboard import REPORTED_FILE, paper_figures
from prvr.harness.base.names import check_name, check_tag, inside
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import load_record_at, record_path, run_tag
from prvr.harness.base.registry import METHODS, home_method, load_all, method_detector
from prvr.harness.reports.rows import COLUMNS, MOMENT_SUM, Column, is_metric_key, moment_columns, p_value, value_at
from prvr.harness.reports.table import csv_text, markdown_table, mean_std
from prvr.harness.engine.runner import run_name, run_one, settings_diff
from prvr.harness.engine.sections import Config
from prvr.methods.recipes import TABLES, AblationRow, AblationTable

METRICS = ("R@1", "R@5", "R@10", "R@100", "SumR")
DEFAULT_SEEDS = [0, 1, 2]
PRVR_COLUMNS = tuple(c for c in COLUMNS if c.name in METRICS)


@dataclass(frozen=True)
class PaperRow:
    """One row of the paper's figures under an ablation table: its label (one of the table's row
    labels where it stands for that row), its figures by metric key, and a note."""

    label: str
    figures: dict[str, float] = field(default_factory=dict)
    note: str = ""


def paper_rows(table: AblationTable, path: str | Path | None = None) -> tuple[str, list[PaperRow]]:
    """Where the table's paper figures come from (one phrase) and the rows: the PRVR shorthand
    `reported` in the table's row order, then the rows of the reported figures (methods/
    reported.yaml, or `path`) whose `source` is in `reported_from`, in the file's order."""
    rows = [PaperRow(label, dict(zip(METRICS, table.reported[label])))
            for label in (r.label for r in table.rows) if label in table.reported]
    sources = [table.reported_source] if rows else []
    if table.reported_from:
        found = [r for r in paper_figures(path) if r["source"] in table.reported_from]
        if missing := sorted(set(table.reported_from) - {r["source"] for r in found}):
            raise UserError(f"{REPORTED_FILE} has no rows with source {', '.join(map(repr, missing))}, which ablation "
                            f"table {table.method} {table.name} names in reported_from; add them or fix the name")
        rows += [PaperRow(str(r.get("label", r.get("condition", r["method"]))),
                          {k: float(v) for k, v in r.items() if is_metric_key(k)}, str(r.get("note", "")))
                 for r in found]
        sources += [describe_source([r for r in found if r["source"] == s]) for s in table.reported_from]
    return "; ".join(sources), rows


def describe_source(rows: list[dict[str, Any]]) -> str:
    """"<source>, <dataset> <split>[, Phi <phi>, theta <theta>], <features>" of one paper table's
    rows (Phi and theta where every row that names them names the same)."""
    first = rows[0]
    settings = {(r["phi"], r.get("theta")) for r in rows if "phi" in r}
    detector = [f"Phi {phi}, theta {theta}" for phi, theta in settings] if len(settings) == 1 else []
    return ", ".join([first["source"], " ".join(str(first[k]) for k in ("dataset", "split") if k in first),
                      *detector, first["features"]])


def get_table(method: str, name: str) -> AblationTable:
    load_all()
    if (method, name) not in TABLES:
        known = ", ".join(f"--method {m} --table {n}" for m, n in sorted(TABLES)) or "(none)"
        raise UserError(f"no ablation table {name} for method '{method}'; known: {known}")
    return TABLES[(method, name)]


@command("ablate", "a method's ablation table")
def add_commands(sub) -> None:
    p = sub.add_parser("ablate", help="train and tabulate a method's ablation table (e.g. --method arl --table 5)")
    p.add_argument("--method", required=True)
    p.add_argument("--table", required=True, help="table name, e.g. 5 or 6 for ARL")
    p.add_argument("--dataset", default="sim-tvr")
    p.add_argument("--seeds", nargs="+", type=int, default=DEFAULT_SEEDS)
    p.add_argument("--out", default="results")
    p.add_argument("--skip-existing", action="store_true", help="keep runs whose record already exists")
    p.add_argument("--report-only", action="store_true", help="train nothing; tabulate the existing records")
    add_jobs_argument(p)
    common_arguments(p)
    p.set_defaults(func=cmd_ablate)


@dataclass(frozen=True)
class PlannedRun:
    """One row x seed of a table: its config, and the run that trains it (`prvr-bench run --method
    <method> --set <overrides> --tag <tag>`). A row whose settings leave the method's plain run as it
    is (e.g. Phi np-vp, theta 0.7 of SBERT-PR Table 1 on a dataset whose preset is that) is that plain
    run, read and trained under the plain run's name, never again under a second one."""

    row: AblationRow
    cfg: Any
    method: str
    overrides: tuple[str, ...]  # the row's --set items after the command's (the command's alone for a plain run)
    tag: str


def plan_runs(table: AblationTable, dataset: str, seeds: list[int], overrides: list[str], config: str | None,
              extra_tag: str = "") -> list[PlannedRun]:
    """Every row x seed, resolved up front so that a bad key fails before any training."""
    plain = {seed: resolve(table.method, dataset, seed, overrides, config).to_dict() for seed in seeds}
    plan = []
    for row in table.rows:
        for seed in seeds:
            cfg = resolve_row(table, row, dataset, seed, overrides, config)
            if row.home or (row.tag and cfg.to_dict() == plain[seed]):  # trained as a plain run
                plan.append(PlannedRun(row, cfg, cfg.method, tuple(overrides), extra_tag))
            else:
                plan.append(PlannedRun(row, cfg, table.method, (*overrides, *row.overrides), _tag(row, extra_tag)))
    return plan


def resolve_row(table: AblationTable, row: AblationRow, dataset: str, seed: int, overrides: list[str],
                 config: str | None):
    """The config of one row: the table's method with the row's overrides, or for a `home` row
    the plain run of the backbone's own method (the table's overrides apply to it too)."""
    try:
        cfg = resolve(table.method, dataset, seed, [*overrides, *row.overrides], config)
    except UserError as e:
        raise UserError(f"row '{row.label}' of {table.title} (its settings {' '.join(row.overrides) or 'none'} "
                        f"after this command's): {e}") from None
    if not row.home:
        return cfg
    home = home_method(cfg.backbone)
    if home is None:
        raise UserError(f"row '{row.label}' of {table.title} is the plain run of backbone {cfg.backbone}'s own method, "
                        "but no method is built on that backbone; run the table on another --backbone")
    try:
        return resolve(home, dataset, seed, overrides, config)
    except UserError as e:
        raise UserError(f"row '{row.label}' of {table.title} is the plain `{home}` run, which cannot take this "
                        f"command's settings: {e}; drop the {table.method}-only --set items") from None


def cmd_ablate(args: argparse.Namespace) -> None:
    table = get_table(args.method, args.table)
    check_tag(args.tag)
    ensure_dir(args.out)
    set_threads(args.threads)
    plan = plan_runs(table, args.dataset, args.seeds, [*data_root_overrides(args), *args.overrides], args.config,
                     args.tag)
    workers, launch = launch_from_args(args, [p.cfg for p in plan])
    start = time.perf_counter()
    if not args.report_only:
        todo = _to_train(plan, args.out, args.skip_existing)
        left = 0  # runs --finish-by left unstarted
        if launch.in_processes(workers):
            left = _train_in_processes(args, todo, workers, launch)
        else:
            _train_here(args, table, todo, len(plan))
        progress.log(f"ablate: {len(plan)} runs planned, {len(todo) - left} made, in "
                     f"{time.perf_counter() - start:.0f} s")
    report(table, args.out, args.dataset, plan, args.tag, args.overrides)


def _to_train(plan: list[PlannedRun], out: str, skip_existing: bool) -> list[PlannedRun]:
    """The planned runs to train: each run once (rows that are the same run share it), without
    those whose record exists under --skip-existing."""
    todo, seen = [], set()
    for p in plan:
        path = record_path(out, p.cfg.dataset, run_name(p.cfg, p.tag), p.cfg.seed)
        if path in seen or (skip_existing and path.exists()):
            continue
        seen.add(path)
        todo.append(p)
    return todo


def _train_here(args: argparse.Namespace, table: AblationTable, todo: list[PlannedRun], planned: int) -> None:
    for i, p in enumerate(todo):
        progress.log(f"[{i + 1}/{len(todo)} of {planned} planned] {table.title} {p.row.label}: "
                     f"{run_name(p.cfg, p.tag)}, seed {p.cfg.seed}")
        run_one(p.cfg, args.out, resume=args.resume, tag=p.tag, command=run_line(_run_args(args, p), args.threads),
                force_resume=args.force_resume)


def _run_args(args: argparse.Namespace, p: PlannedRun) -> list[str]:
    """The `prvr-bench run` arguments that train `p` alone (--data-root and --backbone travel as the
    --set items they resolve to)."""
    return run_args(argparse.Namespace(**{**vars(args), "tag": p.tag, "data_root": None, "backbone": None}),
                    p.method, args.dataset, p.cfg.seed, list(p.overrides))


def _train_in_processes(args: argparse.Namespace, todo: list[PlannedRun], workers: int, launch) -> int:
    """ablate --jobs N (or --executor ray, or --finish-by): each run as the `prvr-bench run` that trains it
    alone; returns how many runs --finish-by left unstarted."""
    runs = [(p.cfg, run_name(p.cfg, p.tag), _run_args(args, p)) for p in todo]
    return run_in_processes(args.out, runs, workers, args.threads, "ablate", launch)


def _tag(row: AblationRow, extra: str) -> str:
    return "_".join(t for t in (row.tag, extra) if t)


def report(table: AblationTable, out: str, dataset: str, plan, extra_tag: str = "",
           overrides: Sequence[str] = ()) -> Path:
    """Write and print the table from the stored records (missing runs are empty cells). With
    another backbone than the method's own, or another detector, the file is named after the
    method's run with them (`ral@msl_table2.md`, `ral+oracle@msl_table2.md`), so tables on
    several backbones and detectors sit side by side."""
    measured, mismatched = [], []
    for row in table.rows:
        runs = [p for p in plan if p.row is row]  # one per seed
        name = run_name(runs[0].cfg, runs[0].tag)
        recs = []
        for cfg in (p.cfg for p in runs):
            path = record_path(out, dataset, name, cfg.seed)
            if path.exists():
                recs.append(load_record_at(path))
                if diff := settings_diff(cfg, recs[-1], source=f"run record {path} key 'config'"):
                    mismatched.append(f"{path}: {diff}")
        measured.append((row, name, recs))
    source, paper = paper_rows(table)
    moments = moment_columns([*(r["metrics"].get("test", {}) for _, _, recs in measured for r in recs),
                              *(p.figures for p in paper)])
    columns, headline = (moments, MOMENT_SUM) if moments else (PRVR_COLUMNS, PRVR_COLUMNS[-1])
    rows = [(row, name, len(recs), {c.name: _cells(recs, c) for c in (*columns, headline)},
             {r["seed"]: v for r in recs if (v := value_at(r["metrics"].get("test", {}), headline.path)) is not None})
            for row, name, recs in measured]
    reference = next((r for r in rows if r[0].label == table.reference), rows[0])
    header = ["", *table.columns, *(c.name for c in columns), f"Δ {headline.name} vs {reference[0].label}", "seeds",
              "run"]
    backbone = next((p.cfg.backbone for p in plan if not p.row.home), None)  # the rows' backbone: --backbone or --set
    backbone = None if backbone == METHODS.get(table.method).backbone else backbone
    seeds = sorted({p.cfg.seed for p in plan})
    command = " ".join([f"prvr-bench ablate --method {table.method}", *([f"--backbone {backbone}"] if backbone else []),
                        f"--table {table.name} --dataset {dataset}",
                        *([f"--seeds {' '.join(map(str, seeds))}"] if seeds != DEFAULT_SEEDS else []),
                        *([f"--tag {extra_tag}"] if extra_tag else []), *(f"--set {o}" for o in overrides)])
    md = [f"# {table.title} on {dataset}" + (f" ({extra_tag})" if extra_tag else ""), "",
          f"Test split, mean ± std over seeds; from the run records under {out}/runs/{dataset}/ "
          f"(`{command}`).", ""]
    csv_head = ["row", *table.columns, *(f"{c.name} {part}" for c in columns for part in ("mean", "std")),
                f"delta {headline.name}", "p", "paired seeds", "seeds", "run"]
    md_rows, csv_rows = [], []
    for row, name, n, cells, by_seed in rows:
        delta = paired_delta(by_seed, reference[4]) if row is not reference[0] else None
        md_rows.append([row.label, *row.marks, *(mean_std(cells[c.name], c.decimals) for c in columns),
                        _fmt_delta(delta, headline.decimals), str(n), name])
        csv_rows.append([row.label, *row.marks, *(x for c in columns for x in _csv(cells[c.name])),
                         *(("", "", "") if delta is None else
                           (f"{delta[0]:.3f}", "" if delta[1] is None else f"{delta[1]:.4f}", str(delta[2]))),
                         str(n), name])
    md.append(markdown_table(header, md_rows))
    md += reported_lines(source, paper, columns)
    if mismatched:
        md += ["", "Records trained with other settings than this command asks (record: key stored / asked):", "",
               *(f"- {m}" for m in mismatched)]
        for m in mismatched:
            progress.warn(m)
    # the file is named as the runs are (run_tag), with a detector the command sets for every row
    # (`--set relations=oracle`): the labelled table and the oracle one never overwrite each other
    spec = METHODS.get(table.method)
    detectors = {p.cfg.relations.name for p in plan
                 if not p.row.home and not any(o.startswith("relations") for o in p.row.overrides)}
    own = method_detector(spec, backbone or spec.backbone)
    on = run_tag(table.method, detectors.pop() if len(detectors) == 1 else own, own, backbone or spec.backbone,
                 spec.backbone)
    stem = check_name(f"{on}_table{table.name}{'_' + extra_tag if extra_tag else ''}", "ablation table name",
                      "use a shorter --tag")
    path = inside(Path(out) / "ablations" / check_name(dataset, "dataset name", "pick a registered dataset")
                  / f"{stem}.md", out, "ablation table")
    write_text(path, "\n".join(md) + "\n")
    write_text(path.with_suffix(".csv"), csv_text(csv_head, csv_rows))
    print("\n".join(md))
    progress.log(f"wrote {path} and {path.with_suffix('.csv')}")
    return path


def _cells(recs: list[RunRecord], column: Column) -> list[float]:
    """A column's values over the seeds' records: all of them, or none (an empty cell, never a
    mean over the seeds that happen to have it)."""
    values = [v for r in recs if (v := value_at(r["metrics"].get("test", {}), column.path)) is not None]
    return values if len(values) == len(recs) else []


def reported_lines(source: str, paper: list[PaperRow], columns: tuple[Column, ...]) -> list[str]:
    """The paper's rows under the table, in its columns (a figure the paper does not give: an
    empty cell), with a note column where a row has a note."""
    if not paper:
        return []
    notes = any(p.note for p in paper)
    header = ["", *(c.name for c in columns), *(["note"] if notes else [])]
    rows = [[p.label, *(f"{p.figures[c.path[0]]:.{c.decimals}f}" if c.path[0] in p.figures else "" for c in columns),
             *([p.note] if notes else [])] for p in paper]
    return ["", f"Reported in the paper ({source}; not reproduced here, another dataset and protocol):", "",
            markdown_table(header, rows)]


def paired_delta(a: dict[int, float], b: dict[int, float]) -> tuple[float, float | None, int] | None:
    """Mean SumR difference a - b over the seeds both have, the paired t-test's p (None under
    two seeds), and how many seeds were paired; None without a shared seed."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    delta = float(np.mean([a[s] - b[s] for s in shared]))
    p = p_value({s: a[s] for s in shared}, {s: b[s] for s in shared}) if len(shared) >= 2 else None
    return delta, p, len(shared)


def _fmt_delta(delta: tuple[float, float | None, int] | None, decimals: int = 1) -> str:
    if delta is None:
        return ""
    d, p, n = delta
    return f"{d:+.{decimals}f} ({n} seed{'s' if n > 1 else ''}" + (f", p={p:.3f})" if p is not None else ")")


def _csv(v: list[float]) -> tuple[str, str]:
    """The mean and std cells of a column's values over the seeds (blank where none; the std blank for one seed)."""
    if not v:
        return "", ""
    return f"{np.mean(v):.3f}", f"{np.std(v, ddof=1):.3f}" if len(v) > 1 else ""
