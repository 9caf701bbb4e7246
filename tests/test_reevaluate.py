"""`prvr-bench evaluate`: stored runs re-ranked from their best checkpoints."""

import json
from pathlib import Path

import pytest

from prvr.harness.cli import main
from prvr.harness.base.io import UserError
from prvr.harness.engine.records import record_path
from prvr.harness.cli.reevaluate import SUMMARY, evaluate_runs
from prvr.harness.engine.runner import run_one


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from prvr.harness.engine.config import resolve

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


@pytest.fixture(scope="module")
def v2_run(tmp_path_factory):
    from prvr.harness.engine.config import resolve

    out = tmp_path_factory.mktemp("v2")
    rec = run_one(resolve("gmmformer2", "sim-tiny", 0, ["train.epochs=1"]), out)
    return record_path(out, "sim-tiny", rec["run_name"], 0)


def test_fusion_weights_equal_the_blocks_weights_recomputed_from_their_inputs(v2_run):
    """The weights read while encoding equal a naive recomputation: each dynamic block's own
    branches and weight head applied again to the inputs it was given."""
    import torch

    from prvr.datasets.loader import Batcher
    from prvr.harness.engine.evaluate import encode_split
    from prvr.harness.cli.fusion_weights import rows as fusion_weight_rows
    from prvr.harness.cli.reevaluate import StoredRun, split_data
    from prvr.methods.backbones.blocks import DynamicGMMBlock, full_mask

    rows = fusion_weight_rows([v2_run])
    assert {r["block"] for r in rows} == {"clip_block", "frame_block"}
    run = StoredRun(v2_run)
    data = split_data(run, "test", {})
    model = run.model(data)
    inputs: dict[str, list] = {}
    for name, m in model.named_modules():
        if isinstance(m, DynamicGMMBlock):
            m.register_forward_pre_hook(lambda mod, args, name=name: inputs.setdefault(name, []).append(
                (args[0], full_mask(args[0]) if args[1] is None else args[1], args[2])))
    with torch.no_grad():
        encode_split(model, data["test"], Batcher(data["test"], run.cfg.data), run.device)
        for r in rows:
            block = dict(model.named_modules())[r["block"]]
            w = torch.cat([DynamicGMMBlock.branch_weights(block, block.branches(x, mask), mask, token.reshape(-1))
                           for x, mask, token in inputs[r["block"]]], dim=1).double()
            assert r["positions"] == w.shape[1] == sum(int(a[1].sum()) for a in inputs[r["block"]])
            assert r["mean"] == pytest.approx(w.mean(1).tolist(), abs=1e-12)
            assert r["max_mean"] == pytest.approx(w.max(0).values.mean().item(), abs=1e-12)
            assert sum(r["mean"]) == pytest.approx(1.0)
            assert len(r["mean"]) == len(r["widths"]) == 8


def test_fusion_weights_command_and_its_errors(v2_run, two_runs, capsys):
    assert main(["evaluate", str(v2_run), "--fusion-weights"]) == 0
    printed = capsys.readouterr().out
    assert "| gmmformer2 seed 0 | frame_block |" in printed and "(plain)" in printed and "| 0.125 |" in printed
    assert main(["evaluate", str(two_runs[1][0]), "--fusion-weights"]) == 2
    assert "no dynamic GMM block" in capsys.readouterr().err
    assert main(["evaluate", str(v2_run), "--fusion-weights", "--parts"]) == 2
    assert "leave out --parts" in capsys.readouterr().err


def test_score_levels_are_the_matrices_statistics(two_runs, tmp_path, capsys):
    """--score-levels: per score, the labelled pairs' mean and the mean / std / min / max over
    all pairs of the matrix the evaluator ranks, recomputed here from score_matrices."""
    import numpy as np

    from prvr.datasets.loader import Batcher
    from prvr.harness.engine.evaluate import score_matrices
    from prvr.harness.cli.reevaluate import StoredRun, score_level_rows
    from prvr.harness.base.registry import DATASETS

    _, paths = two_runs
    rows = score_level_rows([paths[0]], parts=True)
    run = StoredRun(paths[0], "cpu")
    data = DATASETS.get(run.cfg.dataset).load(run.cfg)
    split = data["test"]
    want = score_matrices(run.model(data), split, Batcher(split, run.cfg.data), run.device, run.cfg.eval.chunk)
    assert {r["score"] for r in rows} == set(want) >= {"clip", "frame", "fused"}
    for r in rows:
        m = want[r["score"]].double().numpy()
        assert r["labelled"] == pytest.approx(np.mean([m[q, v] for q, v in enumerate(split.query_video)]))
        assert (r["mean"], r["min"], r["max"]) == pytest.approx((m.mean(), m.min(), m.max()))
        assert r["std"] == pytest.approx(m.std(ddof=1)) and r["pairs"] == m.size
    assert main(["evaluate", str(paths[0]), "--score-levels", "--json", str(tmp_path / "levels.json")]) == 0
    printed = capsys.readouterr().out
    assert "| baseline seed 0 | fused |" in printed and "| baseline seed 0 | clip |" not in printed
    assert json.loads((tmp_path / "levels.json").read_text())["rows"][0]["score"] == "fused"
    assert main(["evaluate", str(paths[0]), "--score-levels", "--ensemble"]) == 2
    assert "leave out --ensemble" in capsys.readouterr().err


def test_a_checkpoint_of_another_training_of_the_run_is_refused(two_runs, tmp_path):
    """An interrupted re-run writes the run's best.pt again: evaluating the record from it would
    report that training's model under the record's name. The best checkpoint names the epoch
    and val figure it won; one written before that is checked against last.pt beside it."""
    import shutil

    import torch

    out, paths = two_runs
    shutil.copytree(out, tmp_path / "out")
    record = tmp_path / "out" / paths[0].relative_to(out)
    best = tmp_path / "out" / "checkpoints" / "sim-tiny" / "baseline" / "seed0" / "best.pt"
    state = torch.load(best, weights_only=True)
    kept = json.loads(record.read_text())
    assert state["best"]["epoch"] == kept["best_epoch"] and state["best"]["select"] == "SumR"
    assert state["best"]["score"] == pytest.approx(kept["metrics"]["val"]["SumR"])
    assert evaluate_runs([record])[0]["metrics"]["SumR"] == kept["metrics"]["test"]["SumR"]

    torch.save({**state, "best": {**state["best"], "epoch": 3, "score": 12.5}}, best)
    with pytest.raises(UserError, match=r"checkpoint .*best\.pt is from another training of this run than record "
                                        r".*seed0\.json: best epoch 3 \(val SumR 12\.50\) against the record's 0 \(val SumR "
                                        r".*re-run the run"):
        evaluate_runs([record])

    # written before the stamp: the run state beside it decides
    torch.save({"model": state["model"]}, best)
    last = best.with_name("last.pt")
    run_state = torch.load(last, weights_only=True)
    torch.save({**run_state, "best_epoch": run_state["best_epoch"] + 1}, last)
    with pytest.raises(UserError, match=r"best\.pt \(by its run state last\.pt\) is from another training"):
        evaluate_runs([record])
    torch.save(run_state, last)
    assert evaluate_runs([record])[0]["metrics"]["SumR"] == kept["metrics"]["test"]["SumR"]
    last.unlink()  # nothing to check against: evaluated as before the stamp existed
    assert evaluate_runs([record])[0]["metrics"]["SumR"] == kept["metrics"]["test"]["SumR"]


def test_a_checkpoint_of_another_method_is_named_as_such(two_runs, tmp_path):
    """Another method's best.pt in the run's folder is that method's checkpoint, not "another
    training of this run": its weights are named as another model's, or its stamp's method."""
    import shutil

    import torch

    from prvr.harness.engine.config import resolve
    from prvr.harness.engine.runner import run_one

    out, paths = two_runs
    shutil.copytree(out, tmp_path / "out")
    record = tmp_path / "out" / paths[0].relative_to(out)
    best = tmp_path / "out" / "checkpoints" / "sim-tiny" / "baseline" / "seed0" / "best.pt"
    run_one(resolve("arl", "sim-tiny", 0, ["train.epochs=1"]), tmp_path / "arl")
    shutil.copy(tmp_path / "arl" / "checkpoints" / "sim-tiny" / "arl" / "seed0" / "best.pt", best)
    with pytest.raises(UserError, match=r"checkpoint .*best\.pt holds another model than this run's"):
        evaluate_runs([record])
    state = torch.load(tmp_path / "out" / "checkpoints" / "sim-tiny" / "baseline" / "seed1" / "best.pt",
                       weights_only=True)
    torch.save({**state, "best": {**state["best"], "method": "msl"}}, best)  # the same weights, another method's stamp
    with pytest.raises(UserError, match=r"best\.pt is a checkpoint of method 'msl', not of record .*seed0\.json's "
                                        r"'baseline'"):
        evaluate_runs([record])
