"""How a dataset is registered: a preset file and a loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prvr.datasets.types import PRVRData

PRESETS = Path(__file__).parent / "presets"


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: `load(config)` returns its PRVRData; `preset` holds its defaults."""

    name: str
    load: Callable[..., PRVRData]
    preset: Path
    simulated: bool = False
