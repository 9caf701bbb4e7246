"""RAL's modules (Zhang et al., RAL; docs/references.md): the Gaussian heads of MSRA
(Eq. 3-7), the query support set (Eq. 5) and CSA's word-confidence gate (Eq. 12); `RalModel`
gives a training step's Gaussians to the objective as a step output (`Gaussians`).

Every module takes padding masks and is invariant to padding (the reference's attention
poolings omit the mask; here padded rows never take part). Sizes at d = 384 reproduce the
reference's parameter counts: per modality, aggregator + mean and log-sigma heads 592,128
(the reference's PIENet + UncertaintyModule pair has the same count), the gate 148,225.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol, get_args

import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.base import masks
from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.contract import Backbone, Encoded, OnDemand, Scores, StepExtras
from prvr.harness.base.io import UserError
from prvr.methods.backbones.blocks import (PLAIN, UNIT, GMMBlock, PaddedFrames, init_weights, official_branches,
                                           official_linear_layer, pack, rowwise, unit, unpack)

Aggregation = Literal["both", "local", "global"]  # Table 4: g = LN(x^g + x^l), local only, global only
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)
Heads = Literal["paper", "code"]  # ral.heads: Eq. 3-7 as printed, or the reference's PIENet-style pair
HEADS: tuple[Heads, ...] = get_args(Heads)
PoolPadding = Literal["masked", "code"]  # ral.pool_padding: attention over real rows, or the reference's padded rows
TextSource = Literal["support", "query"]  # loss.text_source, Table 4: X^q = Q_s (Eq. 5) or the query alone
# loss.msra_grad: which encoders L_DA and L_PM train besides MSRA's own heads (a diagnostic: docs/methods/ral.md,
# "MSRA on top of CSA costs the CSA branch"): both (the paper, the code), text (the token encoder only: the heads
# read the backbone's frames detached), video (the frame encoder only: the heads read RAL's words detached),
# neither (the heads alone; the ranked score is then CSA's, trained by the base losses only)
MsraGrad = Literal["both", "text", "video", "neither"]
MSRA_GRADS: tuple[MsraGrad, ...] = get_args(MsraGrad)
GAUSSIANS = "ral.gaussians"  # the key of a training step's `Gaussians` in its extras (`RalModel.step_extras`)


# ----------------------------------------------------------------------------- CSA (Eq. 11-12)
def word_confidences(logits: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 12's g: a softmax over each query's real words (padding gets 0). logits [Q, L]."""
    return logits.masked_fill(~token_mask, float("-inf")).softmax(-1)


class _BestFrame(torch.autograd.Function):
    """best[n, v] = max over the real frames t of video v of <words[n], frames[v, t]>:
    words [N, d] (a batch's real words, `pack`ed), frames [V, T, d], frame_mask [V, T] -> [N, V].

    The gradient is autograd's for a max (each word's gradient goes to its best frame), as two
    products with the sparse [N, V T] matrix holding one entry per (word, video): N V d
    multiply-adds, where autograd builds the dense [N, V, T] gradient and runs two products
    over it (T times more). Only the best frames' indices are kept for the backward."""

    @staticmethod
    def forward(ctx, words, frames, frame_mask):
        best, index = _word_frame_sims(words, frames, frame_mask).max(-1)
        ctx.save_for_backward(words, frames, index)
        return best

    @staticmethod
    def backward(ctx, grad):
        words, frames, index = ctx.saved_tensors
        (n, d), (v, t) = words.shape, frames.shape[:2]
        word = torch.arange(n, device=index.device).view(n, 1).expand(n, v)
        best_row = index + (torch.arange(v, device=index.device) * t).view(1, v)  # in frames viewed [V T, d]
        # The indices are valid by construction, so no invariant check. Torch 2.11 warns about
        # implicitly disabled checks even where check_invariants=False is passed; opting out through
        # the context as well silences it (tests/test_ral_objectives.py).
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            routes = torch.sparse_coo_tensor(torch.stack([word.reshape(-1), best_row.reshape(-1)]), grad.reshape(-1),
                                             (n, v * t), check_invariants=False)
            grad_words = grad_frames = None
            if ctx.needs_input_grad[0]:
                grad_words = torch.sparse.mm(routes, frames.reshape(v * t, d))
            if ctx.needs_input_grad[1]:
                grad_frames = torch.sparse.mm(routes.t(), words).view_as(frames)
        return grad_words, grad_frames, None


def _word_frame_sims(words: torch.Tensor, frames: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """<words[n], frames[v, t]> [N, V, T] for words [N, d], padded frames at -inf."""
    v, t, d = frames.shape
    sims = (words @ frames.reshape(v * t, d).t()).view(words.shape[0], v, t)
    return masks.keep_where(sims, frame_mask[None], float("-inf"))


def _weighted_sum(best: torch.Tensor, token_mask: torch.Tensor, weights: torch.Tensor, packed: bool) -> torch.Tensor:
    """sum_i g_i best_i over each query's real words: best [N, V] for the real words (`packed`) or
    [Q L, V] for every word -> [Q, V]. The words go back to [Q, V, L] (zero on padding) so that every
    path sums them in the same order."""
    q, length = token_mask.shape
    if packed:
        per_word = unpack(best, token_mask).transpose(1, 2)  # [Q, V, L], zero on padded words
    else:
        per_word = masks.keep_where(best.view(q, length, -1).transpose(1, 2), token_mask[:, None, :], 0.0)
    return (per_word.contiguous() * weights[:, None, :]).sum(-1)


def _floored(best: torch.Tensor, floor: torch.Tensor | None) -> torch.Tensor:
    """Word maxima [words, V] of the videos of `floor` [V] at least 0 (`csa_scores`)."""
    return best if floor is None else torch.where(floor[None], best.clamp_min(0.0), best)


def csa_scores(tokens: torch.Tensor, token_mask: torch.Tensor, weights: torch.Tensor, frames: torch.Tensor,
               frame_mask: torch.Tensor, budget: int = 1 << 24, cosine: bool = True,
               floor: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 11-12: S(q, v) = sum_i g_i max_j sim(q_i, v_j) over real words i and real frames j.

    tokens [Q, L, d], token_mask [Q, L], weights [Q, L] (zero on padding), frames [V, T, d],
    frame_mask [V, T]; -> [Q, V]. `cosine`: cosine similarity (False: raw dot products, the
    reference's unnormalised score for NCE). Computed over chunks of videos so that the
    [Q, chunk, L, T] similarities stay within `budget` elements; with gradients each chunk keeps
    only the index of each word's best frame (`_BestFrame`), not the similarities, and the
    backward costs Q V L d instead of 2 Q V L T d. With gradients, and when ranking on the CPU,
    only the real words are scored (`pack`: a third of a batch's words are padding); ranking on
    the CPU also scores videos of like lengths together, each chunk cut at its longest video
    (`_csa_ranked_cpu`). The paths' products have other shapes, so their scores agree to float
    rounding, not always to the last digit (tests/test_ral_objectives.py).

    `floor` [V] bool: videos whose every word scores at least 0, as if a zero frame were among
    their frames (the reference pads each video's encoded frames to 128 with zero vectors, which
    take part in the max: `ral.padded_frames=zero`)."""
    if cosine:
        tokens, frames = F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1)
    q, length = tokens.shape[:2]
    v, t = frames.shape[:2]
    graded = torch.is_grad_enabled() and (tokens.requires_grad or frames.requires_grad)
    if not graded and masks.host_holds(frames):
        return _csa_ranked_cpu(tokens, token_mask, weights, frames, frame_mask, budget, floor)
    # with gradients the real words are read off the loader's description of the mask (no device sync);
    # ranking on a GPU scores every word (an undescribed mask would be asked for its real words)
    words = pack(tokens, token_mask) if graded else tokens.flatten(0, 1)
    step = max(1, budget // max(1, q * length * t))  # the chunks do not depend on the packing: the
    parts = []  # gradient of a word sums over them in the same order
    for s in range(0, v, step):
        if graded:
            best = _BestFrame.apply(words, frames[s : s + step], frame_mask[s : s + step])  # [N, chunk]
        else:  # ranking: the same maxima without their frames' indices (amax: one vectorised pass)
            best = _word_frame_sims(words, frames[s : s + step], frame_mask[s : s + step]).amax(-1)
        floored = _floored(best, None if floor is None else floor[s : s + step])
        parts.append(_weighted_sum(floored, token_mask, weights, packed=graded))
    return torch.cat(parts, 1) if parts else tokens.new_zeros((q, 0))


def _csa_ranked_cpu(tokens: torch.Tensor, token_mask: torch.Tensor, weights: torch.Tensor, frames: torch.Tensor,
                    frame_mask: torch.Tensor, budget: int, floor: torch.Tensor | None) -> torch.Tensor:
    """`csa_scores` without gradients on the CPU, where every element scored costs time: the real
    words only, the videos in chunks of like lengths (sorted by their count of real frames, a
    chunk's frames cut at its longest video where every video's real frames are its first, as the
    loader pads them), each chunk as large as `budget` allows at its real words x videos x frames."""
    q, length = token_mask.shape
    v = frames.shape[0]
    words = pack(tokens, token_mask)
    n = max(1, words.shape[0])
    counts = frame_mask.sum(1)
    order = torch.argsort(counts, stable=True)
    prefix = bool((frame_mask == (torch.arange(frame_mask.shape[1]) < counts[:, None])).all())
    extents = counts[order].tolist() if prefix else [frame_mask.shape[1]] * v  # else no chunk is cut
    out = tokens.new_empty((q, v))
    start = 0
    while start < v:
        end = start + 1
        while end < v and n * (end + 1 - start) * max(1, extents[end]) <= budget:
            end += 1
        extent = max(1, extents[end - 1])
        chunk = order[start:end]
        best = _word_frame_sims(words, frames[chunk, :extent], frame_mask[chunk, :extent]).amax(-1)
        floored = _floored(best, None if floor is None else floor[chunk])
        out[:, chunk] = _weighted_sum(floored, token_mask, weights, packed=True)
        start = end
    return out


def csa_reference(tokens: torch.Tensor, token_mask: torch.Tensor, weights: torch.Tensor, frames: torch.Tensor,
                  frame_mask: torch.Tensor, cosine: bool = True, floor: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, one pair at a time, differentiated by autograd (tests only)."""
    unit = (lambda x: F.normalize(x, dim=-1)) if cosine else (lambda x: x)
    out = tokens.new_zeros((tokens.shape[0], frames.shape[0]))
    for i in range(tokens.shape[0]):
        words = unit(tokens[i][token_mask[i]])
        for j in range(frames.shape[0]):
            fr = unit(frames[j][frame_mask[j]])
            if floor is not None and floor[j]:  # one zero frame among the real ones
                fr = torch.cat([fr, fr.new_zeros((1, fr.shape[1]))])
            out[i, j] = (weights[i][token_mask[i]] * (words @ fr.t()).max(1).values).sum()
    return out


class GatedAttentionPool(nn.Module):
    """Eq. 6, local: x^l = softmax(w2 tanh(W1 X)) X over the real rows, W1 in R^{width x d}
    (width d in the paper's reading, d / 2 in the reference's), w2 in R^width.

    `zero_rows` [B] (optional) counts zero vectors that take part in the softmax besides the
    rows of `mask`: each has logit w2 tanh(0) = 0 and adds nothing to the sum, so they only
    shrink the weights of the others (the reference pools, unmasked, over rows padded with zeros)."""

    def __init__(self, hidden: int, width: int = 0) -> None:
        super().__init__()
        width = width or hidden
        self.w1 = nn.Linear(hidden, width, bias=False)
        self.w2 = nn.Linear(width, 1, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, zero_rows: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.w2(torch.tanh(self.w1(x))).squeeze(-1).masked_fill(~mask, float("-inf"))
        if zero_rows is not None:  # one extra column of logit log(n) stands for n rows of logit 0
            extra = torch.log(zero_rows.to(logits.dtype))[:, None]
            return torch.einsum("bl,bld->bd", torch.cat([logits, extra], 1).softmax(-1)[:, :-1], x)
        return torch.einsum("bl,bld->bd", logits.softmax(-1), x)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real rows of each item: [B, L, d], [B, L] -> [B, d]."""
    w = mask.to(x.dtype)
    return torch.einsum("bl,bld->bd", w, x) / w.sum(-1, keepdim=True).clamp_min(1)


class Aggregator(nn.Module):
    """Eq. 6-7: g(X) = LayerNorm(FC(MeanPool(X)) + GatedAttention(X)); `mode` local or global
    keeps one term (Table 4)."""

    def __init__(self, hidden: int, mode: str = "both") -> None:
        super().__init__()
        if mode not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {mode!r}")
        self.mode = mode
        self.fc = nn.Linear(hidden, hidden)
        self.local = GatedAttentionPool(hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attend: torch.Tensor | None = None,
                zero_rows: torch.Tensor | None = None) -> torch.Tensor:
        """`mask`: the real rows (the mean); `attend` (default `mask`) and `zero_rows`: what the
        attention pooling sees (`GatedAttentionPool`)."""
        parts = []
        if self.mode in ("both", "global"):
            parts.append(self.fc(masked_mean(x, mask)))
        if self.mode in ("both", "local"):
            parts.append(self.local(x, mask if attend is None else attend, zero_rows))
        return self.norm(sum(parts))


class GaussianHead(nn.Module):
    """Eq. 3: mu = h_mu(g(X)), log sigma = h_sigma(g(X)), one diagonal Gaussian per item."""

    def __init__(self, hidden: int, mode: str = "both") -> None:
        super().__init__()
        self.aggregate = Aggregator(hidden, mode)
        self.mu = nn.Linear(hidden, hidden)
        self.log_sigma = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attend: torch.Tensor | None = None,
                zero_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.aggregate(x, mask, attend, zero_rows)
        return self.mu(g), self.log_sigma(g)


class CodeGaussianHead(nn.Module):
    """The reference's Gaussian head (RAL-PRVR: a PIENet for the mean, an uncertainty module
    for log sigma), for parity runs (`ral.heads=code`); the same parameter count as
    `GaussianHead` at every d (592,128 at d = 384):

        p     = MeanPool(X) (the text side), or unit(MeanPool(unit(X))) (the video side: the
                mean of the L2-normalised frames, normalised; `unit_pool`)
        mu    = LayerNorm(p + sigmoid(FC(A_mu(X))))
        log s = FC(A_s(X)) + FC'(p)

    A_mu, A_s: gated attention poolings of width d / 2, each its own. No linear map stands
    between the aggregate and mu, so the proxies of L_PM are the pooled features themselves,
    shifted by a bounded residual and normalised."""

    def __init__(self, hidden: int, unit_pool: bool = False) -> None:
        super().__init__()
        self.unit_pool = unit_pool
        self.mean_pool = GatedAttentionPool(hidden, hidden // 2)
        self.mean_fc = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.sigma_pool = GatedAttentionPool(hidden, hidden // 2)
        self.sigma_fc = nn.Linear(hidden, hidden)
        self.sigma_pooled_fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attend: torch.Tensor | None = None,
                zero_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        attend = mask if attend is None else attend
        pooled = F.normalize(masked_mean(F.normalize(x, dim=-1), mask), dim=-1) if self.unit_pool else masked_mean(x, mask)
        mu = self.norm(pooled + torch.sigmoid(self.mean_fc(self.mean_pool(x, attend, zero_rows))))
        log_sigma = self.sigma_fc(self.sigma_pool(x, attend, zero_rows)) + self.sigma_pooled_fc(pooled)
        return mu, log_sigma


def official_gaussian_head(named: dict[str, torch.Tensor], ours: str, pie: str, uncertain: str,
                           sigma: str = "sigma") -> dict[str, torch.Tensor]:
    """A `CodeGaussianHead` at `ours` (or DreamPRVR's latent sampler, whose variance parts are named
    `var`: `sigma`) from the reference's PIENet `pie` (its attention's `w_1`, `w_2`, `fc`, `layer_norm`)
    and uncertainty module `uncertain` (its attention, `fc` on the attention, `fc2` on the pooled vector),
    as RAL-PRVR and DreamPRVR name them."""
    no_bias = [("mean_pool.w1", f"{pie}.attention.w_1"), ("mean_pool.w2", f"{pie}.attention.w_2"),
               (f"{sigma}_pool.w1", f"{uncertain}.attention.w_1"), (f"{sigma}_pool.w2", f"{uncertain}.attention.w_2")]
    with_bias = [("mean_fc", f"{pie}.fc"), ("norm", f"{pie}.layer_norm"), (f"{sigma}_fc", f"{uncertain}.fc"),
                 (f"{sigma}_pooled_fc", f"{uncertain}.fc2")]
    return {**{f"{ours}.{m}.weight": named[f"{t}.weight"] for m, t in no_bias},
            **{f"{ours}.{m}.{p}": named[f"{t}.{p}"] for m, t in with_bias for p in ("weight", "bias")}}


def gaussian_heads(hidden: int, heads: str, aggregation: str) -> tuple[nn.Module, nn.Module]:
    """(text head, video head) of `ral.heads`: the paper's Eq. 3-7 or the reference's form."""
    if heads not in HEADS:
        raise ValueError(f"heads must be one of {', '.join(HEADS)}, got {heads!r}")
    if heads == "paper":
        return GaussianHead(hidden, aggregation), GaussianHead(hidden, aggregation)
    if aggregation != "both":
        raise UserError(f"config key 'ral.aggregation' is '{aggregation}', which only the paper's heads have; "
                        "use ral.heads=paper with it, or ral.aggregation=both with ral.heads=code")
    return CodeGaussianHead(hidden), CodeGaussianHead(hidden, unit_pool=True)


class ConfidenceGate(nn.Module):
    """Eq. 12: g = MLP(Q), two linear layers with a ReLU between; one logit per word (the
    masked softmax over words is `objectives.ral.word_confidences`)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens).squeeze(-1)


def support_sets(tokens: torch.Tensor, mask: torch.Tensor, video_of_query: torch.Tensor,
                 num_videos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5: for each video of the batch, the real tokens of all its labelled queries in a
    row (query order kept), padded to the longest set: ([V, S, d], [V, S] mask). The labels
    decide the sets (`video_of_query`: each query's video column), never a detector; the
    capacity S is the batch's longest set, not a fixed count."""
    lengths = mask.sum(-1)
    per_video = torch.zeros(num_videos, dtype=torch.long, device=tokens.device).index_add_(0, video_of_query, lengths)
    longest = masks.largest_group(mask, video_of_query, num_videos)  # from the host's facts where known
    out = tokens.new_zeros((num_videos, max(longest, 1), tokens.shape[-1]))
    out_mask = torch.zeros((num_videos, max(longest, 1)), dtype=torch.bool, device=tokens.device)
    # each query's first slot in its video's set: the lengths of the video's earlier queries
    order = torch.argsort(video_of_query, stable=True)
    ends = torch.cumsum(lengths[order], 0)
    first_of_video = torch.cumsum(per_video, 0) - per_video  # where each video's run starts in `ends`
    start = torch.empty_like(lengths)
    start[order] = ends - lengths[order] - first_of_video[video_of_query[order]]
    slot = start[:, None] + torch.cumsum(mask.long(), 1) - 1  # [Q, L]: a real token's place in its set
    q_idx, t_idx = masks.true_pairs(mask)
    place = (video_of_query[q_idx], slot[q_idx, t_idx])
    out[place] = tokens[q_idx, t_idx]
    out_mask[place] = torch.ones_like(q_idx, dtype=torch.bool)  # not `= True`: a host scalar copied to the GPU
    return out, out_mask



# ----------------------------------------------------------------------------- MSRA's Gaussians of a step
@dataclass(frozen=True)
class Gaussians:
    """MSRA's diagonal Gaussians of a training batch (Eq. 3-5), what L_DA and L_PM read.

    mu_text, log_sigma_text: [N, d], one per text: each video's query support set (N = the
    batch's videos; Eq. 5) or each query alone (N = its queries; `loss.text_source=query`);
    mu_video, log_sigma_video: [V, d], one per video of the batch; video_of_text: [N] each
    text's video column. The means are L2-normalised with `loss.normalize_mean`."""

    mu_text: torch.Tensor
    log_sigma_text: torch.Tensor
    mu_video: torch.Tensor
    log_sigma_video: torch.Tensor
    video_of_text: torch.Tensor


class GaussianSettings(Protocol):
    """The `loss` settings a step's Gaussians depend on (methods/ral.py `RalLossConfig`), given to
    `RalModel` when it is built: `text_source` (TEXT_SOURCES), `msra_grad` (MSRA_GRADS),
    `normalize_mean`."""

    text_source: str
    msra_grad: str
    normalize_mean: bool


# ----------------------------------------------------------------------------- RAL on a backbone
class PositionLayer(Protocol):
    """Learned positions, their LayerNorm and dropout (`Positions`, or the base query encoder's
    input layer, `blocks.InputEmbedding`)."""

    @property
    def positions(self) -> nn.Embedding: ...

    @property
    def norm(self) -> nn.Module: ...

    @property
    def drop(self) -> nn.Module: ...


class HomeConfig(Protocol):
    """What RAL reads of its home backbone's `model` section (MS-SL, GMMFormer, GMMFormer v2)."""

    hidden: int
    heads: int
    input_dropout: float
    dropout: float
    max_frames: int
    clip_weight: float
    init_std: float


class HomeBackbone(Backbone, Protocol):
    """The backbones RAL wraps (MS-SL, GMMFormer, GMMFormer v2): a `Backbone` that returns its
    encoded frames once `keep_frames` is set, scores its clip branch alone (`clip_scores`) and
    has a query encoder whose input layer (`query_encoder.embed`) holds the positions RAL's
    token encoder shares."""

    keep_frames: bool

    @property
    def cfg(self) -> HomeConfig: ...

    @property
    def query_encoder(self) -> Any: ...  # its `embed`: a `PositionLayer`

    def clip_scores(self, queries: Encoded, videos: Encoded, /) -> Scores: ...

    def frame_views(self) -> list[tuple[str, str, str]]: ...


class Positions(nn.Module):
    """Learned positions, their LayerNorm and dropout: the part of the MS-SL family's input layer
    (`blocks.InputEmbedding`) that RAL's token encoder takes from the base query encoder, or
    owns with `ral.share_positions=false`."""

    def __init__(self, max_len: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.positions = nn.Embedding(max_len, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(dropout)


class TokenEncoder(nn.Module):
    """RAL's query encoder for the frame branch (appendix A: the reference gives the frame
    branch its own query encoder with token-level output): its own input map and attention
    layer on the query tokens, with the base query encoder's learned positions and their
    LayerNorm (the reference shares `query_pos_embed` between its two query encoders) or, when
    `positions` is None, its own."""

    def __init__(self, positions: PositionLayer | None, query_dim: int, hidden: int, heads: int,
                 input_dropout: float, dropout: float, ffn_mult: int = 0, max_len: int = 0) -> None:
        super().__init__()
        # shared: not owned, so counted and saved once, in the base
        self._positions: tuple[PositionLayer, ...] = (positions,) if positions is not None else ()
        self.own_positions = Positions(max_len, hidden, input_dropout) if positions is None else None
        self.in_norm = nn.LayerNorm(query_dim)
        self.in_drop = nn.Dropout(input_dropout)
        self.linear = nn.Linear(query_dim, hidden)
        self.layer = GMMBlock(hidden, heads, [PLAIN], dropout, ffn_mult)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = self._positions[0] if self._positions else self.own_positions
        assert pos is not None  # shared, or its own
        h = rowwise(lambda r: F.relu(self.linear(self.in_drop(self.in_norm(r))), inplace=True), tokens, mask)
        h = pos.drop(pos.norm(h + pos.positions.weight[: tokens.shape[1]]))
        return self.layer(h, mask)


class RalModel(nn.Module):
    """A backbone with RAL in its frame branch (appendix A, Fig. 9): the clip branch is the
    backbone's, unchanged; with CSA the frame score is Eq. 11-12 over the token encoder's words
    and the backbone's encoded frames, and the ranked score fuses the two; MSRA adds the
    Gaussian heads, which only the losses read: a training step's Gaussians are one of its
    outputs (`step_extras`), computed where the objective reads them, by the `loss` settings
    given here (`GaussianSettings`). With both off it is the backbone itself."""

    def __init__(self, base: HomeBackbone, settings: Any, query_dim: int, loss: GaussianSettings) -> None:
        super().__init__()
        # settings: section `ral` (methods/ral.py RalConfig, a floor above)
        self.base: HomeBackbone = base
        self.settings, self.loss_settings = settings, loss
        base.keep_frames = True  # the backbones that return their encoded frames only when asked
        bc = base.cfg
        self.provides = base.provides
        self.config_cls = type(bc)
        self.tokens: TokenEncoder | None = None
        if settings.msra or settings.csa:
            embed = base.query_encoder.embed
            self.tokens = TokenEncoder(embed if settings.share_positions else None, query_dim, bc.hidden, bc.heads,
                                       bc.input_dropout, bc.dropout, getattr(bc, "ffn_mult", 0),
                                       embed.positions.num_embeddings)
        self.gate = ConfidenceGate(bc.hidden) if settings.csa else None
        self.text_head: nn.Module | None = None
        self.video_head: nn.Module | None = None
        if settings.msra:
            self.text_head, self.video_head = gaussian_heads(bc.hidden, settings.heads, settings.aggregation)
        for part in (self.tokens, self.gate, self.text_head, self.video_head):
            if part is not None:
                init_weights(part, bc.init_std)  # the reference re-initialises every new layer N(0, 0.02)

    @property
    def cfg(self) -> HomeConfig:
        return self.base.cfg

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        out = self.base.encode_queries(qb)
        if self.tokens is not None:
            out["ral.tokens"] = self.tokens(qb.tokens, qb.token_mask)
            out["ral.token_mask"] = qb.token_mask
        return out

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        return self.base.encode_videos(vb)

    def index_videos(self, v: Encoded) -> Encoded:
        v = self.base.index_videos(v)
        if self.gate is not None and "frames" + UNIT not in v:
            v = {**v, "frames" + UNIT: F.normalize(v["frames"], dim=-1)}
        return v

    def frame_views(self) -> list[tuple[str, str, str]]:
        return self.base.frame_views()

    # ------------------------------------------------------------------------- MSRA's Gaussians
    def step_extras(self, queries: Encoded, videos: Encoded, video_of_query: torch.Tensor) -> Mapping[str, object]:
        """A training step's outputs for the objective alone (harness/base/contract.py `StepExtras`):
        the base backbone's own (e.g. DreamPRVR's denoising), and RAL's `Gaussians` under GAUSSIANS
        (none without MSRA), each computed when the objective first reads it."""
        base = self.base.step_extras(queries, videos, video_of_query) if isinstance(self.base, StepExtras) else {}
        makers: dict[str, Callable[[], object]] = {k: partial(base.__getitem__, k) for k in base}
        if self.text_head is not None:
            makers[GAUSSIANS] = partial(self.gaussians, queries, videos, video_of_query)
        return OnDemand(makers)

    def gaussians(self, queries: Encoded, videos: Encoded, video_of_query: torch.Tensor) -> Gaussians:
        """The Gaussians of a training batch: the text side from RAL's words (`ral.tokens`) of
        each video's query support set (Eq. 5; `video_of_query`: each query's video column, from
        the labels) or of each query alone, the video side from the backbone's encoded frames;
        the heads pool as `ral.pool_padding` says, and the `loss` settings pick the text source,
        the encoders the losses reach (`msra_grad`) and whether the means are normalised."""
        text_head, video_head = self.text_head, self.video_head
        if text_head is None or video_head is None:
            raise ValueError("the model has no MSRA (ral.msra=false), so no Gaussians")
        loss = self.loss_settings
        tokens, tmask = queries["ral.tokens"], queries["ral.token_mask"]
        frames, fmask = videos["frames"], videos["frame_mask"]
        if loss.msra_grad in ("video", "neither"):
            tokens = tokens.detach()
        if loss.msra_grad in ("text", "neither"):
            frames = frames.detach()
        num_videos = frames.shape[0]
        support = loss.text_source == "support"
        video_of_text = (masks.describe(torch.arange(num_videos, device=frames.device), covers=num_videos) if support
                         else video_of_query)
        masked = self.settings.pool_padding == "masked"  # attention over the real rows only
        if not support:
            mu_t, ls_t = self.query_gaussians(tokens, tmask)
        elif masked:
            mu_t, ls_t = text_head(*support_sets(tokens, tmask, video_of_query, num_videos))
        else:
            # the reference's padded rows: every token row of a query (its padding too) is attended
            # to while the mean stays over real tokens; the support set is zero-padded to the
            # capacity, and those zero rows join the softmax. The real-token mask rides along as
            # one more channel, so the sets are laid out once
            packed = torch.cat([tokens, tmask[..., None].to(tokens.dtype)], -1)
            every_row = masks.describe(torch.ones_like(tmask), all_true=True)
            packed, attend_t = support_sets(packed, every_row, video_of_query, num_videos)
            zeros_t = (self.settings.support_capacity * tokens.shape[1] - attend_t.sum(1)).clamp_min(0)
            mu_t, ls_t = text_head(packed[..., :-1], packed[..., -1] > 0, attend_t, zeros_t)
        # the reference's padded rows: a video's frames zero-padded to max_frames join the softmax
        zeros_v = None if masked else (self.base.cfg.max_frames - fmask.sum(1)).clamp_min(0)
        mu_v, ls_v = video_head(frames, fmask, None, zeros_v)
        if loss.normalize_mean:
            mu_t, mu_v = F.normalize(mu_t, dim=-1), F.normalize(mu_v, dim=-1)
        return Gaussians(mu_t, ls_t, mu_v, ls_v, video_of_text)

    def query_gaussians(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu, log sigma) [Q, d] of each query alone (Table 4's X^q = Q; `prvr-bench
        uncertainty`'s sigma^q): RAL's words (`ral.tokens`) through the text head, pooled as
        the run was trained: over the real tokens, or (`ral.pool_padding=code`) over every
        padded token row, as the reference's unmasked pooling of a lone query sees it. The
        means are the head's, not normalised."""
        if self.text_head is None:
            raise ValueError("the model has no MSRA (ral.msra=false), so no Gaussians")
        attend = torch.ones_like(token_mask) if self.settings.pool_padding == "code" else None
        return self.text_head(tokens, token_mask, attend)

    # ------------------------------------------------------------------------- the reference's weights
    def official_around(self, named: dict[str, torch.Tensor], base: dict[str, torch.Tensor]
                        ) -> dict[str, torch.Tensor]:
        """The official weights of RAL's parts around the backbone's (`base`, read by the backbone's own
        map): zhanglong-ustc/RAL-PRVR (RAL on GMMFormer v2) and lijun2005/ICML26-Holmes `multisrc/` (CSA on
        Holmes) name them alike. The token encoder: `frame_branch_query_proj` (a LinearLayer: LayerNorm,
        `net.1`) and `frame_branch_query_encoder` (a BertAttention), on the query encoder's positions; the
        word gate `text_weight_fc` (Linear, ReLU, Linear); MSRA's heads as the code builds them, a PIENet
        and an uncertainty module per side (`pie_net_text`, `uncertain_net_text`, `pie_net_video`,
        `uncertain_net_video`). A model the references have no weights for is refused in one line."""
        s = self.settings
        if self.tokens is not None and not s.share_positions:
            raise UserError("--official-weights: the reference's token encoder reads the query encoder's positions; "
                            "this run has ral.share_positions=false (positions of its own), which no official "
                            "checkpoint holds")
        if self.text_head is not None and s.heads != "code":
            raise UserError("--official-weights: the reference's Gaussian heads are its PIENet and uncertainty "
                            "modules (ral.heads=code); this run has ral.heads=paper, whose heads no official "
                            "checkpoint holds")
        out = {f"base.{k}": v for k, v in base.items()}
        if self.tokens is not None:
            out.update({**official_linear_layer(named, "tokens", "frame_branch_query_proj"),
                        **official_branches(named, "tokens.layer.branches", ["frame_branch_query_encoder"],
                                            ffn=self.tokens.layer.branches.ffn_mult > 0)})
        if self.gate is not None:
            out.update({f"gate.net.{i}.{t}": named[f"text_weight_fc.{i}.{t}"]
                        for i in (0, 2) for t in ("weight", "bias")})
        if self.text_head is not None:
            for head, side in (("text_head", "text"), ("video_head", "video")):
                out.update(official_gaussian_head(named, head, f"pie_net_{side}", f"uncertain_net_{side}"))
        return out

    def clip_weight(self) -> float:
        w = self.settings.clip_weight
        return self.base.cfg.clip_weight if w < 0 else w

    def score(self, q: Encoded, v: Encoded) -> Scores:
        gate = self.gate
        if gate is None:
            s = self.base.score(q, v)
            if self.settings.clip_weight < 0:
                return s
            w = self.clip_weight()
            return Scores(w * s.branches["clip"] + (1 - w) * s.branches["frame"], s.branches, s.raw, s.items)
        s = self.base.clip_scores(q, v)  # the backbone's own frame branch is replaced, so not computed
        tokens, tmask = q["ral.tokens"], q["ral.token_mask"]
        frames, fmask = unit(v, "frames"), v["frame_mask"]
        budget = self.settings.eval_budget
        floor = None
        if self.settings.padded_frames == "zero":  # the reference's zero-padded frames take part in the max
            floor = fmask.sum(1) < self.base.cfg.max_frames
        # the reference weighs the cosine score by the gate of the normalised words and the raw
        # score (for NCE) by the gate of the raw words
        unit_tokens = F.normalize(tokens, dim=-1)
        # both sides are unit vectors already (the frames' copy `index_videos` stored): their dot products
        # are the cosines, so csa_scores does not normalise the collection again for every batch of queries
        frame = csa_scores(unit_tokens, tmask, word_confidences(gate(unit_tokens), tmask), frames, fmask, budget,
                           cosine=False, floor=floor)
        raw_frames = v["frames"]
        raw = OnDemand({
            "clip": lambda: s.raw["clip"],
            "frame": lambda: csa_scores(tokens, tmask, word_confidences(gate(tokens), tmask), raw_frames, fmask, budget,
                                        cosine=False, floor=floor),
        })
        w = self.clip_weight()
        branches = {"clip": s.branches["clip"], "frame": frame}
        return Scores(w * branches["clip"] + (1 - w) * frame, branches, raw, s.items)
