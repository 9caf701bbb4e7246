"""The moment retrieval pass of the evaluator (harness/engine/vcmr.py through harness/engine/evaluate.py
evaluate_model) with tiny fake localizing backbones, the simulated world's relevant moments,
and the vcmr_* settings of the `eval` section."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.datasets.loader import Batcher
from prvr.datasets.sim import world
from prvr.datasets.types import Ragged, Split
from prvr.harness.engine import vcmr
from prvr.harness.engine.config import resolve
from prvr.harness.engine.sections import DataConfig, EvalConfig
from prvr.harness.engine.evaluate import evaluate_model
from prvr.harness.base.io import UserError
from prvr.methods.backbones.api import Scores

CPU = torch.device("cpu")


class FakeLocalizer(torch.nn.Module):
    """A backbone that localizes: s_vr from a [Q, V] table; start / end logits that peak (10
    against 0) at given rows of each (query, video), -inf on padding rows."""

    provides = frozenset({"span_logits"})

    def __init__(self, vr: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        super().__init__()
        self.vr = torch.as_tensor(vr, dtype=torch.float32)
        self.first, self.last = torch.as_tensor(first), torch.as_tensor(last)  # [Q, V] rows

    def encode_queries(self, batch):
        return {"index": batch.query_index}

    def encode_videos(self, batch):
        return {"index": batch.video_index, "mask": batch.frame_mask}

    def index_videos(self, videos):  # the backbone contract's query-independent step: nothing to do here
        return videos

    def score(self, queries, videos):
        return Scores(fused=self.vr[queries["index"]][:, videos["index"]])

    def span_logits(self, queries, videos, pairs):
        q = queries["index"][:, None]
        video = videos["index"][pairs]
        mask = videos["mask"][pairs]  # [q, K, T]
        rows = torch.arange(mask.shape[-1])
        start = torch.where(rows == self.first[q, video][..., None], 10.0, 0.0).masked_fill(~mask, float("-inf"))
        end = torch.where(rows == self.last[q, video][..., None], 10.0, 0.0).masked_fill(~mask, float("-inf"))
        return start, end


class NoSpans(FakeLocalizer):
    provides = frozenset()


def tiny_split() -> tuple[Split, np.ndarray, np.ndarray]:
    """4 videos (10, 12, 8, 20 rows of 2 s; the last pooled to 16 rows of 2.5 s by max_frames 16),
    6 queries whose moments lie on row boundaries: (split, first row, last row) per query."""
    rng = np.random.default_rng(0)
    lengths = [10, 12, 8, 20]
    frames = Ragged.from_list([rng.standard_normal((n, 6)) for n in lengths])
    durations = np.array(lengths) * 2.0
    query_video = np.array([0, 0, 1, 2, 3, 3])
    first, last = np.array([0, 5, 2, 4, 3, 10]), np.array([2, 8, 6, 6, 6, 14])  # rows j - i in 2..4
    seconds = np.array([2.0, 2.0, 2.0, 2.0, 2.5, 2.5])  # per row of the labelled video, after pooling
    moments = np.stack([first * seconds, (last + 1) * seconds], 1)
    tokens = Ragged.from_list([rng.standard_normal((4, 5)) for _ in query_video])
    split = Split([f"v{i}" for i in range(4)], frames, durations, [f"q{i}" for i in range(6)],
                  [f"query {i}" for i in range(6)], tokens, query_video, moments)
    return split, first, last


def data_cfg(**kw) -> DataConfig:
    return dataclasses.replace(DataConfig(), **{"max_frames": 16, "num_clips": 4, **kw})


def tables(split, first, last, vr_of_labelled=1.0):
    """[Q, V] s_vr (the labelled video `vr_of_labelled`, others 0) and rows (every video: the query's)."""
    q, v = split.num_queries, split.num_videos
    vr = np.zeros((q, v))
    vr[np.arange(q), split.query_video] = vr_of_labelled
    return vr, np.repeat(first[:, None], v, 1), np.repeat(last[:, None], v, 1)


def test_logits_that_peak_at_the_labelled_rows_score_100_and_elsewhere_0():
    split, first, last = tiny_split()
    batcher = Batcher(split, data_cfg())
    vr, f, l = tables(split, first, last)
    m = evaluate_model(FakeLocalizer(vr, f, l), split, batcher, CPU, chunk=4)
    for t in ("0.5", "0.7"):
        assert [m[f"VCMR-{t} R@{k}"] for k in (1, 10, 100)] == [100.0] * 3
        assert [m[f"SVMR-{t} R@{k}"] for k in (1, 5)] == [100.0] * 2
    assert m["VCMR SumR"] == 600.0 and m["VCMR n"] == 6
    assert m["R@1"] == 100.0  # the VR figures are the evaluator's own, unchanged
    assert m["oracle"] == {}  # no ground truth beyond the labels
    # peaks on rows outside each moment (disjoint or touching): the best moment is in the labelled
    # video, in the wrong place
    _, bad_first, bad_last = tables(split, np.array([5, 0, 7, 0, 10, 0]), np.array([7, 2, 9, 2, 14, 3]))
    m = evaluate_model(FakeLocalizer(vr, bad_first, bad_last), split, batcher, CPU, chunk=4)
    assert m["VCMR-0.5 R@1"] == 0.0 and m["VCMR-0.7 R@1"] == 0.0
    assert m["SVMR-0.5 R@1"] == 0.0 and m["SVMR-0.7 R@1"] == 0.0
    assert m["R@1"] == 100.0


def test_a_backbone_that_does_not_localize_gets_the_video_metrics_only():
    split, first, last = tiny_split()
    batcher = Batcher(split, data_cfg())
    m = evaluate_model(NoSpans(*tables(split, first, last)), split, batcher, CPU, chunk=4)
    assert not [k for k in m if "VCMR" in k or "SVMR" in k]
    assert set(m) == {"R@1", "R@5", "R@10", "R@100", "SumR", "median_rank", "mean_rank", "n", "buckets", "oracle"}


def test_a_constant_model_localizes_nothing_but_svmr_still_localizes_the_labelled_video():
    split, first, last = tiny_split()
    vr, f, l = tables(split, first, last, vr_of_labelled=0.0)  # every video ties: each ranks 4th
    batcher = Batcher(split, data_cfg())
    m = evaluate_model(FakeLocalizer(vr, f, l), split, batcher, CPU, chunk=4, eval_cfg=EvalConfig(vcmr_top_videos=3))
    assert m["VCMR-0.5 R@100"] == 0.0 and m["VCMR SumR"] == 0.0
    assert m["SVMR-0.7 R@1"] == 100.0
    # every video inside the cut: the spans decide
    m = evaluate_model(FakeLocalizer(vr, f, l), split, batcher, CPU, chunk=4, eval_cfg=EvalConfig(vcmr_top_videos=4))
    assert m["VCMR-0.7 R@10"] == 100.0


def test_chunks_of_queries_do_not_change_the_figures(monkeypatch):
    split, first, last = tiny_split()
    rng = np.random.default_rng(1)
    vr = np.round(rng.uniform(0, 1, (split.num_queries, split.num_videos)), 1)
    f = rng.integers(0, 8, vr.shape)
    model, batcher = FakeLocalizer(vr, f, f + rng.integers(2, 5, vr.shape)), Batcher(split, data_cfg())

    def moments():
        m = evaluate_model(model, split, batcher, CPU, chunk=1024)
        return {k: v for k, v in m.items() if "MR" in k}

    whole = moments()
    assert len(whole) == 6 + 2 + 4 and 0 < whole["VCMR SumR"] < 600
    monkeypatch.setattr(vcmr, "ELEMENT_BUDGET", 1)  # one query at a time
    assert moments() == whole


def test_the_eval_settings_reach_the_pass():
    split, first, last = tiny_split()
    batcher = Batcher(split, data_cfg())
    model = FakeLocalizer(*tables(split, first, last))
    # spans of at most 2 rows: against moments of 3 rows or more no tIoU reaches 0.7
    m = evaluate_model(model, split, batcher, CPU, chunk=4, eval_cfg=EvalConfig(vcmr_n_min=0, vcmr_n_max=1))
    assert m["VCMR-0.7 R@100"] == 0.0 and m["SVMR-0.7 R@5"] == 0.0
    m = evaluate_model(model, split, batcher, CPU, chunk=4, eval_cfg=EvalConfig(vcmr_tious=[0.3]))
    assert m["VCMR-0.3 R@1"] == 100.0 and "VCMR-0.5 R@1" not in m


def test_vcmr_settings_are_checked_in_one_line():
    cfg = resolve("baseline", "sim-tiny", 0)
    assert (cfg.eval.vcmr_alpha, cfg.eval.vcmr_top_videos, cfg.eval.vcmr_top_moments) == (20.0, 100, 100)
    assert cfg.eval.vcmr_tious == [0.5, 0.7]
    with pytest.raises(UserError, match=r"config key 'eval.vcmr_n_max' must be >= eval.vcmr_n_min \(5\), got 3"):
        resolve("baseline", "sim-tiny", 0, ["eval.vcmr_n_min=5", "eval.vcmr_n_max=3"])
    with pytest.raises(UserError, match=r"config key 'eval.vcmr_tious' must be a list"):
        resolve("baseline", "sim-tiny", 0, ["eval.vcmr_tious=[0]"])
    with pytest.raises(UserError, match=r"config key 'eval.vcmr_top_moments' must be an integer >= 100"):
        resolve("baseline", "sim-tiny", 0, ["eval.vcmr_top_moments=10"])


# ----------------------------------------------------------------------------- simulated ground truth
@pytest.fixture(scope="module")
def sim_split():
    sim = resolve("baseline", "sim-tiny", 0).sim
    rng = np.random.default_rng([sim.seed, 0])
    concepts = world.make_concepts(sim, rng)
    return world.generate_split(sim, concepts, "test", 24, "sim-tiny")


def test_relevant_moments_are_the_relevance_pairs_and_hold_the_labelled_moment(sim_split):
    s = sim_split
    query, video, spans = world.relevant_moments(s)
    assert np.all(np.diff(query) >= 0)
    pairs = sp.csr_matrix((np.ones(len(query), dtype=bool), (query, video)), shape=s.relevance.shape)
    assert (pairs != s.relevance.astype(bool)).nnz == 0
    for q in range(s.num_queries):
        mine = (query == q) & (video == s.query_video[q])
        assert np.any(np.all(np.isclose(spans[mine], s.moments[q]), 1))
    assert np.all(spans[:, 1] > spans[:, 0]) and np.all(spans[:, 1] <= s.durations[video] + 1e-9)
    plain = dataclasses.replace(s, extra={})
    assert world.relevant_moments(plain) is None


def test_oracle_vcmr_counts_any_truly_relevant_moment(sim_split):
    s = sim_split
    query, video, spans = world.relevant_moments(s)
    # the fake model prefers, per query, another truly relevant video where there is one and peaks at
    # that video's relevant moment, else the labelled moment (rows of 1.5 s: no pooling with max_frames 128)
    target = s.query_video.copy()
    first = np.zeros((s.num_queries, s.num_videos), dtype=np.int64)
    last = np.zeros_like(first)
    for q in range(s.num_queries):
        mine = np.nonzero(query == q)[0]
        other = [i for i in mine if video[i] != s.query_video[q]]
        target[q], span = (video[other[0]], spans[other[0]]) if other else (s.query_video[q], s.moments[q])
        first[q, :] = round(span[0] / 1.5)
        last[q, :] = round(span[1] / 1.5) - 1
    vr = np.zeros((s.num_queries, s.num_videos))
    vr[np.arange(s.num_queries), target] = 1.0
    setting = EvalConfig(vcmr_n_min=0, vcmr_n_max=127)
    m = evaluate_model(FakeLocalizer(vr, first, last), s, Batcher(s, data_cfg(max_frames=128)), CPU, chunk=64,
                       eval_cfg=setting)
    single = float(100.0 * np.mean(target == s.query_video))
    assert 0.0 < single < 100.0  # the world has queries of both kinds
    assert m["oracle"]["VCMR-0.7 R@1"] == 100.0 and m["oracle"]["VCMR-0.5 R@100"] == 100.0
    assert m["VCMR-0.7 R@1"] == pytest.approx(single)
    assert m["oracle"]["R@1"] == 100.0  # the evaluator's own oracle VR figures stay beside them


def test_a_record_keeps_the_moment_metrics_beside_the_retrieval_ones():
    from prvr.harness.engine.runner import _keep

    metrics = {"R@1": 1.0, "SumR": 4.0, "VCMR-0.5 R@1": 2.0, "VCMR SumR": 3.0, "SVMR-0.7 R@5": 5.0,
               "oracle": {"R@1": 1.0}, "scratch": 9.0}
    assert _keep(metrics) == {"R@1": 1.0, "SumR": 4.0, "oracle": {"R@1": 1.0}, "VCMR-0.5 R@1": 2.0,
                              "VCMR SumR": 3.0, "SVMR-0.7 R@5": 5.0}
