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

from prvr.harness.base.checks import NON_NEGATIVE, POSITIVE, param
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.gmmformer2 import V2FamilyLossConfig, v2_family_terms
from prvr.methods.objectives.hlformer import partial_order
from prvr.methods.objectives.prvr import two_branch_sum
from prvr.methods.recipes import PRESETS, MethodSpec


@dataclass
class HLFormerLossConfig(V2FamilyLossConfig):
    pop_weight: float = param(1e-3, NON_NEGATIVE)  # loss_factor[3]: L_pop (0: without it)
    # K of the entailment cones' half-aperture asin(2K / (sqrt(c) |v|)): lorentz.py half_aperture's default
    pop_min_radius: float = param(0.1, POSITIVE)


def hlformer_objective(cfg: HLFormerLossConfig, scores: Scores, relations: Relations,
                       context: StepContext) -> LossOutput:
    out = v2_family_terms(cfg, scores, relations, context)
    queries, videos = context.outputs["queries"], context.outputs["videos"]
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
