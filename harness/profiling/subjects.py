"""What gets profiled: one model per method (its backbone with the method's presets), built at
given input dims, and random inputs of the loader's shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from prvr.datasets.loader import QueryBatch, VideoBatch, pooling_matrix
from prvr.harness.config import Config, resolve
from prvr.harness import build
from prvr.harness.registry import METHODS

TVR_DIMS = (3072, 768)  # ResNet+I3D video features, RoBERTa token features (MS-SL release)


@dataclass
class Subject:
    """One row of the profile: a method, its backbone and its resolved config."""

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


def subjects(methods: list[str] | None, dataset: str, overrides: list[str] | None = None) -> list[Subject]:
    """One subject per method (default: every registered method), configs resolved for `dataset`."""
    out = []
    for name in methods or METHODS.names():
        cfg = resolve(name, dataset, 0, list(overrides or []))
        out.append(Subject(name, cfg.backbone, cfg))
    return out


def build_model(subject: Subject, dims: tuple[int, int], device: torch.device | str = "cpu") -> torch.nn.Module:
    """The backbone as every command builds it (harness/build.py; the subject's seed is 0), in
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
    return model.score(queries, videos).fused
