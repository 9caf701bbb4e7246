"""Typed configuration: dataclasses with defaults, YAML presets, `--set key=value` overrides.

Resolution order (later wins):
  dataclass defaults < dataset preset < method preset < method preset for this dataset
  < user YAML (--config) < --set overrides.
Every key is checked against the dataclass that owns it: an unknown key or a value of the
wrong type is an error naming the key. The resolved config is stored in each run record.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from prvr.harness.io import UserError
from prvr.harness.registry import BACKBONES, METHODS

ON_NONFINITE = ("stop", "continue")  # train.on_nonfinite, read by harness/trainer.py


@dataclass
class DataConfig:
    scale: str = "default"  # simulated presets: "default" (CPU-sized), "full" (real split sizes), "tiny"
    max_frames: int = 128  # frame branch: mean-pooled down to at most this many (MS-SL family)
    num_clips: int = 32  # clip branch: mean-pooled to exactly this many (MS-SL family)
    max_query_len: int = 30  # query tokens kept (MS-SL family)
    normalize_frames: bool = True  # L2-normalise frame rows (MS-SL family)
    normalize_tokens: bool = True  # L2-normalise token rows (MS-SL family)
    cache_dir: str = ""  # "" -> $PRVR_CACHE or ~/.cache/prvr-bench
    data_root: str = ""  # real datasets: "" -> $PRVR_DATA
    on_bad_rows: str = "error"  # "error" | "skip"
    layout: str = "msl"  # real datasets: "msl" (MS-SL family release) | "xml" (TVRetrieval release, tvr only)
    feature: str = ""  # real datasets: video features; "" -> MS-SL FeatureData/<the dataset's folder>, XML resnet_i3d
    annotations: str = ""  # real datasets: folder of the original annotation files; "" -> <collection>/annotations
    # Segment rule of the clip / frame mean-pooling: "reference" is the MS-SL family's (rounded,
    # clamped boundaries; the real-layout presets use it), "even" splits rows evenly (the
    # simulated presets, whose committed runs were made with it). See datasets/loader.py.
    pooling: str = "even"
    val_from_train: int = 0  # N > 0: N training videos (with all their queries) become the selection split (datasets/selection.py)
    preload: bool = False  # real datasets: copy video and query features into RAM instead of memory-mapping them


@dataclass
class SimConfig:
    """Knobs of the simulated PRVR world (datasets/sim). Presets set them per dataset."""

    seed: int = 0  # the world's own seed: the dataset stays fixed across run seeds
    train_videos: int = 1000
    val_videos: int = 250
    test_videos: int = 500
    queries_per_video: float = 5.0  # mean queries per video
    duration_mean: float = 75.7  # seconds
    duration_std: float = 15.0
    seconds_per_frame: float = 1.5  # one feature row per 1.5 s, like the public features
    mv_fractions: list[float] = field(default_factory=lambda: [0.853, 0.092, 0.055])  # short/medium/long
    extra_events: float = 2.0  # mean unannotated events per video (they can still be relevant)
    repeat_prob: float = 0.45  # label ambiguity: chance an event re-occurs from the recurring pool
    repeat_copies: float = 4.0  # mean videos a recurring event appears in, per split
    vague_prob: float = 0.1  # queries that omit the object or the character
    scene_prob: float = 0.3  # queries that name the scene
    filler_rate: float = 0.3  # chance of each filler slot (uninformative words)
    mislabel_rate: float = 0.0  # noisy correspondence: training queries moved to a random video
    latent_dim: int = 64
    video_dim: int = 3072
    query_dim: int = 768
    context_weight: float = 0.6  # shared context: scene and cast in every frame
    frame_noise: float = 1.0
    token_noise: float = 0.5
    object_weight: float = 0.8  # how visible the object is in an event's frames


@dataclass
class TrainConfig:
    epochs: int = 12
    batch_size: int = 128  # videos per batch, each with all its queries (MS-SL family: 128)
    optimizer: str = "adamw"  # "adamw" | "bertadam" (harness/optim.py; the MS-SL family presets use bertadam)
    lr: float = 3e-4
    weight_decay: float = 0.01  # not on biases / norms (each optimizer's groups: harness/optim.py)
    warmup_frac: float = 0.05  # share of all steps with linear warm-up
    decay: str = "cosine"  # "cosine" | "linear" | "constant" after warm-up, or "warmup_linear" (BertAdam's schedule)
    grad_clip: float = 5.0  # gradient-norm bound, 0 = none: adamw clips the global norm, bertadam each parameter's
    patience: int = 5  # early stop after this many epochs without val SumR gain (MS-SL: 10 of 100 epochs)
    eval_every: int = 1
    num_workers: int = -1  # batch-building worker processes; -1: 4 with CUDA (keeps a GPU fed), 0 on CPU
    device: str = "auto"  # "auto" (CUDA when present) | "cpu" | "cuda" | "cuda:1" ...
    # a loss that is not finite (a diverged run): "stop" (one line naming the epoch and step, no
    # record) | "continue" (train on; the record is marked and left out of leaderboard means)
    on_nonfinite: str = "stop"


@dataclass
class RelationsConfig:
    name: str = "none"  # relation detector: none | oracle | ... (see `prvr-bench list`)
    oracle_mode: str = "positive"  # oracle: "positive" (count as positives) | "ignore" (drop from negatives)


@dataclass
class EvalConfig:
    chunk: int = 1024  # queries scored at once
    splits: list[str] = field(default_factory=lambda: ["val", "test"])


@dataclass
class Config:
    method: str = "baseline"
    dataset: str = "sim-tvr"
    seed: int = 0
    backbone: str = ""  # "" -> the method's backbone
    data: DataConfig = field(default_factory=DataConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    model: Any = None  # the backbone's config dataclass
    loss: Any = None  # the method's objective config dataclass
    train: TrainConfig = field(default_factory=TrainConfig)
    relations: RelationsConfig = field(default_factory=RelationsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific sections

    def section(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        return getattr(self, name, None)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out.update(self.extra)
        return {k: dataclasses.asdict(v) if is_dataclass(v) else v for k, v in out.items()}


SCALARS = ("method", "dataset", "seed", "backbone")


def resolve(method: str, dataset: str, seed: int = 0, overrides: list[str] | None = None,
            user_yaml: str | Path | None = None) -> Config:
    """Build the fully resolved config of one run."""
    from prvr.harness.registry import DATASETS

    spec = METHODS.get(method)
    DATASETS.get(dataset)  # unknown dataset: error with suggestions
    sets = [parse_set(s) for s in overrides or []]
    user = load_yaml(user_yaml) if user_yaml else {}
    method_preset = load_yaml(spec.preset) if spec.preset else {}
    per_dataset = method_preset.pop("per_dataset", {}) or {}
    dataset_preset = load_yaml(DATASETS.get(dataset).preset)
    scales = dataset_preset.pop("scales", {}) or {}
    # A dataset's family (sim-tvr imitates tvr) selects the method's per-dataset defaults
    # keyed by the family; a section keyed by the exact dataset name applies after it.
    family = dataset_preset.pop("family", None)
    scale = dict(sets).get("data.scale") or user.get("data", {}).get("scale") or "default"
    if scale != "default" and scale not in scales:
        raise UserError(f"dataset {dataset} has no scale '{scale}' (has: default, {', '.join(scales)}); "
                        "fix --set data.scale")
    layers = [
        (dataset_preset, f"dataset preset {dataset}"),
        (method_preset, f"method preset {method}"),
        (per_dataset.get(family, {}) if family and family != dataset else {}, f"method preset {method} [{family}]"),
        (per_dataset.get(dataset, {}), f"method preset {method} [{dataset}]"),
        (scales.get(scale, {}), f"dataset preset {dataset} [scale {scale}]"),
        (user, str(user_yaml)),
    ]
    backbone = _pick_backbone(spec.backbone, layers, sets)
    cfg = Config(method=method, dataset=dataset, seed=seed, backbone=backbone)
    cfg.model = BACKBONES.get(backbone).config_cls()
    cfg.loss = spec.loss_cls()
    cfg.extra = {name: cls() for name, cls in spec.sections.items()}
    cfg.relations.name = spec.relations
    for layer, source in layers:
        apply_dict(cfg, layer, source)
    for key, raw in sets:
        apply_value(cfg, key, raw, "--set", from_cli=True)
    cfg.seed, cfg.method, cfg.dataset = seed, method, dataset
    return cfg


def _pick_backbone(default: str, layers: list[tuple[dict, str]], sets: list[tuple[str, str]]) -> str:
    backbone = default
    for layer, _ in layers:
        backbone = layer.get("backbone", backbone) or backbone
    for key, raw in sets:
        if key == "backbone":
            backbone = raw
    BACKBONES.get(backbone)
    return backbone


def parse_set(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise UserError(f"--set expects key=value, got '{item}' (e.g. --set train.lr=1e-4)")
    key, value = item.split("=", 1)
    return key.strip(), value.strip()


def load_yaml(path: str | Path | None) -> dict[str, Any]:
    if not path:
        return {}
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"config file {path}{where} is not valid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def apply_dict(cfg: Config, data: dict[str, Any], source: str, prefix: str = "") -> None:
    """Apply a nested mapping of values (a preset) to the config."""
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and not prefix and _is_section(cfg, key):
            apply_dict(cfg, value, source, prefix=f"{key}.")
        else:
            apply_value(cfg, full, value, source)


def _is_section(cfg: Config, name: str) -> bool:
    return is_dataclass(cfg.section(name))


def apply_value(cfg: Config, key: str, value: Any, source: str, from_cli: bool = False) -> None:
    """Set one dotted key, checking that it exists and that the value has the right type."""
    parts = key.split(".")
    if parts == ["relations"] and not isinstance(value, dict):  # shorthand: --set relations=oracle
        parts = ["relations", "name"]
    if len(parts) == 1:
        if parts[0] not in SCALARS:
            raise UserError(_unknown_key(key, _all_keys(cfg), source))
        setattr(cfg, parts[0], _coerce(value, str if parts[0] != "seed" else int, key, source, from_cli))
        return
    if len(parts) != 2 or not _is_section(cfg, parts[0]):
        raise UserError(_unknown_key(key, _all_keys(cfg), source))
    section = cfg.section(parts[0])
    hints = typing.get_type_hints(type(section))
    if parts[1] not in {f.name for f in fields(section)}:
        raise UserError(_unknown_key(key, _all_keys(cfg), source))
    setattr(section, parts[1], _coerce(value, hints[parts[1]], key, source, from_cli))


def _all_keys(cfg: Config) -> list[str]:
    keys = list(SCALARS)
    for name in ("data", "sim", "model", "loss", "train", "relations", "eval", *cfg.extra):
        sec = cfg.section(name)
        if is_dataclass(sec):
            keys += [f"{name}.{f.name}" for f in fields(sec)]
    return keys


def _unknown_key(key: str, known: list[str], source: str) -> str:
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "see `prvr-bench config --method M` for all keys"
    return f"unknown config key '{key}' (from {source}); {hint}"


def _coerce(value: Any, tp: Any, key: str, source: str, from_cli: bool) -> Any:
    if from_cli and isinstance(value, str) and tp is not str:
        value = _parse_cli_value(value)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if isinstance(value, (list, tuple)):
            return [_coerce(v, item_tp, key, source, from_cli) for v in value]
        raise _type_error(key, tp, value, source)
    if tp is Any:
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise _type_error(key, tp, value, source) from None
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    raise _type_error(key, tp, value, source)


def _parse_cli_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _type_error(key: str, tp: Any, value: Any, source: str) -> UserError:
    name = getattr(tp, "__name__", str(tp))
    return UserError(
        f"config key '{key}' expects {name}, got {value!r} ({type(value).__name__}) from {source}"
    )


def from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config from a stored record's `config` block (for resume / re-evaluation)."""
    spec = METHODS.get(data["method"])
    cfg = Config(method=data["method"], dataset=data["dataset"], seed=int(data["seed"]),
                 backbone=data.get("backbone") or spec.backbone)
    cfg.model = BACKBONES.get(cfg.backbone).config_cls()
    cfg.loss = spec.loss_cls()
    cfg.extra = {name: cls() for name, cls in spec.sections.items()}
    rest = {k: v for k, v in data.items() if k not in SCALARS}
    apply_dict(cfg, rest, "stored config")
    return cfg
