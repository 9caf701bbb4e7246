"""Every config field declares the values it accepts (harness/base/checks.py); every default and
every preset passes; a bad value is a one-line UserError naming the key.

The classes are found through the registries, so a newly registered method, backbone, method
section or detector settings class (section `relations.<name>`) is covered here without editing
this file."""

import glob
import json
import math
import os
import typing
from dataclasses import dataclass, fields

import pytest

from prvr.harness.base.checks import FLAG, Device, Free, ListOf, OneOf, Range, Registered, check_section, declared, param
from prvr.harness.engine.config import from_dict, resolve
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS
from prvr.harness.engine.sections import Config, DataConfig, EvalConfig, RelationsConfig, SimConfig, TrainConfig


def config_classes() -> list[tuple[str, str, type]]:
    """(where it comes from, config section, dataclass) for the harness and every registration."""
    found = [("harness", name, cls) for name, cls in (("data", DataConfig), ("sim", SimConfig), ("train", TrainConfig),
                                                       ("relations", RelationsConfig), ("eval", EvalConfig))]
    for e in BACKBONES.entries():
        found.append((f"backbone {e.name}", "model", e.obj.config_cls))
    for e in METHODS.entries():
        found.append((f"method {e.name}", "loss", e.obj.loss_cls))
        found += [(f"method {e.name}", name, cls) for name, cls in e.obj.sections.items()]
    for e in DETECTORS.entries():
        if e.obj.config_cls is not None:
            found.append((f"detector {e.name}", f"relations.{e.name}", e.obj.config_cls))
    return found


CLASSES = config_classes()
IDS = [f"{where}: {cls.__name__}" for where, _, cls in CLASSES]


@pytest.mark.parametrize("where, key, cls", CLASSES, ids=IDS)
def test_every_field_declares_a_check(where, key, cls):
    missing = [f.name for f in fields(cls) if declared(f) is None]
    assert not missing, f"{cls.__name__} ({where}): write {', '.join(missing)} with param(default, check)"


@pytest.mark.parametrize("where, key, cls", CLASSES, ids=IDS)
def test_every_default_passes_its_own_check(where, key, cls):
    cfg = resolve("baseline", "sim-tiny", 0)
    check_section(cls(), key, "the defaults", cfg)  # the fields' checks, then the class's own check(key)


def _fixed_choices(chk) -> tuple[str, ...] | None:
    """The words a check accepts when they are a fixed set (None: not a choice, or one that
    depends on the config, as data.scale on the dataset's scales)."""
    if isinstance(chk, ListOf):
        return _fixed_choices(chk.item)
    if isinstance(chk, OneOf) and not callable(chk.choices):
        return tuple(chk.choices)
    return None


@pytest.mark.parametrize("where, key, cls", CLASSES, ids=IDS)
def test_fixed_choices_are_read_from_the_fields_literal_type(where, key, cls):
    # one list: the field's annotation is a Literal alias (a list of one) and its check's words are the alias's
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        words = _fixed_choices(declared(f))
        if words is None:
            continue
        tp = hints[f.name]
        if typing.get_origin(tp) is list:
            (tp,) = typing.get_args(tp)
        assert typing.get_origin(tp) is typing.Literal, f"{cls.__name__}.{f.name}: annotate it with a Literal alias"
        assert typing.get_args(tp) == words, f"{cls.__name__}.{f.name}: build its check with one_of(<its alias>)"


def test_the_tables_keyed_by_a_choice_cover_every_choice():
    from prvr.datasets.real.store import LAYOUTS, Layout
    from prvr.harness.engine.sections import SELECT_ON, SelectOn
    from prvr.methods.relations.arl import VARIANTS, VariantName
    from prvr.methods.xml import CONDITIONS, Condition

    for table, alias in ((LAYOUTS, Layout), (SELECT_ON, SelectOn), (VARIANTS, VariantName), (CONDITIONS, Condition)):
        assert tuple(table) == typing.get_args(alias)


def test_config_scalars_declare_checks_and_sections_are_marked():
    for f in fields(Config):
        assert f.metadata.get("section") or declared(f) is not None, f.name


@pytest.mark.parametrize("method", METHODS.names())
@pytest.mark.parametrize("dataset", DATASETS.names())
def test_every_preset_passes_the_checks(method, dataset):
    resolve(method, dataset, 0)  # resolve checks every value


def test_committed_records_still_load():
    from prvr.harness.reports.leaderboard import RECORD_NAME

    paths = [p for p in glob.glob("results/runs/*/*/seed*.json") if RECORD_NAME.fullmatch(os.path.basename(p))]
    assert paths  # run from the repository root
    for path in paths:  # figures written beside a record (seed0.fig4.json) are not records
        with open(path, encoding="utf-8") as f:
            from_dict(json.load(f)["config"], path)


def test_a_field_without_a_check_is_a_bug_not_input():
    @dataclass
    class Loose:
        ok: int = param(1, Range(0, integer=True))
        loose: int = 3

    with pytest.raises(TypeError, match="Loose.loose declares no check"):
        check_section(Loose(), "loss", "test")


# ----------------------------------------------------------------------------- every declared check fires
def bad_value(chk) -> str | None:
    """A --set value that the check must refuse (None: the check accepts anything)."""
    if isinstance(chk, Range):
        if chk.low is None:
            return "nan"
        return repr(chk.low - 1 if chk.integer else chk.low - (0 if chk.low_open else 0.5))
    if isinstance(chk, (OneOf, Registered)):
        return "no-such-choice"
    if isinstance(chk, ListOf):  # too short, or (where [] is allowed) an item its check refuses
        return "[]" if chk.min_length > 0 else f"[{bad_value(chk.item)}]"
    if isinstance(chk, Device):
        return "gpu"
    assert isinstance(chk, Free) or chk is FLAG, f"no bad value known for {chk!r}"
    return None


def owner_args(where: str) -> tuple[str, list[str]]:
    """The method and overrides under which a class is the config's section."""
    kind, _, name = where.partition(" ")
    if kind == "backbone":  # the method built on it (its preset fits it), else the baseline on it
        owners = [e.name for e in METHODS.entries() if e.obj.backbone == name]
        return (owners[0], []) if owners else ("baseline", [f"backbone={name}"])
    if kind == "detector":  # the method whose own detector it is, else the baseline with it
        owners = [e.name for e in METHODS.entries() if e.obj.relations == name]
        return (owners[0], []) if owners else ("baseline", [f"relations={name}"])
    return (name, []) if kind == "method" else ("baseline", [])


FIELD_CASES = [(where, key, f.name, bad_value(declared(f))) for where, key, cls in CLASSES for f in fields(cls)
               if bad_value(declared(f)) is not None]


@pytest.mark.parametrize("where, key, name, value", FIELD_CASES,
                         ids=[f"{w}: {k}.{n}={v}" for w, k, n, v in FIELD_CASES])
def test_each_declared_check_refuses_a_bad_value_in_one_line(where, key, name, value):
    method, extra = owner_args(where)
    with pytest.raises(UserError) as err:
        resolve(method, "sim-tiny", 0, [*extra, f"{key}.{name}={value}"])
    message = str(err.value)
    assert f"'{key}.{name}'" in message and "(from --set)" in message and "\n" not in message


# ----------------------------------------------------------------------------- the inputs
@pytest.mark.parametrize("override, message", [
    ("train.lr=-1", r"config key 'train.lr' must be a finite number > 0, got -1.0 \(from --set\)"),
    ("train.lr=nan", r"config key 'train.lr' must be a finite number > 0, got nan"),
    ("train.lr=inf", r"config key 'train.lr' must be a finite number > 0, got inf"),
    ("train.lr=-inf", r"'train.lr' must be a finite number > 0, got -inf"),
    ("train.epochs=0", r"'train.epochs' must be an integer >= 1, got 0"),
    ("train.batch_size=0",
     r"'train.batch_size' must be an integer >= 2 \(a batch of one video has no negative\), got 0"),
    ("train.batch_size=-3",
     r"'train.batch_size' must be an integer >= 2 \(a batch of one video has no negative\), got -3"),
    ("eval.chunk=0", r"'eval.chunk' must be an integer >= 1, got 0"),
    ("model.hidden=-4", r"'model.hidden' must be an integer >= 1, got -4"),
    ("model.hidden=63", r"'model.hidden' \(63\) must be a multiple of 'model.heads' \(2\)"),
    ("sim.mislabel_rate=2", r"'sim.mislabel_rate' must be a finite number in \[0, 1\], got 2.0"),
    ("train.patience=-1", r"'train.patience' must be an integer >= 1, got -1"),
    ("train.warmup_frac=1.5", r"'train.warmup_frac' must be a finite number in \[0, 1\), got 1.5"),
    ("train.decay=cosin", r"config key 'train.decay' must be one of cosine, linear, constant, warmup_linear, "
                          r"got 'cosin' \(from --set\)"),
    ("train.optimizer=sgd", r"'train.optimizer' names an unknown optimizer 'sgd': known: adamw, bertadam"),
    ("relations.name=oracel", r"'relations.name' names an unknown relation detector 'oracel': did you mean 'oracle'"),
    ("data.on_bad_rows=warn", r"'data.on_bad_rows' must be one of error, skip"),
    ("data.layout=tvr", r"'data.layout' must be one of msl, xml"),
    ("data.pooling=max", r"'data.pooling' must be one of even, reference"),
    ("train.device=gpu", r"'train.device' must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("sim.mv_fractions=[0.5, 0.5]", r"'sim.mv_fractions' must be a list of 3 items, each a finite number in \[0, 1\], "
                                    r"summing to 1"),
    ("sim.mv_fractions=[0.5, 0.4, 0.2]", r"'sim.mv_fractions' must be .* summing to 1, got \[0.5, 0.4, 0.2\]"),
    ("sim.mv_fractions=[1.5, -0.5, 0.0]", r"'sim.mv_fractions' must be"),
    ("loss.branches=[clip, clip]", r"'loss.branches' must be a list of at least 1 distinct items"),
    ("eval.splits=[val, dev]", r"'eval.splits' must be a list of at least 1 distinct items, each of train, val, test"),
    ("seed=-2", r"--set seed=\.\.\.: the seed of a run is the command line's; use --seed instead"),
    ("method=msl", r"--set method=\.\.\.: the method of a run is the command line's; use --method instead"),
    ("dataset=sim-tvr", r"--set dataset=\.\.\.: the dataset of a run is the command line's; use --dataset instead"),
    ("train.grad_clip_unit=branch", r"'train.grad_clip_unit' must be one of tensor, reference, got 'branch'"),
    ("train.grad_clip_unit=reference", r"'train.grad_clip_unit' is 'reference', which only bertadam clips by .*"
                                       r"train.optimizer=adamw clips one global norm\); set train.optimizer=bertadam"),
])
def test_bad_values_name_the_key_and_the_valid_values(override, message):
    with pytest.raises(UserError, match=message) as err:
        resolve("baseline", "sim-tiny", 0, [override])
    assert "\n" not in str(err.value)


def test_a_seed_out_of_range_names_the_option():
    with pytest.raises(UserError, match=r"'seed' must be an integer in \[0, 4294967295\], got -2 \(from --seed\)"):
        resolve("baseline", "sim-tiny", -2)


@pytest.mark.parametrize("method, override, message", [
    ("arl", "loss.variant=tv", r"'loss.variant' must be one of base, tv_only, tv_tf, tv_cross, full, got 'tv'"),
    ("arl", "loss.treatment=drop", r"'loss.treatment' must be one of restrain, positive, ignore"),
    ("arl", "loss.margin_a=0.2", r"ARL needs loss.margin_a < loss.margin \(Eq. 11-12\), got 0.2 and 0.1"),
    ("arl", "relations.arl.similarity=test", r"'relations.arl.similarity' must be one of eval, train, got 'test'"),
    ("arl", "relations.arl.frame_thresholds=clip", r"'relations.arl.frame_thresholds' must be one of frame, video"),
    ("arl", "model.branches=3", r"'model.branches' must be an integer in \[1, 2\], got 3"),
    ("gmmformer", "model.widths=[]", r"'model.widths' must be a list of at least 1 items"),
    ("msl", "loss.hard_negative_epoch=-2", r"'loss.hard_negative_epoch' must be an integer >= -1 \(-1 = never\)"),
    ("msl", "loss.frame_matrix=frames", r"'loss.frame_matrix' must be one of videos, queries, got 'frames'"),
])
def test_method_knobs_are_checked(method, override, message):
    with pytest.raises(UserError, match=message):
        resolve(method, "sim-tiny", 0, [override])


def test_the_references_frame_matrix_takes_no_detector():
    with pytest.raises(UserError, match=r"'loss.frame_matrix' is 'queries' \(the reference's query x query frame "
                                        r"matrix.*takes no relation detector \(relations.name=oracle\); set it to videos"):
        resolve("msl", "sim-tiny", 0, ["relations.name=oracle", "loss.frame_matrix=queries"])
    assert resolve("msl", "sim-tiny", 0, ["loss.frame_matrix=queries"]).loss.frame_matrix == "queries"


def test_seed_argument_is_checked():
    with pytest.raises(UserError, match=r"config key 'seed' must be an integer .* got -1 \(from --seed\)"):
        resolve("baseline", "sim-tiny", -1)


def test_values_from_a_yaml_file_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: .nan\n")
    with pytest.raises(UserError, match=r"'train.lr' must be a finite number > 0, got nan \(from .*bad.yaml\)"):
        resolve("baseline", "sim-tiny", 0, [], bad)
    bad.write_text("train: 5\n")
    with pytest.raises(UserError, match=r"config key 'train' is a section: give it a mapping"):
        resolve("baseline", "sim-tiny", 0, [], bad)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:7"])
def test_cuda_without_cuda_is_one_line_at_resolve_time(monkeypatch, device):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=f"'train.device' is '{device}', but torch finds no CUDA device"):
        resolve("baseline", "sim-tiny", 0, [f"train.device={device}"])
    resolve("baseline", "sim-tiny", 0, ["train.device=cpu"])


def test_stored_configs_are_checked_too():
    good = resolve("baseline", "sim-tiny", 0).to_dict()
    assert from_dict(good).to_dict() == good
    bad = {**good, "train": {**good["train"], "lr": math.nan}}
    with pytest.raises(UserError, match=r"'train.lr' must be a finite number > 0, got nan \(from rec.json\)"):
        from_dict(bad, "rec.json")
    with pytest.raises(UserError, match="rec.json lacks config key.*method"):
        from_dict({k: v for k, v in good.items() if k != "method"}, "rec.json")
    with pytest.raises(UserError, match="rec.json is list"):
        from_dict([], "rec.json")
    # a record made on a GPU still loads where there is none
    gpu = {**good, "train": {**good["train"], "device": "cuda"}}
    assert from_dict(gpu).train.device == "cuda"


def test_detector_settings_are_the_section_relations_name():
    """Each detector's own settings are `relations.<name>`: checked like any section, and only
    for this run's detector (a preset's sections for other detectors are skipped)."""
    cfg = resolve("baseline", "sim-tiny", 0, ["relations=oracle", "relations.oracle.mode=ignore"])
    assert cfg.detector.mode == "ignore" and cfg.to_dict()["relations"] == {"name": "oracle", "oracle": {"mode": "ignore"}}
    with pytest.raises(UserError, match=r"'relations.oracle.mode' must be one of ignore, positive, got 'drop'"):
        resolve("baseline", "sim-tiny", 0, ["relations=oracle", "relations.oracle.mode=drop"])
    with pytest.raises(UserError, match=r"'relations.oracle' configures detector 'oracle', but this run's detector "
                                        r"is 'none' \(from --set\); set relations.name=oracle too"):
        resolve("baseline", "sim-tiny", 0, ["relations.oracle.mode=ignore"])
    with pytest.raises(UserError, match=r"detector 'none' has no settings"):
        resolve("baseline", "sim-tiny", 0, ["relations.none.x=1"])
    assert resolve("arl", "sim-tiny", 0).detector.similarity == "eval"  # arl's preset also configures the oracle
    assert resolve("arl", "sim-tiny", 0).to_dict()["relations"]["arl"]["frame_thresholds"] == "frame"


def test_records_with_the_old_detector_layout_load_with_the_same_settings():
    """Before `relations.<name>`, records stored relations.oracle_mode and a top-level `arl`."""
    from prvr.harness.engine.config import from_dict

    old = resolve("arl", "sim-tiny", 0, ["relations=oracle"]).to_dict()
    old["relations"] = {"name": "oracle", "oracle_mode": "ignore"}
    old["arl"] = {"video_chunk": 64}  # the ARL method's section then; the oracle run never used it
    assert from_dict(old).to_dict()["relations"] == {"name": "oracle", "oracle": {"mode": "ignore"}}
    arl = resolve("arl", "sim-tiny", 0, ["relations.arl.video_chunk=7"]).to_dict()
    settings = arl["relations"].pop("arl")
    arl["relations"]["oracle_mode"] = "positive"  # stored by every record, used by none but the oracle's
    arl["arl"] = settings
    again = from_dict(arl)
    assert again.detector.video_chunk == 7 and again.to_dict()["relations"] == {"name": "arl", "arl": settings}
