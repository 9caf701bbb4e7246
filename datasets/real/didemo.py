"""DiDeMo annotations (Hendricks et al., ICCV 2017), for moment localization.

A video is cut into 5-second segments (at most 6: annotation stopped at 30 s);
`num_segments` says how many a video has. Each description carries the [first, last]
segment that each of (usually) four annotators marked. The ground truth is a span that at
least two annotators agree on: the span marked most often, and when two spans are marked
equally often, the one an earlier annotator marked (the rule TVRetrieval's DiDeMo code
follows; it reproduces the M/V figures of the public annotation files). `agreed_spans` gives every
span with two or more votes, for metrics that accept any of them.

Seconds: segment k covers [5k, 5(k+1)); the last segment ends at the video's end, which
the file does not give, so the nominal duration is 5 * num_segments.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from prvr.datasets.real.annotations import Annotation, AnnotationTable
from prvr.datasets.real.problems import Report, layout_error

SEGMENT_SECONDS = 5.0
MIN_AGREEMENT = 2


@dataclass(frozen=True)
class DidemoQuery:
    annotation_id: int
    video: str
    description: str
    num_segments: int
    times: tuple[tuple[int, int], ...]  # one [first, last] segment pair per annotator


def agreed_spans(times) -> list[tuple[int, int]]:
    """Spans marked by at least two annotators, most votes first (ties: first marked first)."""
    votes = Counter(tuple(t) for t in times)  # insertion order = first annotator to mark each span
    ranked = sorted(votes.items(), key=lambda kv: -kv[1])  # stable: ties keep first-marked order
    return [span for span, n in ranked if n >= MIN_AGREEMENT]


def ground_truth_span(times) -> tuple[int, int] | None:
    """The agreed span with the most votes; None when no two annotators agree."""
    spans = agreed_spans(times)
    return spans[0] if spans else None


def span_seconds(span: tuple[int, int], num_segments: int) -> tuple[float, float]:
    first, last = span
    duration = SEGMENT_SECONDS * num_segments
    return SEGMENT_SECONDS * first, min(SEGMENT_SECONDS * (last + 1), duration)


def read_didemo(path: Path, report: Report) -> list[DidemoQuery]:
    """Parse a DiDeMo json file ({train,val,test}_data.json)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise layout_error(path, "missing", "check the path of the DiDeMo annotations") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise layout_error(path, f"not valid JSON ({getattr(e, 'msg', e)})", "re-download the file",
                           line=getattr(e, "lineno", None)) from None
    if not isinstance(data, list):
        raise layout_error(path, "expected a list of {video, description, times, num_segments, annotation_id}",
                           "use the LocalizingMoments json")
    out = []
    for i, entry in enumerate(data):
        bad = _problem(entry)
        if bad:
            key = str(entry.get("annotation_id", f"[{i}]")) if isinstance(entry, dict) else f"[{i}]"
            report.problem(path, bad, "fix or drop the entry (DiDeMo: times are [first, last] segment pairs)", key=key)
            continue
        out.append(DidemoQuery(int(entry["annotation_id"]), entry["video"], entry["description"],
                               int(entry["num_segments"]),
                               tuple((int(first), int(last)) for first, last in entry["times"])))
    return out


def _problem(entry) -> str:
    if not isinstance(entry, dict):
        return "not an object"
    for key in ("annotation_id", "video", "description", "times", "num_segments"):
        if key not in entry:
            return f"no key {key!r}"
    n = entry["num_segments"]
    if not isinstance(n, int) or not 1 <= n <= 6:
        return f"num_segments must be 1..6, found {n!r}"
    times = entry["times"]
    if not isinstance(times, list) or not times:
        return "'times' must be a non-empty list of [first, last] pairs"
    for t in times:
        if not (isinstance(t, list) and len(t) == 2 and all(isinstance(x, int) for x in t)):
            return f"a time {t!r} is not a [first, last] pair of segment numbers"
        if not 0 <= t[0] <= t[1] < n:
            return f"segments {t!r} are outside 0..{n - 1} or reversed"
    if not isinstance(entry["description"], str) or not entry["description"].strip():
        return "'description' is empty"
    return ""


def to_table(queries: list[DidemoQuery], report: Report) -> AnnotationTable:
    """Annotation rows holding each query's ground-truth span in seconds."""
    table = AnnotationTable()
    nan = float("nan")
    for q in queries:
        span = ground_truth_span(q.times)
        duration = SEGMENT_SECONDS * q.num_segments
        if span is None:
            report.count("DiDeMo queries without a span two annotators agree on")
            start = end = nan
        else:
            if len(agreed_spans(q.times)) > 1:
                report.count("DiDeMo queries with more than one agreed span (most votes, then first marked, kept)")
            start, end = span_seconds(span, q.num_segments)
        table.rows.append(Annotation(q.video, q.description, start, end, duration, f"annotation_id {q.annotation_id}",
                                     str(q.annotation_id)))
        table.durations.setdefault(q.video, duration)
    return table
