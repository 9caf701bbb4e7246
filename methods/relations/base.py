"""Relation detectors: for a batch, which query-video pairs are positive, which negative,
and which are neither (ambiguous). See DESIGN: the one idea that makes methods
interchangeable.

A detector is a `Detector` subclass registered in `DETECTORS`, with
- `config_cls` (optional): a dataclass of its settings, the config section `relations.<name>`;
- `needs`: the backbone outputs it reads (methods/backbones/api.py OUTPUTS; checked when the
  config resolves);
- `setup(data, plan)` once, `detect(batch, outputs)` every step, and hooks that see a
  `DetectorState` (epoch, the model, the training split), never the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import torch

from prvr.datasets.sim.world import relevant_moments
from prvr.datasets.types import PRVRData, Split
from prvr.harness.base import masks
from prvr.harness.base.batches import TrainBatch
from prvr.harness.base.checks import one_of, param
# The types a detector's seam carries live in the contract (harness/base/contract.py); importable from here too.
from prvr.harness.base.contract import DetectorState, LossOutput, Relations, StepOutputs
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import DETECTORS

OracleMode = Literal["ignore", "positive"]  # relations.oracle.mode
ORACLE_MODES: tuple[OracleMode, ...] = get_args(OracleMode)


class Detector:
    """Base detector: the one-to-one labels. Subclasses refine `detect`.

    `needs`: the backbone outputs (methods/backbones/api.py OUTPUTS) the detector reads;
    `detect` gets outputs {"queries", "videos", "scores"} (scores: the backbone's `Scores`).
    """

    needs: ClassVar[frozenset[str]] = frozenset()
    config_cls: ClassVar[type | None] = None  # its settings: section relations.<name>
    # what its relations carry beyond the labels (the matrix reads these, harness/cli/matrix.py):
    # pairs of its own (ambiguous, or positives by a mode), for a treatment to train
    finds_pairs: ClassVar[bool] = True
    # a confidence below 1 in some labelled pairs, which only `loss.treatment=soft` (Holmes' soft targets) reads
    doubts_labels: ClassVar[bool] = False
    settings: object | None  # an instance of config_cls, None without one (a subclass declares its class)

    def __init__(self, cfg: Any) -> None:  # the run's Config (harness/engine/sections.py, a floor above the parts)
        self.cfg = cfg
        # its section of the run's config; a config made for another detector (code that builds
        # detectors by hand) gives this one its defaults
        own = getattr(cfg, "detector", None)
        self.settings = None if self.config_cls is None else own if isinstance(own, self.config_cls) else self.config_cls()

    def setup(self, data: PRVRData, plan: Any = None) -> None:
        """Check that the dataset provides what the detector needs (called once). `plan`: what
        the method asks of its detector (`MethodSpec.detector_plan(loss config)`), or None."""

    def prepare(self, data: PRVRData) -> str | None:
        """Compute and cache, once before runs fan out, what `setup` would otherwise compute in
        every run (`bench --prepare-data`, and before `--jobs` / Ray); a line saying what was
        made, or None where the detector caches nothing."""
        return None

    def on_epoch_start(self, state: DetectorState) -> None:
        """Refresh per-epoch state (e.g. dataset-wide statistics)."""

    def on_step(self, state: DetectorState, step: int, out: LossOutput) -> None:
        """Called after each optimisation step."""

    def on_epoch_end(self, state: DetectorState, summary: dict) -> None:
        """Called after each epoch (after validation)."""

    def detect(self, batch: Any, outputs: StepOutputs) -> Relations:
        return Relations.one_to_one(batch.query_item, batch.videos.frames.shape[0])

    def epoch_report(self) -> dict:
        """Per-epoch facts about the detection, stored in the run record's history."""
        return {}

    def write_artifacts(self, folder: str | Path, stem: str) -> list[str]:
        """Write figures or tables next to the run record (folder/stem.*); return the file names."""
        return []


@DETECTORS.register("none", "one-to-one labels: the labelled video is positive, every other video negative")
class NoDetector(Detector):
    finds_pairs: ClassVar[bool] = False


@dataclass
class OracleConfig:
    """Section `relations.oracle`."""

    # "positive": truly relevant unlabelled pairs count as positives; "ignore": they are
    # dropped from the negatives (they arrive as the ambiguous sets)
    mode: OracleMode = param("positive", one_of(OracleMode))


def find_pairs(keys: np.ndarray, num_videos: int, queries: np.ndarray, videos: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Look (query, video) pairs up in sorted keys q * num_videos + v: ([Q, B] found, [Q, B] index
    into the keys, valid where found)."""
    want = np.asarray(queries, dtype=np.int64)[:, None] * num_videos + np.asarray(videos, dtype=np.int64)[None]
    at = np.clip(np.searchsorted(keys, want), 0, max(len(keys) - 1, 0))
    found = (keys[at] == want) if len(keys) else np.zeros(want.shape, dtype=bool)
    return found, at


def host_positive(batch: Any) -> torch.Tensor:
    """The labels' positive mask [Q, B] on the host (`Detector.detect`'s, which is on the
    device), from the labelled columns the loader described (harness/base/masks.py): what a detector
    that looks its pairs up on the host leaves out of them."""
    item = torch.from_numpy(masks.host_values(batch.query_item))
    return Relations.one_to_one(item, batch.videos.frames.shape[0]).positive


class PairMoments:
    """The truly relevant moment of every relevant (query, video) pair of a simulated split
    (datasets/sim/world.py `relevant_moments`; of a video with several matching events, the
    first), looked up for a batch: what the oracle's pairs carry to the moment losses (e.g.
    XML's NLL_2), as the SBERT detector's pairs carry their source query's moment."""

    def __init__(self, keys: np.ndarray, spans: np.ndarray, num_videos: int) -> None:
        self.keys, self.spans, self.num_videos = keys, spans, num_videos

    @classmethod
    def of_world(cls, split: Split) -> "PairMoments | None":
        found = relevant_moments(split)
        if found is None:
            return None
        query, video, spans = found
        keys = query * split.num_videos + video
        keys, first = np.unique(keys, return_index=True)  # sorted keys, the first event of each pair
        return cls(keys, spans[first], split.num_videos)

    def host_lookup(self, batch: TrainBatch) -> torch.Tensor:
        """[Q, B, 2] seconds of each (batch query, batch video) pair, NaN where not relevant, on
        the host, from the batch indices the loader described (harness/base/masks.py)."""
        q, v = masks.host_values(batch.queries.query_index), masks.host_values(batch.videos.video_index)
        found, at = find_pairs(self.keys, self.num_videos, q, v)
        out = np.full((*found.shape, 2), np.nan)
        out[found] = self.spans[at[found]]
        return torch.from_numpy(out).float()


@DETECTORS.register("oracle", "simulated ground truth: truly relevant unlabelled pairs are not negatives (upper bound)")
class OracleDetector(Detector):
    """Uses the simulated world's full relevance. `relations.oracle.mode`: 'ignore' removes
    truly relevant unlabelled videos from the negatives; 'positive' counts them as positives."""

    config_cls: ClassVar[type | None] = OracleConfig  # the contract's type: a narrower one fails RelationDetector
    settings: OracleConfig
    MODES = ORACLE_MODES

    def setup(self, data: PRVRData, plan: Any = None) -> None:
        if not data.has_ground_truth:
            raise UserError(
                f"the oracle detector needs ground-truth relevance, which dataset '{data.name}' does not have; "
                "use a simulated dataset (sim-*) or --set relations.name=none"
            )
        if self.settings.mode not in self.MODES:
            raise UserError(f"relations.oracle.mode must be one of {', '.join(self.MODES)}, "
                            f"got '{self.settings.mode}'")
        self._stats = {"pairs": 0, "unlabelled_relevant": 0}
        self._moments = PairMoments.of_world(data["train"])

    def detect(self, batch: Any, outputs: StepOutputs) -> Relations:
        """From the ground truth's host copy and the labels' (harness/base/masks.py), its masks sent
        to the device described, so that the losses read their pairs without a host sync."""
        rel = super().detect(batch, outputs)
        device = rel.positive.device
        positive, extra, count = self.host_lookup(batch)
        self._stats["pairs"] += rel.positive.numel()
        self._stats["unlabelled_relevant"] += count
        moments = None if self._moments is None else masks.to_device(self._moments.host_lookup(batch), device)
        if self.settings.mode == "positive":
            both = masks.to_device(positive | extra, device)
            return Relations(both, torch.zeros_like(both), both.float(), moments=moments)
        extra_on = masks.to_device(extra, device)
        return Relations(rel.positive, extra_on, rel.positive.float() + extra_on.float(), moments=moments)

    @staticmethod
    def host_lookup(batch: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(the labelled pairs, the truly relevant unlabelled pairs) [Q, B] bool on the host, and
        the count of the latter."""
        positive = host_positive(batch)
        extra = masks.host_copy(batch.relevant) & ~positive
        return positive, extra, int(extra.sum())

    def on_epoch_start(self, state: DetectorState) -> None:
        self._stats = {"pairs": 0, "unlabelled_relevant": 0}

    def epoch_report(self) -> dict:
        return {"unlabelled_relevant_pairs": int(self._stats["unlabelled_relevant"])}
