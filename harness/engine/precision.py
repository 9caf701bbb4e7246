"""Numeric precision and determinism of a run (`train.precision`, `train.deterministic`).

fp32: every matrix product in full float32 (TF32 off on CUDA); the committed records' setting.
tf32: CUDA's TensorFloat-32 matrix products (Ampere and newer; a CUDA-only setting).
bf16: the encoders run under autocast in bfloat16; their outputs are cast back to float32,
so scores, losses and ranks are float32 as under fp32 (ties still count against the model).

Each changes the numbers, so each is recorded in the run's config and shown in the
leaderboard's budget column when it is not fp32; resume refuses a change of it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Callable

import torch

from prvr.harness.base import progress
from prvr.harness.base.io import UserError

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
    """`train.deterministic`: deterministic kernels (and cuBLAS's fixed workspace) on CUDA. A CPU
    run is deterministic either way and gets torch's defaults, as does a CUDA run with it off, so
    that a deterministic CUDA run earlier in the same process does not carry over."""
    on = on and device.type == "cuda"
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    # warn_only: an op without a deterministic CUDA kernel warns (torch names it) instead of
    # stopping the run; the GPU check's resume row fails on such a warning
    torch.use_deterministic_algorithms(on, warn_only=True)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False
    # Attention (nn.MultiheadAttention, scaled_dot_product_attention): the fused CUDA kernels
    # may add up their backward with atomics, and under warn_only torch keeps them with a
    # warning (an H200, 2026-11-27: "Memory Efficient attention defaults to a non-deterministic
    # algorithm" in the baseline's deterministic epoch). The math kernel is matrix products and
    # a softmax, deterministic under the settings above; off gives the fused ones back.
    for enable in SDPA_FUSED:
        enable(not on)


# torch's switches of the fused attention kernels (flash, memory-efficient, cuDNN); process-wide
SDPA_FUSED = (torch.backends.cuda.enable_flash_sdp, torch.backends.cuda.enable_mem_efficient_sdp,
              torch.backends.cuda.enable_cudnn_sdp)


def set_encoders(model: torch.nn.Module, precision: str, compile: bool = False) -> torch.nn.Module:
    """Make the model's encoders run in the run's precision wherever they are called (training,
    evaluation, a detector's pass, re-evaluation): under bf16 each runs under bfloat16 autocast on
    its batch's device and returns float32; `compile` passes each through torch.compile (dynamic
    shapes: batches differ in length). The weights and their names are untouched."""
    if precision != "bf16" and not compile:
        return model  # fp32 / tf32: the encoders as they are (tf32 is a process-wide matmul mode)
    for name in ("encode_queries", "encode_videos"):
        encode = getattr(model, name)
        if precision == "bf16":
            encode = _in_bf16(encode)
        if compile:
            encode = torch.compile(encode, dynamic=True)
        setattr(model, name, encode)
    return model


# torch.compile's build caches (inductor's generated code and kernels, triton's), which torch puts in the
# system's temporary folder by default: a compiled run keeps them under the suite's cache folder instead
COMPILE_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def compile_caches_under(cache: Path) -> dict[str, str]:
    """Point torch.compile's build caches into `cache`/torch-compile/ (inductor, triton), unless the user
    set them; torch reads these variables when it compiles. Returns the variables as they now are."""
    for name in COMPILE_CACHE_ENV:
        os.environ.setdefault(name, str(cache / "torch-compile" / name.split("_")[0].lower()))
    return {name: os.environ[name] for name in COMPILE_CACHE_ENV}


def warn_where_compile_starts_cuda(device: torch.device) -> None:
    """One warning line for a compiled run on the CPU of a machine with CUDA, not yet started: torch.compile
    saves and restores CUDA's random state around each graph it compiles (torch/_dynamo/convert_frame.py,
    torch 2.11 to 2.13), which starts CUDA, so the run holds a context on a GPU that others may use
    (refused where GPUs are in exclusive-process mode). `bench --jobs` and Ray start CPU runs with no GPU
    visible; a run started alone is told how to do the same."""
    if device.type == "cpu" and torch.cuda.is_available() and not torch.cuda.is_initialized():
        progress.warn("train.compile on the CPU starts CUDA here (torch.compile saves CUDA's "
                      "random state as it compiles) and holds memory on a GPU; start the run with "
                      "CUDA_VISIBLE_DEVICES= to keep every GPU out of it")


def _in_bf16(encode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(encode)
    def run(batch: Any) -> Any:
        with torch.autocast(device_type=_device_type(batch), dtype=torch.bfloat16):
            out = encode(batch)
        return to_fp32(out)

    return run


def _device_type(batch: Any) -> str:
    """The device of a batch's first tensor (a QueryBatch's tokens, a VideoBatch's frames)."""
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


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
