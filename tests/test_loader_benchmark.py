"""Reading one training batch of video features: per-frame seeks (the MS-SL reference reader)
against the memory-mapped reader, on a generated TVR-shaped BigFile; and making one training
batch of TVR-shaped videos: pooled, normalised and padded video by video (the per-batch path)
against gathered from the split processed once (`Batcher.prepare`).

TVR shape: 3072-d float32 rows, about 50 rows per video (75.7 s at one row per 1.5 s), all
videos of every split in one feature.bin. Scaled down for CI to the 128 videos of one MS-SL
batch (about 6,400 rows, 79 MB). Both readers must return identical arrays. With
`--benchmark-disable` (the default in pytest.ini options) each benchmark runs once as a test;
measure with:

    pytest tests/test_loader_benchmark.py --benchmark-enable --benchmark-group-by=group
"""

import numpy as np
import pytest
import torch

from prvr.datasets.loader import Batcher
from prvr.datasets.real.bigfile import BigFile, read_frames_seek, write_bigfile
from prvr.datasets.types import Ragged, Split
from prvr.harness.engine.sections import DataConfig

DIM = 3072
VIDEOS = 128  # one MS-SL training batch
MEAN_ROWS = 50


@pytest.fixture(scope="module")
def tvr_shaped(tmp_path_factory):
    """A BigFile whose videos lie in feature.bin in another order than the batch asks for them."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.normal(MEAN_ROWS, 12, VIDEOS).round().astype(int), 20, 128)
    order = rng.permutation(VIDEOS)  # storage order
    video2frames = {f"v{v:04d}": [f"v{v:04d}_{k}" for k in range(lengths[v])] for v in order}
    frame_ids = [f for v in order for f in video2frames[f"v{v:04d}"]]
    folder = tmp_path_factory.mktemp("tvr_shaped") / "i3d_resnet"

    def blocks():
        for v in order:
            yield rng.standard_normal((lengths[v], DIM), dtype=np.float32)

    write_bigfile(folder, frame_ids, blocks(), DIM, video2frames)
    big = BigFile(folder)
    batch = [f"v{v:04d}" for v in range(VIDEOS)]
    rows = [np.array([big.row_of[f] for f in big.video2frames[v]]) for v in batch]
    return big, rows


def read_batch_seek(big: BigFile, rows: list[np.ndarray]) -> list[np.ndarray]:
    return [read_frames_seek(big.folder / "feature.bin", r, big.dim) for r in rows]


def read_batch_reference(big: BigFile, rows: list[np.ndarray]) -> list[np.ndarray]:
    """The reference's whole data path: per-frame seek reads returned as Python lists, then
    np.array of the lists (float64)."""
    path = big.folder / "feature.bin"
    return [np.array([read_frames_seek(path, [r], big.dim)[0].tolist() for r in video]) for video in rows]


def read_batch_memmap(big: BigFile, rows: list[np.ndarray]) -> list[np.ndarray]:
    frames = Ragged(big.data, np.concatenate([[0], np.cumsum([len(r) for r in rows])]), rows=np.concatenate(rows))
    return [np.array(frames[i], dtype=np.float32) for i in range(len(rows))]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b) == VIDEOS
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)  # float64 lists hold the float32 values exactly


@pytest.mark.benchmark(group="read one batch of 128 TVR-shaped videos")
def test_per_frame_seek_reader(benchmark, tvr_shaped):
    big, rows = tvr_shaped
    out = benchmark(read_batch_seek, big, rows)
    _same(out, read_batch_memmap(big, rows))


@pytest.mark.benchmark(group="read one batch of 128 TVR-shaped videos")
def test_memory_mapped_reader(benchmark, tvr_shaped):
    big, rows = tvr_shaped
    out = benchmark(read_batch_memmap, big, rows)
    _same(out, read_batch_seek(big, rows))


@pytest.mark.benchmark(group="read one batch of 128 TVR-shaped videos")
def test_reference_data_path(benchmark, tvr_shaped):
    big, rows = tvr_shaped
    out = benchmark(read_batch_reference, big, rows)
    _same(out, read_batch_memmap(big, rows))


@pytest.fixture(scope="module")
def tvr_shaped_split():
    """One MS-SL batch of TVR-shaped videos (float32 rows, about 50 each) with 5 queries each."""
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.normal(MEAN_ROWS, 12, VIDEOS).round().astype(int), 20, 128)
    frames = Ragged.from_list([rng.standard_normal((n, DIM), dtype=np.float32) for n in lengths])
    queries = VIDEOS * 5
    tokens = Ragged.from_list([rng.standard_normal((rng.integers(8, 30), 768), dtype=np.float32)
                               for _ in range(queries)])
    split = Split([f"v{v}" for v in range(VIDEOS)], frames, lengths * 1.5, [f"q{q}" for q in range(queries)],
                  [""] * queries, tokens, np.arange(queries) // 5, np.full((queries, 2), np.nan))
    return split, np.random.default_rng(2).permutation(VIDEOS)


@pytest.mark.benchmark(group="make one training batch of 128 TVR-shaped videos")
def test_batch_made_video_by_video(benchmark, tvr_shaped_split):
    split, order = tvr_shaped_split
    out = benchmark(Batcher(split, DataConfig(), keep=False).train_batch, order)
    kept = Batcher(split, DataConfig(), keep=True).train_batch(order)
    assert torch.equal(out.videos.frames, kept.videos.frames) and torch.equal(out.videos.clips, kept.videos.clips)


@pytest.mark.benchmark(group="make one training batch of 128 TVR-shaped videos")
def test_batch_gathered_from_the_processed_split(benchmark, tvr_shaped_split):
    split, order = tvr_shaped_split
    batcher = Batcher(split, DataConfig(), keep=True)
    batcher.prepare()  # once per run
    out = benchmark(batcher.train_batch, order)
    plain = Batcher(split, DataConfig(), keep=False).train_batch(order)
    assert torch.equal(out.queries.tokens, plain.queries.tokens) and torch.equal(out.videos.clip_pool,
                                                                                 plain.videos.clip_pool)
