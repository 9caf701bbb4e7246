"""results/profile.json: the typed figures behind profile.md and profile.csv, so that
`prvr-bench profile --method M ... --only-methods` renews the rows of the methods it names and keeps
every other row (and the evaluator's) as it was measured.

The file is untrusted input like every record the suite reads: parsed as JSON (no pickle, no
evaluation), each key checked against the dataclass or TypedDict it fills, and a wrong key or
value is one line naming the file, the key and the fix. An update measures under the stored
profile's settings (same dataset, sizes, repeats, threads ...) or is refused: one table has one
protocol. Each renewed method's row carries what made it (`MethodProfile.made`: command, commit,
date), which the markdown header and the CSV's `revision` column show.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

from prvr.harness.base.checks import show
from prvr.harness.base.io import UserError, read_json
from prvr.harness.profiling.evaluator_speed import EvaluatorSpeed
from prvr.harness.profiling.report import (STORED_FORMAT as FORMAT, Made, MethodProfile, Profile, ProfileProvenance,
                                          Settings)
from prvr.harness.profiling.reported import reported_for

FIX = "profile every method again (prvr-bench profile, without --only-methods) or restore the file from version control"
# settings an update may not change: every one but the evaluator's, which an update keeps
EVALUATOR_SETTINGS = ("eval_shape", "eval_repeats")


def read_profile(path: str | Path) -> Profile:
    """The profile stored at `path`, every key checked."""
    path = Path(path)
    data = read_json(path, "stored profile")
    reader = _Reader(path)
    if not isinstance(data, dict):
        raise reader.error("the file", "an object", data)
    if data.get("format") != FORMAT:
        raise reader.error("format", f"{FORMAT} (the format this version writes)", data.get("format"))
    unknown = sorted(set(data) - {"format", "settings", "methods", "evaluator", "provenance"})
    if unknown:
        raise UserError(f"{path}: unknown key {show(unknown[0])} (a stored profile has format, settings, "
                        f"methods, evaluator, provenance); {FIX}")
    for key in ("settings", "methods", "provenance"):
        if key not in data:
            raise UserError(f"{path}: key {key!r} is missing; {FIX}")
    settings = reader.read(Settings, data["settings"], "settings")
    methods = reader.read(list[MethodProfile], data["methods"], "methods")
    evaluator = reader.read(EvaluatorSpeed | None, data.get("evaluator"), "evaluator")
    prov = reader.read(ProfileProvenance, data["provenance"], "provenance")
    for key in ("command", "created", "git_revision", "device", "torch", "wall_s"):
        if key not in prov:
            raise UserError(f"{path}: key 'provenance.{key}' is missing; {FIX}")
    names = [(m.method, m.backbone) for m in methods]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise UserError(f"{path}: method {twice[0]} on {twice[1]} is stored twice under 'methods'; {FIX}")
    return Profile(settings, methods, reported_for([m.method for m in methods]), evaluator, prov)


def check_protocol(stored: Profile, settings: Settings, device: str, where: str | Path) -> None:
    """An update measures under the stored profile's settings (the evaluator's aside: it keeps the
    stored evaluator speed) and on its device and CPU model: one table, one protocol, one machine."""
    for f in dataclasses.fields(Settings):
        if f.name in EVALUATOR_SETTINGS:
            continue
        before, now = getattr(stored.settings, f.name), getattr(settings, f.name)
        if before != now:
            raise UserError(f"{where} was profiled with {f.name} = {show(before)}, this update with {show(now)}: "
                            f"one table has one protocol; pass the flags that made it (its header names the "
                            f"command) or profile every method again without --only-methods")
    if stored.provenance["device"] != device:
        raise UserError(f"{where} was profiled on {stored.provenance['device']}, this run is on {device}: the rows "
                        f"of one table come from one machine; profile every method here without --only-methods "
                        f"(into another --out)")


def updated(old: Profile, new: Profile) -> Profile:
    """`old` with the rows of `new`'s methods replaced (in place; methods it lacked are added
    at the end) and everything else kept: its settings, its evaluator speed, its provenance.
    The renewed rows say what made them. `check_protocol` has held `new` to `old`'s protocol."""
    made: Made = {"command": new.provenance["command"], "created": new.provenance["created"],
                  "git_revision": new.provenance["git_revision"], "git_dirty": bool(new.provenance.get("git_dirty"))}
    fresh = {(m.method, m.backbone): dataclasses.replace(m, made=made) for m in new.methods}
    methods = [fresh.pop((m.method, m.backbone), m) for m in old.methods] + list(fresh.values())
    return Profile(old.settings, methods, reported_for([m.method for m in methods]), old.evaluator, old.provenance)


class _Reader:
    """JSON values into the types of the profile's dataclasses, one key at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, key: str, expected: str, got: Any) -> UserError:
        return UserError(f"{self.path}: key {key!r} must be {expected}, got {show(got)}; {FIX}")

    def read(self, tp: Any, value: Any, key: str) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            return self._fields(tp, value, key, dataclass=True)
        if typing.is_typeddict(tp):
            return self._fields(tp, value, key, dataclass=False)
        if origin in (types.UnionType, typing.Union):
            if value is None and type(None) in args:
                return None
            choices = [a for a in args if a is not type(None)]
            if len(choices) == 1:
                return self.read(choices[0], value, key)
            for a in choices:  # scalars only (int | None, str | float): the first that takes it
                try:
                    return self.read(a, value, key)
                except UserError:
                    continue
            raise self.error(key, " or ".join(getattr(a, "__name__", str(a)) for a in args), value)
        if origin is Literal:
            if value not in args:
                raise self.error(key, "one of " + ", ".join(map(repr, args)), value)
            return value
        if origin is list:
            if not isinstance(value, list):
                raise self.error(key, "a list", value)
            return [self.read(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
        if origin is tuple:
            if not isinstance(value, list) or len(value) != len(args):
                raise self.error(key, f"a list of {len(args)}", value)
            return tuple(self.read(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        if origin is dict:
            if not isinstance(value, dict):
                raise self.error(key, "an object", value)
            return {k: self.read(args[1], v, f"{key}.{k}") for k, v in value.items()}
        return self._scalar(tp, value, key)

    def _scalar(self, tp: Any, value: Any, key: str) -> Any:
        if tp is bool:
            if not isinstance(value, bool):
                raise self.error(key, "true or false", value)
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(key, "an integer", value)
            return value
        if tp is float:
            if value is None:  # written for NaN: not measured
                return math.nan
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.error(key, "a number", value)
            if math.isinf(value):
                raise self.error(key, "a finite number (or NaN: not measured)", value)
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise self.error(key, "a string", value)
            return value
        if tp is Any:
            if isinstance(value, (dict, list)):
                raise self.error(key, "a plain value", value)
            return value
        raise TypeError(f"the stored profile has no reader for {tp!r} ({key})")  # a bug, not bad input

    def _fields(self, tp: Any, value: Any, key: str, dataclass: bool) -> Any:
        if not isinstance(value, dict):
            raise self.error(key, "an object", value)
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp) if f.init} if dataclass else set(hints)
        for name in value:
            if name not in known:
                raise UserError(f"{self.path}: unknown key {f'{key}.{name}'!r} (known: {', '.join(sorted(known))}); "
                                f"{FIX}")
        out = {name: self.read(hints[name], v, f"{key}.{name}") for name, v in value.items()}
        required = sorted(tp.__required_keys__) if not dataclass else [
            f.name for f in dataclasses.fields(tp)
            if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in out]
        if missing:
            raise UserError(f"{self.path}: key {f'{key}.{missing[0]}'!r} is missing; {FIX}")
        return tp(**out) if dataclass else out
