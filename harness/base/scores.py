"""What a score that is not a number means to every evaluator (retrieval and moments alike).

A score that is not a finite number (NaN, +inf, -inf: a diverged model) is the worst score:
never above a finite one, and tied with the other non-finite scores (ties count against the
model). It lives below harness/engine/evaluate.py and harness/engine/vcmr.py, which both rank by it.
"""

from __future__ import annotations

import torch


def worst_if_nonfinite(scores: torch.Tensor) -> torch.Tensor:
    """Scores with every NaN and +-inf replaced by -inf, the worst score."""
    worst = float("-inf")
    return scores.nan_to_num(nan=worst, posinf=worst, neginf=worst)
