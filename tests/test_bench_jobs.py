"""`bench --jobs N`: runs side by side in their own processes, the same records as one by one."""

import json

import pytest

from prvr.harness.cli import ablate
from prvr.harness.cli import main
from prvr.harness.cli.jobs import Job, expected_seconds, schedule


def _bench(capsys, out, *extra):
    code = main(["bench", "--method", "baseline", "--dataset", "sim-tiny", "--seeds", "0", "1", "--out", str(out),
                 "--set", "train.epochs=2", "--threads", "1", "--quiet", *extra])
    return code, capsys.readouterr().err


def _records(out):
    return {p.name: json.loads(p.read_text()) for p in sorted((out / "runs" / "sim-tiny" / "baseline").glob("seed*.json"))}


@pytest.mark.slow
def test_jobs_give_the_records_of_one_by_one(capsys, tmp_path):
    code, err = _bench(capsys, tmp_path / "seq")
    assert code == 0, err
    code, err = _bench(capsys, tmp_path / "par", "--jobs", "2")
    assert code == 0, err
    seq, par = _records(tmp_path / "seq"), _records(tmp_path / "par")
    assert sorted(par) == ["seed0.json", "seed1.json"]
    for name in seq:
        assert par[name]["metrics"] == seq[name]["metrics"]
        assert [h["loss"] for h in par[name]["history"]] == [h["loss"] for h in seq[name]["history"]]
        assert par[name]["provenance"]["device"] == "cpu (1 threads)"
        # the record names the command that made it: the run the bench started
        assert par[name]["command"].startswith("prvr-bench run --method baseline --dataset sim-tiny --seed")
        assert seq[name]["command"] == par[name]["command"].replace("par", "seq")  # in one process too
    assert (tmp_path / "par" / "logs" / "sim-tiny" / "baseline" / "seed0.log").stat().st_size > 0
    assert (tmp_path / "par" / "leaderboard.md").exists()


@pytest.mark.parametrize("fanout", [
    ["bench", "--method", "baseline"],
    ["matrix", "--detectors", "oracle", "--treatments", "ignore", "--backbones", "dual-branch"],
])
def test_a_run_made_in_the_fanout_commands_process_records_its_own_run_line(capsys, tmp_path, fanout):
    """bench / matrix without --jobs train in their own process: each record keeps the `prvr-bench run`
    line that makes that one run again (what `reproduce` re-runs), not the fan-out command."""
    out = tmp_path / "o"
    code = main([*fanout, "--dataset", "sim-tiny", "--seeds", "0", "--out", str(out), "--set", "train.epochs=1",
                 "--threads", "1", "--quiet"])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(p.read_text()) for p in (out / "runs" / "sim-tiny").glob("*/seed0.json")]
    assert records
    for r in records:
        assert r["command"].startswith(f"prvr-bench run --method baseline --dataset sim-tiny --seed 0 --out {out} "
                                       "--set "), r["command"]
        assert "--set train.epochs=1" in r["command"]
        assert r["command"].endswith(" --threads 1") and fanout[0] not in r["command"].split()[:2]


def test_a_failed_run_is_named_with_its_log(capsys, tmp_path):
    code = main(["bench", "--method", "baseline", "--dataset", "tvr", "--data-root", str(tmp_path / "nowhere"),
                 "--out", str(tmp_path / "out"), "--jobs", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "1 of 1 runs failed: baseline on tvr, seed 0:" in err and "does not exist" in err
    assert str(tmp_path / "out" / "logs" / "tvr" / "baseline" / "seed0.log") in err


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "--jobs must be at least 1, got 0"),
    (["--jobs", "many"], "--jobs expects a number of concurrent runs or 'auto', got 'many'"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--threads", "0", "--jobs", "2"], "--threads must be at least 1, got 0"),
])
def test_bad_jobs_or_threads(capsys, tmp_path, args, message):
    code = main(["bench", "--method", "baseline", "--dataset", "sim-tiny", "--out", str(tmp_path), "--quiet", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_longest_expected_run_first(tmp_path):
    def job(name, seconds):
        folder = tmp_path / name
        folder.mkdir()
        for seed, s in enumerate(seconds):
            (folder / f"seed{seed}.json").write_text(json.dumps({"timings": {"train": s, "eval_test": 1.0}}))
        record = folder / "seed9.json"
        return Job([], name, record, tmp_path / f"{name}.log", expected_seconds(record))

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "seed0.json").write_text("{not json")
    jobs = [job("short", [9.0, 19.0]), job("new", []), job("long", [99.0]), job("tie", [14.0])]
    jobs.append(Job([], "broken", tmp_path / "broken" / "seed1.json", tmp_path / "b.log",
                    expected_seconds(tmp_path / "broken" / "seed1.json")))
    assert jobs[0].expected_s == 15.0 and jobs[2].expected_s == 100.0
    # runs never made (or whose records cannot be read) go first, in plan order; then by time
    assert [j.label for j in schedule(jobs)] == ["new", "broken", "long", "short", "tie"]


def test_a_runs_expected_time_comes_from_records_of_its_kind_of_device(tmp_path):
    """A lent GPU's records (a sim-tvr-v2 run in a minute) are no estimate of a CPU run (several):
    each kind is estimated from its own; a record that names no device counts for either."""
    folder = tmp_path / "baseline"
    folder.mkdir()
    for seed, (device, seconds) in enumerate([("cpu (1 threads)", 400.0), ("cuda: NVIDIA H200", 60.0),
                                              ("cuda: NVIDIA H200", 50.0)]):
        (folder / f"seed{seed}.json").write_text(json.dumps({"timings": {"train": seconds},
                                                             "provenance": {"device": device}}))
    record = folder / "seed9.json"
    assert expected_seconds(record, "cpu") == 400.0 and expected_seconds(record, "cuda") == 55.0
    assert expected_seconds(record) == pytest.approx(170.0)
    (folder / "seed3.json").write_text(json.dumps({"timings": {"train": 100.0}}))  # an old record: no device
    assert expected_seconds(record, "cpu") == 250.0
    assert expected_seconds(tmp_path / "none" / "seed0.json", "cpu") == float("inf")


@pytest.mark.parametrize("command", [["run", "--method", "baseline"], ["ablate", "--method", "arl", "--table", "5"]])
def test_threads_is_checked_by_every_training_command(capsys, tmp_path, command):
    code = main([*command, "--dataset", "sim-tiny", "--out", str(tmp_path), "--threads", "0", "--quiet"])
    assert code == 2 and "--threads must be at least 1, got 0" in capsys.readouterr().err


def _as_run(run_args):
    """The config and run name that `prvr-bench run ARGS` would train (as cmd_run resolves them)."""
    from prvr.harness.cli.app import build_parser
    from prvr.harness.cli.args import data_root_overrides
    from prvr.harness.engine.config import resolve
    from prvr.harness.engine.runner import run_name

    a = build_parser().parse_args(["run", *run_args])
    cfg = resolve(a.method, a.dataset, a.seed, [*data_root_overrides(a), *a.overrides], a.config)
    return cfg, run_name(cfg, a.tag)


@pytest.mark.parametrize("method, table, extra", [
    ("ral", "2", ["--backbone", "msl"]),  # a home row (msl) and rows on another backbone
    ("xml-pr", "1", ["--set", "train.epochs=3", "--tag", "e3"]),  # a row that is the plain run; --set and --tag
])
def test_ablate_jobs_start_each_row_as_the_run_that_trains_it_alone(monkeypatch, tmp_path, method, table, extra):
    """`ablate --jobs N` hands every planned row x seed to `prvr-bench run` processes: each one's
    arguments resolve to the row's own config and run name, each run once."""
    started = []
    monkeypatch.setattr(ablate, "run_in_processes", lambda out, runs, workers, threads, command, launch: started.append(
        (runs, workers, threads, command)) or 0)  # none left unstarted
    assert main(["ablate", "--method", method, "--table", table, "--dataset", "sim-tiny", "--seeds", "0", "1",
                 "--out", str(tmp_path), "--jobs", "2", "--threads", "1", "--quiet", *extra]) == 0
    (runs, workers, threads, command), = started
    assert (workers, threads, command) == (2, 1, "ablate")  # its progress lines say ablate, not bench
    table_ = ablate.get_table(method, table)
    names = [name for _, name, _ in runs]
    assert len({(name, cfg.seed) for cfg, name, _ in runs}) == len(runs) and {cfg.seed for cfg, _, _ in runs} == {0, 1}
    for cfg, name, run_args in runs:
        assert run_args[run_args.index("--out") + 1] == str(tmp_path)
        got, got_name = _as_run(run_args)
        assert got_name == name and got.to_dict() == cfg.to_dict()
    if method == "xml-pr":  # the np-vp 0.7 row of sim-tiny is the plain xml-pr run, the XML row the plain xml run
        assert sorted(set(names)) == sorted({"xml~e3", "xml-pr~e3", *(f"xml-pr~{r.tag}_e3" for r in table_.rows[1:]
                                                                       if r.tag != "np-vp_0.7")})
    else:
        assert {"msl", "ral@msl~msra", "ral@msl~csa", "ral@msl"} == set(names)


def test_threads_bound_torch_and_numpys_blas_alike():
    """--threads N: torch's threads and numpy's BLAS threads (threadpoolctl), so that runs side by side do
    not each take every core for the data path's small matrix products."""
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from prvr.harness.cli.args import set_threads

    before = torch.get_num_threads()
    with threadpool_limits(limits=None):  # whatever the test sets is undone after it
        try:
            set_threads(1)
            assert torch.get_num_threads() == 1
            blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
            assert blas and all(p["num_threads"] == 1 for p in blas)
        finally:
            torch.set_num_threads(before)


class _Done:
    """A started run that has already ended well (what jobs._start returns: a Popen's poll and returncode)."""

    returncode = 0

    def poll(self):
        return 0


class _Clock:
    """jobs.py's `time` in the deadline tests: a clock that stands still, so they read no wall clock
    (`run_jobs` reads `monotonic` and `perf_counter`, and sleeps between polls)."""

    now = 1000.0

    def monotonic(self):
        return self.now

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        pass


def test_finish_by_starts_only_the_runs_expected_to_end_in_time(monkeypatch, tmp_path, capsys):
    """A run starts only where its expected time ends by the deadline; one with none only before it; the
    others are left, said in one line, and counted."""
    from prvr.harness.cli import jobs as jobs_module

    clock = _Clock()
    monkeypatch.setattr(jobs_module, "time", clock)
    started = []
    monkeypatch.setattr(jobs_module, "_start", lambda job, gpu: started.append(job.label) or _Done())
    monkeypatch.setattr(jobs_module, "report", lambda job, code, took: None)
    monkeypatch.setattr(jobs_module, "POLL_S", 0.0)

    def plan():
        return [Job([], label, tmp_path / label / "seed0.json", tmp_path / f"{label}.log", seconds)
                for label, seconds in (("short", 5.0), ("long", 1000.0), ("new", float("inf")))]

    assert jobs_module.run_jobs(plan(), 2, "bench", deadline=clock.now + 100) == 1
    assert sorted(started) == ["new", "short"]
    err = capsys.readouterr().err
    assert "bench: 1 run not started, each expected to end past --finish-by (long); the same command again" in err
    started.clear()
    assert jobs_module.run_jobs(plan(), 2, "bench", deadline=clock.now - 1) == 3 and started == []
    assert jobs_module.run_jobs(plan(), 2, "bench") == 0 and len(started) == 3  # no deadline: every run


def test_finish_by_expects_a_new_run_to_take_what_its_recipe_took_here(monkeypatch, tmp_path, capsys):
    """A run with no record of its own is expected to take what its recipe's runs made in the same
    fan-out took (another world's tag, another seed): on a lent H200 (2026-11-29) a sweep under
    --finish-by 150 started RAL runs at a world it had not made yet past 100 s, and lost them at the
    limit, where its runs at the first world had taken 83 s. A recipe nothing has made yet still
    starts before the deadline."""
    from prvr.harness.cli import jobs as jobs_module

    clock = _Clock()
    monkeypatch.setattr(jobs_module, "time", clock)
    took = {"ral@msl~w1": 150.0, "msl": 1.0}
    started = []

    def start(job, gpu):
        started.append(job.label)
        job.started = clock.now - took.get(job.label, 1.0)  # as if it had run that long
        return _Done()

    monkeypatch.setattr(jobs_module, "_start", start)
    monkeypatch.setattr(jobs_module, "report", lambda job, code, seconds: None)
    monkeypatch.setattr(jobs_module, "POLL_S", 0.0)
    plan = [Job([], label, tmp_path / label / "seed0.json", tmp_path / f"{label}.log")
            for label in ("ral@msl~w1", "ral@msl~w2", "msl")]
    assert jobs_module.run_jobs(plan, 1, "sweep", deadline=clock.now + 100) == 1
    assert started == ["ral@msl~w1", "msl"]
    assert plan[1].expected_s == 150.0
    assert "1 run not started, each expected to end past --finish-by (ral@msl~w2)" in capsys.readouterr().err
    seen, inf = jobs_module.SeenTimes(), float("inf")  # its own run's seeds first, then its recipe's other runs
    seed1 = Job([], "", tmp_path / "ral@msl~w2" / "seed1.json", tmp_path / "l")
    seen.add(plan[0], 150.0)
    assert seen.expect(seed1, inf) == 150.0
    seen.add(Job([], "", tmp_path / "ral@msl~w2" / "seed0.json", tmp_path / "l"), 90.0)
    assert seen.expect(seed1, inf) == 90.0  # asked again: its own run's seed now
    assert seen.expect(Job([], "", tmp_path / "ral@msl~w3" / "seed0.json", tmp_path / "l"), inf) == 120.0
    assert seen.expect(Job([], "", tmp_path / "ral@gmmformer~w3" / "seed0.json", tmp_path / "l"), inf) == inf
    assert seen.expect(Job([], "", tmp_path / "ral@msl~w3" / "seed0.json", tmp_path / "l"), 7.0) == 7.0


def test_finish_by_is_checked_and_leaves_runs_for_the_same_command_again(capsys, tmp_path):
    """CPU. --finish-by is a number of seconds above 0 (one line otherwise); a deadline already past leaves
    the run a record says takes longer unstarted, keeps the made one, and exits 0 with the tables written."""
    for bad in ("0", "-5", "soon", "nan"):
        code, err = _bench(capsys, tmp_path / "bad", "--finish-by", bad)
        assert code == 2 and f"--finish-by must be a number of seconds above 0, got '{bad}'" in err
        assert err.count("\n") == 1
    argv = ["bench", "--method", "baseline", "--dataset", "sim-tiny", "--out", str(tmp_path / "o"), "--set",
            "train.epochs=1", "--threads", "1"]
    assert main([*argv, "--seeds", "0"]) == 0  # seed 0's record: the expected time of the run's other seeds
    capsys.readouterr()
    code = main([*argv, "--seeds", "0", "1", "--skip-existing", "--finish-by", "0.000001"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "1 run not started, each expected to end past --finish-by (baseline on sim-tiny, seed 1)" in err
    assert [p.name for p in (tmp_path / "o" / "runs" / "sim-tiny" / "baseline").glob("seed*.json")] == ["seed0.json"]


def test_the_adaptive_rule_says_when_the_deadline_stopped_a_pair():
    from prvr.harness.cli.resolve_seeds import Outcome

    assert "--finish-by stopped it, unresolved" in Outcome("a", "b", 4, 1, False, True).sentence()
    assert "the seed cap stopped it" in Outcome("a", "b", 10, 7, False).sentence()
