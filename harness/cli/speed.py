"""`prvr-bench speed [--out results]`: the speed table, ours beside the official code, from the parity
reports' sidecars (harness/reports/speed.py, docs/speed.md)."""

from __future__ import annotations

import argparse

from prvr.harness.cli.args import command
from prvr.harness.reports.speed import write_speed


def cmd_speed(args: argparse.Namespace) -> None:
    md, csv = write_speed(args.out)
    print(f"wrote {md} and {csv.name}")


@command("speed", "seconds per epoch and peak memory, ours beside the official code, from the parity reports")
def add_commands(sub) -> None:
    p = sub.add_parser("speed", help="seconds per epoch and peak memory of ours and the official code, one row per "
                                     "parity report with a sidecar (OUT/parity/*.json): OUT/speed.{md,csv}")
    p.add_argument("--out", default="results", help="results folder: reads OUT/parity/, writes OUT/speed.md and "
                                                    "OUT/speed.csv (default: results)")
    p.set_defaults(func=cmd_speed)
