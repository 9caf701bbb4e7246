"""Statistics from stored rankings (harness/reports/stats.py, `prvr-bench compare`): per-query
scores against the evaluator's figures, the two-level bootstrap against its exact distribution
on tiny data, the randomization test against a brute-force enumeration of every swap, Holm
against a hand-computed case, each bad input as one line, and the command end to end."""

import csv
import io
import itertools
import json
import math
import re

import numpy as np
import pytest

from prvr.datasets.real.relevance import SplitKeys
from prvr.harness.base.io import UserError
from prvr.harness.cli import main
from prvr.harness.engine.evaluate import metrics_from_ranks
from prvr.harness.engine.rankings import SplitRanking, rankings_path, save_rankings
from prvr.harness.engine.records import record_path, write_record
from prvr.harness.reports import stats

FAST = stats.Settings(resamples=2000, permutations=2000)


# ----------------------------------------------------------------------------- tiny runs on disk
def write_run(out, run, seed, ranks, dataset="sim-x", query_ids=None, generator=2, videos=150, sim=None, train=None):
    """A record and its stored test rankings whose labelled ranks are `ranks`."""
    q = len(ranks)
    keys = SplitKeys([f"v{i}" for i in range(videos)], query_ids or [f"q{i}" for i in range(q)],
                     [f"text {i}" for i in range(q)], np.arange(q) % videos)
    top = np.zeros((q, 100), dtype=np.int64)
    ranking = SplitRanking(top, np.tile(np.arange(1, 101), (q, 1)), np.asarray(ranks, dtype=np.int64),
                           np.full(q, np.nan), keys, 100)
    metrics = metrics_from_ranks({"labelled": ranking.labelled_rank}, ranking.moment_fraction)
    path = record_path(out, dataset, run, seed)
    write_record(path, {"method": re.split(r"[+@~]", run)[0], "dataset": dataset, "seed": seed, "run_name": run,
                        "config": {"data": {"scale": "default"}},
                        "provenance": {"data": {"generator_version": generator, **({"test": sim} if sim else {}),
                                                **({"train": train} if train else {})}},
                        "metrics": {"val": metrics, "test": metrics}})
    save_rankings(rankings_path(path), {"test": ranking}, {"run": run, "dataset": dataset, "seed": seed})
    return path


def random_ranks(q, seed):
    return np.random.default_rng(seed).integers(1, 151, size=q)


# ----------------------------------------------------------------------------- per-query scores
def test_per_query_scores_average_to_the_evaluators_figures():
    ranks = np.concatenate([random_ranks(97, 1), [1, 5, 6, 10, 11, 100, 101]])
    scores = stats.query_scores(ranks)
    figures = metrics_from_ranks({"labelled": ranks})
    for j, metric in enumerate(stats.METRICS):
        assert math.isclose(scores[:, j].mean(), figures[metric], rel_tol=1e-12), metric
    assert set(np.unique(scores[:, :4])) <= {0.0, 100.0}
    np.testing.assert_array_equal(scores[:, 4], scores[:, :4].sum(1))


def test_a_comparisons_difference_is_the_difference_of_the_records_means(tmp_path):
    for seed in (0, 1, 2):
        write_run(tmp_path, "a", seed, random_ranks(60, seed))
        write_run(tmp_path, "b", seed, random_ranks(60, 10 + seed))
    a, b = stats.load_row(tmp_path, "sim-x", "a"), stats.load_row(tmp_path, "sim-x", "b")
    c = stats.compare_rows(a, b, FAST)
    for j, d in enumerate(c.metrics):
        per_query = np.mean([(a.seeds[s].scores - b.seeds[s].scores)[:, j].mean() for s in (0, 1, 2)])
        assert math.isclose(d.difference, per_query, abs_tol=1e-9)
        assert d.mean_a == np.mean([a.seeds[s].figures[d.metric] for s in (0, 1, 2)])
        assert d.low <= d.difference <= d.high
    assert (c.seeds, c.queries, c.interval_over) == ((0, 1, 2), (60, 60, 60), stats.BOTH_LEVELS)
    assert stats.compare_rows(a, b, FAST) == c  # seeded: the same figures again


# ----------------------------------------------------------------------------- the bootstrap
def exact_bootstrap(diffs):
    """Every outcome of the two-level bootstrap with its probability: seeds drawn with replacement,
    then each drawn seed's queries with replacement (one level where there is one seed)."""
    n = len(diffs)
    seed_draws = itertools.product(range(n), repeat=n) if n > 1 else [(0,)]
    values, weights = [], []
    for drawn in seed_draws:
        per_position = [[np.mean(diffs[s][list(qs)]) for qs in itertools.product(range(len(diffs[s])),
                                                                                 repeat=len(diffs[s]))]
                        for s in drawn]
        for means in itertools.product(*per_position):
            values.append(np.mean(means))
            weights.append(np.prod([len(diffs[s]) ** -len(diffs[s]) for s in drawn]) / n ** n)
    return np.array(values), np.array(weights)


@pytest.mark.parametrize("diffs", [
    [np.array([3.0, -1.0]), np.array([0.0, 2.0, 5.0])],  # unequal query counts: the padded path
    [np.array([1.0, 4.0, -2.0]), np.array([0.0, 2.0, 2.0])],
    [np.array([1.0, 4.0, -2.0, 0.5])],  # one seed: queries only
])
def test_the_two_level_bootstrap_matches_its_exact_distribution(diffs):
    values, weights = exact_bootstrap(diffs)
    mean, std = np.sum(values * weights), math.sqrt(np.sum(weights * (values - np.sum(values * weights)) ** 2))
    drawn = stats.bootstrap_differences([d[:, None] for d in diffs], resamples=40_000, seed=3)[:, 0]
    assert abs(drawn.mean() - mean) < 0.02 * std + 1e-12
    assert abs(drawn.std() - std) < 0.02 * std
    for t in np.quantile(values, [0.1, 0.3, 0.5, 0.7, 0.9]):
        assert abs(np.mean(drawn <= t) - np.sum(weights[values <= t])) < 0.01


def test_the_bootstrap_is_seeded_and_resamples_every_metric_with_the_same_queries():
    diffs = [np.random.default_rng(s).normal(size=(40, 3)) for s in range(3)]
    diffs = [np.column_stack([d[:, 0], 2 * d[:, 0], d[:, 2]]) for d in diffs]
    one = stats.bootstrap_differences(diffs, resamples=500, seed=7)
    np.testing.assert_array_equal(one, stats.bootstrap_differences(diffs, resamples=500, seed=7))
    np.testing.assert_allclose(one[:, 1], 2 * one[:, 0], rtol=1e-12)  # paired: the same draws for each metric
    assert not np.array_equal(one, stats.bootstrap_differences(diffs, resamples=500, seed=8))


# ----------------------------------------------------------------------------- the randomization test
def brute_force_p(a, b):
    """Two-sided p over every assignment of each (seed, query) pair's two scores: the statistic is
    the mean over seeds of the mean over queries of A - B."""
    d = [x - y for x, y in zip(a, b)]
    w = np.concatenate([np.full(len(x), 1 / (len(d) * len(x))) for x in d])
    flat = np.concatenate(d)
    observed = flat @ w
    null = np.array([(flat * signs) @ w for signs in itertools.product((1, -1), repeat=len(flat))])
    return np.mean(np.abs(null) >= abs(observed) - 1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_randomization_test_matches_a_brute_force_enumeration(seed):
    rng = np.random.default_rng(seed)
    a = [rng.integers(0, 2, 4) * 100.0, rng.integers(0, 2, 5) * 100.0]
    b = [rng.integers(0, 2, 4) * 100.0, rng.integers(0, 2, 5) * 100.0]
    b[0][0] = a[0][0]  # an equal pair: left out by the test, counted by the enumeration
    # 2^(pairs that differ) <= permutations: scipy enumerates every swap (exact)
    assert math.isclose(stats.randomization_p(a, b, permutations=1024, seed=0), brute_force_p(a, b), rel_tol=1e-9)


def scipy_p(a, b, permutations, seed):
    """The reference: scipy.stats.permutation_test itself, as stats.randomization_p stood before it
    computed the same null as one matrix product per batch."""
    from scipy.stats import permutation_test
    w = np.concatenate([np.full(len(x), 1.0 / (len(a) * len(x))) for x in a])
    x, y = np.concatenate(a), np.concatenate(b)
    differ = x != y
    x, y, w = x[differ], y[differ], w[differ]
    result = permutation_test((x, y), lambda x, y, axis: np.moveaxis(x - y, axis, -1) @ w,
                              permutation_type="samples", vectorized=True, n_resamples=permutations,
                              batch=stats.PERMUTATION_BATCH, alternative="two-sided", rng=np.random.default_rng(seed))
    return float(result.pvalue)


@pytest.mark.parametrize("queries, permutations, seed, shift", [
    ((300, 280), 2000, 0, 0.0),     # drawn, two batches; no true difference
    ((300, 280), 2000, 3, 0.08),    # a small true difference: p near the usual thresholds
    ((120,), 2500, 1, 0.0),         # one seed; a last batch of 500
    ((40, 40, 40), 999, 5, 0.2),    # fewer permutations than a batch
    ((5, 4), 1024, 2, 0.0),         # 2^9 <= 1024: every swap, exact
])
def test_the_randomization_p_is_scipys_permutation_test_p_for_p(queries, permutations, seed, shift):
    rng = np.random.default_rng(seed)
    a = [rng.integers(0, 5, q) * 100.0 + rng.normal(0, 1, q).round() for q in queries]  # ties, as SumR has
    b = [x - shift * 100 * rng.integers(0, 2, len(x)) + rng.normal(0, 1, len(x)).round() for x in a]
    b[0][:3] = a[0][:3]  # equal pairs: left out on both sides
    ours = stats.randomization_p(a, b, permutations=permutations, seed=seed)
    assert ours == scipy_p(a, b, permutations, seed)
    assert 0 < ours <= 1


@pytest.mark.parametrize("batch, pairs", [(1000, 37), (3, 5), (1, 1), (7, 501)])
def test_the_swaps_are_numpys_permuted_pairs_draw_for_draw(batch, pairs):
    """`_swaps` draws the generator's words directly; `rng.permuted` of the (0, 1) tile, as scipy
    calls it, is the naive reference: the same swaps over consecutive batches (odd word counts
    included, where the generator keeps half of a 64-bit draw for the next call)."""
    tile = np.tile(np.arange(2), (batch, pairs, 1))
    for seed in (0, 7):
        naive, fast = np.random.default_rng(seed), np.random.default_rng(seed)
        for _ in range(3):
            np.testing.assert_array_equal(stats._swaps(fast, batch, pairs), naive.permuted(tile, axis=-1)[:, :, 0] == 1)


def test_identical_rows_differ_by_0_with_p_1_and_a_row_better_on_every_query_has_an_interval_above_0(tmp_path):
    for seed in (0, 1):
        ranks = random_ranks(50, seed)
        write_run(tmp_path, "same", seed, ranks)
        write_run(tmp_path, "twin", seed, ranks)
        write_run(tmp_path, "best", seed, np.ones(50, dtype=int))
        write_run(tmp_path, "worst", seed, np.full(50, 140))
    row = {r: stats.load_row(tmp_path, "sim-x", r) for r in ("same", "twin", "best", "worst")}
    for d in stats.compare_rows(row["same"], row["twin"], FAST).metrics:
        assert (d.difference, d.low, d.high, d.p) == (0.0, 0.0, 0.0, 1.0)
    better = stats.compare_rows(row["best"], row["worst"], FAST)
    for d in better.metrics:
        assert d.difference == 100.0 * (4 if d.metric == "SumR" else 1) and d.low > 0 and d.p < 0.01
    worse = stats.compare_rows(row["worst"], row["best"], FAST)
    assert all(d.high < 0 for d in worse.metrics)


# ----------------------------------------------------------------------------- Holm
def test_holm_matches_a_hand_computed_case():
    # sorted: 0.005 (x4) = 0.02, 0.01 (x3) = 0.03, 0.03 (x2) = 0.06, 0.04 (x1) = 0.04 -> 0.06 (kept non-decreasing)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert stats.holm([0.02, 0.02, 0.5]) == pytest.approx([0.06, 0.06, 0.5])  # ties
    assert stats.holm([0.2]) == [0.2] and stats.holm([]) == []


def test_a_tables_holm_p_runs_over_every_p_it_reports(tmp_path):
    for seed in (0, 1):
        for run, s in (("a", 0), ("b", 10), ("c", 20)):
            write_run(tmp_path, run, seed, random_ranks(40, s + seed))
    table = stats.compare_table(tmp_path, "sim-x", [("a", "b"), ("c", "b")], FAST)
    ps = [d.p for c in table.comparisons for d in c.metrics]
    assert len(ps) == 10 and [d.p_holm for c in table.comparisons for d in c.metrics] == stats.holm(ps)


# ----------------------------------------------------------------------------- bad input, one line each
def two_seeds(out, run, dataset="sim-x", generator=2, query_ids=None, seeds=(0, 1)):
    for seed in seeds:
        write_run(out, run, seed, random_ranks(30, seed), dataset=dataset, generator=generator, query_ids=query_ids)


def test_rows_of_different_datasets_or_worlds_are_refused(tmp_path):
    two_seeds(tmp_path, "a")
    two_seeds(tmp_path, "a", dataset="sim-y")
    two_seeds(tmp_path, "b", generator=3)
    a = stats.load_row(tmp_path, "sim-x", "a")
    with pytest.raises(UserError, match=r"^rows 'a' \(sim-x.*\) and 'a' \(sim-y.*different datasets or worlds"):
        stats.compare_rows(a, stats.load_row(tmp_path, "sim-y", "a"), FAST)
    with pytest.raises(UserError, match=r"generator version 2.*generator version 3.*compare rows of one dataset and "
                                        r"world$"):
        stats.compare_rows(a, stats.load_row(tmp_path, "sim-x", "b"), FAST)
    write_run(tmp_path, "b", 2, random_ranks(30, 2), generator=2)
    with pytest.raises(UserError, match=r"row 'b' mixes worlds: .*seed0.json is sim-x, generator version 3, scale "
                                        r"default, .*seed2.json is sim-x, generator version 2"):
        stats.load_row(tmp_path, "sim-x", "b")


def test_rows_of_one_dataset_name_with_other_world_knobs_are_refused(tmp_path):
    """A sweep's runs share the dataset's name but not its world (`--set sim.repeat_prob=0.6`): their test
    facts differ (the multi-relevant share here)."""
    for seed in (0, 1):
        write_run(tmp_path, "a", seed, random_ranks(30, seed), sim={"multi_relevant_share": 0.108})
        write_run(tmp_path, "a~rp", seed, random_ranks(30, seed), sim={"multi_relevant_share": 0.197})
        write_run(tmp_path, "b", seed, random_ranks(30, seed + 5), sim={"multi_relevant_share": 0.108})
    a = stats.load_row(tmp_path, "sim-x", "a")
    with pytest.raises(UserError, match=r"test facts [0-9a-f]{8}\).*test facts [0-9a-f]{8}\).*different datasets"):
        stats.compare_rows(a, stats.load_row(tmp_path, "sim-x", "a~rp"), FAST)
    assert stats.compare_rows(a, stats.load_row(tmp_path, "sim-x", "b"), FAST).seeds == (0, 1)


def test_rankings_with_other_query_ids_are_refused(tmp_path):
    two_seeds(tmp_path, "a")
    two_seeds(tmp_path, "b", query_ids=[f"q{i}" for i in range(29)] + ["other"])
    with pytest.raises(UserError, match=r"rows 'a' and 'b' seed 0: the test query ids of their stored rankings "
                                        r"differ \(30 vs 30 queries; 'q29' vs 'other' at query 29"):
        stats.compare_table(tmp_path, "sim-x", [("a", "b")], FAST)


def test_fewer_than_two_shared_seeds_is_refused_unless_a_queries_only_interval_is_asked_for(tmp_path):
    two_seeds(tmp_path, "a", seeds=(0, 1))
    two_seeds(tmp_path, "b", seeds=(1, 2))
    two_seeds(tmp_path, "c", seeds=(5,))
    with pytest.raises(UserError, match=r"share 1 seed\(s\) \(1; a has 0 1, b has 1 2\): the bootstrap's seed level "
                                        r"needs at least 2; .*--min-seeds 1"):
        stats.compare_table(tmp_path, "sim-x", [("a", "b")], FAST)
    one = stats.compare_table(tmp_path, "sim-x", [("a", "b")], stats.Settings(500, 500, min_seeds=1))
    assert one.comparisons[0].interval_over == stats.QUERIES_ONLY and one.comparisons[0].seeds == (1,)
    with pytest.raises(UserError, match=r"share 0 seed\(s\) \(none"):
        stats.compare_table(tmp_path, "sim-x", [("a", "c")], stats.Settings(500, 500, min_seeds=1))


def test_a_record_without_stored_rankings_or_with_another_runs_is_refused(tmp_path):
    two_seeds(tmp_path, "a")
    rankings_path(record_path(tmp_path, "sim-x", "a", 1)).unlink()
    with pytest.raises(UserError, match=r"seed1.json has no stored rankings \(seed1.rank.npz: runs made before "
                                        r"rankings were stored have none\); re-run that run"):
        stats.load_row(tmp_path, "sim-x", "a")
    two_seeds(tmp_path, "b")
    (record_path(tmp_path, "sim-x", "b", 0).with_name("seed0.rank.npz")).write_bytes(
        rankings_path(record_path(tmp_path, "sim-x", "b", 1)).read_bytes())  # seed 1's rankings under seed 0
    with pytest.raises(UserError, match=r"are of seed 1, but run record .*seed0.json is of 0: the rankings do not "
                                        r"belong to the record"):
        stats.load_row(tmp_path, "sim-x", "b")
    write_run(tmp_path, "c", 0, random_ranks(30, 0))
    write_run(tmp_path / "elsewhere", "c", 0, random_ranks(30, 5))
    rankings_path(record_path(tmp_path, "sim-x", "c", 0)).write_bytes(
        rankings_path(record_path(tmp_path / "elsewhere", "sim-x", "c", 0)).read_bytes())
    with pytest.raises(UserError, match=r"give test \S+ [\d.]+, but run record .* says .*: the rankings do not belong"):
        stats.load_row(tmp_path, "sim-x", "c")
    with pytest.raises(UserError, match=r"row 'nothing': no run records under"):
        stats.load_row(tmp_path, "sim-x", "nothing")


# ----------------------------------------------------------------------------- the command
def test_the_compare_command_prints_and_writes_the_table(tmp_path, capsys):
    for seed in (0, 1):
        write_run(tmp_path, "a@x", seed, random_ranks(40, seed))
        write_run(tmp_path, "b", seed, random_ranks(40, 9 + seed))
    argv = ["compare", "--dataset", "sim-x", "--rows", "a@x:b", "--out", str(tmp_path), "--resamples", "300",
            "--permutations", "300", "--metrics", "R@1", "SumR"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    md = (tmp_path / "compare" / "sim-x.md").read_text()
    assert printed == md
    assert "| a@x | b | SumR |" in md and "| 0 1 | 40 | seeds and queries |" in md
    assert "paired randomization test" in md and "two-level paired bootstrap" in md and "Holm" in md
    assert "--metrics R@1 SumR --resamples 300 --permutations 300`" in md
    rows = list(csv.DictReader((tmp_path / "compare" / "sim-x.csv").open(newline="")))
    assert [(r["row_a"], r["row_b"], r["metric"]) for r in rows] == [("a@x", "b", "R@1"), ("a@x", "b", "SumR")]
    table = stats.compare_table(tmp_path, "sim-x", [("a@x", "b")], stats.Settings(300, 300, metrics=("R@1", "SumR")))
    assert float(rows[1]["difference"]) == pytest.approx(table.comparisons[0].metrics[1].difference, rel=1e-5)
    assert float(rows[1]["p_holm"]) == pytest.approx(table.comparisons[0].metrics[1].p_holm, rel=1e-5)


@pytest.mark.parametrize("argv, says", [
    (["--rows", "a-b"], "--rows 'a-b' is not a pair A:B of run names"),
    (["--rows", "a:b:c"], "is not a pair A:B"),
    (["--rows", "a:../b"], "row '../b' starts with '.'"),
    (["--rows", "a:b", "--metrics", "R@3"], "--metrics R@3: pick from R@1 R@5 R@10 R@100 SumR"),
    (["--rows", "a:b", "--resamples", "0"], "the counts must be at least 1"),
])
def test_bad_command_lines_are_one_line(tmp_path, capsys, argv, says):
    assert main(["compare", "--dataset", "sim-x", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_cells_from_input_are_escaped_for_markdown_and_neutralised_for_spreadsheets():
    assert stats.markdown_cell("a|b\nc\\") == "a\\|b c\\\\"
    for text, safe in (("=1+2", "'=1+2"), ("+x", "'+x"), ("-x", "'-x"), ("@x", "'@x"), ("-1.5", "-1.5"),
                       ("+2.5e-05", "+2.5e-05"), ("a=b", "a=b")):
        assert stats.spreadsheet_safe(text) == safe
    d = stats.MetricDifference("SumR", 1.0, 2.0, -1.0, -2.0, 0.5, 0.3, 0.6)
    c = stats.Comparison("sim-x", "=cmd|x", "@b\nc", (0, 1), (10, 10), stats.BOTH_LEVELS, (d,))
    table = stats.CompareTable("sim-x", (c,), stats.Settings())
    row = next(csv.DictReader(io.StringIO(stats.to_csv(table), newline="")))
    assert (row["row_a"], row["row_b"], row["difference"]) == ("'=cmd|x", "'@b\nc", "-1")
    md = stats.to_markdown(table, "cmd")
    assert "| =cmd\\|x | @b c | SumR |" in md


@pytest.mark.slow
def test_until_resolved_adds_seeds_to_an_unresolved_pair_up_to_the_cap(tmp_path, capsys):
    """The adaptive rule on sim-tiny (one epoch a run): seeds 0 and 1 of the baseline and of it with the
    oracle, then `compare --until-resolved --cap 3`: every pair ends resolved or at the cap, each added
    seed an ordinary run of the row's own command."""
    from prvr.harness.cli import main

    for seed in (0, 1):
        for extra in ([], ["--set", "relations.name=oracle"]):
            assert main(["run", "--method", "baseline", "--dataset", "sim-tiny", "--seed", str(seed), "--out",
                         str(tmp_path), "--set", "train.epochs=1", "--quiet", *extra]) == 0
    argv = ["compare", "--dataset", "sim-tiny", "--rows", "baseline+oracle:baseline", "--out", str(tmp_path),
            "--metrics", "SumR", "--resamples", "500", "--permutations", "500", "--until-resolved", "--cap", "3"]
    assert main(argv) == 0
    md = (tmp_path / "compare" / "sim-tiny.md").read_text()
    (line,) = [ln for ln in md.splitlines() if ln.startswith("- baseline+oracle - baseline: ")]
    seeds = int(line.split(": ")[1].split()[0])
    assert seeds in (2, 3) and ("excludes 0" in line) == (seeds == 2 or "excludes 0" in line)
    if "cap stopped it" in line:
        assert seeds == 3
        assert (tmp_path / "runs" / "sim-tiny" / "baseline+oracle" / "seed2.json").is_file()
    assert "--until-resolved --cap 3" in md


def test_a_seed_cap_below_two_is_one_line(tmp_path, capsys):
    two_seeds(tmp_path, "a")
    two_seeds(tmp_path, "b")
    from prvr.harness.cli import main

    assert main(["compare", "--dataset", "sim-x", "--rows", "a:b", "--out", str(tmp_path), "--until-resolved",
                 "--cap", "0"]) == 2
    assert "--cap 0: the rule compares over at least 2 seeds" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the oracle's room
def test_the_share_of_the_oracles_room_a_method_closes(tmp_path):
    """gain / room with the ratio's bootstrap interval: exact where every query moves alike (each query's
    SumR 0 at the base, 200 with the method, 400 with the oracle: half the room), around its estimate on
    random ranks, and none where the room's interval is not above zero."""
    q = 60
    for seed in (0, 1):
        write_run(tmp_path, "b", seed, np.full(q, 150))
        write_run(tmp_path, "b+oracle", seed, np.ones(q, dtype=int))
        write_run(tmp_path, "m", seed, np.full(q, 6))  # R@10 and R@100: 200 of 400
        write_run(tmp_path, "r", seed, random_ranks(q, seed + 10))
        write_run(tmp_path, "r+oracle", seed, np.minimum(random_ranks(q, seed + 10), random_ranks(q, seed + 20)))
        write_run(tmp_path, "r2", seed, random_ranks(q, seed + 30))
    row = {r: stats.load_row(tmp_path, "sim-x", r) for r in ("b", "b+oracle", "m", "r", "r+oracle", "r2")}
    half = stats.room_share(row["m"], row["b"], row["b+oracle"], FAST)
    assert (half.share, half.low, half.high, half.seeds) == (0.5, 0.5, 0.5, (0, 1)) and half.room_low == 400
    noisy = stats.room_share(row["r2"], row["r"], row["r+oracle"], FAST)
    assert noisy.room_low > 0 and noisy.low <= noisy.share <= noisy.high
    none = stats.room_share(row["m"], row["b"], row["b"], FAST)  # the base as its own oracle: no room
    assert none.room_low == 0 and math.isnan(none.share) and math.isnan(none.low)


# ----------------------------------------------------------------------------- the leaderboard's Δ
def test_a_leaderboard_delta_cell_carries_compare_rows_interval_and_p(tmp_path):
    """The leaderboard's Δ SumR of two rows with stored rankings is `compare_rows`'s under the
    leaderboard's settings, Holm-corrected over the leaderboard's p-values; a row sharing one seed with
    the baseline falls back, marked, to no test."""
    from prvr.harness.reports import leaderboard

    def run(name, seed, ranks):  # with the budget of sim-x's protocol (the dataclass's), so the row gets a Δ
        path = write_run(tmp_path, name, seed, ranks)
        record = json.loads(path.read_text())
        write_record(path, {**record, "config": {**record["config"], "train": {"epochs": 12, "patience": 5}}})

    for seed in (0, 1, 2):
        run("baseline", seed, random_ranks(40, seed))
        run("arl", seed, np.maximum(1, random_ranks(40, 10 + seed) // 3))
    run("arl~one", 0, random_ranks(40, 20))  # one seed: no interval, no test
    rows = {r["run"]: r for r in leaderboard.rebuild(tmp_path, show=False)}
    want = stats.compare_rows(stats.load_row(tmp_path, "sim-x", "arl"), stats.load_row(tmp_path, "sim-x", "baseline"),
                              leaderboard.SETTINGS)
    (d,) = want.metrics
    got = rows["arl"]["comparison"]
    assert (got["test"], got["delta"], got["low"], got["high"], got["p"]) == \
        (leaderboard.RANDOMIZATION, d.difference, d.low, d.high, d.p)
    assert got["p_holm"] == d.p  # the leaderboard's only p
    assert d.low < d.difference < d.high
    one = rows["arl~one"]["comparison"]
    assert (one["test"], one["low"], one["p"], one["why"]) == (None, None, None, leaderboard.FEW_SEEDS)
    md = (tmp_path / "leaderboard.md").read_text()
    cell = f"| {d.difference:+.1f} [{d.low:+.1f}, {d.high:+.1f}] (p={stats.fmt_p(d.p)}, Holm {stats.fmt_p(d.p)})"
    assert cell in md and "paired randomization test" in md and "Holm's step-down" in md
    assert "(no test) |" in md and "fewer than 2 shared seeds: sim-x arl~one vs baseline" in md
    csv_rows = {r["run"]: r for r in csv.DictReader(io.StringIO((tmp_path / "leaderboard.csv").read_text()))}
    assert (csv_rows["arl"]["low"], csv_rows["arl"]["test"]) == (f"{d.low:.3f}", "randomization")


def test_the_seed_level_fallback_gives_its_tests_interval():
    """rows.seed_interval: the paired t-test's interval over shared seeds (the difference then over them), Welch's
    where fewer than two are shared, the point where the paired differences are equal, nothing with one seed."""
    import scipy.stats

    from prvr.harness.reports.rows import seed_interval

    a, b = {0: 250.0, 1: 253.0, 2: 249.0, 3: 260.0}, {0: 240.0, 1: 241.0, 2: 238.0}
    delta, low, high, p = seed_interval(a, b)
    ci = scipy.stats.ttest_rel([250, 253, 249], [240, 241, 238]).confidence_interval(0.95)
    assert delta == pytest.approx(11.0) and (low, high) == pytest.approx((ci.low, ci.high))
    assert p == pytest.approx(scipy.stats.ttest_rel([250, 253, 249], [240, 241, 238]).pvalue)
    delta, low, high, p = seed_interval({0: 1.0, 1: 2.0}, {2: 0.0, 3: 0.5})
    welch = scipy.stats.ttest_ind([1.0, 2.0], [0.0, 0.5], equal_var=False)
    assert delta == pytest.approx(1.25) and (low, high) == pytest.approx(tuple(welch.confidence_interval(0.95)))
    assert p == pytest.approx(welch.pvalue)
    assert seed_interval({0: 3.0, 1: 4.0}, {0: 1.0, 1: 2.0}) == (2.0, 2.0, 2.0, 0.0)
    assert seed_interval({0: 3.0}, {1: 1.0}) == (2.0, None, None, None)
