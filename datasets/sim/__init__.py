"""Simulated PRVR datasets: sim-tvr, sim-activitynet, sim-charades, sim-didemo and sim-tiny.

Each preset imitates its real dataset's statistics (queries per video, words per query,
video length, M/V fractions, feature dimensions); `--set data.scale=full` gives the real
split sizes. Generation is deterministic from `sim.seed` and cached on disk.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from prvr.datasets.base import PRESETS, DatasetSpec
from prvr.datasets.sim import cache, world
from prvr.datasets.types import PRVRData, Split
from prvr.harness.base import progress
from prvr.harness.base.registry import DATASETS


def _sizes(sim_cfg) -> dict[str, int]:
    return {"train": sim_cfg.train_videos, "val": sim_cfg.val_videos, "test": sim_cfg.test_videos}


def _concepts(sim_cfg) -> world.Concepts:
    return world.make_concepts(sim_cfg, np.random.default_rng([sim_cfg.seed, 0]))


def generate(name: str, sim_cfg) -> PRVRData:
    """Generate a simulated dataset (no caching)."""
    concepts, sizes = _concepts(sim_cfg), _sizes(sim_cfg)
    splits = {}
    with progress.task(f"generating {name}", total=sum(sizes.values())) as advance:
        for split, n in sizes.items():
            splits[split] = world.generate_split(sim_cfg, concepts, split, n, name, advance)
    meta = {"simulated": True, "generator_version": world.GENERATOR_VERSION,
            "sim": world_knobs(sim_cfg), **world_stats(splits)}
    return PRVRData(name, splits, meta)


def world_stats(splits) -> dict:
    """Facts a reader checks a world against: ambiguity, M/V fractions, words per query."""
    out = {}
    for name, s in splits.items():
        counts = np.diff(s.relevance.indptr)
        frac = s.moment_fraction()
        out[name] = {
            "videos": s.num_videos, "queries": s.num_queries,
            "multi_relevant_share": float(np.mean(counts > 1)),
            "relevant_per_query_mean": float(counts.mean()),
            "relevant_per_query_max": int(counts.max()),
            "mv_fractions": [float(np.mean((frac > lo) & (frac <= hi))) for lo, hi in ((0, .2), (.2, .4), (.4, 1.0))],
            "words_per_query": float(np.mean([len(t.split()) for t in s.query_text])),
            "frames_per_video": float(np.mean(s.frames.lengths)),
            "mislabelled": int(np.sum(~s.relevance[np.arange(s.num_queries), s.query_video].A1.astype(bool))),
        }
    return out


# knobs added after worlds were cached and recorded: at their default (off) they are left out of
# the cache key, so the worlds made before them keep their key (and their cache)
LATER_KNOBS = {"unnamed_prob": 0.0, "hidden_scene_prob": 0.0, "actions_in_use": 0, "distinct_wording": 0.0,
               "recurring_unannotated": 0.0, "compound_prob": 0.0}


def world_knobs(sim_cfg) -> dict:
    knobs = dataclasses.asdict(sim_cfg)
    return {k: v for k, v in knobs.items() if not (k in LATER_KNOBS and v == LATER_KNOBS[k])}


def generate_one(name: str, sim_cfg, split: str) -> Split | None:
    """One split alone, as `generate` makes it (each split draws from its own stream, from the same
    concepts), without the others (no caching); None for a split the world does not have."""
    sizes = _sizes(sim_cfg)
    if split not in sizes:
        return None
    with progress.task(f"generating {name}'s {split} split", total=sizes[split]) as advance:
        return world.generate_split(sim_cfg, _concepts(sim_cfg), split, sizes[split], name, advance)


def _entry(name: str, cfg) -> Path:
    key = cache.cache_key({"name": name, "version": world.GENERATOR_VERSION, "sim": world_knobs(cfg.sim)})
    return cache.cache_root(cfg.data.cache_dir) / "sim" / f"{name}-{key}"


def load_sim(name: str, cfg) -> PRVRData:
    """Load the dataset from the cache, generating it on first use (or when corrupt)."""
    return cache.load_or_build(_entry(name, cfg), lambda: generate(name, cfg.sim), progress.log)


def load_sim_truth(name: str, cfg) -> Split | None:
    """The test split's ground truth (ids, texts, labels, moments, relevance; no features): from the
    world's cache entry, else from a small entry of its own, made on first use (`cache.load_truth_or_build`)."""
    return cache.load_truth_or_build(_entry(name, cfg), "test", lambda: generate_one(name, cfg.sim, "test"),
                                     progress.log)


def _register(name: str, summary: str) -> None:
    DATASETS.add(name, DatasetSpec(name, lambda cfg, _n=name: load_sim(_n, cfg), PRESETS / f"{name}.yaml", True,
                                   lambda cfg, _n=name: load_sim_truth(_n, cfg)), summary)


_register("sim-tvr", "simulated TVR: 5 queries/video, 75 s videos, 85% short moments, 3072-d video / 768-d tokens")
_register("sim-activitynet", "simulated ActivityNet Captions: 3.7 q/video, 117 s videos, long moments, 1024-d")
_register("sim-charades", "simulated Charades-STA: 2.3 q/video, 30 s videos, medium moments, short queries, 1024-d")
_register("sim-didemo", "simulated DiDeMo: 3.8 q/video, 25-30 s videos of 2.5 s clips, short moments, 2048-d / 768-d")
_register("sim-tvr-v", "sim-tvr calibrated to TVR's verified relevance: 10% multi-relevant, text detection as hard")
_register("sim-tvr-v2", "sim-tvr-v with compound queries: every calibration figure within x1.5 of TVR's verified relevance")
_register("sim-charades-v", "sim-charades calibrated to Charades-STA's verified relevance: 43% multi-relevant, a small generic vocabulary")
_register("sim-tiny", "tiny simulated world for tests: generates in about a second")
