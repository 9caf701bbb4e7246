"""results/profile.csv (one figure per row) and results/profile.md (tables, each with its
protocol), both derived from one Profile and written atomically."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from prvr.harness.base.io import write_texts
from prvr.harness.engine.record_types import Provenance
from prvr.harness.profiling import evaluator_speed, flops, training
from prvr.harness.profiling.evaluator_speed import EvaluatorSpeed
from prvr.harness.profiling.flops import QueryFlops
from prvr.harness.profiling.rehearsal import with_rehearsal
from prvr.harness.profiling.reported import Reported
from prvr.harness.profiling.runtime import GraphsMode, MemoryEstimate, Runtime
from prvr.harness.profiling.training import EpochProfile
from prvr.harness.reports.table import code, csv_text, markdown_table

CSV_COLUMNS = ("section", "method", "backbone", "source", "device", "quantity", "condition", "value", "unit",
               "revision")
MEASURED = "measured"


class Made(TypedDict):
    """What made one method's row where it is not the profile's own run (`profile --only-methods`)."""

    command: str
    created: str
    git_revision: str
    git_dirty: bool


@dataclass
class MethodProfile:
    """Every figure measured for one method; None where a figure was skipped."""

    method: str
    backbone: str
    shape: tuple[int, int, int] = (0, 0, 0)  # frames, clips, query tokens of the inputs
    params: int | None = None
    flops: QueryFlops | None = None
    runtime: list[Runtime] = field(default_factory=list)
    runtime_device: str = ""
    epoch: EpochProfile | None = None
    errors: dict[str, str] = field(default_factory=dict)  # figure -> error message
    made: Made | None = None  # None: made by the profile's own run (its provenance)


@dataclass
class Settings:
    """The conditions every figure names."""

    dataset: str  # the training epoch's
    model_dataset: str  # whose presets build the models for params, FLOPs and runtime
    dims: tuple[int, int]
    sizes: list[int]
    repeats: int
    warmup: int
    unique: int
    eval_shape: evaluator_speed.EvalShape
    eval_repeats: int
    threads: int | None = None  # torch CPU threads; None: torch's default
    train_batches: int | None = None  # cap on the training epoch's batches
    quick: bool = False
    query_batch: int = 1  # queries per timed runtime run (--query-batch; the papers': 1)
    graphs: GraphsMode = "auto"  # --graphs: runtime runs as CUDA graph replays on a GPU, or eager


class ProfileProvenance(Provenance, total=False):
    """What made a profile: a run's provenance, and the command, torch's version and the whole
    profile's seconds."""

    command: str
    torch: str
    wall_s: float


@dataclass
class Profile:
    settings: Settings
    methods: list[MethodProfile]
    reported: list[Reported]
    evaluator: EvaluatorSpeed | None
    provenance: ProfileProvenance


# ------------------------------------------------------------------------------- CSV
def csv_rows(p: Profile) -> list[dict[str, Any]]:
    """Every figure, each with the commit that measured it (`revision`; empty for the papers')."""
    s, own = p.settings, _revision(p.provenance["git_revision"], p.provenance.get("git_dirty", False))
    rows: list[dict[str, Any]] = []
    for m in p.methods:
        made = own if m.made is None else _revision(m.made["git_revision"], m.made["git_dirty"])
        rows += [{**r, "revision": made} for r in _method_rows(m, s, p.provenance["device"])]
    for r in p.reported:
        rows += [{**row, "revision": ""} for row in _reported_rows(r)]
    if p.evaluator is not None:
        rows += [{**r, "revision": own} for r in _evaluator_rows(p.evaluator)]
    return rows


def _revision(git: str, dirty: bool) -> str:
    return f"{git[:12]}{'+uncommitted' if dirty else ''}"


def _row(section: str, quantity: str, value: float | str, unit: str, condition: str = "", method: str = "",
         backbone: str = "", source: str = MEASURED, device: str = "") -> dict[str, Any]:
    return {"section": section, "method": method, "backbone": backbone, "source": source, "device": device,
            "quantity": quantity, "condition": condition, "value": value, "unit": unit}


def _method_rows(m: MethodProfile, s: Settings, device: str) -> list[dict[str, Any]]:
    who = {"method": m.method, "backbone": m.backbone}
    rows = []
    dims = f"video {s.dims[0]}-d, query {s.dims[1]}-d"
    if m.params is not None:
        rows.append(_row("params", "params", round(m.params / 1e6, 4), "M", dims, **who))
    if m.flops is not None:
        frames, clips, tokens = m.shape
        cond = f"{dims}; 1 query ({tokens} tokens) + 1 video ({frames} frames, {clips} clips) + score"
        for part, n in (("total", m.flops.total), ("query_encoding", m.flops.query),
                        ("video_encoding", m.flops.video), ("score", m.flops.score)):
            rows.append(_row("flops", f"flops_{part}", round(n / 1e9, 5), "GFLOPs", cond, **who, device="cpu"))
    for r in m.runtime:
        cond = f"videos={r.videos}; queries per run={r.queries}; {r.runs} runs; mode={r.mode}"
        unit = "ms" if r.queries == 1 else f"ms per query (run / {r.queries})"
        for q, v in (("median", r.median_ms), ("p25", r.p25_ms), ("p75", r.p75_ms)):
            rows.append(_row("runtime", f"runtime_{q}", round(v, 4), unit, cond, **who, device=m.runtime_device))
        if r.queries > 1:
            rows.append(_row("runtime", "runtime_run_median", round(r.run_ms, 4), "ms per run", cond, **who,
                             device=m.runtime_device))
        if not math.isnan(r.peak_mb):  # nan: not measured (a CPU)
            rows.append(_row("runtime", "runtime_peak_memory", round(r.peak_mb, 1), "MB", f"{cond}; "
                             "torch.cuda.max_memory_allocated", **who, device=m.runtime_device))
    if m.epoch is not None:
        e = m.epoch
        cond = f"one epoch on {e.dataset}: {e.queries} queries, {e.batches} batches"
        rows += [_row("training", "throughput", round(e.queries_per_s, 2), "queries/s", cond, **who, device=e.device),
                 _row("training", "epoch_seconds", round(e.seconds, 3), "s", cond, **who, device=e.device),
                 _row("training", "peak_memory", round(e.peak_mb, 1), "MB", f"{cond}; {e.memory_measure}", **who,
                      device=e.device)]
        rows += [_row("training", name, round(v, 4), "s", cond, **who, device=e.device)
                 for name, v in (("first_batch_seconds", e.first_batch_s), ("later_batch_seconds_median", e.later_batch_s))
                 if v == v]  # nan: not measured (fewer than 2 batches)
    for figure, message in m.errors.items():
        rows.append(_row(figure, "error", message, "", **who, device=device))
    return rows


def _reported_rows(r: Reported) -> list[dict[str, Any]]:
    who = {"method": r.method, "backbone": r.model, "source": f"{r.source} ({r.tables})",
           "device": r.source.removeprefix("reported, ")}
    rows = []
    if r.params_m is not None:
        rows.append(_row("params", "params", r.params_m, "M", "TVR features", **who))
    if r.flops_g is not None:
        rows.append(_row("flops", "flops_total", r.flops_g, "G (counter not stated)", "per query", **who))
    for size, ms in r.runtime_ms.items():
        rows.append(_row("runtime", "runtime", ms, "ms", f"videos={size}", **who))
    return rows


def _evaluator_rows(e: EvaluatorSpeed) -> list[dict[str, Any]]:
    cond = e.shape.describe()
    return [
        _row("evaluator", "score_seconds", round(e.score_s, 4), "s", cond, device=e.device),
        _row("evaluator", "rank_counting_seconds", round(e.count_s, 4), "s", cond, device=e.device),
        _row("evaluator", "rank_argsort_loop_seconds", round(e.argsort_s, 4), "s", cond, device=e.device),
        _row("evaluator", "ratio_ranking", round(e.ranking_ratio, 3), "x", cond, device=e.device),
        _row("evaluator", "ratio_score_and_rank", round(e.total_ratio, 3), "x", cond, device=e.device),
        _row("evaluator", "identical_ranks", e.identical, "queries", cond, device=e.device),
    ]


def render_csv(p: Profile) -> str:
    return csv_text(CSV_COLUMNS, [["" if r[k] is None else str(r[k]) for k in CSV_COLUMNS] for r in csv_rows(p)])


# -------------------------------------------------------------------------- markdown
def render_markdown(p: Profile) -> str:
    parts = [_header(p), _params_section(p), _flops_section(p), _runtime_section(p), _training_section(p),
             _evaluator_section(p)]
    return "\n".join(x for x in parts if x)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    return markdown_table(header, [[_cell(c) for c in row] for row in rows]) + "\n"


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v)


def _num(v: float | None, digits: int) -> str:
    return "" if v is None or v != v else f"{v:,.{digits}f}"


def _header(p: Profile) -> str:
    pv, s = p.provenance, p.settings
    quick = ("\n**Quick settings** (`--quick`): tiny collections, few repeats, a tiny training set; these "
             "figures only check that the profile runs.\n" if s.quick else "")
    return (f"# Model profile\n\nWritten by {code(str(pv['command']), in_table=False)} on {pv['created']} "
            f"(git {pv['git_revision'][:12]}"
            f"{', uncommitted changes' if pv.get('git_dirty') else ''}; torch {pv['torch']}). Device: "
            f"{pv['device']}. Whole profile: {pv['wall_s']:.0f} s. Measured rows say `measured`; the papers' "
            f"figures are separate rows marked `reported` with their GPU and table. All figures also in "
            f"profile.csv.\n{quick}{_renewed(p)}")


def _renewed(p: Profile) -> str:
    """The rows an update renewed, by the run that made them."""
    runs: dict[tuple[str, str, str, bool], list[str]] = {}
    for m in p.methods:
        if m.made is not None:
            key = (m.made["command"], m.made["created"], m.made["git_revision"], m.made["git_dirty"])
            runs.setdefault(key, []).append(m.method if m.backbone == m.method else f"{m.method} ({m.backbone})")
    lines = [f"- {', '.join(names)}: renewed by {code(command, in_table=False)} on {created} (git {git[:12]}"
             f"{', uncommitted changes' if dirty else ''}), under the settings above."
             for (command, created, git, dirty), names in runs.items()]
    return "\nRows renewed since (`prvr-bench profile --only-methods`; the rest are the whole profile's):\n\n" + \
        "\n".join(lines) + "\n" if lines else ""


def _ordered(p: Profile) -> list[tuple[MethodProfile | None, list[Reported]]]:
    """Each measured method followed by its reported rows, then methods only papers report."""
    out: list[tuple[MethodProfile | None, list[Reported]]] = []
    seen: set[str] = set()
    for m in p.methods:
        out.append((m, [r for r in p.reported if r.method == m.method]))
        seen.add(m.method)
    for name in dict.fromkeys(r.method for r in p.reported if r.method not in seen):
        out.append((None, [r for r in p.reported if r.method == name]))
    return out


def _shape(p: Profile) -> tuple[str, str, str]:
    """Frames, clips and query tokens of the inputs ('per method' where methods differ)."""
    shapes = {m.shape for m in p.methods}
    if len(shapes) == 1:
        return tuple(str(x) for x in shapes.pop())  # type: ignore[return-value]
    return ("the method's", "the method's", "the method's")


def _params_section(p: Profile) -> str:
    s = p.settings
    rows = []
    for m, reps in _ordered(p):
        if m is not None:
            rows.append([m.method, m.backbone, MEASURED, _num(m.params / 1e6 if m.params else None, 2)])
        rows += [[r.method, r.model, f"{r.source} ({r.tables})", _num(r.params_m, 2)] for r in reps]
    return (f"## Parameters (M)\n\nProtocol: every parameter of the backbone module that `prvr-bench run` "
            f"builds for the method with its `{s.model_dataset}` presets, counted once (buffers not), at TVR "
            f"input dims: video {s.dims[0]}-d (ResNet+I3D), query {s.dims[1]}-d (RoBERTa). Only the backbone: "
            f"a detector that kept a model of its own would add to it.\n\n"
            + _table(["method", "backbone", "source", "params (M)"], rows))


def _flops_section(p: Profile) -> str:
    frames, clips, tokens = _shape(p)
    rows = []
    for m, reps in _ordered(p):
        if m is not None and m.flops is not None:
            f = m.flops
            rows.append([m.method, m.backbone, MEASURED, _num(f.total / 1e9, 3), _num(f.total / 2e9, 3),
                         _num(f.query / 1e9, 3), _num(f.video / 1e9, 3), _num(f.score / 1e9, 4)])
        elif m is not None:
            rows.append([m.method, m.backbone, MEASURED, m.errors.get("flops", "skipped"), "", "", "", ""])
        rows += [[r.method, r.model, f"{r.source} ({r.tables})", _num(r.flops_g, 2), "", "", "", ""] for r in reps]
    return (f"## FLOPs per query (G)\n\nProtocol: one query as the papers count it = encode one query "
            f"({tokens} tokens, the loader's cap) + encode one video ({frames} frames, the frame branch's cap, "
            f"and {clips} clips) + score the pair; TVR input dims, the `{p.settings.model_dataset}` presets, eval "
            f"mode, batch 1, counted by `torch.utils.flop_counter.FlopCounterMode` on the CPU: 2 FLOPs per "
            f"multiply-add of matrix products and convolutions; element-wise ops, softmax, pooling and norms are "
            f"not counted. The counter's torch 2.13 gaps are closed ({flops.__name__}): CPU scaled-dot-product "
            f"attention gets its formula and the fused attention fast paths are switched off. Real TVR videos "
            f"average about 50 feature rows (75.7 s at 1.5 s a row), so their frame branches cost less than this "
            f"full-length count. The papers name neither their counter nor what a query includes; counters such "
            f"as thop and fvcore report multiply-adds under the name FLOPs, hence the GMACs column.\n\n"
            + _table(["method", "backbone", "source", "GFLOPs", "GMACs", "query enc.", "video enc.", "score"], rows))


def _runtime_section(p: Profile) -> str:
    s = p.settings
    _, _, tokens = _shape(p)
    sizes = sorted({*s.sizes, *(k for r in p.reported for k in r.runtime_ms)})
    rows = []
    for m, reps in _ordered(p):
        if m is not None and m.runtime:
            by = {r.videos: r.median_ms for r in m.runtime}
            rows.append([m.method, m.backbone, MEASURED, m.runtime_device, _per_run(m.runtime[0].queries),
                         _modes(m.runtime), *(_ms(by.get(n)) for n in sizes)])
        elif m is not None:
            rows.append([m.method, m.backbone, MEASURED, m.errors.get("runtime", "skipped"), "", "",
                         *([""] * len(sizes))])
        rows += [[r.method, r.model, f"{r.source} ({r.tables})", r.source.removeprefix("reported, "), _per_run(1),
                  "not stated", *(_ms(r.runtime_ms.get(n)) for n in sizes)] for r in reps]
    heading = "Inference runtime per text query (ms)" if s.query_batch == 1 else \
        f"Inference runtime per text query (ms per query, in batches of {s.query_batch})"
    return (f"## {heading}\n\nProtocol: the collection's video embeddings are "
            f"precomputed ({s.unique} encoded random full-length videos tiled to the collection size: scoring "
            f"cost depends on shapes, not values) and indexed once (the backbone's query-independent "
            f"`index_videos` work, e.g. the unit vectors of the items, as a deployed index stores them); one run = "
            f"{_run_work(s.query_batch, tokens)}; no gradients. Median of "
            f"{_runs(s.repeats, 'run')} after {_runs(s.warmup, 'warm-up run')} (25th and 75th percentiles in "
            f"profile.csv); CUDA events on a GPU, wall clock on a CPU{_threads(s)}. {_graphs_text(s)} The papers "
            f"time \"the retrieval process for a single text query\" on TVR video subsets (RAL) and say no more; "
            f"their two sets of MS-SL and GMMFormer figures differ tenfold, so their protocols differ from each other "
            f"too. On a shared CPU the figures move with the load.\n\n"
            + _table(["method", "backbone", "source", "device", "queries per run", "mode",
                      *(f"{n:,} videos" for n in sizes)], rows))


def _run_work(batch: int, tokens: str) -> str:
    if batch == 1:
        return (f"encode one query ({tokens} tokens) + score it against every video + sort the collection by "
                f"score")
    return (f"encode a batch of {batch} queries ({tokens} tokens each) + score them against every video + sort "
            f"the collection for each; the figures are milliseconds per query, a run's time / {batch}, and are "
            f"**not** one-query figures like the papers' (their rows: 1 query per run)")


def _graphs_text(s: Settings) -> str:
    """What the mode column says (harness/profiling/runtime.py)."""
    asked = ("`--graphs auto`: on a GPU each run is one replay of a CUDA graph captured once per collection "
             "(static query and collection tensors, eager warm-up on a side stream), so the host does not launch "
             "each op; where capture fails or a replay ranks otherwise than eager, the runs are eager and the "
             "mode says why; on a CPU there are no graphs" if s.graphs == "auto" else
             "`--graphs off`: every run eager, each op launched by the host")
    return f"Mode: {asked}."


def _per_run(queries: int) -> str:
    return f"{queries:,} {'query' if queries == 1 else 'queries'}"


def _modes(runtime: list[Runtime]) -> str:
    """The rows' mode, or each size's where they differ."""
    modes = dict.fromkeys(r.mode for r in runtime)
    if len(modes) == 1:
        return next(iter(modes))
    return "; ".join(f"{r.videos:,}: {r.mode}" for r in runtime)


def render_memory(estimates: list[MemoryEstimate]) -> str:
    """`--estimate-memory`'s table: GiB per method at one collection size, from the shapes."""
    gib = 2.0**30
    rows = [[e.method, f"{e.videos:,}", e.queries, _num(e.params / gib, 2), _num(e.index / gib, 2),
             _num(e.build_peak / gib, 2), _num(e.run_peak / gib, 3), _num(e.total / gib, 1)] for e in estimates]
    return ("Memory of the runtime per method (GiB), from the shapes on the meta device (harness/profiling/"
            "runtime.py `estimate_memory`): total = params + max(build peak, index + run peak); the CUDA context "
            "and the allocator's rounding come on top.\n\n"
            + _table(["method", "videos", "queries per run", "params", "index", "build peak", "run peak", "total"],
                     rows))


def _threads(s: Settings) -> str:
    return f" with {s.threads} torch thread{'s' if s.threads > 1 else ''}" if s.threads else ""


def _runs(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _ms(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def _training_section(p: Profile) -> str:
    s = p.settings
    rows: list[list[Any]] = []
    for m in p.methods:
        e = m.epoch
        if e is None:
            rows.append([m.method, m.backbone, m.errors.get("training", "skipped"), "", "", "", "", "", "", "", ""])
            continue
        rows.append([m.method, m.backbone, e.device, e.queries, f"{e.batches} of {e.epoch_batches}",
                     _num(e.seconds, 1), _num(e.first_batch_s, 3), _num(e.later_batch_s, 3), _num(e.queries_per_s, 1),
                     _num(e.peak_mb, 0), e.memory_measure])
    cap = f", first {s.train_batches} batches" if s.train_batches else ""
    threads = f" The CPU runs used {_runs(s.threads, 'torch thread')}." if s.threads else ""
    return (f"## Training: one epoch on {s.dataset}{cap}\n\nProtocol: {_protocol(training)}{threads}\n\n"
            + _table(["method", "backbone", "device", "queries", "batches", "seconds", "first batch (s)",
                      "later batch (s, median)", "queries/s", "peak memory (MB)", "memory measure"], rows))


def _protocol(module) -> str:
    """The paragraph of a module's docstring that starts with 'Protocol:', on one line."""
    for para in (module.__doc__ or "").split("\n\n"):
        if para.startswith("Protocol:"):
            return " ".join(para.removeprefix("Protocol:").split())
    return ""


def _evaluator_section(p: Profile) -> str:
    e = p.evaluator
    if e is None:
        return ""
    rows = [["score (shared): max cosine, chunks of 64 queries", _secs(e.score_s), _secs(e.score_s)],
            ["rank", _secs(e.count_s), _secs(e.argsort_s)],
            ["score + rank", _secs(e.score_s + e.count_s), _secs(e.score_s + e.argsort_s)]]
    return (f"## Evaluator speed: {e.shape.describe()}\n\nProtocol: {_protocol(evaluator_speed)} Device: "
            f"{e.device}.\n\n"
            + _table(["phase (seconds)", "counting evaluator (ours)", "per-query argsort loop"], rows)
            + f"\nRanking alone: the argsort loop takes {e.ranking_ratio:.2f}x the time of counting; scoring + "
              f"ranking: {e.total_ratio:.3f}x. Identical ranks on {e.identical:,} of {e.shape.queries:,} queries.\n")


def _secs(v: float) -> str:
    return f"{v:.3g}"


PROFILE_JSON = "profile.json"  # the typed figures, read back by `profile --only-methods` (profiling/stored.py)
STORED_FORMAT = 1


def stored(p: Profile) -> dict[str, Any]:
    """The profile as JSON data: NaN (not measured) as null; the reported rows are not stored
    (they come from the code)."""
    return _nulls({"format": STORED_FORMAT, "settings": asdict(p.settings), "methods": [asdict(m) for m in p.methods],
                   "evaluator": None if p.evaluator is None else asdict(p.evaluator), "provenance": dict(p.provenance)})


def _nulls(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _nulls(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_nulls(x) for x in v]
    return v


def write_profile(out: str | Path, p: Profile) -> tuple[Path, Path]:
    """Write profile.csv, profile.md and profile.json under `out`: all rendered first, then each
    written atomically, so a failure leaves the previous files in place."""
    out = Path(out)
    csv_path, md_path = out / "profile.csv", out / "profile.md"
    write_texts({csv_path: render_csv(p), md_path: with_rehearsal(render_markdown(p), out),
                 out / PROFILE_JSON: json.dumps(stored(p), indent=1) + "\n"})
    return csv_path, md_path
