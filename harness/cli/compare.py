"""`prvr-bench compare`: paired differences of rows of one dataset, with intervals and tests.

`prvr-bench compare --dataset sim-tvr-v2 --rows ral@msl:msl baseline+oracle:baseline --out results`
compares each pair A:B over their shared seeds' stored test rankings (harness/reports/stats.py):
A - B of the mean R@K and SumR, a 95% two-level bootstrap interval, a paired randomization
test's p and Holm's adjusted p over the table; it prints the markdown table and writes
`<out>/compare/<dataset>.md` and `.csv`. What the figures mean: docs/statistics.md.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, write_texts
from prvr.harness.base.names import check_name, from_here, inside
from prvr.harness.cli.args import add_jobs_argument, command
from prvr.harness.cli.resolve_seeds import DEFAULT_CAP, Outcome, until_resolved
from prvr.harness.reports.table import markdown_cell
from prvr.harness.reports.stats import ALL_METRICS, METRICS, PERMUTATIONS, RESAMPLES, SEED, CompareTable, Settings, \
    compare_table, to_csv, to_markdown


@command("compare", "paired differences of rows, with bootstrap intervals, randomization tests and Holm's correction")
def add_commands(sub) -> None:
    p = sub.add_parser("compare", help="paired differences of rows of one dataset from their stored rankings: "
                                       "bootstrap intervals, randomization tests, Holm's correction")
    p.add_argument("--dataset", required=True, help="the dataset whose rows to compare, e.g. sim-tvr-v2")
    p.add_argument("--rows", nargs="+", required=True, metavar="A:B",
                   help="pairs of run names, A minus B, e.g. ral@msl:msl baseline+oracle:baseline")
    p.add_argument("--out", default="results", help="the results folder (reads runs/, writes compare/)")
    p.add_argument("--metrics", nargs="+", default=list(METRICS),
                   help=f"of {' '.join(ALL_METRICS)} (default: {' '.join(METRICS)}; 'VCMR SumR': rows that localize; "
                        "'oracle SumR': rows of a simulated world)")
    p.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap resamples")
    p.add_argument("--permutations", type=int, default=PERMUTATIONS, help="randomization-test permutations")
    p.add_argument("--seed", type=int, default=SEED, help="the random seed of the bootstrap and the test")
    p.add_argument("--min-seeds", type=int, default=2, choices=(1, 2),
                   help="shared seeds a pair needs; 1 gives a queries-only interval, marked so (default 2)")
    p.add_argument("--name", default=None, help="the table's file name under OUT/compare/ (default: the dataset's; "
                                                "several tables of one dataset each take a name)")
    p.add_argument("--until-resolved", action="store_true",
                   help="train more seeds of each pair whose SumR interval holds 0, until it does not or --cap "
                        "(each an ordinary run of the row's own command, another seed; made runs are kept)")
    p.add_argument("--cap", type=int, default=DEFAULT_CAP, help=f"seeds a pair may reach (default {DEFAULT_CAP})")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads per added run")
    add_jobs_argument(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> None:
    pairs = [parse_pair(text) for text in args.rows]
    settings = Settings(args.resamples, args.permutations, args.seed, args.min_seeds, tuple(args.metrics))
    outcomes: list[Outcome] = []
    if args.until_resolved:
        table, outcomes = until_resolved(args, pairs, settings, args.cap)
    else:
        table = compare_table(args.out, args.dataset, pairs, settings)
    md, path = write_tables(args.out, table, pairs, args.name, outcomes, args.cap)
    print(md, end="")
    progress.log(f"wrote {path} and {path.with_suffix('.csv')}")


def parse_pair(text: str, flag: str = "--rows") -> tuple[str, str]:
    """`A:B` -> (A, B), each a run name."""
    a, sep, b = text.partition(":")
    if not sep or not a or not b or ":" in b:
        raise UserError(f"{flag} {text!r} is not a pair A:B of run names; write e.g. ral@msl:msl")
    return (check_name(a, f"{flag} {text!r}: row", "give a run's folder name"),
            check_name(b, f"{flag} {text!r}: row", "give a run's folder name"))


def write_tables(out: str | Path, table: CompareTable, pairs: list[tuple[str, str]], name: str | None = None,
                 outcomes: list[Outcome] | None = None, cap: int = DEFAULT_CAP) -> tuple[str, Path]:
    """The markdown (with the command that made it) and CSV under <out>/compare/<name or dataset>."""
    dataset = check_name(table.dataset, "--dataset", "give a dataset name, e.g. sim-tvr-v2")
    stem = check_name(name, "--name", "give a plain file name, e.g. sim-tvr-v2~regime") if name else dataset
    path = inside(Path(out) / "compare" / f"{stem}.md", out, "comparison table")
    md = to_markdown(table, command_line(out, table, pairs, name, bool(outcomes), cap))
    if outcomes:
        md = md.rstrip("\n") + "\n\n" + "\n".join(
            [f"## Seeds added until each SumR interval excluded 0 (--until-resolved, cap {cap})", "",
             *(f"- {markdown_cell(o.sentence())}" for o in outcomes)]) + "\n"
    write_texts({path: md, path.with_suffix(".csv"): to_csv(table)})
    return md, path


def command_line(out: str | Path, table: CompareTable, pairs: list[tuple[str, str]], name: str | None = None,
                 until_resolved: bool = False, cap: int = DEFAULT_CAP) -> str:
    """The command that makes the table again (the defaults left out)."""
    s = table.settings
    words = ["prvr-bench", "compare", "--dataset", table.dataset, "--rows", *(f"{a}:{b}" for a, b in pairs),
             "--out", from_here(out) or "OUT"]
    if s.metrics != METRICS:
        words += ["--metrics", *s.metrics]
    if name:
        words += ["--name", name]
    if until_resolved:
        words += ["--until-resolved", *(["--cap", str(cap)] if cap != DEFAULT_CAP else [])]
    for flag, value, default in (("--resamples", s.resamples, RESAMPLES), ("--permutations", s.permutations,
                                 PERMUTATIONS), ("--seed", s.seed, SEED), ("--min-seeds", s.min_seeds, 2)):
        if value != default:
            words += [flag, str(value)]
    return shlex.join(words)
