"""Moment retrieval: VCMR and SVMR metrics, span decoding, and their evaluation pass.

For a backbone that localizes (it provides `span_logits`, see `localizes`), the evaluator
(`harness/engine/evaluate.py` `evaluate_model`) adds to a split's metrics block, after the video
retrieval (VR) figures it ranks from the fused score:

- `VCMR-<tIoU> R@{1, 10, 100}`: video corpus moment retrieval, a hit when one of the top k
  predicted (video, start, end) moments is in the labelled video with tIoU >= the threshold
  against the labelled moment; `VCMR SumR` sums them over thresholds and k (the paper picks
  its conditions by this sum, SBERT-PR Sec. 5.2.1); `VCMR n`: the queries with a known moment.
- `SVMR-<tIoU> R@{1, 5}`: single video moment retrieval, the same hit rule with moments
  predicted only in the labelled video.
- with a simulated world's ground truth, `oracle.VCMR-<tIoU> R@K`: a hit on *any* truly
  relevant moment (any truly relevant video, tIoU against one of that video's relevant
  moments, `datasets/sim/world.py` `relevant_moments`).

The protocol (SBERT-PR paper Eq. 1-4 and Sec. 3.2, after XML, Lei et al. 2020, TVRetrieval):

- Span decoding: P_st = softmax(start logits), P_ed = softmax(end logits) over a video's
  rows; s_tl(i, j) = P_st(i) P_ed(j) for rows i <= j with n_min <= j - i <= n_max (Eq. 2, 4);
  the moment covers seconds [i, j + 1) x the video's seconds per row.
- s_vcmr = s_tl exp(alpha s_vr) (Eq. 3), s_vr being the fused score the VR figures rank. Moments
  are ranked by log s_vcmr = log P_st(i) + log P_ed(j) + alpha s_vr, the same order, without
  the underflow of a product of small probabilities or the overflow of exp.
- Only the top `vcmr_top_videos` videos by s_vr are localized (XML: 100), so a labelled video
  outside them is never hit; the best `vcmr_top_moments` moments of each query are kept.
  XML applies no NMS by default; neither do we.
- tIoU = |a ∩ b| / |a ∪ b| of two [start, end) spans, 0 when the union is empty (two identical
  zero-length spans count 0, as TVRetrieval's evaluation does), 0 for touching spans.

Ties count against the model, as the evaluator's ranks do (harness/engine/evaluate.py): the rank of
a prediction is the number of candidates scoring at least as high, itself included. A video
tied with the first one left out of the top videos is left out too (its rank is past the
cut), so a constant model localizes nothing and a model whose scores are all NaN (read as
-inf, the worst) neither; a moment tied with the best one not kept ranks past every kept
one. A score that is not finite is -inf, and a -inf candidate is no candidate.

Metrics are functions of ranked predictions (`RankedMoments`) and explicit ground truth
(`MomentTruth`), never of ids. Memory stays bounded: queries are localized in chunks whose
[queries, videos, rows, span widths] scores hold at most `ELEMENT_BUDGET` numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch

from prvr.datasets.sim.world import relevant_moments
from prvr.harness.base import progress
from prvr.harness.base.scores import worst_if_nonfinite
from prvr.harness.engine.sections import EvalConfig

VCMR_KS = (1, 10, 100)
# what else the moment pass feeds: the labelled VCMR's best-hit ranks [Q, T] and the T thresholds
# (rankings.RankingSink keeps them with a run's stored rankings)
MomentSink = Callable[[np.ndarray, tuple[float, ...]], None]
SVMR_KS = (1, 5)
SPAN_OUTPUT = "span_logits"  # the backbone output this pass reads (methods/backbones/api.py)
ELEMENT_BUDGET = 1 << 24  # span scores held at once (memory only: the results do not depend on it)


# ----------------------------------------------------------------------------- ground truth, predictions
@dataclass
class MomentTruth:
    """Ground-truth moments per query, ragged: query q's are rows offsets[q]:offsets[q + 1] of
    (video, start, end), start and end in seconds."""

    offsets: np.ndarray  # [Q + 1] int64
    video: np.ndarray  # [M] int64
    start: np.ndarray  # [M] float64
    end: np.ndarray  # [M] float64

    @classmethod
    def labelled(cls, query_video: np.ndarray, moments: np.ndarray) -> "MomentTruth":
        """One moment per query, in its labelled video; a query whose moment is unknown (NaN)
        has none."""
        moments = np.asarray(moments, dtype=np.float64).reshape(-1, 2)
        known = np.isfinite(moments).all(1)
        query = np.nonzero(known)[0]
        return cls.from_pairs(query, np.asarray(query_video)[query], moments[query], len(moments))

    @classmethod
    def from_pairs(cls, query: np.ndarray, video: np.ndarray, spans: np.ndarray, num_queries: int) -> "MomentTruth":
        """From one row per moment: its query, its video and its [start, end] seconds."""
        query = np.asarray(query, dtype=np.int64)
        order = np.argsort(query, kind="stable")
        spans = np.asarray(spans, dtype=np.float64).reshape(-1, 2)[order]
        offsets = np.searchsorted(query[order], np.arange(num_queries + 1)).astype(np.int64)
        return cls(offsets, np.asarray(video, dtype=np.int64)[order], spans[:, 0], spans[:, 1])

    @property
    def num_queries(self) -> int:
        return len(self.offsets) - 1

    def known(self) -> np.ndarray:
        """[Q] bool: queries with at least one moment (the ones a recall counts)."""
        return np.diff(self.offsets) > 0

    def padded(self, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(video, start, end, mask) [q, M] of the queries in `rows`, M the most moments of one."""
        lo, hi = self.offsets[rows.start], self.offsets[rows.stop]
        counts = np.diff(self.offsets[rows.start : rows.stop + 1])
        width = max(int(counts.max(initial=0)), 1)
        mask = np.arange(width)[None, :] < counts[:, None]
        out = [np.full(mask.shape, fill, dtype=dt) for fill, dt in ((-1, np.int64), (np.nan, np.float64),
                                                                      (np.nan, np.float64))]
        for arr, src in zip(out, (self.video, self.start, self.end)):
            arr[mask] = src[lo:hi]
        video, start, end = out
        return video, start, end, mask


@dataclass
class RankedMoments:
    """The kept predictions of every query, best first: [Q, N] (video, start, end, score); an
    empty slot has video -1 and score -inf. `beyond` [Q]: the best score among the candidates
    not kept (-inf when every candidate is kept), at most every kept score; it decides the
    ties at the cut (a kept moment tied with it ranks past every kept one)."""

    video: np.ndarray  # [Q, N] int64
    start: np.ndarray  # [Q, N] float64 seconds
    end: np.ndarray  # [Q, N] float64 seconds
    score: np.ndarray  # [Q, N] float64 (log s_vcmr from the evaluation pass; any order-preserving score here)
    beyond: np.ndarray | None = None  # [Q] float64

    def __post_init__(self) -> None:
        self.video = np.asarray(self.video, dtype=np.int64).reshape(len(self.video), -1)
        n = self.video.shape
        self.start, self.end, self.score = (np.asarray(a, dtype=np.float64).reshape(n)
                                            for a in (self.start, self.end, self.score))
        self.beyond = (np.full(n[0], -np.inf) if self.beyond is None
                       else np.asarray(self.beyond, dtype=np.float64).reshape(n[0]))
        valid = self.video >= 0
        if np.any(valid & (self.score < self.beyond[:, None])):
            raise ValueError("RankedMoments: a kept score is below `beyond` (the best score not kept)")

    @staticmethod
    def cat(parts: list["RankedMoments"]) -> "RankedMoments":
        """Consecutive chunks of queries, joined (every part keeps the same N)."""
        return RankedMoments(*(np.concatenate([getattr(p, f) for p in parts])
                               for f in ("video", "start", "end", "score", "beyond")))


def temporal_iou(start_a: np.ndarray, end_a: np.ndarray, start_b: np.ndarray, end_b: np.ndarray) -> np.ndarray:
    """tIoU of [start, end) spans, broadcast; 0 where the union is empty, NaN where a bound is NaN."""
    start_a, end_a, start_b, end_b = (np.asarray(x, dtype=np.float64) for x in (start_a, end_a, start_b, end_b))
    inter = np.clip(np.minimum(end_a, end_b) - np.maximum(start_a, start_b), 0.0, None)
    union = (end_a - start_a) + (end_b - start_b) - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), np.where(np.isnan(union), np.nan, 0.0))


def moment_ranks(pred: RankedMoments, chunk: int = 512) -> np.ndarray:
    """[Q, N] rank of each kept prediction: #{kept predictions scoring >= it} + 1 where the best
    one not kept scores >= it too (ties against the model, so a prediction tied at the cut ranks
    past every kept one); N + 1 for an empty slot."""
    n = pred.video.shape[1]
    assert pred.beyond is not None  # __post_init__ fills it
    out = np.empty(pred.video.shape, dtype=np.int64)
    for lo in range(0, len(out), chunk):
        s = pred.score[lo : lo + chunk]
        valid = pred.video[lo : lo + chunk] >= 0
        higher = (np.where(valid, s, -np.inf)[:, None, :] >= s[:, :, None]) & valid[:, None, :]
        ranks = higher.sum(2) + (pred.beyond[lo : lo + chunk, None] >= s)
        out[lo : lo + chunk] = np.where(valid, ranks, n + 1)
    return out


def moment_hits(pred: RankedMoments, truth: MomentTruth, tiou: float, chunk: int = 512) -> np.ndarray:
    """[Q, N] bool: the prediction is in a video of one of the query's true moments with tIoU
    >= `tiou` against that moment."""
    out = np.zeros(pred.video.shape, dtype=bool)
    for lo in range(0, len(out), chunk):
        rows = slice(lo, min(lo + chunk, len(out)))
        video, start, end, mask = truth.padded(rows)
        for m in range(video.shape[1]):  # M is small: moments per query
            same = (pred.video[rows] == video[:, m : m + 1]) & mask[:, m : m + 1] & (pred.video[rows] >= 0)
            iou = temporal_iou(pred.start[rows], pred.end[rows], start[:, m : m + 1], end[:, m : m + 1])
            out[rows] |= same & (iou >= tiou)
    return out


NO_HIT = np.iinfo(np.int32).max  # a query's best-hit rank where no kept prediction hits
NO_MOMENT = -1  # ... where the query has no true moment (no recall counts it)


def best_hit_ranks(pred: RankedMoments, truth: MomentTruth, tious: Iterable[float]) -> np.ndarray:
    """[Q, len(tious)] int64: per query and threshold, the rank (`moment_ranks`) of its best-ranked
    hit; `NO_HIT` where no kept prediction hits, `NO_MOMENT` where the query has no true moment.
    R@k at a threshold is the share of the queries with a moment whose rank is <= k; a run's stored
    rankings keep these columns (harness/engine/rankings.py), so the moment figures pair by query."""
    if truth.num_queries != len(pred.video):
        raise ValueError(f"{truth.num_queries} queries of ground truth for {len(pred.video)} of predictions")
    tious = tuple(tious)
    ranks = moment_ranks(pred)
    out = np.empty((len(pred.video), len(tious)), dtype=np.int64)
    for j, t in enumerate(tious):
        out[:, j] = np.where(moment_hits(pred, truth, t), ranks, NO_HIT).min(1, initial=NO_HIT)
    out[~truth.known()] = NO_MOMENT
    return out


def recalls_of_ranks(best: np.ndarray, task: str, ks: Iterable[int], tious: Iterable[float]) -> dict[str, float]:
    """{"<task>-<tIoU> R@<k>": percent} from `best_hit_ranks`' columns (one per threshold, in order):
    the share of queries with a true moment whose best hit ranks <= k (NaN when no query has one)."""
    known = best[:, 0] != NO_MOMENT if best.shape[1] else np.zeros(len(best), dtype=bool)
    out: dict[str, float] = {}
    for j, t in enumerate(tious):
        column = best[known, j]
        for k in ks:
            out[metric_name(task, t, k)] = float(100.0 * np.mean(column <= k)) if len(column) else float("nan")
    return out


def recall_at(pred: RankedMoments, truth: MomentTruth, ks: Iterable[int], tiou: float) -> dict[int, float]:
    """{k: R@k in percent}: the share of queries with a true moment whose best-ranked hit has
    rank <= k (NaN when no query has one)."""
    ks = tuple(ks)
    found = recalls_of_ranks(best_hit_ranks(pred, truth, (tiou,)), "", ks, (tiou,))
    return {k: found[metric_name("", tiou, k)] for k in ks}


def moment_metrics(pred: RankedMoments, truth: MomentTruth, task: str, ks: Iterable[int],
                   tious: Iterable[float]) -> dict[str, float]:
    """{"<task>-<tIoU> R@<k>": percent} for every threshold and k, e.g. "VCMR-0.5 R@1"."""
    tious = tuple(tious)
    return recalls_of_ranks(best_hit_ranks(pred, truth, tious), task, ks, tious)


def metric_name(task: str, tiou: float, k: int) -> str:
    return f"{task}-{float(tiou):g} R@{k}"


# ----------------------------------------------------------------------------- span decoding
def span_log_scores(start: torch.Tensor, end: torch.Tensor, n_rows: torch.Tensor, n_min: int,
                    n_max: int, bonus: torch.Tensor | None = None) -> torch.Tensor:
    """log s_tl (Eq. 2) of every span under the constraint (Eq. 4), as a band: [..., T, W] where
    entry (i, w) is the span of rows i .. j = i + n_min + w, W = the widths that fit in T rows;
    with `bonus` [...] = alpha s_vr per video, log s_vcmr (Eq. 3) instead.

    start, end: [..., T] logits over rows; n_rows: [...] rows of each video (later rows, and
    any -inf logit, are no row). A span that ends past the video, any span of a video without
    rows, and any span of a video whose bonus is not finite score -inf; no score is NaN.
    """
    t = start.shape[-1]
    rows = torch.arange(t, device=start.device)
    pad = rows >= n_rows[..., None]
    log_st, log_ed = (worst_if_nonfinite(torch.log_softmax(x.masked_fill(pad, float("-inf")), -1))
                      for x in (start, end))  # NaN: a video without rows, or NaN logits
    if bonus is not None:
        log_st = log_st + worst_if_nonfinite(bonus)[..., None]
    width = max(0, min(n_max, t - 1) - n_min + 1)
    if width == 0:
        return start.new_full((*start.shape, 0), float("-inf"))
    # ends j = i + n_min + w: row i of the band reads log_ed[i + n_min : i + n_min + width]
    padded = torch.cat([log_ed, log_ed.new_full((*log_ed.shape[:-1], n_min + width), float("-inf"))], -1)
    ends = padded[..., n_min:].unfold(-1, width, 1)[..., :t, :]
    return log_st[..., None] + ends


def select_videos(scores: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top `top` videos per query by s_vr: ([q, min(top, V)] indices, best first; their
    mask). A video whose rank (ties against the model) is past `top` is masked, so a tied group
    at the cut is left out whole; a -inf video is never selected."""
    scores = worst_if_nonfinite(scores)
    k = min(top + 1, scores.shape[1])
    values, index = scores.topk(k, dim=1)
    keep = torch.isfinite(values)
    if k > top:  # the best video left out: everything tied with it is out too
        keep &= values > values[:, top : top + 1]
        values, index, keep = values[:, :top], index[:, :top], keep[:, :top]
    return index, keep


def top_moments(scores: torch.Tensor,
                keep: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best `keep` spans of each query over its videos: scores [q, K, T, W] from
    `span_log_scores` (-inf: no candidate). Returns (video slot k, start row i, width w, score)
    [q, keep], -inf score in empty slots, and the best score not kept [q] (-inf if none)."""
    q, k, t, w = scores.shape
    flat = scores.reshape(q, k * t * w)
    n = min(keep + 1, flat.shape[1])
    values, index = flat.topk(n, dim=1) if n else (flat[:, :0], flat[:, :0].long())
    beyond = values[:, keep] if n > keep else values.new_full((q,), float("-inf"))
    values, index = values[:, :keep], index[:, :keep]
    if values.shape[1] < keep:  # fewer candidates than slots
        fill = keep - values.shape[1]
        values = torch.cat([values, values.new_full((q, fill), float("-inf"))], 1)
        index = torch.cat([index, index.new_zeros((q, fill))], 1)
    cells = max(t * w, 1)  # no span fits (w = 0): every slot is empty
    slot, rest = index // cells, index % cells
    return slot, rest // max(w, 1), rest % max(w, 1), values, beyond


def decode(slot: torch.Tensor, row: torch.Tensor, width: torch.Tensor, score: torch.Tensor, beyond: torch.Tensor,
           videos: torch.Tensor, row_seconds: np.ndarray, n_min: int) -> RankedMoments:
    """`top_moments`'s slots and rows as moments in seconds: video = videos[q, slot]; rows i ..
    i + n_min + w cover [i, i + n_min + w + 1) x the video's seconds per row."""
    video = videos.gather(1, slot).cpu().numpy()
    values = score.double().cpu().numpy()
    empty = ~np.isfinite(values)
    video = np.where(empty, -1, video)
    sec = np.where(empty, np.nan, row_seconds[np.maximum(video, 0)])
    first = row.cpu().numpy()
    last = first + n_min + width.cpu().numpy()
    return RankedMoments(video, first * sec, (last + 1) * sec, np.where(empty, -np.inf, values),
                         beyond.double().cpu().numpy())


# ----------------------------------------------------------------------------- the evaluation pass
def localizes(model: Any) -> bool:
    """Does the backbone give start / end logits (`span_logits(queries, videos, pairs)`)?"""
    return SPAN_OUTPUT in getattr(model, "provides", ()) and callable(getattr(model, SPAN_OUTPUT, None))


def rows_and_seconds(split, max_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """Per video: its rows after the loader's downsampling to `max_frames` (datasets/loader.py
    Batcher.video_features) and the seconds one row covers (duration / rows)."""
    rows = np.minimum(np.asarray(split.frames.lengths, dtype=np.int64), int(max_frames))
    return rows, np.asarray(split.durations, dtype=np.float64) / np.maximum(rows, 1)


@dataclass
class MomentSettings:
    """The `eval` section's vcmr_* fields (harness/engine/sections.py EvalConfig) this pass reads."""

    n_min: int
    n_max: int
    alpha: float
    top_videos: int
    top_moments: int
    tious: tuple[float, ...]

    @classmethod
    def of(cls, eval_cfg: EvalConfig | None) -> "MomentSettings":
        if eval_cfg is None:
            eval_cfg = EvalConfig()
        return cls(eval_cfg.vcmr_n_min, eval_cfg.vcmr_n_max, eval_cfg.vcmr_alpha, eval_cfg.vcmr_top_videos,
                   eval_cfg.vcmr_top_moments, tuple(eval_cfg.vcmr_tious))


@torch.no_grad()
def localize(model: Any, queries: dict[str, torch.Tensor], videos: dict[str, torch.Tensor],
             labelled: torch.Tensor, n_rows: torch.Tensor, row_seconds: np.ndarray,
             setting: MomentSettings) -> tuple[RankedMoments, RankedMoments]:
    """(VCMR, SVMR) predictions of one chunk of queries: the top videos by s_vr localized with
    alpha s_vr added (Eq. 3), and the labelled video (`labelled` [q]) localized alone; one
    `span_logits` call serves both (the labelled video is an extra column of the pairs)."""
    s = setting
    vr = worst_if_nonfinite(model.score(queries, videos).fused.float())
    top, keep = select_videos(vr, s.top_videos)
    pairs = torch.cat([top, labelled[:, None]], 1)
    start, end = model.span_logits(queries, videos, pairs)
    rows = n_rows[pairs]
    if start.shape[:2] != pairs.shape or end.shape != start.shape or start.shape[-1] < int(rows.max()):
        raise ValueError(f"span_logits gave start {tuple(start.shape)}, end {tuple(end.shape)} for pairs "
                         f"{tuple(pairs.shape)} of videos with up to {int(rows.max())} rows: expected "
                         "[queries, pairs, rows] each")
    bonus = torch.where(keep, s.alpha * vr.gather(1, top), torch.full_like(vr[:, :1], float("-inf")))
    bonus = torch.cat([bonus, torch.zeros_like(bonus[:, :1])], 1)  # SVMR: s_tl alone
    scores = span_log_scores(start, end, rows, s.n_min, s.n_max, bonus)
    vcmr = decode(*top_moments(scores[:, :-1], s.top_moments), top, row_seconds, s.n_min)
    svmr = decode(*top_moments(scores[:, -1:], s.top_moments), pairs[:, -1:], row_seconds, s.n_min)
    return vcmr, svmr


@torch.no_grad()
def evaluate_moments(model: Any, split, batcher, queries: dict[str, torch.Tensor], videos: dict[str, torch.Tensor],
                     chunk: int, eval_cfg: EvalConfig | None = None, show: str | None = None,
                     keep: MomentSink | None = None) -> dict[str, Any]:
    """The moment metrics of a split whose queries and videos the model has encoded (and
    indexed): {"VCMR-<t> R@<k>": ..., "VCMR SumR", "VCMR n", "SVMR-<t> R@<k>": ..., "oracle":
    {"VCMR-<t> R@<k>": ...} (empty without simulated ground truth)}. Settings: the `eval`
    section's vcmr_* fields (`eval_cfg`; None: their defaults). `keep` gets the per-query VCMR
    ranks the figures count (`moment_block`), e.g. a run's stored rankings."""
    setting = MomentSettings.of(eval_cfg)
    n_rows, row_seconds = rows_and_seconds(split, batcher.cfg.max_frames)
    device = next(iter(videos.values())).device
    rows_t = torch.as_tensor(n_rows, device=device)
    labelled = torch.as_tensor(split.query_video, device=device)
    per_query = min(setting.top_videos, split.num_videos) + 1  # videos localized, the labelled one included
    longest = max(int(n_rows.max(initial=1)), 1)
    width = max(1, min(setting.n_max, longest - 1) - setting.n_min + 1)
    step = max(1, min(chunk, ELEMENT_BUDGET // (per_query * longest * width)))
    parts: list[tuple[RankedMoments, RankedMoments]] = []
    with progress.task(None if show is None else f"{show}: moments", total=split.num_queries) as advance:
        for lo in range(0, split.num_queries, step):
            hi = min(lo + step, split.num_queries)
            parts.append(localize(model, {k: t[lo:hi] for k, t in queries.items()}, videos, labelled[lo:hi], rows_t,
                                  row_seconds, setting))
            advance(hi - lo)
    vcmr = RankedMoments.cat([p[0] for p in parts])
    svmr = RankedMoments.cat([p[1] for p in parts])
    return moment_block(vcmr, svmr, split, setting.tious, keep)


def moment_block(vcmr: RankedMoments, svmr: RankedMoments, split, tious: Iterable[float],
                 keep: MomentSink | None = None) -> dict[str, Any]:
    """The metrics of `evaluate_moments` from its predictions and the split's ground truth; `keep`
    gets the labelled VCMR's per-query best-hit ranks (`best_hit_ranks`) and the thresholds."""
    tious = tuple(tious)
    truth = MomentTruth.labelled(split.query_video, split.moments)
    best = best_hit_ranks(vcmr, truth, tious)
    if keep is not None:
        keep(best, tious)
    out: dict[str, Any] = recalls_of_ranks(best, "VCMR", VCMR_KS, tious)
    out["VCMR SumR"] = float(sum(out.values()))
    out["VCMR n"] = int(truth.known().sum())
    out.update(moment_metrics(svmr, truth, "SVMR", SVMR_KS, tious))
    out["oracle"] = {}
    oracle = true_moments(split)
    if oracle is not None:
        out["oracle"] = moment_metrics(vcmr, oracle, "VCMR", VCMR_KS, tious)
    return out


def true_moments(split) -> MomentTruth | None:
    """Every truly relevant moment of a simulated split (None for other data)."""
    found = relevant_moments(split)
    return None if found is None else MomentTruth.from_pairs(*found, split.num_queries)


def merge(metrics: dict[str, Any], moments: dict[str, Any]) -> dict[str, Any]:
    """A split's metrics block with the moment metrics added (oracle ones under `oracle`)."""
    moments = dict(moments)
    oracle = moments.pop("oracle", {})
    metrics.update(moments)
    if oracle:
        metrics.setdefault("oracle", {}).update(oracle)
    return metrics
