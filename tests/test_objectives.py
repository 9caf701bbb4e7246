import math

import pytest
import torch

from prvr.methods.objectives.ranking import info_nce, sample_negatives, triplet


def test_info_nce_hand_computed_one_positive_each():
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pos = torch.eye(2, dtype=torch.bool)
    loss = info_nce(s, pos, ~pos, temperature=1.0)
    one = -math.log(math.e / (math.e + 1))
    assert loss.item() == pytest.approx(2 * one)  # rows and columns each average to `one`


def test_info_nce_multi_positive_and_ignored_pairs():
    s = torch.tensor([[2.0, 1.0, 0.0],
                      [1.5, 0.5, 0.0]])
    pos = torch.tensor([[True, False, False], [True, False, False]])  # video 0 has two queries
    amb = torch.tensor([[False, True, False], [False, False, False]])  # (0, 1) is neither
    neg = ~(pos | amb)
    loss = info_nce(s, pos, neg, temperature=1.0)
    e = math.exp
    row0 = -math.log(e(2) / (e(2) + e(0)))  # video 1 ignored for query 0
    row1 = -math.log(e(1.5) / (e(1.5) + e(0.5) + e(0)))
    col0 = -math.log((e(2) + e(1.5)) / (e(2) + e(1.5)))  # both queries positive, no negatives in column
    assert loss.item() == pytest.approx((row0 + row1) / 2 + col0)


def test_triplet_hardest_negative_hand_computed():
    s = torch.tensor([[0.8, 0.75, 0.1],
                      [0.3, 0.6, 0.2],
                      [0.0, 0.1, 0.9]])
    pos = torch.eye(3, dtype=torch.bool)
    loss = triplet(s, pos, ~pos, margin=0.1, hard_pool=1)
    # t2v hardest: q0 -> v1 (0.75), q1 -> v0 (0.3), q2 -> v1 (0.1)
    t2v = [max(0, 0.1 + 0.75 - 0.8), max(0, 0.1 + 0.3 - 0.6), max(0, 0.1 + 0.1 - 0.9)]
    # v2t hardest: v0 <- q1 (0.3), v1 <- q0 (0.75), v2 <- q1 (0.2)
    v2t = [max(0, 0.1 + 0.3 - 0.8), max(0, 0.1 + 0.75 - 0.6), max(0, 0.1 + 0.2 - 0.9)]
    assert loss.item() == pytest.approx(sum(a + b for a, b in zip(t2v, v2t)) / 3)


def test_triplet_never_uses_ignored_pairs_as_negatives():
    s = torch.tensor([[0.5, 0.99, 0.0], [0.0, 0.5, 0.0]])
    pos = torch.tensor([[True, False, False], [False, True, False]])
    amb = torch.tensor([[False, True, False], [False, False, False]])
    loss = triplet(s, pos, ~(pos | amb), margin=0.1, hard_pool=1)
    # q0's only negative is v2 (0.0): no violation; v1's negative query would be q0 but (q0, v1) is ambiguous
    t2v = [0.0, max(0, 0.1 + 0.0 - 0.5)]
    v2t = [max(0, 0.1 + 0.0 - 0.5), 0.0]  # v0 <- q1 (0.0); v1 has no negative query
    assert loss.item() == pytest.approx(sum(a + b for a, b in zip(t2v, v2t)) / 2)


def test_sample_negatives_stays_in_pool_and_marks_empty_rows():
    g = torch.Generator().manual_seed(0)
    s = torch.arange(10.0).repeat(3, 1)
    neg = torch.ones(3, 10, dtype=torch.bool)
    neg[1, :] = False
    for _ in range(20):
        idx, valid = sample_negatives(s, neg, hard_pool=3, generator=g)
        assert valid.tolist() == [True, False, True]
        assert idx[0] >= 7 and idx[2] >= 7


def test_losses_backpropagate():
    s = torch.randn(6, 3, requires_grad=True)
    pos = torch.zeros(6, 3, dtype=torch.bool)
    pos[torch.arange(6), torch.tensor([0, 0, 1, 1, 2, 2])] = True
    (info_nce(s, pos, ~pos, 0.05) + triplet(s, pos, ~pos, 0.2)).backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
