"""Building blocks of the MS-SL family (MS-SL, GMMFormer, GMMFormer v2).

Every block takes a padded sequence [B, L, D] and a boolean mask [B, L] (True = real).
Per-token maps run on the real rows only (padding rows come back as zeros) and attention
never gives weight to a padded key, so a sequence encodes the same whatever padding its
batch adds. Under torch.compile (`train.compile`) the per-token maps run on every row and the
padding rows are zeroed after (`pack` / `unpack`): the real rows' values are the same, and no
size of the graph is read from the data. The reference code ties GMMFormer's Gaussian windows
to the padded length and lets zeroed padding frames take part in max-pooling; these blocks do
neither.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from prvr.harness.base import masks
from prvr.harness.base.batches import VideoBatch
from prvr.harness.base.checks import require
from prvr.harness.base.contract import Encoded, OnDemand, Scores

# frames the reference pads to max_ctx_l: exclude (ours: padding takes no part) or zero (the reference's
# zero vectors, which take part: RAL's CSA max, the GMMFormer v2 family's frame encoder and frame max)
PaddedFrames = Literal["exclude", "zero"]
PLAIN = 0.0  # a branch width of 0 means plain attention (the reference's `wid=None`)


# ----------------------------------------------------------------------------- padding
def pack(x: torch.Tensor, mask: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The real rows of a padded tensor whose dims (dim, dim + 1) are [B, L], as one dim N
    (`x[mask]` at `dim`). What the mask looks like is read from its description
    (harness/base/masks.py: the loader describes its batches' masks), so nothing is asked of the device.
    While torch.compile traces, every row is kept (N = B * L), the padding too: a count of real
    rows would be read from the data, a graph break at each call. Per-row maps leave the real rows
    as they would be, and `unpack` zeroes the others."""
    if torch.compiler.is_compiling() or masks.all_true(mask):
        return x.flatten(dim, dim + 1)
    return x.flatten(dim, dim + 1).index_select(dim, masks.true_index(mask))


def unpack(rows: torch.Tensor, mask: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Inverse of `pack`: real rows (N at `dim`) back into a zero-padded [B, L] layout."""
    if torch.compiler.is_compiling():  # every row was kept (`pack`): zero the padding rows
        real = mask.view(*mask.shape, *[1] * (rows.dim() - dim - 1))  # [B, L, 1, ...] against the rows' dims
        return torch.where(real, rows.unflatten(dim, mask.shape), 0)
    if rows.shape[dim] == mask.numel():
        return rows.unflatten(dim, mask.shape)
    out = rows.new_zeros((*rows.shape[:dim], mask.numel(), *rows.shape[dim + 1 :]))
    return out.index_copy(dim, masks.true_index(mask), rows).unflatten(dim, mask.shape)


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Apply a per-token map to the real rows only; padding rows of the result are zeros."""
    if mask is None:
        return fn(x)
    return unpack(fn(pack(x, mask)), mask)


def full_mask(x: torch.Tensor) -> torch.Tensor:
    """An all-true [B, L] mask of x, described as such (harness/base/masks.py)."""
    return masks.describe(torch.ones(x.shape[:2], dtype=torch.bool, device=x.device), all_true=True)


# ----------------------------------------------------------------------------- per-branch layers
class BranchLinear(nn.Module):
    """One linear map per branch on branch-major rows: [branches, N, in] -> [branches, N, out].
    The bias is stored flat (1-D) so that the trainer exempts it from weight decay."""

    def __init__(self, branches: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(branches, in_dim, out_dim))
        self.bias = nn.Parameter(torch.zeros(branches * out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias.view(self.weight.shape[0], 1, -1), x, self.weight)

    def reference_parts(self) -> dict[str, int]:
        """The reference code's tensors in each parameter (harness/engine/optim.py): one map per branch."""
        return {"weight": self.weight.shape[0], "bias": self.weight.shape[0]}


class BranchLayerNorm(nn.Module):
    """One LayerNorm per branch over branch-major rows [branches, N, dim] (affine parameters stored flat)."""

    def __init__(self, branches: int, dim: int) -> None:
        super().__init__()
        self.branches, self.dim = branches, dim
        self.weight = nn.Parameter(torch.ones(branches * dim))
        self.bias = nn.Parameter(torch.zeros(branches * dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (self.branches, 1, self.dim)
        return torch.addcmul(self.bias.view(shape), F.layer_norm(x, (self.dim,)), self.weight.view(shape))

    def reference_parts(self) -> dict[str, int]:
        """The reference code's tensors in each parameter (harness/engine/optim.py): one norm per branch."""
        return {"weight": self.branches, "bias": self.branches}


# ----------------------------------------------------------------------------- inputs
class InputEmbedding(nn.Module):
    """The MS-SL family's input layer and learned positions:
    LayerNorm(in) -> dropout -> Linear -> ReLU, then LayerNorm(x + position) -> dropout.
    The costly input map runs on real rows only."""

    def __init__(self, in_dim: int, hidden: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.in_norm = nn.LayerNorm(in_dim)
        self.in_drop = nn.Dropout(dropout)
        self.linear = nn.Linear(in_dim, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        length = x.shape[1]
        if length > self.positions.num_embeddings:
            raise ValueError(f"sequence of {length} rows but only {self.positions.num_embeddings} learned positions; "
                             "raise the backbone's max_frames / max_query_len or lower data.max_frames / "
                             "data.num_clips")
        h = rowwise(lambda r: F.relu(self.linear(self.in_drop(self.in_norm(r))), inplace=True), x, mask)
        return self.drop(self.norm(h + self.positions.weight[:length]))


class AttentionPool(nn.Module):
    """Masked attention pooling of a sequence into one vector (MS-SL's `modular_vector_mapping`)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.score = nn.Linear(hidden, 1, bias=False)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.score(h).squeeze(-1).masked_fill(~mask, float("-inf"))
        return torch.einsum("bl,bld->bd", logits.softmax(-1), h)


# ----------------------------------------------------------------------------- Gaussian attention
def gaussian_weights(length: int, width: float, total: int | None = None,
                     device: torch.device | None = None) -> torch.Tensor:
    """GMMFormer's Gaussian window [length, length].

    Row i is a Gaussian over the positions linspace(0, 1, total), centred at i / total with
    sigma = max(width, 0.01) / 9, scaled to a row maximum of 1; `total` (default `length`)
    fixes the scale, so a sequence's window does not depend on its padding. Width 0: all ones.
    Made on the CPU unless `device` names another.
    """
    total = total or length
    if length > total:
        raise ValueError(f"Gaussian window over {total} positions cannot cover {length} rows")
    if width <= PLAIN:
        return torch.ones(length, length, device=device)
    centre = torch.arange(total, dtype=torch.float64, device=device)[:, None] / total
    position = torch.linspace(0, 1, total, dtype=torch.float64, device=device)[None, :]
    sigma = max(width, 1e-2) / 9
    w = torch.exp(-((position - centre) ** 2) / (2 * sigma**2))
    return (w / w.max(-1, keepdim=True).values)[:length, :length].float()


def windows(widths: tuple[float, ...], length: int, total: int | None,
            device: torch.device | None = None) -> torch.Tensor:
    """One Gaussian window per branch width: [branches, length, length]."""
    return torch.stack([gaussian_weights(length, w, total, device) for w in widths])


_windows = lru_cache(maxsize=64)(windows)  # on the CPU, once per (widths, length, total)


def gaussian_attention(logits: torch.Tensor, window: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Attention weights of GMMFormer: the window multiplies the scaled logits (it does not add
    to them), then padded keys are removed and the rows softmax-normalised.
    logits [..., Lq, Lk]; window and key_mask broadcast against it."""
    return masks.keep_where(logits * window, key_mask, float("-inf")).softmax(-1)


class GaussianBranches(nn.Module):
    """len(widths) parallel self-attention layers over one sequence, each with its own window.

    ffn_mult = 0: BERT attention layer of the MS-SL code (attention, dense, dropout, residual,
    LayerNorm); GMMFormer's GMM block averages four of them.
    ffn_mult > 0: post-LN transformer layer of GMMFormer v2 (attention, dropout, residual,
    LayerNorm, feed-forward of ffn_mult x hidden, dropout, residual, LayerNorm).
    Returns the real rows of every branch, branch-major: [branches, N, hidden].
    """

    def __init__(self, hidden: int, heads: int, widths: list[float], dropout: float, ffn_mult: int = 0,
                 window_len: int | None = None) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        n = len(widths)
        self.widths, self.heads, self.window_len = tuple(float(w) for w in widths), heads, window_len
        self.qkv = nn.Linear(hidden, n * 3 * hidden)  # q, k, v of every branch in one product
        self.attn_drop = nn.Dropout(dropout)
        self.drop = nn.Dropout(dropout)
        self.ffn_mult = ffn_mult
        if ffn_mult == 0:
            self.dense = BranchLinear(n, hidden, hidden)
            self.norm = BranchLayerNorm(n, hidden)
        else:
            self.norm1 = BranchLayerNorm(n, hidden)
            self.ffn_in = BranchLinear(n, hidden, ffn_mult * hidden)
            self.ffn_out = BranchLinear(n, ffn_mult * hidden, hidden)
            self.norm2 = BranchLayerNorm(n, hidden)

    def reference_parts(self) -> dict[str, int]:
        """The reference code's tensors in each parameter (harness/engine/optim.py): the q/k/v product
        holds each branch's query, key and value maps (separate nn.Linear in MS-SL's and GMMFormer's
        BertSelfAttention), in that order along its output rows."""
        n = 3 * len(self.widths)
        return {"qkv.weight": n, "qkv.bias": n}

    def forward(self, x: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of `mask` [B, L], each attending to the rows of `keys` (default: `mask`) -> [branches, N, D]."""
        return self.post(pack(self.attend(x, mask, keys), mask, dim=1), pack(x, mask)[None])

    def attend(self, x: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """Multi-head attention of every branch: [B, L, D] -> context [branches, B, L, D]; the rows of
        `mask` attend to those of `keys` (default: `mask`)."""
        b, length, d = x.shape
        n, h = len(self.widths), self.heads
        qkv = rowwise(self.qkv, x, mask).view(b, length, n, 3, h, d // h)
        q, k, v = qkv.permute(3, 2, 0, 4, 1, 5)  # each [branches, B, heads, L, d/h]
        logits = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        if torch.compiler.is_compiling():  # made in the graph and on the device: its length is a graph size
            window = windows(self.widths, length, self.window_len, x.device).to(x.dtype)
        else:
            window = masks.constant_on(_windows, (self.widths, length, self.window_len), x.device, x.dtype)
        window = window[:, None, None]
        probs = gaussian_attention(logits, window, (mask if keys is None else keys)[None, :, None, None, :])
        return (self.attn_drop(probs) @ v).permute(0, 1, 3, 2, 4).reshape(n, b, length, d)

    def post(self, ctx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per-token output sub-layers: ctx [branches, N, D], x [1, N, D]."""
        if self.ffn_mult == 0:
            return self.norm(self.drop(self.dense(ctx)) + x)
        h = self.norm1(x + self.drop(ctx))
        return self.norm2(h + self.drop(self.ffn_out(self.drop(F.relu(self.ffn_in(h), inplace=True)))))


class GMMBlock(nn.Module):
    """GMMFormer's GMM block: the mean of the Gaussian branches. With widths [0] it is the
    single attention layer of MS-SL's encoders."""

    def __init__(self, hidden: int, heads: int, widths: list[float], dropout: float, ffn_mult: int = 0,
                 window_len: int | None = None) -> None:
        super().__init__()
        self.branches = GaussianBranches(hidden, heads, widths, dropout, ffn_mult, window_len)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                keys: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of `mask` (default: every row; the others 0), each attending to the rows of `keys`
        (default: `mask`)."""
        mask = full_mask(x) if mask is None else mask
        return unpack(self.branches(x, mask, keys).mean(0), mask)


class CrossAttentionLayer(nn.Module):
    """A learned token attends over each of several sequences (GMMFormer v2's cross-attention
    for branch weights): attention, dropout, residual, LayerNorm, feed-forward (hidden ->
    hidden), dropout, residual, LayerNorm."""

    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.kv = nn.Linear(hidden, 2 * hidden)
        self.attn_drop = nn.Dropout(dropout)
        self.drop = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(hidden)
        self.ffn_in = nn.Linear(hidden, hidden)
        self.ffn_out = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, token: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """token [D] (one for every sequence, v2's learned token) or [B, D] (each sequence's own: Holmes'
        and HLFormer's mean token); rows [S, N, D]: the real rows of S sequence sets that share the
        padding mask [B, L] -> [S, B, D]."""
        s, d, h = rows.shape[0], rows.shape[-1], self.heads
        k, v = unpack(self.kv(rows), mask, dim=1).unflatten(-1, (2, h, d // h)).permute(3, 0, 1, 4, 2, 5)
        q = self.q(token).unflatten(-1, (h, 1, d // h))  # [h, 1, d/h] or [B, h, 1, d/h]
        logits = masks.keep_where(q @ k.transpose(-1, -2) / math.sqrt(d // h), mask[None, :, None, None, :],
                                  float("-inf"))
        ctx = (self.attn_drop(logits.softmax(-1)) @ v).reshape(s, -1, d)  # [S, B, D]
        x = self.norm1(token + self.drop(ctx))
        return self.norm2(x + self.drop(self.ffn_out(self.drop(F.relu(self.ffn_in(x), inplace=True)))))


def pad_rows(x: torch.Tensor, mask: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, L, ...] and its mask [B, L] padded with zero rows (False in the mask) to [B, total, ...]:
    the reference's frame tensors, padded to max_ctx_l (128) whatever the batch's longest video. The
    padded mask carries what is known of `mask` (harness/base/masks.py), moved to the new width, so
    that packing by it asks the device nothing."""
    length = x.shape[1]
    extra = total - length
    if extra < 0:
        raise ValueError(f"sequence of {length} rows cannot be padded to {total}")
    if extra == 0:
        return x, mask
    rows = F.pad(x, (0, 0) * (x.dim() - 2) + (0, extra))
    facts = masks.known(mask)
    padded: dict[str, object] = {"all_true": False, "cols": False}  # the added columns hold no real row
    if facts.index is not None or facts.all_true:
        index = masks.true_index(mask)
        padded["index"] = index // length * total + index % length
    if facts.all_true:
        padded.update(rows=True, lengths=(length,) * mask.shape[0])
    else:
        padded.update({k: v for k, v in (("rows", facts.rows), ("lengths", facts.lengths)) if v is not None})
    return rows, masks.describe(F.pad(mask, (0, extra), value=False), **padded)


def floor_padded(score: torch.Tensor, mask: torch.Tensor, total: int) -> torch.Tensor:
    """A best-over-frames score [Q, V] as the reference's zero-padded frames make it: a video with fewer
    than `total` real frames (mask [V, L]) has zero vectors among its frames, which score 0 in the max."""
    return torch.where((mask.sum(1) < total)[None, :], score.clamp(min=0), score)


def encode_frames(embed: nn.Module, block: DynamicGMMBlock, vb: VideoBatch, padded: PaddedFrames, total: int,
                  token: torch.Tensor | None = None) -> torch.Tensor:
    """The frame encoder of the GMMFormer v2 family -> [B, L, D]: on the real rows (padded "exclude"), or
    as the reference runs it ("zero"): the frames padded to `total` (max_ctx_l) with zero features, every
    row embedded and encoded (`DynamicGMMBlock.forward_padded`), the padding rows dropped after."""
    if padded == "exclude":
        return block(embed(vb.frames, vb.frame_mask), vb.frame_mask, token)
    frames, keys = pad_rows(vb.frames, vb.frame_mask, total)
    return block.forward_padded(embed(frames, full_mask(frames)), keys, token)[:, : vb.frames.shape[1]]


def mean_token(out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's fusion token, the mean of its branches' outputs [branches, N, D] over its real rows
    (Holmes and HLFormer, where GMMFormer v2 learns one token for all) -> [B, D]."""
    return unpack(out.mean(0), mask).sum(1) / mask.sum(1, keepdim=True).clamp(min=1).to(out.dtype)


class DynamicGMMBlock(nn.Module):
    """GMMFormer v2's dynamic GMM block: Gaussian branches fused with per-position weights.

    A learned token attends over each branch's output (one shared cross-attention layer);
    Linear -> ReLU -> dropout -> Linear maps each branch's token to one logit per position
    (`positions` = 32 clips or 128 frames); softmax over branches with a temperature.
    """

    def __init__(self, hidden: int, heads: int, widths: list[float], dropout: float, ffn_mult: int,
                 positions: int, temperature: float, window_len: int | None = None) -> None:
        super().__init__()
        self.branches = GaussianBranches(hidden, heads, widths, dropout, ffn_mult, window_len)
        self.cross = CrossAttentionLayer(hidden, heads, dropout)
        self.layer1 = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(dropout)
        self.layer2 = nn.Linear(hidden, positions)
        self.temperature = temperature

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, token: torch.Tensor | None) -> torch.Tensor:
        """token: v2's learned token, shared by every sequence; None: each sequence's `mean_token`."""
        mask = full_mask(x) if mask is None else mask
        return self.fuse(self.outputs(x, mask), mask, token)

    def outputs(self, x: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """Every branch's output [branches, N, D] for the rows of `mask`, attending to those of `keys`
        (default: `mask`)."""
        return self.branches(x, mask, keys)

    def forward_padded(self, x: torch.Tensor, keys: torch.Tensor, token: torch.Tensor | None) -> torch.Tensor:
        """The block as the reference runs it on frames padded to max_ctx_l: x [B, P, D] holds every row the
        reference encodes (the real rows, then padding rows made from zero features at their positions),
        `keys` [B, P] the real ones. Every row attends to the real rows, and the mean token (token None) is
        the mean over all P rows, padding included (`torch.mean(oo, dim=1)` in Holmes' and HLFormer's code);
        the branch weights are read over the real rows. -> [B, P, D], the padding rows zero."""
        out = self.outputs(x, full_mask(x), keys).unflatten(1, keys.shape)  # [branches, B, P, D]
        token = out.mean((0, 2)) if token is None else token.reshape(-1)
        real = pack(out, keys, dim=1)  # [branches, N, D]
        weights = self.branch_weights(real, keys, token)
        return unpack((real * weights[..., None]).sum(0), keys)

    def fuse(self, out: torch.Tensor, mask: torch.Tensor, token: torch.Tensor | None) -> torch.Tensor:
        """The branches' outputs [branches, N, D] weighted per position -> [B, L, D]."""
        token = mean_token(out, mask) if token is None else token.reshape(-1)
        weights = self.branch_weights(out, mask, token)  # [branches, N]
        return unpack((out * weights[..., None]).sum(0), mask)

    def branch_weights(self, out: torch.Tensor, mask: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        length = mask.shape[1]
        if length > self.layer2.out_features:
            raise ValueError(f"sequence of {length} rows but the fusion head has {self.layer2.out_features} positions")
        t = self.cross(token, out, mask)  # [branches, B, D]
        logits = self.layer2(self.drop(F.relu(self.layer1(t))))[..., :length]  # [branches, B, L]
        return pack((logits / self.temperature).softmax(0), mask, dim=1)


class QueryEncoder(nn.Module):
    """The MS-SL family's query encoder: input layer, positions, one attention layer,
    attention pooling -> one vector per query."""

    def __init__(self, query_dim: int, hidden: int, heads: int, max_len: int, input_dropout: float,
                 dropout: float, ffn_mult: int = 0) -> None:
        super().__init__()
        self.embed = InputEmbedding(query_dim, hidden, max_len, input_dropout)
        self.layer = GMMBlock(hidden, heads, [PLAIN], dropout, ffn_mult)
        self.pool = AttentionPool(hidden)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.pool(self.layer(self.embed(tokens, mask), mask), mask)


# ----------------------------------------------------------------------------- the references' weights
# The MS-SL family's official code names its parameters by BERT's modules: an input layer
# `<proj>.LayerNorm`, `<proj>.net.1` (LinearLayer) and `<pos>.position_embeddings`, `<pos>.LayerNorm`
# (TrainablePositionalEncoding); each attention layer `<att>.self.{query,key,value}`, `<att>.output.dense`,
# `<att>.output.LayerNorm` (BertAttention). These read such weights into the modules here
# (`evaluate --official-weights`); a name the file lacks is a KeyError naming it.
def official_linear_layer(named: dict[str, torch.Tensor], ours: str, proj: str) -> dict[str, torch.Tensor]:
    """Our `in_norm` and `linear` at `ours` from the official LinearLayer `proj` (its LayerNorm and `net.1`)."""
    return {f"{ours}.in_norm.weight": named[f"{proj}.LayerNorm.weight"], f"{ours}.in_norm.bias": named[f"{proj}.LayerNorm.bias"],
            f"{ours}.linear.weight": named[f"{proj}.net.1.weight"], f"{ours}.linear.bias": named[f"{proj}.net.1.bias"]}


def official_input(named: dict[str, torch.Tensor], ours: str, proj: str, pos: str) -> dict[str, torch.Tensor]:
    """An `InputEmbedding` at `ours` from the official input layer `proj` and positions `pos`."""
    return {**official_linear_layer(named, ours, proj),
            f"{ours}.positions.weight": named[f"{pos}.position_embeddings.weight"],
            f"{ours}.norm.weight": named[f"{pos}.LayerNorm.weight"], f"{ours}.norm.bias": named[f"{pos}.LayerNorm.bias"]}


def official_branches(named: dict[str, torch.Tensor], ours: str, layers: list[str],
                      ffn: bool = False) -> dict[str, torch.Tensor]:
    """`GaussianBranches` at `ours` from the official attention layers `layers`, one per branch in the
    order of the widths: their q / k / v maps joined into the fused product (branch-major, q, k, v
    within a branch, as `attend` reads it), their linear maps transposed into `BranchLinear`'s
    [branch, in, out], their norms stacked. Without a feed-forward (MS-SL, GMMFormer) a layer's
    output is `output.dense`, `output.LayerNorm`; with one (`ffn`: GMMFormer v2, Holmes) `norm1`,
    `output.layer1`, `output.layer2`, `norm2`."""
    qkv = [named[f"{a}.self.{m}.{t}"] for a in layers for m in ("query", "key", "value") for t in ("weight", "bias")]
    return {f"{ours}.qkv.weight": torch.cat(qkv[0::2]), f"{ours}.qkv.bias": torch.cat(qkv[1::2]),
            **official_per_branch(named, ours, layers, *official_post(ffn))}


def official_post(ffn: bool) -> tuple[dict[str, str], dict[str, str]]:
    """The official names of a layer's sub-layers after its attention, as ({our BranchLinear: their
    nn.Linear}, {our BranchLayerNorm: their LayerNorm}): `output.dense`, `output.LayerNorm` without a
    feed-forward (MS-SL, GMMFormer); `output.layer1`, `output.layer2`, `norm1`, `norm2` with one (`ffn`)."""
    if ffn:
        return {"ffn_in": "output.layer1", "ffn_out": "output.layer2"}, {"norm1": "norm1", "norm2": "norm2"}
    return {"dense": "output.dense"}, {"norm": "output.LayerNorm"}


def official_per_branch(named: dict[str, torch.Tensor], ours: str, layers: list[str], maps: dict[str, str],
                        norms: dict[str, str]) -> dict[str, torch.Tensor]:
    """Per-branch maps and norms at `ours` from one official module per branch (`layers`): each nn.Linear
    transposed into `BranchLinear`'s [branch, in, out] with the biases in a row, each LayerNorm's
    weights and biases in a row (`BranchLayerNorm`)."""
    out = {}
    for mine, theirs in maps.items():
        out[f"{ours}.{mine}.weight"] = torch.stack([named[f"{a}.{theirs}.weight"].t() for a in layers])
        out[f"{ours}.{mine}.bias"] = torch.cat([named[f"{a}.{theirs}.bias"] for a in layers])
    for mine, theirs in norms.items():
        for t in ("weight", "bias"):
            out[f"{ours}.{mine}.{t}"] = torch.cat([named[f"{a}.{theirs}.{t}"] for a in layers])
    return out


def official_inputs_and_query(named: dict[str, torch.Tensor], ffn: bool = False) -> dict[str, torch.Tensor]:
    """What every MS-SL-family reference names alike: the query encoder (`query_input_proj`,
    `query_pos_embed`, its attention layer `query_encoder`, its pooling `modular_vector_mapping`) and
    the clip and frame input layers with their positions, as `QueryEncoder` at `query_encoder` and
    `InputEmbedding` at `clip_embed`, `frame_embed`; `ffn` as `official_branches`."""
    return {**official_input(named, "query_encoder.embed", "query_input_proj", "query_pos_embed"),
            **official_branches(named, "query_encoder.layer.branches", ["query_encoder"], ffn=ffn),
            "query_encoder.pool.score.weight": named["modular_vector_mapping.weight"],
            **official_input(named, "clip_embed", "clip_input_proj", "clip_pos_embed"),
            **official_input(named, "frame_embed", "frame_input_proj", "frame_pos_embed")}


def official_cross(named: dict[str, torch.Tensor], ours: str, layer: str) -> dict[str, torch.Tensor]:
    """A `CrossAttentionLayer` at `ours` from the official BertCrossAttention `layer` (GMMFormer v2's,
    Holmes'): its query map, its key and value maps joined (key first, as `forward` splits them), its
    norms and its feed-forward (`output.layer1`, `output.layer2`, nn.Linear on both sides)."""
    out = {f"{ours}.q.weight": named[f"{layer}.self.query.weight"], f"{ours}.q.bias": named[f"{layer}.self.query.bias"],
           f"{ours}.kv.weight": torch.cat([named[f"{layer}.self.key.weight"], named[f"{layer}.self.value.weight"]]),
           f"{ours}.kv.bias": torch.cat([named[f"{layer}.self.key.bias"], named[f"{layer}.self.value.bias"]])}
    for mine, theirs in (("norm1", "norm1"), ("norm2", "norm2"), ("ffn_in", "output.layer1"), ("ffn_out", "output.layer2")):
        out.update({f"{ours}.{mine}.{t}": named[f"{layer}.{theirs}.{t}"] for t in ("weight", "bias")})
    return out


# ----------------------------------------------------------------------------- init and scoring helpers
def init_weights(model: nn.Module, std: float) -> None:
    """The MS-SL family's initialisation: linear and embedding weights ~ N(0, std), biases 0,
    LayerNorm 1 / 0 (parameters created outside these module types keep their own init)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding, BranchLinear)):
            nn.init.normal_(m.weight, 0.0, std)
            bias = getattr(m, "bias", None)  # nn.Embedding has none, nn.Linear may have none
            if bias is not None:
                nn.init.zeros_(bias)
        elif isinstance(m, (nn.LayerNorm, BranchLayerNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


UNIT = ".unit"  # suffix of the L2-normalised copies that a backbone's `index_videos` stores


def unit(v: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    """v[key] L2-normalised along its last dim: the copy `index_videos` stored, else computed now."""
    stored = v.get(key + UNIT)
    return stored if stored is not None else F.normalize(v[key], dim=-1)


def with_units(v: dict[str, torch.Tensor], *keys: str) -> dict[str, torch.Tensor]:
    """`index_videos` of max-cosine backbones: the encoded videos plus normalised copies of
    their item embeddings, so that scoring many queries normalises the collection once."""
    return {**v, **{k + UNIT: F.normalize(v[k], dim=-1) for k in keys}}


def max_similarity(query: torch.Tensor, items: torch.Tensor, mask: torch.Tensor | None = None,
                   cosine: bool = True, items_unit: bool = False) -> torch.Tensor:
    """[Q, D] x [V, N, D] -> [Q, V]: max over each video's real items of the cosine (or of
    the raw dot product when cosine=False). items_unit: the items are already L2-normalised."""
    if cosine:
        query = F.normalize(query, dim=-1)
        items = items if items_unit else F.normalize(items, dim=-1)
    sims = torch.einsum("qd,vnd->qvn", query, items)
    if mask is not None:
        sims = masks.keep_where(sims, mask[None], float("-inf"))
    return sims.max(-1).values


def frame_scores(query: torch.Tensor, v: Encoded, padded: PaddedFrames, total: int, cosine: bool = True) -> torch.Tensor:
    """The frame branch of the GMMFormer v2 family: the best cosine over each video's frames (the raw dot
    product where cosine=False); padded "zero": as the reference's zero-padded frames make it
    (`floor_padded`: a video of fewer than `total` frames scores at least 0)."""
    mask = v["frame_mask"]
    score = (max_similarity(query, unit(v, "frames"), mask, items_unit=True) if cosine
             else max_similarity(query, v["frames"], mask, cosine=False))
    return floor_padded(score, mask, total) if padded == "zero" else score


def clip_frame_scores(query: torch.Tensor, v: Encoded, clip_weight: float, padded: PaddedFrames, total: int) -> Scores:
    """The GMMFormer v2 family's scores (v2, Holmes, HLFormer, DreamPRVR): the best clip cosine and
    `frame_scores`, fused clip_weight : 1 - clip_weight; the raw best dot products, which the losses'
    NCE reads, computed when read."""
    clips = best_clip_scores(query, v)
    frame = frame_scores(query, v, padded, total)
    raw = OnDemand({"clip": lambda: clips.raw["clip"],
                    "frame": lambda: frame_scores(query, v, padded, total, cosine=False)})
    return Scores(clip_weight * clips.fused + (1 - clip_weight) * frame, {"clip": clips.fused, "frame": frame}, raw)


def best_clip_scores(query: torch.Tensor, v: dict[str, torch.Tensor]) -> Scores:
    """A clip branch that is the best clip's cosine ([Q, D] x v["clips"] [V, C, D] -> [Q, V];
    fused = clip; the raw best dot product computed when read): GMMFormer's and GMMFormer
    v2's `clip_scores`, for a wrapper with its own frame branch (RAL)."""
    clip = max_similarity(query, unit(v, "clips"), items_unit=True)
    return Scores(clip, {"clip": clip}, OnDemand({"clip": lambda: max_similarity(query, v["clips"], cosine=False)}))


def score_in_chunks(fn: Callable[[Encoded], Scores], q: Encoded, per_query: int, budget: int) -> Scores:
    """Without gradients, call fn on slices of the queries so that no [queries, videos, items]
    intermediate exceeds `budget` elements; with gradients, call it once on all queries."""
    n = next(iter(q.values())).shape[0]
    step = max(1, budget // max(1, per_query))
    if torch.is_grad_enabled() or n <= step:
        return fn(q)
    return Scores.cat([fn({k: t[s : s + step] for k, t in q.items()}) for s in range(0, n, step)])


class HeadsConfig(Protocol):
    """What `check_heads` reads of a backbone config (every `model` dataclass with attention)."""

    hidden: int
    heads: int


def check_heads(cfg: HeadsConfig, key: str) -> None:
    """The cross-field rule of every backbone config (its `check`): attention splits `hidden`
    evenly across `heads`."""
    require(cfg.hidden % cfg.heads == 0, f"config key '{key}.hidden' ({cfg.hidden}) must be a multiple of "
                                         f"'{key}.heads' ({cfg.heads})")
