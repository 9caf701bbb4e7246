"""`prvr-bench`: the command line, made of every command module of this package.

Each module of `prvr.harness.cli` registers the subcommands it adds (`args.command`); the parser is
built from the registry once every module has been imported, as methods register their recipes."""

from __future__ import annotations

import argparse

from prvr.harness.cli.args import COMMANDS, load_commands, run_parsed, set_argv


def build_parser() -> argparse.ArgumentParser:
    load_commands()  # each command module registers itself by existing
    parser = argparse.ArgumentParser(prog="prvr-bench", description="Label-noise methods for PRVR on one harness.")
    sub = parser.add_subparsers(dest="command", required=True)
    for entry in COMMANDS.entries():
        entry.obj(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    set_argv(argv)  # the command a record stores is the one run here, also when called from Python
    return run_parsed(build_parser().parse_args(argv))
