"""`prvr-bench census`: the SBERT detector (methods/relations/sbert.py) over a dataset's query
text, per Phi and theta: how ambiguous the text of a dataset says its labels are.

For each split and each (Phi, theta): the share of queries with at least one potentially
relevant query in another video, the mean number of such queries per query and of such
videos per query; on simulated data also the precision and recall of the detected
(query, video) pairs against the truly relevant unlabelled ones. Every distinct string is
encoded once for all Phis, and the cosines go in blocks (the detector's own functions).

Real datasets: the annotation text under `--data-root DIR` (read by the project's readers of
the original files: datasets/real/annotations.py, datasets/real/didemo.py), one census per
annotation file. They have no parses, so Phi_vp and Phi_np-vp use `--parser auto`, which
says loudly when it falls back to the rules. Simulated datasets: their train split (or
`--split`), with their gold parses; their census also measures each parser's verb phrases
against the gold ones (results/census/vp-extraction.md).

Writes `<out>/census/<dataset>.{md,csv}` and, for simulated data, updates
`<out>/census/vp-extraction.{md,csv}` (the rows of other datasets are kept).

Real datasets against verified labels: `--relevance FILE` (a relevance file, prvr-ea's or ours:
datasets/real/relevance.py) is joined to each annotation file's queries by labelled video and
caption, and the census gains the precision, recall and base rate of the detected (query, video)
pairs against the file's relevant pairs that the labels miss, over the pairs the file judges:
a query it covers and a video it names (TVR's prvr-ea file covers the visual queries only).
Its table is `<out>/census/<dataset>~relevance.{md,csv}`, with the join's report.

Which world knobs give a real dataset's shares: a simulated world can be remade with
`--set KEY=VALUE` (fixed, e.g. `sim.val_videos=2179` for TVR val's pool) and `--sweep
KEY=V1,V2,...` (every combination), one census per world, all in one table
`<out>/census/<dataset>~<tag>.{md,csv}` with a `world` column naming the knob values.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import re
import shlex
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from prvr.harness.cli.args import command
from prvr.datasets.real import annotations as ann, didemo
from prvr.datasets.real.problems import Report
from prvr.datasets.real.relevance import SplitKeys, join, read_relevance, report_lines
from prvr.harness.base import progress
from prvr.harness.engine.build import load_data
from prvr.harness.engine.config import check_device, parse_set, resolve
from prvr.harness.base.devices import pick_device
from prvr.harness.base.io import UserError, write_text
from prvr.harness.base.registry import DATASETS
from prvr.harness.reports.table import code, csv_text, markdown_cell, markdown_table
from prvr.methods.relations import sbert
from prvr.methods.relations.phrases import PHIS, read_tree, verb_phrases
from prvr.methods.relations.sbert import (PACKAGED_MODEL, THETAS, Encoder, QueryText, build_elements, element_strings,
                                          model_id, phi_blocks, unlabelled_truth)
from prvr.methods.relations.text_parsers import (PARSERS, RULES_VERSION, ParserChoice, benepar_parse, benepar_status,
                                                 benepar_version, choose_parser, rules_parse)

CENSUS_FIELDS = ("dataset", "world", "split", "queries", "videos", "phi", "theta", "parser", "model", "share_with_pr",
                 "pr_queries_per_query", "pr_videos_per_query", "precision", "recall", "base_rate")
# with ground truth (a simulated world, or a relevance file over the queries it covers): how
# ambiguous the split is and how far above chance the detector is, the figures a simulated
# world is calibrated on against the real split (docs/simulated-world.md, "Real ambiguity")
TRUTH_FIELDS = ("lift", "multi_relevant_share", "relevant_per_query")
# with a relevance file (--relevance), before precision: the pairs the file judges
JUDGED_FIELDS = ("covered_queries", "judged_videos", "judged_pr_videos_per_query")
VP_FIELDS = ("dataset", "split", "parser", "status", "queries", "gold_vps", "extracted_vps", "matched",
             "precision", "recall")
VP_RATES = frozenset({"precision", "recall"})


# ----------------------------------------------------------------------------- where the text comes from
@dataclass
class TextSplit:
    """One split of query text to take the census of."""

    dataset: str
    split: str
    text: QueryText
    world: str = ""  # the knob values that remade a simulated world (--set / --sweep), "" = its preset
    video_ids: list[str] | None = None  # real text: the videos, in the order query_video indexes
    judged: "Judged | None" = None  # real text joined to a relevance file (--relevance)
    left_out: list[str] | None = None  # real text: annotation rows the reader left out, one line per cause


@dataclass
class Judged:
    """The (query, video) pairs a relevance file judges: a query it covers, a video it names."""

    queries: np.ndarray  # [Q] bool
    videos: np.ndarray  # [V] bool
    report: dict  # the join's report (JoinReport.as_dict)

    def keep(self, keys: np.ndarray, num_videos: int) -> np.ndarray:
        """The judged ones of pair keys q * V + v."""
        return keys[self.queries[keys // num_videos] & self.videos[keys % num_videos]]


def _tvr(path: Path, report) -> list:
    return ann.read_tvr_jsonl(path, report).rows


def _activitynet(path: Path, report) -> list:
    return ann.read_activitynet(path, report).rows


def _charades(path: Path, report) -> list:
    return ann.read_charades_sta(path, {}, report).rows  # durations are not needed here


def _didemo(path: Path, report) -> list:
    return didemo.to_table(didemo.read_didemo(path, report), report).rows


@dataclass(frozen=True)
class RealText:
    """A real dataset's annotation files: the folders tried under the data root (first that
    holds files wins), the file pattern, the split a file holds, and its reader."""

    folders: tuple[str, ...]
    pattern: str
    split: str  # regex on the file name; group 1 = split
    read: Callable


REAL = {
    "tvr": RealText(("tvr/annotations", "tvr", "."), "tvr_*_release.jsonl", r"tvr_(.+)_release", _tvr),
    "activitynet": RealText(("activitynet/annotations", "activitynet", "."), "*.json", r"(?!.*_ids$)(.+)", _activitynet),
    "charades": RealText(("charades/annotations", "charades_sta", "charades", "."), "charades_sta_*.txt",
                         r"charades_sta_(.+)", _charades),
    "didemo": RealText(("didemo/annotations", "didemo", "."), "*_data.json", r"(.+)_data", _didemo),
}
ALIASES = {"charades-sta": "charades"}  # the VCMR name of the same text


def real_files(name: str, root: Path) -> list[tuple[str, Path]]:
    """(split, file) of a real dataset under the data root."""
    spec = REAL[ALIASES.get(name, name)]
    for folder in spec.folders:
        found = []
        for path in sorted((root / folder).glob(spec.pattern)) if (root / folder).is_dir() else []:
            m = re.fullmatch(spec.split, path.stem)
            if m and "test_public" not in path.stem:  # TVR's public test file has no timestamps, nor is it read elsewhere
                found.append((m.group(1), path))
        if found:
            return found
    tried = ", ".join(str(root / f) for f in spec.folders)
    raise UserError(f"census --dataset {name}: no annotation files ({spec.pattern}) in {tried}; check --data-root")


def real_splits(name: str, root: Path, only: list[str] | None) -> list[TextSplit]:
    out = []
    spec = REAL[ALIASES.get(name, name)]
    for split, path in real_files(name, root):
        if only and split not in only:
            continue
        report = Report(strict=False)
        rows = spec.read(path, report)
        for cause in report.causes():  # rows the reader left out, said
            progress.log(f"[yellow]census[/]: {name} {split}: left out {cause}")
        videos = sorted({r.video for r in rows})
        index = {v: k for k, v in enumerate(videos)}
        text = QueryText([r.sentence for r in rows], np.array([index[r.video] for r in rows], dtype=np.int64),
                         len(videos), moments=np.array([[r.start, r.end] for r in rows], dtype=np.float64))
        out.append(TextSplit(name, split, text, video_ids=videos, left_out=report.causes()))
    if not out:
        raise UserError(f"census --dataset {name}: no split named {', '.join(only or [])}; "
                        f"found {', '.join(s for s, _ in real_files(name, root))}")
    return out


def sim_splits(name: str, only: list[str] | None, overrides: list[str] | None = None) -> list[TextSplit]:
    """The text of a simulated world; `overrides` (--set KEY=VALUE) remake the world first."""
    data = load_data(resolve("baseline", name, 0, list(overrides or [])))
    missing = [s for s in only or [] if s not in data.splits]
    if missing:
        raise UserError(f"census --dataset {name}: no split {', '.join(missing)}; it has {', '.join(data.splits)}")
    return [TextSplit(name, s, QueryText.of_split(data[s])) for s in (only or ["train"])]


def text_splits(name: str, data_root: str | None, only: list[str] | None) -> list[TextSplit]:
    if ALIASES.get(name, name) in REAL:
        if not data_root:
            raise UserError(f"census --dataset {name} reads the annotation text under a data root: pass --data-root DIR")
        return real_splits(name, Path(data_root).expanduser(), only)
    if name in DATASETS and DATASETS.get(name).simulated:
        return sim_splits(name, only)
    sims = [n for n in DATASETS.names() if DATASETS.get(n).simulated]
    raise UserError(f"census --dataset {name!r}: give one of {', '.join([*REAL, *ALIASES, *sims])}")


def judged_splits(splits: list[TextSplit], path: str) -> tuple[list[TextSplit], list[str]]:
    """The real text splits joined to a relevance file (by labelled video and caption: the
    annotation files have no MS-SL cap ids), with the join's report as note lines; a split the
    file covers none of is left out (and said so)."""

    file = read_relevance(path)
    out, notes = [], [f"Relevance: `{file.name}` ({file.format} format, SHA-256 {file.sha256})."]
    for ts in splits:
        text = ts.text
        if ts.video_ids is None:  # the command refuses --relevance for simulated text before this
            raise ValueError(f"{ts.dataset} {ts.split} is simulated text: no video ids to join a relevance file to")
        keys = SplitKeys(ts.video_ids, [""] * len(text.texts), text.texts, text.query_video)
        relevance, report = join(file, keys)
        notes += [f"- {ts.split}: " + "; ".join(line.strip() for line in report_lines(report.as_dict()))]
        if not report.covered:
            continue
        covered = np.diff(relevance.indptr) > 0
        videos = np.zeros(text.num_videos, dtype=bool)
        videos[relevance.indices] = True
        videos[text.query_video[covered]] = True
        out.append(replace(ts, text=replace(text, relevance=relevance),
                           judged=Judged(covered, videos, report.as_dict())))
    if not out:
        raise UserError(f"census --relevance {file.path}: it covers none of the queries of "
                        f"{', '.join(ts.split for ts in splits)} ({' '.join(notes[1:])}); is it this dataset's?")
    return out, notes


def world_grid(dataset: str, sets: list[str], sweeps: list[str]) -> list[list[str]]:
    """The worlds of a knob census: the fixed `--set` items plus one value of each `--sweep
    KEY=V1,V2,...`, every combination in the order given. Only simulated worlds have knobs."""
    if not (sets or sweeps):
        return [[]]
    if not (dataset in DATASETS and DATASETS.get(dataset).simulated):
        raise UserError(f"census --dataset {dataset}: --set and --sweep remake a simulated world; "
                        f"real text has no knobs (drop them, or give a sim-* dataset)")
    axes = []
    for item in sweeps:
        key, values = parse_set(item)
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not vals:
            raise UserError(f"--sweep {item}: give KEY=V1,V2,... (e.g. --sweep sim.repeat_prob=0.1,0.45)")
        axes.append([f"{key}={v}" for v in vals])
    keys = [parse_set(x)[0] for x in sets] + [parse_set(a[0])[0] for a in axes]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise UserError(f"census: {', '.join(dup)} given more than once in --set / --sweep; give each key once")
    return [[*sets, *combo] for combo in itertools.product(*axes)]


# ----------------------------------------------------------------------------- the census
class MemoEncoder:
    """Encodes each distinct string once across calls (one encoding for every Phi)."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder, self.name = encoder, encoder.name
        self.seen: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        if new:
            self.seen.update(zip(new, self.encoder.encode(new)))
        return np.stack([self.seen[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)


def census_split(ts: TextSplit, encoder: MemoEncoder, phis: list[str], thetas: list[float], parser: str,
                 device: torch.device, memory_mb: int = 512) -> tuple[list[dict], ParserChoice]:
    """The census rows of one split (one per Phi and theta), and the parser used."""
    text = ts.text
    choice, parses = ParserChoice("none", "none"), None
    if any(p != "sent" for p in phis):
        choice, parse = choose_parser(parser, text.parses, where="--parser")
        parses = parse(text.texts)
    per_phi = {phi: element_strings(text, parses, phi)[0] for phi in phis}
    distinct = sorted({s for strings in per_phi.values() for q in strings for s in q})
    progress.log(f"census: encoding {len(distinct)} distinct strings with {model_id(encoder.name)}")
    encoder.encode(distinct)  # all at once, in the encoder's batches
    truth = unlabelled_truth(text)
    rows = []
    for phi in phis:
        el = build_elements(per_phi[phi], encoder, device)
        counts = {t: np.zeros(len(text.texts), dtype=np.int64) for t in thetas}
        video_pairs: dict[float, list[np.ndarray]] = {t: [] for t in thetas}
        for i, j, score, _ in phi_blocks(el, text.query_video, min(thetas), memory_mb):
            for t in thetas:
                keep = score >= t
                counts[t] += np.bincount(i[keep], minlength=len(text.texts))
                video_pairs[t].append(np.unique(i[keep] * text.num_videos + text.query_video[j[keep]]))
        for t in thetas:
            keys = np.concatenate(video_pairs[t]) if video_pairs[t] else np.zeros(0, dtype=np.int64)
            used = choice if phi != "sent" else ParserChoice("none", "none")  # Phi_sent reads no parse
            rows.append(_row(ts, phi, t, used, encoder.name, counts[t], keys, truth))
    return rows, choice


def ambiguity(relevance, covered: np.ndarray | None) -> dict:
    """The split's multi-relevant share and relevant videos per query (the labelled one
    included), over the covered queries when a relevance file covers only some."""
    per_query = np.diff(relevance.indptr)
    if covered is not None:
        per_query = per_query[covered]
    per_query = per_query[per_query > 0]  # a query the truth knows: at least its labelled video
    if not len(per_query):
        return {}
    return {"multi_relevant_share": float(np.mean(per_query > 1)), "relevant_per_query": float(per_query.mean())}


def _row(ts: TextSplit, phi: str, theta: float, choice: ParserChoice, model: str, counts: np.ndarray,
         keys: np.ndarray, truth: np.ndarray | None) -> dict:
    n, v = len(ts.text.texts), ts.text.num_videos
    judged = ts.judged
    row: dict[str, Any] = {"dataset": ts.dataset, "world": ts.world, "split": ts.split, "queries": n, "videos": v,
                           "phi": phi,
           "theta": theta, "parser": choice.name + (" (fallback)" if choice.fallback else ""), "model": model_id(model),
           "share_with_pr": float(np.mean(counts > 0)) if n else None,
           "pr_queries_per_query": float(counts.mean()) if n else None, "pr_videos_per_query": len(keys) / max(1, n),
           "precision": None, "recall": None, "base_rate": None}
    if judged is not None:  # measured over the pairs the relevance file can say anything about
        keys = judged.keep(keys, v)
    if truth is not None:
        hits = int(np.isin(keys, truth).sum())
        nq, nv = (int(judged.queries.sum()), int(judged.videos.sum())) if judged is not None else (n, v)
        row.update(precision=hits / len(keys) if len(keys) else None, recall=hits / len(truth) if len(truth) else None,
                   base_rate=len(truth) / max(1, nq * (nv - 1)))
        row.update(ambiguity(ts.text.relevance, judged.queries if judged is not None else None))
        if row["precision"] is not None and row["base_rate"]:
            row["lift"] = row["precision"] / row["base_rate"]
        if judged is not None:
            row.update(covered_queries=nq, judged_videos=nv, judged_pr_videos_per_query=len(keys) / max(1, nq))
    return row


# ----------------------------------------------------------------------------- verb phrases per parser
def vp_counts(gold: list[str], predicted: list[str]) -> dict:
    """Precision / recall of predicted verb phrases against gold ones, query by query: a VP
    matches when its words, lower-cased and single-spaced, equal a gold VP's (each gold VP
    matched at most once)."""
    matched = n_gold = n_pred = 0
    for g, p in zip(gold, predicted):
        gv, pv = Counter(_norm(verb_phrases(read_tree(g)))), Counter(_norm(verb_phrases(read_tree(p))))
        matched, n_gold, n_pred = matched + sum((gv & pv).values()), n_gold + sum(gv.values()), n_pred + sum(pv.values())
    return {"queries": len(gold), "gold_vps": n_gold, "extracted_vps": n_pred, "matched": matched,
            "precision": matched / n_pred if n_pred else None, "recall": matched / n_gold if n_gold else None}


def _norm(phrases: list[str]) -> list[str]:
    return [" ".join(p.lower().split()) for p in phrases]


def vp_rows(ts: TextSplit, gold: list[str]) -> list[dict]:
    """One row per parser for a split with gold parses (`gold`, its text's): gold (the reference),
    benepar, rules."""
    base = {"dataset": ts.dataset, "split": ts.split}
    rows = [{**base, "parser": "gold", "status": "reference (the dataset's parses)", **vp_counts(gold, gold)}]
    ok, why = benepar_status()
    if ok:
        rows.append({**base, "parser": "benepar", "status": benepar_version(),
                     **vp_counts(gold, benepar_parse(ts.text.texts))})
    else:
        rows.append({**base, "parser": "benepar", "status": f"unavailable: {why}"})
    rows.append({**base, "parser": "rules", "status": f"rules-{RULES_VERSION} (the fallback)",
                 **vp_counts(gold, rules_parse(ts.text.texts))})
    return rows


# ----------------------------------------------------------------------------- tables
def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _csv(rows: list[dict], fields: tuple[str, ...]) -> str:
    return csv_text(fields, [["" if r.get(k) is None else f"{r[k]:.6g}" if isinstance(r.get(k), float) else str(r[k])
                              for k in fields] for r in rows])


def _md_table(rows: list[dict], fields: tuple[str, ...]) -> list[str]:
    return [markdown_table(fields, [[_fmt(r.get(k)) for k in fields] for r in rows])]


def write_census(out: Path, dataset: str, rows: list[dict], command: str, notes: list[str], tag: str = "") -> Path:
    fields: tuple[str, ...] = CENSUS_FIELDS if any(r["precision"] is not None for r in rows) else CENSUS_FIELDS[:-3]
    if any(r.get("covered_queries") is not None for r in rows):
        fields = (*CENSUS_FIELDS[:-3], *JUDGED_FIELDS, *CENSUS_FIELDS[-3:])
    if any(r.get("multi_relevant_share") is not None for r in rows):
        fields = (*fields, *TRUTH_FIELDS)
    if not any(r.get("world") for r in rows):
        fields = tuple(f for f in fields if f != "world")
    md = [f"# Census of the query text of {dataset}", "",
          "The SBERT detector (`relations=sbert`, docs/methods/sbert-pr.md) over every query of each split: "
          "`share_with_pr` = share of queries with at least one potentially relevant query in another video "
          "(Phi = 1 at theta), `pr_queries_per_query` = mean number of such queries per query, "
          "`pr_videos_per_query` = mean number of videos they are in. On simulated data, `precision` / `recall` "
          "of the detected (query, video) pairs against the truly relevant pairs the labels miss, and "
          "`base_rate` = the precision of a random guess among the unlabelled pairs; `lift` = precision / "
          "base_rate (how many times chance: unlike precision, it does not fall as the collection grows); "
          "`multi_relevant_share` and `relevant_per_query` = the split's share of queries with more than one "
          "relevant video and its mean number of relevant videos per query (the labelled one included).", "",
          *(["On real text with a relevance file (`--relevance`): the same three against the file's relevant pairs "
             "that the labels miss, over the pairs it judges (`covered_queries` = queries it covers, "
             "`judged_videos` = videos it names; `judged_pr_videos_per_query` = detected videos per covered query "
             "among those). Verified labels mined from models' top candidates are a lower bound on relevance, so "
             "precision is too.", ""] if "covered_queries" in fields else []),
          f"Written by {code(command, in_table=False)}.", "", *notes, *([""] if notes else []),
          *_md_table(rows, fields)]
    path = out / "census" / f"{dataset}{'~' + tag if tag else ''}.md"
    write_text(path, "\n".join(md) + "\n")
    write_text(path.with_suffix(".csv"), _csv(rows, fields))
    return path


def update_vp_table(out: Path, rows: list[dict], command: str) -> Path:
    """Merge a dataset's rows into vp-extraction.csv (other datasets' rows kept) and rewrite the md."""
    path = out / "census" / "vp-extraction.csv"
    kept = []
    if path.is_file():
        with open(path, newline="", encoding="utf-8") as f:
            kept = [r for r in csv.DictReader(f) if r.get("dataset") not in {x["dataset"] for x in rows}]
    merged = sorted([*kept, *rows], key=lambda r: (r["dataset"], r["split"]))
    merged = [{k: _number(v, as_float=k in VP_RATES) for k, v in r.items()} for r in merged]
    write_text(path, _csv(merged, VP_FIELDS))
    md = ["# Verb-phrase extraction per parser", "",
          "Verb phrases of each parser against the gold parses a simulated world ships, query by query: a VP matches "
          "when its words, lower-cased and single-spaced, equal a gold VP's (each gold VP matched at most once); "
          "precision = matched / extracted, recall = matched / gold. The simulated text is templated English, "
          "easier than real captions: read these figures as an upper bound of each parser's quality on real text.",
          "", f"Last written by {code(command, in_table=False)} (each dataset's rows come from its own census).", "",
          *_md_table(merged, VP_FIELDS)]
    write_text(path.with_suffix(".md"), "\n".join(md) + "\n")
    return path.with_suffix(".md")


def _number(v, as_float: bool = False):
    """A csv cell back as a number where it is one (rows read from the csv are strings); a rate
    column (`as_float`) stays a float, so a stored "1" is shown as 1.0000 like a fresh row's 1.0."""
    if not isinstance(v, str) or v == "":
        return None if v == "" else v
    if as_float:
        try:
            return float(v)
        except ValueError:
            return v
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


# ----------------------------------------------------------------------------- the command
@command("census", "the SBERT detector's census of a dataset's query text")
def add_commands(sub) -> None:
    p = sub.add_parser("census", help="potentially relevant query pairs in a dataset's text, per Phi and theta "
                                      "(the SBERT detector); writes OUT/census/<dataset>.{md,csv}")
    p.add_argument("--dataset", required=True,
                   help=f"a real dataset ({', '.join([*REAL, *ALIASES])}: needs --data-root) or a simulated one (sim-*)")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="folder holding the real datasets' annotation files (e.g. DIR/tvr/tvr_val_release.jsonl)")
    p.add_argument("--split", nargs="+", default=None,
                   help="splits to count (default: every annotation file of a real dataset; train of a simulated one)")
    p.add_argument("--phi", nargs="+", default=list(PHIS), choices=PHIS)
    p.add_argument("--theta", nargs="+", type=float, default=list(THETAS))
    p.add_argument("--model", default=PACKAGED_MODEL, help="sentence-transformers model folder (default: the packaged "
                                                           "all-MiniLM-L6-v2)")
    p.add_argument("--parser", default="auto", choices=PARSERS)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--batch-size", type=int, default=256, help="sentences per encoder batch")
    p.add_argument("--memory-mb", type=int, default=512, help="bound on one block of cosines")
    p.add_argument("--out", default="results")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="simulated worlds only: a knob of the world (e.g. sim.val_videos=2179), repeatable")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="simulated worlds only: one census per value (several --sweep: every combination), all in "
                        "OUT/census/<dataset>~<tag>.{md,csv}")
    p.add_argument("--tag", default=None,
                   help="name of a knob census's table (default: knobs) or of a --relevance one (default: relevance)")
    p.add_argument("--relevance", default=None, metavar="FILE",
                   help="real datasets: a relevance file (prvr-ea's or ours) to measure the detected pairs against; "
                        "writes OUT/census/<dataset>~<tag>.{md,csv}")
    p.add_argument("--relevance-source", default=None, metavar="TEXT",
                   help="with --relevance: where the file comes from (e.g. repository@commit), written in the table")
    p.set_defaults(func=cmd_census)


def cmd_census(args: argparse.Namespace) -> None:
    check_device(args.device, "--device", "--device cpu (or auto)")
    if not all(-1 <= t <= 1 for t in args.theta):
        raise UserError(f"--theta takes cosines in [-1, 1], got {' '.join(map(str, args.theta))}")
    worlds = world_grid(args.dataset, args.sets, args.sweep)
    knobs = worlds != [[]]
    if args.tag is not None and not (knobs or args.relevance):
        raise UserError("census --tag names a knob or --relevance census: give it with --set / --sweep / --relevance, "
                        "or drop it")
    if args.relevance_source is not None and not args.relevance:
        raise UserError("census --relevance-source says where a --relevance file comes from: give it with --relevance")
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", args.tag):
        raise UserError(f"census --tag {args.tag!r}: use letters, digits, '.', '_' or '-' (it names a file)")
    if knobs:  # every world is made (its knobs checked) before any encoding
        splits = [TextSplit(ts.dataset, ts.split, ts.text, " ".join(world))
                  for world in worlds for ts in sim_splits(args.dataset, args.split, world)]
    else:
        splits = text_splits(args.dataset, args.data_root, args.split)
    judged_notes: list[str] = []
    if args.relevance:
        if knobs or not all(ts.video_ids is not None for ts in splits):
            raise UserError(f"census --relevance measures real text against a relevance file; {args.dataset} is "
                            "simulated and carries its own ground truth (drop --relevance)")
        splits, judged_notes = judged_splits(splits, args.relevance)
        if args.relevance_source:
            judged_notes.insert(1, f"Source: {markdown_cell(args.relevance_source)}.")  # one line, no markup
    device = pick_device(args.device)
    encoder = MemoEncoder(sbert.make_encoder(args.model, str(device), args.batch_size))  # tests inject a fake here
    rows, notes, vp = [], list(judged_notes), []
    for ts in splits:
        progress.log(f"census: {ts.dataset} {ts.split}{' (' + ts.world + ')' if ts.world else ''}, "
                     f"{len(ts.text.texts)} queries")
        split_rows, choice = census_split(ts, encoder, args.phi, sorted(args.theta), args.parser, device, args.memory_mb)
        rows += split_rows
        if choice.fallback:
            notes.append(f"**Parser: `{choice.name}`, a fallback** for {ts.split} ({choice.fallback}).")
        if ts.left_out:
            notes.append(f"Annotation rows of {ts.split} left out (not readable as queries): "
                         + "; ".join(ts.left_out) + ".")
        if ts.text.parses is not None and not ts.world:  # the VP table measures the preset worlds
            vp += vp_rows(ts, ts.text.parses)
    out = Path(args.out)
    tag = (args.tag or "knobs") if knobs else (args.tag or "relevance") if args.relevance else ""
    path = write_census(out, args.dataset, rows, _command(args), notes, tag)
    progress.log(f"wrote {path} and {path.with_suffix('.csv')}")
    if vp:
        progress.log(f"wrote {update_vp_table(out, vp, _command(args))}")


def _command(args: argparse.Namespace) -> str:
    """The command as stored in the tables; a data root is written as DIR (no machine path)."""
    parts = ["prvr-bench", "census", "--dataset", args.dataset]
    if args.data_root:
        parts += ["--data-root", "DIR"]
    for flag, value, default in (("--split", args.split, None), ("--phi", args.phi, list(PHIS)),
                                 ("--theta", args.theta, list(THETAS)), ("--parser", args.parser, "auto"),
                                 ("--out", args.out, "results")):
        if value != default and value is not None:
            parts += [flag, *(map(str, value) if isinstance(value, list) else [str(value)])]
    if args.model != PACKAGED_MODEL:
        parts += ["--model", model_id(args.model)]
    parts += [x for s in args.sets for x in ("--set", s)] + [x for s in args.sweep for x in ("--sweep", s)]
    if args.tag:
        parts += ["--tag", args.tag]
    if args.relevance:  # the file by its name (its SHA-256 is in the table)
        parts += ["--relevance", Path(args.relevance).name]
    if args.relevance_source:
        parts += ["--relevance-source", shlex.quote(args.relevance_source)]
    return " ".join(parts)
