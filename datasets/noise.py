"""Noise robustness: test videos that start with an inserted segment (RAL paper, Fig. 5).

Following Yang et al. (2021), as the RAL paper does: "we insert a randomly generated segment
with a duration of h x p seconds at the beginning of the test video, where h represents the
duration of the test video and p denotes the noise level". `with_noise(split, p, source)`
returns a new Split in which video v (n_v feature rows, h_v seconds) starts with
k_v = round(p n_v) inserted rows (half rounds up), followed by its own rows unchanged:

- every moment timestamp moves by h_v p (the query's labelled video's h), every duration
  becomes h_v (1 + p): moment / video fractions (the M/V buckets) stay consistent with the
  longer videos; on simulated data the frame spans of `extra["events"]` move by k_v rows;
- labels, relevance, queries and their features are the same objects as the split's.

Where the inserted rows come from (`source`):
- `other` (default): a contiguous run of k_v rows of another test video, chosen at random
  among the split's videos other than v that have rows, starting at a random row. A donor
  shorter than k_v is repeated (its rows taken cyclically from that start, wrapping to its
  first row), so the segment always comes from one other video.
- `gaussian`: rows drawn from a Gaussian with the split's per-dimension mean and standard
  deviation (over all its rows), stored in the split's dtype; L2-normalised only when the
  split's own rows are unit vectors. (The loader mean-pools raw rows and L2-normalises the
  pooled clips / frames itself, `data.normalize_frames`, so inserted rows go through the
  same path as real ones.)

Seeded by (NOISE_SEED, p, source) only: every method and every seed sees the same noisy
videos. p = 0 returns the split itself.

Memory: nothing of the feature store is copied. The new frames are a `Ragged` over the same
`data` with a `rows` index (8 bytes per row of the noisy split); `gaussian` appends its
block of k rows through `StackedRows` (k x dim x the dtype's bytes), `other` appends none.
"""

from __future__ import annotations

import numbers
from dataclasses import replace
from typing import Any, Literal, get_args

import numpy as np

from prvr.datasets.sim.world import EV_END, EV_START, EV_VIDEO
from prvr.datasets.types import Ragged, Split
from prvr.harness.base.io import UserError

NoiseSource = Literal["other", "gaussian"]  # eval.noise_source
NOISE_SOURCES: tuple[NoiseSource, ...] = get_args(NoiseSource)
NOISE_SEED = 2021  # with p and the source, the only seed of the inserted segments
UNIT_NORM_TOLERANCE = 1e-3  # rows whose norms all lie within this of 1 count as L2-normalised


def inserted_rows(lengths: np.ndarray, p: float) -> np.ndarray:
    """Rows inserted into videos of `lengths` rows at level p: round(p n), half up."""
    return np.floor(p * np.asarray(lengths, dtype=np.float64) + 0.5).astype(np.int64)


def level_key(p: float) -> str:
    """A level as a record key: '0.0', '0.1', '0.5', '1.0'."""
    return str(float(p))


def noise_rng(p: float, source: str) -> np.random.Generator:
    return np.random.default_rng([NOISE_SEED, int(round(float(p) * 1_000_000)), NOISE_SOURCES.index(source)])


def with_noise(split: Split, p: float, source: str = "other") -> Split:
    """The split with a segment of round(p n) rows (h p seconds) inserted at the start of
    each video (see the module note); p = 0 returns `split` itself."""
    if source not in NOISE_SOURCES:
        raise UserError(f"noise source must be one of {', '.join(NOISE_SOURCES)}, got {source!r}")
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= float(p) <= 1.0:
        raise UserError(f"noise level must be a number in [0, 1], got {p!r}")
    p = float(p)
    if p == 0.0:
        return split
    frames = split.frames
    lengths = frames.lengths
    k = inserted_rows(lengths, p)
    rng = noise_rng(p, source)
    base = frames.rows if frames.rows is not None else np.arange(int(frames.offsets[-1]), dtype=np.int64)
    info: dict[str, Any] = {"level": p, "source": source, "inserted_rows": k}
    if source == "other":
        donors, starts = _donors(lengths, k, rng)
        inserted = _donor_rows(base, frames.offsets, lengths, k, donors, starts)
        data = frames.data
        info.update(donor=donors, donor_start=starts)
    else:
        block = gaussian_rows(frames, int(k.sum()), rng)
        inserted = len(frames.data) + np.arange(len(block), dtype=np.int64)
        data = StackedRows(frames.data, block)
    rows = _interleave(inserted, k, base, lengths)
    new_frames = Ragged(data, np.concatenate([[0], np.cumsum(lengths + k)]), rows)
    shift = split.durations * p
    extra = dict(split.extra)
    extra["noise"] = info
    events = extra.get("events")
    if isinstance(events, np.ndarray) and events.ndim == 2 and events.shape[1] == 7 and len(events):
        events = events.copy()
        events[:, [EV_START, EV_END]] += k[events[:, EV_VIDEO]][:, None]
        extra["events"] = events
    return replace(split, frames=new_frames, durations=split.durations * (1.0 + p),
                   moments=split.moments + shift[split.query_video][:, None], extra=extra)


def _donors(lengths: np.ndarray, k: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per video: another video with rows (never itself) and the row its run starts at."""
    nv = len(lengths)
    usable = np.nonzero(lengths > 0)[0]
    need = k > 0
    if need.any() and len(usable) < 2:
        raise UserError("noise source 'other' needs at least two test videos with frames; use gaussian")
    # a uniform pick among the usable videos other than v: draw from one fewer and skip v
    pick = rng.integers(0, max(len(usable) - 1, 1), size=nv)
    own = np.searchsorted(usable, np.arange(nv))  # where v sits among the usable (if it is one)
    is_usable = np.isin(np.arange(nv), usable)
    pick = pick + (is_usable & (pick >= own))
    donors = usable[np.minimum(pick, len(usable) - 1)] if len(usable) else np.zeros(nv, dtype=np.int64)
    donors = np.where(need, donors, -1)
    donor_len = np.where(need, lengths[np.maximum(donors, 0)], 1)
    room = np.where(donor_len >= k, donor_len - k + 1, donor_len)  # contiguous if it fits, else any start
    starts = np.where(need, np.floor(rng.random(nv) * room).astype(np.int64), -1)
    return donors.astype(np.int64), starts


def _donor_rows(base: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, k: np.ndarray, donors: np.ndarray,
                starts: np.ndarray) -> np.ndarray:
    """Rows of the data table for every inserted row, video after video (cyclic in the donor)."""
    total = int(k.sum())
    video = np.repeat(np.arange(len(k)), k)
    j = np.arange(total) - np.repeat(np.cumsum(k) - k, k)  # position inside the inserted segment
    donor = donors[video]
    within = (starts[video] + j) % lengths[donor]
    return base[offsets[donor] + within]


def _interleave(inserted: np.ndarray, k: np.ndarray, base: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per video, its k_v inserted rows, then its own rows."""
    rows = np.empty(len(inserted) + len(base), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths + k)[:-1]])
    is_inserted = np.zeros(len(rows), dtype=bool)
    pos = np.repeat(starts, k) + (np.arange(len(inserted)) - np.repeat(np.cumsum(k) - k, k))
    is_inserted[pos] = True
    rows[is_inserted] = inserted
    rows[~is_inserted] = base
    return rows


def gaussian_rows(frames: Ragged, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` rows from a Gaussian with the per-dimension mean and std of `frames`' rows, in
    their dtype, unit vectors when all their rows are."""
    total = np.zeros(frames.dim, dtype=np.float64)
    squares = np.zeros(frames.dim, dtype=np.float64)
    worst_norm_gap, n = 0.0, 0
    for v in range(len(frames)):
        x = np.asarray(frames[v], dtype=np.float64)
        if not len(x):
            continue
        total += x.sum(0)
        squares += np.einsum("td,td->d", x, x)
        worst_norm_gap = max(worst_norm_gap, float(np.abs(np.sqrt(np.einsum("td,td->t", x, x)) - 1.0).max()))
        n += len(x)
    if n == 0:
        raise UserError("noise source 'gaussian' needs a test split with frames")
    mean = total / n
    std = np.sqrt(np.maximum(squares / n - mean**2, 0.0))
    out = np.empty((count, frames.dim), dtype=frames.data.dtype)
    step = 8192
    for s in range(0, count, step):
        z = rng.standard_normal((min(step, count - s), frames.dim)) * std + mean
        if worst_norm_gap <= UNIT_NORM_TOLERANCE:
            z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
        out[s : s + len(z)] = z
    return out


class StackedRows:
    """The rows of `base` ([N, D], e.g. a memory-mapped feature file) followed by those of
    `extra` ([K, D], in memory), as one [N + K, D] array-like for `Ragged.data`: len, shape,
    dtype, slices and index arrays; nothing of `base` is copied."""

    def __init__(self, base: Any, extra: np.ndarray) -> None:
        if extra.ndim != 2 or extra.shape[1] != base.shape[1] or np.dtype(extra.dtype) != np.dtype(base.dtype):
            raise ValueError(f"StackedRows: extra rows {extra.shape} {extra.dtype} do not match base rows "
                             f"{tuple(base.shape)} {base.dtype}")
        self.base, self.extra = base, extra
        self.split = len(base)
        self.shape = (self.split + len(extra), int(base.shape[1]))
        self.dtype = np.dtype(base.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                n = self.split
                if stop <= n:
                    return self.base[start:stop]
                if start >= n:
                    return self.extra[start - n : stop - n]
                return np.concatenate([np.asarray(self.base[start:n]), self.extra[: stop - n]])
            key = np.arange(start, stop, step)
        idx = np.asarray(key)
        if idx.ndim == 0:
            i = int(idx) + (len(self) if int(idx) < 0 else 0)
            return self.base[i] if i < self.split else self.extra[i - self.split]
        out = np.empty((len(idx), self.shape[1]), dtype=self.dtype)
        low = idx < self.split
        if low.any():
            out[low] = np.asarray(self.base[idx[low]])
        if (~low).any():
            out[~low] = self.extra[idx[~low] - self.split]
        return out

    def __array__(self, dtype=None, copy=None):
        arr = np.concatenate([np.asarray(self.base), self.extra])
        return arr.astype(dtype) if dtype is not None else arr

    @property
    def nbytes_added(self) -> int:
        return int(self.extra.nbytes)
