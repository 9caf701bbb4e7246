"""Bad input, round three: the files the suite reads are untrusted (docs/bad-input.md, "Files
the suite reads"). Configs, records and logs are read bounded (size, depth, aliases), as
UTF-8 (a BOM dropped), and strictly (a key twice is an error, not a value lost); each case is
one line naming the file."""

import json
import os
import stat

import pytest

from prvr.harness.base import io
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError, read_json, read_yaml
from prvr.harness.cli.parity import read_official_log
from prvr.harness.engine.records import load_record


def test_a_yaml_section_given_twice_is_an_error_naming_both_lines(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lr: 0.001\nloss:\n  margin: 0.2\ntrain:\n  epochs: 3\n")
    with pytest.raises(UserError, match=r"config file .*c.yaml line 5 is not valid YAML: key 'train' appears twice "
                                        r"in one mapping \(lines 1 and 5\)") as err:
        resolve("baseline", "sim-tiny", 0, [], cfg)
    assert "\n" not in str(err.value)


def test_a_key_twice_inside_a_section_is_refused_too(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lr: 0.001\n  lr: 0.002\n")
    with pytest.raises(UserError, match=r"key 'lr' appears twice in one mapping \(lines 2 and 3\)"):
        resolve("baseline", "sim-tiny", 0, [], cfg)


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(12)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=f"more than {io.MAX_YAML_ALIASES} aliases"):
        read_yaml(bomb, "config file", "fix it")


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("train:\n  epochs: 2  # r\xe9sum\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"config file .*latin1.yaml is not UTF-8 text \(byte 23: b'\\xe9'\)"):
        resolve("baseline", "sim-tiny", 0, [], cfg)


def test_a_utf8_bom_is_dropped(tmp_path):
    cfg = tmp_path / "bom.yaml"
    cfg.write_bytes(b"\xef\xbb\xbftrain:\n  epochs: 2\n")
    assert resolve("baseline", "sim-tiny", 0, [], cfg).train.epochs == 2


def test_a_record_of_non_utf8_bytes_is_one_line(tmp_path):
    rec = tmp_path / "seed0.json"
    rec.write_bytes(b'{"method": "b\xff"}')
    with pytest.raises(UserError, match=r"run record .*seed0.json is not UTF-8 text \(byte 13"):
        load_record(rec)


def test_a_record_nested_without_bound_is_one_line(tmp_path):
    rec = tmp_path / "seed0.json"
    rec.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(UserError, match=r"nested deeper than Python can read"):
        load_record(rec)


def test_files_larger_than_their_bound_are_refused_before_they_are_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "MAX_JSON_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 2000}))
    with pytest.raises(UserError, match=r"is larger than 0.000953674 MB"):
        read_json(big, "run record")


def test_an_endless_official_log_is_refused(tmp_path):
    """A log larger than any log is refused unread beyond the bound; a device that never ends (a node with
    /dev/zero's numbers, made in the test's own folder) and a FIFO are never opened."""
    big = tmp_path / "log.txt"
    big.write_bytes(b"x" * (io.MAX_TEXT_BYTES + 1))
    with pytest.raises(UserError, match=r"official log .*log.txt is larger than"):
        read_official_log(big)
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"official log .*fifo.txt is a FIFO \(named pipe\), not a regular file"):
        read_official_log(fifo)
    zero = tmp_path / "zero"
    try:
        os.mknod(zero, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        return  # a device node needs root; the FIFO above covers the rule
    with pytest.raises(UserError, match=r"official log .*zero is a character device, not a regular file"):
        read_official_log(zero)


def test_a_number_in_an_official_log_that_is_not_one_is_named_with_its_line(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("Epoch: 0\n * recall sum: 1.2.3\nRsum: 100.0\n")
    with pytest.raises(UserError, match=r"log.txt line 2: '1.2.3' is not a number"):
        read_official_log(log)


# ------------------------------------------------------------ records the leaderboard reads
def _trained(tmp_path):
    from prvr.harness.engine.runner import run_one

    run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    return tmp_path / "runs" / "sim-tiny" / "baseline"


def _leaderboard_error(root):
    from prvr.harness.reports import leaderboard

    with pytest.raises(UserError) as err:
        leaderboard.rebuild(root, show=False)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_record_copied_under_another_seed_is_refused(tmp_path):
    folder = _trained(tmp_path)
    record = json.loads((folder / "seed0.json").read_text())
    (folder / "seed1.json").write_text(json.dumps({**record, "seed": 1}))
    err = _leaderboard_error(tmp_path)
    assert "seed1.json holds the same results as seed0.json" in err and "--skip-bad" in err


@pytest.mark.parametrize("change, names", [
    ({"seed": 0}, "names dataset, run and seed 'sim-tiny', 'baseline', 0, but its folder says sim-tiny, baseline, 1"),
    ({"dataset": "sim-tvr"}, "names dataset, run and seed 'sim-tvr', 'baseline', 1, but its folder says sim-tiny"),
    ({"run_name": "msl"}, "'msl'"),
])
def test_a_record_that_names_another_place_than_its_folder_is_refused(tmp_path, change, names):
    folder = _trained(tmp_path)
    record = json.loads((folder / "seed0.json").read_text())
    record["history"] = []  # not a copy: only its names are wrong
    (folder / "seed1.json").write_text(json.dumps({**record, "seed": 1, **change}))
    assert names in _leaderboard_error(tmp_path)


@pytest.mark.parametrize("key, value, why", [
    ("SumR", float("nan"), "nan is not a figure a run can have (finite, in [0, 400])"),
    ("SumR", float("inf"), "inf is not a figure a run can have"),
    ("SumR", 12345, "12345 is not a figure a run can have (finite, in [0, 400])"),
    ("R@1", 1e308, "1e+308 is not a figure a run can have (finite, in [0, 100])"),
])
def test_impossible_metrics_are_refused_naming_the_key(tmp_path, key, value, why):
    folder = _trained(tmp_path)
    record = json.loads((folder / "seed0.json").read_text())
    record["metrics"]["test"][key] = value
    (folder / "seed0.json").write_text(json.dumps(record))
    err = _leaderboard_error(tmp_path)
    assert f"seed0.json key 'metrics.test.{key}': {why}" in err


def test_a_best_epoch_after_the_last_epoch_run_is_refused(tmp_path):
    folder = _trained(tmp_path)
    record = json.loads((folder / "seed0.json").read_text())
    record["best_epoch"] = 999
    (folder / "seed0.json").write_text(json.dumps(record))
    assert "key 'best_epoch': 999 is not among the 1 epochs the record says were run" in _leaderboard_error(tmp_path)


def test_skip_bad_lists_the_skipped_records_under_the_table(tmp_path):
    from prvr.harness.reports import leaderboard

    folder = _trained(tmp_path)
    (folder / "seed1.json").write_bytes(b'{"method": "b\xff"}')
    rows = leaderboard.rebuild(tmp_path, skip_bad=True, show=False)
    assert [r["seeds"] for r in rows] == [[0]]
    md = (tmp_path / "leaderboard.md").read_text()
    assert "Skipped (`--skip-bad`): 1 file(s) under `runs/` that are not sound run records: run record " in md
    assert "seed1.json is not UTF-8 text (byte 13" in md


# ------------------------------------------------------------ real-layout text files
def test_a_bom_at_the_start_of_a_caption_file_is_dropped(tmp_path):
    from prvr.datasets.real.problems import Report
    from prvr.datasets.real.textdata import read_captions

    path = tmp_path / "tvrtrain.caption.txt"
    path.write_bytes("\ufeffvid1#enc#0 a man opens the door\nvid1#enc#1 he sits down\n".encode("utf-8"))
    report = Report(strict=True)
    caps = read_captions(path, report)
    assert [(c.qid, c.text, c.video) for c in caps] == [("vid1#enc#0", "a man opens the door", "vid1"),
                                                         ("vid1#enc#1", "he sits down", "vid1")]
    assert not report.errors


def test_a_record_missing_a_table_figure_is_refused(tmp_path):
    folder = _trained(tmp_path)
    record = json.loads((folder / "seed0.json").read_text())
    del record["metrics"]["test"]["R@5"]
    (folder / "seed0.json").write_text(json.dumps(record))
    assert "seed0.json key 'metrics.test.R@5': missing, the table shows it" in _leaderboard_error(tmp_path)


def test_a_sumr_that_is_not_the_sum_of_its_recalls_is_refused(tmp_path):
    """Round four: SumR 399 beside R@K that sum to less was averaged as a figure."""
    folder = _trained(tmp_path)
    record = json.loads((folder / "seed0.json").read_text())
    record["metrics"]["test"]["SumR"] = 399.0
    (folder / "seed0.json").write_text(json.dumps(record))
    assert "key 'metrics.test.SumR': 399.0 is not the sum of its R@1, R@5, R@10, R@100" in _leaderboard_error(tmp_path)


def test_a_record_of_another_method_in_a_runs_folder_is_refused(tmp_path):
    """Round four: a record under baseline/ that says method msl was accepted (a wrong dataset was not)."""
    folder = _trained(tmp_path)
    record = json.loads((folder / "seed0.json").read_text())
    record.pop("run_name", None)
    record["method"] = "msl"
    (folder / "seed0.json").write_text(json.dumps(record))
    assert "is of method 'msl', but its folder baseline is a run of baseline" in _leaderboard_error(tmp_path)
