"""A method is a named recipe: backbone + relation detector + objectives + defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

PRESETS = Path(__file__).parent / "presets"


@dataclass(frozen=True)
class MethodSpec:
    """What `--method NAME` means.

    objective(loss_cfg, scores, relations, context) -> dict with `loss` and its named parts;
    context carries the epoch and a torch.Generator for sampling.
    """

    name: str
    backbone: str
    relations: str
    loss_cls: type
    objective: Callable[..., dict[str, Any]]
    preset: Path | None = None
    sections: dict[str, type] = field(default_factory=dict)
