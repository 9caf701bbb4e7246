"""One model's noise robustness curve (RAL paper, Fig. 5): the test split ranked once per level
with a segment of p x each video's length inserted at its start (datasets/noise.py), each level
through the suite's evaluator; the queries, which the noise leaves as they are, encoded once. The
engine's part: `prvr-bench run` records the curve of the run it trains (`metrics.noise`); the
reports and the stored curves of `evaluate --noise-levels` are harness/reports/noise.py's.
"""

from __future__ import annotations

from typing import cast

from prvr.datasets.loader import Batcher
from prvr.datasets.noise import level_key, with_noise
from prvr.harness.engine.evaluate import encode_queries, evaluate_model
from prvr.harness.engine.record_types import NoiseCurve, Recalls
from prvr.harness.engine.sections import DataConfig

SUMMARY = tuple(Recalls.__annotations__)  # R@1, R@5, R@10, R@100, SumR: a level's figures


def curve_levels(levels) -> list[float]:
    """The levels of a curve: those asked for, with 0 (the plain test split), ascending."""
    return sorted({0.0, *(float(p) for p in levels)})


def noise_curve(model, split, data_cfg: DataConfig, device, chunk: int, levels, source: str,
                plain: dict | None = None, show: bool = False) -> NoiseCurve:
    """{"source": S, "levels": {"0.0": {R@1, R@5, R@10, R@100, SumR}, "0.1": ...}}: the split
    ranked once per level with the segment inserted; level 0 is `plain` (the split's own
    metrics) where given, else the split evaluated as it is."""
    was_training = model.training
    out: dict[str, Recalls] = {}
    queries = None  # every level has the split's queries (the noise is in the videos): encoded once
    for p in curve_levels(levels):
        if p == 0.0 and plain is not None:
            metrics = plain
        else:
            noisy = with_noise(split, p, source)
            batcher = Batcher(noisy, data_cfg)
            if queries is None:
                queries = encode_queries(model, batcher, device)
            metrics = evaluate_model(model, noisy, batcher, device, chunk,
                                     f"eval test, noise {p:g} ({source})" if show else None, moments=False,
                                     queries=queries)
        out[level_key(p)] = cast(Recalls, {k: float(metrics[k]) for k in SUMMARY})  # SUMMARY: Recalls' keys
    model.train(was_training)
    return {"source": source, "levels": out}


def curve_line(curve: NoiseCurve) -> str:
    """One line for a log: SumR per level."""
    return ", ".join(f"p={float(p):g}: {m['SumR']:.1f}" for p, m in curve["levels"].items())
