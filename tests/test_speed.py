"""Speed and memory beside the official code (issues 60, 61): `prvr-bench measure` around a command, the
record's `resources`, the parity report's speed block and sidecar, and the `speed` table built from the
sidecars. Every bad file is one line naming it and its key; no figure is judged against a wall clock."""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest
import torch

from prvr.harness.base.io import UserError
from prvr.harness.cli import main
from prvr.harness.cli.measure import read_usage
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import load_record, record_path, write_record
from prvr.harness.engine.runner import run_one, run_resources
from prvr.harness.reports.speed import read_sidecar

import unprivileged  # noqa: E402  (tests/unprivileged.py)
from test_bad_input_tables import HOSTILE, check_csv, check_markdown  # noqa: E402  (the hostile cell's checks)
from test_parity import LOG, _record  # noqa: E402  (tests/test_parity.py: the official log, our record)

MB = 60  # what the measured command allocates
# a child that starts a grandchild holding MB megabytes for a second: the peak is the process tree's
ALLOCATES = (f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
             f"'import time; b = b\"x\" * ({MB} * 2**20); time.sleep(1.0)'], check=True)")


@pytest.fixture
def no_gpu_tool(tmp_path, monkeypatch):
    """A PATH without nvidia-smi (the commands are given by absolute path)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def _measure(tmp_path, code, *extra):
    out = tmp_path / "usage.json"
    return main(["measure", "--out", str(out), *extra, "--", sys.executable, "-c", code]), out


# ----------------------------------------------------------------------------- measure


def test_measure_sees_the_peak_of_the_whole_process_tree(tmp_path, no_gpu_tool):
    code, out = _measure(tmp_path, ALLOCATES)
    assert code == 0
    usage = read_usage(out)
    assert usage["peak_rss_mb"] >= MB  # the grandchild's bytes, summed over the tree
    assert "process tree" in usage["peak_rss_measure"]
    assert usage["exit_status"] == 0 and usage["command"][:2] == [sys.executable, "-c"]
    assert usage["wall_s"] > 0 and usage["cpu_s"] >= 0 and usage["host"]["cores"] >= 1
    assert usage["device_peak_mb"] is None and "no nvidia-smi" in usage["device_measure"]
    assert usage["host"]["gpus"] is None and usage["log"] is None


def test_measure_reads_the_device_peak_from_nvidia_smi_where_there_is_one(tmp_path, monkeypatch):
    """A stand-in nvidia-smi that lists every process with 100 MB: the command's processes are summed."""
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nimport os, sys\n"
                   "if any(a.startswith('--query-gpu') for a in sys.argv):\n    print('Stand-in GPU')\n"
                   "else:\n    print('\\n'.join(f'{p}, 100' for p in os.listdir('/proc') if p.isdigit()))\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    code, out = _measure(tmp_path, "import time; time.sleep(0.5)")
    usage = read_usage(out)
    assert code == 0 and usage["device_peak_mb"] is not None and usage["device_peak_mb"] >= 100
    assert "nvidia-smi" in usage["device_measure"] and usage["host"]["gpus"] == ["Stand-in GPU"]


def test_measure_exits_with_the_commands_status_and_still_writes(tmp_path, no_gpu_tool):
    with pytest.raises(SystemExit) as e:
        _measure(tmp_path, "import sys; sys.exit(3)")
    assert e.value.code == 3 and read_usage(tmp_path / "usage.json")["exit_status"] == 3
    with pytest.raises(SystemExit) as e:  # ended by a signal: 128 + N, as a shell gives it
        _measure(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert e.value.code == 128 + 15


def test_measure_log_holds_the_commands_output(tmp_path, no_gpu_tool, capfd):
    log = tmp_path / "logs" / "official.log"
    code, out = _measure(tmp_path, "import sys; print('epoch 0'); print('warned', file=sys.stderr)", "--log", str(log))
    assert code == 0 and read_usage(out)["log"] == str(log)
    assert set(log.read_text().split()) == {"epoch", "0", "warned"}
    assert "epoch 0" not in capfd.readouterr().out


def test_measure_refuses_a_fifo_target_before_the_command_runs(tmp_path, capsys):
    out, marker = tmp_path / "usage.json", tmp_path / "ran"
    os.mkfifo(out)
    code = main(["measure", "--out", str(out), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    err = capsys.readouterr().err
    assert code == 2 and "usage.json is a FIFO" in err and len(err.strip().splitlines()) == 1, err
    assert not marker.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX folder permissions")
def test_measure_refuses_a_read_only_folder_before_the_command_runs(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if unprivileged.can_drop():
        unprivileged.give_to_nobody(folder)
        tmp_path.chmod(0o711)
    folder.chmod(0o500)
    try:
        done = unprivileged.main_as(["measure", "--out", "ro/usage.json", "--", sys.executable, "-c",
                                     "open('ro/ran', 'w')"], cwd=tmp_path)
        assert done.code == 2, done.err
        assert "cannot write ro/usage.json: Permission denied" in done.err, done.err
        assert len(done.err.strip().splitlines()) == 1, done.err
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


def test_measure_without_a_command_or_with_an_unknown_one_is_one_line(tmp_path, capsys):
    assert main(["measure", "--out", str(tmp_path / "u.json"), "--"]) == 2
    assert main(["measure", "--out", str(tmp_path / "u.json"), "--", str(tmp_path / "no-such-tool")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no command to measure" in err[0] and "cannot run" in err[1]
    assert not (tmp_path / "u.json").exists()


# ----------------------------------------------------------------------------- usage files as input


def _usage(**over):
    usage = {"usage_version": 1, "command": ["python", "train.py"], "exit_status": 0,
             "started": "2026-11-28T00:00:00+00:00", "wall_s": 60.0, "cpu_s": 55.0, "peak_rss_mb": 1000.0,
             "peak_rss_measure": "largest sum of VmRSS over the command's process tree",
             "device_peak_mb": None, "device_measure": "not measured: no nvidia-smi on the PATH",
             "host": {"cpu": "Test CPU", "cores": 2, "gpus": None}, "log": None}
    for key, value in over.items():
        if "." in key:
            outer, inner = key.split(".")
            usage[outer] = {**usage[outer], inner: value}
        elif value is _DROP:
            del usage[key]
        else:
            usage[key] = value
    return usage


_DROP = object()


@pytest.mark.parametrize("over, key, what", [
    ({"wall_s": "fast"}, "wall_s", "expected a number"),
    ({"peak_rss_mb": _DROP}, "peak_rss_mb", "missing"),
    ({"host.cores": 2.5}, "host.cores", "expected an integer"),
    ({"cpu_s": -1.0}, "cpu_s", "not a figure a measurement can have"),
    ({"device_peak_mb": True}, "device_peak_mb", "expected a number or null"),
    ({"command": ["python", 3]}, "command", "other than strings"),
    ({"usage_version": 9}, "usage_version", "not a version"),
])
def test_a_bad_usage_file_is_one_line_naming_file_and_key(tmp_path, over, key, what):
    path = tmp_path / "usage.json"
    path.write_text(json.dumps(_usage(**over)))
    with pytest.raises(UserError, match=what) as e:
        read_usage(path)
    assert f"usage file {path} key '{key}'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("make, what", [
    (lambda p: p.write_text("{not json"), "does not parse"),
    (lambda p: p.write_text("[1]"), "holds list, expected an object"),
    (os.mkfifo, "is a FIFO"),
])
def test_a_usage_file_that_is_no_json_object_is_one_line(tmp_path, make, what):
    path = tmp_path / "usage.json"
    make(path)
    with pytest.raises(UserError, match=what) as e:
        read_usage(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- parity: the speed block, the sidecar


def _parity_inputs(tmp_path, resources=True):
    log = tmp_path / "log.txt"
    log.write_text(LOG)
    rec = tmp_path / "o" / "runs" / "tvr" / "ral" / "seed0.json"
    _record(rec, [100.0, 171.5], 160.0)
    record = json.loads(rec.read_text())
    record.update(epochs_run=2, timings={"data": 1.0, "train": 8.0, "eval_val": 2.0, "eval_test": 1.0},
                  provenance={**record["provenance"], "device": "cpu (1 threads)"})
    if resources:
        record["resources"] = {"peak_rss_mb": 500.0, "peak_rss_measure": "VmHWM since the run started",
                               "device_peak_mb": None, "device_reserved_mb": None, "seconds_per_epoch": 4.0,
                               "epochs_timed": 2}
    rec.write_text(json.dumps(record))
    official = tmp_path / "official-usage.json"
    official.write_text(json.dumps(_usage()))
    return log, rec, official


def _parity(tmp_path, log, rec, name, *extra):
    return main(["parity", "--official-log", str(log), "--record", str(rec), "--name", name,
                 "--out", str(tmp_path / "res"), *extra])


def test_parity_with_official_usage_writes_the_speed_block_and_the_sidecar(tmp_path):
    log, rec, official = _parity_inputs(tmp_path)
    assert _parity(tmp_path, log, rec, "ral-e2", "--official-usage", str(official)) == 0
    text = (tmp_path / "res" / "parity" / "ral-e2.md").read_text()
    assert "## Speed and memory" in text
    # official: 60 s over the 2 epochs of its log; ours: the record's 12 timed seconds over 2 epochs
    assert "| seconds per epoch | 30.00 | 6.00 | 5.00 |" in text
    assert "| evaluation share | not known | 25% |  |" in text
    assert "| peak host memory (MB) | 1,000 | 500 | 2.00 |" in text
    assert "| device peak (MB) |  |  |  |" in text
    assert "- Official: `prvr-bench measure` around the whole command" in text
    assert "- Ours: the run record: its timed phases" in text and "VmHWM since the run started" in text
    side = read_sidecar(tmp_path / "res" / "parity" / "ral-e2.json")
    assert side["sumr"]["verdict"] == "within" and side["sumr"]["delta"] == pytest.approx(1.0)
    assert side["official"]["seconds_per_epoch"] == 30.0 and side["ours"]["seconds_per_epoch"] == 6.0
    assert side["ratio"] == {"seconds_per_epoch": 5.0, "peak_host_mb": 2.0, "device_peak_mb": None}
    assert side["method"] == "ral" and side["dataset"] == "tvr" and side["report"] == "ral-e2.md"
    assert str(tmp_path) not in side["command"] and "--official-usage official-usage.json" in side["command"]


def test_parity_with_both_usages_measures_both_sides_alike(tmp_path):
    log, rec, official = _parity_inputs(tmp_path)
    ours = tmp_path / "ours-usage.json"
    ours.write_text(json.dumps(_usage(wall_s=20.0, peak_rss_mb=800.0)))
    assert _parity(tmp_path, log, rec, "both", "--official-usage", str(official), "--ours-usage", str(ours)) == 0
    text = (tmp_path / "res" / "parity" / "both.md").read_text()
    assert "| seconds per epoch | 30.00 | 10.00 | 3.00 |" in text
    assert "| evaluation share | not known | 15% |  |" in text  # the record's 3 s of evaluation in 20
    assert "- Ours: `prvr-bench measure` around the whole command" in text


def test_parity_counts_the_official_test_command_where_measured(tmp_path):
    """Our command tests its best checkpoint after the last epoch; the official code's test is a command of its
    own, counted on its side with --official-test-usage (seconds added, the larger peak kept)."""
    log, rec, official = _parity_inputs(tmp_path)
    test = tmp_path / "official-test-usage.json"
    test.write_text(json.dumps(_usage(wall_s=10.0, peak_rss_mb=1200.0)))
    assert _parity(tmp_path, log, rec, "tested", "--official-usage", str(official),
                   "--official-test-usage", str(test)) == 0
    text = (tmp_path / "res" / "parity" / "tested.md").read_text()
    assert "| seconds per epoch | 35.00 | 6.00 | 5.83 |" in text  # (60 + 10) s over 2 epochs
    assert "| peak host memory (MB) | 1,200 | 500 | 2.40 |" in text
    assert "with its test command counted as ours counts its own test (--official-test-usage: 10.0 wall s, " \
        "peak host 1,200 MB)" in text
    assert "its phases after the last epoch, eval_test, took 1.0 s of it" in text
    side = read_sidecar(tmp_path / "res" / "parity" / "tested.json")
    assert side["official"]["seconds_per_epoch"] == 35.0 and side["official"]["peak_host_mb"] == 1200.0
    # without it the report says the official test is not counted
    assert _parity(tmp_path, log, rec, "untested", "--official-usage", str(official)) == 0
    assert "not counted: no --official-test-usage" in (tmp_path / "res" / "parity" / "untested.md").read_text()


def test_an_official_test_usage_alone_is_one_line_and_writes_nothing(tmp_path, capsys):
    log, rec, official = _parity_inputs(tmp_path)
    assert _parity(tmp_path, log, rec, "alone", "--official-test-usage", str(official)) == 2
    err = capsys.readouterr().err
    assert f"--official-test-usage {official}" in err and "--official-usage USAGE.json" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "res" / "parity").exists()


def test_parity_without_usage_keeps_its_report_and_still_writes_the_sidecar(tmp_path):
    log, rec, _ = _parity_inputs(tmp_path, resources=False)  # a record made before resources
    assert _parity(tmp_path, log, rec, "plain") == 0
    assert "Speed and memory" not in (tmp_path / "res" / "parity" / "plain.md").read_text()
    side = read_sidecar(tmp_path / "res" / "parity" / "plain.json")
    assert side["official"]["seconds_per_epoch"] is None and side["ours"]["seconds_per_epoch"] == 6.0
    assert side["ours"]["peak_host_mb"] is None and "not in the record" in side["ours"]["measured"]


def test_parity_with_a_bad_usage_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    log, rec, official = _parity_inputs(tmp_path)
    official.write_text(json.dumps(_usage(wall_s=None)))
    assert _parity(tmp_path, log, rec, "bad", "--official-usage", str(official)) == 2
    err = capsys.readouterr().err
    assert f"usage file {official} key 'wall_s'" in err and "--official-usage" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "res" / "parity").exists()


def test_our_side_names_the_processor_it_ran_on(tmp_path):
    """Rows measured on different machines say so: our side's device carries the record's CPU model
    where it ran on a CPU (a GPU run keeps its device as the record names it)."""
    log, rec, official = _parity_inputs(tmp_path)
    record = json.loads(rec.read_text())
    record["provenance"]["cpu"] = {"machine": "x86_64", "capability": "AVX512", "model": "Test EPYC (family 25)"}
    rec.write_text(json.dumps(record))
    assert _parity(tmp_path, log, rec, "ral-cpu", "--official-usage", str(official)) == 0
    sidecar = json.loads((tmp_path / "res" / "parity" / "ral-cpu.json").read_text())
    assert sidecar["ours"]["device"] == "cpu (1 threads), Test EPYC (family 25)"
    assert "| device | Test CPU (2 cores) | cpu (1 threads), Test EPYC (family 25) |" in \
        (tmp_path / "res" / "parity" / "ral-cpu.md").read_text()
    record["provenance"]["device"] = "cuda (NVIDIA H200)"
    rec.write_text(json.dumps(record))
    assert _parity(tmp_path, log, rec, "ral-gpu", "--official-usage", str(official)) == 0
    assert json.loads((tmp_path / "res" / "parity" / "ral-gpu.json").read_text())["ours"]["device"] == \
        "cuda (NVIDIA H200)"


# ----------------------------------------------------------------------------- the speed table


def test_speed_builds_its_table_from_the_sidecars(tmp_path):
    log, rec, official = _parity_inputs(tmp_path)
    assert _parity(tmp_path, log, rec, "ral-a", "--official-usage", str(official)) == 0
    assert _parity(tmp_path, log, rec, "ral-b") == 0
    assert main(["speed", "--out", str(tmp_path / "res")]) == 0
    md = (tmp_path / "res" / "speed.md").read_text()
    assert "Only parity runs fill this table" in md
    assert "| ral | ral | tvr | ours: cpu (1 threads); official: Test CPU (2 cores) | 2 / 2 | 6.00 | 30.00 | 5.00 " \
           "| 500 | 1,000 |  |  | +1.0 | within 2 | `parity/ral-a.md` |" in md
    assert "| ral | ral | tvr | cpu (1 threads) | 2 / 2 | 6.00 |  |  | 500 |  |  |  | +1.0 | within 2 " \
           "| `parity/ral-b.md` |" in md
    rows = (tmp_path / "res" / "speed.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("method,run,dataset,device,") and rows[0].endswith(",parity command")


def test_a_hostile_sidecar_string_stays_one_escaped_cell(tmp_path):
    """A sidecar is input: its strings (run, device, command) are escaped in the table, quoted in the CSV."""
    log, rec, official = _parity_inputs(tmp_path)
    assert _parity(tmp_path, log, rec, "ral-a", "--official-usage", str(official)) == 0
    path = tmp_path / "res" / "parity" / "ral-a.json"
    side = json.loads(path.read_text())
    side.update(run=HOSTILE, command=HOSTILE)
    side["official"]["device"] = side["ours"]["device"] = HOSTILE
    path.write_text(json.dumps(side))
    assert main(["speed", "--out", str(tmp_path / "res")]) == 0
    md = (tmp_path / "res" / "speed.md").read_text()
    check_markdown(md.split("## Produced by")[0], HOSTILE)
    check_csv((tmp_path / "res" / "speed.csv").read_text(), HOSTILE)


def _series(tmp_path, bests, vcmr=None, names=None):
    """Sidecars of one comparison, one a seed: `bests` [(ours, official)] of the best val SumR, `vcmr` the
    same of the VCMR SumR (written as parity writes them for a TVRetrieval log)."""
    log, rec, _ = _parity_inputs(tmp_path)
    assert _parity(tmp_path, log, rec, "ral-e2") == 0
    folder = tmp_path / "res" / "parity"
    first = json.loads((folder / "ral-e2.json").read_text())
    for seed, (ours, official) in enumerate(bests):
        name = (names or {}).get(seed, "ral-e2" if seed == 0 else f"ral-e2_s{seed}")
        side = copy.deepcopy(first)
        side.update(name=name, report=f"{name}.md", seed=seed)
        side["sumr"].update(ours_best=ours, official_best=official, delta=ours - official)
        if vcmr is not None:
            side["sumr"].update(ours_best_vcmr=vcmr[seed][0], official_best_vcmr=vcmr[seed][1])
        (folder / f"{name}.json").write_text(json.dumps(side))


def _welch(a, b, level=0.95):
    """Welch's interval for mean(a) - mean(b), written out (Satterthwaite's degrees of freedom)."""
    from statistics import mean, variance

    from scipy.stats import t
    va, vb = variance(a) / len(a), variance(b) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t.ppf((1 + level) / 2, df) * (va + vb) ** 0.5
    d = mean(a) - mean(b)
    return d - half, d + half


def test_parity_over_seeds_pools_a_comparisons_reports_with_welchs_interval(tmp_path):
    bests = [(270.0, 278.0), (268.0, 280.5), (272.5, 276.0)]
    vcmr = [(150.0, 240.0), (190.0, 180.0), (170.0, 260.0)]
    _series(tmp_path, bests, vcmr)
    assert main(["speed", "--out", str(tmp_path / "res")]) == 0
    md = (tmp_path / "res" / "parity.md").read_text()
    low, high = _welch([o for o, _ in bests], [f for _, f in bests])
    assert high < -2  # wholly beyond the tolerance
    assert (f"| `ral-e2` | ral | tvr | 0 1 2 | 270.2 ± 2.3 | 278.2 ± 2.3 | -8.0 [{low:+.1f}, {high:+.1f}] | outside 2 "
            in md), md
    v_low, v_high = _welch([o for o, _ in vcmr], [f for _, f in vcmr])
    assert v_low < -2 < 2 < v_high and f"| -56.7 [{v_low:+.1f}, {v_high:+.1f}] | unresolved |" in md
    rows = (tmp_path / "res" / "parity.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("ral-e2,ral,tvr,0 1 2,270 268 272.5,278 280.5 276,-8.0000,")
    assert rows[1].endswith("ral-e2.md ral-e2_s1.md ral-e2_s2.md,own")


def test_parity_over_seeds_says_within_one_seed_and_no_vcmr_where_a_report_lacks_it(tmp_path):
    _series(tmp_path, [(100.0, 100.5), (101.0, 101.2), (100.4, 100.0), (100.8, 100.9)])
    (tmp_path / "res" / "parity" / "solo.json").write_text(
        (tmp_path / "res" / "parity" / "ral-e2.json").read_text().replace('"ral-e2', '"solo'))
    assert main(["speed", "--out", str(tmp_path / "res")]) == 0
    md = (tmp_path / "res" / "parity.md").read_text()
    low, high = _welch([100.0, 101.0, 100.4, 100.8], [100.5, 101.2, 100.0, 100.9])
    assert -2 < low and high < 2
    assert f"| -0.1 [{low:+.1f}, {high:+.1f}] | within 2 |  |  |  |  |" in md
    assert "| `solo` | ral | tvr | 0 | 100.0 | 100.5 | -0.5 | one seed |" in md


def _start_every_seed_from_the_official_weights(tmp_path, seeds):
    for seed in seeds:
        path = tmp_path / "res" / "parity" / ("ral-e2.json" if seed == 0 else f"ral-e2_s{seed}.json")
        side = json.loads(path.read_text())
        side["started_from"] = f"{seed:064x}"
        path.write_text(json.dumps(side))


def test_parity_from_one_start_pairs_each_seeds_two_runs(tmp_path):
    """Reports whose runs started from the official weights (train.init_weights) are pairs: the interval is
    the paired t's of the seeds' differences (here narrow, as the sides move together), where Welch's on the
    same figures reaches past the tolerance."""
    from scipy.stats import t
    bests = [(262.0, 262.5), (255.0, 254.8), (270.0, 270.9), (259.0, 259.2)]
    _series(tmp_path, bests)
    _start_every_seed_from_the_official_weights(tmp_path, range(4))
    assert main(["speed", "--out", str(tmp_path / "res")]) == 0
    md = (tmp_path / "res" / "parity.md").read_text()
    d = [o - f for o, f in bests]
    mean = sum(d) / 4
    half = t.ppf(0.975, 3) * (sum((x - mean) ** 2 for x in d) / 3 / 4) ** 0.5
    low, high = mean - half, mean + half
    w_low, w_high = _welch([o for o, _ in bests], [f for _, f in bests])
    assert -2 < low and high < 2 and w_low < -2 and w_high > 2
    assert f"| `ral-e2` | ral | tvr | 0 1 2 3 (one start) |" in md and f"[{low:+.1f}, {high:+.1f}] | within 2 |" in md
    rows = (tmp_path / "res" / "parity.csv").read_text().splitlines()
    assert rows[0].endswith(",reports,start") and rows[1].endswith(",one")


def test_a_series_mixing_one_start_and_seeded_inits_is_one_line(tmp_path, capsys):
    _series(tmp_path, [(1.0, 2.0), (3.0, 4.0)])
    _start_every_seed_from_the_official_weights(tmp_path, [1])
    capsys.readouterr()
    assert main(["speed", "--out", str(tmp_path / "res")]) == 2
    err = capsys.readouterr().err
    assert ("parity reports ral-e2_s1 and ral-e2 are one series (ral-e2) but the first's run started from given "
            "weights (train.init_weights) and the second's from its seeded init" in err) and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "res" / "parity.md").exists()


@pytest.mark.parametrize("change, message", [
    ({1: "ral-e2_s0"}, "parity reports ral-e2, ral-e2_s0 of series ral-e2 are all seed 0"),
])
def test_a_comparison_with_a_seed_twice_is_one_line_and_nothing_is_written(tmp_path, capsys, change, message):
    _series(tmp_path, [(1.0, 2.0), (3.0, 4.0)], names=change)
    side = json.loads((tmp_path / "res" / "parity" / "ral-e2_s0.json").read_text())
    side["seed"] = 0
    (tmp_path / "res" / "parity" / "ral-e2_s0.json").write_text(json.dumps(side))
    capsys.readouterr()
    assert main(["speed", "--out", str(tmp_path / "res")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "res" / "speed.md").exists() and not (tmp_path / "res" / "parity.md").exists()


def test_reports_of_one_name_that_compare_different_things_are_one_line(tmp_path, capsys):
    _series(tmp_path, [(1.0, 2.0), (3.0, 4.0)])
    side = json.loads((tmp_path / "res" / "parity" / "ral-e2_s1.json").read_text())
    side["method"] = "msl"
    (tmp_path / "res" / "parity" / "ral-e2_s1.json").write_text(json.dumps(side))
    capsys.readouterr()
    assert main(["speed", "--out", str(tmp_path / "res")]) == 2
    err = capsys.readouterr().err
    assert "parity reports ral-e2 and ral-e2_s1 are one series (ral-e2: a name and its _sN seeds) but differ in " \
           "method (ral against msl)" in err and len(err.strip().splitlines()) == 1


def test_speed_without_sidecars_says_so(tmp_path):
    assert main(["speed", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "speed.md").read_text()
    assert "No parity report has a sidecar yet" in md and "| method | run |" in md
    assert len((tmp_path / "speed.csv").read_text().splitlines()) == 1


@pytest.mark.parametrize("damage, key", [
    (lambda s: s["ours"].update(seconds_per_epoch="slow"), "ours.seconds_per_epoch"),
    (lambda s: s["sumr"].pop("verdict"), "sumr.verdict"),
    (lambda s: s["sumr"].update(verdict="<b>"), "sumr.verdict"),
    (lambda s: s["official"].update(peak_host_mb=float("nan")), "official.peak_host_mb"),
    (lambda s: s.update(name="../x"), "name"),
    (lambda s: s["sumr"].update(ours_best_vcmr="high"), "sumr.ours_best_vcmr"),
    (lambda s: s["sumr"].update(official_best_vcmr=-1.0), "sumr.official_best_vcmr"),
])
def test_speed_refuses_a_malformed_sidecar_in_one_line(tmp_path, capsys, damage, key):
    log, rec, official = _parity_inputs(tmp_path)
    assert _parity(tmp_path, log, rec, "ral-a", "--official-usage", str(official)) == 0
    path = tmp_path / "res" / "parity" / "ral-a.json"
    side = json.loads(path.read_text())
    damage(side)
    path.write_text(json.dumps(side))
    capsys.readouterr()
    assert main(["speed", "--out", str(tmp_path / "res")]) == 2
    err = capsys.readouterr().err
    assert f"parity sidecar {path} key '{key}'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "res" / "speed.md").exists()


@pytest.mark.parametrize("fifo, other", [("parity/ral-a.json", "parity/ral-a.md"), ("speed.md", "speed.csv"),
                                         ("parity.md", "speed.md")])
def test_a_fifo_where_parity_or_speed_writes_is_one_line_and_nothing_is_written(tmp_path, capsys, fifo, other):
    log, rec, official = _parity_inputs(tmp_path)
    target = tmp_path / "res" / fifo
    target.parent.mkdir(parents=True)
    os.mkfifo(target)
    code = _parity(tmp_path, log, rec, "ral-a", "--official-usage", str(official))
    if not fifo.startswith("parity/"):
        assert code == 0
        code = main(["speed", "--out", str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert code == 2 and f"{target.name} is a FIFO" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "res" / other).exists()


# ----------------------------------------------------------------------------- the record's resources


RESOURCES = {"peak_rss_mb": 812.5, "peak_rss_measure": "VmHWM since the run started", "device_peak_mb": 2048.0,
             "device_reserved_mb": 4096.0, "seconds_per_epoch": 12.5, "epochs_timed": 4}


def _stored(tmp_path, **extra):
    record = {"method": "baseline", "dataset": "sim-x", "seed": 0, "run_name": "baseline", "config": {},
              "provenance": {}, "timings": {"train": 50.0}, "metrics": {"val": {"SumR": 10.0}, "test": {"SumR": 9.0}},
              **extra}
    path = record_path(tmp_path, "sim-x", "baseline", 0)
    write_record(path, record)
    return path, record


def test_the_records_resources_round_trip_and_an_old_record_still_loads(tmp_path):
    path, record = _stored(tmp_path, resources=RESOURCES)
    assert load_record(path)["resources"] == RESOURCES
    path, _ = _stored(tmp_path)  # made before records kept resources
    assert "resources" not in load_record(path)


@pytest.mark.parametrize("damage, key", [
    (lambda r: r.update(peak_rss_mb="big"), "resources.peak_rss_mb"),
    (lambda r: r.pop("epochs_timed"), "resources.epochs_timed"),
    (lambda r: r.update(seconds_per_epoch=-2.0), "resources.seconds_per_epoch"),
    (lambda r: r.update(device_peak_mb=float("inf")), "resources.device_peak_mb"),
])
def test_a_malformed_resources_block_is_one_line_naming_file_and_key(tmp_path, damage, key):
    resources = copy.deepcopy(RESOURCES)
    damage(resources)
    path, _ = _stored(tmp_path, resources=resources)
    with pytest.raises(UserError) as e:
        load_record(path)
    assert f"run record {path} key '{key}'" in str(e.value) and "\n" not in str(e.value)
    path, _ = _stored(tmp_path, resources=[1])
    with pytest.raises(UserError, match="key 'resources': list"):
        load_record(path)


def test_run_resources_divides_the_training_seconds_by_the_epochs_trained():
    got = run_resources(10.0, 4, torch.device("cpu"), rss_reset=True)
    assert got["seconds_per_epoch"] == 2.5 and got["epochs_timed"] == 4
    assert got["device_peak_mb"] is None and got["device_reserved_mb"] is None
    assert got["peak_rss_mb"] is not None and got["peak_rss_mb"] > 0
    assert run_resources(None, 0, torch.device("cpu"), rss_reset=False)["seconds_per_epoch"] is None


def test_a_run_records_its_resources(tmp_path):
    record = run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1", "eval.noise_levels=[]"]), tmp_path)
    resources = record["resources"]
    assert resources["epochs_timed"] == 1 and resources["device_peak_mb"] is None
    assert resources["seconds_per_epoch"] == pytest.approx(record["timings"]["train"], abs=1e-3)
    assert resources["peak_rss_mb"] > 0
    assert load_record(record_path(tmp_path, "sim-tiny", record["run_name"], 0))["resources"] == resources
