"""`prvr-bench detection`: per-epoch detection figures averaged over a run's seeds."""

import pytest

from prvr.harness.cli import main
from prvr.harness.cli.detection import epoch_rows
from prvr.harness.engine.records import record_path, write_record


def _record(seed, precision):
    history = [{"epoch": 0, "relations": {"active": False}}]
    for epoch, p in enumerate(precision, start=1):
        history.append({"epoch": epoch, "relations": {
            "active": True,
            "theta": {"tau_s": 0.4, "tau_u": 0.1, "tau_s_frame": 0.2, "tau_u_frame": 0.1, "frame_share": 0.25},
            "union": {"per_query": 1.0 + seed, "precision": p, "recall": 0.5}}})
    return {"method": "arl", "dataset": "sim-x", "seed": seed, "run_name": "arl", "config": {}, "provenance": {},
            "metrics": {"val": {}, "test": {}}, "history": history}


def test_epochs_average_over_seeds_and_skip_inactive_epochs():
    rows = epoch_rows([_record(0, [0.1, None]), _record(1, [0.3, 0.2])], "union")
    assert [r["epoch"] for r in rows] == [2, 3]  # 1-based; the warm-up epoch has no report
    assert rows[0]["precision"] == pytest.approx(0.2) and rows[0]["seeds"] == 2
    assert rows[1]["precision"] == pytest.approx(0.2)  # None (no pair detected) is left out
    assert rows[0]["per_query"] == pytest.approx(1.5) and rows[0]["frame_share"] == 0.25


def test_command_writes_the_table(tmp_path, capsys):
    for seed in (0, 1):
        write_record(record_path(tmp_path, "sim-x", "arl", seed), _record(seed, [0.1, 0.2]))
    main(["detection", "--run", "arl", "--dataset", "sim-x", "--out", str(tmp_path)])
    md = (tmp_path / "ablations" / "sim-x" / "arl_detection.md").read_text()
    assert "| 2 | 2 | 1.5000 | 0.1000 | 0.5000 | 0.2500 |" in md
    assert f"prvr-bench detection --run arl --dataset sim-x --part union --out {tmp_path}" in md
    assert main(["detection", "--run", "nosuch", "--dataset", "sim-x", "--out", str(tmp_path)]) == 2
    assert "no run records under" in capsys.readouterr().err


def test_ablation_delta_is_paired_over_shared_seeds():
    from prvr.harness.cli.ablate import _fmt_delta, paired_delta

    d = paired_delta({0: 10.0, 1: 12.0, 2: 9.0}, {0: 8.0, 1: 11.0})  # seed 2 has no partner
    assert d[0] == pytest.approx(1.5) and d[2] == 2 and 0 < d[1] < 1
    assert _fmt_delta(paired_delta({0: 10.0}, {0: 8.0})) == "+2.0 (1 seed)"
    assert paired_delta({0: 1.0}, {1: 1.0}) is None


@pytest.mark.parametrize("edit, message", [
    (lambda h: h[1].update(epoch="one"), "key 'history[1].epoch': 'one' is not an epoch number"),
    (lambda h: h[1]["relations"]["union"].update(precision=True),
     "key 'history[1].relations.union.precision': True is not a share in [0, 1]"),
    (lambda h: h[1]["relations"]["union"].update(recall=7.5),
     "key 'history[1].relations.union.recall': 7.5 is not a share in [0, 1]"),
    (lambda h: h[2]["relations"]["union"].update(recall=-3),
     "key 'history[2].relations.union.recall': -3 is not a share in [0, 1]"),
    (lambda h: h[1]["relations"]["theta"].update(tau_s="high"),
     "key 'history[1].relations.theta.tau_s': 'high' is not a finite number"),
])
def test_a_report_figure_that_is_not_one_is_named(tmp_path, capsys, edit, message):
    record = _record(0, [0.1, 0.2])
    edit(record["history"])
    write_record(record_path(tmp_path, "sim-x", "arl", 0), record)
    assert main(["detection", "--run", "arl", "--dataset", "sim-x", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "ablations").exists()
