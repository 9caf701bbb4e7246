"""`--executor ray`: the planned runs of `bench` / `ablate` as Ray tasks, on a local Ray or a cluster.

Each task starts the same `prvr-bench run` process that `--jobs N` starts (same arguments, same
working folder), so its record is the one `prvr-bench run` writes; the task asks Ray for the
run's torch threads as CPUs, a share of a GPU (1 / --runs-per-gpu) where the run trains on CUDA
and the cluster has GPUs, and the memory the profile measured for it where there is a figure.
Ray is an optional extra (`pip install prvr-bench[ray]`), imported only here and only when asked
for. On a cluster, the results folder and $PRVR_CACHE must be on a filesystem every node sees
(docs/cluster.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from prvr.harness.base import progress
from prvr.harness.base.io import UserError, check_target
from prvr.harness.cli.jobs import Job, Launch, gpu_env, raise_failures, report, run_command, schedule

WORKER_NICENESS = "RAY_worker_niceness"  # read by the raylet a local `ray.init` starts
# the settings a run reads from its environment, handed to every task as the driver has them
PASSED_ENV = ("PRVR_CACHE", "PRVR_DATA", "PRVR_DEVICE")
LOCAL_OBJECT_STORE = 128 * 2**20  # the tasks pass a few arguments and get two numbers back


def import_ray() -> ModuleType:
    """Ray, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray, which is not installed: pip install prvr-bench[ray]") from None
    return ray


def check_ready(address: str | None) -> None:
    """Before any data is made: Ray is installed, and a cluster answers at `address` where one is named."""
    import_ray()
    if address:
        _check_reachable(address)


def train_job(args: list[str], log: str, cwd: str, env: dict[str, str] | None = None) -> tuple[int, float]:
    """The body of one Ray task: `prvr-bench run ARGS` in `cwd` with its output in `log` and `env`
    changed in the worker's environment; its exit code and seconds. A cancelled task stops its run."""
    start = time.perf_counter()
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    check_target(log)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(run_command(args), stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})},
                                preexec_fn=_stop_with_parent if sys.platform == "linux" else None)
    try:
        return proc.wait(), time.perf_counter() - start
    finally:
        if proc.poll() is None:  # the task was cancelled (Ctrl-C in the driver)
            proc.terminate()
            proc.wait()


def _stop_with_parent() -> None:
    """In the run's process, before it starts: end it when the Ray worker that started it dies
    (a force-cancelled task, a Ray that shuts down), so that no run trains on unwatched."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_on_ray(jobs: list[Job], launch: Launch, workers: int, command: str) -> None:
    """Every job as a Ray task; raise UserError naming each failed run and its log. Without an
    address a local Ray is started with `workers` x threads CPUs; Ctrl-C cancels every task."""
    ray = import_ray()
    _init(ray, launch, workers * max(j.threads for j in jobs))
    try:
        _run_tasks(ray, jobs, launch, command)
    finally:
        ray.shutdown()


def _init(ray: ModuleType, launch: Launch, local_cpus: int) -> None:
    """Join the cluster at the address, or start a local Ray of `local_cpus` CPUs; either way the
    tasks get this process's PRVR_* settings."""
    env = {k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}
    runtime_env = {"env_vars": env} if env else None
    if launch.address:
        try:
            ray.init(address=launch.address, runtime_env=runtime_env, log_to_driver=False)
        except ConnectionError as e:
            raise UserError(f"cannot reach a Ray cluster at --address {launch.address} ({e}); start one with "
                            "`ray start --head`, or pass the address it prints") from None
    else:
        # Ray starts its workers at niceness 15 (RAY_worker_niceness), so on a machine running
        # other work a local Ray's runs got what the others left: 4 sim-tiny runs took 571 s
        # beside two training runs where `--jobs 2` took 51 s. A local Ray for this bench runs
        # its tasks as `--jobs` does, at this process's priority, unless the variable is set.
        os.environ.setdefault(WORKER_NICENESS, "0")
        # address="local": a new Ray for this bench, never one that `ray start` left on this machine
        ray.init(address="local", num_cpus=local_cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE,
                 runtime_env=runtime_env, log_to_driver=False)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A HOST:PORT that nothing answers at is a one-line error here (Ray itself retries for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    if address == "auto" or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise UserError(f"no Ray cluster answers at --address {address} ({e.strerror or e}); start one with "
                        "`ray start --head`, or pass the address it prints") from None


def task_options(job: Job, gpu_share: float, node_memory: float) -> dict:
    """What the job's task asks Ray for: its threads as CPUs, a GPU share where it trains on CUDA,
    its profiled memory where known (an error where no node has that much)."""
    options = {"num_cpus": job.threads, "num_gpus": gpu_share if job.cuda else 0, "max_retries": 0,
               "name": job.label}
    if job.memory_mb:
        need = int(job.memory_mb * 2**20)
        if need > node_memory:
            raise UserError(f"{job.label} needs about {job.memory_mb / 1024:.1f} GB (the profile's peak memory), "
                            f"more than any Ray node offers ({node_memory / 2**30:.1f} GB); add a larger node, or "
                            "run it with --jobs")
        options["memory"] = need
    return options


def _run_tasks(ray: ModuleType, jobs: list[Job], launch: Launch, command: str) -> None:
    resources = ray.cluster_resources()
    gpu_share = 1 / launch.runs_per_gpu if resources.get("GPU", 0) > 0 else 0
    node_memory = max([n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")], default=0)
    task = ray.remote(train_job)
    cwd = os.getcwd()
    order = schedule(jobs)
    options = [task_options(job, gpu_share, node_memory) for job in order]  # a refusal comes before any task
    # Ray gives a task that asks for a GPU its own; a CPU run's is hidden here (gpu_env)
    refs = {task.options(**o).remote(job.args, str(job.log), cwd, gpu_env(job, None)): job
            for job, o in zip(order, options)}
    progress.log(f"{command}: {len(refs)} runs handed to Ray ({resources.get('CPU', 0):.0f} CPUs, "
                 f"{resources.get('GPU', 0):.0f} GPUs; logs under {jobs[0].log.parents[2]})")
    start, failed, pending = time.perf_counter(), [], list(refs)
    try:
        with progress.task(f"{command} (ray)", total=len(refs)) as advance:
            while pending:
                (ref,), pending = ray.wait(pending, num_returns=1)
                job = refs[ref]
                code, took = _result(ray, ref, job)
                if code != 0:
                    failed.append(job)
                report(job, code, took)
                advance(1)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)
        raise
    progress.log(f"{command}: {len(jobs)} runs in {time.perf_counter() - start:.0f} s on Ray")
    raise_failures(failed, len(jobs))


def _result(ray: ModuleType, ref, job: Job) -> tuple[int, float]:
    """A task's exit code and seconds; a task Ray lost (its worker died) is a failure whose
    reason ends its log."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        try:
            with open(job.log, "a", encoding="utf-8") as log:
                log.write(f"\nRay: {reason}\n")
        except OSError:
            pass
        return -1, 0.0
