"""Bad configuration values and hostile names at the command line: exit code 2, one error
line, no traceback, and nothing written outside the output folder (docs/bad-input.md,
"Configuration and names")."""

import json
from pathlib import Path

import pytest

from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.base.names import check_name, inside
from prvr.harness.engine.records import checkpoint_dir, log_path, record_layout, record_path
from prvr.harness.base.registry import Registry, RegistryError

RUN = ["run", "--method", "baseline", "--dataset", "sim-tiny", "--quiet"]


@pytest.fixture
def place(tmp_path, monkeypatch):
    """tmp_path as the working folder (and the dataset cache), tmp_path/out as --out."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRVR_CACHE", str(tmp_path / "cache"))
    return tmp_path


def files_outside_out(root: Path) -> list[str]:
    out = root / "out"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if out not in p.parents and p != out)


def fails_in_one_line(capsys, place, *args, before=()):
    code = main([*args])
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, err
    assert err.startswith("prvr-bench: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + captured.out
    assert files_outside_out(place) == sorted(before)
    return err


@pytest.mark.parametrize("args, message", [
    (["--set", "train.lr=-1"], "config key 'train.lr' must be a finite number > 0, got -1.0 (from --set)"),
    (["--set", "train.lr=nan"], "'train.lr' must be a finite number > 0, got nan"),
    (["--set", "train.lr=inf"], "'train.lr' must be a finite number > 0, got inf"),
    (["--set", "train.epochs=0"], "'train.epochs' must be an integer >= 1, got 0"),
    (["--set", "train.batch_size=0"],
     "'train.batch_size' must be an integer >= 2 (a batch of one video has no negative), got 0"),
    (["--set", "train.batch_size=-3"],
     "'train.batch_size' must be an integer >= 2 (a batch of one video has no negative), got -3"),
    (["--seed", "-1"], "config key 'seed' must be an integer in [0, 4294967295], got -1 (from --seed)"),
    (["--set", "eval.chunk=0"], "'eval.chunk' must be an integer >= 1, got 0"),
    (["--set", "model.hidden=-4"], "'model.hidden' must be an integer >= 1, got -4"),
    (["--set", "sim.mislabel_rate=2"], "'sim.mislabel_rate' must be a finite number in [0, 1], got 2.0"),
    (["--set", "train.patience=-1"], "'train.patience' must be an integer >= 1, got -1"),
    (["--set", "train.warmup_frac=1.5"], "'train.warmup_frac' must be a finite number in [0, 1), got 1.5"),
    (["--set", "train.decay=cosin"],
     "config key 'train.decay' must be one of cosine, linear, constant, warmup_linear, got 'cosin' (from --set)"),
    (["--set", "train.optimizer=adam"], "'train.optimizer' names an unknown optimizer 'adam'"),
    (["--set", "relations=oracle", "--set", "relations.oracle.mode=drop"],
     "'relations.oracle.mode' must be one of ignore, positive"),
    (["--set", "sim.mv_fractions=[0.5, 0.5, 0.5]"], "'sim.mv_fractions' must be a list of 3 items"),
    (["--set", "train.device=tpu"], "'train.device' must be auto, cpu, cuda or cuda:N, got 'tpu'"),
])
def test_bad_config_values(capsys, place, args, message):
    err = fails_in_one_line(capsys, place, *RUN, "--out", "out", *args)
    assert message in err
    assert not (place / "out").exists()  # refused before the output folder is made


def test_cuda_asked_for_without_cuda(capsys, place, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = fails_in_one_line(capsys, place, *RUN, "--out", "out", "--set", "train.device=cuda")
    assert "'train.device' is 'cuda', but torch finds no CUDA device on this machine; use --set train.device=cpu" in err


def test_bad_value_in_a_config_file_names_the_file(capsys, place):
    (place / "bad.yaml").write_text("train:\n  warmup_frac: 1.5\n")
    err = fails_in_one_line(capsys, place, *RUN, "--out", "out", "--config", "bad.yaml", before=["bad.yaml"])
    assert "'train.warmup_frac' must be a finite number in [0, 1), got 1.5 (from bad.yaml)" in err


def test_arl_cross_field_rule(capsys, place):
    err = fails_in_one_line(capsys, place, "run", "--method", "arl", "--dataset", "sim-tiny", "--out", "out",
                            "--set", "loss.margin_a=0.3")
    assert "ARL needs loss.margin_a < loss.margin" in err


# ----------------------------------------------------------------------------- names
HOSTILE = ["../x", "/abs", "a/b", "x" * 300, "a b", "a\nb", "ünï", "..", ".hidden", "-rf", "a..b", "a\\b"]


@pytest.mark.parametrize("tag", HOSTILE)
@pytest.mark.parametrize("command", [RUN, ["bench", "--method", "baseline", "--dataset", "sim-tiny", "--quiet"],
                                     ["ablate", "--method", "arl", "--table", "5", "--dataset", "sim-tiny", "--quiet"]],
                         ids=["run", "bench", "ablate"])
def test_hostile_tags(capsys, place, command, tag):
    err = fails_in_one_line(capsys, place, *command, "--out", "out", f"--tag={tag}")
    assert "--tag" in err and "names may use letters, digits" in err
    assert not (place / "out").exists()


def test_a_tag_that_makes_the_run_name_too_long(capsys, place):
    err = fails_in_one_line(capsys, place, *RUN, "--out", "out", "--tag", "t" * 60)
    assert "run name 'baseline~ttt" in err and "is 69 characters long" in err


@pytest.mark.parametrize("flag", ["--method", "--dataset"])
@pytest.mark.parametrize("name", ["", "../x", "/abs", "a\nb", "x" * 300])
def test_hostile_method_and_dataset_names(capsys, place, flag, name):
    args = {"--method": "baseline", "--dataset": "sim-tiny", flag: name}
    err = fails_in_one_line(capsys, place, "run", "--method", args["--method"], "--dataset", args["--dataset"],
                            "--out", "out", "--quiet")
    assert f"unknown {flag[2:]}" in err


@pytest.mark.parametrize("name", ["", "../x", "/abs", "a/b", "x" * 65, "a b", "a\nb", "ünï", "..", "a..b"])
def test_the_name_rule(name):
    with pytest.raises(UserError) as err:
        check_name(name, "run name", "pick another")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError):
        record_path("out", "sim-tiny", name, 0)
    with pytest.raises(UserError):
        record_path("out", name, "baseline", 0)
    with pytest.raises(UserError):
        checkpoint_dir("out", "sim-tiny", name, 0)
    with pytest.raises(UserError):
        log_path("out", "sim-tiny", name, 0)


def test_good_names_and_paths_stay_under_out(tmp_path):
    for name in ("baseline", "arl+oracle~tv_only_e30", "baseline@gmmformer", "x" * 64, "a.b-c_d"):
        assert check_name(name, "run name", "") == name
    path = record_path(tmp_path, "sim-tiny", "arl+oracle~tv_only_e30", 2)
    assert path == tmp_path / "runs" / "sim-tiny" / "arl+oracle~tv_only_e30" / "seed2.json"
    assert record_layout(path) == (tmp_path, "sim-tiny", "arl+oracle~tv_only_e30", 2)
    with pytest.raises(UserError, match="would lie outside"):
        inside(tmp_path / "runs" / ".." / ".." / "x", tmp_path, "record")
    with pytest.raises(UserError, match="seed -1 is not"):
        record_path(tmp_path, "sim-tiny", "baseline", -1)


def test_registered_names_follow_the_rule():
    reg = Registry("thing")
    for bad in ("../x", "a/b", "", "a b"):
        with pytest.raises(RegistryError, match="thing name"):
            reg.add(bad, object())
    reg.add("fine-name", object())


# ----------------------------------------------------------------------------- evaluate RECORD
def write_record(path: Path, **changes) -> Path:
    """A record of the right shape (no checkpoint: evaluate must refuse before it looks for one)."""
    cfg = resolve("baseline", "sim-tiny", 0).to_dict()
    record = {"method": "baseline", "dataset": "sim-tiny", "seed": 0, "run_name": "baseline", "config": cfg,
              "provenance": {}, "metrics": {"val": {}, "test": {}}, **changes}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_evaluate_a_record_whose_run_name_climbs_out(capsys, place):
    rec = write_record(place / "out" / "runs" / "sim-tiny" / "baseline" / "seed0.json", run_name="../../x")
    err = fails_in_one_line(capsys, place, "evaluate", str(rec), "--quiet")
    assert "names dataset, run and seed 'sim-tiny', '../../x', 0, but its folder says sim-tiny, baseline, 0" in err


def test_evaluate_a_record_outside_its_folder_layout(capsys, place):
    rec = write_record(place / "out" / "rec.json")
    err = fails_in_one_line(capsys, place, "evaluate", str(rec), "--quiet")
    assert "is not at <out>/runs/<dataset>/<run>/seed<S>.json" in err


@pytest.mark.parametrize("folder", ["a b", "ünï", ".."])
def test_evaluate_a_record_in_a_hostile_folder(capsys, place, folder):
    rec = write_record(place / "out" / "runs" / "sim-tiny" / folder / "seed0.json", run_name=folder)
    err = fails_in_one_line(capsys, place, "evaluate", str(rec), "--quiet")
    assert "run folder" in err or "is not at <out>/runs" in err


def test_evaluate_a_record_whose_config_is_for_another_seed(capsys, place):
    rec = write_record(place / "out" / "runs" / "sim-tiny" / "baseline" / "seed1.json", seed=1)
    err = fails_in_one_line(capsys, place, "evaluate", str(rec), "--quiet")
    assert "holds the config of sim-tiny seed 0, not of its folder's sim-tiny seed 1" in err


def test_evaluate_with_a_bad_device(capsys, place):
    rec = write_record(place / "out" / "runs" / "sim-tiny" / "baseline" / "seed0.json")
    err = fails_in_one_line(capsys, place, "evaluate", str(rec), "--device", "gpu", "--quiet")
    assert "--device must be auto, cpu, cuda or cuda:N, got 'gpu'" in err


@pytest.mark.parametrize("run", ["../../x", "/abs", "a/b", ""])
def test_detection_table_of_a_hostile_run_name(capsys, place, run):
    err = fails_in_one_line(capsys, place, "detection", f"--run={run}", "--dataset", "sim-tiny", "--out", "out")
    assert "--run" in err and "names may use" in err
