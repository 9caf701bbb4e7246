"""Phrases from Penn-Treebank parses (methods/relations/phrases.py): the elements that Phi_vp
and Phi_np-vp compare, on hand-written trees; and the rule-based fallback parser
(methods/relations/text_parsers.py) on hand-picked sentences and on the simulated world's
gold parses."""

from __future__ import annotations

import pytest

from prvr.methods.relations.phrases import (elements, join_words, noun_phrases, np_vp_sentences, read_tree,
                                            subject_noun_phrases, verb_phrases)
from prvr.methods.relations.text_parsers import rules_parse, tokenize

# "man and woman start dancing", the paper's example (Sec. 4.1, Fig. 2)
DANCING = "(ROOT (S (NP (NN man) (CC and) (NN woman)) (VP (VBP start) (S (VP (VBG dancing)))) (. .)))"
NESTED = "(ROOT (S (NP (DT A) (NN man)) (VP (VBZ is) (VP (VBN seen) (S (VP (VBG dancing))))) (. .)))"
COORDINATED = ("(ROOT (S (NP (NNP Sheldon)) (VP (VP (VBZ sits) (PRT (RP down))) (CC and) "
               "(VP (VBZ picks) (PRT (RP up)) (NP (DT the) (NN remote)))) (. .)))")


def test_a_tree_reads_with_its_labels_words_and_text():
    t = read_tree(NESTED)
    assert t.label == "ROOT" and t.children[0].label == "S"
    assert t.leaves() == ["A", "man", "is", "seen", "dancing", "."]
    assert t.text() == "A man is seen dancing."
    assert read_tree("( (S (NP (PRP He)) (VP (VBZ runs))))").label == "ROOT"  # unlabelled outer bracket


@pytest.mark.parametrize("bad", ["", "(S (NP (NN man))", "(S (NP (NN man)))) extra", "NP man)"])
def test_a_broken_parse_is_a_value_error(bad):
    with pytest.raises(ValueError):
        read_tree(bad)


def test_words_join_without_space_before_punctuation_clitics_and_escapes_undone():
    assert join_words(["He", "does", "n't", "stop", ",", "the", "man", "'s", "dog", "."]) == \
        "He doesn't stop, the man's dog."
    assert join_words(["-LRB-", "laughs", "-RRB-"]) == "( laughs)"


def test_verb_phrases_are_every_vp_outer_first_nested_included():
    assert verb_phrases(read_tree(NESTED)) == ["is seen dancing", "seen dancing", "dancing"]
    assert verb_phrases(read_tree(DANCING)) == ["start dancing", "dancing"]  # the paper's two VPs


def test_coordinated_vps_give_the_whole_and_each_conjunct():
    assert verb_phrases(read_tree(COORDINATED)) == ["sits down and picks up the remote", "sits down",
                                                    "picks up the remote"]


def test_a_unary_chain_gives_one_phrase():
    assert verb_phrases(read_tree("(S (NP (NN dog)) (VP (VP (VBZ barks))))")) == ["barks"]


def test_noun_phrases():
    assert noun_phrases(read_tree(COORDINATED)) == ["Sheldon", "the remote"]


@pytest.mark.parametrize("parse, subjects", [
    (DANCING, ["man", "woman"]),  # a flat coordinated NP: one subject per conjunct
    ("(S (NP (NP (DT the) (NN man)) (CC and) (NP (DT the) (NN woman))) (VP (VBP talk)))", ["the man", "the woman"]),
    ("(S (NP (NP (DT the) (NN girl)) (PP (IN in) (NP (NN pink)))) (VP (VBZ dances)))", ["the girl"]),  # head NP
    ("(NP (NP (DT the) (NN girl)) (VP (VBG dancing)))", ["the girl"]),  # a fragment: NP before its VP
    ("(S (VP (VB open) (NP (DT the) (NN door))))", []),  # no subject
])
def test_subjects_of_the_np_vp_rule(parse, subjects):
    assert subject_noun_phrases(read_tree(parse)) == subjects


def test_np_vp_sentences_join_each_subject_with_each_vp():
    assert np_vp_sentences(read_tree(DANCING)) == ["man start dancing", "man dancing", "woman start dancing",
                                                   "woman dancing"]
    assert np_vp_sentences(read_tree("(S (VP (VB open) (NP (DT the) (NN door))))")) == ["open the door"]


def test_element_zero_is_the_sentence_for_every_phi():
    text = "Man and woman start dancing."
    assert elements(text, DANCING, "sent") == [text]
    assert elements(text, DANCING, "vp") == [text, "start dancing", "dancing"]
    assert elements(text, DANCING, "np-vp") == [text, "man start dancing", "man dancing", "woman start dancing",
                                                "woman dancing"]
    assert elements(text, None, "sent") == [text]
    with pytest.raises(ValueError, match="needs a parse"):
        elements(text, None, "vp")


def test_the_simulated_gold_parses_read_and_give_verb_phrases(tiny_cfg):
    from prvr.harness.base.registry import DATASETS

    cfg = tiny_cfg()
    split = DATASETS.get("sim-tiny").load(cfg)["train"]
    for text, parse in zip(split.query_text, split.parses):
        tree = read_tree(parse)
        assert tree.text() == text
        assert verb_phrases(tree) and subject_noun_phrases(tree)


# ----------------------------------------------------------------------------- the rules
def test_tokenize_splits_clitics_and_punctuation():
    assert tokenize("He doesn't open the man's box, then leaves.") == [
        "He", "does", "n't", "open", "the", "man", "'s", "box", ",", "then", "leaves", "."]


@pytest.mark.parametrize("text, vps, subjects", [
    ("Then, Sheldon quickly opens the door.", ["opens the door"], ["Sheldon"]),
    ("Next, Chase just turns on the lamp.", ["turns on the lamp"], ["Chase"]),  # a name that is also a verb
    ("Linda then jots a note.", ["jots a note"], ["Linda"]),  # 'then' before the verb is an adverb
    ("person opens the door.", ["opens the door"], ["person"]),
    ("a person is putting a book on a shelf.", ["is putting a book on a shelf", "putting a book on a shelf"],
     ["a person"]),
    ("Sheldon sits down on the couch and picks up the remote.",
     ["sits down on the couch and picks up the remote", "sits down on the couch", "picks up the remote"], ["Sheldon"]),
    ("Man and woman start dancing.", ["start dancing", "dancing"], ["Man", "woman"]),
    ("the girl in the pink shirt starts dancing", ["starts dancing", "dancing"], ["the girl"]),
    ("He doesn't want to eat the cake.", ["doesn't want to eat the cake", "want to eat the cake", "to eat the cake",
                                          "eat the cake"], ["He"]),
    ("A man sits. He then walks away.", ["sits", "walks away"], ["A man", "He"]),
    ("A man is sitting and reading a book.", ["is sitting and reading a book", "is sitting", "sitting",
                                              "reading a book"], ["A man"]),
    ("A man is happy.", ["is happy"], ["A man"]),  # an adjective after 'is' is no verb
    # a verb outside the lexicon, known by its inflection before a name; Phoebe is the subject of
    # "to have dinner", as a treebank parse has it ((S (NP Phoebe) (VP to have dinner)))
    ("Rachel invites Phoebe to have dinner.", ["invites Phoebe to have dinner", "to have dinner", "have dinner"],
     ["Rachel", "Phoebe"]),
])
def test_the_rules_bracket_verb_phrases_and_subjects(text, vps, subjects):
    (parse,) = rules_parse([text])
    tree = read_tree(parse)
    assert tree.text() == text
    assert verb_phrases(tree) == vps and subject_noun_phrases(tree) == subjects


def test_the_rules_find_the_gold_verb_phrases_of_the_simulated_world(tiny_cfg):
    """Every parse the rules write reads back with the text's words; on the templated simulated
    text they find nearly every gold VP (the table of results/census/vp-extraction.md measures it
    on sim-tvr)."""
    from prvr.harness.cli.census import vp_counts
    from prvr.harness.base.registry import DATASETS

    split = DATASETS.get("sim-tiny").load(tiny_cfg())["train"]
    parses = rules_parse(split.query_text)
    assert [read_tree(p).text() for p in parses] == split.query_text
    counts = vp_counts(split.parses, parses)
    assert counts["precision"] > 0.9 and counts["recall"] > 0.9, counts
