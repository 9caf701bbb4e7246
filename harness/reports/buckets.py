"""M/V bucket comparison (RAL paper, section 4.2, Fig. 4): test R@1 and SumR of every run of a
dataset per M/V bucket (short (0, 0.2], medium (0.2, 0.4], long (0.4, 1]; harness/engine/evaluate.py
`BUCKETS`, `bucket_of`), from the run records' `metrics.test.buckets`: no checkpoint needed.

`write_reports` writes, for every dataset whose records carry bucket metrics,
`<out>/buckets/<dataset>.png` (grouped bars per bucket, one bar per run: mean over seeds with
a +-1 std error bar; R@1 and SumR side by side) and `<out>/buckets/<dataset>.md` (mean ± std
over seeds per run and bucket, and the number of queries per bucket); `prvr-bench leaderboard`
writes them. Only runs on their dataset's protocol enter (a leaderboard row's `on_protocol`),
and diverged runs are left out, as in the leaderboard. A metric that some seed of a row lacks
is an empty cell (no bar), never a mean over what happens to exist.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from prvr.harness.engine.evaluate import BUCKETS
from prvr.harness.base.io import write_png, write_text
from prvr.harness.base.names import check_name, inside
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import budget_label
from prvr.harness.reports.rows import baseline, dataset_label, diverged, record_protocol
from prvr.harness.reports.table import markdown_table, mean_std

METRICS = ("R@1", "SumR")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def bucket_groups(records: list[RunRecord]) -> dict[str, list[dict[str, Any]]]:
    """dataset -> one group per (run, budget) on the dataset's protocol: {dataset, run, budget,
    seeds, values: {bucket: {metric: [per seed] or [] where a seed lacks it}}, n: {bucket:
    sorted distinct query counts over the seeds}}. Diverged and off-protocol runs are left out."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        if diverged(r):
            continue
        protocol = record_protocol(r)
        if not protocol["follows_protocol"]:
            continue
        buckets = r.get("metrics", {}).get("test", {}).get("buckets")
        if not isinstance(buckets, dict) or not any(isinstance(buckets.get(b), dict) for b in BUCKETS):
            continue
        run = r.get("run_name", r["method"])
        key = (dataset_label(r), run, budget_label(protocol))
        g = groups.setdefault(key, {"dataset": key[0], "run": run, "budget": key[2], "per_seed": {}})
        g["per_seed"][r["seed"]] = {b: buckets[b] if isinstance(buckets.get(b), dict) else {} for b in BUCKETS}
    out: dict[str, list[dict[str, Any]]] = {}
    for key in sorted(groups, key=lambda k: (k[0], k[1] != baseline(), k[1], k[2])):
        g = groups.pop(key)
        seeds = sorted(g.pop("per_seed").items())
        g["seeds"] = [s for s, _ in seeds]
        g["values"], g["n"] = {}, {}
        for b in BUCKETS:
            g["values"][b] = {}
            for m in METRICS:
                values = [v for _, per in seeds if (v := _number(per[b].get(m))) is not None]
                g["values"][b][m] = values if len(values) == len(seeds) else []
            g["n"][b] = sorted({int(n) for _, per in seeds if (n := _number(per[b].get("n"))) is not None})
        out.setdefault(g["dataset"], []).append(g)
    return out


def _label(g: dict[str, Any], groups: list[dict[str, Any]]) -> str:
    """The run, with its budget where the dataset has rows of several budgets for it."""
    several = len({x["budget"] for x in groups if x["run"] == g["run"]}) > 1
    return f"{g['run']} [{g['budget']}]" if several else g["run"]


def _counts(ns: list[int]) -> str:
    return "?" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"


def _bucket_title(name: str) -> str:
    lo, hi = BUCKETS[name]
    return f"{name} ({lo:g}, {hi:g}]"


def report_markdown(dataset: str, groups: list[dict[str, Any]], png_name: str,
                    command: str = "prvr-bench leaderboard") -> str:
    head = ["run", "seeds", *(f"{b} {m}" for m in METRICS for b in BUCKETS),
            "queries (" + " / ".join(BUCKETS) + ")"]
    shared = {b: sorted({n for g in groups for n in g["n"][b]}) for b in BUCKETS}
    differ = any(len(ns) > 1 for ns in shared.values())
    lines = [f"# M/V buckets: {dataset}", "",
             "RAL paper Fig. 4 on this suite's runs: test R@1 and SumR (percent) per M/V bucket, the test queries "
             "grouped by the length of their moment over their video's (r: " +
             ", ".join(_bucket_title(b) for b in BUCKETS) + "); mean ± std over seeds. Only runs on the dataset's "
             "protocol (the leaderboard's rows without *off protocol*); runs whose loss became non-finite are left "
             "out. An empty cell: a seed of the row lacks that figure.", "",
             f"Written by `{command}` from the run records' `metrics.test.buckets` (no checkpoint needed); "
             f"figure: `{png_name}`.", "",
             "Test queries per bucket: " + ", ".join(f"{b} {_counts(shared[b])}" for b in BUCKETS)
             + (" (a range: the rows differ; each row's in the last column)." if differ else "."), "",
             markdown_table(head, ([_label(g, groups), f"{len(g['seeds'])} ({' '.join(map(str, g['seeds']))})",
                                    *(mean_std(g["values"][b][m]) for m in METRICS for b in BUCKETS),
                                    " / ".join(_counts(g["n"][b]) for b in BUCKETS)] for g in groups))]
    return "\n".join(lines) + "\n"


def plot(dataset: str, groups: list[dict[str, Any]], path: str | Path) -> None:
    """Grouped bars: per metric a panel, per bucket a group, per run a bar (mean over seeds,
    +-1 std error bar where it has several seeds); PNG with Agg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    names = list(BUCKETS)
    shared = {b: sorted({n for g in groups for n in g["n"][b]}) for b in names}
    width = 0.8 / max(len(groups), 1)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(max(8.0, 2.0 + 0.24 * len(groups) * len(names)), 4.6))
    for ax, metric in zip(np.atleast_1d(axes), METRICS):
        for i, g in enumerate(groups):
            x = np.arange(len(names)) - 0.4 + width * (i + 0.5)
            vals = [g["values"][b][metric] for b in names]
            mean = np.array([np.mean(v) if v else np.nan for v in vals])
            std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in vals])
            ax.bar(x, mean, width, yerr=std, capsize=2, color=f"C{i % 10}", hatch="//" if i >= 10 else None,
                   error_kw={"linewidth": 0.8}, label=f"{_label(g, groups)} (n={len(g['seeds'])})")
        ax.set_xticks(np.arange(len(names)))
        ax.set_xticklabels([f"{_bucket_title(b)}\n{_counts(shared[b])} queries" for b in names], fontsize=8)
        ax.set_ylabel(f"test {metric}")
        ax.set_title(metric, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.suptitle(f"{dataset}: M/V buckets (mean ± std over seeds; runs on the protocol)", fontsize=9)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(groups), 5), fontsize=7, frameon=False)
    rows = -(-len(groups) // 5)
    fig.tight_layout(rect=(0, min(0.045 * rows + 0.02, 0.45), 1, 0.96))
    write_png(fig, path)


def write_reports(root: str | Path, records: list[RunRecord],
                  command: str = "prvr-bench leaderboard") -> list[Path]:
    """`<root>/buckets/<dataset>.{png,md}` for every dataset with bucket metrics; the files written."""
    written: list[Path] = []
    for dataset, groups in bucket_groups(records).items():
        name = re.sub(r"[^A-Za-z0-9_.+@~-]+", "-", dataset).strip("-.")  # "tvr (export of sim-tvr)" -> a file name
        check_name(name, "bucket report name", "rename the dataset")
        folder = inside(Path(root) / "buckets", root, "bucket report folder")
        png, md = folder / f"{name}.png", folder / f"{name}.md"
        plot(dataset, groups, png)
        write_text(md, report_markdown(dataset, groups, png.name, command))
        written += [png, md]
    return written
