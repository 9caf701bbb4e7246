"""The speed table: our code beside the official code, seconds per epoch and peak memory, from the
parity reports (docs/speed.md).

`prvr-bench parity` writes, beside each report `OUT/parity/NAME.md`, a sidecar `OUT/parity/NAME.json`
(`ParitySidecar`): the SumR verdict, and per side the epochs, seconds per epoch, evaluation share, peak
host memory and device peak, each side with how it was measured. `prvr-bench speed` reads every sidecar
(untrusted input: every key checked, one line naming the file and key for a bad one) and writes
`OUT/speed.md` and `OUT/speed.csv`, one row per parity report. Only parity runs fill it: a run that was
not compared with its official code has no row.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from prvr.harness.base.io import UserError, read_json
from prvr.harness.engine.records import NULL, Kind, field_problem, figure_problem
from prvr.harness.reports.table import code, csv_text, fenced, markdown_table

PARITY_VERSION = 1
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@~-]*")  # a parity report's --name, and so its files' names
VERDICTS = ("within", "outside")  # the best validation SumRs, against the tolerance


class SideSpeed(TypedDict):
    """One side's cost: what a parity report's "Speed and memory" block shows of it."""

    epochs: int | None  # official: the epochs in its log; ours: the record's epochs_run
    seconds_per_epoch: float | None
    eval_share: float | None  # the share of those seconds spent evaluating, where known
    peak_host_mb: float | None
    device_peak_mb: float | None
    device: str
    measured: str  # how these figures were measured, in words


class SumRVerdict(TypedDict):
    """The best validation SumR of each side, their difference and whether it is within the tolerance;
    for a backbone that localizes (XML), the best validation VCMR SumR of each side too (absent from
    sidecars written before they held it, null where a side has none)."""

    official_best: float
    ours_best: float
    delta: float  # ours − official
    tolerance: float
    verdict: str  # one of VERDICTS
    official_test: float | None
    ours_test: float | None
    official_best_vcmr: NotRequired[float | None]
    ours_best_vcmr: NotRequired[float | None]


class Ratios(TypedDict):
    """Official / ours, where both sides have the figure (and ours is not 0)."""

    seconds_per_epoch: float | None
    peak_host_mb: float | None
    device_peak_mb: float | None


class ParitySidecar(TypedDict):
    """OUT/parity/NAME.json: what a table needs of one parity report."""

    parity_version: int
    name: str
    report: str  # the report's file name, beside the sidecar
    command: str  # the parity command, this machine's paths hidden
    method: str
    run: str
    dataset: str
    seed: int
    sumr: SumRVerdict
    official: SideSpeed
    ours: SideSpeed
    ratio: Ratios
    started_from: NotRequired[str]  # the SHA-256 of the official weights our run started from (train.init_weights)


SIDES = ("official", "ours")
SIDE_FIELDS: tuple[tuple[str, Kind], ...] = (
    ("epochs", (int, NULL)), ("seconds_per_epoch", (float, NULL)), ("eval_share", (float, NULL)),
    ("peak_host_mb", (float, NULL)), ("device_peak_mb", (float, NULL)), ("device", str), ("measured", str))
SIDECAR_FIELDS: tuple[tuple[str, Kind], ...] = (
    ("parity_version", int), ("name", str), ("report", str), ("command", str), ("method", str), ("run", str),
    ("dataset", str), ("seed", int), ("sumr", dict), ("sumr.official_best", float), ("sumr.ours_best", float),
    ("sumr.delta", float), ("sumr.tolerance", float), ("sumr.verdict", str), ("sumr.official_test", (float, NULL)),
    ("sumr.ours_test", (float, NULL)), *((side, dict) for side in SIDES),
    *((f"{side}.{key}", kind) for side in SIDES for key, kind in SIDE_FIELDS), ("ratio", dict),
    *((f"ratio.{key}", (float, NULL)) for key in Ratios.__annotations__))
SIDECAR_OPTIONAL: tuple[tuple[str, Kind], ...] = (("sumr.official_best_vcmr", (float, NULL)),
                                                  ("sumr.ours_best_vcmr", (float, NULL)),
                                                  ("started_from", str))
SIDECAR_FIGURES = (*(f"{side}.{key}" for side in SIDES for key in ("epochs", "seconds_per_epoch", "peak_host_mb",
                                                                   "device_peak_mb")),
                   *(f"ratio.{key}" for key in Ratios.__annotations__), "sumr.tolerance", "seed")


def ratio(official: float | None, ours: float | None) -> float | None:
    """official / ours, where both are known and ours is not 0."""
    return round(official / ours, 3) if official is not None and ours else None


def ratios(official: SideSpeed, ours: SideSpeed) -> Ratios:
    return {"seconds_per_epoch": ratio(official["seconds_per_epoch"], ours["seconds_per_epoch"]),
            "peak_host_mb": ratio(official["peak_host_mb"], ours["peak_host_mb"]),
            "device_peak_mb": ratio(official["device_peak_mb"], ours["device_peak_mb"])}


# ----------------------------------------------------------------------------- reading sidecars


def read_sidecar(path: str | Path) -> ParitySidecar:
    """A parity sidecar, read as untrusted input: every key of SIDECAR_FIELDS with its type, every
    figure finite and not negative, a name and verdict the suite writes; else one line naming the key."""
    data = read_json(path, what="parity sidecar")
    fix = "write it again with `prvr-bench parity ...`, or delete it"
    if not isinstance(data, dict):
        raise UserError(f"parity sidecar {path} holds {type(data).__name__}, expected an object; {fix}")
    problem = field_problem(data, SIDECAR_FIELDS) or field_problem(data, SIDECAR_OPTIONAL, optional=True) \
        or figure_problem(data, (*SIDECAR_FIGURES, *(key for key, _ in SIDECAR_OPTIONAL))) \
        or figure_problem(data, [f"{side}.eval_share" for side in SIDES], high=1.0)
    if problem is None and data["parity_version"] != PARITY_VERSION:
        problem = "parity_version", f"{data['parity_version']!r} is not a version this prvr-bench reads ({PARITY_VERSION})"
    if problem is None and not NAME.fullmatch(data["name"]):
        problem = "name", f"{data['name'][:40]!r} is not a report name (letters, digits and _ . + @ ~ -)"
    if problem is None and data["sumr"]["verdict"] not in VERDICTS:
        problem = "sumr.verdict", f"{data['sumr']['verdict'][:40]!r} is not one of {', '.join(VERDICTS)}"
    if problem is not None:
        key, what = problem
        raise UserError(f"parity sidecar {path} key {key!r}: {what}; {fix}")
    return cast(ParitySidecar, data)


def sidecars(out: str | Path) -> list[ParitySidecar]:
    """Every sidecar in OUT/parity/, by dataset, method and name."""
    found = [read_sidecar(p) for p in sorted((Path(out) / "parity").glob("*.json"))]
    return sorted(found, key=lambda s: (s["dataset"], s["method"], s["name"]))


# ----------------------------------------------------------------------------- the table


HEADER = ("method", "run", "dataset", "device", "epochs (ours / official)", "ours s / epoch", "official s / epoch",
          "official / ours", "ours peak host MB", "official peak host MB", "ours device peak MB",
          "official device peak MB", "Δ best val SumR", "verdict", "report")
NOTE = ("Only parity runs fill this table: one row per `prvr-bench parity` report that has its sidecar "
        "(`parity/NAME.json`; a report written before parity wrote sidecars has none until its parity command "
        "runs again), and the official side's figures only where it was given `--official-usage`. Seconds per "
        "epoch are wall seconds per epoch run; official / ours above 1 means the official code is the slower. How "
        "each side was measured (`prvr-bench measure` around the whole command, or our run record's timings and "
        "resources) is written in each row's report and in the CSV; docs/speed.md says what each measure counts.")


def _number(value: float | None, decimals: int = 1) -> str:
    return "" if value is None else f"{value:,.{decimals}f}"


def _device(sidecar: ParitySidecar) -> str:
    ours, official = sidecar["ours"]["device"], sidecar["official"]["device"]
    return ours if ours == official or not official else f"ours: {ours}; official: {official}"


def row(sidecar: ParitySidecar) -> list[str]:
    ours, official, sumr = sidecar["ours"], sidecar["official"], sidecar["sumr"]
    epochs = f"{'' if ours['epochs'] is None else ours['epochs']} / " \
             f"{'' if official['epochs'] is None else official['epochs']}"
    return [sidecar["method"], sidecar["run"], sidecar["dataset"], _device(sidecar), epochs,
            _number(ours["seconds_per_epoch"], 2), _number(official["seconds_per_epoch"], 2),
            _number(sidecar["ratio"]["seconds_per_epoch"], 2), _number(ours["peak_host_mb"], 0),
            _number(official["peak_host_mb"], 0), _number(ours["device_peak_mb"], 0),
            _number(official["device_peak_mb"], 0), f"{sumr['delta']:+.1f}", f"{sumr['verdict']} {sumr['tolerance']:g}",
            code(f"parity/{sidecar['report']}")]


def csv_row(sidecar: ParitySidecar) -> list[str]:
    """The table's row with the full figures (no thousands separators), how each side was measured and
    the parity command."""
    ours, official, sumr = sidecar["ours"], sidecar["official"], sidecar["sumr"]
    plain = [sidecar["method"], sidecar["run"], sidecar["dataset"], _device(sidecar),
             f"{'' if ours['epochs'] is None else ours['epochs']} / "
             f"{'' if official['epochs'] is None else official['epochs']}"]
    figures = [ours["seconds_per_epoch"], official["seconds_per_epoch"], sidecar["ratio"]["seconds_per_epoch"],
               ours["peak_host_mb"], official["peak_host_mb"], ours["device_peak_mb"], official["device_peak_mb"]]
    return [*plain, *("" if f is None else f"{f:g}" for f in figures), f"{sumr['delta']:+.2f}",
            f"{sumr['verdict']} {sumr['tolerance']:g}", f"parity/{sidecar['report']}", ours["measured"],
            official["measured"], sidecar["command"]]


def speed_markdown(found: list[ParitySidecar]) -> str:
    lines = ["# Speed and memory: ours beside the official code", "",
             "Written by `prvr-bench speed` (harness/reports/speed.py) from the parity reports' sidecars.", "", NOTE, ""]
    if not found:
        lines += ["No parity report has a sidecar yet, so the table has no row: run `prvr-bench parity ... "
                  "--official-usage USAGE.json` (docs/parity.md) and then `prvr-bench speed`.", ""]
    lines += [markdown_table(HEADER, [row(s) for s in found]), ""]
    if found:
        lines += ["## Produced by", "", fenced([s["command"] for s in found]), ""]
    return "\n".join(lines)


def speed_files(out: str | Path, found: list[ParitySidecar]) -> dict[Path, str]:
    """OUT/speed.md and OUT/speed.csv from the sidecars `found` (a table that says so where there are none)."""
    header = [*HEADER, "ours measured", "official measured", "parity command"]
    return {Path(out) / "speed.md": speed_markdown(found),
            Path(out) / "speed.csv": csv_text(header, [csv_row(s) for s in found])}
