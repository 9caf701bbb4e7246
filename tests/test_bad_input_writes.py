"""Bad input, round four: nothing is written outside the place a command was given (docs/bad-input.md,
"Where the suite writes"). Every writer goes through `io.atomic_path`: its target must be a regular
file or absent, so a FIFO, a device node, a folder or a link in its place is named in one line and left
as it was; names taken from input are checked as names; torch's compile caches go under the suite's
cache folder; provenance reads git without its index lock.

The special files are made in a private temporary folder (never /dev or /etc): a FIFO with os.mkfifo,
a character device with os.mknod where the test may make one (root), a read-only folder."""

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from prvr.harness.base import io  # noqa: E402
from prvr.harness.base.io import UserError, atomic_path, check_target, write_json, write_png, write_text  # noqa: E402
from prvr.harness.cli import main  # noqa: E402
from prvr.harness.cli.reevaluate import _write_json  # noqa: E402
from prvr.harness.engine import precision, records  # noqa: E402

import unprivileged  # noqa: E402  (tests/unprivileged.py)


ROOT = Path(__file__).resolve().parents[1]


def _fifo(path):
    os.mkfifo(path)
    return path


def _device(path):
    try:  # a character device with /dev/null's numbers, in the test's own folder
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


def _folder(path):
    path.mkdir()
    return path


def _link(path):
    target = path.parent / "elsewhere.txt"
    target.write_text("theirs\n")
    path.symlink_to(target)
    return path


SPECIAL = {"a FIFO": _fifo, "a character device": _device, "a folder": _folder, "a symbolic link": _link}
WRITERS = {"text": lambda p: write_text(p, "x\n"), "json": lambda p: write_json(p, {"a": 1}),
           "png": lambda p: write_png(plt.figure(), p)}


def _kind(path):
    return io.file_kind(os.lstat(path).st_mode).removesuffix(" (named pipe)")


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("special", sorted(SPECIAL))
def test_a_writer_never_replaces_what_is_not_a_regular_file(tmp_path, special, writer):
    target = SPECIAL[special](tmp_path / "out.file")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UserError, match=rf"out.file is {special}.*, not a regular file: nothing is written there") as e:
        WRITERS[writer](target)
    assert "\n" not in str(e.value)
    assert _kind(target) == special  # left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary left beside it
    if special == "a symbolic link":
        assert (tmp_path / "elsewhere.txt").read_text() == "theirs\n"


def test_a_regular_file_or_nothing_is_written_as_before(tmp_path):
    write_text(tmp_path / "a.md", "one\n")
    write_text(tmp_path / "a.md", "two\n")
    assert (tmp_path / "a.md").read_text() == "two\n"
    check_target(tmp_path / "absent")  # absent: fine


def test_a_failed_write_leaves_the_old_file_and_names_the_cause(tmp_path, monkeypatch):
    """A full disk mid-write: one line naming the file and the disk; the old content stays, no temporary."""
    target = tmp_path / "table.md"
    target.write_text("old\n")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with pytest.raises(UserError, match=r"cannot write .*table.md: the disk is full.*; nothing was replaced"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            full()
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]


def test_evaluate_json_refuses_a_fifo_and_a_run_record(tmp_path):
    """`evaluate --json` onto a FIFO is refused without blocking; onto a run's record or rankings (by
    their names, or one of the records given) too: evaluate never changes a record."""
    fifo = _fifo(tmp_path / "figures.json")
    record = tmp_path / "seed0.json"
    record.write_text("{}")
    args = argparse.Namespace(json=str(fifo), split="test", records=[str(record)])
    with pytest.raises(UserError, match="is a FIFO"):
        _write_json(args, [])
    for name in ("seed0.json", "seed12.rank.npz"):
        args.json = str(tmp_path / "runs" / name)
        with pytest.raises(UserError, match="name of a run's record or rankings"):
            _write_json(args, [])
    args.json = str(tmp_path / "other.json")
    _write_json(args, [])
    assert json.loads((tmp_path / "other.json").read_text()) == {"split": "test", "rows": []}


def test_leaderboard_onto_a_fifo_is_one_line_and_leaves_it(tmp_path, capsys):
    run = tmp_path / "runs" / "sim-tvr-v2" / "baseline"
    run.mkdir(parents=True)
    shutil.copy(ROOT / "results" / "runs" / "sim-tvr-v2" / "baseline" / "seed0.json", run)  # a committed record
    _fifo(tmp_path / "leaderboard.md")
    assert main(["leaderboard", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "leaderboard.md is a FIFO" in err and len(err.strip().splitlines()) == 1
    assert _kind(tmp_path / "leaderboard.md") == "a FIFO"
    assert not (tmp_path / "leaderboard.csv").exists()  # its other file is not written either


@pytest.mark.parametrize("world", ["../../x", "/abs/x", "a/b"])
def test_calibrate_world_takes_its_world_as_a_name(tmp_path, capsys, world):
    """`--world` names the report's files: a path would write them above --out or anywhere."""
    table = tmp_path / "t.csv"
    table.write_text("x\n")
    code = main(["calibrate-world", "--world", world, "--real", str(table), "--tables", str(table),
                 "--out", str(tmp_path / "out")])
    assert code == 2 and "--world" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not list(tmp_path.parent.glob("*~real.*"))


@pytest.mark.parametrize("feature", ["../../../x", "/abs/x", "a/b"])
def test_data_export_takes_its_feature_as_a_name(tmp_path, capsys, feature):
    code = main(["data", "export", "--dataset", "sim-tiny", "--as", "tvr", "--to", str(tmp_path / "d"),
                 "--feature", feature, "--quiet"])
    assert code == 2 and "--feature" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not (tmp_path / "x").exists()


def test_compile_caches_go_under_the_suites_cache_folder(tmp_path, monkeypatch):
    for name in precision.COMPILE_CACHE_ENV:
        monkeypatch.delenv(name, raising=False)
    got = precision.compile_caches_under(tmp_path / "cache")
    assert set(got) == {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    assert all(v.startswith(str(tmp_path / "cache" / "torch-compile")) for v in got.values())
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # where inductor will write

    assert cache_dir().startswith(str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))  # the user's choice stays
    assert precision.compile_caches_under(tmp_path / "cache")["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def test_provenance_reads_git_without_its_index_lock(tmp_path, monkeypatch):
    """A run's provenance runs git with --no-optional-locks, so it never takes index.lock (a user's
    `git commit` in the same checkout would fail on it)."""
    seen = []
    real = subprocess.run

    def spy(cmd, *a, **kw):
        seen.append(cmd)
        return real(cmd, *a, **kw)

    monkeypatch.setattr(records.subprocess, "run", spy)
    records._git("status", "--porcelain")
    assert seen and seen[0][:2] == ["git", "--no-optional-locks"]


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# Each writing command against a results folder its user may read but not write, holding committed runs
# (records and rankings) so that the command gets as far as writing: (argv with OUT for the folder, the
# file it names).
READ_ONLY_COMMANDS = [
    (["leaderboard", "--out", "OUT"], "OUT/leaderboard"),
    (["compare", "--dataset", "sim-tvr-v2", "--rows", "baseline+oracle:baseline", "--resamples", "50",
      "--permutations", "50", "--out", "OUT"], "OUT/compare"),
    (["sweep", "--dataset", "sim-tvr-v2", "--knob", "sim.repeat_prob", "--values", "0.35", "--method", "baseline",
      "--oracle", "--seeds", "0", "1", "--report-only", "--out", "OUT"], "OUT/sweeps"),
    (["matrix", "--dataset", "sim-tvr-v2", "--detectors", "none", "oracle", "--treatments", "positive",
      "--backbones", "dual-branch", "--seeds", "0", "1", "--report-only", "--out", "OUT"], "OUT/matrix"),
    (["sensitivity", "--dataset", "sim-tvr-v2", "--gains", "msl:baseline", "--vary", "sim.token_noise=1",
      "--seeds", "0", "1", "--report-only", "--out", "OUT"], "OUT/sensitivity"),
]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX folder permissions")
@pytest.mark.parametrize("argv, names", READ_ONLY_COMMANDS, ids=lambda v: v[0] if isinstance(v, list) else None)
def test_a_read_only_results_folder_is_one_line(tmp_path, capsys, argv, names):
    """A results folder whose owner may read but not write it (0o500), holding committed runs: each
    writing command is one line naming what it cannot write, and nothing is written there (no table, no
    temporary, no cache entry). Run as root (CI), root could write anyway: the command runs as uid 65534
    (tests/unprivileged.py), the folder that user's own."""
    out = tmp_path / "ro"
    for run in ("baseline", "baseline+oracle"):
        folder = out / "runs" / "sim-tvr-v2" / run
        folder.mkdir(parents=True)
        for seed in (0, 1):  # committed records and their rankings
            for suffix in (".json", ".rank.npz"):
                shutil.copy(ROOT / "results" / "runs" / "sim-tvr-v2" / run / f"seed{seed}{suffix}", folder)
    before = _tree(out)
    if unprivileged.can_drop():
        unprivileged.give_to_nobody(out)
        tmp_path.chmod(0o711)  # searchable, so that uid 65534 reaches ro/ from its working folder
    for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        folder.chmod(0o500)
    try:
        if unprivileged.can_drop():
            done = unprivileged.main_as([a.replace("OUT", "ro") for a in argv], cwd=tmp_path)
            code, err, shown = done.code, done.err, names.replace("OUT", "ro")
        else:
            code = main([a.replace("OUT", str(out)) for a in argv])
            err, shown = capsys.readouterr().err, names.replace("OUT", str(out))
        assert code == 2, err
        assert shown in err and ("Permission denied" in err or "cannot create folder" in err), err
        assert len(err.strip().splitlines()) == 1, err
        assert _tree(out) == before  # no table, no temporary beside it
    finally:
        for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
            folder.chmod(0o700)


# the file each of READ_ONLY_COMMANDS writes first, in its folder
FIFO_TARGETS = {"leaderboard": "leaderboard.md", "compare": "compare/sim-tvr-v2.md",
                "sweep": "sweeps/sim-tvr-v2~repeat_prob.md", "matrix": "matrix/sim-tvr-v2.md",
                "sensitivity": "sensitivity/sim-tvr-v2.md"}


@pytest.mark.parametrize("argv, names", READ_ONLY_COMMANDS, ids=lambda v: v[0] if isinstance(v, list) else None)
def test_a_fifo_where_a_command_writes_is_one_line_and_left_as_it_was(tmp_path, capsys, argv, names):
    """The same writing commands, in a folder they may write, with a FIFO where their table goes: one
    line naming it, the FIFO still a FIFO, and the table's other files not written either."""
    out = tmp_path / "out"
    for run in ("baseline", "baseline+oracle"):
        folder = out / "runs" / "sim-tvr-v2" / run
        folder.mkdir(parents=True)
        for seed in (0, 1):
            for suffix in (".json", ".rank.npz"):
                shutil.copy(ROOT / "results" / "runs" / "sim-tvr-v2" / run / f"seed{seed}{suffix}", folder)
    target = out / FIFO_TARGETS[argv[0]]
    target.parent.mkdir(parents=True, exist_ok=True)
    _fifo(target)
    code = main([a.replace("OUT", str(out)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and f"{target.name} is a FIFO" in err and len(err.strip().splitlines()) == 1, err
    assert _kind(target) == "a FIFO"
    assert not target.with_suffix(".csv").exists()


@pytest.mark.parametrize("writer", ["sim cache", "feature store"])
def test_a_cache_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, writer):
    """The sim cache and the real datasets' feature store start their entries with `io.temporary_beside`
    as every writer does: a folder the user may not write in (read-only, another user's, a full disk) is
    one line naming the entry, not a PermissionError traceback. (The unprivileged child cannot reach a
    cache folder: the cache path is made absolute, and pytest's temporary root is root's alone.)"""
    mkdir = os.mkdir

    def refused(path, *args, **kwargs):  # the entry's temporary folder, as in a folder the user may not write
        if str(path).endswith(".tmp"):
            raise PermissionError(13, "Permission denied")
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refused)
    entry = tmp_path / "cache" / "sim" / "sim-tiny-0123"
    entry.parent.mkdir(parents=True)
    with pytest.raises(UserError, match=r"cannot write .*sim-tiny-0123: .*Permission denied.*nothing was written"):
        if writer == "sim cache":
            from prvr.datasets.sim import cache

            cache.save(None, entry)  # refused before it reads the data
        else:
            from prvr.datasets.real import store

            store._build_entry(None, entry)
    assert list(entry.parent.iterdir()) == []


def test_an_export_that_fails_midway_leaves_no_half_written_collection(tmp_path, capsys, monkeypatch):
    """Round four: `data export` onto a full disk gave h5py tracebacks and left half a collection behind.
    A full disk in the middle of the export (the feature file's writer fails) is one line naming the disk,
    and the collection folder this export made is gone."""
    from prvr.datasets.real import export as export_module

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "write_bigfile", full)
    code = main(["data", "export", "--dataset", "sim-tiny", "--as", "tvr", "--to", str(tmp_path / "d"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot export tvr to" in err and "the disk is full" in err and "nothing was left there" in err
    assert not (tmp_path / "d" / "tvr").exists()
