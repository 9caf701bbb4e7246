"""A simulated PRVR world with known ground truth.

Videos are sequences of events (a character does an action, maybe with an object) over a
background of shared context (the show's scene and cast). Each annotated event gets one
English query (with its gold parse); unannotated events fill the rest of the video. The
phenomena that label-noise methods exist for each have a knob (SimConfig):

- partial relevance: moment lengths follow the M/V fractions of the imitated dataset;
- label ambiguity: events recur across videos (`repeat_prob`, `repeat_copies`) and vague
  queries omit the object or the character (`vague_prob`), so the one-to-one labels miss
  truly relevant videos;
- shared context: every frame carries its scene and cast (`context_weight`);
- uninformative words: function words and fillers (`filler_rate`) whose token features
  come from word identity only, with no visual concept in them;
- paraphrase: several verb phrases per action (language.py);
- mislabelled pairs: `mislabel_rate` moves training queries to a random wrong video.

Features are fixed random linear maps of the latent semantics plus noise, one map per
modality, so a model must learn the cross-modal alignment.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from prvr.datasets.sim import language as lang
from prvr.datasets.types import Ragged, Split

GENERATOR_VERSION = 2  # bump when the generated data changes; it is part of the cache key
MAX_FRAMES = 128
SPLIT_CODES = {"train": 1, "val": 2, "test": 3}


@dataclass
class Concepts:
    """The world's latent semantics and its fixed feature maps (shared by every split)."""

    character: np.ndarray  # [C, d]
    action: np.ndarray  # [A, d]
    obj: np.ndarray  # [O, d]
    scene: np.ndarray  # [S, d]
    video_map: np.ndarray  # [d, Dv]
    text_map: np.ndarray  # [d, Dq]
    seed: int

    def word(self, token: str) -> np.ndarray:
        """Word-identity vector: same word, same vector; no visual concept in it."""
        d = self.character.shape[1]
        rng = np.random.default_rng([self.seed, 7, zlib.crc32(token.encode())])
        return rng.standard_normal(d) / np.sqrt(d)

    def latent(self, kind: str, idx: int) -> np.ndarray:
        return {"character": self.character, "action": self.action, "object": self.obj, "scene": self.scene}[kind][idx]


def make_concepts(cfg, rng: np.random.Generator) -> Concepts:
    vocab = lang.concept_vocab()
    d = cfg.latent_dim

    def unit(n: int) -> np.ndarray:
        x = rng.standard_normal((n, d))
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    return Concepts(
        character=unit(len(vocab["character"])),
        action=unit(len(vocab["action"])),
        obj=unit(len(vocab["object"])),
        scene=unit(len(vocab["scene"])),
        video_map=rng.standard_normal((d, cfg.video_dim)).astype(np.float32),
        text_map=rng.standard_normal((d, cfg.query_dim)).astype(np.float32),
        seed=cfg.seed,
    )


# Events are rows of an int table: video, character, action, object, start_frame, end_frame, annotated.
EV_VIDEO, EV_CHAR, EV_ACTION, EV_OBJ, EV_START, EV_END, EV_ANNOT = range(7)


@dataclass
class VideoPlan:
    show: np.ndarray  # [V]
    scene: np.ndarray  # [V]
    cast: list[np.ndarray]
    duration: np.ndarray  # [V] seconds
    num_frames: np.ndarray  # [V]


def plan_videos(cfg, n: int, rng: np.random.Generator) -> VideoPlan:
    n_shows = len(lang.SHOWS)
    show = rng.integers(0, n_shows, n)
    scene = np.array([rng.choice(lang.scenes_of_show(s)) for s in show])
    cast = []
    for s in show:
        chars = lang.characters_of_show(int(s))
        k = int(rng.integers(2, len(chars) + 1))
        cast.append(np.sort(rng.choice(chars, size=k, replace=False)))
    dur = rng.normal(cfg.duration_mean, cfg.duration_std, n)
    dur = np.clip(dur, 0.4 * cfg.duration_mean, 2.5 * cfg.duration_mean)
    steps = np.maximum(4, np.round(dur / cfg.seconds_per_frame)).astype(np.int64)
    dur = steps * cfg.seconds_per_frame
    # one row per 1.5 s, at most 128 rows like the public features (longer videos: coarser rows)
    frames = np.minimum(steps, MAX_FRAMES)
    return VideoPlan(show, scene, cast, dur, frames)


def count_events(cfg, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Annotated events (= queries) and unannotated events per video."""
    q = cfg.queries_per_video
    base = int(np.floor(q))
    annotated = base + (rng.random(n) < (q - base)).astype(np.int64)
    annotated = np.maximum(annotated, 1)
    extra = rng.poisson(cfg.extra_events, n)
    return annotated, extra


def actions_in_use(cfg) -> np.ndarray:
    """The actions the world's events draw from: all of the vocabulary, or `sim.actions_in_use`
    of them (a small, generic vocabulary: Charades-STA's "a person opens the door"), the same
    for every split of one world (drawn from the world's seed alone). At 0 (all) nothing is
    drawn, so the worlds made before the knob are made the same."""
    n_actions = len(lang.concept_vocab()["action"])
    if cfg.actions_in_use <= 0 or cfg.actions_in_use >= n_actions:
        return np.arange(n_actions)
    rng = np.random.default_rng([cfg.seed, 11])
    return np.sort(rng.choice(n_actions, size=cfg.actions_in_use, replace=False))


class EventSampler:
    """Draws event contents; recurring events make label ambiguity, fresh ones avoid it."""

    def __init__(self, cfg, plan: VideoPlan, total_events: int, rng: np.random.Generator) -> None:
        self.cfg, self.plan, self.rng = cfg, plan, rng
        self.used: set[tuple[int, int, int]] = set()
        self.actions = actions_in_use(cfg)
        n_shows = len(lang.SHOWS)
        expected_recurring = total_events * cfg.repeat_prob / n_shows
        pool_size = max(1, int(round(expected_recurring / max(cfg.repeat_copies, 1.0))))
        self.pool = [[self._fresh_for_show(s) for _ in range(pool_size)] for s in range(n_shows)]

    def _fresh_for_show(self, show: int) -> tuple[int, int, int]:
        chars = lang.characters_of_show(show)
        return self._combo(np.asarray(chars))

    def _combo(self, chars: np.ndarray) -> tuple[int, int, int]:
        for _ in range(50):  # avoid accidental repeats so that `repeat_prob` is the knob
            a = int(self.actions[self.rng.integers(len(self.actions))])
            o = int(self.rng.choice(lang.objects_of_action(a)))
            c = int(self.rng.choice(chars))
            if (c, a, o) not in self.used:
                break
        self.used.add((c, a, o))
        return c, a, o

    def draw(self, video: int) -> tuple[int, int, int]:
        show = int(self.plan.show[video])
        if self.rng.random() < self.cfg.repeat_prob:
            pool = self.pool[show]
            combo = pool[int(self.rng.integers(len(pool)))]
            self.used.add(combo)
            return combo
        return self._combo(self.plan.cast[video])


def sample_moment(cfg, frames: int, rng: np.random.Generator) -> tuple[int, int]:
    """[start, end) frame span whose length / video length follows the M/V fractions."""
    fr = np.asarray(cfg.mv_fractions, dtype=np.float64)
    bucket = rng.choice(3, p=fr / fr.sum())
    lo, hi = [(0.02, 0.2), (0.2, 0.4), (0.4, 1.0)][bucket]
    frac = rng.uniform(lo, hi)
    length = int(np.clip(round(frac * frames), 1, frames))
    # keep the realised fraction inside its bucket after rounding to whole frames
    while length > 1 and length / frames > hi:
        length -= 1
    while length < frames and length / frames <= lo:
        length += 1
    start = int(rng.integers(0, frames - length + 1))
    return start, start + length


def build_events(cfg, plan: VideoPlan, rng: np.random.Generator) -> np.ndarray:
    n = len(plan.show)
    annotated, extra = count_events(cfg, n, rng)
    sampler = EventSampler(cfg, plan, int(annotated.sum() + extra.sum()), rng)
    rows = []
    for v in range(n):
        for k in range(annotated[v] + extra[v]):
            c, a, o = sampler.draw(v)
            s, e = sample_moment(cfg, int(plan.num_frames[v]), rng)
            rows.append((v, c, a, o, s, e, int(k < annotated[v])))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 7)


def later_copies_unannotated(cfg, events: np.ndarray, split_code: int) -> None:
    """`sim.recurring_unannotated` of a recurring (character, action, object)'s annotated events
    after its first annotated one (in event order) trade their annotation with an unannotated
    event of their video whose combination is not recurring, drawn at random; a video without
    one keeps its copy annotated. Each video keeps its number of queries, and relevance (which
    reads every event) is unchanged; the queries change: the first copy's query stays, the
    later copies' videos are relevant to it through events their own queries do not describe.
    Sets the annotation column of `events`. Its draws come from a stream of their own, and none
    is made when the knob is 0, so the worlds made before it are made the same."""
    if cfg.recurring_unannotated <= 0:
        return
    rng = np.random.default_rng([cfg.seed, split_code, 17])
    combos = [tuple(row) for row in events[:, [EV_CHAR, EV_ACTION, EV_OBJ]].tolist()]
    copies: dict[tuple, int] = {}
    for combo in combos:
        copies[combo] = copies.get(combo, 0) + 1
    bounds = _video_bounds(events)
    annotated_before: set[tuple] = set()
    for e, combo in enumerate(combos):
        if not events[e, EV_ANNOT] or copies[combo] < 2:
            continue
        if combo not in annotated_before:
            annotated_before.add(combo)
            continue
        if rng.random() >= cfg.recurring_unannotated:
            continue
        video = events[e, EV_VIDEO]  # events are sorted by video
        spare = [k for k in range(bounds[video], bounds[video + 1])
                 if not events[k, EV_ANNOT] and copies[combos[k]] < 2]
        if spare:
            swap = spare[int(rng.integers(len(spare)))]
            events[e, EV_ANNOT], events[swap, EV_ANNOT] = 0, 1


def query_specs(cfg, events: np.ndarray, plan: VideoPlan, rng: np.random.Generator) -> np.ndarray:
    """What each query requires of a relevant video: [Q, 5] = event row, character, object,
    scene, paraphrase (-1 = omitted). Its text names the same, except the character of an
    `unnamed_text` query (`sim.unnamed_prob`)."""
    ann = np.nonzero(events[:, EV_ANNOT])[0]
    specs = np.full((len(ann), 5), -1, dtype=np.int64)
    for i, e in enumerate(ann):
        c, a, o = events[e, EV_CHAR], events[e, EV_ACTION], events[e, EV_OBJ]
        scene = int(plan.scene[events[e, EV_VIDEO]])
        named_scene = rng.random() < cfg.scene_prob
        if rng.random() < cfg.vague_prob:
            if rng.random() < 0.5:
                o = -1  # "Sheldon sits down."
            else:
                c = -1  # "Someone sits down on the couch."
        specs[i] = (e, c, o, scene if named_scene else -1, rng.integers(lang.num_paraphrases(int(a))))
    return specs


def worded_apart(cfg, specs: np.ndarray, events: np.ndarray, split_code: int) -> None:
    """`sim.distinct_wording` of the queries of a (character, action, object) combination after
    its first take the paraphrase after the previous such query's (cycling through the action's
    paraphrases) instead of their own draw; sets it in `specs`. Relevance does not read the
    paraphrase, so only the text changes. Its draws come from a stream of their own, and none is
    made when the knob is 0, so the worlds made before it are made the same."""
    if cfg.distinct_wording <= 0:
        return
    rng = np.random.default_rng([cfg.seed, split_code, 13])
    apart = rng.random(len(specs)) < cfg.distinct_wording
    last: dict[tuple[int, int, int], int] = {}
    for i, (e, c, o) in enumerate(specs[:, :3]):
        action = int(events[e, EV_ACTION])
        combo = (int(c), action, int(o))
        if combo in last and apart[i]:
            specs[i, 4] = (last[combo] + 1) % lang.num_paraphrases(action)
        last[combo] = int(specs[i, 4])


def hidden_scene(cfg, specs: np.ndarray, events: np.ndarray, plan: VideoPlan, rng: np.random.Generator) -> np.ndarray:
    """[Q] bool: the queries whose relevance requires the scene their moment is in while their
    text does not name it (`sim.hidden_scene_prob` of those that name no scene): texts alike,
    videos in other scenes not relevant. Sets the scene in `specs` (what relevance requires).
    No draw at all when the knob is 0, so the worlds made before it are made the same."""
    if cfg.hidden_scene_prob <= 0:
        return np.zeros(len(specs), dtype=bool)
    hidden = (rng.random(len(specs)) < cfg.hidden_scene_prob) & (specs[:, 3] < 0)
    specs[hidden, 3] = plan.scene[events[specs[hidden, 0], EV_VIDEO]]
    return hidden


def unnamed_text(cfg, specs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[Q] bool: the queries whose text says "someone" for the character they require
    (`sim.unnamed_prob` of those that name one). No draw at all when the knob is 0, so the
    worlds made before it are made the same."""
    if cfg.unnamed_prob <= 0:
        return np.zeros(len(specs), dtype=bool)
    return (rng.random(len(specs)) < cfg.unnamed_prob) & (specs[:, 1] >= 0)


def compound_clauses(cfg, specs: np.ndarray, events: np.ndarray, split_code: int) -> np.ndarray:
    """[Q, 2] = (event row, paraphrase) of the second event a compound query says, -1 where it
    says none: `sim.compound_prob` of the queries add "while <another event of their video whose
    frames overlap their moment's>", an event of another action, named in full (character,
    action, object) in a paraphrase of its own draw. Relevance then requires both, overlapping,
    in one video (`clause_holds`). Real queries often say two things, so a relevant video's query
    shares part of what a query says and not the rest. Its draws come from a stream of their
    own, and none is made when the knob is 0, so the worlds made before it are made the same."""
    clauses = np.full((len(specs), 2), -1, dtype=np.int64)
    if cfg.compound_prob <= 0:
        return clauses
    rng = np.random.default_rng([cfg.seed, split_code, 19])
    chosen = rng.random(len(specs)) < cfg.compound_prob
    bounds = _video_bounds(events)
    for i in np.nonzero(chosen)[0]:
        e = specs[i, 0]
        video = events[e, EV_VIDEO]
        rows = np.arange(bounds[video], bounds[video + 1])
        ev = events[rows]
        fits = ((ev[:, EV_START] < events[e, EV_END]) & (events[e, EV_START] < ev[:, EV_END])
                & (ev[:, EV_ACTION] != events[e, EV_ACTION]))
        if fits.any():
            k = int(rows[fits][int(rng.integers(int(fits.sum())))])
            clauses[i] = (k, rng.integers(lang.num_paraphrases(int(events[k, EV_ACTION]))))
    return clauses


def _video_bounds(events: np.ndarray) -> np.ndarray:
    """[V + 1]: the rows of video v are bounds[v]:bounds[v + 1] (events are sorted by video)."""
    return np.searchsorted(events[:, EV_VIDEO], np.arange(int(events[:, EV_VIDEO].max(initial=-1)) + 2))


def clause_holds(events: np.ndarray, rows: np.ndarray, clause_event: int, bounds: np.ndarray) -> np.ndarray:
    """[len(rows)] bool: which of the events `rows` have, in their own video, an event of
    `clause_event`'s (character, action, object) whose frames overlap theirs: a compound
    query's second event (`compound_clauses`), as relevance requires it."""
    combo = events[clause_event, [EV_CHAR, EV_ACTION, EV_OBJ]]
    out = np.zeros(len(rows), dtype=bool)
    for i, r in enumerate(rows):
        video = events[r, EV_VIDEO]
        ev = events[bounds[video]:bounds[video + 1]]
        out[i] = bool(np.any((ev[:, [EV_CHAR, EV_ACTION, EV_OBJ]] == combo).all(1)
                             & (ev[:, EV_START] < events[r, EV_END]) & (events[r, EV_START] < ev[:, EV_END])))
    return out


def relevance_matrix(specs: np.ndarray, events: np.ndarray, plan: VideoPlan,
                     clauses: np.ndarray | None = None) -> sp.csr_matrix:
    """Ground truth: a video is relevant to a query when one of its events (annotated or not)
    matches every attribute the query names (character, action, object, scene), and, for a
    compound query (`clauses`), overlaps an event of the video that its second event's
    (character, action, object) names."""
    by_action, bounds = _events_by_action(events), _video_bounds(events)
    rows, cols = [], []
    for q, spec in enumerate(specs):
        clause = -1 if clauses is None else int(clauses[q, 0])
        videos = np.unique(events[matching_events(spec, clause, events, plan.scene, by_action, bounds), EV_VIDEO])
        rows += [q] * len(videos)
        cols += videos.tolist()
    n_videos = len(plan.show)
    return sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=(len(specs), n_videos))


def _events_by_action(events: np.ndarray) -> dict[int, np.ndarray]:
    """action -> the rows of its events."""
    return {int(a): np.nonzero(events[:, EV_ACTION] == a)[0] for a in np.unique(events[:, EV_ACTION])}


def matching_events(spec: np.ndarray, clause_event: int, events: np.ndarray, scene: np.ndarray,
                    by_action: dict[int, np.ndarray], bounds: np.ndarray) -> np.ndarray:
    """The event rows that one query's relevance holds for: those that match every attribute
    its spec names (character, action, object, scene) and, for a compound query
    (`clause_event` >= 0), that its second event's combination overlaps (`clause_holds`). The
    rule of `relevance_matrix` and `relevant_moments`."""
    e, c, o, sc, _ = spec
    cand = by_action[int(events[e, EV_ACTION])]
    ev = events[cand]
    keep = ((c < 0) | (ev[:, EV_CHAR] == c)) & ((o < 0) | (ev[:, EV_OBJ] == o))
    if sc >= 0:
        keep &= scene[ev[:, EV_VIDEO]] == sc
    if clause_event >= 0:
        keep[keep] = clause_holds(events, cand[keep], clause_event, bounds)
    return cand[keep]


def relevant_moments(split: Split) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every truly relevant moment of a simulated split: (query [M], video [M], [M, 2] seconds),
    sorted by query, one row per matching event (a relevant video may hold several).

    Read from what the split keeps (`extra` events, query specs and video scenes), by the rule of
    `relevance_matrix`; its (query, video) pairs are the relevance matrix's. A row covers
    [start, end) of the event's frame span at the video's seconds per row, as the labelled
    moments do. None for a split without events (not simulated).
    """
    events, specs, scene = (split.extra.get(k) for k in ("events", "query_spec", "video_scene"))
    if events is None or specs is None or scene is None:
        return None
    clauses = split.extra.get("query_clause")
    row_seconds = split.durations / np.maximum(split.frames.lengths, 1)
    by_action, bounds = _events_by_action(events), _video_bounds(events)
    queries, rows = [], []
    for q, spec in enumerate(specs):
        found = matching_events(spec, -1 if clauses is None else int(clauses[q, 0]), events, scene, by_action, bounds)
        queries.append(np.full(len(found), q, dtype=np.int64))
        rows.append(found)
    rows_all = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    video = events[rows_all, EV_VIDEO].astype(np.int64)
    spans = events[rows_all][:, [EV_START, EV_END]].astype(np.float64) * row_seconds[video, None]
    query = np.concatenate(queries) if queries else np.zeros(0, dtype=np.int64)
    return query, video, spans


def frame_latents(cfg, concepts: Concepts, plan: VideoPlan, events: np.ndarray, v: int,
                  ev_rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Latent content of every frame of video v: context + active events + latent noise."""
    t = int(plan.num_frames[v])
    d = cfg.latent_dim
    context = concepts.scene[plan.scene[v]] + 0.5 * concepts.character[plan.cast[v]].mean(0)
    z = np.tile(cfg.context_weight * context, (t, 1))
    for e in ev_rows:
        _, c, a, o, s, end, _ = events[e]
        ev = concepts.character[c] + concepts.action[a] + cfg.object_weight * concepts.obj[o]
        z[s:end] += ev
    z += cfg.frame_noise / np.sqrt(d) * rng.standard_normal((t, d))
    return z


def generate_split(cfg, concepts: Concepts, split: str, n_videos: int, prefix: str,
                   progress=lambda n=1: None) -> Split:
    rng = np.random.default_rng([cfg.seed, SPLIT_CODES[split]])
    plan = plan_videos(cfg, n_videos, rng)
    events = build_events(cfg, plan, rng)
    later_copies_unannotated(cfg, events, SPLIT_CODES[split])
    specs = query_specs(cfg, events, plan, rng)
    worded_apart(cfg, specs, events, SPLIT_CODES[split])
    hidden = hidden_scene(cfg, specs, events, plan, rng)
    clauses = compound_clauses(cfg, specs, events, SPLIT_CODES[split])
    relevance = relevance_matrix(specs, events, plan, clauses)
    unnamed = unnamed_text(cfg, specs, rng)
    said = specs.copy()  # what the text names: neither an unnamed character nor a hidden scene
    said[unnamed, 1], said[hidden, 3] = -1, -1
    by_video = np.split(np.arange(len(events)), np.searchsorted(events[:, EV_VIDEO], np.arange(1, n_videos)))

    frames = _frame_features(cfg, concepts, plan, events, by_video, rng, progress)
    text, tokens, parses = _queries(cfg, concepts, events, said, clauses, rng)
    query_video = events[specs[:, 0], EV_VIDEO].copy()
    if split == "train" and cfg.mislabel_rate > 0:
        query_video = _mislabel(query_video, cfg.mislabel_rate, n_videos, rng)
    row_seconds = plan.duration / plan.num_frames  # 1.5 s, more for videos past 128 rows
    ev = events[specs[:, 0]]
    moments = ev[:, [EV_START, EV_END]].astype(np.float64) * row_seconds[ev[:, EV_VIDEO], None]
    video_ids = [f"{prefix}_{split}_{v:05d}" for v in range(n_videos)]
    k_of = np.zeros(len(specs), dtype=np.int64)
    counts: dict[int, int] = {}
    for i, v in enumerate(events[specs[:, 0], EV_VIDEO]):
        k_of[i] = counts.get(int(v), 0)
        counts[int(v)] = k_of[i] + 1
    # query ids name the video the event truly happened in (the MS-SL cap-id convention)
    query_ids = [f"{video_ids[v]}#enc#{k}" for v, k in zip(events[specs[:, 0], EV_VIDEO], k_of)]
    return Split(
        video_ids=video_ids, frames=frames, durations=plan.duration, query_ids=query_ids,
        query_text=text, tokens=tokens, query_video=query_video, moments=moments,
        relevance=relevance, parses=parses,
        extra={"query_spec": specs, "events": events, "video_scene": plan.scene, "video_show": plan.show,
               **({"query_unnamed": unnamed} if cfg.unnamed_prob > 0 else {}),
               **({"query_hidden_scene": hidden} if cfg.hidden_scene_prob > 0 else {}),
               **({"query_clause": clauses} if cfg.compound_prob > 0 else {})},
    )


def _mislabel(query_video: np.ndarray, rate: float, n_videos: int, rng: np.random.Generator) -> np.ndarray:
    out = query_video.copy()
    moved = np.nonzero(rng.random(len(out)) < rate)[0]
    shift = rng.integers(1, n_videos, len(moved))  # never the true video
    out[moved] = (out[moved] + shift) % n_videos
    return out


def _frame_features(cfg, concepts, plan, events, by_video, rng, progress) -> Ragged:
    offsets = np.concatenate([[0], np.cumsum(plan.num_frames)])
    data = np.empty((int(offsets[-1]), cfg.video_dim), dtype=np.float16)
    latents, pending, start = [], 0, 0
    for v in range(len(plan.show)):
        latents.append(frame_latents(cfg, concepts, plan, events, v, by_video[v], rng))
        pending += len(latents[-1])
        if pending >= 8192 or v == len(plan.show) - 1:
            z = np.concatenate(latents).astype(np.float32)
            feats = z @ concepts.video_map
            feats += rng.standard_normal(feats.shape, dtype=np.float32)
            data[start : start + len(z)] = feats
            start += len(z)
            progress(len(latents))
            latents, pending = [], 0
    return Ragged(data, offsets)


def _queries(cfg, concepts, events, specs, clauses, rng) -> tuple[list[str], Ragged, list[str]]:
    texts, parses, toks = [], [], []
    d = cfg.latent_dim
    for (e, c, o, scene, para), (k, k_para) in zip(specs, clauses):
        clause = None if k < 0 else (int(events[k, EV_CHAR]), int(events[k, EV_ACTION]), int(events[k, EV_OBJ]), int(k_para))
        s = lang.realize(None if c < 0 else int(c), int(events[e, EV_ACTION]), None if o < 0 else int(o),
                         None if scene < 0 else int(scene), int(para), rng, filler_rate=cfg.filler_rate,
                         clause=clause)
        z = np.stack([_token_latent(concepts, tok, con) for tok, con in zip(s.tokens, s.concepts)])
        z += cfg.token_noise / np.sqrt(d) * rng.standard_normal(z.shape)
        feats = z.astype(np.float32) @ concepts.text_map
        feats += rng.standard_normal(feats.shape, dtype=np.float32)
        texts.append(s.text)
        parses.append(s.parse)
        toks.append(feats.astype(np.float16))
    return texts, Ragged.from_list(toks, cfg.query_dim, dtype=np.float16), parses


def _token_latent(concepts: Concepts, token: str, concept: tuple[str, int] | None) -> np.ndarray:
    """Content words carry their concept plus a word-specific part (paraphrases differ);
    function words and fillers carry word identity only: no visual signal."""
    word = concepts.word(token)
    if concept is None:
        return word
    kind, idx = concept
    return concepts.latent(kind, idx) + 0.3 * word
