"""ARL end to end: backbone (Eq. 2-3, 13), the recipe's objective, a short run on sim-tiny
that stores per-epoch detection statistics and Fig. 4, the oracle feed, the ablation command."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prvr.datasets.loader import Batcher
from prvr.harness.cli import ablate
from prvr.harness.cli import app as cli
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import record_path, write_record
from prvr.harness.base.registry import BACKBONES, DATASETS
from prvr.harness.engine.runner import run_name, run_one
from prvr.methods.arl import arl_objective
from prvr.methods.backbones.arl import ArlBackbone, ArlEncoderConfig
from prvr.methods.relations.base import Relations
from prvr.methods.relations.arl import VARIANTS


@pytest.fixture(scope="module")
def tiny():
    cfg = resolve("arl", "sim-tiny", 0)
    data = DATASETS.get("sim-tiny").load(cfg)
    batch = Batcher(data["train"], cfg.data).train_batch(np.arange(10))
    return cfg, data, batch


def test_backbone_scores_are_max_cosine_averaged_over_branches(tiny):
    cfg, data, batch = tiny
    torch.manual_seed(0)
    model = BACKBONES.get("arl")(cfg.model, data.video_dim, data.query_dim).eval()
    q, v = model.encode_queries(batch.queries), model.encode_videos(batch.videos)
    s = model.score(q, v)
    assert set(s.branches) == set(s.items) == {"theta", "phi"} and not s.raw  # [Q, B, T] maps in eval mode too
    mask = v["frame_mask"]
    for b in ("theta", "phi"):
        cos = torch.einsum("qd,btd->qbt", F.normalize(q[f"query.{b}"], dim=-1), F.normalize(v[f"frames.{b}"], dim=-1))
        assert torch.allclose(s.branches[b], cos.masked_fill(~mask[None], -2).amax(-1), atol=1e-6)  # Eq. 2-3
        assert torch.allclose(s.items[b], cos, atol=1e-6)  # Eq. 2
    assert torch.allclose(s.fused, (s.branches["theta"] + s.branches["phi"]) / 2)  # Eq. 13
    assert not torch.allclose(s.branches["theta"], s.branches["phi"])  # two independently initialised models
    model.train()
    assert model.score(q, v).items["theta"].shape == (*s.branches["theta"].shape, mask.shape[1])


def test_one_branch_model_trains_alone(tiny):
    _, scores, rel, ctx = _objective_inputs(tiny, branches=1)
    assert set(scores.tensors()) == {"fused", "theta", "items.theta"}
    cfg = resolve("arl", "sim-tiny", 0, ["model.branches=1"])
    out = arl_objective(cfg.loss, scores, rel, ctx)
    assert "theta_frame_nce" in out and not any(k.startswith("phi") for k in out)


def test_input_norm_switch_standardises_the_inputs_or_leaves_them():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 48) * 3 + 1
    mask = torch.ones(2, 5, dtype=torch.bool)
    on = ArlBackbone(ArlEncoderConfig(hidden=16, heads=2), 48, 24).models["theta"].video_encoder
    off = ArlBackbone(ArlEncoderConfig(hidden=16, heads=2, input_norm=False), 48, 24).models["theta"].video_encoder
    standardised = on.in_norm(x)
    assert torch.allclose(standardised.mean(-1), torch.zeros(2, 5), atol=1e-5)
    assert torch.allclose(standardised.std(-1, unbiased=False), torch.ones(2, 5), atol=1e-3)
    assert torch.equal(off.in_norm(x), x)
    assert sum(p.numel() for p in on.parameters()) == sum(p.numel() for p in off.parameters())  # no affine


def test_parameter_count_at_tvr_dimensions_is_near_the_paper():
    n = sum(p.numel() for p in ArlBackbone(ArlEncoderConfig(), 3072, 768).parameters())
    assert 5.0e6 < n < 5.8e6  # paper Table 3: 5.34 M


def _objective_inputs(tiny, ambiguous_pair=(0, 3), branches=2):
    _, data, batch = tiny
    cfg = resolve("arl", "sim-tiny", 0, [f"model.branches={branches}"])
    torch.manual_seed(0)
    model = BACKBONES.get("arl")(cfg.model, data.video_dim, data.query_dim).train()
    q, v = model.encode_queries(batch.queries), model.encode_videos(batch.videos)
    scores = model.score(q, v)
    rel = Relations.one_to_one(batch.query_item, len(batch.videos.video_index))
    rel.ambiguous[ambiguous_pair] = not rel.positive[ambiguous_pair]
    ctx = SimpleNamespace(epoch=5, step=0, generator=torch.Generator().manual_seed(0), batch=batch,
                          outputs={"queries": q, "videos": v, "scores": scores})
    return cfg, scores, rel, ctx


def test_objective_uses_ambiguous_sets_only_after_warm_up_and_lifts_them_to_frames(tiny):
    cfg, scores, rel, ctx = _objective_inputs(tiny)
    cfg.loss.warmup_epochs, cfg.loss.hard_negative_epoch = 3, -1
    after = arl_objective(cfg.loss, scores, rel, ctx)
    assert "theta_frame_nce" in after and "phi_trip_a" in after  # plain relations: text-video sets lifted to frames
    ctx.epoch = 1
    during = arl_objective(cfg.loss, scores, rel, ctx)
    assert "theta_frame_nce" not in during and during["theta_trip_a"].item() == 0.0
    no_amb = Relations(rel.positive, torch.zeros_like(rel.ambiguous), rel.confidence)
    ctx.generator = torch.Generator().manual_seed(0)
    same = arl_objective(cfg.loss, scores, no_amb, ctx)
    ctx.generator = torch.Generator().manual_seed(0)
    assert arl_objective(cfg.loss, scores, rel, ctx)["loss"].item() == pytest.approx(same["loss"].item())
    cfg.loss.variant = "base"
    ctx.epoch = 5
    assert "theta_frame_nce" not in arl_objective(cfg.loss, scores, rel, ctx)
    after["loss"].backward()


def test_the_matrix_start_row_under_ignore_with_no_pairs_is_the_base_row_draw_for_draw(tiny):
    """The matrix's cells on ARL's backbone start from `tv_only` (MethodSpec.treatment_row): with no ambiguous pair
    its ignore cell must train what the plain cell `arl~base` does, random stream included (the ignore path takes
    and drops restrain's draw from the empty set), so the oracle's room at a world with nothing to know is 0."""
    cfg, scores, rel, ctx = _objective_inputs(tiny)
    cfg.loss.warmup_epochs, cfg.loss.hard_negative_epoch = 0, -1
    none = Relations(rel.positive, torch.zeros_like(rel.ambiguous), rel.confidence)
    out, states = {}, {}
    for variant, treatment in (("base", "restrain"), ("tv_only", "ignore"), ("tv_only", "restrain")):
        cfg.loss.variant, cfg.loss.treatment = variant, treatment
        ctx.generator = torch.Generator().manual_seed(3)
        out[variant, treatment] = arl_objective(cfg.loss, scores, none, ctx)["loss"].item()
        states[variant, treatment] = ctx.generator.get_state()
    assert out["tv_only", "ignore"] == out["base", "restrain"] == out["tv_only", "restrain"]
    assert torch.equal(states["tv_only", "ignore"], states["base", "restrain"])
    cfg.loss.variant, cfg.loss.treatment = "tv_only", "ignore"  # with pairs, ignore leaves them out: another loss
    ctx.generator = torch.Generator().manual_seed(3)
    assert rel.ambiguous.any() and arl_objective(cfg.loss, scores, rel, ctx)["loss"].item() != out["base", "restrain"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("treatment", ["restrain", "positive", "ignore"])
def test_every_ablation_recipe_resolves_and_steps(tiny, variant, treatment):
    cfg, scores, rel, ctx = _objective_inputs(tiny)
    cfg.loss.variant, cfg.loss.treatment = variant, treatment
    out = arl_objective(cfg.loss, scores.map(lambda t: t.detach().requires_grad_()), rel, ctx)
    assert torch.isfinite(out["loss"])
    resolved = resolve("arl", "sim-tvr", 0, [f"loss.variant={variant}", f"loss.treatment={treatment}"])
    assert resolved.loss.variant == variant and resolved.relations.name == "arl"


def test_bad_settings_are_user_errors(tiny):
    from prvr.harness.base.io import UserError

    cfg, scores, rel, ctx = _objective_inputs(tiny)
    cfg.loss.margin_a = cfg.loss.margin
    with pytest.raises(UserError, match="margin_a < loss.margin"):
        arl_objective(cfg.loss, scores, rel, ctx)
    cfg.loss.margin_a, cfg.loss.variant = 0.01, "tv"
    with pytest.raises(UserError, match="loss.variant must be one of"):
        arl_objective(cfg.loss, scores, rel, ctx)


def test_preset_takes_gmmformer_settings_and_the_oracle_feeds_ambiguous_sets():
    tvr = resolve("arl", "tvr", 0)
    assert (tvr.train.lr, tvr.loss.margin, tvr.loss.lambda_nce, tvr.model.dropout) == (3e-4, 0.1, 0.05, 0.2)
    assert tvr.model.hidden == 384 and tvr.train.epochs == 100
    anet = resolve("arl", "activitynet", 0)
    assert (anet.train.lr, anet.loss.margin, anet.loss.margin_a, anet.loss.lambda_nce) == (2.5e-4, 0.2, 0.1, 0.02)
    sim = resolve("arl", "sim-tvr", 0)
    assert sim.train.epochs == 30 and sim.loss.margin == 0.1 and sim.relations.name == "arl"
    assert resolve("arl", "sim-tvr", 0, ["relations=oracle"]).detector.mode == "ignore"  # the preset's +oracle row


def test_smoke_run_writes_detection_stats_and_fig4(tmp_path):
    cfg = resolve("arl", "sim-tiny", 0, ["train.epochs=2", "loss.warmup_epochs=1"])
    rec = run_one(cfg, tmp_path)
    warm, detect = rec["history"][0]["relations"], rec["history"][1]["relations"]
    assert warm == {"active": False}
    assert detect["active"] and detect["cross_model"]
    for name in ("theta", "phi", "union"):
        assert {"precision", "recall", "ambiguous_pairs", "per_query", "per_video", "base_rate"} <= set(detect[name])
    assert {"tau_s", "tau_u", "frame_share"} <= set(detect["theta"])
    assert "theta_frame_nce" in rec["history"][1] and "theta_trip_a" in rec["history"][1]
    folder = record_path(tmp_path, "sim-tiny", "arl", 0).parent
    assert rec["artifacts"] == ["seed0.fig4.png", "seed0.fig4.json"]
    assert (folder / "seed0.fig4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = json.loads((folder / "seed0.fig4.json").read_text())
    assert {"theta", "phi"} == set(fig) and "region_precision" in fig["theta"]
    stored = json.loads(record_path(tmp_path, "sim-tiny", "arl", 0).read_text())
    assert stored["history"][1]["relations"]["union"]["recall"] is not None


def test_arl_losses_run_on_the_oracle_sets(tmp_path):
    cfg = resolve("arl", "sim-tiny", 0, ["train.epochs=2", "loss.warmup_epochs=1", "relations.name=oracle"])
    rec = run_one(cfg, tmp_path)
    assert rec["run_name"] == "arl+oracle" and rec["config"]["relations"]["oracle"]["mode"] == "ignore"
    h = rec["history"][1]
    assert h["relations"]["unlabelled_relevant_pairs"] > 0
    assert h["theta_trip_a"] > 0 and "phi_frame_nce" in h  # the oracle's pairs restrained, lifted to frames


def test_ablate_command_runs_every_row_and_tabulates(tmp_path, monkeypatch):
    calls = []

    def fake_run_one(cfg, out, resume=False, tag="", hooks=None, command="", force_resume=False):
        calls.append((tag, cfg.loss.variant, cfg.loss.treatment, cfg.seed))
        sumr = {"base": 100.0, "tv_only": 110.0}.get(tag, 120.0) + cfg.seed
        half = (sumr - 3.0) / 2  # R@10 and R@100 within [0, 100], as a record's must be (records.METRIC_RANGES)
        metrics = {"R@1": 1.0, "R@5": 2.0, "R@10": half, "R@100": half, "SumR": sumr}
        write_record(record_path(out, cfg.dataset, run_name(cfg, tag), cfg.seed),
                     {"method": cfg.method, "dataset": cfg.dataset, "seed": cfg.seed, "config": cfg.to_dict(),
                      "provenance": {}, "metrics": {"val": metrics, "test": metrics}, "run_name": run_name(cfg, tag),
                      "tag": tag})

    monkeypatch.setattr(ablate, "run_one", fake_run_one)  # where ablate calls it
    args = ["ablate", "--method", "arl", "--table", "5", "--dataset", "sim-tiny", "--seeds", "0", "1",
            "--out", str(tmp_path), "--quiet"]
    assert cli.main(args) == 0
    assert [c[:2] for c in calls[::2]] == [("base", "base"), ("tv_only", "tv_only"), ("tv_tf", "tv_tf"),
                                           ("tv_cross", "tv_cross"), ("", "full")]
    table = (tmp_path / "ablations" / "sim-tiny" / "arl_table5.md").read_text()
    assert "| (a) |  |  |  | 1.0 ± 0.0 | 2.0 ± 0.0 | 48.8 ± 0.4 | 48.8 ± 0.4 | 100.5 ± 0.7 |  | 2 | arl~base |" in table
    assert "| 120.5 ± 0.7 | +20.0 (2 seeds, p=0.000) | 2 | arl |" in table  # Δ against row (a), paired
    assert "arl~tv_cross" in table and "| (e) | ✓ | ✓ | ✓ |" in table
    calls.clear()
    assert cli.main([*args[:4], "6", *args[5:], "--skip-existing"]) == 0
    assert [c[0] for c in calls] == ["positive", "positive", "ignore", "ignore"]  # restrain = the plain arl run
    assert cli.main(["ablate", "--method", "arl", "--table", "7", "--quiet"]) == 2
    # --tag X: every row's run is <row tag>_X (as `run --tag <row>_X` names it), in a table of its own
    calls.clear()
    assert cli.main([*args, "--tag", "e30", "--set", "train.epochs=3"]) == 0
    assert [c[0] for c in calls[::2]] == ["base_e30", "tv_only_e30", "tv_tf_e30", "tv_cross_e30", "e30"]
    tagged = (tmp_path / "ablations" / "sim-tiny" / "arl_table5_e30.md").read_text()
    assert "| 2 | arl~base_e30 |" in tagged and "| 2 | arl~e30 |" in tagged
    assert "--tag e30 --set train.epochs=3`" in tagged
    assert "arl~base |" in (tmp_path / "ablations" / "sim-tiny" / "arl_table5.md").read_text()  # untouched
    assert "other settings" not in tagged
    # records kept under the asked names but trained otherwise are named in the table and warned about
    calls.clear()
    assert cli.main([*args, "--tag", "e30", "--set", "train.epochs=4", "--report-only"]) == 0 and not calls
    tagged = (tmp_path / "ablations" / "sim-tiny" / "arl_table5_e30.md").read_text()
    assert "Records trained with other settings" in tagged
    assert "arl~base_e30/seed1.json: train.epochs 3 / 4" in tagged
