"""Atomic file writes and friendly errors for the files the harness owns."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


class UserError(Exception):
    """An error caused by input the user controls; the CLI prints it as one line."""


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it over `path` on success.

    A crash or exception leaves the old file (or no file) in place, never half a file.
    """
    path = Path(path)
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


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
