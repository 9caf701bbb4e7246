"""On-disk cache of generated datasets, keyed by the generator's config.

An entry is a folder of .npy arrays (memory-mapped on load) plus `manifest.json`, written
last, that lists every file with its size and BLAKE2 digest. The folder is built under a
temporary name and renamed into place, so a crash never leaves a half entry. On load every
file is checked against the manifest; an entry that fails is reported, removed and
regenerated, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from prvr.datasets.types import PRVRData, Ragged, Split
from prvr.harness.io import ensure_dir, write_json

MANIFEST = "manifest.json"
CACHE_FORMAT = 1


class CorruptCache(Exception):
    pass


def cache_root(configured: str = "") -> Path:
    return Path(configured or os.environ.get("PRVR_CACHE") or Path.home() / ".cache" / "prvr-bench")


def cache_key(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_or_build(folder: Path, build: Callable[[], PRVRData], warn: Callable[[str], None]) -> PRVRData:
    """Load a valid cache entry, or build the data, store it and load it back."""
    if folder.exists():
        try:
            return load(folder)
        except CorruptCache as e:
            warn(f"cache entry {folder} is corrupt ({e}); regenerating it")
            shutil.rmtree(folder, ignore_errors=True)
    data = build()
    save(data, folder)
    return load(folder)


def save(data: PRVRData, folder: Path) -> None:
    ensure_dir(folder.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        files: dict[str, Any] = {}
        for name, split in data.splits.items():
            for key, arr in _split_arrays(split).items():
                fname = f"{name}.{key}.npy"
                np.save(tmp / fname, arr, allow_pickle=False)
            (tmp / f"{name}.text.json").write_text(json.dumps(_split_text(split)), encoding="utf-8")
        for path in sorted(tmp.iterdir()):
            files[path.name] = {"bytes": path.stat().st_size, "blake2b": _digest(path)}
        write_json(tmp / MANIFEST, {"format": CACHE_FORMAT, "name": data.name, "meta": data.meta,
                                    "splits": list(data.splits), "files": files})
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load(folder: Path) -> PRVRData:
    manifest = _check(folder)
    splits = {}
    for name in manifest["splits"]:
        arr = {p.name.split(".")[1]: p for p in folder.glob(f"{name}.*.npy")}
        splits[name] = _read_split(folder, name, arr)
    return PRVRData(manifest["name"], splits, manifest["meta"])


def _check(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorruptCache("manifest missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptCache(f"manifest does not parse: {e}") from None
    if manifest.get("format") != CACHE_FORMAT:
        raise CorruptCache(f"cache format {manifest.get('format')} != {CACHE_FORMAT}")
    for fname, info in manifest["files"].items():
        path = folder / fname
        if not path.exists():
            raise CorruptCache(f"{fname} missing")
        if path.stat().st_size != info["bytes"]:
            raise CorruptCache(f"{fname} has {path.stat().st_size} bytes, manifest says {info['bytes']}")
        if _digest(path) != info["blake2b"]:
            raise CorruptCache(f"{fname} checksum mismatch")
    return manifest


def _digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _split_arrays(s: Split) -> dict[str, np.ndarray]:
    out = {
        "frames": s.frames.data, "frame_offsets": s.frames.offsets,
        "tokens": s.tokens.data, "token_offsets": s.tokens.offsets,
        "durations": s.durations, "query_video": s.query_video, "moments": s.moments,
    }
    if s.relevance is not None:
        rel = sp.csr_matrix(s.relevance, dtype=bool)
        out.update(rel_indptr=rel.indptr.astype(np.int64), rel_indices=rel.indices.astype(np.int64))
    for key, value in s.extra.items():
        if isinstance(value, np.ndarray):
            out[f"extra-{key}"] = value
    return out


def _split_text(s: Split) -> dict[str, Any]:
    return {"video_ids": s.video_ids, "query_ids": s.query_ids, "query_text": s.query_text, "parses": s.parses}


def _read_split(folder: Path, name: str, files: dict[str, Path]) -> Split:
    def arr(key: str, mmap: bool = False) -> np.ndarray:
        return np.load(files[key], mmap_mode="r" if mmap else None, allow_pickle=False)

    text = json.loads((folder / f"{name}.text.json").read_text(encoding="utf-8"))
    relevance = None
    if "rel_indptr" in files:
        indptr, indices = arr("rel_indptr"), arr("rel_indices")
        shape = (len(text["query_ids"]), len(text["video_ids"]))
        relevance = sp.csr_matrix((np.ones(len(indices), dtype=bool), indices, indptr), shape=shape)
    extra = {k[len("extra-"):]: arr(k) for k in files if k.startswith("extra-")}
    return Split(
        video_ids=text["video_ids"], frames=Ragged(arr("frames", mmap=True), arr("frame_offsets")),
        durations=arr("durations"), query_ids=text["query_ids"], query_text=text["query_text"],
        tokens=Ragged(arr("tokens", mmap=True), arr("token_offsets")), query_video=arr("query_video"),
        moments=arr("moments"), relevance=relevance, parses=text["parses"], extra=extra,
    )
