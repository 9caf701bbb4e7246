"""One way to build a run from a resolved config: data, backbone, detector, objective, trainer.

`prvr-bench run`, `evaluate`, `profile` and `ablate` all build through here, so a run that
trains, one that is re-evaluated and one that is profiled are the same model built the same
way (seeded by the run's seed before the backbone's weights are drawn).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch

from prvr.datasets.sim.cache import cache_root
from prvr.harness.base.contract import MethodSpec, RelationDetector
from prvr.harness.base.devices import pick_device
from prvr.harness.engine.precision import compile_caches_under, set_encoders, warn_where_compile_starts_cuda
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS, extended_home
from prvr.harness.engine.checkpoints import load_weights, official_weights, read_weights_file
from prvr.harness.engine.record_types import InitWeights
from prvr.harness.engine.sections import Config
from prvr.harness.base.timing import Timings
from prvr.harness.engine.trainer import Trainer, seed_everything


def build_model(cfg: Config, video_dim: int, query_dim: int) -> torch.nn.Module:
    """The run's model at the given input dims: the backbone, its weights drawn after seeding
    with the run's seed (as every command builds it), wrapped by the method where it adds
    modules of its own (`MethodSpec.wrap`, e.g. RAL), whose weights are drawn after the
    backbone's."""
    seed_everything(cfg.seed)
    backbone = BACKBONES.get(cfg.backbone)(cfg.model, video_dim, query_dim)
    spec = METHODS.get(cfg.method)
    # every backbone is an nn.Module (methods/backbones/api.py), which its protocol cannot say
    model = spec.wrap(backbone, cfg, video_dim, query_dim) if spec.wrap is not None else cast(torch.nn.Module, backbone)
    if cfg.train.compile:
        warn_where_compile_starts_cuda(pick_device(cfg.train.device))
        compile_caches_under(cache_root(cfg.data.cache_dir))  # not the system's temporary folder
    return set_encoders(model, cfg.train.precision, cfg.train.compile)  # train.precision / compile, everywhere


def method_spec(cfg: Config) -> MethodSpec:
    """The method's spec for this run: for a method that extends its backbone's home method
    (`MethodSpec.extends_backbone`), its objective gets the home method's objective as `base`
    and its detector plan is the home method's unless it has its own."""
    spec = METHODS.get(cfg.method)
    home = extended_home(spec, cfg.backbone)
    if home is None:
        return spec
    return replace(spec, objective=partial(spec.objective, base=home.objective),
                   detector_plan=spec.detector_plan or home.detector_plan)


@dataclass
class Run:
    """The parts of one run. `trainer(...)` joins them into a Trainer."""

    cfg: Config
    data: Any
    spec: MethodSpec  # the objective and its config classes
    model: torch.nn.Module
    detector: RelationDetector
    timings: Timings = field(default_factory=Timings)
    started_from: InitWeights | None = None  # the weights of train.init_weights, by name and digest

    def trainer(self, ckpt_dir: str | Path, hooks: list | None = None) -> Trainer:
        return Trainer(self.cfg, self.data, self.model, self.spec, self.detector, Path(ckpt_dir), hooks,
                       self.timings)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def load_data(cfg: Config, timings: Timings | None = None) -> Any:
    """The run's dataset (cached on disk by the dataset's own loader)."""
    timings = timings or Timings()
    with timings("data"):
        return DATASETS.get(cfg.dataset).load(cfg)


def build_run(cfg: Config, data: Any = None, timings: Timings | None = None) -> Run:
    """Data (loaded unless given), the backbone (seeded), the detector (set up on the data) and
    the method's spec. An unknown detector fails before any data is made."""
    timings = timings or Timings()
    detector_cls = DETECTORS.get(cfg.relations.name)
    spec = method_spec(cfg)
    if data is None:
        data = load_data(cfg, timings)
    model = build_model(cfg, data.video_dim, data.query_dim)
    started_from = start_from(model, cfg) if cfg.train.init_weights else None
    detector = detector_cls(cfg)
    detector.setup(data, spec.detector_plan(cfg.loss) if spec.detector_plan is not None else None)
    return Run(cfg, data, spec, model, detector, timings, started_from)


def start_from(model: torch.nn.Module, cfg: Config) -> InitWeights:
    """The official weights of `train.init_weights` in the freshly built `model`, through its backbone's map
    (`checkpoints.official_weights`; one line where they do not fit); the file's name and digest, for the record."""
    path = Path(cfg.train.init_weights)
    data = read_weights_file(path, "train.init_weights")
    weights = official_weights(path, cfg.backbone, cfg.model, model, option="train.init_weights", data=data)
    load_weights(model, weights, path, "convert the official code's weights of this run's model and settings "
                 "(docs/parity.md), or unset train.init_weights")
    return {"file": path.name, "sha256": hashlib.sha256(data).hexdigest()}
