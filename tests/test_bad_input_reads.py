"""Bad input, round four: the files the suite reads go through one bounded reader (`io.read_text`):
regular files only (a FIFO, a folder or a device is named and never opened, so nothing hangs), a size
bound, UTF-8 with a BOM dropped, one line naming the file. Relevance files, census tables, records,
configs and logs alike; and `$PRVR_DEVICE` is checked as `train.device` is; `--quiet` keeps warnings.
The special files are made in the test's own temporary folder."""

import json
import os

import pytest

from prvr.datasets.real.relevance import read_relevance
from prvr.harness.base import progress
from prvr.harness.base.io import UserError, read_json
from prvr.harness.engine.config import resolve
from prvr.harness.reports.world_calibration import read_worlds

CENSUS_HEAD = ("dataset,world,split,queries,videos,phi,theta,precision,recall,base_rate,lift,"
               "multi_relevant_share,relevant_per_query")


@pytest.mark.parametrize("reader", ["record", "relevance", "census"])
def test_a_fifo_or_a_folder_is_named_and_never_read(tmp_path, reader):
    read = {"record": lambda p: read_json(p, "run record"), "relevance": read_relevance,
            "census": lambda p: read_worlds(p, None)}[reader]
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"input is a FIFO \(named pipe\), not a regular file, so it is not read"):
        read(fifo)  # returns at once: a FIFO opened for reading would block until a writer came
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(UserError, match=r"folder is a folder, not a regular file"):
        read(folder)


def test_a_relevance_file_that_is_not_utf8_or_nested_without_bound_is_one_line(tmp_path):
    bad = tmp_path / "r.jsonl"
    bad.write_bytes(b'{"query_id": "q\xff", "relevant": ["v1"]}\n')
    with pytest.raises(UserError, match=r"relevance file .*r.jsonl is not UTF-8 text \(byte 15"):
        read_relevance(bad)  # was decoded with replacement characters without a word
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"query_id": "q0", "relevant": ["v1"]}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(UserError, match=r"deep.jsonl.*line 2.*nested deeper than Python can read"):
        read_relevance(deep)  # was a RecursionError


def test_a_relevance_file_with_a_bom_reads_as_without(tmp_path):
    line = json.dumps({"query_id": "q0", "relevant": ["v1", "v2"]}) + "\n"
    plain, bom = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    plain.write_text(line)
    bom.write_bytes(b"\xef\xbb\xbf" + line.encode())
    assert read_relevance(plain).entries == read_relevance(bom).entries


@pytest.mark.parametrize("value, says", [("nan", "'nan', not a figure a census gives"),
                                         ("-0.5", "'-0.5', not a figure a census gives"),
                                         ("inf", "'inf', not a figure")])
def test_a_census_figure_a_census_cannot_give_is_one_line(tmp_path, value, says):
    table = tmp_path / "t.csv"
    table.write_text(f"{CENSUS_HEAD}\ntvr,,val,10,5,sent,0.7,0.01,{value},0.0001,100,0.1,1.2\n")
    with pytest.raises(UserError, match=rf"t.csv, line 2: column 'recall' is {says}"):
        read_worlds(table, None)


def test_a_census_table_with_a_field_past_the_csv_limit_is_one_line(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text(f"{CENSUS_HEAD}\ntvr,{'x' * 200_000},val,10,5,sent,0.7,0.01,0.2,0.0001,100,0.1,1.2\n")
    with pytest.raises(UserError, match=r"census table .*t.csv is not a census CSV \(field larger than field limit"):
        read_worlds(table, None)


@pytest.mark.parametrize("value, says", [("garbage", "must be auto, cpu, cuda or cuda:N"),
                                         ("cuda:7", "cuda:7")])
def test_prvr_device_is_checked_as_train_device_is(monkeypatch, value, says):
    monkeypatch.setenv("PRVR_DEVICE", value)
    if value.startswith("cuda"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 7:
            pytest.skip("this machine has a cuda:7")
    with pytest.raises(UserError, match=rf"\$PRVR_DEVICE .*{says}.*PRVR_DEVICE=cpu") as e:
        resolve("baseline", "sim-tiny", 0, [])
    assert "\n" not in str(e.value)


def test_quiet_keeps_warnings(capsys):
    """--quiet removes progress bars and the running log, not a warning (was: `--resume` with no state to
    resume from said nothing under --quiet)."""
    was = progress.is_enabled()
    progress.set_enabled(False)
    try:
        progress.log("a running log line")
        progress.warn("--resume: no run state to resume from")
    finally:
        progress.set_enabled(was)
    err = capsys.readouterr().err
    assert "warning: --resume: no run state" in err and "running log" not in err


@pytest.mark.parametrize("argv, says", [(["--scale", "garbage"], "garbage"), (["--threads", "-1"], "--threads"),
                                        (["--device", "cuda:99"], "cuda:99")])
def test_rehearse_checks_its_arguments_before_any_phase(tmp_path, capsys, argv, says):
    """Round four: `rehearse --scale garbage` or `--threads -1` started its phases, then replaced
    OUT/rehearsal.{md,csv,json} with a failed table; now one line, and the old table stays."""
    from prvr.harness.cli import main

    (tmp_path / "rehearsal.md").write_text("the committed table\n")
    assert main(["rehearse", "--out", str(tmp_path), "--work", str(tmp_path / "w"), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "rehearsal.md").read_text() == "the committed table\n" and not (tmp_path / "w").exists()


def test_a_simulated_worlds_census_given_as_the_real_split_is_refused(tmp_path, capsys):
    """Round four: a simulated world's census passed as --real was labelled "the real split (verified
    relevance)" in the calibration table."""
    from prvr.harness.cli import main

    sim = tmp_path / "sim.csv"
    sim.write_text(f"{CENSUS_HEAD}\nsim-tvr,,test,10,5,sent,0.7,0.01,0.2,0.0001,100,0.1,1.2\n")
    assert main(["calibrate-world", "--world", "sim-tvr", "--real", str(sim), "--tables", str(sim),
                 "--out", str(tmp_path / "out")]) == 2
    assert "is a census of the simulated dataset sim-tvr, not of a real split" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
