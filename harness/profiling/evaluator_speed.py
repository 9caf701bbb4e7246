"""Evaluator speed at the TVR test shape: our counting evaluator against a per-query argsort
loop like the reference evaluators (MS-SL family), same machine, same run.

Protocol: random L2-normalised embeddings, queries [Q, d] and videos [V, F + C, d] (frames
and clips of each video as one item set); score = max cosine over a video's items, computed
in query chunks into a [Q, V] matrix (timed once: both evaluators rank the same matrix).
Query i is labelled with video i // queries_per_video. Ranking by counting:
harness.evaluate.compute_ranks over the scores. Ranking by sorting: per query, np.argsort
of the scores on the host (the matrix moved there first, timed with it), then the position
of the labelled video; the position is read pessimistically (the last of equal scores), the
tie rule of the counting evaluator, so both must give identical ranks on every query (the
references place ties wherever argsort puts them). Each ranking is timed `repeats` times; the
median counts.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from prvr.harness.base.devices import device_name
from prvr.harness.engine.evaluate import compute_ranks

_T = TypeVar("_T")  # what a timed call returns


@dataclass(frozen=True)
class EvalShape:
    queries: int = 10_895  # PRVR TVR test split (the original TVR val split)
    videos: int = 2_179
    frames: int = 128
    clips: int = 32
    dim: int = 384
    queries_per_video: int = 5

    def describe(self) -> str:
        return (f"{self.queries:,} queries x {self.videos:,} videos, {self.frames} frames + {self.clips} clips, "
                f"d = {self.dim}")


TVR_TEST = EvalShape()
QUICK = EvalShape(queries=400, videos=80, frames=16, clips=8, dim=32, queries_per_video=5)


@dataclass
class EvaluatorSpeed:
    shape: EvalShape
    score_s: float
    count_s: float
    argsort_s: float
    identical: int  # queries whose ranks agree
    device: str

    @property
    def ranking_ratio(self) -> float:
        return self.argsort_s / self.count_s

    @property
    def total_ratio(self) -> float:
        return (self.score_s + self.argsort_s) / (self.score_s + self.count_s)


def random_embeddings(shape: EvalShape, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(shape.queries, shape.dim, generator=gen), dim=-1)
    v = F.normalize(torch.randn(shape.videos, shape.frames + shape.clips, shape.dim, generator=gen), dim=-1)
    return q.to(device), v.to(device)


@torch.no_grad()
def max_cosine_scores(q: torch.Tensor, v: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """[Q, d] x [V, N, d] (both L2-normalised) -> [Q, V] max over the N items, in query chunks."""
    items = v.reshape(-1, v.shape[-1]).T
    out = torch.empty(q.shape[0], v.shape[0], device=q.device)
    for s in range(0, q.shape[0], chunk):
        out[s : s + chunk] = (q[s : s + chunk] @ items).view(-1, v.shape[0], v.shape[1]).amax(-1)
    return out


def labels_of(shape: EvalShape) -> sp.csr_matrix:
    video = (np.arange(shape.queries) // shape.queries_per_video) % shape.videos
    return sp.csr_matrix((np.ones(shape.queries, dtype=bool), (np.arange(shape.queries), video)),
                         shape=(shape.queries, shape.videos))


def counting_ranks(scores: torch.Tensor, labels: sp.csr_matrix) -> np.ndarray:
    """Our evaluator's path (harness.evaluate.compute_ranks) over a precomputed score matrix."""
    return compute_ranks(lambda s, e: scores[s:e], scores.shape[0], labels)["labelled"]


def argsort_ranks(scores: torch.Tensor, labels: sp.csr_matrix) -> np.ndarray:
    """Per-query argsort loop on the host, as the reference evaluators rank."""
    host = scores.cpu().numpy()
    target = labels.indices  # one labelled video per query
    ranks = np.empty(len(host), dtype=np.int64)
    for i, row in enumerate(host):
        order = np.argsort(-row)
        ranks[i] = np.searchsorted(-row[order], -row[target[i]], side="right")
    return ranks


def evaluator_speed(shape: EvalShape, device: torch.device, repeats: int = 3) -> EvaluatorSpeed:
    """Time scoring once and both rankings `repeats` times each; check they agree."""
    q, v = random_embeddings(shape, device)
    labels = labels_of(shape)
    score_s, scores = _timed(lambda: max_cosine_scores(q, v), device)
    del q, v
    count = [_timed(lambda: counting_ranks(scores, labels), device) for _ in range(repeats)]
    sort = [_timed(lambda: argsort_ranks(scores, labels), device) for _ in range(repeats)]
    identical = int((count[0][1] == sort[0][1]).sum())
    return EvaluatorSpeed(shape, score_s, statistics.median(t for t, _ in count),
                          statistics.median(t for t, _ in sort), identical, _device_label(device))


def _timed(fn: Callable[[], _T], device: torch.device) -> tuple[float, _T]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def _device_label(device: torch.device) -> str:
    return device_name(device)
