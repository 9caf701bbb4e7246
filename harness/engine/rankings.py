"""Stored rankings: a run's val and test ranks kept beside its record, to score again later.

A run (harness/engine/runner.py) keeps the ranks of the scores its evaluator ranked: val's at the
best epoch (the evaluation that chose the checkpoint), test's from the test evaluation (`RankingSink`);
only a resumed run, whose best epoch was evaluated by an earlier process, ranks val once more.
`seed<S>.rank.npz` beside `seed<S>.json` keeps, per query: the top K videos (K = `TOP_K` = 100 by
default, best first), each listed video's rank under the evaluator's rule (#{v : s_v >= s}: ties
count against the model), and the labelled video's rank; plus the split's ids, query texts,
labelled videos and M/V fractions, so that the file alone can be joined to a relevance file; and for a
backbone that localizes, each query's best VCMR hit rank per tIoU threshold (harness/engine/vcmr.py
`best_hit_ranks`, `RankingSink.keep_moments`), from which the record's VCMR figures follow exactly
(`moment_sumr`) and the statistics pair VCMR SumR by query (`moment_query_scores`).
`prvr-bench evaluate RECORD --relevance FILE` (harness/cli/reevaluate.py) then scores the run under
new labels without its checkpoint: R@K, SumR, median and mean rank and the M/V buckets exactly
(from the labelled ranks), and the oracle figures (R@K, SumR, dense R@K, the multi-relevant share,
coverage) exactly for every K <= the stored K. What needs every video's score is not stored:
`unlabelled_above` (None).

A listed video tied with the first video past the list has a rank past K: its rank is
stored as K + 1, which is all the metrics at K <= 100 need. The file is a compressed numpy
archive read with allow_pickle=False: integers, floats, and the texts as UTF-8 JSON bytes.
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp
import torch

from prvr.datasets.real.relevance import SplitKeys
from prvr.harness.engine.evaluate import (KS, ScoreFn, compute_ranks, encode_split, fused_scores, metrics_from_ranks,
                                          recall_table)
from prvr.harness.base.io import UserError, atomic_path
from prvr.harness.engine.vcmr import NO_MOMENT, VCMR_KS, recalls_of_ranks

TOP_K = 100
RECALLS = (*(f"R@{k}" for k in KS), "SumR")  # the figures a record states that its rankings give
MOMENT_SUM = "VCMR SumR"  # ... and, where they hold moment ranks, this one
FORMAT = 1
SUFFIX = ".rank.npz"


@dataclass
class SplitRanking:
    """The stored ranks of one split."""

    top: np.ndarray  # [Q, k] video indices, best first
    top_rank: np.ndarray  # [Q, k] each listed video's rank; k + 1: tied with the first video past the list
    labelled_rank: np.ndarray  # [Q] the labelled video's rank (the evaluator's `labelled` ranks)
    moment_fraction: np.ndarray  # [Q] moment length / video length, NaN where unknown
    keys: SplitKeys
    top_k: int
    # a localizing run's labelled VCMR per query: its best hit's rank per threshold (harness/engine/vcmr.py
    # `best_hit_ranks`: NO_HIT, NO_MOMENT), [Q, T]; None where the run does not localize or predates them
    vcmr_best: np.ndarray | None = None
    vcmr_tious: tuple[float, ...] = ()

    @property
    def num_queries(self) -> int:
        return len(self.labelled_rank)

    def labels(self) -> sp.csr_matrix:
        q = np.arange(self.num_queries)
        return sp.csr_matrix((np.ones(len(q), dtype=bool), (q, self.keys.query_video)),
                             shape=(self.num_queries, len(self.keys.video_ids)))


def moment_query_scores(ranking: SplitRanking) -> np.ndarray | None:
    """[Q] per-query VCMR SumR (the sum over thresholds and k of 100 where the best hit ranks <= k),
    scaled by Q / (queries with a moment) and 0 for a query without one, so that the mean over all
    the split's queries is the record's VCMR SumR (which counts only queries with a moment); None
    where the rankings hold no moment ranks."""
    best = ranking.vcmr_best
    if best is None:
        return None
    known = best[:, 0] != NO_MOMENT
    hits = 100.0 * (best[:, :, None] <= np.asarray(VCMR_KS)[None, None, :]).sum((1, 2))
    return np.where(known, hits * len(best) / max(int(known.sum()), 1), 0.0)


def moment_sumr(ranking: SplitRanking) -> float:
    """The split's VCMR SumR from its stored moment ranks (as the record states it)."""
    assert ranking.vcmr_best is not None
    return float(sum(recalls_of_ranks(ranking.vcmr_best, "VCMR", VCMR_KS, ranking.vcmr_tious).values()))


def rankings_path(record: str | Path) -> Path:
    """seed<S>.json -> seed<S>.rank.npz beside it."""
    record = Path(record)
    return record.with_name(record.stem + SUFFIX)


# ----------------------------------------------------------------------------- ranking
def top_ranks(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k videos per query of NaN-free scores [q, V] (`worst_if_nonfinite`), best first,
    and each one's rank #{v : s_v >= s} (k + 1 where it ties with the first unlisted video)."""
    n = scores.shape[1]
    k = min(k, n)
    values, index = scores.topk(min(k + 1, n), dim=1)  # descending
    listed = values[:, :k].contiguous()
    # #{listed i : s_i >= s_j}, exact where s_j beats every unlisted score
    rank = torch.searchsorted(-listed, -listed, right=True)
    if n > k:
        rank = rank.masked_fill(listed <= values[:, k : k + 1], k + 1)
    return index[:, :k], rank


@torch.no_grad()
def rank_split(model: torch.nn.Module, split, batcher, device: torch.device, chunk: int,
               top_k: int = TOP_K) -> SplitRanking:
    """Encode the split once and keep its ranks (the fused score, as `evaluate_model` ranks it)."""
    queries, videos = encode_split(model, split, batcher, device)
    return ranking_of(fused_scores(model, queries, videos), split, chunk, top_k)


def ranking_of(score_fn: ScoreFn, split, chunk: int, top_k: int = TOP_K) -> SplitRanking:
    """The SplitRanking of chunked scores (`compute_ranks`' ScoreFn) of a split."""
    sink = RankingSink(split, top_k)
    compute_ranks(score_fn, split.num_queries, split.labels(), chunk=chunk, sink=sink)
    return sink.ranking()


class RankingSink:
    """A split's SplitRanking made from its score chunks as a scoring pass hands them over (a
    `evaluate.ChunkSink`): `evaluate_model(..., sink=RankingSink(split))` ranks the split and keeps
    its rankings from the same scores, so that a run's stored rankings cost no second encoding or
    scoring of the split (harness/engine/runner.py). Chunks come in query order, each once."""

    def __init__(self, split, top_k: int = TOP_K) -> None:
        if top_k < max(KS):
            raise UserError(f"stored rankings keep at least the top {max(KS)} videos (R@{max(KS)}), got {top_k}")
        self.split, self.top_k, self.next = split, top_k, 0
        # kept where the scores are (a GPU's chunks are not read back one by one: `ranking` reads them once)
        self.tops: list[torch.Tensor] = []
        self.ranks: list[torch.Tensor] = []
        self.labelled: list[torch.Tensor] = []
        self.vcmr_best: np.ndarray | None = None
        self.vcmr_tious: tuple[float, ...] = ()

    def keep_moments(self, best: np.ndarray, tious: tuple[float, ...]) -> None:
        """The split's per-query VCMR best-hit ranks, as the moment pass counts them (`vcmr.MomentSink`)."""
        if len(best) != self.split.num_queries:
            raise ValueError(f"rankings: moment ranks of {len(best)} queries for a split of {self.split.num_queries}")
        self.vcmr_best, self.vcmr_tious = np.asarray(best, dtype=np.int64), tuple(float(t) for t in tious)

    def __call__(self, start: int, scores: torch.Tensor, labelled: torch.Tensor) -> None:
        """A chunk as `compute_ranks` ranks it: its NaN-free float scores and labelled ranks."""
        if start != self.next:  # a chunk missed or given twice would shift every later query's ranks
            raise ValueError(f"rankings: the chunk of queries from {start} came where the one from {self.next} was due")
        index, rank = top_ranks(scores, self.top_k)
        self.tops.append(index)
        self.ranks.append(rank)
        self.labelled.append(labelled)
        self.next = start + scores.shape[0]

    def ranking(self) -> SplitRanking:
        if self.next != self.split.num_queries:
            raise ValueError(f"rankings: {self.next} of {self.split.num_queries} queries were scored")
        k = min(self.top_k, self.split.num_videos)
        return SplitRanking(_host(self.tops, (0, k)), _host(self.ranks, (0, k)), _host(self.labelled, (0,)),
                            np.asarray(self.split.moment_fraction(), dtype=np.float64), SplitKeys.of_split(self.split),
                            self.top_k, self.vcmr_best, self.vcmr_tious)


def _host(parts: list[torch.Tensor], empty: tuple[int, ...]) -> np.ndarray:
    """Chunks kept on their device, read back at once as one int64 array (`empty`'s shape without any)."""
    return torch.cat(parts).cpu().numpy().astype(np.int64) if parts else np.zeros(empty, dtype=np.int64)


# ----------------------------------------------------------------------------- scoring again
def ranks_of(ranking: SplitRanking, relevance: sp.csr_matrix | None) -> dict[str, np.ndarray]:
    """The `compute_ranks` dict the stored ranks give: `labelled`, and under a relevance
    matrix `oracle` (exact up to the stored K; past it: K + 1) and `relevant_top`."""
    out = {"labelled": ranking.labelled_rank}
    if relevance is None:
        return out
    nq, nv = relevance.shape
    coo = sp.coo_matrix(relevance)
    relevant_keys = np.unique(coo.row.astype(np.int64) * nv + coo.col)
    listed = np.arange(nq, dtype=np.int64)[:, None] * nv + ranking.top
    hit = np.isin(listed, relevant_keys)  # [Q, k]: the listed video is relevant
    past = ranking.top_k + 1
    out["oracle"] = np.where(hit, ranking.top_rank, past).min(1, initial=past)
    out["relevant_top"] = np.stack([(hit & (ranking.top_rank <= k)).sum(1) for k in KS], axis=1)
    return out


def metrics_of(ranking: SplitRanking, relevance: sp.csr_matrix | None) -> dict:
    """The metrics block of the stored ranks (under `relevance` where given); see the module note."""
    return metrics_from_ranks(ranks_of(ranking, relevance), ranking.moment_fraction, relevance)


# ----------------------------------------------------------------------------- the file
def save_rankings(path: str | Path, rankings: dict[str, SplitRanking], meta: dict[str, Any]) -> Path:
    """Write the splits' rankings atomically (compressed; read back by `load_rankings`)."""
    arrays: dict[str, np.ndarray] = {"meta": _json_bytes({"format": FORMAT, **meta, "splits": list(rankings)})}
    for name, r in rankings.items():
        nv = len(r.keys.video_ids)
        positions = np.arange(1, r.top.shape[1] + 1)
        arrays[f"{name}.top"] = r.top.astype(np.uint16 if nv < 2**16 else np.int32)
        # rank - position: 0 but where ties are (rank >= position), so the column compresses to nothing
        arrays[f"{name}.ties"] = (r.top_rank - positions).astype(np.uint8 if r.top_k < 2**8 else np.int32)
        arrays[f"{name}.labelled_rank"] = r.labelled_rank.astype(np.int32)
        arrays[f"{name}.moment_fraction"] = r.moment_fraction
        arrays[f"{name}.query_video"] = r.keys.query_video.astype(np.int32)
        text: dict[str, Any] = {"video_ids": r.keys.video_ids, "query_ids": r.keys.query_ids,
                                "query_text": r.keys.query_text, "top_k": r.top_k}
        if r.vcmr_best is not None:
            arrays[f"{name}.vcmr_best"] = r.vcmr_best.astype(np.int32)
            text["vcmr_tious"] = list(r.vcmr_tious)
        arrays[f"{name}.text"] = _json_bytes(text)
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        # numpy's stub lets a **dict of arrays fill its allow_pickle: bool; no key here is named so
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
    return path


def load_rankings(path: str | Path) -> tuple[dict[str, SplitRanking], dict[str, Any]]:
    """The rankings of a `.rank.npz` and its meta, each split checked to be rankings a run can store
    (`check_split`); an unreadable or malformed file is a one-line error naming it."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = _from_json(z["meta"])
            if not isinstance(meta, dict):
                raise ValueError(f"its meta is {type(meta).__name__}, not an object")
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, this prvr-bench reads {FORMAT}")
            splits = meta.get("splits")
            if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
                raise ValueError(f"its meta's 'splits' is {splits!r}, not a list of split names")
            out = {name: _split_of(z, name) for name in splits}
    except UserError:
        raise
    except (OSError, EOFError, KeyError, ValueError, TypeError, IndexError, AttributeError, zipfile.BadZipFile,
            zlib.error) as e:
        raise UserError(f"stored rankings {path} cannot be read ({type(e).__name__}: {e}); re-evaluate the run "
                        "from its checkpoint instead (prvr-bench evaluate RECORD --relevance FILE --from-checkpoint)") \
            from None
    for name, ranking in out.items():
        problem = split_problem(ranking)
        if problem:
            raise UserError(f"stored rankings {path}, split {name!r}: {problem}, which no run stores; the file was "
                            "changed or is another tool's: re-run that run, or re-evaluate it from its checkpoint "
                            "(--from-checkpoint)")
    return out, meta


def split_problem(r: SplitRanking) -> str | None:
    """What makes a split's rankings impossible for a run to have stored, in words; None when sound: ranks
    from 1 to the split's videos, video indices within the split, the stored width its `top_k` (or the
    split's videos, where fewer), each
    listed rank at least its position, moment fractions in [0, 1] or unknown (NaN)."""
    q, nv = len(r.labelled_rank), len(r.keys.video_ids)
    if r.top_k < 1 or r.top.ndim != 2 or r.top.shape != (q, min(r.top_k, nv)) or r.top_rank.shape != r.top.shape:
        return f"top is {r.top.shape} for {q} queries of top_k {r.top_k} among {nv} videos"
    if not (len(r.keys.query_ids) == len(r.keys.query_text) == len(r.keys.query_video) == len(r.moment_fraction) == q):
        return f"its query columns have {len(r.keys.query_ids)}, {len(r.keys.query_text)}, {len(r.keys.query_video)} " \
               f"and {len(r.moment_fraction)} rows for {q} queries"
    if q and (r.labelled_rank.min() < 1 or r.labelled_rank.max() > nv):
        return f"labelled ranks from {r.labelled_rank.min()} to {r.labelled_rank.max()} among {nv} videos"
    for what, idx in (("listed video", r.top), ("labelled video", r.keys.query_video)):
        if idx.size and (idx.min() < 0 or idx.max() >= nv):
            return f"{what} indices from {idx.min()} to {idx.max()} for {nv} videos"
    positions = np.arange(1, r.top.shape[1] + 1)
    if r.top.size and (np.any(r.top_rank < positions) or r.top_rank.max() > max(nv, r.top_k + 1)):
        return "listed ranks below their positions (negative ties) or past the split"
    frac = np.asarray(r.moment_fraction, dtype=float)
    if np.any(np.isinf(frac)) or np.any((frac < 0) | (frac > 1)):
        return "moment fractions outside [0, 1]"
    return None if r.vcmr_best is None else _moment_problem(r.vcmr_best, r.vcmr_tious, q)


def _moment_problem(best: np.ndarray, tious: tuple[float, ...], q: int) -> str | None:
    """What makes stored VCMR ranks impossible (`vcmr.best_hit_ranks`), in words; None when sound."""
    if best.ndim != 2 or best.shape != (q, len(tious)) or not tious:
        return f"VCMR ranks are {best.shape} for {q} queries and {len(tious)} tIoU thresholds"
    if not all(isinstance(t, float) and 0 < t <= 1 for t in tious):
        return f"VCMR tIoU thresholds {list(tious)} outside (0, 1]"
    none = best == NO_MOMENT
    if np.any(none.any(1) != none.all(1)) or np.any(~none & (best < 1)):
        return "VCMR ranks below 1, or a query without a moment at some thresholds only"
    return None


def check_of_record(stored: Path, record_file: Path, record: Mapping[str, Any], meta: Mapping[str, Any],
                    rankings: dict[str, SplitRanking]) -> None:
    """Stored rankings are their record's: the meta's dataset, run and seed are the record's, and every split's
    R@K and SumR recomputed from them are the record's own (rankings renamed in place after a kill before the
    record was, or copied from another seed, are refused, one line naming both files)."""
    want = {"dataset": record["dataset"], "run": record.get("run_name", record["method"]), "seed": record["seed"]}
    for key, value in want.items():
        if meta.get(key) != value:
            raise UserError(f"stored rankings {stored} are of {key} {meta.get(key)!r}, but run record {record_file} is "
                            f"of {value!r}: the rankings do not belong to the record; re-run that run")
    for split, ranking in rankings.items():
        stated = record.get("metrics", {}).get(split, {})
        if ranking.vcmr_best is not None and MOMENT_SUM in stated:
            moments = moment_sumr(ranking)
            if not math.isclose(moments, float(stated[MOMENT_SUM]), rel_tol=1e-9, abs_tol=1e-9):
                raise UserError(f"stored rankings {stored} give {split} {MOMENT_SUM} {moments:.4f}, but run record "
                                f"{record_file} says {float(stated[MOMENT_SUM]):.4f}: the rankings do not belong to "
                                "the record; re-run that run")
        again = recall_table(ranking.labelled_rank)
        for key in RECALLS:
            if key in stated and not math.isclose(again[key], float(stated[key]), rel_tol=1e-9, abs_tol=1e-9):
                raise UserError(f"stored rankings {stored} give {split} {key} {again[key]:.4f}, but run record "
                                f"{record_file} says {float(stated[key]):.4f}: the rankings do not belong to the "
                                "record; re-run that run")


def rankings_of_record(record_file: str | Path, record: Mapping[str, Any]) -> tuple[dict[str, SplitRanking], Path]:
    """The rankings stored beside a record, checked to be sound and the record's own."""
    stored = rankings_path(record_file)
    if not stored.is_file():
        raise UserError(f"run record {record_file} has no stored rankings ({stored.name}: runs made before rankings "
                        "were stored have none); re-run that run, or (evaluate --relevance) add --from-checkpoint to "
                        "rank it again from its checkpoint")
    rankings, meta = load_rankings(stored)
    check_of_record(stored, Path(record_file), record, meta, rankings)
    return rankings, stored


def _split_of(z, name: str) -> SplitRanking:
    text = _from_json(z[f"{name}.text"])
    top = z[f"{name}.top"].astype(np.int64)
    top_rank = z[f"{name}.ties"].astype(np.int64) + np.arange(1, top.shape[1] + 1)
    keys = SplitKeys(text["video_ids"], text["query_ids"], text["query_text"], z[f"{name}.query_video"].astype(np.int64))
    best = z[f"{name}.vcmr_best"].astype(np.int64) if f"{name}.vcmr_best" in z.files else None
    tious = tuple(float(t) if isinstance(t, (int, float)) else math.nan for t in text.get("vcmr_tious", []))
    return SplitRanking(top, top_rank, z[f"{name}.labelled_rank"].astype(np.int64), z[f"{name}.moment_fraction"],
                        keys, int(text["top_k"]), best, tious)


def _json_bytes(obj: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode("utf-8"), dtype=np.uint8)


def _from_json(array: np.ndarray) -> Any:
    return json.loads(array.tobytes().decode("utf-8"))
