"""GMMFormer (Wang et al., AAAI 2024): Gaussian-mixture attention instead of explicit proposals.

Clip and frame encoders each stack two GMM blocks; a GMM block averages four attention
branches whose logits are multiplied by Gaussian windows of width plain / 0.5 / 1.0 / 5.0,
so each clip or frame gathers context at several temporal scales. Clip score: best cosine
over the 32 encoded clips; frame score: cosine with the attention-pooled frames (one vector
per video). Test score 0.7 clip + 0.3 frame.

Padding. The reference builds a frame window over the padded batch length, so a video's
encoding depends on its batch mates; here the frame windows span `max_frames` (128)
positions, the length the reference pads every batch to in GMMFormer v2. Clip windows span
the clips (32), as in the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import DROPOUT, NON_NEGATIVE, POSITIVE, PROBABILITY, ListOf, at_least, param
from prvr.harness.base.contract import Encoded, OnDemand, Scores
from prvr.harness.base.registry import BACKBONES
from prvr.harness.base.io import UserError
from prvr.methods.backbones.blocks import (AttentionPool, GMMBlock, InputEmbedding, QueryEncoder, best_clip_scores,
                                           check_heads, init_weights, official_branches, official_inputs_and_query,
                                           unit, with_units)


@dataclass
class GMMFormerConfig:
    hidden: int = param(384, at_least(1))  # GMMFormer src/Configs/*.py hidden_size
    heads: int = param(4, at_least(1))  # n_heads
    input_dropout: float = param(0.2, DROPOUT)  # input_drop (TVR, ActivityNet; Charades 0.15 in the preset)
    dropout: float = param(0.2, DROPOUT)  # drop (TVR, ActivityNet; Charades 0.15 in the preset)
    # GMMBlock attn0..attn3 widths; 0 = plain attention (wid=None)
    widths: list[float] = param([0.0, 0.5, 1.0, 5.0], ListOf(NON_NEGATIVE))
    # GMM blocks per video encoder (clip_encoder, clip_encoder_2; frame_encoder_1, _2)
    blocks: int = param(2, at_least(1))
    max_query_len: int = param(30, at_least(1))  # max_desc_l: learned positions of the query encoder
    # max_ctx_l: learned positions of the video encoders; span of the frame windows
    max_frames: int = param(128, at_least(1))
    # clip_scale_w; the frame weight is 1 - clip_weight (frame_scale_w 0.3)
    clip_weight: float = param(0.7, PROBABILITY)
    init_std: float = param(0.02, POSITIVE)  # initializer_range

    def check(self, key: str) -> None:
        check_heads(self, key)


OFFICIAL_WIDTHS = [0.0, 0.5, 1.0, 5.0]  # GMMFormer's GMMBlock: attn0 (no window), attn1 .. attn3 (wid 0.5, 1, 5)


def from_official(named: dict[str, torch.Tensor], cfg: GMMFormerConfig) -> dict[str, torch.Tensor]:
    """The weights of the official GMMFormer code (huangmozhi9527/GMMFormer `GMMFormer_Net`'s
    `state_dict`, by its parameter names) as this backbone's (blocks.py `official_inputs_and_query`,
    `official_branches`): its two clip blocks `clip_encoder`, `clip_encoder_2` and two frame blocks
    `frame_encoder_1`, `frame_encoder_2`, each of four attention layers `attn0` .. `attn3` (the widths
    plain, 0.5, 1, 5), its two attention poolings. Only a model of that layout reads them: other
    widths or another number of blocks is one line."""
    if list(cfg.widths) != OFFICIAL_WIDTHS or cfg.blocks != 2:
        raise UserError(f"--official-weights: the official GMMFormer has 2 blocks of widths {OFFICIAL_WIDTHS}; this run's "
                        f"model has {cfg.blocks} of {list(cfg.widths)}, so its weights do not fit it")
    layers = [f"attn{i}" for i in range(len(OFFICIAL_WIDTHS))]
    out = {**official_inputs_and_query(named), "frame_pool.score.weight": named["modular_vector_mapping_2.weight"]}
    for i, (clip, frame) in enumerate([("clip_encoder", "frame_encoder_1"), ("clip_encoder_2", "frame_encoder_2")]):
        out.update(official_branches(named, f"clip_blocks.{i}.branches", [f"{clip}.{a}" for a in layers]))
        out.update(official_branches(named, f"frame_blocks.{i}.branches", [f"{frame}.{a}" for a in layers]))
    return out


@BACKBONES.register("gmmformer", "GMMFormer: 2 GMM blocks (Gaussian widths plain/0.5/1/5) per video encoder")
class GMMFormer(nn.Module):
    config_cls = GMMFormerConfig
    provides: ClassVar[frozenset[str]] = frozenset({"clip_frame", "raw", "query_vector", "clip_vectors", "frame_tokens"})
    keep_frames = False  # also return the encoded frames (frame_tokens; set by a wrapper that reads them)
    official = ("huangmozhi9527/GMMFormer", from_official)  # `evaluate --official-weights`: whose weights, and their map

    def __init__(self, cfg: GMMFormerConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        h, heads, drop = cfg.hidden, cfg.heads, cfg.dropout
        self.query_encoder = QueryEncoder(query_dim, h, heads, cfg.max_query_len, cfg.input_dropout, drop)
        self.clip_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.clip_blocks = nn.ModuleList(GMMBlock(h, heads, cfg.widths, drop) for _ in range(cfg.blocks))
        self.frame_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.frame_blocks = nn.ModuleList(GMMBlock(h, heads, cfg.widths, drop, window_len=cfg.max_frames)
                                          for _ in range(cfg.blocks))
        self.frame_pool = AttentionPool(h)
        init_weights(self, cfg.init_std)

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        return {"query": self.query_encoder(qb.tokens, qb.token_mask)}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        clips = self.clip_embed(vb.clips)
        for block in self.clip_blocks:
            clips = block(clips)
        frames = self.frame_embed(vb.frames, vb.frame_mask)
        for block in self.frame_blocks:
            frames = block(frames, vb.frame_mask)
        out = {"clips": clips, "frame": self.frame_pool(frames, vb.frame_mask)}
        if self.keep_frames:
            out.update(frames=frames, frame_mask=vb.frame_mask)
        return out

    def index_videos(self, v: Encoded) -> Encoded:
        """Query-independent work before scoring many queries: the unit clip and frame vectors."""
        return with_units(v, "clips", "frame")

    def score(self, q: Encoded, v: Encoded) -> Scores:
        query = q["query"]
        clips = best_clip_scores(query, v)
        clip = clips.fused
        frame = F.normalize(query, dim=-1) @ unit(v, "frame").t()
        w = self.cfg.clip_weight
        raw = OnDemand({"clip": lambda: clips.raw["clip"],  # the losses' NCE reads them
                        "frame": lambda: query @ v["frame"].t()})
        return Scores(w * clip + (1 - w) * frame, {"clip": clip, "frame": frame}, raw)

    def clip_scores(self, q: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> Scores:
        """The clip branch alone (fused = clip), for a wrapper with its own frame branch."""
        return best_clip_scores(q["query"], v)
