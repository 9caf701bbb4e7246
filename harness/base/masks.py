"""Boolean masks whose layout the host already knows, so that reading it needs no device sync.

Which rows of a padded batch are real, which (query, video) pairs are the labelled ones: the
loader and the one-to-one labels know this on the host, but code that holds only the device
mask would have to ask the device (`mask.nonzero()`, `bool(mask.all())`, `x[mask]`), and on a
GPU every such question waits for all queued work (a host sync). `describe` attaches what is
known to the mask tensor itself; `true_index`, `all_true` and `covered` answer from it and,
for a mask nobody described, ask the device once (one sync) and remember the answer on the
tensor. Answers are exact: the index is the one `nonzero` gives, so code that uses it gives
the same numbers as code that asks the device. Facts hold for the tensor as it was described:
an in-place change to it (its `_version` moves) drops them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

_ATTR = "_prvr_known"


@dataclass
class Known:
    """Facts about one tensor, each None where unknown."""

    index: torch.Tensor | None = None  # bool mask: flat positions of its True entries, ascending
    all_true: bool | None = None  # bool mask: every entry True
    rows: bool | None = None  # 2-D bool mask: every row holds a True (mask.any(1).all())
    cols: bool | None = None  # 2-D bool mask: every column holds a True (mask.any(0).all())
    covers: int | None = None  # integer tensor: its values include every integer in [0, covers)
    lengths: tuple[int, ...] | None = None  # 2-D bool mask: each row's count of True entries
    values: tuple[int, ...] | None = None  # 1-D integer tensor: its values
    host: torch.Tensor | None = None  # a device tensor: its copy on the host (`host_copy`)


_AS_ON_A_DEVICE = [False]  # within `as_on_a_device`


def host_holds(t: torch.Tensor) -> bool:
    """Whether the host holds `t`'s values, so that reading them (a count, a sort order) costs no device
    sync: a CPU tensor, except within `as_on_a_device`. Code with a path for each (RAL's CPU ranking,
    methods/backbones/ral.py) asks this, not the device type."""
    return t.device.type == "cpu" and not _AS_ON_A_DEVICE[0]


@contextlib.contextmanager
def as_on_a_device() -> Iterator[None]:
    """Within, `host_holds` answers no for CPU tensors too: the tests' CPU proxy of a GPU run
    (tests/test_profile_runtime.py) takes the path a GPU would take and counts what it reads back."""
    before = _AS_ON_A_DEVICE[0]
    _AS_ON_A_DEVICE[0] = True
    try:
        yield
    finally:
        _AS_ON_A_DEVICE[0] = before


def known(t: torch.Tensor) -> Known:
    """The facts attached to `t` (empty where none are, or where t changed in place since, or
    while torch.compile traces: its graphs handle data-dependent shapes their own way)."""
    if torch.compiler.is_compiling():
        return Known()
    version, facts = t.__dict__.get(_ATTR, (None, None))
    return facts if facts is not None and version == _version(t) else Known()


def describe(t: torch.Tensor, **facts) -> torch.Tensor:
    """Attach facts (fields of `Known`) to `t`, keeping those already there; returns `t`."""
    if torch.compiler.is_compiling() or t.is_inference():  # an inference tensor keeps no version counter
        return t
    old = {k: v for k, v in vars(known(t)).items() if v is not None}
    t.__dict__[_ATTR] = (_version(t), Known(**{**old, **facts}))
    return t


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version


def describe_from_host(host: torch.Tensor, device_mask: torch.Tensor) -> torch.Tensor:
    """Attach to `device_mask` (a copy of the CPU mask `host` on any device) the facts read off
    `host`: its true index (moved without a sync) and whether it is all true."""
    index = host.flatten().nonzero().squeeze(1)
    all_true = len(index) == host.numel()
    if device_mask.device.type == "cuda":
        index = index.pin_memory()  # an asynchronous copy; from pageable memory the copy would wait for the GPU
    moved = index.to(device_mask.device, non_blocking=True)
    describe_host(moved, index)  # for `true_index_host`
    facts = {"index": moved, "all_true": all_true}
    if host.dim() == 2:
        facts.update(rows=bool(host.any(1).all()), cols=bool(host.any(0).all()), lengths=tuple(host.sum(1).tolist()))
    return describe(device_mask, **facts)


def describe_host(device_copy: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    """Attach to `device_copy` its host copy `host` (`host_copy`); on the CPU, where the two are one
    tensor, a view of it (a tensor naming itself would be a reference cycle)."""
    return describe(device_copy, host=host if device_copy is not host else host.view_as(host))


def host_tensors(*arrays: np.ndarray) -> list[torch.Tensor]:
    """Host arrays as host tensors, for `to_device` (pinned, an asynchronous copy)."""
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def describe_values(host: torch.Tensor, device_copy: torch.Tensor) -> torch.Tensor:
    """Attach to `device_copy` (a copy of the 1-D CPU integer tensor `host`) its values."""
    return describe(device_copy, values=tuple(host.tolist()))


def host_values(t: torch.Tensor) -> np.ndarray:
    """The values of a 1-D integer tensor on the host: from its described values where known
    (`describe_values`), else copied from the device (a sync on a GPU)."""
    values = known(t).values
    if values is not None:
        return np.asarray(values, dtype=np.int64)
    return _from_device(t).numpy()


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` on the host: the host copy it was described with where known (`describe(t, host=)`),
    else copied from the device (a sync on a GPU)."""
    host = known(t).host
    return host if host is not None else _from_device(t)


def _from_device(t: torch.Tensor) -> torch.Tensor:
    """`t` copied to the host: where `host_values` and `host_copy` find nothing described, the
    one place this module asks the device (a sync on a GPU). On a CPU the copy is `t` itself, yet
    the CPU proxy of tests/test_cuda_syncs.py counts every call here wherever it comes from, so
    a step that reads a mask's host copy nobody described fails on a CPU too."""
    return t.cpu()


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device` without waiting for the GPU: pinned and copied
    asynchronously (from pageable memory a copy to the GPU waits for its queued work); a bool
    mask is described from its host copy (`describe_from_host`)."""
    if device.type == "cuda":
        host = host.pin_memory()
    moved = host.to(device, non_blocking=True)
    return describe_from_host(host, moved) if host.dtype == torch.bool else moved


@functools.lru_cache(maxsize=1024)
def constant_on(make: Callable[..., torch.Tensor], args: tuple, device: torch.device,
                dtype: torch.dtype) -> torch.Tensor:
    """`make(*args)`, a constant a model makes on the host (a window, position codes, a pooling
    matrix), on `device` in `dtype`, copied there once per (make, args, device, dtype) and
    without waiting for the GPU (`to_device`): made on the host and moved at every step, it
    was a blocking copy a step. The result is shared: never write to it."""
    return to_device(make(*args).to(dtype), device)


def keep_where(x: torch.Tensor, keep: torch.Tensor, fill: float) -> torch.Tensor:
    """`x` where `keep` (broadcast against it) holds, else `fill`: `x.masked_fill(~keep, fill)`, the same
    values and gradients, in one pass: with a mask broadcast over a large score tensor (padded
    frames against every query) masked_fill is 2-3 times slower on the CPU (docs/speed.md)."""
    return torch.where(keep, x, fill)


def true_index(mask: torch.Tensor) -> torch.Tensor:
    """Flat positions of the True entries of `mask`, ascending: `mask.flatten().nonzero()[:, 0]`."""
    facts = known(mask)
    index = facts.index
    if index is None and facts.all_true:
        index = torch.arange(mask.numel(), device=mask.device)
    if index is None:
        index = mask.flatten().nonzero().squeeze(1)  # asks the device
    if facts.index is None:
        describe(mask, index=index)
    return index


def true_index_host(mask: torch.Tensor) -> np.ndarray:
    """`true_index(mask)` on the host: the host copy the index was described with (a mask
    described from the host), else copied from the device (a sync on a GPU)."""
    return host_copy(true_index(mask)).numpy()


def true_pairs(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`mask.nonzero(as_tuple=True)` of a 2-D mask, from its true index."""
    index = true_index(mask)
    return index // mask.shape[1], index % mask.shape[1]


def all_true(mask: torch.Tensor) -> bool:
    """bool(mask.all()), from the facts where they tell (a known index of full length tells)."""
    facts = known(mask)
    if facts.all_true is not None:
        return facts.all_true
    if facts.index is not None:
        return len(facts.index) == mask.numel()
    answer = bool(mask.all())  # asks the device
    describe(mask, all_true=answer)
    return answer


def covered(mask: torch.Tensor, dim: int) -> bool | None:
    """Whether mask.any(dim) is all true, where known (dim 1: every row holds a True; dim 0:
    every column); None where not known, and nothing is asked of the device."""
    facts = known(mask)
    if facts.all_true and mask.numel() > 0:
        return True
    return facts.rows if dim == 1 else facts.cols if dim == 0 else None


def largest_group(mask: torch.Tensor, groups: torch.Tensor, num_groups: int) -> int:
    """The most True entries of one group's rows of a 2-D mask, row r in group groups[r] (in
    [0, num_groups)): `int(zeros(num_groups).index_add_(0, groups, mask.sum(1)).max())`, 0
    without groups. Counted on the host where the mask's row lengths (or that it is all true)
    and the groups' values are known; else asks the device once."""
    if num_groups == 0:
        return 0
    facts, values = known(mask), known(groups).values
    lengths = facts.lengths if facts.lengths is not None else (mask.shape[1],) * mask.shape[0] if facts.all_true else None
    if lengths is not None and values is not None:
        totals = [0] * num_groups
        for group, length in zip(values, lengths, strict=True):
            totals[group] += length
        return max(totals)
    per_group = torch.zeros(num_groups, dtype=torch.long, device=mask.device)
    return int(per_group.index_add_(0, groups, mask.sum(1)).max())  # asks the device
