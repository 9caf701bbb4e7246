"""A CPU run's host allocator: freed memory kept in the process for the next step to reuse.

glibc's malloc serves a block above its mmap threshold (128 KiB at first, rising with the blocks
freed, at most 32 MiB) with its own mmap and gives it back at free. A training step on the CPU
makes many such temporaries (a [Q, V, L, T] similarity chunk, a [Q L, d] gradient, dropout masks),
so every step gets fresh pages that the kernel must zero and fault in on first touch: on sim-tvr-v2
half of MS-SL's page faults and most of its system time (docs/speed.md, "The host allocator"). With
mmap off for the allocator and the heap's top kept (mallopt's M_MMAP_MAX 0, M_TRIM_THRESHOLD 1 GiB),
a freed block stays in the heap and the next step's block of that size reuses its pages.

The arithmetic is the same (the same kernels on the same values; only where the bytes live
changes), so the figures are too; the peak resident set can grow by what the heap keeps
fragmented. `PRVR_MALLOC=system` leaves glibc's own policy. Elsewhere than glibc (musl, macOS)
nothing is changed, and `keep_freed_memory` says so.
"""

from __future__ import annotations

import ctypes
import os
import platform

from prvr.harness.base.io import UserError

MALLOC_ENV = "PRVR_MALLOC"  # "keep" (the default for a run on the CPU) or "system"
CHOICES = ("keep", "system")
# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
KEPT_TOP = 1 << 30  # free memory at the heap's top kept before it is given back
TOP_PAD = 64 << 20  # the heap grows by at least this much at once

_done: str | None = None


def malloc_choice() -> str:
    """$PRVR_MALLOC, checked: one line naming the variable and the values it takes."""
    value = os.environ.get(MALLOC_ENV, "keep").strip() or "keep"
    if value not in CHOICES:
        raise UserError(f"{MALLOC_ENV}={value[:40]!r} is not a host allocator policy: set it to "
                        f"{' or '.join(CHOICES)} (keep: freed memory stays in the process for reuse; "
                        "system: glibc's own policy), or unset it")
    return value


def keep_freed_memory() -> str:
    """Set this process's malloc to keep freed memory for reuse (once; the data loader's worker
    processes, forked later, inherit it). Returns what holds now, for the run's log and tests."""
    global _done
    choice = malloc_choice()
    if _done is not None:
        return _done
    if choice == "system":
        _done = "system (glibc's own policy: PRVR_MALLOC=system)"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _done = f"system (no glibc here: {platform.system()} {platform.libc_ver()[0] or 'another C library'})"
    else:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        # mallopt returns 1 on success; a refused parameter leaves glibc's own policy for it
        refused = [name for name, p, v in (("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, KEPT_TOP), ("M_TOP_PAD", M_TOP_PAD, TOP_PAD),
                                           ("M_MMAP_MAX", M_MMAP_MAX, 0)) if mallopt(p, v) != 1]
        _done = "keep (freed memory reused: no mmap per block)" if not refused else \
            f"partly kept (mallopt refused {', '.join(refused)}: glibc's own policy for it)"
    return _done
