"""CPU. The oracle SumR by query: a simulated run's stored top lists scored against its world's relevance,
rebuilt from the record's config (harness/reports/stats.py `oracle_query_scores`), so that Δ oracle SumR gets
the two-level paired bootstrap and randomization test of SumR (`prvr-bench compare --metrics "oracle SumR"`,
the leaderboard's Δ oracle SumR against a backbone)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prvr.harness.base.io import UserError
from prvr.harness.engine import rankings as rk
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import load_record_at, record_path
from prvr.harness.engine.runner import run_one
from prvr.harness.reports import leaderboard, stats
from prvr.harness.reports.table import ORACLE_SUMR

RUNS = (("msl", "", 0), ("msl", "", 1), ("ral", "msl", 0), ("ral", "msl", 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """MS-SL and RAL on MS-SL, two seeds each, on sim-tiny under its protocol (a simulated world: ground truth known)."""
    out = tmp_path_factory.mktemp("oracle")
    for method, backbone, seed in RUNS:
        cfg = resolve(method, "sim-tiny", seed, [f"backbone={backbone}"] if backbone else [])
        run_one(cfg, out)
    return out


def _stored(out, run, seed):
    path = record_path(out, "sim-tiny", run, seed)
    return path, load_record_at(path), rk.load_rankings(rk.rankings_path(path))[0]["test"]


def _naive_oracle_sumr(ranking, relevance):
    """Each query's oracle SumR by a loop: the best stored rank of any relevant video among its top list."""
    relevance = relevance.tocsr()
    out = []
    for q in range(len(ranking.labelled_rank)):
        relevant = set(relevance.indices[relevance.indptr[q]:relevance.indptr[q + 1]].tolist())
        best = min((int(r) for v, r in zip(ranking.top[q], ranking.top_rank[q]) if int(v) in relevant),
                   default=ranking.top_k + 1)
        out.append(sum(100.0 for k in (1, 5, 10, 100) if best <= k))
    return np.array(out)


def test_the_oracle_sumr_by_query_averages_to_the_records_and_matches_a_naive_loop(runs):
    path, record, ranking = _stored(runs, "msl", 0)
    figure = record["metrics"]["test"]["oracle"]["SumR"]
    scores, why = stats.oracle_query_scores(record, ranking, figure)
    assert why == "" and scores.mean() == pytest.approx(figure, abs=1e-9)
    from prvr.harness.base.registry import DATASETS
    split = DATASETS.get("sim-tiny").load(resolve("msl", "sim-tiny", 0)).splits["test"]
    assert np.array_equal(scores, _naive_oracle_sumr(ranking, split.relevance))  # every sim-tiny query is covered
    # the row loads it only when asked: SumR-only comparisons rebuild no world
    assert np.isnan(stats.seed_scores(path, record).scores[:, stats.ALL_METRICS.index(ORACLE_SUMR)]).all()


def test_compare_pairs_the_oracle_sumr_by_query(runs):
    settings = stats.Settings(resamples=500, permutations=500, metrics=("SumR", ORACLE_SUMR))
    (c,) = stats.compare_table(runs, "sim-tiny", [("ral@msl", "msl")], settings).comparisons
    sumr, oracle = c.metrics
    assert c.interval_over == stats.BOTH_LEVELS and oracle.metric == ORACLE_SUMR
    means = {r: np.mean([load_record_at(record_path(runs, "sim-tiny", r, s))["metrics"]["test"]["oracle"]["SumR"]
                         for s in (0, 1)]) for r in ("ral@msl", "msl")}
    assert oracle.difference == pytest.approx(means["ral@msl"] - means["msl"])
    assert oracle.low <= oracle.difference <= oracle.high and 0 < oracle.p <= 1


def test_a_world_that_does_not_rebuild_to_the_records_figure_is_refused_in_one_line(runs, tmp_path):
    import shutil
    shutil.copytree(runs, tmp_path / "out")
    out = tmp_path / "out"
    path = record_path(out, "sim-tiny", "msl", 1)
    record = json.loads(path.read_text())
    record["metrics"]["test"]["oracle"]["SumR"] += 1.0  # another generator's world, as far as the figure tells
    path.write_text(json.dumps(record))
    settings = stats.Settings(resamples=100, permutations=100, metrics=(ORACLE_SUMR,))
    with pytest.raises(UserError) as e:
        stats.compare_table(out, "sim-tiny", [("ral@msl", "msl")], settings)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("row 'msl' seed 1: no per-query oracle SumR from its stored rankings (seed1.json): "
                                   "its world, rebuilt from the record's config, gives oracle SumR ")
    assert str(e.value).endswith("leave oracle SumR out of --metrics, or re-run that run")
    # a record of a dataset that is not simulated: its ground truth is not rebuilt
    _, rec, ranking = _stored(runs, "msl", 0)
    real = {**rec, "config": {**rec["config"], "dataset": "tvr"}}
    scores, why = stats.oracle_query_scores(real, ranking, 100.0)
    assert scores is None and why.startswith("tvr is not a simulated world")


def test_the_leaderboards_oracle_delta_against_a_backbone_uses_the_stored_rankings(runs):
    rows = leaderboard.rebuild(runs, show=False)
    (comp,) = leaderboard.backbone_comparisons(rows)
    assert (comp["run"], comp["against"]) == ("ral@msl", "msl")
    oracle = comp["oracle_comparison"]
    assert oracle["test"] == leaderboard.RANDOMIZATION and oracle["why"] is None
    assert oracle["low"] <= oracle["delta"] <= oracle["high"]


def test_a_record_whose_config_no_longer_reads_is_a_reason_not_a_crash(runs):
    """The leaderboard reads every committed record: one whose config this version cannot read (a key of an
    older version) gets the fallback with the reason, and the rest of the table is made."""
    _, rec, ranking = _stored(runs, "msl", 0)
    old = {**rec, "config": {**rec["config"], "train": {**rec["config"]["train"], "no_such_key": 1}}}
    scores, why = stats.oracle_query_scores(old, ranking, rec["metrics"]["test"]["oracle"]["SumR"])
    assert scores is None and why.startswith("its world cannot be rebuilt (") and "no_such_key" in why
