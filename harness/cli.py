"""`prvr-bench`: run, bench, leaderboard, list, config."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

from prvr.harness import progress
from prvr.harness.io import UserError, ensure_dir
from prvr.harness.registry import BACKBONES, DATASETS, DETECTORS, METHODS, OBJECTIVES, RegistryError

DEFAULT_DATASET = "sim-tvr"
# Modules that add subcommands: each has add_commands(subparsers) and sets `func` on its parsers.
PLUGIN_COMMANDS: list[str] = ["prvr.harness.ablate", "prvr.harness.reevaluate", "prvr.harness.profiling.command", "prvr.harness.data_cli"]


def data_root_overrides(args: argparse.Namespace) -> list[str]:
    """--data-root DIR (or $PRVR_DATA) as a data.data_root override, before the user's --set."""
    root = getattr(args, "data_root", None) or os.environ.get("PRVR_DATA")
    return [f"data.data_root={root}"] if root else []


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--config", help="YAML file of config overrides (sections as keys)")
    p.add_argument("--tag", default="", help="suffix for the run name, to keep variants apart")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint when there is one")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="root folder of real datasets in their public layouts (default: $PRVR_DATA)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prvr-bench", description="Label-noise methods for PRVR on one harness.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="one training run; writes DIR/runs/<dataset>/<run>/seed<S>.json")
    run.add_argument("--method", required=True)
    run.add_argument("--dataset", default=DEFAULT_DATASET)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", default="results", help="results folder (default: results)")
    _common(run)

    bench = sub.add_parser("bench", help="methods x datasets x seeds, then the leaderboard")
    bench.add_argument("--method", nargs="+", default=None, help="default: every registered method")
    bench.add_argument("--dataset", nargs="+", default=[DEFAULT_DATASET])
    bench.add_argument("--seeds", nargs="+", type=int, default=[0],
                       help="default: 0 (one seed per method keeps the no-argument bench short; "
                            "the committed tables use --seeds 0 1 2)")
    bench.add_argument("--out", default="results")
    bench.add_argument("--oracle", action=argparse.BooleanOptionalAction, default=False,
                       help="also run each method with the oracle detector on simulated data (default: off)")
    bench.add_argument("--skip-existing", action="store_true", help="keep runs whose record already exists")
    _common(bench)

    board = sub.add_parser("leaderboard", help="rebuild results/leaderboard.{csv,md} from the run records")
    board.add_argument("--out", default="results")
    board.add_argument("--skip-bad", action="store_true", help="leave unreadable records out instead of failing")

    sub.add_parser("list", help="registered methods, backbones, detectors, objectives and datasets")

    show = sub.add_parser("config", help="print the resolved config of a run as YAML")
    show.add_argument("--method", required=True)
    show.add_argument("--dataset", default=DEFAULT_DATASET)
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--set", dest="overrides", action="append", default=[])
    show.add_argument("--config")
    for module in PLUGIN_COMMANDS:
        importlib.import_module(module).add_commands(sub)
    return parser


def cmd_run(args: argparse.Namespace) -> None:
    from prvr.harness.config import resolve
    from prvr.harness.runner import run_one

    ensure_dir(args.out)
    cfg = resolve(args.method, args.dataset, args.seed, [*data_root_overrides(args), *args.overrides], args.config)
    run_one(cfg, args.out, resume=args.resume, tag=args.tag, command=_command_line())


def cmd_bench(args: argparse.Namespace) -> None:
    from prvr.harness import leaderboard
    from prvr.harness.config import resolve
    from prvr.harness.records import record_path
    from prvr.harness.runner import run_name, run_one

    ensure_dir(args.out)
    methods = args.method or METHODS.names()
    plan = []
    for dataset in args.dataset:
        for method in methods:
            variants = [[]]
            # On simulated data each method also runs with the oracle detector: its objectives fed
            # the ground truth, the upper bound of what its detection could give.
            if args.oracle and DATASETS.get(dataset).simulated:
                variants.append(["relations.name=oracle"])
            for extra in variants:
                for seed in args.seeds:
                    plan.append(resolve(method, dataset, seed, [*data_root_overrides(args), *args.overrides, *extra],
                                       args.config))
    start = time.perf_counter()
    for i, cfg in enumerate(plan):
        path = record_path(args.out, cfg.dataset, run_name(cfg, args.tag), cfg.seed)
        if args.skip_existing and path.exists():
            progress.log(f"[{i + 1}/{len(plan)}] keeping {path}")
            continue
        progress.log(f"[{i + 1}/{len(plan)}] {run_name(cfg, args.tag)} on {cfg.dataset}, seed {cfg.seed}")
        run_one(cfg, args.out, resume=args.resume, tag=args.tag, command=_command_line())
    progress.log(f"bench: {len(plan)} runs in {time.perf_counter() - start:.0f} s")
    leaderboard.rebuild(args.out)


def cmd_leaderboard(args: argparse.Namespace) -> None:
    from prvr.harness import leaderboard

    leaderboard.rebuild(args.out, skip_bad=args.skip_bad)


def cmd_list(args: argparse.Namespace) -> None:
    for title, reg in (("methods", METHODS), ("backbones", BACKBONES), ("detectors", DETECTORS),
                       ("objectives", OBJECTIVES), ("datasets", DATASETS)):
        print(f"{title}:")
        for e in reg.entries():
            print(f"  {e.name:<18} {e.summary}")


def cmd_config(args: argparse.Namespace) -> None:
    import yaml

    from prvr.harness.config import resolve

    cfg = resolve(args.method, args.dataset, args.seed, args.overrides, args.config)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")


def _command_line() -> str:
    """The command as a user would type it (no paths of this machine)."""
    return " ".join(["prvr-bench", *sys.argv[1:]])


COMMANDS = {"run": cmd_run, "bench": cmd_bench, "leaderboard": cmd_leaderboard, "list": cmd_list,
            "config": cmd_config}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False):
        progress.set_enabled(False)
    try:
        handler = getattr(args, "func", None) or COMMANDS[args.command]
        handler(args)
    except (UserError, RegistryError) as e:
        print(f"prvr-bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prvr-bench: interrupted; continue with --resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
