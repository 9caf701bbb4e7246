"""The DreamPRVR method (Li et al., CVPR 2026): the `dreamprvr` backbone and its loss.

loss = w_c clip_NCE + clip_triplet + w_f frame_NCE + frame_triplet           (L_sim)
       + w_d focal_query_diversity + w_s query_similarity_preservation         (L_tssl)
       + w_kl KL(N(mu, sigma^2) || N(0, I))                                  (L_pvs)
       + w_dn |eps_theta(x_t, t, c) - mu|^2 over every step t                 (L_dre)
(CVPR26-DreamPRVR src/Losses/loss.py: loss_factor = [w_c, w_f, w_d, w_s, w_kl, w_dn], neg_factor =
[margin, alpha, gamma] of the diversity term, deterministic_tau the similarity term's temperature).
The ranking terms are GMMFormer v2's without its Hungarian matching and read the detector's
positive and negative pairs; the text terms pair the queries that share a positive video.
docs/methods/dreamprvr.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from prvr.harness.base.checks import NON_NEGATIVE, POSITIVE, param
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.backbones.dreamprvr import DENOISING, Denoising
from prvr.methods.gmmformer2 import V2FamilyLossConfig, v2_family_terms
from prvr.methods.objectives.dreamprvr import (
    denoising_error,
    latent_kl,
    query_similarity_preservation,
)
from prvr.methods.objectives.prvr import same_video_pairs, two_branch_sum
from prvr.methods.recipes import PRESETS, MethodSpec


@dataclass
class DreamPRVRLossConfig(V2FamilyLossConfig):
    """Section `loss` (the TVR values of src/Configs/tvr.py; other datasets: methods/presets/dreamprvr.yaml)."""

    similarity_weight: float = param(0.01, NON_NEGATIVE)  # loss_factor[3]: query similarity preservation
    similarity_tau: float = param(0.09, POSITIVE)  # deterministic_tau: its temperature on cosines
    kl_weight: float = param(1e-4, NON_NEGATIVE)  # loss_factor[4]: the video latent's KL (L_pvs)
    denoising_weight: float = param(1e-3, NON_NEGATIVE)  # loss_factor[5]: the diffusion's noise error (L_dre)


def dreamprvr_objective(cfg: DreamPRVRLossConfig, scores: Scores, relations: Relations,
                        context: StepContext) -> LossOutput:
    out = v2_family_terms(cfg, scores, relations, context)
    queries, videos = context.outputs["queries"]["query"], context.outputs["videos"]
    out["similarity"] = query_similarity_preservation(queries, same_video_pairs(relations.positive), cfg.similarity_tau)
    out["kl"] = latent_kl(videos["dream.mu"], videos["dream.logvar"])
    denoising = context.outputs["extras"][DENOISING]
    if not isinstance(denoising, Denoising):
        raise TypeError(f"step extras '{DENOISING}' must be a Denoising, got {type(denoising).__name__}")
    out["denoising"] = denoising_error(denoising.predicted, denoising.noise)
    loss = (two_branch_sum(cfg, out) + cfg.diversity_weight * out["diversity"]
            + cfg.similarity_weight * out["similarity"] + cfg.kl_weight * out["kl"]
            + cfg.denoising_weight * out["denoising"])
    return LossOutput(loss, out)


METHODS.add(
    "dreamprvr",
    MethodSpec("dreamprvr", backbone="dreamprvr", relations="none", loss_cls=DreamPRVRLossConfig,
               objective=dreamprvr_objective, preset=PRESETS / "dreamprvr.yaml",
               needs=frozenset({"clip_frame", "raw", "query_vector", "diffusion"}),
               objectives=("msl-triplet", "infonce", "focal-query-diversity", "dreamprvr-query-similarity",
                           "dreamprvr-latent-kl", "dreamprvr-denoising")),
    "DreamPRVR: GMMFormer v2 blocks over diffusion-generated registers, NCE + triplet + text structure + KL + "
    "denoising",
)
