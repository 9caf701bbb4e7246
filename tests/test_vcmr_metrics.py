"""Moment retrieval metrics (harness/engine/vcmr.py): tIoU, ranks with ties, recall, span decoding and
the top-video cut, against hand-computed values and a brute-force reference that enumerates
every candidate moment."""

import math

import numpy as np
import pytest
import torch

from prvr.harness.engine import vcmr
from prvr.harness.base.scores import worst_if_nonfinite
from prvr.harness.engine.vcmr import MomentTruth, RankedMoments, moment_ranks, recall_at, temporal_iou


# ----------------------------------------------------------------------------- tIoU
@pytest.mark.parametrize("a, b, expected", [
    ((0.0, 2.0), (0.0, 2.0), 1.0),  # identical
    ((0.0, 1.0), (1.0, 2.0), 0.0),  # touching: no overlap
    ((0.0, 1.0), (3.0, 4.0), 0.0),  # disjoint
    ((2.0, 4.0), (0.0, 3.0), 0.25),  # overlap 1 over union 4
    ((1.0, 2.0), (0.0, 4.0), 0.25),  # contained
    ((1.0, 1.0), (1.0, 1.0), 0.0),  # identical zero-length spans: empty union counts 0 (as TVRetrieval)
    ((1.0, 1.0), (0.0, 2.0), 0.0),  # zero-length span inside another
    ((0.0, 3.0), (1.0, 2.5), 0.5),
])
def test_temporal_iou_hand_computed(a, b, expected):
    assert temporal_iou(*a, *b) == pytest.approx(expected)
    assert temporal_iou(*b, *a) == pytest.approx(expected)  # symmetric


def test_temporal_iou_of_an_unknown_span_is_nan_and_never_a_hit():
    assert math.isnan(float(temporal_iou(0.0, 1.0, np.nan, np.nan)))
    pred = RankedMoments([[0]], [[0.0]], [[1.0]], [[1.0]])
    truth = MomentTruth.from_pairs(np.array([0]), np.array([0]), np.array([[np.nan, np.nan]]), 1)
    assert not vcmr.moment_hits(pred, truth, 0.5).any()


# ----------------------------------------------------------------------------- ranks, hits, recall
def one_query(videos, spans, scores, beyond=None):
    spans = np.asarray(spans, dtype=np.float64)
    return RankedMoments([videos], [spans[:, 0]], [spans[:, 1]], [scores], None if beyond is None else [beyond])


def test_ties_count_against_the_model():
    # predictions: wrong video (3.0), a hit tied with a miss (2.0, 2.0), another miss (1.0)
    pred = one_query([5, 0, 0, 0], [[0, 2], [0, 2], [6, 8], [3, 4]], [3.0, 2.0, 2.0, 1.0])
    assert moment_ranks(pred).tolist() == [[1, 3, 3, 4]]
    truth = MomentTruth.labelled(np.array([0]), np.array([[0.0, 2.0]]))
    assert recall_at(pred, truth, (1, 2, 3), 0.5) == {1: 0.0, 2: 0.0, 3: 100.0}


def test_a_moment_tied_with_the_best_one_not_kept_ranks_past_every_kept_one():
    pred = one_query([1, 0], [[0, 1], [0, 2]], [2.0, 1.0], beyond=1.0)  # the hit ties with a moment not kept
    assert moment_ranks(pred).tolist() == [[1, 3]]
    truth = MomentTruth.labelled(np.array([0]), np.array([[0.0, 2.0]]))
    assert recall_at(pred, truth, (1, 2), 0.5) == {1: 0.0, 2: 0.0}
    below = one_query([1, 0], [[0, 1], [0, 2]], [2.0, 1.0], beyond=0.5)
    assert recall_at(below, truth, (1, 2), 0.5) == {1: 0.0, 2: 100.0}


def test_kept_scores_below_the_best_one_not_kept_are_refused():
    with pytest.raises(ValueError, match="below"):
        one_query([0, 0], [[0, 1], [1, 2]], [2.0, 1.0], beyond=1.5)


def test_hits_need_the_true_video_and_the_threshold():
    truth = MomentTruth.labelled(np.array([2]), np.array([[10.0, 20.0]]))
    pred = one_query([2, 3, 2, -1], [[10, 20], [10, 20], [12, 20], [0, 0]], [4.0, 3.0, 2.0, -np.inf])
    # tIoU of [12, 20) with [10, 20): 0.8; the empty slot (video -1) is never a hit
    assert vcmr.moment_hits(pred, truth, 0.5).tolist() == [[True, False, True, False]]
    assert vcmr.moment_hits(pred, truth, 0.9).tolist() == [[True, False, False, False]]
    assert moment_ranks(pred)[0, 3] == 5  # empty slot: N + 1


def test_recall_over_queries_with_a_known_moment_and_any_true_moment_counts():
    # query 0: two true moments (videos 1 and 4), hit on the second at rank 2
    # query 1: one true moment, missed; query 2: moment unknown, left out of the denominator
    truth = MomentTruth.from_pairs(np.array([0, 0, 1]), np.array([1, 4, 0]), np.array([[0, 4], [2, 6], [0, 2]]), 3)
    assert truth.known().tolist() == [True, True, False]
    pred = RankedMoments([[7, 4], [0, 0], [3, 3]], [[0, 2], [5, 6], [0, 1]], [[4, 6], [7, 8], [1, 2]],
                         [[2.0, 1.0], [2.0, 1.0], [2.0, 1.0]])
    assert recall_at(pred, truth, (1, 2), 0.7) == {1: 0.0, 2: 50.0}
    m = vcmr.moment_metrics(pred, truth, "VCMR", (1, 2), (0.5, 0.7))
    assert list(m) == ["VCMR-0.5 R@1", "VCMR-0.5 R@2", "VCMR-0.7 R@1", "VCMR-0.7 R@2"]


def test_labelled_truth_leaves_out_unknown_moments():
    truth = MomentTruth.labelled(np.array([3, 1]), np.array([[np.nan, np.nan], [1.0, 2.0]]))
    assert truth.known().tolist() == [False, True]
    assert truth.video.tolist() == [1] and truth.offsets.tolist() == [0, 0, 1]


# ----------------------------------------------------------------------------- span decoding
def test_span_scores_are_start_times_end_probabilities_under_the_constraint():
    start = torch.tensor([[0.0, 1.0, 2.0, 0.5, 9.0]], dtype=torch.float64)  # row 4 is padding
    end = torch.tensor([[1.0, 0.0, 0.0, 2.0, 9.0]], dtype=torch.float64)
    band = vcmr.span_log_scores(start, end, torch.tensor([4]), 1, 2).exp()  # [1, T=5, W=2]
    p_st, p_ed = torch.softmax(start[0, :4], 0), torch.softmax(end[0, :4], 0)
    for i in range(5):
        for w in range(2):
            j = i + 1 + w
            expected = float(p_st[i] * p_ed[j]) if j < 4 and i < 4 else 0.0  # Eq. 2 inside the video only
            assert float(band[0, i, w]) == pytest.approx(expected, abs=1e-12)
    # hand-computed: P_st(1) P_ed(3) = e / (1 + e + e^2 + e^0.5) * e^2 / (e + 1 + 1 + e^2)
    e = math.e
    assert float(band[0, 1, 1]) == pytest.approx(e / (1 + e + e**2 + e**0.5) * e**2 / (e + 2 + e**2))


def test_a_span_longer_than_n_max_is_never_proposed():
    # logits peak at rows 0 and 7: the span 0..7 (j - i = 7) is beyond n_max = 4
    t = 8
    start = torch.full((1, 1, t), -5.0).index_fill(2, torch.tensor([0]), 5.0)
    end = torch.full((1, 1, t), -5.0).index_fill(2, torch.tensor([7]), 5.0)
    band = vcmr.span_log_scores(start, end, torch.tensor([[t]]), 1, 4)
    pred = vcmr.decode(*vcmr.top_moments(band, 30), torch.tensor([[0]]), np.array([1.0]), 1)
    length = pred.end - pred.start  # seconds = rows here
    kept = pred.video >= 0
    assert kept.sum() == 7 + 6 + 5 + 4  # every span of 8 rows with 1 <= j - i <= 4, and no other
    assert np.all((length[kept] - 1 >= 1) & (length[kept] - 1 <= 4))
    assert not np.any((pred.start == 0) & (pred.end == 8))


def test_no_span_fits_a_video_shorter_than_n_min():
    band = vcmr.span_log_scores(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([3, 3]), 3, 5)
    assert band.shape == (2, 3, 0)
    slot, row, width, score, beyond = vcmr.top_moments(band[:, None], 4)
    assert torch.isinf(score).all() and torch.isinf(beyond).all()


# ----------------------------------------------------------------------------- the top-video cut
def test_a_video_tied_at_the_cut_is_left_out_and_a_constant_model_localizes_nothing():
    scores = torch.tensor([[0.9, 0.5, 0.5, 0.1], [0.3, 0.3, 0.3, 0.3], [float("nan"), 0.2, 0.1, float("inf")]])
    index, keep = vcmr.select_videos(scores, 2)
    assert (index[0][keep[0]]).tolist() == [0]  # videos 1 and 2 tie at rank 3: both out
    assert not keep[1].any()  # constant scores: every video ranks last
    assert sorted(index[2][keep[2]].tolist()) == [1, 2]  # NaN / inf are the worst score
    index, keep = vcmr.select_videos(scores[:1], 10)  # fewer videos than the cut: all of them
    assert keep.all() and sorted(index[0].tolist()) == [0, 1, 2, 3]


class ArrayModel:
    """A localizing backbone made of arrays: s_vr [Q, V] and start / end logits [Q, V, T]."""

    provides = frozenset({"span_logits"})

    def __init__(self, vr, start, end):
        self.vr, self.start, self.end = (torch.as_tensor(np.asarray(x)) for x in (vr, start, end))

    def score(self, queries, videos):
        from prvr.methods.backbones.api import Scores

        return Scores(fused=self.vr[queries["index"]])

    def span_logits(self, queries, videos, pairs):
        q = queries["index"][:, None]
        return self.start[q, pairs], self.end[q, pairs]


def run_localize(model, labelled, n_rows, row_seconds, **setting):
    defaults = dict(n_min=0, n_max=10, alpha=20.0, top_videos=100, top_moments=100, tious=(0.5,))
    s = vcmr.MomentSettings(**{**defaults, **setting})
    q = len(labelled)
    return vcmr.localize(model, {"index": torch.arange(q)}, {}, torch.as_tensor(labelled), torch.as_tensor(n_rows),
                         np.asarray(row_seconds, dtype=np.float64), s)


def test_a_labelled_video_outside_the_top_videos_is_never_hit():
    # 4 videos of 6 rows, 2 s a row; the labelled video 3 has perfect logits but the third best s_vr
    t = 6
    start, end = np.full((1, 4, t), -9.0), np.full((1, 4, t), -9.0)
    start[0, 3, 1], end[0, 3, 3] = 9.0, 9.0  # rows 1..3 = [2, 8) s, the labelled moment
    vr = np.array([[0.9, 0.8, 0.1, 0.7]])
    truth = MomentTruth.labelled(np.array([3]), np.array([[2.0, 8.0]]))
    rows, secs = np.full(4, t), np.full(4, 2.0)
    for top, expected in ((2, 0.0), (3, 100.0)):
        vcmr_pred, svmr_pred = run_localize(ArrayModel(vr, start, end), [3], rows, secs, top_videos=top)
        assert recall_at(vcmr_pred, truth, (100,), 0.7) == {100: expected}
        assert recall_at(svmr_pred, truth, (1,), 0.7) == {1: 100.0}  # SVMR localizes the labelled video itself
    vcmr_pred, _ = run_localize(ArrayModel(vr, start, end), [3], rows, secs, top_videos=2)
    assert set(vcmr_pred.video[0][vcmr_pred.video[0] >= 0].tolist()) == {0, 1}


# ----------------------------------------------------------------------------- brute-force reference
def reference_candidates(start, end, vr, n_rows, row_seconds, n_min, n_max, alpha, top_videos):
    """Every candidate moment of every query, (score, video, start s, end s), by enumeration:
    the videos whose rank (ties against the model) is within the cut, every span of rows
    i <= j with n_min <= j - i <= n_max inside the video."""
    out = []
    for q in range(vr.shape[0]):
        s = worst_if_nonfinite(torch.as_tensor(vr[q])).numpy()
        cands = []
        for v in range(vr.shape[1]):
            if not np.isfinite(s[v]) or (s >= s[v]).sum() > top_videos:
                continue
            t = start.shape[2]
            pad = torch.arange(t) >= int(n_rows[v])
            lst = torch.log_softmax(torch.as_tensor(start[q, v]).masked_fill(pad, -math.inf), 0).numpy()
            led = torch.log_softmax(torch.as_tensor(end[q, v]).masked_fill(pad, -math.inf), 0).numpy()
            for i in range(int(n_rows[v])):
                for j in range(i, int(n_rows[v])):
                    if n_min <= j - i <= n_max:
                        score = (lst[i] + alpha * s[v]) + led[j]  # the pass's order of sums: ties alike
                        if np.isfinite(score):
                            cands.append((score, v, i * row_seconds[v], (j + 1) * row_seconds[v]))
        out.append(cands)
    return out


def reference_best(cands, truth_video, truth_span, tiou):
    """Per query, the rank of its best hit among every candidate (inf where none hits)."""
    hits = []
    for cs, tv, (ts, te) in zip(cands, truth_video, truth_span):
        scores = np.array([c[0] for c in cs])
        best = math.inf
        for sc, v, st, ed in cs:
            if v == tv and temporal_iou(st, ed, ts, te) >= tiou:
                best = min(best, int((scores >= sc).sum()))
        hits.append(best)
    return np.array(hits)


def reference_recall(cands, truth_video, truth_span, ks, tiou):
    hits = reference_best(cands, truth_video, truth_span, tiou)
    return {k: 100.0 * float(np.mean(hits <= k)) for k in ks}


@pytest.mark.parametrize("seed", range(6))
def test_vcmr_and_svmr_equal_the_brute_force_reference_with_ties_and_cuts(seed):
    rng = np.random.default_rng(seed)
    q, v, t = 7, 6, 7
    n_rows = rng.integers(0, t + 1, v)  # a video may have no rows
    row_seconds = rng.choice([1.0, 1.5, 2.0], v)
    start = rng.integers(-1, 2, (q, v, t)).astype(np.float64)  # few values: many tied spans
    end = rng.integers(-1, 2, (q, v, t)).astype(np.float64)
    vr = np.round(rng.uniform(-1, 1, (q, v)), 1)  # tied videos at the cut
    vr[rng.random((q, v)) < 0.1] = np.nan
    labelled = rng.integers(0, v, q)
    first = np.array([rng.integers(0, max(int(n_rows[u]), 1)) for u in labelled])
    last = np.array([rng.integers(f, max(int(n_rows[u]), f + 1)) for f, u in zip(first, labelled)])
    spans = np.stack([first * row_seconds[labelled], (last + 1) * row_seconds[labelled]], 1)
    truth = MomentTruth.labelled(labelled, spans)
    setting = dict(n_min=int(rng.integers(0, 2)), n_max=int(rng.integers(2, 5)), alpha=float(rng.choice([0.0, 2.0])),
                   top_videos=3, top_moments=5)
    pred, svmr_pred = run_localize(ArrayModel(vr, start, end), labelled, n_rows, row_seconds, **setting)
    args = (setting["n_min"], setting["n_max"], setting["alpha"])
    cands = reference_candidates(start, end, vr, n_rows, row_seconds, *args, setting["top_videos"])
    for tiou in (0.3, 0.5, 0.7):
        assert recall_at(pred, truth, (1, 2, 5), tiou) == reference_recall(cands, labelled, spans, (1, 2, 5), tiou)
    # the per-query ranks a run stores (`best_hit_ranks`): the reference's where it ranks within the kept
    # moments, past every kept rank where it does not (a hit tied at the cut: N + 1; none kept: NO_HIT)
    best = vcmr.best_hit_ranks(pred, truth, (0.3, 0.5, 0.7))
    for j, tiou in enumerate((0.3, 0.5, 0.7)):
        ref = reference_best(cands, labelled, spans, tiou)
        kept = ref <= setting["top_moments"]
        np.testing.assert_array_equal(best[kept, j], ref[kept])
        assert (best[~kept, j] > setting["top_moments"]).all()
    # SVMR against the reference on each query's labelled video alone (s_vr left out: constant in a video)
    for i in range(q):
        u = labelled[i]
        one = reference_candidates(start[i : i + 1, u : u + 1], end[i : i + 1, u : u + 1], np.zeros((1, 1)),
                                   n_rows[u : u + 1], row_seconds[u : u + 1], *args, 1)
        one = [[(sc, u, st, ed) for sc, _, st, ed in one[0]]]
        mine = RankedMoments(svmr_pred.video[i : i + 1], svmr_pred.start[i : i + 1], svmr_pred.end[i : i + 1],
                             svmr_pred.score[i : i + 1], svmr_pred.beyond[i : i + 1])
        for tiou in (0.5, 0.7):
            assert recall_at(mine, MomentTruth.labelled(labelled[i : i + 1], spans[i : i + 1]), (1, 5), tiou) \
                == reference_recall(one, labelled[i : i + 1], spans[i : i + 1], (1, 5), tiou)
