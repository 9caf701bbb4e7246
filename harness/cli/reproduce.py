"""`prvr-bench reproduce RECORD`: a record's run made again from its own commit, figure by figure.

The code of the record's `git_revision` is taken from this repository with `git archive` into a
temporary folder (the repository and its working tree are left as they are), laid out as the `prvr`
package, and the record's command runs there with this Python and its packages, into a temporary
results folder. The command is the record's own `prvr-bench run ...` (a record made by `bench` in its
own process gets the `run` command of its method, dataset, seed, tag and `--set` settings). Then every
figure of the record (val and test R@K, SumR, the oracle figures) is set beside the new run's, with
the difference; a figure that moved by more than `--tolerance` is a difference the table marks.

Refused in one line, before anything runs: a record made from an uncommitted tree (no commit holds the
code that made it), a commit this repository does not hold, a real dataset whose data is not here.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from prvr.harness.base import progress
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import DATASETS
from prvr.harness.cli.args import command
from prvr.harness.engine.config import from_dict
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import load_record_at, made_on, record_path
from prvr.harness.reports.table import MOMENT_SUM, markdown_cell, markdown_table

PACKAGE_FOLDERS = ("harness", "methods", "datasets")  # prvr.<folder> (pyproject.toml package-dir)
FIGURES = ("R@1", "R@5", "R@10", "R@100", "SumR", MOMENT_SUM.name)  # VCMR SumR where the run localizes


@dataclass(frozen=True)
class Figure:
    """One figure of the record beside the reproduction's."""

    key: str
    recorded: float
    reproduced: float

    @property
    def difference(self) -> float:
        return self.reproduced - self.recorded


@command("reproduce", "a record's run made again at its commit, figure by figure")
def add_commands(sub) -> None:
    p = sub.add_parser("reproduce", help="re-run a record's command at its commit and report each figure's "
                                         "difference")
    p.add_argument("record", help="a run record, e.g. results/runs/sim-tvr-v2/msl/seed0.json")
    p.add_argument("--tolerance", type=float, default=1e-6, help="a difference larger than this is marked "
                                                                  "(default 1e-6: the suite repeats itself exactly)")
    p.add_argument("--work", default=None, help="keep the checkout and the new run in this folder (default: a "
                                                "temporary one, removed)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads of the run (default: the record's)")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace) -> None:
    path = Path(args.record)
    record = load_record_at(path)
    revision = check_reproducible(path, record)
    with tempfile.TemporaryDirectory(prefix="prvr-reproduce-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        new = run_at_commit(record, revision, work, args.threads)
    figures = compare_figures(record, new)
    print(render(path, record, revision, figures, args.tolerance, made_on(new)))
    moved = [f for f in figures if not math.isclose(f.recorded, f.reproduced, abs_tol=args.tolerance)]
    if moved:
        raise UserError(f"{len(moved)} of {len(figures)} figures differ from the record by more than "
                        f"{args.tolerance:g} (the table above){_elsewhere(made_on(record), made_on(new))}")


def _elsewhere(then: str, now: str) -> str:
    """What a difference may come from besides the code: another processor or device (docs/records.md,
    "Retraining a record"); nothing where both records name the same machine, or either names none."""
    if not then or not now or then == now:
        return ""
    return (f"; the record was made on {then} and this run on {now}: another processor, device or thread count "
            "rounds differently and training carries it to the last figures, so reproduce it where it was made to "
            "expect every digit")


def check_reproducible(path: Path, record: RunRecord) -> str:
    """The commit a record can be made again from; one line where it cannot."""
    prov: Any = record.get("provenance", {})
    revision, dirty = prov.get("git_revision"), prov.get("git_dirty")
    if not isinstance(revision, str) or len(revision) != 40 or revision == "unknown":
        raise UserError(f"{path} names no commit (git_revision {revision!r}): it was made outside a git checkout, "
                        "so nothing holds the code that made it")
    if dirty:
        raise UserError(f"{path} was made from an uncommitted tree at {revision[:10]} (git_dirty): no commit holds "
                        "the code that made it; re-run it from a clean checkout to have a row that reproduces")
    if _git("cat-file", "-e", f"{revision}^{{commit}}").returncode != 0:
        raise UserError(f"{path} was made at commit {revision[:10]}, which this repository does not hold; fetch it "
                        "(git fetch) or reproduce it where it was made")
    cfg = from_dict(record["config"], f"the config of {path}")
    if not DATASETS.get(cfg.dataset).simulated and not _has_data(cfg):
        raise UserError(f"{path} is a run on the real dataset {cfg.dataset}, whose data is not here "
                        f"({cfg.data.data_root or 'no data root'}); pass it with PRVR_DATA=DIR")
    return revision


def _has_data(cfg: Any) -> bool:
    root = cfg.data.data_root or os.environ.get("PRVR_DATA", "")
    return bool(root) and Path(root).is_dir()


def _git(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    here = Path(__file__).resolve().parent
    return subprocess.run(["git", "--no-optional-locks", *args], cwd=here, stdout=stdout, stderr=subprocess.PIPE,
                          timeout=120)


def checkout(revision: str, folder: Path) -> Path:
    """The package folders of `revision`, extracted under `folder/tree` and laid out as `prvr` under
    `folder/pkg` (the repository's own working tree and index are not touched)."""
    top = _git("rev-parse", "--show-toplevel").stdout.decode().strip()
    out = _git("-C", top, "archive", "--format=tar", revision, *PACKAGE_FOLDERS)
    if out.returncode != 0:
        raise UserError(f"git archive of {revision[:10]} failed: {out.stderr.decode(errors='replace').strip()}")
    tree = folder / "tree"
    tree.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuses members that leave the folder
            tar.extractall(tree, filter="data")
        else:  # git's own archive of its own commit
            tar.extractall(tree)
    pkg = folder / "pkg" / "prvr"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in PACKAGE_FOLDERS:
        link = pkg / name
        if not link.exists():
            link.symlink_to(tree / name, target_is_directory=True)
    return folder / "pkg"


def run_command(record: RunRecord, out: Path, threads: int | None) -> list[str]:
    """The `prvr-bench run` arguments that made the record, writing into `out`."""
    words = shlex.split(record.get("command", ""))
    if words[:2] == ["prvr-bench", "run"]:
        args = _without(words[2:], {"--out", "--threads"}, {"--resume", "--force-resume", "--quiet"})
    else:  # bench in its own process: the run of this record's method, dataset, seed and settings
        args = ["--method", record["method"], "--dataset", record["dataset"], "--seed", str(record["seed"])]
        args += _kept(words, ("--set", "--config", "--data-root", "--backbone", "--tag"))
    return ["run", *args, "--out", str(out), "--quiet", *(["--threads", str(threads)] if threads else [])]


def _without(words: list[str], valued: set[str], flags: set[str]) -> list[str]:
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in valued:
            skip = True
        elif w not in flags:
            out.append(w)
    return out


def _kept(words: list[str], valued: tuple[str, ...]) -> list[str]:
    out = []
    for i, w in enumerate(words[:-1]):
        if w in valued:
            out += [w, words[i + 1]]
    return out


def run_at_commit(record: RunRecord, revision: str, work: Path, threads: int | None) -> RunRecord:
    """The record's run made again with the code of `revision`; its new record."""
    pkg = checkout(revision, work)
    out = work / "results"
    argv = run_command(record, out, threads)
    progress.log(f"reproduce: {shlex.join(['prvr-bench', *argv])} at {revision[:10]}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run([sys.executable, "-m", "prvr.harness.cli", *argv], env=env, cwd=work,
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise UserError(f"the run at {revision[:10]} failed (exit {done.returncode}): {tail[0]}")
    return load_record_at(record_path(out, record["dataset"], record.get("run_name", record["method"]), record["seed"]))


def compare_figures(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Figure]:
    """Every figure the record states (val and test, and their oracle blocks), beside the new run's."""
    out = []
    for split in ("val", "test"):
        for prefix in ("", "oracle "):
            block, again = _block(old, split, prefix), _block(new, split, prefix)
            for key in FIGURES:
                stated, value = block.get(key), again.get(key)
                if isinstance(stated, (int, float)):
                    out.append(Figure(f"{split} {prefix}{key}", float(stated),
                                      float(value) if isinstance(value, (int, float)) else math.nan))
    return out


def _block(record: Mapping[str, Any], split: str, prefix: str) -> Mapping[str, Any]:
    """A split's figures of a record (its oracle block with the prefix "oracle "); empty where absent."""
    block = record.get("metrics", {}).get(split) or {}
    return (block.get("oracle") or {}) if prefix else block


def render(path: Path, record: RunRecord, revision: str, figures: list[Figure], tolerance: float,
           here: str = "") -> str:
    """The figures side by side, under a line naming the run, the commit and where each side was made."""
    rows = [[f.key, f"{f.recorded:.4f}", f"{f.reproduced:.4f}", f"{f.difference:+.4f}",
             "" if math.isclose(f.recorded, f.reproduced, abs_tol=tolerance) else "differs"] for f in figures]
    head = ["figure", "record", "reproduced", "difference", ""]
    name = markdown_cell(f"{record.get('run_name', record['method'])} seed {record['seed']}")
    then = made_on(record) or "a machine the record does not name"
    machines = markdown_cell(f"the record made on {then}; made again on {here or 'this machine'}")
    return "\n".join([f"{path}: {name} made again at {revision[:10]} ({machines})", "", markdown_table(head, rows)])
