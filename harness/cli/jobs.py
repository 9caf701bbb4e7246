"""`bench --jobs N`, `ablate --jobs N`: the planned runs as N concurrent `prvr-bench run` processes.

On a CPU machine, training runs of this size use their cores better side by side (one
torch thread each) than one after another with every core on one run: a thread's matrix
products lose speed as threads are added, and the element-wise work between them barely
parallelises. Each run is its own process, so a run does exactly what `prvr-bench run`
does alone (same seed and thread count: the same metrics), writes its own record
atomically, and its output goes to a log file; this process only schedules and reports.

On a machine with GPUs each process that trains on CUDA sees one GPU (`CUDA_VISIBLE_DEVICES`),
handed round-robin: a run goes to the GPU with the fewest runs on it. A process that trains on
the CPU sees none (`CUDA_VISIBLE_DEVICES` empty, on Ray too), so nothing in it can start CUDA on
a GPU that other runs use (torch.compile does, docs/gpu.md). `--jobs auto` starts
GPUs x `--runs-per-gpu` runs at once (at most one per core), and one per core without a GPU.
The GPUs are counted, never initialised, in this process (docs/cluster.md).

Scheduling: longest expected run first (the run's earlier records in the same results
folder give its expected time; a run never made before goes first, as it may be long),
which keeps the slowest run from starting last.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prvr.harness.base import progress
from prvr.harness.base.devices import DEVICE_ENV, status_kb
from prvr.harness.base.io import UserError, check_target, ensure_dir, read_json
from prvr.harness.base.names import split_run_name

POLL_S = 0.5
# a run ended by one of these was stopped on purpose: the fan-out stops with it (SIGKILL, the
# out-of-memory killer's signal too, fails that run alone)
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
CUDA_ENV = "CUDA_VISIBLE_DEVICES"
EXECUTORS = ("local", "ray")


@dataclass
class Job:
    """One planned `prvr-bench run`: its arguments, the record it writes and where its output goes;
    `device` where it trains (`run_device`: cuda, cpu, or an indexed cuda:N), `threads` and `memory_mb`
    (0: unknown) what it needs."""

    args: list[str]  # arguments after `prvr-bench run`
    label: str  # e.g. "gmmformer on sim-tvr, seed 0"
    record: Path
    log: Path
    expected_s: float = float("inf")
    started: float = field(default=0.0, repr=False)
    device: str = ""
    threads: int = 1
    memory_mb: float = 0.0

    @property
    def cuda(self) -> bool:
        """It trains on CUDA where there is one, on a GPU it is handed."""
        return self.device == "cuda"

    @property
    def cpu(self) -> bool:
        """It trains on the CPU wherever it runs."""
        return self.device == "cpu"


@dataclass(frozen=True)
class Launch:
    """How planned runs start: `local` processes (`gpus` handed round-robin, `runs_per_gpu` at once
    for --jobs auto) or `ray` tasks (on a local Ray, or the cluster at `address`)."""

    executor: str = "local"
    gpus: tuple[str, ...] = ()
    runs_per_gpu: int = 1
    address: str | None = None
    deadline: float | None = None  # --finish-by: time.monotonic() past which no run may be expected to end

    def in_processes(self, workers: int) -> bool:
        """Whether the runs go in processes of their own (the fan-out) rather than one after another in the
        command's: several at once, on Ray, or under a deadline (a run the fan-out can leave unstarted)."""
        return workers > 1 or self.executor == "ray" or self.deadline is not None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def visible_gpus(count: int | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs runs may be given, as `CUDA_VISIBLE_DEVICES` entries: this process's own list where
    it is set (so a list from a scheduler is respected), else 0 .. count-1. `count` defaults to
    torch.cuda.device_count(), which counts devices without creating a CUDA context here."""
    env = os.environ if env is None else env
    if count is None:
        import torch

        count = torch.cuda.device_count()
    if count < 1:
        return []
    listed = env.get(CUDA_ENV)
    if listed is None:
        return [str(i) for i in range(count)]
    return [d.strip() for d in listed.split(",") if d.strip()][:count]


def run_device(device: str, env: Mapping[str, str] | None = None) -> str:
    """The device a run with this train.device trains on where a GPU is present: `auto` is
    $PRVR_DEVICE when set, else `cuda`; any other name as it is."""
    env = os.environ if env is None else env
    return (env.get(DEVICE_ENV) or "cuda") if device == "auto" else device


def wants_cuda(device: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether a run with this train.device trains on CUDA where a GPU is visible: `cuda`, or
    `auto` unless $PRVR_DEVICE names another device. An indexed `cuda:N` keeps the GPUs it was
    given (handing it one GPU would leave no device N)."""
    return run_device(device, env) == "cuda"


def gpu_env(job: Job, gpu: str | None) -> dict[str, str]:
    """What the environment of a job's process is changed to: the one GPU it is given, or no GPU at
    all where it trains on the CPU; nothing otherwise."""
    if gpu is not None:
        return {CUDA_ENV: gpu}
    return {CUDA_ENV: ""} if job.cpu else {}


def parse_jobs(value: str | None, gpus: int = 0, runs_per_gpu: int = 1) -> int:
    """--jobs: a positive number, or `auto`: with `gpus` GPUs, gpus x runs_per_gpu (at most one per
    usable core); without, one per usable core. None (not given) is 1."""
    if runs_per_gpu < 1:
        raise UserError(f"--runs-per-gpu must be at least 1, got {runs_per_gpu}")
    if value is None:
        return 1
    if value == "auto":
        return min(gpus * runs_per_gpu, usable_cores()) if gpus else usable_cores()
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


def expected_seconds(record: Path, kind: str | None = None) -> float:
    """Mean total time (all phases) of the run's records already in its folder, any seed, of those
    trained on the kind of device `kind` names ("cpu", "cuda"; None: any; a record that names no
    device counts for any): a GPU's minute is no estimate of a CPU's hour. Infinity when there are
    none or none can be read."""
    times = []
    for path in sorted(record.parent.glob("seed*.json")):
        try:
            found = read_json(path)
            timings = found.get("timings", {})
            trained_on = str(found.get("provenance", {}).get("device") or "")
            if kind is not None and trained_on and re.split(r"[:\s]", trained_on, maxsplit=1)[0] != kind:
                continue
            if timings:
                times.append(sum(float(t) for t in timings.values()))
        except (UserError, AttributeError, TypeError, ValueError):  # a bad record only loses its estimate
            continue
    return sum(times) / len(times) if times else float("inf")


def recorded_peak_mb(record: Path) -> float:
    """The largest peak host memory (`resources.peak_rss_mb`) of the run's records already in its
    folder, any seed; 0 where none says (a bad record only loses its figure)."""
    peaks = [0.0]
    for path in sorted(record.parent.glob("seed*.json")):
        try:
            peak = (read_json(path).get("resources") or {}).get("peak_rss_mb")
        except (UserError, AttributeError):
            continue
        if isinstance(peak, (int, float)) and peak > 0:
            peaks.append(float(peak))
    return max(peaks)


def meminfo_mb(key: str) -> float | None:
    """A figure of this machine's /proc/meminfo in MB (MemAvailable, MemTotal); None where there is none."""
    try:
        text = Path("/proc/meminfo").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else None


def available_mb() -> float | None:
    """This machine's MemAvailable in MB (None where it does not say)."""
    return meminfo_mb("MemAvailable")


def headroom_mb(running: Sequence[tuple[subprocess.Popen, Job, str | None]]) -> float | None:
    """The host memory a new run can take: what is available now less what the running runs are
    still expected to grow by (each one's expected peak, `Job.memory_mb`, less its resident memory
    now). None where the machine does not say what is available."""
    free = available_mb()
    if free is None:
        return None
    for proc, job, _ in running:
        if job.memory_mb:
            free -= max(0.0, job.memory_mb - (status_kb("VmRSS", proc.pid) or 0) / 1024)
    return free


def next_fitting(pending: list[Job], running: Sequence[tuple[subprocess.Popen, Job, str | None]]
                 ) -> tuple[Job | None, float | None]:
    """The first pending job whose expected peak memory fits beside the running runs (any job when
    none runs, or where neither its peak nor the machine's memory is known), and the headroom."""
    if not running:
        return (pending[0] if pending else None), None
    room = headroom_mb(running)
    for job in pending:
        if room is None or not job.memory_mb or job.memory_mb <= room:
            return job, room
    return None, room


def schedule(jobs: list[Job]) -> list[Job]:
    """Longest expected first; equal expectations keep the plan's order."""
    return sorted(jobs, key=lambda j: -j.expected_s)


class GpuRoundRobin:
    """Hands each starting run the GPU with the fewest runs on it (the first such GPU on ties), so
    runs go round-robin over the GPUs and a GPU freed by a finished run is the next one given."""

    def __init__(self, gpus: Sequence[str]) -> None:
        self.load = {gpu: 0 for gpu in gpus}

    def take(self) -> str | None:
        """A GPU for a run that trains on CUDA; None without GPUs."""
        if not self.load:
            return None
        gpu = min(self.load, key=self.load.__getitem__)
        self.load[gpu] += 1
        return gpu

    def give(self, gpu: str | None) -> None:
        if gpu is not None:
            self.load[gpu] -= 1


def run_command(args: Sequence[str]) -> list[str]:
    """The process that trains one planned run: `prvr-bench run ARGS` with this Python."""
    return [sys.executable, "-m", "prvr.harness.cli", "run", *args]


def run_jobs(jobs: list[Job], workers: int, command: str, gpus: Sequence[str] = (),
             deadline: float | None = None) -> int:
    """Run every job, `workers` at a time, a job that trains on CUDA on one of `gpus`; raise UserError
    naming each failed run and its log (`command`: the prvr-bench command that planned them, for the
    progress lines). Returns how many jobs were left unstarted (`deadline`, below).

    With a `deadline` (`time.monotonic()`, from --finish-by) a run starts only where its expected time
    (`Job.expected_s`, or what the runs made here say of it: `SeenTimes`) ends by then, and a run with
    none only before then; the others are left, said in one line, for the same command again.

    A run starts only where its expected peak host memory (`Job.memory_mb`) fits beside the running
    runs' (`next_fitting`); otherwise it waits, said once, until one ends (a run alone always starts).

    A run stopped from outside (SIGTERM, SIGINT or SIGHUP: `kill`, a scheduler, a closed terminal)
    stops them all: the runs still training are ended, none is started, and the error says so; the
    same command again resumes (made runs are kept). A run killed by SIGKILL (the kernel's
    out-of-memory killer among others) fails alone, as any other failed run. SIGTERM to this process
    ends its runs as Ctrl-C does, so none trains on unwatched."""
    pending = schedule(jobs)
    running: list[tuple[subprocess.Popen, Job, str | None]] = []  # (process, its job, its GPU)
    failed: list[Job] = []
    waiting: Job | None = None  # the job last said to wait for memory
    devices = GpuRoundRobin(gpus)
    start = time.perf_counter()
    left: list[Job] = []
    seen, recorded = SeenTimes(), {id(j): j.expected_s for j in jobs}  # what its records expect of each run
    with progress.task(f"{command} ({workers} jobs)", total=len(jobs)) as advance, _sigterm_interrupts():
        try:
            while pending or running:
                if deadline is not None:
                    for j in pending:
                        j.expected_s = seen.expect(j, recorded[id(j)])
                    fits = [ends_by(j, deadline) for j in pending]
                    left += [j for j, ok in zip(pending, fits) if not ok]
                    pending = [j for j, ok in zip(pending, fits) if ok]
                while pending and len(running) < workers:
                    job, room = next_fitting(pending, running)
                    if job is None:
                        waiting = _say_waiting(pending[0], room, len(running), waiting)
                        break
                    pending.remove(job)
                    gpu = devices.take() if job.cuda else None
                    running.append((_start(job, gpu), job, gpu))
                time.sleep(POLL_S)
                for proc, job, gpu in [r for r in running if r[0].poll() is not None]:
                    running.remove((proc, job, gpu))
                    devices.give(gpu)
                    took = time.perf_counter() - job.started
                    report(job, proc.returncode, took)
                    advance(1)
                    if proc.returncode == 0:
                        seen.add(job, took)
                    if -proc.returncode in STOP_SIGNALS:
                        _end(running)
                        raise UserError(stopped_line(job, -proc.returncode, len(running), len(pending), command))
                    if proc.returncode != 0:
                        failed.append(job)
        except KeyboardInterrupt:
            _end(running)
            raise
    made = len(jobs) - len(left)
    progress.log(f"{command}: {made} runs in {time.perf_counter() - start:.0f} s, {workers} at a time")
    if left:
        progress.warn(left_line(left, command))
    raise_failures(failed, made)
    return len(left)


class SeenTimes:
    """The wall times of the runs this fan-out has made, by run (its folder: the same run at another
    seed) and by recipe (the run's name before its first `~` tag on the same dataset: a world's or a
    treatment's tag), each on its kind of device. A run with no earlier record of its own
    (`expected_seconds`: infinity) is expected to take the mean of its own run's made seeds, else of
    its recipe's made runs: under --finish-by it then starts only where that ends in time, where
    before it started at any moment before the deadline (a lent GPU's sweep started runs it could not
    finish that way, each a card's minute lost)."""

    def __init__(self) -> None:
        self.times: dict[tuple, list[float]] = defaultdict(list)

    @staticmethod
    def keys(job: Job) -> tuple[tuple, tuple]:
        run = job.record.parent
        method, detector, backbone, _ = split_run_name(run.name)
        return (job.device, run), (job.device, run.parent, method, detector, backbone)

    def add(self, job: Job, seconds: float) -> None:
        for key in self.keys(job):
            self.times[key].append(seconds)

    def expect(self, job: Job, recorded: float) -> float:
        """`recorded` (what the run's own records expect) where finite, else the mean seen time of its
        run, else of its recipe, else infinity: asked again as runs end, so a run's own seeds replace
        its recipe's figure once one is made."""
        if not math.isinf(recorded):
            return recorded
        for key in self.keys(job):
            if self.times[key]:
                return sum(self.times[key]) / len(self.times[key])
        return recorded


def ends_by(job: Job, deadline: float) -> bool:
    """Whether `job`, started now, is expected to end by `deadline` (a run with no expected time: whether
    now is before it)."""
    now = time.monotonic()
    return now < deadline if math.isinf(job.expected_s) else now + job.expected_s <= deadline


def left_line(left: list[Job], command: str) -> str:
    """The one line of the runs --finish-by left unstarted."""
    named = ", ".join(j.label for j in left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return (f"{command}: {len(left)} run{'s' if len(left) != 1 else ''} not started, each expected to end past "
            f"--finish-by ({named}); the same command again starts them (runs with a record are kept)")


def _say_waiting(job: Job, room: float | None, running: int, said: Job | None) -> Job:
    """One progress line, once per job, for a run held back for memory; returns the job said."""
    if job is not said:
        progress.log(f"{job.label} waits: it needs about {job.memory_mb / 1024:.1f} GB of host memory at its peak, "
                     f"{max(0.0, room or 0.0) / 1024:.1f} GB are free beside the {running} running; it starts when "
                     "one ends")
    return job


def stopped_line(job: Job, signum: int, ended: int, not_started: int, command: str) -> str:
    """The one line of a fan-out stopped because one of its runs was ended by `signum` (one of STOP_SIGNALS)."""
    return (f"{job.label} was ended by {signal.Signals(signum).name} (log: {job.log}), so {command} stopped: {ended} other "
            f"run{'s' if ended != 1 else ''} ended, {not_started} not started; run the same command again "
            "to resume (runs with a record are kept)")


def _end(running: list[tuple[subprocess.Popen, Job, str | None]]) -> None:
    for proc, _, _ in running:
        proc.terminate()
    for proc, _, _ in running:
        proc.wait()


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here while runs are scheduled (main thread only, where Python
    delivers signals), so that the runs this process started are ended with it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _start(job: Job, gpu: str | None) -> subprocess.Popen:
    ensure_dir(job.log.parent)
    check_target(job.log)  # a log is a file: never a FIFO or a device left in its place
    progress.log(f"start {job.label}{'' if gpu is None else f' on GPU {gpu}'} (log: {job.log})")
    job.started = time.perf_counter()
    env = {**os.environ, **gpu_env(job, gpu)}
    with open(job.log, "w", encoding="utf-8") as log:
        return subprocess.Popen(run_command(job.args), stdout=log, stderr=subprocess.STDOUT, env=env)


def report(job: Job, code: int, took: float) -> None:
    """One progress line for a finished run: its test SumR, or why it failed."""
    if code != 0:
        killed = "" if code != -signal.SIGKILL else (
            ", SIGKILL: the out-of-memory killer's signal among others" + (
                f"; it was expected to need about {job.memory_mb / 1024:.1f} GB" if job.memory_mb else ""))
        progress.log(f"[red]failed[/] {job.label} after {took:.0f} s (exit {code}{killed}): {_last_line(job.log)}")
        return
    try:
        sumr = f"test SumR {read_json(job.record)['metrics']['test']['SumR']:.1f}"
    except (UserError, KeyError, TypeError):
        sumr = "no readable record"
    progress.log(f"done {job.label} in {took:.0f} s: {sumr}")


def raise_failures(failed: list[Job], total: int) -> None:
    """One error line naming each failed run, its last output line and its log."""
    if failed:
        lines = "; ".join(f"{j.label}: {_last_line(j.log)} (log: {j.log})" for j in failed)
        raise UserError(f"{len(failed)} of {total} runs failed: {lines}")


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"
