"""A simulated world's ambiguity against the real split it stands for (`prvr-bench calibrate-world`,
harness/cli/calibrate_world.py).

The targets come from census tables (`prvr-bench census`, harness/cli/census.py): the real one made
on the real split's text with a verified relevance file (`--relevance`), the simulated ones on
the world's test split, its preset and any remade worlds (`--set` / `--sweep`). Compared, per
world: the share of test queries with more than one relevant video and the relevant videos per
query (the split's ambiguity), and at each theta of Phi_sent the detector's recall and lift
(precision / base rate: how far above chance; unlike precision it does not fall as the
collection grows, and the real split has 4x the world's test videos). Phi_sent is the
comparison because it reads no parse: on real text the phrase Phis read a fallback parser's
phrases, in a world its gold parses, which would compare parsers as much as worlds.

Distance of a world to the real split: the mean over those figures of |ln(world / real)| (for
the relevant videos per query, of the extra ones: relevant_per_query - 1), so a factor of 2 off
costs the same on every figure. Target: every figure within a factor of TOLERANCE.

Verified labels mined from models' top candidates are a lower bound on relevance, so the real
ambiguity is at least what they say and the real lift is at most what they say (unverified
relevant pairs count as false detections): a world matched to them is a conservative world.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from prvr.harness.base.io import MAX_TEXT_BYTES, UserError, read_text
from prvr.harness.reports.table import csv_text, markdown_table

MAX_TABLE_BYTES = MAX_TEXT_BYTES  # a census table is a few kB; a 2 GB file is refused unread
TOLERANCE = 1.5  # each figure within a factor of 1.5 of the real split's
PHI = "sent"
AMBIGUITY = ("multi_relevant_share", "relevant_per_query")


@dataclass
class World:
    """One census table's figures: its ambiguity and, per theta, the detector's recall and lift."""

    name: str  # the preset, or its remade knobs
    source: str  # the census file it was read from
    ambiguity: dict[str, float]
    recall: dict[float, float] = field(default_factory=dict)
    lift: dict[float, float] = field(default_factory=dict)
    dataset: str = ""  # the census's dataset column: a registered name, simulated or real

    def figures(self, thetas: list[float]) -> dict[str, float]:
        out = dict(self.ambiguity)
        for t in thetas:
            out[f"recall@{t:g}"] = self.recall.get(t, math.nan)
            out[f"lift@{t:g}"] = self.lift.get(t, math.nan)
        return out


def _float(row: dict, key: str, path: Path, line: int) -> float:
    raw = row.get(key)
    try:
        value = float(raw)  # type: ignore[arg-type]  # None or text: the error below
    except (TypeError, ValueError):
        raise UserError(f"{path}, line {line}: no number in column {key!r}; make the table with this version's "
                        f"`prvr-bench census` (it writes {', '.join(AMBIGUITY)} and lift where relevance is known)"
                        ) from None
    if not (math.isfinite(value) and value >= 0):
        raise UserError(f"{path}, line {line}: column {key!r} is {raw!r}, not a figure a census gives (finite, "
                        ">= 0); make the table again with `prvr-bench census`")
    return value


def read_worlds(path: Path, split: str | None) -> list[World]:
    """The worlds of one census CSV (one per `world` value; the preset's is named by its
    dataset), its Phi_sent rows of `split` (None: the file's only split)."""
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{path}: no such census table; make it with `prvr-bench census` (docs/simulated-world.md)")
    text = read_text(path, "census table", "give a CSV that `prvr-bench census` wrote", MAX_TABLE_BYTES)
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as e:  # e.g. a field larger than the csv module's limit: no census writes one
        raise UserError(f"census table {path} is not a census CSV ({e}); give a CSV that `prvr-bench census` "
                        "wrote") from None
    splits = sorted({r.get("split", "") for r in rows})
    if split is None and len(splits) > 1:
        raise UserError(f"{path}: rows of splits {', '.join(splits)}; pass --split to say which is compared")
    worlds: dict[str, World] = {}
    for line, r in enumerate(rows, start=2):
        if r.get("phi") != PHI or (split is not None and r.get("split") != split):
            continue
        name = r.get("world") or r.get("dataset", "")
        w = worlds.setdefault(name, World(name, path.name, {k: _float(r, k, path, line) for k in AMBIGUITY},
                                                 dataset=r.get("dataset") or ""))
        theta = round(_float(r, "theta", path, line), 4)
        w.recall[theta] = _float(r, "recall", path, line)
        w.lift[theta] = _float(r, "lift", path, line)
    if not worlds:
        raise UserError(f"{path}: no Phi_{PHI} rows{f' of split {split}' if split else ''}; run the census with "
                        f"--phi {PHI} (and --split test for a simulated world)")
    return list(worlds.values())


def ratio_to_real(world: float, real: float, key: str) -> float:
    """world / real for one figure (NaN where either is not positive); relevant videos per
    query compared as the extra ones beyond the labelled video."""
    if key == "relevant_per_query":  # the extra relevant videos: 1.2 against 2.0 is a factor of 5, not 1.7
        world, real = world - 1, real - 1
    if not (world > 0 and real > 0):
        return math.nan
    return world / real


def near_enough(ratio: float) -> bool:
    """Within a factor of TOLERANCE (False for NaN)."""
    return 1 / TOLERANCE <= ratio <= TOLERANCE


def distance(world: World, real: World, thetas: list[float]) -> float:
    """Mean |ln(world / real)| over the compared figures (NaN where one is missing)."""
    w, r = world.figures(thetas), real.figures(thetas)
    logs = [abs(math.log(ratio_to_real(w[k], r[k], k))) for k in r]
    return sum(logs) / len(logs) if logs else math.nan


def within(world: World, real: World, thetas: list[float]) -> list[str]:
    """The figures off by more than TOLERANCE (or missing)."""
    w, r = world.figures(thetas), real.figures(thetas)
    off = []
    for k in r:
        if not near_enough(ratio_to_real(w[k], r[k], k)):
            off.append(k)
    return off


def render(dataset: str, real: World, worlds: list[World], thetas: list[float], command: str,
           marked: dict[str, str]) -> tuple[str, str]:
    """The report (markdown) and its CSV."""
    keys = list(real.figures(thetas))
    head = ["world", "source", *keys, "distance", "off by more than x1.5", "note"]
    body = []
    for w in [real, *worlds]:
        fig = w.figures(thetas)
        is_real = w is real
        dist = "" if is_real else f"{distance(w, real, thetas):.3f}"
        off = "" if is_real else (", ".join(within(w, real, thetas)) or "none")
        body.append([w.name, w.source, *(f"{fig[k]:.4g}" for k in keys), dist, off,
                     "the real split (verified relevance)" if is_real else marked.get(w.name, "")])
    md = [f"# {dataset}: ambiguity against the real split", "",
          f"Written by `{command}`; the method: harness/reports/world_calibration.py and docs/simulated-world.md "
          "(\"Real ambiguity\"). Figures of Phi_sent (no parse) at each theta; `lift` = precision / base rate; "
          "`relevant_per_query` counts the labelled video; `distance` = mean |ln(world / real)| over the figures "
          "(for relevant_per_query, of the extra relevant videos).", "",
          markdown_table(head, body)]
    return "\n".join(md) + "\n", csv_text(head, body)
