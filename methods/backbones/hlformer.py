"""HLFormer (Li et al., ICCV 2025): GMMFormer v2's dynamic block with Lorentz attention branches.

Each video encoder (clip, frame) has one HLFormer block: four Euclidean Gaussian branches (post-LN
attention + 4x feed-forward, widths plain / 2 / 4 / 8: GMMFormer v2's `GaussianBranches`) next to
four Lorentz ones with the same widths (`LorentzBranches`), fused per position by GMMFormer v2's
branch weights, which here a token equal to each sequence's mean reads off every branch (the
paper's Mean-Guided Adaptive Interaction Module; v2 learns one token). The query encoder, the
scores and their fusion are GMMFormer v2's: clip score the best cosine over the 32 clips, frame
score the best cosine over the frames, test score 0.7 clip + 0.3 frame.

A Lorentz branch (curvature 1, fixed, as the reference's manifold): LN -> Linear(hidden, 127) ->
ReLU, times a learned scale <= 1, exp_0 onto the hyperboloid H^127; per head, Lorentz linear
maps give q, k, v on H^31; logits -|q - k|_L^2 / s + b (s, b learned), multiplied by the Gaussian
window, softmax over the real keys; each output the Lorentzian centroid of the values; back with
the reference's log map of the concatenated heads; divided by the scale; LN -> Linear(127,
hidden) -> ReLU; then the post-LN residual and feed-forward of the Euclidean branches.

For the partial-order loss (L_pop, methods/objectives/hlformer.py) the encoders also give the
query and video on the hyperboloid of a learned curvature c (`lorentz.*` keys, output
`lorentz`): exp_0 of the query vector and of the mean of the attention-pooled frames and
clips, each times a learned scale <= 1. These embeddings take no part in the scores.

The learned curvature and scales are kept in their ranges as the reference keeps them: clamped
in place before each use (a projection, not a clamp in the graph, so a parameter at its bound
still moves back). Padding: with `padded_frames=exclude` every map runs on real rows, attention and
pooling exclude padded frames, and the fusion token is the mean of the real rows; the preset's
`zero` (the reference's: frames padded to 128, the padding rows encoded and averaged into the
token, a shorter video's frame max at least 0; `blocks.encode_frames`) is what matched the
official code. docs/methods/hlformer.md has the equations and the reference's quirks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import DROPOUT, FLAG, NON_NEGATIVE, POSITIVE, PROBABILITY, ListOf, Range, at_least, \
    one_of, param, require
from prvr.harness.base.contract import Encoded, Scores
from prvr.harness.base.registry import BACKBONES
from prvr.methods.backbones import hyperbolic as H
from prvr.harness.base.io import UserError
from prvr.methods.backbones.blocks import (AttentionPool, BranchLayerNorm, BranchLinear, DynamicGMMBlock,
                                           GaussianBranches, InputEmbedding, PaddedFrames, QueryEncoder,
                                           best_clip_scores, check_heads, clip_frame_scores, encode_frames, full_mask,
                                           gaussian_attention, init_weights, official_branches, official_cross,
                                           official_inputs_and_query, official_per_branch, official_post, pack,
                                           score_in_chunks, unpack, windows, with_units)

ATTENTION_CURVATURE = 1.0  # the Lorentz attention's manifold: the reference's geoopt Lorentz(k=1), not learned
LORENTZ_KEYS = ("lorentz.query", "lorentz.video", "lorentz.curvature")  # the `lorentz` output (encode_* keys)


@dataclass
class HLFormerConfig:
    hidden: int = param(384, at_least(1))  # ICCV25-HLFormer src/Configs/*.py hidden_size
    heads: int = param(4, at_least(1))  # n_heads (Euclidean and Lorentz attention)
    input_dropout: float = param(0.2, DROPOUT)  # input_drop (TVR; ActivityNet 0.31, Charades 0.25 in the preset)
    dropout: float = param(0.2, DROPOUT)  # drop (TVR; ActivityNet 0.31, Charades 0.25 in the preset)
    # Euclidean branches: attention_num 8 = 4 Euclidean + 4 Lorentz, widths None, 2^1, 2^2, 2^3; 0 = plain
    widths: list[float] = param([0.0, 2.0, 4.0, 8.0], ListOf(NON_NEGATIVE))
    lorentz_widths: list[float] = param([0.0, 2.0, 4.0, 8.0], ListOf(NON_NEGATIVE))  # the Lorentz branches'
    lorentz_dim: int = param(127, at_least(1))  # lorentz_dim: space dims of H^d; d + 1 splits across the heads
    ffn_mult: int = param(4, at_least(1))  # FeedForward(hidden, 4 * hidden) of both attention blocks
    temperature: float = param(0.09, POSITIVE)  # sft_factor: softmax temperature of the branch weights (TVR)
    num_clips: int = param(32, at_least(1))  # frame_len of the clip block's fusion head (map_size 32)
    max_frames: int = param(128, at_least(1))  # frame_len of the frame block; max_ctx_l; the frame windows' span
    max_query_len: int = param(30, at_least(1))  # max_desc_l
    clip_weight: float = param(0.7, PROBABILITY)  # clip_scale_w (0.7 on all three datasets); frame 1 - w
    # curv_init: curvature c of L_pop's hyperboloid (curvature -c); must be > 0
    curvature: float = param(1.0, POSITIVE)
    learn_curvature: bool = param(True, FLAG)  # learn_curv_bool
    # the learned c stays in [curvature / r, curvature * r] (the reference: r = 10)
    curvature_range: float = param(10.0, Range(1))
    init_std: float = param(0.02, POSITIVE)  # initializer_range
    # exclude: padded frames take no part (ours); zero: the reference's frames padded to max_frames with
    # zero features, whose encoded rows count in the fusion token's mean and score 0 in the frame max
    padded_frames: PaddedFrames = param("exclude", one_of(PaddedFrames))
    eval_budget: int = param(1 << 24, at_least(1))  # ours: max [queries, videos, frames] elements when scoring

    def check(self, key: str) -> None:
        check_heads(self, key)
        require((self.lorentz_dim + 1) % self.heads == 0,
                f"config key '{key}.lorentz_dim' ({self.lorentz_dim}) + 1 must be a multiple of '{key}.heads' "
                f"({self.heads}): each head holds a point of H^((lorentz_dim + 1) / heads - 1)")


def project_(p: nn.Parameter, low: float | None = None, high: float | None = None) -> nn.Parameter:
    """Clamp a parameter in place into [low, high], outside autograd, and return it: the
    reference's `p.data = clamp(p.data, ...)` before each use."""
    with torch.no_grad():
        p.clamp_(low, high)
    return p


class LorentzBranches(GaussianBranches):
    """len(widths) parallel Lorentz attention layers (HLFormer's Lorentz attention block): the
    Euclidean branches' residual and feed-forward sub-layers (`post`) around a Lorentz
    multi-head attention in place of their q, k, v map. Returns [branches, N, hidden] as they do."""

    def __init__(self, hidden: int, heads: int, widths: list[float], lorentz_dim: int, dropout: float,
                 ffn_mult: int, window_len: int | None, init_std: float) -> None:
        super().__init__(hidden, heads, widths, dropout, ffn_mult, window_len)
        del self.qkv  # the Euclidean q, k, v map; the Lorentz linear maps below replace it
        n, point = len(widths), lorentz_dim + 1
        self.point = point
        self.in_norm, self.in_proj = BranchLayerNorm(n, hidden), BranchLinear(n, hidden, lorentz_dim)
        self.out_norm, self.out_proj = BranchLayerNorm(n, lorentz_dim), BranchLinear(n, lorentz_dim, hidden)
        self.log_scale = nn.Parameter(torch.full((n,), -0.5 * math.log(lorentz_dim)))  # scale_alpha, kept <= 0
        # LorentzLinear of q, k, v (no bias), one [point, point] map each, and their time scales (init 2.3)
        self.qkv_weight = nn.Parameter(torch.empty(n, point, 3 * point).normal_(0.0, init_std))
        self.log_time_scale = nn.Parameter(torch.full((n, 3), 2.3))
        self.logit_scale = nn.Parameter(torch.full((n,), math.sqrt(point)))  # attention `scale`, init sqrt(d + 1)
        self.logit_bias = nn.Parameter(torch.zeros(n))  # attention `bias`
        self.in_drop, self.point_drop, self.out_drop = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def reference_parts(self) -> dict[str, int]:
        """No q/k/v product here (harness/engine/optim.py): the Lorentz maps' own tensors are clipped
        whole; the per-branch maps and norms (BranchLinear, BranchLayerNorm) split themselves."""
        return {}

    def forward(self, x: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        rows = pack(x, mask)
        return self.post(self.lorentz_context(rows, mask, keys), rows[None])

    def lorentz_context(self, rows: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of `mask` [N, hidden] -> each branch's attention output [branches, N, hidden], each
        row attending to those of `keys` (default: `mask`)."""
        n, heads, c = len(self.widths), self.heads, ATTENTION_CURVATURE
        scale = project_(self.log_scale, high=0.0).exp()[:, None, None]
        tangent = F.relu(self.in_proj(self.in_drop(self.in_norm(rows.expand(n, -1, -1)))), inplace=True) * scale
        points = H.full(H.expmap0(tangent, c, H.ATTENTION_EXP_MAX), c)  # [n, N, point]
        raw = unpack(torch.bmm(self.point_drop(points), self.qkv_weight), mask, dim=1)  # [n, B, L, 3 point]
        b, length = mask.shape
        raw = raw.view(n, b, length, 3, heads, self.point // heads).permute(3, 0, 1, 4, 2, 5)  # [3, n, B, h, L, p]
        time_scale = self.log_time_scale.t()[:, :, None, None, None, None]  # [3, n, 1, 1, 1, 1]
        q, k, v = (H.onto_hyperboloid(raw[i], time_scale[i], c) for i in range(3))
        logits = (-H.squared_distance(q, k, c) / self.logit_scale.view(n, 1, 1, 1, 1)
                  + self.logit_bias.view(n, 1, 1, 1, 1))
        key_mask = mask if keys is None else keys
        probs = gaussian_attention(logits, self.windows(length, rows)[:, None, None], key_mask[None, :, None, None, :])
        ctx = H.centroid(v, probs, c).permute(0, 1, 3, 2, 4).reshape(n, b, length, self.point)
        tangent = H.concatenated_logmap0(pack(ctx, mask, dim=1)) / scale  # [n, N, point - 1]
        return F.relu(self.out_proj(self.out_drop(self.out_norm(tangent))), inplace=True)

    def windows(self, length: int, like: torch.Tensor) -> torch.Tensor:
        """The branches' Gaussian windows [branches, length, length] on like's device and dtype."""
        return windows(self.widths, length, self.window_len, like.device).to(like.dtype)


class HLFormerBlock(DynamicGMMBlock):
    """The HLFormer block: Euclidean Gaussian branches (`branches`) and Lorentz ones (`lorentz`),
    fused per position by GMMFormer v2's branch weights (`branch_weights`), read by the mean of
    the branches' outputs over each sequence's real rows, or by `token` where one is given."""

    def __init__(self, cfg: HLFormerConfig, positions: int, window_len: int | None = None) -> None:
        super().__init__(cfg.hidden, cfg.heads, cfg.widths, cfg.dropout, cfg.ffn_mult, positions, cfg.temperature,
                         window_len)
        self.lorentz = LorentzBranches(cfg.hidden, cfg.heads, cfg.lorentz_widths, cfg.lorentz_dim, cfg.dropout,
                                       cfg.ffn_mult, window_len, cfg.init_std)

    def outputs(self, x: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """The Euclidean branches' outputs, then the Lorentz ones: [branches, N, D]."""
        return torch.cat([self.branches(x, mask, keys), self.lorentz(x, mask, keys)])


# ----------------------------------------------------------------------------- the reference's weights
OFFICIAL_WIDTHS = [0.0, 2.0, 4.0, 8.0]  # HLFormerBlock's e_attns and h_attns: plain, then wid = 2 ** i, i = 1 .. 3


def official_lorentz(named: dict[str, torch.Tensor], ours: str, layers: list[str]) -> dict[str, torch.Tensor]:
    """`LorentzBranches` at `ours` from the official LorentzAttentionBlocks `layers`, one per branch: the
    input and output LinearLayers of their LorentzSelfAttention (`self.input_proj`, `self.output_proj`:
    LayerNorm and `net.1`) as our in / out norms and maps, its `scale_alpha` as the branch's log scale; of
    its LorentzMultiHeadedAttention, the q / k / v LorentzLinear maps (`linear_query`, `linear_keys`,
    `linear_values`: an nn.Linear `weight` without bias, transposed into the [point, 3 point] product, and
    the time `scale` each) and the attention's `scale` and `bias`; then the block's feed-forward and norms
    as the Euclidean branches'."""
    att = [f"{a}.self" for a in layers]
    heads = [f"{a}.lorentz_multiattention" for a in att]
    maps = {"in_proj": "input_proj.net.1", "out_proj": "output_proj.net.1"}
    norms = {"in_norm": "input_proj.LayerNorm", "out_norm": "output_proj.LayerNorm"}
    qkv = ("linear_query", "linear_keys", "linear_values")
    return {**official_per_branch(named, ours, att, maps, norms),
            **official_per_branch(named, ours, layers, *official_post(ffn=True)),
            f"{ours}.log_scale": torch.stack([named[f"{a}.scale_alpha"].reshape(()) for a in att]),
            f"{ours}.qkv_weight": torch.stack([torch.cat([named[f"{h}.{m}.weight.weight"].t() for m in qkv], 1)
                                               for h in heads]),
            f"{ours}.log_time_scale": torch.stack([torch.stack([named[f"{h}.{m}.scale"].reshape(()) for m in qkv])
                                                   for h in heads]),
            f"{ours}.logit_scale": torch.stack([named[f"{h}.scale"].reshape(()) for h in heads]),
            f"{ours}.logit_bias": torch.stack([named[f"{h}.bias"].reshape(()) for h in heads])}


def from_official(named: dict[str, torch.Tensor], cfg: HLFormerConfig) -> dict[str, torch.Tensor]:
    """The weights of the official HLFormer (lijun2005/ICCV25-HLFormer, HLFormer_Net's `state_dict`,
    which its checkpoint keeps under `state_dict`) as this backbone's: the query encoder and input layers
    as every MS-SL-family reference names them (a Euclidean attention block with a feed-forward); the
    clip encoder `clip_encoder` and frame encoder `frame_encoder_1`, each an HLFormerBlock of Euclidean
    layers `e_attns.0` .. `e_attns.3` (GMMFormer v2's), Lorentz ones `h_attns.0` .. `h_attns.3`
    (`official_lorentz`), the cross-attention `ca` and the weight map `layer1`, `layer2`; the pooling of
    the frames and clips for L_pop (`modular_vector_mapping_2`, `_3`), its curvature `curv` and the query
    and video scales (`textual_alpha`, `video_alpha`), all three kept as logs on both sides; the attention
    manifold's fixed curvature (geoopt's `manifold.k`, wherever a module holds it) is read and checked to
    be 1. Only a model of the reference's widths reads them (one line otherwise)."""
    if list(cfg.widths) != OFFICIAL_WIDTHS or list(cfg.lorentz_widths) != OFFICIAL_WIDTHS:
        raise UserError(f"--official-weights: the official HLFormer has the widths {OFFICIAL_WIDTHS} in both its "
                        f"Euclidean and Lorentz branches; this run's model has {list(cfg.widths)} and "
                        f"{list(cfg.lorentz_widths)}, so its weights do not fit it")
    out = official_inputs_and_query(named, ffn=True)
    for mine, theirs in (("clip_block", "clip_encoder"), ("frame_block", "frame_encoder_1")):
        layers = range(len(OFFICIAL_WIDTHS))
        out.update(official_branches(named, f"{mine}.branches", [f"{theirs}.e_attns.{i}" for i in layers], ffn=True))
        out.update(official_lorentz(named, f"{mine}.lorentz", [f"{theirs}.h_attns.{i}" for i in layers]))
        out.update(official_cross(named, f"{mine}.cross", f"{theirs}.ca"))
        out.update({f"{mine}.{m}.{t}": named[f"{theirs}.{m}.{t}"] for m in ("layer1", "layer2") for t in ("weight", "bias")})
    # geoopt's Lorentz(k=1) keeps its curvature k in the state dict of every module that holds the manifold
    # (the model, each Lorentz block, its attention and its three LorentzLinear maps): fixed at 1 there, here
    for key in [k for k in named if k == "manifold.k" or k.endswith(".manifold.k")]:
        if not torch.allclose(named[key].double(), torch.tensor(ATTENTION_CURVATURE, dtype=torch.double)):
            raise UserError(f"--official-weights: {key} is {named[key].tolist()}, where the official HLFormer's "
                            f"attention manifold has curvature {ATTENTION_CURVATURE} and ours fixes it there; "
                            "another version of the code")
    out.update({"frame_pool.score.weight": named["modular_vector_mapping_2.weight"],
                "clip_pool.score.weight": named["modular_vector_mapping_3.weight"],
                "log_curvature": named["curv"].reshape(()), "log_query_scale": named["textual_alpha"].reshape(()),
                "log_video_scale": named["video_alpha"].reshape(())})
    return out


@BACKBONES.register("hlformer", "HLFormer: Euclidean and Lorentz Gaussian attention branches, mean-guided fusion")
class HLFormer(nn.Module):
    config_cls = HLFormerConfig
    official = ("lijun2005/ICCV25-HLFormer", from_official)  # `evaluate --official-weights`: whose weights, their map
    provides: ClassVar[frozenset[str]] = frozenset({"clip_frame", "raw", "query_vector", "clip_vectors", "frame_mask",
                                                    "frame_views", "frame_tokens", "lorentz"})

    def __init__(self, cfg: HLFormerConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.query_encoder = QueryEncoder(query_dim, h, cfg.heads, cfg.max_query_len, cfg.input_dropout, cfg.dropout,
                                          cfg.ffn_mult)
        self.clip_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.clip_block = HLFormerBlock(cfg, cfg.num_clips)
        self.frame_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.frame_block = HLFormerBlock(cfg, cfg.max_frames, window_len=cfg.max_frames)
        self.frame_pool, self.clip_pool = AttentionPool(h), AttentionPool(h)  # modular_vector_mapping_2, _3
        init_weights(self, cfg.init_std)
        # L_pop's hyperboloid: log c (curv), and the log scales of the query and video (textual_alpha, video_alpha)
        self.log_curvature = nn.Parameter(torch.tensor(math.log(cfg.curvature)), requires_grad=cfg.learn_curvature)
        self.log_query_scale = nn.Parameter(torch.tensor(-0.5 * math.log(h)))
        self.log_video_scale = nn.Parameter(torch.tensor(-0.5 * math.log(h)))

    def curvature(self) -> torch.Tensor:
        """c, kept within [curvature / range, curvature * range]."""
        c0, r = self.cfg.curvature, self.cfg.curvature_range
        return project_(self.log_curvature, math.log(c0 / r), math.log(c0 * r)).exp()

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        query = self.query_encoder(qb.tokens, qb.token_mask)
        scale = project_(self.log_query_scale, high=0.0).exp()
        return {"query": query, "lorentz.query": H.expmap0(query * scale, self.curvature())}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        clips = self.clip_block(self.clip_embed(vb.clips), None, None)  # token None: each sequence's mean
        frames = encode_frames(self.frame_embed, self.frame_block, vb, self.cfg.padded_frames, self.cfg.max_frames)
        video = (self.frame_pool(frames, vb.frame_mask) + self.clip_pool(clips, full_mask(clips))) / 2
        c, scale = self.curvature(), project_(self.log_video_scale, high=0.0).exp()
        return {"clips": clips, "frames": frames, "frame_mask": vb.frame_mask,
                "lorentz.video": H.expmap0(video * scale, c), "lorentz.curvature": c.expand(len(video))}

    def index_videos(self, v: Encoded) -> Encoded:
        """Query-independent work before scoring many queries: the unit clip and frame vectors."""
        return with_units(v, "clips", "frames")

    def score(self, q: Encoded, v: Encoded) -> Scores:
        per_query = v["frames"].shape[0] * v["frames"].shape[1]
        return score_in_chunks(lambda chunk: self._score(chunk, v), q, per_query, self.cfg.eval_budget)

    def _score(self, q: Encoded, v: Encoded) -> Scores:
        return clip_frame_scores(q["query"], v, self.cfg.clip_weight, self.cfg.padded_frames, self.cfg.max_frames)

    def clip_scores(self, q: Encoded, v: Encoded) -> Scores:
        """The clip branch alone (fused = clip), for a wrapper with its own frame branch (RAL)."""
        per_query = v["clips"].shape[0] * v["clips"].shape[1]
        return score_in_chunks(lambda chunk: best_clip_scores(chunk["query"], v), q, per_query, self.cfg.eval_budget)

    def frame_views(self) -> list[tuple[str, str, str]]:
        """(branch, query key, frames key): the frame branch (best cosine over frames), for the ARL detector."""
        return [("frame", "query", "frames")]
