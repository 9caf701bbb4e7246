"""One training run, from a resolved config to a stored run record."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, cast

import torch

from prvr.harness.base import progress
from prvr.harness.engine.build import build_run
from prvr.harness.engine.checkpoints import RESUME_FREE_KEYS, flatten
from prvr.harness.engine.config import from_dict
from prvr.harness.base.io import UserError, claim
from prvr.harness.base.names import check_name, check_tag
from prvr.harness.engine.rankings import TOP_K, RankingSink, rank_split, rankings_path, save_rankings
from prvr.harness.engine.record_types import (MOMENT_METRIC_PREFIXES, SPLIT_METRIC_KEYS, DataFacts, RunMetrics, RunRecord,
                                       RunResources, SplitMetrics)
from prvr.harness.engine.records import (checkpoint_dir, load_record_at, provenance, provenance_time, record_path,
                                  run_protocol, run_tag, write_record)
from prvr.harness.base.registry import METHODS, method_detector
from prvr.harness.engine.robustness import curve_line, noise_curve
from prvr.harness.engine.sections import Config
from prvr.harness.base.timing import Timings
from prvr.harness.base.allocator import keep_freed_memory
from prvr.harness.base.devices import device_name, lifetime_peak_kb, peak_memory_mb, pick_device, reset_peak_rss, status_kb


def run_name(cfg: Config, tag: str = "") -> str:
    """The run's folder name (checked: harness/base/names.py)."""
    spec = METHODS.get(cfg.method)
    name = run_tag(cfg.method, cfg.relations.name, method_detector(spec, cfg.backbone), cfg.backbone, spec.backbone,
                   check_tag(tag))
    return check_name(name, "run name", "use a shorter --tag")


def settings_diff(cfg: Config, record: RunRecord, shown: int = 3, source: str = "stored config") -> str:
    """The config keys on which a stored record differs from the planned `cfg`, as
    "key stored / asked" items ("" when they agree). The record's config is rebuilt the way
    resume does (keys added since it was made take their defaults); keys that change no
    trained number (`RESUME_FREE_KEYS`: locations, chunking, the noise-robustness test) are
    left out."""
    asked, stored = flatten(cfg.to_dict()), flatten(from_dict(record["config"], source).to_dict())
    keys = sorted(k for k in asked.keys() | stored.keys()
                  if asked.get(k) != stored.get(k) and k not in RESUME_FREE_KEYS)
    items = [f"{k} {stored.get(k)!r} / {asked.get(k)!r}" for k in keys[:shown]]
    return ", ".join(items) + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def stored_settings_diff(cfg: Config, path: Path) -> str:
    """`settings_diff` of the record stored at `path` (its place in a results folder) against `cfg`."""
    return settings_diff(cfg, load_record_at(path), source=f"run record {path} key 'config'")


def run_one(cfg: Config, out: str | Path, resume: bool = False, tag: str = "", hooks: list | None = None,
            command: str = "", force_resume: bool = False) -> RunRecord:
    """`train_and_record`, with the run claimed for this process (one writer per run and seed:
    a second is refused in one line naming the first)."""
    name = run_name(cfg, tag)
    with claim(record_path(out, cfg.dataset, name, cfg.seed), f"run {name} on {cfg.dataset}, seed {cfg.seed}"):
        return train_and_record(cfg, out, resume, tag, hooks, command, force_resume)


def _say_what_it_replaces(cfg: Config, path: Path) -> None:
    """A run writes its record over the one of its name: said, with the settings that differ, where
    that record was trained with others (a `--set` without a `--tag` of its own)."""
    if not path.exists():
        return
    try:
        diff = stored_settings_diff(cfg, path)
    except UserError as e:
        diff = f"unreadable: {e}"
    if diff:
        progress.warn(f"{path} holds a run trained with other settings (stored / now: {diff}); this run replaces "
                      "it when it ends (give --tag to keep both)")


def train_and_record(cfg: Config, out: str | Path, resume: bool = False, tag: str = "", hooks: list | None = None,
                     command: str = "", force_resume: bool = False) -> RunRecord:
    """Train, early-stop on val SumR, test the best checkpoint, write the record; return it.

    `force_resume` resumes even from a checkpoint trained with other settings (the record's
    `resumes` lists them). A record whose loss became non-finite (train.on_nonfinite=continue)
    carries `nonfinite: {epoch, step}`, and the leaderboard leaves it out of its means."""
    timings = Timings()
    name = run_name(cfg, tag)
    path = record_path(out, cfg.dataset, name, cfg.seed)
    ckpt_dir = checkpoint_dir(out, cfg.dataset, name, cfg.seed)
    if not (resume or force_resume):  # resuming compares the settings with the checkpoint's itself
        _say_what_it_replaces(cfg, path)
    rss_reset = start_peak_windows()
    if pick_device(cfg.train.device).type == "cpu":
        keep_freed_memory()  # the same figures, fewer page faults (harness/base/allocator.py)
    run = build_run(cfg, timings=timings)
    data, detector = run.data, run.detector
    trainer = run.trainer(ckpt_dir, hooks)
    progress.log(f"[bold]{name}[/] on {cfg.dataset}, seed {cfg.seed}: {run.parameters / 1e6:.2f}M "
                 f"parameters, {trainer.device}")
    # the code that trains is the code checked out now: a checkout changed while the run goes on
    # (another commit, edited files) must not be what its record names
    started = provenance(device_name(trainer.device))
    if run.started_from is not None:  # the file the model started from, by digest: the record names what it read
        started["init_weights"] = run.started_from
    trainer.fit(resume=resume or force_resume, force_resume=force_resume)
    trainer.load_model(ckpt_dir / "best.pt")
    test_ranking = RankingSink(data["test"])  # the stored test rankings, from the scores the test figures rank
    with timings("eval_test"):
        test = trainer.evaluate("test", show=True, sink=test_ranking)
    noise = None
    if cfg.eval.noise_levels:  # robustness to an inserted segment (harness/engine/robustness.py), the same checkpoint
        with timings("eval_noise"):
            noise = noise_curve(trainer.model, data["test"], cfg.data, trainer.device, cfg.eval.chunk,
                                cfg.eval.noise_levels, cfg.eval.noise_source, plain=test, show=True)
        progress.log(f"test SumR with inserted noise ({cfg.eval.noise_source}): {curve_line(noise)}")
    if trainer.best_val_ranks is not None:  # the best checkpoint's ranks, as its val evaluation ranked them
        val_ranking = trainer.best_val_ranks.ranking()
    else:  # a resumed run's best epoch was evaluated by an earlier process: ranked again
        with timings("eval_rankings"):
            val_ranking = rank_split(trainer.model, data["val"], trainer.batchers["val"], trainer.device,
                                     cfg.eval.chunk)
    ranked = {"val": val_ranking, "test": test_ranking.ranking()}
    val = trainer.best["metrics"]
    assert val is not None  # fit evaluates val at its last epoch at least
    metrics: RunMetrics = {"val": _keep(val), "test": _keep(test)}
    if noise is not None:
        metrics["noise"] = noise
    record: RunRecord = {
        "method": cfg.method, "dataset": cfg.dataset, "seed": cfg.seed, "backbone": cfg.backbone,
        "relations": cfg.relations.name, "run_name": name, "tag": tag, "command": command,
        "config": cfg.to_dict(),
        "provenance": {**started, "created": provenance_time(), "data": _data_facts(data)},
        "protocol": run_protocol(cfg.to_dict(), cfg.dataset, data.meta.get("selection"),
                                 localizes=trainer.localizes),
        "timings": timings.as_dict(),
        "resources": run_resources(timings.seconds.get("train"), trainer.epochs_done, trainer.device, rss_reset),
        "best_epoch": trainer.best["epoch"], "epochs_run": trainer.epoch,
        "metrics": metrics,
        "history": trainer.history,
    }
    if trainer.nonfinite is not None:
        record["nonfinite"] = trainer.nonfinite
    if trainer.degenerate is not None:
        record["degenerate"] = trainer.degenerate
    elif test.get("degenerate_scores"):  # the tested checkpoint's scores tell no video apart
        record["degenerate"] = {"scores": test["degenerate_scores"]}
        progress.warn(f"the test scores of the best checkpoint: {test['degenerate_scores']}; the "
                      "record is marked degenerate and the leaderboard leaves it out of its means")
    if trainer.resumes:
        record["resumes"] = trainer.resumes
    # Detector figures and tables (e.g. ARL's similarity / uncertainty distributions) go
    # next to the record, named after it: seed<S>.<what>.png
    record["artifacts"] = detector.write_artifacts(path.parent, path.stem) or []
    rank_file = save_rankings(rankings_path(path), ranked, {"run": name, "dataset": cfg.dataset, "seed": cfg.seed})
    record["rankings"] = {"file": rank_file.name, "top_k": TOP_K, "splits": list(ranked)}
    write_record(path, record)
    mark = "" if trainer.nonfinite is None else (f"; marked: loss not finite from epoch {trainer.nonfinite['epoch']}, "
                                                 f"step {trainer.nonfinite['step']}")
    progress.log(f"wrote {path}: test SumR {test['SumR']:.1f} (val {val['SumR']:.1f}, best epoch "
                 f"{trainer.best['epoch']}{mark})")
    return record


def start_peak_windows() -> bool:
    """Start the run's peaks: the process's peak resident set (VmHWM, where the kernel lets it be reset;
    True then) and, where CUDA is already in use in this process (an earlier run of a bench), the
    allocator's peaks of every GPU. A process that makes several runs thus gives each its own peaks."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    return reset_peak_rss()


def run_resources(train_s: float | None, epochs: int, device: torch.device, rss_reset: bool) -> RunResources:
    """The record's `resources`: the run's peak resident set (VmHWM since `start_peak_windows` reset it;
    where it could not be reset, the process's lifetime peak, VmHWM or ru_maxrss, said so in
    `peak_rss_measure`), the CUDA allocator's peaks where the run trained on CUDA, and the seconds of
    training (`timings.train`: the batches, not validation) per epoch this process trained."""
    peak_kb = status_kb("VmHWM")
    if peak_kb is not None:
        measure = "VmHWM since the run started" if rss_reset else "VmHWM of the process (its whole life)"
    else:  # no /proc: the kernel's lifetime peak of the process
        peak_kb = lifetime_peak_kb()
        measure = "ru_maxrss of the process (its whole life)"
    allocated = peak_memory_mb(device)
    reserved = torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else None
    return {"peak_rss_mb": round(peak_kb / 1024, 1), "peak_rss_measure": measure,
            "device_peak_mb": None if allocated is None else round(allocated, 1),
            "device_reserved_mb": None if reserved is None else round(reserved, 1),
            "seconds_per_epoch": round(train_s / epochs, 3) if train_s is not None and epochs > 0 else None,
            "epochs_timed": epochs}


def _keep(metrics: Mapping[str, Any]) -> SplitMetrics:
    """A split's block of the record: of the evaluator's figures, the retrieval ones
    (SPLIT_METRIC_KEYS), then the moment ones (harness/engine/vcmr.py: VCMR-0.5 R@1, SVMR-0.7 R@5, VCMR
    SumR, ...); scratch such as `degenerate_scores` is left out."""
    kept = {k: metrics[k] for k in SPLIT_METRIC_KEYS if k in metrics}
    # the cast: every key kept is one SplitMetrics declares, by name or by its moment prefix
    return cast(SplitMetrics, {**kept, **{k: v for k, v in metrics.items() if k.startswith(MOMENT_METRIC_PREFIXES)}})


def _data_facts(data: Any) -> DataFacts:
    facts: DataFacts = {"name": data.name}
    for key in ("generator_version", "test", "train", "selection", "relevance"):
        if key in data.meta:
            facts[key] = data.meta[key]
    return facts
