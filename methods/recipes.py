"""A method is a named recipe: backbone + relation detector + objectives + defaults, plus the
ablation tables of its paper (rows of config overrides that `prvr-bench ablate` trains and
tabulates)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

PRESETS = Path(__file__).parent / "presets"


@dataclass(frozen=True)
class MethodSpec:
    """What `--method NAME` means.

    objective(loss_cfg, scores, relations, context) -> dict with `loss` and its named parts;
    scores is the backbone's `Scores`; context (harness/trainer.py StepContext) carries the
    epoch, the step, a torch.Generator for sampling, the batch, the step's outputs
    {"queries", "videos", "scores"}, the model (for trainable heads of the objective) and
    `video_of_query` (each query's labelled video in the batch, from the labels).
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
    objective: Callable[..., dict[str, Any]]
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
    wrap: Callable[..., Any] | None = None


@dataclass(frozen=True)
class AblationRow:
    label: str  # as in the paper, e.g. "(b)"
    tag: str  # run-name suffix; "" = the method's plain run
    overrides: tuple[str, ...]  # --set items
    marks: tuple[str, ...] = ()  # the table's descriptive columns (e.g. check marks)
    # the row is the plain run of the backbone's own method (e.g. `msl` in RAL's Table 2 on MS-SL),
    # trained or read as that method's run; for a row that a test shows to train identically
    # to it (tests/test_ral.py), so that the same run is not trained twice under two names
    home: bool = False


@dataclass(frozen=True)
class AblationTable:
    method: str
    name: str  # e.g. "5"
    title: str
    columns: tuple[str, ...]  # headers of `marks`
    rows: tuple[AblationRow, ...]
    reference: str = ""  # label of the row the others are compared with (Δ SumR, paired over seeds); "" = the first
    # the paper's figures per row label: (R@1, R@5, R@10, R@100, SumR), shown under the table
    reported: dict[str, tuple[float, ...]] = field(default_factory=dict)
    reported_source: str = ""  # where they come from, e.g. "RAL paper Table 2, TVR, ResNet+I3D+RoBERTa"
    # the paper's figures with any metric keys (e.g. VCMR / SVMR): the rows of methods/reported.yaml
    # whose `source` is one of these, e.g. ("SBERT-PR Table 7",), shown under the table in the file's
    # order; a row whose `label` is one of this table's row labels stands for that row
    reported_from: tuple[str, ...] = ()


TABLES: dict[tuple[str, str], AblationTable] = {}


def register_table(table: AblationTable) -> None:
    key = (table.method, table.name)
    if key in TABLES:
        raise ValueError(f"duplicate ablation table {table.method} {table.name}")
    TABLES[key] = table
