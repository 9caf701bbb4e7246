"""Malformed layouts: each gives one line naming the file, the line or key, and a fix;
nothing is cached from a layout that failed; bad rows can be skipped with a count."""

import json
import shutil

import h5py
import numpy as np
import pytest
from real_layouts import exported, load_tvr, msl_paths

from prvr.datasets.real.problems import LayoutError
from prvr.harness.cli import main
from prvr.harness.base.io import UserError


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    exported(root / "msl", "msl")
    exported(root / "xml", "xml")
    return root


@pytest.fixture
def layout(template, tmp_path):
    """A fresh copy of the valid MS-SL layout: (data root, paths, cache folder)."""
    shutil.copytree(template / "msl", tmp_path / "data")
    return tmp_path / "data", msl_paths(tmp_path / "data"), tmp_path / "cache"


def _lines(path):
    return path.read_text().splitlines()


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")


def _replace_h5(path, key, value):
    with h5py.File(path, "a") as f:
        del f[key]
        f.create_dataset(key, data=value)


def _cap_id(p, line):
    return _lines(p["train_captions"])[line - 1].split()[0]


def _first_video(p):
    return _lines(p["train_captions"])[0].split("#")[0]


# each case: mutate(root, paths, tmp) -> (data root to load, [substrings the message must hold])
def missing_root(root, p, tmp):
    return tmp / "nowhere", ["nowhere does not exist", "--data-root"]


def missing_collection(root, p, tmp):
    shutil.rmtree(p["collection"])
    return root, ["tvr: collection folder missing", "--data-root"]


def missing_file(root, p, tmp):
    p["ids"].unlink()
    return root, ["i3d_resnet/id.txt: missing", "check --data-root"]


def missing_caption_file(root, p, tmp):
    p["val_captions"].unlink()
    return root, ["tvrval.caption.txt: missing"]


def shape_disagrees(root, p, tmp):
    n, d = p["shape"].read_text().split()
    p["shape"].write_text(f"{n} {int(d) - 1}\n")
    return root, ["feature.bin: ", "disagree with shape.txt", "fix shape.txt"]


def truncated_bin(root, p, tmp):
    data = p["bin"].read_bytes()
    p["bin"].write_bytes(data[:-10])
    return root, ["feature.bin: truncated", "partial row", "download or copy feature.bin again"]


def id_count(root, p, tmp):
    ids = p["ids"].read_text().split()
    p["ids"].write_text(" ".join(ids[:-1]))
    return root, ["id.txt: holds", "frame ids but shape.txt says", "regenerate id.txt"]


def v2f_not_a_dict(root, p, tmp):
    p["v2f"].write_text("['a', 'b']\n")
    return root, ["video2frames.txt line 1: holds a list, not a dict literal", "regenerate"]


def v2f_runs_code(root, p, tmp):
    marker = tmp / "pwned"
    p["v2f"].write_text(f"{{'v': __import__('os').system('touch {marker}')}}\n")
    return root, ["video2frames.txt line 1 key 'v': the value is a function call", "regenerate"]


def v2f_top_level_call(root, p, tmp):
    marker = tmp / "pwned"
    p["v2f"].write_text(f"__import__('os').system('touch {marker}')\n")
    return root, ["video2frames.txt line 1: holds a function call, not a dict literal"]


def v2f_syntax(root, p, tmp):
    p["v2f"].write_text("{'a': ['a_0'],\n 'b': ['b_0',, ]}\n")
    return root, ["video2frames.txt line 2: not a Python dict literal"]


def frames_not_in_ids(root, p, tmp):
    text = p["v2f"].read_text()
    vid = _first_video(p)
    p["v2f"].write_text(text.replace(f"'{vid}_3'", "'ghost_frame'", 1))
    return root, [f"video2frames.txt key '{vid}': 1 frame ids are not in id.txt (first: 'ghost_frame')",
                  "regenerate video2frames.txt"]


def video_not_in_v2f(root, p, tmp):
    vid = _first_video(p)
    lines = [ln for ln in p["v2f"].read_text().strip()[1:-1].split(",\n ") if not ln.startswith(f"'{vid}'")]
    p["v2f"].write_text("{" + ",\n ".join(lines) + "}\n")
    return root, [f"tvrtrain.caption.txt line 1: video '{vid}'", "not in i3d_resnet/video2frames.txt",
                  "add its frames there or delete its captions"]


def caption_without_query_features(root, p, tmp):
    cap = _cap_id(p, 4)
    with h5py.File(p["queries"], "a") as f:
        del f[cap]
    return root, [f"tvrtrain.caption.txt line 4: caption '{cap}' has no query features",
                  "(1 of this file's captions lack them)", "regenerate the query features or delete"]


def h5_wrong_rank(root, p, tmp):
    cap = _cap_id(p, 2)
    _replace_h5(p["queries"], cap, np.zeros(32, dtype=np.float32))
    return root, [f"roberta_tvr_query_feat.hdf5 key '{cap}': features have shape (32,), expected [tokens, dim]"]


def h5_wrong_dim(root, p, tmp):
    cap = _cap_id(p, 5)
    _replace_h5(p["queries"], cap, np.ones((4, 33), dtype=np.float32))
    return root, [f"roberta_tvr_query_feat.hdf5 key '{cap}': features are 33-d, earlier ones 32-d"]


def empty_caption_line(root, p, tmp):
    lines = _lines(p["train_captions"])
    _write_lines(p["train_captions"], lines[:2] + [""] + lines[2:])
    return root, ["tvrtrain.caption.txt line 3: empty caption line; delete the line"]


def caption_without_sentence(root, p, tmp):
    lines = _lines(p["train_captions"])
    lines[1] = lines[1].split()[0]
    _write_lines(p["train_captions"], lines)
    return root, ["tvrtrain.caption.txt line 2: caption", "has no sentence"]


def duplicate_cap_id(root, p, tmp):
    lines = _lines(p["train_captions"])
    _write_lines(p["train_captions"], lines[:2] + [lines[1]] + lines[2:])
    return root, ["tvrtrain.caption.txt line 3: caption id", "already on line 2", "must be unique"]


def nan_frames(root, p, tmp):
    arr = np.memmap(p["bin"], dtype="<f4", mode="r+").reshape(-1, 48)
    arr[5, 7] = np.nan
    arr.flush()
    return root, ["feature.bin key '", "row 5", "holds NaN/Inf", "data.on_bad_rows=skip"]


def nan_tokens(root, p, tmp):
    cap = _cap_id(p, 3)
    with h5py.File(p["queries"], "a") as f:
        f[cap][0, 0] = np.inf
    return root, [f"roberta_tvr_query_feat.hdf5 key '{cap}': token features hold NaN/Inf", "data.on_bad_rows=skip"]


def annotation_not_json(root, p, tmp):
    lines = _lines(p["train_ann"])
    lines[6] = lines[6][:-3]
    _write_lines(p["train_ann"], lines)
    return root, ["tvr_train_release.jsonl line 7: not a JSON object", "fix or delete the line"]


def annotation_missing_key(root, p, tmp):
    lines = _lines(p["train_ann"])
    row = json.loads(lines[1])
    del row["ts"]
    lines[1] = json.dumps(row)
    _write_lines(p["train_ann"], lines)
    return root, ["tvr_train_release.jsonl line 2: no key 'ts'"]


CASES = [missing_root, missing_collection, missing_file, missing_caption_file, shape_disagrees, truncated_bin,
         id_count, v2f_not_a_dict, v2f_runs_code, v2f_top_level_call, v2f_syntax, frames_not_in_ids,
         video_not_in_v2f, caption_without_query_features, h5_wrong_rank, h5_wrong_dim, empty_caption_line,
         caption_without_sentence, duplicate_cap_id, nan_frames, nan_tokens, annotation_not_json,
         annotation_missing_key]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_input_is_one_line_naming_file_and_place_and_nothing_is_cached(case, layout, tmp_path):
    root, paths, cache = layout
    load_root, expected = case(root, paths, tmp_path)
    with pytest.raises(LayoutError) as err:
        load_tvr(load_root, cache)
    msg = str(err.value)
    assert "\n" not in msg
    for part in expected:
        assert part in msg, (part, msg)
    assert "; " in msg  # ... and what to do
    assert not (tmp_path / "pwned").exists()  # video2frames.txt never runs
    assert not list((cache / "real").glob("*")) if (cache / "real").exists() else True


def test_the_cli_prints_the_error_as_one_line(layout, capsys):
    root, paths, cache = layout
    truncated_bin(root, paths, None)
    code = main(["data", "check", "--dataset", "tvr", "--data-root", str(root), "--set", f"data.cache_dir={cache}"])
    out = capsys.readouterr()
    assert code == 2
    assert "feature.bin: truncated" in out.out
    assert out.err.count("\n") == 1 and "1 errors" in out.err


def test_data_check_lists_every_item_problem_and_writes_nothing(layout, capsys, tmp_path):
    root, paths, cache = layout
    nan_tokens(root, paths, tmp_path)
    caption_without_query_features(root, paths, tmp_path)
    empty_caption_line(root, paths, tmp_path)
    code = main(["data", "check", "--dataset", "tvr", "--data-root", str(root), "--set", f"data.cache_dir={cache}"])
    out = capsys.readouterr().out
    assert code == 2
    assert "errors: 3" in out
    for part in ("empty caption line", "has no query features", "token features hold NaN/Inf",
                 "queries without features: 1"):
        assert part in out
    assert not cache.exists()


def test_skip_bad_rows_leaves_them_out_with_a_count(layout, tmp_path):
    root, paths, cache = layout
    nan_frames(root, paths, tmp_path)
    nan_tokens(root, paths, tmp_path)
    clean = load_tvr(root, tmp_path / "other-cache", "data.on_bad_rows=skip")
    counts = clean.meta["counts"]
    assert counts["video feature rows with NaN/Inf"] == 1
    assert counts["frames left out: NaN/Inf rows"] == 1
    assert counts["queries left out: NaN/Inf in their token features"] == 1
    train = clean["train"]
    assert train.num_queries == 143  # sim-tiny train has 144
    assert all(np.isfinite(np.asarray(train.frames[v])).all() for v in range(train.num_videos))


def test_annotation_rows_past_the_end_or_reversed_are_clipped_and_counted(layout):
    root, paths, cache = layout
    lines = _lines(paths["train_ann"])
    rows = [json.loads(x) for x in lines]
    rows[0]["ts"] = [rows[0]["ts"][0], rows[0]["duration"] + 9.0]  # ends past the video
    rows[1]["ts"] = [5.0, 5.0]  # start >= end
    rows[2]["ts"] = [-2.0, rows[2]["ts"][1]]  # starts before 0
    rows[3]["desc"] = "A sentence that no caption has."  # the caption finds no row
    rows.append(dict(rows[4], ts=[0.0, 1.0]))  # a second row for a caption: they disagree
    _write_lines(paths["train_ann"], [json.dumps(r) for r in rows])
    data = load_tvr(root, cache)
    m, counts = data["train"].moments, data.meta["counts"]
    assert m[0, 1] == rows[0]["duration"] and np.isnan(m[1]).all() and m[2, 0] == 0.0
    assert np.isnan(m[3]).all() and np.isnan(m[4]).all()
    assert counts["annotations ending past the video (end clipped to the duration)"] == 1
    assert counts["annotations with start >= end (timestamps dropped)"] == 1
    assert counts["annotations starting before 0 (clipped to 0)"] == 1
    assert counts["captions without an annotation row (no timestamps)"] == 1
    assert counts["captions whose annotation rows disagree on the timestamps (no timestamps)"] == 1
    assert counts["captions matched to a row with start >= end (no timestamps)"] == 1


@pytest.mark.parametrize("overrides, expected", [
    # refused when the config resolves (their declared checks), before any file is read
    (["data.layout=zip"], "config key 'data.layout' must be one of msl, xml, got 'zip'"),
    (["data.on_bad_rows=ignore"], "config key 'data.on_bad_rows' must be one of error, skip, got 'ignore'"),
    (["data.layout=xml", "data.feature=vgg"], "XML video feature 'vgg' is unknown; use one of resnet, i3d, resnet_i3d"),
])
def test_bad_options_name_the_key(layout, overrides, expected):
    root, _, cache = layout
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_tvr(root, cache, *overrides)


def test_no_data_root_says_how_to_give_one(tmp_path):
    from prvr.harness.engine.config import resolve
    from prvr.harness.base.registry import DATASETS

    with pytest.raises(LayoutError, match="pass --data-root DIR or set PRVR_DATA"):
        DATASETS.get("tvr").load(resolve("baseline", "tvr", 0, [f"data.cache_dir={tmp_path}"]))


def test_xml_layout_errors(template, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(template / "xml", root)
    data_dir = root / "tvr" / "data"
    lines = _lines(data_dir / "tvr_val_release.jsonl")
    _write_lines(data_dir / "tvr_val_release.jsonl", lines + [lines[0]])
    with pytest.raises(LayoutError, match=r"tvr_val_release.jsonl line 49: desc_id \d+ already on line 1"):
        load_tvr(root, tmp_path / "cache", layout="xml")
    _write_lines(data_dir / "tvr_val_release.jsonl", lines)
    first = json.loads(_lines(data_dir / "tvr_train_release.jsonl")[0])["vid_name"]
    video_file = next((data_dir / "tvr_feature_release" / "video_feature").glob("*.h5"))
    with h5py.File(video_file, "a") as f:
        del f[first]
    with pytest.raises(LayoutError, match=f"tvr_train_release.jsonl line 1: video '{first}' has no features"):
        load_tvr(root, tmp_path / "cache", layout="xml")
    assert not list((tmp_path / "cache" / "real").glob("*"))


def test_xml_nan_rows_error_or_skip(template, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(template / "xml", root)
    first = json.loads(_lines(root / "tvr" / "data" / "tvr_train_release.jsonl")[0])["vid_name"]
    video_file = next((root / "tvr" / "data" / "tvr_feature_release" / "video_feature").glob("*.h5"))
    with h5py.File(video_file, "a") as f:
        f[first][2, 0] = np.nan
        rows = len(f[first])
    with pytest.raises(LayoutError, match=f"cat_cl-1.5.h5 key '{first}': clip row 2 holds NaN/Inf; .*on_bad_rows=skip"):
        load_tvr(root, tmp_path / "cache", layout="xml")
    data = load_tvr(root, tmp_path / "cache", "data.on_bad_rows=skip", layout="xml")
    assert data.meta["counts"]["frames left out: NaN/Inf rows"] == 1
    assert data["train"].frames.lengths[0] == rows - 1



def test_xml_desc_id_shared_by_two_splits_is_an_error(template, tmp_path):
    """All splits read their query features from one file keyed by desc_id: a val desc_id equal
    to a train one would read the train query's features (data check and loading say so)."""
    root = tmp_path / "data"
    shutil.copytree(template / "xml", root)
    data_dir = root / "tvr" / "data"
    train_id = json.loads(_lines(data_dir / "tvr_train_release.jsonl")[0])["desc_id"]
    val = _lines(data_dir / "tvr_val_release.jsonl")
    first = json.loads(val[0])
    _write_lines(data_dir / "tvr_val_release.jsonl", [json.dumps({**first, "desc_id": train_id}), *val[1:]])
    with pytest.raises(LayoutError, match=rf"tvr_val_release.jsonl line 1: desc_id {train_id} is also in "
                                          r"tvr_train_release.jsonl \(line 1\); the splits share one query feature "
                                          r"file keyed by desc_id"):
        load_tvr(root, tmp_path / "cache", layout="xml")
