"""`train.compile` on the CPU: the encoders compile to one graph each, with no graph break, and
encode as the eager ones do (docs/gpu.md, "What is compiled").

Under torch.compile the blocks keep every row of a padded batch and zero the padding rows after
(methods/backbones/blocks.py `pack` / `unpack`), so no size in a traced graph is read from the
data. The CUDA test (tests/test_cuda.py) trains a compiled epoch on a GPU.
"""

import functools
import os
import shutil

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from prvr.harness.base import progress
from prvr.harness.engine.build import build_model, build_run
from prvr.harness.engine.config import resolve
from prvr.methods.backbones.blocks import GMMBlock, init_weights

# one method per backbone: every encoder the suite has
EACH_BACKBONE = ["baseline", "msl", "gmmformer", "gmmformer2", "arl", "ral", "xml"]


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters emptied before the test, and its caches after."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("method", EACH_BACKBONE)
def test_compiled_encoders_are_one_graph_each_and_encode_as_eager(method, fresh_dynamo, monkeypatch):
    # the `eager` backend: dynamo traces as under the default one, where a size read from the data
    # is a graph break too, but nothing is compiled (the next test compiles with the default)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    runs = {c: build_run(resolve(method, "sim-tiny", 0, [f"train.compile={c}"])) for c in ("false", "true")}
    assert "encode_queries" in vars(runs["true"].model) and "encode_queries" not in vars(runs["false"].model)
    batcher = runs["false"].trainer("unused").batchers["val"]
    # two batches of other sizes (query tokens, video lengths): dynamic shapes, no recompile
    for index in (np.arange(6), np.arange(6, 15)):
        queries, videos = batcher.queries(index), batcher.videos(index)
        got = {}
        for c, run in runs.items():
            run.model.eval()  # no dropout: the same weights give the same outputs
            run.model.zero_grad(set_to_none=True)
            q, v = run.model.encode_queries(queries), run.model.encode_videos(videos)
            out = {**{f"q.{k}": t for k, t in q.items()}, **{f"v.{k}": t for k, t in v.items()}}
            sum(t.float().sum() for t in out.values() if t.is_floating_point() and t.requires_grad).backward()
            got[c] = out, _grads(run.model)
        (eager, eager_grads), (compiled, compiled_grads) = got["false"], got["true"]
        assert eager.keys() == compiled.keys()
        for k, t in eager.items():
            assert compiled[k].shape == t.shape and torch.allclose(compiled[k], t, atol=1e-5, rtol=1e-4), k
        assert eager_grads.keys() == compiled_grads.keys()
        for n, g in eager_grads.items():
            assert torch.allclose(compiled_grads[n], g, atol=1e-4, rtol=1e-3), n
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2  # encode_queries, encode_videos


def _cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


@pytest.mark.skipif(_cxx() is None, reason="torch.compile's CPU backend (inductor) needs a C++ compiler")
def test_a_padded_attention_block_compiles_with_the_default_backend(fresh_dynamo):
    """The default backend (inductor) lowers the forward and backward of an attention block on a
    padded batch, with no graph break, and the real rows come out as in eager."""
    torch.manual_seed(0)
    # GMMFormer's frame blocks: a plain branch and a Gaussian one over a fixed window (8 frames)
    block = GMMBlock(hidden=16, heads=2, widths=[0.0, 1.0], dropout=0.0, window_len=8).eval()
    init_weights(block, std=0.02)  # as the backbones do (BranchLinear's weights start empty)
    compiled = torch.compile(block, dynamic=True)
    for length, lengths in ((5, [5, 2, 3]), (7, [1, 7, 4])):
        x = torch.randn(3, length, 16, requires_grad=True)
        mask = torch.arange(length)[None] < torch.tensor(lengths)[:, None]
        got = {}
        for name, fn in (("eager", block), ("compiled", compiled)):
            block.zero_grad(set_to_none=True)
            x.grad = None
            out = fn(x, mask)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            got[name] = out.detach(), x.grad.clone(), _grads(block)
        (out, dx, dw), (c_out, c_dx, c_dw) = got["eager"], got["compiled"]
        assert torch.all(c_out[~mask] == 0)  # the padding rows zeroed, as eager leaves them
        assert torch.allclose(c_out, out, atol=1e-5) and torch.allclose(c_dx, dx, atol=1e-5)
        assert all(torch.allclose(c_dw[n], g, atol=1e-4) for n, g in dw.items())
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1


def test_compiling_a_cpu_graph_starts_cuda_where_cuda_is_present(fresh_dynamo, monkeypatch):
    """What the warning of a compiled CPU run on a GPU machine stands on (harness/engine/precision.py
    `warn_where_compile_starts_cuda`): dynamo asks CUDA for its random state as it compiles a graph,
    even one with no CUDA tensor (torch 2.11 to 2.13; on a CUDA build its triton check asks for the
    device too). Should torch stop asking, this fails, and the warning can go."""
    asked = []

    def touched(name):
        def call(*args, **kwargs):
            asked.append(name)
            raise RuntimeError(f"CUDA touched through {name}")  # here CUDA would start
        return call

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    for name in ("_lazy_init", "get_rng_state"):
        monkeypatch.setattr(torch.cuda, name, touched(f"torch.cuda.{name}"))
    double = torch.compile(lambda x: 2 * x, backend="eager")
    with pytest.raises(Exception, match="CUDA touched through"):
        double(torch.ones(3))
    assert asked[0] == "torch.cuda.get_rng_state"


@pytest.mark.parametrize("device, available, initialized, warned", [
    ("cpu", True, False, True),  # a GPU machine, CUDA not started: the warning
    ("cpu", False, False, False),  # no CUDA
    ("cpu", True, True, False),  # CUDA already started: nothing more to lose
    ("auto", True, False, False),  # trains on the GPU
])
def test_a_compiled_cpu_run_on_a_gpu_machine_is_warned_once(monkeypatch, device, available, initialized, warned):
    lines = []
    monkeypatch.delenv("PRVR_DEVICE", raising=False)  # auto: CUDA where there is one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(progress, "log", lines.append)
    monkeypatch.setattr(progress, "warn", lambda m: lines.append(f"warning: {m}"))
    model = build_model(resolve("baseline", "sim-tiny", 0, ["train.compile=true", f"train.device={device}"]), 8, 8)
    assert "encode_queries" in vars(model)  # compiled (lazily: nothing is traced until it is called)
    warnings = [line for line in lines if "train.compile on the CPU starts CUDA" in line]
    assert len(warnings) == warned and all("CUDA_VISIBLE_DEVICES=" in w and "\n" not in w for w in warnings)
