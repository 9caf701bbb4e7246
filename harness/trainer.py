"""Training loop shared by every method.

The optimizer and schedule are registered parts (harness/optim.py: `train.optimizer`
adamw | bertadam, `train.decay`); early stopping on validation SumR
with patience; the best checkpoint is kept and the test split is evaluated with it.
Hooks run at epoch start / end and after each step, so detectors can refresh per-epoch
state. Checkpoints are written atomically every epoch and loaded with weights_only=True;
`resume` continues a killed run and reaches the same metrics as an uninterrupted one
(data order and negative sampling depend only on (seed, epoch, step); the torch RNG state
that drives dropout is checkpointed).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from prvr.datasets.loader import Batcher, epoch_batches, make_loader
from prvr.harness import progress
from prvr.harness.evaluate import compute_ranks, metrics_from_ranks
from prvr.harness.io import atomic_path
from prvr.harness.optim import build_optimizer, lr_lambda
from prvr.harness.timing import Timings


class Hook(Protocol):
    def on_epoch_start(self, trainer: "Trainer", epoch: int) -> None: ...
    def on_step(self, trainer: "Trainer", step: int, out: dict) -> None: ...
    def on_epoch_end(self, trainer: "Trainer", epoch: int, summary: dict) -> None: ...


@dataclass
class StepContext:
    """What an objective may need besides scores and relations."""

    epoch: int
    step: int
    generator: torch.Generator
    batch: Any
    outputs: dict | None = None  # {"queries": ..., "videos": ..., "scores": ...} of the step's forward pass


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"


class Trainer:
    def __init__(self, cfg, data, model: torch.nn.Module, spec, detector, ckpt_dir: Path,
                 hooks: list | None = None, timings: Timings | None = None) -> None:
        self.cfg, self.data, self.model, self.spec, self.detector = cfg, data, model, spec, detector
        self.device = pick_device(cfg.train.device)
        self.model.to(self.device)
        self.ckpt_dir = Path(ckpt_dir)
        self.hooks = [detector, *(hooks or [])]
        self.timings = timings or Timings()
        self.batchers = {name: Batcher(split, cfg.data) for name, split in data.splits.items()}
        self.has_queries = np.array([len(q) > 0 for q in self.batchers["train"].video_queries])
        self.steps_per_epoch = math.ceil(self.has_queries.sum() / cfg.train.batch_size)
        self.optimizer, self.optimizer_spec = build_optimizer(model, cfg.train)
        total = self.steps_per_epoch * cfg.train.epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(total, cfg.train.warmup_frac, cfg.train.decay))
        self.epoch = 0
        self.best = {"SumR": -1.0, "epoch": -1, "metrics": None}
        self.bad_epochs = 0
        self.history: list[dict] = []
        self.finished = False

    # ------------------------------------------------------------------ training
    def fit(self, resume: bool = False) -> None:
        if resume and (self.ckpt_dir / "last.pt").exists():
            self.load_state(self.ckpt_dir / "last.pt")
            progress.log(f"resumed from epoch {self.epoch} ({self.ckpt_dir / 'last.pt'})")
        with progress.task(f"train {self.cfg.method}", total=self.cfg.train.epochs) as advance:
            advance(self.epoch)
            while not self.finished and self.epoch < self.cfg.train.epochs:
                summary = self.train_epoch(self.epoch)
                self.epoch += 1
                self.after_epoch(summary)
                val_sumr = summary.get("val", {}).get("SumR", float("nan"))
                advance(1, loss=summary["loss"], val_SumR=val_sumr)
                if not progress.bars_visible():
                    progress.log(f"epoch {self.epoch - 1}: loss {summary['loss']:.3f}, val SumR {val_sumr:.1f}")
                for h in self.hooks:
                    h.on_epoch_end(self, self.epoch - 1, summary)
        self.finished = True
        self.save_state(self.ckpt_dir / "last.pt")

    def train_epoch(self, epoch: int) -> dict:
        self.model.train()
        for h in self.hooks:
            h.on_epoch_start(self, epoch)
        batches = epoch_batches(len(self.has_queries), self.cfg.train.batch_size, self.cfg.seed, epoch, self.has_queries)
        loader = make_loader(batches, self.batchers["train"].train_batch, self.num_workers(),
                             pin=self.device.type == "cuda")
        sums: dict[str, float] = {}
        with self.timings("train"):
            for i, batch in enumerate(loader):
                out = self.train_step(batch.to(self.device), epoch, epoch * self.steps_per_epoch + i)
                for k, v in out.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                for h in self.hooks:
                    h.on_step(self, i, out)
        summary = {"epoch": epoch, **{k: v / max(1, len(batches)) for k, v in sums.items()},
                   "lr": self.scheduler.get_last_lr()[0]}
        report = self.detector.epoch_report()
        if report:
            summary["relations"] = report
        return summary

    def num_workers(self) -> int:
        """Worker processes for batch building: as configured, or (-1) 4 when a GPU trains
        (pinned batches then overlap with the GPU's work) and 0 on CPU, where workers would
        compete with the model for the same cores."""
        n = self.cfg.train.num_workers
        if n >= 0:
            return n
        return min(4, os.cpu_count() or 1) if self.device.type == "cuda" else 0

    def train_step(self, batch, epoch: int, step: int) -> dict[str, torch.Tensor]:
        q = self.model.encode_queries(batch.queries)
        v = self.model.encode_videos(batch.videos)
        scores = self.model.score(q, v)
        outputs = {"queries": q, "videos": v, "scores": scores}
        relations = self.detector.detect(batch, outputs)
        gen = torch.Generator(device=self.device).manual_seed(_mix(self.cfg.seed, step))
        ctx = StepContext(epoch, step, gen, batch, outputs)
        out = self.spec.objective(self.cfg.loss, scores, relations, ctx)
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        if self.cfg.train.grad_clip > 0 and not self.optimizer_spec.clips_inside:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return {k: t.detach() for k, t in out.items()}

    def after_epoch(self, summary: dict) -> None:
        if self.epoch % self.cfg.train.eval_every == 0 or self.epoch == self.cfg.train.epochs:
            with self.timings("eval_val"):
                val = self.evaluate("val")
            summary["val"] = {k: val[k] for k in ("R@1", "R@5", "R@10", "R@100", "SumR")}
            if val["SumR"] > self.best["SumR"]:
                self.best = {"SumR": val["SumR"], "epoch": self.epoch - 1, "metrics": val}
                self.bad_epochs = 0
                self.save_model(self.ckpt_dir / "best.pt")
            else:
                self.bad_epochs += 1
                if self.bad_epochs >= self.cfg.train.patience:
                    self.finished = True
                    progress.log(f"early stop after epoch {self.epoch - 1}: no val SumR gain in "
                                 f"{self.cfg.train.patience} epochs")
        self.history.append(summary)
        self.save_state(self.ckpt_dir / "last.pt")

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, split_name: str, show: bool = False) -> dict:
        """Encode every video once, score all queries in chunks, rank by counting."""
        self.model.eval()
        split, batcher = self.data[split_name], self.batchers[split_name]
        videos = index_videos(self.model, encode_all(self.model.encode_videos, batcher.videos, split.num_videos, 128,
                                                     self.device))
        queries = encode_all(self.model.encode_queries, batcher.queries, split.num_queries, 512, self.device)

        def score(start: int, end: int) -> torch.Tensor:
            return self.model.score({k: t[start:end] for k, t in queries.items()}, videos)["fused"]

        with progress.task(f"eval {split_name}" if show else None, total=split.num_queries) as advance:
            ranks = compute_ranks(score, split.num_queries, split.labels(), split.relevance,
                                  chunk=self.cfg.eval.chunk, progress=advance)
        self.model.train()
        return metrics_from_ranks(ranks, split.moment_fraction(), split.relevance)

    # --------------------------------------------------------------- checkpoints
    def save_model(self, path: Path) -> None:
        with atomic_path(path) as tmp:
            torch.save({"model": self.model.state_dict()}, tmp)

    def load_model(self, path: Path) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])

    def save_state(self, path: Path) -> None:
        state = {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "bad_epochs": self.bad_epochs,
            "finished": self.finished, "best_sumr": self.best["SumR"], "best_epoch": self.best["epoch"],
            "best_metrics": _jsonable(self.best["metrics"]), "history": _jsonable(self.history),
            "torch_rng": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        with atomic_path(path) as tmp:
            torch.save(state, tmp)

    def load_state(self, path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.bad_epochs, self.finished = state["epoch"], state["bad_epochs"], state["finished"]
        self.best = {"SumR": state["best_sumr"], "epoch": state["best_epoch"], "metrics": state["best_metrics"]}
        self.history = state["history"]
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])


def encode_all(encode, make_batch, n: int, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Encode items in batches and concatenate, padding sequence dims (dim 1) to the longest."""
    parts = [encode(make_batch(np.arange(s, min(s + batch_size, n))).to(device)) for s in range(0, n, batch_size)]
    return {k: cat_padded([p[k] for p in parts]) for k in parts[0]}


def index_videos(model: torch.nn.Module, videos: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone's query-independent work on a collection of encoded videos, done once
    before its queries are scored (e.g. unit vectors of the items); identity for a backbone
    without `index_videos`."""
    fn = getattr(model, "index_videos", None)
    return fn(videos) if fn is not None else videos


def cat_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    if tensors[0].dim() < 2:
        return torch.cat(tensors)
    longest = max(t.shape[1] for t in tensors)
    out = tensors[0].new_zeros((sum(len(t) for t in tensors), longest, *tensors[0].shape[2:]))
    start = 0
    for t in tensors:
        out[start : start + len(t), : t.shape[1]] = t
        start += len(t)
    return out


def _mix(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919 + 12345) % (2**63 - 1)


def _jsonable(obj: Any) -> Any:
    """Plain containers only (checkpoint loading uses weights_only=True)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.generic,)):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj
