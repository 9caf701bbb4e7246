"""The generator's output is pinned to its version: cached worlds are keyed by
`world.GENERATOR_VERSION` and the knobs, not by the code, so a change of what the generator
makes (its text, relevance or features, for default knob values or not) must bump the version,
or a cached world of the old code is read as the new one's. This test fails on such a change
and says what to do.

The fingerprint of a world: a hash of its exact discrete parts (query text, parses, relevance,
extras, the frame and token row counts) and its features' mean and spread per split, compared
within 1e-4 (the features go through BLAS, whose last bits differ between CPUs). numpy's random
streams may change between numpy releases: this test is also where that would show."""

import dataclasses
import hashlib

import numpy as np
import pytest

from prvr.datasets.sim import LATER_KNOBS, generate, world
from prvr.harness.engine.config import resolve

# Every knob added after the first worlds set on, with the older text and relevance knobs: the
# generator's paths that the presets' default values leave alone are pinned too.
ALL_ON = {"unnamed_prob": 0.3, "hidden_scene_prob": 0.3, "actions_in_use": 6, "distinct_wording": 0.5,
          "recurring_unannotated": 0.5, "compound_prob": 0.5, "vague_prob": 0.2, "repeat_prob": 0.5,
          "repeat_copies": 2, "extra_events": 2, "mislabel_rate": 0.1}
SMALL = {"train_videos": 40, "val_videos": 12, "test_videos": 40}
WORLDS = {
    "sim-tiny": ("sim-tiny", {}),
    "sim-tiny, every knob on": ("sim-tiny", ALL_ON),
    "sim-charades-v, small": ("sim-charades-v", SMALL),
}
# GENERATOR_VERSION -> world -> (hash of the discrete parts, [frames mean, std, tokens mean, std] per split)
FINGERPRINTS: dict = {2: {
    'sim-tiny': ('8f84be98e5fd9e69', [-0.01279, 2.106413, -0.052254, 1.547117, 0.041926, 2.141949, -0.077639, 1.547528, 0.03281, 2.164401, -0.060202, 1.537097]),
    'sim-tiny, every knob on': ('7e13953d0fcb2ba2', [-0.009322, 2.127166, -0.034663, 1.547673, -0.031987, 2.189762, -0.053406, 1.553922, -0.048528, 2.128734, -0.034231, 1.562018]),
    'sim-charades-v, small': ('ad58e1f7a7e37349', [-0.011811, 2.152193, 0.006109, 1.542969, 0.001166, 2.183481, 0.008983, 1.54182, 0.017036, 2.314247, 0.006708, 1.546756]),
}}


def fingerprint(name: str, knobs: dict) -> tuple[str, list[float]]:
    cfg = dataclasses.replace(resolve("baseline", name, 0).sim, **knobs)
    data = generate(name, cfg)
    digest, stats = hashlib.sha256(), []
    for split in ("train", "val", "test"):
        s = data[split]
        for text in (s.query_text, s.parses):
            digest.update("\x1f".join(text).encode())
        relevance = s.relevance.tocsr()
        for part in (relevance.indptr, relevance.indices, s.frames.offsets, s.tokens.offsets):
            digest.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
        for key in sorted(s.extra):
            digest.update(key.encode())
            digest.update(np.ascontiguousarray(s.extra[key]).tobytes())
        for feats in (s.frames.data, s.tokens.data):
            x = np.asarray(feats, dtype=np.float64)
            stats += [round(float(x.mean()), 6), round(float(x.std()), 6)]
    return digest.hexdigest()[:16], stats


def test_the_knobs_on_here_are_every_knob_added_later():
    assert set(LATER_KNOBS) <= set(ALL_ON)
    assert all(ALL_ON[k] != v for k, v in LATER_KNOBS.items())


@pytest.mark.parametrize("label", list(WORLDS))
def test_the_generator_makes_what_its_version_made(label):
    name, knobs = WORLDS[label]
    got_hash, got_stats = fingerprint(name, knobs)
    pinned = FINGERPRINTS.get(world.GENERATOR_VERSION, {}).get(label)
    told = (f"{label} generates differently from what GENERATOR_VERSION {world.GENERATOR_VERSION} made: if "
            f"the change is meant, bump GENERATOR_VERSION in datasets/sim/world.py (cached worlds are "
            f"remade) and pin {label!r}: ({got_hash!r}, {got_stats!r}) under the new version in "
            f"tests/test_sim_fingerprint.py; if the code did not change, numpy's random streams did "
            f"(numpy {np.__version__} here), and the committed records' worlds with them")
    assert pinned is not None, told
    assert got_hash == pinned[0], told
    np.testing.assert_allclose(got_stats, pinned[1], atol=1e-4, err_msg=told)
