"""Batching shared by every method: one training item = one video with all its queries.

Frame handling follows the MS-SL family: the clip branch mean-pools the frames into
exactly `num_clips` segments (short videos repeat frames), the frame branch mean-pools
down to `max_frames` only when a video is longer, rows are L2-normalised, queries are cut
to `max_query_len` tokens. Padding comes with boolean masks (True = real).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from prvr.datasets.types import Split


POOLING_RULES = ("even", "reference")


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


class _Tensors:
    """Device moves and pinning for the batch dataclasses (nested ones included)."""

    def to(self, device: torch.device):
        return _map_tensors(self, lambda t: t.to(device, non_blocking=True))

    def pin_memory(self):
        return _map_tensors(self, lambda t: t.pin_memory())


@dataclass
class VideoBatch(_Tensors):
    frames: torch.Tensor  # [B, T, Dv]
    frame_mask: torch.Tensor  # [B, T] bool
    clips: torch.Tensor  # [B, C, Dv] mean-pooled raw frames (MS-SL clip branch input)
    clip_pool: torch.Tensor  # [B, C, T] the same pooling as a matrix over the (padded) frames
    video_index: torch.Tensor  # [B] index into the split's videos
    durations: torch.Tensor | None = None  # [B] float seconds (None: batches built without them)


@dataclass
class QueryBatch(_Tensors):
    tokens: torch.Tensor  # [Q, L, Dq]
    token_mask: torch.Tensor  # [Q, L] bool
    query_index: torch.Tensor  # [Q]


@dataclass
class TrainBatch(_Tensors):
    videos: VideoBatch
    queries: QueryBatch
    query_item: torch.Tensor  # [Q] which batch video each query is labelled with
    relevant: torch.Tensor | None  # [Q, B] bool ground truth (simulated data), else None
    moments: torch.Tensor | None = None  # [Q, 2] float seconds of each query's labelled moment, NaN where unknown


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if obj is None or not hasattr(obj, "__dataclass_fields__"):
        return obj
    return type(obj)(**{f.name: _map_tensors(getattr(obj, f.name), fn) for f in fields(obj)})



class Batcher:
    """Turns index lists into padded tensors for one split."""

    def __init__(self, split: Split, data_cfg) -> None:
        self.split = split
        self.cfg = data_cfg
        self.video_queries = split.video_queries()

    def video_features(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        raw = np.asarray(self.split.frames[v], dtype=np.float32)
        rule = getattr(self.cfg, "pooling", "even")
        clips = segment_mean(raw, self.cfg.num_clips, rule)
        frames = segment_mean(raw, self.cfg.max_frames, rule) if len(raw) > self.cfg.max_frames else raw
        if self.cfg.normalize_frames:
            clips, frames = l2_normalize(clips), l2_normalize(frames)
        return frames, clips

    def videos(self, index: np.ndarray) -> VideoBatch:
        feats = [self.video_features(int(v)) for v in index]
        frames, mask = _pad([f for f, _ in feats])
        clips = torch.from_numpy(np.stack([c for _, c in feats]))
        pool = np.zeros((len(feats), self.cfg.num_clips, frames.shape[1]), dtype=np.float32)
        for i, (f, _) in enumerate(feats):
            pool[i, :, : len(f)] = pooling_matrix(len(f), self.cfg.num_clips, getattr(self.cfg, "pooling", "even"))
        index = np.asarray(index, dtype=np.int64)
        durations = torch.from_numpy(np.asarray(self.split.durations, dtype=np.float32)[index])
        return VideoBatch(frames, mask, clips, torch.from_numpy(pool), torch.from_numpy(index), durations)

    def queries(self, index: np.ndarray) -> QueryBatch:
        rows = []
        for q in index:
            tok = np.asarray(self.split.tokens[int(q)][: self.cfg.max_query_len], dtype=np.float32)
            rows.append(l2_normalize(tok) if self.cfg.normalize_tokens else tok)
        tokens, mask = _pad(rows)
        return QueryBatch(tokens, mask, torch.as_tensor(np.asarray(index, dtype=np.int64)))

    def train_batch(self, videos: np.ndarray) -> TrainBatch:
        per = [self.video_queries[int(v)] for v in videos]
        qidx = np.concatenate(per) if per else np.zeros(0, dtype=np.int64)
        item = np.repeat(np.arange(len(videos)), [len(p) for p in per])
        relevant = None
        if self.split.relevance is not None:
            relevant = torch.from_numpy(self.split.relevance[qidx][:, videos].toarray().astype(bool))
        moments = torch.from_numpy(np.asarray(self.split.moments, dtype=np.float32)[qidx].reshape(-1, 2))
        return TrainBatch(self.videos(videos), self.queries(qidx), torch.from_numpy(item), relevant, moments)


def _pad(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max((len(r) for r in rows), default=1)
    dim = rows[0].shape[1] if rows else 0
    out = np.zeros((len(rows), longest, dim), dtype=np.float32)
    mask = np.zeros((len(rows), longest), dtype=bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
        mask[i, : len(r)] = True
    return torch.from_numpy(out), torch.from_numpy(mask)


class _BatchDataset(torch.utils.data.Dataset):
    def __init__(self, batches: list[np.ndarray], make) -> None:
        self.batches, self.make = batches, make

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int):
        return self.make(self.batches[i])


def epoch_batches(num_videos: int, batch_size: int, seed: int, epoch: int, video_has_queries: np.ndarray) -> list[np.ndarray]:
    """Shuffled video batches of one epoch; the order depends only on (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch, 17])
    order = rng.permutation(np.nonzero(video_has_queries)[0])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def make_loader(batches: list[np.ndarray], make, num_workers: int = 0, pin: bool = False):
    """Iterate prepared batches, with worker processes and pinned memory when asked."""
    return torch.utils.data.DataLoader(
        _BatchDataset(batches, make), batch_size=None, shuffle=False,
        num_workers=num_workers, pin_memory=pin, persistent_workers=False,
    )
