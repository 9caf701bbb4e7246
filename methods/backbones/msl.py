"""MS-SL (Dong et al., ACM MM 2022): multi-scale similarity learning.

Clip scale: the 32 clips (mean-pooled frames) are encoded by one attention layer; every
contiguous run of clips (average pools of width 1..32: 528 proposals) is a candidate moment,
and the clip score is the best cosine over the proposals. Frame scale: the best proposal
(the key clip) attends over the encoded frames (key-clip guided attention); the frame score
is the cosine of the query with the attended frame feature. Test score 0.7 clip + 0.3 frame.

Computation. A proposal is a fixed average of clips (P = A @ C, A the [528, 32] pooling
matrix), so q . P = A @ (C q) and |P|^2 = diag(A C C^T A^T): scores come from [Q, V, 32]
products instead of materialising [V, 528, D] proposals; the best proposal is found without
gradients and the gradient flows through the selected one, as through a max. The key-clip
attention and the norm of its output use the same trick with the frame values' Gram matrix.
Same numbers as the reference's materialised tensors (tests check it), far less memory.

Training. The reference trains the frame branch on a [queries x queries] matrix (each query
against the frames of its own video attended by another query's key clip) and evaluates on
[queries x videos]; here both use the [queries x videos] evaluation definition, so relation
detectors and the ranking losses see one matrix per branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, ClassVar

import torch
from torch import nn

from prvr.harness.base import masks
from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import DROPOUT, POSITIVE, PROBABILITY, at_least, param
from prvr.harness.base.contract import Encoded, OnDemand, Scores
from prvr.harness.base.registry import BACKBONES
from prvr.methods.backbones.blocks import (PLAIN, GMMBlock, InputEmbedding, QueryEncoder, check_heads, init_weights,
                                           official_branches, official_inputs_and_query, score_in_chunks)


@dataclass
class MSLConfig:
    hidden: int = param(384, at_least(1))  # ms-sl method/config.py --hidden_size
    heads: int = param(4, at_least(1))  # --n_heads
    input_dropout: float = param(0.1, DROPOUT)  # --input_drop: input layers and positional encodings
    dropout: float = param(0.1, DROPOUT)  # --drop: attention weights and layer outputs
    max_query_len: int = param(30, at_least(1))  # --max_desc_l: learned positions of the query encoder
    max_frames: int = param(128, at_least(1))  # --max_ctx_l: learned positions of the clip and frame encoders
    # --clip_scale_w; the frame weight is 1 - clip_weight (--frame_scale_w 0.3)
    clip_weight: float = param(0.7, PROBABILITY)
    init_std: float = param(0.02, POSITIVE)  # --initializer_range
    # ours: max elements of a [queries, videos, items] tensor when scoring without gradients
    eval_budget: int = param(1 << 24, at_least(1))

    def check(self, key: str) -> None:
        check_heads(self, key)


@lru_cache(maxsize=8)
def proposal_matrix(num_clips: int) -> torch.Tensor:
    """[P, C] averaging matrix of every contiguous run of clips, widths 1..C
    (MS-SL's AvgPool1d(k, stride 1) for k = 1..32: 528 proposals for C = 32)."""
    width = torch.cat([torch.full((num_clips - k + 1,), k) for k in range(1, num_clips + 1)])
    start = torch.cat([torch.arange(num_clips - k + 1) for k in range(1, num_clips + 1)])
    cols = torch.arange(num_clips)[None]
    inside = (cols >= start[:, None]) & (cols < (start + width)[:, None])
    return inside.float() / width[:, None]


def proposal_matrix_like(clips: torch.Tensor) -> torch.Tensor:
    """The proposal matrix for `clips` [V, C, D], on their device and in their dtype, made once
    per (C, device, dtype): copying it to a GPU at every score was a blocking host copy a step."""
    return masks.constant_on(proposal_matrix, (clips.shape[1],), clips.device, clips.dtype)


def proposal_norms(clips: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """|A C_v| for every proposal of every video: [V, P] from the clips' Gram matrices."""
    gram = clips @ clips.transpose(1, 2)  # [V, C, C]
    return ((pool @ gram) * pool).sum(-1).clamp_min(1e-24).sqrt()


@dataclass
class VideoSide:
    """What scoring needs from the videos, computed once per call of `score`."""

    clips: torch.Tensor  # [V, C, D] encoded clips
    pool: torch.Tensor  # [P, C] proposal averaging matrix
    norms: torch.Tensor  # [V, P] proposal norms
    clip_keys: torch.Tensor  # [V, C, T] clip . frame key
    values: torch.Tensor  # [V, T, D] frame values
    gram: torch.Tensor  # [V, T, T] Gram matrix of the frame values
    mask: torch.Tensor  # [V, T] real frames

    @staticmethod
    def of(v: dict[str, torch.Tensor]) -> "VideoSide":
        """From encoded videos; the query-independent parts come from `MSSL.index_videos`
        when it stored them (keys `side.*`), else they are computed now."""
        clips, values = v["clips"], v["frame_values"]
        pool = proposal_matrix_like(clips)
        if "side.norms" in v:  # the three stored together
            norms, clip_keys, gram = v["side.norms"], v["side.clip_keys"], v["side.gram"]
        else:
            norms, clip_keys, gram = VideoSide.parts(v, pool)
        return VideoSide(clips, pool, norms, clip_keys, values, gram, v["frame_mask"])

    @staticmethod
    def parts(v: dict[str, torch.Tensor], pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Proposal norms, clip . frame keys and the frame values' Gram matrices."""
        clips, values = v["clips"], v["frame_values"]
        return (proposal_norms(clips, pool), torch.einsum("vcd,vtd->vct", clips, v["frame_keys"]),
                values @ values.transpose(1, 2))


@torch.no_grad()
def best_proposals(clip_dots: torch.Tensor, pool: torch.Tensor, norms: torch.Tensor, budget: int,
                   by: tuple[str, ...] = ("cos", "dot")) -> tuple[torch.Tensor, ...]:
    """Index of the best proposal of each (query, video) [Q, V], by cosine ("cos") and by raw dot product
    ("dot"), those `by` names, in its order. clip_dots [Q, V, C] = q . clip; norms [V, P]. Runs in query
    slices of `budget` elements, each slice's products made once for both; `max`'s index is argmax's
    (the first best)."""
    q, v, _ = clip_dots.shape
    step = max(1, budget // max(1, v * pool.shape[0]))
    best: dict[str, list[torch.Tensor]] = {name: [] for name in by}
    for s in range(0, q, step):
        dots = clip_dots[s : s + step] @ pool.t()  # [q, V, P]
        if "dot" in best:
            best["dot"].append(dots.max(-1).indices)
        if "cos" in best:
            best["cos"].append(dots.div_(norms).max(-1).indices)  # |q| is constant along the proposals
    return tuple(torch.cat(best[name]) for name in by)


def key_clip_guided(query: torch.Tensor, key_clip: torch.Tensor, side: VideoSide) -> tuple[torch.Tensor, torch.Tensor]:
    """MS-SL's key-clip guided attention for every (query, video): the key proposal
    (key_clip [Q, V, C], its pooling weights over the clips) attends over the frame keys
    (no scaling, padded frames excluded); returns (cosine, raw dot) of the query with the
    attended frame values, each [Q, V]."""
    logits = masks.keep_where(torch.einsum("qvc,vct->qvt", key_clip, side.clip_keys), side.mask[None], float("-inf"))
    att = logits.softmax(-1)  # [Q, V, T]
    dots = (att * torch.einsum("qd,vtd->qvt", query, side.values)).sum(-1)
    sq_norm = (torch.einsum("qvt,vts->qvs", att, side.gram) * att).sum(-1)
    cosine = dots / (query.norm(dim=-1).clamp_min(1e-12)[:, None] * sq_norm.clamp_min(1e-24).sqrt())
    return cosine, dots


def own_video_frames(query: torch.Tensor, v: dict[str, torch.Tensor], video_of_query: torch.Tensor) -> torch.Tensor:
    """The frame feature the reference trains each query's frame branch on [Q, D] (ms-sl model.py
    `key_clip_guided_attention`, `loss.frame_matrix=queries`): its labelled video's frame values,
    attended by its key clip there (that video's proposal of the highest cosine with the query),
    with no scaling and padded frames excluded, as `key_clip_guided` attends; `video_of_query` [Q]
    is each query's labelled video as a row of `v`."""
    clips = v["clips"][video_of_query]  # [Q, C, D]
    pool = proposal_matrix_like(v["clips"])
    with torch.no_grad():  # the reference's argmax: no gradient through the choice
        dots = torch.einsum("qd,qcd->qc", query, clips) @ pool.t()  # [Q, P]
        key = (dots / proposal_norms(v["clips"], pool)[video_of_query]).argmax(-1)  # |q| is constant along P
    key_clip = torch.einsum("qc,qcd->qd", pool[key], clips)
    logits = torch.einsum("qd,qtd->qt", key_clip, v["frame_keys"][video_of_query])
    att = logits.masked_fill(~v["frame_mask"][video_of_query], float("-inf")).softmax(-1)
    return torch.einsum("qt,qtd->qd", att, v["frame_values"][video_of_query])


def clip_scale(query: torch.Tensor, side: VideoSide, budget: int) -> tuple[torch.Tensor, Callable[[], torch.Tensor],
                                                                          torch.Tensor]:
    """MS-SL's clip scale for every (query, video): the best proposal's cosine [Q, V], the best raw dot
    product (a function giving [Q, V]) and the index of the best proposal by cosine [Q, V].

    With gradients (training) the raw dot products are made now, from the same clip products and
    proposal search, so that both scores' gradients meet there as they always have; without (ranking,
    a detector's pass), only when read, from the clip products made again (the same values):
    evaluation reads none, and searches the proposals once."""
    clip_dots = torch.einsum("qd,vcd->qvc", query, side.clips)
    video = torch.arange(side.clips.shape[0], device=query.device)[None]
    q_norm = query.norm(dim=-1).clamp_min(1e-12)[:, None]

    def raw(dots: torch.Tensor, by_dot: torch.Tensor) -> torch.Tensor:
        return (dots * side.pool[by_dot]).sum(-1)

    if torch.is_grad_enabled():
        by_cos, by_dot = best_proposals(clip_dots, side.pool, side.norms, budget)
        clip = (clip_dots * side.pool[by_cos]).sum(-1) / (q_norm * side.norms[video, by_cos])
        made = raw(clip_dots, by_dot)
        return clip, lambda: made, by_cos
    (by_cos,) = best_proposals(clip_dots, side.pool, side.norms, budget, ("cos",))
    clip = (clip_dots * side.pool[by_cos]).sum(-1) / (q_norm * side.norms[video, by_cos])
    del clip_dots  # not kept while the scores wait to be read

    def later() -> torch.Tensor:
        dots = torch.einsum("qd,vcd->qvc", query, side.clips)
        return raw(dots, best_proposals(dots, side.pool, side.norms, budget, ("dot",))[0])

    return clip, later, by_cos


def msl_scores(query: torch.Tensor, side: VideoSide, budget: int, clip_weight: float) -> Scores:
    """Clip-scale (best proposal) and frame-scale (key-clip guided) scores, cosine (branches,
    fused with `clip_weight`) and raw dot products (raw), each [Q, V]."""
    clip, clip_raw, by_cos = clip_scale(query, side, budget)
    frame, frame_raw = key_clip_guided(query, side.pool[by_cos], side)
    return Scores(clip_weight * clip + (1 - clip_weight) * frame, {"clip": clip, "frame": frame},
                  OnDemand({"clip": clip_raw, "frame": lambda: frame_raw}))


def msl_clip_scores(query: torch.Tensor, side: VideoSide, budget: int) -> Scores:
    """The clip scale alone (fused = clip), without the key-clip guided frame attention: for a
    wrapper that scores the frame branch its own way (RAL)."""
    clip, clip_raw, _ = clip_scale(query, side, budget)
    return Scores(clip, {"clip": clip}, OnDemand({"clip": clip_raw}))


def from_official(named: dict[str, torch.Tensor], cfg: "MSLConfig") -> dict[str, torch.Tensor]:
    """The weights of the official MS-SL code (HuiGuanLab/ms-sl `MS_SL_Net.state_dict()`, by its
    parameter names) as this backbone's state dict (blocks.py `official_inputs_and_query`, `official_branches`);
    `cfg` is the run's model config (every MS-SL model has the reference's layout)."""
    return {**official_inputs_and_query(named),
            **official_branches(named, "clip_encoder.branches", ["clip_encoder"]),
            **official_branches(named, "frame_encoder.branches", ["frame_encoder"]),
            "key_map.weight": named["mapping_linear.0.weight"], "value_map.weight": named["mapping_linear.1.weight"]}


@BACKBONES.register("msl", "MS-SL: 528 multi-scale clip proposals + key-clip guided frame attention, fused 0.7/0.3")
class MSSL(nn.Module):
    config_cls = MSLConfig
    provides: ClassVar[frozenset[str]] = frozenset({"clip_frame", "raw", "query_vector", "clip_vectors", "frame_mask",
                                                    "frame_tokens"})
    keep_frames = False  # also return the encoded frames (frame_tokens; set by a wrapper that reads them)
    official = ("HuiGuanLab/ms-sl", from_official)  # `evaluate --official-weights`: whose weights, and their map

    def __init__(self, cfg: MSLConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.query_encoder = QueryEncoder(query_dim, h, cfg.heads, cfg.max_query_len, cfg.input_dropout, cfg.dropout)
        self.clip_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.clip_encoder = GMMBlock(h, cfg.heads, [PLAIN], cfg.dropout)
        self.frame_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.frame_encoder = GMMBlock(h, cfg.heads, [PLAIN], cfg.dropout)
        self.key_map = nn.Linear(h, h, bias=False)  # mapping_linear[0]
        self.value_map = nn.Linear(h, h, bias=False)  # mapping_linear[1]
        init_weights(self, cfg.init_std)

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        return {"query": self.query_encoder(qb.tokens, qb.token_mask)}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        clips = self.clip_encoder(self.clip_embed(vb.clips))
        frames = self.frame_encoder(self.frame_embed(vb.frames, vb.frame_mask), vb.frame_mask)
        out = {"clips": clips, "frame_keys": self.key_map(frames), "frame_values": self.value_map(frames),
               "frame_mask": vb.frame_mask}
        if self.keep_frames:
            out["frames"] = frames
        return out

    def index_videos(self, v: Encoded) -> Encoded:
        """Query-independent work before scoring many queries: proposal norms, clip . frame
        keys and Gram matrices, computed once for the collection."""
        norms, clip_keys, gram = VideoSide.parts(v, proposal_matrix_like(v["clips"]))
        return {**v, "side.norms": norms, "side.clip_keys": clip_keys, "side.gram": gram}

    def score(self, q: Encoded, v: Encoded) -> Scores:
        side = VideoSide.of(v)
        per_query = side.clips.shape[0] * max(side.pool.shape[0], side.mask.shape[1])
        budget = self.cfg.eval_budget
        return score_in_chunks(lambda chunk: msl_scores(chunk["query"], side, budget, self.cfg.clip_weight), q,
                               per_query, budget)

    def clip_scores(self, q: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> Scores:
        """The clip branch alone (fused = clip), for a wrapper with its own frame branch."""
        side = VideoSide.of(v)
        budget = self.cfg.eval_budget
        return score_in_chunks(lambda chunk: msl_clip_scores(chunk["query"], side, budget), q,
                               side.clips.shape[0] * side.pool.shape[0], budget)
