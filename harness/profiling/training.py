"""Training throughput and peak memory of one epoch.

Protocol: the method's config for the dataset, the model, detector and trainer built as
`prvr-bench run` builds them (seed 0), then one call of Trainer.train_epoch(0): data
batching, forward, detector, objective, backward, optimizer step and the detector's
per-epoch work. Throughput = training queries in the epoch / wall seconds of the call.
With a batch cap (`--train-batches N`) the epoch ends after its first N batches and the
figures are those of the batches run. Per batch: the first batch's seconds (the loader's
start, first kernel launches, compiling under `train.compile`) and the median seconds of the
batches after it (the host running ahead of the device as in a run), so a setting's
steady pace reads apart from its start.
Peak memory, on a GPU: torch.cuda.max_memory_allocated during the epoch (peak reset just
before; it includes the parameters and batches already on the GPU). On a CPU: growth of the
process's peak resident set size during the epoch over its resident size just before
(Linux: VmHWM after resetting it through /proc/self/clear_refs; elsewhere sampled every
10 ms), i.e. activations, gradients, optimizer state and batches, not the dataset or model
already in memory. Each epoch runs in a fresh Python process, so that memory freed by an
earlier model is not reused unseen and no method's run warms up the next.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Iterator

import torch

from prvr.harness.base import progress
from prvr.harness.profiling.subjects import Subject, subjects
from prvr.harness.engine.build import build_run
from prvr.harness.engine.records import cpu_facts
from prvr.harness.base.devices import device_name, peak_memory_mb, reset_peak_memory, reset_peak_rss, status_kb


def cpu_model() -> str:
    """This machine's CPU model (the one run records store in `provenance.cpu`)."""
    return cpu_facts().get("model") or platform.processor()


def describe_device(device: torch.device) -> str:
    """The trainer's device name, with the CPU model on a CPU."""
    name, model = device_name(device), cpu_model() if device.type == "cpu" else ""
    return f"{name}, {model}" if model else name


@dataclass
class EpochProfile:
    dataset: str
    queries: int  # training queries in the batches run
    batches: int  # batches run
    epoch_batches: int  # batches in the whole epoch
    seconds: float
    peak_mb: float
    memory_measure: str
    device: str
    first_batch_s: float = float("nan")  # the first batch: the loader's start, first launches, compiling
    later_batch_s: float = float("nan")  # the median batch after the first (nan with fewer than 2 batches)

    @property
    def queries_per_s(self) -> float:
        return self.queries / self.seconds if self.seconds > 0 else float("nan")


def profile_epoch_isolated(method: str, dataset: str, overrides: list[str] | None = None,
                           threads: int | None = None, max_batches: int | None = None,
                           timeout_s: float = 3600) -> EpochProfile:
    """`profile_epoch` of one method in a fresh Python process (see the module docstring)."""
    job = {"method": method, "dataset": dataset, "overrides": list(overrides or []), "threads": threads,
           "max_batches": max_batches}
    cmd = [sys.executable, "-m", "prvr.harness.profiling.training", json.dumps(job)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the training epoch of {method} took longer than {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the training epoch of {method} failed: {last}")
    return EpochProfile(**json.loads(done.stdout.strip().splitlines()[-1]))


def _child(job: dict) -> None:
    """Entry point of the fresh process: one epoch, its EpochProfile as JSON on stdout."""
    progress.set_enabled(False)
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    subject = subjects([job["method"]], job["dataset"], job["overrides"])[0]
    print(json.dumps(asdict(profile_epoch(subject, job.get("max_batches")))))


class _Enough(Exception):
    """Raised by StopAfter to end an epoch early."""


class StopAfter:
    """Trainer hook that ends the epoch after `n` optimisation steps."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_epoch_start(self, trainer, epoch: int) -> None:
        pass

    def on_step(self, trainer, step: int, out: dict) -> None:
        if step + 1 >= self.n:
            raise _Enough

    def on_epoch_end(self, trainer, epoch: int, summary: dict) -> None:
        pass


class StepClock:
    """Trainer hook: the wall time at the end of each optimisation step, from the epoch's start
    (the detector's epoch-start work excluded). On CUDA it waits for the device at each step
    (`sync`), so each end holds that step's queued work; the timed window pays that wait too.
    Without `sync` the host runs ahead as in a run, and a step's end is when the host was done
    with it: in a steady epoch the host waits for the device in later steps, so the median step
    is still the device's pace where the device is the slower."""

    def __init__(self, sync: bool = True) -> None:
        self.sync = sync
        self.start = 0.0
        self.ends: list[float] = []

    def on_epoch_start(self, trainer, epoch: int) -> None:
        self.start, self.ends = time.perf_counter(), []

    def on_step(self, trainer, step: int, out: dict) -> None:
        if self.sync:
            _sync(trainer.device)
        self.ends.append(time.perf_counter())

    def on_epoch_end(self, trainer, epoch: int, summary: dict) -> None:
        pass

    def first_s(self) -> float:
        """Seconds of the first batch: the loader's start and one-time warm-ups (CUDA's context,
        its kernels' first launches, cuBLAS's handles) fall in it."""
        return self.ends[0] - self.start

    def steady_s(self) -> float:
        """Seconds per batch after the first where three or more were timed, else over all of them
        (two batches cannot tell the first's warm-up from the step)."""
        n = len(self.ends)
        if n >= 3:
            return (self.ends[-1] - self.ends[0]) / (n - 1)
        return (self.ends[-1] - self.start) / n

    def later_median_s(self) -> float:
        """The median seconds of a batch after the first (nan with fewer than 2): one slow later
        batch (a recompile for a new shape under `train.compile`) does not move it."""
        steps = [b - a for a, b in zip(self.ends, self.ends[1:])]
        return statistics.median(steps) if steps else float("nan")


def profile_epoch(subject: Subject, max_batches: int | None = None) -> EpochProfile:
    """Train one epoch of `subject` (or its first `max_batches` batches) on its config's dataset."""
    cfg = subject.cfg
    clock = StepClock(sync=False)  # before StopAfter, which ends the epoch in its own on_step
    hooks = [clock, StopAfter(max_batches)] if max_batches else [clock]
    with tempfile.TemporaryDirectory(prefix="prvr-profile-") as ckpt:
        trainer = build_run(cfg).trainer(ckpt, hooks)
        every = trainer.epoch_batches(0)
        batches = every[:max_batches] if max_batches else every
        per_video = trainer.batchers["train"].video_queries
        queries = sum(len(b) if cfg.train.sample == "queries" else sum(len(per_video[v]) for v in b) for b in batches)
        with peak_memory(trainer.device) as peak:
            seconds = timed_epoch(trainer)
    return EpochProfile(cfg.dataset, queries, len(batches), len(every), seconds, peak["mb"], peak["measure"],
                        device_name(trainer.device), clock.first_s() if clock.ends else float("nan"),
                        clock.later_median_s())


def timed_epoch(trainer) -> float:
    """Wall seconds of `trainer.train_epoch(0)` (ended after its first N batches where a
    `StopAfter(N)` hook is set), the device's queued work included."""
    start = time.perf_counter()
    try:
        trainer.train_epoch(0)
    except _Enough:
        pass
    _sync(trainer.device)
    return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def peak_memory(device: torch.device) -> Iterator[dict]:
    """Yields a dict that holds {'mb', 'measure'} once the block has run (see the module docstring)."""
    out: dict = {"mb": float("nan"), "measure": ""}
    if device.type == "cuda":
        reset_peak_memory(device)
        yield out
        out.update(mb=peak_memory_mb(device), measure="torch.cuda.max_memory_allocated")
        return
    with _rss_peak_growth() as growth:
        yield out
    out.update(growth)


@contextmanager
def _rss_peak_growth() -> Iterator[dict]:
    out: dict = {}
    before = status_kb("VmRSS")
    if before is not None and reset_peak_rss():
        yield out
        out.update(mb=max(0, (status_kb("VmHWM") or before) - before) / 1024, measure="peak RSS growth (VmHWM)")
        return
    sampler = _RssSampler()
    sampler.start()
    try:
        yield out
    finally:
        sampler.stop()
    out.update(mb=sampler.growth_mb(), measure="peak RSS growth (sampled every 10 ms)")


class _RssSampler(threading.Thread):
    """Fallback where VmHWM cannot be reset: polls the resident size."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.before = _rss_bytes()
        self.peak = self.before
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.01):
            self.peak = max(self.peak, _rss_bytes())

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, _rss_bytes())

    def growth_mb(self) -> float:
        return max(0, self.peak - self.before) / 2**20


def _rss_bytes() -> int:
    kb = status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import resource  # no /proc: the lifetime peak is the best available

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
