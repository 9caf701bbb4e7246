"""ARL's detector: Eq. 6-7 at text-video and text-frame level, the cross-model hand-off,
detection precision / recall, and the per-epoch pass against a naive computation."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prvr.datasets.loader import Batcher
from prvr.harness.engine.config import resolve
from prvr.harness.base.encoding import encode_all
from prvr.harness.base.registry import BACKBONES, DATASETS
from prvr.methods.backbones.api import Scores
from prvr.methods.arl import arl_plan
from prvr.methods.relations.arl import (ArlDetector, ArlRelations, BranchStats, epoch_statistics, hand_off,
                                        naive_uncertainty)
from prvr.methods.relations.base import DetectorState

# Two queries, two videos of two frames; q0 is labelled with v0, q1 with v1.
FRAMES = {
    "theta": torch.tensor([[[0.9, 0.55], [0.6, 0.2]],
                           [[0.3, 0.7], [0.8, 0.4]]]),
    "phi": torch.tensor([[[0.9, 0.1], [0.2, 0.1]],
                         [[0.3, 0.9], [0.8, 0.4]]]),
}
FRAME_U = {"theta": torch.tensor([[0.2, 0.4], [0.4, 0.0]]), "phi": torch.tensor([[0.2, 0.8], [0.4, 0.0]])}
QUERY_U = torch.tensor([0.5, 0.1])


def _batch(relevant):
    mask = torch.ones(2, 2, dtype=torch.bool)
    return SimpleNamespace(queries=SimpleNamespace(query_index=torch.tensor([0, 1])),
                           videos=SimpleNamespace(video_index=torch.tensor([0, 1]), frame_mask=mask,
                                                  frames=torch.zeros(2, 2, 1)),
                           query_item=torch.tensor([0, 1]), relevant=relevant)


def _detector(variant="full", frame_thresholds="video", tau_frame=(0.5, 0.3)):
    """A detector on the hand-made batch, comparing the given (training) similarities."""
    cfg = resolve("arl", "sim-tiny", 0, [f"loss.variant={variant}", "relations.arl.similarity=train",
                                         f"relations.arl.frame_thresholds={frame_thresholds}"])
    det = ArlDetector(cfg)
    det.setup(None, arl_plan(cfg.loss))
    det.active = True
    det.views = [(b, f"query.{b}", f"frames.{b}") for b in ("theta", "phi")]
    det.stats = {b: BranchStats(QUERY_U, FRAME_U[b], torch.ones(2, 2, dtype=torch.bool), torch.zeros(2),
                                tau_s=0.5, tau_u=0.3, tau_s_frame=tau_frame[0], tau_u_frame=tau_frame[1])
                 for b in ("theta", "phi")}
    return det


def _outputs():
    return {"queries": {}, "videos": {}, "scores": Scores(torch.zeros(2, 2), items=dict(FRAMES))}


def test_eq6_7_text_video_and_text_frame_detection_hand_computed():
    rel = _detector().detect(_batch(None), _outputs())
    # theta: (q0, v1): s = 0.6 > 0.5 and u = (0.5 + U^v[v1, k^=0] = 0.4) / 2 = 0.45 > 0.3 -> ambiguous;
    #        (q1, v0): s = 0.7 > 0.5 but u = (0.1 + 0.4) / 2 = 0.25 < 0.3 -> not.
    assert rel.detected["theta"].ambiguous.tolist() == [[False, True], [False, False]]
    # phi: (q0, v1): s = 0.2 < 0.5; (q1, v0): s = 0.9 at frame 1, u = (0.1 + 0.8) / 2 = 0.45 -> ambiguous
    assert rel.detected["phi"].ambiguous.tolist() == [[False, False], [True, False]]
    # text-frame (theta): s^f > 0.5 and u^f > 0.3; labelled pairs' best frames are positives, not ambiguous
    fa = rel.detected["theta"].frame_ambiguous
    assert fa.nonzero().tolist() == [[0, 0, 1], [0, 1, 0]]  # frame 1 of q0's own video; frame 0 of v1
    assert rel.detected["phi"].frame_ambiguous.nonzero().tolist() == [[1, 0, 1]]
    # the top level is the union, with confidence = share of the branches that detected a pair
    assert rel.ambiguous.tolist() == [[False, True], [True, False]]
    assert rel.confidence.tolist() == [[1.0, 0.5], [0.5, 1.0]]


def test_frame_level_thresholds_come_from_the_frame_distributions():
    """Default reading: text-frame pairs compare with tau_s^f / tau_u^f, text-video pairs keep tau_s / tau_u."""
    rel = _detector(frame_thresholds="frame", tau_frame=(0.35, 0.3)).detect(_batch(None), _outputs())
    assert rel.detected["theta"].ambiguous.tolist() == [[False, True], [False, False]]  # unchanged
    # theta frames with s^f > 0.35 and u^f > 0.3: q0 x (v0 f1: 0.55, u 0.45), (v1 f0: 0.6, u 0.45);
    # q1 x v0 f1 (0.7, u (0.1 + 0.4) / 2 = 0.25) fails on u; q0's best frame (v0 f0) is its positive.
    assert rel.detected["theta"].frame_ambiguous.nonzero().tolist() == [[0, 0, 1], [0, 1, 0]]
    low = _detector(frame_thresholds="frame", tau_frame=(0.15, 0.15)).detect(_batch(None), _outputs())
    # u^f > 0.15 now admits (q1, v0 f1) (u 0.25); s^f > 0.15 admits q0's v1 f1 (0.2, u (0.5 + 0) / 2 = 0.25)
    assert low.detected["theta"].frame_ambiguous.nonzero().tolist() == [[0, 0, 1], [0, 1, 0], [0, 1, 1],
                                                                        [1, 0, 1]]
    video = _detector(frame_thresholds="video", tau_frame=(0.15, 0.15)).detect(_batch(None), _outputs())
    assert video.detected["theta"].frame_ambiguous.nonzero().tolist() == [[0, 0, 1], [0, 1, 0]]


def test_eval_similarity_reading_detects_on_an_eval_mode_pass(tiny):
    """relations.arl.similarity=eval compares tau_s with the batch scored with dropout off (the kind of
    the per-epoch pass); the model's training mode is restored."""
    cfg, data, batcher = tiny
    torch.manual_seed(0)
    model = BACKBONES.get("arl")(cfg.model, data.video_dim, data.query_dim).train()
    state = DetectorState(5, model, torch.device("cpu"), data, batcher)
    batch = batcher.train_batch(np.arange(8))
    found = {}
    for reading in ("eval", "train"):
        cfg = resolve("arl", "sim-tiny", 0, [f"relations.arl.similarity={reading}"])
        det = ArlDetector(cfg)
        det.setup(data, arl_plan(cfg.loss))
        det.on_epoch_start(state)
        for st in det.stats.values():  # thresholds low enough that every pair passes on similarity
            st.tau_s, st.tau_u = -1.0, -1.0
        if reading == "train":  # feed it eval-mode outputs: it must then agree with the eval reading
            model.eval()
        with torch.no_grad():
            q, v = model.encode_queries(batch.queries), model.encode_videos(batch.videos)
            out = {"queries": q, "videos": v, "scores": model.score(q, v)}
        model.train()
        torch.manual_seed(1)
        found[reading] = det.detect(batch, out)
        assert model.training
    assert torch.equal(found["eval"].ambiguous, found["train"].ambiguous)
    assert torch.equal(found["eval"].detected["theta"].frame_ambiguous, found["train"].detected["theta"].frame_ambiguous)


def test_cross_model_hand_off():
    rel = _detector("full").detect(_batch(None), _outputs())
    assert rel.branches["theta"] is rel.detected["phi"]  # theta trains with Phi's sets
    assert rel.branches["phi"] is rel.detected["theta"]
    own = _detector("tv_only").detect(_batch(None), _outputs())
    assert own.branches["theta"] is own.detected["theta"]
    assert own.detected["theta"].frame_ambiguous is None  # no T-F in tv_only
    one = {"theta": ArlRelations(torch.eye(2, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool), torch.ones(2, 2))}
    assert hand_off(one)["theta"] is one["theta"]


def test_detection_precision_recall_and_sizes():
    det = _detector()
    det.detect(_batch(torch.tensor([[True, False], [True, True]])), _outputs())  # (q1, v0) truly relevant
    report = det.epoch_report()
    assert report["unlabelled_relevant_pairs"] == 1
    assert report["theta"]["precision"] == 0.0 and report["theta"]["recall"] == 0.0
    assert report["phi"]["precision"] == 1.0 and report["phi"]["recall"] == 1.0
    assert report["union"]["precision"] == 0.5 and report["union"]["recall"] == 1.0
    assert report["union"]["base_rate"] == 0.5  # one of the two unlabelled pairs is relevant
    assert report["theta"]["per_query"] == 0.5 and report["union"]["ambiguous_pairs"] == 2
    assert report["theta"]["frame_share"] == pytest.approx(1 / 4)  # 1 of the 4 frames of the labelled videos
    assert report["theta"]["tau_s"] == 0.5 and report["theta"]["tau_u"] == 0.3


def test_inactive_detector_gives_the_labels():
    det = _detector()
    det.active = False
    rel = det.detect(_batch(None), _outputs())
    assert rel.positive.tolist() == [[True, False], [False, True]] and not rel.ambiguous.any()
    assert det.epoch_report() == {"active": False}


@pytest.fixture(scope="module")
def tiny():
    cfg = resolve("arl", "sim-tiny", 0)
    data = DATASETS.get("sim-tiny").load(cfg)
    return cfg, data, Batcher(data["train"], cfg.data)


def test_epoch_statistics_match_a_naive_computation(tiny):
    cfg, data, batcher = tiny
    torch.manual_seed(0)
    model = BACKBONES.get("arl")(cfg.model, data.video_dim, data.query_dim).train()
    split = data["train"]
    pq, pv = np.array([0, 5, 9]), np.array([1, 3, 20])
    stats = epoch_statistics(model, batcher, torch.device("cpu"), video_chunk=7, probe=(pq, pv))
    assert model.training  # restored
    model.eval()
    with torch.no_grad():
        q = encode_all(model.encode_queries, batcher.queries, split.num_queries, 100, torch.device("cpu"))
        v = encode_all(model.encode_videos, batcher.videos, split.num_videos, 100, torch.device("cpu"))
    mask = v["frame_mask"]
    for b in ("theta", "phi"):
        st = stats[b]
        uq, uv = naive_uncertainty(q[f"query.{b}"], v[f"frames.{b}"], mask)
        assert torch.allclose(st.query_u, uq, atol=1e-5)
        assert torch.allclose(st.frame_u[:, : mask.shape[1]][mask], uv[mask], atol=1e-5)
        sims = torch.einsum("qd,vtd->qvt", F.normalize(q[f"query.{b}"], dim=-1), F.normalize(v[f"frames.{b}"], dim=-1))
        s = sims.masked_fill(~mask[None], float("-inf")).amax(-1)
        labelled = s[torch.arange(split.num_queries), torch.as_tensor(split.query_video)]
        assert torch.allclose(st.positive_similarity, labelled, atol=1e-5)
        assert st.tau_s == pytest.approx(float(labelled.mean()), abs=1e-5)
        own = sims[torch.arange(split.num_queries), torch.as_tensor(split.query_video)]  # [Nq, T]
        own_mask = mask[torch.as_tensor(split.query_video)]
        frame_mean = (own * own_mask).sum(1) / own_mask.sum(1)
        assert st.tau_s_frame == pytest.approx(float(frame_mean.mean()), abs=1e-5)
        uf = 0.5 * (uq[:, None, None] + uv[None])  # u^f over every (query, frame) pair
        assert st.tau_u_frame == pytest.approx(float(uf[:, mask].mean()), abs=1e-5)
        assert torch.allclose(st.probe_similarity, s[pq][:, pv], atol=1e-5)


def test_detector_feeds_on_another_backbone(tiny):
    """The detector works on any backbone with `query` and `frame` outputs (one branch)."""
    cfg, data, batcher = tiny
    base_cfg = resolve("baseline", "sim-tiny", 0, ["relations.name=arl"])
    model = BACKBONES.get("dual-branch")(base_cfg.model, data.video_dim, data.query_dim)
    det = ArlDetector(base_cfg)
    det.setup(data)
    det.on_epoch_start(DetectorState(5, model, torch.device("cpu"), data, batcher))  # past the default warm-up
    batch = batcher.train_batch(np.arange(8))
    q, v = model.encode_queries(batch.queries), model.encode_videos(batch.videos)
    rel = det.detect(batch, {"queries": q, "videos": v, "scores": model.score(q, v)})
    assert isinstance(rel, ArlRelations) and list(rel.detected) == ["frame"]
    assert rel.ambiguous.shape == rel.positive.shape and not (rel.ambiguous & rel.positive).any()
    assert "precision" in det.epoch_report()["frame"]
