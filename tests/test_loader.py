import subprocess
import sys

import numpy as np
import pytest
import torch

from prvr.datasets.loader import Batcher, l2_normalize, pooling_matrix, segment_bounds, segment_mean
from prvr.harness.engine.config import resolve
from prvr.harness.base.registry import DATASETS


@pytest.mark.parametrize("length, segments", [(7, 3), (3, 8), (32, 32), (100, 32), (1, 4)])
def test_segment_mean_matches_naive_loop(length, segments):
    x = np.random.default_rng(0).standard_normal((length, 5)).astype(np.float32)
    start, end = segment_bounds(length, segments)
    assert np.all(end > start)  # short videos repeat frames, never empty segments
    naive = np.stack([x[s:e].mean(0) for s, e in zip(start, end)])
    np.testing.assert_allclose(segment_mean(x, segments), naive, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooling_matrix(length, segments).sum(1), 1.0, rtol=1e-6)


def test_train_batch_shapes_masks_and_relevance():
    cfg = resolve("baseline", "sim-tiny", 0)
    data = DATASETS.get("sim-tiny").load(cfg)
    split = data["train"]
    b = Batcher(split, cfg.data)
    videos = np.array([3, 0, 5])
    batch = b.train_batch(videos)
    lengths = [min(len(split.frames[v]), cfg.data.max_frames) for v in videos]
    assert batch.videos.frame_mask.sum(1).tolist() == lengths
    assert batch.videos.clips.shape == (3, cfg.data.num_clips, split.frames.dim)
    n_q = sum(len(b.video_queries[v]) for v in videos)
    assert batch.queries.tokens.shape[0] == n_q == len(batch.query_item)
    assert torch.all(batch.queries.token_mask.sum(1) <= cfg.data.max_query_len)
    norms = batch.videos.frames[batch.videos.frame_mask].norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones_like(norms))
    # clip_pool over the padded frames equals segment means of each video's own frame rows
    pooled = torch.bmm(batch.videos.clip_pool, batch.videos.frames)
    for i, n in enumerate(lengths):
        expected = segment_mean(batch.videos.frames[i, :n].numpy(), cfg.data.num_clips)
        np.testing.assert_allclose(pooled[i].numpy(), expected, atol=1e-5)
    # raw clips: segment means of the raw rows, L2-normalised (MS-SL clip branch)
    raw = np.asarray(split.frames[videos[0]], dtype=np.float32)
    np.testing.assert_allclose(batch.videos.clips[0].numpy(), l2_normalize(segment_mean(raw, cfg.data.num_clips)),
                               atol=1e-5)
    # relevance of the batch = the split's ground truth restricted to its queries and videos
    q = batch.queries.query_index.numpy()
    np.testing.assert_array_equal(batch.relevant.numpy(), split.relevance[q][:, videos].toarray())
    assert batch.relevant[torch.arange(n_q), batch.query_item].all()


def test_query_batches_take_each_query_once_with_its_video_taken_once():
    """train.sample=queries (XML's TVRetrieval loader): a batch of queries, each with its labelled
    video; a video two of them share is one column, positive for both."""
    from prvr.datasets.loader import epoch_query_batches
    cfg = resolve("baseline", "sim-tiny", 0)
    split = DATASETS.get("sim-tiny").load(cfg)["train"]
    b = Batcher(split, cfg.data)
    shared = b.video_queries[4][:2]
    assert len(shared) == 2  # sim-tiny gives video 4 at least two queries
    queries = np.array([shared[0], b.video_queries[1][0], shared[1], b.video_queries[7][0]])
    batch = b.query_train_batch(queries)
    np.testing.assert_array_equal(batch.videos.video_index.numpy(), [4, 1, 7])  # the order queries first name them
    np.testing.assert_array_equal(batch.query_item.numpy(), [0, 1, 0, 2])
    np.testing.assert_array_equal(batch.queries.query_index.numpy(), queries)
    np.testing.assert_array_equal(batch.videos.video_index.numpy()[batch.query_item.numpy()], split.query_video[queries])
    np.testing.assert_array_equal(batch.relevant.numpy(), split.relevance[queries][:, [4, 1, 7]].toarray())
    # the same features as the video-major batch of those videos
    torch.testing.assert_close(batch.videos.frames, b.train_batch(np.array([4, 1, 7])).videos.frames)
    # an epoch: every query once, in an order fixed by (seed, epoch) alone
    epoch = epoch_query_batches(split.num_queries, 16, 3, 1)
    assert [len(x) for x in epoch[:-1]] == [16] * (len(epoch) - 1)
    assert sorted(np.concatenate(epoch).tolist()) == list(range(split.num_queries))
    assert all(np.array_equal(x, y) for x, y in zip(epoch, epoch_query_batches(split.num_queries, 16, 3, 1)))
    assert not np.array_equal(np.concatenate(epoch), np.concatenate(epoch_query_batches(split.num_queries, 16, 3, 2)))


def _reference_average_to_fixed_length(x: np.ndarray, segments: int) -> np.ndarray:
    """The MS-SL family's rule as its public code describes it, written out as a plain loop:
    boundaries round(i * n / S) (numpy rounding), clamped to n - 1; an empty segment is its
    start row."""
    n = len(x)
    idx = np.round(np.arange(0, segments + 1, 1.0) / segments * n).astype(np.int32)
    idx[idx > n - 1] = n - 1
    out = []
    for i in range(segments):
        s, e = idx[i], idx[i + 1]
        out.append(x[s:e].mean(0) if s < e else x[s])
    return np.stack(out)


@pytest.mark.parametrize("length", [1, 5, 31, 32, 33, 47, 100, 128, 129, 300])
@pytest.mark.parametrize("segments", [32, 128])
def test_reference_pooling_rule_matches_the_reference_loop(length, segments):
    x = np.random.default_rng(length * 7 + segments).normal(size=(length, 6)).astype(np.float32)
    np.testing.assert_allclose(segment_mean(x, segments, "reference"),
                               _reference_average_to_fixed_length(x, segments), rtol=1e-5, atol=1e-6)


def test_real_layout_presets_use_the_reference_rule():
    from prvr.harness.engine.config import resolve

    assert resolve("baseline", "tvr").data.pooling == "reference"
    assert resolve("baseline", "sim-tvr").data.pooling == "even"
    with pytest.raises(ValueError, match="data.pooling"):
        segment_bounds(10, 4, "nearest")


# ----------------------------------------------------------------------------- the data path
# The per-video path as it was before the split was processed once: every batch of the Batcher
# (kept features, per-batch parts, batches in order) must equal it bit for bit.
def _naive_videos(split, cfg, index):
    feats = []
    for v in index:
        raw = np.asarray(split.frames[int(v)], dtype=np.float32)
        clips = segment_mean(raw, cfg.num_clips, cfg.pooling)
        frames = segment_mean(raw, cfg.max_frames, cfg.pooling) if len(raw) > cfg.max_frames else raw
        if cfg.normalize_frames:
            clips, frames = l2_normalize(clips), l2_normalize(frames)
        feats.append((frames, clips))
    longest = max(len(f) for f, _ in feats)
    frames = np.zeros((len(feats), longest, split.frames.dim), dtype=np.float32)
    mask = np.zeros((len(feats), longest), dtype=bool)
    pool = np.zeros((len(feats), cfg.num_clips, longest), dtype=np.float32)
    for i, (f, _) in enumerate(feats):
        frames[i, : len(f)], mask[i, : len(f)] = f, True
        pool[i, :, : len(f)] = pooling_matrix(len(f), cfg.num_clips, cfg.pooling)
    index = np.asarray(index, dtype=np.int64)
    return {"frames": frames, "frame_mask": mask, "clips": np.stack([c for _, c in feats]), "clip_pool": pool,
            "video_index": index, "durations": np.asarray(split.durations, dtype=np.float32)[index]}


def _naive_queries(split, cfg, index):
    rows = []
    for q in index:
        tok = np.asarray(split.tokens[int(q)][: cfg.max_query_len], dtype=np.float32)
        rows.append(l2_normalize(tok) if cfg.normalize_tokens else tok)
    longest = max(len(r) for r in rows)
    tokens = np.zeros((len(rows), longest, split.tokens.dim), dtype=np.float32)
    mask = np.zeros((len(rows), longest), dtype=bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)], mask[i, : len(r)] = r, True
    return {"tokens": tokens, "token_mask": mask, "query_index": np.asarray(index, dtype=np.int64)}


def _assert_bitwise(batch, naive):
    for key, expected in naive.items():
        got = getattr(batch, key)
        assert got.dtype == torch.from_numpy(expected).dtype, key
        assert torch.equal(got, torch.from_numpy(expected)), key


def _split_and_cfg(pooling, normalize):
    cfg = resolve("baseline", "sim-tiny", 0, [f"data.pooling={pooling}", f"data.normalize_frames={normalize}",
                                              f"data.normalize_tokens={normalize}", "data.max_frames=16",
                                              "data.num_clips=20", "data.max_query_len=8"])
    return DATASETS.get("sim-tiny").load(cfg)["train"], cfg.data


def test_data_keep_gb_caps_what_a_split_keeps_and_batches_stay_bit_for_bit(monkeypatch):
    """`data.keep_gb` caps the host memory a split keeps below the free RAM's share: 0 keeps no part and
    no evaluation batch list (each made as it is taken), a cap of the clips' size keeps the clips alone,
    -1 (the default) keeps what fits in the share; the batches are the naive ones whatever is kept."""
    import dataclasses

    from prvr.datasets import loader

    split, cfg = _split_and_cfg("even", True)
    sizes = loader.kept_sizes(split, cfg)
    monkeypatch.setattr(loader, "available_ram", lambda: 1 << 40)  # a large machine: only the cap limits
    assert loader.keep_budget(-1) == loader.KEEP_SHARE * (1 << 40) and loader.keep_budget(0) == 0
    assert loader.keep_budget(2.0) == 2 << 30
    index = np.array([7, 0, 3])
    clips_gb = sizes["clips"] / (1 << 30)
    for cap, kept in [(-1.0, ["clips", "tokens", "frames"]), (0.0, []), (clips_gb, ["clips"])]:
        b = Batcher(split, dataclasses.replace(cfg, keep_gb=cap))
        _assert_bitwise(b.videos(index), _naive_videos(split, cfg, index))
        got = [part for part in loader.KEEP_ORDER if getattr(b.kept, part) is not None or sizes[part] == 0]
        assert got == [p for p in loader.KEEP_ORDER if p in kept or sizes[p] == 0], cap
    none = Batcher(split, dataclasses.replace(cfg, keep_gb=0.0))
    for start, batch in zip(range(0, split.num_queries, 50), none.in_order("queries", 50)):
        _assert_bitwise(batch, _naive_queries(split, cfg, np.arange(start, min(start + 50, split.num_queries))))
    assert not none._in_order  # nothing held: no batch list kept under a cap of 0


@pytest.mark.parametrize("pooling", ["even", "reference"])
@pytest.mark.parametrize("normalize", [True, False])
def test_every_path_gives_the_per_video_batches_bit_for_bit(pooling, normalize, monkeypatch):
    """Kept features (all parts, some parts within a budget, none), batches in order (made once,
    or gathered from kept features): each the naive per-video batch, float32 bit for bit, with
    videos longer than max_frames (pooled frames) and shorter than num_clips (repeated rows)."""
    from prvr.datasets import loader

    split, cfg = _split_and_cfg(pooling, normalize)
    lengths = split.frames.lengths
    assert lengths.max() > cfg.max_frames and lengths.min() < cfg.num_clips  # both pooling cases occur
    index = np.array([7, 0, int(np.argmax(lengths)), 3, int(np.argmin(lengths))])
    sizes = loader.kept_sizes(split, cfg)
    batchers = [Batcher(split, cfg, keep=True), Batcher(split, cfg, keep=False), Batcher(split, cfg)]
    monkeypatch.setattr(loader, "available_ram", lambda: int(sizes["clips"] / loader.KEEP_SHARE) + 1)
    batchers.append(Batcher(split, cfg))  # a budget that keeps the clips only
    for b in batchers:
        _assert_bitwise(b.videos(index), _naive_videos(split, cfg, index))
        _assert_bitwise(b.queries(index * 2), _naive_queries(split, cfg, index * 2))
    assert batchers[-1].kept.clips is not None and batchers[-1].kept.frames is None
    assert batchers[-1].kept.tokens is None and batchers[1].kept.clips is None
    for b in (Batcher(split, cfg), batchers[0]):  # batches in order: made once / gathered from kept features
        for start, batch in zip(range(0, split.num_videos, 16), b.in_order("videos", 16)):
            _assert_bitwise(batch, _naive_videos(split, cfg, np.arange(start, min(start + 16, split.num_videos))))
        for start, batch in zip(range(0, split.num_queries, 50), b.in_order("queries", 50)):
            _assert_bitwise(batch, _naive_queries(split, cfg, np.arange(start, min(start + 50, split.num_queries))))


def test_kept_parts_follow_the_budget_in_order():
    from prvr.datasets.loader import KEEP_ORDER, keep_plan

    sizes = {"clips": 30, "tokens": 20, "frames": 50}
    assert KEEP_ORDER == ("clips", "tokens", "frames")
    assert keep_plan(sizes, None) == ["clips", "tokens", "frames"]
    assert keep_plan(sizes, 100) == ["clips", "tokens", "frames"]
    assert keep_plan(sizes, 99) == ["clips", "tokens"]
    assert keep_plan(sizes, 25) == ["tokens"]  # a part that does not fit is made per batch; later ones may fit
    assert keep_plan({**sizes, "clips": 0}, 25) == ["clips", "tokens"]


def test_raw_rows_serve_as_kept_frames_when_nothing_changes_them():
    cfg = resolve("baseline", "sim-tiny", 0, ["data.normalize_frames=false", "data.normalize_tokens=false",
                                              "data.max_frames=128"])
    split = DATASETS.get("sim-tiny").load(cfg)["train"]
    from prvr.datasets.loader import kept_sizes

    assert kept_sizes(split, cfg.data)["frames"] > 0  # the simulated rows are stored as float16
    split.frames = split.frames.in_memory(np.float32)  # as real features are: float32, none too long
    assert kept_sizes(split, cfg.data)["frames"] == 0
    kept = Batcher(split, cfg.data, keep=True).prepare()
    assert kept.frames is split.frames


def test_batches_in_order_are_made_once_per_split(monkeypatch):
    """Evaluation's batches of a split that keeps no processed features are made on the first
    call and reused (the same objects); a split that keeps features gathers them, keeping no copy."""
    from prvr.datasets import loader

    split, cfg = _split_and_cfg("even", True)
    calls = []
    real = loader.frame_rows
    monkeypatch.setattr(loader, "frame_rows", lambda raw, c: calls.append(1) or real(raw, c))
    val = Batcher(split, cfg)
    first = val.in_order("videos", 16)
    assert len(calls) == split.num_videos and val.kept is None
    assert val.in_order("videos", 16) is first and len(calls) == split.num_videos
    train = Batcher(split, cfg, keep=True)
    train.prepare()
    made = len(calls)
    a, b = train.in_order("videos", 16), train.in_order("videos", 16)
    assert a is not b and len(calls) == made and all(torch.equal(x.frames, y.frames) for x, y in zip(a, b))


def _old_epoch(batches, make, num_workers):
    """One epoch as the trainer ran it before EpochLoader: a DataLoader made for the epoch."""
    from prvr.datasets.loader import _Make

    class Listed(_Make):
        def __len__(self):
            return len(batches)

        def __getitem__(self, i):
            return self.make(batches[i])

    loader = torch.utils.data.DataLoader(Listed(make), batch_size=None, shuffle=False, num_workers=num_workers)
    return list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_loader_keeps_the_order_and_the_torch_random_stream(workers):
    """Over three epochs: the batches in the order given, and the global torch RNG exactly where
    the per-epoch DataLoaders left it (each drew one number), so dropout masks do not move."""
    from prvr.datasets.loader import EpochLoader, epoch_batches

    cfg = resolve("baseline", "sim-tiny", 0)
    split = DATASETS.get("sim-tiny").load(cfg)["train"]
    batcher = Batcher(split, cfg.data)
    has = np.array([len(q) > 0 for q in batcher.video_queries])
    loader = EpochLoader(batcher.train_batch, workers, prepare=batcher.prepare)
    for epoch in range(3):
        batches = epoch_batches(len(has), 16, 0, epoch, has)
        torch.manual_seed(epoch)
        got = list(loader.epoch(batches))
        after_new = torch.get_rng_state()
        torch.manual_seed(epoch)
        old = _old_epoch(batches, batcher.train_batch, 0)
        assert torch.equal(after_new, torch.get_rng_state())
        assert [b.videos.video_index.tolist() for b in got] == [list(b) for b in batches]
        for x, y in zip(got, old):
            assert torch.equal(x.videos.frames, y.videos.frames) and torch.equal(x.queries.tokens, y.queries.tokens)
    loader.close()


WORKERS_UNDER_FORKSERVER = """
import multiprocessing, threading
multiprocessing.set_start_method("forkserver")  # Python 3.14's default on Linux
import numpy as np, torch
from prvr.datasets.loader import EpochLoader

held = threading.Lock()  # what the builder holds cannot be pickled: a worker must be forked to have it
def make(videos):
    with held:
        return torch.as_tensor(videos) * 2

loader = EpochLoader(make, num_workers=2)
print([b.tolist() for b in loader.epoch([np.array([1, 2]), np.array([3])])])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_epoch_loader_forks_its_workers_whatever_the_default_start_method():
    """The workers share what the run's process holds (the processed features, gigabytes at TVR's
    size) because they are forked; under forkserver, Python 3.14's default, torch would pickle the
    batch builder into each worker (and fail here, on the lock it holds)."""
    done = subprocess.run([sys.executable, "-c", WORKERS_UNDER_FORKSERVER], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[[2, 4], [6]]"


def test_auto_workers_only_where_a_gpu_trains_and_workers_are_forked(monkeypatch):
    from types import SimpleNamespace

    from prvr.harness.engine import trainer

    def workers(n, device, start):
        monkeypatch.setattr(trainer, "WORKER_START", start)
        me = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(num_workers=n)), device=torch.device(device))
        return trainer.Trainer.num_workers(me)

    monkeypatch.setattr(trainer.os, "cpu_count", lambda: 16)
    assert workers(-1, "cuda", "fork") == 4 and workers(-1, "cpu", "fork") == 0
    assert workers(-1, "cuda", None) == 0  # spawned workers would each get a copy of the features
    assert workers(3, "cuda", None) == 3 and workers(0, "cuda", "fork") == 0  # a number given is kept


def test_a_batch_moved_to_a_device_describes_its_masks():
    """What the model and the losses read without asking the device (harness/base/masks.py)."""
    from prvr.harness.base import masks

    cfg = resolve("baseline", "sim-tiny", 0)
    split = DATASETS.get("sim-tiny").load(cfg)["train"]
    b = Batcher(split, cfg.data)
    batch = b.train_batch(np.array([3, 0, 5])).to(torch.device("cpu"))
    for mask in (batch.videos.frame_mask, batch.queries.token_mask):
        facts = masks.known(mask)
        assert torch.equal(facts.index, mask.flatten().nonzero().squeeze(1))
        assert facts.all_true == bool(mask.all())
    assert masks.known(batch.query_item).covers == 3


def test_batches_in_order_are_made_as_they_are_taken_unless_kept(monkeypatch):
    """A split's padded batches are held whole only where they are kept (they fit); otherwise,
    and from a split's processed features, each is made as it is taken: TVR's training split
    padded at once would be about 27 GB (the rehearsal's ARL pass ran out of memory on it)."""
    from prvr.datasets import loader

    split, cfg = _split_and_cfg("even", True)
    calls = []
    real = loader.frame_rows
    monkeypatch.setattr(loader, "frame_rows", lambda raw, c: calls.append(1) or real(raw, c))
    lazy = Batcher(split, cfg, keep=False).in_order("videos", 16)
    assert not isinstance(lazy, list) and calls == []  # nothing made yet
    first = next(iter(lazy))
    assert len(calls) == len(first.video_index)  # one batch made, not the split
    train = Batcher(split, cfg, keep=True)
    train.prepare()
    assert not isinstance(train.in_order("queries", 16), list)
