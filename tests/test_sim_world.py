import dataclasses

import numpy as np
import pytest

from prvr.datasets.sim import generate, world
from prvr.datasets.sim import language as lang
from prvr.harness.engine.config import resolve
from prvr.harness.base.registry import DATASETS


def tiny_sim(**knobs):
    cfg = resolve("baseline", "sim-tiny", 0).sim
    return dataclasses.replace(cfg, **knobs)


@pytest.fixture(scope="module")
def tiny():
    return generate("sim-tiny", tiny_sim())


def test_generation_is_deterministic(tiny):
    again = generate("sim-tiny", tiny_sim())
    for name in ("train", "val", "test"):
        a, b = tiny[name], again[name]
        np.testing.assert_array_equal(a.frames.data, b.frames.data)
        np.testing.assert_array_equal(a.tokens.data, b.tokens.data)
        assert a.query_text == b.query_text
        assert (a.relevance != b.relevance).nnz == 0


def test_another_world_seed_gives_another_world(tiny):
    other = generate("sim-tiny", tiny_sim(seed=1))
    assert not np.array_equal(other["test"].frames.data[:10], tiny["test"].frames.data[:10])


def test_shapes_dims_and_frame_rate(tiny):
    s = tiny["train"]
    assert s.frames.dim == 48 and s.tokens.dim == 32
    np.testing.assert_allclose(s.durations, s.frames.lengths * 1.5)  # one row per 1.5 s
    assert np.all(s.moments[:, 0] >= 0) and np.all(s.moments[:, 1] <= s.durations[s.query_video] + 1e-9)
    assert np.all(s.moments[:, 1] > s.moments[:, 0])


def test_ground_truth_is_consistent_with_the_events(tiny):
    for s in tiny.splits.values():
        rel = s.relevance.tocsr()
        events, specs, scene = s.extra["events"], s.extra["query_spec"], s.extra["video_scene"]
        assert all(rel[q, s.query_video[q]] for q in range(s.num_queries))  # labelled video is relevant
        for q in range(s.num_queries):
            e, c, o, sc, _ = specs[q]
            a = events[e, world.EV_ACTION]
            for v in range(s.num_videos):
                ev = events[events[:, world.EV_VIDEO] == v]
                match = ((ev[:, world.EV_ACTION] == a) & ((c < 0) | (ev[:, world.EV_CHAR] == c))
                         & ((o < 0) | (ev[:, world.EV_OBJ] == o))).any() and (sc < 0 or scene[v] == sc)
                assert bool(rel[q, v]) == bool(match)


def test_queries_name_what_their_spec_says(tiny):
    s = tiny["test"]
    names = lang.concept_vocab()
    for q in range(s.num_queries):
        e, c, o, sc, _ = s.extra["query_spec"][q]
        text = s.query_text[q].lower()
        if c >= 0:
            assert names["character"][c].lower() in text
        if sc >= 0:
            assert names["scene"][sc].lower().split()[-1] in text
        leaves = [t.rstrip(")") for t in s.parses[q].split() if not t.startswith("(")]
        assert " ".join(leaves).lower().replace(" .", ".").replace(" ,", ",") == text


def test_repeat_knob_controls_label_ambiguity():
    def share(p):
        d = generate("sim-tiny", tiny_sim(repeat_prob=p, vague_prob=0.0, train_videos=200, extra_events=1.0))
        return np.mean(np.diff(d["train"].relevance.indptr) > 1)

    low, high = share(0.0), share(0.6)
    assert low < 0.05 < 0.25 < high


def test_vague_queries_match_more_videos():
    d = generate("sim-tiny", tiny_sim(vague_prob=0.5, train_videos=200))
    s = d["train"]
    counts = np.diff(s.relevance.indptr)
    vague = (s.extra["query_spec"][:, 1] < 0) | (s.extra["query_spec"][:, 2] < 0)
    assert vague.any() and (~vague).any()
    assert counts[vague].mean() > counts[~vague].mean()


def test_mislabel_knob_moves_training_queries_only():
    d = generate("sim-tiny", tiny_sim(mislabel_rate=0.3, train_videos=100))
    tr = d["train"]
    wrong = ~tr.relevance[np.arange(tr.num_queries), tr.query_video].A1.astype(bool)
    assert 0.15 < wrong.mean() < 0.45
    te = d["test"]
    assert te.relevance[np.arange(te.num_queries), te.query_video].A1.all()


def test_function_words_carry_no_visual_signal():
    """Token latents of function words are word identity only, identical in every context."""
    cfg = tiny_sim()
    concepts = world.make_concepts(cfg, np.random.default_rng(0))
    the_a = world._token_latent(concepts, "the", None)
    the_b = world._token_latent(concepts, "the", None)
    np.testing.assert_array_equal(the_a, the_b)
    couch = world._token_latent(concepts, "couch", ("object", 0))
    assert np.dot(couch, concepts.obj[0]) > 0.5  # content words carry their concept


@pytest.mark.parametrize("name, fractions", [("sim-tvr", [0.853, 0.092, 0.055]),
                                             ("sim-activitynet", [0.461, 0.249, 0.290]),
                                             ("sim-charades", [0.299, 0.568, 0.133])])
def test_presets_follow_real_mv_fractions(name, fractions):
    cfg = resolve("baseline", name, 0).sim
    assert cfg.mv_fractions == fractions
    rng = np.random.default_rng(0)
    frames = rng.integers(15, 90, 3000)
    spans = [world.sample_moment(cfg, int(t), rng) for t in frames]
    frac = np.array([(e - s) / t for (s, e), t in zip(spans, frames)])
    got = [np.mean((frac > lo) & (frac <= hi)) for lo, hi in ((0, .2), (.2, .4), (.4, 1))]
    np.testing.assert_allclose(got, fractions, atol=0.03)


def test_registered_sim_datasets_load_through_the_cache(tmp_path):
    cfg = resolve("baseline", "sim-tiny", 0, [f"data.cache_dir={tmp_path}"])
    first = DATASETS.get("sim-tiny").load(cfg)
    second = DATASETS.get("sim-tiny").load(cfg)
    assert isinstance(second["train"].frames.data, np.memmap)
    np.testing.assert_array_equal(first["test"].tokens.data, second["test"].tokens.data)
    assert first.meta["test"]["queries"] == first["test"].num_queries


def test_long_videos_keep_at_most_128_rows_and_true_durations():
    d = generate("sim-tiny", tiny_sim(duration_mean=300.0, duration_std=10.0, train_videos=4, val_videos=2,
                                      test_videos=2))
    s = d["train"]
    assert s.frames.lengths.max() == 128
    assert s.durations.min() > 128 * 1.5  # durations stay in seconds
    assert np.all(s.moments[:, 1] <= s.durations[s.query_video] + 1e-6)


def test_unnamed_queries_keep_their_relevance_and_drop_the_name_from_their_text(tiny):
    """`sim.unnamed_prob`: the text says "someone" for the character the query requires; the
    relevance is the knob-off world's (drawn before the knob's draw), the character named in
    none of the unnamed texts and in every named text that required one."""
    d = generate("sim-tiny", tiny_sim(unnamed_prob=0.5))
    for name in ("train", "test"):
        s, off = d[name], tiny[name]
        assert (s.relevance != off.relevance).nnz == 0
        unnamed, spec = s.extra["query_unnamed"], s.extra["query_spec"]
        assert unnamed.any() and (~unnamed & (spec[:, 1] >= 0)).any() and not (unnamed & (spec[:, 1] < 0)).any()
        for q in range(s.num_queries):
            if spec[q, 1] >= 0:
                assert (lang.CHARACTERS[spec[q, 1]] in s.query_text[q]) != bool(unnamed[q]), s.query_text[q]


def test_a_knob_added_later_leaves_the_worlds_made_before_it_alone(tiny):
    """At 0 (off), `unnamed_prob` draws nothing and is not in the cache key: the world and its
    key are those of before the knob."""
    from prvr.datasets.sim import world_knobs

    assert "unnamed_prob" not in world_knobs(tiny_sim()) and "query_unnamed" not in tiny["test"].extra
    assert world_knobs(tiny_sim(unnamed_prob=0.2))["unnamed_prob"] == 0.2


def test_a_small_vocabulary_draws_every_event_of_every_split_from_the_same_few_actions(tiny):
    """`sim.actions_in_use`: the events of all splits use the same k actions (from the world's
    seed alone), so queries of different moments read alike more often; at 0 or at the whole
    vocabulary, the world and its cache key are those of before the knob."""
    from prvr.datasets.sim import world_knobs

    d = generate("sim-tiny", tiny_sim(actions_in_use=6))
    used = [set(d[name].extra["events"][:, world.EV_ACTION].tolist()) for name in ("train", "val", "test")]
    assert len(used[0] | used[1] | used[2]) <= 6 and len(used[0]) > 1
    assert set(world.actions_in_use(tiny_sim(actions_in_use=6)).tolist()) >= used[0] | used[1] | used[2]
    off_actions = set(tiny["train"].extra["events"][:, world.EV_ACTION].tolist())
    assert len(off_actions) > 6  # the knob-off world uses more
    whole = generate("sim-tiny", tiny_sim(actions_in_use=len(lang.concept_vocab()["action"])))
    assert whole["test"].query_text == tiny["test"].query_text
    assert (whole["test"].relevance != tiny["test"].relevance).nnz == 0
    assert "actions_in_use" not in world_knobs(tiny_sim()) and world_knobs(tiny_sim(actions_in_use=6))["actions_in_use"] == 6


def test_queries_of_one_event_worded_apart_keep_their_relevance_and_change_only_their_paraphrase(tiny):
    """`sim.distinct_wording`: at 1, each later query of a (character, action, object) combination
    takes the paraphrase after the previous one's, so two in a row never share one where the
    action has several; relevance and every other part of the spec are the knob-off world's
    (the fillers drawn after a reworded query move with its length, as under unnamed_prob);
    off, the world and its cache key are those of before the knob."""
    from prvr.datasets.sim import world_knobs

    d = generate("sim-tiny", tiny_sim(distinct_wording=1.0, repeat_prob=0.6, repeat_copies=3))
    off = generate("sim-tiny", tiny_sim(repeat_prob=0.6, repeat_copies=3))
    changed = 0
    for name in ("train", "test"):
        s, o = d[name], off[name]
        assert (s.relevance != o.relevance).nnz == 0
        spec, spec_off, events = s.extra["query_spec"], o.extra["query_spec"], s.extra["events"]
        np.testing.assert_array_equal(spec[:, :4], spec_off[:, :4])
        last: dict = {}
        for q, (e, c, obj) in enumerate(spec[:, :3]):
            action = int(events[e, world.EV_ACTION])
            combo = (int(c), action, int(obj))
            if combo in last:
                assert spec[q, 4] == (last[combo] + 1) % lang.num_paraphrases(action)
            last[combo] = spec[q, 4]
        changed += int(np.sum(spec[:, 4] != spec_off[:, 4]))
    assert changed > 0
    assert "distinct_wording" not in world_knobs(tiny_sim())
    assert world_knobs(tiny_sim(distinct_wording=0.5))["distinct_wording"] == 0.5


def test_later_copies_of_a_recurring_event_go_unannotated_with_queries_per_video_and_relevance_kept(tiny):
    """`sim.recurring_unannotated`: at 1, no recurring (character, action, object) keeps two
    annotated copies where its later copy's video had a non-recurring unannotated event to trade
    with; every video keeps its number of queries, the events themselves are the knob-off
    world's and so is every video's relevance to an event; off, the world and its cache key are
    those of before the knob."""
    from prvr.datasets.sim import world_knobs

    knobs = dict(repeat_prob=0.6, repeat_copies=3, extra_events=3)
    d = generate("sim-tiny", tiny_sim(recurring_unannotated=1.0, **knobs))
    off = generate("sim-tiny", tiny_sim(**knobs))
    for name in ("train", "test"):
        s, o = d[name], off[name]
        ev, ev_off = s.extra["events"], o.extra["events"]
        np.testing.assert_array_equal(ev[:, :6], ev_off[:, :6])  # the same events; annotation moved
        np.testing.assert_array_equal(np.bincount(s.query_video, minlength=s.num_videos),
                                      np.bincount(o.query_video, minlength=o.num_videos))
        combos = [tuple(r) for r in ev[:, [world.EV_CHAR, world.EV_ACTION, world.EV_OBJ]].tolist()]
        copies = {c: combos.count(c) for c in set(combos)}
        annotated = ev[:, world.EV_ANNOT].astype(bool)
        moved = int(np.sum(annotated != ev_off[:, world.EV_ANNOT].astype(bool)))
        assert moved > 0
        seen: set = set()
        for e in np.flatnonzero(annotated):
            if copies[combos[e]] < 2:
                continue
            if combos[e] in seen:  # a second annotated copy: only where its video had nothing to trade with
                video = ev[e, world.EV_VIDEO]
                of_video = np.flatnonzero(ev[:, world.EV_VIDEO] == video)
                assert not any(not annotated[k] and copies[combos[k]] < 2 for k in of_video)
            seen.add(combos[e])
        # relevance: a query's relevant videos are those holding its event's combination (and scene)
        for q in range(0, s.num_queries, 7):
            e, c, obj, scene, _ = s.extra["query_spec"][q]
            holders = {int(v) for v, cc, a, oo in ev[:, [world.EV_VIDEO, world.EV_CHAR, world.EV_ACTION,
                                                         world.EV_OBJ]]
                       if (c < 0 or cc == c) and a == ev[e, world.EV_ACTION] and (obj < 0 or oo == obj)
                       and (scene < 0 or s.extra["video_scene"][v] == scene)}
            assert set(s.relevance[q].indices.tolist()) == holders
    assert "recurring_unannotated" not in world_knobs(tiny_sim())
    assert world_knobs(tiny_sim(recurring_unannotated=0.5))["recurring_unannotated"] == 0.5


def test_hidden_scene_queries_require_their_scene_without_naming_it(tiny):
    """`sim.hidden_scene_prob`: every relevant video of such a query is in the scene of its
    moment, and its text names no scene; the knob off draws nothing (the world before it)."""
    d = generate("sim-tiny", tiny_sim(hidden_scene_prob=0.7, scene_prob=0.0))
    for name in ("train", "test"):
        s = d[name]
        hidden, spec, scene = s.extra["query_hidden_scene"], s.extra["query_spec"], s.extra["video_scene"]
        assert hidden.any() and (~hidden).any() and np.all(spec[hidden, 3] >= 0) and np.all(spec[~hidden, 3] < 0)
        for q in np.flatnonzero(hidden):
            own = scene[s.extra["events"][spec[q, 0], world.EV_VIDEO]]
            assert set(scene[s.relevance[q].indices]) == {own}
            assert not any(lang.SCENES[k].name in s.query_text[q].lower() for k in range(len(lang.SCENES)))
    assert "query_hidden_scene" not in tiny["test"].extra


def test_compound_queries_say_a_second_overlapping_event_and_relevance_requires_both(tiny):
    """`sim.compound_prob`: a compound query's text says its event and, after "while", another
    event of its video (another action) whose frames overlap its moment, named in full; its
    relevant videos are exactly those holding an event its spec matches overlapped by an event
    of the second one's (character, action, object), which the brute force below recomputes;
    the relevant moments are those pairs; off, the world and its cache key are those of before
    the knob."""
    from prvr.datasets.sim import world_knobs

    d = generate("sim-tiny", tiny_sim(compound_prob=0.8, repeat_prob=0.6, repeat_copies=3, extra_events=3))
    names = lang.concept_vocab()
    for name in ("train", "test"):
        s = d[name]
        ev, spec, clause, scene = (s.extra[k] for k in ("events", "query_spec", "query_clause", "video_scene"))
        compound = clause[:, 0] >= 0
        assert compound.any() and (~compound).any()
        for q in range(s.num_queries):
            e, c, o, sc, _ = spec[q]
            text = s.query_text[q].lower()
            assert ("(SBAR (IN while)" in s.parses[q]) == compound[q]
            if compound[q]:
                k = clause[q, 0]
                assert ev[k, world.EV_VIDEO] == ev[e, world.EV_VIDEO] and ev[k, world.EV_ACTION] != ev[e, world.EV_ACTION]
                assert ev[k, world.EV_START] < ev[e, world.EV_END] and ev[e, world.EV_START] < ev[k, world.EV_END]
                after = text.split(" while " + names["character"][ev[k, world.EV_CHAR]].lower() + " ")[-1]
                assert after != text and names["object"][ev[k, world.EV_OBJ]].split()[-1].lower() in after
            want = set()
            for v in range(s.num_videos):
                of_v = ev[ev[:, world.EV_VIDEO] == v]
                first = of_v[(of_v[:, world.EV_ACTION] == ev[e, world.EV_ACTION]) & ((c < 0) | (of_v[:, world.EV_CHAR] == c))
                             & ((o < 0) | (of_v[:, world.EV_OBJ] == o))]
                if sc >= 0 and scene[v] != sc:
                    continue
                for r in first:
                    if not compound[q]:
                        want.add(v)
                        continue
                    k = clause[q, 0]
                    same = (of_v[:, [world.EV_CHAR, world.EV_ACTION, world.EV_OBJ]]
                            == ev[k, [world.EV_CHAR, world.EV_ACTION, world.EV_OBJ]]).all(1)
                    if np.any(same & (of_v[:, world.EV_START] < r[world.EV_END]) & (r[world.EV_START] < of_v[:, world.EV_END])):
                        want.add(v)
            assert set(s.relevance[q].indices.tolist()) == want
        query, video, _ = world.relevant_moments(s)
        pairs = set(zip(query.tolist(), video.tolist()))
        assert pairs == set(zip(*s.relevance.nonzero()))
    # compound queries narrow relevance: fewer relevant videos per query than the same world without
    off = generate("sim-tiny", tiny_sim(repeat_prob=0.6, repeat_copies=3, extra_events=3))
    assert d["test"].relevance.nnz < off["test"].relevance.nnz
    assert "query_clause" not in tiny["test"].extra and "compound_prob" not in world_knobs(tiny_sim())
    assert world_knobs(tiny_sim(compound_prob=0.3))["compound_prob"] == 0.3


def test_a_while_clause_is_parsed_and_its_words_carry_the_second_events_concepts():
    s = lang.realize(0, 0, None, None, 0, np.random.default_rng(0), filler_rate=0.0, clause=(1, 2, lang.objects_of_action(2)[0], 0))
    plain = lang.realize(0, 0, None, None, 0, np.random.default_rng(0), filler_rate=0.0)
    assert s.text.startswith(plain.text[:-1] + " while " + lang.CHARACTERS[1])
    assert "(SBAR (IN while) (S (NP (NNP " + lang.CHARACTERS[1] + "))" in s.parse
    after = s.tokens.index("while")
    assert s.concepts[after] is None and s.concepts[after + 1] == ("character", 1)
    assert ("action", 2) in s.concepts[after:] and ("object", lang.objects_of_action(2)[0]) in s.concepts[after:]
    with pytest.raises(ValueError, match="action"):
        lang.realize(0, 0, None, None, 0, np.random.default_rng(0), clause=(1, 10_000, None, 0))
    # every filler on: the clause takes the trailing filler's place, and the draws stay aligned
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    full = lang.realize(0, 0, None, None, 0, rng_a, filler_rate=1.0, clause=(1, 2, None, 0))
    alone = lang.realize(0, 0, None, None, 0, rng_b, filler_rate=1.0)
    assert not any(t in full.text for t in ("again while", "briefly while", "moment while", "point while",
                                            "a while while"))
    assert full.text.split(" while ")[0] in alone.text and rng_a.random() == rng_b.random()
