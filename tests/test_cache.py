"""The dataset cache: corrupt or partial entries are regenerated, never trusted."""

import json

import numpy as np
import pytest

from prvr.datasets.sim import cache, generate, generate_one
from prvr.harness.engine.config import resolve
from prvr.harness.base.registry import DATASETS


def entry(tmp_path):
    cfg = resolve("baseline", "sim-tiny", 0, [f"data.cache_dir={tmp_path}"])
    data = DATASETS.get("sim-tiny").load(cfg)
    (folder,) = (tmp_path / "sim").iterdir()
    return cfg, data, folder


def corrupt_truncate(folder):
    f = folder / "train.frames.npy"
    f.write_bytes(f.read_bytes()[:-100])


def corrupt_flip(folder):
    f = folder / "test.tokens.npy"
    b = bytearray(f.read_bytes())
    b[-5] ^= 0xFF
    f.write_bytes(bytes(b))


def corrupt_manifest(folder):
    (folder / cache.MANIFEST).write_text("{half")


def corrupt_missing(folder):
    (folder / "val.text.json").unlink()


@pytest.mark.parametrize("damage", [corrupt_truncate, corrupt_flip, corrupt_manifest, corrupt_missing])
def test_corrupt_entry_is_regenerated(tmp_path, damage, monkeypatch):
    cfg, data, folder = entry(tmp_path)
    tokens, frames = np.array(data["test"].tokens.data), np.array(data["train"].frames.data)  # copies, not memmaps
    damage(folder)
    warnings = []
    monkeypatch.setattr("prvr.harness.base.progress.log", warnings.append)
    again = DATASETS.get("sim-tiny").load(cfg)
    assert any("corrupt" in w and "regenerating" in w for w in warnings)
    np.testing.assert_array_equal(again["test"].tokens.data, tokens)
    np.testing.assert_array_equal(again["train"].frames.data, frames)
    cache.load(folder)  # the rewritten entry is valid


def same_truth(a, b):
    """Two test splits hold the same ground truth: ids, texts, labels, moments, relevance."""
    assert a.query_ids == b.query_ids and a.video_ids == b.video_ids and a.query_text == b.query_text
    np.testing.assert_array_equal(a.query_video, b.query_video)
    np.testing.assert_array_equal(a.moments, b.moments)
    np.testing.assert_array_equal(a.durations, b.durations)
    assert (a.relevance != b.relevance).nnz == 0


def test_the_ground_truth_read_from_the_entry_is_the_whole_loads_and_reads_only_its_split(tmp_path, monkeypatch):
    """`load_truth` (the oracle SumR by query rebuilds a world's test relevance) gives the whole load's
    test split without its features; from a made entry it checks the test split's ground-truth files
    only (not its frames, tokens or extras, which it does not read), so damage elsewhere is left to the
    load that reads it, and damage in its own files is said and the ground truth made in an entry of
    its own."""
    cfg, data, folder = entry(tmp_path)
    spec = DATASETS.get("sim-tiny")
    whole = data["test"]
    truth = spec.load_truth(cfg)
    same_truth(truth, whole)
    assert len(truth.frames) == whole.num_videos and truth.frames.offsets[-1] == 0 and truth.frames.dim == whole.frames.dim
    assert len(truth.tokens) == whole.num_queries and truth.tokens.offsets[-1] == 0 and not truth.extra
    checked, digest = [], cache.file_digest
    monkeypatch.setattr(cache, "file_digest", lambda path, *a: checked.append(path.name) or digest(path, *a))
    spec.load_truth(cfg)
    assert checked and all(name.startswith("test.") for name in checked)
    assert not [n for n in checked if n.startswith(("test.frames.", "test.tokens.", "test.extra-"))]
    monkeypatch.undo()
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no entry of its own beside a made one
    corrupt_truncate(folder)  # a train file: not the test split's
    warnings = []
    monkeypatch.setattr("prvr.harness.base.progress.log", warnings.append)
    same_truth(spec.load_truth(cfg), whole)
    assert not warnings
    corrupt_flip(folder)  # the test split's tokens: not read for its ground truth
    same_truth(spec.load_truth(cfg), whole)
    assert not warnings
    moments = folder / "test.moments.npy"  # a ground-truth file: said, and the ground truth made alone in its own entry
    moments.write_bytes(moments.read_bytes()[:-8])
    same_truth(spec.load_truth(cfg), whole)
    assert any("corrupt" in w and "ground truth from its own entry" in w for w in warnings)
    assert (folder.parent / f"{folder.name}~test-truth").is_dir()
    assert cache.load_split(folder.parent / f"{folder.name}~test-truth", "nope") is None


def test_the_ground_truth_of_an_uncached_world_is_generated_once_into_a_small_entry(tmp_path, monkeypatch):
    """Where the world was never cached, the first `load_truth` generates its test split alone and
    keeps the ground truth in an entry of its own, without the split's features; the second
    reads it back without generating; damage to it is said and it is made again."""
    cfg = resolve("baseline", "sim-tiny", 0, [f"data.cache_dir={tmp_path}"])
    spec = DATASETS.get("sim-tiny")
    made = []
    real = generate_one
    monkeypatch.setattr("prvr.datasets.sim.generate_one", lambda *a: made.append(a[2]) or real(*a))
    first = spec.load_truth(cfg)
    (own,) = (tmp_path / "sim").iterdir()
    assert own.name.endswith("~test-truth") and made == ["test"]
    second = spec.load_truth(cfg)
    assert made == ["test"]
    same_truth(first, second)
    whole = generate("sim-tiny", cfg.sim)["test"]
    same_truth(second, whole)
    for features in ("frames", "tokens"):  # kept without a row of features
        assert np.load(own / f"test.{features}.npy", allow_pickle=False).shape == (0, getattr(whole, features).dim)
    assert not [f.name for f in own.iterdir() if f.name.startswith(("train.", "val.", "test.extra-"))]
    corrupt = own / "test.rel_indices.npy"
    corrupt.write_bytes(corrupt.read_bytes()[:-8])
    warnings = []
    monkeypatch.setattr("prvr.harness.base.progress.log", warnings.append)
    same_truth(spec.load_truth(cfg), whole)
    assert made == ["test", "test"] and any("corrupt" in w and "regenerating" in w for w in warnings)


def test_a_split_generated_alone_is_the_whole_worlds():
    """Each split draws from its own stream, so the test split made alone (no cache entry: the oracle
    SumR by query of a world not cached) is the one the whole world holds, array for array."""
    knobs = ["compound_prob=0.3", "unnamed_prob=0.2", "hidden_scene_prob=0.2", "recurring_unannotated=0.2",
             "distinct_wording=0.3", "mislabel_rate=0.1"]  # every later knob on: each must keep to its split's stream
    cfg = resolve("baseline", "sim-tiny", 0, [f"sim.{k}" for k in knobs])
    whole = generate("sim-tiny", cfg.sim)
    for split in ("test", "train"):
        alone, there = generate_one("sim-tiny", cfg.sim, split), whole[split]
        assert alone.query_ids == there.query_ids and alone.query_text == there.query_text
        assert (alone.relevance != there.relevance).nnz == 0
        for a, b in ((alone.frames.data, there.frames.data), (alone.tokens.data, there.tokens.data),
                     (alone.query_video, there.query_video), (alone.moments, there.moments)):
            np.testing.assert_array_equal(a, b)
        assert alone.extra.keys() == there.extra.keys()
    assert generate_one("sim-tiny", cfg.sim, "nope") is None


def test_half_written_entry_is_never_visible(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError("disk full")

    cfg = resolve("baseline", "sim-tiny", 0, [f"data.cache_dir={tmp_path}"])
    monkeypatch.setattr(cache, "write_json", boom)  # the manifest is written last
    with pytest.raises(OSError):
        DATASETS.get("sim-tiny").load(cfg)
    assert not any(p.name.startswith("sim-tiny") for p in (tmp_path / "sim").iterdir())


def test_key_changes_with_any_knob():
    a = cache.cache_key({"sim": {"repeat_prob": 0.4}})
    b = cache.cache_key({"sim": {"repeat_prob": 0.41}})
    assert a != b and len(a) == 16
    assert json.dumps(sorted([a, b]))


def _build_slowly(folder, builds, started):
    """A process that wants the entry: its build counts itself and takes long enough for the other to arrive."""
    import time

    def build():
        with builds.get_lock():
            builds.value += 1
        time.sleep(1.0)
        return generate("sim-tiny", resolve("baseline", "sim-tiny", 0).sim)

    started.wait()
    data = cache.load_or_build(folder / "sim" / "sim-tiny-race", build, print)
    assert len(data.splits["train"].query_ids) > 0


def test_two_processes_wanting_one_new_entry_build_it_once(tmp_path):
    """CPU. Two runs started at once on a new world (a sweep's two lanes): without turns both built it and the
    second's store removed the first's entry while the first read it ("unreadable right after it was
    written"). With the lock the second waits and loads the first's entry."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    builds, started = ctx.Value("i", 0), ctx.Event()
    procs = [ctx.Process(target=_build_slowly, args=(tmp_path / "cache", builds, started)) for _ in range(2)]
    for p in procs:
        p.start()
    started.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0] and builds.value == 1
    assert [p.name for p in (tmp_path / "cache" / "sim").iterdir()] == ["sim-tiny-race"]  # entries only
