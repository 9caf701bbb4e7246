"""Stored rankings (harness/engine/rankings.py): the top K and its ranks against a brute-force
reference with ties, the file round trip, and `prvr-bench evaluate RECORD --relevance FILE`
against a full re-evaluation of the same checkpoint."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.datasets.real.relevance import write_relevance
from prvr.harness.engine import rankings as rk
from prvr.harness.cli import main
from prvr.harness.engine.evaluate import compute_ranks, metrics_from_ranks, reference_ranks
from prvr.harness.base.io import UserError
from prvr.harness.base.scores import worst_if_nonfinite
from prvr.harness.engine.records import record_path
from prvr.harness.cli.reevaluate import relevance_rows
from prvr.harness.engine.runner import run_one


def tied_scores(q, v, seed=0):
    rng = np.random.default_rng(seed)
    scores = torch.tensor(rng.integers(0, 12, size=(q, v)).astype(np.float32))  # many ties
    scores[0] = float("nan")  # a diverged row: every video ties, ranked last
    scores[1] = 1.0
    return scores


@pytest.mark.parametrize("videos", [30, 150])
def test_top_ranks_match_a_full_sort_with_ties_counting_against_the_model(videos):
    from prvr.harness.base.scores import worst_if_nonfinite

    scores = worst_if_nonfinite(tied_scores(12, videos))
    index, rank = rk.top_ranks(scores, 100)
    assert index.shape == rank.shape == (12, min(100, videos))
    full = np.stack([reference_ranks(np.repeat(s[None], len(row), axis=0), [[v] for v in row])
                     for s, row in zip(scores.numpy(), index.tolist())])
    expected = np.where(full > 100, 101, full)  # past the list: K + 1
    np.testing.assert_array_equal(rank.numpy(), expected)
    listed = scores.gather(1, index).numpy()
    assert (listed[:, :-1] >= listed[:, 1:]).all()  # best first


class FakeSplit:
    """What ranking_of reads of a split."""

    def __init__(self, q, v, seed=0):
        rng = np.random.default_rng(seed)
        self.num_queries, self.num_videos = q, v
        self.video_ids = [f"v{i}" for i in range(v)]
        self.query_ids = [f"v{i % v}#enc#{i}" for i in range(q)]
        self.query_text = [f"query {i}" for i in range(q)]
        self.query_video = rng.integers(0, v, size=q)
        self.fractions = rng.random(q)

    def labels(self):
        return sp.csr_matrix((np.ones(self.num_queries, bool), (np.arange(self.num_queries), self.query_video)),
                             shape=(self.num_queries, self.num_videos))

    def moment_fraction(self):
        return self.fractions


def relevance_for(split, seed=1):
    rng = np.random.default_rng(seed)
    dense = rng.random((split.num_queries, split.num_videos)) < 0.05
    dense[np.arange(split.num_queries), split.query_video] = True
    dense[rng.random(split.num_queries) < 0.2] = False  # queries the file does not cover
    return sp.csr_matrix(dense)


@pytest.mark.parametrize("videos", [60, 300])
def test_metrics_from_stored_ranks_equal_the_evaluators_for_every_k_up_to_100(tmp_path, videos):
    split, scores = FakeSplit(45, videos), tied_scores(45, videos, seed=3)
    relevance = relevance_for(split)
    ranking = rk.ranking_of(lambda a, b: scores[a:b], split, chunk=7)
    full = metrics_from_ranks(compute_ranks(lambda a, b: scores[a:b], 45, split.labels(), relevance, chunk=11),
                              split.fractions, relevance)
    stored = rk.metrics_of(ranking, relevance)
    assert full["oracle"].pop("unlabelled_above") is not None and stored["oracle"].pop("unlabelled_above") is None
    assert stored == full
    rk.save_rankings(tmp_path / "seed0.rank.npz", {"test": ranking}, {"run": "x"})
    back, meta = rk.load_rankings(tmp_path / "seed0.rank.npz")
    assert meta["run"] == "x" and meta["splits"] == ["test"]
    again = rk.metrics_of(back["test"], relevance)
    assert again["oracle"].pop("unlabelled_above") is None and again == stored
    assert back["test"].keys.query_ids == split.query_ids
    with np.load(tmp_path / "seed0.rank.npz", allow_pickle=False) as z:  # plain arrays, no pickle
        assert z["test.top"].dtype == np.uint16 and z["test.ties"].dtype == np.uint8


def test_stored_rankings_need_at_least_the_top_100_and_a_broken_file_is_one_line(tmp_path):
    split, scores = FakeSplit(5, 20), tied_scores(5, 20)
    with pytest.raises(UserError, match="at least the top 100"):
        rk.ranking_of(lambda a, b: scores[a:b], split, chunk=4, top_k=10)
    (tmp_path / "seed0.rank.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="stored rankings .*seed0.rank.npz cannot be read .*--from-checkpoint"):
        rk.load_rankings(tmp_path / "seed0.rank.npz")


# ----------------------------------------------------------------------------- stored runs
@pytest.fixture(scope="module")
def stored_run(tmp_path_factory):
    from prvr.harness.engine.config import resolve

    out = tmp_path_factory.mktemp("runs")
    record = run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), out)
    return out, record_path(out, "sim-tiny", "baseline", 0), record


def test_a_run_stores_its_val_and_test_rankings_beside_its_record(stored_run):
    _, path, record = stored_run
    assert record["rankings"] == {"file": "seed0.rank.npz", "top_k": 100, "splits": ["val", "test"]}
    rankings, meta = rk.load_rankings(rk.rankings_path(path))
    assert (meta["dataset"], meta["seed"]) == ("sim-tiny", 0)
    for split in ("val", "test"):
        again = rk.metrics_of(rankings[split], None)
        for key in ("R@1", "R@5", "R@10", "R@100", "SumR", "median_rank", "mean_rank", "n", "buckets"):
            assert again[key] == record["metrics"][split][key], (split, key)


def _arrays(ranking):
    return ranking.top, ranking.top_rank, ranking.labelled_rank


def _fresh_rankings(out, cfg_sets=("train.epochs=1",)):
    """Each split ranked again from the run's best checkpoint (`rank_split`, the plain path)."""
    from prvr.harness.engine.build import build_run
    from prvr.harness.engine.config import resolve
    from prvr.harness.engine.records import checkpoint_dir

    cfg = resolve("baseline", "sim-tiny", 0, list(cfg_sets))
    run = build_run(cfg)
    trainer = run.trainer(checkpoint_dir(out, "sim-tiny", "baseline", 0))
    trainer.load_model(checkpoint_dir(out, "sim-tiny", "baseline", 0) / "best.pt")
    return {s: rk.rank_split(trainer.model, run.data[s], trainer.batchers[s], trainer.device, cfg.eval.chunk)
            for s in ("val", "test")}


def test_a_runs_stored_rankings_are_its_evaluations_ranks_without_a_second_scoring_pass(stored_run):
    """CPU. The stored val ranks are those of the best epoch's val evaluation and the test ranks those
    of the test evaluation (`RankingSink` fed by the evaluator's own scores); ranking the best
    checkpoint again, the plain path, gives the same arrays."""
    out, path, record = stored_run
    assert "eval_rankings" not in record["timings"]  # nothing encoded or scored a second time
    stored, _ = rk.load_rankings(rk.rankings_path(path))
    fresh = _fresh_rankings(out)
    for split in ("val", "test"):
        for mine, plain in zip(_arrays(stored[split]), _arrays(fresh[split])):
            np.testing.assert_array_equal(mine, plain)


def test_a_resumed_run_whose_best_epoch_an_earlier_process_chose_ranks_val_again(tmp_path):
    """CPU. A run resumed after its last epoch has no val ranks in memory: it ranks val from the best
    checkpoint (timed as eval_rankings), and the stored ranks are the plain path's."""
    from prvr.harness.engine.config import resolve

    cfg = resolve("baseline", "sim-tiny", 0, ["train.epochs=1"])
    run_one(cfg, tmp_path)
    record = run_one(cfg, tmp_path, resume=True)
    assert record["timings"]["eval_rankings"] > 0
    stored, _ = rk.load_rankings(rk.rankings_path(record_path(tmp_path, "sim-tiny", "baseline", 0)))
    fresh = _fresh_rankings(tmp_path)
    for split in ("val", "test"):
        for mine, plain in zip(_arrays(stored[split]), _arrays(fresh[split])):
            np.testing.assert_array_equal(mine, plain)


def test_a_ranking_sink_refuses_chunks_out_of_order_and_an_unfinished_split():
    split, scores = FakeSplit(10, 120), tied_scores(10, 120)
    labelled = torch.as_tensor(compute_ranks(lambda a, b: scores[a:b], 10, split.labels())["labelled"])
    clean = worst_if_nonfinite(scores)  # a sink is given the chunks as the evaluator ranks them
    sink = rk.RankingSink(split)
    sink(0, clean[:4], labelled[:4])
    with pytest.raises(ValueError, match="the chunk of queries from 8 came where the one from 4 was due"):
        sink(8, clean[8:], labelled[8:])
    with pytest.raises(ValueError, match="4 of 10 queries were scored"):
        sink.ranking()
    sink(4, clean[4:], labelled[4:])
    for mine, plain in zip(_arrays(sink.ranking()), _arrays(rk.ranking_of(lambda a, b: scores[a:b], split, chunk=3))):
        np.testing.assert_array_equal(mine, plain)


def world_file(tmp_path, thin=False):
    """The sim-tiny test split's ground truth as a relevance file; `thin`: every third query
    dropped and the others' relevant sets cut to the labelled video plus one more."""
    from prvr.harness.engine.build import load_data
    from prvr.harness.engine.config import resolve

    test = load_data(resolve("baseline", "sim-tiny", 0))["test"]
    if thin:
        rel = test.relevance.tolil()
        for q in range(test.num_queries):
            keep = [] if q % 3 == 0 else sorted({int(test.query_video[q]), *rel.rows[q][:1]})
            rel.rows[q], rel.data[q] = keep, [True] * len(keep)
        test.relevance = rel.tocsr()
    write_relevance(tmp_path / "world.jsonl", test)
    return tmp_path / "world.jsonl"


def test_rescoring_under_the_worlds_own_file_gives_the_records_oracle_figures(stored_run, tmp_path):
    _, path, record = stored_run
    [row] = relevance_rows([path], world_file(tmp_path))
    test = record["metrics"]["test"]
    assert row["source"] == "seed0.rank.npz" and row["relevance"]["covered"] == test["n"]
    oracle = {k: v for k, v in test["oracle"].items() if k != "unlabelled_above"}
    assert {k: v for k, v in row["metrics"]["oracle"].items() if k != "unlabelled_above"} == oracle
    assert row["metrics"]["SumR"] == test["SumR"]


def test_rescoring_from_stored_rankings_equals_a_full_re_evaluation_of_the_checkpoint(stored_run, tmp_path):
    _, path, _ = stored_run
    file = world_file(tmp_path, thin=True)
    [stored] = relevance_rows([path], file)
    [full] = relevance_rows([path], file, from_checkpoint=True)
    assert full["source"] == "best.pt" and stored["relevance"] == full["relevance"]
    assert 0 < stored["relevance"]["covered"] < stored["relevance"]["queries"]
    assert full["metrics"]["oracle"].pop("unlabelled_above") is not None
    assert stored["metrics"]["oracle"].pop("unlabelled_above") is None
    for key in ("R@1", "R@5", "R@10", "R@100", "SumR", "median_rank", "mean_rank", "n", "buckets", "oracle"):
        assert stored["metrics"][key] == full["metrics"][key], key


def test_evaluate_relevance_command_prints_the_table_and_the_join(stored_run, tmp_path, capsys):
    _, path, _ = stored_run
    file = world_file(tmp_path, thin=True)
    assert main(["evaluate", str(path), "--relevance", str(file), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "| run | from | R@1 |" in out and "oracle SumR" in out and "dense SumR" in out
    assert "| baseline seed 0 | seed0.rank.npz |" in out
    assert "baseline seed 0: relevance world.jsonl: 48 of 72 queries covered" in out
    assert "queries of the split the file does not cover (left out of the oracle figures): 24" in out
    stored = json.loads((tmp_path / "r.json").read_text())
    assert stored["relevance"] == "world.jsonl" and stored["rows"][0]["relevance"]["covered"] == 48


def test_a_record_without_stored_rankings_says_so_in_one_line(stored_run, tmp_path, capsys):
    out, path, _ = stored_run
    old = out / "runs" / "sim-tiny" / "old" / "seed0.json"
    old.parent.mkdir(parents=True)
    old.write_text(path.read_text())
    with pytest.raises(UserError, match=r"has no stored rankings \(seed0.rank.npz: .*add --from-checkpoint"):
        relevance_rows([old], world_file(tmp_path))
    assert main(["evaluate", str(path), "--from-checkpoint"]) == 2
    assert "--from-checkpoint goes with --relevance" in capsys.readouterr().err
    assert main(["evaluate", str(path), "--relevance", "x.jsonl", "--parts"]) == 2
    assert "leave out --parts" in capsys.readouterr().err
