"""`prvr-bench matrix`: relation detectors x treatments x backbones, each cell a recipe of registered parts.

    prvr-bench matrix --dataset sim-tvr-v2 --seeds 0 1 2 --jobs 2 --plan

A cell (detector D, treatment T, backbone B) is an ordinary `prvr-bench run`: a registered method, B, and
`--set` items of existing config keys, derived here from the registries and the fit rules
(methods/fit.py), never new code:

- the method: B's own (`home_method`) where its loss has T as a `loss.treatment` value (ARL's on its
  backbone; baseline's, MS-SL's and GMMFormer's restrain); else T's own (`restrain`: ARL's objective;
  `multi-level`: the SBERT-PR multi-level ranking loss), or, for `positive` and `ignore`, B's own method;
- `relations.name=D`; T as the method's `loss.treatment` where its loss has that knob, the detector's
  pairs then handed over as ambiguous sets (`relations.D.mode=ignore` where D has a mode), except where
  the loss's T trains what D's mode T gives (`as_detector_modes`: the standard objectives' positive and
  ignore) and D has that mode; else T as the detector's `relations.D.mode` where D has one (the oracle);
  else `ignore` is what every objective does with ambiguous pairs (they leave `Relations.negative`), and
  `positive` cannot work;
- on the backbone of a method that names a treatment row (`MethodSpec.treatment_row`: ARL's `tv_only`), a
  cell of that method's own objective starts from the row's settings, so it differs from the backbone's plain
  cell (the method's base row, `arl~base`) by D and T alone; its tag is the row's, joined to T where T is not
  the loss's default (`arl+oracle~tv_only-ignore`, `arl~tv_only` for ARL's own detector under restrain);
- with D = none no pair is detected, so every treatment whose objective fits B trains B's plain cell:
  B's own method on the labels, or the row it names as its base (`MethodSpec.base_row`: `arl~base`);
- `soft` reads the detector's confidence in the labelled pairs (Holmes' soft targets): B's own method with
  `loss.treatment=soft` (baseline, msl, gmmformer), else Holmes' objective (on Holmes' backbone); a detector
  that trusts every label (`doubts_labels` false: all but holmes) makes the targets the labels, so its soft
  cell is its ignore cell; a detector that finds no pair (`finds_pairs` false: holmes) gives the other
  treatments nothing to treat, so on an objective that reads its confidence only under soft they train B's
  plain cell, as with none.

A cell whose parts do not fit (the objective or the detector needs an output B lacks; a treatment the
detector cannot give) is a cell with its one-line reason and trains nothing. The run's name is
`runner.run_name` with the suite's tag conventions: the plain name where the cell's config is the
untagged run's (so `baseline+oracle`, `arl`, `arl+oracle`, `arl~base` are the runs the suite has), else
tagged by the method's ablation row of the same overrides (`arl~positive`, ARL's Table 6) or by T
(`baseline+oracle~ignore`); world knobs given with `--set sim.K=V` tag the runs as a sweep does
(`baseline~repeat_prob1`), and `--tag` adds its own. A run whose record exists is kept. Every cell is
resolved before the first run trains; the report (harness/reports/matrix.py) follows from the records,
also alone with `--report-only`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import shlex
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, ensure_dir
from prvr.harness.base.names import check_name, check_tag, unknown_message
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS, home_method
from prvr.harness.cli.args import add_jobs_argument, command, command_line, common_arguments, data_root_overrides, \
    run_args, run_line, set_threads
from prvr.harness.cli.fanout import launch_from_args, run_in_processes
from prvr.harness.cli.plan import PROFILE_FILE, BenchRun, Estimate, PlanRow, check_kept, duration, estimate, profile_costs, \
    total_line
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import record_path
from prvr.harness.engine.runner import run_name, run_one
from prvr.harness.engine.sections import Config
from prvr.harness.reports.matrix import Matrix, MatrixCell, write_matrix
from prvr.harness.reports.sweeps import point_tag
from prvr.methods.backbones.api import missing_outputs
from prvr.methods.fit import check_fit, fitting_backbones, method_needs
from prvr.methods.recipes import TABLES
from prvr.methods.relations.sbert import missing_text_extra


@dataclass(frozen=True)
class Treatment:
    """What a cell does with the detected pairs."""

    name: str
    summary: str
    method: str = ""  # the method whose objective it is; "": each backbone's own method
    positive: bool = False  # the detected pairs must arrive as positives (else as ambiguous sets)
    confidence: bool = False  # reads the detector's confidence in the labelled pairs, not its pairs


TREATMENTS = {t.name: t for t in (
    Treatment("positive", "the detected pairs count as positives (ARL Table 6 'Positive'; the oracle's mode positive)",
              positive=True),
    Treatment("ignore", "the detected pairs leave the negatives and are not trained (ARL Table 6 'Ignore')"),
    Treatment("restrain", "ARL's restrained objective: the detected pairs kept above the negatives and below the "
                          "positive by the smaller margin m_a (ARL Eq. 11-12); on the backbones of baseline, msl "
                          "and gmmformer their own objective with loss.treatment=restrain (ARL's Eq. 11 on each "
                          "branch)", "arl"),
    Treatment("multi-level", "the multi-level ranking loss of the SBERT potentially-relevant pairs paper: the "
                             "detected pairs ranked between positives and negatives with the detector's confidence "
                             "(SBERT-PR Eq. 10-13)", "xml-pr"),
    Treatment("soft", "Holmes' query-adaptive labels: the text-to-video targets soften by the detector's confidence "
                      "in each labelled pair, c y + (1 - c) mean_b softmax(s_b); on the backbones of baseline, msl "
                      "and gmmformer their own objective with loss.treatment=soft (its InfoNCE's text-to-video "
                      "term), on Holmes' backbone Holmes' objective (its evidential targets)", "holmes",
              confidence=True),
)}
DEFAULT_DETECTORS = ("none", "oracle", "arl", "sbert", "holmes")
DEFAULT_BACKBONES = ("dual-branch", "msl", "gmmformer", "arl")
NO_DETECTOR = "none"
AMBIGUOUS_MODE = "ignore"  # a detector mode that hands its pairs over as ambiguous sets (relations.oracle.mode)
# keys each cell sets itself: a --set of one would make every cell the same
CELL_KEYS = ("relations.name", "backbone", "loss.treatment")


@dataclass(frozen=True)
class Recipe:
    """How a cell trains: a method on a backbone with --set items, and its own tag ("" for the plain name)."""

    method: str
    backbone: str
    sets: tuple[str, ...]
    tag: str = ""
    plain: bool = False


@dataclass(frozen=True)
class PlannedCell:
    """A cell with its resolved runs (one per seed), or its reason."""

    cell: MatrixCell
    runs: tuple[BenchRun, ...] = ()
    tag: str = ""


@command("matrix", "detectors x treatments x backbones, each cell a recipe of registered parts")
def add_commands(sub) -> None:
    p = sub.add_parser("matrix", help="train every (detector, treatment, backbone) cell that fits, then "
                                      "OUT/matrix/<dataset>[~name].{md,csv}")
    p.add_argument("--dataset", default="sim-tvr-v2", help="default: sim-tvr-v2")
    p.add_argument("--detectors", nargs="+", default=list(DEFAULT_DETECTORS), metavar="D",
                   help=f"registered relation detectors (default: {' '.join(DEFAULT_DETECTORS)})")
    p.add_argument("--treatments", nargs="+", default=list(TREATMENTS), metavar="T",
                   help=f"what a cell does with the detected pairs: {', '.join(TREATMENTS)} (default: all)")
    p.add_argument("--backbones", nargs="+", default=list(DEFAULT_BACKBONES), metavar="B",
                   help=f"registered backbones (default: {' '.join(DEFAULT_BACKBONES)})")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", default="results")
    p.add_argument("--plan", action="store_true", help="print the cells, their recipes and expected time, and stop")
    p.add_argument("--report-only", action="store_true", help="write the tables from the records there are")
    p.add_argument("--name", default="", help="the report is OUT/matrix/<dataset>~<name> (default <dataset>)")
    add_jobs_argument(p)
    common_arguments(p)
    p.set_defaults(func=cmd_matrix)


def cmd_matrix(args: argparse.Namespace) -> None:
    set_threads(args.threads)
    matrix, planned = plan_matrix(args)
    if not args.report_only:
        check_kept(list(_distinct(planned).values()), "--tag")
    if args.plan:
        print(plan_text(args, planned), end="")
        return
    if not args.report_only:
        print(plan_text(args, planned), end="", flush=True)
        _train(args, planned)
    print(write_matrix(matrix, args.out), end="")


# ----------------------------------------------------------------------------- the plan
def plan_matrix(args: argparse.Namespace) -> tuple[Matrix, list[PlannedCell]]:
    """Every cell resolved up front: a bad name or setting fails here, before anything is written."""
    _check_args(args)
    world = _world_tag(args)
    planned = [_plan_cell(args, d, t, b, world)
               for b in args.backbones for d in args.detectors for t in args.treatments]
    _check_shared(planned)
    notes = _notes(args.backbones)
    matrix = Matrix(args.dataset, tuple(args.backbones), tuple(args.detectors),
                    tuple((t, TREATMENTS[t].summary) for t in args.treatments), tuple(args.seeds),
                    tuple(p.cell for p in planned), command_line(), args.name, notes)
    return matrix, planned


def _check_args(args: argparse.Namespace) -> None:
    DATASETS.get(args.dataset)
    if args.backbone:
        raise UserError(f"--backbone {args.backbone}: the matrix's backbones are --backbones B [B ...]")
    for flag, given in (("--detectors", args.detectors), ("--treatments", args.treatments),
                        ("--backbones", args.backbones), ("--seeds", args.seeds)):
        twice = next((g for i, g in enumerate(given) if g in given[:i]), None)
        if twice is not None:
            raise UserError(f"{flag}: {twice} given twice; give each once")
    for d in args.detectors:
        DETECTORS.get(d)
    for t in args.treatments:
        if t not in TREATMENTS:
            raise UserError(f"--treatments: {unknown_message('treatment', t, list(TREATMENTS))}")
    for b in args.backbones:
        if b not in BACKBONES and b in METHODS:
            raise UserError(f"--backbones {b}: a method, not a backbone; its backbone is {METHODS.get(b).backbone} "
                            f"(backbones: {', '.join(BACKBONES.names())})")
        BACKBONES.get(b)
    for o in args.overrides:
        key = o.partition("=")[0].strip()
        if key in CELL_KEYS or (key.startswith("relations.") and key.endswith(".mode")):
            raise UserError(f"--set {o}: each cell sets {key} itself (its detector, backbone and treatment); "
                            "narrow the matrix with --detectors, --treatments and --backbones instead")
    if args.name:
        check_name(args.name, "--name", "give a plain file name, e.g. high-noise")
    check_tag(args.tag)


def _world_tag(args: argparse.Namespace) -> str:
    """The tag of runs on a world that `--set sim.K=V` moved away from the preset: the sweep's
    (`repeat_prob1-repeat_copies4`, the knobs in the order given), so the matrix and a sweep share runs."""
    knobs = [(k.strip(), v.strip()) for k, _, v in (o.partition("=") for o in args.overrides)
             if k.strip().startswith("sim.")]
    if not knobs:
        return ""
    preset = resolve(_any_method(args), args.dataset, args.seeds[0], data_root_overrides(args), args.config)
    values, defaults = [], []
    for key, text in knobs:
        default = getattr(getattr(preset, "sim", None), key.partition(".")[2], None)
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if isinstance(default, bool) or not isinstance(default, (int, float)) or not math.isfinite(value):
            if args.tag:
                return ""  # the user's tag names the world
            raise UserError(f"--set {key}={text}: not a number the matrix can name its runs by (as a sweep "
                            "does); give the runs a name with --tag")
        values.append(value)
        defaults.append(float(default))
    return point_tag([k for k, _ in knobs], tuple(values), tuple(defaults))


def _any_method(args: argparse.Namespace) -> str:
    return home_method(args.backbones[0]) or METHODS.names()[0]


def _plan_cell(args: argparse.Namespace, detector: str, treatment: str, backbone: str, world: str) -> PlannedCell:
    where = MatrixCell(backbone, detector, treatment)
    found = recipe(detector, TREATMENTS[treatment], backbone)
    if isinstance(found, str):
        return PlannedCell(dataclasses.replace(where, reason=found))
    reason = _unavailable(args.dataset, detector)
    if reason:
        return PlannedCell(dataclasses.replace(where, reason=reason))
    try:
        tag = _cell_tag(args, found)
        full = "~".join(t for t in (tag, world, args.tag) if t)
        runs = tuple(_bench_run(args, found, full, seed) for seed in args.seeds)
    except UserError:
        own = _own_problem(args, found)
        if not own:
            raise  # the cell fits; the user's --set or --config does not: one line, nothing written
        return PlannedCell(dataclasses.replace(where, reason=own))
    cell = dataclasses.replace(where, run=runs[0].name, recipe=_recipe_line(runs[0]), plain=found.plain)
    return PlannedCell(cell, runs, full)


def _own_problem(args: argparse.Namespace, found: Recipe) -> str:
    """Why the cell's recipe alone does not resolve (without the user's --set and --config); "" if it does."""
    bare = copy.copy(args)
    bare.overrides, bare.config = [], None
    try:
        _resolve(bare, found.method, found.backbone, args.seeds[0], list(found.sets))
    except UserError as e:
        return str(e)
    return ""


def recipe(detector: str, treatment: Treatment, backbone: str) -> Recipe | str:
    """The cell's method, backbone and --set items, or the one-line reason it cannot work."""
    home = home_method(backbone)
    method = _method_of(treatment, home)
    if method is None:
        return f"backbone {backbone} has no method of its own to train it"
    misfit = _misfit(method, backbone, detector, treatment)
    if misfit:
        return _no_confidence_seam(home, treatment) + misfit
    if detector == NO_DETECTOR:
        return _plain(backbone)
    found = DETECTORS.get(detector)
    spec = METHODS.get(method)
    if treatment.confidence and not found.doubts_labels:
        # confidence 1 in every labelled pair: the soft targets are the labels, and soft trains what ignore does
        return recipe(detector, TREATMENTS["ignore"], backbone)
    if not treatment.confidence and not found.finds_pairs and method != TREATMENTS["soft"].method:
        # no pair to treat and a confidence the objective reads only under soft: the labels, as detector none
        return _plain(backbone)
    start = _start_sets(method, home)
    if isinstance(start, str):
        return start
    sets = [f"relations.name={detector}", *start]
    modes = _choices(DETECTORS.get(detector).config_cls, "mode")
    # a loss whose `treatment` T trains what the detector's mode T gives (the standard objectives' positive and
    # ignore) keeps the detector's mode where it has one: the run the suite has (`baseline+oracle`)
    by_mode = treatment.name in getattr(spec.loss_cls, "as_detector_modes", ()) and \
        (not treatment.positive or "positive" in modes)
    if treatment.name in _choices(spec.loss_cls, "treatment") and not by_mode:  # the objective treats the pairs
        sets.append(f"loss.treatment={treatment.name}")
        wants = AMBIGUOUS_MODE
    elif treatment.positive:
        wants = "positive"
        if not found.finds_pairs:
            return (f"detector {detector} hands over no pair of its own to make positives (its relations are the "
                    f"labels), and the objective of {method} trains the labels' positives already")
        if "positive" not in modes:
            return (f"detector {detector} hands its pairs over as ambiguous, with no relations.{detector}.mode "
                    f"that makes them positives, and the objective of {method} has no loss.treatment that "
                    "trains them as positives")
    else:
        wants = AMBIGUOUS_MODE  # every objective leaves ambiguous pairs out of its negatives; T's method trains them
    if modes:
        if wants not in modes:
            return f"detector {detector} has no relations.{detector}.mode={wants} (its modes: {', '.join(modes)})"
        sets.append(f"relations.{detector}.mode={wants}")
    tag = spec.treated_tag(treatment.name) if start else _row_tag(method, sets)
    return Recipe(method, backbone, tuple(sets), tag or treatment.name)


def _start_sets(method: str, home: str | None) -> tuple[str, ...] | str:
    """The --set items of the row a cell of the backbone's own method starts from (`MethodSpec.treatment_row`:
    ARL's `tv_only`, so a treated cell differs from the plain `arl~base` by its detector and treatment alone);
    () for other methods, or the reason the named row is missing."""
    row = METHODS.get(method).treatment_row if method == home else ""
    return _row_overrides(method, row, "treatment row") if row else ()


def _row_overrides(method: str, tag: str, what: str) -> tuple[str, ...] | str:
    """The --set items of the method's ablation row `tag`, or why it has none."""
    rows = [r for (m, _), t in sorted(TABLES.items()) if m == method for r in t.rows if r.tag == tag]
    if not rows:
        return f"method {method} names {what} {tag!r}, which none of its ablation tables holds"
    return rows[0].overrides


def _no_confidence_seam(home: str | None, treatment: Treatment) -> str:
    """Where the backbone's own method cannot read a detector's confidence (the prefix of a confidence
    treatment's misfit): its loss has no such `loss.treatment`; "" elsewhere."""
    if not treatment.confidence or home is None or home == treatment.method:
        return ""
    values = _choices(METHODS.get(home).loss_cls, "treatment")
    if treatment.name in values:
        return ""
    has = f"loss.treatment values {', '.join(values)} train a detector's pairs" if values else "loss has no treatment"
    return (f"the objective of {home} reads no confidence in the labelled pairs (its {has}; no soft targets), "
            "and ")


def _method_of(treatment: Treatment, home: str | None) -> str | None:
    """The cell's method: the backbone's own where its loss has T as a `loss.treatment` (ARL's on its
    backbone; the standard objectives' restrain), else T's own method, else the backbone's own."""
    if home is not None and treatment.name in _choices(METHODS.get(home).loss_cls, "treatment"):
        return home
    return treatment.method or home


def _plain(backbone: str) -> Recipe | str:
    """The backbone's plain cell: its own method on the labels, or the base row that method names."""
    home = home_method(backbone)
    if home is None:
        return f"backbone {backbone} has no method of its own to train it"
    spec = METHODS.get(home)
    if spec.base_row:
        base = _row_overrides(home, spec.base_row, "base row")
        return base if isinstance(base, str) else Recipe(home, backbone, base, spec.base_row, plain=True)
    sets = () if spec.relations == NO_DETECTOR else (f"relations.name={NO_DETECTOR}",)
    return Recipe(home, backbone, sets, plain=True)


def _misfit(method: str, backbone: str, detector: str, treatment: Treatment) -> str:
    """Why `method` with `detector` cannot train `backbone` (methods/fit.py `check_fit`), shortly; "" if it can."""
    try:
        check_fit(method, backbone, detector)
        return ""
    except UserError as e:
        full = str(e)
    spec, have = METHODS.get(method), BACKBONES.get(backbone)
    needs = method_needs(spec, backbone)
    missing = [] if needs is None else missing_outputs(needs, have)
    whose = f"{treatment.name}'s objective ({method})" if method == treatment.method else f"the objective of {method}"
    if needs is None or missing:
        lacks = f"needs {' and '.join(missing)}" if missing else "extends its backbone's own method"
        return (f"{whose} {lacks}, which backbone {backbone} does not provide (backbones that fit it: "
                f"{', '.join(fitting_backbones(spec)) or 'none'})")
    needed = DETECTORS.get(detector).needs
    missing = missing_outputs(needed, have)
    if missing:
        fits = [b for b in BACKBONES.names() if not missing_outputs(needed, BACKBONES.get(b))]
        return (f"detector {detector} needs {' and '.join(missing)}, which backbone {backbone} does not provide "
                f"(backbones that give it: {', '.join(fits)})")
    return full


def _unavailable(dataset: str, detector: str) -> str:
    """Why a detector cannot run here, on this dataset or without an extra installed; "" where it can."""
    if detector == "oracle" and not DATASETS.get(dataset).simulated:
        return f"the oracle detector needs the ground truth of a simulated world; dataset {dataset} is not simulated"
    if detector == "sbert":
        missing = missing_text_extra()
        return f"the sbert detector {missing}" if missing else ""
    return ""


def _choices(cls: type | None, name: str) -> tuple[str, ...]:
    """The values of a settings dataclass's Literal field `name`; () where it has none."""
    if cls is None or not dataclasses.is_dataclass(cls) or name not in {f.name for f in dataclasses.fields(cls)}:
        return ()
    return tuple(a for a in typing.get_args(typing.get_type_hints(cls)[name]) if isinstance(a, str))


def _row_tag(method: str, sets: list[str]) -> str:
    """The tag of the method's ablation row whose overrides are the cell's loss settings (ARL Table 6's
    `positive` for loss.treatment=positive), so a cell is the run `ablate` makes; "" for none."""
    loss = tuple(s for s in sets if s.startswith("loss."))
    rows = [r for (m, _), t in sorted(TABLES.items()) if m == method for r in t.rows]
    return next((r.tag for r in rows if loss and r.overrides == loss), "")


def _cell_tag(args: argparse.Namespace, found: Recipe) -> str:
    """The cell's own tag: none where its settings change nothing of the untagged run's config (the cell is
    that run: `baseline+oracle`, `arl+oracle`), else the recipe's."""
    if found.plain:
        return found.tag
    seed = args.seeds[0]
    return "" if is_untagged(found, lambda sets: _resolve(args, found.method, found.backbone, seed, sets)) \
        else found.tag


def is_untagged(found: Recipe, config_of: Callable[[list[str]], Config]) -> bool:
    """Whether the cell's settings resolve to the config its detector alone gives (the cell is that
    untagged run: `baseline+oracle`, `baseline+arl`); `config_of` resolves --set items."""
    detector = next(s for s in found.sets if s.startswith("relations.name="))
    return config_of(list(found.sets)).to_dict() == config_of([detector]).to_dict()


def _one(args: argparse.Namespace, found: Recipe, tag: str) -> argparse.Namespace:
    one = copy.copy(args)
    one.tag = tag
    one.backbone = found.backbone if found.backbone != METHODS.get(found.method).backbone else None
    return one


def _resolve(args: argparse.Namespace, method: str, backbone: str, seed: int, sets: list[str]) -> Config:
    one = _one(args, Recipe(method, backbone, ()), "")
    return resolve(method, args.dataset, seed, [*data_root_overrides(one), *sets, *args.overrides], args.config)


def _bench_run(args: argparse.Namespace, found: Recipe, tag: str, seed: int) -> BenchRun:
    cfg = _resolve(args, found.method, found.backbone, seed, list(found.sets))
    name = run_name(cfg, tag)
    argv = run_args(_one(args, found, tag), found.method, args.dataset, seed, [*found.sets, *args.overrides])
    return BenchRun(cfg, name, record_path(args.out, cfg.dataset, name, seed), tuple(argv))


def _recipe_line(run: BenchRun) -> str:
    """The run's `prvr-bench run` line without its --seed (the cell's recipe, for any seed)."""
    argv = list(run.args)
    at = argv.index("--seed")
    return shlex.join(["prvr-bench", "run", *argv[:at], *argv[at + 2:]])


def _check_shared(planned: list[PlannedCell]) -> None:
    """Cells that share a run folder must share its settings (no run means two things)."""
    seen: dict[tuple[str, int], tuple[dict[str, Any], MatrixCell]] = {}
    for p in planned:
        for r in p.runs:
            settings = r.cfg.to_dict()
            first = seen.setdefault((r.name, r.cfg.seed), (settings, p.cell))
            if first[0] != settings:
                a, b = first[1], p.cell
                raise UserError(f"cells {a.detector} x {a.treatment} x {a.backbone} and {b.detector} x {b.treatment} x "
                                f"{b.backbone} would both be run {r.name} with other settings; give one a --tag")


def _notes(backbones: list[str]) -> tuple[str, ...]:
    notes = ["detector none: no pair is detected, so every treatment whose objective fits the backbone trains the "
             "backbone's plain cell, its own method on the one-to-one labels"]
    for b in backbones:
        home = home_method(b)
        spec = METHODS.get(home) if home else None
        if spec is not None and spec.base_row:
            notes.append(f"on backbone {b} the plain cell is {home}~{spec.base_row}, the row {home} names as its "
                         f"base (its encoder and loss without its label-noise mechanism)")
        if spec is not None and spec.treatment_row:
            notes.append(f"on backbone {b} the cells of {home}'s own objective start from its row "
                         f"{home}~{spec.treatment_row} (`MethodSpec.treatment_row`) and set only the detector and "
                         f"loss.treatment on it, so each differs from the plain cell by what it does with the "
                         f"detected pairs (run {home}+DETECTOR~{spec.treated_tag('ignore')}; under the loss's own "
                         f"treatment, {home}+DETECTOR~{spec.treatment_row})")
    notes.append("detector holmes hands over no pair of its own (its relations are the labels, a smoothed query's "
                 "labelled pair with confidence 1 - smooth_beta), which only soft reads: under the other treatments "
                 "the standard objectives train as with detector none (the plain cell); any other detector trusts "
                 "every label (confidence 1), so its soft cell is its ignore cell (the soft targets are the labels)")
    notes.append("positive and ignore: the backbone's own objective, which leaves ambiguous pairs out of its "
                 "negatives (ignore); positives come from its loss.treatment=positive where it has one (the "
                 "standard objectives' adds the pairs to the positives, what a detector's mode positive gives, so "
                 "the oracle keeps its mode), else from a detector with a relations.<detector>.mode of positive")
    return tuple(notes)


# ----------------------------------------------------------------------------- showing and training
def _distinct(planned: list[PlannedCell]) -> dict[tuple[str, int], BenchRun]:
    return {(r.name, r.cfg.seed): r for p in planned for r in p.runs}


def plan_text(args: argparse.Namespace, planned: list[PlannedCell]) -> str:
    """The cells per backbone, cheapest backbone first: each one's run, whether its records exist, its
    expected time and recipe, or why it cannot work; then the total."""
    costs = profile_costs(Path(args.out) / PROFILE_FILE)
    runs = _distinct(planned)
    seconds = expected(planned, costs)
    cannot = sum(1 for p in planned if not p.runs)
    lines = [f"matrix plan: {args.dataset}, {len(args.detectors)} detectors x {len(args.treatments)} treatments x "
             f"{len(args.backbones)} backbones = {len(planned)} cells ({cannot} cannot work), seeds "
             f"{' '.join(map(str, args.seeds))}, results in {args.out}/",
             "expected times: the run's earlier records, else the profile, else its backbone's plain cell's"]
    shown: set[str] = set()
    for b in cheapest_first(args.backbones, planned, seconds):
        cost = _plain_cost(b, planned, seconds)
        about = f" (its plain cell: about {duration(cost)} a run)" if math.isfinite(cost) else ""
        lines += ["", f"backbone {b}{about}"]
        for p in (p for p in planned if p.cell.backbone == b):
            lines.append(_plan_line(p, seconds, shown))
    rows = [PlanRow(r.name, r.cfg.dataset, r.cfg.seed, Estimate(seconds[key][0]), r.record.exists())
            for key, r in runs.items()]
    workers, _ = launch_from_args(args, [r.cfg for r in runs.values() if not r.record.exists()])
    kept = sum(1 for r in rows if r.kept)
    lines += ["", f"{len(rows)} runs ({kept} kept, {len(rows) - kept} to make); {total_line(rows, workers)}", ""]
    return "\n".join(lines)


def expected(planned: list[PlannedCell], costs: dict[tuple[str, str], dict[str, float]]
             ) -> dict[tuple[str, int], tuple[float | None, bool]]:
    """Each distinct run's expected seconds (plan.estimate), else its backbone's plain cell's (marked guessed:
    the same backbone, another detector or loss; the ARL detector's per-epoch pass comes on top)."""
    known = {key: estimate(r.cfg, r.record, costs).seconds for key, r in _distinct(planned).items()}
    out: dict[tuple[str, int], tuple[float | None, bool]] = {}
    for p in planned:
        for r in p.runs:
            key = (r.name, r.cfg.seed)
            if known[key] is not None:
                out[key] = (known[key], False)
            elif key not in out:
                plain = _plain_cost(p.cell.backbone, planned, {k: (v, False) for k, v in known.items()})
                out[key] = (plain, True) if math.isfinite(plain) else (None, False)
    return out


def cheapest_first(backbones: list[str], planned: list[PlannedCell],
                   seconds: dict[tuple[str, int], tuple[float | None, bool]]) -> list[str]:
    """The backbones by their plain cell's expected time (unknown last; ties keep the given order)."""
    return sorted(backbones, key=lambda b: _plain_cost(b, planned, seconds))


def _plain_cost(backbone: str, planned: list[PlannedCell],
                seconds: dict[tuple[str, int], tuple[float | None, bool]]) -> float:
    plain = next((p for p in planned if p.cell.backbone == backbone and p.cell.plain), None)
    known = [s for r in (plain.runs if plain else ()) if (s := seconds.get((r.name, r.cfg.seed), (None, False))[0])
             is not None]
    return sum(known) / len(known) if known else math.inf


def _plan_line(p: PlannedCell, seconds: dict[tuple[str, int], tuple[float | None, bool]], shown: set[str]) -> str:
    c = p.cell
    head = f"  {c.detector} x {c.treatment}:"
    if not p.runs:
        return f"{head} cannot work: {c.reason}"
    todo = [seconds[(r.name, r.cfg.seed)] for r in p.runs if not r.record.exists()]
    if not todo:
        state = f"kept ({len(p.runs)} record{'s' if len(p.runs) > 1 else ''})"
    else:
        known = [s for s, _ in todo if s is not None]
        guess = " (its backbone's plain cell's time)" if any(g for _, g in todo) else ""
        cost = f", about {duration(sum(known))}{guess}" if len(known) == len(todo) else ", time unknown"
        state = f"{len(todo)} of {len(p.runs)} seeds to make{cost}"
    again = c.run in shown
    shown.add(c.run)
    plain = " (plain cell)" if c.plain else ""
    return f"{head} {c.run}{plain}, {state}" + ("" if again else f"\n      {c.recipe}")


def _backbone_of(run: BenchRun, planned: list[PlannedCell]) -> str:
    return next(p.cell.backbone for p in planned if run in p.runs)


def _train(args: argparse.Namespace, planned: list[PlannedCell]) -> None:
    """The runs without a record, each once, cheapest backbone first."""
    tags = {r.name: p.tag for p in planned for r in p.runs}
    seconds = expected(planned, profile_costs(Path(args.out) / PROFILE_FILE))
    order = cheapest_first(args.backbones, planned, seconds)
    runs = sorted(_distinct(planned).values(), key=lambda r: order.index(_backbone_of(r, planned)))
    todo = [r for r in runs if not r.record.exists()]
    if not todo:
        return
    workers, launch = launch_from_args(args, [r.cfg for r in todo])
    ensure_dir(args.out)
    start = time.perf_counter()
    left = 0  # runs --finish-by left unstarted
    if launch.in_processes(workers):
        left = run_in_processes(args.out, [(r.cfg, r.name, list(r.args)) for r in todo], workers, args.threads,
                                "matrix", launch)
    else:
        for i, r in enumerate(todo):
            progress.log(f"[{i + 1}/{len(todo)}] {r.name} on {r.cfg.dataset}, seed {r.cfg.seed}")
            run_one(r.cfg, args.out, resume=args.resume, tag=tags[r.name], command=run_line(r.args, args.threads),
                    force_resume=args.force_resume)
    progress.log(f"matrix: {len(todo) - left} runs made in {time.perf_counter() - start:.0f} s")
