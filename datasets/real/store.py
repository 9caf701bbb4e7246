"""Load a real dataset: validate its layout once, keep the result in the cache, memory-map it.

The first load reads the whole layout (captions, query features, video2frames, a NaN scan
of the video features, the timestamp join) and writes what is slow to redo into a cache
entry: per split the index arrays, the texts and the token features as one raw float32
file (XML layout: the video rows too). The entry is built in a temporary folder and renamed
into place only when the layout passed validation, so nothing is cached from a layout
that failed. It is keyed by the size and modification time of every input file and by the
options that change the result; a changed input file gives a new entry.

Later loads memory-map feature.bin (MS-SL) and the token file: a batch reads only its own
rows, so RAM stays bounded at TVR size (about 1M frames x 3072 float32 = 12 GB).
`--set data.preload=true` copies each split's rows into RAM instead.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from prvr.datasets.real.assemble import Built
from prvr.datasets.real.bigfile import ROW_DTYPE, MappedRows
from prvr.datasets.real.export import MARKER
from prvr.datasets.real.msl import MSLLayout
from prvr.datasets.real.problems import LayoutError, Report
from prvr.datasets.real.specs import SPECS
from prvr.datasets.real.xml import XMLLayout
from prvr.datasets.sim.cache import cache_key, cache_root
from prvr.datasets.types import PRVRData, Ragged, Split
from prvr.harness import progress
from prvr.harness.io import ensure_dir, write_json

FORMAT = 1
MANIFEST = "manifest.json"
ARRAYS = ("frame_rows", "frame_offsets", "durations", "token_offsets", "query_video", "moments")
LAYOUTS = {"msl": MSLLayout, "xml": XMLLayout}


def make_layout(name: str, cfg) -> MSLLayout | XMLLayout:
    spec = SPECS[name]
    if cfg.data.layout not in LAYOUTS:
        raise LayoutError(f"unknown data.layout {cfg.data.layout!r}; use one of {', '.join(LAYOUTS)}")
    if cfg.data.on_bad_rows not in ("error", "skip"):
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
    data = _read_entry(folder)
    if data is None:
        progress.log(f"{name}: checking the {cfg.data.layout} layout at {layout.collection} (first load only)")
        _build_entry(layout, folder)
        data = _read_entry(folder)
        if data is None:
            raise LayoutError(f"cache entry {folder} unreadable right after it was written; check the disk "
                              "or --set data.cache_dir")
    return preload(data) if cfg.data.preload else data


def preload(data: PRVRData) -> PRVRData:
    need = sum(int(s.frames.offsets[-1]) * s.frames.dim + int(s.tokens.offsets[-1]) * s.tokens.dim
               for s in data.splits.values()) * 4
    free = _available_ram()
    if free is not None and need > 0.8 * free:
        raise LayoutError(f"data.preload needs {need / 2**30:.1f} GiB of RAM and {free / 2**30:.1f} GiB are free; "
                          "drop --set data.preload=true (the memory-mapped default reads rows per batch)")
    for split in data.splits.values():
        split.frames = split.frames.in_memory(np.float32)
        split.tokens = split.tokens.in_memory(np.float32)
    return data


def _build_entry(layout, folder: Path) -> None:
    ensure_dir(folder.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        report = Report(strict=True)
        built = layout.build(report, tmp)
        _write(tmp, layout.spec.name, built, report)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:
            if _read_entry(folder) is None:  # not another process's complete entry either
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
    frame_file = built.frame_file if built.frame_file.parent != tmp else Path(built.frame_file.name)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
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


def _read_entry(folder: Path) -> PRVRData | None:
    """The cached dataset, or None when the entry is absent or does not match its manifest."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if manifest.get("format") != FORMAT:
        return None
    for name, size in manifest["files"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return None
    fr = manifest["frames"]
    frame_file = folder / fr["file"]  # an absolute feature.bin path stays as it is
    if not frame_file.is_file() or frame_file.stat().st_size != fr["rows"] * fr["dim"] * ROW_DTYPE.itemsize:
        return None
    table = MappedRows(frame_file, (fr["rows"], fr["dim"]))
    splits = {name: _read_split(folder, name, table, manifest) for name in manifest["splits"]}
    meta = {"source": folder.name, **manifest["facts"], **manifest["stats"], "counts": manifest["counts"],
            "notes": manifest["notes"]}
    return PRVRData(manifest["dataset"], splits, meta)


def _read_split(folder: Path, name: str, table: MappedRows, manifest: dict) -> Split:
    arr = {key: np.load(folder / f"{name}.{key}.npy", allow_pickle=False) for key in ARRAYS}
    text = json.loads((folder / f"{name}.text.json").read_text(encoding="utf-8"))
    tokens = MappedRows(folder / f"{name}.tokens.f32", (manifest["tokens"]["rows"][name], manifest["tokens"]["dim"]))
    return Split(
        video_ids=text["video_ids"], frames=Ragged(table, arr["frame_offsets"], rows=arr["frame_rows"]),
        durations=arr["durations"], query_ids=text["query_ids"], query_text=text["query_text"],
        tokens=Ragged(tokens, arr["token_offsets"]), query_video=arr["query_video"], moments=arr["moments"],
    )


def _available_ram() -> int | None:
    """RAM that can be had without swapping (Linux MemAvailable; else free pages; else unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
