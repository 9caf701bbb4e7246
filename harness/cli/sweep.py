"""`prvr-bench sweep`: methods trained at several values of one world knob, then their curves.

    prvr-bench sweep --dataset sim-tvr-v2 --knob sim.repeat_prob --values 0 0.2 0.35 0.6 0.9 \\
        --method baseline msl ral@msl --oracle --seeds 0 1 2 --jobs 2

Each (value, method, seed) is an ordinary `prvr-bench run` with `--set KNOB=VALUE`: at the preset's
own value the run is the method's plain row (no tag, so the leaderboard's runs count), elsewhere it is
tagged `<knob>V` (`baseline~repeat_prob0.6`). Several knobs move together when `--knob` names them all and
each value gives one number per knob, `--knob sim.repeat_prob sim.repeat_copies --values 0,2 1,2 1,4`
(a path through the worlds past where one knob ends: repeat_prob stops at 1); a run's tag names the knobs
away from the preset's values (`baseline~repeat_prob1-repeat_copies4`). `METHOD@BACKBONE` trains a method on another backbone
(`ral@msl`); `--oracle` adds each method fed the simulated ground truth (`baseline+oracle`), and beside a
row that trains no detector's pairs (`arl~base`) the oracle's room on its encoder, the matrix cell oracle x
positive (`--room ignore` for the pairs left out of its negatives instead, or both);
`METHOD+DETECTOR~TREATMENT` is a cell of the matrix (`baseline+holmes~soft`, its recipe and run name
from harness/cli/matrix.py). A run whose
record exists is kept, so an interrupted sweep resumes where it stopped and makes no run twice. Every
run is resolved before the first trains: an unknown knob or a value out of its range is one line.
The curves and the table (harness/reports/sweeps.py) follow from the records, also alone with
`--report-only`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, ensure_dir
from prvr.harness.base.names import check_name, join_run_name, split_run_name
from prvr.harness.base.registry import DATASETS, DETECTORS, METHODS
from prvr.harness.cli.args import add_jobs_argument, command, command_line, common_arguments, data_root_overrides, \
    run_args, run_line, set_threads
from prvr.harness.cli.fanout import launch_from_args, run_in_processes
from prvr.harness.cli.matrix import TREATMENTS, Recipe, is_untagged, recipe
from prvr.harness.cli.plan import (PROFILE_FILE, BenchRun, PlanRow, check_kept, estimate, expected_memory_mb, plan_table,
                                   profile_costs)
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import record_path
from prvr.harness.engine.runner import run_name, run_one
from prvr.harness.engine.sections import Config
from prvr.harness.reports.sweeps import ROOM_TREATMENTS, Point, Sweep, point_tag, reads_no_relations, write_sweep
from prvr.methods.recipes import TABLES


@dataclass(frozen=True)
class SweepRun:
    """One planned run of a sweep: the bench's planned run and its tag ("" at the preset's value)."""

    run: BenchRun
    tag: str


@command("sweep", "methods at several values of a world knob, then their curves")
def add_commands(sub) -> None:
    p = sub.add_parser("sweep", help="train methods at several values of one world knob (e.g. sim.repeat_prob), "
                                     "then OUT/sweeps/<dataset>~<knob>.{md,csv,png}")
    p.add_argument("--dataset", default="sim-tvr-v2", help="a simulated dataset (default: sim-tvr-v2)")
    p.add_argument("--knob", nargs="+", required=True, metavar="KEY",
                   help="the config key swept, e.g. sim.repeat_prob or sim.mislabel_rate; several move together")
    p.add_argument("--values", nargs="+", required=True, metavar="V",
                   help="its values; with several knobs, one number per knob joined by commas (1,4)")
    p.add_argument("--method", nargs="+", required=True,
                   help="methods, METHOD@BACKBONE (ral@msl), METHOD~ROW, a row of its ablation tables (arl~base), or "
                        "METHOD+DETECTOR~TREATMENT, a cell of the matrix (baseline+holmes~soft)")
    p.add_argument("--oracle", action="store_true", help="also each method with the oracle detector")
    p.add_argument("--room", nargs="+", choices=ROOM_TREATMENTS, default=[ROOM_TREATMENTS[0]], metavar="TREATMENT",
                   help="with --oracle, beside a row that reads no relations (arl~base): the treatment of the oracle's "
                        "pairs in the room's matrix cell, positive (default, as every other oracle row trains them) "
                        "or ignore (left out of the negatives); several train each, the answer table reads the first")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", default="results")
    p.add_argument("--plan", action="store_true", help="print the planned runs and their expected time, and stop")
    p.add_argument("--report-only", action="store_true", help="write the curves from the records there are")
    p.add_argument("--name", default="", help="the report's file name under OUT/sweeps/ (default <dataset>~<knob>)")
    add_jobs_argument(p)
    common_arguments(p)
    p.set_defaults(func=cmd_sweep)


def plan_sweep(args: argparse.Namespace) -> tuple[Sweep, list[SweepRun]]:
    """Every run of the sweep, resolved up front (a bad knob, value, method or name fails here)."""
    if not DATASETS.get(args.dataset).simulated:
        raise UserError(f"--dataset {args.dataset} is not simulated: a sweep moves a knob of a simulated world; "
                        "pick one of the sim-* datasets")
    knobs = tuple(args.knob)
    if len(set(knobs)) != len(knobs):
        raise UserError(f"--knob {' '.join(knobs)}: a knob given twice; give each once")
    values = tuple(_point(v, knobs) for v in args.values)
    if len(set(values)) != len(values):
        raise UserError(f"--values {' '.join(args.values)}: a value given twice; give each once")
    variants = {m: variant(m, args.dataset) for m in args.method}
    rooms = tuple(dict.fromkeys(args.room))
    if rooms != (ROOM_TREATMENTS[0],) and not (args.oracle and any(reads_no_relations(m) for m in args.method)):
        raise UserError(f"--room {' '.join(args.room)}: the room's treatment is chosen only beside a row that reads "
                        "no relations, with --oracle (e.g. --method arl~base --oracle); other oracle rows train the "
                        "true pairs as positives")
    preset = resolve(_method(args.method[0]), args.dataset, 0, [*data_root_overrides(args), *args.overrides])
    default = tuple(_knob_value(preset, k) for k in knobs)
    runs: list[SweepRun] = []
    names: dict[str, str] = {}  # the run's name at the preset's value -> its method argument
    for value in values:
        at = point_tag(knobs, value, default)
        for method in args.method:
            row, row_sets = variants[method]
            row = "~".join(t for t in (row, args.tag) if t)
            tag = "~".join(t for t in (row, at) if t)
            cell = bool(split_run_name(method)[1])  # a matrix cell brings its own detector: no oracle beside it
            knob_sets = [f"{k}={v:g}" for k, v in zip(knobs, value)]
            beside = [(method, row, [*row_sets, *knob_sets])]  # (its method argument, row tag, --set items)
            if args.oracle and not cell and not reads_no_relations(method):
                beside.append((method, row, [*row_sets, *knob_sets, "relations.name=oracle"]))
            elif args.oracle and reads_no_relations(method):  # the oracle's room on its encoder: a matrix cell
                for treatment in rooms:
                    room = _room_recipe(method, treatment)
                    room_row = "~".join(t for t in (room.tag, args.tag) if t)
                    own = room.backbone == METHODS.get(room.method).backbone
                    beside.append((join_run_name(room.method, backbone="" if own else room.backbone), room_row,
                                   [*room.sets, *knob_sets]))
            for argument, row, extra in beside:
                tag = "~".join(t for t in (row, at) if t)
                for seed in args.seeds:
                    cfg = resolve(_method(argument), args.dataset, seed, [*data_root_overrides(args), *args.overrides,
                                                                           *_backbone(argument), *extra], args.config)
                    name = run_name(cfg, tag)
                    names.setdefault(run_name(cfg, row), method)
                    one = copy.copy(args)
                    one.tag, one.backbone = tag, _backbone_name(argument) or args.backbone
                    planned = BenchRun(cfg, name, record_path(args.out, cfg.dataset, name, seed),
                                       tuple(run_args(one, _method(argument), args.dataset, seed,
                                                      [*args.overrides, *extra])))
                    runs.append(SweepRun(planned, tag))
    if args.name:
        check_name(args.name, "--name", "give a plain file name, e.g. sim-tvr-v2~repeat_prob-ral")
    sweep = Sweep(args.dataset, knobs, values, default, tuple(names), tuple(args.seeds),
                  command_line(), args.name, rooms)
    return sweep, runs


def cmd_sweep(args: argparse.Namespace) -> None:
    set_threads(args.threads)
    sweep, planned = plan_sweep(args)
    if not args.report_only:
        train_planned(args, planned)
    if not args.plan:
        print(write_sweep(sweep, args.out), end="")


def train_planned(args: argparse.Namespace, planned: list[SweepRun]) -> None:
    """The plan, then the runs without a record (`--plan`: the plan alone)."""
    runs = [p.run for p in planned]
    check_kept(runs, "--tag")
    todo = [p for p in planned if not p.run.record.exists()]
    costs = profile_costs(Path(args.out) / PROFILE_FILE)
    rows = [PlanRow(r.name, r.cfg.dataset, r.cfg.seed, estimate(r.cfg, r.record, costs), r.record.exists(),
                    expected_memory_mb(r.cfg, r.record, costs))
            for r in runs]
    workers, launch = launch_from_args(args, [p.run.cfg for p in todo])
    print(plan_table(rows, workers, args.out), end="", flush=True)
    if args.plan:
        return
    ensure_dir(args.out)
    start = time.perf_counter()
    left = 0  # runs --finish-by left unstarted
    if launch.in_processes(workers):
        left = run_in_processes(args.out, [(p.run.cfg, p.run.name, list(p.run.args)) for p in todo], workers,
                                args.threads, "sweep", launch)
    else:
        for i, p in enumerate(todo):
            progress.log(f"[{i + 1}/{len(todo)}] {p.run.name} on {p.run.cfg.dataset}, seed {p.run.cfg.seed}")
            run_one(p.run.cfg, args.out, tag=p.tag, command=run_line(p.run.args, args.threads))
    progress.log(f"sweep: {len(runs)} runs planned, {len(todo) - left} made, in {time.perf_counter() - start:.0f} s")


def _method(name: str) -> str:
    return split_run_name(name)[0]


def _backbone_name(name: str) -> str:
    return split_run_name(name)[2]


def variant(name: str, dataset: str, option: str = "--method") -> tuple[str, tuple[str, ...]]:
    """`METHOD~ROW`: the row's tag and its overrides, from the method's ablation tables (methods/recipes.py;
    `arl~base` is ARL's Table 5 row (a), its encoder without the ambiguity set); ("", ()) without one.
    `METHOD+DETECTOR~TREATMENT`: a cell of the matrix (_cell_variant)."""
    method, detector, _, tag = split_run_name(name)
    if detector:
        return _cell_variant(name, dataset)
    if not tag:
        return "", ()
    rows = {r.tag: r for (m, _), t in sorted(TABLES.items()) if m == method for r in t.rows if r.tag}
    if tag not in rows:
        raise UserError(f"{option} {name}: {method} has no ablation row tagged {tag!r}; its rows: "
                        f"{', '.join(sorted(rows)) or 'none'} (the tables `prvr-bench ablate --method {method} --table T` trains)")
    return tag, rows[tag].overrides


def _cell_variant(name: str, dataset: str) -> tuple[str, tuple[str, ...]]:
    """`METHOD+DETECTOR~TREATMENT` (`baseline+holmes~soft`): the matrix's recipe for that detector and
    treatment on the method's backbone (harness/cli/matrix.py `recipe`), so a sweep's run of it is the run
    `prvr-bench matrix --set KNOB=V` makes of that cell; without `~TREATMENT` the detector's own mode."""
    method, detector, backbone, treatment = split_run_name(name)
    if detector == "oracle":
        raise UserError(f"--method {name}: the oracle rows come with --oracle (each method beside its oracle); "
                        f"give --method {join_run_name(method, backbone=backbone)} --oracle")
    if method not in METHODS or detector not in DETECTORS:
        what = f"method {method!r}" if method not in METHODS else f"detector {detector!r}"
        raise UserError(f"--method {name}: no {what}; a matrix cell is METHOD+DETECTOR~TREATMENT "
                        f"(methods: `prvr-bench list`; detectors: {', '.join(DETECTORS.names())})")
    if not treatment:
        return "", (f"relations.name={detector}",)
    tag, treatment = treatment, METHODS.get(method).treatment_of(treatment)  # `tv_only-ignore` -> ignore
    if treatment not in TREATMENTS:
        raise UserError(f"--method {name}: no treatment {treatment!r} (treatments: {', '.join(TREATMENTS)})")
    found = recipe(detector, TREATMENTS[treatment], backbone or METHODS.get(method).backbone)
    if isinstance(found, str):
        raise UserError(f"--method {name}: this matrix cell cannot work: {found}")
    if not found.plain and found.method == method and is_untagged(found, lambda sets: resolve(method, dataset, 0, sets)):
        found = dataclasses.replace(found, tag="")  # the detector's own mode: its untagged run
    if found.method != method or found.tag != tag or found.plain:
        same = "the backbone's plain run" if found.plain else \
            join_run_name(found.method, detector, tag=found.tag)
        raise UserError(f"--method {name}: that cell of the matrix trains {same}; sweep it by that name")
    return found.tag, tuple(found.sets)


def _room_recipe(name: str, treatment: str) -> Recipe:
    """The oracle's room beside a row that reads no relations (`arl~base`): the matrix cell oracle x `treatment`
    on its backbone (`arl+oracle~tv_only-positive`, the true false negatives trained as positives from the row
    the backbone's cells start from; `~tv_only-ignore`, left out of its negatives), whose gain over that row is
    the room label noise leaves its encoder (harness/reports/sweeps.py `room_of`)."""
    backbone = _backbone_name(name) or METHODS.get(_method(name)).backbone
    found = recipe("oracle", TREATMENTS[treatment], backbone)
    if isinstance(found, str):  # every backbone with a method of its own fits it; said in one line if not
        raise UserError(f"--method {name} --oracle --room {treatment}: the oracle's room on backbone {backbone} "
                        f"(oracle x {treatment}) cannot work: {found}")
    return found


def _backbone(name: str) -> list[str]:
    return [f"backbone={_backbone_name(name)}"] if _backbone_name(name) else []


def _point(text: str, knobs: tuple[str, ...]) -> Point:
    """One --values item: a number per knob, joined by commas."""
    parts = text.split(",")
    try:
        point = tuple(float(p) for p in parts)
    except ValueError:
        point = ()
    if len(point) != len(knobs) or not all(math.isfinite(v) for v in point):
        raise UserError(f"--values {text}: give {'a number' if len(knobs) == 1 else f'{len(knobs)} numbers joined by commas'} "
                        f"per value, one for each of --knob {' '.join(knobs)} (e.g. "
                        f"{','.join(['1'] * len(knobs))})")
    return point


def _knob_value(cfg: Config, knob: str) -> float:
    """The preset's value of the knob: a number of a section of the config (e.g. sim.repeat_prob)."""
    section, _, key = knob.partition(".")
    value = getattr(getattr(cfg, section, None), key, None) if key else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"--knob {knob}: not a number of the config (e.g. sim.repeat_prob, sim.mislabel_rate, "
                        "train.batch_size); `prvr-bench config --method M --dataset D` shows them")
    return float(value)
