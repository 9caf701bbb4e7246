"""`prvr-bench calibrate-world` and the census's ambiguity columns: figures made by hand."""

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from prvr.harness.cli.census import ambiguity
from prvr.harness.cli import main
from prvr.harness.reports.world_calibration import World, distance, read_worlds, within

HEAD = "dataset,world,split,queries,videos,phi,theta,precision,recall,base_rate,lift,multi_relevant_share,relevant_per_query"


def _table(path, rows):
    path.write_text(HEAD + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_ambiguity_counts_the_labelled_video_and_only_covered_queries():
    # 4 queries over 3 videos: 1, 3, 0 (not covered by the file), 2 relevant videos
    rel = sp.csr_matrix(np.array([[1, 0, 0], [1, 1, 1], [0, 0, 0], [0, 1, 1]], dtype=bool))
    assert ambiguity(rel, None) == {"multi_relevant_share": pytest.approx(2 / 3), "relevant_per_query": 2.0}
    covered = np.array([True, False, True, True])
    assert ambiguity(rel, covered) == {"multi_relevant_share": 0.5, "relevant_per_query": 1.5}


def test_distance_is_the_mean_log_ratio_with_extra_relevant_videos():
    real = World("tvr", "r.csv", {"multi_relevant_share": 0.1, "relevant_per_query": 1.2}, {0.7: 0.2}, {0.7: 70.0})
    same = World("w", "w.csv", dict(real.ambiguity), dict(real.recall), dict(real.lift))
    assert distance(same, real, [0.7]) == 0 and within(same, real, [0.7]) == []
    # twice the multi share, 1.4 relevant per query (0.4 extra against 0.2: also x2), the rest equal
    off = World("w", "w.csv", {"multi_relevant_share": 0.2, "relevant_per_query": 1.4}, {0.7: 0.2}, {0.7: 70.0})
    assert distance(off, real, [0.7]) == pytest.approx(2 * math.log(2) / 4)
    assert within(off, real, [0.7]) == ["multi_relevant_share", "relevant_per_query"]


def test_calibrate_world_ranks_the_worlds_and_marks_the_preset_and_the_chosen(tmp_path, capsys):
    real = _table(tmp_path / "tvr~relevance.csv", [
        "tvr,,val,10,5,sent,0.7,0.01,0.2,0.0001,100,0.1,1.2",
        "tvr,,val,10,5,np-vp,0.7,0.01,0.4,0.0001,100,0.1,1.2"])  # another Phi: not compared
    sims = _table(tmp_path / "sim-tvr~sweep.csv", [
        "sim-tvr,,test,10,5,sent,0.7,0.1,0.5,0.001,100,0.3,2.0",
        "sim-tvr,sim.repeat_prob=0.1,test,10,5,sent,0.7,0.1,0.2,0.001,100,0.1,1.2",
        "sim-tvr,sim.repeat_prob=0.1,train,10,5,sent,0.7,0.1,0.9,0.001,100,0.1,1.2"])  # train: not compared
    assert main(["calibrate-world", "--world", "sim-tvr", "--real", str(real), "--tables", str(sims),
                 "--chosen", "sim.repeat_prob=0.1", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "calibration" / "sim-tvr~real.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| tvr", "| sim.repeat_prob=0.1", "| sim-tvr"]  # nearest first
    assert rows[1].endswith("| 0.000 | none | chosen |")
    assert "the preset before calibration" in rows[2] and "multi_relevant_share, relevant_per_query, recall@0.7" in rows[2]
    assert md in capsys.readouterr().out


def test_the_written_command_runs_again_from_where_it_ran(tmp_path, monkeypatch):
    """Relative paths as given, so the command beside the figures runs again; a path outside the
    folder it ran in by its name only (no machine path in a committed report)."""
    census = tmp_path / "results" / "census"
    census.mkdir(parents=True)
    real = _table(census / "tvr~relevance.csv", ["tvr,,val,10,5,sent,0.7,0.01,0.2,0.0001,100,0.1,1.2"])
    sims = _table(census / "sim-tvr~sweep.csv", ["sim-tvr,,test,10,5,sent,0.7,0.1,0.5,0.001,100,0.3,2.0"])
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate-world", "--world", "sim-tvr", "--real", "results/census/tvr~relevance.csv",
                 "--tables", str(sims), "--out", "results"]) == 0
    md = (tmp_path / "results" / "calibration" / "sim-tvr~real.md").read_text()
    assert ("`prvr-bench calibrate-world --world sim-tvr --real 'results/census/tvr~relevance.csv' --tables "
            "'results/census/sim-tvr~sweep.csv'`") in md
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert main(["calibrate-world", "--world", "sim-tvr", "--real", str(real), "--tables", str(sims),
                 "--out", str(other)]) == 0
    md = (other / "calibration" / "sim-tvr~real.md").read_text()
    assert "--real 'tvr~relevance.csv' --tables 'sim-tvr~sweep.csv'`" in md and str(tmp_path) not in md


def test_a_table_without_the_columns_is_one_line_naming_file_line_and_fix(tmp_path, capsys):
    old = tmp_path / "old.csv"
    old.write_text("dataset,split,phi,theta,precision,recall,base_rate\ntvr,val,sent,0.7,0.01,0.2,0.0001\n")
    with pytest.raises(Exception) as err:
        read_worlds(old, None)
    assert "old.csv, line 2" in str(err.value) and "multi_relevant_share" in str(err.value)
    assert main(["calibrate-world", "--world", "sim-tvr", "--real", str(old), "--tables", str(old),
                 "--out", str(tmp_path)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.count("\n") == 1 and "prvr-bench census" in err_text


def test_chosen_and_before_must_name_worlds_of_the_tables(tmp_path, capsys):
    real = _table(tmp_path / "real.csv", ["tvr,,val,10,5,sent,0.7,0.01,0.2,0.0001,100,0.1,1.2"])
    sims = _table(tmp_path / "sims.csv", ["sim-tvr,sim.seed=0,test,10,5,sent,0.7,0.1,0.5,0.001,100,0.3,2.0"])
    args = ["calibrate-world", "--world", "sim-tvr", "--real", str(real), "--tables", str(sims), "--out", str(tmp_path)]
    assert main([*args, "--before", "sim.seed=1"]) == 2
    assert "--before 'sim.seed=1': no such world" in capsys.readouterr().err
    assert main([*args, "--before", "sim.seed=0"]) == 0
    assert "| sim.seed=0 |" in (tmp_path / "calibration" / "sim-tvr~real.md").read_text()
    assert "the preset before calibration" in (tmp_path / "calibration" / "sim-tvr~real.csv").read_text()
    assert main([*args, "--preset", "sim-tvr-v", "sim.seed=2"]) == 2
    assert "--preset sim-tvr-v 'sim.seed=2': no such world" in capsys.readouterr().err


def test_a_report_serving_several_presets_marks_each_presets_world(tmp_path):
    """`--preset NAME WORLD` once per calibrated preset of one base world (sim-tvr-v and
    sim-tvr-v2 of sim-tvr): each row says which preset chose it, and the command says so too."""
    real = _table(tmp_path / "real.csv", ["tvr,,val,10,5,sent,0.7,0.01,0.2,0.0001,100,0.1,1.2"])
    sims = _table(tmp_path / "sims.csv", [
        "sim-tvr,sim.seed=0,test,10,5,sent,0.7,0.1,0.5,0.001,100,0.3,2.0",
        "sim-tvr,sim.repeat_prob=0.2,test,10,5,sent,0.7,0.1,0.3,0.001,100,0.1,1.2",
        "sim-tvr,sim.repeat_prob=0.1,test,10,5,sent,0.7,0.1,0.2,0.001,100,0.1,1.2"])
    assert main(["calibrate-world", "--world", "sim-tvr", "--real", str(real), "--tables", str(sims),
                 "--preset", "sim-tvr-v", "sim.repeat_prob=0.2", "--preset", "sim-tvr-v2", "sim.repeat_prob=0.1",
                 "--before", "sim.seed=0", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "calibration" / "sim-tvr~real.md").read_text()
    assert "--preset sim-tvr-v 'sim.repeat_prob=0.2' --preset sim-tvr-v2 'sim.repeat_prob=0.1'" in md
    notes = {line.split(" | ")[0][2:]: line.split(" | ")[-1].rstrip(" |") for line in md.splitlines()
             if line.startswith("| sim.")}
    assert notes == {"sim.repeat_prob=0.1": "chosen: sim-tvr-v2", "sim.repeat_prob=0.2": "chosen: sim-tvr-v",
                     "sim.seed=0": "the preset before calibration"}


# ----------------------------------------------------------------------------- the calibrated variants
def test_a_variant_resolves_as_its_base_but_for_its_world():
    """sim-tvr-v: sim-tvr's protocol, scales and every method's sim-tvr settings; its own knobs."""
    import dataclasses

    from prvr.harness.engine.config import resolve

    knobs = {"repeat_prob", "repeat_copies", "vague_prob", "extra_events", "unnamed_prob"}
    for name, own in (("sim-tvr-v", knobs), ("sim-tvr-v2", knobs | {"compound_prob"})):
        for method in ("baseline", "arl", "xml", "gmmformer2"):
            base, variant = (dataclasses.asdict(resolve(method, d, 0, [])) for d in ("sim-tvr", name))
            assert {k for k in base if base[k] != variant[k]} == {"dataset", "sim"}
            assert {k for k in base["sim"] if base["sim"][k] != variant["sim"][k]} == own
        assert resolve("baseline", name, 0, ["data.scale=full"]).sim.train_videos == 17435


def test_a_variant_of_an_unknown_dataset_is_one_line_naming_the_preset(monkeypatch):
    from prvr.harness.engine import sections
    from prvr.harness.base.io import UserError

    real = sections.load_preset
    odd = {"sim-tvr-v.yaml": {"variant_of": "sim-nowhere"}, "sim-charades-v.yaml": {"variant_of": "sim-tvr-v"}}
    monkeypatch.setattr(sections, "load_preset", lambda path: dict(odd.get(Path(path).name) or real(path)))
    with pytest.raises(UserError, match=r"sim-tvr-v.yaml: 'variant_of' must name another registered dataset, got "
                                        r"'?sim-nowhere'?; fix the preset"):
        sections.dataset_preset("sim-tvr-v")
    with pytest.raises(UserError, match=r"sim-charades-v.yaml: 'variant_of: sim-tvr-v' names a variant itself"):
        sections.dataset_preset("sim-charades-v")


def test_a_calibrated_variant_is_judged_against_the_real_split_not_the_20_percent():
    from prvr.harness.reports import calibration
    from test_calibration import CALIBRATED, sim_record

    real = calibration.real_ambiguity("sim-tvr-v")
    assert real["source"] == "results/census/tvr~relevance-sent.csv"
    facts = {**CALIBRATED, "multi_relevant_share": 0.0908, "relevant_per_query_mean": 1.19}
    recs = [sim_record(s, 180.0 + s, 210.0, facts=facts) for s in range(3)]
    for r in recs:
        r["dataset"] = "sim-tvr-v"
    got = {r.target.split(" ")[0]: r for r in calibration.evaluate(recs, "sim-tvr-v")}
    assert got["share"].status == calibration.MET and "0.091 against 0.100 (x0.91)" in got["share"].measured
    assert got["extra"].status == calibration.MET and "1.190 against 1.177 (x1.07)" in got["extra"].measured
    too_many = {**facts, "multi_relevant_share": 0.34}
    for r in recs:
        r["provenance"]["data"]["test"] = too_many
    got = {r.target.split(" ")[0]: r for r in calibration.evaluate(recs, "sim-tvr-v")}
    assert got["share"].status == calibration.NOT_MET


def test_committed_world_reports_are_what_their_command_writes_from_the_committed_tables(tmp_path, monkeypatch):
    import re
    import shlex

    results = Path(__file__).parent.parent / "results"
    reports = sorted((results / "calibration").glob("*~real.md"))
    if not reports:
        pytest.skip("no committed calibrate-world report")
    monkeypatch.chdir(results.parent)  # the commands name the tables from the repository's root
    for md in reports:
        command = re.search(r"Written by `([^`]+)`", md.read_text()).group(1)
        words = shlex.split(command)[1:]  # without "prvr-bench"
        assert main([*words, "--out", str(tmp_path)]) == 0
        for suffix in (".md", ".csv"):
            name = md.with_suffix(suffix).name
            assert (tmp_path / "calibration" / name).read_text() == (results / "calibration" / name).read_text(), name


def test_each_calibrated_preset_is_the_world_its_report_chose():
    """A variant's `sim` knobs are those of the `chosen` row of its world's committed report, so
    the preset the runs use is the world the report shows meeting (or missing) the targets."""
    import re

    from prvr.harness.engine import sections
    from prvr.harness.base.registry import DATASETS

    results = Path(__file__).parent.parent / "results" / "calibration"
    checked = 0
    for name in ("sim-tvr-v", "sim-tvr-v2", "sim-charades-v"):
        preset = sections.load_yaml(DATASETS.get(name).preset)  # the variant's own keys
        report = results / f"{preset['variant_of']}~real.md"
        lines = report.read_text().splitlines()
        chosen = ([line for line in lines if line.endswith(f"chosen: {name} |")]
                  or [line for line in lines if line.endswith("| chosen |")])
        assert len(chosen) == 1, report
        knobs = dict(word.split("=", 1) for word in chosen[0].split("|")[1].split())
        assert {f"sim.{k}": str(v) for k, v in preset["sim"].items()} == knobs, name
        checked += 1
    assert checked == 3
