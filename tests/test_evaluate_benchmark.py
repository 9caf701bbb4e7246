"""The evaluator's work outside the scoring, at TVR's val shape: ranking a score matrix of
10,895 queries x 2,179 videos under a relevance matrix as simulated TVR has one (most queries
one to three relevant videos, a tenth of them dozens), through the `ScoreWatch` that
`evaluate_model` puts around its scores. The path as it is (`listed_target_ranks`, one-pass
watch) against the path it replaced (`target_ranks` over every padded slot, the watch that
counted and masked every chunk twice); both must give identical ranks.

Scaled down for CI to 1,024 queries; with `--benchmark-disable` (the default in pytest.ini
options) each benchmark runs once as a test. Measure at TVR's size (scores generated, not timed;
one torch thread, as the profile measures):

    PRVR_EVAL_BENCH_FULL=1 pytest tests/test_evaluate_benchmark.py --benchmark-enable --benchmark-group-by=group
"""

import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.harness.engine import evaluate
from prvr.harness.engine.evaluate import ScoreWatch, compute_ranks, target_ranks

from test_evaluate import _ReferenceWatch

FULL = os.environ.get("PRVR_EVAL_BENCH_FULL") == "1"
QUERIES, VIDEOS = (10_895, 2_179) if FULL else (1_024, 2_179)  # TVR val (PRVR test): 5 queries per video


@pytest.fixture(scope="module")
def tvr_val_scores():
    rng = np.random.default_rng(0)
    scores = torch.from_numpy(rng.standard_normal((QUERIES, VIDEOS), dtype=np.float32))
    labelled = (np.arange(QUERIES) // 5) % VIDEOS
    extra = np.where(rng.random(QUERIES) < 0.1, rng.integers(10, 60, QUERIES), rng.integers(0, 3, QUERIES))
    rows = np.r_[np.arange(QUERIES), np.repeat(np.arange(QUERIES), extra)]
    cols = np.r_[labelled, rng.integers(0, VIDEOS, int(extra.sum()))]
    relevance = sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=(QUERIES, VIDEOS))
    labels = sp.csr_matrix((np.ones(QUERIES, dtype=bool), (np.arange(QUERIES), labelled)), shape=(QUERIES, VIDEOS))
    return scores, labels, relevance


def _rank(scores, labels, relevance, watch_cls):
    watch = watch_cls(lambda s, e: scores[s:e])
    return compute_ranks(watch, len(scores), labels, relevance), watch.problem()


def _padded(scores, targets, mask, block=None):
    """The replaced path: one whole-row comparison per padded slot."""
    return target_ranks(scores, torch.as_tensor(targets, device=scores.device), torch.as_tensor(mask, device=scores.device))


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.benchmark(group="rank one TVR-sized val split (relevance, score watch)")
def test_listed_ranks_and_one_pass_watch(benchmark, tvr_val_scores, monkeypatch):
    ranks, problem = benchmark(_rank, *tvr_val_scores, ScoreWatch)
    monkeypatch.setattr(evaluate, "listed_target_ranks", _padded)
    expected, expected_problem = _rank(*tvr_val_scores, _ReferenceWatch)
    assert problem == expected_problem == ""
    for key in expected:
        np.testing.assert_array_equal(ranks[key], expected[key])


@pytest.mark.benchmark(group="rank one TVR-sized val split (relevance, score watch)")
def test_padded_ranks_and_two_pass_watch(benchmark, tvr_val_scores, monkeypatch):
    monkeypatch.setattr(evaluate, "listed_target_ranks", _padded)
    ranks, _ = benchmark(_rank, *tvr_val_scores, _ReferenceWatch)
    assert len(ranks["oracle"]) == QUERIES
