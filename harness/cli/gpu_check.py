"""`prvr-bench gpu-check` (`nox -s gpu`): every GPU check in one short run, one table.

Rows: the CUDA tests (`pytest -m cuda`, in the background: the compile test in a niced
process of its own beside every other row, since compiling is CPU work; the other CUDA tests
beside the functional rows and waited for before the timing rows); every registered method
one epoch on sim-tiny on the
device (seconds, peak device memory, test SumR); `evaluate --parts` and `--noise-levels` on
one of those records; a run killed after an epoch and resumed against the uninterrupted run
(`train.deterministic=true`: equal metrics); the evaluator at the TVR test shape; one
sim-tvr epoch of the baseline under each precision and with deterministic kernels (their
cost); and the profile's device rows (runtime per query, training epoch) in OUT/profile/.

Written to OUT/gpu-check.md and .json. Meant for a GPU (`--device cuda`; 217 and 256 s on an
H100 before the timing rows stopped waiting for the compile test, 136 s on an H200 after,
docs/gpu.md); `--device cpu --quick` checks the command itself (the test suite does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from prvr.harness.cli.args import command, run_command
from prvr.harness.base import progress
from prvr.harness.engine.config import check_device, resolve
from prvr.harness.base.devices import device_name, peak_memory_mb, reset_peak_memory
from prvr.harness.base.io import UserError, atomic_path, ensure_dir
from prvr.harness.profiling import evaluator_speed as ev
from prvr.harness.engine.records import provenance
from prvr.harness.base.registry import METHODS
from prvr.harness.engine.runner import run_one
from prvr.harness.engine.trainer import Hook
from prvr.harness.reports.table import Markdown, markdown_cell, markdown_table
from prvr.methods.relations.sbert import MissingTextExtra, missing_text_extra


@dataclass
class Row:
    check: str
    result: str
    seconds: float = float("nan")
    peak_mb: float = float("nan")
    ok: bool = True


# how the SBERT methods' rows run on a GPU machine without the `text` extra (docs/gpu.md)
CARRY_HINT = "cache it where the extra is installed: PRVR_CACHE=DIR prvr-bench bench --quick --prepare-data"


@command("gpu-check", "every GPU check in one run")
def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu-check", help="every GPU check in one run, one table: OUT/gpu-check.{md,json}")
    p.add_argument("--device", default="cuda", help="cuda (default) | cuda:N | cpu (checks the command itself)")
    p.add_argument("--out", default="results/gpu", help="folder of the table and the profile (default results/gpu)")
    p.add_argument("--method", nargs="+", default=None, metavar="NAME", help="default: every registered method")
    p.add_argument("--quick", action="store_true",
                   help="the command's own check: no pytest, no sim-tvr epochs, no profile, a small evaluator shape")
    p.add_argument("--skip-tests", action="store_true", help="no `pytest -m cuda` row")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_gpu_check)


def cmd_gpu_check(args: argparse.Namespace) -> None:
    check_device(args.device, "--device", "--device cpu (or a CUDA device this machine has)")
    device = torch.device(args.device)
    out = ensure_dir(args.out)
    start = time.perf_counter()
    rows: list[Row] = []

    def add(*new: Row) -> None:
        """Keep the row and rewrite the table: a check cut off later leaves the rows before it."""
        rows.extend(new)
        write_table(rows, device, time.perf_counter() - start, Path(out))

    with tempfile.TemporaryDirectory(prefix="prvr-gpu-check-") as tmp:
        work = Path(tmp)
        # the CUDA tests run beside the functional rows (their seconds are then not costs). The
        # timing rows wait for the other CUDA tests but not for the compile test: that is 1.5
        # minutes of compiling on the CPU (niced below the rows) with a few GPU steps, and
        # waiting for it left the GPU idle for a minute and a half (the H100 run of 2026-11-27:
        # tests 111 s, functional rows ~30 s, timing rows 144 s after them)
        tests = None if args.quick or args.skip_tests else CudaTests(Path(out) / "pytest-cuda.log")
        # the sim-tvr world of the timing rows made meanwhile (about 10 s of the first row's)
        world = None if args.quick else make_world("sim-tvr")
        methods = args.method or METHODS.names()
        for m in methods:
            add(epoch_row(m, device, work))
        records = [work / "runs" / "sim-tiny" / m / "seed0.json" for m in methods]
        first = next((r for r in records if r.exists()), records[0])  # the first method that trained
        add(reevaluate_row(first, device, "--parts"))
        add(reevaluate_row(first, device, "--noise-levels", "0", "0.5"))
        add(resume_row(device, work))
        add(evaluator_row(device, args.quick))
        if tests is not None:
            tests.finish(OTHER_TESTS)
        if world is not None:
            joined(world, "the sim-tvr world")
        if not args.quick:
            for row in precision_rows(device):
                add(row)
            add(profile_row(device, Path(out) / "profile"))
        if tests is not None:
            rows.insert(0, tests.wait())
    text = write_table(rows, device, time.perf_counter() - start, Path(out))
    print(text)
    failed = [r.check for r in rows if not r.ok]
    if failed:
        raise UserError(f"gpu-check: {len(failed)} check(s) failed: {', '.join(failed)} (table in {out}/gpu-check.md)")


def write_table(rows: list[Row], device: torch.device, wall_s: float, out: Path) -> str:
    """OUT/gpu-check.md and .json of the rows so far; the markdown's text."""
    text = render(rows, device, wall_s)
    with atomic_path(out / "gpu-check.md") as tmp_md:
        Path(tmp_md).write_text(text, encoding="utf-8")
    with atomic_path(out / "gpu-check.json") as tmp_json:
        Path(tmp_json).write_text(json.dumps([asdict(r) for r in rows], indent=1), encoding="utf-8")
    return text


@contextmanager
def measured(device: torch.device) -> Iterator[dict]:
    """Seconds and, on CUDA, peak allocated device memory of the block."""
    got: dict = {}
    reset_peak_memory(device)
    start = time.perf_counter()
    yield got
    if (mb := peak_memory_mb(device)) is not None:
        got["peak_mb"] = mb
    got["seconds"] = time.perf_counter() - start


def attempt(check: str, device: torch.device, fn: Callable[[], tuple[str, bool]]) -> Row:
    """One check: its result line and whether it passed; an exception is a failed row, not the end."""
    progress.log(f"gpu-check: {check}")
    try:
        with measured(device) as m:
            result, ok = fn()
    except Exception as err:  # a check that fails is reported in its row and the others still run
        return Row(check, f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}",
                   ok=False)
    return Row(check, result, m["seconds"], m.get("peak_mb", float("nan")), ok)


def _cfg(method: str, dataset: str, device: torch.device, extra: list[str]):
    return resolve(method, dataset, 0, [f"train.device={device}", *extra])


# the compile test apart from the others: both halves at once, so the tests take about the
# compile test's time (tests/test_cuda.py::test_tf32_and_compile_train_on_cuda, 71 of 92 s on an H100)
COMPILE_TEST = "compile"
OTHER_TESTS = f"not {COMPILE_TEST}"
TEST_HALVES = (("the compile test", COMPILE_TEST), ("the other CUDA tests", OTHER_TESTS))


# pytest's closing line: "1 passed, 2946 deselected, 22 warnings in 62.66s (0:01:02)"
PYTEST_SUMMARY = re.compile(r"\b\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b.* in [\d.]+s\b")


def pytest_summary(text: str) -> str:
    """The closing line of a pytest run's output, not whatever was printed after it (on the
    H200 a compile worker's queue thread raised at interpreter exit, after the test passed):
    that later output is named, and kept in the log."""
    lines = text.strip().splitlines()
    found = [i for i, line in enumerate(lines) if PYTEST_SUMMARY.search(line)]
    if not found:
        return lines[-1] if lines else "(no output)"
    after = len(lines) - 1 - found[-1]
    return lines[found[-1]].strip("= ") + (f" ({after} lines of output after it, in the log)" if after else "")


class CudaTests:
    """`pytest -m cuda` in the background, in two processes (the compile test, the rest); their
    whole output (failures' tracebacks too) kept in `log`; `wait()` gives the one row."""

    def __init__(self, log: Path) -> None:
        progress.log("gpu-check: pytest -m cuda (in the background)")
        self.log, self.start = log, time.perf_counter()
        self.procs = {k: subprocess.Popen([sys.executable, "-m", "pytest", "-m", "cuda", "-k", k, "-q", "-rfEX",
                                           "--durations=8", "-p", "no:cacheprovider"],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          preexec_fn=_niced if k == COMPILE_TEST else None)
                      for _, k in TEST_HALVES}
        self.outputs: dict[str, str] = {}

    def finish(self, half: str) -> None:
        """Wait for one half (its `-k` expression) and keep its output."""
        if half not in self.outputs:
            self.outputs[half] = self.procs[half].communicate()[0]

    def wait(self) -> Row:
        """Wait for both halves; their log written and their one row."""
        for _, k in TEST_HALVES:
            self.finish(k)
        seconds = time.perf_counter() - self.start
        outputs = [self.outputs[k] for _, k in TEST_HALVES]
        procs = [self.procs[k] for _, k in TEST_HALVES]
        with atomic_path(self.log) as tmp:
            Path(tmp).write_text("".join(f"# pytest -m cuda -k '{k}' ({name})\n{text}\n"
                                         for (name, k), text in zip(TEST_HALVES, outputs)), encoding="utf-8")
        tails = [pytest_summary(text) for text in outputs]
        codes = [proc.returncode for proc in procs]
        ok = all(c in (0, 5) for c in codes) and 0 in codes  # 5: a half collected nothing; not both
        result = "; ".join(f"{name}: {tail}" for (name, _), tail in zip(TEST_HALVES, tails))
        return Row("pytest -m cuda", f"{result} (output in {self.log.name}; the other CUDA tests beside the rows up "
                   "to the evaluator's, the compile test beside every row)", seconds, float("nan"), ok)


def _niced() -> None:
    """In the compile test's process, before it starts: below the check's own rows for the CPU."""
    os.nice(10)


def make_world(dataset: str) -> subprocess.Popen:
    """A process that makes the dataset's cache (generates the world where simulated) as the
    baseline's run would load it (`bench --prepare-data`, which writes nothing else): a process,
    so that nothing it seeds or sets reaches the rows."""
    cmd = [sys.executable, "-m", "prvr.harness.cli", "bench", "--method", "baseline", "--dataset", dataset,
           "--prepare-data", "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def joined(proc: subprocess.Popen, what: str) -> None:
    """Wait for a background helper; where it failed, one line says so (the row that needed it
    then does the work itself, and fails as a row if the work fails)."""
    err = proc.communicate()[1]
    if proc.returncode:
        last = (err.strip().splitlines() or ["(no output)"])[-1]
        progress.log(f"gpu-check: {what} in the background failed ({last}); the row that needs it makes it")


def epoch_row(method: str, device: torch.device, work: Path) -> Row:
    def run() -> tuple[str, bool]:
        cfg = _cfg(method, "sim-tiny", device, ["train.epochs=1"])
        try:
            record = run_one(cfg, work)
        except MissingTextExtra as e:  # an extra not installed, not a GPU failure
            return (f"skipped: its detector {missing_text_extra(cfg.detector.model) or e} and found no cached "
                    f"detection ({CARRY_HINT})"), True
        return f"test SumR {record['metrics']['test']['SumR']:.1f}, loss {record['history'][0]['loss']:.4f}", True

    return attempt(f"{method}: one epoch on sim-tiny", device, run)


def reevaluate_row(record: Path, device: torch.device, *flags: str) -> Row:
    def run() -> tuple[str, bool]:
        if not record.exists():
            raise RuntimeError(f"no record to evaluate (the epoch that writes {record.name} failed)")
        was = progress.is_enabled()
        try:
            code = run_command("evaluate", [str(record), "--device", str(device), "--quiet", *flags,
                         *(["--no-store"] if "--noise-levels" in flags else [])])
        finally:
            progress.set_enabled(was)  # --quiet is this row's, not the rest of the check's
        return f"exit {code}", code == 0

    return attempt(f"evaluate {' '.join(flags)}", device, run)


def resume_row(device: torch.device, work: Path) -> Row:
    class Kill(Hook):
        def on_epoch_start(self, trainer, epoch): ...
        def on_step(self, trainer, step, out): ...

        def on_epoch_end(self, trainer, epoch, summary):
            if epoch == 0:
                raise KeyboardInterrupt

    exact = ["train.epochs=2", "train.patience=10", "train.deterministic=true"]

    def run() -> tuple[str, bool]:
        # the promise of train.deterministic holds where no kernel warns that it is not
        # deterministic (docs/gpu.md, "Determinism"): such a warning fails the row, named
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            full = run_one(_cfg("baseline", "sim-tiny", device, exact), work / "full")
            try:
                run_one(_cfg("baseline", "sim-tiny", device, exact), work / "killed", hooks=[Kill()])
            except KeyboardInterrupt:
                pass
            resumed = run_one(_cfg("baseline", "sim-tiny", device, exact), work / "killed", resume=True)
        same = json.dumps(full["metrics"], sort_keys=True) == json.dumps(resumed["metrics"], sort_keys=True)
        loose = not_deterministic(caught)
        metrics = ("resumed metrics equal the uninterrupted run's" if same else
                   f"resumed test SumR {resumed['metrics']['test']['SumR']:.2f} vs {full['metrics']['test']['SumR']:.2f}")
        return f"{metrics}; {(loose or ['no kernel warned of non-determinism'])[0]}", same and not loose

    return attempt("kill after epoch 0, resume (deterministic)", device, run)


# torch's alert ("... does not have a deterministic implementation, but you set ...") and the
# fused attention kernels' own ("... defaults to a non-deterministic algorithm ...")
NOT_DETERMINISTIC = re.compile(r"non-?deterministic|not have a deterministic")


def not_deterministic(caught: list[warnings.WarningMessage]) -> list[str]:
    """The first lines of the caught warnings in which a kernel says it is not deterministic
    (torch's alert under warn_only, or a kernel's own word), each once, in order."""
    lines = [str(w.message).strip().splitlines()[0] for w in caught if NOT_DETERMINISTIC.search(str(w.message))]
    return [f"a kernel warned: {line}" for line in dict.fromkeys(lines)]


def evaluator_row(device: torch.device, quick: bool) -> Row:
    shape = ev.QUICK if quick else ev.TVR_TEST

    def run() -> tuple[str, bool]:
        speed = ev.evaluator_speed(shape, device, 1)
        return (f"{shape.queries:,} x {shape.videos:,}: score {speed.score_s:.2f} s, rank {speed.count_s:.3f} s, "
                f"identical ranks {speed.identical:,} of {shape.queries:,}"), speed.identical == shape.queries

    return attempt("evaluator at the TVR test shape" if not quick else "evaluator (quick shape)", device, run)


def precision_rows(device: torch.device) -> Iterator[Row]:
    """One sim-tvr epoch of the baseline per setting, after a sim-tiny warm-up epoch in the same
    setting: what each precision and determinism cost."""
    settings = [["train.precision=fp32"], ["train.precision=bf16"], ["train.deterministic=true"]]
    if device.type == "cuda":
        settings.insert(1, ["train.precision=tf32"])
    for extra in settings:
        def run(extra=extra) -> tuple[str, bool]:
            with tempfile.TemporaryDirectory() as tmp:
                # a sim-tiny epoch first, in the same setting: the first use of its kernels (lazily
                # loaded on CUDA: bf16's first epoch was 5x fp32's on an H100) is not the epoch's cost
                run_one(_cfg("baseline", "sim-tiny", device, ["train.epochs=1", "eval.noise_levels=[]", *extra]),
                        Path(tmp) / "warm-up")
                record = run_one(_cfg("baseline", "sim-tvr", device, ["train.epochs=1", "eval.noise_levels=[]",
                                                                      *extra]), tmp)
            t = record["timings"]
            return f"train {t['train']:.1f} s, val {t['eval_val']:.1f} s, test SumR {record['metrics']['test']['SumR']:.1f}", True

        yield attempt(f"baseline sim-tvr epoch, {extra[0]}", device, run)


def profile_row(device: torch.device, out: Path) -> Row:
    def run() -> tuple[str, bool]:
        cmd = [sys.executable, "-m", "prvr.harness.cli", "profile", "--method", "baseline", "msl", "gmmformer", "arl",
               "--device", str(device), "--videos", "500", "2500", "--repeats", "20", "--warmup", "3",
               "--skip-evaluator", "--out", str(out), "--quiet"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        return (f"{out.name}/profile.md" if done.returncode == 0 else
                (done.stderr.strip().splitlines() or ["(no output)"])[-1]), done.returncode == 0

    return attempt("profile (runtime per query, training epoch)", device, run)


def render(rows: list[Row], device: torch.device, wall_s: float) -> str:
    prov = provenance(device_name(device))
    lines = [f"# GPU check on {prov['device']}", "",
             f"Written by `prvr-bench gpu-check` (git {str(prov['git_revision'])[:12]}"
             f"{', uncommitted changes' if prov['git_dirty'] else ''}; torch "
             f"{torch.__version__}) on {prov['created']}; whole check {wall_s:.0f} s.", ""]
    cells = [[r.check, _result_cell(r), f"{r.seconds:.1f}", "" if r.peak_mb != r.peak_mb else f"{r.peak_mb:,.0f}"]
             for r in rows]
    lines.append(markdown_table(["check", "result", "seconds", "peak device memory (MB)"], cells))
    return "\n".join(lines) + "\n"


def _result_cell(row: Row) -> str:
    """A check's result as its cell: a failed one behind a bold **FAILED** that the table keeps as markdown
    (`Markdown`), the result itself (an error message, a tool's output) escaped."""
    return row.result if row.ok else Markdown(f"**FAILED** {markdown_cell(row.result)}")
