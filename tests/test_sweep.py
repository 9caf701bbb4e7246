"""`prvr-bench sweep` (harness/cli/sweep.py, harness/reports/sweeps.py): runs at each value of a world
knob, kept when they exist, then the world's figures at each value and each gain with its interval.
On sim-tiny, one epoch a run (CPU)."""

import csv
import dataclasses
import json

import numpy as np

import pytest

from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.reports.stats import BOTH_LEVELS, Comparison, MetricDifference, RoomShare
from prvr.harness.base.names import join_run_name, split_run_name
from prvr.harness.reports.sweeps import Answer, Cell, Sweep, WorldCheck, _answer_reads, _share, base_of, knob_tag, \
    oracle_of, point_tag, room_of

TINY = ["--dataset", "sim-tiny", "--set", "train.epochs=1", "--quiet"]


@pytest.mark.parametrize("argv, says", [
    (["--knob", "sim.no_such_knob", "--values", "0.1"], "no_such_knob"),
    (["--knob", "sim.repeat_prob", "--values", "2"], "repeat_prob"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "0.1"], "a value given twice"),
    (["--knob", "sim.mv_fractions", "--values", "0.1"], "not a number of the config"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "--dataset", "tvr"], "is not simulated"),
    (["--knob", "sim.repeat_prob", "sim.repeat_copies", "--values", "0.1"], "2 numbers joined by commas"),
    (["--knob", "sim.repeat_prob", "--values", "0.1,2"], "give a number per value"),
    (["--knob", "sim.repeat_prob", "--values", "nan"], "give a number per value"),
    (["--knob", "sim.repeat_prob", "sim.repeat_copies", "--values", "1,0"], "repeat_copies"),
    (["--knob", "sim.repeat_prob", "sim.repeat_prob", "--values", "1,1"], "a knob given twice"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "--method", "arl~nosuch"], "no ablation row tagged 'nosuch'"),
    (["--knob", "sim.repeat_prob", "sim.repeat_copies", "--values", "1,4", "1,4.0"], "a value given twice"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "--method", "baseline+holmes~bogus"], "no treatment 'bogus'"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "--method", "baseline+nope~soft"], "no detector 'nope'"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "--method", "baseline+oracle~soft"], "come with --oracle"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "--method", "baseline+arl~ignore"], "trains baseline+arl;"),
    (["--knob", "sim.repeat_prob", "--values", "0.1", "--method", "msl+arl~ignore"], "cannot work: detector arl"),
])
def test_a_bad_sweep_is_one_line_before_anything_runs(tmp_path, capsys, argv, says):
    code = main(["sweep", "--method", "baseline", "--out", str(tmp_path), *TINY, *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_names_of_a_sweeps_runs_and_their_bases():
    assert base_of("baseline+holmes~soft") == "baseline" and base_of("arl+sbert~ignore") == "arl~base"
    assert base_of("baseline+arl") == "baseline"
    assert knob_tag("sim.repeat_prob", 0.6) == "repeat_prob0.6" and knob_tag("sim.mislabel_rate", 0) == "mislabel_rate0"
    assert base_of("baseline+oracle~repeat_prob0.6") == "baseline~repeat_prob0.6"
    assert base_of("ral@msl") == "msl" and base_of("msl") is None
    assert base_of("arl") == "arl~base" and base_of("arl+oracle") == "arl" and base_of("arl~base") is None
    assert base_of("arl+oracle~base") == "arl~base"
    assert oracle_of("msl") == "msl+oracle" and oracle_of("arl~base") == "arl+oracle~base"
    assert oracle_of("ral@msl~repeat_prob0") == "ral+oracle@msl~repeat_prob0"
    assert base_of("ral+oracle@msl~repeat_prob1-repeat_copies12") == "ral@msl~repeat_prob1-repeat_copies12"
    for name in ("msl", "arl~base", "ral+oracle@msl~repeat_prob0", "arl+sbert~ignore~b32", "ral@holmes"):
        assert join_run_name(*split_run_name(name)) == name  # the one builder of run names undoes the splitter
    knobs = ("sim.repeat_prob", "sim.repeat_copies")
    assert point_tag(knobs, (1.0, 4.0), (0.35, 2.0)) == "repeat_prob1-repeat_copies4"
    assert point_tag(knobs, (0.0, 2.0), (0.35, 2.0)) == "repeat_prob0"  # one knob's own sweep names it alike
    assert point_tag(knobs, (0.35, 2.0), (0.35, 2.0)) == ""


def test_a_record_of_another_world_is_refused_naming_the_knob(tmp_path):
    """Rows of a sweep differ in its knobs alone: a record made with another knob too (another --set, an
    older preset) would credit the swept knob with that change; it is one line, naming both values."""
    sweep = Sweep("sim-tiny", ("sim.repeat_prob", "sim.repeat_copies"), ((0.0, 2.0), (1.0, 4.0)), (0.0, 2.0),
                  ("baseline",), (0,), "prvr-bench sweep ...")
    check = WorldCheck(sweep)
    record = {"config": {"sim": {"repeat_prob": 0.0, "repeat_copies": 2.0, "vague_prob": 0.1}}}
    assert check.check(record, tmp_path / "a.json") is record
    moved = {"config": {"sim": {"repeat_prob": 1.0, "repeat_copies": 4.0, "vague_prob": 0.1}}}
    assert check.check(moved, tmp_path / "b.json") is moved  # only the swept knobs moved
    other = {"config": {"sim": {"repeat_prob": 1.0, "repeat_copies": 4.0, "vague_prob": 0.3}}}
    with pytest.raises(UserError, match=r"c.json: made on another world than .*a.json: sim.vague_prob is 0.3 "
                                        r"here against 0.1 there"):
        check.check(other, tmp_path / "c.json")


@pytest.mark.slow
def test_a_sweep_trains_each_value_once_and_reports_the_world_and_the_gains(tmp_path, capsys):
    default = resolve("baseline", "sim-tiny", 0, []).sim.repeat_prob
    argv = ["sweep", "--knob", "sim.repeat_prob", "--values", f"{default:g}", "0.9", "--method", "baseline",
            "--oracle", "--seeds", "0", "1", "--out", str(tmp_path), *TINY]
    assert main(argv) == 0
    runs = sorted(p.parent.name for p in (tmp_path / "runs" / "sim-tiny").glob("*/seed1.json"))
    assert runs == ["baseline", "baseline+oracle", "baseline+oracle~repeat_prob0.9", "baseline~repeat_prob0.9"]
    md = (tmp_path / "sweeps" / "sim-tiny~repeat_prob.md").read_text()
    assert "## The world at each value" in md and "| 0.9 |" in md and "multi-relevant share (test)" in md
    rows = list(csv.DictReader((tmp_path / "sweeps" / "sim-tiny~repeat_prob.csv").open()))
    gains = [r for r in rows if r["run"] == "baseline+oracle"]
    assert len(rows) == 4 and len(gains) == 2 and all(r["base"] == "baseline" for r in gains)
    for r in gains:  # the interval holds its difference
        low, high = (float(x) for x in r["95% interval"].strip("[]").split(","))
        assert low <= float(r["gain (SumR)"]) <= high
    shares = {r["value"]: float(r["multi-relevant share (test)"]) for r in rows}
    assert shares["0.9"] > shares[f"{default:g}"]  # the knob moved the figure it is for
    assert (tmp_path / "sweeps" / "sim-tiny~repeat_prob.png").stat().st_size > 0
    answer = md.split("## Is it the noise?")[1]
    assert answer.count("| baseline+oracle | baseline |") == 2 and "share of the room closed" in answer
    assert all("share of the room closed" in r and "reads" in r for r in rows)
    slope = md.split("## Does the gain grow with the noise?")[1]
    assert "| baseline+oracle | baseline | 4 |" in slope  # two values x two seeds of per-seed gains
    capsys.readouterr()
    assert main([*argv, "--plan"]) == 0  # resumed: every run kept, none made twice
    assert capsys.readouterr().out.count("kept (record exists)") == 8


def test_a_row_of_another_world_gets_no_delta_against_the_plain_baseline():
    """A sweep's row (`baseline~repeat_prob0`) is tested on another test set than the dataset's baseline:
    the leaderboard gives it no Δ SumR; a row of the same world (another batch size) keeps its Δ."""
    from test_records_and_leaderboard import fake_record

    from prvr.harness.reports.rows import build_rows

    records = []
    for seed in (0, 1):
        for run, share, sumr in (("baseline", 0.108, 150.0), ("baseline~b32", 0.108, 152.0),
                                 ("baseline~repeat_prob0", 0.002, 170.0)):
            rec = fake_record(seed, sumr + seed, run_name=run)
            rec["provenance"] = {"data": {"test": {"queries": 2500, "multi_relevant_share": share}}}
            records.append(rec)
    delta = {r["run"]: r["delta"] for r in build_rows(records)}
    assert delta["baseline~b32"] == pytest.approx(2.0) and delta["baseline~repeat_prob0"] is None


def test_a_tagged_row_is_compared_with_the_baseline_made_under_its_tag():
    """`msl~repeat_prob0` against `baseline~repeat_prob0` (its world, which the plain baseline does not share);
    `msl~train_videos3000` against `baseline~train_videos3000` (the same test set as the plain baseline, but
    another training regime); a tag with no baseline of its own (`msl~k0`) against the plain baseline."""
    from test_records_and_leaderboard import fake_record

    from prvr.harness.reports.leaderboard import judge
    from prvr.harness.reports.rows import build_rows

    records = []
    for seed in (0, 1):
        for run, share, sumr in (("baseline", 0.108, 150.0), ("baseline~repeat_prob0", 0.002, 170.0),
                                 ("baseline~train_videos3000", 0.108, 250.0), ("msl", 0.108, 200.0),
                                 ("msl~repeat_prob0", 0.002, 210.0), ("msl~train_videos3000", 0.108, 290.0),
                                 ("msl~k0", 0.108, 195.0)):
            rec = fake_record(seed, sumr + seed, method=run.partition("~")[0], run_name=run)
            rec["provenance"] = {"data": {"test": {"queries": 2500, "multi_relevant_share": share}}}
            records.append(rec)
    rows = build_rows(records)
    delta = {r["run"]: r["delta"] for r in rows}
    assert delta["msl~repeat_prob0"] == pytest.approx(40.0) and delta["msl~train_videos3000"] == pytest.approx(40.0)
    assert delta["msl~k0"] == pytest.approx(45.0) and delta["msl"] == pytest.approx(50.0)
    assert delta["baseline~train_videos3000"] == pytest.approx(100.0)  # a tagged baseline: against the plain one
    judge(rows)
    against = {r["run"]: (r["comparison"] or {}).get("against") for r in rows}
    assert against["msl~train_videos3000"] == "baseline~train_videos3000" and against["msl~k0"] == "baseline"


@pytest.mark.slow
def test_knobs_moved_together_tag_their_runs_and_draw_against_the_share(tmp_path):
    """`--knob A B --values a,b ...`: a path through worlds past where one knob ends (repeat_prob stops at
    1; repeat_copies takes the share further), each run tagged by the knobs away from the preset."""
    preset = resolve("baseline", "sim-tiny", 0, []).sim
    start = f"{preset.repeat_prob:g},{preset.repeat_copies:g}"
    argv = ["sweep", "--knob", "sim.repeat_prob", "sim.repeat_copies", "--values", start, "1,6",
            "--method", "baseline", "--seeds", "0", "--out", str(tmp_path), *TINY]
    assert main(argv) == 0
    runs = sorted(p.parent.name for p in (tmp_path / "runs" / "sim-tiny").glob("*/seed0.json"))
    assert runs == ["baseline", "baseline~repeat_prob1-repeat_copies6"]
    rows = list(csv.DictReader((tmp_path / "sweeps" / "sim-tiny~repeat_prob-repeat_copies.csv").open()))
    shares = {r["value"]: float(r["multi-relevant share (test)"]) for r in rows}
    assert set(shares) == {start, "1,6"} and shares["1,6"] > shares[start]


@pytest.mark.parametrize("gain, room, share, says", [
    ((+5, +2, +8), (+9, +4, +14), (0.55, 0.2, 0.9), "gains within the oracle's room"),
    ((+20, +15, +25), (+3, -1, +7), None, "gains where the oracle has no room: not a gain from handling label noise"),
    ((+20, +15, +25), (+3, +1, +5), (6.0, 3.0, 15.0), "gains more than the oracle's whole room"),
    ((+14, +10, +19), (+10, +5, +18), (1.34, 0.97, 2.35), "gains about the oracle's whole room or more"),  # RAL, 20% mislabelled
    ((+1, -2, +4), (+9, +4, +14), (0.1, -0.2, 0.4), "no gain the interval can tell from none"),
    ((-4, -7, -1), (+9, +4, +14), (-0.4, -0.8, -0.1), "loses to its base"),
])
def test_what_a_gain_is_credited_to(gain, room, share, says):
    def cell(run, d):
        diff = MetricDifference("SumR", 0, 0, *d, 0.01)
        return Cell((0.35,), run, (0, 1), (1, 1), (1, 1), "msl", _comparison(diff))
    answer = Answer(cell("ral@msl", gain), cell("msl+oracle", room),
                    RoomShare(share[0], share[1], share[2], room[1], (0, 1)) if share else None)
    assert _answer_reads(answer, answer.cell.gain.metrics[0], answer.room.gain.metrics[0]).startswith(says)


@pytest.mark.parametrize("room, says", [
    ((+9, +4, +14), "knowing every false negative is worth this much here"),
    ((+1, -2, +4), "no room the interval can tell from zero"),
    ((-3, -5, -1), "knowing every false negative costs the base here: no room"),  # ARL's encoder at 0.2%
])
def test_what_an_oracle_row_reads(room, says):
    cell = Cell((0.35,), "msl+oracle", (0, 1), (1, 1), (1, 1), "msl", _comparison(MetricDifference("SumR", 0, 0, *room,
                                                                                                   0.01)))
    d = cell.gain.metrics[0]
    assert _answer_reads(Answer(cell, cell, None), d, d) == says


def test_no_share_of_a_room_the_interval_cannot_tell_from_zero():
    """Where the oracle's room holds 0 in its interval the ratio gain / room means nothing (RAL's +19.4
    over a room of -0.2 read as 2942% on sim-tvr-v2 at 0.2% multi-relevant): neither figure is shown."""
    assert _share(RoomShare(29.42, float("nan"), float("nan"), -4.8, (0, 1))) == ["", "(no room to share)"]
    assert _share(RoomShare(0.5, 0.42, 0.58, 26.3, (0, 1))) == ["50%", "[42%, 58%]"]
    assert _share(RoomShare(float("nan"), float("nan"), float("nan"), 1.0, (0, 1))) == ["", ""]


def _comparison(diff):
    return Comparison("sim-tiny", "a", "b", (0, 1), (10, 10), BOTH_LEVELS, (diff,))


def test_a_methods_base_row_is_swept_beside_it(tmp_path, capsys):
    """`arl~base` (ARL's Table 5 row (a)) is a sweep method: its runs are tagged by the row and the point,
    and `arl`'s gain is measured against it (base_of)."""
    argv = ["sweep", "--knob", "sim.repeat_prob", "--values", "0.9", "--method", "arl", "arl~base", "--oracle",
            "--seeds", "0", "--out", str(tmp_path), "--plan", *TINY]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for run in ("arl~repeat_prob0.9", "arl~base~repeat_prob0.9", "arl+oracle~repeat_prob0.9"):
        assert f"  {run} " in out
    # the base row reads no relations: an oracle beside it would be the same run again (three such runs at
    # 61% multi-relevant gave arl~base's SumR to the decimal), so --oracle trains the oracle's room on its
    # encoder beside it instead, the matrix cell oracle x positive (from ARL's treatment row, tv_only): the true
    # pairs as positives, as the oracle rows of the methods that read relations train them
    assert "arl+oracle~base" not in out and "  arl+oracle~tv_only-positive~repeat_prob0.9 " in out
    assert "tv_only-ignore" not in out
    # --room chooses the room's treatment, or several
    assert main([*argv, "--room", "ignore"]) == 0
    out = capsys.readouterr().out
    assert "  arl+oracle~tv_only-ignore~repeat_prob0.9 " in out and "tv_only-positive" not in out
    assert main([*argv, "--room", "positive", "ignore"]) == 0
    out = capsys.readouterr().out
    assert "  arl+oracle~tv_only-ignore~repeat_prob0.9 " in out and "  arl+oracle~tv_only-positive~repeat_prob0.9 " in out
    # where no row beside the oracle reads no relations, a room's treatment means nothing: one line
    for bad in ([a for a in argv if a != "arl~base"], [a for a in argv if a != "--oracle"]):
        assert main([*bad, "--room", "ignore"]) == 2
        assert capsys.readouterr().err.strip() == "prvr-bench: error: --room ignore: the room's treatment is chosen " \
            "only beside a row that reads no relations, with --oracle (e.g. --method arl~base --oracle); other " \
            "oracle rows train the true pairs as positives"
    assert not (tmp_path / "runs").exists()


def test_the_room_beside_a_base_row_is_the_matrix_cell_and_the_answer_reads_it(tmp_path):
    """CPU. `arl~base --oracle --room ignore positive` trains `arl+oracle~tv_only-ignore` and `~tv_only-positive`
    at each value with the matrix's recipes for those cells (the runs `prvr-bench matrix --set KNOB=V` makes),
    each gain is measured against `arl~base`, and the answer table reads ARL's gain against the first room."""
    argv = ["sweep", "--knob", "sim.repeat_prob", "--values", "0.9", "--method", "arl", "arl~base", "--oracle",
            "--room", "ignore", "positive", "--seeds", "0", "1", "--out", str(tmp_path), *TINY]
    assert main(argv) == 0
    runs = tmp_path / "runs" / "sim-tiny"
    for treatment in ("ignore", "positive"):
        room = json.loads((runs / f"arl+oracle~tv_only-{treatment}~repeat_prob0.9" / "seed0.json").read_text())
        assert (room["relations"], room["config"]["loss"]["treatment"], room["config"]["relations"]["oracle"]["mode"]) \
            == ("oracle", treatment, "ignore")
        # ARL's T-V row, whose only difference from `arl~base` is the oracle's pairs, left out of the negatives or
        # trained as positives
        assert room["config"]["loss"]["variant"] == "tv_only" and room["config"]["sim"]["repeat_prob"] == 0.9
    rows = list(csv.DictReader((tmp_path / "sweeps" / "sim-tiny~repeat_prob.csv").open()))
    [room_row] = [r for r in rows if r["run"] == "arl+oracle~tv_only-ignore"]
    [positive] = [r for r in rows if r["run"] == "arl+oracle~tv_only-positive"]
    assert room_row["base"] == positive["base"] == "arl~base" and room_row["gain (SumR)"] and positive["gain (SumR)"]
    [arl] = [r for r in rows if r["run"] == "arl"]
    assert arl["base"] == "arl~base" and arl["oracle's gain on the base"] == room_row["gain (SumR)"]
    assert "reads no relations" not in arl["reads"] and "no arl+oracle~tv_only-ignore run" not in arl["reads"]
    report = (tmp_path / "sweeps" / "sim-tiny~repeat_prob.md").read_text()
    assert "the room is the matrix cell oracle x ignore (arl+oracle~tv_only-ignore; " in report
    assert "the room under positive (arl+oracle~tv_only-positive) is a row of the runs table" in report
    assert base_of("arl+oracle~tv_only-ignore") == base_of("arl+oracle~tv_only-positive") == "arl~base"
    assert room_of("arl~base") == "arl+oracle~tv_only-positive"
    assert room_of("arl~base", "ignore") == "arl+oracle~tv_only-ignore"
    assert base_of("arl+oracle~ignore") == "arl~ignore"  # the records of the earlier recipe: not read as the room


def test_a_cell_on_arls_backbone_is_swept_by_the_name_of_its_start_row(tmp_path, capsys):
    """ARL's cells start from its treatment row (tv_only): `arl+arl~ignore` names the cell the matrix trains as
    `arl~tv_only-ignore`, so the sweep says that name in one line; by that name (or `~tv_only` for restrain) it
    plans the matrix's run."""
    plan = ["sweep", "--knob", "sim.repeat_prob", "--values", "0.9", "--seeds", "0", "--out", str(tmp_path), "--plan",
            *TINY, "--method"]
    assert main([*plan, "arl+arl~ignore"]) == 2
    assert capsys.readouterr().err.strip() == "prvr-bench: error: --method arl+arl~ignore: that cell of the matrix " \
        "trains arl+arl~tv_only-ignore; sweep it by that name"
    assert main([*plan, "arl+arl~tv_only-ignore", "arl+arl~tv_only"]) == 0
    out = capsys.readouterr().out
    assert "  arl~tv_only-ignore~repeat_prob0.9 " in out and "  arl~tv_only~repeat_prob0.9 " in out


def test_a_matrix_cell_is_swept_by_its_run_name_and_a_tag_is_kept(tmp_path, capsys):
    """`METHOD+DETECTOR~TREATMENT` sweeps a cell of the matrix under the name `prvr-bench matrix --set KNOB=V`
    gives its run (its recipe, no oracle row of its own: its room is its base's oracle); `--tag` joins the
    row's tag ahead of the point's."""
    argv = ["sweep", "--knob", "sim.mislabel_rate", "--values", "0.2", "--method", "baseline", "baseline+holmes~soft",
            "--oracle", "--seeds", "0", "--out", str(tmp_path), "--plan", *TINY]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for run in ("baseline~mislabel_rate0.2", "baseline+oracle~mislabel_rate0.2", "baseline+holmes~soft~mislabel_rate0.2"):
        assert f"  {run} " in out
    assert "+oracle~soft" not in out and "holmes+oracle" not in out
    assert main([*argv[:6], "baseline", "--tag", "lr", *argv[8:]]) == 0
    assert "  baseline~lr~mislabel_rate0.2 " in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()


def test_a_knob_of_the_training_regime_asks_how_the_gains_move_not_what_the_noise_costs(tmp_path):
    """A knob whose records move neither the test split's multi-relevant share nor the training split's
    mislabelled queries (sim.train_videos) is no noise axis: no slope against it and no cost table, but each
    gain at a value against the same gain at the preset's value, with its interval (exact where every query
    moves alike: the oracle's gain 0 at the preset, +400 at 3000), and the runs' order at each value."""
    from test_stats import write_run

    from prvr.harness.reports.stats import Settings
    from prvr.harness.reports.sweeps import SweepRows, changes, noise_axis, render, sweep_cells

    q, fast = 60, Settings(resamples=500, permutations=500)
    world, train = {"queries": q, "multi_relevant_share": 0.1}, {"mislabelled": 0}
    for seed in (0, 1):
        write_run(tmp_path, "b", seed, np.full(q, 150), sim=world, train=train)
        write_run(tmp_path, "b+oracle", seed, np.full(q, 150), sim=world, train=train)
        write_run(tmp_path, "b~train_videos3000", seed, np.full(q, 150), sim=world, train=train)
        write_run(tmp_path, "b+oracle~train_videos3000", seed, np.ones(q, dtype=int), sim=world, train=train)
    sweep = Sweep("sim-x", ("sim.train_videos",), ((600.0,), (3000.0,)), (600.0,), ("b", "b+oracle"), (0, 1), "cmd")
    rows = SweepRows(tmp_path, sweep)
    cells, facts = sweep_cells(sweep, tmp_path, fast, rows)
    assert noise_axis(sweep, facts) == (None, {})
    (change,) = changes(sweep, cells, rows, fast)
    assert change.cell.run == "b+oracle" and change.note == ""
    g = change.change
    assert (g.before, g.after, g.change, g.low, g.high, g.seeds) == (0.0, 400.0, 400.0, 400.0, 400.0, (0, 1))
    md, table = render(sweep, cells, facts, (), (), (), [change])
    assert "## Does the gain depend on the training regime?" in md and "slope per 10 pts" not in md
    assert "| 3000 | b+oracle | b | +0.0 | +400.0 | +400.0 | [+400.0, +400.0] | the gain grows with it |" in md
    assert "| 3000 | b+oracle 400.0 > b 0.0 |" in md
    head = table.splitlines()[0]
    assert "change of the gain" in head and "the change's 95% interval" in head
    mislabel = Sweep("sim-x", ("sim.mislabel_rate",), ((0.0,), (0.2,)), (0.0,), ("b",), (0, 1), "cmd")
    assert noise_axis(mislabel, {(0.0,): {}, (0.2,): {}})[0] == "sim.mislabel_rate"  # older records: the knob's axis


def test_what_the_noise_costs_and_the_share_a_run_recovers(tmp_path):
    """A knob that moves only the training split (mislabelled pairs): each run at a value against itself at
    the preset's value on the same test queries, and a run with a base recovering a share of the base's cost
    (exact where every query moves alike: the base 400 -> 0 per query, its oracle 200 at the noisy value: half);
    none where the noisy runs were scored on another test set (a knob that moves the relevance)."""
    from test_stats import write_run

    from prvr.harness.reports.stats import Settings
    from prvr.harness.reports.sweeps import SweepRows, costs, render, slopes, sweep_cells

    q, fast = 60, Settings(resamples=500, permutations=500)
    for seed in (0, 1):
        write_run(tmp_path, "b", seed, np.ones(q, dtype=int), sim={"queries": q})
        write_run(tmp_path, "b+oracle", seed, np.ones(q, dtype=int), sim={"queries": q})
        write_run(tmp_path, "b~mislabel_rate0.2", seed, np.full(q, 150), sim={"queries": q})
        write_run(tmp_path, "b+oracle~mislabel_rate0.2", seed, np.full(q, 6), sim={"queries": q})
        write_run(tmp_path, "b~repeat_prob0.9", seed, np.full(q, 150), sim={"queries": q, "multi_relevant_share": 0.5})
    sweep = Sweep("sim-x", ("sim.mislabel_rate",), ((0.0,), (0.2,)), (0.0,), ("b", "b+oracle"), (0, 1), "cmd")
    rows = SweepRows(tmp_path, sweep)
    cells, facts = sweep_cells(sweep, tmp_path, fast, rows)
    found = {k.cell.run: k for k in costs(sweep, cells, rows, fast)}
    assert set(found) == {"b", "b+oracle"}
    assert (found["b"].cost.difference, found["b"].cost.low, found["b"].recovered) == (400.0, 400.0, None)
    assert found["b+oracle"].cost.difference == 200.0
    half = found["b+oracle"].recovered
    assert (half.share, half.low, half.high) == (0.5, 0.5, 0.5)
    (slope,) = slopes(sweep, cells, facts)  # the test set does not move: against the knob, x 100
    assert (slope.run, slope.points, slope.per_10) == ("b+oracle", 4, pytest.approx(100.0))
    md, table = render(sweep, cells, facts, (slope,), (), list(found.values()))
    assert "slope per 10 pts of sim.mislabel_rate" in md
    assert "## What the noise costs, and how much of it each run recovers" in md
    assert "| 0.2 |  | b+oracle | +200.0 | [+200.0, +200.0] | b | +200.0 | [+200.0, +200.0] | 50% | [50%, 50%] |" in md
    assert "share of the base's cost recovered" in table.splitlines()[0]
    other = Sweep("sim-x", ("sim.repeat_prob",), ((0.0,), (0.9,)), (0.0,), ("b",), (0, 1), "cmd")
    rows = SweepRows(tmp_path, other)
    cells, _ = sweep_cells(other, tmp_path, fast, rows)
    assert len(cells) == 2 and costs(other, cells, rows, fast) == []


@pytest.mark.parametrize("own_rank, taken, reads", [
    (1, "+0.0", "no difference the interval can tell: it takes at most 0.0 of the base's 200.0, less than its "
                "gain's lower bound (+200.0), so most of its gain is not the false negatives' room"),
    (6, "+200.0", "leaves less room than its base (100% of it)"),
    (150, "+400.0", "leaves less room than its base (200% of it)"),  # the oracle hurts it: more than taken
])
def test_the_room_a_run_leaves_beside_the_room_on_its_base(tmp_path, own_rank, taken, reads):
    """A run trained with the oracle detector too (`ral+oracle@msl`): the oracle's room on it against the room
    on its base (`msl+oracle` - `msl`), and the room it takes, the difference (exact where every query moves
    alike: MS-SL's room 0 -> 200 SumR; RAL at 200, its own oracle at 400, 200 or 0)."""
    from test_stats import write_run

    from prvr.harness.reports.stats import Settings
    from prvr.harness.reports.sweeps import SweepRows, render, rooms_left, sweep_cells

    q, fast = 60, Settings(resamples=500, permutations=500)
    for seed in (0, 1):  # rank 150: SumR 0; rank 6: R@10 and R@100, 200; rank 1: 400
        for run, rank in (("msl", 150), ("msl+oracle", 6), ("ral@msl", 6), ("ral+oracle@msl", own_rank)):
            write_run(tmp_path, run, seed, np.full(q, rank), sim={"queries": q})
    sweep = Sweep("sim-x", ("sim.mislabel_rate",), ((0.0,),), (0.0,), ("msl", "ral@msl", "msl+oracle",
                                                                       "ral+oracle@msl"), (0, 1), "cmd")
    rows = SweepRows(tmp_path, sweep)
    cells, facts = sweep_cells(sweep, tmp_path, fast, rows)
    (left,) = rooms_left(sweep, cells, rows, fast)  # only RAL has both its own oracle row and its base's
    assert (left.cell.run, left.own.run, left.base_room.run) == ("ral@msl", "ral+oracle@msl", "msl+oracle")
    assert (left.change.before, left.change.after) == (200.0, {1: 200.0, 6: 0.0, 150: -200.0}[own_rank])
    md, table = render(sweep, cells, facts, (), (), (), (), [left])
    assert "## The room a run leaves" in md
    section = md.split("## The room a run leaves", 1)[1]
    [line] = [line for line in section.splitlines() if line.startswith("| 0 |")]
    assert f"| msl | +200.0 | {taken} | [{taken}, {taken}] | {reads}" in line
    header, *lines = table.splitlines()
    assert header.endswith("the oracle's room on the run,room the run takes,the taken room's 95% interval")
    [ral] = [r for r in csv.DictReader([header, *lines]) if r["run"] == "ral@msl"]
    assert ral["room the run takes"] == taken


def _room_cell(run, base, d):
    """One run's cell at one value, its SumR gain over `base` (mean, low, high) as given."""
    return Cell((0.35,), run, (0, 1), (1, 1), (1, 1), base, _comparison(MetricDifference("SumR", 0, 0, *d, 0.01)))


def test_a_room_taken_the_interval_cannot_bound_below_the_gain_says_only_its_range():
    """Where the room taken holds 0 and reaches past the run's gain's lower bound, the reads give its range and
    credit nothing either way."""
    from prvr.harness.reports.stats import GainChange
    from prvr.harness.reports.sweeps import RoomLeft, _room_left_reads

    left = RoomLeft(_room_cell("ral@msl", "msl", (3.0, 1.0, 5.0)),
                    _room_cell("ral+oracle@msl", "ral@msl", (2.0, -1.0, 5.0)),
                    _room_cell("msl+oracle", "msl", (4.0, 1.0, 8.0)), None)
    change = GainChange(4.0, 2.0, -2.0, -7.0, 3.0, (0, 1))
    assert _room_left_reads(left, change) == ("no difference the interval can tell: it takes between -3.0 and 7.0 "
                                              "of the base's 4.0")


def test_less_room_on_a_run_that_loses_to_its_base_is_not_room_taken():
    """A run whose own room is smaller than its base's while its gain over the base is below zero (ARL's whole
    objective against its encoder, the true pairs as positives on both) takes none of the base's room: its
    own objective leaves less to take. The reads say so, not "it takes part of what the false negatives cost"."""
    from prvr.harness.reports.stats import GainChange
    from prvr.harness.reports.sweeps import RoomLeft, _room_left_reads

    left = RoomLeft(_room_cell("arl", "arl~base", (-3.8, -8.4, -0.4)),
                    _room_cell("arl+oracle~positive", "arl", (2.0, -4.8, 10.9)),
                    _room_cell("arl+oracle~tv_only-positive", "arl~base", (9.5, 5.2, 13.1)), None)
    change = GainChange(9.5, 2.0, -7.5, -12.0, -2.0, (0, 1))
    assert _room_left_reads(left, change) == ("leaves less room than its base (+2.0 against +9.5) while it loses to "
                                              "the base (-3.8): less is left to take on it, none of it taken")
    winner = RoomLeft(_room_cell("ral@msl", "msl", (3.0, 1.0, 5.0)), left.own, left.base_room, None)
    assert _room_left_reads(winner, change).startswith("leaves less room than its base (79% of it): it takes part")


@pytest.mark.parametrize("low, high, than", [(1.0, 6.0, "less than its base"), (-6.0, -1.0, "more than its base"),
                                              (-2.0, 6.0, "as much as its base, as far as the interval can tell")])
def test_a_base_the_oracle_costs_has_no_room_to_take(low, high, than):
    """Where knowing every false negative costs the base (its room's whole interval below zero: ARL's encoder
    with them left out of its negatives), the run takes nothing, however its own room compares: the reads
    say the oracle costs the base, and whether it costs the run less or more."""
    from prvr.harness.reports.stats import GainChange
    from prvr.harness.reports.sweeps import RoomLeft, _room_left_reads

    left = RoomLeft(_room_cell("arl", "arl~base", (-3.0, -4.5, -1.5)),
                    _room_cell("arl+oracle", "arl", (-2.5, -4.4, -0.6)),
                    _room_cell("arl+oracle~tv_only-ignore", "arl~base", (-6.2, -9.1, -3.1)), None)
    change = GainChange(-6.2, -2.5, 3.7, low, high, (0, 1))
    assert _room_left_reads(left, change) == (f"knowing the false negatives costs its base (-6.2): no room to take; "
                                              f"it costs the run {than}")


@pytest.mark.parametrize("low, high, reads", [(2.0, 8.0, "recovers this share"), (-2.0, 8.0, "recovers no part"),
                                               (-8.0, -2.0, "adds to its base's cost")])
def test_a_run_below_its_base_under_the_noise_reads_as_adding_to_the_cost(low, high, reads):
    """The cost table's reads: a gain over the base whose whole interval is below zero adds to what the
    noise costs the base (RAL on MS-SL at 40% mislabelled pairs), not merely recovers none of it."""
    from prvr.harness.reports.sweeps import Cost, _cost_reads

    cell = Cell((0.4,), "m", (0, 1), (1.0, 1.0), (1.0, 1.0), "b", None, "")
    cost = MetricDifference("SumR", 1.0, 2.0, 10.0, 5.0, 15.0, 0.01)
    gain = MetricDifference("SumR", 1.0, 2.0, (low + high) / 2, low, high, 0.01)
    assert _cost_reads(Cost(cell, cost, None), gain, cost).startswith(reads)


def _plain_record(out, cfg):
    """A stored plain row of sim-tiny's baseline, seed 0 (its config is all a kept check reads)."""
    import json

    path = out / "runs" / "sim-tiny" / "baseline" / "seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"method": "baseline", "dataset": "sim-tiny", "seed": 0, "run_name": "baseline",
                                "config": cfg.to_dict(), "provenance": {}, "metrics": {"val": {}, "test": {}}}))
    return path


@pytest.mark.parametrize("command", [
    ["sweep", "--knob", "sim.mislabel_rate", "--values", "0", "--method", "baseline"],
    ["bench", "--method", "baseline", "--skip-existing"],
])
def test_a_record_kept_by_its_name_must_be_the_run_planned(tmp_path, capsys, command):
    """A `--set` without a `--tag` of its own names the plain row's run: its stored record (another
    world, here fewer training videos) must not stand in for it, as kept, in the plan and the report."""
    cfg = resolve("baseline", "sim-tiny", 0, ["sim.mislabel_rate=0"])
    path = _plain_record(tmp_path, cfg)
    argv = [*command, "--dataset", "sim-tiny", "--seeds", "0", "--out", str(tmp_path), "--plan", "--quiet"]
    other = cfg.sim.train_videos + 8
    assert main([*argv, "--set", "sim.mislabel_rate=0", "--set", f"sim.train_videos={other}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "trained with other settings" in err
    assert f"sim.train_videos {cfg.sim.train_videos} / {other}" in err and "give --tag" in err
    assert main([*argv, "--set", "sim.mislabel_rate=0"]) == 0  # the same settings: kept
    assert "kept (record exists)" in capsys.readouterr().out
    assert main([*argv, "--set", "sim.mislabel_rate=0", "--set", f"sim.train_videos={other}", "--tag", "more"]) == 0
    assert "baseline~more" in capsys.readouterr().out  # its own name: planned beside the plain row


@pytest.mark.slow
def test_a_run_that_replaces_a_record_of_other_settings_says_so(tmp_path, capsys):
    fewer = resolve("baseline", "sim-tiny", 0, []).sim.train_videos - 8
    cfg = resolve("baseline", "sim-tiny", 0, [f"sim.train_videos={fewer}"])
    path = _plain_record(tmp_path, cfg)
    assert main(["run", "--method", "baseline", "--dataset", "sim-tiny", "--seed", "0", "--out", str(tmp_path),
                 "--set", "train.epochs=1", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"{path} holds a run trained with other settings" in err and f"sim.train_videos {fewer} / " in err
    assert "train.epochs" in err and "give --tag to keep both" in err


def test_a_base_row_reads_no_relations_and_its_room_is_the_matrix_cell():
    """ARL's base row trains without detected pairs, so an oracle run beside it is the same run; its room is
    the oracle cell on ARL's encoder (test_the_room_beside_a_base_row_is_the_matrix_cell_and_the_answer_reads_it)."""
    from prvr.harness.reports.sweeps import reads_no_relations

    assert reads_no_relations("arl~base") and not reads_no_relations("arl") and not reads_no_relations("baseline")
    assert not reads_no_relations("arl+sbert~ignore") and not reads_no_relations("baseline~b32")


def test_the_room_a_run_leaves_is_read_under_its_bases_rooms_treatment():
    """The room-left table reads the run's own oracle row against its base's room: beside a base that reads no
    relations, whose room is a matrix cell under a treatment, the run's oracle row under that same treatment
    (ARL's Table 6 rows with the oracle's pairs), never `arl+oracle` (the pairs restrained, ARL's own treatment)
    against a room of positives; elsewhere the run's oracle row."""
    from prvr.harness.reports.sweeps import own_room

    assert own_room("arl", "arl~base") == "arl+oracle~positive"
    assert own_room("arl", "arl~base", "ignore") == "arl+oracle~ignore"
    assert own_room("ral@msl", "msl") == "ral+oracle@msl" and own_room("baseline+holmes~soft", "baseline") == \
        "baseline+oracle~soft"


def test_runs_that_localize_report_their_vcmr_gains_over_the_seeds():
    """XML and its conditions localize: their records carry VCMR SumR; where no stored rankings hold their
    per-query moment ranks (these hand-made cells, records made before the ranks were kept), a sweep of them
    reports each VCMR gain over its base with the paired t-test's interval over the seeds
    (scipy.stats.ttest_rel), a VCMR slope, and CSV columns; a sweep of runs without it keeps its tables
    (the stored-rank case: tests/test_moment_rankings.py).
    `xml-pr`'s base is `xml`, the method whose objective it weighs otherwise."""
    import scipy.stats

    from prvr.harness.reports.sweeps import moment_gains, moment_rows, render, slopes

    assert base_of("xml-pr") == "xml" and base_of("xml-sl-pr") == "xml" and base_of("xml") is None
    assert base_of("xml-pr+oracle~repeat_prob0") == "xml-pr~repeat_prob0" and base_of("msl") is None
    nan, seeds = float("nan"), (0, 1, 2)
    base = {0.0: (100.0, 110.0, 90.0), 1.0: (100.0, 110.0, 90.0)}
    pr = {0.0: (104.0, 113.0, 95.0), 1.0: (120.0, 130.0, 111.0)}
    cells = [c for v in (0.0, 1.0) for c in (
        Cell((v,), "xml", seeds, (150,) * 3, (190,) * 3, "", None, "", base[v]),
        Cell((v,), "xml-pr", seeds, (155,) * 3, (195,) * 3, "xml", None, "", pr[v]))]
    cells.append(Cell((1.0,), "xml-pr+oracle", seeds, (156,) * 3, (196,) * 3, "xml-pr", None, "", (nan, 1.0, nan)))
    gains = moment_gains(cells)
    assert [(g.cell.value, g.cell.run) for g in gains] == [((0.0,), "xml-pr"), ((1.0,), "xml-pr")]  # one seed: none
    want = scipy.stats.ttest_rel(pr[0.0], base[0.0])
    g = gains[0]
    assert g.seeds == seeds and g.difference == pytest.approx(4.0) and g.p == pytest.approx(want.pvalue)
    assert (g.low, g.high) == pytest.approx(tuple(want.confidence_interval(0.95)))
    sweep = Sweep("sim-x", ("sim.repeat_prob",), ((0.0,), (1.0,)), (0.0,), ("xml", "xml-pr"), seeds, "cmd")
    facts = {(0.0,): {"multi-relevant share (test)": 0.0}, (1.0,): {"multi-relevant share (test)": 0.5}}
    (slope,) = slopes(sweep, cells, facts, "moments")  # gains (4, 3, 5) at 0 points of share, (20, 20, 21) at 50
    assert (slope.run, slope.points, slope.per_10) == ("xml-pr", 6, pytest.approx(10 * (61 / 3 - 4) / 50))
    md, table = render(sweep, cells, facts, (), (), (), (), (), gains, [slope])
    assert "## Moments: VCMR SumR" in md and "VCMR slope per 10 pts of share" in md
    assert (f"| 0 | xml-pr | 0 1 2 | 104.0 ± 9.0 | xml | +4.0 | [{g.low:+.1f}, {g.high:+.1f}] | {g.p:.3g} | "
            "seeds (t-test) |") in md  # no stored rankings here: the seeds are the only level
    assert "| 1 | xml-pr+oracle | 1 | 1.0 | xml-pr |  |  |  |  |" in md  # the one seed with the figure, no gain
    assert table.splitlines()[0].endswith("VCMR SumR,gain (VCMR SumR),VCMR gain's 95% interval,VCMR gain's p,"
                                          "VCMR interval over")
    plain = [dataclasses.replace(c, moments=(nan,) * 3) for c in cells]
    assert moment_rows(plain, ()) == [] and moment_gains(plain) == []
    md, table = render(sweep, plain, facts)
    assert "VCMR" not in md and "VCMR" not in table


def test_a_gain_between_rows_made_on_two_machines_says_so(tmp_path):
    """Another processor rounds differently and training carries it into the figures (XML seed 0 on
    sim-charades-v moved by 2.1 SumR from an Intel Xeon to an AMD EPYC at one commit, docs/records.md): a gain
    whose run and base seeds were made on different machines says so in the runs table and in its reads;
    rows made on one machine say nothing of it."""
    from test_stats import write_run

    from prvr.harness.reports.stats import Settings
    from prvr.harness.engine.records import drift_note, machine_of
    from prvr.harness.reports.sweeps import SweepRows, answers, render, sweep_cells

    intel, amd = "Intel Xeon (family 6, model 207)", "AMD EPYC (family 25, model 17)"
    assert machine_of({"provenance": {"device": "cpu (1 threads)", "cpu": {"model": amd}}}) == amd
    assert machine_of({"provenance": {"device": "cuda (NVIDIA H200)", "cpu": {"model": amd}}}) == "cuda (NVIDIA H200)"
    q, fast = 60, Settings(resamples=200, permutations=200)
    for run, model in (("b", intel), ("b+oracle", amd), ("c", intel), ("c+oracle", intel)):
        for seed in (0, 1):
            path = write_run(tmp_path, run, seed, np.full(q, 5 if "+" in run else 6), sim={"queries": q})
            record = json.loads(path.read_text())
            record["provenance"].update(device="cpu (1 threads)", cpu={"model": model})
            path.write_text(json.dumps(record))
    sweep = Sweep("sim-x", ("sim.repeat_prob",), ((0.35,),), (0.35,), ("b", "b+oracle", "c", "c+oracle"), (0, 1), "cmd")
    rows = SweepRows(tmp_path, sweep)
    cells, facts = sweep_cells(sweep, tmp_path, fast, rows)
    drift = {c.run: c.drift for c in cells}
    assert drift == {"b": "", "c": "", "c+oracle": "",
                     "b+oracle": f"made on two machines (b+oracle on {amd}; b on {intel}): the gain holds their drift"}
    md, _ = render(sweep, cells, facts, (), answers(sweep, cells, rows, fast))
    line = next(x for x in md.splitlines() if x.startswith("| 0.35 | b+oracle | 0 1 |"))
    assert line.endswith(f"| {drift['b+oracle']} |")
    reads = [x for x in md.splitlines() if "| b+oracle | b |" in x]
    assert reads and reads[0].endswith(f"; {drift['b+oracle']} |")
    assert not any("two machines" in x for x in md.splitlines() if "| c+oracle |" in x)
    assert drift_note("r", {0: amd, 1: ""}, "b", {0: amd, 1: intel}) == ""  # a seed naming no machine: not told
    assert drift_note("r", {0: amd, 1: ""}, "b", {0: intel, 1: intel}) == \
        f"made on two machines (r on {amd}; b on {intel}): the gain holds their drift"  # the unnamed seed not listed
    other = "Intel Xeon (family 6, model 85)"  # three processors over the two rows: the note counts them
    assert drift_note("r", {0: amd, 1: intel}, "b", {0: other, 1: other}) == \
        f"made on three machines (r on {amd} and {intel}; b on {other}): the gain holds their drift"
