"""The backbone seam: what every backbone provides, and the one type its scores come in.

A backbone is an `nn.Module` registered in `BACKBONES` with a `config_cls` (its `model`
config section) and four methods:

    encode_queries(QueryBatch) -> dict of tensors (the query side; backbone-specific keys)
    encode_videos(VideoBatch)  -> dict of tensors (the video side; backbone-specific keys)
    index_videos(videos)       -> videos (query-independent work done once per collection)
    score(queries, videos)     -> Scores (the same fields in training and in evaluation)

and declares `provides`: the named outputs (see `OUTPUTS`) that objectives and detectors
may ask for. A method's objective and a detector declare `needs`; a combination whose needs
the backbone does not provide is refused when the config resolves (`missing_outputs`,
`prvr.methods.fit.check_fit`). A backbone that provides `frame_views` also has

    frame_views()              -> [(branch, query key, frames key)] (ARL's detector encodes these)

and one that provides `span_logits` (a backbone that localizes moments, e.g. XML) has

    span_logits(queries, videos, pairs [Q, K]) -> start, end logits [Q, K, T] (the VCMR evaluator)
    span_logits_batch(queries, videos)         -> start, end logits [Q, B, T] (training losses)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import torch

# The outputs a backbone may provide, each with what it is (used in refusals and in docs).
OUTPUTS: dict[str, str] = {
    "clip_frame": "[queries, videos] scores of a clip branch and a frame branch (Scores.branches 'clip', 'frame')",
    "theta_phi": "[queries, videos] scores of ARL's two models (Scores.branches 'theta', 'phi'; "
                 "phi absent with model.branches=1)",
    "raw": "[queries, videos] unnormalised clip and frame scores, e.g. raw dot products for NCE "
           "(Scores.raw 'clip', 'frame')",
    "frame_items": "[queries, videos, frames] per-frame cosines of each branch (Scores.items)",
    "frame_views": "per-branch query vectors and [videos, frames, d] frame embeddings whose best cosine is the "
                   "branch score (frame_views())",
    "query_vector": "one vector per query (encode_queries()['query'])",
    "clip_vectors": "per-video clip embeddings (encode_videos()['clips'])",
    "frame_mask": "the frame padding mask on the video side (encode_videos()['frame_mask'])",
    "frame_tokens": "[videos, frames, d] encoded frames of the frame branch and their mask "
                    "(encode_videos()['frames'], ['frame_mask']; a backbone with `keep_frames` gives them once "
                    "that is set), e.g. for RAL's word-frame scores",
    "span_logits": "start / end logits over the frame rows of a video for a query, for moment localization: "
                   "span_logits(queries, videos, pairs [Q, K]) -> ([Q, K, T], [Q, K, T]) for the video pairs[q, k] "
                   "of each query, span_logits_batch(queries, videos) -> ([Q, B, T], [Q, B, T]) for every pair; "
                   "padding rows -inf",
}


class OnDemand(Mapping[str, torch.Tensor]):
    """A mapping whose keys are fixed and whose values are computed on first access: scores
    that only the losses read (GMMFormer's raw dot products) cost evaluation nothing."""

    def __init__(self, makers: dict[str, Callable[[], torch.Tensor]]) -> None:
        self._makers, self._made = makers, {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._made:
            self._made[key] = self._makers[key]()
        return self._made[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


@dataclass
class Scores:
    """What `score` returns, in training and evaluation alike.

    fused: [Q, V], the score the evaluator ranks by.
    branches: named [Q, V] scores that `fused` combines (e.g. clip and frame; ARL's theta, phi).
    raw: named [Q, V] scores before normalisation, by branch (e.g. MS-SL's dot products); a
        backbone may give them `OnDemand`, computed when read.
    items: named [Q, V, N] per-item similarities, by branch (e.g. ARL's text-frame level).
    """

    fused: torch.Tensor
    branches: dict[str, torch.Tensor] = field(default_factory=dict)
    raw: Mapping[str, torch.Tensor] = field(default_factory=dict)
    items: dict[str, torch.Tensor] = field(default_factory=dict)

    def ranked(self) -> dict[str, torch.Tensor]:
        """Every [Q, V] score that can be ranked on its own: the branches and `fused`."""
        return {**self.branches, "fused": self.fused}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by a flat name: fused, the branches, raw.<branch>, items.<branch>."""
        return {"fused": self.fused, **self.branches, **{f"raw.{k}": t for k, t in self.raw.items()},
                **{f"items.{k}": t for k, t in self.items.items()}}

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Scores":
        """The same fields with `fn` applied to every tensor."""
        fields = (self.branches, self.raw, self.items)
        return Scores(fn(self.fused), *({k: fn(t) for k, t in d.items()} for d in fields))

    @staticmethod
    def cat(parts: list["Scores"]) -> "Scores":
        """Scores of consecutive slices of the queries, joined along the queries (what was on
        demand stays on demand)."""
        def join(dicts: list[Mapping[str, torch.Tensor]]) -> Any:
            if any(isinstance(d, OnDemand) for d in dicts):
                return OnDemand({k: lambda k=k: torch.cat([d[k] for d in dicts]) for k in dicts[0]})
            return {k: torch.cat([d[k] for d in dicts]) for k in dicts[0]}

        return Scores(torch.cat([p.fused for p in parts]), join([p.branches for p in parts]),
                      join([p.raw for p in parts]), join([p.items for p in parts]))


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
