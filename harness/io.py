"""Atomic file writes and friendly errors for the files the harness owns.

A write goes to a hidden temporary beside its target, `.NAME.HOST-PID.RANDOM.tmp`, renamed
over the target once complete, so a reader never sees half a file. A writer killed
mid-write (kill -9, power loss) leaves its temporary behind; the next write into the same
folder removes it once its writer is known to be gone: written on this host, by a process
that no longer exists, and untouched for a minute. Temporaries from other hosts (a shared
folder) are left alone: their pids mean nothing here. Files get the mode the umask allows
(0o666 & ~umask), like any file the user creates.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:40] or "host"
TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<host>\w+)-(?P<pid>\d+)\.[0-9a-f]{8}\.tmp")
STALE_AFTER_S = 60.0  # a dead writer's temporary is removed only once untouched this long


class UserError(Exception):
    """An error caused by input the user controls; the CLI prints it as one line."""


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it over `path` on success.

    A crash or exception leaves the old file (or no file) in place, never half a file.
    """
    path = Path(path)
    ensure_dir(path.parent)
    tmp_path = temporary_beside(path)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def temporary_beside(path: Path, folder: bool = False) -> Path:
    """Create a hidden temporary file (or folder) in `path`'s folder, named after `path` and
    this writer, with the umask's mode; stale temporaries there are removed first."""
    remove_stale_temporaries(path.parent)
    while True:
        tmp = path.parent / f".{path.name}.{HOST}-{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            if folder:
                os.mkdir(tmp, 0o777)  # the kernel applies the umask
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:
            continue


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries in `folder` whose writer is gone (see the module docstring)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        m = TEMPORARY.fullmatch(entry.name)
        if m is None or m["host"] != HOST or _alive(int(m["pid"])):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER_S:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:  # another writer cleaned it first, or it is not ours to remove
            continue
        removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name == "nt":  # os.kill would terminate it; never clean there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # exists (another user's), or not a pid this system can have
    return True


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{what} {path} does not parse (line {e.lineno}, column {e.colno}: {e.msg}); "
            "delete it or restore it from version control"
        ) from None


def ensure_dir(path: str | Path) -> Path:
    """Create a folder, answering a permission problem with a one-line hint."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create folder {path}: {e.strerror}; pass another --out folder") from None
    if not os.access(path, os.W_OK):
        raise UserError(f"folder {path} is not writable; pass another --out folder or fix its permissions")
    return path


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def write_png(fig, path: str | Path) -> None:
    """A matplotlib figure as a PNG, atomically, without the version stamp (so a rebuild of
    the same figure gives the same bytes); the figure is closed."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
