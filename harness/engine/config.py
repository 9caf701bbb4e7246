"""Typed configuration: dataclasses with defaults, YAML presets, `--set key=value` overrides.

Resolution order (later wins):
  dataclass defaults < dataset preset < method preset < method preset for this dataset
  < user YAML (--config) < --set overrides.
Every key is checked against the dataclass that owns it: an unknown key, a value of the
wrong type or a value outside the field's declared check (harness/base/checks.py, written next to
each default) is a one-line error naming the key and where the value came from. The
resolved config is stored in each run record. The sections' dataclasses, defaults and
declared checks: harness/engine/sections.py.
"""

from __future__ import annotations

import dataclasses
import os
import difflib
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from prvr.harness.base.checks import Device, check_section, check_value, show
from prvr.harness.base.devices import DEVICE_ENV, pick_device
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import (BACKBONES, DATASETS, DETECTORS, METHODS, extended_home, home_method, method_detector,
                                        unknown_message)
from prvr.harness.engine.precision import check_precision
from prvr.harness.engine.sections import Config, dataset_preset as load_dataset_preset, detector_settings, load_preset, \
    load_yaml
from prvr.methods.fit import check_fit

SCALARS = ("method", "dataset", "seed", "backbone")


# top-level keys that the command line sets (and overwrites after every layer), with the option
COMMAND_LINE_KEYS = {"method": "--method", "dataset": "--dataset", "seed": "--seed"}


def resolve(method: str, dataset: str, seed: int = 0, overrides: list[str] | None = None,
            user_yaml: str | Path | None = None) -> Config:
    """Build the fully resolved config of one run; every value is checked (harness/base/checks.py)
    before any data is made."""
    spec = METHODS.get(method)
    DATASETS.get(dataset)  # unknown dataset: error with suggestions
    check_value(Config, _field(Config, "seed"), "seed", seed, "--seed")
    sets = [parse_set(s) for s in overrides or []]
    owned = [k for k, _ in sets if k in COMMAND_LINE_KEYS]
    if owned:  # the command line's value would silently win
        raise UserError(f"--set {owned[0]}=...: the {owned[0]} of a run is the command line's; use "
                        f"{COMMAND_LINE_KEYS[owned[0]]} instead")
    user = load_yaml(user_yaml) if user_yaml else {}
    method_preset = load_preset(spec.preset) if spec.preset else {}
    per_dataset = method_preset.pop("per_dataset", {}) or {}
    dataset_preset = load_dataset_preset(dataset)
    scales = dataset_preset.pop("scales", {}) or {}
    # A dataset's family (sim-tvr imitates tvr) selects the method's per-dataset defaults
    # keyed by the family; a section keyed by the exact dataset name applies after it. A variant
    # (sim-tvr-v of sim-tvr) takes its base's sections first, then its own.
    family = dataset_preset.pop("family", None)
    base = dataset_preset.pop("variant_of", None)
    dataset_preset.pop("calibrated_to", None)  # the report's targets (harness/reports/calibration.py), not settings
    user_data = found if isinstance(found := user.get("data"), dict) else {}
    scale, scale_source = ((dict(sets)["data.scale"], "--set") if "data.scale" in dict(sets)
                           else (user_data.get("scale") or "default", str(user_yaml)))
    if not isinstance(scale, str):
        scale = "default"  # not a name: the type check of data.scale answers it
    if scale != "default" and scale not in scales:
        raise UserError(f"config key 'data.scale': dataset {dataset} has no scale {show(scale)} "
                        f"(has: {', '.join(('default', *scales))}) (from {scale_source})")
    # The backbone: the method's own, or another from its preset, the user's YAML or
    # --set backbone=B / --backbone B.
    backbones = method_preset.pop("backbones", {}) or {}
    method_layers = preset_layers(method_preset, per_dataset, family, dataset, f"method preset {method}", base)
    backbone = _pick_backbone(spec.backbone, [*method_layers, (user, str(user_yaml))], sets)
    if backbone != spec.backbone or spec.extends_backbone:
        # Another backbone's `model` settings come from its home preset (the method whose
        # own backbone it is, e.g. gmmformer's for --backbone gmmformer), never from this
        # method's, which are its own backbone's. A method that extends its backbone's home
        # method (RAL) takes the whole home preset, under its own.
        home = home_method(backbone)
        home_layers = []
        if home is not None and home != method:
            home_file = METHODS.get(home).preset
            home_preset = load_preset(home_file) if home_file else {}
            home_per_dataset = home_preset.pop("per_dataset", {}) or {}
            home_preset.pop("backbones", None)
            whole = extended_home(spec, backbone) is not None
            home_layers = [(layer if whole else {"model": layer["model"]},
                            source if whole else f"{source} (the model of backbone {backbone})")
                           for layer, source in preset_layers(home_preset, home_per_dataset, family, dataset,
                                                              f"method preset {home}", base) if whole or "model" in layer]
        if backbone != spec.backbone:
            method_layers = [({k: v for k, v in layer.items() if k != "model"}, source)
                             for layer, source in method_layers]
        method_layers = [*home_layers, *method_layers]
    own = backbones.get(backbone) or {}  # backbones.<B>: this method's settings on backbone B
    if not isinstance(own, dict):
        raise UserError(f"method preset {method} key 'backbones.{backbone}' must be a mapping of config sections, "
                        f"got {show(own)}; fix {spec.preset}")
    own = dict(own)
    own_per_dataset = own.pop("per_dataset", {}) or {}
    layers = [
        (dataset_preset, f"dataset preset {dataset}"),
        *method_layers,
        *preset_layers(own, own_per_dataset, family, dataset, f"method preset {method} [backbones.{backbone}]", base),
        (scales.get(scale, {}), f"dataset preset {dataset} [scale {scale}]"),
        (user, str(user_yaml)),
    ]
    cfg = Config(method=method, dataset=dataset, seed=seed, backbone=backbone)
    cfg.model = BACKBONES.get(backbone).config_cls()
    cfg.loss = loss_class(spec, backbone)()
    cfg.extra = {name: cls() for name, cls in spec.sections.items()}
    cfg.relations.name = _pick_detector(method_detector(spec, backbone), layers, sets)
    cfg.detector = detector_settings(cfg.relations.name)
    for layer, source in layers:
        # a preset may configure several detectors (e.g. ARL's own and the +oracle row's); only
        # this run's applies. A user's file names only this run's.
        apply_dict(cfg, layer, source, other_detectors="skip" if source.startswith(("dataset preset", "method preset"))
                   else "error")
    for key, raw in sets:
        apply_value(cfg, key, raw, "--set", from_cli=True)
    cfg.seed, cfg.method, cfg.dataset = seed, method, dataset
    check_config(cfg, "the resolved config")

    check_fit(cfg.method, cfg.backbone, cfg.relations.name)  # what the objective and detector read, provided?
    check_device(cfg.train.device, "config key 'train.device'", "--set train.device=cpu (or auto)")
    check_auto_device(cfg.train.device)
    check_precision_device(cfg.train.precision, cfg.train.device)
    return cfg


def check_auto_device(device: str) -> None:
    """`auto` takes $PRVR_DEVICE where it is set: checked as train.device is (a name torch takes, a CUDA
    device this machine has), so a wrong value is one line, not a traceback when the run starts."""
    chosen = os.environ.get(DEVICE_ENV)
    if device == "auto" and chosen:
        check_device(chosen, f"${DEVICE_ENV}", f"{DEVICE_ENV}=cpu (or unset it, or a CUDA device this machine has)")


def check_config(cfg: Config, source: str) -> None:
    """Every declared check of every field and each section's own cross-field rules."""
    for f in fields(cfg):
        if f.metadata.get("section"):
            continue
        check_value(cfg, f, f.name, getattr(cfg, f.name), source, cfg)
    for name in cfg.section_names():
        sec = cfg.section(name)
        if is_dataclass(sec):
            check_section(sec, name, source, cfg)


def check_device(device: str, what: str, fix: str) -> None:
    """A device name torch would not take, or a CUDA device asked for where torch finds none,
    is a one-line error, not a traceback."""
    problem = Device().problem(device)
    if problem:
        raise UserError(f"{what} {problem}; use {fix}")
    if not device.startswith("cuda"):
        return
    import torch

    index = int(device.split(":")[1]) if ":" in device else 0
    if not torch.cuda.is_available():
        raise UserError(f"{what} is '{device}', but torch finds no CUDA device on this machine; use {fix}")
    if index >= torch.cuda.device_count():
        raise UserError(f"{what} is '{device}', but this machine has {torch.cuda.device_count()} CUDA device(s) "
                        f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}); use {fix}")


def check_precision_device(precision: str, device: str) -> None:
    """The run's precision against the device it will train on (`auto` as it resolves on this
    machine), as the config is resolved: tf32 on a CPU is refused before any data is loaded."""
    if precision != "fp32":
        check_precision(precision, pick_device(device))


def _field(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in fields(cls) if f.name == name)


def preset_layers(top: dict, per_dataset: dict, family: str | None, dataset: str,
                  source: str, base: str | None = None) -> list[tuple[dict, str]]:
    """A preset's layers for `dataset`: its top level, its section for the dataset's family
    (sim-tvr imitates tvr), for the dataset a variant is of (sim-tvr-v of sim-tvr), and for the
    dataset itself."""
    return [
        (top, source),
        (per_dataset.get(family, {}) if family and family != dataset else {}, f"{source} [{family}]"),
        *([(per_dataset.get(base, {}), f"{source} [{base}]")] if base else []),
        (per_dataset.get(dataset, {}), f"{source} [{dataset}]"),
    ]


_MERGED: dict[tuple[type, type], type] = {}


def loss_class(spec: Any, backbone: str) -> type:
    """The `loss` section's class of a run: the method's own, or for a method that extends its
    backbone's home method (`MethodSpec.extends_backbone`), the home method's loss fields
    followed by the method's own, checked as both declare (`check(key)` of each)."""
    home = extended_home(spec, backbone)
    if home is None:
        return spec.loss_cls
    base, own = home.loss_cls, spec.loss_cls
    if (base, own) not in _MERGED:
        clash = {f.name for f in fields(base)} & {f.name for f in fields(own)}
        if clash:
            raise TypeError(f"{own.__name__} and {base.__name__} both define {', '.join(sorted(clash))}")

        def check(self, key: str) -> None:
            for cls in (base, own):
                check_of = getattr(cls, "check", None)
                if callable(check_of):
                    check_of(self, key)

        extra = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                     metadata=f.metadata)) for f in fields(own)]
        merged = dataclasses.make_dataclass(f"{own.__name__}On{base.__name__}", extra, bases=(base,),
                                            namespace={"check": check})
        merged.__module__ = own.__module__  # the field annotations resolve in the module that wrote them
        _MERGED[(base, own)] = merged
    return _MERGED[(base, own)]


def _pick_backbone(default: str, layers: list[tuple[dict, str]], sets: list[tuple[str, str]]) -> str:
    backbone, source = default, "the method's spec"
    for layer, where in layers:
        if layer.get("backbone"):
            backbone, source = layer["backbone"], where
    for key, raw in sets:
        if key == "backbone":
            backbone, source = raw, "--set backbone / --backbone"
    if backbone not in BACKBONES:
        raise UserError(f"config key 'backbone': {unknown_message('backbone', backbone, BACKBONES.names())} "
                        f"(from {source})")
    return backbone


def parse_set(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise UserError(f"--set expects key=value, got {show(item, 60)} (e.g. --set train.lr=1e-4)")
    key, value = item.split("=", 1)
    return key.strip(), value.strip()


def apply_dict(cfg: Config, data: dict[str, Any], source: str, prefix: str = "",
               other_detectors: str = "error") -> None:
    """Apply a nested mapping of values (a preset) to the config. `relations.<name>` sections
    of a detector other than the run's are skipped (`other_detectors="skip"`, presets) or
    refused (`"error"`)."""
    for key, value in data.items():
        full = f"{prefix}{key}"
        if prefix == "relations." and isinstance(value, dict) and key != "name":
            if full == cfg.detector_key and cfg.detector is not None:
                apply_dict(cfg, value, source, prefix=f"{full}.")
            elif other_detectors == "skip" and key in DETECTORS and full != cfg.detector_key:
                continue
            else:
                raise UserError(_detector_section_error(cfg, key, source))
        elif isinstance(value, dict) and not prefix and _is_section(cfg, key):
            apply_dict(cfg, value, source, prefix=f"{key}.", other_detectors=other_detectors)
        elif not prefix and _is_section(cfg, key):
            raise UserError(f"config key '{key}' is a section: give it a mapping of keys (from {source}), "
                            f"e.g. {key}: {{{fields(cfg.section(key))[0].name}: ...}}")
        else:
            apply_value(cfg, full, value, source)


def _is_section(cfg: Config, name: str) -> bool:
    return is_dataclass(cfg.section(name))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(section: type) -> dict[str, Any]:
    """A section class's resolved field types (`typing.get_type_hints`, kept: resolving them again for
    each of a preset's or a record's keys was a tenth of rebuilding the leaderboard)."""
    if section not in _HINTS:
        _HINTS[section] = typing.get_type_hints(section)
    return _HINTS[section]


def apply_value(cfg: Config, key: str, value: Any, source: str, from_cli: bool = False) -> None:
    """Set one dotted key, checking that it exists, that the value has the right type and that
    it passes the field's declared check."""
    parts = key.split(".")
    if parts == ["relations"] and not isinstance(value, dict):  # shorthand: --set relations=oracle
        parts = ["relations", "name"]
    if len(parts) == 1:
        if parts[0] not in SCALARS:
            raise UserError(_unknown_key(key, _all_keys(cfg), source))
        value = _coerce(value, str if parts[0] != "seed" else int, key, source, from_cli)
        check_value(cfg, _field(Config, parts[0]), key, value, source, cfg)
        setattr(cfg, parts[0], value)
        return
    if len(parts) == 3 and parts[0] == "relations":  # relations.<detector>.<key>
        if ".".join(parts[:2]) != cfg.detector_key or cfg.detector is None:
            raise UserError(_detector_section_error(cfg, parts[1], source))
        parts = [cfg.detector_key, parts[2]]
    if len(parts) != 2 or not _is_section(cfg, parts[0]):
        raise UserError(_unknown_key(key, _all_keys(cfg), source))
    owner = cfg.section(parts[0])
    hints = _hints(type(owner))
    if parts[1] not in {f.name for f in fields(owner)}:
        raise UserError(_unknown_key(key, _all_keys(cfg), source))
    value = _coerce(value, hints[parts[1]], key, source, from_cli)
    check_value(owner, _field(type(owner), parts[1]), f"{parts[0]}.{parts[1]}", value, source, cfg)
    setattr(owner, parts[1], value)


def _detector_section_error(cfg: Config, name: str, source: str) -> str:
    """One line for settings of a detector that is not this run's (or that has none)."""
    run = cfg.relations.name
    if name == run:
        return f"config key 'relations.{name}': detector '{name}' has no settings (from {source}); remove the section"
    if name not in DETECTORS:
        return _unknown_key(f"relations.{name}", _all_keys(cfg), source)
    return (f"config key 'relations.{name}' configures detector '{name}', but this run's detector is '{run}' "
            f"(from {source}); set relations.name={name} too, or remove the section")


def _pick_detector(default: str, layers: list[tuple[dict, str]], sets: list[tuple[str, str]]) -> str:
    """The run's detector name, before any layer applies (its settings section depends on it);
    a name that is not a string or not registered is left for the field check to answer."""
    name = default
    for layer, _ in layers:
        rel = layer.get("relations")
        if isinstance(rel, dict) and isinstance(rel.get("name"), str):
            name = rel["name"]
    for key, raw in sets:
        if key in ("relations", "relations.name"):
            name = raw
    return name if name in DETECTORS else default


def _all_keys(cfg: Config) -> list[str]:
    keys = list(SCALARS)
    for name in cfg.section_names():
        sec = cfg.section(name)
        if is_dataclass(sec):
            keys += [f"{name}.{f.name}" for f in fields(sec)]
    return keys


def _unknown_key(key: str, known: list[str], source: str) -> str:
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "see `prvr-bench config --method M` for all keys"
    return f"unknown config key {show(key, 60)} (from {source}); {hint}"


def _coerce(value: Any, tp: Any, key: str, source: str, from_cli: bool) -> Any:
    if typing.get_origin(tp) is typing.Literal:
        tp = str  # a fixed-choice word: its check (`one_of` the same Literal) answers a word that is not a choice
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
        f"config key '{key}' expects {name}, got {show(value)} ({type(value).__name__}) from {source}"
    )


def from_dict(data: dict[str, Any], source: str = "stored config") -> Config:
    """Rebuild a Config from a stored record's `config` block (for resume / re-evaluation),
    checked as a resolved one is (but not against this machine's devices: a record made on a
    GPU still loads on a CPU). `source` names the record in errors."""
    if not isinstance(data, dict):
        raise UserError(f"{source} is {type(data).__name__}, not a mapping of config keys; re-run that run")
    missing = [k for k in ("method", "dataset", "seed") if k not in data]
    if missing:
        raise UserError(f"{source} lacks config key(s) {', '.join(missing)}; re-run that run")
    scalars = Config(method=data["method"], dataset=data["dataset"], seed=data["seed"],
                     backbone=data.get("backbone") or "")
    for name in SCALARS:
        check_value(Config, _field(Config, name), name, getattr(scalars, name), source)
    spec = METHODS.get(scalars.method)
    cfg = Config(method=scalars.method, dataset=scalars.dataset, seed=scalars.seed,
                 backbone=scalars.backbone or spec.backbone)
    cfg.model = BACKBONES.get(cfg.backbone).config_cls()
    cfg.loss = loss_class(spec, cfg.backbone)()
    cfg.extra = {name: cls() for name, cls in spec.sections.items()}
    rest = _upgrade_detector_settings({k: v for k, v in data.items() if k not in SCALARS}, cfg)
    relations = rest.get("relations")
    detector = relations.get("name") if isinstance(relations, dict) else None
    cfg.relations.name = detector if isinstance(detector, str) and detector in DETECTORS else cfg.relations.name
    cfg.detector = detector_settings(cfg.relations.name) if cfg.relations.name in DETECTORS else None
    apply_dict(cfg, rest, source)
    check_config(cfg, source)
    return cfg


# Where detector settings lived before they became `relations.<name>` sections: records and
# checkpoints written before then still load, with the same settings.
_OLD_DETECTOR_KEYS = {("relations", "oracle_mode"): ("oracle", "mode")}


def _upgrade_detector_settings(data: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """A stored config with `relations.oracle_mode` or a top-level section named after a registered
    detector (ARL's `arl`: the layout before `relations.<name>`) in today's layout; the settings of a detector the run did not
    use are dropped (they never took effect)."""
    data = dict(data)
    relations = dict(data["relations"]) if isinstance(data.get("relations"), dict) else None
    name = relations.get("name") if relations else None
    for (section, key), (detector, new) in _OLD_DETECTOR_KEYS.items():
        if relations is not None and section == "relations" and key in relations:
            value = relations.pop(key)
            if name == detector:
                relations.setdefault(detector, {}).setdefault(new, value)
    for old in DETECTORS.names():
        if old in data and old not in cfg.extra and isinstance(data[old], dict):
            value = data.pop(old)
            if relations is not None and name == old:
                relations.setdefault(old, value)
    if relations is not None:
        data["relations"] = relations
    return data
