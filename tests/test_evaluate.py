import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.harness.engine.evaluate import (bucket_of, compute_ranks, evaluate_scores, metrics_from_ranks, recall_table,
                                   reference_ranks)


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
