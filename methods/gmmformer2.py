"""The GMMFormer v2 method (Wang et al., 2024): the `gmmformer2` backbone and its loss.

loss = w_c * clip_NCE + clip_triplet + w_f * frame_NCE + frame_triplet
       + w_d * focal_query_diversity + w_m * hungarian_matching
(GMMFormer_v2 src/Losses/loss.py: loss_factor = [w_c, w_f, w_d, w_m], neg_factor =
[margin, alpha, gamma] of the diversity term). Relations come from the configured detector.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from prvr.harness.base.checks import FINITE, NON_NEGATIVE, POSITIVE, at_least, param
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.objectives.prvr import (
    focal_query_diversity,
    hungarian_matching,
    same_video_pairs,
    two_branch_ranking,
    two_branch_sum,
)
from prvr.methods.objectives.ranking import hard_pool_at
from prvr.methods.recipes import PRESETS, MethodSpec


@dataclass
class V2FamilyLossConfig:
    """The loss settings GMMFormer v2 shares with the methods built on its code (Holmes, HLFormer,
    DreamPRVR): two-branch NCE and triplet, the focal query diversity, hard negatives; TVR's values,
    other datasets in each method's preset. Each method's own config adds its terms."""

    margin: float = param(0.1, NON_NEGATIVE)  # Configs/tvr.py margin (ActivityNet, Charades 0.2 in the preset)
    clip_nce_weight: float = param(0.05, NON_NEGATIVE)  # loss_factor[0] (TVR)
    frame_nce_weight: float = param(0.04, NON_NEGATIVE)  # loss_factor[1] (TVR)
    # ours: the reference weighs the frame triplet 1; 0 together with frame_nce_weight=0 trains
    # the query vector on the clip branch alone (a diagnostic: docs/methods/ral.md)
    frame_triplet_weight: float = param(1.0, NON_NEGATIVE)
    diversity_weight: float = param(8e-5, NON_NEGATIVE)  # loss_factor[2] (TVR)
    diversity_margin: float = param(0.15, FINITE)  # neg_factor[0] (TVR)
    diversity_alpha: float = param(32.0, POSITIVE)  # neg_factor[1]
    diversity_gamma: float = param(1.0, NON_NEGATIVE)  # neg_factor[2]: exponent of the focal factor (1 + cos)
    # hard_negative_start_epoch (of 100 epochs); -1 = never
    hard_negative_epoch: int = param(20, at_least(-1, "-1 = never"))
    hard_pool: int = param(20, at_least(1))  # hard_pool_size


@dataclass
class GMMFormer2LossConfig(V2FamilyLossConfig):
    matching_weight: float = param(0.09, NON_NEGATIVE)  # loss_factor[3] (TVR): Hungarian query-clip matching


def v2_family_terms(cfg: V2FamilyLossConfig, scores: Scores, relations: Relations,
                    context: StepContext) -> dict[str, torch.Tensor]:
    """The terms every method of the family trains: each branch's triplet and NCE (hard negatives from
    `hard_negative_epoch`) and the focal diversity of the queries of one video; `two_branch_sum(cfg, out)`
    plus `diversity_weight` weighs them."""
    hard = hard_pool_at(context.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out = two_branch_ranking(scores, relations.positive, relations.negative, cfg.margin, hard, context.generator)
    out["diversity"] = focal_query_diversity(context.outputs["queries"]["query"], same_video_pairs(relations.positive),
                                             cfg.diversity_margin, cfg.diversity_alpha, cfg.diversity_gamma)
    return out


def gmmformer2_objective(cfg: GMMFormer2LossConfig, scores: Scores, relations: Relations,
                         context: StepContext) -> LossOutput:
    out = v2_family_terms(cfg, scores, relations, context)
    out["matching"] = hungarian_matching(context.outputs["queries"]["query"], context.outputs["videos"]["clips"],
                                         relations.positive)
    loss = (two_branch_sum(cfg, out) + cfg.diversity_weight * out["diversity"]
            + cfg.matching_weight * out["matching"])
    return LossOutput(loss, out)


METHODS.add(
    "gmmformer2",
    MethodSpec("gmmformer2", backbone="gmmformer2", relations="none", loss_cls=GMMFormer2LossConfig,
               objective=gmmformer2_objective, preset=PRESETS / "gmmformer2.yaml",
               needs=frozenset({"clip_frame", "raw", "query_vector", "clip_vectors"}),
               objectives=("msl-triplet", "infonce", "focal-query-diversity", "hungarian-matching")),
    "GMMFormer v2: dynamic Gaussian fusion, NCE + triplet + focal diversity + Hungarian matching",
)
