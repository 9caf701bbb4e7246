"""A small dual-branch PRVR backbone in the spirit of MS-SL (the reference row).

Query: input projection, positional embedding, one transformer layer, attention pooling.
Video: one shared input projection of the frames (the costly 3072 -> 384 map runs once per
frame); the clip branch mean-pools the projected frames into `num_clips` clips, the frame
branch keeps the frames; each branch has its own positions and transformer layer.
Scores: max cosine over clips and max cosine over frames, fused with `clip_weight`.
The faithful MS-SL / GMMFormer architectures live beside it (later issues).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import DROPOUT, FLAG, PROBABILITY, at_least, param
from prvr.harness.base.contract import Encoded, Scores
from prvr.harness.base.registry import BACKBONES
from prvr.methods.backbones.blocks import check_heads, max_similarity, rowwise, unit, with_units


@dataclass
class DualBranchConfig:
    hidden: int = param(256, at_least(1))  # MS-SL uses 384; smaller here so that the reference row trains fast on CPUs
    heads: int = param(4, at_least(1))  # MS-SL attention heads
    layers: int = param(1, at_least(1))  # MS-SL: one attention layer per encoder
    dropout: float = param(0.1, DROPOUT)  # after the input maps (MS-SL: 0.1)
    # inside transformer layers; 0 because sampling masks costs more than the layer on CPUs
    layer_dropout: float = param(0.0, DROPOUT)
    # score fusion: clip_weight * clip + (1 - clip_weight) * frame (MS-SL TVR)
    clip_weight: float = param(0.7, PROBABILITY)
    # learned positional embeddings (covers 128 frames, 32 clips, 30 tokens)
    max_positions: int = param(128, at_least(1))
    # LayerNorm (no affine) on the inputs before the input maps, as ARL and the MS-SL code family; the baseline preset turns it on (False here so that records made before the knob rebuild as trained)
    input_norm: bool = param(False, FLAG)

    def check(self, key: str) -> None:
        check_heads(self, key)


def projection(in_dim: int, cfg: DualBranchConfig) -> nn.Module:
    """Input map to the hidden size. Dropout acts after the map: on 3072-d inputs it would
    cost more than the matrix product on a CPU."""
    layers = [nn.LayerNorm(in_dim, elementwise_affine=False)] if cfg.input_norm else []
    return nn.Sequential(*layers, nn.Linear(in_dim, cfg.hidden), nn.LayerNorm(cfg.hidden), nn.ReLU(),
                         nn.Dropout(cfg.dropout))


class Encoder(nn.Module):
    """Learned positions + transformer layers over a padded, already projected sequence."""

    def __init__(self, cfg: DualBranchConfig) -> None:
        super().__init__()
        self.pos = nn.Embedding(cfg.max_positions, cfg.hidden)
        layer = nn.TransformerEncoderLayer(cfg.hidden, cfg.heads, dim_feedforward=cfg.hidden * 2, dropout=cfg.layer_dropout,
                                           batch_first=True, norm_first=False)
        self.layers = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = h + self.pos(torch.arange(h.shape[1], device=h.device))[None]
        return self.layers(h, src_key_padding_mask=~mask)


class AttentionPool(nn.Module):
    """Masked attention pooling of a sequence into one vector (MS-SL's query pooling)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.score = nn.Linear(hidden, 1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.score(h).squeeze(-1).masked_fill(~mask, float("-inf"))
        return (logits.softmax(-1).unsqueeze(-1) * h).sum(1)


def max_cosine(query: torch.Tensor, items: torch.Tensor, mask: torch.Tensor | None = None,
               items_unit: bool = False) -> torch.Tensor:
    """[Q, d] x [V, N, d] -> [Q, V]: max over the N items of each video of the cosine
    (items_unit: the items are already L2-normalised)."""
    return max_similarity(query, items, mask, cosine=True, items_unit=items_unit)


@BACKBONES.register("dual-branch", "small MS-SL-like backbone: clip + frame branches, max-cosine scores, fused 0.7/0.3")
class DualBranch(nn.Module):
    config_cls = DualBranchConfig
    provides: ClassVar[frozenset[str]] = frozenset({"clip_frame", "query_vector", "frame_mask", "frame_views"})

    def __init__(self, cfg: DualBranchConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.query_proj = projection(query_dim, cfg)
        self.query_encoder = Encoder(cfg)
        self.query_pool = AttentionPool(cfg.hidden)
        self.video_proj = projection(video_dim, cfg)
        self.clip_encoder = Encoder(cfg)
        self.frame_encoder = Encoder(cfg)

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        h = self.query_encoder(self.query_proj(qb.tokens), qb.token_mask)
        return {"query": self.query_pool(h, qb.token_mask)}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        frames = rowwise(self.video_proj, vb.frames, vb.frame_mask)  # padding rows skip the costly map
        clips = torch.bmm(vb.clip_pool, frames)
        clip_mask = torch.ones(clips.shape[:2], dtype=torch.bool, device=clips.device)
        return {
            "clip": self.clip_encoder(clips, clip_mask),
            "frame": self.frame_encoder(frames, vb.frame_mask),
            "frame_mask": vb.frame_mask,
        }

    def index_videos(self, v: Encoded) -> Encoded:
        """Query-independent work before scoring many queries: the items' unit vectors."""
        return with_units(v, "clip", "frame")

    def score(self, q: Encoded, v: Encoded) -> Scores:
        clip = max_cosine(q["query"], unit(v, "clip"), items_unit=True)
        frame = max_cosine(q["query"], unit(v, "frame"), v["frame_mask"], items_unit=True)
        w = self.cfg.clip_weight
        return Scores(w * clip + (1 - w) * frame, {"clip": clip, "frame": frame})

    def frame_views(self) -> list[tuple[str, str, str]]:
        """(branch, query key, frames key): the frame branch, for the ARL detector."""
        return [("frame", "query", "frame")]
