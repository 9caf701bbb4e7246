"""ARL's objectives (Eq. 8-12 and the text-frame losses) against hand-computed values."""

import math

import pytest
import torch

from prvr.methods.objectives.arl import (LossWeights, Rows, ambiguity_restrained_loss, frame_loss, frame_rows, nce_rows,
                                         video_loss)
from prvr.methods.objectives.ranking import info_nce, triplet

e = math.exp


def arl_video(s, pos, amb, temperature=1.0, margin_a=0.1, margin=0.2, hard_pool=1):
    """ARL's L^video terms {nce (Eq. 10), trip_a (Eq. 11), trip_n (Eq. 12), loss}, the negatives
    being every pair neither positive nor ambiguous."""
    weights = LossWeights(1.0, temperature, margin=margin, margin_a=margin_a, hard_pool=hard_pool)
    return video_loss(s, pos, amb, ~(pos | amb), weights)


def _row(scores, amb_cols, neg_cols):
    s = torch.tensor([scores])
    amb = torch.zeros_like(s, dtype=torch.bool)
    neg = torch.zeros_like(s, dtype=torch.bool)
    amb[0, amb_cols] = True
    neg[0, neg_cols] = True
    return Rows.build(s, torch.tensor([0]), amb, neg)


def test_nce_rows_empty_ambiguous_set_is_infonce():
    r = _row([2.0, 1.0, 0.0], [], [1, 2])
    assert nce_rows(r, 1.0).item() == pytest.approx(-math.log(e(2) / (e(2) + e(1) + e(0))))


def test_nce_rows_three_treatments_hand_computed():
    r = _row([2.0, 1.0, 0.0], [1], [2])  # column 1 ambiguous, column 2 negative
    den = e(2) + e(1) + e(0)
    assert nce_rows(r, 1.0, "restrain").item() == pytest.approx(-math.log((e(2) + e(1)) / den), rel=1e-5)  # Eq. 8
    assert nce_rows(r, 1.0, "ignore").item() == pytest.approx(-math.log(e(2) / (e(2) + e(0))))
    assert nce_rows(r, 1.0, "positive").item() == pytest.approx(
        0.5 * (-math.log(e(2) / den) - math.log(e(1) / den)))
    r2 = _row([0.2, 0.1, -0.3], [1], [2])
    assert nce_rows(r2, 0.1).item() == pytest.approx(-math.log((e(2) + e(1)) / (e(2) + e(1) + e(-3))), abs=1e-6)


def test_video_nce_hand_computed():
    # 3 queries, 2 videos: q0 -> v0, q1 -> v1, q2 -> v0; (q0, v1) ambiguous.
    s = torch.tensor([[0.9, 0.5], [0.2, 0.7], [0.6, 0.4]])
    pos = torch.tensor([[True, False], [False, True], [True, False]])
    amb = torch.tensor([[False, True], [False, False], [False, False]])
    loss = arl_video(s, pos, amb, temperature=1.0)["nce"]
    terms = [
        0.0,  # (q0, v0) t2v: v1 ambiguous, no negative -> numerator = denominator
        -math.log(e(.9) / (e(.9) + e(.2))),  # (q0, v0) v2t: q2 is another positive of v0, takes no part
        -math.log(e(.7) / (e(.7) + e(.2))),  # (q1, v1) t2v
        -math.log((e(.7) + e(.5)) / (e(.7) + e(.5) + e(.4))),  # (q1, v1) v2t: A_1^v = {q0}
        -math.log(e(.6) / (e(.6) + e(.4))),  # (q2, v0) t2v
        -math.log(e(.6) / (e(.6) + e(.2))),  # (q2, v0) v2t
    ]
    assert loss.item() == pytest.approx(sum(terms) / 3)  # Eq. 10: 1/n over the n = 3 positive pairs


def test_video_nce_without_ambiguity_matches_infonce_on_one_to_one():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(5, 5, generator=g)
    pos = torch.eye(5, dtype=torch.bool)
    none = torch.zeros_like(pos)
    assert arl_video(s, pos, none, temperature=0.5)["nce"].item() == pytest.approx(info_nce(s, pos, ~pos, 0.5).item())


S3 = [[0.8, 0.75, 0.1],
      [0.5, 0.6, 0.2],
      [0.0, 0.1, 0.9]]


def test_video_triplets_hand_computed():
    s = torch.tensor(S3)
    pos = torch.eye(3, dtype=torch.bool)
    amb = torch.zeros_like(pos)
    amb[0, 1] = True  # (q0, v1) ambiguous: in A_0^q and in A_1^v
    out = arl_video(s, pos, amb, margin_a=0.1, margin=0.2)
    la, ln = out["trip_a"], out["trip_n"]
    # Eq. 11, t2v: only q0 has an ambiguous video: 0.1 + 0.75 - 0.8; v2t: only v1 has one: 0.1 + 0.75 - 0.6
    assert la.item() == pytest.approx((0.1 + 0.75 - 0.8) / 3 + (0.1 + 0.75 - 0.6) / 3)
    # Eq. 12, hardest negatives: t2v q0 -> v2 (0.1), q1 -> v0 (0.5), q2 -> v1 (0.1); v2t v0 <- q1 (0.5),
    # v1 <- q2 (0.1) (q0 is ambiguous, not negative), v2 <- q1 (0.2)
    t2v = [0, 0.2 + 0.5 - 0.6, 0]
    v2t = [0, 0, 0]
    assert ln.item() == pytest.approx(sum(t2v) / 3 + sum(v2t) / 3)


def test_video_triplets_hierarchy_m_a_below_m():
    s = torch.tensor(S3)
    pos = torch.eye(3, dtype=torch.bool)
    amb = torch.zeros_like(pos)
    amb[0, 1] = True
    # s(q0, v1) = 0.75 sits between s(q0, v0) - m = 0.6 and s(q0, v0) - m_a = 0.78: restrained, it
    # costs nothing in the t2v direction; as a negative it would cost m + 0.75 - 0.8 = 0.15.
    la = arl_video(s, pos, amb, margin_a=0.02, margin=0.2)["trip_a"]
    assert la.item() == pytest.approx((0.02 + 0.75 - 0.6) / 3)  # only the v2t term of v1 remains
    ln_as_negative = arl_video(s, pos, torch.zeros_like(pos), margin_a=0.02, margin=0.2)["trip_n"]
    assert ln_as_negative.item() > la.item()
    with pytest.raises(ValueError, match="m_a < m"):
        arl_video(s, pos, amb, margin_a=0.2, margin=0.2)
    with pytest.raises(ValueError, match="m_a < m"):
        LossWeights(1.0, 1.0, margin=0.1, margin_a=0.3)


def test_video_triplets_without_ambiguity_are_the_standard_triplet():
    g = torch.Generator().manual_seed(1)
    s = torch.rand(6, 4, generator=g)
    pos = torch.zeros(6, 4, dtype=torch.bool)
    pos[torch.arange(6), torch.tensor([0, 0, 1, 2, 3, 3])] = True
    out = arl_video(s, pos, torch.zeros_like(pos), margin_a=0.05, margin=0.1)
    la, ln = out["trip_a"], out["trip_n"]
    assert la.item() == 0.0
    assert ln.item() == pytest.approx(triplet(s, pos, ~pos, 0.1, hard_pool=1).item())


def test_positive_treatment_adds_ambiguous_anchors_to_the_triplet():
    r = _row([0.8, 0.75, 0.7], [1], [2])
    w = LossWeights(lambda_nce=0.0, temperature=1.0, margin=0.2, margin_a=0.1, hard_pool=1)
    out = ambiguity_restrained_loss(r, r, w, "positive")
    # anchor: 0.2 + 0.7 - 0.8 = 0.1; the ambiguous column as an anchor: 0.2 + 0.7 - 0.75 = 0.15; two directions
    assert out["trip_n"].item() == pytest.approx(2 * (0.1 + 0.15))
    assert out["trip_a"].item() == 0.0
    restrain = ambiguity_restrained_loss(r, r, w, "restrain")
    assert restrain["trip_a"].item() == pytest.approx(2 * max(0, 0.1 + 0.75 - 0.8))
    assert restrain["trip_n"].item() == pytest.approx(2 * 0.1)
    ignore = ambiguity_restrained_loss(r, r, w, "ignore")
    assert ignore["trip_a"].item() == 0.0 and ignore["trip_n"].item() == pytest.approx(2 * 0.1)


def _frame_case():
    fs = torch.tensor([
        [[0.9, 0.7, 0.1], [0.3, 0.2, 5.0]],  # q0 at v0 and v1 (v1's third frame is padding: garbage)
        [[0.2, 0.4, 0.6], [0.5, 0.8, 5.0]],  # q1
    ])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    pos = torch.tensor([[True, False], [False, True]])
    famb = torch.zeros(2, 2, 3, dtype=torch.bool)
    famb[0, 0, 1] = True  # frame 1 of v0 ambiguous for q0 (its own video)
    famb[1, 0, 0] = True  # q1 ambiguous at frame 0 of v0
    return fs, mask, pos, famb


def test_frame_rows_anchor_at_best_frame_and_padding_masked():
    fs, mask, pos, famb = _frame_case()
    t2f, f2t = frame_rows(fs, mask, pos, famb)
    assert t2f.anchor.tolist() == [0, 1]  # best real frame: 0.9 in v0; 0.8 in v1 (not the padded 5.0)
    assert t2f.ambiguous.tolist() == [[False, True, False], [False, False, False]]
    assert t2f.negative.tolist() == [[False, False, True], [True, False, False]]
    assert torch.allclose(f2t.scores, torch.tensor([[0.9, 0.2], [0.2, 0.8]]))
    assert f2t.ambiguous.tolist() == [[False, True], [False, False]]
    assert f2t.negative.tolist() == [[False, False], [True, False]]


def test_frame_loss_hand_computed():
    fs, mask, pos, famb = _frame_case()
    w = LossWeights(lambda_nce=1.0, temperature=1.0, margin=0.5, margin_a=0.3, hard_pool=1)
    out = frame_loss(fs, mask, pos, famb, w)
    nce = [-math.log((e(.9) + e(.7)) / (e(.9) + e(.7) + e(.1))), 0.0,  # pair (q0, v0): t2f, f2t
           -math.log(e(.8) / (e(.8) + e(.5))), -math.log(e(.8) / (e(.8) + e(.2)))]  # pair (q1, v1)
    assert out["nce"].item() == pytest.approx(sum(nce) / 2)
    # per direction, mean over the 2 pairs; t2f then f2t
    trip_a = [max(0, 0.3 + 0.7 - 0.9), 0.0] + [max(0, 0.3 + 0.2 - 0.9), 0.0]
    trip_n = [max(0, 0.5 + 0.1 - 0.9), max(0, 0.5 + 0.5 - 0.8)] + [0.0, max(0, 0.5 + 0.2 - 0.8)]
    assert out["trip_a"].item() == pytest.approx(sum(trip_a) / 2)
    assert out["trip_n"].item() == pytest.approx(sum(trip_n) / 2)
    assert out["loss"].item() == pytest.approx(out["nce"].item() + out["trip_a"].item() + out["trip_n"].item())


def test_losses_backpropagate_and_empty_batches_are_zero():
    s = torch.randn(6, 3, requires_grad=True)
    pos = torch.zeros(6, 3, dtype=torch.bool)
    pos[torch.arange(6), torch.tensor([0, 0, 1, 1, 2, 2])] = True
    amb = torch.zeros_like(pos)
    amb[0, 1] = amb[3, 2] = True
    w = LossWeights(0.05, 0.05, 0.1, 0.05)
    for treatment in ("restrain", "positive", "ignore"):
        s.grad = None
        video_loss(s, pos, amb, ~(pos | amb), w, treatment)["loss"].backward()
        assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
    out = video_loss(s, torch.zeros_like(pos), amb, ~amb, w)
    assert out["loss"].item() == 0.0
