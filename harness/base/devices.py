"""The device a run uses: `train.device` (`auto`, `cpu`, `cuda`, `cuda:N`) read into a torch
device, and its name as records and tables give it. Plumbing: the trainer, the detectors that
encode on their own (the SBERT detector) and the commands all pick devices the same way.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from pathlib import Path

import torch

DEVICE_ENV = "PRVR_DEVICE"  # when set, the device that "auto" picks (the test suite sets cpu)


def pick_device(name: str) -> torch.device:
    """The device a setting names; "auto" is $PRVR_DEVICE when set, else CUDA when present."""
    if name == "auto":
        name = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"


def reset_peak_memory(device: torch.device) -> None:
    """Start a new window of the CUDA allocator's peak, after the queued work (nothing elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float | None:
    """The CUDA allocator's peak MB since `reset_peak_memory`, the queued work included; None
    elsewhere (a CPU's peak is the process's: `status_kb`, `reset_peak_rss`)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


# ----------------------------------------------------------------------------- the host's memory
def status_kb(key: str, pid: int | str = "self") -> int | None:
    """A kB figure of a process (this one by default) from /proc/PID/status (VmRSS, VmHWM, RssAnon);
    None where there is no such file or line (not Linux, a process that has ended)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def max_rss_kb(ru_maxrss: int) -> int:
    """getrusage's ru_maxrss in kB (bytes on macOS, kB on Linux)."""
    return ru_maxrss // 1024 if sys.platform == "darwin" else ru_maxrss


def lifetime_peak_kb() -> int:
    """This process's peak resident set in kB: VmHWM, else the kernel's ru_maxrss."""
    return status_kb("VmHWM") or max_rss_kb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


CLEAR_REFS = Path("/proc/self/clear_refs")  # "5" resets VmHWM (Linux 4.0+)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-resident mark of this process (VmHWM, Linux >= 4.0); False where
    it cannot be (no /proc, or a kernel that refuses the write, e.g. gVisor)."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return status_kb("VmHWM") is not None
