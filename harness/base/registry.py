"""One registry pattern for every pluggable part of the benchmark.

Methods, backbones, relation detectors, objectives and datasets register
themselves with a decorator. A duplicate name is an error; an unknown name is answered
with the closest known names.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, TypeVar

from prvr.harness.base.names import (RULE, edit_distance, name_problem, split_run_name,  # noqa: F401 (edit_distance)
                                     unknown_message)

if TYPE_CHECKING:  # the registries' types (harness/base/contract.py imports torch, which the CLI loads late)
    from prvr.harness.base.contract import Backbone, DatasetEntry, MethodSpec, ObjectivePart, RelationDetector

T = TypeVar("T")
RUN_NAME_SEPARATORS = "+@~"


class RegistryError(KeyError):
    """Unknown or duplicate name in a registry; the message is the whole story."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    summary: str


class Registry(Generic[T]):
    """A named collection of registered objects of one kind."""

    def __init__(self, kind: str, members: tuple[str, ...] = (), contract: str = "") -> None:
        self.kind = kind
        # what every registered class must have (its protocol's members), checked when it
        # registers: a part that lacks one fails at import with one line, not mid-run
        self.members, self.contract = members, contract
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, summary: str = "") -> Callable[[T], T]:
        """Decorator: register `obj` under `name`; the summary is shown by `prvr-bench list`."""

        def deco(obj: T) -> T:
            self.add(name, obj, summary)
            return obj

        return deco

    def add(self, name: str, obj: T, summary: str = "") -> None:
        problem = name_problem(name)
        if problem:  # registered names become folder and run names
            raise RegistryError(f"{self.kind} name {name!r} {problem}; use {RULE}")
        sep = next((c for c in RUN_NAME_SEPARATORS if c in name), None)
        if sep:  # run names join method+detector@backbone~tag: a part holding one would read two ways
            raise RegistryError(f"{self.kind} name {name!r} holds {sep!r}, which separates the parts of a run name "
                                "(method+detector@backbone~tag); use letters, digits, '.', '_' and '-'")
        lacking = [m for m in self.members if not hasattr(obj, m)]
        if lacking:
            raise RegistryError(f"{self.kind} '{name}' ({_where(obj)}) lacks {', '.join(lacking)} of the {self.contract} "
                                "contract (harness/base/contract.py); add them to the class")
        if name in self._entries:
            raise RegistryError(
                f"duplicate {self.kind} '{name}': already registered by "
                f"{_where(self._entries[name].obj)}; pick another name"
            )
        if not summary:
            doc = getattr(obj, "__doc__", None) or ""
            summary = doc.strip().splitlines()[0] if doc.strip() else ""
        self._entries[name] = Entry(name, obj, summary)

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        load_all()
        if not isinstance(name, str) or name not in self._entries:
            raise RegistryError(self._run_name_answer(name) or unknown_message(self.kind, name, self.names()))
        return self._entries[name]

    def _run_name_answer(self, name: object) -> str:
        """Where a run's name (method+detector@backbone~tag, e.g. ral@holmes) is given for a method's:
        the options that make that run."""
        if self.kind != "method" or not isinstance(name, str) or not any(c in name for c in RUN_NAME_SEPARATORS) \
                or not name.isprintable() or len(name) > 64:  # a hostile name: the escaped unknown-name line
            return ""
        method, detector, backbone, tag = split_run_name(name)
        if method not in self._entries:
            return ""
        given = [f"--method {method}", *([f"--backbone {backbone}"] if backbone else []),
                 *([f"--set relations.name={detector}"] if detector else [])]
        tagged = (f", with the settings its tag {tag!r} stands for (the leaderboard's commands list each run's "
                  f"whole command)") if tag else ""
        return (f"{name!r} names a run, not a method: give {' '.join(given)}{tagged}; `prvr-bench sweep --method` "
                f"takes run names as they are")

    def names(self) -> list[str]:
        load_all()
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        return (self._entries[n] for n in self.names())

    def __contains__(self, name: object) -> bool:
        load_all()
        return isinstance(name, str) and name in self._entries


_Part = TypeVar("_Part", bound="ObjectivePart")  # one registered objective part, with its own signature


class ObjectiveRegistry(Registry["ObjectivePart"]):
    """The objective parts' registry: a registered loss function keeps its own signature for the
    objectives that call it, while the registry holds it as an `ObjectivePart`."""

    def register(self, name: str, summary: str = "") -> Callable[[_Part], _Part]:
        def deco(fn: _Part) -> _Part:
            self.add(name, fn, summary)
            return fn

        return deco


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


METHODS: Registry[MethodSpec] = Registry("method")
# the members of contract.Backbone and contract.RelationDetector (tests/test_registries.py keeps
# them equal): registry.py does not import the contract, which imports torch
BACKBONE_MEMBERS = ("config_cls", "provides", "encode_queries", "encode_videos", "index_videos", "score")
DETECTOR_MEMBERS = ("needs", "config_cls", "finds_pairs", "doubts_labels", "setup", "prepare", "on_epoch_start",
                    "on_step", "on_epoch_end", "detect", "epoch_report", "write_artifacts")
BACKBONES: Registry[type[Backbone]] = Registry("backbone", BACKBONE_MEMBERS, "Backbone")
DETECTORS: Registry[type[RelationDetector]] = Registry("relation detector", DETECTOR_MEMBERS, "RelationDetector")
OBJECTIVES = ObjectiveRegistry("objective")  # loss functions of tensors (methods/objectives/)
DATASETS: Registry[DatasetEntry] = Registry("dataset")

_PLUGIN_MODULES = ("prvr.methods", "prvr.datasets")
_loaded = False


def import_modules(package: str) -> list[str]:
    """Import every module of `package` and of its subpackages, depth first in sorted order of
    their names, so that a module registers its parts by existing; returns the names imported.
    A module that fails to import raises its own error (with a note naming the module): it is
    never skipped."""
    root = importlib.import_module(package)
    done = []
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
        if info.name == "__main__":  # a package's `python -m` entry runs, it registers nothing
            continue
        name = f"{package}.{info.name}"
        try:
            importlib.import_module(name)
        except BaseException as err:
            if not any(name in note for note in getattr(err, "__notes__", ())):
                err.add_note(f"(while {package} imported its module {name}: every module of the package is "
                             "imported so that it registers its parts)")
            raise
        done.append(name)
        if info.ispkg:
            done += import_modules(name)
    return done


def load_all() -> None:
    """Import the packages whose modules register themselves (idempotent)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # set first: the modules being imported look names up themselves
    try:
        for mod in _PLUGIN_MODULES:
            importlib.import_module(mod)
    except BaseException:
        _loaded = False  # a failed import leaves no half-filled registry behind as if complete
        raise


def extended_home(spec: "MethodSpec", backbone: str) -> "MethodSpec | None":
    """The method that `spec` extends on `backbone` (`MethodSpec.extends_backbone`, RAL): the
    backbone's home method when it is another method; None for a method that extends nothing,
    or a backbone without a home. The one place the rule lives: the loss section's fields
    (config.loss_class), the presets taken whole (config.resolve), the objective's `base` and
    detector plan (build.method_spec) and the outputs read (fit.method_needs) all ask it."""
    if not spec.extends_backbone:
        return None
    home = home_method(backbone)
    return None if home is None or home == spec.name else METHODS.get(home)


def method_detector(spec: "MethodSpec", backbone: str) -> str:
    """The detector a method trains with on `backbone` unless a run names another: its own
    (`MethodSpec.relations`), or, for a method that brings none ("none") and extends its
    backbone's home method, the home method's, which is part of what it extends (RAL on Holmes
    keeps Holmes' query division, as Holmes' dual-query code does). The run's config
    (config.resolve) and its name (runner.run_name) ask it."""
    home = extended_home(spec, backbone)
    return home.relations if home is not None and spec.relations == "none" else spec.relations


def home_method(backbone: str) -> str | None:
    """The method whose own backbone `backbone` is (its preset holds the backbone's
    per-dataset `model` settings): the one named like it, else the first by name."""
    homes = [name for name in METHODS.names() if METHODS.get(name).backbone == backbone]
    return backbone if backbone in homes else (homes[0] if homes else None)


def marked_method(flag: str) -> str:
    """The one registered method whose spec sets `flag` (`reference`: the baseline every row is compared
    with; `moment_reference`: the moment retrieval method the others build on), so that nothing above the
    methods names one."""
    load_all()
    marked = [name for name in METHODS.names() if getattr(METHODS.get(name), flag)]
    if len(marked) != 1:
        raise RuntimeError(f"one registered method must say {flag}=True, not {len(marked)}: {marked}")
    return marked[0]
