"""The backbone seam: what every backbone provides, and the one type its scores come in.

A backbone is an `nn.Module` registered in `BACKBONES` with a `config_cls` (its `model`
config section) and four methods:

    encode_queries(QueryBatch) -> dict of tensors (the query side; backbone-specific keys)
    encode_videos(VideoBatch)  -> dict of tensors (the video side; backbone-specific keys)
    index_videos(videos)       -> videos (query-independent work done once per collection)
    score(queries, videos)     -> Scores (the same fields in training and in evaluation)

and declares `provides`: the named outputs (see `OUTPUTS`) that objectives and detectors
may ask for. A method's objective and a detector declare `needs`; a combination whose needs
the backbone does not provide is refused when the config resolves (`missing_outputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

# The outputs a backbone may provide, each with what it is (used in refusals and in docs).
OUTPUTS: dict[str, str] = {
    "branches": "named [queries, videos] branch scores fused into the ranked score (Scores.branches)",
    "raw": "[queries, videos] unnormalised branch scores, e.g. raw dot products for NCE (Scores.raw)",
    "frame_items": "[queries, videos, frames] per-frame similarities of each branch (Scores.items)",
    "query_vector": "one vector per query (encode_queries()['query'])",
    "clip_vectors": "per-video clip embeddings (encode_videos()['clips'])",
    "frame_mask": "the frame padding mask on the video side (encode_videos()['frame_mask'])",
}


@dataclass
class Scores:
    """What `score` returns, in training and evaluation alike.

    fused: [Q, V], the score the evaluator ranks by.
    branches: named [Q, V] scores that `fused` combines (e.g. clip and frame; ARL's theta, phi).
    raw: named [Q, V] scores before normalisation, by branch (e.g. MS-SL's dot products).
    items: named [Q, V, N] per-item similarities, by branch (e.g. ARL's text-frame level).
    """

    fused: torch.Tensor
    branches: dict[str, torch.Tensor] = field(default_factory=dict)
    raw: dict[str, torch.Tensor] = field(default_factory=dict)
    items: dict[str, torch.Tensor] = field(default_factory=dict)

    def ranked(self) -> dict[str, torch.Tensor]:
        """Every [Q, V] score that can be ranked on its own: the branches and `fused`."""
        return {**self.branches, "fused": self.fused}


@runtime_checkable
class Backbone(Protocol):
    config_cls: ClassVar[type]
    provides: ClassVar[frozenset[str]]

    def encode_queries(self, batch: Any) -> dict[str, torch.Tensor]: ...

    def encode_videos(self, batch: Any) -> dict[str, torch.Tensor]: ...

    def index_videos(self, videos: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def score(self, queries: dict[str, torch.Tensor], videos: dict[str, torch.Tensor]) -> Scores: ...


def missing_outputs(needs: frozenset[str] | set[str], backbone_cls: type) -> list[str]:
    """The needed outputs that a backbone class does not provide, sorted."""
    return sorted(set(needs) - set(getattr(backbone_cls, "provides", frozenset())))
