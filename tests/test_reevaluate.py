"""`prvr-bench evaluate`: stored runs re-ranked from their best checkpoints."""

import json
from pathlib import Path

import pytest

from prvr.harness.cli import main
from prvr.harness.io import UserError
from prvr.harness.records import record_path
from prvr.harness.reevaluate import SUMMARY, evaluate_runs
from prvr.harness.runner import run_one


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from prvr.harness.config import resolve

    out = tmp_path_factory.mktemp("runs")
    paths = []
    for seed in (0, 1):
        cfg = resolve("baseline", "sim-tiny", seed, ["train.epochs=1"])
        rec = run_one(cfg, out)
        paths.append(record_path(out, "sim-tiny", rec["run_name"], seed))
    return out, paths


def test_fused_score_reproduces_the_record_and_parts_are_listed(two_runs):
    _, paths = two_runs
    rows = evaluate_runs([paths[0]], parts=True)
    record = json.loads(paths[0].read_text())
    by_score = {r["score"]: r["metrics"] for r in rows}
    assert {"clip", "frame", "fused"} <= set(by_score)
    for key in SUMMARY:
        assert by_score["fused"][key] == record["metrics"]["test"][key]
    assert by_score["fused"]["oracle"]["SumR"] == record["metrics"]["test"]["oracle"]["SumR"]
    assert by_score["clip"] != by_score["frame"]  # the parts are ranked separately


def test_ensemble_of_a_run_with_itself_equals_the_run(two_runs):
    _, paths = two_runs
    rows = evaluate_runs([paths[0], paths[0]], ensemble=True)
    assert rows[-1]["score"] == "fused (mean)"
    assert rows[-1]["metrics"]["SumR"] == rows[0]["metrics"]["SumR"]
    mixed = evaluate_runs(paths, ensemble=True)
    assert len(mixed) == 3 and mixed[-1]["run"] == "baseline seed 0 + baseline seed 1"


def test_command_prints_the_table_and_writes_json(two_runs, tmp_path, capsys):
    _, paths = two_runs
    main(["evaluate", str(paths[0]), "--json", str(tmp_path / "ev.json")])
    printed = capsys.readouterr().out
    assert "| baseline seed 0 | fused |" in printed
    stored = json.loads((tmp_path / "ev.json").read_text())
    assert stored["split"] == "test" and stored["rows"][0]["score"] == "fused"


def test_bad_requests_are_user_errors(two_runs, tmp_path):
    out, paths = two_runs
    with pytest.raises(UserError, match="at least two"):
        evaluate_runs([paths[0]], ensemble=True)
    with pytest.raises(UserError, match="no split 'nope'"):
        evaluate_runs([paths[0]], split_name="nope")
    # a record whose checkpoint is gone (checkpoints are not committed)
    moved = tmp_path / "runs" / "sim-tiny" / "baseline" / "seed0.json"
    moved.parent.mkdir(parents=True)
    moved.write_text(paths[0].read_text())
    with pytest.raises(UserError, match="best checkpoint .* does not exist"):
        evaluate_runs([moved])


OLD_RUNS = Path(__file__).parent / "data" / "old_runs"


@pytest.mark.parametrize("run", ["baseline+oracle", "arl"])
def test_records_and_checkpoints_of_an_earlier_version_re_evaluate_to_their_metrics(run):
    """Written by prvr-bench at 4cd4e2c (before the typed Scores, the detector sections and
    build_run; the record's `command` says how, with --out old), sim-tiny, 2 epochs: the
    current code rebuilds the model from the old record and ranks the test split to the
    record's own figures."""
    record = OLD_RUNS / "runs" / "sim-tiny" / run / "seed0.json"
    stored = json.loads(record.read_text())["metrics"]["test"]
    assert "oracle_mode" in json.loads(record.read_text())["config"]["relations"]  # the old layout
    (row,) = evaluate_runs([record], "test", device="cpu")
    for key in ("R@1", "R@5", "R@10", "R@100", "SumR", "median_rank"):
        assert row["metrics"][key] == pytest.approx(stored[key], abs=1e-9), key
