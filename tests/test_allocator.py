"""A CPU run's host allocator (harness/base/allocator.py): freed memory is kept for reuse, the
figures are the same either way, and a bad $PRVR_MALLOC is one line. Device: CPU only (each case
runs in a process of its own, so that this one's allocator is left as it is)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# a 64 MiB block made and freed: the bytes malloc mapped for it apart from its heap, and the heap's
# free bytes after it was freed (glibc's mallinfo2: hblkhd, fordblks)
_BLOCK = """
import ctypes
import numpy as np
from prvr.harness.base.allocator import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]

info = ctypes.CDLL(None).mallinfo2
info.restype = Info
print(keep_freed_memory())
mapped = info().hblkhd
block = np.ones(16 << 20, dtype=np.float32)
print(info().hblkhd - mapped)
del block
print(info().fordblks)
"""


def _python(code: str, malloc: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PRVR_MALLOC"}
    if malloc is not None:
        env["PRVR_MALLOC"] = malloc
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(not GLIBC, reason="the policy is glibc's mallopt")
def test_a_freed_block_stays_in_the_heap_for_the_next_step():
    block = 64 << 20
    kept = _python(_BLOCK, None)
    said, mapped, free = kept.stdout.split("\n")[:3]
    assert kept.returncode == 0 and said.startswith("keep"), kept.stderr[-800:]
    assert int(mapped) == 0 and int(free) >= block  # made in the heap, and kept there when freed
    system = _python(_BLOCK, "system")
    said, mapped, free = system.stdout.split("\n")[:3]
    assert said.startswith("system") and int(mapped) >= block and int(free) < block  # glibc's own: mapped apart


def test_a_bad_policy_is_one_line_naming_the_variable_and_the_values(tmp_path):
    out = _python("", "fast\nplease", "-m", "prvr.harness.cli", "run", "--method", "baseline", "--dataset", "sim-tiny",
                  "--quiet", "--out", str(tmp_path / "out"))
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1, err
    assert "PRVR_MALLOC='fast\\nplease' is not a host allocator policy: set it to keep or system" in err
    assert not (tmp_path / "out").exists()  # nothing made


def test_a_run_gives_the_same_figures_whichever_allocator(tmp_path):
    """Where the bytes live is all the policy changes: MS-SL on sim-tiny, two epochs, both ways."""
    records = {}
    for malloc in ("keep", "system"):
        out = tmp_path / malloc
        done = _python("", malloc, "-m", "prvr.harness.cli", "run", "--method", "msl", "--dataset", "sim-tiny",
                       "--seed", "0", "--set", "train.epochs=2", "--threads", "1", "--quiet", "--out", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        records[malloc] = json.loads((out / "runs" / "sim-tiny" / "msl" / "seed0.json").read_text())
    assert records["keep"]["metrics"] == records["system"]["metrics"]
    assert records["keep"]["history"] == records["system"]["history"]  # every epoch's losses and val figures
