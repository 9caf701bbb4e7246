"""The `holmes` detector: Holmes' query division (Li et al., ICML'26; docs/methods/holmes.md).

After a warm-up, each branch (frame, clip) reads its batch scores as Dirichlet evidence
(methods/objectives/holmes.py) and splits the queries three ways (the paper's "three-fold
principle", the reference's `pair_division`):

- uncertain: vacuity u = K / S above the largest u among the queries the branch ranks right
  (their labelled video first), that bound capped at 1 - beta;
- noisy: certain, with a labelled-pair score below the smallest among the queries ranked right
  (that bound floored at beta);
- polysemous: certain and not noisy, with an expected entropy above the batch median; merged
  into noisy. The rest are clean.

A query one branch calls noisy and the other does not call uncertain is smoothed: its labelled
pair keeps confidence 1 - smooth_beta, every other labelled pair 1. The positive and negative
pairs are the labels': what the division changes is how sure the labels are, which an objective
reads through `soft_targets` (the treatment, methods/objectives/holmes.py): Holmes' own, and the standard
objectives' (baseline, msl, gmmformer) with `loss.treatment=soft`; under any other treatment they train
as on the labels. Holmes' own method
hands the detector its warm-up and evidence temperature (`HolmesPlan`), so both agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from prvr.harness.base.checks import POSITIVE, PROBABILITY, Range, param, show
from prvr.harness.base.contract import DetectorState, Relations, StepOutputs
from prvr.harness.base.registry import DETECTORS
from prvr.methods.objectives.holmes import dirichlet_alpha, expected_entropy, uncertainty, wide
from prvr.methods.relations.base import Detector


@dataclass(frozen=True)
class WithinEpochs(Range):
    """An integer >= 0 below the run's `train.epochs`: a warm-up as long as the run would leave the
    mechanism it delays no epoch (epochs count from 0; the warm-up ends at epoch `value`)."""

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        wrong = super().problem(value, cfg)
        if wrong is None and cfg is not None and value >= cfg.train.epochs:
            return (f"must be below train.epochs ({cfg.train.epochs}): the warm-up would outlast the run and the "
                    f"query division never start, got {show(value)}")
        return wrong


WARMUP = WithinEpochs(0, integer=True, note="below train.epochs")


@dataclass
class HolmesDetectorConfig:
    """Section `relations.holmes`. With `--method holmes` the warm-up and the temperature are the
    loss section's (`HolmesPlan`); these two apply when another method uses the detector."""

    # warmup_epoch (20 of 100 in every Holmes config; the presets scale it); 0 here, the one value
    # every dataset's epochs allow
    warmup_epochs: int = param(0, WARMUP)
    evidence_tau: float = param(0.05, POSITIVE)  # edl_tau (TVR)
    division_beta: float = param(0.3, PROBABILITY)  # division_beta: caps the bounds of uncertain and noisy
    smooth_beta: float = param(0.2, PROBABILITY)  # smooth_beta: weight of the scores' softmax in a smoothed target


@dataclass(frozen=True)
class HolmesPlan:
    """What Holmes' method asks of its detector: its own warm-up and evidence temperature."""

    warmup_epochs: int
    evidence_tau: float


@dataclass
class BranchDivision:
    """One branch's three-way split of a batch's queries, as [Q] bool masks (a partition:
    uncertain, clean, noisy; polysemous is part of noisy)."""

    uncertain: torch.Tensor
    clean: torch.Tensor
    noisy: torch.Tensor
    polysemous: torch.Tensor

    def counts(self) -> dict[str, torch.Tensor]:
        """How many queries fall in each reported set (0-d tensors, on the device)."""
        return {"uncertain": self.uncertain.sum(), "noisy": self.noisy.sum(), "polysemous": self.polysemous.sum()}


def divide_queries(scores: torch.Tensor, positive: torch.Tensor, tau: float, beta: float,
                   classes: torch.Tensor | None = None) -> BranchDivision:
    """Holmes' query division on one branch's [Q, V] cosine scores (no gradients). A query is
    ranked right when its best-scoring class is one of its positives; its consensus is its mean
    positive score. Nothing is read on the host."""
    scores = wide(scores.detach())
    keep = torch.ones_like(positive) if classes is None else classes
    alpha = dirichlet_alpha(scores, tau, classes)
    best = scores.masked_fill(~keep, float("-inf")).argmax(1, keepdim=True)
    right = positive.gather(1, best).squeeze(1)
    pos = positive.float()
    consensus = (scores * pos).sum(1) / pos.sum(1).clamp(min=1)
    vacuity = uncertainty(alpha, classes)
    any_right = right.any()
    u_bound = torch.where(any_right, vacuity.masked_fill(~right, float("-inf")).amax().clamp(max=1 - beta), 1 - beta)
    c_bound = torch.where(any_right, consensus.masked_fill(~right, float("inf")).amin().clamp(min=beta), beta)
    uncertain = vacuity > u_bound
    low = ~uncertain & (consensus < c_bound)
    candidates = ~uncertain & ~low
    polysemous = candidates & (expected_entropy(alpha, classes) > expected_entropy(alpha, classes).median())
    return BranchDivision(uncertain, candidates & ~polysemous, low | polysemous, polysemous)


def smoothed_queries(frame: BranchDivision, clip: BranchDivision) -> torch.Tensor:
    """[Q] the queries whose labels Holmes smooths: noisy on one branch and not uncertain on the other."""
    return (frame.noisy & ~clip.uncertain) | (clip.noisy & ~frame.uncertain)


COUNTED = ("queries", "smoothed", *(f"{b}_{k}" for b in ("frame", "clip") for k in ("uncertain", "noisy", "polysemous")))


@DETECTORS.register("holmes", "Holmes' query division: labels of queries one branch finds noisy lose confidence")
class HolmesDetector(Detector):
    needs: ClassVar[frozenset[str]] = frozenset({"clip_frame"})
    config_cls: ClassVar[type | None] = HolmesDetectorConfig
    finds_pairs: ClassVar[bool] = False  # the labels' pairs, no ambiguous one
    doubts_labels: ClassVar[bool] = True  # a smoothed query's labelled pair: confidence 1 - smooth_beta
    settings: HolmesDetectorConfig

    def setup(self, data: Any, plan: Any = None) -> None:
        s = self.settings
        self.plan = plan if isinstance(plan, HolmesPlan) else HolmesPlan(s.warmup_epochs, s.evidence_tau)
        self.active = False
        self.counts: dict[str, torch.Tensor] = {}

    def on_epoch_start(self, state: DetectorState) -> None:
        self.active = state.epoch >= self.plan.warmup_epochs
        self.counts = {k: torch.zeros((), dtype=torch.long, device=state.device) for k in COUNTED}

    def detect(self, batch: Any, outputs: StepOutputs) -> Relations:
        labels = super().detect(batch, outputs)
        if not self.active:
            return labels
        branches = outputs["scores"].branches
        frame, clip = (divide_queries(branches[b], labels.positive, self.plan.evidence_tau,
                                      self.settings.division_beta) for b in ("frame", "clip"))
        smoothed = smoothed_queries(frame, clip)
        trust = 1 - self.settings.smooth_beta * smoothed.float()
        self._count(len(smoothed), smoothed, frame, clip)
        return Relations(labels.positive, labels.ambiguous, labels.positive.float() * trust[:, None])

    def _count(self, queries: int, smoothed: torch.Tensor, frame: BranchDivision, clip: BranchDivision) -> None:
        if not self.counts:  # detect without on_epoch_start (a test's single call)
            self.counts = {k: torch.zeros((), dtype=torch.long, device=smoothed.device) for k in COUNTED}
        self.counts["queries"] += queries
        self.counts["smoothed"] += smoothed.sum()
        for name, division in (("frame", frame), ("clip", clip)):
            for k, count in division.counts().items():
                self.counts[f"{name}_{k}"] += count

    def epoch_report(self) -> dict:
        """Whether the division ran, and the share of the epoch's queries in each set."""
        n = int(self.counts["queries"]) if self.counts else 0
        shares = {k: int(v) / n for k, v in self.counts.items() if k != "queries"} if n else {}
        return {"active": self.active, **shares}
