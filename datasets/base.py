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
    split_loader: Callable[..., Split | None] | None = None  # (cfg, split): one split, reading only its files

    def load(self, cfg) -> PRVRData:
        return selection.apply(self.loader(cfg), cfg)

    def load_test(self, cfg) -> Split | None:
        """The test split alone, as `load(cfg)["test"]` gives it (the selection re-makes only train and
        val): through `split_loader` where the dataset has one (a simulated world's cache entry reads
        and checks the test split's files only), else the whole dataset."""
        if self.split_loader is not None:
            return self.split_loader(cfg, "test")
        return self.load(cfg).splits.get("test")
