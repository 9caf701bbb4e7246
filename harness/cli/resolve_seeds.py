"""The adaptive rule of `prvr-bench compare --until-resolved`: seeds added to a close comparison.

A pair is *resolved* when the 95% interval of its SumR difference excludes 0. While a pair is not and
it has fewer shared seeds than the cap, the seed after its largest shared one is trained for each of
its rows that lacks it, each as an ordinary `prvr-bench run` of that row's own command with `--seed` replaced
(`reproduce.run_command`), then the table is made again. A row's runs that exist are kept, so an
interrupted rule resumes. The table then says, per pair, how many seeds it took and whether the cap
stopped it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from prvr.harness.base import progress
from prvr.harness.base.io import UserError
from prvr.harness.cli.args import data_root_overrides, parse_command
from prvr.harness.cli.fanout import launch_from_args, run_in_processes
from prvr.harness.cli.reproduce import run_command
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import RECORD_FILE, load_record_at, record_path
from prvr.harness.engine.runner import run_name
from prvr.harness.reports.stats import CompareTable, Comparison, Settings, compare_table

DEFAULT_CAP = 10


@dataclass(frozen=True)
class Outcome:
    """What the rule did for one pair: the seeds it ended with, and why it stopped."""

    row_a: str
    row_b: str
    seeds: int
    added: int
    resolved: bool
    out_of_time: bool = False  # --finish-by left its next seed's runs unstarted

    def sentence(self) -> str:
        why = "its SumR interval excludes 0" if self.resolved else \
            "--finish-by stopped it, unresolved (the same command again goes on)" if self.out_of_time else \
            "the seed cap stopped it, unresolved"
        return f"{self.row_a} - {self.row_b}: {self.seeds} seeds ({self.added} added); {why}"


def resolved(comparison: Comparison) -> bool:
    d = next(m for m in comparison.metrics if m.metric == "SumR")
    return d.low > 0 or d.high < 0


def until_resolved(args: argparse.Namespace, pairs: list[tuple[str, str]], settings: Settings,
                   cap: int) -> tuple[CompareTable, list[Outcome]]:
    """The table after seeds were added to every unresolved pair, up to `cap` shared seeds each."""
    if cap < 2:
        raise UserError(f"--cap {cap}: the rule compares over at least 2 seeds; give --cap 2 or more (default "
                        f"{DEFAULT_CAP})")
    if "SumR" not in settings.metrics:
        raise UserError("--until-resolved decides on the SumR interval; keep SumR among --metrics")
    table = compare_table(args.out, args.dataset, pairs, settings)
    start = {(c.row_a, c.row_b): len(c.seeds) for c in table.comparisons}
    out_of_time = False
    while True:
        todo = [(c, max(c.seeds) + 1) for c in table.comparisons if not resolved(c) and len(c.seeds) < cap]
        runs = {(row, seed): next_run(args, row, seed) for c, seed in todo for row in (c.row_a, c.row_b)
                if not record_path(args.out, args.dataset, row, seed).is_file()}
        if not runs:  # every pair resolved or capped (or its next seed made, yet not shared: no loop on it)
            break
        progress.log(f"until resolved: {len(todo)} pair(s) unresolved, {len(runs)} run(s) to add")
        out_of_time = _train(args, list(runs.values())) > 0
        table = compare_table(args.out, args.dataset, pairs, settings)
        if out_of_time:  # the runs left would be planned again: the rule stops where the deadline left it
            break
    outcomes = [Outcome(c.row_a, c.row_b, len(c.seeds), len(c.seeds) - start[(c.row_a, c.row_b)], resolved(c),
                        out_of_time and not resolved(c) and len(c.seeds) < cap) for c in table.comparisons]
    return table, outcomes


def next_run(args: argparse.Namespace, row: str, seed: int) -> tuple:
    """(config, run name, `run` arguments) of `row` at `seed`: the command of one of its records, the seed
    replaced, writing into the table's results folder."""
    folder = Path(args.out) / "runs" / args.dataset / row
    record = load_record_at(min(f for f in folder.iterdir() if RECORD_FILE.fullmatch(f.name)))
    argv = run_command(record, Path(args.out), args.threads)
    argv[argv.index("--seed") + 1] = str(seed)
    if "--threads" in argv:
        i = argv.index("--threads")
        del argv[i:i + 2]
    parsed = parse_command("run", argv[1:])
    cfg = resolve(parsed.method, parsed.dataset, parsed.seed, [*data_root_overrides(parsed), *parsed.overrides],
                  parsed.config)
    if run_name(cfg, parsed.tag) != row:
        raise UserError(f"row {row}: its record's command ({record.get('command', '')[:80]}) makes run "
                        f"{run_name(cfg, parsed.tag)}, not this row; add its seeds by hand")
    return cfg, row, argv[1:]


def _train(args: argparse.Namespace, runs: list[tuple]) -> int:
    """The runs of one round of the rule; returns how many --finish-by left unstarted."""
    workers, launch = launch_from_args(args, [cfg for cfg, _, _ in runs])
    return run_in_processes(args.out, runs, max(1, workers), args.threads, "compare --until-resolved", launch)
