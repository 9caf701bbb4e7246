"""The moment retrieval datasets in the TVRetrieval / XML layout (charades-sta, didemo) and their
simulated stand-ins (sim-charades, sim-didemo): tiny layouts written here load back as
written, DiDeMo's moment is the span two annotators agree on, a simulated world exported in
the layout loads back identical, and bad files stop the load with one line."""

import json
import math

import h5py
import numpy as np
import pytest

from prvr.datasets.real.problems import LayoutError
from prvr.datasets.real.xml import COLLECTIONS
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.base.registry import DATASETS
from test_real_roundtrip import assert_same_data

RNG = np.random.default_rng(0)


# ------------------------------------------------------------------------------ helpers
def write_layout(root, name, files: dict, videos: dict, queries: dict):
    """DIR/<name>/data/...: `files` maps a split to its release rows (or a file name to json
    content), `videos` a vid_name to its clip rows, `queries` a key to its token rows."""
    c = COLLECTIONS[name]
    folder = root / name
    for split, rows in files.items():
        if split.endswith(".json"):
            path = folder / "data" / split
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rows))
            continue
        path = folder / c.release_file(split)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for path, table in ((folder / c.video_file(c.default_feature), videos), (folder / c.query_file, queries)):
        path.parent.mkdir(parents=True, exist_ok=True)
        with h5py.File(path, "w") as f:
            for key, rows in table.items():
                f.create_dataset(key, data=rows)
    return folder


def load(name, root, cache, *overrides):
    cfg = resolve("baseline", name, 0, [f"data.data_root={root}", f"data.cache_dir={cache}", *overrides])
    return DATASETS.get(name).load(cfg)


def row(vid, duration, ts, desc, desc_id):
    return {"vid_name": vid, "duration": duration, "ts": ts, "desc": desc, "desc_id": desc_id}


def clips(duration, clip_seconds, dim=6):
    return RNG.standard_normal((math.ceil(duration / clip_seconds), dim)).astype(np.float32)


def tokens(n=5, dim=4):
    return RNG.standard_normal((n, dim)).astype(np.float32)


# ------------------------------------------------------------------------- Charades-STA
CHARADES = {
    "train": [row("AO8RW", 33.79, [0.0, 6.9], "a person is putting a book on a shelf.", 0),
              row("AO8RW", 33.79, [30.2, 36.1], "person opens the closet door.", 1),  # ends past the video
              row("Y6R7T", 20.0, [4.5, 12.0], "a person sits in a chair.", 2)],
    "test": [row("3MSZA", 31.0, [24.3, 30.4], "person turns on the light.", 3)],
}


@pytest.fixture
def charades(tmp_path):
    videos = {"AO8RW": clips(33.79, 3.0), "Y6R7T": clips(20.0, 3.0), "3MSZA": clips(31.0, 3.0)}
    queries = {str(i): tokens(3 + i) for i in range(4)}
    write_layout(tmp_path / "data", "charades-sta", CHARADES, videos, queries)
    return tmp_path / "data", videos, queries


def test_charades_sta_loads_as_written_and_val_stands_in_for_the_missing_split(charades, tmp_path):
    root, videos, queries = charades
    data = load("charades-sta", root, tmp_path / "cache")
    train, test, val = data["train"], data["test"], data["val"]
    assert train.video_ids == ["AO8RW", "Y6R7T"] and train.query_ids == ["0", "1", "2"]
    assert train.query_text == [r["desc"] for r in CHARADES["train"]]
    np.testing.assert_array_equal(train.query_video, [0, 0, 1])
    np.testing.assert_array_equal(train.moments, [[0.0, 6.9], [30.2, 33.79], [4.5, 12.0]])  # end clipped
    np.testing.assert_array_equal(train.durations, [33.79, 20.0])
    for v, vid in enumerate(train.video_ids):
        np.testing.assert_array_equal(train.frames[v], videos[vid])
    for q, key in enumerate(train.query_ids):
        np.testing.assert_array_equal(train.tokens[q], queries[key])
    assert val.query_ids == test.query_ids == ["3"] and test.video_ids == ["3MSZA"]
    np.testing.assert_array_equal(test.moments, [[24.3, 30.4]])
    assert data.meta["counts"]["annotations ending past the video (end clipped to the duration)"] == 1
    assert ("val split = charades_sta_test_release.jsonl (no charades_sta_val_release.jsonl), "
            "Charades-STA has no val split") in data.meta["notes"]
    assert data.meta["clip_seconds"] == 3.0 and data.meta["layout"] == "xml"


def test_a_video_missing_from_the_features_is_one_line_naming_the_file_and_key(charades, tmp_path):
    root, *_ = charades
    video_file = root / "charades-sta" / COLLECTIONS["charades-sta"].video_file("resnet")
    with h5py.File(video_file, "a") as f:
        del f["Y6R7T"]
    with pytest.raises(LayoutError) as e:
        load("charades-sta", root, tmp_path / "cache")
    assert str(e.value).endswith("charades_sta_train_release.jsonl line 3: video 'Y6R7T' has no features in "
                                 "charades_sta_resnet152_rgb_max_cl-3.0.h5; "
                                 "use the feature file that covers this split")
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "cache" / "real").glob("*"))  # nothing cached from a layout that failed


def test_a_moment_outside_its_video_is_one_line_naming_the_file_line_and_key(charades, tmp_path, capsys):
    root, *_ = charades
    rows = [*CHARADES["train"][:1], row("AO8RW", 33.79, [40.0, 45.5], "person opens the closet door.", 1),
            *CHARADES["train"][2:]]
    release = root / "charades-sta" / COLLECTIONS["charades-sta"].release_file("train")
    release.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(LayoutError) as e:
        load("charades-sta", root, tmp_path / "cache")
    assert str(e.value).endswith("charades_sta_train_release.jsonl line 2 key '1': moment [40, 45.5] s lies outside "
                                 "its video (duration 33.79 s); fix the timestamps or the duration, or delete the row")
    assert "\n" not in str(e.value)
    # `data check` lists the problem and goes on (exit status 2), reading the rest
    assert main(["data", "check", "--dataset", "charades-sta", "--data-root", str(root)]) == 2
    out = capsys.readouterr().out
    assert "errors: 1" in out and "line 2 key '1': moment [40, 45.5] s lies outside" in out
    assert "train        2        2" in out


def test_layout_options_are_checked_per_dataset(charades, tmp_path):
    root, *_ = charades
    with pytest.raises(LayoutError, match="XML video feature 'i3d' is unknown; use one of resnet$"):
        load("charades-sta", root, tmp_path / "cache", "data.feature=i3d")
    with pytest.raises(LayoutError, match="TVRetrieval layout exists for tvr, charades-sta, didemo, not activitynet"):
        load("activitynet", root, tmp_path / "cache", "data.layout=xml")
    (root / "charades-sta" / COLLECTIONS["charades-sta"].release_file("train")).unlink()
    with pytest.raises(LayoutError, match=r"charades_sta_train_release.jsonl: missing; check --data-root \(XML layout: "
                                          r"<root>/charades-sta/data/charades_sta_<split>_release.jsonl"):
        load("charades-sta", root, tmp_path / "cache")


# -------------------------------------------------------------------------------- DiDeMo
DIDEMO = {
    "train": [row("v1.mov", 30.0, [[5, 10], [5, 10], [0, 5], [5, 10]], "the dog jumps.", 10),  # 3 votes
              row("v1.mov", 30.0, [[0, 5], [10, 20], [10, 20], [0, 5]], "a man waves.", 11),  # tie: first marked
              row("v2.mov", 27.3, [[0, 5], [5, 10], [10, 15], [15, 20]], "camera pans left.", 12),  # no agreement
              row("v2.mov", 27.3, [20, 27.3], "the car leaves.", 13)],  # one span: the agreed one itself
    "val": [row("v3.mov", 28.2, [[25, 30], [25, 30], [0, 5]], "kids run off.", 14)],  # ends past the video
    "test": [row("v4.mov", 30.0, [[0, 10], [0, 10], [0, 10]], "a bird lands.", 15)],
}


def didemo_videos(durations):
    return {vid: clips(d, 2.5) for vid, d in durations.items()}


def test_didemo_moment_is_the_span_two_annotators_agree_on(tmp_path):
    durations = {"v1.mov": 30.0, "v2.mov": 27.3, "v3.mov": 28.2, "v4.mov": 30.0}
    queries = {str(k): tokens() for k in range(10, 16)}
    write_layout(tmp_path / "data", "didemo", DIDEMO, didemo_videos(durations), queries)
    data = load("didemo", tmp_path / "data", tmp_path / "cache")
    train = data["train"]
    assert train.query_ids == ["10", "11", "12", "13"] and train.video_ids == ["v1.mov", "v2.mov"]
    np.testing.assert_array_equal(train.moments, [[5, 10], [0, 5], [np.nan, np.nan], [20, 27.3]])
    np.testing.assert_array_equal(data["val"].moments, [[25, 28.2]])
    np.testing.assert_array_equal(data["test"].moments, [[0, 10]])
    np.testing.assert_array_equal(train.durations, [30.0, 27.3])
    counts = data.meta["counts"]
    assert counts["DiDeMo queries without a span two annotators agree on"] == 1
    assert counts["DiDeMo queries with more than one agreed span (most votes, then first marked, kept)"] == 1
    assert counts["annotations ending past the video (end clipped to the duration)"] == 1
    assert data.meta["clip_seconds"] == 2.5


ORIGINAL = {  # LocalizingMoments {split}_data.json: 5 s segment indices, one [first, last] per annotator
    "train_data.json": [
        {"annotation_id": 7, "video": "v1.mov", "description": "the dog jumps.", "num_segments": 6,
         "times": [[1, 1], [1, 1], [0, 0], [1, 2]]},  # (1, 1): seconds [5, 10]
        {"annotation_id": 8, "video": "v1.mov", "description": "a man waves.", "num_segments": 6,
         "times": [[2, 3], [0, 0], [0, 0], [2, 3]]}],  # tie: (2, 3) marked first: [10, 20]
    "val_data.json": [{"annotation_id": 9, "video": "v2.mov", "description": "kids run off.", "num_segments": 5,
                       "times": [[4, 4], [4, 4], [3, 4]]}],  # last of five segments: [20, 25]
    "test_data.json": [{"annotation_id": 12, "video": "v3.mov", "description": "a bird lands.", "num_segments": 6,
                        "times": [[0, 5], [0, 5], [1, 1], [1, 1]]}],  # tie: (0, 5) marked first: [0, 30]
}


def test_didemo_reads_the_original_json_where_no_release_file_exists(tmp_path):
    queries = {str(k): tokens() for k in (7, 8, 9, 12)}
    videos = didemo_videos({"v1.mov": 30.0, "v2.mov": 25.0, "v3.mov": 30.0})
    write_layout(tmp_path / "data", "didemo", ORIGINAL, videos, queries)
    data = load("didemo", tmp_path / "data", tmp_path / "cache")
    assert data["train"].query_ids == ["7", "8"] and data["val"].query_ids == ["9"]
    np.testing.assert_array_equal(data["train"].moments, [[5, 10], [10, 20]])
    np.testing.assert_array_equal(data["val"].moments, [[20, 25]])
    np.testing.assert_array_equal(data["test"].moments, [[0, 30]])
    np.testing.assert_array_equal(data["val"].durations, [25.0])  # nominal: 5 s x num_segments
    np.testing.assert_array_equal(data["test"].tokens[0], queries["12"])

    # a json entry has no line: the message names its annotation_id
    with h5py.File(tmp_path / "data" / "didemo" / COLLECTIONS["didemo"].video_file("resnet"), "a") as f:
        del f["v2.mov"]
    with pytest.raises(LayoutError) as e:
        load("didemo", tmp_path / "data", tmp_path / "cache2")
    assert str(e.value).endswith("val_data.json key '9': video 'v2.mov' has no features in "
                                 "didemo_resnet152_rgb_max_cl-2.5.h5; use the feature file that covers this split")


def test_didemo_spec_reads_the_original_annotation_files_for_the_real_text(tmp_path):
    from prvr.datasets.real.problems import Report
    from prvr.datasets.real.specs import SPECS

    for name, entries in ORIGINAL.items():
        (tmp_path / name).write_text(json.dumps(entries))
    assert [p.name for p in SPECS["didemo"].annotation_files(tmp_path)] == sorted(ORIGINAL)
    table = SPECS["didemo"].read_annotations(tmp_path, Report())
    got = sorted((r.qid, r.sentence, r.start, r.end, r.duration) for r in table.rows)
    assert got == [("12", "a bird lands.", 0.0, 30.0, 30.0), ("7", "the dog jumps.", 5.0, 10.0, 30.0),
                   ("8", "a man waves.", 10.0, 20.0, 30.0), ("9", "kids run off.", 20.0, 25.0, 25.0)]
    assert SPECS["didemo"].write_annotations is None and SPECS["didemo"].layouts == ("xml",)


def test_didemo_rows_with_bad_spans_are_one_line_each(tmp_path, capsys):
    files = {"train": [row("v1.mov", 30.0, [[5, 10], [5, "x"]], "the dog jumps.", 10),
                       row("v1.mov", 30.0, [[35, 40], [35, 40]], "a man waves.", 11)],
             "val": DIDEMO["val"], "test": DIDEMO["test"]}
    queries = {str(k): tokens() for k in (10, 11, 14, 15)}
    write_layout(tmp_path / "data", "didemo", files,
                 didemo_videos({"v1.mov": 30.0, "v3.mov": 28.2, "v4.mov": 30.0}), queries)
    assert main(["data", "check", "--dataset", "didemo", "--data-root", str(tmp_path / "data")]) == 2
    out = capsys.readouterr().out
    assert ("didemo_train_release.jsonl line 1: 'ts' must be [[start, end], ...] in seconds, one per annotator, "
            "found [[5, 10], [5, 'x']]") in out
    assert "didemo_train_release.jsonl line 2 key '11': moment [35, 40] s lies outside its video (duration 30 s)" in out


# --------------------------------------------------------------- simulated, exported, loaded
def assert_same(sim, real):
    """The same videos, queries, labels, moments, durations and features (query ids: desc_ids)."""
    assert_same_data(sim, real, same_query_ids=False)


# the tiny scale, with small feature dims so that generating takes a second, not ten
TINY = ["data.scale=tiny", "sim.video_dim=64", "sim.query_dim=32"]


def sim(name):
    return DATASETS.get(name).load(resolve("baseline", name, 0, TINY))


def export_args(name, root):
    return ["data", "export", "--dataset", name, "--layout", "xml", "--to", str(root), "--quiet",
            *[a for s in TINY for a in ("--set", s)]]


def test_sim_didemo_exports_in_the_didemo_layout_and_loads_back_identical(tmp_path):
    assert main(export_args("sim-didemo", tmp_path / "data")) == 0  # --as: the preset's family, didemo
    real = load("didemo", tmp_path / "data", tmp_path / "cache")
    assert_same(sim("sim-didemo"), real)
    assert real.meta["test"]["exported_from"] == "sim-didemo" and real.meta["test"]["simulated"]
    assert real.meta["train"]["with_timestamps"] == real["train"].num_queries
    first = json.loads((tmp_path / "data" / "didemo" / "data" / "didemo_train_release.jsonl").read_text()
                       .splitlines()[0])
    assert sorted(first) == ["desc", "desc_id", "duration", "ts", "vid_name"] and len(first["ts"]) == 2


def test_sim_didemo_imitates_didemo():
    cfg = resolve("baseline", "sim-didemo", 0)
    facts = (cfg.sim.seconds_per_frame, cfg.data.max_frames, cfg.sim.video_dim, cfg.sim.query_dim)
    assert facts == (2.5, 12, 2048, 768)
    data = sim("sim-didemo")
    train = data["train"]
    assert set(np.unique(train.durations)) <= {25.0, 27.5, 30.0, 32.5}
    np.testing.assert_array_equal(train.frames.lengths * 2.5, train.durations)  # one row per 2.5 s clip
    np.testing.assert_array_equal(train.moments % 2.5, 0.0)  # moments are whole clips
    assert 3.5 < train.num_queries / train.num_videos < 4.2  # 3.82
    np.testing.assert_allclose(data.meta["train"]["mv_fractions"], [0.777, 0.178, 0.045], atol=0.07)
    assert 7.0 < data.meta["train"]["words_per_query"] < 8.0  # 7.5


def test_sim_charades_exports_as_charades_sta_and_loads_back_identical(tmp_path):
    assert main([*export_args("sim-charades", tmp_path / "data"), "--as", "charades-sta"]) == 0
    original = sim("sim-charades")
    real = load("charades-sta", tmp_path / "data", tmp_path / "cache")
    assert_same(original, real)  # a val file was written, so val is val, not test
    cfg = resolve("baseline", "sim-charades", 0)
    assert (cfg.sim.seconds_per_frame, cfg.data.max_frames) == (3.0, 20)  # XML's Charades-STA clips
    train = original["train"]
    np.testing.assert_array_equal(train.frames.lengths * 3.0, train.durations)  # one row per 3.0 s clip
