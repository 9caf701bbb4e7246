"""`prvr-bench profile --only-methods`: the rows of the named methods renewed, every other row and the
evaluator speed kept as stored in profile.json, the stored file read as untrusted input."""

import csv
import io
import json
import os

import pytest

from prvr.harness.cli import main
from prvr.harness.base.io import UserError
from prvr.harness.profiling.stored import read_profile

QUICK = ["profile", "--quick", "--videos", "4", "--skip-training", "--quiet"]


def _rows(path):
    return list(csv.DictReader(io.StringIO(path.read_text())))


def _profile(capsys, out, *args):
    code = main([*QUICK, "--out", str(out), *args])
    assert code == 0, capsys.readouterr().err


@pytest.fixture
def profiled(capsys, tmp_path):
    """A whole (quick) profile of two methods, with the evaluator speed."""
    _profile(capsys, tmp_path, "--method", "baseline", "msl")
    return tmp_path


def test_an_update_renews_the_named_rows_and_keeps_the_others(capsys, profiled):
    before = _rows(profiled / "profile.csv")
    stored = json.loads((profiled / "profile.json").read_text())
    msl_params = stored["methods"][1]["params"]
    stored["methods"][1]["params"] = 1  # a figure the update must replace: msl's
    stored["methods"][0]["params"] = 2  # and one it must keep: baseline's
    (profiled / "profile.json").write_text(json.dumps(stored))
    _profile(capsys, profiled, "--method", "msl", "arl", "--only-methods")
    after = read_profile(profiled / "profile.json")
    assert [(m.method, m.params) for m in after.methods][:2] == [("baseline", 2), ("msl", msl_params)]
    assert after.methods[2].method == "arl" and after.methods[2].params > 1000  # added at the end
    assert after.methods[0].made is None and {m.made["command"] for m in after.methods[1:]} == {"prvr-bench profile"}
    rows = _rows(profiled / "profile.csv")
    evaluator = [r for r in rows if r["section"] == "evaluator"]
    assert evaluator == [r for r in before if r["section"] == "evaluator"]  # kept, not measured again
    assert {r["revision"] for r in rows if r["method"] == "baseline" and r["source"] == "measured"} == \
        {r["revision"] for r in before if r["method"] == "baseline" and r["source"] == "measured"}
    assert any(r["method"] == "arl" and r["source"].startswith("reported") for r in rows)  # the paper's rows come too
    md = (profiled / "profile.md").read_text()
    assert "- msl, arl: renewed by `prvr-bench profile`" in md and "| baseline | dual-branch | measured | 0.00 |" in md


@pytest.mark.parametrize("args, message", [
    (["--method", "msl", "--videos", "4", "8"], "was profiled with sizes = [4], this update with [4, 8]: one table has "
                                                "one protocol"),
    (["--only-methods"], "--only-methods renews the rows of the methods named by --method"),
])
def test_an_update_under_other_settings_is_refused_before_measuring(capsys, profiled, args, message):
    before = {p.name: p.read_bytes() for p in profiled.iterdir()}
    code = main([*QUICK, "--out", str(profiled), "--only-methods", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in profiled.iterdir()} == before


def test_an_update_on_another_machine_is_refused(capsys, profiled):
    path = profiled / "profile.json"
    data = json.loads(path.read_text())
    data["provenance"]["device"] = "cuda (NVIDIA H100 80GB HBM3)"
    path.write_text(json.dumps(data))
    code = main([*QUICK, "--out", str(profiled), "--method", "msl", "--only-methods"])
    err = capsys.readouterr().err
    assert code == 2 and "was profiled on cuda (NVIDIA H100 80GB HBM3), this run is on cpu" in err
    assert json.loads(path.read_text()) == data


def test_an_update_needs_a_stored_profile(capsys, tmp_path):
    code = main([*QUICK, "--out", str(tmp_path), "--method", "msl", "--only-methods"])
    err = capsys.readouterr().err
    assert code == 2 and "profile.json, which is not there: a whole profile" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(extra=1), "unknown key 'extra'"),
    (lambda d: d.update(format=2), "key 'format' must be 1"),
    (lambda d: d["settings"].update(repeats="5"), "key 'settings.repeats' must be an integer, got '5'"),
    (lambda d: d["settings"].update(graphs="on"), "key 'settings.graphs' must be one of 'auto', 'off'"),
    (lambda d: d["methods"][0].update(params=True), "key 'methods[0].params' must be an integer"),
    (lambda d: d["methods"][0]["flops"].update(video=[1]), "key 'methods[0].flops.video' must be an integer"),
    (lambda d: d["methods"][0].update(code="os.system('x')"), "unknown key 'methods[0].code'"),
    (lambda d: d["methods"][0].pop("backbone"), "key 'methods[0].backbone' is missing"),
    (lambda d: d["methods"].append(d["methods"][0]), "method baseline on dual-branch is stored twice"),
    (lambda d: d["evaluator"].update(score_s="Infinity"), "key 'evaluator.score_s' must be a number"),
    (lambda d: d["provenance"].pop("command"), "key 'provenance.command' is missing"),
    (lambda d: d["methods"][0].update(made={"command": "prvr-bench profile"}), "key 'methods[0].made.created' is "
                                                                               "missing"),
])
def test_a_bad_stored_profile_is_one_line_naming_the_key(capsys, profiled, edit, message):
    path = profiled / "profile.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as err:
        read_profile(path)
    text = str(err.value)
    assert message in text and str(path) in text and "\n" not in text
    assert "without --only-methods" in text  # the fix
    before = {p.name: p.read_bytes() for p in profiled.iterdir()}
    assert main([*QUICK, "--out", str(profiled), "--method", "msl", "--only-methods"]) == 2
    assert message in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in profiled.iterdir()} == before  # nothing written


def test_a_stored_profile_that_is_a_fifo_or_not_json_is_named(tmp_path):
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"profile.json is a FIFO \(named pipe\), not a regular file"):
        read_profile(fifo)
    text = tmp_path / "other.json"
    text.write_text('{"format": 1,')
    with pytest.raises(UserError, match=r"does not parse \(line 1"):
        read_profile(text)


def test_the_stored_profile_reads_back_to_what_was_written(profiled):
    from prvr.harness.profiling.report import render_csv, render_markdown

    again = read_profile(profiled / "profile.json")
    assert render_csv(again) == (profiled / "profile.csv").read_text()
    assert render_markdown(again).split("## Real scale")[0] == (profiled / "profile.md").read_text().split(
        "## Real scale")[0]
