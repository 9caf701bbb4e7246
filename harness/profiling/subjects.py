"""What gets profiled: one model per method (its backbone with the method's presets), built at
given input dims, and random inputs of the loader's shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from prvr.datasets.loader import pooling_matrix
from prvr.harness.engine import build
from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.contract import as_backbone
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import run_tag
from prvr.harness.base.registry import METHODS
from prvr.harness.engine.sections import Config
from prvr.methods.fit import fitting_backbones

TVR_DIMS = (3072, 768)  # ResNet+I3D video features, RoBERTa token features (MS-SL release)


@dataclass
class Subject:
    """One row of the profile: its name (the method, or `method@backbone` on another backbone
    than the method's own, as run folders and leaderboard rows name it), the backbone and the
    resolved config."""

    method: str
    backbone: str
    cfg: Config

    @property
    def frames(self) -> int:
        return self.cfg.data.max_frames

    @property
    def clips(self) -> int:
        return self.cfg.data.num_clips

    @property
    def tokens(self) -> int:
        return self.cfg.data.max_query_len


def default_names() -> list[str]:
    """Every registered method on its own backbone, then each method that extends its
    backbone's home method (RAL) on every other backbone it fits: `ral@msl`, `ral@gmmformer`."""
    names = []
    for name in METHODS.names():
        spec = METHODS.get(name)
        names.append(name)
        if spec.extends_backbone:
            names += [f"{name}@{b}" for b in fitting_backbones(spec) if b != spec.backbone]
    return names


def subjects(methods: list[str] | None, dataset: str, overrides: list[str] | None = None) -> list[Subject]:
    """One subject per name (default: `default_names()`), configs resolved for `dataset`. A
    name `method@backbone` builds the method on that backbone (as `--backbone`, after the
    overrides)."""
    out = []
    for name in methods or default_names():
        method, _, backbone = name.partition("@")
        cfg = resolve(method, dataset, 0, [*(overrides or []), *([f"backbone={backbone}"] if backbone else [])])
        spec = METHODS.get(method)
        out.append(Subject(run_tag(method, spec.relations, spec.relations, cfg.backbone, spec.backbone), cfg.backbone,
                           cfg))
    return out


def build_model(subject: Subject, dims: tuple[int, int], device: torch.device | str = "cpu") -> torch.nn.Module:
    """The backbone as every command builds it (harness/engine/build.py; the subject's seed is 0), in
    eval mode, on `device`."""
    model = build.build_model(subject.cfg, *dims)
    return model.to(device).eval()


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def random_videos(n: int, frames: int, clips: int, dim: int, device: torch.device | str = "cpu",
                  seed: int = 0) -> VideoBatch:
    """`n` full-length videos: L2-normalised random frame rows, clips pooled as the loader does."""
    gen = torch.Generator().manual_seed(seed)
    feats = F.normalize(torch.randn(n, frames, dim, generator=gen), dim=-1)
    pool = torch.from_numpy(pooling_matrix(frames, clips)).expand(n, clips, frames).contiguous()
    batch = VideoBatch(feats, torch.ones(n, frames, dtype=torch.bool), F.normalize(pool @ feats, dim=-1), pool,
                       torch.arange(n))
    return batch.to(torch.device(device))


def random_queries(n: int, tokens: int, dim: int, device: torch.device | str = "cpu", seed: int = 1) -> QueryBatch:
    """`n` queries of `tokens` L2-normalised random token rows."""
    gen = torch.Generator().manual_seed(seed)
    feats = F.normalize(torch.randn(n, tokens, dim, generator=gen), dim=-1)
    return QueryBatch(feats, torch.ones(n, tokens, dtype=torch.bool), torch.arange(n)).to(torch.device(device))


def fused_scores(model: torch.nn.Module, queries: dict[str, Any], videos: dict[str, Any]) -> torch.Tensor:
    """The fused [Q, V] score matrix, the one the evaluator ranks by."""
    return as_backbone(model).score(queries, videos).fused
