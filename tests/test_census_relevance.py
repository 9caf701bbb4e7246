"""`prvr-bench census --relevance FILE`: the detector's pairs on real text against a relevance
file, over the pairs the file judges (tiny layouts and a fake encoder, as tests/test_census.py)."""

from __future__ import annotations

import json

import pytest
from test_census import fakes, read_csv, write_layout  # noqa: F401  (fakes is a fixture)

from prvr.harness.cli import main


def relevance_file(path):
    """q0 (va, opens) is relevant to vb too; q3 (vc, barks) to va too; q1 (va, sits) and q2 (vb,
    opens) are not covered. The detector pairs q0 and q2 (one topic): (q0, vb) and (q2, va), of
    which the file judges (q0, vb) only, a relevant pair."""
    lines = [{"video": "va", "caption": "Person opens the door", "relevant": ["va", "vb"]},
             {"video": "vc", "caption": "a dog barks loudly.", "relevant": ["vc", "va"]},
             {"video": "vz", "caption": "nowhere", "relevant": ["vz"]}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("dataset", ["tvr", "charades"])
def test_precision_recall_and_base_rate_over_the_judged_pairs(tmp_path, fakes, dataset):  # noqa: F811
    root, out = tmp_path / "data", tmp_path / "results"
    root.mkdir()
    write_layout(root, dataset)
    file = relevance_file(tmp_path / "verified.jsonl")
    assert main(["census", "--dataset", dataset, "--data-root", str(root), "--out", str(out), "--phi", "sent",
                 "--theta", "0.7", "--relevance", str(file), "--relevance-source", "someone/labels@abc123"]) == 0
    [row] = read_csv(out / "census" / f"{dataset}~relevance.csv")
    assert (row["covered_queries"], row["judged_videos"]) == ("2", "3")
    assert float(row["judged_pr_videos_per_query"]) == 0.5  # (q0, vb) per covered query
    assert float(row["precision"]) == 1.0 and float(row["recall"]) == 0.5  # truth: (q0, vb), (q3, va)
    assert float(row["base_rate"]) == pytest.approx(2 / (2 * 2))
    assert float(row["pr_videos_per_query"]) == 0.5  # every query's detected pairs, as without a file
    md = (out / "census" / f"{dataset}~relevance.md").read_text()
    assert f"--relevance verified.jsonl --relevance-source someone/labels@abc123`" in md
    assert "Source: someone/labels@abc123." in md and "SHA-256" in md
    assert "2 of 4 queries covered" in md and "file entries that match no query of the split: 1" in md
    assert str(file) not in md  # the file by its name: no path of this machine


def test_relevance_is_for_real_text_and_a_file_covering_nothing_is_an_error(tmp_path, fakes, capsys):  # noqa: F811
    root = tmp_path / "data"
    root.mkdir()
    write_layout(root, "tvr")
    file = relevance_file(tmp_path / "verified.jsonl")
    assert main(["census", "--dataset", "sim-tiny", "--relevance", str(file), "--out", str(tmp_path)]) == 2
    assert "sim-tiny is simulated and carries its own ground truth" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"query_id": "x#enc#0", "gt_video_ids": ["x"]}) + "\n")
    assert main(["census", "--dataset", "tvr", "--data-root", str(root), "--relevance", str(other),
                 "--out", str(tmp_path)]) == 2
    assert "covers none of the queries of val" in capsys.readouterr().err
    assert main(["census", "--dataset", "tvr", "--data-root", str(root), "--relevance-source", "x",
                 "--out", str(tmp_path)]) == 2
    assert "give it with --relevance" in capsys.readouterr().err
