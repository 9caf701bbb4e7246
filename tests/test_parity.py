"""`prvr-bench parity`: reading the official MS-SL family log, the side-by-side report."""

from __future__ import annotations

import json

import pytest

from prvr.harness.cli import main
from prvr.harness.base.io import UserError
from prvr.harness.cli.parity import read_official_log, shown_command

# The shape of the official code family's log.txt (timestamps and the logger's prefix), written
# here by hand: per evaluation three branch recall sums (clip, frame, fused), then the epoch block.
LOG = """\
2026-01-01 00:00:00,000 - INFO - set seed: 1
2026-01-01 00:00:00,000 - INFO - Loading Model ......
2026-01-01 00:01:00,000 - INFO -  * recall sum: 90.6
2026-01-01 00:01:00,000 - INFO -  * recall sum: 112.2
2026-01-01 00:01:00,000 - INFO -  * recall sum: 107.1
2026-01-01 00:01:00,000 - INFO - Epoch:  0    New Best Model !!!
2026-01-01 00:01:00,000 - INFO - Average Loss: 2.7884
2026-01-01 00:01:00,000 - INFO - Rsum: 107.1
2026-01-01 00:01:00,000 - INFO - Best: R@1: 2.2 R@5: 10.8 R@10: 17.4 R@100: 76.7 Rsum: 107.1
2026-01-01 00:02:00,000 - INFO -  * recall sum: 150.0
2026-01-01 00:02:00,000 - INFO -  * recall sum: 160.0
2026-01-01 00:02:00,000 - INFO -  * recall sum: 170.5
2026-01-01 00:02:00,000 - INFO - Epoch:  1    New Best Model !!!
2026-01-01 00:02:00,000 - INFO - Rsum: 170.5
2026-01-01 00:02:00,000 - INFO - Best: R@1: 9.0 R@5: 20.0 R@10: 30.0 R@100: 90.0 Rsum: 170.5
2026-01-01 00:03:00,000 - INFO - Testing from: results/best.ckpt
2026-01-01 00:03:00,000 - INFO -  * recall sum: 140.0
2026-01-01 00:03:00,000 - INFO -  * recall sum: 150.0
2026-01-01 00:03:00,000 - INFO -  * recall sum: 161.0
2026-01-01 00:03:00,000 - INFO - Rsum: 161.0
"""


def test_official_log_epochs_parts_and_test_block(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(LOG)
    out = read_official_log(log)
    assert [(v["epoch"], v["SumR"]) for v in out["val"]] == [(0, 107.1), (1, 170.5)]
    assert out["val"][0]["parts"] == {"clip": 90.6, "frame": 112.2, "fused": 107.1}
    assert out["test"] == {"SumR": 161.0, "parts": {"clip": 140.0, "frame": 150.0, "fused": 161.0}}
    assert out["seed"] == 1


def test_named_branch_lines_are_read_as_parts(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(" * clip_scale R@1/5/10/100: [1, 2, 3, 4] rsum: 10.0\n"
                   " * frame_scale R@1/5/10/100: [1, 2, 3, 4] rsum: 20.0\n"
                   " * combined(0.7*clip+0.3*frame) R@1/5/10/100: [1, 2, 3, 4] rsum: 30.0\n"
                   "Epoch:  0    New Best Model !!!\nRsum: 30.0\n")
    out = read_official_log(log)
    assert out["val"][0]["parts"] == {"clip": 10.0, "frame": 20.0, "fused": 30.0}
    assert out["seed"] is None  # a log without the `set seed:` line


def test_a_log_without_epoch_blocks_is_one_clear_error(tmp_path):
    log = tmp_path / "train.log.txt"
    log.write_text("2026 [Epoch] 000 [Loss] clip_nce_loss 1.0\n")
    with pytest.raises(UserError, match=r"train\.log\.txt has no epoch block"):
        read_official_log(log)
    log.write_text("Rsum: 12.0\n")
    with pytest.raises(UserError, match=r"line 1: a validation 'Rsum:' before any 'Epoch: N'"):
        read_official_log(log)


def test_shown_command_hides_this_machines_paths():
    assert (shown_command("prvr-bench run --method ral --dataset tvr --data-root /data/x/export --out /tmp/o --seed 0")
            == "prvr-bench run --method ral --dataset tvr --data-root EXPORT_DIR --out OUT --seed 0")
    assert (shown_command("prvr-bench run --method msl --set train.init_weights=/tmp/a/init_s0.npz --seed 0")
            == "prvr-bench run --method msl --set train.init_weights=init_s0.npz --seed 0")


def _record(path, val_sums, test_sum, vcmr_sums=None, test_vcmr=None):
    """A run record of `ral` on tvr; with `vcmr_sums`, of `xml`, each epoch's VCMR SumR beside its SumR."""
    path.parent.mkdir(parents=True, exist_ok=True)
    method = "ral" if vcmr_sums is None else "xml"
    metrics = {"val": {"SumR": max(val_sums)}, "test": {"SumR": test_sum}}
    history = [{"epoch": e, "val": {"SumR": s}} for e, s in enumerate(val_sums)]
    if vcmr_sums is not None:
        metrics["test"]["VCMR SumR"] = test_vcmr
        for h, v in zip(history, vcmr_sums):
            h["val"]["VCMR SumR"] = v
    path.write_text(json.dumps({
        "method": method, "dataset": "tvr", "seed": 0, "run_name": method, "config": {},
        "provenance": {"git_revision": "abc1234def"},
        "command": f"prvr-bench run --method {method} --dataset tvr --data-root /somewhere/export --seed 0 --out /elsewhere",
        "metrics": metrics, "history": history}))


def test_report_side_by_side_with_the_verdict(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(LOG)
    rec = tmp_path / "o" / "runs" / "tvr" / "ral" / "seed0.json"
    _record(rec, [100.0, 171.5], 160.0)
    assert main(["parity", "--official-log", str(log), "--record", str(rec), "--name", "ral-e2",
                 "--out", str(tmp_path / "res")]) == 0
    text = (tmp_path / "res" / "parity" / "ral-e2.md").read_text()
    assert "against the official code's run (seed 1, from its log) on the same exported data" in text
    assert "| 0 | 107.1 | 100.0 | -7.1 | 90.6 | 112.2 | 107.1 |" in text
    assert "| 1 | 170.5 | 171.5 | +1.0 | 150.0 | 160.0 | 170.5 |" in text
    assert "ours 171.5 (epoch 1): Δ +1.0, within the 2 SumR tolerance." in text
    assert "official 161.0, ours 160.0 (official parts: clip 140.0, frame 150.0, fused 161.0)" in text
    assert "/somewhere" not in text and "/elsewhere" not in text and "--data-root EXPORT_DIR" in text
    _record(rec, [100.0, 174.0], 160.0)
    main(["parity", "--official-log", str(log), "--record", str(rec), "--name", "ral-e2",
          "--out", str(tmp_path / "res")])
    assert "Δ +3.5, outside the 2 SumR tolerance." in (tmp_path / "res" / "parity" / "ral-e2.md").read_text()
    assert "given weights" not in text  # a seeded run says nothing of a start
    record = json.loads(rec.read_text())  # a run from one start with the official code (train.init_weights)
    record["provenance"]["init_weights"] = {"file": "init.npz", "sha256": "0123456789abcdef" * 4}
    rec.write_text(json.dumps(record))
    main(["parity", "--official-log", str(log), "--record", str(rec), "--name", "ral-e2",
          "--out", str(tmp_path / "res")])
    assert ("Ours started from the given weights `init.npz` (sha256 0123456789ab), not from its seeded init."
            in (tmp_path / "res" / "parity" / "ral-e2.md").read_text())
    assert json.loads((tmp_path / "res" / "parity" / "ral-e2.json").read_text())["started_from"] == "0123456789abcdef" * 4


def test_bad_name_is_refused(tmp_path, capsys):
    assert main(["parity", "--official-log", "x", "--record", "y", "--name", "../up"]) == 2
    assert "--name '../up'" in capsys.readouterr().err


def test_an_official_run_that_stopped_early_is_compared_over_the_epochs_it_reached(tmp_path):
    """The official HLFormer run was killed for memory after its epoch-5 validation: its best is compared
    with ours over the epochs both logged, not with ours' best over epochs it never reached, and said."""
    log = tmp_path / "log.txt"
    log.write_text(LOG.split("Testing from")[0].rsplit("\n", 1)[0] + "\n")  # epochs 0-1, no test block
    rec = tmp_path / "o" / "runs" / "tvr" / "ral" / "seed0.json"
    _record(rec, [100.0, 171.5, 230.0], 225.0)
    assert main(["parity", "--official-log", str(log), "--record", str(rec), "--name", "ral-cut",
                 "--out", str(tmp_path / "res")]) == 0
    text = (tmp_path / "res" / "parity" / "ral-cut.md").read_text()
    assert "ours 171.5 (epoch 1): Δ +1.0, within the 2 SumR tolerance." in text
    assert "the official log's last validation is epoch 1; ours' is epoch 2" in text
    assert "compared over epochs 0-1, which both ran" in text and "| 2 |  | 230.0 |  |" in text
    assert "official not in the log, ours 225.0" in text


# ----------------------------------------------------------------------------- TVRetrieval (XML)
def _metrics(vr, vcmr_05, vcmr_07, r5=7.0):
    """A TVRetrieval metrics object: VR r1 r5 r10 r100, VCMR at tIoU 0.5 and 0.7 (r1 r10 r100 given,
    r5 the same `r5` at both, which our VCMR SumR leaves out), SVMR present as the code writes it."""
    vcmr = {}
    for iou, (r1, r10, r100) in (("0.5", vcmr_05), ("0.7", vcmr_07)):
        vcmr.update({f"{iou}-r1": r1, f"{iou}-r5": r5, f"{iou}-r10": r10, f"{iou}-r100": r100})
    return {"VCMR": vcmr, "SVMR": dict(vcmr), "VR": dict(zip(("r1", "r5", "r10", "r100"), vr))}


def _eval_log(path, epochs):
    path.write_text("".join(f"2026_01_01_00_0{e}_00 [Epoch] {e:03d} [Metrics] {json.dumps(m)}\n"
                            for e, m in enumerate(epochs)))


def test_a_tvretrieval_eval_log_gives_vr_and_vcmr_sums_per_epoch(tmp_path):
    log = tmp_path / "eval.log.txt"
    _eval_log(log, [_metrics((2.0, 10.0, 20.0, 70.0), (1.0, 5.0, 30.0), (0.5, 2.0, 15.0)),
                    _metrics((4.0, 16.0, 30.0, 80.0), (2.0, 8.0, 40.0), (1.0, 4.0, 20.0))])
    out = read_official_log(log)
    assert out["format"] == "tvretrieval" and out["test"] is None and out["seed"] is None
    # VR SumR: r1 + r5 + r10 + r100; VCMR SumR: r1 + r10 + r100 at 0.5 and 0.7 (r5 is not our sum's)
    assert [(v["epoch"], v["SumR"], v["VCMR SumR"]) for v in out["val"]] == [(0, 102.0, 53.5), (1, 130.0, 75.0)]


def test_xml_parity_compares_vr_and_vcmr_and_reads_the_official_test_file(tmp_path):
    log = tmp_path / "eval.log.txt"
    _eval_log(log, [_metrics((2.0, 10.0, 20.0, 70.0), (1.0, 5.0, 30.0), (0.5, 2.0, 15.0)),
                    _metrics((4.0, 16.0, 30.0, 80.0), (2.0, 8.0, 40.0), (1.0, 4.0, 20.0))])
    test = tmp_path / "inference_test_metrics.json"
    test.write_text(json.dumps(_metrics((3.0, 14.0, 28.0, 79.0), (2.0, 7.0, 38.0), (1.0, 3.0, 19.0)), indent=4))
    rec = tmp_path / "o" / "runs" / "tvr" / "xml" / "seed0.json"
    _record(rec, [101.0, 131.0], 125.0, vcmr_sums=[50.0, 78.5], test_vcmr=70.0)
    assert main(["parity", "--official-log", str(log), "--official-test", str(test), "--record", str(rec),
                 "--name", "xml-e2", "--out", str(tmp_path / "res")]) == 0
    text = (tmp_path / "res" / "parity" / "xml-e2.md").read_text()
    assert "| epoch | official val SumR | ours val SumR | Δ (ours − official) | official val VCMR SumR |" in text
    assert "| 0 | 102.0 | 101.0 | -1.0 | 53.5 | 50.0 | -3.5 |" in text
    assert "| 1 | 130.0 | 131.0 | +1.0 | 75.0 | 78.5 | +3.5 |" in text
    assert "Best validation SumR: official 130.0 (epoch 1), ours 131.0 (epoch 1): Δ +1.0, within" in text
    assert "Best validation VCMR SumR: official 75.0 (epoch 1), ours 78.5 (epoch 1): Δ +3.5, outside" in text
    assert "Test SumR of each best checkpoint: official 124.0, ours 125.0." in text
    assert "Test VCMR SumR of each best checkpoint: official 70.0, ours 70.0" in text
    side = json.loads((tmp_path / "res" / "parity" / "xml-e2.json").read_text())
    assert side["sumr"]["official_test"] == 124.0 and side["sumr"]["delta"] == 1.0
    assert side["sumr"]["official_best_vcmr"] == 75.0 and side["sumr"]["ours_best_vcmr"] == 78.5


@pytest.mark.parametrize("line, message", [
    ("2026 [Epoch] 001 [Metrics] {\"VR\": ", r"line 2: its JSON does not parse"),
    ("2026 [Epoch] 001 [Metrics] {\"VR\": {\"r1\": NaN}}", r"line 2: its JSON does not parse \(NaN is not a number"),
    ("2026 [Epoch] 001 [Metrics] {\"VCMR\": {}}", r"line 2: no VR metrics object"),
    ("2026 [Epoch] one [Metrics] {}", r"line 2: not '<time> \[Epoch\] N \[Metrics\] \{...\}'"),
])
def test_a_bad_line_of_a_tvretrieval_log_is_one_error_naming_it(tmp_path, line, message):
    log = tmp_path / "eval.log.txt"
    _eval_log(log, [_metrics((2.0, 10.0, 20.0, 70.0), (1.0, 5.0, 30.0), (0.5, 2.0, 15.0))])
    log.write_text(log.read_text() + line + "\n")
    with pytest.raises(UserError, match=message) as err:
        read_official_log(log)
    assert "eval.log.txt" in str(err.value) and "\n" not in str(err.value)


def test_an_official_test_file_must_hold_every_figure_and_go_with_a_tvretrieval_log(tmp_path, capsys):
    metrics = _metrics((2.0, 10.0, 20.0, 70.0), (1.0, 5.0, 30.0), (0.5, 2.0, 15.0))
    log = tmp_path / "eval.log.txt"
    _eval_log(log, [metrics])
    rec = tmp_path / "seed0.json"
    _record(rec, [101.0], 100.0)
    del metrics["VCMR"]["0.7-r100"]
    test = tmp_path / "test_metrics.json"
    test.write_text(json.dumps(metrics))
    args = ["parity", "--official-test", str(test), "--record", str(rec), "--name", "x", "--out", str(tmp_path / "r")]
    assert main([*args, "--official-log", str(log)]) == 2
    assert "test_metrics.json: VCMR 0.7-r100 is 'None', not a finite number" in capsys.readouterr().err
    ms_sl = tmp_path / "log.txt"
    ms_sl.write_text(LOG)
    assert main([*args, "--official-log", str(ms_sl)]) == 2
    assert "only a TVRetrieval eval.log.txt takes a test metrics file" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
