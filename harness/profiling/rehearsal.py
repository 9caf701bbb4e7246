"""`prvr-bench rehearse`: a real-scale rehearsal, TVR's sizes read as a user's TVR is read.

The simulated TVR world at `data.scale=full` (17,435 / 2,179 / 2,179 videos, TVR's query
counts, 3072-d frame rows and 768-d token rows) is generated, exported to the MS-SL layout
and loaded back through the real `tvr` loaders; then, per method, a fresh process builds the
run on that data exactly as `prvr-bench run` does and trains the first N batches of epoch 0
(the epoch's time is the batches' time per batch x the batches of an epoch: extrapolated,
and the table says so), evaluates the val split once (10,895 queries x 2,179 videos) and,
for ARL, times the detector's per-epoch pass over the training split; for the SBERT methods
(xml-pr, xml-sl-pr) the build holds the detection of the training split's potentially relevant
pairs, made once per dataset and cached, and its time is given apart.

Every phase runs in a fresh Python process; its peak resident size is the kernel's VmHWM
of that process (the dataset, the model and the work together). VmHWM also counts the pages
of the memory-mapped feature files the process has read, which the kernel drops and reads
again when RAM runs short; the peak anonymous size (RssAnon: the arrays, the model, the work,
what cannot be given back) is sampled every 50 ms (`ANON_EVERY_S`) by a thread of the phase's process
and is the floor that must fit in RAM. Disk sizes are the files' sizes under the rehearsal's
own work folder (its own dataset cache).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from prvr.datasets.real.export import export
from prvr.harness.base import progress
from prvr.harness.engine.build import build_run
from prvr.harness.engine.config import resolve
from prvr.harness.base.devices import peak_memory_mb, reset_peak_memory, reset_peak_rss, status_kb
from prvr.harness.base.io import UserError, atomic_path, ensure_dir, read_json, write_json
from prvr.harness.profiling.subjects import default_names, subjects
from prvr.harness.profiling.training import StepClock, StopAfter, _sync, cpu_model, describe_device, timed_epoch
from prvr.harness.engine.records import provenance
from prvr.harness.base.registry import DATASETS, marked_method
from prvr.harness.reports.table import code, csv_text, markdown_table

SECTION = "## Real scale: TVR-sized rehearsal"


@dataclass
class Phase:
    """One measured phase: what ran, its wall seconds, the process's peak resident MB, and
    figures of its own (sizes, batches, evaluation seconds, ...)."""

    name: str
    seconds: float = float("nan")
    peak_rss_mb: float = float("nan")
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    revision: str = ""  # the code that ran it (git, short): rows kept by --only-methods may be older
    peak_anon_mb: float | None = None  # sampled RssAnon peak (None: measured before it)
    cpu: str = ""  # the machine's CPU model: rows kept by --only-methods may come from another machine
    scale: str = ""  # the sim-tvr scale rehearsed: one table holds one scale


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rehearse", help="real-scale rehearsal: TVR-sized world -> MS-SL layout -> real loaders -> "
                                        "one epoch (extrapolated), val evaluation and memory per method")
    p.add_argument("--method", nargs="+", default=None, metavar="NAME",
                   help=f"methods, or METHOD@BACKBONE (default: every registered method, and each that extends its backbone's method on the others)")
    p.add_argument("--scale", default="full", help="the sim-tvr scale to rehearse (default full: TVR's sizes)")
    p.add_argument("--work", default=None, metavar="DIR",
                   help="where the world's cache, the export and its cache go (default: a temporary folder, "
                        "removed after; give one to keep them)")
    p.add_argument("--train-batches", type=int, default=3, metavar="N",
                   help="training batches timed per method (default 3; the epoch is extrapolated from them)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per phase (default 1)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda ... (the training and evaluation phases)")
    p.add_argument("--skip-eval", action="store_true", help="no val evaluation per method")
    p.add_argument("--only-methods", action="store_true",
                   help="re-run the named method phases and keep the other rows of OUT/rehearsal.json (each row "
                        "names the code and CPU that measured it); on the export already in --work, or, where "
                        "--work holds none (another machine), the world, export and load phases run first and "
                        "replace their rows")
    p.add_argument("--out", default="results", help="writes OUT/rehearsal.{md,csv} (default: results)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every method (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_rehearse)


def cmd_rehearse(args: argparse.Namespace) -> None:
    if args.train_batches < 1:
        raise UserError(f"--train-batches must be at least 1, got {args.train_batches}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    # every argument a phase reads is checked before the first phase starts (a bad --scale or device
    # replaced a committed table with a failed one): the sim-tvr world resolved at the scale asked for
    resolve(marked_method("reference"), "sim-tvr", 0,
            [f"data.scale={args.scale}", f"train.device={args.device}", *args.overrides])
    ensure_dir(args.out)
    start = time.perf_counter()
    keep = args.work is not None
    work = Path(args.work) if keep else Path(tempfile.mkdtemp(prefix="prvr-rehearsal-"))

    def written(phases: list[Phase]) -> tuple[Path, Path]:  # after every phase: a stopped rehearsal keeps its rows
        return write_rehearsal(Path(args.out), phases, _header(args, time.perf_counter() - start))

    try:
        phases = rehearse(work, args, written)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    md, csv_path = written(phases)
    profile = Path(args.out) / "profile.md"
    if profile.exists():  # the profile's real-scale section is this rehearsal
        with atomic_path(profile) as tmp:
            Path(tmp).write_text(with_rehearsal(profile.read_text(encoding="utf-8"), Path(args.out)), encoding="utf-8")
    progress.log(f"rehearse: wrote {md} and {csv_path}")
    failed = [f"{p.name}: {p.error}" for p in phases if p.error]
    if failed:
        raise UserError(f"the rehearsal was written, but {len(failed)} phase(s) failed: " + "; ".join(failed))


def rehearse(work: Path, args: argparse.Namespace, written: Callable[[list[Phase]], Any]) -> list[Phase]:
    """Every phase in order, `written(phases so far)` after each; a failed phase is recorded and
    the rest go on where they can."""
    base = {"work": str(work), "scale": args.scale, "threads": args.threads, "overrides": args.overrides,
            "device": args.device}
    methods = args.method or default_names()
    jobs = [{**base, "phase": "method", "method": m, "batches": args.train_batches, "eval": not args.skip_eval}
            for m in methods]
    kept = [p for p in previous_phases(Path(args.out)) if p.name.removeprefix("method ") not in methods] \
        if args.only_methods else []
    other = sorted({p.scale for p in kept if p.scale != args.scale})
    if other:
        raise UserError(f"{Path(args.out) / 'rehearsal.json'} holds rows at scale {', '.join(other)}, this run is at "
                        f"scale {args.scale}: one table holds one scale; pass --scale {other[0]} or another --out")
    if not (args.only_methods and (work / "data").is_dir()):  # the export to load is made first
        kept = [p for p in kept if p.name.startswith("method ")]  # its new rows replace the kept ones
        jobs = [{**base, "phase": "world"}, {**base, "phase": "export"}, {**base, "phase": "load", "first": True},
                {**base, "phase": "load", "first": False}, *jobs]
    head = [p for p in kept if not p.name.startswith("method ")]  # the table: data rows, then method rows
    tail = [p for p in kept if p.name.startswith("method ")]
    for job in jobs:
        phase = run_phase(job)
        (tail if job["phase"] == "method" else head).append(phase)
        written(head + tail)
        if job["phase"] == "export" and phase.error:
            break  # nothing to load
    return head + tail


def run_phase(job: dict[str, Any]) -> Phase:
    label = job["phase"] + (f" {job['method']}" if "method" in job else "")
    progress.log(f"rehearse: {label}")
    cmd = [sys.executable, "-m", "prvr.harness.profiling.rehearsal", json.dumps(job)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        progress.log(f"  failed: {last}")
        return Phase(label, error=last)
    phase = Phase(**json.loads(done.stdout.strip().splitlines()[-1]))
    progress.log(f"  {phase.seconds:.0f} s, peak {phase.peak_rss_mb:,.0f} MB, {phase.figures}")
    return phase


# ------------------------------------------------------------------ the child process
def _child(job: dict[str, Any]) -> Phase:
    progress.set_enabled(False)
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    ANON.start()
    work = Path(job["work"])
    os.environ["PRVR_CACHE"] = str(work / "cache")
    start = time.perf_counter()
    figures = PHASES[job["phase"]](job, work)
    name = job["phase"] + (f" {job['method']}" if "method" in job else "")
    if job["phase"] == "load":
        name += " (first)" if job["first"] else " (cached)"
    windows = [figures.get(f"{w}_peak_mb", 0) for w in WINDOWS]
    anon = [figures.get(f"{w}_anon_mb", 0) for w in WINDOWS]

    prov = provenance("")
    revision = str(prov["git_revision"])[:8] + ("+dirty" if prov["git_dirty"] else "")
    return Phase(name, time.perf_counter() - start, max(_peak_rss_mb(), *windows), figures, revision=revision,
                 peak_anon_mb=max(ANON.peak_mb(), *anon), cpu=cpu_model(), scale=job["scale"])


def _world(job: dict[str, Any], work: Path) -> dict[str, Any]:
    cached = (work / "cache" / "sim").is_dir() and any((work / "cache" / "sim").iterdir())
    data = _load("sim-tvr", job, work)
    # generated here, or loaded from the cache of an earlier rehearsal in the same --work folder
    return {"world": "loaded from the cache" if cached else "generated", **_sizes(data),
            "cache_mb": _mb(work / "cache")}


def _export(job: dict[str, Any], work: Path) -> dict[str, Any]:
    data = _load("sim-tvr", job, work)
    loaded = time.perf_counter()
    export(data, "tvr", work / "data", "msl", force=True)
    return {"export_s": round(time.perf_counter() - loaded, 1), "export_mb": _mb(work / "data")}


def _real_load(job: dict[str, Any], work: Path) -> dict[str, Any]:
    before = _mb(work / "cache")
    data = _load("tvr", job, work)
    return {**_sizes(data), "cache_added_mb": round(_mb(work / "cache") - before, 1)}


def _method(job: dict[str, Any], work: Path) -> dict[str, Any]:
    (subject,) = subjects([job["method"]], "tvr", _overrides("tvr", job, work))
    cfg = subject.cfg
    t0 = time.perf_counter()
    run = build_run(cfg)
    clock = StepClock()  # before StopAfter, which ends the epoch at its last step
    trainer = run.trainer(work / "ckpt" / job["method"], [clock, StopAfter(job["batches"])])
    built = time.perf_counter() - t0
    rss_before, build_peak, build_anon = _rss_mb(), _peak_rss_mb(), ANON.peak_mb()
    # once per run, before its first epoch: the training split's features processed (what fits
    # in RAM is kept: datasets/loader.py) and the loader's workers started
    device = trainer.device
    resettable = _reset_peak(device)
    start = time.perf_counter()
    trainer.epoch_loader()
    prepare_s, prepare_peak, prepare_anon = time.perf_counter() - start, _peak_rss_mb(), ANON.peak_mb()
    kept = trainer.batchers["train"].kept
    _reset_peak(device)
    timed_epoch(trainer)
    per_batch = clock.steady_s()
    out = {"build_s": round(built, 1), "build_peak_mb": build_peak, "build_anon_mb": build_anon,
           "rss_after_build_mb": round(rss_before),
           "prepare_s": round(prepare_s, 1), "prepare_peak_mb": prepare_peak,
           "train_kept": "+".join(k for k in ("clips", "tokens", "frames") if getattr(kept, k, None) is not None)
           or "none",
           "prepare_anon_mb": prepare_anon, "train_peak_mb": _peak_rss_mb(), "train_anon_mb": ANON.peak_mb(),
           **{f"train_{k}": v for k, v in _gpu_peak_mb(device).items()},
           "batches": job["batches"], "first_batch_s": round(clock.first_s(), 2),
           "epoch_batches": trainer.steps_per_epoch, "s_per_batch": round(per_batch, 2),
           "epoch_s_extrapolated": round(per_batch * trainer.steps_per_epoch), "device": describe_device(device)}
    if not resettable:
        out["resident_peak"] = "since the process started (the kernel refused its reset)"
    out.update(_detection_figures(trainer.detector.epoch_report()))
    # the detector's per-epoch work once its warm-up is over (ARL: the pass over the training
    # split); at epoch 0 it may not run yet, so it is timed at a late epoch and added to the epoch
    start = time.perf_counter()
    trainer.detector.on_epoch_start(trainer.detector_state(LATE_EPOCH))
    _sync(trainer.device)
    out["detector_pass_s"] = round(time.perf_counter() - start, 1)
    out["epoch_s_extrapolated"] = round(per_batch * trainer.steps_per_epoch + out["detector_pass_s"])
    if job.get("eval"):
        _reset_peak(device)
        start = time.perf_counter()
        val = trainer.evaluate("val")
        _sync(device)
        out.update(eval_val_s=round(time.perf_counter() - start, 1), eval_peak_mb=_peak_rss_mb(),
                   eval_anon_mb=ANON.peak_mb(), **{f"eval_{k}": v for k, v in _gpu_peak_mb(device).items()},
                   val_queries=int(val["n"]), val_videos=run.data["val"].num_videos)
    return out


def _detection_figures(report: dict[str, Any]) -> dict[str, Any]:
    """What a detector computed once per dataset at build (its report's `detection` facts, the
    SBERT detector's; the build window holds its time and memory): computed in how many seconds
    or found in the rehearsal's cache (a later method with the same detection), its elements and
    pairs, and on simulated data the pairs' precision and recall against the truth."""
    facts, split = report.get("detection"), report.get("split") or {}
    if not isinstance(facts, dict):
        return {}
    out: dict[str, Any] = {"detection": "cached" if facts.get("cached") else "computed"}
    if not facts.get("cached"):
        out["detection_s"] = facts.get("seconds")
    out.update({f"detection_{k}": facts[k] for k in ("phi", "theta", "parser", "queries", "elements") if k in facts})
    out.update({f"detection_{k}": round(v, 4) if isinstance(v, float) else v for k, v in split.items()
                if k in ("pairs", "per_query", "precision", "recall")})
    return out


WINDOWS = ("build", "prepare", "train", "eval")  # a method phase's peak windows (`_reset_peak` between)
LATE_EPOCH = 10**6  # past any detector's warm-up
PHASES = {"world": _world, "export": _export, "load": _real_load, "method": _method}


def _overrides(dataset: str, job: dict[str, Any], work: Path) -> list[str]:
    scale = [f"data.scale={job['scale']}"] if dataset == "sim-tvr" else [f"data.data_root={work / 'data'}"]
    device = [f"train.device={job['device']}"] if job.get("device", "auto") != "auto" else []
    return [*scale, *device, *job.get("overrides", [])]


def _load(dataset: str, job: dict[str, Any], work: Path):
    return DATASETS.get(dataset).load(resolve(marked_method("reference"), dataset, 0, _overrides(dataset, job, work)))


def _sizes(data) -> dict[str, Any]:
    return {f"{name}_videos_queries": f"{s.num_videos} / {s.num_queries}" for name, s in data.splits.items()}


def _mb(folder: Path) -> float:
    if not folder.exists():
        return 0.0
    return round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20, 1)


def _peak_rss_mb() -> float:
    return round((status_kb("VmHWM") or 0) / 1024)


def _reset_peak(device: torch.device | None = None) -> bool:
    """Start a new peak window: resident (Linux: VmHWM reset through /proc/self/clear_refs),
    anonymous, and the device's allocator peak on CUDA. False where the kernel refuses the
    resident reset (some sandboxed kernels, e.g. gVisor): the resident peak is then the
    process's own since it started, which the phase's figures say (`resident_peak`)."""
    ANON.reset()
    if device is not None:
        reset_peak_memory(device)
    return reset_peak_rss()


def _gpu_peak_mb(device: torch.device) -> dict[str, float]:
    """{'gpu_mb': the allocator's peak since the last reset} on CUDA, {} elsewhere."""
    mb = peak_memory_mb(device)
    return {} if mb is None else {"gpu_mb": round(mb)}


ANON_EVERY_S = 0.05


class AnonPeak:
    """The peak of this process's anonymous resident memory (RssAnon), sampled every
    `ANON_EVERY_S` by a daemon thread from `start()`: a peak between two samples can be missed,
    so the figure is a lower bound of the true peak by at most what 50 ms can allocate."""

    def __init__(self) -> None:
        self._kb = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._sample, name="anon-peak", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while True:
            self.observe()
            time.sleep(ANON_EVERY_S)

    def observe(self) -> None:
        with self._lock:  # read inside: a sample taken before a reset never lands after it
            self._kb = max(self._kb, status_kb("RssAnon") or 0)

    def reset(self) -> None:
        with self._lock:
            self._kb = 0
        self.observe()

    def peak_mb(self) -> float:
        self.observe()  # the moment of reading counts too
        with self._lock:
            return round(self._kb / 1024)


ANON = AnonPeak()


def _rss_mb() -> float:
    return round((status_kb("VmRSS") or 0) / 1024)


# ------------------------------------------------------------------------ the report
def with_rehearsal(profile_md: str, out: Path) -> str:
    """profile.md's text with its real-scale section (the last one) replaced by OUT/rehearsal.md,
    or left without one where no rehearsal was written there."""
    head = profile_md.split(SECTION)[0].rstrip("\n") + "\n"
    rehearsal = out / "rehearsal.md"
    if not rehearsal.exists():
        return head
    return head + "\n" + rehearsal.read_text(encoding="utf-8")


CSV_FIELDS = ["phase", "seconds", "peak_rss_mb", "figure", "value"]


def previous_phases(out: Path) -> list[Phase]:
    """The phases of the rehearsal written in `out` before (rehearsal.json), each checked; none
    where `out` holds none (a new folder for the method rows alone, e.g. one setting against
    another on the same export)."""
    path = out / "rehearsal.json"
    if not path.exists():
        return []
    rows = read_json(path, "rehearsal file")
    # rows written before phases named their code and CPU: those in the header of the table they made
    header = (out / "rehearsal.md").read_text(encoding="utf-8") if (out / "rehearsal.md").exists() else ""
    git, cpu = re.search(r"\(git ([0-9a-f]{7,12})", header), re.search(r"; CPU (.+?), \d+ torch thread", header)
    scale = re.search(r"`prvr-bench rehearse[^`]* --scale (\S+)", header)  # a command without it: full
    older = {"revision": git.group(1)[:8] if git else "", "cpu": cpu.group(1) if cpu else "",
             "scale": scale.group(1).strip("'") if scale else "full"}
    try:
        return [Phase(**{**older, **r, "figures": dict(r["figures"])}) for r in rows]
    except (TypeError, KeyError, ValueError):
        raise UserError(f"rehearsal file {path} does not hold rehearsal phases; run the whole rehearsal "
                        "again (without --only-methods)") from None


def write_rehearsal(out: Path, phases: list[Phase], header: str) -> tuple[Path, Path]:
    write_json(out / "rehearsal.json", [asdict(p) for p in phases])
    md, csv_path = out / "rehearsal.md", out / "rehearsal.csv"
    with atomic_path(md) as tmp:
        Path(tmp).write_text(render(phases, header), encoding="utf-8")
    rows = []
    for p in phases:
        rows.append([p.name, f"{p.seconds:.1f}", f"{p.peak_rss_mb:.0f}", "error" if p.error else "", p.error])
        rows += [[p.name, "", "", k, "" if v is None else str(v)] for k, v in p.figures.items()]
    with atomic_path(csv_path) as tmp:
        Path(tmp).write_text(csv_text(CSV_FIELDS, rows), encoding="utf-8", newline="")
    return md, csv_path


def render(phases: list[Phase], header: str) -> str:
    table = []
    for p in phases:
        figures = p.error and f"failed: {p.error}" or ", ".join(f"{k} {v}" for k, v in p.figures.items())
        table.append([p.name, p.revision, p.cpu, f"{p.seconds:,.1f}", f"{p.peak_rss_mb:,.0f}",
                      _thousands(p.peak_anon_mb), figures])
    lines = [SECTION, "", header, "", markdown_table(["phase", "code", "CPU", "seconds", "peak resident (MB)",
                                                      "peak anonymous (MB)", "figures"], table)]
    methods = [p for p in phases if p.name.startswith("method ") and not p.error]
    if methods:
        lines += ["", "Per method (one fresh process each): a detection made once per dataset while the run is "
                  "built (the SBERT methods' potentially relevant pairs of the training split, kept in the dataset "
                  "cache: 'cached' where an earlier method of the rehearsal made the same one), the run's one-time "
                  "preparation (the training split's features processed, what fits in RAM kept), then the first "
                  "training batches timed and the epoch extrapolated from them (s / batch x batches of an epoch + "
                  "the detector's per-epoch pass; s / batch leaves out the first batch, which holds the one-time "
                  "warm-ups, where three or more were timed), then one val evaluation (its first: the val batches "
                  "are made then and reused by later epochs). Peak resident counts the mapped feature files' pages "
                  "the kernel can drop; peak anonymous (sampled every 50 ms; blank where measured before it) is what "
                  "must stay in RAM:", ""]
        per_method = []
        for p in methods:
            f = p.figures
            gpu = " / ".join(_thousands(f.get(k)) for k in ("train_gpu_mb", "eval_gpu_mb")) if "train_gpu_mb" in f \
                else ""
            per_method.append([p.name.removeprefix("method "), _device_cell(p), _detection_cell(f),
                               f"{f['prepare_s']}, {f['train_kept']}", f"{f['batches']} of {f['epoch_batches']}",
                               str(f.get("first_batch_s", "")), str(f["s_per_batch"]), f"{f['epoch_s_extrapolated']:,}",
                               str(f.get("detector_pass_s", "")), str(f.get("eval_val_s", "")), _per_window(f, "peak"),
                               _per_window(f, "anon") if "train_anon_mb" in f else "", gpu])
        lines.append(markdown_table(METHOD_HEADER, per_method))
    return "\n".join(lines) + "\n"


METHOD_HEADER = ("method", "device", "detection, once per dataset (s)", "prepare (s), kept", "timed batches",
                 "first batch (s)", "s / batch", "epoch (s, extrapolated)", "detector's per-epoch pass (s)",
                 "val eval (s)", "peak resident (MB): build / prepare / train / eval",
                 "peak anonymous (MB): build / prepare / train / eval", "peak GPU (MB): train / eval")


def _device_cell(p: Phase) -> str:
    """Where a method ran, a CPU named by its model (rows measured before the device figure
    carried it get the phase's CPU)."""
    device = str(p.figures.get("device", ""))
    return f"{device}, {p.cpu}" if device.startswith("cpu") and p.cpu and p.cpu not in device else device


def _detection_cell(f: dict[str, Any]) -> str:
    """The one-time detection's seconds, 'cached' where an earlier method of the rehearsal made
    it, blank for a method without one."""
    if "detection" not in f:
        return ""
    return "cached" if f["detection"] == "cached" else str(f.get("detection_s", ""))


def _per_window(f: dict[str, Any], kind: str) -> str:
    """A method's peak MB of `kind` (peak: VmHWM, anon: RssAnon) per window, blank where not measured."""
    return " / ".join(_thousands(f.get(f"{w}_{kind}_mb")) for w in WINDOWS)


def _thousands(value: Any) -> str:
    return "" if value is None else f"{value:,.0f}"


def _header(args: argparse.Namespace, wall_s: float) -> str:
    prov = provenance("")
    kept = " Rows kept from earlier runs name the code and the CPU that measured them." if args.only_methods else ""
    return (f"Written by {code(_command(args), in_table=False)} on {prov['created']} (git "
            f"{str(prov['git_revision'])[:12]}{', dirty' if prov['git_dirty'] else ''}); CPU {cpu_model()}, "
            f"{args.threads} torch thread(s) per phase, device {args.device}. Whole rehearsal: {wall_s:,.0f} s.{kept} "
            "Protocol: harness/profiling/rehearsal.py (module docstring) and docs/profiling.md.")


def _command(args: argparse.Namespace) -> str:
    """The command as given, folders shown as DIR / OUT (no path of the machine in the table)."""
    parts = ["prvr-bench rehearse"]
    if args.method:
        parts.append("--method " + " ".join(shlex.quote(m) for m in args.method))
    parts += [f"--scale {shlex.quote(args.scale)}"] if args.scale != "full" else []
    parts += ["--work DIR"] if args.work is not None else []
    parts += [f"--train-batches {args.train_batches}", "--out OUT"]
    parts += [f"--threads {args.threads}"] if args.threads != 1 else []
    parts += [f"--device {shlex.quote(args.device)}"] if args.device != "auto" else []
    parts += [f"--set {shlex.quote(o)}" for o in args.overrides]
    parts += [flag for flag, on in (("--only-methods", args.only_methods), ("--skip-eval", args.skip_eval)) if on]
    return " ".join(parts)


if __name__ == "__main__":
    print(json.dumps(asdict(_child(json.loads(sys.argv[1])))))
