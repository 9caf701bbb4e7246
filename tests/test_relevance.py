"""Relevance files (datasets/real/relevance.py): both formats, their one-line errors, the join
to a split and its report, the export round trip, and the oracle figures over the covered
queries (oracle SumR and dense recall, checked by hand and against a brute-force reference)."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from real_layouts import exported, load_tvr, msl_paths, sim_tiny, tvr_config

from prvr.datasets.real import relevance as rel
from prvr.datasets.real.problems import LayoutError
from prvr.harness.engine.config import resolve
from prvr.harness.engine.evaluate import compute_ranks, evaluate_scores, metrics_from_ranks
from prvr.harness.base.io import UserError


def write_lines(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


KEYS = rel.SplitKeys(video_ids=["a", "b", "c", "d"], query_ids=["a#enc#0", "a#enc#1", "b#enc#0", "c#enc#0"],
                     query_text=["A man runs.", "A man runs!", "She sits down.", "He jumps."],
                     query_video=np.array([0, 0, 1, 2]))


# ----------------------------------------------------------------------------- reading
def test_both_formats_are_read_and_prvr_ea_names_the_labelled_video_by_its_cap_id(tmp_path):
    path = write_lines(tmp_path / "r.jsonl", [
        {"query_id": "a#enc#0", "caption": "A man runs.", "gt_video_ids": ["a", "b", "a"]},
        {"video": "b", "caption": "She sits down.", "relevant": ["b"]},
        "",
    ])
    f = rel.read_relevance(path)
    assert f.format == "mixed" and len(f.entries) == 2 and len(f.sha256) == 64
    first, second = f.entries
    assert (first.video, first.relevant, first.line) == ("a", ("a", "b"), 1)  # duplicates dropped, order kept
    assert (second.query_id, second.video, second.line) == (None, "b", 2)


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: holds list, expected a JSON object"),
    ({"query_id": "x"}, "line 2: give the relevant videos as either 'gt_video_ids' (prvr-ea) or 'relevant'"),
    ({"query_id": "x", "relevant": ["a"], "gt_video_ids": ["a"]}, "exactly one of them"),
    ({"query_id": "x", "relevant": []}, "line 2: key 'relevant' must be a non-empty list of video ids"),
    ({"query_id": "x", "gt_video_ids": ["a", 3]}, "key 'gt_video_ids' must be a non-empty list"),
    ({"caption": "c", "gt_video_ids": ["a"]}, "line 2: key 'query_id' must be a non-empty string, got null"),
    ({"caption": "c", "relevant": ["a"]}, "line 2: name the query by 'query_id', or by 'video'"),
    ({"query_id": "a#enc#0", "relevant": ["a"]}, "line 2: query id 'a#enc#0' already on line 1; give each query once"),
])
def test_a_bad_line_is_a_one_line_error_naming_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.jsonl", [{"query_id": "a#enc#0", "relevant": ["a"]}, line])
    with pytest.raises(LayoutError, match="relevance file .*bad.jsonl") as e:
        rel.read_relevance(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_missing_or_empty_file_is_an_error(tmp_path):
    with pytest.raises(LayoutError, match="does not exist"):
        rel.read_relevance(tmp_path / "none.jsonl")
    with pytest.raises(LayoutError, match="holds no entries"):
        rel.read_relevance(write_lines(tmp_path / "empty.jsonl", [""]))


def test_prvr_ea_filter_note_is_read_from_the_meta_file_beside(tmp_path):
    path = write_lines(tmp_path / "tvrdenseval_v.gt.jsonl", [{"query_id": "a#enc#0", "gt_video_ids": ["a"]}])
    (tmp_path / "tvrdenseval_v.meta.json").write_text(json.dumps({"filter": "type == v"}))
    assert rel.read_relevance(path).note == "filter: type == v"


# ----------------------------------------------------------------------------- the join
def join_lines(tmp_path, objs):
    return rel.join(rel.read_relevance(write_lines(tmp_path / "r.jsonl", objs)), KEYS)


def test_join_by_query_id_and_by_video_and_caption_with_a_report_line_per_cause(tmp_path):
    matrix, report = join_lines(tmp_path, [
        {"query_id": "a#enc#0", "caption": "a man runs", "gt_video_ids": ["a", "c"]},  # by id (caption normalised)
        {"video": "c", "caption": "he JUMPS", "relevant": ["c", "d"]},  # by video + caption
        {"query_id": "z#enc#0", "gt_video_ids": ["z"]},  # no such query
        {"query_id": "b#enc#0", "caption": "Another sentence.", "gt_video_ids": ["b"]},  # caption differs
    ])
    assert matrix.shape == (4, 4) and report.covered == 2 and report.queries == 4
    assert matrix.toarray().astype(int).tolist() == [[1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]]
    assert dict(report.counts) == {rel.JOINED_BY_ID: 1, rel.JOINED_BY_CAPTION: 1, rel.NO_QUERY: 1,
                                   rel.OTHER_CAPTION: 1, rel.UNCOVERED: 2}
    lines = report.lines()
    assert lines[0] == "relevance r.jsonl: 2 of 4 queries covered"
    assert f"  {rel.OTHER_CAPTION}: 1" in lines and len(lines) == 6


def test_a_query_id_naming_another_labelled_video_is_left_out(tmp_path):
    _, report = join_lines(tmp_path, [{"query_id": "a#enc#0", "video": "b", "relevant": ["b"]}])
    assert report.covered == 0 and report.counts[rel.OTHER_VIDEO] == 1


def test_a_relevant_video_outside_the_split_leaves_its_query_out(tmp_path):
    matrix, report = join_lines(tmp_path, [{"query_id": "c#enc#0", "relevant": ["c", "elsewhere"]}])
    assert report.covered == 0 and matrix.nnz == 0 and report.counts[rel.OUTSIDE] == 1
    assert report.counts[rel.JOINED_BY_ID] == 0


def test_a_relevant_set_without_the_labelled_video_is_kept_and_counted(tmp_path):
    matrix, report = join_lines(tmp_path, [{"query_id": "c#enc#0", "relevant": ["d"]}])
    assert report.covered == 1 and matrix[3].toarray().tolist() == [[False, False, False, True]]
    assert report.counts[rel.NO_LABELLED] == 1


def test_queries_sharing_video_and_caption_join_only_when_any_pairing_is_the_same(tmp_path):
    # "A man runs." and "A man runs!" of video a normalise alike: two queries, one key
    same = [{"video": "a", "caption": "a man runs", "relevant": ["a", "b"]}] * 2
    matrix, report = join_lines(tmp_path, same)
    assert report.counts[rel.JOINED_BY_CAPTION] == 2 and matrix[:2].sum() == 4
    differ = [{"video": "a", "caption": "a man runs", "relevant": ["a", "b"]},
              {"video": "a", "caption": "a man runs", "relevant": ["a"]}]
    matrix, report = join_lines(tmp_path, differ)
    assert report.covered == 0 and report.counts[rel.AMBIGUOUS] == 2
    _, report = join_lines(tmp_path, same[:1])  # one entry for two queries: no sure pairing either
    assert report.covered == 0 and report.counts[rel.AMBIGUOUS] == 1


# ----------------------------------------------------------------------------- oracle figures
def test_oracle_figures_cover_only_the_covered_queries_by_hand():
    """3 queries x 4 videos; query 2 is not covered. Query 0: labelled 0 (rank 2), also relevant
    3 (rank 1). Query 1: labelled 1 (rank 4), relevant 1 and 2 (rank 3)."""
    scores = torch.tensor([[0.5, 0.1, 0.2, 0.9], [0.9, 0.1, 0.3, 0.5], [0.1, 0.2, 0.3, 0.4]])
    labels = sp.csr_matrix(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=bool))
    relevance = sp.csr_matrix(np.array([[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]], dtype=bool))
    m = evaluate_scores(scores, labels, relevance)
    oracle = m["oracle"]
    assert (oracle["n"], oracle["queries"]) == (2, 3)
    assert oracle["R@1"] == 50.0 and oracle["R@5"] == 100.0  # query 0 hits at 1, query 1 at 3
    assert oracle["dense R@1"] == pytest.approx(100 * (1 / 2 + 0) / 2)  # |top1 ∩ rel| / |rel|
    assert oracle["dense R@5"] == 100.0
    assert oracle["multi_relevant_share"] == 100.0
    assert oracle["unlabelled_above"] == pytest.approx((1 + 1) / 2)  # q0: video 3 above; q1: video 2 above
    assert m["n"] == 3  # the labelled figures keep every query


def brute_dense(scores, relevance, k):
    """prvr-ea's multi-GT Recall@K over the covered queries (scores without ties)."""
    out = []
    for s, row in zip(scores, relevance.toarray()):
        if row.any():
            top = set(np.argsort(-s)[:k])
            out.append(len(top & set(np.nonzero(row)[0])) / row.sum())
    return 100 * np.mean(out)


def test_dense_recall_matches_a_brute_force_reference_without_ties():
    rng = np.random.default_rng(0)
    scores = rng.permutation(40 * 130).reshape(40, 130).astype(np.float64)  # distinct: no ties
    labels = sp.csr_matrix((np.ones(40, bool), (np.arange(40), rng.integers(0, 130, 40))), shape=(40, 130))
    relevance = (sp.random(40, 130, density=0.06, random_state=2, format="csr") > 0).astype(bool) + labels
    relevance = sp.csr_matrix(relevance.toarray() * (np.arange(40) % 7 != 0)[:, None])  # some rows uncovered
    ranks = compute_ranks(lambda a, b: torch.as_tensor(scores[a:b]), 40, labels, relevance, chunk=6)
    oracle = metrics_from_ranks(ranks, relevance=relevance)["oracle"]
    for k in (1, 5, 10, 100):
        assert oracle[f"dense R@{k}"] == pytest.approx(brute_dense(scores, relevance, k))
    assert oracle["n"] == int((np.diff(relevance.indptr) > 0).sum()) < 40


# ----------------------------------------------------------------------------- loading and exporting
@pytest.mark.parametrize("layout", ["msl", "xml"])
def test_export_writes_the_ground_truth_and_the_real_loaders_join_it_back(tmp_path, layout):
    root = exported(tmp_path / "data", layout)
    real, sim = load_tvr(root, tmp_path / "cache", layout=layout), sim_tiny()
    for name in ("train", "val", "test"):
        assert (real[name].relevance != sim[name].relevance).nnz == 0
        assert real.meta["relevance"][name]["covered"] == sim[name].num_queries
    assert real.has_ground_truth


def test_oracle_metrics_on_the_loaded_export_equal_the_worlds_own(tmp_path):
    from prvr.datasets.loader import Batcher
    from prvr.harness.engine.build import build_model
    from prvr.harness.engine.evaluate import evaluate_model

    root = exported(tmp_path / "data")
    real, sim = load_tvr(root, tmp_path / "cache"), sim_tiny()
    cfg = tvr_config(root, tmp_path / "cache")
    model = build_model(cfg, real.video_dim, real.query_dim)
    device = torch.device("cpu")
    on_real = evaluate_model(model, real["test"], Batcher(real["test"], cfg.data), device, 32)
    on_sim = evaluate_model(model, sim["test"], Batcher(sim["test"], cfg.data), device, 32)
    assert on_real["oracle"] == on_sim["oracle"] and on_real["oracle"]["n"] == sim["test"].num_queries
    assert "dense SumR" in on_real["oracle"]


def test_data_relevance_names_the_test_file_and_a_file_covering_nothing_is_an_error(tmp_path):
    root = exported(tmp_path / "data")
    sim = sim_tiny()
    test = sim["test"]
    keep = list(range(0, test.num_queries, 2))  # half the test queries, in the prvr-ea format
    path = write_lines(tmp_path / "half.gt.jsonl", [
        {"query_id": test.query_ids[q], "caption": test.query_text[q],
         "gt_video_ids": [test.video_ids[v] for v in test.relevance[q].indices]} for q in keep])
    real = load_tvr(root, tmp_path / "cache", f"data.relevance={path}")
    assert real.meta["relevance"]["test"]["covered"] == len(keep)
    assert real.meta["relevance"]["test"]["file"] == "half.gt.jsonl"
    assert np.count_nonzero(np.diff(real["test"].relevance.indptr)) == len(keep)
    other = write_lines(tmp_path / "other.jsonl", [{"query_id": "nobody#enc#0", "relevant": ["x"]}])
    with pytest.raises(LayoutError, match="covers none of the 72 test queries .*file entries that match no query"):
        load_tvr(root, tmp_path / "cache", f"data.relevance={other}")


def test_a_prvr_ea_file_in_the_collection_folder_is_found_and_two_candidates_are_an_error(tmp_path):
    root = exported(tmp_path / "data")
    collection = msl_paths(root)["collection"]
    (collection / "TextData" / "tvrtest.relevance.jsonl").unlink()
    test = sim_tiny()["test"]
    write_lines(collection / "tvrdenseval_v.gt.jsonl", [
        {"query_id": test.query_ids[0], "caption": test.query_text[0], "gt_video_ids": [test.video_ids[test.query_video[0]]]}])
    real = load_tvr(root, tmp_path / "cache")
    assert real.meta["relevance"]["test"]["file"] == "tvrdenseval_v.gt.jsonl"
    assert real.meta["relevance"]["test"]["covered"] == 1
    write_lines(collection / "TextData" / "tvrdenseval.gt.jsonl", [{"query_id": "x", "gt_video_ids": ["x"]}])
    with pytest.raises(LayoutError, match="test split: several relevance files .*pick one with --set data.relevance"):
        load_tvr(root, tmp_path / "cache")


def test_data_relevance_on_a_simulated_world_is_a_config_error():
    with pytest.raises(UserError, match="'data.relevance' is 'x.jsonl', but sim-tiny is simulated"):
        resolve("baseline", "sim-tiny", 0, ["data.relevance=x.jsonl"])


# ----------------------------------------------------------------------------- the leaderboard
def test_the_leaderboard_shows_verified_relevance_rows_with_their_coverage(tmp_path):
    from prvr.harness.reports import leaderboard
    from prvr.harness.engine.records import record_path, write_record

    def record(seed, relevance):
        oracle = {"SumR": 200.0 + seed, "dense R@1": 10.0, "dense R@5": 20.0, "dense R@10": 30.0,
                  "dense R@100": 60.0, "dense SumR": 120.0 + seed, "multi_relevant_share": 10.0, "n": 8097,
                  "queries": 10895}
        test = {"R@1": 5.0, "R@5": 10.0, "R@10": 20.0, "R@100": 60.0, "SumR": 95.0, "buckets": {}, "oracle": oracle}
        data = {"relevance": {"test": {"file": "tvrdenseval_v.gt.jsonl", "covered": 8097, "queries": 10895,
                                       "note": "filter: type == v", "counts": {}}}} if relevance else {}
        return {"method": "baseline", "dataset": "tvr", "seed": seed, "backbone": "msl", "relations": "none",
                "run_name": "baseline" if relevance else "baseline~plain", "tag": "", "command": "prvr-bench run ...",
                "config": {"train": {"epochs": 100, "patience": 10}}, "provenance": {"data": data},
                "metrics": {"val": test, "test": test}}

    for seed in (0, 1):
        write_record(record_path(tmp_path, "tvr", "baseline", seed), record(seed, True))
    write_record(record_path(tmp_path, "tvr", "baseline~plain", 0), record(0, False))
    leaderboard.rebuild(tmp_path, show=False)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "## Verified relevance" in md and "see *Verified relevance*" in md
    assert ("| tvr | baseline | 2 | 200.5 ± 0.7 | 10.0 ± 0.0 | 20.0 ± 0.0 | 30.0 ± 0.0 | 60.0 ± 0.0 | 120.5 ± 0.7 | "
            "10.0 ± 0.0 | 8,097 of 10,895 test queries (`tvrdenseval_v.gt.jsonl`; filter: type == v) |") in md
    section = md.split("## Verified relevance")[1]
    assert "| tvr | baseline~plain |" not in section  # a row without a relevance file has no such figures


def test_data_check_lists_the_relevance_join_and_a_bad_file_as_an_error(tmp_path, capsys):
    from prvr.harness.cli import main

    root = exported(tmp_path / "data")
    args = ["data", "check", "--dataset", "tvr", "--data-root", str(root)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "test: relevance tvrtest.relevance.jsonl: 72 of 72 queries covered" in out
    assert "  queries joined by query id: 72" in out
    path = msl_paths(root)["collection"] / "TextData" / "tvrval.relevance.jsonl"
    path.write_text(path.read_text() + "{oops\n")
    assert main(args) == 2
    assert "tvrval.relevance.jsonl line 49: not valid JSON" in capsys.readouterr().out
