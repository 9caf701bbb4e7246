"""Objectives of the MS-SL family (MS-SL, GMMFormer, GMMFormer v2) as pure functions.

Every function takes the relation masks (positive, negative) instead of labels, so relation
detectors plug in: with one-to-one labels they reduce to the reference losses.
- NCE: the references' `clip_nce` is InfoNCE on raw dot products with temperature 1
  (`ranking.info_nce(scores, positive, negative, 1.0)`), multi-positive over a video's queries.
- triplet (`msl_triplet`): text-to-video per positive pair, video-to-text per video against
  the mean score of its positive queries.
- query diversity (GMMFormer) and its focal form (GMMFormer v2), over pairs of queries that
  share a positive video.
- Hungarian matching (GMMFormer v2) between a video's queries and its clips.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from prvr.harness import masks
from prvr.harness.io import UserError
from prvr.harness.registry import OBJECTIVES
from prvr.methods.backbones.api import Scores
from prvr.methods.objectives.ranking import info_nce, mean_where, sample_negatives


def _zero(t: torch.Tensor) -> torch.Tensor:
    return t.sum() * 0


@OBJECTIVES.register("msl-triplet", "MS-SL family triplet: t2v per positive pair, v2t per video vs its mean positive")
def msl_triplet(scores: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, margin: float,
                hard_pool: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """The references' `get_clip_triplet_loss`, over relations:

    t2v = mean over positive pairs (q, v) of [margin + s(q, v') - s(q, v)]_+, v' a negative
          video of q: uniform, or uniform among its `hard_pool` highest-scoring negatives;
    v2t = mean over videos v with a positive query of [margin + s(q', v) - mean_q s(q, v)]_+,
          the mean over v's positive queries, q' a uniform negative query or, with hard
          negatives, the hardest one.
    Returns t2v + v2t. Rows or columns without a negative add nothing.
    """
    q_idx, v_idx = masks.true_pairs(positive)
    if len(q_idx) == 0:
        return _zero(scores)
    neg_v, ok_v = sample_negatives(scores[q_idx], negative[q_idx], hard_pool, generator)
    t2v = (margin + scores[q_idx, neg_v] - scores[q_idx, v_idx]).clamp(min=0) * ok_v
    has_pos = positive.any(0)
    pos_mean = (scores * positive).sum(0) / positive.sum(0).clamp(min=1)
    neg_q, ok_q = sample_negatives(scores.t(), negative.t(), 1 if hard_pool else None, generator)
    cols = torch.arange(scores.shape[1], device=scores.device)
    v2t = (margin + scores[neg_q, cols] - pos_mean).clamp(min=0) * ok_q
    return t2v.mean() + mean_where(v2t, has_pos, masks.covered(positive, 0), scores)


def hard_pool_at(epoch: int, start: int, pool: int) -> int | None:
    """The hard-negative pool size from epoch `start` on; None (random negatives) before it,
    and always when start < 0."""
    return pool if 0 <= start <= epoch else None


def two_branch_ranking(scores: Scores, positive: torch.Tensor, negative: torch.Tensor,
                       margin: float, hard_pool: int | None,
                       generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """The ranking parts shared by MS-SL, GMMFormer and v2, unweighted: for b in (clip, frame),
    b_nce = InfoNCE(T = 1) on the raw dot products `scores.raw[b]`, b_triplet = msl_triplet on
    the cosines `scores.branches[b]`."""
    out = {}
    for b in ("clip", "frame"):
        if b not in scores.raw or b not in scores.branches:
            raise UserError(f"the MS-SL family losses need the backbone's {b} score and its raw dot products "
                            f"(Scores.branches['{b}'], Scores.raw['{b}']); use the msl, gmmformer or gmmformer2 "
                            "backbone")
        out[f"{b}_nce"] = info_nce(scores.raw[b], positive, negative, 1.0)
        out[f"{b}_triplet"] = msl_triplet(scores.branches[b], positive, negative, margin, hard_pool, generator)
    return out


def two_branch_sum(cfg, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """w_c clip_nce + clip_triplet + w_f frame_nce + w_ft frame_triplet: the weighted ranking
    parts of `two_branch_ranking`, with the weights of a loss config of the MS-SL family
    (`clip_nce_weight`, `frame_nce_weight`, `frame_triplet_weight`)."""
    return (cfg.clip_nce_weight * parts["clip_nce"] + parts["clip_triplet"]
            + cfg.frame_nce_weight * parts["frame_nce"] + cfg.frame_triplet_weight * parts["frame_triplet"])


def same_video_pairs(positive: torch.Tensor) -> torch.Tensor:
    """[Q, Q] bool: distinct queries that share a positive video (one-to-one labels: the
    queries labelled with the same video)."""
    p = positive.float()
    pairs = (p @ p.t()) > 0
    return pairs & ~torch.eye(len(pairs), dtype=torch.bool, device=pairs.device)


@OBJECTIVES.register("query-diversity", "GMMFormer: log(1 + sum exp(alpha (cos + m))) over queries of the same video")
def query_diversity(queries: torch.Tensor, pairs: torch.Tensor, margin: float, alpha: float) -> torch.Tensor:
    """GMMFormer's query-diversity loss: (1/Q) sum_j log(1 + sum_{i paired with j} exp(alpha (cos(q_i, q_j) + margin))).
    queries [Q, D]; pairs [Q, Q] bool (same_video_pairs)."""
    x = F.normalize(queries, dim=-1)
    logits = (alpha * (x @ x.t() + margin)).masked_fill(~pairs, float("-inf"))
    with_one = torch.cat([logits, logits.new_zeros(1, logits.shape[1])])  # the "1 +" as exp(0)
    return torch.logsumexp(with_one, dim=0).sum() / len(queries)


@OBJECTIVES.register("focal-query-diversity", "GMMFormer v2: focal query diversity, (1 + cos)^gamma weighted")
def focal_query_diversity(queries: torch.Tensor, pairs: torch.Tensor, margin: float, alpha: float,
                          gamma: float) -> torch.Tensor:
    """GMMFormer v2's focal query diversity: (1/Q) sum over pairs (i, j) of
    (1 + cos)^gamma * log(1 + exp(alpha (cos + margin))), cos = cos(q_i, q_j)."""
    x = F.normalize(queries, dim=-1)
    cos = x @ x.t()
    terms = (1 + cos).clamp(min=0) ** gamma * F.softplus(alpha * (cos + margin))
    return (terms * pairs).sum() / len(queries)


def hungarian_pairs(cos: torch.Tensor, positive: torch.Tensor, min_queries: int = 2) -> tuple[np.ndarray, ...]:
    """Optimal one-to-one assignment of each video's positive queries to its clips.

    cos [Q, V, C]: query-clip cosines; videos with fewer than `min_queries` positive queries
    are skipped (as in the reference). Returns index arrays (query, video, clip) of the matches.
    Only the positive pairs' rows of `cos` go to the host (the solve's one wait for the device),
    their pairs read from the mask's described index where the host knows it (harness/masks.py).
    """
    q_idx, v_idx = masks.true_pairs(positive)  # row-major: each video's queries in ascending order
    rows_host = cos.detach()[q_idx, v_idx].cpu().numpy()  # [P, C], asks the device
    q_host, v_host = q_idx.cpu().numpy(), v_idx.cpu().numpy()  # nothing queued after the copy above
    found: list[list[np.ndarray]] = [[], [], []]
    counts = np.bincount(v_host, minlength=positive.shape[1])
    for v in np.flatnonzero(counts >= min_queries):
        of_v = np.flatnonzero(v_host == v)
        rows, cols = linear_sum_assignment(-rows_host[of_v])
        found[0].append(q_host[of_v][rows])
        found[1].append(np.full(len(rows), v))
        found[2].append(cols)
    return tuple(np.concatenate(f) if f else np.zeros(0, dtype=np.int64) for f in found)


@OBJECTIVES.register("hungarian-matching", "GMMFormer v2: 1 - mean cos of a Hungarian query-to-clip matching per video")
def hungarian_matching(queries: torch.Tensor, clips: torch.Tensor, positive: torch.Tensor,
                       min_queries: int = 2) -> torch.Tensor:
    """GMMFormer v2's matching loss: 1 - mean cos(q, c) over the pairs of an optimal assignment
    (scipy linear_sum_assignment, maximising the summed cosine) between the positive queries of
    each video and the video's clips. queries [Q, D]; clips [V, C, D]; positive [Q, V]."""
    cos = torch.einsum("qd,vcd->qvc", F.normalize(queries, dim=-1), F.normalize(clips, dim=-1))
    q, v, c = masks.to_device(torch.from_numpy(np.stack(hungarian_pairs(cos, positive, min_queries))), cos.device)
    if len(q) == 0:
        return _zero(cos)
    return 1 - cos[q, v, c].mean()
