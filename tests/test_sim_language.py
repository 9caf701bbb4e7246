"""Tests for the simulated world's vocabulary and sentence realisation (prvr.datasets.sim.language)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from prvr.datasets.sim import language as L

Tree = list  # [label, child, ...] where a preterminal is [pos, word]


# --------------------------------------------------------------------------- tiny s-expression reader


def read_tree(text: str) -> Tree:
    """Parse a PTB bracket string into nested lists; raises on unbalanced parens."""
    tokens = re.findall(r"\(|\)|[^\s()]+", text)
    pos = 0

    def read() -> Tree:
        nonlocal pos
        assert tokens[pos] == "(", f"expected ( at {pos}: {text}"
        node: Tree = [tokens[pos + 1]]
        pos += 2
        while tokens[pos] != ")":
            if tokens[pos] == "(":
                node.append(read())
            else:
                node.append(tokens[pos])
                pos += 1
        pos += 1
        return node

    tree = read()
    assert pos == len(tokens), f"trailing tokens in {text}"
    return tree


def is_preterminal(node: Tree) -> bool:
    return len(node) == 2 and isinstance(node[1], str)


def leaves(node: Tree) -> list[str]:
    if is_preterminal(node):
        return [node[1]]
    return [w for child in node[1:] for w in leaves(child)]


def all_nodes(node: Tree) -> list[Tree]:
    if is_preterminal(node):
        return [node]
    return [node] + [n for child in node[1:] for n in all_nodes(child)]


def verb_phrases(node: Tree) -> list[list[str]]:
    """Leaves of every VP in the tree: the extraction text-side methods do."""
    return [leaves(n) for n in all_nodes(node) if n[0] == "VP"]


def main_vp(tree: Tree) -> Tree:
    """The single VP directly under ROOT's S."""
    assert tree[0] == "ROOT" and len(tree) == 2 and tree[1][0] == "S"
    vps = [c for c in tree[1][1:] if c[0] == "VP"]
    assert len(vps) == 1
    return vps[0]


# --------------------------------------------------------------------------- helpers


def check_sentence(s: L.Sentence) -> Tree:
    """Structural invariants every realised sentence must satisfy; returns its tree."""
    assert s.parse.count("(") == s.parse.count(")")
    tree = read_tree(s.parse)
    for node in all_nodes(tree):
        # every leaf sits under a POS preterminal: internal nodes have only node children
        if not is_preterminal(node):
            assert all(isinstance(c, list) for c in node[1:]), node
    assert [w.lower() for w in leaves(tree)] == s.tokens
    assert len(s.concepts) == len(s.tokens)
    assert all(t == t.lower() and t for t in s.tokens)
    assert s.text[0].isupper()
    assert " ." not in s.text and " ," not in s.text
    assert s.text.replace(",", " ,").replace(".", " .").lower().split() == s.tokens
    for tok, con in zip(s.tokens, s.concepts):
        assert (con is None) == (tok in L.FUNCTION_WORDS), (tok, con, s.text)
    main_vp(tree)
    return tree


def concept_ids(s: L.Sentence, kind: str) -> set[int]:
    return {c[1] for c in s.concepts if c is not None and c[0] == kind}


# --------------------------------------------------------------------------- vocabulary


def test_vocabulary_invariants() -> None:
    vocab = L.concept_vocab()
    assert set(vocab) == {"character", "scene", "object", "action"}
    n_obj = len(vocab["object"])
    for a in range(len(vocab["action"])):
        assert L.num_paraphrases(a) >= 2
        objs = L.objects_of_action(a)
        assert 3 <= len(objs) <= 6 and len(set(objs)) == len(objs)
        assert all(0 <= o < n_obj for o in objs)
    assert len(set(vocab["scene"])) == len(vocab["scene"])
    assert len(set(vocab["character"])) == len(vocab["character"])
    assert len(set(vocab["action"])) == len(vocab["action"])
    assert len(set(vocab["object"])) == n_obj


def test_shows_partition_characters_and_scenes() -> None:
    vocab = L.concept_vocab()
    chars = [c for s in range(len(L.SHOWS)) for c in L.characters_of_show(s)]
    scenes = [c for s in range(len(L.SHOWS)) for c in L.scenes_of_show(s)]
    assert sorted(chars) == list(range(len(vocab["character"])))
    assert sorted(scenes) == list(range(len(vocab["scene"])))
    for s in range(len(L.SHOWS)):
        assert len(L.characters_of_show(s)) == 5
        assert len(L.scenes_of_show(s)) == 4
        assert all(L.show_of_character(c) == s for c in L.characters_of_show(s))


def test_vocabulary_sizes() -> None:
    vocab = L.concept_vocab()
    assert len(L.SHOWS) >= 8
    assert len(vocab["character"]) >= 40
    assert len(vocab["scene"]) >= 32
    assert len(vocab["action"]) >= 60
    assert 45 <= len(vocab["object"]) <= 60


def test_enough_distinct_events_per_show() -> None:
    """A 500-video split needs well over 1000 distinct (character, action, object) events per show."""
    n_action_objects = sum(len(L.objects_of_action(a)) for a in range(len(L.ACTIONS)))
    for s in range(len(L.SHOWS)):
        assert len(L.characters_of_show(s)) * n_action_objects >= 1200


def test_every_object_is_used_by_some_action() -> None:
    used = {o for a in range(len(L.ACTIONS)) for o in L.objects_of_action(a)}
    assert used == set(range(len(L.OBJECTS)))


def test_concept_words_are_not_function_words() -> None:
    vocab = L.concept_vocab()
    for name in vocab["character"] + vocab["scene"] + vocab["object"]:
        for w in name.lower().split():
            assert w not in L.FUNCTION_WORDS, name


# --------------------------------------------------------------------------- realisation


ALL_COMBOS = [
    (a, p, has_obj, has_char, has_scene)
    for a in range(len(L.ACTIONS))
    for p in range(L.num_paraphrases(a))
    for has_obj, has_char, has_scene in itertools.product([False, True], repeat=3)
]


def realize_combo(a: int, p: int, has_obj: bool, has_char: bool, has_scene: bool, seed: int = 0,
                  filler_rate: float = 0.3) -> tuple[L.Sentence, int | None, int | None, int | None]:
    """Realise one combination with concept ids derived from the action id."""
    objs = L.objects_of_action(a)
    obj = objs[a % len(objs)] if has_obj else None
    char = a % len(L.CHARACTERS) if has_char else None
    scene = L.scenes_of_show(L.show_of_character(a % len(L.CHARACTERS)))[0] if has_scene else None
    s = L.realize(char, a, obj, scene, p, np.random.default_rng(seed), filler_rate=filler_rate)
    return s, char, obj, scene


@pytest.mark.parametrize("filler_rate", [0.0, 0.5, 1.0])
def test_every_combination_realises(filler_rate: float) -> None:
    for a, p, has_obj, has_char, has_scene in ALL_COMBOS:
        s, char, obj, scene = realize_combo(a, p, has_obj, has_char, has_scene, seed=a * 7 + p, filler_rate=filler_rate)
        tree = check_sentence(s)
        # concepts agree with the inputs
        assert concept_ids(s, "action") == {a}
        assert concept_ids(s, "character") == (set() if char is None else {char})
        assert concept_ids(s, "object") == (set() if obj is None else {obj})
        assert concept_ids(s, "scene") == (set() if scene is None else {scene})
        # the main VP holds the verb and the object words
        vp = [w.lower() for w in leaves(main_vp(tree))]
        action_words = [t for t, c in zip(s.tokens, s.concepts) if c == ("action", a)]
        assert action_words and action_words[0] == vp[0]
        obj_words = [t for t, c in zip(s.tokens, s.concepts) if c == ("object", obj)]
        assert all(w in vp for w in obj_words)
        if obj is not None:
            assert L.OBJECTS[obj].lower().split() == obj_words
        assert len(verb_phrases(tree)) == 1
        assert len(s.tokens) < 30


def test_filler_rate_zero_gives_plain_sentence() -> None:
    s = L.realize(0, 0, L.OBJECTS.index("couch"), 0, 0, np.random.default_rng(0), filler_rate=0.0)
    assert s.text == "Sheldon sits down on the couch in the living room."
    assert s.tokens == ["sheldon", "sits", "down", "on", "the", "couch", "in", "the", "living", "room", "."]
    assert s.parse == (
        "(ROOT (S (NP (NNP Sheldon)) (VP (VBZ sits) (PRT (RP down)) (PP (IN on) (NP (DT the) (NN couch)))"
        " (PP (IN in) (NP (DT the) (NN living) (NN room)))) (. .)))"
    )
    assert s.concepts == [("character", 0), ("action", 0), ("action", 0), None, None, ("object", 0),
                          None, None, ("scene", 0), ("scene", 0), None]


def test_fillers_appear_at_full_rate() -> None:
    s = L.realize(0, 0, 0, 0, 0, np.random.default_rng(1), filler_rate=1.0)
    tree = check_sentence(s)
    labels = [c[0] for c in tree[1][1:]]
    assert labels[1] == "," and "ADVP" in labels  # opener + comma, pre-verbal adverb
    assert leaves(main_vp(tree))[-1] != "room"  # trailing filler after the scene


def test_paraphrases_differ() -> None:
    for a in range(len(L.ACTIONS)):
        for has_obj in (False, True):
            seqs = [realize_combo(a, p, has_obj, True, True, filler_rate=0.0)[0].tokens
                    for p in range(L.num_paraphrases(a))]
            assert len({tuple(t) for t in seqs}) == len(seqs), (L.ACTIONS[a].name, seqs)


def test_same_seed_same_sentence() -> None:
    for seed in range(20):
        first = L.realize(None, seed % len(L.ACTIONS), None, 3, 0, np.random.default_rng(seed), filler_rate=0.5)
        again = L.realize(None, seed % len(L.ACTIONS), None, 3, 0, np.random.default_rng(seed), filler_rate=0.5)
        assert first == again


def test_vague_subject_without_character() -> None:
    texts = {L.realize(None, 2, 5, None, 0, np.random.default_rng(seed), 0.0).text.split(" opens")[0]
             for seed in range(50)}
    assert texts == {"Someone", "A man", "A woman", "A person"}


def test_typical_length_is_tvr_like() -> None:
    rng = np.random.default_rng(0)
    lengths = []
    for _ in range(500):
        a = int(rng.integers(len(L.ACTIONS)))
        char = int(rng.integers(len(L.CHARACTERS))) if rng.random() < 0.8 else None
        obj = int(rng.choice(L.objects_of_action(a))) if rng.random() < 0.8 else None
        scene = int(rng.integers(len(L.SCENES))) if rng.random() < 0.7 else None
        s = L.realize(char, a, obj, scene, int(rng.integers(L.num_paraphrases(a))), rng)
        lengths.append(len(s.tokens))
    assert 8 <= np.mean(lengths) <= 16
    assert max(lengths) < 30


def test_bad_ids_raise() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        L.realize(0, 0, None, None, L.num_paraphrases(0), rng)
    with pytest.raises(ValueError):
        L.realize(len(L.CHARACTERS), 0, None, None, 0, rng)
    with pytest.raises(ValueError):
        L.realize(0, len(L.ACTIONS), None, None, 0, rng)
