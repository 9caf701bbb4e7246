"""Retrieval evaluation: rank by counting, R@K / SumR, M/V buckets and oracle metrics.

One evaluator for every command: `evaluate_model` encodes a split once (videos, then the
backbone's `index_videos`, then queries) and ranks the fused score in chunks of queries; the
trainer's validation and test, `prvr-bench evaluate` and the tests all go through it
(`score_matrices` keeps whole score matrices for score parts and ensembles). A backbone that
localizes (provides span_logits) is also evaluated on moments there: VCMR / SVMR R@K per
tIoU (harness/engine/vcmr.py).

Ranking takes scores and explicit relevance (sparse matrices), never ids to parse.
Ranks are computed by counting, not sorting: the rank of a labelled video is 1 + the
number of *other* videos scoring at least as high, so ties count against the model (a
constant model ranks every labelled video last). With several labelled videos the best
one counts. Scores are consumed in chunks of queries, so memory stays bounded.

A score that is not a finite number (NaN, +inf, -inf: a diverged model) is the worst score
there is: it is ranked as -inf. Such a video never ranks above a finite one, and a labelled
video with such a score ties with every other non-finite video and, ties counting against
the model, ranks below all of them: an all-NaN model ranks every labelled video last
instead of first (NaN compares false, so counting `>=` alone would put it at rank 1).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import numpy as np
import scipy.sparse as sp
import torch

from prvr.harness.base import progress

from prvr.harness.engine import vcmr
from prvr.harness.base.contract import as_backbone
from prvr.harness.base.encoding import QUERY_BATCH, VIDEO_BATCH, encode_batches
from prvr.harness.base.scores import worst_if_nonfinite
from prvr.harness.engine.sections import EvalConfig


KS = (1, 5, 10, 100)
# Moment length / video length buckets (MS-SL / ARL "M/V" analysis): short, medium, long.
BUCKETS = {"short": (0.0, 0.2), "medium": (0.2, 0.4), "long": (0.4, 1.0)}

ScoreFn = Callable[[int, int], torch.Tensor]
# what else a scoring pass feeds: (first query, the chunk's fused scores [q, V] as ranked: float and
# NaN-free, the chunk's labelled ranks [q]), in query order, both where the scores are (rankings.RankingSink
# keeps a split's stored rankings from the scores and ranks the evaluator makes)
ChunkSink = Callable[[int, torch.Tensor, torch.Tensor], None]


def padded_targets(rel: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Sparse [Q, V] relevance -> ([Q, M] video indices, [Q, M] validity mask)."""
    rel = sp.csr_matrix(rel, dtype=bool)
    rel.eliminate_zeros()
    counts = np.diff(rel.indptr)
    width = max(int(counts.max(initial=0)), 1)
    idx = np.zeros((rel.shape[0], width), dtype=np.int64)
    mask = np.arange(width)[None, :] < counts[:, None]
    idx[mask] = rel.indices
    return idx, mask


def count_ranks(scores: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rank of the best target per query: min over targets t of #{v : s_v >= s_t}.

    scores [q, V]; targets, mask [q, M]. Queries without any target get rank V + 1.
    Counting includes the target itself, which equals 1 + #{other videos >= s_t}.
    Scores must be NaN-free (`worst_if_nonfinite`).
    """
    return target_ranks(scores, targets, mask).min(1).values


def target_ranks(scores: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rank of every target per query, #{v : s_v >= s_t} ([q, M]; V + 1 where masked)."""
    target_scores = scores.gather(1, targets)  # [q, M]
    ranks = torch.empty_like(targets)
    for m in range(targets.shape[1]):  # M is tiny (labelled videos per query; many: `listed_target_ranks`)
        ranks[:, m] = (scores >= target_scores[:, m : m + 1]).sum(1)
    return ranks.masked_fill(~mask, scores.shape[1] + 1)


PAIR_BLOCK = 1024  # listed (query, target) pairs compared at once by `listed_target_ranks` (memory only)


def listed_target_ranks(scores: torch.Tensor, targets: np.ndarray, mask: np.ndarray,
                        block: int = PAIR_BLOCK) -> torch.Tensor:
    """`target_ranks` with one row comparison per listed target instead of one per padded slot:
    the same [q, M] ranks (V + 1 where masked). The padded width is the chunk's most targets
    (a vague query of simulated TVR has dozens of relevant videos), so `target_ranks` compares
    every row of the chunk that many times while most queries list one to three targets.
    targets, mask: the host's [q, M] (`padded_targets`), so the pairs are found without asking
    the device. Scores must be NaN-free (`worst_if_nonfinite`)."""
    num_videos, dev = scores.shape[1], scores.device
    flat = np.flatnonzero(mask)  # row-major: query by query, each query's targets in order
    ranks = torch.full((mask.size,), num_videos + 1, dtype=torch.int64, device=dev)
    rows = torch.as_tensor(flat // mask.shape[1], device=dev)
    cols = torch.as_tensor(np.asarray(targets).reshape(-1)[flat], device=dev)
    slots = torch.as_tensor(flat, device=dev)
    for s in range(0, len(flat), block):
        row_scores = scores.index_select(0, rows[s : s + block])  # [pairs, V]
        target = row_scores.gather(1, cols[s : s + block, None])
        ranks[slots[s : s + block]] = (row_scores >= target).sum(1)
    return ranks.view(mask.shape)


def relevant_in_top(ranks: torch.Tensor, mask: torch.Tensor, ks: Iterable[int] = KS) -> torch.Tensor:
    """[q, len(ks)]: how many of each query's targets rank within the top k (`target_ranks`; a
    video tied with the k-th is within only when every video tied with it is)."""
    return torch.stack([((ranks <= k) & mask).sum(1) for k in ks], dim=1)


def count_above(scores: torch.Tensor, label_idx: torch.Tensor, label_mask: torch.Tensor,
                extra_idx: torch.Tensor, extra_mask: torch.Tensor) -> torch.Tensor:
    """Per query: how many truly relevant unlabelled videos score >= the best labelled one."""
    best = scores.gather(1, label_idx).masked_fill(~label_mask, float("-inf")).max(1).values
    extra = scores.gather(1, extra_idx)
    return ((extra >= best[:, None]) & extra_mask).sum(1)


def recall_table(ranks: np.ndarray, ks: Iterable[int] = KS) -> dict[str, float]:
    """R@K in percent and SumR from 1-based ranks."""
    ranks = np.asarray(ranks)
    out: dict[str, float] = {}
    for k in ks:
        out[f"R@{k}"] = float(100.0 * np.mean(ranks <= k)) if len(ranks) else float("nan")
    out["SumR"] = float(sum(out[f"R@{k}"] for k in ks))
    return out


def summarize_ranks(ranks: np.ndarray) -> dict[str, float]:
    table = recall_table(ranks)
    table["median_rank"] = float(np.median(ranks)) if len(ranks) else float("nan")
    table["mean_rank"] = float(np.mean(ranks)) if len(ranks) else float("nan")
    table["n"] = int(len(ranks))
    return table


def bucket_of(fraction: np.ndarray) -> np.ndarray:
    """Bucket name per query from moment/video fraction ('' where unknown)."""
    out = np.full(len(fraction), "", dtype=object)
    for name, (lo, hi) in BUCKETS.items():
        # (lo, hi]; a fraction above 1 (annotation past the end) counts as long.
        sel = (fraction > lo) & ((fraction <= hi) | (hi == 1.0))
        out[sel & np.isfinite(fraction)] = name
    return out


def compute_ranks(score_fn: ScoreFn, num_queries: int, labels: sp.csr_matrix,
                  relevance: sp.csr_matrix | None = None, chunk: int = 1024,
                  progress: Callable[[int], None] | None = None, sink: ChunkSink | None = None) -> dict[str, np.ndarray]:
    """Ranks of every query from chunked scores (the counting path); each chunk's scores and labelled
    ranks also go to `sink` where one is given.

    Returns {'labelled': ranks, and where relevance is given: 'oracle': best rank among all
    truly relevant videos, 'above': relevant unlabelled videos scored >= the labelled one,
    'relevant_top': [Q, len(KS)] relevant videos within the top K (dense recall)}.
    """
    lab_idx, lab_mask = padded_targets(labels)
    out: dict[str, list[np.ndarray]] = {"labelled": []}
    if relevance is not None:
        rel_idx, rel_mask = padded_targets(relevance)
        extra_idx, extra_mask = padded_targets(_difference(relevance, labels))
        out.update(oracle=[], above=[], relevant_top=[])
    for start in range(0, num_queries, chunk):
        end = min(start + chunk, num_queries)
        scores = worst_if_nonfinite(score_fn(start, end).float())
        dev = scores.device
        li = torch.as_tensor(lab_idx[start:end], device=dev)
        lm = torch.as_tensor(lab_mask[start:end], device=dev)
        labelled = count_ranks(scores, li, lm)
        if sink is not None:
            sink(start, scores, labelled)
        out["labelled"].append(labelled.cpu().numpy())
        if relevance is not None:
            rm = torch.as_tensor(rel_mask[start:end], device=dev)
            each = listed_target_ranks(scores, rel_idx[start:end], rel_mask[start:end])
            out["oracle"].append(each.min(1).values.cpu().numpy())
            out["relevant_top"].append(relevant_in_top(each, rm).cpu().numpy())
            ei = torch.as_tensor(extra_idx[start:end], device=dev)
            em = torch.as_tensor(extra_mask[start:end], device=dev)
            out["above"].append(count_above(scores, li, lm, ei, em).cpu().numpy())
        if progress is not None:
            progress(end - start)
    return {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in out.items()}


def _difference(a: sp.csr_matrix, b: sp.csr_matrix) -> sp.csr_matrix:
    a = sp.csr_matrix(a, dtype=bool)
    b = sp.csr_matrix(b, dtype=bool)
    return sp.csr_matrix(a.astype(np.int8) - a.multiply(b).astype(np.int8), dtype=bool)


def metrics_from_ranks(ranks: dict[str, np.ndarray], moment_fraction: np.ndarray | None = None,
                       relevance: sp.csr_matrix | None = None) -> dict:
    """The metrics block of a run record: R@K, SumR, ranks, M/V buckets, oracle."""
    lab = ranks["labelled"]
    metrics: dict[str, Any] = summarize_ranks(lab)
    metrics["buckets"] = {}
    if moment_fraction is not None and np.isfinite(moment_fraction).any():
        names = bucket_of(np.asarray(moment_fraction, dtype=np.float64))
        for b in BUCKETS:
            sel = names == b
            metrics["buckets"][b] = {**recall_table(lab[sel]), "n": int(sel.sum())}
    metrics["oracle"] = oracle_block(ranks, relevance) if "oracle" in ranks else {}
    return metrics


def oracle_block(ranks: dict[str, np.ndarray], relevance: sp.csr_matrix | None) -> dict:
    """The `oracle` metrics over the queries the relevance covers (those with a relevant video:
    a relevance file may cover part of a split, e.g. TVR's visual queries only): R@K and SumR
    counting a hit when any relevant video is in the top K; dense recall `dense R@K`, prvr-ea's
    multi-GT Recall@K, |top K ∩ relevant| / |relevant| averaged over queries (where the ranks
    hold `relevant_top`); `unlabelled_above` (where they hold `above`); the multi-relevant
    share; `n` covered queries of `queries`."""
    oracle = ranks["oracle"]
    counts = (np.diff(sp.csr_matrix(relevance).indptr) if relevance is not None
              else np.ones(len(oracle), dtype=np.int64))
    covered = counts > 0
    block: dict = recall_table(oracle[covered])
    above = ranks.get("above")
    block["unlabelled_above"] = None if above is None else (
        float(np.mean(above[covered])) if covered.any() else float("nan"))
    block["multi_relevant_share"] = multi_relevant_share(relevance[covered]) if relevance is not None else None
    if "relevant_top" in ranks and relevance is not None:
        block.update(dense_recall(ranks["relevant_top"][covered], counts[covered]))
    block["n"], block["queries"] = int(covered.sum()), int(len(covered))
    return block


def dense_recall(relevant_top: np.ndarray, relevant: np.ndarray, ks: Iterable[int] = KS) -> dict[str, float]:
    """`dense R@K` (percent) and their sum `dense SumR`: per query |top K ∩ relevant| / |relevant|,
    averaged (prvr-ea's multi-GT Recall@K); relevant_top [Q, len(ks)], relevant [Q] > 0."""
    out: dict[str, float] = {}
    for i, k in enumerate(ks):
        share = relevant_top[:, i] / np.asarray(relevant, dtype=np.float64) if len(relevant) else np.zeros(0)
        out[f"dense R@{k}"] = float(100.0 * np.mean(share)) if len(share) else float("nan")
    out["dense SumR"] = float(sum(out[f"dense R@{k}"] for k in ks))
    return out


def evaluate_scores(scores: torch.Tensor | np.ndarray, labels: sp.csr_matrix,
                    relevance: sp.csr_matrix | None = None,
                    moment_fraction: np.ndarray | None = None, chunk: int = 1024) -> dict:
    """Evaluate a full [Q, V] score matrix (convenience wrapper over the chunked path)."""
    scores = torch.as_tensor(scores)
    ranks = compute_ranks(lambda s, e: scores[s:e], scores.shape[0], labels, relevance, chunk)
    return metrics_from_ranks(ranks, moment_fraction, relevance)


@torch.no_grad()
def encode_split(model: torch.nn.Module, split, batcher, device: torch.device,
                 queries: dict[str, torch.Tensor] | None = None) -> tuple[dict, dict]:
    """(queries, videos) of a whole split, encoded in eval mode; the videos indexed. `queries`: the
    split's queries as this model already encoded them (`encode_queries`), kept."""
    model.eval()
    pin = device.type == "cuda"  # the split's batches, made once (Batcher.in_order), go to the GPU asynchronously
    backbone = as_backbone(model)
    videos = index_videos(model, encode_batches(backbone.encode_videos, batcher.in_order("videos", VIDEO_BATCH, pin),
                                                device))
    return (encode_queries(model, batcher, device) if queries is None else queries), videos


@torch.no_grad()
def encode_queries(model: torch.nn.Module, batcher, device: torch.device) -> dict[str, torch.Tensor]:
    """Every query of a split, encoded in eval mode (what a split with other videos and the same queries,
    such as the noise curve's levels, shares)."""
    model.eval()
    batches = batcher.in_order("queries", QUERY_BATCH, device.type == "cuda")
    return encode_batches(as_backbone(model).encode_queries, batches, device)


@torch.no_grad()
def evaluate_model(model: torch.nn.Module, split, batcher, device: torch.device, chunk: int,
                   show: str | None = None, eval_cfg: EvalConfig | None = None, moments: bool = True,
                   sink: ChunkSink | None = None, queries: dict[str, torch.Tensor] | None = None) -> dict:
    """The metrics block of `split` for `model`: encode once, score the fused score in chunks
    of `chunk` queries, rank by counting; each chunk's scores also go to `sink` where one is given
    (a run's stored rankings, from the same scores). `queries`: the split's queries as the model
    encoded them (`encode_queries`), where several evaluations share them. `show` names a progress
    bar. A backbone that localizes (provides span_logits) adds the moment metrics of
    harness/engine/vcmr.py (VCMR / SVMR R@K per tIoU, and oracle VCMR under `oracle`), with the `eval`
    section's vcmr_* settings (`eval_cfg`; None: their defaults); `moments=False` skips them (e.g. the
    noise curves, which keep the retrieval figures only)."""
    queries, videos = encode_split(model, split, batcher, device, queries)
    watch = ScoreWatch(fused_scores(model, queries, videos))
    ranks = _encoded_ranks(model, split, queries, videos, chunk, show, watch, sink)
    metrics = metrics_from_ranks(ranks, split.moment_fraction(), split.relevance)
    if watch.problem():  # ranks of scores that tell no video apart: marked (runner.py), never a plain figure
        metrics["degenerate_scores"] = watch.problem()
    if moments and vcmr.localizes(model):
        keep = getattr(sink, "keep_moments", None)  # a RankingSink keeps the per-query moment ranks too
        metrics = vcmr.merge(metrics, vcmr.evaluate_moments(model, split, batcher, queries, videos, chunk, eval_cfg,
                                                            show, keep))
    return metrics


@torch.no_grad()
def split_ranks(model: torch.nn.Module, split, batcher, device: torch.device, chunk: int,
                show: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """`evaluate_model`'s ranks before they become metrics, with the encoded queries: (the
    `compute_ranks` dict of the fused score, the split's queries as the model encoded them),
    for analyses per query (e.g. RAL's uncertainty groups) on the evaluator's own ranks."""
    queries, videos = encode_split(model, split, batcher, device)
    return _encoded_ranks(model, split, queries, videos, chunk, show), queries


def _encoded_ranks(model: torch.nn.Module, split, queries: dict[str, torch.Tensor], videos: dict[str, torch.Tensor],
                   chunk: int, show: str | None, score_fn: ScoreFn | None = None,
                   sink: ChunkSink | None = None) -> dict[str, np.ndarray]:
    """The `compute_ranks` dict of the fused score of a split the model has encoded."""
    with progress.task(show, total=split.num_queries) as advance:
        return compute_ranks(score_fn or fused_scores(model, queries, videos), split.num_queries, split.labels(),
                             split.relevance, chunk=chunk, progress=advance, sink=sink)


class ScoreWatch:
    """A ScoreFn that notes, chunk by chunk, scores that are not finite and whether all scores
    are one value (a model that tells no video apart: all-NaN weights, a collapsed encoder)."""

    def __init__(self, score_fn: ScoreFn) -> None:
        self.score_fn, self.nonfinite, self.total = score_fn, 0, 0
        self.low, self.high = math.inf, -math.inf

    def __call__(self, start: int, end: int) -> torch.Tensor:
        scores = self.score_fn(start, end)
        self.total += scores.numel()
        if not scores.numel():
            return scores
        # one pass and one read: the range is NaN where a score is, so a finite range means finite scores
        low_f, high_f = torch.stack(torch.aminmax(scores)).tolist()
        if not (math.isfinite(low_f) and math.isfinite(high_f)):  # the count, and the finite range
            finite = torch.isfinite(scores)
            self.nonfinite += int((~finite).sum())
            low_f = float(scores.masked_fill(~finite, math.inf).min())
            high_f = float(scores.masked_fill(~finite, -math.inf).max())
        self.low, self.high = min(self.low, low_f), max(self.high, high_f)
        return scores

    def problem(self) -> str:
        """What is wrong with the scores seen, "" when nothing is."""
        if self.nonfinite:
            return f"{self.nonfinite} of {self.total} scores not finite"
        if self.total > 1 and self.low == self.high:
            return f"every score is {self.low:g}"
        return ""


def fused_scores(model: torch.nn.Module, queries: dict[str, torch.Tensor], videos: dict[str, torch.Tensor]) -> ScoreFn:
    """The ScoreFn of a split the model has encoded: the fused score of queries start:end
    against every video."""
    backbone = as_backbone(model)

    def score(start: int, end: int) -> torch.Tensor:
        return backbone.score({k: t[start:end] for k, t in queries.items()}, videos).fused

    return score


@torch.no_grad()
def score_matrices(model: torch.nn.Module, split, batcher, device: torch.device, chunk: int,
                   keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Whole [queries, videos] score matrices of a split, each chunk of queries scored once:
    {key: matrix} for `keys` (None: every score that ranks on its own, e.g. clip, frame,
    fused). For score parts and ensembles; `evaluate_model` ranks without keeping them."""
    queries, videos = encode_split(model, split, batcher, device)
    backbone = as_backbone(model)
    parts: dict[str, list[torch.Tensor]] = {}
    for start in range(0, split.num_queries, chunk):
        out = backbone.score({k: t[start : start + chunk] for k, t in queries.items()}, videos).ranked()
        for k in keys or list(out):
            parts.setdefault(k, []).append(out[k].float().cpu())
    return {k: torch.cat(v) for k, v in parts.items()}


def index_videos(model: torch.nn.Module, videos: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone's query-independent work on a collection of encoded videos, done once
    before its queries are scored (e.g. unit vectors of the items): `Backbone.index_videos`,
    which every registered backbone has (harness/base/registry.py BACKBONE_MEMBERS)."""
    return as_backbone(model).index_videos(videos)


def multi_relevant_share(relevance: sp.csr_matrix) -> float:
    """Share of queries (percent) with more than one truly relevant video."""
    counts = np.diff(sp.csr_matrix(relevance).indptr)
    return float(100.0 * np.mean(counts > 1)) if len(counts) else float("nan")


def reference_ranks(scores: np.ndarray, targets: list[list[int]]) -> np.ndarray:
    """Brute-force reference: full descending sort per query, ties placed pessimistically.

    The rank of target t is the position (1-based) of the last video in the sorted order
    whose score equals s_t, i.e. every tied video is placed before it. Used by tests only.
    """
    out = []
    for s, ts in zip(np.asarray(scores), targets):
        order = np.argsort(-s, kind="stable")
        sorted_s = s[order]
        best = len(s) + 1
        for t in ts:
            tied = np.nonzero(sorted_s == s[t])[0]
            best = min(best, int(tied[-1]) + 1)
        out.append(best)
    return np.asarray(out)
