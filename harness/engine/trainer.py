"""Training loop shared by every method.

The optimizer and schedule are registered parts (harness/engine/optim.py: `train.optimizer`
adamw | bertadam, `train.decay`); early stopping on a validation figure with patience (VR
SumR, or VCMR SumR for a backbone that localizes: `train.select_on`); the best checkpoint is kept
and the test split is evaluated with it.
Hooks run at epoch start / end and after each step: the detector's see a `DetectorState`
(epoch, model, training split; harness/base/contract.py), the harness's own hooks (profiling,
tests) the trainer. Checkpoints are written atomically every epoch and loaded with weights_only=True;
`resume` continues a killed run and reaches the same metrics as an uninterrupted one
(data order and negative sampling depend only on (seed, epoch, step); the torch RNG state
that drives dropout is checkpointed).

Bad states end in one line (`UserError`) rather than a traceback or a silent number:
- a loss that is not finite stops the run, naming the epoch and step (`train.on_nonfinite:
  stop`), or training goes on and the record is marked (`continue`);
- a checkpoint that is missing, empty, truncated, of another kind or of another model;
- `--resume` with settings that differ from the checkpoint's in a key that changes the
  numbers (all but `RESUME_FREE_KEYS`), or from a checkpoint that stores no settings,
  unless `--force-resume`, and then the record lists the changed keys;
- a run that fails before completing an epoch removes the checkpoint files it wrote.
Checkpoint writing and reading and the resume checks live in harness/engine/checkpoints.py.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any, Protocol, TypedDict

import numpy as np
import torch

from prvr.datasets.loader import WORKER_START, Batcher, EpochLoader, epoch_batches, epoch_query_batches
from prvr.harness.engine import precision, vcmr
from prvr.harness.base import progress
from prvr.harness.engine.checkpoints import (BEFORE_DEVICE, RESUME_FIX, RESUME_FREE_KEYS, STATE_KEYS, _first_line,
                                      _jsonable, load_weights, read_checkpoint, restore_cuda_rng, resume_changes,
                                      save_checkpoint, with_device)
# StepContext is importable from here too
from prvr.harness.base.contract import (DetectorState, LossOutput, MethodSpec, RelationDetector, StepContext, StepExtras,
                                   StepOutputs, as_backbone)
from prvr.harness.base.devices import pick_device
from prvr.harness.engine.sections import ON_NONFINITE, SELECT_ON, Config
from prvr.harness.engine.evaluate import ChunkSink, evaluate_model
from prvr.harness.engine.rankings import RankingSink
from prvr.harness.base.io import UserError, atomic_path
from prvr.harness.engine.optim import build_optimizer, lr_lambda
from prvr.harness.engine.record_types import Degenerate, Nonfinite, Resume
from prvr.harness.engine.records import selection_metric
from prvr.harness.base.timing import Timings


class Hook(Protocol):
    def on_epoch_start(self, trainer: "Trainer", epoch: int) -> None: ...
    def on_step(self, trainer: "Trainer", step: int, out: LossOutput) -> None: ...
    def on_epoch_end(self, trainer: "Trainer", epoch: int, summary: dict) -> None: ...


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Best(TypedDict):
    """The best epoch so far: its val figure of the selection key, its index, its val metrics."""

    score: float
    epoch: int
    metrics: dict[str, Any] | None


class Trainer:
    def __init__(self, cfg: Config, data: Any, model: torch.nn.Module, spec: MethodSpec, detector: RelationDetector,
                 ckpt_dir: Path, hooks: list | None = None, timings: Timings | None = None) -> None:
        self.cfg, self.data, self.model, self.spec, self.detector = cfg, data, model, spec, detector
        self.device = pick_device(cfg.train.device)
        precision.check_precision(cfg.train.precision, self.device)
        precision.set_matmul_precision(cfg.train.precision, self.device)
        precision.set_deterministic(cfg.train.deterministic, self.device)
        self.model.to(self.device)
        self.ckpt_dir = Path(ckpt_dir)
        self.hooks = list(hooks or [])  # the harness's own; the detector's hooks get a DetectorState
        self.timings = timings or Timings()
        self.batchers = {name: Batcher(split, cfg.data) for name, split in data.splits.items()}
        self.has_queries = np.array([len(q) > 0 for q in self.batchers["train"].video_queries])
        # what a batch draws (train.sample): the training videos with queries, or the training queries
        unit = "video" if cfg.train.sample == "videos" else "query"
        self.batch_units = int(self.has_queries.sum()) if unit == "video" else data.splits["train"].num_queries
        self.steps_per_epoch = math.ceil(self.batch_units / cfg.train.batch_size)
        if self.batch_units % cfg.train.batch_size == 1:  # every epoch's last batch: no negative in it
            progress.warn(f"{self.batch_units} training {cfg.train.sample} in batches of "
                          f"{cfg.train.batch_size} leave one {unit} alone in each epoch's last batch, whose ranking "
                          "losses are 0 (no negative); a train.batch_size one larger or smaller avoids it")
        self.optimizer, self.optimizer_spec = build_optimizer(model, cfg.train)
        total = self.steps_per_epoch * cfg.train.epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(total, cfg.train.warmup_frac, cfg.train.decay))
        self.epoch = 0
        # the val figure that selects the tested epoch and drives the early stop (train.select_on)
        self.localizes = vcmr.localizes(model)  # gives start / end logits (moments to select on)
        self.select_key = selection_metric(cfg.train.select_on, self.localizes)
        if cfg.train.select_on == "vcmr" and self.select_key != SELECT_ON["vcmr"]:
            progress.log(f"train.select_on is vcmr, but backbone {cfg.backbone!r} gives no moments: selecting "
                         f"on val {self.select_key} (the record's protocol says so)")
        self.best: Best = {"score": -math.inf, "epoch": -1, "metrics": None}
        # the val ranks of the best epoch, as its evaluation ranked them, read back once the run is
        # done (None: chosen by an earlier process of a resumed run); harness/engine/rankings.py
        self.best_val_ranks: RankingSink | None = None
        self.bad_epochs = 0
        self.history: list[dict] = []
        self.finished = False
        if cfg.train.on_nonfinite not in ON_NONFINITE:
            raise UserError(f"config key 'train.on_nonfinite' must be one of {', '.join(ON_NONFINITE)}, got "
                            f"{cfg.train.on_nonfinite!r}; fix --set train.on_nonfinite")
        self.nonfinite: Nonfinite | None = None  # first non-finite loss {epoch, step}, with on_nonfinite=continue
        self.degenerate: Degenerate | None = None  # first epoch whose loss parts were all exactly 0 {epoch}
        self.resumes: list[Resume] = []  # each resume: {from_epoch, changed settings, forced}
        self.written: set[Path] = set()  # checkpoint files this process wrote
        self.epochs_done = 0  # epochs this process completed
        self.ckpt_dir_existed = self.ckpt_dir.exists()
        self._loader: EpochLoader | None = None  # made at the first epoch (epoch_loader)

    # ------------------------------------------------------------------ training
    def fit(self, resume: bool = False, force_resume: bool = False) -> None:
        """Train to the last epoch or the early stop. A run that fails (or is killed) before
        completing an epoch removes the checkpoint files it wrote: no untrained model's
        checkpoint stays behind, while an earlier run's checkpoints, and those of a run
        stopped after some epochs (which --resume continues), are kept."""
        if resume and (self.ckpt_dir / "last.pt").exists():
            self.load_state(self.ckpt_dir / "last.pt", force_resume)
            progress.log(f"resumed from epoch {self.epoch} ({self.ckpt_dir / 'last.pt'})")
        elif resume:
            progress.warn(f"--resume: no run state {self.ckpt_dir / 'last.pt'} to resume from; training from "
                          "epoch 0")
        try:
            self.train_epochs()
        except BaseException:
            if self.epochs_done == 0:
                self.remove_written()
            raise
        self.finished = True
        self.save_state(self.ckpt_dir / "last.pt")

    def train_epochs(self) -> None:
        with progress.task(f"train {self.cfg.method}", total=self.cfg.train.epochs) as advance:
            advance(self.epoch)
            while not self.finished and self.epoch < self.cfg.train.epochs:
                summary = self.train_epoch(self.epoch)
                self.epoch += 1
                stop_note = self.after_epoch(summary)
                self.epochs_done += 1
                self.detector.on_epoch_end(self.detector_state(self.epoch - 1), summary)
                val_sumr = summary.get("val", {}).get("SumR", float("nan"))
                advance(1, loss=summary["loss"], val_SumR=val_sumr)
                if not progress.bars_visible():
                    progress.log(f"epoch {self.epoch - 1}: loss {summary['loss']:.3f}, val SumR {val_sumr:.1f}")
                if stop_note:
                    progress.log(stop_note)
                for h in self.hooks:
                    h.on_epoch_end(self, self.epoch - 1, summary)

    def detector_state(self, epoch: int) -> DetectorState:
        """What the detector's hooks see: the epoch, the model, the training split, and whether
        training ends after this epoch."""
        return DetectorState(epoch, self.model, self.device, self.data, self.batchers["train"],
                             last_epoch=self.finished or self.epoch >= self.cfg.train.epochs)

    def remove_written(self) -> None:
        """Remove the checkpoint files this process wrote, and its checkpoint folder when it
        made it and it is left empty (the shared folders above it stay)."""
        for path in self.written:
            path.unlink(missing_ok=True)
        self.written.clear()
        if not self.ckpt_dir_existed and self.ckpt_dir.is_dir() and not any(self.ckpt_dir.iterdir()):
            self.ckpt_dir.rmdir()

    def train_epoch(self, epoch: int) -> dict:
        self.model.train()
        state = self.detector_state(epoch)
        self.detector.on_epoch_start(state)
        for h in self.hooks:
            h.on_epoch_start(self, epoch)
        batches = self.epoch_batches(epoch)
        loader = self.epoch_loader().epoch(batches)
        sums = LossSums(self.device)
        with self.timings("train"):
            for i, batch in enumerate(loader):
                out = self.train_step(batch.to(self.device), epoch, epoch * self.steps_per_epoch + i)
                sums.add(out, i)
                if self.device.type == "cpu" and self.nonfinite is None:  # a CPU read is no sync
                    self.check_finite(sums, epoch)
                self.detector.on_step(state, i, out)
                for h in self.hooks:
                    h.on_step(self, i, out)
        means = sums.means(len(batches))  # the epoch's one read of the loss parts
        if self.nonfinite is None:  # on CUDA, read here once
            self.check_finite(sums, epoch)
        if self.degenerate is None and means and all(means[k] == 0.0 for k in means if k not in sums.diagnostics):
            self.degenerate = {"epoch": epoch}
            progress.warn(f"every loss part is exactly 0 in epoch {epoch}: nothing trains (no "
                          "negative or no positive in any batch?); the record is marked degenerate and the leaderboard "
                          "leaves it out of its means")
        summary: dict[str, Any] = {"epoch": epoch, **means, "lr": self.scheduler.get_last_lr()[0]}
        report = self.detector.epoch_report()
        if report:
            summary["relations"] = report
        return summary

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """Epoch `epoch`'s batches, as index arrays of what train.sample draws (videos or queries)."""
        train = self.cfg.train
        if train.sample == "queries":
            return epoch_query_batches(self.batch_units, train.batch_size, self.cfg.seed, epoch)
        return epoch_batches(len(self.has_queries), train.batch_size, self.cfg.seed, epoch, self.has_queries)

    def epoch_loader(self) -> EpochLoader:
        """The run's training loader, made at its first epoch: the split's features processed once
        (before worker processes start, so that they share them) and the workers kept for every
        epoch; batches pinned for a GPU."""
        if self._loader is None:
            train = self.batchers["train"]
            make = train.query_train_batch if self.cfg.train.sample == "queries" else train.train_batch
            self._loader = EpochLoader(make, self.num_workers(), pin=self.device.type == "cuda",
                                       prepare=train.prepare)
        return self._loader

    def check_finite(self, sums: "LossSums", epoch: int) -> None:
        bad = sums.first_nonfinite()
        if bad:
            self.on_nonfinite(*bad, epoch)

    def on_nonfinite(self, loss: float, step: int, epoch: int) -> None:
        """The epoch's first loss that is not a finite number: stop with one line
        (train.on_nonfinite=stop), or note the run's first, which marks the record, and train on
        (continue). On a CPU this is seen at its step; on CUDA the losses are read once per epoch
        (no host sync per step), so the run stops at the epoch's end, naming the same step, and
        nothing after the step is saved (the error comes before the epoch's checkpoint)."""
        if self.cfg.train.on_nonfinite == "stop":
            raise UserError(f"training diverged: loss is {loss} at epoch {epoch}, step {step} "
                            f"(train.lr={self.cfg.train.lr:g}, train.grad_clip={self.cfg.train.grad_clip:g}); lower "
                            "train.lr or check the method's settings, or set train.on_nonfinite=continue to train on "
                            "with the run's record marked")
        if self.nonfinite is None:
            self.nonfinite = {"epoch": epoch, "step": step}
            progress.warn(f"loss is {loss} at epoch {epoch}, step {step}; training goes on "
                          "(train.on_nonfinite=continue) and the record is marked, so the leaderboard leaves it "
                          "out of its means")

    def num_workers(self) -> int:
        """Worker processes for batch building: as configured, or (-1) 4 when a GPU trains
        (pinned batches then overlap with the GPU's work) and 0 on CPU, where workers would
        compete with the model for the same cores; 0 too where workers are not forked (not
        Linux: `loader.WORKER_START`), since each would get its own copy of the features."""
        n = self.cfg.train.num_workers
        if n >= 0:
            return n
        forked = WORKER_START == "fork"
        return min(4, os.cpu_count() or 1) if self.device.type == "cuda" and forked else 0

    def train_step(self, batch, epoch: int, step: int) -> LossOutput:
        model = as_backbone(self.model)
        q = model.encode_queries(batch.queries)  # in the run's precision (harness/engine/precision.py)
        v = model.encode_videos(batch.videos)
        scores = model.score(q, v)
        # what the backbone computes for its objective alone (contract.StepExtras, e.g. RAL's Gaussians)
        extras = self.model.step_extras(q, v, batch.query_item) if isinstance(self.model, StepExtras) else {}
        outputs: StepOutputs = {"queries": q, "videos": v, "scores": scores, "extras": extras}
        relations = self.detector.detect(batch, outputs)
        gen = torch.Generator(device=self.device).manual_seed(_mix(self.cfg.seed, step))
        ctx = StepContext(epoch, step, gen, batch, outputs, batch.query_item)
        out = self.spec.objective(self.cfg.loss, scores, relations, ctx)
        if not isinstance(out, LossOutput):
            raise UserError(f"method '{self.cfg.method}': its objective returned {type(out).__name__}, not a "
                            "LossOutput (harness/base/contract.py; docs/adding-a-method.md): return LossOutput(loss, parts)")
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        if self.cfg.train.grad_clip > 0 and not self.optimizer_spec.clips_inside:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return out.detached()

    def after_epoch(self, summary: dict) -> str | None:
        """Evaluate on val when due, keep the best checkpoint, save the state; returns the
        early-stop notice when training stops after this epoch."""
        stop_note = None
        if self.epoch % self.cfg.train.eval_every == 0 or self.epoch == self.cfg.train.epochs:
            ranking = RankingSink(self.data["val"])  # kept if this epoch is the best: the stored val rankings
            with self.timings("eval_val"):
                val = self.evaluate("val", sink=ranking)
            summary["val"] = {k: val[k] for k in ("R@1", "R@5", "R@10", "R@100", "SumR", SELECT_ON["vcmr"]) if k in val}
            if val[self.select_key] > self.best["score"]:
                self.best = {"score": val[self.select_key], "epoch": self.epoch - 1, "metrics": val}
                self.best_val_ranks = ranking
                self.bad_epochs = 0
                self.save_model(self.ckpt_dir / "best.pt")
            else:
                self.bad_epochs += 1
                if self.bad_epochs >= self.cfg.train.patience:
                    self.finished = True
                    stop_note = (f"early stop after epoch {self.epoch - 1}: no val {self.select_key} gain in "
                                 f"{self.cfg.train.patience} epochs")
        self.history.append(summary)
        self.save_state(self.ckpt_dir / "last.pt")
        return stop_note

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, split_name: str, show: bool = False, sink: ChunkSink | None = None) -> dict:
        """The suite's evaluator (harness/engine/evaluate.py `evaluate_model`) on one split; `sink` gets
        each chunk of the scores it ranks (a `RankingSink`: the split's stored rankings)."""
        metrics = evaluate_model(self.model, self.data[split_name], self.batchers[split_name], self.device,
                                 self.cfg.eval.chunk, f"eval {split_name}" if show else None, self.cfg.eval,
                                 sink=sink)
        self.model.train()
        return metrics

    # --------------------------------------------------------------- checkpoints
    def save_model(self, path: Path) -> None:
        """The best checkpoint: the weights and which selection they won (`best`: epoch, the
        selection key and its val figure), so that a record is never re-evaluated from the
        checkpoint of another training of its run (`reevaluate.check_checkpoint_of_record`)."""
        best = {"epoch": self.best["epoch"], "select": self.select_key, "score": float(self.best["score"]),
                "method": self.cfg.method}
        with atomic_path(path) as tmp:
            save_checkpoint({"model": self.model.state_dict(), "best": best}, tmp, path)
        self.written.add(Path(path))

    def load_model(self, path: Path, fix: str = "train the run again without --resume") -> None:
        state = read_checkpoint(path, ("model",), fix, self.device)
        load_weights(self.model, state["model"], path, fix)

    def save_state(self, path: Path) -> None:
        state = {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "bad_epochs": self.bad_epochs,
            "finished": self.finished, "best_score": self.best["score"], "best_epoch": self.best["epoch"],
            "best_metrics": _jsonable(self.best["metrics"]), "history": _jsonable(self.history),
            "torch_rng": torch.get_rng_state(), "config": self.cfg.to_dict(),
            "nonfinite": self.nonfinite, "degenerate": self.degenerate, "resumes": self.resumes,
            "device": self.device.type,
        }
        if self.device.type == "cuda":  # a CPU run never initialises CUDA
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        with atomic_path(path) as tmp:
            save_checkpoint(state, tmp, path)
        self.written.add(Path(path))

    def load_state(self, path: Path, force: bool = False) -> None:
        """Continue from `path` (last.pt) after comparing its stored settings with this run's."""
        state = read_checkpoint(path, STATE_KEYS, RESUME_FIX)
        changed = resume_changes(with_device(state.get("config"), state.get("device", BEFORE_DEVICE)),
                                 with_device(self.cfg.to_dict(), self.device.type), path, force)
        load_weights(self.model, state["model"], path, RESUME_FIX)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (KeyError, ValueError, RuntimeError, TypeError) as err:
            raise UserError(f"checkpoint {path}: its optimizer state does not fit this run's optimizer "
                            f"({_first_line(err)}); {RESUME_FIX}") from None
        self.epoch, self.bad_epochs, self.finished = state["epoch"], state["bad_epochs"], state["finished"]
        # checkpoints before train.select_on stored the best val SumR as best_sumr
        best = state.get("best_score", state.get("best_sumr"))
        if not isinstance(best, (int, float)):
            raise UserError(f"checkpoint {path} stores no best validation score (key 'best_score'); {RESUME_FIX}")
        if changed and "train.select_on" in changed:  # (--force-resume) the stored best was picked on another figure
            best = -math.inf
        self.best = {"score": best, "epoch": state["best_epoch"], "metrics": state["best_metrics"]}
        self.history = state["history"]
        self.nonfinite, self.degenerate = state.get("nonfinite"), state.get("degenerate")
        forced = changed is None or any(k not in RESUME_FREE_KEYS for k in changed)
        self.resumes = [*state.get("resumes", []), {"from_epoch": self.epoch, "changed": changed, "forced": forced}]
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda":
            restore_cuda_rng(state.get("cuda_rng"), path)


class LossSums:
    """The loss parts of an epoch, summed on the device (no host sync per step), with the first
    step whose loss is not finite; read once at the epoch's end. Sums are float64, as the
    Python floats they replace were, so an epoch's means are the same numbers."""

    def __init__(self, device: torch.device) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.diagnostics: set[str] = set()  # the names that are no part of the loss (LossOutput.diagnostics)
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.bad_loss = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, out: LossOutput, step: int) -> None:
        for k, v in out.items():
            v = v.detach().to(torch.float64)
            self.sums[k] = self.sums[k] + v if k in self.sums else v
        self.diagnostics.update(out.diagnostics)
        loss = out.loss.detach().to(torch.float64)
        new = (self.first_bad < 0) & ~torch.isfinite(loss)
        self.first_bad = torch.where(new, step, self.first_bad)
        self.bad_loss = torch.where(new, loss, self.bad_loss)

    def means(self, steps: int) -> dict[str, float]:
        """The mean of each part over `steps` (one read)."""
        return {k: float(v) / max(1, steps) for k, v in self.sums.items()}

    def first_nonfinite(self) -> tuple[float, int] | None:
        """(loss, step) of the epoch's first non-finite loss, None while every loss is finite."""
        first = int(self.first_bad)
        return (float(self.bad_loss), first) if first >= 0 else None


def _mix(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919 + 12345) % (2**63 - 1)
