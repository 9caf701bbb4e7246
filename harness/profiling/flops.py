"""FLOP counting with torch.utils.flop_counter, with the gaps torch 2.13 has on CPU closed.

The counter counts matrix products and convolutions, 2 FLOPs per multiply-add; element-wise
ops, softmax and norms are not counted. Two gaps would make attention disappear from a CPU
count:
- scaled_dot_product_attention runs as `aten._scaled_dot_product_flash_attention_for_cpu`,
  which the counter's registry lacks (it counts 0): we add formulas for it and its backward.
- under no_grad in eval mode, nn.MultiheadAttention and nn.TransformerEncoderLayer take
  fused fast paths (`_native_multi_head_attention`, `_transformer_encoder_layer_fwd`) that
  have no formula either: we count with grad enabled (no backward is run), which turns the
  fast paths off.
Any other matrix-product-like op the counter does not know makes `count_flops` fail rather
than silently undercount.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from prvr.harness.base.contract import as_backbone
from prvr.harness.profiling.subjects import Subject, fused_scores, random_queries, random_videos

aten = torch.ops.aten


def _sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """QK^T and attention x V: 2 * b * h * Lq * Lk * (d_qk + d_v)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                            **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# Formulas the torch 2.13 registry lacks (keys are op packets, as in the registry).
EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flop,
}

# Op names that do matrix-product work; one of these without a formula means an undercount.
_HEAVY = re.compile(r"attention|transformer|multi_head|(^|_)(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|einsum|"
                    r"conv\w*|convolution\w*)$")


class UncountedOpsError(RuntimeError):
    """A matrix-product-like op ran for which the flop counter has no formula."""


class OpLog(TorchDispatchMode):
    """Records the op packets that reach dispatch."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._overloadpacket)
        return func(*args, **(kwargs or {}))


@dataclass
class FlopCount:
    total: int
    by_op: dict[str, int]


def count_flops(fn: Callable[[], Any]) -> FlopCount:
    """Run `fn` once and count its FLOPs (see the module docstring for what counts)."""
    counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
    log = OpLog()
    with torch.enable_grad(), counter, log:
        fn()
    missing = sorted(str(op) for op in log.ops
                     if op not in counter.flop_registry and _HEAVY.search(str(op).split(".")[-1]))
    if missing:
        raise UncountedOpsError(
            f"the flop counter has no formula for {', '.join(missing)}: the count would be too low; "
            "add a formula to prvr.harness.profiling.flops.EXTRA_FORMULAS")
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return FlopCount(int(counter.get_total_flops()), by_op)


@dataclass
class QueryFlops:
    """FLOPs of one retrieval "query" in the papers' sense, by part."""

    query: int  # encode one query
    video: int  # encode one video
    score: int  # score the pair

    @property
    def total(self) -> int:
        return self.query + self.video + self.score


def flops_per_query(model: torch.nn.Module, subject: Subject, dims: tuple[int, int]) -> QueryFlops:
    """Count one query encoding (subject.tokens tokens), one video encoding (subject.frames
    frames, subject.clips clips) and their score, at input dims (video, query), in eval mode."""
    model.eval()
    device = next(model.parameters()).device
    queries = random_queries(1, subject.tokens, dims[1], device)
    videos = random_videos(1, subject.frames, subject.clips, dims[0], device)
    out: dict[str, Any] = {}
    backbone = as_backbone(model)
    q = count_flops(lambda: out.setdefault("q", backbone.encode_queries(queries)))
    v = count_flops(lambda: out.setdefault("v", backbone.encode_videos(videos)))
    s = count_flops(lambda: fused_scores(model, out["q"], out["v"]))
    return QueryFlops(q.total, v.total, s.total)
