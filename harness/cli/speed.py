"""`prvr-bench speed [--out results]`: the speed table, ours beside the official code, and the parity
over seeds, from the parity reports' sidecars (harness/reports/speed.py and parity_seeds.py,
docs/speed.md, docs/parity.md)."""

from __future__ import annotations

import argparse

from prvr.harness.cli.args import command
from prvr.harness.base.io import write_texts
from prvr.harness.reports.parity_seeds import parity_files
from prvr.harness.reports.speed import sidecars, speed_files


def cmd_speed(args: argparse.Namespace) -> None:
    found = sidecars(args.out)
    files = {**speed_files(args.out, found), **parity_files(args.out, found)}
    write_texts(files)  # all four or none
    md, *rest = files
    print(f"wrote {md}, {', '.join(p.name for p in rest)}")


@command("speed", "seconds per epoch and peak memory, ours beside the official code, from the parity reports")
def add_commands(sub) -> None:
    p = sub.add_parser("speed", help="seconds per epoch and peak memory of ours and the official code, one row per "
                                     "parity report with a sidecar (OUT/parity/*.json): OUT/speed.{md,csv}; and each "
                                     "comparison's seeds pooled, the difference with its interval: "
                                     "OUT/parity.{md,csv}")
    p.add_argument("--out", default="results", help="results folder: reads OUT/parity/, writes OUT/speed.{md,csv} "
                                                    "and OUT/parity.{md,csv} (default: results)")
    p.set_defaults(func=cmd_speed)
