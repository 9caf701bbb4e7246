"""What every command module of `prvr-bench` shares: the registry it adds itself to, the
arguments that several commands take, and the way a command runs and fails.

A command module registers the function that adds its subcommands with `@command(NAME, SUMMARY)`;
`prvr-bench` (harness/cli/app.py) imports every module of this package and adds them all, as
methods register their recipes. Nothing here knows which commands exist, and no command module
imports the entry point back.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from typing import Callable

from prvr.harness.base.allocator import malloc_choice
from prvr.harness.base import progress
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import Registry, RegistryError, import_modules
from prvr.harness.cli.jobs import EXECUTORS

DEFAULT_DATASET = "sim-tvr-v2"  # the world calibrated to TVR's verified relevance (docs/simulated-world.md)

# name -> the function that adds the command's parser(s) to `prvr-bench`'s subparsers and sets `func`
# on each (a module may add several: `profile` also adds `rehearse`)
AddCommands = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
COMMANDS: Registry[AddCommands] = Registry("command")


def command(name: str, summary: str = "") -> Callable[[AddCommands], AddCommands]:
    """Register a module's `add_commands(subparsers)` under `name` (a duplicate name is an error)."""
    return COMMANDS.register(name, summary)


def load_commands() -> None:
    """Import every module of this package, so that each registers its commands (idempotent)."""
    import_modules("prvr.harness.cli")


def run_parsed(args: argparse.Namespace) -> int:
    """Run a parsed command line's `func`: 0, or 2 with one line for a user's error, 130 on Ctrl-C."""
    if getattr(args, "quiet", False):
        progress.set_enabled(False)
    args.started = time.monotonic()  # what --finish-by counts from
    try:
        args.func(args)
    except (UserError, RegistryError) as e:
        print(f"prvr-bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prvr-bench: interrupted; continue with --resume", file=sys.stderr)
        return 130
    return 0


def _one_command(name: str) -> argparse.ArgumentParser:
    """A parser of the registered command `name` alone, not the whole command line."""
    load_commands()
    parser = argparse.ArgumentParser(prog="prvr-bench")
    COMMANDS.get(name)(parser.add_subparsers(dest="command", required=True))
    return parser


def parse_command(name: str, argv: list[str]) -> argparse.Namespace:
    """`prvr-bench NAME ARGV...` parsed by the registered command alone (a usage error is one line)."""
    try:
        return _one_command(name).parse_args([name, *argv])
    except SystemExit:
        raise UserError(f"`prvr-bench {name}` does not take {shlex.join(argv)}") from None


def run_command(name: str, argv: list[str]) -> int:
    """One registered command run in this process, as `prvr-bench NAME ARGV...` would run it (the GPU
    check evaluates a record so)."""
    return run_parsed(_one_command(name).parse_args([name, *argv]))


_argv: list[str] | None = None  # the arguments `main` was given (None: this process's own, sys.argv)


def set_argv(argv: list[str] | None) -> None:
    """The arguments of the command line being run, for `command_line` (main(ARGV) from Python or a test
    records ARGV, not the arguments of the process that called it)."""
    global _argv
    _argv = None if argv is None else list(argv)


def command_line() -> str:
    """The command as a user would type it (no paths of this machine), quoted for the shell so
    that it runs again as stored."""
    return shlex.join(["prvr-bench", *(sys.argv[1:] if _argv is None else _argv)])


def data_root_overrides(args: argparse.Namespace) -> list[str]:
    """--data-root DIR (or $PRVR_DATA) as a data.data_root override and --backbone B as
    backbone=B, before the user's --set."""
    root = getattr(args, "data_root", None) or os.environ.get("PRVR_DATA")
    backbone = getattr(args, "backbone", None)
    return [*([f"data.data_root={root}"] if root else []), *([f"backbone={backbone}"] if backbone else [])]


def add_jobs_argument(p: argparse.ArgumentParser) -> None:
    """--jobs, --runs-per-gpu, --executor, --address: how `bench` and `ablate` fan their runs out."""
    p.add_argument("--jobs", default=None, metavar="N",
                   help="runs at a time, each in its own process with its output in OUT/logs/ (default 1: "
                        "one after another in this process; auto: GPUs x --runs-per-gpu where CUDA trains, "
                        "else one per CPU core)")
    p.add_argument("--runs-per-gpu", type=int, default=1, metavar="N",
                   help="runs that share one GPU under --jobs auto and --executor ray (default 1)")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: processes on this machine (default); ray: one Ray task per run "
                        "(pip install prvr-bench[ray]; docs/cluster.md)")
    p.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                   help="with --executor ray: the Ray cluster to join (default: start a local Ray)")
    p.add_argument("--finish-by", default=None, metavar="SECONDS",
                   help="start no run expected to end (by the earlier records of its device) later than SECONDS "
                        "after the command began, nor, past then, one with no expected time; the runs started "
                        "finish, the others are left for the same command again (a machine lent for a fixed time: "
                        "docs/gpu.md). Each run then goes in its own process, as with --jobs")


def finish_by_seconds(text: str | None) -> float | None:
    """--finish-by: seconds, a finite number above 0 (None: not given); else one line."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"--finish-by must be a number of seconds above 0, got {text[:40]!r}")
    return value


def common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backbone", default=None, metavar="NAME",
                   help="train the method's objective on another backbone (default: the method's own; "
                        "`prvr-bench list` names them)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--config", help="YAML file of config overrides (sections as keys)")
    p.add_argument("--tag", default="", help="suffix for the run name, to keep variants apart")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint when there is one")
    p.add_argument("--force-resume", action="store_true",
                   help="--resume even when the checkpoint was trained with other settings, or stores none "
                        "(the record lists the changed keys)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="root folder of real datasets in their public layouts (default: $PRVR_DATA)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads per run (default: torch's choice; with bench --jobs: the cores shared out)")


def set_threads(threads: int | None) -> None:
    """--threads: torch's CPU threads of this process, and numpy's BLAS threads with them (None: each
    library's own choice). numpy's BLAS otherwise takes every core for the data path's small products
    (the clip pooling of datasets/loader.py): with runs side by side on a 2-core machine that was 15 ms a
    video against 0.13 ms on one thread (docs/profiling.md, "Evaluation at TVR's size"). $PRVR_MALLOC, the
    host allocator policy of the runs on the CPU (harness/base/allocator.py), is checked here too, before
    any folder is made."""
    malloc_choice()
    if threads is None:
        return
    if threads < 1:
        raise UserError(f"--threads must be at least 1, got {threads}")
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")  # for the rest of the process


def run_line(run_arguments: list[str] | tuple[str, ...], threads: int | None) -> str:
    """The `prvr-bench run` line of one planned run, as its record keeps it: what a fan-out command
    (bench, matrix, sweep, ablate) trains in its own process records this line, not its own, so that
    the record's command makes that one run again (`prvr-bench reproduce`), as a run in a process of
    its own (`--jobs N`) records it."""
    return shlex.join(["prvr-bench", "run", *run_arguments, *(["--threads", str(threads)] if threads else [])])


def run_args(args: argparse.Namespace, method: str, dataset: str, seed: int, overrides: list[str]) -> list[str]:
    """The `prvr-bench run` arguments of one planned run (threads are added per job)."""
    out = ["--method", method, "--dataset", dataset, "--seed", str(seed), "--out", str(args.out)]
    for o in overrides:
        out += ["--set", o]
    for flag, value in (("--config", args.config), ("--tag", args.tag), ("--data-root", args.data_root),
                        ("--backbone", args.backbone)):
        if value:
            out += [flag, str(value)]
    return out + (["--resume"] if args.resume else []) + (["--force-resume"] if args.force_resume else [])
