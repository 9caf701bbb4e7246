"""`prvr-bench parity`: our run against the official code's run on the same exported data.

A re-implemented method must match its official code on the same data. The workflow
(docs/parity.md): export a simulated dataset in the public layout (`prvr-bench data export`),
train the official code on it outside this repository and ours on the export through the real
loaders (`prvr-bench run --dataset tvr --data-root DIR`) under the same budget, then

    prvr-bench parity --official-log LOG --record OUT/runs/tvr/<run>/seed<S>.json --name NAME

reads the validation SumR of every epoch from both and writes `results/parity/NAME.md`: the two
curves side by side, the best validation SumR of each, the test SumR of each best checkpoint
(where the official log has its `--eval` block) and whether they agree within the tolerance.

With `--official-usage USAGE.json` (the official command measured by `prvr-bench measure`) the report
gains a "Speed and memory" block: each side's seconds per epoch, evaluation share where known, peak host
memory and device peak, the ratio official / ours, and how each figure was measured. Our side is
`--ours-usage USAGE.json` where given (our command measured the same way), else the record's `timings`
and `resources`. Our command also tests the best checkpoint and stores its rankings after the last epoch;
where the official code tests in a command of its own, `--official-test-usage USAGE.json` (that command
measured) counts it on the official side too, so that both sides' seconds per epoch hold the same work.
Every report also writes a sidecar, `results/parity/NAME.json` (harness/reports/speed.py `ParitySidecar`:
these figures and the SumR verdict), from which `prvr-bench speed` builds `results/speed.{md,csv}`.

The official log is read as text, line by line, with regular expressions (nothing in it is
evaluated). Two formats:

- the log of the MS-SL code family (ms-sl, GMMFormer, GMMFormer v2, RAL-PRVR, HLFormer, Holmes,
  DreamPRVR): one block per epoch with `Epoch: N` and `Rsum: X`, after a `Testing from:` line the
  test block; per-branch recall sums where the code logs them (` * recall sum: X`, three per
  evaluation: clip, frame, fused, as RAL-PRVR logs them; or ` * clip_scale ... rsum: X` lines);
- TVRetrieval's `eval.log.txt` (XML, jayleicn/TVRetrieval): one line per epoch,
  `<time> [Epoch] NNN [Metrics] {JSON}`, the JSON (parsed with `json.loads`, every figure checked
  to be a finite number) holding VR `r1 r5 r10 r100` and VCMR `<tIoU>-r<k>`: the validation SumR is
  the VR recall sum and the VCMR SumR the sum of R@1, R@10 and R@100 at tIoU 0.5 and 0.7, as our
  evaluator sums them (docs/evaluation.md). Its test figures are not in that log: `--official-test`
  reads the metrics file its inference script writes (`..._metrics.json`, the same keys).
  The report then compares both sums, each within the tolerance.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any, TypeGuard

from prvr.harness.cli.args import command, command_line
from prvr.harness.base.io import MAX_TEXT_BYTES, UserError, ensure_dir, read_text, write_texts
from prvr.harness.cli.measure import Usage, read_usage
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import load_record_at, made_on
from prvr.harness.reports.speed import (NAME, PARITY_VERSION, ParitySidecar, SideSpeed, SumRVerdict, ratios)
from prvr.harness.reports.table import code, dataset_label, markdown_table

TOLERANCE = 2.0  # SumR: the suite's rule for a faithful re-implementation

_EPOCH = re.compile(r"Epoch:\s*(\d+)\b")
_RSUM = re.compile(r"\bRsum:\s*([-\d.]+)")
_RECALL_SUM = re.compile(r"\* recall sum:\s*([-\d.]+)")
_NAMED_PART = re.compile(r"\* (clip|frame|combined)\w*\b.*\brsum:\s*([-\d.]+)")
_SEED = re.compile(r"\bset seed:\s*(-?\d+)")
_TVR_LINE = re.compile(r"^\S+ \[Epoch\] (-?\d+) \[Metrics\] (\{.*?)\s*$")  # TVRetrieval's eval.log.txt
PARTS = ("clip", "frame", "fused")
VR_KEYS = ("r1", "r5", "r10", "r100")
VCMR_KEYS = tuple(f"{iou}-r{k}" for iou in ("0.5", "0.7") for k in (1, 10, 100))  # our VCMR SumR's terms
VCMR = "VCMR SumR"
AFTER_TRAINING = ("eval_test", "eval_noise", "eval_rankings")  # timed after the last epoch (harness/engine/runner.py)


def read_official_log(path: str | Path) -> dict[str, Any]:
    """{'val': [{'epoch', 'SumR', 'parts'}...], 'test': {'SumR', 'parts'} | None, 'seed': int | None}
    from an MS-SL family log. The branch sums logged just before an epoch's (or the test's) block
    are its parts; the seed is the training script's `set seed: N` line, where it logs one. A
    TVRetrieval `eval.log.txt` is read by `read_tvretrieval_log` (each entry also has its 'VCMR SumR')."""
    path = Path(path)
    try:
        lines = read_text(path, "official log", "pass the log.txt the official training script wrote").splitlines()
    except UserError as err:
        if "not UTF-8" not in str(err):
            raise
        with open(path, "rb") as f:  # a log with stray bytes (a killed write) is still read, bounded
            lines = f.read(MAX_TEXT_BYTES).decode("utf-8", errors="replace").splitlines()
    if any("[Epoch]" in line and "[Metrics]" in line for line in lines):
        return read_tvretrieval_log(path, lines)

    def number(text: str, line: int) -> float:
        try:
            return float(text)
        except ValueError:
            raise UserError(f"{path} line {line}: '{text}' is not a number; pass the log the official training "
                            "script wrote, unedited") from None
    val: dict[int, dict[str, Any]] = {}  # by epoch: a later block of the same epoch replaces it
    test = None
    parts: list[float] = []
    named: dict[str, float] = {}
    epoch = None
    testing = False
    seed = None
    for lineno, line in enumerate(lines, 1):
        if seed is None and (m := _SEED.search(line)):
            seed = int(m.group(1))
            continue
        if m := _NAMED_PART.search(line):
            named["fused" if m.group(1) == "combined" else m.group(1)] = number(m.group(2), lineno)
            continue
        if m := _RECALL_SUM.search(line):
            parts.append(number(m.group(1), lineno))
            continue
        if "Testing from:" in line:
            testing, epoch = True, None
            continue
        if m := _EPOCH.search(line):
            epoch = int(m.group(1))
            continue
        if m := _RSUM.search(line):
            if "Best:" in line:  # the running best, not this evaluation
                continue
            found = named or (dict(zip(PARTS, parts[-3:])) if len(parts) >= 3 else {})
            entry = {"SumR": number(m.group(1), lineno), "parts": found}
            if testing:
                test = entry
            elif epoch is None:
                raise UserError(f"{path} line {lineno}: a validation 'Rsum:' before any 'Epoch: N' line; "
                                "pass the log the official training script wrote (its log.txt)")
            else:
                val[epoch] = {"epoch": epoch, **entry}
            parts, named, epoch = [], {}, None
    if not val:
        raise UserError(f"{path} has no epoch block ('Epoch: N' followed by 'Rsum: X'); pass the log.txt that "
                        "the official training script of the MS-SL code family writes")
    return {"val": [val[e] for e in sorted(val)], "test": test, "seed": seed}


def read_tvretrieval_log(path: Path, lines: list[str]) -> dict[str, Any]:
    """The validations of TVRetrieval's `eval.log.txt`: per epoch its VR SumR ('SumR') and VCMR SumR.
    A later line of the same epoch replaces the earlier; lines without `[Epoch]` (none are written
    there) are passed over; a `[Epoch]` line that does not parse is one error naming its line."""
    fix = "pass the eval.log.txt that TVRetrieval's train.py wrote, unedited"
    val: dict[int, dict[str, Any]] = {}
    for lineno, line in enumerate(lines, 1):
        if "[Epoch]" not in line:
            continue
        m = _TVR_LINE.match(line)
        if m is None:
            raise UserError(f"{path} line {lineno}: not '<time> [Epoch] N [Metrics] {{...}}'; {fix}")
        epoch = int(m.group(1))
        val[epoch] = {"epoch": epoch, **tvretrieval_sums(_json_object(m.group(2), f"{path} line {lineno}", fix),
                                                         f"{path} line {lineno}", fix)}
    return {"val": [val[e] for e in sorted(val)], "test": None, "seed": None, "format": "tvretrieval"}


def tvretrieval_sums(metrics: Any, where: str, fix: str) -> dict[str, Any]:
    """{'SumR': VR recall sum, 'VCMR SumR': ..., 'parts': {}} of one TVRetrieval metrics object."""
    def figures(block: str, keys: tuple[str, ...]) -> list[float]:
        part = metrics.get(block) if isinstance(metrics, dict) else None
        if not isinstance(part, dict):
            raise UserError(f"{where}: no {block} metrics object; {fix}")
        out = []
        for key in keys:
            value = part.get(key)
            if not _finite(value):
                raise UserError(f"{where}: {block} {key} is {str(value)[:40]!r}, not a finite number; {fix}")
            out.append(float(value))
        return out
    return {"SumR": round(sum(figures("VR", VR_KEYS)), 4), VCMR: round(sum(figures("VCMR", VCMR_KEYS)), 4),
            "parts": {}}


def _json_object(text: str, where: str, fix: str) -> Any:
    """JSON text of a log line or metrics file (untrusted: `json.loads`, NaN and Infinity refused)."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")
    try:
        return json.loads(text, parse_constant=constant)
    except (ValueError, RecursionError) as e:
        raise UserError(f"{where}: its JSON does not parse ({str(e)[:80]}); {fix}") from None


def read_official_test(path: str | Path, official: dict[str, Any]) -> dict[str, Any]:
    """The official test figures from TVRetrieval's inference metrics file (`--official-test`), for a
    TVRetrieval log only (an MS-SL family log holds its own test block)."""
    if official.get("format") != "tvretrieval":
        raise UserError(f"--official-test {path}: only a TVRetrieval eval.log.txt takes a test metrics file; "
                        "the MS-SL family's log.txt holds its test block (run its --eval and pass that log)")
    fix = "pass the ..._metrics.json TVRetrieval's inference.py wrote for the test split"
    text = read_text(path, "official test metrics", fix)
    return tvretrieval_sums(_json_object(text, str(path), fix), str(path), fix)


def our_run(record_file: str | Path) -> dict[str, Any]:
    """Our record's validation SumR per epoch (and its VCMR SumR where it has one) and its test figures."""
    record = load_record_at(record_file)
    val = []
    for h in record.get("history", []):
        if isinstance(h.get("val"), dict) and "SumR" in h["val"]:
            entry = {"epoch": int(h["epoch"]), "SumR": float(h["val"]["SumR"])}
            if _finite(h["val"].get(VCMR)):
                entry[VCMR] = float(h["val"][VCMR])
            val.append(entry)
    if not val:
        raise UserError(f"run record {record_file} has no validation SumR in its history; re-run that run")
    test = (record.get("metrics") or {}).get("test") or {}
    return {"val": val, "test": test.get("SumR"), "test_vcmr": test.get(VCMR) if _finite(test.get(VCMR)) else None,
            "record": record}


def _finite(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def shown_command(command: str) -> str:
    """The record's command with absolute paths (the export and the output folder of this
    machine) replaced by placeholders, and other absolute paths, alone or a setting's value, by their names."""
    words = shlex.split(command)
    names = {"--data-root": "EXPORT_DIR", "--out": "OUT"}
    shown = []
    for i, word in enumerate(words):
        previous = words[i - 1] if i else ""
        if previous in names and Path(word).is_absolute():
            word = names[previous]
        elif Path(word).is_absolute():
            word = Path(word).name
        elif "=" in word and Path(word.split("=", 1)[1]).is_absolute():  # a setting's path: train.init_weights=/x/y.npz
            key, value = word.split("=", 1)
            word = f"{key}={Path(value).name}"
        shown.append(word)
    return shlex.join(shown)


def shared_epochs(official: dict[str, Any], ours: dict[str, Any]) -> tuple[list[dict], list[dict], str]:
    """Each side's validation entries at the epochs both logged, and a sentence where they differ (an
    official run stopped early, e.g. killed for memory, is compared over the epochs it reached;
    "" where the sides logged the same epochs)."""
    both = {v["epoch"] for v in official["val"]} & {v["epoch"] for v in ours["val"]}
    if not both:
        raise UserError("the official log and our record share no epoch of validation; pass the official log and "
                        "the record of runs over the same epochs")
    off = [v for v in official["val"] if v["epoch"] in both]
    our = [v for v in ours["val"] if v["epoch"] in both]
    if len(off) == len(official["val"]) and len(our) == len(ours["val"]):
        return off, our, ""
    last = max(both)
    sides = [f"the official log's last validation is epoch {max(v['epoch'] for v in official['val'])}",
             f"ours' is epoch {max(v['epoch'] for v in ours['val'])}"]
    return off, our, (f"The two sides logged different epochs ({'; '.join(sides)}): the best validation SumR is "
                      f"compared over epochs {min(both)}-{last}, which both ran; a test SumR is each side's best "
                      "checkpoint over all its own epochs.")


def verdict(official: dict[str, Any], ours: dict[str, Any], tolerance: float = TOLERANCE) -> SumRVerdict:
    """The best validation SumR of each side over the epochs both logged (`shared_epochs`), Δ (ours −
    official) and whether it is within `tolerance`, and the test SumR of each best checkpoint where known."""
    off, our, _ = shared_epochs(official, ours)
    best_official = max(v["SumR"] for v in off)
    best_ours = max(v["SumR"] for v in our)
    gap = best_ours - best_official
    test = official.get("test")
    judged: SumRVerdict = {"official_best": best_official, "ours_best": best_ours, "delta": round(gap, 4),
                           "tolerance": tolerance, "verdict": "within" if abs(gap) <= tolerance else "outside",
                           "official_test": test["SumR"] if test else None, "ours_test": ours.get("test")}
    official_vcmr, ours_vcmr = ([v[VCMR] for v in side if VCMR in v] for side in (off, our))
    if official_vcmr:  # a log with moment figures (TVRetrieval's): each side's best VCMR SumR, null where none
        judged["official_best_vcmr"] = max(official_vcmr)
        judged["ours_best_vcmr"] = max(ours_vcmr, default=None)
    return judged


def report(official: dict[str, Any], ours: dict[str, Any], name: str, note: str, log_name: str,
           tolerance: float = TOLERANCE, speed: tuple[SideSpeed, SideSpeed] | None = None) -> str:
    """The report's markdown; with `speed` (official, ours), its "Speed and memory" block too."""
    record = ours["record"]
    by_epoch = {v["epoch"]: v for v in official["val"]}
    ours_by_epoch = {v["epoch"]: v["SumR"] for v in ours["val"]}
    epochs = sorted(set(by_epoch) | set(ours_by_epoch))
    has_parts = any(v["parts"] for v in official["val"])
    has_vcmr = any(VCMR in v for v in official["val"])
    vcmr_by_epoch = {v["epoch"]: v.get(VCMR) for v in ours["val"]}
    off_shared, ours_shared, cut = shared_epochs(official, ours)
    best_official = max(off_shared, key=lambda v: v["SumR"])
    best_ours = max(ours_shared, key=lambda v: v["SumR"])
    gap = best_ours["SumR"] - best_official["SumR"]
    lines = [f"# Parity: {name}", "",
             f"Our {code(str(record.get('run_name')), in_table=False)} (seed {record.get('seed')}, commit "
             f"{str((record.get('provenance') or {}).get('git_revision', ''))[:7]}) against the official code's run"
             + (f" (seed {official['seed']}, from its log)" if official.get("seed") is not None else "")
             + f" on the same exported data, validation SumR per epoch. Written by `prvr-bench parity` "
             f"(harness/cli/parity.py) from the official log {code(log_name, in_table=False)} and our run record.", ""]
    if note:
        lines += [note, ""]
    started = started_from(record)
    if started is not None:  # train.init_weights: one start for both sides (docs/parity.md, "From one start")
        lines += [f"Ours started from the given weights {code(started['file'], in_table=False)} (sha256 "
                  f"{started['sha256'][:12]}), not from its seeded init.", ""]
    lines += ["Ours: " + code(shown_command(str(record.get("command", ""))), in_table=False), ""]
    header = ["epoch", "official val SumR", "ours val SumR", "Δ (ours − official)"]
    if has_parts:
        header += [f"official {p}" for p in PARTS]
    if has_vcmr:
        header += ["official val VCMR SumR", "ours val VCMR SumR", "Δ VCMR"]
    rows = []
    for e in epochs:
        off = by_epoch.get(e, {}).get("SumR")
        our = ours_by_epoch.get(e)
        cells = [str(e), _num(off), _num(our), _num(_delta(our, off), sign=True)]
        if has_parts:
            cells += [_num(by_epoch.get(e, {}).get("parts", {}).get(p)) for p in PARTS]
        if has_vcmr:
            off_v, our_v = by_epoch.get(e, {}).get(VCMR), vcmr_by_epoch.get(e)
            cells += [_num(off_v), _num(our_v), _num(_delta(our_v, off_v), sign=True)]
        rows.append(cells)
    lines.append(markdown_table(header, rows))
    lines += ["",
              f"- Best validation SumR: official {best_official['SumR']:.1f} (epoch {best_official['epoch']}), ours "
              f"{best_ours['SumR']:.1f} (epoch {best_ours['epoch']}): Δ {gap:+.1f}, "
              f"{'within' if abs(gap) <= tolerance else 'outside'} the {tolerance:g} SumR tolerance."]
    if has_vcmr:
        lines.append(vcmr_line(off_shared, ours_shared, tolerance))
    if cut:
        lines.append(f"- {cut}")
    test = official.get("test")
    if test is not None or ours.get("test") is not None:
        off_test = test["SumR"] if test else None
        parts = ""
        if test and test["parts"]:
            shown = ", ".join(f"{p} {test['parts'][p]:.1f}" for p in PARTS if p in test["parts"])
            parts = f" (official parts: {shown})"
        lines.append(f"- Test SumR of each best checkpoint: official {_num(off_test, missing='not in the log')}, ours "
                     f"{_num(ours.get('test'), missing='not in the record')}"
                     + parts + ".")
    if has_vcmr and (test is not None or ours.get("test_vcmr") is not None):
        lines.append(f"- Test VCMR SumR of each best checkpoint: official "
                     f"{_num(test.get(VCMR) if test else None, missing='not given (--official-test)')}, ours "
                     f"{_num(ours.get('test_vcmr'), missing='not in the record')} (the official code picks its "
                     "best epoch by validation VCMR 0.5-R@1 + 0.7-R@1, ours by its protocol's selection metric).")
    if speed is not None:
        lines += ["", *speed_block(*speed)]
    return "\n".join(lines) + "\n"


def vcmr_line(official: list[dict], ours: list[dict], tolerance: float) -> str:
    """The best validation VCMR SumR of each side over the shared epochs, and whether they agree."""
    bests = best_vcmr(official, ours)
    if bests is None:
        return ("- Best validation VCMR SumR: not compared (our record's history holds no VCMR SumR: "
                "a backbone without span logits, or a run made before records kept it).")
    best_off, best_our = bests
    gap = best_our[VCMR] - best_off[VCMR]
    return (f"- Best validation VCMR SumR: official {best_off[VCMR]:.1f} (epoch {best_off['epoch']}), ours "
            f"{best_our[VCMR]:.1f} (epoch {best_our['epoch']}): Δ {gap:+.1f}, "
            f"{'within' if abs(gap) <= tolerance else 'outside'} the {tolerance:g} SumR tolerance.")


def best_vcmr(official: list[dict], ours: list[dict]) -> tuple[dict, dict] | None:
    """Each side's validation entry with the best VCMR SumR, or None where a side has none."""
    off = [v for v in official if VCMR in v]
    our = [v for v in ours if VCMR in v]
    if not off or not our:
        return None
    return max(off, key=lambda v: v[VCMR]), max(our, key=lambda v: v[VCMR])


def _delta(ours: float | None, official: float | None) -> float | None:
    return ours - official if ours is not None and official is not None else None


# ----------------------------------------------------------------------------- speed and memory


def official_speed(official: dict[str, Any], usage: Usage | None, test: Usage | None = None) -> SideSpeed:
    """The official side: `prvr-bench measure` around its command, per epoch of its log; with `test`
    (its test command measured the same way, `--official-test-usage`) that command's seconds are counted
    too and the peaks are the larger of the two."""
    epochs = len(official["val"])
    if usage is None:
        return {"epochs": epochs, "seconds_per_epoch": None, "eval_share": None, "peak_host_mb": None,
                "device_peak_mb": None, "device": "", "measured": "not measured (no --official-usage)"}
    wall, peak, device_peak = usage["wall_s"], usage["peak_rss_mb"], usage["device_peak_mb"]
    if test is None:
        tested = " (its test command, if it has one, not counted: no --official-test-usage)"
    else:
        wall = wall + test["wall_s"]
        peak, device_peak = _larger(peak, test["peak_rss_mb"]), _larger(device_peak, test["device_peak_mb"])
        test_peak = "not measured" if test["peak_rss_mb"] is None else f"{test['peak_rss_mb']:,.0f} MB"
        tested = (f", with its test command counted as ours counts its own test (--official-test-usage: "
                  f"{test['wall_s']:,.1f} wall s, peak host {test_peak})")
    return {"epochs": epochs, "seconds_per_epoch": _per(wall, epochs), "eval_share": None,
            "peak_host_mb": peak, "device_peak_mb": device_peak, "device": usage_device(usage),
            "measured": f"{measured_by(usage, f'{epochs} epochs in its log{tested}')}; evaluation share: not known "
                        "(the log keeps no seconds per phase)"}


def our_speed(record: RunRecord, usage: Usage | None) -> SideSpeed:
    """Our side: `prvr-bench measure` around our command where given, else the record's timings and
    resources; the evaluation share from the record's eval_* phases either way."""
    history = [h for h in record.get("history", []) if isinstance(h.get("val"), dict)]
    epochs = record.get("epochs_run", len(history)) or None
    timings = record.get("timings") or {}
    evaluating = sum(v for k, v in timings.items() if k.startswith("eval")) if any(
        k.startswith("eval") for k in timings) else None
    device = made_on(record)  # rows measured on different machines say so
    after = [k for k in AFTER_TRAINING if k in timings]
    tested = (f" (its phases after the last epoch, {', '.join(after)}, took {sum(timings[k] for k in after):,.1f} s "
              "of it)" if after else "")
    if usage is not None:
        return {"epochs": epochs, "seconds_per_epoch": _per(usage["wall_s"], epochs),
                "eval_share": _share(evaluating, usage["wall_s"]), "peak_host_mb": usage["peak_rss_mb"],
                "device_peak_mb": usage["device_peak_mb"], "device": device,
                "measured": f"{measured_by(usage, f'{epochs} epochs run{tested}')}; evaluation share: the record's "
                            "eval_* phases over that wall time"}
    total = sum(timings.values()) if timings else None
    resources = record.get("resources")
    how = (f"the run record: its timed phases ({', '.join(timings) or 'none'}) summed, per {epochs} epochs run, "
           f"the process start not counted{tested}; evaluation share: its eval_* phases over that sum")
    if resources is None:
        how += "; peak memory: not in the record (made before records kept it)"
    else:
        how += (f"; peak host memory: the record's resources ({resources['peak_rss_measure']}); device peak: "
                "torch.cuda.max_memory_allocated where CUDA trained (the allocator's peak: without the CUDA "
                "context and cache that nvidia-smi counts)")
    return {"epochs": epochs, "seconds_per_epoch": _per(total, epochs), "eval_share": _share(evaluating, total),
            "peak_host_mb": resources["peak_rss_mb"] if resources else None,
            "device_peak_mb": resources["device_peak_mb"] if resources else None, "device": device, "measured": how}


def measured_by(usage: Usage, per: str) -> str:
    """How `prvr-bench measure` measured a side, in words."""
    exit_note = "" if usage["exit_status"] == 0 else f" (the command exited with status {usage['exit_status']})"
    return (f"`prvr-bench measure` around the whole command{exit_note}: its wall seconds per {per}; peak host "
            f"memory: {usage['peak_rss_measure']}; device peak: {usage['device_measure']}")


def usage_device(usage: Usage) -> str:
    host = usage["host"]
    gpus = f"; GPUs: {', '.join(host['gpus'])}" if host["gpus"] else ""
    return f"{host['cpu']} ({host['cores']} cores){gpus}"


def _larger(a: float | None, b: float | None) -> float | None:
    """The larger of two peaks, either of which may be unmeasured (None)."""
    return b if a is None else a if b is None else max(a, b)


def _per(seconds: float | None, epochs: int | None) -> float | None:
    return round(seconds / epochs, 3) if seconds is not None and epochs else None


def _share(part: float | None, whole: float | None) -> float | None:
    return round(min(part / whole, 1.0), 3) if part is not None and whole else None


def speed_block(official: SideSpeed, ours: SideSpeed) -> list[str]:
    """The report's "Speed and memory" block: the figures side by side, then how each side was measured."""
    ratio = ratios(official, ours)
    rows = [["epochs", _cell(official["epochs"]), _cell(ours["epochs"]), ""],
            ["seconds per epoch", _num(official["seconds_per_epoch"], digits=2), _num(ours["seconds_per_epoch"], digits=2),
             _num(ratio["seconds_per_epoch"], digits=2)],
            ["evaluation share", _percent(official["eval_share"]), _percent(ours["eval_share"]), ""],
            ["peak host memory (MB)", _num(official["peak_host_mb"], digits=0), _num(ours["peak_host_mb"], digits=0),
             _num(ratio["peak_host_mb"], digits=2)],
            ["device peak (MB)", _num(official["device_peak_mb"], digits=0), _num(ours["device_peak_mb"], digits=0),
             _num(ratio["device_peak_mb"], digits=2)],
            ["device", official["device"], ours["device"], ""]]
    return ["## Speed and memory", "",
            markdown_table(["", "official", "ours", "official / ours"], rows), "",
            "How each figure was measured (docs/speed.md):", "",
            f"- Official: {official['measured']}.", f"- Ours: {ours['measured']}."]


def _cell(value: int | None) -> str:
    return "" if value is None else str(value)


def _percent(share: float | None) -> str:
    return "not known" if share is None else f"{100 * share:.0f}%"


def sidecar(name: str, report_file: str, ours: dict[str, Any], judged: SumRVerdict, speed: tuple[SideSpeed, SideSpeed],
            parity_command: str) -> ParitySidecar:
    """What results/parity/NAME.json holds (harness/reports/speed.py reads it back)."""
    record = ours["record"]
    official_side, our_side = speed
    side: ParitySidecar = {
        "parity_version": PARITY_VERSION, "name": name, "report": report_file, "command": parity_command,
        "method": str(record["method"]), "run": str(record.get("run_name", record["method"])),
        "dataset": dataset_label(record), "seed": int(record["seed"]), "sumr": judged,
        "official": official_side, "ours": our_side, "ratio": ratios(official_side, our_side)}
    started = started_from(record)
    if started is not None:  # both sides from one start: a pair
        side["started_from"] = started["sha256"]
    return side


def started_from(record: dict[str, Any]) -> dict[str, str] | None:
    """The weights our run started from (`provenance.init_weights`: file and sha256, as strings), or None
    for a run from its seeded init; the record is input, so a block of another shape counts as none."""
    started = (record.get("provenance") or {}).get("init_weights")
    if not isinstance(started, dict) or not all(isinstance(started.get(k), str) for k in ("file", "sha256")):
        return None
    return {"file": started["file"], "sha256": started["sha256"]}


def _num(x: float | None, sign: bool = False, missing: str = "", digits: int = 1) -> str:
    if x is None:
        return missing
    return f"{x:+,.{digits}f}" if sign else f"{x:,.{digits}f}"


def cmd_parity(args: argparse.Namespace) -> None:
    if not NAME.fullmatch(args.name):
        raise UserError(f"--name {args.name!r}: use letters, digits and _ . + @ ~ - (it names the report file)")
    official = read_official_log(args.official_log)
    if args.official_test:
        official["test"] = read_official_test(args.official_test, official)
    ours = our_run(args.record)
    official_usage = read_usage(args.official_usage, "--official-usage") if args.official_usage else None
    if args.official_test_usage and official_usage is None:
        raise UserError(f"--official-test-usage {args.official_test_usage}: it adds the official test command's "
                        "time to its training command's; give that one too (--official-usage USAGE.json)")
    official_test = read_usage(args.official_test_usage, "--official-test-usage") if args.official_test_usage else None
    ours_usage = read_usage(args.ours_usage, "--ours-usage") if args.ours_usage else None
    speed = official_speed(official, official_usage, official_test), our_speed(ours["record"], ours_usage)
    text = report(official, ours, args.name, args.note, Path(args.official_log).name, args.tolerance,
                  speed if official_usage is not None else None)
    out = ensure_dir(Path(args.out) / "parity") / f"{args.name}.md"
    side = sidecar(args.name, out.name, ours, verdict(official, ours, args.tolerance), speed,
                   shown_command(command_line()))
    write_texts({out: text, out.with_suffix(".json"): json.dumps(side, indent=2) + "\n"})
    print(f"wrote {out} and {out.with_suffix('.json').name}")


@command("parity", "our run against the official code's log")
def add_commands(sub) -> None:
    p = sub.add_parser("parity", help="our run against the official code's log on the same exported data "
                                      "(per-epoch validation SumR): OUT/parity/NAME.md")
    p.add_argument("--official-log", required=True, metavar="LOG",
                   help="log.txt of the official training script (MS-SL code family), with its test block if "
                        "run, or TVRetrieval's eval.log.txt (XML)")
    p.add_argument("--official-test", default=None, metavar="METRICS.json",
                   help="TVRetrieval only: the test metrics file its inference.py wrote for the best checkpoint "
                        "(the MS-SL family's log holds its own test block)")
    p.add_argument("--record", required=True, metavar="RECORD", help="our run record on the same exported data")
    p.add_argument("--name", required=True, help="report name, e.g. ral-gmmformer2_sim-tvr_e8")
    p.add_argument("--note", default="", help="what was run on the official side (commands, patches), in the report")
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help=f"SumR (default {TOLERANCE:g})")
    p.add_argument("--official-usage", default=None, metavar="USAGE.json",
                   help="the official command measured by `prvr-bench measure`: adds the report's speed and memory "
                        "block (seconds per epoch, peak memory, against ours)")
    p.add_argument("--official-test-usage", default=None, metavar="USAGE.json",
                   help="the official test command (its --eval or inference script) measured the same way: counted "
                        "on the official side, as our command counts its own test (needs --official-usage)")
    p.add_argument("--ours-usage", default=None, metavar="USAGE.json",
                   help="our command measured the same way (default: our record's timings and resources)")
    p.add_argument("--out", default="results", help="results folder (default: results)")
    p.set_defaults(func=cmd_parity)
