"""`prvr-bench detection`: a detector's per-epoch report, tabulated from run records.

Detectors store an `epoch_report` in every epoch of a run's history (`history[i].relations`);
on simulated data that holds the precision and recall of the detected pairs against the truly
relevant unlabelled pairs. This command averages those figures over a run's seeds, epoch by
epoch, and writes `<out>/ablations/<dataset>/<run>_detection.{md,csv}`, so the detection
quality quoted in the docs is a generated file with its command, not prose.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from prvr.harness.cli.args import command
from prvr.harness.base import progress
from prvr.harness.base.io import UserError, write_text
from prvr.harness.reports.leaderboard import RECORD_NAME
from prvr.harness.base.names import check_name, inside
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import load_record_at
from prvr.harness.reports.table import csv_text, markdown_table

FIELDS = ("per_query", "precision", "recall")  # from the chosen part's report (a branch or the union)
BRANCH_FIELDS = ("frame_share", "tau_s", "tau_u", "tau_s_frame", "tau_u_frame")  # the first branch's


@command("detection", "per-epoch detection precision / recall")
def add_commands(sub) -> None:
    p = sub.add_parser("detection", help="per-epoch detection precision / recall of a run, from its records")
    p.add_argument("--run", nargs="+", required=True, help="run name(s), e.g. arl arl~tv_tf")
    p.add_argument("--dataset", default="sim-tvr")
    p.add_argument("--part", default="union", help="which report: union (default) or a branch (theta, phi)")
    p.add_argument("--out", default="results")
    p.set_defaults(func=cmd_detection)


def cmd_detection(args: argparse.Namespace) -> None:
    for run in args.run:
        path = write_table(args.out, args.dataset, run, args.part)
        progress.log(f"wrote {path} and {path.with_suffix('.csv')}")


def epoch_rows(records: list[RunRecord], part: str) -> list[dict[str, Any]]:
    """Per epoch with an active detector: the mean over seeds of each field (None when no
    seed has it) and how many seeds reported that epoch."""
    by_epoch: dict[int, list[dict]] = {}
    for rec in records:
        for h in rec.get("history", []):
            rel = h.get("relations") or {}
            if rel.get("active") and isinstance(rel.get(part), dict):
                branch = {k: v for k, v in (rel.get(_first_branch(rel)) or {}).items() if k in BRANCH_FIELDS}
                by_epoch.setdefault(int(h["epoch"]), []).append({**branch, **{k: rel[part].get(k) for k in FIELDS}})
    rows = []
    for epoch in sorted(by_epoch):
        reports = by_epoch[epoch]
        row: dict[str, Any] = {"epoch": epoch + 1, "seeds": len(reports)}
        for key in (*FIELDS, *BRANCH_FIELDS):
            values = [r[key] for r in reports if isinstance(r.get(key), (int, float))]
            row[key] = float(np.mean(values)) if values else None
        rows.append(row)
    return rows


# a detector report's figures: precision and recall are shares; the rest are counts or similarities
SHARES = ("precision", "recall", "frame_share")


def check_reports(path: Path, record: RunRecord, part: str) -> None:
    """The history entries this table reads, checked: an integer epoch, and each figure a number
    (a share within [0, 1]); anything else is one line naming the file and the key."""
    for i, h in enumerate(record.get("history", [])):
        rel = h.get("relations") if isinstance(h, dict) else None
        if not (isinstance(rel, dict) and rel.get("active") and isinstance(rel.get(part), dict)):
            continue
        if not isinstance(h.get("epoch"), int) or isinstance(h.get("epoch"), bool) or h["epoch"] < 0:
            raise UserError(f"run record {path} key 'history[{i}].epoch': {h.get('epoch')!r} is not an epoch number; "
                            "delete it or re-run that run")
        found = rel.get(_first_branch(rel))
        branch = found if isinstance(found, dict) else {}
        figures = [(f"relations.{part}.{k}", rel[part].get(k)) for k in FIELDS] + \
                  [(f"relations.{_first_branch(rel)}.{k}", branch.get(k)) for k in BRANCH_FIELDS]
        for key, v in figures:
            share = key.rsplit(".", 1)[1] in SHARES
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v)
                                  or (share and not 0 <= v <= 1)):
                raise UserError(f"run record {path} key 'history[{i}].{key}': {v!r} is not "
                                f"{'a share in [0, 1]' if share else 'a finite number'}; delete it or re-run that run")


def _first_branch(rel: dict) -> str:
    """Thresholds and frame shares are per branch; the table shows the first branch's (theta, or `frame`)."""
    return "theta" if "theta" in rel else "frame"


def write_table(out: str | Path, dataset: str, run: str, part: str = "union") -> Path:
    check_name(run, "--run", "give the run's folder name, e.g. arl or arl~tv_only")
    check_name(dataset, "--dataset", "give a dataset name, e.g. sim-tvr")
    folder = inside(Path(out) / "runs" / dataset / run, out, "run folder")
    files = sorted(folder.glob("seed*.json")) if folder.is_dir() else []
    files = [f for f in files if RECORD_NAME.fullmatch(f.name)]  # not seed0.fig4.json, seed0.noise-*.json
    records = [load_record_at(f) for f in files]
    for f, record in zip(files, records):
        check_reports(f, record, part)
    if not records:
        raise UserError(f"no run records under {folder}; check --run, --dataset and --out")
    rows = epoch_rows(records, part)
    seeds = " ".join(str(r["seed"]) for r in records)
    command = f"prvr-bench detection --run {run} --dataset {dataset} --part {part} --out {out}"
    head = ["epoch", "seeds", "ambiguous per query", "precision", "recall", "frame share",
            "tau_s", "tau_u", "tau_s^f", "tau_u^f"]
    md = [f"# Detection of `{run}` on {dataset} ({part})", "",
          f"Mean over seeds {seeds} of each epoch's detector report (`history[*].relations.{part}`; frame share and "
          "thresholds of the first branch). Precision and recall: the detected text-video pairs against the truly relevant "
          "unlabelled pairs of each batch (simulated data); frame share: the share of the labelled videos' frames "
          f"that are ambiguous at text-frame level. Written by `{command}`.", ""]
    md_rows, csv_rows = [], []
    for r in rows:
        values = [r[k] for k in (*FIELDS, *BRANCH_FIELDS)]
        md_rows.append([str(r["epoch"]), str(r["seeds"]), *(_fmt(v) for v in values)])
        csv_rows.append([str(r["epoch"]), str(r["seeds"]), *("" if v is None else f"{v:.6g}" for v in values)])
    md.append(markdown_table(head, md_rows))
    if not rows:
        md.append("\n(no epoch with an active detector in these records)")
    path = inside(Path(out) / "ablations" / dataset / f"{run}_detection.md", out, "detection table")
    write_text(path, "\n".join(md) + "\n")
    write_text(path.with_suffix(".csv"), csv_text(["epoch", "seeds", *FIELDS, *BRANCH_FIELDS], csv_rows))
    return path


def _fmt(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
