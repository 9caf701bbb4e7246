"""Which method, backbone and detector train together (methods/fit.py): the declared needs and
provides, the one-line refusal, and for every combination `check_fit` accepts, a step that
runs (an objective's training step, a detector's detection) on the backbone's outputs."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from prvr.datasets.loader import Batcher
from prvr.harness.engine.build import build_model, method_spec
from prvr.harness.engine.config import resolve
from prvr.harness.base.registry import home_method
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS
from prvr.harness.base.contract import StepExtras
from prvr.methods.backbones.api import OUTPUTS, missing_outputs
from prvr.methods.fit import check_fit, method_needs
from prvr.methods.relations.base import DetectorState, Relations
from test_backbones import SMALL, content, query_batch, video_batch

# The backbones each method's objective trains (with the method's own detector), pinned for the
# methods listed; a method added later is tested by what check_fit accepts, without a line here.
FITS = {
    "baseline": {"dual-branch", "msl", "gmmformer", "gmmformer2", "holmes", "hlformer", "dreamprvr"},
    "msl": {"msl", "gmmformer", "gmmformer2", "holmes", "hlformer", "dreamprvr"},
    "gmmformer": {"msl", "gmmformer", "gmmformer2", "holmes", "hlformer", "dreamprvr"},
    "gmmformer2": {"msl", "gmmformer", "gmmformer2", "holmes", "hlformer", "dreamprvr"},
    "arl": {"arl"},
}


def test_needs_name_known_outputs_and_every_method_fits_its_own_backbone_and_detector():
    assert set(FITS) <= set(METHODS.names())
    for name in METHODS.names():
        spec = METHODS.get(name)
        assert spec.needs <= set(OUTPUTS), name
        check_fit(name, spec.backbone, spec.relations)
    for name in DETECTORS.names():
        assert DETECTORS.get(name).needs <= set(OUTPUTS), name


def test_a_method_on_a_backbone_without_its_outputs_is_one_line():
    with pytest.raises(UserError) as e:
        check_fit("msl", "arl", "none")
    assert str(e.value) == (
        f"method 'msl' cannot train backbone 'arl': its objective needs clip_frame ({OUTPUTS['clip_frame']}) and "
        f"raw ({OUTPUTS['raw']}), which 'arl' does not provide; use --backbone msl (backbones that fit method 'msl' "
        "and detector 'none': dreamprvr, gmmformer, gmmformer2, hlformer, holmes, msl)")
    assert "\n" not in str(e.value)


def test_a_detector_on_a_backbone_without_its_outputs_is_one_line():
    with pytest.raises(UserError) as e:
        check_fit("baseline", "msl", "arl")
    assert str(e.value) == (
        f"detector 'arl' cannot read backbone 'msl': it needs frame_views ({OUTPUTS['frame_views']}), which 'msl' "
        "does not provide; use --set relations.name=none, or --backbone dual-branch (backbones that fit method "
        "'baseline' and detector 'arl': dreamprvr, dual-branch, gmmformer2, hlformer, holmes)")


LABELS = torch.tensor([0, 1, 2, 0])  # four queries of three videos; video 0 has two (Hungarian matching)


@pytest.mark.parametrize("backbone", BACKBONES.names())
@pytest.mark.parametrize("method", METHODS.names())
def test_an_accepted_pair_trains_a_step_and_a_refused_one_is_refused(method, backbone):
    """Built as a run builds it (resolve, build_model with the method's wrap, method_spec with a
    base objective for a method that extends its backbone's), at small dims."""
    spec = METHODS.get(method)
    needs = method_needs(spec, backbone)
    accepted = needs is not None and not missing_outputs(needs | DETECTORS.get(spec.relations).needs,
                                                         BACKBONES.get(backbone))
    if method in FITS:
        assert accepted == (backbone in FITS[method])
    if not accepted:
        with pytest.raises(UserError, match=f"method '{method}'.* backbone '{backbone}'"):
            check_fit(method, backbone, spec.relations)
        return
    sets = [f"backbone={backbone}", *(f"model.{k}={v}" for k, v in SMALL.items()
                                      if hasattr(BACKBONES.get(backbone).config_cls, k))]
    cfg = resolve(method, "sim-tiny", 0, sets)
    frames, tokens = content()
    model = build_model(cfg, frames[0].shape[1], tokens[0].shape[1]).train()
    q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
    scores = model.score(q, v)
    rel = Relations.one_to_one(LABELS, len(frames))
    rel.ambiguous[1, 2] = True
    extras = model.step_extras(q, v, LABELS) if isinstance(model, StepExtras) else {}  # as the trainer does
    ctx = SimpleNamespace(epoch=50, step=0, generator=torch.Generator().manual_seed(0), batch=None,
                          outputs={"queries": q, "videos": v, "scores": scores, "extras": extras},
                          video_of_query=LABELS)  # no model: an objective reads what it needs from the outputs
    out = method_spec(cfg).objective(cfg.loss, scores, rel, ctx)  # past every warm-up and hard-negative start
    assert torch.isfinite(out["loss"])
    out["loss"].backward()


@pytest.fixture(scope="module")
def tiny():
    cfg = resolve("baseline", "sim-tiny", 0, ["relations.name=arl"])
    data = DATASETS.get("sim-tiny").load(cfg)
    return cfg, data, Batcher(data["train"], cfg.data)


@pytest.mark.detects
@pytest.mark.parametrize("backbone", BACKBONES.names())
@pytest.mark.parametrize("detector", DETECTORS.names())
def test_a_detector_detects_on_every_backbone_that_provides_its_needs(tiny, detector, backbone):
    cfg, data, batcher = tiny
    cls = BACKBONES.get(backbone)
    model_cfg = cls.config_cls()
    for key, value in SMALL.items():
        if hasattr(model_cfg, key):
            setattr(model_cfg, key, value)
    torch.manual_seed(0)
    model = cls(model_cfg, data.video_dim, data.query_dim).train()
    det = DETECTORS.get(detector)(cfg)
    det.setup(data)
    state = DetectorState(5, model, torch.device("cpu"), data, batcher)  # past the ARL detector's default warm-up
    if missing_outputs(det.needs, cls):  # refused when the config resolves, with a method the backbone fits
        with pytest.raises(UserError, match=f"detector '{detector}' cannot read backbone '{backbone}'"):
            check_fit(home_method(backbone), backbone, detector)
        return
    det.on_epoch_start(state)
    batch = batcher.train_batch(np.arange(8))
    q, v = model.encode_queries(batch.queries), model.encode_videos(batch.videos)
    rel = det.detect(batch, {"queries": q, "videos": v, "scores": model.score(q, v)})
    assert rel.positive.shape == rel.ambiguous.shape == (len(batch.queries.query_index), len(batch.videos.video_index))
    if detector == "arl":  # active past its warm-up, it detected on each of the backbone's frame views
        assert det.active and list(rel.detected) == [b for b, _, _ in model.frame_views()]
    assert not (rel.positive & rel.ambiguous).any()
