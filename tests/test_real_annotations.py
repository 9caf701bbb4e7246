"""Annotation parsers, clipping, the timestamp join and DiDeMo's ground-truth rule: on tiny
hand-written files, and on the real files in ../shared/data (skipped when it is absent)."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from prvr.datasets.real import annotations as ann
from prvr.datasets.real import didemo
from prvr.datasets.real.problems import LayoutError, Report
from prvr.datasets.real.specs import SPECS

SHARED = Path(os.environ.get("PRVR_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"real annotation files not present ({SHARED})")


def test_normalised_sentences_ignore_case_spacing_punctuation_and_unicode_forms():
    assert ann.normalize_sentence("Sheldon doesn't sit.") == ann.normalize_sentence("sheldon does n't  sit")
    assert ann.normalize_sentence("Café\u00a0time!") == ann.normalize_sentence("CAFÉ TIME")
    assert ann.normalize_sentence("a cat") != ann.normalize_sentence("a cap")


def test_tvr_jsonl_rows_and_problems(tmp_path):
    path = tmp_path / "tvr_val_release.jsonl"
    good = {"vid_name": "v1", "duration": 60.0, "ts": [1.5, 9.0], "desc": "He sits.", "type": "v", "desc_id": 7}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "ts": [1]}) + "\n")
    report = Report(strict=False)
    table = ann.read_tvr_jsonl(path, report)
    assert [(r.video, r.start, r.end, r.duration, r.qid, r.line) for r in table.rows] == [("v1", 1.5, 9.0, 60.0, "7", 1)]
    assert report.errors == [f"{path} line 3: 'ts' must be [start, end] in seconds, found [1]; fix or delete the line "
                             "(TVR jsonl: vid_name, duration, ts, desc, desc_id)"]


def test_activitynet_and_charades_problems_name_key_and_line(tmp_path):
    anet = tmp_path / "train.json"
    anet.write_text(json.dumps({"v_a": {"duration": 10.0, "timestamps": [[0, 1]], "sentences": []}}))
    with pytest.raises(LayoutError, match=r"train.json key 'v_a': 'timestamps' and 'sentences' must be lists of equal"):
        ann.read_activitynet(anet, Report())
    sta = tmp_path / "charades_sta_train.txt"
    sta.write_text("AO8RW 0.0 6.9##a person is putting a book on a shelf.\nAO8RW 0.0 6.9 a person\n")
    with pytest.raises(LayoutError, match=r"charades_sta_train.txt line 2: expected '<video> <start> <end>##<sentence>'"):
        ann.read_charades_sta(sta, {}, Report())
    csv = tmp_path / "Charades_v1_train.csv"
    csv.write_text("id,subject,length\nAO8RW,x,33.5\nXY,y,long\n")
    with pytest.raises(LayoutError, match=r"Charades_v1_train.csv line 3: length 'long' is not a number"):
        ann.read_charades_durations(csv)


def test_clipping_counts_and_never_guesses():
    rows = [ann.Annotation("v", "a", 1.0, 12.0, 10.0, "x"), ann.Annotation("v", "b", 5.0, 5.0, 10.0, "x"),
            ann.Annotation("v", "c", -1.0, 3.0, 10.0, "x"), ann.Annotation("w", "d", 1.0, 2.0, math.nan, "x")]
    report = Report()
    out = ann.clip_rows(rows, report)
    assert (out[0].start, out[0].end) == (1.0, 10.0)
    assert math.isnan(out[1].start) and math.isnan(out[1].end)
    assert (out[2].start, out[2].end) == (0.0, 3.0)
    assert (out[3].start, out[3].end) == (1.0, 2.0)
    assert report.counts == {"annotations ending past the video (end clipped to the duration)": 1,
                             "annotations with start >= end (timestamps dropped)": 1,
                             "annotations starting before 0 (clipped to 0)": 1,
                             "annotations without a video duration (no M/V)": 1}


def test_join_matches_by_video_and_sentence_and_counts_the_rest():
    rows = [ann.Annotation("v", "He sits down.", 1.0, 2.0, 10.0, ""),
            ann.Annotation("v", "She waves.", 3.0, 4.0, 10.0, ""), ann.Annotation("v", "she waves", 5.0, 6.0, 10.0, ""),
            ann.Annotation("v", "Twice the same.", 1.0, 2.0, 10.0, ""),
            ann.Annotation("v", "twice the same", 1.0, 2.0, 10.0, ""),
            ann.Annotation("v", "Broken.", math.nan, math.nan, 10.0, "")]
    index = ann.TimestampIndex(ann.AnnotationTable(rows))
    videos = ["v", "v", "w", "v", "v"]
    moments, outcome = ann.join(videos, ["he sits down", "She waves.", "He sits down.", "Twice the same", "broken"],
                                index)
    np.testing.assert_array_equal(moments[0], [1.0, 2.0])
    assert np.isnan(moments[1:3]).all() and moments[3].tolist() == [1.0, 2.0] and np.isnan(moments[4]).all()
    assert outcome == {"matched": 2, "ambiguous": 1, "unmatched": 1, "invalid": 1}
    assert index.durations == {"v": 10.0}


@pytest.mark.parametrize("times, expected", [
    ([[1, 1], [1, 1], [1, 1], [0, 0]], (1, 1)),
    ([[0, 0], [2, 2], [2, 2], [0, 0]], (0, 0)),  # 2-2 tie: the span an earlier annotator marked
    ([[3, 4], [0, 0], [3, 4], [0, 0], [0, 0]], (0, 0)),  # most votes first
    ([[0, 0], [1, 1], [2, 2], [3, 3]], None),  # no two annotators agree
])
def test_didemo_ground_truth_is_a_span_two_annotators_agree_on(times, expected):
    assert didemo.ground_truth_span(times) == expected
    if expected is not None:
        assert didemo.agreed_spans(times)[0] == expected


def test_didemo_segments_to_seconds_and_bad_entries(tmp_path):
    assert didemo.span_seconds((5, 5), 6) == (25.0, 30.0)
    assert didemo.span_seconds((1, 4), 5) == (5.0, 25.0)
    path = tmp_path / "val_data.json"
    good = {"annotation_id": 1, "video": "x.mov", "description": "a dog", "times": [[1, 1], [1, 1]], "num_segments": 6}
    path.write_text(json.dumps([good, {**good, "annotation_id": 2, "times": [[4, 6]]}]))
    report = Report(strict=False)
    queries = didemo.read_didemo(path, report)
    assert len(queries) == 1 and report.errors == [
        f"{path} key '2': segments [4, 6] are outside 0..5 or reversed; fix or drop the entry (DiDeMo: times are "
        "[first, last] segment pairs)"]
    table = didemo.to_table(queries, report)
    assert (table.rows[0].start, table.rows[0].end, table.rows[0].duration) == (5.0, 10.0, 30.0)


@pytest.mark.parametrize("name", ["tvr", "activitynet", "charades"])
def test_annotation_writers_and_readers_agree(tmp_path, name):
    rows = {"train": [("vid_a", "A man sits.", 1.5, 4.25, 30.0, "3"), ("vid_a", "He stands.", 0.0, 30.0, 30.0, "4")],
            "test": [("vid_b", "A dog runs.", 2.0, 3.0, 12.5, "9")]}
    SPECS[name].write_annotations(tmp_path, rows)
    table = SPECS[name].read_annotations(tmp_path, Report())
    got = sorted((r.video, r.sentence, r.start, r.end, r.duration) for r in table.rows)
    assert got == sorted(r[:5] for items in rows.values() for r in items)


# ------------------------------------------------------------------ real files (shared/data)
README_TABLE = {  # shared/data/README.md: videos, queries, q/video, words/query, M/V buckets, mean M/V, mean dur
    "tvr_val": (2179, 10895, 5.00, 12.2, (0.853, 0.092, 0.055), 0.122, 75.7),
    "activitynet_train": (10009, 37421, 3.74, 13.5, (0.461, 0.249, 0.290), 0.306, 117.3),
    "activitynet_val_1": (4917, 17505, 3.56, 13.6, (0.426, 0.253, 0.320), 0.323, 118.2),
    "charades_train": (5338, 12408, 2.32, 6.2, (0.299, 0.568, 0.133), 0.268, 30.9),
    "charades_test": (1334, 3720, 2.79, 6.2, (0.289, 0.569, 0.143), 0.271, 29.5),
    "didemo_val": (1094, 4180, 3.82, 7.5, (0.777, 0.178, 0.045), 0.222, 29.0),
}


def _real_rows(which: str, report: Report) -> list[ann.Annotation]:
    if which == "tvr_val":
        table = ann.read_tvr_jsonl(SHARED / "tvr" / "tvr_val_release.jsonl", report)
    elif which.startswith("activitynet"):
        table = ann.read_activitynet(SHARED / "activitynet" / ("train.json" if "train" in which else "val.json"), report)
    elif which.startswith("charades"):
        durations = ann.read_charades_durations(SHARED / "charades_sta" / "charades.json")
        table = ann.read_charades_sta(SHARED / "charades_sta" / f"charades_sta_{which.split('_')[1]}.txt", durations,
                                      report)
    else:
        table = didemo.to_table(didemo.read_didemo(SHARED / "didemo" / "val_data.json", report), report)
    return ann.clip_rows(table.rows, report)


@needs_shared
@pytest.mark.parametrize("which", list(README_TABLE))
def test_real_annotation_files_give_the_readme_figures(which):
    report = Report()  # strict: every row of the real files parses
    stats = ann.table_stats(_real_rows(which, report))
    videos, queries, qpv, words, buckets, mean_mv, mean_dur = README_TABLE[which]
    assert (stats["videos"], stats["queries"]) == (videos, queries)
    assert stats["queries_per_video"] == pytest.approx(qpv, abs=0.005)
    assert stats["words_per_query"] == pytest.approx(words, abs=0.05)
    assert stats["mv_fractions"] == pytest.approx(list(buckets), abs=0.001)
    assert stats["mean_mv"] == pytest.approx(mean_mv, abs=0.001)
    assert stats["mean_duration"] == pytest.approx(mean_dur, abs=0.2 if which == "didemo_val" else 0.05)


@needs_shared
def test_real_annotation_quirks_from_the_readme():
    report = Report()
    _real_rows("activitynet_train", report)
    assert report.counts["annotations with start >= end (timestamps dropped)"] == 4
    raw = ann.read_activitynet(SHARED / "activitynet" / "train.json", Report()).rows
    assert sum(r.end > r.duration + 0.005 for r in raw) == 29  # "29 train queries end past the video"
    charades = Report()
    rows = _real_rows("charades_train", charades)
    past = charades.counts["annotations ending past the video (end clipped to the duration)"]
    assert past / len(rows) == pytest.approx(0.145, abs=0.0005)  # "14.5% of train end times exceed"
    durations = ann.read_tvr_durations(SHARED / "tvr" / "tvr_video2dur_idx.json")
    split = json.loads((SHARED / "tvr" / "tvr_video2dur_idx.json").read_text())
    assert len(split["train"]) == 17435 and len(durations) == sum(len(v) for v in split.values())


@needs_shared
@pytest.mark.parametrize("which, ambiguous, invalid", [
    ("tvr_val", 64, 0), ("activitynet_train", 10, 4), ("activitynet_val_1", 6, 0), ("charades_test", 0, 0),
])
def test_captions_made_from_real_annotations_join_back(which, ambiguous, invalid):
    """MS-SL style captions (re-cased, punctuation split off) find their rows again; the
    only misses are sentences a video repeats with other timestamps, and reversed rows."""
    rows = _real_rows(which, Report())
    index = ann.TimestampIndex(ann.AnnotationTable(rows))
    texts = [" ".join(r.sentence.lower().replace(".", " .").replace(",", " ,").split()) for r in rows]
    moments, outcome = ann.join([r.video for r in rows], texts, index)
    assert outcome == {"matched": len(rows) - ambiguous - invalid, **({"ambiguous": ambiguous} if ambiguous else {}),
                       **({"invalid": invalid} if invalid else {})}
    matched = np.isfinite(moments[:, 0])
    np.testing.assert_array_equal(moments[matched], np.array([(r.start, r.end) for r in rows])[matched])
