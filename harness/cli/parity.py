"""`prvr-bench parity`: our run against the official code's run on the same exported data.

A re-implemented method must match its official code on the same data. The workflow
(docs/parity.md): export a simulated dataset in the public layout (`prvr-bench data export`),
train the official code on it outside this repository and ours on the export through the real
loaders (`prvr-bench run --dataset tvr --data-root DIR`) under the same budget, then

    prvr-bench parity --official-log LOG --record OUT/runs/tvr/<run>/seed<S>.json --name NAME

reads the validation SumR of every epoch from both and writes `results/parity/NAME.md`: the two
curves side by side, the best validation SumR of each, the test SumR of each best checkpoint
(where the official log has its `--eval` block) and whether they agree within the tolerance.

The official log is read as text, line by line, with regular expressions (nothing in it is
evaluated). It is the log of the MS-SL code family (ms-sl, GMMFormer, GMMFormer v2,
RAL-PRVR): one block per epoch with `Epoch: N` and `Rsum: X`, after a `Testing from:` line the
test block; per-branch recall sums where the code logs them (` * recall sum: X`, three per
evaluation: clip, frame, fused, as RAL-PRVR logs them; or ` * clip_scale ... rsum: X` lines).
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any

from prvr.harness.cli.args import command
from prvr.harness.base.io import MAX_TEXT_BYTES, UserError, ensure_dir, read_text, write_text
from prvr.harness.engine.records import load_record_at
from prvr.harness.reports.table import code, markdown_table

TOLERANCE = 2.0  # SumR: the suite's rule for a faithful re-implementation

_EPOCH = re.compile(r"Epoch:\s*(\d+)\b")
_RSUM = re.compile(r"\bRsum:\s*([-\d.]+)")
_RECALL_SUM = re.compile(r"\* recall sum:\s*([-\d.]+)")
_NAMED_PART = re.compile(r"\* (clip|frame|combined)\w*\b.*\brsum:\s*([-\d.]+)")
_SEED = re.compile(r"\bset seed:\s*(-?\d+)")
PARTS = ("clip", "frame", "fused")


def read_official_log(path: str | Path) -> dict[str, Any]:
    """{'val': [{'epoch', 'SumR', 'parts'}...], 'test': {'SumR', 'parts'} | None, 'seed': int | None}
    from an MS-SL family log. The branch sums logged just before an epoch's (or the test's) block
    are its parts; the seed is the training script's `set seed: N` line, where it logs one."""
    path = Path(path)
    try:
        lines = read_text(path, "official log", "pass the log.txt the official training script wrote").splitlines()
    except UserError as err:
        if "not UTF-8" not in str(err):
            raise
        with open(path, "rb") as f:  # a log with stray bytes (a killed write) is still read, bounded
            lines = f.read(MAX_TEXT_BYTES).decode("utf-8", errors="replace").splitlines()

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


def our_run(record_file: str | Path) -> dict[str, Any]:
    record = load_record_at(record_file)
    val = [{"epoch": int(h["epoch"]), "SumR": float(h["val"]["SumR"])}
           for h in record.get("history", []) if isinstance(h.get("val"), dict) and "SumR" in h["val"]]
    if not val:
        raise UserError(f"run record {record_file} has no validation SumR in its history; re-run that run")
    test = (record.get("metrics") or {}).get("test") or {}
    return {"val": val, "test": test.get("SumR"), "record": record}


def shown_command(command: str) -> str:
    """The record's command with absolute paths (the export and the output folder of this
    machine) replaced by placeholders."""
    words = shlex.split(command)
    names = {"--data-root": "EXPORT_DIR", "--out": "OUT"}
    shown = []
    for i, word in enumerate(words):
        previous = words[i - 1] if i else ""
        if previous in names and Path(word).is_absolute():
            word = names[previous]
        elif Path(word).is_absolute():
            word = Path(word).name
        shown.append(word)
    return shlex.join(shown)


def report(official: dict[str, Any], ours: dict[str, Any], name: str, note: str, log_name: str,
           tolerance: float = TOLERANCE) -> str:
    record = ours["record"]
    by_epoch = {v["epoch"]: v for v in official["val"]}
    ours_by_epoch = {v["epoch"]: v["SumR"] for v in ours["val"]}
    epochs = sorted(set(by_epoch) | set(ours_by_epoch))
    has_parts = any(v["parts"] for v in official["val"])
    best_official = max(official["val"], key=lambda v: v["SumR"])
    best_ours = max(ours["val"], key=lambda v: v["SumR"])
    gap = best_ours["SumR"] - best_official["SumR"]
    lines = [f"# Parity: {name}", "",
             f"Our {code(str(record.get('run_name')), in_table=False)} (seed {record.get('seed')}, commit "
             f"{str((record.get('provenance') or {}).get('git_revision', ''))[:7]}) against the official code's run"
             + (f" (seed {official['seed']}, from its log)" if official.get("seed") is not None else "")
             + f" on the same exported data, validation SumR per epoch. Written by `prvr-bench parity` "
             f"(harness/cli/parity.py) from the official log {code(log_name, in_table=False)} and our run record.", ""]
    if note:
        lines += [note, ""]
    lines += ["Ours: " + code(shown_command(str(record.get("command", ""))), in_table=False), ""]
    header = ["epoch", "official val SumR", "ours val SumR", "Δ (ours − official)"]
    if has_parts:
        header += [f"official {p}" for p in PARTS]
    rows = []
    for e in epochs:
        off = by_epoch.get(e, {}).get("SumR")
        our = ours_by_epoch.get(e)
        delta = our - off if off is not None and our is not None else None
        cells = [str(e), _num(off), _num(our), _num(delta, sign=True)]
        if has_parts:
            cells += [_num(by_epoch.get(e, {}).get("parts", {}).get(p)) for p in PARTS]
        rows.append(cells)
    lines.append(markdown_table(header, rows))
    lines += ["",
              f"- Best validation SumR: official {best_official['SumR']:.1f} (epoch {best_official['epoch']}), ours "
              f"{best_ours['SumR']:.1f} (epoch {best_ours['epoch']}): Δ {gap:+.1f}, "
              f"{'within' if abs(gap) <= tolerance else 'outside'} the {tolerance:g} SumR tolerance."]
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
    return "\n".join(lines) + "\n"


def _num(x: float | None, sign: bool = False, missing: str = "") -> str:
    if x is None:
        return missing
    return f"{x:+.1f}" if sign else f"{x:.1f}"


def cmd_parity(args: argparse.Namespace) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+@~-]*", args.name):
        raise UserError(f"--name {args.name!r}: use letters, digits and _ . + @ ~ - (it names the report file)")
    official = read_official_log(args.official_log)
    ours = our_run(args.record)
    text = report(official, ours, args.name, args.note, Path(args.official_log).name, args.tolerance)
    out = ensure_dir(Path(args.out) / "parity") / f"{args.name}.md"
    write_text(out, text)
    print(f"wrote {out}")


@command("parity", "our run against the official code's log")
def add_commands(sub) -> None:
    p = sub.add_parser("parity", help="our run against the official code's log on the same exported data "
                                      "(per-epoch validation SumR): OUT/parity/NAME.md")
    p.add_argument("--official-log", required=True, metavar="LOG",
                   help="log.txt of the official training script (MS-SL code family), with its test block if run")
    p.add_argument("--record", required=True, metavar="RECORD", help="our run record on the same exported data")
    p.add_argument("--name", required=True, help="report name, e.g. ral-gmmformer2_sim-tvr_e8")
    p.add_argument("--note", default="", help="what was run on the official side (commands, patches), in the report")
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help=f"SumR (default {TOLERANCE:g})")
    p.add_argument("--out", default="results", help="results folder (default: results)")
    p.set_defaults(func=cmd_parity)
