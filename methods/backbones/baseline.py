"""A small dual-branch PRVR backbone in the spirit of MS-SL (the reference row).

Query: input projection, positional embedding, one transformer layer, attention pooling.
Clip branch: the same over the `num_clips` pooled clips; frame branch: over the frames.
Scores: max cosine over clips and max cosine over frames, fused with `clip_weight`.
The faithful MS-SL / GMMFormer architectures live beside it (later issues).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.registry import BACKBONES


@dataclass
class DualBranchConfig:
    hidden: int = 384  # MS-SL hidden size
    heads: int = 4  # MS-SL attention heads
    layers: int = 1  # MS-SL: one attention layer per encoder
    dropout: float = 0.1  # MS-SL dropout
    clip_weight: float = 0.7  # score fusion: clip_weight * clip + (1 - clip_weight) * frame (MS-SL TVR)
    max_positions: int = 128  # learned positional embeddings (covers 128 frames, 32 clips, 30 tokens)


class Encoder(nn.Module):
    """Input projection + learned positions + transformer layers over a padded sequence."""

    def __init__(self, in_dim: int, cfg: DualBranchConfig) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim), nn.Dropout(cfg.dropout), nn.Linear(in_dim, cfg.hidden), nn.ReLU())
        self.pos = nn.Embedding(cfg.max_positions, cfg.hidden)
        layer = nn.TransformerEncoderLayer(cfg.hidden, cfg.heads, dim_feedforward=cfg.hidden * 2, dropout=cfg.dropout,
                                           batch_first=True, norm_first=False)
        self.layers = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) + self.pos(torch.arange(x.shape[1], device=x.device))[None]
        return self.layers(h, src_key_padding_mask=~mask)


class AttentionPool(nn.Module):
    """Masked attention pooling of a sequence into one vector (MS-SL's query pooling)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.score = nn.Linear(hidden, 1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.score(h).squeeze(-1).masked_fill(~mask, float("-inf"))
        return (logits.softmax(-1).unsqueeze(-1) * h).sum(1)


def max_cosine(query: torch.Tensor, items: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[Q, d] x [V, N, d] -> [Q, V]: max over the N items of each video of the cosine."""
    q = F.normalize(query, dim=-1)
    v = F.normalize(items, dim=-1)
    sims = torch.einsum("qd,vnd->qvn", q, v)
    if mask is not None:
        sims = sims.masked_fill(~mask[None], float("-inf"))
    return sims.max(-1).values


@BACKBONES.register("dual-branch", "small MS-SL-like backbone: clip + frame branches, max-cosine scores, fused 0.7/0.3")
class DualBranch(nn.Module):
    config_cls = DualBranchConfig

    def __init__(self, cfg: DualBranchConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.query_encoder = Encoder(query_dim, cfg)
        self.query_pool = AttentionPool(cfg.hidden)
        self.clip_encoder = Encoder(video_dim, cfg)
        self.frame_encoder = Encoder(video_dim, cfg)

    def encode_queries(self, qb) -> dict[str, torch.Tensor]:
        h = self.query_encoder(qb.tokens, qb.token_mask)
        return {"query": self.query_pool(h, qb.token_mask)}

    def encode_videos(self, vb) -> dict[str, torch.Tensor]:
        clip_mask = torch.ones(vb.clips.shape[:2], dtype=torch.bool, device=vb.clips.device)
        return {
            "clip": self.clip_encoder(vb.clips, clip_mask),
            "frame": self.frame_encoder(vb.frames, vb.frame_mask),
            "frame_mask": vb.frame_mask,
        }

    def score(self, q: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        clip = max_cosine(q["query"], v["clip"])
        frame = max_cosine(q["query"], v["frame"], v["frame_mask"])
        w = self.cfg.clip_weight
        return {"clip": clip, "frame": frame, "fused": w * clip + (1 - w) * frame}
