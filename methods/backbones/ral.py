"""RAL's modules (Zhang et al., RAL; shared/seeds/002_*): the Gaussian heads of MSRA
(Eq. 3-7), the query support set (Eq. 5) and CSA's word-confidence gate (Eq. 12).

Every module takes padding masks and is invariant to padding (the reference's attention
poolings omit the mask; here padded rows never take part). Sizes at d = 384 reproduce the
reference's parameter counts: per modality, aggregator + mean and log-sigma heads 592,128
(the reference's PIENet + UncertaintyModule pair has the same count), the gate 148,225.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

AGGREGATIONS = ("both", "local", "global")  # Table 4: g = LN(x^g + x^l), local only, global only


class GatedAttentionPool(nn.Module):
    """Eq. 6, local: x^l = softmax(w2 tanh(W1 X)) X over the real rows, W1 in R^{d x d}, w2 in R^d."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, hidden, bias=False)
        self.w2 = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.w2(torch.tanh(self.w1(x))).squeeze(-1).masked_fill(~mask, float("-inf"))
        return torch.einsum("bl,bld->bd", logits.softmax(-1), x)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real rows of each item: [B, L, d], [B, L] -> [B, d]."""
    w = mask.to(x.dtype)
    return torch.einsum("bl,bld->bd", w, x) / w.sum(-1, keepdim=True).clamp_min(1)


class Aggregator(nn.Module):
    """Eq. 6-7: g(X) = LayerNorm(FC(MeanPool(X)) + GatedAttention(X)); `mode` local or global
    keeps one term (Table 4)."""

    def __init__(self, hidden: int, mode: str = "both") -> None:
        super().__init__()
        if mode not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {mode!r}")
        self.mode = mode
        self.fc = nn.Linear(hidden, hidden)
        self.local = GatedAttentionPool(hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        parts = []
        if self.mode in ("both", "global"):
            parts.append(self.fc(masked_mean(x, mask)))
        if self.mode in ("both", "local"):
            parts.append(self.local(x, mask))
        return self.norm(sum(parts))


class GaussianHead(nn.Module):
    """Eq. 3: mu = h_mu(g(X)), log sigma = h_sigma(g(X)), one diagonal Gaussian per item."""

    def __init__(self, hidden: int, mode: str = "both") -> None:
        super().__init__()
        self.aggregate = Aggregator(hidden, mode)
        self.mu = nn.Linear(hidden, hidden)
        self.log_sigma = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.aggregate(x, mask)
        return self.mu(g), self.log_sigma(g)


class ConfidenceGate(nn.Module):
    """Eq. 12: g = MLP(Q), two linear layers with a ReLU between; one logit per word (the
    masked softmax over words is `objectives.ral.word_confidences`)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens).squeeze(-1)


def support_sets(tokens: torch.Tensor, mask: torch.Tensor, video_of_query: torch.Tensor,
                 num_videos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5: for each video of the batch, the real tokens of all its labelled queries in a
    row (query order kept), padded to the longest set: ([V, S, d], [V, S] mask). The labels
    decide the sets (`video_of_query`: each query's video column), never a detector; the
    capacity S is the batch's longest set, not a fixed count."""
    lengths = mask.sum(-1)
    per_video = torch.zeros(num_videos, dtype=torch.long, device=tokens.device).index_add_(0, video_of_query, lengths)
    longest = int(per_video.max()) if num_videos else 0
    out = tokens.new_zeros((num_videos, max(longest, 1), tokens.shape[-1]))
    out_mask = torch.zeros((num_videos, max(longest, 1)), dtype=torch.bool, device=tokens.device)
    fill = [0] * num_videos
    for q in range(tokens.shape[0]):  # a batch holds a few hundred queries
        v, n = int(video_of_query[q]), int(lengths[q])
        out[v, fill[v] : fill[v] + n] = tokens[q][mask[q]]
        out_mask[v, fill[v] : fill[v] + n] = True
        fill[v] += n
    return out, out_mask

