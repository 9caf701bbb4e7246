"""DreamPRVR (methods/dreamprvr.py, methods/backbones/dreamprvr.py, methods/objectives/dreamprvr.py): the
noise schedules and the diffusion's closed forms against float64 references computed another way (the
forward process iterated step by step, the posterior from Bayes' rule), the reverse chain against a
naive loop, the text sampler, the loss terms against naive references, the backbone's shapes,
finiteness, gradients, padding invariance, determinism and parameter count, the range checks of its
settings, which methods and detectors it fits, and one epoch on sim-tiny with and without RAL.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, OBJECTIVES
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.methods.backbones.dreamprvr import (DENOISING, DreamPRVR, DreamPRVRConfig, GaussianDiffusion, cosine_betas,
                                              linear_betas, perturb_text, sinusoidal_table)
from prvr.methods.objectives.dreamprvr import denoising_error, latent_kl, query_similarity_preservation
from prvr.methods.objectives.prvr import same_video_pairs
from test_backbones import content, query_batch, video_batch

F64 = torch.float64
LABELS = torch.tensor([0, 1, 2, 0])  # four queries of three videos (test_backbones' content)


# ----------------------------------------------------------------------------- schedules and closed forms
@pytest.mark.parametrize("steps", [1, 2, 10, 50])
def test_cosine_betas_follow_the_alpha_bar_curve(steps):
    s = 0.008
    f = [math.cos((t / steps + s) / (1 + s) * math.pi / 2) ** 2 for t in range(steps + 1)]
    expected = torch.tensor([min(1 - f[t + 1] / f[t], 0.999) for t in range(steps)], dtype=F64)
    torch.testing.assert_close(cosine_betas(steps, s), expected)
    abar = torch.cumprod(1 - cosine_betas(steps, s), 0)
    if steps > 1:  # without the clamp of the last beta, abar_t = f(t) / f(0)
        torch.testing.assert_close(abar[:-1], torch.tensor(f[1:-1], dtype=F64) / f[0])


def test_linear_betas_scale_ddpms_range_to_the_steps():
    torch.testing.assert_close(linear_betas(1000)[[0, -1]], torch.tensor([1e-4, 0.02], dtype=F64))
    torch.testing.assert_close(linear_betas(50)[[0, -1]], torch.tensor([2e-3, 0.4], dtype=F64))


@pytest.mark.parametrize("betas", [cosine_betas(10), linear_betas(40)], ids=["cosine", "linear"])
def test_q_sample_is_the_forward_process_iterated(betas):
    """x_t = sqrt(1 - beta_t) x_{t-1} + sqrt(beta_t) e_t, iterated from x_0: the coefficient of x_0 and the
    variance of the accumulated noise are sqrt(abar_t) and 1 - abar_t, the closed form's."""
    d = GaussianDiffusion(betas)
    coef, var = 1.0, 0.0
    for t, beta in enumerate(betas.tolist()):
        coef, var = coef * math.sqrt(1 - beta), (1 - beta) * var + beta
        assert d.sqrt_abar[t].item() == pytest.approx(coef, rel=1e-5)
        assert d.sqrt_one_minus_abar[t].item() ** 2 == pytest.approx(var, rel=1e-5)
    x0, noise = torch.randn(len(betas), 3, 4), torch.randn(len(betas), 3, 4)
    t = torch.arange(len(betas))
    xt = d.q_sample(x0, t, noise)
    torch.testing.assert_close(xt, d.sqrt_abar[:, None, None] * x0 + d.sqrt_one_minus_abar[:, None, None] * noise)
    torch.testing.assert_close(d.predict_start(xt, t, noise), x0, rtol=1e-4, atol=1e-4)


def test_posterior_terms_follow_bayes_rule():
    """q(x_{t-1} | x_t, x_0) = N(x_{t-1}; sqrt(abar_{t-1}) x_0, 1 - abar_{t-1}) N(x_t; sqrt(alpha_t) x_{t-1}, beta_t),
    normalised: precision 1 / (1 - abar_{t-1}) + alpha_t / beta_t."""
    betas = cosine_betas(10)
    d = GaussianDiffusion(betas)
    abar = torch.cumprod(1 - betas, 0)
    for t in range(1, 10):
        alpha, prev = 1 - betas[t].item(), abar[t - 1].item()
        precision = 1 / (1 - prev) + alpha / betas[t].item()
        assert d.mean_x0[t].item() == pytest.approx(math.sqrt(prev) / (1 - prev) / precision, rel=1e-5)
        assert d.mean_xt[t].item() == pytest.approx(math.sqrt(alpha) / betas[t].item() / precision, rel=1e-5)
        assert math.exp(d.log_var[t].item()) == pytest.approx(1 / precision, rel=1e-5)
    assert d.mean_x0[0].item() == pytest.approx(1.0) and d.mean_xt[0].item() == pytest.approx(0.0, abs=1e-7)
    assert d.log_var[0].item() == d.log_var[1].item()  # step 0's zero variance replaced by step 1's, as DDPM's code


class _Linear(nn.Module):
    """A stand-in denoiser: eps = 0.3 x + 0.1 t + 0.2 cond."""

    def forward(self, x, t, cond):
        return 0.3 * x + 0.1 * t.to(x.dtype).view(-1, 1, 1) + 0.2 * cond


def _naive_chain(start, cond, betas, clamp):
    """The reverse chain written from the definitions in float64, one step at a time."""
    abar = torch.cumprod(1 - betas, 0)
    x = start
    for t in reversed(range(len(betas))):
        eps = _Linear()(x, torch.full((len(x),), t), cond)
        x0 = ((x - math.sqrt(1 - abar[t]) * eps) / math.sqrt(abar[t])).clamp(-clamp, clamp)
        if t == 0:
            x = x0  # the posterior mean at t = 0 is x_0 itself
            continue
        alpha, prev = 1 - betas[t], abar[t - 1]
        precision = 1 / (1 - prev) + alpha / betas[t]
        mean = (math.sqrt(prev) / (1 - prev) * x0 + math.sqrt(alpha) / betas[t] * x) / precision
        x = mean + math.sqrt(1 / precision) * start  # the reference adds the start as each step's noise
    return x


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_the_reverse_chain_matches_a_naive_loop(steps):
    model = _small(diffusion_steps=steps)
    model.generator.denoiser = _Linear()
    start, cond = torch.randn(3, 2, 32, dtype=F64), torch.randn(3, 2, 32, dtype=F64)
    model.generator.diffusion.to(F64)
    out = model.generator.sample(start, cond)
    torch.testing.assert_close(out.float(), _naive_chain(start, cond, cosine_betas(steps), 1.0).float(),
                               rtol=1e-4, atol=1e-4)


def test_sinusoidal_table_interleaves_sine_and_cosine():
    table = sinusoidal_table(10, 8)
    t, i = 3, 2
    assert table[t, 2 * i].item() == pytest.approx(math.sin(t * 10000 ** (-2 * i / 8)), abs=1e-6)
    assert table[t, 2 * i + 1].item() == pytest.approx(math.cos(t * 10000 ** (-2 * i / 8)), abs=1e-6)


def test_text_samples_without_perturbation_are_the_standardised_rows_shifted_by_their_mean():
    f = torch.randn(3, 16, dtype=F64)
    normed = (f - f.mean(1, keepdim=True)) / torch.sqrt(f.var(1, unbiased=False, keepdim=True) + 1e-5)
    out = perturb_text(f, 4, 0.0)
    assert out.shape == (3, 4, 16)
    torch.testing.assert_close(out, (normed + f.mean(1, keepdim=True))[:, None].expand(3, 4, 16))


def test_text_samples_are_seeded_and_spread_by_the_scale():
    f = torch.randn(2, 64)
    one, two = (perturb_text(f, 3, 0.1, torch.Generator().manual_seed(5)) for _ in range(2))
    torch.testing.assert_close(one, two)
    wide = perturb_text(torch.randn(1, 4096) * 2, 8, 0.5, torch.Generator().manual_seed(1))
    spread = (wide - wide.mean(1, keepdim=True)).std().item()  # the draws around the copies' mean
    assert 0.5 < spread < 2.0
    leaf = f.clone().requires_grad_(True)
    # the shift b (the row's mean) is drawn without gradient: with a = 1, the sum is that of the
    # standardised rows, 0 whatever f, so no gradient reaches f
    perturb_text(leaf, 3, 0.0).sum().backward()
    assert leaf.grad.abs().max().item() < 1e-4


# ----------------------------------------------------------------------------- loss terms
def _naive_supcon(queries, labels, tau):
    x = F.normalize(queries, dim=-1)
    total, rows = 0.0, 0
    for i in range(len(x)):
        partners = [j for j in range(len(x)) if j != i and labels[j] == labels[i]]
        if not partners:
            continue
        denom = sum(math.exp((x[i] @ x[j]).item() / tau) for j in range(len(x)) if j != i)
        total += -sum(math.log(math.exp((x[i] @ x[p]).item() / tau) / denom) for p in partners) / len(partners)
        rows += 1
    return total / rows if rows else 0.0


def test_query_similarity_preservation_matches_a_naive_supcon():
    queries, labels = torch.randn(6, 5, dtype=F64), torch.tensor([0, 1, 0, 2, 0, 1])
    positive = labels[:, None] == torch.arange(3)[None]
    got = query_similarity_preservation(queries, same_video_pairs(positive), 0.5)
    assert got.item() == pytest.approx(_naive_supcon(queries, labels, 0.5))
    alone = torch.eye(3, dtype=torch.bool)
    assert query_similarity_preservation(queries[:3], same_video_pairs(alone), 0.5).item() == 0.0
    assert {"dreamprvr-query-similarity", "dreamprvr-latent-kl", "dreamprvr-denoising"} <= set(OBJECTIVES.names())


def test_latent_kl_and_denoising_error_against_references():
    mu, logvar = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    reference = torch.distributions.kl_divergence(torch.distributions.Normal(mu, (0.5 * logvar).exp()),
                                                  torch.distributions.Normal(0.0, 1.0)).sum() / 4
    torch.testing.assert_close(latent_kl(mu, logvar), reference)
    predicted, noise = torch.zeros(2, 1, 1, 2), torch.tensor([[[1.0, 3.0]]])
    assert denoising_error(predicted, noise).item() == pytest.approx(5.0)


# ----------------------------------------------------------------------------- the backbone
SMALL = {"hidden": 32, "heads": 2, "max_frames": 32, "max_query_len": 16, "registers": 3}


def _small(seed: int = 0, **over) -> DreamPRVR:
    torch.manual_seed(seed)
    return DreamPRVR(DreamPRVRConfig(**{**SMALL, **over}), 24, 16)


def _step(model: DreamPRVR, seed: int = 0):
    frames, tokens = content()
    q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
    torch.manual_seed(seed)
    return q, v, model.score(q, v), model.step_extras(q, v, LABELS)[DENOISING]


def test_forward_and_backward_are_finite_and_reach_every_parameter():
    model = _small().train()
    q, v, s, dn = _step(model)
    assert s.fused.shape == (4, 3) and set(s.branches) == {"clip", "frame"}
    assert v["dream.condition"].shape == (3, 3, 32) and v["dream.mu"].shape == v["dream.logvar"].shape == (3, 32)
    assert dn.predicted.shape == (10, 3, 3, 32) and dn.noise.shape == (3, 3, 32)
    torch.testing.assert_close(v["dream.mu"].norm(dim=-1), torch.ones(3))  # the latent mean is a unit vector
    loss = (s.fused.sum() + s.raw["frame"].sum() + s.raw["clip"].sum() + latent_kl(v["dream.mu"], v["dream.logvar"])
            + denoising_error(dn.predicted, dn.noise))
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    bad = [n for n, g in grads.items() if g is None or not torch.isfinite(g).all() or g.abs().sum() == 0]
    assert not bad, bad
    assert not any("step_table" in n for n in grads)  # the step embeddings' table is frozen (a buffer)


def test_registers_take_part_in_the_encodings():
    model = _small().eval()
    frames, _ = content()
    vb = video_batch(frames)
    with torch.no_grad():
        before = model.encode_videos(vb)
        model.register_tokens.copy_(torch.randn(model.register_tokens.shape, generator=torch.Generator().manual_seed(1)))
        after = model.encode_videos(vb)
    assert not torch.allclose(before["clips"], after["clips"]) and not torch.allclose(before["frames"], after["frames"])
    torch.testing.assert_close(before["dream.mu"], after["dream.mu"])  # the latent reads the clips alone


def test_a_video_encodes_the_same_whatever_its_batch_padding():
    model = _small().eval()
    frames, _ = content()
    with torch.no_grad():
        tight = model.encode_videos(video_batch(frames))
        padded = model.encode_videos(video_batch(frames, pad_to=20, garbage=3.0))
    for key in ("clips", "dream.mu", "dream.condition"):
        torch.testing.assert_close(padded[key], tight[key], rtol=1e-5, atol=1e-5)
    real = tight["frame_mask"]
    torch.testing.assert_close(padded["frames"][:, : real.shape[1]][real], tight["frames"][real], rtol=1e-5,
                               atol=1e-5)


def test_seeded_runs_are_identical():
    one, two = (_step(_small(seed=3).train(), seed=7) for _ in range(2))
    torch.testing.assert_close(one[2].fused, two[2].fused)
    torch.testing.assert_close(one[3].predicted, two[3].predicted)


def test_time_tables():
    random = _small(time_embedding="frozen-random").generator.denoiser.step_table
    assert 0.01 < random.std().item() < 0.04  # N(0, init_std): the reference's table after its re-initialisation
    sine = _small(time_embedding="sinusoidal").generator.denoiser.step_table
    torch.testing.assert_close(sine, sinusoidal_table(10, 32))


@pytest.mark.parametrize("video_dim, query_dim, registers, count", [(3072, 768, 8, 37_619_136),
                                                                    (1024, 1024, 4, 36_135_360)])
def test_parameter_count_is_the_references(video_dim, query_dim, registers, count):
    """lijun2005/CVPR26-DreamPRVR `DreamPRVR_Net` holds these trainable parameters at TVR dims (video
    3072-d, query 768-d, 8 registers) and ActivityNet's (1024, 1024, 4), built on the CPU from its
    src/Models; its frozen step table (10 x 384) is a parameter there and a buffer here."""
    with torch.device("meta"):
        model = DreamPRVR(DreamPRVRConfig(registers=registers), video_dim, query_dim)
    assert sum(p.numel() for p in model.parameters()) == count
    assert "dreamprvr" in BACKBONES.names()


# ----------------------------------------------------------------------------- settings, fit, training
@pytest.mark.parametrize("item, says", [
    ("model.diffusion_steps=0", "config key 'model.diffusion_steps' must be an integer >= 1, got 0"),
    ("model.registers=0", "config key 'model.registers' must be an integer >= 1, got 0"),
    ("model.diffusion_layers=0", "config key 'model.diffusion_layers' must be an integer >= 1, got 0"),
    ("model.schedule=linear", "config key 'model.diffusion_steps' (10) must be above 20 with 'model.schedule' "
                              "linear: its last beta, 20 / steps, is 2, not below 1"),
    ("model.schedule=quadratic", "config key 'model.schedule' must be one of cosine, linear, got 'quadratic'"),
    ("model.schedule_offset=-0.1", "config key 'model.schedule_offset' must be a finite number >= 0, got -0.1"),
    ("model.x0_clamp=-1", "config key 'model.x0_clamp' must be a finite number >= 0, got -1"),
    ("model.text_perturbation=-0.1", "config key 'model.text_perturbation' must be a finite number >= 0, got -0.1"),
    ("model.time_embedding=learned", "config key 'model.time_embedding' must be one of frozen-random, sinusoidal, "
                                     "got 'learned'"),
    ("loss.similarity_tau=0", "config key 'loss.similarity_tau' must be a finite number > 0, got 0"),
    ("loss.kl_weight=-1", "config key 'loss.kl_weight' must be a finite number >= 0, got -1"),
    ("loss.denoising_weight=-1", "config key 'loss.denoising_weight' must be a finite number >= 0, got -1"),
])
def test_a_setting_out_of_range_is_refused_in_one_line(item, says):
    with pytest.raises(UserError) as e:
        resolve("dreamprvr", "sim-tiny", 0, [item])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_linear_schedule_with_enough_steps_is_accepted():
    assert resolve("dreamprvr", "sim-tiny", 0, ["model.schedule=linear", "model.diffusion_steps=25"]).model.schedule \
        == "linear"


def test_presets_follow_the_reference_configs():
    tvr, act, cha = (resolve("dreamprvr", d, 0) for d in ("tvr", "activitynet", "charades"))
    assert (tvr.train.lr, act.train.lr, cha.train.lr) == (3e-4, 2.5e-4, 2e-4)
    assert (tvr.model.registers, act.model.registers, cha.model.registers) == (8, 4, 6)
    assert (tvr.model.clip_weight, act.model.clip_weight, cha.model.clip_weight) == (0.5, 0.6, 0.6)
    assert (tvr.model.temperature, act.model.temperature, cha.model.dropout) == (0.09, 0.6, 0.25)
    assert (tvr.loss.similarity_tau, act.loss.similarity_tau, cha.loss.similarity_tau) == (0.09, 0.08, 0.01)
    assert (tvr.loss.similarity_weight, cha.loss.similarity_weight, act.loss.diversity_weight) == (0.01, 0.002, 0.003)
    assert tvr.model.diffusion_steps == act.model.diffusion_steps == cha.model.diffusion_steps == 10
    assert tvr.loss.kl_weight == 1e-4 and tvr.loss.denoising_weight == 1e-3


def test_what_fits_dreamprvr_and_what_is_refused():
    with pytest.raises(UserError, match=r"^method 'dreamprvr' cannot train backbone 'gmmformer2': its objective "
                                        r"needs diffusion .*; use --backbone dreamprvr"):
        resolve("dreamprvr", "sim-tiny", 0, ["backbone=gmmformer2"])
    with pytest.raises(UserError, match=r"^method 'arl' cannot train backbone 'dreamprvr': its objective needs "
                                        r"frame_items .* and theta_phi"):
        resolve("arl", "sim-tiny", 0, ["backbone=dreamprvr"])
    assert resolve("dreamprvr", "sim-tiny", 0, ["relations=arl"]).relations.name == "arl"  # it reads frame_views
    assert resolve("gmmformer2", "sim-tiny", 0, ["backbone=dreamprvr"]).backbone == "dreamprvr"


@pytest.mark.parametrize("method, run, parts", [
    ("dreamprvr", "dreamprvr", {"clip_nce", "frame_triplet", "diversity", "similarity", "kl", "denoising"}),
    ("ral@dreamprvr", "ral@dreamprvr", {"denoising", "kl", "ral_da", "ral_pm"}),  # RAL extends DreamPRVR's loss
])
def test_one_epoch_on_sim_tiny(tmp_path, method, run, parts):
    name, _, backbone = method.partition("@")
    argv = ["run", "--method", name, "--dataset", "sim-tiny", "--set", "train.epochs=1", "--out", str(tmp_path),
            "--quiet", *(["--backbone", backbone] if backbone else [])]
    assert main(argv) == 0
    record = json.loads((tmp_path / "runs" / "sim-tiny" / run / "seed0.json").read_text())
    epoch = record["history"][0]
    assert parts <= set(epoch) and all(math.isfinite(epoch[p]) for p in parts)
    assert math.isfinite(record["metrics"]["test"]["SumR"])
