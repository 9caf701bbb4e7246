"""From captions + video features + query features to one split, the same way for every layout.

A layout module (msl.py, xml.py) supplies the captions of a split in file order, a
`FrameSource` (rows of a video-feature table per video id) and a `TokenSource` (token
features per query key). `assemble_split` then follows the MS-SL reference: the split's
videos are the caption videos in order of first appearance; one query per caption. Items
with problems go through the `Report`: the loader stops at the first, `data check` drops
the item, counts it and goes on.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np

from prvr.datasets.real.annotations import JOIN_LABELS, TimestampIndex, join
from prvr.datasets.real.problems import Report


@dataclass
class Caption:
    """One query as its layout gives it."""

    qid: str  # MS-SL cap_id; XML str(desc_id): the key of its query features
    text: str
    video: str
    path: Path  # file and line, for messages
    line: int | None  # None: an entry of a json file (no lines), named by its key
    moment: tuple[float, float] | None = None  # XML rows carry their timestamps (clipped already)
    duration: float = math.nan


class FrameSource(Protocol):
    dim: int

    def rows(self, video: str, caption: Caption, report: Report) -> np.ndarray | None:
        """Rows of the frame table for this video (None: unusable, already reported)."""


class TokenSource(Protocol):
    dim: int
    path: Path

    def has(self, key: str) -> bool: ...

    def read(self, key: str, caption: Caption, report: Report) -> np.ndarray | None:
        """[L, D] token features (None: unusable, already reported)."""


@dataclass
class BuiltSplit:
    video_ids: list[str]
    frame_rows: np.ndarray  # rows of the frame table, video after video
    frame_offsets: np.ndarray
    durations: np.ndarray
    query_ids: list[str]
    query_text: list[str]
    token_offsets: np.ndarray
    query_video: np.ndarray
    moments: np.ndarray
    outcome: Counter = field(default_factory=Counter)  # timestamp join outcomes


class TokenSink:
    """Token rows of a split, appended to a raw float32 file (or only counted: `data check`)."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.rows = path, 0
        self._file: BinaryIO | None = open(path, "wb") if path is not None else None

    def add(self, tokens: np.ndarray) -> None:
        if self._file is not None:
            self._file.write(np.ascontiguousarray(tokens, dtype="<f4").tobytes())
        self.rows += len(tokens)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def assemble_split(captions: list[Caption], frames: FrameSource, tokens: TokenSource, sink: TokenSink,
                   index: TimestampIndex | None, report: Report) -> BuiltSplit:
    order, by_video = _group(captions)
    video_rows: dict[str, np.ndarray] = {}
    for v in order:
        rows = frames.rows(v, by_video[v][0], report)
        if rows is None:
            report.count("captions dropped with their video (see errors)", len(by_video[v]))
            continue
        video_rows[v] = rows
    usable = [c for c in captions if c.video in video_rows]
    missing = {c.qid for c in usable if not tokens.has(c.qid)}
    if missing:
        first = next(c for c in usable if c.qid in missing)
        report.count("captions without query features", len(missing))
        report.problem(first.path, f"caption {first.qid!r} has no query features in {tokens.path.name} "
                       f"({len(missing)} of this file's captions lack them)",
                       "regenerate the query features or delete those caption lines", line=first.line)
    kept: list[Caption] = []
    lengths: list[int] = []
    for c in usable:
        if c.qid in missing:
            continue
        tok = tokens.read(c.qid, c, report)
        if tok is None:
            continue
        sink.add(tok)
        kept.append(c)
        lengths.append(len(tok))
    videos = _videos_of(kept)
    report.count("videos dropped: none of their captions is usable", len(video_rows) - len(videos))
    return _finish(videos, video_rows, kept, lengths, index, report)


def _group(captions: list[Caption]) -> tuple[list[str], dict[str, list[Caption]]]:
    by_video: dict[str, list[Caption]] = {}
    for c in captions:
        by_video.setdefault(c.video, []).append(c)
    return list(by_video), by_video


def _videos_of(captions: list[Caption]) -> list[str]:
    return list(dict.fromkeys(c.video for c in captions))


def _finish(videos: list[str], video_rows: dict[str, np.ndarray], kept: list[Caption], lengths: list[int],
            index: TimestampIndex | None, report: Report) -> BuiltSplit:
    pos = {v: i for i, v in enumerate(videos)}
    rows = [video_rows[v] for v in videos]
    frame_offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    if any(c.moment is not None for c in kept):  # XML: the rows carry their timestamps
        moments = np.array([c.moment if c.moment is not None else (math.nan, math.nan) for c in kept], dtype=np.float64)
        outcome = Counter(matched=int(np.isfinite(moments[:, 0]).sum()))
        outcome["invalid"] = len(kept) - outcome["matched"]
    elif index is not None:
        moments, outcome = join([c.video for c in kept], [c.text for c in kept], index)
    else:
        moments, outcome = np.full((len(kept), 2), np.nan), Counter(unmatched=len(kept))
    for status, n in outcome.items():
        if status != "matched":
            report.count(JOIN_LABELS[status], n)
    row_durations = {c.video: c.duration for c in kept if math.isfinite(c.duration)}
    known = index.durations if index is not None else {}
    durations = np.array([known.get(v, row_durations.get(v, math.nan)) for v in videos], dtype=np.float64)
    return BuiltSplit(
        video_ids=videos,
        frame_rows=np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64),
        frame_offsets=frame_offsets, durations=durations,
        query_ids=[c.qid for c in kept], query_text=[c.text for c in kept],
        token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        query_video=np.array([pos[c.video] for c in kept], dtype=np.int64),
        moments=moments.reshape(-1, 2), outcome=outcome,
    )


@dataclass
class Built:
    """Every split of a layout, plus the tables their rows point into."""

    splits: dict[str, BuiltSplit]
    frame_file: Path  # raw float32 rows: feature.bin, or the cache's frames.f32 (XML layout)
    frame_rows: int
    frame_dim: int
    token_dim: int
    token_rows: dict[str, int]
    facts: dict = field(default_factory=dict)  # layout-level facts for the summary
