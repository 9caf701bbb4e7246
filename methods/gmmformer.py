"""The GMMFormer method (Wang et al., AAAI 2024): the `gmmformer` backbone and its loss.

loss = w_c * clip_NCE + clip_triplet + w_f * frame_NCE + frame_triplet + w_d * query_diversity
(GMMFormer src/Losses/loss.py; loss_factor = [w_c, w_f, w_d], neg_factor = [margin, alpha]
of the diversity term). Relations come from the configured detector; `loss.treatment` says how
its ambiguous pairs train (ignore, the default | positive: also in the diversity's same-video pairs |
restrain: + clip_trip_a + frame_triplet_weight * frame_trip_a, ARL Eq. 11; methods/objectives/arl.py),
or soft: the NCE terms' text-to-video part against Holmes' soft targets (the detector's confidence in the labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from prvr.harness.base.checks import FINITE, NON_NEGATIVE, POSITIVE, at_least, one_of, param
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.objectives.arl import AS_DETECTOR_MODES, StandardTreatment, check_restrained_margin
from prvr.methods.objectives.prvr import query_diversity, same_video_pairs, treated_two_branch, two_branch_sum
from prvr.methods.objectives.ranking import hard_pool_at
from prvr.methods.recipes import PRESETS, MethodSpec


@dataclass
class GMMFormerLossConfig:
    margin: float = param(0.1, NON_NEGATIVE)  # Configs/tvr.py margin (ActivityNet, Charades 0.2 in the preset)
    clip_nce_weight: float = param(0.05, NON_NEGATIVE)  # loss_factor[0] (TVR)
    frame_nce_weight: float = param(0.04, NON_NEGATIVE)  # loss_factor[1] (TVR)
    # ours: the reference weighs the frame triplet 1; 0 together with frame_nce_weight=0 trains
    # the query vector on the clip branch alone (a diagnostic: docs/methods/ral.md)
    frame_triplet_weight: float = param(1.0, NON_NEGATIVE)
    diversity_weight: float = param(0.001, NON_NEGATIVE)  # loss_factor[2] (TVR)
    diversity_margin: float = param(0.15, FINITE)  # neg_factor[0] (TVR)
    diversity_alpha: float = param(32.0, POSITIVE)  # neg_factor[1]
    # hard_negative_start_epoch (TVR, of 100 epochs); -1 = never
    hard_negative_epoch: int = param(30, at_least(-1, "-1 = never"))
    hard_pool: int = param(20, at_least(1))  # hard_pool_size
    # ours: the detector's ambiguous pairs: ignore (out of the negatives) | positive (join the positives) |
    # restrain (ARL Eq. 11 per branch: below the positive by margin_a, the negatives by margin) |
    # soft (text-to-video InfoNCE against Holmes' soft targets: reads the detector's confidence in the labels)
    treatment: StandardTreatment = param("ignore", one_of(StandardTreatment))
    margin_a: float = param(0.05, NON_NEGATIVE)  # m_a < margin, read with treatment=restrain
    as_detector_modes: ClassVar[tuple[str, ...]] = AS_DETECTOR_MODES  # harness/cli/matrix.py

    def check(self, key: str) -> None:
        check_restrained_margin(self.treatment, self.margin, self.margin_a, key)


def gmmformer_objective(cfg: GMMFormerLossConfig, scores: Scores, relations: Relations,
                        context: StepContext) -> LossOutput:
    hard = hard_pool_at(context.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out, positive = treated_two_branch(scores, relations.positive, relations.negative, relations.ambiguous,
                                       relations.confidence, cfg.treatment, cfg.margin, cfg.margin_a, hard,
                                       context.generator)
    pairs = same_video_pairs(positive)
    out["diversity"] = query_diversity(context.outputs["queries"]["query"], pairs, cfg.diversity_margin,
                                       cfg.diversity_alpha)
    return LossOutput(two_branch_sum(cfg, out) + cfg.diversity_weight * out["diversity"], out)


METHODS.add(
    "gmmformer",
    MethodSpec("gmmformer", backbone="gmmformer", relations="none", loss_cls=GMMFormerLossConfig,
               objective=gmmformer_objective, preset=PRESETS / "gmmformer.yaml",
               needs=frozenset({"clip_frame", "raw", "query_vector"}),
               objectives=("msl-triplet", "infonce", "query-diversity", "restrained-triplet", "soft-infonce")),
    "GMMFormer: Gaussian-window attention, NCE + triplet + query diversity on one-to-one labels",
)
