"""Tests over the registries: each is parametrised over what is registered, so a new method,
backbone, detector, objective or dataset is tested by existing, without editing a test.

- `import prvr.methods` imports every module of its package (auto-registration), in sorted
  order, and a module that fails to import stops it with its own error.
- Every method, on sim-tiny with its own backbone and detector, trains two optimisation steps
  through `build_run` and the trainer (at an epoch past every warm-up and hard-negative start)
  with a finite loss, and the evaluator gives a finite SumR.
- Every method names the registered objective parts it combines (`MethodSpec.objectives`),
  exactly those its objective calls.
- Every method on every backbone resolves for every dataset preset, real datasets included,
  without reading a file other than the presets; a backbone that `check_fit` refuses is refused
  for every dataset.

Covered elsewhere, not repeated here: every method's objective on every backbone that
`check_fit` accepts (one step with a backward pass) and every detector on every backbone
(tests/test_fit.py); every preset value passing its checks (tests/test_config_checks.py,
`test_every_preset_passes_the_checks`); every backbone's contract (tests/test_backbones.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import pytest
import torch

import prvr.methods
from prvr.harness.engine.build import build_run
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS, OBJECTIVES, import_modules
from prvr.methods.backbones.api import missing_outputs

LATE_EPOCH = 50  # past every method's warm-up and hard-negative start on sim-tiny


# ----------------------------------------------------------------------------- auto-registration
def test_importing_prvr_methods_imports_every_module_of_its_package():
    root = Path(prvr.methods.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        names.add(".".join(("prvr.methods", *(parts[:-1] if parts[-1] == "__init__" else parts))))
    assert len(names) > 10 and names - set(sys.modules) == set()


def _package(tmp_path: Path, name: str, modules: dict[str, str]) -> None:
    for rel, text in modules.items():
        path = tmp_path / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_import_modules_goes_depth_first_in_sorted_order(on_path):
    log = "import builtins\nbuiltins.IMPORTED = [*getattr(builtins, 'IMPORTED', []), __name__]\n"
    _package(on_path, "autoreg_ok", {"__init__.py": "", "b.py": log, "a.py": log, "sub/__init__.py": log,
                                     "sub/z.py": log, "c.py": log})
    import builtins

    try:
        done = import_modules("autoreg_ok")
        order = builtins.IMPORTED
    finally:
        builtins.__dict__.pop("IMPORTED", None)
    expected = ["autoreg_ok.a", "autoreg_ok.b", "autoreg_ok.c", "autoreg_ok.sub", "autoreg_ok.sub.z"]
    assert done == expected and order == expected


def test_a_module_that_fails_to_import_raises_its_own_error_naming_the_module(on_path):
    _package(on_path, "autoreg_bad", {"__init__.py": "", "a.py": "", "sub/__init__.py": "",
                                      "sub/broken.py": "raise ValueError('a bug in this file')\n", "z.py": ""})
    with pytest.raises(ValueError, match="a bug in this file") as e:
        import_modules("autoreg_bad")
    notes = getattr(e.value, "__notes__", [])
    assert len(notes) == 1 and "autoreg_bad.sub.broken" in notes[0]
    assert "autoreg_bad.z" not in sys.modules  # it stops there; nothing after it is imported silently


# ----------------------------------------------------------------------------- every method trains and evaluates
class Stop(Exception):
    pass


class StopAfter:
    """Trainer hook: keep each step's loss, end the epoch after `n` steps (as `prvr-bench
    profile` does, harness/profiling/training.py)."""

    def __init__(self, n: int) -> None:
        self.n, self.losses = n, []

    def on_epoch_start(self, trainer, epoch: int) -> None:
        pass

    def on_step(self, trainer, step: int, out: dict) -> None:
        self.losses.append(float(out["loss"]))
        if len(self.losses) >= self.n:
            raise Stop

    def on_epoch_end(self, trainer, epoch: int, summary: dict) -> None:
        pass


@pytest.mark.detects
@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_trains_two_steps_on_sim_tiny_and_evaluates(method, tmp_path):
    """Its own backbone and detector, built as `prvr-bench run` builds them; the two steps are
    taken at a late epoch so that every warm-up and hard-negative schedule is past (the ARL
    detector runs its per-epoch pass and detects)."""
    cfg = resolve(method, "sim-tiny", 0, ["train.batch_size=8", "train.device=cpu", "train.num_workers=0"])
    spec = METHODS.get(method)
    assert (cfg.backbone, cfg.relations.name) == (spec.backbone, spec.relations)
    run = build_run(cfg)
    stop = StopAfter(2)
    trainer = run.trainer(tmp_path / "ckpt", [stop])
    before = [p.detach().clone() for p in run.model.parameters()]
    with pytest.raises(Stop):
        trainer.train_epoch(LATE_EPOCH)
    assert len(stop.losses) == 2 and all(math.isfinite(v) for v in stop.losses), stop.losses
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters())), "no weight changed"
    metrics = trainer.evaluate("val")
    assert math.isfinite(metrics["SumR"]) and 0 <= metrics["SumR"] <= 400
    assert metrics["n"] == run.data["val"].num_queries


# ----------------------------------------------------------------------------- objectives
def registered_parts(fn, found: set[str] | None = None, seen: set[int] | None = None) -> set[str]:
    """The registered objectives (OBJECTIVES) that `fn` calls by a global name, directly or
    through helpers of prvr.methods that are not registered themselves; a registered part is a
    leaf (what it calls is its own business)."""
    found, seen = set() if found is None else found, set() if seen is None else seen
    parts = {id(e.obj): e.name for e in OBJECTIVES.entries()}
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if hasattr(c, "co_names")]  # nested functions, comprehensions
        for name in code.co_names:
            obj = fn.__globals__.get(name)
            if id(obj) in parts:
                found.add(parts[id(obj)])
            elif (callable(obj) and hasattr(obj, "__code__") and id(obj) not in seen
                  and getattr(obj, "__module__", "").startswith("prvr.methods")):
                seen.add(id(obj))
                registered_parts(obj, found, seen)
    return found


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_names_the_registered_objectives_its_objective_combines(method):
    spec = METHODS.get(method)
    for name in spec.objectives:
        OBJECTIVES.get(name)  # registered (an unknown name is answered with the known ones)
    assert len(set(spec.objectives)) == len(spec.objectives), spec.objectives
    assert set(spec.objectives) == registered_parts(spec.objective), (
        f"MethodSpec.objectives of '{method}' must name the registered objectives its objective calls")


def test_every_registered_objective_is_combined_by_a_method():
    # a registration only tests use is dead weight in `prvr-bench list`; a test calls the function itself
    used = {name for e in METHODS.entries() for name in e.obj.objectives}
    unused = [name for name in OBJECTIVES.names() if name not in used]
    assert not unused, f"registered objectives no method's `objectives` names: {', '.join(unused)}"


def test_the_objective_walk_finds_parts_through_helpers():
    # via two_branch_ranking, two_branch_restrained and two_branch_soft; the query-matrix parts directly
    assert registered_parts(METHODS.get("msl").objective) == {"msl-triplet", "infonce", "restrained-triplet",
                                                              "soft-infonce", "query-matrix-nce", "query-matrix-triplet"}


# ----------------------------------------------------------------------------- presets resolve without data
WATCHED = None  # a list while a test records file access (an audit hook cannot be removed, so it stays idle)
EVENTS = ("open", "os.listdir", "os.scandir", "os.mkdir", "os.remove", "os.rename", "os.rmdir", "glob.glob",
          "shutil.copyfile", "shutil.rmtree")


def _audit(event: str, args: tuple) -> None:
    if WATCHED is not None and event in EVENTS:
        WATCHED.append((event, str(args[0]) if args else ""))


sys.addaudithook(_audit)
PRESETS = {str(Path(r.get(n).preset)) for r in (METHODS, DATASETS) for n in r.names() if r.get(n).preset}


def touched_during(fn) -> list[tuple[str, str]]:
    """What `fn` opened, listed, made or removed, apart from the preset YAML files it read."""
    global WATCHED
    WATCHED = []
    try:
        fn()
    finally:
        seen, WATCHED = WATCHED, None
    return [(e, p) for e, p in seen if not (e == "open" and p in PRESETS)]


PAIRS = [(m, b) for m in METHODS.names() for b in BACKBONES.names()]


@pytest.mark.parametrize("method, backbone", PAIRS, ids=[f"{m}@{b}" for m, b in PAIRS])
def test_every_method_on_every_backbone_resolves_for_every_dataset_without_its_data(method, backbone, tmp_path,
                                                                                   monkeypatch):
    """Real datasets resolve with no data anywhere (`PRVR_DATA` an absent folder): resolving reads
    the presets and nothing else. A backbone that check_fit refuses (the method's objective or
    detector needs an output it lacks) is refused for every dataset, in one line."""
    monkeypatch.setenv("PRVR_DATA", str(tmp_path / "absent"))
    monkeypatch.setenv("PRVR_CACHE", str(tmp_path / "absent-cache"))
    spec = METHODS.get(method)
    fits = not missing_outputs(spec.needs | DETECTORS.get(spec.relations).needs, BACKBONES.get(backbone))
    if fits:
        resolve(method, "sim-tiny", 0, [f"backbone={backbone}"])  # once unwatched: its lazy imports open files
    for dataset in DATASETS.names():
        if not fits:
            with pytest.raises(UserError, match=f"cannot train backbone '{backbone}'"):
                resolve(method, dataset, 0, [f"backbone={backbone}"])
            continue
        cfgs = []
        touched = touched_during(lambda: cfgs.append(resolve(method, dataset, 0, [f"backbone={backbone}"])))
        assert touched == [], f"{method}@{backbone} on {dataset} touched {touched}"
        assert cfgs[0].backbone == backbone and isinstance(cfgs[0].model, BACKBONES.get(backbone).config_cls)
    assert not (tmp_path / "absent").exists() and not (tmp_path / "absent-cache").exists()


def test_the_file_watch_sees_a_read():
    path = Path(prvr.methods.__file__)
    assert touched_during(lambda: path.read_text(encoding="utf-8")) == [("open", str(path))]


def test_the_moment_tables_reference_is_registered_by_its_method():
    """The leaderboard's moment table compares with the one method whose spec says so (XML's,
    methods/xml.py), not with a name kept in the leaderboard."""
    from prvr.harness.reports.rows import moment_baseline

    assert moment_baseline() == "xml"
    assert [n for n in METHODS.names() if METHODS.get(n).moment_reference] == ["xml"]


def test_commands_register_themselves_and_no_part_knows_the_command_line(capsys):
    """Every command module of harness/cli/ registers what it adds (`args.command`); the methods'
    own commands (RAL's `uncertainty`, the SBERT detector's `census`) and analyses (GMMFormer v2's
    `--fusion-weights`) register from their command modules there, so no method, detector or
    dataset file imports the command line, and no module path is written as a string."""
    import inspect

    from prvr.harness.cli import app
    from prvr.harness.cli.args import COMMANDS, load_commands

    load_commands()
    from prvr.harness.cli.reevaluate import EVALUATIONS

    with pytest.raises(SystemExit):
        app.main(["--help"])
    out = capsys.readouterr().out
    assert {"census", "uncertainty", "run", "bench", "evaluate", "calibrate-world"} <= set(COMMANDS.names())
    assert "census" in out and "uncertainty" in out
    for entry in COMMANDS.entries():
        assert entry.obj.__module__.startswith("prvr.harness.cli."), entry.name
        assert inspect.getsource(entry.obj)  # a function, not a module path
    assert EVALUATIONS.get("fusion-weights").rows.__module__ == "prvr.harness.cli.fusion_weights"
    for folder in ("methods", "datasets", "harness/base", "harness/engine", "harness/reports", "harness/profiling"):
        for f in (ROOT / folder).rglob("*.py"):
            assert "prvr.harness.cli" not in f.read_text(encoding="utf-8"), f"{f} names the command line"


# ----------------------------------------------------------------------------- the contract at registration
def test_the_registries_check_the_members_of_the_contract_protocols():
    """BACKBONES and DETECTORS check the members of contract.Backbone / RelationDetector when a
    class registers; the lists they check are the protocols' own members."""
    from prvr.harness.base import contract, registry

    for registry_members, protocol in ((registry.BACKBONE_MEMBERS, contract.Backbone),
                                       (registry.DETECTOR_MEMBERS, contract.RelationDetector)):
        own = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
        assert set(registry_members) == own | set(protocol.__annotations__), protocol.__name__
    for cls in (BACKBONES.get(n) for n in BACKBONES.names()):
        assert all(hasattr(cls, m) for m in registry.BACKBONE_MEMBERS), cls


def test_a_backbone_without_a_member_of_the_contract_is_refused_at_registration_in_one_line():
    from prvr.harness.base.registry import Registry, RegistryError

    backbones = Registry("backbone", ("config_cls", "provides", "encode_queries", "score"), "Backbone")

    class NoScore(torch.nn.Module):
        config_cls = object
        provides = frozenset()

        def encode_queries(self, batch):
            return {}

    with pytest.raises(RegistryError) as err:
        backbones.add("no-score", NoScore)
    message = str(err.value)
    assert "\n" not in message and "backbone 'no-score'" in message and "lacks score of the Backbone contract" in message
    assert "no-score" not in backbones
