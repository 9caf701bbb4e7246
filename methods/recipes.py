"""A method is a named recipe: backbone + relation detector + objectives + defaults, plus the
ablation tables of its paper (rows of config overrides that `prvr-bench ablate` trains and
tabulates)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# What `--method NAME` means is part of the contract (harness/base/contract.py); importable from here too.
from prvr.harness.base.contract import MethodSpec  # noqa: F401

PRESETS = Path(__file__).parent / "presets"


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
