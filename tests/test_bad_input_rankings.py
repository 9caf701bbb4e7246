"""Bad input, round four: stored rankings (`seed<S>.rank.npz`) are trusted no more than records
(docs/bad-input.md, "Stored rankings"). A file is read with allow_pickle=False, checked to hold
rankings a run can store (ranks from 1 to the split's videos, indices within the split, the stored
width its top_k, no negative ties, moment fractions in [0, 1] or unknown), and checked to be its
record's (the meta's dataset, run and seed, and every figure recomputed from it); every malformed
file is one line naming it."""

import dataclasses
import json

import numpy as np
import pytest

from prvr.datasets.real.relevance import SplitKeys
from prvr.harness.base.io import UserError
from prvr.harness.engine.evaluate import metrics_from_ranks
from prvr.harness.engine.rankings import (SplitRanking, load_rankings, rankings_of_record, rankings_path,
                                          save_rankings)
from prvr.harness.engine.records import record_path, write_record

Q, NV, K = 20, 30, 10


def ranking(**change) -> SplitRanking:
    rng = np.random.default_rng(0)
    top = np.stack([rng.permutation(NV)[:K] for _ in range(Q)])
    keys = SplitKeys([f"v{i}" for i in range(NV)], [f"q{i}" for i in range(Q)], [f"t {i}" for i in range(Q)],
                     np.arange(Q) % NV)
    r = SplitRanking(top, np.tile(np.arange(1, K + 1), (Q, 1)), rng.integers(1, NV + 1, size=Q),
                     np.full(Q, 0.3), keys, K)
    return dataclasses.replace(r, **change)


def stored(tmp_path, r: SplitRanking, meta=None, seed=0, metrics_of=None):
    """A record at its place and its rankings; the record's figures are those of `metrics_of` (default r)."""
    path = record_path(tmp_path, "sim-x", "a", seed)
    metrics = metrics_from_ranks({"labelled": (metrics_of or r).labelled_rank}, r.moment_fraction)
    record = {"method": "a", "dataset": "sim-x", "seed": seed, "run_name": "a", "metrics": {"test": metrics}}
    write_record(path, record)
    save_rankings(rankings_path(path), {"test": r}, {"run": "a", "dataset": "sim-x", "seed": seed, **(meta or {})})
    return path, record


def test_sound_rankings_of_their_record_load(tmp_path):
    path, record = stored(tmp_path, ranking())
    rankings, where = rankings_of_record(path, record)
    assert where.name == "seed0.rank.npz" and rankings["test"].top_k == K


@pytest.mark.parametrize("change, says", [
    ({"labelled_rank": np.ones(Q, dtype=np.int64) * -5}, "labelled ranks from -5"),
    ({"labelled_rank": np.full(Q, NV + 3)}, f"among {NV} videos"),
    ({"top": np.full((Q, K), NV + 7)}, "listed video indices"),
    ({"top_k": 5}, "top_k 5"),
    ({"moment_fraction": np.full(Q, np.inf)}, "moment fractions outside"),
])
def test_impossible_rankings_are_one_line(tmp_path, change, says):
    path, _ = stored(tmp_path, ranking())
    save_rankings(rankings_path(path), {"test": ranking(**change)}, {"run": "a", "dataset": "sim-x", "seed": 0})
    with pytest.raises(UserError, match=rf"stored rankings .*seed0.rank.npz, split 'test': .*{says}") as e:
        load_rankings(rankings_path(path))
    assert "\n" not in str(e.value)


def test_negative_ties_are_refused(tmp_path):
    r = ranking()
    bad = dataclasses.replace(r, top_rank=r.top_rank.astype(np.int64) - 3)
    path, _ = stored(tmp_path, r)
    save_rankings(rankings_path(path), {"test": bad}, {"run": "a", "dataset": "sim-x", "seed": 0})
    with pytest.raises(UserError, match="negative ties"):
        load_rankings(rankings_path(path))


def test_rankings_with_all_ranks_1_are_not_scored_under_a_record_that_says_otherwise(tmp_path):
    """A file whose labelled ranks are all 1 scored R@1 100 / SumR 400 under a record that said less."""
    honest = ranking()
    path, record = stored(tmp_path, honest)
    save_rankings(rankings_path(path), {"test": ranking(labelled_rank=np.ones(Q, dtype=np.int64))},
                  {"run": "a", "dataset": "sim-x", "seed": 0})
    with pytest.raises(UserError, match=r"give test R@1 100.0000, but run record .*seed0.json says .*do not belong"):
        rankings_of_record(path, record)


def test_another_seeds_rankings_beside_a_record_are_refused(tmp_path):
    path, record = stored(tmp_path, ranking(), meta={"seed": 1})
    with pytest.raises(UserError, match=r"are of seed 1, but run record .*seed0.json is of 0"):
        rankings_of_record(path, record)


@pytest.mark.parametrize("damage, says", [
    (lambda b: b[: len(b) // 2], "cannot be read"),
    (lambda b: b"", "cannot be read"),
    (lambda b: b"not a zip at all", "cannot be read"),
])
def test_truncated_empty_or_foreign_files_are_one_line(tmp_path, damage, says):
    path, record = stored(tmp_path, ranking())
    file = rankings_path(path)
    file.write_bytes(damage(file.read_bytes()))
    with pytest.raises(UserError, match=rf"stored rankings .*seed0.rank.npz {says}") as e:
        load_rankings(file)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("meta", [[1, 2], {"format": 1, "splits": "test"}, {"format": 1, "splits": [3]}])
def test_a_wrong_meta_is_one_line(tmp_path, meta):
    path, _ = stored(tmp_path, ranking())
    file = rankings_path(path)
    with np.load(file, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(file, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(UserError, match=r"stored rankings .* cannot be read \(ValueError: its meta"):
        load_rankings(file)


def test_a_pickle_in_a_rankings_file_is_never_unpickled(tmp_path):
    path, _ = stored(tmp_path, ranking())
    file = rankings_path(path)
    with open(file, "wb") as f:
        np.savez(f, meta=np.array([object()], dtype=object))
    with pytest.raises(UserError, match="cannot be read"):
        load_rankings(file)
