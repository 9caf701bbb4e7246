"""Holmes' evidential objectives (Li et al., ICML'26; docs/methods/holmes.md) as pure functions.

Scores are read as Dirichlet evidence over the videos of a batch (every row a query, every
column a class):

    evidence e = exp(tanh(s) / tau),  alpha = e + 1,  S = sum_k alpha_k,  p = alpha / S
    risk(y) = sum_k (y_k - p_k)^2 + p_k (1 - p_k) / (S + 1)      (evidential squared-error risk)

on the frame branch, the clip branch and their Dempster-Shafer combination (`ds_combine`).
`classes` [Q, V] (default: every column) restricts a row's Dirichlet to its classes, so that a
detector's ambiguous pairs (neither positive nor negative) take no part: with every column a
class this is the reference's computation.

The targets are built apart (`soft_targets`, Holmes' query-adaptive labels: the treatment that
reads a detector's confidence in each labelled pair), and within each video a partial optimal
transport with a dustbin (`partial_transport`) gives the query-clip pseudo-labels of the
within-video evidential loss (`intra_video_evidential`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from prvr.harness.base import masks
from prvr.harness.base.registry import OBJECTIVES
from prvr.methods.objectives.ranking import masked_logsumexp, mean_where

NO_MASS = -1e9  # log-mass of a padding row of the transport (the reference's); exp() of it is 0


# ----------------------------------------------------------------------------- evidence
def wide(t: torch.Tensor) -> torch.Tensor:
    """t in float32 at least (float64 stays): evidence reaches e^20 at tau 0.05, which half
    precision would lose."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def evidence(scores: torch.Tensor, tau: float) -> torch.Tensor:
    """exp(tanh(s) / tau)."""
    return torch.exp(torch.tanh(wide(scores)) / tau)


def all_classes(scores: torch.Tensor) -> torch.Tensor:
    return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)


def dirichlet_alpha(scores: torch.Tensor, tau: float, classes: torch.Tensor | None = None) -> torch.Tensor:
    """alpha = evidence + 1 on each row's classes, 0 elsewhere (a column outside the classes adds
    nothing to S)."""
    keep = all_classes(scores) if classes is None else classes
    return (evidence(scores, tau) + 1) * keep


def uncertainty(alpha: torch.Tensor, classes: torch.Tensor | None = None) -> torch.Tensor:
    """u = K / S per row [Q], K the row's number of classes (subjective logic's vacuity)."""
    k = alpha.shape[1] if classes is None else classes.sum(1)
    return k / alpha.sum(1)


def expected_entropy(alpha: torch.Tensor, classes: torch.Tensor | None = None) -> torch.Tensor:
    """E_{p ~ Dir(alpha)} [H(p)] = sum_k (alpha_k / S) (digamma(S + 1) - digamma(alpha_k + 1)) per row [Q]."""
    s = alpha.sum(1, keepdim=True)
    terms = alpha / s * (torch.digamma(s + 1) - torch.digamma(alpha + 1))
    return (terms if classes is None else terms * classes).sum(1)


def risk_rows(alpha: torch.Tensor, target: torch.Tensor, classes: torch.Tensor | None = None) -> torch.Tensor:
    """The evidential squared-error risk of each row [Q]: sum_k (y_k - p_k)^2 + p_k (1 - p_k) / (S + 1)
    over the row's classes (alpha 0 and y 0 outside them add nothing)."""
    s = alpha.sum(1, keepdim=True)
    p = alpha / s
    terms = (target - p) ** 2 + p * (1 - p) / (s + 1)
    return (terms if classes is None else terms * classes).sum(1)


@dataclass
class Combined:
    """A Dempster-Shafer combination of two Dirichlet opinions (per row)."""

    evidence: torch.Tensor  # [Q, V]
    alpha: torch.Tensor  # [Q, V]: evidence + 1 on the classes
    belief: torch.Tensor  # [Q, V]
    uncertainty: torch.Tensor  # [Q, 1]


def ds_combine(alpha_a: torch.Tensor, alpha_b: torch.Tensor, classes: torch.Tensor | None = None) -> Combined:
    """Dempster's rule on two opinions (subjective logic; the reference's `DS_Combin_two`):
    b = e / S, u = K / S for each; conflict C = sum_{i != j} b^a_i b^b_j;
    b = (b^a b^b + b^a u^b + b^b u^a) / (1 - C), u = u^a u^b / (1 - C), S = K / u, e = b S."""
    keep = all_classes(alpha_a) if classes is None else classes
    k = keep.sum(1, keepdim=True).to(alpha_a.dtype)
    s_a, s_b = alpha_a.sum(1, keepdim=True), alpha_b.sum(1, keepdim=True)
    b_a, b_b = (alpha_a - 1).clamp(min=0) * keep / s_a, (alpha_b - 1).clamp(min=0) * keep / s_b
    u_a, u_b = k / s_a, k / s_b
    conflict = b_a.sum(1, keepdim=True) * b_b.sum(1, keepdim=True) - (b_a * b_b).sum(1, keepdim=True)
    belief = (b_a * b_b + b_a * u_b + b_b * u_a) / (1 - conflict)
    u = u_a * u_b / (1 - conflict)
    e = belief * (k / u)
    return Combined(e, (e + 1) * keep, belief, u)


@OBJECTIVES.register("holmes-evidential", "Holmes: evidential squared-error risk of frame, clip and their DS combination")
def evidential_risks(frame: torch.Tensor, clip: torch.Tensor, target: torch.Tensor, tau: float,
                     classes: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The three inter-video evidential terms, each the mean risk over the queries: of the frame
    branch's Dirichlet, of the clip branch's, and of their combination (`ds_combine`).
    frame, clip [Q, V] cosine scores; target [Q, V] rows summing to 1 over the classes."""
    alpha_f, alpha_c = dirichlet_alpha(frame, tau, classes), dirichlet_alpha(clip, tau, classes)
    both = ds_combine(alpha_f, alpha_c, classes)
    return {"frame": risk_rows(alpha_f, target, classes).mean(), "clip": risk_rows(alpha_c, target, classes).mean(),
            "combined": risk_rows(both.alpha, target, classes).mean()}


# ----------------------------------------------------------------------------- the treatment
def label_confidence(positive: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """c_q [Q, 1]: the mean confidence of row q's positive pairs (1 for a row without one)."""
    pos = positive.float()
    count = pos.sum(1, keepdim=True)
    return torch.where(count > 0, (wide(confidence) * pos).sum(1, keepdim=True) / count.clamp(min=1), 1.0)


def scores_softmax(branch_scores: Sequence[torch.Tensor], classes: torch.Tensor) -> torch.Tensor:
    """mean_b softmax(s_b[q]) over the row's classes [Q, V] (detached scores; 0 outside the classes)."""
    return torch.stack([wide(s.detach()).masked_fill(~classes, float("-inf")).softmax(1)
                        for s in branch_scores]).mean(0)


def soft_targets(branch_scores: Sequence[torch.Tensor], positive: torch.Tensor, confidence: torch.Tensor,
                 classes: torch.Tensor | None = None) -> torch.Tensor:
    """Holmes' query-adaptive labels from any detector's relations: row q of the target is

        c_q * y_q + (1 - c_q) * mean_b softmax(s_b[q])        (detached scores, over the row's classes)

    with y_q the labels (positive pairs, normalised to sum 1) and c_q the mean confidence of its
    positive pairs (`label_confidence`). A detector that trusts a label (confidence 1) leaves its one-hot
    row; the `holmes` detector gives the positive pair of a query it smooths confidence 1 - beta, which
    makes the row the reference's (1 - beta) y + beta / 2 (p_frame + p_clip)."""
    keep = all_classes(positive) if classes is None else classes
    pos = positive.float()
    y = pos / pos.sum(1, keepdim=True).clamp(min=1)
    c = label_confidence(positive, confidence)
    return c * y + (1 - c) * scores_softmax(branch_scores, keep)


@OBJECTIVES.register("soft-infonce", "InfoNCE whose text-to-video term is a cross-entropy against Holmes' soft "
                                     "targets (the standard objectives' loss.treatment=soft)")
def soft_info_nce(scores: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, temperature: float,
                  target_scores: Sequence[torch.Tensor], confidence: torch.Tensor) -> torch.Tensor:
    """`ranking.info_nce` with its text-to-video term a soft cross-entropy against `soft_targets`
    (Holmes' query-adaptive labels from the branches' `target_scores`, the classes P u N). With
    logits l = scores / temperature and p_q = softmax(l_q) over the row's classes, row q's term is

        c_q * (-log sum_{v in P_q} p_qv) + (1 - c_q) * (-sum_v pbar_qv log p_qv)

    c_q, pbar_q as in `soft_targets`: for a row with one positive, -sum_v t_qv log p_qv with t the soft
    target; with several, the label's part is InfoNCE's multi-positive term. Where c_q = 1 (every
    detector but `holmes`) the row is InfoNCE's, to the last bit. The video-to-text term is InfoNCE's."""
    logits = scores / temperature
    classes = positive | negative
    c = label_confidence(positive, confidence).to(logits.dtype)
    spread = scores_softmax(target_scores, classes).to(logits.dtype)
    den = masked_logsumexp(logits, classes, 1)
    t2v = c[:, 0] * (den - masked_logsumexp(logits, positive, 1)) \
        + (1 - c[:, 0]) * (den - (spread * logits.masked_fill(~classes, 0)).sum(1))
    v2t = masked_logsumexp(logits, classes, 0) - masked_logsumexp(logits, positive, 0)
    return (mean_where(t2v, positive.any(1), masks.covered(positive, 1), scores)
            + mean_where(v2t, positive.any(0), masks.covered(positive, 0), scores))


# ----------------------------------------------------------------------------- within a video
def partial_transport(logits: torch.Tensor, dustbin: torch.Tensor, rows: torch.Tensor,
                      iterations: int) -> torch.Tensor:
    """Sinkhorn's partial transport with a dustbin (log domain, no gradients), per video.

    logits [G, M, N]: query-clip affinities of G videos (M query rows, padding rows where `rows`
    [G, M] is false); dustbin [G]: the affinity of an extra row that can take any clip. Row
    masses: 1 / (N + m) for each of the m real queries, N / (N + m) for the dustbin; column
    masses 1 / N. Returns the plan's real rows [G, M, N], each scaled to sum 1 (padding rows 0)."""
    with torch.no_grad():
        g, m, n = logits.shape
        z = wide(torch.cat([logits, dustbin.view(g, 1, 1).expand(g, 1, n)], dim=1))
        real = rows.sum(1, keepdim=True).to(z.dtype)  # [G, 1]
        log_n = math.log(n)
        row_mass = (-torch.log(real + n)).expand(g, m).masked_fill(~rows, NO_MASS)
        log_mu = torch.cat([row_mass, log_n - torch.log(real + n)], dim=1)  # [G, M + 1]
        log_nu = z.new_full((g, n), -log_n)
        u, v = torch.zeros_like(log_mu), torch.zeros_like(log_nu)
        for _ in range(iterations):
            u = log_mu - torch.logsumexp(z + v[:, None, :], dim=2)
            v = log_nu - torch.logsumexp(z + u[:, :, None], dim=1)
        plan = (z + u[:, :, None] + v[:, None, :] + log_n).exp()[:, :m] * rows[..., None]
        return plan / (plan.sum(2, keepdim=True) + 1e-8)


@dataclass
class QueryGroups:
    """A batch's queries grouped by labelled video: index [G, M] into the queries (M the most
    queries of one video), rows [G, M] which entries are real, videos [G] the video of each group."""

    index: torch.Tensor
    rows: torch.Tensor
    videos: torch.Tensor


def group_queries(video_of_query: torch.Tensor) -> QueryGroups:
    """The queries of each video that has any, in query order, built on the host from the
    labels' described values (harness/base/masks.py) and moved without a wait."""
    labels = masks.host_values(video_of_query)
    videos, counts = np.unique(labels, return_counts=True)
    order = np.argsort(labels, kind="stable")
    slot = np.arange(len(labels)) - np.repeat(np.cumsum(counts) - counts, counts)
    group = np.repeat(np.arange(len(videos)), counts)
    index = np.zeros((len(videos), int(counts.max(initial=0))), dtype=np.int64)
    rows = np.zeros(index.shape, dtype=bool)
    index[group, slot], rows[group, slot] = order, True
    device = video_of_query.device
    return QueryGroups(*(masks.to_device(t, device) for t in masks.host_tensors(index, rows, videos)))


def within_video_affinity(clips: torch.Tensor, queries: torch.Tensor, groups: QueryGroups) -> torch.Tensor:
    """Cosine of each query with each clip of its own video, min-max scaled to [0, 1] per video
    over its real queries: [G, M, C] (padding rows 0)."""
    cos = torch.einsum("gmd,gcd->gmc", F.normalize(queries[groups.index], dim=-1),
                       F.normalize(clips[groups.videos], dim=-1))
    cos = wide(cos)
    real = groups.rows[..., None].expand_as(cos)
    low = cos.masked_fill(~real, float("inf")).amin((1, 2), keepdim=True)
    high = cos.masked_fill(~real, float("-inf")).amax((1, 2), keepdim=True)
    return ((cos - low) / (high - low + 1e-8)) * real


def dustbin_values(affinity: torch.Tensor, rows: torch.Tensor, quantile: float) -> torch.Tensor:
    """Each video's dustbin [G]: the k-th smallest of its real affinities, k = int(quantile x count)
    kept within [1, count] (the reference's kthvalue)."""
    flat = affinity.detach().masked_fill(~rows[..., None], float("inf")).flatten(1).sort(1).values
    count = rows.sum(1) * affinity.shape[2]
    k = (quantile * count).long().clamp(min=1).minimum(count)
    return flat.gather(1, (k - 1)[:, None]).squeeze(1)


@OBJECTIVES.register("holmes-intra-video", "Holmes: within-video evidential risk against partial-transport pseudo-labels")
def intra_video_evidential(clips: torch.Tensor, queries: torch.Tensor, video_of_query: torch.Tensor, tau: float,
                           scale: float, quantile: float, iterations: int) -> torch.Tensor:
    """Holmes' intra-video term: within each video, the query-clip affinities (`within_video_affinity`)
    are read as evidence over the video's clips (temperature tau) and held to the pseudo-labels of a
    partial transport with a dustbin at the `quantile` of the video's affinities (logits / scale,
    `iterations` Sinkhorn steps). Mean over a video's queries of the risk, then mean over videos.
    clips [V, C, D]; queries [Q, D]; video_of_query [Q] each query's video (from the labels)."""
    groups = group_queries(video_of_query)
    affinity = within_video_affinity(clips, queries, groups)
    dustbin = dustbin_values(affinity, groups.rows, quantile)
    labels = partial_transport(affinity.detach() / scale, dustbin / scale, groups.rows, iterations)
    g, m, c = affinity.shape
    alpha = evidence(affinity, tau) + 1
    risk = risk_rows(alpha.reshape(g * m, c), labels.reshape(g * m, c)).view(g, m) * groups.rows
    return (risk.sum(1) / groups.rows.sum(1).clamp(min=1)).mean()
