"""`prvr-bench`: run, bench, leaderboard, list, config."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import time
from pathlib import Path

from prvr.harness import leaderboard, progress
from prvr.harness.config import resolve
from prvr.harness.executors import check_ready, run_on_ray
from prvr.harness.io import UserError, ensure_dir
from prvr.harness.jobs import (EXECUTORS, Job, Launch, expected_seconds, parse_jobs, run_device, run_jobs,
                               threads_per_job, visible_gpus, wants_cuda)
from prvr.harness.names import check_tag
from prvr.harness.plan import (PROFILE_FILE, BenchRun, PlanRow, commands, estimate, plan_table, prepare_data,
                               profile_costs, profiled_memory_mb, quick_summary)
from prvr.harness.quick import QUICK_DATASET, QUICK_OUT, QUICK_TAG
from prvr.harness.records import log_path, record_path
from prvr.harness.registry import (BACKBONES, COMMANDS as PART_COMMANDS, DATASETS, DETECTORS, METHODS, OBJECTIVES,
                                   RegistryError)
from prvr.harness.runner import run_name, run_one


DEFAULT_DATASET = "sim-tvr"
# The harness's own modules that add subcommands: each has add_commands(subparsers) and sets
# `func` on its parsers. A method's or detector's commands are registered from its own file in
# registry.COMMANDS (RAL's uncertainty report, the SBERT detector's census) and added after these.
HARNESS_COMMANDS: list[str] = ["prvr.harness.ablate", "prvr.harness.reevaluate", "prvr.harness.profiling.command",
                               "prvr.harness.data_cli", "prvr.harness.detection", "prvr.harness.world_calibration",
                               "prvr.harness.parity"]


def data_root_overrides(args: argparse.Namespace) -> list[str]:
    """--data-root DIR (or $PRVR_DATA) as a data.data_root override and --backbone B as
    backbone=B, before the user's --set."""
    root = getattr(args, "data_root", None) or os.environ.get("PRVR_DATA")
    backbone = getattr(args, "backbone", None)
    return [*([f"data.data_root={root}"] if root else []), *([f"backbone={backbone}"] if backbone else [])]


def add_jobs_argument(p: argparse.ArgumentParser) -> None:
    """--jobs, --runs-per-gpu, --executor, --address: how `bench` and `ablate` fan their runs out."""
    p.add_argument("--jobs", default=None, metavar="N",
                   help="runs at a time, each in its own process with its output in OUT/logs/ (default 1: "
                        "one after another in this process; auto: GPUs x --runs-per-gpu where CUDA trains, "
                        "else one per CPU core)")
    p.add_argument("--runs-per-gpu", type=int, default=1, metavar="N",
                   help="runs that share one GPU under --jobs auto and --executor ray (default 1)")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: processes on this machine (default); ray: one Ray task per run "
                        "(pip install prvr-bench[ray]; docs/cluster.md)")
    p.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                   help="with --executor ray: the Ray cluster to join (default: start a local Ray)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backbone", default=None, metavar="NAME",
                   help="train the method's objective on another backbone (default: the method's own; "
                        "`prvr-bench list` names them)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--config", help="YAML file of config overrides (sections as keys)")
    p.add_argument("--tag", default="", help="suffix for the run name, to keep variants apart")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint when there is one")
    p.add_argument("--force-resume", action="store_true",
                   help="--resume even when the checkpoint was trained with other settings, or stores none "
                        "(the record lists the changed keys)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="root folder of real datasets in their public layouts (default: $PRVR_DATA)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads per run (default: torch's choice; with bench --jobs: the cores shared out)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prvr-bench", description="Label-noise methods for PRVR on one harness.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="one training run; writes DIR/runs/<dataset>/<run>/seed<S>.json")
    run.add_argument("--method", required=True)
    run.add_argument("--dataset", default=DEFAULT_DATASET)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", default="results", help="results folder (default: results)")
    _common(run)

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
    _common(bench)

    board = sub.add_parser("leaderboard", help="rebuild results/leaderboard.{csv,md} from the run records")
    board.add_argument("--out", default="results")
    board.add_argument("--skip-bad", action="store_true", help="leave unreadable records out instead of failing")

    sub.add_parser("list", help="registered methods, backbones, detectors, objectives and datasets")

    show = sub.add_parser("config", help="print the resolved config of a run as YAML")
    show.add_argument("--method", required=True)
    show.add_argument("--dataset", default=DEFAULT_DATASET)
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--set", dest="overrides", action="append", default=[])
    show.add_argument("--config")
    show.add_argument("--backbone", default=None, metavar="NAME", help="another backbone than the method's own")
    for module in [*HARNESS_COMMANDS, *(PART_COMMANDS.get(name) for name in PART_COMMANDS.names())]:
        importlib.import_module(module).add_commands(sub)
    return parser


def cmd_run(args: argparse.Namespace) -> None:
    check_tag(args.tag)
    set_threads(args.threads)
    cfg = resolve(args.method, args.dataset, args.seed, [*data_root_overrides(args), *args.overrides], args.config)
    run_name(cfg, args.tag)  # a name unfit for a folder fails before the output folder is made
    ensure_dir(args.out)
    run_one(cfg, args.out, resume=args.resume, tag=args.tag, command=_command_line(), force_resume=args.force_resume)


def set_threads(threads: int | None) -> None:
    """--threads: torch CPU threads of this process (None: torch's choice)."""
    if threads is None:
        return
    if threads < 1:
        raise UserError(f"--threads must be at least 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def cmd_bench(args: argparse.Namespace) -> None:
    check_tag(args.tag)
    _apply_quick(args)
    set_threads(args.threads)  # checks --threads for both ways of running; the runs started in processes get their own
    plan = _bench_plan(args)
    kept = [p for p in plan if args.skip_existing and p.record.exists()]
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
    if workers > 1 or launch.executor == "ray":
        run_in_processes(args.out, [(p.cfg, p.name, list(p.args)) for p in todo], workers, args.threads, "bench",
                         launch)
    else:
        _bench_here(args, todo)
    progress.log(f"bench: {len(plan)} runs planned, {len(todo)} made, in {time.perf_counter() - start:.0f} s")
    if args.quick:
        print(quick_summary([p.record for p in plan]), end="")
    else:
        leaderboard.rebuild(args.out)


def _apply_quick(args: argparse.Namespace) -> None:
    """--quick: the bench's methods on sim-tiny, tagged quick, into results/quick/ (harness/quick.py),
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


def launch_from_args(args: argparse.Namespace, cfgs: list) -> tuple[int, "Launch"]:
    """--jobs, --runs-per-gpu, --executor, --address of `bench` / `ablate`: how many runs at once
    and how they start. GPUs are counted only where a planned run trains on CUDA."""
    if args.address and args.executor != "ray":
        raise UserError("--address names a Ray cluster; add --executor ray")
    if args.address and args.jobs is not None:
        raise UserError("--jobs does not apply to a Ray cluster (--address): its CPUs and GPUs set how many runs "
                        "go at once; leave --jobs out")
    if args.executor == "ray":
        check_ready(args.address)  # not installed, no cluster there: one line now, before any data is made
    gpus = visible_gpus() if any(wants_cuda(c.train.device) for c in cfgs) else []
    jobs = "auto" if args.jobs is None and args.executor == "ray" else args.jobs
    workers = parse_jobs(jobs, len(gpus), args.runs_per_gpu)
    return workers, Launch(args.executor, tuple(gpus), args.runs_per_gpu, args.address)


def _plan_text(args: argparse.Namespace, plan: list, workers: int) -> str:

    costs = profile_costs(Path(args.out) / PROFILE_FILE)
    rows = [PlanRow(p.name, p.cfg.dataset, p.cfg.seed, estimate(p.cfg, p.record, costs),
                    args.skip_existing and p.record.exists()) for p in plan]
    return plan_table(rows, workers, args.out, quick=args.quick)


def _bench_plan(args: argparse.Namespace) -> list:
    """Every (method, dataset, variant, seed) of the bench, resolved up front so that a bad
    name or key fails before any training (plan.BenchRun each)."""
    plan = []
    for dataset in args.dataset:
        for method in args.method or METHODS.names():
            variants = [[]]
            # On simulated data each method also runs with the oracle detector: its objectives fed
            # the ground truth, the upper bound of what its detection could give.
            if args.oracle and DATASETS.get(dataset).simulated:
                variants.append(["relations.name=oracle"])
            for extra in variants:
                for seed in args.seeds:
                    overrides = [*args.overrides, *extra]
                    cfg = resolve(method, dataset, seed, [*data_root_overrides(args), *overrides], args.config)
                    name = run_name(cfg, args.tag)
                    plan.append(BenchRun(cfg, name, record_path(args.out, cfg.dataset, name, cfg.seed),
                                           tuple(_run_args(args, method, dataset, seed, overrides))))
    return plan


def _run_args(args: argparse.Namespace, method: str, dataset: str, seed: int, overrides: list[str]) -> list[str]:
    """The `prvr-bench run` arguments of one planned run (threads are added per job)."""
    out = ["--method", method, "--dataset", dataset, "--seed", str(seed), "--out", str(args.out)]
    for o in overrides:
        out += ["--set", o]
    for flag, value in (("--config", args.config), ("--tag", args.tag), ("--data-root", args.data_root),
                        ("--backbone", args.backbone)):
        if value:
            out += [flag, str(value)]
    return out + (["--resume"] if args.resume else []) + (["--force-resume"] if args.force_resume else [])


def _bench_here(args: argparse.Namespace, todo: list) -> None:
    for i, p in enumerate(todo):
        progress.log(f"[{i + 1}/{len(todo)}] {p.name} on {p.cfg.dataset}, seed {p.cfg.seed}")
        run_one(p.cfg, args.out, resume=args.resume, tag=args.tag, command=_command_line(),
                force_resume=args.force_resume)


def run_in_processes(out, todo: list[tuple], workers: int, threads: int | None, command: str,
                     launch: "Launch | None" = None) -> None:
    """Planned runs (config, run name, `prvr-bench run` arguments), `workers` at a time, each in its own
    process with its output in OUT/logs/ (bench --jobs, ablate --jobs), or as Ray tasks; the
    datasets are loaded here first, so each one's cache is built once."""
    launch = launch or Launch()
    threads = (threads or 1) if launch.address else threads_per_job(workers, threads)
    costs = profile_costs(Path(out) / PROFILE_FILE)
    jobs = []
    for cfg, name, run_args in todo:
        path, log = record_path(out, cfg.dataset, name, cfg.seed), log_path(out, cfg.dataset, name, cfg.seed)
        jobs.append(Job([*run_args, "--threads", str(threads)], f"{name} on {cfg.dataset}, seed {cfg.seed}", path,
                        log, expected_seconds(path), device=run_device(cfg.train.device), threads=threads,
                        memory_mb=profiled_memory_mb(cfg, costs)))
    if not jobs:
        return
    prepare_data([cfg for cfg, _, _ in todo])
    each = f"{threads} torch thread{'s' if threads > 1 else ''} each"
    if launch.executor == "ray":
        progress.log(f"{len(jobs)} run{'s' if len(jobs) > 1 else ''} as Ray tasks, {each}")
        run_on_ray(jobs, launch, workers, command)
        return
    gpus = list(launch.gpus) if any(j.cuda for j in jobs) else []
    progress.log(f"{len(jobs)} runs, {min(workers, len(jobs))} at a time, {each}"
                 + (f", round-robin over GPU {', '.join(gpus)}" if gpus else ""))
    run_jobs(jobs, workers, command, gpus)


def cmd_leaderboard(args: argparse.Namespace) -> None:
    leaderboard.rebuild(args.out, skip_bad=args.skip_bad)


def cmd_list(args: argparse.Namespace) -> None:
    for title, reg in (("methods", METHODS), ("backbones", BACKBONES), ("detectors", DETECTORS),
                       ("objectives", OBJECTIVES), ("datasets", DATASETS)):
        print(f"{title}:")
        entries = list(reg.entries())
        width = max([18, *(len(e.name) + 1 for e in entries)])
        for e in entries:
            print(f"  {e.name:<{width}} {e.summary}")
            if reg is METHODS and e.obj.objectives:  # the registered parts its objective combines
                parts = [OBJECTIVES.entry(o).name for o in e.obj.objectives]  # an unknown name: one line
                more = " + those of its backbone's own method" if e.obj.extends_backbone else ""
                print(f"  {'':<{width}} objectives: {', '.join(parts)}{more}")


def cmd_config(args: argparse.Namespace) -> None:
    import yaml


    cfg = resolve(args.method, args.dataset, args.seed, [*data_root_overrides(args), *args.overrides], args.config)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")


def _command_line() -> str:
    """The command as a user would type it (no paths of this machine), quoted for the shell so
    that it runs again as stored."""
    return shlex.join(["prvr-bench", *sys.argv[1:]])


COMMANDS = {"run": cmd_run, "bench": cmd_bench, "leaderboard": cmd_leaderboard, "list": cmd_list,
            "config": cmd_config}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False):
        progress.set_enabled(False)
    try:
        handler = getattr(args, "func", None) or COMMANDS[args.command]
        handler(args)
    except (UserError, RegistryError) as e:
        print(f"prvr-bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prvr-bench: interrupted; continue with --resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
