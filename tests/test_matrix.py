"""`prvr-bench matrix` (harness/cli/matrix.py, harness/reports/matrix.py): each (detector, treatment,
backbone) cell is a recipe of registered parts, named as the suite names its runs; a cell whose parts do
not fit says why and trains nothing; bad input is one line with nothing written; the report reads the
records (fake ones here, and two cells trained on sim-tiny, one epoch a run, in the slow test)."""

import csv
import shlex

import pytest

from prvr.harness.cli import main
from prvr.harness.cli.args import parse_command
from prvr.harness.cli.matrix import TREATMENTS, plan_matrix, recipe
from prvr.harness.engine.config import resolve
from prvr.harness.engine.runner import run_name
from prvr.harness.reports.stats import Settings, compare_rows, load_row
from prvr.methods.recipes import TABLES
from test_stats import random_ranks, write_run

TINY = ["--dataset", "sim-tiny", "--quiet"]


def planned(tmp_path, *argv):
    matrix, cells = plan_matrix(parse_command("matrix", [*TINY, "--out", str(tmp_path), *argv]))
    return matrix, {(p.cell.detector, p.cell.treatment, p.cell.backbone): p for p in cells}


def test_a_cell_is_the_run_the_suite_already_names(tmp_path):
    """Cells that the suite has trained under a name map to that run folder, and the recipe's own
    `prvr-bench run` line makes a run of that name."""
    _, cells = planned(tmp_path)
    names = {key: p.cell.run for key, p in cells.items()}
    assert names[("oracle", "positive", "dual-branch")] == "baseline+oracle"
    assert names[("oracle", "ignore", "dual-branch")] == "baseline+oracle~ignore"  # not the positive mode's run
    assert names[("none", "positive", "dual-branch")] == names[("none", "ignore", "dual-branch")] == "baseline"
    assert names[("none", "restrain", "arl")] == "arl~base"  # ARL's own base row, Table 5 (a)
    # ARL's cells start from its T-V row, Table 5 (b): under ARL's own detector and restrain, that row's run
    table5 = {r.overrides: r.tag for r in TABLES[("arl", "5")].rows}
    assert names[("arl", "restrain", "arl")] == f"arl~{table5[('loss.variant=tv_only',)]}" == "arl~tv_only"
    assert names[("oracle", "restrain", "arl")] == "arl+oracle~tv_only"
    assert names[("arl", "positive", "arl")] == "arl~tv_only-positive"  # not Table 6's `arl~positive` (full ARL)
    assert names[("oracle", "ignore", "arl")] == "arl+oracle~tv_only-ignore"
    assert names[("sbert", "ignore", "msl")] == "msl+sbert" and names[("oracle", "positive", "msl")] == "msl+oracle"
    # the standard objectives' loss.treatment: restrain on their own backbone, positive from a detector without a mode
    assert names[("oracle", "restrain", "dual-branch")] == "baseline+oracle~restrain"
    assert names[("sbert", "positive", "gmmformer")] == "gmmformer+sbert~positive"
    assert names[("none", "restrain", "msl")] == "msl"  # no pair detected: the plain cell
    oracle_ignore = cells[("oracle", "ignore", "dual-branch")]
    assert "--set relations.name=oracle --set relations.oracle.mode=ignore --tag ignore" in oracle_ignore.cell.recipe
    assert cells[("none", "positive", "dual-branch")].cell.plain
    for key in (("oracle", "ignore", "dual-branch"), ("oracle", "positive", "arl"), ("none", "restrain", "arl"),
                ("oracle", "restrain", "msl")):
        line = cells[key].cell.recipe
        args = parse_command("run", [*shlex.split(line)[2:], "--seed", "1"])
        cfg = resolve(args.method, args.dataset, args.seed,
                      [*([f"backbone={args.backbone}"] if args.backbone else []), *args.overrides])
        assert run_name(cfg, args.tag) == cells[key].cell.run, line
        assert cfg.to_dict() == cells[key].runs[1].cfg.to_dict()


def test_derived_settings_of_cells():
    oracle = recipe("oracle", TREATMENTS["positive"], "arl")  # ARL's loss treats the pairs; the oracle hands them over
    assert not isinstance(oracle, str)
    assert (oracle.method, oracle.sets) == ("arl", ("relations.name=oracle", "loss.variant=tv_only",
                                                    "loss.treatment=positive", "relations.oracle.mode=ignore"))
    assert oracle.tag == "tv_only-positive"  # from ARL's treatment row, by the treatment alone
    base = recipe("oracle", TREATMENTS["ignore"], "dual-branch")
    assert not isinstance(base, str) and base.sets == ("relations.name=oracle", "relations.oracle.mode=ignore")
    # the standard objectives: restrain is the backbone's own method with loss.treatment=restrain
    restrain = recipe("oracle", TREATMENTS["restrain"], "dual-branch")
    assert not isinstance(restrain, str)
    assert (restrain.method, restrain.sets) == ("baseline", ("relations.name=oracle", "loss.treatment=restrain",
                                                             "relations.oracle.mode=ignore"))
    # their positive trains what the oracle's mode positive gives: the oracle keeps its mode (the suite's run);
    # a detector without a mode hands its pairs over as ambiguous and the loss makes them positives
    positive = recipe("oracle", TREATMENTS["positive"], "msl")
    assert not isinstance(positive, str)
    assert positive.sets == ("relations.name=oracle", "relations.oracle.mode=positive")
    sbert = recipe("sbert", TREATMENTS["positive"], "dual-branch")
    assert not isinstance(sbert, str) and sbert.sets == ("relations.name=sbert", "loss.treatment=positive")


def test_holmes_and_soft_cells(tmp_path):
    """soft with the holmes detector is the standard objective's loss.treatment=soft; with a detector that trusts
    every label it is that detector's ignore cell; the holmes detector hands over no pair, so the other treatments
    train the plain cell; on Holmes' backbone the holmes x soft cell is Holmes' own run."""
    soft = recipe("holmes", TREATMENTS["soft"], "dual-branch")
    assert not isinstance(soft, str)
    assert (soft.method, soft.backbone, soft.sets) == ("baseline", "dual-branch",
                                                       ("relations.name=holmes", "loss.treatment=soft"))
    _, cells = planned(tmp_path, "--backbones", "dual-branch", "msl", "gmmformer", "arl", "holmes")
    cell = cells[("holmes", "soft", "dual-branch")]
    assert cell.cell.run == "baseline+holmes~soft" and not cell.cell.plain
    assert cell.cell.recipe.endswith("--set relations.name=holmes --set loss.treatment=soft --tag soft")
    cfg = cell.runs[0].cfg
    assert (cfg.method, cfg.relations.name, cfg.loss.treatment) == ("baseline", "holmes", "soft")
    assert cells[("holmes", "soft", "msl")].cell.run == "msl+holmes~soft"
    assert cells[("holmes", "soft", "gmmformer")].cell.run == "gmmformer+holmes~soft"
    for t in ("positive", "ignore", "restrain"):
        assert cells[("holmes", t, "dual-branch")].cell.run == "baseline" and cells[("holmes", t, "msl")].cell.plain
    assert cells[("oracle", "soft", "dual-branch")].cell.run == cells[("oracle", "ignore", "dual-branch")].cell.run \
        == "baseline+oracle~ignore"
    assert cells[("sbert", "soft", "msl")].cell.run == "msl+sbert"
    assert cells[("none", "soft", "gmmformer")].cell.run == "gmmformer"
    assert cells[("holmes", "soft", "holmes")].cell.run == "holmes"  # Holmes' own method and detector, untagged
    assert cells[("holmes", "soft", "holmes")].runs[0].cfg.relations.name == "holmes"


@pytest.mark.parametrize("cell, says", [
    (("oracle", "soft", "arl"), "the objective of arl reads no confidence in the labelled pairs (its loss.treatment "
                                "values restrain, positive, ignore train a detector's pairs; no soft targets), and "
                                "soft's objective (holmes) needs"),
    (("holmes", "soft", "arl"), "which backbone arl does not provide"),
    (("holmes", "restrain", "arl"), "detector holmes needs clip_frame, which backbone arl does not provide"),
    (("oracle", "restrain", "gmmformer2"), "needs frame_items and theta_phi, which backbone gmmformer2 does not"),
    (("none", "multi-level", "msl"), "needs span_logits, which backbone msl does not provide"),
    (("arl", "ignore", "gmmformer"), "detector arl needs frame_views, which backbone gmmformer does not provide"),
    (("arl", "restrain", "msl"), "detector arl needs frame_views, which backbone msl does not provide"),
    (("sbert", "positive", "gmmformer2"), "no relations.sbert.mode that makes them positives"),
])
def test_a_cell_whose_parts_do_not_fit_says_why(tmp_path, cell, says):
    _, cells = planned(tmp_path, "--backbones", "dual-branch", "msl", "gmmformer", "gmmformer2", "arl")
    p = cells[cell]
    assert says in p.cell.reason and "\n" not in p.cell.reason
    assert p.cell.run == "" and p.runs == ()


def test_an_impossible_cell_trains_nothing_and_its_reason_is_in_the_report(tmp_path, capsys):
    code = main(["matrix", *TINY, "--out", str(tmp_path), "--detectors", "oracle", "--treatments", "restrain",
                 "multi-level", "--backbones", "gmmformer2", "--set", "train.epochs=1"])
    assert code == 0
    assert not (tmp_path / "runs").exists()
    md = (tmp_path / "matrix" / "sim-tiny.md").read_text()
    assert "cannot work: restrain's objective (arl) needs frame_items and theta_phi" in md
    rows = list(csv.DictReader((tmp_path / "matrix" / "sim-tiny.csv").open()))
    assert [r["status"] for r in rows] == ["cannot work", "cannot work"] and all(r["reason or note"] for r in rows)


@pytest.mark.parametrize("argv, says", [
    (["--detectors", "oracel"], "unknown relation detector 'oracel': did you mean 'oracle'"),
    (["--treatments", "restrained"], "unknown treatment 'restrained': did you mean 'restrain'"),
    (["--backbones", "dual_branch"], "unknown backbone 'dual_branch'"),
    (["--backbones", "baseline"], "a method, not a backbone; its backbone is dual-branch"),
    (["--detectors", "none", "none"], "none given twice"),
    (["--set", "relations.name=oracle"], "each cell sets relations.name itself"),
    (["--set", "relations.oracle.mode=ignore"], "each cell sets relations.oracle.mode itself"),
    (["--backbone", "msl"], "the matrix's backbones are --backbones"),
    (["--name", "../x"], "--name"),
    (["--dataset", "no-such-world"], "unknown dataset"),
    (["--set", "sim.repeat_prob=2"], "repeat_prob"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, says):
    code = main(["matrix", *TINY, "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_world_knobs_tag_the_runs_as_a_sweep_does(tmp_path):
    default = resolve("baseline", "sim-tiny", 0, []).sim.repeat_prob
    _, cells = planned(tmp_path, "--backbones", "dual-branch", "--set", "sim.repeat_prob=0.9")
    assert cells[("none", "positive", "dual-branch")].cell.run == "baseline~repeat_prob0.9"
    assert cells[("oracle", "ignore", "dual-branch")].cell.run == "baseline+oracle~ignore~repeat_prob0.9"
    _, same = planned(tmp_path, "--backbones", "dual-branch", "--set", f"sim.repeat_prob={default:g}")
    assert same[("oracle", "positive", "dual-branch")].cell.run == "baseline+oracle"  # the preset's world: untagged


# ----------------------------------------------------------------------------- the report from records
def fake_cells(out, runs, seeds=(0, 1, 2), **kw):
    for i, run in enumerate(runs):
        for s in seeds:
            write_run(out, run, s, random_ranks(80, 10 * i + s), dataset="sim-tiny", **kw)


ONE_TABLE = ["--detectors", "none", "oracle", "--treatments", "positive", "ignore", "--backbones", "dual-branch"]


def test_the_report_reads_each_cell_and_its_gain_over_the_plain_cell(tmp_path, capsys):
    fake_cells(tmp_path, ["baseline", "baseline+oracle"])
    write_run(tmp_path, "baseline+oracle~ignore", 0, random_ranks(80, 99), dataset="sim-tiny")  # one seed of three
    assert main(["matrix", *TINY, "--out", str(tmp_path), "--report-only", *ONE_TABLE]) == 0
    rows = {(r["detector"], r["treatment"]): r for r in csv.DictReader((tmp_path / "matrix" / "sim-tiny.csv").open())}
    assert len(rows) == 4
    plain, positive, ignore = rows[("none", "positive")], rows[("oracle", "positive")], rows[("oracle", "ignore")]
    assert plain["status"] == "made" and plain["run"] == "baseline" and plain["gain (SumR)"] == ""
    assert rows[("none", "ignore")]["run"] == "baseline"  # the same run: no pair detected, nothing to treat
    a, b = (load_row(tmp_path, "sim-tiny", run) for run in ("baseline+oracle", "baseline"))
    d = compare_rows(a, b, Settings(metrics=("SumR",))).metrics[0]
    assert positive["gain (SumR)"] == f"{d.difference:+.2f}"
    assert positive["95% interval"] == f"[{d.low:+.2f}, {d.high:+.2f}]"
    assert positive["plain run"] == "baseline" and positive["seeds"] == "0 1 2"
    assert ignore["status"] == "partly run" and "share 1 seed" in ignore["reason or note"]
    md = (tmp_path / "matrix" / "sim-tiny.md").read_text()
    assert "## Backbone dual-branch (plain cell: baseline)" in md and "| detector | positive | ignore |" in md
    assert f"gain {d.difference:+.1f} [{d.low:+.1f}, {d.high:+.1f}]" in md
    assert "(seeds 0 of 0 1 2)" in md


def test_a_gain_over_a_plain_cell_made_on_another_machine_says_so(tmp_path, capsys):
    """A cell whose seeds were made on another processor than the plain cell's: its gain holds the machines'
    drift as well as the cell's change (docs/records.md), so the grid marks it and lists why under the
    backbone's table, and the CSV's note says so; a cell made where the plain cell was says nothing of it."""
    import json

    from prvr.harness.engine.records import record_path

    fake_cells(tmp_path, ["baseline", "baseline+oracle"])
    for run, model in (("baseline", "Intel Xeon (family 6, model 207)"), ("baseline+oracle", "AMD EPYC (family 25, "
                                                                                             "model 17)")):
        for seed in (0, 1, 2):
            path = record_path(tmp_path, "sim-tiny", run, seed)
            record = json.loads(path.read_text())
            record["provenance"].update(device="cpu (1 threads)", cpu={"model": model})
            path.write_text(json.dumps(record))
    assert main(["matrix", *TINY, "--out", str(tmp_path), "--report-only", *ONE_TABLE]) == 0
    rows = {(r["detector"], r["treatment"]): r for r in csv.DictReader((tmp_path / "matrix" / "sim-tiny.csv").open())}
    note = ("made on two machines (baseline+oracle on AMD EPYC (family 25, model 17); baseline on Intel Xeon "
            "(family 6, model 207)): the gain holds their drift")
    assert rows[("oracle", "positive")]["reason or note"] == note and rows[("none", "positive")]["reason or note"] == ""
    md = (tmp_path / "matrix" / "sim-tiny.md").read_text()
    assert "; made on two machines (below)" in md and f"- {note}" in md


def test_a_cell_not_run_gives_its_command(tmp_path):
    fake_cells(tmp_path, ["baseline"])
    assert main(["matrix", *TINY, "--out", str(tmp_path), "--report-only", *ONE_TABLE, "--name", "part"]) == 0
    md = (tmp_path / "matrix" / "sim-tiny~part.md").read_text()
    assert "not run (`prvr-bench run --method baseline --dataset sim-tiny" in md
    assert "--set relations.oracle.mode=ignore --tag ignore --seed S`, S = 0 1 2)" in md
    rows = list(csv.DictReader((tmp_path / "matrix" / "sim-tiny~part.csv").open()))
    assert sorted(r["status"] for r in rows) == ["made", "made", "not run", "not run"]


def test_records_of_another_world_are_refused_and_nothing_is_written(tmp_path, capsys):
    fake_cells(tmp_path, ["baseline"])
    fake_cells(tmp_path, ["baseline+oracle"], generator=3)
    code = main(["matrix", *TINY, "--out", str(tmp_path), "--report-only", *ONE_TABLE])
    err = capsys.readouterr().err
    assert code == 2 and "was made on another world than" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "matrix").exists()


# ----------------------------------------------------------------------------- two cells trained
@pytest.mark.slow
def test_two_cells_train_once_and_fill_the_report(tmp_path, capsys):
    argv = ["matrix", *TINY, "--out", str(tmp_path), "--detectors", "none", "oracle", "--treatments", "positive",
            "--backbones", "dual-branch", "--seeds", "0", "1", "--set", "train.epochs=1"]
    assert main(argv) == 0
    runs = sorted(p.parent.name for p in (tmp_path / "runs" / "sim-tiny").glob("*/seed1.json"))
    assert runs == ["baseline", "baseline+oracle"]
    rows = {r["detector"]: r for r in csv.DictReader((tmp_path / "matrix" / "sim-tiny.csv").open())}
    assert rows["none"]["status"] == rows["oracle"]["status"] == "made"
    low, high = (float(x) for x in rows["oracle"]["95% interval"].strip("[]").split(","))
    assert low <= float(rows["oracle"]["gain (SumR)"]) <= high
    capsys.readouterr()
    assert main([*argv, "--plan"]) == 0  # every run kept, none made twice
    out = capsys.readouterr().out
    assert out.count("kept (2 records)") == 2 and "4 runs (4 kept, 0 to make)" in out
