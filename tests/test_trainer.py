import json

import pytest
import torch

from prvr.harness.config import resolve
from prvr.harness.io import UserError
from prvr.harness.records import load_record
from prvr.harness.runner import run_one
from prvr.harness.optim import lr_lambda

TINY = ["train.epochs=4", "train.patience=10"]


def _metrics(record):
    return json.dumps(record["metrics"], sort_keys=True)


def test_same_seed_same_metrics_and_another_seed_differs(tmp_path):
    a = run_one(resolve("baseline", "sim-tiny", 0, TINY), tmp_path / "a")
    b = run_one(resolve("baseline", "sim-tiny", 0, TINY), tmp_path / "b")
    c = run_one(resolve("baseline", "sim-tiny", 1, TINY), tmp_path / "c")
    assert _metrics(a) == _metrics(b)
    assert [h["loss"] for h in a["history"]] == [h["loss"] for h in b["history"]]
    assert [h["loss"] for h in a["history"]] != [h["loss"] for h in c["history"]]


class Kill:
    """A hook that stops training after a given epoch, as a killed process would."""

    def __init__(self, after_epoch: int) -> None:
        self.after_epoch = after_epoch

    def on_epoch_start(self, trainer, epoch):
        pass

    def on_step(self, trainer, step, out):
        pass

    def on_epoch_end(self, trainer, epoch, summary):
        if epoch == self.after_epoch:
            raise KeyboardInterrupt


def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    full = run_one(resolve("baseline", "sim-tiny", 0, TINY), tmp_path / "full")
    cfg = resolve("baseline", "sim-tiny", 0, TINY)
    with pytest.raises(KeyboardInterrupt):
        run_one(cfg, tmp_path / "killed", hooks=[Kill(after_epoch=1)])
    assert (tmp_path / "killed" / "checkpoints" / "sim-tiny" / "baseline" / "seed0" / "last.pt").exists()
    assert not list((tmp_path / "killed").glob("runs/**/*.json"))  # no record from a killed run
    resumed = run_one(resolve("baseline", "sim-tiny", 0, TINY), tmp_path / "killed", resume=True)
    assert _metrics(resumed) == _metrics(full)
    assert resumed["best_epoch"] == full["best_epoch"]


def test_record_has_the_keys_other_tools_read(tmp_path):
    record = run_one(resolve("baseline", "sim-tiny", 2, TINY), tmp_path, command="prvr-bench run")
    path = tmp_path / "runs" / "sim-tiny" / "baseline" / "seed2.json"
    stored = load_record(path)
    for key in ("method", "dataset", "seed", "config", "provenance", "metrics", "timings"):
        assert key in stored
    assert stored["seed"] == 2 and stored["config"]["train"]["epochs"] == 4
    for split in ("val", "test"):
        block = stored["metrics"][split]
        for k in ("R@1", "R@5", "R@10", "R@100", "SumR", "buckets", "oracle"):
            assert k in block
        assert block["SumR"] == pytest.approx(sum(block[f"R@{k}"] for k in (1, 5, 10, 100)))
    assert set(stored["metrics"]["test"]["buckets"]) == {"short", "medium", "long"}
    assert "SumR" in stored["metrics"]["test"]["oracle"]
    assert {"data", "train", "eval_test"} <= set(stored["timings"])
    assert stored["provenance"]["packages"]["torch"] == torch.__version__.split("+")[0] or \
        stored["provenance"]["packages"]["torch"].startswith(torch.__version__.split("+")[0])
    assert record["metrics"] == stored["metrics"]


def test_checkpoints_load_with_weights_only(tmp_path):
    run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    ckpt = tmp_path / "checkpoints" / "sim-tiny" / "baseline" / "seed0"
    for name in ("last.pt", "best.pt"):
        state = torch.load(ckpt / name, weights_only=True)
        assert "model" in state


def test_oracle_detector_trains_and_counts_unlabelled_relevant_pairs(tmp_path):
    rec = run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=2", "relations.name=oracle"]), tmp_path)
    assert rec["run_name"] == "baseline+oracle"
    assert sum(h["relations"]["unlabelled_relevant_pairs"] for h in rec["history"]) > 0


def test_oracle_refuses_a_dataset_without_ground_truth(tmp_path, monkeypatch):
    from prvr.datasets import sim
    from prvr.methods.relations.base import OracleDetector

    data = sim.generate("sim-tiny", resolve("baseline", "sim-tiny", 0).sim)
    for s in data.splits.values():
        s.relevance = None
    det = OracleDetector(resolve("baseline", "sim-tiny", 0, ["relations.name=oracle"]))
    with pytest.raises(UserError, match="needs ground-truth relevance.*sim-tiny"):
        det.setup(data)


def test_learning_rate_warms_up_then_decays():
    f = lr_lambda(100, 0.1, "cosine")
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(50) < 1.0 and f(99) < 0.01
    g = lr_lambda(100, 0.1, "linear")
    assert g(55) == pytest.approx(0.5)
