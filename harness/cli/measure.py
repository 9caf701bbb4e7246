"""`prvr-bench measure --out USAGE.json [--log LOG] -- CMD ARGS...`: what a command costs, measured from
outside it, so that the official code (which runs outside this repository) and our own command are
measured the same way (docs/parity.md, docs/speed.md).

CMD runs as a child process (no shell) with this process's environment and working folder. While it
runs, every `SAMPLE_S` seconds, the resident set (VmRSS) of the child and of every descendant is read
from /proc and summed; the largest sum is the command's peak host memory. Processes that live for less
than a sampling step escape the sum, so the child's own `ru_maxrss` (the largest single process that it
or its waited-for descendants ever was, from `os.wait4`) is a floor under it, where it exceeds this
process's own peak when the child starts: Linux carries the parent's peak into a child's `ru_maxrss`
across fork and exec, so below that it tells nothing of the command. Where `nvidia-smi` is on
the PATH, it is asked every `DEVICE_SAMPLE_S` seconds for the memory of each compute process
(`--query-compute-apps=pid,used_memory`), and the largest sum over the command's processes is its device
peak; without `nvidia-smi`, or where it lists none of them, the device peak is null and the file says
why. Wall seconds run from the start of the child to its end; CPU seconds are its user + system time
and that of the descendants it waited for.

The file is written once the command has ended (atomically, whatever its exit status), and the exit
status of `measure` is the command's (128 + N for a command ended by signal N, as a shell gives it).
The target is checked before the command starts: a folder that cannot be written, or a FIFO in the
file's place, is one line and nothing runs. `read_usage` reads such a file back as untrusted input.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypedDict, cast

from prvr.harness.base.devices import lifetime_peak_kb, max_rss_kb, status_kb
from prvr.harness.base.io import (UserError, check_target, ensure_dir, os_cause, read_json, temporary_beside,
                                  write_json)
from prvr.harness.cli.args import command
from prvr.harness.engine.records import NULL, Kind, cpu_facts, field_problem, figure_problem, provenance_time

USAGE_VERSION = 1
SAMPLE_S = 0.2  # the process tree's resident sets
DEVICE_SAMPLE_S = 1.0  # nvidia-smi: a process start per query, so less often
PROC = Path("/proc")


class Host(TypedDict):
    """Where the command ran."""

    cpu: str  # the processor's model (records.cpu_facts), or the machine type
    cores: int  # the cores this process could use
    gpus: list[str] | None  # nvidia-smi's names of the GPUs; None without nvidia-smi


class Usage(TypedDict):
    """USAGE.json: what one command cost (the module docstring says how each figure is measured)."""

    usage_version: int
    command: list[str]
    exit_status: int
    started: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: float | None  # None where neither /proc nor ru_maxrss tells
    peak_rss_measure: str
    device_peak_mb: float | None
    device_measure: str
    host: Host
    log: str | None


# What `read_usage` requires of a file, and the types (records.field_problem)
USAGE_FIELDS: tuple[tuple[str, Kind], ...] = (
    ("usage_version", int), ("command", list), ("exit_status", int), ("started", str), ("wall_s", float),
    ("cpu_s", float), ("peak_rss_mb", (float, NULL)), ("peak_rss_measure", str), ("device_peak_mb", (float, NULL)),
    ("device_measure", str), ("host", dict), ("host.cpu", str), ("host.cores", int), ("host.gpus", (list, NULL)),
    ("log", (str, NULL)))
USAGE_FIGURES = ("wall_s", "cpu_s", "peak_rss_mb", "device_peak_mb", "host.cores")


# ----------------------------------------------------------------------------- the process tree


def parents() -> dict[int, int]:
    """pid -> parent pid of every process /proc shows (empty without /proc)."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(PROC)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = (PROC / name / "stat").read_bytes()
        except OSError:  # ended while we looked
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command's name, which may hold spaces
        if len(fields) > 1 and fields[1].isdigit():
            out[int(name)] = int(fields[1])
    return out


def process_tree(root: int) -> set[int]:
    """`root` and every descendant of it that is alive now."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents().items():
        children.setdefault(parent, []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


def resident_kb(pid: int) -> int:
    """VmRSS of one process in kB; 0 where it has ended, is a zombie or /proc has no such line."""
    return status_kb("VmRSS", pid) or 0


def device_memory(smi: str, pids: set[int]) -> float | None:
    """MB of GPU memory that nvidia-smi lists for any of `pids` (0 for none of them); None where the query
    fails."""
    try:
        done = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    total = 0.0
    for line in done.stdout.splitlines():
        pid, _, mb = (part.strip() for part in line.partition(","))
        if pid.isdigit() and int(pid) in pids:
            try:
                total += float(mb)
            except ValueError:  # "[N/A]" where the driver does not tell
                continue
    return total


def gpu_names(smi: str) -> list[str] | None:
    try:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else None


# ----------------------------------------------------------------------------- measuring


@dataclass
class Peaks:
    """The largest figures seen while the command runs."""

    smi: str | None
    rss_kb: int = 0
    samples: int = 0
    device_mb: float | None = None  # the largest sum over the command's processes that nvidia-smi listed
    device_queries: int = 0  # nvidia-smi queries that answered
    next_device: float = 0.0  # time.monotonic() of the next nvidia-smi query

    def sample(self, root: int) -> None:
        tree = process_tree(root)
        rss = sum(resident_kb(pid) for pid in tree)
        if rss:
            self.rss_kb, self.samples = max(self.rss_kb, rss), self.samples + 1
        if self.smi and time.monotonic() >= self.next_device:
            self.next_device = time.monotonic() + DEVICE_SAMPLE_S
            mb = device_memory(self.smi, tree)
            if mb is not None:
                self.device_queries += 1
                if mb > 0:
                    self.device_mb = max(self.device_mb or 0.0, mb)

    def device_measure(self) -> str:
        if self.smi is None:
            return "not measured: no nvidia-smi on the PATH"
        if self.device_queries == 0:
            return "not measured: nvidia-smi did not answer"
        if self.device_mb is None:
            return (f"nvidia-smi listed none of the command's processes in {self.device_queries} queries (a run on "
                    "the CPU, or processes in another PID namespace)")
        return (f"largest sum of nvidia-smi's used_memory over the command's processes, polled every "
                f"{DEVICE_SAMPLE_S:g} s ({self.device_queries} queries)")


def measure(argv: list[str], log: IO[bytes] | None = None, sample_s: float = SAMPLE_S) -> Usage:
    """Run `argv` to its end and measure it (the module docstring); Ctrl-C is passed on to the command,
    which is still waited for."""
    smi = shutil.which("nvidia-smi")
    peaks = Peaks(smi)
    own_peak_kb = lifetime_peak_kb()  # what a child's ru_maxrss inherits (the module docstring)
    started = provenance_time()
    start = time.perf_counter()
    try:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT if log else None)
    except OSError as err:
        raise UserError(f"cannot run {argv[0]!r}: {err.strerror or type(err).__name__}; give the command after `--` "
                        "as it runs on its own (an executable on the PATH, or its path)") from None
    ended = threading.Event()
    result: dict[str, Any] = {}

    def reap() -> None:  # os.wait4, not Popen.wait: it gives the child's resource use
        try:
            _, result["status"], result["rusage"] = os.wait4(child.pid, 0)
            result["wall"] = time.perf_counter() - start
        finally:
            ended.set()

    threading.Thread(target=reap, daemon=True).start()
    peaks.sample(child.pid)
    while not ended.is_set():
        try:
            if not ended.wait(sample_s):
                peaks.sample(child.pid)
        except KeyboardInterrupt:  # the command ends itself (it got the terminal's Ctrl-C too); wait for it
            if not ended.is_set():
                child.send_signal(signal.SIGINT)
    if "status" not in result:  # another waiter of this process took the child's status (none of the suite's does)
        raise UserError(f"the exit status of {argv[0]!r} was lost to another waiter; measure it again")
    child.returncode = os.waitstatus_to_exitcode(result["status"])
    usage = result["rusage"]
    floor_kb = max_rss_kb(usage.ru_maxrss)
    floor_kb = floor_kb if floor_kb > own_peak_kb else 0
    return {
        "usage_version": USAGE_VERSION, "command": list(argv), "exit_status": exit_status(child.returncode),
        "started": started, "wall_s": round(result["wall"], 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss_mb": round(max(peaks.rss_kb, floor_kb) / 1024, 1) if max(peaks.rss_kb, floor_kb) else None,
        "peak_rss_measure": rss_measure(peaks, sample_s, floor_kb),
        "device_peak_mb": None if peaks.device_mb is None else round(peaks.device_mb, 1),
        "device_measure": peaks.device_measure(), "host": host(smi), "log": None,
    }


def exit_status(code: int) -> int:
    """A child's exit status as a shell gives it: 128 + N for one ended by signal N."""
    return 128 - code if code < 0 else code


def rss_measure(peaks: Peaks, sample_s: float, floor_kb: int) -> str:
    if floor_kb > peaks.rss_kb:
        where = "no /proc to sample the process tree" if peaks.samples == 0 else \
            f"above every sample of the process tree's summed VmRSS, {peaks.samples} every {sample_s:g} s"
        return f"ru_maxrss of the command's largest process ({where})"
    if peaks.samples == 0:
        return "not measured: no /proc to sample, and the command's ru_maxrss is this process's own"
    return (f"largest sum of VmRSS over the command's process tree, sampled every {sample_s:g} s "
            f"({peaks.samples} samples)")


def host(smi: str | None) -> Host:
    facts = cpu_facts()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return {"cpu": facts.get("model", facts["machine"]), "cores": cores, "gpus": gpu_names(smi) if smi else None}


# ----------------------------------------------------------------------------- reading a usage file


def read_usage(path: str | Path, option: str = "--official-usage") -> Usage:
    """A usage file `prvr-bench measure` wrote, read as untrusted input: every key of `USAGE_FIELDS` with
    its type, every figure finite and not negative; anything else is one line naming the file and key."""
    data = read_json(path, what="usage file")
    fix = f"make it again with `prvr-bench measure --out {Path(path).name} -- COMMAND`, or pass another {option}"
    if not isinstance(data, dict):
        raise UserError(f"usage file {path} holds {type(data).__name__}, expected an object; {fix}")
    problem = field_problem(data, USAGE_FIELDS) or figure_problem(data, USAGE_FIGURES)
    if problem is None and data["usage_version"] != USAGE_VERSION:
        problem = "usage_version", f"{data['usage_version']!r} is not a version this prvr-bench reads ({USAGE_VERSION})"
    if problem is None and not all(isinstance(w, str) for w in data["command"]):
        problem = "command", "a list holding other than strings"
    if problem is not None:
        key, what = problem
        raise UserError(f"usage file {path} key {key!r}: {what}; {fix}")
    return cast(Usage, data)


# ----------------------------------------------------------------------------- the command


def cmd_measure(args: argparse.Namespace) -> None:
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else list(args.cmd)
    if not argv:
        raise UserError("no command to measure: give it after `--`, e.g. prvr-bench measure --out usage.json -- "
                        "python train.py")
    out = Path(args.out)
    targets = [out, *([Path(args.log)] if args.log else [])]
    if args.log and Path(args.log).resolve() == out.resolve():
        raise UserError(f"--log and --out name the same file {out}; give the log another name")
    for target in targets:  # before the command starts: a run of hours must not end in a file not written
        check_target(target)
        ensure_dir(target.parent, fix="pass a file in a folder you may write")
    temporary_beside(out).unlink()  # the write's own first step, tried: a folder this user may not write is refused
    if args.log:
        try:
            log = open(args.log, "wb")  # streamed as the command writes it
        except OSError as err:
            raise UserError(f"cannot write {args.log}: {os_cause(err, args.log)}; pass another --log") from None
        with log:
            usage = measure(argv, log)
        usage["log"] = str(args.log)
    else:
        usage = measure(argv)
    write_json(out, usage)
    host_mb = "not measured" if usage["peak_rss_mb"] is None else f"{usage['peak_rss_mb']:,.0f} MB"
    device = "" if usage["device_peak_mb"] is None else f", device peak {usage['device_peak_mb']:,.0f} MB"
    print(f"prvr-bench measure: exit status {usage['exit_status']}, {usage['wall_s']:.1f} s wall, "
          f"{usage['cpu_s']:.1f} CPU s, peak host memory {host_mb}{device}; wrote {out}", file=sys.stderr)
    if usage["exit_status"]:
        raise SystemExit(usage["exit_status"])


@command("measure", "a command's wall and CPU seconds and peak memory, measured from outside it")
def add_commands(sub) -> None:
    p = sub.add_parser("measure", help="run a command (after --) and write its wall and CPU seconds, peak host "
                                       "memory of its process tree and device peak to --out; exits with its status")
    p.add_argument("--out", required=True, metavar="USAGE.json", help="the usage file to write (JSON)")
    p.add_argument("--log", default=None, metavar="LOG",
                   help="write the command's stdout and stderr to LOG instead of the terminal")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...",
                   help="the command, run without a shell, e.g. -- python train.py --epochs 8")
    p.set_defaults(func=cmd_measure)
