"""Encoding a whole split, batch by batch, as evaluation does: the batches' encodings
concatenated, sequence dims padded to the longest. Plumbing: the evaluator, the detectors that
encode the training split (ARL's) and the analyses of stored runs all encode the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch

# items encoded at a time (memory only: the results do not depend on them, except under XML's
# model.span_padding=encoded, whose padding rows reach the longest video of each batch)
VIDEO_BATCH, QUERY_BATCH = 128, 512


def encode_batches(encode: Callable[[Any], dict[str, torch.Tensor]], batches: Iterable[Any],
                   device: torch.device) -> dict[str, torch.Tensor]:
    """Encode batches (e.g. `Batcher.in_order`) and concatenate, padding sequence dims (dim 1)
    to the longest."""
    parts = [encode(batch.to(device)) for batch in batches]
    return {k: cat_padded([p[k] for p in parts]) for k in parts[0]}


def encode_all(encode: Callable[[Any], dict[str, torch.Tensor]], make_batch: Callable[[np.ndarray], Any], n: int,
               batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Encode items 0..n-1, `batch_size` at a time (`make_batch(index)` makes each batch)."""
    return encode_batches(encode, (make_batch(np.arange(s, min(s + batch_size, n))) for s in range(0, n, batch_size)),
                          device)


def cat_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along dim 0, zero-padding dim 1 (a sequence) to the longest."""
    if tensors[0].dim() < 2:
        return torch.cat(tensors)
    longest = max(t.shape[1] for t in tensors)
    out = tensors[0].new_zeros((sum(len(t) for t in tensors), longest, *tensors[0].shape[2:]))
    start = 0
    for t in tensors:
        out[start : start + len(t), : t.shape[1]] = t
        start += len(t)
    return out
