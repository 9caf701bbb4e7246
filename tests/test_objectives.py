import dataclasses
import math

import pytest
import torch

from prvr.harness.base.registry import METHODS, load_all
from prvr.methods.objectives.ranking import hard_pool_at, info_nce, sample_negatives, triplet

load_all()


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


# --------------------------------------------------------------------------- the hard-negative rule
@pytest.mark.parametrize("start", [0, 3, 20])
def test_hard_negatives_from_the_configured_epoch_on(start):
    assert hard_pool_at(start - 1, start, 20) is None  # the epoch before: any negative
    assert hard_pool_at(start, start, 20) == 20  # epoch e itself
    assert hard_pool_at(start + 1, start, 20) == 20
    assert hard_pool_at(start - 1, start, 20, before=1) == 1  # XML's N_pool before it (loss.early_pool)


def test_hard_negative_epoch_minus_one_is_never():
    assert all(hard_pool_at(epoch, -1, 20) is None for epoch in (0, 1, 99))
    assert hard_pool_at(99, -1, 20, before=1) == 1


def _calls_the_rule(fn, seen: set[int] | None = None) -> bool:
    """Whether `fn` calls `hard_pool_at` by a global name, directly or through helpers of prvr.methods."""
    seen = set() if seen is None else seen
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if hasattr(c, "co_names")]
        for n in code.co_names:
            obj = fn.__globals__.get(n)
            if obj is hard_pool_at:
                return True
            if (callable(obj) and hasattr(obj, "__code__") and id(obj) not in seen
                    and getattr(obj, "__module__", "").startswith("prvr.methods")):
                seen.add(id(obj))
                if _calls_the_rule(obj, seen):
                    return True
    return False


HARD_NEGATIVE_METHODS = [e.name for e in METHODS.entries()
                         if any(f.name == "hard_negative_epoch" for f in dataclasses.fields(e.obj.loss_cls))]


def test_the_hard_negative_methods_are_found():
    assert {"baseline", "msl", "gmmformer", "gmmformer2", "arl", "xml"} <= set(HARD_NEGATIVE_METHODS)


@pytest.mark.parametrize("method", HARD_NEGATIVE_METHODS)
def test_every_loss_with_a_hard_negative_epoch_reads_it_through_the_one_rule(method):
    assert _calls_the_rule(METHODS.get(method).objective), (
        f"{method}'s objective must read loss.hard_negative_epoch through ranking.hard_pool_at")
