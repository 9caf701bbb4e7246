"""Objectives of the MS-SL family (MS-SL, GMMFormer, GMMFormer v2) as pure functions.

Every function takes the relation masks (positive, negative) instead of labels, so relation
detectors plug in: with one-to-one labels they reduce to the reference losses.
- NCE: the references' `clip_nce` is InfoNCE on raw dot products with temperature 1
  (`ranking.info_nce(scores, positive, negative, 1.0)`), multi-positive over a video's queries;
  with `loss.treatment=soft` its text-to-video term against Holmes' soft targets (`two_branch_soft`).
- triplet (`msl_triplet`): text-to-video per positive pair, video-to-text per video against
  the mean score of its positive queries.
- query diversity (GMMFormer) and its focal form (GMMFormer v2), over pairs of queries that
  share a positive video.
- Hungarian matching (GMMFormer v2) between a video's queries and its clips.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from prvr.harness.base import masks
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import OBJECTIVES
from prvr.methods.backbones.api import Scores
from prvr.methods.objectives.arl import restrained_triplet, treated_positive
from prvr.methods.objectives.holmes import soft_info_nce
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


@OBJECTIVES.register("query-matrix-nce", "MS-SL's frame NCE on its query x query matrix: row and column in one softmax")
def query_matrix_nce(scores: torch.Tensor) -> torch.Tensor:
    """The reference's `frame_nce` on a [Q, Q] matrix whose diagonal holds the positives (ms-sl
    model_components.py): per query i, the log-sum-exp of row i and column i together (x_ii
    counted twice, as there) minus x_ii; the mean over queries."""
    both = torch.cat([scores, scores.t()], dim=1)
    return (torch.logsumexp(both, dim=1) - scores.diagonal()).mean()


@OBJECTIVES.register("query-matrix-triplet", "MS-SL's frame triplet on its query x query matrix")
def query_matrix_triplet(scores: torch.Tensor, margin: float, hard_pool: int | None = None,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """The reference's `get_frame_trip_loss` on a [Q, Q] matrix of cosines whose diagonal holds
    the positives: mean over i of [margin + s(i, j') - s(i, i)]_+ plus the mean of
    [margin + s(i', i) - s(i, i)]_+, j' a column and i' a row other than i, drawn uniformly or among
    the `hard_pool` highest-scoring (`sample_negatives`)."""
    n = scores.shape[0]
    if n < 2:
        return _zero(scores)
    other = ~torch.eye(n, dtype=torch.bool, device=scores.device)
    rows = torch.arange(n, device=scores.device)
    pos = scores.diagonal()
    neg_col, _ = sample_negatives(scores, other, hard_pool, generator)
    neg_row, _ = sample_negatives(scores.t(), other, hard_pool, generator)
    return ((margin + scores[rows, neg_col] - pos).clamp(min=0).mean()
            + (margin + scores[neg_row, rows] - pos).clamp(min=0).mean())


def two_branch_ranking(scores: Scores, positive: torch.Tensor, negative: torch.Tensor,
                       margin: float, hard_pool: int | None,
                       generator: torch.Generator | None, nce: bool = True) -> dict[str, torch.Tensor]:
    """The ranking parts shared by MS-SL, GMMFormer and v2, unweighted: for b in (clip, frame),
    b_nce = InfoNCE(T = 1) on the raw dot products `scores.raw[b]`, b_triplet = msl_triplet on
    the cosines `scores.branches[b]`. nce=False leaves the NCE parts to the caller (`two_branch_soft`)."""
    out = {}
    for b in ("clip", "frame"):
        if b not in scores.raw or b not in scores.branches:
            raise UserError(f"the MS-SL family losses need the backbone's {b} score and its raw dot products "
                            f"(Scores.branches['{b}'], Scores.raw['{b}']); use the msl, gmmformer or gmmformer2 "
                            "backbone")
        if nce:
            out[f"{b}_nce"] = info_nce(scores.raw[b], positive, negative, 1.0)
        out[f"{b}_triplet"] = msl_triplet(scores.branches[b], positive, negative, margin, hard_pool, generator)
    return out


def soft_target_scores(scores: Scores) -> tuple[torch.Tensor, torch.Tensor]:
    """The (clip, frame) cosines from which `loss.treatment=soft` builds Holmes' soft targets."""
    missing = [b for b in ("clip", "frame") if b not in scores.branches]
    if missing:
        raise UserError(f"loss.treatment=soft builds its targets from the clip and frame scores, and the backbone "
                        f"gives no {' or '.join(missing)} score (Scores.branches); use another treatment")
    return scores.branches["clip"], scores.branches["frame"]


def two_branch_soft(scores: Scores, positive: torch.Tensor, negative: torch.Tensor,
                    confidence: torch.Tensor) -> dict[str, torch.Tensor]:
    """`loss.treatment=soft` of the MS-SL family: b_nce = `soft_info_nce` (T = 1) on the raw dot products
    `scores.raw[b]`, its text-to-video term against Holmes' soft targets of the (clip, frame) cosines, for b
    in (clip, frame); with `two_branch_ranking(..., nce=False)` the parts of `two_branch_ranking`."""
    target = soft_target_scores(scores)
    return {f"{b}_nce": soft_info_nce(scores.raw[b], positive, negative, 1.0, target, confidence)
            for b in ("clip", "frame")}


def two_branch_restrained(scores: Scores, positive: torch.Tensor, ambiguous: torch.Tensor, margin_a: float,
                          hard_pool: int | None, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """`loss.treatment=restrain` of the MS-SL family: b_trip_a = ARL's restrained triplet (Eq. 11,
    `restrained_triplet`) on the cosines `scores.branches[b]`, where the branch's triplet is, for b in
    (clip, frame)."""
    return {f"{b}_trip_a": restrained_triplet(scores.branches[b], positive, ambiguous, margin_a, hard_pool, generator)
            for b in ("clip", "frame")}


def treated_two_branch(scores: Scores, positive: torch.Tensor, negative: torch.Tensor, ambiguous: torch.Tensor,
                       confidence: torch.Tensor, treatment: str, margin: float, margin_a: float,
                       hard_pool: int | None, generator: torch.Generator | None
                       ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The MS-SL family's ranking parts under `loss.treatment` (ignore, positive, restrain, soft): the
    positives the treatment trains (`treated_positive`), `two_branch_ranking` on them, and the soft NCE or
    the restrained triplets where the treatment asks; returns (parts, positives)."""
    positive = treated_positive(positive, ambiguous, treatment)
    soft = treatment == "soft"
    out = two_branch_ranking(scores, positive, negative, margin, hard_pool, generator, nce=not soft)
    if soft:
        out.update(two_branch_soft(scores, positive, negative, confidence))
    if treatment == "restrain":
        out.update(two_branch_restrained(scores, positive, ambiguous, margin_a, hard_pool, generator))
    return out, positive


def two_branch_sum(cfg, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """w_c clip_nce + clip_triplet + w_f frame_nce + w_ft frame_triplet: the weighted ranking
    parts of `two_branch_ranking`, with the weights of a loss config of the MS-SL family
    (`clip_nce_weight`, `frame_nce_weight`, `frame_triplet_weight`); with the restrained
    triplets of `two_branch_restrained` among the parts, + clip_trip_a + w_ft frame_trip_a (each
    weighed as its branch's triplet)."""
    total = (cfg.clip_nce_weight * parts["clip_nce"] + parts["clip_triplet"]
             + cfg.frame_nce_weight * parts["frame_nce"] + cfg.frame_triplet_weight * parts["frame_triplet"])
    if "clip_trip_a" in parts:
        total = total + parts["clip_trip_a"] + cfg.frame_triplet_weight * parts["frame_trip_a"]
    return total


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


# A video's positive queries are matched on the device up to this many (the programme below
# holds 2^n states); more, or more queries than clips, are solved on the host (one wait)
DEVICE_MATCHING_MAX_QUERIES = 12


def hungarian_pairs(cos: torch.Tensor, positive: torch.Tensor, min_queries: int = 2) -> tuple[np.ndarray, ...]:
    """Optimal one-to-one assignment of each video's positive queries to its clips, on the host
    (scipy linear_sum_assignment, as the reference): the test reference of `matching_pairs`, whose
    videos the device does not solve go through the same per-video solve (`_solve_on_host`).

    cos [Q, V, C]: query-clip cosines; videos with fewer than `min_queries` positive queries
    are skipped (as in the reference). Returns index arrays (query, video, clip) of the matches,
    by video, then query. Only the positive pairs' rows of `cos` go to the host (one wait for
    the device).
    """
    q_idx, v_idx = masks.true_pairs(positive)  # row-major: each video's queries in ascending order
    rows_host = cos.detach()[q_idx, v_idx].cpu().numpy()  # [P, C], asks the device
    q_host, v_host = q_idx.cpu().numpy(), v_idx.cpu().numpy()  # nothing queued after the copy above
    counts = np.bincount(v_host, minlength=positive.shape[1])
    return _solve_on_host(rows_host, q_host, v_host, np.flatnonzero(counts >= min_queries))


def _solve_on_host(rows: np.ndarray, q_host: np.ndarray, v_host: np.ndarray,
                   videos: np.ndarray) -> tuple[np.ndarray, ...]:
    """scipy's assignment per video of `videos` (ascending) of the pairs (q_host, v_host), each
    video's queries ascending, with their cosines `rows` [P, C]: (query, video, clip) arrays."""
    found: list[list[np.ndarray]] = [[], [], []]
    for v in videos:
        of_v = np.flatnonzero(v_host == v)
        chosen, cols = linear_sum_assignment(-rows[of_v])
        found[0].append(q_host[of_v][chosen])
        found[1].append(np.full(len(chosen), v))
        found[2].append(cols)
    return tuple(np.concatenate(f) if f else np.zeros(0, dtype=np.int64) for f in found)


@lru_cache(maxsize=None)
def _subsets(n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The tables of `best_assignments` for n queries, made on the device once. Over the 2^n sets
    S of queries and the n + 1 moves m at a clip (0: the clip stays unused; i + 1: query i takes
    it): before[S, m], the set before the move (S, or S less query i); closed[S, m], 0 where the
    move can end in S (query i in S), else -inf; start[S], 0 for the empty set, else -inf;
    moves = 1 .. n, the moves that give a clip, by query."""
    sets, moves = torch.arange(1 << n, device=device), torch.arange(1, n + 1, device=device)
    bit = torch.ones(n, dtype=torch.long, device=device) << (moves - 1)
    before = torch.cat([sets[:, None], sets[:, None] ^ bit], dim=1)
    closed = torch.zeros(1 << n, n + 1, dtype=torch.float64, device=device)
    closed[:, 1:].masked_fill_((sets[:, None] & bit) == 0, -torch.inf)
    start = torch.zeros(1 << n, dtype=torch.float64, device=device).masked_fill(sets != 0, -torch.inf)
    return before, closed, start, moves


def best_assignments(weights: torch.Tensor) -> torch.Tensor:
    """weights [G, n, C] (float64), n <= C: for each of G problems, the clip of each query in the
    assignment of the n queries to distinct clips with the largest summed weight, exactly (ties
    aside, the one scipy's linear_sum_assignment finds). A dynamic programme over the clips, whose
    state is the set of queries already given a clip, each state carrying its best assignment:
    C steps of a few tensor operations over [G, 2^n, n + 1] on the weights' device, nothing read
    on the host. Returns [G, n] clip indices."""
    g, n, c = weights.shape
    before, closed, start, moves = _subsets(n, weights.device)
    gains = torch.cat([weights.new_zeros(g, 1, c), weights], dim=1)[:, None]  # [G, 1, n + 1, C]: move 0 gains 0
    best = start.expand(g, -1)
    clips = torch.zeros(g, 1 << n, n, dtype=torch.long, device=weights.device)  # each state's assignment
    for k in range(c):
        best, move = (best[:, before] + gains[..., k] + closed).max(dim=2)  # [G, 2^n]
        came = before.gather(1, move.t()).t()  # the state each best move came from
        clips = clips.gather(1, came[:, :, None].expand(-1, -1, n))
        clips = torch.where(move[:, :, None] == moves, k, clips)
    return clips[:, -1]


def _positive_rows(positive: torch.Tensor, min_queries: int) -> tuple[np.ndarray, ...]:
    """The positive (query, video) pairs of the videos with at least `min_queries` positive
    queries, by video then query, and every video's count: read off the mask's host copy (for
    a mask described from the host, nothing is asked of the device)."""
    num_videos = positive.shape[1]
    index = masks.true_index_host(positive)
    q_host, v_host = index // num_videos, index % num_videos
    counts = np.bincount(v_host, minlength=num_videos)
    order = np.lexsort((q_host, v_host))
    order = order[counts[v_host[order]] >= min_queries]
    return q_host[order], v_host[order], counts


def matching_pairs(cos: torch.Tensor, positive: torch.Tensor,
                   min_queries: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`hungarian_pairs` with the assignments solved on the device (`best_assignments`, in float64),
    as (query, video, clip) index tensors on cos's device, in the same order. Which queries and
    videos take part is known on the host (`_positive_rows`), so a step asks the device nothing.
    A video with more positive queries than `DEVICE_MATCHING_MAX_QUERIES` or than clips is
    solved on the host (one wait)."""
    device, limit = cos.device, min(DEVICE_MATCHING_MAX_QUERIES, cos.shape[2])
    q_out, v_out, counts = _positive_rows(positive, min_queries)
    host_clip = np.full(len(q_out), -1)  # the clips solved on the host; -1: on the device
    big = counts[v_out] > limit
    if big.any():  # the reference's solve (of more queries than clips, it keeps the best subset)
        q_big, v_big = (masks.to_device(t, device) for t in masks.host_tensors(q_out[big], v_out[big]))
        rows = cos.detach()[q_big, v_big].cpu().numpy()  # asks the device
        hq, hv, hc = _solve_on_host(rows, q_out[big], v_out[big], np.unique(v_out[big]))
        q_out, v_out = np.concatenate([q_out[~big], hq]), np.concatenate([v_out[~big], hv])
        host_clip = np.concatenate([host_clip[~big], hc])
        by_video = np.lexsort((q_out, v_out))
        q_out, v_out, host_clip = q_out[by_video], v_out[by_video], host_clip[by_video]
    sizes = np.where(host_clip < 0, counts[v_out], 0)
    on_host = np.flatnonzero(sizes == 0)
    groups = [np.flatnonzero(sizes == n) for n in np.unique(sizes[sizes > 0])]  # rows: whole videos, n in a row
    # the clips come in the order (host rows, then each group's rows); `back` restores the rows' order
    back = np.argsort(np.concatenate([on_host, *groups]))
    group_arrays = [a[rows].reshape(-1, sizes[rows[0]]) for rows in groups for a in (q_out, v_out)]
    moved = [masks.to_device(t, device) for t in masks.host_tensors(np.stack([q_out, v_out]), host_clip[on_host], back,
                                                                *group_arrays)]
    (q, v), clips, back_d = moved[0], [moved[1]], moved[2]
    for q_n, v_n in zip(moved[3::2], moved[4::2]):
        clips.append(best_assignments(cos.detach()[q_n, v_n].double()).flatten())
    return q, v, torch.cat(clips)[back_d]


@OBJECTIVES.register("hungarian-matching", "GMMFormer v2: 1 - mean cos of a Hungarian query-to-clip matching per video")
def hungarian_matching(queries: torch.Tensor, clips: torch.Tensor, positive: torch.Tensor,
                       min_queries: int = 2) -> torch.Tensor:
    """GMMFormer v2's matching loss: 1 - mean cos(q, c) over the pairs of an optimal assignment
    (maximising the summed cosine, as the reference's scipy linear_sum_assignment; solved on the
    device by `matching_pairs`) between the positive queries of each video and the video's clips.
    queries [Q, D]; clips [V, C, D]; positive [Q, V]."""
    cos = torch.einsum("qd,vcd->qvc", F.normalize(queries, dim=-1), F.normalize(clips, dim=-1))
    q, v, c = matching_pairs(cos, positive, min_queries)
    if len(q) == 0:
        return _zero(cos)
    return 1 - cos[q, v, c].mean()
