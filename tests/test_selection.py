"""The selection split: val that holds the test queries is detected by content, and
data.val_from_train=N holds out N training videos with all their queries."""

import copy

import numpy as np
import pytest

from prvr.datasets import selection
from prvr.harness.reports import leaderboard
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import DATASETS
from prvr.harness.engine.records import run_protocol


@pytest.fixture(scope="module")
def tiny():
    return DATASETS.get("sim-tiny").load(resolve("baseline", "sim-tiny", 0))


def test_distinct_splits_are_not_flagged(tiny):
    assert tiny.meta["selection"]["val_is_test"] is False
    assert tiny.meta["selection"]["test_queries_in_val"] < 0.5


def test_val_holding_the_test_queries_is_found_by_content(tiny):
    data = copy.copy(tiny)
    data.splits = dict(tiny.splits)
    test = copy.copy(tiny["test"])
    test.query_ids = [f"renamed-{q}" for q in test.query_ids]  # other ids, same videos and captions
    test.query_text = [f"  {t.upper()} " for t in test.query_text]  # case and spacing do not hide it
    data.splits["val"] = test
    data.meta = {}
    out = selection.apply(data, resolve("baseline", "sim-tiny", 0))
    assert out.meta["selection"]["val_is_test"] is True
    assert out.meta["selection"]["test_queries_in_val"] == 1.0
    proto = run_protocol(resolve("baseline", "sim-tiny", 0).to_dict(), "sim-tiny", out.meta["selection"])
    assert proto["selection"] == "val SumR on val = test queries" and proto["follows_protocol"]


def test_val_from_train_holds_out_whole_videos(tiny):
    cfg = resolve("baseline", "sim-tiny", 0, ["data.val_from_train=10"])
    data = DATASETS.get("sim-tiny").load(cfg)
    train, val = data["train"], data["val"]
    assert val.num_videos == 10 and train.num_videos == tiny["train"].num_videos - 10
    assert train.num_queries + val.num_queries == tiny["train"].num_queries
    assert not set(train.video_ids) & set(val.video_ids)
    held = selection.held_out_videos(tiny["train"], 10, "sim-tiny")
    source = tiny["train"]
    for i, v in enumerate(held):  # frames, queries, tokens and ground truth follow their video
        assert np.array_equal(val.frames[i], source.frames[v])
        mine = np.nonzero(val.query_video == i)[0]
        theirs = np.nonzero(source.query_video == v)[0]
        assert [val.query_text[q] for q in mine] == [source.query_text[q] for q in theirs]
        assert all(np.array_equal(val.tokens[a], source.tokens[b]) for a, b in zip(mine, theirs))
    assert val.relevance.shape == (val.num_queries, 10)
    facts = data.meta["selection"]["val_from_train"]
    assert facts["videos"] == 10 and facts["video_ids"] == val.video_ids
    again = DATASETS.get("sim-tiny").load(resolve("baseline", "sim-tiny", 3, ["data.val_from_train=10"]))
    assert again["val"].video_ids == val.video_ids  # the same videos for every run seed
    assert run_protocol(cfg.to_dict(), "sim-tiny")["selection"] == "val SumR on 10 held-out train videos"


def test_val_from_train_out_of_range_is_one_line(tiny):
    with pytest.raises(UserError, match="data.val_from_train=48 must be between 1 and 47"):
        DATASETS.get("sim-tiny").load(resolve("baseline", "sim-tiny", 0, ["data.val_from_train=48"]))


def test_selection_protocols_never_average_together():
    rec = {"method": "baseline", "dataset": "sim-tiny", "seed": 0, "run_name": "baseline", "provenance": {},
           "config": {"train": {"epochs": 3, "patience": 5}, "data": {"val_from_train": 0}},
           "metrics": {"test": {"SumR": 100.0}}}
    held = copy.deepcopy(rec)
    held["config"]["data"]["val_from_train"] = 10
    held["metrics"]["test"]["SumR"] = 90.0
    rows = leaderboard.build_rows([rec, held])
    assert sorted(r["budget"] for r in rows) == ["3 ep / stop 5", "3 ep / stop 5, on 10 held-out train videos"]
    assert all(len(r["SumR"]) == 1 for r in rows)
