"""The command line: what users type, and the one-line errors they get."""

import json
import sys

import pytest

from prvr.harness.cli import main

import unprivileged  # tests/unprivileged.py


def run_cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_prints_every_registry(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    for word in ("methods:", "backbones:", "detectors:", "datasets:", "baseline", "dual-branch", "oracle",
                 "sim-tvr"):
        assert word in out


def test_run_writes_a_record_under_out(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--method", "baseline", "--dataset", "sim-tiny", "--seed", "4",
                           "--out", str(tmp_path), "--set", "train.epochs=1", "--quiet")
    assert code == 0, err
    rec = json.loads((tmp_path / "runs" / "sim-tiny" / "baseline" / "seed4.json").read_text())
    assert rec["seed"] == 4 and rec["command"].startswith("prvr-bench")


def test_bench_then_leaderboard(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench", "--method", "baseline", "--dataset", "sim-tiny", "--seeds", "0", "1", "--oracle",
                           "--out", str(tmp_path),
                           "--set", "train.epochs=1", "--quiet")
    assert code == 0, err
    assert len(list(tmp_path.glob("runs/sim-tiny/*/seed*.json"))) == 4  # baseline and baseline+oracle
    md = (tmp_path / "leaderboard.md").read_text()
    assert "| sim-tiny | baseline |" in md and "| sim-tiny | baseline+oracle |" in md
    (tmp_path / "leaderboard.md").unlink()
    code, out, _ = run_cli(capsys, "leaderboard", "--out", str(tmp_path))
    assert code == 0 and (tmp_path / "leaderboard.md").exists() and "baseline+oracle" in out


@pytest.mark.parametrize("args, message", [
    (["run", "--method", "basline"], "unknown method 'basline': did you mean 'baseline'"),
    (["run", "--method", "baseline", "--dataset", "sim-tvrr"], "unknown dataset 'sim-tvrr': did you mean 'sim-tvr'"),
    (["run", "--method", "baseline", "--set", "train.lrr=1"], "unknown config key 'train.lrr'"),
    (["run", "--method", "baseline", "--set", "train.epochs=many"], "'train.epochs' expects int"),
    (["run", "--method", "baseline", "--set", "relations=oracel"], "unknown relation detector 'oracel'"),
])
def test_bad_input_is_one_line_with_a_hint(capsys, args, message):
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert message in err and err.count("\n") == 1


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX folder permissions")
def test_unwritable_results_folder(capsys, tmp_path):
    """Run as root (CI), root could write anyway: then the command runs as uid 65534 (tests/unprivileged.py)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if unprivileged.can_drop():
        unprivileged.give_to_nobody(locked)
        tmp_path.chmod(0o711)  # searchable, so that uid 65534 reaches locked/ from its working folder
    locked.chmod(0o500)
    args = ["run", "--method", "baseline", "--dataset", "sim-tiny"]
    if unprivileged.can_drop():
        done = unprivileged.main_as([*args, "--out", "locked/r"], cwd=tmp_path)
        code, err = done.code, done.err
    else:
        code, _, err = run_cli(capsys, *args, "--out", str(locked / "r"))
    assert code == 2 and "cannot create folder" in err and len(err.strip().splitlines()) == 1, err
    assert list(locked.iterdir()) == []


def test_results_folder_that_is_a_file(capsys, tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("not a folder")
    code, _, err = run_cli(capsys, "run", "--method", "baseline", "--dataset", "sim-tiny", "--out", str(blocker))
    assert code == 2 and "cannot create folder" in err and str(blocker) in err


def test_config_prints_resolved_yaml(capsys):
    code, out, _ = run_cli(capsys, "config", "--method", "baseline", "--dataset", "sim-tiny", "--set", "train.lr=0.01")
    assert code == 0 and "lr: 0.01" in out and "hidden: 64" in out


def test_bench_defaults_every_method_one_seed_no_oracle():
    from prvr.harness.cli.app import build_parser

    args = build_parser().parse_args(["bench"])
    assert args.method is None and args.seeds == [0] and args.oracle is False and args.dataset == ["sim-tvr-v2"]  # calibrated to TVR (issue 62)
    assert build_parser().parse_args(["bench", "--oracle"]).oracle is True
