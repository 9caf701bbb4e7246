"""The HLFormer method (Li et al., ICCV 2025): the `hlformer` backbone and its loss.

loss = w_c * clip_NCE + clip_triplet + w_f * frame_NCE + frame_triplet
       + w_d * focal_query_diversity + w_pop * L_pop
(ICCV25-HLFormer src/Losses/loss.py: loss_factor = [w_c, w_f, w_d, w_pop], neg_factor =
[margin, alpha, gamma] of the diversity term): GMMFormer v2's loss without its Hungarian
matching, plus the partial-order preservation loss on the backbone's Lorentz embeddings
(methods/objectives/hlformer.py). Relations come from the configured detector; L_pop takes
the detector's positive pairs (with one-to-one labels: each query and its labelled video).
docs/methods/hlformer.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from prvr.harness.base.checks import FINITE, NON_NEGATIVE, POSITIVE, at_least, param
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.objectives.hlformer import partial_order
from prvr.methods.objectives.prvr import focal_query_diversity, same_video_pairs, two_branch_ranking, two_branch_sum
from prvr.methods.objectives.ranking import hard_pool_at
from prvr.methods.recipes import PRESETS, MethodSpec


@dataclass
class HLFormerLossConfig:
    margin: float = param(0.1, NON_NEGATIVE)  # Configs/tvr.py margin (ActivityNet, Charades 0.2 in the preset)
    clip_nce_weight: float = param(0.05, NON_NEGATIVE)  # loss_factor[0] (TVR)
    frame_nce_weight: float = param(0.04, NON_NEGATIVE)  # loss_factor[1] (TVR)
    frame_triplet_weight: float = param(1.0, NON_NEGATIVE)  # ours, as GMMFormer v2's: the reference weighs it 1
    diversity_weight: float = param(8e-5, NON_NEGATIVE)  # loss_factor[2] (TVR)
    diversity_margin: float = param(0.15, FINITE)  # neg_factor[0] (TVR)
    diversity_alpha: float = param(32.0, POSITIVE)  # neg_factor[1]
    diversity_gamma: float = param(1.0, NON_NEGATIVE)  # neg_factor[2]: exponent of the focal factor (1 + cos)
    pop_weight: float = param(1e-3, NON_NEGATIVE)  # loss_factor[3]: L_pop (0: without it)
    # K of the entailment cones' half-aperture asin(2K / (sqrt(c) |v|)): lorentz.py half_aperture's default
    pop_min_radius: float = param(0.1, POSITIVE)
    # hard_negative_start_epoch (of 100 epochs); -1 = never
    hard_negative_epoch: int = param(20, at_least(-1, "-1 = never"))
    hard_pool: int = param(20, at_least(1))  # hard_pool_size


def hlformer_objective(cfg: HLFormerLossConfig, scores: Scores, relations: Relations,
                       context: StepContext) -> LossOutput:
    hard = hard_pool_at(context.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out = two_branch_ranking(scores, relations.positive, relations.negative, cfg.margin, hard, context.generator)
    queries, videos = context.outputs["queries"], context.outputs["videos"]
    out["diversity"] = focal_query_diversity(queries["query"], same_video_pairs(relations.positive),
                                             cfg.diversity_margin, cfg.diversity_alpha, cfg.diversity_gamma)
    # the curvature the points were mapped with (one value, repeated per video)
    out["pop"] = partial_order(queries["lorentz.query"], videos["lorentz.video"], relations.positive,
                               videos["lorentz.curvature"][0], cfg.pop_min_radius)
    loss = two_branch_sum(cfg, out) + cfg.diversity_weight * out["diversity"] + cfg.pop_weight * out["pop"]
    return LossOutput(loss, out, {"curvature": videos["lorentz.curvature"][0].detach()})


METHODS.add(
    "hlformer",
    MethodSpec("hlformer", backbone="hlformer", relations="none", loss_cls=HLFormerLossConfig,
               objective=hlformer_objective, preset=PRESETS / "hlformer.yaml",
               needs=frozenset({"clip_frame", "raw", "query_vector", "lorentz"}),
               objectives=("msl-triplet", "infonce", "focal-query-diversity", "hlformer-partial-order")),
    "HLFormer: Euclidean + Lorentz attention branches, NCE + triplet + focal diversity + partial-order loss",
)
