"""The MS-SL method (Dong et al., ACM MM 2022): the `msl` backbone and its training loss.

loss = clip_nce_weight * clip_NCE + clip_triplet + frame_nce_weight * frame_NCE + frame_triplet
(ms-sl method/model.py: 0.02 and 0.04), NCE on raw dot products, triplets on cosines with
hard negatives from `hard_negative_epoch` on. Relations come from the configured detector;
`loss.treatment` says how its ambiguous pairs train (ignore, the default | positive | restrain:
+ clip_trip_a + frame_triplet_weight * frame_trip_a, ARL Eq. 11; methods/objectives/arl.py), or soft:
the NCE terms' text-to-video part against Holmes' soft targets (the detector's confidence in the labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch.nn.functional as F

from prvr.harness.base.checks import NON_NEGATIVE, OneOf, at_least, one_of, param, words_of
from prvr.harness.base.contract import LossOutput, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.backbones.msl import own_video_frames
from prvr.methods.objectives.arl import AS_DETECTOR_MODES, StandardTreatment, check_restrained_margin
from prvr.methods.objectives.prvr import query_matrix_nce, query_matrix_triplet, treated_two_branch, two_branch_sum
from prvr.methods.objectives.ranking import hard_pool_at
from prvr.methods.recipes import PRESETS, MethodSpec

FrameMatrix = Literal["videos", "queries"]  # loss.frame_matrix


@dataclass(frozen=True)
class _FrameMatrixCheck(OneOf):
    """One of `FrameMatrix`; `queries` only without a relation detector (its one positive per row
    is the query's own pair, so a detector's relations would not reach the frame branch)."""

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        name = getattr(getattr(cfg, "relations", None), "name", "none")
        if value == "queries" and name != "none":
            return (f"is 'queries' (the reference's query x query frame matrix, whose one positive is each query's "
                    f"own pair), which takes no relation detector (relations.name={name}); set it to videos")
        return super().problem(value, cfg)


@dataclass
class MSLLossConfig:
    margin: float = param(0.2, NON_NEGATIVE)  # ms-sl config.py --margin (ActivityNet, Charades); do_tvr.sh: 0.1
    clip_nce_weight: float = param(0.02, NON_NEGATIVE)  # ms-sl model.py forward: 0.02 * clip_nce
    frame_nce_weight: float = param(0.04, NON_NEGATIVE)  # ms-sl model.py forward: 0.04 * frame_nce
    # ours: the reference weighs the frame triplet 1; 0 together with frame_nce_weight=0 trains
    # the query vector on the clip branch alone (a diagnostic: docs/methods/ral.md)
    frame_triplet_weight: float = param(1.0, NON_NEGATIVE)
    # --hard_negative_start_epoch (of 100 epochs); -1 = never
    hard_negative_epoch: int = param(20, at_least(-1, "-1 = never"))
    hard_pool: int = param(20, at_least(1))  # --hard_pool_size
    # ours: the detector's ambiguous pairs: ignore (out of the negatives) | positive (join the positives) |
    # restrain (ARL Eq. 11 per branch: below the positive by margin_a, the negatives by margin) |
    # soft (text-to-video InfoNCE against Holmes' soft targets: reads the detector's confidence in the labels)
    treatment: StandardTreatment = param("ignore", one_of(StandardTreatment))
    margin_a: float = param(0.05, NON_NEGATIVE)  # m_a < margin, read with treatment=restrain
    # what the frame branch trains on: "videos" (ours: the [queries x videos] matrix the evaluation ranks,
    # every query's key clip in every video) | "queries" (the reference's: [queries x queries], query i
    # against query j's own video as j's key clip attends it; one positive per row, its own pair; its NCE
    # one softmax over row and column; no relation detector). docs/methods/msl-family.md
    frame_matrix: FrameMatrix = param("videos", _FrameMatrixCheck(words_of(FrameMatrix)))
    as_detector_modes: ClassVar[tuple[str, ...]] = AS_DETECTOR_MODES  # harness/cli/matrix.py

    def check(self, key: str) -> None:
        check_restrained_margin(self.treatment, self.margin, self.margin_a, key)


def msl_objective(cfg: MSLLossConfig, scores: Scores, relations: Relations, context: StepContext) -> LossOutput:
    hard = hard_pool_at(context.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out, positive = treated_two_branch(scores, relations.positive, relations.negative, relations.ambiguous,
                                       relations.confidence, cfg.treatment, cfg.margin, cfg.margin_a, hard,
                                       context.generator)
    if cfg.frame_matrix == "queries":  # the reference's frame branch in training (ms-sl model.py forward)
        query = context.outputs["queries"]["query"]
        frames = own_video_frames(query, context.outputs["videos"], context.video_of_query)
        out["frame_nce"] = query_matrix_nce(query @ frames.t())
        out["frame_triplet"] = query_matrix_triplet(F.normalize(query, dim=-1) @ F.normalize(frames, dim=-1).t(),
                                                    cfg.margin, hard, context.generator)
    return LossOutput(two_branch_sum(cfg, out), out)


METHODS.add(
    "msl",
    MethodSpec("msl", backbone="msl", relations="none", loss_cls=MSLLossConfig, objective=msl_objective,
               preset=PRESETS / "msl.yaml", needs=frozenset({"clip_frame", "raw"}),
               objectives=("msl-triplet", "infonce", "restrained-triplet", "soft-infonce", "query-matrix-nce",
                           "query-matrix-triplet")),
    "MS-SL: multi-scale clip proposals + key-clip frame attention, NCE + triplet on one-to-one labels",
)
