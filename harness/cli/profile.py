"""`prvr-bench profile`: every figure for every method, then results/profile.{md,csv}."""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import time
from pathlib import Path

import torch

from prvr.harness.base.allocator import keep_freed_memory
from prvr.harness.cli.args import command
from prvr.harness.base import progress
from prvr.harness.base.io import UserError, ensure_dir
from prvr.harness.profiling import evaluator_speed as ev, rehearsal
from prvr.harness.profiling.flops import flops_per_query
from prvr.harness.profiling.report import (PROFILE_JSON, MethodProfile, Profile, ProfileProvenance, Settings,
                                          render_memory, write_profile)
from prvr.harness.profiling.stored import check_protocol, read_profile, updated
from prvr.harness.profiling.reported import reported_for
from prvr.harness.profiling.runtime import GRAPHS_MODES, estimate_memory, runtime_per_query
from prvr.harness.profiling.subjects import TVR_DIMS, Subject, build_model, count_params, subjects
from prvr.harness.profiling.training import describe_device, profile_epoch_isolated
from prvr.harness.engine.records import provenance
from prvr.harness.base.devices import pick_device

PAPER_SIZES = [500, 1000, 1500, 2000, 2500]  # ARL Table 4, RAL Table 7
QUICK_SIZES = [16, 32]


@command("profile", "params, FLOPs, runtime, throughput; rehearse")
def add_commands(sub: argparse._SubParsersAction) -> None:
    rehearsal.add_commands(sub)
    p = sub.add_parser("profile", help="params, FLOPs, runtime per query, training throughput, evaluator speed: "
                                       "OUT/profile.{md,csv}")
    p.add_argument("--method", nargs="+", default=None, metavar="NAME",
                   help="methods, or METHOD@BACKBONE for a method on another backbone (e.g. ral@msl); default: "
                        "every registered method, and RAL on each of its backbones")
    p.add_argument("--dataset", default=None,
                   help="dataset of the training epoch (default sim-tvr; --quick: sim-tiny)")
    p.add_argument("--model-dataset", default=None,
                   help="whose method presets build the models for params, FLOPs and runtime (default tvr; --quick: "
                        "sim-tiny); input dims stay TVR's (3072 / 768)")
    p.add_argument("--out", default="results", help="results folder (default: results)")
    p.add_argument("--videos", nargs="+", type=int, default=None, metavar="N",
                   help=f"collection sizes for the runtime (default {' '.join(map(str, PAPER_SIZES))})")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per size (default: 5 on a CPU, 100 on a GPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs first (default: 1 on a CPU, 10 on a GPU)")
    p.add_argument("--unique-videos", type=int, default=None,
                   help="encoded videos tiled into each collection (default 64)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda ...")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: steady figures on a shared CPU; 0: torch's default)")
    p.add_argument("--train-batches", type=int, default=None, metavar="N",
                   help="end the training epoch after its first N batches (default: the whole epoch)")
    p.add_argument("--query-batch", type=int, default=1, metavar="N",
                   help="queries per timed runtime run: encoded, scored and sorted together; the table gives ms "
                        "per query (run / N) (default 1, the papers' setting)")
    p.add_argument("--graphs", default="auto", metavar="{auto,off}",
                   help="auto: on a GPU each runtime run replays a CUDA graph (eager, and why, where capture "
                        "fails); off: eager runs (default auto; a CPU runs eager)")
    p.add_argument("--estimate-memory", action="store_true",
                   help="print each method's runtime memory at the largest --videos, from the shapes (meta "
                        "device), and measure nothing")
    p.add_argument("--skip-runtime", action="store_true", help="no inference runtime")
    p.add_argument("--skip-training", action="store_true", help="no training epoch")
    p.add_argument("--skip-evaluator", action="store_true", help="no evaluator speed test")
    p.add_argument("--only-methods", action="store_true",
                   help="renew the rows of the --method methods in OUT/profile.{md,csv} and keep every other row "
                        "and the evaluator speed (read from OUT/profile.json, which a whole profile writes); "
                        "refused unless the settings are the stored profile's")
    p.add_argument("--quick", action="store_true",
                   help="tiny settings (sim-tiny, small collections, few repeats, small evaluator shape)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every method (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_profile)


def settings_from(args: argparse.Namespace, device: torch.device) -> Settings:
    """Defaults: the papers' collection sizes; 5 timed runs after 1 warm-up on a CPU (a full
    profile stays near 10 minutes on two cores), 100 after 10 on a GPU; --quick shrinks all."""
    gpu, quick = device.type == "cuda", args.quick
    sizes = args.videos or (QUICK_SIZES if quick else PAPER_SIZES)
    repeats = _given(args.repeats, 3 if quick else 100 if gpu else 5)
    warmup = _given(args.warmup, 1 if quick else 10 if gpu else 1)
    unique = _given(args.unique_videos, 8 if quick else 64)
    for name, value in (("--videos", min(sizes)), ("--repeats", repeats), ("--unique-videos", unique),
                        ("--train-batches", _given(args.train_batches, 1))):
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    if warmup < 0 or args.threads < 0:
        raise UserError("--warmup and --threads must be 0 or more")
    if args.query_batch < 1:
        raise UserError(f"--query-batch must be at least 1, got {args.query_batch}")
    if args.graphs not in GRAPHS_MODES:
        raise UserError(f"--graphs must be {' or '.join(GRAPHS_MODES)}, got {args.graphs!r}")
    return Settings(dataset=args.dataset or ("sim-tiny" if quick else "sim-tvr"),
                    model_dataset=args.model_dataset or ("sim-tiny" if quick else "tvr"), dims=TVR_DIMS,
                    sizes=sorted(set(sizes)), repeats=repeats, warmup=warmup, unique=unique,
                    eval_shape=ev.QUICK if quick else ev.TVR_TEST, eval_repeats=1 if quick else 3,
                    threads=args.threads or None, train_batches=args.train_batches, quick=quick,
                    query_batch=args.query_batch, graphs=args.graphs)


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def cmd_profile(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    ensure_dir(args.out)
    device = pick_device(args.device)
    settings = settings_from(args, device)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    if device.type == "cpu":
        keep_freed_memory()  # as a run on the CPU allocates (harness/base/allocator.py), so its epochs time alike
    overrides = [*args.overrides, *([f"train.device={args.device}"] if args.device != "auto" else [])]
    subs = subjects(args.method, settings.model_dataset, overrides)
    before = _stored_before(args, settings, describe_device(device)) \
        if args.only_methods and not args.estimate_memory else None
    if args.estimate_memory:
        size = max(settings.sizes)
        print(render_memory([estimate_memory(s, settings.dims, size, settings.unique, settings.query_batch)
                             for s in subs]), end="")
        return
    results = [profile_subject(s, settings, device, args, overrides) for s in subs]
    evaluator = None
    if not args.skip_evaluator and before is None:  # --only-methods keeps the stored evaluator speed
        progress.log(f"evaluator speed: {settings.eval_shape.describe()}")
        evaluator = ev.evaluator_speed(settings.eval_shape, device, settings.eval_repeats)
    prov = ProfileProvenance(**provenance(describe_device(device)), command=_command_line(), torch=torch.__version__,
                             wall_s=time.perf_counter() - start)
    profile = Profile(settings, results, reported_for(args.method), evaluator, prov)
    if before is not None:
        profile = updated(before, profile)
    paths = write_profile(args.out, profile)
    progress.log(f"profile: wrote {paths[1]} and {paths[0]} in {prov['wall_s']:.0f} s")
    failed = [f"{m.method} {fig}: {msg}" for m in results for fig, msg in m.errors.items()]
    if failed:
        raise UserError(f"the profile was written, but {len(failed)} measurement(s) failed: " + "; ".join(failed))


def _stored_before(args: argparse.Namespace, settings: Settings, device: str) -> Profile:
    """The stored profile whose rows --only-methods renews; refused before anything is measured."""
    if not args.method:
        raise UserError("--only-methods renews the rows of the methods named by --method: name them (e.g. "
                        "--method hlformer dreamprvr), or profile every method without --only-methods")
    path = Path(args.out) / PROFILE_JSON
    if not path.exists():
        raise UserError(f"--only-methods reads {path}, which is not there: a whole profile (prvr-bench profile "
                        f"without --only-methods) writes it beside profile.md; run one first")
    before = read_profile(path)
    check_protocol(before, settings, device, path)
    return before


def profile_subject(subject: Subject, s: Settings, device: torch.device, args: argparse.Namespace,
                    overrides: list[str]) -> MethodProfile:
    """Params and FLOPs on the CPU; runtime and the training epoch on `device`."""
    out = MethodProfile(subject.method, subject.backbone, (subject.frames, subject.clips, subject.tokens))
    progress.log(f"profile {subject.method} ({subject.backbone})")
    model = build_model(subject, s.dims, "cpu")
    out.params = count_params(model)
    _attempt(out, "flops", lambda: setattr(out, "flops", flops_per_query(model, subject, s.dims)))
    progress.log(f"  {out.params / 1e6:.2f}M parameters, "
                 f"{out.flops.total / 1e9 if out.flops else float('nan'):.3f} GFLOPs per query")
    if not args.skip_runtime:
        model.to(device)
        out.runtime_device = describe_device(device)
        _attempt(out, "runtime", lambda: setattr(out, "runtime", runtime_per_query(
            model, subject, s.sizes, s.dims, s.repeats, s.warmup, s.unique, device, s.query_batch, s.graphs)))
        progress.log("  runtime per query: " + ", ".join(f"{r.videos} videos {r.median_ms:.2f} ms ({r.mode})"
                                                         for r in out.runtime))
    del model
    _free(device)
    if not args.skip_training:
        _attempt(out, "training", lambda: setattr(out, "epoch", profile_epoch_isolated(
            subject.method, s.dataset, overrides, s.threads, s.train_batches)))
        if out.epoch:
            progress.log(f"  training: {out.epoch.queries_per_s:.1f} queries/s, peak {out.epoch.peak_mb:.0f} MB")
        _free(device)
    return out


def _attempt(out: MethodProfile, figure: str, fn) -> None:
    """Run one measurement; a failure is recorded (and reported at the end), not fatal."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any failure of a backbone must not lose the other rows
        out.errors[figure] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        progress.log(f"[red]{out.method} {figure} failed:[/] {out.errors[figure]}")


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _command_line() -> str:
    if Path(sys.argv[0]).name == "prvr-bench":
        return shlex.join(["prvr-bench", *sys.argv[1:]])
    return "prvr-bench profile"
