"""Checkpoints of a run and what resume checks: written atomically, read weights-only.

`save_checkpoint` names a full disk or a name too long; `read_checkpoint` answers a missing,
empty, truncated, foreign or other-kind file in one line; `load_weights` names the first
weight of another shape; `resume_changes` compares a checkpoint's settings with this run's
(every key but `RESUME_FREE_KEYS` changes the numbers, `train.device` as the kind of device
trained on); `restore_cuda_rng` restores the CUDA generators of the GPUs present.
"""

from __future__ import annotations

import errno
import io
import math
import pickle
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any, overload

import numpy as np
import torch

from prvr.harness.base import progress
from prvr.harness.engine.sections import SETTLED_BEFORE
from prvr.harness.base.io import UserError, os_cause
from prvr.harness.base.registry import BACKBONES


# Settings a resumed run may change without --force-resume: where data, caches and work go,
# how queries are chunked in evaluation, the noise curve tested on the best checkpoint after
# training (eval.noise_*) and what a diverged loss does; none changes the
# numbers an uninterrupted run reaches. Every other key does (the model, the schedule over
# train.epochs, early stopping, the data, the objective) and must match the checkpoint's.
# train.device is compared as the kind of device the run trained on (cpu / cuda), not as written
# ("auto" is cpu on one machine and cuda on another): a run resumed on another kind is refused.
RESUME_FREE_KEYS = frozenset({"eval.chunk", "train.num_workers", "train.on_nonfinite",
                              "data.cache_dir", "data.data_root", "data.preload", "data.keep_gb",
                              "eval.noise_levels", "eval.noise_source",
                              # the moment metrics' settings (harness/engine/vcmr.py): evaluation only
                              "eval.vcmr_n_min", "eval.vcmr_n_max", "eval.vcmr_alpha", "eval.vcmr_top_videos",
                              "eval.vcmr_top_moments", "eval.vcmr_tious"})
STATE_KEYS = ("model", "optimizer", "scheduler", "epoch", "bad_epochs", "finished", "best_epoch",
              "best_metrics", "history", "torch_rng")  # and best_score (best_sumr before train.select_on)
RESUME_FIX = "run without --resume to train afresh (that overwrites it)"


# Checkpoints written before they stored their device were all trained on CPUs (no run of this
# suite had used CUDA until then).
BEFORE_DEVICE = "cpu"


@overload
def with_device(config: dict, kind: str) -> dict: ...
@overload
def with_device(config: dict | None, kind: str) -> dict | None: ...
def with_device(config: dict | None, kind: str) -> dict | None:
    """A stored or requested config whose train.device is the kind of device it trains on."""
    if not isinstance(config, dict):
        return config
    train = found if isinstance(found := config.get("train"), dict) else {}
    return {**config, "train": {**train, "device": kind}}


def restore_cuda_rng(states: Any, path: Path) -> None:
    """The CUDA generators' states of a checkpoint, for the GPUs present: one warning line when
    the checkpoint saw another number of GPUs (dropout on a GPU that was not there starts
    from its seed's state)."""
    if not isinstance(states, (list, tuple)) or not states:
        progress.warn(f"{path} stores no CUDA random state (trained on another device); "
                      "dropout on the GPU continues from this process's state")
        return
    present = torch.cuda.device_count()
    for i, rng in enumerate(states[:present]):
        torch.cuda.set_rng_state(rng, i)
    if len(states) != present:
        progress.warn(f"{path} was saved with {len(states)} GPU(s) visible, this process sees "
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


class _Read(dict):
    """A mapping that remembers which keys were read (what an official-weights map used)."""

    def __init__(self, items: dict[str, torch.Tensor]) -> None:
        super().__init__(items)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        self.read.add(key)
        return super().__getitem__(key)


def official_weights(path: Path, backbone: str, model_cfg: Any, model: Any = None,
                     option: str = "--official-weights", data: bytes | None = None) -> dict[str, torch.Tensor]:
    """An official code's weights (a .npz of its state dict, arrays by its parameter names; no
    pickle is read) as the state dict of `backbone` with the model config `model_cfg`, through the
    backbone's `official` (its repository and its map, map(named, model_cfg)); where the run's `model`
    wraps the backbone with a method's parts (RAL), its `official_around(named, backbone weights)` gives
    the whole model's. One line for a backbone without a map, a file that is not such an .npz, a name
    the map needs that the file lacks, or one the map does not use, each naming `option` (what gave the file:
    evaluate's --official-weights, a run's train.init_weights). `data`: the file's bytes where the
    caller has read them (`read_weights_file`), so that what it names by digest is what was loaded."""
    cls = BACKBONES.get(backbone)
    official = getattr(cls, "official", None)
    if official is None:
        known = [n for n in BACKBONES.names() if getattr(BACKBONES.get(n), "official", None) is not None]
        raise UserError(f"{option}: backbone {backbone} has no map of its official code's weights "
                        f"(known: {', '.join(known)}); give a run of one of those backbones")
    repo, mapping = official
    if data is None:
        data = read_weights_file(path, option)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            named = _Read({k: torch.from_numpy(np.array(npz[k])) for k in npz.files})
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        why = _first_line(err) or type(err).__name__
        raise UserError(f"{option} {path}: not a readable .npz of arrays ({why}); write one from the official "
                        "checkpoint as docs/parity.md shows") from None
    around = getattr(model, "official_around", None)
    try:
        weights = mapping(named, model_cfg)
        if around is not None:
            weights = around(named, weights)
    except KeyError as err:
        raise UserError(f"{option} {path} lacks {err.args[0]!r}, a weight of {repo}'s {backbone} model; "
                        "is it that code's checkpoint, converted whole?") from None
    unused = sorted(set(named) - named.read)
    if unused:
        raise UserError(f"{option} {path} holds {len(unused)} weights the map of {repo} does not use "
                        f"(e.g. {unused[0]}): another model or another version of the code")
    return weights


def read_weights_file(path: Path, option: str) -> bytes:
    """The bytes of an official code's weights file, read once (its map and its digest both come from
    them); one line where it is not a regular file or cannot be read."""
    if not path.is_file():  # not opened: a FIFO would wait for a writer
        raise UserError(f"{option} {path}: {'not a regular file' if path.exists() else 'no such file'}; write the .npz "
                        "from the official checkpoint as docs/parity.md shows")
    try:
        return path.read_bytes()
    except OSError as err:
        raise UserError(f"{option} {path}: cannot be read ({os_cause(err)}); give a readable .npz") from None


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
        progress.warn(f"{path} stores no settings; continuing it anyway (--force-resume)")
        return None
    new = flatten(requested)
    old = {**{k: v for k, v in SETTLED_BEFORE.items() if k in new}, **flatten(stored)}
    pairs = {k: (old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in sorted(old.keys() | new.keys())}
    differ = {k: (a, b) for k, (a, b) in pairs.items() if not _same(a, b)}
    refused = {k: v for k, v in differ.items() if k not in RESUME_FREE_KEYS}
    if refused:
        listing = ", ".join(f"{k} {_shown(a)} -> {_shown(b)}" for k, (a, b) in refused.items())
        if not force:
            raise UserError(f"--resume: checkpoint {path} was trained with other settings ({listing}); resume with "
                            "its settings, pass --force-resume to continue with these anyway (the record lists the "
                            "changes), or run without --resume to train afresh")
        progress.warn(f"resuming {path} with other settings ({listing}) (--force-resume)")
    return {k: [None if a is _ABSENT else a, None if b is _ABSENT else b] for k, (a, b) in differ.items()}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as {"section.key": value}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a is not _ABSENT and b is not _ABSENT and a == b


def _shown(v: Any) -> str:
    return "(absent)" if v is _ABSENT else repr(v)


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
