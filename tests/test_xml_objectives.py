"""The SBERT-PR losses (methods/objectives/xml.py, paper Eq. 10-17) against hand-computed values on
tiny tensors, the hard-negative sampler, and the ranking terms against a loop over the pairs."""

import math

import pytest
import torch

from prvr.methods.objectives.xml import (LOGIT_FLOOR, SampledNegatives, pos_at_least_rel, pos_over_neg,
                                         rel_over_neg, sample_hard_negatives, segment_rows, span_nll,
                                         vcmr_relevance)

# 2 queries x 4 videos: q0 -> v0, q1 -> v1 labelled; (q0, v2) potentially relevant, C = 0.5.
S = torch.tensor([[0.9, 0.5, 0.8, 0.1],
                  [0.2, 0.7, 0.6, 0.4]])
POS = torch.tensor([[True, False, False, False], [False, True, False, False]])
AMB = torch.tensor([[False, False, True, False], [False, False, False, False]])
NEG = ~(POS | AMB)
CONF = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0]])
# the hardest negative of each query (row) and video (column): q0 -> v1 (v0 positive, v2 relevant),
# q1 -> v2; v0 <- q1, v1 <- q0, v2 <- q1 (q0 relevant), v3 <- q1
HARDEST = SampledNegatives(torch.tensor([0.5, 0.6]), torch.tensor([True, True]),
                           torch.tensor([0.2, 0.5, 0.6, 0.4]), torch.tensor([True, True, True, True]))


def _same(a: SampledNegatives, b: SampledNegatives) -> None:
    for name in ("query", "query_ok", "video", "video_ok"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


# ----------------------------------------------------------------------------- the sampler
def _values(t: torch.Tensor) -> list[float]:
    return sorted(set(t.tolist()))


def test_pool_of_one_is_the_hardest_negative_never_a_positive_or_relevant_pair():
    _same(sample_hard_negatives(S, NEG, 1, torch.Generator().manual_seed(0)), HARDEST)


def test_the_pool_is_the_top_n_negatives_of_a_row_drawn_uniformly():
    g = torch.Generator().manual_seed(0)
    drawn = [sample_hard_negatives(S, NEG, 2, g) for _ in range(400)]
    q1 = torch.stack([d.query[1] for d in drawn])  # q1's negatives 0.6, 0.4, 0.2: the top 2
    assert _values(q1) == pytest.approx([0.4, 0.6]) and 0.3 < (q1 == S[1, 2]).float().mean() < 0.7
    assert _values(torch.stack([d.query[0] for d in drawn])) == pytest.approx([0.1, 0.5])  # q0 has two negatives
    assert _values(torch.stack([d.video[2] for d in drawn])) == pytest.approx([0.6])  # v2's one: q0 is relevant
    every = torch.stack([sample_hard_negatives(S, NEG, None, g).query[1] for _ in range(400)])
    assert _values(every) == pytest.approx([0.2, 0.4, 0.6])  # no pool: any negative


def test_the_generator_fixes_the_draw_and_the_drawn_scores_keep_their_gradient():
    s = torch.rand(6, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
    neg = torch.rand(6, 5, generator=torch.Generator().manual_seed(2)) > 0.3
    a = sample_hard_negatives(s, neg, 3, torch.Generator().manual_seed(7))
    _same(a, sample_hard_negatives(s, neg, 3, torch.Generator().manual_seed(7)))
    a.query.sum().backward()
    assert s.grad.sum().item() == pytest.approx(float(a.query_ok.sum()))


def test_a_row_without_negatives_is_not_valid():
    neg = NEG.clone()
    neg[1] = False
    out = sample_hard_negatives(S, neg, 1, torch.Generator().manual_seed(0))
    assert out.query_ok.tolist() == [True, False]


# ----------------------------------------------------------------------------- Eq. 10-12
def test_pos_over_neg_hand_computed():
    # margin 0.3: q0 [0.3 + 0.5 - 0.9]+ = 0, q1 [0.3 + 0.6 - 0.7]+ = 0.2;
    # v0 [0.3 + 0.2 - 0.9]+ = 0, v1 [0.3 + 0.5 - 0.7]+ = 0.1; over N = 2 positive pairs
    assert pos_over_neg(S, POS, HARDEST, 0.3).item() == pytest.approx(0.15)
    assert pos_over_neg(S, POS, HARDEST, 0.05).item() == 0.0  # every positive beats its negatives by more


def test_rel_over_neg_hand_computed_with_confidence():
    # (q0, v2): C R = 0.5 * 0.8 = 0.4; [0.3 + 0.5 - 0.4]+ = 0.4 (q0's negative), [0.3 + 0.6 - 0.4]+ = 0.5 (v2's)
    assert rel_over_neg(S, AMB, CONF, HARDEST, 0.3).item() == pytest.approx(0.9)
    # C = 1: [0.3 + 0.5 - 0.8]+ = 0, [0.3 + 0.6 - 0.8]+ = 0.1
    assert rel_over_neg(S, AMB, torch.ones_like(CONF), HARDEST, 0.3).item() == pytest.approx(0.1)


def test_pos_at_least_rel_hand_computed():
    # (q0, v2): [0.8 - 0.5 * R(q0, v0) = 0.45]+ = 0.35; v2 has no positive query: its side adds nothing
    assert pos_at_least_rel(S, POS, AMB, CONF).item() == pytest.approx(0.35)
    assert pos_at_least_rel(S, POS, AMB, torch.ones_like(CONF)).item() == pytest.approx(0.0)  # 0.8 < 0.9
    # a video with two positive queries is held to their mean: (q1, v0) relevant, v0 <- q0 and q2
    s = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.5, 0.2]])
    pos = torch.tensor([[True, False], [False, True], [True, False]])
    amb = torch.tensor([[False, False], [True, False], [False, False]])
    conf = torch.tensor([[1.0, 0.0], [0.8, 1.0], [1.0, 0.0]])
    # t2v [0.7 - 0.8 * 0.3]+ = 0.46; v2t [0.7 - 0.8 * (0.9 + 0.5) / 2]+ = 0.14
    assert pos_at_least_rel(s, pos, amb, conf).item() == pytest.approx(0.6)


def test_with_c_below_one_the_pr_terms_fall_as_every_score_moves_down_together():
    """Eq. 11-12 scale a score by C, a discount only for a score >= 0. Moving every score down
    by the same M (a log-scale R_vcmr can fall without bound) leaves L_pos>neg as it is, but
    lowers [margin + R_neg - C R_rel]_+ and [R_rel - C R_pos]_+ by (1 - C) M each until they
    reach zero: with C < 1 the PR terms reward a model that ranks nothing (the collapse of
    +SL+PR measured in docs/methods/sbert-pr.md). With C = 1 they are shift-invariant."""
    half, one = CONF, torch.ones_like(CONF)
    for shift in (1.0, 3.0):
        down = SampledNegatives(HARDEST.query - shift, HARDEST.query_ok, HARDEST.video - shift, HARDEST.video_ok)
        assert pos_over_neg(S - shift, POS, down, 0.3).item() == pytest.approx(
            pos_over_neg(S, POS, HARDEST, 0.3).item(), abs=1e-6)
        assert rel_over_neg(S - shift, AMB, one, down, 0.3).item() == pytest.approx(
            rel_over_neg(S, AMB, one, HARDEST, 0.3).item(), abs=1e-6)
        # C = 0.5 on (q0, v2): each of rel>neg's two hinges drops by 0.5 * shift (0.4, 0.5 at shift 0)
        assert rel_over_neg(S - shift, AMB, half, down, 0.3).item() == pytest.approx(
            max(0.4 - 0.5 * shift, 0) + max(0.5 - 0.5 * shift, 0), abs=1e-6)
    # pos>=rel, C = 1 at a level where it is active: unchanged by any shift
    s = torch.tensor([[0.5, 0.1, 0.8, 0.0], [0.2, 0.7, 0.6, 0.4]])
    for shift in (1.0, 3.0):
        assert pos_at_least_rel(s - shift, POS, AMB, one).item() == pytest.approx(
            pos_at_least_rel(s, POS, AMB, one).item(), abs=1e-6)
        # C = 0.5: [0.8 - s - 0.5 (0.5 - s)]+ = [0.55 - 0.5 s]+
        assert pos_at_least_rel(s - shift, POS, AMB, half).item() == pytest.approx(
            max(0.55 - 0.5 * shift, 0), abs=1e-6)


def test_confidence_on_the_hinge_hand_computed_and_shift_invariant():
    """loss.confidence_on=hinge: C [margin + R(neg) - R(rel)]_+ and C [R(rel) - R(pos)]_+, which
    no common shift of the scores changes; with C = 1 the two forms are one."""
    # rel>neg, (q0, v2), C = 0.5: 0.5 [0.3 + 0.5 - 0.8]+ + 0.5 [0.3 + 0.6 - 0.8]+ = 0 + 0.05
    assert rel_over_neg(S, AMB, CONF, HARDEST, 0.3, "hinge").item() == pytest.approx(0.05)
    # pos>=rel: 0.5 [0.8 - 0.9]+ = 0; with R(q0, v0) = 0.5: 0.5 [0.8 - 0.5]+ = 0.15
    s = torch.tensor([[0.5, 0.1, 0.8, 0.0], [0.2, 0.7, 0.6, 0.4]])
    assert pos_at_least_rel(S, POS, AMB, CONF, "hinge").item() == 0.0
    assert pos_at_least_rel(s, POS, AMB, CONF, "hinge").item() == pytest.approx(0.15)
    one = torch.ones_like(CONF)
    assert rel_over_neg(S, AMB, one, HARDEST, 0.3, "hinge").item() == rel_over_neg(S, AMB, one, HARDEST, 0.3).item()
    assert pos_at_least_rel(s, POS, AMB, one, "hinge").item() == pos_at_least_rel(s, POS, AMB, one).item()
    for shift in (1.0, 3.0):
        down = SampledNegatives(HARDEST.query - shift, HARDEST.query_ok, HARDEST.video - shift, HARDEST.video_ok)
        assert rel_over_neg(S - shift, AMB, CONF, down, 0.3, "hinge").item() == pytest.approx(0.05, abs=1e-6)
        assert pos_at_least_rel(s - shift, POS, AMB, CONF, "hinge").item() == pytest.approx(0.15, abs=1e-6)
    with pytest.raises(ValueError, match="on must be one of score, hinge"):
        rel_over_neg(S, AMB, CONF, HARDEST, 0.3, "both")


def test_normalised_by_the_number_of_potentially_relevant_pairs():
    amb = AMB.clone()
    amb[1, 3] = True  # (q1, v3), C = 0.5: [0.3 + 0.6 - 0.2]+ = 0.7 and [0.3 + v3's 0.4 - 0.2]+ = 0.5
    conf = CONF.clone()
    conf[1, 3] = 0.5
    assert rel_over_neg(S, amb, conf, HARDEST, 0.3).item() == pytest.approx((0.9 + 1.2) / 2)


@pytest.mark.parametrize("loss", ["rel_neg", "pos_rel"])
def test_zero_without_potentially_relevant_pairs_and_still_in_the_graph(loss):
    s = S.clone().requires_grad_(True)
    none = torch.zeros_like(AMB)
    out = (rel_over_neg(s, none, CONF, HARDEST, 0.3) if loss == "rel_neg" else pos_at_least_rel(s, POS, none, CONF))
    assert out.item() == 0.0 and str(out.item()) == "0.0"
    out.backward()
    assert torch.equal(s.grad, torch.zeros_like(S))


def _naive_ranking(s, pos, amb, neg, conf, margin):
    """Eq. 10-12 by loops over pairs, with the hardest negatives (N_pool = 1) found by loops."""
    n_q, n_v = len(s), len(s[0])
    hard_q = [max((s[i][j] for j in range(n_v) if neg[i][j]), default=None) for i in range(n_q)]
    hard_v = [max((s[i][j] for i in range(n_q) if neg[i][j]), default=None) for j in range(n_v)]
    hinge = lambda x: max(x, 0.0)  # noqa: E731
    pos_pairs = [(i, j) for i in range(n_q) for j in range(n_v) if pos[i][j]]
    rel_pairs = [(i, j) for i in range(n_q) for j in range(n_v) if amb[i][j]]
    l10 = sum((hinge(margin + hard_q[i] - s[i][j]) if hard_q[i] is not None else 0.0)
              + (hinge(margin + hard_v[j] - s[i][j]) if hard_v[j] is not None else 0.0) for i, j in pos_pairs)
    l11 = sum((hinge(margin + hard_q[i] - conf[i][j] * s[i][j]) if hard_q[i] is not None else 0.0)
              + (hinge(margin + hard_v[j] - conf[i][j] * s[i][j]) if hard_v[j] is not None else 0.0)
              for i, j in rel_pairs)
    l12 = 0.0
    for i, j in rel_pairs:
        mine = [s[i][k] for k in range(n_v) if pos[i][k]]
        theirs = [s[k][j] for k in range(n_q) if pos[k][j]]
        l12 += hinge(s[i][j] - conf[i][j] * sum(mine) / len(mine)) if mine else 0.0
        l12 += hinge(s[i][j] - conf[i][j] * sum(theirs) / len(theirs)) if theirs else 0.0
    return l10 / len(pos_pairs), l11 / max(1, len(rel_pairs)), l12 / max(1, len(rel_pairs))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranking_terms_match_a_loop_over_the_pairs(seed):
    g = torch.Generator().manual_seed(seed)
    n_q, n_v = 9, 5
    s = torch.rand(n_q, n_v, generator=g, dtype=torch.float64) * 2 - 1
    pos = torch.zeros(n_q, n_v, dtype=torch.bool)
    pos[torch.arange(n_q), torch.randint(0, n_v, (n_q,), generator=g)] = True
    amb = (torch.rand(n_q, n_v, generator=g) < 0.3) & ~pos
    neg = ~(pos | amb)
    conf = torch.rand(n_q, n_v, generator=g, dtype=torch.float64)
    hardest = sample_hard_negatives(s, neg, 1, g)
    got = (pos_over_neg(s, pos, hardest, 0.2), rel_over_neg(s, amb, conf, hardest, 0.2),
           pos_at_least_rel(s, pos, amb, conf))
    for a, b in zip(got, _naive_ranking(s.tolist(), pos.tolist(), amb.tolist(), neg.tolist(), conf.tolist(), 0.2)):
        assert a.item() == pytest.approx(b, abs=1e-12)


# ----------------------------------------------------------------------------- Eq. 14
def test_vcmr_relevance_reads_the_logits_at_the_segment_floored_at_1e_minus_6():
    start = torch.tensor([[[2.0, -1.0, 0.5]]], requires_grad=True)
    end = torch.tensor([[[0.0, 3.0, 1.0]]], requires_grad=True)
    s_vr = torch.tensor([[0.25]])
    r = vcmr_relevance(start, end, torch.tensor([[[0, 1]]]), s_vr, alpha=20.0)
    assert r.item() == pytest.approx(math.log(2.0) + math.log(3.0) + 5.0)
    # a negative start logit and a zero end logit count as 1e-6 and pass no gradient back
    floored = vcmr_relevance(start, end, torch.tensor([[[1, 0]]]), s_vr, alpha=20.0)
    assert floored.item() == pytest.approx(2 * math.log(LOGIT_FLOOR) + 5.0, rel=1e-6)
    floored.backward()
    assert start.grad.abs().sum() == 0 and end.grad.abs().sum() == 0
    assert vcmr_relevance(start, end, torch.tensor([[[-1, -1]]]), s_vr, 20.0).item() == 0.0  # no segment


# ----------------------------------------------------------------------------- Eq. 16-17
def test_span_nll_counts_the_valid_pairs_without_selecting_them():
    """`valid` gives the mean over the valid pairs (the same number to the last bit where every
    pair is valid), with finite gradients and none for the others, even a pair with no real row."""
    g = torch.Generator().manual_seed(0)
    start, end = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    start[:, 6] = end[:, 6] = float("-inf")  # padding
    rows = torch.sort(torch.randint(0, 6, (5, 2), generator=g), 1).values
    every = torch.ones(5, dtype=torch.bool)
    assert torch.equal(span_nll(start, end, rows, valid=every), span_nll(start, end, rows))
    weight = torch.rand(5, generator=g)
    assert torch.equal(span_nll(start, end, rows, weight, valid=every), span_nll(start, end, rows, weight))
    valid = torch.tensor([True, False, True, True, False])
    rows[~valid] = -1
    start[1] = end[1] = float("-inf")  # a pair without a real row: not counted
    start.requires_grad_()
    got = span_nll(start, end, rows, valid=valid)
    assert torch.allclose(got, span_nll(start[valid], end[valid], rows[valid]))
    got.backward()
    assert torch.isfinite(start.grad).all() and (start.grad[~valid] == 0).all()
    assert span_nll(start, end, rows, valid=torch.zeros(5, dtype=torch.bool)).item() == 0.0


def test_span_nll_hand_computed_and_confidence_weighted():
    inf = float("inf")
    start = torch.tensor([[0.0, math.log(2.0), -inf], [0.0, 0.0, 0.0]])  # P_st = [1/3, 2/3, 0]; uniform
    end = torch.tensor([[math.log(3.0), 0.0, -inf], [0.0, 0.0, 0.0]])  # P_ed = [3/4, 1/4, 0]; uniform
    rows = torch.tensor([[1, 0], [2, 2]])
    first = -math.log(2 / 3) - math.log(3 / 4)  # = log 2
    second = 2 * math.log(3.0)
    assert span_nll(start, end, rows).item() == pytest.approx((first + second) / 2)  # NLL_1, Eq. 16
    assert span_nll(start, end, rows, torch.tensor([0.5, 0.0])).item() == pytest.approx(0.5 * first / 2)  # Eq. 17
    assert span_nll(start[:0], end[:0], rows[:0]).item() == 0.0


# ----------------------------------------------------------------------------- segments
def test_segment_rows_labelled_own_and_video_segments():
    # q0, q1 -> v0; q2 -> v1; v2 has no labelled query. (q2, v0) carries the moment rows (4, 5).
    query_rows = torch.tensor([[1, 2], [3, 3], [0, 4]])
    video_of_query = torch.tensor([0, 0, 1])
    pair_rows = torch.full((3, 3, 2), -1)
    pair_rows[2, 0] = torch.tensor([4, 5])
    rows = segment_rows(query_rows, video_of_query, 3, pair_rows)
    assert rows[:, 0].tolist() == [[1, 2], [3, 3], [4, 5]]  # own moments; (q2, v0) the pair's
    assert rows[:, 1].tolist() == [[0, 4], [0, 4], [0, 4]]  # v1's segment = its labelled query's
    assert rows[:, 2].tolist() == [[-1, -1]] * 3  # no labelled query, no segment
    assert segment_rows(query_rows, video_of_query, 3)[2, 0].tolist() == [1, 2]  # v0's first labelled query
