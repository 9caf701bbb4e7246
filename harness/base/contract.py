"""The contract between the harness and its parts, as types (issue 37).

Methods, backbones, relation detectors, objectives and the harness's engine all import this
module, and it imports none of them: only torch, the plumbing below it (harness/base/masks.py) and
the batches beside it (harness/base/batches.py). What crosses a seam is declared here:

- the batches a backbone encodes and a step sees (`QueryBatch`, `VideoBatch`, `TrainBatch`,
  harness/base/batches.py);
- a backbone's two sides, `Encoded` (named tensors; the keys are the backbone's, the outputs it
  `provides` are listed in methods/backbones/api.py OUTPUTS), and its `Scores`;
- a training step's forward pass, `StepOutputs` {"queries", "videos", "scores", "extras"}, its
  extras what a backbone with `step_extras` (`StepExtras`) computes for its objective alone;
- a detector's answer, `Relations`, and what its hooks see of training, `DetectorState`;
- what an objective gets besides scores and relations, `StepContext`, and what it returns,
  `LossOutput` (the loss, its named parts, and diagnostics kept apart: all logged, only the
  loss and its parts checked);
- the parts themselves: the `Backbone` and `RelationDetector` protocols (and `StepExtras`, a
  backbone's optional part), an `Objective`,
  `MethodSpec` (what `--method NAME` means) and `DatasetEntry` (a registered dataset).

The registries of harness/base/registry.py are typed with these (`Registry[MethodSpec]`, ...).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol, TypedDict, TypeVar, cast, runtime_checkable

import torch

from prvr.harness.base import masks
from prvr.harness.base.batches import QueryBatch, TrainBatch, VideoBatch

# One side of a pair as a backbone encodes it: named tensors, e.g. {"query": [Q, d]} or
# {"clips": [B, C, d], "frames": [B, T, d], "frame_mask": [B, T]}.
Encoded = dict[str, torch.Tensor]


_V = TypeVar("_V")  # what an `OnDemand` holds

LOSS = "loss"  # the key of the loss itself among what a step logs


@dataclass
class LossOutput(Mapping[str, torch.Tensor]):
    """What a method's objective returns.

    loss: the 0-d tensor that is backpropagated.
    parts: its named terms (0-d tensors, e.g. "clip_triplet", "ral_da"), which the trainer sums
        per epoch into the run's history; a method that extends another adds its own.
    diagnostics: named 0-d figures that are no term of the loss (detached; e.g. RAL's batch
        uncertainty "ral_sigma_text"): logged beside the parts, left out of the loss checks (an
        epoch whose loss and parts are all exactly 0 is degenerate, whatever its diagnostics).

    As a mapping it is everything a step logs, in the history's order: the parts, "loss", the
    diagnostics (`out["ral_da"]`, `out["loss"]`)."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        named = self.parts.keys() | self.diagnostics.keys()
        clash = sorted((self.parts.keys() & self.diagnostics.keys()) | ({LOSS} & named))
        if clash:
            raise ValueError(f"a loss output names {clash} twice: the loss, each part and each diagnostic "
                             "need names of their own")

    def __getitem__(self, key: str) -> torch.Tensor:
        if key == LOSS:
            return self.loss
        return self.parts[key] if key in self.parts else self.diagnostics[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.parts
        yield LOSS
        yield from self.diagnostics

    def __len__(self) -> int:
        return len(self.parts) + 1 + len(self.diagnostics)

    def detached(self) -> LossOutput:
        """The same figures cut from the graph (what the trainer keeps of a step)."""
        return LossOutput(self.loss.detach(), {k: v.detach() for k, v in self.parts.items()},
                          {k: v.detach() for k, v in self.diagnostics.items()})


class OnDemand(Mapping[str, _V]):
    """A mapping whose keys are fixed and whose values are computed on first access: scores
    that only the losses read (GMMFormer's raw dot products) cost evaluation nothing; a step's
    extras (`StepExtras`) are computed where the objective reads them."""

    def __init__(self, makers: dict[str, Callable[[], _V]]) -> None:
        self._makers = makers
        self._made: dict[str, _V] = {}

    def __getitem__(self, key: str) -> _V:
        if key not in self._made:
            self._made[key] = self._makers[key]()
        return self._made[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


@dataclass
class Scores:
    """What `score` returns, in training and evaluation alike.

    fused: [Q, V], the score the evaluator ranks by.
    branches: named [Q, V] scores that `fused` combines (e.g. clip and frame; ARL's theta, phi).
    raw: named [Q, V] scores before normalisation, by branch (e.g. MS-SL's dot products); a
        backbone may give them `OnDemand`, computed when read.
    items: named [Q, V, N] per-item similarities, by branch (e.g. ARL's text-frame level).
    """

    fused: torch.Tensor
    branches: dict[str, torch.Tensor] = field(default_factory=dict)
    raw: Mapping[str, torch.Tensor] = field(default_factory=dict)
    items: dict[str, torch.Tensor] = field(default_factory=dict)

    def ranked(self) -> dict[str, torch.Tensor]:
        """Every [Q, V] score that can be ranked on its own: the branches and `fused`."""
        return {**self.branches, "fused": self.fused}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by a flat name: fused, the branches, raw.<branch>, items.<branch>."""
        return {"fused": self.fused, **self.branches, **{f"raw.{k}": t for k, t in self.raw.items()},
                **{f"items.{k}": t for k, t in self.items.items()}}

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Scores:
        """The same fields with `fn` applied to every tensor."""
        return Scores(fn(self.fused), {k: fn(t) for k, t in self.branches.items()},
                      {k: fn(t) for k, t in self.raw.items()}, {k: fn(t) for k, t in self.items.items()})

    @staticmethod
    def cat(parts: list[Scores]) -> Scores:
        """Scores of consecutive slices of the queries, joined along the queries (what was on
        demand stays on demand)."""
        def join(dicts: list[Mapping[str, torch.Tensor]]) -> Any:
            if any(isinstance(d, OnDemand) for d in dicts):
                return OnDemand({k: partial(_cat_key, dicts, k) for k in dicts[0]})
            return {k: torch.cat([d[k] for d in dicts]) for k in dicts[0]}

        return Scores(torch.cat([p.fused for p in parts]), join([p.branches for p in parts]),
                      join([p.raw for p in parts]), join([p.items for p in parts]))


def _cat_key(dicts: list[Mapping[str, torch.Tensor]], key: str) -> torch.Tensor:
    return torch.cat([d[key] for d in dicts])


class StepOutputs(TypedDict):
    """A training step's forward pass, as the trainer hands it to the detector and, through
    `StepContext.outputs`, to the objective. extras: what the backbone computes for its
    objective alone (`StepExtras.step_extras`, e.g. RAL's Gaussians under "ral.gaussians"),
    keyed by the backbone; {} from a backbone without it."""

    queries: Encoded
    videos: Encoded
    scores: Scores
    extras: Mapping[str, object]


@dataclass
class Relations:
    """Relations of a batch's queries (rows) to its videos (columns).

    positive: treated as matching; ambiguous: neither positive nor negative (how an
    objective treats them is its business); every other pair is negative. confidence
    in [0, 1] says how sure the detector is about each positive / ambiguous pair.
    moments (optional, from detectors that know them): [Q, B, 2] seconds [start, end] of the
    moment a pair carries, NaN where it carries none; a potentially relevant pair (q_i, v_j)
    of the SBERT detector carries the moment of the matching query q_j in v_j. Keyword-only,
    so subclasses keep their positional fields.
    """

    positive: torch.Tensor  # [Q, B] bool
    ambiguous: torch.Tensor  # [Q, B] bool, disjoint from positive
    confidence: torch.Tensor  # [Q, B] float
    moments: torch.Tensor | None = field(default=None, kw_only=True)  # [Q, B, 2] seconds, NaN = none

    @property
    def negative(self) -> torch.Tensor:
        return ~(self.positive | self.ambiguous)

    @staticmethod
    def one_to_one(query_item: torch.Tensor, num_videos: int) -> Relations:
        """The labels: query q is positive with video query_item[q] only. The positive mask is
        described (harness/base/masks.py: its pairs, one per row, and whether every column has one,
        as the loader found), so the losses read its pairs without asking the device."""
        rows = torch.arange(len(query_item), device=query_item.device)
        positive = torch.zeros(len(query_item), num_videos, dtype=torch.bool, device=query_item.device)
        positive.scatter_(1, query_item[:, None], True)  # not `[rows, item] = True`: a host scalar copied to the GPU
        every_video = masks.known(query_item).covers == num_videos or None
        index = rows * num_videos + query_item
        host_item = masks.known(query_item).host  # as the loader described it: the index's host copy from it
        if host_item is not None:
            masks.describe(index, host=torch.arange(len(host_item)) * num_videos + host_item)
        masks.describe(positive, index=index, rows=True, cols=every_video)
        return Relations(positive, torch.zeros_like(positive), positive.float())


@dataclass
class DetectorState:
    """What a detector's hooks see of training.

    model: the model being trained (a detector may run passes of its own with it, e.g.
    encode the training split in eval mode); train: the training split's batcher
    (`train.split` the split, `train.videos(idx)` / `train.queries(idx)` batches of it, as the
    trainer builds them); last_epoch: training ends after this epoch (early stop or the cap;
    known at epoch end)."""

    epoch: int
    model: torch.nn.Module
    device: torch.device
    data: Any  # the run's PRVRData (datasets/types.py)
    train: Any  # the training split's Batcher (datasets/loader.py)
    last_epoch: bool = False


@dataclass
class StepContext:
    """What an objective may need besides scores and relations."""

    epoch: int
    step: int
    generator: torch.Generator
    batch: TrainBatch  # the step's videos with all their queries (harness/base/batches.py)
    outputs: StepOutputs  # the step's forward pass
    # [Q] each query's labelled video, as a column of the batch's videos (from the labels, never
    # from a detector): which queries belong to which video
    video_of_query: torch.Tensor


# A method's objective: objective(loss config, scores, relations, context) -> LossOutput; a method
# that extends its backbone's method also gets `base=` that method's objective (MethodSpec).
Objective = Callable[..., LossOutput]
# A registered objective part (`OBJECTIVES`, methods/objectives/): a pure loss function of tensors
# that a method's objective combines, giving one term or a loss with its named parts (ARL's
# {"nce", "trip_a", "trip_n", "loss"}).
ObjectivePart = Callable[..., torch.Tensor | dict[str, torch.Tensor]]


@runtime_checkable
class Backbone(Protocol):
    """What every backbone provides (methods/backbones/api.py says what each method is for)."""

    config_cls: type[Any]  # its `model` config dataclass (no common base); a class attribute
    provides: ClassVar[frozenset[str]]

    # how harness/engine/build.py makes one: (its `model` config, the video and query feature dims)
    def __init__(self, cfg: Any, video_dim: int, query_dim: int, /) -> None: ...

    def encode_queries(self, batch: QueryBatch, /) -> Encoded: ...

    def encode_videos(self, batch: VideoBatch, /) -> Encoded: ...

    def index_videos(self, videos: Encoded, /) -> Encoded: ...

    def score(self, queries: Encoded, videos: Encoded, /) -> Scores: ...


def as_backbone(model: torch.nn.Module) -> Backbone:
    """The model as its backbone protocol: every model a run builds is a backbone, or a wrapper
    that is one (harness/engine/build.py `build_model`), which `nn.Module`'s type cannot say."""
    return cast(Backbone, model)


@runtime_checkable
class StepExtras(Protocol):
    """An optional part of a backbone: what it computes in a training step for its method's
    objective alone, beyond the scores (RAL: its Gaussians, methods/backbones/ral.py), from the
    step's encodings and `video_of_query` (as `StepContext`'s). The trainer calls it after
    `score`, for any model that has it, and hands the result on as the step outputs' `extras`;
    a value may be `OnDemand`, computed where the objective first reads it, so an objective
    that reads nothing costs nothing and the objective need not call back into the model."""

    def step_extras(self, queries: Encoded, videos: Encoded,
                    video_of_query: torch.Tensor, /) -> Mapping[str, object]: ...


class RelationDetector(Protocol):
    """What every relation detector provides (methods/relations/base.py `Detector` is the base
    class that gives each method a default)."""

    needs: ClassVar[frozenset[str]]
    config_cls: ClassVar[type | None]
    finds_pairs: ClassVar[bool]  # hands over pairs beyond the labels (ambiguous, or positives by a mode)
    doubts_labels: ClassVar[bool]  # gives some labelled pairs a confidence below 1 (read by loss.treatment=soft)

    # how harness/engine/build.py makes one: from the run's Config (harness/engine/sections.py, a floor above)
    def __init__(self, cfg: Any, /) -> None: ...

    def setup(self, data: Any, plan: Any = None, /) -> None: ...

    # what setup would compute in every run, cached once before runs fan out; a line or None
    def prepare(self, data: Any, /) -> str | None: ...

    def on_epoch_start(self, state: DetectorState) -> None: ...

    def on_step(self, state: DetectorState, step: int, out: LossOutput) -> None: ...

    def on_epoch_end(self, state: DetectorState, summary: dict) -> None: ...

    def detect(self, batch: TrainBatch, outputs: StepOutputs, /) -> Relations: ...

    def epoch_report(self) -> dict: ...

    def write_artifacts(self, folder: Any, stem: str) -> list[str]: ...


@dataclass(frozen=True)
class MethodSpec:
    """What `--method NAME` means.

    objective(loss_cfg, scores, relations, context) -> LossOutput (the loss, its named parts,
    diagnostics apart);
    scores is the backbone's `Scores`; context (`StepContext`) carries the epoch, the step, a
    torch.Generator for sampling, the batch, the step's outputs {"queries", "videos",
    "scores", "extras"} (`StepOutputs`; what the model computes for the objective alone is in
    its extras, so no objective calls back into the model) and `video_of_query` (each query's
    labelled video in the batch, from the labels).
    needs: the backbone outputs the objective reads (methods/backbones/api.py OUTPUTS);
    a backbone that does not provide them is refused (methods/fit.py).
    sections: method-specific config sections {name: dataclass}.
    detector_plan(loss_cfg) -> what the method asks of its detector (given to
    `Detector.setup`), e.g. ARL's variant and warm-up; None: nothing.
    extends_backbone, wrap: see the fields.
    objectives: the registered objective parts (`OBJECTIVES`, methods/objectives/) that the
    objective combines, e.g. ("msl-triplet", "infonce"); `prvr-bench list` shows them and
    tests/test_registries.py checks that each is registered and that they are exactly the
    registered parts the objective calls.
    """

    name: str
    backbone: str
    relations: str
    loss_cls: type
    objective: Objective
    preset: Path | None = None
    sections: dict[str, type] = field(default_factory=dict)
    needs: frozenset[str] = frozenset()
    detector_plan: Callable[[Any], Any] | None = None
    objectives: tuple[str, ...] = ()
    # A method that extends the method whose own backbone it runs on (its home method, e.g.
    # RAL on msl / gmmformer / gmmformer2): the home method's preset applies under this
    # method's, the `loss` section joins the home method's loss fields and `loss_cls`'s, and
    # `objective(..., base=<the home method's objective>)` gets the home method's objective.
    extends_backbone: bool = False
    # wrap(backbone, cfg, video_dim, query_dim) -> the run's model (e.g. RAL's modules around
    # the backbone); None: the backbone itself
    wrap: Callable[..., torch.nn.Module] | None = None
    # the row the leaderboard's moment table compares every row with (its Δ VCMR SumR): the
    # moment retrieval method the others build on (XML, the SBERT-PR paper's base); one method
    moment_reference: bool = False
    # the row every row of its dataset is compared with (Δ SumR), and the method whose recipe loads a
    # dataset where any method would do: the plain label-trained method the others improve on; one method
    reference: bool = False
    # the tag of the method's ablation row (methods/recipes.py) that trains it without its label-noise
    # mechanism, its encoder and loss alone (ARL: "base", Table 5 row (a)): a sweep measures the method's
    # gain against that row (harness/reports/sweeps.py `base_of`); "": against its home method, if any
    base_row: str = ""
    # the tag of the ablation row a matrix cell on the method's backbone starts from when it trains a detector's
    # pairs with the method's own objective (ARL: "tv_only", Table 5 row (b), the text-video sets alone, without
    # the frame loss and cross-model hand-off that `base_row` lacks too), so that such a cell differs from the
    # plain cell (`base_row`) by the detector and the treatment alone; "": the method as registered
    treatment_row: str = ""

    def treated_tag(self, treatment: str) -> str:
        """The tag of a matrix cell training `treatment` from `treatment_row`: the row's own where the treatment is
        the loss's default (ARL's restrain: `arl~tv_only`, the ablation row's run), else `ROW-TREATMENT`
        (`arl+oracle~tv_only-ignore`); "" without a treatment row."""
        if not self.treatment_row:
            return ""
        return self.treatment_row if treatment == self._default_treatment() else f"{self.treatment_row}-{treatment}"

    def treatment_of(self, tag: str) -> str:
        """The treatment a cell tag of `treated_tag` names (`tv_only-ignore` -> `ignore`, `tv_only` -> the loss's
        default); `tag` itself where the method has no treatment row or the tag is not one of its cells'."""
        if not self.treatment_row:
            return tag
        if tag == self.treatment_row:
            return self._default_treatment() or tag
        head, sep, treatment = tag.partition("-")
        return treatment if sep and head == self.treatment_row else tag

    def _default_treatment(self) -> str:
        """The default of the loss's `treatment` field ("" where it has none)."""
        if not is_dataclass(self.loss_cls):
            return ""
        found = [f.default for f in fields(self.loss_cls) if f.name == "treatment"]
        return str(found[0]) if found and found[0] is not MISSING else ""


class DatasetEntry(Protocol):
    """A registered dataset (datasets/base.py `DatasetSpec`): `load(config)` gives its PRVRData,
    `load_truth(config)` its test split's ground truth; `preset` holds its defaults."""

    @property
    def name(self) -> str: ...

    @property
    def preset(self) -> Path: ...

    @property
    def simulated(self) -> bool: ...

    def load(self, cfg: Any) -> Any: ...

    def load_truth(self, cfg: Any) -> Any: ...  # the test split's ids, labels and relevance; features maybe empty
