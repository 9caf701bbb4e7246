"""GMMFormer v2 (Wang et al., 2024): dynamic fusion of Gaussian branches.

Each encoder has one dynamic GMM block: eight post-LN transformer branches (4x feed-forward)
with Gaussian widths plain / 0.5 / 1 / 5 / 10 / 3 / 0.1 / 8, fused per position with weights
that a learned token (shared by the clip and frame encoders) reads off each branch through
cross-attention. Clip score: best cosine over the 32 clips; frame score: best cosine over
the frames. Test score 0.7 clip + 0.3 frame.

Padding. The reference pads frames to 128 and zeroes padded frame features, which then
still take part in the max (a zero vector scores 0); here padded frames are excluded, unless
`model.padded_frames=zero`, which runs the frame encoder and the frame max as the reference does
(`blocks.encode_frames`, `blocks.frame_scores`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import DROPOUT, NON_NEGATIVE, POSITIVE, PROBABILITY, ListOf, at_least, one_of, param
from prvr.harness.base.contract import Encoded, Scores
from prvr.harness.base.registry import BACKBONES
from prvr.harness.base.io import UserError
from prvr.methods.backbones.blocks import (DynamicGMMBlock, InputEmbedding, PaddedFrames, QueryEncoder, best_clip_scores,
                                           check_heads, clip_frame_scores, encode_frames, init_weights, official_branches,
                                           official_cross, official_inputs_and_query, score_in_chunks, with_units)

OFFICIAL_WIDTHS = [0.0, 0.5, 1.0, 5.0, 10.0, 3.0, 0.1, 8.0]  # DyGMMBlock attn0 .. attn7: plain, then its wid values


@dataclass
class GMMFormer2Config:
    hidden: int = param(384, at_least(1))  # GMMFormer_v2 src/Configs/*.py hidden_size
    heads: int = param(4, at_least(1))  # n_heads
    input_dropout: float = param(0.2, DROPOUT)  # input_drop (TVR; ActivityNet 0.31, Charades 0.25 in the preset)
    dropout: float = param(0.2, DROPOUT)  # drop (TVR; ActivityNet 0.31, Charades 0.25 in the preset)
    # DyGMMBlock attn0..attn7 widths; 0 = plain attention (wid=None)
    widths: list[float] = param([0.0, 0.5, 1.0, 5.0, 10.0, 3.0, 0.1, 8.0], ListOf(NON_NEGATIVE))
    ffn_mult: int = param(4, at_least(0, "0 = none"))  # BertAttention FeedForward(hidden, 4 * hidden)
    # sft_factor: softmax temperature of the branch weights (TVR; 0.6 elsewhere)
    temperature: float = param(0.09, POSITIVE)
    num_clips: int = param(32, at_least(1))  # frame_len of the clip encoder's fusion head (map_size 32)
    # frame_len of the frame encoder's fusion head; max_ctx_l; span of the frame windows
    max_frames: int = param(128, at_least(1))
    max_query_len: int = param(30, at_least(1))  # max_desc_l: learned positions of the query encoder
    # clip_scale_w; the frame weight is 1 - clip_weight (frame_scale_w 0.3)
    clip_weight: float = param(0.7, PROBABILITY)
    # initializer_range (the weight token keeps its N(0, 1) init, as in the reference)
    init_std: float = param(0.02, POSITIVE)
    # exclude: padded frames take no part (ours); zero: the reference's frames padded to max_frames with
    # zero features, whose encoded rows count in a mean fusion token (Holmes) and score 0 in the frame max
    padded_frames: PaddedFrames = param("exclude", one_of(PaddedFrames))
    # ours: max elements of a [queries, videos, frames] tensor when scoring, no gradients
    eval_budget: int = param(1 << 24, at_least(1))

    def check(self, key: str) -> None:
        check_heads(self, key)


def official_dynamic_blocks(named: dict[str, torch.Tensor], attentions: list[str]) -> dict[str, torch.Tensor]:
    """What the GMMFormer v2 family's official codes (GMMFormer v2, Holmes) name alike, as this backbone's
    (blocks.py `official_inputs_and_query`, `official_branches`, `official_cross`): the query encoder, a
    BertAttention with a feed-forward; the clip encoder `clip_encoder` and frame encoder `frame_encoder_1`,
    each a DyGMMBlock of the attention layers `attentions` (one per width, in our order), its
    cross-attention `ca` and its weight map `layer1`, `layer2`. The learned token is each map's own."""
    out = official_inputs_and_query(named, ffn=True)
    for mine, theirs in (("clip_block", "clip_encoder"), ("frame_block", "frame_encoder_1")):
        out.update(official_branches(named, f"{mine}.branches", [f"{theirs}.{a}" for a in attentions], ffn=True))
        out.update(official_cross(named, f"{mine}.cross", f"{theirs}.ca"))
        out.update({f"{mine}.{m}.{t}": named[f"{theirs}.{m}.{t}"] for m in ("layer1", "layer2") for t in ("weight", "bias")})
    return out


def from_official(named: dict[str, torch.Tensor], cfg: GMMFormer2Config) -> dict[str, torch.Tensor]:
    """The weights of the official GMMFormer v2 (huangmozhi9527/GMMFormer_v2, GMMFormerV2_Net's
    `state_dict`, which its checkpoint keeps under `state_dict`) as this backbone's: `official_dynamic_blocks` with
    the attention layers `attn0` .. `attn7` and the learned `weight_token` both encoders share. Only a
    model of the reference's widths reads them (one line otherwise)."""
    if list(cfg.widths) != OFFICIAL_WIDTHS:
        raise UserError(f"--official-weights: the official GMMFormer v2 has the widths {OFFICIAL_WIDTHS}; this run's "
                        f"model has {list(cfg.widths)}, so its weights do not fit it")
    return {**official_dynamic_blocks(named, [f"attn{i}" for i in range(len(OFFICIAL_WIDTHS))]),
            "weight_token": named["weight_token"]}


@BACKBONES.register("gmmformer2", "GMMFormer v2: dynamic GMM block, 8 Gaussian widths fused by learned weights")
class GMMFormer2(nn.Module):
    config_cls = GMMFormer2Config
    # `evaluate --official-weights`: whose weights, and their map (None where a subclass has none)
    official: ClassVar[tuple[str, Callable[..., dict[str, torch.Tensor]]] | None] = ("huangmozhi9527/GMMFormer_v2",
                                                                                    from_official)
    provides: ClassVar[frozenset[str]] = frozenset({"clip_frame", "raw", "query_vector", "clip_vectors", "frame_mask",
                                                    "frame_views", "frame_tokens"})

    def __init__(self, cfg: GMMFormer2Config, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        h, heads, drop = cfg.hidden, cfg.heads, cfg.dropout
        self.query_encoder = QueryEncoder(query_dim, h, heads, cfg.max_query_len, cfg.input_dropout, drop, cfg.ffn_mult)
        self.clip_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.clip_block = DynamicGMMBlock(h, heads, cfg.widths, drop, cfg.ffn_mult, cfg.num_clips, cfg.temperature)
        self.frame_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.frame_block = DynamicGMMBlock(h, heads, cfg.widths, drop, cfg.ffn_mult, cfg.max_frames, cfg.temperature,
                                           window_len=cfg.max_frames)
        init_weights(self, cfg.init_std)
        self.weight_token = nn.Parameter(torch.randn(1, 1, h))

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        return {"query": self.query_encoder(qb.tokens, qb.token_mask)}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        clips = self.clip_block(self.clip_embed(vb.clips), None, self.weight_token)
        frames = encode_frames(self.frame_embed, self.frame_block, vb, self.cfg.padded_frames, self.cfg.max_frames,
                               self.weight_token)
        return {"clips": clips, "frames": frames, "frame_mask": vb.frame_mask}

    def index_videos(self, v: Encoded) -> Encoded:
        """Query-independent work before scoring many queries: the unit clip and frame vectors."""
        return with_units(v, "clips", "frames")

    def score(self, q: Encoded, v: Encoded) -> Scores:
        per_query = v["frames"].shape[0] * v["frames"].shape[1]
        return score_in_chunks(lambda chunk: self._score(chunk, v), q, per_query, self.cfg.eval_budget)

    def _score(self, q: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> Scores:
        return clip_frame_scores(q["query"], v, self.cfg.clip_weight, self.cfg.padded_frames, self.cfg.max_frames)

    def clip_scores(self, q: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> Scores:
        """The clip branch alone (fused = clip), for a wrapper with its own frame branch."""
        per_query = v["clips"].shape[0] * v["clips"].shape[1]
        return score_in_chunks(lambda chunk: best_clip_scores(chunk["query"], v), q, per_query, self.cfg.eval_budget)

    def frame_views(self) -> list[tuple[str, str, str]]:
        """(branch, query key, frames key): the frame branch (best cosine over frames), for the ARL detector."""
        return [("frame", "query", "frames")]
