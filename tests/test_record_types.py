"""The run record's types describe the records (issue 37, harness/engine/record_types.py): every
committed record holds only keys its types declare and every key they require; a record written
from a `RunRecord` reads back equal and is the JSON it always was; a run returns a record of its
type."""

import json
import types
import typing
from pathlib import Path

import pytest

from prvr.harness.engine.config import resolve
from prvr.harness.engine.record_types import (MOMENT_METRIC_PREFIXES, SPLIT_METRIC_KEYS, Recalls, RunRecord,
                                       SplitMetrics)
from prvr.harness.engine.records import (OPTIONAL, RECORD_FILE, REQUIRED, SCHEMA_VERSION, SHAPE, load_record, record_path,
                                  write_record)
from prvr.harness.engine.robustness import SUMMARY
from prvr.harness.engine.runner import run_one

RESULTS = Path(__file__).resolve().parents[1] / "results"
# Keys a run writes only when something happened (a non-finite loss, a degenerate run, a resume);
# schema_version is written by write_record, not returned by the run.
EVENTS = {"nonfinite", "degenerate", "resumes", "schema_version"}


def committed_records() -> list[Path]:
    """Every committed run record, results/runs/<dataset>/<run>/seed<S>.json (not the
    seed<S>.<what>.json figures beside them)."""
    return sorted(p for p in (RESULTS / "runs").glob("*/*/seed*.json") if RECORD_FILE.fullmatch(p.name))


def undeclared(value: object, kind: object, where: str) -> list[str]:
    """Where `value` strays from `kind`, a TypedDict or a list / str-keyed dict / union of ones:
    "where.key: undeclared" for a key it does not declare (a moment figure counts where it declares
    moment figures: other tIoUs add keys by the same names), "where.key: missing" for a required
    key absent; nested blocks are followed. Values are the loader's to judge (records.shape_problem)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in undeclared(v, args[0], f"{where}[{i}]")]
    if origin is dict and isinstance(value, dict):
        return [p for k, v in value.items() for p in undeclared(v, args[1], f"{where}.{k}")]
    if origin in (typing.Union, types.UnionType):
        return min((undeclared(value, a, where) for a in args), key=len)
    if not (typing.is_typeddict(kind) and isinstance(value, dict)):
        return []
    hints = typing.get_type_hints(kind)
    moments = any(k.startswith(MOMENT_METRIC_PREFIXES) for k in hints)
    out = [f"{where}.{k}: missing" for k in sorted(kind.__required_keys__ - set(value))]
    for k, v in value.items():
        if k in hints:
            out += undeclared(v, hints[k], f"{where}.{k}")
        elif not (moments and k.startswith(MOMENT_METRIC_PREFIXES)):
            out.append(f"{where}.{k}: undeclared")
    return out


def test_the_types_require_what_loading_checks():
    """A record `load_record` accepts holds every key RunRecord requires (what justifies its
    cast), and every key the loader checks is declared."""
    assert RunRecord.__required_keys__ == set(REQUIRED)
    assert {key.split(".")[0] for key, _ in (*SHAPE, *OPTIONAL)} <= set(RunRecord.__annotations__)
    assert SPLIT_METRIC_KEYS == ("R@1", "R@5", "R@10", "R@100", "SumR", "median_rank", "mean_rank", "n", "buckets",
                                 "oracle")
    assert SUMMARY == tuple(Recalls.__annotations__) == ("R@1", "R@5", "R@10", "R@100", "SumR")


def test_the_check_finds_a_stray_or_missing_key():
    record = {"method": "m", "dataset": "d", "config": {}, "provenance": {"data": {"name": "d", "extra": 1}},
              "metrics": {"val": {"SVMR-0.3 R@1": 1.0}, "test": {"oracle": {"R@1": 1.0, "R@2": 2.0}}},
              "history": [{"epoch": 0, "any_loss_part": 1.0}], "scratch": 1}
    assert sorted(undeclared(record, RunRecord, "r")) == ["r.metrics.test.oracle.R@2: undeclared",
                                                          "r.provenance.data.extra: undeclared",
                                                          "r.scratch: undeclared", "r.seed: missing"]


def test_every_committed_record_is_described_by_its_types_and_rewritten_is_its_own_bytes(tmp_path):
    """Each committed record loads, holds only declared keys (nested blocks too), and written
    again from what was loaded is the same file, byte for byte."""
    paths = committed_records()
    assert len(paths) > 100
    problems = []
    for i, path in enumerate(paths):
        record = load_record(path)
        problems += undeclared(record, RunRecord, str(path.relative_to(RESULTS)))
        for entry in record.get("history", []):  # an epoch's val figures are a split's
            problems += [f"{path}: history val {k}" for k in entry.get("val", {})
                         if k not in SplitMetrics.__annotations__ and not k.startswith(MOMENT_METRIC_PREFIXES)]
        copy = tmp_path / f"{i}.json"
        write_record(copy, record)
        if copy.read_bytes() != path.read_bytes():
            problems.append(f"{path}: written again, its bytes differ")
    assert problems == []


def test_a_written_record_reads_back_equal_and_is_todays_json(tmp_path):
    split: SplitMetrics = {"R@1": 10.0, "R@5": 30.0, "R@10": 40.0, "R@100": 90.0, "SumR": 170.0,
                           "median_rank": 12.0, "mean_rank": 20.5, "n": 40,
                           "buckets": {"short": {"R@1": 5.0, "SumR": 150.0, "n": 10}}, "oracle": {"SumR": 180.0},
                           "VCMR-0.5 R@1": 2.5, "VCMR SumR": 12.0}
    record: RunRecord = {"method": "baseline", "dataset": "sim-x", "seed": 3, "run_name": "baseline", "tag": "",
                         "config": {"train": {"epochs": 12, "patience": 5}}, "provenance": {"device": "cpu"},
                         "timings": {"train": 1.25}, "best_epoch": 0, "epochs_run": 1,
                         "metrics": {"val": split, "test": {**split, "R@1": 11.0, "SumR": 171.0},
                                     "noise": {"source": "other", "levels": {"0.0": {"SumR": 171.0}}}},
                         "history": [{"epoch": 0, "loss": 1.5, "lr": 1e-4, "val": {"SumR": 170.0}}],
                         "artifacts": [], "rankings": {"file": "seed3.rank.npz", "top_k": 100, "splits": ["val"]}}
    path = record_path(tmp_path, "sim-x", "baseline", 3)
    write_record(path, record)
    stored = {"schema_version": SCHEMA_VERSION, **record}
    assert path.read_text(encoding="utf-8") == json.dumps(stored, indent=2) + "\n"
    assert load_record(path) == stored
    assert undeclared(stored, RunRecord, "record") == []


def test_a_run_returns_a_record_of_its_type(tmp_path):
    """A sim-tiny epoch of XML (which localizes, so its blocks hold moment figures) with a noise
    curve: the record it returns and the one it writes hold only keys their type declares, and
    every key a run always writes."""
    cfg = resolve("xml", "sim-tiny", 0, ["train.epochs=1", "eval.noise_levels=[0.5]"])
    record = run_one(cfg, tmp_path, command="prvr-bench run")
    assert undeclared(record, RunRecord, "record") == []
    assert set(RunRecord.__annotations__) - set(record) <= EVENTS
    assert "VCMR SumR" in record["metrics"]["test"] and "noise" in record["metrics"]
    stored = load_record(record_path(tmp_path, "sim-tiny", record["run_name"], 0))
    assert undeclared(stored, RunRecord, "stored") == [] and list(stored) == ["schema_version", *record]
