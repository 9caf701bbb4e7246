"""Which queries select the checkpoint: a check that `val` is not the test set, and an honest
alternative.

The public MS-SL family releases select the best epoch on `<collection>val.caption.txt`, and
those files hold as many queries as the published test sets (TVR 10,895, ActivityNet 15,753,
Charades 3,720): the published figures appear to be selected on the test queries. Here the
two splits are compared by content (labelled video id + caption text, never by file name);
when they hold the same queries the run says so in one warning line and in its record, and
`data.val_from_train=N` holds out N training videos, with all their queries, as the
selection split instead (chosen by a seeded rule, listed in the record). The two protocols
are kept apart in the leaderboard (`harness/engine/records.py::run_protocol`).
"""

from __future__ import annotations

import zlib

import numpy as np

from prvr.datasets.types import PRVRData, Ragged, Split
from prvr.harness.base import progress
from prvr.harness.base.io import UserError

SAME = 0.99  # share of the test queries found in val above which the splits "hold the same queries"


def query_keys(split: Split) -> set[tuple[str, str]]:
    """(labelled video id, normalised caption text) of every query."""
    return {(split.video_ids[v], " ".join(t.lower().split())) for v, t in zip(split.query_video, split.query_text)}


def test_queries_in_val(data: PRVRData) -> float | None:
    """Share of the test queries that are also val queries (None without both splits)."""
    if "val" not in data.splits or "test" not in data.splits or not data["test"].num_queries:
        return None
    test = query_keys(data["test"])
    return len(test & query_keys(data["val"])) / len(test)


def held_out_videos(split: Split, n: int, dataset: str) -> np.ndarray:
    """The N training videos (sorted indices) held out for selection: a permutation seeded by
    the dataset name and N, so every method and run seed holds out the same videos."""
    if not 0 < n < split.num_videos:
        raise UserError(f"data.val_from_train={n} must be between 1 and {split.num_videos - 1} "
                        f"(the training videos of {dataset}); fix --set data.val_from_train")
    rng = np.random.default_rng([zlib.crc32(dataset.encode()), n])
    return np.sort(rng.permutation(split.num_videos)[:n])


def subset(split: Split, videos: np.ndarray) -> Split:
    """The split restricted to `videos` (indices) and the queries labelled with them."""
    videos = np.asarray(videos, dtype=np.int64)
    remap = np.full(split.num_videos, -1, dtype=np.int64)
    remap[videos] = np.arange(len(videos))
    queries = np.nonzero(remap[split.query_video] >= 0)[0]
    return Split(
        video_ids=[split.video_ids[v] for v in videos], frames=_items(split.frames, videos),
        durations=split.durations[videos], query_ids=[split.query_ids[q] for q in queries],
        query_text=[split.query_text[q] for q in queries], tokens=_items(split.tokens, queries),
        query_video=remap[split.query_video[queries]], moments=split.moments[queries],
        relevance=split.relevance[queries][:, videos].tocsr() if split.relevance is not None else None,
        parses=[split.parses[q] for q in queries] if split.parses is not None else None,
    )


def _items(ragged: Ragged, items: np.ndarray) -> Ragged:
    """A view of some items of a ragged table (no rows copied)."""
    starts, ends = ragged.offsets[items], ragged.offsets[items + 1]
    local = [np.arange(s, e) for s, e in zip(starts, ends)]
    flat = np.concatenate(local) if local else np.zeros(0, dtype=np.int64)
    rows = ragged.rows[flat] if ragged.rows is not None else flat
    offsets = np.concatenate([[0], np.cumsum(ends - starts)])
    return Ragged(ragged.data, offsets, rows=rows)


def apply(data: PRVRData, cfg) -> PRVRData:
    """Record whether val holds the test queries; with data.val_from_train=N, make val N held-out
    training videos. Facts go to data.meta["selection"] (the run record's provenance.data)."""
    overlap = test_queries_in_val(data)
    facts: dict = {"test_queries_in_val": None if overlap is None else round(overlap, 4),
                   "val_is_test": overlap is not None and overlap >= SAME}
    n = int(getattr(cfg.data, "val_from_train", 0))
    if n:
        train = data["train"]
        held = held_out_videos(train, n, data.name)
        keep = np.setdiff1d(np.arange(train.num_videos), held)
        data.splits["val"] = subset(train, held)
        data.splits["train"] = subset(train, keep)
        facts["val_from_train"] = {"videos": n, "queries": data["val"].num_queries,
                                   "rule": "numpy default_rng([crc32(dataset name), N]).permutation, first N",
                                   "video_ids": data["val"].video_ids}
    elif facts["val_is_test"]:
        progress.warn(f"{data.name}: val holds the test queries ({overlap:.0%} of test found in val, "
                      "by content), so checkpoints are selected on the test split as in the published figures; "
                      "--set data.val_from_train=N holds out N training videos for selection instead")
    data.meta["selection"] = facts
    return data
