"""The TVRetrieval / XML layout (tvr only), as the TVRetrieval repository lays out `data/`.

    <root>/tvr/data/tvr_{train,val}_release.jsonl          {vid_name, duration, ts, desc, type, desc_id}
    <root>/tvr/data/tvr_test_release.jsonl                 optional: the PRVR test split
    <root>/tvr/data/tvr_feature_release/bert_feature/query_only/tvr_query_pretrained_w_query.h5
    <root>/tvr/data/tvr_feature_release/video_feature/<file of data.feature>

PRVR splits: train = tvr_train_release, test = tvr_val_release (the public TVR test set
has no timestamps and its server is closed; MS-SL's TVR test split is this val set), val =
tvr_val_release too (the release has no third split with timestamps), unless
tvr_test_release.jsonl exists: then val = tvr_val_release and test = tvr_test_release
(what `data export --layout xml` writes).
Video features are HDF5 datasets keyed by vid_name, one row per 1.5 s clip; the loader
copies the rows the splits use into one raw file of the cache, so reading stays one
memory map. XML itself truncates videos at 100 clips; this loader keeps every row and the
shared frame handling (data.max_frames) applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from prvr.datasets.real.annotations import clip_rows, read_tvr_jsonl
from prvr.datasets.real.assemble import Built, Caption, TokenSink, assemble_split
from prvr.datasets.real.msl import collection_folder, data_root
from prvr.datasets.real.problems import Report, layout_error
from prvr.datasets.real.specs import RealSpec
from prvr.datasets.real.textdata import SKIP_HINT, H5Tokens
from prvr.datasets.types import SPLITS

FEATURE_ROOT = Path("data") / "tvr_feature_release"
QUERY_FILE = FEATURE_ROOT / "bert_feature" / "query_only" / "tvr_query_pretrained_w_query.h5"
VIDEO_FILES = {  # data.feature -> file under video_feature/ (dims: 2048 / 1024 / 3072)
    "resnet": "tvr_resnet152_rgb_max_cl-1.5.h5",
    "i3d": "tvr_i3d_rgb600_avg_cl-1.5.h5",
    "resnet_i3d": "tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-1.5.h5",
}
DEFAULT_FEATURE = "resnet_i3d"
HINT = "check --data-root (XML layout: <root>/tvr/data/... as in the TVRetrieval repository)"


class H5Frames:
    """Clip rows per vid_name from an HDF5 file, copied once into a raw float32 file."""

    def __init__(self, path: Path, on_bad_rows: str, out: Path | None) -> None:
        import h5py

        if not path.is_file():
            raise layout_error(path, "missing", HINT + "; or pick another --set data.feature=resnet|i3d|resnet_i3d")
        try:
            self.file = h5py.File(path, "r")
        except OSError as e:
            raise layout_error(path, f"not a readable HDF5 file ({e})", "re-download it") from None
        self.path, self.on_bad_rows, self.dim, self.rows_written = path, on_bad_rows, 0, 0
        self.done: dict[str, np.ndarray] = {}
        self.sink: BinaryIO | None = open(out, "wb") if out is not None else None

    def rows(self, video: str, caption: Caption, report: Report) -> np.ndarray | None:
        if video in self.done:
            return self.done[video]
        feats = self._read(video, caption, report)
        if feats is None:
            return None
        if self.sink is not None:
            self.sink.write(np.ascontiguousarray(feats, dtype="<f4").tobytes())
        rows = np.arange(self.rows_written, self.rows_written + len(feats), dtype=np.int64)
        self.rows_written += len(feats)
        self.done[video] = rows
        return rows

    def _read(self, video: str, caption: Caption, report: Report) -> np.ndarray | None:
        if video not in self.file:
            report.problem(caption.path, f"video {video!r} has no features in {self.path.name}",
                           "use the feature file that covers this split", line=caption.line)
            return None
        ds = self.file[video]
        if getattr(ds, "ndim", 0) != 2 or (self.dim and ds.shape[1] != self.dim) or ds.shape[0] == 0:
            want = f"[clips, {self.dim}]" if self.dim else "[clips, dim]"
            report.problem(self.path, f"features have shape {getattr(ds, 'shape', 'a group')}, expected {want}",
                           "regenerate the video features", key=video)
            return None
        self.dim = self.dim or int(ds.shape[1])
        feats = np.asarray(ds[()], dtype=np.float32)
        bad = ~np.isfinite(feats).all(axis=1)
        if bad.any():
            report.count("video feature rows with NaN/Inf", int(bad.sum()))
            if self.on_bad_rows != "skip":
                report.problem(self.path, f"clip row {int(np.argmax(bad))} holds NaN/Inf", SKIP_HINT, key=video)
                return None
            report.count("frames left out: NaN/Inf rows", int(bad.sum()))
            feats = feats[~bad]
            if not len(feats):
                report.count("videos left out: every frame NaN/Inf")
                return None
        return feats

    def unused(self) -> int:
        return len(set(self.file.keys()) - set(self.done))

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
        self.file.close()


class XMLLayout:
    def __init__(self, spec: RealSpec, cfg) -> None:
        if spec.name != "tvr":
            raise layout_error("--set data.layout=xml", f"the TVRetrieval layout exists for tvr only, not {spec.name}",
                               "use --set data.layout=msl")
        self.spec, self.cfg = spec, cfg
        self.collection = collection_folder(data_root(cfg), spec.name, "data")
        self.feature = cfg.data.feature or DEFAULT_FEATURE
        if self.feature not in VIDEO_FILES:
            raise layout_error("--set data.feature", f"XML video feature {self.feature!r} is unknown",
                               f"use one of {', '.join(VIDEO_FILES)}")
        self.video_file = self.collection / FEATURE_ROOT / "video_feature" / VIDEO_FILES[self.feature]
        self.query_file = self.collection / QUERY_FILE

    def split_file(self, split: str) -> Path:
        data = self.collection / "data"
        if split == "test" and not (data / "tvr_test_release.jsonl").is_file():
            return data / "tvr_val_release.jsonl"
        return data / f"tvr_{split}_release.jsonl"

    def inputs(self) -> list[Path]:
        return [*dict.fromkeys(self.split_file(s) for s in SPLITS), self.video_file, self.query_file,
                self.collection / "prvr_export.json"]

    def captions(self, split: str, report: Report) -> list[Caption]:
        path = self.split_file(split)
        if not path.is_file():
            raise layout_error(path, "missing", HINT)
        rows = clip_rows(read_tvr_jsonl(path, report).rows, report)
        out, seen = [], {}
        for r in rows:
            if r.qid in seen:
                report.problem(path, f"desc_id {r.qid} already on line {seen[r.qid]}", "desc_ids must be unique",
                               line=r.line)
                continue
            seen[r.qid] = r.line
            moment = (r.start, r.end)
            out.append(Caption(r.qid, r.sentence, r.video, path, r.line, moment, r.duration))
        return out

    def build(self, report: Report, out: Path | None) -> Built:
        if self.split_file("test") == self.split_file("val"):
            report.note("test split = tvr_val_release.jsonl (no tvr_test_release.jsonl), as MS-SL's TVR test split")
        frames = H5Frames(self.video_file, self.cfg.data.on_bad_rows, out / "frames.f32" if out is not None else None)
        tokens = H5Tokens(self.query_file, self.cfg.data.on_bad_rows, HINT)
        try:
            splits, token_rows = {}, {}
            for split in SPLITS:
                sink = TokenSink(out / f"{split}.tokens.f32" if out is not None else None)
                try:
                    splits[split] = assemble_split(self.captions(split, report), frames, tokens, sink, None, report)
                finally:
                    sink.close()
                token_rows[split] = sink.rows
            unused = frames.unused()
        finally:
            frames.close()
            tokens.close()
        facts = {"layout": "xml", "collection": str(self.collection), "video_features": str(self.video_file),
                 "query_features": str(self.query_file), "videos_without_queries": unused}
        return Built(splits, out / "frames.f32" if out is not None else self.video_file, frames.rows_written,
                     frames.dim, tokens.dim, token_rows, facts)
