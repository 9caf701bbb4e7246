"""DreamPRVR (Li et al., CVPR 2026): GMMFormer v2 with diffusion-generated registers.

Each video gets R registers (8 on TVR), global tokens generated before the clip and frame
encoders run, which then attend over them next to their own rows:

1. The video's clip embedding passes one plain attention layer (`context`), and R learned
   tokens read it by cross-attention: the condition c [R, d] (the reference's `video_qformer`).
2. A probabilistic variational sampler (`VideoLatent`) gives the video a Gaussian N(mu, sigma^2):
   mu = unit(LN(p + sigmoid(FC(A(x))))), log sigma^2 = FC(A'(x)) + FC'(p), p the video's clips
   pooled over their order statistics (`OrderPool`, VSE-infinity's GPO), A, A' gated attention
   poolings. The diffusion starts from mu (the reference reads its mean, never a sample).
3. A truncated diffusion of T steps (10, cosine schedule) refines x_T = mu into the registers:
   the reverse DDPM chain with a noise-predicting MLP conditioned on c (`Denoiser`), x_0 clamped
   to [-1, 1] at each step, and, as the reference does, mu itself (not a fresh draw) as the noise
   each step adds. The same chain runs in training and at test time: the registers depend on the
   video alone, so a video encodes once for every query.
4. Register-augmented Gaussian attention (`RegisterBlock`): in each Gaussian branch of the clip and
   frame blocks the rows attend over themselves and the video's registers (after a LN-Linear-ReLU
   map of its own); the window weighs row-row logits only. The branches are fused per position by
   GMMFormer v2's branch weights, read by each sequence's mean token (as Holmes and HLFormer).

In training, text supervises the chain (`step_extras`): each video's mean labelled query, R
perturbed copies of it (`perturb_text`), is x_0; x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) mu at
every t, and the denoiser predicts mu from x_t, t and c (methods/objectives/dreamprvr.py). The
query encoder and the scores are GMMFormer v2's (inherited): best cosine over clips, over frames,
fused 0.5 / 0.5 on TVR (0.6 / 0.4 elsewhere). docs/methods/dreamprvr.md has the equations and the
reference's quirks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.base import masks
from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import NON_NEGATIVE, PROBABILITY, ListOf, at_least, one_of, param, require
from prvr.harness.base.contract import Encoded, OnDemand
from prvr.harness.base.registry import BACKBONES
from prvr.harness.base.io import UserError
from prvr.methods.backbones.blocks import (PLAIN, CrossAttentionLayer, DynamicGMMBlock, GaussianBranches, GMMBlock,
                                           InputEmbedding, QueryEncoder, check_heads, full_mask, gaussian_attention,
                                           gaussian_weights, init_weights, official_branches, official_cross,
                                           official_inputs_and_query, pack)
from prvr.methods.backbones.gmmformer2 import GMMFormer2, GMMFormer2Config
from prvr.methods.backbones.ral import GatedAttentionPool, official_gaussian_head

Schedule = Literal["cosine", "linear"]  # model.schedule: the betas of the diffusion
# model.time_embedding: the denoiser's table of step embeddings before its MLP. frozen-random: what
# the reference trains with (its sinusoidal table is overwritten by the model-wide N(0, 0.02)
# re-initialisation and stays frozen); sinusoidal: the table the reference's code writes first
TimeTable = Literal["frozen-random", "sinusoidal"]
DENOISING = "dream.denoising"  # the key of a training step's `Denoising` in its extras
VIDEO_KEYS = ("dream.condition", "dream.mu", "dream.logvar")  # the `diffusion` output (encode_videos keys)
MAX_BETA = 0.999  # the reference's clamp of the cosine schedule's betas
LINEAR_BETAS = (1e-4, 0.02)  # the linear schedule's first and last beta at 1000 steps, scaled by 1000 / steps


@dataclass
class DreamPRVRConfig(GMMFormer2Config):
    # DreamPRVRBlock: attention_num 8 = plain attention, then wid = 2 ** i for i in -2 .. 4
    widths: list[float] = param([0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0], ListOf(NON_NEGATIVE))
    clip_weight: float = param(0.5, PROBABILITY)  # clip_scale_w (TVR; 0.6 on ActivityNet and Charades)
    registers: int = param(8, at_least(1))  # num_registers (TVR; ActivityNet 4, Charades 6)
    diffusion_steps: int = param(10, at_least(1))  # timesteps T of the truncated diffusion
    diffusion_layers: int = param(2, at_least(1))  # num_diffusion_layers: residual blocks of the denoiser
    schedule: Schedule = param("cosine", one_of(Schedule))  # GaussianDiffusion's default, the one used
    schedule_offset: float = param(0.008, NON_NEGATIVE)  # s of the cosine schedule (Nichol and Dhariwal)
    # the sampler clamps its estimate of x_0 to [-clamp, clamp] at each step (the reference: 1); 0 = no clamp
    x0_clamp: float = param(1.0, NON_NEGATIVE)
    time_embedding: TimeTable = param("frozen-random", one_of(TimeTable))
    # TextSampler perturbation_scale: the std of the text samples' scale and shift, times each
    # video's mean query's std over its dims
    text_perturbation: float = param(0.1, NON_NEGATIVE)

    def check(self, key: str) -> None:
        check_heads(self, key)
        if self.schedule == "linear":
            last = LINEAR_BETAS[1] * 1000 / self.diffusion_steps
            require(last < 1, f"config key '{key}.diffusion_steps' ({self.diffusion_steps}) must be above 20 with "
                              f"'{key}.schedule' linear: its last beta, 20 / steps, is {last:g}, not below 1")
        require(self.hidden % 2 == 0, f"config key '{key}.hidden' ({self.hidden}) must be even: the denoiser's "
                                      "step embedding pairs a sine and a cosine per frequency")
        require(self.padded_frames == "exclude",
                f"config key '{key}.padded_frames' ({self.padded_frames}): the reference's zero-padded frames are "
                "built for GMMFormer v2, Holmes and HLFormer, not for DreamPRVR's register blocks; leave it 'exclude'")


# ----------------------------------------------------------------------------- the diffusion
def cosine_betas(steps: int, offset: float = 0.008) -> torch.Tensor:
    """Nichol and Dhariwal's cosine schedule: abar(t) = f(t) / f(0), f(t) = cos((t / T + s) / (1 + s) pi / 2)^2,
    beta_t = 1 - abar(t) / abar(t - 1), clamped to [0, 0.999]. float64 [T]."""
    x = torch.linspace(0, steps, steps + 1, dtype=torch.float64)
    abar = torch.cos((x / steps + offset) / (1 + offset) * math.pi / 2) ** 2
    abar = abar / abar[0]
    return (1 - abar[1:] / abar[:-1]).clamp(0, MAX_BETA)


def linear_betas(steps: int) -> torch.Tensor:
    """DDPM's linear schedule, 1e-4 .. 0.02 at 1000 steps, scaled by 1000 / steps. float64 [T]."""
    scale = 1000 / steps
    return torch.linspace(LINEAR_BETAS[0] * scale, LINEAR_BETAS[1] * scale, steps, dtype=torch.float64)


class GaussianDiffusion(nn.Module):
    """The fixed terms of a DDPM with the given betas (computed in float64, kept in float32 buffers):
    the forward process in closed form (`q_sample`) and one reverse step (`p_step`)."""

    def __init__(self, betas: torch.Tensor) -> None:
        super().__init__()
        alphas = 1 - betas
        abar = torch.cumprod(alphas, 0)
        abar_prev = F.pad(abar[:-1], (1, 0), value=1.0)
        var = betas * (1 - abar_prev) / (1 - abar)  # of the posterior q(x_{t-1} | x_t, x_0)
        # the log variance with step 0's (zero) replaced by step 1's, as DDPM's code; step 0 adds no noise
        clipped = torch.cat([var[1:2], var[1:]]) if len(var) > 1 else var
        terms = {"sqrt_abar": abar.sqrt(), "sqrt_one_minus_abar": (1 - abar).sqrt(),
                 "sqrt_recip_abar": (1 / abar).sqrt(), "sqrt_recip_m1_abar": (1 / abar - 1).sqrt(),
                 "mean_x0": betas * abar_prev.sqrt() / (1 - abar), "mean_xt": (1 - abar_prev) * alphas.sqrt() / (1 - abar),
                 "log_var": clipped.log()}
        for name, value in terms.items():
            self.register_buffer(name, value.float(), persistent=False)
        self.steps = len(betas)

    def term(self, name: str, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Term `name` at steps t [N], shaped to broadcast against like [N, ...]."""
        value: torch.Tensor = getattr(self, name)
        return value[t].to(like.dtype).view(-1, *[1] * (like.dim() - 1))

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise (DDPM Eq. 4), t [N] against x0 [N, ...]."""
        return self.term("sqrt_abar", t, x0) * x0 + self.term("sqrt_one_minus_abar", t, x0) * noise

    def predict_start(self, xt: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """x_0 from x_t and the predicted noise: `q_sample` solved for x_0."""
        return self.term("sqrt_recip_abar", t, xt) * xt - self.term("sqrt_recip_m1_abar", t, xt) * eps

    def p_step(self, eps: torch.Tensor, xt: torch.Tensor, t: int, noise: torch.Tensor, clamp: float) -> torch.Tensor:
        """x_{t-1} from x_t and the predicted noise eps: the posterior mean at the estimated x_0
        (clamped to [-clamp, clamp] unless clamp is 0), plus exp(log_var_t / 2) noise when t > 0."""
        steps = torch.full((len(xt),), t, dtype=torch.long, device=xt.device)
        x0 = self.predict_start(xt, steps, eps)
        if clamp > 0:
            x0 = x0.clamp(-clamp, clamp)
        mean = self.term("mean_x0", steps, xt) * x0 + self.term("mean_xt", steps, xt) * xt
        return mean if t == 0 else mean + (0.5 * self.term("log_var", steps, xt)).exp() * noise


def sinusoidal_table(steps: int, dim: int) -> torch.Tensor:
    """[steps, dim]: row t holds sin(t w_i), cos(t w_i) interleaved, w_i = 10000^(-2i / dim)."""
    freq = torch.exp(-torch.arange(0, dim, 2, dtype=torch.float64) / dim * math.log(10000))
    angle = torch.arange(steps, dtype=torch.float64)[:, None] * freq[None]
    return torch.stack([angle.sin(), angle.cos()], -1).view(steps, dim).float()


class DenoiserBlock(nn.Module):
    """One residual block of the denoiser: W_out(drop-free SiLU(LN(W_in SiLU(LN(x)) + W_t SiLU(e_t) + W_c SiLU(c))))
    + W_s x (the reference's `BottleNeck`)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.block_in = nn.Sequential(nn.LayerNorm(hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.time = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden))
        self.cond = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden))
        self.block_out = nn.Sequential(nn.LayerNorm(hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.shortcut = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, step: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.block_in(x) + self.time(step)[:, None] + self.cond(cond)
        return self.block_out(h) + self.shortcut(x)


class Denoiser(nn.Module):
    """The noise-predicting MLP (the reference's `DiffusionMLP`): eps = W_s(h + x), h the blocks'
    output from x, the step's embedding (table row t, then Linear-SiLU-Linear) and the condition
    (LN-ReLU-Linear). Registers are rows: x, cond [N, R, d], t [N]."""

    step_table: torch.Tensor

    def __init__(self, hidden: int, steps: int, layers: int, table: TimeTable) -> None:
        super().__init__()
        # a frozen table: a buffer, saved with the model (frozen-random is drawn at construction)
        values = sinusoidal_table(steps, hidden) if table == "sinusoidal" else torch.empty(steps, hidden)
        self.register_buffer("step_table", values)
        self.table = table
        self.time = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.cond = nn.Sequential(nn.LayerNorm(hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(DenoiserBlock(hidden) for _ in range(layers))
        self.shortcut = nn.Linear(hidden, hidden)

    def reset_table(self, std: float) -> None:
        """The reference's frozen-random table: N(0, std), as its re-initialisation leaves it."""
        if self.table == "frozen-random":
            nn.init.normal_(self.step_table, 0.0, std)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        step, c, h = self.time(self.step_table[t]), self.cond(cond), x
        for block in self.blocks:
            h = block(h, step, c)
        return self.shortcut(h + x)


def perturb_text(features: torch.Tensor, samples: int, scale: float,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """The textual perturbation sampler: `samples` copies of each row of features [V, d],
    x = a * norm(f) + b, norm(f) = (f - mean(f)) / sqrt(var(f) + 1e-5) over the row's dims, a ~
    N(1, (scale std(f))^2) and b ~ N(mean(f), (scale std(f))^2) drawn per copy and dim (no gradient
    through a and b; std unbiased, var biased, as the reference's torch.std_mean and InstanceNorm)
    -> [V, samples, d]."""
    v, d = features.shape
    std, mean = torch.std_mean(features.detach(), dim=1)
    normed = F.instance_norm(features[:, None]).squeeze(1)  # each row over its dims, eps 1e-5
    draws = torch.randn(2, v, samples, d, generator=generator, device=features.device, dtype=features.dtype)
    spread = (scale * std)[:, None, None]
    a, b = 1 + spread * draws[0], mean[:, None, None] + spread * draws[1]
    return a * normed[:, None] + b


# ----------------------------------------------------------------------------- the video latent
@lru_cache(maxsize=16)
def position_codes(length: int, dim: int) -> torch.Tensor:
    """[length, dim] sinusoidal position codes, sin on even dims, cos on odd ones (GPO's inputs)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    pe = torch.zeros(length, dim)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return pe


class OrderPool(nn.Module):
    """GPO (Chen et al., VSE-infinity): each dim's values sorted in descending order, weighted by
    softmax(score(GRU(positions)) / 0.1) over the ranks. The weights depend on the rank and the
    sequence's length only (a bidirectional GRU over sinusoidal position codes, its two
    directions averaged); every sequence here has the same length (the clips)."""

    def __init__(self, code_dim: int = 32, hidden: int = 32, temperature: float = 0.1) -> None:
        super().__init__()
        self.code_dim, self.temperature = code_dim, temperature
        self.gru = nn.GRU(code_dim, hidden, batch_first=True, bidirectional=True)
        self.score = nn.Linear(hidden, 1, bias=False)
        for name, p in self.gru.named_parameters():  # the reference's init (init_weights leaves GRUs alone)
            (nn.init.xavier_uniform_ if "weight_ih" in name else nn.init.orthogonal_ if "weight_hh" in name
             else nn.init.zeros_)(p)

    def rank_weights(self, length: int, like: torch.Tensor) -> torch.Tensor:
        codes = masks.constant_on(position_codes, (length, self.code_dim), like.device, like.dtype)[None]
        out = self.gru(codes)[0][0]  # [length, 2 hidden]
        half = out.shape[-1] // 2
        return (self.score((out[:, :half] + out[:, half:]) / 2).squeeze(-1) / self.temperature).softmax(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, L, d] -> [B, d]."""
        ranked = x.sort(dim=1, descending=True).values
        return torch.einsum("l,bld->bd", self.rank_weights(x.shape[1], x), ranked)


class VideoLatent(nn.Module):
    """The probabilistic variational sampler: a Gaussian per video over the clip context x [B, L, d]:
    mu = unit(LN(p + sigmoid(FC(A(x))))), log sigma^2 = FC(A'(x)) + FC'(p), p = `OrderPool`(x);
    A, A' gated attention poolings of width d / 2 (PCME's PIE-net and uncertainty module, as RAL's
    code heads)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.pool = OrderPool()
        self.mean_pool, self.mean_fc, self.norm = GatedAttentionPool(hidden, hidden // 2), nn.Linear(hidden, hidden), \
            nn.LayerNorm(hidden)
        self.var_pool, self.var_fc = GatedAttentionPool(hidden, hidden // 2), nn.Linear(hidden, hidden)
        self.var_pooled_fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.pool(x)
        mu = F.normalize(self.norm(p + torch.sigmoid(self.mean_fc(self.mean_pool(x, mask)))), dim=-1)
        return mu, self.var_fc(self.var_pool(x, mask)) + self.var_pooled_fc(p)


# ----------------------------------------------------------------------------- register-augmented attention
@lru_cache(maxsize=256)
def register_windows(widths: tuple[float, ...], length: int, registers: int, total: int | None) -> torch.Tensor:
    """[branches, length + R, length + R]: each branch's Gaussian window on the row-row block,
    1 wherever a register takes part (the reference's gmm_mask). On the CPU, once per size."""
    out = torch.ones(len(widths), length + registers, length + registers)
    for i, w in enumerate(widths):
        out[i, :length, :length] = gaussian_weights(length, w, total)
    return out


class RegisterBranches(GaussianBranches):
    """GMMFormer v2's Gaussian branches whose rows also attend over the video's registers
    [B, R, d]: keys and values are the rows and the registers, the window weighs the row-row
    logits only, and only the rows' outputs are kept (the reference's registers attend over the
    rows as queries too, but their outputs are dropped, so that changes nothing)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor, registers: torch.Tensor | None = None) -> torch.Tensor:
        if registers is None:
            return super().forward(x, mask)
        length = x.shape[1]
        ctx = self.attend_with(x, mask, registers)[:, :, :length]
        return self.post(pack(ctx, mask, dim=1), pack(x, mask)[None])

    def attend_with(self, x: torch.Tensor, mask: torch.Tensor, registers: torch.Tensor) -> torch.Tensor:
        """Attention of every branch over [rows; registers]: -> context [branches, B, L + R, D]."""
        rows = torch.cat([x, registers], 1)
        b, length, d = rows.shape
        n, h = len(self.widths), self.heads
        keys = torch.cat([mask, mask.new_ones(b, registers.shape[1])], 1)
        q, k, v = self.qkv(rows).view(b, length, n, 3, h, d // h).permute(3, 2, 0, 4, 1, 5)
        logits = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        window = masks.constant_on(register_windows, (self.widths, x.shape[1], registers.shape[1], self.window_len),
                                   rows.device, rows.dtype)[:, None, None]
        probs = gaussian_attention(logits, window, keys[None, :, None, None, :])
        return (self.attn_drop(probs) @ v).permute(0, 1, 3, 2, 4).reshape(n, b, length, d)


class RegisterBlock(DynamicGMMBlock):
    """DreamPRVR's register-augmented Gaussian attention block: `RegisterBranches` fused per position by
    GMMFormer v2's branch weights, read by each sequence's mean token; the registers first pass a
    LayerNorm-dropout-Linear-ReLU map of the block's own (the reference's `noise_input_layer`)."""

    def __init__(self, cfg: DreamPRVRConfig, positions: int, window_len: int | None = None) -> None:
        super().__init__(cfg.hidden, cfg.heads, cfg.widths, cfg.dropout, cfg.ffn_mult, positions, cfg.temperature,
                         window_len)
        self.branches = RegisterBranches(cfg.hidden, cfg.heads, cfg.widths, cfg.dropout, cfg.ffn_mult, window_len)
        self.register_in = nn.Sequential(nn.LayerNorm(cfg.hidden), nn.Dropout(cfg.dropout),
                                         nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, token: torch.Tensor | None = None,
                registers: torch.Tensor | None = None) -> torch.Tensor:
        mask = full_mask(x) if mask is None else mask
        branches: RegisterBranches = self.branches  # type: ignore[assignment]
        out = branches(x, mask, None if registers is None else self.register_in(registers))
        return self.fuse(out, mask, token)


# ----------------------------------------------------------------------------- registers
@dataclass
class Denoising:
    """A training step's text-supervised denoising (the objective's L_dre reads it): the predicted
    noise at every step [T, V, R, d] and the noise it should match, each video's mu [V, R, d]."""

    predicted: torch.Tensor
    noise: torch.Tensor


class RegisterGenerator(nn.Module):
    """The registers of each video from its clip embedding: condition, latent, reverse chain."""

    def __init__(self, cfg: DreamPRVRConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.cfg = cfg
        self.context = GMMBlock(h, cfg.heads, [PLAIN], cfg.dropout, cfg.ffn_mult)  # mean_clip_encoder
        self.reader = CrossAttentionLayer(h, cfg.heads, cfg.dropout)  # video_qformer's cross-attention
        self.latent = VideoLatent(h)
        self.denoiser = Denoiser(h, cfg.diffusion_steps, cfg.diffusion_layers, cfg.time_embedding)
        betas = (cosine_betas(cfg.diffusion_steps, cfg.schedule_offset) if cfg.schedule == "cosine"
                 else linear_betas(cfg.diffusion_steps))
        self.diffusion = GaussianDiffusion(betas)

    def encode(self, clips: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """clips [V, C, d] (the embedded clips), tokens [R, d] (the learned register queries) ->
        the condition [V, R, d], the latent mu and log sigma^2 [V, d] and the registers [V, R, d]."""
        mask = full_mask(clips)
        context = self.context(clips, mask)
        cond = self.reader(tokens[:, None], context.flatten(0, 1)[None].expand(len(tokens), -1, -1), mask)
        cond = cond.transpose(0, 1)  # [V, R, d]
        mu, logvar = self.latent(context, mask)
        return {"dream.condition": cond, "dream.mu": mu, "dream.logvar": logvar,
                "registers": self.sample(mu[:, None].expand_as(cond), cond)}

    def sample(self, start: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """The reverse chain from x_T = start over steps T-1 .. 0, adding start as each step's noise."""
        x = start
        for t in reversed(range(self.diffusion.steps)):
            steps = torch.full((len(x),), t, dtype=torch.long, device=x.device)
            x = self.diffusion.p_step(self.denoiser(x, steps, cond), x, t, start, self.cfg.x0_clamp)
        return x

    def denoising(self, text: torch.Tensor, mu: torch.Tensor, cond: torch.Tensor) -> Denoising:
        """Every step at once: x_t = q_sample(x_0 = text samples [V, R, d], noise = mu), the
        denoiser's prediction of mu from (x_t, t, cond)."""
        steps, (v, r, d) = self.diffusion.steps, text.shape
        noise = mu[:, None].expand(v, r, d)
        t = torch.arange(steps, device=text.device).repeat_interleave(v)  # step-major, as [T, V]
        xt = self.diffusion.q_sample(text.repeat(steps, 1, 1), t, noise.repeat(steps, 1, 1))
        predicted = self.denoiser(xt, t, cond.repeat(steps, 1, 1)).view(steps, v, r, d)
        return Denoising(predicted, noise)


# ----------------------------------------------------------------------------- the reference's weights
OFFICIAL_WIDTHS = [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # e_attns.0 .. 7: plain, then 2 ** i for i = -2 .. 4


def _renamed(named: dict[str, torch.Tensor], pairs: list[tuple[str, str]], params: tuple[str, ...] = ("weight", "bias")
             ) -> dict[str, torch.Tensor]:
    """Modules the same on both sides under other names: (ours, theirs) -> each of their `params`."""
    return {f"{mine}.{p}": named[f"{theirs}.{p}"] for mine, theirs in pairs for p in params}


def from_official(named: dict[str, torch.Tensor], cfg: DreamPRVRConfig) -> dict[str, torch.Tensor]:
    """The weights of the official DreamPRVR (lijun2005/CVPR26-DreamPRVR, DreamPRVR_Net's `state_dict`, which
    its checkpoint keeps under `state_dict`) as this backbone's: the query encoder and input layers as every
    MS-SL-family reference names them; the clip encoder `clip_encoder` and frame encoder `frame_encoder`,
    each GMMFormer v2's layers `e_attns.0` .. `e_attns.7`, cross-attention `ca` and weight map `layer1`,
    `layer2`, with the register input layer `noise_input_layer`; the register generator: the clip context
    encoder `mean_clip_encoder`, the query-former `video_qformer` (its `query_tokens` our register tokens,
    its `cross_attention` our reader), the latent sampler `video_probabilistic_variational_sampler` (the
    GRU pooling `gpo`, the mean head `pie_net_video`, the variance head `uncertain_net_video`) and the
    denoiser `diffusion_mlp` (its step table, time and condition embeddings, residual `layers` and
    shortcut). Only a model of the reference's widths and diffusion depth reads them (one line otherwise)."""
    if list(cfg.widths) != OFFICIAL_WIDTHS:
        raise UserError(f"--official-weights: the official DreamPRVR has the widths {OFFICIAL_WIDTHS}; this run's "
                        f"model has {list(cfg.widths)}, so its weights do not fit it")
    out = official_inputs_and_query(named, ffn=True)
    layers = [f"e_attns.{i}" for i in range(len(OFFICIAL_WIDTHS))]
    for mine, theirs in (("clip_block", "clip_encoder"), ("frame_block", "frame_encoder")):
        out.update(official_branches(named, f"{mine}.branches", [f"{theirs}.{a}" for a in layers], ffn=True))
        out.update(official_cross(named, f"{mine}.cross", f"{theirs}.ca"))
        out.update(_renamed(named, [(f"{mine}.layer1", f"{theirs}.layer1"), (f"{mine}.layer2", f"{theirs}.layer2"),
                                    (f"{mine}.register_in.0", f"{theirs}.noise_input_layer.LayerNorm"),
                                    (f"{mine}.register_in.2", f"{theirs}.noise_input_layer.net.1")]))
    out.update(official_branches(named, "generator.context.branches", ["mean_clip_encoder"], ffn=True))
    out.update(official_cross(named, "generator.reader", "video_qformer.cross_attention"))
    out["register_tokens"] = named["video_qformer.query_tokens"].reshape(cfg.registers, cfg.hidden)
    latent, sampler = "generator.latent", "video_probabilistic_variational_sampler"
    gru = [f"{w}_{k}_l0{d}" for w in ("weight", "bias") for k in ("ih", "hh") for d in ("", "_reverse")]
    out.update(_renamed(named, [(f"{latent}.pool.gru", f"{sampler}.gpo.gru")], tuple(gru)))
    out.update(_renamed(named, [(f"{latent}.pool.score", f"{sampler}.gpo.linear")], ("weight",)))
    out.update(official_gaussian_head(named, latent, f"{sampler}.pie_net_video", f"{sampler}.uncertain_net_video",
                                      sigma="var"))
    den, mlp = "generator.denoiser", "diffusion_mlp"
    out[f"{den}.step_table"] = named[f"{mlp}.time_embedding.timembedding.0.weight"]
    pairs = [(f"{den}.time.0", f"{mlp}.time_embedding.timembedding.1"),
             (f"{den}.time.2", f"{mlp}.time_embedding.timembedding.3"),
             (f"{den}.cond.0", f"{mlp}.cond_embedding.0"), (f"{den}.cond.2", f"{mlp}.cond_embedding.2"),
             (f"{den}.shortcut", f"{mlp}.short_cut")]
    for i in range(cfg.diffusion_layers):  # the reference's own spelling, `blcok`
        block, layer = f"{den}.blocks.{i}", f"{mlp}.layers.{i}"
        pairs += [(f"{block}.block_in.0", f"{layer}.blcok_in.0"), (f"{block}.block_in.2", f"{layer}.blcok_in.2"),
                  (f"{block}.time.1", f"{layer}.temb_proj.1"), (f"{block}.cond.1", f"{layer}.cond_proj.1"),
                  (f"{block}.block_out.0", f"{layer}.blcok_out.0"), (f"{block}.block_out.2", f"{layer}.blcok_out.3"),
                  (f"{block}.shortcut", f"{layer}.short_cut")]
    return {**out, **_renamed(named, pairs)}


@BACKBONES.register("dreamprvr", "DreamPRVR: GMMFormer v2 blocks attending over diffusion-generated video registers")
class DreamPRVR(GMMFormer2):
    """GMMFormer v2's query encoder and scores (inherited) with DreamPRVR's video encoders."""

    config_cls = DreamPRVRConfig
    official = ("lijun2005/CVPR26-DreamPRVR", from_official)  # `evaluate --official-weights`: whose weights, their map
    cfg: DreamPRVRConfig
    provides: ClassVar[frozenset[str]] = GMMFormer2.provides | {"diffusion"}

    def __init__(self, cfg: DreamPRVRConfig, video_dim: int, query_dim: int) -> None:
        nn.Module.__init__(self)  # v2's scoring, not its blocks: the encoders below replace them
        self.cfg = cfg
        h = cfg.hidden
        self.query_encoder = QueryEncoder(query_dim, h, cfg.heads, cfg.max_query_len, cfg.input_dropout, cfg.dropout,
                                          cfg.ffn_mult)
        self.clip_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.clip_block = RegisterBlock(cfg, cfg.num_clips)
        self.frame_embed = InputEmbedding(video_dim, h, cfg.max_frames, cfg.input_dropout)
        self.frame_block = RegisterBlock(cfg, cfg.max_frames, window_len=cfg.max_frames)
        self.generator = RegisterGenerator(cfg)
        init_weights(self, cfg.init_std)
        self.generator.denoiser.reset_table(cfg.init_std)
        self.register_tokens = nn.Parameter(torch.randn(cfg.registers, h))  # video_qformer's query_tokens, N(0, 1)

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        return {"query": self.query_encoder(qb.tokens, qb.token_mask)}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        clips_in = self.clip_embed(vb.clips)
        out = self.generator.encode(clips_in, self.register_tokens)
        registers = out.pop("registers")
        clips = self.clip_block(clips_in, None, None, registers)
        frames = self.frame_block(self.frame_embed(vb.frames, vb.frame_mask), vb.frame_mask, None, registers)
        return {"clips": clips, "frames": frames, "frame_mask": vb.frame_mask, **out}

    def step_extras(self, queries: Encoded, videos: Encoded, video_of_query: torch.Tensor) -> OnDemand[Denoising]:
        """A training step's `Denoising` under DENOISING (harness/base/contract.py `StepExtras`),
        computed when the objective first reads it: x_0 from each video's mean labelled query."""
        return OnDemand({DENOISING: partial(self.denoising, queries, videos, video_of_query)})

    def denoising(self, queries: Encoded, videos: Encoded, video_of_query: torch.Tensor) -> Denoising:
        query, mu = queries["query"], videos["dream.mu"]
        sums = query.new_zeros(len(mu), query.shape[1]).index_add(0, video_of_query, query)
        counts = torch.zeros(len(mu), device=query.device, dtype=query.dtype).index_add(
            0, video_of_query, torch.ones_like(video_of_query, dtype=query.dtype))
        text = perturb_text(sums / counts.clamp(min=1)[:, None], self.cfg.registers, self.cfg.text_perturbation)
        return self.generator.denoising(text, mu, videos["dream.condition"])
