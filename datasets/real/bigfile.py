"""The MS-SL family's "BigFile" video features, read through a memory map.

A feature folder holds `shape.txt` ("N D"), `id.txt` (N whitespace-separated frame ids),
`feature.bin` (N x D float32 rows in id.txt order) and `video2frames.txt` (a Python dict
literal: video id -> list of frame ids). The reference code opens feature.bin and seeks
once per frame, and runs `eval()` on video2frames.txt. Here feature.bin is one read-only
memory map (a video is a slice of it when its frames are consecutive rows) and
video2frames.txt is parsed as data: its syntax tree is checked node by node, nothing in
it ever runs.
"""

from __future__ import annotations

import array
import ast
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from prvr.datasets.real.problems import Report, layout_error
from prvr.harness.base.io import atomic_path, write_text

ROW_DTYPE = np.dtype("<f4")  # feature.bin: little-endian float32 rows
FILES = ("feature.bin", "id.txt", "shape.txt", "video2frames.txt")
# video2frames.txt quotes each frame id of id.txt once, plus a key per video; a file many
# times larger than id.txt is not a video2frames dict, and is refused before parsing.
V2F_SIZE_FACTOR = 4
V2F_SIZE_SLACK = 1 << 20


class MappedRows:
    """A read-only [N, D] array in a file, memory-mapped on first use.

    It pickles as its path (a DataLoader worker re-opens the map instead of receiving a
    copy of the whole array) and supports len, shape, dtype, slices and index arrays.
    """

    def __init__(self, path: str | Path, shape: tuple[int, int], dtype: Any = ROW_DTYPE, offset: int = 0) -> None:
        self.path, self.shape, self.dtype, self.offset = str(path), (int(shape[0]), int(shape[1])), np.dtype(dtype), offset
        self._map: np.memmap | None = None

    @classmethod
    def from_npy(cls, path: str | Path) -> "MappedRows":
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
        return cls(path, arr.shape, arr.dtype, arr.offset)

    def array(self) -> np.ndarray:
        if self._map is None:
            if self.shape[0] == 0:
                return np.zeros(self.shape, dtype=self.dtype)
            self._map = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)
        return self._map

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        return self.array()[key]

    def __array__(self, dtype=None, copy=None):
        arr = np.asarray(self.array())
        return arr.astype(dtype) if dtype is not None else arr

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None}


def read_shape(path: Path) -> tuple[int, int]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        raise missing(path) from None
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise layout_error(path, f"expected two integers 'N D', found {text[:40]!r}",
                           "write the row count and the feature dimension of feature.bin", line=1)
    n, d = int(parts[0]), int(parts[1])
    if d == 0:
        raise layout_error(path, "feature dimension is 0", "write the dimension of the features", line=1)
    return n, d


def read_ids(path: Path, expected: int) -> list[str]:
    """Frame ids in row order (the reference decodes them as ISO-8859-1)."""
    try:
        ids = [b.decode("iso-8859-1") for b in path.read_bytes().split()]
    except FileNotFoundError:
        raise missing(path) from None
    if len(ids) != expected:
        raise layout_error(path, f"holds {len(ids)} frame ids but shape.txt says {expected} rows",
                           "regenerate id.txt and shape.txt from the same feature.bin")
    if len(set(ids)) != len(ids):
        dup = next(i for i, n in Counter(ids).items() if n > 1)
        raise layout_error(path, f"frame id {dup!r} appears twice", "frame ids must be unique; regenerate id.txt")
    return ids


def check_bin(path: Path, rows: int, dim: int) -> None:
    """feature.bin must hold exactly rows x dim float32 values."""
    if not path.is_file():
        raise missing(path)
    size, row_bytes = path.stat().st_size, dim * ROW_DTYPE.itemsize
    expected = rows * row_bytes
    if size == expected:
        return
    if size < expected:
        whole = size // row_bytes
        tail = f" and {size % row_bytes} bytes of a partial row" if size % row_bytes else ""
        raise layout_error(path, f"truncated: {size} bytes hold {whole} rows{tail}, shape.txt says {rows} x {dim} "
                           f"float32 ({expected} bytes)", "download or copy feature.bin again")
    raise layout_error(path, f"{size} bytes disagree with shape.txt's {rows} x {dim} float32 ({expected} bytes)",
                       "fix shape.txt (N D of feature.bin) or use the matching feature.bin")


def parse_video2frames(path: Path, size_limit: int) -> dict[str, list[str]]:
    """Parse a video id -> [frame ids] dict literal without evaluating anything."""
    if not path.is_file():
        raise missing(path)
    size = path.stat().st_size
    if size > size_limit:
        raise layout_error(path, f"{size} bytes, more than {size_limit} (video2frames.txt lists each frame id of "
                           f"id.txt once)", "regenerate video2frames.txt for this feature folder")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise layout_error(path, f"not a Python dict literal ({e.msg})", "regenerate video2frames.txt",
                           line=e.lineno) from None
    except (RecursionError, MemoryError, ValueError):
        raise layout_error(path, "cannot be parsed as a dict literal", "regenerate video2frames.txt") from None
    body = tree.body
    if not isinstance(body, ast.Dict):
        raise layout_error(path, f"holds a {_node_name(body)}, not a dict literal {{video_id: [frame ids]}}",
                           "regenerate video2frames.txt", line=getattr(body, "lineno", 1))
    out: dict[str, list[str]] = {}
    for k, v in zip(body.keys, body.values):
        key = _string(k)
        if key is None:
            raise layout_error(path, f"a key is a {_node_name(k)}, not a quoted video id", "regenerate video2frames.txt",
                               line=getattr(k, "lineno", v.lineno))
        if not isinstance(v, (ast.List, ast.Tuple)):
            raise layout_error(path, f"the value is a {_node_name(v)}, not a list of quoted frame ids",
                               "regenerate video2frames.txt", line=v.lineno, key=key)
        frames = [_string(e) for e in v.elts]
        bad = next((e for e, frame in zip(v.elts, frames) if frame is None), None)
        if bad is not None:
            raise layout_error(path, f"a frame id is a {_node_name(bad)}, not a quoted string",
                               "regenerate video2frames.txt", line=bad.lineno, key=key)
        if key in out:
            raise layout_error(path, "video id listed twice", "keep one entry per video", line=(k or v).lineno,
                               key=key)
        out[key] = [frame for frame in frames if frame is not None]  # every one, as none is None
    return out


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _node_name(node: ast.AST | None) -> str:
    names = {ast.Call: "function call", ast.Name: "name", ast.Attribute: "attribute", ast.BinOp: "expression",
             ast.Lambda: "lambda", ast.Dict: "dict", ast.List: "list", ast.Set: "set"}
    if isinstance(node, ast.Constant):
        return f"{type(node.value).__name__} constant"
    return names.get(type(node), type(node).__name__ if node is not None else "** expansion")


def missing(path: Path) -> Exception:
    return layout_error(path, "missing", "check --data-root and the folder layout (see docs/datasets.md)")


class BigFile:
    """One validated feature folder: frame ids, the row table and the video -> frames map."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        if not folder.is_dir():
            raise layout_error(folder, "feature folder missing",
                               "check --data-root and --set data.feature (MS-SL layout: FeatureData/<feature>)")
        self.rows, self.dim = read_shape(folder / "shape.txt")
        check_bin(folder / "feature.bin", self.rows, self.dim)
        self.ids = read_ids(folder / "id.txt", self.rows)
        self.row_of = {fid: i for i, fid in enumerate(self.ids)}
        limit = V2F_SIZE_FACTOR * (folder / "id.txt").stat().st_size + V2F_SIZE_SLACK
        self.video2frames = parse_video2frames(folder / "video2frames.txt", limit)
        self.data = MappedRows(folder / "feature.bin", (self.rows, self.dim))

    def video_rows(self, video: str, report: Report) -> np.ndarray | None:
        """Rows of feature.bin for one video's frames, in video2frames order (None: a problem)."""
        path = self.folder / "video2frames.txt"
        frames = self.video2frames[video]
        if not frames:
            report.problem(path, "video has no frames", "list its frame ids or remove its captions", key=video)
            return None
        rows = [self.row_of.get(f, -1) for f in frames]
        if min(rows) < 0:
            absent = [f for f, r in zip(frames, rows) if r < 0]
            report.problem(path, f"{len(absent)} frame ids are not in id.txt (first: {absent[0]!r})",
                           "regenerate video2frames.txt from this feature folder's id.txt", key=video)
            return None
        return np.asarray(rows, dtype=np.int64)

    def nonfinite_rows(self, chunk_bytes: int = 64 << 20) -> np.ndarray:
        """Rows holding NaN or Inf, scanned in chunks (bounded memory)."""
        step = max(1, chunk_bytes // (self.dim * ROW_DTYPE.itemsize))
        bad = []
        for start in range(0, self.rows, step):
            block = np.asarray(self.data[start : start + step])
            bad.append(start + np.nonzero(~np.isfinite(block).all(axis=1))[0])
        return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


def read_frames_seek(path: str | Path, rows: np.ndarray, dim: int) -> np.ndarray:
    """The reference reader, for comparison: open, seek and read once per frame."""
    out = np.empty((len(rows), dim), dtype=np.float32)
    row_bytes = dim * 4
    for i, r in enumerate(rows):
        buf = array.array("f")
        with open(path, "rb") as f:
            f.seek(int(r) * row_bytes)
            buf.fromfile(f, dim)
        out[i] = buf
    return out


def write_bigfile(folder: Path, frame_ids: list[str], blocks, dim: int, video2frames: dict[str, list[str]]) -> None:
    """Write a feature folder: `blocks` yields [n, dim] arrays in frame-id order."""
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    with atomic_path(folder / "feature.bin") as tmp:
        with open(tmp, "wb") as f:
            for block in blocks:
                block = np.ascontiguousarray(block, dtype=ROW_DTYPE)
                f.write(block.tobytes())
                written += len(block)
    if written != len(frame_ids):
        raise ValueError(f"wrote {written} rows for {len(frame_ids)} frame ids")
    write_text(folder / "id.txt", " ".join(frame_ids) + "\n")
    write_text(folder / "shape.txt", f"{len(frame_ids)} {dim}\n")
    write_text(folder / "video2frames.txt", _dict_literal(video2frames))


def _dict_literal(video2frames: dict[str, list[str]]) -> str:
    lines = [f"{v!r}: [{', '.join(repr(f) for f in frames)}]" for v, frames in video2frames.items()]
    return "{" + ",\n ".join(lines) + "}\n"
