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
import re
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# The import package's parts and their folders (pyproject.toml [tool.setuptools.package-dir]).
PARTS = ("prvr.harness", "prvr.datasets", "prvr.methods")

# Each floor's modules: a name is that module; `name.*` is a package and every module below it. The
# floors are the folders (FOLDER_FLOORS); the base's folder has two floors of its own inside it, the
# plumbing under the contract that the parts implement.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plumbing", ("prvr.harness", "prvr.harness.base", "prvr.harness.base.io", "prvr.harness.base.checks",
                  "prvr.harness.base.names", "prvr.harness.base.progress", "prvr.harness.base.timing",
                  "prvr.harness.base.masks", "prvr.harness.base.scores", "prvr.harness.base.devices",
                  "prvr.harness.base.encoding", "prvr.harness.base.allocator")),
    ("contract", ("prvr.harness.base.batches", "prvr.harness.base.contract", "prvr.harness.base.registry")),
    ("parts", ("prvr.datasets.*", "prvr.methods.*")),
    ("engine", ("prvr.harness.engine.*",)),
    ("reports", ("prvr.harness.reports.*",)),
    ("profiling", ("prvr.harness.profiling.*",)),
    ("commands", ("prvr.harness.cli.*",)),
)

# The floors as folders, bottom-up: every module of a folder is on that folder's floor, and a folder
# imports only the folders at or below it (harness/ itself holds nothing but its sub-packages).
FOLDER_FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("harness", "harness/base")),
    ("parts", ("datasets", "methods")),
    ("engine", ("harness/engine",)),
    ("reports", ("harness/reports",)),
    ("profiling", ("harness/profiling",)),
    ("commands", ("harness/cli",)),
)

# Arrows up a floor that the code still has, each with what keeps it; one that is removed leaves
# this list. Empty: the last three (issue 37) went when the noise curve moved to the engine
# (harness/engine/robustness.py) and the device and split encoding to the plumbing (devices, encoding).
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
    assert "prvr.harness.base.io" in graph.arrows["prvr.harness.engine.records"]
    assert "prvr.datasets.loader" in graph.arrows["prvr.harness.engine.trainer"]
    assert len(graph.files) > 100


def test_a_floor_is_named_or_inherited_from_a_package():
    names = [FLOORS[floor_of(m)][0] if floor_of(m) >= 0 else None
             for m in ("prvr.harness", "prvr.harness.profiling.flops", "prvr.methods.backbones.msl",
                       "prvr.harness.a_new_module", "prvr.harness.engine.a_new_module", "prvr.harness.base.a_new_module")]
    assert names == ["plumbing", "profiling", "parts", None, "engine", None]


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


def folder_of(module: str, path: Path) -> str:
    """The folder of a module's file, relative to the checkout (`harness/engine`, `methods`, ...)."""
    part = ".".join(module.split(".")[:2])  # prvr.harness, prvr.datasets, prvr.methods
    return "/".join([part.split(".")[1], *module.split(".")[2:-1 if path.name != "__init__.py" else None]])


def folder_floor(folder: str) -> int:
    """The floor of a folder: its own, else that of the folder it is in (methods/backbones is methods')."""
    while True:
        for i, (_, folders) in enumerate(FOLDER_FLOORS):
            if folder in folders:
                return i
        if "/" not in folder:
            return -1
        folder = folder.rpartition("/")[0]


def folder_arrows(graph: Graph) -> set[tuple[str, str]]:
    return {(folder_of(a, graph.files[a]), folder_of(b, graph.files[b]))
            for a, targets in graph.arrows.items() for b in targets}


def test_every_folder_has_a_floor_and_only_its_floors_modules(graph):
    """A module's floor is its folder's: the floors are seen in the tree, not only in this file."""
    names = {i: name for i, (name, _) in enumerate(FOLDER_FLOORS)}
    wrong = [(m, names.get(folder_floor(folder_of(m, f))), FLOORS[floor_of(m)][0]) for m, f in graph.files.items()
             if names.get(folder_floor(folder_of(m, f))) != {"plumbing": "base", "contract": "base"}.get(
                 FLOORS[floor_of(m)][0], FLOORS[floor_of(m)][0])]
    assert wrong == [], f"modules whose folder is on another floor than their own: {wrong}"


def test_harness_holds_only_its_floors():
    """harness/ itself holds its package file and its floors' folders, no module of its own."""
    root = Path(importlib.util.find_spec("prvr.harness").submodule_search_locations[0])
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py"]
    assert {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == \
        {"base", "engine", "reports", "profiling", "cli"}


def test_no_folder_arrow_runs_up(graph):
    up = sorted((a, b) for a, b in folder_arrows(graph) if folder_floor(b) > folder_floor(a))
    assert up == [], f"folders that import a folder above them (FOLDER_FLOORS): {up}"


def test_folder_floors_are_read_from_paths():
    assert folder_of("prvr.harness.engine.trainer", Path("harness/engine/trainer.py")) == "harness/engine"
    assert folder_of("prvr.methods.backbones", Path("methods/backbones/__init__.py")) == "methods/backbones"
    assert folder_of("prvr.harness", Path("harness/__init__.py")) == "harness"
    assert [folder_floor(f) for f in ("methods/backbones", "harness/cli", "harness/base", "tests")] == [1, 5, 0, -1]


def summary(graph: Graph) -> dict[str, int]:
    return {"modules": len(graph.files), "arrows": sum(len(t) for t in graph.arrows.values()),
            "folder arrows": len({(a, b) for a, b in folder_arrows(graph) if a != b}),
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


# ----------------------------------------------------------------------------- no method named below the commands
# The folders that are every method's: none of their string constants names a registered method (or
# `method@backbone`, `method~tag`, `method+detector` of one); the runs they single out come from the specs
# (`reference`, `moment_reference`) and their lists from the registries. The commands' floor may name
# one (a method's own command, e.g. RAL's `uncertainty`). Each exception says why it is no method.
NAMELESS_FOLDERS = ("harness/base", "harness/engine", "harness/reports", "harness/profiling")
NOT_A_METHOD = {
    ("harness/engine/sections.py", "msl"): "data.layout: the MS-SL family's feature release, a file layout",
    ("harness/profiling/rehearsal.py", "msl"): "the export's layout (data.layout)",
    ("harness/profiling/reported.py", "msl"): "the papers' reported speeds, keyed by the method they measured",
    ("harness/profiling/reported.py", "gmmformer"): "the papers' reported speeds",
    ("harness/profiling/reported.py", "gmmformer2"): "the papers' reported speeds",
    ("harness/profiling/reported.py", "arl"): "the papers' reported speeds",
    ("harness/profiling/reported.py", "ral"): "the papers' reported speeds",
}


def method_names_in(source: str, methods: set[str]) -> list[str]:
    """The string constants of a source (docstrings left out) that name a method, alone or as the head
    of a run name (`ral@msl`, `arl~base`, `baseline+oracle`)."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            head = re.split(r"[@~+]", node.value, maxsplit=1)[0]
            if head in methods and (head == node.value or len(node.value) > len(head)):
                found.append(node.value)
    return found


def test_no_method_is_named_below_the_commands():
    from prvr.harness.base.registry import METHODS, load_all

    load_all()
    methods = set(METHODS.names())
    root = Path(importlib.util.find_spec("prvr.harness").submodule_search_locations[0]).parent
    named, excused = [], set()
    for folder in NAMELESS_FOLDERS:
        for f in sorted((root / folder).rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            found = {(rel, s) for s in method_names_in(f.read_text(encoding="utf-8"), methods)}
            excused |= found & NOT_A_METHOD.keys()
            named += sorted(found - NOT_A_METHOD.keys())
    assert named == [], f"method names below the commands (use the specs' flags or the registries): {named}"
    assert sorted(NOT_A_METHOD.keys() - excused) == [], "gone: remove them from NOT_A_METHOD"


def test_method_names_are_found():
    source = '"""A docstring naming ral."""\nA = "ral@msl"\nB = "arl~base"\nC = "baseline"\nD = "rally"\nE = f"{x}~ral"\n'
    assert method_names_in(source, {"ral", "arl", "baseline"}) == ["ral@msl", "arl~base", "baseline"]
