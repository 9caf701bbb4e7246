import json

import pytest
import torch

from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.engine.records import load_record
from prvr.harness.engine.runner import run_one
from prvr.harness.engine.optim import lr_lambda

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


def _first_best(history, key):
    """The 0-based epoch of the first maximum of val[key] in a run history."""
    values = [h["val"][key] for h in history]
    return values.index(max(values))


@pytest.mark.parametrize("select_on, key, rule", [("vcmr", "VCMR SumR", "val VCMR SumR"), ("vr", "SumR", "val SumR")])
def test_selection_follows_train_select_on(tmp_path, select_on, key, rule):
    """XML localizes: under select_on=vcmr its tested epoch is the first best val VCMR SumR, under
    vr the first best val SumR; the record's protocol names the rule."""
    cfg = resolve("xml", "sim-charades", 0, ["data.scale=tiny", "train.epochs=4", "train.patience=10",
                                               f"train.select_on={select_on}"])
    record = run_one(cfg, tmp_path)
    assert all("VCMR SumR" in h["val"] for h in record["history"])
    assert record["best_epoch"] == _first_best(record["history"], key)
    assert record["metrics"]["val"][key] == max(h["val"][key] for h in record["history"])
    assert record["protocol"]["selection"] == rule
    assert record["protocol"]["follows_protocol"] is False  # 4 epochs is not the dataset's budget


def test_a_backbone_without_moments_is_selected_on_vr_sumr_under_vcmr(tmp_path):
    cfg = resolve("baseline", "sim-charades", 0, ["data.scale=tiny", "train.epochs=3", "train.select_on=vcmr"])
    record = run_one(cfg, tmp_path)
    assert record["best_epoch"] == _first_best(record["history"], "SumR")
    assert record["protocol"]["selection"] == "val SumR" and record["protocol"]["select_on"] == "vcmr"


def test_checkpoints_from_before_select_on_resume_as_vr(tmp_path):
    from prvr.harness.engine.trainer import resume_changes

    requested = resolve("baseline", "sim-tiny", 0, TINY).to_dict()
    stored = json.loads(json.dumps(requested))
    del stored["train"]["select_on"]  # a checkpoint written before the setting existed
    assert resume_changes(stored, requested, tmp_path / "last.pt", force=False) == {}
    requested["train"]["select_on"] = "vcmr"
    with pytest.raises(UserError, match="train.select_on 'vr' -> 'vcmr'"):
        resume_changes(stored, requested, tmp_path / "last.pt", force=False)
