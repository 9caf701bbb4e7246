"""ARL: ambiguity-restrained representation learning (Cho et al., AAAI'25; docs/references.md).

Recipe: backbone `arl` (two identical streamlined encoders theta and Phi, scores averaged,
Eq. 1-3, 13) + detector `arl` (Eq. 4-7, cross-model hand-off) + the objective below:

    per branch b:  L_b = L^video_b + frame_weight * L^frame_b
    L^video = lambda_nce * L_nce (Eq. 8-10) + L_a^trip (Eq. 11) + L_n^trip (Eq. 12)
    L^frame = the same over text-frame pairs (lambda_nce shared)

During the first `warmup_epochs` the ambiguous sets are not used (standard triplet +
InfoNCE on the labels, paper "Warmup Phase"). The objective takes any detector's relations:
with the `oracle` detector (mode `ignore`, set in the preset) the truly relevant unlabelled
pairs arrive as the ambiguous sets. Knobs live in the `loss` section (`ArlConfig`); the ARL
detector gets the variant and warm-up from them as its plan (`arl_plan`), so that a variant
means the same thing to both. The detector's own settings: section `relations.arl`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prvr.harness.base.checks import NON_NEGATIVE, POSITIVE, at_least, one_of, param, require
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import METHODS
from prvr.methods.backbones.arl import BRANCHES
from prvr.methods.objectives.arl import TREATMENTS, LossWeights, Treatment, frame_loss, video_loss
from prvr.methods.objectives.ranking import hard_pool_at
from prvr.methods.recipes import PRESETS, AblationRow, AblationTable, MethodSpec, register_table
from prvr.methods.relations.arl import DEFAULT_WARMUP, VARIANTS, ArlPlan, VariantName, branch_relations


@dataclass
class ArlConfig:
    """ARL's method knobs (config section `loss`). Per-dataset values: methods/presets/arl.yaml."""

    variant: VariantName = param("full", one_of(VariantName))  # Table 5 rows a-e: base | tv_only | tv_tf | tv_cross | full
    treatment: Treatment = param("restrain", one_of(Treatment))  # Table 6: restrain (ARL) | positive | ignore
    # open ("a few epochs"): 3 of the 12 sim epochs, 5 of 100 on real data (preset)
    warmup_epochs: int = param(DEFAULT_WARMUP, at_least(0))
    # lambda_nce (GMMFormer's TVR NCE factor 0.05; ActivityNet / Charades 0.02)
    lambda_nce: float = param(0.05, NON_NEGATIVE)
    # open (Eq. 8 shows none): logits = cosine / 0.05, as the harness baseline
    temperature: float = param(0.05, POSITIVE)
    margin: float = param(0.1, POSITIVE)  # m (GMMFormer TVR 0.1; ActivityNet / Charades 0.2)
    # m_a < m, open: m / 2, halfway between "no constraint" and a negative's margin
    margin_a: float = param(0.05, NON_NEGATIVE)
    frame_weight: float = param(1.0, NON_NEGATIVE)  # open: the paper adds L^frame to L^video without a weight
    # triplet samples from the top `hard_pool` from this epoch; -1 = never (GMMFormer TVR: 30 of 100)
    hard_negative_epoch: int = param(6, at_least(-1, "-1 = never"))
    hard_pool: int = param(20, at_least(1))  # MS-SL / GMMFormer: 20

    def check(self, key: str) -> None:
        require(self.margin_a < self.margin, f"ARL needs {key}.margin_a < {key}.margin (Eq. 11-12), "
                                             f"got {self.margin_a} and {self.margin}")


def check(cfg: ArlConfig) -> None:
    """The objective's own guard, for configs built in code (resolve checks the same knobs)."""
    if cfg.variant not in VARIANTS:
        raise UserError(f"loss.variant must be one of {', '.join(VARIANTS)}, got '{cfg.variant}'")
    if cfg.treatment not in TREATMENTS:
        raise UserError(f"loss.treatment must be one of {', '.join(TREATMENTS)}, got '{cfg.treatment}'")
    cfg.check("loss")


def arl_objective(cfg: ArlConfig, scores: Scores, relations: Relations, context: StepContext) -> LossOutput:
    """Sum over branches of L^video (+ L^frame with T-F), each branch with its own relations."""
    check(cfg)
    variant = VARIANTS[cfg.variant]
    use_sets = variant.text_video and context.epoch >= cfg.warmup_epochs
    hard = hard_pool_at(context.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    weights = LossWeights(cfg.lambda_nce, cfg.temperature, cfg.margin, cfg.margin_a, hard)
    branches = [b for b in BRANCHES if b in scores.branches]
    if not branches:
        raise UserError("the ARL objective needs the `arl` backbone (scores per branch theta / phi)")
    frame_mask = context.outputs["videos"]["frame_mask"]
    out: dict[str, torch.Tensor] = {}
    total = scores.fused.sum() * 0
    for b in branches:
        rel = branch_relations(relations, b)
        amb = rel.ambiguous if use_sets else torch.zeros_like(rel.ambiguous)
        video = video_loss(scores.branches[b], rel.positive, amb, ~(rel.positive | amb), weights, cfg.treatment,
                           context.generator)
        parts = {f"{b}_{k}": v for k, v in video.items() if k != "loss"}
        total = total + video["loss"]
        if variant.text_frame and use_sets:
            frame_amb = getattr(rel, "frame_ambiguous", None)
            if frame_amb is None:  # a detector without text-frame sets: lift its text-video sets
                frame_amb = amb[:, :, None] & frame_mask[None]
            frame = frame_loss(scores.items[b], frame_mask, rel.positive, frame_amb, weights,
                               cfg.treatment, context.generator)
            parts.update({f"{b}_frame_{k}": v for k, v in frame.items() if k != "loss"})
            total = total + cfg.frame_weight * frame["loss"]
        out.update(parts)
    return LossOutput(total, out)


def arl_plan(cfg: ArlConfig) -> ArlPlan:
    """The detector's plan from the method's own knobs: the same variant and warm-up as the objective."""
    check(cfg)
    return ArlPlan(VARIANTS[cfg.variant], cfg.warmup_epochs)


METHODS.add(
    "arl",
    MethodSpec("arl", backbone="arl", relations="arl", loss_cls=ArlConfig, objective=arl_objective,
               preset=PRESETS / "arl.yaml", detector_plan=arl_plan,
               needs=frozenset({"theta_phi", "frame_items", "frame_mask"}), objectives=("arl-video", "arl-frame"),
               base_row="base", treatment_row="tv_only"),
    "ARL: ambiguity-restrained learning (uncertainty + similarity detection, cross-model, dual triplet)",
)

# Paper Table 5 (components) and Table 6 (use of the ambiguous sets) as one command each:
# `prvr-bench ablate --method arl --table 5`. Row (e) / "restrain" is the plain `arl` run.
register_table(AblationTable("arl", "5", "ARL Table 5: components", ("T-V", "T-F", "C.L"), (
    AblationRow("(a)", "base", ("loss.variant=base",), ("", "", "")),
    AblationRow("(b)", "tv_only", ("loss.variant=tv_only",), ("✓", "", "")),
    AblationRow("(c)", "tv_tf", ("loss.variant=tv_tf",), ("✓", "✓", "")),
    AblationRow("(d)", "tv_cross", ("loss.variant=tv_cross",), ("✓", "", "✓")),
    AblationRow("(e)", "", ("loss.variant=full",), ("✓", "✓", "✓")),
)))
register_table(AblationTable("arl", "6", "ARL Table 6: use of the ambiguous sets", ("A",), (
    AblationRow("positive", "positive", ("loss.treatment=positive",), ("Positive",)),
    AblationRow("ignore", "ignore", ("loss.treatment=ignore",), ("Ignore",)),
    AblationRow("restrain", "", ("loss.treatment=restrain",), ("Ours (restrain)",)),
), reference="restrain"))
