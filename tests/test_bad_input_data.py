"""Bad input around data, caches, records and output (docs/bad-input.md, "Data, caches,
records and output"): each CLI case exits 2 with one line and no traceback, and writes
nothing outside its output folder, half-written or not."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from real_layouts import TINY, exported, load_tvr, msl_paths, tvr_config
from test_records_and_leaderboard import fake_record, store

from prvr.datasets.overlap import shared_captions
from prvr.datasets.real.problems import LayoutError
from prvr.datasets.sim import cache as sim_cache
from prvr.harness.cli import app as cli, args as cli_args
from prvr.harness.base import io, progress
from prvr.harness.reports import leaderboard
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import load_record, record_path, write_record
from prvr.harness.base.registry import DATASETS


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return exported(tmp_path_factory.mktemp("layout") / "msl")


@pytest.fixture
def data_root(template, tmp_path):
    shutil.copytree(template, tmp_path / "d")
    return tmp_path / "d"


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def files_under(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*")}


def assert_one_line_error(code, err, *parts):
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("prvr-bench: error: ") and "Traceback" not in err
    for part in parts:
        assert part in err, (part, err)


# ---------------------------------------------------------------- real-data cache


def test_relative_data_root_and_prvr_data_load_and_reload(data_root, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "run", "--method", "baseline", "--dataset", "tvr", "--data-root", "d",
                           "--out", "out", "--set", "data.cache_dir=cache", "--set", "train.epochs=1",
                           *[a for s in TINY for a in ("--set", s)], "--quiet")
    assert code == 0, err
    assert (tmp_path / "out" / "runs" / "tvr" / "baseline" / "seed0.json").is_file()
    (entry,) = (tmp_path / "cache" / "real").iterdir()
    manifest = json.loads((entry / "manifest.json").read_text())
    assert Path(manifest["frames"]["file"]).is_absolute()  # feature.bin, from any working directory
    monkeypatch.setenv("PRVR_DATA", "d")
    overrides = cli_args.data_root_overrides(cli.build_parser().parse_args(["data", "check", "--dataset", "tvr"]))
    cfg = resolve("baseline", "tvr", 0, [*overrides, "data.cache_dir=cache", *TINY])
    first, again = DATASETS.get("tvr").load(cfg), DATASETS.get("tvr").load(cfg)  # built once, then read back
    np.testing.assert_array_equal(np.asarray(again["train"].frames.data[:5]), np.asarray(first["train"].frames.data[:5]))


def _entry(data_root, tmp_path):
    load_tvr(data_root, tmp_path / "cache")
    (entry,) = (tmp_path / "cache" / "real").iterdir()
    return entry


def nan_tokens_in_entry(entry):
    f = entry / "train.tokens.f32"
    raw = bytearray(f.read_bytes())
    raw[:64] = np.full(16, np.nan, dtype=np.float32).tobytes()
    f.write_bytes(bytes(raw))  # same size: a size check alone trusts it
    return "train.tokens.f32 changed since it was written"


def extra_file_in_entry(entry):
    shutil.copy(entry / "train.moments.npy", entry / "train.moments.old.npy")
    return "train.moments.old.npy is not in the manifest"


def missing_file_in_entry(entry):
    (entry / "val.text.json").unlink()
    return "val.text.json missing"


def manifest_not_json(entry):
    (entry / "manifest.json").write_text("{half")
    return "manifest does not parse"


@pytest.mark.parametrize("damage", [nan_tokens_in_entry, extra_file_in_entry, missing_file_in_entry,
                                    manifest_not_json])
def test_a_changed_real_cache_entry_is_refused_in_one_line(damage, data_root, tmp_path):
    entry = _entry(data_root, tmp_path)
    part = damage(entry)
    with pytest.raises(LayoutError) as e:
        load_tvr(data_root, tmp_path / "cache")
    msg = str(e.value)
    assert "\n" not in msg and str(entry) in msg and part in msg and "delete that folder to rebuild it" in msg


def test_the_cli_refuses_a_changed_real_cache_entry(data_root, tmp_path, monkeypatch, capsys):
    entry = _entry(data_root, tmp_path)
    nan_tokens_in_entry(entry)
    monkeypatch.chdir(tmp_path)
    before = files_under(tmp_path)
    code, _, err = run_cli(capsys, "run", "--method", "baseline", "--dataset", "tvr", "--data-root", data_root,
                           "--out", tmp_path / "out", "--set", f"data.cache_dir={tmp_path / 'cache'}",
                           *[a for s in TINY for a in ("--set", s)], "--quiet")
    assert_one_line_error(code, err, "train.tokens.f32 changed since it was written", "delete that folder")
    assert files_under(tmp_path) - before <= {Path("out")}  # the --out folder, empty
    assert not list((tmp_path / "out").iterdir())


# ---------------------------------------------------------------- simulated-world cache


def _sim_entry(tmp_path):
    cfg = resolve("baseline", "sim-tiny", 0, [f"data.cache_dir={tmp_path}"])
    data = DATASETS.get("sim-tiny").load(cfg)
    (folder,) = (tmp_path / "sim").iterdir()
    return cfg, data, folder


def sim_extra_array(folder):
    # the old loader picked arrays by glob: this file's key is "frames" too, and replaced the real one
    np.save(folder / "train.frames.x.npy", np.zeros((3, 4), dtype=np.float32))
    return "train.frames.x.npy is not in the manifest"


def sim_changed_bytes(folder):
    f = folder / "test.query_video.npy"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0x01
    f.write_bytes(bytes(raw))
    return "test.query_video.npy changed since it was written"


def sim_manifest_lists_too_little(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]["val.durations.npy"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return "val.durations.npy is not in the manifest"


@pytest.mark.parametrize("damage", [sim_extra_array, sim_changed_bytes, sim_manifest_lists_too_little])
def test_sim_cache_loads_only_its_manifest_and_regenerates_on_any_difference(damage, tmp_path, monkeypatch):
    cfg, data, folder = _sim_entry(tmp_path)
    frames, labels = np.array(data["train"].frames.data), np.array(data["test"].query_video)
    part = damage(folder)
    warnings = []
    monkeypatch.setattr("prvr.harness.base.progress.log", warnings.append)
    again = DATASETS.get("sim-tiny").load(cfg)
    assert any(part in w and "regenerating" in w for w in warnings), warnings
    np.testing.assert_array_equal(np.asarray(again["train"].frames.data), frames)
    np.testing.assert_array_equal(again["test"].query_video, labels)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*json.loads(
        (folder / "manifest.json").read_text())["files"], "manifest.json"])


def test_cache_digest_reads_entries_written_with_blake2b(tmp_path):
    cfg, data, folder = _sim_entry(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, info in manifest["files"].items():  # what entries written before the switch list
        del info["sha256"]
        info["blake2b"] = sim_cache.file_digest(folder / name, "blake2b")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    sim_cache.load(folder)


# ---------------------------------------------------------------- data check: captions shared between splits


def _test_captions(root):
    return msl_paths(root)["collection"] / "TextData" / "tvrtest.caption.txt"


def test_data_check_warns_about_captions_shared_between_splits(data_root, tmp_path, monkeypatch, capsys):
    p = msl_paths(data_root)
    train = p["train_captions"].read_text().splitlines()
    test_file = _test_captions(data_root)
    test = test_file.read_text().splitlines()
    shared_text = train[0].split(" ", 1)[1]
    test[0] = test[0].split(" ", 1)[0] + " " + shared_text  # another video, a train caption's text
    test.append(train[5])  # a train query itself: the same video and caption in test
    test_file.write_text("\n".join(test) + "\n")
    monkeypatch.chdir(tmp_path)
    before = files_under(tmp_path)
    code, out, err = run_cli(capsys, "data", "check", "--dataset", "tvr", "--data-root", data_root,
                             "--set", f"data.cache_dir={tmp_path / 'cache'}")
    assert code == 0, err
    assert "warnings: 1" in out and "errors: none" in out
    (line,) = [ln for ln in out.splitlines() if "captions shared between splits" in ln]
    assert f"train/test: 2 of {len(test)} test queries" in line and "1 of them on the same video" in line
    assert " ".join(shared_text.lower().split())[:40] in line
    assert files_under(tmp_path) == before  # check writes nothing


def test_shared_captions_counts_by_normalised_text_and_video():
    class S:
        def __init__(self, texts, videos):
            self.query_text, self.video_ids = texts, sorted(set(videos))
            self.query_video = [self.video_ids.index(v) for v in videos]

    splits = {"train": S(["A man runs.", "a dog"], ["v1", "v2"]),
              "val": S(["x"], ["v9"]),
              "test": S(["a  MAN runs.", "a dog", "new"], ["v7", "v2", "v8"])}
    (found,) = shared_captions(splits)
    assert (found.other, found.split, found.queries, found.of, found.same_video) == ("train", "test", 2, 3, 1)
    assert found.examples == ["a dog", "a man runs."]


# ---------------------------------------------------------------- records


def _record_case(change):
    rec = json.loads(json.dumps(fake_record(0, 150.0)))  # val and test apart (fake_record shares them)
    change(rec)
    return rec


RECORD_CASES = [
    (lambda r: r.update(metrics="oops"), "key 'metrics': str 'oops', expected an object"),
    (lambda r: r["metrics"].update(test=[1, 2]), "key 'metrics.test': list [1, 2], expected an object"),
    (lambda r: r["metrics"].pop("val"), "key 'metrics.val': missing, expected an object"),
    (lambda r: r.update(seed="0"), "key 'seed': str '0', expected an integer"),
    (lambda r: r.update(seed=True), "key 'seed': bool True, expected an integer"),
    (lambda r: r["metrics"]["test"].update(SumR="150"), "key 'metrics.test.SumR': str '150', expected a number"),
    (lambda r: r["metrics"]["test"].update(buckets=[]), "key 'metrics.test.buckets': list [], expected an object"),
    (lambda r: r.update(config="baseline"), "key 'config': str 'baseline', expected an object"),
    (lambda r: r.update(run_name=3), "key 'run_name': int 3, expected a string"),
    (lambda r: r.update(timings={"train": "slow"}), "key 'timings.train': str 'slow', expected a number"),
    (lambda r: r.update(schema_version=99), "key 'schema_version': 99 is not a schema this prvr-bench reads"),
]


@pytest.mark.parametrize("change, message", RECORD_CASES)
def test_a_badly_shaped_record_is_one_line_naming_file_and_key(change, message, tmp_path, monkeypatch, capsys):
    path = record_path(tmp_path, "sim-x", "baseline", 0)
    write_record(path, _record_case(change))
    monkeypatch.chdir(tmp_path)
    before = files_under(tmp_path)
    code, _, err = run_cli(capsys, "leaderboard", "--out", tmp_path)
    assert_one_line_error(code, err, str(path), message, "--skip-bad")
    assert files_under(tmp_path) == before  # no table written from a bad record


def test_a_v1_record_with_bad_metrics_is_one_line(tmp_path):
    path = tmp_path / "seed0.json"
    path.write_text(json.dumps({"method": "b", "dataset": "d", "seed": 0, "config": {}, "provenance": {},
                                "val_metrics": "none", "test_metrics": {"SumR": 1.0}}))
    with pytest.raises(io.UserError, match="key 'metrics.val': str 'none', expected an object"):
        load_record(path)


# ---------------------------------------------------------------- leaderboard --out


@pytest.mark.parametrize("make, message", [
    (lambda root: None, "does not exist"),
    (lambda root: root.mkdir(), "has no runs/ folder"),
])
def test_leaderboard_of_a_folder_without_runs_is_an_error(make, message, tmp_path, monkeypatch, capsys):
    root = tmp_path / "results"
    make(root)
    monkeypatch.chdir(tmp_path)
    before = files_under(tmp_path)
    code, _, err = run_cli(capsys, "leaderboard", "--out", root)
    assert_one_line_error(code, err, f"results folder {root} {message}", "pass as --out the folder")
    assert files_under(tmp_path) == before


# ---------------------------------------------------------------- output for pipes and logs


def test_piped_leaderboard_shows_every_figure_whole(tmp_path, capsys):
    for seed in (0, 1, 2):
        store(tmp_path, fake_record(seed, 150.0 + 2 * seed, oracle=170.0))
        store(tmp_path, fake_record(seed, 169.25 + seed, run_name="baseline+oracle@gmmformer2~a-rather-long-tag-name",
                                    relations="oracle"))
    code, out, _ = run_cli(capsys, "leaderboard", "--out", tmp_path)
    assert code == 0
    assert "…" not in out
    lines = out.splitlines()
    (row,) = [ln for ln in lines if "baseline+oracle@gmmformer2~a-rather-long-tag-name" in ln]
    for figure in ("170.2 ± 1.0", "17.0 ± 0.1", "+18.2 [+15.8, +20.7] (t-test p="):
        assert figure in row, (figure, row)
    assert len(row) > 80  # one line however wide, never wrapped


def test_log_lines_in_a_pipe_are_never_wrapped(capsys, monkeypatch):
    monkeypatch.setattr(progress, "_enabled", True)
    message = "wrote " + "/".join(["results"] * 20) + "/seed0.json: test SumR 169.25 (val 170.00, best epoch 12)"
    progress.log(message)
    assert capsys.readouterr().err == message + "\n"


def test_commands_in_records_are_shell_quoted(monkeypatch):
    argv = ["prvr-bench", "run", "--method", "baseline", "--config", "my overrides.yaml", "--set",
            "data.data_root=/data/it's here"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(cli_args, "_argv", None)  # no main(ARGV) ran: this process's own arguments
    command = cli_args.command_line()
    assert shlex.split(command) == argv
    cli_args.set_argv(argv[1:])  # main(ARGV) called from Python records ARGV, not the caller's arguments
    monkeypatch.setattr(sys, "argv", ["pytest", "-q"])
    assert shlex.split(cli_args.command_line()) == argv


# ---------------------------------------------------------------- temporaries and modes


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _age(path: Path, seconds: float = 2 * io.STALE_AFTER_S) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_writer_killed_mid_write_leaves_no_half_file_and_its_temporary_is_cleaned(tmp_path):
    target = tmp_path / "leaderboard.md"
    target.write_text("old\n")
    code = ("import os, signal, sys\n"
            "from prvr.harness.base.io import atomic_path\n"
            f"with atomic_path({str(target)!r}) as tmp:\n"
            "    tmp.write_text('half')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    assert proc.wait() == -signal.SIGKILL
    (left,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert left.name.startswith(".leaderboard.md.") and f"-{proc.pid}." in left.name
    assert target.read_text() == "old\n"  # never half-written
    _age(left)
    io.write_text(tmp_path / "other.json", "{}")  # any write into the folder cleans up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaderboard.md", "other.json"]


def test_only_temporaries_of_dead_writers_on_this_host_are_removed(tmp_path):
    dead = _dead_pid()
    names = {
        "dead": f".a.json.{io.HOST}-{dead}.0123abcd.tmp",
        "recent": f".b.json.{io.HOST}-{dead}.0123abcd.tmp",  # untouched for less than a minute
        "alive": f".c.json.{io.HOST}-{os.getppid()}.0123abcd.tmp",
        "other host": f".d.json.elsewhere_{io.HOST}-{dead}.0123abcd.tmp",
        "not ours": ".e.json.tmp",
    }
    for kind, name in names.items():
        (tmp_path / name).write_text(kind)
        if kind != "recent":
            _age(tmp_path / name)
    stale_dir = tmp_path / f".sim-x-1234.{io.HOST}-{dead}.89abcdef.tmp"  # a cache entry being built
    stale_dir.mkdir()
    (stale_dir / "train.frames.npy").write_text("half")
    _age(stale_dir)
    removed = io.remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == sorted([names["dead"], stale_dir.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for k, n in names.items() if k != "dead")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_take_their_mode_from_the_umask(umask, mode, tmp_path):
    old = os.umask(umask)
    try:
        io.write_json(tmp_path / "runs" / "r.json", {"a": 1})
        folder = io.temporary_beside(tmp_path / "entry", folder=True)
    finally:
        os.umask(old)
    assert (tmp_path / "runs" / "r.json").stat().st_mode & 0o777 == mode
    assert folder.stat().st_mode & 0o777 == 0o777 & ~umask


def test_leaderboard_rebuild_writes_nothing_but_its_tables(tmp_path):
    store(tmp_path, fake_record(0, 150.0))
    before = files_under(tmp_path)
    leaderboard.rebuild(tmp_path, show=False)
    # the tables, and the M/V bucket chart of the record's bucket metrics (harness/reports/buckets.py)
    assert files_under(tmp_path) - before == {Path("leaderboard.csv"), Path("leaderboard.md"), Path("buckets"),
                                              Path("buckets/sim-x.md"), Path("buckets/sim-x.png")}

