"""The bench's plan before it starts: every run with its expected time, the `prvr-bench run` line
of each (a SLURM array's commands), the datasets made once before the runs fan out.

A run's expected time comes from its earlier records in the results folder (jobs.expected_seconds),
else from the profile (`<out>/profile.csv`: its training rows give seconds per epoch on the
dataset they were measured on, times the run's epoch budget, an upper bound as early stopping
usually ends a run sooner), else it is unknown.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prvr.harness.base import progress
from prvr.harness.base.devices import pick_device
from prvr.harness.engine.build import load_data
from prvr.harness.base.io import UserError, read_json
from prvr.harness.cli.jobs import expected_seconds, meminfo_mb, recorded_peak_mb
from prvr.harness.engine.records import run_tag
from prvr.harness.engine.runner import stored_settings_diff
from prvr.harness.engine.sections import SimConfig, dataset_preset
from prvr.harness.base.registry import DATASETS, DETECTORS, METHODS

PROFILE_FILE = "profile.csv"
PROFILED_DATASET = re.compile(r"one epoch on ([^:]+):")


@dataclass(frozen=True)
class BenchRun:
    """One run of the bench: its resolved config, run name, record path and `prvr-bench run` arguments."""

    cfg: Any
    name: str
    record: Path
    args: tuple[str, ...]


def check_kept(runs: "list[BenchRun]", flag: str) -> None:
    """A planned run whose record exists is kept, not trained: that record must be the run planned.
    A record of the same name trained with other settings (a `--set` without a `--tag` of its
    own, e.g. `sim.train_videos=3000` planned where the plain 600-video row is stored) fails the
    plan in one line before anything trains, instead of standing in for the run in a report."""
    for run in runs:
        if run.record.exists():
            diff = stored_settings_diff(run.cfg, run.record)
            if diff:
                raise UserError(f"{run.record} is kept for the planned run {run.name} (seed {run.cfg.seed}) but was "
                                f"trained with other settings (stored / planned: {diff}); give {flag} to keep this "
                                "variant apart (e.g. --tag train_videos3000), or move that record away to train it "
                                "again")


@dataclass(frozen=True)
class Estimate:
    """A run's expected time in seconds (None: unknown) and where the figure comes from."""

    seconds: float | None
    source: str = ""


@dataclass(frozen=True)
class PlanRow:
    """One planned run as the plan table shows it; `kept`: its record exists and --skip-existing keeps it."""

    run: str
    dataset: str
    seed: int
    estimate: Estimate
    kept: bool = False
    memory_mb: float = 0.0  # expected peak host memory (its records', else the profile's); 0: unknown


def profile_costs(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    """The profile's training figures per (profiled run, dataset): `epoch_seconds`, `peak_memory`
    (MB); {} where there is no profile."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return {}
    costs: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        found = PROFILED_DATASET.match(r.get("condition") or "")
        if r.get("section") != "training" or not found:
            continue
        try:
            costs.setdefault((r["method"], found.group(1)), {})[r["quantity"]] = float(r["value"])
        except (KeyError, TypeError, ValueError):  # a malformed row only loses its figure
            continue
    return costs


def profiled_name(cfg) -> str:
    """The name the profile gives the run's model: the method, @backbone where not its own
    (the detector and the tag change little of the cost)."""
    spec = METHODS.get(cfg.method)
    return run_tag(cfg.method, spec.relations, spec.relations, cfg.backbone, spec.backbone)


def estimate(cfg, record: Path, costs: dict[tuple[str, str], dict[str, float]]) -> Estimate:
    """The run's expected time: its earlier records, else those of its untagged run (a tag moves a knob or
    an ablation setting, seldom the cost much), else the profile, else unknown."""
    kind = pick_device(cfg.train.device).type  # records of this kind of device only
    seconds = expected_seconds(record, kind)
    if math.isfinite(seconds):
        return Estimate(seconds, "earlier records")
    untagged = record.parent.name.partition("~")[0]
    if untagged != record.parent.name:
        seconds = expected_seconds(record.parent.parent / untagged / record.name, kind)
        if math.isfinite(seconds):
            planned, stored = _train_videos(cfg), _stored_train_videos(record.parent.parent / untagged)
            if planned and stored and planned != stored:  # an epoch's work grows with the training videos
                return Estimate(seconds * planned / stored,
                                f"records of {untagged} x {planned / stored:.3g}: {planned} training videos, not {stored}")
            return Estimate(seconds, f"records of {untagged}")
    epoch, where = profiled_epoch(cfg, costs)
    if epoch is None:
        return Estimate(None)
    return Estimate(epoch * cfg.train.epochs,
                    f"profile{where}: at most {cfg.train.epochs} epochs x {epoch:.0f} s, training only")


def profiled_epoch(cfg, costs: dict[tuple[str, str], dict[str, float]]) -> tuple[float | None, str]:
    """The profile's seconds for one training epoch of the run's model on its dataset, else on the
    world it is a variant of (sim-tvr-v2 of sim-tvr: the profile trains on sim-tvr) scaled by the
    training videos, with what was done said; (None, "") where the profile has neither."""
    name = profiled_name(cfg)
    epoch = costs.get((name, cfg.dataset), {}).get("epoch_seconds")
    if epoch is not None or not DATASETS.get(cfg.dataset).simulated:
        return epoch, ""
    base = dataset_preset(cfg.dataset).get("variant_of")
    if not isinstance(base, str) or (epoch := costs.get((name, base), {}).get("epoch_seconds")) is None:
        return None, ""
    profiled = (dataset_preset(base).get("sim") or {}).get("train_videos", SimConfig().train_videos)
    planned = cfg.sim.train_videos
    if planned == profiled:
        return epoch, f" on {base}, of which {cfg.dataset} is a variant"
    return (epoch * planned / profiled,
            f" on {base} x {planned / profiled:.3g} ({cfg.dataset}: {planned} training videos, not {profiled})")


def _train_videos(cfg) -> int | None:
    """A simulated world's training videos (`sim.train_videos`); None for a real dataset."""
    return cfg.sim.train_videos if DATASETS.get(cfg.dataset).simulated else None


def _stored_train_videos(folder: Path) -> int | None:
    """The training videos of the first readable record in a run's folder (None where none says)."""
    for path in sorted(folder.glob("seed*.json")):
        try:
            value = read_json(path).get("config", {}).get("sim", {}).get("train_videos")
        except (UserError, AttributeError):  # a bad record only loses its scale
            continue
        if isinstance(value, int) and value > 0:
            return value
    return None


def profiled_memory_mb(cfg, costs: dict[tuple[str, str], dict[str, float]]) -> float:
    """The run's peak memory growth in MB where the profile measured it on the run's dataset; 0 if not."""
    return costs.get((profiled_name(cfg), cfg.dataset), {}).get("peak_memory", 0.0)


def expected_memory_mb(cfg, record: Path, costs: dict[tuple[str, str], dict[str, float]]) -> float:
    """A planned run's expected peak host memory in MB: its records' peak (any seed), else the
    profile's; 0 where neither says."""
    return recorded_peak_mb(record) or profiled_memory_mb(cfg, costs)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plan_table(rows: list[PlanRow], workers: int, out: str, quick: bool = False) -> str:
    """The plan as text: one line per run (run, dataset, seed, expected time and its source), the
    total, the time at `workers` runs at once, and how to narrow the bench (`quick`: the plan of
    `bench --quick`, which needs no pointer to itself)."""
    width = max([3, *(len(r.run) for r in rows)])
    dwidth = max([7, *(len(r.dataset) for r in rows)])
    lines = [f"bench plan: {len(rows)} runs, results in {out}/", "",
             f"  {'run':<{width}}  {'dataset':<{dwidth}}  seed  expected"]
    for r in rows:
        when = "kept (record exists)" if r.kept else (
            f"{duration(r.estimate.seconds):>8}  ({r.estimate.source})" if r.estimate.seconds is not None
            else f"{'unknown':>8}")
        lines.append(f"  {r.run:<{width}}  {r.dataset:<{dwidth}}  {r.seed:>4}  {when}")
    quicker = "" if quick else (", --quick (every method on sim-tiny in a few minutes, kept out of the "
                                "leaderboard)")
    memory = memory_line(rows, workers)
    lines += ["", total_line(rows, workers), *([memory] if memory else []),
              f"Narrow it: --method NAME [NAME ...] (some methods), --seeds S [S ...] (which seeds){quicker}; "
              "--jobs auto runs several at once; --plan prints this and stops."]
    return "\n".join(lines) + "\n"


def total_line(rows: list[PlanRow], workers: int) -> str:
    todo = [r for r in rows if not r.kept]
    if not todo:
        return f"total: nothing to make ({len(rows)} runs, every record exists)"
    known = [r.estimate.seconds for r in todo if r.estimate.seconds is not None]
    unknown = len(todo) - len(known)
    if not known:
        return f"total: unknown ({len(todo)} runs to make, none with an expected time)"
    total = sum(known)
    text = f"total: {duration(total)} for {len(known)} runs" + (f", {unknown} more of unknown time" if unknown else "")
    if workers > 1:
        text += f"; {workers} at a time: about {duration(max(max(known), total / workers))}"
    return text


def memory_line(rows: list[PlanRow], workers: int, machine_mb: float | None = None) -> str:
    """Where the `workers` largest expected peaks of the runs to make exceed this machine's memory
    (MemTotal, or `machine_mb`), a line saying so: those runs will wait for one another
    (jobs.next_fitting); "" otherwise, or where either figure is unknown."""
    machine_mb = machine_mb if machine_mb is not None else meminfo_mb("MemTotal")
    peaks = sorted((r.memory_mb for r in rows if not r.kept and r.memory_mb > 0), reverse=True)[:workers]
    if workers < 2 or len(peaks) < 2 or machine_mb is None or sum(peaks) <= machine_mb:
        return ""
    shown = " + ".join(f"{p / 1024:.1f}" for p in peaks)
    return (f"memory: the {len(peaks)} largest expected peaks ({shown} GB of host memory) exceed this machine's "
            f"{machine_mb / 1024:.1f} GB, so such runs wait for one another rather than start together "
            "(docs/cluster.md, \"Host memory\")")


def commands(run_args: list[list[str]], threads: int | None) -> str:
    """One shell-quoted `prvr-bench run` line per planned run (a SLURM array takes line
    $SLURM_ARRAY_TASK_ID with `sed -n`)."""
    extra = ["--threads", str(threads)] if threads is not None else []
    return "".join(shlex.join(["prvr-bench", "run", *a, *extra]) + "\n" for a in run_args)


def prepare_data(cfgs: list[Any]) -> None:
    """Load each distinct dataset of the plan once here, so that its cache is built before the runs
    fan out (runs started together would each build it), and let each distinct detector of its
    runs cache what its setup computes (`Detector.prepare`: the SBERT detection). A dataset or a
    detection that fails here is left to its runs, whose logs name the error."""
    groups: dict[str, dict[str, Any]] = {}  # dataset -> distinct detector settings -> a config with them
    for cfg in cfgs:
        d = cfg.to_dict()
        data_key = json.dumps([cfg.dataset, d.get("data"), d.get("sim")], sort_keys=True, default=str)
        groups.setdefault(data_key, {}).setdefault(json.dumps(d.get("relations"), sort_keys=True, default=str), cfg)
    for group in groups.values():  # one dataset in memory at a time
        cfg = next(iter(group.values()))
        start = time.perf_counter()
        try:
            data = load_data(cfg)
        except UserError as e:
            progress.log(f"[yellow]data[/]: {cfg.dataset} did not load here ({e}); its runs will say why they fail")
            continue
        progress.log(f"data: {cfg.dataset} ready in {time.perf_counter() - start:.0f} s (cached for the runs)")
        for cfg in group.values():
            try:
                made = DETECTORS.get(cfg.relations.name)(cfg).prepare(data)
            except UserError as e:
                progress.log(f"[yellow]detector[/]: {cfg.relations.name} on {cfg.dataset} prepared nothing here ({e}); "
                             "its runs will compute it or say why they fail")
                continue
            if made:
                progress.log(f"detector: {made}")


def quick_summary(records: list[Path]) -> str:
    """The quick runs as text: run, seed, test SumR, epochs and seconds of each record, and what they are."""
    lines = ["quick runs (sim-tiny; a smoke test, not comparable figures, kept out of the leaderboard):"]
    for path in records:
        try:
            r = read_json(path)
            lines.append(f"  {r['run_name']:<24} seed {r['seed']}  test SumR {r['metrics']['test']['SumR']:6.1f}  "
                         f"{r.get('epochs_run', '?')} epochs  {sum(r.get('timings', {}).values()):5.1f} s")
        except (UserError, KeyError, TypeError, AttributeError):
            lines.append(f"  {path}: no readable record")
    return "\n".join(lines) + "\n"
