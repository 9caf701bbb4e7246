"""Load a real dataset: validate its layout once, keep the result in the cache, memory-map it.

The first load reads the whole layout (captions, query features, video2frames, a NaN scan
of the video features, the timestamp join) and writes what is slow to redo into a cache
entry: per split the index arrays, the texts and the token features as one raw float32
file (XML layout: the video rows too). The entry is built in a temporary folder and renamed
into place only when the layout passed validation, so nothing is cached from a layout
that failed. It is keyed by the size and modification time of every input file and by the
options that change the result; a changed input file gives a new entry.

The manifest lists every file of the entry with its size and SHA-256 digest, and the
absolute path of feature.bin (MS-SL layout: the rows stay in the user's file, checked by
size here and by size and mtime through the key). Every load reads the entry's files once
to check them (the token files dominate: a few GB at TVR size) and refuses an entry that
differs (a file missing, added or changed) with one line: it was written from a layout that
passed validation, so a difference means the disk or someone changed it, and the fix
(delete the folder, which rebuilds it) is the user's call.

Later loads memory-map feature.bin (MS-SL) and the token file: a batch reads only its own
rows, so RAM stays bounded at TVR size (about 1M frames x 3072 float32 = 12 GB).
`--set data.preload=true` copies each split's rows into RAM instead.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Literal, get_args

import numpy as np

from prvr.datasets.loader import available_ram
from prvr.datasets.real.assemble import Built
from prvr.datasets.real.bigfile import ROW_DTYPE, MappedRows
from prvr.datasets.real.export import MARKER
from prvr.datasets.real.msl import MSLLayout
from prvr.datasets.real.problems import LayoutError, Report
from prvr.datasets.real.specs import SPECS, RealSpec
from prvr.datasets.real.xml import XMLLayout
from prvr.datasets.sim.cache import CorruptCache, cache_key, cache_root, describe_files, read_manifest, verify_files
from prvr.datasets.types import PRVRData, Ragged, Split
from prvr.harness.base import progress
from prvr.harness.base.io import ensure_dir, one_at_a_time, temporary_beside, write_json

FORMAT = 2  # 2: files listed with their digests, feature.bin by its absolute path
MANIFEST = "manifest.json"
ARRAYS = ("frame_rows", "frame_offsets", "durations", "token_offsets", "query_video", "moments")
Layout = Literal["msl", "xml"]  # data.layout: the release a real dataset's files follow
OnBadRows = Literal["error", "skip"]  # data.on_bad_rows
LAYOUTS: dict[Layout, Callable[[RealSpec, Any], MSLLayout | XMLLayout]] = {"msl": MSLLayout, "xml": XMLLayout}


def make_layout(name: str, cfg) -> MSLLayout | XMLLayout:
    spec = SPECS[name]
    if cfg.data.layout not in LAYOUTS:
        raise LayoutError(f"unknown data.layout {cfg.data.layout!r}; use one of {', '.join(LAYOUTS)}")
    if cfg.data.on_bad_rows not in get_args(OnBadRows):
        raise LayoutError(f"data.on_bad_rows must be 'error' or 'skip', got {cfg.data.on_bad_rows!r}")
    return LAYOUTS[cfg.data.layout](spec, cfg)


def fingerprint(paths: list[Path]) -> list:
    out = []
    for p in paths:
        st = p.stat() if p.exists() else None
        out.append([str(p.resolve()), st.st_size if st else None, st.st_mtime_ns if st else None])
    return out


def entry_folder(name: str, cfg, layout) -> Path:
    key = cache_key({"format": FORMAT, "dataset": name, "layout": cfg.data.layout, "feature": layout.feature,
                     "on_bad_rows": cfg.data.on_bad_rows, "inputs": fingerprint(layout.inputs())})
    return cache_root(cfg.data.cache_dir) / "real" / f"{name}-{cfg.data.layout}-{key}"


def load_real(name: str, cfg) -> PRVRData:
    """The dataset from its layout under data.data_root (validated, cached, memory-mapped)."""
    layout = make_layout(name, cfg)
    folder = entry_folder(name, cfg, layout)
    with one_at_a_time(folder):  # a second run started at once waits for the first's entry, not builds its own
        if not folder.exists():
            progress.log(f"{name}: checking the {cfg.data.layout} layout at {layout.collection} (first load only)")
            _build_entry(layout, folder)
    data = read_entry(folder)
    return preload(data) if cfg.data.preload else data


def preload(data: PRVRData) -> PRVRData:
    need = sum(int(s.frames.offsets[-1]) * s.frames.dim + int(s.tokens.offsets[-1]) * s.tokens.dim
               for s in data.splits.values()) * 4
    free = available_ram()
    if free is not None and need > 0.8 * free:
        raise LayoutError(f"data.preload needs {need / 2**30:.1f} GiB of RAM and {free / 2**30:.1f} GiB are free; "
                          "drop --set data.preload=true (the memory-mapped default reads rows per batch)")
    for split in data.splits.values():
        split.frames = split.frames.in_memory(np.float32)
        split.tokens = split.tokens.in_memory(np.float32)
    return data


def _build_entry(layout, folder: Path) -> None:
    ensure_dir(folder.parent, "move the cache: --set data.cache_dir=DIR or PRVR_CACHE=DIR")
    tmp = temporary_beside(folder, folder=True)
    try:
        report = Report(strict=True)
        built = layout.build(report, tmp)
        _write(tmp, layout.spec.name, built, report)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not folder.is_dir():  # not another process's entry, renamed into place first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write(tmp: Path, name: str, built: Built, report: Report) -> None:
    for split, s in built.splits.items():
        for key in ARRAYS:
            np.save(tmp / f"{split}.{key}.npy", getattr(s, key), allow_pickle=False)
        text = {"video_ids": s.video_ids, "query_ids": s.query_ids, "query_text": s.query_text}
        (tmp / f"{split}.text.json").write_text(json.dumps(text), encoding="utf-8")
    # inside the entry: its name (the entry is renamed); outside (feature.bin): absolute, so a
    # relative --data-root or PRVR_DATA reads the same file from any working directory
    inside = built.frame_file.parent.resolve() == tmp.resolve()
    frame_file = Path(built.frame_file.name) if inside else built.frame_file.resolve()
    files = describe_files(tmp)
    write_json(tmp / MANIFEST, {
        "format": FORMAT, "dataset": name, "frames": {"file": str(frame_file), "rows": built.frame_rows, "dim": built.frame_dim},
        "tokens": {"rows": built.token_rows, "dim": built.token_dim}, "splits": list(built.splits),
        "facts": built.facts, "counts": dict(report.counts), "notes": report.notes, "files": files,
        "stats": {n: {**_split_facts(s), **_origin(built)} for n, s in built.splits.items()},
    })


def _origin(built: Built) -> dict:
    """Where an exported folder came from (runs carry it in provenance.data)."""
    marker = Path(built.facts["collection"]) / MARKER
    if not marker.is_file():
        return {}
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return {"exported_from": info.get("exported_from"), "simulated": bool(info.get("simulated"))}


def _split_facts(s) -> dict:
    return {"videos": len(s.video_ids), "queries": len(s.query_ids),
            "with_timestamps": int(np.isfinite(s.moments[:, 0]).sum())}


def read_entry(folder: Path) -> PRVRData:
    """The cached dataset; LayoutError (one line) when the entry does not match its manifest."""
    try:
        manifest = _verified_manifest(folder)
        fr = manifest["frames"]
        table = MappedRows(folder / fr["file"], (fr["rows"], fr["dim"]))  # an absolute path stays as it is
        splits = {name: _read_split(folder, name, table, manifest) for name in manifest["splits"]}
        meta = {"source": folder.name, **manifest["facts"], **manifest["stats"], "counts": manifest["counts"],
                "notes": manifest["notes"]}
    except CorruptCache as e:
        raise LayoutError(f"cache entry {folder}: {e}; delete that folder to rebuild it from the layout "
                          "(check the disk if this recurs)") from None
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise LayoutError(f"cache entry {folder}: manifest or arrays unreadable ({type(e).__name__}: {e}); "
                          "delete that folder to rebuild it from the layout") from None
    return PRVRData(manifest["dataset"], splits, meta)


def _verified_manifest(folder: Path) -> dict:
    manifest = read_manifest(folder)
    if manifest.get("format") != FORMAT:
        raise CorruptCache(f"cache format {manifest.get('format')} != {FORMAT}")
    verify_files(folder, manifest.get("files"))
    fr = manifest.get("frames") or {}
    frame_file = folder / str(fr.get("file"))
    need = int(fr.get("rows", 0)) * int(fr.get("dim", 0)) * ROW_DTYPE.itemsize
    if not frame_file.is_file():
        raise CorruptCache(f"its video features {frame_file} are missing")
    if frame_file.stat().st_size != need:
        raise CorruptCache(f"its video features {frame_file} hold {frame_file.stat().st_size} bytes, "
                           f"{need} when the entry was written")
    return manifest


def _read_split(folder: Path, name: str, table: MappedRows, manifest: dict) -> Split:
    arr = {key: np.load(folder / f"{name}.{key}.npy", allow_pickle=False) for key in ARRAYS}
    text = json.loads((folder / f"{name}.text.json").read_text(encoding="utf-8"))
    tokens = MappedRows(folder / f"{name}.tokens.f32", (manifest["tokens"]["rows"][name], manifest["tokens"]["dim"]))
    return Split(
        video_ids=text["video_ids"], frames=Ragged(table, arr["frame_offsets"], rows=arr["frame_rows"]),
        durations=arr["durations"], query_ids=text["query_ids"], query_text=text["query_text"],
        tokens=Ragged(tokens, arr["token_offsets"]), query_video=arr["query_video"], moments=arr["moments"],
    )
