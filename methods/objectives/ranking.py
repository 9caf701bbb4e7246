"""The standard PRVR objectives as pure functions of scores, relations and masks.

Each loss is split into building targets (which pairs are anchors, which negatives) and
reducing. Weights are arguments, never constants inside a model.
"""

from __future__ import annotations

import torch

from prvr.harness.base import masks
from prvr.harness.base.registry import OBJECTIVES


def hard_pool_at(epoch: int, start: int, pool: int, before: int | None = None) -> int | None:
    """The negative pool of epoch `epoch` under the rule every `loss.hard_negative_epoch` follows:
    hard negatives (the top `pool`) from epoch `start` on, never when start is -1; `before` (None:
    any negative, uniformly) otherwise."""
    return pool if 0 <= start <= epoch else before


def masked_logsumexp(logits: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.logsumexp(logits.masked_fill(~mask, float("-inf")), dim=dim)


@OBJECTIVES.register("infonce", "InfoNCE in both directions over cosine / temperature; multi-positive aware")
def info_nce(scores: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
             temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE: -log(sum_pos e^{s/t} / sum_{pos+neg} e^{s/t}), averaged over the
    queries (rows) and the videos (columns) that have at least one positive.

    scores [Q, B] similarities; positive, negative [Q, B] disjoint bool masks (pairs that
    are neither take no part). A video with several queries has several positives.
    """
    logits = scores / temperature
    terms = []
    for dim in (1, 0):  # text-to-video over rows, video-to-text over columns
        has_pos = positive.any(dim)
        num = masked_logsumexp(logits, positive, dim)
        den = masked_logsumexp(logits, positive | negative, dim)
        terms.append(mean_where(den - num, has_pos, masks.covered(positive, dim), scores))
    return terms[0] + terms[1]


def mean_where(x: torch.Tensor, keep: torch.Tensor, every: bool | None, zero_of: torch.Tensor) -> torch.Tensor:
    """x[keep].mean(), or 0 (in zero_of's graph) where keep is all false. `every`: keep is known
    to be all true (harness/base/masks.py), and x.mean(), the same number, asks the device nothing."""
    if every:
        return x.mean()
    return x[keep].mean() if keep.any() else zero_of.sum() * 0


def draw_one(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One column per row [R], drawn with probability proportional to `weights` [R, C] (every
    row with a positive weight): `torch.multinomial(weights, 1)` as torch computes it (the argmax
    of w / q, q ~ Exp(1) drawn from `generator`), so the same draws, without the two checks of
    the weights that multinomial reads on the host (a host sync each on a GPU)."""
    q = torch.empty_like(weights).exponential_(1, generator=generator)
    return (weights / q).argmax(-1)


def skip_draw(weights_like: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """Advance the random stream as `draw_one` over weights shaped like `weights_like` does, keeping no draw:
    a loss that leaves out a term another treatment samples still takes its random numbers, so the two runs share
    one stream (common random numbers) and differ by the treatment alone."""
    torch.empty_like(weights_like, dtype=torch.float).exponential_(1, generator=generator)


def sample_negatives(scores: torch.Tensor, negative: torch.Tensor, hard_pool: int | None,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One negative per row: uniform among the row's negatives, or, with `hard_pool` = k,
    uniform among its k highest-scoring negatives (k = 1 is the hardest negative).

    Returns (column index [R], valid [R]); rows without any negative are not valid.
    """
    valid = negative.any(1)
    if hard_pool is None:
        weights = negative.float()
    else:
        k = min(hard_pool, scores.shape[1])
        masked = scores.detach().masked_fill(~negative, float("-inf"))
        top = masked.topk(k, dim=1).indices
        weights = torch.zeros_like(scores, dtype=torch.float).scatter_(1, top, 1.0) * negative.float()
    weights = weights + (~valid).float()[:, None]  # keep the draw defined on empty rows
    return draw_one(weights, generator), valid


@OBJECTIVES.register("triplet", "bidirectional triplet ranking with random or hard negatives (MS-SL style)")
def triplet(scores: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, margin: float,
            hard_pool: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Mean over anchor pairs (q, v) in `positive` of
        [margin + s(q, v') - s(q, v)]_+ + [margin + s(q', v) - s(q, v)]_+
    with v' a negative video of q and q' a negative query of v (sample_negatives)."""
    q_idx, v_idx = masks.true_pairs(positive)
    if len(q_idx) == 0:
        return scores.sum() * 0
    pos = scores[q_idx, v_idx]
    neg_v, ok_v = sample_negatives(scores[q_idx], negative[q_idx], hard_pool, generator)
    neg_q, ok_q = sample_negatives(scores.t()[v_idx], negative.t()[v_idx], hard_pool, generator)
    t2v = (margin + scores[q_idx, neg_v] - pos).clamp(min=0) * ok_v
    v2t = (margin + scores[neg_q, v_idx] - pos).clamp(min=0) * ok_q
    return (t2v + v2t).mean()
