"""`prvr-bench reproduce RECORD` (harness/cli/reproduce.py): a record's run made again from its own
commit (taken with `git archive`, the checkout untouched), figure by figure; what cannot be made
again is one line. On sim-tiny, one epoch (CPU)."""

import json
import subprocess
from pathlib import Path

import pytest

from prvr.harness.cli import main
from prvr.harness.cli.reproduce import compare_figures, run_command
from prvr.harness.engine.config import resolve
from prvr.harness.engine.runner import run_one

ROOT = Path(__file__).resolve().parents[1]


def head() -> str | None:
    out = subprocess.run(["git", "--no-optional-locks", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


@pytest.fixture(scope="module")
def tiny_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("made")
    cfg = resolve("baseline", "sim-tiny", 0, ["train.epochs=1"])
    run_one(cfg, out, command="prvr-bench run --method baseline --dataset sim-tiny --seed 0 --out results "
                              "--set train.epochs=1 --quiet")
    return out / "runs" / "sim-tiny" / "baseline" / "seed0.json"


def _with(record: Path, tmp_path: Path, **provenance) -> Path:
    data = json.loads(record.read_text())
    data["provenance"].update(provenance)
    copy = tmp_path / "runs" / "sim-tiny" / "baseline" / "seed0.json"
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("provenance, says", [
    ({"git_dirty": True, "git_revision": "a" * 40}, "made from an uncommitted tree"),
    ({"git_dirty": False, "git_revision": "0" * 40}, "which this repository does not hold"),
    ({"git_revision": "unknown"}, "names no commit"),
])
def test_what_cannot_be_made_again_is_one_line(tiny_record, tmp_path, capsys, provenance, says):
    assert main(["reproduce", str(_with(tiny_record, tmp_path, **provenance))]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_the_run_command_of_a_record():
    record = {"command": "prvr-bench run --method msl --dataset sim-tvr-v2 --seed 2 --out results --threads 1 --quiet "
                         "--resume --set train.lr=1e-4", "method": "msl", "dataset": "sim-tvr-v2", "seed": 2}
    assert run_command(record, Path("o"), None) == ["run", "--method", "msl", "--dataset", "sim-tvr-v2", "--seed", "2",
                                                     "--set", "train.lr=1e-4", "--out", "o", "--quiet"]
    bench = {**record, "command": "prvr-bench bench --method msl arl --seeds 0 1 2 --set train.lr=1e-4 --tag x"}
    assert run_command(bench, Path("o"), 2) == ["run", "--method", "msl", "--dataset", "sim-tvr-v2", "--seed", "2",
                                                 "--set", "train.lr=1e-4", "--tag", "x", "--out", "o", "--quiet",
                                                 "--threads", "2"]


def test_figures_are_set_beside_each_other():
    old = {"metrics": {"val": {"SumR": 100.0, "R@1": 10.0}, "test": {"SumR": 90.0, "oracle": {"SumR": 95.0}}}}
    new = {"metrics": {"val": {"SumR": 100.0, "R@1": 11.0}, "test": {"SumR": 90.0, "oracle": {"SumR": 94.0}}}}
    old["metrics"]["test"]["VCMR SumR"], new["metrics"]["test"]["VCMR SumR"] = 40.0, 42.5  # a run that localizes
    got = {f.key: f.difference for f in compare_figures(old, new)}
    assert got == {"val R@1": 1.0, "val SumR": 0.0, "test SumR": 0.0, "test VCMR SumR": 2.5, "test oracle SumR": -1.0}


def test_a_figure_that_moved_on_another_machine_says_where_each_was_made():
    """A run retrained on another processor need not repeat its last digits (docs/records.md, "Retraining a
    record"): the table's line names both machines, and the error line says so where the machines differ."""
    from prvr.harness.cli.reproduce import Figure, _elsewhere, render
    from prvr.harness.engine.records import made_on

    record = {"method": "msl", "seed": 1, "provenance": {"device": "cpu (1 threads)",
                                                        "cpu": {"model": "Intel Xeon (family 6, model 207)"}}}
    then = made_on(record)
    assert then == "cpu (1 threads), Intel Xeon (family 6, model 207)"
    assert made_on({"provenance": {"device": "cuda (NVIDIA H200)", "cpu": {"model": "x"}}}) == "cuda (NVIDIA H200)"
    here = "cpu (1 threads), AMD EPYC (family 25, model 17)"
    text = render(Path("r.json"), record, "a" * 40, [Figure("test SumR", 250.0, 252.0)], 1e-6, here)
    assert f"(the record made on {then}; made again on {here})" in text.splitlines()[0] and "| differs |" in text
    says = _elsewhere(then, here)
    assert f"made on {then} and this run on {here}" in says and "reproduce it where it was made" in says
    assert _elsewhere(then, then) == "" and _elsewhere("", here) == ""


@pytest.mark.slow
def test_a_sim_tiny_record_made_at_head_reproduces_exactly(tiny_record, tmp_path, capsys):
    """The record's figures again, figure by figure, from the code of HEAD (in CI, a clean clone: the code
    that made the record)."""
    revision = head()
    if revision is None:
        pytest.skip("not a git checkout")
    record = _with(tiny_record, tmp_path, git_revision=revision, git_dirty=False)
    assert main(["reproduce", str(record)]) == 0
    out = capsys.readouterr().out
    assert f"made again at {revision[:10]}" in out and "| test SumR |" in out and "differs" not in out


def test_the_leaderboard_names_the_rows_made_from_an_uncommitted_tree(tmp_path):
    from test_records_and_leaderboard import fake_record, store

    from prvr.harness.reports import leaderboard

    for seed in (0, 1):
        rec = fake_record(seed, 150.0 + seed)
        rec["provenance"] = {"git_revision": "a" * 40, "git_dirty": seed == 1}
        store(tmp_path, rec)
    leaderboard.rebuild(tmp_path, show=False)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "Made from an uncommitted tree (" in md and "sim-x baseline seeds 1." in md
