"""What differs between the real datasets: feature folders and original annotation files.

Each dataset's original annotations sit in one folder (default `<collection>/annotations`,
`--set data.annotations=DIR` to point elsewhere) under their public file names:
- tvr: `tvr_*_release.jsonl` (TVRetrieval `data/`; not `tvr_test_public_release.jsonl`, which
  has no timestamps), optionally `tvr_video2dur_idx.json`;
- activitynet: ActivityNet Captions `*.json` (`train.json`, `val_1.json`, ...; not `*_ids.json`);
- charades: `charades_sta_*.txt` plus durations, `charades.json` (VSLNet) or
  `Charades_v1_*.csv` (the Charades release, column `length`).
Every file found is read and the join uses them all, so it does not matter which original
split a PRVR split was filtered from.

The moment retrieval datasets `charades-sta` and `didemo` exist in the TVRetrieval / XML
layout only (xml.py: their release files carry the timestamps); their entries name the
original annotation files all the same, for readers of the real text: Charades-STA's, and
DiDeMo's `*_data.json` (LocalizingMoments; 5-second segments, didemo.py). DiDeMo has no
annotation writer: only the MS-SL export writes one, and DiDeMo has no MS-SL layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prvr.datasets.real import annotations as ann
from prvr.datasets.real import didemo
from prvr.datasets.real.problems import Report
from prvr.harness.base.io import write_json, write_text

# (video, sentence, start, end, duration, qid) per query, for export
Row = tuple[str, str, float, float, float, str]


@dataclass(frozen=True)
class RealSpec:
    name: str  # registry name and collection folder
    msl_feature: str  # FeatureData/<feature> of the MS-SL release ("": none)
    layouts: tuple[str, ...]
    summary: str
    annotation_files: Callable[[Path], list[Path]]
    read_annotations: Callable[[Path, Report], ann.AnnotationTable]
    write_annotations: Callable[[Path, dict[str, list[Row]]], None] | None  # None: no MS-SL layout to write


# ------------------------------------------------------------------------------ TVR
def _tvr_files(folder: Path) -> list[Path]:
    # tvr_test_public_release.jsonl has no timestamps (its test server is closed): not read
    rows = [p for p in sorted(folder.glob("tvr_*_release.jsonl")) if "test_public" not in p.name]
    return rows + sorted(folder.glob("tvr_video2dur_idx.json"))


def _tvr_read(folder: Path, report: Report) -> ann.AnnotationTable:
    table = ann.AnnotationTable()
    for path in _tvr_files(folder):
        if path.suffix == ".jsonl":
            table.extend(ann.read_tvr_jsonl(path, report), report)
        else:
            table.extend(ann.AnnotationTable(durations=ann.read_tvr_durations(path), files=[path]), report)
    return table


def _tvr_write(folder: Path, rows: dict[str, list[Row]]) -> None:
    for split, items in rows.items():
        lines = []
        for i, (vid, sentence, s, e, d, qid) in enumerate(items):
            desc_id = int(qid) if qid.isdigit() else i
            lines.append(json.dumps(ann.tvr_rows(vid, sentence, s, e, d, desc_id)))
        write_text(folder / f"tvr_{split}_release.jsonl", "".join(line + "\n" for line in lines))


# ---------------------------------------------------------------------- ActivityNet
def _anet_files(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.glob("*.json")) if not p.name.endswith("_ids.json")]  # *_ids.json: id lists


def _anet_read(folder: Path, report: Report) -> ann.AnnotationTable:
    table = ann.AnnotationTable()
    for path in _anet_files(folder):
        table.extend(ann.read_activitynet(path, report), report)
    return table


def _anet_write(folder: Path, rows: dict[str, list[Row]]) -> None:
    for split, items in rows.items():
        write_json(folder / f"{split}.json", ann.activitynet_json([r[:5] for r in items]))


# ------------------------------------------------------------------------- Charades
def _charades_duration_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("charades.json")) + sorted(folder.glob("Charades_v1_*.csv"))


def _charades_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("charades_sta_*.txt")) + _charades_duration_files(folder)


def _charades_read(folder: Path, report: Report) -> ann.AnnotationTable:
    durations: dict[str, float] = {}
    for path in _charades_duration_files(folder):
        for vid, d in ann.read_charades_durations(path).items():
            durations.setdefault(vid, d)
    if not durations:
        report.note(f"{folder}: no charades.json or Charades_v1_*.csv: video durations (and M/V) unknown")
    table = ann.AnnotationTable()
    for path in sorted(folder.glob("charades_sta_*.txt")):
        table.extend(ann.read_charades_sta(path, durations, report), report)
    return table


def _charades_write(folder: Path, rows: dict[str, list[Row]]) -> None:
    durations = {}
    for split, items in rows.items():
        write_text(folder / f"charades_sta_{split}.txt", ann.charades_lines([r[:5] for r in items]))
        durations.update({vid: {"duration": d} for vid, _, _, _, d, _ in items})
    write_json(folder / "charades.json", durations)


# --------------------------------------------------------------------------- DiDeMo
def _didemo_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*_data.json"))  # LocalizingMoments: {train,val,test}_data.json


def _didemo_read(folder: Path, report: Report) -> ann.AnnotationTable:
    table = ann.AnnotationTable()
    for path in _didemo_files(folder):
        part = didemo.to_table(didemo.read_didemo(path, report), report)
        part.files = [path]
        table.extend(part, report)
    return table


SPECS: dict[str, RealSpec] = {
    "tvr": RealSpec("tvr", "i3d_resnet", ("msl", "xml"),
                    "TVR (MS-SL release or TVRetrieval layout): 17,435 / 2,179 videos, 3072-d video, 768-d tokens",
                    _tvr_files, _tvr_read, _tvr_write),
    "activitynet": RealSpec("activitynet", "i3d", ("msl",),
                            "ActivityNet Captions (MS-SL release): 9,043 / 4,430 videos, 1024-d video and tokens",
                            _anet_files, _anet_read, _anet_write),
    "charades": RealSpec("charades", "i3d_rgb_lgi", ("msl",),
                         "Charades-STA (MS-SL release): 5,338 / 1,334 videos, 1024-d video and tokens",
                         _charades_files, _charades_read, _charades_write),
    "charades-sta": RealSpec("charades-sta", "", ("xml",),
                             "Charades-STA for moment retrieval (TVRetrieval layout): 12,408 / 3,720 queries, "
                             "3.0 s clips, 2048-d video, 768-d tokens",
                             _charades_files, _charades_read, _charades_write),
    "didemo": RealSpec("didemo", "", ("xml",),
                       "DiDeMo for moment retrieval (TVRetrieval layout): 33,005 / 4,180 / 4,021 queries, 2.5 s clips, "
                       "2048-d video, 768-d tokens", _didemo_files, _didemo_read, None),
}
