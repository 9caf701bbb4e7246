"""`prvr-bench calibrate-world`: a simulated world's ambiguity against the real split it stands for
(the figures and the report: harness/reports/world_calibration.py)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from prvr.harness.base.io import UserError, write_texts
from prvr.harness.base.names import check_name, from_here, inside
from prvr.harness.base.registry import DATASETS, load_all
from prvr.harness.cli.args import command
from prvr.harness.reports.world_calibration import distance, read_worlds, render


@command("calibrate-world", "a simulated world against the real split")
def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate-world", help="a simulated world's ambiguity and detector figures against the real "
                                               "split's (census tables): results/calibration/<world>~real.{md,csv}")
    p.add_argument("--world", required=True, help="the simulated dataset, e.g. sim-tvr")
    p.add_argument("--real", required=True, metavar="CSV",
                   help="census table of the real split with a relevance file, e.g. results/census/tvr~relevance.csv")
    p.add_argument("--real-split", default=None, help="its split, when it has several")
    p.add_argument("--tables", nargs="+", required=True, metavar="CSV",
                   help="census tables of the world's test split (its preset, remade worlds)")
    p.add_argument("--chosen", default=None, metavar="WORLD",
                   help="the world chosen as the new preset, as its table's `world` column names it")
    p.add_argument("--preset", nargs=2, action="append", default=[], metavar=("NAME", "WORLD"),
                   help="a calibrated preset (e.g. sim-tvr-v) and the world it uses, as its table's `world` column "
                        "names it; once per preset where the report serves several (the row notes `chosen: NAME`)")
    p.add_argument("--before", default=None, metavar="WORLD",
                   help="the world of the preset before calibration (default: the row named by the dataset), e.g. "
                        "sim.seed=0 for a census of the preset made with --set sim.seed=0")
    p.add_argument("--out", default="results")
    p.set_defaults(func=cmd_calibrate_world)


def cmd_calibrate_world(args: argparse.Namespace) -> None:
    check_name(args.world, "--world", "name the simulated dataset, e.g. sim-tvr")  # it names the report's files
    load_all()
    real = read_worlds(Path(args.real), args.real_split)
    if len(real) != 1:
        raise UserError(f"{args.real}: {len(real)} worlds in the real table; give the census of one real split")
    if real[0].dataset in DATASETS and DATASETS.get(real[0].dataset).simulated:
        raise UserError(f"--real {args.real} is a census of the simulated dataset {real[0].dataset}, not of a real "
                        "split; give the census of the real split made with its relevance file (census --relevance)")
    worlds = [w for path in args.tables for w in read_worlds(Path(path), "test")]
    thetas = sorted(real[0].recall)
    names = {w.name for w in worlds}
    given = [("--chosen", args.chosen), ("--before", args.before), *(("--preset " + p, w) for p, w in args.preset)]
    for flag, name in given:
        if name is not None and name not in names:
            raise UserError(f"{flag} {name!r}: no such world in the tables; they have {', '.join(sorted(names))}")
    marked = {args.before or args.world: "the preset before calibration", **({args.chosen: "chosen"} if args.chosen else {})}
    for preset, world in args.preset:
        marked[world] = ", ".join(filter(None, [marked.get(world, ""), f"chosen: {preset}"]))
    worlds.sort(key=lambda w: distance(w, real[0], thetas))
    command = " ".join(["prvr-bench calibrate-world", "--world", args.world, "--real", _shown(args.real),
                        "--tables", *(_shown(t) for t in args.tables),
                        *(["--chosen", repr(args.chosen)] if args.chosen else []),
                        *(w for p, world in args.preset for w in ("--preset", p, repr(world))),
                        *(["--before", repr(args.before)] if args.before else [])])
    md, table = render(args.world, real[0], worlds, thetas, command, marked)
    out = inside(Path(args.out) / "calibration" / f"{args.world}~real", args.out, "--world")
    write_texts({out.with_suffix(".md"): md, out.with_suffix(".csv"): table})
    print(md)


def _shown(path: str) -> str:
    """A table as the report's command names it (`names.from_here`), else by its file name (no
    path of this machine)."""
    return shlex.quote(from_here(path) or Path(path).name)
