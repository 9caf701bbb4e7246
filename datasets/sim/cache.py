"""On-disk cache of generated datasets, keyed by the generator's config.

An entry is a folder of .npy arrays (memory-mapped on load) plus `manifest.json`, written
last, that lists every file with its size and SHA-256 digest. The folder is built under a
temporary name and renamed into place, so a crash never leaves a half entry; processes that want one
entry take turns on a lock file (`.locks/` in the cache folder), so a second waits for the first's
entry rather than building and replacing it under the first's reads. On load the
folder must hold exactly the files its manifest lists, each with its size and digest, and
only listed files are read; an entry that fails (a file missing, changed or added) is
reported, removed and regenerated, never trusted.

The check reads every byte once per load. SHA-256 (OpenSSL, on the CPU's SHA extensions where
it has them) is the digest because it hashes about twice as fast as BLAKE2b on such CPUs
(docs/datasets.md, "Loading, memory, cache", has the cost); entries written with BLAKE2b digests before
stay valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import scipy.sparse as sp

from prvr.datasets.types import PRVRData, Ragged, Split
from prvr.harness.base.io import NAME_MAX, UserError, ensure_dir, one_at_a_time, temporary_beside, write_json

if TYPE_CHECKING:
    from _hashlib import _HashObject  # typeshed's hash object: what hashlib.file_digest makes

MANIFEST = "manifest.json"
CACHE_FORMAT = 1
DIGEST = "sha256"  # what new entries list; older entries list blake2b
DIGESTS: dict[str, Callable[[], _HashObject]] = {"sha256": hashlib.sha256,
                                                  "blake2b": lambda: hashlib.blake2b(digest_size=16)}


class CorruptCache(Exception):
    """A cache entry that does not match its manifest (the message says how)."""


def cache_root(configured: str = "") -> Path:
    """The cache folder, absolute, so that paths stored in or read from it do not depend on
    the working directory."""
    root = Path(configured or os.environ.get("PRVR_CACHE") or Path.home() / ".cache" / "prvr-bench")
    root = root.expanduser().absolute()
    too_long = [p for p in root.parts if len(p.encode()) > NAME_MAX]
    if too_long:  # any look at the folder would fail with ENAMETOOLONG
        raise UserError(f"cache folder {root}: a name in the path is longer than the file system allows "
                        f"({NAME_MAX} bytes) ({len(too_long[0].encode())} bytes: {too_long[0][:40]}...); move the "
                        "cache: --set data.cache_dir=DIR or PRVR_CACHE=DIR")
    return root


def cache_key(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_or_build(folder: Path, build: Callable[[], PRVRData], warn: Callable[[str], None]) -> PRVRData:
    """Load a valid cache entry, or build the data, store it and load it back; processes that want the same
    entry take turns (`io.one_at_a_time`; the load too: a corrupt entry is removed and built again)."""
    with one_at_a_time(folder):
        return _load_or_build(folder, build, warn)


def _load_or_build(folder: Path, build: Callable[[], PRVRData], warn: Callable[[str], None]) -> PRVRData:
    if folder.exists():
        try:
            return load(folder)
        except CorruptCache as e:
            warn(f"cache entry {folder} is corrupt ({e}); regenerating it")
            shutil.rmtree(folder, ignore_errors=True)
    data = build()
    save(data, folder)
    try:
        return load(folder)
    except CorruptCache as e:
        raise UserError(f"cache entry {folder} unreadable right after it was written ({e}); check the disk, "
                        "or move the cache with PRVR_CACHE / --set data.cache_dir") from None


def load_truth_or_build(folder: Path, split: str, build: Callable[[], Split | None],
                        warn: Callable[[str], None]) -> Split | None:
    """`split` with its frames, tokens and extras left empty (`truth_only`): its ids, texts, labels,
    moments and relevance, what a rebuilt ground truth needs. Read from the whole entry where it is
    made (that split's files read and checked); else from a small entry of its own beside it
    (`<entry>~<split>-truth`, about 1 MB where the split is hundreds), made by `build()` on first use,
    so that the next call reads it rather than generating the split again. Damage to either is said,
    and the split made again, as for any entry."""
    with one_at_a_time(folder):
        if folder.exists():
            try:
                return load_split(folder, split, features=False)
            except CorruptCache as e:
                warn(f"cache entry {folder} is corrupt ({e}); reading its {split} split's ground truth from "
                     "its own entry (the next run that loads the whole dataset makes the entry again)")

    def make() -> PRVRData:
        made = build()
        return PRVRData(folder.name, {} if made is None else {split: truth_only(made)}, {"truth_of": split})

    return load_or_build(folder.with_name(f"{folder.name}~{split}-truth"), make, warn).splits.get(split)


def truth_only(s: Split) -> Split:
    """`s` without its features: frames and tokens empty items of their widths, no extras."""
    def empty(r: Ragged) -> Ragged:
        return Ragged(np.zeros((0, r.dim), dtype=r.data.dtype), np.zeros(len(r) + 1, dtype=np.int64))

    return Split(video_ids=s.video_ids, frames=empty(s.frames), durations=s.durations, query_ids=s.query_ids,
                 query_text=s.query_text, tokens=empty(s.tokens), query_video=s.query_video, moments=s.moments,
                 relevance=s.relevance, parses=s.parses)


def load_split(folder: Path, split: str, features: bool = True) -> Split | None:
    """The entry's split `split` (None where the manifest lists no such split), from the files its
    manifest lists for it, each checked against its size and digest; the other splits' files are
    neither read nor checked. Without `features`, its ground truth alone (`truth_only`): the files
    of its frames, tokens and extras are neither read nor checked."""
    unread = (f"{split}.frames.npy", f"{split}.tokens.npy", f"{split}.extra-") if not features else ()
    manifest = _check(folder, only=f"{split}.", unread=unread)
    if split not in manifest["splits"]:
        return None
    found = _split_of(folder, manifest, split, features)
    return found if features else truth_only(found)


def save(data: PRVRData, folder: Path) -> None:
    ensure_dir(folder.parent, "move the cache: --set data.cache_dir=DIR or PRVR_CACHE=DIR")
    tmp = temporary_beside(folder, folder=True)
    try:
        for name, split in data.splits.items():
            for key, arr in _split_arrays(split).items():
                fname = f"{name}.{key}.npy"
                np.save(tmp / fname, arr, allow_pickle=False)
            (tmp / f"{name}.text.json").write_text(json.dumps(_split_text(split)), encoding="utf-8")
        write_json(tmp / MANIFEST, {"format": CACHE_FORMAT, "name": data.name, "meta": data.meta,
                                    "splits": list(data.splits), "files": describe_files(tmp)})
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load(folder: Path) -> PRVRData:
    """The entry's dataset, read from the files its manifest lists and nothing else."""
    manifest = _check(folder)
    return PRVRData(manifest["name"], {name: _split_of(folder, manifest, name) for name in manifest["splits"]},
                    manifest["meta"])


def _split_of(folder: Path, manifest: dict[str, Any], name: str, features: bool = True) -> Split:
    prefix = f"{name}."
    arrays = {f[len(prefix):-len(".npy")]: folder / f for f in manifest["files"]
              if f.startswith(prefix) and f.endswith(".npy")}
    try:
        return _read_split(folder, name, arrays, features)
    except (KeyError, ValueError, OSError) as e:  # a manifest that lists too little
        raise CorruptCache(f"split {name!r} cannot be read ({type(e).__name__}: {e})") from None


def _check(folder: Path, only: str = "", unread: tuple[str, ...] = ()) -> dict[str, Any]:
    """The entry's manifest, its files checked (only those whose names start with `only`, where
    given, and none whose names start with one of `unread`)."""
    manifest = read_manifest(folder)
    if manifest.get("format") != CACHE_FORMAT:
        raise CorruptCache(f"cache format {manifest.get('format')} != {CACHE_FORMAT}")
    if not isinstance(manifest.get("splits"), list) or not isinstance(manifest.get("meta"), dict) \
            or not isinstance(manifest.get("name"), str):
        raise CorruptCache("manifest lacks name, meta or splits")
    verify_files(folder, manifest.get("files"), only, unread)
    return manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorruptCache("manifest missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptCache(f"manifest does not parse: {e}") from None
    if not isinstance(manifest, dict):
        raise CorruptCache("manifest is not a JSON object")
    return manifest


def describe_files(folder: Path) -> dict[str, dict[str, Any]]:
    """Every file of a folder being written as an entry: its size and digest (the manifest's
    `files`)."""
    return {p.name: {"bytes": p.stat().st_size, DIGEST: file_digest(p, DIGEST)} for p in sorted(folder.iterdir())}


def verify_files(folder: Path, files: Any, only: str = "", unread: tuple[str, ...] = ()) -> None:
    """The folder holds exactly `files` (besides the manifest), each with its listed size and
    digest (of those whose names start with `only` and with none of `unread`, the files the caller
    will not read); else CorruptCache naming the first file that differs."""
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise CorruptCache("manifest lists no files")
    unlisted = sorted(set(os.listdir(folder)) - set(files) - {MANIFEST})
    if unlisted:
        raise CorruptCache(f"{unlisted[0]} is not in the manifest ({len(unlisted)} unlisted file(s))")
    for fname, info in files.items():
        if not fname.startswith(only) or (unread and fname.startswith(unread)):
            continue
        path = folder / fname
        if not path.is_file():
            raise CorruptCache(f"{fname} missing")
        if path.stat().st_size != info.get("bytes"):
            raise CorruptCache(f"{fname} has {path.stat().st_size} bytes, manifest says {info.get('bytes')}")
        algo = next((a for a in DIGESTS if a in info), None)
        if algo is None:
            raise CorruptCache(f"manifest lists no digest for {fname}")
        if file_digest(path, algo) != info[algo]:
            raise CorruptCache(f"{fname} changed since it was written ({algo} differs)")


def file_digest(path: Path, algo: str = DIGEST) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, DIGESTS[algo]).hexdigest()


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


def _read_split(folder: Path, name: str, files: dict[str, Path], features: bool = True) -> Split:
    """The split from its files; without `features`, its frames and tokens mapped but never read
    (their files unchecked: `load_split` makes them empty) and no extras."""
    def arr(key: str, mmap: bool = False) -> np.ndarray:
        return np.load(files[key], mmap_mode="r" if mmap else None, allow_pickle=False)

    text = json.loads((folder / f"{name}.text.json").read_text(encoding="utf-8"))
    relevance = None
    if "rel_indptr" in files:
        indptr, indices = arr("rel_indptr"), arr("rel_indices")
        shape = (len(text["query_ids"]), len(text["video_ids"]))
        relevance = sp.csr_matrix((np.ones(len(indices), dtype=bool), indices, indptr), shape=shape)
    extra = {k[len("extra-"):]: arr(k) for k in files if features and k.startswith("extra-")}
    return Split(
        video_ids=text["video_ids"], frames=Ragged(arr("frames", mmap=True), arr("frame_offsets")),
        durations=arr("durations"), query_ids=text["query_ids"], query_text=text["query_text"],
        tokens=Ragged(arr("tokens", mmap=True), arr("token_offsets")), query_video=arr("query_video"),
        moments=arr("moments"), relevance=relevance, parses=text["parses"], extra=extra,
    )
