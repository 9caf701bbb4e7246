"""Named timing phases stored in each run record."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class Timings:
    """Accumulates wall-clock seconds per named phase (a phase may run many times)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}
