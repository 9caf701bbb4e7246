"""Moment timestamps from the original annotation files, joined onto captions.

The MS-SL caption files carry no timestamps. The original annotations do: TVR jsonl,
ActivityNet Captions json, Charades-STA txt (with durations from a separate file). A
caption is joined to an annotation row by video id and normalised sentence text; a
caption with no such row, or with rows that disagree on the timestamps, gets NaN and is
counted, never guessed. Timestamps are clipped to the video: an end past the duration is
set to the duration, a start before 0 to 0 (each counted); a row whose start is not
before its end keeps no timestamps (counted).
"""

from __future__ import annotations

import csv
import json
import math
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

import numpy as np

from prvr.datasets.real.problems import Report, layout_error

MV_BUCKETS = ((0.0, 0.2), (0.2, 0.4), (0.4, 1.0))  # moment length / video length (docs/datasets.md, M/V table)


@dataclass(frozen=True)
class Annotation:
    """One annotated moment: a sentence about [start, end] seconds of a video."""

    video: str
    sentence: str
    start: float  # seconds; NaN when the row had none usable
    end: float
    duration: float  # seconds; NaN when unknown
    source: str  # "file line N" or "file key K", for messages
    qid: str = ""  # the file's own query id where it has one (TVR desc_id)
    line: int = 0  # line in a line-based file (jsonl, txt)


@dataclass
class AnnotationTable:
    """Rows of one or more annotation files, and every video duration they give."""

    rows: list[Annotation] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)

    def extend(self, other: "AnnotationTable", report: Report | None = None) -> None:
        self.rows += other.rows
        self.files += other.files
        for v, d in other.durations.items():
            known = self.durations.get(v)
            if known is not None and abs(known - d) > 0.01 and report is not None:
                report.count("video durations that disagree between files (first kept)")
            self.durations.setdefault(v, d)


# ----------------------------------------------------------------------------- readers
def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def json_lines(path: Path, report: Report, fix: str):
    """(line number, parsed value) of each non-blank line of a JSON-lines file; a line that does
    not parse is reported (with `fix`) and skipped."""
    for no, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            report.problem(path, f"not a JSON object ({e.msg})", fix, line=no)
            continue
        yield no, row


def read_tvr_jsonl(path: Path, report: Report) -> AnnotationTable:
    """TVR jsonl: {vid_name, duration, ts: [st, ed], desc, type, desc_id} per line."""
    table = AnnotationTable(files=[path])
    fix = "fix or delete the line (TVR jsonl: vid_name, duration, ts, desc, desc_id)"
    for no, row in json_lines(path, report, fix):
        bad = _tvr_row_problem(row)
        if bad:
            report.problem(path, bad, fix, line=no)
            continue
        vid, dur = str(row["vid_name"]), float(row["duration"])
        table.rows.append(Annotation(vid, row["desc"], float(row["ts"][0]), float(row["ts"][1]), dur,
                                     f"{path.name} line {no}", str(row["desc_id"]), no))
        table.durations.setdefault(vid, dur)
    return table


def _tvr_row_problem(row) -> str:
    if not isinstance(row, dict):
        return "not a JSON object"
    for key in ("vid_name", "duration", "ts", "desc", "desc_id"):
        if key not in row:
            return f"no key {key!r}"
    ts = row["ts"]
    if not (isinstance(ts, list) and len(ts) == 2 and all(_number(t) for t in ts)):
        return f"'ts' must be [start, end] in seconds, found {ts!r}"
    if not _number(row["duration"]):
        return f"'duration' must be a number, found {row['duration']!r}"
    if not isinstance(row["desc"], str) or not row["desc"].strip():
        return "'desc' is empty"
    return ""


def read_tvr_durations(path: Path) -> dict[str, float]:
    """tvr_video2dur_idx.json: split -> vid_name -> [duration, index]."""
    data = _json(path)
    out: dict[str, float] = {}
    for split, videos in (data.items() if isinstance(data, dict) else []):
        if not isinstance(videos, dict):
            raise layout_error(path, "expected split -> {vid_name: [duration, index]}", "use the TVRetrieval file",
                               key=split)
        for vid, value in videos.items():
            if not (isinstance(value, list) and value and _number(value[0])):
                raise layout_error(path, f"expected [duration, index], found {value!r}", "use the TVRetrieval file",
                                   key=vid)
            out.setdefault(vid, float(value[0]))
    return out


def read_activitynet(path: Path, report: Report) -> AnnotationTable:
    """ActivityNet Captions json: vid -> {duration, timestamps: [[s, e], ...], sentences: [...]}."""
    data = _json(path)
    fix = "fix the entry (ActivityNet Captions: duration, timestamps, sentences of equal length)"
    if not isinstance(data, dict):
        raise layout_error(path, "expected a JSON object video id -> {duration, timestamps, sentences}", fix)
    table = AnnotationTable(files=[path])
    for vid, entry in data.items():
        bad = _activitynet_problem(entry)
        if bad:
            report.problem(path, bad, fix, key=vid)
            continue
        dur = float(entry["duration"])
        table.durations.setdefault(vid, dur)
        for k, ((s, e), text) in enumerate(zip(entry["timestamps"], entry["sentences"])):
            table.rows.append(Annotation(vid, text, float(s), float(e), dur, f"{path.name} key {vid!r} [{k}]"))
    return table


def _activitynet_problem(entry) -> str:
    if not isinstance(entry, dict):
        return "not an object"
    for key in ("duration", "timestamps", "sentences"):
        if key not in entry:
            return f"no key {key!r}"
    if not _number(entry["duration"]):
        return f"'duration' must be a number, found {entry['duration']!r}"
    ts, sents = entry["timestamps"], entry["sentences"]
    if not isinstance(ts, list) or not isinstance(sents, list) or len(ts) != len(sents):
        return "'timestamps' and 'sentences' must be lists of equal length"
    if not all(isinstance(t, list) and len(t) == 2 and all(_number(x) for x in t) for t in ts):
        return "every timestamp must be [start, end] in seconds"
    if not all(isinstance(s, str) and s.strip() for s in sents):
        return "a sentence is empty"
    return ""


def read_charades_sta(path: Path, durations: dict[str, float], report: Report) -> AnnotationTable:
    """Charades-STA txt: '<vid> <start> <end>##<sentence>' per line."""
    table = AnnotationTable(files=[path])
    fix = "fix the line (Charades-STA: '<video> <start> <end>##<sentence>')"
    for no, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        head, sep, sentence = line.partition("##")
        parts = head.split()
        if not sep or len(parts) != 3 or not sentence.strip():
            report.problem(path, "expected '<video> <start> <end>##<sentence>'", fix, line=no)
            continue
        try:
            start, end = float(parts[1]), float(parts[2])
        except ValueError:
            report.problem(path, f"start / end {parts[1]!r} {parts[2]!r} are not numbers", fix, line=no)
            continue
        vid = parts[0]
        table.rows.append(Annotation(vid, sentence.strip(), start, end, durations.get(vid, math.nan),
                                     f"{path.name} line {no}", line=no))
    table.durations = {v: d for v, d in durations.items()}
    return table


def read_charades_durations(path: Path) -> dict[str, float]:
    """Video lengths: VSLNet's charades.json (vid -> {duration}) or Charades_v1_*.csv (id, length)."""
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or not {"id", "length"} <= set(reader.fieldnames):
                raise layout_error(path, "no 'id' and 'length' columns", "use the Charades_v1 csv", line=1)
            out = {}
            for no, row in enumerate(reader, 2):
                try:
                    out[row["id"]] = float(row["length"])
                except (TypeError, ValueError):
                    raise layout_error(path, f"length {row['length']!r} is not a number", "fix the row",
                                       line=no) from None
            return out
    data = _json(path)
    if not isinstance(data, dict):
        raise layout_error(path, "expected video id -> {duration: seconds}", "use VSLNet's charades.json")
    out = {}
    for vid, entry in data.items():
        if not (isinstance(entry, dict) and _number(entry.get("duration"))):
            raise layout_error(path, "no numeric 'duration'", "fix the entry", key=vid)
        out[vid] = float(entry["duration"])
    return out


def _lines(path: Path) -> Iterable[str]:
    try:
        with open(path, encoding="utf-8-sig") as f:  # a leading BOM dropped
            yield from (line.rstrip("\n\r") for line in f)
    except FileNotFoundError:
        raise layout_error(path, "missing", "check --data-root / data.annotations") from None
    except UnicodeDecodeError as e:
        raise layout_error(path, f"not UTF-8 text ({e.reason})", "re-download the file") from None


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise layout_error(path, "missing", "check --data-root / data.annotations") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        line = getattr(e, "lineno", None)
        raise layout_error(path, f"not valid JSON ({getattr(e, 'msg', e)})", "re-download the file",
                           line=line) from None


# ------------------------------------------------------------------------ clipping
def clip_rows(rows: list[Annotation], report: Report) -> list[Annotation]:
    """Clip each moment to [0, duration]; drop (NaN) timestamps whose start is not before the end."""
    out = []
    for r in rows:
        s, e, d = r.start, r.end, r.duration
        if math.isfinite(d):
            if e > d:
                report.count("annotations ending past the video (end clipped to the duration)")
                e = d
        else:
            report.count("annotations without a video duration (no M/V)")
        if s < 0:
            report.count("annotations starting before 0 (clipped to 0)")
            s = 0.0
        if not s < e:
            report.count("annotations with start >= end (timestamps dropped)")
            s = e = math.nan
        out.append(replace(r, start=s, end=e) if (s, e) != (r.start, r.end) else r)
    return out


# ---------------------------------------------------------------------------- join
def normalize_sentence(text: str) -> str:
    """Case, spacing, punctuation and Unicode forms removed: 'Do n't!' == "don't"."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in text if ch.isalnum())


class TimestampIndex:
    """(video, normalised sentence) -> the distinct timestamps the annotation rows give."""

    def __init__(self, table: AnnotationTable) -> None:
        self.durations = dict(table.durations)
        self._spans: dict[tuple[str, str], set] = {}
        for r in table.rows:
            span = (r.start, r.end) if math.isfinite(r.start) else None
            self._spans.setdefault((r.video, normalize_sentence(r.sentence)), set()).add(span)
            if math.isfinite(r.duration):
                self.durations.setdefault(r.video, r.duration)

    def __len__(self) -> int:
        return len(self._spans)

    def lookup(self, video: str, sentence: str) -> tuple[str, float, float]:
        """('matched' | 'unmatched' | 'ambiguous' | 'invalid', start, end)."""
        spans = self._spans.get((video, normalize_sentence(sentence)))
        if not spans:
            return "unmatched", math.nan, math.nan
        if len(spans) > 1:
            return "ambiguous", math.nan, math.nan
        (span,) = spans
        if span is None:
            return "invalid", math.nan, math.nan
        return "matched", span[0], span[1]


JOIN_LABELS = {
    "matched": "captions matched to an annotation",
    "unmatched": "captions without an annotation row (no timestamps)",
    "ambiguous": "captions whose annotation rows disagree on the timestamps (no timestamps)",
    "invalid": "captions matched to a row with start >= end (no timestamps)",
}


def join(videos: list[str], sentences: list[str], index: TimestampIndex) -> tuple[np.ndarray, Counter]:
    """[Q, 2] moments (NaN where not matched) and the count of each join outcome."""
    moments = np.full((len(videos), 2), np.nan)
    outcome: Counter = Counter()
    for i, (v, s) in enumerate(zip(videos, sentences)):
        status, start, end = index.lookup(v, s)
        outcome[status] += 1
        moments[i] = start, end
    return moments, outcome


# ----------------------------------------------------------------------- statistics
def mv_fractions(fraction: np.ndarray) -> list[float]:
    """Share of queries in each M/V bucket, over all queries (unknown ones in none)."""
    fraction = np.asarray(fraction, dtype=np.float64)
    if not len(fraction):
        return [math.nan] * len(MV_BUCKETS)
    with np.errstate(invalid="ignore"):
        return [float(np.mean((fraction > lo) & (fraction <= hi))) for lo, hi in MV_BUCKETS]


def table_stats(rows: list[Annotation]) -> dict:
    """The statistics of the public annotation files (docs/references.md) for a list of rows."""
    videos = {r.video: r.duration for r in rows}
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.array([(r.end - r.start) / r.duration for r in rows], dtype=np.float64)
    return {
        "videos": len(videos), "queries": len(rows),
        "queries_per_video": len(rows) / max(1, len(videos)),
        "words_per_query": float(np.mean([len(r.sentence.split()) for r in rows])) if rows else math.nan,
        "mv_fractions": mv_fractions(frac),
        "mean_mv": float(np.nanmean(frac)) if np.isfinite(frac).any() else math.nan,
        "mean_duration": float(np.nanmean(list(videos.values()))) if videos else math.nan,
    }


# --------------------------------------------------------------------------- writers
def tvr_rows(video: str, sentence: str, start: float, end: float, duration: float, desc_id: int) -> dict:
    return {"vid_name": video, "duration": duration, "ts": [start, end], "desc": sentence, "type": "v",
            "desc_id": desc_id}


def activitynet_json(rows: list[tuple[str, str, float, float, float]]) -> dict:
    """(video, sentence, start, end, duration) rows -> the ActivityNet Captions dict."""
    out: dict[str, dict] = {}
    for vid, sentence, s, e, d in rows:
        entry = out.setdefault(vid, {"duration": d, "timestamps": [], "sentences": []})
        entry["timestamps"].append([s, e])
        entry["sentences"].append(sentence)
    return out


def charades_lines(rows: list[tuple[str, str, float, float, float]]) -> str:
    return "".join(f"{vid} {s!r} {e!r}##{sentence}\n" for vid, sentence, s, e, _ in rows)
