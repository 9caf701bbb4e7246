"""ARL's label-ambiguity detection (ARL paper Eq. 4-7 and "Cross-Model Ambiguity Detection").

Every epoch, with the online model (eval mode), each branch computes the dataset-wide
uncertainty of every training query and every training frame (Eq. 4) and the thresholds
tau_s (mean similarity of the labelled pairs) and tau_u (mean uncertainty). In each batch a
pair is ambiguous when its similarity and its pairwise uncertainty (Eq. 5) both exceed the
thresholds (Eq. 6-7), at text-video level and at text-frame level. With cross-model
detection each branch trains with the sets the other branch detected.

Eq. 4 averages a [queries x videos x frames] map of cosines (about 2 x 10^11 entries at TVR
scale). It is never built: the mean of cosines against a set is the dot product with the
mean of the unit vectors, so U^q = q_hat . mean(v_hat) and U^v = v_hat . mean(q_hat), which
is a streaming pass over the frames, a few matrix-vector products (`UncertaintyPass`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F

from prvr.datasets.types import PRVRData
from prvr.harness.base import masks
from prvr.harness.base.batches import TrainBatch
from prvr.harness.base.checks import at_least, one_of, param
from prvr.harness.base.contract import StepOutputs, as_backbone
from prvr.harness.base.encoding import QUERY_BATCH, encode_batches
from prvr.harness.base.io import UserError, write_json
from prvr.harness.base.registry import DETECTORS
from prvr.methods.backbones.api import OUTPUTS
from prvr.methods.backbones.arl import frame_similarity
from prvr.methods.backbones.blocks import max_similarity
from prvr.methods.relations.arl_figure import plot_distributions, summarise
from prvr.methods.relations.base import Detector, DetectorState, Relations

EPS = 1e-12


@dataclass(frozen=True)
class Variant:
    """Which ARL components are on (paper Table 5)."""

    text_video: bool  # T-V: detect ambiguous text-video pairs and train with them
    text_frame: bool  # T-F: text-frame detection and L^frame
    cross_model: bool  # C.L: each branch trains with the other branch's sets


VariantName = Literal["base", "tv_only", "tv_tf", "tv_cross", "full"]  # loss.variant: Table 5 rows (a)-(e)
VARIANTS: dict[VariantName, Variant] = {
    "base": Variant(False, False, False),
    "tv_only": Variant(True, False, False),
    "tv_tf": Variant(True, True, False),
    "tv_cross": Variant(True, False, True),
    "full": Variant(True, True, True),
}
Similarity = Literal["eval", "train"]  # relations.arl.similarity
FrameThresholds = Literal["frame", "video"]  # relations.arl.frame_thresholds
DEFAULT_WARMUP = 3  # epochs; used when the detector feeds a recipe whose loss section has no warmup_epochs


@dataclass
class ArlDetectorConfig:
    """Section `relations.arl`: knobs of the detector's per-epoch pass (not of the method)."""

    video_chunk: int = param(64, at_least(1))  # videos encoded at once in the per-epoch uncertainty pass
    # Which batch similarities are compared with tau_s. "eval": a no-grad eval-mode pass of the
    # batch, the same kind as the per-epoch pass that sets tau_s (dropout off); "train": the
    # training forward's (dropout on), the earlier reading, which scores positives lower
    # (0.34 vs 0.40 at one checkpoint) and so finds about a fifth of the pairs.
    similarity: Similarity = param("eval", one_of(Similarity))
    # Text-frame thresholds (Eq. 6-7 "with s and u substituted with s^f and u^f"). "frame":
    # tau_s^f = mean cosine of a query with the frames of its labelled video, tau_u^f = mean
    # text-frame uncertainty over all (query, frame) pairs; "video": reuse the text-video tau_s
    # and tau_u (the earlier reading: under 1e-4 of frames pass from epoch 10 on).
    frame_thresholds: FrameThresholds = param("frame", one_of(FrameThresholds))
    probe_queries: int = param(2048, at_least(1))  # Fig. 4: queries sampled for the unpaired-pair distributions
    # Fig. 4: videos sampled (every sampled query against every sampled video)
    probe_videos: int = param(64, at_least(1))


# ----------------------------------------------------------------------------- Eq. 4
class UncertaintyPass:
    """ARL Eq. 4 streamed over chunks of videos, never building M [Nq, Nv, Lv].

    U^q_x = mean over all real frames of cos(q_x, v_yz) = q_hat_x . mean_frames(v_hat)
    U^v_yz = mean over all queries of cos(q_x, v_yz) = v_hat_yz . mean_queries(q_hat)
    Padding frames (mask False) take no part and get U^v = 0.
    """

    def __init__(self, queries: torch.Tensor) -> None:
        self.queries = queries if queries.dtype == torch.float64 else queries.float()  # half precision -> float32
        self.inv_norm = 1.0 / torch.linalg.vector_norm(self.queries, dim=1).clamp_min(EPS)
        self.mean_query = (self.inv_norm @ self.queries) / len(self.queries)
        self.frame_sum = torch.zeros_like(self.mean_query)
        self.frame_count = 0

    def _rows(self, flat: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """U^v of frame rows [n, d] (real [n] bool) and their sum of unit vectors [d]."""
        inv = real / torch.linalg.vector_norm(flat, dim=1).clamp_min(EPS)
        return (flat @ self.mean_query) * inv, inv @ flat

    def add_videos(self, frames: torch.Tensor, frame_mask: torch.Tensor, block_rows: int = 0) -> torch.Tensor:
        """Accumulate videos [c, T, d] (mask [c, T]); return their U^v [c, T]. `block_rows` > 0
        (CPU): split the rows over one worker thread per core, in blocks that stay in the L2
        cache, so the three passes read memory once (`_blocked`)."""
        flat = frames.reshape(-1, frames.shape[-1]).to(self.queries.dtype)
        real = frame_mask.reshape(-1)
        if block_rows > 0 and flat.device.type == "cpu" and torch.get_num_threads() > 1:
            uv, frame_sum = self._blocked(flat, real, block_rows)
        else:
            uv, frame_sum = self._rows(flat, real)
        self.frame_sum += frame_sum
        self.frame_count += int(real.sum())
        return uv.view(frame_mask.shape)

    def _blocked(self, flat: torch.Tensor, real: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        workers = torch.get_num_threads()
        uv = torch.empty(len(flat), dtype=flat.dtype)
        bounds = [len(flat) * i // workers for i in range(workers + 1)]

        def work(lo: int, hi: int) -> torch.Tensor:
            torch.set_num_threads(1)  # this worker's ops run on its own core
            total = torch.zeros_like(self.mean_query)
            for a in range(lo, hi, rows):
                b = min(a + rows, hi)
                uv[a:b], part = self._rows(flat[a:b], real[a:b])
                total += part
            return total

        threads = torch.get_num_threads()
        try:
            with ThreadPoolExecutor(workers) as pool:
                sums = list(pool.map(work, bounds[:-1], bounds[1:]))
        finally:
            torch.set_num_threads(threads)
        return uv, torch.stack(sums).sum(0)

    def query_uncertainty(self) -> torch.Tensor:
        """U^q [Nq], once every video has been added."""
        mean_frame = self.frame_sum / max(1, self.frame_count)
        return (self.queries @ mean_frame) * self.inv_norm


def dataset_uncertainty(queries: torch.Tensor, frames: torch.Tensor, frame_mask: torch.Tensor,
                        block_rows: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """ARL Eq. 4, fast path: (U^q [Nq], U^v [Nv, T]) from queries [Nq, d], frames [Nv, T, d].

    Three memory-bound passes over the frames (norms, two matrix-vector products) with only
    [Nv x T]-sized temporaries. On CPU the rows go in 512-row blocks (768 KB, inside L2),
    one worker thread per core: at TVR scale on 2 shared cores 1.0 s against 1.7 s for
    whole-tensor operations (see docs/methods/arl.md); `block_rows=0` gives the whole-tensor path."""
    p = UncertaintyPass(queries)
    uv = p.add_videos(frames, frame_mask, block_rows)
    return p.query_uncertainty(), uv


def naive_uncertainty(queries: torch.Tensor, frames: torch.Tensor,
                      frame_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ARL Eq. 4 as written: build M [Nq, Nv, T] and average it (reference for small data)."""
    m = torch.einsum("qd,vtd->qvt", F.normalize(queries, dim=-1), F.normalize(frames, dim=-1))
    m = m * frame_mask[None]
    return m.sum((1, 2)) / frame_mask.sum(), m.mean(0)


# ----------------------------------------------------------------------------- Eq. 5-7
def pair_uncertainty(query_u: torch.Tensor, frame_u: torch.Tensor, best_frame: torch.Tensor) -> torch.Tensor:
    """ARL Eq. 5, u(q_i, V_j) = (U^q_i + U^v_{j k^}) / 2; query_u [Q], frame_u [B, T], best_frame [Q, B]."""
    cols = torch.arange(frame_u.shape[0], device=frame_u.device)[None]
    return 0.5 * (query_u[:, None] + frame_u[cols, best_frame])


def frame_pair_uncertainty(query_u: torch.Tensor, frame_u: torch.Tensor) -> torch.Tensor:
    """ARL Eq. 5, u^f(q_i, v_jk) = (U^q_i + U^v_jk) / 2 -> [Q, B, T]."""
    return 0.5 * (query_u[:, None, None] + frame_u[None])


def ambiguous_pairs(similarity: torch.Tensor, uncertainty: torch.Tensor, tau_s: float, tau_u: float) -> torch.Tensor:
    """ARL Eq. 6-7: s > tau_s and u > tau_u. Row i of the result is A_i^q, column j is A_j^v
    (the same mask read both ways); the caller removes the labelled pairs."""
    return (similarity > tau_s) & (uncertainty > tau_u)


def video_mean(frame_u: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """Mean over each video's real frames [Nv, T] -> [Nv] (the text-video averaged uncertainty of Fig. 4)."""
    return (frame_u * frame_mask).sum(1) / frame_mask.sum(1).clamp(min=1)


def thresholds(positive_similarity: torch.Tensor, query_u: torch.Tensor, frame_u: torch.Tensor,
               frame_mask: torch.Tensor) -> tuple[float, float]:
    """Per-epoch thresholds (ARL "Implementation Details"): tau_s = mean similarity of the
    labelled (positive) training pairs; tau_u = mean over all training text-video pairs of the
    text-video averaged uncertainty (U^q_i + mean_k U^v_jk) / 2, which is
    (mean U^q + mean over videos of mean_k U^v) / 2, so no pair needs to be visited."""
    tau_s = positive_similarity.mean()
    tau_u = 0.5 * (query_u.mean() + video_mean(frame_u, frame_mask).mean())
    return float(tau_s), float(tau_u)


def hand_off(detected: dict[str, "ArlRelations"]) -> dict[str, "ArlRelations"]:
    """Cross-model detection: each branch trains with the sets detected by the next one
    (theta with Phi's, Phi with theta's). One branch keeps its own."""
    names = list(detected)
    return {b: detected[names[(k + 1) % len(names)]] for k, b in enumerate(names)}


@dataclass
class ArlRelations(Relations):
    """Relations with ARL's extras. `frame_ambiguous` [Q, B, T]: text-frame ambiguous pairs.
    `branches`: the relations each branch trains with (after the hand-off); `detected`: what
    each branch detected. The top level is the union over branches, for objectives that take
    one set of relations."""

    frame_ambiguous: torch.Tensor | None = None
    branches: dict[str, "ArlRelations"] = field(default_factory=dict)
    detected: dict[str, "ArlRelations"] = field(default_factory=dict)


def branch_relations(relations: Relations, branch: str) -> Relations:
    """The relations a branch trains with: its handed-off sets, else the shared ones."""
    if isinstance(relations, ArlRelations):
        return relations.branches.get(branch, relations)
    return relations


# ----------------------------------------------------------------------------- the per-epoch pass
@dataclass
class BranchStats:
    """One branch's dataset-wide state for an epoch."""

    query_u: torch.Tensor  # U^q [Nq]
    frame_u: torch.Tensor  # U^v [Nv, T]
    frame_mask: torch.Tensor  # [Nv, T]
    positive_similarity: torch.Tensor  # s(q_i, V_labelled(i)) [Nq]
    tau_s: float
    tau_u: float
    tau_s_frame: float  # tau_s^f: mean cosine of a query with its labelled video's real frames
    tau_u_frame: float  # tau_u^f: mean of u^f over all (query, real frame) pairs
    probe_similarity: torch.Tensor | None = None  # [n_probe_queries, n_probe_videos] (Fig. 4)


def branch_views(model: torch.nn.Module) -> list[tuple[str, str, str]]:
    """(branch, query key, frames key) of a backbone that provides `frame_views`: ARL's two
    branches, or the frame branch of a backbone that scores by the best frame (e.g. dual-branch)."""
    views = getattr(model, "frame_views", None)
    if views is None:
        raise UserError(f"the ARL detector needs a backbone that provides frame_views ({OUTPUTS['frame_views']}); "
                        f"'{type(model).__name__}' does not")
    return views()


def positive_similarity(queries: torch.Tensor, frames: torch.Tensor,
                        frame_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Of aligned rows (queries [n, d], their videos' frames [n, T, d]): s(q_i, V_i) (Eq. 3,
    the best frame) and the mean s^f(q_i, v_ik) over the real frames."""
    sims = torch.einsum("nd,ntd->nt", F.normalize(queries, dim=-1), F.normalize(frames, dim=-1))
    best = masks.keep_where(sims, frame_mask, float("-inf")).amax(1)
    mean = (sims * frame_mask).sum(1) / frame_mask.sum(1).clamp(min=1)
    return best, mean


def frame_thresholds(positive_frame_mean: torch.Tensor, query_u: torch.Tensor, frame_u: torch.Tensor,
                     frame_mask: torch.Tensor) -> tuple[float, float]:
    """Text-frame thresholds (Eq. 6-7 with s^f, u^f): tau_s^f = mean over labelled pairs of the
    mean text-frame similarity of the labelled video; tau_u^f = mean over all (query, real
    frame) pairs of u^f = (U^q + U^v_jk) / 2 = (mean U^q + mean over real frames of U^v) / 2."""
    frame_mean = (frame_u * frame_mask).sum() / frame_mask.sum().clamp(min=1)
    return float(positive_frame_mean.mean()), float(0.5 * (query_u.mean() + frame_mean))


@torch.no_grad()
def epoch_statistics(model, batcher, device: torch.device, video_chunk: int = 64,
                     probe: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, BranchStats]:
    """Encode the whole split once per branch with the model in eval mode and return each
    branch's uncertainties and thresholds. `probe` = (query indices, video indices) whose
    similarities are kept for the Fig. 4 distributions."""
    split, views = batcher.split, branch_views(model)
    was_training = model.training
    model.eval()
    pin = device.type == "cuda"
    queries = encode_batches(model.encode_queries, batcher.in_order("queries", QUERY_BATCH, pin), device)
    longest = int(min(split.frames.lengths.max(), batcher.cfg.max_frames))
    passes = {b: UncertaintyPass(queries[qk]) for b, qk, _ in views}
    frame_u = {b: torch.zeros(split.num_videos, longest, device=device) for b, _, _ in views}
    pos_sim = {b: torch.zeros(split.num_queries, device=device) for b, _, _ in views}
    pos_frame = {b: torch.zeros(split.num_queries, device=device) for b, _, _ in views}
    probe_sim = {b: torch.zeros(len(probe[0]), len(probe[1]), device=device) for b, _, _ in views} if probe else {}
    mask_all = torch.zeros(split.num_videos, longest, dtype=torch.bool, device=device)
    for host in batcher.in_order("videos", video_chunk, pin):
        idx = host.video_index.numpy()
        vb = host.to(device)
        out = model.encode_videos(vb)
        mask = vb.frame_mask
        mask_all[idx[0] : idx[-1] + 1, : mask.shape[1]] = mask
        owned = [batcher.video_queries[v] for v in idx]
        qs = torch.as_tensor(np.concatenate(owned), dtype=torch.long, device=device)
        item = torch.as_tensor(np.repeat(np.arange(len(idx)), [len(o) for o in owned]), device=device)
        for b, qk, fk in views:
            frames = out[fk]
            frame_u[b][idx[0] : idx[-1] + 1, : mask.shape[1]] = passes[b].add_videos(frames, mask)
            if len(qs):
                pos_sim[b][qs], pos_frame[b][qs] = positive_similarity(queries[qk][qs], frames[item], mask[item])
            if probe:
                _probe_chunk(probe_sim[b], probe, idx, queries[qk], frames, mask)
    stats = {}
    for b, _, _ in views:
        query_u = passes[b].query_uncertainty()
        tau_s, tau_u = thresholds(pos_sim[b], query_u, frame_u[b], mask_all)
        tau_sf, tau_uf = frame_thresholds(pos_frame[b], query_u, frame_u[b], mask_all)
        stats[b] = BranchStats(query_u, frame_u[b], mask_all, pos_sim[b], tau_s, tau_u, tau_sf, tau_uf,
                               probe_sim.get(b))
    model.train(was_training)
    return stats


def _probe_chunk(out: torch.Tensor, probe: tuple[np.ndarray, np.ndarray], idx: np.ndarray,
                 queries: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor) -> None:
    """Fill the probe similarities of the probe videos that fall in this chunk."""
    cols = np.nonzero(np.isin(probe[1], idx))[0]
    if len(cols) == 0:
        return
    local = torch.as_tensor(probe[1][cols] - idx[0], device=frames.device)
    q = queries[torch.as_tensor(probe[0], device=queries.device)]
    out[:, torch.as_tensor(cols, device=out.device)] = max_similarity(q, frames[local], mask[local])


# ----------------------------------------------------------------------------- the detector
@dataclass(frozen=True)
class ArlPlan:
    """What the ARL method asks of its detector (`MethodSpec.detector_plan`, from the method's
    `loss` section, which the objective reads too, so detector and losses always agree): which
    levels use the ambiguous sets and from which epoch. Another recipe gives no plan: full ARL
    after the default warm-up."""

    variant: Variant = VARIANTS["full"]
    warmup_epochs: int = DEFAULT_WARMUP


@DETECTORS.register("arl", "ARL: ambiguous pairs = high similarity and high dataset-wide uncertainty, handed across two models")
class ArlDetector(Detector):
    """ARL's detector. Inactive during the warm-up epochs and for the `base` variant (one-to-one
    labels); afterwards each batch gets `ArlRelations`. On simulated data every epoch's report
    holds the precision and recall of the detected text-video sets against the truly relevant
    unlabelled pairs, and the set sizes; `write_artifacts` draws Fig. 4."""

    needs = frozenset({"frame_views"})  # the per-epoch pass encodes each branch's queries and frames
    config_cls: ClassVar[type | None] = ArlDetectorConfig  # the contract's type: a narrower one fails RelationDetector
    settings: ArlDetectorConfig

    def setup(self, data: PRVRData, plan: ArlPlan | None = None) -> None:
        plan = plan if isinstance(plan, ArlPlan) else ArlPlan()
        self.variant, self.warmup = plan.variant, plan.warmup_epochs
        self.views: list[tuple[str, str, str]] = []
        self.stats: dict[str, BranchStats] = {}
        self.active = False
        self.figure: dict | None = None
        self._reset()

    def _reset(self) -> None:
        self.counts: dict[str, dict[str, torch.Tensor | int]] = {}  # device tensors, or host ints
        self.pass_seconds = 0.0

    # hooks -----------------------------------------------------------------
    def on_epoch_start(self, state: DetectorState) -> None:
        self._reset()
        self.active = self.variant.text_video and state.epoch >= self.warmup
        self.stats = {}
        self.views = branch_views(state.model)
        self.model = state.model
        if self.active:
            start = time.perf_counter()
            self.stats = epoch_statistics(state.model, state.train, state.device, self.settings.video_chunk)
            self.pass_seconds = time.perf_counter() - start

    def on_epoch_end(self, state: DetectorState, summary: dict) -> None:
        if state.last_epoch:
            self.figure = self._distributions(state)

    # detection -------------------------------------------------------------
    def detect(self, batch: Any, outputs: StepOutputs) -> Relations:
        base = super().detect(batch, outputs)
        if not self.active:
            return base
        pos = base.positive
        mask = batch.videos.frame_mask
        if self.settings.similarity == "eval":
            outputs = self._eval_outputs(batch, outputs)
        detected = {}
        for b, qk, fk in self.views:
            sims = self._frame_sims(outputs, b, (qk, fk))
            detected[b] = self._detect_branch(self.stats[b], sims, mask, batch, pos)
        trained = hand_off(detected) if self.variant.cross_model else detected
        union = _union(pos, list(detected.values()))
        union.branches, union.detected = trained, detected
        self._count(batch, pos, mask, detected, trained, union)
        return union

    @torch.no_grad()
    def _eval_outputs(self, batch: Any, outputs: StepOutputs) -> StepOutputs:
        """The step's outputs with the batch's encodings and scores made again with the model in
        eval mode (dropout off), the kind of similarity the per-epoch pass that sets tau_s computes."""
        model, was_training = self.model, self.model.training
        model.eval()
        try:
            backbone = as_backbone(model)  # the model being trained
            q, v = backbone.encode_queries(batch.queries), backbone.encode_videos(batch.videos)
            return {**outputs, "queries": q, "videos": v, "scores": backbone.score(q, v)}
        finally:
            model.train(was_training)

    @staticmethod
    def _frame_sims(outputs: StepOutputs, branch: str, keys: tuple[str, str]) -> torch.Tensor:
        """The branch's [Q, B, T] text-frame cosines: the backbone's items when it scores them,
        else computed from its frame view."""
        given = outputs["scores"].items.get(branch)
        if given is not None:
            return given.detach()
        return frame_similarity(outputs["queries"][keys[0]].detach(), outputs["videos"][keys[1]].detach())

    def _detect_branch(self, st: BranchStats, sims: torch.Tensor, mask: torch.Tensor, batch: TrainBatch,
                       pos: torch.Tensor) -> ArlRelations:
        """Eq. 5-7 for one branch, text-video and (with T-F) text-frame."""
        t = sims.shape[2]
        query_u = st.query_u[batch.queries.query_index]
        frame_u = st.frame_u[batch.videos.video_index][:, :t]
        masked = masks.keep_where(sims, mask[None], float("-inf"))
        similarity, best = masked.max(-1)  # Eq. 3
        amb = ambiguous_pairs(similarity, pair_uncertainty(query_u, frame_u, best), st.tau_s, st.tau_u) & ~pos
        frame_amb = None
        if self.variant.text_frame:
            tau_s, tau_u = ((st.tau_s_frame, st.tau_u_frame) if self.settings.frame_thresholds == "frame"
                            else (st.tau_s, st.tau_u))
            frame_amb = ambiguous_pairs(sims, frame_pair_uncertainty(query_u, frame_u), tau_s, tau_u) & mask[None]
            qi, vj = masks.true_pairs(pos)
            # a labelled pair's best frame is its positive (the value made on the device: `= False`
            # would copy a host scalar to the GPU, a sync)
            frame_amb.index_put_((qi, vj, best[qi, vj]), frame_amb.new_zeros(()))
        return ArlRelations(pos, amb, pos.float() + amb.float(), frame_amb)

    # reports ----------------------------------------------------------------
    def _count(self, batch: TrainBatch, pos: torch.Tensor, mask: torch.Tensor, detected: dict[str, ArlRelations],
               trained: dict[str, ArlRelations], union: ArlRelations) -> None:
        """Add this batch's set sizes to the epoch's counts (kept on the device: `_read_counts`
        reads them once, at the epoch's end)."""
        truth = batch.relevant & ~pos if batch.relevant is not None else None
        for name, rel in [*detected.items(), ("union", union)]:
            c = self.counts.setdefault(name, {})
            amb = rel.ambiguous
            _add(c, "pairs", amb.sum())
            _add(c, "queries", amb.shape[0])
            _add(c, "videos", amb.shape[1])
            if truth is not None:
                _add(c, "true_positive", (amb & truth).sum())
                _add(c, "relevant", truth.sum())
                _add(c, "unlabelled", (~pos).sum())
            if rel.frame_ambiguous is not None and name != "union":
                qi, vj = masks.true_pairs(pos)
                _add(c, "frame_ambiguous", rel.frame_ambiguous[qi, vj].sum())
                _add(c, "frame_real", mask[vj].sum())
                _add(c, "labelled_pairs", len(qi))

    def _read_counts(self) -> dict[str, dict[str, float]]:
        """The epoch's counts as numbers, every count kept on the device read in one go."""
        on_device = [(name, k, v) for name, c in self.counts.items() for k, v in c.items()
                     if isinstance(v, torch.Tensor)]
        values = torch.stack([v for _, _, v in on_device]).tolist() if on_device else []
        out = {name: {k: float(v) for k, v in c.items() if not isinstance(v, torch.Tensor)}
               for name, c in self.counts.items()}
        for (name, k, _), v in zip(on_device, values):
            out[name][k] = float(v)
        return out

    def epoch_report(self) -> dict:
        if not self.active:
            return {"active": False}
        report: dict = {"active": True, "uncertainty_pass_s": round(self.pass_seconds, 3),
                        "cross_model": self.variant.cross_model}
        for b, st in self.stats.items():
            report[b] = {"tau_s": round(st.tau_s, 5), "tau_u": round(st.tau_u, 5),
                         "tau_s_frame": round(st.tau_s_frame, 5), "tau_u_frame": round(st.tau_u_frame, 5)}
        counts = self._read_counts()
        for name, c in counts.items():
            r = report.setdefault(name, {})
            r["ambiguous_pairs"] = int(c["pairs"])
            r["per_query"] = c["pairs"] / max(1, c["queries"])  # mean |A_i^q| in a batch
            r["per_video"] = c["pairs"] / max(1, c["videos"])  # mean |A_j^v| in a batch
            if "relevant" in c:
                r["precision"] = c["true_positive"] / c["pairs"] if c["pairs"] else None
                r["recall"] = c["true_positive"] / c["relevant"] if c["relevant"] else None
                r["base_rate"] = c["relevant"] / max(1, c["unlabelled"])  # precision of a random guess
            if "frame_real" in c:
                r["frame_share"] = c["frame_ambiguous"] / max(1, c["frame_real"])  # of the labelled video's frames
        if any("relevant" in c for c in counts.values()):
            report["unlabelled_relevant_pairs"] = int(next(iter(counts.values())).get("relevant", 0))
        return report

    # Fig. 4 -------------------------------------------------------------------
    def _distributions(self, state: DetectorState) -> dict:
        """Similarity and text-video averaged uncertainty of labelled and sampled unpaired
        training pairs, after training (paper Fig. 4)."""
        split = state.train.split
        rng = np.random.default_rng([self.cfg.seed, 4])
        pq = np.sort(rng.choice(split.num_queries, min(self.settings.probe_queries, split.num_queries), replace=False))
        pv = np.sort(rng.choice(split.num_videos, min(self.settings.probe_videos, split.num_videos), replace=False))
        stats = epoch_statistics(state.model, state.train, state.device, self.settings.video_chunk,
                                 probe=(pq, pv))
        unpaired = split.query_video[pq][:, None] != pv[None]
        relevant = split.relevance[pq][:, pv].toarray().astype(bool) if split.relevance is not None else None
        out = {}
        for b, st in stats.items():
            vu = video_mean(st.frame_u, st.frame_mask).cpu().numpy()
            qu = st.query_u.cpu().numpy()
            probe_u = 0.5 * (qu[pq][:, None] + vu[pv][None])
            assert st.probe_similarity is not None  # epoch_statistics keeps them for every branch given a probe
            probe_s = st.probe_similarity.cpu().numpy()
            out[b] = {
                "tau_s": st.tau_s, "tau_u": st.tau_u,
                "positive_s": st.positive_similarity.cpu().numpy(),
                "positive_u": 0.5 * (qu + vu[split.query_video]),
                "unpaired_s": probe_s[unpaired], "unpaired_u": probe_u[unpaired],
                "unpaired_relevant": relevant[unpaired] if relevant is not None else None,
            }
        return out

    def write_artifacts(self, folder: str | Path, stem: str) -> list[str]:
        if not self.figure:
            return []

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        png, summary = f"{stem}.fig4.png", f"{stem}.fig4.json"
        plot_distributions(self.figure, folder / png)

        write_json(folder / summary, summarise(self.figure))
        return [png, summary]


def _union(pos: torch.Tensor, rels: list[ArlRelations]) -> ArlRelations:
    votes = torch.stack([r.ambiguous.float() for r in rels]).mean(0)
    amb = votes > 0
    frames = [r.frame_ambiguous for r in rels if r.frame_ambiguous is not None]
    frame_amb = torch.stack(frames).any(0) if frames else None
    return ArlRelations(pos, amb, pos.float() + votes * amb, frame_amb)


def _add(c: dict[str, torch.Tensor | int], key: str, value: torch.Tensor | int) -> None:
    """c[key] += value, a count (a device tensor stays on the device: no host sync per step)."""
    c[key] = c[key] + value if key in c else value
