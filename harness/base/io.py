"""Atomic file writes and friendly errors for the files the harness owns.

A write goes to a hidden temporary beside its target, `.NAME.HOST-PID.RANDOM.tmp`, renamed
over the target once complete, so a reader never sees half a file. A writer killed
mid-write (kill -9, power loss) leaves its temporary behind; the next write into the same
folder removes it once its writer is known to be gone: written on this host, by a process
that no longer exists, and untouched for a minute. Temporaries from other hosts (a shared
folder) are left alone: their pids mean nothing here. Files get the mode the umask allows
(0o666 & ~umask), like any file the user creates.

Every file the suite writes goes through `atomic_path` (records, rankings, tables, JSON, figures,
exports, calibration, the rehearsal): its target must be a regular file or absent. A device node,
FIFO, socket, folder or symbolic link in its place is named and left alone (`check_target`), so
`--json /dev/null` never turns a device into a file; a failed write (a full disk) leaves the old
file as it was and says so in one line.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: cache entries are built without the lock
    fcntl = None  # type: ignore[assignment]

HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:40] or "host"
TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<host>\w+)-(?P<pid>\d+)\.[0-9a-f]{8}\.tmp")
STALE_AFTER_S = 60.0  # a dead writer's temporary is removed only once untouched this long


class UserError(Exception):
    """An error caused by input the user controls; the CLI prints it as one line."""


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it over `path` on success.

    A crash or exception leaves the old file (or no file) in place, never half a file. The target
    must be a regular file or absent (`check_target`); an OSError of the write (a full disk, a name
    too long) is one line naming the file and its cause.
    """
    path = Path(path)
    check_target(path)
    ensure_dir(path.parent)
    tmp_path = temporary_beside(path)
    try:
        yield tmp_path
        check_target(path)  # nothing else took its place while it was written
        os.replace(tmp_path, path)
    except OSError as e:
        raise UserError(f"cannot write {path}: {os_cause(e, path)}; nothing was replaced") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def file_kind(mode: int) -> str:
    """What a file of this `st_mode` is, in words."""
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISREG, "a file")):
        if test(mode):
            return kind
    return "not a regular file"


def check_target(path: str | Path) -> None:
    """A path the suite is about to write must be a regular file or absent: anything else (a folder,
    a FIFO, a device node, a socket, a symbolic link) is refused in one line before anything is
    written, and left as it was."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise UserError(f"cannot write {path}: {os_cause(e, path)}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path} is {file_kind(mode)}, not a regular file: nothing is written there; "
                        "give the path of a file (or of none yet)")


def temporary_beside(path: Path, folder: bool = False) -> Path:
    """Create a hidden temporary file (or folder) in `path`'s folder, named after `path` and
    this writer, with the umask's mode; stale temporaries there are removed first. A folder the
    user may not write in (read-only, another user's, a full disk) is one line naming `path`:
    every writer of the suite (files, cache entries, feature stores) starts here."""
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
        except OSError as e:
            raise UserError(f"cannot write {path}: {os_cause(e, path)}; nothing was written") from None


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries in `folder` whose writer is gone (see the module docstring)."""
    removed: list[Path] = []
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


@contextmanager
def one_at_a_time(entry: Path) -> Iterator[None]:
    """Processes that want one cache entry take turns: an advisory lock (`flock`, waited for) on
    `.locks/<kind>-<entry>.lock` in the cache folder (outside the kind's folder, which holds entries only). Two runs
    started at once on a new world or layout (a sweep's lanes, `--jobs`) would otherwise both build it, and a
    store that replaces the entry would remove it under the other's reads. Where no lock can be made (no
    `fcntl`, a cache folder this user cannot write) the block runs without it; the lock file stays, empty."""
    lock = entry.parent.parent / ".locks" / f"{entry.parent.name}-{entry.name}.lock"
    try:
        ensure_dir(lock.parent, "move the cache: --set data.cache_dir=DIR or PRVR_CACHE=DIR")
        handle = open(lock, "a")  # noqa: SIM115 (held across the yield)
    except (OSError, UserError):
        handle = None
    if handle is None or fcntl is None:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def claim(path: str | Path, what: str) -> Iterator[None]:
    """One writer at a time for `path` (e.g. a run's record): a lock file `path.lock` made
    with O_EXCL and holding this writer's host and pid. A second writer while the first is
    alive is one line naming the first; a lock whose writer is gone (on this host) is taken
    over; the lock is removed when the block ends."""
    path = Path(path)
    lock = path.parent / f"{path.name}.lock"
    made = [p for p in [lock.parent, *lock.parent.parents] if not p.exists()]  # removed again if left empty
    ensure_dir(lock.parent)
    me = f"{HOST} {os.getpid()} {time.strftime('%Y-%m-%dT%H:%M:%S')}"
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            break
        except FileExistsError:
            try:
                host, pid, since = (lock.read_text(encoding="utf-8").split() + ["?", "0", "?"])[:3]
            except OSError:
                continue  # released while we looked: try again
            if host == HOST and pid.isdigit() and not _alive(int(pid)):
                lock.unlink(missing_ok=True)  # its writer is gone (killed): take it over
                continue
            raise UserError(f"{what} is being written by another process (pid {pid} on {host}, since {since}; lock "
                            f"{lock}); wait for it to finish, or delete the lock if that process is gone") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(me)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        for folder in made:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty (the record is there), or not ours to remove
                break


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_texts(files: dict[Path, str]) -> None:
    """Several files of one output (a table's .md and .csv): every target is checked before the first is
    written, so a refused one leaves all of them as they were."""
    for path in files:
        check_target(path)
    for path, text in files.items():
        write_text(path, text)


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


# Bounds of the files the suite reads (records, configs, logs are untrusted input): the largest
# committed record is about 0.1 MB, a config a few kB.
MAX_JSON_BYTES = 64 * 2**20
MAX_TEXT_BYTES = 64 * 2**20
MAX_YAML_BYTES = 2**20
MAX_YAML_ALIASES = 100  # a YAML alias bomb expands exponentially: refused long before that


def read_text(path: str | Path, what: str, fix: str, limit: int | None = None) -> str:
    """A UTF-8 text file (a leading BOM dropped) of at most `limit` bytes (MAX_TEXT_BYTES); a
    missing, larger, unreadable or non-UTF-8 file is one line naming it, the byte offset, and `fix`."""
    path, limit = Path(path), MAX_TEXT_BYTES if limit is None else limit
    check_source(path, what, fix)
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror or type(e).__name__}); {fix}") from None
    if len(raw) > limit:
        raise UserError(f"{what} {path} is larger than {limit / 2**20:g} MB, more than such a file holds; {fix}")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                        f"{fix}") from None


def check_source(path: str | Path, what: str, fix: str) -> None:
    """A file the suite is about to read must be a regular file (a link to one is followed): a FIFO, a
    folder or a device is named as such and never opened, so reading it can neither block nor run
    without end (a FIFO given as a record, /dev/zero as a relevance file)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({os_cause(e, path)}); {fix}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path} is {file_kind(mode)}, not a regular file, so it is not read; {fix}")


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    path = Path(path)
    fix = "delete it or restore it from version control"
    text = read_text(path, what, fix, MAX_JSON_BYTES)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{what} {path} does not parse (line {e.lineno}, column {e.colno}: {e.msg}); {fix}") from None
    except RecursionError:
        raise UserError(f"{what} {path} is nested deeper than Python can read (no record of this suite is); "
                        f"{fix}") from None


def read_yaml(path: str | Path, what: str, fix: str) -> Any:
    """A YAML file read as `yaml.safe_load` reads it, but bounded (size, aliases) and strict: a
    key twice in one mapping is an error naming both lines, not the first value lost."""
    import yaml

    path = Path(path)
    text = read_text(path, what, fix, MAX_YAML_BYTES)
    try:
        return yaml.load(text, Loader=_strict_yaml_loader())  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{what} {path}{where} is not valid YAML: {getattr(e, 'problem', None) or e}; {fix}") from None


_LOADER: Any = None


def _strict_yaml_loader() -> Any:
    """yaml.SafeLoader refusing duplicate keys and more than MAX_YAML_ALIASES aliases."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class StrictLoader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise yaml.YAMLError(f"more than {MAX_YAML_ALIASES} aliases (*name): refused, as an "
                                         "alias bomb would expand without bound")
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
            seen: dict[Any, int] = {}
            self.flatten_mapping(node)
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)):
                    continue  # an unhashable or odd key fails in the base constructor as before
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key '{key}' appears twice in one mapping (lines {seen[key]} and {line}): "
                                    "the first would be lost; merge them", key_node.start_mark)
                seen[key] = line
            return super().construct_mapping(node, deep)

    _LOADER = StrictLoader
    return _LOADER


def ensure_dir(path: str | Path, fix: str = "pass another --out folder") -> Path:
    """Create a folder, answering a problem with a one-line hint (`fix`: what the user can change,
    e.g. the option or key that named the folder)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create folder {path}: {os_cause(e, path)}; {fix}") from None
    if not os.access(path, os.W_OK):
        raise UserError(f"folder {path} is not writable; {fix} or fix its permissions")
    return path


NAME_MAX = 255  # bytes of one path component on the common file systems (ext4, xfs, btrfs, APFS)


def os_cause(err: OSError, path: str | Path | None = None) -> str:
    """What an OSError means, in words: a full disk and a name too long are named as such (the
    C++ side of torch.save reports them only as 'basic_ios::clear')."""
    if err.errno == errno.ENOSPC:
        return f"the disk is full{_free_space(path)}"
    if err.errno == errno.ENAMETOOLONG:
        long = [p for p in Path(path).parts if len(p.encode()) > NAME_MAX] if path is not None else []
        which = f" ({len(long[0].encode())} bytes: {long[0][:40]}...)" if long else ""
        return f"a name in the path is longer than the file system allows ({NAME_MAX} bytes){which}"
    return err.strerror or type(err).__name__


def _free_space(path: str | Path | None) -> str:
    if path is None:
        return ""
    for folder in [Path(path), *Path(path).parents]:
        if folder.exists():
            return f" ({shutil.disk_usage(folder).free / 2**20:,.0f} MB free on the disk of {folder})"
    return ""


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
