"""How a dataset is registered: a preset file and a loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prvr.datasets import selection
from prvr.datasets.types import PRVRData

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

    def load(self, cfg) -> PRVRData:
        return selection.apply(self.loader(cfg), cfg)
