"""DreamPRVR's loss terms beyond GMMFormer v2's, pure functions of tensors (CVPR26-DreamPRVR
src/Losses/loss.py; the names are the paper's):

- query similarity preservation (with GMMFormer v2's focal query diversity, the paper's textual
  semantic structure learning): queries of the same video close on the unit sphere;
- the probabilistic variational sampler's KL to the standard normal;
- the diffusion's denoising error: the predicted noise against each video's latent mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prvr.harness.base.registry import OBJECTIVES


@OBJECTIVES.register("dreamprvr-query-similarity", "DreamPRVR: supervised contrast between queries of the same video")
def query_similarity_preservation(queries: torch.Tensor, pairs: torch.Tensor, tau: float) -> torch.Tensor:
    """SupCon over the batch's queries [Q, D]: for each query i with partners (pairs [Q, Q] bool,
    distinct queries of the same video: `same_video_pairs`), -mean over partners p of
    log( exp(cos(i, p) / tau) / sum_{j != i} exp(cos(i, j) / tau) ); the mean over queries that have
    a partner, 0 when none has."""
    x = F.normalize(queries, dim=-1)
    logits = x @ x.t() / tau
    others = ~torch.eye(len(x), dtype=torch.bool, device=x.device)
    log_prob = logits - logits.masked_fill(~others, float("-inf")).logsumexp(1, keepdim=True)
    p = (pairs & others).to(x.dtype)
    count = p.sum(1)
    per_query = (p * log_prob.masked_fill(~others, 0)).sum(1) / count.clamp(min=1)
    has = (count > 0).to(x.dtype)
    return -(per_query * has).sum() / has.sum().clamp(min=1)


@OBJECTIVES.register("dreamprvr-latent-kl", "DreamPRVR: KL of each video's latent Gaussian to N(0, I)")
def latent_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, exp(logvar)) || N(0, I)) summed over dims, averaged over videos: mu, logvar [V, d]."""
    return -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum() / len(mu)


@OBJECTIVES.register("dreamprvr-denoising", "DreamPRVR: squared error of the predicted noise at every diffusion step")
def denoising_error(predicted: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Mean squared error of predicted [T, V, R, d] against noise [V, R, d] (the same at every step)."""
    return (predicted - noise[None]).pow(2).mean()
