"""XML, Cross-modal Moment Localization (Lei et al., ECCV 2020), video-only, as the SBERT-PR
paper uses it (Maeoki et al.; docs/references.md, Section 3.2, Eq. 1-2, appendix A).

Query: tokens -> input layer and learned positions -> one BERT attention layer -> attention
pooling into one vector q (XML's modular query of the video stream). Video: one feature row
per clip, with the clip's temporal endpoints [n / L, (n + 1) / L] appended (TEF, appendix A:
D_v = 2048 + 2; XML's `video_tef` input) -> input layer and positions -> attention layer 1 = H1
(retrieval); two more attention layers on H1 = H2 (localization): XML's video_encoder1, and
video_encoder2, video_encoder3 (its path without subtitles, `cross_att=False`). The layers are those of the MS-SL family
(methods/backbones/blocks.py): XML's LinearLayer, TrainablePositionalEncoding, BertAttention and
modular_vector_mapping are the same computations.

Scores. s_vr = max over a video's rows of cos(q, H1_n) (Eq. 1) is `Scores.fused`, what the
PRVR evaluator ranks. Localization (Eq. 2): the similarity (W q + b) . H2_n of every row goes
through two one-channel convolutions of width 5 (XML's ConvSE, `conv_kernel_size` 5, no bias),
giving start and end logits over the rows; softmax over the real rows gives P_st, P_ed. The VCMR
evaluator reads them through `span_logits`; a training step's, `span_logits_batch`, are one of
its outputs (`step_extras`, under SPAN_LOGITS), which the losses read.

Padding. XML's convolution also reads the similarities of padding rows (it masks the logits
only after the convolution), so a video's end logits depend on its batch mates' lengths; here, by
default, padding similarities are zero before the convolution, as if each video were zero-padded
at its own end (`model.span_padding: zero`). `model.span_padding=encoded` reads them as XML does:
the similarities of the padding rows as the encoders left them (rows of zero features, with their
positions, attending to the real rows), up to the longest video of the batch: of the training
batch, and in evaluation of each encoding batch (128 videos; rows beyond it read 0), as XML's
code pads its own evaluation batches of 200. XML's `max_ctx_l` is 100 (TVR, 1.5 s clips);
`max_frames` is 128 here, the PRVR loaders' `data.max_frames`, and the preset sets the paper's 20
(Charades-STA) / 12 (DiDeMo).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Literal

import torch
from torch import nn

from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.checks import DROPOUT, FLAG, POSITIVE, at_least, one_of, param, require
from prvr.harness.base.contract import Encoded, OnDemand, Scores
from prvr.harness.base.registry import BACKBONES
from prvr.methods.backbones.blocks import (PLAIN, GMMBlock, InputEmbedding, QueryEncoder, check_heads, init_weights,
                                           max_similarity, official_branches, official_input, score_in_chunks, unit,
                                           with_units)


SpanPadding = Literal["zero", "encoded"]


@dataclass
class XMLConfig:
    hidden: int = param(256, at_least(1))  # d = 256 (appendix A); TVRetrieval config.py --hidden_size 256
    heads: int = param(4, at_least(1))  # --n_heads 4
    input_dropout: float = param(0.1, DROPOUT)  # --input_drop 0.1: input layers and positions
    dropout: float = param(0.1, DROPOUT)  # --drop 0.1: attention layers
    max_query_len: int = param(30, at_least(1))  # l_q = 30 (appendix A); --max_desc_l 30
    # learned positions of the video encoder: the most rows a video has (XML --max_ctx_l 100 on TVR;
    # appendix A l_v = 20 Charades-STA, 12 DiDeMo, set by the preset with data.max_frames)
    max_frames: int = param(128, at_least(1))
    conv_kernel: int = param(5, at_least(1))  # --conv_kernel_size 5 (start / end ConvSE), odd
    # append each row's temporal endpoints (TEF) to its features: appendix A, after Hendricks et al.
    tef: bool = param(True, FLAG)
    # ours: what the start / end convolutions read beyond a video's last row: zero (the default: as if
    # each video ended in zeros) or encoded (the padding rows' similarities, as XML's code reads them)
    span_padding: SpanPadding = param("zero", one_of(SpanPadding))
    init_std: float = param(0.02, POSITIVE)  # --initializer_range 0.02
    # ours: max elements of a [queries, videos, rows] tensor when scoring without gradients
    eval_budget: int = param(1 << 24, at_least(1))

    def check(self, key: str) -> None:
        check_heads(self, key)
        require(self.conv_kernel % 2 == 1, f"config key '{key}.conv_kernel' must be odd (a centred window), "
                                           f"got {self.conv_kernel}")


NEG_INF = float("-inf")
SPAN_LOGITS = "xml.span_logits"  # the key of a training step's (start, end) logits in its extras (`XML.step_extras`)


def temporal_endpoints(mask: torch.Tensor) -> torch.Tensor:
    """TEF [B, T, 2]: row n of a video of L real rows spans [n / L, (n + 1) / L] of it (XML
    start_end_dataset.py); padding rows 0."""
    length = mask.sum(1, keepdim=True).clamp(min=1).to(torch.float32)
    start = torch.arange(mask.shape[1], device=mask.device, dtype=torch.float32)[None] / length
    return (torch.stack([start, start + 1 / length], -1) * mask[..., None]).to(torch.float32)


def from_official(named: dict[str, torch.Tensor], cfg: XMLConfig) -> dict[str, torch.Tensor]:
    """The weights of TVRetrieval's XML (jayleicn/TVRetrieval baselines/crossmodal_moment_localization,
    `XML.state_dict()` by its parameter names) in its video-only layout (`--ctx_mode video_tef`, which
    sets no_merge_two_stream and no_cross_att: three attention layers `video_encoder1..3` and the
    stream's own `video_st_predictor` / `video_ed_predictor`) as this backbone's state dict (blocks.py
    `official_input`, `official_branches`). Its `--max_ctx_l` must be our `model.max_frames` and its
    video input our features plus the two TEF columns: the load says which shape differs."""
    out = {**official_input(named, "query_encoder.embed", "query_input_proj", "query_pos_embed"),
           **official_branches(named, "query_encoder.layer.branches", ["query_encoder"]),
           "query_encoder.pool.score.weight": named["modular_vector_mapping.weight"],
           **official_input(named, "video_embed", "video_input_proj", "ctx_pos_embed"),
           "query_linear.weight": named["video_query_linear.weight"],
           "query_linear.bias": named["video_query_linear.bias"],
           "start_conv.weight": named["video_st_predictor.weight"],
           "end_conv.weight": named["video_ed_predictor.weight"]}
    for i in (1, 2, 3):
        out.update(official_branches(named, f"encoder{i}.branches", [f"video_encoder{i}"]))
    return out


@BACKBONES.register("xml", "XML: query vector vs clip rows; max cosine to H1 retrieves (Eq. 1), ConvSE start/end "
                           "logits over H2 localize (Eq. 2)")
class XML(nn.Module):
    config_cls = XMLConfig
    provides: ClassVar[frozenset[str]] = frozenset({"query_vector", "frame_mask", "span_logits"})
    # `evaluate --official-weights`, `train.init_weights`: whose weights, and their map
    official = ("jayleicn/TVRetrieval", from_official)

    def __init__(self, cfg: XMLConfig, video_dim: int, query_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        h, heads, drop = cfg.hidden, cfg.heads, cfg.dropout
        self.query_encoder = QueryEncoder(query_dim, h, heads, cfg.max_query_len, cfg.input_dropout, drop)
        self.video_embed = InputEmbedding(video_dim + 2 * cfg.tef, h, cfg.max_frames, cfg.input_dropout)
        self.encoder1 = GMMBlock(h, heads, [PLAIN], drop)  # video_encoder1 -> H1
        self.encoder2 = GMMBlock(h, heads, [PLAIN], drop)  # video_encoder2
        self.encoder3 = GMMBlock(h, heads, [PLAIN], drop)  # video_encoder3 -> H2
        self.query_linear = nn.Linear(h, h)  # video_query_linear: the query of localization
        k = cfg.conv_kernel
        self.start_conv = nn.Conv1d(1, 1, k, padding=k // 2, bias=False)  # video_st_predictor
        self.end_conv = nn.Conv1d(1, 1, k, padding=k // 2, bias=False)  # video_ed_predictor
        init_weights(self, cfg.init_std)  # the convolutions keep torch's init, as XML's reset_parameters

    def encode_queries(self, qb: QueryBatch) -> Encoded:
        return {"query": self.query_encoder(qb.tokens, qb.token_mask)}

    def encode_videos(self, vb: VideoBatch) -> Encoded:
        rows = vb.frames
        if self.cfg.tef:
            rows = torch.cat([rows, temporal_endpoints(vb.frame_mask).to(rows.dtype)], -1)
        real = vb.frame_mask
        # span_padding=encoded: the padding rows encoded too (zero features and TEF, their positions),
        # attending to the real rows, as XML's code encodes them; a real row's encodings are the same
        rows_mask = torch.ones_like(real) if self.cfg.span_padding == "encoded" else real
        h1 = self.encoder1(self.video_embed(rows, rows_mask), rows_mask, real)
        h2 = self.encoder3(self.encoder2(h1, rows_mask, real), rows_mask, real)
        return {"h1": h1, "h2": h2, "frame_mask": real}

    def index_videos(self, v: Encoded) -> Encoded:
        """Query-independent work before scoring many queries: unit H1 rows."""
        return with_units(v, "h1")

    def score(self, q: Encoded, v: Encoded) -> Scores:
        """s_vr [Q, V] (Eq. 1), in query slices of `eval_budget` elements without gradients."""
        h1, mask = unit(v, "h1"), v["frame_mask"]

        def vr(chunk: dict[str, torch.Tensor]) -> Scores:
            return Scores(max_similarity(chunk["query"], h1, mask, items_unit=True))

        return score_in_chunks(vr, q, h1.shape[0] * h1.shape[1], self.cfg.eval_budget)

    # ------------------------------------------------------------------ localization
    def step_extras(self, queries: Encoded, videos: Encoded,
                    video_of_query: torch.Tensor) -> Mapping[str, tuple[torch.Tensor, torch.Tensor]]:
        """A training step's outputs for the objective alone (harness/base/contract.py `StepExtras`):
        the batch's start and end logits (`span_logits_batch`) under SPAN_LOGITS, computed when
        the objective first reads them (a step without moments reads none)."""
        return OnDemand({SPAN_LOGITS: partial(self.span_logits_batch, queries, videos)})

    def span_logits_batch(self, q: dict[str, torch.Tensor],
                          v: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits [Q, B, T] of every query over the rows of every video (training)."""
        sim = torch.einsum("qd,btd->qbt", self.query_linear(q["query"]), v["h2"])
        return self.start_end(sim, v["frame_mask"][None])

    def span_logits(self, q: dict[str, torch.Tensor], v: dict[str, torch.Tensor],
                    pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits [Q, K, T] of query q over the rows of video pairs[q, k] (e.g. its top
        videos by s_vr); T = the collection's padded rows, padding rows -inf. Runs in query slices
        of `eval_budget` gathered elements without gradients."""
        query, h2, mask = self.query_linear(q["query"]), v["h2"], v["frame_mask"]
        per_query = max(1, pairs.shape[1] * h2.shape[1] * h2.shape[2])
        step = len(pairs) if torch.is_grad_enabled() else max(1, self.cfg.eval_budget // per_query)
        parts = [self.start_end(torch.einsum("qd,qktd->qkt", query[s : s + step], h2[pairs[s : s + step]]),
                                mask[pairs[s : s + step]]) for s in range(0, len(pairs), step)]
        if len(parts) == 1:
            return parts[0]
        if not parts:  # no queries
            empty = query.new_zeros(0, pairs.shape[1], h2.shape[1])
            return empty, empty.clone()
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def start_end(self, sim: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ConvSE on row similarities sim [..., T] (mask broadcasts against it): padding rows are 0
        going into the convolutions (`span_padding: zero`; `encoded`: as they are) and -inf coming out."""
        mask = mask.expand_as(sim)
        if self.cfg.span_padding == "zero":
            sim = sim.masked_fill(~mask, 0.0)
        flat = sim.reshape(-1, 1, sim.shape[-1])
        start, end = (conv(flat).view(sim.shape).masked_fill(~mask, NEG_INF)
                      for conv in (self.start_conv, self.end_conv))
        return start, end
