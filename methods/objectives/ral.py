"""RAL's losses and scores as pure functions (Zhang et al., RAL; docs/references.md, Eq. 8-12).

Distributions are diagonal Gaussians given by (mu, log sigma), sigma = exp(log sigma) the
standard deviation everywhere (sampling, both KL terms). The reference code reads
exp(log sigma) as a variance in the prior KL and as a standard deviation in the cross-modal
KL and in the sampling; one reading has to hold for all three, and Eq. 9 (mu + sigma * eps)
fixes it as the standard deviation. `distribution_alignment(..., reading="code")` gives the
reference's mix, for parity runs only (`loss.kl_reading`).

- `gaussian_kl`, `kl_to_standard`, `distribution_alignment` (Eq. 8, L_DA);
- `sample_proxies` (Eq. 9, reparameterisation, from a given torch.Generator);
- `proxy_matching` (Eq. 10, L_PM): the paper's multi-instance InfoNCE on cosine / temperature
  from text proxies to video proxies, or the reference code's reading (raw dot products,
  the mean log-softmax over the K x K same-video pairs, both directions);
- the CSA score (Eq. 11-12) and its word confidences are part of RAL's forward pass, so they
  live with RAL's backbone: methods/backbones/ral.py (`csa_scores`, `word_confidences`).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F

from prvr.harness.base import masks
from prvr.harness.base.registry import OBJECTIVES

PmReading = Literal["paper", "code"]  # L_PM: the paper's reading or the reference code's
PM_READINGS: tuple[PmReading, ...] = get_args(PmReading)
KlReading = Literal["std", "code"]  # L_DA: sigma a standard deviation in both KLs, or the reference's mix
KL_READINGS: tuple[KlReading, ...] = get_args(KlReading)


def gaussian_kl(mu_p: torch.Tensor, log_sigma_p: torch.Tensor, mu_q: torch.Tensor,
                log_sigma_q: torch.Tensor) -> torch.Tensor:
    """KL(N(mu_p, sigma_p^2 I) || N(mu_q, sigma_q^2 I)) per row, summed over the last dim:
    sum log(sigma_q / sigma_p) + (sigma_p^2 + (mu_p - mu_q)^2) / (2 sigma_q^2) - 1/2."""
    var_ratio = torch.exp(2 * (log_sigma_p - log_sigma_q))
    mean_term = (mu_p - mu_q).pow(2) * torch.exp(-2 * log_sigma_q)
    return (log_sigma_q - log_sigma_p + 0.5 * (var_ratio + mean_term) - 0.5).sum(-1)


def kl_to_standard(mu: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, sigma^2 I) || N(0, I)) per row: 1/2 sum (sigma^2 + mu^2 - 1 - 2 log sigma)."""
    return 0.5 * (torch.exp(2 * log_sigma) + mu.pow(2) - 1 - 2 * log_sigma).sum(-1)


@OBJECTIVES.register("ral-distribution-alignment",
                     "RAL Eq. 8: KL(text || video) + KL of each to N(0, I), mean over pairs")
def distribution_alignment(mu_t: torch.Tensor, log_sigma_t: torch.Tensor, mu_v: torch.Tensor,
                           log_sigma_v: torch.Tensor, reading: str = "std") -> torch.Tensor:
    """L_DA over matched rows (row i of the text side is paired with row i of the video side).

    reading std: sigma = exp(log sigma) a standard deviation in every term. reading code (the
    reference's, for parity runs): the same cross-modal KL, but the prior KLs read exp(log sigma)
    as a variance, i.e. as N(mu, exp(log sigma) I), whose standard deviation is exp(log sigma / 2).
    Which means are passed (mu, or the mean of the sampled proxies as the reference) is the caller's."""
    if reading not in KL_READINGS:
        raise ValueError(f"reading must be one of {', '.join(KL_READINGS)}, got {reading!r}")
    cross = gaussian_kl(mu_t, log_sigma_t, mu_v, log_sigma_v)
    scale = 1.0 if reading == "std" else 0.5
    prior = kl_to_standard(mu_t, scale * log_sigma_t) + kl_to_standard(mu_v, scale * log_sigma_v)
    return (cross + prior).mean()


def sample_proxies(mu: torch.Tensor, log_sigma: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """[N, d] -> [N, K, d] proxies mu + sigma * eps (Eq. 9), eps from `generator`; K = 0 gives
    the mean as the one proxy (Table 3, "w/o sampling")."""
    if k == 0:
        return mu[:, None]
    eps = torch.randn((mu.shape[0], k, mu.shape[1]), generator=generator, device=mu.device, dtype=mu.dtype)
    return mu[:, None] + torch.exp(log_sigma)[:, None] * eps


@OBJECTIVES.register("ral-proxy-matching",
                     "RAL Eq. 10: multi-instance InfoNCE between text and video proxies (paper or code reading)")
def proxy_matching(text: torch.Tensor, video: torch.Tensor, temperature: float = 0.05, reading: str = "paper",
                   video_of_text: torch.Tensor | None = None) -> torch.Tensor:
    """L_PM. text [Bt, K, d], video [Bv, K', d]; `video_of_text` [Bt]: the video row each text
    distribution is paired with (default: row b with row b, Bt = Bv). The proxies of the paired
    video are the positives, every other video's are negatives.

    paper: for each text proxy, -log(sum over the pair's K' video proxies of exp(cos / T) /
    sum over all Bv K' video proxies), averaged over the Bt K text proxies.
    code: logits = raw dot products; each row's loss is the mean over its positive columns of
    -log_softmax, averaged over rows, for text-to-video and video-to-text, then halved."""
    if reading not in PM_READINGS:
        raise ValueError(f"reading must be one of {', '.join(PM_READINGS)}, got {reading!r}")
    bt, k, d = text.shape
    bv, kv = video.shape[:2]
    pair = torch.arange(bt, device=text.device) if video_of_text is None else video_of_text
    same = pair[:, None] == torch.arange(bv, device=text.device)[None]  # [Bt, Bv]
    pos = same.repeat_interleave(k, 0).repeat_interleave(kv, 1)  # [Bt K, Bv K']
    if reading == "paper":
        logits = F.normalize(text.reshape(bt * k, d), dim=-1) @ F.normalize(video.reshape(bv * kv, d), dim=-1).t()
        logits = logits / temperature
        return (torch.logsumexp(logits, 1) - torch.logsumexp(logits.masked_fill(~pos, float("-inf")), 1)).mean()
    logits = text.reshape(bt * k, d) @ video.reshape(bv * kv, d).t()
    pos = pos.float()
    t2v = -(F.log_softmax(logits, 1) * pos).sum(1) / pos.sum(1)
    col = pos.t()
    v2t = -(F.log_softmax(logits.t(), 1) * col).sum(1) / col.sum(1).clamp_min(1)
    has_text = col.sum(1) > 0  # a video without a paired text distribution has no positive
    every = bt >= bv if video_of_text is None else masks.known(video_of_text).covers == bv  # known on the host
    return 0.5 * (t2v.mean() + (v2t.mean() if every else v2t[has_text].mean()))


