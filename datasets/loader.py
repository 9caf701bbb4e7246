"""Batching shared by every method: one training item = one video with all its queries.

Frame handling follows the MS-SL family: the clip branch mean-pools the frames into
exactly `num_clips` segments (short videos repeat frames), the frame branch mean-pools
down to `max_frames` only when a video is longer, rows are L2-normalised, queries are cut
to `max_query_len` tokens. Padding comes with boolean masks (True = real).

The data path: a `Batcher` processes its split once (`Kept`: pooled clips, frames, tokens,
within a share of the free RAM) so that a batch is a gather and a pad; `Batcher.in_order`
gives evaluation the split's batches, made once; `EpochLoader` builds the training batches
of every epoch of a run from one set of worker processes, pinned for a GPU. None of this
changes a number: every batch is bit for bit the one made per video from the raw rows
(`frame_rows`, `clip_rows`, `token_rows`; tests/test_loader.py).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, get_args

import numpy as np
import torch

from prvr.datasets.types import Ragged, Split
from prvr.harness.base.batches import QueryBatch, TrainBatch, VideoBatch


PoolingRule = Literal["even", "reference"]  # data.pooling
POOLING_RULES: tuple[PoolingRule, ...] = get_args(PoolingRule)


def segment_bounds(length: int, segments: int, rule: str = "even") -> tuple[np.ndarray, np.ndarray]:
    """[start, end) rows of `segments` segments of `length` rows (never empty).

    "even": boundaries floor(i * length / segments), every row in some segment.
    "reference": the MS-SL family's rule: boundaries rounded half to even and clamped to
    length - 1 (so the last row takes part only when the clamp leaves it alone), and an
    empty segment is its start row.
    """
    if rule not in POOLING_RULES:
        raise ValueError(f"unknown pooling rule '{rule}' (data.pooling: {' | '.join(POOLING_RULES)})")
    idx = np.arange(segments + 1) * length / segments
    if rule == "reference":
        bounds = np.minimum(np.round(idx).astype(np.int64), length - 1)
        start, end = bounds[:-1], bounds[1:]
        return start, np.where(start < end, end, start + 1)
    start = np.floor(idx[:-1]).astype(np.int64)
    end = np.maximum(np.floor(idx[1:]).astype(np.int64), start + 1)
    return np.minimum(start, length - 1), np.minimum(end, length)


def segment_mean(x: np.ndarray, segments: int, rule: str = "even") -> np.ndarray:
    """Mean of each segment of rows: [T, D] -> [segments, D] (one BLAS product)."""
    return pooling_matrix(len(x), segments, rule) @ x


def pooling_matrix(length: int, segments: int, rule: str = "even") -> np.ndarray:
    """[segments, length] matrix whose product with rows gives segment_mean."""
    start, end = segment_bounds(length, segments, rule)
    cols = np.arange(length)[None, :]
    inside = (cols >= start[:, None]) & (cols < end[:, None])
    return (inside / (end - start)[:, None]).astype(np.float32)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    norm = np.sqrt(np.einsum("...d,...d->...", x, x))[..., None]
    return x / np.maximum(norm, 1e-12)


ROW_EPS = 1e-4  # of a row: a time this close to a row boundary counts as on it (float32 seconds)


def moment_rows(moments: torch.Tensor, durations: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Feature rows (start, end) [..., 2] int64 of moments given in seconds; -1 where unknown.

    A video's `lengths` real rows split its duration evenly (one row per clip, or frame rows
    mean-pooled down to `data.max_frames`), so row r covers [r, r + 1) * w seconds with
    w = duration / length. start = floor(t_st / w), the row holding t_st; end = ceil(t_ed / w) - 1,
    the last row the moment reaches into (XML's convention at inference, TVRetrieval
    start_end_dataset.py; its training labels use ceil(t_ed / w), one row later). Both are
    clamped to the video's rows, end >= start. moments [..., 2]; durations and lengths
    broadcast against moments[..., 0]. A NaN time, or a video without rows or duration, gives -1.
    """
    length = lengths.to(torch.float64)
    x = moments.to(torch.float64) * (length / durations.to(torch.float64))[..., None]
    last = length - 1
    start = torch.minimum(torch.floor(x[..., 0] + ROW_EPS).clamp(min=0), last)
    end = torch.maximum(torch.minimum(torch.ceil(x[..., 1] - ROW_EPS) - 1, last), start)
    known = torch.isfinite(x).all(-1) & (length > 0) & (durations > 0)
    rows = torch.stack([start, end], -1).nan_to_num(-1.0, posinf=-1.0, neginf=-1.0)
    return torch.where(known[..., None], rows, -1.0).long()


def rows_to_seconds(rows: torch.Tensor, durations: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The inverse of `moment_rows`: the span [start * w, (end + 1) * w] in seconds [..., 2] that
    rows (start, end) cover, capped at the duration (XML's predicted span, end row inclusive)."""
    w = durations.to(torch.float64) / lengths.to(torch.float64).clamp(min=1)
    span = torch.stack([rows[..., 0] * w, (rows[..., 1] + 1) * w], -1)
    return torch.minimum(span, durations.to(torch.float64)[..., None])


# ----------------------------------------------------------------------------- one video, one query
def clip_rows(raw: np.ndarray, cfg) -> np.ndarray:
    """The clip branch input of one video: its rows mean-pooled into exactly `num_clips`
    segments, L2-normalised when `normalize_frames`."""
    clips = segment_mean(raw, cfg.num_clips, cfg.pooling)
    return l2_normalize(clips) if cfg.normalize_frames else clips


def frame_rows(raw: np.ndarray, cfg) -> np.ndarray:
    """The frame branch input of one video: its rows, mean-pooled down to `max_frames` when it
    has more, L2-normalised when `normalize_frames`."""
    frames = segment_mean(raw, cfg.max_frames, cfg.pooling) if len(raw) > cfg.max_frames else raw
    return l2_normalize(frames) if cfg.normalize_frames else frames


def token_rows(raw: np.ndarray, cfg) -> np.ndarray:
    """One query's first `max_query_len` token rows, L2-normalised when `normalize_tokens`."""
    tok = np.asarray(raw[: cfg.max_query_len], dtype=np.float32)
    return l2_normalize(tok) if cfg.normalize_tokens else tok


@lru_cache(maxsize=1024)
def _clip_pool(length: int, segments: int, rule: str) -> np.ndarray:
    """`pooling_matrix`, made once per length (read only)."""
    return pooling_matrix(length, segments, rule)


# ----------------------------------------------------------------------------- a split, processed once
KEEP_SHARE = 0.5  # a split keeps the processed features that fit in this share of the free RAM
KEEP_ORDER = ("clips", "tokens", "frames")  # the parts kept first: most work per byte saved first


@dataclass
class Kept:
    """The parts of a split's features that its Batcher keeps processed (None: made per batch).

    frames: per video, `frame_rows`; clips [V, C, Dv]: per video, `clip_rows`; tokens: per query,
    `token_rows`. Made once, video by video and query by query with the same functions as the
    per-batch path, so a batch gathered from them is the per-batch path's batch bit for bit."""

    frames: Ragged | None = None
    clips: np.ndarray | None = None
    tokens: Ragged | None = None


def kept_sizes(split: Split, cfg) -> dict[str, int]:
    """Bytes (float32) that each part of `Kept` takes for `split` (0: the raw rows serve as
    they are, e.g. frames without normalisation or pooling)."""
    frame_rows_n = int(np.minimum(split.frames.lengths, cfg.max_frames).sum())
    token_rows_n = int(np.minimum(split.tokens.lengths, cfg.max_query_len).sum())
    return {"clips": split.num_videos * cfg.num_clips * split.frames.dim * 4,
            "tokens": 0 if _raw_serves(split.tokens, cfg.max_query_len, cfg.normalize_tokens)
            else token_rows_n * split.tokens.dim * 4,
            "frames": 0 if _raw_serves(split.frames, cfg.max_frames, cfg.normalize_frames)
            else frame_rows_n * split.frames.dim * 4}


def _raw_serves(rows: Ragged, cap: int, normalize: bool) -> bool:
    """The raw rows are already what a batch takes: float32, none cut or pooled, none normalised."""
    return (not normalize and rows.data.dtype == np.float32 and rows.rows is None
            and int(rows.lengths.max(initial=0)) <= cap)


def keep_budget(cap_gb: float) -> int | None:
    """Bytes a split may keep: KEEP_SHARE of the free RAM, and at most `cap_gb` GiB where it is 0 or
    more (`data.keep_gb`; -1: no cap of the user's). None: no limit known (the free RAM unknown, no cap)."""
    free = available_ram()
    share = None if free is None else int(KEEP_SHARE * free)
    if cap_gb < 0:
        return share
    cap = int(cap_gb * (1 << 30))
    return cap if share is None else min(cap, share)


def keep_plan(sizes: dict[str, int], budget: int | None) -> list[str]:
    """The parts to keep: in KEEP_ORDER, each that fits in `budget` bytes beside those kept
    before it (None: no limit known, keep all)."""
    plan, used = [], 0
    for part in KEEP_ORDER:
        if budget is None or used + sizes[part] <= budget:
            plan.append(part)
            used += sizes[part]
    return plan


def available_ram() -> int | None:
    """RAM that can be had without swapping (Linux MemAvailable; else free pages; else unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def process_split(split: Split, cfg, parts: list[str]) -> Kept:
    """The `parts` of `Kept` for a split: one pass over its videos (raw rows read once each)
    and one over its queries."""
    kept = Kept()
    if "frames" in parts:
        kept.frames = split.frames if _raw_serves(split.frames, cfg.max_frames, cfg.normalize_frames) else \
            _empty_ragged(np.minimum(split.frames.lengths, cfg.max_frames), split.frames.dim)
    if "clips" in parts:
        kept.clips = np.empty((split.num_videos, cfg.num_clips, split.frames.dim), dtype=np.float32)
    fill = kept.frames if kept.frames is not split.frames else None  # frames to fill video by video
    if fill is not None or kept.clips is not None:
        for v in range(split.num_videos):
            raw = np.asarray(split.frames[v], dtype=np.float32)
            if kept.clips is not None:
                kept.clips[v] = clip_rows(raw, cfg)
            if fill is not None:
                fill.data[fill.offsets[v] : fill.offsets[v + 1]] = frame_rows(raw, cfg)
    if "tokens" in parts:
        if _raw_serves(split.tokens, cfg.max_query_len, cfg.normalize_tokens):
            kept.tokens = split.tokens
        else:
            kept.tokens = _empty_ragged(np.minimum(split.tokens.lengths, cfg.max_query_len), split.tokens.dim)
            for q in range(split.num_queries):
                kept.tokens.data[kept.tokens.offsets[q] : kept.tokens.offsets[q + 1]] = \
                    token_rows(split.tokens[q], cfg)
    return kept


def _empty_ragged(lengths: np.ndarray, dim: int) -> Ragged:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Ragged(np.empty((int(offsets[-1]), dim), dtype=np.float32), offsets)


# ----------------------------------------------------------------------------- batches
class Batcher:
    """Turns index lists into padded tensors for one split.

    The first batch that picks items at will (`videos`, `queries`, `train_batch`, or `prepare`)
    makes the split's processed features once (`Kept`: each part that fits in KEEP_SHARE of the
    free RAM and in `data.keep_gb`, `keep_budget` and `keep_plan`; `keep=False` none, `keep=True`
    all); a batch is then a gather and a pad, and what is not kept is made per batch as before.
    `in_order` gives the split's items in index order, the batches evaluation encodes: made once and kept where the split keeps no
    processed features (val, test), gathered from them where it does (train). Either way a
    batch is bit for bit the one the per-batch path makes."""

    def __init__(self, split: Split, data_cfg, keep: bool | None = None) -> None:
        self.split = split
        self.cfg = data_cfg
        self.video_queries = split.video_queries()
        self.keep = keep
        self.kept: Kept | None = None  # made by `prepare`
        self._in_order: dict[tuple[str, int, bool], list] = {}

    def prepare(self) -> Kept:
        """Make the kept features now (before worker processes start, so that they share them)."""
        if self.kept is None:
            sizes = kept_sizes(self.split, self.cfg)
            if self.keep is None:
                parts = keep_plan(sizes, keep_budget(self.cfg.keep_gb))
            else:
                parts = list(KEEP_ORDER) if self.keep else []
            self.kept = process_split(self.split, self.cfg, parts)
            self._in_order.clear()  # batches in order are gathered from the kept features from now on
        return self.kept

    def video_features(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        """(frames, clips) of video v as a batch takes them, made from its raw rows (the definition)."""
        raw = np.asarray(self.split.frames[v], dtype=np.float32)
        return frame_rows(raw, self.cfg), clip_rows(raw, self.cfg)

    def videos(self, index: np.ndarray) -> VideoBatch:
        return self._videos(np.asarray(index, dtype=np.int64), self.prepare())

    def _videos(self, index: np.ndarray, kept: Kept) -> VideoBatch:
        # each video's raw rows read (and made float32) once for both branches where neither is kept
        raw = [] if kept.frames is not None and kept.clips is not None else [self._raw(v) for v in index]
        if kept.frames is not None:
            frames, mask = _gather(kept.frames, index)
        else:
            frames, mask = _pad([frame_rows(r, self.cfg) for r in raw])
        if kept.clips is not None:
            clips = torch.from_numpy(kept.clips[index])
        else:
            clips = torch.from_numpy(np.stack([clip_rows(r, self.cfg) for r in raw]))
        return self._video_batch(index, frames, mask, clips)

    def _raw(self, v: int) -> np.ndarray:
        return np.asarray(self.split.frames[int(v)], dtype=np.float32)

    def _video_batch(self, index: np.ndarray, frames: torch.Tensor, mask: torch.Tensor,
                     clips: torch.Tensor) -> VideoBatch:
        lengths = mask.sum(1).tolist()
        pool = np.zeros((len(index), self.cfg.num_clips, frames.shape[1]), dtype=np.float32)
        for i, n in enumerate(lengths):
            pool[i, :, :n] = _clip_pool(n, self.cfg.num_clips, self.cfg.pooling)
        durations = torch.from_numpy(np.asarray(self.split.durations, dtype=np.float32)[index])
        return VideoBatch(frames, mask, clips, torch.from_numpy(pool), torch.from_numpy(index), durations)

    def queries(self, index: np.ndarray) -> QueryBatch:
        return self._queries(np.asarray(index, dtype=np.int64), self.prepare())

    def _queries(self, index: np.ndarray, kept: Kept) -> QueryBatch:
        if kept.tokens is not None:
            tokens, mask = _gather(kept.tokens, index)
        else:
            tokens, mask = _pad([token_rows(self.split.tokens[int(q)], self.cfg) for q in index])
        return QueryBatch(tokens, mask, torch.from_numpy(index))

    def train_batch(self, videos: np.ndarray) -> TrainBatch:
        """A training step's batch of `videos`, each with all its queries (train.sample=videos)."""
        per = [self.video_queries[int(v)] for v in videos]
        qidx = np.concatenate(per) if per else np.zeros(0, dtype=np.int64)
        item = np.repeat(np.arange(len(videos)), [len(p) for p in per])
        return self._train_batch(np.asarray(videos, dtype=np.int64), qidx, item)

    def query_train_batch(self, queries: np.ndarray) -> TrainBatch:
        """A training step's batch of `queries`, each with its labelled video (train.sample=queries):
        the videos in the order the queries first name them, a video two queries share taken once
        (both its labelled queries are then positives of one column, never one another's negative)."""
        qidx = np.asarray(queries, dtype=np.int64)
        videos, first, item = np.unique(np.asarray(self.split.query_video, dtype=np.int64)[qidx],
                                         return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # first-named order
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        return self._train_batch(videos[order], qidx, position[item.reshape(-1)])

    def _train_batch(self, videos: np.ndarray, qidx: np.ndarray, item: np.ndarray) -> TrainBatch:
        relevant = None
        if self.split.relevance is not None:
            relevant = torch.from_numpy(self.split.relevance[qidx][:, videos].toarray().astype(bool))
        moments = torch.from_numpy(np.asarray(self.split.moments, dtype=np.float32)[qidx].reshape(-1, 2))
        return TrainBatch(self.videos(videos), self.queries(qidx), torch.from_numpy(item), relevant, moments)

    def in_order(self, kind: str, size: int, pin: bool = False) -> Iterable[VideoBatch] | Iterable[QueryBatch]:
        """Every video (kind "videos") or query ("queries") of the split in index order, `size` at
        a time, pinned when `pin` (for a fast copy to a GPU): the batches evaluation encodes.
        Where the split keeps processed features, gathered from them as they are taken; else made
        once and kept while they fit in KEEP_SHARE of the free RAM (`keep=False`: never kept), and
        made as they are taken where they do not. Only a kept list is held whole: the training
        split of TVR padded at once is about 27 GB (the rehearsal's ARL pass ran out of memory)."""
        if kind not in ("videos", "queries"):
            raise ValueError(f"kind must be 'videos' or 'queries', got {kind!r}")
        n = self.split.num_videos if kind == "videos" else self.split.num_queries
        make = self._videos if kind == "videos" else self._queries
        chunks = [np.arange(s, min(s + size, n)) for s in range(0, n, size)]
        if self.kept is not None:  # gathered as they are taken: never the whole split padded at once
            return (_pinned(make(index, self.kept), pin) for index in chunks)
        key = (kind, size, pin)
        if key not in self._in_order:
            if not self._fits_in_order(kind):  # made as they are taken (the per-batch path)
                return (_pinned(make(index, Kept()), pin) for index in chunks)
            self._in_order[key] = [_pinned(make(index, Kept()), pin) for index in chunks]
        return self._in_order[key]

    def _fits_in_order(self, kind: str) -> bool:
        if self.keep is not None:
            return self.keep
        sizes = kept_sizes(self.split, self.cfg)
        need = sizes["frames"] + sizes["clips"] if kind == "videos" else sizes["tokens"]
        budget = keep_budget(self.cfg.keep_gb)
        return budget is None or need <= budget


def _pinned(batch, pin: bool):
    return batch.pin_memory() if pin else batch


def _gather(rows: Ragged, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """`_pad` of items `index` of `rows`, copied straight into the padded array."""
    if len(index) == 0:
        return _pad([])
    lengths = rows.lengths[index]
    out = np.zeros((len(index), int(lengths.max()), rows.dim), dtype=np.float32)
    for i, v in enumerate(index):
        out[i, : lengths[i]] = rows[int(v)]
    mask = np.arange(out.shape[1])[None, :] < lengths[:, None]
    return torch.from_numpy(out), torch.from_numpy(mask)


def _pad(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max((len(r) for r in rows), default=1)
    dim = rows[0].shape[1] if rows else 0
    out = np.zeros((len(rows), longest, dim), dtype=np.float32)
    mask = np.zeros((len(rows), longest), dtype=bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
        mask[i, : len(r)] = True
    return torch.from_numpy(out), torch.from_numpy(mask)


def epoch_batches(num_videos: int, batch_size: int, seed: int, epoch: int, video_has_queries: np.ndarray) -> list[np.ndarray]:
    """Shuffled video batches of one epoch; the order depends only on (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch, 17])
    order = rng.permutation(np.nonzero(video_has_queries)[0])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def epoch_query_batches(num_queries: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Shuffled query batches of one epoch (train.sample=queries); the order depends only on
    (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch, 19])
    order = rng.permutation(num_queries)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


# ----------------------------------------------------------------------------- epochs
class _Make(torch.utils.data.Dataset):
    """A map-style dataset whose keys are the batches themselves (index arrays)."""

    def __init__(self, make: Callable[[np.ndarray], Any]) -> None:
        self.make = make

    def __getitem__(self, batch: np.ndarray):
        return self.make(batch)


class _EpochSampler(torch.utils.data.Sampler):
    """Yields the current epoch's batches, in order (set before each epoch)."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _draw_loader_seed() -> None:
    """The one number torch's DataLoader draws from the global torch generator for each
    iterator it makes (`_BaseDataLoaderIter._base_seed`). Before EpochLoader every epoch made a
    new DataLoader, so every epoch drew it; drawing it still keeps the torch random stream, and
    with it every dropout mask of a run, what it was."""
    torch.empty((), dtype=torch.int64).random_()


# The workers are forked on Linux whatever the interpreter's default start method (Python 3.14
# made it forkserver): a forked worker shares the processed features `prepare` made, copy on
# write, where forkserver or spawn would pickle the batch builder with them into every worker
# (gigabytes at TVR's size). Elsewhere (macOS, Windows) the platform's default stays.
WORKER_START = "fork" if sys.platform.startswith("linux") else None


class EpochLoader:
    """The training batches of every epoch of a run, from one set of worker processes.

    Made once per run: `make` turns a batch's video indices into a batch (e.g.
    `Batcher.train_batch`); `prepare` (e.g. `Batcher.prepare`) runs now, in this process, before
    any worker starts, so that the workers share what it made instead of each making its own
    (and a run pays for it once, before its first epoch). With
    `num_workers` > 0 the workers persist across epochs and build batches ahead of the step;
    `pin` pins each batch (for a fast, asynchronous copy to a GPU). `epoch(batches)` yields the
    batches in the order given: the data order stays exactly what (seed, epoch) make it
    (`epoch_batches`), whatever the number of workers."""

    def __init__(self, make: Callable[[np.ndarray], Any], num_workers: int = 0, pin: bool = False,
                 prepare: Callable[[], Any] | None = None) -> None:
        self.make, self.num_workers, self.pin = make, num_workers, pin
        if prepare is not None:
            prepare()
        self._sampler = _EpochSampler()
        self._loader: torch.utils.data.DataLoader | None = None

    def epoch(self, batches: list[np.ndarray]) -> Iterator:
        """An iterator over this epoch's batches (one epoch at a time)."""
        if self.num_workers == 0:
            _draw_loader_seed()
            return (_pinned(self.make(b), self.pin) for b in batches)
        self._sampler.batches = list(batches)
        if self._loader is None:  # its first iterator starts the workers and draws the seed itself
            self._loader = torch.utils.data.DataLoader(
                _Make(self.make), batch_size=None, sampler=self._sampler, num_workers=self.num_workers,
                pin_memory=self.pin, persistent_workers=True, multiprocessing_context=WORKER_START)
        else:
            _draw_loader_seed()
        return iter(self._loader)

    def close(self) -> None:
        """Stop the worker processes (they also stop when the loader is garbage-collected)."""
        self._loader = None
