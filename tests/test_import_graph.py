"""The floors of the package and the arrows between them, read from the source (issue 37).

Every module of `prvr` (harness/, datasets/, methods/ as the installed package lays them out) is
parsed with `ast`; an arrow runs from a module to each `prvr` module it imports, at module level
or inside a function. The floors, bottom-up:

    plumbing   files, checks, names, progress, timing, masks, score semantics, devices,
               encoding a split batch by batch
    contract   the types that methods, backbones, detectors and the harness share, and the
               registries typed with them
    parts      datasets/ and methods/ (backbones, detectors, objectives, recipes)
    engine     config, build, the trainer, evaluation, records, one run
    commands   the CLI and the reports on top (leaderboard, ablate, census, profile, ...)

A module may import its own floor and the floors below. What this file holds true:
- no import circle among prvr modules (imports inside functions included: an import moved into a
  function to dodge a circle is still a circle);
- no arrow runs up a floor (`KNOWN_UPWARD` would list one with the reason it is still there;
  it is empty): a new one fails, and one that is gone must leave the list;
- no `prvr` import inside a function: the modules import each other at module level, where the
  graph above is what runs. The plugin loaders (`registry.import_modules`, the CLI's command
  modules) import by name through importlib and are no import statements.

`python tests/test_import_graph.py` prints the counts.
"""

from __future__ import annotations

import ast
import collections
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# The import package's parts and their folders (pyproject.toml [tool.setuptools.package-dir]).
PARTS = ("prvr.harness", "prvr.datasets", "prvr.methods")

# Each floor's modules: a name is that module; `name.*` is a package and every module below it.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plumbing", ("prvr.harness", "prvr.harness.io", "prvr.harness.checks", "prvr.harness.names",
                  "prvr.harness.progress", "prvr.harness.timing", "prvr.harness.masks", "prvr.harness.scores",
                  "prvr.harness.devices", "prvr.harness.encoding")),
    ("contract", ("prvr.harness.batches", "prvr.harness.contract", "prvr.harness.registry")),
    ("parts", ("prvr.datasets.*", "prvr.methods.*")),
    ("engine", ("prvr.harness.sections", "prvr.harness.config", "prvr.harness.build", "prvr.harness.optim",
                "prvr.harness.precision", "prvr.harness.checkpoints", "prvr.harness.trainer",
                "prvr.harness.evaluate", "prvr.harness.vcmr", "prvr.harness.rankings", "prvr.harness.record_types",
                "prvr.harness.records", "prvr.harness.robustness", "prvr.harness.runner")),
    ("commands", ("prvr.harness.cli", "prvr.harness.data_cli", "prvr.harness.jobs", "prvr.harness.executors",
                  "prvr.harness.plan", "prvr.harness.quick", "prvr.harness.leaderboard", "prvr.harness.rows",
                  "prvr.harness.buckets", "prvr.harness.noise", "prvr.harness.calibration",
                  "prvr.harness.world_calibration", "prvr.harness.census", "prvr.harness.detection",
                  "prvr.harness.ablate", "prvr.harness.parity", "prvr.harness.reevaluate",
                  "prvr.harness.ral_uncertainty", "prvr.harness.fusion_weights", "prvr.harness.profiling.*")),
)

# Arrows up a floor that the code still has, each with what keeps it; one that is removed leaves
# this list. Empty: the last three (issue 37) went when the noise curve moved to the engine
# (harness/robustness.py) and the device and split encoding to the plumbing (devices, encoding).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

@dataclass
class Graph:
    files: dict[str, Path]
    arrows: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    inner: list[str] = field(default_factory=list)  # "module:line" of each prvr import inside a function


def package_files() -> dict[str, Path]:
    """Module name -> source file, for every module of the installed package."""
    files = {}
    for part in PARTS:
        spec = importlib.util.find_spec(part)
        for folder in spec.submodule_search_locations:
            root = Path(folder)
            for f in sorted(root.rglob("*.py")):
                names = f.relative_to(root).with_suffix("").parts
                names = names[:-1] if names[-1] == "__init__" else names
                files[".".join((part, *names))] = f
    return files


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict) -> list[str]:
    """The prvr modules an import statement imports (`from a import b` is module a.b where that is
    a module, else a)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    return [m for m in out if m in known]


def imports_of(source: str, module: str, is_package: bool, known: dict) -> list[tuple[str, int, bool]]:
    """(imported prvr module, line, inside a function) for every import statement of a source."""
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, child.lineno, in_function) for t in imported(child, module, is_package, known)
                             if t != module)
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(source), False)
    return found


def read_graph() -> Graph:
    graph = Graph(package_files())
    for module, path in graph.files.items():
        found = imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py", graph.files)
        graph.arrows[module].update(t for t, _, _ in found)
        graph.inner += sorted({f"{module}:{line}" for _, line, inner in found if inner})
    return graph


def floor_of(module: str) -> int:
    """The floor that names a module, or the longest `package.*` above it; -1 for none."""
    best, floor = -1, -1
    for i, (_, names) in enumerate(FLOORS):
        for name in names:
            package = name.removesuffix(".*")
            if module == name or (name.endswith(".*") and (module == package or module.startswith(package + "."))):
                if len(name) > best:
                    best, floor = len(name), i
    return floor


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(arrows):
        if start in index:
            continue
        work = [(start, iter(sorted(arrows.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(arrows.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(graph: Graph) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.arrows.items() for b in targets if floor_of(b) > floor_of(a)}


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_graph()


def test_every_module_has_a_floor(graph):
    assert [m for m in graph.files if floor_of(m) < 0] == []


def test_the_graph_sees_the_package(graph):
    assert "prvr.harness.io" in graph.arrows["prvr.harness.records"]
    assert "prvr.datasets.loader" in graph.arrows["prvr.harness.trainer"]
    assert len(graph.files) > 100


def test_a_floor_is_named_or_inherited_from_a_package():
    names = [FLOORS[floor_of(m)][0] if floor_of(m) >= 0 else None
             for m in ("prvr.harness", "prvr.harness.profiling.flops", "prvr.methods.backbones.msl",
                       "prvr.harness.a_new_module")]
    assert names == ["plumbing", "commands", "parts", None]


def test_no_import_circle(graph):
    assert circles(graph.arrows) == []


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_new_arrow_runs_up_a_floor(graph):
    found = upward(graph)
    new = sorted(found - set(KNOWN_UPWARD))
    assert new == [], f"arrows up a floor (FLOORS): {new}; import downward, or move the shared part down"
    gone = sorted(set(KNOWN_UPWARD) - found)
    assert gone == [], f"gone, remove them from KNOWN_UPWARD: {gone}"


def test_no_prvr_import_inside_a_function(graph):
    assert graph.inner == [], f"prvr imports inside functions: {graph.inner}; import at module level"


def test_imports_inside_functions_are_found():
    known = {"prvr.a": None, "prvr.b": None, "prvr.c": None}
    source = "import prvr.a\n\ndef f():\n    from prvr import b\n    import os\n\nclass C:\n    def g(self):\n" \
             "        x = lambda: None\n        from prvr.c import name\n"
    assert imports_of(source, "prvr.z", False, known) == [("prvr.a", 1, False), ("prvr.b", 4, True),
                                                          ("prvr.c", 10, True)]


def summary(graph: Graph) -> dict[str, int]:
    return {"modules": len(graph.files), "arrows": sum(len(t) for t in graph.arrows.values()),
            "circles": len(circles(graph.arrows)), "upward arrows": len(upward(graph)),
            "imports inside functions": len(graph.inner)}


if __name__ == "__main__":
    g = read_graph()
    for key, value in summary(g).items():
        print(f"{key}: {value}")
    for a, b in sorted(upward(g)):
        print(f"up: {a} ({FLOORS[floor_of(a)][0]}) -> {b} ({FLOORS[floor_of(b)][0]})")
    for where in g.inner:
        print(f"inner: {where}")
