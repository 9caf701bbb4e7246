"""Numeric precision and determinism of a run (`train.precision`, `train.deterministic`).

fp32: every matrix product in full float32 (TF32 off on CUDA); the committed records' setting.
tf32: CUDA's TensorFloat-32 matrix products (Ampere and newer; a CUDA-only setting).
bf16: the encoders run under autocast in bfloat16; their outputs are cast back to float32,
so scores, losses and ranks are float32 as under fp32 (ties still count against the model).

Each changes the numbers, so each is recorded in the run's config and shown in the
leaderboard's budget column when it is not fp32; resume refuses a change of it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from prvr.harness.io import UserError

# cuBLAS needs a fixed workspace for deterministic matrix products (CUDA docs, "Reproducibility")
CUBLAS_WORKSPACE = ":4096:8"


def check_precision(precision: str, device: torch.device) -> None:
    """TF32 is a mode of CUDA's matrix units: on a CPU it would silently mean fp32."""
    if precision == "tf32" and device.type != "cuda":
        raise UserError(f"config key 'train.precision' is 'tf32', but the run trains on {device.type}: TF32 is a "
                        "CUDA matrix mode; use --set train.precision=fp32 (or bf16)")


def set_matmul_precision(precision: str, device: torch.device) -> None:
    """Process-wide matrix-product mode for the run's precision (TF32 only where asked)."""
    if device.type != "cuda":
        return
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def set_deterministic(on: bool, device: torch.device) -> None:
    """`train.deterministic`: deterministic kernels (and cuBLAS's fixed workspace) on CUDA; a
    CPU run is deterministic either way. Off restores torch's defaults."""
    if device.type != "cuda":
        return
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(on, warn_only=False)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def encoding(device: torch.device, precision: str) -> Iterator[None]:
    """The context the encoders run in: bfloat16 autocast under bf16, nothing otherwise."""
    if precision != "bf16":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        yield


def to_fp32(obj: Any) -> Any:
    """Encoder outputs with every half-precision float tensor cast back to float32 (dicts,
    lists and tuples walked; other values as they are)."""
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in (torch.bfloat16, torch.float16) else obj
    if isinstance(obj, dict):
        return {k: to_fp32(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_fp32(v) for v in obj)
    return obj


class Encoders:
    """Both encoders of a model in the run's precision, outputs in float32; `compile`: each
    encoder through torch.compile (dynamic shapes: batches differ in length)."""

    def __init__(self, model: torch.nn.Module, compile: bool = False) -> None:
        self.queries, self.videos = model.encode_queries, model.encode_videos
        if compile:
            self.queries = torch.compile(self.queries, dynamic=True)
            self.videos = torch.compile(self.videos, dynamic=True)

    def __call__(self, queries: Any, videos: Any, device: torch.device, precision: str) -> tuple[Any, Any]:
        with encoding(device, precision):
            q, v = self.queries(queries), self.videos(videos)
        return to_fp32(q), to_fp32(v)
