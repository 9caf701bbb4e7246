"""The CUDA path (marked `cuda`: skipped without a GPU; `nox -s gpu` runs them where one is).

What is promised on CUDA (docs/gpu.md, "Determinism"): every method trains an epoch; the
evaluator ranks the same scores to the same ranks on either device; bf16 stays within the
stated tolerance of fp32; with `train.deterministic=true` a run is exact (same seed, same
metrics; a killed and resumed run equals an uninterrupted one).
"""

import json
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from prvr.harness.base import masks
from prvr.harness.engine.build import build_run
from prvr.harness.engine.config import resolve
from prvr.harness.engine.evaluate import compute_ranks
from prvr.harness.cli.gpu_check import not_deterministic
from prvr.harness.base.registry import METHODS
from prvr.harness.engine.runner import run_one
from prvr.methods.backbones.ral import csa_reference, csa_scores
from prvr.methods.objectives.prvr import hungarian_pairs, matching_pairs
from test_devices import BF16_LOSS_RTOL, BF16_SCORE_TOL
from test_ral_objectives import _csa_inputs
from test_trainer import Kill

pytestmark = pytest.mark.cuda

EXACT = ["train.epochs=2", "train.patience=10", "train.deterministic=true"]


def _metrics(record):
    return json.dumps(record["metrics"], sort_keys=True)


@pytest.mark.detects
@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_trains_an_epoch_on_cuda(method, tmp_path, on_cuda):
    record = run_one(resolve(method, "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    assert record["provenance"]["device"].startswith("cuda")
    assert all(np.isfinite(h["loss"]) for h in record["history"])
    assert 0 <= record["metrics"]["test"]["SumR"] <= 400


def test_cpu_and_cuda_rank_the_same_scores_alike(on_cuda):
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=(300, 40)), 1).astype(np.float32)  # rounded: many ties
    labels = sp.csr_matrix((np.ones(300, dtype=bool), (np.arange(300), rng.integers(0, 40, 300))), shape=(300, 40))
    cpu = compute_ranks(lambda s, e: torch.tensor(scores[s:e]), 300, labels, chunk=64)
    gpu = compute_ranks(lambda s, e: torch.tensor(scores[s:e], device="cuda"), 300, labels, chunk=64)
    np.testing.assert_array_equal(cpu["labelled"], gpu["labelled"])


def test_ral_sparse_csa_backward_on_cuda_equals_the_cpus(on_cuda):
    """RAL's CSA gradient is two sparse products (methods/backbones/ral.py::_BestFrame): on CUDA it
    equals the same backward on the CPU and autograd through the definition on CUDA, without torch
    2.11's warning about the sparse tensor's invariant checks."""
    tokens, token_mask, weights, frames, frame_mask = _csa_inputs(seed=6)
    upstream = torch.randn(3, 5, generator=torch.Generator().manual_seed(7))
    grads = {}
    for name, device, score in [("cpu", "cpu", csa_scores), ("cuda", on_cuda, csa_scores),
                                ("cuda reference", on_cuda, csa_reference)]:
        # leaves of their own: `x.to("cpu")` is x itself, so requires_grad_ on it would make the CUDA copies non-leaves
        t, w, f = (x.detach().clone().to(device).requires_grad_(True) for x in (tokens, weights, frames))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Sparse invariant checks")
            (score(t, token_mask.to(device), w, f, frame_mask.to(device)) * upstream.to(device)).sum().backward()
        grads[name] = [g.cpu() for g in (t.grad, w.grad, f.grad)]
    for other in ("cuda", "cuda reference"):
        for got, want in zip(grads[other], grads["cpu"]):
            assert torch.allclose(got, want, atol=1e-4), other


@pytest.mark.parametrize("seed", range(5))
def test_gmmformer2_matching_on_cuda_is_scipys(seed, on_cuda):
    """GMMFormer v2's Hungarian matching solved on the device (methods/objectives/prvr.py::
    matching_pairs) against scipy's on the host: 40 videos of 3 to 21 positive queries over 32
    clips (those of more than 12, the device's limit, solved on the host)."""
    g = torch.Generator().manual_seed(seed)
    host = torch.rand(200, 40, generator=g) < 0.045  # 9 a video on average
    cos = torch.rand(200, 40, 32, generator=g) * 2 - 1
    want = hungarian_pairs(cos, host.clone())
    got = matching_pairs(cos.to(on_cuda), masks.to_device(host, on_cuda))
    for a, b in zip(got, want, strict=True):
        assert a.cpu().tolist() == b.tolist()


@pytest.mark.parametrize("method", ["baseline", "msl", "gmmformer", "arl"])
def test_bf16_is_within_tolerance_of_fp32_on_cuda(method, on_cuda):
    got = {}
    for precision in ("fp32", "bf16"):
        cfg = resolve(method, "sim-tiny", 0, ["train.epochs=1", f"train.precision={precision}"])
        trainer = build_run(cfg).trainer("unused")
        batch = trainer.batchers["train"].train_batch(trainer.has_queries.nonzero()[0][:8]).to(trainer.device)
        q, v = trainer.model.encode_queries(batch.queries), trainer.model.encode_videos(batch.videos)
        scores = trainer.model.score(q, v).fused.detach()
        got[precision] = (scores, float(trainer.train_step(batch, 0, 0)["loss"]))
    assert (got["bf16"][0] - got["fp32"][0]).abs().max() <= BF16_SCORE_TOL
    assert got["bf16"][1] == pytest.approx(got["fp32"][1], rel=BF16_LOSS_RTOL)


def test_deterministic_cuda_runs_are_exact_and_resume_exactly(tmp_path, on_cuda):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        full = run_one(resolve("baseline", "sim-tiny", 0, EXACT), tmp_path / "a")
        again = run_one(resolve("baseline", "sim-tiny", 0, EXACT), tmp_path / "b")
        assert _metrics(full) == _metrics(again)
        with pytest.raises(KeyboardInterrupt):
            run_one(resolve("baseline", "sim-tiny", 0, EXACT), tmp_path / "killed", hooks=[Kill(after_epoch=0)])
        resumed = run_one(resolve("baseline", "sim-tiny", 0, EXACT), tmp_path / "killed", resume=True)
    assert _metrics(resumed) == _metrics(full)
    # the promise holds where no kernel warns (docs/gpu.md); torch warns some of them once per
    # process, so an earlier deterministic test in this process could hide one here
    assert not not_deterministic(caught)


def test_tf32_and_compile_train_on_cuda(tmp_path, on_cuda):
    for extra in (["train.precision=tf32"], ["train.compile=true"]):
        record = run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1", *extra]), tmp_path / extra[0])
        assert np.isfinite(record["history"][0]["loss"])
