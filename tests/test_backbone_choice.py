"""`--method M --backbone B`: the method's objective on another backbone, with B's model settings
from B's home preset and the method's own `backbones.<B>` section over them."""

import dataclasses

import pytest
import yaml

from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.base.registry import home_method
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, METHODS
from prvr.harness.engine.runner import run_name


def test_own_backbone_is_unchanged_by_naming_it():
    plain = resolve("gmmformer", "tvr", 0)
    named = resolve("gmmformer", "tvr", 0, ["backbone=gmmformer"])
    assert plain.to_dict() == named.to_dict()


def test_another_backbone_takes_its_model_settings_from_its_home_preset():
    cfg = resolve("baseline", "tvr", 0, ["backbone=gmmformer"])
    assert isinstance(cfg.model, BACKBONES.get("gmmformer").config_cls)
    home = resolve("gmmformer", "tvr", 0)
    assert dataclasses.asdict(cfg.model) == dataclasses.asdict(home.model)  # dropout 0.2 from gmmformer's tvr section
    own = resolve("baseline", "tvr", 0)
    assert cfg.train == own.train and cfg.loss == own.loss  # the method's recipe stays its own
    assert run_name(cfg) == "baseline@gmmformer"


def test_the_methods_own_model_keys_never_reach_another_backbone():
    # msl's tvr section sets msl-only model keys; on gmmformer they would be unknown keys
    cfg = resolve("msl", "tvr", 0, ["backbone=gmmformer"])
    assert dataclasses.asdict(cfg.model) == dataclasses.asdict(resolve("gmmformer", "tvr", 0).model)


def test_every_backbone_has_a_home_method():
    for name in BACKBONES.names():
        home = home_method(name)
        assert home is not None and METHODS.get(home).backbone == name


@pytest.fixture
def toy_method(tmp_path):
    """A method registered for one test, with a preset that has a `backbones:` section."""
    preset = tmp_path / "toy.yaml"
    preset.write_text(yaml.safe_dump({
        "train": {"lr": 2.0e-4},
        "per_dataset": {"tvr": {"model": {"clip_weight": 0.6}}},
        "backbones": {"gmmformer": {"train": {"lr": 1.0e-5}, "per_dataset": {"tvr": {"model": {"dropout": 0.3}}}}},
    }))
    base = METHODS.get("baseline")
    METHODS.add("toy-choice", dataclasses.replace(base, name="toy-choice", preset=preset), "a test's method")
    yield "toy-choice"
    METHODS._entries.pop("toy-choice")


def test_a_methods_backbones_section_applies_on_that_backbone_only(toy_method):
    own = resolve(toy_method, "tvr", 0)
    assert own.train.lr == pytest.approx(2.0e-4) and own.model.clip_weight == pytest.approx(0.6)
    other = resolve(toy_method, "tvr", 0, ["backbone=gmmformer"])
    assert other.train.lr == pytest.approx(1.0e-5)  # backbones.gmmformer over the method's top level
    assert other.model.dropout == pytest.approx(0.3)  # backbones.gmmformer.per_dataset.tvr
    assert other.model.clip_weight == pytest.approx(0.7)  # the method's own-backbone model key did not leak
    assert other.model.input_dropout == pytest.approx(0.2)  # gmmformer's home tvr settings


def test_backbones_section_of_the_wrong_type_is_one_line(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("backbones:\n  gmmformer: 3\n")
    METHODS.add("toy-bad", dataclasses.replace(METHODS.get("baseline"), name="toy-bad", preset=preset), "")
    try:
        with pytest.raises(UserError, match=r"key 'backbones.gmmformer' must be a mapping"):
            resolve("toy-bad", "tvr", 0, ["backbone=gmmformer"])
    finally:
        METHODS._entries.pop("toy-bad")


def test_unknown_backbone_names_the_known_ones():
    with pytest.raises(UserError, match=r"unknown backbone 'gmmformr'.*did you mean 'gmmformer'"):
        resolve("baseline", "tvr", 0, ["backbone=gmmformr"])


def test_cli_backbone_flag(capsys):
    assert main(["config", "--method", "baseline", "--dataset", "tvr", "--backbone", "gmmformer"]) in (0, None)
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["backbone"] == "gmmformer" and "widths" in shown["model"]
