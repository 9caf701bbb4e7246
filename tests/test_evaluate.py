import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.harness.engine.evaluate import (ScoreWatch, bucket_of, compute_ranks, evaluate_scores, listed_target_ranks,
                                          metrics_from_ranks, padded_targets, recall_table, reference_ranks,
                                          target_ranks)


def labels_of(targets: list[list[int]], n_videos: int) -> sp.csr_matrix:
    rows = [q for q, ts in enumerate(targets) for _ in ts]
    cols = [t for ts in targets for t in ts]
    return sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=(len(targets), n_videos))


def test_hand_computed_ranks_and_recalls():
    scores = np.array([[0.9, 0.1, 0.5],   # labelled 0: rank 1
                       [0.2, 0.3, 0.1],   # labelled 2: rank 3
                       [0.4, 0.4, 0.0]])  # labelled 1, tied with video 0: ties count against -> rank 2
    ranks = compute_ranks(lambda s, e: torch.tensor(scores[s:e]), 3, labels_of([[0], [2], [1]], 3))["labelled"]
    assert ranks.tolist() == [1, 3, 2]
    table = recall_table(ranks, ks=(1, 2))
    assert table["R@1"] == pytest.approx(100 / 3)
    assert table["R@2"] == pytest.approx(200 / 3)
    assert table["SumR"] == pytest.approx(100.0)


def test_constant_model_ranks_every_labelled_video_last():
    scores = np.zeros((4, 10))
    ranks = compute_ranks(lambda s, e: torch.tensor(scores[s:e]), 4, labels_of([[0], [3], [5], [9]], 10))["labelled"]
    assert ranks.tolist() == [10, 10, 10, 10]


def test_best_of_several_labelled_videos_counts():
    scores = np.array([[0.1, 0.9, 0.5, 0.7]])
    ranks = compute_ranks(lambda s, e: torch.tensor(scores[s:e]), 1, labels_of([[0, 2]], 4))["labelled"]
    assert ranks.tolist() == [3]  # video 2 is third (0.9, 0.7 above it)


@pytest.mark.parametrize("seed", range(5))
def test_counting_path_equals_full_sort_reference(seed):
    rng = np.random.default_rng(seed)
    q, v = 57, 113
    scores = np.round(rng.standard_normal((q, v)), 1)  # rounding makes many ties
    targets = [sorted(rng.choice(v, size=rng.integers(1, 4), replace=False).tolist()) for _ in range(q)]
    rel = [sorted(set(t) | set(rng.choice(v, size=rng.integers(0, 5), replace=False).tolist())) for t in targets]
    out = compute_ranks(lambda s, e: torch.tensor(scores[s:e]), q, labels_of(targets, v), labels_of(rel, v), chunk=10)
    np.testing.assert_array_equal(out["labelled"], reference_ranks(scores, targets))
    np.testing.assert_array_equal(out["oracle"], reference_ranks(scores, rel))
    # unlabelled relevant videos scored >= the best labelled one, by brute force
    expected = [sum(scores[i, r] >= max(scores[i, t] for t in targets[i]) for r in set(rel[i]) - set(targets[i]))
                for i in range(q)]
    np.testing.assert_array_equal(out["above"], expected)


def test_oracle_metrics_and_multi_relevant_share():
    scores = np.array([[0.2, 0.9, 0.1], [0.9, 0.1, 0.3]])
    labels = labels_of([[0], [0]], 3)
    relevance = labels_of([[0, 1], [0]], 3)
    m = evaluate_scores(scores, labels, relevance)
    assert m["R@1"] == 50.0  # query 0: labelled video is second
    assert m["oracle"]["R@1"] == 100.0  # video 1 is truly relevant
    assert m["oracle"]["unlabelled_above"] == 0.5
    assert m["oracle"]["multi_relevant_share"] == 50.0


def test_buckets_split_queries_by_moment_fraction():
    frac = np.array([0.1, 0.2, 0.25, 0.4, 0.9, np.nan, 1.2])
    assert bucket_of(frac).tolist() == ["short", "short", "medium", "medium", "long", "", "long"]
    ranks = {"labelled": np.array([1, 20, 3, 200, 1, 1, 1])}
    m = metrics_from_ranks(ranks, frac)
    assert m["buckets"]["short"]["n"] == 2 and m["buckets"]["short"]["R@1"] == 50.0
    assert m["buckets"]["medium"]["R@5"] == 50.0
    assert m["buckets"]["long"]["SumR"] == 400.0
    assert m["n"] == 7 and m["median_rank"] == 1.0


def _vague_relevance(rng, q, v, vague=0.1):
    """Relevant videos per query as simulated TVR has them: most queries one to three, a few
    (vague ones) dozens, some none."""
    counts = np.where(rng.random(q) < vague, rng.integers(10, 40, q), rng.integers(0, 4, q))
    return labels_of([sorted(rng.choice(v, size=min(int(c), v), replace=False).tolist()) for c in counts], v)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block", [1, 7, 4096])
def test_listed_target_ranks_equal_the_padded_loop(seed, block):
    """One comparison per listed target (`listed_target_ranks`) against one per padded slot
    (`target_ranks`, the naive path it replaces): identical integer ranks, with ties, -inf
    (a non-finite score after worst_if_nonfinite), -0.0 beside 0.0, queries without targets."""
    rng = np.random.default_rng(seed)
    q, v = 41, 67
    scores = torch.tensor(np.round(rng.standard_normal((q, v)), 1), dtype=torch.float32)
    scores[rng.random((q, v)) < 0.05] = float("-inf")
    scores[rng.random((q, v)) < 0.05] = -0.0
    scores[0] = 0.0  # a row of one value
    idx, mask = padded_targets(_vague_relevance(rng, q, v))
    assert (~mask).all(1).any() and mask.sum(1).max() >= 10  # empty rows and wide ones occur
    naive = target_ranks(scores, torch.as_tensor(idx), torch.as_tensor(mask))
    fast = listed_target_ranks(scores, idx, mask, block=block)
    assert fast.dtype == naive.dtype and torch.equal(fast, naive)


def test_listed_target_ranks_without_any_target():
    idx, mask = np.zeros((3, 1), dtype=np.int64), np.zeros((3, 1), dtype=bool)
    assert listed_target_ranks(torch.zeros(3, 5), idx, mask).tolist() == [[6], [6], [6]]


@pytest.mark.parametrize("seed", range(3))
def test_ranks_of_vague_queries_equal_the_full_sort_reference(seed):
    """The relevance path end to end (oracle, dense recall counts) with dozens of relevant videos
    for a few queries, chunked, against the brute-force sort."""
    rng = np.random.default_rng(seed)
    q, v = 60, 90
    scores = np.round(rng.standard_normal((q, v)), 1)
    rel = _vague_relevance(rng, q, v)
    labels = labels_of([[int(rng.choice(r))] if len(r) else [int(rng.integers(v))]
                        for r in np.split(rel.indices, rel.indptr[1:-1])], v)
    rel = (rel + labels).astype(bool).tocsr()
    out = compute_ranks(lambda s, e: torch.tensor(scores[s:e]), q, labels, rel, chunk=16)
    per_query = np.split(rel.indices, rel.indptr[1:-1])
    np.testing.assert_array_equal(out["oracle"], reference_ranks(scores, [list(r) for r in per_query]))
    each = [[reference_ranks(scores[i : i + 1], [[t]])[0] for t in r] for i, r in enumerate(per_query)]
    expected_top = [[sum(r <= k for r in ranks) for k in (1, 5, 10, 100)] for ranks in each]
    np.testing.assert_array_equal(out["relevant_top"], expected_top)


class _ReferenceWatch(ScoreWatch):
    """ScoreWatch before its one-pass path: every chunk counted and masked twice."""

    def __call__(self, start: int, end: int) -> torch.Tensor:
        import math

        scores = self.score_fn(start, end)
        finite = torch.isfinite(scores)
        self.total += scores.numel()
        self.nonfinite += int((~finite).sum())
        if scores.numel():
            low, high = scores.masked_fill(~finite, math.inf).min(), scores.masked_fill(~finite, -math.inf).max()
            self.low, self.high = min(self.low, float(low)), max(self.high, float(high))
        return scores


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_score_watch_sees_what_the_reference_sees(dtype):
    nan, inf = float("nan"), float("inf")
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((9, 4)), np.full((9, 4), 0.25), np.full((9, 4), nan),
             np.where(rng.random((9, 4)) < 0.2, nan, rng.standard_normal((9, 4))),
             np.where(rng.random((9, 4)) < 0.2, -inf, rng.standard_normal((9, 4))),
             np.r_[np.full((3, 4), inf), rng.standard_normal((6, 4))], np.zeros((0, 4))]
    for values in cases:
        scores = torch.tensor(values, dtype=dtype)
        watches = [ScoreWatch(lambda s, e: scores[s:e]), _ReferenceWatch(lambda s, e: scores[s:e])]
        for w in watches:
            for start in range(0, max(len(scores), 1), 4):  # chunks, one of them all finite, the last short
                w(start, start + 4)
        fast, ref = watches
        assert (fast.nonfinite, fast.total, fast.low, fast.high, fast.problem()) == \
            (ref.nonfinite, ref.total, ref.low, ref.high, ref.problem())
