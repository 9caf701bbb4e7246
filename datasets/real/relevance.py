"""Relevance files: every verified relevant video of a split's queries, joined to the split.

A relevance file is JSON lines, one object per query, in one of two formats:
- prvr-ea's (CELL-POSTECH/prvr-ea `datasets/multigt_labels.zip`, `<name>denseval*.gt.jsonl`):
  `query_id` (an MS-SL cap id, `<video>#enc#<k>`), `caption`, `gt_video_ids` (every verified
  relevant video, the labelled one included). The labelled video is the cap id up to its first
  '#', the MS-SL layout's own rule (datasets/real/msl.py).
- ours (what `data export` writes): `relevant` (the relevant video ids), and the query as
  `query_id`, or `video` (its labelled video) + `caption`, or all three.

`join` maps a file onto a split's queries and videos and fills the split's `relevance` (the
sparse [queries, videos] matrix the simulated worlds carry), so every oracle path of the
evaluator works unchanged. Nothing is joined by guess:
- by query id, where the file's id is one of the split's; its caption and labelled video,
  where the entry gives them, must then agree with the split's (captions compared after
  `normalize_sentence`), else the entry is left out;
- else by (labelled video, caption): when exactly as many entries as queries share the
  video and the caption, and the entries give the same relevant videos (so any pairing gives
  the same relevance), else the entries are left out as ambiguous.
A query whose file entry names a video that is not in the split is left out too: dropping
that video would inflate the recall. A query the file does not cover keeps an empty row,
and the evaluator leaves it out of the oracle figures (it states the coverage, n of N).
Every cause is counted; `JoinReport.lines` gives one line per cause.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from prvr.datasets.real.annotations import normalize_sentence
from prvr.datasets.real.msl import MSLLayout
from prvr.datasets.real.problems import LayoutError
from prvr.datasets.real.xml import XMLLayout
from prvr.harness.base.io import MAX_TEXT_BYTES, read_text, write_text

MAX_RELEVANCE_BYTES = MAX_TEXT_BYTES  # 64 MB: prvr-ea's TVR val file is a few MB

PRVR_EA_KEY, OURS_KEY = "gt_video_ids", "relevant"
SUFFIX = ".relevance.jsonl"  # ours, beside a split's caption file (MS-SL) or release file (XML)

# The causes a join counts, in the order its report lists them.
JOINED_BY_ID = "queries joined by query id"
JOINED_BY_CAPTION = "queries joined by labelled video and caption"
UNCOVERED = "queries of the split the file does not cover (left out of the oracle figures)"
NO_QUERY = "file entries that match no query of the split"
OTHER_VIDEO = "file entries whose query id is the split's but whose labelled video is not (left out)"
OTHER_CAPTION = "file entries whose query id is the split's but whose caption is not (left out)"
AMBIGUOUS = ("file entries whose labelled video and caption other entries or queries share, with no sure pairing "
             "(left out)")
OUTSIDE = "file entries naming a relevant video that is not in the split (query left out: dropping it would inflate recall)"
NO_LABELLED = "joined entries whose relevant videos leave out the query's labelled video (kept as given)"
CAUSES = (JOINED_BY_ID, JOINED_BY_CAPTION, UNCOVERED, NO_QUERY, OTHER_VIDEO, OTHER_CAPTION, AMBIGUOUS, OUTSIDE,
          NO_LABELLED)


@dataclass(frozen=True)
class Entry:
    """One line of a relevance file."""

    line: int
    query_id: str | None
    video: str | None  # the labelled video, where the format gives it
    caption: str | None
    relevant: tuple[str, ...]


@dataclass
class RelevanceFile:
    path: Path
    entries: list[Entry]
    sha256: str
    format: str  # "prvr-ea", "prvr-bench" (ours) or "mixed"
    note: str = ""  # what the file covers, from a `<stem>.meta.json` beside it (prvr-ea: its `filter`)

    @property
    def name(self) -> str:
        return self.path.name


def _bad(path: Path, line: int, problem: str, fix: str = "fix or delete that line") -> LayoutError:
    return LayoutError(f"relevance file {path} line {line}: {problem}; {fix}")


def _string(obj: dict, key: str, path: Path, line: int, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _bad(path, line, f"key {key!r} must be a non-empty string, got {json.dumps(value)[:40]}")
    return value


def parse_entry(obj: object, path: Path, line: int) -> Entry:
    """One JSON object of a relevance file as an Entry; a one-line error naming file and line."""
    if not isinstance(obj, dict):
        raise _bad(path, line, f"holds {type(obj).__name__}, expected a JSON object")
    if (PRVR_EA_KEY in obj) == (OURS_KEY in obj):
        raise _bad(path, line, f"give the relevant videos as either {PRVR_EA_KEY!r} (prvr-ea) or {OURS_KEY!r}, "
                               "exactly one of them")
    key = PRVR_EA_KEY if PRVR_EA_KEY in obj else OURS_KEY
    relevant = obj[key]
    if not isinstance(relevant, list) or not relevant or not all(isinstance(v, str) and v for v in relevant):
        raise _bad(path, line, f"key {key!r} must be a non-empty list of video ids")
    qid = _string(obj, "query_id", path, line, required=key == PRVR_EA_KEY)
    caption = _string(obj, "caption", path, line)
    video = _string(obj, "video", path, line)
    if key == PRVR_EA_KEY and video is None and qid is not None and "#" in qid:
        video = qid.split("#", 1)[0]  # the MS-SL cap id: '<video>#enc#<k>'
    if qid is None and (video is None or caption is None):
        raise _bad(path, line, "name the query by 'query_id', or by 'video' (its labelled video) and 'caption'")
    return Entry(line, qid, video, caption, tuple(dict.fromkeys(relevant)))


def read_relevance(path: str | Path) -> RelevanceFile:
    """Read a relevance file (either format, checked line by line)."""
    path = Path(path).expanduser()
    if not path.exists() and not path.is_symlink():
        raise LayoutError(f"relevance file {path} does not exist; check data.relevance / --relevance")
    # bounded, UTF-8 (a BOM dropped), a regular file only: a FIFO, folder or device is named, never read
    text_of_file = read_text(path, "relevance file", "give a JSON-lines relevance file (docs/evaluation.md)",
                             MAX_RELEVANCE_BYTES)
    raw = text_of_file.encode("utf-8")
    entries: list[Entry] = []
    seen: dict[str, int] = {}  # query id -> its line
    kinds: set[str] = set()
    for number, text in enumerate(text_of_file.splitlines(), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise _bad(path, number, f"not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise _bad(path, number, "nested deeper than Python can read (a relevance line is one flat object)") \
                from None
        entry = parse_entry(obj, path, number)
        if entry.query_id is not None:
            if entry.query_id in seen:
                raise _bad(path, number, f"query id {entry.query_id!r} already on line {seen[entry.query_id]}",
                           "give each query once")
            seen[entry.query_id] = number
        kinds.add("prvr-ea" if PRVR_EA_KEY in obj else "prvr-bench")
        entries.append(entry)
    if not entries:
        raise LayoutError(f"relevance file {path} holds no entries; give one JSON object per query")
    fmt = kinds.pop() if len(kinds) == 1 else "mixed"
    return RelevanceFile(path, entries, hashlib.sha256(raw).hexdigest(), fmt, _coverage_note(path))


def _coverage_note(path: Path) -> str:
    """prvr-ea ships `<stem>.meta.json` beside a filtered file (TVR: `"filter": "type == v"`)."""
    stem = path.name.removesuffix(".jsonl").removesuffix(".gt")
    meta = path.with_name(f"{stem}.meta.json")
    try:
        info = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return ""
    text = info.get("filter") if isinstance(info, dict) else None
    return f"filter: {text}" if isinstance(text, str) else ""


# ----------------------------------------------------------------------------- the join
@dataclass
class SplitKeys:
    """What a join reads of a split: its ids, texts and labels (a Split, stored rankings or the
    census's annotation text; `query_ids` may be empty strings where a source has none)."""

    video_ids: list[str]
    query_ids: list[str]
    query_text: list[str]
    query_video: np.ndarray

    @classmethod
    def of_split(cls, split) -> "SplitKeys":
        return cls(list(split.video_ids), list(split.query_ids), list(split.query_text),
                   np.asarray(split.query_video, dtype=np.int64))


@dataclass
class JoinReport:
    file: str
    sha256: str
    queries: int
    covered: int
    counts: Counter = field(default_factory=Counter)
    note: str = ""

    def lines(self) -> list[str]:
        return report_lines(self.as_dict())

    def as_dict(self) -> dict:
        """What a run record keeps (provenance.data.relevance.<split>)."""
        return {"file": self.file, "sha256": self.sha256, "covered": self.covered, "queries": self.queries,
                "note": self.note, "counts": {c: int(self.counts[c]) for c in CAUSES if self.counts.get(c)}}


def report_lines(report: dict) -> list[str]:
    """A join's report (`JoinReport.as_dict`) as lines: the coverage, then one line per cause
    that occurred, with its count."""
    head = f"relevance {report['file']}: {report['covered']:,} of {report['queries']:,} queries covered"
    return [head + (f" ({report['note']})" if report.get("note") else "")] + [
        f"  {cause}: {n:,}" for cause, n in report["counts"].items()]


def join(file: RelevanceFile, keys: SplitKeys) -> tuple[sp.csr_matrix, JoinReport]:
    """The split's [queries, videos] relevance from the file (empty rows: not covered) and the
    report of what joined and what did not."""
    counts: Counter = Counter()
    by_id = {qid: q for q, qid in enumerate(keys.query_ids) if qid}
    texts = [normalize_sentence(t) for t in keys.query_text]
    assigned: dict[int, tuple[Entry, str]] = {}  # query -> (its entry, how it joined)
    rest: list[Entry] = []
    for e in file.entries:
        q = by_id.get(e.query_id) if e.query_id is not None else None
        if q is None:
            rest.append(e)
        elif e.video is not None and e.video != keys.video_ids[keys.query_video[q]]:
            counts[OTHER_VIDEO] += 1
        elif e.caption is not None and normalize_sentence(e.caption) != texts[q]:
            counts[OTHER_CAPTION] += 1
        else:
            assigned[q] = (e, JOINED_BY_ID)
    _join_by_caption(rest, keys, texts, assigned, counts)
    relevance, covered = _matrix(assigned, keys, counts)
    counts[UNCOVERED] = len(keys.query_ids) - covered
    return relevance, JoinReport(file.name, file.sha256, len(keys.query_ids), covered, counts, file.note)


def _join_by_caption(entries: list[Entry], keys: SplitKeys, texts: list[str],
                     assigned: dict[int, tuple[Entry, str]], counts: Counter) -> None:
    """Entries without a usable query id, joined by (labelled video, caption) where that is sure."""
    queries: dict[tuple[str, str], list[int]] = {}
    for q, t in enumerate(texts):
        if q not in assigned:
            queries.setdefault((keys.video_ids[keys.query_video[q]], t), []).append(q)
    groups: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        if e.video is None or e.caption is None:
            counts[NO_QUERY] += 1
            continue
        groups.setdefault((e.video, normalize_sentence(e.caption)), []).append(e)
    for key, group in groups.items():
        qs = queries.get(key, [])
        if not qs:
            counts[NO_QUERY] += len(group)
        elif len(qs) == len(group) and len({frozenset(e.relevant) for e in group}) == 1:
            # one entry per query, all alike: any pairing gives the same relevance
            assigned.update((q, (e, JOINED_BY_CAPTION)) for q, e in zip(qs, group))
        else:
            counts[AMBIGUOUS] += len(group)


def _matrix(assigned: dict[int, tuple[Entry, str]], keys: SplitKeys, counts: Counter) -> tuple[sp.csr_matrix, int]:
    index = {v: i for i, v in enumerate(keys.video_ids)}
    rows, cols = [], []
    covered = 0
    for q in sorted(assigned):
        e, how = assigned[q]
        if any(v not in index for v in e.relevant):
            counts[OUTSIDE] += 1
            continue
        counts[how] += 1
        videos = [index[v] for v in e.relevant]
        if int(keys.query_video[q]) not in videos:
            counts[NO_LABELLED] += 1
        rows += [q] * len(videos)
        cols += videos
        covered += 1
    shape = (len(keys.query_ids), len(keys.video_ids))
    data = np.ones(len(rows), dtype=bool)
    return sp.csr_matrix((data, (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64))),
                         shape=shape), covered


# ----------------------------------------------------------------------------- writing
def write_relevance(path: str | Path, split, query_ids: list[str] | None = None,
                    order: np.ndarray | None = None) -> int:
    """A split's ground truth as our format, one line per query (in `order`, with `query_ids`
    as written by an export; default: the split's own): returns the lines written."""
    order = np.arange(split.num_queries) if order is None else np.asarray(order)
    ids = [split.query_ids[int(q)] for q in order] if query_ids is None else list(query_ids)
    rel = sp.csr_matrix(split.relevance, dtype=bool)
    lines = []
    for q, qid in zip(order, ids):
        q = int(q)
        relevant = [split.video_ids[v] for v in sorted(rel.indices[rel.indptr[q]:rel.indptr[q + 1]])]
        if not relevant:
            continue
        lines.append(json.dumps({"query_id": qid, "video": split.video_ids[split.query_video[q]],
                                 "caption": " ".join(split.query_text[q].split()), "relevant": relevant}))
    write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


# ----------------------------------------------------------------------------- finding and attaching
PRVR_EA_GLOBS = ("{c}denseval*.gt.jsonl", "TextData/{c}denseval*.gt.jsonl")  # where prvr-ea's zip puts them


def beside(layout: MSLLayout | XMLLayout, split: str) -> Path:
    """Our relevance file of a split, beside its captions (MS-SL: TextData/<c><split>.relevance.jsonl)
    or its release file (XML: data/<p>_<split>.relevance.jsonl)."""
    if isinstance(layout, XMLLayout):
        return layout.collection / "data" / f"{layout.files.prefix}_{split}{SUFFIX}"
    return layout.text_dir / f"{layout.spec.name}{split}{SUFFIX}"


def split_files(layout: MSLLayout | XMLLayout, setting: str, splits) -> dict[str, Path]:
    """The relevance file of each split: `data.relevance` (the test split's) where set; else ours
    beside the split, and for the test split prvr-ea's `<c>denseval*.gt.jsonl` in the collection
    (or its TextData) folder. Two candidates for one split are an error: name one."""
    out: dict[str, Path] = {}
    for split in splits:
        if split == "test" and setting:
            out[split] = Path(setting).expanduser()
            continue
        found = [beside(layout, split)] if beside(layout, split).is_file() else []
        if split == "test":
            found += [p for g in PRVR_EA_GLOBS for p in sorted(layout.collection.glob(g.format(c=layout.spec.name)))]
        if len(found) > 1:
            raise LayoutError(f"{split} split: several relevance files ({', '.join(str(p) for p in found)}); "
                              "pick one with --set data.relevance=FILE")
        if found:
            out[split] = found[0]
    return out


def attach(data, layout: MSLLayout | XMLLayout, setting: str) -> list[str]:
    """Join the relevance file of each split (`split_files`) into `split.relevance`, keep each
    join's report in data.meta["relevance"] (runs record it), and return the report lines. The
    file named by `data.relevance` must join some test query."""
    reports, lines, files = {}, [], {}
    for split, path in split_files(layout, setting, data.splits).items():
        if path not in files:
            files[path] = read_relevance(path)
        relevance, report = join(files[path], SplitKeys.of_split(data.splits[split]))
        if split == "test" and setting and not report.covered:
            raise LayoutError(f"relevance file {path} (data.relevance) covers none of the {report.queries:,} test "
                              f"queries ({'; '.join(line.strip() for line in report.lines()[1:])}); is it this "
                              "dataset's test split?")
        if report.covered:
            data.splits[split].relevance = relevance
        reports[split] = report.as_dict()
        lines += [f"{split}: {line.strip()}" if i == 0 else line for i, line in enumerate(report.lines())]
    if reports:
        data.meta["relevance"] = reports
    return lines
