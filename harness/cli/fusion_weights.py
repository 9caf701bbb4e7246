"""`prvr-bench evaluate RECORD... --fusion-weights`: the branch weights of every dynamic GMM block
(GMMFormer v2 and RAL on it) over a split's videos, from each run's best checkpoint: the mean
weight each Gaussian branch gets over all real positions, and the mean of the largest weight at
a position (1 / branches when uniform).

An analysis GMMFormer v2 brings to `evaluate`: this module registers its `rows` and `format_rows` in
`reevaluate.EVALUATIONS`, so the evaluate command itself knows no block of any method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from prvr.datasets.loader import Batcher
from prvr.harness.base import progress
from prvr.harness.base.contract import as_backbone
from prvr.harness.base.encoding import VIDEO_BATCH, encode_all
from prvr.harness.base.io import UserError
from prvr.harness.cli.reevaluate import EVALUATIONS, Analysis, StoredRun, split_data
from prvr.harness.reports.table import markdown_table
from prvr.methods.backbones.blocks import DynamicGMMBlock


def rows(record_files: list[str | Path], split_name: str = "test", device: str = "auto",
         data_root: str | None = None) -> list[dict[str, Any]]:
    """Rows {run, record, block, widths, mean, max_mean, positions} for each dynamic GMM block
    (`blocks.DynamicGMMBlock`) of each run, read while the split's videos are encoded from the
    best checkpoint: `mean[b]` is branch b's weight averaged over every real position of every
    video, `max_mean` the largest weight at a position, averaged."""
    out: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for run in (StoredRun(f, device, data_root) for f in record_files):
        data = split_data(run, split_name, datasets)
        model = run.model(data)
        blocks = {name: m for name, m in model.named_modules() if isinstance(m, DynamicGMMBlock)}
        if not blocks:
            raise UserError(f"{run.path}: its model ({run.record.get('method')}) has no dynamic GMM block, so no "
                            "branch weights; --fusion-weights is for GMMFormer v2 and RAL on it")
        seen: dict[str, list[torch.Tensor]] = {name: [] for name in blocks}
        for name, block in blocks.items():
            # an instance attribute over the method: this model only
            setattr(block, "branch_weights", _recording(block.branch_weights, seen[name]))
        progress.log(f"evaluate {run.name}: branch weights of {', '.join(blocks)} on {split_name}")
        split = data[split_name]
        with torch.no_grad():  # the videos only: the weights are the video encoders'
            encode_all(as_backbone(model).encode_videos, Batcher(split, run.cfg.data).videos, split.num_videos,
                       VIDEO_BATCH, run.device)
        for name, block in blocks.items():
            w = torch.cat(seen[name], dim=1).double()  # [branches, real positions]
            out.append({"run": run.name, "record": str(run.path), "block": name,
                        "widths": list(block.branches.widths), "positions": w.shape[1],
                        "mean": w.mean(1).tolist(), "max_mean": w.max(0).values.mean().item()})
    return out


def _recording(fn: Callable[..., torch.Tensor], store: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
    def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = fn(*args, **kwargs)
        store.append(out.detach().cpu())
        return out
    return wrapped


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, one line per run and block."""
    header = ["run", "block", "positions", "mean weight per branch (width)", "mean largest weight", "uniform"]
    table = []
    for r in rows:
        per = ", ".join(f"{m:.3f} ({'plain' if w == 0 else f'{w:g}'})" for w, m in zip(r["widths"], r["mean"]))
        table.append([r["run"], r["block"], str(r["positions"]), per, f"{r['max_mean']:.3f}",
                      f"{1 / len(r['widths']):.3f}"])
    return markdown_table(header, table)


# `prvr-bench evaluate RECORD --fusion-weights`
EVALUATIONS.add("fusion-weights", Analysis(rows, format_rows),
                "the branch weights of each dynamic GMM block (GMMFormer v2, RAL on it) over the split's videos")
