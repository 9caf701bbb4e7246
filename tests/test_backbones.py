"""Every registered backbone: the `Backbone` contract (typed `Scores`, the same fields in training
and evaluation, the outputs it declares), the scores of the dict outputs it replaced, shapes,
finiteness, gradients, padding invariance, determinism. Plus the MS-SL family's parts:
parameter counts at TVR dims, Gaussian windows and attention, and MS-SL's fast proposal
scoring against the materialised reference computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from prvr.datasets.loader import pooling_matrix
from prvr.harness.base.batches import QueryBatch, VideoBatch
from prvr.harness.base.registry import BACKBONES
from prvr.harness.base.encoding import cat_padded
from prvr.harness.engine.evaluate import index_videos
from prvr.methods.backbones.api import OUTPUTS, Backbone, OnDemand, Scores
from prvr.methods.backbones.blocks import GaussianBranches, gaussian_attention, gaussian_weights, max_similarity
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


def forward(model, vb: VideoBatch, qb: QueryBatch) -> Scores:
    return model.score(model.encode_queries(qb), model.encode_videos(vb))


BACKBONE_NAMES = BACKBONES.names()


def real_frames(tensors: dict[str, torch.Tensor], frame_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-frame items at padding frames set to 0 (a padding frame's item means nothing)."""
    return {k: t.masked_fill(~frame_mask[None], 0.0) if k.startswith("items.") else t for k, t in tensors.items()}


def _views_score_by_their_best_frame(model, vb, q, v, s) -> bool:
    for branch, qk, fk in model.frame_views():
        assert q[qk].dim() == 2 and v[fk].dim() == 3
        best = max_similarity(q[qk], v[fk], v["frame_mask"])
        torch.testing.assert_close(s.branches[branch], best, msg=branch)
    return True


def _span_logits_over_rows(m, vb, q, v, s) -> bool:
    """Start / end logits over each video's rows, -inf exactly at padding rows; `span_logits` for
    a pair (q, pairs[q, k]) is the batch helper's row."""
    start, end = m.span_logits_batch(q, v)
    n_q, n_v = s.fused.shape
    padding = ~vb.frame_mask[None].expand(n_q, -1, -1)
    for t in (start, end):
        assert t.shape == (n_q, n_v, vb.frames.shape[1])
        assert torch.isinf(t[padding]).all() and torch.isfinite(t[~padding]).all()
    pairs = torch.arange(n_v).flip(0)[None].repeat(n_q, 1)
    for got, full in zip(m.span_logits(q, v, pairs), (start, end)):
        torch.testing.assert_close(got, full[torch.arange(n_q)[:, None], pairs])
    return True


def _diffusion_terms(m, vb, q, v, s) -> bool:
    """Each video's condition [V, R, d], latent mean and log variance [V, d], and a step's denoising:
    a prediction [T, V, R, d] per step of the noise [V, R, d] (DreamPRVR)."""
    n_q, n_v = s.fused.shape
    cond = v["dream.condition"]
    assert cond.shape[0] == n_v and v["dream.mu"].shape == v["dream.logvar"].shape == (n_v, cond.shape[-1])
    d = m.step_extras(q, v, torch.arange(n_q) % n_v)["dream.denoising"]
    return d.noise.shape == cond.shape and d.predicted.shape[1:] == cond.shape


# What each output in OUTPUTS means, checked on (model, video batch, queries, videos, scores).
PROVIDED = {
    "clip_frame": lambda m, vb, q, v, s: {"clip", "frame"} <= set(s.branches),
    "theta_phi": lambda m, vb, q, v, s: "theta" in s.branches and set(s.branches) <= {"theta", "phi"},
    "raw": lambda m, vb, q, v, s: {"clip", "frame"} <= set(s.raw) and all(s.raw[k].shape == s.fused.shape
                                                                         for k in ("clip", "frame")),
    "frame_items": lambda m, vb, q, v, s: bool(s.items) and set(s.items) <= set(s.branches) and all(
        t.shape == (*s.fused.shape, vb.frames.shape[1]) for t in s.items.values()),
    "frame_views": _views_score_by_their_best_frame,
    "query_vector": lambda m, vb, q, v, s: q["query"].shape[0] == s.fused.shape[0] and q["query"].dim() == 2,
    "clip_vectors": lambda m, vb, q, v, s: v["clips"].shape[:2] == (s.fused.shape[1], CLIPS),
    "frame_mask": lambda m, vb, q, v, s: torch.equal(v["frame_mask"], vb.frame_mask),
    "frame_tokens": lambda m, vb, q, v, s: (v["frames"].shape[:2] == (s.fused.shape[1], vb.frames.shape[1])
                                            and torch.equal(v["frame_mask"], vb.frame_mask)),
    "span_logits": _span_logits_over_rows,
    "diffusion": _diffusion_terms,
    "lorentz": lambda m, vb, q, v, s: (q["lorentz.query"].shape[0] == s.fused.shape[0]
                                       and v["lorentz.video"].shape[0] == v["lorentz.curvature"].shape[0]
                                       == s.fused.shape[1] and bool((v["lorentz.curvature"] > 0).all())),
}


def test_every_output_name_has_a_check():
    assert set(PROVIDED) == set(OUTPUTS)


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_backbone_keeps_the_contract_in_training_and_evaluation(name):
    """A `Backbone`; `provides` names known outputs; a 2-query x 3-video forward gives `Scores`
    with the same branch / raw / item names in both modes, and every provided output is there."""
    model = build(name)
    if hasattr(model, "keep_frames"):  # backbones that return their encoded frames only when a wrapper asks
        model.keep_frames = True
    assert isinstance(model, Backbone)
    assert model.provides <= set(OUTPUTS), sorted(model.provides - set(OUTPUTS))
    frames, tokens = content()
    vb, qb = video_batch(frames), query_batch(tokens[:2])
    fields = {}
    for mode in ("train", "eval"):
        model.train(mode == "train")
        with torch.set_grad_enabled(mode == "train"):
            q, v = model.encode_queries(qb), model.encode_videos(vb)
            s = model.score(q, v)
        assert isinstance(s, Scores) and s.fused.shape == (2, 3)
        fields[mode] = (set(s.branches), set(s.raw), set(s.items))
        for output in sorted(model.provides):
            assert PROVIDED[output](model, vb, q, v, s), f"{name} declares {output} but does not give it ({mode})"
    assert fields["train"] == fields["eval"]


def test_on_demand_scores_are_made_once_when_read_and_stay_on_demand_when_joined():
    made = []
    first = OnDemand({"clip": lambda: made.append("first") or torch.ones(1, 2)})
    joined = Scores.cat([Scores(torch.zeros(1, 2), raw=first),
                         Scores(torch.zeros(1, 2), raw=OnDemand({"clip": lambda: torch.zeros(1, 2)}))])
    assert set(joined.raw) == {"clip"} and not made
    assert joined.raw["clip"].tolist() == [[1.0, 1.0], [0.0, 0.0]] and joined.raw["clip"] is joined.raw["clip"]
    assert made == ["first"]


def _best(query, items, mask=None, cosine=True):
    if cosine:
        query, items = F.normalize(query, dim=-1), F.normalize(items, dim=-1)
    sims = torch.einsum("qd,vnd->qvn", query, items)
    return (sims if mask is None else sims.masked_fill(~mask[None], float("-inf"))).max(-1).values


def _fused(w, out):
    return {**out, "fused": w * out["clip"] + (1 - w) * out["frame"]}


# The dicts that `score` returned before `Scores` (training-mode keys), from the encodings.
DICT_SCORES = {
    "dual-branch": lambda m, q, v: _fused(m.cfg.clip_weight, {"clip": _best(q["query"], v["clip"]),
                                                              "frame": _best(q["query"], v["frame"], v["frame_mask"])}),
    "gmmformer": lambda m, q, v: _fused(m.cfg.clip_weight, {
        "clip": _best(q["query"], v["clips"]),
        "frame": F.normalize(q["query"], dim=-1) @ F.normalize(v["frame"], dim=-1).t(),
        "clip_raw": _best(q["query"], v["clips"], cosine=False), "frame_raw": q["query"] @ v["frame"].t()}),
    "gmmformer2": lambda m, q, v: _fused(m.cfg.clip_weight, {
        "clip": _best(q["query"], v["clips"]), "frame": _best(q["query"], v["frames"], v["frame_mask"]),
        "clip_raw": _best(q["query"], v["clips"], cosine=False),
        "frame_raw": _best(q["query"], v["frames"], v["frame_mask"], cosine=False)}),
    "arl": lambda m, q, v: _arl_dict(q, v),
}


def _arl_dict(q, v):
    out = {}
    for b in ("theta", "phi"):
        sims = torch.einsum("qd,btd->qbt", F.normalize(q[f"query.{b}"], dim=-1), F.normalize(v[f"frames.{b}"], dim=-1))
        out[b], out[f"{b}.frames"] = sims.masked_fill(~v["frame_mask"][None], float("-inf")).amax(-1), sims
    return {**out, "fused": torch.stack([out["theta"], out["phi"]]).mean(0)}


def as_dict(s: Scores) -> dict[str, torch.Tensor]:
    """`Scores` under the old dict keys: fused, the branches, <b>_raw, <b>.frames."""
    return {"fused": s.fused, **s.branches, **{f"{k}_raw": t for k, t in s.raw.items()},
            **{f"{k}.frames": t for k, t in s.items.items()}}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", sorted(DICT_SCORES))
def test_scores_are_bit_identical_to_the_dict_outputs(name, mode):
    """fused, branches, raw and items are the numbers the dict keys held (raw and items, once
    training-only, now in evaluation too); MS-SL against its materialised reference below."""
    model = build(name).train(mode == "train")
    frames, tokens = content()
    with torch.no_grad():
        q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
        new, old = as_dict(model.score(q, v)), DICT_SCORES[name](model, q, v)
    assert new.keys() == old.keys()
    for key in old:
        assert torch.equal(new[key], old[key]), key


def test_msl_scores_are_its_reference_computation():
    model = build("msl").eval()
    frames, tokens = content()
    with torch.no_grad():
        q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
        s = model.score(q, v)
    clip, clip_raw, frame, frame_raw = naive_msl(q["query"], v["clips"], v["frame_keys"], v["frame_values"],
                                                 v["frame_mask"])
    for got, ref in [(s.branches["clip"], clip), (s.raw["clip"], clip_raw), (s.branches["frame"], frame),
                     (s.raw["frame"], frame_raw)]:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    w = model.cfg.clip_weight
    assert torch.equal(s.fused, w * s.branches["clip"] + (1 - w) * s.branches["frame"])


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_indexed_collection_scores_like_the_plain_one(name):
    """`index_videos` (done once per collection by the evaluator and the runtime profile)
    changes no score: every output of `score` matches the unindexed path."""
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
        plain = model.score(q, v).tensors()
        indexed = model.score(q, index_videos(model, v)).tensors()
    assert plain.keys() == indexed.keys()
    for key in plain:
        torch.testing.assert_close(indexed[key], plain[key], rtol=1e-6, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_scores_have_query_by_video_shape_and_are_finite(name):
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        scores = forward(model, video_batch(frames), query_batch(tokens))
    for key, s in scores.tensors().items():
        assert s.shape[:2] == (len(tokens), len(frames)), key
        assert s.dim() == (3 if key.startswith("items.") else 2), key
        assert torch.isfinite(s).all(), key


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_every_parameter_receives_a_gradient(name):
    model = build(name).train()
    frames, tokens = content()
    q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
    outputs = list(model.score(q, v).tensors().values())
    if "span_logits" in model.provides:  # the localization head is reached through its logits, not Scores
        outputs += [t.masked_fill(torch.isinf(t), 0.0) for t in model.span_logits_batch(q, v)]
    if "lorentz" in model.provides:  # the hyperbolic embeddings and curvature reach only a partial-order loss
        outputs += [q["lorentz.query"], v["lorentz.video"], v["lorentz.curvature"]]
    if "diffusion" in model.provides:  # the latent's variance reaches only the KL
        outputs += [v["dream.logvar"]]
    sum(t.sum() for t in outputs).backward()
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
        tight = forward(model, video_batch(frames), query_batch(tokens)).tensors()
        padded = forward(model, video_batch(frames, pad_to=max(FRAME_LENGTHS) + 7, garbage=3.0),
                         query_batch(tokens, pad_to=max(TOKEN_LENGTHS) + 5, garbage=3.0)).tensors()
    for key in tight:  # per-frame items: the frames of the tighter padding
        torch.testing.assert_close(padded[key][..., : tight[key].shape[-1]], tight[key], atol=1e-5, rtol=1e-4,
                                   msg=key)


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_a_video_encodes_the_same_alone_or_in_a_batch(name):
    """Evaluation encodes videos in chunks and pads them to the longest (trainer.encode_all):
    a video's scores must not depend on its batch mates."""
    model = build(name).eval()
    frames, tokens = content()
    with torch.no_grad():
        q = model.encode_queries(query_batch(tokens))
        vb = video_batch(frames)
        together = real_frames(model.score(q, model.encode_videos(vb)).tensors(), vb.frame_mask)
        parts = [model.encode_videos(video_batch([f])) for f in frames]
        alone = real_frames(model.score(q, {k: cat_padded([p[k] for p in parts]) for k in parts[0]}).tensors(),
                            vb.frame_mask)
    for key in together:
        torch.testing.assert_close(alone[key], together[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("name", BACKBONE_NAMES)
def test_same_seed_same_output(name):
    frames, tokens = content()
    outs = []
    for _ in range(2):
        model = build(name, seed=3).train()
        torch.manual_seed(5)  # dropout
        outs.append(forward(model, video_batch(frames), query_batch(tokens)).tensors())
    for key in outs[0]:
        assert torch.equal(outs[0][key], outs[1][key]), key
    other = build(name, seed=4).eval()
    with torch.no_grad():
        assert not torch.equal(forward(other, video_batch(frames), query_batch(tokens)).fused, outs[0]["fused"])


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
    out = msl_scores(query, side, budget, 0.7)
    return out.branches["clip"], out.raw["clip"], out.branches["frame"], out.raw["frame"]


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
        whole = model.score(q, v).tensors()
        model.cfg.eval_budget = 1  # one query per slice, one query per best-proposal search
        sliced = model.score(q, v).tensors()
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


def test_msl_clip_scale_matches_a_plain_argmax_and_makes_raw_scores_alike_with_or_without_gradients():
    """MS-SL's clip scale (CPU): the best proposals `best_proposals` finds in budget slices are a plain
    argmax over every proposal's cosine and dot product; without gradients the raw dot products are
    made when read, and equal those made at once with gradients."""
    from prvr.methods.backbones.msl import VideoSide, best_proposals, clip_scale, proposal_matrix_like, proposal_norms

    torch.manual_seed(0)
    clips, query = torch.randn(5, 8, 16), torch.randn(7, 16, requires_grad=True)
    pool = proposal_matrix_like(clips)
    norms = proposal_norms(clips, pool)
    clip_dots = torch.einsum("qd,vcd->qvc", query.detach(), clips)
    dots = clip_dots @ pool.t()  # [Q, V, P]
    for budget in (1, 5 * pool.shape[0] * 2, 1 << 20):  # one query a slice, two, all at once
        by_cos, by_dot = best_proposals(clip_dots, pool, norms, budget)
        assert torch.equal(by_cos, (dots / norms).argmax(-1)) and torch.equal(by_dot, dots.argmax(-1))
        assert torch.equal(best_proposals(clip_dots, pool, norms, budget, ("dot",))[0], by_dot)
        assert torch.equal(best_proposals(clip_dots, pool, norms, budget, ("cos",))[0], by_cos)
    v = {"clips": clips, "frame_values": torch.randn(5, 6, 16), "frame_keys": torch.randn(5, 6, 16),
         "frame_mask": torch.ones(5, 6, dtype=torch.bool)}
    side = VideoSide.of(v)
    clip, raw, by_cos = clip_scale(query, side, 64)  # with gradients: made now
    with torch.no_grad():
        lazy_clip, lazy_raw, lazy_by = clip_scale(query, side, 64)
    assert torch.equal(clip.detach(), lazy_clip) and torch.equal(by_cos, lazy_by)
    assert torch.equal(raw().detach(), lazy_raw())
    torch.testing.assert_close(lazy_raw(), (clip_dots * pool[dots.argmax(-1)]).sum(-1), rtol=0, atol=0)
