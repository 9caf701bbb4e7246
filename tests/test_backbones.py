"""Every registered backbone: shapes, finiteness, gradients, padding invariance, determinism.
Plus the MS-SL family's parts: parameter counts at TVR dims, Gaussian windows and attention,
and MS-SL's fast proposal scoring against the materialised reference computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from prvr.datasets.loader import QueryBatch, VideoBatch, pooling_matrix
from prvr.harness.registry import BACKBONES
from prvr.harness.evaluate import cat_padded, index_videos
from prvr.methods.backbones.blocks import GaussianBranches, gaussian_attention, gaussian_weights
from prvr.methods.backbones.msl import VideoSide, msl_scores, proposal_matrix

VIDEO_DIM, QUERY_DIM, CLIPS = 24, 16, 8
SMALL = {"hidden": 32, "heads": 2, "max_frames": 32, "max_query_len": 16}
FRAME_LENGTHS, TOKEN_LENGTHS = [5, 14, 9], [4, 7, 3, 6]


def build(name: str, seed: int = 0) -> torch.nn.Module:
    cls = BACKBONES.get(name)
    cfg = cls.config_cls()
    for key, value in SMALL.items():
        if hasattr(cfg, key):
            setattr(cfg, key, value)
    torch.manual_seed(seed)
    return cls(cfg, VIDEO_DIM, QUERY_DIM)


def content(seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    frames = [F.normalize(torch.randn(n, VIDEO_DIM, generator=g), dim=-1) for n in FRAME_LENGTHS]
    tokens = [F.normalize(torch.randn(n, QUERY_DIM, generator=g), dim=-1) for n in TOKEN_LENGTHS]
    return frames, tokens


def video_batch(rows: list[torch.Tensor], pad_to: int | None = None, garbage: float = 0.0) -> VideoBatch:
    """Padded batch as the loader builds it; `garbage` fills padding rows with noise of that scale."""
    t = pad_to or max(len(r) for r in rows)
    frames = torch.randn(len(rows), t, VIDEO_DIM, generator=torch.Generator().manual_seed(99)) * garbage
    mask = torch.zeros(len(rows), t, dtype=torch.bool)
    pool = torch.zeros(len(rows), CLIPS, t)
    for i, r in enumerate(rows):
        frames[i, : len(r)], mask[i, : len(r)] = r, True
        pool[i, :, : len(r)] = torch.from_numpy(pooling_matrix(len(r), CLIPS))
    clips = F.normalize(torch.bmm(pool, frames * mask[..., None]), dim=-1)
    return VideoBatch(frames, mask, clips, pool, torch.arange(len(rows)))


def query_batch(rows: list[torch.Tensor], pad_to: int | None = None, garbage: float = 0.0) -> QueryBatch:
    t = pad_to or max(len(r) for r in rows)
    tokens = torch.randn(len(rows), t, QUERY_DIM, generator=torch.Generator().manual_seed(98)) * garbage
    mask = torch.zeros(len(rows), t, dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)], mask[i, : len(r)] = r, True
    return QueryBatch(tokens, mask, torch.arange(len(rows)))


def forward(model, vb: VideoBatch, qb: QueryBatch) -> dict[str, torch.Tensor]:
    return model.score(model.encode_queries(qb), model.encode_videos(vb))


BACKBONE_NAMES = BACKBONES.names()


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_indexed_collection_scores_like_the_plain_one(name):
    """`index_videos` (done once per collection by the evaluator and the runtime profile)
    changes no score: every output of `score` matches the unindexed path."""
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
        plain = model.score(q, v)
        indexed = model.score(q, index_videos(model, v))
    assert plain.keys() == indexed.keys()
    for key in plain:
        torch.testing.assert_close(indexed[key], plain[key], rtol=1e-6, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_scores_have_query_by_video_shape_and_are_finite(name):
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        scores = forward(model, video_batch(frames), query_batch(tokens))
    assert "fused" in scores
    for key, s in scores.items():
        assert s.shape == (len(tokens), len(frames)), key
        assert torch.isfinite(s).all(), key


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_every_parameter_receives_a_gradient(name):
    model = build(name).train()
    frames, tokens = content()
    scores = forward(model, video_batch(frames), query_batch(tokens))
    sum(s.sum() for s in scores.values()).backward()
    params = dict(model.named_parameters())
    assert not [n for n, p in params.items() if p.grad is None], "parameters outside the graph"
    assert all(torch.isfinite(p.grad).all() for p in params.values())
    # a weight matrix with an all-zero gradient is cut off; a bias may be legitimately
    # gradient-free (e.g. the bias of a softmax logit, which the softmax cancels)
    dead = [n for n, p in params.items() if p.dim() >= 2 and not p.grad.abs().sum() > 0]
    assert not dead, f"no gradient reaches {dead}"


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_padding_frames_and_tokens_change_no_score(name):
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        tight = forward(model, video_batch(frames), query_batch(tokens))
        padded = forward(model, video_batch(frames, pad_to=max(FRAME_LENGTHS) + 7, garbage=3.0),
                         query_batch(tokens, pad_to=max(TOKEN_LENGTHS) + 5, garbage=3.0))
    for key in tight:
        torch.testing.assert_close(padded[key], tight[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_a_video_encodes_the_same_alone_or_in_a_batch(name):
    """Evaluation encodes videos in chunks and pads them to the longest (trainer.encode_all):
    a video's scores must not depend on its batch mates."""
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        q = model.encode_queries(query_batch(tokens))
        together = model.score(q, model.encode_videos(video_batch(frames)))
        parts = [model.encode_videos(video_batch([f])) for f in frames]
        alone = model.score(q, {k: cat_padded([p[k] for p in parts]) for k in parts[0]})
    for key in together:
        torch.testing.assert_close(alone[key], together[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_same_seed_same_output(name):
    frames, tokens = content()
    outs = []
    for _ in range(2):
        model = build(name, seed=3).train()
        torch.manual_seed(5)  # dropout
        outs.append(forward(model, video_batch(frames), query_batch(tokens)))
    for key in outs[0]:
        assert torch.equal(outs[0][key], outs[1][key]), key
    other = build(name, seed=4).eval()
    with torch.no_grad():
        assert not torch.equal(forward(other, video_batch(frames), query_batch(tokens))["fused"], outs[0]["fused"])


@pytest.mark.parametrize("name, paper", [("msl", 4.85), ("gmmformer", 12.85), ("gmmformer2", 32.27)])
def test_parameter_count_at_tvr_dims_matches_the_papers(name, paper):
    """ARL Table 3 / RAL Table 6 (video 3072-d, query 768-d)."""
    cls = BACKBONES.get(name)
    with torch.device("meta"):
        model = cls(cls.config_cls(), 3072, 768)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == paper


# --------------------------------------------------------------------------- Gaussian windows
def test_gaussian_window_hand_computed():
    """Length 3, width 1: centres 0, 1/3, 2/3 over positions 0, 0.5, 1; sigma = 1/9, so the
    exponent is -40.5 * distance^2; rows are scaled to a maximum of 1."""
    w = gaussian_weights(3, 1.0)
    e = math.exp
    expected = torch.tensor([
        [1.0, e(-40.5 * 0.25), e(-40.5)],
        [e(-40.5 / 9 + 40.5 / 36), 1.0, e(-40.5 * 4 / 9 + 40.5 / 36)],
        [e(-40.5 * 4 / 9 + 40.5 / 36), 1.0, e(-40.5 / 9 + 40.5 / 36)],
    ])
    torch.testing.assert_close(w, expected, atol=1e-7, rtol=1e-5)
    assert torch.equal(gaussian_weights(4, 0.0), torch.ones(4, 4))  # plain branch


def test_gaussian_window_over_a_fixed_span_ignores_the_sequence_length():
    assert torch.equal(gaussian_weights(5, 0.5, total=12), gaussian_weights(12, 0.5)[:5, :5])
    with pytest.raises(ValueError):
        gaussian_weights(13, 0.5, total=12)


def test_gaussian_attention_multiplies_logits_and_drops_padded_keys():
    logits = torch.tensor([[1.0, 2.0, 5.0], [3.0, 0.0, 5.0]])
    window = torch.tensor([[1.0, 0.5, 1.0], [0.25, 1.0, 1.0]])
    key_mask = torch.tensor([True, True, False])
    p = gaussian_attention(logits, window, key_mask)
    e = math.exp
    expected = torch.tensor([[0.5, 0.5, 0.0], [e(0.75) / (e(0.75) + 1), 1 / (e(0.75) + 1), 0.0]])
    torch.testing.assert_close(p, expected)


def test_gaussian_branches_match_a_naive_per_branch_per_head_computation():
    torch.manual_seed(0)
    d, heads, widths = 8, 2, [0.0, 0.5, 5.0]
    layer = GaussianBranches(d, heads, widths, dropout=0.0, window_len=10).eval()
    x, mask = torch.randn(2, 6, d), torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    out = layer.attend(x, mask)  # [branches, B, L, D]
    w, bias, dh = layer.qkv.weight, layer.qkv.bias, d // heads
    for i, width in enumerate(widths):
        window = gaussian_weights(6, width, total=10)
        for h in range(heads):
            rows = [slice(((i * 3 + j) * heads + h) * dh, ((i * 3 + j) * heads + h + 1) * dh) for j in range(3)]
            q, k, v = (x @ w[r].t() + bias[r] for r in rows)
            logits = (q @ k.transpose(1, 2) / math.sqrt(dh)) * window
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
            ref = logits.softmax(-1) @ v
            torch.testing.assert_close(out[i][mask][:, h * dh : (h + 1) * dh], ref[mask], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- MS-SL scoring
def test_proposals_are_every_window_of_clips():
    a = proposal_matrix(32)
    assert a.shape == (528, 32)
    torch.testing.assert_close(a.sum(1), torch.ones(528))
    for k in range(1, 33):
        for s in range(0, 33 - k):
            window = torch.zeros(32)
            window[s : s + k] = 1 / k
            assert (a - window).abs().sum(1).min() < 1e-6, (s, k)


def naive_msl(query, clips, keys, values, mask):
    """MS-SL's scores as the reference computes them: materialised proposals, explicit
    key-clip attention per (query, video)."""
    props = torch.einsum("pc,vcd->vpd", proposal_matrix(clips.shape[1]).to(clips), clips)
    cos = torch.einsum("qd,vpd->qvp", F.normalize(query, dim=-1), F.normalize(props, dim=-1))
    clip, best = cos.max(-1)
    clip_raw = torch.einsum("qd,vpd->qvp", query, props).max(-1).values
    frame = torch.zeros_like(clip)
    frame_raw = torch.zeros_like(clip)
    for i in range(query.shape[0]):
        for j in range(clips.shape[0]):
            att = (keys[j] @ props[j, best[i, j]]).masked_fill(~mask[j], float("-inf")).softmax(0)
            feat = att @ values[j]
            frame[i, j] = F.cosine_similarity(query[i], feat, dim=0)
            frame_raw[i, j] = query[i] @ feat
    return clip, clip_raw, frame, frame_raw


def fast_msl(query, clips, keys, values, mask, budget=1 << 24):
    side = VideoSide.of({"clips": clips, "frame_keys": keys, "frame_values": values, "frame_mask": mask})
    out = msl_scores(query, side, budget)
    return out["clip"], out["clip_raw"], out["frame"], out["frame_raw"]


@pytest.mark.parametrize("budget", [1 << 24, 50])  # 50: the best-proposal search runs one query at a time
def test_msl_fast_scoring_matches_materialised_proposals_forward_and_backward(budget):
    g = torch.Generator().manual_seed(0)
    q, v, c, t, d = 4, 3, 6, 9, 5
    inputs = [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
              for s in [(q, d), (v, c, d), (v, t, d), (v, t, d)]]
    mask = torch.tensor([[True] * 9, [True] * 5 + [False] * 4, [True] * 2 + [False] * 7])
    fast = fast_msl(*inputs, mask, budget)
    naive = naive_msl(*inputs, mask)
    weights = [torch.randn(q, v, generator=g, dtype=torch.float64) for _ in range(4)]
    grads = []
    for out in (fast, naive):
        for a, b in zip(out, naive):
            torch.testing.assert_close(a, b)
        grads.append(torch.autograd.grad(sum((w * o).sum() for w, o in zip(weights, out)), inputs))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", [n for n in BACKBONE_NAMES if hasattr(BACKBONES.get(n).config_cls(), "eval_budget")])
def test_scoring_in_query_chunks_matches_one_pass(name):
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
        whole = model.score(q, v)
        model.cfg.eval_budget = 1  # one query per slice, one query per best-proposal search
        sliced = model.score(q, v)
    for key in whole:
        torch.testing.assert_close(sliced[key], whole[key], msg=key)


def test_baseline_input_norm_standardises_inputs_without_new_parameters():
    from prvr.methods.backbones.baseline import DualBranch, DualBranchConfig

    torch.manual_seed(0)
    plain = DualBranch(DualBranchConfig(hidden=32, heads=2), VIDEO_DIM, QUERY_DIM)
    torch.manual_seed(0)
    normed = DualBranch(DualBranchConfig(hidden=32, heads=2, input_norm=True), VIDEO_DIM, QUERY_DIM)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in normed.parameters())
    assert list(plain.state_dict()) == [k.replace("proj.1.", "proj.0.").replace("proj.2.", "proj.1.")
                                        for k in normed.state_dict()]  # the same parameters, behind a parameter-free norm
    x = torch.randn(3, VIDEO_DIM) * 5 + 2
    first = normed.video_proj[0](x)
    assert torch.allclose(first.mean(-1), torch.zeros(3), atol=1e-4)
    assert torch.allclose(first.std(-1, unbiased=False), torch.ones(3), atol=1e-3)
