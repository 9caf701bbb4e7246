"""The calibration report of a simulated dataset (harness/reports/calibration.py), on fake records."""

import csv
import io
from pathlib import Path

import pytest
from scipy import stats

from prvr.harness.reports import calibration, leaderboard
from prvr.harness.reports.calibration import MET, NO_RECORDS, NO_REFERENCE, NOT_MET
from test_records_and_leaderboard import fake_record, store

TVR = calibration.REFERENCES["tvr"]
CALIBRATED = {"multi_relevant_share": 0.34, "relevant_per_query_mean": 2.0, "relevant_per_query_max": 33,
              "mv_fractions": [0.85, 0.1, 0.05], "words_per_query": 10.5}
# Every fact off its target: few queries with several relevant videos, none with dozens (and a
# mean that would allow many), M/V far from TVR's, queries too short.
UNCALIBRATED = {"multi_relevant_share": 0.1, "relevant_per_query_mean": 3.0, "relevant_per_query_max": 10,
                "mv_fractions": [0.7, 0.2, 0.1], "words_per_query": 8.0}


def sim_record(seed, sumr, oracle, run_name="baseline", relations="none", facts=CALIBRATED, epochs=30):
    """A sim-tvr record on its protocol (30 epochs, early stop 5) with the test split's facts."""
    rec = fake_record(seed, sumr, run_name=run_name, relations=relations, oracle=oracle, epochs=epochs)
    rec["dataset"] = "sim-tvr"
    rec["provenance"] = {"data": {"name": "sim-tvr", "generator_version": 2, "test": dict(facts)}}
    return rec


def world(base, base_oracle, with_oracle, facts=CALIBRATED, epochs=30):
    recs = [sim_record(s, b, o, facts=facts, epochs=epochs) for s, (b, o) in enumerate(zip(base, base_oracle))]
    recs += [sim_record(s, v, v + 30, run_name="baseline+oracle", relations="oracle", facts=facts, epochs=epochs)
             for s, v in enumerate(with_oracle)]
    return recs


def by_target(results):
    names = ("sumr", "oracle", "gap", "multi", "dozens", "mv", "words")
    assert len(results) == len(names)
    return dict(zip(names, results))


def test_every_target_met_on_a_calibrated_world():
    base, base_oracle, with_oracle = [180.0, 186.0, 190.0], [210.0, 214.0, 221.0], [195.0, 193.0, 201.0]
    got = by_target(calibration.evaluate(world(base, base_oracle, with_oracle), "sim-tvr", TVR))
    assert {k: r.status for k, r in got.items()} == dict.fromkeys(got, MET)
    assert got["sumr"].values == base and got["sumr"].seeds == [0, 1, 2] and got["sumr"].runs == ["baseline"]
    assert got["sumr"].measured.startswith("185.3 ± 5.0")
    # p: the paired t-test over the shared seeds, as the leaderboard computes it for the Δ column
    assert got["oracle"].p == pytest.approx(stats.ttest_rel(base_oracle, base).pvalue)
    assert got["gap"].p == pytest.approx(stats.ttest_rel(with_oracle, base).pvalue)
    (row,) = [r for r in leaderboard.build_rows(world(base, base_oracle, with_oracle)) if r["run"] == "baseline+oracle"]
    assert got["gap"].p == row["p"] and got["gap"].values == [15.0, 7.0, 11.0]
    assert f"p = {row['p']:.3f}" in got["gap"].measured and "+11.0" in got["gap"].measured
    assert got["gap"].runs == ["baseline", "baseline+oracle"]
    assert got["multi"].keys == ["provenance.data.test.multi_relevant_share"]
    assert "34.0%" in got["multi"].measured and "the same in all 3 records" in got["multi"].measured
    assert "at most 4.3% of queries" in got["dozens"].measured  # (2.0 - 1) / 23
    assert got["mv"].measured.startswith("0.850 / 0.100 / 0.050 (largest difference 0.008)")


def test_every_target_not_met_on_an_uncalibrated_world():
    # baseline below 120; oracle SumR no higher than the labelled one; the oracle run +2 only
    got = by_target(calibration.evaluate(world([100.0, 110.0, 105.0], [100.0, 110.0, 105.0], [102.0, 112.0, 107.0],
                                               facts=UNCALIBRATED), "sim-tvr", TVR))
    assert {k: r.status for k, r in got.items()} == dict.fromkeys(got, NOT_MET)
    assert got["oracle"].p == 1.0 and got["gap"].p == 0.0  # every seed +2: a constant difference
    assert "at most 8.7% of queries" in got["dozens"].measured
    # above the range is not met either, and a gap that is large only in the mean is met (p shown)
    high = by_target(calibration.evaluate(world([240.0, 250.0], [260.0, 271.0], [280.0, 251.0]), "sim-tvr", TVR))
    assert high["sumr"].status == NOT_MET
    assert high["gap"].status == MET and high["gap"].p > 0.05


def test_missing_or_off_protocol_records_are_no_records():
    # 12 epochs is off sim-tvr's protocol (30): such runs never count
    off = by_target(calibration.evaluate(world([180.0], [210.0], [195.0], epochs=12), "sim-tvr", TVR))
    assert {r.status for r in off.values()} == {NO_RECORDS}
    # a baseline without the oracle run, and records without data facts
    recs = [sim_record(s, 180.0 + s, 210.0 + s) for s in (0, 1)]
    for r in recs:
        del r["provenance"]["data"]["test"]["words_per_query"]
    got = by_target(calibration.evaluate(recs, "sim-tvr", TVR))
    assert got["sumr"].status == MET and got["gap"].status == NO_RECORDS
    assert "`baseline+oracle`" in got["gap"].measured
    assert got["words"].status == NO_RECORDS and "provenance.data.test.words_per_query" in got["words"].measured
    # one seed: no t-test, so the oracle SumR is not shown to be above
    one = by_target(calibration.evaluate(recs[:1], "sim-tvr", TVR))
    assert one["oracle"].status == NOT_MET and one["oracle"].p is None and "too few seeds" in one["oracle"].measured
    # no imitated dataset to compare with
    assert by_target(calibration.evaluate(recs, "sim-tvr", None))["mv"].status == NO_REFERENCE


def test_without_baseline_records_the_facts_come_from_the_run_with_most_seeds():
    other = dict(CALIBRATED, words_per_query=7.0)  # a fact only this run could show
    recs = [sim_record(s, 250.0, 280.0, run_name="xml", facts=other) for s in (0, 1, 2)]
    recs += [sim_record(0, 240.0, 270.0, run_name="arl", facts=UNCALIBRATED)]
    got = by_target(calibration.evaluate(recs, "sim-tvr", TVR))
    assert {got[k].status for k in ("sumr", "oracle", "gap")} == {NO_RECORDS}  # the SumR targets are the baseline's
    assert got["multi"].status == MET and got["multi"].runs == ["xml"] and got["multi"].seeds == [0, 1, 2]
    assert got["words"].status == NOT_MET and got["words"].measured.startswith("7.0")
    assert calibration.tally(list(got.values())) == "3 of 7 targets met (1 not met, 3 no records)."
    # with baseline records, theirs are read (UNCALIBRATED facts under the baseline: not met)
    recs += [sim_record(s, 180.0, 210.0, facts=UNCALIBRATED) for s in (0, 1)]
    with_base = by_target(calibration.evaluate(recs, "sim-tvr", TVR))
    assert with_base["multi"].runs == ["baseline"] and with_base["multi"].status == NOT_MET
    assert calibration.tally(list(got.values())[:1]) == "0 of 1 targets met (1 no records)."


def test_rebuild_writes_the_report_of_each_simulated_dataset(tmp_path):
    for rec in world([180.0, 186.0, 190.0], [210.0, 214.0, 221.0], [195.0, 193.0, 201.0]):
        store(tmp_path, rec)
    store(tmp_path, fake_record(0, 150.0))  # sim-x: not registered, no generator version: not simulated
    leaderboard.rebuild(tmp_path, show=False)
    assert sorted(p.name for p in (tmp_path / "calibration").iterdir()) == ["sim-tvr.csv", "sim-tvr.md"]
    md = (tmp_path / "calibration" / "sim-tvr.md").read_text()
    assert md.startswith("# Calibration of sim-tvr\n") and "do not edit by hand" in md
    assert "7 of 7 targets met." in md and md.count("| **met** |") == 7
    assert "[1] `prvr-bench bench --seeds 0 1 2`" in md  # the command that made the records
    assert "TVR val (0.853 / 0.092 / 0.055)" in md  # the preset's family gives the reference
    rows = list(csv.DictReader(io.StringIO((tmp_path / "calibration" / "sim-tvr.csv").read_text())))
    assert [r["status"] for r in rows] == [MET] * 7
    assert rows[0]["values"] == "180.0000 186.0000 190.0000" and rows[0]["seeds"] == "0 1 2"
    assert float(rows[2]["p"]) == pytest.approx(stats.ttest_rel([195.0, 193.0, 201.0], [180.0, 186.0, 190.0]).pvalue,
                                                abs=1e-4)
    assert rows[3]["mean"] == "" and rows[3]["record keys"] == "provenance.data.test.multi_relevant_share"
    # a real-layout export of a simulated dataset is not the simulated dataset
    export = fake_record(0, 150.0)
    export["dataset"] = "tvr"
    export["provenance"] = {"data": {"name": "tvr", "test": {"exported_from": "sim-tvr", "simulated": True}}}
    assert calibration.simulated_datasets([export]) == []


def test_committed_calibration_reports_are_current(tmp_path):
    """results/calibration/ is what `prvr-bench leaderboard --out results` writes from the
    committed records (rebuild it after adding records), beside the `<world>~real` reports that
    `prvr-bench calibrate-world` writes from census tables (tests/test_world_calibration.py)."""
    results = Path(__file__).parent.parent / "results"
    if not list(results.glob("runs/**/*.json")):
        pytest.skip("no committed run records")
    written = calibration.write_reports(tmp_path, leaderboard.collect(results))
    committed = [p.name for p in (results / "calibration").iterdir() if "~real." not in p.name]
    assert sorted(p.name for p in written) == sorted(committed)
    for p in written:
        assert p.read_text() == (results / "calibration" / p.name).read_text(), p.name
