"""Phrases of a query from its Penn-Treebank parse: the elements that Phi compares (SBERT
paper Sec. 4.1, Eq. 7).

- Phi_sent compares whole sentences: the elements of q_i are [q_i].
- Phi_vp compares verb phrases: the elements are [q_i, VP_1, VP_2, ...] (element 0 is the
  sentence itself, "Let {VP_n^i}_n | n=0 = q_i"), every VP node of the parse, outer ones first.
- Phi_np-vp compares short sentences made of a subject NP and a VP ("man and woman start
  dancing" -> "man start dancing", "woman start dancing"). The paper names no rule; ours:
  the subjects are the NP children that stand before the first VP child of any node (the
  subject of an S, or the head of an NP fragment "the girl dancing"); a subject made of
  conjuncts ("man and woman", "(NP (NP the man) (CC and) (NP the woman))") gives one subject per
  conjunct, and a subject with post-modifiers ("(NP (NP the girl) (PP in pink))") gives its
  head NP. Each subject is joined with each VP of the sentence ("man start dancing", "man
  dancing", ...). Element 0 is again the sentence; a parse without a subject gives its VPs.

Phrases are the parse's leaves joined by spaces, with no space before punctuation and
clitics ("'s", "n't") and the bracket escapes (-LRB- ...) undone; duplicates within a query
are dropped (unary chains such as (VP (VP sits)) give one element).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

Phi = Literal["sent", "vp", "np-vp"]  # the query elements a detector compares (SBERT-PR Eq. 7)
PHIS: tuple[Phi, ...] = get_args(Phi)
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_ESCAPES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
            "``": '"', "''": '"'}
_NO_SPACE_BEFORE = re.compile(r"^([.,;:!?%)\]}]|'s|'S|n't|'re|'ve|'ll|'d|'m)$")
_COORDINATORS = ("CC", ",", ":", "CONJP")


@dataclass(frozen=True)
class Tree:
    """A constituency tree node; a preterminal has a `word` and no children."""

    label: str
    children: tuple["Tree", ...] = ()
    word: str | None = None

    def leaves(self) -> list[str]:
        if self.word is not None:
            return [self.word]
        return [w for c in self.children for w in c.leaves()]

    def text(self) -> str:
        return join_words(self.leaves())

    def walk(self) -> Iterator[Tree]:
        """Every node, pre-order (a node before the nodes it holds)."""
        yield self
        for c in self.children:
            yield from c.walk()


def join_words(words: list[str]) -> str:
    """Words as text: spaces between them, none before punctuation and clitics."""
    out = ""
    for w in (_ESCAPES.get(w, w) for w in words):
        out += w if not out or _NO_SPACE_BEFORE.match(w) else " " + w
    return out


def read_tree(text: str) -> Tree:
    """One bracketed tree, e.g. '(ROOT (S (NP (NNP Sheldon)) (VP (VBZ sits))))'. An outer bracket
    without a label ('( (S ...))', as some treebank files write it) is read as ROOT."""
    tokens = _TOKEN.findall(text)
    if not tokens:
        raise ValueError("empty parse")
    pos = 0

    def node() -> Tree:
        nonlocal pos
        if tokens[pos] != "(":
            raise ValueError(f"expected '(' at token {pos} of {text[:60]!r}, found {tokens[pos]!r}")
        pos += 1
        label = "ROOT" if tokens[pos] == "(" else tokens[pos]
        pos += tokens[pos] != "("
        if tokens[pos] not in "()" and tokens[pos + 1] == ")":  # preterminal (TAG word)
            pos += 2
            return Tree(label, word=tokens[pos - 2])
        children = []
        while tokens[pos] != ")":
            children.append(node())
        pos += 1
        return Tree(label, tuple(children))

    try:
        tree = node()
    except IndexError:
        raise ValueError(f"unbalanced brackets in {text[:60]!r}") from None
    if pos != len(tokens):
        raise ValueError(f"text after the tree in {text[:60]!r}")
    return tree


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def verb_phrases(tree: Tree) -> list[str]:
    """Every VP node's text, outer before inner, without duplicates."""
    return _unique([n.text() for n in tree.walk() if n.label.split("-")[0] == "VP"])


def noun_phrases(tree: Tree) -> list[str]:
    """Every NP node's text, outer before inner, without duplicates."""
    return _unique([n.text() for n in tree.walk() if n.label.split("-")[0] == "NP"])


def _base(label: str) -> str:
    return label.split("-")[0].split("=")[0]


def _conjuncts(np: Tree) -> list[Tree | list[Tree]]:
    """The subjects an NP stands for: its conjuncts (NP children, or runs of words between
    coordinators), else its head NP (first child, when that is an NP), else itself."""
    kids = list(np.children)
    if any(_base(k.label) in _COORDINATORS for k in kids):
        groups: list[list[Tree]] = []
        run: list[Tree] = []
        for k in kids + [Tree("CC", word="")]:
            if _base(k.label) in _COORDINATORS:
                if run:
                    groups.append(run)
                run = []
            else:
                run.append(k)
        out: list[Tree | list[Tree]] = []
        for g in groups:
            out += _conjuncts(g[0]) if len(g) == 1 and _base(g[0].label) == "NP" else [g]
        return out
    if kids and _base(kids[0].label) == "NP":
        return _conjuncts(kids[0])
    return [np]


def subject_noun_phrases(tree: Tree) -> list[str]:
    """The subjects of the NP-VP rule (module docstring), in order, without duplicates."""
    found = []
    for node in tree.walk():
        labels = [_base(c.label) for c in node.children]
        if "VP" not in labels:
            continue
        for child in node.children[: labels.index("VP")]:
            if _base(child.label) == "NP":
                for c in _conjuncts(child):
                    found.append(join_words([w for t in c for w in t.leaves()]) if isinstance(c, list) else c.text())
    return _unique(found)


def np_vp_sentences(tree: Tree) -> list[str]:
    """Each subject NP joined with each VP ("man" + "start dancing"); the VPs alone when the
    parse has no subject."""
    vps = verb_phrases(tree)
    subjects = subject_noun_phrases(tree)
    if not subjects:
        return vps
    return _unique([f"{s} {v}" for s in subjects for v in vps])


def elements(text: str, parse: str | None, phi: str) -> list[str]:
    """The strings Phi compares for one query; element 0 is the sentence (Eq. 7)."""
    if phi == "sent":
        return [text]
    if parse is None:
        raise ValueError(f"Phi_{phi} needs a parse of {text[:40]!r}")
    tree = read_tree(parse)
    parts = verb_phrases(tree) if phi == "vp" else np_vp_sentences(tree)
    return [text] + [p for p in _unique(parts) if p != text]
