"""Statistics from stored rankings: is row A better than row B on a dataset's test split, and by how much?

A run's record holds its test R@K and SumR; its stored rankings (`seed<S>.rank.npz`,
harness/engine/rankings.py) hold each test query's labelled rank, from which those figures are
the mean over queries of per-query scores: R@K of a query is 100 if its labelled video ranks
<= K else 0, its SumR the sum of its four R@K. Two rows of one dataset share their seeds' test
queries, so their per-(seed, query) scores pair up, and this module compares them:

- the difference of the rows' mean figure (mean over the shared seeds of each seed's test
  figure, A minus B), with a 95% interval from a two-level paired bootstrap: resample the seeds
  with replacement, then within each resampled seed its test queries with replacement, the
  same query indices for both rows (`bootstrap_differences`). The seed level carries the
  training randomness, the query level the test set's. `scipy.stats.bootstrap` resamples one
  level only, so this is numpy: one seeded Generator, vectorized over resamples in chunks;
  the interval is the percentile interval of the resampled differences;
- the p of a paired randomization test (`randomization_p`): under the null the two rows'
  scores of a (seed, query) are exchangeable, so each pair's scores swap at random
  (the null of `scipy.stats.permutation_test`, permutation_type='samples', two-sided, drawn
  as scipy draws it and computed as one matrix product per batch: the same p, faster);
- Holm's step-down correction over every p a table reports (`holm`; scipy has only the
  Benjamini-Hochberg `false_discovery_control`).

With a single shared seed there is no seed level: `Settings(min_seeds=1)` (`--min-seeds 1`)
then gives the query-level interval and test, marked `QUERIES_ONLY` in the table; by default
two shared seeds are required. Every figure is seeded and deterministic. docs/statistics.md
says what a difference means and why these libraries.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Mapping, Sequence

import numpy as np

from prvr.datasets.real.relevance import SplitKeys
from prvr.harness.base.io import UserError
from prvr.harness.base.names import check_name, inside
from prvr.harness.base.registry import DATASETS, load_all
from prvr.harness.engine.config import from_dict
from prvr.harness.engine.evaluate import KS
from prvr.harness.engine.rankings import MOMENT_SUM, SplitRanking, moment_query_scores, rankings_of_record, ranks_of
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import RECORD_FILE, load_record_at
from prvr.harness.reports.rows import dataset_label
from prvr.harness.reports.table import ORACLE_SUMR, csv_text, markdown_cell, markdown_table, spreadsheet_safe, \
    world_digest  # noqa: F401

METRICS: tuple[str, ...] = (*(f"R@{k}" for k in KS), "SumR")
# every metric a comparison can take: the default ones, VCMR SumR where the rankings hold moment ranks, and the
# oracle SumR (any truly relevant video counts) where the run's world is simulated and rebuilt from its config
ALL_METRICS: tuple[str, ...] = (*METRICS, MOMENT_SUM, ORACLE_SUMR)
RESAMPLES = 10_000  # bootstrap resamples
PERMUTATIONS = 10_000  # randomization-test resamples
SEED = 0
LEVEL = 0.95
SPLIT: Final = "test"
BOTH_LEVELS: Final = "seeds and queries"
QUERIES_ONLY: Final = "queries only (1 seed)"
IntervalOver = Literal["seeds and queries", "queries only (1 seed)"]
CHUNK_ELEMENTS = 2**20  # query draws per bootstrap chunk: bounds its memory (~8 bytes x metrics each)
PERMUTATION_BATCH = 1000  # permutations per vectorized call of the statistic


# ----------------------------------------------------------------------------- per-query scores
@dataclass(frozen=True)
class SeedScores:
    """One seed of one row: its test query ids, labelled videos and per-query scores."""

    seed: int
    record: Path
    query_ids: list[str]
    labelled_videos: list[str]
    scores: np.ndarray  # [Q, len(ALL_METRICS)] in percent; the column means are the record's figures (NaN: none)
    figures: dict[str, float]  # the record's stored test figures (ALL_METRICS; NaN where it states none)
    missing: Mapping[str, str] = dataclasses.field(default_factory=dict)  # metric -> why its column is NaN


@dataclass(frozen=True)
class Row:
    """A row (run name) of a dataset: its seeds' scores, and the world it was run in."""

    dataset: str
    run: str
    world: tuple[str, ...]
    seeds: dict[int, SeedScores]


def query_scores(labelled_rank: np.ndarray) -> np.ndarray:
    """[Q, len(METRICS)] per-query R@K (100 or 0) and SumR (their sum) from 1-based labelled ranks:
    each column's mean is `recall_table`'s figure (harness/engine/evaluate.py)."""
    hits = 100.0 * (np.asarray(labelled_rank)[:, None] <= np.asarray(KS)[None, :])
    return np.concatenate([hits, hits.sum(axis=1, keepdims=True)], axis=1)


def world_of(record: RunRecord) -> tuple[str, ...]:
    """What makes two records' test sets one world: the dataset (marked where it is an export of a
    simulated one), the simulator's generator version, the data scale and the test split's facts as the
    run recorded them (`table.world_digest`: `--set sim.repeat_prob=0.6` makes another world under the
    same dataset name, a sweep's)."""
    data = record.get("provenance", {}).get("data", {})
    config: Mapping[str, Any] = record.get("config", {})
    scale = (config.get("data") or {}).get("scale", "")
    return (dataset_label(record), str(data.get("generator_version", "")), str(scale), world_digest(record))


class NoRecords(UserError):
    """A row with no run records under its folder: not made yet (a report may say so rather than fail)."""


def load_row(out: str | Path, dataset: str, run: str, oracle: bool = False) -> Row:
    """Every seed of `<out>/runs/<dataset>/<run>/`, each with its test scores from its stored rankings (and
    with `oracle`, per-query oracle SumR: `oracle_query_scores`)."""
    check_name(dataset, "--dataset", "give a dataset name, e.g. sim-tvr-v2")
    check_name(run, "row", "give a run's folder name, e.g. msl or arl~base")
    folder = inside(Path(out) / "runs" / dataset / run, out, "run folder")
    files = sorted(f for f in folder.glob("seed*.json") if RECORD_FILE.fullmatch(f.name)) if folder.is_dir() else []
    if not files:
        raise NoRecords(f"row {run!r}: no run records under {folder}; check the row's name, --dataset and --out")
    seeds: dict[int, SeedScores] = {}
    worlds: dict[tuple[str, ...], Path] = {}
    for f in files:
        record = load_record_at(f)
        worlds.setdefault(world_of(record), f)
        seeds[record["seed"]] = seed_scores(f, record, oracle)
    if len(worlds) > 1:
        (w1, f1), (w2, f2) = list(worlds.items())[:2]
        raise UserError(f"row {run!r} mixes worlds: {f1} is {_world(w1)}, {f2} is {_world(w2)}; "
                        "keep one world's runs in a run folder")
    return Row(dataset, run, next(iter(worlds)), dict(sorted(seeds.items())))


def seed_scores(path: Path, record: RunRecord, oracle: bool = False) -> SeedScores:
    """A record's test scores from the rankings stored beside it, checked to be its own
    (`rankings.rankings_of_record`: the meta's run, dataset and seed, and every figure they give); with
    `oracle`, the oracle SumR column too where the run's world can be rebuilt (`oracle_query_scores`)."""
    rankings, stored = rankings_of_record(path, record)
    if SPLIT not in rankings:
        raise UserError(f"stored rankings {stored} hold no {SPLIT} split (only {', '.join(rankings) or 'none'}); "
                        "re-run that run to compare it")
    ranking = rankings[SPLIT]
    block: Mapping[str, Any] = record["metrics"][SPLIT]
    figures = {m: float(block.get(m, math.nan)) for m in ALL_METRICS}
    figures[ORACLE_SUMR] = float((block.get("oracle") or {}).get("SumR", math.nan))
    keys = ranking.keys
    nan = np.full(len(ranking.labelled_rank), math.nan)
    missing = {}
    moments = moment_query_scores(ranking)
    if moments is None or MOMENT_SUM not in block:  # no moment ranks: the column is NaN, and refused by name
        moments = nan
        missing[MOMENT_SUM] = (f"its stored rankings ({path.name}) hold no per-query VCMR SumR (a run that does not "
                               "localize, or one made before the rankings kept moment ranks)")
    found, why = oracle_query_scores(record, ranking, figures[ORACLE_SUMR]) if oracle else (None, "not asked for")
    if found is None:
        missing[ORACLE_SUMR] = f"no per-query oracle SumR from its stored rankings ({path.name}): {why}"
    scores = np.concatenate([query_scores(ranking.labelled_rank), moments[:, None],
                             (nan if found is None else found)[:, None]], axis=1)
    return SeedScores(record["seed"], path, list(keys.query_ids), [keys.video_ids[i] for i in keys.query_video],
                      scores, figures, missing)


_RELEVANCE: dict[str, Any] = {}  # a simulated world's test relevance, rebuilt once per world and process
_WORLDS_KEPT = 16


def oracle_query_scores(record: RunRecord, ranking: SplitRanking, figure: float) -> tuple[np.ndarray | None, str]:
    """[Q] each test query's oracle SumR (the sum over K of 100 where any truly relevant video ranks <= K),
    from the stored top lists (exact for K <= their width: harness/engine/rankings.py `ranks_of`) and the
    relevance of the run's simulated world, rebuilt from the record's config (the world is generated, not
    stored: about a second per world, kept for the process). A query no relevant video covers scores 0
    and the others are scaled by queries / covered, so the mean is the record's oracle SumR, which is
    checked: (None, why) where the world is not simulated, does not rebuild to the ranked queries, or gives
    another figure than the record's."""
    if math.isnan(figure):
        return None, "its record states no oracle SumR (a run without ground truth)"
    load_all()
    try:
        cfg = from_dict(record["config"], "its config")
    except UserError as e:  # a record of an older config: its world is not rebuilt, and the row says why
        return None, f"its world cannot be rebuilt ({e})"
    if cfg.dataset not in DATASETS or not DATASETS.get(cfg.dataset).simulated:
        return None, (f"{cfg.dataset} is not a simulated world, so its ground truth is not rebuilt here (score it "
                      "under a relevance file: prvr-bench evaluate RECORD --relevance FILE)")
    d = cfg.to_dict()
    key = repr((cfg.dataset, d.get("data"), d.get("sim")))
    if key not in _RELEVANCE:
        if len(_RELEVANCE) >= _WORLDS_KEPT:
            _RELEVANCE.pop(next(iter(_RELEVANCE)))
        try:
            split = DATASETS.get(cfg.dataset).load_truth(cfg)
        except UserError as e:
            return None, f"its world cannot be rebuilt ({e})"
        _RELEVANCE[key] = None if split is None else (SplitKeys.of_split(split).query_ids, split.relevance)
    world = _RELEVANCE[key]
    if world is None or world[1] is None or world[0] != list(ranking.keys.query_ids):
        return None, "its world, rebuilt from the record's config, does not give the ranked test queries"
    relevance = world[1]
    covered = np.diff(relevance.tocsr().indptr) > 0
    hits = query_scores(ranks_of(ranking, relevance)["oracle"])[:, -1]
    scores = np.where(covered, hits * len(covered) / max(int(covered.sum()), 1), 0.0)
    if not math.isclose(float(scores.mean()), figure, rel_tol=0, abs_tol=1e-6):
        return None, (f"its world, rebuilt from the record's config, gives oracle SumR {scores.mean():.4f} where "
                      f"the record states {figure:.4f} (a world of an earlier generator)")
    return scores, ""


# ----------------------------------------------------------------------------- the statistics
def bootstrap_differences(diffs: Sequence[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """[resamples, M] bootstrap replicates of the mean over seeds of the mean over queries of
    `diffs` (per seed [Q_s, M]: A's per-query scores minus B's). Two levels: each replicate draws
    len(diffs) seeds with replacement, then within each drawn seed Q_s queries with replacement;
    with one seed, the queries only. numpy, not scipy.stats.bootstrap (one level only): one
    `np.random.default_rng(seed)`, vectorized over the replicates of a chunk, seeds of unequal
    query counts padded with a zero row that draws past a seed's count point at."""
    rng = np.random.default_rng(seed)
    counts = np.array([len(d) for d in diffs])
    n_seeds, qmax, m = len(diffs), int(counts.max()), diffs[0].shape[1]
    table = np.zeros((m, n_seeds, qmax + 1))  # per metric: a row per seed, and a zero past each seed's queries
    for s, d in enumerate(diffs):
        table[:, s, : len(d)] = d.T
    flat = table.reshape(m, n_seeds * (qmax + 1))
    position = np.arange(qmax)
    chunk = max(1, CHUNK_ELEMENTS // (n_seeds * qmax))
    out = np.empty((resamples, m))
    for start in range(0, resamples, chunk):
        n = min(chunk, resamples - start)
        drawn = (rng.integers(0, n_seeds, size=(n, n_seeds)) if n_seeds > 1
                 else np.zeros((n, 1), dtype=np.int64))  # [n, S]: the resampled seeds
        q = counts[drawn][..., None]  # [n, S, 1]
        if (counts == qmax).all():
            queries = rng.integers(0, qmax, size=(n, n_seeds, qmax))  # [n, S, qmax]: each drawn seed's queries
        else:
            queries = np.where(position < q, rng.integers(0, q, size=(n, n_seeds, qmax)), qmax)
        index = drawn[..., None] * (qmax + 1) + queries
        sums = np.stack([column.take(index).sum(axis=2) for column in flat], axis=-1)  # [n, S, M]
        out[start : start + n] = (sums / q).mean(axis=1)
    return out


def randomization_p(a: Sequence[np.ndarray], b: Sequence[np.ndarray], permutations: int = PERMUTATIONS,
                    seed: int = SEED) -> float:
    """Two-sided p of the paired randomization test of one metric: per seed, rows A's and B's
    per-query scores [Q_s]; the statistic is the difference of the mean over seeds of the mean
    over queries; the null swaps each (seed, query) pair's two scores at random, exact where
    2^pairs <= permutations. Pairs with equal scores are left out: swapping them changes nothing.

    This is `scipy.stats.permutation_test(..., permutation_type='samples', vectorized=True,
    batch=PERMUTATION_BATCH, rng=np.random.default_rng(seed))`, p for p: the same swaps, drawn by
    the same `Generator.permuted` calls on the same shapes, and scipy's p-value rule
    (`_swap_null`, `_two_sided_p`). scipy builds each batch's swapped samples with a Python loop
    over the pairs (it turns the pairs into samples of two observations); a swap of a pair negates
    its difference, so here a batch is one matrix product (tests/test_stats_benchmark.py times
    both). tests/test_stats.py checks the p against scipy's own, exact and drawn, and
    against a brute-force enumeration."""
    weights = np.concatenate([np.full(len(x), 1.0 / (len(a) * len(x))) for x in a])
    x, y = np.concatenate(list(a)), np.concatenate(list(b))
    differ = x != y
    if differ.sum() < 2:  # no pair or one pair that differs: the observed difference or its negative, p = 1
        return 1.0
    d, w = (x - y)[differ], weights[differ]
    observed = d @ w
    null, exact = _swap_null(d, w, permutations, np.random.default_rng(seed))
    return _two_sided_p(null, float(observed), exact)


def _swap_null(d: np.ndarray, w: np.ndarray, permutations: int,
               rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """The statistic (the weighted mean difference) under each swap of the pairs whose differences
    are `d`: every one of the 2^pairs swaps where that is no more than `permutations` (exact),
    else `permutations` random ones, batch by batch as scipy draws them (`_swaps`)."""
    pairs = len(d)
    if 2**pairs <= permutations:
        swapped = (np.arange(2**pairs)[:, None] >> np.arange(pairs)) & 1  # every assignment
        return np.where(swapped == 1, -d, d) @ w, True
    batch = min(PERMUTATION_BATCH, permutations)
    null = np.empty(permutations)
    for start in range(0, permutations, batch):
        n = min(batch, permutations - start)
        swapped = _swaps(rng, batch, pairs)[:n]  # the whole batch is drawn, as scipy draws it
        null[start : start + n] = np.where(swapped, -d, d) @ w
    return null, False


def _swaps(rng: np.random.Generator, batch: int, pairs: int) -> np.ndarray:
    """[batch, pairs] bool: scipy's swaps, `rng.permuted(np.tile(np.arange(2), (batch, pairs, 1)),
    axis=-1)[:, :, 0] == 1`. numpy shuffles each pair of two by one bounded draw in [0, 1], one 32-bit
    word of the generator whose low bit 0 swaps, slice after slice in C order; the same words drawn
    directly take a third of the time (tests/test_stats.py checks them against `rng.permuted`)."""
    return (rng.integers(0, 2**32, size=(batch, pairs), dtype=np.uint32) & 1) == 0


def _two_sided_p(null: np.ndarray, observed: float, exact: bool) -> float:
    """scipy.stats.permutation_test's two-sided p: twice the smaller tail, each tail counting the
    null values within a relative 100 eps of the observed as at least as extreme, with one added
    to the count and to the total when the null is drawn (not enumerated); capped at 1."""
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)
    adjustment = 0 if exact else 1
    less = (np.count_nonzero(null <= observed + gamma) + adjustment) / (len(null) + adjustment)
    greater = (np.count_nonzero(null >= observed - gamma) + adjustment) / (len(null) + adjustment)
    return float(min(1.0, 2 * min(less, greater)))


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p (1-based) times
    (m - i + 1), made non-decreasing along that order and capped at 1."""
    order = np.argsort(np.asarray(p, dtype=np.float64), kind="stable")
    m = len(order)
    adjusted = np.empty(m)
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * float(p[j])))
        adjusted[j] = running
    return [float(v) for v in adjusted]


# ----------------------------------------------------------------------------- a comparison
@dataclass(frozen=True)
class MetricDifference:
    """One metric of a comparison: the rows' means over the shared seeds, A - B, its interval and p."""

    metric: str
    mean_a: float
    mean_b: float
    difference: float
    low: float
    high: float
    p: float
    p_holm: float = math.nan  # filled by `compare_table` over the table's p-values


@dataclass(frozen=True)
class Comparison:
    """Row A against row B of one dataset, over their shared seeds' test queries."""

    dataset: str
    row_a: str
    row_b: str
    seeds: tuple[int, ...]
    queries: tuple[int, ...]  # per shared seed
    interval_over: IntervalOver
    metrics: tuple[MetricDifference, ...]


@dataclass(frozen=True)
class Settings:
    """How a table's statistics were drawn."""

    resamples: int = RESAMPLES
    permutations: int = PERMUTATIONS
    seed: int = SEED
    min_seeds: int = 2
    metrics: tuple[str, ...] = METRICS


def compare_rows(a: Row, b: Row, settings: Settings = Settings()) -> Comparison:
    """A against B on their shared seeds (see the module note); bad pairs are one-line errors."""
    check_pair(a, b)
    shared = sorted(set(a.seeds) & set(b.seeds))
    need = max(1, settings.min_seeds)
    if len(shared) < need:
        raise UserError(f"rows {a.run!r} and {b.run!r} share {len(shared)} seed(s) ({_seeds(shared)}; {a.run} has "
                        f"{_seeds(a.seeds)}, {b.run} has {_seeds(b.seeds)}): the bootstrap's seed level needs at "
                        "least 2; run the missing seeds, or pass --min-seeds 1 for a queries-only interval (marked so)")
    for s in shared:
        check_queries(a, b, s)
    for metric in settings.metrics:
        check_metric(metric, [(row, row.seeds[s]) for row in (a, b) for s in shared])
    columns = [ALL_METRICS.index(m) for m in settings.metrics]
    sa = [a.seeds[s].scores[:, columns] for s in shared]
    sb = [b.seeds[s].scores[:, columns] for s in shared]
    replicates = bootstrap_differences([x - y for x, y in zip(sa, sb)], settings.resamples, settings.seed)
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail], axis=0)
    out = []
    for j, metric in enumerate(settings.metrics):
        mean_a = float(np.mean([a.seeds[s].figures[metric] for s in shared]))
        mean_b = float(np.mean([b.seeds[s].figures[metric] for s in shared]))
        p = randomization_p([x[:, j] for x in sa], [y[:, j] for y in sb], settings.permutations, settings.seed)
        out.append(MetricDifference(metric, mean_a, mean_b, mean_a - mean_b, float(low[j]), float(high[j]), p))
    over: IntervalOver = BOTH_LEVELS if len(shared) > 1 else QUERIES_ONLY
    return Comparison(a.dataset, a.run, b.run, tuple(shared), tuple(len(x) for x in sa), over, tuple(out))


@dataclass(frozen=True)
class RoomShare:
    """How much of the oracle's room on a base a method closes: its gain over the base divided by the
    base's gain from the oracle detector (both mean SumR over the three rows' shared seeds), with the 95%
    percentile interval of that ratio over the same two-level paired bootstrap, drawn jointly for both
    differences (the same seeds and queries in numerator and denominator). `room_low` is the lower end of
    the room's own interval: where it is not above 0 there is no room to share out, and the ratio's
    interval is left NaN."""

    share: float
    low: float
    high: float
    room_low: float
    seeds: tuple[int, ...]


def shared_sumr(anchor: Row, others: Sequence[Row], settings: Settings
                ) -> tuple[list[int], list[list[np.ndarray]], list[float]]:
    """The seeds `anchor` and every row of `others` share (at least `settings.min_seeds`), and per row
    (`anchor`, then `others` in order) its per-query SumR per shared seed and its mean SumR over them,
    after checking that every row pairs with `anchor` (one world, the same test queries): what the
    several-row statistics draw from."""
    rows = (anchor, *others)
    for other in others:
        check_pair(other, anchor)
    shared = sorted(set.intersection(*(set(r.seeds) for r in rows)))
    if len(shared) < max(1, settings.min_seeds):
        raise UserError(f"rows {', '.join(repr(r.run) for r in rows)} share {len(shared)} seed(s) "
                        f"({_seeds(shared)}); run the missing seeds")
    for s in shared:
        for other in others:
            check_queries(other, anchor, s)
    j = METRICS.index("SumR")
    scores = [[r.seeds[s].scores[:, j] for s in shared] for r in rows]
    means = [float(np.mean([r.seeds[s].figures["SumR"] for s in shared])) for r in rows]
    return shared, scores, means


def room_share(method: Row, base: Row, oracle: Row, settings: Settings = Settings()) -> RoomShare:
    """`method` against `base`, over `oracle` (the base with the oracle detector) against `base`."""
    shared, (b, m, o), (mean_b, mean_m, mean_o) = shared_sumr(base, (method, oracle), settings)
    diffs = [np.stack([m[i] - b[i], o[i] - b[i]], axis=1) for i in range(len(shared))]
    gain, room = mean_m - mean_b, mean_o - mean_b
    replicates = bootstrap_differences(diffs, settings.resamples, settings.seed)
    tail = (1 - LEVEL) / 2
    room_low = float(np.quantile(replicates[:, 1], tail))
    if room <= 0 or room_low <= 0:
        return RoomShare(gain / room if room > 0 else math.nan, math.nan, math.nan, room_low, tuple(shared))
    ratio = replicates[:, 0] / np.where(replicates[:, 1] > 0, replicates[:, 1], np.nan)
    low, high = np.nanquantile(ratio, [tail, 1 - tail])
    return RoomShare(gain / room, float(low), float(high), room_low, tuple(shared))


@dataclass(frozen=True)
class GainChange:
    """How a run's gain over its base moves between two training regimes scored on one test set: the
    gain at the reference setting (`before`), at the other (`after`), and their difference with the 95%
    percentile interval of the two-level paired bootstrap over (seed, test query): each query's
    (run - base) - (run_ref - base_ref) SumR, the four rows sharing seeds and queries."""

    before: float
    after: float
    change: float
    low: float
    high: float
    seeds: tuple[int, ...]
    p: float = float("nan")  # two-sided p of no change, read off the same replicates (`bootstrap_p`)


def bootstrap_p(replicates: np.ndarray) -> float:
    """The two-sided p of no difference that a bootstrap's replicates of the difference give: twice the
    smaller share of replicates at or beyond 0 on either side, each share counted with one added to it and
    to the total, capped at 1 (`_two_sided_p` of 0 against the replicates as a drawn null). It inverts the
    percentile interval: the interval at level 1 - alpha leaves 0 out about where this p is below alpha
    (within the +1), so several intervals' readings can be corrected together (Holm's, `holm`)."""
    return _two_sided_p(replicates, 0.0, exact=False)


def gain_change(run: Row, base: Row, run_ref: Row, base_ref: Row, settings: Settings = Settings()) -> GainChange:
    """`run` over `base` against `run_ref` over `base_ref` (the same pair at the reference setting)."""
    shared, (a, b, a_ref, b_ref), (m, m_b, m_ref, m_b_ref) = shared_sumr(run, (base, run_ref, base_ref), settings)
    diffs = [(a[i] - b[i] - a_ref[i] + b_ref[i])[:, None] for i in range(len(shared))]
    before, after = m_ref - m_b_ref, m - m_b
    replicates = bootstrap_differences(diffs, settings.resamples, settings.seed)[:, 0]
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return GainChange(before, after, after - before, float(low), float(high), tuple(shared), bootstrap_p(replicates))


@dataclass(frozen=True)
class GainDraws:
    """One gain A - B over its rows' shared seeds, with the replicates of its two-level paired bootstrap."""

    gain: float
    seeds: tuple[int, ...]
    replicates: np.ndarray  # [resamples]


def gain_draws(run: Row, base: Row, settings: Settings, seed: int) -> GainDraws:
    """`run` over `base` in SumR and its bootstrap replicates drawn from `seed` (as `compare_rows` draws them
    from `settings.seed`)."""
    shared, (sb, sa), (mean_b, mean_a) = shared_sumr(base, (run,), settings)
    diffs = [(sa[i] - sb[i])[:, None] for i in range(len(shared))]
    return GainDraws(mean_a - mean_b, tuple(shared), bootstrap_differences(diffs, settings.resamples, seed)[:, 0])


def change_apart(here: GainDraws, there: GainDraws) -> GainChange:
    """How far a gain moved from `there` (the reference world) to `here` (another): the difference of the
    gains, its 95% interval the percentile interval of the difference of their replicates. The two worlds'
    test queries are other queries, so nothing pairs across them and the two must be drawn independently:
    from one seed, two test splits of one size would resample the same positions, a correlation the
    worlds do not have (`gain_change_apart` draws the reference from the seed plus one). `seeds`: here's."""
    tail = (1 - LEVEL) / 2
    replicates = here.replicates - there.replicates
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return GainChange(there.gain, here.gain, here.gain - there.gain, float(low), float(high), here.seeds,
                      bootstrap_p(replicates))


def gain_change_apart(run: Row, base: Row, run_ref: Row, base_ref: Row, settings: Settings = Settings()) -> GainChange:
    """`run` over `base` in one world against `run_ref` over `base_ref` in another (a knob of the world
    moved): each gain by its own two-level paired bootstrap, the first from `settings.seed`, the reference
    from `settings.seed + 1` (`change_apart`); each pair needs `settings.min_seeds` shared seeds of its own."""
    return change_apart(gain_draws(run, base, settings, settings.seed),
                        gain_draws(run_ref, base_ref, settings, settings.seed + 1))


def check_metric(metric: str, seeds: Sequence[tuple[Row, SeedScores]]) -> None:
    """Every (row, seed) has per-query scores of `metric`: VCMR SumR needs the moment ranks that runs of
    a localizing backbone store since they were added to the rankings (harness/engine/rankings.py)."""
    for row, seed in seeds:
        if not _scored(seed, metric):
            why = seed.missing.get(metric, f"no per-query {metric} in its stored rankings ({seed.record.name})")
            raise UserError(f"row {row.run!r} seed {seed.seed}: {why}; leave {metric} out of --metrics, or re-run "
                            "that run")


def has_metric(row: Row, metric: str, seeds: Sequence[int]) -> bool:
    """Does every one of `seeds` of `row` have per-query scores of `metric`?"""
    return all(s in row.seeds and _scored(row.seeds[s], metric) for s in seeds)


def _scored(seed: SeedScores, metric: str) -> bool:
    return not np.isnan(seed.scores[:, ALL_METRICS.index(metric)]).any()


def check_pair(a: Row, b: Row) -> None:
    if a.dataset != b.dataset or a.world != b.world:
        raise UserError(f"rows {a.run!r} ({a.dataset}: {_world(a.world)}) and {b.run!r} ({b.dataset}: "
                        f"{_world(b.world)}) were run on different datasets or worlds, so their test queries do "
                        "not pair up; compare rows of one dataset and world")


def check_queries(a: Row, b: Row, seed: int) -> None:
    """Paired scores need the same test queries, in the same order, with the same labelled videos."""
    x, y = a.seeds[seed], b.seeds[seed]
    for what, u, v in (("query ids", x.query_ids, y.query_ids), ("labelled videos", x.labelled_videos,
                                                                  y.labelled_videos)):
        if u != v:
            i = next((i for i, (p, q) in enumerate(zip(u, v)) if p != q), min(len(u), len(v)))
            first = f"{_cell(u, i)} vs {_cell(v, i)} at query {i}"
            raise UserError(f"rows {a.run!r} and {b.run!r} seed {seed}: the test {what} of their stored rankings "
                            f"differ ({len(u)} vs {len(v)} queries; {first}: {x.record.name} of {a.run} against "
                            f"{y.record.name} of {b.run}); compare rows evaluated on one test split")


@dataclass(frozen=True)
class CompareTable:
    """The comparisons of one table, with Holm's correction over all their p-values."""

    dataset: str
    comparisons: tuple[Comparison, ...]
    settings: Settings


def compare_table(out: str | Path, dataset: str, pairs: Sequence[tuple[str, str]],
                  settings: Settings = Settings()) -> CompareTable:
    """Each (A, B) of `pairs` on `dataset` under `out`, and Holm's adjusted p over every p of the table."""
    unknown = [m for m in settings.metrics if m not in ALL_METRICS]
    if unknown or not settings.metrics:
        raise UserError(f"--metrics {' '.join(unknown) or '(none)'}: pick from {' '.join(ALL_METRICS)} (VCMR SumR: "
                        "runs that localize; oracle SumR: runs of a simulated world)")
    if settings.resamples < 1 or settings.permutations < 1 or settings.seed < 0:
        raise UserError(f"--resamples {settings.resamples}, --permutations {settings.permutations}, --seed "
                        f"{settings.seed}: the counts must be at least 1 and the seed at least 0")
    rows: dict[str, Row] = {}
    for run in dict.fromkeys(r for pair in pairs for r in pair):  # in the order given: the first bad row reports
        rows[run] = load_row(out, dataset, run, oracle=ORACLE_SUMR in settings.metrics)
    found = [compare_rows(rows[a], rows[b], settings) for a, b in pairs]
    adjusted = iter(holm([d.p for c in found for d in c.metrics]))
    found = [Comparison(c.dataset, c.row_a, c.row_b, c.seeds, c.queries, c.interval_over,
                        tuple(MetricDifference(d.metric, d.mean_a, d.mean_b, d.difference, d.low, d.high, d.p,
                                               next(adjusted)) for d in c.metrics)) for c in found]
    return CompareTable(dataset, tuple(found), settings)


# ----------------------------------------------------------------------------- the table's text
HEAD = ("A", "B", "metric", "mean A", "mean B", "A - B", "95% interval", "p", "Holm p", "seeds", "queries",
        "interval over")


def table_cells(table: CompareTable) -> list[list[str]]:
    """The table's rows as text cells (HEAD), run names as they are (escape for the format)."""
    rows = []
    for c in table.comparisons:
        queries = str(c.queries[0]) if len(set(c.queries)) == 1 else "/".join(map(str, c.queries))
        for d in c.metrics:
            rows.append([c.row_a, c.row_b, d.metric, f"{d.mean_a:.2f}", f"{d.mean_b:.2f}", f"{d.difference:+.2f}",
                         f"[{d.low:+.2f}, {d.high:+.2f}]", fmt_p(d.p), fmt_p(d.p_holm),
                         " ".join(map(str, c.seeds)), queries, c.interval_over])
    return rows


def fmt_p(p: float) -> str:
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def to_markdown(table: CompareTable, command: str) -> str:
    s = table.settings
    note = ("Differences of the mean test figure over the shared seeds (A minus B, in points), from the stored "
            "rankings beside each run record. 95% interval: two-level paired bootstrap (seeds, then test queries "
            f"within each resampled seed, the same queries for both rows), percentile interval of {s.resamples} "
            "resamples. p: two-sided paired randomization test over the (seed, query) pairs "
            f"(scipy.stats.permutation_test, permutation_type='samples', {s.permutations} permutations; the "
            f"smallest p random swaps can give is {fmt_p(2 / (s.permutations + 1))}). Holm p: Holm's step-down "
            f"correction over all {sum(len(c.metrics) for c in table.comparisons)} p-values of this table. "
            f"Random seed {s.seed}. What this means: docs/statistics.md. Written by `{command}`.")
    lines = [f"# Paired comparisons on {markdown_cell(table.dataset)}", "", note, "",
             markdown_table(HEAD, table_cells(table))]
    return "\n".join(lines) + "\n"


def to_csv(table: CompareTable) -> str:
    s = table.settings
    interval = f"two-level paired bootstrap, percentile, {s.resamples} resamples, seed {s.seed}"
    test = f"paired randomization test, two-sided, {s.permutations} permutations, seed {s.seed}"
    return csv_text(["dataset", "row_a", "row_b", "metric", "mean_a", "mean_b", "difference", "low", "high", "p",
                     "p_holm", "seeds", "queries", "interval_over", "interval", "test", "correction"],
                    ([c.dataset, c.row_a, c.row_b, d.metric, f"{d.mean_a:.6g}", f"{d.mean_b:.6g}", f"{d.difference:.6g}",
                      f"{d.low:.6g}", f"{d.high:.6g}", f"{d.p:.6g}", f"{d.p_holm:.6g}", " ".join(map(str, c.seeds)),
                      " ".join(map(str, c.queries)), c.interval_over, interval, test, "Holm over the table"]
                     for c in table.comparisons for d in c.metrics))


def _seeds(seeds: Sequence[int] | dict[int, SeedScores]) -> str:
    return " ".join(map(str, seeds)) or "none"


def _world(world: tuple[str, ...]) -> str:
    label, version, scale, knobs = world
    return (f"{label}, generator version {version or 'none'}, scale {scale or 'none'}"
            + (f", test facts {knobs}" if knobs else ""))


def _cell(values: list[str], i: int) -> str:
    return repr(values[i]) if i < len(values) else "(none)"
