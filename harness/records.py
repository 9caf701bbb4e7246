"""Run records: one JSON per run, the source of truth for every table.

Keys other tools read: method, dataset, seed, config, provenance, metrics.val,
metrics.test (R@1, R@5, R@10, R@100, SumR, buckets, oracle). Records from older schema
versions are upgraded on load.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from prvr.harness.io import UserError, read_json, write_json

SCHEMA_VERSION = 2
REQUIRED = ("method", "dataset", "seed", "config", "provenance", "metrics")
PACKAGES = ("prvr-bench", "torch", "numpy", "scipy", "pandas", "rich", "pyyaml", "h5py")


def run_tag(method: str, relations: str, default_relations: str, backbone: str, default_backbone: str,
            tag: str = "") -> str:
    """Folder / row name of a run: method, +detector and @backbone where not the default, ~tag."""
    name = method
    if relations != default_relations:
        name += f"+{relations}"
    if backbone != default_backbone:
        name += f"@{backbone}"
    if tag:
        name += f"~{tag}"
    return name


SELECTION = "val SumR"  # the model-selection rule of every run: the epoch with the best validation SumR


def dataset_protocol(dataset: str) -> dict[str, Any]:
    """The training budget every row of `dataset` follows: its preset's `train.epochs` and
    `train.patience` (dataclass defaults where the preset is silent) and the selection rule."""
    from prvr.harness.config import TrainConfig, load_yaml
    from prvr.harness.registry import DATASETS

    train = (load_yaml(DATASETS.get(dataset).preset).get("train") or {}) if dataset in DATASETS else {}
    return {"epochs": int(train.get("epochs", TrainConfig.epochs)),
            "patience": int(train.get("patience", TrainConfig.patience)), "selection": SELECTION}


def selection_rule(config: dict[str, Any], selection: dict[str, Any] | None) -> str:
    """The selection rule with the split it used: the dataset's val, N held-out training videos
    (data.val_from_train), or a val split that holds the test queries (datasets/selection.py)."""
    n = (config.get("data") or {}).get("val_from_train", 0) if isinstance(config, dict) else 0
    if n:
        return f"{SELECTION} on {n} held-out train videos"
    if selection and selection.get("val_is_test"):
        return f"{SELECTION} on val = test queries"
    return SELECTION


def run_protocol(config: dict[str, Any], dataset: str, selection: dict[str, Any] | None = None) -> dict[str, Any]:
    """The budget a run was trained under (from its resolved config and, for the selection
    split, its data facts) and whether it is the dataset's protocol."""
    train = config.get("train", {}) if isinstance(config, dict) else {}
    own = {"epochs": train.get("epochs"), "patience": train.get("patience"), "selection": selection_rule(config, selection)}
    expected = dataset_protocol(dataset)
    # A val split that holds the test queries still follows the budget; the rule says so, and
    # the label keeps such rows apart from rows selected on held-out data.
    follows = own["epochs"] == expected["epochs"] and own["patience"] == expected["patience"]
    return {**own, "dataset_protocol": expected, "follows_protocol": follows}


def budget_label(protocol: dict[str, Any]) -> str:
    label = f"{protocol['epochs']} ep / stop {protocol['patience']}"
    rule = protocol.get("selection", SELECTION)
    return label if rule == SELECTION else f"{label}, {rule.removeprefix(SELECTION + ' ')}"


def record_path(out: str | Path, dataset: str, run_name: str, seed: int) -> Path:
    return Path(out) / "runs" / dataset / run_name / f"seed{seed}.json"


def provenance(device: str) -> dict[str, Any]:
    return {
        "git_revision": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "packages": {p: _version(p) for p in PACKAGES},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _git(*args: str) -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def write_record(path: str | Path, record: dict[str, Any]) -> None:
    record = {"schema_version": SCHEMA_VERSION, **record}
    write_json(path, record)


def load_record(path: str | Path) -> dict[str, Any]:
    """Read a record, upgrading older schema versions, and check the keys tools rely on."""
    data = read_json(path, what="run record")
    if not isinstance(data, dict):
        raise UserError(f"run record {path} holds {type(data).__name__}, expected an object; delete or fix it")
    data = upgrade(data)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise UserError(f"run record {path} lacks key(s) {', '.join(missing)}; delete it or re-run that run")
    return data


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any earlier schema to the current one."""
    version = data.get("schema_version", 1)
    if version == 1:
        # v1 stored metrics as `val_metrics` / `test_metrics` and had no run name or timings.
        metrics = data.pop("metrics", None) or {}
        metrics.setdefault("val", data.pop("val_metrics", {}))
        metrics.setdefault("test", data.pop("test_metrics", {}))
        for block in metrics.values():
            block.setdefault("buckets", {})
            block.setdefault("oracle", {})
        data["metrics"] = metrics
        cfg = data.get("config", {})
        data.setdefault("backbone", cfg.get("backbone", ""))
        data.setdefault("relations", cfg.get("relations", {}).get("name", "none"))
        data.setdefault("run_name", data.get("method", "?"))
        data.setdefault("timings", {})
        version = 2
    data["schema_version"] = version
    return data
