"""The TVRetrieval / XML layout: TVR, and Charades-STA and DiDeMo for moment retrieval.

    <root>/<c>/data/<p>_{train,val,test}_release.jsonl      {vid_name, duration, ts, desc, desc_id} per line
    <root>/<c>/data/<p>_feature_release/bert_feature/query_only/<p>_query_pretrained_w_query.h5   key str(desc_id)
    <root>/<c>/data/<p>_feature_release/video_feature/<file of data.feature>                      key vid_name

<c> is the dataset (tvr, charades-sta, didemo), <p> TVRetrieval's `dset_name` for it (tvr,
charades_sta, didemo). TVRetrieval publishes TVR's files; for Charades-STA and DiDeMo its
code knows the names and clip lengths (3 s, 2.5 s) but no files were released, so their files
follow TVR's pattern (video file named by clip length: `cl-3.0`, `cl-2.5`). Video features
are HDF5 datasets keyed by vid_name, one row per clip; the loader copies the rows the splits
use into one raw file of the cache, so reading stays one memory map. XML truncates videos at
`max_ctx_l` clips; this loader keeps every row and the shared frame handling (data.max_frames)
applies.

Splits: a split whose file is absent is served by a stand-in, with a note. TVR: test =
tvr_val_release (the public TVR test set has no timestamps; MS-SL's TVR test split is this
val set) unless tvr_test_release.jsonl exists. Charades-STA has no val split: val = test
unless charades_sta_val_release.jsonl exists. `data export --layout xml` writes all three.

DiDeMo rows: `ts` is one [st, ed] per annotator in seconds (TVRetrieval's convention for
DiDeMo), and the moment is the span at least two annotators agree on (didemo.py's rule; none:
no timestamps, counted); a flat [st, ed] is taken as the agreed span itself (what export
writes). Where no didemo_<split>_release.jsonl exists, the original LocalizingMoments
`<split>_data.json` in the same folder is read instead: 5-second segment indices, converted to
seconds as didemo.py states, the query key being its annotation_id.

Timestamps are clipped to the video as annotations.py does (end past the duration, start
before 0: clipped and counted). For the moment retrieval datasets a moment wholly outside its
video (start at or after the end of the video) is a problem naming the file, line and desc_id:
the moment is what they train and test, and such a row means a wrong duration or video.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from prvr.datasets.real import annotations as ann
from prvr.datasets.real import didemo
from prvr.datasets.real.assemble import Built, BuiltSplit, Caption, TokenSink, assemble_split
from prvr.datasets.real.msl import collection_folder, data_root
from prvr.datasets.real.problems import Report, layout_error
from prvr.datasets.real.specs import RealSpec
from prvr.datasets.real.textdata import SKIP_HINT, H5Tokens
from prvr.datasets.types import SPLITS


@dataclass(frozen=True)
class Collection:
    """One dataset's files in the layout and what its rows mean."""

    prefix: str  # TVRetrieval's dset_name: the prefix of every file
    video_files: dict[str, str]  # data.feature -> file under video_feature/
    default_feature: str
    clip_seconds: float  # one feature row per clip of this length
    stand_in: dict[str, tuple[str, str]] = field(default_factory=dict)  # split -> (split whose file serves, why)
    per_annotator: bool = False  # DiDeMo: `ts` holds one span per annotator, the agreed one is the moment
    original: str = ""  # file read when a split's jsonl is absent ('{split}' filled in): DiDeMo's own json
    strict_moments: bool = False  # a moment wholly outside its video is a problem, not a count
    query_type: bool = False  # rows carry TVR's `type` (v / t / vt: what the query is about)

    @property
    def feature_root(self) -> Path:
        return Path("data") / f"{self.prefix}_feature_release"

    @property
    def query_file(self) -> Path:
        return self.feature_root / "bert_feature" / "query_only" / f"{self.prefix}_query_pretrained_w_query.h5"

    def video_file(self, feature: str) -> Path:
        return self.feature_root / "video_feature" / self.video_files[feature]

    def release_file(self, split: str) -> Path:
        return Path("data") / f"{self.prefix}_{split}_release.jsonl"

    def row(self, video: str, sentence: str, start: float, end: float, duration: float, desc_id: int) -> dict:
        """One line of a release file (what export writes)."""
        row = ann.tvr_rows(video, sentence, start, end, duration, desc_id)
        if not self.query_type:
            del row["type"]
        return row


COLLECTIONS = {
    "tvr": Collection(
        "tvr", {"resnet": "tvr_resnet152_rgb_max_cl-1.5.h5", "i3d": "tvr_i3d_rgb600_avg_cl-1.5.h5",
                "resnet_i3d": "tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-1.5.h5"},  # 2048 / 1024 / 3072-d
        "resnet_i3d", 1.5, {"test": ("val", "as MS-SL's TVR test split")}, query_type=True),
    "charades-sta": Collection(  # seed paper appendix A: ResNet-152 rows of 3.0 s clips
        "charades_sta", {"resnet": "charades_sta_resnet152_rgb_max_cl-3.0.h5"}, "resnet", 3.0,
        {"val": ("test", "Charades-STA has no val split")}, strict_moments=True),
    "didemo": Collection(  # seed paper appendix A: ResNet-152 rows of 2.5 s clips
        "didemo", {"resnet": "didemo_resnet152_rgb_max_cl-2.5.h5"}, "resnet", 2.5, per_annotator=True,
        original="{split}_data.json", strict_moments=True),
}


def layout_hint(name: str) -> str:
    c = COLLECTIONS[name]
    files = f"{c.prefix}_<split>_release.jsonl" + (f" or {c.original.format(split='<split>')}" if c.original else "")
    return f"check --data-root (XML layout: <root>/{name}/data/{files}, see docs/datasets.md)"


class H5Frames:
    """Clip rows per vid_name from an HDF5 file, copied once into a raw float32 file."""

    def __init__(self, path: Path, on_bad_rows: str, out: Path | None, hint: str, features: str) -> None:
        import h5py

        if not path.is_file():
            raise layout_error(path, "missing", f"{hint}; or pick another --set data.feature={features}")
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
                           "use the feature file that covers this split", line=caption.line, key=_key(caption))
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


def _key(caption: Caption) -> str | None:
    """Messages name a caption by its line; a caption of a json file (no lines) by its key."""
    return None if caption.line else caption.qid


# ------------------------------------------------------------------------------ rows
NO_MOMENT = (math.nan, math.nan)


def read_didemo_jsonl(path: Path, report: Report) -> ann.AnnotationTable:
    """DiDeMo release rows: `ts` one [st, ed] per annotator (seconds), or the agreed [st, ed] itself."""
    table = ann.AnnotationTable(files=[path])
    fix = "fix or delete the line (DiDeMo jsonl: vid_name, duration, ts: [[start, end] per annotator], desc, desc_id)"
    for no, row in ann.json_lines(path, report, fix):
        bad, moment = _didemo_moment(row, report)
        if bad:
            report.problem(path, bad, fix, line=no)
            continue
        vid, dur = str(row["vid_name"]), float(row["duration"])
        table.rows.append(ann.Annotation(vid, row["desc"], *moment, dur, f"{path.name} line {no}",
                                         str(row["desc_id"]), no))
        table.durations.setdefault(vid, dur)
    return table


def _didemo_moment(row, report: Report) -> tuple[str, tuple[float, float]]:
    """(problem, moment) of one DiDeMo row. `ts` one [st, ed] per annotator: the moment is the span
    two annotators agree on (none: NaN, counted); one [st, ed]: the agreed span itself."""
    ts = row.get("ts") if isinstance(row, dict) else None
    if not (isinstance(ts, list) and ts and all(isinstance(t, list) for t in ts)):
        bad = ann._tvr_row_problem(row)
        return bad, NO_MOMENT if bad else (float(row["ts"][0]), float(row["ts"][1]))  # a checked pair
    if not all(len(t) == 2 and all(ann._number(x) for x in t) for t in ts):
        return f"'ts' must be [[start, end], ...] in seconds, one per annotator, found {ts!r}", NO_MOMENT
    bad = ann._tvr_row_problem({**row, "ts": ts[0]})  # the other keys
    if bad:
        return bad, NO_MOMENT
    agreed = didemo.agreed_spans([tuple(t) for t in ts])
    if not agreed:
        report.count("DiDeMo queries without a span two annotators agree on")
        return "", NO_MOMENT
    if len(agreed) > 1:
        report.count("DiDeMo queries with more than one agreed span (most votes, then first marked, kept)")
    return "", (float(agreed[0][0]), float(agreed[0][1]))


def read_original_didemo(path: Path, report: Report) -> ann.AnnotationTable:
    """LocalizingMoments' `<split>_data.json`: segment indices -> seconds, the agreed span (didemo.py)."""
    table = didemo.to_table(didemo.read_didemo(path, report), report)
    table.files = [path]
    return table


def outside(row: ann.Annotation) -> bool:
    """A moment that starts at or after the end of its video, or ends at or before 0."""
    if not (math.isfinite(row.start) and math.isfinite(row.duration)) or not row.start < row.end:
        return False  # unknown, or reversed (clip_rows drops those timestamps and counts them)
    return row.start >= row.duration or row.end <= 0


# ---------------------------------------------------------------------------- layout
class XMLLayout:
    def __init__(self, spec: RealSpec, cfg) -> None:
        if spec.name not in COLLECTIONS:
            raise layout_error("--set data.layout=xml", f"the TVRetrieval layout exists for {', '.join(COLLECTIONS)}, "
                               f"not {spec.name}", "use --set data.layout=msl")
        self.spec, self.cfg, self.files = spec, cfg, COLLECTIONS[spec.name]
        self.hint = layout_hint(spec.name)
        self.collection = collection_folder(data_root(cfg), spec.name, "data")
        self.feature = cfg.data.feature or self.files.default_feature
        # desc_id -> (split file, where): every split reads its query features from one file keyed
        # by desc_id, so a desc_id in two split files would give one split the other's features
        self.desc_ids: dict[str, tuple[Path, str]] = {}
        if self.feature not in self.files.video_files:
            raise layout_error("--set data.feature", f"XML video feature {self.feature!r} is unknown",
                               f"use one of {', '.join(self.files.video_files)}")
        self.video_file = self.collection / self.files.video_file(self.feature)
        self.query_file = self.collection / self.files.query_file

    def split_file(self, split: str) -> Path:
        """The split's release file; else DiDeMo's own json; else its stand-in split's file."""
        own = self.collection / self.files.release_file(split)
        original = self.collection / "data" / self.files.original.format(split=split)
        if self.files.original and not own.is_file() and original.is_file():
            return original
        if split in self.files.stand_in and not own.is_file():
            return self.split_file(self.files.stand_in[split][0])
        return own

    def inputs(self) -> list[Path]:
        return [*dict.fromkeys(self.split_file(s) for s in SPLITS), self.video_file, self.query_file,
                self.collection / "prvr_export.json"]

    def rows(self, path: Path, report: Report) -> ann.AnnotationTable:
        if path.suffix == ".json":
            return read_original_didemo(path, report)
        if self.files.per_annotator:
            return read_didemo_jsonl(path, report)
        return ann.read_tvr_jsonl(path, report)

    def captions(self, split: str, report: Report) -> list[Caption]:
        path = self.split_file(split)
        if not path.is_file():
            raise layout_error(path, "missing", self.hint)
        out: list[Caption] = []
        seen: dict[str, str] = {}  # desc_id -> where it was read first
        for r in ann.clip_rows(self._inside(self.rows(path, report).rows, path, report), report):
            where = {"line": r.line} if r.line else {"key": r.qid}
            if r.qid in seen:
                report.problem(path, f"desc_id {r.qid} already on {seen[r.qid]}", "desc_ids must be unique", **where)
                continue
            seen[r.qid] = f"line {r.line}" if r.line else "an earlier entry"
            other, there = self.desc_ids.setdefault(r.qid, (path, seen[r.qid]))
            if other != path:
                report.problem(path, f"desc_id {r.qid} is also in {other.name} ({there}); the splits share one query "
                               "feature file keyed by desc_id, so one split would read the other's query",
                               "give every query of every split its own desc_id", **where)
                continue
            # a json entry has no line (None): messages name it by its key instead
            out.append(Caption(r.qid, r.sentence, r.video, path, r.line or None, (r.start, r.end), r.duration))
        return out

    def _inside(self, rows: list[ann.Annotation], path: Path, report: Report) -> list[ann.Annotation]:
        if not self.files.strict_moments:
            return rows
        kept = []
        for r in rows:
            if outside(r):
                report.problem(path, f"moment [{r.start:g}, {r.end:g}] s lies outside its video "
                               f"(duration {r.duration:g} s)", "fix the timestamps or the duration, or delete the row",
                               line=r.line or None, key=r.qid)
                continue
            kept.append(r)
        return kept

    def build(self, report: Report, out: Path | None) -> Built:
        for split, (stand_in, why) in self.files.stand_in.items():
            if self.split_file(split) == self.split_file(stand_in):
                report.note(f"{split} split = {self.split_file(stand_in).name} "
                            f"(no {self.files.release_file(split).name}), {why}")
        frames = H5Frames(self.video_file, self.cfg.data.on_bad_rows, out / "frames.f32" if out is not None else None,
                          self.hint, "|".join(self.files.video_files))
        tokens = H5Tokens(self.query_file, self.cfg.data.on_bad_rows, self.hint)
        try:
            splits: dict[str, BuiltSplit] = {}
            token_rows: dict[str, int] = {}  # token rows written per split
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
                 "query_features": str(self.query_file), "videos_without_queries": unused,
                 "clip_seconds": self.files.clip_seconds}
        return Built(splits, out / "frames.f32" if out is not None else self.video_file, frames.rows_written,
                     frames.dim, tokens.dim, token_rows, facts)
