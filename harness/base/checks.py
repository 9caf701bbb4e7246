"""What values a config field accepts, declared next to its default.

Every field of a config dataclass is written with `param(default, check)`:

    lr: float = param(3e-4, POSITIVE)                 # a finite number > 0
    epochs: int = param(12, at_least(1))              # an integer >= 1
    decay: Decay = param("cosine", one_of(Decay))     # one of a fixed set: Decay = Literal[...]
    optimizer: str = param("adamw", Registered(lambda: OPTIMIZERS))
    cache_dir: str = param("", Free("a folder; '' = the default cache"))

A setting with a fixed set of choices is annotated with a `Literal[...]` alias, and `one_of`
reads its check's choices from that alias: mypy and the config check read one list (a test
holds every such field to it).

A rule that ties fields of one section together is a method `check(self, key)` of the
dataclass that raises UserError naming `key.field` (`key` is the section's name, e.g. "loss").
The resolver (harness/engine/config.py) checks each value as it is applied, naming the key and
where the value came from, and the whole config again before any data is made;
tests/test_config_checks.py proves that every field of every registered config dataclass
declares a check and that its default passes it.
"""

from __future__ import annotations

import copy
import math
import re
import typing
from dataclasses import Field, dataclass, field, fields
from typing import Any, Callable, ClassVar, Literal, Protocol, Sequence

from prvr.harness.base.io import UserError
from prvr.harness.base.names import unknown_message


class Section(Protocol):
    """A config section's settings: a dataclass whose fields are written with `param` (a
    backbone's `config_cls`, a method's `loss_cls`, a detector's `config_cls`; they share no base
    class). A `check(self, key)` method, where one has it, ties its fields together."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]


class Check:
    """The values one config field accepts."""

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        """None when `value` is accepted, else what is wrong ("must be ..., got ..."); `cfg` is
        the whole config, for choices that depend on it (e.g. the dataset's scales)."""
        raise NotImplementedError


def param(default: Any, check: Check) -> Any:
    """A dataclass field with its default and its declared check (mutable defaults are copied)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"check": check})
    return field(default=default, metadata={"check": check})


def section(factory: Callable[[], Any] | None = None) -> Any:
    """A field of `Config` that holds a section (a dataclass, checked field by field)."""
    if factory is None:
        return field(default=None, metadata={"section": True})
    return field(default_factory=factory, metadata={"section": True})


def declared(f: Field) -> Check | None:
    """The check a field declares (None: written without `param`, a bug the tests catch)."""
    return f.metadata.get("check")


def show(value: Any, limit: int = 40) -> str:
    """A value as one short line (repr escapes newlines)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------- numbers
@dataclass(frozen=True)
class Range(Check):
    """A finite number (an integer with `integer`) between optional bounds."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    note: str = ""  # what special values mean, e.g. "-1 = never"

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.integer:
            number = number and float(value).is_integer()
        if not number or not math.isfinite(value) or not self._inside(value):
            return f"must be {self.describe()}, got {show(value)}"
        return None

    def _inside(self, v: float) -> bool:
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return self.high is None or not (v > self.high or (self.high_open and v == self.high))

    def describe(self) -> str:
        what = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            span = f" in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            span = f" {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            span = f" {'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            span = ""
        return what + span + (f" ({self.note})" if self.note else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def at_least(n: int, note: str = "") -> Range:
    """An integer >= n."""
    return Range(n, integer=True, note=note)


FINITE = Range()
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
PROBABILITY = Range(0, 1)
DROPOUT = Range(0, 1, high_open=True)  # 1 would zero every activation
SEED = Range(0, 2**32 - 1, integer=True)  # numpy's seed range


# ----------------------------------------------------------------------------- choices
Choices = Sequence[str] | Callable[[Any], Sequence[str]]


@dataclass(frozen=True)
class OneOf(Check):
    """One of a set of words; `choices` may be a function of the whole config."""

    choices: Choices

    def options(self, cfg: Any = None) -> Sequence[str]:
        return self.choices(cfg) if callable(self.choices) else self.choices

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        options = self.options(cfg)
        if value in options:
            return None
        return f"must be one of {', '.join(options)}, got {show(value)}"


def words_of(alias: object) -> tuple[str, ...]:
    """The words of a `Literal[...]` alias of a fixed-choice setting, in its order."""
    words = typing.get_args(alias)
    if typing.get_origin(alias) is not Literal or not all(isinstance(w, str) for w in words):
        raise TypeError(f"{alias!r} is not a Literal of words")
    return words


def one_of(alias: object) -> OneOf:
    """The check of a field annotated with the `Literal[...]` alias `alias`: one of its words."""
    return OneOf(words_of(alias))


@dataclass(frozen=True)
class Registered(Check):
    """A name in a registry (given lazily: registries fill as their plugins are imported);
    the error is the registry's, with the closest names. `empty`: "" is accepted too."""

    registry: Callable[[], Any]
    empty: str = ""  # what "" means, when it is allowed

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        reg = self.registry()
        if (value == "" and self.empty) or (isinstance(value, str) and value in reg):
            return None
        return "names an " + unknown_message(reg.kind, value, reg.names())


DEVICE = re.compile(r"auto|cpu|cuda(:\d{1,3})?")


@dataclass(frozen=True)
class Device(Check):
    """auto | cpu | cuda | cuda:N (whether CUDA is there is checked when a run is resolved)."""

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        if isinstance(value, str) and DEVICE.fullmatch(value):
            return None
        return f"must be auto, cpu, cuda or cuda:N, got {show(value)}"


# ----------------------------------------------------------------------------- lists, free values
@dataclass(frozen=True)
class ListOf(Check):
    """A list whose items each pass `item`; optionally of a fixed length, with distinct
    items, or summing to `total` (within 1e-3, as figures given to three decimals)."""

    item: Check
    length: int | None = None
    min_length: int = 1
    distinct: bool = False
    total: float | None = None

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        ok = isinstance(value, list) and len(value) >= self.min_length
        ok = ok and (self.length is None or len(value) == self.length)
        ok = ok and all(self.item.problem(v, cfg) is None for v in value)
        ok = ok and (not self.distinct or len(set(value)) == len(value))
        ok = ok and (self.total is None or abs(sum(value) - self.total) <= 1e-3)
        return None if ok else f"must be {self.describe(cfg)}, got {show(value, 60)}"

    def describe(self, cfg: Any = None) -> str:
        count = f"{self.length} " if self.length is not None else (f"at least {self.min_length} " if self.min_length
                                                                     else "")  # min_length 0: any length, [] too
        item = self.item.describe() if isinstance(self.item, Range) else (
            f"of {', '.join(self.item.options(cfg))}" if isinstance(self.item, OneOf) else "valid")
        return (f"a list of {count}{'distinct ' if self.distinct else ''}items, each {item}"
                + (f", summing to {_num(self.total)}" if self.total is not None else ""))


@dataclass(frozen=True)
class Free(Check):
    """Any value of the field's type (its type is checked when it is set): paths, switches."""

    what: str

    def problem(self, value: Any, cfg: Any = None) -> str | None:
        return None


FLAG = Free("true or false")


# ----------------------------------------------------------------------------- checking a section
def check_section(obj: Any, key: str, source: str, cfg: Any = None) -> None:
    """Every declared check of a config dataclass, then its own cross-field `check(key)`."""
    for f in fields(obj):
        check_value(obj, f, f"{key}.{f.name}", getattr(obj, f.name), source, cfg)
    own = getattr(obj, "check", None)
    if callable(own):
        own(key)


def check_value(owner: Any, f: Field, key: str, value: Any, source: str, cfg: Any = None) -> None:
    """One value against its field's declared check; a field without one is a bug, not input."""
    chk = declared(f)
    if chk is None:
        owner_name = owner.__name__ if isinstance(owner, type) else type(owner).__name__
        raise TypeError(f"{owner_name}.{f.name} declares no check: write it with param(default, check) "
                        "(harness/base/checks.py)")
    problem = chk.problem(value, cfg)
    if problem:
        raise UserError(f"config key '{key}' {problem} (from {source})")


def require(ok: bool, message: str) -> None:
    """For `check(self, key)` methods: raise the one-line message unless `ok`."""
    if not ok:
        raise UserError(message)
