"""Optimizers and schedules (harness/engine/optim.py): BertAdam step by step against hand-computed
values, its decay groups, the reference warmup_linear schedule, and the registry."""

import math

import pytest
import torch
from torch import nn

from prvr.harness.engine.config import resolve
from prvr.harness.engine.optim import (OPTIMIZERS, BertAdam, build_optimizer, harness_groups, lr_lambda, reference_groups,
                                       reference_parts, split_groups)
from prvr.harness.base.registry import BACKBONES
from prvr.methods.backbones.blocks import BranchLayerNorm, BranchLinear, GaussianBranches


def _param(values, grad):
    p = nn.Parameter(torch.tensor(values, dtype=torch.float64))
    p.grad = torch.tensor(grad, dtype=torch.float64)
    return p


def test_first_steps_have_no_bias_correction():
    p = _param([1.0, 2.0], [0.3, -0.4])  # gradient norm 0.5: not clipped
    opt = BertAdam([p], lr=0.1, weight_decay=0.0, max_grad_norm=1.0)
    opt.step()
    # m = 0.1 g, v = 0.001 g^2; update = m / (sqrt(v) + 1e-6) = 0.1 |g| / (0.0316228 |g| + 1e-6) sign(g)
    m1 = [0.03, -0.04]
    v1 = [0.001 * 0.09, 0.001 * 0.16]
    expected = [1.0 - 0.1 * m1[0] / (math.sqrt(v1[0]) + 1e-6), 2.0 - 0.1 * m1[1] / (math.sqrt(v1[1]) + 1e-6)]
    assert p.detach().tolist() == pytest.approx(expected, abs=1e-12)
    assert expected[0] == pytest.approx(0.68381, abs=1e-5)  # bias-corrected Adam would move it to 0.9
    p.grad = torch.tensor([0.1, 0.2], dtype=torch.float64)
    opt.step()
    m2 = [0.9 * m1[0] + 0.1 * 0.1, 0.9 * m1[1] + 0.1 * 0.2]
    v2 = [0.999 * v1[0] + 0.001 * 0.01, 0.999 * v1[1] + 0.001 * 0.04]
    expected = [expected[i] - 0.1 * m2[i] / (math.sqrt(v2[i]) + 1e-6) for i in range(2)]
    assert p.detach().tolist() == pytest.approx(expected, abs=1e-12)


def test_each_parameter_is_clipped_on_its_own():
    big, small = _param([0.0, 0.0], [3.0, 4.0]), _param([0.0], [0.5])  # norms 5 and 0.5
    opt = BertAdam([big, small], lr=0.1, weight_decay=0.0, max_grad_norm=1.0)
    opt.step()
    # the clip is in place, as the reference's: big's gradient now has norm 1, small's is untouched
    assert big.grad.tolist() == pytest.approx([3.0 / (5.0 + 1e-6), 4.0 / (5.0 + 1e-6)], abs=1e-12)
    assert small.grad.tolist() == [0.5]  # one global clip would have scaled it by 1/5.02
    # the second step sees the clipped first moment: m1 = 0.1 * 0.6, v1 = 0.001 * 0.36
    big.grad = torch.tensor([0.06, 0.0], dtype=torch.float64)
    before = big.detach().clone()
    opt.step()
    m2, v2 = 0.9 * 0.1 * 0.6 + 0.1 * 0.06, 0.999 * 0.001 * 0.6 ** 2 + 0.001 * 0.06 ** 2
    assert float(before[0] - big.detach()[0]) == pytest.approx(0.1 * m2 / (math.sqrt(v2) + 1e-6), rel=1e-6)


def test_weight_decay_is_added_to_the_update():
    p = _param([2.0], [0.0])  # no gradient signal: the step is the decay alone
    BertAdam([p], lr=0.1, weight_decay=0.01).step()
    assert p.item() == pytest.approx(2.0 - 0.1 * 0.01 * 2.0, abs=1e-12)


def test_bertadam_matches_a_naive_loop_over_random_steps():
    torch.manual_seed(0)
    a = nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
    b = nn.Parameter(torch.randn(4, dtype=torch.float64))
    opt = BertAdam([{"params": [a], "weight_decay": 0.01}, {"params": [b], "weight_decay": 0.0}], lr=0.05)
    naive = {"a": (a.detach().clone(), 0.01), "b": (b.detach().clone(), 0.0)}
    state = {k: (torch.zeros_like(v[0]), torch.zeros_like(v[0])) for k, v in naive.items()}
    for step in range(5):
        grads = {"a": torch.randn(3, 4, dtype=torch.float64) * (step + 1), "b": torch.randn(4, dtype=torch.float64)}
        a.grad, b.grad = grads["a"].clone(), grads["b"].clone()
        opt.step()
        for k, (w, wd) in naive.items():
            g = grads[k]
            g = g * min(1.0, 1.0 / (float(g.norm()) + 1e-6))
            m, v = state[k]
            m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
            state[k] = (m, v)
            naive[k] = (w - 0.05 * (m / (v.sqrt() + 1e-6) + wd * w), wd)
    assert torch.allclose(a.detach(), naive["a"][0], atol=1e-12)
    assert torch.allclose(b.detach(), naive["b"][0], atol=1e-12)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.branch_norm = BranchLayerNorm(2, 4)
        self.pos = nn.Parameter(torch.zeros(8, 4))
        self.token = nn.Parameter(torch.zeros(4))
        self.table = nn.Embedding(8, 4)


def _names(model, params):
    ids = {id(p) for p in params}
    return sorted(n for n, p in model.named_parameters() if id(p) in ids)


def test_decay_groups():
    model = _Tiny()
    decay, no_decay = reference_groups(model)
    # the scripts' rule: biases and LayerNorm parameters undecayed; positional tables and other 1-D tensors decayed
    assert _names(model, decay) == ["pos", "proj.weight", "table.weight", "token"]
    assert _names(model, no_decay) == sorted(n for n, _ in model.named_parameters()
                                             if n.startswith(("norm", "branch_norm")) or n == "proj.bias")
    decay, no_decay = harness_groups(model)
    # adamw: 1-D tensors and embedding tables undecayed, by type: a 2-D parameter named `pos` is decayed
    assert _names(model, decay) == ["pos", "proj.weight"]


@pytest.mark.parametrize("backbone", BACKBONES.names())
def test_every_backbones_positional_tables_are_embedding_tables(backbone):
    """The type rule keeps the groups the committed adamw records were trained with (they were
    chosen by the name `pos`): every 2-D positional parameter is an embedding table's."""
    from prvr.harness.engine.build import build_model
    from prvr.harness.base.registry import home_method

    model = build_model(resolve(home_method(backbone), "sim-tiny", 0), 48, 32)
    _, no_decay = harness_groups(model)
    positional = [n for n, p in model.named_parameters() if "pos" in n and p.dim() >= 2]
    assert positional and set(positional) <= set(_names(model, no_decay))


def test_warmup_linear_schedule_values():
    f = lr_lambda(100, 0.1, "warmup_linear")
    assert f(0) == 0.0  # the reference's first update has learning rate 0
    assert f(5) == pytest.approx(0.5)
    assert f(10) == pytest.approx(1.0)  # warm-up end
    assert f(55) == pytest.approx(0.5)
    assert f(99) == pytest.approx(0.01 / 0.9)  # last planned step: lr / (total (1 - warmup))
    assert f(100) == 0.0 and f(130) == 0.0  # never negative past the plan


def test_harness_schedules():
    f = lr_lambda(100, 0.1, "cosine")
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(100) == pytest.approx(0.0)
    g = lr_lambda(100, 0.1, "linear")
    assert g(55) == pytest.approx(0.5)
    assert lr_lambda(100, 0.1, "constant")(80) == 1.0


def test_registry_and_presets_use_bertadam_where_the_reference_does():
    assert OPTIMIZERS.names() == ["adamw", "bertadam"]
    for method in ("msl", "gmmformer", "gmmformer2", "arl"):
        for dataset in ("tvr", "sim-tvr"):
            train = resolve(method, dataset, 0).train
            assert (train.optimizer, train.grad_clip, train.decay, train.warmup_frac) == \
                ("bertadam", 1.0, "warmup_linear", 0.01), (method, dataset)
    assert resolve("baseline", "sim-tvr", 0).train.optimizer == "adamw"  # the documented choice
    model = nn.Linear(2, 2)
    opt, spec = build_optimizer(model, resolve("msl", "sim-tiny", 0).train)
    assert isinstance(opt, BertAdam) and spec.clips_inside
    opt, spec = build_optimizer(model, resolve("baseline", "sim-tiny", 0).train)
    assert isinstance(opt, torch.optim.AdamW) and not spec.clips_inside


# ----------------------------------------------------------------------------- train.grad_clip_unit
def test_a_fused_tensor_clipped_by_parts_steps_as_the_reference_separate_tensors():
    """`reference`: a parameter holding three of the reference's tensors stacked on its first dim
    (q, k, v in one product) steps exactly as the three tensors do under BertAdam, each clipped on
    its own; clipped whole it does not."""
    torch.manual_seed(0)
    fused = nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    separate = [nn.Parameter(part.detach().clone()) for part in fused.detach().split(2)]
    whole = nn.Parameter(fused.detach().clone())
    by_parts = BertAdam(split_groups([{"params": [fused], "weight_decay": 0.01}], {id(fused): 3}), lr=0.05)
    reference = BertAdam([{"params": separate, "weight_decay": 0.01}], lr=0.05)
    as_one = BertAdam([{"params": [whole], "weight_decay": 0.01}], lr=0.05)
    for step in range(6):
        # parts of very different norms, some above the bound of 1 and some below, changing by step
        grad = torch.randn(6, 4, dtype=torch.float64) * torch.tensor([3.0, 3.0, 0.2, 0.2, 1.5, 1.5],
                                                                     dtype=torch.float64)[:, None] * (step + 1)
        fused.grad, whole.grad = grad.clone(), grad.clone()
        for p, g in zip(separate, grad.split(2)):
            p.grad = g.clone()
        by_parts.step()
        reference.step()
        as_one.step()
    assert torch.allclose(fused.detach(), torch.cat([p.detach() for p in separate]), atol=1e-12, rtol=0)
    assert not torch.allclose(whole.detach(), fused.detach(), atol=1e-3)


def test_split_groups_keep_each_groups_settings_and_order():
    a, b, c = (nn.Parameter(torch.zeros(6, 2)) for _ in range(3))
    groups = split_groups([{"params": [a, b], "weight_decay": 0.1}, {"params": [c], "weight_decay": 0.0}], {id(b): 3})
    assert [(g["clip_parts"], g["weight_decay"], [id(p) for p in g["params"]]) for g in groups] == \
        [(1, 0.1, [id(a)]), (3, 0.1, [id(b)]), (1, 0.0, [id(c)])]


def test_reference_parts_of_the_gaussian_branches():
    """Each branch's q, k and v, and its output map and norm, are the reference's own tensors
    (MS-SL's and GMMFormer's BertSelfAttention / BertSelfOutput, one per Gaussian width)."""
    block = GaussianBranches(hidden=8, heads=2, widths=[0.0, 1.0, 5.0], dropout=0.0)
    parts = reference_parts(block)
    assert parts == {id(block.qkv.weight): 9, id(block.qkv.bias): 9, id(block.dense.weight): 3,
                     id(block.dense.bias): 3, id(block.norm.weight): 3, id(block.norm.bias): 3}
    # the parts are the rows attend() reads as branch b's q, k, v: row blocks of hidden, branch-major
    x = torch.randn(1, 5, 8)
    w = block.qkv.weight.detach().view(3, 3, 8, 8)  # [branch, q/k/v, out, in]
    qkv = (x @ block.qkv.weight.detach().T + block.qkv.bias.detach()).view(1, 5, 3, 3, 8)
    assert torch.allclose(qkv[0, :, 1, 2], x[0] @ w[1, 2].T + block.qkv.bias.detach().view(3, 3, 8)[1, 2], atol=1e-6)
    assert reference_parts(BranchLinear(1, 4, 4)) == {}  # one branch: one tensor, nothing to split


@pytest.mark.parametrize("method, expected", [
    ("msl", {3: 6}),  # the query, clip and frame encoders' q/k/v (weight and bias each)
    ("gmmformer", None),
])
def test_the_unit_reaches_the_optimizer(method, expected):
    from prvr.harness.engine.build import build_model

    cfg = resolve(method, "sim-tiny", 0, ["train.grad_clip_unit=reference"])
    model = build_model(cfg, 48, 32)
    opt, _ = build_optimizer(model, cfg.train)
    counts: dict[int, int] = {}
    for g in opt.param_groups:
        counts[g["clip_parts"]] = counts.get(g["clip_parts"], 0) + len(g["params"])
    assert sum(counts.values()) == len(list(model.parameters()))
    if expected is not None:
        assert {k: v for k, v in counts.items() if k > 1} == expected
    else:  # GMMFormer's video encoders: every branch's q/k/v, map and norm split
        widths = len(cfg.model.widths)
        assert 3 * widths in counts and widths in counts
    default, _ = build_optimizer(model, resolve(method, "sim-tiny", 0).train)  # the default: each tensor whole
    assert len(default.param_groups) == 2 and all(g.get("clip_parts", 1) == 1 for g in default.param_groups)
