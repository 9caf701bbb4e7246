"""Optimizers and learning-rate schedules, as registered parts (`train.optimizer`, `train.decay`).

- `adamw`: torch AdamW (bias-corrected), one global gradient-norm clip by the trainer
  (`train.grad_clip`), no weight decay on 1-D tensors and embedding (positional) tables. The harness's own
  choice, used by the baseline.
- `bertadam`: the optimizer of the whole MS-SL code family (MS-SL, GMMFormer, GMMFormer v2,
  RAL-PRVR all ship a copy of the pre-AdamW Hugging Face `BertAdam`). Written here from its
  documented behaviour (shared facts: no bias correction, eps 1e-6, each parameter tensor's
  gradient clipped to norm `max_grad_norm` separately inside the step, decoupled weight decay
  added to the update, no decay on biases and LayerNorm parameters). Where one tensor here holds
  several of the reference's (the q/k/v of every Gaussian branch in one product, one map or norm
  per branch stacked), `train.grad_clip_unit=reference` clips each of those parts to the bound on
  its own, as the reference's separate tensors are; `tensor` (the default) clips the whole.
  A module says how its tensors split with `reference_parts()` (methods/backbones/blocks.py).

Schedules (`train.decay`) are multipliers of the base learning rate by optimizer step k
(0-based, the k-th update uses f(k)): `cosine`, `linear`, `constant` after the harness's
linear warm-up of `warmup_frac` of all steps, and `warmup_linear`, the reference's rule over
progress p = k / total: p / warmup while p < warmup, then max((p - 1) / (warmup - 1), 0)
(so its first update has learning rate 0, and the last has lr / (total (1 - warmup))).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, get_args

import torch
from torch import nn

from prvr.harness.base.registry import Registry

Decay = Literal["cosine", "linear", "constant", "warmup_linear"]  # train.decay
DECAYS: tuple[Decay, ...] = get_args(Decay)


@dataclass(frozen=True)
class OptimizerSpec:
    """How to build one optimizer. `clips_inside`: the optimizer bounds gradients itself
    (per parameter), so the trainer adds no global clip."""

    build: Callable[[nn.Module, "object"], torch.optim.Optimizer]
    clips_inside: bool = False


OPTIMIZERS: Registry[OptimizerSpec] = Registry("optimizer")


# ----------------------------------------------------------------------------- BertAdam
class BertAdam(torch.optim.Optimizer):
    """Adam without bias correction, per-parameter gradient clipping and decoupled weight decay.

    For each parameter p with gradient g (state m, v start at 0):
        g <- g * min(1, max_grad_norm / ||g||)          (when max_grad_norm > 0; norm of p's own gradient,
                                                         or of each of the group's `clip_parts` equal
                                                         slices of p along its first dimension)
        m <- b1 m + (1 - b1) g ;  v <- b2 v + (1 - b2) g^2
        p <- p - lr_t (m / (sqrt(v) + eps) + weight_decay p)
    lr_t is the group's learning rate, which the harness's schedule sets every step.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, max_grad_norm: float = 1.0) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                n_parts = group.get("clip_parts", 1)
                if group["max_grad_norm"] > 0 and n_parts == 1:
                    norm = torch.linalg.vector_norm(grad)
                    grad.mul_((group["max_grad_norm"] / (norm + 1e-6)).clamp(max=1.0))
                elif group["max_grad_norm"] > 0:  # each slice of the first dimension on its own
                    parts = grad.view(n_parts, -1)
                    norm = torch.linalg.vector_norm(parts, dim=1, keepdim=True)
                    parts.mul_((group["max_grad_norm"] / (norm + 1e-6)).clamp(max=1.0))
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"] > 0:
                    update.add_(p, alpha=group["weight_decay"])
                p.add_(update, alpha=-group["lr"])
                state["step"] += 1
        return loss


# ----------------------------------------------------------------------------- decay groups
def harness_groups(model: nn.Module) -> tuple[list, list]:
    """(decay, no decay) of `adamw`: 1-D tensors (biases, norms) and the weights of embedding
    tables (the backbones' learned positions) are not decayed; recognised by shape and module
    type, never by parameter name."""
    tables = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.dim() < 2 or id(p) in tables else decay).append(p)
    return decay, no_decay


def reference_groups(model: nn.Module) -> tuple[list, list]:
    """(decay, no decay) of the MS-SL family scripts: biases and LayerNorm parameters are not
    decayed, everything else is (positional tables included). The scripts match parameter
    names (`bias`, `LayerNorm.weight`); here LayerNorm is recognised by module type, so a
    norm under another attribute name is treated as one."""
    norms: set[int] = set()  # ids of the norms' parameters
    for module in model.modules():
        if isinstance(module, nn.LayerNorm) or type(module).__name__ == "BranchLayerNorm":
            norms.update(id(p) for p in module.parameters(recurse=False))
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if id(p) in norms or name.split(".")[-1].endswith("bias") else decay).append(p)
    return decay, no_decay


def _groups(decay: list, no_decay: list, weight_decay: float) -> list[dict]:
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def reference_parts(model: nn.Module) -> dict[int, int]:
    """{id(parameter): parts} for each parameter that holds several tensors of the reference
    code, stacked along its first dimension, as its module's `reference_parts()` says
    ({parameter name under that module, dotted: parts}); a parameter not named there is one
    tensor of the reference."""
    parts: dict[int, int] = {}
    for module in model.modules():
        split = getattr(module, "reference_parts", None)
        if callable(split):
            for name, n in split().items():
                if n > 1:
                    parts[id(module.get_parameter(name))] = n
    return parts


def split_groups(groups: list[dict], parts: dict[int, int]) -> list[dict]:
    """Each group split by its parameters' part counts (`clip_parts`, 1 for a whole tensor), in
    the order of the groups and of first appearance: BertAdam clips each part on its own."""
    out: list[dict] = []
    for group in groups:
        by_parts: dict[int, list] = {}
        for p in group["params"]:
            by_parts.setdefault(parts.get(id(p), 1), []).append(p)
        out.extend({**group, "params": params, "clip_parts": n} for n, params in by_parts.items())
    return out


class _AdamW(torch.optim.AdamW):
    """torch AdamW without its CUDA-graph capture check where no parameter is on a GPU. torch runs
    that check in every step on any machine with CUDA, and it asks for the current CUDA stream,
    which initialises CUDA: a CPU run on a GPU machine would hold a context on GPU 0 (hundreds of
    MB, and an error on a GPU in exclusive-process mode). A CPU step is never captured in a CUDA
    graph, so there is nothing to check (tests/test_devices.py)."""

    def _accelerator_graph_capture_health_check(self) -> None:
        if any(p.device.type != "cpu" for group in self.param_groups for p in group["params"]):
            super()._accelerator_graph_capture_health_check()


def _adamw(model: nn.Module, train) -> torch.optim.Optimizer:
    return _AdamW(_groups(*harness_groups(model), train.weight_decay), lr=train.lr)


def _bertadam(model: nn.Module, train) -> torch.optim.Optimizer:
    # b1 0.9, b2 0.999, e 1e-6: BertAdam's defaults, which no MS-SL family script changes
    groups = _groups(*reference_groups(model), train.weight_decay)
    if train.grad_clip_unit == "reference":
        groups = split_groups(groups, reference_parts(model))
    return BertAdam(groups, lr=train.lr, eps=1e-6, max_grad_norm=train.grad_clip)


OPTIMIZERS.add("adamw", OptimizerSpec(_adamw),
               "torch AdamW, one global gradient-norm clip (train.grad_clip); the harness's choice")
OPTIMIZERS.add("bertadam", OptimizerSpec(_bertadam, clips_inside=True),
               "BertAdam of the MS-SL code family: no bias correction, each parameter clipped to train.grad_clip, eps 1e-6")


def build_optimizer(model: nn.Module, train) -> tuple[torch.optim.Optimizer, OptimizerSpec]:
    spec = OPTIMIZERS.get(train.optimizer)
    return spec.build(model, train), spec


# ----------------------------------------------------------------------------- schedules
def lr_lambda(total_steps: int, warmup_frac: float, decay: str) -> Callable[[int], float]:
    """The multiplier of the base learning rate at optimizer step k (see the module docstring)."""
    if decay == "warmup_linear":
        return warmup_linear(total_steps, warmup_frac)
    warm = max(1, int(round(warmup_frac * total_steps)))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        t = min(1.0, (step - warm) / max(1, total_steps - warm))
        if decay == "cosine":
            return 0.5 * (1 + math.cos(math.pi * t))
        if decay == "linear":
            return 1.0 - t
        return 1.0

    return f


def warmup_linear(total_steps: int, warmup: float) -> Callable[[int], float]:
    """The reference's `warmup_linear` at step k: progress p = k / total; p / warmup during the
    warm-up, then linear to 0 at p = 1 (never negative)."""

    def f(step: int) -> float:
        p = step / max(1, total_steps)
        if p < warmup:
            return p / warmup
        return max((p - 1.0) / (warmup - 1.0), 0.0)

    return f
