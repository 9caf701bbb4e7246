"""The batches a backbone, a detector and an objective receive (issue 37: typed batches), part
of the contract between the harness and its parts: `VideoBatch` and `QueryBatch` (what a
backbone encodes), `TrainBatch` (a training step's videos with all their queries, what a
detector and an objective see). datasets/loader.py makes them; harness/base/contract.py types the
protocols with them.

Every field is a tensor (or None, or a nested batch): `to(device)` moves them all and describes
the masks on the device from their host copies (harness/base/masks.py), `pin_memory()` pins them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, TypeVar

import torch

from prvr.harness.base import masks

_B = TypeVar("_B", bound="_Tensors")


class _Tensors:
    """Device moves and pinning for the batch dataclasses (nested ones included). A move also
    describes the batch's masks on the device from their host copies (harness/base/masks.py), so
    that the model packing the real rows, and the losses reading the labelled pairs, ask the
    device nothing (no host sync)."""

    _mask_fields: tuple[str, ...] = ()  # the bool masks among the fields
    _value_fields: tuple[str, ...] = ()  # 1-D index fields whose values the host keeps (masks.host_values)
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every batch is a dataclass (for `fields`)

    def to(self: _B, device: torch.device) -> _B:
        moved = _map_tensors(self, lambda t: t.to(device, non_blocking=True))
        self._describe(moved)
        return moved

    def pin_memory(self: _B) -> _B:
        return _map_tensors(self, lambda t: t.pin_memory())

    def _describe(self, moved: Any) -> None:
        for f in fields(self):
            part = getattr(self, f.name)
            if isinstance(part, _Tensors):
                part._describe(getattr(moved, f.name))
        for name in self._mask_fields:
            host = getattr(self, name)
            if host.device.type == "cpu":
                masks.describe_from_host(host, getattr(moved, name))
        for name in self._value_fields:
            host = getattr(self, name)
            if host.device.type == "cpu":
                masks.describe_values(host, getattr(moved, name))


@dataclass
class VideoBatch(_Tensors):
    """A batch of videos, padded to the batch's longest."""

    frames: torch.Tensor  # [B, T, Dv]
    frame_mask: torch.Tensor  # [B, T] bool
    clips: torch.Tensor  # [B, C, Dv] mean-pooled raw frames (MS-SL clip branch input)
    clip_pool: torch.Tensor  # [B, C, T] the same pooling as a matrix over the (padded) frames
    video_index: torch.Tensor  # [B] index into the split's videos
    durations: torch.Tensor | None = None  # [B] float seconds (None: batches built without them)

    _mask_fields = ("frame_mask",)
    _value_fields = ("video_index",)  # a detector looks its pairs up on the host by them


@dataclass
class QueryBatch(_Tensors):
    """A batch of queries, padded to the batch's longest."""

    tokens: torch.Tensor  # [Q, L, Dq]
    token_mask: torch.Tensor  # [Q, L] bool
    query_index: torch.Tensor  # [Q]

    _mask_fields = ("token_mask",)
    _value_fields = ("query_index",)


@dataclass
class TrainBatch(_Tensors):
    """A training step's batch: its videos, with all their queries."""

    videos: VideoBatch
    queries: QueryBatch
    query_item: torch.Tensor  # [Q] which batch video each query is labelled with
    relevant: torch.Tensor | None  # [Q, B] bool ground truth (simulated data), else None
    moments: torch.Tensor | None = None  # [Q, 2] float seconds of each query's labelled moment, NaN where unknown

    def _describe(self, moved: Any) -> None:
        """And the labelled videos' columns, with whether every batch video has a labelled query
        (the one-to-one labels then have a positive in every column; methods/relations/base.py),
        and the ground truth with its host copy."""
        super()._describe(moved)
        item, videos = self.query_item, self.videos.frames.shape[0]
        if self.relevant is not None and self.relevant.device.type == "cpu":  # the oracle reads it on the host
            masks.describe(masks.describe_from_host(self.relevant, moved.relevant), host=self.relevant)
        if item.device.type == "cpu":
            masks.describe_values(item, moved.query_item)  # RAL's support sets size themselves from them
            # and its host copy, from which the labels' pairs are made on the host (contract.Relations.one_to_one)
            masks.describe_host(moved.query_item, item)
            if torch.unique(item).numel() == videos:
                masks.describe(moved.query_item, covers=videos)


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if obj is None or not hasattr(obj, "__dataclass_fields__"):
        return obj
    return type(obj)(**{f.name: _map_tensors(getattr(obj, f.name), fn) for f in fields(obj)})
