"""RAL on the MS-SL family (methods/ral.py, methods/backbones/ral.py): the composition with
each backbone's own method, the reference's parameter count, equivalence with the backbone
when RAL is off, padding and chunking invariance, training steps in every reading."""

import tempfile

import numpy as np
import pytest
import torch

from prvr.datasets.loader import epoch_batches
from prvr.harness.engine.build import build_model, build_run
from prvr.harness.engine.config import resolve
from prvr.harness.base.contract import LossOutput
from prvr.harness.base.io import UserError
from prvr.methods.backbones.ral import RalModel

RAL_BACKBONES = ("gmmformer2", "gmmformer", "msl")


def test_ral_on_gmmformer2_has_the_reference_parameter_count():
    """zhanglong-ustc/RAL-PRVR builds to 35,529,377 parameters at TVR dims (paper Table 6: 35.53 M)."""
    model = build_model(resolve("ral", "tvr", 0), 3072, 768)
    assert sum(p.numel() for p in model.parameters()) == 35_529_377


@pytest.mark.parametrize("backbone", RAL_BACKBONES)
def test_ral_extends_the_backbones_own_method(backbone):
    cfg = resolve("ral", "tvr", 0, [f"backbone={backbone}"])
    home = resolve(backbone, "tvr", 0)
    assert cfg.model == home.model and cfg.train == home.train  # the home preset's model and optimizer
    for name in vars(home.loss):
        assert getattr(cfg.loss, name) == getattr(home.loss, name)  # the home loss fields, then RAL's
    assert cfg.loss.lambda_pm == pytest.approx(0.004) and cfg.extra["ral"].clip_weight == pytest.approx(0.5)
    assert resolve("ral", "activitynet", 0, [f"backbone={backbone}"]).extra["ral"].clip_weight == pytest.approx(0.6)


@pytest.mark.parametrize("backbone", ["dual-branch", "arl"])
def test_ral_refuses_a_backbone_without_encoded_frames(backbone):
    with pytest.raises(UserError, match=f"method 'ral' cannot train backbone '{backbone}'.*frame_tokens"):
        resolve("ral", "sim-tiny", 0, [f"backbone={backbone}"])


def _tiny(backbone, *sets):
    cfg = resolve("ral", "sim-tiny", 0, [f"backbone={backbone}", *sets])
    return cfg, build_run(cfg)


def _batch(run, n=6):
    tr_batcher = run.trainer("unused").batchers["train"]  # only its batcher: nothing is written
    return tr_batcher, tr_batcher.train_batch(np.arange(n))


@pytest.mark.parametrize("backbone", RAL_BACKBONES)
def test_ral_switched_off_is_the_backbone(backbone):
    cfg, run = _tiny(backbone, "ral.msra=false", "ral.csa=false", "ral.clip_weight=-1")
    plain = build_run(resolve(backbone, "sim-tiny", 0), data=run.data)
    _, batch = _batch(run)
    for mode in ("train", "eval"):
        torch.manual_seed(0)
        getattr(run.model, mode)()
        q, v = run.model.encode_queries(batch.queries), run.model.encode_videos(batch.videos)
        got = run.model.score(q, v)
        torch.manual_seed(0)
        getattr(plain.model, mode)()
        q2, v2 = plain.model.encode_queries(batch.queries), plain.model.encode_videos(batch.videos)
        want = plain.model.score(q2, v2)
        assert torch.equal(got.fused, want.fused) and torch.equal(got.branches["frame"], want.branches["frame"])


@pytest.mark.parametrize("backbone", RAL_BACKBONES)
def test_ral_switched_off_trains_as_the_backbones_own_method(backbone):
    """Table 2's first row (no MSRA, no CSA, the backbone's fusion) is the backbone's own run:
    the same losses step by step and the same weights after three steps, to the last bit."""
    got = []
    for name, sets in (("ral", [f"backbone={backbone}", "ral.msra=false", "ral.csa=false", "ral.clip_weight=-1"]),
                       (backbone, [])):
        cfg = resolve(name, "sim-tiny", 0, sets)
        run = build_run(cfg)
        with tempfile.TemporaryDirectory() as ckpt:
            trainer = run.trainer(ckpt)
            batches = epoch_batches(len(trainer.has_queries), cfg.train.batch_size, 0, 1, trainer.has_queries)
            losses = [float(trainer.train_step(trainer.batchers["train"].train_batch(batches[s]), 1, s)["loss"])
                      for s in range(3)]
        model = run.model.base if isinstance(run.model, RalModel) else run.model
        assert sum(p.numel() for p in run.model.parameters()) == sum(p.numel() for p in model.parameters())
        got.append((losses, model.state_dict()))
    (ral_losses, ral_state), (own_losses, own_state) = got
    assert ral_losses == own_losses
    assert ral_state.keys() == own_state.keys() and all(torch.equal(ral_state[k], own_state[k]) for k in own_state)


@pytest.mark.parametrize("backbone", RAL_BACKBONES)
def test_ral_scores_do_not_depend_on_batch_mates_or_chunking(backbone):
    cfg, run = _tiny(backbone)
    model = run.model.eval()
    batcher, _ = _batch(run)
    with torch.no_grad():
        q = model.encode_queries(batcher.queries(np.arange(5)))
        both = model.score(q, model.index_videos(model.encode_videos(batcher.videos(np.arange(4)))))
        alone = model.score(q, model.index_videos(model.encode_videos(batcher.videos(np.arange(1)))))
        assert torch.allclose(both.fused[:, :1], alone.fused, atol=1e-5)  # padding to a longer batch mate
        model.settings.eval_budget = 1  # one video per chunk
        chunked = model.score(q, model.index_videos(model.encode_videos(batcher.videos(np.arange(4)))))
    assert torch.allclose(chunked.fused, both.fused, atol=1e-6)


@pytest.mark.parametrize("backbone", RAL_BACKBONES)
def test_clip_scores_are_the_clip_branch_of_score(backbone):
    """RAL under CSA reads only the backbone's clip branch (`clip_scores`); it must be the
    branch `score` gives, cosine and raw, whole and in query chunks, with and without grad."""
    _, run = _tiny(backbone)
    base = run.model.base.eval()
    batcher, _ = _batch(run)
    q = base.encode_queries(batcher.queries(np.arange(7)))
    v = base.index_videos(base.encode_videos(batcher.videos(np.arange(5))))
    want = base.score(q, v)
    got = base.clip_scores(q, v)
    assert set(got.branches) == {"clip"} and torch.equal(got.fused, got.branches["clip"])
    assert torch.equal(got.branches["clip"], want.branches["clip"]) and torch.equal(got.raw["clip"], want.raw["clip"])
    with torch.no_grad():
        base.cfg.eval_budget = 1  # one query per chunk
        chunked = base.clip_scores(q, v)
    assert torch.allclose(chunked.fused, want.branches["clip"], atol=1e-6)
    assert torch.allclose(chunked.raw["clip"], want.raw["clip"], atol=1e-5)


@pytest.mark.parametrize("backbone, sets", [
    ("gmmformer2", ()),
    ("gmmformer", ()),
    ("msl", ()),
    ("gmmformer2", ("loss.text_source=query",)),
    ("gmmformer2", ("loss.proxies=0", "loss.pm_reading=paper")),
    ("gmmformer2", ("ral.aggregation=local", "loss.use_da=false")),
    ("gmmformer2", ("ral.csa=false",)),
    ("gmmformer2", ("relations=oracle",)),
    ("gmmformer2", ("relations=arl",)),  # ARL's detector on v2's frame branch feeds v2's base losses
    ("gmmformer2", ("ral.heads=code", "ral.pool_padding=code", "loss.kl_reading=code")),  # the parity switches
    ("msl", ("ral.pool_padding=code", "loss.text_source=query", "loss.use_pm=false", "loss.kl_reading=code")),
])
def test_ral_trains_two_steps(backbone, sets):
    cfg, run = _tiny(backbone, *sets)
    with tempfile.TemporaryDirectory() as ckpt:
        trainer = run.trainer(ckpt)
        batches = epoch_batches(len(trainer.has_queries), cfg.train.batch_size, 0, 5, trainer.has_queries)
        run.detector.on_epoch_start(trainer.detector_state(5))  # epoch 5: past ARL's detector warm-up
        for step in range(2):
            out = trainer.train_step(trainer.batchers["train"].train_batch(batches[step]), 5, step)
            assert torch.isfinite(out["loss"])
    if cfg.relations.name == "arl":
        assert run.detector.active and run.detector.stats  # it detected on v2's frame branch
    assert ("ral_pm" in out) == cfg.loss.use_pm and ("ral_da" in out) == cfg.loss.use_da
    assert float(out["ral_sigma_text"]) > 0 and float(out["ral_sigma_video"]) > 0  # the history's uncertainty (Fig. 10)
    assert set(out.diagnostics) == {"ral_sigma_text", "ral_sigma_video"} and not set(out.diagnostics) & set(out.parts)
    head = run.model.text_head  # MSRA's heads learn from L_DA / L_PM
    grads = [p.grad for p in (head.mu if hasattr(head, "mu") else head.mean_fc).parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("backbone", RAL_BACKBONES)
def test_token_encoder_shares_the_base_positions_unless_told_not_to(backbone):
    """`ral.share_positions` (the reference: shared): with it the token encoder reads the base
    query encoder's positions and their LayerNorm, which then take RAL's gradients; without it
    it owns a copy, and nothing of RAL's frame branch reaches the base query encoder."""
    tokens, mask = torch.randn(2, 5, 768), torch.ones(2, 5, dtype=torch.bool)
    counts = {}
    for share in (True, False):
        model = build_model(resolve("ral", "tvr", 0, [f"backbone={backbone}", f"ral.share_positions={share}"]),
                            3072, 768).eval()
        counts[share] = sum(p.numel() for p in model.parameters())
        embed = model.base.query_encoder.embed
        before = model.tokens(tokens, mask)
        with torch.no_grad():
            embed.positions.weight.add_(1.0)
            embed.norm.bias.add_(1.0)
        moved = not torch.allclose(model.tokens(tokens, mask), before)
        assert moved == share
        model.tokens(tokens, mask).sum().backward()
        assert (embed.positions.weight.grad is not None) == share
    hidden, max_len = embed.positions.weight.shape[1], embed.positions.weight.shape[0]
    assert counts[False] - counts[True] == max_len * hidden + 2 * hidden


def test_ral_model_is_a_backbone_wrapper():
    cfg, run = _tiny("gmmformer2")
    assert isinstance(run.model, RalModel) and run.model.base.keep_frames


def test_ablation_tables_show_the_papers_figures_under_the_measured_ones(tmp_path):
    from prvr.harness.cli import main
    from prvr.methods.recipes import TABLES

    for table in TABLES.values():  # every reported row names a row of its table, with five figures
        assert set(table.reported) <= {r.label for r in table.rows}, table.name
        assert all(len(v) == 5 for v in table.reported.values()) and (table.reported_source or not table.reported)
    assert main(["ablate", "--method", "ral", "--table", "2", "--dataset", "sim-tiny", "--report-only",
                 "--out", str(tmp_path)]) == 0
    md = (tmp_path / "ablations" / "sim-tiny" / "ral_table2.md").read_text()
    assert "Reported in the paper (RAL paper Table 2, GMMFormer v2 on TVR" in md
    assert "| full | 18.2 | 40.4 | 52.1 | 88.0 | 198.8 |" in md and "| base | 16.2 |" in md


def test_table_2_base_row_is_the_backbones_own_run(tmp_path):
    """The base row is trained and read as the home method's plain run (`msl` on MS-SL), never
    as a second copy under RAL's name; a RAL-only setting for the whole table says why it
    cannot apply to that row."""
    from prvr.harness.cli.ablate import resolve_row, get_table
    from prvr.harness.cli import main
    from prvr.harness.engine.runner import run_name
    from test_records_and_leaderboard import fake_record, store

    table = get_table("ral", "2")
    base = next(r for r in table.rows if r.label == "base")
    for backbone in RAL_BACKBONES:
        cfg = resolve_row(table, base, "sim-tiny", 1, [f"backbone={backbone}"], None)
        assert (cfg.method, cfg.backbone, cfg.seed, run_name(cfg, "")) == (backbone, backbone, 1, backbone)
    msra = next(r for r in table.rows if r.label == "msra")
    assert run_name(resolve_row(table, msra, "sim-tiny", 0, ["backbone=msl"], None), msra.tag) == "ral@msl~msra"
    with pytest.raises(UserError, match="row 'base' of RAL Table 2.*plain `msl` run.*ral-only --set"):
        resolve_row(table, base, "sim-tiny", 0, ["backbone=msl", "ral.aggregation=local"], None)
    for seed, sumr in ((0, 150.0), (1, 160.0)):
        rec = fake_record(seed, sumr, method="msl", run_name="msl")
        rec.update(dataset="sim-tiny", config=resolve("msl", "sim-tiny", seed).to_dict())
        store(tmp_path, rec)
    assert main(["ablate", "--method", "ral", "--backbone", "msl", "--table", "2", "--dataset", "sim-tiny",
                 "--seeds", "0", "1", "--report-only", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "ablations" / "sim-tiny" / "ral_table2.md").exists()  # that name is RAL on its own v2
    md = (tmp_path / "ablations" / "sim-tiny" / "ral@msl_table2.md").read_text()
    assert "(`prvr-bench ablate --method ral --backbone msl --table 2 --dataset sim-tiny --seeds 0 1`)" in md
    row = next(line for line in md.splitlines() if line.startswith("| base |"))  # measured, above the paper's
    assert row.endswith("| 2 | msl |") and "155.0 ± 7.1" in row
    # with the oracle detector for every row: its own file, the base row the oracle run of MS-SL
    for seed, sumr in ((0, 170.0), (1, 180.0)):
        rec = fake_record(seed, sumr, method="msl", run_name="msl+oracle")
        rec.update(dataset="sim-tiny", config=resolve("msl", "sim-tiny", seed, ["relations=oracle"]).to_dict())
        store(tmp_path, rec)
    assert main(["ablate", "--method", "ral", "--backbone", "msl", "--table", "2", "--dataset", "sim-tiny",
                 "--seeds", "0", "1", "--report-only", "--set", "relations=oracle", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "ablations" / "sim-tiny" / "ral@msl_table2.md").read_text() == md  # left as it was
    oracle = (tmp_path / "ablations" / "sim-tiny" / "ral+oracle@msl_table2.md").read_text()
    assert "--set relations=oracle" in oracle
    row = next(line for line in oracle.splitlines() if line.startswith("| base |"))
    assert row.endswith("| 2 | msl+oracle |") and "175.0 ± 7.1" in row
    assert next(line for line in oracle.splitlines() if line.startswith("| full |")).endswith("| 0 | ral+oracle@msl |")


def test_zero_padded_frames_floor_the_csa_score_of_short_videos():
    """ral.padded_frames=zero (the reference's zero frames in the max): the frame branch of a video
    shorter than model.max_frames is the floored CSA score, in the cosine and the raw score; a
    video at full length is scored as with exclude."""
    from prvr.methods.backbones.ral import csa_scores, word_confidences

    cfg, run = _tiny("gmmformer2", "ral.padded_frames=zero")
    model = run.model.eval()
    batcher, _ = _batch(run)
    with torch.no_grad():
        q = model.encode_queries(batcher.queries(np.arange(4)))
        v = model.index_videos(model.encode_videos(batcher.videos(np.arange(3))))
        got = model.score(q, v)
        lengths = v["frame_mask"].sum(1)
        assert (lengths < cfg.model.max_frames).all()  # sim-tiny's videos are all short
        tokens, tmask = q["ral.tokens"], q["ral.token_mask"]
        for cosine, value in ((True, got.branches["frame"]), (False, got.raw["frame"])):
            t = torch.nn.functional.normalize(tokens, dim=-1) if cosine else tokens
            want = csa_scores(t, tmask, word_confidences(model.gate(t), tmask), v["frames"], v["frame_mask"],
                              cosine=cosine, floor=torch.ones(3, dtype=torch.bool))
            assert torch.allclose(value, want, atol=1e-5)
        model.base.cfg.max_frames = int(lengths.min())  # now the shortest video is at full length
        full = model.score(q, v).branches["frame"][:, lengths == lengths.min()]
        model.settings.padded_frames = "exclude"
        assert torch.allclose(full, model.score(q, v).branches["frame"][:, lengths == lengths.min()], atol=1e-6)


def test_code_pool_padding_attends_like_the_reference_padded_tensors():
    """ral.pool_padding=code: the text head attends over each query's whole padded token
    matrix, zero-padded to support_capacity queries, and the video head over frames zero-padded
    to max_frames, while the means stay over real rows: the model's Gaussians
    (`RalModel.gaussians`) against the explicitly padded tensors built by hand."""
    from types import SimpleNamespace

    from prvr.methods.backbones.ral import CodeGaussianHead
    from prvr.methods.ral import RalLossConfig

    torch.manual_seed(0)
    d, length, capacity, max_frames = 4, 3, 3, 6
    settings = SimpleNamespace(pool_padding="code", support_capacity=capacity)
    model = SimpleNamespace(settings=settings, base=SimpleNamespace(cfg=SimpleNamespace(max_frames=max_frames)),
                            text_head=CodeGaussianHead(d), video_head=CodeGaussianHead(d, unit_pool=True),
                            loss_settings=RalLossConfig(normalize_mean=False))
    tokens, tmask = torch.randn(3, length, d), torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    frames, fmask = torch.randn(2, 4, d), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    video_of_query = torch.tensor([0, 1, 0])
    q, v = {"ral.tokens": tokens, "ral.token_mask": tmask}, {"frames": frames, "frame_mask": fmask}
    g = RalModel.gaussians(model, q, v, video_of_query)
    mu_t, ls_t, mu_v, ls_v = g.mu_text, g.log_sigma_text, g.mu_video, g.log_sigma_video
    # by hand: video 0's set is query 0's three rows, query 2's three rows, then three zero rows
    x0 = torch.cat([tokens[0], tokens[2], torch.zeros(length, d)])[None]
    real0 = torch.cat([tmask[0], tmask[2], torch.zeros(length, dtype=torch.bool)])[None]
    want_mu, want_ls = model.text_head(x0, real0, torch.ones_like(real0))
    assert torch.allclose(mu_t[0], want_mu[0], atol=1e-6) and torch.allclose(ls_t[0], want_ls[0], atol=1e-6)
    # video 0: three real frames, then three zero frames up to max_frames (its padded row is zeroed, as the reference)
    xv = torch.cat([frames[0, :3], torch.zeros(3, d)])[None]
    want_mu, want_ls = model.video_head(xv, torch.tensor([[1, 1, 1, 0, 0, 0]], dtype=torch.bool),
                                        torch.ones(1, 6, dtype=torch.bool))
    assert torch.allclose(mu_v[0], want_mu[0], atol=1e-6) and torch.allclose(ls_v[0], want_ls[0], atol=1e-6)
    settings.pool_padding = "masked"  # the default attends over real rows only, so it differs
    assert not torch.allclose(RalModel.gaussians(model, q, v, video_of_query).mu_text, mu_t)


@pytest.mark.parametrize("backbone", RAL_BACKBONES)
def test_msra_grad_picks_the_encoders_that_l_da_and_l_pm_reach(backbone):
    """`loss.msra_grad` (the diagnostic of docs/methods/ral.md): L_DA and L_PM keep their values
    and always train MSRA's heads; they reach RAL's words, the backbone's frames, both or neither."""
    from types import SimpleNamespace

    from prvr.methods.backbones.ral import MSRA_GRADS
    from prvr.methods.ral import ral_objective

    values = {}
    for reach in MSRA_GRADS:
        cfg, run = _tiny(backbone, f"loss.msra_grad={reach}")
        model = run.model.train()
        _, batch = _batch(run)
        torch.manual_seed(0)
        q, v = model.encode_queries(batch.queries), model.encode_videos(batch.videos)
        q["ral.tokens"].retain_grad()
        v["frames"].retain_grad()
        outputs = {"queries": q, "videos": v, "extras": model.step_extras(q, v, batch.query_item)}
        ctx = SimpleNamespace(outputs=outputs, generator=torch.Generator().manual_seed(0),
                              video_of_query=batch.query_item)
        out = ral_objective(cfg.loss, None, None, ctx, lambda *a: LossOutput(torch.zeros(())))
        out["loss"].backward()
        values[reach] = (out["ral_da"].item(), out["ral_pm"].item())
        assert (q["ral.tokens"].grad is not None) == (reach in ("both", "text")), reach
        assert (v["frames"].grad is not None) == (reach in ("both", "video")), reach
        head = model.text_head.mu if hasattr(model.text_head, "mu") else model.text_head.mean_fc
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    assert len(set(values.values())) == 1  # detaching changes no value


@pytest.mark.parametrize("backbone, sets", [
    ("gmmformer2", ()),
    ("msl", ("ral.heads=code", "ral.pool_padding=code", "loss.text_source=query", "loss.kl_reading=code")),
])
def test_the_objective_reads_the_gaussians_from_the_step_outputs_not_the_model(backbone, sets):
    """RAL's Gaussians are a step output of the model (`RalModel.step_extras`, harness/base/contract.py
    `StepExtras`): the objective computes L_DA and L_PM from them with a context whose model is a
    stub without heads, the same figures as from the model's own `gaussians`; computed when first
    read; none without MSRA, and then only the base loss."""
    from types import SimpleNamespace

    from prvr.harness.base.contract import StepExtras
    from prvr.methods.backbones.ral import GAUSSIANS
    from prvr.methods.objectives.ral import distribution_alignment, proxy_matching, sample_proxies
    from prvr.methods.ral import ral_objective

    cfg, run = _tiny(backbone, *sets)
    model = run.model.train()
    _, batch = _batch(run)
    torch.manual_seed(0)
    q, v = model.encode_queries(batch.queries), model.encode_videos(batch.videos)
    assert isinstance(model, StepExtras)
    calls = []
    real = model.gaussians
    model.gaussians = lambda *a: calls.append(1) or real(*a)
    extras = model.step_extras(q, v, batch.query_item)
    assert list(extras) == [GAUSSIANS] and not calls  # nothing computed until the objective reads it
    ctx = SimpleNamespace(outputs={"queries": q, "videos": v, "extras": extras},
                          generator=torch.Generator().manual_seed(0), video_of_query=batch.query_item)
    out = ral_objective(cfg.loss, None, None, ctx, lambda *a: LossOutput(torch.zeros(())))
    assert calls == [1]
    del model.gaussians
    g = model.gaussians(q, v, batch.query_item)
    gen = torch.Generator().manual_seed(0)
    z_t, z_v = sample_proxies(g.mu_text, g.log_sigma_text, cfg.loss.proxies, gen), \
        sample_proxies(g.mu_video, g.log_sigma_video, cfg.loss.proxies, gen)
    m_t, m_v = (z_t.mean(1), z_v.mean(1)) if cfg.loss.kl_reading == "code" else (g.mu_text, g.mu_video)
    vt = g.video_of_text
    da = distribution_alignment(m_t, g.log_sigma_text, m_v[vt], g.log_sigma_video[vt], cfg.loss.kl_reading)
    pm = proxy_matching(z_t, z_v, cfg.loss.pm_temperature, cfg.loss.pm_reading, vt)
    assert torch.equal(out["ral_da"], da) and torch.equal(out["ral_pm"], pm)
    assert torch.equal(out["loss"], cfg.loss.lambda_da * da + cfg.loss.lambda_pm * pm)
    assert torch.equal(out["ral_sigma_text"], g.log_sigma_text.detach().mean().exp())

    cfg, run = _tiny(backbone, *sets, "ral.msra=false")  # no MSRA: no Gaussians, the base loss alone
    q, v = run.model.encode_queries(batch.queries), run.model.encode_videos(batch.videos)
    extras = run.model.step_extras(q, v, batch.query_item)
    assert dict(extras) == {}
    ctx = SimpleNamespace(outputs={"queries": q, "videos": v, "extras": extras},
                          generator=torch.Generator().manual_seed(0), video_of_query=batch.query_item)
    assert set(ral_objective(cfg.loss, None, None, ctx, lambda *a: LossOutput(torch.zeros(())))) == {"loss"}


def test_scoring_an_indexed_collection_does_not_normalise_its_frames_again(monkeypatch):
    """`index_videos` stores the frames' unit copy once; the frame branch scores it as it is (the dot products
    of unit vectors are the cosines) instead of normalising the whole collection for every batch of queries
    (RAL's 35.7 ms a query at 100,000 videos on the H200), with the same scores as the unindexed path."""
    from prvr.methods.backbones import ral as ral_module

    _, run = _tiny("gmmformer2")
    model = run.model.eval()
    batcher, _ = _batch(run)
    with torch.no_grad():
        q = model.encode_queries(batcher.queries(np.arange(4)))
        encoded = model.encode_videos(batcher.videos(np.arange(3)))
        indexed = model.index_videos(encoded)
        shapes: list[tuple[int, ...]] = []
        real = ral_module.F.normalize
        monkeypatch.setattr(ral_module.F, "normalize", lambda x, *a, **k: shapes.append(tuple(x.shape)) or real(x, *a, **k))
        got = model.score(q, indexed)
        assert tuple(encoded["frames"].shape) not in shapes  # the queries' tokens only
        monkeypatch.setattr(ral_module.F, "normalize", real)
        plain = model.score(q, encoded)  # no stored copy: normalised once, here
    assert torch.allclose(got.branches["frame"], plain.branches["frame"], atol=1e-6)
    assert torch.allclose(got.raw["frame"], plain.raw["frame"], atol=1e-6)
