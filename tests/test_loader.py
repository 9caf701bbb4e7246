import numpy as np
import pytest
import torch

from prvr.datasets.loader import Batcher, l2_normalize, pooling_matrix, segment_bounds, segment_mean
from prvr.harness.config import resolve
from prvr.harness.registry import DATASETS


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
    from prvr.harness.config import resolve

    assert resolve("baseline", "tvr").data.pooling == "reference"
    assert resolve("baseline", "sim-tvr").data.pooling == "even"
    with pytest.raises(ValueError, match="data.pooling"):
        segment_bounds(10, 4, "nearest")
