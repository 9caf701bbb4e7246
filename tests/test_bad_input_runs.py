"""Bad input, round three (training side): nothing trained without a word, one writer per run
(docs/bad-input.md, "Training, evaluation and checkpoints")."""

import json
import os
import subprocess
import sys

import pytest
import torch

from prvr.harness.base import io, progress

from prvr.harness.reports import leaderboard
from prvr.harness.engine.config import resolve
from prvr.harness.base.contract import LossOutput
from prvr.harness.base.io import UserError, claim
from prvr.harness.engine.records import record_path
from prvr.harness.engine.runner import run_one
from prvr.harness.engine.trainer import Trainer

EPOCHS = ["train.epochs=2", "train.patience=10"]


def test_a_batch_of_one_video_is_refused_at_resolve_time():
    with pytest.raises(UserError, match=r"'train.batch_size' must be an integer >= 2 \(a batch of one video has no "
                                        r"negative\), got 1"):
        resolve("baseline", "sim-tiny", 0, ["train.batch_size=1"])


@pytest.mark.parametrize("diagnostics", [{}, {"sigma": torch.ones(())}])  # a diagnostic is no part of the loss
def test_an_epoch_whose_loss_parts_are_all_zero_marks_the_record_and_leaves_the_means(tmp_path, monkeypatch,
                                                                                      diagnostics):
    lines = []
    monkeypatch.setattr(progress, "log", lines.append)
    monkeypatch.setattr(progress, "warn", lambda m: lines.append(f"warning: {m}"))
    monkeypatch.setattr(Trainer, "train_step", lambda self, batch, epoch, step: LossOutput(
        torch.zeros(()), {"triplet": torch.zeros(())}, diagnostics))  # a loss that trains nothing
    record = run_one(resolve("baseline", "sim-tiny", 0, EPOCHS), tmp_path)
    assert record["degenerate"] == {"epoch": 0}
    assert sum("every loss part is exactly 0 in epoch 0" in line for line in lines) == 1
    assert leaderboard.rebuild(tmp_path, show=False) == []
    md = (tmp_path / "leaderboard.md").read_text()
    assert "sim-tiny baseline seed 0 (every loss part exactly 0 in epoch 0: degenerate)" in md


def test_resume_without_a_run_state_says_it_starts_fresh(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(progress, "log", lines.append)
    monkeypatch.setattr(progress, "warn", lambda m: lines.append(f"warning: {m}"))
    run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path, resume=True)
    assert any(line.startswith("warning: --resume: no run state ") and line.endswith("training from epoch 0")
               for line in lines)


def test_a_second_writer_of_a_run_is_refused_naming_the_first(tmp_path):
    path = record_path(tmp_path, "sim-tiny", "baseline", 0)
    with claim(path, "run baseline on sim-tiny, seed 0"):
        with pytest.raises(UserError, match=rf"run baseline on sim-tiny, seed 0 is being written by another process "
                                            rf"\(pid {os.getpid()} on {io.HOST}, since "):
            run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    assert not path.parent.exists()  # the lock and the folders it made are gone


def test_a_lock_left_by_a_killed_writer_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = record_path(tmp_path, "sim-tiny", "baseline", 0)
    path.parent.mkdir(parents=True)
    (path.parent / "seed0.json.lock").write_text(f"{io.HOST} {dead.stdout.strip()} 2026-01-01T00:00:00")
    record = run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    assert json.loads(path.read_text())["metrics"] == record["metrics"]
    assert not (path.parent / "seed0.json.lock").exists()


def test_a_full_disk_while_saving_a_checkpoint_is_named_as_such(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    def cxx_failure(obj, f):  # what torch's C++ writer raises when the disk fills up
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0; basic_ios::clear")

    monkeypatch.setattr(torch, "save", cxx_failure)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: namedtuple("u", "total used free")(100, 100, 0))
    with pytest.raises(UserError, match=r"cannot write checkpoint .*best.pt: the disk is full \(0 MB free on the disk "
                                        r"of .*\); free space there or pass another --out"):
        run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.tmp"))


def test_a_cache_folder_name_too_long_is_named_and_blamed_on_the_cache_setting(tmp_path):
    long = "c" * 300
    with pytest.raises(UserError, match=r"cache folder .*: a name in the path is longer than the file system "
                                        r"allows \(255 bytes\) \(300 bytes: c{40}\.\.\.\); move the cache: --set "
                                        r"data.cache_dir=DIR or PRVR_CACHE=DIR"):
        run_one(resolve("baseline", "sim-tiny", 3, ["train.epochs=1", f"data.cache_dir={tmp_path / long}"]), tmp_path)


def test_an_out_folder_name_too_long_is_named_as_such(tmp_path):
    from prvr.harness.base.io import ensure_dir

    with pytest.raises(UserError, match=r"cannot create folder .*: a name in the path is longer than the file system "
                                        r"allows \(255 bytes\) \(300 bytes: o{40}\.\.\.\); pass another --out folder"):
        ensure_dir(tmp_path / ("o" * 300) / "runs")


def test_test_scores_that_tell_no_video_apart_mark_the_record(tmp_path, monkeypatch):
    from prvr.harness.engine import evaluate

    def constant(model, queries, videos):
        n = next(iter(videos.values())).shape[0]
        return lambda start, end: torch.zeros(end - start, n)

    monkeypatch.setattr(evaluate, "fused_scores", constant)
    record = run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    assert record["degenerate"] == {"scores": "every score is 0"}
    assert leaderboard.rebuild(tmp_path, show=False) == []
    assert "(test scores: every score is 0: degenerate)" in (tmp_path / "leaderboard.md").read_text()


def test_the_score_watch_names_nonfinite_and_constant_scores():
    from prvr.harness.engine.evaluate import ScoreWatch

    for scores, said in [(torch.tensor([[1.0, float("nan")], [2.0, 3.0]]), "1 of 4 scores not finite"),
                         (torch.full((2, 3), 0.5), "every score is 0.5"), (torch.tensor([[1.0, 2.0]]), "")]:
        watch = ScoreWatch(lambda s, e, t=scores: t[s:e])
        watch(0, 1), watch(1, len(scores))
        assert watch.problem() == said


def test_a_lone_video_in_each_epochs_last_batch_is_said(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(progress, "log", lines.append)
    monkeypatch.setattr(progress, "warn", lambda m: lines.append(f"warning: {m}"))
    from prvr.harness.engine.build import build_run

    cfg = resolve("baseline", "sim-tiny", 0, ["train.epochs=1"])
    n = int(build_run(cfg).trainer(tmp_path).has_queries.sum())
    lines.clear()
    build_run(resolve("baseline", "sim-tiny", 0, [f"train.batch_size={n - 1}"])).trainer(tmp_path)
    assert sum("leave one video alone in each epoch's last batch" in line for line in lines) == 1
    # batches of queries (train.sample=queries): a lone query has one video, and so no negative either
    queries = build_run(cfg).data.splits["train"].num_queries
    lines.clear()
    build_run(resolve("baseline", "sim-tiny", 0, ["train.sample=queries", f"train.batch_size={queries - 1}"])).trainer(tmp_path)
    assert sum(f"{queries} training queries in batches of {queries - 1} leave one query alone" in line
               for line in lines) == 1
