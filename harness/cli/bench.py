"""The core commands: `run` (one training run), `bench` (methods x datasets x seeds, then the
leaderboard), `leaderboard`, `list` and `config`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, ensure_dir
from prvr.harness.base.names import check_tag
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS, OBJECTIVES, Registry
from prvr.harness.cli.args import (DEFAULT_DATASET, add_jobs_argument, command, command_line, common_arguments,
                                   data_root_overrides, run_args, run_line, set_threads)
from prvr.harness.cli.fanout import launch_from_args, run_in_processes
from prvr.harness.cli.plan import (PROFILE_FILE, BenchRun, PlanRow, check_kept, commands, estimate, expected_memory_mb,
                                   plan_table, prepare_data, profile_costs, quick_summary)
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import record_path
from prvr.harness.engine.runner import run_name, run_one
from prvr.harness.reports import leaderboard
from prvr.harness.reports.quick import QUICK_DATASET, QUICK_OUT, QUICK_TAG


def cmd_run(args: argparse.Namespace) -> None:
    check_tag(args.tag)
    set_threads(args.threads)
    cfg = resolve(args.method, args.dataset, args.seed, [*data_root_overrides(args), *args.overrides], args.config)
    run_name(cfg, args.tag)  # a name unfit for a folder fails before the output folder is made
    ensure_dir(args.out)
    run_one(cfg, args.out, resume=args.resume, tag=args.tag, command=command_line(), force_resume=args.force_resume)


def cmd_bench(args: argparse.Namespace) -> None:
    check_tag(args.tag)
    _apply_quick(args)
    set_threads(args.threads)  # checks --threads for both ways of running; the runs started in processes get their own
    plan = _bench_plan(args)
    kept = [p for p in plan if args.skip_existing and p.record.exists()]
    check_kept(kept, "--tag")
    todo = [p for p in plan if p not in kept]
    if args.print_commands:
        print(commands([list(p.args) for p in todo], args.threads), end="")
        return
    workers, launch = launch_from_args(args, [p.cfg for p in plan])
    if args.plan or args.method is None:
        print(_plan_text(args, plan, workers), end="", flush=True)
    if args.plan:
        return
    if args.prepare_data:
        prepare_data([p.cfg for p in todo])
        return
    ensure_dir(args.out)
    start = time.perf_counter()
    for p in kept:
        progress.log(f"keeping {p.record}")
    left = 0  # runs --finish-by left unstarted
    if launch.in_processes(workers):
        left = run_in_processes(args.out, [(p.cfg, p.name, list(p.args)) for p in todo], workers, args.threads,
                                "bench", launch)
    else:
        _bench_here(args, todo)
    progress.log(f"bench: {len(plan)} runs planned, {len(todo) - left} made, in {time.perf_counter() - start:.0f} s")
    if args.quick:
        print(quick_summary([p.record for p in plan]), end="")
    else:
        leaderboard.rebuild(args.out)


def _apply_quick(args: argparse.Namespace) -> None:
    """--quick: the bench's methods on sim-tiny, tagged quick, into results/quick/ (harness/reports/quick.py),
    as many at once as --jobs auto gives; without it, the results folder defaults to results/."""
    if not args.quick:
        args.out = args.out or "results"
        return
    if args.dataset != [DEFAULT_DATASET]:
        raise UserError(f"--quick runs on {QUICK_DATASET}; leave --dataset out, or drop --quick")
    if args.tag:
        raise UserError(f"--quick tags its runs '{QUICK_TAG}'; leave --tag out, or drop --quick")
    args.dataset, args.tag = [QUICK_DATASET], QUICK_TAG
    args.out = args.out or QUICK_OUT
    args.jobs = "auto" if args.jobs is None else args.jobs


def _plan_text(args: argparse.Namespace, plan: list, workers: int) -> str:

    costs = profile_costs(Path(args.out) / PROFILE_FILE)
    rows = [PlanRow(p.name, p.cfg.dataset, p.cfg.seed, estimate(p.cfg, p.record, costs),
                    args.skip_existing and p.record.exists(), expected_memory_mb(p.cfg, p.record, costs)) for p in plan]
    return plan_table(rows, workers, args.out, quick=args.quick)


def _bench_plan(args: argparse.Namespace) -> list:
    """Every (method, dataset, variant, seed) of the bench, resolved up front so that a bad
    name or key fails before any training (plan.BenchRun each)."""
    plan = []
    for dataset in dict.fromkeys(args.dataset):  # a name given twice plans its runs once
        for method in dict.fromkeys(args.method or METHODS.names()):
            variants: list[list[str]] = [[]]  # each run's overrides beyond the bench's
            # On simulated data each method also runs with the oracle detector: its objectives fed
            # the ground truth, the upper bound of what its detection could give.
            if args.oracle and DATASETS.get(dataset).simulated:
                variants.append(["relations.name=oracle"])
            for extra in variants:
                for seed in dict.fromkeys(args.seeds):
                    overrides = [*args.overrides, *extra]
                    cfg = resolve(method, dataset, seed, [*data_root_overrides(args), *overrides], args.config)
                    name = run_name(cfg, args.tag)
                    plan.append(BenchRun(cfg, name, record_path(args.out, cfg.dataset, name, cfg.seed),
                                           tuple(run_args(args, method, dataset, seed, overrides))))
    return plan


def _bench_here(args: argparse.Namespace, todo: list) -> None:
    for i, p in enumerate(todo):
        progress.log(f"[{i + 1}/{len(todo)}] {p.name} on {p.cfg.dataset}, seed {p.cfg.seed}")
        run_one(p.cfg, args.out, resume=args.resume, tag=args.tag, command=run_line(p.args, args.threads),
                force_resume=args.force_resume)


def cmd_leaderboard(args: argparse.Namespace) -> None:
    leaderboard.rebuild(args.out, skip_bad=args.skip_bad)


def cmd_list(args: argparse.Namespace) -> None:
    registries: tuple[tuple[str, Registry[Any]], ...] = (
        ("methods", METHODS), ("backbones", BACKBONES), ("detectors", DETECTORS), ("objectives", OBJECTIVES),
        ("datasets", DATASETS))
    for title, reg in registries:
        print(f"{title}:")
        entries = list(reg.entries())
        width = max([18, *(len(e.name) + 1 for e in entries)])
        for e in entries:
            print(f"  {e.name:<{width}} {e.summary}")
            spec = METHODS.get(e.name) if reg is METHODS else None
            if spec is not None and spec.objectives:  # the registered parts its objective combines
                parts = [OBJECTIVES.entry(o).name for o in spec.objectives]  # an unknown name: one line
                more = " + those of its backbone's own method" if spec.extends_backbone else ""
                print(f"  {'':<{width}} objectives: {', '.join(parts)}{more}")


def cmd_config(args: argparse.Namespace) -> None:
    import yaml


    cfg = resolve(args.method, args.dataset, args.seed, [*data_root_overrides(args), *args.overrides], args.config)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")


@command("run", "one training run")
def add_run(sub) -> None:
    run = sub.add_parser("run", help="one training run; writes DIR/runs/<dataset>/<run>/seed<S>.json")
    run.add_argument("--method", required=True)
    run.add_argument("--dataset", default=DEFAULT_DATASET)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", default="results", help="results folder (default: results)")
    common_arguments(run)
    run.set_defaults(func=cmd_run)


@command("bench", "methods x datasets x seeds, then the leaderboard")
def add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="methods x datasets x seeds, then the leaderboard")
    bench.add_argument("--method", nargs="+", default=None, help="default: every registered method")
    bench.add_argument("--dataset", nargs="+", default=[DEFAULT_DATASET])
    bench.add_argument("--seeds", nargs="+", type=int, default=[0],
                       help="default: 0 (one seed per method keeps the no-argument bench short; "
                            "the committed tables use --seeds 0 1 2)")
    bench.add_argument("--out", default=None, help="results folder (default: results; results/quick with --quick)")
    bench.add_argument("--oracle", action=argparse.BooleanOptionalAction, default=False,
                       help="also run each method with the oracle detector on simulated data (default: off)")
    bench.add_argument("--skip-existing", action="store_true", help="keep runs whose record already exists")
    bench.add_argument("--quick", action="store_true",
                       help="every method on sim-tiny in a few minutes, tagged quick, into results/quick/, "
                            "kept out of the leaderboard (a first command that finishes)")
    bench.add_argument("--plan", action="store_true",
                       help="print the plan (each run's expected time) and stop; a bench without --method "
                            "prints it before it starts")
    bench.add_argument("--print-commands", action="store_true",
                       help="print one `prvr-bench run` line per planned run (a SLURM job array's commands) and stop")
    bench.add_argument("--prepare-data", action="store_true",
                       help="build each planned dataset's cache once, then stop (before a SLURM array)")
    add_jobs_argument(bench)
    common_arguments(bench)
    bench.set_defaults(func=cmd_bench)


@command("leaderboard", "the tables from the run records")
def add_leaderboard(sub) -> None:
    board = sub.add_parser("leaderboard", help="rebuild results/leaderboard.{csv,md} from the run records")
    board.add_argument("--out", default="results")
    board.add_argument("--skip-bad", action="store_true", help="leave unreadable records out instead of failing")
    board.set_defaults(func=cmd_leaderboard)


@command("list", "what is registered")
def add_list(sub) -> None:
    p = sub.add_parser("list", help="registered methods, backbones, detectors, objectives and datasets")
    p.set_defaults(func=cmd_list)


@command("config", "a run's resolved config")
def add_config(sub) -> None:
    show = sub.add_parser("config", help="print the resolved config of a run as YAML")
    show.add_argument("--method", required=True)
    show.add_argument("--dataset", default=DEFAULT_DATASET)
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--set", dest="overrides", action="append", default=[])
    show.add_argument("--config")
    show.add_argument("--backbone", default=None, metavar="NAME", help="another backbone than the method's own")
    show.set_defaults(func=cmd_config)
