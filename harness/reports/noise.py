"""Noise robustness curves (RAL paper, Fig. 5): test SumR as a segment of p x each test
video's length is inserted at its start (datasets/noise.py), for every method.

- `noise_curve` (harness/engine/robustness.py, the engine's: a run makes it): one model's curve,
  each level through the suite's evaluator (`evaluate_model` on the noisy test split).
  `prvr-bench run` stores it in the record as `metrics.noise` when `eval.noise_levels` is set; `prvr-bench evaluate --noise-levels` makes
  it for a stored run from its best checkpoint and stores it beside the record as
  `seed<S>.noise-<source>.json` (the record itself is never changed).
- `write_reports`: for every dataset with curves, `<out>/noise/<dataset>.png` (SumR against
  p, one line per run, mean over seeds with a +-1 std band) and `<out>/noise/<dataset>.md`
  (SumR per level, mean +- std over seeds); `prvr-bench leaderboard` writes them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, read_json, write_json, write_png, write_text
from prvr.harness.base.names import check_name, inside
from prvr.harness.engine.record_types import NoiseCurve, RunRecord
from prvr.harness.engine.records import budget_label
from prvr.harness.reports.rows import baseline, dataset_label, diverged, record_protocol
from prvr.harness.reports.table import code, markdown_table, mean_std

CURVE_FILE = re.compile(r"seed(\d+)\.noise-(\w+)\.json")


def check_levels(levels, what: str) -> list[float]:
    """Levels given on the command line: numbers in [0, 1], each once (one-line errors)."""
    bad = [p for p in levels if not (0.0 <= float(p) <= 1.0)]
    if bad:
        raise UserError(f"{what} must be numbers in [0, 1], got {bad[0]!r}")
    if len({float(p) for p in levels}) != len(levels):
        raise UserError(f"{what} must be distinct, got {' '.join(f'{p:g}' for p in levels)}")
    return [float(p) for p in levels]


# --------------------------------------------------------------------------- stored curves
def curve_path(record_file: str | Path, source: str) -> Path:
    """Where `prvr-bench evaluate --noise-levels` stores a run's curve: beside its record."""
    record_file = Path(record_file)
    return record_file.parent / f"{record_file.stem}.noise-{source}.json"


def store_curve(record_file: str | Path, record: RunRecord, curve: NoiseCurve, command: str) -> Path:
    """Write a curve beside its record (levels already stored there for the source are kept
    unless measured again)."""
    path = curve_path(record_file, curve["source"])
    levels: dict[str, Any] = {}
    if path.exists():
        try:
            old = read_json(path, "noise curve")
            if isinstance(old, dict) and isinstance(old.get("levels"), dict):
                levels.update(old["levels"])
        except UserError:
            pass  # a damaged curve file is replaced
    levels.update(curve["levels"])
    levels = dict(sorted(levels.items(), key=lambda kv: float(kv[0])))
    write_json(path, {"dataset": record.get("dataset"), "run_name": record.get("run_name"), "seed": record.get("seed"),
                      "source": curve["source"], "levels": levels, "checkpoint": "best.pt", "command": command})
    return path


def _curves_of(record: RunRecord, folder: Path | None) -> dict[str, dict[str, Any]]:
    """source -> {"levels": {...}, "commands": [...]} of one record: its `metrics.noise` and
    the curves stored beside it (a stored level wins: it was measured later)."""
    out: dict[str, dict[str, Any]] = {}
    own = record.get("metrics", {}).get("noise")
    if isinstance(own, dict) and isinstance(own.get("levels"), dict) and isinstance(own.get("source"), str):
        out[own["source"]] = {"levels": dict(own["levels"]), "commands": [c for c in [record.get("command", "")] if c]}
    if folder is not None:
        for path in sorted(folder.glob(f"seed{record['seed']}.noise-*.json")):
            m = CURVE_FILE.fullmatch(path.name)
            if not m or int(m.group(1)) != record["seed"]:
                continue
            try:
                stored = read_json(path, "noise curve")
            except UserError as e:
                progress.log(f"[yellow]skipped[/]: {e}")
                continue
            if not isinstance(stored, dict) or not isinstance(stored.get("levels"), dict):
                progress.log(f"[yellow]skipped[/]: noise curve {path} holds no levels")
                continue
            entry = out.setdefault(m.group(2), {"levels": {}, "commands": []})
            entry["levels"].update(stored["levels"])
            if stored.get("command"):
                entry["commands"].append(stored["command"])
    return out


# --------------------------------------------------------------------------- reports
def noise_groups(root: str | Path, records: list[RunRecord]) -> dict[str, list[dict[str, Any]]]:
    """dataset -> one group per (run, budget, source): {run, budget, source, seeds, levels:
    {level: [SumR per seed] (only levels every seed has)}, all_levels, commands}. Diverged
    runs are left out, as in the leaderboard."""
    root = Path(root)
    groups: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if diverged(r):
            continue
        run = r.get("run_name", r["method"])
        folder = root / "runs" / r["dataset"] / run
        for source, curve in _curves_of(r, folder if folder.is_dir() else None).items():
            key = (dataset_label(r), run, budget_label(record_protocol(r)), source)
            g = groups.setdefault(key, {"dataset": key[0], "run": run, "budget": key[2], "source": source,
                                        "per_seed": {}, "commands": set()})
            g["per_seed"][r["seed"]] = {k: float(v["SumR"]) for k, v in curve["levels"].items()
                                        if isinstance(v, dict) and isinstance(v.get("SumR"), (int, float))}
            g["commands"].update(curve["commands"])
    out: dict[str, list[dict[str, Any]]] = {}
    for key in sorted(groups, key=lambda k: (k[0], k[1] != baseline(), k[1], k[2], k[3])):
        g = groups[key]
        seeds = sorted(g["per_seed"])
        every = set.intersection(*(set(g["per_seed"][s]) for s in seeds)) if seeds else set()
        union = set().union(*(set(g["per_seed"][s]) for s in seeds)) if seeds else set()
        g["seeds"] = seeds
        g["levels"] = {k: [g["per_seed"][s][k] for s in seeds] for k in sorted(every, key=float)}
        g["all_levels"] = sorted(union, key=float)
        g["commands"] = sorted(g["commands"])
        out.setdefault(g["dataset"], []).append(g)
    return out


def _label(g: dict[str, Any], groups: list[dict[str, Any]], source: bool = True) -> str:
    """A row's name: the run, with its budget where the run has rows of several budgets and
    (`source`) its noise source where the dataset's rows use several."""
    label = g["run"]
    if len({x["budget"] for x in groups if x["run"] == g["run"]}) > 1:
        label += f" [{g['budget']}]"
    if source and len({x["source"] for x in groups}) > 1:
        label += f" ({g['source']})"
    return label


def report_markdown(dataset: str, groups: list[dict[str, Any]], command: str = "prvr-bench leaderboard") -> str:
    levels = sorted({k for g in groups for k in g["all_levels"]}, key=float)
    head = ["run", "source", "seeds", *(f"p={float(k):g}" for k in levels)]
    lines = [f"# Noise robustness: {dataset}", "",
             "Test SumR of each run's best checkpoint when every test video starts with an inserted segment of "
             "p x its length (round(p x its rows) feature rows, p x its duration in seconds; timestamps move with "
             "it): mean ± std over seeds. Source `other`: a run of rows of another test video; `gaussian`: rows "
             "drawn from the test split's per-dimension mean and std (docs/evaluation.md, \"Noise robustness\"). "
             "A level not measured for every seed of a row is an empty cell.", "",
             f"Written by `{command}` from the run records' `metrics.noise` (`prvr-bench run ... --set "
             "eval.noise_levels=[...]`) and the curves `prvr-bench evaluate RECORD --noise-levels ...` stores "
             "beside them (`seed<S>.noise-<source>.json`); figure: `" + f"{dataset}.png`.", "",
             markdown_table(head, ([_label(g, groups, source=False), g["source"],
                                    f"{len(g['seeds'])} ({' '.join(str(s) for s in g['seeds'])})",
                                    *(mean_std(g["levels"].get(k) or []) for k in levels)] for g in groups))]
    commands = [(_label(g, groups), c) for g in groups for c in g["commands"]]
    if commands:
        lines += ["", "Commands that made the curves:", ""]
        lines += [f"- {label}: {code(c, in_table=False)}" for label, c in commands]
    return "\n".join(lines) + "\n"


def plot(dataset: str, groups: list[dict[str, Any]], path: str | Path) -> None:
    """SumR against p, one line per row, mean over seeds with a +-1 std band (PNG, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for g in groups:
        if not g["levels"]:
            continue
        x = np.array([float(k) for k in g["levels"]])
        values = [np.asarray(v) for v in g["levels"].values()]
        mean = np.array([v.mean() for v in values])
        line, = ax.plot(x, mean, marker="o", markersize=3.5, linewidth=1.4,
                        label=f"{_label(g, groups)} (n={len(g['seeds'])})")
        if len(g["seeds"]) > 1:
            std = np.array([v.std(ddof=1) for v in values])
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.18, linewidth=0)
    ax.set_xlabel("noise level p (inserted segment / video length)")
    ax.set_ylabel("test SumR")
    ax.set_title(f"{dataset}: robustness to an inserted segment (mean ± std over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_png(fig, path)


def write_reports(root: str | Path, records: list[RunRecord],
                  command: str = "prvr-bench leaderboard") -> list[Path]:
    """`<root>/noise/<dataset>.{png,md}` for every dataset with curves; the files written."""
    written: list[Path] = []
    for dataset, groups in noise_groups(root, records).items():
        name = re.sub(r"[^A-Za-z0-9_.+@~-]+", "-", dataset).strip("-.")  # "tvr (export of sim-tvr)" -> a file name
        check_name(name, "noise report name", "rename the dataset")
        folder = inside(Path(root) / "noise", root, "noise report folder")
        png, md = folder / f"{name}.png", folder / f"{name}.md"
        plot(dataset, groups, png)
        write_text(md, report_markdown(dataset, groups, command).replace(f"`{dataset}.png`", f"`{name}.png`"))
        written += [png, md]
    return written
