"""The MS-SL family's objectives against hand-computed values and brute-force references,
and a one-epoch smoke run of each MS-SL family method."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from prvr.harness.base import masks
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.engine.runner import run_one
from prvr.methods.backbones.api import Scores
from prvr.methods.objectives import prvr as objectives
from prvr.methods.objectives.prvr import (best_assignments, focal_query_diversity, hungarian_matching,
                                          hungarian_pairs, matching_pairs, msl_triplet, query_diversity,
                                          same_video_pairs, two_branch_ranking)
from prvr.methods.relations.base import Relations

LABELS = torch.tensor([0, 0, 1])  # queries 0 and 1 describe video 0, query 2 video 1


def one_to_one(labels=LABELS, videos=2):
    return Relations.one_to_one(labels, videos)


def test_msl_triplet_with_hard_negatives_hand_computed():
    s = torch.tensor([[0.9, 0.5],
                      [0.4, 0.6],
                      [0.3, 0.8]])
    rel = one_to_one()
    loss = msl_triplet(s, rel.positive, rel.negative, margin=0.1, hard_pool=1)
    t2v = [max(0, 0.1 + 0.5 - 0.9), max(0, 0.1 + 0.6 - 0.4), max(0, 0.1 + 0.3 - 0.8)]
    # v2t: video 0 against the mean of its queries (0.9 + 0.4) / 2 and its only negative query q2;
    # video 1 against q2 and the hardest of q0 (0.5), q1 (0.6)
    v2t = [max(0, 0.1 + 0.3 - 0.65), max(0, 0.1 + 0.6 - 0.8)]
    assert loss.item() == pytest.approx(sum(t2v) / 3 + sum(v2t) / 2)


def test_msl_triplet_random_negatives_hand_computed():
    s = torch.tensor([[0.2, 0.5],
                      [0.7, 0.1]])
    pos = torch.eye(2, dtype=torch.bool)  # one negative per row and per column: no choice to make
    loss = msl_triplet(s, pos, ~pos, margin=0.2, hard_pool=None, generator=torch.Generator().manual_seed(0))
    t2v = [0.2 + 0.5 - 0.2, 0.2 + 0.7 - 0.1]
    v2t = [0.2 + 0.7 - 0.2, 0.2 + 0.5 - 0.1]
    assert loss.item() == pytest.approx(sum(t2v) / 2 + sum(v2t) / 2)


def test_msl_triplet_never_uses_ambiguous_pairs_as_negatives():
    s = torch.tensor([[0.5, 0.99, 0.0],
                      [0.0, 0.5, 0.0]])
    pos = torch.tensor([[True, False, False], [False, True, False]])
    amb = torch.tensor([[False, True, False], [False, False, False]])
    loss = msl_triplet(s, pos, ~(pos | amb), margin=0.1, hard_pool=1)
    t2v = [max(0, 0.1 + 0.0 - 0.5), max(0, 0.1 + 0.0 - 0.5)]  # q0's only negative is v2
    v2t = [max(0, 0.1 + 0.0 - 0.5), 0.0]  # v1's only other query q0 is ambiguous: no negative
    assert loss.item() == pytest.approx(sum(t2v) / 2 + sum(v2t) / 2)


def test_nce_is_the_references_clip_nce_on_raw_dot_products():
    raw = torch.tensor([[2.0, 0.0],
                        [1.0, 0.5],
                        [0.0, 3.0]])
    scores = Scores(raw.tanh(), {"clip": raw.tanh(), "frame": raw.tanh()}, {"clip": raw, "frame": raw})
    rel = one_to_one()
    parts = two_branch_ranking(scores, rel.positive, rel.negative, 0.1, None, torch.Generator().manual_seed(0))
    lse = torch.logsumexp
    t2v = [lse(raw[0], 0) - 2.0, lse(raw[1], 0) - 1.0, lse(raw[2], 0) - 3.0]
    v2t = [lse(raw[:, 0], 0) - lse(torch.tensor([2.0, 1.0]), 0), lse(raw[:, 1], 0) - 3.0]
    expected = sum(t2v) / 3 + sum(v2t) / 2
    assert parts["clip_nce"].item() == pytest.approx(float(expected))
    assert parts["frame_nce"].item() == pytest.approx(float(expected))


def test_ranking_parts_name_the_missing_raw_scores():
    rel = one_to_one()
    with pytest.raises(UserError, match=r"Scores.raw\['clip'\]"):
        two_branch_ranking(Scores(torch.zeros(3, 2), {"clip": torch.zeros(3, 2), "frame": torch.zeros(3, 2)}),
                           rel.positive, rel.negative, 0.1, None, None)


# --------------------------------------------------------------------------- query diversity
QUERIES = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 2.0], [3.0, 4.0]])  # cos(q0, q1) = 0.6, q1 == q3 in direction


def test_same_video_pairs_come_from_the_positive_relations():
    pairs = same_video_pairs(one_to_one().positive)
    assert pairs.tolist() == [[False, True, False], [True, False, False], [False, False, False]]


def test_query_diversity_hand_computed():
    labels = torch.tensor([0, 0, 1, 0])  # q0, q1, q3 share video 0
    pairs = same_video_pairs(Relations.one_to_one(labels, 2).positive)
    loss = query_diversity(QUERIES, pairs, margin=0.1, alpha=2.0)
    e = math.exp
    cos01, cos03, cos13 = 0.6, 0.6, 1.0
    col0 = math.log(1 + e(2 * (cos01 + 0.1)) + e(2 * (cos03 + 0.1)))
    col1 = math.log(1 + e(2 * (cos01 + 0.1)) + e(2 * (cos13 + 0.1)))
    col3 = math.log(1 + e(2 * (cos03 + 0.1)) + e(2 * (cos13 + 0.1)))
    assert loss.item() == pytest.approx((col0 + col1 + 0.0 + col3) / 4, rel=1e-6)


def test_focal_query_diversity_hand_computed():
    labels = torch.tensor([0, 0, 1, 0])
    pairs = same_video_pairs(Relations.one_to_one(labels, 2).positive)
    loss = focal_query_diversity(QUERIES, pairs, margin=0.1, alpha=2.0, gamma=2.0)

    def term(c):
        return (1 + c) ** 2 * math.log(1 + math.exp(2 * (c + 0.1)))

    expected = 2 * (term(0.6) + term(0.6) + term(1.0)) / 4  # each pair counted in both directions
    assert loss.item() == pytest.approx(expected, rel=1e-6)


# --------------------------------------------------------------------------- Hungarian matching
def brute_force_matching(queries, clips, positive, min_queries=2):
    cos = torch.einsum("qd,vcd->qvc", F.normalize(queries, dim=-1), F.normalize(clips, dim=-1))
    total, pairs = 0.0, 0
    for v in range(clips.shape[0]):
        qs = positive[:, v].nonzero().flatten().tolist()
        if len(qs) < min_queries:
            continue
        n = min(len(qs), clips.shape[1])
        best = -math.inf
        for chosen in itertools.combinations(qs, n):  # more queries than clips: the best subset is matched
            for perm in itertools.permutations(range(clips.shape[1]), n):
                best = max(best, sum(cos[q, v, c].item() for q, c in zip(chosen, perm)))
        total, pairs = total + best, pairs + n
    return 1 - total / pairs


@pytest.mark.parametrize("seed", range(6))
def test_hungarian_matching_matches_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    videos, clips_per_video, d = 3, 4, 5
    labels = torch.randint(0, videos, (9,), generator=g)
    labels[:2] = 0  # at least one video with two queries
    queries, clips = torch.randn(9, d, generator=g), torch.randn(videos, clips_per_video, d, generator=g)
    positive = Relations.one_to_one(labels, videos).positive
    if seed % 2:  # relations with extra positives (e.g. the oracle detector)
        positive = positive | (torch.rand(9, videos, generator=g) < 0.2)
    loss = hungarian_matching(queries, clips, positive)
    assert loss.item() == pytest.approx(brute_force_matching(queries, clips, positive), abs=1e-5)


@pytest.mark.parametrize("seed", range(30))
def test_the_devices_assignment_is_scipys(seed):
    """`best_assignments` (the dynamic programme over clips) against scipy's linear_sum_assignment,
    the reference's solver: the same clips for every query, from one query up to the device's
    limit, as many clips as queries or more."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, objectives.DEVICE_MATCHING_MAX_QUERIES + 1)) if seed % 3 else int(rng.integers(1, 4))
    c = n + int(rng.integers(0, 6))
    weights = rng.uniform(-1, 1, size=(int(rng.integers(1, 5)), n, c))
    got = best_assignments(torch.from_numpy(weights)).numpy()
    for g in range(len(weights)):
        rows, cols = linear_sum_assignment(-weights[g])
        assert rows.tolist() == list(range(n)) and got[g].tolist() == cols.tolist()


def test_the_devices_assignment_on_ties_is_as_good_as_scipys():
    """Equal weights (clips that are copies of each other): another assignment than scipy's may
    be chosen, of the same sum, with distinct clips."""
    weights = torch.tensor([[[0.5, 0.5, 0.2], [0.5, 0.5, 0.2]], [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]], dtype=torch.float64)
    got = best_assignments(weights)
    for g in range(2):
        rows, cols = linear_sum_assignment(-weights[g].numpy())
        assert len(set(got[g].tolist())) == 2
        assert weights[g, [0, 1], got[g]].sum().item() == pytest.approx(weights[g].numpy()[rows, cols].sum())


@pytest.mark.parametrize("seed", range(40))
def test_matching_pairs_are_the_references(seed, monkeypatch):
    """`matching_pairs` (on the device, the host only where a video has more queries than the
    device's limit or than clips) against `hungarian_pairs` (scipy per video): the same (query,
    video, clip) triples in the same order, with and without a mask described from the host."""
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(objectives, "DEVICE_MATCHING_MAX_QUERIES", int(rng.integers(2, 7)))
    queries, videos, clips = int(rng.integers(1, 30)), int(rng.integers(1, 6)), int(rng.integers(1, 8))
    host = torch.from_numpy(rng.random((queries, videos)) < rng.uniform(0.1, 0.9))
    cos = torch.from_numpy(rng.uniform(-1, 1, size=(queries, videos, clips)).astype(np.float32))
    min_queries = int(rng.integers(1, 3))
    want = hungarian_pairs(cos, host.clone(), min_queries)
    for positive in (host.clone(), masks.describe_from_host(host, host.clone())):
        got = matching_pairs(cos, positive, min_queries)
        for g, w in zip(got, want, strict=True):
            assert g.tolist() == w.tolist()


def test_hungarian_matching_hand_computed_and_differentiable():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], requires_grad=True)
    clips = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]], requires_grad=True)
    positive = torch.tensor([[True], [True], [False]])  # q2 is not positive for the video
    loss = hungarian_matching(queries, clips, positive)
    assert loss.item() == pytest.approx(0.0)  # q0 -> clip 1, q1 -> clip 0, both cos 1
    loss.backward()
    assert queries.grad is not None and clips.grad is not None


def test_hungarian_matching_skips_videos_with_a_single_query():
    queries, clips = torch.randn(2, 3, requires_grad=True), torch.randn(2, 4, 3)
    loss = hungarian_matching(queries, clips, Relations.one_to_one(torch.tensor([0, 1]), 2).positive)
    assert loss.item() == 0.0
    loss.backward()  # still part of the graph


# --------------------------------------------------------------------------- methods train
@pytest.mark.parametrize("method", ["msl", "gmmformer", "gmmformer2"])
def test_method_trains_one_epoch_on_sim_tiny(method, tmp_path):
    record = run_one(resolve(method, "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    assert record["backbone"] == method
    history = record["history"][0]
    assert math.isfinite(history["loss"]) and history["clip_triplet"] >= 0
    assert record["metrics"]["test"]["SumR"] > 0


@pytest.mark.parametrize("method, overrides", [("gmmformer2", []), ("ral", ["relations.name=oracle"])])
def test_training_with_the_devices_matching_is_training_with_scipys(method, overrides, tmp_path, monkeypatch):
    """GMMFormer v2 (and RAL on it, with the oracle's extra positives) trained with the matching
    solved on the device and with scipy's on the host (the reference's): the same losses in
    every epoch and the same metrics, to the last digit."""
    records = []
    for solver in ("device", "scipy"):
        if solver == "scipy":
            monkeypatch.setattr(objectives, "matching_pairs", lambda cos, positive, min_queries=2: tuple(
                torch.from_numpy(a) for a in hungarian_pairs(cos, positive, min_queries)))
        records.append(run_one(resolve(method, "sim-tiny", 0, ["train.epochs=2", *overrides]), tmp_path / solver))
    assert records[0]["history"] == records[1]["history"] and records[0]["metrics"] == records[1]["metrics"]


@pytest.mark.parametrize("method", ["msl", "gmmformer", "gmmformer2"])
def test_frame_branch_losses_can_be_weighed_out(method):
    """loss.frame_nce_weight=0 and loss.frame_triplet_weight=0 leave the loss without the frame
    branch's terms (the clip-branch-only diagnostic); the default weighs the triplet 1."""
    from types import SimpleNamespace

    from prvr.harness.base.registry import METHODS, load_all

    load_all()
    spec = METHODS.get(method)
    g = torch.Generator().manual_seed(0)
    raw = {b: torch.randn(4, 2, generator=g, requires_grad=True) for b in ("clip", "frame")}
    scores = Scores(raw["clip"].tanh(), {b: r.tanh() for b, r in raw.items()}, raw)
    rel = one_to_one(torch.tensor([0, 0, 1, 1]))
    queries = torch.randn(4, 3, generator=g)
    outputs = {"queries": {"query": queries}, "videos": {"clips": torch.randn(2, 5, 3, generator=g)}}

    def context():  # the same random negatives in both calls
        return SimpleNamespace(epoch=0, generator=torch.Generator().manual_seed(1), outputs=outputs)

    full_cfg, clip_cfg = spec.loss_cls(), spec.loss_cls(frame_nce_weight=0.0, frame_triplet_weight=0.0)
    full = spec.objective(full_cfg, scores, rel, context())
    clip_only = spec.objective(clip_cfg, scores, rel, context())
    expected = full["loss"] - full_cfg.frame_nce_weight * full["frame_nce"] - full["frame_triplet"]
    assert clip_only["loss"].item() == pytest.approx(expected.item())
    clip_only["loss"].backward()
    assert raw["frame"].grad is None or not raw["frame"].grad.any()
    assert raw["clip"].grad.abs().sum() > 0


# --------------------------------------------------------------------------- loss.frame_matrix=queries
def test_query_matrix_nce_is_the_references_frame_nce():
    """ms-sl's frame_nce, written as its code computes it (an identity mask for the numerator, the
    matrix and its transpose side by side for the denominator), on random [Q, Q] raw scores."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 7, generator=g) * 4
    numerator = torch.logsumexp((x * torch.eye(7)).sum(1, keepdim=True), dim=1)
    denominator = torch.logsumexp(torch.cat((x, x.t()), dim=1), dim=1)
    assert objectives.query_matrix_nce(x).item() == pytest.approx((denominator - numerator).mean().item(), rel=1e-6)
    # by hand, row 0: log(sum_j e^x0j + sum_j e^xj0) - x00 (x00 counted twice)
    row0 = math.log(sum(math.exp(x[0, j]) + math.exp(x[j, 0]) for j in range(7))) - float(x[0, 0])
    assert float(denominator[0] - numerator[0]) == pytest.approx(row0, rel=1e-5)


def test_query_matrix_triplet_hand_computed_and_uniform_draws_avoid_the_diagonal():
    s = torch.tensor([[0.9, 0.5, 0.2],
                      [0.4, 0.6, 0.7],
                      [0.3, 0.8, 0.5]])
    loss = objectives.query_matrix_triplet(s, margin=0.1, hard_pool=1)
    # hardest other column per row: 0.5, 0.7, 0.8; hardest other row per column: 0.4, 0.8, 0.7
    ctx = [max(0, 0.1 + 0.5 - 0.9), max(0, 0.1 + 0.7 - 0.6), max(0, 0.1 + 0.8 - 0.5)]
    qry = [max(0, 0.1 + 0.4 - 0.9), max(0, 0.1 + 0.8 - 0.6), max(0, 0.1 + 0.7 - 0.5)]
    assert loss.item() == pytest.approx(sum(ctx) / 3 + sum(qry) / 3)
    # uniform draws: a diagonal of 5 with margin 0 makes every off-diagonal draw a zero term
    big = torch.full((6, 6), -1.0).fill_diagonal_(5.0)
    for seed in range(20):
        assert objectives.query_matrix_triplet(big, 0.0, None, torch.Generator().manual_seed(seed)).item() == 0.0
    assert objectives.query_matrix_triplet(torch.ones(1, 1), 0.1).item() == 0.0  # one query: no other


def test_own_video_frames_match_a_loop_over_queries():
    """Each query's frame feature (ms-sl key_clip_guided_attention): the labelled video's proposal
    of the highest cosine as the key, softmax of its dots with the frame keys over real frames, the
    frame values weighed by it; against a plain loop, with padded frames in one video."""
    from prvr.methods.backbones.msl import own_video_frames, proposal_matrix_like

    g = torch.Generator().manual_seed(5)
    v = {"clips": torch.randn(3, 4, 6, generator=g), "frame_keys": torch.randn(3, 5, 6, generator=g),
         "frame_values": torch.randn(3, 5, 6, generator=g),
         "frame_mask": torch.tensor([[True] * 5, [True, True, True, False, False], [True] * 5])}
    query, labels = torch.randn(4, 6, generator=g), torch.tensor([1, 0, 1, 2])
    got = own_video_frames(query, v, labels)
    pool = proposal_matrix_like(v["clips"])
    for j, video in enumerate(labels.tolist()):
        proposals = pool @ v["clips"][video]  # [P, D]
        key = proposals[F.cosine_similarity(proposals, query[j][None], dim=-1).argmax()]
        real = v["frame_mask"][video]
        att = (v["frame_keys"][video][real] @ key).softmax(0)
        assert torch.allclose(got[j], att @ v["frame_values"][video][real], atol=1e-5)


def test_msl_trains_on_the_references_frame_matrix():
    """loss.frame_matrix=queries: the frame terms are the query-matrix losses of each query against
    every query's own-video frame feature (gradients reach the frame keys and values), the clip
    terms are unchanged; the default trains on the [queries x videos] scores."""
    from types import SimpleNamespace

    from prvr.harness.base.registry import METHODS, load_all
    from prvr.methods.backbones.msl import own_video_frames

    load_all()
    spec = METHODS.get("msl")
    g = torch.Generator().manual_seed(0)
    raw = {b: torch.randn(4, 2, generator=g, requires_grad=True) for b in ("clip", "frame")}
    scores = Scores(raw["clip"].tanh(), {b: r.tanh() for b, r in raw.items()}, raw)
    labels = torch.tensor([0, 0, 1, 1])
    rel = one_to_one(labels)
    query = torch.randn(4, 3, generator=g)
    videos = {"clips": torch.randn(2, 5, 3, generator=g), "frame_keys": torch.randn(2, 4, 3, generator=g),
              "frame_values": torch.randn(2, 4, 3, generator=g, requires_grad=True),
              "frame_mask": torch.ones(2, 4, dtype=torch.bool)}

    def context():
        return SimpleNamespace(epoch=0, generator=torch.Generator().manual_seed(1), video_of_query=labels,
                               outputs={"queries": {"query": query}, "videos": videos})

    ours, ref = spec.objective(spec.loss_cls(), scores, rel, context()), \
        spec.objective(spec.loss_cls(frame_matrix="queries"), scores, rel, context())
    frames = own_video_frames(query, videos, labels)
    assert ref["frame_nce"].item() == pytest.approx(objectives.query_matrix_nce(query @ frames.t()).item())
    assert ref["clip_nce"].item() == ours["clip_nce"].item()
    assert ref["frame_nce"].item() != pytest.approx(ours["frame_nce"].item())
    ref["loss"].backward()
    assert videos["frame_values"].grad.abs().sum() > 0
    assert raw["frame"].grad is None or not raw["frame"].grad.any()  # the [Q, V] frame scores train nothing


def test_the_references_frame_matrix_trains_msl_on_sim_tiny(tmp_path):
    record = run_one(resolve("msl", "sim-tiny", 0, ["train.epochs=1", "loss.frame_matrix=queries"]), tmp_path)
    assert record["config"]["loss"]["frame_matrix"] == "queries"
    assert math.isfinite(record["history"][0]["frame_nce"]) and record["metrics"]["test"]["SumR"] > 0


# --------------------------------------------------------------------------- matching benchmark
# GMMFormer v2's matching at sim-tvr's batch (128 videos of 5 positive queries, 32 clips, 640
# queries), on the host (scipy, the reference) and on the device's path run here on the CPU:
#     pytest tests/test_prvr_objectives.py -k benchmark --benchmark-enable --benchmark-group-by=group
@pytest.fixture(scope="module")
def tvr_batch_matching():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(128).repeat_interleave(5)
    host = Relations.one_to_one(labels, 128).positive
    cos = torch.rand(640, 128, 32, generator=g) * 2 - 1
    return cos, masks.describe_from_host(host, host.clone())


@pytest.mark.benchmark(group="gmmformer2-matching")
def test_benchmark_matching_scipy_on_the_host(benchmark, tvr_batch_matching):
    assert len(benchmark(hungarian_pairs, *tvr_batch_matching)[0]) == 640


@pytest.mark.benchmark(group="gmmformer2-matching")
def test_benchmark_matching_on_the_device_path(benchmark, tvr_batch_matching):
    got = benchmark(matching_pairs, *tvr_batch_matching)
    assert [t.tolist() for t in got] == [a.tolist() for a in hungarian_pairs(*tvr_batch_matching)]
