"""`prvr-bench calibrate-world` and the census's ambiguity columns: figures made by hand."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from prvr.harness.census import ambiguity
from prvr.harness.cli import main
from prvr.harness.world_calibration import World, distance, read_worlds, within

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
