"""`--executor ray`: each planned run a Ray task that starts the `prvr-bench run` of `--jobs`, so the
same records; what each task asks for, failures named with their log, Ctrl-C cancelling. The
scheduling is tested against a stand-in for Ray; one test runs a local Ray where it is installed."""

import sys
import types

import pytest

from prvr.harness.cli import executors
from prvr.harness.cli import main
from prvr.harness.base.io import UserError
from prvr.harness.cli.jobs import Job, Launch


def test_without_ray_the_error_says_how_to_install_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    code = main(["bench", "--executor", "ray", "--method", "baseline", "--dataset", "sim-tiny",
                 "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install prvr-bench[ray]" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_an_address_nothing_answers_at_is_one_line(capsys, monkeypatch, tmp_path):
    import socket

    monkeypatch.setattr(executors, "import_ray", lambda: FakeRay())
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["bench", "--executor", "ray", "--address", f"127.0.0.1:{port}", "--method", "baseline",
                 "--dataset", "sim-tiny", "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and f"no Ray cluster answers at --address 127.0.0.1:{port}" in err and err.count("\n") == 1


class FakeRay:
    """What run_on_ray uses of Ray: tasks run when their result is asked for, in submission order."""

    class RayError(Exception):
        pass

    def __init__(self, gpus=0, interrupt=False):
        self.gpus, self.interrupt = gpus, interrupt
        self.inits, self.submitted, self.cancelled, self.shut = [], [], [], False
        self.exceptions = types.SimpleNamespace(RayError=self.RayError)

    def init(self, **kw):
        self.inits.append(kw)

    def shutdown(self):
        self.shut = True

    def cluster_resources(self):
        return {"CPU": 4.0, "GPU": float(self.gpus)}

    def nodes(self):
        return [{"Alive": True, "Resources": {"memory": 8.0 * 2**30}}]

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **options):
                return types.SimpleNamespace(remote=lambda *args: ray.submit(fn, args, options))

        return Task()

    class Ref:  # hashable, as Ray's object refs are
        def __init__(self, fn, args, options):
            self.fn, self.args, self.options = fn, args, options

    def submit(self, fn, args, options):
        ref = self.Ref(fn, args, options)
        self.submitted.append(ref)
        return ref

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if self.interrupt:
            raise KeyboardInterrupt
        return ref.fn(*ref.args)

    def cancel(self, ref):
        self.cancelled.append(ref)


@pytest.fixture
def fake_ray(monkeypatch):
    """A stand-in Ray, and a run process that exits with the code its first argument names."""
    ray = FakeRay(gpus=1)
    monkeypatch.setattr(executors, "import_ray", lambda: ray)
    monkeypatch.setattr(executors, "run_command", lambda args: [
        sys.executable, "-c", "import sys; print('training', sys.argv[1]); sys.exit(int(sys.argv[1]))", *args])
    return ray


def _job(tmp_path, name, code, **kw):
    return Job([str(code)], name, tmp_path / f"{name}.json", tmp_path / "logs" / f"{name}.log", **kw)


def test_each_run_is_a_task_with_its_needs_and_a_failure_names_its_log(fake_ray, tmp_path):
    runs = [_job(tmp_path, "ok", 0, device="cuda", threads=2, memory_mb=1024.0), _job(tmp_path, "bad", 3, threads=2)]
    with pytest.raises(UserError) as e:
        executors.run_on_ray(runs, Launch("ray", runs_per_gpu=2), 3, "bench")
    assert str(e.value) == f"1 of 2 runs failed: bad: training 3 (log: {tmp_path / 'logs' / 'bad.log'})"
    assert [r.options for r in fake_ray.submitted] == [
        {"num_cpus": 2, "num_gpus": 0.5, "max_retries": 0, "name": "ok", "memory": 2**30},
        {"num_cpus": 2, "num_gpus": 0, "max_retries": 0, "name": "bad"}]
    (init,) = fake_ray.inits
    assert (init["num_cpus"], init["address"]) == (6, "local")  # a new local Ray of --jobs x threads CPUs
    assert (tmp_path / "logs" / "ok.log").read_text() == "training 0\n" and fake_ray.shut


def test_a_local_ray_runs_its_tasks_at_this_priority_unless_told(fake_ray, tmp_path, monkeypatch):
    """Ray's workers start niced (15): beside other work a local Ray's runs crawled (4 sim-tiny
    runs 571 s against --jobs 2's 51 s); the local Ray for a bench starts them at niceness 0,
    unless RAY_worker_niceness is set. A cluster keeps what its raylets were started with."""
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    executors.run_on_ray([_job(tmp_path, "ok", 0)], Launch("ray"), 1, "bench")
    assert executors.os.environ["RAY_worker_niceness"] == "0"
    monkeypatch.setenv("RAY_worker_niceness", "10")
    executors.run_on_ray([_job(tmp_path, "ok", 0)], Launch("ray"), 1, "bench")
    assert executors.os.environ["RAY_worker_niceness"] == "10"
    monkeypatch.delenv("RAY_worker_niceness")
    executors.run_on_ray([_job(tmp_path, "ok", 0)], Launch("ray", address="auto"), 1, "bench")
    assert "RAY_worker_niceness" not in executors.os.environ


def test_a_cluster_is_joined_and_gets_no_gpu_request_without_gpus(fake_ray, tmp_path):
    fake_ray.gpus = 0
    executors.run_on_ray([_job(tmp_path, "ok", 0, device="cuda")], Launch("ray", address="auto"), 1, "bench")
    assert fake_ray.inits[0]["address"] == "auto" and fake_ray.submitted[0].options["num_gpus"] == 0


def test_a_run_that_needs_more_memory_than_any_node_is_refused(fake_ray, tmp_path):
    with pytest.raises(UserError, match=r"big needs about 16.0 GB .* more than any Ray node offers \(8.0 GB\)"):
        executors.run_on_ray([_job(tmp_path, "big", 0, memory_mb=16 * 1024.0)], Launch("ray"), 1, "bench")
    assert fake_ray.shut


def test_ctrl_c_cancels_every_task_left(fake_ray, tmp_path):
    fake_ray.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        executors.run_on_ray([_job(tmp_path, f"r{i}", 0) for i in range(3)], Launch("ray"), 1, "bench")
    assert fake_ray.cancelled == fake_ray.submitted[1:] and fake_ray.shut


@pytest.mark.slow
def test_a_local_ray_gives_the_records_of_jobs(capsys, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install prvr-bench[ray]")
    from test_bench_jobs import _bench, _records

    code, err = _bench(capsys, tmp_path / "jobs", "--jobs", "2")
    assert code == 0, err
    code, err = _bench(capsys, tmp_path / "ray", "--executor", "ray", "--jobs", "2")
    assert code == 0, err
    by_jobs, by_ray = _records(tmp_path / "jobs"), _records(tmp_path / "ray")
    assert sorted(by_ray) == ["seed0.json", "seed1.json"]
    for name, record in by_jobs.items():
        assert by_ray[name]["metrics"] == record["metrics"]
        assert [h["loss"] for h in by_ray[name]["history"]] == [h["loss"] for h in record["history"]]
        assert by_ray[name]["command"] == record["command"].replace(str(tmp_path / "jobs"), str(tmp_path / "ray"))
        assert by_ray[name]["provenance"]["device"] == record["provenance"]["device"]
    assert (tmp_path / "ray" / "logs" / "sim-tiny" / "baseline" / "seed0.log").stat().st_size > 0
