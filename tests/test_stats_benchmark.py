"""The paired randomization test of the statistics (`stats.randomization_p`) against
`scipy.stats.permutation_test` itself, on a comparison the size of sim-tvr-v2's (three seeds of
1,500 test queries, SumR per query in steps of 100 as the four R@K give it): the same p, and the
time each takes. scipy builds each batch of swapped samples with a Python loop over the pairs;
`randomization_p` draws the same swaps and takes one matrix product per batch.

Scaled down for CI to 600 pairs and 2,000 swaps (what the leaderboard draws); with
`--benchmark-disable` (the default in pytest's options) each benchmark runs once as a test.
Measure at the full size (three seeds of 1,500 queries, 10,000 swaps, what `prvr-bench compare`
draws):

    PRVR_STATS_BENCH_FULL=1 pytest tests/test_stats_benchmark.py --benchmark-enable --benchmark-group-by=group
"""

import os

import numpy as np
import pytest

from prvr.harness.reports import stats

from test_stats import scipy_p

FULL = os.environ.get("PRVR_STATS_BENCH_FULL") == "1"
QUERIES, PERMUTATIONS = (1_500, 10_000) if FULL else (200, 2_000)
GROUP = f"paired randomization test, 3 seeds x {QUERIES} queries, {PERMUTATIONS} swaps"


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(0)
    a = [rng.integers(0, 5, QUERIES) * 100.0 for _ in range(3)]
    b = [np.clip(x + 100.0 * rng.integers(-1, 2, QUERIES), 0, 400) for x in a]
    return a, b


@pytest.mark.benchmark(group=GROUP)
def test_randomization_p(benchmark, rows):
    p = benchmark(stats.randomization_p, *rows, PERMUTATIONS, 0)
    assert p == scipy_p(*rows, PERMUTATIONS, 0)


@pytest.mark.benchmark(group=GROUP)
def test_scipy_permutation_test(benchmark, rows):
    p = benchmark(scipy_p, *rows, PERMUTATIONS, 0)
    assert 0 < p <= 1
