"""A command of the suite run as an unprivileged user, for the tests of what it may write.

Root may write anywhere, so a read-only folder stops nothing when the tests run as root (as CI runs
them), and those checks were skipped there. `main_as` runs `prvr-bench ARGV` in a child of the test
process (os.fork, so the interpreter need not be startable by that user: the standard library may lie
under root's home, 0o700) whose effective user and group are 65534 ('nobody') and which has no
supplementary groups: every file it opens, creates or renames is checked as that user's. Imports alone
run as root (the interpreter's own files; `_imports_as_root`), nothing the command writes does. The
child works in `cwd`: give paths under it relative to it, so the user needs no access to the folders
above (pytest's temporary root is 0o700) and `cwd` only needs to be searchable (0o711).
"""

from __future__ import annotations

import builtins
import importlib
import io
import json
import os
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

NOBODY = 65534  # 'nobody' and 'nogroup' on Debian, Ubuntu, Alpine and Fedora alike
TIMEOUT_S = 120.0


@dataclass
class Outcome:
    code: int | str  # the exit code main returned, or "exception" (the traceback is then in err)
    out: str
    err: str


def can_drop() -> bool:
    """Whether this process can run a child as another user: root, on a system with fork."""
    return hasattr(os, "fork") and hasattr(os, "geteuid") and os.geteuid() == 0


def give_to_nobody(path: Path) -> None:
    """`path` and everything under it owned by the unprivileged user (as the user's own folder is)."""
    for p in [path, *path.rglob("*")]:
        os.chown(p, NOBODY, NOBODY, follow_symlinks=False)


def main_as(argv: list[str], cwd: Path) -> Outcome:
    """`main(argv)` in a forked child whose effective uid and gid are 65534, working in `cwd`; skips the
    test where the privileges cannot be dropped (no root, no fork, a container that forbids setgroups)."""
    if not can_drop():
        pytest.skip("running a command as uid 65534 needs root and os.fork")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        result: dict[str, object] = {}
        try:
            result = _child(argv, cwd)
        except BaseException as err:  # noqa: B902 - reported to the parent, whatever it is
            result = {"setup": f"{type(err).__name__}: {err}"}
        finally:
            os.write(write, json.dumps(result).encode())
            os._exit(0)
    os.close(write)
    data = _read_all(read, pid)
    os.waitpid(pid, 0)
    result = json.loads(data or b"{}")
    if "setup" in result:
        pytest.skip(f"cannot run a command as uid {NOBODY} here ({result['setup']}), so a read-only folder "
                    "cannot be tested as root")
    return Outcome(result["code"], result["out"], result["err"])


def _child(argv: list[str], cwd: Path) -> dict[str, object]:
    from prvr.harness.cli import main

    os.chdir(cwd)
    os.setgroups([])
    os.setegid(NOBODY)
    os.seteuid(NOBODY)  # the real and saved uid stay 0: only imports take root back (_imports_as_root)
    if (os.geteuid(), os.getegid()) != (NOBODY, NOBODY) or os.getgroups():
        raise PermissionError(f"still uid {os.geteuid()} gid {os.getegid()} groups {os.getgroups()}")
    _imports_as_root()
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        code: int | str = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else str(e.code)
    except BaseException:  # noqa: B902 - a traceback is what the test must see
        code = "exception"
        sys.stderr.write(traceback.format_exc())
    return {"code": code, "out": sys.stdout.getvalue(), "err": sys.stderr.getvalue()}


def _imports_as_root() -> None:
    """Each import (outermost call only: an import inside an import keeps root) takes the effective uid
    0 back while the interpreter reads the module's files, then drops it again."""
    depth = [0]

    def as_root(fn):
        def wrapped(*args, **kwargs):
            if depth[0] == 0:
                os.seteuid(0)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    os.seteuid(NOBODY)
        return wrapped

    builtins.__import__ = as_root(builtins.__import__)
    importlib.import_module = as_root(importlib.import_module)


def _read_all(fd: int, pid: int) -> bytes:
    """The child's report; a child that hangs is killed after TIMEOUT_S and the test fails."""
    data = b""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the command as uid {NOBODY} did not finish in {TIMEOUT_S:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                return data
            data += chunk
    finally:
        os.close(fd)
