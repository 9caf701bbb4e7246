"""CPU. A localizing run's stored rankings keep each query's VCMR ranks (harness/engine/rankings.py,
harness/engine/vcmr.py `best_hit_ranks`), so that VCMR SumR differences get the same two-level paired
bootstrap and randomization test as SumR (harness/reports/stats.py, harness/reports/sweeps.py)."""

from __future__ import annotations

import numpy as np
import pytest

from prvr.harness.base.io import UserError
from prvr.harness.engine import rankings as rk
from prvr.harness.engine.records import load_record_at, record_path
from prvr.harness.engine.runner import run_one
from prvr.harness.engine.vcmr import NO_HIT
from prvr.harness.reports import stats
from prvr.harness.reports.sweeps import BOTH_LEVELS, SEEDS_ONLY, Sweep, SweepRows, moment_gains, sweep_cells

RUNS = (("xml", 0), ("xml", 1), ("xml-sl", 0), ("xml-sl", 1), ("baseline", 0), ("baseline", 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """XML and XML-SL (they localize) and the baseline (it does not), two seeds each, one epoch on sim-tiny."""
    from prvr.harness.engine.config import resolve

    out = tmp_path_factory.mktemp("moments")
    for method, seed in RUNS:
        run_one(resolve(method, "sim-tiny", seed, ["train.epochs=1"]), out)
    return out


def _stored(out, method, seed):
    path = record_path(out, "sim-tiny", method, seed)
    return path, load_record_at(path), rk.load_rankings(rk.rankings_path(path))[0]


def test_a_localizing_run_stores_the_vcmr_ranks_its_figures_count(runs):
    path, record, rankings = _stored(runs, "xml", 0)
    for split in ("val", "test"):
        r = rankings[split]
        assert r.vcmr_best is not None and r.vcmr_best.shape == (r.num_queries, len(r.vcmr_tious))
        assert r.vcmr_tious == tuple(record["config"]["eval"]["vcmr_tious"])
        assert rk.moment_sumr(r) == pytest.approx(record["metrics"][split]["VCMR SumR"], abs=1e-9)
        # the per-query scores average to the record's figure (every sim-tiny query has its moment)
        assert rk.moment_query_scores(r).mean() == pytest.approx(record["metrics"][split]["VCMR SumR"])
    _, _, plain = _stored(runs, "baseline", 0)
    assert plain["test"].vcmr_best is None and rk.moment_query_scores(plain["test"]) is None


def test_queries_without_a_moment_count_nothing_and_the_mean_is_still_the_figure():
    best = np.array([[1, 3], [rk.NO_MOMENT, rk.NO_MOMENT], [12, NO_HIT], [200, 1]])
    r = rk.SplitRanking(np.zeros((4, 0), dtype=np.int64), np.zeros((4, 0), dtype=np.int64), np.ones(4, dtype=np.int64),
                        np.full(4, np.nan), rk.SplitKeys([], [], [], np.zeros(4, dtype=np.int64)), 100, best,
                        (0.5, 0.7))
    per_query = rk.moment_query_scores(r)
    assert per_query[1] == 0.0
    # R@1, 10, 100 at 0.5: 1/3, 1/3, 2/3; at 0.7: 1/3, 2/3, 2/3 of the three queries with a moment
    assert per_query.mean() == pytest.approx(100 * (1 + 1 + 2 + 1 + 2 + 2) / 3) == pytest.approx(rk.moment_sumr(r))


def test_stored_vcmr_ranks_that_are_not_the_records_are_refused_in_one_line(runs, tmp_path):
    path, record, rankings = _stored(runs, "xml", 0)
    test = rankings["test"]
    changed = dict(rankings, test=rk.SplitRanking(test.top, test.top_rank, test.labelled_rank, test.moment_fraction,
                                                   test.keys, test.top_k, np.ones_like(test.vcmr_best),
                                                   test.vcmr_tious))
    other = tmp_path / "seed0.json"
    other.write_bytes(path.read_bytes())
    rk.save_rankings(rk.rankings_path(other), changed, {"dataset": "sim-tiny", "run": "xml", "seed": 0})
    with pytest.raises(UserError, match=r"give test VCMR SumR 600\.0000, but run record .* says") as e:
        rk.rankings_of_record(other, record)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("best, tious, problem", [
    (np.ones((3, 2), dtype=np.int64), (0.5,), "VCMR ranks are"),
    (np.zeros((3, 1), dtype=np.int64), (0.5,), "VCMR ranks below 1"),
    (np.array([[1, rk.NO_MOMENT]] * 3), (0.5, 0.7), "at some thresholds only"),
    (np.ones((3, 1), dtype=np.int64), (1.5,), "outside"),
])
def test_malformed_vcmr_ranks_are_named(best, tious, problem):
    r = rk.SplitRanking(np.zeros((3, 1), dtype=np.int64), np.ones((3, 1), dtype=np.int64), np.ones(3, dtype=np.int64),
                        np.full(3, np.nan), rk.SplitKeys(["v"], ["a", "b", "c"], ["", "", ""],
                                                         np.zeros(3, dtype=np.int64)), 100, best, tious)
    assert problem in rk.split_problem(r)


def test_vcmr_sumr_differences_get_the_two_level_bootstrap(runs):
    settings = stats.Settings(resamples=500, permutations=500, metrics=("SumR", "VCMR SumR"))
    table = stats.compare_table(runs, "sim-tiny", [("xml-sl", "xml")], settings)
    (c,) = table.comparisons
    sumr, moments = c.metrics
    assert c.interval_over == stats.BOTH_LEVELS and moments.metric == "VCMR SumR"
    figures = {m: [load_record_at(record_path(runs, "sim-tiny", m, s))["metrics"]["test"]["VCMR SumR"] for s in (0, 1)]
               for m in ("xml-sl", "xml")}
    assert moments.difference == pytest.approx(np.mean(figures["xml-sl"]) - np.mean(figures["xml"]))
    assert moments.low <= moments.difference <= moments.high and 0 < moments.p <= 1
    # a row that does not localize has no per-query VCMR: one line naming the row, seed and file
    with pytest.raises(UserError, match=r"row 'baseline' seed 0: its stored rankings \(seed0.json\) hold no per-query "
                                        r"VCMR SumR") as e:
        stats.compare_table(runs, "sim-tiny", [("baseline", "xml")], settings)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="pick from R@1 R@5 R@10 R@100 SumR VCMR SumR oracle SumR"):
        stats.compare_table(runs, "sim-tiny", [("xml-sl", "xml")], stats.Settings(metrics=("VCMR R@1",)))


def test_a_sweeps_vcmr_gain_is_drawn_from_the_stored_ranks_where_both_rows_have_them(runs):
    from prvr.harness.engine.config import resolve

    preset = resolve("xml", "sim-tiny", 0).sim.repeat_prob
    sweep = Sweep("sim-tiny", ("sim.repeat_prob",), ((preset,),), (preset,), ("xml", "xml-sl"), (0, 1), "cmd")
    settings = stats.Settings(resamples=500, permutations=500)
    rows = SweepRows(runs, sweep)
    cells, _ = sweep_cells(sweep, runs, settings, rows)
    (ranked,) = moment_gains(cells, sweep, rows, settings)
    (plain,) = moment_gains(cells)  # no rows given: the seeds' t-test, as for records without moment ranks
    assert (ranked.over, plain.over) == (BOTH_LEVELS, SEEDS_ONLY)
    assert ranked.cell.run == "xml-sl" and ranked.difference == pytest.approx(plain.difference)
    want = stats.compare_table(runs, "sim-tiny", [("xml-sl", "xml")], stats.Settings(
        resamples=500, permutations=500, metrics=("VCMR SumR",))).comparisons[0].metrics[0]
    assert (ranked.low, ranked.high, ranked.p) == (want.low, want.high, want.p)
