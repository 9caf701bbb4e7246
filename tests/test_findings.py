"""The leaderboard's section of sweeps and the matrix (harness/reports/findings.py): the gains read back
from the reports' CSV tables, linked to their reports; a table that is not one is one line naming it."""

import os
import re

import pytest

from prvr.harness.base.io import UserError
from prvr.harness.reports.findings import MATRIX_COLUMNS, SWEEP_COLUMNS, findings
from prvr.harness.reports.table import csv_text


def _sweep_row(**cells):
    return [cells.get(c, "") for c in SWEEP_COLUMNS]


def _write(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(csv_text(header, rows))


def test_each_sweeps_gains_and_the_matrixs_made_cells_are_shown_and_linked(tmp_path):
    _write(tmp_path / "sweeps" / "w~mislabel_rate.csv", [*SWEEP_COLUMNS, "note"], [
        [*_sweep_row(value="0.2", run="baseline"), ""],  # a base: no gain, not shown
        [*_sweep_row(value="0.2", run="baseline+oracle", base="baseline", seeds="0 1 2", **{
            "gain (SumR)": "+4.1", "95% interval": "[+1.0, +7.2]", "reads": "a | pipe"}), ""],
    ])
    _write(tmp_path / "matrix" / "w.csv", MATRIX_COLUMNS, [
        ["dual-branch", "none", "ignore", "baseline", "baseline", "0 1", "176.2 ± 5.3", "", ""],
        ["dual-branch", "holmes", "soft", "baseline+holmes~soft", "baseline", "0 1", "180.0 ± 1.0", "+3.8",
         "[-1.0, +8.0]"],
    ])
    text = "\n".join(findings(tmp_path))
    assert "### [w~mislabel_rate](sweeps/w~mislabel_rate.md)" in text and "### [matrix: w](matrix/w.md)" in text
    assert "| 0.2 |  |  | baseline+oracle | baseline | 0 1 2 | +4.1 | [+1.0, +7.2] |" in text
    assert "a \\| pipe" in text  # a cell cannot end its row
    assert "| baseline+holmes~soft | baseline | 0 1 | 180.0 ± 1.0 | +3.8 | [-1.0, +8.0] |" in text
    assert "| none | ignore |" not in text
    assert findings(tmp_path / "nothing") == []


@pytest.mark.parametrize("content, says", [
    ("value,run\n0.2,baseline\n", "no column 'multi-relevant share (test)'"),
    ("", "not a CSV table"),
    ('value,run\n"0.2,baseline\n', "not a CSV table"),
])
def test_a_report_table_that_is_not_one_is_one_line(tmp_path, content, says):
    path = tmp_path / "sweeps" / "bad.csv"
    path.parent.mkdir()
    path.write_text(content)
    with pytest.raises(UserError, match=re.escape(says)) as e:
        findings(tmp_path)
    assert "bad.csv" in str(e.value) and "\n" not in str(e.value)


def test_a_fifo_in_place_of_a_report_table_is_refused(tmp_path):
    (tmp_path / "matrix").mkdir()
    os.mkfifo(tmp_path / "matrix" / "w.csv")
    with pytest.raises(UserError, match="w.csv"):
        findings(tmp_path)


def _one_row_sweep(path, columns, cells):
    """A sweep report's CSV of one row: the answer table's columns and `columns`, `cells` filled."""
    header = [*SWEEP_COLUMNS, *(c for c in columns if c not in SWEEP_COLUMNS)]
    row = {**dict.fromkeys(header, ""), **cells}
    _write(path, header, [list(row.values())])


def test_a_sweep_of_the_training_split_alone_shows_what_the_noise_costs(tmp_path):
    from prvr.harness.reports.findings import COST_COLUMNS

    _one_row_sweep(tmp_path / "sweeps" / "w~mislabel_rate.csv", COST_COLUMNS, {
        "value": "0.2", "run": "baseline+oracle", "base": "baseline", "gain (SumR)": "+5.4",
        "what the noise costs it": "+6.6", "the cost's 95% interval": "[-4.9, +16.3]",
        "share of the base's cost recovered": "60%", "the recovered share's 95% interval": "[-8%, 137%]"})
    text = "\n".join(findings(tmp_path))
    assert "| 0.2 | baseline+oracle | +6.6 | [-4.9, +16.3] | baseline | +5.4 | 60% | [-8%, 137%] |" in text


def test_a_sweep_of_the_training_regime_shows_how_each_gain_moves(tmp_path):
    from prvr.harness.reports.findings import CHANGE_COLUMNS

    _one_row_sweep(tmp_path / "sweeps" / "w~train_videos.csv", CHANGE_COLUMNS, {
        "value": "3000", "run": "baseline+oracle", "base": "baseline", "gain (SumR)": "+20.5",
        "gain at the preset's value": "+3.1", "change of the gain": "+17.4", "the change's 95% interval": "[-2.6, +50.7]"})
    text = "\n".join(findings(tmp_path))
    assert "How each gain moves with the training regime" in text
    assert "| 3000 | baseline+oracle | baseline | +3.1 | +20.5 | +17.4 | [-2.6, +50.7] |" in text
    assert "What the noise costs" not in text


def test_a_sweep_with_runs_trained_with_the_oracle_shows_the_room_each_leaves(tmp_path):
    from prvr.harness.reports.findings import ROOM_COLUMNS

    _one_row_sweep(tmp_path / "sweeps" / "w~msl.csv", ROOM_COLUMNS, {
        "value": "1,12", "run": "ral@msl", "base": "msl", "gain (SumR)": "+14.5", "oracle's gain on the base": "+29.2",
        "the oracle's room on the run": "+25.8", "room the run takes": "+3.4",
        "the taken room's 95% interval": "[-1.2, +8.5]"})
    text = "\n".join(findings(tmp_path))
    assert "The room a run leaves" in text
    assert "| 1,12 | ral@msl | msl | +29.2 | +25.8 | +3.4 | [-1.2, +8.5] |" in text
    assert "What the noise costs" not in text and "How each gain moves" not in text


def test_a_sweep_of_runs_that_localize_shows_their_vcmr_gains(tmp_path):
    from prvr.harness.reports.findings import MOMENT_COLUMNS

    _one_row_sweep(tmp_path / "sweeps" / "sim-charades-v~repeat_prob.csv", MOMENT_COLUMNS, {
        "value": "0.45", "run": "xml-pr", "base": "xml", "gain (SumR)": "+4.2", "VCMR SumR": "141.9 ± 37.5",
        "gain (VCMR SumR)": "+19.0", "VCMR gain's 95% interval": "[-0.1, +38.1]", "VCMR gain's p": "0.0507",
        "VCMR interval over": "seeds (t-test)"})
    text = "\n".join(findings(tmp_path))
    assert "Moments: each localizing run's VCMR SumR" in text
    assert "| 0.45 | xml-pr | xml | 141.9 ± 37.5 | +19.0 | [-0.1, +38.1] | 0.0507 | seeds (t-test) |" in text
