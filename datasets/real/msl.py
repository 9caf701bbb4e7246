"""The MS-SL family layout (MS-SL, GMMFormer, GMMFormer v2, RAL, DL-DKD releases).

    <root>/<c>/TextData/<c>{train,val,test}.caption.txt
    <root>/<c>/TextData/roberta_<c>_query_feat.hdf5        one [L, D] dataset per cap_id
    <root>/<c>/FeatureData/<feature>/{feature.bin, id.txt, shape.txt, video2frames.txt}
    <root>/<c>/annotations/                                 original annotation files (timestamps)

`<root>` is `data.data_root` (`--data-root` / `$PRVR_DATA`); it may also be the
collection folder itself. One feature folder serves every split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prvr.datasets.real.annotations import TimestampIndex, clip_rows
from prvr.datasets.real.assemble import Built, BuiltSplit, Caption, TokenSink, assemble_split
from prvr.datasets.real.bigfile import FILES, BigFile
from prvr.datasets.real.problems import LayoutError, Report, layout_error
from prvr.datasets.real.specs import RealSpec
from prvr.datasets.real.textdata import SKIP_HINT, H5Tokens, read_captions
from prvr.datasets.types import SPLITS

QUERY_HINT = "check --data-root (MS-SL layout: TextData/roberta_<collection>_query_feat.hdf5)"


def data_root(cfg) -> Path:
    if not cfg.data.data_root:
        raise LayoutError(f"dataset {cfg.dataset} reads files: pass --data-root DIR or set PRVR_DATA "
                          "(the folder that holds its collection folder)")
    root = Path(cfg.data.data_root).expanduser()
    if not root.is_dir():
        raise LayoutError(f"data root {root} does not exist; fix --data-root / PRVR_DATA")
    return root


def collection_folder(root: Path, name: str, marker: str) -> Path:
    """<root>/<name>, or <root> itself when it is that collection folder."""
    if (root / name).is_dir():
        return root / name
    if root.name == name and (root / marker).exists():
        return root
    raise layout_error(root / name, "collection folder missing",
                       f"pass the folder that holds '{name}/' as --data-root (or PRVR_DATA)")


def annotation_folder(collection: Path, cfg) -> Path:
    return Path(cfg.data.annotations).expanduser() if cfg.data.annotations else collection / "annotations"


def annotation_index(spec: RealSpec, folder: Path, report: Report) -> TimestampIndex | None:
    """Timestamps and durations of the original annotation files (None: no folder)."""
    if not folder.is_dir():
        report.note(f"{folder}: no annotation folder, so no timestamps (M/V buckets stay empty); "
                    f"put the original {spec.name} annotation files there")
        return None
    table = spec.read_annotations(folder, report)
    if not table.files:
        report.note(f"{folder}: none of the {spec.name} annotation files is there: no timestamps")
    table.rows = clip_rows(table.rows, report)
    report.count("annotation rows read", len(table.rows))
    return TimestampIndex(table)


class BigFileFrames:
    """Frame rows of feature.bin per video, with NaN / Inf rows handled by data.on_bad_rows."""

    def __init__(self, big: BigFile, on_bad_rows: str, report: Report) -> None:
        self.big, self.dim, self.on_bad_rows = big, big.dim, on_bad_rows
        self.bad = big.nonfinite_rows()
        report.count("video feature rows with NaN/Inf", len(self.bad))

    def rows(self, video: str, caption: Caption, report: Report) -> np.ndarray | None:
        if video not in self.big.video2frames:
            report.count("captions whose video is not in video2frames.txt")
            report.problem(caption.path, f"video {video!r} of caption {caption.qid!r} is not in "
                           f"{self.big.folder.name}/video2frames.txt", "add its frames there or delete its captions",
                           line=caption.line)
            return None
        rows = self.big.video_rows(video, report)
        if rows is None or not len(self.bad):
            return rows
        bad = np.isin(rows, self.bad)
        if not bad.any():
            return rows
        if self.on_bad_rows != "skip":
            r = int(rows[bad][0])
            report.problem(self.big.folder / "feature.bin", f"row {r} (video {video!r}) holds NaN/Inf", SKIP_HINT,
                           key=self.big.ids[r])
            return None
        report.count("frames left out: NaN/Inf rows", int(bad.sum()))
        if bad.all():
            report.count("videos left out: every frame NaN/Inf")
            return None
        return rows[~bad]


class MSLLayout:
    def __init__(self, spec: RealSpec, cfg) -> None:
        self.spec, self.cfg = spec, cfg
        self.collection = collection_folder(data_root(cfg), spec.name, "TextData")
        self.feature = cfg.data.feature or spec.msl_feature
        self.text_dir = self.collection / "TextData"
        self.feature_dir = self.collection / "FeatureData" / self.feature
        self.annotations = annotation_folder(self.collection, cfg)

    def caption_file(self, split: str) -> Path:
        return self.text_dir / f"{self.spec.name}{split}.caption.txt"

    @property
    def query_file(self) -> Path:
        return self.text_dir / f"roberta_{self.spec.name}_query_feat.hdf5"

    def inputs(self) -> list[Path]:
        """Every file the data come from (their sizes and times key the cache)."""
        ann = self.spec.annotation_files(self.annotations) if self.annotations.is_dir() else []
        return [*(self.caption_file(s) for s in SPLITS), self.query_file,
                *(self.feature_dir / f for f in FILES), *ann, self.collection / "prvr_export.json"]

    def build(self, report: Report, out: Path | None) -> Built:
        for path in (self.text_dir, *(self.caption_file(s) for s in SPLITS)):
            if not path.exists():
                raise layout_error(path, "missing", "check --data-root (MS-SL layout: TextData/<c>{train,val,test}"
                                   ".caption.txt)")
        big = BigFile(self.feature_dir)
        frames = BigFileFrames(big, self.cfg.data.on_bad_rows, report)
        tokens = H5Tokens(self.query_file, self.cfg.data.on_bad_rows, QUERY_HINT)
        try:
            index = annotation_index(self.spec, self.annotations, report)
            splits: dict[str, BuiltSplit] = {}
            token_rows: dict[str, int] = {}  # token rows written per split
            for split in SPLITS:
                captions = read_captions(self.caption_file(split), report)
                sink = TokenSink(out / f"{split}.tokens.f32" if out is not None else None)
                try:
                    splits[split] = assemble_split(captions, frames, tokens, sink, index, report)
                finally:
                    sink.close()
                token_rows[split] = sink.rows
        finally:
            tokens.close()
        used = set().union(*(s.video_ids for s in splits.values()))
        facts = {"layout": "msl", "collection": str(self.collection), "video_features": str(self.feature_dir),
                 "query_features": str(self.query_file), "annotations": str(self.annotations),
                 "videos_without_queries": len(set(big.video2frames) - used)}
        return Built(splits, self.feature_dir / "feature.bin", big.rows, big.dim, tokens.dim, token_rows, facts)
