"""Bad input in training, evaluation and checkpoints: one line, exit 2, nothing left behind.

Cases (docs/bad-input.md, "Training, evaluation and checkpoints"): scores that are not
finite numbers, a loss that becomes non-finite (stop, or continue with a marked record the
leaderboard leaves out), damaged or foreign checkpoints for --resume and for best.pt,
--resume with other settings (refused unless --force-resume), and the checkpoint files of
a run that fails before completing an epoch.
"""

import argparse
import json
import pickle
import shutil

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.harness.reports import leaderboard

from prvr.harness.base import progress
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.engine.evaluate import compute_ranks, evaluate_scores, reference_ranks
from prvr.harness.base.io import UserError
from prvr.harness.engine.records import record_path, write_record
from prvr.harness.engine.runner import run_one
from prvr.harness.engine.trainer import Trainer

EPOCHS = ["train.epochs=2", "train.patience=10"]
RUN = ["run", "--method", "baseline", "--dataset", "sim-tiny", "--out", "out", "--quiet",
       *[a for s in EPOCHS for a in ("--set", s)]]
SEED0 = "out/checkpoints/sim-tiny/baseline/seed0"
RECORD = "out/runs/sim-tiny/baseline/seed0.json"


# ------------------------------------------------------------------------- helpers
def labels_of(targets: list[list[int]], n_videos: int) -> sp.csr_matrix:
    rows = [q for q, ts in enumerate(targets) for _ in ts]
    cols = [t for ts in targets for t in ts]
    return sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=(len(targets), n_videos))


def ranks_of(scores: np.ndarray, targets: list[list[int]]) -> np.ndarray:
    q, v = scores.shape
    return compute_ranks(lambda s, e: torch.tensor(scores[s:e]), q, labels_of(targets, v))["labelled"]


def one_line_error(capsys, tmp_path, *args: str) -> str:
    """Run the CLI in-process (cwd = tmp_path); check exit 2, one error line and no traceback
    on either stream, nothing written beside the --out folder and no temporary left in it."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in out + err and out == ""
    assert err.startswith("prvr-bench: error: ") and err.count("\n") == 1, err
    assert {p.name for p in tmp_path.iterdir()} <= {"out"}
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    return err


def files_under(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class Poison:
    """A hook that makes training diverge with legal settings: after step `step` of epoch
    `epoch`, every weight becomes NaN, so the next step's loss is NaN."""

    def __init__(self, epoch: int, step: int = 0) -> None:
        self.epoch, self.step = epoch, step

    def on_epoch_start(self, trainer, epoch):
        pass

    def on_step(self, trainer, step, out):
        if trainer.epoch == self.epoch and step == self.step:
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.fill_(float("nan"))

    def on_epoch_end(self, trainer, epoch, summary):
        pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished two-epoch sim-tiny run (record and checkpoints), copied by the tests."""
    out = tmp_path_factory.mktemp("trained") / "out"
    run_one(resolve("baseline", "sim-tiny", 0, EPOCHS), out, command="prvr-bench run")
    return out


@pytest.fixture
def here(tmp_path, monkeypatch, trained):
    """tmp_path as the working folder, holding a copy of the trained run as `out`."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained, tmp_path / "out")
    return tmp_path


# ------------------------------------------------------------- non-finite scores
def test_nonfinite_scores_rank_as_the_worst_score():
    nan, inf = float("nan"), float("inf")
    scores = np.array([[nan, 0.5, 0.1, 0.2],   # labelled 0 is NaN: ties with nothing finite, ranks last
                       [0.3, nan, inf, -inf],  # labelled 0 = 0.3: the three non-finite never rank above it
                       [0.3, nan, inf, 0.1],   # labelled 1 (NaN) ties with +inf (the worst), both below 0.3, 0.1
                       [0.9, 0.5, 0.7, 0.2]])  # labelled 3, finite everywhere: as before
    assert ranks_of(scores, [[0], [0], [1], [3]]).tolist() == [4, 1, 4, 4]
    assert ranks_of(scores[:1], [[0, 2]]).tolist() == [3]  # the best finite target counts


def test_all_nan_scores_give_zero_recall_not_400():
    scores = np.full((6, 150), np.nan)  # more videos than the largest K, so last is a miss at every K
    m = evaluate_scores(scores, labels_of([[i] for i in range(6)], 150), labels_of([[i, i + 1] for i in range(6)], 150))
    assert m["SumR"] == 0.0 and m["R@1"] == 0.0 and m["median_rank"] == 150
    assert m["oracle"]["SumR"] == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_nonfinite_counting_equals_the_reference_with_nonfinite_as_minus_inf(seed):
    """The rule: replace NaN and +-inf by -inf, then rank as the full-sort reference does
    (ties against the model)."""
    rng = np.random.default_rng(seed)
    q, v = 41, 67
    scores = np.round(rng.standard_normal((q, v)), 1)
    bad = rng.random((q, v))
    scores[bad < 0.1] = np.nan
    scores[(bad >= 0.1) & (bad < 0.15)] = np.inf
    scores[(bad >= 0.15) & (bad < 0.2)] = -np.inf
    scores[0] = np.nan  # one all-NaN query
    targets = [sorted(rng.choice(v, size=rng.integers(1, 4), replace=False).tolist()) for _ in range(q)]
    rel = [sorted(set(t) | set(rng.choice(v, size=rng.integers(0, 5), replace=False).tolist())) for t in targets]
    out = compute_ranks(lambda s, e: torch.tensor(scores[s:e]), q, labels_of(targets, v), labels_of(rel, v), chunk=9)
    worst = np.where(np.isfinite(scores), scores, -np.inf)
    np.testing.assert_array_equal(out["labelled"], reference_ranks(worst, targets))
    np.testing.assert_array_equal(out["oracle"], reference_ranks(worst, rel))
    assert out["labelled"][0] == v
    expected = [sum(worst[i, r] >= max(worst[i, t] for t in targets[i]) for r in set(rel[i]) - set(targets[i]))
                for i in range(q)]
    np.testing.assert_array_equal(out["above"], expected)


# --------------------------------------------------------------- non-finite loss
@pytest.mark.parametrize("lr", ["inf", "nan", "-1"])
def test_illegal_learning_rate_is_one_line(capsys, tmp_path, monkeypatch, lr):
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, tmp_path, *RUN, "--set", f"train.lr={lr}")
    assert "train.lr" in err
    assert not (tmp_path / "out" / "runs").exists() and not (tmp_path / SEED0).exists()


def test_legal_learning_rate_that_diverges_stops_with_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, tmp_path, *RUN, "--set", "train.lr=1e10")
    assert "training diverged: loss is nan at epoch 0, step " in err and "train.lr=1e+10" in err
    assert "train.on_nonfinite=continue" in err
    assert not list((tmp_path / "out").rglob("*.json")) and not list((tmp_path / "out").rglob("*.pt"))
    assert not (tmp_path / SEED0).exists()  # the run made its folder; with nothing in it, it is gone


def test_unknown_on_nonfinite_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, tmp_path, *RUN, "--set", "train.on_nonfinite=ignore")
    assert "train.on_nonfinite" in err and "stop" in err
    cfg = resolve("baseline", "sim-tiny", 0, EPOCHS)
    cfg.train.on_nonfinite = "ignore"  # past the resolver: the trainer checks it too
    with pytest.raises(UserError, match="'train.on_nonfinite' must be one of stop, continue, got 'ignore'"):
        run_one(cfg, tmp_path / "out")


def test_divergence_after_an_epoch_keeps_its_checkpoint_and_resume_finishes(tmp_path):
    with pytest.raises(UserError, match=r"training diverged: loss is nan at epoch 1, step 1 \(train.lr="):
        run_one(resolve("baseline", "sim-tiny", 0, EPOCHS), tmp_path, hooks=[Poison(epoch=1)])
    assert not list(tmp_path.rglob("*.json"))  # no record
    last = tmp_path / "checkpoints" / "sim-tiny" / "baseline" / "seed0" / "last.pt"
    assert torch.load(last, weights_only=True)["epoch"] == 1  # epoch 0's state, before the divergence
    record = run_one(resolve("baseline", "sim-tiny", 0, EPOCHS), tmp_path, resume=True)
    assert record["epochs_run"] == 2 and "nonfinite" not in record
    assert record["resumes"] == [{"from_epoch": 1, "changed": {}, "forced": False}]


def test_continue_marks_the_record_and_the_leaderboard_leaves_it_out(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, "--set", "train.lr=1e10", "--set", "train.on_nonfinite=continue"]) == 0
    record = json.loads((tmp_path / RECORD).read_text())
    assert record["nonfinite"]["epoch"] == 0 and record["nonfinite"]["step"] >= 0
    assert all(np.isnan(h["loss"]) for h in record["history"])
    assert record["metrics"]["test"]["R@1"] == 0.0  # NaN scores rank every labelled video last
    good = {**{k: record[k] for k in ("method", "dataset", "config", "provenance", "run_name", "tag")}, "seed": 1,
            "metrics": {"val": {"SumR": 150.0}, "test": {"R@1": 10.0, "R@5": 30.0, "R@10": 40.0, "R@100": 70.0,
                                                         "SumR": 150.0}}}
    write_record(record_path(tmp_path / "out", "sim-tiny", "baseline", 1), good)
    (row,) = leaderboard.rebuild(tmp_path / "out", show=False)
    assert row["seeds"] == [1] and row["SumR"] == [150.0]  # the diverged seed 0 is in no mean
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "Left out of the table: runs whose training loss became non-finite" in md
    assert f"sim-tiny baseline seed 0 (loss not finite from epoch 0, step {record['nonfinite']['step']})" in md


# ------------------------------------------------------------------- checkpoints
def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _replace(content):
    def write(path):
        path.unlink()
        if content == "folder":
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            torch.save(content, path)
    return write


BAD_FILES = {
    "empty": (_replace(b""), "the file is empty"),
    "truncated": (_truncated, "truncated or damaged"),
    "text": (_replace(b"not a checkpoint\n"), "not a torch file"),
    "foreign pickle": (_replace(pickle.dumps(argparse.Namespace(a=1))), "a weights-only load refuses"),
    "foreign torch file": (_replace(argparse.Namespace(a=1)), "a weights-only load refuses"),
    "torch file without the keys": (_replace({"weights": torch.zeros(2)}), "lacks model"),
    "torch list": (_replace([1, 2]), "holds a list"),
    "folder": (_replace("folder"), "it is a folder"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_last_checkpoint_on_resume_is_one_line(capsys, here, case):
    damage, message = BAD_FILES[case]
    last = here / SEED0 / "last.pt"
    damage(last)
    before = files_under(here / "out")
    err = one_line_error(capsys, here, *RUN, "--resume")
    assert f"checkpoint {SEED0}/last.pt" in err and message in err and "run without --resume" in err
    assert files_under(here / "out") == before  # the user's file is left as it was


@pytest.mark.parametrize("case", ["missing", *BAD_FILES])
def test_bad_best_checkpoint_for_evaluate_is_one_line(capsys, here, case):
    best = here / SEED0 / "best.pt"
    if case == "missing":
        best.unlink()
        message = "does not exist"
    else:
        damage, message = BAD_FILES[case]
        damage(best)
    err = one_line_error(capsys, here, "evaluate", RECORD, "--quiet")
    assert f"{SEED0}/best.pt" in err and message in err and "re-run the run" in err


@pytest.mark.parametrize("case", ["missing", "truncated"])
def test_bad_best_checkpoint_after_resume_is_one_line(capsys, here, case):
    best = here / SEED0 / "best.pt"
    best.unlink() if case == "missing" else _truncated(best)
    err = one_line_error(capsys, here, *RUN, "--resume")
    assert f"checkpoint {SEED0}/best.pt" in err and "train the run again without --resume" in err


def test_best_checkpoint_of_another_model_for_evaluate_is_one_line(capsys, here):
    record = json.loads((here / RECORD).read_text())
    record["config"]["model"]["hidden"] = 32
    (here / RECORD).write_text(json.dumps(record))
    err = one_line_error(capsys, here, "evaluate", RECORD, "--quiet")
    assert f"checkpoint {SEED0}/best.pt holds another model than this run's" in err and "there, " in err


# --------------------------------------------------------- resume with other settings
def test_resume_with_a_shape_changing_setting_is_one_line(capsys, here):
    err = one_line_error(capsys, here, *RUN, "--resume", "--set", "model.hidden=32")
    assert "was trained with other settings (model.hidden 64 -> 32)" in err and "--force-resume" in err
    assert main([*RUN, "--force-resume", "--set", "model.hidden=32"]) == 2
    warning, err = capsys.readouterr().err.strip().splitlines()  # the warning stays under --quiet, then one error
    assert warning.startswith("warning: resuming ") and "(--force-resume)" in warning
    assert err.startswith("prvr-bench: error: ")
    assert f"checkpoint {SEED0}/last.pt holds another model than this run's" in err and "there, " in err


def test_resume_with_a_setting_that_changes_numbers_is_refused_unless_forced(capsys, here):
    before = files_under(here / "out")
    err = one_line_error(capsys, here, *RUN, "--resume", "--set", "train.lr=0.001", "--set", "loss.margin=0.3")
    assert "(loss.margin 0.1 -> 0.3, train.lr 0.0004 -> 0.001)" in err
    assert files_under(here / "out") == before
    assert main([*RUN, "--force-resume", "--set", "train.lr=0.001"]) == 0
    resumes = json.loads((here / RECORD).read_text())["resumes"]
    assert resumes == [{"from_epoch": 2, "changed": {"train.lr": [0.0004, 0.001]}, "forced": True}]


def test_resume_may_change_settings_that_leave_the_numbers_alone(here):
    before = json.loads((here / RECORD).read_text())
    assert main([*RUN, "--resume", "--set", "eval.chunk=7", "--set", "train.num_workers=0"]) == 0
    after = json.loads((here / RECORD).read_text())
    assert after["metrics"] == before["metrics"]
    assert after["resumes"] == [{"from_epoch": 2, "forced": False,
                                 "changed": {"eval.chunk": [1024, 7], "train.num_workers": [-1, 0]}}]


def test_checkpoint_without_stored_settings_needs_force_resume(capsys, here):
    last = here / SEED0 / "last.pt"
    state = torch.load(last, weights_only=True)
    del state["config"]  # as written before the settings were stored
    torch.save(state, last)
    err = one_line_error(capsys, here, *RUN, "--resume")
    assert f"checkpoint {SEED0}/last.pt stores no settings" in err and "--force-resume" in err
    assert main([*RUN, "--force-resume"]) == 0
    assert json.loads((here / RECORD).read_text())["resumes"] == [{"from_epoch": 2, "changed": None, "forced": True}]


# --------------------------------------------------------------------- leftovers
def test_failure_before_an_epoch_completes_removes_the_checkpoints_it_wrote(tmp_path, monkeypatch):
    def no_space(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Trainer, "save_state", no_space)  # best.pt is written, then last.pt fails
    with pytest.raises(OSError, match="No space left"):
        run_one(resolve("baseline", "sim-tiny", 0, EPOCHS), tmp_path)
    assert not (tmp_path / "checkpoints" / "sim-tiny" / "baseline" / "seed0").exists()
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.json"))


def test_failed_fresh_run_keeps_an_earlier_runs_checkpoints(here):
    before = files_under(here / SEED0)
    with pytest.raises(UserError, match="training diverged: loss is nan at epoch 0, step 1"):
        run_one(resolve("baseline", "sim-tiny", 0, EPOCHS), here / "out", hooks=[Poison(epoch=0)])
    assert files_under(here / SEED0) == before


# ------------------------------------------------------------------ output order
def test_early_stop_line_follows_its_epoch_line(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(progress, "log", lines.append)
    monkeypatch.setattr(progress, "warn", lambda m: lines.append(f"warning: {m}"))
    constant = {"R@1": 1.0, "R@5": 2.0, "R@10": 3.0, "R@100": 4.0, "SumR": 10.0}

    def evaluate(self, split, show=False, sink=None):  # one figure every epoch; the rankings from even scores
        if sink is not None:
            data = self.data[split]
            sink(0, torch.zeros(data.num_queries, data.num_videos), torch.full((data.num_queries,), data.num_videos))
        return dict(constant)

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=3", "train.patience=1"]), tmp_path)
    epoch_lines = [i for i, line in enumerate(lines) if line.startswith(("epoch ", "early stop"))]
    assert [lines[i].split(":")[0] for i in epoch_lines] == ["epoch 0", "epoch 1", "early stop after epoch 1"]
