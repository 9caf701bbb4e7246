"""Inference runtime per text query against video collections (ARL Table 4, RAL Table 7).

Protocol: the collection's video embeddings are precomputed (the encoder output the
evaluator keeps, after the backbone's query-independent `index_videos` work, e.g. unit
vectors of the items, as a deployed index stores them); one timed run = encode one query
from its token features, score it against every video of the collection, and sort the
collection by score (the ranked list a user gets). Median over repeated runs after warm-up runs; CUDA events on a GPU,
time.perf_counter on a CPU.

How a run runs (`mode`). On a GPU (`--graphs auto`) the run is captured once per collection as a
CUDA graph on static tensors (the query's token features and the indexed collection stay where
they are), after eager warm-up runs on a side stream as PyTorch's CUDA graphs recipe prescribes,
and each timed run is one replay: the kernels run without the host launching each of the run's
95 to 231 aten ops (36 to 106 of them more than views) through Python, which kept eager runs near
1.6-2.6 ms on an H200 whatever the collection's size. Where capture fails (an op that asks the host, a shape read from the data) or
a replay ranks otherwise than eager, the runs are eager and `mode` says why. On a CPU, and with
`--graphs off`, runs are eager.

Batched queries (`--query-batch N`): one run encodes N queries, scores them against the
collection and sorts each row; the figures are the run's milliseconds / N, milliseconds per
query of a batch, which the papers' one-query figures are not.

The collection holds `unique` encoded random videos tiled to the collection size: scoring
cost depends on shapes, not values, and encoding 2,500 full-length videos per model would
dominate the profile on a CPU.

Memory (`estimate_memory`): the same collection and run on PyTorch's meta device, where tensors
have shapes and no data, with the bytes of every storage an op makes counted while it lives:
what a size needs before a GPU is asked for it.
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Literal, get_args

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from prvr.harness.profiling.subjects import Subject, build_model, fused_scores, random_queries, random_videos
from prvr.harness.base.batches import QueryBatch
from prvr.harness.base.contract import Encoded, as_backbone
from prvr.harness.base.encoding import cat_padded  # the evaluator's own concatenation and indexing
from prvr.harness.engine.evaluate import index_videos

GraphsMode = Literal["auto", "off"]  # --graphs: CUDA graphs where the device is a GPU, or never
GRAPHS_MODES: tuple[GraphsMode, ...] = get_args(GraphsMode)
EAGER, GRAPHS = "eager", "graphs"
SIDE_WARMUP = 3  # eager runs on a side stream before a capture (PyTorch's CUDA graphs recipe)

# one run: the queries' scores [Q, V] and each row's videos best first [Q, V]
Retrieve = Callable[[], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Runtime:
    """One collection size. The figures are milliseconds per query: a run's milliseconds / `queries`
    (the queries one run encodes, scores and sorts; 1 in the papers' setting)."""

    videos: int
    median_ms: float
    p25_ms: float
    p75_ms: float
    runs: int
    queries: int = 1
    mode: str = EAGER  # graphs | eager | eager (capture failed: why)
    peak_mb: float = math.nan  # on a GPU: torch.cuda.max_memory_allocated while this size was timed

    @property
    def run_ms(self) -> float:
        """Median milliseconds of one run (all its queries)."""
        return self.median_ms * self.queries


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


def retrieval(model: torch.nn.Module, queries: QueryBatch, videos: Encoded) -> Retrieve:
    """One run's work on fixed inputs: encode the queries, score them against the indexed
    collection (the fused score the evaluator ranks by) and sort each row, best first."""
    backbone = as_backbone(model)

    def retrieve() -> tuple[torch.Tensor, torch.Tensor]:
        scores = fused_scores(model, backbone.encode_queries(queries), videos)
        return scores, torch.argsort(scores, dim=-1, descending=True)

    return retrieve


def uses_graphs(graphs: GraphsMode, device: torch.device) -> bool:
    """Whether runs are captured as CUDA graphs: `auto` on a GPU."""
    return graphs == "auto" and device.type == "cuda"


class CaptureError(RuntimeError):
    """A graph was captured but its replay does not rank as eager runs do."""


def capture(retrieve: Retrieve, device: torch.device) -> Retrieve:
    """`retrieve` captured as one CUDA graph on its inputs' static tensors: eager warm-up runs on a
    side stream, then `torch.cuda.graph` (PyTorch's recipe); returns the replay, whose outputs are
    the graph's static tensors. Raises where capture fails, and `CaptureError` where the replay's
    scores or ranking differ from the last eager run's."""
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        for _ in range(SIDE_WARMUP):
            expected = retrieve()
    main.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # `main` is made current again even where a failed capture leaves its own stream current; the graph
    # synchronizes and empties the cache before it captures, so the warm-up's blocks go back first
    with torch.cuda.stream(main), torch.cuda.graph(graph):
        static = retrieve()
    graph.replay()
    if not same_ranking(static, expected):
        raise CaptureError("the replay ranks otherwise than eager")

    def replay() -> tuple[torch.Tensor, torch.Tensor]:
        graph.replay()
        return static

    return replay


def same_ranking(got: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Scores equal within float32 rounding, and both orders sort the expected scores alike (tied
    videos may change places)."""
    (scores, order), (want_scores, want_order) = got, expected
    return (torch.allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
            and torch.allclose(want_scores.gather(-1, order), want_scores.gather(-1, want_order), rtol=1e-5, atol=1e-6))


def timed_run(retrieve: Retrieve, graphs: bool, device: torch.device) -> tuple[Callable[[], object], str]:
    """What each timed run calls, and its mode: the graph's replay where `graphs` and capture
    works, else `retrieve` itself (eager), with the reason where capture failed."""
    if not graphs:
        return retrieve, EAGER
    try:
        return capture(retrieve, device), GRAPHS
    except Exception as e:  # noqa: BLE001 - any capture failure leaves the eager runs, and the row says why
        return retrieve, f"eager (capture failed: {_reason(e)})"


def _reason(e: BaseException) -> str:
    """The first error of a failed capture (the one its `capture_end` reports names it as its
    context), on one short line that fits a table cell."""
    while e.__context__ is not None and e.__cause__ is None:
        e = e.__context__
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text.replace("|", "/")[:160]


@torch.no_grad()
def query_runtime(model: torch.nn.Module, subject: Subject, videos: dict[str, torch.Tensor], query_dim: int,
                  repeats: int, warmup: int, device: torch.device, query_batch: int = 1,
                  graphs: GraphsMode = "auto") -> tuple[list[float], str]:
    """Milliseconds per run (encode `query_batch` queries + score + sort the collection for each),
    `repeats` runs, and the runs' mode."""
    queries = random_queries(query_batch, subject.tokens, query_dim, device)
    run, mode = timed_run(retrieval(model, queries, videos), uses_graphs(graphs, device), device)
    for _ in range(warmup):
        run()
    return [time_ms(run, device) for _ in range(repeats)], mode


def runtime_per_query(model: torch.nn.Module, subject: Subject, sizes: list[int], dims: tuple[int, int],
                      repeats: int, warmup: int, unique: int, device: torch.device, query_batch: int = 1,
                      graphs: GraphsMode = "auto") -> list[Runtime]:
    """Runtime per query for each collection size (the largest collection is encoded once)."""
    collection = encode_collection(model, subject, max(sizes), unique, dims[0], device)
    out = []
    for size in sizes:
        videos = {k: t[:size] for k, t in collection.items()}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        runs, mode = query_runtime(model, subject, videos, dims[1], repeats, warmup, device, query_batch, graphs)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else math.nan
        out.append(summarize(size, runs, query_batch, mode, peak))
    return out


def summarize(size: int, runs: list[float], queries: int = 1, mode: str = EAGER,
              peak_mb: float = math.nan) -> Runtime:
    """Median and quartiles of the runs, per query (each run's milliseconds / `queries`)."""
    per_query = [r / queries for r in runs]
    q = statistics.quantiles(per_query, n=4, method="inclusive") if len(runs) > 1 else [per_query[0]] * 3
    return Runtime(size, statistics.median(per_query), q[0], q[2], len(runs), queries, mode, peak_mb)


# ------------------------------------------------------------------------------ memory from shapes
class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every storage an op makes while the mode is on, from when it is made
    until it is freed (storages that existed before are not counted): `live` now, `peak` the most."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._known: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                self._known.add(t.untyped_storage())  # an input's storage: made before, or counted already
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage() not in self._known:
                storage = t.untyped_storage()  # a new storage (a view shares its base's)
                self._known.add(storage)
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, storage.nbytes())
        return out

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


@dataclass
class MemoryEstimate:
    """Bytes of one method's runtime at one collection size, from the shapes (meta device)."""

    method: str
    videos: int
    queries: int  # per run
    params: int  # the model's parameters
    index: int  # the indexed collection the runs score against (tiled copies included)
    build_peak: int  # most bytes live while the collection is encoded, tiled and indexed
    run_peak: int  # most bytes one run adds to the index (a graph's memory pool keeps this much)

    @property
    def total(self) -> int:
        """Parameters plus the larger of the build's peak and the index with one run's work; the
        query's features, the CUDA context and the allocator's rounding come on top."""
        return self.params + max(self.build_peak, self.index + self.run_peak)


def storage_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a view counts its base's whole storage)."""
    return sum({id(s): s.nbytes() for s in (t.untyped_storage() for t in tensors.values())}.values())


@torch.no_grad()
def estimate_memory(subject: Subject, dims: tuple[int, int], size: int, unique: int,
                    query_batch: int = 1) -> MemoryEstimate:
    """The memory `runtime_per_query` needs for a `size`-video collection: the model, collection
    and one run made on the meta device, where no data exists and every size is exact."""
    meta = torch.device("meta")
    model = build_model(subject, dims, meta)
    with LiveBytes() as build:
        collection = encode_collection(model, subject, size, unique, dims[0], meta)
    queries = random_queries(query_batch, subject.tokens, dims[1], meta)
    with LiveBytes() as run:
        retrieval(model, queries, collection)()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return MemoryEstimate(subject.method, size, query_batch, params, storage_bytes(collection), build.peak, run.peak)
