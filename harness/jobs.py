"""`bench --jobs N`, `ablate --jobs N`: the planned runs as N concurrent `prvr-bench run` processes.

On a CPU machine, training runs of this size use their cores better side by side (one
torch thread each) than one after another with every core on one run: a thread's matrix
products lose speed as threads are added, and the element-wise work between them barely
parallelises. Each run is its own process, so a run does exactly what `prvr-bench run`
does alone (same seed and thread count: the same metrics), writes its own record
atomically, and its output goes to a log file; this process only schedules and reports.

Scheduling: longest expected run first (the run's earlier records in the same results
folder give its expected time; a run never made before goes first, as it may be long),
which keeps the slowest run from starting last.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from prvr.harness import progress
from prvr.harness.io import UserError, ensure_dir, read_json

POLL_S = 0.5


@dataclass
class Job:
    """One planned `prvr-bench run`: its arguments, the record it writes and where its output goes."""

    args: list[str]  # arguments after `prvr-bench run`
    label: str  # e.g. "gmmformer on sim-tvr, seed 0"
    record: Path
    log: Path
    expected_s: float = float("inf")
    started: float = field(default=0.0, repr=False)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_jobs(value: str) -> int:
    """--jobs: a positive number, or `auto` (one per usable core; 1 when CUDA trains, since the
    runs would share one GPU)."""
    if value == "auto":
        import torch

        return 1 if torch.cuda.is_available() else usable_cores()
    try:
        n = int(value)
    except ValueError:
        raise UserError(f"--jobs expects a number of concurrent runs or 'auto', got {value!r}") from None
    if n < 1:
        raise UserError(f"--jobs must be at least 1, got {n}")
    return n


def threads_per_job(jobs: int, threads: int | None) -> int:
    """torch threads of each run: as given, else the usable cores shared out (at least 1)."""
    return threads if threads is not None else max(1, usable_cores() // jobs)


def expected_seconds(record: Path) -> float:
    """Mean total time (all phases) of the run's records already in its folder, any seed;
    infinity when there are none or none can be read."""
    times = []
    for path in sorted(record.parent.glob("seed*.json")):
        try:
            timings = read_json(path).get("timings", {})
            if timings:
                times.append(sum(float(t) for t in timings.values()))
        except (UserError, AttributeError, TypeError, ValueError):  # a bad record only loses its estimate
            continue
    return sum(times) / len(times) if times else float("inf")


def schedule(jobs: list[Job]) -> list[Job]:
    """Longest expected first; equal expectations keep the plan's order."""
    return sorted(jobs, key=lambda j: -j.expected_s)


def run_jobs(jobs: list[Job], workers: int, command: str) -> None:
    """Run every job, `workers` at a time; raise UserError naming each failed run and its log
    (`command`: the prvr-bench command that planned them, for the progress lines)."""
    pending, running, failed = schedule(jobs), [], []
    start = time.perf_counter()
    with progress.task(f"{command} ({workers} jobs)", total=len(jobs)) as advance:
        try:
            while pending or running:
                while pending and len(running) < workers:
                    running.append(_start(pending.pop(0)))
                time.sleep(POLL_S)
                for proc, job in [r for r in running if r[0].poll() is not None]:
                    running.remove((proc, job))
                    if proc.returncode != 0:
                        failed.append(job)
                    _report(job, proc.returncode)
                    advance(1)
        except KeyboardInterrupt:
            for proc, _ in running:
                proc.terminate()
            for proc, _ in running:
                proc.wait()
            raise
    progress.log(f"{command}: {len(jobs)} runs in {time.perf_counter() - start:.0f} s, {workers} at a time")
    if failed:
        lines = "; ".join(f"{j.label}: {_last_line(j.log)} (log: {j.log})" for j in failed)
        raise UserError(f"{len(failed)} of {len(jobs)} runs failed: {lines}")


def _start(job: Job) -> tuple[subprocess.Popen, Job]:
    ensure_dir(job.log.parent)
    progress.log(f"start {job.label} (log: {job.log})")
    job.started = time.perf_counter()
    with open(job.log, "w", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, "-m", "prvr.harness.cli", "run", *job.args],
                                stdout=log, stderr=subprocess.STDOUT)
    return proc, job


def _report(job: Job, code: int) -> None:
    took = time.perf_counter() - job.started
    if code != 0:
        progress.log(f"[red]failed[/] {job.label} after {took:.0f} s (exit {code}): {_last_line(job.log)}")
        return
    try:
        sumr = f"test SumR {read_json(job.record)['metrics']['test']['SumR']:.1f}"
    except (UserError, KeyError, TypeError):
        sumr = "no readable record"
    progress.log(f"done {job.label} in {took:.0f} s: {sumr}")


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"
