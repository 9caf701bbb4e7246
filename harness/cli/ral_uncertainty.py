"""`prvr-bench uncertainty`: R@1 by query uncertainty (RAL paper, section 4.2, Fig. 3).

The paper takes the TVR test queries whose M/V ratio lies in [0.2, 0.4], groups every 5 of
them into a set, measures each set's uncertainty as the geometric mean of sigma^q (Eq. 3) and
compares the R@1 of RAL and of its backbone per set. Here, for each given RAL run (method
`ral` with MSRA, its best checkpoint):

- sigma^q of a test query is read from that query alone: its token features through RAL's
  token encoder (`model.tokens`, as `encode_queries` returns them) and the text head
  (`RalModel.query_gaussians`: (mu, log sigma)). In training the text Gaussian is that of the
  query support set (Eq. 5: all labelled queries of a video in the batch); at test time a query has
  no support set (its video is what is being retrieved), so the single-query reading (the
  Table 4 "X^q = Q" input) is the only one available;
- u_q = exp(mean over the d dimensions of log sigma), the geometric mean of sigma^q;
- the queries of one M/V bucket (`bucket_of`: default medium, (0.2, 0.4]) are sorted by u_q
  (ascending, stable) and cut into consecutive groups of `--group` queries; the last partial
  group (fewer than `--group` queries, the most uncertain ones) is dropped and counted;
  a group's uncertainty is the geometric mean of its queries' u_q;
- per group, R@1 (%) of the RAL seed and of every `--against` run over the same queries, from
  the suite's evaluator (`split_ranks`: the fused score ranked by `compute_ranks`, the ranks a
  run record's metrics come from).

Several seeds: groups are formed per RAL seed (each seed has its own sigma) and aligned by
group index after sorting (group i of every seed is its i-th least uncertain); a run's R@1 of
group i is the mean over the RAL seeds s of its R@1 on seed s's group i (for an `--against`
run with several seeds, first the mean over its seeds), and the group's uncertainty the
geometric mean over the RAL seeds.

Writes `<out>/uncertainty_<dataset>_<ral run>.{png,md,json}` atomically (default out: the
folder of the first RAL record).
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prvr.harness.cli.args import command
from prvr.datasets.loader import Batcher
from prvr.harness.base import progress
from prvr.harness.engine.evaluate import BUCKETS, bucket_of, split_ranks
from prvr.harness.base.io import UserError, ensure_dir, write_json, write_png, write_text
from prvr.harness.base.names import inside
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import load_record_at, record_layout
from prvr.harness.cli.reevaluate import StoredRun, _shown_path, _world
from prvr.harness.base.registry import DATASETS
from prvr.harness.reports.table import code, markdown_cell, markdown_table

SPLIT = "test"


# ----------------------------------------------------------------------------- measuring
def check_ral_record(path: str | Path) -> RunRecord:
    """A record given as --run: a run of method `ral` whose model has MSRA (one-line errors)."""
    record = load_record_at(path)
    if record["method"] != "ral":
        raise UserError(f"--run takes runs of method ral; {path} is a run of method {record['method']!r} "
                        "(pass it with --against)")
    ral = record["config"].get("ral")
    if not isinstance(ral, dict) or ral.get("msra") is not True:
        raise UserError(f"{path}: its model has no MSRA (ral.msra=false), so no sigma^q to group queries by; "
                        "pass a RAL run with MSRA")
    return record


@torch.no_grad()
def query_log_uncertainty(model, queries: dict[str, torch.Tensor], batch: int = 512) -> np.ndarray:
    """Per query, log u_q = the mean over d of log sigma^q, sigma^q from the query alone: its
    token-encoder features (`ral.tokens`, from `encode_queries`) through the model's text head
    (`RalModel.query_gaussians`), pooled as the run was trained: over the real tokens, or
    (`ral.pool_padding=code`) over every padded token row, as the reference's unmasked poolings
    of a lone query see it."""
    tokens, mask = queries["ral.tokens"], queries["ral.token_mask"]
    out = []
    for start in range(0, tokens.shape[0], batch):
        _, log_sigma = model.query_gaussians(tokens[start : start + batch], mask[start : start + batch])
        out.append(log_sigma.float().mean(-1).cpu())
    return torch.cat(out).numpy().astype(np.float64) if out else np.zeros(0)


def make_groups(log_u: np.ndarray, selected: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """([groups, size] query indices, dropped): the `selected` queries sorted by uncertainty
    (ascending, stable), cut into consecutive groups of `size`; the last partial group dropped."""
    order = selected[np.argsort(log_u[selected], kind="stable")]
    full = len(order) // size
    return order[: full * size].reshape(full, size), len(order) - full * size


def recall_at_1(ranks: np.ndarray) -> float:
    return float(100.0 * np.mean(ranks <= 1))


class _Measured:
    """One stored run on the split: its name, seed, labelled ranks and (RAL) log u_q."""

    def __init__(self, run, ranks: np.ndarray, log_u: np.ndarray | None) -> None:
        self.path = run.path
        _, self.dataset, self.run, self.seed = record_layout(run.path)
        self.ranks, self.log_u = ranks, log_u

    @property
    def uncertainty(self) -> np.ndarray:
        """log u_q per query, which only a RAL run (--run) measures."""
        if self.log_u is None:
            raise ValueError(f"{self.path} is an --against run: no log u_q measured")
        return self.log_u


def _measure(files: list[str | Path], ral: bool, device: str, data_root: str | None, datasets: dict,
             reference: list) -> list[_Measured]:
    """Rank the split with each run's best checkpoint (and, for RAL runs, measure log u_q)."""
    out = []
    for f in files:
        run = StoredRun(f, device, data_root)
        key = _world(run)
        if key not in datasets:
            datasets[key] = DATASETS.get(run.cfg.dataset).load(run.cfg)
        data = datasets[key]
        if SPLIT not in data.splits:
            raise UserError(f"dataset '{run.record['dataset']}' has no split '{SPLIT}' (it has {', '.join(data.splits)})")
        split = data[SPLIT]
        if not reference:
            reference.append((split, run.path))
        elif not _same_queries(reference[0][0], split):
            raise UserError(f"{run.path} was tested on other {SPLIT} queries than {reference[0][1]} (another dataset "
                            "or data settings); every --run and --against record must be on the same test split")
        progress.log(f"uncertainty: rank {run.name} on {SPLIT}")
        model = run.model(data)
        ranks, queries = split_ranks(model, split, Batcher(split, run.cfg.data), run.device, run.cfg.eval.chunk)
        log_u = query_log_uncertainty(model, queries) if ral else None
        out.append(_Measured(run, ranks["labelled"], log_u))
        del model, queries
    return out


def _same_queries(a, b) -> bool:
    return (a.query_ids == b.query_ids and a.video_ids == b.video_ids
            and np.array_equal(a.query_video, b.query_video)
            and np.array_equal(a.moment_fraction(), b.moment_fraction(), equal_nan=True))


def uncertainty_reports(run_files: list[str | Path], against_files: list[str | Path], group: int = 5,
                        bucket: str = "medium", device: str = "auto", data_root: str | None = None,
                        command: str = "") -> list[dict[str, Any]]:
    """One report per RAL run name among `run_files` (its seeds averaged, see the module note):
    {dataset, run, bucket, bounds, group, seeds, runs, groups: [{index, uncertainty, R@1: {run:
    mean}, ...}], ...}."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise UserError(f"--group must be a whole number >= 1, got {group!r}")
    if bucket not in BUCKETS:
        raise UserError(f"--bucket must be one of {', '.join(BUCKETS)}, got {bucket!r}")
    if not run_files:
        raise UserError("--run needs at least one RAL run record")
    given = [Path(f).resolve() for f in [*run_files, *against_files]]
    twice = sorted({str(f) for f in [*run_files, *against_files] if given.count(Path(f).resolve()) > 1})
    if twice:
        raise UserError(f"run record {twice[0]} is given twice; pass each record once")
    for f in run_files:  # refusals before any model is built
        check_ral_record(f)
    datasets: dict = {}
    reference: list = []
    ral = _measure(run_files, True, device, data_root, datasets, reference)
    against = _measure(against_files, False, device, data_root, datasets, reference)
    split = reference[0][0]
    selected = np.flatnonzero(bucket_of(np.asarray(split.moment_fraction(), dtype=np.float64)) == bucket)
    if len(selected) < group:
        raise UserError(f"the {bucket} M/V bucket {_bounds(BUCKETS[bucket])} of the {SPLIT} split holds "
                        f"{len(selected)} queries, fewer than one group of {group}; pass a smaller --group or "
                        "another --bucket")
    by_run: dict[str, list[_Measured]] = {}
    for m in ral:
        by_run.setdefault(m.run, []).append(m)
    others: dict[str, list[_Measured]] = {}
    for m in against:
        if m.run in by_run:
            raise UserError(f"--against {m.path} is a seed of the --run run {m.run} itself; pass it with --run")
        others.setdefault(m.run, []).append(m)
    reports = []
    for name, seeds in by_run.items():
        seeds = sorted(seeds, key=lambda m: m.seed)
        if len({m.seed for m in seeds}) < len(seeds):
            raise UserError(f"--run gives run {name} seed {seeds[0].seed} twice (from different results folders)")
        reports.append(_report(name, seeds, others, selected, group, bucket, command))
    return reports


def _report(name: str, seeds: list[_Measured], others: dict[str, list[_Measured]], selected: np.ndarray,
            size: int, bucket: str, command: str) -> dict[str, Any]:
    per_seed = [make_groups(m.uncertainty, selected, size) for m in seeds]
    groups, dropped = per_seed[0][0], per_seed[0][1]
    rows: list[dict[str, Any]] = []
    for i in range(len(groups)):
        members = [g[i] for g, _ in per_seed]
        log_u = [float(np.mean(m.uncertainty[q])) for m, q in zip(seeds, members)]
        r1 = {name: [recall_at_1(m.ranks[q]) for m, q in zip(seeds, members)]}
        for other, measured in others.items():
            r1[other] = [float(np.mean([recall_at_1(o.ranks[q]) for o in measured])) for q in members]
        rows.append({"index": i, "uncertainty": float(np.exp(np.mean(log_u))),
                     "uncertainty_per_seed": [float(np.exp(v)) for v in log_u],
                     "R@1": {k: float(np.mean(v)) for k, v in r1.items()}, "R@1_per_seed": r1,
                     "queries": [q.tolist() for q in members]})
    runs = [{"run": name, "role": "ral", "seeds": [m.seed for m in seeds]}]
    runs += [{"run": k, "role": "against", "seeds": sorted(o.seed for o in v)} for k, v in others.items()]
    return {"dataset": seeds[0].dataset, "run": name, "split": SPLIT, "bucket": bucket,
            "bounds": list(BUCKETS[bucket]), "group": size, "queries_in_bucket": int(len(selected)),
            "groups_per_seed": len(groups), "dropped": int(dropped), "seeds": [m.seed for m in seeds], "runs": runs,
            "overall": {k: float(np.mean([g["R@1"][k] for g in rows])) if rows else None
                        for k in [name, *others]},
            "groups": rows, "command": command}


def _bounds(b: tuple[float, float]) -> str:
    return f"({b[0]:g}, {b[1]:g}]"


# ----------------------------------------------------------------------------- reports
def _seeds(run: dict[str, Any]) -> str:
    seeds = " ".join(map(str, run["seeds"]))
    return f"{markdown_cell(run['run'])} (seed{'s' if len(run['seeds']) > 1 else ''} {seeds})"


def report_markdown(report: dict[str, Any], png_name: str) -> str:
    names = [r["run"] for r in report["runs"]]
    against = [r for r in report["runs"] if r["role"] == "against"]
    # names from the records, escaped (markdown_cell) in the prose as in the table: one line each, no markup
    lines = [f"# Uncertainty groups: {markdown_cell(report['run'])} on {markdown_cell(report['dataset'])}", "",
             f"RAL paper Fig. 3 on this suite's runs: the {report['split']} queries of the {report['bucket']} M/V "
             f"bucket {_bounds(tuple(report['bounds']))} ({report['queries_in_bucket']} queries), sorted by the "
             f"geometric mean u_q of sigma^q (each query's text Gaussian from the query alone, RAL's token encoder "
             f"and text head), cut into groups of {report['group']}; the last partial group "
             f"({report['dropped']} most uncertain queries) is dropped. Per group: its uncertainty (geometric mean "
             f"of u_q over its queries, and over the RAL seeds) and R@1 (%) of each run on its queries, from the "
             f"evaluator's ranks (the fused score of each best checkpoint).", "",
             f"Groups formed per seed of {_seeds(report['runs'][0])} and aligned by index after sorting; R@1 is the "
             f"mean over those seeds" + (" (for " + ", ".join(_seeds(r) for r in against)
                                          + ": first the mean over its seeds)" if against else "") + ".", "",
             f"Figure: {code(png_name, in_table=False)}; per-group numbers, per seed, and each group's query "
             "indices: the `.json` beside this file.", "",
             "Mean R@1 over the groups: " + ", ".join(f"{markdown_cell(k)} {v:.1f}"
                                                     for k, v in report["overall"].items() if v is not None) + ".", ""]
    if len(report["groups"]) >= 3:
        parts = thirds(report)
        lines += ["Mean R@1 by thirds of the groups (least to most uncertain): "
                  + "; ".join(f"{markdown_cell(n)} " + " / ".join(f"{v:.1f}" for v in parts[n]) for n in names)
                  + ".", ""]
    if report["command"]:
        lines += [f"Command: {code(report['command'], in_table=False)}", ""]
    head = ["group", "uncertainty", *(f"{n} R@1" for n in names)]
    lines.append(markdown_table(head, [[str(g["index"] + 1), f"{g['uncertainty']:.4g}",
                                        *(f"{g['R@1'][n]:.1f}" for n in names)] for g in report["groups"]]))
    return "\n".join(lines) + "\n"


def thirds(report: dict[str, Any]) -> dict[str, list[float]]:
    """Per run, the mean group R@1 of the first, middle and last third of the groups in order of
    uncertainty (np.array_split: the thirds differ by at most one group)."""
    names = [r["run"] for r in report["runs"]]
    parts = np.array_split(np.arange(len(report["groups"])), 3)
    return {n: [float(np.mean([report["groups"][i]["R@1"][n] for i in part])) for part in parts] for n in names}


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over `window` points (shrinking at the ends); 1 = the values."""
    if window <= 1 or len(values) == 0:
        return np.asarray(values, dtype=np.float64)
    half = window // 2
    c = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    idx = np.arange(len(values))
    lo, hi = np.maximum(idx - half, 0), np.minimum(idx + half + 1, len(values))
    return (c[hi] - c[lo]) / (hi - lo)


def plot(report: dict[str, Any], path: str | Path, window: int = 5) -> None:
    """R@1 against the group's uncertainty, one colour per run: the raw per-group points and a
    centred moving average over `window` groups (PNG, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.array([g["uncertainty"] for g in report["groups"]])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, r in enumerate(report["runs"]):
        y = np.array([g["R@1"][r["run"]] for g in report["groups"]])
        ax.scatter(x, y, s=16, alpha=0.55, linewidths=0, color=f"C{i}")
        label = f"{_seeds(r)}" + (f", moving average of {window} groups" if window > 1 else "")
        ax.plot(x, smooth(y, window), color=f"C{i}", linewidth=1.5, label=label)
    ax.set_xlabel(f"group uncertainty (geometric mean of $\\sigma^q$, {report['group']} queries per group)")
    ax.set_ylabel(f"{report['split']} R@1 (%)")
    ax.set_title(f"{report['dataset']}: R@1 by query uncertainty, {report['bucket']} M/V bucket "
                 f"{_bounds(tuple(report['bounds']))} (points: groups)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_png(fig, path)


def write_report(report: dict[str, Any], out: str | Path, window: int = 5) -> list[Path]:
    """`<out>/uncertainty_<dataset>_<run>.{png,md,json}`, each written atomically."""
    stem = f"uncertainty_{report['dataset']}_{report['run']}"  # both checked names (harness/base/names.py)
    out = ensure_dir(out)
    png, md, js = (inside(Path(out) / f"{stem}{ext}", out, "uncertainty report") for ext in (".png", ".md", ".json"))
    plot(report, png, window)
    write_text(md, report_markdown(report, png.name))
    write_json(js, report)
    return [png, md, js]


# ----------------------------------------------------------------------------- command
@command("uncertainty", "R@1 by RAL's query uncertainty")
def add_commands(sub) -> None:
    p = sub.add_parser("uncertainty", help="R@1 of query groups by RAL's query uncertainty (RAL Fig. 3), from best "
                                           "checkpoints")
    p.add_argument("--run", nargs="+", required=True, metavar="RAL_RECORD",
                   help="records of RAL runs with MSRA (seeds of one run are averaged; one report per run)")
    p.add_argument("--against", nargs="*", default=[], metavar="RECORD",
                   help="records of runs to compare on the same query groups (e.g. the backbone's seeds)")
    p.add_argument("--group", type=int, default=5, help="queries per group (default 5, the paper's)")
    p.add_argument("--bucket", default="medium", choices=list(BUCKETS),
                   help="M/V bucket of the queries (default medium: (0.2, 0.4], the paper's [0.2, 0.4])")
    p.add_argument("--smooth", type=int, default=5, metavar="W",
                   help="moving average over W groups drawn over the raw points (default 5; 1: none)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default: the first RAL record's folder)")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="root of real datasets when it differs from the one stored in the records (default: $PRVR_DATA)")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_uncertainty)


def _command(args: argparse.Namespace) -> str:
    """The command as stored: record paths shown as `prvr-bench evaluate` stores them, --out
    only where it is relative (no path of this machine)."""
    parts = ["prvr-bench", "uncertainty", "--run", *(_shown_path(Path(f)) for f in args.run)]
    if args.against:
        parts += ["--against", *(_shown_path(Path(f)) for f in args.against)]
    parts += ["--group", str(args.group), "--bucket", args.bucket]
    if args.smooth != 5:
        parts += ["--smooth", str(args.smooth)]
    if args.out and not Path(args.out).is_absolute():
        parts += ["--out", args.out]
    return shlex.join(parts)


def cmd_uncertainty(args: argparse.Namespace) -> None:
    if args.smooth < 1:
        raise UserError(f"--smooth must be a whole number >= 1, got {args.smooth}")
    root = args.data_root or os.environ.get("PRVR_DATA")
    reports = uncertainty_reports(args.run, args.against, args.group, args.bucket, args.device, root,
                                  _command(args))
    out = Path(args.out) if args.out else Path(args.run[0]).parent
    for report in reports:
        files = write_report(report, out, args.smooth)
        summary = ", ".join(f"{k} {v:.1f}" for k, v in report["overall"].items() if v is not None)
        print(f"{report['run']} on {report['dataset']}: {report['groups_per_seed']} groups of {report['group']} "
              f"{report['bucket']}-bucket queries ({report['dropped']} dropped); mean R@1 over groups: {summary}")
        progress.log(f"wrote {', '.join(str(f) for f in files)}")
