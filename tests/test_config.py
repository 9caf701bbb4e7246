import pytest
import yaml

from prvr.harness.engine.config import from_dict, resolve
from prvr.harness.engine.sections import Config
from prvr.harness.base.io import UserError


def test_presets_layer_in_order():
    cfg = resolve("baseline", "sim-tiny", 3)
    assert cfg.seed == 3 and cfg.dataset == "sim-tiny"
    assert cfg.sim.video_dim == 48  # dataset preset
    assert cfg.model.hidden == 64  # dataset preset reaches the backbone section
    assert cfg.relations.name == "none"  # method default


def test_set_overrides_and_coerces_types():
    cfg = resolve("baseline", "sim-tiny", 0, ["train.lr=1e-4", "train.epochs=7", "data.normalize_frames=false",
                                              "sim.mv_fractions=[0.5, 0.3, 0.2]", "relations=oracle"])
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.train.epochs == 7
    assert cfg.data.normalize_frames is False
    assert cfg.sim.mv_fractions == [0.5, 0.3, 0.2]
    assert cfg.relations.name == "oracle"


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", "unknown config key 'train.lrr'.*train.lr"),
    ("nosuch.key=1", "unknown config key 'nosuch.key'"),
    ("train.epochs=abc", "config key 'train.epochs' expects int, got 'abc'"),
    ("train.epochs=1.5", "config key 'train.epochs' expects int"),
    ("data.normalize_frames=3", "config key 'data.normalize_frames' expects bool"),
    ("train.lr", "--set expects key=value"),
    ("data.scale=huge", "has no scale 'huge'"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(UserError, match=message):
        resolve("baseline", "sim-tiny", 0, [override])


def test_user_yaml_layer_and_errors(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("train:\n  epochs: 2\n")
    assert resolve("baseline", "sim-tiny", 0, [], good).train.epochs == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: [1,\n")
    with pytest.raises(UserError, match="bad.yaml line .* not valid YAML"):
        resolve("baseline", "sim-tiny", 0, [], bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("train:\n  epoch: 2\n")
    with pytest.raises(UserError, match="unknown config key 'train.epoch'.*wrong.yaml"):
        resolve("baseline", "sim-tiny", 0, [], wrong)


def test_scale_preset_applies_and_set_still_wins():
    cfg = resolve("baseline", "sim-tvr", 0, ["data.scale=full"])
    assert (cfg.sim.train_videos, cfg.sim.test_videos) == (17435, 2179)
    cfg = resolve("baseline", "sim-tvr", 0, ["data.scale=full", "sim.train_videos=10"])
    assert cfg.sim.train_videos == 10


def test_resolved_config_round_trips_through_a_record():
    cfg = resolve("baseline", "sim-tiny", 1, ["train.lr=0.001", "relations=oracle", "relations.oracle.mode=ignore"])
    stored = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    again = from_dict(stored)
    assert isinstance(again, Config)
    assert again.to_dict() == cfg.to_dict()


def test_a_preset_is_parsed_once_per_version_and_each_caller_gets_its_own_copy(tmp_path):
    from prvr.harness.engine.sections import load_preset

    preset = tmp_path / "p.yaml"
    preset.write_text("train: {lr: 0.1, epochs: 3}\n")
    first = load_preset(preset)
    first["train"]["lr"] = 9.0  # a caller changing its copy (config resolution pops keys)
    first.pop("train")
    assert load_preset(preset) == {"train": {"lr": 0.1, "epochs": 3}}
    preset.write_text("train: {lr: 0.25, epochs: 30}\n")  # the file changed: read again
    assert load_preset(preset) == {"train": {"lr": 0.25, "epochs": 30}}
    preset.write_text("train: [1\n")
    with pytest.raises(UserError, match="p.yaml line 2 is not valid YAML"):
        load_preset(preset)
    # a record's config rebuilds as before, presets read from the cache
    cfg = resolve("baseline", "sim-tiny", 0, [])
    assert from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
