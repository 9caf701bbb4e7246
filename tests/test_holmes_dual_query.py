"""Holmes with RAL's dual-query branch (`--method ral --backbone holmes`, the run ral@holmes): Holmes'
multisrc/ code as a recipe of registered parts (methods/presets/ral.yaml `backbones.holmes`): the
settings it resolves to, the detector it keeps (the home method's, harness/base/registry.py
`method_detector`), its frame score against multisrc's weighted token-wise formula written out, and
two training steps past the query division's warm-up.

Device: the CPU (the suite's default, tests/conftest.py)."""

import tempfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prvr.datasets.loader import epoch_batches
from prvr.harness.engine.build import build_run
from prvr.harness.engine.config import resolve
from prvr.harness.engine.runner import run_name


def test_ral_on_holmes_resolves_to_the_dual_query_code():
    cfg = resolve("ral", "tvr", 0, ["backbone=holmes"])
    holmes = resolve("holmes", "tvr", 0)
    assert cfg.relations.name == "holmes" and run_name(cfg) == "ral@holmes"  # Holmes' query division kept
    ral = cfg.extra["ral"]
    assert (ral.csa, ral.msra, ral.padded_frames, ral.clip_weight) == (True, False, "zero", 0.5)
    changed = {"intra_video_weight": 0.1, "evidential_weight": 0.01, "evidence_tau": 0.2, "intra_video_tau": 0.04}
    for name in vars(holmes.loss):  # multisrc/Configs/tvr.py: four values differ from src/'s, the rest are Holmes'
        assert getattr(cfg.loss, name) == changed.get(name, getattr(holmes.loss, name)), name
    assert cfg.model == holmes.model and cfg.train == holmes.train
    # on the simulated TVR world too (family tvr), with the world's scaled warm-up
    sim = resolve("ral", "sim-tvr-v2", 0, ["backbone=holmes"])
    assert sim.loss.evidence_tau == 0.2 and sim.loss.warmup_epochs == resolve("holmes", "sim-tvr-v2", 0).loss.warmup_epochs


@pytest.mark.parametrize("backbone", ["msl", "gmmformer", "gmmformer2"])
def test_ral_elsewhere_brings_no_detector_and_keeps_its_names(backbone):
    cfg = resolve("ral", "tvr", 0, [f"backbone={backbone}"])
    assert cfg.relations.name == "none"
    assert run_name(cfg) == ("ral" if backbone == "gmmformer2" else f"ral@{backbone}")


def test_a_run_that_names_another_detector_on_holmes_says_so_in_its_name():
    assert run_name(resolve("ral", "sim-tiny", 0, ["backbone=holmes", "relations=none"])) == "ral+none@holmes"
    assert run_name(resolve("ral", "sim-tiny", 0, ["backbone=holmes", "ral.msra=true"]), "msra") == "ral@holmes~msra"


def multisrc_frame_scores(tokens, token_mask, gate, frames, frame_mask, max_frames):
    """multisrc/Models/holmes/model.py `weighted_token_wise_intersection`, written from its formula:
    the frames padded with zero vectors to max_ctx_l, every logit multiplied by both masks (so a
    padded frame scores 0 and takes part in the max), the best frame of each word weighted by the
    softmax of text_weight_fc over the real words."""
    t, f = F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1)
    padded = f.new_zeros((f.shape[0], max_frames, f.shape[2]))
    padded[:, : f.shape[1]] = f * frame_mask[..., None]
    video_mask = torch.zeros(f.shape[0], max_frames)
    video_mask[:, : f.shape[1]] = frame_mask.float()
    weight = gate(t).masked_fill(~token_mask, float("-inf")).softmax(-1)
    logits = torch.einsum("atd,bvd->abtv", t, padded)
    logits = logits * token_mask.float()[:, None, :, None] * video_mask[None, :, None, :]
    return torch.einsum("abt,at->ab", logits.max(-1).values, weight)


def test_the_frame_score_is_multisrcs_weighted_token_wise_intersection():
    cfg = resolve("ral", "sim-tiny", 0, ["backbone=holmes"])
    run = build_run(cfg)
    model = run.model.eval()
    batcher = run.trainer("unused").batchers["train"]  # only its batcher: nothing is written
    with torch.no_grad():
        q = model.encode_queries(batcher.queries(np.arange(5)))
        v = model.index_videos(model.encode_videos(batcher.videos(np.arange(4))))
        got = model.score(q, v)
        want = multisrc_frame_scores(q["ral.tokens"], q["ral.token_mask"], model.gate, v["frames"], v["frame_mask"],
                                     cfg.model.max_frames)
    assert (v["frame_mask"].sum(1) < cfg.model.max_frames).all()  # every video has padded frames in the max
    assert torch.allclose(got.branches["frame"], want, atol=1e-5)
    w = model.clip_weight()  # sim-tiny is no TVR: RAL's default, the backbone's own weight
    assert w == cfg.model.clip_weight and torch.allclose(got.fused, w * got.branches["clip"] + (1 - w) * want, atol=1e-5)


def test_ral_on_holmes_trains_past_the_warm_up_with_the_query_division():
    cfg = resolve("ral", "sim-tiny", 0, ["backbone=holmes", "train.batch_size=8"])
    run = build_run(cfg)
    with tempfile.TemporaryDirectory() as ckpt:
        trainer = run.trainer(ckpt)
        batches = epoch_batches(len(trainer.has_queries), cfg.train.batch_size, 0, 2, trainer.has_queries)
        run.detector.on_epoch_start(trainer.detector_state(2))
        for step in range(2):
            out = trainer.train_step(trainer.batchers["train"].train_batch(batches[step]), 2, step)
            assert torch.isfinite(out["loss"])
    assert run.detector.active  # the division ran on the CSA frame branch and the clip branch
    for part in ("evidential_frame", "evidential_clip", "evidential_combined", "intra_video"):
        assert torch.isfinite(out[part]) and float(out[part]) > 0, part
    assert "ral_pm" not in out and "ral_da" not in out  # no MSRA, as in multisrc
    grads = dict(run.model.gate.named_parameters())
    assert all(p.grad is not None for p in grads.values())
    # the word gate learns; its last bias moves every word's logit alike, which the masked softmax over
    # words cancels, so its gradient is zero up to rounding (exactly zero on some processors)
    assert all(p.grad.abs().sum() > 0 for n, p in grads.items() if n != "net.2.bias")
    assert float(grads["net.2.bias"].grad.abs().sum()) < 1e-5
