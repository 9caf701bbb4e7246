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

from prvr.harness.base.checks import FINITE, NON_NEGATIVE, POSITIVE, at_least, param
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.backbones.dreamprvr import DENOISING, Denoising
from prvr.methods.objectives.dreamprvr import denoising_error, latent_kl, query_similarity_preservation
from prvr.methods.objectives.prvr import focal_query_diversity, same_video_pairs, two_branch_ranking, two_branch_sum
from prvr.methods.objectives.ranking import hard_pool_at
from prvr.methods.recipes import PRESETS, MethodSpec


@dataclass
class DreamPRVRLossConfig:
    """Section `loss` (the TVR values of src/Configs/tvr.py; other datasets: methods/presets/dreamprvr.yaml)."""

    margin: float = param(0.1, NON_NEGATIVE)  # margin
    clip_nce_weight: float = param(0.05, NON_NEGATIVE)  # loss_factor[0]
    frame_nce_weight: float = param(0.04, NON_NEGATIVE)  # loss_factor[1]
    frame_triplet_weight: float = param(1.0, NON_NEGATIVE)  # ours, as GMMFormer v2's: the reference weighs it 1
    diversity_weight: float = param(8e-5, NON_NEGATIVE)  # loss_factor[2]
    diversity_margin: float = param(0.15, FINITE)  # neg_factor[0]
    diversity_alpha: float = param(32.0, POSITIVE)  # neg_factor[1]
    diversity_gamma: float = param(1.0, NON_NEGATIVE)  # neg_factor[2]: exponent of the focal factor (1 + cos)
    similarity_weight: float = param(0.01, NON_NEGATIVE)  # loss_factor[3]: query similarity preservation
    similarity_tau: float = param(0.09, POSITIVE)  # deterministic_tau: its temperature on cosines
    kl_weight: float = param(1e-4, NON_NEGATIVE)  # loss_factor[4]: the video latent's KL (L_pvs)
    denoising_weight: float = param(1e-3, NON_NEGATIVE)  # loss_factor[5]: the diffusion's noise error (L_dre)
    # hard_negative_start_epoch (of 150 epochs on TVR, 100 elsewhere); -1 = never
    hard_negative_epoch: int = param(20, at_least(-1, "-1 = never"))
    hard_pool: int = param(20, at_least(1))  # hard_pool_size


def dreamprvr_objective(cfg: DreamPRVRLossConfig, scores: Scores, relations: Relations,
                        context: StepContext) -> LossOutput:
    hard = hard_pool_at(context.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out = two_branch_ranking(scores, relations.positive, relations.negative, cfg.margin, hard, context.generator)
    queries, videos = context.outputs["queries"]["query"], context.outputs["videos"]
    pairs = same_video_pairs(relations.positive)
    out["diversity"] = focal_query_diversity(queries, pairs, cfg.diversity_margin, cfg.diversity_alpha,
                                             cfg.diversity_gamma)
    out["similarity"] = query_similarity_preservation(queries, pairs, cfg.similarity_tau)
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
