"""The baseline method: dual-branch backbone, standard PRVR objective, one-to-one labels.

loss = sum over branches b in {clip, frame} of
       triplet_b (random negatives, hard negatives after `hard_negative_epoch`)
       + nce_weight * InfoNCE_b
       [+ L_a^trip_b with loss.treatment=restrain]
       (with loss.treatment=soft, InfoNCE_b's text-to-video term against Holmes' soft targets)
Relations come from the configured detector (`none` by default; `oracle` for the upper bound);
`loss.treatment` says how its ambiguous pairs train (methods/objectives/arl.py, docs/matrix.md):
ignore (the default: out of the negatives), positive (they join the positives), restrain (ARL's
Eq. 11 on each branch, margin `margin_a`); soft reads the detector's confidence in the labelled pairs
instead (Holmes' query-adaptive labels, methods/objectives/holmes.py `soft_info_nce`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, cast

import torch

from prvr.harness.base.checks import NON_NEGATIVE, POSITIVE, ListOf, at_least, one_of, param
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.objectives.arl import (AS_DETECTOR_MODES, StandardTreatment, check_restrained_margin,
                                         restrained_triplet, treated_positive)
from prvr.methods.objectives.holmes import soft_info_nce
from prvr.methods.objectives.prvr import soft_target_scores
from prvr.methods.objectives.ranking import hard_pool_at, info_nce, triplet
from prvr.methods.recipes import PRESETS, MethodSpec

Branch = Literal["clip", "frame"]  # a score matrix the standard objective trains


@dataclass
class StandardLossConfig:
    margin: float = param(0.1, NON_NEGATIVE)  # triplet margin (MS-SL TVR: 0.1; 0.2 elsewhere)
    # hard negatives from this epoch on (MS-SL: 20 of 100 epochs); -1 = never
    hard_negative_epoch: int = param(6, at_least(-1, "-1 = never"))
    hard_pool: int = param(20, at_least(1))  # hard negatives sampled from the top-k (MS-SL: 20)
    nce_weight: float = param(0.05, NON_NEGATIVE)  # weight of InfoNCE against the triplet
    temperature: float = param(0.05, POSITIVE)  # InfoNCE temperature on cosine similarities
    # score matrices trained
    branches: list[Branch] = param(["clip", "frame"], ListOf(one_of(Branch), distinct=True))
    # the detector's ambiguous pairs: ignore (out of the negatives) | positive (join the positives) |
    # restrain (ARL Eq. 11 per branch: below the positive by margin_a, the negatives by margin) |
    # soft (text-to-video InfoNCE against Holmes' soft targets: reads the detector's confidence in the labels)
    treatment: StandardTreatment = param("ignore", one_of(StandardTreatment))
    margin_a: float = param(0.05, NON_NEGATIVE)  # m_a < margin, read with treatment=restrain (ARL's m / 2)
    as_detector_modes: ClassVar[tuple[str, ...]] = AS_DETECTOR_MODES  # harness/cli/matrix.py

    def check(self, key: str) -> None:
        check_restrained_margin(self.treatment, self.margin, self.margin_a, key)


def standard_objective(cfg: StandardLossConfig, scores: Scores, relations: Relations,
                       context: StepContext) -> LossOutput:
    """Triplet + weighted InfoNCE (soft: against Holmes' soft targets) on each branch's [Q, B] score matrix
    (+ the restrained triplet)."""
    hard = hard_pool_at(context.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out: dict[str, torch.Tensor] = {}
    pos, neg = treated_positive(relations.positive, relations.ambiguous, cfg.treatment), relations.negative
    target = soft_target_scores(scores) if cfg.treatment == "soft" else None
    for b in cfg.branches:
        out[f"{b}_triplet"] = triplet(scores.branches[b], pos, neg, cfg.margin, hard, context.generator)
        out[f"{b}_nce"] = (info_nce(scores.branches[b], pos, neg, cfg.temperature) if target is None else
                           soft_info_nce(scores.branches[b], pos, neg, cfg.temperature, target, relations.confidence))
    loss = cast(torch.Tensor, sum(out[f"{b}_triplet"] + cfg.nce_weight * out[f"{b}_nce"] for b in cfg.branches))
    if cfg.treatment == "restrain":
        for b in cfg.branches:
            out[f"{b}_trip_a"] = restrained_triplet(scores.branches[b], pos, relations.ambiguous, cfg.margin_a, hard,
                                                    context.generator)
            loss = loss + out[f"{b}_trip_a"]
    return LossOutput(loss, out)


METHODS.add(
    "baseline",
    MethodSpec("baseline", backbone="dual-branch", relations="none", loss_cls=StandardLossConfig,
               objective=standard_objective, preset=PRESETS / "baseline.yaml", needs=frozenset({"clip_frame"}),
               objectives=("triplet", "infonce", "restrained-triplet", "soft-infonce"), reference=True),
    "dual-branch backbone + triplet/InfoNCE on one-to-one labels: the reference row",
)
