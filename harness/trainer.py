"""Training loop shared by every method.

The optimizer and schedule are registered parts (harness/optim.py: `train.optimizer`
adamw | bertadam, `train.decay`); early stopping on a validation figure with patience (VR
SumR, or VCMR SumR for a backbone that localizes: `train.select_on`); the best checkpoint is kept
and the test split is evaluated with it.
Hooks run at epoch start / end and after each step: the detector's see a `DetectorState`
(epoch, model, training split; methods/relations/base.py), the harness's own hooks (profiling,
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
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import pickle
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from prvr.datasets.loader import Batcher, EpochLoader, epoch_batches
from prvr.harness import precision, progress, vcmr
from prvr.harness.config import ON_NONFINITE, SELECT_ON, SETTLED_BEFORE
from prvr.harness.evaluate import evaluate_model
from prvr.harness.io import UserError, atomic_path, os_cause
from prvr.harness.optim import build_optimizer, lr_lambda
from prvr.harness.records import selection_metric
from prvr.harness.timing import Timings
from prvr.methods.relations.base import DetectorState


# Settings a resumed run may change without --force-resume: where data, caches and work go,
# how queries are chunked in evaluation, the noise curve tested on the best checkpoint after
# training (eval.noise_*) and what a diverged loss does; none changes the
# numbers an uninterrupted run reaches. Every other key does (the model, the schedule over
# train.epochs, early stopping, the data, the objective) and must match the checkpoint's.
# train.device is compared as the kind of device the run trained on (cpu / cuda), not as written
# ("auto" is cpu on one machine and cuda on another): a run resumed on another kind is refused.
RESUME_FREE_KEYS = frozenset({"eval.chunk", "train.num_workers", "train.on_nonfinite",
                              "data.cache_dir", "data.data_root", "data.preload",
                              "eval.noise_levels", "eval.noise_source",
                              # the moment metrics' settings (harness/vcmr.py): evaluation only
                              "eval.vcmr_n_min", "eval.vcmr_n_max", "eval.vcmr_alpha", "eval.vcmr_top_videos",
                              "eval.vcmr_top_moments", "eval.vcmr_tious"})
STATE_KEYS = ("model", "optimizer", "scheduler", "epoch", "bad_epochs", "finished", "best_epoch",
              "best_metrics", "history", "torch_rng")  # and best_score (best_sumr before train.select_on)
RESUME_FIX = "run without --resume to train afresh (that overwrites it)"


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
    model: torch.nn.Module | None = None  # the model being trained (trainable heads of an objective live in it)
    # [Q] each query's labelled video, as a column of the batch's videos (from the labels, never
    # from a detector): which queries belong to which video
    video_of_query: torch.Tensor | None = None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


DEVICE_ENV = "PRVR_DEVICE"  # when set, the device that "auto" picks (the test suite sets cpu)


def pick_device(name: str) -> torch.device:
    """The device a setting names; "auto" is $PRVR_DEVICE when set, else CUDA when present."""
    if name == "auto":
        name = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
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
        precision.check_precision(cfg.train.precision, self.device)
        precision.set_matmul_precision(cfg.train.precision, self.device)
        precision.set_deterministic(cfg.train.deterministic, self.device)
        self.model.to(self.device)
        self.ckpt_dir = Path(ckpt_dir)
        self.hooks = list(hooks or [])  # the harness's own; the detector's hooks get a DetectorState
        self.timings = timings or Timings()
        self.batchers = {name: Batcher(split, cfg.data) for name, split in data.splits.items()}
        self.has_queries = np.array([len(q) > 0 for q in self.batchers["train"].video_queries])
        self.steps_per_epoch = math.ceil(self.has_queries.sum() / cfg.train.batch_size)
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
        self.best = {"score": -math.inf, "epoch": -1, "metrics": None}
        self.bad_epochs = 0
        self.history: list[dict] = []
        self.finished = False
        if cfg.train.on_nonfinite not in ON_NONFINITE:
            raise UserError(f"config key 'train.on_nonfinite' must be one of {', '.join(ON_NONFINITE)}, got "
                            f"{cfg.train.on_nonfinite!r}; fix --set train.on_nonfinite")
        self.nonfinite: dict | None = None  # first non-finite loss {epoch, step}, with on_nonfinite=continue
        self.degenerate: dict | None = None  # first epoch whose loss parts were all exactly 0 {epoch}
        self.resumes: list[dict] = []  # each resume: {from_epoch, changed settings, forced}
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
            progress.log(f"--resume: no run state {self.ckpt_dir / 'last.pt'} to resume from; training from "
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
        batches = epoch_batches(len(self.has_queries), self.cfg.train.batch_size, self.cfg.seed, epoch, self.has_queries)
        loader = self.epoch_loader().epoch(batches)
        sums = LossSums(self.device)
        with self.timings("train"):
            for i, batch in enumerate(loader):
                out = self.train_step(batch.to(self.device), epoch, epoch * self.steps_per_epoch + i)
                sums.add(out, i)
                bad = sums.first_nonfinite() if self.device.type == "cpu" else None  # a CPU read is no sync
                if bad:
                    self.on_nonfinite(*bad, epoch)
                self.detector.on_step(state, i, out)
                for h in self.hooks:
                    h.on_step(self, i, out)
        means = sums.means(len(batches))  # the epoch's one read of the loss parts
        bad = sums.first_nonfinite()  # on CUDA, read here once
        if bad and self.nonfinite is None:
            self.on_nonfinite(*bad, epoch)
        if self.degenerate is None and means and all(v == 0.0 for v in means.values()):
            self.degenerate = {"epoch": epoch}
            progress.log(f"[yellow]warning[/]: every loss part is exactly 0 in epoch {epoch}: nothing trains (no "
                         "negative or no positive in any batch?); the record is marked degenerate and the leaderboard "
                         "leaves it out of its means")
        summary = {"epoch": epoch, **means, "lr": self.scheduler.get_last_lr()[0]}
        report = self.detector.epoch_report()
        if report:
            summary["relations"] = report
        return summary

    def epoch_loader(self) -> EpochLoader:
        """The run's training loader, made at its first epoch: the split's features processed once
        (before worker processes start, so that they share them) and the workers kept for every
        epoch; batches pinned for a GPU."""
        if self._loader is None:
            train = self.batchers["train"]
            self._loader = EpochLoader(train.train_batch, self.num_workers(), pin=self.device.type == "cuda",
                                       prepare=train.prepare)
        return self._loader

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
            progress.log(f"[yellow]warning[/]: loss is {loss} at epoch {epoch}, step {step}; training goes on "
                         "(train.on_nonfinite=continue) and the record is marked, so the leaderboard leaves it "
                         "out of its means")

    def num_workers(self) -> int:
        """Worker processes for batch building: as configured, or (-1) 4 when a GPU trains
        (pinned batches then overlap with the GPU's work) and 0 on CPU, where workers would
        compete with the model for the same cores."""
        n = self.cfg.train.num_workers
        if n >= 0:
            return n
        return min(4, os.cpu_count() or 1) if self.device.type == "cuda" else 0

    def train_step(self, batch, epoch: int, step: int) -> dict[str, torch.Tensor]:
        q = self.model.encode_queries(batch.queries)  # in the run's precision (harness/precision.py)
        v = self.model.encode_videos(batch.videos)
        scores = self.model.score(q, v)
        outputs = {"queries": q, "videos": v, "scores": scores}
        relations = self.detector.detect(batch, outputs)
        gen = torch.Generator(device=self.device).manual_seed(_mix(self.cfg.seed, step))
        ctx = StepContext(epoch, step, gen, batch, outputs, self.model, batch.query_item)
        out = self.spec.objective(self.cfg.loss, scores, relations, ctx)
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        if self.cfg.train.grad_clip > 0 and not self.optimizer_spec.clips_inside:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return {k: t.detach() for k, t in out.items()}

    def after_epoch(self, summary: dict) -> str | None:
        """Evaluate on val when due, keep the best checkpoint, save the state; returns the
        early-stop notice when training stops after this epoch."""
        stop_note = None
        if self.epoch % self.cfg.train.eval_every == 0 or self.epoch == self.cfg.train.epochs:
            with self.timings("eval_val"):
                val = self.evaluate("val")
            summary["val"] = {k: val[k] for k in ("R@1", "R@5", "R@10", "R@100", "SumR", SELECT_ON["vcmr"]) if k in val}
            if val[self.select_key] > self.best["score"]:
                self.best = {"score": val[self.select_key], "epoch": self.epoch - 1, "metrics": val}
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
    def evaluate(self, split_name: str, show: bool = False) -> dict:
        """The suite's evaluator (harness/evaluate.py `evaluate_model`) on one split."""
        metrics = evaluate_model(self.model, self.data[split_name], self.batchers[split_name], self.device,
                                 self.cfg.eval.chunk, f"eval {split_name}" if show else None, self.cfg.eval)
        self.model.train()
        return metrics

    # --------------------------------------------------------------- checkpoints
    def save_model(self, path: Path) -> None:
        """The best checkpoint: the weights and which selection they won (`best`: epoch, the
        selection key and its val figure), so that a record is never re-evaluated from the
        checkpoint of another training of its run (`reevaluate.check_checkpoint_of_record`)."""
        best = {"epoch": self.best["epoch"], "select": self.select_key, "score": float(self.best["score"])}
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
        changed = resume_changes(_with_device(state.get("config"), state.get("device", BEFORE_DEVICE)),
                                 _with_device(self.cfg.to_dict(), self.device.type), path, force)
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
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.bad_loss = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, out: dict[str, torch.Tensor], step: int) -> None:
        for k, v in out.items():
            v = v.detach().to(torch.float64)
            self.sums[k] = self.sums[k] + v if k in self.sums else v
        loss = out["loss"].detach().to(torch.float64)
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


# Checkpoints written before they stored their device were all trained on CPUs (no run of this
# suite had used CUDA until then).
BEFORE_DEVICE = "cpu"


def _with_device(config: dict | None, kind: str) -> dict | None:
    """A stored or requested config whose train.device is the kind of device it trains on."""
    if not isinstance(config, dict):
        return config
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    return {**config, "train": {**train, "device": kind}}


def restore_cuda_rng(states: Any, path: Path) -> None:
    """The CUDA generators' states of a checkpoint, for the GPUs present: one warning line when
    the checkpoint saw another number of GPUs (dropout on a GPU that was not there starts
    from its seed's state)."""
    if not isinstance(states, (list, tuple)) or not states:
        progress.log(f"[yellow]warning[/]: {path} stores no CUDA random state (trained on another device); "
                     "dropout on the GPU continues from this process's state")
        return
    present = torch.cuda.device_count()
    for i, rng in enumerate(states[:present]):
        torch.cuda.set_rng_state(rng, i)
    if len(states) != present:
        progress.log(f"[yellow]warning[/]: {path} was saved with {len(states)} GPU(s) visible, this process sees "
                     f"{present}: the random state of the first {min(len(states), present)} restored")


LOW_DISK_BYTES = 256 * 2**20  # a checkpoint write that fails with less free than this failed for want of space


def save_checkpoint(state: dict, tmp: Path, path: Path) -> None:
    """torch.save into the temporary `tmp` of checkpoint `path`; a full disk (which torch's C++
    writer reports as 'basic_ios::clear') or a name too long is one line saying so."""
    try:
        torch.save(state, tmp)
    except (OSError, RuntimeError) as err:
        free = shutil.disk_usage(tmp.parent).free
        if isinstance(err, OSError) and err.errno != errno.ENOSPC:
            cause = os_cause(err, path)
        elif free < LOW_DISK_BYTES or (isinstance(err, OSError) and err.errno == errno.ENOSPC):
            cause = f"the disk is full ({free / 2**20:,.0f} MB free on the disk of {tmp.parent})"
        else:
            raise
        raise UserError(f"cannot write checkpoint {path}: {cause}; free space there or pass another --out") from None


def read_checkpoint(path: str | Path, keys: tuple[str, ...], fix: str,
                    map_location: str | torch.device = "cpu", mmap: bool = False) -> dict:
    """A checkpoint this harness wrote, loaded weights-only (`mmap`: its tensors mapped, not
    read, for a look at its small entries); a missing, empty, truncated or foreign file, or
    one without `keys`, is one line naming the file and `fix`."""
    path = Path(path)
    try:
        with warnings.catch_warnings():  # torch warns about a foreign pickle's protocol before refusing it
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise UserError(f"checkpoint {path} does not exist; {fix}") from None
    except Exception as err:  # a damaged file fails in torch.load with no common exception type
        raise UserError(f"checkpoint {path} cannot be read ({_unreadable(path, err)}); {fix}") from None
    if not isinstance(state, dict):
        raise UserError(f"checkpoint {path} holds a {type(state).__name__}, not a checkpoint written by prvr-bench; "
                        f"{fix}")
    missing = [k for k in keys if k not in state]
    if missing:
        raise UserError(f"checkpoint {path} lacks {', '.join(missing)} (it is not a checkpoint written by this "
                        f"prvr-bench for this purpose); {fix}")
    return state


def _unreadable(path: Path, err: Exception) -> str:
    """Why torch.load failed, from the file's first bytes: torch writes a zip archive (older
    versions a pickle), so anything else is another kind of file."""
    if path.is_dir():
        return "it is a folder"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return e.strerror or type(e).__name__
    if not head:
        return "the file is empty"
    if not (head.startswith(b"PK") or head.startswith(b"\x80")):
        return "not a torch file"
    if isinstance(err, pickle.UnpicklingError):
        return "it holds objects that a weights-only load refuses: a pickle of something else"
    detail = _first_line(err)
    return f"truncated or damaged: {type(err).__name__}{': ' + detail if detail else ''}"


def _first_line(err: BaseException, width: int = 120) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:width] if lines else ""


def load_weights(model: torch.nn.Module, weights: dict, path: Path, fix: str) -> None:
    """model.load_state_dict, with a checkpoint of another model (another backbone, or a
    setting such as model.hidden changed) answered by one line naming the first mismatch."""
    try:
        model.load_state_dict(weights)
    except (RuntimeError, TypeError, AttributeError) as err:
        why = _weights_mismatch(model, weights) or _first_line(err)
        raise UserError(f"checkpoint {path} holds another model than this run's ({why}); {fix}") from None


def _weights_mismatch(model: torch.nn.Module, weights: Any) -> str:
    if not isinstance(weights, dict):
        return f"its weights are a {type(weights).__name__}"
    own = model.state_dict()
    shapes = [f"{k} is {list(weights[k].shape)} there, {list(t.shape)} here" for k, t in own.items()
              if k in weights and getattr(weights[k], "shape", t.shape) != t.shape]
    missing, extra = [k for k in own if k not in weights], [k for k in weights if k not in own]
    parts = [*shapes[:1], *([f"{len(missing)} weights missing, e.g. {missing[0]}"] if missing else []),
             *([f"{len(extra)} unknown weights, e.g. {extra[0]}"] if extra else [])]
    more = f" and {len(shapes) - 1} more of another shape" if len(shapes) > 1 else ""
    return "; ".join(parts) + more if parts else ""


_ABSENT = object()


def resume_changes(stored: dict | None, requested: dict, path: Path, force: bool) -> dict | None:
    """The settings that differ between a checkpoint's run and this one, {key: [old, new]}
    (None where the checkpoint stores no settings). A difference in a key outside
    `RESUME_FREE_KEYS`, or a checkpoint without settings, is refused unless `force`."""
    if not isinstance(stored, dict):
        if not force:
            raise UserError(f"--resume: checkpoint {path} stores no settings (written by an older prvr-bench), so "
                            "they cannot be compared with this run's; pass --force-resume to continue it anyway, "
                            "or run without --resume to train afresh")
        progress.log(f"[yellow]warning[/]: {path} stores no settings; continuing it anyway (--force-resume)")
        return None
    old, new = {**SETTLED_BEFORE, **_flatten(stored)}, _flatten(requested)
    pairs = {k: (old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in sorted(old.keys() | new.keys())}
    differ = {k: (a, b) for k, (a, b) in pairs.items() if not _same(a, b)}
    refused = {k: v for k, v in differ.items() if k not in RESUME_FREE_KEYS}
    if refused:
        listing = ", ".join(f"{k} {_shown(a)} -> {_shown(b)}" for k, (a, b) in refused.items())
        if not force:
            raise UserError(f"--resume: checkpoint {path} was trained with other settings ({listing}); resume with "
                            "its settings, pass --force-resume to continue with these anyway (the record lists the "
                            "changes), or run without --resume to train afresh")
        progress.log(f"[yellow]warning[/]: resuming {path} with other settings ({listing}) (--force-resume)")
    return {k: [None if a is _ABSENT else a, None if b is _ABSENT else b] for k, (a, b) in differ.items()}


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a is not _ABSENT and b is not _ABSENT and a == b


def _shown(v: Any) -> str:
    return "(absent)" if v is _ABSENT else repr(v)


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
