"""Write any dataset (simulated ones included) in a public layout, with its timestamps.

The layouts list a split's videos through its captions, one line per query, so a split is
written as its queries ordered by labelled video (stable within a video), and a video
without queries cannot be part of a split (it is counted). Timestamps and durations go to
the original annotation formats (TVR jsonl, ActivityNet json, Charades-STA txt +
charades.json), which the loader joins back by video id and sentence. The TVRetrieval / XML
layout (`--layout xml`: tvr, charades-sta, didemo; xml.py) writes each split's release file,
one row per query with its timestamps (desc_ids numbered across the splits, so the query
features of all splits share one file), and `<p>_video2dur_idx.json`, each split's videos with
their durations, from which TVRetrieval's evaluation lists its corpus; a DiDeMo row carries its moment as the one agreed
span. Feature values are written as float32, so float16 or float32 data come back bit for bit.
A split with ground truth (the simulated worlds) also gets its relevance file beside it
(relevance.py: MS-SL `TextData/<c><split>.relevance.jsonl`, XML `data/<p>_<split>.relevance.jsonl`),
which the loader joins back, so the oracle figures survive the round trip.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from prvr.datasets.real import xml as xml_layout
from prvr.datasets.real.annotations import normalize_sentence
from prvr.datasets.real.bigfile import write_bigfile
from prvr.datasets.real.relevance import SUFFIX as RELEVANCE_SUFFIX
from prvr.datasets.real.relevance import write_relevance
from prvr.datasets.real.specs import SPECS, Row
from prvr.datasets.types import PRVRData, Split
from prvr.harness.base.io import UserError, atomic_path, os_cause, write_json, write_text
from prvr.harness.base.names import check_name

MARKER = "prvr_export.json"  # written by export, read by the loader into the data facts of each run


@dataclass
class ExportSummary:
    folder: Path
    files: list[Path] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def export(data: PRVRData, collection: str, to: Path, layout: str, feature: str = "", force: bool = False) -> ExportSummary:
    if collection not in SPECS:
        raise UserError(f"unknown collection {collection!r}; use --as one of {', '.join(SPECS)}")
    spec = SPECS[collection]
    if layout not in spec.layouts:
        raise UserError(f"layout {layout!r} does not exist for {collection} (has: {', '.join(spec.layouts)}); fix --layout")
    if feature:  # a folder / file name under the export: never a path that leaves it
        check_name(feature, "--feature", "name a feature folder, e.g. i3d_resnet")
    folder = Path(to) / collection
    if folder.exists() and any(folder.iterdir()) and not force:
        raise UserError(f"{folder} exists and is not empty; pass --force to overwrite it or pick another --to")
    summary = ExportSummary(folder)
    plan = {name: _order(split, summary.counts) for name, split in data.splits.items()}
    fresh = not folder.exists()
    try:
        # Marks the folder as an export, so runs on it say where the data came from (a simulated
        # world exported as `tvr` is not TVR); the public layouts ignore the file.
        write_json(folder / MARKER, {"exported_from": data.name, "layout": layout,
                                     "simulated": bool(data.meta.get("simulated", False)),
                                     "generator_version": data.meta.get("generator_version")})
        if layout == "msl":
            _write_msl(data, plan, folder, feature or spec.msl_feature, summary)
        else:
            _write_xml(data, plan, folder, xml_layout.COLLECTIONS[collection], feature, summary)
    except (OSError, UserError) as e:
        # a full disk (h5py's writes fail one by one) or a refused target: no half-written collection stays
        # behind where this export made it (one it was told to --force over is the user's to look at)
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(e, UserError):
            raise
        raise UserError(f"cannot export {collection} to {folder}: {os_cause(e, folder)}; "
                        f"{'nothing was left there' if fresh else 'the folder is half-written'}") from None
    return summary


def _order(split: Split, counts: Counter) -> tuple[list[int], np.ndarray]:
    """Videos with queries (split order) and the queries ordered by labelled video."""
    queries = np.argsort(split.query_video, kind="stable")
    videos = sorted(set(split.query_video.tolist()))
    counts["videos left out: no queries (a layout lists a split's videos through its captions)"] += (
        split.num_videos - len(videos))
    return videos, queries


def _cap_ids(data: PRVRData, plan) -> dict[str, list[str]]:
    """MS-SL cap ids: '<video>#...'; a query id is kept when it names its labelled video and is unique."""
    seen: set[str] = set()
    out = {}
    for name, split in data.splits.items():
        ids: list[str] = []
        per_video: Counter[str] = Counter()
        for q in plan[name][1]:
            vid = split.video_ids[split.query_video[q]]
            qid = split.query_ids[q]
            if qid.split("#")[0] != vid or qid in seen or not qid or "/" in qid or any(c.isspace() for c in qid):
                while (qid := f"{vid}#enc#{per_video[vid]}") in seen:
                    per_video[vid] += 1
            per_video[vid] += 1
            seen.add(qid)
            ids.append(qid)
        out[name] = ids
    return out


def _text(text: str) -> str:
    return " ".join(text.split("\n")).strip()


def _annotation_rows(data: PRVRData, plan, qids: dict[str, list[str]], counts: Counter) -> dict[str, list[Row]]:
    rows: dict[str, list[Row]] = {}
    for name, split in data.splits.items():
        items: list[Row] = []
        spans: dict[tuple[str, str], tuple[float, float]] = {}
        for q, qid in zip(plan[name][1], qids[name]):
            vid = split.video_ids[split.query_video[q]]
            s, e = (float(x) for x in split.moments[q])
            d = float(split.durations[split.query_video[q]])
            if not (math.isfinite(s) and math.isfinite(e) and math.isfinite(d)):
                counts["queries without timestamps or duration (no annotation row)"] += 1
                continue
            key = (vid, normalize_sentence(split.query_text[q]))
            if spans.setdefault(key, (s, e)) != (s, e):
                counts["queries sharing video and sentence with different timestamps (load without them)"] += 1
            items.append((vid, _text(split.query_text[q]), s, e, d, qid))
        rows[name] = items
    return rows


def _write_msl(data: PRVRData, plan, folder: Path, feature: str, summary: ExportSummary) -> None:
    import h5py

    collection = folder.name
    text_dir, feat_dir, ann_dir = folder / "TextData", folder / "FeatureData" / feature, folder / "annotations"
    qids = _cap_ids(data, plan)
    for name, split in data.splits.items():
        lines = [f"{qid} {_text(split.query_text[q])}\n" for q, qid in zip(plan[name][1], qids[name])]
        write_text(text_dir / f"{collection}{name}.caption.txt", "".join(lines))
        summary.files.append(text_dir / f"{collection}{name}.caption.txt")
    _write_relevance(data, plan, qids, lambda name: text_dir / f"{collection}{name}{RELEVANCE_SUFFIX}", summary)
    query_file = text_dir / f"roberta_{collection}_query_feat.hdf5"
    with atomic_path(query_file) as tmp, h5py.File(tmp, "w") as f:
        for name, split in data.splits.items():
            for q, qid in zip(plan[name][1], qids[name]):
                f.create_dataset(qid, data=np.asarray(split.tokens[int(q)], dtype=np.float32))
    summary.files.append(query_file)
    frame_ids, video2frames, sources = _frame_plan(data, plan)
    write_bigfile(feat_dir, frame_ids, _blocks(sources), data.video_dim, video2frames)
    summary.files.append(feat_dir)
    summary.counts["frames"] = len(frame_ids)
    write_annotations = SPECS[collection].write_annotations
    if write_annotations is None:  # a collection without an MS-SL layout never reaches here (its layouts say so)
        raise UserError(f"{collection} has no MS-SL annotation layout; export it with --layout xml")
    write_annotations(ann_dir, _annotation_rows(data, plan, qids, summary.counts))
    summary.files.append(ann_dir)


def _frame_plan(data: PRVRData, plan):
    """Frame ids '<video>_<k>' and the (split, video) each video's rows come from (first split wins)."""
    frame_ids: list[str] = []
    video2frames: dict[str, list[str]] = {}
    sources = []
    for name, split in data.splits.items():
        for v in plan[name][0]:
            vid = split.video_ids[v]
            if vid in video2frames:
                continue
            ids = [f"{vid}_{k}" for k in range(int(split.frames.lengths[v]))]
            video2frames[vid] = ids
            frame_ids += ids
            sources.append((split, v))
    return frame_ids, video2frames, sources


def _blocks(sources):
    for split, v in sources:
        yield np.asarray(split.frames[v], dtype=np.float32)


def _write_xml(data: PRVRData, plan, folder: Path, files: xml_layout.Collection, feature: str,
               summary: ExportSummary) -> None:
    """Every split's release file (desc_ids run across splits), the query and the video features."""
    import h5py

    feature = feature or files.default_feature
    if feature not in files.video_files:
        raise UserError(f"XML video feature {feature!r} is unknown; "
                        f"use --feature one of {', '.join(files.video_files)}")
    desc_ids = {name: [str(i) for i in range(start, start + split.num_queries)]
                for name, split, start in _running(data)}
    rows = _annotation_rows(data, plan, desc_ids, summary.counts)
    for name, items in rows.items():
        path = folder / files.release_file(name)
        write_text(path, "".join(_json_line(files.row(vid, sentence, s, e, d, int(qid)))
                                 for vid, sentence, s, e, d, qid in items))
        summary.files.append(path)
    durations = folder / "data" / f"{files.prefix}_video2dur_idx.json"
    write_json(durations, video_durations(rows))
    summary.files.append(durations)
    keep = {name: {qid for *_, qid in items} for name, items in rows.items()}
    _write_relevance(data, plan, desc_ids, lambda name: folder / "data" / f"{files.prefix}_{name}{RELEVANCE_SUFFIX}",
                     summary, keep)
    query_file = folder / files.query_file
    with atomic_path(query_file) as tmp, h5py.File(tmp, "w") as f:
        for name, split in data.splits.items():
            for q, qid in zip(plan[name][1], desc_ids[name]):
                if qid in keep[name]:
                    f.create_dataset(qid, data=np.asarray(split.tokens[int(q)], dtype=np.float32))
    video_file = folder / files.video_file(feature)
    with atomic_path(video_file) as tmp, h5py.File(tmp, "w") as f:
        for name, split in data.splits.items():
            for v in plan[name][0]:
                if split.video_ids[v] not in f:
                    f.create_dataset(split.video_ids[v], data=np.asarray(split.frames[v], dtype=np.float32))
    summary.files += [query_file, video_file]


def video_durations(rows: dict[str, list[Row]]) -> dict[str, dict[str, list[float | int]]]:
    """TVRetrieval's `<p>_video2dur_idx.json`: split -> vid_name -> [duration, index], the index a
    video's place in its split (the order of its first query). TVRetrieval's evaluation lists a
    split's corpus from it (`--video_duration_idx_path`); TVR ships `tvr_video2dur_idx.json`."""
    out: dict[str, dict[str, list[float | int]]] = {}
    for name, items in rows.items():
        videos: dict[str, list[float | int]] = {}
        for vid, _, _, _, duration, _ in items:
            videos.setdefault(vid, [float(duration), len(videos)])
        out[name] = videos
    return out


def _write_relevance(data: PRVRData, plan, qids: dict[str, list[str]], path_of, summary: ExportSummary,
                     keep: dict[str, set[str]] | None = None) -> None:
    """Each split's ground truth (where it has one) as a relevance file, under the ids written."""
    for name, split in data.splits.items():
        if split.relevance is None:
            continue
        pairs = [(q, qid) for q, qid in zip(plan[name][1], qids[name]) if keep is None or qid in keep[name]]
        write_relevance(path_of(name), split, [qid for _, qid in pairs], np.array([q for q, _ in pairs], dtype=np.int64))
        summary.files.append(path_of(name))
        exported = np.zeros(split.num_videos, dtype=bool)
        exported[plan[name][0]] = True
        rel = split.relevance.tocsr()[[q for q, _ in pairs]]
        outside = np.asarray(rel[:, ~exported].sum(1)).ravel() > 0 if rel.shape[0] else np.zeros(0, dtype=bool)
        summary.counts["queries whose relevant videos include one left out (loaded without relevance)"] += int(
            outside.sum())


def _running(data: PRVRData):
    start = 0
    for name, split in data.splits.items():
        yield name, split, start
        start += split.num_queries


def _json_line(row: dict) -> str:
    import json

    return json.dumps(row) + "\n"
