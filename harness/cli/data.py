"""`prvr-bench data check|export`: validate a real layout; write any dataset in a public layout."""

from __future__ import annotations

import argparse
from pathlib import Path

from prvr.harness.cli.args import command, data_root_overrides
from prvr.datasets.real.check import run_check
from prvr.datasets.real.export import export
from prvr.datasets.real.specs import SPECS
from prvr.harness.base import progress
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import DATASETS
from prvr.harness.engine.sections import dataset_preset


@command("data", "real datasets: check a layout, export")
def add_commands(subparsers) -> None:
    data = subparsers.add_parser("data", help="real datasets: check a layout, export a dataset to a public layout")
    sub = data.add_subparsers(dest="data_command", required=True)

    check = sub.add_parser("check", help="validate a dataset folder and print its summary (exit 2 on errors)")
    check.add_argument("--dataset", required=True, help="tvr | activitynet | charades | charades-sta | didemo")
    _options(check)
    check.set_defaults(func=cmd_check)

    export = sub.add_parser("export", help="write a dataset (simulated ones too) in the MS-SL or TVRetrieval layout")
    export.add_argument("--dataset", required=True)
    export.add_argument("--to", required=True, metavar="DIR", help="data root to write; the collection goes in DIR/<as>/")
    export.add_argument("--layout", choices=("msl", "xml"), default="msl")
    export.add_argument("--as", dest="collection", default=None,
                        help="collection name: tvr | activitynet | charades | charades-sta | didemo (default: the dataset's family)")
    export.add_argument("--feature", default="",
                        help="MS-SL feature folder / XML feature (default: the collection's, e.g. i3d_resnet)")
    export.add_argument("--force", action="store_true", help="overwrite DIR/<collection> when it exists")
    _options(export)
    export.set_defaults(func=cmd_export)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="root folder of real datasets (default: $PRVR_DATA)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set data.layout=xml (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _config(args: argparse.Namespace):
    return resolve("baseline", args.dataset, 0, [*data_root_overrides(args), *args.overrides])


def cmd_check(args: argparse.Namespace) -> None:
    if args.dataset not in SPECS:
        DATASETS.get(args.dataset)  # unknown name: error with suggestions
        raise UserError(f"data check reads real layouts; {args.dataset} is not one (use {', '.join(SPECS)})")
    result = run_check(args.dataset, _config(args))
    print("\n".join(result.lines))
    if not result.ok:
        raise UserError(f"data check: {len(result.errors)} errors in {args.dataset} (listed above)")


def cmd_export(args: argparse.Namespace) -> None:
    cfg = _config(args)
    collection = args.collection or _family(args.dataset)
    data = DATASETS.get(args.dataset).load(cfg)
    summary = export(data, collection, Path(args.to), args.layout, args.feature, args.force)
    progress.log(f"exported {args.dataset} as {collection} ({args.layout} layout) to {summary.folder}")
    for split_name, split in data.splits.items():
        progress.log(f"  {split_name}: {split.num_videos} videos, {split.num_queries} queries")
    for label, n in summary.counts.items():
        if n:
            progress.log(f"  {label}: {n}")
    print(summary.folder)


def _family(dataset: str) -> str:
    if dataset in SPECS:
        return dataset
    family = dataset_preset(dataset).get("family")
    if not family:
        raise UserError(f"{dataset} has no family in its preset; pass --as {'|'.join(SPECS)}")
    return family
