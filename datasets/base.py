"""How a dataset is registered: a preset file and a loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prvr.datasets import selection
from prvr.datasets.types import PRVRData, Split

PRESETS = Path(__file__).parent / "presets"


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: `load(config)` returns its PRVRData (the `loader`'s, with the
    selection split checked and, with data.val_from_train, re-made: datasets/selection.py);
    `preset` holds its defaults."""

    name: str
    loader: Callable[..., PRVRData]
    preset: Path
    simulated: bool = False
    truth_loader: Callable[..., Split | None] | None = None  # (cfg): the test split's ground truth, no features

    def load(self, cfg) -> PRVRData:
        return selection.apply(self.loader(cfg), cfg)

    def load_truth(self, cfg) -> Split | None:
        """The test split's ground truth: its ids, texts, labels, moments and relevance as `load(cfg)["test"]`
        gives them (the selection re-makes only train and val), its frames and tokens possibly empty.
        Through `truth_loader` where the dataset has one (a simulated world reads it from its cache
        entry, or from a small entry of its own, without generating the world again), else the whole load."""
        if self.truth_loader is not None:
            return self.truth_loader(cfg)
        return self.load(cfg).splits.get("test")
