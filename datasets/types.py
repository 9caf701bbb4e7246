"""The data types every dataset adapter produces and every method consumes.

A `PRVRData` holds the train / val / test `Split`s. A split stores ragged per-video frame
features and ragged per-query token features as one flat array plus offsets, so that a
dataset of a million frames is one contiguous (possibly memory-mapped) block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import scipy.sparse as sp

SplitName = Literal["train", "val", "test"]
SPLITS: tuple[SplitName, ...] = get_args(SplitName)


@dataclass
class Ragged:
    """Rows of variable-length items: item i is data[offsets[i]:offsets[i+1]].

    With `rows` given, item i is data[rows[offsets[i]:offsets[i+1]]] instead: the items
    select rows of a larger table, in any order (a split's videos inside one feature.bin
    that holds every split). Items whose rows are one ascending run are read as a slice,
    so a memory-mapped table is read lazily, one item at a time.
    """

    data: Any  # [N, D] ndarray, np.memmap or any array-like with len, shape, dtype and slicing
    offsets: np.ndarray  # [n + 1] int64
    rows: np.ndarray | None = None  # [offsets[-1]] int64 row of `data` per item row; None = identity

    def __post_init__(self) -> None:
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        total = len(self.data) if self.rows is None else len(self.rows)
        if self.offsets.ndim != 1 or self.offsets[0] != 0 or self.offsets[-1] != total:
            raise ValueError("Ragged offsets must start at 0 and end at len(data) (len(rows) when rows are given)")
        if np.any(np.diff(self.offsets) < 0):
            raise ValueError("Ragged offsets must be non-decreasing")
        self._runs: np.ndarray | None = None
        if self.rows is not None:
            self.rows = np.asarray(self.rows, dtype=np.int64)
            if len(self.rows) and (self.rows.min() < 0 or self.rows.max() >= len(self.data)):
                raise ValueError("Ragged rows must index rows of data")
            self._runs = _ascending_runs(self.rows, self.offsets)

    @classmethod
    def from_list(cls, items: list[np.ndarray], dim: int | None = None, dtype: Any = np.float32) -> "Ragged":
        lengths = [len(x) for x in items]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if items:
            data = np.concatenate([np.asarray(x, dtype=dtype) for x in items], axis=0)
        else:
            data = np.zeros((0, dim or 0), dtype=dtype)
        return cls(data, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        start, end = self.offsets[i], self.offsets[i + 1]
        if self.rows is None or self._runs is None:  # _runs is None exactly when rows is
            return self.data[start:end]
        if self._runs[i]:
            first = self.rows[start] if end > start else 0
            return self.data[first : first + (end - start)]
        return np.asarray(self.data[self.rows[start:end]])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def dim(self) -> int:
        return int(self.data.shape[1])

    def in_memory(self, dtype: Any = None) -> "Ragged":
        """A compact copy held in RAM (items in order, rows = identity)."""
        dtype = dtype or self.data.dtype
        out = np.empty((int(self.offsets[-1]), self.dim), dtype=dtype)
        for i in range(len(self)):
            out[self.offsets[i] : self.offsets[i + 1]] = self[i]
        return Ragged(out, self.offsets.copy())


def _ascending_runs(rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per item: are its rows one run r, r+1, r+2, ... (so a slice reads them)?"""
    breaks = np.cumsum(np.diff(rows) != 1)
    bad = np.concatenate([[0], breaks, breaks[-1:] if len(breaks) else [0]])  # bad[j]: breaks before row j
    start, end = offsets[:-1], offsets[1:]
    last = np.maximum(end - 1, start)
    return bad[last] - bad[start] == 0


@dataclass
class Split:
    """One split of a PRVR dataset.

    `query_video` is the labelled video of each query (index into `video_ids`); that is
    the one-to-one supervision. `relevance`, when known (simulated data), is the full
    ground truth: a sparse [queries x videos] boolean matrix of every truly relevant
    video, which includes the true video of each query (and so may differ from the
    labelled one when a mislabelling knob is on).
    """

    video_ids: list[str]
    frames: Ragged  # per video [T_v, Dv]
    durations: np.ndarray  # [V] seconds
    query_ids: list[str]
    query_text: list[str]
    tokens: Ragged  # per query [L_q, Dq]
    query_video: np.ndarray  # [Q] int64 labelled video index
    moments: np.ndarray  # [Q, 2] seconds, NaN where unknown
    relevance: sp.csr_matrix | None = None
    parses: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.query_video = np.asarray(self.query_video, dtype=np.int64)
        self.durations = np.asarray(self.durations, dtype=np.float64)
        self.moments = np.asarray(self.moments, dtype=np.float64).reshape(-1, 2)
        nv, nq = len(self.video_ids), len(self.query_ids)
        checks = {
            "frames": len(self.frames) == nv,
            "durations": len(self.durations) == nv,
            "query_text": len(self.query_text) == nq,
            "tokens": len(self.tokens) == nq,
            "query_video": len(self.query_video) == nq,
            "moments": len(self.moments) == nq,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"Split fields disagree in length: {', '.join(bad)} ({nv} videos, {nq} queries)")
        if nq and (self.query_video.min() < 0 or self.query_video.max() >= nv):
            raise ValueError("query_video holds an index outside the video list")
        if self.relevance is not None and self.relevance.shape != (nq, nv):
            raise ValueError(f"relevance has shape {self.relevance.shape}, expected {(nq, nv)}")

    @property
    def num_videos(self) -> int:
        return len(self.video_ids)

    @property
    def num_queries(self) -> int:
        return len(self.query_ids)

    def labels(self) -> sp.csr_matrix:
        """The one-to-one labels as a sparse [Q, V] boolean matrix."""
        q = np.arange(self.num_queries)
        ones = np.ones(self.num_queries, dtype=bool)
        return sp.csr_matrix((ones, (q, self.query_video)), shape=(self.num_queries, self.num_videos))

    def video_queries(self) -> list[np.ndarray]:
        """Indices of the queries labelled with each video (one training item per video)."""
        order = np.argsort(self.query_video, kind="stable")
        bounds = np.searchsorted(self.query_video[order], np.arange(self.num_videos + 1))
        return [order[bounds[v] : bounds[v + 1]] for v in range(self.num_videos)]

    def moment_fraction(self) -> np.ndarray:
        """Moment length / video length per query (NaN where timestamps are unknown)."""
        dur = self.durations[self.query_video]
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.moments[:, 1] - self.moments[:, 0]) / dur


@dataclass
class PRVRData:
    """A dataset: its name, its splits, and facts about how it was made."""

    name: str
    splits: dict[str, Split]
    meta: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, split: str) -> Split:
        if split not in self.splits:
            raise KeyError(f"dataset '{self.name}' has no split '{split}' (has: {', '.join(self.splits)})")
        return self.splits[split]

    @property
    def video_dim(self) -> int:
        return self.splits["train"].frames.dim

    @property
    def query_dim(self) -> int:
        return self.splits["train"].tokens.dim

    @property
    def has_ground_truth(self) -> bool:
        return all(s.relevance is not None for s in self.splits.values())
