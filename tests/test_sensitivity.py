"""`prvr-bench sensitivity` (harness/cli/sensitivity.py, harness/reports/sensitivity.py): each gain at the
world's preset and with one other knob moved at a time, with its interval, beside the papers' gains."""

import csv

import numpy as np
import pytest
from test_stats import FAST, write_run

from prvr.harness.cli import main
from prvr.harness.reports import sensitivity, stats
from prvr.harness.reports.stats import MetricDifference
from prvr.harness.reports.sweeps import Sweep, sumr_of

TINY = ["--dataset", "sim-tiny", "--set", "train.epochs=1", "--quiet"]


@pytest.mark.parametrize("pair, gain", [(("ral@msl", "msl"), 6.7), (("ral@gmmformer", "gmmformer"), 9.5),
                                        (("ral", "gmmformer2"), 9.7), (("arl", "gmmformer"), 9.3)])
def test_the_papers_gains_are_differences_within_one_table(pair, gain):
    """The four gains the issue holds the worlds against, from methods/reported.yaml's real-TVR rows."""
    found = sensitivity.paper_gain(*pair, "tvr")
    assert found is not None and found.value == pytest.approx(gain, abs=1e-9)
    assert found.features == "ResNet+I3D+RoBERTa" and "Table 1" in found.source
    assert sensitivity.paper_gain("arl", "baseline", "tvr") is None  # no paper has both


@pytest.mark.parametrize("difference, low, high, paper, preset, change_interval, reads", [
    (6.0, 2.0, 9.0, 6.7, 22.0, (-20.0, -12.0), " ="), (15.0, 12.0, 18.0, 6.7, 22.0, (-11.0, -3.0), " ->"),
    (30.0, 25.0, 35.0, 6.7, 22.0, (2.0, 14.0), " <-"),
    # a gain whose change from the preset's is not told from none moved neither toward the paper's nor away
    (15.0, 12.0, 18.0, 6.7, 22.0, (-15.0, 1.0), ""), (30.0, 25.0, 35.0, 6.7, 22.0, (-1.0, 17.0), "")])
def test_a_gain_reads_against_the_papers(difference, low, high, paper, preset, change_interval, reads):
    d = MetricDifference("SumR", 0, 0, difference, low, high, 0.01)
    base = MetricDifference("SumR", 0, 0, preset, preset - 3, preset + 3, 0.01)
    change = sensitivity.Change(stats.GainChange(preset, difference, difference - preset, *change_interval, (0, 1),
                                                 0.001), 0.001)
    assert sensitivity._reads(d, sensitivity.PaperGain(paper, "RAL Table 1", "f"), base, change) == reads
    assert sensitivity._reads(d, sensitivity.PaperGain(paper, "RAL Table 1", "f"), base, None) == reads.replace(
        " ->", "").replace(" <-", "")  # no change made (the preset's rows missing): no arrow


def test_the_table_from_records_one_knob_at_a_time(tmp_path):
    q = 40
    for seed in (0, 1):
        for run, shift in (("a", 0), ("b", 30), ("a~token_noise1", 0), ("b~token_noise1", 0)):
            write_run(tmp_path, run, seed, np.clip(np.arange(1, q + 1) + shift, 1, 150))
    sweep = Sweep("sim-x", ("sim.token_noise",), ((0.5,), (1.0,)), (0.5,), ("a", "b"), (0, 1), "cmd")
    md, text = sensitivity.table("sim-x", "x", [sweep], [("a", "b")], tmp_path, "prvr-bench sensitivity ...", FAST)
    assert "| preset | 0.5 |" in md and "| sim.token_noise | 1 |" in md and "(no paper row)" in md
    rows = list(csv.DictReader(text.splitlines()))
    assert [r["knob"] for r in rows] == ["preset", "sim.token_noise"]
    assert float(rows[0]["gain"]) > 0 and float(rows[1]["gain"]) == 0.0  # the knob took the gain away
    assert float(rows[0]["low"]) <= float(rows[0]["gain"]) <= float(rows[0]["high"])
    # how far the gain moved from the preset's: blank at the preset, the difference of the gains at the knob
    assert rows[0]["change_from_preset"] == rows[0]["change_low"] == ""
    assert float(rows[1]["change_from_preset"]) == pytest.approx(-float(rows[0]["gain"]))
    assert float(rows[1]["change_low"]) <= float(rows[1]["change_from_preset"]) <= float(rows[1]["change_high"]) < 0
    moved = md.split("## How far each gain moved from the preset's")[1]
    assert "| sim.token_noise | 1 |  | -" in moved and " shrank |" in moved and ", p " in moved and ", Holm " in moved
    assert float(rows[1]["change_p"]) < 0.05 and rows[1]["change_holm_p"] == rows[1]["change_p"]  # one change: itself
    assert "- `a - b`: depends on the knob at sim.token_noise=1 (-" in moved and "the label noise held." in moved


def test_a_gain_change_between_worlds_draws_the_two_gains_apart(tmp_path):
    """`gain_change_apart`: the gains' difference, its interval the percentile interval of the difference of
    the two gains' own bootstraps, drawn from two seeds (from one, two worlds' splits of one size would
    resample the same positions: the same rows in both places would then give an interval of width 0)."""
    rng = np.random.default_rng(3)
    for seed in (0, 1, 2):
        for run in ("a", "b", "a~x", "b~x"):
            write_run(tmp_path, run, seed, rng.integers(1, 120, size=60))
    a, b, ax, bx = (stats.load_row(tmp_path, "sim-x", r) for r in ("a", "b", "a~x", "b~x"))
    g = stats.gain_change_apart(ax, bx, a, b, FAST)
    here, there = (sumr_of(stats.compare_rows(x, y, FAST)) for x, y in ((ax, bx), (a, b)))
    assert (g.after, g.before, g.seeds) == (pytest.approx(here.difference), pytest.approx(there.difference), (0, 1, 2))
    assert g.change == pytest.approx(here.difference - there.difference)
    scores = [[r.seeds[s].scores[:, [stats.ALL_METRICS.index("SumR")]] for s in (0, 1, 2)] for r in (ax, bx, a, b)]
    reference = (stats.bootstrap_differences([x - y for x, y in zip(scores[0], scores[1])], FAST.resamples, FAST.seed)
                 - stats.bootstrap_differences([x - y for x, y in zip(scores[2], scores[3])], FAST.resamples,
                                               FAST.seed + 1))[:, 0]
    assert (g.low, g.high) == tuple(pytest.approx(v) for v in np.quantile(reference, [0.025, 0.975]))
    same = stats.gain_change_apart(a, b, a, b, FAST)
    assert same.change == 0 and same.low < 0 < same.high  # the same gain twice: no change, and an interval


def test_a_knob_that_moves_the_label_noise_is_said(tmp_path):
    """Each setting shows the label noise its records state (the test multi-relevant share); a knob that
    moves it off the preset's is marked in its cell and named under the table (compound queries halve
    sim-tvr-v2's multi-relevant share), one that does not is not."""
    q = 40
    for seed in (0, 1):
        for run, shift, share in (("a", 0, 0.108), ("b", 30, 0.108), ("a~token_noise1", 0, 0.108),
                                  ("b~token_noise1", 0, 0.108), ("a~compound_prob0.8", 0, 0.0576),
                                  ("b~compound_prob0.8", 0, 0.0576)):
            write_run(tmp_path, run, seed, np.clip(np.arange(1, q + 1) + shift, 1, 150),
                      sim={"multi_relevant_share": share})
    sweeps = [Sweep("sim-x", ("sim.token_noise",), ((0.5,), (1.0,)), (0.5,), ("a", "b"), (0, 1), "cmd"),
              Sweep("sim-x", ("sim.compound_prob",), ((0.5,), (0.8,)), (0.5,), ("a", "b"), (0, 1), "cmd")]
    md, text = sensitivity.table("sim-x", "x", sweeps, [("a", "b")], tmp_path, "cmd", FAST)
    lines = md.splitlines()
    assert next(r for r in lines if r.startswith("| preset |")).startswith("| preset | 0.5 | 10.8% |")
    assert next(r for r in lines if r.startswith("| sim.token_noise |")).startswith("| sim.token_noise | 1 | 10.8% |")
    assert next(r for r in lines if r.startswith("| sim.compound_prob |")).startswith(
        "| sim.compound_prob | 0.8 | 5.8% (preset 10.8%) |")
    assert ("The label noise moved with the knob at 1 setting(s): sim.compound_prob=0.8: 5.8% (preset 10.8%). "
            "Their gains are not at the preset's noise") in md
    assert [r["multi_relevant_share"] for r in csv.DictReader(text.splitlines())] == ["0.108", "0.108", "0.0576"]
    # a gain that moved where the knob moved the noise too is not said to depend on the knob alone
    reading = next(r for r in lines if r.startswith("- `a - b`:"))
    assert "depends on the knob at sim.token_noise=1 (" in reading
    assert "moved at sim.compound_prob=0.8 (" in reading and "where the label noise moved too" in reading


def test_a_setting_not_made_is_open_not_a_no(tmp_path):
    """Cells without records read `not made`, their row's last column how many are open (not `no`, which
    only a made gain outside its paper's says), and a line below counts them and says how to make them."""
    q = 40
    for seed in (0, 1):
        for run, shift in (("a", 0), ("b", 30), ("a~token_noise1", 0)):  # b at token_noise 1 never made
            write_run(tmp_path, run, seed, np.clip(np.arange(1, q + 1) + shift, 1, 150))
    sweep = Sweep("sim-x", ("sim.token_noise",), ((0.5,), (1.0,), (2.0,)), (0.5,), ("a", "b"), (0, 1), "cmd")
    md, text = sensitivity.table("sim-x", "x", [sweep], [("a", "b"), ("b", "a")], tmp_path, "cmd", FAST)
    lines = md.splitlines()
    # no paper reports these gains: shown, never judged in the last column
    assert next(r for r in lines if r.startswith("| preset |")).endswith("| (no paper's gain) |")
    assert next(r for r in lines if r.startswith("| sim.token_noise | 1 |")).endswith(
        "| not made | not made | (no paper's gain) |")
    assert "4 of 6 cells are not made; 4 of them for want of their runs' records" in md
    assert [r["knob"] for r in csv.DictReader(text.splitlines())] == ["preset", "preset"]  # only made gains
    assert sensitivity._holds([True], 2) == "open: 1 of 2 not made" and sensitivity._holds([True, False], 3) == "no"
    assert sensitivity._holds([True, True], 2) == "yes"


def test_a_gain_no_paper_reports_is_shown_and_not_judged(tmp_path):
    """Beside a gain a paper reports (RAL on MS-SL, +6.7 on TVR), a gain none reports (ARL over its own
    encoder, `arl:arl~base`) has its cells and CSV rows, and leaves each row's verdict as the paper's gain
    alone gives it: `no` where that one misses its paper's, open where it is not made."""
    q = 40
    for seed in (0, 1):
        for run, shift in (("ral@msl", 0), ("msl", 40), ("arl", 0), ("arl~base", 5), ("arl~token_noise1", 0),
                           ("arl~base~token_noise1", 5)):
            write_run(tmp_path, run, seed, np.clip(np.arange(1, q + 1) + shift, 1, 150))
    sweep = Sweep("sim-x", ("sim.token_noise",), ((0.5,), (1.0,)), (0.5,), ("ral@msl", "msl", "arl", "arl~base"),
                  (0, 1), "cmd")
    alone, _ = sensitivity.table("sim-x", "tvr", [sweep], [("ral@msl", "msl")], tmp_path, "cmd", FAST)
    both, text = sensitivity.table("sim-x", "tvr", [sweep], [("ral@msl", "msl"), ("arl", "arl~base")], tmp_path,
                                   "cmd", FAST)
    for md in (alone, both):
        lines = md.splitlines()
        assert next(r for r in lines if r.startswith("| preset |")).endswith("| no |")  # far above +6.7
        assert next(r for r in lines if r.startswith("| sim.token_noise | 1 |")).endswith("| open: 1 of 1 not made |")
    assert "| arl - arl~base |" in both and "(no paper row)" in both
    rows = [(r["knob"], r["a"], r["b"], r["paper_gain"]) for r in csv.DictReader(text.splitlines())]
    assert rows == [("preset", "ral@msl", "msl", "6.7"), ("preset", "arl", "arl~base", ""),
                    ("sim.token_noise", "arl", "arl~base", "")]


def test_a_cell_made_over_fewer_seeds_than_asked_says_so(tmp_path):
    """A cell whose runs are made at some of the asked seeds (a cell half made when a session stopped) shows
    its gain over those, says how many in the cell and in a line under the table, and the CSV names them."""
    q = 40
    for seed in (0, 1, 2):
        for run, shift in (("a", 0), ("b", 30)):
            write_run(tmp_path, run, seed, np.clip(np.arange(1, q + 1) + shift, 1, 150))
    for seed in (0, 1):  # seed 2 of the moved setting not made yet
        for run, shift in (("a~token_noise1", 0), ("b~token_noise1", 10)):
            write_run(tmp_path, run, seed, np.clip(np.arange(1, q + 1) + shift, 1, 150))
    sweep = Sweep("sim-x", ("sim.token_noise",), ((0.5,), (1.0,)), (0.5,), ("a", "b"), (0, 1, 2), "cmd")
    md, text = sensitivity.table("sim-x", "x", [sweep], [("a", "b")], tmp_path, "cmd", FAST)
    lines = md.splitlines()
    assert "seeds)" not in next(r for r in lines if r.startswith("| preset |"))
    assert "] (2 of 3 seeds) |" in next(r for r in lines if r.startswith("| sim.token_noise | 1 |"))
    assert "Made over fewer seeds than the 3 asked, so far: a - b at sim.token_noise=1 (2 of 3 seeds)." in md
    assert [r["seeds"] for r in csv.DictReader(text.splitlines())] == ["0 1 2", "0 1"]


@pytest.mark.parametrize("argv, says", [
    (["--gains", "msl:baseline", "--vary", "sim.token_noise"], "give KEY=V1,V2"),
    (["--gains", "msl:baseline", "--vary", "sim.token_noise=1", "sim.token_noise=2"], "a knob given twice"),
    (["--gains", "baseline+oracle:baseline", "--vary", "sim.token_noise=1"], "names a detector"),
    (["--gains", "arl:arl~nosuch", "--vary", "sim.token_noise=1"], "--gains arl~nosuch: arl has no ablation row"),
    (["--gains", "msl", "--vary", "sim.token_noise=1"], "is not a pair A:B"),
    (["--gains", "msl:baseline", "--vary", "sim.no_such=1"], "no_such"),
    (["--gains", "msl:baseline", "--vary", "sim.filler_rate=2"], "filler_rate"),
])
def test_bad_sensitivity_calls_are_one_line_before_anything_runs(tmp_path, capsys, argv, says):
    code = main(["sensitivity", "--out", str(tmp_path), *TINY, *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_sensitivity_trains_each_setting_once_and_writes_the_table(tmp_path, capsys):
    argv = ["sensitivity", "--gains", "msl:baseline", "--vary", "sim.token_noise=1", "--seeds", "0", "1",
            "--out", str(tmp_path), "--name", "tiny", *TINY]
    assert main(argv) == 0
    runs = sorted(p.parent.name for p in (tmp_path / "runs" / "sim-tiny").glob("*/seed1.json"))
    assert runs == ["baseline", "baseline~token_noise1", "msl", "msl~token_noise1"]
    md = (tmp_path / "sensitivity" / "tiny.md").read_text()
    assert "| papers (" in md and "(no paper row)" in md  # no paper compares MS-SL with this baseline
    assert "| preset |" in md and "| sim.token_noise | 1 |" in md
    capsys.readouterr()
    assert main([*argv, "--plan"]) == 0  # resumed: every run kept
    assert capsys.readouterr().out.count("kept (record exists)") == 8


def test_a_gain_over_a_methods_ablation_row_plans_that_row_at_every_setting(tmp_path, capsys):
    """`arl:arl~base` (ARL over its own encoder, the gain the issue asks of ARL): the row trains beside ARL
    at the preset and at each moved setting, tagged as `prvr-bench sweep --method arl~base` tags it."""
    argv = ["sensitivity", "--gains", "arl:arl~base", "--vary", "sim.token_noise=1", "--seeds", "0",
            "--out", str(tmp_path), "--plan", *TINY]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for run in ("arl", "arl~base", "arl~token_noise1", "arl~base~token_noise1"):
        assert f"\n  {run} " in out, run
    assert not any(tmp_path.iterdir())  # a plan writes nothing


def test_the_bootstrap_p_inverts_the_percentile_interval():
    """`stats.bootstrap_p`: twice the smaller share of replicates on either side of 0 (each with one added),
    below 0.05 where the 95% percentile interval leaves 0 out and not where it holds 0 well inside."""
    replicates = np.arange(-10, 990, dtype=float)  # 11 of 1,000 at or below 0
    assert stats.bootstrap_p(replicates) == pytest.approx(2 * 12 / 1001)
    assert stats.bootstrap_p(-replicates) == pytest.approx(2 * 12 / 1001)  # symmetric in the sign
    assert stats.bootstrap_p(np.linspace(-1, 1, 1001)) == 1.0  # centred on 0: capped at 1
    rng = np.random.default_rng(0)
    for centre in (0.5, 1.5, 2.5, 4.0):
        draws = rng.normal(centre, 1.0, 20_000)
        low, high = np.quantile(draws, [0.025, 0.975])
        assert (stats.bootstrap_p(draws) < 0.05) == (low > 0 or high < 0)


def test_a_change_is_read_after_holms_correction_over_its_gains_settings():
    """Each gain's changes form one family: a change whose own interval leaves 0 with a p of 0.03 reads moved
    alone and not beside two others (Holm 0.09), and the reading line says which; another gain's changes
    are corrected apart."""
    def change(p, low, high):
        return stats.GainChange(10.0, 10.0 + (low + high) / 2, (low + high) / 2, low, high, (0, 1, 2), p)

    one = [[None, None], [change(0.03, 0.5, 9.0), change(0.001, -9.0, -4.0)]]
    assert [c.holm_p for c in sensitivity.holm_by_gain(one)[1]] == [pytest.approx(0.03), pytest.approx(0.001)]
    three = [[None, None], [change(0.03, 0.5, 9.0), change(0.001, -9.0, -4.0)],
             [change(0.6, -3.0, 4.0), None], [change(0.8, -4.0, 3.0), None]]
    read = sensitivity.holm_by_gain(three)
    assert read[0] == [None, None] and read[2][1] is None
    assert read[1][0].holm_p == pytest.approx(0.09) and read[1][1].holm_p == pytest.approx(0.001)
    assert sensitivity._moved(read[1][0]) == "" and sensitivity._moved(read[1][1]) == "shrank"
    assert sensitivity._moved(sensitivity.holm_by_gain(one)[1][0]) == "grew"
    sweep = Sweep("sim-x", ("sim.k",), ((0.5,), (1.0,), (2.0,), (3.0,)), (0.5,), ("a", "b"), (0, 1, 2), "cmd")
    moves = [(sensitivity.Setting("sim.k", (v,), sweep), False, row) for v, row in zip((1.0, 2.0, 3.0), read[1:])]
    first, second = sensitivity._depends_lines([("a", "b"), ("c", "d")], moves)
    assert first.startswith("- `a - b`: its own interval leaves 0 but Holm's correction over the 3 settings made "
                            "for it does not tell it from none at sim.k=1 (+4.8 [+0.5, +9.0], p 0.030, Holm 0.090)")
    assert first.endswith("; no change told from none at sim.k=2, sim.k=3.")
    assert second.startswith("- `c - d`: depends on the knob at sim.k=1 (-6.5 [-9.0, -4.0], p 0.001")
