"""docs/adding-a-method.md stays true: its code blocks, written to a temporary folder (never into
the repository), register as they would from the files they name; each example's list of files
is the list of files its blocks declare; the guide's own tests pass; the toy detector and the
toy method train one epoch on sim-tiny through `build_run` and evaluate; the preset means what
the guide says; and the guide's `prvr-bench` commands on sim-tiny run. Every registration and
import is removed afterwards (the registries are global)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import json
import math
import re
import shlex
import sys
from pathlib import Path

import pytest

import prvr.methods.recipes as recipes
from prvr.harness.engine.build import build_run
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS, OBJECTIVES
from prvr.methods.fit import check_fit
from test_registries import registered_parts

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-a-method.md"
BLOCK = re.compile(r"<!-- (file|edit): (\S+) -->\n```(\w+)\n(.*?)\n```\n", re.S)
LISTED = re.compile(r"^- (Add|Edit): (.*)$", re.M)
PATH = re.compile(r"`([\w./-]+\.(?:py|yaml|yml|md))`")


def examples() -> dict[str, str]:
    """{title: text} of each '## Example' section of the guide."""
    parts = re.split(r"^## ", GUIDE.read_text(encoding="utf-8"), flags=re.M)
    return {p.splitlines()[0]: p for p in parts if p.startswith("Example")}


def blocks(text: str) -> list[tuple[str, str, str, str]]:
    """(file | edit, path, language, code) of each marked block."""
    return BLOCK.findall(text)


def test_each_examples_file_list_is_the_files_its_blocks_declare():
    found = examples()
    assert len(found) == 2, list(found)
    for title, text in found.items():
        listed = {kind: PATH.findall(line) for kind, line in LISTED.findall(text)}
        declared = {kind: [path for k, path, _, _ in blocks(text) if k == kind] for kind in ("file", "edit")}
        assert sorted(listed.get("Add", [])) == sorted(declared["file"]), title
        assert sorted(listed.get("Edit", [])) == sorted(declared["edit"]), title
        for path in declared["edit"]:
            assert (ROOT / path).is_file(), f"{title}: edits {path}, which does not exist"
        for path in declared["file"]:
            assert not (ROOT / path).exists(), f"{title}: {path} exists in the repository; rename the example"
    # every marked block lies in an example
    assert sum(len(blocks(t)) for t in found.values()) == len(blocks(GUIDE.read_text(encoding="utf-8")))


def test_the_file_counts_stay_small():
    """The point of auto-registration: a detector in 1-2 new files, a method in 3-4 (+ its test)."""
    counts = {title.split(":")[0]: [p for k, p, _, _ in blocks(t) if k == "file" and not p.startswith("tests/")]
              for title, t in examples().items()}
    assert [len(v) for v in counts.values()] == [1, 4], counts


class GuideFinder(importlib.abc.MetaPathFinder):
    """Imports the guide's modules by the names their files would have in the repository."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, name, path=None, target=None):
        if name in self.files:
            return importlib.util.spec_from_file_location(name, self.files[name])
        return None


def module_name(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return "prvr." + ".".join(parts) if parts[0] == "methods" else "guide_" + "_".join(parts)


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """The guide's files under a temporary folder, imported in sorted order of module names
    (as `import prvr.methods` imports a package's files); everything undone afterwards."""
    root = tmp_path_factory.mktemp("guide")
    files, modules = {}, {}
    for text in examples().values():
        for kind, path, _, code in blocks(text):
            if kind != "file":
                continue
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code + "\n", encoding="utf-8")
            files[path] = target
            if path.endswith(".py"):
                modules[module_name(path)] = target
    registries = (METHODS, BACKBONES, DETECTORS, OBJECTIVES, DATASETS)
    before = {id(r): set(r._entries) for r in registries}
    tables = set(recipes.TABLES)
    finder = GuideFinder(modules)
    sys.meta_path.insert(0, finder)
    presets, recipes.PRESETS = recipes.PRESETS, root / "methods" / "presets"  # the method's `PRESETS / "<name>.yaml"`
    try:
        imported = {name: importlib.import_module(name) for name in sorted(modules)}
    finally:
        recipes.PRESETS = presets
    try:
        yield {"root": root, "files": files, "modules": imported}
    finally:
        sys.meta_path.remove(finder)
        for r in registries:
            for name in set(r._entries) - before[id(r)]:
                r._entries.pop(name)
        for key in set(recipes.TABLES) - tables:
            recipes.TABLES.pop(key)
        for name in set(modules) & set(sys.modules):
            parent, _, child = name.rpartition(".")
            if parent in sys.modules and getattr(sys.modules[parent], child, None) is sys.modules[name]:
                delattr(sys.modules[parent], child)
            del sys.modules[name]


def test_the_guide_registers_its_parts_and_writes_nothing_into_the_repository(guide):
    assert "topk-sim" in DETECTORS and "hinge" in METHODS and "all-negatives-hinge" in OBJECTIVES
    assert ("hinge", "1") in recipes.TABLES
    for path in guide["files"]:
        assert not (ROOT / path).exists(), path
    for module in guide["modules"].values():
        assert Path(module.__file__).is_relative_to(guide["root"])


def test_the_guides_own_tests_pass(guide, tmp_path):
    ran = []
    for name, module in guide["modules"].items():
        for fname, fn in vars(module).items():
            if fname.startswith("test_") and callable(fn):
                args = {"tmp_path": tmp_path / fname} if "tmp_path" in inspect.signature(fn).parameters else {}
                fn(**args)
                ran.append(f"{name}.{fname}")
    assert len(ran) == 3, ran


def train_one_epoch(method: str, overrides: list[str], tmp_path: Path) -> tuple[dict, dict]:
    cfg = resolve(method, "sim-tiny", 0, ["train.device=cpu", "train.num_workers=0", *overrides])
    trainer = build_run(cfg).trainer(tmp_path / "ckpt")
    summary = trainer.train_epoch(0)
    assert math.isfinite(summary["loss"]), summary
    metrics = trainer.evaluate("val")
    assert math.isfinite(metrics["SumR"]), metrics
    return summary, metrics


def test_the_toy_detector_trains_one_epoch_and_reports(guide, tmp_path):
    summary, _ = train_one_epoch("baseline", ["relations=topk-sim", "relations.topk-sim.warmup=0"], tmp_path)
    assert summary["relations"] == {"active": True, "ambiguous_per_query": 2.0}
    summary, _ = train_one_epoch("baseline", ["relations=topk-sim"], tmp_path)  # epoch 0 is in its warm-up
    assert summary["relations"] == {"active": False, "ambiguous_per_query": 0.0}
    assert DETECTORS.get("topk-sim").needs == frozenset()  # it reads Scores.fused: every backbone fits
    check_fit("hinge", "dual-branch", "topk-sim")


def test_the_toy_method_trains_one_epoch_with_its_parts(guide, tmp_path):
    spec = METHODS.get("hinge")
    assert registered_parts(spec.objective) == set(spec.objectives) == {"all-negatives-hinge", "infonce"}
    summary, _ = train_one_epoch("hinge", [], tmp_path)
    assert {"clip_hinge", "clip_nce", "frame_hinge", "frame_nce"} <= set(summary)
    summary, _ = train_one_epoch("hinge", ["relations=topk-sim", "relations.topk-sim.warmup=0"], tmp_path)
    assert summary["relations"]["ambiguous_per_query"] == 2.0


def test_the_toy_preset_means_what_the_guide_says(guide):
    assert resolve("hinge", "sim-tiny", 0).loss.margin == pytest.approx(0.05)  # per_dataset.sim-tiny
    assert resolve("hinge", "sim-tvr", 0).loss.margin == pytest.approx(0.1)  # per_dataset.tvr, by family
    assert resolve("hinge", "charades", 0).loss.margin == pytest.approx(0.2)  # the dataclass default
    own, other = resolve("hinge", "sim-tiny", 0), resolve("hinge", "sim-tiny", 0, ["backbone=msl"])
    assert own.train.lr == pytest.approx(4.0e-4) and other.train.lr == pytest.approx(1.0e-4)  # backbones.msl
    assert other.model == resolve("msl", "sim-tiny", 0).model  # msl's model settings from its home preset
    with pytest.raises(UserError, match="cannot train backbone 'arl'"):
        resolve("hinge", "sim-tiny", 0, ["backbone=arl"])


def guide_commands() -> list[list[str]]:
    """The `prvr-bench` lines of the guide's bash blocks."""
    text = GUIDE.read_text(encoding="utf-8")
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("prvr-bench ")]


def test_the_guides_commands_on_sim_tiny_run(guide, tmp_path, capsys):
    commands = guide_commands()
    ran = 0
    for args in commands:
        if args[0] == "run" and "sim-tiny" in args:
            args = [*args, "--set", "train.epochs=1", "--out", str(tmp_path), "--quiet"]
        elif args[0] not in ("list", "config"):
            continue  # trains on sim-tvr: not here
        assert main(args) == 0, (args, capsys.readouterr().err)
        ran += 1
    out = capsys.readouterr().out
    assert "objectives: all-negatives-hinge, infonce" in out and "topk-sim" in out  # prvr-bench list
    assert ran == 7
    runs = sorted(p.parent.name for p in tmp_path.glob("runs/sim-tiny/*/seed0.json"))
    assert runs == ["baseline+topk-sim", "baseline+topk-sim~k4", "hinge", "hinge+topk-sim", "hinge@msl"]
    record = json.loads((tmp_path / "runs" / "sim-tiny" / "baseline+topk-sim~k4" / "seed0.json").read_text())
    assert record["config"]["relations"]["topk-sim"]["k"] == 4


def test_the_paper_sized_methods_table_names_its_files_and_what_they_register():
    """The guide's RAL section: each file exists, and what its table says each registers is
    registered, by that file."""
    from prvr.harness.cli.args import COMMANDS, load_commands

    load_commands()

    text = re.split(r"^## ", GUIDE.read_text(encoding="utf-8"), flags=re.M)
    (section,) = [p for p in text if p.startswith("A paper-sized method: RAL")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    files = [PATH.findall(row.split(" | ")[0])[0] for row in rows]
    assert files == ["methods/objectives/ral.py", "methods/backbones/ral.py", "methods/ral.py",
                     "methods/presets/ral.yaml", "harness/cli/ral_uncertainty.py", "docs/methods/ral.md"]
    assert all((ROOT / f).is_file() for f in files)
    spec = METHODS.get("ral")
    assert spec.extends_backbone and spec.wrap is not None and "ral" in spec.sections
    assert spec.preset == ROOT / "methods" / "presets" / "ral.yaml"
    for name in spec.objectives:
        assert name in section and inspect.getsourcefile(OBJECTIVES.get(name)).endswith("methods/objectives/ral.py")
    assert inspect.getsourcefile(spec.wrap).endswith("methods/ral.py")
    assert COMMANDS.get("uncertainty").__module__ == "prvr.harness.cli.ral_uncertainty" and '@command("uncertainty"' in section
    assert "RalModel" in section and "RalModel" in (ROOT / "methods" / "backbones" / "ral.py").read_text()
    assert "methods/ral.md" in (ROOT / "mkdocs.yml").read_text()
