"""ARL's streamlined encoder (ARL paper, "Text Query Representation", "Video Representation",
Eq. 1-3) in two identical branches theta and Phi (cross-model detection; Eq. 13 averages them).

One branch: query = FC + ReLU, positional encoding, one transformer layer, attention pooling
-> q_i; video = FC + ReLU, positional encoding, one transformer layer -> frames V_j (Eq. 1);
s^f(q_i, v_jk) = cos(q_i, v_jk) (Eq. 2), s(q_i, V_j) = max_k s^f (Eq. 3). As in the MS-SL
code family the inputs are standardised (LayerNorm) before the FC.

The transformer layer is the one-attention-layer block of the MS-SL code family
(self-attention, output dense, residual, LayerNorm; no feed-forward by default): with it two
branches at TVR dimensions hold 5.52 M parameters, against 5.34 M in the paper's Table 3
(a 4x feed-forward would give about 10 M).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.base import masks
from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import DROPOUT, FLAG, Range, at_least, param
from prvr.harness.base.contract import Encoded, Scores
from prvr.harness.base.registry import BACKBONES
from prvr.methods.backbones.baseline import AttentionPool
from prvr.methods.backbones.blocks import check_heads, rowwise, unit, with_units

BRANCHES = ("theta", "phi")  # the paper's two models theta and Phi


@dataclass
class ArlEncoderConfig:
    hidden: int = param(384, at_least(1))  # d (GMMFormer / MS-SL: 384; ARL takes GMMFormer's settings)
    heads: int = param(4, at_least(1))  # GMMFormer: 4
    dropout: float = param(0.2, DROPOUT)  # after the input maps and positions (GMMFormer TVR 0.2, Charades 0.15)
    # inside the attention layer; 0 because masks cost more than the layer on CPUs
    layer_dropout: float = param(0.0, DROPOUT)
    # feed-forward width of the transformer layer; 0 = none (MS-SL's attention block; see docstring)
    ffn: int = param(0, at_least(0, "0 = none"))
    # theta and Phi (paper); 1 = a single model (no cross-model hand-off possible)
    branches: int = param(2, Range(1, 2, integer=True))
    # ours, as the MS-SL code family: LayerNorm (no affine) on the inputs before the FC; false = FC on the raw features
    input_norm: bool = param(True, FLAG)
    max_positions: int = param(128, at_least(1))  # learned positions: 128 frames (MS-SL family), 30 query tokens

    def check(self, key: str) -> None:
        check_heads(self, key)


class AttentionLayer(nn.Module):
    """One transformer layer: masked multi-head self-attention, dense, residual, LayerNorm
    (plus a feed-forward sub-layer when `ffn` > 0)."""

    def __init__(self, cfg: ArlEncoderConfig) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(cfg.hidden, cfg.heads, dropout=cfg.layer_dropout, batch_first=True)
        self.drop = nn.Dropout(cfg.layer_dropout)
        self.norm = nn.LayerNorm(cfg.hidden)
        self.ffn = None
        if cfg.ffn > 0:
            self.ffn = nn.Sequential(nn.Linear(cfg.hidden, cfg.ffn), nn.GELU(), nn.Linear(cfg.ffn, cfg.hidden))
            self.ffn_norm = nn.LayerNorm(cfg.hidden)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a, _ = self.attn(h, h, h, key_padding_mask=~mask, need_weights=False)
        h = self.norm(h + self.drop(a))
        if self.ffn is not None:
            h = self.ffn_norm(h + self.drop(self.ffn(h)))
        return h


class SequenceEncoder(nn.Module):
    """(input LayerNorm) FC + ReLU, learned positional encoding (+ LayerNorm, dropout), one
    transformer layer (Eq. 1)."""

    def __init__(self, in_dim: int, cfg: ArlEncoderConfig) -> None:
        super().__init__()
        # The MS-SL code family standardises the inputs before the FC (LayerNorm); without it the
        # FC outputs of L2-normalised features are ~0.01 per component and the model barely learns.
        # No affine parameters, so no gradient flows back into the 3072-d input.
        self.in_norm = nn.LayerNorm(in_dim, elementwise_affine=False) if cfg.input_norm else nn.Identity()
        self.fc = nn.Linear(in_dim, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_positions, cfg.hidden)
        nn.init.normal_(self.pos.weight, std=0.02)  # BERT / MS-SL init; N(0, 1) would drown the content
        self.pos_norm = nn.LayerNorm(cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)
        self.layer = AttentionLayer(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = rowwise(lambda rows: F.relu(self.fc(self.in_norm(rows))), x, mask)  # padding rows skip the costly map
        h = h + self.pos(torch.arange(h.shape[1], device=h.device))[None]
        return self.layer(self.drop(self.pos_norm(h)), mask)


class ArlModel(nn.Module):
    """One of the two identical models (theta or Phi)."""

    def __init__(self, cfg: ArlEncoderConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.query_encoder = SequenceEncoder(query_dim, cfg)
        self.query_pool = AttentionPool(cfg.hidden)
        self.video_encoder = SequenceEncoder(video_dim, cfg)

    def encode_queries(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.query_pool(self.query_encoder(tokens, mask), mask)  # q_i [Q, d]

    def encode_videos(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.video_encoder(frames, mask)  # V_j [B, T, d]


def frame_similarity(query: torch.Tensor, frames: torch.Tensor, frames_unit: bool = False) -> torch.Tensor:
    """ARL Eq. 2: s^f(q_i, v_jk) = cos(q_i, v_jk); [Q, d] x [B, T, d] -> [Q, B, T]
    (frames_unit: the frames are already L2-normalised)."""
    return torch.einsum("qd,btd->qbt", F.normalize(query, dim=-1), frames if frames_unit else F.normalize(frames, dim=-1))


def retrieval_score(frame_sims: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """ARL Eq. 3: s(q_i, V_j) = max over the video's real frames of s^f; [Q, B, T] -> [Q, B]."""
    return masks.keep_where(frame_sims, frame_mask[None], float("-inf")).amax(-1)


@BACKBONES.register("arl", "ARL's streamlined encoder: two identical branches, max-cosine over frames, scores averaged")
class ArlBackbone(nn.Module):
    """Outputs, per branch b in (theta, phi): queries `query.b` [Q, d]; videos `frames.b`
    [B, T, d] and `frame_mask`; Scores with branches[b] [Q, B] (Eq. 3), fused (Eq. 13) and
    items[b] [Q, B, T] (Eq. 2) for the text-frame detection and losses."""

    config_cls = ArlEncoderConfig
    provides: ClassVar[frozenset[str]] = frozenset({"theta_phi", "frame_items", "frame_mask", "frame_views"})

    def __init__(self, cfg: ArlEncoderConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        if cfg.branches not in (1, 2):
            raise ValueError(f"model.branches must be 1 or 2, got {cfg.branches}")
        self.cfg = cfg
        self.names = BRANCHES[: cfg.branches]
        self.models = nn.ModuleDict({b: ArlModel(cfg, video_dim, query_dim) for b in self.names})

    def branch_models(self) -> list[tuple[str, ArlModel]]:
        """(branch, its model) in branch order (nn.ModuleDict gives its modules back as nn.Module)."""
        return [(b, cast(ArlModel, m)) for b, m in self.models.items()]

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        return {f"query.{b}": m.encode_queries(qb.tokens, qb.token_mask) for b, m in self.branch_models()}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        out = {f"frames.{b}": m.encode_videos(vb.frames, vb.frame_mask) for b, m in self.branch_models()}
        out["frame_mask"] = vb.frame_mask
        return out

    def index_videos(self, v: Encoded) -> Encoded:
        """Query-independent work before scoring many queries: each branch's unit frame vectors."""
        return with_units(v, *(f"frames.{b}" for b in self.names))

    def score(self, q: Encoded, v: Encoded) -> Scores:
        branches, items = {}, {}
        for b in self.names:
            items[b] = frame_similarity(q[f"query.{b}"], unit(v, f"frames.{b}"), frames_unit=True)
            branches[b] = retrieval_score(items[b], v["frame_mask"])
        return Scores(torch.stack([branches[b] for b in self.names]).mean(0), branches, items=items)  # Eq. 13

    def frame_views(self) -> list[tuple[str, str, str]]:
        """(branch, query key, frames key) for the ARL detector."""
        return [(b, f"query.{b}", f"frames.{b}") for b in self.names]
