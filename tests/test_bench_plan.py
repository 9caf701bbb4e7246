"""The bench's plan (expected times, `--plan`, `--print-commands`), GPU assignment and `--jobs auto`,
and `bench --quick`, whose records stay out of the leaderboard."""

import json
import shlex
import sys

import pytest

from prvr.harness.cli import bench as cli, fanout

from prvr.harness.cli import executors, jobs

from prvr.harness.reports import leaderboard
from prvr.harness.cli import main
from prvr.harness.cli.jobs import GpuRoundRobin, Job, parse_jobs, run_device, visible_gpus, wants_cuda
from prvr.harness.base.registry import METHODS
from prvr.harness.engine.config import resolve

PROFILE = """section,method,backbone,source,device,quantity,condition,value,unit
training,arl,arl,measured,cpu (1 threads),epoch_seconds,"one epoch on sim-tvr: 3000 queries, 5 batches",20.0,s
training,arl,arl,measured,cpu (1 threads),peak_memory,"one epoch on sim-tvr: 3000 queries, 5 batches; peak",1500.0,MB
training,msl,msl,measured,cpu (1 threads),epoch_seconds,"one epoch on sim-charades: 900 queries",99.0,s
runtime,baseline,dual-branch,measured,cpu,runtime_median,videos=500,31.3,ms
"""


def _out(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_gives_each_run_its_expected_time_and_trains_nothing(capsys, tmp_path):
    (tmp_path / "profile.csv").write_text(PROFILE)
    earlier = tmp_path / "runs" / "sim-tvr" / "baseline"
    earlier.mkdir(parents=True)
    for seed, seconds in ((0, 100.0), (1, 140.0)):
        (earlier / f"seed{seed}.json").write_text(json.dumps({"timings": {"train": seconds, "eval_test": 20.0}}))
    code, out, err = _out(capsys, "bench", "--plan", "--dataset", "sim-tvr", "--out", str(tmp_path), "--jobs", "2", "--quiet")
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and "sim-tvr" in line}
    assert sorted(lines) == sorted(METHODS.names())  # no --method: every registered method
    assert "2.3 min  (earlier records)" in lines["baseline"]  # mean of 120 s and 160 s, any seed
    assert "10.0 min  (profile: at most 30 epochs x 20 s, training only)" in lines["arl"]  # sim-tvr: 30 epochs
    assert lines["msl"].endswith("unknown")  # profiled on another dataset only
    assert f"total: 12.3 min for 2 runs, {len(METHODS.names()) - 2} more of unknown time; 2 at a time: about " \
           "10.0 min" in out
    assert "Narrow it: --method" in out and "--seeds" in out and "--quick" in out
    assert not (tmp_path / "runs" / "sim-tvr" / "arl").exists() and not (tmp_path / "leaderboard.md").exists()


def test_a_bench_without_method_prints_its_plan_before_it_starts(capsys, monkeypatch, tmp_path):
    from prvr.harness.reports import leaderboard

    seen = []
    monkeypatch.setattr(cli, "_bench_here", lambda args, todo: seen.append((capsys.readouterr().out, todo)))
    monkeypatch.setattr(leaderboard, "rebuild", lambda out: None)
    assert main(["bench", "--dataset", "sim-tiny", "--out", str(tmp_path), "--quiet"]) == 0
    (printed, todo), = seen
    assert printed.startswith(f"bench plan: {len(METHODS.names())} runs") and "Narrow it" in printed
    assert [p.name for p in todo] == METHODS.names()
    monkeypatch.setattr(cli, "_bench_here", lambda args, todo: seen.append(capsys.readouterr().out))
    assert main(["bench", "--method", "baseline", "--dataset", "sim-tiny", "--out", str(tmp_path), "--quiet"]) == 0
    assert seen[-1] == ""  # a narrowed bench starts at once


def test_print_commands_gives_the_run_of_each_planned_run(capsys, tmp_path):
    from test_bench_jobs import _as_run

    out_dir = tmp_path / "o"
    common = ["--dataset", "sim-tiny", "--seeds", "0", "1", "--set", "train.epochs=2", "--tag", "t",
              "--out", str(out_dir), "--threads", "1", "--print-commands"]
    code, out, err = _out(capsys, "bench", "--method", "ral", "baseline", *common)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4 and not out_dir.exists()  # printed, nothing made
    for line, (method, seed) in zip(lines, [("ral", 0), ("ral", 1), ("baseline", 0), ("baseline", 1)]):
        words = shlex.split(line)
        assert words[:2] == ["prvr-bench", "run"] and words[-2:] == ["--threads", "1"]
        cfg, name = _as_run(words[2:-2])
        assert (cfg.method, cfg.seed, cfg.train.epochs, name) == (method, seed, 2, f"{method}~t")
    # --backbone reaches each run: a line resolves to the run the bench plans, under its name
    code, out, err = _out(capsys, "bench", "--method", "ral", "--backbone", "msl", *common)
    cfg, name = _as_run(shlex.split(out.splitlines()[0])[2:-2])
    assert code == 0 and cfg.backbone == "msl" and name == "ral@msl~t"
    # --skip-existing leaves out the runs whose record exists
    record = out_dir / "runs" / "sim-tiny" / "ral~t" / "seed1.json"
    record.parent.mkdir(parents=True)
    kept = resolve("ral", "sim-tiny", 1, ["train.epochs=2"]).to_dict()  # a kept record must be the run planned
    record.write_text(json.dumps({"method": "ral", "dataset": "sim-tiny", "seed": 1, "run_name": "ral~t",
                                  "config": kept, "provenance": {}, "metrics": {"val": {}, "test": {}}}))
    code, out, _ = _out(capsys, "bench", "--method", "ral", "baseline", *common, "--skip-existing")
    assert [shlex.split(line)[7] for line in out.splitlines()] == ["0", "0", "1"]


def test_visible_gpus_respect_the_given_list():
    assert visible_gpus(count=2, env={}) == ["0", "1"]
    assert visible_gpus(count=3, env={"CUDA_VISIBLE_DEVICES": "3, 5,7"}) == ["3", "5", "7"]
    assert visible_gpus(count=0, env={"CUDA_VISIBLE_DEVICES": "3"}) == []  # no CUDA here: nothing changes
    assert visible_gpus(count=0, env={}) == []


def test_which_runs_take_a_gpu():
    assert wants_cuda("auto", env={}) and wants_cuda("cuda", env={})
    assert not wants_cuda("auto", env={"PRVR_DEVICE": "cpu"}) and wants_cuda("auto", env={"PRVR_DEVICE": "cuda"})
    assert not wants_cuda("cpu", env={}) and not wants_cuda("cuda:1", env={})  # an indexed device keeps its GPUs


def test_jobs_auto_from_gpus_and_cores(monkeypatch):
    monkeypatch.setattr(jobs, "usable_cores", lambda: 16)
    assert parse_jobs("auto", gpus=2) == 2 and parse_jobs("auto", gpus=2, runs_per_gpu=3) == 6
    assert parse_jobs("auto", gpus=8, runs_per_gpu=4) == 16  # bounded by the cores
    assert parse_jobs("auto") == 16 and parse_jobs(None) == 1 and parse_jobs("3", gpus=2) == 3


def test_gpus_go_round_robin_to_the_least_loaded():
    gpus = GpuRoundRobin(["3", "5"])
    assert [gpus.take() for _ in range(3)] == ["3", "5", "3"]
    gpus.give("5")
    assert gpus.take() == "5" and gpus.load == {"3": 2, "5": 1}
    assert GpuRoundRobin([]).take() is None


def test_each_cuda_run_process_sees_one_gpu_and_a_cpu_run_none(monkeypatch, tmp_path):
    """The GPU list is handed in: the processes (here a script that prints what it sees) are real."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    shows = "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    monkeypatch.setattr(jobs, "run_command", lambda args: [sys.executable, "-c", shows])
    monkeypatch.setattr(jobs, "POLL_S", 0.05)
    # four CUDA runs, a CPU run, and a run on an indexed device (cuda:1), which keeps the GPUs it was given
    devices = ["cuda"] * 4 + ["cpu", "cuda:1"]
    runs = [Job([], f"run{i}", tmp_path / f"r{i}.json", tmp_path / f"r{i}.log", device=d)
            for i, d in enumerate(devices)]
    jobs.run_jobs(runs, 2, "bench", gpus=["3", "5"])
    seen = [(tmp_path / f"r{i}.log").read_text().strip() for i in range(6)]
    # the first two start together, one on each GPU; later ones go where fewest run when they start, which
    # depends on which finished first, so only the set is fixed
    assert set(seen[:4]) == {"'3'", "'5'"} and seen[4:] == ["''", "None"]
    jobs.run_jobs(runs, 2, "bench")  # no GPU given: only the CPU run's environment changes
    assert [(tmp_path / f"r{i}.log").read_text().strip() for i in range(6)] == ["None"] * 4 + ["''", "None"]


# a run's process (stands in for `prvr-bench run`): writes its pid beside its log, then as told
_CHILD = """import os, signal, sys, time
open(sys.argv[1], 'w').write(str(os.getpid()))
if sys.argv[2] == 'term':
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
"""


def _pid_jobs(monkeypatch, tmp_path, what):
    """Jobs whose processes run _CHILD; what[i] tells job i to end itself by SIGTERM or to wait."""
    monkeypatch.setattr(jobs, "run_command", lambda args: [sys.executable, "-c", _CHILD, *args])
    monkeypatch.setattr(jobs, "POLL_S", 0.05)
    return [Job([str(tmp_path / f"r{i}.pid"), w], f"run{i}", tmp_path / f"r{i}.json", tmp_path / f"r{i}.log")
            for i, w in enumerate(what)]


def _gone(pid, within_s=10.0):
    import os
    import time

    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_run_ended_by_a_signal_stops_the_fanout(monkeypatch, tmp_path):
    """A run killed from outside (here it sends itself SIGTERM) is a stop, not one failure among many:
    the other running run is ended and the runs not started stay so (earlier the next run started)."""
    runs = _pid_jobs(monkeypatch, tmp_path, ["term", "wait", "wait", "wait"])
    with pytest.raises(jobs.UserError, match=r"run0 was ended by SIGTERM \(log: .*r0.log\), so sweep stopped: "
                       r"1 other run ended, 2 not started; run the same command again to resume"):
        jobs.run_jobs(runs, 2, "sweep")
    other = int((tmp_path / "r1.pid").read_text())
    assert _gone(other)
    assert not (tmp_path / "r2.log").exists() and not (tmp_path / "r3.log").exists()


def _memory_fanout(monkeypatch, tmp_path, runs):
    """run_jobs over `runs` [(label, memory_mb, expected_s)], each a process of 0.4 s, on a machine with
    14 GB free where each running run holds 0.5 GB so far; returns ([(label, labels running when it
    started)], progress lines)."""
    monkeypatch.setattr(jobs, "run_command", lambda args: [sys.executable, "-c", "import time; time.sleep(0.4)"])
    monkeypatch.setattr(jobs, "POLL_S", 0.05)
    monkeypatch.setattr(jobs, "available_mb", lambda: 14_000.0)
    monkeypatch.setattr(jobs, "status_kb", lambda key, pid: 500 * 1024)
    lines: list[str] = []
    monkeypatch.setattr(jobs.progress, "log", lines.append)
    live: list = []
    started = []
    real_start = jobs._start

    def tracked(job, gpu):
        started.append((job.label, sorted(j.label for p, j in live if p.poll() is None)))
        live.append((real_start(job, gpu), job))
        return live[-1][0]

    monkeypatch.setattr(jobs, "_start", tracked)
    jobs.run_jobs([Job([], label, tmp_path / f"{label}.json", tmp_path / f"{label}.log", expected, memory_mb=mb)
                   for label, mb, expected in runs], 2, "bench")
    return started, lines


def test_a_run_waits_while_its_memory_does_not_fit_beside_the_running(monkeypatch, tmp_path):
    """Two runs of about 12 GB each with 14 GB free (two at once was an out-of-memory kill of one):
    the second starts when the first has ended, said once; a small run is not held back behind a
    big one, and a run alone always starts."""
    started, lines = _memory_fanout(monkeypatch, tmp_path, [("big0", 12_000.0, 10.0), ("big1", 12_000.0, 9.0)])
    assert started == [("big0", []), ("big1", [])]
    assert [ln for ln in lines if " waits:" in ln] == [
        "big1 waits: it needs about 11.7 GB of host memory at its peak, 2.4 GB are free beside the 1 running; it "
        "starts when one ends"]  # once, though it waited over many polls
    started, _ = _memory_fanout(monkeypatch, tmp_path / "b", [("big0", 12_000.0, 10.0), ("big1", 12_000.0, 9.0),
                                                             ("small", 1_000.0, 1.0)])
    assert started[:2] == [("big0", []), ("small", ["big0"])]  # small fits beside big0, big1 does not
    assert [labels for label, labels in started if label == "big1"] != [["big0"]]
    alone, _ = _memory_fanout(monkeypatch, tmp_path / "c", [("huge", 90_000.0, 1.0)])
    assert alone == [("huge", [])]


def test_headroom_counts_what_the_running_runs_will_still_grow_by(monkeypatch):
    monkeypatch.setattr(jobs, "available_mb", lambda: 10_000.0)
    monkeypatch.setattr(jobs, "status_kb", lambda key, pid: 3_000 * 1024)

    class Proc:
        pid = 1

    from pathlib import Path

    running = [(Proc(), Job([], "a", Path("a.json"), Path("a.log"), memory_mb=8_000.0), None),
               (Proc(), Job([], "b", Path("b.json"), Path("b.log")), None)]  # b: no figure, counts nothing
    assert jobs.headroom_mb(running) == 5_000.0
    pending = [Job([], "c", Path("c.json"), Path("c.log"), memory_mb=6_000.0),
               Job([], "d", Path("d.json"), Path("d.log"), memory_mb=0.0)]
    assert jobs.next_fitting(pending, running)[0].label == "d"  # no figure: not held back
    monkeypatch.setattr(jobs, "available_mb", lambda: None)  # the machine does not say: nothing held back
    assert jobs.next_fitting(pending, running)[0].label == "c"


def test_a_runs_expected_memory_is_its_records_peak(tmp_path):
    import json

    folder = tmp_path / "runs" / "sim-tiny" / "msl"
    folder.mkdir(parents=True)
    (folder / "seed0.json").write_text(json.dumps({"resources": {"peak_rss_mb": 4376.3}}))
    (folder / "seed1.json").write_text(json.dumps({"resources": {"peak_rss_mb": 5120.0}}))
    (folder / "seed2.json").write_text("{not json")  # a bad record loses its figure only
    assert jobs.recorded_peak_mb(folder / "seed3.json") == 5120.0
    assert jobs.recorded_peak_mb(tmp_path / "none" / "seed0.json") == 0.0


def test_the_plan_says_when_the_largest_peaks_do_not_fit_together(capsys, tmp_path, monkeypatch):
    """bench --plan --jobs 2: two runs whose records peaked at 12.4 GB on a 23 GB machine are said to
    wait for one another; one at a time, or runs that fit, say nothing."""
    from prvr.harness.cli import plan

    monkeypatch.setattr(plan, "meminfo_mb", lambda key: 23_000.0 if key == "MemTotal" else None)
    earlier = tmp_path / "runs" / "sim-tiny" / "baseline"
    earlier.mkdir(parents=True)
    (earlier / "seed0.json").write_text(json.dumps({"timings": {"train": 60.0}, "resources": {"peak_rss_mb": 12_700.0}}))
    args = ["bench", "--plan", "--method", "baseline", "--dataset", "sim-tiny", "--seeds", "1", "2", "--out",
            str(tmp_path), "--quiet"]
    code, out, err = _out(capsys, *args, "--jobs", "2")
    assert code == 0, err
    assert ("memory: the 2 largest expected peaks (12.4 + 12.4 GB of host memory) exceed this machine's 22.5 GB, "
            "so such runs wait for one another rather than start together") in out
    code, out, _ = _out(capsys, *args, "--jobs", "1")
    assert code == 0 and "memory:" not in out
    assert plan.memory_line([plan.PlanRow("a", "d", 0, plan.Estimate(1.0), memory_mb=5_000.0)] * 2, 2, 23_000.0) == ""
    monkeypatch.setattr(plan, "meminfo_mb", lambda key: None)  # a machine that does not say: nothing said
    assert plan.memory_line([plan.PlanRow("a", "d", 0, plan.Estimate(1.0), memory_mb=15_000.0)] * 2, 2) == ""


def test_sigterm_to_the_fanout_ends_its_runs(tmp_path):
    """`kill PID` of a bench or sweep with --jobs: its runs end with it (earlier they trained on)."""
    import os
    import signal
    import subprocess
    import time

    script = f"""import sys
from pathlib import Path
from prvr.harness.cli import jobs
jobs.run_command = lambda args: [sys.executable, "-c", {_CHILD!r}, *args]
jobs.POLL_S = 0.05
tmp = Path({str(tmp_path)!r})
jobs.run_jobs([jobs.Job([str(tmp / f"r{{i}}.pid"), "wait"], f"run{{i}}", tmp / f"r{{i}}.json", tmp / f"r{{i}}.log")
               for i in range(3)], 2, "bench")
"""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pids = [tmp_path / "r0.pid", tmp_path / "r1.pid"]
    end = time.monotonic() + 30
    while not all(p.is_file() and p.read_text() for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    os.kill(parent.pid, signal.SIGTERM)
    _, err = parent.communicate(timeout=30)
    assert parent.returncode != 0 and b"KeyboardInterrupt" in err
    assert all(_gone(int(p.read_text())) for p in pids)
    assert not (tmp_path / "r2.log").exists()


def test_which_runs_train_on_the_cpu():
    assert run_device("cpu", env={}) == "cpu" and run_device("auto", env={"PRVR_DEVICE": "cpu"}) == "cpu"
    assert run_device("auto", env={}) != "cpu" and run_device("cuda", env={"PRVR_DEVICE": "cpu"}) != "cpu"
    assert run_device("cuda:1", env={}) != "cpu"


def test_a_ray_task_of_a_cpu_run_sees_no_gpu(monkeypatch, tmp_path):
    """The body of a Ray task (executors.train_job) starts its run with the environment it is handed."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # as a worker that an earlier GPU task left
    shows = "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    monkeypatch.setattr(executors, "run_command", lambda args: [sys.executable, "-c", shows])
    cpu, cuda = (Job([], "r", tmp_path / "r.json", tmp_path / "r.log", device=d) for d in ("cpu", "cuda"))
    for job, seen in ((cpu, "''"), (cuda, "'0'")):
        assert executors.train_job([], str(job.log), str(tmp_path), jobs.gpu_env(job, None))[0] == 0
        assert job.log.read_text().strip() == seen


@pytest.mark.parametrize("device, gpus, workers", [("auto", ("0", "1"), 4), ("cpu", (), 16)])
def test_bench_hands_the_visible_gpus_to_its_runs(monkeypatch, tmp_path, device, gpus, workers):
    monkeypatch.delenv("PRVR_DEVICE", raising=False)  # train.device=auto means CUDA where there is one
    monkeypatch.setattr(fanout, "visible_gpus", lambda: ["0", "1"])  # where the CLI looks them up
    monkeypatch.setattr(jobs, "usable_cores", lambda: 16)
    started = []
    monkeypatch.setattr(fanout, "run_jobs",
                        lambda runs, n, command, gpus, deadline=None: started.append((runs, n, tuple(gpus))) or 0)
    monkeypatch.setattr(leaderboard, "rebuild", lambda out: None)
    assert main(["bench", "--method", "baseline", "--dataset", "sim-tiny", "--seeds", "0", "1", "--out", str(tmp_path),
                 "--jobs", "auto", "--runs-per-gpu", "2", "--set", f"train.device={device}", "--quiet"]) == 0
    (runs, n, handed), = started
    assert n == workers and handed == gpus and all(r.cuda == bool(gpus) and r.cpu == (device == "cpu") for r in runs)


@pytest.mark.parametrize("args, message", [
    (["--runs-per-gpu", "0"], "--runs-per-gpu must be at least 1, got 0"),
    (["--address", "auto"], "--address names a Ray cluster; add --executor ray"),
    (["--quick", "--tag", "x"], "--quick tags its runs 'quick'; leave --tag out"),
    (["--quick", "--dataset", "sim-charades"], "--quick runs on sim-tiny; leave --dataset out"),
])
def test_bad_fan_out_options(capsys, tmp_path, args, message):
    code, _, err = _out(capsys, "bench", "--method", "baseline", "--out", str(tmp_path), "--quiet", *args)
    assert code == 2 and message in err and err.count("\n") == 1


def test_quick_plans_every_method_on_sim_tiny_into_its_own_folder(capsys):
    code, out, err = _out(capsys, "bench", "--quick", "--plan")
    assert code == 0, err
    assert out.startswith(f"bench plan: {len(METHODS.names())} runs, results in results/quick/")
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and "sim-tiny" in line]
    assert [r[0] for r in rows] == [f"{m}~quick" for m in METHODS.names()]


@pytest.mark.slow
def test_quick_records_are_marked_and_stay_out_of_the_leaderboard(capsys, tmp_path):
    quick, full = tmp_path / "quick", tmp_path / "full"
    code, out, err = _out(capsys, "bench", "--quick", "--method", "baseline", "--out", str(quick), "--jobs", "1",
                          "--threads", "1", "--set", "train.epochs=1", "--quiet")
    assert code == 0, err
    record = quick / "runs" / "sim-tiny" / "baseline~quick" / "seed0.json"
    assert json.loads(record.read_text())["tag"] == "quick"
    assert "baseline~quick" in out and "kept out of the leaderboard" in out and not (quick / "leaderboard.md").exists()
    code, _, err = _out(capsys, "bench", "--method", "baseline", "--dataset", "sim-tiny", "--out", str(full),
                        "--set", "train.epochs=1", "--threads", "1", "--quiet")
    assert code == 0, err
    (full / "runs" / "sim-tiny" / "baseline~quick").mkdir()  # a quick record among the benchmark's
    (full / "runs" / "sim-tiny" / "baseline~quick" / "seed0.json").write_bytes(record.read_bytes())
    code, out, err = _out(capsys, "leaderboard", "--out", str(full))
    assert code == 0, err
    md = (full / "leaderboard.md").read_text()
    # neither the quick record's row nor its command (the folders' names hold this test's, so "quick" itself may)
    assert "| sim-tiny | baseline |" in md and "baseline~quick" not in md and "--quick" not in md
    assert "baseline~quick" not in out
    assert "quick" not in (full / "leaderboard.csv").read_text()


def test_prepare_data_builds_each_cache_and_trains_nothing(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PRVR_CACHE", str(tmp_path / "cache"))
    code, _, err = _out(capsys, "bench", "--method", "baseline", "msl", "--dataset", "sim-tiny", "--seeds", "0", "1",
                        "--out", str(tmp_path / "o"), "--prepare-data")
    assert code == 0, err
    assert len(list((tmp_path / "cache" / "sim").iterdir())) == 1
    assert not (tmp_path / "o" / "runs").exists()


def test_a_name_given_twice_plans_its_runs_once(capsys):
    """`bench --method baseline baseline --seeds 0 0` planned each run twice (and would have trained it twice)."""
    assert main(["bench", "--method", "baseline", "baseline", "--dataset", "sim-tiny", "sim-tiny", "--seeds", "0", "0",
                 "--plan"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith("baseline ")]
    assert rows == [["baseline", "sim-tiny", "0", *rows[0][3:]]] and "bench plan: 1 run" in out


def test_a_tagged_run_without_records_is_timed_by_its_untagged_runs(tmp_path):
    """A sweep's `baseline~repeat_prob0.7` costs what `baseline` did: its records time it, said so."""
    from prvr.harness.cli.plan import estimate
    from prvr.harness.engine.config import resolve

    plain = tmp_path / "runs" / "sim-tiny" / "baseline"
    plain.mkdir(parents=True)
    (plain / "seed0.json").write_text(json.dumps({"timings": {"train": 50.0, "eval_test": 10.0}}))
    cfg = resolve("baseline", "sim-tiny", 1, [])
    found = estimate(cfg, tmp_path / "runs" / "sim-tiny" / "baseline~repeat_prob0.7" / "seed1.json", {})
    assert (found.seconds, found.source) == (60.0, "records of baseline")
    assert estimate(cfg, tmp_path / "runs" / "sim-tiny" / "msl~x" / "seed1.json", {}).seconds is None


def test_a_run_on_a_larger_world_is_timed_by_its_untagged_runs_scaled_by_the_training_videos(tmp_path):
    """`msl~train_videos3000` from `msl`'s records at 600 videos: five times the epoch's work (the 2-core CPU
    took 31 minutes for a baseline run at 3,000 against 7 at 600), said so; a record that states no world
    size leaves the figure as it is."""
    from prvr.harness.cli.plan import estimate
    from prvr.harness.engine.config import resolve

    plain = tmp_path / "runs" / "sim-tiny" / "baseline"
    plain.mkdir(parents=True)
    stored = resolve("baseline", "sim-tiny", 0, []).sim.train_videos
    (plain / "seed0.json").write_text(json.dumps({"timings": {"train": 50.0, "eval_test": 10.0},
                                                  "config": {"sim": {"train_videos": stored}}}))
    cfg = resolve("baseline", "sim-tiny", 1, [f"sim.train_videos={stored * 4}"])
    found = estimate(cfg, tmp_path / "runs" / "sim-tiny" / "baseline~big" / "seed1.json", {})
    assert found.seconds == pytest.approx(240.0)
    assert found.source == f"records of baseline x 4: {stored * 4} training videos, not {stored}"
    (plain / "seed0.json").write_text(json.dumps({"timings": {"train": 50.0, "eval_test": 10.0}}))
    assert estimate(cfg, tmp_path / "runs" / "sim-tiny" / "baseline~big" / "seed1.json", {}).seconds == 60.0


def test_a_variant_world_without_its_own_profile_is_timed_by_its_bases(tmp_path):
    """sim-tvr-v2 is a variant of sim-tvr, where the profile trains: a run there without records is
    timed by the sim-tvr epoch, scaled by the training videos where the run's world is larger."""
    from prvr.harness.cli.plan import estimate, profile_costs
    from prvr.harness.engine.config import resolve

    (tmp_path / "profile.csv").write_text(PROFILE)
    costs = profile_costs(tmp_path / "profile.csv")
    cfg = resolve("arl", "sim-tvr-v2", 0, [])
    assert cfg.sim.train_videos == 600  # sim-tvr's, which sim-tvr-v2 keeps
    found = estimate(cfg, tmp_path / "runs" / "sim-tvr-v2" / "arl" / "seed0.json", costs)
    assert found.seconds == pytest.approx(20.0 * cfg.train.epochs)
    assert found.source == (f"profile on sim-tvr, of which sim-tvr-v2 is a variant: at most {cfg.train.epochs} "
                            "epochs x 20 s, training only")
    big = resolve("arl", "sim-tvr-v2", 0, ["sim.train_videos=3000"])
    found = estimate(big, tmp_path / "runs" / "sim-tvr-v2" / "arl~big" / "seed0.json", costs)
    assert found.seconds == pytest.approx(100.0 * big.train.epochs)
    assert "profile on sim-tvr x 5 (sim-tvr-v2: 3000 training videos, not 600)" in found.source
    # msl is profiled on sim-charades only, of which sim-tvr-v2 is no variant: unknown
    assert estimate(resolve("msl", "sim-tvr-v2", 0, []), tmp_path / "runs" / "sim-tvr-v2" / "msl" / "seed0.json",
                    costs).seconds is None


def test_the_plans_total_says_when_every_record_exists():
    """A plan whose runs are all kept says there is nothing to make, not an unknown total."""
    from prvr.harness.cli import plan

    kept = plan.PlanRow("a", "d", 0, plan.Estimate(None), kept=True)
    assert plan.total_line([kept, kept], 1) == "total: nothing to make (2 runs, every record exists)"
    assert plan.total_line([plan.PlanRow("a", "d", 0, plan.Estimate(None))], 1).startswith("total: unknown (1 runs")
    assert plan.total_line([plan.PlanRow("a", "d", 0, plan.Estimate(60.0))], 1).endswith(" for 1 runs")
