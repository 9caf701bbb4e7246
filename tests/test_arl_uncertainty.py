"""ARL Eq. 4-5 and the thresholds: the fast path against the naive [Q, V, T] map, and a
benchmark at TVR training scale (set PRVR_ARL_BENCH_FULL=1 and pass --benchmark-enable)."""

import os
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prvr.methods.relations.arl import (UncertaintyPass, dataset_uncertainty, frame_pair_uncertainty,
                                        naive_uncertainty, pair_uncertainty, thresholds, video_mean)


def _random(nq, nv, t, d, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(nq, d, generator=g, dtype=dtype)
    v = torch.randn(nv, t, d, generator=g, dtype=dtype)
    lengths = torch.randint(1, t + 1, (nv,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    v[~mask] = 100.0 * torch.randn(int((~mask).sum()), d, generator=g, dtype=dtype)  # garbage in padding
    return q, v, mask


@pytest.mark.parametrize("block_rows", [0, 5, 512])  # whole tensor; blocks over worker threads
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_fast_uncertainty_matches_the_naive_map_with_padding(dtype, tol, block_rows):
    q, v, mask = _random(37, 11, 9, 16, dtype=dtype)
    uq, uv = dataset_uncertainty(q, v, mask, block_rows=block_rows)
    nq, nv = naive_uncertainty(q, v, mask)
    assert torch.allclose(uq, nq, atol=tol, rtol=0)
    assert torch.allclose(uv[mask], nv[mask], atol=tol, rtol=0)
    assert (uv[~mask] == 0).all()


def test_blocked_rows_over_threads_agree_with_whole_tensor_rows():
    q, v, mask = _random(9, 7, 6, 8, seed=4)
    p = UncertaintyPass(q)
    flat, real = v.reshape(-1, 8), mask.reshape(-1)
    uv, total = p._blocked(flat, real, rows=5)  # one worker per torch thread, any count
    ref_uv, ref_total = p._rows(flat, real)
    assert torch.allclose(uv, ref_uv, atol=1e-12) and torch.allclose(total, ref_total, atol=1e-12)


def test_naive_map_is_eq4_by_loops():
    q, v, mask = _random(4, 3, 5, 6, seed=3)
    nq, nv = naive_uncertainty(q, v, mask)
    cos = lambda a, b: float(F.cosine_similarity(a, b, dim=0))  # noqa: E731
    for x in range(4):
        sims = [cos(q[x], v[y, z]) for y in range(3) for z in range(5) if mask[y, z]]
        assert nq[x].item() == pytest.approx(np.mean(sims))
    for y in range(3):
        for z in range(5):
            if mask[y, z]:
                assert nv[y, z].item() == pytest.approx(np.mean([cos(q[x], v[y, z]) for x in range(4)]))


def test_streaming_chunks_agree_with_one_pass():
    q, v, mask = _random(20, 13, 7, 8, seed=1)
    whole = dataset_uncertainty(q, v, mask, block_rows=0)
    p = UncertaintyPass(q)
    parts = [p.add_videos(v[s:e], mask[s:e]) for s, e in ((0, 1), (1, 6), (6, 13))]
    assert torch.allclose(torch.cat(parts), whole[1])
    assert torch.allclose(p.query_uncertainty(), whole[0])


def test_pairwise_uncertainty_eq5():
    uq = torch.tensor([0.1, 0.3])
    uv = torch.tensor([[0.0, 0.2, 0.4], [1.0, 0.5, 0.7]])
    best = torch.tensor([[2, 0], [1, 1]])  # k^ of each (query, video)
    u = pair_uncertainty(uq, uv, best)
    assert torch.allclose(u, torch.tensor([[(0.1 + 0.4) / 2, (0.1 + 1.0) / 2], [(0.3 + 0.2) / 2, (0.3 + 0.5) / 2]]))
    uf = frame_pair_uncertainty(uq, uv)
    assert uf.shape == (2, 2, 3)
    assert uf[1, 0, 2].item() == pytest.approx((0.3 + 0.4) / 2)


def test_thresholds_against_brute_force():
    q, v, mask = _random(12, 5, 6, 8, seed=2)
    labelled = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 0])
    uq, uv = dataset_uncertainty(q, v, mask)
    sims = torch.einsum("qd,vtd->qvt", F.normalize(q, dim=-1), F.normalize(v, dim=-1)).masked_fill(~mask[None], -9)
    pos = sims.amax(-1)[torch.arange(12), labelled]
    tau_s, tau_u = thresholds(pos, uq, uv, mask)
    assert tau_s == pytest.approx(float(pos.mean()))
    # tau_u: mean over all text-video pairs of (U^q_i + mean_k U^v_jk) / 2
    vm = [float(uv[j][mask[j]].mean()) for j in range(5)]
    pairs = [(float(uq[i]) + vm[j]) / 2 for i in range(12) for j in range(5)]
    assert tau_u == pytest.approx(np.mean(pairs))
    assert video_mean(uv, mask)[2].item() == pytest.approx(vm[2])


FULL = os.environ.get("PRVR_ARL_BENCH_FULL") == "1"
# TVR training set (MS-SL release): 87,175 queries, 17,435 videos, <= 128 frames, d = 384.
SHAPE = (87_175, 17_435, 128, 384) if FULL else (4_000, 800, 128, 384)


@pytest.fixture(scope="module")
def tvr_scale_data():
    nq, nv, t, d = SHAPE
    g = torch.Generator().manual_seed(0)
    q = torch.randn(nq, d, generator=g)
    v = torch.randn(nv, t, d, generator=g)
    mask = torch.ones(nv, t, dtype=torch.bool)  # full scale: every video at the 128-frame cap
    return q, v, mask


def test_benchmark_uncertainty_fast_path(benchmark, tvr_scale_data):
    """Eq. 4 at TVR training scale (random data; generation not timed)."""
    q, v, mask = tvr_scale_data
    uq, uv = benchmark(dataset_uncertainty, q, v, mask)
    assert uq.shape == (SHAPE[0],) and uv.shape == SHAPE[1:3]
    # The naive map at this scale: time it on a slice and project by the number of entries.
    nq, nv = 256, 32
    start = time.perf_counter()
    naive_uncertainty(q[:nq], v[:nv], mask[:nv])
    per_entry = (time.perf_counter() - start) / (nq * nv * SHAPE[2])
    benchmark.extra_info["shape"] = SHAPE
    benchmark.extra_info["naive_projected_s"] = per_entry * SHAPE[0] * SHAPE[1] * SHAPE[2]
    benchmark.extra_info["naive_map_entries"] = SHAPE[0] * SHAPE[1] * SHAPE[2]
