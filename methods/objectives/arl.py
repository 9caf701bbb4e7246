"""ARL's ambiguity-aware objectives (ARL paper Eq. 8-12 and the text-frame extension) as pure
functions of score matrices, relation masks and weights, so that any detector can feed them.

Every loss is built per anchor pair (q_i, V_j) in `positive` and per direction, as "rows": a
row holds the scores of one anchor against its candidates (t2v: the batch videos; v2t: the
batch queries; t2f: the frames of V_j; f2t: the batch queries at one frame). Each row has an
anchor column, an ambiguous set A and a negative set N; every other column takes no part.

How a row treats A (paper Table 6):
- restrain (ARL, Eq. 8-9): numerator e^{s_anchor} + sum_A e^s, denominator adds N; triplets
  keep A below the anchor by the small margin m_a (Eq. 11) and N by m (Eq. 12).
- positive: A joins the positives (supervised contrastive, Khosla et al.: each positive
  its own term, averaged), and ambiguous pairs become triplet anchors with margin m.
- ignore: A is masked out of every loss (the draw restrain makes from A is taken and dropped, so an
  ignore run and a restrain run share one random stream).

The standard objectives (baseline, MS-SL, GMMFormer) take the same words as their
`loss.treatment` (end of this file): ignore (their default, as they always were), positive (A
joins the positives of their triplet and InfoNCE terms) and restrain (ARL's Eq. 11 on each
branch's [Q, B] score matrix, `restrained_triplet`, added to their own terms); and one more, soft
(Holmes' query-adaptive labels in their text-to-video InfoNCE, methods/objectives/holmes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from prvr.harness.base import masks
from prvr.harness.base.checks import require
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import OBJECTIVES
from prvr.methods.objectives.ranking import sample_negatives, skip_draw

Treatment = Literal["restrain", "positive", "ignore"]  # how a row treats its ambiguous set (Table 6)
TREATMENTS: tuple[Treatment, ...] = get_args(Treatment)


@dataclass
class Rows:
    """Anchor rows of one direction: scores [P, C], anchor column [P], ambiguous / negative
    [P, C] bool (the anchor is in neither)."""

    scores: torch.Tensor
    anchor: torch.Tensor
    ambiguous: torch.Tensor
    negative: torch.Tensor

    @staticmethod
    def build(scores: torch.Tensor, anchor: torch.Tensor, ambiguous: torch.Tensor, negative: torch.Tensor) -> "Rows":
        not_anchor = torch.ones_like(ambiguous)
        not_anchor.scatter_(1, anchor[:, None], False)  # a scalar fill: no host value copied to the GPU
        ambiguous = ambiguous & not_anchor
        return Rows(scores, anchor, ambiguous, negative & not_anchor & ~ambiguous)

    def anchor_scores(self) -> torch.Tensor:
        return self.scores.gather(1, self.anchor[:, None]).squeeze(1)

    def anchor_mask(self) -> torch.Tensor:
        return torch.zeros_like(self.ambiguous).scatter_(1, self.anchor[:, None], True)


def _lse(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x.masked_fill(~mask, float("-inf")), dim=1)


def nce_rows(rows: Rows, temperature: float, treatment: str = "restrain") -> torch.Tensor:
    """Per-row contrastive loss [P] (ARL Eq. 8 / 9 for one anchor pair), logits = s / temperature.

    restrain: -log((e^a + sum_A e^s) / (e^a + sum_{A u N} e^s))
    ignore:   -log(e^a / (e^a + sum_N e^s))
    positive: mean over p in {a} u A of -log(e^p / (e^a + sum_{A u N} e^s))
    """
    logits = rows.scores / temperature
    anchor = rows.anchor_mask()
    amb = rows.ambiguous if treatment != "ignore" else torch.zeros_like(rows.ambiguous)
    den = _lse(logits, anchor | amb | rows.negative)
    if treatment == "positive":
        pos = anchor | amb
        return ((den[:, None] - logits) * pos).sum(1) / pos.sum(1)
    return den - _lse(logits, anchor | amb)


def triplet_rows(rows: Rows, pool: torch.Tensor, margin: float, hard_pool: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-row hinge [P]: max(0, margin + s(sample) - s(anchor)), one sample drawn from `pool`
    (uniformly, or among its `hard_pool` highest scores); 0 where the pool is empty."""
    idx, valid = sample_negatives(rows.scores, pool, hard_pool, generator)
    other = rows.scores.gather(1, idx[:, None]).squeeze(1)
    return (margin + other - rows.anchor_scores()).clamp(min=0) * valid


def video_rows(scores: torch.Tensor, positive: torch.Tensor, ambiguous: torch.Tensor,
               negative: torch.Tensor) -> tuple[Rows, Rows]:
    """The t2v and v2t rows of every positive pair (q_i, V_j) of a [Q, B] score matrix: the
    row of q_i over the videos (A_i^q, N_i^q) and the column of V_j over the queries (A_j^v, N_j^v)."""
    qi, vj = masks.true_pairs(positive)
    t2v = Rows.build(scores[qi], vj, ambiguous[qi], negative[qi])
    v2t = Rows.build(scores.t()[vj], qi, ambiguous.t()[vj], negative.t()[vj])
    return t2v, v2t


def frame_rows(frame_scores: torch.Tensor, frame_mask: torch.Tensor, positive: torch.Tensor,
               frame_ambiguous: torch.Tensor) -> tuple[Rows, Rows]:
    """Text-frame rows of every positive pair (q_i, V_j) (ARL "Text-Frame Label Ambiguity
    Detection"): the anchor frame is v_jk^ (the best frame, Eq. 3).

    t2f: q_i against the real frames of V_j; A = ambiguous frames, N = the other frames.
    f2t: the frame v_jk^ against the batch queries; A = queries ambiguous at that frame,
    N = the others, except the other queries labelled with V_j, which describe other moments
    of the same video and so are neither (unknown at frame level).
    frame_scores [Q, B, T], frame_mask [B, T], positive [Q, B], frame_ambiguous [Q, B, T].
    """
    qi, vj = masks.true_pairs(positive)
    sims = frame_scores[qi, vj]  # [P, T]
    valid = frame_mask[vj]
    best = sims.detach().masked_fill(~valid, float("-inf")).argmax(1)
    t2f = Rows.build(sims, best, frame_ambiguous[qi, vj] & valid, valid)
    column = frame_scores[:, vj, best].t()  # [P, Q]: every query at the anchor frame
    amb = frame_ambiguous[:, vj, best].t()
    f2t = Rows.build(column, qi, amb, ~positive[:, vj].t())
    return t2f, f2t


@dataclass
class LossWeights:
    """Weights of L = lambda_nce * L_nce + L_a^trip + L_n^trip (ARL, text-video and text-frame)."""

    lambda_nce: float
    temperature: float
    margin: float  # m (Eq. 12)
    margin_a: float  # m_a < m (Eq. 11)
    hard_pool: int | None = None  # triplet samples among the top-k of their pool; None = uniform

    def __post_init__(self) -> None:
        if not self.margin_a < self.margin:
            raise ValueError(f"ARL needs m_a < m (Eq. 11-12), got m_a={self.margin_a}, m={self.margin}")


def ambiguity_restrained_loss(t2x: Rows, x2t: Rows, w: LossWeights, treatment: str = "restrain",
                              generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """L^video (or L^frame) over the anchor rows of both directions: `nce` (Eq. 10), `trip_a`
    (Eq. 11), `trip_n` (Eq. 12) and `loss` = lambda_nce * nce + trip_a + trip_n. Means over the
    n positive pairs (the rows)."""
    if treatment not in TREATMENTS:
        raise ValueError(f"treatment must be one of {', '.join(TREATMENTS)}, got '{treatment}'")
    if len(t2x.anchor) == 0:
        zero = t2x.scores.sum() * 0
        return {"nce": zero, "trip_a": zero, "trip_n": zero, "loss": zero}
    nce = (nce_rows(t2x, w.temperature, treatment) + nce_rows(x2t, w.temperature, treatment)).mean()
    trip_a = torch.zeros_like(nce)
    trip_n = torch.zeros_like(nce)
    for rows in (t2x, x2t):
        trip_n = trip_n + triplet_rows(rows, rows.negative, w.margin, w.hard_pool, generator).mean()
        if treatment == "restrain":
            trip_a = trip_a + triplet_rows(rows, rows.ambiguous, w.margin_a, w.hard_pool, generator).mean()
        elif treatment == "positive":  # ambiguous pairs as extra anchors against the negatives
            trip_n = trip_n + _ambiguous_as_anchors(rows, w.margin, w.hard_pool, generator)
        else:  # ignore: restrain's draw from A taken and dropped, so the two share one random stream
            skip_draw(rows.scores, generator)
    return {"nce": nce, "trip_a": trip_a, "trip_n": trip_n, "loss": w.lambda_nce * nce + trip_a + trip_n}


def _ambiguous_as_anchors(rows: Rows, margin: float, hard_pool: int | None, generator) -> torch.Tensor:
    """Triplet terms with every ambiguous pair as an extra positive, averaged per anchor row so
    that the weight of a row does not grow with its ambiguous set."""
    r, c = rows.ambiguous.nonzero(as_tuple=True)
    if len(r) == 0:
        return rows.scores.sum() * 0
    extra = Rows(rows.scores[r], c, torch.zeros_like(rows.ambiguous[r]), rows.negative[r])
    terms = triplet_rows(extra, extra.negative, margin, hard_pool, generator)
    per_row = torch.zeros(len(rows.anchor), device=terms.device, dtype=terms.dtype).index_add(0, r, terms)
    return (per_row / rows.ambiguous.sum(1).clamp(min=1)).mean()


@OBJECTIVES.register("arl-video", "ARL L^video = lambda_nce L_nce + L_a^trip + L_n^trip over the text-video pairs")
def video_loss(scores: torch.Tensor, positive: torch.Tensor, ambiguous: torch.Tensor, negative: torch.Tensor,
               weights: LossWeights, treatment: str = "restrain",
               generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """ARL L^video on a [Q, B] score matrix (Eq. 8-12)."""
    t2v, v2t = video_rows(scores, positive, ambiguous, negative)
    return ambiguity_restrained_loss(t2v, v2t, weights, treatment, generator)


@OBJECTIVES.register("arl-frame", "ARL L^frame: the same losses over text-frame pairs, anchored at each positive pair's best frame")
def frame_loss(frame_scores: torch.Tensor, frame_mask: torch.Tensor, positive: torch.Tensor,
               frame_ambiguous: torch.Tensor, weights: LossWeights, treatment: str = "restrain",
               generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """ARL L^frame (the paper applies Eq. 8-12 to s^f and the text-frame ambiguous sets;
    lambda_nce shared): see `frame_rows` for the rows."""
    t2f, f2t = frame_rows(frame_scores, frame_mask, positive, frame_ambiguous)
    return ambiguity_restrained_loss(t2f, f2t, weights, treatment, generator)


# ----------------------------------------------------------------------------- the standard objectives' treatment
# The treatments by which a standard objective trains what a detector's mode of the same name hands it
# (`relations.oracle.mode=positive`: the pairs in Relations.positive; `ignore`: out of the negatives): the
# loss configs name them (`as_detector_modes`), and the matrix (harness/cli/matrix.py) keeps such a detector's
# mode, the run the suite has, where the detector has one.
AS_DETECTOR_MODES: tuple[Treatment, ...] = ("positive", "ignore")
# The standard objectives' `loss.treatment`: ARL's three words and `soft`, Holmes' query-adaptive labels
# (methods/objectives/holmes.py `soft_info_nce`: the text-to-video InfoNCE against `soft_targets`, which read
# the detector's confidence in the labelled pairs). ARL's own objective keeps `Treatment`.
StandardTreatment = Literal["restrain", "positive", "ignore", "soft"]
STANDARD_TREATMENTS: tuple[StandardTreatment, ...] = get_args(StandardTreatment)


def treated_positive(positive: torch.Tensor, ambiguous: torch.Tensor, treatment: str) -> torch.Tensor:
    """The positives [Q, B] a standard objective trains with under `loss.treatment`: with `positive` the
    detector's ambiguous pairs join them (multi-positive triplet and InfoNCE, as a detector's mode
    `positive` would hand them over); with `ignore` and `restrain` the detector's own (the very tensor),
    the ambiguous pairs being out of the negatives either way (`Relations.negative`); so with `soft`."""
    if treatment not in STANDARD_TREATMENTS:
        raise UserError(f"loss.treatment must be one of {', '.join(STANDARD_TREATMENTS)}, got '{treatment}'")
    return positive | ambiguous if treatment == "positive" else positive


def check_restrained_margin(treatment: str, margin: float, margin_a: float, key: str) -> None:
    """A standard loss config's rule (its `check(key)`): restrain needs m_a < m, as ARL (Eq. 11-12);
    under the other treatments margin_a is not read."""
    require(treatment != "restrain" or margin_a < margin,
            f"loss.treatment=restrain needs {key}.margin_a < {key}.margin (ARL Eq. 11-12), "
            f"got {margin_a} and {margin}")


@OBJECTIVES.register("restrained-triplet", "ARL L_a^trip (Eq. 11) on one [Q, B] score matrix: the ambiguous pairs "
                                           "below each positive by m_a (the standard objectives' restrain)")
def restrained_triplet(scores: torch.Tensor, positive: torch.Tensor, ambiguous: torch.Tensor, margin_a: float,
                       hard_pool: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """ARL's L_a^trip (Eq. 11) alone, the `trip_a` of `video_loss`, on a [Q, B] score matrix:

        mean over (q, v) in P of [m_a + s(q, a) - s(q, v)]_+  +  mean over (q, v) in P of [m_a + s(q', v) - s(q, v)]_+

    P the positive pairs, a one of q's ambiguous videos, q' one of v's ambiguous queries (uniform, or
    among the `hard_pool` highest-scoring); a pair whose row has no ambiguous pair adds 0 and counts in
    the mean, as in ARL. The negatives' L_n^trip (Eq. 12, margin m) is the objective's own triplet."""
    t2v, v2t = video_rows(scores, positive, ambiguous, ~(positive | ambiguous))
    if len(t2v.anchor) == 0:
        return scores.sum() * 0
    return (triplet_rows(t2v, t2v.ambiguous, margin_a, hard_pool, generator).mean()
            + triplet_rows(v2t, v2t.ambiguous, margin_a, hard_pool, generator).mean())
