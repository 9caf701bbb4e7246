"""`prvr-bench sensitivity`: what a gain depends on, if not the noise.

    prvr-bench sensitivity --dataset sim-tvr-v2 --gains ral@msl:msl ral@gmmformer:gmmformer ral:gmmformer2 \\
        arl:gmmformer arl:arl~base --vary sim.token_noise=0.25,1 sim.filler_rate=0.3,0.9 --seeds 0 1 2 --jobs 2

At the world's preset (its label noise where the preset puts it) each `--vary` knob moves alone to each of
its values; every method of the gains trains there (`prvr-bench sweep`'s runs: tagged by the knob, kept when
their record exists, so an interrupted call resumes and a run of a sweep is not made twice). The table
(harness/reports/sensitivity.py) gives each gain with its interval at every setting beside the papers' gains
on the real dataset the world imitates (a gain no paper reports, ARL over its own encoder `arl:arl~base`, is
shown and not judged). Every run is resolved before the first trains.
"""

from __future__ import annotations

import argparse
import copy

from prvr.harness.base.io import UserError
from prvr.harness.base.names import check_name
from prvr.harness.cli.args import add_jobs_argument, command, command_line, common_arguments, set_threads
from prvr.harness.cli.compare import parse_pair
from prvr.harness.cli.sweep import SweepRun, plan_sweep, train_planned, variant
from prvr.harness.engine.sections import dataset_preset
from prvr.harness.reports import sensitivity
from prvr.harness.reports.sweeps import ROOM_TREATMENTS, Sweep


@command("sensitivity", "gains at the preset and with each other world knob moved alone, beside the papers' gains")
def add_commands(sub) -> None:
    p = sub.add_parser("sensitivity", help="each gain A:B at the world's preset and with each --vary knob moved alone, "
                                           "beside the papers' gains: OUT/sensitivity/<name>.{md,csv}")
    p.add_argument("--dataset", default="sim-tvr-v2", help="a simulated dataset (default: sim-tvr-v2)")
    p.add_argument("--gains", nargs="+", required=True, metavar="A:B",
                   help="run names, A minus B, e.g. ral@msl:msl arl:gmmformer arl:arl~base (A, B: methods, "
                        "METHOD@BACKBONE, or METHOD~ROW, a row of the method's ablation tables)")
    p.add_argument("--vary", nargs="+", required=True, metavar="KEY=V1,V2",
                   help="a world knob and the values it takes, one knob at a time, e.g. sim.token_noise=0.25,1")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", default="results")
    p.add_argument("--name", default="", help="the table's file name under OUT/sensitivity/ (default: the dataset)")
    p.add_argument("--plan", action="store_true", help="print the planned runs and their expected time, and stop")
    p.add_argument("--report-only", action="store_true", help="write the table from the records there are")
    add_jobs_argument(p)
    common_arguments(p)
    p.set_defaults(func=cmd_sensitivity)


def plan(args: argparse.Namespace) -> tuple[list[Sweep], list[SweepRun]]:
    """One sweep per --vary knob over the gains' methods, its values and the preset's; every run once."""
    gains = [parse_pair(text, "--gains") for text in args.gains]
    methods = list(dict.fromkeys(m for pair in gains for m in pair))
    for m in methods:
        if "+" in m:
            raise UserError(f"--gains: {m!r} names a detector; give methods, METHOD@BACKBONE or a row of a method's "
                            "ablation table, METHOD~ROW (arl~base: ARL's encoder alone); the runs are trained here, "
                            "at each setting")
        variant(m, args.dataset, "--gains")  # METHOD~ROW: a row its ablation tables have, else one line
    knobs = [_vary(text) for text in args.vary]
    if len({k for k, _ in knobs}) != len(knobs):
        raise UserError(f"--vary {' '.join(args.vary)}: a knob given twice; give each once with all its values")
    sweeps, runs, seen = [], [], set()
    for knob, values in knobs:
        one = copy.copy(args)
        one.knob, one.method, one.oracle, one.name, one.room = [knob], methods, False, "", [ROOM_TREATMENTS[0]]
        one.values = values
        sweep, planned = plan_sweep(one)
        if sweep.default not in sweep.values:  # the preset's own value: the plain runs every knob shares
            one.values = [f"{sweep.default[0]:g}", *values]
            sweep, planned = plan_sweep(one)
        sweeps.append(sweep)
        for p in planned:
            if p.run.record not in seen:
                seen.add(p.run.record)
                runs.append(p)
    return sweeps, runs


def cmd_sensitivity(args: argparse.Namespace) -> None:
    set_threads(args.threads)
    name = check_name(args.name or args.dataset, "--name", "give a plain file name, e.g. sim-tvr-v2~text")
    sweeps, planned = plan(args)
    if not args.report_only:
        train_planned(args, planned)
    if args.plan:
        return
    family = str(dataset_preset(args.dataset).get("family") or args.dataset)
    gains = [parse_pair(text, "--gains") for text in args.gains]
    print(sensitivity.write(args.dataset, family, sweeps, gains, args.out, name, command_line()), end="")


def _vary(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    items = [v for v in values.split(",") if v]
    if not sep or not key or not items:
        raise UserError(f"--vary {text}: give KEY=V1,V2 (a world knob and its values), e.g. sim.token_noise=0.25,1")
    return key, items
