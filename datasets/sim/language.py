"""Vocabulary and sentence realisation for the simulated PRVR world.

The simulated world (world.py) builds videos from *events*: a character does an action,
perhaps with an object, in a scene. This module owns the words for those concepts and
turns one event into a real English query sentence together with its tokens, the concept
each token expresses, and its gold Penn-Treebank constituency parse. Text-side methods
therefore see real language (paraphrases, fillers, vague subjects) and can pull verb
phrases out of the parse without a parser model.

Concept ids are list indices into `concept_vocab()`. Token-to-concept rule:

- a character name maps to ("character", id), object nouns (every word of a multi-word
  noun such as "coffee cup") to ("object", id), scene nouns to ("scene", id);
- inside an action paraphrase, every word that is not in `FUNCTION_WORDS` maps to
  ("action", id): the verb, particles ("down", "up", "off"), adverbs and light nouns of the
  paraphrase ("seat" in "takes a seat"). Words of the paraphrase that are function words
  ("a" in "takes a seat", "on" in "puts on", "it", "something") map to None;
- determiners, prepositions, pronouns, vague subjects ("Someone", "A man"), fillers and
  punctuation map to None.

So a token's concept is None exactly when the token is in `FUNCTION_WORDS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------- vocabulary


@dataclass(frozen=True)
class Scene:
    """A location: the noun phrase without its determiner, and the preposition it takes."""

    name: str  # "living room"
    preposition: str = "in"  # "in" | "at"


@dataclass(frozen=True)
class Show:
    """A TV-show-like cast: its characters and the scenes where they appear."""

    name: str
    characters: tuple[str, ...]
    scenes: tuple[Scene, ...]


SHOWS: list[Show] = [
    Show(
        "The Big Bang Theory",
        ("Sheldon", "Leonard", "Penny", "Howard", "Raj"),
        (Scene("living room"), Scene("university cafeteria"), Scene("comic book store", "at"), Scene("laundry room")),
    ),
    Show(
        "House M.D.",
        ("House", "Cuddy", "Wilson", "Foreman", "Chase"),
        (Scene("hospital hallway"), Scene("exam room"), Scene("conference room"), Scene("hospital lobby")),
    ),
    Show(
        "Friends",
        ("Ross", "Rachel", "Monica", "Joey", "Chandler"),
        (Scene("coffee shop", "at"), Scene("kitchen"), Scene("apartment hallway"), Scene("balcony", "on")),
    ),
    Show(
        "Castle",
        ("Castle", "Beckett", "Esposito", "Ryan", "Lanie"),
        (Scene("precinct", "at"), Scene("crime scene", "at"), Scene("interrogation room"), Scene("loft")),
    ),
    # Invented casts: an office sitcom, a medical drama, a police procedural, a family sitcom.
    Show(
        "Paper Trail",
        ("Gary", "Denise", "Trevor", "Priya", "Stan"),
        (Scene("cubicle"), Scene("copy room"), Scene("reception area"), Scene("parking lot")),
    ),
    Show(
        "Mercy General",
        ("Nadia", "Owen", "Marcus", "Elena", "Kofi"),
        (Scene("operating room"), Scene("emergency room"), Scene("waiting room"), Scene("supply closet")),
    ),
    Show(
        "Blue Line",
        ("Hector", "Tessa", "Dana", "Curtis", "Malone"),
        (Scene("squad room"), Scene("parking garage"), Scene("alley"), Scene("diner", "at")),
    ),
    Show(
        "The Hendersons",
        ("Frank", "Linda", "Tyler", "Megan", "Bernie"),
        (Scene("dining room"), Scene("backyard"), Scene("basement"), Scene("front porch", "on")),
    ),
]

CHARACTERS: list[str] = [c for show in SHOWS for c in show.characters]
SCENES: list[Scene] = [s for show in SHOWS for s in show.scenes]

# Determiner-free nouns; every word is tagged NN unless listed in _NOUN_TAGS.
OBJECTS: list[str] = [
    "couch", "chair", "table", "desk", "bed", "door", "window", "fridge", "phone", "laptop",
    "TV", "remote", "coffee cup", "glass", "bottle", "plate", "sandwich", "pizza", "apple", "file",
    "book", "newspaper", "notepad", "chart", "whiteboard", "pen", "bag", "box", "keys", "jacket",
    "coat", "hat", "blanket", "pillow", "gun", "badge",
    "keyboard", "cake", "soup", "pasta", "drawer", "car", "lamp", "form", "letter", "photo",
    "flowers", "tie", "suitcase", "vase", "map", "ladder",
]  # fmt: skip

_NOUN_TAGS: dict[str, str] = {"keys": "NNS", "flowers": "NNS"}

OBJ = "OBJ"  # placeholder in paraphrase templates for the object noun phrase


@dataclass(frozen=True)
class Paraphrase:
    """One way to say an action, as a sequence of PTB VP children in bracket notation.

    `with_object` contains the atom OBJ where the object NP goes; `without_object` is the
    natural object-less form ("sits down", "opens it").
    """

    with_object: str
    without_object: str


@dataclass(frozen=True)
class Action:
    """An action id, the object names it is compatible with, and its paraphrases."""

    name: str
    objects: tuple[str, ...]
    paraphrases: tuple[Paraphrase, ...]


def _P(with_object: str, without_object: str) -> Paraphrase:
    """Short constructor that keeps the ACTIONS table readable."""
    return Paraphrase(with_object, without_object)


_SOMETHING = "(NP (NN something))"
_IT = "(NP (PRP it))"

ACTIONS: list[Action] = [
    Action("sit", ("couch", "chair", "desk", "bed"), (
        _P("(VBZ sits) (PRT (RP down)) (PP (IN on) OBJ)", "(VBZ sits) (PRT (RP down))"),
        _P("(VBZ takes) (NP (DT a) (NN seat)) (PP (IN on) OBJ)", "(VBZ takes) (NP (DT a) (NN seat))"),
        _P("(VBZ plops) (PRT (RP down)) (PP (IN on) OBJ)", "(VBZ plops) (PRT (RP down))"),
    )),
    Action("stand_up", ("couch", "chair", "desk", "bed"), (
        _P("(VBZ gets) (PRT (RP up)) (PP (IN from) OBJ)", "(VBZ gets) (PRT (RP up))"),
        _P("(VBZ stands) (PRT (RP up)) (PP (IN from) OBJ)", "(VBZ stands) (PRT (RP up))"),
        _P("(VBZ rises) (PP (IN from) OBJ)", "(VBZ rises)"),
    )),
    Action("open", ("door", "window", "laptop", "box", "fridge", "bag"), (
        _P("(VBZ opens) OBJ", f"(VBZ opens) {_IT}"),
        _P("(VBZ pulls) OBJ (ADJP (JJ open))", f"(VBZ pulls) {_IT} (ADJP (JJ open))"),
    )),
    Action("close", ("door", "window", "laptop", "box", "fridge", "book"), (
        _P("(VBZ closes) OBJ", f"(VBZ closes) {_IT}"),
        _P("(VBZ shuts) OBJ", f"(VBZ shuts) {_IT}"),
        _P("(VBZ slams) OBJ (ADJP (JJ shut))", f"(VBZ slams) {_IT} (ADJP (JJ shut))"),
    )),
    Action("pick_up", ("phone", "book", "bag", "keys", "remote", "glass"), (
        _P("(VBZ picks) (PRT (RP up)) OBJ", f"(VBZ picks) {_IT} (PRT (RP up))"),
        _P("(VBZ grabs) OBJ", f"(VBZ grabs) {_IT}"),
        _P("(VBZ takes) OBJ", f"(VBZ takes) {_IT}"),
    )),
    Action("put_down", ("phone", "book", "bag", "keys", "glass", "coffee cup"), (
        _P("(VBZ puts) OBJ (PRT (RP down))", f"(VBZ puts) {_IT} (PRT (RP down))"),
        _P("(VBZ sets) (PRT (RP down)) OBJ", f"(VBZ sets) {_IT} (PRT (RP down))"),
        _P("(VBZ places) OBJ (ADVP (RB aside))", f"(VBZ places) {_IT} (ADVP (RB aside))"),
    )),
    Action("drink", ("coffee cup", "glass", "bottle"), (
        _P("(VBZ drinks) (PP (IN from) OBJ)", f"(VBZ drinks) {_SOMETHING}"),
        _P("(VBZ takes) (NP (DT a) (NN sip)) (PP (IN from) OBJ)", "(VBZ takes) (NP (DT a) (NN sip))"),
        _P("(VBZ sips) (PP (IN from) OBJ)", f"(VBZ sips) {_SOMETHING}"),
    )),
    Action("use", ("laptop", "phone", "remote", "pen"), (
        _P("(VBZ uses) OBJ", f"(VBZ uses) {_SOMETHING}"),
        _P("(VBZ fiddles) (PP (IN with) OBJ)", f"(VBZ fiddles) (PP (IN with) {_SOMETHING})"),
        _P("(VBZ plays) (PP (IN with) OBJ)", f"(VBZ plays) (PP (IN with) {_SOMETHING})"),
    )),
    Action("look_at", ("whiteboard", "chart", "window", "phone", "file", "TV"), (
        _P("(VBZ looks) (PP (IN at) OBJ)", "(VBZ looks) (ADVP (RB around))"),
        _P("(VBZ stares) (PP (IN at) OBJ)", "(VBZ stares) (ADVP (RB ahead))"),
        _P("(VBZ glances) (PP (IN at) OBJ)", "(VBZ glances) (ADVP (RB around))"),
    )),
    Action("read", ("book", "newspaper", "file", "chart", "notepad", "letter"), (
        _P("(VBZ reads) OBJ", f"(VBZ reads) {_SOMETHING}"),
        _P("(VBZ flips) (PP (IN through) OBJ)", "(VBZ flips) (PP (IN through) (NP (DT some) (NNS pages)))"),
        _P("(VBZ skims) OBJ", f"(VBZ skims) {_SOMETHING}"),
    )),
    Action("write", ("notepad", "whiteboard", "file", "chart", "form"), (
        _P("(VBZ writes) (PP (IN on) OBJ)", f"(VBZ writes) {_SOMETHING} (PRT (RP down))"),
        _P("(VBZ scribbles) (PP (IN on) OBJ)", "(VBZ scribbles) (NP (DT a) (NN note))"),
        _P("(VBZ jots) (NP (DT a) (NN note)) (PP (IN on) OBJ)", "(VBZ jots) (PRT (RP down)) (NP (DT a) (NN note))"),
    )),
    Action("hand_over", ("file", "phone", "coffee cup", "keys", "bottle", "badge"), (
        _P("(VBZ hands) OBJ (PRT (RP over))", f"(VBZ hands) {_IT} (PRT (RP over))"),
        _P("(VBZ passes) OBJ (ADVP (RB along))", f"(VBZ passes) {_IT} (ADVP (RB along))"),
        _P("(VBZ gives) (PRT (RP back)) OBJ", f"(VBZ gives) {_IT} (PRT (RP back))"),
    )),
    Action("throw", ("pen", "pillow", "keys", "bag", "book", "remote"), (
        _P("(VBZ throws) OBJ", f"(VBZ throws) {_SOMETHING}"),
        _P("(VBZ tosses) OBJ (ADVP (RB aside))", f"(VBZ tosses) {_SOMETHING} (ADVP (RB aside))"),
        _P("(VBZ flings) OBJ (ADVP (RB away))", f"(VBZ flings) {_SOMETHING} (ADVP (RB away))"),
    )),
    Action("hold", ("phone", "glass", "gun", "badge", "bag", "coffee cup"), (
        _P("(VBZ holds) OBJ", f"(VBZ holds) {_SOMETHING}"),
        _P("(VBZ holds) (PRT (RP up)) OBJ", f"(VBZ holds) {_IT} (PRT (RP up))"),
        _P("(VBZ clutches) OBJ", f"(VBZ clutches) {_SOMETHING}"),
    )),
    Action("put_on", ("jacket", "coat", "hat", "tie"), (
        _P("(VBZ puts) (PRT (RP on)) OBJ", f"(VBZ puts) {_IT} (PRT (RP on))"),
        _P("(VBZ pulls) (PRT (RP on)) OBJ", f"(VBZ pulls) {_IT} (PRT (RP on))"),
        _P("(VBZ slips) (PP (IN into) OBJ)", "(VBZ gets) (ADJP (JJ dressed))"),
    )),
    Action("take_off", ("jacket", "coat", "hat", "tie"), (
        _P("(VBZ takes) (PRT (RP off)) OBJ", f"(VBZ takes) {_IT} (PRT (RP off))"),
        _P("(VBZ removes) OBJ", f"(VBZ removes) {_IT}"),
        _P("(VBZ slips) (PRT (RP off)) OBJ", f"(VBZ slips) {_IT} (PRT (RP off))"),
    )),
    Action("knock", ("door", "window", "table", "desk"), (
        _P("(VBZ knocks) (PP (IN on) OBJ)", "(VBZ knocks) (ADVP (RB loudly))"),
        _P("(VBZ taps) (PP (IN on) OBJ)", "(VBZ taps) (ADVP (RB lightly))"),
        _P("(VBZ bangs) (PP (IN on) OBJ)", "(VBZ bangs) (ADVP (RB hard))"),
    )),
    Action("walk_to", ("door", "window", "desk", "whiteboard", "fridge", "table"), (
        _P("(VBZ walks) (PP (IN to) OBJ)", "(VBZ walks) (ADVP (RB away))"),
        _P("(VBZ heads) (PP (IN toward) OBJ)", "(VBZ heads) (ADVP (RB off))"),
        _P("(VBZ strolls) (PP (IN to) OBJ)", "(VBZ strolls) (ADVP (RB away))"),
    )),
    Action("lean", ("table", "desk", "door", "chair"), (
        _P("(VBZ leans) (PP (IN against) OBJ)", "(VBZ leans) (ADVP (RB back))"),
        _P("(VBZ leans) (PP (IN on) OBJ)", "(VBZ leans) (ADVP (RB forward))"),
        _P("(VBZ slumps) (PP (IN against) OBJ)", "(VBZ slumps) (ADVP (RB forward))"),
    )),
    Action("lie_down", ("couch", "bed", "table"), (
        _P("(VBZ lies) (PRT (RP down)) (PP (IN on) OBJ)", "(VBZ lies) (PRT (RP down))"),
        _P("(VBZ stretches) (PRT (RP out)) (PP (IN on) OBJ)", "(VBZ stretches) (PRT (RP out))"),
        _P("(VBZ collapses) (PP (IN onto) OBJ)", "(VBZ collapses)"),
    )),
    Action("eat", ("sandwich", "pizza", "apple", "cake"), (
        _P("(VBZ eats) OBJ", f"(VBZ eats) {_SOMETHING}"),
        _P("(VBZ takes) (NP (DT a) (NN bite)) (PP (IN of) OBJ)", "(VBZ takes) (NP (DT a) (NN bite))"),
        _P("(VBZ munches) (PP (IN on) OBJ)", f"(VBZ munches) (PP (IN on) {_SOMETHING})"),
    )),
    Action("point_at", ("gun", "whiteboard", "window", "door", "chart", "TV"), (
        _P("(VBZ points) (PP (IN at) OBJ)", f"(VBZ points) (PP (IN at) {_SOMETHING})"),
        _P("(VBZ gestures) (PP (IN toward) OBJ)", "(VBZ gestures) (ADVP (RB wildly))"),
    )),
    Action("search", ("bag", "desk", "box", "file", "fridge", "drawer"), (
        _P("(VBZ searches) OBJ", "(VBZ searches) (ADVP (RB around))"),
        _P("(VBZ rummages) (PP (IN through) OBJ)", "(VBZ rummages) (ADVP (RB around))"),
        _P("(VBZ digs) (PP (IN through) OBJ)", "(VBZ digs) (ADVP (RB around))"),
    )),
    Action("show", ("badge", "phone", "file", "book", "laptop", "chart"), (
        _P("(VBZ shows) OBJ", f"(VBZ shows) {_SOMETHING}"),
        _P("(VBZ holds) (PRT (RP out)) OBJ", f"(VBZ holds) {_IT} (PRT (RP out))"),
        _P("(VBZ flashes) OBJ", f"(VBZ flashes) {_SOMETHING}"),
    )),
    Action("push", ("chair", "door", "table", "box"), (
        _P("(VBZ pushes) OBJ", f"(VBZ pushes) {_SOMETHING}"),
        _P("(VBZ shoves) OBJ (ADVP (RB aside))", f"(VBZ shoves) {_SOMETHING} (ADVP (RB aside))"),
        _P("(VBZ slides) OBJ (ADVP (RB forward))", f"(VBZ slides) {_SOMETHING} (ADVP (RB forward))"),
    )),
    Action("carry", ("box", "bag", "plate", "laptop", "pizza", "file"), (
        _P("(VBZ carries) OBJ", f"(VBZ carries) {_SOMETHING}"),
        _P("(VBZ lugs) OBJ (ADVP (RB around))", f"(VBZ lugs) {_SOMETHING} (ADVP (RB around))"),
        _P("(VBZ brings) (PRT (RP over)) OBJ", f"(VBZ brings) {_SOMETHING} (PRT (RP over))"),
    )),
    Action("pour", ("glass", "coffee cup", "bottle"), (
        _P(f"(VBZ pours) {_SOMETHING} (PP (IN into) OBJ)", "(VBZ pours) (NP (DT a) (NN drink))"),
        _P("(VBZ fills) (PRT (RP up)) OBJ", f"(VBZ fills) {_IT} (PRT (RP up))"),
        _P("(VBZ refills) OBJ", f"(VBZ refills) {_IT}"),
    )),
    Action("drop", ("phone", "keys", "pen", "glass", "file", "plate"), (
        _P("(VBZ drops) OBJ", f"(VBZ drops) {_SOMETHING}"),
        _P("(VBZ fumbles) OBJ", f"(VBZ fumbles) {_SOMETHING}"),
    )),
    Action("wave", ("newspaper", "hat", "phone", "file", "gun"), (
        _P("(VBZ waves) OBJ (ADVP (RB around))", f"(VBZ waves) {_IT} (ADVP (RB around))"),
        _P("(VBZ brandishes) OBJ", f"(VBZ brandishes) {_SOMETHING}"),
    )),
    Action("wipe", ("table", "desk", "whiteboard", "window", "glass", "plate"), (
        _P("(VBZ wipes) (PRT (RP down)) OBJ", f"(VBZ wipes) {_IT} (PRT (RP down))"),
        _P("(VBZ cleans) OBJ", "(VBZ cleans) (PRT (RP up))"),
        _P("(VBZ scrubs) OBJ", f"(VBZ scrubs) {_IT}"),
    )),
    Action("turn_on", ("laptop", "TV", "phone", "lamp"), (
        _P("(VBZ turns) (PRT (RP on)) OBJ", f"(VBZ turns) {_IT} (PRT (RP on))"),
        _P("(VBZ switches) (PRT (RP on)) OBJ", f"(VBZ switches) {_IT} (PRT (RP on))"),
        _P("(VBZ powers) (PRT (RP up)) OBJ", f"(VBZ powers) {_IT} (PRT (RP up))"),
    )),
    Action("turn_off", ("laptop", "TV", "phone", "lamp"), (
        _P("(VBZ turns) (PRT (RP off)) OBJ", f"(VBZ turns) {_IT} (PRT (RP off))"),
        _P("(VBZ switches) (PRT (RP off)) OBJ", f"(VBZ switches) {_IT} (PRT (RP off))"),
        _P("(VBZ shuts) (PRT (RP down)) OBJ", f"(VBZ shuts) {_IT} (PRT (RP down))"),
    )),
    Action("watch", ("TV", "laptop", "phone"), (
        _P("(VBZ watches) OBJ", "(VBZ watches) (ADVP (RB intently))"),
        _P("(VBZ gazes) (PP (IN at) OBJ)", "(VBZ gazes) (ADVP (RB intently))"),
    )),
    Action("hide", ("gun", "phone", "file", "keys", "badge", "box"), (
        _P("(VBZ hides) OBJ", f"(VBZ hides) {_SOMETHING}"),
        _P("(VBZ stashes) OBJ (ADVP (RB away))", f"(VBZ stashes) {_SOMETHING} (ADVP (RB away))"),
        _P("(VBZ tucks) OBJ (ADVP (RB away))", f"(VBZ tucks) {_SOMETHING} (ADVP (RB away))"),
    )),
    Action("fix", ("laptop", "chair", "phone", "TV", "door"), (
        _P("(VBZ fixes) OBJ", f"(VBZ fixes) {_SOMETHING}"),
        _P("(VBZ repairs) OBJ", f"(VBZ repairs) {_SOMETHING}"),
        _P("(VBZ tinkers) (PP (IN with) OBJ)", f"(VBZ tinkers) (PP (IN with) {_SOMETHING})"),
    )),
    Action("sign", ("file", "chart", "notepad", "book", "form", "letter"), (
        _P("(VBZ signs) OBJ", f"(VBZ signs) {_SOMETHING}"),
        _P("(VBZ scrawls) (NP (DT a) (NN signature)) (PP (IN on) OBJ)", "(VBZ scrawls) (NP (DT a) (NN signature))"),
    )),
    Action("hang_up", ("jacket", "coat", "hat"), (
        _P("(VBZ hangs) (PRT (RP up)) OBJ", f"(VBZ hangs) {_IT} (PRT (RP up))"),
        _P("(VBZ hangs) OBJ (PP (IN on) (NP (DT a) (NN hook)))", f"(VBZ hangs) {_IT} (PP (IN on) (NP (DT a) (NN hook)))"),
    )),
    Action("fold", ("newspaper", "blanket", "jacket", "letter", "map"), (
        _P("(VBZ folds) OBJ", f"(VBZ folds) {_SOMETHING}"),
        _P("(VBZ folds) (PRT (RP up)) OBJ", f"(VBZ folds) {_IT} (PRT (RP up))"),
    )),
    Action("check", ("phone", "chart", "file", "laptop"), (
        _P("(VBZ checks) OBJ", f"(VBZ checks) {_SOMETHING}"),
        _P("(VBZ examines) OBJ", f"(VBZ examines) {_SOMETHING}"),
        _P("(VBZ looks) (PRT (RP over)) OBJ", f"(VBZ looks) {_SOMETHING} (PRT (RP over))"),
    )),
    Action("kick", ("door", "box", "chair", "bag"), (
        _P("(VBZ kicks) OBJ", f"(VBZ kicks) {_SOMETHING}"),
        _P("(VBZ gives) OBJ (NP (DT a) (NN kick))", "(VBZ lashes) (PRT (RP out))"),
    )),
    Action("type_on", ("laptop", "phone", "keyboard"), (
        _P("(VBZ types) (PP (IN on) OBJ)", "(VBZ types) (ADVP (RB away))"),
        _P("(VBZ hammers) (PP (IN at) OBJ)", "(VBZ hammers) (ADVP (RB away))"),
        _P("(VBZ taps) (ADVP (RB away)) (PP (IN at) OBJ)", "(VBZ taps) (ADVP (RB away))"),
    )),
    Action("cut", ("sandwich", "pizza", "apple", "cake"), (
        _P("(VBZ cuts) OBJ", f"(VBZ cuts) {_SOMETHING}"),
        _P("(VBZ slices) OBJ", f"(VBZ slices) {_SOMETHING}"),
        _P("(VBZ cuts) (NP (DT a) (NN slice)) (PP (IN of) OBJ)", "(VBZ cuts) (NP (DT a) (NN slice))"),
    )),
    Action("cook", ("soup", "pasta", "pizza"), (
        _P("(VBZ cooks) OBJ", f"(VBZ cooks) {_SOMETHING}"),
        _P("(VBZ makes) OBJ", "(VBZ makes) (NP (NN dinner))"),
        _P("(VBZ heats) (PRT (RP up)) OBJ", f"(VBZ heats) {_IT} (PRT (RP up))"),
    )),
    Action("wash", ("plate", "glass", "coffee cup", "apple"), (
        _P("(VBZ washes) OBJ", "(VBZ washes) (PRT (RP up))"),
        _P("(VBZ rinses) (PRT (RP off)) OBJ", f"(VBZ rinses) {_IT} (PRT (RP off))"),
    )),
    Action("shake", ("bottle", "box", "bag", "glass"), (
        _P("(VBZ shakes) OBJ", f"(VBZ shakes) {_IT}"),
        _P("(VBZ jiggles) OBJ", f"(VBZ jiggles) {_IT}"),
        _P("(VBZ gives) OBJ (NP (DT a) (NN shake))", f"(VBZ gives) {_IT} (NP (DT a) (NN shake))"),
    )),
    Action("unlock", ("door", "drawer", "phone", "car", "laptop"), (
        _P("(VBZ unlocks) OBJ", f"(VBZ unlocks) {_IT}"),
        _P("(VBZ undoes) (NP (DT the) (NN lock)) (PP (IN on) OBJ)", "(VBZ undoes) (NP (DT the) (NN lock))"),
    )),
    Action("lock", ("door", "drawer", "window", "car", "laptop"), (
        _P("(VBZ locks) OBJ", f"(VBZ locks) {_IT}"),
        _P("(VBZ locks) (PRT (RP up)) OBJ", "(VBZ locks) (PRT (RP up))"),
        _P("(VBZ secures) OBJ", f"(VBZ secures) {_IT}"),
    )),
    Action("plug_in", ("laptop", "phone", "lamp", "TV"), (
        _P("(VBZ plugs) (PRT (RP in)) OBJ", f"(VBZ plugs) {_IT} (PRT (RP in))"),
        _P("(VBZ connects) OBJ", f"(VBZ connects) {_IT}"),
        _P("(VBZ hooks) (PRT (RP up)) OBJ", f"(VBZ hooks) {_IT} (PRT (RP up))"),
    )),
    Action("fill_out", ("form", "chart", "file"), (
        _P("(VBZ fills) (PRT (RP out)) OBJ", f"(VBZ fills) {_IT} (PRT (RP out))"),
        _P("(VBZ completes) OBJ", f"(VBZ completes) {_IT}"),
        _P("(VBZ fills) (PRT (RP in)) OBJ", f"(VBZ fills) {_IT} (PRT (RP in))"),
    )),
    Action("tear", ("newspaper", "letter", "photo", "form"), (
        _P("(VBZ tears) (PRT (RP up)) OBJ", f"(VBZ tears) {_IT} (PRT (RP up))"),
        _P("(VBZ rips) OBJ (ADVP (RB apart))", f"(VBZ rips) {_IT} (ADVP (RB apart))"),
        _P("(VBZ shreds) OBJ", f"(VBZ shreds) {_SOMETHING}"),
    )),
    Action("photograph", ("whiteboard", "gun", "car", "letter"), (
        _P("(VBZ photographs) OBJ", f"(VBZ photographs) {_SOMETHING}"),
        _P("(VBZ snaps) (NP (DT a) (NN picture)) (PP (IN of) OBJ)", "(VBZ snaps) (NP (DT a) (NN picture))"),
        _P("(VBZ takes) (NP (DT a) (NN snapshot)) (PP (IN of) OBJ)", "(VBZ takes) (NP (DT a) (NN snapshot))"),
    )),
    Action("smell", ("coffee cup", "glass", "sandwich", "pizza", "flowers", "soup"), (
        _P("(VBZ smells) OBJ", f"(VBZ smells) {_SOMETHING}"),
        _P("(VBZ sniffs) OBJ", "(VBZ sniffs) (NP (DT the) (NN air))"),
        _P("(VBZ takes) (NP (DT a) (NN whiff)) (PP (IN of) OBJ)", "(VBZ takes) (NP (DT a) (NN whiff))"),
    )),
    Action("adjust", ("hat", "tie", "pillow", "lamp", "jacket"), (
        _P("(VBZ adjusts) OBJ", f"(VBZ adjusts) {_IT}"),
        _P("(VBZ straightens) OBJ", f"(VBZ straightens) {_IT}"),
    )),
    Action("pack", ("bag", "box", "suitcase"), (
        _P("(VBZ packs) OBJ", "(VBZ packs) (PRT (RP up))"),
        _P("(VBZ loads) (PRT (RP up)) OBJ", f"(VBZ loads) {_IT} (PRT (RP up))"),
        _P("(VBZ stuffs) (NP (NNS clothes)) (PP (IN into) OBJ)", "(VBZ stuffs) (NP (NNS clothes)) (PRT (RP in))"),
    )),
    Action("unpack", ("bag", "box", "suitcase"), (
        _P("(VBZ unpacks) OBJ", f"(VBZ unpacks) {_SOMETHING}"),
        _P("(VBZ empties) (PRT (RP out)) OBJ", f"(VBZ empties) {_IT} (PRT (RP out))"),
        _P("(VBZ unloads) OBJ", f"(VBZ unloads) {_IT}"),
    )),
    Action("break", ("glass", "plate", "window", "vase", "lamp", "phone"), (
        _P("(VBZ breaks) OBJ", f"(VBZ breaks) {_SOMETHING}"),
        _P("(VBZ smashes) OBJ", f"(VBZ smashes) {_SOMETHING}"),
        _P("(VBZ shatters) OBJ", f"(VBZ shatters) {_SOMETHING}"),
    )),
    Action("unfold", ("blanket", "newspaper", "map", "letter"), (
        _P("(VBZ unfolds) OBJ", f"(VBZ unfolds) {_SOMETHING}"),
        _P("(VBZ spreads) (PRT (RP out)) OBJ", f"(VBZ spreads) {_IT} (PRT (RP out))"),
    )),
    Action("climb", ("chair", "table", "desk", "bed", "ladder", "couch"), (
        _P("(VBZ climbs) (PP (IN onto) OBJ)", "(VBZ climbs) (PRT (RP up))"),
        _P("(VBZ clambers) (PP (IN onto) OBJ)", "(VBZ clambers) (PRT (RP up))"),
        _P("(VBZ steps) (PRT (RP up)) (PP (IN onto) OBJ)", "(VBZ steps) (PRT (RP up))"),
    )),
    Action("crouch", ("couch", "desk", "door", "table", "box", "car"), (
        _P("(VBZ crouches) (PP (IN behind) OBJ)", "(VBZ crouches) (PRT (RP down))"),
        _P("(VBZ ducks) (PP (IN behind) OBJ)", "(VBZ ducks) (PRT (RP down))"),
        _P("(VBZ takes) (NP (NN cover)) (PP (IN behind) OBJ)", "(VBZ takes) (NP (NN cover))"),
    )),
    Action("drag", ("chair", "box", "bag", "suitcase", "blanket", "table"), (
        _P("(VBZ drags) OBJ", f"(VBZ drags) {_SOMETHING}"),
        _P("(VBZ hauls) OBJ (ADVP (RB along))", f"(VBZ hauls) {_SOMETHING} (ADVP (RB along))"),
    )),
]  # fmt: skip

# Subjects for a query that does not name the character.
VAGUE_SUBJECTS: list[str] = ["(NP (NN someone))", "(NP (DT a) (NN man))", "(NP (DT a) (NN woman))", "(NP (DT a) (NN person))"]

# Optional filler slots, none of which carries visual content.
OPENERS: list[str] = [
    "(ADVP (RB then))", "(ADVP (RB later))", "(ADVP (RB next))", "(ADVP (RB meanwhile))",
    "(PP (IN after) (NP (DT that)))",
]  # fmt: skip
ADVERBS: list[str] = ["then", "just", "slowly", "quickly", "finally", "suddenly", "quietly", "casually"]
TRAILERS: list[str] = [
    "(ADVP (RB again))", "(ADVP (RB briefly))", "(PP (IN for) (NP (DT a) (NN moment)))",
    "(PP (IN at) (NP (DT some) (NN point)))", "(PP (IN for) (NP (DT a) (NN while)))",
]  # fmt: skip

FUNCTION_WORDS: frozenset[str] = frozenset(
    # determiners and pronouns
    ["the", "a", "an", "some", "that", "this", "it", "something", "someone", "his", "her", "their"]
    # prepositions and conjunctions (also "on" as the particle of "puts on", "turns on")
    + ["in", "at", "on", "from", "to", "toward", "into", "onto", "through", "with", "of", "for",
       "against", "behind", "after", "and", "while"]
    # auxiliaries
    + ["is", "are", "was", "were", "be", "does", "do", "has", "have"]
    # vague subject nouns: not concepts in the simulated world
    + ["man", "woman", "person"]
    # fillers: openers, adverbs, trailing phrases
    + ["later", "next", "meanwhile", "again", "briefly", "moment", "point"] + ADVERBS
    # punctuation
    + [".", ","]
)  # fmt: skip

# --------------------------------------------------------------------------- lookups

_OBJECT_INDEX: dict[str, int] = {name: i for i, name in enumerate(OBJECTS)}
_SHOW_OF_CHARACTER: list[int] = [s for s, show in enumerate(SHOWS) for _ in show.characters]


def concept_vocab() -> dict[str, list[str]]:
    """Concept names per kind, in fixed order; the index in each list is the concept id."""
    return {
        "character": list(CHARACTERS),
        "scene": [s.name for s in SCENES],
        "object": list(OBJECTS),
        "action": [a.name for a in ACTIONS],
    }


def show_of_character(char_id: int) -> int:
    """The show a character belongs to."""
    return _SHOW_OF_CHARACTER[char_id]


def _first_index(show_id: int, attr: str) -> int:
    """Global id of the first character or scene of a show (they are stored show by show)."""
    return sum(len(getattr(s, attr)) for s in SHOWS[:show_id])


def scenes_of_show(show_id: int) -> list[int]:
    """Scene ids where a show's events take place."""
    start = _first_index(show_id, "scenes")
    return list(range(start, start + len(SHOWS[show_id].scenes)))


def characters_of_show(show_id: int) -> list[int]:
    """Character ids of a show's cast."""
    start = _first_index(show_id, "characters")
    return list(range(start, start + len(SHOWS[show_id].characters)))


def objects_of_action(action_id: int) -> list[int]:
    """Object ids an action can be done with."""
    return [_OBJECT_INDEX[name] for name in ACTIONS[action_id].objects]


def num_paraphrases(action_id: int) -> int:
    """How many paraphrases `realize` accepts for an action."""
    return len(ACTIONS[action_id].paraphrases)


# --------------------------------------------------------------------------- trees

Concept = tuple[str, int] | None


@dataclass(frozen=True)
class _Node:
    """A constituency tree node; a preterminal when `word` is set (then no children)."""

    label: str
    children: tuple["_Node", ...] = ()
    word: str | None = None
    concept: Concept = None


_TOKEN_RE = re.compile(r"\(|\)|[^\s()]+")


def _read_forest(text: str, obj: _Node | None = None, concept: Concept = None) -> list[_Node]:
    """Read a sequence of bracketed trees; the atom OBJ is replaced by `obj`.

    Every leaf gets `concept` unless its word is a function word (then None).
    """
    tokens = _TOKEN_RE.findall(text)
    pos = 0

    def read() -> _Node:
        nonlocal pos
        if tokens[pos] == OBJ:
            pos += 1
            if obj is None:
                raise ValueError(f"template needs an object: {text}")
            return obj
        if tokens[pos] != "(":
            raise ValueError(f"bad template {text!r} at {tokens[pos]!r}")
        label, pos = tokens[pos + 1], pos + 2
        if tokens[pos] not in ("(", ")", OBJ) and tokens[pos + 1] == ")":
            word, pos = tokens[pos], pos + 2
            return _Node(label, word=word, concept=None if word.lower() in FUNCTION_WORDS else concept)
        children = []
        while tokens[pos] != ")":
            children.append(read())
        pos += 1
        return _Node(label, tuple(children))

    forest = []
    while pos < len(tokens):
        forest.append(read())
    return forest


def _read_tree(text: str, concept: Concept = None) -> _Node:
    """Read exactly one bracketed tree."""
    (tree,) = _read_forest(text, concept=concept)
    return tree


def _leaves(node: _Node) -> list[_Node]:
    """Preterminals of a tree, left to right."""
    if node.word is not None:
        return [node]
    return [leaf for child in node.children for leaf in _leaves(child)]


def _word(leaf: _Node) -> str:
    """A leaf's word (`_leaves` returns preterminals only, each with its word)."""
    if leaf.word is None:
        raise ValueError(f"{leaf.label} is not a preterminal")
    return leaf.word


def _render(node: _Node, first_leaf: _Node | None = None) -> str:
    """PTB bracket string; `first_leaf` (by identity) is written capitalised."""
    if node.word is not None:
        word = _capitalise(node.word) if node is first_leaf else node.word
        return f"({node.label} {word})"
    return f"({node.label} {' '.join(_render(c, first_leaf) for c in node.children)})"


def _capitalise(word: str) -> str:
    """Upper-case the first letter only ("someone" -> "Someone", "TV" stays)."""
    return word[:1].upper() + word[1:]


def _noun_phrase(name: str, concept: Concept) -> _Node:
    """(NP (DT the) (NN ...)...) for an object or scene name."""
    nouns = tuple(_Node(_NOUN_TAGS.get(w, "NN"), word=w, concept=concept) for w in name.split())
    return _Node("NP", (_Node("DT", word="the"),) + nouns)


def _subject(character: int | None, vague_pick: float) -> _Node:
    """Character name as NNP, or a vague subject chosen by `vague_pick` in [0, 1)."""
    if character is None:
        return _read_tree(VAGUE_SUBJECTS[int(vague_pick * len(VAGUE_SUBJECTS))])
    return _Node("NP", (_Node("NNP", word=CHARACTERS[character], concept=("character", character)),))


def _scene_phrase(scene: int) -> _Node:
    """(PP (IN in) (NP (DT the) (NN living) (NN room)))."""
    s = SCENES[scene]
    return _Node("PP", (_Node("IN", word=s.preposition), _noun_phrase(s.name, ("scene", scene))))


def _verb_phrase(action: int, obj: int | None, scene: int | None, paraphrase: int, trailer: _Node | None) -> _Node:
    """The main VP: the paraphrase with its object, then the location, then a trailing filler."""
    p = ACTIONS[action].paraphrases[paraphrase]
    if obj is None:
        children = _read_forest(p.without_object, concept=("action", action))
    else:
        children = _read_forest(p.with_object, _noun_phrase(OBJECTS[obj], ("object", obj)), ("action", action))
    if scene is not None:
        children.append(_scene_phrase(scene))
    if trailer is not None:
        children.append(trailer)
    return _Node("VP", tuple(children))


def _while_clause(character: int, action: int, obj: int | None, paraphrase: int) -> _Node:
    """(SBAR (IN while) (S (NP (NNP Leonard)) (VP ...))): a second event, named in full."""
    inner = _Node("S", (_subject(character, 0.0), _verb_phrase(action, obj, None, paraphrase, None)))
    return _Node("SBAR", (_Node("IN", word="while"), inner))


# --------------------------------------------------------------------------- sentences


@dataclass(frozen=True)
class Sentence:
    """One realised query: text, lower-cased tokens, per-token concept, and gold PTB parse."""

    text: str
    tokens: list[str]
    concepts: list[Concept]
    parse: str


def _join(words: list[str]) -> str:
    """Words joined by spaces, without a space before "." and ","."""
    out = ""
    for w in words:
        out += w if (not out or w in (".", ",")) else " " + w
    return out


def _check_ids(character: int | None, action: int, obj: int | None, scene: int | None, paraphrase: int) -> None:
    """Raise ValueError on an out-of-range concept id or paraphrase index."""
    checks = [
        ("character", character, len(CHARACTERS)),
        ("action", action, len(ACTIONS)),
        ("object", obj, len(OBJECTS)),
        ("scene", scene, len(SCENES)),
    ]
    for kind, value, n in checks:
        if value is not None and not 0 <= value < n:
            raise ValueError(f"{kind} id {value} out of range [0, {n})")
    if not 0 <= paraphrase < num_paraphrases(action):
        raise ValueError(f"action {ACTIONS[action].name} has {num_paraphrases(action)} paraphrases, got {paraphrase}")


def realize(
    character: int | None,
    action: int,
    obj: int | None,
    scene: int | None,
    paraphrase: int,
    rng: np.random.Generator,
    filler_rate: float = 0.3,
    clause: tuple[int, int, int | None, int] | None = None,
) -> Sentence:
    """English sentence for one event.

    character None -> vague subject ("Someone ..."); obj None -> object-less verb phrase;
    scene None -> no location phrase. filler_rate = probability of each optional filler slot
    (sentence opener, pre-verbal adverb, trailing phrase). Any valid object id is accepted,
    compatible with the action or not. `clause` = (character, action, object or None,
    paraphrase) of a second event said after the first: "... while Leonard picks up the
    phone." Always draws the same number of values from `rng`, with a clause or without,
    so the result is deterministic given the rng state and independent draws stay aligned.
    """
    _check_ids(character, action, obj, scene, paraphrase)
    if clause is not None:
        _check_ids(clause[0], clause[1], clause[2], None, clause[3])
    gates, picks = rng.random(3) < filler_rate, rng.random(4)
    children: list[_Node] = []
    opener_word = None
    if gates[0]:
        opener = _read_tree(OPENERS[int(picks[0] * len(OPENERS))])
        opener_word = _leaves(opener)[0].word
        children += [opener, _Node(",", word=",")]
    children.append(_subject(character, picks[1]))
    if gates[1]:
        adverbs = [a for a in ADVERBS if a != opener_word]
        children.append(_Node("ADVP", (_Node("RB", word=adverbs[int(picks[2] * len(adverbs))]),)))
    # no trailing filler before a clause ("... for a while while Leonard ..."); drawn all the same
    trailer = _read_tree(TRAILERS[int(picks[3] * len(TRAILERS))]) if gates[2] and clause is None else None
    children.append(_verb_phrase(action, obj, scene, paraphrase, trailer))
    if clause is not None:
        children.append(_while_clause(*clause))
    children.append(_Node(".", word="."))
    root = _Node("ROOT", (_Node("S", tuple(children)),))
    leaves = _leaves(root)
    words = [_word(leaf) for leaf in leaves]
    return Sentence(
        text=_join([_capitalise(words[0]), *words[1:]]),
        tokens=[word.lower() for word in words],
        concepts=[leaf.concept for leaf in leaves],
        parse=_render(root, leaves[0]),
    )
