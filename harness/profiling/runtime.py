"""Inference runtime per text query against video collections (ARL Table 4, RAL Table 7).

Protocol: the collection's video embeddings are precomputed (the encoder output the
evaluator keeps, after the backbone's query-independent `index_videos` work, e.g. unit
vectors of the items, as a deployed index stores them); one timed run = encode one query
from its token features, score it against every video of the collection, and sort the
collection by score (the ranked list a user gets). Median over repeated runs after warm-up runs; CUDA events on a GPU,
time.perf_counter on a CPU.

The collection holds `unique` encoded random videos tiled to the collection size: scoring
cost depends on shapes, not values, and encoding 2,500 full-length videos per model would
dominate the profile on a CPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from prvr.harness.profiling.subjects import Subject, fused_scores, random_queries, random_videos
from prvr.harness.base.contract import as_backbone
from prvr.harness.base.encoding import cat_padded  # the evaluator's own concatenation and indexing
from prvr.harness.engine.evaluate import index_videos


@dataclass
class Runtime:
    videos: int
    median_ms: float
    p25_ms: float
    p75_ms: float
    runs: int


def time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call: CUDA events on a GPU, wall clock otherwise."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    start_s = time.perf_counter()
    fn()
    return (time.perf_counter() - start_s) * 1e3


@torch.no_grad()
def encode_collection(model: torch.nn.Module, subject: Subject, size: int, unique: int, video_dim: int,
                      device: torch.device) -> dict[str, torch.Tensor]:
    """Video embeddings of a `size`-video collection: `unique` encoded videos, tiled."""
    unique = max(1, min(unique, size))
    part = as_backbone(model).encode_videos(random_videos(unique, subject.frames, subject.clips, video_dim, device))
    copies = -(-size // unique)
    whole = {k: cat_padded([t] * copies) for k, t in part.items()}
    return index_videos(model, {k: t[:size] for k, t in whole.items()})


@torch.no_grad()
def query_runtime(model: torch.nn.Module, subject: Subject, videos: dict[str, torch.Tensor], query_dim: int,
                  repeats: int, warmup: int, device: torch.device) -> list[float]:
    """Milliseconds per run (encode one query + score + sort the collection), `repeats` runs."""
    query = random_queries(1, subject.tokens, query_dim, device)

    def retrieve() -> torch.Tensor:
        scores = fused_scores(model, as_backbone(model).encode_queries(query), videos)
        return torch.argsort(scores[0], descending=True)

    for _ in range(warmup):
        retrieve()
    return [time_ms(retrieve, device) for _ in range(repeats)]


def runtime_per_query(model: torch.nn.Module, subject: Subject, sizes: list[int], dims: tuple[int, int],
                      repeats: int, warmup: int, unique: int, device: torch.device) -> list[Runtime]:
    """Runtime per query for each collection size (the largest collection is encoded once)."""
    collection = encode_collection(model, subject, max(sizes), unique, dims[0], device)
    out = []
    for size in sizes:
        videos = {k: t[:size] for k, t in collection.items()}
        runs = query_runtime(model, subject, videos, dims[1], repeats, warmup, device)
        out.append(summarize(size, runs))
    return out


def summarize(size: int, runs: list[float]) -> Runtime:
    q = statistics.quantiles(runs, n=4, method="inclusive") if len(runs) > 1 else [runs[0]] * 3
    return Runtime(size, statistics.median(runs), q[0], q[2], len(runs))
