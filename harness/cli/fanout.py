"""How `bench` and `ablate` fan their planned runs out: --jobs processes on this machine, or Ray tasks."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from prvr.harness.base import progress
from prvr.harness.base.io import UserError
from prvr.harness.base.devices import pick_device
from prvr.harness.cli.args import finish_by_seconds
from prvr.harness.cli.executors import check_ready, run_on_ray
from prvr.harness.cli.jobs import Job, Launch, expected_seconds, parse_jobs, run_device, run_jobs, threads_per_job, \
    visible_gpus, wants_cuda
from prvr.harness.cli.plan import PROFILE_FILE, expected_memory_mb, prepare_data, profile_costs
from prvr.harness.engine.records import log_path, record_path


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
    finish_by = finish_by_seconds(getattr(args, "finish_by", None))
    if finish_by is not None and args.executor == "ray":
        raise UserError("--finish-by leaves runs unstarted on this machine's processes; Ray schedules its tasks "
                        "itself: leave --finish-by out with --executor ray")
    gpus = visible_gpus() if any(wants_cuda(c.train.device) for c in cfgs) else []
    jobs = "auto" if args.jobs is None and args.executor == "ray" else args.jobs
    workers = parse_jobs(jobs, len(gpus), args.runs_per_gpu)
    deadline = None if finish_by is None else getattr(args, "started", time.monotonic()) + finish_by
    return workers, Launch(args.executor, tuple(gpus), args.runs_per_gpu, args.address, deadline)


def run_in_processes(out, todo: list[tuple], workers: int, threads: int | None, command: str,
                     launch: "Launch | None" = None) -> int:
    """Planned runs (config, run name, `prvr-bench run` arguments), `workers` at a time, each in its own
    process with its output in OUT/logs/ (bench --jobs, ablate --jobs), or as Ray tasks; the
    datasets are loaded here first, so each one's cache is built once. Returns how many runs
    --finish-by left unstarted (`Launch.deadline`, jobs.run_jobs)."""
    launch = launch or Launch()
    threads = (threads or 1) if launch.address else threads_per_job(workers, threads)
    costs = profile_costs(Path(out) / PROFILE_FILE)
    jobs = []
    for cfg, name, run_args in todo:
        path, log = record_path(out, cfg.dataset, name, cfg.seed), log_path(out, cfg.dataset, name, cfg.seed)
        expected = expected_seconds(path, pick_device(cfg.train.device).type)  # records of the device it trains on
        jobs.append(Job([*run_args, "--threads", str(threads)], f"{name} on {cfg.dataset}, seed {cfg.seed}", path,
                        log, expected, device=run_device(cfg.train.device), threads=threads,
                        memory_mb=expected_memory_mb(cfg, path, costs)))
    if not jobs:
        return 0
    prepare_data([cfg for cfg, _, _ in todo])
    each = f"{threads} torch thread{'s' if threads > 1 else ''} each"
    if launch.executor == "ray":
        progress.log(f"{len(jobs)} run{'s' if len(jobs) > 1 else ''} as Ray tasks, {each}")
        run_on_ray(jobs, launch, workers, command)
        return 0
    gpus = list(launch.gpus) if any(j.cuda for j in jobs) else []
    progress.log(f"{len(jobs)} runs, {min(workers, len(jobs))} at a time, {each}"
                 + (f", round-robin over GPU {', '.join(gpus)}" if gpus else ""))
    return run_jobs(jobs, workers, command, gpus, launch.deadline)
