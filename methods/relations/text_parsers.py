"""Constituency parsers for the query text: where the Penn-Treebank parses that Phi_vp and
Phi_np-vp read come from (methods/relations/phrases.py).

- `gold`: the dataset's own parses (`Split.parses`; the simulated worlds ship one per query).
- `benepar`: the Berkeley Neural Parser (the kind of parser the SBERT paper used, Kitaev and
  Klein), when the package and its English model `benepar_en3` are installed; the model is
  never downloaded here.
- `rules`: our fallback, a rule-based shallow parser with no model: closed-class word lists,
  a lexicon of common action verbs with their inflections, and word order (a verb follows
  its subject, an auxiliary, "to", a coordinator, or another verb as an -ing complement). It
  writes PTB brackets whose VP spans run from each verb to the end of its clause, nested
  right-branching and split at coordinated VPs, which is how a treebank parser brackets the
  short action sentences of video queries. Why this and not a spaCy pipeline: spaCy's
  English models are published by Explosion outside PyPI; the PyPI packages that carry
  them are re-uploads by third parties (code that runs on install, from an unverified
  publisher), and a dependency parse would still need a conversion to VPs. The rules need
  nothing, run anywhere, and their VP precision / recall against gold parses is measured
  (`prvr-bench census --dataset sim-tvr` -> results/census/vp-extraction.md).
- `auto`: gold when the split has parses, else benepar when installed, else rules, and then
  it is loud: a warning line in the log and the parser's name (with why) in the record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal, get_args

from prvr.harness.base import progress
from prvr.harness.base.io import UserError
from prvr.methods.relations.phrases import Tree

ParserName = Literal["auto", "gold", "benepar", "rules"]  # where the parses come from
PARSERS: tuple[ParserName, ...] = get_args(ParserName)
BENEPAR_MODEL = "benepar_en3"
RULES_VERSION = 1  # bump when the rules change what they bracket (part of the detection's cache key)


@dataclass(frozen=True)
class ParserChoice:
    """Which parser a detection used, and why (stored in the record)."""

    name: str  # gold | benepar | rules | none (Phi_sent reads no parse)
    version: str
    fallback: str = ""  # non-empty when auto fell back: what was missing


def warn(message: str) -> None:
    """A warning line in the log (the project's one way to warn; tests replace it)."""
    progress.warn(f"{message}")


# ----------------------------------------------------------------------------- benepar
def benepar_status() -> tuple[bool, str]:
    """(usable, why not): the package imports and its English model is installed."""
    try:
        import benepar  # noqa: F401
    except ImportError:
        return False, "the benepar package is not installed"
    try:
        _benepar_parser()
    except Exception as e:  # a missing model raises LookupError; anything else is as fatal here
        return False, f"its model {BENEPAR_MODEL} is not installed ({type(e).__name__})"
    return True, ""


_BENEPAR = None


def _benepar_parser():
    global _BENEPAR
    if _BENEPAR is None:
        import benepar

        _BENEPAR = benepar.Parser(BENEPAR_MODEL)
    return _BENEPAR


def benepar_parse(texts: list[str]) -> list[str]:
    """One-line PTB brackets per text, from benepar on our own tokenization (no tokenizer model)."""
    import benepar

    parser = _benepar_parser()
    sentences = [benepar.InputSentence(words=tokenize(t)) for t in texts]
    return [" ".join(str(tree).split()) for tree in parser.parse_sents(sentences)]


def benepar_version() -> str:
    from importlib.metadata import version

    return f"benepar-{version('benepar')}-{BENEPAR_MODEL}"


# ----------------------------------------------------------------------------- choosing
def choose_parser(requested: str, gold: list[str] | None, where: str = "relations.sbert.parser",
                  say: Callable[[str], None] | None = None) -> tuple[ParserChoice, Callable[[list[str]], list[str]]]:
    """The parser to use and a function texts -> PTB strings. `gold`: the split's parses, if
    any. An explicit choice that cannot be had is a one-line error; `auto` falling back to
    the rules says so through `say` (default: `warn`)."""
    say = say or warn
    if requested == "gold" or (requested == "auto" and gold is not None):
        if gold is None:
            raise UserError(f"{where}=gold needs the dataset's own parses, and this dataset has none "
                            "(real text); use auto, benepar or rules")
        return ParserChoice("gold", "dataset"), lambda texts: list(gold)
    if requested in ("benepar", "auto"):
        ok, why = benepar_status()
        if ok:
            return ParserChoice("benepar", benepar_version()), benepar_parse
        if requested == "benepar":
            raise UserError(f"{where}=benepar cannot be used: {why}; install it with its model "
                            f"(pip install benepar, then benepar.download('{BENEPAR_MODEL}')) or use rules")
        message = (f"no gold parses and benepar unavailable ({why}): the detector parses the query text with "
                   f"the rule-based fallback parser 'rules' (its VP quality: results/census/vp-extraction.md)")
        say(message)
        return ParserChoice("rules", f"rules-{RULES_VERSION}", fallback=f"benepar unavailable: {why}"), rules_parse
    if requested == "rules":
        return ParserChoice("rules", f"rules-{RULES_VERSION}"), rules_parse
    raise UserError(f"{where} must be one of {', '.join(PARSERS)}, got {requested!r}")


# ----------------------------------------------------------------------------- the rules
_TOKENS = re.compile(r"n't|'s|'re|'ve|'ll|'d|'m|\w+(?:[-.]\w+)*|[^\w\s]")
_WORDS = {
    "DT": "a an the this that these those his her their its my your our some another each every both all any no "
          "several many few other such what whose",
    "PRP": "he she they it him them we you i me us someone somebody something anyone anything everyone everybody "
           "everything nobody nothing himself herself themselves itself yourself who whom which one",
    "IN": "in on at from with into onto through over under behind toward towards across around of for by about "
          "against along near past inside outside between beside besides beneath below above up down off out "
          "during like upon within without among throughout via than before after",
    "CC": "and or but nor",
    "THEN": "then",
    "SUB": "while as when whilst until because once whereas if where",
    "AUX": "is are was were be been being am 're has have had does do did",
    "MD": "can could will would shall should may might must",
    "NEG": "not n't never",
    "RB": "again back away also still just now there here together very too later soon first finally twice even "
          "almost forward forwards backward backwards aside apart ahead home upstairs downstairs briefly meanwhile "
          "next",
    "CD": "two three four five six seven eight nine ten",
    "TO": "to",
}
_CLASS = {w: c for c, words in _WORDS.items() for w in words.split()}
_NOT_ADVERB = set("only family belly jelly bully fly lily rally ally reply supply apply assembly butterfly ugly friendly "
                  "lovely elderly curly early silly lonely daily chilly hilly oily jolly holy emily billy kelly molly "
                  "holly sally polly italy".split())  # ends in -ly, yet a noun or an adjective
_NOT_VERB_ING = set("something nothing anything everything thing things morning evening building ceiling clothing "
                    "king ring string spring wedding ending painting drawing meeting sibling darling pudding stocking "
                    "railing icing during".split())
# Common action verbs of video captions, as a generic list (not the simulated world's vocabulary:
# its verbs are found by their inflection after a subject, like any verb outside this list).
VERBS = set("""
add adjust answer appear approach argue arrive ask attach bake balance bang bark bathe beat become begin bend bite
blow board bounce bow break breathe bring brush build burn buy call carry catch change chase chat check cheer chew
chop clap clean clear climb close comb come continue cook cover crawl cross cry cut dance demonstrate describe dig
dive drag draw dress drink drive drop dry eat embrace empty enter examine exit explain fall feed feel fight fill
find finish fix flip float fly fold follow gather get give glance go grab greet grin hand hang hear help hide hit
hold hop hug hurry iron jog jump kick kiss kneel knock laugh lay lead lean leave lie lift light listen load lock
look lose make mix move nod open pack paddle paint pan pass pat pause peel perform pet pick place plant play point
pose pour prepare press pretend pull punch push put raise reach read remove repeat rest return ride rinse rip rise
roll rub run say scrub see seem sew shake shave shoot shout show shut sing sip sit skate ski skip slam slap sleep
slide smile smoke sneeze speak spin splash spray spread squat squeeze stand stare start step stir stop stretch
stroll struggle surf sweep swim swing take talk tap teach tear tell throw tie toss touch try turn twist type undress
unlock use vacuum wait wake walk want wash watch wave wear whisper wipe work wrap write yell zoom begin keep grab
grip hold kick knit lift mop paint pull rake row serve sail
""".split())
_IRREGULAR = set("""
took taken ran went gone came sat stood got gotten gave given held threw thrown put made done said saw seen ate
eaten drank drunk wrote written rode ridden fell fallen felt left kept began begun brought bought caught told
thought found lay lain hung hid hidden broke broken spoke spoken shook shaken swam swum wore worn drove driven flew
flown grew grown knew known rose risen shot slid spun stuck struck swung tore torn woke woken won led lit met paid
sent spent stole sang sung sank sunk dug fed
""".split())
_NOMINAL = ("DT", "PRP", "CD", "POS", "X")


def tokenize(text: str) -> list[str]:
    """Words and punctuation, PTB style: "doesn't" -> "does", "n't"; "man's" -> "man", "'s"."""
    text = re.sub(r"(\w)n't\b", r"\1 n't", text)
    return _TOKENS.findall(text)


def _lemmas(word: str) -> list[str]:
    """Base forms a word may inflect (opens -> open, closed -> close, running -> run, tries -> try)."""
    w, out = word, [word]
    if w.endswith("ies") or w.endswith("ied"):
        out.append(w[:-3] + "y")
    if w.endswith("es"):
        out.append(w[:-2])
    if w.endswith("s") and not w.endswith("ss"):
        out.append(w[:-1])
    for suffix in ("ed", "ing"):
        if w.endswith(suffix):
            stem = w[: -len(suffix)]
            out += [stem, stem + "e"] + ([stem[:-1]] if len(stem) > 2 and stem[-1] == stem[-2] else [])
    return out


def _verb_form(word: str) -> bool:
    """A known verb in any inflection."""
    return word in _IRREGULAR or any(lemma in VERBS for lemma in _lemmas(word))


def _classes(words: list[str]) -> list[str]:
    """Coarse word classes; 'X' = an open-class word (noun, verb or adjective)."""
    out, low = [], [x.lower() for x in words]
    for k, w in enumerate(low):
        if w in (".", "!", "?", ";"):
            out.append("END")
        elif w in (",", ":"):
            out.append(",")
        elif re.fullmatch(r"[^\w]+", w):
            out.append("SYM")
        elif w == "'s":
            out.append("POS")
        elif w == "that" and k + 1 < len(low) and _CLASS.get(low[k + 1]) in ("PRP", "DT"):
            out.append("SUB")  # "tells Wilson that he ...", "sees that the door ..."
        elif w in _CLASS:
            out.append(_CLASS[w])
        elif w.endswith("ly") and w not in _NOT_ADVERB and len(w) > 4:
            out.append("RB")
        elif w.isdigit():
            out.append("CD")
        else:
            out.append("X")
    return out


@dataclass
class _Sentence:
    words: list[str]
    cls: list[str]
    kind: dict[int, str]  # starter index -> main | clause | coord | complement


def _previous(cls: list[str], k: int) -> int:
    """Index of the token before k, adverbs and negations skipped (-1 at the start)."""
    k -= 1
    while k >= 0 and cls[k] in ("RB", "NEG"):
        k -= 1
    return k


def _find_verbs(words: list[str], cls: list[str]) -> dict[int, str]:
    """Which tokens start a VP (verbs, auxiliaries, infinitive 'to'), and how they attach
    (`_attachment`). Refines `cls` in place where the reading settles a word: 'then' before
    the clause's verb is an adverb, "'s" before an -ing word (or after a pronoun) an auxiliary."""
    low = [w.lower() for w in words]
    kind: dict[int, str] = {}
    reset, subject_seen, has_verb = "start", False, False
    for k, c in enumerate(cls):
        p = _previous(cls, k)
        pc = cls[p] if p >= 0 else "START"
        after_verb = p in kind
        if c in ("END",):
            reset, subject_seen, has_verb = "start", False, False
            continue
        if c == "THEN" and not has_verb:
            cls[k] = "RB"  # "Linda then jots": an adverb before the clause's first verb
            continue
        if c in ("CC", "THEN", ",", "SUB"):
            reset, subject_seen = ("sub" if c == "SUB" else "coord"), False
            continue
        if c == "POS" and (pc == "PRP" or (k + 1 < len(low) and low[k + 1].endswith("ing"))):
            c = cls[k] = "AUX"  # "he's walking"
        verb = False
        if c in ("AUX", "MD"):
            verb = True
        elif c == "TO":
            verb = k + 1 < len(low) and ((cls[k + 1] == "X" and low[k + 1] in VERBS)
                                         or low[k + 1] in ("be", "have", "do"))  # "to open", "to be seen"
        elif c == "X":
            proper = words[k][:1].isupper() and k > 0 and cls[k - 1] != "END"  # "Next, Chase turns": a name
            verb = not proper and _x_is_verb(words, cls, k, pc, after_verb, reset, subject_seen)
        if verb:
            kind[k] = _attachment(pc, after_verb, reset, subject_seen, has_verb)
            has_verb, reset, subject_seen = True, "", False
        elif c in _NOMINAL:
            subject_seen = True
    return kind


def _x_is_verb(words: list[str], cls: list[str], k: int, pc: str, after_verb: bool, reset: str,
               subject_seen: bool) -> bool:
    """Whether the open-class word k is a verb, from what precedes it: pc = the class of the
    previous token (adverbs skipped), reset = what opened the current stretch (start | coord |
    sub | "" once it has a verb), subject_seen = a nominal word since then."""
    w = words[k].lower()
    ing = w.endswith("ing") and w not in _NOT_VERB_ING and len(w) > 4
    if pc == "MD":
        return True  # "can open"
    if pc == "AUX":
        return ing or w.endswith("ed") or _verb_form(w)  # "is seen", "has opened"; not "have dinner", "is happy"
    if pc == "TO":
        return after_verb  # "to open" when 'to' was read as the infinitive marker
    if after_verb:
        return ing  # "starts dancing"; anything else after a verb is its object
    if pc in ("DT", "POS"):
        return False  # "the opening", "his hands"
    if reset in ("coord", "sub") and not subject_seen:
        return ing or _verb_form(w)  # right after a coordinator: "and picks up", "while holding"
    if reset == "start" and not subject_seen:
        # a fragment without subject ("zooms in on the car"); "Hands are shown" has one
        return ing or (_verb_form(w) and w not in VERBS and _next_fits(cls, k, words) and cls[k + 1:k + 2] != ["POS"])
    if reset and subject_seen and pc in ("X", "PRP", "CD"):
        # after a subject: "Sheldon sits", "two men walk"; unknown words count when inflected like a verb
        return _verb_form(w) or (re.search(r"[^s]s$|ed$", w) is not None and _next_fits(cls, k, words))
    return ing and pc == "X"  # "a man walking"


def _next_fits(cls: list[str], k: int, words: list[str]) -> bool:
    """What follows an unknown word that may be a verb: an object (a name too), a phrase or the end."""
    if k + 1 < len(cls) and cls[k + 1] == "X":
        return words[k + 1][:1].isupper()  # "Rachel invites Phoebe"
    return k + 1 >= len(cls) or cls[k + 1] in ("DT", "PRP", "IN", "TO", "RB", "END", ",", "CC", "POS", "CD")


def _attachment(pc: str, after_verb: bool, reset: str, subject_seen: bool, has_verb: bool) -> str:
    """complement: inside the previous verb's VP (after a verb, an auxiliary or 'to'); coord: a
    VP coordinated with the clause's ("sits and picks up"); clause: a new clause with its own
    subject ("..., and Penny laughs"); main: the clause's first verb, or a subordinate one
    ("while holding"), which nests in the VP before it."""
    if after_verb or pc in ("AUX", "MD", "TO"):
        return "complement"
    if reset == "coord" and not subject_seen and has_verb:
        return "coord"
    if reset == "coord" and subject_seen and has_verb:
        return "clause"
    return "main"


def rules_parse(texts: list[str]) -> list[str]:
    """PTB brackets of each text by the rules (module docstring)."""
    return [_render(_sentence_tree(t)) for t in texts]


def _sentence_tree(text: str) -> Tree:
    words = tokenize(text)
    cls = _classes(words)
    kind = _find_verbs(words, cls)
    s = _Sentence(words, cls, kind)
    clauses, between = _clauses(s)
    parts: list[Tree] = []
    for n, (a, b) in enumerate(clauses):
        parts.append(_clause(s, a, b))
        if n < len(between):
            parts += [_leaf(s, k) for k in between[n]]
    end = [_leaf(s, k) for k in range(clauses[-1][1], len(words))]
    if len(parts) == 1 and parts[0].label == "S":  # one clause: its end punctuation inside it, as PTB writes it
        return Tree("ROOT", (Tree("S", parts[0].children + tuple(end)),))
    return Tree("ROOT", (Tree("S", tuple(parts + end)),))


def _clauses(s: _Sentence) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """Clause spans, cut at sentence ends and at coordinators before a new subject ('clause'
    starters); the tokens between consecutive clauses. Trailing end punctuation stays out."""
    n = len(s.words)
    while n and s.cls[n - 1] == "END":
        n -= 1
    cuts = []  # (first token of the cut, first token of the next clause)
    for k, c in enumerate(s.cls[:n]):
        if c == "END":
            cuts.append((k, k + 1))
    for k, kd in s.kind.items():
        if kd == "clause":
            j = k
            while j > 0 and s.cls[j - 1] not in ("CC", "THEN", ","):
                j -= 1
            first = j - 1
            while first > 0 and s.cls[first - 1] in ("CC", "THEN", ","):
                first -= 1
            cuts.append((max(first, 0), j))
    spans, between, start = [], [], 0
    for cut, nxt in sorted(set(cuts)):
        if cut > start:
            spans.append((start, cut))
            between.append(list(range(cut, nxt)))
        start = nxt
    spans.append((start, n))
    return spans, between[: len(spans) - 1]


def _clause(s: _Sentence, a: int, b: int) -> Tree:
    """(S openers subject adverbs VP) or, without a verb, the chunks of the fragment."""
    starters = [k for k in s.kind if a <= k < b and s.kind[k] in ("main", "clause")]
    starters = starters or [k for k in s.kind if a <= k < b]  # no finite verb found: the first VP there is
    if not starters:
        chunks = _chunks(s, a, b)
        return chunks[0] if len(chunks) == 1 else Tree("FRAG", tuple(chunks))
    v = min(starters)
    subj_start = a
    for k in range(a, v):
        if s.cls[k] == ",":
            subj_start = k + 1  # "Then, Sheldon ..." / "After that, a man ..."
    while subj_start < v and s.cls[subj_start] not in _NOMINAL:
        subj_start += 1
    subj_end = v
    while subj_end > subj_start and s.cls[subj_end - 1] in ("RB", "NEG", "THEN"):
        subj_end -= 1
    children = _chunks(s, a, subj_start)
    if subj_end > subj_start:
        chunks = _chunks(s, subj_start, subj_end)
        children.append(chunks[0] if len(chunks) == 1 and chunks[0].label == "NP" else Tree("NP", tuple(chunks)))
    children += _chunks(s, subj_end, v)
    children.append(_coordinated(s, v, b))
    return Tree("S", tuple(children))


def _coordinated(s: _Sentence, v: int, b: int) -> Tree:
    """The VP part [v, b): VPs cut at coordinators before 'coord' starters, under one VP."""
    cuts = []
    for k in sorted(s.kind):
        if v < k < b and s.kind[k] == "coord":
            j = k
            while j > v and s.cls[j - 1] in ("CC", "THEN", ",", "RB"):
                j -= 1
            cuts.append((j, k))
    if not cuts:
        return _vp(s, v, b)
    children, start = [], v
    for j, k in cuts:
        children.append(_vp(s, start, j))
        children += [_leaf(s, t) for t in range(j, k)]
        start = k
    children.append(_vp(s, start, b))
    return Tree("VP", tuple(children))


def _vp(s: _Sentence, v: int, b: int) -> Tree:
    """VP of the starter at v up to b; the next complement starter heads a nested VP."""
    inner = [k for k in s.kind if v < k < b]  # a coordination inside a nested VP nests too
    nxt = min(inner) if inner else b
    children = [_leaf(s, v)] + _chunks(s, v + 1, nxt)
    if inner:
        children.append(_vp(s, nxt, b))
    return Tree("VP", tuple(children))


def _chunks(s: _Sentence, a: int, b: int) -> list[Tree]:
    """Non-verb tokens as phrases: preposition + noun run -> PP, noun runs -> NP, adverbs -> ADVP."""
    out, k = [], a
    while k < b:
        c = s.cls[k]
        if k in s.kind:  # a starter no VP took (a stray coordination): a word of its own, never a loop
            out.append(_leaf(s, k))
            k += 1
        elif c in ("IN", "TO", "SUB"):
            j = _nominal_end(s, k + 1, b)
            out.append(Tree("PP", (_leaf(s, k), Tree("NP", tuple(_leaf(s, t) for t in range(k + 1, j)))))
                       if j > k + 1 else _leaf(s, k))
            k = max(j, k + 1)
        elif c in _NOMINAL:
            j = _nominal_end(s, k, b)
            out.append(Tree("NP", tuple(_leaf(s, t) for t in range(k, j))))
            k = j
        elif c in ("RB", "NEG", "THEN"):
            out.append(Tree("ADVP", (_leaf(s, k),)))
            k += 1
        else:
            out.append(_leaf(s, k))
            k += 1
    return out


def _nominal_end(s: _Sentence, a: int, b: int) -> int:
    k = a
    while k < b and s.cls[k] in _NOMINAL and k not in s.kind:
        k += 1
    return k


_TAGS = {"DT": "DT", "PRP": "PRP", "IN": "IN", "TO": "TO", "CC": "CC", "THEN": "RB", "SUB": "IN", "MD": "MD",
         "RB": "RB", "NEG": "RB", "POS": "POS", "CD": "CD", "END": ".", ",": ",", "SYM": ":"}


def _leaf(s: _Sentence, k: int) -> Tree:
    w, c = s.words[k], s.cls[k]
    if c == "AUX":
        tag = "VB" + {"is": "Z", "has": "Z", "does": "Z", "'s": "Z", "was": "D", "were": "D", "had": "D",
                      "did": "D", "been": "N", "being": "G", "be": ""}.get(w.lower(), "P")
    elif c == "X" and k in s.kind:
        lw = w.lower()
        tag = "VBG" if lw.endswith("ing") else "VBD" if lw.endswith("ed") else "VBZ" if lw.endswith("s") else "VB"
    elif c == "X":
        tag = "NNP" if w[:1].isupper() and k > 0 else "NNS" if w.lower().endswith("s") else "NN"
    else:
        tag = _TAGS.get(c, "NN")
    return Tree(tag, word=w)


def _render(t: Tree) -> str:
    if t.word is not None:
        word = {"(": "-LRB-", ")": "-RRB-"}.get(t.word, t.word)
        return f"({t.label} {word})"
    return f"({t.label} {' '.join(_render(c) for c in t.children)})"
