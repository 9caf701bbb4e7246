"""`prvr-bench census` (harness/cli/census.py): the SBERT detector over a dataset's query text, on
tiny datasets the tests write in each real layout and on sim-tiny, with a fake encoder whose
cosines are known; the verb-phrase table per parser."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from prvr.datasets.real import annotations as ann
from prvr.harness.cli import census
from prvr.harness.cli import main
from prvr.methods.relations import sbert, text_parsers

TOPICS = ("opens", "sits", "barks")


class TopicEncoder:
    """A fake encoder: a string's vector is the unit vector of the first topic word it holds, so
    two strings have cosine 1 when they share the topic and 0 otherwise."""

    name = "topic"

    def encode(self, texts):
        out = np.zeros((len(texts), len(TOPICS) + 1), dtype=np.float32)
        for k, t in enumerate(texts):
            out[k, next((n for n, w in enumerate(TOPICS) if w in t.lower()), len(TOPICS))] = 1
        return out


# q0 and q1 in video va, q2 in vb, q3 in vc: only q0 and q2 share a topic, across videos
ROWS = [("va", "person opens the door.", 0.0, 5.0, 20.0), ("va", "person sits down.", 5.0, 9.0, 20.0),
        ("vb", "person opens the door.", 1.0, 4.0, 15.0), ("vc", "a dog barks loudly.", 0.0, 3.0, 10.0)]


def write_layout(root, dataset: str) -> None:
    """The four queries in the dataset's own annotation format, where the shared data keeps it."""
    if dataset == "tvr":
        (root / "tvr").mkdir()
        lines = [json.dumps(ann.tvr_rows(v, s, a, b, d, k)) for k, (v, s, a, b, d) in enumerate(ROWS)]
        (root / "tvr" / "tvr_val_release.jsonl").write_text("\n".join(lines) + "\n")
    elif dataset == "activitynet":
        (root / "activitynet").mkdir()
        (root / "activitynet" / "val.json").write_text(json.dumps(ann.activitynet_json(ROWS)))
    elif dataset == "charades":
        (root / "charades_sta").mkdir()
        (root / "charades_sta" / "charades_sta_test.txt").write_text(ann.charades_lines(ROWS))
    else:
        (root / "didemo").mkdir()
        entries = [{"annotation_id": k, "video": v, "description": s, "num_segments": 6, "times": [[0, 1], [0, 1]]}
                   for k, (v, s, *_) in enumerate(ROWS)]
        (root / "didemo" / "val_data.json").write_text(json.dumps(entries))


@pytest.fixture
def fakes(monkeypatch):
    said = []
    monkeypatch.setattr(sbert, "make_encoder", lambda model, device="cpu", batch_size=256: TopicEncoder())
    monkeypatch.setattr(text_parsers, "benepar_status", lambda: (False, "the benepar package is not installed"))
    monkeypatch.setattr(text_parsers, "warn", said.append)
    return said


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("dataset, split", [("tvr", "val"), ("activitynet", "val"), ("charades", "test"),
                                            ("didemo", "val")])
def test_the_census_of_a_real_layout_counts_the_pairs_per_phi_and_theta(tmp_path, fakes, dataset, split):
    root, out = tmp_path / "data", tmp_path / "results"
    root.mkdir()
    write_layout(root, dataset)
    assert main(["census", "--dataset", dataset, "--data-root", str(root), "--out", str(out)]) == 0
    rows = read_csv(out / "census" / f"{dataset}.csv")
    assert [(r["phi"], float(r["theta"])) for r in rows] == [(p, t) for p in ("sent", "vp", "np-vp")
                                                             for t in (0.5, 0.6, 0.7, 0.8)]
    for r in rows:  # q0 and q2 pair, both ways: half the queries have one potentially relevant query and video
        assert (r["split"], r["queries"], r["videos"]) == (split, "4", "3")
        assert float(r["share_with_pr"]) == 0.5 and float(r["pr_queries_per_query"]) == 0.5
        assert float(r["pr_videos_per_query"]) == 0.5 and "precision" not in r  # no ground truth in real text
        assert r["parser"] == ("none" if r["phi"] == "sent" else "rules (fallback)") and r["model"] == "topic"
    md = (out / "census" / f"{dataset}.md").read_text()
    assert "a fallback" in md and "benepar unavailable" in md and "--data-root DIR" in md and str(root) not in md
    assert len(fakes) == 1 and "rules" in fakes[0]  # the warning line in the log


def test_the_census_of_a_real_dataset_needs_a_data_root(capsys):
    assert main(["census", "--dataset", "tvr"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--data-root DIR" in err


def test_an_unknown_dataset_or_empty_root_is_one_line(tmp_path, capsys):
    assert main(["census", "--dataset", "nope"]) == 2
    assert "give one of tvr, activitynet, charades, didemo" in capsys.readouterr().err
    assert main(["census", "--dataset", "didemo", "--data-root", str(tmp_path)]) == 2
    assert "no annotation files (*_data.json)" in capsys.readouterr().err


def test_the_census_of_a_simulated_world_adds_precision_recall_and_the_vp_table(tmp_path, fakes):
    out = tmp_path / "results"
    assert main(["census", "--dataset", "sim-tiny", "--phi", "sent", "vp", "--theta", "0.5", "0.8",
                 "--out", str(out)]) == 0
    rows = read_csv(out / "census" / "sim-tiny.csv")
    assert len(rows) == 4 and all(r["split"] == "train" and r["base_rate"] for r in rows)
    assert all(r["parser"] == "none" if r["phi"] == "sent" else r["parser"] == "gold" for r in rows)
    assert not fakes  # gold parses: no fallback
    vp = {r["parser"]: r for r in read_csv(out / "census" / "vp-extraction.csv")}
    assert float(vp["gold"]["precision"]) == 1.0 and float(vp["gold"]["recall"]) == 1.0
    assert vp["benepar"]["status"] == "unavailable: the benepar package is not installed" and not vp["benepar"]["recall"]
    assert float(vp["rules"]["recall"]) > 0.9
    assert "--phi sent vp --theta 0.5 0.8" in (out / "census" / "sim-tiny.md").read_text()


def test_the_vp_table_keeps_the_rows_of_other_datasets(tmp_path):
    row = {"split": "train", "parser": "rules", "status": "x", "queries": 1, "gold_vps": 2, "extracted_vps": 2,
           "matched": 1, "precision": 0.5, "recall": 0.5}
    census.update_vp_table(tmp_path, [{**row, "dataset": "sim-a"}], "cmd")
    census.update_vp_table(tmp_path, [{**row, "dataset": "sim-b"}], "cmd")
    census.update_vp_table(tmp_path, [{**row, "dataset": "sim-a", "recall": 0.75}], "cmd")
    rows = read_csv(tmp_path / "census" / "vp-extraction.csv")
    assert [(r["dataset"], r["recall"]) for r in rows] == [("sim-a", "0.75"), ("sim-b", "0.5")]
    # a kept row's rates read back from the csv are shown as a fresh row's are (1 -> 1.0000)
    census.update_vp_table(tmp_path, [{**row, "dataset": "sim-c", "precision": 1.0}], "cmd")
    census.update_vp_table(tmp_path, [{**row, "dataset": "sim-d"}], "cmd")
    md = (tmp_path / "census" / "vp-extraction.md").read_text()
    assert "| sim-c | train | rules | x | 1 | 2 | 2 | 1 | 1.0000 | 0.5000 |" in md


def test_vp_counts_by_hand():
    gold = ["(S (NP (NN man)) (VP (VBZ opens) (NP (DT the) (NN door))))",
            "(S (NP (NN man)) (VP (VBZ is) (VP (VBG sitting))))"]
    predicted = ["(S (NP (NN man)) (VP (VBZ Opens) (NP (DT the) (NN door))))",  # case is ignored
                 "(S (NP (NN man)) (VP (VBZ is) (VBG sitting)) (VP (VBG sitting) (RP down)))"]  # 'is sitting' matches
    assert census.vp_counts(gold, predicted) == {"queries": 2, "gold_vps": 3, "extracted_vps": 3, "matched": 2,
                                                 "precision": 2 / 3, "recall": 2 / 3}


def test_a_knob_census_remakes_the_simulated_world_once_per_combination(tmp_path, fakes):
    out = tmp_path / "results"
    assert main(["census", "--dataset", "sim-tiny", "--phi", "sent", "--theta", "0.8", "--set", "sim.vague_prob=0",
                 "--sweep", "sim.repeat_prob=0,0.9", "--sweep", "sim.train_videos=20,30", "--out", str(out)]) == 0
    rows = read_csv(out / "census" / "sim-tiny~knobs.csv")
    assert [r["world"] for r in rows] == [f"sim.vague_prob=0 sim.repeat_prob={p} sim.train_videos={n}"
                                          for p in ("0", "0.9") for n in ("20", "30")]
    assert [int(r["videos"]) for r in rows] == [20, 30, 20, 30] and all(r["base_rate"] for r in rows)
    # a knob census leaves the preset world's tables alone
    assert not (out / "census" / "sim-tiny.csv").exists() and not (out / "census" / "vp-extraction.csv").exists()
    md = (out / "census" / "sim-tiny~knobs.md").read_text()
    assert "--set sim.vague_prob=0 --sweep sim.repeat_prob=0,0.9 --sweep sim.train_videos=20,30" in md
    assert main(["census", "--dataset", "sim-tiny", "--phi", "sent", "--theta", "0.8", "--set", "sim.train_videos=20",
                 "--tag", "small", "--out", str(out)]) == 0
    assert [r["world"] for r in read_csv(out / "census" / "sim-tiny~small.csv")] == ["sim.train_videos=20"]


@pytest.mark.parametrize("argv, said", [
    (["--dataset", "tvr", "--data-root", "x", "--sweep", "sim.repeat_prob=0,1"], "real text has no knobs"),
    (["--dataset", "sim-tiny", "--set", "sim.repeat_prob=0", "--sweep", "sim.repeat_prob=0,1"],
     "sim.repeat_prob given more than once"),
    (["--dataset", "sim-tiny", "--sweep", "sim.repeat_prob="], "give KEY=V1,V2"),
    (["--dataset", "sim-tiny", "--tag", "x"], "give it with --set / --sweep"),
    (["--dataset", "sim-tiny", "--set", "sim.repeat_prob=2"], "sim.repeat_prob"),
])
def test_bad_knobs_are_one_line(argv, said, capsys):
    assert main(["census", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and said in err


def test_annotation_rows_the_reader_leaves_out_are_counted_and_named(tmp_path, fakes, monkeypatch):
    """A row with no sentence cannot be a query: the census leaves it out, as the loaders do, and
    says so, by cause and count, in the log and under its table (it was dropped without a word)."""
    from prvr.harness.base import progress

    lines = []
    monkeypatch.setattr(progress, "log", lines.append)
    monkeypatch.setattr(progress, "warn", lambda m: lines.append(f"warning: {m}"))
    root, out = tmp_path / "data", tmp_path / "results"
    root.mkdir()
    write_layout(root, "tvr")
    path = root / "tvr" / "tvr_val_release.jsonl"
    rows = path.read_text().splitlines()
    blank = [json.dumps({**json.loads(r), "desc": ""}) for r in rows[:2]]
    path.write_text("\n".join([*blank, *rows[2:]]) + "\n")
    assert main(["census", "--dataset", "tvr", "--data-root", str(root), "--out", str(out)]) == 0
    assert {r["queries"] for r in read_csv(out / "census" / "tvr.csv")} == {"2"}
    said = [line for line in lines if "left out 2 ×" in line]
    assert len(said) == 1 and "tvr val" in said[0] and "tvr_val_release.jsonl line 1" in said[0]
    assert "Annotation rows of val left out (not readable as queries): 2 ×" in (out / "census" / "tvr.md").read_text()
