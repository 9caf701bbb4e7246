"""The one results table (harness/reports/table.py): the markdown and CSV writers escape what comes
from input, the mean ± std formatter matches hand values, and a leaderboard built from records whose
tag and command try to inject markup or a spreadsheet formula shows them escaped."""

import csv
import io
import json

import numpy as np
import pytest

from prvr.harness.base.io import UserError
from prvr.harness.engine.records import record_path, write_record
from prvr.harness.reports import leaderboard
from prvr.harness.reports.table import (code, csv_text, fenced, markdown_cell, markdown_table, mean_and_std, mean_std,
                                        records_frame)

FORMULA = "=cmd|' /C calc'!A0"  # the DDE payload spreadsheet injection advisories use


def test_markdown_cells_escape_pipes_backslashes_backticks_and_line_breaks():
    assert markdown_cell("a|b") == "a\\|b"
    assert markdown_cell("a\\b") == "a\\\\b"
    assert markdown_cell("one\n two\r\nthree") == "one two three"
    assert markdown_cell("```\n# injected") == "\\`\\`\\` # injected"
    table = markdown_table(["run", "note"], [["x|y", "```\n# injected"]])
    lines = table.splitlines()
    assert lines == ["| run | note |", "|---|---|", "| x\\|y | \\`\\`\\` # injected |"]


def test_a_code_span_and_a_fence_hold_any_text_whole():
    assert code("baseline") == "`baseline`"
    assert code("a`b|c") == "``a`b\\|c``"
    assert code("a|b", in_table=False) == "`a|b`"
    block = fenced(["prvr-bench run --tag x", "echo ```\n# injected"]).splitlines()
    assert block[0] == block[-1] == "````"  # longer than the run of three inside
    assert block[1:-1] == ["prvr-bench run --tag x", "echo ``` # injected"]  # one line per command


def test_csv_cells_round_trip_through_csv_reader_and_formulas_are_neutralised():
    text = csv_text(["source", "tag", "mean", "delta"], [['ARL, "Table 3"', FORMULA, "150.000", "-3.250"],
                                                         ["a\nb", "@SUM(A1)", "+2.5e-05", "-inf"]])
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[1] == ['ARL, "Table 3"', "'" + FORMULA, "150.000", "-3.250"]  # quotes doubled, read back whole
    assert rows[2] == ["a\nb", "'@SUM(A1)", "+2.5e-05", "-inf"]  # numbers stay numbers
    assert '"ARL, ""Table 3"""' in text


def test_mean_std_is_the_mean_and_the_sample_std():
    assert mean_std([]) == "" and mean_std([150.0]) == "150.0"
    assert mean_std([146.0, 150.0, 154.0]) == "150.0 ± 4.0"  # sample std: sqrt((16 + 0 + 16) / 2)
    assert mean_std([1.0, 2.0], decimals=2) == "1.50 ± 0.71"  # sqrt(0.5)
    assert mean_and_std([1.0, 2.0, 4.0]) == pytest.approx((7 / 3, float(np.std([1.0, 2.0, 4.0], ddof=1))))
    assert mean_and_std([3.0]) == (3.0, None) and mean_and_std([]) is None


def _record(seed, method="baseline", run_name="baseline", tag="", command="prvr-bench bench --seeds 0 1"):
    test = {"R@1": 10.0 + seed, "R@5": 30.0, "R@10": 50.0, "R@100": 90.0, "SumR": 180.0 + seed}
    return {"method": method, "dataset": "sim-x", "seed": seed, "backbone": "dual-branch", "relations": "none",
            "run_name": run_name, "tag": tag, "command": command, "config": {"train": {"epochs": 12, "patience": 5}},
            "provenance": {}, "metrics": {"val": test, "test": test}}


def _store(root, record):
    write_record(record_path(root, record["dataset"], record["run_name"], record["seed"]), record)


def test_the_frame_has_one_typed_row_per_record():
    frame = records_frame([_record(0), _record(1)])
    assert list(frame["seed"]) == [0, 1] and frame["SumR"].tolist() == [180.0, 181.0]
    assert str(frame["run"].dtype) == "string" and str(frame["SumR"].dtype) == "float64"
    assert frame["oracle SumR"].isna().all()  # a figure no record has: NaN, never 0


def test_an_injected_tag_and_command_are_escaped_in_the_leaderboard(tmp_path):
    for seed in (0, 1):
        _store(tmp_path, _record(seed))
        _store(tmp_path, _record(seed, run_name="baseline~calc", tag=FORMULA,
                                 command="prvr-bench run --tag calc ```\n# injected"))
    leaderboard.rebuild(tmp_path, show=False)
    rows = list(csv.DictReader(io.StringIO((tmp_path / "leaderboard.csv").read_text(), newline="")))
    assert [r["tag"] for r in rows if r["dataset"] == "sim-x"] == ["", "'" + FORMULA]
    md = (tmp_path / "leaderboard.md").read_text()
    assert "\n# injected" not in md  # the command stays one line inside its block
    block = md.split("## Produced by")[1]
    fence = "````"
    assert f"\n{fence}\nprvr-bench bench --seeds 0 1\nprvr-bench run --tag calc ``` # injected\n{fence}\n" in block
    assert md.index("## sim-x") < md.index("## Variants and ablations") < md.index("## Produced by")
    head = md.split("## Variants and ablations")[0]
    assert "| sim-x | baseline |" in head and "baseline~calc" not in head.split("## sim-x")[1]


def test_a_record_naming_an_unregistered_method_is_refused_in_one_line(tmp_path):
    _store(tmp_path, _record(0))
    record = _record(0, method="bogus", run_name="bogus")
    _store(tmp_path, record)
    with pytest.raises(UserError) as err:
        leaderboard.rebuild(tmp_path, show=False)
    text = str(err.value)
    assert "\n" not in text and "key 'method': unknown method 'bogus'" in text and "known: arl, baseline" in text
    path = record_path(tmp_path, "sim-x", "baseline", 0)
    path.write_text(json.dumps({**json.loads(path.read_text()), "backbone": "=cmd"}))
    with pytest.raises(UserError, match=r"key 'backbone': unknown backbone '=cmd'"):
        leaderboard.rebuild(tmp_path, show=False)
