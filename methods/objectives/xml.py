"""The multi-level ranking loss with confidence and XML's start/end NLL (SBERT-PR paper,
Maeoki et al.; docs/references.md, Eq. 9-18) as pure functions of score matrices, relation
masks and weights, so that any detector's relations feed them.

Notation. R [Q, B]: a relevance score of every batch query (row) against every batch video
(column): s_vr for L_vr (Eq. 13), R_vcmr (Eq. 14) for L_vcmr (Eq. 15). positive: the labelled
pairs (q_i, v_i); ambiguous: the potentially relevant pairs (q_i, v_i+), each with its
confidence C in [0, 1]; negative: every other pair. A detector's relations give all three;
the losses never ask which detector made them.

Building targets and reducing are split: `sample_hard_negatives` draws R^ of Eq. 10 once per
query and once per video (the negative that Eq. 10 and Eq. 11 share), `segment_rows` says which
rows of a video each pair's R_vcmr and NLL read; the losses reduce. Every loss is zero on a
batch without its pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from prvr.harness.base import masks
from prvr.harness.base.registry import OBJECTIVES
from prvr.methods.objectives.ranking import sample_negatives

LOGIT_FLOOR = 1e-6  # inf o_st = inf o_ed = 1e-6 (Eq. 14)


def _zero(t: torch.Tensor) -> torch.Tensor:
    """0 in t's graph (a loss of a batch without its pairs; + 0.0 turns -0.0 into 0.0)."""
    return t.sum() * 0.0 + 0.0


# ----------------------------------------------------------------------------- targets
@dataclass
class SampledNegatives:
    """R^ of Eq. 10-11: the score of one sampled negative per query (R(i, i-), a negative video)
    and per video (R(j-, j), a negative query); `*_ok` is False where a row or column has no
    negative."""

    query: torch.Tensor  # [Q]
    query_ok: torch.Tensor  # [Q] bool
    video: torch.Tensor  # [B]
    video_ok: torch.Tensor  # [B] bool


def sample_hard_negatives(scores: torch.Tensor, negative: torch.Tensor, pool: int | None,
                          generator: torch.Generator | None = None) -> SampledNegatives:
    """For each query a negative video, for each video a negative query, each drawn uniformly
    from the `pool` (N_pool) highest-scoring negatives of its row / column (Eq. 10: 1 = the
    hardest; None = all negatives, XML's draw before its hard-negative epoch). The pool holds
    negatives only: positives and potentially relevant pairs never enter it. The drawn scores
    keep their gradient."""
    q_idx, q_ok = sample_negatives(scores, negative, pool, generator)
    v_idx, v_ok = sample_negatives(scores.t(), negative.t(), pool, generator)
    return SampledNegatives(scores.gather(1, q_idx[:, None]).squeeze(1), q_ok,
                            scores.t().gather(1, v_idx[:, None]).squeeze(1), v_ok)


def segment_rows(query_rows: torch.Tensor, video_of_query: torch.Tensor, num_videos: int,
                 pair_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Which rows (start, end) of video j a pair (q_i, v_j) is scored on: [Q, B, 2], -1 = none.

    - a labelled pair (q_i, v_i): q_i's own moment (`query_rows` [Q, 2]);
    - a pair with a moment of its own (`pair_rows` [Q, B, 2], e.g. a potentially relevant pair's
      v_j[t_st^j : t_ed^j] from the detector): that moment;
    - any other pair: v_j's segment, the moment of v_j's first labelled query in the batch (Eq.
      14-15 score a query against a video segment; a negative video brings its own).
    Unknown moments stay -1. Every pair gets rows; which pairs may use the video's segment is
    the caller's call (negatives do; a potentially relevant pair without a moment of its own
    does not)."""
    q = torch.arange(len(video_of_query), device=query_rows.device)
    first = torch.full((num_videos,), len(q), dtype=torch.long, device=query_rows.device)
    first = first.scatter_reduce(0, video_of_query, q, reduce="amin")  # first labelled query per video
    has = first < len(q)
    if len(q):  # selections, not masked writes: the same rows without asking the device which videos have some
        segment = torch.where(has[:, None], query_rows[first.clamp(max=len(q) - 1)], -1)
    else:
        segment = torch.full((num_videos, 2), -1, dtype=torch.long, device=query_rows.device)
    rows = segment[None].repeat(len(q), 1, 1)
    if pair_rows is not None:
        own = (pair_rows >= 0).all(-1)
        rows = torch.where(own[..., None], pair_rows, rows)
    rows[q, video_of_query] = query_rows
    return rows


def vcmr_relevance(start_logits: torch.Tensor, end_logits: torch.Tensor, rows: torch.Tensor,
                   s_vr: torch.Tensor, alpha: float, floor: float = LOGIT_FLOOR) -> torch.Tensor:
    """R_vcmr (Eq. 14) [Q, B] = log o_st(t_st) + log o_ed(t_ed) + alpha s_vr, with o the start /
    end logits (not the softmax probabilities, which flatten every non-maximum row) at the rows
    of each pair's segment (`rows` [Q, B, 2]; -1 gives 0, to be masked by the caller).

    log o is defined for o > 0 only, and a logit can be zero or negative: the paper sets
    inf o = 1e-6, so o <= 1e-6 counts as 1e-6 (log = -13.8) and gives no gradient to o; such a
    pair can still rise through alpha s_vr."""
    at = rows.clamp(min=0)
    o_st = start_logits.gather(-1, at[..., :1]).squeeze(-1)
    o_ed = end_logits.gather(-1, at[..., 1:]).squeeze(-1)
    r = torch.log(o_st.clamp(min=floor)) + torch.log(o_ed.clamp(min=floor)) + alpha * s_vr
    return r.masked_fill((rows < 0).any(-1), 0.0)


# ----------------------------------------------------------------------------- losses
@OBJECTIVES.register("xml-pos-neg", "SBERT-PR Eq. 10: [margin + R(sampled hard negative) - R(positive)]_+ both ways")
def pos_over_neg(scores: torch.Tensor, positive: torch.Tensor, negatives: SampledNegatives,
                 margin: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    """L_pos>neg (Eq. 10, XML's ranking loss): (1/N) sum over the N positive pairs (q_i, v_j) of
    [margin + R(i, i-) - R(i, j)]_+ + [margin + R(j-, j) - R(i, j)]_+, with R(i, i-), R(j-, j)
    q_i's and v_j's sampled negatives. A query or video without a negative adds nothing.
    `valid` [Q, B] bool: the pairs of `positive & valid` (see `_pairs`)."""
    i, j, keep = _pairs(positive, valid)
    if len(i) == 0:
        return _zero(scores)
    pos = scores[i, j]
    t2v = (margin + negatives.query[i] - pos).clamp(min=0) * negatives.query_ok[i]
    v2t = (margin + negatives.video[j] - pos).clamp(min=0) * negatives.video_ok[j]
    return _pair_mean(t2v, v2t, keep)


def _pairs(mask: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The pairs (i, j) of a 2-D mask, as `mask.nonzero(as_tuple=True)` gives them but read from
    its described index where the host knows it (harness/base/masks.py: no host sync), and which of
    them `valid` keeps (None: all). A mask made on the device by `&` with `valid` would have to
    ask the device for its pairs; the pairs of the described mask, weighted by `valid`, are the
    same terms."""
    i, j = masks.true_pairs(mask)
    return i, j, None if valid is None else valid[i, j]


def _pair_mean(t2v: torch.Tensor, v2t: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """(sum t2v + sum v2t) / N over the kept pairs. Kept by `torch.where`, the kept terms' sums
    are the sums over those terms alone where every pair is kept (the same elements in the same
    order), and the count is read on the device."""
    if keep is None:
        return (t2v.sum() + v2t.sum()) / len(t2v)
    return (torch.where(keep, t2v, 0.0).sum() + torch.where(keep, v2t, 0.0).sum()) / keep.sum().clamp(min=1)


ConfidenceOn = Literal["score", "hinge"]  # where the confidence C weighs Eq. 11-12
CONFIDENCE_ON: tuple[ConfidenceOn, ...] = get_args(ConfidenceOn)


def _confidence_on(on: str, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight of the hinge, factor of the score inside it): (1, C) as Eq. 11-12 write it, or (C, 1)."""
    if on == "score":
        return torch.ones_like(c), c
    if on == "hinge":
        return c, torch.ones_like(c)
    raise ValueError(f"on must be one of {', '.join(CONFIDENCE_ON)}, got {on!r}")


@OBJECTIVES.register("xml-rel-neg", "SBERT-PR Eq. 11: [margin + R(hard negative) - C R(potentially relevant)]_+")
def rel_over_neg(scores: torch.Tensor, ambiguous: torch.Tensor, confidence: torch.Tensor,
                 negatives: SampledNegatives, margin: float, on: str = "score",
                 valid: torch.Tensor | None = None) -> torch.Tensor:
    """L_rel>neg (Eq. 11): (1/N_pairs) sum over the potentially relevant pairs (q_i, v_j) of
    [margin + R(i, i-) - C_ij R(i, j)]_+ + [margin + R(j-, j) - C_ij R(i, j)]_+ (the negatives
    of Eq. 10). C -> 1: the pair must beat the negatives like a positive; C -> 0: no pull up.
    `on="hinge"` (a deviation, `loss.confidence_on`): C_ij [margin + R(neg) - R(i, j)]_+ instead,
    unchanged when every score moves by the same amount. `valid`: the pairs of `ambiguous & valid`."""
    i, j, keep = _pairs(ambiguous, valid)
    if len(i) == 0:
        return _zero(scores)
    w, k = _confidence_on(on, confidence[i, j])
    rel = k * scores[i, j]
    t2v = w * (margin + negatives.query[i] - rel).clamp(min=0) * negatives.query_ok[i]
    v2t = w * (margin + negatives.video[j] - rel).clamp(min=0) * negatives.video_ok[j]
    return _pair_mean(t2v, v2t, keep)


@OBJECTIVES.register("xml-pos-rel", "SBERT-PR Eq. 12: [R(potentially relevant) - C R(positive)]_+ both ways")
def pos_at_least_rel(scores: torch.Tensor, positive: torch.Tensor, ambiguous: torch.Tensor,
                     confidence: torch.Tensor, on: str = "score", valid: torch.Tensor | None = None,
                     valid_positive: torch.Tensor | None = None) -> torch.Tensor:
    """L_pos>=rel (Eq. 12): (1/N_pairs) sum over the potentially relevant pairs (q_i, v_j) of
    [R(i, j) - C_ij R(i, i)]_+ + [R(i, j) - C_ij R(j, j)]_+, no margin. R(i, i): q_i's positive
    score; R(j, j): v_j's, the mean over v_j's positive queries where a batch video holds several
    (one item is a video with all its queries); a side without a positive adds nothing.
    `on="hinge"` (a deviation, `loss.confidence_on`): C_ij [R(i, j) - R(pos)]_+ instead.
    `valid` / `valid_positive`: the pairs of `ambiguous & valid` / `positive & valid_positive`."""
    i, j, keep = _pairs(ambiguous, valid)
    if len(i) == 0:
        return _zero(scores)
    if valid_positive is not None:
        positive = positive & valid_positive
    pos = positive.to(scores.dtype)
    of_query = (scores * pos).sum(1) / pos.sum(1).clamp(min=1)
    of_video = (scores * pos).sum(0) / pos.sum(0).clamp(min=1)
    rel = scores[i, j]
    w, k = _confidence_on(on, confidence[i, j])
    t2v = w * (rel - k * of_query[i]).clamp(min=0) * positive.any(1)[i]
    v2t = w * (rel - k * of_video[j]).clamp(min=0) * positive.any(0)[j]
    return _pair_mean(t2v, v2t, keep)


@OBJECTIVES.register("xml-span-nll", "SBERT-PR Eq. 16-17: (confidence-weighted) NLL of the start and end rows")
def span_nll(start_logits: torch.Tensor, end_logits: torch.Tensor, rows: torch.Tensor,
             weight: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
    """-(1/P) sum_p w_p [log P_st(t_st) + log P_ed(t_ed)] over P pairs, P = softmax of the logits
    [P, T] over the real rows (padding logits -inf), rows [P, 2] (start, end). w = 1: NLL_1 over
    the labelled pairs (Eq. 16, XML's start/end cross-entropy); w = C: NLL_2 over the potentially
    relevant pairs with their moment (Eq. 17, normalised by N_pairs). Zero without pairs.
    `valid` [P] bool: count only these pairs (P then the count of valid ones), without selecting
    them on the host; the others' rows may be -1."""
    if len(rows) == 0:
        return _zero(start_logits)
    if valid is not None:  # the pairs not counted: finite logits and row 0, then weighted out
        keep = valid[:, None]
        start_logits, end_logits = torch.where(keep, start_logits, 0.0), torch.where(keep, end_logits, 0.0)
        rows = torch.where(keep, rows, 0)
    log_st = start_logits.log_softmax(-1).gather(-1, rows[:, :1]).squeeze(-1)
    log_ed = end_logits.log_softmax(-1).gather(-1, rows[:, 1:]).squeeze(-1)
    nll = -(log_st + log_ed)
    if weight is not None:
        nll = weight * nll
    if valid is None:
        return nll.sum() / len(rows)
    # x1.0 and +0.0 leave the counted terms' sum as it was: the same number as over the counted
    # pairs alone where every pair counts (a sum's order is its elements'), no host read
    return torch.where(valid, nll, 0.0).sum() / valid.sum().clamp(min=1)
