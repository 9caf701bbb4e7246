"""Run records: one JSON per run, the source of truth for every table.

Keys other tools read: method, dataset, seed, config, provenance, metrics.val,
metrics.test (R@1, R@5, R@10, R@100, SumR, buckets, oracle), and where a run measured it,
metrics.noise ({source, levels: {p: R@K and SumR}}: harness/reports/noise.py; optional, so records
without it load as they are), and resources (peak memory and seconds per epoch: the parity and speed
reports; optional too). Records from older schema versions are upgraded on load. Every key
a record holds, with its type: harness/engine/record_types.py (`RunRecord`).
"""

from __future__ import annotations

import functools
import math
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, cast

from prvr.harness.base.checks import show
from prvr.harness.base.io import UserError, read_json, write_json
from prvr.harness.base.names import check_name, inside, join_run_name
from prvr.harness.engine.record_types import Budget, CpuFacts, Provenance, RunProtocol, RunRecord
from prvr.harness.base.registry import DATASETS
from prvr.harness.engine.sections import SELECT_ON, SETTLED_BEFORE, TrainConfig, dataset_preset

SCHEMA_VERSION = 2
REQUIRED = ("method", "dataset", "seed", "config", "provenance", "metrics")
PACKAGES = ("prvr-bench", "torch", "numpy", "scipy", "pandas", "rich", "pyyaml", "h5py")


def run_tag(method: str, relations: str, default_relations: str, backbone: str, default_backbone: str,
            tag: str = "") -> str:
    """Folder / row name of a run: method, +detector and @backbone where not the default, ~tag."""
    return join_run_name(method, relations if relations != default_relations else "",
                         backbone if backbone != default_backbone else "", tag)


SELECTION = "val SumR"  # the default selection rule: the epoch with the best validation (VR) SumR


def selection_metric(select_on: str, localizes: bool = True) -> str:
    """The val metric key a run selects on (harness/engine/trainer.py): `train.select_on` "vcmr" is the
    VCMR SumR for a backbone that localizes, the VR SumR for one that does not."""
    return SELECT_ON["vcmr"] if select_on == "vcmr" and localizes else SELECT_ON["vr"]


def dataset_protocol(dataset: str) -> Budget:
    return _dataset_protocol(dataset).copy()  # a copy: callers may keep or change it


@functools.lru_cache(maxsize=None)
def _dataset_protocol(dataset: str) -> Budget:
    """The training budget every row of `dataset` follows: its preset's `train.epochs`,
    `train.patience` and `train.select_on` (dataclass defaults where the preset is silent), and
    the selection rule they make."""
    train = (dataset_preset(dataset).get("train") or {}) if dataset in DATASETS else {}
    select_on = str(train.get("select_on", TrainConfig.select_on))
    return {"epochs": int(train.get("epochs", TrainConfig.epochs)),
            "patience": int(train.get("patience", TrainConfig.patience)), "select_on": select_on,
            "selection": f"val {selection_metric(select_on)}"}


def selection_rule(config: dict[str, Any], selection: dict[str, Any] | None, select_on: str = "vr",
                   localizes: bool = True) -> str:
    """The selection rule with the split it used: the val figure (`selection_metric`) on the
    dataset's val, N held-out training videos (data.val_from_train), or a val split that holds
    the test queries (datasets/selection.py)."""
    rule = f"val {selection_metric(select_on, localizes)}"
    n = (config.get("data") or {}).get("val_from_train", 0) if isinstance(config, dict) else 0
    if n:
        return f"{rule} on {n} held-out train videos"
    if selection and selection.get("val_is_test"):
        return f"{rule} on val = test queries"
    return rule


def run_protocol(config: dict[str, Any], dataset: str, selection: dict[str, Any] | None = None,
                 localizes: bool = True) -> RunProtocol:
    """The budget a run was trained under (from its resolved config and, for the selection
    split, its data facts; `localizes`: whether its backbone gives moments to select on) and
    whether it is the dataset's protocol."""
    train = config.get("train", {}) if isinstance(config, dict) else {}
    select_on = train.get("select_on", SETTLED_BEFORE["train.select_on"])
    own: Budget = {"epochs": train.get("epochs"), "patience": train.get("patience"), "select_on": select_on,
           "selection": selection_rule(config, selection, select_on, localizes)}
    # the matrix-product precision (train.precision), named where it is not the fp32 of the committed runs
    precision = train.get("precision", SETTLED_BEFORE["train.precision"])
    if precision != SETTLED_BEFORE["train.precision"]:
        own["precision"] = precision
    if train.get("init_weights"):  # started from given weights: not the dataset's protocol, whatever the budget
        own["init"] = "given weights"
    expected = dataset_protocol(dataset)
    # A val split that holds the test queries still follows the budget; the rule says so, and
    # the label keeps such rows apart from rows selected on held-out data.
    follows = all(own[k] == expected[k] for k in ("epochs", "patience", "select_on")) and "init" not in own
    return {**own, "dataset_protocol": expected, "follows_protocol": follows}


def budget_label(protocol: Mapping[str, Any]) -> str:
    label = f"{protocol['epochs']} ep / stop {protocol['patience']}"
    if "precision" in protocol:
        label += f", {protocol['precision']}"
    if "init" in protocol:
        label += f", from {protocol['init']}"
    rule = protocol.get("selection", SELECTION)
    return label if rule == SELECTION else f"{label}, {rule.removeprefix(SELECTION + ' ')}"


def record_path(out: str | Path, dataset: str, run_name: str, seed: int) -> Path:
    """<out>/runs/<dataset>/<run>/seed<S>.json"""
    return _run_path(out, "runs", dataset, run_name, seed, ".json")


def checkpoint_dir(out: str | Path, dataset: str, run_name: str, seed: int) -> Path:
    """<out>/checkpoints/<dataset>/<run>/seed<S>/ (last.pt, best.pt)"""
    return _run_path(out, "checkpoints", dataset, run_name, seed, "")


def log_path(out: str | Path, dataset: str, run_name: str, seed: int) -> Path:
    """<out>/logs/<dataset>/<run>/seed<S>.log (bench --jobs)"""
    return _run_path(out, "logs", dataset, run_name, seed, ".log")


def _run_path(out: str | Path, kind: str, dataset: str, run_name: str, seed: int, suffix: str) -> Path:
    """The one place a run's files are named: each name checked (harness/base/names.py), the path
    checked to lie under `out`."""
    check_name(dataset, "dataset name", "pick a registered dataset")
    check_name(run_name, "run name", "use a shorter --tag of letters and digits")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UserError(f"seed {seed!r} is not a whole number >= 0; pass --seed N")
    return inside(Path(out) / kind / dataset / run_name / f"seed{seed}{suffix}", out, f"{kind} path")


RECORD_FILE = re.compile(r"seed(\d+)\.json")


def record_layout(path: str | Path) -> tuple[Path, str, str, int]:
    """(out, dataset, run name, seed) of a record at <out>/runs/<dataset>/<run>/seed<S>.json,
    read from its path, never from its contents; anywhere else is a one-line error."""
    path = Path(path)
    match = RECORD_FILE.fullmatch(path.name)
    parts = path.parts
    if not match or len(parts) < 4 or parts[-4] != "runs":
        raise UserError(f"run record {path} is not at <out>/runs/<dataset>/<run>/seed<S>.json, where "
                        "`prvr-bench run` writes it, so its checkpoint cannot be found; pass the record where it was written")
    out, dataset, run = path.parents[3], parts[-3], parts[-2]
    check_name(dataset, f"run record {path}: dataset folder", "move the record back where it was written")
    check_name(run, f"run record {path}: run folder", "move the record back where it was written")
    return out, dataset, run, int(match.group(1))


def provenance(device: str) -> Provenance:
    return {
        "git_revision": _git("rev-parse", "HEAD"),
        # the code, not the results: a record written into a checkout's results/ does not make
        # the next run there "dirty"
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ":(top)", ":(top,exclude)results")),
        "packages": {p: _version(p) for p in PACKAGES},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_facts(),
        "device": device,
        "created": provenance_time(),
    }


def provenance_time() -> str:
    """Now, as records write it (UTC, to the second)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def cpu_facts(cpuinfo: str | Path = "/proc/cpuinfo") -> CpuFacts:
    """The processor a run was made on: its model (name, family and model numbers, from
    `cpuinfo` where the system has one) and the vector instructions torch's kernels use. A run
    retrained on another machine agreed with its record to about 1e-6 in the first losses, not
    to the last digit of the final metrics (docs/records.md, "Retraining a record"); these facts
    are what tells such machines apart."""
    import torch

    facts: CpuFacts = {"machine": platform.machine(), "capability": str(torch.backends.cpu.get_cpu_capability())}
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return facts
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name", "")
    if fields.get("cpu family") and fields.get("model"):
        model = f"{model} (family {fields['cpu family']}, model {fields['model']})".strip()
    if model:
        facts["model"] = model
    return facts


def _device_and_model(record: Any) -> tuple[str, str]:
    """A record's device and, where it ran on a CPU and names it, the processor's model ("" otherwise)."""
    provenance = record.get("provenance") or {}
    device = str(provenance.get("device", ""))
    model = str((provenance.get("cpu") or {}).get("model") or "")
    return device, model if device.startswith("cpu") else ""


def made_on(record: Any) -> str:
    """Where a record's run was made, as its provenance says: the device, and on a CPU the processor's
    model (`cpu_facts`), the figure a run's last digits depend on beside the commit."""
    device, model = _device_and_model(record)
    return f"{device}, {model}" if model else device


def machine_of(record: Any) -> str:
    """Where a record was made, in a word or two: on a CPU the processor's model, else its device."""
    device, model = _device_and_model(record)
    return model or device


def drift_note(run: str, mine: Mapping[int, str], base: str, theirs: Mapping[int, str]) -> str:
    """A note where some seed of `run` was made on another machine (`machine_of`, by seed) than the same seed of
    its `base`: another processor rounds differently and training carries it into the figures (docs/records.md,
    "Retraining a record"), so a gain between them holds that drift as well as the run's change; "" where
    every shared seed agrees, or names no machine on one side (a record older than `provenance.cpu`)."""
    if all(mine[s] == theirs[s] for s in mine.keys() & theirs.keys() if mine[s] and theirs[s]):
        return ""
    count = len({m for side in (mine, theirs) for m in side.values() if m})  # each machine once, on either side
    return (f"made on {_WORDS.get(count, str(count))} machines ({run} on {_named(mine)}; {base} on {_named(theirs)}): "
            "the gain holds their drift")


_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}


def drift_heading(note: str) -> str:
    """A `drift_note`'s opening words ("made on two machines"), for a place that lists the machines elsewhere."""
    return note.partition(" (")[0]


def _named(machines: Mapping[int, str]) -> str:
    return " and ".join(dict.fromkeys(m for m in machines.values() if m)) or "a machine its records do not name"


def _git(*args: str) -> str:
    here = Path(__file__).resolve().parent
    try:
        # --no-optional-locks: reading the state takes no lock on the index, so a run never blocks
        # (or is blocked by) a git command of the user's in the same checkout
        out = subprocess.run(["git", "--no-optional-locks", *args], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def write_record(path: str | Path, record: RunRecord) -> None:
    stored: RunRecord = {"schema_version": SCHEMA_VERSION, **record}
    write_json(path, stored)


def load_record(path: str | Path) -> RunRecord:
    """Read a record, upgrading older schema versions, and check the keys tools rely on."""
    data = read_json(path, what="run record")
    if not isinstance(data, dict):
        raise UserError(f"run record {path} holds {type(data).__name__}, expected an object; delete or fix it")
    version = data.get("schema_version", 1)
    if not _is(version, int) or version > SCHEMA_VERSION:
        raise UserError(f"run record {path} key 'schema_version': {version!r} is not a schema this prvr-bench reads "
                        f"(1 to {SCHEMA_VERSION}); update prvr-bench, or delete the record")
    data = upgrade(data)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise UserError(f"run record {path} lacks key(s) {', '.join(missing)}; delete it or re-run that run")
    problem = shape_problem(data) or value_problem(data)
    if problem:
        key, what = problem
        raise UserError(f"run record {path} key {key!r}: {what}; delete it or re-run that run")
    # the cast: the checks above hold the keys RunRecord requires and the types of those tools read
    return cast(RunRecord, data)


def load_record_at(path: str | Path) -> RunRecord:
    """`load_record` of a record at its place in a results folder (<out>/runs/<dataset>/<run>/
    seed<S>.json), which must name the dataset, run and seed of that place: a record copied
    under another seed, or into another run's folder, is an error, not a second seed."""
    _, dataset, run, seed = record_layout(path)
    record = load_record(path)
    stored = (record["dataset"], record.get("run_name", run), record["seed"])
    if stored != (dataset, run, seed):
        raise UserError(f"run record {path} names dataset, run and seed {', '.join(show(v) for v in stored)}, but "
                        f"its folder says {dataset}, {run}, {seed}; move it back to the folder of its run or re-run "
                        "that run")
    method = re.split(r"[+@~]", run, maxsplit=1)[0]  # a run's folder starts with its method: ral@msl~k0
    if record["method"] != method:
        raise UserError(f"run record {path} is of method {show(record['method'])}, but its folder {run} is a run of "
                        f"{method}; move it back to the folder of its run or re-run that run")
    return record


# What a metric may be (a figure outside is a damaged or edited record, not a result)
METRIC_RANGES = {"R@1": (0, 100), "R@5": (0, 100), "R@10": (0, 100), "R@100": (0, 100), "SumR": (0, 400),
                 "median_rank": (1, math.inf), "mean_rank": (1, math.inf), "n": (0, math.inf)}


RECALL_KEYS = ("R@1", "R@5", "R@10", "R@100")  # SumR is their sum


def value_problem(record: dict[str, Any]) -> tuple[str, str] | None:
    """The first value no run can have (a metric not finite or outside its range, a negative
    seed, a best epoch after the last one run), with what is wrong; None when all can be."""
    if record["seed"] < 0:
        return "seed", f"{record['seed']} is negative"
    blocks = [(f"metrics.{s}", record["metrics"][s]) for s in ("val", "test")]
    blocks += [(f"metrics.noise.levels.{k}", b) for k, b in ((record["metrics"].get("noise") or {}).get("levels") or
                                                             {}).items()]
    for where, block in blocks:
        for name, (low, high) in METRIC_RANGES.items():
            value = block.get(name)
            if value is not None and not (math.isfinite(value) and low <= value <= high):
                return f"{where}.{name}", f"{value!r} is not a figure a run can have (finite, in [{low}, {high}])"
        recalls = [v for v in (block.get(k) for k in RECALL_KEYS) if isinstance(v, (int, float))]
        total = block.get("SumR")
        if isinstance(total, (int, float)) and len(recalls) == len(RECALL_KEYS) \
                and not math.isclose(total, sum(recalls), abs_tol=1e-6):
            return f"{where}.SumR", f"{total!r} is not the sum of its R@1, R@5, R@10, R@100 ({sum(recalls):.4f})"
    best, run = record.get("best_epoch"), record.get("epochs_run")
    if isinstance(best, int) and isinstance(run, int) and not -1 <= best < max(run, 1):
        return "best_epoch", f"{best} is not among the {run} epochs the record says were run"
    if "resources" in record:
        resources = [k for k, kind in RESOURCES_SHAPE if _kinds(kind)[0] in (float, int)]
        return figure_problem(record, resources)
    return None


# A JSON type as the shape checks name it: str, int, float (an integer is a number too), dict, list, or
# NULL (JSON null); a tuple of them is any of them.
NULL = type(None)
Kind = type | tuple[type, ...]

# What tools read from a record, and its type: (key, types). Optional keys are checked when present.
SHAPE = (("method", str), ("dataset", str), ("seed", int), ("config", dict), ("provenance", dict),
         ("metrics", dict), ("metrics.val", dict), ("metrics.test", dict))
OPTIONAL = (("run_name", str), ("backbone", str), ("relations", str), ("tag", str), ("command", str),
            ("timings", dict), ("best_epoch", int), ("epochs_run", int), ("history", list), ("protocol", dict),
            ("provenance.data", dict), ("metrics.noise", dict), ("resources", dict))
NOISE_SHAPE = (("metrics.noise.source", str), ("metrics.noise.levels", dict))  # when metrics.noise is there
# when `resources` is there (record_types.RunResources): every key, a figure null where not measured
RESOURCES_SHAPE: tuple[tuple[str, Kind], ...] = (
    ("resources.peak_rss_mb", (float, NULL)), ("resources.peak_rss_measure", str),
    ("resources.device_peak_mb", (float, NULL)), ("resources.device_reserved_mb", (float, NULL)),
    ("resources.seconds_per_epoch", (float, NULL)), ("resources.epochs_timed", int))
METRIC_NUMBERS = ("R@1", "R@5", "R@10", "R@100", "SumR", "median_rank", "mean_rank", "n")
TYPE_NAMES = {str: "a string", int: "an integer", dict: "an object", list: "a list", float: "a number",
              NULL: "null"}


def shape_problem(record: dict[str, Any]) -> tuple[str, str] | None:
    """The first key whose value tools cannot read, with what is wrong: None when the record's
    shape is sound (values are not judged: a metric may be any number)."""
    for key, kind in (*SHAPE, *((k, t) for k, t in OPTIONAL if _lookup(record, k) is not _ABSENT)):
        value = _lookup(record, key)
        if not _is(value, kind):
            return key, f"{_describe(value)}, expected {TYPE_NAMES[kind]}"
    for split in ("val", "test"):
        block = record["metrics"][split]
        for name in METRIC_NUMBERS:
            if name in block and not _is(block[name], float):
                return f"metrics.{split}.{name}", f"{_describe(block[name])}, expected {TYPE_NAMES[float]}"
        for name in ("buckets", "oracle"):
            if name in block and not _is(block[name], dict):
                return f"metrics.{split}.{name}", f"{_describe(block[name])}, expected {TYPE_NAMES[dict]}"
        for bucket, inner in (block.get("buckets") or {}).items():
            if not _is(inner, dict):
                return f"metrics.{split}.buckets.{bucket}", f"{_describe(inner)}, expected {TYPE_NAMES[dict]}"
    if "noise" in record["metrics"]:
        for key, kind in NOISE_SHAPE:
            if not _is(_lookup(record, key), kind):
                return key, f"{_describe(_lookup(record, key))}, expected {TYPE_NAMES[kind]}"
    for level, block in (record["metrics"].get("noise") or {}).get("levels", {}).items():
        if not _is(block, dict):
            return f"metrics.noise.levels.{level}", f"{_describe(block)}, expected {TYPE_NAMES[dict]}"
        for name in METRIC_NUMBERS:
            if name in block and not _is(block[name], float):
                return f"metrics.noise.levels.{level}.{name}", f"{_describe(block[name])}, expected {TYPE_NAMES[float]}"
    timings = record.get("timings") or {}
    for phase, seconds in timings.items():
        if not _is(seconds, float):
            return f"timings.{phase}", f"{_describe(seconds)}, expected {TYPE_NAMES[float]}"
    if "resources" in record:
        return field_problem(record, RESOURCES_SHAPE)
    return None


def field_problem(data: Mapping[str, Any], fields: Iterable[tuple[str, Kind]],
                  optional: bool = False) -> tuple[str, str] | None:
    """The first of `fields` ((dotted key, JSON type)) that `data` lacks or holds with another type, with
    what is wrong; None when all are sound. With `optional`, an absent key is sound. The one shape check
    of the files the suite reads as untrusted JSON: records, and the usage and speed files
    (harness/cli/measure.py, harness/reports/speed.py)."""
    for key, kind in fields:
        value = _lookup(data, key)
        if value is _ABSENT and optional:
            continue
        if not _is_any(value, kind):
            return key, f"{_describe(value)}, expected {' or '.join(_type_name(k) for k in _kinds(kind))}"
    return None


def figure_problem(data: Mapping[str, Any], keys: Iterable[str], high: float = math.inf) -> tuple[str, str] | None:
    """The first number at one of `keys` (dotted; null and absent keys pass) that is not finite and in
    [0, high], with what is wrong: a measured size or duration cannot be negative, NaN or infinite."""
    for key in keys:
        value = _lookup(data, key)
        if _is(value, float) and not (math.isfinite(value) and 0 <= value <= high):
            return key, f"{value!r} is not a figure a measurement can have (finite, in [0, {high:g}])"
    return None


def _kinds(kind: Kind) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _is_any(value: Any, kind: Kind) -> bool:
    return any(value is None if k is NULL else _is(value, k) for k in _kinds(kind))


def _type_name(kind: type) -> str:
    return TYPE_NAMES.get(kind, kind.__name__)


_ABSENT = object()


def _lookup(record: Mapping[str, Any], key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def _is(value: Any, kind: type) -> bool:
    """JSON types: an integer is a number, a bool is neither."""
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _describe(value: Any) -> str:
    if value is _ABSENT:
        return "missing"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any earlier schema to the current one."""
    version = data.get("schema_version", 1)
    if version == 1:
        # v1 stored metrics as `val_metrics` / `test_metrics` and had no run name or timings.
        metrics = data.pop("metrics", None) or {}
        if not isinstance(metrics, dict):
            data["metrics"] = metrics
            return data
        metrics.setdefault("val", data.pop("val_metrics", {}))
        metrics.setdefault("test", data.pop("test_metrics", {}))
        for block in metrics.values():
            if isinstance(block, dict):  # anything else is reported by load_record's shape check
                block.setdefault("buckets", {})
                block.setdefault("oracle", {})
        data["metrics"] = metrics
        cfg = found if isinstance(found := data.get("config"), dict) else {}
        relations = found if isinstance(found := cfg.get("relations"), dict) else {}
        data.setdefault("backbone", cfg.get("backbone", ""))
        data.setdefault("relations", relations.get("name", "none"))
        data.setdefault("run_name", data.get("method", "?"))
        data.setdefault("timings", {})
        version = 2
    data["schema_version"] = version
    return data
