"""RAL's losses and scores as pure functions (Zhang et al., RAL; shared/seeds/002_*, Eq. 8-12).

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
- `csa_scores` (Eq. 11-12): sum over words of confidence x best frame cosine, computed in
  chunks of videos so that no [queries, videos, words, frames] tensor exceeds a budget;
  `csa_reference` is the unchunked definition the tests compare it with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prvr.harness import masks
from prvr.harness.registry import OBJECTIVES

PM_READINGS = ("paper", "code")
KL_READINGS = ("std", "code")  # L_DA: sigma a standard deviation in both KLs, or the reference's mix


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


def word_confidences(logits: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 12's g: a softmax over each query's real words (padding gets 0). logits [Q, L]."""
    return logits.masked_fill(~token_mask, float("-inf")).softmax(-1)


class _BestFrame(torch.autograd.Function):
    """best[q, v, l] = max over the real frames t of video v of <tokens[q, l], frames[v, t]>:
    tokens [Q, L, d], frames [V, T, d], frame_mask [V, T] -> [Q, V, L].

    The gradient is autograd's for a max (each word's gradient goes to its best frame), as two
    products with the sparse [Q L, V T] matrix holding one entry per (query, word, video): Q V L d
    multiply-adds, where autograd builds the dense [Q, V, L, T] gradient and runs two products
    over it (T times more). Only the best frames' indices are kept for the backward."""

    @staticmethod
    def forward(ctx, tokens, frames, frame_mask):
        sims = torch.einsum("qld,vtd->qvlt", tokens, frames)
        sims.masked_fill_(~frame_mask[None, :, None, :], float("-inf"))
        best, index = sims.max(-1)
        ctx.save_for_backward(tokens, frames, index)
        return best

    @staticmethod
    def backward(ctx, grad):
        tokens, frames, index = ctx.saved_tensors
        (q, length, d), (v, t) = tokens.shape, frames.shape[:2]
        word = torch.arange(q * length, device=index.device).view(q, 1, length).expand(q, v, length)
        best_row = index + (torch.arange(v, device=index.device) * t).view(1, v, 1)  # in frames viewed [V T, d]
        routes = torch.sparse_coo_tensor(torch.stack([word.reshape(-1), best_row.reshape(-1)]), grad.reshape(-1),
                                         (q * length, v * t), check_invariants=False)
        grad_tokens = grad_frames = None
        if ctx.needs_input_grad[0]:
            grad_tokens = torch.sparse.mm(routes, frames.reshape(v * t, d)).view_as(tokens)
        if ctx.needs_input_grad[1]:
            grad_frames = torch.sparse.mm(routes.t(), tokens.reshape(q * length, d)).view_as(frames)
        return grad_tokens, grad_frames, None


def csa_scores(tokens: torch.Tensor, token_mask: torch.Tensor, weights: torch.Tensor, frames: torch.Tensor,
               frame_mask: torch.Tensor, budget: int = 1 << 24, cosine: bool = True,
               floor: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 11-12: S(q, v) = sum_i g_i max_j sim(q_i, v_j) over real words i and real frames j.

    tokens [Q, L, d], token_mask [Q, L], weights [Q, L] (zero on padding), frames [V, T, d],
    frame_mask [V, T]; -> [Q, V]. `cosine`: cosine similarity (False: raw dot products, the
    reference's unnormalised score for NCE). Computed over chunks of videos so that the
    [Q, chunk, L, T] similarities stay within `budget` elements; with gradients each chunk keeps
    only the index of each word's best frame (`_BestFrame`), not the similarities, and the
    backward costs Q V L d instead of 2 Q V L T d.

    `floor` [V] bool: videos whose every word scores at least 0, as if a zero frame were among
    their frames (the reference pads each video's encoded frames to 128 with zero vectors, which
    take part in the max: `ral.padded_frames=zero`)."""
    if cosine:
        tokens, frames = F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1)
    q, length = tokens.shape[:2]
    v, t = frames.shape[:2]
    step = max(1, budget // max(1, q * length * t))
    parts = []
    for s in range(0, v, step):
        best = _BestFrame.apply(tokens, frames[s : s + step], frame_mask[s : s + step])  # [Q, chunk, L]
        if floor is not None:
            best = torch.where(floor[None, s : s + step, None], best.clamp_min(0.0), best)
        best = best.masked_fill(~token_mask[:, None, :], 0.0)  # a video without frames never reaches here
        parts.append((best * weights[:, None, :]).sum(-1))
    return torch.cat(parts, 1) if parts else tokens.new_zeros((q, 0))


def csa_reference(tokens: torch.Tensor, token_mask: torch.Tensor, weights: torch.Tensor, frames: torch.Tensor,
                  frame_mask: torch.Tensor, cosine: bool = True, floor: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, one pair at a time, differentiated by autograd (tests only)."""
    unit = (lambda x: F.normalize(x, dim=-1)) if cosine else (lambda x: x)
    out = tokens.new_zeros((tokens.shape[0], frames.shape[0]))
    for i in range(tokens.shape[0]):
        words = unit(tokens[i][token_mask[i]])
        for j in range(frames.shape[0]):
            fr = unit(frames[j][frame_mask[j]])
            if floor is not None and floor[j]:  # one zero frame among the real ones
                fr = torch.cat([fr, fr.new_zeros((1, fr.shape[1]))])
            out[i, j] = (weights[i][token_mask[i]] * (words @ fr.t()).max(1).values).sum()
    return out
