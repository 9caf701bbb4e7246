"""Export a simulated dataset to a public layout, load it back as `tvr`: the same data, and
a model trained on either evaluates to the same metrics on both."""

import json
import pickle

import numpy as np
import pytest
from real_layouts import TINY, exported, load_tvr, msl_paths, sim_tiny, tvr_config

from prvr.datasets.real import store
from prvr.datasets.real.bigfile import MappedRows
from prvr.datasets.types import SPLITS
from prvr.harness.engine.build import build_run
from prvr.harness.cli import main
from prvr.harness.engine.config import from_dict, resolve
from prvr.harness.engine.runner import run_one

COMPARED = ("R@1", "R@5", "R@10", "R@100", "SumR", "median_rank", "mean_rank", "n", "buckets")


def assert_same_data(sim, real, same_query_ids=True):
    for name in SPLITS:
        a, b = sim[name], real[name]
        assert a.video_ids == b.video_ids
        assert a.query_text == b.query_text
        if same_query_ids:
            assert a.query_ids == b.query_ids
        np.testing.assert_array_equal(a.query_video, b.query_video)
        np.testing.assert_array_equal(a.moments, b.moments)
        np.testing.assert_array_equal(a.durations, b.durations)
        np.testing.assert_array_equal(a.frames.lengths, b.frames.lengths)
        for v in range(a.num_videos):
            np.testing.assert_array_equal(np.asarray(a.frames[v], dtype=np.float32), b.frames[v])
        for q in range(a.num_queries):
            np.testing.assert_array_equal(np.asarray(a.tokens[q], dtype=np.float32), b.tokens[q])
        assert (a.labels() != b.labels()).nnz == 0


@pytest.mark.parametrize("layout", ["msl", "xml"])
def test_export_then_load_gives_identical_features_queries_labels_timestamps(tmp_path, layout):
    root = exported(tmp_path / "data", layout)
    real = load_tvr(root, tmp_path / "cache", layout=layout)
    assert isinstance(real["train"].frames.data, MappedRows)  # memory-mapped, not in RAM
    assert_same_data(sim_tiny(), real, same_query_ids=layout == "msl")  # XML keys queries by desc_id
    assert real.meta["train"]["with_timestamps"] == real["train"].num_queries
    assert real.meta["test"]["exported_from"] == "sim-tiny" and real.meta["test"]["simulated"]  # runs say so


def test_the_xml_export_lists_each_splits_videos_with_durations_as_tvretrieval_does(tmp_path):
    """tvr_video2dur_idx.json: split -> vid_name -> [duration, index], what TVRetrieval's evaluation
    lists its corpus from; every video of a split's release rows, in the order of their first row."""
    root = exported(tmp_path / "data", "xml")
    (listing,) = root.rglob("tvr_video2dur_idx.json")
    table = json.loads(listing.read_text())
    sim = sim_tiny()
    for name in SPLITS:
        rows = [json.loads(line) for line in (listing.parent / f"tvr_{name}_release.jsonl").read_text().splitlines()]
        order = list(dict.fromkeys(r["vid_name"] for r in rows))
        assert list(table[name]) == order and [v[1] for v in table[name].values()] == list(range(len(order)))
        split = sim[name]
        for vid, (duration, _) in table[name].items():
            assert duration == float(split.durations[split.video_ids.index(vid)])


def test_preload_holds_the_same_rows_in_ram(tmp_path):
    root = exported(tmp_path / "data")
    real = load_tvr(root, tmp_path / "cache", "data.preload=true")
    assert isinstance(real["test"].frames.data, np.ndarray) and real["test"].frames.rows is None
    assert_same_data(sim_tiny(), real)


def test_second_load_reads_the_cache_and_a_changed_file_rebuilds(tmp_path, monkeypatch):
    root = exported(tmp_path / "data")
    load_tvr(root, tmp_path / "cache")
    monkeypatch.setattr(store, "_build_entry", lambda *a: pytest.fail("rebuilt an unchanged layout"))
    load_tvr(root, tmp_path / "cache")
    monkeypatch.undo()
    captions = msl_paths(root)["train_captions"]
    lines = captions.read_text().splitlines()
    captions.write_text("\n".join(lines[:-1]) + "\n")  # one caption fewer
    assert load_tvr(root, tmp_path / "cache")["train"].num_queries == len(lines) - 1
    assert len(list((tmp_path / "cache" / "real").iterdir())) == 2


def test_memory_mapped_rows_pickle_as_a_path(tmp_path):
    root = exported(tmp_path / "data")
    frames = load_tvr(root, tmp_path / "cache")["train"].frames
    blob = pickle.dumps(frames)  # what a spawned DataLoader worker receives
    assert len(blob) < 50_000 < frames.data.shape[0] * frames.dim * 4
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again[3], frames[3])


def test_export_cli_and_check_cli(tmp_path, capsys):
    code = main(["data", "export", "--dataset", "sim-tiny", "--as", "tvr", "--to", str(tmp_path / "d"), "--quiet"])
    assert code == 0
    assert main(["data", "export", "--dataset", "sim-tiny", "--as", "tvr", "--to", str(tmp_path / "d")]) == 2
    assert "exists and is not empty; pass --force" in capsys.readouterr().err
    code = main(["data", "check", "--dataset", "tvr", "--data-root", str(tmp_path / "d"),
                 "--set", f"data.cache_dir={tmp_path / 'cache'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    for part in ("train       48      144", "val         16       48", "test        24       72",
                 "144 (100%)", "48-d, 1,783 rows", "32-d tokens", "queries without features: 0",
                 "features without queries: 0 videos", "NaN/Inf rows: 0 video feature rows", "errors: none"):
        assert part in out, part
    assert not (tmp_path / "cache").exists()  # check writes nothing
    assert main(["data", "export", "--dataset", "sim-tiny", "--to", str(tmp_path / "e")]) == 2
    assert "sim-tiny has no family in its preset; pass --as" in capsys.readouterr().err


def _metrics(block):
    return {k: block[k] for k in COMPARED}


def test_a_model_trained_on_either_evaluates_identically_on_both(tmp_path):
    root = exported(tmp_path / "data")
    code = main(["run", "--method", "baseline", "--dataset", "tvr", "--data-root", str(root), "--out",
                 str(tmp_path / "real"), "--quiet", "--set", "train.epochs=1",
                 "--set", f"data.cache_dir={tmp_path / 'cache'}", *[a for s in TINY for a in ("--set", s)]])
    assert code == 0
    real_record = json.loads((tmp_path / "real" / "runs" / "tvr" / "baseline" / "seed0.json").read_text())
    cfg = from_dict(real_record["config"])  # the same config, on the simulated original
    cfg.dataset, cfg.sim = "sim-tiny", resolve("baseline", "sim-tiny", 0).sim
    sim_record = run_one(cfg, tmp_path / "sim")
    for split in ("val", "test"):
        assert _metrics(sim_record["metrics"][split]) == _metrics(real_record["metrics"][split])
    assert [h["loss"] for h in sim_record["history"]] == [h["loss"] for h in real_record["history"]]
    assert real_record["metrics"]["test"]["buckets"]["short"]["n"] > 0  # timestamps came back
    assert real_record["provenance"]["data"]["test"]["exported_from"] == "sim-tiny"

    # the checkpoint trained on the simulated data, evaluated on the loaded export
    real_cfg = tvr_config(root, tmp_path / "cache", "train.epochs=1")
    trainer = build_run(real_cfg).trainer(tmp_path / "unused")
    trainer.load_model(tmp_path / "sim" / "checkpoints" / "sim-tiny" / "baseline" / "seed0" / "best.pt")
    assert _metrics(trainer.evaluate("test")) == _metrics(sim_record["metrics"]["test"])


@pytest.mark.parametrize("backbone", ["gmmformer2", "msl"])
def test_ral_trains_on_an_export_through_the_real_loaders(tmp_path, backbone):
    """RAL on exported data in the public layout, through the real loaders and the CLI."""
    root = exported(tmp_path / "data")
    code = main(["run", "--method", "ral", "--backbone", backbone, "--dataset", "tvr", "--data-root", str(root),
                 "--out", str(tmp_path / "real"), "--quiet", "--set", "train.epochs=1",
                 "--set", f"data.cache_dir={tmp_path / 'cache'}", *[a for s in TINY for a in ("--set", s)]])
    assert code == 0
    name = "ral" if backbone == "gmmformer2" else f"ral@{backbone}"
    record = json.loads((tmp_path / "real" / "runs" / "tvr" / name / "seed0.json").read_text())
    assert record["backbone"] == backbone and 0 < record["metrics"]["test"]["SumR"] <= 400
    assert "ral_pm" in record["history"][0] and "ral_da" in record["history"][0]
